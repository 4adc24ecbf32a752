//! Kernel function probes: loading the generic fentry/fexit instructions
//! once per target function, links libbpf-rs has no wrapper for, the
//! feature probes that try each mechanism for real, and why one was refused.
//!
//! fentry/fexit programs name their target at load time (the verifier
//! checks the program against that function's BTF prototype), so one
//! program cannot serve many functions the way a kprobe program does. The
//! trace object is loaded once with the fentry program aimed at a
//! template function; its relocated instructions (map fds embedded), BTF
//! and func/line info are then loaded again per target with
//! `bpf_prog_load`, which re-verifies them but does not reopen the object
//! or re-parse vmlinux BTF, and each copy is attached with its cookie.

use std::ffi::{CStr, CString};
use std::fs;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;

use libbpf_rs::AsRawLibbpf;

/// A loaded program's instructions and debug info, to load copies of it.
pub struct ProgImage {
    prog_type: libbpf_sys::bpf_prog_type,
    attach_type: libbpf_sys::bpf_attach_type,
    name: CString,
    insns: Vec<libbpf_sys::bpf_insn>,
    func_info: Vec<libbpf_sys::bpf_func_info>,
    line_info: Vec<libbpf_sys::bpf_line_info>,
    btf_fd: i32,
}

// SAFETY: the image owns copies of everything but the BTF fd, which is only
// passed to the kernel by number while the object that owns it is alive
// (the session keeps it for longer than any load).
unsafe impl Send for ProgImage {}
// SAFETY: as above; loads only read the image.
unsafe impl Sync for ProgImage {}

impl ProgImage {
    /// Copies what loading `prog` took, from the loaded object `obj`.
    pub fn of(
        obj: &libbpf_rs::Object,
        prog: &impl AsRawLibbpf<LibbpfType = libbpf_sys::bpf_program>,
    ) -> ProgImage {
        let p = prog.as_libbpf_object().as_ptr();
        // SAFETY: p is a loaded program of obj, alive for this call; libbpf
        // returns pointers into its own arrays with the counts given (func and
        // line info: null when absent or in an unexpected record size).
        unsafe {
            ProgImage {
                prog_type: libbpf_sys::bpf_program__type(p),
                attach_type: libbpf_sys::bpf_program__expected_attach_type(p),
                name: CString::from(CStr::from_ptr(libbpf_sys::bpf_program__name(p))),
                insns: copy(
                    libbpf_sys::bpf_program__insns(p),
                    libbpf_sys::bpf_program__insn_cnt(p) as usize,
                ),
                func_info: copy(
                    libbpf_sys::bpf_program__func_info(p),
                    libbpf_sys::bpf_program__func_info_cnt(p) as usize,
                ),
                line_info: copy(
                    libbpf_sys::bpf_program__line_info(p),
                    libbpf_sys::bpf_program__line_info_cnt(p) as usize,
                ),
                btf_fd: libbpf_sys::bpf_object__btf_fd(obj.as_libbpf_object().as_ptr()),
            }
        }
    }

    /// Loads a copy aimed at the kernel function with this BTF id.
    pub fn load_for(&self, btf_id: u32) -> Result<OwnedFd, String> {
        let mut opts = libbpf_sys::bpf_prog_load_opts {
            sz: std::mem::size_of::<libbpf_sys::bpf_prog_load_opts>() as _,
            expected_attach_type: self.attach_type,
            attach_btf_id: btf_id,
            ..Default::default()
        };
        if self.btf_fd >= 0 {
            opts.prog_btf_fd = self.btf_fd as u32;
            opts.func_info = self.func_info.as_ptr().cast();
            opts.func_info_cnt = self.func_info.len() as u32;
            opts.func_info_rec_size = std::mem::size_of::<libbpf_sys::bpf_func_info>() as u32;
            if !self.line_info.is_empty() {
                opts.line_info = self.line_info.as_ptr().cast();
                opts.line_info_cnt = self.line_info.len() as u32;
                opts.line_info_rec_size = std::mem::size_of::<libbpf_sys::bpf_line_info>() as u32;
            }
        }
        load(self.prog_type, &self.name, &self.insns, &mut opts)
    }
}

/// Copies a C array libbpf owns.
///
/// # Safety
/// `ptr` is null or points to `n` initialized elements.
unsafe fn copy<T: Copy>(ptr: *const T, n: usize) -> Vec<T> {
    if ptr.is_null() || n == 0 {
        Vec::new()
    } else {
        // SAFETY: per the contract above.
        unsafe { std::slice::from_raw_parts(ptr, n) }.to_vec()
    }
}

/// bpf_prog_load, with the verifier's last words on failure.
pub(crate) fn load(
    prog_type: libbpf_sys::bpf_prog_type,
    name: &CStr,
    insns: &[libbpf_sys::bpf_insn],
    opts: &mut libbpf_sys::bpf_prog_load_opts,
) -> Result<OwnedFd, String> {
    let once = |opts: &mut libbpf_sys::bpf_prog_load_opts| {
        // SAFETY: all pointers are valid for the call: name, the license,
        // insns and the buffers opts points to (the log too) outlive it.
        let fd = unsafe {
            libbpf_sys::bpf_prog_load(
                prog_type,
                name.as_ptr(),
                c"GPL".as_ptr(),
                insns.as_ptr(),
                insns.len() as _,
                opts,
            )
        };
        if fd < 0 {
            return Err(io::Error::from_raw_os_error(-fd));
        }
        // SAFETY: a new fd returned by the kernel, owned by nobody else.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    };
    let err = match once(opts) {
        Ok(fd) => return Ok(fd),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EACCES | libc::EINVAL)) => e,
        Err(e) => return Err(e.to_string()),
    };
    // Rejected by the verifier: load again with a log to say why.
    let mut log = vec![0u8; 1 << 20];
    opts.log_level = 1;
    opts.log_buf = log.as_mut_ptr().cast();
    opts.log_size = log.len() as u32;
    let again = once(opts);
    opts.log_buf = std::ptr::null_mut();
    opts.log_size = 0;
    if let Ok(fd) = again {
        return Ok(fd);
    }
    let text = String::from_utf8_lossy(&log);
    let lines: Vec<&str> = text.trim_end_matches('\0').lines().collect();
    let reason = lines
        .windows(2)
        .rev()
        .find(|w| w[1].starts_with("processed "))
        .map(|w| w[0])
        .or_else(|| lines.iter().rev().find(|l| !l.trim().is_empty()).copied())
        .unwrap_or("");
    Err(format!("{err}: {}", reason.trim()))
}

/// Attaches a loaded fentry/fexit program with a cookie.
pub fn attach_tracing(prog: BorrowedFd<'_>, ret: bool, cookie: u64) -> io::Result<OwnedFd> {
    let mut opts = libbpf_sys::bpf_link_create_opts {
        sz: std::mem::size_of::<libbpf_sys::bpf_link_create_opts>() as _,
        ..Default::default()
    };
    opts.__bindgen_anon_1.tracing.cookie = cookie;
    let at = if ret {
        libbpf_sys::BPF_TRACE_FEXIT
    } else {
        libbpf_sys::BPF_TRACE_FENTRY
    };
    // SAFETY: prog is a valid program fd; opts is initialized and outlives the call.
    let fd = unsafe { libbpf_sys::bpf_link_create(prog.as_raw_fd(), 0, at, &opts) };
    if fd < 0 {
        return Err(io::Error::from_raw_os_error(-fd));
    }
    // SAFETY: a new fd returned by the kernel, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A libbpf link that libbpf-rs cannot create (kprobes at an offset).
pub struct RawLink(NonNull<libbpf_sys::bpf_link>);

// SAFETY: the link is only destroyed (once, in Drop) and never shared.
unsafe impl Send for RawLink {}

impl RawLink {
    /// The link's descriptor, while the link lives.
    pub fn as_fd(&self) -> Option<BorrowedFd<'_>> {
        // SAFETY: the pointer came from libbpf and is valid until Drop.
        let fd = unsafe { libbpf_sys::bpf_link__fd(self.0.as_ptr()) };
        // SAFETY: libbpf owns fd (>= 0) for as long as the link, which the
        // returned borrow cannot outlive.
        (fd >= 0).then(|| unsafe { BorrowedFd::borrow_raw(fd) })
    }
}

impl Drop for RawLink {
    fn drop(&mut self) {
        // SAFETY: the pointer came from libbpf, is valid and destroyed only here.
        unsafe { libbpf_sys::bpf_link__destroy(self.0.as_ptr()) };
    }
}

/// Attaches a kprobe at FUNC+OFFSET with a cookie.
pub fn attach_kprobe_at(
    prog: &impl AsRawLibbpf<LibbpfType = libbpf_sys::bpf_program>,
    func: &str,
    offset: u64,
    ret: bool,
    cookie: u64,
) -> io::Result<RawLink> {
    let name = CString::new(func).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let opts = libbpf_sys::bpf_kprobe_opts {
        sz: std::mem::size_of::<libbpf_sys::bpf_kprobe_opts>() as _,
        bpf_cookie: cookie,
        offset: offset as _,
        retprobe: ret,
        ..Default::default()
    };
    // SAFETY: prog is a loaded program; name and opts outlive the call.
    let link = unsafe {
        libbpf_sys::bpf_program__attach_kprobe_opts(
            prog.as_libbpf_object().as_ptr(),
            name.as_ptr(),
            &opts,
        )
    };
    // libbpf returns NULL and sets errno on error.
    NonNull::new(link)
        .map(RawLink)
        .ok_or_else(io::Error::last_os_error)
}

/// A two-instruction program (`return 0`) for feature probes.
fn trivial(
    prog_type: libbpf_sys::bpf_prog_type,
    attach_type: libbpf_sys::bpf_attach_type,
    btf_id: u32,
) -> Result<OwnedFd, String> {
    let mov_r0_0 = libbpf_sys::bpf_insn {
        code: (libbpf_sys::BPF_ALU64 | libbpf_sys::BPF_MOV | libbpf_sys::BPF_K) as u8,
        ..Default::default()
    };
    let exit = libbpf_sys::bpf_insn {
        code: (libbpf_sys::BPF_JMP | libbpf_sys::BPF_EXIT) as u8,
        ..Default::default()
    };
    let mut opts = libbpf_sys::bpf_prog_load_opts {
        sz: std::mem::size_of::<libbpf_sys::bpf_prog_load_opts>() as _,
        expected_attach_type: attach_type,
        attach_btf_id: btf_id,
        ..Default::default()
    };
    load(prog_type, c"bpfscope_probe", &[mov_r0_0, exit], &mut opts)
}

/// Tries to load and attach an fentry program to the function with this BTF id.
pub fn probe_fentry(btf_id: u32) -> Result<(), String> {
    let prog = trivial(
        libbpf_sys::BPF_PROG_TYPE_TRACING,
        libbpf_sys::BPF_TRACE_FENTRY,
        btf_id,
    )
    .map_err(|e| format!("loading an fentry program failed: {e}"))?;
    attach_tracing(prog.as_fd(), false, 0)
        .map(drop)
        .map_err(|e| format!("attaching an fentry program failed: {e}"))
}

/// Tries to attach a kprobe_multi link to one function.
pub fn probe_kprobe_multi(func: &str) -> Result<(), String> {
    let prog = trivial(
        libbpf_sys::BPF_PROG_TYPE_KPROBE,
        libbpf_sys::BPF_TRACE_KPROBE_MULTI,
        0,
    )?;
    let name = CString::new(func).map_err(|e| e.to_string())?;
    let mut syms = [name.as_ptr()];
    let mut opts = libbpf_sys::bpf_link_create_opts {
        sz: std::mem::size_of::<libbpf_sys::bpf_link_create_opts>() as _,
        ..Default::default()
    };
    opts.__bindgen_anon_1.kprobe_multi.cnt = 1;
    opts.__bindgen_anon_1.kprobe_multi.syms = syms.as_mut_ptr();
    // SAFETY: prog is valid; opts and the symbol array outlive the call.
    let fd = unsafe {
        libbpf_sys::bpf_link_create(
            prog.as_raw_fd(),
            0,
            libbpf_sys::BPF_TRACE_KPROBE_MULTI,
            &opts,
        )
    };
    if fd < 0 {
        return Err(io::Error::from_raw_os_error(-fd).to_string());
    }
    // SAFETY: a new fd owned by nobody else; closing it detaches.
    drop(unsafe { OwnedFd::from_raw_fd(fd) });
    Ok(())
}

/// From linux/perf_event.h (the libc crate does not carry it).
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 1 << 3;
const KPROBE_PMU: &str = "/sys/bus/event_source/devices/kprobe/type";

/// Tries to create a kprobe perf event on a function (what attaching a
/// kprobe program starts with, and what lockdown and kernels built without
/// kprobes refuse).
pub fn probe_kprobe(func: &str) -> Result<(), String> {
    let ty: u32 = match fs::read_to_string(KPROBE_PMU) {
        Ok(s) => s.trim().parse().map_err(|_| format!("bad {KPROBE_PMU}"))?,
        Err(_) => {
            return Err(
                "the kernel has no kprobe event source (built without CONFIG_KPROBES)".into(),
            )
        }
    };
    let name = CString::new(func).map_err(|e| e.to_string())?;
    let mut attr = libbpf_sys::perf_event_attr {
        type_: ty,
        size: std::mem::size_of::<libbpf_sys::perf_event_attr>() as u32,
        ..Default::default()
    };
    attr.__bindgen_anon_3.kprobe_func = name.as_ptr() as u64;
    // SAFETY: attr is initialized and, with the name it points to, outlives
    // the call; the result is checked before use.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &attr as *const libbpf_sys::perf_event_attr,
            -1,
            0,
            -1,
            PERF_FLAG_FD_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(format!(
            "creating a kprobe failed: {}",
            io::Error::last_os_error()
        ));
    }
    // SAFETY: a new fd owned by nobody else; closing it removes the kprobe.
    drop(unsafe { OwnedFd::from_raw_fd(fd as i32) });
    Ok(())
}

/// The kernel lockdown mode ("integrity", "confidentiality"), or None.
/// securityfs is mounted for the question when it is not, and unmounted after.
pub fn lockdown() -> Option<String> {
    const FILE: &str = "/sys/kernel/security/lockdown";
    let read = || {
        fs::read_to_string(FILE).ok().and_then(|s| {
            // "none [integrity] confidentiality": the bracketed one is in force.
            let start = s.find('[')? + 1;
            let end = s[start..].find(']')? + start;
            Some(s[start..end].to_string())
        })
    };
    if let Some(m) = read() {
        return (m != "none").then_some(m);
    }
    let _mount = TempMount::new(c"securityfs", c"/sys/kernel/security", c"securityfs")?;
    read().filter(|m| m != "none")
}

/// A filesystem mounted for a moment, unmounted when dropped.
struct TempMount(&'static CStr);

impl TempMount {
    fn new(src: &CStr, target: &'static CStr, fstype: &CStr) -> Option<TempMount> {
        crate::probe::tracefs::mount_fs(src, target, fstype)
            .ok()
            .map(|()| TempMount(target))
    }
}

impl Drop for TempMount {
    fn drop(&mut self) {
        // SAFETY: target is a valid NUL-terminated path we mounted.
        unsafe { libc::umount2(self.0.as_ptr(), libc::MNT_DETACH) };
    }
}
