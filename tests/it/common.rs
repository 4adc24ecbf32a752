//! Shared helpers of the integration tests: building workload programs,
//! running bpfscope, waiting for it to attach, parsing JSON lines, and the
//! two ways a test says it did not test everything (`require_root`, `skip`).

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_bpfscope")
}

/// The running test's path (`trace::pid_target`): libtest names each
/// test's thread after it.
pub fn test_name() -> String {
    std::thread::current()
        .name()
        .unwrap_or("(unnamed test)")
        .to_string()
}

/// First statement of every test marked `#[ignore = "needs root and BPF"]`.
/// Those run only when asked for (`--include-ignored`, as `scripts/test`
/// does), and a run that asked for them without root must not pass having
/// tested nothing: it fails here, saying why.
pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert!(
        euid == 0,
        "{} needs root to load BPF programs, and this run (euid {euid}) is not root: \
         run the tests as root, or without --include-ignored/--ignored",
        test_name()
    );
}

/// Says that the running test (or the part of it named in `why`) was
/// skipped for a reason of this machine or kernel: one line
/// `SKIP <test>: <why>`, written straight to stderr, past the harness's
/// capture, so a passing run still shows what it did not test.
pub fn skip(why: &str) {
    // One write: the line must not interleave with other output.
    let line = format!("SKIP {}: {why}\n", test_name());
    let _ = std::io::stderr().write_all(line.as_bytes());
}

/// Run-time statistics of BPF programs (the `bpf_stats_enabled` sysctl and
/// the BPF_ENABLE_STATS hold `bpf top` takes) are one setting for the whole
/// kernel: tests that change them or depend on them take turns.
static BPF_STATS: Mutex<()> = Mutex::new(());

/// Takes the turn on `BPF_STATS` (a test that panicked holding it does not
/// block the others).
pub fn bpf_stats_turn() -> std::sync::MutexGuard<'static, ()> {
    BPF_STATS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether this run is inside an emulated guest (tests/guest/run-tests
/// sets BPFSCOPE_TEST_EMULATED=1): a CPU there runs several times slower
/// than this machine's, so a workload sampled for a fixed time gets fewer
/// samples, and programs take longer to start.
pub fn emulated() -> bool {
    std::env::var_os("BPFSCOPE_TEST_EMULATED").is_some_and(|v| v == "1")
}

/// The fewest samples a test wants of a workload sampled for a fixed
/// time: `n`, or a tenth of it under emulation. There the guest's clock is
/// the host's, so whenever the host deschedules the emulated CPU the
/// kernel's sampling timers fire late and their samples are not delivered:
/// in an arm64 guest beside other builds (host load 16 on 2 cores) 1136 of
/// 5212 samples reached the program. The shares the tests check still hold
/// on what arrives; the floor only catches a profiler that sampled nothing.
pub fn min_samples(n: u64) -> u64 {
    if emulated() {
        n / 10
    } else {
        n
    }
}

/// A share of a workload's samples a test expects (`host`, say 0.95), on
/// this machine; under emulation four times the remainder is allowed
/// (0.95 becomes 0.80), never less than half of `host`: there, a CPU takes
/// interrupts only between translated blocks and the kernel's own work
/// (timers, faults) and programs' start-up take a larger part of the time.
pub fn share(host: f64) -> f64 {
    if emulated() {
        (1.0 - 4.0 * (1.0 - host)).max(host / 2.0)
    } else {
        host
    }
}

/// How far a sampled split of `n` samples may stray from its expected
/// share `p`: four standard deviations of a binomial count, at least 0.05.
/// An emulated guest delivers a fraction of the samples (a 2 s Go run gave
/// 375), where a fixed +-0.05 is under three deviations.
pub fn split_tolerance(n: u64, p: f64) -> f64 {
    (4.0 * (p * (1.0 - p) / n.max(1) as f64).sqrt()).max(0.05)
}

/// Says SKIP and returns true under emulation, for a test whose
/// measurement an emulated CPU cannot give (`why`).
pub fn skip_if_emulated(why: &str) -> bool {
    if emulated() {
        skip(&format!("emulated CPU: {why}"));
    }
    emulated()
}

/// Whether the profiler unwinds user stacks with tables here, as
/// `bpfscope doctor` finds (the kernel's task_vma iterator, Linux 6.7);
/// says SKIP for the running test when not.
pub fn unwinds_here() -> bool {
    static VERDICT: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    let why = VERDICT.get_or_init(|| {
        let out = run(&["doctor", "--json", "--quick"]);
        json_lines(&stdout(&out))
            .into_iter()
            .find(|l| l["feature"] == "unwinding")
            .and_then(|l| {
                (l["status"] != "ok").then(|| l["detail"].as_str().unwrap_or("").to_string())
            })
    });
    if let Some(why) = why {
        skip(&format!("no unwinding with tables on this kernel: {why}"));
    }
    why.is_none()
}

/// Seconds a workload runs for: `s`, or three times as long under
/// emulation, where starting an interpreter takes a second or more.
pub fn secs(s: u64) -> u64 {
    if emulated() {
        3 * s
    } else {
        s
    }
}

/// This kernel's release as a part of file names (`6_12_117_deb12_amd64`).
pub fn release_tag() -> String {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    release
        .trim()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// The tests' directory in the target directory: cargo's
/// CARGO_TARGET_TMPDIR, which is the same for every target, and under it
/// one per architecture other than x86_64, so that the workloads an arm64
/// build compiles do not replace the x86_64 ones beside them.
pub fn tmp_dir() -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR"));
    if cfg!(target_arch = "x86_64") {
        d.to_path_buf()
    } else {
        let d = d.join(std::env::consts::ARCH);
        let _ = std::fs::create_dir_all(&d);
        d
    }
}

/// A fresh, empty directory for one test or case, in the target directory.
/// Guests booted at once share that directory (tests/guest/run-tests) and
/// run the same tests at the same time: the kernel release in the name
/// keeps their runs apart.
pub fn scratch_dir(name: &str) -> PathBuf {
    let d = tmp_dir().join(format!("{name}-{}", release_tag()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Compiles tests/workloads/NAME.c (once per test binary run) and returns the binary.
pub fn workload(name: &str) -> PathBuf {
    workload_with(name, &[])
}

/// Like `workload`, with extra compiler flags; the flags become part of the output name.
pub fn workload_with(name: &str, flags: &[&str]) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/workloads")
        .join(format!("{name}.c"));
    let tag: String = flags
        .iter()
        .map(|f| f.replace(|c: char| !c.is_ascii_alphanumeric(), ""))
        .collect::<Vec<_>>()
        .join("_");
    let out = tmp_dir().join(if tag.is_empty() {
        name.to_string()
    } else {
        format!("{name}-{tag}")
    });
    let fresh = || {
        out.metadata()
            .and_then(|o| Ok(o.modified()? >= src.metadata()?.modified()?))
            .unwrap_or(false)
    };
    if !fresh() {
        // Build under a unique name and rename, so parallel tests never see a
        // half-written file (tests of one binary share the pid: count too;
        // guests share the directory and may hand out the same pids).
        static BUILDS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = BUILDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = out.with_extension(format!("tmp{}-{}-{n}", release_tag(), std::process::id()));
        let st = Command::new("cc")
            .args(["-O1", "-g", "-fno-omit-frame-pointer", "-o"])
            .arg(&tmp)
            .arg(&src)
            .args(flags)
            .status()
            .expect("running cc");
        assert!(st.success(), "compiling {}", src.display());
        // Another test that built it at the same time may be running it
        // already: its file stays (a link fails where the name exists).
        // Replaced under a running process, the file no longer matched
        // the process's mapping, and an unprivileged agent (no
        // map_files) could not name the workload's functions.
        match std::fs::hard_link(&tmp, &out) {
            Ok(()) => {
                let _ = std::fs::remove_file(&tmp);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                if fresh() {
                    let _ = std::fs::remove_file(&tmp);
                } else {
                    std::fs::rename(&tmp, &out).expect("renaming workload");
                }
            }
            Err(e) => panic!("linking workload {}: {e}", out.display()),
        }
    }
    out
}

/// Runs bpfscope to completion.
pub fn run(args: &[&str]) -> Output {
    run_timeout(args, Duration::from_secs(120))
}

pub fn run_timeout(args: &[&str], timeout: Duration) -> Output {
    run_env(args, &[], timeout)
}

/// Runs bpfscope to completion with extra environment variables (an empty
/// value removes the variable).
pub fn run_env(args: &[&str], env: &[(&str, &str)], timeout: Duration) -> Output {
    let mut cmd = Command::new(bin());
    for (k, v) in env {
        if v.is_empty() {
            cmd.env_remove(k);
        } else {
            cmd.env(k, v);
        }
    }
    cmd.args(args);
    run_cmd_timeout(&mut cmd, timeout)
}

/// Runs any command to completion, killing it (and failing) after `timeout`,
/// four times that under emulation: the limit only catches a hang, and an
/// emulated guest on a loaded host ran `bpfscope doctor` for over 120 s.
pub fn run_cmd_timeout(cmd: &mut Command, timeout: Duration) -> Output {
    let timeout = if emulated() { timeout * 4 } else { timeout };
    let args: Vec<String> = cmd
        .get_args()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting bpfscope");
    let (mut so, mut se) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let t_out = std::thread::spawn(move || {
        let mut v = Vec::new();
        so.read_to_end(&mut v).ok();
        v
    });
    let t_err = std::thread::spawn(move || {
        let mut v = Vec::new();
        se.read_to_end(&mut v).ok();
        v
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(s) = child.try_wait().expect("waiting") {
            break s;
        }
        if Instant::now() > deadline {
            let threads = thread_states(child.id());
            let _ = child.kill();
            reap_within(&mut child, Duration::from_secs(10));
            let err = if t_err.is_finished() {
                t_err.join().unwrap_or_default()
            } else {
                Vec::new()
            };
            panic!(
                "bpfscope {args:?} did not finish within {timeout:?}; its threads: {threads}; stderr: {}",
                String::from_utf8_lossy(&err)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Output {
        status,
        stdout: t_out.join().unwrap(),
        stderr: t_err.join().unwrap(),
    }
}

/// Waits for a child for at most `limit` (four times that under
/// emulation); past it, says where its threads are, kills it and fails.
/// A test's wait on another program must end: one that never did held a
/// CI run until its time ran out, with nothing to say where.
pub fn wait_within(child: &mut Child, what: &str, limit: Duration) -> std::process::ExitStatus {
    let limit = if emulated() { limit * 4 } else { limit };
    let deadline = Instant::now() + limit;
    loop {
        if let Some(s) = child.try_wait().expect("waiting") {
            return s;
        }
        if Instant::now() > deadline {
            let threads = thread_states(child.id());
            let _ = child.kill();
            panic!("{what} did not end within {limit:?}; its threads: {threads}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Reaps a killed child if it dies within `limit`; one stuck in the
/// kernel is left rather than holding the test (and the run) forever.
fn reap_within(child: &mut Child, limit: Duration) {
    let gone = Instant::now() + limit;
    while matches!(child.try_wait(), Ok(None)) && Instant::now() < gone {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Runs a command (output inherited) to its end within `limit`.
pub fn status_within(cmd: &mut Command, limit: Duration) -> std::process::ExitStatus {
    let what = format!("{cmd:?}");
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("{what}: {e}"));
    wait_within(&mut child, &what, limit)
}

/// Where each thread of a process is (state, kernel function it waits
/// in, CPU ticks used, kernel stack): what a test that timed out on it
/// shows; the ticks tell a starved thread from a stuck one.
pub fn thread_states(pid: u32) -> String {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return "gone".into();
    };
    let mut out = Vec::new();
    for t in tasks.flatten() {
        let dir = t.path();
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_default();
        let stat = read("stat");
        // "tid (comm) state ...": the state follows the last ')'.
        let rest: Vec<&str> = stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .split_whitespace()
            .collect();
        let state = rest.first().copied().unwrap_or("?");
        // utime and stime are the 12th and 13th fields after the name.
        let ticks: u64 = [11, 12]
            .iter()
            .filter_map(|&i| rest.get(i)?.parse::<u64>().ok())
            .sum();
        let stack: Vec<String> = read("stack")
            .lines()
            .map(|l| l.split_whitespace().nth(1).unwrap_or("").to_string())
            .collect();
        out.push(format!(
            "{} {} {} in {} after {ticks} ticks [{}]",
            t.file_name().to_string_lossy(),
            read("comm").trim(),
            state,
            read("wchan"),
            stack.join(" < ")
        ));
    }
    out.join("; ")
}

/// A bpfscope run in the background, attached and ready.
pub struct Running {
    pub child: Child,
    stdout: Option<std::thread::JoinHandle<Vec<u8>>>,
    stderr_lines: mpsc::Receiver<String>,
    pub stderr_seen: Vec<String>,
}

/// Starts bpfscope and waits until it prints "Attached".
pub fn start(args: &[&str]) -> Running {
    let mut cmd = Command::new(bin());
    cmd.args(args);
    start_cmd(cmd, "Attached")
}

/// Starts a command and waits until a stderr line starts with `ready`.
pub fn start_cmd(mut cmd: Command, ready: &str) -> Running {
    let args: Vec<String> = cmd
        .get_args()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting bpfscope");
    let mut so = child.stdout.take().unwrap();
    let se = child.stderr.take().unwrap();
    let stdout = std::thread::spawn(move || {
        let mut v = Vec::new();
        so.read_to_end(&mut v).ok();
        v
    });
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(se).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut r = Running {
        child,
        stdout: Some(stdout),
        stderr_lines: rx,
        stderr_seen: Vec::new(),
    };
    // Emulated, three times as long: a 6.1 guest, its one vCPU shared with
    // a second test's workload, once had a profile unattached after 60 s.
    match r.wait_for_line(|l| l.starts_with(ready), Duration::from_secs(secs(60))) {
        Ok(()) => r,
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!(
            "bpfscope {args:?} exited before attaching: {:?}",
            r.stderr_seen
        ),
        Err(mpsc::RecvTimeoutError::Timeout) => {
            let whereabouts = thread_states(r.child.id());
            let _ = r.child.kill();
            panic!(
                "bpfscope {args:?} did not attach: {:?}; its threads: {whereabouts}; load: {}",
                r.stderr_seen,
                std::fs::read_to_string("/proc/loadavg")
                    .unwrap_or_default()
                    .trim()
            );
        }
    }
}

impl Drop for Running {
    /// A test that panics must not leave bpfscope attached behind it.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            reap_within(&mut self.child, Duration::from_secs(10));
        }
    }
}

impl Running {
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Waits up to `limit` for a stderr line containing `pat` (the lines
    /// read are kept for `finish`); whether one came.
    pub fn wait_for_stderr(&mut self, pat: &str, limit: Duration) -> bool {
        self.wait_for_line(|l| l.contains(pat), limit).is_ok()
    }

    /// Waits up to `limit` for a stderr line `found` accepts, among those
    /// seen so far or coming (all kept for `finish`); Disconnected when
    /// stderr ended first, Timeout when the time ran out.
    fn wait_for_line(
        &mut self,
        found: impl Fn(&str) -> bool,
        limit: Duration,
    ) -> Result<(), mpsc::RecvTimeoutError> {
        if self.stderr_seen.iter().any(|l| found(l)) {
            return Ok(());
        }
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            match self.stderr_lines.recv_timeout(Duration::from_millis(100)) {
                Ok(l) => {
                    let hit = found(&l);
                    self.stderr_seen.push(l);
                    if hit {
                        return Ok(());
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(e) => return Err(e),
            }
        }
        Err(mpsc::RecvTimeoutError::Timeout)
    }

    /// Sends SIGINT (what Ctrl-C does), collects the output and checks
    /// that bpfscope ended cleanly (exit status 0).
    pub fn interrupt(mut self) -> (String, String) {
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(self.pid(), libc::SIGINT) };
        let (out, err) = self.finish();
        let status = self.child.wait().expect("waiting");
        assert!(
            status.success(),
            "bpfscope ended with {status} after Ctrl-C: {err}"
        );
        (out, err)
    }

    /// Waits for exit; returns (stdout, stderr).
    pub fn finish(&mut self) -> (String, String) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.child.try_wait().expect("waiting").is_none() {
            assert!(
                Instant::now() < deadline,
                "bpfscope did not exit; its threads: {}",
                thread_states(self.child.id())
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        // The output ends with the process, unless something it started
        // holds the pipe: bounded too.
        let out = self
            .stdout
            .take()
            .map(|h| {
                let deadline = Instant::now() + Duration::from_secs(10);
                while !h.is_finished() {
                    assert!(
                        Instant::now() < deadline,
                        "bpfscope's output did not end with it"
                    );
                    std::thread::sleep(Duration::from_millis(10));
                }
                h.join().unwrap()
            })
            .unwrap_or_default();
        while let Ok(l) = self.stderr_lines.recv_timeout(Duration::from_millis(200)) {
            self.stderr_seen.push(l);
        }
        (
            String::from_utf8_lossy(&out).into_owned(),
            self.stderr_seen.join("\n"),
        )
    }
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Parses JSON lines.
pub fn json_lines(s: &str) -> Vec<serde_json::Value> {
    s.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON line {l:?}: {e}")))
        .collect()
}

/// Asserts a successful run and returns stdout.
pub fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "bpfscope failed: {:?}\nstderr: {}",
        o.status,
        stderr(o)
    );
    stdout(o)
}

/// Sum of all `count` objects.
pub fn sum_counts(lines: &[serde_json::Value]) -> u64 {
    lines
        .iter()
        .filter(|v| v["type"] == "count")
        .map(|v| v["count"].as_u64().unwrap())
        .sum()
}

/// `count` objects by one key's value (strings as they are, other values as JSON).
pub fn counts_by(
    lines: &[serde_json::Value],
    key: &str,
) -> std::collections::BTreeMap<String, u64> {
    lines
        .iter()
        .filter(|v| v["type"] == "count")
        .map(|v| {
            let k = match &v["key"][key] {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            (k, v["count"].as_u64().unwrap())
        })
        .collect()
}

/// The BPF programs a process holds, as (id, type), from its fdinfo;
/// None when the process is gone.
pub fn held_programs(pid: i32) -> Option<Vec<(u64, u64)>> {
    let dir = std::fs::read_dir(format!("/proc/{pid}/fdinfo")).ok()?;
    let mut held: Vec<(u64, u64)> = dir
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .filter_map(|s| {
            let field = |k: &str| {
                s.lines()
                    .find_map(|l| l.strip_prefix(k))
                    .and_then(|v| v.trim().parse::<u64>().ok())
            };
            Some((field("prog_id:")?, field("prog_type:")?))
        })
        .collect();
    held.sort();
    held.dedup();
    Some(held)
}

/// BPF program ids a process holds, from its fdinfo.
pub fn prog_ids_of(pid: i32) -> Vec<u64> {
    let held = held_programs(pid).unwrap_or_else(|| panic!("process {pid} is gone"));
    held.into_iter().map(|(id, _)| id).collect()
}

/// A workload started with GATE=1: it waits, stopped before its work, until
/// `go` closes its stdin. Tests that attach by pid use it instead of a
/// fixed delay, which emulated guests can outrun.
pub struct Gated {
    pub child: Child,
}

impl Gated {
    pub fn spawn(mut cmd: Command) -> Gated {
        let child = cmd
            .env("GATE", "1")
            .stdin(Stdio::piped())
            .spawn()
            .expect("starting the workload");
        Gated { child }
    }

    pub fn pid(&self) -> String {
        self.child.id().to_string()
    }

    /// Lets the workload run (closing stdin ends its wait).
    pub fn go(&mut self) {
        drop(self.child.stdin.take());
    }

    /// Lets it run and waits for it to finish successfully.
    pub fn go_and_wait(&mut self) {
        self.go();
        let st = self.child.wait().expect("waiting for the workload");
        assert!(st.success(), "workload ended with {st}");
    }
}

impl Drop for Gated {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A workload that runs until the test is done with it: killed and reaped
/// when dropped, so one started for longer than any test needs never
/// outlives a failing test.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        reap_within(&mut self.0, Duration::from_secs(10));
    }
}

/// Child processes of `pid` (of all its threads), from /proc/PID/task/*/children.
pub fn children_of(pid: i32) -> Vec<i32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut v: Vec<i32> = tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|s| {
            s.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<i32>>()
        })
        .collect();
    v.sort();
    v.dedup();
    v
}

/// Every descendant of `pid` (children, their children, ...).
pub fn descendants_of(pid: i32) -> Vec<i32> {
    let mut all = Vec::new();
    let mut todo = vec![pid];
    while let Some(p) = todo.pop() {
        for c in children_of(p) {
            if !all.contains(&c) {
                all.push(c);
                todo.push(c);
            }
        }
    }
    all
}

/// A process's start time (clock ticks since boot, /proc/PID/stat field 22)
/// and state letter, so a reused pid is not mistaken for the same process.
pub fn proc_start_state(pid: i32) -> Option<(u64, char)> {
    let f = stat_fields(pid)?;
    let state = f.first()?.chars().next()?;
    let start = f.get(19)?.parse().ok()?;
    Some((start, state))
}

/// The fields of /proc/PID/stat after the comm (field 2, which may hold
/// spaces and parentheses: what follows the last ')'), from the state on.
fn stat_fields(pid: i32) -> Option<Vec<String>> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 1..];
    Some(rest.split_whitespace().map(str::to_string).collect())
}

/// The CPU time a process has had (user and system), in seconds.
pub fn cpu_seconds(pid: i32) -> Option<f64> {
    let f = stat_fields(pid)?;
    // utime and stime: fields 14 and 15, the 12th and 13th after the comm.
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no memory-safety preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    Some(ticks as f64 / hz.max(1) as f64)
}

/// The value of `key` (`"SigCgt"`, `"RssAnon"`) in /proc/PID/status.
pub fn status_field(pid: i32, key: &str) -> Option<String> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .map(|v| v.trim().to_string())
}

/// Whether `pid` has a handler for `sig` now: bit sig-1 of SigCgt (an
/// exited process shows none).
pub fn catches(pid: i32, sig: i32) -> bool {
    status_field(pid, "SigCgt")
        .and_then(|m| u64::from_str_radix(&m, 16).ok())
        .is_some_and(|m| m & (1u64 << (sig - 1)) != 0)
}

/// True while the process that had this start time is alive (zombies,
/// which hold no descriptors, count as gone).
pub fn still_alive(pid: i32, start: u64) -> bool {
    matches!(proc_start_state(pid), Some((s, st)) if s == start && st != 'Z' && st != 'X')
}

/// BPF program ids a process holds, from its fdinfo; empty when it is gone.
pub fn try_prog_ids_of(pid: i32) -> Vec<u64> {
    let held = held_programs(pid).unwrap_or_default();
    held.into_iter().map(|(id, _)| id).collect()
}

/// Ends a bpftrace the test started: Ctrl-C (SIGINT), sent again every 5 s
/// since one that lands while bpftrace still attaches can be lost (a 6.12
/// guest's bpftrace then slept in epoll_wait for good), then SIGKILL after
/// `limit`. bpftrace is the peer here, not what is tested: how it ends is
/// not checked.
pub fn stop_bpftrace(bt: &mut Child, limit: Duration) {
    let deadline = Instant::now() + limit;
    let mut next_int = Instant::now();
    while Instant::now() < deadline {
        if !matches!(bt.try_wait(), Ok(None)) {
            return;
        }
        if Instant::now() >= next_int {
            // SAFETY: kill has no memory-safety preconditions.
            unsafe { libc::kill(bt.id() as i32, libc::SIGINT) };
            next_int = Instant::now() + Duration::from_secs(5);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!(
        "bpftrace did not end on Ctrl-C within {limit:?}: killed; its threads: {}",
        thread_states(bt.id())
    );
    let _ = bt.kill();
    reap_within(bt, Duration::from_secs(10));
}

/// Waits until `pid` holds a BPF program of type `prog_type` (the kernel's
/// number: 5 is a classic tracepoint program) and returns its id.
/// bpftrace prints "Attaching" before it compiles, loads and attaches
/// (seconds before, in an emulated guest), and keeps a kprobe program of
/// its feature probes open meanwhile, so neither says its program is in.
pub fn wait_for_program_of(pid: i32, prog_type: u32, limit: Duration) -> u64 {
    let deadline = Instant::now() + limit;
    loop {
        let held = held_programs(pid)
            .unwrap_or_default()
            .into_iter()
            .find_map(|(id, ty)| (ty == u64::from(prog_type)).then_some(id));
        if let Some(id) = held {
            return id;
        }
        assert!(
            Instant::now() < deadline,
            "process {pid} held no BPF program of type {prog_type} within {limit:?}; its threads: {}",
            thread_states(pid as u32)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Loaded BPF programs as (id, name, pids holding them), from bpftool.
pub fn loaded_progs() -> Vec<(u64, String, Vec<i32>)> {
    let out = Command::new("bpftool")
        .args(["prog", "show", "--json"])
        .output()
        .expect("running bpftool");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v.as_array()
        .map(|a| {
            a.iter()
                .map(|p| {
                    let pids = p["pids"]
                        .as_array()
                        .map(|a| {
                            a.iter()
                                .filter_map(|x| x["pid"].as_i64().map(|n| n as i32))
                                .collect()
                        })
                        .unwrap_or_default();
                    (
                        p["id"].as_u64().unwrap_or(0),
                        p["name"].as_str().unwrap_or("").to_string(),
                        pids,
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Waits for a child up to `timeout`; its status and resource usage
/// (ru_maxrss: peak resident set in KiB). None when it is still running.
pub fn wait4_timeout(
    child: &mut Child,
    timeout: Duration,
) -> Option<(std::process::ExitStatus, libc::rusage)> {
    use std::os::unix::process::ExitStatusExt;
    let deadline = Instant::now() + timeout;
    // ru_maxrss is no measure of the child alone: std spawns with vfork, and
    // exec carries the shared (parent's) address space's high-water mark
    // into the child's. The child's own mark (VmHWM, only ever growing) is
    // read while it runs instead.
    let mut hwm_kib: Option<i64> = None;
    loop {
        if let Some(kib) = std::fs::read_to_string(format!("/proc/{}/status", child.id()))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("VmHWM:"))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<i64>().ok())
            })
        {
            hwm_kib = Some(hwm_kib.map_or(kib, |h| h.max(kib)));
        }
        let mut status = 0;
        // SAFETY: an all-zero rusage is a valid value of this plain C struct.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: wait4 writes only to the status and rusage we pass; the
        // pid is our own unreaped child (std's Child never reaps on its own).
        let r = unsafe { libc::wait4(child.id() as i32, &mut status, libc::WNOHANG, &mut ru) };
        if r == child.id() as i32 {
            if let Some(h) = hwm_kib {
                ru.ru_maxrss = h;
            }
            return Some((std::process::ExitStatus::from_raw(status), ru));
        }
        assert!(r == 0, "wait4: {}", std::io::Error::last_os_error());
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Folded lines as (frames root first, weight).
pub fn folded(path: &Path) -> Vec<(Vec<String>, u64)> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| {
            let (stack, n) = l.rsplit_once(' ').expect("folded line has a count");
            (
                stack.split(';').map(String::from).collect(),
                n.parse().expect("count"),
            )
        })
        .collect()
}

/// Weight of the stacks rooted at `comm` that contain `frames` consecutively.
pub fn weight_with(lines: &[(Vec<String>, u64)], comm: &str, frames: &[&str]) -> u64 {
    lines
        .iter()
        .filter(|(f, _)| f[0] == comm && f.windows(frames.len()).any(|w| w == frames))
        .map(|(_, n)| n)
        .sum()
}

pub fn root_weight(lines: &[(Vec<String>, u64)], comm: &str) -> u64 {
    lines
        .iter()
        .filter(|(f, _)| f[0] == comm)
        .map(|(_, n)| n)
        .sum()
}

/// tests/workloads/cxx.cc built with g++ -O2 -g and `flags` into `bin`;
/// None (with a SKIP printed) when g++ is not installed.
pub fn cxx_workload(bin: &Path, flags: &[&str]) -> Option<PathBuf> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/workloads/cxx.cc");
    let Ok(st) = Command::new("g++")
        .args(["-O2", "-g"])
        .args(flags)
        .arg("-o")
        .arg(bin)
        .arg(&src)
        .status()
    else {
        skip("g++ is not installed (scripts/install-deps)");
        return None;
    };
    assert!(st.success(), "compiling {}", src.display());
    Some(bin.to_path_buf())
}

/// Debian's sh, sleep and dd at `nice` (prio 120 + nice, which no other
/// task here has: tests that may run at once take different ones), pinned
/// to CPU 0: 40 short sleeps, then 50,000 reads and writes. Sched
/// tracepoint tests filter on its prio.
pub fn sched_workload(nice: u32) -> PathBuf {
    let work = tmp_dir().join(format!("sched_work_{nice}.sh"));
    std::fs::write(
        &work,
        format!(
            "#!/bin/sh\ntaskset -c 0 nice -n {nice} /bin/sh -c 'for i in $(seq 40); do sleep 0.005; done; \
             dd if=/dev/zero of=/dev/null bs=4k count=50000 2>/dev/null'\n"
        ),
    )
    .unwrap();
    work
}
