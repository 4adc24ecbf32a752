//! Software cpu-clock perf events: the profiler's sampler and a script's
//! `profile:hz:N` probes attach their programs to these.

use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};

use anyhow::{Context, Result};
use libbpf_rs::{Link, PerfEventOpts, ProgramMut};

use crate::error::Error;

/// The cpu-clock period in ns for `hz`: a fixed period in the clock's
/// unit, not a frequency the kernel adapts towards, so samples taken are
/// exactly ns counted / period. Every cpu-clock sampler takes this one.
pub fn cpu_clock_period(hz: u64) -> u64 {
    1_000_000_000 / hz.max(1)
}

/// One software cpu-clock event on `cpu`, sampling at `hz`, for all tasks.
pub fn open_cpu_clock(cpu: u32, hz: u64) -> Result<OwnedFd> {
    open_event(
        cpu,
        libbpf_sys::PERF_TYPE_SOFTWARE,
        u64::from(libbpf_sys::PERF_COUNT_SW_CPU_CLOCK),
        cpu_clock_period(hz),
    )
}

/// One perf event (type and config as perf_event_attr's) on `cpu` for all
/// tasks, sampled every `period` occurrences.
pub fn open_event(cpu: u32, ty: u32, config: u64, period: u64) -> Result<OwnedFd> {
    let mut attr = libbpf_sys::perf_event_attr {
        type_: ty,
        size: std::mem::size_of::<libbpf_sys::perf_event_attr>() as u32,
        config,
        ..Default::default()
    };
    attr.__bindgen_anon_1.sample_period = period.max(1);
    // SAFETY: attr is a valid, fully initialized perf_event_attr whose size
    // field matches; the other arguments are plain integers.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &attr as *const libbpf_sys::perf_event_attr,
            -1i32,
            cpu as i32,
            -1i32,
            libbpf_sys::PERF_FLAG_FD_CLOEXEC as libc::c_ulong,
        )
    };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        let what = match ty {
            libbpf_sys::PERF_TYPE_SOFTWARE => "software event",
            libbpf_sys::PERF_TYPE_HARDWARE => "hardware event",
            _ => "event",
        };
        return Err(anyhow::Error::new(Error::Environment(format!(
            "perf_event_open ({what} {config}) on CPU {cpu}: {e}"
        ))));
    }
    // SAFETY: the syscall returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Attaches `prog` to a cpu-clock on `cpu` at `hz`, its link carrying
/// `cookie`. The link owns the event's descriptor from then on (libbpf
/// closes it with the link); it is returned too, to read the event's count.
pub fn attach(prog: &ProgramMut<'_>, cpu: u32, hz: u64, cookie: u64) -> Result<(Link, RawFd)> {
    link(prog, open_cpu_clock(cpu, hz)?, cpu, cookie)
}

/// Attaches `prog` to a perf event on `cpu` (see [`open_event`]), its link
/// carrying `cookie`.
pub fn attach_event(
    prog: &ProgramMut<'_>,
    cpu: u32,
    ty: u32,
    config: u64,
    period: u64,
    cookie: u64,
) -> Result<(Link, RawFd)> {
    link(prog, open_event(cpu, ty, config, period)?, cpu, cookie)
}

fn link(prog: &ProgramMut<'_>, fd: OwnedFd, cpu: u32, cookie: u64) -> Result<(Link, RawFd)> {
    let opts = PerfEventOpts {
        cookie,
        ..Default::default()
    };
    let link = prog
        .attach_perf_event_with_opts(fd.as_raw_fd(), opts)
        .with_context(|| format!("attaching to the perf event on CPU {cpu}"))?;
    // On failure above the descriptor was still ours, and dropped.
    Ok((link, fd.into_raw_fd()))
}
