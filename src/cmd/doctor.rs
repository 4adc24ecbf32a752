//! `bpfscope doctor`: what works on this machine and why not. Each feature
//! is checked against what it needs (kernel version, BTF, privileges,
//! lockdown, the kernel's own answers to feature probes), and tracing and
//! profiling are then run for real, briefly, by bpfscope itself (a child
//! process per check, the way a user would run them), so a kernel that
//! refuses the programs for a reason no probe foresaw says so too.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use serde::Serialize;

use crate::attach::features::{self, Features};
use crate::attach::kfunc;
use crate::probe::{btf, tracefs};

/// The oldest kernel bpfscope is tested on (the README's Requirements).
pub const MIN_KERNEL: (u32, u32) = (6, 1);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Works fully.
    Ok,
    /// Works, with a fallback that costs something (the detail says what).
    Limited,
    /// Does not work here (the detail says why, and what would fix it).
    No,
}

/// One line of the report.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub feature: &'static str,
    pub status: Status,
    pub detail: String,
}

fn check(feature: &'static str, status: Status, detail: impl Into<String>) -> Check {
    Check {
        kind: "check",
        feature,
        status,
        detail: detail.into(),
    }
}

/// What this machine is, for the report's first line.
#[derive(Debug, Clone, Serialize)]
struct Machine {
    #[serde(rename = "type")]
    kind: &'static str,
    release: String,
    arch: String,
    /// The architecture bpfscope was built for.
    built_for: &'static str,
    cpus: usize,
    lockdown: Option<String>,
}

/// Runs the checks and prints them; exit status 1 when tracing, which
/// everything else builds on, cannot work.
pub fn run(json: bool, quick: bool) -> Result<()> {
    let (release, arch) = uname();
    let machine = Machine {
        kind: "machine",
        release: release.clone(),
        arch,
        built_for: std::env::consts::ARCH,
        cpus: bpfscope_sys::online_cpus().map_or(0, |c| c.len()),
        lockdown: kfunc::lockdown(),
    };
    let checks = checks(&release, quick);
    let mut out = std::io::stdout().lock();
    if json {
        crate::render::printer::write_json(&mut out, &machine)?;
        for c in &checks {
            crate::render::printer::write_json(&mut out, c)?;
        }
    } else {
        writeln!(
            out,
            "bpfscope doctor: Linux {} {}, {} CPUs, lockdown {}",
            machine.release,
            machine.arch,
            machine.cpus,
            machine.lockdown.as_deref().unwrap_or("none")
        )?;
        for c in &checks {
            let status = match c.status {
                Status::Ok => "ok",
                Status::Limited => "limited",
                Status::No => "no",
            };
            writeln!(out, "  {status:<8} {:<12} {}", c.feature, c.detail)?;
        }
    }
    out.flush()?;
    if checks
        .iter()
        .any(|c| c.feature == "tracing" && c.status == Status::No)
    {
        std::process::exit(1);
    }
    Ok(())
}

/// The kernel's release and machine (uname -r, uname -m).
fn uname() -> (String, String) {
    // SAFETY: utsname is plain data; uname fills it or fails.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: u is a valid, writable utsname.
    if unsafe { libc::uname(&mut u) } != 0 {
        return (String::new(), String::new());
    }
    let field = |f: &[libc::c_char]| {
        let bytes: Vec<u8> = f
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    (field(&u.release), field(&u.machine))
}

/// (major, minor) of a release string such as `6.12.117+deb12-amd64`.
pub fn version(release: &str) -> Option<(u32, u32)> {
    let mut it = release.split(|c: char| !c.is_ascii_digit());
    let major = it.next()?.parse().ok()?;
    let minor = it.next()?.parse().ok()?;
    Some((major, minor))
}

/// Every feature's check, in the order of the README's Requirements.
pub fn checks(release: &str, quick: bool) -> Vec<Check> {
    use Status::{Limited, No, Ok};
    let mut out = Vec::new();
    let v = version(release);
    let at_least = |want: (u32, u32)| v.is_some_and(|have| have >= want);

    // What everything needs.
    let mut blockers: Vec<String> = Vec::new();
    if !at_least(MIN_KERNEL) {
        blockers.push(format!(
            "Linux {release} is older than {}.{}, the oldest kernel bpfscope supports",
            MIN_KERNEL.0, MIN_KERNEL.1
        ));
    }
    if let Err(e) = bpfscope_sys::require_privileges() {
        blockers.push(e.to_string());
    }
    if !Path::new("/sys/kernel/btf/vmlinux").exists() {
        blockers.push(
            "the kernel has no BTF (/sys/kernel/btf/vmlinux): bpfscope's programs are CO-RE; \
             use a kernel built with CONFIG_DEBUG_INFO_BTF=y (every major distribution's is)"
                .into(),
        );
    }
    if !blockers.is_empty() {
        let why = blockers.join("; ");
        for f in FEATURES {
            out.push(check(f, No, why.clone()));
        }
        return out;
    }

    let features = Features::detect();
    let bpf_loop = features::helper_supported(
        libbpf_sys::BPF_PROG_TYPE_RAW_TRACEPOINT,
        libbpf_sys::BPF_FUNC_loop,
    );

    // Tracing: tracepoints and syscalls, count/hist/stats/trace/latency/run.
    let tracing = match tracefs::root() {
        Err(e) => check("tracing", No, format!("tracefs: {e}")),
        Result::Ok(_) if !bpf_loop => check(
            "tracing",
            No,
            "the kernel has no bpf_loop helper (Linux 5.17), which the filter and script machines need",
        ),
        Result::Ok(_) if !features.raw_tp_cookie => check(
            "tracing",
            Limited,
            "tracepoints other than syscalls take classic tracepoint links, which cost about \
             twice as much per event and ~70 ms each to detach (raw tracepoint cookies need Linux 6.10)",
        ),
        Result::Ok(_) => check(
            "tracing",
            Ok,
            "tracepoints and syscalls through raw tracepoints with cookies",
        ),
    };
    let tracing = if tracing.status != No && !quick {
        confirm(tracing, run_count)
    } else {
        tracing
    };
    let traces = tracing.status != No;
    out.push(tracing);

    // User probes.
    let uprobe_pmu = Path::new("/sys/bus/event_source/devices/uprobe/type").exists();
    out.push(if !traces {
        check("uprobes", No, "tracing does not work here (above)")
    } else if !uprobe_pmu {
        check(
            "uprobes",
            No,
            "the kernel has no uprobe event source (CONFIG_UPROBE_EVENTS)",
        )
    } else if !features.uprobe_multi() {
        check(
            "uprobes",
            Limited,
            "uprobes and USDT work; a glob attaches one link per function (uprobe_multi needs Linux 6.6): \
             slower to attach and detach many functions",
        )
    } else {
        check(
            "uprobes",
            Ok,
            "uprobes, uretprobes and USDT; globs as one uprobe_multi link",
        )
    });

    // Kernel functions.
    out.push(if !traces {
        check("kfunc", No, "tracing does not work here (above)")
    } else {
        match (features.fentry(), features.kprobe()) {
            (Result::Ok(_), Result::Ok(())) => {
                if features.kprobe_multi() {
                    check(
                        "kfunc",
                        Ok,
                        "fentry/fexit and kprobes; globs as one kprobe_multi link",
                    )
                } else {
                    check(
                        "kfunc",
                        Limited,
                        "fentry/fexit and kprobes; globs take one kprobe per function \
                         (kprobe_multi needs CONFIG_FPROBE, Linux 5.18 on x86-64, 6.5 on arm64)",
                    )
                }
            }
            (Err(f), Result::Ok(())) => check(
                "kfunc",
                Limited,
                format!("kprobes only, which cost more per call than fentry ({f})"),
            ),
            (Result::Ok(_), Err(k)) => check(
                "kfunc",
                Limited,
                format!("fentry/fexit only; kretprobe-style globs are slower to attach ({k})"),
            ),
            (Err(f), Err(k)) => check(
                "kfunc",
                No,
                if f == k {
                    format!("kprobes and fentry are refused: {k}")
                } else {
                    format!("kprobes are refused ({k}); fentry is refused ({f})")
                },
            ),
        }
    });

    // Profiling: perf_event sampling on a software clock.
    let clock = cpu_clock();
    let profiling = match &clock {
        Err(e) => check(
            "profiling",
            No,
            format!(
                "{e}; perf events may be disabled (kernel.perf_event_paranoid, CONFIG_PERF_EVENTS)"
            ),
        ),
        Result::Ok(()) if !bpf_loop => check(
            "profiling",
            No,
            "the kernel has no bpf_loop helper (Linux 5.17), which the unwinder needs",
        ),
        Result::Ok(()) => check(
            "profiling",
            Ok,
            "CPU and off-CPU sampling, stacks aggregated in the kernel",
        ),
    };
    let mut deepest = None;
    let profiling = if profiling.status != No && !quick {
        match run_profile() {
            Result::Ok(d) => {
                deepest = Some(d);
                profiling
            }
            Err(why) => check("profiling", No, why),
        }
    } else {
        profiling
    };
    let profiles = profiling.status != No;
    out.push(profiling);

    // Unwinding without frame pointers: the kernel side reads a process's
    // mappings through the task_vma iterator.
    let iter = btf::vmlinux().is_some_and(|k| k.func("bpf_iter_task_vma_new").is_some());
    let unwinding = if !profiles {
        check("unwinding", No, "profiling does not work here (above)")
    } else if !iter {
        check(
            "unwinding",
            Limited,
            "user stacks follow frame pointers only: unwind tables need the kernel's task_vma \
             iterator (Linux 6.7), so code built without frame pointers (most distribution \
             binaries) gives short stacks",
        )
    } else {
        match deepest {
            // bpfscope's own code has no frame pointers: below the
            // spinning function are the thread's start in Rust's std and
            // the C library's start_thread and clone3.
            Some(d) if d < 4 => check(
                "unwinding",
                Limited,
                format!("a thread of code without frame pointers was unwound {d} frames deep, not to its start"),
            ),
            _ => check(
                "unwinding",
                Ok,
                "user stacks unwound in the kernel with tables from .eh_frame (no frame pointers needed)",
            ),
        }
    };
    let python = match unwinding.status {
        Ok if std::env::consts::ARCH == "aarch64" => check(
            "python",
            Ok,
            "CPython 3.11 to 3.13 frames in user stacks (3.9 and 3.10 need x86-64)",
        ),
        Ok => check("python", Ok, "CPython 3.9 to 3.13 frames in user stacks"),
        _ => check(
            "python",
            unwinding.status,
            "Python frames come with unwinding (above)",
        ),
    };
    out.push(unwinding);
    out.push(python);

    // BPF programs as subjects: run-time statistics and kernel symbols.
    let stats = crate::bpfmeta::stats::StatsGuard::enable();
    let kallsyms = kernel_addresses_visible();
    out.push(match (&stats, kallsyms) {
        (Err(e), _) => check(
            "bpf",
            Limited,
            format!("bpf list works; bpf top and BPF time in profiles need run-time statistics, refused here ({e:#})"),
        ),
        (Result::Ok(_), false) => check(
            "bpf",
            Limited,
            "/proc/kallsyms hides kernel addresses (kernel.kptr_restrict): BPF programs and kernel frames are not named",
        ),
        (Result::Ok(_), true) => check(
            "bpf",
            Ok,
            "bpf list/top/annotate; BPF programs named in profiles, with source lines",
        ),
    });
    drop(stats);

    // The agent runs the profiler and the tracing engine together.
    out.push(match (traces, profiles) {
        (true, true) => check(
            "agent",
            Ok,
            "whole-host profiles in windows and kernel metrics (see the checks above for their limits)",
        ),
        (true, false) => check(
            "agent",
            Limited,
            "kernel metrics only: profiling does not work here (above)",
        ),
        (false, _) => check("agent", No, "tracing does not work here (above)"),
    });
    out
}

/// The features the report has a line for, in its order.
pub const FEATURES: &[&str] = &[
    "tracing",
    "uprobes",
    "kfunc",
    "profiling",
    "unwinding",
    "python",
    "bpf",
    "agent",
];

/// A check confirmed by running bpfscope itself: a failure turns it into
/// `No` with what the run said.
fn confirm(c: Check, run: fn() -> Result<(), String>) -> Check {
    match run() {
        Result::Ok(()) => c,
        Err(why) => check(c.feature, Status::No, why),
    }
}

/// bpfscope run as a child with a time limit: its stdout, or its error.
fn child(args: &[&str], timeout: Duration) -> Result<String, String> {
    let exe = std::env::current_exe().map_err(|e| format!("finding bpfscope's own binary: {e}"))?;
    let mut cmd = Command::new(&exe);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut c = cmd
        .spawn()
        .map_err(|e| format!("running {}: {e}", exe.display()))?;
    let t0 = Instant::now();
    loop {
        match c.try_wait() {
            Result::Ok(Some(_)) => break,
            Result::Ok(None) if t0.elapsed() < timeout => {
                std::thread::sleep(Duration::from_millis(20))
            }
            _ => {
                let _ = c.kill();
                let _ = c.wait();
                return Err(format!(
                    "`bpfscope {}` did not finish within {} s",
                    args.join(" "),
                    timeout.as_secs()
                ));
            }
        }
    }
    let out = c
        .wait_with_output()
        .map_err(|e| format!("reading bpfscope's output: {e}"))?;
    if out.status.success() {
        return Result::Ok(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    let line = err
        .lines()
        .rev()
        .find(|l| l.starts_with("bpfscope: error"))
        .unwrap_or_else(|| err.lines().last().unwrap_or("no message"));
    Err(format!("`bpfscope {}` failed: {line}", args.join(" ")))
}

/// Counts the writes of a child (bpfscope printing its version).
fn run_count() -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let exe = exe.to_string_lossy();
    let out = child(
        &[
            "count",
            "tracepoint:syscalls:sys_enter_write",
            "--json",
            "--",
            &exe,
            "--version",
        ],
        Duration::from_secs(60),
    )?;
    let n: u64 = out
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["type"] == "count")
        .filter_map(|v| v["count"].as_u64())
        .sum();
    if n == 0 {
        return Err("a count of a child's writes saw none".into());
    }
    Result::Ok(())
}

/// Profiles this process for a second while a thread of it spins in code
/// built without frame pointers: its samples must arrive. Returns the
/// deepest user stack seen (frames below the thread's start, when the
/// unwinder walks the code).
fn run_profile() -> Result<usize, String> {
    let dir = std::env::temp_dir().join(format!("bpfscope-doctor-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let out = dir.join("p.folded");
    let stop = Arc::new(AtomicBool::new(false));
    let spin = {
        let stop = stop.clone();
        std::thread::Builder::new()
            .name("doctor-spin".into())
            .spawn(move || {
                let mut x = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
                }
            })
            .map_err(|e| e.to_string())?
    };
    let path = out.to_string_lossy().into_owned();
    let pid = std::process::id().to_string();
    let ran = child(
        &[
            "profile",
            "-F",
            "499",
            "--duration",
            "1",
            "-p",
            &pid,
            "-o",
            &path,
        ],
        Duration::from_secs(120),
    );
    stop.store(true, Ordering::Relaxed);
    let _ = spin.join();
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    ran?;
    // Folded lines: process;frame;...;frame count (kernel frames end in _[k]).
    let (mut samples, mut deepest) = (0u64, 0usize);
    for line in text.lines() {
        let Some((stack, n)) = line.rsplit_once(' ') else {
            continue;
        };
        samples += n.parse::<u64>().unwrap_or(0);
        let user = stack
            .split(';')
            .skip(1)
            .filter(|f| !f.ends_with("_[k]"))
            .count();
        deepest = deepest.max(user);
    }
    if samples == 0 {
        return Err("a 1 s profile of a process spinning on a CPU got no sample of it".into());
    }
    Result::Ok(deepest)
}

/// Whether a cpu-clock perf event can be opened for every process on CPU 0
/// (what the profiler's sampler attaches to).
fn cpu_clock() -> Result<(), String> {
    let cpu = bpfscope_sys::online_cpus()
        .ok()
        .and_then(|c| c.first().copied())
        .unwrap_or(0);
    crate::attach::clock::open_cpu_clock(cpu, 99)
        .map(drop)
        .map_err(|e| format!("{e:#}"))
}

/// Whether /proc/kallsyms shows real addresses to this process.
fn kernel_addresses_visible() -> bool {
    let Result::Ok(text) = std::fs::read_to_string("/proc/kallsyms") else {
        return false;
    };
    text.lines().take(100).any(|l| {
        l.split(' ')
            .next()
            .is_some_and(|a| a.bytes().any(|b| b != b'0'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_of_release_strings() {
        assert_eq!(version("6.12.117+deb12-amd64"), Some((6, 12)));
        assert_eq!(version("6.1.0-56-arm64"), Some((6, 1)));
        assert_eq!(version("5.10.0"), Some((5, 10)));
        assert_eq!(version("6"), None);
        assert_eq!(version(""), None);
        assert!(version("6.1.0").unwrap() >= MIN_KERNEL);
        assert!(version("5.15.0").unwrap() < MIN_KERNEL);
    }
}
