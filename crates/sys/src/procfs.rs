//! /proc: process memory maps and status fields, parsed in one place.

use std::io;

/// One line of /proc/PID/maps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapsEntry {
    pub start: u64,
    pub end: u64,
    /// "r-xp" and the like.
    pub perms: String,
    /// Offset in the file of `start`.
    pub offset: u64,
    /// "fd:01": together with the inode, the file's identity.
    pub dev: String,
    pub inode: u64,
    /// The path as the kernel prints it (spaces kept, " (deleted)" removed),
    /// or a pseudo name such as "[stack]"; empty for anonymous memory.
    pub path: String,
    /// The kernel marked the file as deleted.
    pub deleted: bool,
}

impl MapsEntry {
    pub fn executable(&self) -> bool {
        self.perms.as_bytes().get(2) == Some(&b'x')
    }

    /// Backed by a file (not anonymous memory or a pseudo mapping).
    pub fn is_file(&self) -> bool {
        self.inode != 0 && self.path.starts_with('/')
    }

    /// The range as /proc/PID/map_files names it ("7f00-7f10").
    pub fn range_name(&self) -> String {
        format!("{:x}-{:x}", self.start, self.end)
    }

    /// The file offset of address `addr` inside this mapping.
    pub fn file_offset(&self, addr: u64) -> u64 {
        addr - self.start + self.offset
    }
}

/// Parses one line of a maps file; None for a malformed line.
pub fn parse_maps_line(line: &str) -> Option<MapsEntry> {
    // Six fields, the last of which (the path) may hold spaces.
    let mut it = line.splitn(6, ' ');
    let range = it.next()?;
    let perms = it.next()?;
    let offset = u64::from_str_radix(it.next()?, 16).ok()?;
    let dev = it.next()?;
    let inode = it.next()?.parse().ok()?;
    let path = it.next().unwrap_or("").trim_start();
    let (path, deleted) = match path.strip_suffix(" (deleted)") {
        Some(p) => (p, true),
        None => (path, false),
    };
    let (s, e) = range.split_once('-')?;
    Some(MapsEntry {
        start: u64::from_str_radix(s, 16).ok()?,
        end: u64::from_str_radix(e, 16).ok()?,
        perms: perms.to_string(),
        offset,
        dev: dev.to_string(),
        inode,
        path: path.to_string(),
        deleted,
    })
}

/// Parses a whole maps file, skipping malformed lines.
pub fn parse_maps(text: &str) -> Vec<MapsEntry> {
    text.lines().filter_map(parse_maps_line).collect()
}

/// The memory maps of a process ("self" or a pid).
pub fn maps(pid: impl std::fmt::Display) -> io::Result<Vec<MapsEntry>> {
    Ok(parse_maps(&std::fs::read_to_string(format!(
        "/proc/{pid}/maps"
    ))?))
}

/// The pids of every process, from the numeric entries of /proc.
pub fn pids() -> Vec<u32> {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect()
}

/// A field of /proc/PID/status ("Tgid", "CapEff"), trimmed.
pub fn status_field(pid: impl std::fmt::Display, name: &str) -> Option<String> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k == name).then(|| v.trim().to_string())
    })
}

/// The process a thread belongs to.
pub fn tgid(tid: u32) -> Option<u32> {
    status_field(tid, "Tgid")?.parse().ok()
}

/// True when /proc knows the pid (a process, or a thread of one).
pub fn exists(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lines() {
        let e = parse_maps_line(
            "7f1c2a000000-7f1c2a028000 r-xp 00028000 fd:01 1835139   /usr/lib/a b.so (deleted)",
        )
        .unwrap();
        assert_eq!(
            (e.start, e.end, e.offset),
            (0x7f1c2a000000, 0x7f1c2a028000, 0x28000)
        );
        assert_eq!((e.dev.as_str(), e.inode), ("fd:01", 1835139));
        assert_eq!(e.path, "/usr/lib/a b.so");
        assert!(e.deleted && e.executable() && e.is_file());
        assert_eq!(e.file_offset(0x7f1c2a000010), 0x28010);
        assert_eq!(e.range_name(), "7f1c2a000000-7f1c2a028000");
        let anon = parse_maps_line("7ffd1000-7ffd2000 rw-p 00000000 00:00 0 ").unwrap();
        assert!(anon.path.is_empty() && !anon.is_file() && !anon.executable());
        let stack = parse_maps_line("7ffd1000-7ffd2000 rw-p 00000000 00:00 0   [stack]").unwrap();
        assert_eq!(stack.path, "[stack]");
        assert!(parse_maps_line("garbage").is_none());
    }

    #[test]
    fn own_process() {
        let m = maps("self").unwrap();
        assert!(m.iter().any(|e| e.executable() && e.is_file()));
        assert_eq!(tgid(std::process::id()), Some(std::process::id()));
        assert!(pids().contains(&std::process::id()));
        assert!(exists(std::process::id()));
    }
}
