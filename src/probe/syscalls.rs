//! Syscall numbers (from the build-time table) and the shape of syscall records.

use bpfscope_bpf::abi::bs_limits;
use bpfscope_bpf::syscalls::SYSCALLS;

/// Syscall trace events whose names differ from the __NR_ names.
const ALIASES: &[(&str, &str)] = &[
    ("newstat", "stat"),
    ("newlstat", "lstat"),
    ("newfstat", "fstat"),
    ("newuname", "uname"),
    ("sendfile64", "sendfile"),
    ("umount", "umount2"),
];

/// Syscalls newer than the uapi headers bpfscope may be built against
/// (Debian 12's are Linux 6.1's). Syscall numbers are ABI: they are only
/// ever appended, and since Linux 5.1 a new syscall has the same number on
/// every architecture, so a running kernel's new syscalls can be known
/// here. Without a number a syscall event takes a classic tracepoint link,
/// which costs more per event and ~100 ms to detach (44 of them made
/// `count 'tracepoint:*:*'` take seconds to end).
const NEWER: &[(&str, u32)] = &[
    ("cachestat", 451),
    ("fchmodat2", 452),
    ("map_shadow_stack", 453),
    ("futex_wake", 454),
    ("futex_wait", 455),
    ("futex_requeue", 456),
    ("statmount", 457),
    ("listmount", 458),
    ("lsm_get_self_attr", 459),
    ("lsm_set_self_attr", 460),
    ("lsm_list_modules", 461),
    ("mseal", 462),
    ("setxattrat", 463),
    ("getxattrat", 464),
    ("listxattrat", 465),
    ("removexattrat", 466),
    ("open_tree_attr", 467),
    ("file_getattr", 468),
    ("file_setattr", 469),
    // x86_64's own.
    #[cfg(target_arch = "x86_64")]
    ("uretprobe", 335),
    #[cfg(target_arch = "x86_64")]
    ("uprobe", 336),
];

/// The number of the syscall a `sys_enter_NAME` event traces.
pub fn number(event_name: &str) -> Option<u32> {
    let name = ALIASES
        .iter()
        .find(|(ev, _)| *ev == event_name)
        .map_or(event_name, |(_, nr)| nr);
    let nr = SYSCALLS
        .binary_search_by(|(n, _)| n.cmp(&name))
        .ok()
        .map(|i| SYSCALLS[i].1)
        .or_else(|| NEWER.iter().find(|(n, _)| *n == name).map(|x| x.1))?;
    (nr < bs_limits::BS_SYS_MAX.0).then_some(nr)
}

/// Width and signedness of common integer C types in syscall signatures.
pub fn c_int_type(ctype: &str) -> Option<(u8, bool)> {
    Some(match ctype {
        "int" | "pid_t" | "key_t" | "clockid_t" | "mqd_t" | "timer_t" | "rwf_t" => (4, true),
        "unsigned int" | "u32" | "__u32" | "uid_t" | "gid_t" | "qid_t" | "old_uid_t"
        | "old_gid_t" | "unsigned" => (4, false),
        "umode_t" | "unsigned short" | "u16" => (2, false),
        "long" | "off_t" | "loff_t" | "ssize_t" | "__s64" | "s64" | "time_t" | "long int" => {
            (8, true)
        }
        "unsigned long" | "size_t" | "u64" | "__u64" | "aio_context_t" | "unsigned long int" => {
            (8, false)
        }
        _ => return None,
    })
}

/// Argument slot of a syscall record field on the raw_tp path: arguments
/// sit at offset 16 + 8 * i in sys_enter records.
pub fn arg_slot(name: &str, offset: u16, exit: bool) -> Option<u8> {
    let nr_slot = bs_limits::BS_ARG_NR.0 as u8;
    if name == "__syscall_nr" {
        return Some(nr_slot);
    }
    if exit {
        return (name == "ret").then_some(bs_limits::BS_ARG_RET.0 as u8);
    }
    let i = offset.checked_sub(16)? / 8;
    (offset % 8 == 0 && i < 6).then_some(i as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(target_arch = "aarch64")]
    fn numbers() {
        // asm-generic's table, through its aliases (__NR_fcntl -> __NR3264_fcntl).
        assert_eq!(number("read"), Some(63));
        assert_eq!(number("write"), Some(64));
        assert_eq!(number("openat"), Some(56));
        assert_eq!(number("fcntl"), Some(25));
        assert_eq!(number("newfstat"), Some(80));
        assert_eq!(number("open"), None);
        assert_eq!(number("futex_wait"), Some(455));
        assert_eq!(number("uprobe"), None);
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn numbers() {
        assert_eq!(number("read"), Some(0));
        assert_eq!(number("write"), Some(1));
        assert_eq!(number("newstat"), Some(4));
        assert_eq!(number("openat"), Some(257));
        assert_eq!(number("no_such_syscall"), None);
        assert_eq!(number("futex_wait"), Some(455));
        assert_eq!(number("sendfile64"), Some(40));
        assert_eq!(number("umount"), Some(166));
    }

    #[test]
    fn slots() {
        assert_eq!(arg_slot("fd", 16, false), Some(0));
        assert_eq!(arg_slot("count", 32, false), Some(2));
        assert_eq!(arg_slot("ret", 16, true), Some(12));
        assert_eq!(arg_slot("__syscall_nr", 8, true), Some(13));
    }
}
