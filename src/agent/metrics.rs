//! Kernel metrics: each configured metric is a count/hist/stats/latency
//! run of the tracing engine, read every interval (epoch flip, then the
//! old epoch read and deleted, as `--interval` does) into cumulative
//! totals that only grow, and written as Prometheus families:
//!
//! - count: a counter `NAME_total`;
//! - hist and latency: a histogram whose buckets end at powers of two
//!   (`le="4096"` holds 4096), latency in seconds; negative values, which
//!   a histogram with a `_sum` cannot hold, in `NAME_negative_total`;
//! - stats: counters `NAME_events_total` and `NAME_sum_total` (values of
//!   0 and up), `NAME_negative_events_total` and `NAME_negative_sum_total`
//!   (their absolute values) for signed fields, and gauges `NAME_min` and
//!   `NAME_max` over the last interval that had events.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::mem::MaybeUninit;
use std::rc::Rc;
use std::time::Instant;

use anyhow::{Context, Result};
use libbpf_rs::OpenObject;

use super::cgroups::CgroupNames;
use super::config::MetricDef;
use crate::attach::dispatch::{Dispatch, Owner};
use crate::attach::features::Features;
use crate::attach::plan::{self, Action, Plan, ValueKind};
use crate::attach::session::Session;
use crate::collect::aggregate::{self, AggVal, KeyAgg};
use crate::collect::Lost;
use crate::render::exposition::{Family, Kind, Labels, Value};
use crate::render::Decoder;

/// Bucket indices of the kernel's power-of-two histograms (BS_AGG_HIST_POW2).
const NEGATIVE: u32 = 0;
/// Stats keep values below zero in this bucket (BS_AGG_STATS_SIGN).
const STATS_NEGATIVE: u32 = 1;

/// One metric's loaded programs and its running totals.
pub struct MetricRun {
    pub def: MetricDef,
    plan: Plan,
    session: Session<'static>,
    dec: Decoder,
    signed: bool,
    epoch: u32,
    totals: BTreeMap<Vec<u8>, KeyAgg>,
    /// Min and max of each label set in the last interval it had events.
    last: HashMap<Vec<u8>, (i64, i64)>,
    /// When each label set's count last changed, and label sets dropped
    /// for not changing within `def.expire`.
    changed: HashMap<Vec<u8>, Instant>,
    pub expired_series: u64,
    /// Events of label sets over the cap.
    pub dropped_events: u64,
    /// What the kernel could not count, this run's programs and those of
    /// earlier runs of this metric (a spec changed on reload).
    lost_now: Lost,
    lost_before: Lost,
    pub probes: usize,
    /// The shared syscall dispatcher, and this run's id there (None: its
    /// syscall probes have raw_tp or classic tracepoints of their own).
    dispatch: Option<(Rc<RefCell<Dispatch>>, Owner)>,
    /// Routed to the dispatcher yet.
    installed: bool,
}

/// Ids of metric runs at the dispatcher.
static NEXT_OWNER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl MetricRun {
    /// Resolves, loads and attaches the metric's probes; its syscall probes
    /// go through `dispatch` (see `install`) on slots not in `taken`, the
    /// others on classic tracepoints of their own.
    pub fn start(
        def: MetricDef,
        features: &Features,
        dispatch: Option<&Rc<RefCell<Dispatch>>>,
        taken: &[u32],
    ) -> Result<MetricRun> {
        let (roles, skipped) = plan::resolve_roles(&def.plan, &def.load.target)?;
        // A glob's matches that cannot be probed are skipped, as the
        // tracing verbs skip them; a probe named on its own must attach.
        let globbed = plan::globbed(&def.plan);
        if let (false, Some((name, why))) = (globbed, skipped.first()) {
            // A metric counts what its spec names: a probe that cannot be
            // attached is an error in the spec, at start and on reload alike.
            return Err(crate::usage!(
                "metric {}: {name} cannot be probed: {why}; change the spec",
                def.name
            )
            .into());
        }
        // Syscalls go through the dispatcher's one raw_tp, as `count`
        // traces them on its own; a slot another metric routes already (or
        // no dispatcher) means classic tracepoints for this one.
        let mut plan = plan::build(&def.plan, roles.clone(), features)?;
        let slots = plan.syscall_slots();
        if dispatch.is_none() || slots.iter().any(|s| taken.contains(s)) {
            features.classic_syscalls.set(true);
            let built = plan::build(&def.plan, roles, features);
            features.classic_syscalls.set(false);
            plan = built?;
        }
        plan.for_exposition();
        // The object must outlive the session, which lives as long as the
        // metric (until a reload or exit): a few hundred bytes per start.
        let storage: &'static mut MaybeUninit<OpenObject> =
            Box::leak(Box::new(MaybeUninit::uninit()));
        let mut session = Session::load(storage, &plan, &def.load, features)
            .map_err(crate::error::refused)
            .with_context(|| format!("metric {}", def.name))?;
        let routed = !plan.syscall_slots().is_empty();
        if routed {
            session.route_syscalls();
        }
        let att = session
            .attach(&plan, false, -1, globbed)
            .map_err(crate::error::refused)
            .with_context(|| format!("metric {}", def.name))?;
        if let (false, Some((name, why))) = (globbed, att.skipped.first()) {
            return Err(crate::usage!(
                "metric {}: {name} could not be attached: {why}; change the spec",
                def.name
            )
            .into());
        }
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
            last: HashMap::new(),
            changed: HashMap::new(),
            expired_series: 0,
            dropped_events: 0,
            lost_now: Lost::default(),
            lost_before: Lost::default(),
            probes: att.probes,
            dispatch: dispatch.filter(|_| routed).map(|d| {
                (
                    d.clone(),
                    NEXT_OWNER.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                )
            }),
            installed: false,
        })
    }

    /// The dispatcher slots this run routes once installed.
    pub fn slots(&self) -> Vec<u32> {
        if self.dispatch.is_some() {
            self.plan.syscall_slots()
        } else {
            Vec::new()
        }
    }

    /// This run's id at the dispatcher.
    pub fn owner(&self) -> Option<Owner> {
        self.dispatch.as_ref().map(|d| d.1)
    }

    /// Routes the metric's syscalls to its programs: from here on it
    /// counts them (a run it replaces stops counting them at this moment).
    pub fn install(&mut self) -> Result<()> {
        if let Some((d, owner)) = &self.dispatch {
            let routes = self.session.syscall_routes(&self.plan);
            d.borrow_mut()
                .route(*owner, &routes)
                .with_context(|| format!("metric {}", self.def.name))?;
        }
        self.installed = true;
        Ok(())
    }

    /// Takes over what an earlier run of the metric of the same name
    /// counted, so that its counters go on from there (a spec changed on
    /// reload): totals of the same label sets, losses, drops.
    pub fn continue_from(&mut self, old: &MetricRun) {
        if std::mem::discriminant(&old.def.plan.action)
            != std::mem::discriminant(&self.def.plan.action)
            || old.plan.keys != self.plan.keys
            || old.signed != self.signed
        {
            return;
        }
        aggregate::merge_into(&mut self.totals, &old.totals, self.signed);
        self.changed.extend(old.changed.clone());
        self.last.extend(old.last.clone());
        self.expired_series += old.expired_series;
        self.dropped_events += old.dropped_events;
        self.lost_before = add_lost(old.lost(), self.lost_before);
    }

    /// Moves the programs on to the next epoch; `collect` reads the old
    /// one once runs in flight have finished (the caller waits once for all).
    pub fn flip(&mut self) {
        self.epoch = self.epoch.wrapping_add(1);
        self.session.set_epoch(self.epoch);
    }

    /// Reads and deletes the previous epoch's keys into the totals.
    pub fn collect(&mut self) -> Result<()> {
        let old = self.epoch.wrapping_sub(1);
        let data = aggregate::read_session(&self.session, Some(old), self.signed, true)?;
        let now = Instant::now();
        for (k, agg) in data {
            if !self.totals.contains_key(&k) && self.totals.len() >= self.def.max_series {
                self.dropped_events += agg.total(self.signed).count;
                continue;
            }
            let t = agg.total(self.signed);
            if t.count > 0 {
                self.last.insert(k.clone(), (t.min, t.max));
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
            let last = &mut self.last;
            self.totals.retain(|k, _| {
                let keep = changed
                    .get(k)
                    .is_some_and(|t| now.duration_since(*t) <= expire);
                if !keep {
                    changed.remove(k);
                    last.remove(k);
                }
                keep
            });
            self.expired_series += (before - self.totals.len()) as u64;
        }
        let lost = Lost::of_session(&self.session)?;
        self.lost_now = lost;
        Ok(())
    }

    /// Everything this metric's programs could not count, since it started.
    pub fn lost(&self) -> Lost {
        add_lost(self.lost_now, self.lost_before)
    }

    pub fn detach(&mut self) {
        if let Some((d, owner)) = &self.dispatch {
            d.borrow_mut().unroute(*owner);
        }
        self.session.detach();
    }

    /// The metric's families, labels named after its keys.
    pub fn families(&self, cgroups: &mut CgroupNames) -> Vec<Family> {
        let names: Vec<String> = self.plan.keys.iter().map(|s| label_name(&s.name)).collect();
        let mut labels_of = |key: &[u8]| -> Labels {
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
        let name = &self.def.name;
        let about = &self.def.help;
        let value = match &self.def.plan.action {
            Action::Stats { value } | Action::Hist { value, .. } => value.as_str(),
            _ => "",
        };
        let signed = self.signed;
        match &self.def.plan.action {
            Action::Count | Action::Trace { .. } => {
                let series = self
                    .totals
                    .iter()
                    .map(|(k, a)| (labels_of(k), Value::Count(a.total(signed).count)))
                    .collect();
                vec![Family::new(
                    name,
                    &format!("Count of {about} (counted in the kernel)"),
                    Kind::Counter,
                    series,
                )]
            }
            Action::Stats { .. } => {
                let mut events = Vec::new();
                let mut sums = Vec::new();
                let mut neg_events = Vec::new();
                let mut neg_sums = Vec::new();
                let mut mins = Vec::new();
                let mut maxs = Vec::new();
                for (k, a) in &self.totals {
                    let l = labels_of(k);
                    let pos = a.buckets.get(&0).copied().unwrap_or_default();
                    let neg = a.buckets.get(&STATS_NEGATIVE).copied().unwrap_or_default();
                    events.push((l.clone(), Value::Count(pos.count + neg.count)));
                    // Integers: values of 0 and up add up to one, and the
                    // negative ones' magnitudes too.
                    sums.push((l.clone(), Value::Count(pos.sum as u64)));
                    if signed {
                        neg_events.push((l.clone(), Value::Count(neg.count)));
                        neg_sums.push((l.clone(), Value::Count(neg.sum.unsigned_abs())));
                    }
                    if let Some(&(min, max)) = self.last.get(k) {
                        mins.push((l.clone(), Value::Gauge(as_f64(min, signed))));
                        maxs.push((l, Value::Gauge(as_f64(max, signed))));
                    }
                }
                let mut out = vec![
                    Family::new(
                        &format!("{name}_events"),
                        &format!("Count of {about}"),
                        Kind::Counter,
                        events,
                    ),
                    Family::new(
                        &format!("{name}_sum"),
                        &format!(
                            "Sum of {value}{} over {about}",
                            if signed { " (values of 0 and up)" } else { "" }
                        ),
                        Kind::Counter,
                        sums,
                    ),
                ];
                if signed {
                    out.push(Family::new(
                        &format!("{name}_negative_events"),
                        &format!("Count of {about} whose {value} was negative"),
                        Kind::Counter,
                        neg_events,
                    ));
                    out.push(Family::new(
                        &format!("{name}_negative_sum"),
                        &format!("Sum of the magnitudes of negative {value} over {about}"),
                        Kind::Counter,
                        neg_sums,
                    ));
                }
                out.push(Family::new(
                    &format!("{name}_min"),
                    &format!("Smallest {value} of {about}, in the last interval that had any"),
                    Kind::Gauge,
                    mins,
                ));
                out.push(Family::new(
                    &format!("{name}_max"),
                    &format!("Largest {value} of {about}, in the last interval that had any"),
                    Kind::Gauge,
                    maxs,
                ));
                out
            }
            Action::Hist { .. } | Action::Latency { .. } => {
                let seconds = matches!(self.def.plan.action, Action::Latency { .. });
                // Every series gets every bucket up to the highest any
                // holds, so that a family's `le` set only grows.
                let top = self
                    .totals
                    .values()
                    .flat_map(|a| a.buckets.keys().copied())
                    .max()
                    .unwrap_or(1)
                    .max(1);
                let mut series = Vec::new();
                let mut negative = Vec::new();
                for (k, a) in &self.totals {
                    let l = labels_of(k);
                    series.push((l.clone(), histogram(a, top, seconds)));
                    if signed {
                        let n = a.buckets.get(&NEGATIVE).map_or(0, |v| v.count);
                        negative.push((l, Value::Count(n)));
                    }
                }
                let help = if seconds {
                    format!("Seconds: {about} (measured in the kernel)")
                } else {
                    format!(
                        "Distribution of {value} over {about}{}",
                        if signed { " (values of 0 and up)" } else { "" }
                    )
                };
                let mut out = vec![Family::new(name, &help, Kind::Histogram, series)];
                if signed {
                    out.push(Family::new(
                        &format!("{name}_negative"),
                        &format!("Count of {about} whose {value} was negative (not in {name})"),
                        Kind::Counter,
                        negative,
                    ));
                }
                out
            }
        }
    }
}

fn add_lost(a: Lost, b: Lost) -> Lost {
    Lost {
        events: a.events + b.events,
        keys: a.keys + b.keys,
        stacks: a.stacks + b.stacks,
        unmatched: a.unmatched + b.unmatched,
        nested: a.nested + b.nested,
        missed: a.missed + b.missed,
    }
}

/// A value's bits as a number, per its signedness.
fn as_f64(v: i64, signed: bool) -> f64 {
    if signed {
        v as f64
    } else {
        v as u64 as f64
    }
}

/// The upper bound of a power-of-two bucket: index 1 holds 0, 2 + k holds
/// (2^(k-1), 2^k].
fn pow2_le(i: u32) -> f64 {
    match i {
        0 | 1 => 0.0,
        i => (1u128 << (i - 2).min(64)) as f64,
    }
}

/// A Prometheus histogram of the values of 0 and up, buckets 1..=top then
/// +Inf; latency in seconds (ns divided by 1e9, which prints exactly as the
/// decimal it is, where multiplying by 1e-9 would not).
fn histogram(agg: &KeyAgg, top: u32, seconds: bool) -> Value {
    let scale = |x: f64| if seconds { x / 1e9 } else { x };
    let mut buckets = Vec::with_capacity(top as usize + 1);
    let mut total = AggVal::default();
    for i in 1..=top {
        let v = agg.buckets.get(&i).copied().unwrap_or_default();
        total.merge(v, false);
        buckets.push((scale(pow2_le(i)), v.count));
    }
    buckets.push((f64::INFINITY, 0));
    Value::Histogram {
        sum: scale(total.sum as u64 as f64),
        count: total.count,
        buckets,
    }
}

/// A Prometheus label name from a key name (`args.fd` -> `args_fd`); names
/// the exposition reserves get a prefix.
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
    if n.is_empty()
        || n.starts_with(|c: char| c.is_ascii_digit())
        || n.starts_with("__")
        || n == "le"
        || n == "quantile"
    {
        n.insert_str(0, "key_");
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agg(buckets: &[(u32, u64, i64)]) -> KeyAgg {
        let mut a = KeyAgg::default();
        for &(b, count, sum) in buckets {
            a.buckets.insert(
                b,
                AggVal {
                    count,
                    sum,
                    min: 0,
                    max: 0,
                },
            );
        }
        a
    }

    #[test]
    fn powers_of_two_end_their_buckets() {
        // 3 values of 4096 (bucket 2 + 12) and one 0 (bucket 1).
        let Value::Histogram {
            sum,
            count,
            buckets,
        } = histogram(&agg(&[(1, 1, 0), (14, 3, 3 * 4096)]), 14, false)
        else {
            panic!()
        };
        assert_eq!((sum, count), (12288.0, 4));
        assert_eq!(buckets.first(), Some(&(0.0, 1)));
        assert_eq!(buckets[buckets.len() - 2], (4096.0, 3));
        assert_eq!(buckets.last(), Some(&(f64::INFINITY, 0)));
        assert!(buckets.iter().all(|b| b.0 >= 0.0));
    }

    #[test]
    fn latency_bounds_are_clean_decimals() {
        let Value::Histogram { buckets, .. } = histogram(&agg(&[(14, 1, 4000)]), 14, true) else {
            panic!()
        };
        let text: Vec<String> = buckets.iter().map(|b| format!("{}", b.0)).collect();
        assert!(text.contains(&"0.000004096".to_string()), "{text:?}");
        assert!(text.contains(&"0.000000001".to_string()), "{text:?}");
        assert!(text.iter().all(|t| t.len() < 14), "{text:?}");
    }

    #[test]
    fn label_names_are_valid() {
        assert_eq!(label_name("args.fd"), "args_fd");
        assert_eq!(label_name("1x"), "key_1x");
        assert_eq!(label_name("le"), "key_le");
    }
}
