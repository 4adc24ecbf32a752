//! `bpfscope run`, the language: each fix and feature against bpftrace
//! 0.17 side by side, on scripts that compute what they print themselves
//! (BEGIN blocks that end with exit(), or probes on a workload of the
//! test's own), so both tools must print the same bytes. Where bpftrace
//! 0.17 lacks a feature (it came later, or this kernel refuses it), the
//! expected output is written in the test, as bpftrace's documentation
//! gives it.

use std::process::{Command, Output};
use std::time::Duration;

use crate::common::*;

fn have_bpftrace() -> bool {
    Command::new("bpftrace")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// How a tool is given a script: -e, or a file for a long one (an
/// argument holds at most 128 KiB).
fn script_args(script: &str) -> Vec<String> {
    if script.len() < 64 * 1024 {
        return vec!["-e".into(), script.into()];
    }
    let path = scratch_dir(&test_name()).join("script.bt");
    std::fs::write(&path, script).unwrap();
    vec![path.to_string_lossy().into_owned()]
}

/// bpfscope run on `script` with `args` after it and `env`.
fn ours(script: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(bin());
    c.arg("run").args(script_args(script)).args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    run_cmd_timeout(&mut c, Duration::from_secs(120))
}

/// bpftrace on the same; None (after saying SKIP) when it is missing or
/// refuses the script here.
fn theirs(script: &str, args: &[&str], env: &[(&str, &str)]) -> Option<Output> {
    if !have_bpftrace() {
        skip("bpftrace is not installed (scripts/install-deps installs it)");
        return None;
    }
    let mut c = Command::new("bpftrace");
    c.args(script_args(script)).args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    let o = run_cmd_timeout(&mut c, Duration::from_secs(300));
    if !o.status.success() {
        skip(&format!(
            "bpftrace cannot run the script here: {}",
            stderr(&o)
                .lines()
                .filter(|l| !l.contains("RLIMIT_MEMLOCK"))
                .take(2)
                .collect::<Vec<_>>()
                .join(" / ")
        ));
        return None;
    }
    Some(o)
}

/// Both tools on a script that ends itself; their stdout, which must be
/// the same. bpfscope must succeed and say nothing was lost.
fn same(script: &str, args: &[&str], env: &[(&str, &str)]) -> Option<String> {
    let a = ours(script, args, env);
    assert!(a.status.success(), "bpfscope: {}", stderr(&a));
    assert!(!stderr(&a).contains("lost"), "{}", stderr(&a));
    let b = theirs(script, args, env)?;
    assert_eq!(
        stdout(&a),
        stdout(&b),
        "{script}\nbpfscope:\n{}\nbpftrace:\n{}",
        stdout(&a),
        stdout(&b)
    );
    Some(stdout(&a))
}

#[test]
#[ignore = "needs root and BPF"]
fn loops_run_to_their_end() {
    require_root();
    let out = ours(
        "BEGIN { $i = 0; $s = 0; while ($i < 5000) { $s += $i; $i++; } printf(\"s=%d\\n\", $s); exit(); }",
        &[],
        &[],
    );
    assert!(stdout(&out).contains("s=12497500\n"), "{out:?}");
    // A million passes: 5 million steps of the machine, in one run.
    same(
        "BEGIN { $i = 0; $s = 0; while ($i < 1000000) { $s += $i; $i++; } printf(\"s=%d\\n\", $s); @s = $s; exit(); }",
        &[],
        &[],
    );
    same(
        "BEGIN { $i = 0; $s = 0; while ($i < 5000) { $s += $i; $i++; } printf(\"s=%d\\n\", $s); exit(); }",
        &[],
        &[],
    );
}

#[test]
#[ignore = "needs root and BPF"]
fn a_block_of_twenty_thousand_statements_runs_whole() {
    require_root();
    let mut s = String::from("BEGIN { $a = 0;\n");
    for i in 0..20_000 {
        s.push_str(&format!("  $a = $a + {};\n", i % 7));
    }
    s.push_str("  printf(\"a=%d\\n\", $a); @n = $a; exit(); }\n");
    let out = same(&s, &[], &[]);
    if let Some(o) = out {
        assert!(o.contains("a=59997\n"), "{o}");
    }
}

#[test]
#[ignore = "needs root and BPF"]
fn a_run_cut_short_is_said_at_once_with_the_probe_and_the_limit() {
    // Past the 8,388,608 steps one run takes: the warning comes while the
    // script runs (not at its end), and the end counts every such run.
    require_root();
    let mut c = Command::new(bin());
    c.args([
        "run",
        "-e",
        "interval:ms:200 { $i = 0; while ($i < 100000000) { $i++; } @runs = count(); }",
    ]);
    let r = start_cmd(
        c,
        "bpfscope: warning: interval:ms:200: a run was cut short at 8388608 steps",
    );
    std::thread::sleep(Duration::from_millis(700));
    let (out, err) = r.interrupt();
    assert_eq!(err.matches("warning").count(), 1, "{err}");
    assert!(
        err.contains("runs of interval:ms:200 cut short at 8388608 steps"),
        "{err}"
    );
    // Effects before the cut stay; those after it never happen.
    assert!(!out.contains("@runs"), "{out}");
}

#[test]
#[ignore = "needs root and BPF"]
fn each_map_has_its_own_capacity() {
    // A full map does not take the others' room (they shared 10,240 keys
    // before), holds BPFTRACE_MAP_KEYS_MAX keys as bpftrace's does, and is
    // named when it refuses a key.
    require_root();
    let script = "BEGIN { $i = 0; while ($i < 150) { @a[$i] = $i; @c[$i] = count(); $i++; } @b = count(); @n = 7; exit(); }";
    let env = [("BPFTRACE_MAP_KEYS_MAX", "100")];
    let a = ours(script, &[], &env);
    assert!(a.status.success(), "{}", stderr(&a));
    let out = stdout(&a);
    let count = |p: &str| out.lines().filter(|l| l.starts_with(p)).count();
    assert_eq!(count("@a["), 100, "{out}");
    assert_eq!(count("@c["), 100, "{out}");
    assert!(out.contains("@b: 1\n") && out.contains("@n: 7\n"), "{out}");
    let err = stderr(&a);
    assert!(
        err.contains("bpfscope: warning: @a is full (100 keys)")
            && err.contains("bpfscope: warning: @c is full (100 keys)"),
        "{err}"
    );
    assert!(
        err.contains("50 updates of @a (full at 100 keys)")
            && err.contains("50 updates of @c (full at 100 keys)"),
        "{err}"
    );
    if let Some(b) = theirs(script, &[], &env) {
        let theirs = stdout(&b);
        let tcount = |p: &str| theirs.lines().filter(|l| l.starts_with(p)).count();
        assert_eq!(tcount("@a["), 100, "{theirs}");
        assert!(theirs.contains("@b: 1\n"), "{theirs}");
    }
    // The default is bpftrace's 4096: the 4097th key is refused.
    let a = ours(
        "BEGIN { $i = 0; while ($i < 4097) { @a[$i] = 1; $i++; } @b = count(); exit(); }",
        &[],
        &[],
    );
    let out = stdout(&a);
    assert_eq!(out.lines().filter(|l| l.starts_with("@a[")).count(), 4096);
    assert!(out.contains("@b: 1\n"), "{out}");
    assert!(stderr(&a).contains("1 updates of @a (full at 4096 keys)"));
    // A bad value is refused before anything is loaded.
    let a = ours(
        "BEGIN { exit(); }",
        &[],
        &[("BPFTRACE_MAP_KEYS_MAX", "lots")],
    );
    assert_eq!(a.status.code(), Some(2), "{}", stderr(&a));
    assert!(stderr(&a).contains("BPFTRACE_MAP_KEYS_MAX=lots"));
}
