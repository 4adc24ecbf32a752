//! Kernel functions that can be probed: tracefs's
//! `available_filter_functions` (what ftrace, hence fentry/fexit and
//! kprobe_multi, can attach to), the kprobe blacklist, and BTF for their
//! prototypes, parameter names and types.

use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::io::ErrorKind;

use crate::error::Error;
use crate::probe::btf::{self, FuncSig, KernelBtf, Shape, ARG_REGS};
use crate::probe::{Field, FieldKind};
use bpfscope_bpf::abi::bs_limits;

const KPROBE_BLACKLIST: &str = "/sys/kernel/debug/kprobes/blacklist";

/// The kernel functions of this kernel.
#[derive(Debug, Default)]
pub struct Catalog {
    /// Function name -> module (None: vmlinux).
    pub funcs: BTreeMap<String, Option<String>>,
    /// Whether `funcs` comes from ftrace (traceable functions). When ftrace
    /// refuses to list them (e.g. under lockdown) the names come from BTF.
    pub from_ftrace: bool,
    /// Functions kprobes refuse.
    pub blacklist: HashSet<String>,
}

impl Catalog {
    pub fn read(btf: Option<&KernelBtf>) -> Result<Catalog, Error> {
        let root = crate::probe::tracefs::root()?;
        let path = root.join("available_filter_functions");
        let mut cat = Catalog::default();
        match fs::read_to_string(&path) {
            Ok(text) => {
                cat.from_ftrace = true;
                for line in text.lines() {
                    let mut it = line.split_whitespace();
                    let Some(name) = it.next() else { continue };
                    let module = it
                        .next()
                        .map(|m| m.trim_matches(|c| c == '[' || c == ']').to_string());
                    // Names repeat (static functions of several files): one entry each.
                    cat.funcs.entry(name.to_string()).or_insert(module);
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::PermissionDenied | ErrorKind::NotFound) => {
                // Refused (lockdown) or no function tracer: BTF still names
                // the functions, so errors and listings can say something useful.
                if let Some(b) = btf {
                    cat.funcs = b.func_names().map(|n| (n.to_string(), None)).collect();
                }
            }
            Err(e) => {
                return Err(Error::Environment(format!(
                    "cannot read {}: {e}",
                    path.display()
                )))
            }
        }
        if let Ok(text) = fs::read_to_string(KPROBE_BLACKLIST) {
            cat.blacklist = text
                .lines()
                .filter_map(|l| l.split_whitespace().nth(1))
                .map(str::to_string)
                .collect();
        }
        Ok(cat)
    }
}

fn field_kind(shape: Shape) -> FieldKind {
    match shape {
        Shape::Int { .. } => FieldKind::Int,
        Shape::Pointer => FieldKind::Pointer,
        Shape::KernelStr => FieldKind::KernelStr,
        Shape::UserStr => FieldKind::UserStr,
        Shape::CharArray(_) | Shape::Array { .. } | Shape::Composite | Shape::Unsupported => {
            FieldKind::Unsupported
        }
    }
}

fn raw_arg(i: u8) -> Field {
    Field {
        name: format!("arg{i}"),
        ctype: "long".into(),
        kind: FieldKind::Int,
        offset: 0,
        size: 8,
        array_bytes: 0,
        signed: true,
        arg_slot: Some(i),
        btf: None,
    }
}

fn typed(k: &KernelBtf, name: String, ty: u32, slot: u8) -> Field {
    let shape = k.shape(ty);
    let (size, signed) = match shape {
        Shape::Int { size, signed } => (size, signed),
        _ => (8, false),
    };
    Field {
        name,
        ctype: k.type_name(ty),
        kind: field_kind(shape),
        offset: 0,
        size,
        array_bytes: 0,
        signed,
        arg_slot: Some(slot),
        btf: Some(ty),
    }
}

/// The fields of a kernel function probe: `arg0`..`arg5` always (by the
/// calling convention, typed when BTF describes the parameter in that
/// register), the parameters by name with BTF, and `retval` at returns.
/// kretprobes see only the return value: the argument registers are gone.
pub fn fields(sig: Option<&FuncSig>, ret: bool, args: bool) -> Vec<Field> {
    let k = btf::vmlinux();
    let mut out = Vec::new();
    if args {
        for i in 0..ARG_REGS {
            let param = sig.and_then(|s| s.params.iter().find(|p| p.slot == Some(i)));
            let f = match (&k, param) {
                (Some(k), Some(p)) => {
                    let mut f = typed(k, format!("arg{i}"), p.ty, i);
                    // argN is the register: strings stay pointers (the named field reads them).
                    if f.kind.is_str() {
                        f.kind = FieldKind::Pointer;
                    }
                    f
                }
                _ => raw_arg(i),
            };
            out.push(f);
        }
        if let (Some(k), Some(sig)) = (&k, sig) {
            for p in &sig.params {
                let Some(name) = &p.name else { continue };
                let field = match p.slot {
                    Some(slot) => typed(k, name.clone(), p.ty, slot),
                    None => Field {
                        kind: FieldKind::Unsupported,
                        arg_slot: None,
                        ..typed(k, name.clone(), p.ty, 0)
                    },
                };
                if !out.iter().any(|f| f.name == field.name) {
                    out.push(field);
                }
            }
        }
    }
    if ret {
        let slot = bs_limits::BS_ARG_RET.0 as u8;
        let f = match (&k, sig) {
            (Some(k), Some(s)) if s.ret != 0 => Some(typed(k, "retval".into(), s.ret, slot)),
            (Some(_), Some(_)) => None, // void
            _ => Some(Field {
                name: "retval".into(),
                arg_slot: Some(slot),
                ..raw_arg(0)
            }),
        };
        out.extend(f);
    }
    out
}
