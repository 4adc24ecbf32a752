//! Probe stage: what the user named, resolved against this kernel into
//! concrete probes with the fields each one offers.

pub mod glob;
pub mod spec;
pub mod syscalls;
pub mod tracefs;

use std::collections::BTreeSet;
use std::path::Path;

use crate::error::Error;
use crate::usage;
pub use spec::ProbeSpec;

/// How a field's bytes are interpreted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldKind {
    /// Integer; `size` and `signed` give its C type.
    Int,
    /// Pointer, shown in hex and usable as a number.
    Pointer,
    /// char array of this length in the record.
    InlineStr(u16),
    /// `__data_loc char[]`: string stored after the fixed part of the record.
    DataLocStr,
    /// Pointer to a user-space string (syscall `const char *` arguments).
    UserStr,
    /// Arrays and other types bpfscope cannot use as keys, values or filters.
    Unsupported,
}

impl FieldKind {
    pub fn is_str(self) -> bool {
        matches!(
            self,
            FieldKind::InlineStr(_) | FieldKind::DataLocStr | FieldKind::UserStr
        )
    }
    pub fn is_num(self) -> bool {
        matches!(self, FieldKind::Int | FieldKind::Pointer)
    }
}

/// A field the user can name in keys, values, filters and trace output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    pub name: String,
    /// The C type, as the format file spells it.
    pub ctype: String,
    pub kind: FieldKind,
    /// Offset in a classic tracepoint record.
    pub offset: u16,
    /// Width of the value in bytes and its signedness, per the C type.
    pub size: u8,
    pub signed: bool,
    /// Argument slot (see BS_ARG_*) when the probe runs on the raw syscall path.
    pub arg_slot: Option<u8>,
}

/// A syscall tracepoint that the raw_tp sys_enter/sys_exit path can serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyscallTp {
    pub nr: u32,
    pub exit: bool,
}

/// What a probe attaches to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeKind {
    Tracepoint {
        subsys: String,
        event: String,
        /// Set for syscalls:sys_enter_*/sys_exit_* whose number is known.
        syscall: Option<SyscallTp>,
    },
}

/// A concrete probe on this kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// Full name, e.g. `tracepoint:syscalls:sys_enter_write`.
    pub name: String,
    pub kind: ProbeKind,
    pub fields: Vec<Field>,
}

impl Probe {
    pub fn field(&self, name: &str) -> Option<&Field> {
        self.fields.iter().find(|f| f.name == name)
    }

    /// Field names, for error messages.
    pub fn field_names(&self) -> String {
        let names: Vec<&str> = self.fields.iter().map(|f| f.name.as_str()).collect();
        if names.is_empty() {
            "none".to_string()
        } else {
            names.join(", ")
        }
    }
}

/// Resolves probe specs into probes, in the order given, without duplicates.
pub fn resolve(specs: &[ProbeSpec]) -> Result<Vec<Probe>, Error> {
    let root = tracefs::root()?;
    let all = tracefs::events(&root)?;
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for spec in specs {
        let matched = match_tracepoints(spec, &all);
        if matched.is_empty() {
            return Err(unknown_probe(spec, &all));
        }
        for (subsys, event) in matched {
            if seen.insert((subsys.clone(), event.clone())) {
                out.push(tracepoint(&root, subsys, event)?);
            }
        }
    }
    Ok(out)
}

fn match_tracepoints<'a>(
    spec: &ProbeSpec,
    all: &'a [(String, String)],
) -> Vec<&'a (String, String)> {
    let ProbeSpec::Tracepoint { subsys, event } = spec;
    all.iter()
        .filter(|(s, e)| glob::matches(subsys, s) && glob::matches(event, e))
        .collect()
}

/// Lists tracepoints matching a pattern (`SUBSYS:EVENT`, optionally with a `tracepoint:` prefix).
pub fn list(pattern: Option<&str>) -> Result<Vec<Probe>, Error> {
    let root = tracefs::root()?;
    let all = tracefs::events(&root)?;
    let spec = match pattern {
        None => ProbeSpec::Tracepoint {
            subsys: "*".into(),
            event: "*".into(),
        },
        Some(p) if p.starts_with("tracepoint:") || p.starts_with("t:") => ProbeSpec::parse(p)?,
        Some(p) => match p.split_once(':') {
            Some((s, e)) => ProbeSpec::Tracepoint {
                subsys: s.into(),
                event: e.into(),
            },
            // A bare word matches events or subsystems by that name.
            None => ProbeSpec::Tracepoint {
                subsys: "*".into(),
                event: p.into(),
            },
        },
    };
    match_tracepoints(&spec, &all)
        .into_iter()
        .map(|(s, e)| tracepoint(&root, s, e))
        .collect()
}

fn unknown_probe(spec: &ProbeSpec, all: &[(String, String)]) -> Error {
    let ProbeSpec::Tracepoint { subsys, event } = spec;
    let wanted = format!("{subsys}:{event}");
    let mut scored: Vec<(f64, String)> = all
        .iter()
        .map(|(s, e)| {
            let name = format!("{s}:{e}");
            (strsim::jaro_winkler(&wanted, &name), name)
        })
        .filter(|(score, _)| *score > 0.85)
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0));
    let hints: Vec<String> = scored
        .into_iter()
        .take(3)
        .map(|(_, n)| format!("tracepoint:{n}"))
        .collect();
    if hints.is_empty() {
        usage!("no tracepoint matches 'tracepoint:{wanted}'; 'bpfscope list' shows them")
    } else {
        usage!(
            "no tracepoint matches 'tracepoint:{wanted}'; did you mean {}?",
            hints.join(" or ")
        )
    }
}

fn tracepoint(root: &Path, subsys: &str, event: &str) -> Result<Probe, Error> {
    let raw = tracefs::format(root, subsys, event)?;
    let syscall = (subsys == "syscalls").then(|| syscall_of(event)).flatten();
    let is_syscall = subsys == "syscalls";
    let fields = raw
        .into_iter()
        .filter(|f| !f.name.starts_with("common_"))
        .map(|f| field_of(f, is_syscall, syscall))
        .collect();
    Ok(Probe {
        name: format!("tracepoint:{subsys}:{event}"),
        kind: ProbeKind::Tracepoint {
            subsys: subsys.to_string(),
            event: event.to_string(),
            syscall,
        },
        fields,
    })
}

fn syscall_of(event: &str) -> Option<SyscallTp> {
    let (name, exit) = if let Some(n) = event.strip_prefix("sys_enter_") {
        (n, false)
    } else if let Some(n) = event.strip_prefix("sys_exit_") {
        (n, true)
    } else {
        return None;
    };
    syscalls::number(name).map(|nr| SyscallTp { nr, exit })
}

fn field_of(f: tracefs::RawField, is_syscall: bool, syscall: Option<SyscallTp>) -> Field {
    let kind = if f.ctype.starts_with("__data_loc") {
        if f.ctype.contains("char") {
            FieldKind::DataLocStr
        } else {
            FieldKind::Unsupported
        }
    } else if let Some(n) = f.array_len {
        if f.ctype == "char" {
            FieldKind::InlineStr(n.min(u16::MAX as u32) as u16)
        } else {
            FieldKind::Unsupported
        }
    } else if f.ctype.contains('*') {
        // Syscall inputs declared `const char *` are user strings (paths, names).
        if is_syscall && f.ctype == "const char *" {
            FieldKind::UserStr
        } else {
            FieldKind::Pointer
        }
    } else if matches!(f.size, 1 | 2 | 4 | 8) {
        FieldKind::Int
    } else {
        FieldKind::Unsupported
    };
    let (mut size, mut signed) = (f.size.min(8) as u8, f.signed);
    if is_syscall && kind == FieldKind::Int {
        // Syscall records widen every argument to 8 unsigned bytes; the C type says what it is.
        if let Some((s, sg)) = syscalls::c_int_type(&f.ctype) {
            size = s;
            signed = sg;
        }
    }
    if kind == FieldKind::Pointer {
        signed = false;
    }
    let arg_slot = syscall.and_then(|sc| syscalls::arg_slot(&f.name, f.offset, sc.exit));
    Field {
        name: f.name,
        ctype: f.ctype,
        kind,
        offset: f.offset,
        size,
        signed,
        arg_slot,
    }
}
