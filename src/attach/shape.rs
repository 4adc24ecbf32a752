//! The shape of a plan's per-event work, fixed in .rodata at load so that
//! the verifier keeps only the code this session runs (fast.bpf.h): plain
//! aggregations (no latency pairs, events or scripts) with one aggregation
//! known in advance; keyless ones in a per-CPU array slot instead of a hash
//! map; one builtin key part written in place. Also the knobs that measure
//! and compare the paths: where the programs stop (`BPFSCOPE_BENCH_STAGE`,
//! bench/event_cost.py's breakdown) and the general path for every plan
//! (`BPFSCOPE_GENERIC`, tests and before/after figures).

use anyhow::{bail, Result};
use bpfscope_bpf::abi::{bs_agg, bs_bench_stage, bs_cfg_flags, bs_op, bs_src_kind};

use crate::attach::plan::{Plan, Role};

/// Stops the programs after a stage of their path: `entry` (an empty
/// program), `dispatch`, `config`, `target`, `filter` or `key`. For
/// bench/event_cost.py only; unset in every other run.
pub const BENCH_STAGE: &str = "BPFSCOPE_BENCH_STAGE";

/// Set (to anything but empty or 0): every plan takes the general path, as
/// before the specialized ones existed (tests compare the two; benches
/// measure before and after).
pub const GENERIC: &str = "BPFSCOPE_GENERIC";

/// Set to 0: keyed plans leave the per-CPU key cache out (benches measure
/// with and without it in one run).
pub const KEY_CACHE: &str = "BPFSCOPE_KEY_CACHE";

/// Buckets of a log2 histogram (0 negatives, 1 zero, 2 + k for bit k) and
/// of the agent's pow2 one (one more: 2^64's bucket).
const LOG2_BUCKETS: u32 = 67;

/// What fast.bpf.h's constants say about a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Shape {
    /// Every probe aggregates plainly, with `agg`.
    pub plain: bool,
    pub agg: u32,
    /// No key: aggregates in the `slots` array, this many per epoch.
    pub slot_buckets: Option<u32>,
    /// The enum bs_src_kind of the one key part when it is a builtin
    /// (BS_SRC_NONE: key parts through the general readers).
    pub builtin_key: u32,
    /// Every probe's filter is `comm == "X"` (or `!=`): compared as two
    /// words in place of the filter machine.
    pub comm_filter: Option<CommFilter>,
    /// Keyed, with key data of 1-16 bytes: its size. Aggregates go
    /// in the per-CPU cache (`kcache`) when their entry is free.
    pub cache_key: Option<u32>,
}

/// Key data the per-CPU cache holds at most (two words).
const CACHE_KEY_MAX: usize = 16;

impl Shape {
    /// fast.bpf.h's `fast_cache` and `cache_mask`: the words of key data
    /// the cache compares, and which of their bytes are the key's.
    pub fn cache_words(&self) -> (u32, [u64; 2]) {
        let Some(n) = self.cache_key else {
            return (0, [0, 0]);
        };
        // The key's bytes as the comm filter's words mask theirs.
        let w = crate::filter::raw::masked_words(&[], n as usize);
        let mask = |i: usize| w.get(i).map_or(0, |&(_, m)| m);
        (w.len() as u32, [mask(0), mask(1)])
    }
}

/// `comm == "X"` or `comm != "X"` as two masked words: the bytes of X and
/// its NUL must match, what follows the NUL in the task's comm is not
/// compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CommFilter {
    pub negate: bool,
    pub words: [u64; 2],
    pub masks: [u64; 2],
}

impl CommFilter {
    /// None for a string comm cannot hold (15 bytes and its NUL).
    fn of(pattern: &[u8], negate: bool) -> Option<CommFilter> {
        if pattern.len() >= 16 || pattern.contains(&0) {
            return None;
        }
        // The pattern and its NUL; comm's second word may be all outside.
        let mut w = crate::filter::raw::masked_words(pattern, pattern.len() + 1);
        w.resize(2, (0, 0));
        Some(CommFilter {
            negate,
            words: [w[0].0, w[1].0],
            masks: [w[0].1, w[1].1],
        })
    }
}

impl Shape {
    /// The shape of a plan, or the general path's when `BPFSCOPE_GENERIC` is set.
    pub fn of(plan: &Plan) -> Shape {
        if generic_forced() {
            return Shape::default();
        }
        shape_of(plan)
    }
}

impl Shape {
    /// One line for -v: the path this session's events take.
    pub fn describe(&self) -> String {
        if !self.plain {
            return match self.slot_buckets {
                Some(_) => "latency pair, no key, per-CPU slots".into(),
                None => "general".into(),
            };
        }
        let agg = match bs_agg(self.agg) {
            bs_agg::BS_AGG_COUNT => "count",
            bs_agg::BS_AGG_STATS | bs_agg::BS_AGG_STATS_SIGN => "stats",
            bs_agg::BS_AGG_HIST_LOG2 | bs_agg::BS_AGG_HIST_POW2 => "log2 histogram",
            bs_agg::BS_AGG_HIST_LINEAR => "linear histogram",
            _ => "aggregate",
        };
        let key = match bs_src_kind(self.builtin_key) {
            _ if self.slot_buckets.is_some() => "no key, per-CPU slots",
            bs_src_kind::BS_SRC_COMM => "comm key in place",
            bs_src_kind::BS_SRC_PROBE => "probe key in place",
            bs_src_kind::BS_SRC_PID => "pid key in place",
            bs_src_kind::BS_SRC_TID => "tid key in place",
            bs_src_kind::BS_SRC_CPU => "cpu key in place",
            bs_src_kind::BS_SRC_UID => "uid key in place",
            bs_src_kind::BS_SRC_CGROUP => "cgroup key in place",
            _ => "general keys",
        };
        let filter = match self.comm_filter {
            Some(_) => ", comm filter as two words",
            None => "",
        };
        let cache = match self.cache_key {
            Some(_) => ", per-CPU key cache",
            None => "",
        };
        format!("plain {agg}, {key}{filter}{cache}")
    }
}

/// Whether `BPFSCOPE_GENERIC` asks for the general path.
pub fn generic_forced() -> bool {
    generic_value(std::env::var(GENERIC).ok().as_deref())
}

fn generic_value(value: Option<&str>) -> bool {
    value.is_some_and(|v| !v.is_empty() && v != "0")
}

fn shape_of(plan: &Plan) -> Shape {
    let Some(first) = plan.probes.first() else {
        return Shape::default();
    };
    let agg = u32::from(first.cfg.agg);
    let special = bs_cfg_flags::BS_CFG_LAT_START.0
        | bs_cfg_flags::BS_CFG_LAT_END.0
        | bs_cfg_flags::BS_CFG_VM.0
        | bs_cfg_flags::BS_CFG_SELF.0;
    let plain = plan.vm.is_none()
        && !plan.latency
        && agg != bs_agg::BS_AGG_EVENT.0
        && plan.probes.iter().all(|p| {
            p.role == Role::Plain && p.cfg.flags & special == 0 && u32::from(p.cfg.agg) == agg
        });
    if !plain {
        return latency_shape(plan);
    }
    let slot_buckets = plan.keys.is_empty().then(|| slot_buckets(plan, agg));
    let cache_off = std::env::var(KEY_CACHE).is_ok_and(|v| v == "0");
    let cache_key =
        (!cache_off && slot_buckets.is_none() && (1..=CACHE_KEY_MAX).contains(&plan.key_size))
            .then_some(plan.key_size as u32);
    Shape {
        plain,
        agg,
        slot_buckets,
        builtin_key: builtin_key(plan),
        comm_filter: comm_filter(plan),
        cache_key,
    }
}

/// Aggregates of a keyless plan per epoch: its buckets.
fn slot_buckets(plan: &Plan, agg: u32) -> u32 {
    match bs_agg(agg) {
        bs_agg::BS_AGG_HIST_LOG2 | bs_agg::BS_AGG_HIST_POW2 => LOG2_BUCKETS,
        bs_agg::BS_AGG_STATS_SIGN => 2,
        bs_agg::BS_AGG_HIST_LINEAR => plan
            .probes
            .iter()
            .map(|p| p.cfg.lin_nbuckets + 2)
            .max()
            .unwrap_or(2),
        _ => 1,
    }
}

/// A keyless latency pair: its ends aggregate in the per-CPU slots, as a
/// plain keyless plan does; the rest of its path is the general one.
fn latency_shape(plan: &Plan) -> Shape {
    let end = bs_cfg_flags::BS_CFG_LAT_END.0;
    let pair = bs_cfg_flags::BS_CFG_LAT_START.0 | end;
    let Some(agg) = plan
        .probes
        .iter()
        .find(|p| p.cfg.flags & end != 0)
        .map(|p| u32::from(p.cfg.agg))
    else {
        return Shape::default();
    };
    let keyless = plan.latency
        && plan.vm.is_none()
        && plan.keys.is_empty()
        && agg != bs_agg::BS_AGG_EVENT.0
        && plan.probes.iter().all(|p| {
            p.cfg.flags & pair != 0 && (p.cfg.flags & end == 0 || u32::from(p.cfg.agg) == agg)
        });
    if !keyless {
        return Shape::default();
    }
    Shape {
        agg,
        slot_buckets: Some(slot_buckets(plan, agg)),
        ..Shape::default()
    }
}

/// The filter every probe has, when it is one comparison of comm with a
/// constant string.
fn comm_filter(plan: &Plan) -> Option<CommFilter> {
    let mut found: Option<(u8, u32)> = None;
    for p in &plan.probes {
        if p.cfg.nfilter != 1 {
            return None;
        }
        let op = &p.cfg.filter[0];
        let this = (op.op, op.str_idx);
        let string_op =
            op.op == bs_op::BS_OP_STR_EQ.0 as u8 || op.op == bs_op::BS_OP_STR_NE.0 as u8;
        if !string_op
            || u32::from(op.src.kind) != bs_src_kind::BS_SRC_COMM.0
            || found.is_some_and(|f| f != this)
        {
            return None;
        }
        found = Some(this);
    }
    let (op, idx) = found?;
    let pattern = plan.strs.strs.get(idx as usize)?;
    CommFilter::of(
        &crate::filter::raw::encode(pattern),
        op == bs_op::BS_OP_STR_NE.0 as u8,
    )
}

/// The builtin every probe reads as the plan's one key part, if any.
fn builtin_key(plan: &Plan) -> u32 {
    let builtins = [
        bs_src_kind::BS_SRC_COMM,
        bs_src_kind::BS_SRC_PROBE,
        bs_src_kind::BS_SRC_PID,
        bs_src_kind::BS_SRC_TID,
        bs_src_kind::BS_SRC_CPU,
        bs_src_kind::BS_SRC_UID,
        bs_src_kind::BS_SRC_CGROUP,
    ];
    let none = bs_src_kind::BS_SRC_NONE.0;
    if plan.keys.len() != 1 {
        return none;
    }
    let kinds: Vec<u32> = plan
        .probes
        .iter()
        .map(|p| (p.cfg.nkeys == 1).then_some(u32::from(p.cfg.keys[0].kind)))
        .collect::<Option<Vec<u32>>>()
        .unwrap_or_default();
    match kinds.first() {
        Some(&k) if kinds.iter().all(|&x| x == k) && builtins.iter().any(|b| b.0 == k) => k,
        _ => none,
    }
}

/// The stage the programs stop after (BS_STAGE_OFF: they run to the end).
pub fn bench_stage() -> Result<u32> {
    stage_of(std::env::var(BENCH_STAGE).ok().as_deref())
}

/// The stages by name, in the order an event passes them.
const STAGES: [(&str, bs_bench_stage); 6] = [
    ("entry", bs_bench_stage::BS_STAGE_ENTRY),
    ("dispatch", bs_bench_stage::BS_STAGE_DISPATCH),
    ("config", bs_bench_stage::BS_STAGE_CONFIG),
    ("target", bs_bench_stage::BS_STAGE_TARGET),
    ("filter", bs_bench_stage::BS_STAGE_FILTER),
    ("key", bs_bench_stage::BS_STAGE_KEY),
];

fn stage_of(value: Option<&str>) -> Result<u32> {
    let Some(v) = value.filter(|v| !v.is_empty()) else {
        return Ok(bs_bench_stage::BS_STAGE_OFF.0);
    };
    match STAGES.iter().find(|(name, _)| *name == v) {
        Some((_, s)) => Ok(s.0),
        None => {
            let names: Vec<&str> = STAGES.iter().map(|s| s.0).collect();
            bail!(
                "{BENCH_STAGE}={v}: not a stage; unset it, or use one of {}",
                names.join(", ")
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stages_by_name() {
        assert_eq!(stage_of(None).unwrap(), bs_bench_stage::BS_STAGE_OFF.0);
        assert_eq!(stage_of(Some("")).unwrap(), bs_bench_stage::BS_STAGE_OFF.0);
        assert_eq!(
            stage_of(Some("entry")).unwrap(),
            bs_bench_stage::BS_STAGE_ENTRY.0
        );
        assert_eq!(
            stage_of(Some("key")).unwrap(),
            bs_bench_stage::BS_STAGE_KEY.0
        );
        let e = stage_of(Some("nope")).unwrap_err().to_string();
        assert_eq!(
            e,
            "BPFSCOPE_BENCH_STAGE=nope: not a stage; unset it, or use one of entry, dispatch, config, target, filter, key"
        );
    }

    #[test]
    fn comm_filter_words() {
        let f = CommFilter::of(b"umaskloop", false).unwrap();
        assert_eq!(f.words[0], u64::from_ne_bytes(*b"umaskloo"));
        assert_eq!(f.words[1], u64::from_ne_bytes(*b"p\0\0\0\0\0\0\0"));
        // Bytes 0..=9 compared: the pattern and its NUL.
        let m = u64::from_ne_bytes([0xff, 0xff, 0, 0, 0, 0, 0, 0]);
        assert_eq!(f.masks, [u64::MAX, m]);
        assert!(CommFilter::of(b"0123456789abcdef", false).is_none());
        let empty = CommFilter::of(b"", true).unwrap();
        assert!(empty.negate);
        assert_eq!(
            empty.masks,
            [u64::from_ne_bytes([0xff, 0, 0, 0, 0, 0, 0, 0]), 0]
        );
    }

    #[test]
    fn a_keyless_latency_pair_aggregates_in_slots() {
        use crate::attach::plan::fixtures::wakeup_to_switch;
        let shape = shape_of(&wakeup_to_switch(&["pid=next_pid"], &[]));
        assert!(!shape.plain);
        assert_eq!(shape.agg, bs_agg::BS_AGG_HIST_LOG2.0);
        assert_eq!(shape.slot_buckets, Some(LOG2_BUCKETS));
        assert_eq!(shape.describe(), "latency pair, no key, per-CPU slots");
        // A key keeps the general path's hash map.
        let keyed = shape_of(&wakeup_to_switch(&["pid=next_pid"], &["comm"]));
        assert_eq!(keyed, Shape::default());
        assert_eq!(keyed.describe(), "general");
    }

    #[test]
    fn generic_when_set() {
        assert!(!generic_value(None));
        assert!(!generic_value(Some("")));
        assert!(!generic_value(Some("0")));
        assert!(generic_value(Some("1")));
    }
}
