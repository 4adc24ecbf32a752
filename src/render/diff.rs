//! Differential profiles (`bpfscope diff BASE NEW`), as `perf diff` and
//! Brendan Gregg's difffolded.pl: two sets of folded stacks become a table
//! of functions by the change in their share, a differential flame graph
//! (NEW's stacks, red where they grew, blue where they shrank; inferno
//! normalizes BASE to NEW's total) and difffolded's three-column lines.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{self, Write};

use inferno::{differential, flamegraph};

use super::record::DiffFunction;

/// Folded stacks: the stack (frames root first, `;`-separated) -> weight.
pub type Folded = BTreeMap<String, u64>;

/// Parses folded lines (`a;b;c 12`). A line without a count is an error
/// naming its number.
pub fn parse_folded(text: &str) -> Result<Folded, String> {
    let mut out = Folded::new();
    for (i, l) in text.lines().enumerate() {
        let l = l.trim_end();
        if l.is_empty() {
            continue;
        }
        let parsed = l
            .rsplit_once(' ')
            .and_then(|(s, n)| Some((s, n.parse::<u64>().ok()?)));
        let Some((stack, n)) = parsed else {
            return Err(format!(
                "line {}: not a folded stack (frames;separated;by;semicolons COUNT)",
                i + 1
            ));
        };
        *out.entry(stack.to_string()).or_default() += n;
    }
    Ok(out)
}

/// Folded lines from a map, sorted.
pub fn lines(f: &Folded) -> Vec<String> {
    f.iter().map(|(s, n)| format!("{s} {n}")).collect()
}

/// Self and total weight per function (a function counts once per stack
/// for its total), and the profile's total.
fn functions(f: &Folded) -> (HashMap<&str, (u64, u64)>, u64) {
    let mut m: HashMap<&str, (u64, u64)> = HashMap::new();
    let mut total = 0;
    for (stack, &n) in f {
        total += n;
        let frames: Vec<&str> = stack.split(';').collect();
        // The root is the process, not a function.
        let Some((leaf, _)) = frames.split_last() else {
            continue;
        };
        if frames.len() > 1 {
            m.entry(leaf).or_default().0 += n;
        }
        let mut seen = HashSet::new();
        for fr in frames.iter().skip(1) {
            if seen.insert(*fr) {
                m.entry(fr).or_default().1 += n;
            }
        }
    }
    (m, total)
}

/// Every function of either profile with its share of each (percent of
/// that profile's weight, self and total), by the larger of the changes
/// in its self and total shares, largest first.
pub fn functions_by_delta(base: &Folded, new: &Folded) -> Vec<DiffFunction> {
    let (b, bt) = functions(base);
    let (n, nt) = functions(new);
    let pct = |v: u64, t: u64| {
        if t == 0 {
            0.0
        } else {
            100.0 * v as f64 / t as f64
        }
    };
    let names: HashSet<&str> = b.keys().chain(n.keys()).copied().collect();
    let mut rows: Vec<DiffFunction> = names
        .into_iter()
        .map(|f| {
            let (bs, btot) = b.get(f).copied().unwrap_or_default();
            let (ns, ntot) = n.get(f).copied().unwrap_or_default();
            DiffFunction {
                kind: "diff",
                function: f.to_string(),
                base_self: pct(bs, bt),
                new_self: pct(ns, nt),
                self_delta: pct(ns, nt) - pct(bs, bt),
                base_total: pct(btot, bt),
                new_total: pct(ntot, nt),
                total_delta: pct(ntot, nt) - pct(btot, bt),
            }
        })
        .collect();
    // The larger change first, self or total: a function that grew moves
    // its callers' totals as much, and they are what explains it.
    let key = |r: &DiffFunction| r.self_delta.abs().max(r.total_delta.abs());
    rows.sort_by(|x, y| {
        key(y)
            .total_cmp(&key(x))
            .then(y.self_delta.abs().total_cmp(&x.self_delta.abs()))
            .then(x.function.cmp(&y.function))
    });
    rows
}

/// difffolded's lines: `stack BASE NEW`, BASE scaled to NEW's total
/// (inferno's normalization), for a differential flame graph.
pub fn difffolded(base: &Folded, new: &Folded) -> io::Result<Vec<String>> {
    let (b, n) = (lines(base).join("\n"), lines(new).join("\n"));
    let mut out = Vec::new();
    let opts = differential::Options {
        normalize: true,
        strip_hex: false,
    };
    differential::from_readers(opts, b.as_bytes(), n.as_bytes(), &mut out)?;
    Ok(String::from_utf8_lossy(&out)
        .lines()
        .map(String::from)
        .collect())
}

/// The differential flame graph: NEW's stacks, colored by the change
/// from BASE (red grown, blue shrunk, the deeper the more).
pub fn svg(diff_lines: &[String], title: &str, w: &mut dyn Write) -> io::Result<()> {
    if diff_lines.is_empty() {
        return super::flame::svg(&[], title, "samples", false, w);
    }
    let mut opts = flamegraph::Options::default();
    opts.title = title.to_string();
    opts.subtitle =
        Some("red: grew from BASE to NEW, blue: shrank (BASE scaled to NEW's samples)".into());
    opts.count_name = "samples".into();
    flamegraph::from_lines(&mut opts, diff_lines.iter().map(String::as_str), w)
        .map_err(io::Error::other)
}

/// The table of functions by delta, as text.
pub fn write_table(
    w: &mut dyn Write,
    rows: &[DiffFunction],
    base: u64,
    new: u64,
) -> io::Result<()> {
    writeln!(
        w,
        "Functions by change in share of samples (BASE {base} samples, NEW {new}):"
    )?;
    writeln!(
        w,
        "{:>7} {:>7} {:>8}  {:>7} {:>7} {:>8}  FUNCTION",
        "SELF", "", "", "TOTAL", "", ""
    )?;
    writeln!(
        w,
        "{:>7} {:>7} {:>8}  {:>7} {:>7} {:>8}",
        "BASE%", "NEW%", "DELTA", "BASE%", "NEW%", "DELTA"
    )?;
    for r in rows {
        writeln!(
            w,
            "{:>6.2}% {:>6.2}% {:>+7.2}%  {:>6.2}% {:>6.2}% {:>+7.2}%  {}",
            r.base_self,
            r.new_self,
            r.self_delta,
            r.base_total,
            r.new_total,
            r.total_delta,
            r.function
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folded_lines_parse_and_bad_ones_name_their_line() {
        let f = parse_folded("p;a;b 3\np;a 1\n\np;a;b 2\n").unwrap();
        assert_eq!(f.get("p;a;b"), Some(&5));
        assert_eq!(
            parse_folded("p;a 1\nnot folded\n").unwrap_err(),
            "line 2: not a folded stack (frames;separated;by;semicolons COUNT)"
        );
    }

    #[test]
    fn shares_and_deltas_of_each_function() {
        // BASE: a 75%, b 25% (both under main); NEW: 50/50, twice as many samples.
        let base = parse_folded("p;main;a;spin 75\np;main;b;spin 25\n").unwrap();
        let new = parse_folded("p;main;a;spin 100\np;main;b;spin 100\n").unwrap();
        let rows = functions_by_delta(&base, &new);
        let get = |f: &str| rows.iter().find(|r| r.function == f).unwrap();
        assert_eq!(get("a").total_delta, -25.0);
        assert_eq!(get("b").total_delta, 25.0);
        assert_eq!(
            (get("spin").base_self, get("spin").self_delta),
            (100.0, 0.0)
        );
        assert_eq!(get("main").new_total, 100.0);
        // The largest change leads.
        assert!(rows[0].function == "a" || rows[0].function == "b");
        assert_eq!(rows.last().unwrap().function, "spin");
        let d = difffolded(&base, &new).unwrap();
        assert!(d.contains(&"p;main;a;spin 150 100".to_string()), "{d:?}");
        assert!(d.contains(&"p;main;b;spin 50 100".to_string()), "{d:?}");
        // Flame graphs color a frame by its own (self) change, as
        // flamegraph.pl does: leaves a and b.
        let leaves = difffolded(
            &parse_folded("p;main;a 75\np;main;b 25\n").unwrap(),
            &parse_folded("p;main;a 100\np;main;b 100\n").unwrap(),
        )
        .unwrap();
        let mut svg_out = Vec::new();
        svg(&leaves, "diff", &mut svg_out).unwrap();
        let text = String::from_utf8(svg_out).unwrap();
        // b grew: red; a shrank: blue.
        let fill = |name: &str| {
            let at = text.find(&format!("<title>{name} (")).unwrap();
            let f = text[at..].split("fill=\"rgb(").nth(1).unwrap();
            let v: Vec<u8> = f
                .split(')')
                .next()
                .unwrap()
                .split(',')
                .map(|x| x.parse().unwrap())
                .collect();
            (v[0], v[1], v[2])
        };
        let (r, _, b) = fill("b");
        assert!(r > b, "b grew: {r} {b}");
        let (r, _, b) = fill("a");
        assert!(b > r, "a shrank: {r} {b}");
    }
}
