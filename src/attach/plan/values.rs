//! Pass 4, values: how the plan aggregates (the same for every probe) and
//! where each probe reads the value it aggregates.

use bpfscope_bpf::abi::{bs_agg, bs_src};

use super::source::name_src;
use super::{Action, Buckets, Path, ValueKind};
use crate::error::Error;
use crate::probe::Probe;
use crate::usage;

/// What every probe does with a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Aggregation {
    pub agg: bs_agg,
    /// A linear histogram's buckets.
    pub linear: Option<Linear>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Linear {
    pub min: i64,
    pub step: u64,
    pub nbuckets: u32,
}

/// The aggregation pass.
pub(super) fn aggregation(action: &Action) -> Aggregation {
    let buckets = match action {
        Action::Count => return only(bs_agg::BS_AGG_COUNT),
        Action::Stats { .. } => return only(bs_agg::BS_AGG_STATS),
        Action::Trace { .. } => return only(bs_agg::BS_AGG_EVENT),
        Action::Hist { buckets, .. } | Action::Latency { buckets, .. } => buckets,
    };
    match *buckets {
        Buckets::Log2 => only(bs_agg::BS_AGG_HIST_LOG2),
        Buckets::Linear {
            min,
            step,
            nbuckets,
        } => Aggregation {
            agg: bs_agg::BS_AGG_HIST_LINEAR,
            linear: Some(Linear {
                min,
                step,
                nbuckets,
            }),
        },
    }
}

fn only(agg: bs_agg) -> Aggregation {
    Aggregation { agg, linear: None }
}

/// The value pass, per probe: where `--value` is read, if there is one.
pub(super) fn value(
    name: Option<&str>,
    probe: &Probe,
    path: &Path,
) -> Result<Option<bs_src>, Error> {
    let Some(v) = name else {
        return Ok(None);
    };
    let (src, kind, _) = name_src(probe, path, v)?;
    if !matches!(kind, ValueKind::Int { .. } | ValueKind::Hex) {
        return Err(usage!(
            "--value {v}: {} gives a string there; the value must be numeric",
            probe.name
        ));
    }
    Ok(Some(src))
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::*;
    use crate::probe::SyscallTp;
    use bpfscope_bpf::abi::bs_src_kind;

    #[test]
    fn aggregation_by_action() {
        assert_eq!(aggregation(&Action::Count), only(bs_agg::BS_AGG_COUNT));
        let stats = Action::Stats { value: "x".into() };
        assert_eq!(aggregation(&stats), only(bs_agg::BS_AGG_STATS));
        assert_eq!(aggregation(&trace(&[])), only(bs_agg::BS_AGG_EVENT));
        assert_eq!(aggregation(&hist("x")), only(bs_agg::BS_AGG_HIST_LOG2));
        assert_eq!(
            aggregation(&latency(None, &[])),
            only(bs_agg::BS_AGG_HIST_LOG2)
        );
        let linear = Buckets::Linear {
            min: -3,
            step: 2,
            nbuckets: 7,
        };
        let want = Aggregation {
            agg: bs_agg::BS_AGG_HIST_LINEAR,
            linear: Some(Linear {
                min: -3,
                step: 2,
                nbuckets: 7,
            }),
        };
        let hist = Action::Hist {
            value: "x".into(),
            buckets: linear,
        };
        assert_eq!(aggregation(&hist), want);
        let lat = Action::Latency {
            buckets: linear,
            end: None,
            matching: Vec::new(),
        };
        assert_eq!(aggregation(&lat), want);
    }

    #[test]
    fn values_are_numbers() {
        let read = Path::Syscall(SyscallTp { nr: 0, exit: true });
        let v = value(Some("ret"), &sys_exit_read(), &read)
            .unwrap()
            .unwrap();
        assert_eq!(v.kind, bs_src_kind::BS_SRC_ARG.0 as u8);
        assert_eq!((v.size, v.is_signed), (8, 1));
        assert!(value(None, &sys_exit_read(), &read).unwrap().is_none());
        assert!(value(Some("pid"), &sys_exit_read(), &read)
            .unwrap()
            .is_some());
        let e = value(Some("comm"), &sys_exit_read(), &read).unwrap_err();
        assert_eq!(
            e.to_string(),
            "--value comm: tracepoint:syscalls:sys_exit_read gives a string there; the value must be numeric"
        );
    }
}
