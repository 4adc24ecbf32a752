//! Reading values the kernel side keeps in each thread's own storage (a
//! task storage map), from user space: by a descriptor of each thread
//! (pidfd_open with PIDFD_THREAD, Linux 6.9+), the key such a map takes.

use std::os::fd::AsRawFd;

use libbpf_rs::{MapCore, MapFlags};

use crate::attach::features::thread_pidfd;

/// Every thread of the machine, by id, as /proc lists them now.
fn all_threads() -> Vec<u32> {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for p in procs.flatten() {
        let name = p.file_name();
        if name.to_str().and_then(|s| s.parse::<u32>().ok()).is_none() {
            continue;
        }
        let Ok(tasks) = std::fs::read_dir(p.path().join("task")) else {
            continue;
        };
        out.extend(
            tasks
                .flatten()
                .filter_map(|t| t.file_name().to_str()?.parse::<u32>().ok()),
        );
    }
    out
}

/// Each living thread's value in task storage map `map`, by thread id
/// (threads without one left out). A thread that exits meanwhile is
/// missed, as it would be a moment later.
pub fn values(map: &dyn MapCore) -> Vec<(u32, Vec<u8>)> {
    let mut out = Vec::new();
    for tid in all_threads() {
        let Some(fd) = thread_pidfd(tid) else {
            continue;
        };
        if let Ok(Some(v)) = map.lookup(&fd.as_raw_fd().to_ne_bytes(), MapFlags::ANY) {
            out.push((tid, v));
        }
    }
    out
}
