//! BPF programs in profiles (run as root): a program loaded, made hot and
//! unloaded in the middle of a recording is named by tag and name, and
//! annotated by source line from the recording after it is gone.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::*;

/// The profiling tests here measure what share of a CPU a BPF program
/// takes, profiling every process: one at a time, or each profile's
/// symbolizing and the other's workload take that CPU from the program
/// (in a one-CPU guest, 0 of 1220 samples were left in it).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// A file in the target directory, by kernel: guests booted at once share
/// that directory and run these tests at the same time (one guest's
/// recording was read by the other's test).
fn tmp(name: &str) -> PathBuf {
    tmp_dir().join(format!("{}-{name}", release_tag()))
}

/// The files the tracing object is compiled from, by name: trace.bpf.c and
/// the headers beside it in crates/bpf/src/bpf (inlined code's line info
/// names the header it came from). profile.bpf.c is not one of them.
fn trace_sources() -> Vec<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/bpf/src/bpf");
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n == "trace.bpf.c" || n.ends_with(".h"))
        .collect();
    assert!(
        names.iter().any(|n| n == "trace.bpf.c") && names.len() > 1,
        "{names:?}"
    );
    names
}

/// Whether `at` is `FILE:LINE` with FILE one of `sources` and LINE > 0.
fn is_source_line(at: &str, sources: &[String]) -> bool {
    at.rsplit_once(':').is_some_and(|(file, line)| {
        sources.iter().any(|s| s == file) && line.parse::<u32>().is_ok_and(|l| l > 0)
    })
}

/// (id, tag) of the programs a process holds, from its fdinfo and `bpf list`.
fn progs_of(pid: i32) -> Vec<(u64, String, String)> {
    let ids = prog_ids_of(pid);
    let list = ok(&run(&["bpf", "list", "--json"]));
    json_lines(&list)
        .into_iter()
        .filter(|v| ids.contains(&v["id"].as_u64().unwrap()))
        .map(|v| {
            (
                v["id"].as_u64().unwrap(),
                v["tag"].as_str().unwrap().to_string(),
                v["name"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
#[ignore = "needs root and BPF"]
fn program_loaded_and_unloaded_mid_profile_is_named_and_annotated() {
    require_root();
    let _turn = one_at_a_time();
    let rec = tmp("bpfprof.bscope");
    let _ = std::fs::remove_file(&rec);
    // Ended by Ctrl-C once the program is gone, not after a fixed time:
    // an emulated guest took longer than 5 s for the writes, and the
    // recording ended with the program still loaded. Hence --duration too:
    // its 10 s default came before the unload in a slow guest.
    let recorder = start(&[
        "record",
        "-F",
        "499",
        "--duration",
        "3600",
        "-o",
        rec.to_str().unwrap(),
    ]);
    // A program that does not exist when recording starts...
    // Without the per-CPU key cache: the general path's hash-map update
    // keeps the program long enough on the CPU for the sampler to find it
    // (with the cache, a loaded host once gave it fewer than 5 samples).
    let mut cmd = Command::new(bin());
    cmd.args([
        "count",
        "tracepoint:syscalls:sys_enter_write",
        "--by",
        "comm",
    ])
    .env("BPFSCOPE_KEY_CACHE", "0");
    let counter = start_cmd(cmd, "Attached");
    let progs = progs_of(counter.pid());
    let (id, tag, name) = progs
        .iter()
        .find(|p| p.2 == "bpfscope_sysin")
        .cloned()
        .unwrap_or_else(|| panic!("the counter's program: {progs:?}"));
    // ...made hot by a million writes...
    let w = workload("writer");
    let st = status_within(
        Command::new(&w).args(["wr_bpfprof", "1000000", "1"]),
        Duration::from_secs(60),
    );
    assert!(st.success());
    // ...and unloaded while recording goes on.
    let _ = counter.interrupt();
    // Gone when bpftool says no program has the id (another failure of
    // bpftool's, in a loaded guest, is not that).
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let o = Command::new("bpftool")
            .args(["prog", "show", "id", &id.to_string()])
            .output()
            .unwrap();
        if !o.status.success() && stderr(&o).contains("No such file or directory") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "program {id} still loaded: {}",
            stderr(&o)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let (_, err) = recorder.interrupt();
    assert!(rec.exists(), "recording written: {err}");

    // Reported after the program is gone: named by the kernel's own scheme.
    let folded = tmp("bpfprof.folded");
    ok(&run(&[
        "report",
        rec.to_str().unwrap(),
        "-o",
        folded.to_str().unwrap(),
    ]));
    let text = std::fs::read_to_string(&folded).unwrap();
    // The kernel names JIT code after the tag of the program's main
    // function, which is the program's tag (bpftool's) only when it has no
    // subprograms; trace.bpf.c has some (the readers in read.bpf.h).
    let suffix = format!("_{name}_[k]");
    let frame_of_prog = |f: &str| f.starts_with("bpf_prog_") && f.ends_with(&suffix);
    let symbol = text
        .lines()
        .flat_map(|l| l.rsplit_once(' ').map_or(l, |x| x.0).split(';'))
        .find(|f| frame_of_prog(f))
        .unwrap_or_else(|| panic!("no frame of {name} in the profile"))
        .to_string();
    assert!(
        tag.len() == 16 && symbol.len() == "bpf_prog_".len() + 16 + suffix.len(),
        "{symbol} (tag {tag})"
    );
    let in_prog: u64 = text
        .lines()
        .filter(|l| l.contains(&symbol))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert!(in_prog >= 5, "samples in {symbol}: {in_prog}");
    // With its BTF line info, the source line shows under the program (a
    // kernel frame, `FILE:LINE_[k]`): a line of trace.bpf.c or of a header
    // it includes.
    let sources = trace_sources();
    let under = format!("{symbol};");
    let lines_under: Vec<&str> = text
        .lines()
        .filter_map(|l| Some(l.split_once(&under)?.1.split([';', ' ']).next().unwrap()))
        .collect();
    assert!(
        lines_under
            .iter()
            .any(|f| is_source_line(f.trim_end_matches("_[k]"), &sources)),
        "source lines under {symbol}: {lines_under:?} (sources {sources:?})"
    );

    // Annotated per source line, from the recording alone.
    let o = run(&[
        "bpf",
        "annotate",
        "--recording",
        rec.to_str().unwrap(),
        &id.to_string(),
        "--json",
    ]);
    let lines = json_lines(&ok(&o));
    assert_eq!(lines.len(), 1, "{lines:?}");
    let a = &lines[0];
    assert_eq!(a["tag"], tag.as_str());
    assert_eq!(a["unloaded"], true, "the recorder said: {err}");
    let total = a["total"].as_u64().unwrap();
    // The folded output names JIT code by tag, so it also holds the
    // samples of another session's copy of this program (same code, same
    // tag) when tests run side by side; the annotation is of this id only.
    assert!(
        total >= 5 && total <= in_prog,
        "{in_prog} in the profile: {a}"
    );
    let per_line = a["lines"].as_array().unwrap();
    let sum: u64 = per_line.iter().map(|l| l["count"].as_u64().unwrap()).sum();
    assert_eq!(sum, total);
    // Full paths: each in bpfscope's BPF source directory, by a name found there.
    assert!(
        per_line.iter().all(|l| {
            let file = l["file"].as_str().unwrap();
            file.rsplit_once('/').is_some_and(|(dir, name)| {
                dir.ends_with("crates/bpf/src/bpf") && sources.iter().any(|s| s == name)
            }) && l["line"].as_u64().unwrap() > 0
                && !l["source"].as_str().unwrap().is_empty()
        }),
        "{per_line:?}"
    );
    // The text form: COUNT  file:LINE  source.
    let text = ok(&run(&[
        "bpf",
        "annotate",
        "--recording",
        rec.to_str().unwrap(),
        &id.to_string(),
    ]));
    assert!(
        text.starts_with(&format!("{} (id {id}", symbol.trim_end_matches("_[k]"))),
        "{text}"
    );
    assert!(
        text.lines().any(|l| {
            let mut f = l.split_whitespace();
            f.next().is_some_and(|n| n.parse::<u64>().is_ok())
                && f.next().is_some_and(|at| is_source_line(at, &sources))
        }),
        "{text}"
    );
}

#[test]
fn annotate_bad_input() {
    let rec = tmp("annotate-bad.bscope");
    std::fs::write(&rec, b"not a recording").unwrap();
    let o = run(&["bpf", "annotate", "--recording", rec.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("not a bpfscope recording"));
    let o = run(&["bpf", "annotate", "--recording", "/no/such/file"]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(stderr(&o).trim_end().lines().count(), 1);
}

/// A classic tracepoint program (bpftrace's, as users run it) blocks the
/// sampling program while it runs, so its samples never happen; its run time
/// is measured instead and shows as estimated samples under `[bpf run time]`,
/// with a note saying so.
#[test]
#[ignore = "needs root and BPF"]
fn classic_tracepoint_program_time_is_taken_by_the_second_sampler() {
    require_root();
    let _turn = one_at_a_time();
    let Some(mut bt) = start_bpftrace_write_count() else {
        return;
    };
    // A write loop nobody here wrote: dd, one byte per write.
    let mut dd = Command::new("dd")
        .args(["if=/dev/zero", "of=/dev/null", "bs=1", "count=100000000"])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let folded = tmp("bpf-run-time.folded");
    let o = run(&[
        "profile",
        "-F",
        "499",
        "--duration",
        "3",
        "-o",
        folded.to_str().unwrap(),
    ]);
    let _ = dd.kill();
    let _ = dd.wait();
    stop_bpftrace(&mut bt, Duration::from_secs(30));
    ok(&o);
    let (total, in_prog, text) = samples_in_write_program(&folded);
    // dd keeps one CPU busy, a fair part of it in the program; a program
    // left out (the sampling program cannot run inside it) would give 0.
    assert!(
        in_prog * 50 >= total,
        "{in_prog} of {total} samples in the program\n{text}"
    );
    let err = stderr(&o);
    assert!(err.contains("taken by a second sampler"), "{err}");
    let acct = err
        .lines()
        .find(|l| l.contains("taken by the clocks"))
        .unwrap_or_else(|| panic!("no sample accounting line: {err}"));
    assert!(!acct.contains("unaccounted"), "{acct}");
}

/// bpftrace running a classic tracepoint program on write(2), attached;
/// None (and SKIP said) without bpftrace.
pub fn start_bpftrace_write_count() -> Option<std::process::Child> {
    use std::io::{BufRead, BufReader};
    let Some(bpftrace) = ["/usr/bin/bpftrace", "/usr/local/bin/bpftrace"]
        .into_iter()
        .find(|p| Path::new(p).exists())
    else {
        skip("bpftrace is not installed (scripts/install-deps installs it)");
        return None;
    };
    let mut bt = Command::new(bpftrace)
        .args([
            "-e",
            "tracepoint:syscalls:sys_enter_write { @[comm] = count(); }",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Its output is read on a thread until it ends, so the wait for the
    // "Attaching" line has a deadline (one without held a CI run to its
    // end) and what bpftrace prints at exit has a reader.
    let out = BufReader::new(bt.stdout.take().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in out.lines().map_while(Result::ok) {
            if line.contains("Attaching") {
                let _ = tx.send(());
            }
        }
    });
    let limit = Duration::from_secs(if emulated() { 240 } else { 60 });
    if let Err(e) = rx.recv_timeout(limit) {
        let threads = thread_states(bt.id());
        let _ = bt.kill();
        wait_within(&mut bt, "bpftrace after SIGKILL", Duration::from_secs(30));
        panic!("bpftrace did not attach ({e:?} after {limit:?}); its threads: {threads}");
    }
    // BPF_PROG_TYPE_TRACEPOINT.
    wait_for_program_of(bt.id() as i32, 5, limit);
    std::thread::sleep(Duration::from_millis(500));
    Some(bt)
}

/// Samples in a folded profile, those in dd's write under the write
/// program (as perf shows them), and the text.
fn samples_in_write_program(folded: &Path) -> (u64, u64, String) {
    let text = std::fs::read_to_string(folded).unwrap();
    let (mut total, mut in_prog) = (0u64, 0u64);
    for l in text.lines() {
        let (stack, n) = l.rsplit_once(' ').unwrap();
        let n: u64 = n.parse().unwrap();
        total += n;
        if stack.starts_with("dd;")
            && stack
                .split(';')
                .any(|f| f.starts_with("bpf_prog_") && f.contains("sys_enter_write"))
        {
            in_prog += n;
        }
    }
    (total, in_prog, text)
}

/// The second sampler starts when such a program is loaded after the
/// profile has attached: the side-band starts it from its own thread as it
/// reads the load (the profile's loop was seconds late, busy compiling
/// bpftrace's unwind tables, LLVM's included).
#[test]
#[ignore = "needs root and BPF"]
fn a_blocking_program_loaded_mid_profile_starts_the_second_sampler() {
    require_root();
    let _turn = one_at_a_time();
    let mut dd = Command::new("dd")
        .args(["if=/dev/zero", "of=/dev/null", "bs=1", "count=100000000"])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let folded = tmp("bpf-mid-run.folded");
    // Ended by Ctrl-C a while after bpftrace has attached: it compiles with
    // LLVM first, which took more than a fixed 20 s in a loaded emulated
    // guest. Hence --duration too: at its 10 s default the profile ended
    // before bpftrace's load, and the Ctrl-C then killed it while it wrote.
    let mut r = start(&[
        "profile",
        "-v",
        "-F",
        "499",
        "--duration",
        "3600",
        "-o",
        folded.to_str().unwrap(),
    ]);
    std::thread::sleep(Duration::from_millis(500));
    let bt = start_bpftrace_write_count();
    // Started once the side-band has read the load (-v says so): in a
    // one-vCPU guest beside another, its thread can be seconds late to run.
    let held = Instant::now();
    let limit = Duration::from_secs(if emulated() { 60 } else { 10 });
    if r.wait_for_stderr("loaded: second sampler started", limit) {
        eprintln!(
            "second sampler started {:.1} s after bpftrace held its program",
            held.elapsed().as_secs_f64()
        );
    }
    std::thread::sleep(Duration::from_secs(secs(3)));
    let (_, err) = r.interrupt();
    let _ = dd.kill();
    let _ = dd.wait();
    let Some(mut bt) = bt else {
        return;
    };
    stop_bpftrace(&mut bt, Duration::from_secs(30));
    // Started once bpftrace loaded a program that holds the guard (its
    // feature probes' kprobe, or its tracepoint program), said with -v.
    assert!(
        err.lines()
            .any(|l| l.contains("loaded: second sampler started")),
        "{err}"
    );
    if skip_if_emulated(
        "samples inside the program: an emulated CPU takes timer interrupts only between translated blocks, and bpftrace's short program gave the second sampler 0 of them in 9 s of dd (984452 writes through it) in a 6.12 guest",
    ) {
        return;
    }
    assert!(err.contains("taken by a second sampler"), "{err}");
    let (total, in_prog, text) = samples_in_write_program(&folded);
    // The program runs for the profile's last 3 s, after whatever
    // bpftrace's compiling took (the profile's share of it varies
    // with that, so a count, not a share): dd on one CPU at 499 Hz is
    // ~1500 samples in 3 s, a fair part of them in the program (~600 on
    // this machine); a program left out would give 0.
    assert!(
        in_prog >= 50,
        "{in_prog} of {total} samples in the program\n{text}"
    );
}
