//! Histogram buckets: bounds, labels and bars.

use crate::attach::plan::Buckets;

/// Half-open bounds [low, high) of a bucket. The lowest bucket starts at
/// i64::MIN; the top log2 bucket ends at u64::MAX (2^64 has no JSON integer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    pub low: i128,
    pub high: i128,
}

pub fn bounds(b: Buckets, idx: u32) -> Bounds {
    match b {
        Buckets::Log2 => match idx {
            0 => Bounds {
                low: i64::MIN as i128,
                high: 0,
            },
            1 => Bounds { low: 0, high: 1 },
            k => {
                let p = (k - 2).min(63);
                let low = 1i128 << p;
                let high = if p == 63 { u64::MAX as i128 } else { low << 1 };
                Bounds { low, high }
            }
        },
        Buckets::Linear {
            min,
            step,
            nbuckets,
        } => {
            let (min, step) = (min as i128, step as i128);
            if idx == 0 {
                Bounds {
                    low: i64::MIN as i128,
                    high: min,
                }
            } else if idx > nbuckets {
                Bounds {
                    low: min + nbuckets as i128 * step,
                    high: u64::MAX as i128,
                }
            } else {
                let low = min + (idx as i128 - 1) * step;
                Bounds {
                    low,
                    high: low + step,
                }
            }
        }
    }
}

/// 1024-based suffixes for exact multiples (1K, 4M, ...), as bpftrace prints them.
pub fn short(v: i128) -> String {
    const SUFFIX: [&str; 7] = ["", "K", "M", "G", "T", "P", "E"];
    if v == 0 {
        return "0".into();
    }
    let mut n = v;
    let mut i = 0;
    while i < SUFFIX.len() - 1 && n % 1024 == 0 {
        n /= 1024;
        i += 1;
    }
    format!("{n}{}", SUFFIX[i])
}

/// Text label of a bucket: `[0]`, `[2, 4)`, `[4K, 8K)`, `(..., 0)`, `[4096, ...)`.
pub fn label(b: Buckets, idx: u32) -> String {
    let r = bounds(b, idx);
    let open_low = r.low == i64::MIN as i128;
    let open_high = r.high == u64::MAX as i128;
    if open_low {
        return format!("(..., {})", short(r.high));
    }
    if open_high && !matches!(b, Buckets::Log2) {
        return format!("[{}, ...)", short(r.low));
    }
    if r.high - r.low == 1 {
        return format!("[{}]", short(r.low));
    }
    format!("[{}, {})", short(r.low), short(r.high))
}

/// A bar of `width` cells scaled to `max`.
pub fn bar(count: u64, max: u64, width: usize) -> String {
    let n = if max == 0 {
        0
    } else {
        ((count as u128 * width as u128) / max as u128) as usize
    };
    format!("|{}{}|", "@".repeat(n), " ".repeat(width - n.min(width)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log2_labels() {
        assert_eq!(label(Buckets::Log2, 0), "(..., 0)");
        assert_eq!(label(Buckets::Log2, 1), "[0]");
        assert_eq!(label(Buckets::Log2, 2), "[1]");
        assert_eq!(label(Buckets::Log2, 3), "[2, 4)");
        assert_eq!(label(Buckets::Log2, 12), "[1K, 2K)");
        assert_eq!(label(Buckets::Log2, 22), "[1M, 2M)");
        assert_eq!(label(Buckets::Log2, 32), "[1G, 2G)");
        assert_eq!(
            bounds(Buckets::Log2, 12),
            Bounds {
                low: 1024,
                high: 2048
            }
        );
    }

    #[test]
    fn linear_labels() {
        let b = Buckets::Linear {
            min: 0,
            step: 256,
            nbuckets: 16,
        };
        assert_eq!(label(b, 0), "(..., 0)");
        assert_eq!(label(b, 1), "[0, 256)");
        assert_eq!(label(b, 5), "[1K, 1280)");
        assert_eq!(label(b, 17), "[4K, ...)");
        assert_eq!(
            bounds(b, 16),
            Bounds {
                low: 3840,
                high: 4096
            }
        );
    }

    #[test]
    fn bars() {
        assert_eq!(bar(5, 10, 4), "|@@  |");
        assert_eq!(bar(0, 0, 2), "|  |");
    }
}
