//! Reading a loaded program's info (BPF_OBJ_GET_INFO_BY_FD) into a
//! `BpfProg`: JIT ranges, sub-program names, BTF line info with source text.
//!
//! libbpf-rs only offers this through a whole-system iterator
//! (`query::ProgInfoIter`); a program announced by the side-band must be
//! read at once, by id, before it can go away, hence the direct calls.

use std::ffi::CStr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use libbpf_rs::btf::Btf;
use libbpf_rs::AsRawLibbpf;
use libbpf_sys::{bpf_func_info, bpf_line_info, bpf_prog_info};

use bpfscope_recording::bpfprog::{BpfProg, LineInfo, Subprog};

/// Why a program could not be read.
#[derive(Debug, thiserror::Error)]
pub enum InfoError {
    #[error("BPF program {0} is gone")]
    Gone(u32),
    #[error("reading BPF program {id}: {err}")]
    Io { id: u32, err: std::io::Error },
}

/// The ids of all loaded programs.
pub fn prog_ids() -> Vec<u32> {
    let mut ids = Vec::new();
    let mut id = 0u32;
    loop {
        let mut next = 0u32;
        // SAFETY: writes the next id into the local.
        if unsafe { libbpf_sys::bpf_prog_get_next_id(id, &mut next) } != 0 {
            break;
        }
        ids.push(next);
        id = next;
    }
    ids
}

/// A descriptor for a program, by id.
pub fn prog_fd(id: u32) -> Result<OwnedFd, InfoError> {
    // SAFETY: no pointers; returns a new descriptor or a negative error.
    let fd = unsafe { libbpf_sys::bpf_prog_get_fd_by_id(id) };
    if fd < 0 {
        return Err(InfoError::Gone(id));
    }
    // SAFETY: fd is a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Whether no program has this id any more (ENOENT; a refusal such as
/// EPERM says nothing either way).
pub fn is_gone(id: u32) -> bool {
    // SAFETY: no pointers; returns a new descriptor or a negative error.
    let fd = unsafe { libbpf_sys::bpf_prog_get_fd_by_id(id) };
    if fd >= 0 {
        // SAFETY: fd is a fresh descriptor we own; dropping closes it.
        drop(unsafe { OwnedFd::from_raw_fd(fd) });
        return false;
    }
    fd == -libc::ENOENT
}

/// The program type's name as libbpf spells it (`kprobe`, `tracepoint`, ...).
pub fn type_name(t: u32) -> String {
    // SAFETY: returns a static string or null for unknown types.
    let p = unsafe { libbpf_sys::libbpf_bpf_prog_type_str(t) };
    if p.is_null() {
        return format!("type{t}");
    }
    // SAFETY: non-null pointers from libbpf are static NUL-terminated strings.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

fn get_info(fd: &OwnedFd, info: &mut bpf_prog_info, id: u32) -> Result<(), InfoError> {
    let mut len = std::mem::size_of::<bpf_prog_info>() as u32;
    // SAFETY: info is a valid bpf_prog_info of `len` bytes; any array
    // pointers in it point at buffers sized by the counts set alongside.
    let rc = unsafe { libbpf_sys::bpf_prog_get_info_by_fd(fd.as_raw_fd(), info, &mut len) };
    if rc != 0 {
        return Err(InfoError::Io {
            id,
            err: std::io::Error::from_raw_os_error(-rc),
        });
    }
    Ok(())
}

/// Basic info only (name, tag, type, run statistics), without arrays.
pub fn basic(id: u32) -> Result<bpf_prog_info, InfoError> {
    let fd = prog_fd(id)?;
    let mut info = bpf_prog_info::default();
    get_info(&fd, &mut info, id)?;
    Ok(info)
}

pub fn name_of(info: &bpf_prog_info) -> String {
    let bytes: Vec<u8> = info
        .name
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

pub fn tag_of(tag: &[u8; 8]) -> String {
    tag.iter().map(|b| format!("{b:02x}")).collect()
}

/// A string from a BTF string section.
fn btf_str(btf: &Btf<'_>, off: u32) -> String {
    // SAFETY: the btf pointer is valid while `btf` lives; libbpf bounds-checks the offset.
    let p = unsafe { libbpf_sys::btf__name_by_offset(btf.as_libbpf_object().as_ptr(), off) };
    if p.is_null() {
        return String::new();
    }
    // SAFETY: libbpf returns a NUL-terminated string inside the BTF data.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// The name of a BTF FUNC type.
fn btf_func_name(btf: &Btf<'_>, type_id: u32) -> Option<String> {
    // SAFETY: as above; a null result means no such type.
    let t = unsafe { libbpf_sys::btf__type_by_id(btf.as_libbpf_object().as_ptr(), type_id) };
    if t.is_null() {
        return None;
    }
    // SAFETY: t points at a btf_type inside the BTF data.
    let name_off = unsafe { (*t).name_off };
    Some(btf_str(btf, name_off)).filter(|s| !s.is_empty())
}

/// Reads everything bpfscope keeps of a program, now.
pub fn fetch(id: u32) -> Result<BpfProg, InfoError> {
    let fd = prog_fd(id)?;
    let mut counts = bpf_prog_info::default();
    get_info(&fd, &mut counts, id)?;

    let mut ksyms = vec![0u64; counts.nr_jited_ksyms as usize];
    let mut lens = vec![0u32; counts.nr_jited_func_lens as usize];
    let mut funcs = vec![bpf_func_info::default(); counts.nr_func_info as usize];
    let mut lines = vec![bpf_line_info::default(); counts.nr_line_info as usize];
    let mut jited_lines = vec![0u64; counts.nr_jited_line_info as usize];
    let mut tags = vec![[0u8; 8]; counts.nr_prog_tags as usize];
    let mut info = bpf_prog_info {
        nr_jited_ksyms: ksyms.len() as u32,
        jited_ksyms: ksyms.as_mut_ptr() as u64,
        nr_jited_func_lens: lens.len() as u32,
        jited_func_lens: lens.as_mut_ptr() as u64,
        nr_func_info: funcs.len() as u32,
        func_info_rec_size: std::mem::size_of::<bpf_func_info>() as u32,
        func_info: funcs.as_mut_ptr() as u64,
        nr_line_info: lines.len() as u32,
        line_info_rec_size: std::mem::size_of::<bpf_line_info>() as u32,
        line_info: lines.as_mut_ptr() as u64,
        nr_jited_line_info: jited_lines.len() as u32,
        jited_line_info_rec_size: std::mem::size_of::<u64>() as u32,
        jited_line_info: jited_lines.as_mut_ptr() as u64,
        nr_prog_tags: tags.len() as u32,
        prog_tags: tags.as_mut_ptr() as u64,
        ..Default::default()
    };
    get_info(&fd, &mut info, id)?;

    let btf = (info.btf_id != 0)
        .then(|| Btf::from_prog_id(id).ok())
        .flatten();
    let name = name_of(&info);
    let tag = tag_of(&info.tag);
    let subprogs = ksyms
        .iter()
        .zip(&lens)
        .enumerate()
        .map(|(i, (&addr, &len))| {
            // The kernel names JIT images bpf_prog_<tag>_<BTF function name, else prog name>.
            let sub_tag = tags.get(i).map_or_else(|| tag.clone(), tag_of);
            let fname = btf
                .as_ref()
                .and_then(|b| funcs.get(i).and_then(|f| btf_func_name(b, f.type_id)))
                .unwrap_or_else(|| name.clone());
            Subprog {
                symbol: format!("bpf_prog_{sub_tag}_{fname}"),
                addr,
                len,
            }
        })
        .collect();
    let mut out_lines: Vec<LineInfo> = match &btf {
        Some(b) => lines
            .iter()
            .zip(&jited_lines)
            .map(|(l, &addr)| LineInfo {
                addr,
                file: btf_str(b, l.file_name_off),
                line: l.line_col >> 10,
                col: l.line_col & 0x3ff,
                text: btf_str(b, l.line_off).trim().to_string(),
                insn_off: l.insn_off,
            })
            .collect(),
        None => Vec::new(),
    };
    out_lines.sort_by_key(|l| l.addr);
    Ok(BpfProg {
        id,
        tag,
        name,
        prog_type: type_name(info.type_),
        subprogs,
        lines: out_lines,
        jited_len: info.jited_prog_len,
        xlated_len: info.xlated_prog_len,
        load_time_ns: info.load_time,
        unloaded_ns: None,
    })
}

/// Every loaded program, read now (programs that vanish meanwhile are skipped).
pub fn fetch_all() -> Vec<BpfProg> {
    prog_ids()
        .into_iter()
        .filter_map(|id| fetch(id).ok())
        .collect()
}

/// Ids of the BPF programs this process holds a descriptor of (its own).
pub fn own_prog_ids() -> Vec<u32> {
    let Ok(rd) = std::fs::read_dir("/proc/self/fdinfo") else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| {
            let text = std::fs::read_to_string(e.path()).ok()?;
            text.lines()
                .find_map(|l| l.strip_prefix("prog_id:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .collect()
}

/// What the perf events with BPF programs attached are, per program id, as
/// `bpfscope bpf list` names them (`uprobe:/bin/bash+0x8a2b0`,
/// `kprobe:vfs_read`, `tracepoint:sched_switch`): asked of each process's
/// perf event descriptors (BPF_TASK_FD_QUERY, Linux 4.17), as `bpftool
/// perf` does. For kernels whose link info says nothing of a perf event
/// link's event (before 6.6); the link's owner holds the event's
/// descriptor. Sampling events (perf_event programs) are not told.
pub fn perf_event_attachments() -> std::collections::HashMap<u32, Vec<String>> {
    let mut out: std::collections::HashMap<u32, Vec<String>> = Default::default();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return out;
    };
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            let is_perf = std::fs::read_link(fd.path())
                .is_ok_and(|t| t.as_os_str() == "anon_inode:[perf_event]");
            let Some(fd) = fd.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
                continue;
            };
            if !is_perf {
                continue;
            }
            if let Some((id, what)) = task_fd_query(pid, fd) {
                let v = out.entry(id).or_default();
                if !v.contains(&what) {
                    v.push(what);
                }
            }
        }
    }
    out
}

/// The program attached to process `pid`'s perf event descriptor `fd`
/// and what the event is.
fn task_fd_query(pid: i32, fd: i32) -> Option<(u32, String)> {
    let mut buf = [0u8; 4096];
    let mut len = buf.len() as u32;
    let (mut id, mut kind, mut offset, mut addr) = (0u32, 0u32, 0u64, 0u64);
    // SAFETY: buf is len bytes long and outlives the call; the other
    // out-pointers are to live locals.
    let rc = unsafe {
        libbpf_sys::bpf_task_fd_query(
            pid,
            fd,
            0,
            buf.as_mut_ptr().cast(),
            &mut len,
            &mut id,
            &mut kind,
            &mut offset,
            &mut addr,
        )
    };
    if rc != 0 {
        return None;
    }
    // The kernel writes the name NUL-terminated, and len without the NUL.
    let name = CStr::from_bytes_until_nul(&buf)
        .map(|c| c.to_string_lossy().into_owned())
        .unwrap_or_default();
    let what = match kind {
        libbpf_sys::BPF_FD_TYPE_TRACEPOINT => format!("tracepoint:{name}"),
        libbpf_sys::BPF_FD_TYPE_RAW_TRACEPOINT => format!("raw_tp:{name}"),
        libbpf_sys::BPF_FD_TYPE_KPROBE | libbpf_sys::BPF_FD_TYPE_KRETPROBE => {
            let k = if kind == libbpf_sys::BPF_FD_TYPE_KPROBE {
                "kprobe"
            } else {
                "kretprobe"
            };
            if name.is_empty() {
                format!("{k}:{addr:#x}")
            } else if offset == 0 {
                format!("{k}:{name}")
            } else {
                format!("{k}:{name}+{offset:#x}")
            }
        }
        libbpf_sys::BPF_FD_TYPE_UPROBE | libbpf_sys::BPF_FD_TYPE_URETPROBE => {
            let k = if kind == libbpf_sys::BPF_FD_TYPE_UPROBE {
                "uprobe"
            } else {
                "uretprobe"
            };
            format!("{k}:{name}+{offset:#x}")
        }
        _ => return None,
    };
    Some((id, what))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(
            tag_of(&[0xde, 0xad, 0, 1, 2, 3, 4, 0xff]),
            "dead0001020304ff"
        );
        assert_eq!(type_name(libbpf_sys::BPF_PROG_TYPE_KPROBE), "kprobe");
    }
}
