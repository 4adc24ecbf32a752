//! BPF run-time statistics (run count and time per program).

use std::os::fd::{FromRawFd, OwnedFd};

use anyhow::{anyhow, Result};

use super::info;

/// Keeps run-time statistics on while it lives. The kernel counts those who
/// asked: closing the descriptor (on drop, or when the process dies however
/// it dies) returns to the previous state, and the kernel.bpf_stats_enabled
/// sysctl is never written.
pub struct StatsGuard {
    _fd: OwnedFd,
}

impl StatsGuard {
    pub fn enable() -> Result<StatsGuard> {
        // SAFETY: no pointers; returns a new descriptor or a negative error.
        let fd = unsafe { libbpf_sys::bpf_enable_stats(libbpf_sys::BPF_STATS_RUN_TIME) };
        if fd < 0 {
            return Err(anyhow!(
                "enabling BPF run-time statistics (BPF_ENABLE_STATS): {}",
                std::io::Error::from_raw_os_error(-fd)
            ));
        }
        // SAFETY: fd is a fresh descriptor we own.
        Ok(StatsGuard {
            _fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }
}

/// One program's identity and counters at a moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgStats {
    pub id: u32,
    pub name: String,
    pub tag: String,
    pub prog_type: String,
    pub run_cnt: u64,
    pub run_time_ns: u64,
    pub recursion_misses: u64,
}

/// Counters of every loaded program.
pub fn snapshot() -> Vec<ProgStats> {
    info::prog_ids()
        .into_iter()
        .filter_map(|id| {
            let i = info::basic(id).ok()?;
            Some(ProgStats {
                id,
                name: info::name_of(&i),
                tag: info::tag_of(&i.tag),
                prog_type: info::type_name(i.type_),
                run_cnt: i.run_cnt,
                run_time_ns: i.run_time_ns,
                recursion_misses: i.recursion_misses,
            })
        })
        .collect()
}
