//! Profiler against the real kernel (run as root): CPU shares and caller
//! chains, processes that exit mid-profile, stripped binaries with debug
//! files by build id, a real debuginfod server, pprof decoded back,
//! off-CPU time, targets, recordings and their corruption.

use std::collections::BTreeMap;
use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

/// The 3:1 workload. gcc gives its hot leaf a frame (see the source), so
/// frame-pointer stacks keep every caller.
fn split() -> PathBuf {
    workload("split")
}

/// A fresh scratch directory for one test.
fn scratch(name: &str) -> PathBuf {
    scratch_dir(&format!("profile-{name}"))
}

fn build_id(path: &Path) -> String {
    let out = Command::new("readelf")
        .arg("-n")
        .arg(path)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: ").map(String::from))
        .expect("binary has a build id")
}

/// A stripped copy of `bin` and its debug file in a build-id directory.
fn stripped_with_debug_dir(bin: &Path, dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let stripped = dir.join("split-stripped");
    let debug = dir.join("split.debug");
    let st = Command::new("objcopy")
        .arg("--only-keep-debug")
        .arg(bin)
        .arg(&debug)
        .status()
        .unwrap();
    assert!(st.success());
    let st = Command::new("objcopy")
        .arg("--strip-all")
        .arg(bin)
        .arg(&stripped)
        .status()
        .unwrap();
    assert!(st.success());
    let id = build_id(&stripped);
    assert_eq!(id, build_id(bin), "stripping keeps the build id");
    let dbg = dir.join("debug");
    let sub = dbg.join(".build-id").join(&id[..2]);
    std::fs::create_dir_all(&sub).unwrap();
    std::fs::copy(&debug, sub.join(format!("{}.debug", &id[2..]))).unwrap();
    (stripped, debug, dbg)
}

/// Runs `bpfscope SUB -F 499 EXTRA... -o OUT -- CMD...` to completion.
fn sample(sub: &str, extra: &[&str], out: &Path, cmd: &[&str]) -> std::process::Output {
    let mut args = vec![sub, "-F", "499"];
    args.extend(extra);
    args.extend(["-o", out.to_str().unwrap(), "--"]);
    args.extend(cmd);
    run(&args)
}

/// The exit status, one line on stderr, no panic.
fn assert_usage_error(o: &std::process::Output, what: &str) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(2), "{what}: {err}");
    assert!(err.starts_with("bpfscope: error: "), "{what}: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{what}: {err}");
    assert!(!err.contains("panicked"), "{what}: {err}");
}

#[test]
#[ignore = "needs root and BPF"]
fn cpu_split_three_to_one_with_caller_chains() {
    require_root();
    let dir = scratch("split");
    let out = dir.join("split.folded");
    let w = split();
    let o = sample(
        "profile",
        &["--duration", "60"],
        &out,
        &[w.to_str().unwrap(), "sp_split", "3"],
    );
    ok(&o);
    assert!(stderr(&o).contains("Attached"), "{}", stderr(&o));
    // Every run of the sampler is accounted for, exactly: idle, other
    // processes, or stored in the profile.
    let err = stderr(&o);
    let acct = err
        .lines()
        .find(|l| l.contains("samples: ") && l.contains("taken by the clocks"))
        .unwrap_or_else(|| panic!("no sample accounting line: {err}"));
    assert!(!acct.contains("unaccounted"), "{acct}");
    let lines = folded(&out);
    let alpha = weight_with(
        &lines,
        "sp_split",
        &["main", "alpha_caller", "alpha_work", "spin"],
    );
    let beta = weight_with(
        &lines,
        "sp_split",
        &["main", "beta_caller", "beta_work", "spin"],
    );
    let total = root_weight(&lines, "sp_split");
    // 3 s at 499 Hz is ~1500 samples when the CPU is ours.
    assert!(
        total > min_samples(600),
        "too few samples: {total}\n{lines:?}"
    );
    assert!(
        (alpha + beta) as f64 > 0.9 * total as f64,
        "stacks lost callers: alpha {alpha} beta {beta} total {total}\n{lines:?}"
    );
    let share = alpha as f64 / (alpha + beta) as f64;
    assert!(
        (0.68..=0.82).contains(&share),
        "alpha share {share:.3} (alpha {alpha}, beta {beta}), expected 0.75"
    );
    // Callers are never crossed: alpha_work only ever under alpha_caller.
    for (f, _) in &lines {
        if let Some(i) = f.iter().position(|x| x == "alpha_work") {
            assert_eq!(f[i - 1], "alpha_caller", "{f:?}");
        }
        if let Some(i) = f.iter().position(|x| x == "beta_work") {
            assert_eq!(f[i - 1], "beta_caller", "{f:?}");
        }
    }
}

/// `--kernel-only` while processes are born and die: the kernel frames of
/// fork, exec and exit are there, no user frame is, and no unwinding line
/// (user space no longer reads each new process's mappings and files in
/// this mode; that is measured in bench/sample_cost.py, not here).
#[test]
#[ignore = "needs root and BPF"]
fn kernel_only_profiles_new_processes_without_user_frames() {
    require_root();
    let dir = scratch("kernel-only");
    let out = dir.join("k.folded");
    let w = workload("forker");
    let o = sample(
        "profile",
        &["--kernel-only", "--duration", "30"],
        &out,
        &[w.to_str().unwrap(), "3000", "2"],
    );
    ok(&o);
    let lines = folded(&out);
    let total: u64 = lines.iter().map(|(_, n)| n).sum();
    assert!(
        total > min_samples(100),
        "too few samples: {total}\n{lines:?}"
    );
    for (f, n) in &lines {
        assert!(
            f[1..].iter().all(|x| x.ends_with("_[k]")),
            "a user frame in a kernel-only profile ({n}): {f:?}"
        );
    }
    let in_exec = lines
        .iter()
        .filter(|(f, _)| f.iter().any(|x| x.contains("execve")))
        .map(|(_, n)| n)
        .sum::<u64>();
    assert!(in_exec > 0, "no sample in execve: {lines:?}");
    assert!(!stderr(&o).contains("unwinding:"), "{}", stderr(&o));
}

#[test]
#[ignore = "needs root and BPF"]
fn process_that_exits_mid_profile_is_symbolized_even_with_its_binary_deleted() {
    require_root();
    let dir = scratch("short");
    let out = dir.join("short.folded");
    let w = split();
    // Emulated, three times longer: an arm64 guest took over a second to
    // read a new process's mappings, and a 1 s process was gone by then.
    let duration = secs(4).to_string();
    let mut r = start(&[
        "profile",
        "-F",
        "499",
        "--duration",
        &duration,
        "-o",
        out.to_str().unwrap(),
    ]);
    // A copy of the binary that is deleted once the process is gone, long
    // before the profile ends: symbols must come from what was captured
    // while it ran (its build id, and the file as it was mapped).
    let copy = dir.join("short-lived");
    std::fs::copy(&w, &copy).unwrap();
    // Emulated, the process lives twice as long again: with four guests
    // on two cores an arm64 guest's profiler, sharing one vCPU with the
    // spinning workload, had not read its mappings within 3 s.
    let life = if emulated() { 6 } else { 1 };
    let st = Command::new(&copy)
        .args(["sp_short", &life.to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    std::fs::remove_file(&copy).unwrap();
    let (_, err) = r.finish();
    assert!(r.child.wait().unwrap().success(), "{err}");
    let lines = folded(&out);
    let total = root_weight(&lines, "sp_short");
    assert!(
        total > min_samples(50),
        "too few samples of the short process: {total}"
    );
    let named = weight_with(&lines, "sp_short", &["alpha_caller", "alpha_work", "spin"])
        + weight_with(&lines, "sp_short", &["beta_caller", "beta_work", "spin"]);
    assert!(
        named as f64 >= 0.9 * total as f64,
        "only {named} of {total} samples symbolized: {lines:?}"
    );
}

#[test]
#[ignore = "needs root and BPF"]
fn stripped_binary_with_debug_file_in_build_id_dir() {
    require_root();
    let dir = scratch("stripped");
    let (stripped, _, dbg) = stripped_with_debug_dir(&split(), &dir);
    let rec = dir.join("run.bscope");
    let o = sample(
        "record",
        &[],
        &rec,
        &[stripped.to_str().unwrap(), "sp_strip", "1"],
    );
    ok(&o);
    let plain = dir.join("plain.folded");
    ok(&run(&[
        "report",
        rec.to_str().unwrap(),
        "-o",
        plain.to_str().unwrap(),
    ]));
    let lines = folded(&plain);
    assert_eq!(
        weight_with(&lines, "sp_strip", &["alpha_work"]),
        0,
        "a stripped binary has no such symbol without its debug file"
    );
    // Its unnamed code is one frame per function (the unwind table's FDE),
    // named at the function's first byte: every sample in spin (whatever
    // its address) is `split-stripped+<spin's offset>`, each caller too.
    let nm = Command::new("nm").arg(split()).output().unwrap();
    let sym = |name: &str| -> u64 {
        let t = String::from_utf8_lossy(&nm.stdout);
        let l = t
            .lines()
            .find(|l| l.split_whitespace().nth(2) == Some(name))
            .unwrap_or_else(|| panic!("{name} in nm"));
        u64::from_str_radix(l.split_whitespace().next().unwrap(), 16).unwrap() - exec_bias(&split())
    };
    let frame = |name: &str| format!("split-stripped+{:#x}", sym(name));
    let spin = weight_with(
        &lines,
        "sp_strip",
        &[
            &frame("main"),
            &frame("alpha_caller"),
            &frame("alpha_work"),
            &frame("spin"),
        ],
    ) + weight_with(
        &lines,
        "sp_strip",
        &[
            &frame("main"),
            &frame("beta_caller"),
            &frame("beta_work"),
            &frame("spin"),
        ],
    );
    let total = root_weight(&lines, "sp_strip");
    assert!(
        spin as f64 >= 0.9 * total as f64,
        "{spin} of {total} in {} by FDE: {lines:?}",
        frame("spin")
    );
    let with = dir.join("debug.folded");
    ok(&run(&[
        "report",
        rec.to_str().unwrap(),
        "-o",
        with.to_str().unwrap(),
        "--debug-dir",
        dbg.to_str().unwrap(),
    ]));
    let lines = folded(&with);
    let total = root_weight(&lines, "sp_strip");
    let alpha = weight_with(
        &lines,
        "sp_strip",
        &["main", "alpha_caller", "alpha_work", "spin"],
    );
    let beta = weight_with(
        &lines,
        "sp_strip",
        &["main", "beta_caller", "beta_work", "spin"],
    );
    assert!(total > min_samples(100), "{lines:?}");
    assert!(
        (alpha + beta) as f64 >= 0.9 * total as f64,
        "{alpha}+{beta} of {total}: {lines:?}"
    );

    // symbolize by build id through the debug directory agrees with the unstripped ELF.
    let id = build_id(&stripped);
    // File offsets of the functions (their addresses less the executable
    // segment's bias, which differs between architectures' linkers).
    let bias = exec_bias(&split());
    let syms = String::from_utf8(Command::new("nm").arg(split()).output().unwrap().stdout).unwrap();
    let offsets: Vec<String> = ["main", "alpha_caller", "alpha_work", "beta_work", "spin"]
        .iter()
        .filter_map(|f| {
            let l = syms.lines().find(|l| l.ends_with(&format!(" {f}")))?;
            let a = u64::from_str_radix(l.split_whitespace().next()?, 16).ok()?;
            Some(format!("{:#x}", a - bias + 4))
        })
        .collect();
    assert_eq!(offsets.len(), 5, "{syms}");
    let offsets: Vec<&str> = offsets.iter().map(String::as_str).collect();
    let mut args = vec!["symbolize", "--build-id", &id, "--debug-dir"];
    args.push(dbg.to_str().unwrap());
    args.extend(offsets.iter().copied());
    let by_id = ok(&run(&args));
    let elf = split();
    let mut args = vec!["symbolize", "--elf", elf.to_str().unwrap()];
    args.extend(offsets.iter().copied());
    let by_elf = ok(&run(&args));
    assert_eq!(by_id, by_elf);
    assert_eq!(by_id.lines().count(), offsets.len());
    assert!(by_id.contains("split.c:"), "{by_id}");
}

/// A debuginfod server on loopback, killed (by pid) when dropped.
struct Debuginfod {
    child: Child,
    url: String,
}

impl Drop for Debuginfod {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Raw HTTP status of a GET on loopback (no client library in the tests).
fn http_status(port: u16, path: &str) -> Option<u16> {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut buf = [0u8; 64];
    let n = s.read(&mut buf).ok()?;
    String::from_utf8_lossy(&buf[..n])
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

fn start_debuginfod(dir: &Path, id: &str) -> Option<Debuginfod> {
    if Command::new("debuginfod")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_err()
    {
        skip("the debuginfod server is not installed (scripts/install-deps)");
        return None;
    }
    let port = free_port();
    let child = Command::new("debuginfod")
        .arg("-F")
        .arg(dir.join("srv"))
        .arg("-d")
        .arg(dir.join("index.sqlite"))
        .args(["-p", &port.to_string(), "-t0", "-g0"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let server = Debuginfod {
        child,
        url: format!("http://127.0.0.1:{port}"),
    };
    // Scanning the directory takes a moment; bounded wait.
    let deadline = Instant::now() + Duration::from_secs(60);
    let path = format!("/buildid/{id}/debuginfo");
    while Instant::now() < deadline {
        if http_status(port, &path) == Some(200) {
            return Some(server);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("debuginfod on port {port} never served {path}");
}

#[test]
#[ignore = "needs root and BPF"]
fn debuginfod_serves_the_debug_file_for_a_report() {
    require_root();
    let dir = scratch("debuginfod");
    let (stripped, debug, _) = stripped_with_debug_dir(&split(), &dir);
    let id = build_id(&stripped);
    std::fs::create_dir_all(dir.join("srv")).unwrap();
    std::fs::copy(&debug, dir.join("srv/split.debug")).unwrap();
    let Some(server) = start_debuginfod(&dir, &id) else {
        return;
    };
    let rec = dir.join("run.bscope");
    ok(&sample(
        "record",
        &[],
        &rec,
        &[stripped.to_str().unwrap(), "sp_dinfod", "1"],
    ));
    let cache = dir.join("cache");
    let cache_s = cache.to_str().unwrap();
    let env = [("XDG_CACHE_HOME", cache_s), ("DEBUGINFOD_URLS", "")];
    let out = dir.join("out.folded");
    let o = run_env(
        &[
            "report",
            rec.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
            "--debuginfod",
            &server.url,
        ],
        &env,
        Duration::from_secs(120),
    );
    ok(&o);
    let lines = folded(&out);
    let total = root_weight(&lines, "sp_dinfod");
    let named = weight_with(&lines, "sp_dinfod", &["alpha_caller", "alpha_work"])
        + weight_with(&lines, "sp_dinfod", &["beta_caller", "beta_work"]);
    assert!(
        total > min_samples(100) && named as f64 >= 0.9 * total as f64,
        "{named} of {total}: {lines:?}"
    );
    let cached = cache.join(format!("bpfscope/debuginfod/{id}/debuginfo"));
    assert!(cached.is_file(), "not cached at {}", cached.display());

    // The DEBUGINFOD_URLS convention works too, and a second report uses the cache.
    drop(server);
    let out2 = dir.join("out2.folded");
    let o = run_env(
        &[
            "report",
            rec.to_str().unwrap(),
            "-o",
            out2.to_str().unwrap(),
        ],
        &[
            ("XDG_CACHE_HOME", cache_s),
            ("DEBUGINFOD_URLS", "http://127.0.0.1:9"),
        ],
        Duration::from_secs(120),
    );
    ok(&o);
    assert_eq!(std::fs::read(&out).unwrap(), std::fs::read(&out2).unwrap());
}

#[test]
#[ignore = "needs root and BPF"]
fn pprof_output_decodes_back() {
    use bpfscope::render::pprof;
    use prost::Message;

    require_root();
    let dir = scratch("pprof");
    let out = dir.join("cpu.pb.gz");
    let w = split();
    ok(&sample(
        "profile",
        &[],
        &out,
        &[w.to_str().unwrap(), "sp_pprof", "1"],
    ));
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(std::fs::File::open(&out).unwrap())
        .read_to_end(&mut raw)
        .unwrap();
    let p = pprof::proto::Profile::decode(&raw[..]).unwrap();
    let s = |i: i64| p.string_table[i as usize].as_str();
    assert_eq!(p.string_table[0], "");
    let types: Vec<(&str, &str)> = p
        .sample_type
        .iter()
        .map(|t| (s(t.r#type), s(t.unit)))
        .collect();
    assert_eq!(types, vec![("samples", "count"), ("cpu", "nanoseconds")]);
    assert_eq!(p.period, 1_000_000_000 / 499);
    // The workload's mapping carries its build id.
    let id = build_id(&w);
    let m = p
        .mapping
        .iter()
        .find(|m| s(m.build_id) == id)
        .expect("mapping with the workload's build id");
    assert!(s(m.filename).ends_with("split"), "{}", s(m.filename));
    // pprof takes the first mapping for the main binary: the profiled program.
    assert_eq!(
        s(p.mapping[0].build_id),
        id,
        "first mapping: {}",
        s(p.mapping[0].filename)
    );
    // alpha_work has a function entry with its source file, and located lines.
    let f = p
        .function
        .iter()
        .find(|f| s(f.name) == "alpha_work")
        .expect("alpha_work function");
    assert!(s(f.filename).ends_with("split.c"));
    let loc = p
        .location
        .iter()
        .find(|l| l.line.iter().any(|ln| ln.function_id == f.id))
        .expect("a location in alpha_work");
    assert_eq!(loc.mapping_id, m.id);
    assert!(loc.line.iter().all(|ln| ln.line > 0));
    // Every reference resolves; values are consistent.
    let loc_ids: std::collections::HashSet<u64> = p.location.iter().map(|l| l.id).collect();
    let mut samples = 0;
    for smp in &p.sample {
        assert!(smp.location_id.iter().all(|i| loc_ids.contains(i)));
        assert_eq!(smp.value.len(), 2);
        assert_eq!(smp.value[1], smp.value[0] * p.period);
        samples += smp.value[0];
        assert!(smp.label.iter().any(|l| s(l.key) == "pid" && l.num > 0));
    }
    assert!(samples > 100, "{samples}");
}

#[test]
#[ignore = "needs root and BPF"]
fn off_cpu_time_is_weighted_by_time_blocked() {
    require_root();
    let dir = scratch("offcpu");
    let out = dir.join("off.folded");
    let w = split();
    ok(&sample(
        "profile",
        &["--off-cpu"],
        &out,
        &[w.to_str().unwrap(), "sp_off", "1", "sleep"],
    ));
    let lines = folded(&out);
    // Microseconds blocked in nanosleep, reached from main, over one second.
    let us = weight_with(&lines, "sp_off", &["main"]);
    let sleeping: u64 = lines
        .iter()
        .filter(|(f, _)| f[0] == "sp_off" && f.iter().any(|x| x.contains("nanosleep")))
        .map(|(_, n)| n)
        .sum();
    assert!(
        (800_000..=1_300_000).contains(&sleeping),
        "blocked {sleeping} us in nanosleep: {lines:?}"
    );
    assert!(us >= sleeping, "{us} {sleeping}");
    assert!(
        lines
            .iter()
            .any(|(f, _)| f.iter().any(|x| x == "schedule_[k]")),
        "kernel frames down to schedule: {lines:?}"
    );
}

#[test]
#[ignore = "needs root and BPF"]
fn pid_and_cgroup_targets() {
    require_root();
    let dir = scratch("targets");
    let w = split();
    // -p: only that process, even with another busy one beside it. Both
    // spin until killed (Gated's drop): an emulated guest's profiler can
    // take longer to load and attach than a fixed run of theirs lasts.
    let spin = |name: &str| {
        let mut c = Command::new(&w);
        c.args([name, "600"]);
        let mut g = Gated::spawn(c);
        g.go();
        g
    };
    let target = spin("sp_pid");
    let other = spin("sp_other");
    std::thread::sleep(Duration::from_millis(200));
    let out = dir.join("pid.folded");
    ok(&run(&[
        "profile",
        "-p",
        &target.pid(),
        "-F",
        "499",
        "--duration",
        "1",
        "-o",
        out.to_str().unwrap(),
    ]));
    let lines = folded(&out);
    assert!(root_weight(&lines, "sp_pid") > min_samples(50), "{lines:?}");
    assert!(lines.iter().all(|(f, _)| f[0] == "sp_pid"), "{lines:?}");

    // --cgroup: only tasks in that cgroup (v2).
    let Some(root2) = cgroup2_mount() else {
        skip("cgroup part: no cgroup2 mount");
        return;
    };
    let cg = root2.join(format!("bpfscope-test-{}", std::process::id()));
    std::fs::create_dir_all(&cg).unwrap();
    std::fs::write(cg.join("cgroup.procs"), other.pid()).unwrap();
    let out = dir.join("cg.folded");
    let o = run(&[
        "profile",
        "--cgroup",
        cg.to_str().unwrap(),
        "-F",
        "499",
        "--duration",
        "1",
        "-o",
        out.to_str().unwrap(),
    ]);
    // The cgroup can only be removed once empty.
    drop((target, other));
    let _ = std::fs::remove_dir(&cg);
    ok(&o);
    let lines = folded(&out);
    assert!(
        root_weight(&lines, "sp_other") > min_samples(50),
        "{lines:?}"
    );
    assert!(lines.iter().all(|(f, _)| f[0] == "sp_other"), "{lines:?}");
}

/// `-- CMD` runs to the command's end however long it takes (no default
/// --duration cuts it), and bpfscope exits with the command's status, as
/// `perf record` does: its exit code, or 128 + the signal that ended it.
#[test]
#[ignore = "needs root and BPF"]
fn a_command_runs_to_its_end_and_its_status_is_passed_on() {
    require_root();
    let dir = scratch("to-the-end");
    let w = split();
    let done = dir.join("done");
    let out = dir.join("end.folded");
    // 11 s: past the 10 s every other target defaults to. A run cut
    // short would send the shell SIGTERM before it wrote `done`.
    let script = format!(
        "{} sp_end 11 && touch {} && exit 3",
        w.display(),
        done.display()
    );
    let t0 = Instant::now();
    let o = run(&[
        "profile",
        "-o",
        out.to_str().unwrap(),
        "--",
        "/bin/sh",
        "-c",
        &script,
    ]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(t0.elapsed() >= Duration::from_secs(11));
    assert!(done.exists(), "the command was cut short: {}", stderr(&o));
    assert!(root_weight(&folded(&out), "sp_end") > 0);

    let rec = dir.join("end.bscope");
    let o = run(&[
        "record",
        "-o",
        rec.to_str().unwrap(),
        "--",
        "/bin/sh",
        "-c",
        "kill -TERM $$",
    ]);
    assert_eq!(o.status.code(), Some(128 + 15), "{}", stderr(&o));
    assert!(rec.is_file(), "{}", stderr(&o));

    // An explicit --duration still ends the run (and says so); the
    // command's status is not known then: exit status 0.
    let o = run(&[
        "profile",
        "--duration",
        "1",
        "-o",
        out.to_str().unwrap(),
        "--",
        "/bin/sleep",
        "5",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("--duration ended the profile before the command exited"),
        "{}",
        stderr(&o)
    );
}

/// The accounting lines: the total taken is the sum of the CPUs' (each
/// online CPU named once), idle time is said per CPU, no CPU that idled
/// is said to have samples not delivered, and a recording's report says
/// the same as the run.
#[test]
#[ignore = "needs root and BPF"]
fn samples_are_accounted_per_cpu_with_idle_time_as_idle() {
    require_root();
    let dir = scratch("per-cpu");
    let rec = dir.join("sleep.bscope");
    let o = run(&[
        "record",
        "-F",
        "199",
        "-o",
        rec.to_str().unwrap(),
        "--",
        "/bin/sleep",
        "2",
    ]);
    ok(&o);
    let err = stderr(&o);
    let line = |prefix: &str| {
        err.lines()
            .find_map(|l| l.strip_prefix("bpfscope: ")?.strip_prefix(prefix))
            .map(String::from)
    };
    let total = line("samples: ").unwrap_or_else(|| panic!("no totals: {err}"));
    let taken: u64 = total.split(' ').next().unwrap().parse().unwrap();
    let per_cpu = line("per CPU at 199 Hz: ").unwrap_or_else(|| panic!("no CPUs: {err}"));
    // CPUs are separated by "; CPU " (a CPU's own note may hold "; ").
    let cpus: Vec<(u32, u64, bool)> = format!("; {per_cpu}")
        .split("; CPU ")
        .skip(1)
        .map(|p| format!("CPU {p}"))
        .map(|p| {
            let f: Vec<&str> = p.split(' ').collect();
            assert_eq!((f[0], f[3]), ("CPU", "taken"), "{p}");
            (
                f[1].parse().unwrap(),
                f[2].parse().unwrap(),
                p.contains(" idle of "),
            )
        })
        .collect();
    let online = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap();
    let n = online
        .trim()
        .split(',')
        .map(|r| match r.split_once('-') {
            Some((a, b)) => b.parse::<u32>().unwrap() - a.parse::<u32>().unwrap() + 1,
            None => 1,
        })
        .sum::<u32>();
    assert_eq!(cpus.len() as u32, n, "{per_cpu}");
    assert_eq!(cpus.iter().map(|c| c.1).sum::<u64>(), taken, "{err}");
    // 2 s at 199 Hz on each CPU, give or take the timers of a busy machine:
    // fired, or skipped by a clock whose CPU slept (no tick there).
    let skipped: u64 = per_cpu
        .split("its clock skipped ")
        .skip(1)
        .filter_map(|r| r.split(' ').next()?.parse::<u64>().ok())
        .sum();
    assert!(
        (taken + skipped) * 10 >= 199 * 2 * u64::from(n) * 7,
        "{err}"
    );
    if let Some(nd) = line("not delivered: ") {
        for (cpu, _, idle) in &cpus {
            assert!(
                !(*idle && nd.contains(&format!("CPU {cpu}: "))),
                "an idle CPU said to lose samples: {err}"
            );
        }
    }
    let r = run(&[
        "report",
        rec.to_str().unwrap(),
        "-o",
        dir.join("r.folded").to_str().unwrap(),
    ]);
    ok(&r);
    let again = stderr(&r);
    assert!(again.contains(&format!("samples: {total}")), "{again}");
    assert!(
        again.contains(&format!("per CPU at 199 Hz: {per_cpu}")),
        "{again}"
    );
}

/// Thread names in every output: a frame per thread under the process in
/// folded stacks and flame graphs with --by-thread, `thread` in JSON, the
/// `thread_name` label in pprof; and flame graphs colored by frame kind
/// with a legend.
#[test]
#[ignore = "needs root and BPF"]
fn thread_names_in_every_output_and_frame_kinds_in_flame_graphs() {
    require_root();
    let dir = scratch("threads");
    let w = workload_with("workers", &["-pthread"]);
    let rec = dir.join("w.bscope");
    ok(&sample(
        "record",
        &[],
        &rec,
        &[w.to_str().unwrap(), "wk_names", "2", "2"],
    ));
    let out = |name: &str, extra: &[&str]| {
        let p = dir.join(name);
        let mut args = vec!["report", rec.to_str().unwrap(), "-o", p.to_str().unwrap()];
        args.extend(extra);
        ok(&run(&args));
        p
    };
    let lines = folded(&out("t.folded", &["--by-thread"]));
    let total = root_weight(&lines, "wk_names");
    for t in ["worker-0", "worker-1"] {
        let n = weight_with(&lines, "wk_names", &[t]);
        let spin = lines
            .iter()
            .filter(|(f, _)| f.len() > 2 && f[1] == t && f.iter().any(|x| x == "worker_spin"))
            .map(|(_, n)| n)
            .sum::<u64>();
        assert!(n * 5 > total, "{t}: {n} of {total}\n{lines:?}");
        assert!(spin * 10 > n * 8, "{t}: {spin} of {n} in worker_spin");
    }
    // Without --by-thread the process is the root and its callers follow.
    let plain = folded(&out("p.folded", &[]));
    assert!(plain.iter().all(|(f, _)| f[1] != "worker-0"), "{plain:?}");

    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out("t.json", &[])).unwrap()).unwrap();
    let threads: std::collections::BTreeSet<&str> = json["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["thread"].as_str())
        .collect();
    assert!(
        threads.contains("worker-0") && threads.contains("worker-1"),
        "{threads:?}"
    );
    let kinds: std::collections::BTreeSet<&str> = json["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["frames"].as_array().unwrap().iter())
        .filter_map(|f| f["kind"].as_str())
        .collect();
    assert!(
        kinds.contains("native") && kinds.contains("kernel"),
        "{kinds:?}"
    );

    let pb = out("t.pb.gz", &[]);
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(std::fs::File::open(&pb).unwrap())
        .read_to_end(&mut raw)
        .unwrap();
    // The label's value is in the string table, next to its key.
    let text = String::from_utf8_lossy(&raw);
    assert!(
        text.contains("thread_name") && text.contains("worker-1"),
        "no thread_name label in the pprof"
    );

    let svg = std::fs::read_to_string(out("t.svg", &["--by-thread"])).unwrap();
    assert!(svg.contains("<g id=\"legend\">"), "no legend");
    // Each frame's fill by its title: kernel frames orange, the workload's
    // own red to yellow, threads aqua.
    let fill_of = |name: &str| -> Option<(u8, u8, u8)> {
        let at = svg.find(&format!("<title>{name} ("))?;
        let rest = &svg[at..];
        let f = rest.split("fill=\"rgb(").nth(1)?.split(')').next()?;
        let v: Vec<u8> = f.split(',').filter_map(|x| x.parse().ok()).collect();
        Some((v[0], v[1], v[2]))
    };
    let (r, g, b) = fill_of("worker_spin").expect("worker_spin in the graph");
    assert!(r >= 200 && b <= 80 && g >= 50, "native {r},{g},{b}");
    let (r, g, b) = fill_of("worker-0").expect("thread frame");
    assert!(r < 170 && g >= 190 && b >= 190, "thread {r},{g},{b}");
    // Kernel frames (named in the JSON) are orange.
    let kernel_names: Vec<&str> = json["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["frames"].as_array().unwrap().iter())
        .filter(|f| f["kind"] == "kernel")
        .filter_map(|f| f["functions"][0]["name"].as_str())
        .collect();
    let (r, g, b) = kernel_names
        .iter()
        .find_map(|n| fill_of(n))
        .unwrap_or_else(|| panic!("no kernel frame drawn: {kernel_names:?}"));
    assert!(
        r >= 220 && (120..=180).contains(&g) && b <= 60,
        "kernel {r},{g},{b}"
    );
}

/// `diff` of two recordings of one workload whose split moves from 3:1
/// (alpha 75%) to 3:3 (50%): alpha's total share drops by 25 points and
/// beta's grows by as much, within sampling error; the differential flame
/// graph and the difffolded lines agree, and folded files give the same
/// table as the recordings.
#[test]
#[ignore = "needs root and BPF"]
fn diff_of_two_recordings_shows_the_known_change() {
    require_root();
    let dir = scratch("diff");
    let w = split();
    let (base, new) = (dir.join("base.bscope"), dir.join("new.bscope"));
    // User stacks only: the shares compared are the workload's, and under
    // emulation interrupt handling took 6-19% of the samples, a different
    // amount in each recording (spin's self share moved by 12 points).
    ok(&sample(
        "record",
        &["--user-only"],
        &base,
        &[w.to_str().unwrap(), "sp_diff", "3"],
    ));
    ok(&sample(
        "record",
        &["--user-only"],
        &new,
        &[w.to_str().unwrap(), "sp_diff", "3", "beta", "3"],
    ));
    let table = |a: &Path, b: &Path| -> Vec<serde_json::Value> {
        json_lines(&ok(&run(&[
            "diff",
            a.to_str().unwrap(),
            b.to_str().unwrap(),
            "--json",
            "-n",
            "1000",
        ])))
    };
    let rows = table(&base, &new);
    let get = |rows: &[serde_json::Value], f: &str, k: &str| {
        rows.iter()
            .find(|r| r["function"] == f)
            .unwrap_or_else(|| panic!("{f} in {rows:?}"))[k]
            .as_f64()
            .unwrap()
    };
    let (a, b) = (
        get(&rows, "alpha_caller", "total_delta"),
        get(&rows, "beta_caller", "total_delta"),
    );
    assert!((-31.0..=-19.0).contains(&a), "alpha {a}\n{rows:?}");
    assert!((19.0..=31.0).contains(&b), "beta {b}");
    // Emulated, the dynamic loader's start-up is a few percent of the
    // samples, a different few in each run (3.2 points once on arm64).
    let spin_tol = if emulated() { 6.0 } else { 3.0 };
    assert!(
        get(&rows, "spin", "self_delta").abs() < spin_tol,
        "{rows:?}"
    );
    // The same from folded files.
    let (bf, nf) = (dir.join("base.folded"), dir.join("new.folded"));
    ok(&run(&[
        "report",
        base.to_str().unwrap(),
        "-o",
        bf.to_str().unwrap(),
    ]));
    ok(&run(&[
        "report",
        new.to_str().unwrap(),
        "-o",
        nf.to_str().unwrap(),
    ]));
    let frows = table(&bf, &nf);
    assert!((get(&frows, "alpha_caller", "total_delta") - a).abs() < 1e-9);
    // The flame graph and difffolded lines.
    let svg = dir.join("d.svg");
    let text = ok(&run(&[
        "diff",
        base.to_str().unwrap(),
        new.to_str().unwrap(),
        "-o",
        svg.to_str().unwrap(),
    ]));
    assert!(
        text.contains("alpha_caller") && text.contains("DELTA"),
        "{text}"
    );
    let svg = std::fs::read_to_string(svg).unwrap();
    assert!(svg.contains("red: grew from BASE to NEW"), "no subtitle");
    let dfolded = dir.join("d.folded");
    ok(&run(&[
        "diff",
        bf.to_str().unwrap(),
        nf.to_str().unwrap(),
        "-o",
        dfolded.to_str().unwrap(),
    ]));
    let lines = std::fs::read_to_string(dfolded).unwrap();
    let (mut old, mut now) = (0u64, 0u64);
    for l in lines.lines() {
        let f: Vec<&str> = l.rsplitn(3, ' ').collect();
        now += f[0].parse::<u64>().unwrap();
        old += f[1].parse::<u64>().unwrap();
    }
    // BASE is scaled to NEW's total (rounding down per stack).
    assert!(old <= now && old * 100 >= now * 95, "{old} vs {now}");
    // Bad input: one line, exit 2.
    let o = run(&["diff", base.to_str().unwrap(), "/nonexistent.folded"]);
    assert_usage_error(&o, "missing file");
    std::fs::write(dir.join("bad.folded"), "not folded\n").unwrap();
    let o = run(&[
        "diff",
        base.to_str().unwrap(),
        dir.join("bad.folded").to_str().unwrap(),
    ]);
    assert_usage_error(&o, "not folded");
}

/// `annotate` of a function whose loop has one hot line of dependent
/// multiplications and one cheap line: the hot line holds most samples,
/// every sample is on one of the function's instructions, and the
/// instructions are in address order with their source lines.
#[test]
#[ignore = "needs root and BPF"]
fn annotate_finds_the_hot_line_and_its_instructions() {
    require_root();
    let dir = scratch("annotate");
    let w = workload_with("hotline", &["-O0"]);
    let rec = dir.join("hot.bscope");
    ok(&sample(
        "record",
        &[],
        &rec,
        &[w.to_str().unwrap(), "hl_anno", "2"],
    ));
    let src = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/workloads/hotline.c"),
    )
    .unwrap();
    let line_of = |mark: &str| {
        src.lines()
            .position(|l| l.contains(mark) && !l.trim_start().starts_with('*'))
            .unwrap() as u64
            + 1
    };
    let (hot, cold) = (line_of("/* HOT */"), line_of("/* COLD */"));
    let out = ok(&run(&[
        "annotate",
        rec.to_str().unwrap(),
        "hot_loop",
        "--json",
    ]));
    let a: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(a["type"], "annotate");
    let samples = a["samples"].as_u64().unwrap();
    // 3 s at 499 Hz is ~1500 when the CPU is ours; a busy machine gives less.
    assert!(samples > 200, "{out}");
    let lines = a["lines"].as_array().unwrap();
    assert!(lines[0]["file"].as_str().unwrap().ends_with("hotline.c"));
    // The busiest line, whichever it is, has the count of its instructions.
    let (top, top_n) = (
        lines[0]["line"].as_u64(),
        lines[0]["count"].as_u64().unwrap(),
    );
    // Under emulation every sample of the loop lands on its first line:
    // interrupts are taken only between translated blocks, and the loop's
    // body is one block.
    if !skip_if_emulated("samples of the loop all land at the start of its translated block") {
        assert_eq!(top, Some(hot), "{lines:?}");
        assert!(lines[0]["source"].as_str().unwrap().contains("/* HOT */"));
        assert!(top_n * 10 >= samples * 7, "hot line {top_n} of {samples}");
        let cold_n = lines
            .iter()
            .find(|l| l["line"].as_u64() == Some(cold))
            .map_or(0, |l| l["count"].as_u64().unwrap());
        assert!(cold_n * 5 < top_n, "cold {cold_n} hot {top_n}");
    }
    let ins = a["instructions"].as_array().unwrap();
    let on_ins: u64 = ins.iter().map(|i| i["count"].as_u64().unwrap()).sum();
    assert_eq!(on_ins + a["undecoded"].as_u64().unwrap(), samples);
    assert_eq!(a["undecoded"], 0, "{out}");
    let addrs: Vec<u64> = ins
        .iter()
        .map(|i| {
            u64::from_str_radix(i["offset"].as_str().unwrap().trim_start_matches("0x"), 16).unwrap()
        })
        .collect();
    assert!(addrs.windows(2).all(|w| w[0] < w[1]));
    // The loop's multiplication, in the architecture's own mnemonics.
    let mul: &[&str] = if cfg!(target_arch = "aarch64") {
        &["mul ", "madd "]
    } else {
        &["imul"]
    };
    assert!(
        ins.iter().any(|i| mul
            .iter()
            .any(|m| i["text"].as_str().unwrap().starts_with(m))),
        "{out}"
    );
    let on_top: u64 = ins
        .iter()
        .filter(|i| i["line"].as_u64() == top)
        .map(|i| i["count"].as_u64().unwrap())
        .sum();
    assert_eq!(on_top, top_n);
    // The text form, and a function that was not sampled.
    let text = ok(&run(&["annotate", rec.to_str().unwrap(), "hot_loop"]));
    assert!(
        text.contains("By source line:") && text.contains("By instruction:"),
        "{text}"
    );
    let o = run(&["annotate", rec.to_str().unwrap(), "no_such_function"]);
    assert_usage_error(&o, "unsampled function");
    assert!(stderr(&o).contains("hot_loop"), "{}", stderr(&o));
}

fn cgroup2_mount() -> Option<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        (post.split_whitespace().next()? == "cgroup2")
            .then(|| pre.split_whitespace().nth(4).map(PathBuf::from))?
    })
}

#[test]
#[ignore = "needs root and BPF"]
fn recordings_are_atomic_and_corruption_is_rejected() {
    require_root();
    let dir = scratch("recordings");
    let rec = dir.join("run.bscope");
    // While recording, the final name does not exist; Ctrl-C finishes it.
    let r = start(&["record", "--duration", "60", "-o", rec.to_str().unwrap()]);
    let w = split();
    // Emulated, longer (see the short-lived process's case above).
    let st = Command::new(&w)
        .args(["sp_rec", &secs(1).to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    assert!(
        !rec.exists(),
        "the recording appeared before it was complete"
    );
    let (_, err) = r.interrupt();
    assert!(rec.is_file(), "{err}");
    let good = std::fs::read(&rec).unwrap();

    // JSON and the top table from the same recording.
    let json = dir.join("r.json");
    ok(&run(&[
        "report",
        rec.to_str().unwrap(),
        "-o",
        json.to_str().unwrap(),
    ]));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(v["mode"], "cpu");
    assert!(v["stacks"].as_array().is_some_and(|a| !a.is_empty()));
    let top = ok(&run(&["report", rec.to_str().unwrap()]));
    assert!(top.contains("Top functions"), "{top}");
    assert!(top.contains("spin"), "{top}");
    let svg = dir.join("r.svg");
    ok(&run(&[
        "report",
        rec.to_str().unwrap(),
        "-o",
        svg.to_str().unwrap(),
    ]));
    assert!(std::fs::read_to_string(&svg).unwrap().contains("<svg"));

    let bad = dir.join("bad.bscope");
    let mut cases: Vec<(String, Vec<u8>)> = vec![
        ("empty".into(), vec![]),
        ("foreign ELF".into(), std::fs::read("/bin/true").unwrap()),
        ("text".into(), b"hello world\n".to_vec()),
    ];
    for n in [4, 12, 20, good.len() / 2, good.len() - 1] {
        cases.push((format!("truncated to {n}"), good[..n].to_vec()));
    }
    for at in [30, good.len() / 2, good.len() - 30] {
        let mut b = good.clone();
        b[at] ^= 0x5a;
        cases.push((format!("byte {at} flipped"), b));
    }
    let mut v2 = good.clone();
    v2[8] = 7;
    cases.push(("future major version".into(), v2));
    for (what, bytes) in cases {
        std::fs::write(&bad, &bytes).unwrap();
        let o = run(&["report", bad.to_str().unwrap()]);
        assert_usage_error(&o, &what);
    }
    let o = run(&["report", dir.join("missing.bscope").to_str().unwrap()]);
    assert_usage_error(&o, "missing file");
}

#[test]
fn bad_input_is_one_line_and_exit_2() {
    for (args, what) in [
        (vec!["profile", "-F", "0"], "zero frequency"),
        (vec!["profile", "-o", "out.txt"], "unknown format"),
        (vec!["profile", "--duration", "-1"], "negative duration"),
        (vec!["profile", "-p", "0"], "bad pid"),
        (
            vec!["profile", "--user-only", "--kernel-only"],
            "conflicting frames",
        ),
        (vec!["profile", "--", "/nonexistent/cmd"], "missing command"),
        (vec!["profile", "--lang", "ruby"], "unknown runtime"),
        (
            vec!["profile", "--lang", "none,python"],
            "none with a runtime",
        ),
        (vec!["symbolize", "--elf", "/bin/true", "zz"], "bad address"),
        (vec!["symbolize", "0x10"], "no source"),
        (
            vec!["symbolize", "--build-id", "xyz", "0x10"],
            "bad build id",
        ),
        (
            vec!["report", "x.bscope", "--debuginfod", "ftp://x"],
            "bad debuginfod URL",
        ),
    ] {
        let o = run(&args);
        assert_usage_error(&o, what);
    }
}

#[test]
fn symbolize_prints_one_line_per_address_in_order() {
    let w = split();
    // nm's addresses are virtual; the executable segment maps them to file offsets.
    let nm = Command::new("nm").arg(&w).output().unwrap();
    let syms: BTreeMap<String, u64> = String::from_utf8_lossy(&nm.stdout)
        .lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let a = u64::from_str_radix(it.next()?, 16).ok()?;
            let _t = it.next()?;
            Some((it.next()?.to_string(), a))
        })
        .collect();
    let bias = exec_bias(&w);
    let a = syms["alpha_work"] - bias;
    let b = syms["beta_caller"] - bias + 4;
    let input = format!("{a:#x}\n0x1\n{b:x}\n");
    let mut child = Command::new(bin())
        .args(["symbolize", "--elf", w.to_str().unwrap()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert!(
        lines[0].starts_with(&format!("{a:#x} alpha_work+0x0 ")),
        "{text}"
    );
    assert!(lines[0].contains("split.c:"), "{text}");
    assert_eq!(lines[1], "0x1 ??");
    assert!(
        lines[2].starts_with(&format!("{b:#x} beta_caller+0x4 ")),
        "{text}"
    );
}

/// p_vaddr - p_offset of the executable LOAD segment.
fn exec_bias(bin: &Path) -> u64 {
    let out = Command::new("readelf")
        .arg("-lW")
        .arg(bin)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let l = text
        .lines()
        .find(|l| l.trim_start().starts_with("LOAD") && l.contains("R E"))
        .expect("executable segment");
    let f: Vec<&str> = l.split_whitespace().collect();
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap();
    hex(f[2]) - hex(f[1])
}

#[test]
#[ignore = "needs root and BPF"]
fn cxx_names_demangled_and_inlined_frames_shown() {
    require_root();
    if skip_if_emulated(
        "interrupts land only between translated blocks, so samples miss the inlined code's addresses",
    ) {
        return;
    }
    let dir = scratch("cxx");
    let Some(bin) = cxx_workload(&dir.join("cxx"), &["-fno-omit-frame-pointer"]) else {
        return;
    };
    let out = dir.join("cxx.folded");
    ok(&sample(
        "profile",
        &[],
        &out,
        &[bin.to_str().unwrap(), "cx_test", "1"],
    ));
    let lines = folded(&out);
    let total = root_weight(&lines, "cx_test");
    // The method's demangled name, directly under main (return addresses
    // are looked up at the call, not at the inlined code after it), with
    // the inlined template as a frame of its own below it.
    let run = weight_with(
        &lines,
        "cx_test",
        &["main", "shapes::Worker::run(unsigned long)"],
    );
    let inlined = weight_with(
        &lines,
        "cx_test",
        &[
            "shapes::Worker::run(unsigned long)",
            "unsigned long shapes::mix<unsigned long>(unsigned long)",
        ],
    );
    assert!(total > min_samples(100), "{lines:?}");
    assert!(
        run as f64 >= 0.9 * total as f64,
        "{run} of {total}: {lines:?}"
    );
    assert!(inlined > 0, "no inlined frame: {lines:?}");
}

#[test]
fn rust_names_are_demangled() {
    // bpfscope's own binary: a Rust ELF with a symbol table.
    let me = Path::new(bin());
    let nm = Command::new("nm").arg(me).output().unwrap();
    let text = String::from_utf8_lossy(&nm.stdout);
    let addr = text
        .lines()
        .find_map(|l| {
            let mut it = l.split_whitespace();
            let a = it.next()?;
            let _t = it.next()?;
            it.next()?
                .starts_with("_ZN8bpfscope7profile12to_recording17h")
                .then(|| u64::from_str_radix(a, 16).ok())?
        })
        .expect("bpfscope::profile::to_recording in the symbol table");
    let off = addr - exec_bias(me);
    let out = ok(&run(&["symbolize", "--elf", bin(), &format!("{off:#x}")]));
    assert!(
        out.starts_with(&format!("{off:#x} bpfscope::profile::to_recording+0x0")),
        "{out}"
    );
}

#[test]
#[ignore = "needs root and BPF"]
fn symbolize_kernel_says_when_addresses_are_hidden() {
    use std::os::unix::process::CommandExt;
    require_root();
    let restrict = std::fs::read_to_string("/proc/sys/kernel/kptr_restrict").unwrap();
    let paranoid = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid").unwrap();
    let (restrict, paranoid) = (restrict.trim(), paranoid.trim());
    if restrict == "0" && paranoid.parse::<i32>().unwrap() <= 1 {
        skip("kernel addresses are visible to every user here");
        return;
    }
    // The first symbol with an address (per-CPU symbols sit at 0 on some kernels).
    let all = std::fs::read_to_string("/proc/kallsyms").unwrap();
    let addr = all
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .find(|a| a.bytes().any(|b| b != b'0'))
        .unwrap()
        .to_string();
    // As nobody: /proc/kallsyms shows zeros.
    let o = Command::new(bin())
        .args(["symbolize", "--kernel", &addr])
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let why = if restrict == "0" {
        format!("kernel.kptr_restrict=0 with kernel.perf_event_paranoid={paranoid}")
    } else {
        format!("kernel.kptr_restrict={restrict}")
    };
    assert_eq!(
        stderr(&o),
        format!(
            "bpfscope: kernel addresses are hidden (/proc/kallsyms shows zeros: {why} hides them from a user without CAP_SYSLOG); run as root\n"
        )
    );
    assert_eq!(
        stdout(&o),
        format!("0x{} ??\n", addr.trim_start_matches('0'))
    );
    // As root the same address has a name and nothing is said.
    let o = Command::new(bin())
        .args(["symbolize", "--kernel", &addr])
        .output()
        .unwrap();
    assert_eq!(stderr(&o), "");
    assert!(!stdout(&o).contains("??"), "{}", stdout(&o));
}
