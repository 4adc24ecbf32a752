//! Where each name is read from: a builtin (the current task, the CPU, a
//! stack) or a probe's field, which the probe's path reads from its
//! record, an argument slot, or through a BTF-typed pointer. Every pass
//! that places a value asks here.

use bpfscope_bpf::abi::{bs_limits, bs_src, bs_src_kind, bs_task_member, bs_val_type};

use super::{Path, ValueKind};
use crate::error::Error;
use crate::probe::btf::{self, Shape};
use crate::probe::{Field, FieldKind, Probe, ProbeKind};
use crate::usage;

const STR_MAX: usize = bs_limits::BS_STR_MAX.0 as usize;
const COMM_LEN: usize = bs_limits::BS_COMM_LEN.0 as usize;

/// A value's source, how it is shown, and the bytes it takes in a key or event.
pub(super) type Source = (bs_src, ValueKind, usize);

/// A name as the user wrote it: a builtin, or a field (possibly `args.`-prefixed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Builtin {
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

pub(super) fn builtin(name: &str) -> Option<Builtin> {
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
pub(super) fn field_part(name: &str) -> Option<&str> {
    match name.strip_prefix("args.") {
        Some(f) => Some(f),
        None if builtin(name).is_some() => None,
        None => Some(name),
    }
}

fn builtin_src(b: Builtin) -> Source {
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

/// How a value is read: its type, width and sign, how it is shown, and
/// the bytes it takes in a key or event.
type Read = (bs_val_type, u8, bool, ValueKind, usize);

/// A member path from a BTF-typed argument (`skb->dev->name`).
fn walk_src(
    probe: &Probe,
    path: &Path,
    field: &str,
    base: &str,
    steps: &[btf::Step],
) -> Result<Source, Error> {
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
    let (vt, size, signed, vk, len) =
        shape_read(w.shape).ok_or_else(|| usage!("{}: '{field}' cannot be read", probe.name))?;
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

/// How the member at the end of a walk is read; None: it cannot be.
fn shape_read(shape: Shape) -> Option<Read> {
    let string = |vt| (vt, 8, false, ValueKind::Str, STR_MAX);
    Some(match shape {
        Shape::Int { size, signed } => (
            bs_val_type::BS_T_NUM,
            size,
            signed,
            ValueKind::Int { signed },
            8,
        ),
        Shape::Pointer => (bs_val_type::BS_T_NUM, 8, false, ValueKind::Hex, 8),
        Shape::KernelStr => string(bs_val_type::BS_T_STR_KPTR),
        Shape::UserStr => string(bs_val_type::BS_T_STR_UPTR),
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
        Shape::Array { .. } | Shape::Composite | Shape::Unsupported => return None,
    })
}

/// Where a field is read from, on a given path.
fn field_src(probe: &Probe, path: &Path, field: &str) -> Result<Source, Error> {
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
    if let Path::RawTp { name } = path {
        if let Some((arg, member)) = crate::probe::sched::task_field(name, field) {
            return task_member_src(probe, field, arg, member);
        }
    }
    let (kind, off) = match path {
        p if p.uses_args() => match f.arg_slot {
            Some(slot) => (bs_src_kind::BS_SRC_ARG, slot as u16),
            None => return Err(usage!("{}: field '{field}' is not available", probe.name)),
        },
        Path::Tracepoint { .. } => (bs_src_kind::BS_SRC_CTX, f.offset),
        _ => return Err(usage!("{}: field '{field}' is not available", probe.name)),
    };
    let (ty, size, _, vk, len) = field_read(f).ok_or_else(|| {
        usage!(
            "{}: field '{field}' has type '{}', which bpfscope cannot read",
            probe.name,
            f.ctype
        )
    })?;
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

/// A sched record field on the raw tracepoint: the member of the task
/// argument `arg` points to that the record would have copied, read as
/// the record field is (pid_t and int signed, comm as 16 bytes).
fn task_member_src(
    probe: &Probe,
    field: &str,
    arg: u8,
    member: crate::probe::sched::Member,
) -> Result<Source, Error> {
    let k = btf::vmlinux().ok_or_else(|| usage!("{field}: the kernel has no BTF"))?;
    let task = k
        .struct_id("task_struct")
        .ok_or_else(|| usage!("{field}: the kernel's BTF has no task_struct"))?;
    let step = btf::Step {
        arrow: false,
        member: member.name().to_string(),
    };
    let w = k
        .walk_in_memory("task", task, &[step])
        .map_err(|e| usage!("{}: {e}", probe.name))?;
    let (vt, size, signed, vk, len) =
        shape_read(w.shape).ok_or_else(|| usage!("{}: '{field}' cannot be read", probe.name))?;
    Ok((
        bs_src {
            kind: bs_src_kind::BS_SRC_ARG.0 as u8,
            r#type: vt.0 as u8,
            size,
            is_signed: signed as u8,
            off: u16::from(arg),
            walk: 1,
            leaf_off: w.leaf_off,
            task: task_member(member).0 as u8,
            ..Default::default()
        },
        vk,
        len,
    ))
}

/// The program's code for a task member, which it loads in place where
/// the kernel can type the pointer (the walk at `leaf_off` elsewhere).
fn task_member(m: crate::probe::sched::Member) -> bs_task_member {
    use crate::probe::sched::Member;
    match m {
        Member::Pid => bs_task_member::BS_TASK_PID,
        Member::Prio => bs_task_member::BS_TASK_PRIO,
        Member::Comm => bs_task_member::BS_TASK_COMM,
    }
}

/// How a probe's field is read; None: it cannot be.
fn field_read(f: &Field) -> Option<Read> {
    let string = |vt, size| (vt, size, f.signed, ValueKind::Str, STR_MAX);
    Some(match f.kind {
        FieldKind::Int => (
            bs_val_type::BS_T_NUM,
            f.size,
            f.signed,
            ValueKind::Int { signed: f.signed },
            8,
        ),
        FieldKind::Pointer => (bs_val_type::BS_T_NUM, f.size, f.signed, ValueKind::Hex, 8),
        FieldKind::InlineStr(n) => {
            let n = (n as usize).min(STR_MAX - 1);
            (
                bs_val_type::BS_T_STR_INLINE,
                n as u8,
                f.signed,
                ValueKind::Str,
                n,
            )
        }
        FieldKind::DataLocStr => string(bs_val_type::BS_T_STR_DATALOC, 0),
        FieldKind::UserStr => string(bs_val_type::BS_T_STR_UPTR, 8),
        FieldKind::KernelStr => string(bs_val_type::BS_T_STR_KPTR, 8),
        FieldKind::Unsupported => return None,
    })
}

/// For an event field that is a syscall's input buffer with a length (a
/// `const char *`/`const void *` followed by a `size_t`: write's buf and
/// count, pwrite64, mq_timedsend, setxattr; and sendto's `void *` buff and
/// len), where the length is read from (argument slot or record offset).
/// Such a buffer is shown as that many bytes, not as a C string.
pub(super) fn buffer_len(probe: &Probe, path: &Path, name: &str) -> Option<u16> {
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

pub(super) fn name_src(probe: &Probe, path: &Path, name: &str) -> Result<Source, Error> {
    match field_part(name) {
        Some(f) => field_src(probe, path, f),
        None => builtin(name)
            .map(builtin_src)
            .ok_or_else(|| usage!("unknown name '{name}'")),
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::*;
    use crate::probe::SyscallTp;

    const OPENAT: Path = Path::Syscall(SyscallTp {
        nr: 257,
        exit: false,
    });

    fn classic(subsys: &str, event: &str) -> Path {
        Path::Tracepoint {
            subsys: subsys.into(),
            event: event.into(),
        }
    }

    #[test]
    fn names_are_builtins_unless_prefixed() {
        assert_eq!(field_part("pid"), None);
        assert_eq!(field_part("args.pid"), Some("pid"));
        assert_eq!(field_part("next_pid"), Some("next_pid"));
        assert_eq!(field_part("skb->len"), Some("skb->len"));
        for b in BUILTINS.split(", ") {
            assert!(builtin(b).is_some(), "{b}");
        }
        assert!(builtin("args").is_none());
    }

    #[test]
    fn builtins() {
        let p = sched_switch();
        let raw = Path::RawTp {
            name: "sched_switch".into(),
        };
        let (src, kind, len) = name_src(&p, &raw, "comm").unwrap();
        assert_eq!((src.kind, src.r#type, src.size), (2, 1, 16));
        assert_eq!((kind, len), (ValueKind::Str, 16));
        let (src, kind, len) = name_src(&p, &raw, "ustack").unwrap();
        assert_eq!((src.kind, src.r#type, src.size), (11, 0, 8));
        assert_eq!((kind, len), (ValueKind::Stack { user: true }, 8));
        assert_eq!(name_src(&p, &raw, "cgroup").unwrap().1, ValueKind::Cgroup);
        assert_eq!(name_src(&p, &raw, "probe").unwrap().1, ValueKind::Probe);
    }

    #[test]
    fn a_field_by_path() {
        let p = sys_enter_openat();
        // The syscall path reads argument slots, the tracepoint the record.
        let (src, kind, len) = name_src(&p, &OPENAT, "filename").unwrap();
        assert_eq!((src.kind, src.r#type, src.off), (9, 3, 1));
        assert_eq!((kind, len), (ValueKind::Str, 64));
        let (src, _, _) =
            name_src(&p, &classic("syscalls", "sys_enter_openat"), "filename").unwrap();
        assert_eq!((src.kind, src.off), (8, 24));
        let (src, kind, _) = name_src(&p, &OPENAT, "args.flags").unwrap();
        assert_eq!((src.size, src.is_signed), (4, 1));
        assert_eq!(kind, ValueKind::Int { signed: true });
        // raw_tp has no record.
        let raw = Path::RawTp {
            name: "sched_switch".into(),
        };
        let e = name_src(&sched_switch(), &raw, "prev_state").unwrap_err();
        assert_eq!(
            e.to_string(),
            "tracepoint:sched:sched_switch: field 'prev_state' is not available"
        );
    }

    #[test]
    fn sched_fields_on_the_raw_tp_read_the_tasks() {
        let Some(k) = btf::vmlinux() else {
            eprintln!("SKIP: the kernel has no BTF");
            return;
        };
        let task = k.struct_id("task_struct").unwrap();
        let at = |m: &str| {
            let step = btf::Step {
                arrow: false,
                member: m.into(),
            };
            k.walk_in_memory("task", task, &[step]).unwrap().leaf_off
        };
        let raw = Path::RawTp {
            name: "sched_switch".into(),
        };
        let p = sched_switch();
        // next is the third argument, prev the second.
        let (src, kind, len) = name_src(&p, &raw, "next_pid").unwrap();
        assert_eq!(
            (src.kind, src.r#type, src.size, src.is_signed),
            (9, 0, 4, 1)
        );
        assert_eq!(
            (src.off, src.walk, src.nderef, src.leaf_off),
            (2, 1, 0, at("pid"))
        );
        assert_eq!(src.task, bs_task_member::BS_TASK_PID.0 as u8);
        assert_eq!((kind, len), (ValueKind::Int { signed: true }, 8));
        let (src, kind, len) = name_src(&p, &raw, "args.prev_comm").unwrap();
        assert_eq!((src.kind, src.r#type, src.size), (9, 1, 16));
        assert_eq!((src.off, src.leaf_off), (1, at("comm")));
        assert_eq!(src.task, bs_task_member::BS_TASK_COMM.0 as u8);
        assert_eq!((kind, len), (ValueKind::Str, 16));
        let (src, _, _) = name_src(&p, &raw, "prev_prio").unwrap();
        assert_eq!((src.off, src.leaf_off), (1, at("prio")));
        assert_eq!(src.task, bs_task_member::BS_TASK_PRIO.0 as u8);
        // Computed by the kernel: not there.
        assert!(name_src(&p, &raw, "prev_state").is_err());
    }

    #[test]
    fn fields_that_cannot_be_read() {
        let mut p = sched_switch();
        p.fields[3].kind = FieldKind::Unsupported;
        let e = name_src(&p, &classic("sched", "sched_switch"), "prev_state").unwrap_err();
        assert_eq!(
            e.to_string(),
            "tracepoint:sched:sched_switch: field 'prev_state' has type 'long', which bpfscope cannot read"
        );
        let e = name_src(&p, &classic("sched", "sched_switch"), "nope->x").unwrap_err();
        assert!(e.to_string().starts_with(
            "tracepoint:sched:sched_switch has no field 'nope' (in 'nope->x'); its fields: prev_comm"
        ));
    }

    #[test]
    fn how_each_kind_is_read() {
        let exec = sched_process_exec();
        let data_loc = field_read(&exec.fields[0]).unwrap();
        assert_eq!(
            data_loc,
            (bs_val_type::BS_T_STR_DATALOC, 0, false, ValueKind::Str, 64)
        );
        let mut f = exec.fields[1].clone();
        f.kind = FieldKind::InlineStr(200);
        // Inline strings are cut to what a key or event keeps.
        assert_eq!(field_read(&f).unwrap().4, 63);
        f.kind = FieldKind::Pointer;
        assert_eq!(field_read(&f).unwrap().3, ValueKind::Hex);
        f.kind = FieldKind::Unsupported;
        assert_eq!(field_read(&f), None);
    }

    #[test]
    fn how_each_member_is_read() {
        let int = shape_read(Shape::Int {
            size: 2,
            signed: true,
        });
        assert_eq!(
            int,
            Some((
                bs_val_type::BS_T_NUM,
                2,
                true,
                ValueKind::Int { signed: true },
                8
            ))
        );
        assert_eq!(shape_read(Shape::Pointer).unwrap().3, ValueKind::Hex);
        assert_eq!(
            shape_read(Shape::KernelStr).unwrap().0,
            bs_val_type::BS_T_STR_KPTR
        );
        assert_eq!(
            shape_read(Shape::UserStr).unwrap().0,
            bs_val_type::BS_T_STR_UPTR
        );
        assert_eq!(shape_read(Shape::CharArray(16)).unwrap().4, 16);
        assert_eq!(shape_read(Shape::Composite), None);
        assert_eq!(shape_read(Shape::Unsupported), None);
    }

    #[test]
    fn write_buffers_and_their_lengths() {
        let w = sys_enter_write();
        let sys = Path::Syscall(SyscallTp { nr: 1, exit: false });
        assert_eq!(buffer_len(&w, &sys, "buf"), Some(2));
        assert_eq!(buffer_len(&w, &sys, "args.buf"), Some(2));
        assert_eq!(
            buffer_len(&w, &classic("syscalls", "sys_enter_write"), "buf"),
            Some(32)
        );
        assert_eq!(buffer_len(&w, &sys, "count"), None);
        // openat's filename is followed by an int, not a size_t.
        assert_eq!(buffer_len(&sys_enter_openat(), &OPENAT, "filename"), None);
        assert_eq!(
            buffer_len(
                &sched_switch(),
                &classic("sched", "sched_switch"),
                "prev_comm"
            ),
            None
        );
    }
}
