//! Pass 7, events: for a trace, the fields each probe's events carry,
//! where each is read and where it lands in the event data.

use bpfscope_bpf::abi::{bs_limits, bs_src, bs_val_type};

use super::limits;
use super::source::{buffer_len, builtin, field_part, name_src};
use super::{Path, Slot, ValueKind};
use crate::error::Error;
use crate::probe::{FieldKind, Probe};

/// One probe's event data: a source and a slot per field.
#[derive(Debug, Clone)]
pub(super) struct EventLayout {
    pub srcs: Vec<bs_src>,
    pub slots: Vec<Slot>,
    /// Bytes after the event header.
    pub size: usize,
}

/// The events pass, per probe: `fields` named (empty: all the probe's
/// fields); None when the plan does not trace.
pub(super) fn layout(
    fields: Option<&[String]>,
    probe: &Probe,
    path: &Path,
) -> Result<Option<EventLayout>, Error> {
    let Some(named) = fields else {
        return Ok(None);
    };
    // Plain names in the all-fields list are fields even if they look like builtins.
    let lookups: Vec<String> = if named.is_empty() {
        probe
            .fields
            .iter()
            .filter(|f| f.kind != FieldKind::Unsupported)
            .map(|f| format!("args.{}", f.name))
            .collect()
    } else {
        named.to_vec()
    };
    limits::event_fields(&probe.name, lookups.len())?;
    let mut out = EventLayout {
        srcs: Vec::with_capacity(lookups.len()),
        slots: Vec::with_capacity(lookups.len()),
        size: 0,
    };
    for name in &lookups {
        let (mut src, kind, len) = field(probe, path, name)?;
        src.out_off = out.size as u16;
        out.srcs.push(src);
        out.slots.push(Slot {
            name: shown(name),
            kind,
            off: out.size,
            len,
        });
        out.size += len;
    }
    limits::event_bytes(&probe.name, out.size)?;
    Ok(Some(out))
}

/// Where an event field is read; a syscall's input buffer with a length
/// is copied as that many bytes, after the length.
fn field(probe: &Probe, path: &Path, name: &str) -> Result<(bs_src, ValueKind, usize), Error> {
    let (mut src, kind, len) = name_src(probe, path, name)?;
    match buffer_len(probe, path, name) {
        Some(len_off) => {
            src.r#type = bs_val_type::BS_T_BUF_UPTR.0 as u8;
            src.path[0] = len_off;
            Ok((src, ValueKind::Buf, 8 + bs_limits::BS_BUF_MAX.0 as usize))
        }
        None => Ok((src, kind, len)),
    }
}

/// The name an event shows for a field: a field named like a builtin is
/// shown as args.NAME, so an event never shows two different `pid=` (the
/// header has the builtin).
fn shown(lookup: &str) -> String {
    match field_part(lookup) {
        Some(f) if builtin(f).is_some() => format!("args.{f}"),
        Some(f) => f.to_string(),
        None => lookup.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::*;
    use crate::probe::SyscallTp;
    use bpfscope_bpf::abi::bs_src_kind;

    fn names(l: &EventLayout) -> Vec<(&str, usize, usize)> {
        l.slots
            .iter()
            .map(|s| (s.name.as_str(), s.off, s.len))
            .collect()
    }

    fn exec() -> Path {
        Path::Tracepoint {
            subsys: "sched".into(),
            event: "sched_process_exec".into(),
        }
    }

    #[test]
    fn named_fields_in_order() {
        let list: Vec<String> = ["filename", "pid", "args.pid", "comm"]
            .map(String::from)
            .to_vec();
        let l = layout(Some(&list), &sched_process_exec(), &exec())
            .unwrap()
            .unwrap();
        assert_eq!(
            names(&l),
            [
                ("filename", 0, 64),
                ("pid", 64, 8),
                ("args.pid", 72, 8),
                ("comm", 80, 16)
            ]
        );
        assert_eq!(l.size, 96);
        let outs: Vec<u16> = l.srcs.iter().map(|s| s.out_off).collect();
        assert_eq!(outs, [0, 64, 72, 80]);
        assert_eq!(l.srcs[1].kind, bs_src_kind::BS_SRC_PID.0 as u8);
        assert_eq!(l.srcs[2].kind, bs_src_kind::BS_SRC_CTX.0 as u8);
    }

    #[test]
    fn all_fields_are_fields_even_when_named_like_builtins() {
        let l = layout(Some(&[]), &sched_process_exec(), &exec())
            .unwrap()
            .unwrap();
        assert_eq!(
            names(&l),
            [("filename", 0, 64), ("args.pid", 64, 8), ("old_pid", 72, 8)]
        );
    }

    #[test]
    fn a_write_buffer_carries_its_length() {
        let path = Path::Syscall(SyscallTp { nr: 1, exit: false });
        let list = vec!["buf".to_string(), "count".to_string()];
        let l = layout(Some(&list), &sys_enter_write(), &path)
            .unwrap()
            .unwrap();
        assert_eq!(l.slots[0].kind, ValueKind::Buf);
        assert_eq!(l.slots[0].len, 72);
        assert_eq!(l.srcs[0].r#type, bs_val_type::BS_T_BUF_UPTR.0 as u8);
        // count's argument slot.
        assert_eq!(l.srcs[0].path[0], 2);
        let classic = Path::Tracepoint {
            subsys: "syscalls".into(),
            event: "sys_enter_write".into(),
        };
        let l = layout(Some(&list), &sys_enter_write(), &classic)
            .unwrap()
            .unwrap();
        // count's record offset.
        assert_eq!(l.srcs[0].path[0], 32);
    }

    #[test]
    fn no_trace_no_events() {
        assert!(layout(None, &sched_switch(), &exec()).unwrap().is_none());
    }

    #[test]
    fn too_many_fields() {
        let list: Vec<String> = (0..17).map(|i| format!("f{i}")).collect();
        let e = layout(Some(&list), &sched_switch(), &exec()).unwrap_err();
        assert!(
            e.to_string().contains("17 fields to print, at most 16"),
            "{e}"
        );
        let list: Vec<String> = (0..16).map(|_| "filename".to_string()).collect();
        let e = layout(Some(&list), &sched_process_exec(), &exec()).unwrap_err();
        assert!(e.to_string().contains("the fields take 1024 bytes"), "{e}");
    }
}
