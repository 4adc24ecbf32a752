//! Finding the binary a user probe names: a path, a library name resolved
//! the way the dynamic loader would (`libc` -> libc.so.6), a program on
//! PATH, or a file the target process has mapped.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use crate::error::Error;
use crate::usage;

/// The loader's search directories: LD_LIBRARY_PATH, ld.so.conf, then the defaults.
fn library_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("LD_LIBRARY_PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    let mut confs = vec![PathBuf::from("/etc/ld.so.conf")];
    let mut seen = BTreeSet::new();
    while let Some(conf) = confs.pop() {
        if !seen.insert(conf.clone()) {
            continue;
        }
        let Ok(text) = fs::read_to_string(&conf) else {
            continue;
        };
        for line in text.lines().map(str::trim) {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if let Some(pattern) = line.strip_prefix("include ") {
                confs.extend(expand_include(pattern.trim()));
            } else {
                dirs.push(PathBuf::from(line));
            }
        }
    }
    let [lib, usr_lib] = bpfscope_sys::arch::LIB_DIRS;
    for d in [lib, usr_lib, "/lib64", "/usr/lib64", "/lib", "/usr/lib"] {
        dirs.push(PathBuf::from(d));
    }
    dirs
}

/// `include /etc/ld.so.conf.d/*.conf`: only a trailing `*.suffix` glob is used in practice.
fn expand_include(pattern: &str) -> Vec<PathBuf> {
    let p = Path::new(pattern);
    let (Some(dir), Some(name)) = (p.parent(), p.file_name().and_then(|n| n.to_str())) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|f| {
                    f.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| super::glob::matches(name, n))
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// True for 64-bit ELF files of this architecture: the loader skips other
/// classes (e.g. /usr/lib32).
fn is_native_elf(p: &Path) -> bool {
    use std::io::Read;
    let mut h = [0u8; 20];
    let ok = fs::File::open(p)
        .and_then(|mut f| f.read_exact(&mut h))
        .is_ok();
    // EI_CLASS 2 = 64-bit, EI_DATA 1 = little endian, then e_machine.
    ok && &h[..4] == b"\x7fELF"
        && h[4] == 2
        && h[5] == 1
        && u16::from_le_bytes([h[18], h[19]]) == bpfscope_sys::arch::ELF_MACHINE
}

/// `lib{name}.so.N` beats `lib{name}.so` (a development symlink) and the shortest version wins.
fn library_rank(file: &str, name: &str) -> Option<(u8, usize)> {
    let lib = if name.starts_with("lib") {
        name.to_string()
    } else {
        format!("lib{name}")
    };
    for (rank, stem) in [(0u8, &lib), (2, &name.to_string())] {
        if file == format!("{stem}.so") {
            return Some((rank + 1, 0));
        }
        if let Some(v) = file.strip_prefix(&format!("{stem}.so.")) {
            if v.chars().all(|c| c.is_ascii_digit() || c == '.') {
                return Some((rank, v.len()));
            }
        }
    }
    None
}

/// Resolves the PATH part of a user probe.
pub fn resolve(spec: &str, pid: Option<u32>) -> Result<PathBuf, Error> {
    if spec.contains('/') {
        let p = Path::new(spec);
        if !p.is_file() {
            return Err(usage!("'{spec}': no such file"));
        }
        return p.canonicalize().map_err(|e| usage!("'{spec}': {e}"));
    }
    if let Some(pid) = pid {
        if let Some(p) = from_maps(spec, pid) {
            // Resolves /proc/PID/root to a path valid here (plain for the same mount namespace).
            return Ok(p.canonicalize().unwrap_or(p));
        }
    }
    let mut best: Option<((u8, usize), PathBuf)> = None;
    for dir in library_dirs() {
        let Ok(rd) = fs::read_dir(&dir) else {
            continue;
        };
        for e in rd.flatten() {
            let f = e.file_name();
            let Some(f) = f.to_str() else {
                continue;
            };
            let rank = if f == spec {
                Some((0, 0))
            } else {
                library_rank(f, spec)
            };
            if let Some(r) = rank {
                if best.as_ref().is_none_or(|(b, _)| r < *b) && is_native_elf(&e.path()) {
                    best = Some((r, e.path()));
                }
            }
        }
        if best.is_some() {
            break;
        }
    }
    if let Some((_, p)) = best {
        return p.canonicalize().map_err(|e| usage!("'{spec}': {e}"));
    }
    // A program name, as a shell would find it.
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
    if let Some(p) = std::env::split_paths(&path)
        .map(|d| d.join(spec))
        .find(|p| p.is_file())
    {
        return p.canonicalize().map_err(|e| usage!("'{spec}': {e}"));
    }
    Err(usage!(
        "cannot find a library or program named '{spec}'; give its path, e.g. ./{spec} or /usr/lib/.../lib{spec}.so"
    ))
}

/// A file mapped by the process whose name matches the spec (the program
/// itself included, through /proc/PID/exe).
fn from_maps(spec: &str, pid: u32) -> Option<PathBuf> {
    let maps = bpfscope_sys::procfs::maps(pid).unwrap_or_default();
    let exe = fs::read_link(format!("/proc/{pid}/exe")).ok();
    let paths = maps
        .into_iter()
        .filter(|m| m.is_file())
        .map(|m| PathBuf::from(m.path))
        .chain(exe);
    let mut best: Option<((u8, usize), PathBuf)> = None;
    for path in paths {
        if !path.is_absolute() {
            continue;
        }
        let Some(file) = path.file_name().and_then(|f| f.to_str()) else {
            continue;
        };
        let rank = if file == spec {
            Some((0, 0))
        } else {
            library_rank(file, spec)
        };
        if let Some(r) = rank {
            if best.as_ref().is_none_or(|(b, _)| r < *b) {
                // Through /proc/PID/root so the path works across mount namespaces.
                let inner = path.strip_prefix("/").unwrap_or(&path);
                best = Some((r, PathBuf::from(format!("/proc/{pid}/root")).join(inner)));
            }
        }
    }
    best.map(|(_, p)| p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks() {
        assert_eq!(library_rank("libc.so.6", "libc"), Some((0, 1)));
        assert_eq!(library_rank("libc.so.6", "c"), Some((0, 1)));
        assert_eq!(library_rank("libc.so", "libc"), Some((1, 0)));
        assert_eq!(library_rank("libcrypt.so.1", "libc"), None);
        assert!(library_rank("libz.so.1.2.13", "z") > library_rank("libz.so.1", "z"));
    }

    #[test]
    fn finds_libc() {
        let p = resolve("libc", None).unwrap();
        assert!(p.to_string_lossy().contains("libc.so.6"), "{}", p.display());
        assert!(resolve("no-such-lib-xyz", None).is_err());
    }
}
