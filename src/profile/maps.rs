//! Snapshots of profiled processes' executable mappings, taken while they
//! live, and the files behind them (by device + inode, and by the id the
//! profiler's kernel side gave them). They give the paths and build ids
//! (synthetic for files without one) that frames are recorded with, and
//! explain user frames left as raw addresses (memory the kernel side had
//! no mapping for when it sampled).

use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;

use bpfscope_sys::procfs::{self, MapsEntry};

use bpfscope_recording::Segment;
use bpfscope_symbolize::elf;
use bpfscope_symbolize::jit::{self, JitSym, JitSymbols};

#[derive(Debug, Clone)]
struct Mapping {
    start: u64,
    end: u64,
    offset: u64,
    /// Index into `Snapshots::files`.
    file: usize,
}

#[derive(Debug)]
pub struct MappedFile {
    pub path: String,
    pub build_id: Option<Vec<u8>>,
    /// Its PT_LOAD segments, read while it was mapped.
    pub segments: Vec<Segment>,
    /// The file itself, opened through map_files while it was mapped, so
    /// that bpfscope can still symbolize it in-process after the process
    /// exited and the file was deleted or replaced (e.g. a rebuild).
    pub open: Option<File>,
    /// A copy of `open` in memory, made when the descriptor could not be
    /// opened again by its /proc/self/fd path (see `open_path`).
    copy: std::sync::OnceLock<Option<File>>,
}

/// Open files kept for in-process symbolization; past this, paths only.
const MAX_OPEN: usize = 256;

/// The (device, inode) key the vDSO's image is known by.
pub fn vdso_key() -> (String, u64) {
    ("vdso".into(), 1)
}

/// The whole of an open file, copied into an anonymous memory file.
fn copy_to_memory(f: &File) -> Option<File> {
    use std::io::Write;
    use std::os::fd::FromRawFd;
    use std::os::unix::fs::FileExt;
    // SAFETY: the name is a NUL-terminated literal; flags are valid.
    let fd = unsafe { libc::memfd_create(c"bpfscope-mapped".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    // SAFETY: memfd_create returned a new descriptor that nothing else owns.
    let mut copy = unsafe { File::from_raw_fd(fd) };
    // From the start, whatever the descriptor's offset is.
    let (mut buf, mut at) = (vec![0u8; 1 << 20], 0u64);
    loop {
        let n = f.read_at(&mut buf, at).ok()?;
        if n == 0 {
            return Some(copy);
        }
        copy.write_all(&buf[..n]).ok()?;
        at += n as u64;
    }
}

/// Every process's executable mappings and the files behind them.
#[derive(Debug, Default)]
pub struct Snapshots {
    procs: HashMap<u32, Vec<Mapping>>,
    pub files: Vec<MappedFile>,
    /// (device, inode) -> index into files.
    by_inode: HashMap<(String, u64), usize>,
    /// The kernel side's file ids -> index into files.
    by_id: HashMap<u32, usize>,
    open_files: usize,
    /// Names of JIT code by process, from its perf map and jitdump files
    /// (read with its mappings: the process may be gone by the end).
    jit: HashMap<u32, JitSymbols>,
    /// `--lang` includes jit.
    pub jit_enabled: bool,
}

impl Snapshots {
    /// Snapshots that read JIT symbol files too, or not (`--lang`).
    pub fn with_jit(jit_enabled: bool) -> Snapshots {
        Snapshots {
            jit_enabled,
            ..Default::default()
        }
    }

    /// Forgets a process (gone, and no longer referred to by any kept sample).
    pub fn forget(&mut self, pid: u32) {
        self.procs.remove(&pid);
        self.jit.remove(&pid);
    }

    /// The processes whose mappings are kept.
    pub fn pids(&self) -> Vec<u32> {
        self.procs.keys().copied().collect()
    }

    pub fn has(&self, pid: u32) -> bool {
        self.procs.contains_key(&pid)
    }

    /// Reads /proc/PID/maps (and the build ids of newly seen files through
    /// /proc/PID/map_files, which works for deleted files and other mount
    /// namespaces too). False when the process is gone.
    pub fn snapshot(&mut self, pid: u32) -> bool {
        let entries = procfs::maps(pid);
        if self.jit_enabled {
            // The files only grow while the runtime lives, and outlive it
            // (runtimes leave /tmp/perf-PID.map behind): the newest read
            // holds everything the earlier ones did.
            let mapped = entries.iter().flatten().map(|m| m.path.as_str());
            if let Ok(Some(t)) = jit::load_files(jit::find_files_among(pid, mapped)) {
                self.jit.insert(pid, t);
            }
        }
        let Ok(entries) = entries else {
            return false;
        };
        let maps: Vec<Mapping> = entries
            .iter()
            .filter_map(|m| self.mapping(pid, m))
            .collect();
        // Later snapshots (after dlopen or exec) add to what was known.
        let entry = self.procs.entry(pid).or_default();
        for m in maps {
            if !entry
                .iter()
                .any(|e| e.start == m.start && e.end == m.end && e.file == m.file)
            {
                entry.push(m);
            }
        }
        true
    }

    fn mapping(&mut self, pid: u32, m: &MapsEntry) -> Option<Mapping> {
        // Most mappings are not executable: skip them before any allocation.
        if !m.executable() {
            return None;
        }
        // The vDSO is one image in every process: bpfscope's own, read at
        // the start (unwind::load_vdso), its offsets those of the mapping.
        if m.path == "[vdso]" {
            return Some(Mapping {
                start: m.start,
                end: m.end,
                offset: 0,
                file: self.known(&vdso_key())?,
            });
        }
        if !m.is_file() {
            return None;
        }
        let via = format!("/proc/{pid}/map_files/{}", m.range_name());
        let file = self.file_for((m.dev.clone(), m.inode), &via, &m.path);
        Some(Mapping {
            start: m.start,
            end: m.end,
            offset: m.offset,
            file,
        })
    }

    /// The index of the file with this (device, inode), inspected through
    /// `via` (a map_files path) or `path` the first time it is seen.
    pub fn file_for(&mut self, key: (String, u64), via: &str, path: &str) -> usize {
        if let Some(&i) = self.by_inode.get(&key) {
            return i;
        }
        let info = elf::inspect(Path::new(via))
            .or_else(|_| elf::inspect(Path::new(path)))
            .ok();
        let (build_id, segments) = info.map(|i| (i.build_id, i.segments)).unwrap_or_default();
        // A file without a build id gets a synthetic one (its identity on
        // disk), so its frames are recorded and symbolized like the rest.
        let build_id = build_id.or_else(|| {
            std::fs::metadata(via)
                .or_else(|_| std::fs::metadata(path))
                .ok()
                .map(|m| bpfscope_sys::buildid::synthetic(&m))
        });
        let open = if build_id.is_some() && self.open_files < MAX_OPEN {
            File::open(via).ok()
        } else {
            None
        };
        self.open_files += usize::from(open.is_some());
        self.files.push(MappedFile {
            path: path.to_string(),
            build_id,
            segments,
            open,
            copy: Default::default(),
        });
        self.by_inode.insert(key, self.files.len() - 1);
        self.files.len() - 1
    }

    /// The file index of a (device, inode) already seen.
    pub fn known(&self, key: &(String, u64)) -> Option<usize> {
        self.by_inode.get(key).copied()
    }

    /// Remembers which file the profiler's kernel side calls `id`.
    pub fn set_file_id(&mut self, id: u32, file: usize) {
        self.by_id.insert(id, file);
    }

    /// The file the kernel side calls `id`.
    pub fn file_by_id(&self, id: u32) -> Option<&MappedFile> {
        self.files.get(*self.by_id.get(&id)?)
    }

    /// The JIT code a raw user address of `pid` is in, as its runtime named it.
    pub fn jit_symbol(&self, pid: u32, ip: u64) -> Option<JitSym<'_>> {
        self.jit.get(&pid)?.lookup(ip)
    }

    /// Whether a process had a perf map or jitdump file.
    pub fn has_jit(&self, pid: u32) -> bool {
        self.jit.contains_key(&pid)
    }

    /// The file and file offset behind a raw user address of `pid`.
    pub fn resolve(&self, pid: u32, ip: u64) -> Option<(&MappedFile, u64)> {
        let m = self
            .procs
            .get(&pid)?
            .iter()
            .find(|m| ip >= m.start && ip < m.end)?;
        Some((self.files.get(m.file)?, ip - m.start + m.offset))
    }

    /// Paths each build id was mapped from.
    pub fn paths_by_build_id(&self) -> HashMap<Vec<u8>, BTreeSet<String>> {
        let mut out: HashMap<Vec<u8>, BTreeSet<String>> = HashMap::new();
        for f in &self.files {
            if let Some(id) = &f.build_id {
                out.entry(id.clone()).or_default().insert(f.path.clone());
            }
        }
        out
    }

    /// The file with this build id, as mapped.
    pub fn file(&self, build_id: &[u8]) -> Option<&MappedFile> {
        self.files
            .iter()
            .find(|f| f.build_id.as_deref() == Some(build_id))
    }

    /// A path to the file opened while it was mapped, valid in this process only.
    /// Some file systems (9p) cannot open a deleted file again by its
    /// /proc/self/fd path, though its open descriptor still reads it: the
    /// file is then copied through that descriptor into memory, once.
    pub fn open_path(f: &MappedFile) -> Option<String> {
        let o = f.open.as_ref()?;
        let path = format!("/proc/self/fd/{}", o.as_raw_fd());
        if File::open(&path).is_ok() {
            return Some(path);
        }
        let copy = f.copy.get_or_init(|| copy_to_memory(o)).as_ref()?;
        Some(format!("/proc/self/fd/{}", copy.as_raw_fd()))
    }
}
