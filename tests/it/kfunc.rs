//! Kernel function probes against the real kernel (run as root): exact
//! counts through fentry and kprobes alike, return values, latency, glob
//! mass-attach, BTF member paths on loopback traffic, listings, bad input.
//!
//! Kernels that refuse kprobes and fentry (lockdown) skip these tests with
//! the reason bpfscope gives; `tests/guest/run-tests` runs them on other
//! kernels booted under QEMU.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::{mpsc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use crate::common::*;

const VIA: &str = "BPFSCOPE_KFUNC_VIA";

/// The tests that probe vfs_read take turns: in a one-vCPU guest,
/// `missed_returns_are_reported` counted 14 missed returns instead of 100
/// while another test attached fexit and kretprobe to vfs_read, and all
/// 100 alone.
static VFS_READ: Mutex<()> = Mutex::new(());

fn vfs_read_turn() -> MutexGuard<'static, ()> {
    VFS_READ.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs bpfscope with extra environment variables, for at most two minutes.
fn run_with_env(env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut c = Command::new(bin());
    c.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        c.env(k, v);
    }
    let child = c.spawn().expect("running bpfscope");
    let pid = child.id() as i32;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(Duration::from_secs(120)) {
        Ok(o) => o.expect("waiting for bpfscope"),
        Err(_) => {
            // SAFETY: kill has no memory-safety preconditions.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("bpfscope {args:?} ({env:?}) did not finish within 120 s");
        }
    }
}

/// Whether bpfscope can attach to kernel functions through `via` (kprobe,
/// fentry, or any) here, asked of bpfscope itself; Err is its one-line reason.
fn support(via: &'static str) -> &'static Result<(), String> {
    static KPROBE: OnceLock<Result<(), String>> = OnceLock::new();
    static FENTRY: OnceLock<Result<(), String>> = OnceLock::new();
    static ANY: OnceLock<Result<(), String>> = OnceLock::new();
    let cell = match via {
        "kprobe" => &KPROBE,
        "fentry" => &FENTRY,
        _ => &ANY,
    };
    cell.get_or_init(|| {
        let env: &[(&str, &str)] = if via == "any" { &[] } else { &[(VIA, via)] };
        let o = run_with_env(env, &["count", "kprobe:vfs_read", "--duration", "0.1"]);
        if o.status.success() {
            Ok(())
        } else {
            Err(stderr(&o).trim().to_string())
        }
    })
}

/// True when the test can run: kernel functions through each of `vias`.
/// Fails when not root (the callers are root tests, asked for).
fn ready(vias: &[&'static str]) -> bool {
    require_root();
    // Built even when skipping: guests running these tests at once share
    // the target directory and must not both build it.
    kfunc_workload();
    for via in vias {
        if let Err(why) = support(via) {
            skip(&format!(
                "kernel functions through {via} are refused here: {why}"
            ));
            return false;
        }
    }
    true
}

fn kfunc_workload() -> PathBuf {
    workload_with("kfunc", &["-static"])
}

/// A file name unique to this test, in the target directory. Guests booted
/// at once share that directory and may hand out the same pids, hence the
/// kernel release in the name.
fn target_file(tag: &str) -> (String, String) {
    let name = format!("kf_{tag}_{}_{}", release_tag(), std::process::id());
    let path = tmp_dir().join(&name);
    (name, path.to_str().unwrap().to_string())
}

/// N of "Attached N probes".
fn attached(err: &str) -> usize {
    err.lines()
        .find_map(|l| l.strip_prefix("Attached ")?.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("{err}"))
}

fn ok_env(env: &[(&str, &str)], args: &[&str]) -> (String, String) {
    let o = run_with_env(env, args);
    assert!(
        o.status.success(),
        "bpfscope {args:?} ({env:?}) failed: {:?}\nstderr: {}",
        o.status,
        stderr(&o)
    );
    (stdout(&o), stderr(&o))
}

#[test]
#[ignore = "needs root and BPF"]
fn kprobe_and_fentry_count_the_same_exact_calls() {
    let _turn = vfs_read_turn();
    if !ready(&["kprobe", "fentry"]) {
        return;
    }
    let w = kfunc_workload();
    let (name, path) = target_file("count");
    let filter = format!(r#"file->f_path.dentry->d_name.name == "{name}""#);
    for (via, mech) in [
        ("fentry", "fentry with cookie"),
        ("kprobe", "kprobe with cookie"),
    ] {
        // System-wide, filtered in the kernel on a BTF member path.
        let (out, err) = ok_env(
            &[(VIA, via)],
            &[
                "count",
                "kprobe:vfs_read",
                "-v",
                "--json",
                "--filter",
                &filter,
                "--",
                w.to_str().unwrap(),
                "read",
                &path,
                "321",
                "10",
            ],
        );
        assert_eq!(sum_counts(&json_lines(&out)), 321, "{via}: {err}");
        assert!(err.contains(&format!("kprobe:vfs_read: {mech}")), "{err}");
        // A syscall's kernel function, counted for the command only.
        let (out, _) = ok_env(
            &[(VIA, via)],
            &[
                "count",
                "kprobe:__do_sys_getppid",
                "--json",
                "--",
                w.to_str().unwrap(),
                "getppid",
                "777",
            ],
        );
        assert_eq!(sum_counts(&json_lines(&out)), 777, "{via}");
    }
    // fentry: asks for fentry only.
    let (out, _) = ok_env(
        &[],
        &[
            "count",
            "fentry:__do_sys_getppid",
            "--json",
            "--",
            w.to_str().unwrap(),
            "getppid",
            "555",
        ],
    );
    assert_eq!(sum_counts(&json_lines(&out)), 555);
}

#[test]
#[ignore = "needs root and BPF"]
fn return_values_through_fexit_and_kretprobe() {
    let _turn = vfs_read_turn();
    if !ready(&["kprobe", "fentry"]) {
        return;
    }
    let w = kfunc_workload();
    let (_, path) = target_file("ret");
    for (via, probe) in [
        ("fentry", "fexit:vfs_read"),
        ("kprobe", "kretprobe:vfs_read"),
        ("fentry", "kretprobe:vfs_read"),
    ] {
        // The static workload's reads are its 200 preads of 37 bytes, and
        // perhaps the 1-byte read of bpfscope's start gate.
        let (out, err) = ok_env(
            &[(VIA, via)],
            &[
                "stats",
                probe,
                "--value",
                "retval",
                "--filter",
                "retval == 37",
                "--json",
                "-v",
                "--",
                w.to_str().unwrap(),
                "read",
                &path,
                "200",
                "37",
            ],
        );
        let lines = json_lines(&out);
        let s = lines
            .iter()
            .find(|v| v["type"] == "stats")
            .unwrap_or_else(|| panic!("{probe} via {via}: {out} {err}"));
        assert_eq!(s["count"], 200, "{probe} via {via}: {err}");
        assert_eq!(s["sum"], 200 * 37, "{probe} via {via}");
        assert_eq!((s["min"].as_i64(), s["max"].as_i64()), (Some(37), Some(37)));
        let mech = if via == "fentry" {
            "fexit"
        } else {
            "kretprobe"
        };
        assert!(err.contains(&format!("{probe}: {mech}")), "{err}");
    }
}

#[test]
#[ignore = "needs root and BPF"]
fn latency_pairs_entries_with_returns() {
    let _turn = vfs_read_turn();
    if !ready(&["kprobe", "fentry"]) {
        return;
    }
    let w = kfunc_workload();
    let (name, path) = target_file("lat");
    let filter = format!(r#"file->f_path.dentry->d_name.name == "{name}""#);
    for via in ["fentry", "kprobe"] {
        let (out, err) = ok_env(
            &[(VIA, via)],
            &[
                "latency",
                "kprobe:vfs_read",
                "--filter",
                &filter,
                "--json",
                "-v",
                "--",
                w.to_str().unwrap(),
                "read",
                &path,
                "150",
                "1",
            ],
        );
        let lines = json_lines(&out);
        let h = lines
            .iter()
            .find(|v| v["type"] == "hist")
            .unwrap_or_else(|| panic!("{via}: {out} {err}"));
        // Every read is timed, or counted as a hit the kernel skipped (an
        // fentry program preempted inside itself on a one-CPU guest makes
        // the next call skip it).
        let missed: u64 = lines
            .iter()
            .filter(|v| v["type"] == "lost" && v["what"] == "missed")
            .filter_map(|v| v["count"].as_u64())
            .sum();
        assert_eq!(
            h["count"].as_u64().unwrap_or(0) + missed,
            150,
            "{via}: {err}{lines:?}"
        );
        assert!(missed <= 3, "{via}: {lines:?}");
        assert_eq!(h["unit"], "ns");
        // Every return had its entry: no other loss.
        assert!(
            !lines
                .iter()
                .any(|v| v["type"] == "lost" && v["what"] != "missed"),
            "{via}: {lines:?}"
        );
        let ret = if via == "fentry" {
            "fexit"
        } else {
            "kretprobe"
        };
        assert!(err.contains(&format!("kretprobe:vfs_read: {ret}")), "{err}");
    }
}

/// Whether the kernel counts missed kprobe hits per link (6.7 and later).
fn counts_missed() -> bool {
    let r = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut v = r.split(|c: char| !c.is_ascii_digit());
    let major: u32 = v.next().and_then(|x| x.parse().ok()).unwrap_or(0);
    let minor: u32 = v.next().and_then(|x| x.parse().ok()).unwrap_or(0);
    (major, minor) >= (6, 7)
}

/// More threads blocked in vfs_read than a kretprobe has return instances
/// (10 on a small machine): the kernel misses the returns of the reads made
/// meanwhile, and bpfscope reports them instead of undercounting silently.
#[test]
#[ignore = "needs root and BPF"]
fn missed_returns_are_reported() {
    let _turn = vfs_read_turn();
    if !ready(&["kprobe"]) {
        return;
    }
    if !counts_missed() {
        skip("this kernel does not count missed kprobe hits per link (6.7 and later do)");
        return;
    }
    let w = kfunc_workload();
    let (_, path) = target_file("miss");
    let (out, err) = ok_env(
        &[(VIA, "kprobe")],
        &[
            "count",
            "kretprobe:vfs_read",
            "--json",
            "-v",
            "--",
            w.to_str().unwrap(),
            "block",
            "16",
            &path,
            "100",
        ],
    );
    assert!(err.contains("kretprobe:vfs_read: kretprobe"), "{err}");
    let lines = json_lines(&out);
    let missed = lines
        .iter()
        .find(|v| v["type"] == "lost" && v["what"] == "missed")
        .unwrap_or_else(|| panic!("no missed record: {out} {err}"));
    // All 100 reads returned while 16 readers held the instances.
    assert!(missed["count"].as_u64().unwrap() >= 100, "{missed}");
}

#[test]
#[ignore = "needs root and BPF"]
fn glob_attaches_hundreds_of_functions_with_a_cookie_each() {
    if !ready(&["kprobe"]) {
        return;
    }
    let w = kfunc_workload();
    let (_, path) = target_file("glob");
    let o = run(&[
        "count",
        "kprobe:vfs_*",
        "kprobe:ksys_*",
        "kprobe:filemap_*",
        "--by",
        "probe",
        "--json",
        "-v",
        "--",
        w.to_str().unwrap(),
        "write",
        &path,
        "432",
        "8",
    ]);
    let out = ok(&o);
    let err = stderr(&o);
    let attached = attached(&err);
    assert!(attached >= 100, "{err}");
    // Each function has its own cookie: the counts land on the right names.
    let c = counts_by(&json_lines(&out), "probe");
    assert_eq!(c.get("kprobe:vfs_write"), Some(&432), "{c:?}");
    assert!(!c.contains_key("kprobe:vfs_writev"), "{c:?}");
    // Globs take kprobes (one kprobe_multi link where the kernel has it).
    assert!(
        err.contains("kprobe:vfs_write: kprobe_multi with cookies")
            || err.contains("kprobe:vfs_write: kprobe with cookie"),
        "{err}"
    );
}

#[test]
#[ignore = "needs root and BPF"]
fn fentry_glob_loads_one_program_per_function() {
    if !ready(&["fentry"]) {
        return;
    }
    let w = kfunc_workload();
    let (_, path) = target_file("fglob");
    let o = run(&[
        "count",
        "fentry:vfs_*write*",
        "--by",
        "probe",
        "--json",
        "--",
        w.to_str().unwrap(),
        "write",
        &path,
        "99",
        "8",
    ]);
    let c = counts_by(&json_lines(&ok(&o)), "probe");
    assert_eq!(c.get("fentry:vfs_write"), Some(&99), "{c:?}");
    let err = stderr(&o);
    let attached = attached(&err);
    assert!(attached >= 3, "{err}");
}

#[test]
#[ignore = "needs root and BPF"]
fn loopback_packets_by_device_name() {
    if !ready(&["any"]) {
        return;
    }
    let _ = Command::new("ip")
        .args(["link", "set", "lo", "up"])
        .status();
    // icmp_rcv sees each ICMP packet once: a request and a reply per ping.
    let r = start(&[
        "count",
        "kprobe:icmp_rcv",
        "--json",
        "--by",
        "skb->dev->name",
        "--filter",
        r#"skb->dev->name == "lo" && skb->len > 0"#,
    ]);
    let st = Command::new("ping")
        .args(["-c", "5", "-i", "0.2", "-q", "127.0.0.1"])
        .output()
        .expect("running ping (apt-get install iputils-ping)");
    assert!(st.status.success(), "{st:?}");
    let (out, err) = r.interrupt();
    let c = counts_by(&json_lines(&out), "skb->dev->name");
    assert_eq!(c, BTreeMap::from([("lo".to_string(), 10)]), "{err}");
}

#[test]
#[ignore = "needs root and BPF"]
fn list_shows_btf_signatures() {
    require_root();
    // Resolution needs only BTF (and tracefs where it lists functions).
    let out = ok(&run(&["list", "kprobe:vfs_rea*"]));
    assert!(
        out.contains("kprobe:vfs_read\n    ssize_t vfs_read(struct file *file, "),
        "{out}"
    );
    let out = ok(&run(&["list", "fexit:vfs_read", "--json"]));
    let v = json_lines(&out);
    assert_eq!(v[0]["probe"], "fexit:vfs_read");
    let names: Vec<&str> = v[0]["fields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"file") && names.contains(&"retval"),
        "{names:?}"
    );
}

#[test]
#[ignore = "needs root and BPF"]
fn bad_kernel_function_input_is_one_line_and_exit_2() {
    require_root();
    let one_line = |o: &Output| {
        assert_eq!(o.status.code(), Some(2), "{}", stderr(o));
        let e = stderr(o);
        assert_eq!(e.trim().lines().count(), 1, "{e}");
        e
    };
    let e = one_line(&run(&["count", "kprobe:vfs_reaad"]));
    assert!(e.contains("did you mean kprobe:vfs_read"), "{e}");
    let e = one_line(&run(&["count", "kretprobe:vfs_read+4"]));
    assert!(e.contains("only kprobe: takes an offset"), "{e}");
    // fentry refused: the reason and the alternative. Forced where the kernel allows it.
    let o = run_with_env(&[(VIA, "kprobe")], &["count", "fentry:vfs_read"]);
    let e = one_line(&o);
    assert!(e.contains("refuses fentry/fexit"), "{e}");
    if support("kprobe").is_ok() {
        assert!(e.contains(&format!("disabled by {VIA}=kprobe")), "{e}");
        assert!(e.contains("use kprobe:vfs_read instead"), "{e}");
    } else {
        assert!(e.contains("trace tracepoints instead"), "{e}");
    }
    if support("any").is_err() {
        skip("member paths: kernel functions are refused here");
        return;
    }
    let e = one_line(&run(&[
        "count",
        "kprobe:vfs_read",
        "--filter",
        "file->f_pth == 0",
    ]));
    assert!(
        e.contains("struct file has no member 'f_pth'; its members: "),
        "{e}"
    );
    assert!(e.contains("f_path"), "{e}");
    let e = one_line(&run(&["count", "kprobe:vfs_read", "--by", "file->f_path"]));
    assert!(e.contains("name one of its members"), "{e}");
    let e = one_line(&run(&["count", "kprobe:vfs_read", "--by", "file.f_path"]));
    assert!(e.contains("is a pointer: use 'file->f_path'"), "{e}");
    let e = one_line(&run(&["count", "kretprobe:vfs_read", "--by", "file"]));
    assert!(e.contains("has no field 'file'"), "{e}");
}
