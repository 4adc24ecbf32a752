//! One function per subcommand, each running the stages in order:
//! resolve -> attach -> collect -> symbolize -> render.

pub mod bpf;
pub mod list;
pub mod profile;
pub mod trace;

use anyhow::Result;
use clap::CommandFactory;

use crate::cli::{Cli, Settings};
use crate::error::Error;

pub fn run(settings: Settings) -> Result<()> {
    // Commands that attach nothing have nothing to finish on a signal:
    // the first one ends them at once.
    if matches!(
        settings,
        Settings::List(_) | Settings::Report(_) | Settings::Symbolize(_) | Settings::Completions(_)
    ) {
        crate::sys::signals::die_on_next();
    }
    match settings {
        Settings::Trace(s) => trace::run(*s),
        Settings::List(s) => list::run(s),
        Settings::Profile(s) => profile::profile(*s),
        Settings::Record(s) => profile::record(*s),
        Settings::Report(s) => profile::report(*s),
        Settings::Symbolize(s) => profile::symbolize(*s),
        Settings::Bpf(s) => bpf::run(s),
        Settings::Completions(shell) => {
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "bpfscope",
                &mut std::io::stdout(),
            );
            Ok(())
        }
    }
}

/// Fails early, with what is needed, when bpfscope lacks the privileges
/// for BPF and tracing (root, or CAP_BPF + CAP_PERFMON with tracefs access).
pub fn require_privileges() -> Result<(), Error> {
    const CAP_SYS_ADMIN: u32 = 21;
    const CAP_PERFMON: u32 = 38;
    const CAP_BPF: u32 = 39;
    let caps = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .unwrap_or(0);
    let has = |c: u32| caps & (1u64 << c) != 0;
    if has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON)) {
        Ok(())
    } else {
        Err(Error::Environment(
            "bpfscope needs root (or CAP_BPF and CAP_PERFMON plus read access to tracefs) to load BPF programs: run it with sudo".into(),
        ))
    }
}

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
