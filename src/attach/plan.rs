//! From settings and resolved probes to one `bs_probe_cfg` per probe: which
//! kernel path each probe takes, where each named value is read from, how
//! keys and events are laid out.

use crate::attach::features::Features;
use crate::bpf::abi::{
    bs_agg, bs_cfg_flags, bs_limits, bs_probe_cfg, bs_src, bs_src_kind, bs_val_type,
};
use crate::cli::{Action, Buckets, TraceSettings};
use crate::error::Error;
use crate::filter::{self, Expr, Operand, StrTable};
use crate::probe::{FieldKind, Probe, ProbeKind, SyscallTp};
use crate::usage;

const STR_MAX: usize = bs_limits::BS_STR_MAX.0 as usize;
const COMM_LEN: usize = bs_limits::BS_COMM_LEN.0 as usize;

/// The kernel mechanism a probe is attached through, cheapest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Path {
    /// Shared raw_tp on sys_enter/sys_exit, dispatched by syscall number.
    Syscall(SyscallTp),
    /// raw_tp on the tracepoint itself with a cookie (no record fields needed).
    RawTp { name: String },
    /// Classic tracepoint through a perf link with a cookie.
    Tracepoint { subsys: String, event: String },
}

impl Path {
    pub fn describe(&self) -> &'static str {
        match self {
            Path::Syscall(s) if s.exit => "raw_tp sys_exit (shared, by syscall number)",
            Path::Syscall(_) => "raw_tp sys_enter (shared, by syscall number)",
            Path::RawTp { .. } => "raw_tp with cookie",
            Path::Tracepoint { .. } => "tracepoint (perf link) with cookie",
        }
    }
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
    /// Largest filter, key and event part counts, to specialize the programs at load.
    pub max_filter: usize,
    pub max_keys: usize,
    pub max_emit: usize,
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
        _ => return None,
    })
}

const BUILTINS: &str = "probe, comm, pid, tid, cpu, uid, cgroup";

/// The field a name refers to, if it is not a builtin.
fn field_part(name: &str) -> Option<&str> {
    match name.strip_prefix("args.") {
        Some(f) => Some(f),
        None if builtin(name).is_some() => None,
        None => Some(name),
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

/// Where a field is read from, on a given path.
fn field_src(probe: &Probe, path: &Path, field: &str) -> Result<(bs_src, ValueKind, usize), Error> {
    let f = probe.field(field).ok_or_else(|| {
        usage!(
            "{} has no field '{field}'; its fields: {} (builtins: {BUILTINS})",
            probe.name,
            probe.field_names()
        )
    })?;
    let (kind, off) = match path {
        Path::Syscall(_) => match f.arg_slot {
            Some(slot) => (bs_src_kind::BS_SRC_ARG, slot as u16),
            None => return Err(usage!("{}: field '{field}' is not available", probe.name)),
        },
        Path::RawTp { .. } => {
            return Err(usage!("{}: field '{field}' is not available", probe.name))
        }
        Path::Tracepoint { .. } => (bs_src_kind::BS_SRC_CTX, f.offset),
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
            out_off: 0,
        },
        vk,
        len,
    ))
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

/// Chooses the cheapest path that gives the same answer for this probe.
fn choose_path(probe: &Probe, fields: &[&str], features: &Features) -> Path {
    let ProbeKind::Tracepoint {
        subsys,
        event,
        syscall,
    } = &probe.kind;
    let classic = Path::Tracepoint {
        subsys: subsys.clone(),
        event: event.clone(),
    };
    if let Some(sc) = syscall {
        // Every syscall field maps to an argument slot when it is a plain argument.
        let all_args = fields
            .iter()
            .all(|f| probe.field(f).is_some_and(|f| f.arg_slot.is_some()));
        return if all_args {
            Path::Syscall(*sc)
        } else {
            classic
        };
    }
    // raw_tp sees the tracepoint's arguments, not the record, so it only
    // serves probes that need no record field.
    if fields.is_empty() && features.raw_tp_cookie && features.has_raw_tp(event) {
        return Path::RawTp {
            name: event.clone(),
        };
    }
    classic
}

/// Builds the plan.
pub fn build(s: &TraceSettings, probes: Vec<Probe>, features: &Features) -> Result<Plan, Error> {
    let mut names: Vec<String> = s.keys.clone();
    let value_name = match &s.action {
        Action::Stats { value } | Action::Hist { value, .. } => Some(value.clone()),
        _ => None,
    };
    names.extend(value_name.clone());
    if let Some(f) = &s.filter {
        filter_names(f, &mut names);
    }
    let trace_fields: Option<&Vec<String>> = match &s.action {
        Action::Trace { fields } => Some(fields),
        _ => None,
    };
    if let Some(fields) = trace_fields {
        names.extend(fields.iter().cloned());
    }

    let mut strs = StrTable::default();
    let mut planned = Vec::with_capacity(probes.len());
    let mut key_layout: Option<Vec<Slot>> = None;
    let mut value_signed = false;
    for probe in probes {
        // Fields this probe must read: named ones, or all readable ones for a plain trace.
        let mut fields: Vec<&str> = names.iter().filter_map(|n| field_part(n)).collect();
        let all_fields: Vec<String> = match trace_fields {
            Some(f) if f.is_empty() => probe
                .fields
                .iter()
                .filter(|f| f.kind != FieldKind::Unsupported)
                .map(|f| f.name.clone())
                .collect(),
            _ => Vec::new(),
        };
        fields.extend(all_fields.iter().map(String::as_str));
        let path = choose_path(&probe, &fields, features);
        let mut cfg = bs_probe_cfg::default();
        let mut need_args = false;
        let mut note = |src: &bs_src| {
            if src.kind == bs_src_kind::BS_SRC_ARG.0 as u8 {
                need_args = true;
            }
        };

        // Keys: the same layout for every probe.
        let mut layout = Vec::new();
        let mut off = 0usize;
        for (i, name) in s.keys.iter().enumerate() {
            let (mut src, kind, len) = name_src(&probe, &path, name)?;
            src.out_off = off as u16;
            note(&src);
            cfg.keys[i] = src;
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
        cfg.nkeys = s.keys.len() as u8;
        match &key_layout {
            None => key_layout = Some(layout),
            Some(prev) if *prev == layout => {}
            Some(prev) => {
                let differ = prev
                    .iter()
                    .zip(&layout)
                    .find(|(a, b)| a != b)
                    .map_or("?", |(a, _)| a.name.as_str());
                return Err(usage!(
                    "--by {differ}: the key has a different type in {} than in the other probes; trace them separately",
                    probe.name
                ));
            }
        }

        // Value and aggregation.
        cfg.agg = match &s.action {
            Action::Count => bs_agg::BS_AGG_COUNT,
            Action::Stats { .. } => bs_agg::BS_AGG_STATS,
            Action::Hist {
                buckets: Buckets::Log2,
                ..
            } => bs_agg::BS_AGG_HIST_LOG2,
            Action::Hist {
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

        // Filter.
        if let Some(expr) = &s.filter {
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
                all_fields.clone()
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
                let (mut src, kind, len) = name_src(&probe, &path, &lookup)?;
                src.out_off = off as u16;
                note(&src);
                cfg.emit[i] = src;
                event.push(Slot {
                    name: field_part(name).unwrap_or(name).to_string(),
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
            cfg,
            event,
        });
    }
    let keys = key_layout.unwrap_or_default();
    let key_size = keys.last().map_or(0, |k| k.off + k.len);
    let max_filter = planned
        .iter()
        .map(|p| p.cfg.nfilter as usize)
        .max()
        .unwrap_or(0);
    let max_keys = s.keys.len();
    let max_emit = planned
        .iter()
        .map(|p| p.cfg.nemit as usize)
        .max()
        .unwrap_or(0);
    Ok(Plan {
        probes: planned,
        keys,
        key_size,
        strs,
        value: value_name.map(|v| (v, value_signed)),
        max_filter,
        max_keys,
        max_emit,
    })
}
