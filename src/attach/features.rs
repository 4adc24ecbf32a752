//! Feature probes: what this kernel offers, asked of the kernel itself.

use std::cell::OnceCell;
use std::collections::HashSet;
use std::os::fd::{FromRawFd, OwnedFd};

use crate::attach::kfunc;
use crate::probe::btf;
use libbpf_rs::btf::{
    types::{Struct, Typedef},
    Btf,
};

/// Kernel capabilities that decide which path a probe takes.
#[derive(Debug, Default)]
pub struct Features {
    /// raw_tp programs can read a per-attachment cookie (Linux 6.10+).
    pub raw_tp_cookie: bool,
    /// Raw tracepoint names from vmlinux BTF (`btf_trace_NAME` typedefs), read on first use.
    raw_tps: OnceCell<HashSet<String>>,
    /// Struct names of vmlinux BTF, read on first use.
    structs: OnceCell<HashSet<String>>,
    /// fentry/fexit work (Ok: the function they were tried on), tried on first use.
    fentry: OnceCell<Result<Template, String>>,
    /// kprobes work, tried on first use.
    kprobe: OnceCell<Result<(), String>>,
    /// kprobe_multi links work (Linux 5.18+ with CONFIG_FPROBE), tried on first use.
    kprobe_multi: OnceCell<bool>,
    /// Syscall tracepoints take their classic tracepoints instead of the
    /// shared raw_tp on sys_enter/sys_exit: the raw_tp runs on every
    /// syscall of the machine (~100 ns each), a classic tracepoint only on
    /// its own syscall (~180 ns). The agent, which runs many plans at once,
    /// asks for this for plans of a few syscalls.
    pub classic_syscalls: std::cell::Cell<bool>,
    /// Sched tracepoints whose record fields are all copied from tasks
    /// take the raw tracepoint and read the tasks (plan::paths); set with
    /// raw_tp cookies, unless `BPFSCOPE_GENERIC` asks for the general path.
    pub sched_via_tasks: bool,
    /// pidfd_open takes PIDFD_THREAD (Linux 6.9+): a thread's own storage
    /// can be read from user space, by a descriptor of the thread.
    pub thread_pidfd: bool,
}

/// A kernel function fentry attached to in the feature probe: the
/// session aims its template fentry/fexit programs at it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    pub func: String,
    pub btf_id: u32,
}

/// Functions every kernel has, traceable, with simple prototypes: feature probes try them.
const PROBE_FUNCS: &[&str] = &["vfs_read", "ksys_read", "vfs_write", "do_sys_openat2"];

impl Features {
    pub fn detect() -> Features {
        let raw_tp_cookie = helper_supported(
            libbpf_sys::BPF_PROG_TYPE_RAW_TRACEPOINT,
            libbpf_sys::BPF_FUNC_get_attach_cookie,
        );
        Features {
            raw_tp_cookie,
            sched_via_tasks: raw_tp_cookie && !crate::attach::shape::generic_forced(),
            raw_tps: OnceCell::new(),
            structs: OnceCell::new(),
            fentry: OnceCell::new(),
            kprobe: OnceCell::new(),
            kprobe_multi: OnceCell::new(),
            classic_syscalls: std::cell::Cell::new(false),
            thread_pidfd: pidfd_thread_works(),
        }
    }

    /// Features as if probed already, for tests that must not ask the
    /// kernel: raw tracepoints by name, fentry's template (Err: refused),
    /// kprobes, kprobe_multi, uprobe_multi.
    #[cfg(test)]
    pub(crate) fn assumed(
        raw_tps: &[&str],
        fentry: Result<Template, String>,
        kprobe: Result<(), String>,
        kprobe_multi: bool,
        uprobe_multi: bool,
    ) -> Features {
        let structs = if uprobe_multi {
            HashSet::from(["bpf_uprobe_multi_link".to_string()])
        } else {
            HashSet::new()
        };
        Features {
            raw_tp_cookie: !raw_tps.is_empty(),
            sched_via_tasks: false,
            raw_tps: OnceCell::from(
                raw_tps
                    .iter()
                    .map(|s| s.to_string())
                    .collect::<HashSet<_>>(),
            ),
            structs: OnceCell::from(structs),
            fentry: OnceCell::from(fentry),
            kprobe: OnceCell::from(kprobe),
            kprobe_multi: OnceCell::from(kprobe_multi),
            classic_syscalls: std::cell::Cell::new(false),
            thread_pidfd: true,
        }
    }

    /// Whether fentry/fexit programs can be loaded and attached here (tried
    /// for real); Err says why not.
    pub fn fentry(&self) -> Result<&Template, &str> {
        self.fentry
            .get_or_init(|| {
                if forced() == Some("kprobe") {
                    return Err(format!("disabled by {VIA}=kprobe"));
                }
                let k = btf::vmlinux().ok_or("the kernel has no BTF (/sys/kernel/btf/vmlinux)")?;
                let (func, sig) = PROBE_FUNCS
                    .iter()
                    .find_map(|f| Some((*f, k.func(f)?)))
                    .ok_or("none of the usual test functions is in the kernel's BTF")?;
                kfunc::probe_fentry(sig.func_id).map_err(with_lockdown)?;
                Ok(Template {
                    func: func.to_string(),
                    btf_id: sig.func_id,
                })
            })
            .as_ref()
            .map_err(String::as_str)
    }

    /// Whether kprobes can be created here (tried for real); Err says why not.
    pub fn kprobe(&self) -> Result<(), &str> {
        self.kprobe
            .get_or_init(|| {
                if forced() == Some("fentry") {
                    return Err(format!("disabled by {VIA}=fentry"));
                }
                kfunc::probe_kprobe(PROBE_FUNCS[0]).map_err(with_lockdown)
            })
            .as_ref()
            .map(|_| ())
            .map_err(String::as_str)
    }

    /// Whether kprobe_multi links work (tried for real, after kprobes).
    pub fn kprobe_multi(&self) -> bool {
        *self.kprobe_multi.get_or_init(|| {
            self.kprobe().is_ok() && kfunc::probe_kprobe_multi(PROBE_FUNCS[0]).is_ok()
        })
    }

    /// uprobe_multi links (Linux 6.6+), found by the kernel's link type in BTF.
    pub fn uprobe_multi(&self) -> bool {
        self.structs
            .get_or_init(|| {
                let Ok(btf) = Btf::from_vmlinux() else {
                    return HashSet::new();
                };
                btf.type_by_kind::<Struct<'_>>()
                    .filter_map(|t| Some(t.name()?.to_str()?.to_string()))
                    .filter(|n| n.starts_with("bpf_") && n.ends_with("_link"))
                    .collect()
            })
            .contains("bpf_uprobe_multi_link")
    }

    /// True when a raw tracepoint of this name exists in vmlinux.
    pub fn has_raw_tp(&self, name: &str) -> bool {
        self.raw_tps
            .get_or_init(|| {
                let Ok(btf) = Btf::from_vmlinux() else {
                    return HashSet::new();
                };
                btf.type_by_kind::<Typedef<'_>>()
                    .filter_map(|t| {
                        let n = t.name()?.to_str()?;
                        n.strip_prefix("btf_trace_").map(str::to_string)
                    })
                    .collect()
            })
            .contains(name)
    }
}

/// Restricts kernel function probes to one mechanism, `kprobe` or
/// `fentry`, as if the kernel refused the other (comparisons, tests).
pub const VIA: &str = "BPFSCOPE_KFUNC_VIA";

fn forced() -> Option<&'static str> {
    via(std::env::var(VIA).ok().as_deref())
}

/// The mechanism a value of VIA keeps (other values: none forced).
fn via(value: Option<&str>) -> Option<&'static str> {
    match value? {
        "kprobe" => Some("kprobe"),
        "fentry" => Some("fentry"),
        _ => None,
    }
}

/// Adds the kernel lockdown mode to a refusal, when there is one.
fn with_lockdown(reason: String) -> String {
    match kfunc::lockdown() {
        Some(mode) => format!("{reason}; kernel lockdown is '{mode}'"),
        None => reason,
    }
}

/// Asks the kernel whether programs of this type may call this helper.
pub fn helper_supported(
    prog_type: libbpf_sys::bpf_prog_type,
    helper: libbpf_sys::bpf_func_id,
) -> bool {
    // SAFETY: libbpf_probe_bpf_helper only reads its arguments; opts may be null.
    let rc = unsafe { libbpf_sys::libbpf_probe_bpf_helper(prog_type, helper, std::ptr::null()) };
    rc == 1
}

/// pidfd_open's flag for a thread rather than its process (O_EXCL).
const PIDFD_THREAD: libc::c_uint = libc::O_EXCL as libc::c_uint;

/// A descriptor of thread `tid`, or None (it exited, or the kernel is older).
pub fn thread_pidfd(tid: u32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, tid as libc::pid_t, PIDFD_THREAD) };
    if fd < 0 {
        return None;
    }
    // SAFETY: pidfd_open returned a new descriptor that nothing else owns.
    Some(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Whether this kernel gives descriptors of threads (probed on this
/// process's own thread).
fn pidfd_thread_works() -> bool {
    thread_pidfd(std::process::id()).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forcing_a_mechanism() {
        assert_eq!(via(Some("kprobe")), Some("kprobe"));
        assert_eq!(via(Some("fentry")), Some("fentry"));
        assert_eq!(via(Some("both")), None);
        assert_eq!(via(Some("")), None);
        assert_eq!(via(None), None);
    }

    #[test]
    fn assumed_features_answer_without_the_kernel() {
        let t = Template {
            func: "vfs_read".into(),
            btf_id: 9,
        };
        let f = Features::assumed(
            &["sched_switch"],
            Ok(t.clone()),
            Err("no".into()),
            true,
            true,
        );
        assert!(f.raw_tp_cookie);
        assert!(f.has_raw_tp("sched_switch"));
        assert!(!f.has_raw_tp("sched_wakeup"));
        assert_eq!(f.fentry(), Ok(&t));
        assert_eq!(f.kprobe(), Err("no"));
        assert!(f.kprobe_multi());
        assert!(f.uprobe_multi());
        let f = Features::assumed(&[], Err("off".into()), Ok(()), false, false);
        assert!(!f.raw_tp_cookie);
        assert_eq!(f.fentry(), Err("off"));
        assert_eq!(f.kprobe(), Ok(()));
        assert!(!f.kprobe_multi());
        assert!(!f.uprobe_multi());
    }
}
