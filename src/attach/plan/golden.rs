//! Golden files for the planner: synthetic probes and settings in, the
//! plan out as text (each probe's path and the `bs_probe_cfg` fields the
//! BPF programs read), compared with `tests/golden/plan/NAME.txt`.
//! `BLESS=1 cargo test --lib golden` rewrites the files after a deliberate
//! change; read the diff before committing it.

use std::fmt::Write;

use super::fixtures::*;
use super::{build, Action, Buckets, Path, Plan, PlanConfig, PlannedProbe, Role, Slot, ValueKind};
use crate::attach::features::Features;
use crate::probe::{Probe, ProbeSpec};
use bpfscope_bpf::abi::{
    bs_agg, bs_cfg_flags, bs_filter_op, bs_limits, bs_op, bs_probe_cfg, bs_src,
};
use bpfscope_sys::pod;

/// The name of a source, its type, and where a walk or buffer length goes.
pub fn src(s: &bs_src) -> String {
    let from = match s.kind {
        0 => "none".to_string(),
        1 => "probe".into(),
        2 => "comm".into(),
        3 => "pid".into(),
        4 => "tid".into(),
        5 => "cpu".into(),
        6 => "uid".into(),
        7 => "cgroup".into(),
        8 => format!("ctx+{}", s.off),
        9 => match u32::from(s.off) {
            n if n == bs_limits::BS_ARG_RET.0 => "arg.ret".into(),
            n if n == bs_limits::BS_ARG_NR.0 => "arg.nr".into(),
            n => format!("arg{n}"),
        },
        10 => "kstack".into(),
        11 => "ustack".into(),
        k => format!("kind{k}"),
    };
    let sign = if s.is_signed != 0 { "s" } else { "u" };
    let ty = match s.r#type {
        0 => format!("{sign}{}", u32::from(s.size) * 8),
        1 => format!("char[{}]", s.size),
        2 => "data_loc".into(),
        3 => "ustr".into(),
        4 => "kstr".into(),
        5 => format!("ubuf(len {})", s.path[0]),
        t => format!("type{t}"),
    };
    let mut out = format!("{from} {ty}");
    if s.r#type != 0 && s.is_signed != 0 {
        out.push_str(" signed");
    }
    if s.walk != 0 {
        let steps = &s.path[..usize::from(s.nderef)];
        let _ = write!(out, " walk {steps:?}+{}", s.leaf_off);
    }
    if s.task != 0 {
        let _ = write!(out, " task member {}", s.task);
    }
    out
}

fn op(o: &bs_filter_op, strs: &[String]) -> String {
    let name = match bs_op(u32::from(o.op)) {
        bs_op::BS_OP_EQ => "==",
        bs_op::BS_OP_NE => "!=",
        bs_op::BS_OP_LT => "<",
        bs_op::BS_OP_LE => "<=",
        bs_op::BS_OP_GT => ">",
        bs_op::BS_OP_GE => ">=",
        bs_op::BS_OP_STR_EQ => "str==",
        bs_op::BS_OP_STR_NE => "str!=",
        bs_op::BS_OP_GLOB => "glob",
        bs_op::BS_OP_NGLOB => "!glob",
        bs_op::BS_OP_AND => return "and".into(),
        bs_op::BS_OP_OR => return "or".into(),
        _ => return format!("op{}", o.op),
    };
    let rhs = if o.op >= bs_op::BS_OP_STR_EQ.0 as u8 {
        format!(
            "{:?}",
            strs.get(o.str_idx as usize).map_or("?", |s| s.as_str())
        )
    } else if o.src.is_signed != 0 {
        (o.imm as i64).to_string()
    } else {
        o.imm.to_string()
    };
    format!("{} {name} {rhs}", src(&o.src))
}

fn kind(k: ValueKind) -> String {
    match k {
        ValueKind::Probe => "probe".into(),
        ValueKind::Cgroup => "cgroup".into(),
        ValueKind::Int { signed: true } => "int".into(),
        ValueKind::Int { signed: false } => "uint".into(),
        ValueKind::Hex => "hex".into(),
        ValueKind::Str => "str".into(),
        ValueKind::Buf => "buf".into(),
        ValueKind::Stack { user: false } => "kstack".into(),
        ValueKind::Stack { user: true } => "ustack".into(),
    }
}

fn slot(s: &Slot) -> String {
    format!("{} {} @{}+{}", s.name, kind(s.kind), s.off, s.len)
}

pub fn path(p: &Path) -> String {
    let what = match p {
        Path::Syscall(sc) => format!(
            "syscall {} {}",
            sc.nr,
            if sc.exit { "exit" } else { "enter" }
        ),
        Path::RawTp { name } => format!("raw_tp {name}"),
        Path::Trigger => "trigger".to_string(),
        Path::Clock { hz, cpu } => format!("clock {hz} Hz cpu {cpu:?}"),
        Path::Perf { ty, config, period } => format!("perf event {ty}:{config} every {period}"),
        Path::Tracepoint { subsys, event } => format!("tracepoint {subsys}:{event}"),
        Path::Uprobe {
            binary,
            offset,
            ret,
        } => format!(
            "{} {}+{offset:#x}",
            if *ret { "uretprobe" } else { "uprobe" },
            binary.display()
        ),
        Path::Usdt {
            binary,
            provider,
            name,
        } => format!("usdt {}:{provider}:{name}", binary.display()),
        Path::Kfunc(k) => {
            let mut s = format!("kfunc {} {:?}", k.func, k.mech);
            if let Some(fb) = k.fallback {
                let _ = write!(s, ", fallback {fb:?}");
            }
            if let Some(id) = k.btf_id {
                let _ = write!(s, ", btf {id}");
            }
            if let Some(why) = &k.unavailable {
                let _ = write!(s, ", unavailable: {why}");
            }
            s
        }
    };
    format!("{what} ({})", p.describe())
}

fn flags(f: u32) -> String {
    let names = [
        (bs_cfg_flags::BS_CFG_NEED_ARGS, "need_args"),
        (bs_cfg_flags::BS_CFG_LAT_START, "lat_start"),
        (bs_cfg_flags::BS_CFG_LAT_END, "lat_end"),
        (bs_cfg_flags::BS_CFG_SAME_TASK, "same_task"),
    ];
    let mut out: Vec<String> = names
        .iter()
        .filter(|(bit, _)| f & bit.0 != 0)
        .map(|(_, n)| n.to_string())
        .collect();
    let rest = names.iter().fold(f, |f, (bit, _)| f & !bit.0);
    if rest != 0 {
        out.push(format!("{rest:#x}"));
    }
    if out.is_empty() {
        "-".into()
    } else {
        out.join(" ")
    }
}

fn agg(a: u8) -> String {
    match bs_agg(u32::from(a)) {
        bs_agg::BS_AGG_COUNT => "count".into(),
        bs_agg::BS_AGG_STATS => "stats".into(),
        bs_agg::BS_AGG_HIST_LOG2 => "hist log2".into(),
        bs_agg::BS_AGG_HIST_LINEAR => "hist linear".into(),
        bs_agg::BS_AGG_EVENT => "event".into(),
        bs_agg::BS_AGG_HIST_POW2 => "hist pow2".into(),
        bs_agg::BS_AGG_STATS_SIGN => "stats by sign".into(),
        _ => format!("agg{a}"),
    }
}

fn role(r: Role) -> String {
    match r {
        Role::Plain => "plain".into(),
        Role::Start(p) => format!("start of pair {p}"),
        Role::End(p) => format!("end of pair {p}"),
    }
}

/// One probe: its path and every configuration field the programs read.
/// Entries past the counts must be empty: what is not shown is not there.
fn probe(out: &mut String, i: usize, p: &PlannedProbe, strs: &[String]) {
    let c = &p.cfg;
    let _ = writeln!(out, "probe {i}: {} ({})", p.probe.name, role(p.role));
    let _ = writeln!(out, "  path: {}", path(&p.path));
    let _ = writeln!(out, "  flags: {}", flags(c.flags));
    if c.nargs != 0 {
        let _ = writeln!(out, "  arguments copied: {}", c.nargs);
    }
    let _ = writeln!(out, "  agg: {}", agg(c.agg));
    if c.lin_nbuckets != 0 || c.lin_step != 0 || c.lin_min != 0 {
        let _ = writeln!(
            out,
            "  linear: min {} step {} buckets {}",
            c.lin_min, c.lin_step, c.lin_nbuckets
        );
    }
    for k in &c.keys[..usize::from(c.nkeys)] {
        let _ = writeln!(out, "  key: {} -> @{}", src(k), k.out_off);
    }
    if c.value.kind != 0 {
        let _ = writeln!(out, "  value: {}", src(&c.value));
    }
    if c.pair != 0 || c.nmatch != 0 {
        let _ = writeln!(out, "  pair: {}", c.pair);
    }
    for m in &c.r#match[..usize::from(c.nmatch)] {
        let _ = writeln!(out, "  match: {}", src(m));
    }
    for o in &c.filter[..usize::from(c.nfilter)] {
        let _ = writeln!(out, "  filter: {}", op(o, strs));
    }
    if c.nemit != 0 || c.event_size != 0 {
        let _ = writeln!(out, "  event: {} bytes", c.event_size);
    }
    for (e, s) in c.emit[..usize::from(c.nemit)].iter().zip(&p.event) {
        let _ = writeln!(out, "    {} <- {} -> @{}", slot(s), src(e), e.out_off);
    }
    assert!(
        pod::bytes(&shown(c)) == pod::bytes(c),
        "{}: the configuration has more than the text shows",
        p.probe.name
    );
    assert_eq!(p.event.len(), usize::from(c.nemit), "event slots and emits");
}

/// The configuration with only what `probe` shows of it: equal to the
/// original when nothing is left out.
fn shown(c: &bs_probe_cfg) -> bs_probe_cfg {
    let mut s = bs_probe_cfg {
        flags: c.flags,
        agg: c.agg,
        nkeys: c.nkeys,
        nfilter: c.nfilter,
        nemit: c.nemit,
        event_size: c.event_size,
        nargs: c.nargs,
        lin_nbuckets: c.lin_nbuckets,
        pair: c.pair,
        nmatch: c.nmatch,
        lin_min: c.lin_min,
        lin_step: c.lin_step,
        ..Default::default()
    };
    if c.value.kind != 0 {
        s.value = c.value;
    }
    let (k, m, f, e) = (
        usize::from(c.nkeys),
        usize::from(c.nmatch),
        usize::from(c.nfilter),
        usize::from(c.nemit),
    );
    s.keys[..k].copy_from_slice(&c.keys[..k]);
    s.r#match[..m].copy_from_slice(&c.r#match[..m]);
    s.filter[..f].copy_from_slice(&c.filter[..f]);
    s.emit[..e].copy_from_slice(&c.emit[..e]);
    s
}

/// The plan as stable text.
pub fn render(plan: &Plan) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "key: {} bytes", plan.key_size);
    for k in &plan.keys {
        let _ = writeln!(out, "  {}", slot(k));
    }
    match &plan.value {
        Some((name, signed)) => {
            let _ = writeln!(
                out,
                "value: {name} ({})",
                if *signed { "signed" } else { "unsigned" }
            );
        }
        None => out.push_str("value: -\n"),
    }
    let _ = writeln!(out, "latency: {}", if plan.latency { "yes" } else { "no" });
    let _ = writeln!(
        out,
        "most: filter {}, keys {}, emit {}",
        plan.max_filter, plan.max_keys, plan.max_emit
    );
    let _ = writeln!(out, "strs: {:?}", plan.strs.strs);
    for (i, p) in plan.probes.iter().enumerate() {
        probe(&mut out, i, p, &plan.strs.strs);
    }
    out
}

fn action(a: &Action) -> String {
    let buckets = |b: &Buckets| match b {
        Buckets::Log2 => String::new(),
        Buckets::Linear {
            min,
            step,
            nbuckets,
        } => format!(" --linear min {min} step {step} buckets {nbuckets}"),
    };
    match a {
        Action::Count => "count".into(),
        Action::Stats { value } => format!("stats --value {value}"),
        Action::Hist { value, buckets: b } => format!("hist --value {value}{}", buckets(b)),
        Action::Trace { fields } if fields.is_empty() => "trace".into(),
        Action::Trace { fields } => format!("trace --fields {}", fields.join(",")),
        Action::Latency {
            buckets: b,
            end,
            matching,
        } => {
            let mut s = format!("latency{}", buckets(b));
            if let Some(ProbeSpec::Tracepoint { subsys, event }) = end {
                let _ = write!(s, " --end tracepoint:{subsys}:{event}");
            }
            if !matching.is_empty() {
                let _ = write!(s, " --match {}", matching.join(","));
            }
            s
        }
    }
}

/// What a case asks, as a header line.
fn header(s: &PlanConfig, probes: &[(Probe, Role)]) -> String {
    let mut h = action(&s.action);
    if !s.keys.is_empty() {
        let _ = write!(h, " --by {}", s.keys.join(","));
    }
    if s.filter.is_some() {
        h.push_str(" --filter ...");
    }
    let starts: Vec<&str> = probes
        .iter()
        .filter(|(_, r)| !matches!(r, Role::End(_)))
        .map(|(p, _)| p.name.as_str())
        .collect();
    let _ = write!(h, " {}", starts.join(" "));
    h
}

/// The plan of a case, or its error, as text.
fn outcome(s: &PlanConfig, probes: Vec<(Probe, Role)>, features: &Features) -> String {
    let head = format!("# {}\n", header(s, &probes));
    match build(s, probes, features) {
        Ok(plan) => head + &render(&plan),
        Err(e) => {
            let e = e.to_string();
            assert!(!e.contains('\n'), "errors are one line: {e}");
            format!("{head}error: {e}\n")
        }
    }
}

/// Compares with (or, with BLESS set, writes) tests/golden/plan/NAME.txt.
fn golden(name: &str, text: &str) {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/plan");
    let path = format!("{dir}/{name}.txt");
    if std::env::var_os("BLESS").is_some() {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(&path, text).unwrap();
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{path}: {e} (BLESS=1 writes it)"));
    assert!(
        want == text,
        "the plan differs from {path}:\n--- want\n{want}\n--- got\n{text}"
    );
}

fn case(name: &str, s: PlanConfig, probes: Vec<(Probe, Role)>) {
    golden(name, &outcome(&s, probes, &features()));
}

#[test]
fn count_by_comm() {
    // sched_switch needs no record field: raw_tp; openat's comm is a builtin: syscall path.
    case(
        "count_by_comm",
        config(Action::Count, &["comm"], None),
        plain(vec![sched_switch(), sys_enter_openat()]),
    );
}

#[test]
fn count_by_fields() {
    // A record field takes sched_switch to the classic tracepoint; a
    // syscall argument keeps openat on the syscall path.
    case(
        "count_by_fields",
        config(Action::Count, &["probe", "filename", "pid"], None),
        plain(vec![sys_enter_openat()]),
    );
    case(
        "count_by_record_field",
        config(Action::Count, &["next_comm", "cpu"], None),
        plain(vec![sched_switch()]),
    );
}

#[test]
fn key_from_two_probes() {
    // One key part, read from a syscall argument and from a record string.
    case(
        "key_two_probes",
        config(Action::Count, &["filename"], None),
        plain(vec![sys_enter_openat(), sched_process_exec()]),
    );
}

#[test]
fn hist_linear() {
    let action = Action::Hist {
        value: "ret".into(),
        buckets: Buckets::Linear {
            min: -10,
            step: 5,
            nbuckets: 8,
        },
    };
    case(
        "hist_linear",
        config(action, &["comm"], None),
        plain(vec![sys_exit_read()]),
    );
}

#[test]
fn hist_log2() {
    case(
        "hist_log2",
        config(hist("prev_state"), &["kstack"], None),
        plain(vec![sched_switch()]),
    );
}

#[test]
fn stats() {
    case(
        "stats",
        config(
            Action::Stats {
                value: "count".into(),
            },
            &["uid", "cgroup"],
            None,
        ),
        plain(vec![sys_enter_write()]),
    );
}

#[test]
fn trace_fields() {
    case(
        "trace_fields",
        config(trace(&["prev_comm", "next_pid", "cpu"]), &[], None),
        plain(vec![sched_switch()]),
    );
    // All fields: write's buf is a buffer of `count` bytes.
    case(
        "trace_all_fields",
        config(trace(&[]), &[], None),
        plain(vec![sys_enter_write(), sched_process_exec()]),
    );
}

#[test]
fn filter_strings_globs_negation() {
    let f = r#"comm == "ba*" && !(filename == "/etc/*" || filename != "/tmp/x") && flags != 0 && !(pid > 100)"#;
    case(
        "filter",
        config(Action::Count, &["comm"], Some(f)),
        plain(vec![sys_enter_openat()]),
    );
    // Record strings on the classic tracepoint, a truthy and its negation.
    let f = r#"prev_comm != "swapper*" && next_prio && !prev_state"#;
    case(
        "filter_record",
        config(Action::Count, &[], Some(f)),
        plain(vec![sched_switch()]),
    );
}

#[test]
fn latency_of_a_function() {
    case(
        "latency_function",
        config(latency(None, &[]), &["comm"], Some("arg0 > 0")),
        entry_and_return(vec![uprobe("work", 0x1130), uprobe("rest", 0x1200)]),
    );
}

#[test]
fn latency_start_end_match() {
    // Wakeup to switch-in of the woken task: `pid` is the wakeup's field
    // (not the waker), `next_pid` the switch's. comm is read at the start.
    let end = tp_spec("sched", "sched_switch");
    case(
        "latency_match",
        config(
            latency(Some(end.clone()), &["pid=next_pid"]),
            &["comm", "prev_comm"],
            Some("prio < 100"),
        ),
        start_end(vec![sched_wakeup()], vec![sched_switch()]),
    );
    // No --match: the thread id.
    case(
        "latency_start_end_tid",
        config(latency(Some(end), &[]), &[], None),
        start_end(vec![sched_wakeup()], vec![sched_switch()]),
    );
}

#[test]
fn key_named_like_a_builtin() {
    // `pid` is the builtin, `args.pid` the field; traced, a field named
    // like a builtin shows as args.NAME.
    case(
        "key_clash",
        config(Action::Count, &["pid", "args.pid", "comm"], None),
        plain(vec![sched_process_exec()]),
    );
    case(
        "key_clash_trace",
        config(trace(&["pid", "args.pid", "filename"]), &[], None),
        plain(vec![sched_process_exec()]),
    );
}

#[test]
fn kernel_functions() {
    let probes = vec![
        kfunc(
            "vfs_read",
            crate::probe::KfuncKind::Kprobe,
            Some(1000),
            true,
        ),
        kfunc("vfs_write", crate::probe::KfuncKind::Kprobe, None, true),
        kfunc(
            "ksys_read",
            crate::probe::KfuncKind::Kretprobe,
            Some(1002),
            false,
        ),
    ];
    case(
        "kfuncs",
        config(Action::Count, &["probe"], Some("pid != 1")),
        plain(probes),
    )
}

/// Settings and probes that cannot be planned, and the error each gives.
#[test]
fn errors() {
    use crate::probe::KfuncKind;
    let end = || Some(tp_spec("sched", "sched_switch"));
    let wakeup_switch = || start_end(vec![sched_wakeup()], vec![sched_switch()]);
    let switch = || plain(vec![sched_switch()]);
    let openat = || plain(vec![sys_enter_openat()]);
    let count = |keys: &[&str], filter| config(Action::Count, keys, filter);
    // A field `filename` that is a number.
    let ints = tracepoint(
        "demo",
        "ints",
        "\tfield:int filename;\toffset:8;\tsize:4;\tsigned:1;\n",
    );
    let many: Vec<String> = (0..17).map(|i| format!("f{i}")).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    let cases = vec![
        // Unknown fields in a key, a filter, a trace list, a value.
        (count(&["nope"], None), switch()),
        (count(&[], Some("nope == 1")), switch()),
        (config(trace(&["next_pid", "nope"]), &[], None), switch()),
        (config(hist("nope"), &[], None), openat()),
        // Strings where numbers are needed, and the other way round.
        (config(hist("filename"), &[], None), openat()),
        (
            config(
                Action::Stats {
                    value: "comm".into(),
                },
                &[],
                None,
            ),
            switch(),
        ),
        (count(&[], Some("comm == 3")), switch()),
        (count(&[], Some("prev_comm")), switch()),
        (count(&[], Some("prev_pid == \"x\"")), switch()),
        // A key of different types in two probes.
        (
            count(&["filename"], None),
            plain(vec![sys_enter_openat(), ints]),
        ),
        // Keys too long.
        (
            count(
                &["comm", "filename", "filename", "filename", "filename"],
                None,
            ),
            openat(),
        ),
        // A match on a string; a match name the end lacks; too many.
        (
            config(latency(end(), &["comm=next_comm"]), &[], None),
            wakeup_switch(),
        ),
        (
            config(latency(end(), &["pid=nope"]), &[], None),
            wakeup_switch(),
        ),
        (
            config(
                latency(end(), &["pid", "tid", "cpu", "uid", "prio"]),
                &[],
                None,
            ),
            wakeup_switch(),
        ),
        // A key neither side has; a filter reading both sides.
        (
            config(latency(end(), &["pid=next_pid"]), &["nope"], None),
            wakeup_switch(),
        ),
        (
            config(
                latency(end(), &["pid=next_pid"]),
                &[],
                Some("prio > 1 && next_prio > 1"),
            ),
            wakeup_switch(),
        ),
        // A member path through a field without a BTF type.
        (count(&["filename->f_path"], None), openat()),
        // More fields to print than an event carries.
        (config(trace(&many), &[], None), switch()),
    ];
    let mut out = String::new();
    for (s, probes) in cases {
        out.push_str(&outcome(&s, probes, &features()));
    }
    // Kernel functions where the kernel refuses fentry and kprobes.
    for kind in [KfuncKind::Fentry, KfuncKind::Kprobe] {
        let probe = kfunc("vfs_read", kind, Some(1000), true);
        out.push_str(&outcome(
            &count(&[], None),
            plain(vec![probe]),
            &locked_down(),
        ));
    }
    golden("errors", &out);
}
