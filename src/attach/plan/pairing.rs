//! Pass 5, pairing: for latency, the pair each start or end belongs to,
//! and where it reads the values that match an end with its start.

use bpfscope_bpf::abi::{bs_cfg_flags, bs_src};

use super::sides::Sides;
use super::source::name_src;
use super::{Path, Role, ValueKind};
use crate::error::Error;
use crate::probe::Probe;
use crate::usage;

/// A latency start's or end's part of the configuration.
#[derive(Debug, Clone)]
pub(super) struct Pairing {
    pub pair: u32,
    /// BS_CFG_LAT_START or BS_CFG_LAT_END, and BS_CFG_SAME_TASK.
    pub flags: u32,
    /// Where the values an end must share with its start are read, one
    /// per `--match` name (the thread id when none was given).
    pub matches: Vec<bs_src>,
}

/// The pairing pass, per probe; None for a probe outside any pair.
/// `returns`: ends are function returns (no END probe was named), which
/// run in the task of their entry.
pub(super) fn pairing(
    sides: &Sides,
    returns: bool,
    probe: &Probe,
    role: Role,
    path: &Path,
) -> Result<Option<Pairing>, Error> {
    let (pair, mut flags) = match role {
        Role::Plain => return Ok(None),
        Role::Start(pair) => (pair, bs_cfg_flags::BS_CFG_LAT_START.0),
        Role::End(pair) => (pair, bs_cfg_flags::BS_CFG_LAT_END.0),
    };
    // A function's return runs in the task of its entry: only the traced
    // tasks' returns need looking at.
    if matches!(role, Role::End(_)) && returns {
        flags |= bs_cfg_flags::BS_CFG_SAME_TASK.0;
    }
    let mut matches = Vec::with_capacity(sides.matching.len());
    for m in sides.match_names(probe, role) {
        let (src, kind, _) = name_src(probe, path, &m).map_err(|e| usage!("--match: {e}"))?;
        if !matches!(kind, ValueKind::Int { .. } | ValueKind::Hex) {
            return Err(usage!("--match {m}: only numeric fields can pair events"));
        }
        matches.push(src);
    }
    Ok(Some(Pairing {
        pair,
        flags,
        matches,
    }))
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::super::sides::sides;
    use super::*;
    use bpfscope_bpf::abi::bs_src_kind;

    fn classic(event: &str) -> Path {
        Path::Tracepoint {
            subsys: "sched".into(),
            event: event.into(),
        }
    }

    #[test]
    fn starts_and_ends_match_on_their_own_fields() {
        let end = Some(tp_spec("sched", "sched_switch"));
        let s = config(latency(end, &["pid=next_pid", "cpu"]), &[], None);
        let probes = start_end(vec![sched_wakeup()], vec![sched_switch()]);
        let sides = sides(&s, &probes).unwrap();
        let start = pairing(
            &sides,
            false,
            &probes[0].0,
            Role::Start(0),
            &classic("sched_wakeup"),
        )
        .unwrap()
        .unwrap();
        assert_eq!(start.flags, bs_cfg_flags::BS_CFG_LAT_START.0);
        assert_eq!(start.matches.len(), 2);
        assert_eq!((start.matches[0].kind, start.matches[0].off), (8, 24));
        assert_eq!(start.matches[1].kind, bs_src_kind::BS_SRC_CPU.0 as u8);
        let end = pairing(
            &sides,
            false,
            &probes[1].0,
            Role::End(0),
            &classic("sched_switch"),
        )
        .unwrap()
        .unwrap();
        assert_eq!(end.flags, bs_cfg_flags::BS_CFG_LAT_END.0);
        assert_eq!(end.matches[0].off, 56);
    }

    #[test]
    fn function_returns_are_in_their_entry_task() {
        let s = config(latency(None, &[]), &[], None);
        let probes = entry_and_return(vec![uprobe("work", 0x10)]);
        let sides = sides(&s, &probes).unwrap();
        let path = Path::Uprobe {
            binary: DEMO.into(),
            offset: 0x10,
            ret: true,
        };
        let end = pairing(&sides, true, &probes[1].0, Role::End(3), &path)
            .unwrap()
            .unwrap();
        assert_eq!(end.pair, 3);
        assert_eq!(
            end.flags,
            bs_cfg_flags::BS_CFG_LAT_END.0 | bs_cfg_flags::BS_CFG_SAME_TASK.0
        );
        assert_eq!(end.matches.len(), 1);
        assert_eq!(end.matches[0].kind, bs_src_kind::BS_SRC_TID.0 as u8);
        let plain = pairing(&sides, true, &probes[0].0, Role::Plain, &path).unwrap();
        assert!(plain.is_none());
    }

    #[test]
    fn only_numbers_pair() {
        let end = Some(tp_spec("sched", "sched_switch"));
        let s = config(latency(end, &["comm"]), &[], None);
        let probes = start_end(vec![sched_wakeup()], vec![sched_switch()]);
        let sides = sides(&s, &probes).unwrap();
        let e = pairing(
            &sides,
            false,
            &probes[0].0,
            Role::Start(0),
            &classic("sched_wakeup"),
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "--match args.comm: only numeric fields can pair events"
        );
        // The switch has no comm field: the builtin, a string too.
        let e = pairing(
            &sides,
            false,
            &probes[1].0,
            Role::End(0),
            &classic("sched_switch"),
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "--match comm: only numeric fields can pair events"
        );
    }
}
