//! Prometheus exposition: metric families as OpenMetrics 1.0 (what
//! Prometheus asks for first) or as the 0.0.4 text format (what older
//! scrapers and `promtool check metrics` read).
//!
//! OpenMetrics is written by prometheus-client. That crate has no 0.0.4
//! writer, so `text_004` writes the same families in the older format: the
//! two differ only in counter names on HELP/TYPE lines, in HELP escaping
//! and in the `# EOF` trailer, and both are checked against their
//! reference parsers in the agent's tests.

use std::fmt::Write as _;

use anyhow::{Context, Result};
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType;

/// What a family is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// A value of one series.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A count: written as an integer.
    Count(u64),
    /// A counter of a real quantity (seconds, bytes): never negative.
    Counter(f64),
    Gauge(f64),
    Histogram {
        sum: f64,
        count: u64,
        /// (upper bound, observations in this bucket alone), ascending,
        /// ending with +Inf; upper bounds are never negative when a sum is
        /// written (OpenMetrics refuses `_sum` beside negative buckets).
        buckets: Vec<(f64, u64)>,
    },
}

pub type Labels = Vec<(String, String)>;

/// One metric family: its name (counters without `_total`), what it
/// counts, its series.
#[derive(Debug, Clone)]
pub struct Family {
    pub name: String,
    pub help: String,
    pub kind: Kind,
    pub series: Vec<(Labels, Value)>,
}

impl Family {
    /// `name` may end in `_total` for counters; it is taken off here and
    /// put back by the writers.
    pub fn new(name: &str, help: &str, kind: Kind, series: Vec<(Labels, Value)>) -> Family {
        let name = if kind == Kind::Counter {
            name.strip_suffix("_total").unwrap_or(name)
        } else {
            name
        };
        Family {
            name: name.to_string(),
            help: help.to_string(),
            kind,
            series,
        }
    }

    /// A family of one series without labels.
    pub fn one(name: &str, help: &str, kind: Kind, v: Value) -> Family {
        Family::new(name, help, kind, vec![(Vec::new(), v)])
    }
}

/// Which exposition format a scraper asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    OpenMetrics,
    Text004,
}

impl Format {
    /// From an `Accept` header: OpenMetrics when it is listed (Prometheus
    /// lists it first), else the 0.0.4 text format, which every scraper reads.
    pub fn from_accept(accept: Option<&str>) -> Format {
        match accept {
            Some(a) if a.contains("application/openmetrics-text") => Format::OpenMetrics,
            _ => Format::Text004,
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Format::Text004 => "text/plain; version=0.0.4; charset=utf-8",
        }
    }
}

/// The exposition text of these families.
pub fn render(families: Vec<Family>, format: Format) -> Result<String> {
    match format {
        Format::OpenMetrics => open_metrics(families),
        Format::Text004 => Ok(text_004(&families)),
    }
}

struct Families(Vec<Family>);

impl std::fmt::Debug for Families {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} families", self.0.len())
    }
}

impl prometheus_client::collector::Collector for Families {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for f in &self.0 {
            let kind = match f.kind {
                Kind::Counter => MetricType::Counter,
                Kind::Gauge => MetricType::Gauge,
                Kind::Histogram => MetricType::Histogram,
            };
            let help = escape_help(&f.help, true);
            let mut me = encoder.encode_descriptor(&f.name, &help, None, kind)?;
            for (labels, v) in &f.series {
                // A series without labels is written bare (`name 1`, not `name{} 1`).
                if labels.is_empty() {
                    encode_value(v, &mut me)?;
                } else {
                    let mut fe = me.encode_family(labels)?;
                    encode_value(v, &mut fe)?;
                }
            }
        }
        Ok(())
    }
}

fn encode_value(
    v: &Value,
    enc: &mut prometheus_client::encoding::MetricEncoder<'_>,
) -> Result<(), std::fmt::Error> {
    use prometheus_client::encoding::NoLabelSet;
    match v {
        Value::Count(c) => enc.encode_counter::<NoLabelSet, _, u64>(c, None),
        Value::Counter(c) => enc.encode_counter::<NoLabelSet, _, f64>(&c.max(0.0), None),
        Value::Gauge(g) if whole(*g) => enc.encode_gauge(&(*g as i64)),
        Value::Gauge(g) => enc.encode_gauge(g),
        Value::Histogram {
            sum,
            count,
            buckets,
        } => enc.encode_histogram::<NoLabelSet>(*sum, *count, buckets, None),
    }
}

/// Whole numbers print as integers: an exact count should read as one.
fn whole(x: f64) -> bool {
    x.fract() == 0.0 && x.abs() < 9.0e15
}

fn open_metrics(families: Vec<Family>) -> Result<String> {
    let mut reg = prometheus_client::registry::Registry::default();
    reg.register_collector(Box::new(Families(families)));
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &reg).context("encoding metrics")?;
    Ok(out)
}

/// HELP text on one line: backslashes and newlines escaped (and double
/// quotes, which OpenMetrics escapes too).
fn escape_help(s: &str, quotes: bool) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => o.push_str("\\\\"),
            '\n' => o.push_str("\\n"),
            '"' if quotes => o.push_str("\\\""),
            c => o.push(c),
        }
    }
    o
}

fn escape_label(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => o.push_str("\\\\"),
            '\n' => o.push_str("\\n"),
            '"' => o.push_str("\\\""),
            c => o.push(c),
        }
    }
    o
}

/// A float as Prometheus reads it: integers without a fraction, `+Inf`.
fn float(x: f64) -> String {
    if x == f64::INFINITY {
        "+Inf".into()
    } else if x == f64::NEG_INFINITY {
        "-Inf".into()
    } else if x.is_nan() {
        "NaN".into()
    } else if whole(x) {
        format!("{}", x as i64)
    } else {
        // Rust prints the shortest text that reads back as the same float.
        format!("{x}")
    }
}

fn label_text(labels: &[(String, String)], extra: Option<(&str, &str)>) -> String {
    let mut parts: Vec<String> = labels
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", escape_label(v)))
        .collect();
    if let Some((k, v)) = extra {
        parts.push(format!("{k}=\"{v}\""));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!("{{{}}}", parts.join(","))
    }
}

/// The 0.0.4 text format.
fn text_004(families: &[Family]) -> String {
    let mut o = String::new();
    for f in families {
        let (name, kind) = match f.kind {
            Kind::Counter => (format!("{}_total", f.name), "counter"),
            Kind::Gauge => (f.name.clone(), "gauge"),
            Kind::Histogram => (f.name.clone(), "histogram"),
        };
        let _ = writeln!(o, "# HELP {name} {}", escape_help(&f.help, false));
        let _ = writeln!(o, "# TYPE {name} {kind}");
        for (labels, v) in &f.series {
            match v {
                Value::Count(c) => {
                    let _ = writeln!(o, "{name}{} {c}", label_text(labels, None));
                }
                Value::Counter(x) => {
                    let _ = writeln!(
                        o,
                        "{name}{} {}",
                        label_text(labels, None),
                        float(x.max(0.0))
                    );
                }
                Value::Gauge(x) => {
                    let _ = writeln!(o, "{name}{} {}", label_text(labels, None), float(*x));
                }
                Value::Histogram {
                    sum,
                    count,
                    buckets,
                } => {
                    let mut cum = 0u64;
                    for (le, n) in buckets {
                        cum += n;
                        let le = float(*le);
                        let _ = writeln!(
                            o,
                            "{name}_bucket{} {cum}",
                            label_text(labels, Some(("le", &le)))
                        );
                    }
                    let _ = writeln!(o, "{name}_sum{} {}", label_text(labels, None), float(*sum));
                    let _ = writeln!(o, "{name}_count{} {count}", label_text(labels, None));
                }
            }
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hist() -> Family {
        Family::new(
            "bpfscope_x",
            "h \"q\"\nx",
            Kind::Histogram,
            vec![(
                vec![("comm".into(), "a\"b".into())],
                Value::Histogram {
                    sum: 13.0,
                    count: 5,
                    buckets: vec![(4.096e-6, 0), (1.0, 3), (8.0, 2), (f64::INFINITY, 0)],
                },
            )],
        )
    }

    #[test]
    fn open_metrics_histograms_and_counters() {
        let text = render(
            vec![
                hist(),
                Family::one("bpfscope_writes_total", "w", Kind::Counter, Value::Count(7)),
            ],
            Format::OpenMetrics,
        )
        .unwrap();
        assert!(
            text.contains("# HELP bpfscope_x h \\\"q\\\"\\nx\n"),
            "{text}"
        );
        assert!(
            text.contains("bpfscope_x_bucket{le=\"8.0\",comm=\"a\\\"b\"} 5"),
            "{text}"
        );
        assert!(text.contains("le=\"0.000004096\""), "{text}");
        assert!(text.contains("# TYPE bpfscope_writes counter"), "{text}");
        assert!(text.contains("bpfscope_writes_total 7"), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    #[test]
    fn text_004_names_counters_with_total() {
        let text = render(
            vec![
                hist(),
                Family::one("bpfscope_w_total", "w\\", Kind::Counter, Value::Count(7)),
                Family::one("bpfscope_g", "g", Kind::Gauge, Value::Gauge(-1.5)),
            ],
            Format::Text004,
        )
        .unwrap();
        assert!(text.contains("# HELP bpfscope_w_total w\\\\\n"), "{text}");
        assert!(text.contains("# TYPE bpfscope_w_total counter\n"), "{text}");
        assert!(text.contains("bpfscope_w_total 7\n"), "{text}");
        assert!(text.contains("bpfscope_g -1.5\n"), "{text}");
        assert!(
            text.contains("bpfscope_x_bucket{comm=\"a\\\"b\",le=\"+Inf\"} 5\n"),
            "{text}"
        );
        assert!(text.contains("le=\"0.000004096\""), "{text}");
        assert!(!text.contains("# EOF"), "{text}");
    }

    #[test]
    fn accept_headers() {
        assert_eq!(
            Format::from_accept(Some(
                "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
            )),
            Format::OpenMetrics
        );
        assert_eq!(
            Format::from_accept(Some("text/plain; version=0.0.4")),
            Format::Text004
        );
        assert_eq!(Format::from_accept(None), Format::Text004);
    }
}
