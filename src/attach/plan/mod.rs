//! The plan stage: from settings and resolved probes to one `bs_probe_cfg`
//! per probe, the configuration the generic BPF programs look up by
//! cookie. `build` runs passes in order, each doing one thing and handing
//! a richer structure to the next:
//!
//! 1. `sides`: the names the plan reads, and which side of a latency pair
//!    reads each;
//! 2. `paths`: the kernel mechanism each probe is attached through
//!    (kernel functions: `kernel`);
//! 3. `keys`: the key layout shared by all probes;
//!
//! then per probe, in this order (the first error wins, probe by probe):
//! the key parts it writes (`keys`), its value (`values`), its latency
//! pairing (`pairing`), its filter program (`filter`), its event layout
//! (`events`), assembled into its configuration (`assemble`). `limits`
//! holds the BPF side's bounds, checked where each pass meets them, and
//! the plan's largest part counts; `source` says where any name is read.

use std::path::PathBuf;

use crate::attach::features::Features;
use crate::attach::target::Target;
use crate::error::Error;
use crate::filter::{Expr, StrTable};
use crate::probe::spec::ProbeSpec;
use crate::probe::{Probe, SyscallTp};
use bpfscope_bpf::abi::{
    bs_agg, bs_cfg_flags, bs_filter_op, bs_limits, bs_probe_cfg, bs_src, bs_src_kind,
};

mod events;
mod filter;
mod kernel;
mod keys;
mod limits;
mod pairing;
mod paths;
mod sides;
mod source;
mod values;

#[cfg(test)]
pub(crate) mod fixtures;
#[cfg(test)]
mod golden;

/// What a tracing command computes.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    Count,
    Stats {
        value: String,
    },
    Hist {
        value: String,
        buckets: Buckets,
    },
    Trace {
        fields: Vec<String>,
    },
    /// Time from a start to its end, in ns.
    Latency {
        buckets: Buckets,
        /// The END probe of a START/END pair; None: function returns.
        end: Option<ProbeSpec>,
        /// Fields that pair a start with its end (`--match`); empty: the
        /// thread id.
        matching: Vec<String>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Buckets {
    Log2,
    /// `nbuckets` buckets of `step` from `min`; the last ends at or above max.
    Linear {
        min: i64,
        step: u64,
        nbuckets: u32,
    },
}

/// The plan stage's input: what each probe computes.
#[derive(Debug, Clone)]
pub struct PlanConfig {
    pub action: Action,
    pub probes: Vec<ProbeSpec>,
    /// `--by` key names, in order.
    pub keys: Vec<String>,
    pub filter: Option<Expr>,
}

impl PlanConfig {
    /// The END probe of a latency pair.
    pub fn latency_end(&self) -> Option<&ProbeSpec> {
        match &self.action {
            Action::Latency { end, .. } => end.as_ref(),
            _ => None,
        }
    }

    /// `--match` fields of a latency pair (empty: none given).
    pub fn matching(&self) -> &[String] {
        match &self.action {
            Action::Latency { matching, .. } => matching,
            _ => &[],
        }
    }
}

/// The kernel mechanism a probe is attached through, cheapest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Path {
    /// Shared raw_tp on sys_enter/sys_exit, dispatched by syscall number.
    Syscall(SyscallTp),
    /// raw_tp on the tracepoint itself with a cookie (no record fields needed).
    RawTp { name: String },
    /// Classic tracepoint through a perf link with a cookie.
    Tracepoint { subsys: String, event: String },
    /// uprobe/uretprobe at a file offset; probes of one binary share a uprobe_multi link.
    Uprobe {
        binary: PathBuf,
        offset: u64,
        ret: bool,
    },
    /// USDT probe through libbpf's USDT support.
    Usdt {
        binary: PathBuf,
        provider: String,
        name: String,
    },
    /// A kernel function's entry or return.
    Kfunc(KfuncPath),
    /// A script's BEGIN, END or interval block: never attached, run by
    /// bpfscope with BPF_PROG_TEST_RUN when due (`Session::fire`).
    Trigger,
    /// A software clock sampling every CPU (`profile:hz:N`), or one CPU.
    Clock { hz: u64, cpu: Option<u32> },
    /// A perf event on every CPU, sampled every `period` occurrences
    /// (`software:page-faults:100`): perf_event_attr's type and config.
    Perf { ty: u32, config: u64, period: u64 },
}

/// How a kernel function probe is attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mech {
    /// fentry/fexit: one program load per function, cheapest per event.
    Fentry,
    /// One kprobe/kretprobe perf link per function.
    Kprobe,
    /// One kprobe_multi link for many functions, a cookie each.
    KprobeMulti,
}

impl Mech {
    pub fn describe(self, ret: bool) -> &'static str {
        match (self, ret) {
            (Mech::Fentry, false) => "fentry with cookie",
            (Mech::Fentry, true) => "fexit with cookie",
            (Mech::Kprobe, false) => "kprobe with cookie",
            (Mech::Kprobe, true) => "kretprobe with cookie",
            (Mech::KprobeMulti, false) => "kprobe_multi with cookies",
            (Mech::KprobeMulti, true) => "kretprobe (kprobe_multi) with cookies",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KfuncPath {
    pub func: String,
    pub offset: u64,
    pub ret: bool,
    /// What is tried first.
    pub mech: Mech,
    /// What is tried when that fails for this function.
    pub fallback: Option<Mech>,
    /// BTF id of the function: the fentry/fexit target.
    pub btf_id: Option<u32>,
    /// Why this function cannot be attached at all (it is skipped).
    pub unavailable: Option<String>,
}

impl Path {
    pub fn describe(&self) -> &'static str {
        match self {
            Path::Syscall(s) if s.exit => "raw_tp sys_exit (shared, by syscall number)",
            Path::Syscall(_) => "raw_tp sys_enter (shared, by syscall number)",
            Path::RawTp { .. } => "raw_tp with cookie",
            Path::Tracepoint { .. } => "tracepoint (perf link) with cookie",
            Path::Uprobe { ret: false, .. } => "uprobe with cookie",
            Path::Uprobe { ret: true, .. } => "uretprobe with cookie",
            Path::Usdt { .. } => "usdt with cookie",
            Path::Kfunc(k) => match &k.unavailable {
                Some(_) => "skipped",
                None => k.mech.describe(k.ret),
            },
            Path::Trigger => "run by bpfscope (BPF_PROG_TEST_RUN)",
            Path::Clock { .. } => "perf_event cpu-clock with cookie",
            Path::Perf { .. } => "perf_event with cookie",
        }
    }

    /// Whether fields are read from argument slots rather than a record.
    pub fn uses_args(&self) -> bool {
        matches!(
            self,
            Path::Syscall(_) | Path::Uprobe { .. } | Path::Usdt { .. } | Path::Kfunc(_)
        )
    }
}

/// A probe's part in a latency measurement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Plain,
    /// Remembers the time (and the start side's key parts) under its match key.
    Start(u32),
    /// Aggregates the time since the matching start.
    End(u32),
}

/// How a value is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueKind {
    /// The probe's full name (stored as its index).
    Probe,
    /// A cgroup v2 id, shown as its path.
    Cgroup,
    Int {
        signed: bool,
    },
    /// Pointers and addresses: hex.
    Hex,
    Str,
    /// A syscall's user buffer with its length (write's buf and count):
    /// the length as passed, then up to BS_BUF_MAX bytes.
    Buf,
    /// A stack id in the kernel (`user`: false) or user stack map.
    Stack {
        user: bool,
    },
}

/// A key part or event field: name, how to show it, where its bytes are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    pub name: String,
    pub kind: ValueKind,
    pub off: usize,
    pub len: usize,
}

#[derive(Debug, Clone)]
pub struct PlannedProbe {
    pub probe: Probe,
    pub path: Path,
    pub role: Role,
    pub cfg: bs_probe_cfg,
    /// Event data layout (trace only).
    pub event: Vec<Slot>,
}

#[derive(Debug, Clone)]
pub struct Plan {
    pub probes: Vec<PlannedProbe>,
    /// Key layout after the key header, shared by all probes.
    pub keys: Vec<Slot>,
    pub key_size: usize,
    pub strs: StrTable,
    /// Name and signedness of --value, if any.
    pub value: Option<(String, bool)>,
    /// Latency is measured (starts and ends are paired).
    pub latency: bool,
    /// Largest filter, key and event part counts, to specialize the programs at load.
    pub max_filter: usize,
    pub max_keys: usize,
    pub max_emit: usize,
    /// A script's machine code, its sources, and entries of its plain maps.
    pub vm: Option<VmImage>,
}

/// What `bpfscope run` loads besides the probes' configurations.
#[derive(Debug, Clone, Default)]
pub struct VmImage {
    pub code: Vec<bpfscope_bpf::abi::bs_insn>,
    pub srcs: Vec<bs_src>,
    /// The script's maps by id, each a kernel map of its own.
    pub maps: Vec<VmMap>,
    /// Some map lives in the threads' own storage (its operations carry
    /// BS_VMF_TASK): the object's `vm_task` is created and used.
    pub thread_maps: bool,
    /// (word, map id) of each thread map printed at the end: a thread
    /// leaving puts its word in the map's hash map (bpfscope_task_exit).
    pub task_print: Vec<(u32, u32)>,
    /// Aggregations with a per-CPU cache (`vm_cache`'s elements).
    pub cache_maps: u32,
}

/// One script map's kernel map: per-CPU aggregates or plain values, and
/// how many entries it holds (keys, times buckets for a histogram).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmMap {
    /// As the script names it (`@start`).
    pub name: String,
    pub kind: VmMapKind,
    pub entries: u32,
}

/// What a script map's kernel map holds, and so its type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VmMapKind {
    /// Plain values by key (`@start[tid] = nsecs`): a hash map.
    Values,
    /// Per-CPU aggregates by key and bucket: a hash map.
    Aggs,
    /// A keyless aggregation's buckets: a per-CPU array.
    Slots,
}

impl Plan {
    /// The agent's aggregations: log2 histograms whose buckets end at a
    /// power of two, inclusive (a Prometheus `le`), and stats that keep
    /// negative values apart (so that sums stay counters).
    pub fn for_exposition(&mut self) {
        for p in &mut self.probes {
            let to = match bs_agg(u32::from(p.cfg.agg)) {
                bs_agg::BS_AGG_HIST_LOG2 => bs_agg::BS_AGG_HIST_POW2,
                bs_agg::BS_AGG_STATS => bs_agg::BS_AGG_STATS_SIGN,
                _ => continue,
            };
            p.cfg.agg = to.0 as u8;
        }
    }

    /// The syscall dispatch slots of the probes on the shared raw_tp path
    /// (the number on entry, BS_SYS_EXIT_BASE + the number on exit).
    pub fn syscall_slots(&self) -> Vec<u32> {
        let mut out: Vec<u32> = self
            .probes
            .iter()
            .filter_map(|p| match p.path {
                Path::Syscall(sc) => Some(sc.slot()),
                _ => None,
            })
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Whether a key holds kernel stacks, user stacks.
    pub fn stacks(&self) -> (bool, bool) {
        let has = |user| {
            self.keys
                .iter()
                .any(|k| k.kind == ValueKind::Stack { user })
        };
        (has(false), has(true))
    }
}

/// The cheapest path of one probe that reads `fields` (a script's probe).
pub fn path_for(probe: &Probe, fields: &[&str], features: &Features) -> Result<Path, Error> {
    paths::path_for(probe, fields, features)
}

/// Where a name (a builtin or a field, `args.` optional) is read on a path,
/// how it is shown, and its bytes in a key or event.
pub fn source_for(
    probe: &Probe,
    path: &Path,
    name: &str,
) -> Result<(bs_src, ValueKind, usize), Error> {
    source::name_src(probe, path, name)
}

/// Builds the plan for probes in their roles.
pub fn build(
    s: &PlanConfig,
    probes: Vec<(Probe, Role)>,
    features: &Features,
) -> Result<Plan, Error> {
    let sides = sides::sides(s, &probes)?;
    let paths = paths::paths(&probes, &sides, features)?;
    let keys = keys::layout(&probes, &paths, &sides)?;
    let aggregation = values::aggregation(&s.action);
    let returns = s.latency_end().is_none();
    let mut strs = StrTable::default();
    let mut planned = Vec::with_capacity(probes.len());
    for ((probe, role), path) in probes.into_iter().zip(paths) {
        let parts = Parts {
            keys: keys::sources(&keys, &probe, role, &path)?,
            aggregation,
            value: values::value(sides.value.as_deref(), &probe, &path)?,
            pairing: pairing::pairing(&sides, returns, &probe, role, &path)?,
            filter: filter::compile(
                s.filter.as_ref(),
                sides.filter,
                &probe,
                role,
                &path,
                &mut strs,
            )?,
            event: events::layout(sides.trace.as_deref(), &probe, &path)?,
        };
        let (mut cfg, event) = assemble(parts);
        if matches!(path, Path::RawTp { .. }) {
            cfg.nargs = raw_args(&cfg);
        }
        planned.push(PlannedProbe {
            probe,
            path,
            role,
            cfg,
            event,
        });
    }
    // Whether the value is signed, as the last probe reads it.
    let value_signed = planned.last().is_some_and(|p| p.cfg.value.is_signed != 0);
    let most = limits::Maxima::of(&planned);
    Ok(Plan {
        probes: planned,
        keys: keys.slots,
        key_size: keys.size,
        strs,
        value: sides.value.map(|v| (v, value_signed)),
        latency: sides.latency,
        max_filter: most.filter,
        max_keys: most.keys,
        max_emit: most.emit,
        vm: None,
    })
}

/// What the per-probe passes made of one probe.
struct Parts {
    keys: Vec<bs_src>,
    aggregation: values::Aggregation,
    value: Option<bs_src>,
    pairing: Option<pairing::Pairing>,
    filter: Vec<bs_filter_op>,
    event: Option<events::EventLayout>,
}

/// One probe's configuration from its parts, and its event layout.
fn assemble(p: Parts) -> (bs_probe_cfg, Vec<Slot>) {
    let mut cfg = bs_probe_cfg {
        agg: p.aggregation.agg.0 as u8,
        nkeys: p.keys.len() as u8,
        nfilter: p.filter.len() as u8,
        ..Default::default()
    };
    cfg.keys[..p.keys.len()].copy_from_slice(&p.keys);
    if let Some(l) = p.aggregation.linear {
        cfg.lin_min = l.min;
        cfg.lin_step = l.step;
        cfg.lin_nbuckets = l.nbuckets;
    }
    if let Some(v) = p.value {
        cfg.value = v;
    }
    if let Some(pair) = &p.pairing {
        cfg.pair = pair.pair;
        cfg.flags |= pair.flags;
        cfg.r#match[..pair.matches.len()].copy_from_slice(&pair.matches);
        cfg.nmatch = pair.matches.len() as u8;
    }
    cfg.filter[..p.filter.len()].copy_from_slice(&p.filter);
    let mut slots = Vec::new();
    if let Some(e) = p.event {
        cfg.emit[..e.srcs.len()].copy_from_slice(&e.srcs);
        cfg.nemit = e.srcs.len() as u8;
        cfg.event_size = e.size as u16;
        slots = e.slots;
    }
    // Argument slots are filled before anything is read, when anything reads them.
    if arg_slots_read(&cfg).next().is_some() {
        cfg.flags |= bs_cfg_flags::BS_CFG_NEED_ARGS.0;
    }
    (cfg, slots)
}

/// The argument slots a configuration's sources read.
fn arg_slots_read(cfg: &bs_probe_cfg) -> impl Iterator<Item = u16> + '_ {
    let arg = bs_src_kind::BS_SRC_ARG.0 as u8;
    cfg.keys
        .iter()
        .chain(&cfg.r#match)
        .chain(&cfg.emit)
        .chain(cfg.filter.iter().map(|o| &o.src))
        .chain([&cfg.value])
        .filter(move |s| s.kind == arg)
        .map(|s| s.off)
}

/// The arguments a raw tracepoint's program copies to their slots: up to
/// the highest slot read, no further (its context holds only the
/// tracepoint's own arguments).
fn raw_args(cfg: &bs_probe_cfg) -> u8 {
    arg_slots_read(cfg)
        .filter(|&off| off < bs_limits::BS_MAX_ARGS.0 as u16)
        .map(|off| off as u8 + 1)
        .max()
        .unwrap_or(0)
}

/// Whether probes were named by a glob (whose refused matches are skipped).
pub fn globbed(plan: &PlanConfig) -> bool {
    plan.probes.iter().any(|sp| match sp {
        ProbeSpec::Tracepoint { subsys, event } => {
            [subsys, event].iter().any(|p| p.contains(['*', '?']))
        }
        ProbeSpec::Usdt { provider, name, .. } => {
            [provider, name].iter().any(|p| p.contains(['*', '?']))
        }
        _ => false,
    })
}

/// Probes in their latency roles, and (name, reason) of pattern matches that cannot be probed.
pub type Roles = (Vec<(crate::probe::Probe, Role)>, Vec<(String, String)>);

/// Resolves the probes, and for latency the starts and ends they pair.
pub fn resolve_roles(plan: &PlanConfig, target: &Target) -> anyhow::Result<Roles> {
    let pid = match target {
        Target::Pid(p) => Some(*p),
        _ => None,
    };
    let resolved = crate::probe::resolve_all(&plan.probes, pid)?;
    let (starts, skipped) = (resolved.probes, resolved.skipped);
    if !matches!(plan.action, Action::Latency { .. }) {
        return Ok((
            starts.into_iter().map(|p| (p, Role::Plain)).collect(),
            skipped,
        ));
    }
    let mut out = Vec::new();
    match plan.latency_end() {
        // START and END events: every start pairs with every end on the match fields.
        Some(end) => {
            let ends = crate::probe::resolve(std::slice::from_ref(end), pid)?;
            out.extend(starts.into_iter().map(|p| (p, Role::Start(0))));
            out.extend(ends.into_iter().map(|p| (p, Role::End(0))));
        }
        // A function: each entry pairs with its own return, per thread.
        None => {
            for (i, p) in starts.into_iter().enumerate() {
                let ret = crate::probe::returning(&p).ok_or_else(|| {
                    crate::usage!("{}: latency needs a function entry probe", p.name)
                })?;
                out.push((p, Role::Start(i as u32)));
                out.push((ret, Role::End(i as u32)));
            }
        }
    }
    Ok((out, skipped))
}

#[cfg(test)]
mod tests {
    use super::fixtures::*;
    use super::*;

    #[test]
    fn latency_settings() {
        let end = tp_spec("sched", "sched_switch");
        let s = config(latency(Some(end.clone()), &["pid=next_pid"]), &[], None);
        assert_eq!(s.latency_end(), Some(&end));
        assert_eq!(s.matching(), ["pid=next_pid"]);
        let s = config(Action::Count, &[], None);
        assert_eq!(s.latency_end(), None);
        assert!(s.matching().is_empty());
    }

    #[test]
    fn paths_describe_themselves() {
        let sys = Path::Syscall(SyscallTp { nr: 0, exit: true });
        assert_eq!(
            sys.describe(),
            "raw_tp sys_exit (shared, by syscall number)"
        );
        assert!(sys.uses_args());
        let tp = Path::Tracepoint {
            subsys: "a".into(),
            event: "b".into(),
        };
        assert!(!tp.uses_args());
        let mut k = KfuncPath {
            func: "f".into(),
            offset: 0,
            ret: true,
            mech: Mech::KprobeMulti,
            fallback: None,
            btf_id: None,
            unavailable: None,
        };
        assert_eq!(
            Path::Kfunc(k.clone()).describe(),
            "kretprobe (kprobe_multi) with cookies"
        );
        k.unavailable = Some("no".into());
        assert_eq!(Path::Kfunc(k).describe(), "skipped");
        assert_eq!(Mech::Fentry.describe(false), "fentry with cookie");
    }

    #[test]
    fn stacks_in_keys() {
        let s = config(Action::Count, &["ustack", "comm"], None);
        let plan = build(&s, plain(vec![sched_switch()]), &features()).unwrap();
        assert_eq!(plan.stacks(), (false, true));
        let s = config(Action::Count, &["kstack"], None);
        let plan = build(&s, plain(vec![sched_switch()]), &features()).unwrap();
        assert_eq!(plan.stacks(), (true, false));
    }

    fn arg(slot: u16) -> bs_src {
        bs_src {
            kind: bs_src_kind::BS_SRC_ARG.0 as u8,
            off: slot,
            ..Default::default()
        }
    }

    fn parts() -> Parts {
        Parts {
            keys: Vec::new(),
            aggregation: values::aggregation(&Action::Count),
            value: None,
            pairing: None,
            filter: Vec::new(),
            event: None,
        }
    }

    #[test]
    fn arguments_are_fetched_when_anything_reads_one() {
        let need = |p: Parts| assemble(p).0.flags & bs_cfg_flags::BS_CFG_NEED_ARGS.0 != 0;
        assert!(!need(parts()));
        let mut p = parts();
        p.keys = vec![arg(1)];
        assert!(need(p));
        let mut p = parts();
        p.value = Some(arg(12));
        assert!(need(p));
        let mut p = parts();
        p.filter = vec![bs_filter_op {
            src: arg(0),
            ..Default::default()
        }];
        assert!(need(p));
        let mut p = parts();
        p.pairing = Some(pairing::Pairing {
            pair: 2,
            flags: bs_cfg_flags::BS_CFG_LAT_END.0,
            matches: vec![arg(13)],
        });
        let (cfg, slots) = assemble(p);
        assert_eq!(
            cfg.flags,
            bs_cfg_flags::BS_CFG_LAT_END.0 | bs_cfg_flags::BS_CFG_NEED_ARGS.0
        );
        assert_eq!((cfg.pair, cfg.nmatch), (2, 1));
        assert!(slots.is_empty());
    }

    #[test]
    fn an_empty_plan() {
        let s = config(Action::Count, &[], None);
        let plan = build(&s, Vec::new(), &features()).unwrap();
        assert!(plan.probes.is_empty());
        assert_eq!((plan.key_size, plan.max_keys), (0, 0));
        assert_eq!(plan.value, None);
    }
}
