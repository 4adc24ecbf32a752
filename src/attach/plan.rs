//! From settings and resolved probes to one `bs_probe_cfg` per probe: which
//! kernel path each probe takes, where each named value is read from, how
//! keys and events are laid out.

use std::path::PathBuf;

use crate::attach::features::Features;
use crate::error::Error;
use crate::filter::{self, Expr, Operand, StrTable};
use crate::probe::btf::{self, Shape};
use crate::probe::spec::ProbeSpec;
use crate::probe::{FieldKind, KfuncKind, Probe, ProbeKind, SyscallTp};
use crate::usage;
use bpfscope_bpf::abi::{
    bs_agg, bs_cfg_flags, bs_limits, bs_probe_cfg, bs_src, bs_src_kind, bs_val_type,
};

const STR_MAX: usize = bs_limits::BS_STR_MAX.0 as usize;
const COMM_LEN: usize = bs_limits::BS_COMM_LEN.0 as usize;

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
        }
    }

    /// Whether fields are read from argument slots rather than a record.
    fn uses_args(&self) -> bool {
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
}

impl Plan {
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

/// A name as the user wrote it: a builtin, or a field (possibly `args.`-prefixed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Builtin {
    Probe,
    Comm,
    Pid,
    Tid,
    Cpu,
    Uid,
    Cgroup,
    KStack,
    UStack,
}

fn builtin(name: &str) -> Option<Builtin> {
    Some(match name {
        "probe" => Builtin::Probe,
        "comm" => Builtin::Comm,
        "pid" => Builtin::Pid,
        "tid" => Builtin::Tid,
        "cpu" => Builtin::Cpu,
        "uid" => Builtin::Uid,
        "cgroup" => Builtin::Cgroup,
        "kstack" => Builtin::KStack,
        "ustack" => Builtin::UStack,
        _ => return None,
    })
}

const BUILTINS: &str = "probe, comm, pid, tid, cpu, uid, cgroup, kstack, ustack";

/// The field a name refers to, if it is not a builtin.
fn field_part(name: &str) -> Option<&str> {
    match name.strip_prefix("args.") {
        Some(f) => Some(f),
        None if builtin(name).is_some() => None,
        None => Some(name),
    }
}

/// The name one side of a `--match` entry reads: `START=END` pairs
/// differently named fields, a single name is read on both sides.
fn match_side(m: &str, role: Role) -> &str {
    match m.split_once('=') {
        Some((_, end)) if matches!(role, Role::End(_)) => end,
        Some((start, _)) => start,
        None => m,
    }
}

/// What a `--match` name means on one probe: a field of that probe if it has
/// one of that name (pairing on an event's `pid` is pairing on the event's
/// subject, not on whoever runs when it fires), else the builtin;
/// `args.NAME` is always the field. Decided per probe, hence per side.
fn match_name(probe: &Probe, name: &str) -> String {
    if builtin(name).is_some() && probe.field(name).is_some() {
        format!("args.{name}")
    } else {
        name.to_string()
    }
}

fn builtin_src(b: Builtin) -> (bs_src, ValueKind, usize) {
    let (kind, vk, len) = match b {
        Builtin::Probe => (bs_src_kind::BS_SRC_PROBE, ValueKind::Probe, 8),
        Builtin::Comm => (bs_src_kind::BS_SRC_COMM, ValueKind::Str, COMM_LEN),
        Builtin::Pid => (bs_src_kind::BS_SRC_PID, ValueKind::Int { signed: false }, 8),
        Builtin::Tid => (bs_src_kind::BS_SRC_TID, ValueKind::Int { signed: false }, 8),
        Builtin::Cpu => (bs_src_kind::BS_SRC_CPU, ValueKind::Int { signed: false }, 8),
        Builtin::Uid => (bs_src_kind::BS_SRC_UID, ValueKind::Int { signed: false }, 8),
        Builtin::Cgroup => (bs_src_kind::BS_SRC_CGROUP, ValueKind::Cgroup, 8),
        Builtin::KStack => (
            bs_src_kind::BS_SRC_KSTACK,
            ValueKind::Stack { user: false },
            8,
        ),
        Builtin::UStack => (
            bs_src_kind::BS_SRC_USTACK,
            ValueKind::Stack { user: true },
            8,
        ),
    };
    let ty = if b == Builtin::Comm {
        bs_val_type::BS_T_STR_INLINE
    } else {
        bs_val_type::BS_T_NUM
    };
    (
        bs_src {
            kind: kind.0 as u8,
            r#type: ty.0 as u8,
            size: if b == Builtin::Comm {
                COMM_LEN as u8
            } else {
                8
            },
            ..Default::default()
        },
        vk,
        len,
    )
}

/// A member path from a BTF-typed argument (`skb->dev->name`).
fn walk_src(
    probe: &Probe,
    path: &Path,
    field: &str,
    base: &str,
    steps: &[btf::Step],
) -> Result<(bs_src, ValueKind, usize), Error> {
    let f = probe.field(base).ok_or_else(|| {
        usage!(
            "{} has no field '{base}' (in '{field}'); its fields: {}",
            probe.name,
            probe.field_names()
        )
    })?;
    let (Some(ty), Some(slot), true) = (f.btf, f.arg_slot, path.uses_args()) else {
        return Err(usage!(
            "{}: '{base}' has no BTF type, so '{field}' cannot be followed",
            probe.name
        ));
    };
    let k = btf::vmlinux().ok_or_else(|| usage!("{field}: the kernel has no BTF"))?;
    let w = k
        .walk(base, ty, steps)
        .map_err(|e| usage!("{}: {e}", probe.name))?;
    let (vt, size, signed, vk, len) = match w.shape {
        Shape::Int { size, signed } => (
            bs_val_type::BS_T_NUM,
            size,
            signed,
            ValueKind::Int { signed },
            8,
        ),
        Shape::Pointer => (bs_val_type::BS_T_NUM, 8, false, ValueKind::Hex, 8),
        Shape::KernelStr => (
            bs_val_type::BS_T_STR_KPTR,
            8,
            false,
            ValueKind::Str,
            STR_MAX,
        ),
        Shape::UserStr => (
            bs_val_type::BS_T_STR_UPTR,
            8,
            false,
            ValueKind::Str,
            STR_MAX,
        ),
        Shape::CharArray(n) => {
            let n = (n as usize).min(STR_MAX - 1);
            (
                bs_val_type::BS_T_STR_INLINE,
                n as u8,
                false,
                ValueKind::Str,
                n,
            )
        }
        Shape::Composite | Shape::Unsupported => {
            return Err(usage!("{}: '{field}' cannot be read", probe.name))
        }
    };
    let mut src = bs_src {
        kind: bs_src_kind::BS_SRC_ARG.0 as u8,
        r#type: vt.0 as u8,
        size,
        is_signed: signed as u8,
        off: slot as u16,
        walk: 1,
        nderef: w.path.len() as u8,
        leaf_off: w.leaf_off,
        ..Default::default()
    };
    src.path[..w.path.len()].copy_from_slice(&w.path);
    Ok((src, vk, len))
}

/// Where a field is read from, on a given path.
fn field_src(probe: &Probe, path: &Path, field: &str) -> Result<(bs_src, ValueKind, usize), Error> {
    if let Some((base, steps)) = btf::split_path(field) {
        return walk_src(probe, path, field, base, &steps);
    }
    let f = probe.field(field).ok_or_else(|| {
        usage!(
            "{} has no field '{field}'; its fields: {} (builtins: {BUILTINS})",
            probe.name,
            probe.field_names()
        )
    })?;
    let (kind, off) = match path {
        p if p.uses_args() => match f.arg_slot {
            Some(slot) => (bs_src_kind::BS_SRC_ARG, slot as u16),
            None => return Err(usage!("{}: field '{field}' is not available", probe.name)),
        },
        Path::Tracepoint { .. } => (bs_src_kind::BS_SRC_CTX, f.offset),
        _ => return Err(usage!("{}: field '{field}' is not available", probe.name)),
    };
    let (ty, size, vk, len) = match f.kind {
        FieldKind::Int => (
            bs_val_type::BS_T_NUM,
            f.size,
            ValueKind::Int { signed: f.signed },
            8,
        ),
        FieldKind::Pointer => (bs_val_type::BS_T_NUM, f.size, ValueKind::Hex, 8),
        FieldKind::InlineStr(n) => {
            let n = (n as usize).min(STR_MAX - 1);
            (bs_val_type::BS_T_STR_INLINE, n as u8, ValueKind::Str, n)
        }
        FieldKind::DataLocStr => (bs_val_type::BS_T_STR_DATALOC, 0, ValueKind::Str, STR_MAX),
        FieldKind::UserStr => (bs_val_type::BS_T_STR_UPTR, 8, ValueKind::Str, STR_MAX),
        FieldKind::KernelStr => (bs_val_type::BS_T_STR_KPTR, 8, ValueKind::Str, STR_MAX),
        FieldKind::Unsupported => {
            return Err(usage!(
                "{}: field '{field}' has type '{}', which bpfscope cannot read",
                probe.name,
                f.ctype
            ))
        }
    };
    Ok((
        bs_src {
            kind: kind.0 as u8,
            r#type: ty.0 as u8,
            size,
            is_signed: f.signed as u8,
            off,
            ..Default::default()
        },
        vk,
        len,
    ))
}

/// For an event field that is a syscall's input buffer with a length (a
/// `const char *`/`const void *` followed by a `size_t`: write's buf and
/// count, pwrite64, mq_timedsend, setxattr; and sendto's `void *` buff and
/// len), where the length is read from (argument slot or record offset).
/// Such a buffer is shown as that many bytes, not as a C string.
fn buffer_len(probe: &Probe, path: &Path, name: &str) -> Option<u16> {
    let ProbeKind::Tracepoint {
        subsys, event: ev, ..
    } = &probe.kind
    else {
        return None;
    };
    let field = name.strip_prefix("args.").unwrap_or(name);
    let i = probe.fields.iter().position(|f| f.name == field)?;
    let (f, next) = (&probe.fields[i], probe.fields.get(i + 1)?);
    let input = matches!(f.ctype.as_str(), "const char *" | "const void *")
        || (ev == "sys_enter_sendto" && f.name == "buff");
    if subsys != "syscalls" || !ev.starts_with("sys_enter_") || !input || next.ctype != "size_t" {
        return None;
    }
    match path {
        p if p.uses_args() => next.arg_slot.map(u16::from),
        Path::Tracepoint { .. } => Some(next.offset),
        _ => None,
    }
}

fn name_src(probe: &Probe, path: &Path, name: &str) -> Result<(bs_src, ValueKind, usize), Error> {
    match field_part(name) {
        Some(f) => field_src(probe, path, f),
        None => builtin(name)
            .map(builtin_src)
            .ok_or_else(|| usage!("unknown name '{name}'")),
    }
}

fn filter_names(e: &Expr, out: &mut Vec<String>) {
    match e {
        Expr::Cmp { name, .. } | Expr::Truthy { name, .. } => out.push(name.clone()),
        Expr::Not(a) => filter_names(a, out),
        Expr::And(a, b) | Expr::Or(a, b) => {
            filter_names(a, out);
            filter_names(b, out);
        }
    }
}

/// Above this many kernel functions, `kprobe:` prefers kprobes (one
/// kprobe_multi link, or a perf link each) to fentry, whose programs are
/// loaded and verified once per function.
const FENTRY_MAX: usize = 8;

/// Return probes share one kprobe_multi link from this many functions on
/// (see `kfunc_path`).
const RET_MULTI_MIN: usize = 5;

/// How many kprobe:/kretprobe: functions a plan has, and of them returns.
#[derive(Debug, Clone, Copy, Default)]
struct KfuncCount {
    all: usize,
    rets: usize,
}

/// How a kernel function probe is attached: fentry/fexit when the kernel
/// allows it and BTF describes the function (cheaper per event), kprobes
/// otherwise, each the fallback of the other; kprobe_multi for many
/// functions. `n` counts the plan's kprobe:/kretprobe: functions.
fn kfunc_path(probe: &Probe, features: &Features, n: KfuncCount) -> Result<Path, Error> {
    let nkfuncs = n.all;
    let ProbeKind::Kfunc {
        func,
        offset,
        kind,
        sig,
        kprobe_ok,
        ..
    } = &probe.kind
    else {
        return Err(usage!("{}: not a kernel function", probe.name));
    };
    let name = &probe.name;
    let ret = kind.is_ret();
    let btf_id = sig.as_ref().map(|s| s.func_id);
    let fentry = features.fentry().map(|_| ());
    let kprobe = features.kprobe();
    let mut path = KfuncPath {
        func: func.clone(),
        offset: *offset,
        ret,
        mech: Mech::Fentry,
        fallback: None,
        btf_id,
        unavailable: None,
    };
    if kind.is_fentry() {
        if let Err(why) = fentry {
            let alt = match kprobe {
                Ok(()) => format!(
                    "use {}:{func} instead",
                    if ret { "kretprobe" } else { "kprobe" }
                ),
                Err(_) => {
                    "kprobes are refused too: trace tracepoints instead ('bpfscope list')".into()
                }
            };
            return Err(Error::Environment(format!(
                "{name}: this kernel refuses fentry/fexit programs ({why}); {alt}"
            )));
        }
        if btf_id.is_none() {
            path.unavailable =
                Some("fentry needs the function's prototype in vmlinux BTF, which lacks it".into());
        }
        return Ok(Path::Kfunc(path));
    }
    if let (Err(k), Err(f)) = (kprobe, fentry) {
        return Err(Error::Environment(format!(
            "{name}: this kernel refuses both kprobes ({k}) and fentry ({f}); trace tracepoints instead ('bpfscope list')"
        )));
    }
    let can_fentry = fentry.is_ok() && btf_id.is_some() && *offset == 0;
    let can_kprobe = kprobe.is_ok() && *kprobe_ok;
    // Before 6.14 the kernel gives a kprobe_multi return link 2 x CPUs x
    // functions return instances in all, while a lone kretprobe gets at
    // least 10: a return link of a few functions (vfs_read with a few
    // threads blocked in it) would run out and miss returns. Such few
    // returns take one kretprobe each instead.
    let multi_ok = if ret {
        n.rets >= RET_MULTI_MIN
    } else {
        nkfuncs > 1
    };
    let kprobe_mech = if *offset == 0 && multi_ok && features.kprobe_multi() {
        Mech::KprobeMulti
    } else {
        Mech::Kprobe
    };
    (path.mech, path.fallback) = match (can_fentry, can_kprobe) {
        (true, true) if nkfuncs > FENTRY_MAX => (kprobe_mech, Some(Mech::Fentry)),
        (true, true) => (Mech::Fentry, Some(kprobe_mech)),
        (true, false) => (Mech::Fentry, None),
        (false, true) => (kprobe_mech, None),
        (false, false) => {
            path.unavailable = Some(if !kprobe_ok {
                "in the kprobe blacklist, and fentry cannot be used".into()
            } else if *offset > 0 {
                "kprobes are refused, and fentry has no offsets".into()
            } else {
                "kprobes are refused, and fentry needs a vmlinux BTF prototype, which it lacks"
                    .into()
            });
            (Mech::Kprobe, None)
        }
    };
    Ok(Path::Kfunc(path))
}

/// Chooses the cheapest path that gives the same answer for this probe.
fn choose_path(
    probe: &Probe,
    fields: &[&str],
    features: &Features,
    nkfuncs: KfuncCount,
) -> Result<Path, Error> {
    let (subsys, event, syscall) = match &probe.kind {
        ProbeKind::Tracepoint {
            subsys,
            event,
            syscall,
        } => (subsys, event, syscall),
        ProbeKind::Uprobe {
            binary,
            offset,
            ret,
            ..
        } => {
            return Ok(Path::Uprobe {
                binary: binary.clone(),
                offset: *offset,
                ret: *ret,
            })
        }
        ProbeKind::Usdt {
            binary,
            provider,
            name,
            ..
        } => {
            return Ok(Path::Usdt {
                binary: binary.clone(),
                provider: provider.clone(),
                name: name.clone(),
            })
        }
        ProbeKind::Kfunc { .. } => return kfunc_path(probe, features, nkfuncs),
    };
    let classic = Path::Tracepoint {
        subsys: subsys.clone(),
        event: event.clone(),
    };
    if let Some(sc) = syscall {
        // Every syscall field maps to an argument slot when it is a plain argument.
        let all_args = fields
            .iter()
            .all(|f| probe.field(f).is_some_and(|f| f.arg_slot.is_some()));
        return Ok(if all_args {
            Path::Syscall(*sc)
        } else {
            classic
        });
    }
    // raw_tp sees the tracepoint's arguments, not the record, so it only
    // serves probes that need no record field.
    if fields.is_empty() && features.raw_tp_cookie && features.has_raw_tp(event) {
        return Ok(Path::RawTp {
            name: event.clone(),
        });
    }
    Ok(classic)
}

/// Which probes of a latency pair evaluate a key part or the filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    All,
    Start,
    End,
}

impl Side {
    fn includes(self, role: Role) -> bool {
        matches!(
            (self, role),
            (Side::All, _)
                | (_, Role::Plain)
                | (Side::Start, Role::Start(_))
                | (Side::End, Role::End(_))
        )
    }
}

fn resolvable(probe: &Probe, name: &str) -> bool {
    match field_part(name) {
        Some(f) => probe
            .field(btf::split_path(f).map_or(f, |(base, _)| base))
            .is_some(),
        None => builtin(name).is_some(),
    }
}

/// Latency: a name is read where the operation starts if every start probe
/// has it (the context that began it), otherwise at every end probe.
fn side_for(names: &[String], probes: &[(Probe, Role)], what: &str) -> Result<Side, Error> {
    let all = |want: fn(&Role) -> bool| {
        probes
            .iter()
            .filter(|(_, r)| want(r))
            .all(|(p, _)| names.iter().all(|n| resolvable(p, n)))
    };
    if !probes.iter().any(|(_, r)| *r != Role::Plain) {
        return Ok(Side::All);
    }
    if all(|r| matches!(r, Role::Start(_))) {
        Ok(Side::Start)
    } else if all(|r| matches!(r, Role::End(_))) {
        Ok(Side::End)
    } else {
        Err(usage!(
            "{what}: {} must all be fields of the start probes or all of the end probes",
            names.join(", ")
        ))
    }
}

/// Builds the plan for probes in their roles.
pub fn build(
    s: &PlanConfig,
    probes: Vec<(Probe, Role)>,
    features: &Features,
) -> Result<Plan, Error> {
    let latency = probes.iter().any(|(_, r)| *r != Role::Plain);
    let value_name = match &s.action {
        Action::Stats { value } | Action::Hist { value, .. } => Some(value.clone()),
        _ => None,
    };
    let trace_fields: Option<&Vec<String>> = match &s.action {
        Action::Trace { fields } => Some(fields),
        _ => None,
    };
    let mut filter_list = Vec::new();
    if let Some(f) = &s.filter {
        filter_names(f, &mut filter_list);
    }
    let filter_side = side_for(&filter_list, &probes, "--filter")?;
    let key_sides: Vec<Side> = s
        .keys
        .iter()
        .map(|k| side_for(std::slice::from_ref(k), &probes, "--by"))
        .collect::<Result<_, _>>()?;
    // By default a start pairs with an end of the same thread (the builtin,
    // even where an event has a field called tid).
    let matching: Vec<String> = if !latency {
        Vec::new()
    } else if s.matching().is_empty() {
        vec!["tid".to_string()]
    } else {
        s.matching().to_vec()
    };
    let match_names = |probe: &Probe, role: Role| -> Vec<String> {
        if s.matching().is_empty() {
            return matching.clone();
        }
        matching
            .iter()
            .map(|m| match_name(probe, match_side(m, role)))
            .collect()
    };
    if matching.len() > bs_limits::BS_MAX_MATCH.0 as usize {
        return Err(usage!(
            "--match: at most {} fields",
            bs_limits::BS_MAX_MATCH.0
        ));
    }

    let mut nkfuncs = KfuncCount::default();
    for (p, _) in &probes {
        if let ProbeKind::Kfunc {
            kind: kind @ (KfuncKind::Kprobe | KfuncKind::Kretprobe),
            ..
        } = p.kind
        {
            nkfuncs.all += 1;
            nkfuncs.rets += usize::from(kind.is_ret());
        }
    }
    // What each probe reads, hence its path.
    let paths: Vec<Path> = probes
        .iter()
        .map(|(probe, role)| {
            let mut names: Vec<&String> = s
                .keys
                .iter()
                .zip(&key_sides)
                .filter(|(_, side)| side.includes(*role))
                .map(|(k, _)| k)
                .collect();
            if filter_side.includes(*role) {
                names.extend(filter_list.iter());
            }
            let matched = match_names(probe, *role);
            names.extend(matched.iter());
            if !latency {
                names.extend(value_name.iter());
            }
            let mut fields: Vec<&str> = names.iter().filter_map(|n| field_part(n)).collect();
            if let Some(list) = trace_fields {
                if list.is_empty() {
                    fields.extend(
                        probe
                            .fields
                            .iter()
                            .filter(|f| f.kind != FieldKind::Unsupported)
                            .map(|f| f.name.as_str()),
                    );
                } else {
                    fields.extend(list.iter().filter_map(|n| field_part(n)));
                }
            }
            choose_path(probe, &fields, features, nkfuncs)
        })
        .collect::<Result<_, _>>()?;

    // Key layout: each part's shape from the first probe that reads it.
    let mut layout: Vec<Slot> = Vec::new();
    let mut off = 0usize;
    for (name, side) in s.keys.iter().zip(&key_sides) {
        let (i, (probe, _)) = probes
            .iter()
            .enumerate()
            .find(|(_, (_, r))| side.includes(*r))
            .ok_or_else(|| usage!("--by {name}: no probe provides it"))?;
        let (_, kind, len) = name_src(probe, &paths[i], name)?;
        layout.push(Slot {
            name: name.clone(),
            kind,
            off,
            len,
        });
        off += len;
    }
    if off > bs_limits::BS_KEY_MAX.0 as usize {
        return Err(usage!(
            "--by: keys take {off} bytes, more than the {} bpfscope keeps; use fewer string keys",
            bs_limits::BS_KEY_MAX.0
        ));
    }

    let mut strs = StrTable::default();
    let mut planned = Vec::with_capacity(probes.len());
    let mut value_signed = false;
    for ((probe, role), path) in probes.into_iter().zip(paths) {
        let mut cfg = bs_probe_cfg::default();
        let mut need_args = false;
        let mut note = |src: &bs_src| {
            if src.kind == bs_src_kind::BS_SRC_ARG.0 as u8 {
                need_args = true;
            }
        };

        // Keys this probe writes, at their shared offsets.
        let mut n = 0;
        for (slot, side) in layout.iter().zip(&key_sides) {
            if !side.includes(role) {
                continue;
            }
            let (mut src, kind, len) = name_src(&probe, &path, &slot.name)?;
            if kind != slot.kind || len != slot.len {
                return Err(usage!(
                    "--by {}: the key has a different type in {} than in the other probes; trace them separately",
                    slot.name,
                    probe.name
                ));
            }
            src.out_off = slot.off as u16;
            note(&src);
            cfg.keys[n] = src;
            n += 1;
        }
        cfg.nkeys = n as u8;

        // Aggregation.
        cfg.agg = match &s.action {
            Action::Count => bs_agg::BS_AGG_COUNT,
            Action::Stats { .. } => bs_agg::BS_AGG_STATS,
            Action::Hist {
                buckets: Buckets::Log2,
                ..
            }
            | Action::Latency {
                buckets: Buckets::Log2,
                ..
            } => bs_agg::BS_AGG_HIST_LOG2,
            Action::Hist {
                buckets: Buckets::Linear { .. },
                ..
            }
            | Action::Latency {
                buckets: Buckets::Linear { .. },
                ..
            } => bs_agg::BS_AGG_HIST_LINEAR,
            Action::Trace { .. } => bs_agg::BS_AGG_EVENT,
        }
        .0 as u8;
        if let Action::Hist {
            buckets:
                Buckets::Linear {
                    min,
                    step,
                    nbuckets,
                },
            ..
        }
        | Action::Latency {
            buckets:
                Buckets::Linear {
                    min,
                    step,
                    nbuckets,
                },
            ..
        } = s.action
        {
            cfg.lin_min = min;
            cfg.lin_step = step;
            cfg.lin_nbuckets = nbuckets;
        }
        if let Some(v) = &value_name {
            let (src, kind, _) = name_src(&probe, &path, v)?;
            if !matches!(kind, ValueKind::Int { .. } | ValueKind::Hex) {
                return Err(usage!(
                    "--value {v}: {} gives a string there; the value must be numeric",
                    probe.name
                ));
            }
            note(&src);
            value_signed = src.is_signed != 0;
            cfg.value = src;
        }

        // Latency pairing.
        match role {
            Role::Plain => {}
            Role::Start(pair) | Role::End(pair) => {
                cfg.pair = pair;
                cfg.flags |= if matches!(role, Role::Start(_)) {
                    bs_cfg_flags::BS_CFG_LAT_START.0
                } else {
                    bs_cfg_flags::BS_CFG_LAT_END.0
                };
                // A function's return runs in the task of its entry: only
                // the traced tasks' returns need looking at.
                if matches!(role, Role::End(_)) && s.latency_end().is_none() {
                    cfg.flags |= bs_cfg_flags::BS_CFG_SAME_TASK.0;
                }
                for (i, m) in match_names(&probe, role).iter().enumerate() {
                    let (src, kind, _) =
                        name_src(&probe, &path, m).map_err(|e| usage!("--match: {e}"))?;
                    if !matches!(kind, ValueKind::Int { .. } | ValueKind::Hex) {
                        return Err(usage!("--match {m}: only numeric fields can pair events"));
                    }
                    note(&src);
                    cfg.r#match[i] = src;
                }
                cfg.nmatch = matching.len() as u8;
            }
        }

        // Filter.
        if let (Some(expr), true) = (&s.filter, filter_side.includes(role)) {
            let mut resolve = |name: &str, column: usize| -> Result<Operand, Error> {
                let (src, kind, _) = name_src(&probe, &path, name)
                    .map_err(|e| usage!("filter: {e} (column {column})"))?;
                Ok(Operand {
                    src,
                    is_str: kind == ValueKind::Str,
                })
            };
            let ops = filter::compile(expr, &mut resolve, &mut strs)?;
            for (i, op) in ops.iter().enumerate() {
                note(&op.src);
                cfg.filter[i] = *op;
            }
            cfg.nfilter = ops.len() as u8;
        }

        // Event fields.
        let mut event = Vec::new();
        if let Some(named) = trace_fields {
            let list: Vec<String> = if named.is_empty() {
                probe
                    .fields
                    .iter()
                    .filter(|f| f.kind != FieldKind::Unsupported)
                    .map(|f| f.name.clone())
                    .collect()
            } else {
                named.clone()
            };
            let max = bs_limits::BS_MAX_EMIT.0 as usize;
            if list.len() > max {
                return Err(usage!(
                    "{}: {} fields to print, at most {max}; name fewer with --fields",
                    probe.name,
                    list.len()
                ));
            }
            let mut off = 0usize;
            for (i, name) in list.iter().enumerate() {
                // Plain names in the all-fields list are fields even if they look like builtins.
                let lookup = if named.is_empty() {
                    format!("args.{name}")
                } else {
                    name.clone()
                };
                let (mut src, mut kind, mut len) = name_src(&probe, &path, &lookup)?;
                if let Some(len_off) = buffer_len(&probe, &path, &lookup) {
                    src.r#type = bs_val_type::BS_T_BUF_UPTR.0 as u8;
                    src.path[0] = len_off;
                    kind = ValueKind::Buf;
                    len = 8 + bs_limits::BS_BUF_MAX.0 as usize;
                }
                src.out_off = off as u16;
                note(&src);
                cfg.emit[i] = src;
                // A field named like a builtin is shown as args.NAME, so an
                // event never shows two different `pid=` (the header has the builtin).
                let shown = match field_part(&lookup) {
                    Some(f) if builtin(f).is_some() => format!("args.{f}"),
                    Some(f) => f.to_string(),
                    None => name.clone(),
                };
                event.push(Slot {
                    name: shown,
                    kind,
                    off,
                    len,
                });
                off += len;
            }
            if off >= bs_limits::BS_EVENT_DATA_MAX.0 as usize {
                return Err(usage!(
                    "{}: the fields take {off} bytes per event, more than {}; name fewer with --fields",
                    probe.name,
                    bs_limits::BS_EVENT_DATA_MAX.0 - 1
                ));
            }
            cfg.nemit = list.len() as u8;
            cfg.event_size = off as u16;
        }
        if need_args {
            cfg.flags |= bs_cfg_flags::BS_CFG_NEED_ARGS.0;
        }
        planned.push(PlannedProbe {
            probe,
            path,
            role,
            cfg,
            event,
        });
    }
    let max_filter = planned
        .iter()
        .map(|p| p.cfg.nfilter as usize)
        .max()
        .unwrap_or(0);
    let max_keys = planned
        .iter()
        .map(|p| p.cfg.nkeys as usize)
        .max()
        .unwrap_or(0);
    let max_emit = planned
        .iter()
        .map(|p| p.cfg.nemit as usize)
        .max()
        .unwrap_or(0);
    Ok(Plan {
        probes: planned,
        key_size: off,
        keys: layout,
        strs,
        value: value_name.map(|v| (v, value_signed)),
        latency,
        max_filter,
        max_keys,
        max_emit,
    })
}
