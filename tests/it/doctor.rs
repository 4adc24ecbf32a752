//! `bpfscope doctor` against the kernel it runs on: every feature has a
//! line, each verdict agrees with the kernel's version and lockdown mode,
//! and with what the commands themselves then do here (a kernel function
//! probe it calls refused is refused; unwinding it calls limited does not
//! reach main).

use std::collections::HashMap;

use crate::common::*;

const FEATURES: &[&str] = &[
    "tracing",
    "uprobes",
    "kfunc",
    "profiling",
    "unwinding",
    "python",
    "bpf",
    "agent",
];

/// The kernel's (major, minor).
fn kernel() -> (u32, u32) {
    let r = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut it = r.trim().split(|c: char| !c.is_ascii_digit());
    (
        it.next().unwrap().parse().unwrap(),
        it.next().unwrap().parse().unwrap(),
    )
}

/// The lockdown mode in force (securityfs mounted for the moment if it is not).
fn lockdown() -> Option<String> {
    const FILE: &str = "/sys/kernel/security/lockdown";
    let s = match std::fs::read_to_string(FILE) {
        Ok(s) => s,
        Err(_) => {
            let mounted = std::process::Command::new("mount")
                .args(["-t", "securityfs", "securityfs", "/sys/kernel/security"])
                .status()
                .is_ok_and(|s| s.success());
            let s = std::fs::read_to_string(FILE).ok();
            if mounted {
                let _ = std::process::Command::new("umount")
                    .arg("/sys/kernel/security")
                    .status();
            }
            s?
        }
    };
    let start = s.find('[')? + 1;
    let end = s[start..].find(']')? + start;
    Some(s[start..end].to_string()).filter(|m| m != "none")
}

#[test]
#[ignore = "needs root and BPF"]
fn every_verdict_agrees_with_the_kernel_and_the_commands() {
    require_root();
    let o = run(&["doctor", "--json"]);
    let out = ok(&o);
    let lines = json_lines(&out);
    let machine = &lines[0];
    assert_eq!(machine["type"], "machine", "{out}");
    assert_eq!(machine["arch"], std::env::consts::ARCH, "{out}");
    let status: HashMap<String, (String, String)> = lines[1..]
        .iter()
        .map(|l| {
            assert_eq!(l["type"], "check", "{l}");
            let s = l["status"].as_str().unwrap().to_string();
            assert!(["ok", "limited", "no"].contains(&s.as_str()), "{l}");
            assert!(!l["detail"].as_str().unwrap().is_empty(), "{l}");
            (
                l["feature"].as_str().unwrap().to_string(),
                (s, l["detail"].as_str().unwrap().to_string()),
            )
        })
        .collect();
    let names: Vec<&str> = lines[1..]
        .iter()
        .map(|l| l["feature"].as_str().unwrap())
        .collect();
    assert_eq!(names, FEATURES, "{out}");
    let st = |f: &str| status[f].0.as_str();

    // What the kernel's version says (the README's Requirements).
    let k = kernel();
    assert_eq!(
        st("tracing"),
        if k >= (6, 10) { "ok" } else { "limited" },
        "raw tracepoint cookies came in 6.10: {out}"
    );
    assert_eq!(
        st("uprobes"),
        if k >= (6, 6) { "ok" } else { "limited" },
        "uprobe_multi came in 6.6: {out}"
    );
    assert_eq!(
        st("unwinding"),
        if k >= (6, 7) { "ok" } else { "limited" },
        "the task_vma iterator came in 6.7: {out}"
    );
    assert_eq!(st("profiling"), "ok", "{out}");
    assert_eq!(st("python"), st("unwinding"), "{out}");
    assert_eq!(st("agent"), "ok", "{out}");
    assert_eq!(machine["lockdown"].as_str().map(str::to_string), lockdown());
    if lockdown().is_some() {
        assert_eq!(
            st("kfunc"),
            "no",
            "lockdown refuses kprobes and fentry: {out}"
        );
        assert!(status["kfunc"].1.contains("lockdown"), "{out}");
    } else {
        assert_ne!(st("kfunc"), "no", "{out}");
    }

    // What the commands then do.
    let w = workload("writer");
    let probe = run(&[
        "count",
        "kprobe:ksys_write",
        "--json",
        "--",
        w.to_str().unwrap(),
        "doctor_w",
        "3",
        "1",
    ]);
    if st("kfunc") == "no" {
        assert_eq!(probe.status.code(), Some(2), "{}", stderr(&probe));
    } else {
        let n = sum_counts(&json_lines(&ok(&probe)));
        assert!(
            n >= 3,
            "doctor says kernel functions work, yet kprobe:ksys_write counted {n}"
        );
    }
    let nofp = workload_with("nofp", &["-O2", "-fomit-frame-pointer"]);
    let dir = scratch_dir("doctor-unwind");
    let folded_path = dir.join("p.folded");
    ok(&run(&[
        "profile",
        "-F",
        "499",
        "-o",
        folded_path.to_str().unwrap(),
        "--",
        nofp.to_str().unwrap(),
        "chain",
        "doctor_chain",
        "1",
    ]));
    let lines = folded(&folded_path);
    let total = root_weight(&lines, "doctor_chain");
    let whole = weight_with(
        &lines,
        "doctor_chain",
        &["main", "via_a", "via_b", "hot_leaf"],
    );
    assert!(total > 50, "too few samples: {total}");
    if st("unwinding") == "ok" {
        assert!(
            whole * 10 >= total * 9,
            "doctor says unwinding works: {whole} of {total} stacks whole"
        );
    } else {
        assert!(
            whole * 10 < total,
            "doctor says unwinding is limited, yet {whole} of {total} stacks are whole"
        );
    }
}

#[test]
#[ignore = "needs root and BPF"]
fn quick_checks_run_nothing_and_agree() {
    require_root();
    let full = json_lines(&ok(&run(&["doctor", "--json"])));
    let quick = json_lines(&ok(&run(&["doctor", "--json", "--quick"])));
    let statuses = |v: &[serde_json::Value]| -> Vec<(String, String)> {
        v[1..]
            .iter()
            .map(|l| (l["feature"].to_string(), l["status"].to_string()))
            .collect()
    };
    assert_eq!(statuses(&full), statuses(&quick));
    // The text report: a heading line and one line per feature.
    let text = ok(&run(&["doctor", "--quick"]));
    assert!(text.starts_with("bpfscope doctor: Linux "), "{text}");
    assert_eq!(text.lines().count(), 1 + FEATURES.len(), "{text}");
}

#[test]
fn bad_input_is_one_line_and_exit_2() {
    let o = run(&["doctor", "--no-such-option"]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(stderr(&o).lines().count(), 1, "{}", stderr(&o));
}
