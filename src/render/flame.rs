//! Flame graphs from folded stacks, through inferno.

use std::io::{self, Write};

use inferno::flamegraph::{self, color, Options};

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
    fn stacks_draw_a_flame_graph() {
        let mut out = Vec::new();
        svg(&["a;b 3".to_string()], "t", "samples", false, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("<?xml"), "{text}");
        assert!(text.contains(">b (3 samples, 100.00%)</title>"), "{text}");
    }
}
