//! Latency heatmaps: latency buckets over time, one column per interval.
//! Terminal rows while running, an SVG at the end.
//!
//! The SVG is written by hand: it is a grid of rectangles with labels, and
//! inferno (the flame graph library) has no heatmap; a plotting crate would
//! be a large dependency for this.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::cli::Buckets;
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

    /// The whole run as SVG: x is time, y is latency (low at the bottom).
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
        let (left, top, bottom, right) = (110usize, 40usize, 40usize, 20usize);
        let ncols = self.columns.len().max(1);
        // Wide enough for the title too (about 8 px per character at 14 px).
        let width = (left + ncols * cw + right).max(left + title.len() * 9);
        let height = top + rows * ch + bottom;
        let max = self
            .columns
            .iter()
            .flat_map(|c| c.counts.values().copied())
            .max()
            .unwrap_or(0)
            .max(1);
        let mut s = String::new();
        let _ = writeln!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="monospace" font-size="11">"#
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
                // Log scale so that rare slow requests stay visible next to the common case.
                let f = (*c as f64).ln_1p() / (max as f64).ln_1p();
                let (r, g, bl) = shade(f);
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
        for b in lo..=hi {
            let y = top + (hi - b) as usize * ch + ch - 4;
            let _ = writeln!(
                s,
                r#"<text x="{}" y="{y}" text-anchor="end">{}</text>"#,
                left - 6,
                escape(&hist::label(self.buckets, b))
            );
        }
        let every = (ncols / 10).max(1);
        for (x, col) in self.columns.iter().enumerate().step_by(every) {
            let _ = writeln!(
                s,
                r#"<text x="{}" y="{}">{:.0}s</text>"#,
                left + x * cw,
                top + rows * ch + 16,
                col.t
            );
        }
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}">time (one column per interval), latency in ns</text>"#,
            left,
            height - 6
        );
        s.push_str("</svg>\n");
        s
    }
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
        assert_eq!(svg.matches("<rect x=").count(), 3);
        assert!(svg.contains("[1M, 2M)"));
        assert!(h.terminal_header().contains("1ms"));
    }
}
