//! Pass 1, sides: the names a plan reads (keys, filter, value, trace
//! fields, latency match fields) and, when starts pair with ends, which
//! side of the pair reads each one.

use super::limits;
use super::source::{builtin, field_part};
use super::{Action, PlanConfig, Role};
use crate::error::Error;
use crate::filter::Expr;
use crate::probe::btf;
use crate::probe::Probe;
use crate::usage;

/// Which probes of a latency pair evaluate a key part or the filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Side {
    All,
    Start,
    End,
}

impl Side {
    pub(super) fn includes(self, role: Role) -> bool {
        matches!(
            (self, role),
            (Side::All, _)
                | (_, Role::Plain)
                | (Side::Start, Role::Start(_))
                | (Side::End, Role::End(_))
        )
    }
}

/// What the plan reads by name, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Sides {
    /// Starts are paired with ends.
    pub latency: bool,
    /// `--value` of stats and hist.
    pub value: Option<String>,
    /// Fields a trace prints (empty: all of each probe's); None: not a trace.
    pub trace: Option<Vec<String>>,
    /// `--by` names, each with the side that reads it.
    pub keys: Vec<(String, Side)>,
    /// The names the filter reads, and the side that evaluates it.
    pub filter_names: Vec<String>,
    pub filter: Side,
    /// `--match` entries (`START=END` or one name), `tid` when none was
    /// given; empty without latency.
    pub matching: Vec<String>,
    /// `--match` was given: its names are read per probe (`match_name`).
    explicit_match: bool,
}

impl Sides {
    /// The names a probe in this role pairs its start and end on.
    pub(super) fn match_names(&self, probe: &Probe, role: Role) -> Vec<String> {
        if !self.explicit_match {
            return self.matching.clone();
        }
        self.matching
            .iter()
            .map(|m| match_name(probe, match_side(m, role)))
            .collect()
    }

    /// Every name a probe in this role reads for keys, filter, pairing and
    /// value (not the trace fields).
    pub(super) fn names(&self, probe: &Probe, role: Role) -> Vec<String> {
        let mut names: Vec<String> = self
            .keys
            .iter()
            .filter(|(_, side)| side.includes(role))
            .map(|(k, _)| k.clone())
            .collect();
        if self.filter.includes(role) {
            names.extend(self.filter_names.iter().cloned());
        }
        names.extend(self.match_names(probe, role));
        if !self.latency {
            names.extend(self.value.iter().cloned());
        }
        names
    }
}

/// The sides pass.
pub(super) fn sides(s: &PlanConfig, probes: &[(Probe, Role)]) -> Result<Sides, Error> {
    let latency = probes.iter().any(|(_, r)| *r != Role::Plain);
    let mut filter_names = Vec::new();
    if let Some(f) = &s.filter {
        names_in(f, &mut filter_names);
    }
    let filter = side_for(&filter_names, probes, "--filter")?;
    let keys = s
        .keys
        .iter()
        .map(|k| {
            Ok((
                k.clone(),
                side_for(std::slice::from_ref(k), probes, "--by")?,
            ))
        })
        .collect::<Result<_, Error>>()?;
    // By default a start pairs with an end of the same thread (the builtin,
    // even where an event has a field called tid).
    let matching: Vec<String> = if !latency {
        Vec::new()
    } else if s.matching().is_empty() {
        vec!["tid".to_string()]
    } else {
        s.matching().to_vec()
    };
    limits::match_fields(matching.len())?;
    Ok(Sides {
        latency,
        value: match &s.action {
            Action::Stats { value } | Action::Hist { value, .. } => Some(value.clone()),
            _ => None,
        },
        trace: match &s.action {
            Action::Trace { fields } => Some(fields.clone()),
            _ => None,
        },
        keys,
        filter_names,
        filter,
        matching,
        explicit_match: !s.matching().is_empty(),
    })
}

/// Whether a probe has what a name reads (a member path: its base field).
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

/// The names an expression reads, in order.
fn names_in(e: &Expr, out: &mut Vec<String>) {
    match e {
        Expr::Cmp { name, .. } | Expr::Truthy { name, .. } => out.push(name.clone()),
        Expr::Not(a) => names_in(a, out),
        Expr::And(a, b) | Expr::Or(a, b) => {
            names_in(a, out);
            names_in(b, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::*;

    fn wakeup_to_switch() -> Vec<(Probe, Role)> {
        start_end(vec![sched_wakeup()], vec![sched_switch()])
    }

    #[test]
    fn without_latency_everything_is_read_everywhere() {
        let s = config(
            hist("prev_state"),
            &["comm", "next_pid"],
            Some("prev_pid == 1"),
        );
        let sd = sides(&s, &plain(vec![sched_switch()])).unwrap();
        assert!(!sd.latency);
        assert_eq!(sd.filter, Side::All);
        assert_eq!(
            sd.keys,
            [("comm".into(), Side::All), ("next_pid".into(), Side::All)]
        );
        assert_eq!(sd.filter_names, ["prev_pid"]);
        assert!(sd.matching.is_empty());
        assert_eq!(sd.value.as_deref(), Some("prev_state"));
        assert_eq!(sd.trace, None);
        assert_eq!(
            sd.names(&sched_switch(), Role::Plain),
            ["comm", "next_pid", "prev_pid", "prev_state"]
        );
    }

    #[test]
    fn a_name_goes_to_the_start_when_every_start_has_it() {
        let end = Some(tp_spec("sched", "sched_switch"));
        let s = config(
            latency(end, &["pid=next_pid"]),
            &["comm", "prev_comm", "cpu"],
            Some("next_prio > 100"),
        );
        let sd = sides(&s, &wakeup_to_switch()).unwrap();
        assert!(sd.latency);
        let keys: Vec<Side> = sd.keys.iter().map(|k| k.1).collect();
        assert_eq!(keys, [Side::Start, Side::End, Side::Start]);
        assert_eq!(sd.filter, Side::End);
        let (start, end) = (Role::Start(0), Role::End(0));
        assert_eq!(
            sd.names(&sched_wakeup(), start),
            ["comm", "cpu", "args.pid"]
        );
        assert_eq!(
            sd.names(&sched_switch(), end),
            ["prev_comm", "next_prio", "next_pid"]
        );
    }

    #[test]
    fn match_names_per_side() {
        let end = Some(tp_spec("sched", "sched_switch"));
        let s = config(latency(end.clone(), &["pid=next_pid", "cpu"]), &[], None);
        let sd = sides(&s, &wakeup_to_switch()).unwrap();
        // The wakeup has a field named pid: that, not the builtin.
        assert_eq!(
            sd.match_names(&sched_wakeup(), Role::Start(0)),
            ["args.pid", "cpu"]
        );
        assert_eq!(
            sd.match_names(&sched_switch(), Role::End(0)),
            ["next_pid", "cpu"]
        );
        // Without --match: the builtin tid, whatever fields a probe has.
        let s = config(latency(end, &[]), &[], None);
        let sd = sides(&s, &wakeup_to_switch()).unwrap();
        assert_eq!(sd.matching, ["tid"]);
        assert_eq!(sd.match_names(&sched_wakeup(), Role::Start(0)), ["tid"]);
    }

    #[test]
    fn trace_fields_are_kept_apart() {
        let s = config(trace(&["next_pid"]), &[], None);
        let sd = sides(&s, &plain(vec![sched_switch()])).unwrap();
        assert_eq!(sd.trace, Some(vec!["next_pid".to_string()]));
        assert!(sd.names(&sched_switch(), Role::Plain).is_empty());
    }

    #[test]
    fn errors() {
        let end = Some(tp_spec("sched", "sched_switch"));
        let s = config(
            latency(end.clone(), &[]),
            &[],
            Some("prio > 1 || next_prio > 1"),
        );
        let e = sides(&s, &wakeup_to_switch()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "--filter: prio, next_prio must all be fields of the start probes or all of the end probes"
        );
        let s = config(latency(end, &["a", "b", "c", "d", "e"]), &[], None);
        let e = sides(&s, &wakeup_to_switch()).unwrap_err();
        assert_eq!(e.to_string(), "--match: at most 4 fields");
    }

    #[test]
    fn member_paths_resolve_by_their_base() {
        assert!(resolvable(&sched_wakeup(), "pid"));
        assert!(resolvable(&sched_wakeup(), "args.comm"));
        assert!(resolvable(&sched_wakeup(), "comm->x.y"));
        assert!(!resolvable(&sched_wakeup(), "nope->x"));
        assert!(resolvable(&sched_wakeup(), "kstack"));
    }

    #[test]
    fn match_sides() {
        assert_eq!(match_side("pid=next_pid", Role::Start(0)), "pid");
        assert_eq!(match_side("pid=next_pid", Role::End(0)), "next_pid");
        assert_eq!(match_side("tid", Role::End(0)), "tid");
        assert_eq!(match_name(&sched_switch(), "pid"), "pid");
        assert_eq!(match_name(&sched_wakeup(), "pid"), "args.pid");
        assert_eq!(match_name(&sched_wakeup(), "prio"), "prio");
    }
}
