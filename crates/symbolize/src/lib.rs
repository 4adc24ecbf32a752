//! Symbolize stage: build ids and file offsets (or kernel addresses) to
//! function, file and line, through blazesym. Binaries are found by build
//! id in debug directories, at the paths the profiled processes mapped them
//! from, and on debuginfod servers, so symbolization can happen after the
//! processes are gone and on another machine.

pub mod debuginfod;
pub mod elf;
pub mod jit;
pub mod kernel;
pub mod pylines;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use blazesym::symbolize::source::{Elf, Source};
use blazesym::symbolize::{Input, Sym, Symbolized, Symbolizer};

use bpfscope_recording::Segment;
use debuginfod::Debuginfod;

/// Where symbol files are looked for, besides the paths a recording names.
#[derive(Debug, Clone, Default)]
pub struct SymbolConfig {
    /// Searched first, as `.build-id/xx/rest.debug` (the system's own
    /// debug directories are always added after these).
    pub debug_dirs: Vec<PathBuf>,
    /// debuginfod server URLs; empty: none is asked.
    pub debuginfod: Vec<String>,
}

impl SymbolConfig {
    /// Without options: the system's debug directories and DEBUGINFOD_URLS.
    pub fn from_env() -> SymbolConfig {
        SymbolConfig {
            debug_dirs: Vec::new(),
            debuginfod: std::env::var("DEBUGINFOD_URLS")
                .map(|v| {
                    v.split_whitespace()
                        .filter(|u| u.starts_with("http://") || u.starts_with("https://"))
                        .map(String::from)
                        .collect()
                })
                .unwrap_or_default(),
        }
    }
}

/// One function at an address: the outer function first, then each
/// function inlined into the one before it. The file and line are where
/// the address is within that function (for the callers: the call site).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FuncLine {
    pub function: String,
    pub file: Option<String>,
    pub line: u32,
}

/// Where a symbol file for a build id came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    DebugDir,
    Mapped,
    Debuginfod,
    Given,
}

#[derive(Debug, Clone)]
pub struct Found {
    pub path: PathBuf,
    pub origin: Origin,
    pub info: elf::ElfSummary,
}

/// Finds symbol files and symbolizes file offsets in them.
pub struct Resolver {
    symbolizer: Symbolizer,
    debug_dirs: Vec<PathBuf>,
    debuginfod: Option<Debuginfod>,
    inlined: bool,
    /// Debug directories that could not be read, each said once.
    unreadable: Vec<(PathBuf, String)>,
}

/// Batches at least this large are split over the CPUs, each part with
/// its own symbolizer (sorted input: the parts touch different units).
const PARALLEL_MIN: usize = 4096;

fn symbolizer(debug_dirs: &[PathBuf], inlined: bool) -> Symbolizer {
    Symbolizer::builder()
        .enable_code_info(true)
        .enable_inlined_fns(inlined)
        .enable_demangling(true)
        .set_debug_dirs(Some(debug_dirs))
        .build()
}

/// What an address symbolizes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// Outer function first, then each function inlined into the one before.
    pub lines: Vec<FuncLine>,
    /// Offset of the address from the outer function's start; None when
    /// the start is not known (better no offset than a wrong one).
    pub offset: Option<u64>,
}

fn resolved(sym: &Sym<'_>) -> Resolved {
    Resolved {
        lines: lines(sym),
        // DWARF gives no single start for a function with several address
        // ranges (cold parts split off by gcc); blazesym then says 0.
        offset: (sym.addr != 0).then_some(sym.offset as u64),
    }
}

fn elf_batch(sym: &Symbolizer, path: &Path, vaddrs: &[u64]) -> Vec<Option<Resolved>> {
    let src = Source::Elf(Elf::new(path));
    let mut out: Vec<Option<Resolved>> = match sym.symbolize(&src, Input::VirtOffset(vaddrs)) {
        Ok(v) => v
            .into_iter()
            .map(|s| match s {
                // Version definitions (GLIBC_2.3.2) and other absolute
                // symbols at 0 name no code.
                Symbolized::Sym(sym) if sym.addr == 0 && sym.code_info.is_none() => None,
                Symbolized::Sym(sym) => Some(resolved(&sym)),
                Symbolized::Unknown(_) => None,
            })
            .collect(),
        Err(_) => vec![None; vaddrs.len()],
    };
    symtab_offsets(path, vaddrs, &mut out);
    if let Some(plt) = elf::PltStubs::read(path) {
        for (r, &a) in out.iter_mut().zip(vaddrs) {
            if let Some((name, offset)) = plt.name(a) {
                *r = Some(Resolved {
                    lines: vec![FuncLine {
                        function: name,
                        file: None,
                        line: 0,
                    }],
                    offset: Some(offset),
                });
            }
        }
    }
    out
}

/// Offsets the debug information could not give, from the ELF symbol
/// table instead (it has each function's entry point).
fn symtab_offsets(path: &Path, vaddrs: &[u64], out: &mut [Option<Resolved>]) {
    let need: Vec<usize> = out
        .iter()
        .enumerate()
        .filter(|(_, r)| r.as_ref().is_some_and(|r| r.offset.is_none()))
        .map(|(i, _)| i)
        .collect();
    if need.is_empty() {
        return;
    }
    let addrs: Vec<u64> = need.iter().map(|&i| vaddrs[i]).collect();
    let mut elf = Elf::new(path);
    elf.debug_syms = false;
    let plain = Symbolizer::builder().enable_code_info(false).build();
    let Ok(syms) = plain.symbolize(&Source::Elf(elf), Input::VirtOffset(&addrs)) else {
        return;
    };
    for (i, s) in need.into_iter().zip(syms) {
        if let (Symbolized::Sym(sym), Some(r)) = (s, out[i].as_mut()) {
            if sym.addr != 0 {
                r.offset = Some(sym.offset as u64);
            }
        }
    }
}

/// Where distributions put separate debug files.
const SYSTEM_DEBUG_DIRS: &[&str] = &["/usr/lib/debug", "/lib/debug"];

/// A file without a build id, named by a synthetic one: only the very
/// file it was made from (unchanged on disk) matches; debug directories
/// and debuginfod know nothing of it.
fn find_synthetic(build_id: &[u8], paths: &[String]) -> Option<Found> {
    paths.iter().find_map(|p| {
        let meta = std::fs::metadata(p).ok()?;
        if bpfscope_sys::buildid::synthetic(&meta) != build_id {
            return None;
        }
        let info = elf::inspect(Path::new(p)).ok()?;
        info.build_id.is_none().then(|| Found {
            path: PathBuf::from(p),
            origin: Origin::Mapped,
            info,
        })
    })
}

impl Resolver {
    /// With `inlined`, each address carries its chain of inlined functions
    /// (profiles show them as frames); without, only the outer function and
    /// the address's own file and line, which is cheaper.
    pub fn new(s: &SymbolConfig, inlined: bool) -> Resolver {
        let mut debug_dirs = s.debug_dirs.clone();
        debug_dirs.extend(SYSTEM_DEBUG_DIRS.iter().map(PathBuf::from));
        Resolver {
            symbolizer: symbolizer(&debug_dirs, inlined),
            debug_dirs,
            debuginfod: (!s.debuginfod.is_empty()).then(|| Debuginfod::new(s.debuginfod.clone())),
            inlined,
            unreadable: Vec::new(),
        }
    }

    /// A resolver of its own for one file's offsets, with the same debug
    /// directories and inlining (no debuginfod: `find` is this one's
    /// job): a live view keeps one per file and lets go of each on its
    /// own, where `release` would let go of every file at once.
    pub fn sibling(&self) -> Resolver {
        Resolver {
            symbolizer: symbolizer(&self.debug_dirs, self.inlined),
            debug_dirs: self.debug_dirs.clone(),
            debuginfod: None,
            inlined: self.inlined,
            unreadable: Vec::new(),
        }
    }

    /// Lets go of every file the symbolizer has opened and parsed (its
    /// mappings and indexes): a report symbolizes one file after another,
    /// so its peak memory is that of the largest file, not of all of them.
    pub fn release(&mut self) {
        self.symbolizer = symbolizer(&self.debug_dirs, self.inlined);
    }

    /// What the user should hear about even without -v: unreadable debug
    /// directories and misbehaving debuginfod servers, once each.
    pub fn notes(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .unreadable
            .iter()
            .map(|(d, e)| {
                format!(
                    "cannot read the debug directory {}: {e}; its debug files were not used",
                    d.display()
                )
            })
            .collect();
        if let Some(d) = &self.debuginfod {
            v.extend(d.problems.iter().cloned());
        }
        v
    }

    /// Remembers a debug directory whose files cannot be opened (missing
    /// files are normal and not noted).
    fn note_unreadable(&mut self, dir: &Path, path: &Path) {
        let err = match std::fs::File::open(path) {
            Ok(_) => return,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // A directory on the way that cannot be searched says NotFound
                // only when it is really missing; a mode 000 one says EACCES.
                match std::fs::read_dir(dir) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => e,
                    _ => return,
                }
            }
            Err(e) => e,
        };
        if !self.unreadable.iter().any(|(d, _)| d == dir) {
            let msg = match err.kind() {
                std::io::ErrorKind::PermissionDenied => "permission denied".to_string(),
                _ => err.to_string(),
            };
            self.unreadable.push((dir.to_path_buf(), msg));
        }
    }

    /// debuginfod failures, for -v.
    pub fn debuginfod_log(&self) -> &[String] {
        self.debuginfod.as_ref().map_or(&[], |d| &d.log[..])
    }

    /// The best symbol file for a build id: a debug file from a debug
    /// directory, else the mapped file if it has symbols, else one from
    /// debuginfod, else the mapped file with whatever dynamic symbols it has.
    pub fn find(&mut self, build_id: &[u8], paths: &[String]) -> Option<Found> {
        if bpfscope_sys::buildid::is_synthetic(build_id) {
            return find_synthetic(build_id, paths);
        }
        let hex = bpfscope_sys::buildid::hex(build_id);
        if hex.len() > 2 {
            for d in self.debug_dirs.clone() {
                let p = d
                    .join(".build-id")
                    .join(&hex[..2])
                    .join(format!("{}.debug", &hex[2..]));
                match elf::inspect(&p) {
                    Ok(info) => {
                        if info.build_id.as_deref().is_none_or(|b| b == build_id) {
                            return Some(Found {
                                path: p,
                                origin: Origin::DebugDir,
                                info,
                            });
                        }
                    }
                    Err(elf::ElfError::Io(..)) => self.note_unreadable(&d, &p),
                    Err(_) => {}
                }
            }
        }
        let mut stripped = None;
        for p in paths {
            let Ok(info) = elf::inspect(Path::new(p)) else {
                continue;
            };
            if info.build_id.as_deref() != Some(build_id) {
                continue;
            }
            let found = Found {
                path: PathBuf::from(p),
                origin: Origin::Mapped,
                info,
            };
            if found.info.has_symbols {
                return Some(found);
            }
            stripped.get_or_insert(found);
        }
        if let Some(d) = self.debuginfod.as_mut() {
            if let Some(p) = d.debuginfo(build_id) {
                if let Ok(info) = elf::inspect(&p) {
                    return Some(Found {
                        path: p,
                        origin: Origin::Debuginfod,
                        info,
                    });
                }
            }
        }
        stripped
    }

    /// Symbolizes file offsets of `path`; `segments` (or the file's own)
    /// turn them into the virtual addresses the symbols are keyed by.
    /// Per offset: the lines (outer function first) and the offset into
    /// the outer function.
    pub fn offsets(
        &self,
        path: &Path,
        segments: &[Segment],
        offsets: &[u64],
    ) -> Vec<Option<Resolved>> {
        let own;
        let segments = if segments.is_empty() {
            own = elf::inspect(path).map(|i| i.segments).unwrap_or_default();
            &own[..]
        } else {
            segments
        };
        // Unique addresses in ascending order: neighbouring lookups then
        // fall into the same compilation units and line tables (about a
        // fifth faster on random input), and duplicates are looked up once.
        let mut vaddrs: Vec<u64> = offsets
            .iter()
            .filter_map(|&o| elf::file_to_virt(segments, o))
            .collect();
        vaddrs.sort_unstable();
        vaddrs.dedup();
        // Asked only for large batches: it reads cgroup files each time.
        let parts = if vaddrs.len() >= PARALLEL_MIN {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            1
        };
        let results = if parts > 1 {
            let chunk = vaddrs.len().div_ceil(parts);
            let (dirs, inlined) = (&self.debug_dirs, self.inlined);
            std::thread::scope(|sc| {
                let handles: Vec<_> = vaddrs
                    .chunks(chunk)
                    .map(|part| sc.spawn(move || elf_batch(&symbolizer(dirs, inlined), path, part)))
                    .collect();
                handles
                    .into_iter()
                    .flat_map(|h| h.join().unwrap_or_default())
                    .collect::<Vec<_>>()
            })
        } else {
            elf_batch(&self.symbolizer, path, &vaddrs)
        };
        let mut found: HashMap<u64, Resolved> = vaddrs
            .iter()
            .zip(results)
            .filter_map(|(&v, r)| r.map(|r| (v, r)))
            .collect();
        // Stripped Go binaries keep their own table (.gopclntab): it names
        // what the symbol tables no longer do. Read only when needed.
        let missing: Vec<u64> = vaddrs
            .iter()
            .copied()
            .filter(|v| !found.contains_key(v))
            .collect();
        if !missing.is_empty() {
            if let Some(go) = go_table(path) {
                for v in missing {
                    if let Some(f) = go.lookup(v) {
                        found.insert(v, go_resolved(&f, v));
                    }
                }
            }
        }
        offsets
            .iter()
            .map(|&o| elf::file_to_virt(segments, o).and_then(|v| found.get(&v).cloned()))
            .collect()
    }

    /// Symbolizes absolute addresses in a live process.
    pub fn process(&self, pid: u32, addrs: &[u64]) -> Vec<Option<Resolved>> {
        let src = Source::Process(blazesym::symbolize::source::Process::new(pid.into()));
        match self.symbolizer.symbolize(&src, Input::AbsAddr(addrs)) {
            Ok(v) => v
                .into_iter()
                .map(|s| s.into_sym().map(|sym| resolved(&sym)))
                .collect(),
            Err(_) => vec![None; addrs.len()],
        }
    }
}

/// A file's Go table, if it has one. The file is mapped, not read: deciding
/// that a 200 MB library (LLVM's, a compiler's) has none then costs its
/// headers' pages, where reading it cost its size in memory.
fn go_table(path: &Path) -> Option<bpfscope_gopclntab::GoTable> {
    use std::os::fd::AsFd;
    let f = std::fs::File::open(path).ok()?;
    let len = usize::try_from(f.metadata().ok()?.len()).ok()?;
    let map = bpfscope_sys::mmap::Mapping::read_only(f.as_fd(), len).ok()?;
    bpfscope_gopclntab::GoTable::parse(map.bytes())
}

/// A Go frame as a resolved address: the physical function, then the
/// functions inlined into it, each at the position of the next one's call.
fn go_resolved(f: &bpfscope_gopclntab::GoFrame<'_>, vaddr: u64) -> Resolved {
    let at = |file: &Option<String>, line: Option<u32>| (file.clone(), line.unwrap_or(0));
    // Positions innermost first: the pc's own, then each inlined call site.
    let mut positions = vec![at(&f.file, f.line)];
    positions.extend(f.inlined.iter().map(|i| at(&i.call_file, i.call_line)));
    let names = std::iter::once(f.name.to_string())
        .chain(f.inlined.iter().rev().map(|i| i.name.to_string()));
    let lines = names
        .zip(positions.into_iter().rev())
        .map(|(function, (file, line))| FuncLine {
            function,
            file,
            line,
        })
        .collect();
    Resolved {
        lines,
        offset: vaddr.checked_sub(f.func_start),
    }
}

fn code_loc(ci: Option<&blazesym::symbolize::CodeInfo<'_>>) -> (Option<String>, u32) {
    match ci {
        Some(ci) => (
            Some(ci.to_path().display().to_string()),
            ci.line.unwrap_or(0),
        ),
        None => (None, 0),
    }
}

fn lines(sym: &Sym<'_>) -> Vec<FuncLine> {
    let (file, line) = code_loc(sym.code_info.as_deref());
    let mut v = vec![FuncLine {
        function: public_name(&sym.name),
        file,
        line,
    }];
    for f in sym.inlined.iter() {
        let (file, line) = code_loc(f.code_info.as_ref());
        v.push(FuncLine {
            function: public_name(&f.name),
            file,
            line,
        });
    }
    v
}

/// The name users know a function by. glibc calls its own functions
/// through hidden aliases (`__GI_getaddrinfo` for `getaddrinfo`, made by
/// its `hidden_def` macro), and the debug information names the alias;
/// the public name is the alias without the prefix.
pub fn public_name(name: &str) -> String {
    match name.strip_prefix("__GI_") {
        Some(public) if !public.is_empty() => public.to_string(),
        _ => name.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bpfscope_sys::procfs;

    /// A function of this test binary with a known name, kept out of line.
    #[inline(never)]
    #[no_mangle]
    pub extern "C" fn bpfscope_symbolize_test_marker() -> u64 {
        std::hint::black_box(42)
    }

    fn own_build_id() -> (PathBuf, Vec<u8>) {
        let exe = std::env::current_exe().unwrap();
        let id = elf::inspect(&exe)
            .unwrap()
            .build_id
            .expect("test binary has a build id");
        (exe, id)
    }

    /// The file offset of the marker in this process's executable.
    fn marker_offset() -> u64 {
        let addr = bpfscope_symbolize_test_marker as extern "C" fn() -> u64 as usize as u64;
        let m = procfs::maps("self")
            .unwrap()
            .into_iter()
            .find(|m| m.executable() && addr >= m.start && addr < m.end)
            .expect("the marker is mapped");
        m.file_offset(addr)
    }

    #[test]
    fn names_a_function_of_the_mapped_file_by_build_id_and_offset() {
        let (exe, id) = own_build_id();
        let mut r = Resolver::new(&SymbolConfig::default(), false);
        let found = r.find(&id, &[exe.display().to_string()]).unwrap();
        assert_eq!(found.origin, Origin::Mapped);
        let off = marker_offset();
        let res = r.offsets(&found.path, &[], &[off, off + 1]);
        let r = res[0].clone().expect("the marker is symbolized");
        assert_eq!(r.lines[0].function, "bpfscope_symbolize_test_marker");
        assert_eq!(r.offset, Some(0));
        assert_eq!(res[1].as_ref().and_then(|r| r.offset), Some(1));
    }

    #[test]
    fn a_debug_directory_is_searched_before_the_mapped_path() {
        let (exe, id) = own_build_id();
        let hex = bpfscope_sys::buildid::hex(&id);
        let dir = std::env::temp_dir().join(format!("bpfscope-symtest-{}", std::process::id()));
        let sub = dir.join(".build-id").join(&hex[..2]);
        std::fs::create_dir_all(&sub).unwrap();
        let debug = sub.join(format!("{}.debug", &hex[2..]));
        std::fs::copy(&exe, &debug).unwrap();
        let cfg = SymbolConfig {
            debug_dirs: vec![dir.clone()],
            debuginfod: Vec::new(),
        };
        let mut r = Resolver::new(&cfg, false);
        let found = r.find(&id, &[exe.display().to_string()]);
        std::fs::remove_dir_all(&dir).unwrap();
        let found = found.unwrap();
        assert_eq!((found.origin, found.path), (Origin::DebugDir, debug));
    }

    #[test]
    fn glibc_hidden_aliases_get_their_public_names() {
        assert_eq!(public_name("__GI_getaddrinfo"), "getaddrinfo");
        assert_eq!(
            public_name("__GI__IO_wfile_underflow"),
            "_IO_wfile_underflow"
        );
        assert_eq!(public_name("__GI___libc_write"), "__libc_write");
        assert_eq!(public_name("__GI_"), "__GI_");
        assert_eq!(public_name("main"), "main");
    }

    /// A function whose debug information has no single start (gcc split
    /// a cold part off) still gets its offset, from the symbol table.
    #[test]
    fn offsets_in_split_functions_come_from_the_symbol_table() {
        let libc = Path::new("/lib/x86_64-linux-gnu/libc.so.6");
        let Ok(info) = elf::inspect(libc) else {
            eprintln!("SKIP: no {}", libc.display());
            return;
        };
        let r = Resolver::new(&SymbolConfig::default(), true);
        // An offset, when there is one, fits in its function: never the
        // whole address. (Cold parts split off into .text.unlikely have no
        // symbol of their own in the stripped library: no offset.)
        let offs: Vec<u64> = (0x20000..0x180000).step_by(0x1001).collect();
        let res = r.offsets(libc, &info.segments, &offs);
        // _IO_wfile_underflow starts at 0x7b4f0 (dynamic symbol table); its
        // DWARF entry has several ranges and no single start.
        let split = r.offsets(libc, &info.segments, &[0x7b65f]);
        if let Some(Some(s)) = split.first() {
            if s.lines[0].function == "_IO_wfile_underflow" {
                assert_eq!(s.offset, Some(0x16f), "{s:?}");
            }
        }
        let named = res.iter().flatten().count();
        assert!(named > offs.len() / 2, "{named} of {}", offs.len());
        for (o, r) in offs.iter().zip(&res) {
            if let Some(r) = r {
                assert!(r.offset.is_none_or(|x| x < 0x10000), "{o:#x}: {r:?}");
                assert!(!r.lines[0].function.starts_with("__GI_"), "{o:#x}: {r:?}");
            }
        }
    }

    #[test]
    fn an_unknown_build_id_is_found_nowhere() {
        let mut r = Resolver::new(&SymbolConfig::default(), false);
        let (exe, _) = own_build_id();
        // The path exists but has another build id: it must not be used.
        assert!(r.find(&[0xde; 20], &[exe.display().to_string()]).is_none());
        assert!(r.notes().is_empty());
    }
}
