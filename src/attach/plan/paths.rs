//! Pass 2, paths: the kernel mechanism each probe is attached through,
//! the cheapest that can read every field the probe needs.

use super::kernel::{kfunc_path, KfuncCount};
use super::sides::Sides;
use super::source::field_part;
use super::{Path, Role};
use crate::attach::features::Features;
use crate::error::Error;
use crate::probe::{FieldKind, Probe, ProbeKind, SyscallTp};

/// The paths pass: one path per probe, in order.
pub(super) fn paths(
    probes: &[(Probe, Role)],
    sides: &Sides,
    features: &Features,
) -> Result<Vec<Path>, Error> {
    let n = KfuncCount::of(probes);
    probes
        .iter()
        .map(|(probe, role)| {
            let fields = fields_read(probe, *role, sides);
            let fields: Vec<&str> = fields.iter().map(String::as_str).collect();
            let path = choose_path(probe, &fields, features, n)?;
            Ok(without_record(path, &fields, features))
        })
        .collect()
}

/// A sched tracepoint whose fields are all copied from the tasks its
/// arguments point to (probe::sched) goes to the raw tracepoint, which
/// reads them through the pointers: the classic one builds its record
/// first, and on sched events that costs more than a verb's whole run
/// (bench/run_vs_bpftrace.py's runqlat floors). Not for scripts, whose
/// compiler makes the same choice itself (script::jit::typed), nor on the
/// general path (`BPFSCOPE_GENERIC`, Features::sched_via_tasks), which
/// keeps the record to compare against.
fn without_record(path: Path, fields: &[&str], features: &Features) -> Path {
    let Path::Tracepoint { subsys, event } = &path else {
        return path;
    };
    let typed = fields
        .iter()
        .all(|f| crate::probe::sched::task_field(event, f).is_some());
    if subsys == "sched" && typed && features.sched_via_tasks && features.has_raw_tp(event) {
        return Path::RawTp {
            name: event.clone(),
        };
    }
    path
}

/// One probe's path on its own (a script's probe, which reads `fields`).
pub(super) fn path_for(probe: &Probe, fields: &[&str], features: &Features) -> Result<Path, Error> {
    let n = KfuncCount::of(&[(probe.clone(), Role::Plain)]);
    choose_path(probe, fields, features, n)
}

/// The fields (not builtins) a probe reads in its role: for keys, filter,
/// pairing and value, and the fields it prints.
fn fields_read(probe: &Probe, role: Role, sides: &Sides) -> Vec<String> {
    let names = sides.names(probe, role);
    let mut fields: Vec<String> = names
        .iter()
        .filter_map(|n| field_part(n))
        .map(str::to_string)
        .collect();
    match &sides.trace {
        Some(list) if list.is_empty() => fields.extend(
            probe
                .fields
                .iter()
                .filter(|f| f.kind != FieldKind::Unsupported)
                .map(|f| f.name.clone()),
        ),
        Some(list) => fields.extend(
            list.iter()
                .filter_map(|n| field_part(n))
                .map(str::to_string),
        ),
        None => {}
    }
    fields
}

/// Chooses the cheapest path that gives the same answer for this probe.
fn choose_path(
    probe: &Probe,
    fields: &[&str],
    features: &Features,
    nkfuncs: KfuncCount,
) -> Result<Path, Error> {
    Ok(match &probe.kind {
        ProbeKind::Tracepoint {
            subsys,
            event,
            syscall,
        } => tracepoint_path(probe, (subsys, event), *syscall, fields, features),
        ProbeKind::Uprobe {
            binary,
            offset,
            ret,
            ..
        } => Path::Uprobe {
            binary: binary.clone(),
            offset: *offset,
            ret: *ret,
        },
        ProbeKind::Usdt {
            binary,
            provider,
            name,
            ..
        } => Path::Usdt {
            binary: binary.clone(),
            provider: provider.clone(),
            name: name.clone(),
        },
        ProbeKind::Kfunc { .. } => return kfunc_path(probe, features, nkfuncs),
    })
}

/// A tracepoint's path: the shared syscall raw_tp while every field is an
/// argument, raw_tp with a cookie when no field is read, else the classic
/// tracepoint with its record.
fn tracepoint_path(
    probe: &Probe,
    (subsys, event): (&str, &str),
    syscall: Option<SyscallTp>,
    fields: &[&str],
    features: &Features,
) -> Path {
    let classic = Path::Tracepoint {
        subsys: subsys.to_string(),
        event: event.to_string(),
    };
    if let Some(sc) = syscall {
        if features.classic_syscalls.get() {
            return classic;
        }
        // Every syscall field maps to an argument slot when it is a plain argument.
        let all_args = fields
            .iter()
            .all(|f| probe.field(f).is_some_and(|f| f.arg_slot.is_some()));
        return if all_args { Path::Syscall(sc) } else { classic };
    }
    // raw_tp sees the tracepoint's arguments, not the record, so it only
    // serves probes that need no record field.
    if fields.is_empty() && features.raw_tp_cookie && features.has_raw_tp(event) {
        return Path::RawTp {
            name: event.to_string(),
        };
    }
    classic
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::super::sides::sides;
    use super::super::{Action, PlanConfig};
    use super::*;
    use std::path::PathBuf;

    fn path_of(s: &PlanConfig, p: Probe, f: &Features) -> Path {
        let probes = plain(vec![p]);
        let sides = sides(s, &probes).unwrap();
        paths(&probes, &sides, f).unwrap().remove(0)
    }

    fn classic(event: &str) -> Path {
        Path::Tracepoint {
            subsys: "sched".into(),
            event: event.into(),
        }
    }

    const OPENAT: Path = Path::Syscall(SyscallTp {
        nr: 257,
        exit: false,
    });

    #[test]
    fn syscalls_stay_on_the_shared_raw_tp_while_arguments_do() {
        let by = |keys: &[&str]| {
            path_of(
                &config(Action::Count, keys, None),
                sys_enter_openat(),
                &features(),
            )
        };
        assert_eq!(by(&["comm", "pid"]), OPENAT);
        assert_eq!(by(&["filename", "flags"]), OPENAT);
        assert_eq!(by(&["args.mode"]), OPENAT);
        // A member path is no plain argument: the record.
        assert_eq!(
            by(&["filename->x"]),
            Path::Tracepoint {
                subsys: "syscalls".into(),
                event: "sys_enter_openat".into()
            }
        );
        let all = path_of(
            &config(trace(&[]), &[], None),
            sys_enter_write(),
            &features(),
        );
        assert_eq!(all, Path::Syscall(SyscallTp { nr: 1, exit: false }));
    }

    #[test]
    fn raw_tp_when_no_record_field_is_read() {
        let count = |keys: &[&str], filter, f: &Features| {
            path_of(&config(Action::Count, keys, filter), sched_switch(), f)
        };
        let raw = Path::RawTp {
            name: "sched_switch".into(),
        };
        assert_eq!(count(&["comm", "kstack"], None, &features()), raw);
        assert_eq!(
            count(&["next_pid"], None, &features()),
            classic("sched_switch")
        );
        assert_eq!(
            count(&[], Some("prev_prio > 1"), &features()),
            classic("sched_switch")
        );
        // No raw_tp cookies: the classic tracepoint.
        assert_eq!(
            count(&["comm"], None, &locked_down()),
            classic("sched_switch")
        );
        let value = path_of(
            &config(hist("prev_state"), &[], None),
            sched_switch(),
            &features(),
        );
        assert_eq!(value, classic("sched_switch"));
    }

    #[test]
    fn uprobes_and_usdt_have_one_path() {
        let p = path_of(
            &config(Action::Count, &["arg1"], None),
            uprobe("work", 0x40),
            &features(),
        );
        assert_eq!(
            p,
            Path::Uprobe {
                binary: PathBuf::from(DEMO),
                offset: 0x40,
                ret: false
            }
        );
        let usdt = Probe {
            name: "usdt:x".into(),
            kind: ProbeKind::Usdt {
                binary: PathBuf::from(DEMO),
                provider: "app".into(),
                name: "tick".into(),
                semaphore: false,
            },
            fields: Vec::new(),
        };
        assert_eq!(
            path_of(&config(Action::Count, &[], None), usdt, &features()),
            Path::Usdt {
                binary: PathBuf::from(DEMO),
                provider: "app".into(),
                name: "tick".into()
            }
        );
    }

    #[test]
    fn fields_read_per_role() {
        let end = Some(tp_spec("sched", "sched_switch"));
        let s = config(
            latency(end, &["pid=next_pid"]),
            &["comm", "prev_comm"],
            None,
        );
        let probes = start_end(vec![sched_wakeup()], vec![sched_switch()]);
        let sides = sides(&s, &probes).unwrap();
        // comm is the builtin, read at the start; the wakeup's `pid` field
        // pairs it. The switch reads prev_comm and pairs on next_pid.
        assert_eq!(fields_read(&probes[0].0, probes[0].1, &sides), ["pid"]);
        assert_eq!(
            fields_read(&probes[1].0, probes[1].1, &sides),
            ["prev_comm", "next_pid"]
        );
        let all = paths(&probes, &sides, &features()).unwrap();
        assert_eq!(all, [classic("sched_wakeup"), classic("sched_switch")]);
    }

    #[test]
    fn sched_fields_copied_from_tasks_take_the_raw_tp() {
        let mut f = features();
        f.sched_via_tasks = true;
        let raw = |e: &str| Path::RawTp { name: e.into() };
        let count = |keys: &[&str], filter, f: &Features| {
            path_of(&config(Action::Count, keys, filter), sched_switch(), f)
        };
        assert_eq!(
            count(&["next_pid", "prev_comm"], None, &f),
            raw("sched_switch")
        );
        assert_eq!(
            count(&["comm"], Some("prev_prio > 120"), &f),
            raw("sched_switch")
        );
        // prev_state is computed, not copied: the record.
        assert_eq!(count(&["prev_state"], None, &f), classic("sched_switch"));
        let value = path_of(
            &config(hist("prev_prio"), &["next_comm"], None),
            sched_switch(),
            &f,
        );
        assert_eq!(value, raw("sched_switch"));
        // Without the feature (the general path asked for): the record.
        assert_eq!(
            count(&["next_pid"], None, &features()),
            classic("sched_switch")
        );
        // runqlat's pair: both ends.
        let end = Some(tp_spec("sched", "sched_switch"));
        let s = config(latency(end, &["pid=next_pid"]), &["comm"], None);
        let probes = start_end(vec![sched_wakeup()], vec![sched_switch()]);
        let sides = sides(&s, &probes).unwrap();
        let all = paths(&probes, &sides, &f).unwrap();
        assert_eq!(all, [raw("sched_wakeup"), raw("sched_switch")]);
        // A script's probe: its compiler chooses (script::jit::typed).
        assert_eq!(
            path_for(&sched_switch(), &["next_pid"], &f).unwrap(),
            classic("sched_switch")
        );
    }

    #[test]
    fn all_fields_of_a_trace_but_unsupported_ones() {
        let mut p = sched_switch();
        p.fields[0].kind = FieldKind::Unsupported;
        let s = config(trace(&[]), &[], None);
        let sides = sides(&s, &plain(vec![p.clone()])).unwrap();
        let read = fields_read(&p, Role::Plain, &sides);
        assert_eq!(read.len(), p.fields.len() - 1);
        assert!(!read.contains(&"prev_comm".to_string()));
    }
}
