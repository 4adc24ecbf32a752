//! Syscall numbers (from the build-time table) and the shape of syscall records.

use crate::bpf::abi::bs_limits;
use crate::bpf::syscalls::SYSCALLS;

/// Syscall trace events whose names differ from the __NR_ names.
const ALIASES: &[(&str, &str)] = &[
    ("newstat", "stat"),
    ("newlstat", "lstat"),
    ("newfstat", "fstat"),
    ("newuname", "uname"),
];

/// The x86_64 number of the syscall a `sys_enter_NAME` event traces.
pub fn number(event_name: &str) -> Option<u32> {
    let name = ALIASES
        .iter()
        .find(|(ev, _)| *ev == event_name)
        .map_or(event_name, |(_, nr)| nr);
    let nr = SYSCALLS
        .binary_search_by(|(n, _)| n.cmp(&name))
        .ok()
        .map(|i| SYSCALLS[i].1)?;
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
    fn numbers() {
        assert_eq!(number("read"), Some(0));
        assert_eq!(number("write"), Some(1));
        assert_eq!(number("newstat"), Some(4));
        assert_eq!(number("openat"), Some(257));
        assert_eq!(number("no_such_syscall"), None);
    }

    #[test]
    fn slots() {
        assert_eq!(arg_slot("fd", 16, false), Some(0));
        assert_eq!(arg_slot("count", 32, false), Some(2));
        assert_eq!(arg_slot("ret", 16, true), Some(12));
        assert_eq!(arg_slot("__syscall_nr", 8, true), Some(13));
    }
}
