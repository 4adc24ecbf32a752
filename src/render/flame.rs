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
        // inferno refuses empty input; an empty graph still says what happened.
        return flamegraph::from_lines(&mut opts, ["no samples 0"], w).map_err(io::Error::other);
    }
    flamegraph::from_lines(&mut opts, lines.iter().map(String::as_str), w).map_err(io::Error::other)
}
