//! Flame graphs from folded stacks, through inferno.

use std::collections::HashMap;
use std::io::{self, Write};

use inferno::flamegraph::{self, color, Options};

use crate::report::FrameKind;

/// Each kind's colors: a base and a range a name's hash picks within, so
/// neighbours of one kind stay apart (as flamegraph.pl's palettes do).
fn kind_color(k: FrameKind, name: &str) -> color::Color {
    // FNV-1a: stable across runs, so a graph's colors do not change.
    let h = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    let v = (h % 1000) as f64 / 1000.0;
    let (base, span): ([f64; 3], [f64; 3]) = match k {
        FrameKind::Process => ([120.0, 200.0, 200.0], [40.0, 40.0, 40.0]),
        FrameKind::Kernel => ([220.0, 120.0, 30.0], [35.0, 60.0, 30.0]),
        FrameKind::Bpf => ([160.0, 90.0, 210.0], [40.0, 40.0, 40.0]),
        FrameKind::Native => ([210.0, 60.0, 40.0], [45.0, 150.0, 30.0]),
        FrameKind::Python => ([70.0, 120.0, 220.0], [50.0, 60.0, 35.0]),
        FrameKind::Jit => ([60.0, 170.0, 60.0], [60.0, 70.0, 50.0]),
        FrameKind::Unknown => ([170.0, 170.0, 170.0], [40.0, 40.0, 40.0]),
    };
    let c = |i: usize| (base[i] + span[i] * v).min(255.0) as u8;
    color::Color {
        r: c(0),
        g: c(1),
        b: c(2),
    }
}

/// The legend's entries, in this order, for the kinds a graph shows.
const LEGEND: [(FrameKind, &str); 7] = [
    (FrameKind::Process, "process/thread"),
    (FrameKind::Kernel, "kernel"),
    (FrameKind::Bpf, "BPF"),
    (FrameKind::Native, "native"),
    (FrameKind::Python, "Python"),
    (FrameKind::Jit, "JIT"),
    (FrameKind::Unknown, "unknown"),
];

/// A flame graph whose frames are colored by the kind of code they are
/// (`kinds`: frame name to kind), with a legend of the kinds present under
/// the title.
pub fn svg_by_kind(
    lines: &[String],
    title: &str,
    count_name: &str,
    kinds: &HashMap<String, FrameKind>,
    w: &mut dyn Write,
) -> io::Result<()> {
    if lines.is_empty() {
        return svg(lines, title, count_name, false, w);
    }
    let mut palette = color::PaletteMap::default();
    for (name, &k) in kinds {
        palette.insert(name, kind_color(k, name));
    }
    let shown: Vec<(FrameKind, &str)> = LEGEND
        .iter()
        .copied()
        .filter(|(k, _)| kinds.values().any(|v| v == k))
        .collect();
    let mut opts = Options::default();
    opts.title = title.to_string();
    opts.count_name = count_name.to_string();
    // A placeholder subtitle makes room under the title; the legend
    // replaces it.
    opts.subtitle = Some(LEGEND_MARK.into());
    opts.palette_map = Some(&mut palette);
    let mut buf = Vec::with_capacity(1 << 16);
    flamegraph::from_lines(&mut opts, lines.iter().map(String::as_str), &mut buf)
        .map_err(io::Error::other)?;
    let text = String::from_utf8(buf).map_err(io::Error::other)?;
    w.write_all(with_legend(&text, &shown).as_bytes())
}

const LEGEND_MARK: &str = "bpfscope-legend";

/// Replaces the placeholder subtitle with a row of color swatches and
/// their kinds' names, centred where the subtitle was.
fn with_legend(svg: &str, shown: &[(FrameKind, &str)]) -> String {
    let Some(at) = svg.find(LEGEND_MARK) else {
        return svg.to_string();
    };
    let (Some(start), Some(end)) = (svg[..at].rfind("<text"), svg[at..].find("</text>")) else {
        return svg.to_string();
    };
    let end = at + end + "</text>".len();
    // The subtitle's baseline (inferno puts it at twice the title's).
    let y = svg[start..at]
        .split("y=\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(48.0);
    // Verdana at 12 px: about 7 px a character; a swatch and gaps 26 px.
    let widths: Vec<f64> = shown
        .iter()
        .map(|(_, n)| 26.0 + 7.0 * n.len() as f64)
        .collect();
    let total: f64 = widths.iter().sum();
    let mut x = (1200.0 - total) / 2.0;
    let mut g = String::from("<g id=\"legend\">");
    for ((k, name), wd) in shown.iter().zip(&widths) {
        let c = kind_color(*k, name);
        g.push_str(&format!(
            "<rect x=\"{x:.0}\" y=\"{:.0}\" width=\"12\" height=\"12\" rx=\"2\" fill=\"rgb({},{},{})\"/><text x=\"{:.0}\" y=\"{y:.0}\" font-size=\"12\" font-family=\"Verdana\">{name}</text>",
            y - 10.0,
            c.r,
            c.g,
            c.b,
            x + 16.0
        ));
        x += wd;
    }
    g.push_str("</g>");
    format!("{}{g}{}", &svg[..start], &svg[end..])
}

/// Writes an SVG flame graph of folded lines (`root;...;leaf COUNT`).
/// `io` picks the palette for waiting time (off-CPU).
pub fn svg(
    lines: &[String],
    title: &str,
    count_name: &str,
    io: bool,
    w: &mut dyn Write,
) -> io::Result<()> {
    let mut opts = Options::default();
    opts.title = title.to_string();
    opts.count_name = count_name.to_string();
    if io {
        opts.colors = color::Palette::Basic(color::BasicPalette::Io);
    }
    if lines.is_empty() {
        // inferno refuses input without counts (even a zero-count line), so
        // an empty profile gets a small SVG of its own that says what happened.
        eprintln!(
            "bpfscope: no stacks were sampled; the flame graph says so and is otherwise empty"
        );
        return empty_svg(title, count_name, w);
    }
    flamegraph::from_lines(&mut opts, lines.iter().map(String::as_str), w).map_err(io::Error::other)
}

/// A valid SVG with the title and a line saying there were no samples.
fn empty_svg(title: &str, count_name: &str, w: &mut dyn Write) -> io::Result<()> {
    let esc = |s: &str| {
        s.replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
            .replace('"', "&quot;")
    };
    write!(
        w,
        concat!(
            "<?xml version=\"1.0\" standalone=\"no\"?>\n",
            "<svg version=\"1.1\" width=\"1200\" height=\"120\" viewBox=\"0 0 1200 120\" ",
            "xmlns=\"http://www.w3.org/2000/svg\">\n",
            "<rect x=\"0\" y=\"0\" width=\"1200\" height=\"120\" fill=\"#eeeeee\"/>\n",
            "<text x=\"600\" y=\"30\" font-family=\"Verdana\" font-size=\"17\" text-anchor=\"middle\">{}</text>\n",
            "<text x=\"600\" y=\"75\" font-family=\"Verdana\" font-size=\"14\" text-anchor=\"middle\">no samples (0 {})</text>\n",
            "</svg>\n"
        ),
        esc(title),
        esc(count_name)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_profile_is_a_valid_svg_saying_so() {
        let mut out = Vec::new();
        svg(&[], "cpu <profile>", "samples", false, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let expected = concat!(
            "<?xml version=\"1.0\" standalone=\"no\"?>\n",
            "<svg version=\"1.1\" width=\"1200\" height=\"120\" viewBox=\"0 0 1200 120\" xmlns=\"http://www.w3.org/2000/svg\">\n",
            "<rect x=\"0\" y=\"0\" width=\"1200\" height=\"120\" fill=\"#eeeeee\"/>\n",
            "<text x=\"600\" y=\"30\" font-family=\"Verdana\" font-size=\"17\" text-anchor=\"middle\">cpu &lt;profile&gt;</text>\n",
            "<text x=\"600\" y=\"75\" font-family=\"Verdana\" font-size=\"14\" text-anchor=\"middle\">no samples (0 samples)</text>\n",
            "</svg>\n"
        );
        assert_eq!(text, expected);
    }

    #[test]
    fn frames_are_colored_by_kind_with_a_legend_of_the_kinds_shown() {
        let kinds: HashMap<String, FrameKind> = [
            ("app", FrameKind::Process),
            ("main", FrameKind::Native),
            ("f (a.py:3)", FrameKind::Python),
            ("read_[k]", FrameKind::Kernel),
        ]
        .into_iter()
        .map(|(n, k)| (n.to_string(), k))
        .collect();
        let mut out = Vec::new();
        let lines = ["app;main;f (a.py:3);read_[k] 3".to_string()];
        svg_by_kind(&lines, "t", "samples", &kinds, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let fill = |title: &str| {
            let at = text.find(&format!("<title>{title} (")).unwrap();
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
        let k = kind_color(FrameKind::Kernel, "read_[k]");
        assert_eq!(fill("read"), (k.r, k.g, k.b));
        let (r, g, b) = fill("f (a.py:3)");
        assert!(b > r && b > g, "python is blue: {r},{g},{b}");
        let legend = text.split("<g id=\"legend\">").nth(1).unwrap();
        let legend = legend.split("</g>").next().unwrap();
        for name in ["process/thread", "kernel", "native", "Python"] {
            assert!(legend.contains(&format!(">{name}</text>")), "{legend}");
        }
        assert!(
            !legend.contains(">JIT<") && !legend.contains(">BPF<"),
            "{legend}"
        );
        assert!(!text.contains(LEGEND_MARK));
    }

    #[test]
    fn stacks_draw_a_flame_graph() {
        let mut out = Vec::new();
        svg(&["a;b 3".to_string()], "t", "samples", false, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("<?xml"), "{text}");
        assert!(text.contains(">b (3 samples, 100.00%)</title>"), "{text}");
    }
}
