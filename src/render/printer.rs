//! The two printers of records: JSON lines, and text for people. Commands
//! build records (see `record`) and hand them to the printer `--json` chose.

use std::io::{self, Write};
use std::time::Duration;

use serde::Serialize;

use super::hist;
use super::record::{
    AnnotateLine, BpfAnnotate, BpfProg, Cell, Event, Hist, HistUnit, Integer, Key, ProbeEntry,
    ProbeField, Record, TopFunction,
};

/// One JSON object and a newline. The value goes through `serde_json::Value`,
/// whose objects keep their keys sorted (serde_json without
/// `preserve_order`): every object bpfscope prints has its keys in
/// alphabetical order, nested ones too, as when it was built with `json!`.
pub fn write_json<W: Write + ?Sized, T: Serialize + ?Sized>(w: &mut W, v: &T) -> io::Result<()> {
    let v = serde_json::to_value(v)?;
    serde_json::to_writer(&mut *w, &v)?;
    w.write_all(b"\n")
}

/// What text shows above rows that it prints as one table; JSON prints each
/// row as a record of its own.
#[derive(Debug, Clone)]
pub enum Table<'a> {
    /// `count` or `stats` rows of one run or interval. The key names, in
    /// `--by` order, head the columns; keys with stacks make a block per row.
    Aggregates {
        keys: Vec<&'a str>,
        stats: bool,
        stacks: bool,
    },
    /// `bpf list`.
    BpfList,
    /// One refresh of `bpf top`: its interval, and the most rows shown.
    BpfTop { elapsed: Duration, rows: usize },
}

/// Prints records as JSON lines or as text.
pub enum Printer<W: Write> {
    Text(TextPrinter<W>),
    Json(W),
}

impl<W: Write> Printer<W> {
    pub fn new(json: bool, w: W) -> Printer<W> {
        if json {
            Printer::Json(w)
        } else {
            Printer::Text(TextPrinter {
                w,
                err: Box::new(io::stderr()),
                t0_ns: 0,
                names_only: false,
            })
        }
    }

    /// Text: event times are shown relative to this (monotonic ns).
    pub fn with_t0(mut self, t0_ns: u64) -> Self {
        if let Printer::Text(t) = &mut self {
            t.t0_ns = t0_ns;
        }
        self
    }

    /// Text: where losses are reported (stderr unless told).
    pub fn with_stderr(mut self, err: Box<dyn Write>) -> Self {
        if let Printer::Text(t) = &mut self {
            t.err = err;
        }
        self
    }

    /// Text: listed probes show their names only.
    pub fn names_only(mut self, yes: bool) -> Self {
        if let Printer::Text(t) = &mut self {
            t.names_only = yes;
        }
        self
    }

    /// One record: a JSON line, or its text form.
    pub fn record(&mut self, r: &Record<'_>) -> io::Result<()> {
        match self {
            Printer::Json(w) => write_json(w, r),
            Printer::Text(t) => t.record(r),
        }
    }

    /// Rows that text shows as one table.
    pub fn table(&mut self, head: &Table<'_>, rows: &[Record<'_>]) -> io::Result<()> {
        match self {
            Printer::Json(w) => rows.iter().try_for_each(|r| write_json(w, r)),
            Printer::Text(t) => t.table(head, rows),
        }
    }

    /// One line of `list --json`, or the probe in text.
    pub fn probe(&mut self, p: &ProbeEntry) -> io::Result<()> {
        match self {
            Printer::Json(w) => write_json(w, p),
            Printer::Text(t) => t.probe(p),
        }
    }

    /// The start of interval `n`'s results: a heading in text. JSON records
    /// carry `interval` instead.
    pub fn interval(&mut self, n: u64) -> io::Result<()> {
        match self {
            Printer::Json(_) => Ok(()),
            Printer::Text(t) => writeln!(t.w, "{}", interval_header(n)),
        }
    }

    /// A line only the text form has (heatmap rows, remarks); JSON prints nothing.
    pub fn text(&mut self, line: &str) -> io::Result<()> {
        match self {
            Printer::Json(_) => Ok(()),
            Printer::Text(t) => writeln!(t.w, "{line}"),
        }
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.writer().flush()
    }

    pub fn writer(&mut self) -> &mut W {
        match self {
            Printer::Json(w) => w,
            Printer::Text(t) => &mut t.w,
        }
    }
}

/// Records drawn for people: tables, bpftrace-style histograms, one line
/// per event; losses go to stderr.
pub struct TextPrinter<W: Write> {
    w: W,
    /// Losses go here, after what `w` holds is flushed.
    err: Box<dyn Write>,
    t0_ns: u64,
    names_only: bool,
}

impl<W: Write> TextPrinter<W> {
    fn record(&mut self, r: &Record<'_>) -> io::Result<()> {
        match r {
            Record::Count(c) => {
                let head = Table::Aggregates {
                    keys: c.key.0.iter().map(|(n, _)| *n).collect(),
                    stats: false,
                    stacks: has_stack(&c.key),
                };
                self.table(&head, std::slice::from_ref(r))
            }
            Record::Stats(s) => {
                let head = Table::Aggregates {
                    keys: s.key.0.iter().map(|(n, _)| *n).collect(),
                    stats: true,
                    stacks: has_stack(&s.key),
                };
                self.table(&head, std::slice::from_ref(r))
            }
            Record::Hist(h) => self.hist(h),
            Record::Event(e) => self.event(e),
            Record::Lost(l) => {
                self.w.flush()?;
                writeln!(
                    self.err,
                    "bpfscope: lost {} {}: {}",
                    l.count,
                    l.what.name(),
                    l.what.why()
                )
            }
            Record::Unmatched(u) => {
                self.w.flush()?;
                writeln!(
                    self.err,
                    "bpfscope: {} ends had no matching start and were not timed",
                    u.count
                )
            }
            Record::BpfProg(_) => self.table(&Table::BpfList, std::slice::from_ref(r)),
            Record::BpfAnnotate(a) => self.annotate(a),
        }
    }

    fn table(&mut self, head: &Table<'_>, rows: &[Record<'_>]) -> io::Result<()> {
        let progs = || {
            rows.iter().filter_map(|r| match r {
                Record::BpfProg(p) => Some(p),
                _ => None,
            })
        };
        match head {
            Table::Aggregates {
                keys,
                stats,
                stacks,
            } => {
                let rows: Vec<AggRow<'_>> = rows.iter().filter_map(AggRow::of).collect();
                if *stacks {
                    self.stack_blocks(&rows)
                } else {
                    self.aggregates(keys, *stats, &rows)
                }
            }
            Table::BpfList => self.bpf_list(&progs().collect::<Vec<_>>()),
            Table::BpfTop { elapsed, rows: max } => {
                self.bpf_top(&progs().collect::<Vec<_>>(), *elapsed, *max)
            }
        }
    }

    fn aggregates(&mut self, keys: &[&str], stats: bool, rows: &[AggRow<'_>]) -> io::Result<()> {
        let mut header: Vec<String> = keys.iter().map(|k| k.to_uppercase()).collect();
        header.push("COUNT".into());
        if stats {
            header.extend(["SUM", "MIN", "MAX", "AVG"].map(String::from));
        }
        let body: Vec<Vec<String>> = rows
            .iter()
            .map(|row| {
                let mut r: Vec<String> = row.key.0.iter().map(|(_, c)| c.text()).collect();
                r.push(row.count.to_string());
                if let Some(s) = &row.stats {
                    r.push(s.sum.to_string());
                    r.push(s.min.to_string());
                    r.push(s.max.to_string());
                    r.push(format!("{:.2}", s.avg));
                }
                r
            })
            .collect();
        let nkeys = keys.len();
        let widths: Vec<usize> = (0..header.len())
            .map(|c| {
                body.iter()
                    .filter_map(|r| r.get(c))
                    .map(String::len)
                    .chain([header[c].len()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let fmt_row = |r: &[String]| {
            r.iter()
                .enumerate()
                .map(|(c, s)| {
                    let w = widths.get(c).copied().unwrap_or(0);
                    if c < nkeys {
                        format!("{s:<w$}")
                    } else {
                        format!("{s:>w$}")
                    }
                })
                .collect::<Vec<_>>()
                .join("  ")
                .trim_end()
                .to_string()
        };
        writeln!(self.w, "{}", fmt_row(&header))?;
        for r in &body {
            writeln!(self.w, "{}", fmt_row(r))?;
        }
        Ok(())
    }

    /// Rows whose keys hold stacks: a block per key, frames one per line, leaf first.
    fn stack_blocks(&mut self, rows: &[AggRow<'_>]) -> io::Result<()> {
        for row in rows {
            let flat: Vec<String> = row
                .key
                .0
                .iter()
                .filter(|(_, c)| !matches!(c, Cell::Frames(_)))
                .map(|(k, c)| format!("{k}={}", c.text()))
                .collect();
            writeln!(self.w, "@[{}]:", flat.join(", "))?;
            for (k, c) in &row.key.0 {
                if let Cell::Frames(f) = c {
                    writeln!(self.w, "  {k}:")?;
                    for frame in f {
                        writeln!(self.w, "    {frame}")?;
                    }
                }
            }
            match &row.stats {
                Some(s) => writeln!(
                    self.w,
                    "  count {}, sum {}, min {}, max {}, avg {:.2}\n",
                    row.count, s.sum, s.min, s.max, s.avg
                )?,
                None => writeln!(self.w, "  count {}\n", row.count)?,
            }
        }
        Ok(())
    }

    fn hist(&mut self, h: &Hist<'_>) -> io::Result<()> {
        let title: Vec<String> = h
            .key
            .0
            .iter()
            .map(|(k, c)| format!("{k}={}", c.inline()))
            .collect();
        let name = match h.unit {
            HistUnit::Ns => format!("{}_ns", h.value),
            HistUnit::Count => h.value.to_string(),
        };
        if title.is_empty() {
            writeln!(self.w, "@{name}:")?;
        } else {
            writeln!(self.w, "@{name}[{}]:", title.join(", "))?;
        }
        let (Some(lo), Some(hi)) = (h.buckets.first(), h.buckets.last()) else {
            return Ok(());
        };
        let max = h.buckets.iter().map(|b| b.count).max().unwrap_or(0);
        let labels: Vec<String> = (lo.index..=hi.index)
            .map(|i| hist::label(h.layout, i))
            .collect();
        let lw = labels.iter().map(String::len).max().unwrap_or(0);
        for (i, label) in (lo.index..=hi.index).zip(&labels) {
            let c = h
                .buckets
                .iter()
                .find(|b| b.index == i)
                .map_or(0, |b| b.count);
            writeln!(self.w, "{label:<lw$} {c:>10} {}", hist::bar(c, max, 52))?;
        }
        writeln!(
            self.w,
            "count {}, sum {}, avg {:.2}\n",
            h.count,
            h.sum,
            avg(h.sum, h.count)
        )
    }

    fn event(&mut self, e: &Event<'_>) -> io::Result<()> {
        let t = e.ts_ns.saturating_sub(self.t0_ns) as f64 / 1e9;
        write!(
            self.w,
            "{t:.6} {} pid={} tid={} comm={} cpu={}",
            e.probe, e.pid, e.tid, e.comm, e.cpu
        )?;
        for (name, cell) in &e.fields.0 {
            match cell {
                None => write!(self.w, " {name}=<fault>")?,
                Some(Cell::Str(v)) => write!(self.w, " {name}={v:?}")?,
                // Already escaped; a cut buffer ends in `...` after the quote.
                Some(Cell::Bytes(v, cut)) => write!(
                    self.w,
                    " {name}=\"{}\"{}",
                    v.replace('"', "\\\""),
                    if *cut { "..." } else { "" }
                )?,
                Some(c) => write!(self.w, " {name}={}", c.text())?,
            }
        }
        writeln!(self.w)
    }

    fn bpf_list(&mut self, progs: &[&BpfProg]) -> io::Result<()> {
        writeln!(
            self.w,
            "{:>6}  {:<14} {:<16} {:<16} {:>12} {:>9}  ATTACHED",
            "ID", "TYPE", "NAME", "TAG", "RUNS", "NS/RUN"
        )?;
        for p in progs {
            let at = match p.attached.as_deref() {
                Some(a) if !a.is_empty() => a.join(", "),
                _ => "-".to_string(),
            };
            let (runs, per) = match p.avg_ns {
                Some(a) => (p.run_cnt.to_string(), format!("{a:.0}")),
                None => ("-".into(), "-".into()),
            };
            writeln!(
                self.w,
                "{:>6}  {:<14} {:<16} {:<16} {:>12} {:>9}  {at}",
                p.id, p.prog_type, p.name, p.tag, runs, per
            )?;
        }
        if progs.iter().all(|p| p.run_cnt == 0) {
            writeln!(
                self.w,
                "(run counts need run-time statistics: 'bpfscope bpf top' turns them on while it runs)"
            )?;
        }
        Ok(())
    }

    fn bpf_top(&mut self, progs: &[&BpfProg], elapsed: Duration, max: usize) -> io::Result<()> {
        let el_ns = elapsed.as_nanos().max(1) as f64;
        // Clear the screen and home the cursor: a live view, like top.
        write!(self.w, "\x1b[H\x1b[2J")?;
        writeln!(
            self.w,
            "bpfscope bpf top: {} programs, last {:.1}s (CPU% of one CPU)\n",
            progs.len(),
            elapsed.as_secs_f64()
        )?;
        writeln!(
            self.w,
            "{:>6}  {:<14} {:<16} {:>7} {:>12} {:>10} {:>9}",
            "ID", "TYPE", "NAME", "CPU%", "RUNS/S", "RUNS", "NS/RUN"
        )?;
        for p in progs.iter().take(max) {
            let per = match p.avg_ns {
                Some(a) if p.run_cnt > 0 => format!("{a:.0}"),
                _ => "-".into(),
            };
            writeln!(
                self.w,
                "{:>6}  {:<14} {:<16} {:>7.2} {:>12.0} {:>10} {:>9}",
                p.id,
                p.prog_type,
                p.name,
                p.cpu_pct.unwrap_or(0.0),
                p.run_cnt as f64 * 1e9 / el_ns,
                p.run_cnt,
                per
            )?;
        }
        Ok(())
    }

    fn annotate(&mut self, a: &BpfAnnotate) -> io::Result<()> {
        writeln!(
            self.w,
            "{} (id {}, {}{}): {} {}",
            a.symbol,
            a.id,
            a.prog_type,
            if a.unloaded { ", unloaded" } else { "" },
            a.total,
            a.unit
        )?;
        if a.lines.is_empty() {
            return writeln!(self.w, "    no samples in this program\n");
        }
        if !a.line_info {
            writeln!(self.w, "    (no BTF line info: JIT offsets)")?;
        }
        let width = a.total.to_string().len().max(5);
        for l in &a.lines {
            match l {
                AnnotateLine::Source {
                    count,
                    file,
                    line,
                    source,
                } => {
                    let short = file.rsplit('/').next().unwrap_or(file);
                    let at = format!("{short}:{line}");
                    writeln!(self.w, "  {count:>width$}  {at:<20}  {source}")?;
                }
                AnnotateLine::Offset {
                    count,
                    symbol,
                    offset,
                } => writeln!(self.w, "  {count:>width$}  {symbol}+{offset:#x}")?,
            }
        }
        writeln!(self.w)
    }

    fn probe(&mut self, p: &ProbeEntry) -> io::Result<()> {
        writeln!(self.w, "{}", p.probe)?;
        if self.names_only {
            return Ok(());
        }
        if let Some(sig) = &p.signature {
            return writeln!(self.w, "    {sig}");
        }
        for f in &p.fields {
            let note = if f.usable == Some(false) {
                "  (not usable)"
            } else {
                ""
            };
            writeln!(self.w, "    {}{note}", declaration(f))?;
        }
        Ok(())
    }
}

/// A field as the tracepoint format declares it: `char comm[16]`, `const char * filename`.
pub fn declaration(f: &ProbeField) -> String {
    let t = if f.ctype.ends_with('*') {
        f.ctype.clone()
    } else {
        format!("{} ", f.ctype)
    };
    match f.array_len {
        Some(n) => format!("{t}{}[{n}]", f.name),
        None => format!("{t}{}", f.name),
    }
}

/// The top functions of a profile as a table: self and total weight, each
/// with its share of `total`.
pub fn top_functions(
    w: &mut dyn Write,
    unit: &str,
    total: u64,
    rows: &[TopFunction],
) -> io::Result<()> {
    let pct = |v: u64| {
        if total == 0 {
            0.0
        } else {
            100.0 * v as f64 / total as f64
        }
    };
    writeln!(w, "Top functions by self {unit} ({total} total):")?;
    writeln!(
        w,
        "{:>10} {:>6} {:>10} {:>6}  FUNCTION",
        "SELF", "%", "TOTAL", "%"
    )?;
    for f in rows {
        let (s, t) = (f.self_weight, f.total);
        writeln!(
            w,
            "{s:>10} {:>5.1}% {t:>10} {:>5.1}%  {}",
            pct(s),
            pct(t),
            f.function
        )?;
    }
    Ok(())
}

/// `bpfscope top`'s screen: clears it, a header, then one row per
/// function (self and total samples and their share of the window's),
/// each cut to `width` columns.
pub fn live_top(
    w: &mut dyn Write,
    header: &str,
    total: u64,
    rows: &[TopFunction],
    width: usize,
) -> io::Result<()> {
    let pct = |v: u64| {
        if total == 0 {
            0.0
        } else {
            100.0 * v as f64 / total as f64
        }
    };
    // Home the cursor and clear the screen: a live view, like top.
    write!(w, "\x1b[H\x1b[2J")?;
    writeln!(w, "{}", cut(header, width))?;
    writeln!(w)?;
    writeln!(
        w,
        "{:>7} {:>8} {:>7} {:>8}  FUNCTION",
        "SELF%", "SELF", "TOTAL%", "TOTAL"
    )?;
    for f in rows {
        let line = format!(
            "{:>6.2}% {:>8} {:>6.2}% {:>8}  {}",
            pct(f.self_weight),
            f.self_weight,
            pct(f.total),
            f.total,
            f.function
        );
        writeln!(w, "{}", cut(&line, width))?;
    }
    Ok(())
}

/// The first `width` characters of a line.
fn cut(s: &str, width: usize) -> String {
    s.chars().take(width.max(20)).collect()
}

/// A `count` or `stats` row, for the text table.
struct AggRow<'r> {
    key: &'r Key<'r>,
    count: u64,
    stats: Option<StatsCols>,
}

struct StatsCols {
    sum: Integer,
    min: Integer,
    max: Integer,
    avg: f64,
}

impl<'r> AggRow<'r> {
    fn of(r: &'r Record<'r>) -> Option<AggRow<'r>> {
        match r {
            Record::Count(c) => Some(AggRow {
                key: &c.key,
                count: c.count,
                stats: None,
            }),
            Record::Stats(s) => Some(AggRow {
                key: &s.key,
                count: s.count,
                stats: Some(StatsCols {
                    sum: s.sum,
                    min: s.min,
                    max: s.max,
                    avg: s.avg,
                }),
            }),
            _ => None,
        }
    }
}

fn has_stack(k: &Key<'_>) -> bool {
    k.0.iter().any(|(_, c)| matches!(c, Cell::Frames(_)))
}

/// sum / count, 0 without any.
pub fn avg(sum: Integer, count: u64) -> f64 {
    if count == 0 {
        0.0
    } else {
        sum.as_f64() / count as f64
    }
}

fn interval_header(i: u64) -> String {
    let mut t: libc::time_t = 0;
    // SAFETY: time() and localtime_r only write into the locals passed.
    let tm = unsafe {
        libc::time(&mut t);
        let mut tm: libc::tm = std::mem::zeroed();
        libc::localtime_r(&t, &mut tm);
        tm
    };
    format!(
        "-- interval {i} at {:02}:{:02}:{:02} --",
        tm.tm_hour, tm.tm_min, tm.tm_sec
    )
}
