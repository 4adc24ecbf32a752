//! Kernel metrics: each configured metric is a count/hist/stats/latency
//! run of the tracing engine, read every interval (epoch flip, then the
//! old epoch read and deleted, as `--interval` does) into cumulative
//! totals that only grow, and rendered in the Prometheus exposition format.

use std::collections::BTreeMap;
use std::mem::MaybeUninit;

use anyhow::{Context, Result};
use libbpf_rs::OpenObject;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType;

use super::labels::CgroupNames;
use crate::attach::features::Features;
use crate::attach::plan::{self, Action, Buckets, Plan, ValueKind};
use crate::attach::session::Session;
use crate::cli::agent::MetricDef;
use crate::collect::aggregate::{self, KeyAgg};
use crate::collect::Lost;
use crate::render::hist::bounds;
use crate::render::Decoder;

/// Up to this many syscalls, a metric attaches their classic tracepoints
/// (see `Features::classic_syscalls`).
const CLASSIC_SYSCALLS: usize = 8;

/// One metric's loaded programs and its running totals.
pub struct MetricRun {
    pub def: MetricDef,
    plan: Plan,
    session: Session<'static>,
    dec: Decoder,
    signed: bool,
    epoch: u32,
    totals: BTreeMap<Vec<u8>, KeyAgg>,
    /// Events of label sets over the cap, and those label sets' count.
    pub dropped_events: u64,
    /// When each label set's count last changed, and label sets dropped
    /// for not changing within `def.expire`.
    changed: std::collections::HashMap<Vec<u8>, std::time::Instant>,
    pub expired_series: u64,
    pub lost: Lost,
    pub probes: usize,
}

impl MetricRun {
    /// Resolves, loads and attaches the metric's probes.
    pub fn start(def: MetricDef, features: &Features) -> Result<MetricRun> {
        let s = &def.settings;
        let (roles, _skipped) = crate::cmd::trace::resolve_roles(s)?;
        // A metric of a few syscalls runs only when they happen, not on
        // every syscall of the machine (as the shared raw_tp would, once
        // per metric).
        let syscalls = roles
            .iter()
            .filter(|(p, _)| {
                matches!(
                    p.kind,
                    crate::probe::ProbeKind::Tracepoint {
                        syscall: Some(_),
                        ..
                    }
                )
            })
            .count();
        features.classic_syscalls.set(syscalls <= CLASSIC_SYSCALLS);
        let built = plan::build(&s.plan, roles, features);
        features.classic_syscalls.set(false);
        let plan = built?;
        // The object must outlive the session, which lives as long as the
        // metric (until a reload or exit): a few hundred bytes per start.
        let storage: &'static mut MaybeUninit<OpenObject> =
            Box::leak(Box::new(MaybeUninit::uninit()));
        let mut session =
            Session::load(storage, &plan, &s.load, features).map_err(crate::error::refused)?;
        let globbed = crate::cmd::trace::globbed(&s.plan);
        let att = session
            .attach(&plan, false, -1, globbed)
            .map_err(crate::error::refused)
            .with_context(|| format!("metric {}", def.name))?;
        crate::cmd::trace::report_skipped(&att, false);
        let signed = plan.value.as_ref().is_some_and(|v| v.1);
        let dec = Decoder::new(&plan);
        Ok(MetricRun {
            def,
            dec,
            signed,
            plan,
            session,
            epoch: 0,
            totals: BTreeMap::new(),
            dropped_events: 0,
            changed: std::collections::HashMap::new(),
            expired_series: 0,
            lost: Lost::default(),
            probes: att.probes,
        })
    }

    /// Moves the programs on to the next epoch; `collect` reads the old
    /// one once runs in flight have finished (the caller waits once for all).
    pub fn flip(&mut self) {
        self.epoch = self.epoch.wrapping_add(1);
        crate::cmd::trace::set_epoch(&mut self.session, self.epoch);
    }

    /// Reads and deletes the previous epoch's keys into the totals.
    pub fn collect(&mut self) -> Result<()> {
        let old = self.epoch.wrapping_sub(1);
        let data = aggregate::read(&self.session.skel.maps.aggs, Some(old), self.signed, true)?;
        let now = std::time::Instant::now();
        for (k, agg) in data {
            if !self.totals.contains_key(&k) && self.totals.len() >= self.def.max_series {
                self.dropped_events += agg.total(self.signed).count;
                continue;
            }
            self.changed.insert(k.clone(), now);
            let mut one = BTreeMap::new();
            one.insert(k, agg);
            aggregate::merge_into(&mut self.totals, &one, self.signed);
        }
        if !self.def.expire.is_zero() {
            let expire = self.def.expire;
            let before = self.totals.len();
            let changed = &mut self.changed;
            self.totals.retain(|k, _| {
                let keep = changed
                    .get(k)
                    .is_some_and(|t| now.duration_since(*t) <= expire);
                if !keep {
                    changed.remove(k);
                }
                keep
            });
            self.expired_series += (before - self.totals.len()) as u64;
        }
        let mut lost = Lost::read(&self.session.skel.maps.lost)?;
        lost.nested = self.session.recursion_misses();
        lost.missed = self.session.kprobe_misses();
        self.lost = lost;
        Ok(())
    }

    pub fn detach(&mut self) {
        self.session.detach();
    }

    /// The metric's families, labels named after its keys.
    pub fn families(&self, cgroups: &mut CgroupNames) -> Vec<Family> {
        let names: Vec<String> = self.plan.keys.iter().map(|s| label_name(&s.name)).collect();
        let label_set = |key: &[u8], cgroups: &mut CgroupNames| -> Vec<(String, String)> {
            self.plan
                .keys
                .iter()
                .zip(&names)
                .map(|(slot, n)| {
                    let v = if slot.kind == ValueKind::Cgroup {
                        let b = key.get(slot.off..slot.off + 8).unwrap_or(&[]);
                        let id = u64::from_ne_bytes(b.try_into().unwrap_or([0; 8]));
                        cgroups
                            .labels(id)
                            .map(|l| l.path.clone())
                            .unwrap_or_else(|| format!("cgroup:{id}"))
                    } else {
                        self.dec.cell(slot, key).text()
                    };
                    (n.clone(), v)
                })
                .collect()
        };
        let help = format!("bpfscope metric: {}", self.def.spec);
        let action = &self.def.settings.plan.action;
        let mut out = Vec::new();
        match action {
            Action::Count | Action::Trace { .. } => {
                let series = self
                    .totals
                    .iter()
                    .map(|(k, a)| {
                        (
                            label_set(k, cgroups),
                            Value::Counter(a.total(self.signed).count as f64),
                        )
                    })
                    .collect();
                out.push(Family::new(
                    &self.def.name,
                    &help,
                    MetricType::Counter,
                    series,
                ));
            }
            Action::Stats { .. } => {
                let mut counts = Vec::new();
                let mut sums = Vec::new();
                for (k, a) in &self.totals {
                    let t = a.total(self.signed);
                    let l = label_set(k, cgroups);
                    counts.push((l.clone(), Value::Counter(t.count as f64)));
                    // A sum of signed values can go down: not a counter then.
                    sums.push((
                        l,
                        if self.signed {
                            Value::Gauge(t.sum as f64)
                        } else {
                            Value::Counter(t.sum as f64)
                        },
                    ));
                }
                out.push(Family::new(
                    &format!("{}_events", self.def.name),
                    &help,
                    MetricType::Counter,
                    counts,
                ));
                out.push(Family::new(
                    &format!("{}_sum", self.def.name),
                    &help,
                    if self.signed {
                        MetricType::Gauge
                    } else {
                        MetricType::Counter
                    },
                    sums,
                ));
            }
            Action::Hist { buckets, .. } | Action::Latency { buckets, .. } => {
                let scale = if matches!(action, Action::Latency { .. }) {
                    1e-9
                } else {
                    1.0
                };
                let top = self
                    .totals
                    .values()
                    .flat_map(|a| a.buckets.keys().copied())
                    .max()
                    .unwrap_or(0);
                let series = self
                    .totals
                    .iter()
                    .map(|(k, a)| {
                        let t = a.total(self.signed);
                        let h = histogram(*buckets, a, top, scale);
                        (
                            label_set(k, cgroups),
                            Value::Histogram {
                                sum: t.sum as f64 * scale,
                                count: t.count,
                                buckets: h,
                            },
                        )
                    })
                    .collect();
                out.push(Family::new(
                    &self.def.name,
                    &help,
                    MetricType::Histogram,
                    series,
                ));
            }
        }
        out
    }
}

/// Prometheus buckets from the engine's: every bucket up to `top` (so a
/// family's `le` set only grows), each `le` the largest integer it holds
/// (values are integers: [low, high) is <= high - 1), then +Inf.
fn histogram(b: Buckets, agg: &KeyAgg, top: u32, scale: f64) -> Vec<(f64, u64)> {
    let mut out = Vec::with_capacity(top as usize + 2);
    for i in 0..=top {
        let bo = bounds(b, i);
        let count = agg.buckets.get(&i).map_or(0, |v| v.count);
        let le = bo.high - 1;
        if bo.high >= i64::MAX as i128 || bo.high >= u64::MAX as i128 {
            // The open top bucket is +Inf's.
            out.push((f64::INFINITY, count));
            return out;
        }
        out.push((le as f64 * scale, count));
    }
    out.push((f64::INFINITY, 0));
    out
}

/// A Prometheus label name from a key name (`args.fd` -> `args_fd`).
fn label_name(s: &str) -> String {
    let mut n: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if n.is_empty() || n.starts_with(|c: char| c.is_ascii_digit()) || n.starts_with("__") {
        n.insert(0, 'k');
    }
    n
}

/// A value of one series.
#[derive(Debug, Clone)]
pub enum Value {
    Counter(f64),
    Gauge(f64),
    Histogram {
        sum: f64,
        count: u64,
        /// (upper bound, count in this bucket), ascending, +Inf last.
        buckets: Vec<(f64, u64)>,
    },
}

/// One metric family: a name, its help, its series.
#[derive(Debug, Clone)]
pub struct Family {
    pub name: String,
    pub help: String,
    pub kind: MetricType,
    pub series: Vec<(Vec<(String, String)>, Value)>,
}

impl Family {
    pub fn new(
        name: &str,
        help: &str,
        kind: MetricType,
        series: Vec<(Vec<(String, String)>, Value)>,
    ) -> Family {
        Family {
            name: name.to_string(),
            help: help.to_string(),
            kind,
            series,
        }
    }

    pub fn one(
        name: &str,
        help: &str,
        kind: MetricType,
        labels: Vec<(String, String)>,
        v: Value,
    ) -> Family {
        Family::new(name, help, kind, vec![(labels, v)])
    }
}

/// Families handed to prometheus-client's text encoder.
#[derive(Debug)]
pub struct Families(pub Vec<Family>);

impl prometheus_client::collector::Collector for Families {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for f in &self.0 {
            let name = f.name.strip_suffix("_total").unwrap_or(&f.name);
            let mut me = encoder.encode_descriptor(name, &f.help, None, f.kind)?;
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
    // Whole counts print as integers: an exact count should read as one.
    let whole = |x: f64| x >= 0.0 && x.fract() == 0.0 && x < 9.0e15;
    match v {
        Value::Counter(c) if whole(*c) => enc
            .encode_counter::<prometheus_client::encoding::NoLabelSet, _, u64>(&(*c as u64), None),
        Value::Counter(c) => {
            enc.encode_counter::<prometheus_client::encoding::NoLabelSet, _, f64>(c, None)
        }
        Value::Gauge(g) if whole(*g) => enc.encode_gauge(&(*g as i64)),
        Value::Gauge(g) => enc.encode_gauge(g),
        Value::Histogram {
            sum,
            count,
            buckets,
        } => enc.encode_histogram::<prometheus_client::encoding::NoLabelSet>(
            *sum, *count, buckets, None,
        ),
    }
}

/// The exposition text of these families (OpenMetrics, which Prometheus
/// asks for first and reads natively).
pub fn render(families: Vec<Family>) -> Result<String> {
    let mut reg = prometheus_client::registry::Registry::default();
    reg.register_collector(Box::new(Families(families)));
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &reg).context("encoding metrics")?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collect::aggregate::AggVal;

    #[test]
    fn log2_buckets_become_cumulative_prometheus_buckets() {
        let mut agg = KeyAgg::default();
        // bucket 2 = [1,2): value 1; bucket 4 = [4,8)
        agg.buckets.insert(
            2,
            AggVal {
                count: 3,
                sum: 3,
                min: 1,
                max: 1,
            },
        );
        agg.buckets.insert(
            4,
            AggVal {
                count: 2,
                sum: 10,
                min: 5,
                max: 5,
            },
        );
        let h = histogram(Buckets::Log2, &agg, 4, 1.0);
        let les: Vec<f64> = h.iter().map(|b| b.0).collect();
        assert_eq!(les, [-1.0, 0.0, 1.0, 3.0, 7.0, f64::INFINITY]);
        let text = render(vec![Family::one(
            "bpfscope_x",
            "h",
            MetricType::Histogram,
            vec![("comm".into(), "a\"b".into())],
            Value::Histogram {
                sum: 13.0,
                count: 5,
                buckets: h,
            },
        )])
        .unwrap();
        assert!(
            text.contains("bpfscope_x_bucket{le=\"1.0\",comm=\"a\\\"b\"} 3"),
            "{text}"
        );
        assert!(
            text.contains("bpfscope_x_bucket{le=\"7.0\",comm=\"a\\\"b\"} 5"),
            "{text}"
        );
        assert!(
            text.contains("bpfscope_x_bucket{le=\"+Inf\",comm=\"a\\\"b\"} 5"),
            "{text}"
        );
        assert!(
            text.contains("bpfscope_x_count{comm=\"a\\\"b\"} 5"),
            "{text}"
        );
    }

    #[test]
    fn counters_get_total() {
        let text = render(vec![Family::one(
            "bpfscope_writes_total",
            "w",
            MetricType::Counter,
            vec![],
            Value::Counter(7.0),
        )])
        .unwrap();
        assert!(text.contains("# TYPE bpfscope_writes counter"), "{text}");
        assert!(text.contains("bpfscope_writes_total 7"), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    #[test]
    fn label_names_are_valid() {
        assert_eq!(label_name("args.fd"), "args_fd");
        assert_eq!(label_name("1x"), "k1x");
    }
}
