//! Symbolize stage: build ids and file offsets (or kernel addresses) to
//! function, file and line, through blazesym. Binaries are found by build
//! id in debug directories, at the paths the profiled processes mapped them
//! from, and on debuginfod servers, so symbolization can happen after the
//! processes are gone and on another machine.

pub mod debuginfod;
pub mod elf;
pub mod kernel;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use blazesym::symbolize::source::{Elf, Source};
use blazesym::symbolize::{Input, Sym, Symbolized, Symbolizer};

use crate::cli::profile::SymbolSettings;
use crate::profile::format::{Recording, Segment};
use debuginfod::Debuginfod;

/// One function at an address: the outer function first, then each
/// function inlined into the one before it. The file and line are where
/// the address is within that function (for the callers: the call site).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Line {
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
    pub info: elf::ElfInfo,
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

fn elf_batch(sym: &Symbolizer, path: &Path, vaddrs: &[u64]) -> Vec<Option<(Vec<Line>, u64)>> {
    let src = Source::Elf(Elf::new(path));
    match sym.symbolize(&src, Input::VirtOffset(vaddrs)) {
        Ok(v) => v
            .into_iter()
            .map(|s| match s {
                Symbolized::Sym(sym) => Some((lines(&sym), sym.offset as u64)),
                Symbolized::Unknown(_) => None,
            })
            .collect(),
        Err(_) => vec![None; vaddrs.len()],
    }
}

/// Where distributions put separate debug files.
const SYSTEM_DEBUG_DIRS: &[&str] = &["/usr/lib/debug", "/lib/debug"];

impl Resolver {
    /// With `inlined`, each address carries its chain of inlined functions
    /// (profiles show them as frames); without, only the outer function and
    /// the address's own file and line, which is cheaper.
    pub fn new(s: &SymbolSettings, inlined: bool) -> Resolver {
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
    ) -> Vec<Option<(Vec<Line>, u64)>> {
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
        let parts = std::thread::available_parallelism().map_or(1, |n| n.get());
        let results = if vaddrs.len() >= PARALLEL_MIN && parts > 1 {
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
        let found: HashMap<u64, (Vec<Line>, u64)> = vaddrs
            .iter()
            .zip(results)
            .filter_map(|(&v, r)| r.map(|r| (v, r)))
            .collect();
        offsets
            .iter()
            .map(|&o| elf::file_to_virt(segments, o).and_then(|v| found.get(&v).cloned()))
            .collect()
    }

    /// Symbolizes absolute addresses in a live process.
    pub fn process(&self, pid: u32, addrs: &[u64]) -> Vec<Option<(Vec<Line>, u64)>> {
        let src = Source::Process(blazesym::symbolize::source::Process::new(pid.into()));
        match self.symbolizer.symbolize(&src, Input::AbsAddr(addrs)) {
            Ok(v) => v
                .into_iter()
                .map(|s| s.into_sym().map(|sym| (lines(&sym), sym.offset as u64)))
                .collect(),
            Err(_) => vec![None; addrs.len()],
        }
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

fn lines(sym: &Sym<'_>) -> Vec<Line> {
    let (file, line) = code_loc(sym.code_info.as_deref());
    let mut v = vec![Line {
        function: sym.name.to_string(),
        file,
        line,
    }];
    for f in sym.inlined.iter() {
        let (file, line) = code_loc(f.code_info.as_ref());
        v.push(Line {
            function: f.name.to_string(),
            file,
            line,
        });
    }
    v
}

/// A symbolized profile: what every output format is rendered from.
#[derive(Debug, Clone, Default)]
pub struct Profile {
    /// "cpu" or "offcpu".
    pub mode: String,
    pub frequency_hz: u64,
    pub start_unix_ns: u64,
    pub duration_ns: u64,
    pub mappings: Vec<Mapping>,
    pub locations: Vec<Location>,
    pub samples: Vec<Sample>,
    /// Things the reader should know (losses, binaries without symbols).
    pub notes: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct Mapping {
    /// File path, or [kernel.kallsyms], or [unknown].
    pub name: String,
    pub build_id: String,
    pub kernel: bool,
}

#[derive(Debug, Clone)]
pub struct Location {
    pub mapping: usize,
    /// File offset (user), absolute address (kernel) or raw address (unknown).
    pub address: u64,
    /// Outer function first; empty when no symbol was found.
    pub lines: Vec<Line>,
}

impl Location {
    /// A frame name for when no symbol was found.
    pub fn fallback_name(&self, mappings: &[Mapping]) -> String {
        match mappings.get(self.mapping) {
            Some(m) if !m.kernel && m.name != "[unknown]" => {
                let base = Path::new(&m.name)
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_else(|| m.name.clone());
                format!("[{base}]")
            }
            _ => "[unknown]".into(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Sample {
    pub pid: u32,
    pub comm: String,
    pub count: u64,
    pub value: u64,
    /// Indexes into `Profile::locations`, leaf first.
    pub locations: Vec<usize>,
    pub kernel_frames: usize,
}

/// Per-build-id outcome, for -v.
#[derive(Debug, Clone)]
pub struct BinaryReport {
    pub build_id: String,
    pub found: Option<(PathBuf, Origin)>,
    pub frames: usize,
    pub symbolized: usize,
}

/// Every frame but the first of a kernel or user stack is a return
/// address: the instruction after the call. One byte back is inside the
/// call itself, which is the line and inline context the caller was in
/// (the next instruction may belong to other inlined code or, after a call
/// that does not return, to the next function).
fn call_site(i: usize, addr: u64) -> u64 {
    if i > 0 {
        addr.saturating_sub(1)
    } else {
        addr
    }
}

/// Symbolizes a recording.
pub fn recording(rec: &Recording, resolver: &mut Resolver) -> (Profile, Vec<BinaryReport>) {
    let mut p = Profile {
        mode: rec.meta.mode.clone(),
        frequency_hz: rec.meta.frequency_hz,
        start_unix_ns: rec.meta.start_unix_ns,
        duration_ns: rec.meta.duration_ns,
        ..Default::default()
    };
    p.mappings.push(Mapping {
        name: "[kernel.kallsyms]".into(),
        build_id: bpfscope_sys::buildid::hex(&rec.meta.kernel_build_id),
        kernel: true,
    });
    for b in &rec.binaries {
        p.mappings.push(Mapping {
            name: b
                .paths
                .first()
                .cloned()
                .unwrap_or_else(|| format!("[build id {}]", bpfscope_sys::buildid::hex(&b.build_id))),
            build_id: bpfscope_sys::buildid::hex(&b.build_id),
            kernel: false,
        });
    }
    let unknown = p.mappings.len();
    p.mappings.push(Mapping {
        name: "[unknown]".into(),
        build_id: String::new(),
        kernel: false,
    });

    // Unique offsets per binary, symbolized in one batch each.
    let mut per_bin: Vec<Vec<u64>> = vec![Vec::new(); rec.binaries.len()];
    for s in &rec.stacks {
        for (i, (&b, &o)) in s.user_binary.iter().zip(&s.user_offset).enumerate() {
            if b > 0 {
                per_bin[b as usize - 1].push(call_site(i, o));
            }
        }
    }
    let mut loc_index: HashMap<(usize, u64), usize> = HashMap::new();
    let mut reports = Vec::new();
    for (i, offs) in per_bin.iter_mut().enumerate() {
        offs.sort_unstable();
        offs.dedup();
        let b = &rec.binaries[i];
        let found = resolver.find(&b.build_id, &b.paths);
        let results = match &found {
            Some(f) => resolver.offsets(&f.path, &b.segments, offs),
            None => vec![None; offs.len()],
        };
        let symbolized = results.iter().filter(|r| r.is_some()).count();
        reports.push(BinaryReport {
            build_id: bpfscope_sys::buildid::hex(&b.build_id),
            found: found.as_ref().map(|f| (f.path.clone(), f.origin)),
            frames: offs.len(),
            symbolized,
        });
        if found.is_none() {
            p.notes.push(format!(
                "no symbols for {} (build id {}): add --debug-dir or --debuginfod",
                b.paths.first().map_or("a binary", String::as_str),
                bpfscope_sys::buildid::hex(&b.build_id)
            ));
        }
        for (&o, r) in offs.iter().zip(results) {
            loc_index.insert((i + 1, o), p.locations.len());
            p.locations.push(Location {
                mapping: i + 1,
                address: o,
                lines: r.map(|(l, _)| l).unwrap_or_default(),
            });
        }
    }
    let ktable = kernel::KernelTable::new(&rec.kernel_symbols);
    for s in &rec.stacks {
        let mut locs = Vec::with_capacity(s.kernel.len() + s.user_binary.len());
        for (i, &a) in s.kernel.iter().enumerate() {
            let a = call_site(i, a);
            let id = *loc_index.entry((0, a)).or_insert_with(|| {
                // BPF JIT code first: kallsyms may no longer (or never) have the program.
                let bpf = crate::bpfmeta::lookup(&rec.bpf_programs, a).map(|f| {
                    vec![Line {
                        function: f.symbol.to_string(),
                        file: f.line.map(|l| l.file.clone()),
                        line: f.line.map_or(0, |l| l.line),
                    }]
                });
                let lines = bpf
                    .or_else(|| {
                        ktable.lookup(a).map(|k| {
                            vec![Line {
                                function: if k.module.is_empty() {
                                    k.name.clone()
                                } else {
                                    format!("{} [{}]", k.name, k.module)
                                },
                                file: None,
                                line: 0,
                            }]
                        })
                    })
                    .unwrap_or_default();
                p.locations.push(Location {
                    mapping: 0,
                    address: a,
                    lines,
                });
                p.locations.len() - 1
            });
            locs.push(id);
        }
        for (i, (&b, &o)) in s.user_binary.iter().zip(&s.user_offset).enumerate() {
            let m = if b == 0 { unknown } else { b as usize };
            let o = if b == 0 { o } else { call_site(i, o) };
            let id = *loc_index.entry((m, o)).or_insert_with(|| {
                p.locations.push(Location {
                    mapping: m,
                    address: o,
                    lines: Vec::new(),
                });
                p.locations.len() - 1
            });
            locs.push(id);
        }
        p.samples.push(Sample {
            pid: s.pid,
            comm: s.comm.clone(),
            count: s.count,
            value: s.value,
            locations: locs,
            kernel_frames: s.kernel.len(),
        });
    }
    if let Some(l) = rec.meta.lost {
        let unit = if p.mode == "offcpu" { "ns" } else { "samples" };
        let kernel_why = stack_loss("kernel", l.kernel_stack_map_full);
        let user_why = stack_loss("user", l.user_stack_map_full);
        let items = [
            (l.kernel_stacks, kernel_why.as_str()),
            (l.user_stacks, user_why.as_str()),
            (
                l.keys,
                "samples found the stack count map full (raise --max-stacks)",
            ),
            (l.notifications, "new-process notifications were dropped"),
            (
                l.bpf_events,
                "BPF program load/unload records were dropped (such programs may show unnamed)",
            ),
            (
                l.offcpu_starts,
                "off-CPU switch-outs could not be remembered",
            ),
            (
                l.unresolved_frames,
                "user frames had no build id and no known mapping (shown as [unknown])",
            ),
        ];
        for (n, what) in items {
            if n > 0 {
                p.notes.push(format!("lost: {n} {what}"));
            }
        }
        if l.unresolved_weight > 0 {
            p.notes.push(format!(
                "{} {unit} carry [unknown] user frames",
                l.unresolved_weight
            ));
        }
    }
    (p, reports)
}

/// Why stacks of one kind (kernel or user) could not be stored. The
/// kernel's stack map refuses a stack when it is full, or when another
/// stack already holds the slot its hash selects; only the first is cured
/// by a larger map.
pub fn stack_loss(which: &str, map_full: bool) -> String {
    if map_full {
        format!("{which} stacks could not be stored: the stack map was full (raise --max-stacks)")
    } else {
        format!(
            "{which} stacks could not be stored: the stack map was not full, but another stack held their hash slot (a hash collision)"
        )
    }
}
