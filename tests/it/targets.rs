//! Targets, signals and outputs: the failure paths a user hits when an
//! attach fails, a signal arrives early, the traced process goes away or
//! an output path is bad. Root integration tests against the real kernel.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

const WRITE: &str = "tracepoint:syscalls:sys_enter_write";

/// A fresh directory for one test's files.
fn scratch(test: &str) -> PathBuf {
    scratch_dir(&format!("targets-{test}"))
}

/// Children of `pid` (all its threads').
fn children_of(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            let c = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
            out.extend(c.split_whitespace().filter_map(|p| p.parse::<i32>().ok()));
        }
    }
    out
}

fn alive(pid: i32) -> bool {
    let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    !state.is_empty()
        && !state
            .rsplit(") ")
            .next()
            .is_some_and(|s| s.starts_with('Z'))
}

/// Waits up to `limit` for `cond`.
fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    cond()
}

/// An attach that fails after the command was forked (here: the open-file
/// limit runs out while attaching 30-odd scheduler tracepoints) used to
/// hang forever: the gated child held its own gate open and bpfscope
/// waited for it. Now: exit 2 at once, one line, the command never ran.
#[test]
#[ignore = "needs root and BPF"]
fn attach_failure_with_a_command_ends_at_once() {
    require_root();
    let dir = scratch("attach_failure");
    let mark = dir.join("ran");
    // The lowest limits fail while loading, the highest not at all: the
    // first limit whose failure names an attach is the case wanted, found
    // afresh so that a new map or program does not move it out of reach.
    let mut found = None;
    for limit in 16..80 {
        let script = format!(
            "ulimit -n {limit}; exec {} count 'tracepoint:sched:*' -- /bin/sh -c 'touch {}'",
            bin(),
            mark.display()
        );
        let o = run_cmd_timeout(
            Command::new("/bin/sh").args(["-c", &script]),
            Duration::from_secs(20),
        );
        // In the 6.1 guest one limit's attach failed with EOPNOTSUPP, not
        // EMFILE (the cause not yet known): a higher limit reaches EMFILE.
        let e = stderr(&o);
        if e.contains("attaching") && !e.contains("Operation not supported") {
            found = Some(o);
            break;
        }
    }
    let o = found.expect("no open-file limit made the attach fail");
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "stderr: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(err.contains("Too many open files"), "{err}");
    assert!(err.contains("ulimit -n"), "the fix is named: {err}");
    assert!(!mark.exists(), "the command must not run untraced");
}

/// SIGKILL while the command waits at its gate (during a slow attach of
/// every tracepoint): the gated child dies with bpfscope and never runs
/// the command; it held no BPF object, so nothing stays loaded.
#[test]
#[ignore = "needs root and BPF"]
fn sigkill_during_attach_leaves_no_child() {
    require_root();
    let dir = scratch("sigkill_gate");
    let mark = dir.join("ran");
    let mut cmd = Command::new(bin());
    cmd.args(["count", "tracepoint:*:*", "--", "/bin/sh", "-c"])
        .arg(format!("touch {}", mark.display()));
    let mut r = start_cmd(cmd, "Attaching");
    let kids = children_of(r.pid());
    assert_eq!(kids.len(), 1, "one gated child: {kids:?}");
    let held: Vec<u64> = prog_ids_of(kids[0]);
    assert!(
        held.is_empty(),
        "the gated child holds BPF programs {held:?}"
    );
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(r.pid(), libc::SIGKILL) };
    let _ = r.child.wait();
    assert!(
        eventually(Duration::from_secs(5), || !alive(kids[0])),
        "gated child {} outlived bpfscope",
        kids[0]
    );
    assert!(!mark.exists(), "the command must not run untraced");
}

/// Ctrl-C while attaching thousands of tracepoints ends the run within a
/// second, says so, and exits 0 like Ctrl-C at any other time.
#[test]
#[ignore = "needs root and BPF"]
fn sigint_during_attach_ends_within_a_second() {
    require_root();
    let mut cmd = Command::new(bin());
    cmd.args(["count", "tracepoint:*:*", "--duration", "60"]);
    let mut r = start_cmd(cmd, "Attaching");
    let t = Instant::now();
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(r.pid(), libc::SIGINT) };
    let (_, err) = r.finish();
    let took = t.elapsed();
    let status = r.child.wait().unwrap();
    assert!(status.success(), "{status}: {err}");
    assert!(took < Duration::from_secs(1), "took {took:?}: {err}");
    assert!(err.contains("interrupted"), "{err}");
}

/// `-p PID` ends when the process exits, and says so, instead of running
/// on to --duration.
#[test]
#[ignore = "needs root and BPF"]
fn pid_target_exit_ends_the_run() {
    require_root();
    let w = workload("writer");
    let mut c = Command::new(&w);
    c.args(["wr_pidexit", "25", "8"]);
    let mut wl = Gated::spawn(c);
    let pid = wl.pid();
    let mut r = start(&["count", WRITE, "-p", &pid, "--json", "--duration", "120"]);
    let t = Instant::now();
    wl.go_and_wait();
    let (out, err) = r.finish();
    assert!(
        t.elapsed() < Duration::from_secs(30),
        "ran on after the target exited"
    );
    assert!(r.child.wait().unwrap().success(), "{err}");
    assert!(err.contains(&format!("process {pid} exited")), "{err}");
    assert_eq!(sum_counts(&json_lines(&out)), 25);
}

/// `-p` with a pid that does not exist is bad input: exit 2, one line,
/// found before privileges are checked (so as any user).
#[test]
fn pid_target_that_does_not_exist() {
    // A pid above pid_max cannot exist.
    let o = run(&["count", WRITE, "-p", "99999999"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert_eq!(stderr(&o).trim_end().lines().count(), 1, "{}", stderr(&o));
    assert!(stderr(&o).contains("no such process"), "{}", stderr(&o));
}

/// Output paths are checked before anything is attached: a directory, a
/// missing folder and a read-only filesystem fail at once (exit 2), for
/// every option that writes a file.
#[test]
#[ignore = "needs root and BPF"]
fn bad_output_paths_fail_before_the_run() {
    require_root();
    let dir = scratch("outputs");
    let ro = dir.join("ro");
    std::fs::create_dir_all(&ro).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "ro,size=64k", "tmpfs"])
        .arg(&ro)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    /// Unmounts however the test ends.
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let _unmount = mounted.then(|| Unmount(ro.clone()));
    let dir_s = dir.to_str().unwrap().to_string();
    let missing = format!("{dir_s}/nope/out.svg");
    let readonly = format!("{}/out.svg", ro.display());
    let mut cases: Vec<Vec<String>> = Vec::new();
    for path in [&dir_s, &missing] {
        cases.push(vec![
            "count".into(),
            WRITE.into(),
            "--by".into(),
            "ustack".into(),
            "-o".into(),
            path.clone(),
        ]);
        cases.push(vec![
            "latency".into(),
            "tracepoint:sched:sched_wakeup".into(),
            "tracepoint:sched:sched_switch".into(),
            "--match".into(),
            "cpu".into(),
            "--heatmap".into(),
            path.clone(),
        ]);
        cases.push(vec!["profile".into(), "-o".into(), path.clone()]);
        cases.push(vec![
            "record".into(),
            "-o".into(),
            path.replace(".svg", ".bscope"),
        ]);
    }
    if mounted {
        cases.push(vec!["profile".into(), "-o".into(), readonly.clone()]);
    } else {
        skip("read-only case: mounting a read-only tmpfs failed");
    }
    for args in &cases {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = run_timeout(&a, Duration::from_secs(20));
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{a:?}: {err}");
        assert!(
            !err.contains("Attached"),
            "{a:?} attached before failing: {err}"
        );
        assert_eq!(err.trim_end().lines().count(), 1, "{a:?}: {err}");
    }
}

/// `trace` into a pipe: each line arrives while the run goes on (not when
/// 64 KiB have gathered or at the end), and when the reader goes away
/// (`| head -1`) bpfscope ends by itself.
#[test]
#[ignore = "needs root and BPF"]
fn trace_into_a_pipe_is_prompt_and_ends_with_its_reader() {
    require_root();
    let w = workload("writer");
    let mut c = Command::new(&w);
    // One write, then a long pause: the target outlives the test's reader.
    c.args(["wr_pipe", "2", "8"]).env("PAUSE_US", "30000000");
    let mut wl = Gated::spawn(c);
    let pid = wl.pid();
    let mut child = Command::new(bin())
        .args(["trace", WRITE, "-p", &pid, "--duration", "60"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    while err.read_line(&mut line).unwrap() > 0 && !line.starts_with("Attached") {
        line.clear();
    }
    let out = child.stdout.take().unwrap();
    let t = Instant::now();
    wl.go();
    // The workload stays alive, so only the reader's going away can end
    // bpfscope early. The reader is a thread so that a line that never
    // comes fails the test instead of hanging it.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut out = BufReader::new(out);
        let mut first = String::new();
        let _ = out.read_line(&mut first);
        let _ = tx.send(first);
        // `out` is dropped here: the reader goes away.
    });
    let first = rx.recv_timeout(Duration::from_secs(10)).unwrap_or_default();
    let arrived = t.elapsed();
    if first.is_empty() {
        let _ = child.kill();
    }
    assert!(first.contains("comm=wr_pipe"), "{first:?}");
    assert!(
        arrived < Duration::from_secs(5),
        "first line after {arrived:?}"
    );
    std::thread::sleep(Duration::from_millis(100));
    let t = Instant::now();
    let ended = eventually(Duration::from_secs(5), || {
        child.try_wait().unwrap().is_some()
    });
    if !ended {
        let _ = child.kill();
    }
    assert!(ended, "bpfscope ran on after its reader went away");
    assert!(t.elapsed() < Duration::from_secs(5));
}

/// `profile -p PID` ends when the process exits too, and still writes
/// what it sampled.
#[test]
#[ignore = "needs root and BPF"]
fn profile_of_a_pid_ends_with_it() {
    require_root();
    let w = workload("split");
    let mut c = Command::new(&w);
    c.args(["wl_prof_pid", "1"]);
    let mut wl = Gated::spawn(c);
    let pid = wl.pid();
    let dir = scratch("profile_pid");
    let out = dir.join("p.folded");
    let mut cmd = Command::new(bin());
    cmd.args([
        "profile",
        "-F",
        "199",
        "-p",
        &pid,
        "--duration",
        "120",
        "-o",
    ])
    .arg(&out);
    let mut r = start_cmd(cmd, "Attached");
    let t = Instant::now();
    wl.go_and_wait();
    let (_, err) = r.finish();
    assert!(
        t.elapsed() < Duration::from_secs(60),
        "ran on after the target exited"
    );
    assert!(r.child.wait().unwrap().success(), "{err}");
    assert!(err.contains(&format!("process {pid} exited")), "{err}");
    let folded = std::fs::read_to_string(&out).unwrap();
    assert!(!folded.is_empty(), "{err}");
}
