//! System facts and process-wide state every bpfscope stage may need:
//! /proc (`procfs`), cgroup v2 (`cgroup`), clocks, capabilities, CPUs,
//! plain-old-data reads of kernel ABI structs (`pod`), build-id text,
//! termination signals and output files that appear whole or not at all.
//! The leaf of the workspace: it depends on no other bpfscope crate, so
//! every stage can use it without creating a cycle.

pub mod arch;
pub mod buildid;
pub mod cgroup;
pub mod eventfd;
pub mod mmap;
pub mod outfile;
pub mod pod;
pub mod procfs;
pub mod signals;

use std::io;

/// Fails early, with what is needed, when bpfscope lacks the privileges
/// for BPF and tracing (root, or CAP_BPF + CAP_PERFMON with tracefs access).
pub fn require_privileges() -> Result<(), MissingPrivileges> {
    const CAP_SYS_ADMIN: u32 = 21;
    const CAP_PERFMON: u32 = 38;
    const CAP_BPF: u32 = 39;
    let caps = procfs::status_field("self", "CapEff")
        .and_then(|v| u64::from_str_radix(&v, 16).ok())
        .unwrap_or(0);
    let has = |c: u32| caps & (1u64 << c) != 0;
    if has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON)) {
        Ok(())
    } else {
        Err(MissingPrivileges)
    }
}

/// The process may not load BPF programs.
#[derive(Debug, thiserror::Error)]
#[error("bpfscope needs root (or CAP_BPF and CAP_PERFMON plus read access to tracefs) to load BPF programs: run it with sudo")]
pub struct MissingPrivileges;

/// CLOCK_MONOTONIC in ns: the clock bpf_ktime_get_ns() reads.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec passed.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The CPUs that are online, from /sys.
pub fn online_cpus() -> io::Result<Vec<u32>> {
    let path = "/sys/devices/system/cpu/online";
    let s = std::fs::read_to_string(path)?;
    parse_cpu_list(&s).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{path}: not a CPU list: {}", s.trim()),
        )
    })
}

/// Time each CPU has spent idle since boot, in ns, by CPU number: the
/// cpuidle states' residency (microseconds) where a cpuidle driver runs,
/// else /proc/stat's idle and iowait (ticks of 1/100 s). One source for
/// every CPU, so two readings subtract.
pub fn cpu_idle_ns() -> std::collections::BTreeMap<u32, u64> {
    let mut out = std::collections::BTreeMap::new();
    let cpus = online_cpus().unwrap_or_default();
    let residency = |cpu: u32| -> Option<u64> {
        let dir = std::fs::read_dir(format!("/sys/devices/system/cpu/cpu{cpu}/cpuidle")).ok()?;
        let mut us = 0u64;
        let mut any = false;
        for e in dir.flatten() {
            if let Ok(t) = std::fs::read_to_string(e.path().join("time")) {
                us += t.trim().parse::<u64>().ok()?;
                any = true;
            }
        }
        any.then_some(us * 1000)
    };
    if !cpus.is_empty() && cpus.iter().all(|&c| residency(c).is_some()) {
        for c in cpus {
            out.insert(c, residency(c).unwrap_or(0));
        }
        return out;
    }
    out.extend(parse_proc_stat_idle(
        &std::fs::read_to_string("/proc/stat").unwrap_or_default(),
    ));
    out
}

/// `cpuN user nice system idle iowait ...` lines: idle + iowait in ns
/// (the kernel reports USER_HZ ticks, 100 a second on every architecture).
fn parse_proc_stat_idle(text: &str) -> Vec<(u32, u64)> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let cpu: u32 = f.next()?.strip_prefix("cpu")?.parse().ok()?;
            let v: Vec<u64> = f.take(5).filter_map(|x| x.parse().ok()).collect();
            let ticks = v.get(3)? + v.get(4).copied().unwrap_or(0);
            Some((cpu, ticks * 10_000_000))
        })
        .collect()
}

/// A kernel CPU list ("0-3,5,7-8").
pub fn parse_cpu_list(s: &str) -> Option<Vec<u32>> {
    let mut cpus = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let (a, b): (u32, u32) = (a.parse().ok()?, b.parse().ok()?);
        cpus.extend(a..=b);
    }
    Some(cpus)
}

/// Raises the soft open-file limit to the hard one: every probe is a
/// descriptor or two (a perf event and its link), and a glob over every
/// tracepoint needs thousands where shells start with a soft limit of 1024.
/// A hard limit set by the user (`ulimit -n`, which sets both) still holds.
pub fn raise_fd_limit() {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the rlimit passed; setrlimit reads it.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 && r.rlim_cur < r.rlim_max {
            r.rlim_cur = r.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_stat_idle_is_idle_plus_iowait_in_ns() {
        let t = "cpu  1 2 3 4 5 6\ncpu0 10 0 5 300 2 0 0\ncpu1 1 1 1 7 0\nintr 5\n";
        assert_eq!(
            parse_proc_stat_idle(t),
            [(0, 302 * 10_000_000), (1, 7 * 10_000_000)]
        );
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(
            parse_cpu_list("0-3,5,7-8\n"),
            Some(vec![0, 1, 2, 3, 5, 7, 8])
        );
        assert_eq!(parse_cpu_list("0"), Some(vec![0]));
        assert_eq!(parse_cpu_list("0-x"), None);
        assert!(!online_cpus().unwrap().is_empty());
    }
}
