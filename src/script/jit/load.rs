//! Loading the emitted programs with the session's map descriptors put in
//! place, and attaching each where its probe's generic attachment would
//! have gone: a raw tracepoint (syscalls, named raw tracepoints), a typed
//! raw tracepoint (sched events) or a classic tracepoint's perf event. The session keeps the programs and
//! links, and detaches them with its own.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};

use super::emit::{Hook, Prog};
use super::insn::MapRef;
use crate::attach::session::Session;

/// Loads `prog` (probe `idx`) against the session's maps.
pub fn load(session: &Session<'_>, idx: usize, prog: &Prog) -> Result<OwnedFd, String> {
    let maps = &session.skel.maps;
    let mut insns: Vec<libbpf_sys::bpf_insn> = prog.insns.iter().map(|i| i.raw()).collect();
    for &(at, m) in &prog.maps {
        let fd = match m {
            MapRef::Scratch => maps.scratch.as_fd().as_raw_fd(),
            MapRef::Bss(_) => maps.bss.as_fd().as_raw_fd(),
            MapRef::Full => maps.vm_full.as_fd().as_raw_fd(),
            MapRef::Events => maps.events.as_fd().as_raw_fd(),
            MapRef::Lost => maps.lost.as_fd().as_raw_fd(),
            MapRef::Task => maps.vm_task.as_fd().as_raw_fd(),
            MapRef::Cache => maps.vm_cache.as_fd().as_raw_fd(),
            MapRef::Script(id) => session
                .vm_maps
                .get(id as usize)
                .ok_or_else(|| format!("script map #{id} is missing"))?
                .as_fd()
                .as_raw_fd(),
        };
        insns
            .get_mut(at)
            .ok_or("a map load past the program's end")?
            .imm = fd;
    }
    let name = CString::new(format!("bs_jit_{idx}")).map_err(|e| e.to_string())?;
    let mut opts = libbpf_sys::bpf_prog_load_opts {
        sz: std::mem::size_of::<libbpf_sys::bpf_prog_load_opts>() as _,
        ..Default::default()
    };
    let ty = match prog.hook {
        Hook::RawTp(_) => libbpf_sys::BPF_PROG_TYPE_RAW_TRACEPOINT,
        Hook::Tracepoint { .. } => libbpf_sys::BPF_PROG_TYPE_TRACEPOINT,
        Hook::BtfTp { btf_id, .. } => {
            opts.expected_attach_type = libbpf_sys::BPF_TRACE_RAW_TP;
            opts.attach_btf_id = btf_id;
            libbpf_sys::BPF_PROG_TYPE_TRACING
        }
    };
    crate::attach::kfunc::load(ty, &name, &insns, &mut opts)
}

/// Attaches a loaded program where its probe runs; the returned
/// descriptor is the link (a tracepoint's perf event is held by it).
pub fn attach(prog: &OwnedFd, hook: &Hook) -> io::Result<OwnedFd> {
    match hook {
        Hook::RawTp(name) => {
            let c = CString::new(name.as_str())
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
            // SAFETY: c is a valid C string and prog a valid program fd, both alive for the call.
            let fd = unsafe { libbpf_sys::bpf_raw_tracepoint_open(c.as_ptr(), prog.as_raw_fd()) };
            owned(fd)
        }
        Hook::BtfTp { .. } => {
            // A typed program names its tracepoint by the BTF id it was
            // loaded with; the open takes no name (works since 5.5).
            // SAFETY: prog is a valid program fd for the call; a null name is allowed.
            let fd =
                unsafe { libbpf_sys::bpf_raw_tracepoint_open(std::ptr::null(), prog.as_raw_fd()) };
            owned(fd)
        }
        Hook::Tracepoint { subsys, event } => {
            let root =
                crate::probe::tracefs::root().map_err(|e| io::Error::other(e.to_string()))?;
            let id: u64 =
                std::fs::read_to_string(root.join("events").join(subsys).join(event).join("id"))?
                    .trim()
                    .parse()
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            // One event on CPU 0 for all tasks: a tracepoint's program runs on every CPU.
            let pfd = crate::attach::clock::open_event(0, libbpf_sys::PERF_TYPE_TRACEPOINT, id, 1)
                .map_err(|e| io::Error::other(format!("{e:#}")))?;
            let opts = libbpf_sys::bpf_link_create_opts {
                sz: std::mem::size_of::<libbpf_sys::bpf_link_create_opts>() as _,
                ..Default::default()
            };
            // SAFETY: both fds are valid for the call; opts is initialized and outlives it.
            let fd = unsafe {
                libbpf_sys::bpf_link_create(
                    prog.as_raw_fd(),
                    pfd.as_raw_fd(),
                    libbpf_sys::BPF_PERF_EVENT,
                    &opts,
                )
            };
            // The link holds the perf event; this descriptor is no longer needed.
            owned(fd)
        }
    }
}

fn owned(fd: i32) -> io::Result<OwnedFd> {
    if fd < 0 {
        return Err(io::Error::from_raw_os_error(-fd));
    }
    // SAFETY: a new descriptor returned by the kernel, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The index of a probe whose program is to be taken as refused by the
/// kernel: the tests' way onto the fallback, which a kernel that accepts
/// the emitted code never takes.
pub const REFUSE: &str = "BPFSCOPE_SCRIPT_REFUSE";

/// Loads every compiled probe's program; a probe whose program the kernel
/// refuses goes back to the machine, with the verifier's reason. Returns
/// (probe, program fd) of those loaded.
pub fn load_all(
    session: &Session<'_>,
    chosen: &mut [Result<Prog, String>],
) -> Vec<(usize, OwnedFd)> {
    let mut out = Vec::new();
    let refuse: Option<usize> = std::env::var(REFUSE).ok().and_then(|v| v.parse().ok());
    for (i, c) in chosen.iter_mut().enumerate() {
        let Ok(prog) = c else { continue };
        let loaded = if refuse == Some(i) {
            Err(format!("refused on request ({REFUSE})"))
        } else {
            load(session, i, prog)
        };
        match loaded {
            Ok(fd) => out.push((i, fd)),
            Err(e) => *c = Err(format!("the kernel refused its program: {e}")),
        }
    }
    out
}
