//! Pass 3, keys: the layout of the aggregation key shared by all probes,
//! then per probe the sources that fill it.

use bpfscope_bpf::abi::{bs_src, bs_ustack_flags};

use super::limits;
use super::sides::{Side, Sides};
use super::source::name_src;
use super::{Path, Role, Slot, ValueKind};
use crate::error::Error;
use crate::probe::Probe;
use crate::usage;

/// The key after its header: each part's place, and the side that fills it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct KeyLayout {
    pub slots: Vec<Slot>,
    pub sides: Vec<Side>,
    /// Bytes of all parts.
    pub size: usize,
}

/// The key layout pass: each part's shape from the first probe that reads it.
pub(super) fn layout(
    probes: &[(Probe, Role)],
    paths: &[Path],
    sides: &Sides,
) -> Result<KeyLayout, Error> {
    let mut slots = Vec::with_capacity(sides.keys.len());
    let mut off = 0usize;
    for (name, side) in &sides.keys {
        let (i, (probe, _)) = probes
            .iter()
            .enumerate()
            .find(|(_, (_, r))| side.includes(*r))
            .ok_or_else(|| usage!("--by {name}: no probe provides it"))?;
        let (_, kind, len) = name_src(probe, &paths[i], name)?;
        slots.push(Slot {
            name: name.clone(),
            kind,
            off,
            len,
        });
        off += len;
    }
    limits::key_bytes(off)?;
    Ok(KeyLayout {
        slots,
        sides: sides.keys.iter().map(|k| k.1).collect(),
        size: off,
    })
}

/// The key parts a probe in this role writes, at their shared offsets.
pub(super) fn sources(
    layout: &KeyLayout,
    probe: &Probe,
    role: Role,
    path: &Path,
) -> Result<Vec<bs_src>, Error> {
    let mut out = Vec::new();
    for (slot, side) in layout.slots.iter().zip(&layout.sides) {
        if !side.includes(role) {
            continue;
        }
        let (mut src, kind, len) = name_src(probe, path, &slot.name)?;
        if kind != slot.kind || len != slot.len {
            return Err(usage!(
                "--by {}: the key has a different type in {} than in the other probes; trace them separately",
                slot.name,
                probe.name
            ));
        }
        src.out_off = slot.off as u16;
        if let (
            ValueKind::Stack { user: true },
            crate::probe::ProbeKind::Uprobe {
                ret: false,
                entry: true,
                ..
            },
        ) = (kind, &probe.kind)
        {
            src.off = bs_ustack_flags::BS_USTACK_ENTRY.0 as u16;
        }
        out.push(src);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::super::sides::sides;
    use super::super::{Action, ValueKind};
    use super::*;

    fn layout_of(keys: &[&str], probes: &[(Probe, Role)]) -> Result<KeyLayout, Error> {
        let s = config(Action::Count, keys, None);
        let sides = sides(&s, probes)?;
        let paths = super::super::paths::paths(probes, &sides, &features())?;
        layout(probes, &paths, &sides)
    }

    #[test]
    fn parts_follow_each_other() {
        let probes = plain(vec![sys_enter_openat()]);
        let l = layout_of(&["comm", "filename", "flags", "kstack"], &probes).unwrap();
        let shape: Vec<(&str, ValueKind, usize, usize)> = l
            .slots
            .iter()
            .map(|s| (s.name.as_str(), s.kind, s.off, s.len))
            .collect();
        assert_eq!(
            shape,
            [
                ("comm", ValueKind::Str, 0, 16),
                ("filename", ValueKind::Str, 16, 64),
                ("flags", ValueKind::Int { signed: true }, 80, 8),
                ("kstack", ValueKind::Stack { user: false }, 88, 8),
            ]
        );
        assert_eq!(l.size, 96);
    }

    #[test]
    fn each_probe_writes_its_side_at_the_shared_offsets() {
        let end = Some(tp_spec("sched", "sched_switch"));
        let s = config(latency(end, &[]), &["prev_comm", "target_cpu"], None);
        let probes = start_end(vec![sched_wakeup()], vec![sched_switch()]);
        let sides = sides(&s, &probes).unwrap();
        let paths = super::super::paths::paths(&probes, &sides, &features()).unwrap();
        let l = layout(&probes, &paths, &sides).unwrap();
        assert_eq!(l.sides, [Side::End, Side::Start]);
        let start = sources(&l, &probes[0].0, probes[0].1, &paths[0]).unwrap();
        let end = sources(&l, &probes[1].0, probes[1].1, &paths[1]).unwrap();
        // target_cpu, from the wakeup's record, after prev_comm's 16 bytes.
        assert_eq!(start.len(), 1);
        assert_eq!((start[0].off, start[0].out_off), (32, 16));
        assert_eq!(end.len(), 1);
        assert_eq!((end[0].off, end[0].out_off), (8, 0));
    }

    #[test]
    fn errors() {
        let e = layout_of(
            &["comm", "filename", "filename", "filename", "filename"],
            &plain(vec![sys_enter_openat()]),
        )
        .unwrap_err();
        assert!(
            e.to_string().starts_with("--by: keys take 272 bytes"),
            "{e}"
        );
        let e = layout_of(&["comm"], &[]).unwrap_err();
        assert_eq!(e.to_string(), "--by comm: no probe provides it");
        let e = layout_of(&["next_pid", "nope"], &plain(vec![sched_switch()])).unwrap_err();
        assert!(e
            .to_string()
            .starts_with("tracepoint:sched:sched_switch has no field 'nope'"));
        let l = layout_of(&["pid"], &plain(vec![sched_switch()])).unwrap();
        let clash = sched_wakeup();
        let path = Path::Tracepoint {
            subsys: "sched".into(),
            event: "sched_wakeup".into(),
        };
        // `args.pid` in one probe, the builtin's shape in the layout.
        let mut l2 = l.clone();
        l2.slots[0].name = "args.pid".into();
        let e = sources(&l2, &clash, Role::Plain, &path).unwrap_err();
        assert_eq!(
            e.to_string(),
            "--by args.pid: the key has a different type in tracepoint:sched:sched_wakeup than in the other probes; trace them separately"
        );
        assert_eq!(sources(&l, &clash, Role::Plain, &path).unwrap().len(), 1);
    }
}
