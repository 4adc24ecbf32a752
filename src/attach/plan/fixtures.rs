//! Synthetic probes and settings for the planner's tests: what the probe
//! stage would resolve on an x86-64 kernel, made from format text and
//! fixed fields, so that no test needs tracefs, BTF or privileges.

use std::path::PathBuf;

use super::{Action, Buckets, Plan, PlanConfig, Role};
use crate::attach::features::{Features, Template};
use crate::filter;
use crate::probe::spec::{KfuncKind, ProbeSpec};
use crate::probe::{self, tracefs, Field, FieldKind, Probe, ProbeKind};

const SCHED_SWITCH: &str = "\
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;
\tfield:char prev_comm[16];\toffset:8;\tsize:16;\tsigned:0;
\tfield:pid_t prev_pid;\toffset:24;\tsize:4;\tsigned:1;
\tfield:int prev_prio;\toffset:28;\tsize:4;\tsigned:1;
\tfield:long prev_state;\toffset:32;\tsize:8;\tsigned:1;
\tfield:char next_comm[16];\toffset:40;\tsize:16;\tsigned:0;
\tfield:pid_t next_pid;\toffset:56;\tsize:4;\tsigned:1;
\tfield:int next_prio;\toffset:60;\tsize:4;\tsigned:1;
";

const SCHED_WAKEUP: &str = "\
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:char comm[16];\toffset:8;\tsize:16;\tsigned:0;
\tfield:pid_t pid;\toffset:24;\tsize:4;\tsigned:1;
\tfield:int prio;\toffset:28;\tsize:4;\tsigned:1;
\tfield:int target_cpu;\toffset:32;\tsize:4;\tsigned:1;
";

const SCHED_PROCESS_EXEC: &str = "\
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:__data_loc char[] filename;\toffset:8;\tsize:4;\tsigned:0;
\tfield:pid_t pid;\toffset:12;\tsize:4;\tsigned:1;
\tfield:pid_t old_pid;\toffset:16;\tsize:4;\tsigned:1;
";

const SYS_ENTER_OPENAT: &str = "\
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:int __syscall_nr;\toffset:8;\tsize:4;\tsigned:1;
\tfield:int dfd;\toffset:16;\tsize:8;\tsigned:0;
\tfield:const char * filename;\toffset:24;\tsize:8;\tsigned:0;
\tfield:int flags;\toffset:32;\tsize:8;\tsigned:0;
\tfield:umode_t mode;\toffset:40;\tsize:8;\tsigned:0;
";

const SYS_ENTER_WRITE: &str = "\
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:int __syscall_nr;\toffset:8;\tsize:4;\tsigned:1;
\tfield:unsigned int fd;\toffset:16;\tsize:8;\tsigned:0;
\tfield:const char * buf;\toffset:24;\tsize:8;\tsigned:0;
\tfield:size_t count;\toffset:32;\tsize:8;\tsigned:0;
";

const SYS_EXIT_READ: &str = "\
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:int __syscall_nr;\toffset:8;\tsize:4;\tsigned:1;
\tfield:long ret;\toffset:16;\tsize:8;\tsigned:1;
";

/// A tracepoint probe as the probe stage makes it from this format text.
pub fn tracepoint(subsys: &str, event: &str, format: &str) -> Probe {
    probe::tracepoint_of(subsys, event, tracefs::parse_format(format))
}

/// sched:sched_switch: inline strings and ints, no argument slots.
pub fn sched_switch() -> Probe {
    tracepoint("sched", "sched_switch", SCHED_SWITCH)
}

/// sched:sched_wakeup: has fields named `comm` and `pid`, like builtins.
pub fn sched_wakeup() -> Probe {
    tracepoint("sched", "sched_wakeup", SCHED_WAKEUP)
}

/// sched:sched_process_exec: a `__data_loc` string, and a `pid` field.
pub fn sched_process_exec() -> Probe {
    tracepoint("sched", "sched_process_exec", SCHED_PROCESS_EXEC)
}

/// syscalls:sys_enter_openat: a syscall (number 257) with a user string.
pub fn sys_enter_openat() -> Probe {
    tracepoint("syscalls", "sys_enter_openat", SYS_ENTER_OPENAT)
}

/// syscalls:sys_enter_write: a user buffer followed by its length.
pub fn sys_enter_write() -> Probe {
    tracepoint("syscalls", "sys_enter_write", SYS_ENTER_WRITE)
}

/// syscalls:sys_exit_read: a syscall return.
pub fn sys_exit_read() -> Probe {
    tracepoint("syscalls", "sys_exit_read", SYS_EXIT_READ)
}

pub const DEMO: &str = "/usr/local/bin/demo";

/// uprobe on a function of a binary, at its file offset.
pub fn uprobe(func: &str, offset: u64) -> Probe {
    Probe {
        name: format!("uprobe:{DEMO}:{func}"),
        kind: ProbeKind::Uprobe {
            binary: PathBuf::from(DEMO),
            func: func.to_string(),
            offset,
            ret: false,
            entry: true,
        },
        fields: probe::user_fields(false),
    }
}

/// A kernel function probe with untyped arguments (arg0..arg5, retval at
/// returns), a BTF id when `btf_id` is given, and a named pointer `file`
/// that carries a BTF type (entries only).
pub fn kfunc(func: &str, kind: KfuncKind, btf_id: Option<u32>, kprobe_ok: bool) -> Probe {
    let ret = kind.is_ret();
    let mut fields = probe::user_fields(ret);
    if !ret {
        fields.push(Field {
            name: "file".into(),
            ctype: "struct file *".into(),
            kind: FieldKind::Pointer,
            offset: 0,
            size: 8,
            array_bytes: 0,
            signed: false,
            arg_slot: Some(0),
            btf: Some(77),
        });
    }
    Probe {
        name: format!("{}:{func}", kind.prefix()),
        kind: ProbeKind::Kfunc {
            func: func.to_string(),
            module: None,
            offset: 0,
            kind,
            sig: btf_id.map(|func_id| probe::btf::FuncSig {
                func_id,
                ret: 0,
                params: Vec::new(),
            }),
            signature: None,
            kprobe_ok,
        },
        fields,
    }
}

/// A kernel that offers everything: raw_tp cookies for the sched events,
/// fentry (template vfs_read), kprobes, kprobe_multi and uprobe_multi.
pub fn features() -> Features {
    Features::assumed(
        &["sched_switch", "sched_wakeup", "sched_process_exec"],
        Ok(Template {
            func: "vfs_read".into(),
            btf_id: 1000,
        }),
        Ok(()),
        true,
        true,
    )
}

/// A kernel with lockdown: no fentry, no kprobes, no raw_tp cookies.
pub fn locked_down() -> Features {
    Features::assumed(
        &[],
        Err("lockdown".into()),
        Err("lockdown".into()),
        false,
        false,
    )
}

/// Settings for an action, `--by` keys and a `--filter`.
pub fn config(action: Action, keys: &[&str], filter: Option<&str>) -> PlanConfig {
    PlanConfig {
        action,
        probes: Vec::new(),
        keys: keys.iter().map(|k| k.to_string()).collect(),
        filter: filter.map(|f| filter::parse(f).expect("test filter parses")),
    }
}

pub fn hist(value: &str) -> Action {
    Action::Hist {
        value: value.into(),
        buckets: Buckets::Log2,
    }
}

pub fn trace(fields: &[&str]) -> Action {
    Action::Trace {
        fields: fields.iter().map(|f| f.to_string()).collect(),
    }
}

/// Latency of a function (END: None) or from START to END `--match`ing
/// these fields.
pub fn latency(end: Option<ProbeSpec>, matching: &[&str]) -> Action {
    Action::Latency {
        buckets: Buckets::Log2,
        end,
        matching: matching.iter().map(|m| m.to_string()).collect(),
    }
}

/// Probes that each count on their own.
pub fn plain(probes: Vec<Probe>) -> Vec<(Probe, Role)> {
    probes.into_iter().map(|p| (p, Role::Plain)).collect()
}

/// A function's entry and return, paired as the trace command pairs them.
pub fn entry_and_return(entries: Vec<Probe>) -> Vec<(Probe, Role)> {
    let mut out = Vec::new();
    for (i, p) in entries.into_iter().enumerate() {
        let ret = probe::returning(&p).expect("an entry probe");
        out.push((p, Role::Start(i as u32)));
        out.push((ret, Role::End(i as u32)));
    }
    out
}

/// START probes and END probes of one pair.
pub fn start_end(starts: Vec<Probe>, ends: Vec<Probe>) -> Vec<(Probe, Role)> {
    let mut out: Vec<(Probe, Role)> = starts.into_iter().map(|p| (p, Role::Start(0))).collect();
    out.extend(ends.into_iter().map(|p| (p, Role::End(0))));
    out
}

/// The plan of `latency` from sched_wakeup to sched_switch, `--match`ing
/// these fields, keyed by `keys`.
pub fn wakeup_to_switch(matching: &[&str], keys: &[&str]) -> Plan {
    let s = config(
        latency(Some(tp_spec("sched", "sched_switch")), matching),
        keys,
        None,
    );
    let probes = start_end(vec![sched_wakeup()], vec![sched_switch()]);
    super::build(&s, probes, &features()).expect("the wakeup-to-switch plan builds")
}

pub fn tp_spec(subsys: &str, event: &str) -> ProbeSpec {
    ProbeSpec::Tracepoint {
        subsys: subsys.into(),
        event: event.into(),
    }
}
