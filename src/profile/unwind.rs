//! Unwind tables for the profiler's in-kernel unwinder (unwind.bpf.h): when
//! the kernel side sees a file for the first time it announces it; here the
//! file's `.eh_frame` is compiled (bpfscope-unwind), written into the
//! `unwind_entries` array through a mapping of its pages, and the file's entry in
//! `files` is switched from pending to its table. One table per build id,
//! shared by every process and every inode with that content.

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use libbpf_rs::{MapCore, MapFlags};

use bpfscope_bpf::profile::types::{bp_file, bp_file_key, bp_file_state, bp_note, bp_vdso};
use bpfscope_sys::mmap::Mapping;
use bpfscope_unwind::Entry;

use super::maps::Snapshots;
use super::python::Interpreters;

/// The kernel side's per-file maps: `files`, `unwind_entries` and the
/// interpreters some files hold (`interps`).
#[derive(Clone, Copy)]
pub struct FileMaps<'a, 'obj> {
    pub files: &'a libbpf_rs::Map<'obj>,
    pub entries: &'a libbpf_rs::Map<'obj>,
    pub interps: &'a libbpf_rs::Map<'obj>,
}

impl<'a, 'obj> FileMaps<'a, 'obj> {
    pub fn of(skel: &'a bpfscope_bpf::profile::ProfileSkel<'obj>) -> Self {
        FileMaps {
            files: &skel.maps.files,
            entries: &skel.maps.unwind_entries,
            interps: &skel.maps.interps,
        }
    }
}

/// How the kernel side's unwinds went (BP_UNW_* counters).
#[derive(Debug, Clone, Copy, Default)]
pub struct UnwindCounts {
    pub table_frames: u64,
    pub fp_frames: u64,
    pub end_outermost: u64,
    pub end_depth: u64,
    pub end_read: u64,
    pub end_no_rule: u64,
    pub end_fp: u64,
    pub proc_busy: u64,
    pub no_proc: u64,
    pub rebuilds: u64,
}

/// What loading tables cost and left out.
#[derive(Debug, Clone, Default)]
pub struct TableStats {
    /// Files with a table in the kernel, and their entries.
    pub files: u32,
    pub entries: u64,
    /// Files with no usable unwind information (frame pointers only).
    pub without_table: u32,
    /// Files whose table did not fit `unwind_entries` (--unwind-memory).
    pub no_room: u32,
    /// Announcements of files whose process was gone, mapped by no other
    /// process (left for the next process that maps them to announce).
    pub unreadable: u32,
    /// Time spent compiling tables.
    pub compile: Duration,
}

/// Space in `unwind_entries`, filled from the front; tables are never
/// freed during a run. Each table is written through a mapping of its own
/// pages, unmapped at once: a lasting mapping of the whole array would count
/// all of it in bpfscope's resident set.
pub struct TableMemory {
    entries: usize,
    next: usize,
    by_build_id: HashMap<Vec<u8>, (u32, u32, u64)>,
    pub stats: TableStats,
    /// The Python interpreters found in the files tables were loaded for.
    pub interps: Interpreters,
}

/// Bytes per entry of `unwind_entries` (a u64: offset, then the rule word).
const ENTRY: usize = 8;

impl TableMemory {
    pub fn new(map: &libbpf_rs::Map<'_>) -> TableMemory {
        TableMemory {
            entries: map.max_entries() as usize,
            next: 0,
            by_build_id: HashMap::new(),
            stats: TableStats::default(),
            interps: Interpreters::default(),
        }
    }

    /// Copies a table in; its first index, or None when it does not fit.
    fn place(&mut self, map: &libbpf_rs::Map<'_>, table: &[Entry]) -> Result<Option<u32>> {
        let start = self.next;
        if table.is_empty() || start + table.len() > self.entries {
            return Ok(None);
        }
        let mut window = Mapping::shared_window(map.as_fd(), start * ENTRY, table.len() * ENTRY)
            .context("mapping the unwind table array")?;
        for (e, out) in table.iter().zip(window.bytes_mut().chunks_exact_mut(ENTRY)) {
            out.copy_from_slice(&(u64::from(e.offset) | (u64::from(e.word) << 32)).to_ne_bytes());
        }
        drop(window);
        self.next += table.len();
        Ok(u32::try_from(start).ok())
    }

    /// Entries in use, in bytes.
    pub fn used_bytes(&self) -> u64 {
        (self.next * ENTRY) as u64
    }
}

/// A file the kernel side announced: find it through the process that
/// mapped it (or any other), then `register` it.
pub fn load_file(
    note: &bp_note,
    maps: FileMaps<'_, '_>,
    tables: &mut TableMemory,
    snapshots: &mut Snapshots,
) -> Result<()> {
    if note.file.dev == u64::from(bp_vdso::BP_VDSO_DEV.0)
        && note.file.ino == u64::from(bp_vdso::BP_VDSO_INO.0)
    {
        // The vDSO is no file: its table is bpfscope's own copy, loaded
        // at the start or not at all. Left pending, it is not announced
        // again (a search of every process for it would find nothing).
        return Ok(());
    }
    let key = snapshot_key(&note.file);
    let via = format!(
        "/proc/{}/map_files/{:x}-{:x}",
        note.tgid, note.start, note.end
    );
    let path = std::fs::read_link(&via)
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    let (via, path) = if path.is_empty() && snapshots.known(&key).is_none() {
        // The process is gone (short-lived ones often are by now): any
        // other process mapping the same file will do.
        match find_mapping(&key) {
            Some(found) => found,
            None => {
                // Forget it in the kernel: the next process that maps it
                // announces it again, perhaps while it still lives.
                tables.stats.unreadable += 1;
                let _ = maps.files.delete(pod_bytes(&note.file));
                return Ok(());
            }
        }
    } else {
        (via, path)
    };
    register(note, key, &via, &path, maps, tables, snapshots)
}

/// Snapshots' key of a file: its device as /proc/PID/maps prints it, and
/// its inode.
fn snapshot_key(file: &bp_file_key) -> (String, u64) {
    let dev = file.dev;
    (
        format!("{:02x}:{:02x}", dev >> 20, dev & 0xf_ffff),
        file.ino,
    )
}

/// Records which file the note's id names (read through `via`, shown as
/// `path`), compiles its table (or reuses the table of a file with the
/// same build id) and points its `files` entry at the table.
fn register(
    note: &bp_note,
    key: (String, u64),
    via: &str,
    path: &str,
    maps: FileMaps<'_, '_>,
    tables: &mut TableMemory,
    snapshots: &mut Snapshots,
) -> Result<()> {
    let index = snapshots.file_for(key, via, path);
    snapshots.set_file_id(note.file_id, index);
    let Some(file) = snapshots.files.get(index) else {
        return Ok(());
    };
    let build_id = file.build_id.clone().unwrap_or_default();
    // vaddr - file offset of the executable segment holding the mapping.
    let delta = file
        .segments
        .iter()
        .filter(|s| s.executable)
        .find(|s| note.pgoff >= s.file_offset && note.pgoff < s.file_offset + s.file_size.max(1))
        .or_else(|| file.segments.iter().find(|s| s.executable))
        .map(|s| s.vaddr.wrapping_sub(s.file_offset))
        .unwrap_or(0);
    // Through the descriptor kept open when there is one: the very file
    // mapped, even if since deleted.
    let open_path = Snapshots::open_path(file).unwrap_or_else(|| via.to_string());
    let interp =
        tables
            .interps
            .for_file(maps.interps, &build_id, Path::new(&open_path), path, delta)?;
    let placed = match tables.by_build_id.get(&build_id) {
        Some(&p) if !build_id.is_empty() => Some(p),
        _ => {
            let t0 = Instant::now();
            let compiled = bpfscope_unwind::compile(Path::new(&open_path))
                .or_else(|_| bpfscope_unwind::compile(Path::new(path)));
            tables.stats.compile += t0.elapsed();
            // A large library's compile frees tens of MB that glibc would
            // keep (the resident set stayed at the start-up peak).
            let large = compiled
                .as_ref()
                .is_ok_and(|t| t.entries().len() >= TRIM_AFTER_ENTRIES);
            let placed = match compiled {
                Ok(t) if !t.entries().is_empty() => {
                    match tables.place(maps.entries, t.entries())? {
                        Some(start) => {
                            let p = (start, t.entries().len() as u32, t.base());
                            tables.stats.files += 1;
                            tables.stats.entries += u64::from(p.1);
                            if !build_id.is_empty() {
                                tables.by_build_id.insert(build_id, p);
                            }
                            Some(p)
                        }
                        None => {
                            tables.stats.no_room += 1;
                            None
                        }
                    }
                }
                _ => {
                    tables.stats.without_table += 1;
                    None
                }
            };
            if large {
                super::continuous::give_back_memory();
            }
            placed
        }
    };
    match placed {
        Some((start, len, base)) => {
            let bias = delta.wrapping_sub(base) as i64;
            let v = bp_file {
                id: note.file_id,
                state: bp_file_state::BP_FILE_TABLE.0,
                table_start: start,
                table_len: len,
                bias,
                interp,
                pad: 0,
            };
            set_file(maps.files, note, &v)
        }
        None => {
            let v = bp_file {
                id: note.file_id,
                state: bp_file_state::BP_FILE_NO_TABLE.0,
                interp,
                ..Default::default()
            };
            set_file(maps.files, note, &v)
        }
    }
}

/// Tables of this many entries and more took tens of MB to compile.
const TRIM_AFTER_ENTRIES: usize = 100_000;

/// The vDSO's file id: the kernel side hands out ids from 2 (user space
/// sets its counter to 1 before sampling starts).
pub const VDSO_ID: u32 = 1;

/// Registers the vDSO (the kernel's code mapped into every process, with
/// no file behind it) under its reserved key: this process's copy is the
/// same image every process maps. Written to a file so the table compiler
/// and the symbolizer can read it, kept open and unlinked.
pub fn load_vdso(
    maps: FileMaps<'_, '_>,
    tables: &mut TableMemory,
    snapshots: &mut Snapshots,
) -> Result<()> {
    use std::io::{Read, Seek, SeekFrom};
    let own = bpfscope_sys::procfs::maps("self").context("reading /proc/self/maps")?;
    let Some(v) = own.iter().find(|m| m.path == "[vdso]") else {
        return Ok(());
    };
    let mut image = vec![0u8; (v.end - v.start) as usize];
    let mut mem = std::fs::File::open("/proc/self/mem").context("opening /proc/self/mem")?;
    mem.seek(SeekFrom::Start(v.start))
        .and_then(|_| mem.read_exact(&mut image))
        .context("reading the vDSO")?;
    let tmp = std::env::temp_dir().join(format!("bpfscope-vdso-{}.so", std::process::id()));
    std::fs::write(&tmp, &image).context("writing the vDSO's image")?;
    let note = bp_note {
        file_id: VDSO_ID,
        file: bp_file_key {
            dev: u64::from(bp_vdso::BP_VDSO_DEV.0),
            ino: u64::from(bp_vdso::BP_VDSO_INO.0),
        },
        ..Default::default()
    };
    let via = tmp.to_string_lossy().into_owned();
    let done = register(
        &note,
        super::maps::vdso_key(),
        &via,
        "[vdso]",
        maps,
        tables,
        snapshots,
    );
    let _ = std::fs::remove_file(&tmp);
    done
}

/// Loads the tables of the files bpfscope itself maps (the C library, the
/// dynamic loader, ...) under ids from `*next_id` on, before sampling
/// starts: most processes map the same files, so their first samples
/// unwind through them without waiting for an announcement.
pub fn preload_own(
    maps: FileMaps<'_, '_>,
    tables: &mut TableMemory,
    snapshots: &mut Snapshots,
    next_id: &mut u32,
) -> Result<()> {
    let own = bpfscope_sys::procfs::maps("self").context("reading /proc/self/maps")?;
    let exe = std::fs::read_link("/proc/self/exe").ok();
    let mut done = std::collections::HashSet::new();
    for m in own.iter().filter(|m| m.executable() && m.is_file()) {
        if exe.as_deref() == Some(Path::new(&m.path)) || !done.insert((m.dev.clone(), m.inode)) {
            continue;
        }
        let Some((major, minor)) = m.dev.split_once(':').and_then(|(a, b)| {
            Some((
                u64::from_str_radix(a, 16).ok()?,
                u64::from_str_radix(b, 16).ok()?,
            ))
        }) else {
            continue;
        };
        let note = bp_note {
            tgid: std::process::id(),
            file_id: *next_id,
            start: m.start,
            end: m.end,
            pgoff: m.offset,
            file: bp_file_key {
                dev: (major << 20) | minor,
                ino: m.inode,
            },
            ..Default::default()
        };
        load_file(&note, maps, tables, snapshots)?;
        *next_id += 1;
    }
    Ok(())
}

/// Loads the table of the program `-- CMD` runs (its interpreter, for a
/// script) under id `*next_id`, before the command starts: its first
/// samples then unwind through it, however long the table takes to build
/// (python3.11's: tens of ms).
pub fn preload_program(
    program: &Path,
    maps: FileMaps<'_, '_>,
    tables: &mut TableMemory,
    snapshots: &mut Snapshots,
    next_id: &mut u32,
) -> Result<()> {
    use std::io::Read;
    let mut head = [0u8; 256];
    let n = std::fs::File::open(program)
        .and_then(|mut f| f.read(&mut head))
        .with_context(|| format!("reading {}", program.display()))?;
    // A script runs its interpreter (`#!/usr/bin/python3.11 -u`).
    let exe = match head[..n].strip_prefix(b"#!") {
        Some(rest) => {
            let line = rest.split(|&b| b == b'\n').next().unwrap_or_default();
            let interp = String::from_utf8_lossy(line);
            match interp.split_whitespace().next() {
                Some(i) => std::path::PathBuf::from(i),
                None => return Ok(()),
            }
        }
        None => program.to_path_buf(),
    };
    preload_path(&exe, maps, tables, snapshots, next_id)?;
    // Its own libraries found through its run path (an interpreter built
    // shared keeps its runtime in libpython, under the run path), and any
    // libpython: their tables and interpreters are then ready for the
    // first sample too, where the announcement would be tens of ms late.
    for lib in own_libraries(&exe) {
        if let Err(e) = preload_path(&lib, maps, tables, snapshots, next_id) {
            eprintln!("bpfscope: {} loads on first use: {e:#}", lib.display());
        }
    }
    Ok(())
}

/// Registers a file no process maps yet, read by its path, under id `*next_id`.
fn preload_path(
    exe: &Path,
    maps: FileMaps<'_, '_>,
    tables: &mut TableMemory,
    snapshots: &mut Snapshots,
    next_id: &mut u32,
) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(exe).with_context(|| format!("reading {}", exe.display()))?;
    let dev = meta.dev();
    let note = bp_note {
        file_id: *next_id,
        file: bp_file_key {
            dev: (u64::from(libc::major(dev)) << 20) | u64::from(libc::minor(dev)),
            ino: meta.ino(),
        },
        ..Default::default()
    };
    let path = exe.to_string_lossy().into_owned();
    let key = snapshot_key(&note.file);
    register(&note, key, &path, &path, maps, tables, snapshots)?;
    *next_id += 1;
    Ok(())
}

/// The libraries an executable needs that its run path (RUNPATH or RPATH,
/// `$ORIGIN` expanded) holds, and libpython wherever the system keeps it.
/// Other system libraries are left to load on first use: the C library is
/// preloaded already, and big ones would only delay the start.
fn own_libraries(exe: &Path) -> Vec<std::path::PathBuf> {
    use object::read::elf::{Dyn, ElfFile64, FileHeader};
    let Ok(data) = std::fs::read(exe) else {
        return Vec::new();
    };
    let Ok(elf) = ElfFile64::<object::Endianness>::parse(&*data) else {
        return Vec::new();
    };
    let endian = elf.endian();
    let Ok(sections) = elf.elf_header().sections(endian, &*data) else {
        return Vec::new();
    };
    let Ok(Some((dynamic, link))) = sections.dynamic(endian, &*data) else {
        return Vec::new();
    };
    let Ok(strings) = sections.strings(endian, &*data, link) else {
        return Vec::new();
    };
    let text = |v: u64| {
        u32::try_from(v)
            .ok()
            .and_then(|o| strings.get(o).ok())
            .map(|b| String::from_utf8_lossy(b).into_owned())
    };
    let (mut needed, mut run_path) = (Vec::new(), Vec::new());
    for d in dynamic {
        let tag = d.d_tag(endian);
        let Some(v) = text(d.d_val(endian)) else {
            continue;
        };
        if tag == object::elf::DT_NEEDED {
            needed.push(v);
        } else if tag == object::elf::DT_RUNPATH || tag == object::elf::DT_RPATH {
            run_path.push(v);
        }
    }
    let origin = exe
        .canonicalize()
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .unwrap_or_default();
    let dirs: Vec<std::path::PathBuf> = run_path
        .iter()
        .flat_map(|p| p.split(':').map(str::to_string).collect::<Vec<_>>())
        .map(|d| std::path::PathBuf::from(d.replace("$ORIGIN", &origin.to_string_lossy())))
        .collect();
    let [lib, usr_lib] = bpfscope_sys::arch::LIB_DIRS;
    let system = [lib, usr_lib, "/usr/lib", "/lib"];
    needed
        .iter()
        .filter_map(|n| {
            let elsewhere = if n.starts_with("libpython") {
                &system[..]
            } else {
                &[]
            };
            dirs.iter()
                .map(|d| d.join(n))
                .chain(elsewhere.iter().map(|d| Path::new(d).join(n)))
                .find(|p| p.exists())
        })
        .collect()
}

/// A live process's map_files path and the path of a file by (device,
/// inode), from every process's maps.
fn find_mapping(key: &(String, u64)) -> Option<(String, String)> {
    bpfscope_sys::procfs::pids().into_iter().find_map(|pid| {
        let maps = bpfscope_sys::procfs::maps(pid).ok()?;
        let m = maps.iter().find(|m| m.inode == key.1 && m.dev == key.0)?;
        Some((
            format!("/proc/{pid}/map_files/{}", m.range_name()),
            m.path.clone(),
        ))
    })
}

fn set_file(files: &libbpf_rs::Map<'_>, note: &bp_note, v: &bp_file) -> Result<()> {
    let k = bp_file_key {
        dev: note.file.dev,
        ino: note.file.ino,
    };
    files
        .update(pod_bytes(&k), pod_bytes(v), MapFlags::ANY)
        .context("loading an unwind table")
}

fn pod_bytes<T: bpfscope_sys::pod::Pod>(v: &T) -> &[u8] {
    bpfscope_sys::pod::bytes(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shared CPython finds its libpython through its run path; a static
    /// one (Debian's) needs nothing preloaded.
    #[test]
    fn an_interpreters_own_libraries() {
        let root = std::env::var("PYENV_ROOT").unwrap_or_else(|_| "/root/.pyenv".into());
        let shared = std::fs::read_dir(format!("{root}/versions"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .find_map(|v| {
                let mm = v
                    .file_name()?
                    .to_string_lossy()
                    .rsplit_once('.')?
                    .0
                    .to_string();
                let lib = v.join(format!("lib/libpython{mm}.so.1.0"));
                lib.exists()
                    .then(|| (v.join(format!("bin/python{mm}")), lib))
            });
        match shared {
            Some((exe, lib)) => {
                let found = own_libraries(&exe);
                assert!(
                    found
                        .iter()
                        .any(|p| p.canonicalize().ok() == lib.canonicalize().ok()),
                    "{}: {found:?}",
                    exe.display()
                );
            }
            None => println!("SKIP: no shared CPython build in a pyenv tree"),
        }
        if Path::new("/usr/bin/python3.11").exists() {
            assert!(own_libraries(Path::new("/usr/bin/python3.11")).is_empty());
        }
    }
}
