//! Latency heatmaps: latency buckets over time, one column per interval.
//! Terminal rows while running, an SVG at the end.
//!
//! The SVG is written by hand: it is a grid of rectangles with labels, and
//! inferno (the flame graph library) has no heatmap; a plotting crate would
//! be a large dependency for this.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::attach::plan::Buckets;
use crate::collect::aggregate::KeyAgg;
use crate::render::hist;

/// One interval's counts per bucket, all keys merged.
#[derive(Debug, Clone)]
struct Column {
    /// Seconds since the start of the run, at the end of the interval.
    t: f64,
    counts: BTreeMap<u32, u64>,
}

#[derive(Debug, Clone)]
pub struct Heatmap {
    buckets: Buckets,
    columns: Vec<Column>,
}

/// Shades from empty to full.
const SHADES: [char; 5] = [' ', '░', '▒', '▓', '█'];

impl Heatmap {
    pub fn new(buckets: Buckets) -> Heatmap {
        Heatmap {
            buckets,
            columns: Vec::new(),
        }
    }

    pub fn add(&mut self, t: f64, data: &BTreeMap<Vec<u8>, KeyAgg>) {
        let mut counts = BTreeMap::new();
        for agg in data.values() {
            for (b, v) in &agg.buckets {
                *counts.entry(*b).or_insert(0) += v.count;
            }
        }
        self.columns.push(Column { t, counts });
    }

    /// The bucket range a terminal row shows: fixed so rows line up.
    fn axis(&self) -> (u32, u32) {
        match self.buckets {
            // 1 us (2^10 ns) to 2^36 ns (about a minute), the ends gathering the rest.
            Buckets::Log2 => (12, 38),
            Buckets::Linear { nbuckets, .. } => (0, nbuckets + 1),
        }
    }

    /// The header line for terminal rows: where 1us, 1ms and 1s fall.
    pub fn terminal_header(&self) -> String {
        let (lo, hi) = self.axis();
        let mut axis: Vec<char> = vec![' '; (hi - lo + 1) as usize];
        if matches!(self.buckets, Buckets::Log2) {
            // 2^10 ns ~ 1 us, 2^20 ~ 1 ms, 2^30 ~ 1 s; bucket k + 2 starts at 2^k.
            for (k, mark) in [(10u32, "1us"), (20, "1ms"), (30, "1s")] {
                let col = (k + 2 - lo) as usize;
                for (i, c) in mark.chars().enumerate() {
                    if col + i < axis.len() {
                        axis[col + i] = c;
                    }
                }
            }
        }
        format!(
            "{:8} |{}| latency ->",
            "time",
            axis.into_iter().collect::<String>()
        )
    }

    /// The last interval as one shaded row.
    pub fn terminal_row(&self) -> String {
        let Some(col) = self.columns.last() else {
            return String::new();
        };
        let (lo, hi) = self.axis();
        let mut cells = vec![0u64; (hi - lo + 1) as usize];
        for (b, c) in &col.counts {
            let i = (*b).clamp(lo, hi) - lo;
            cells[i as usize] += c;
        }
        let max = cells.iter().copied().max().unwrap_or(0);
        let row: String = cells
            .iter()
            .map(|&c| {
                if c == 0 || max == 0 {
                    SHADES[0]
                } else {
                    // At least the lightest shade for any non-zero cell.
                    let level = 1 + (c * (SHADES.len() as u64 - 2)).div_ceil(max);
                    SHADES[(level as usize).min(SHADES.len() - 1)]
                }
            })
            .collect();
        let total: u64 = cells.iter().sum();
        format!("{:>7.1}s |{row}| {total}", col.t)
    }

    /// The whole run as SVG: x is time, y is latency (low at the bottom),
    /// a colour scale on the right. Axis labels are thinned so that none
    /// overlaps its neighbour, from an estimate of their width.
    pub fn svg(&self, title: &str) -> String {
        let used: Vec<u32> = self
            .columns
            .iter()
            .flat_map(|c| c.counts.keys().copied())
            .collect();
        let (lo, hi) = match (used.iter().min(), used.iter().max()) {
            (Some(&a), Some(&b)) => (a, b),
            _ => (1, 1),
        };
        let rows = (hi - lo + 1) as usize;
        let (cw, ch) = (14usize, 16usize);
        let ylabels: Vec<(u32, String)> = (lo..=hi)
            .map(|b| (b, hist::label(self.buckets, b)))
            .collect();
        let whole = self.columns.iter().all(|c| c.t.fract() == 0.0);
        let xlabels: Vec<String> = self
            .columns
            .iter()
            .map(|c| {
                if whole {
                    format!("{:.0}s", c.t)
                } else {
                    format!("{:.1}s", c.t)
                }
            })
            .collect();
        let max = self
            .columns
            .iter()
            .flat_map(|c| c.counts.values().copied())
            .max()
            .unwrap_or(0)
            .max(1);
        let max_text = max.to_string();
        let ylabel_w = ylabels
            .iter()
            .map(|(_, l)| text_width(l))
            .max()
            .unwrap_or(0);
        let left = (ylabel_w + 14).max(60);
        let top = 40usize;
        let bottom = 44usize;
        let ncols = self.columns.len().max(1);
        let grid_w = ncols * cw;
        // Colour scale: a bar right of the grid, labelled with counts.
        let scale_x = left + grid_w + 16;
        let scale_w = 14usize;
        let right = 16 + scale_w + 6 + text_width(&max_text).max(text_width("count")) + 10;
        // Wide enough for the title and the x-axis caption too.
        let caption = "time (one column per interval), latency in ns";
        let width = (left + grid_w + right)
            .max(left + text_width(caption) + 10)
            .max(left + title.chars().count() * 9);
        let grid_h = rows * ch;
        let height = top + grid_h.max(5 * FONT_PX) + bottom;
        let mut s = String::new();
        let _ = writeln!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="monospace" font-size="{FONT_PX}">"#
        );
        let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
        let _ = writeln!(
            s,
            r#"<text x="{}" y="20" font-size="14">{}</text>"#,
            left,
            escape(title)
        );
        for (x, col) in self.columns.iter().enumerate() {
            for (b, c) in &col.counts {
                let (r, g, bl) = shade(level(*c, max));
                let y = top + (hi - b) as usize * ch;
                let _ = writeln!(
                    s,
                    r#"<rect x="{}" y="{y}" width="{cw}" height="{ch}" fill="rgb({r},{g},{bl})"><title>{:.1}s {}: {c}</title></rect>"#,
                    left + x * cw,
                    col.t,
                    escape(&hist::label(self.buckets, *b)),
                );
            }
        }
        // Rows are taller than the text, so every bucket is labelled; the
        // check keeps that true if the sizes change.
        let ystep = (FONT_PX + 2).div_ceil(ch).max(1);
        for (b, l) in ylabels.iter().rev().step_by(ystep) {
            let y = top + (hi - b) as usize * ch + ch - 4;
            let _ = writeln!(
                s,
                r#"<text class="ylabel" x="{}" y="{y}" text-anchor="end">{}</text>"#,
                left - 6,
                escape(l)
            );
        }
        // One time label every `every` columns: as many as fit side by side.
        let xlabel_w = xlabels.iter().map(|l| text_width(l)).max().unwrap_or(0) + 8;
        let every = xlabel_w.div_ceil(cw).max(1);
        for (x, l) in xlabels.iter().enumerate().step_by(every) {
            let _ = writeln!(
                s,
                r#"<text class="xlabel" x="{}" y="{}">{}</text>"#,
                left + x * cw,
                top + grid_h + 16,
                escape(l)
            );
        }
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}">{caption}</text>"#,
            left,
            height - 6
        );
        // The colour scale: the same log scale as the cells, from 0 (white,
        // as empty cells) at the bottom to the largest count at the top.
        let steps = 10usize;
        let step_h = grid_h.max(5 * FONT_PX) / steps;
        for i in 0..steps {
            let f = (steps - 1 - i) as f64 / (steps - 1) as f64;
            let (r, g, bl) = shade(f);
            let _ = writeln!(
                s,
                r#"<rect class="scale" x="{scale_x}" y="{}" width="{scale_w}" height="{step_h}" fill="rgb({r},{g},{bl})"/>"#,
                top + i * step_h
            );
        }
        let _ = writeln!(
            s,
            r#"<rect x="{scale_x}" y="{top}" width="{scale_w}" height="{}" fill="none" stroke="grey"/>"#,
            steps * step_h
        );
        let lx = scale_x + scale_w + 6;
        let _ = writeln!(s, r#"<text x="{scale_x}" y="{}">count</text>"#, top - 6);
        let _ = writeln!(
            s,
            r#"<text class="scale" x="{lx}" y="{}">{max_text}</text>"#,
            top + FONT_PX
        );
        let _ = writeln!(
            s,
            r#"<text class="scale" x="{lx}" y="{}">0</text>"#,
            top + steps * step_h
        );
        s.push_str("</svg>\n");
        s
    }
}

/// Font size of the SVG's labels, in px.
const FONT_PX: usize = 11;

/// Width of a label in px: monospace glyphs are about 0.6 em wide, so 7 px
/// at 11 px bounds them.
fn text_width(s: &str) -> usize {
    s.chars().count() * 7
}

/// A count's place on the colour scale. Log scale, so that rare slow
/// requests stay visible next to the common case.
fn level(c: u64, max: u64) -> f64 {
    (c as f64).ln_1p() / (max as f64).ln_1p()
}

/// White to dark red.
fn shade(f: f64) -> (u8, u8, u8) {
    let f = f.clamp(0.0, 1.0);
    let r = 255.0 - 100.0 * f;
    let gb = 235.0 * (1.0 - f);
    (r as u8, gb as u8, gb as u8)
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collect::aggregate::AggVal;

    fn data(buckets: &[(u32, u64)]) -> BTreeMap<Vec<u8>, KeyAgg> {
        let mut agg = KeyAgg::default();
        for (b, c) in buckets {
            agg.buckets.insert(
                *b,
                AggVal {
                    count: *c,
                    ..Default::default()
                },
            );
        }
        BTreeMap::from([(Vec::new(), agg)])
    }

    #[test]
    fn rows_and_svg() {
        let mut h = Heatmap::new(Buckets::Log2);
        h.add(1.0, &data(&[(22, 5), (26, 1)]));
        let row = h.terminal_row();
        assert!(row.contains('█') && row.ends_with("| 6"), "{row}");
        h.add(2.0, &data(&[(22, 2)]));
        let svg = h.svg("t");
        assert_eq!(
            svg.matches("<rect x=").count(),
            4,
            "3 cells and the scale's frame"
        );
        assert!(svg.contains("[1M, 2M)"));
        assert!(h.terminal_header().contains("1ms"));
    }

    /// The x positions and texts of the labels of one class.
    fn labels<'a>(svg: &'a str, class: &str) -> Vec<(usize, &'a str)> {
        let tag = format!(r#"<text class="{class}" x=""#);
        svg.lines()
            .filter_map(|l| l.strip_prefix(tag.as_str()))
            .map(|l| {
                let x = l[..l.find('"').unwrap()].parse().unwrap();
                let text = &l[l.find('>').unwrap() + 1..l.rfind("</text>").unwrap()];
                (x, text)
            })
            .collect()
    }

    /// A synthetic run: `n` one-second intervals, latencies drifting from
    /// 4 us to 8 ms and back.
    fn synthetic(n: u32) -> Heatmap {
        let mut h = Heatmap::new(Buckets::Log2);
        for t in 1..=n {
            let peak = 14 + (t % 30) / 3;
            h.add(
                f64::from(t),
                &data(&[
                    (peak, u64::from(t) * 10),
                    (peak + 1, 7),
                    (26, u64::from(t % 4)),
                ]),
            );
        }
        h
    }

    #[test]
    fn axis_labels_never_overlap() {
        // Few columns (narrower than their labels) and many.
        for n in [15, 90] {
            let svg = synthetic(n).svg("latency: a -> b");
            let xs = labels(&svg, "xlabel");
            assert!(xs.len() >= (n as usize) / 10, "{xs:?}");
            for w in xs.windows(2) {
                let ((x0, t0), (x1, _)) = (w[0], w[1]);
                assert!(x1 >= x0 + text_width(t0) + 4, "{n} columns: {xs:?}");
            }
        }
        let svg = synthetic(90).svg("latency: a -> b");
        let ys = labels(&svg, "ylabel");
        // Every bucket from [4K, 8K) to [16M, 32M) has a label.
        assert_eq!(ys.len(), 26 - 14 + 1, "{ys:?}");
        assert_eq!(ys.first().map(|y| y.1), Some("[16M, 32M)"));
    }

    #[test]
    fn colour_scale_runs_from_zero_to_the_largest_count() {
        let svg = synthetic(90).svg("t");
        let scale: Vec<&str> = labels(&svg, "scale").into_iter().map(|l| l.1).collect();
        assert_eq!(scale, ["900", "0"]);
        assert_eq!(svg.matches(r#"<rect class="scale""#).count(), 10);
    }

    /// The SVG of the synthetic run, byte for byte. BLESS=1 rewrites the
    /// golden file after a deliberate change (look at it as a picture).
    #[test]
    fn golden_svg() {
        let svg = synthetic(90).svg("latency: tracepoint:a -> tracepoint:b");
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/heatmap.svg");
        if std::env::var_os("BLESS").is_some() {
            std::fs::write(path, &svg).unwrap();
        }
        let golden = std::fs::read_to_string(path).unwrap();
        assert!(golden == svg, "the heatmap SVG differs from {path}");
    }
}
