//! The profiler's in-kernel unwinder on code without frame pointers (run
//! as root): a leaf without a prologue, recursion 300 deep and
//! --max-depth, a signal handler's frame, a C++ binary, a storm of
//! short-lived processes, Debian's own python3.11, and losses counted when
//! the stack map is too small.

use std::path::{Path, PathBuf};

use crate::common::*;

/// tests/workloads/nofp.c as distributions build: -O2, no frame pointers.
fn nofp() -> PathBuf {
    workload_with("nofp", &["-O2", "-fomit-frame-pointer"])
}

/// `bpfscope profile -F 499 EXTRA... -o DIR/NAME.folded -- CMD...`, which
/// must succeed; the folded lines and stderr.
fn profile(name: &str, extra: &[&str], cmd: &[&str]) -> (Vec<(Vec<String>, u64)>, String) {
    let dir = scratch_dir(&format!("unwind-{name}"));
    let out = dir.join(format!("{name}.folded"));
    let mut args = vec!["profile", "-F", "499"];
    args.extend(extra);
    args.extend(["-o", out.to_str().unwrap(), "--"]);
    args.extend(cmd);
    let o = run(&args);
    ok(&o);
    let err = stderr(&o);
    // Every run of the sampler is accounted for, whatever else happened.
    let acct = err
        .lines()
        .find(|l| l.contains("taken by the clocks"))
        .unwrap_or_else(|| panic!("no sample accounting line: {err}"));
    assert!(!acct.contains("unaccounted"), "{acct}");
    (folded(&out), err)
}

/// Weight of `comm`'s stacks whose user part reaches the C runtime's
/// entry (the frames above main).
fn reaching_start(lines: &[(Vec<String>, u64)], comm: &str) -> u64 {
    lines
        .iter()
        .filter(|(f, _)| f[0] == comm && f.get(1).map(String::as_str) == Some("_start"))
        .map(|(_, n)| n)
        .sum()
}

/// A folded stack's user part: kernel frames on top of the leaf (an
/// interrupt taken there, a fault, a reschedule) cut off.
fn user_part(f: &[String]) -> &[String] {
    let n = f
        .iter()
        .rposition(|x| !x.ends_with("_[k]"))
        .map_or(0, |i| i + 1);
    &f[..n]
}

/// A sample taken in do_exit, as the address space is torn down: past
/// exit_mm its user pc is in no mapping and its stack cannot be walked.
fn in_do_exit(f: &[String]) -> bool {
    f.iter().any(|x| x == "do_exit_[k]")
}

fn show(lines: &[(Vec<String>, u64)]) -> String {
    let mut v: Vec<_> = lines.iter().collect();
    v.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
    v.iter()
        .take(12)
        .map(|(f, n)| format!("{n} {}\n", f.join(";")))
        .collect()
}

#[test]
#[ignore = "needs root and BPF"]
fn leaf_without_prologue_keeps_its_caller() {
    require_root();
    if !unwinds_here() {
        return;
    }
    let w = nofp();
    let (lines, err) = profile(
        "chain",
        &[],
        &[w.to_str().unwrap(), "chain", "uw_chain", "2"],
    );
    let total = root_weight(&lines, "uw_chain");
    // The user stack's leaf: kernel frames after it do not change it.
    // Emulated, with four guests on two cores, a tenth of the samples had
    // them.
    let leaf: u64 = lines
        .iter()
        .filter(|(f, _)| {
            f[0] == "uw_chain" && user_part(f).last().map(String::as_str) == Some("hot_leaf")
        })
        .map(|(_, n)| n)
        .sum();
    let chain = weight_with(
        &lines,
        "uw_chain",
        &[
            "_start",
            "__libc_start_main_impl",
            "__libc_start_call_main",
            "main",
            "via_a",
            "via_b",
            "hot_leaf",
        ],
    );
    assert!(
        total > min_samples(600),
        "too few samples: {total}\n{}",
        show(&lines)
    );
    assert!(leaf as f64 > 0.9 * total as f64, "{}", show(&lines));
    // Frame pointers would give main;hot_leaf: the leaf has no frame.
    assert!(
        chain as f64 >= 0.99 * leaf as f64,
        "{chain} of {leaf} hot_leaf samples have the whole chain\n{}",
        show(&lines)
    );
    // Samples in do_exit (emulated, exit_mmap is slow enough to be hit).
    let exiting = lines
        .iter()
        .filter(|(f, _)| f[0] == "uw_chain" && in_do_exit(f))
        .map(|(_, n)| n)
        .sum::<u64>();
    let reach = reaching_start(&lines, "uw_chain");
    assert!(
        reach as f64 >= 0.99 * (total - exiting) as f64,
        "{reach} of {total} reach _start ({exiting} in do_exit)\n{}",
        show(&lines)
    );
    assert!(
        err.contains("unwinding: ") && err.contains("frames by unwind tables"),
        "{err}"
    );
}

#[test]
#[ignore = "needs root and BPF"]
fn recursion_300_deep_is_whole_within_max_depth_and_cut_beyond() {
    require_root();
    if !unwinds_here() {
        return;
    }
    let w = nofp();
    let w = w.to_str().unwrap();
    let (lines, _) = profile(
        "deep",
        &["--max-depth", "400"],
        &[w, "deep", "uw_deep", "300", "2"],
    );
    let total = root_weight(&lines, "uw_deep");
    assert!(total > min_samples(600), "too few samples: {total}");
    // A sample in the leaf has exactly 300 recurse frames between main and
    // the leaf. The rest fall as the workload descends and returns (its
    // share grows when the machine is busy), and their stacks must still
    // be whole: main, at most 300 recurse frames, reaching _start.
    let (mut leaf, mut whole, mut exiting) = (0, 0, 0);
    let mut wrong = Vec::new();
    for (f, n) in lines.iter().filter(|(f, _)| f[0] == "uw_deep") {
        if in_do_exit(f) {
            exiting += n;
            continue;
        }
        // The user part: an interrupt or fault may sit on top.
        let u = user_part(f);
        let in_leaf = u.last().map(String::as_str) == Some("deep_leaf");
        let rec = u.iter().filter(|x| *x == "recurse").count();
        let from_main =
            u.get(1).map(String::as_str) == Some("_start") && u.iter().any(|x| x == "main");
        if in_leaf {
            leaf += n;
        }
        if from_main && rec <= 300 && (!in_leaf || rec == 300) {
            whole += n;
        } else {
            wrong.push(format!("{n} {}", squeeze(f)));
        }
    }
    assert!(
        leaf as f64 >= share(0.9) * total as f64,
        "{leaf} of {total} samples in deep_leaf"
    );
    assert!(
        whole as f64 >= share(0.99) * (total - exiting) as f64,
        "{whole} of {total} stacks are whole ({exiting} in do_exit); the others:\n{}",
        wrong.join("\n")
    );
    // At the default depth (127) the stack is cut, and the cut is counted.
    let (lines, err) = profile("deep127", &[], &[w, "deep", "uw_deep", "300", "1"]);
    let cut: u64 = lines
        .iter()
        .filter(|(f, _)| f[0] == "uw_deep" && f.last().map(String::as_str) == Some("deep_leaf"))
        .filter(|(f, _)| f.len() == 1 + 127 && !f.iter().any(|x| x == "main"))
        .map(|(_, n)| n)
        .sum();
    assert!(cut > min_samples(200), "{cut}\n{}", show(&lines));
    let line = err
        .lines()
        .find(|l| l.contains("unwinding: "))
        .unwrap_or_else(|| panic!("{err}"));
    assert!(line.contains("at --max-depth"), "{line}");
}

/// A stack for a failure message, runs of one frame written once with
/// their length: 300 recursive frames would bury the rest.
fn squeeze(f: &[String]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < f.len() {
        let j = f[i..].iter().take_while(|x| **x == f[i]).count();
        out.push(if j > 1 {
            format!("{} x{j}", f[i])
        } else {
            f[i].clone()
        });
        i += j;
    }
    out.join(";")
}

/// Where a signal handler returns to: the C library's trampoline on
/// x86-64, the vDSO's on arm64.
const SIGRETURN: &str = if cfg!(target_arch = "aarch64") {
    "__kernel_rt_sigreturn"
} else {
    "__restore_rt"
};

#[test]
#[ignore = "needs root and BPF"]
fn signal_handler_frames_continue_into_the_interrupted_code() {
    require_root();
    if !unwinds_here() {
        return;
    }
    let w = nofp();
    let (lines, _) = profile(
        "signal",
        &[],
        &[w.to_str().unwrap(), "signal", "uw_signal", "2"],
    );
    let total = root_weight(&lines, "uw_signal");
    let in_handler = weight_with(&lines, "uw_signal", &["on_alarm", "handler_spin"]);
    // The kernel's signal frame, named, then the interrupted code and its callers.
    let through = lines
        .iter()
        .filter(|(f, _)| f[0] == "uw_signal" && f.windows(2).any(|w| w == [SIGRETURN, "on_alarm"]))
        .filter(|(f, _)| {
            f[1..5]
                == [
                    "_start",
                    "__libc_start_main_impl",
                    "__libc_start_call_main",
                    "main",
                ]
                && f[5] == "interrupted"
        })
        .map(|(_, n)| n)
        .sum::<u64>();
    assert!(total > min_samples(600), "too few samples: {total}");
    assert!(
        in_handler as f64 > 0.25 * total as f64,
        "{in_handler} of {total} in the handler\n{}",
        show(&lines)
    );
    assert!(
        through as f64 >= share(0.98) * in_handler as f64,
        "{through} of {in_handler} handler samples unwind through the signal frame\n{}",
        show(&lines)
    );
}

#[test]
#[ignore = "needs root and BPF"]
fn cxx_without_frame_pointers() {
    require_root();
    if !unwinds_here() {
        return;
    }
    let dir = scratch_dir("unwind-cxx-build");
    let Some(bin) = cxx_workload(&dir.join("cxx-nofp"), &["-fomit-frame-pointer"]) else {
        return;
    };
    let (lines, _) = profile("cxx", &[], &[bin.to_str().unwrap(), "uw_cxx", "2"]);
    let total = root_weight(&lines, "uw_cxx");
    let run = weight_with(
        &lines,
        "uw_cxx",
        &[
            "__libc_start_call_main",
            "main",
            "shapes::Worker::run(unsigned long)",
        ],
    );
    assert!(total > min_samples(600), "too few samples: {total}");
    assert!(
        run as f64 >= share(0.97) * total as f64,
        "{run} of {total}\n{}",
        show(&lines)
    );
}

#[test]
#[ignore = "needs root and BPF"]
fn short_lived_processes_keep_their_names() {
    require_root();
    if !unwinds_here() {
        return;
    }
    let w = nofp();
    // 150 processes of ~8 ms each, one after the other. Emulated, a
    // process's start and exit (loader, atof, exit handlers, closing its
    // files over 9p) took as many samples as 8 ms of spinning (233 and 226
    // of 459 on 6.12): 64 ms of spinning keeps them under a fifth.
    let ms = if emulated() { 64 } else { 8 };
    let script = format!(
        "for i in $(seq 150); do {} short uw_short {ms}; done",
        w.display()
    );
    let (lines, err) = profile("short", &[], &["sh", "-c", &script]);
    let total = root_weight(&lines, "uw_short");
    // Samples in do_exit (the exit's own file closing, slow over 9p when
    // emulated) are not the unwinder's unknowns.
    let unknown: u64 = lines
        .iter()
        .filter(|(f, _)| {
            f[0] == "uw_short" && f.iter().any(|x| x.starts_with("[unknown")) && !in_do_exit(f)
        })
        .map(|(_, n)| n)
        .sum();
    let named = weight_with(&lines, "uw_short", &["main", "short_spin"]);
    let spin = weight_with(&lines, "uw_short", &["short_spin"]);
    assert!(total > min_samples(300), "too few samples: {total}\n{err}");
    assert!(
        (unknown as f64) < (1.0 - share(0.99)) * total as f64,
        "{unknown} of {total} samples with [unknown] frames\n{}",
        show(&lines)
    );
    // The spinning is most of each process; the rest is its start and
    // exit (the loader, closing files), which under emulation with four
    // guests on two cores took a fifth of the samples (492 of 2415 on
    // arm64 6.12), all of them named too.
    assert!(
        spin as f64 >= 0.7 * total as f64,
        "{spin} of {total} in short_spin\n{}",
        show(&lines)
    );
    // Every sample in the spin reaches main: nothing cut short.
    assert!(
        named as f64 >= share(0.97) * spin as f64,
        "{named} of {spin} in short_spin have main;short_spin\n{}",
        show(&lines)
    );
}

#[test]
#[ignore = "needs root and BPF"]
fn debian_python_reaches_its_entry() {
    require_root();
    if !unwinds_here() {
        return;
    }
    let py = Path::new("/usr/bin/python3.11");
    if !py.exists() {
        skip("/usr/bin/python3.11 is not installed (scripts/install-deps)");
        return;
    }
    let code = format!(
        "import time\n\
         def fib(n): return n if n < 2 else fib(n-1) + fib(n-2)\n\
         t = time.time()\n\
         while time.time() - t < {}: fib(18)\n",
        secs(2)
    );
    let (lines, _) = profile("python", &[], &[py.to_str().unwrap(), "-c", &code]);
    let total = root_weight(&lines, "python3.11");
    // The eval loop's native frames are replaced by the Python frames they ran.
    let eval = weight_with(&lines, "python3.11", &["fib (<string>:2)"]);
    let reach = weight_with(
        &lines,
        "python3.11",
        &["__libc_start_call_main", "Py_BytesMain"],
    );
    assert!(total > min_samples(600), "too few samples: {total}");
    assert!(eval as f64 > share(0.8) * total as f64, "{}", show(&lines));
    // Debian builds it without frame pointers; main tail-calls Py_BytesMain.
    assert!(
        reach as f64 >= share(0.98) * total as f64,
        "{reach} of {total} reach __libc_start_call_main;Py_BytesMain\n{}",
        show(&lines)
    );
}

#[test]
#[ignore = "needs root and BPF"]
fn stacks_that_do_not_fit_are_counted_and_samples_still_accounted() {
    require_root();
    if !unwinds_here() {
        return;
    }
    let w = nofp();
    // Many distinct stacks (depths 1..=300) into a map of 8 stacks.
    let script = format!(
        "for d in $(seq 1 7 300); do {} deep uw_full $d 0.02; done",
        w.display()
    );
    let (lines, err) = profile("full", &["--max-stacks", "16"], &["sh", "-c", &script]);
    let line = err
        .lines()
        .find(|l| l.contains("stacks could not be stored"))
        .unwrap_or_else(|| panic!("no loss line: {err}"));
    assert!(line.contains("the stack map was full"), "{line}");
    // The samples whose stacks were lost are still in the profile (as the
    // process alone), so the accounting line above balanced. (Emulated, the
    // start-up of the shell and the loader fills the 16 keys before any
    // uw_full runs: its samples are then counted lost as keys.)
    assert!(
        root_weight(&lines, "uw_full") > 0
            || (emulated() && err.contains("lost (the count map was full")),
        "{err}"
    );
}

#[test]
#[ignore = "needs root and BPF"]
fn a_file_without_build_id_is_unwound_and_named_now_and_in_a_report() {
    require_root();
    if !unwinds_here() {
        return;
    }
    let w = workload_with(
        "nofp",
        &["-O2", "-fomit-frame-pointer", "-Wl,--build-id=none"],
    );
    let (lines, _) = profile(
        "nobid",
        &[],
        &[w.to_str().unwrap(), "chain", "uw_nobid", "1"],
    );
    let total = root_weight(&lines, "uw_nobid");
    let chain = weight_with(&lines, "uw_nobid", &["main", "via_a", "via_b", "hot_leaf"]);
    assert!(total > min_samples(300), "too few samples: {total}");
    assert!(
        chain as f64 >= share(0.97) * total as f64,
        "{}",
        show(&lines)
    );
    // Recorded, then symbolized by a later report from the file on disk.
    let dir = scratch_dir("unwind-nobid-rec");
    let rec = dir.join("nobid.bscope");
    ok(&run(&[
        "record",
        "-F",
        "499",
        "-o",
        rec.to_str().unwrap(),
        "--",
        w.to_str().unwrap(),
        "chain",
        "uw_nobid",
        "1",
    ]));
    let out = dir.join("nobid.folded");
    ok(&run(&[
        "report",
        rec.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]));
    let lines = folded(&out);
    let total = root_weight(&lines, "uw_nobid");
    let chain = weight_with(&lines, "uw_nobid", &["main", "via_a", "via_b", "hot_leaf"]);
    assert!(
        chain as f64 >= share(0.97) * total as f64,
        "{}",
        show(&lines)
    );
}
