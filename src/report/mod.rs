//! Report stage: a recording (samples as build id + file offset, kernel
//! addresses, BPF program info) becomes a symbolized `Profile`, the one
//! model every output format is rendered from. The only place that knows
//! both the recording format and the symbolizer.

pub mod annotate;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use bpfscope_bpf::stack::call_site;
use bpfscope_recording::{bpfprog, LostCounts, Recording, BPF_RUN_TIME};
use bpfscope_symbolize::{kernel, FuncLine, Origin, Resolver};

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
    /// Folded stacks and flame graphs get a frame per thread name under
    /// each process.
    pub by_thread: bool,
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
    pub lines: Vec<FuncLine>,
}

impl Location {
    /// A frame name for when no symbol was found: the file and the offset
    /// in it (`libfoo.so+0x1234`), which `symbolize --build-id` or
    /// addr2line can take up later; `[unknown]` when there is no file.
    pub fn fallback_name(&self, mappings: &[Mapping]) -> String {
        match mappings.get(self.mapping) {
            Some(m) if !m.kernel && m.name != "[unknown]" => {
                let base = Path::new(&m.name)
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_else(|| m.name.clone());
                format!("{base}+{:#x}", self.address)
            }
            _ => "[unknown]".into(),
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct Sample {
    pub pid: u32,
    pub comm: String,
    /// The thread's name and cgroup id, where the recording has them.
    pub thread: String,
    pub cgroup_id: u64,
    /// Further labels (name, value) that pprof output carries, such as
    /// the agent's cgroup path and container id.
    pub labels: Vec<(String, String)>,
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

/// Names already found, kept across the profiles of one live run (`top`
/// symbolizes each refresh's stacks; most of their frames were named
/// before), per file; or, for one report, each file's state let go as
/// soon as its offsets are named.
#[derive(Default)]
pub struct NameCache {
    files: HashMap<Vec<u8>, FileNames>,
    /// One report, not a live run: each file's symbolizer state and unwind
    /// table are let go once its offsets are named (memory bounded by
    /// the largest file).
    streaming: bool,
    /// Profiles symbolized so far: the clock of `FileNames::last`.
    refresh: u64,
}

/// What a live run keeps of one file (by build id).
struct FileNames {
    /// Its symbol file (None: none found).
    found: Option<(PathBuf, Origin)>,
    /// Call site -> the functions there, outer first, and the refresh it
    /// was last sampled in.
    names: HashMap<u64, (Vec<FuncLine>, u64)>,
    /// The file's own symbolizer state, while the budget allows.
    held: Option<Held>,
    /// Its unwind table's function bounds (for code no symbol names),
    /// once needed: 16 bytes a function, where reading them again costs
    /// the file's .eh_frame (8 MB for a compiler's library).
    table: Option<Option<(bpfscope_unwind::Functions, PathBuf)>>,
    /// What holding it costs, roughly: `elf::symbol_bytes` of the symbol file.
    weight: u64,
    last: u64,
}

struct Held {
    /// None in one report: it names with the caller's resolver.
    resolver: Option<Resolver>,
    last: u64,
}

/// A live run's names of a file not sampled for this many refreshes go,
/// and so does the file when none of its code was.
const NAMES_KEEP: u64 = 10;
/// A file's symbolizer state is kept this many refreshes without samples
/// in it, and all files' together within this many bytes of their symbol
/// tables (least recently sampled let go first): a compiler's library
/// has 24 MB of names, and a whole system maps several.
const HELD_KEEP: u64 = 10;
const HELD_BUDGET: u64 = 32 << 20;

impl NameCache {
    /// After a live run's profile: lets go of the names, files and
    /// symbolizer states not sampled lately.
    fn age(&mut self) {
        let now = self.refresh;
        self.files.retain(|_, f| {
            f.names.retain(|_, (_, last)| *last + NAMES_KEEP > now);
            if f.held.as_ref().is_some_and(|h| h.last + HELD_KEEP <= now) {
                f.held = None;
            }
            f.last + NAMES_KEEP > now
        });
    }

    /// Before holding `need` more bytes: lets go of the least recently
    /// used symbolizer states until all fit the budget.
    fn make_room(&mut self, need: u64) {
        let mut held: Vec<(u64, u64, &mut FileNames)> = self
            .files
            .values_mut()
            .filter_map(|f| Some((f.held.as_ref()?.last, f.weight, f)))
            .collect();
        let mut total: u64 = need + held.iter().map(|(_, w, _)| w).sum::<u64>();
        // Least recently sampled first, the largest first among equals.
        held.sort_by_key(|(last, w, _)| (*last, std::cmp::Reverse(*w)));
        for (_, w, f) in held {
            if total <= HELD_BUDGET {
                break;
            }
            f.held = None;
            total -= w;
        }
    }
}

/// Symbolizes a recording into a profile.
pub fn recording(rec: &Recording, resolver: &mut Resolver) -> (Profile, Vec<BinaryReport>) {
    let mut cache = NameCache {
        streaming: true,
        ..Default::default()
    };
    recording_cached(rec, resolver, &mut cache)
}

/// `recording`, looking names up in `cache` first and keeping new ones there.
pub fn recording_cached(
    rec: &Recording,
    resolver: &mut Resolver,
    cache: &mut NameCache,
) -> (Profile, Vec<BinaryReport>) {
    let mut p = Profile {
        mode: rec.meta.mode.clone(),
        frequency_hz: rec.meta.frequency_hz,
        start_unix_ns: rec.meta.start_unix_ns,
        duration_ns: rec.meta.duration_ns,
        ..Default::default()
    };
    let unknown = mappings(rec, &mut p);
    let mut loc_index: HashMap<(usize, u64), usize> = HashMap::new();
    let reports = user_locations(rec, resolver, &mut p, &mut loc_index, cache);
    let ktable = kernel::KernelTable::new(&rec.kernel_symbols);
    for s in &rec.stacks {
        let mut locs = Vec::with_capacity(s.kernel.len() + s.user_binary.len());
        for (i, &a) in s.kernel.iter().enumerate() {
            let a = call_site(i, a);
            let id = *loc_index.entry((0, a)).or_insert_with(|| {
                p.locations.push(Location {
                    mapping: 0,
                    address: a,
                    lines: kernel_lines(rec, &ktable, a),
                });
                p.locations.len() - 1
            });
            locs.push(id);
        }
        for (i, (&b, &o)) in s.user_binary.iter().zip(&s.user_offset).enumerate() {
            let runtime = s.user_runtime.get(i).copied().unwrap_or(0);
            if let Some(f) = rec.runtime_frames.get((runtime as usize).wrapping_sub(1)) {
                let m = runtime_mapping(&mut p, &f.kind);
                let id = *loc_index.entry((m, u64::from(runtime))).or_insert_with(|| {
                    p.locations.push(Location {
                        mapping: m,
                        address: u64::from(runtime),
                        lines: vec![FuncLine {
                            function: f.function.clone(),
                            file: (!f.file.is_empty()).then(|| f.file.clone()),
                            line: f.line,
                        }],
                    });
                    p.locations.len() - 1
                });
                locs.push(id);
                continue;
            }
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
            thread: s.thread.clone(),
            cgroup_id: s.cgroup_id,
            labels: Vec::new(),
            count: s.count,
            value: s.value,
            locations: locs,
            kernel_frames: s.kernel.len(),
        });
    }
    if let Some(l) = rec.meta.lost {
        let notes = loss_notes(&l, &p.mode);
        p.notes.extend(notes);
    }
    p.notes.extend(sample_accounting(rec));
    (p, reports)
}

/// The mapping of frames a runtime named (`[python]`, `[jit]`), added
/// at first use.
fn runtime_mapping(p: &mut Profile, kind: &str) -> usize {
    let name = format!("[{kind}]");
    if let Some(i) = p.mappings.iter().position(|m| m.name == name) {
        return i;
    }
    p.mappings.push(Mapping {
        name,
        build_id: String::new(),
        kernel: false,
    });
    p.mappings.len() - 1
}

/// Mapping name of Python frames: named `function (file.py:LINE)`.
pub const PYTHON_MAPPING: &str = "[python]";
/// Mapping name of JIT frames a perf map or jitdump named.
pub const JIT_MAPPING: &str = "[jit]";

/// What kind of code a frame is, for flame graph colors and JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FrameKind {
    /// The process (and thread) frames at the root of folded stacks.
    Process,
    Kernel,
    /// A BPF program's JIT code (and its source lines).
    Bpf,
    /// Machine code of an ELF file (C, C++, Rust, Go...).
    Native,
    Python,
    /// JIT code named from a perf map or jitdump.
    Jit,
    /// A raw address no file or runtime explained.
    Unknown,
}

impl FrameKind {
    pub fn as_str(self) -> &'static str {
        match self {
            FrameKind::Process => "process",
            FrameKind::Kernel => "kernel",
            FrameKind::Bpf => "bpf",
            FrameKind::Native => "native",
            FrameKind::Python => "python",
            FrameKind::Jit => "jit",
            FrameKind::Unknown => "unknown",
        }
    }
}

impl Profile {
    /// The kind of code at a location.
    pub fn kind(&self, loc: &Location) -> FrameKind {
        let Some(m) = self.mappings.get(loc.mapping) else {
            return FrameKind::Unknown;
        };
        if m.kernel {
            let bpf = loc
                .lines
                .first()
                .is_some_and(|l| l.function.starts_with("bpf_prog_"));
            return if bpf {
                FrameKind::Bpf
            } else {
                FrameKind::Kernel
            };
        }
        match m.name.as_str() {
            PYTHON_MAPPING => FrameKind::Python,
            JIT_MAPPING => FrameKind::Jit,
            "[unknown]" => FrameKind::Unknown,
            _ => FrameKind::Native,
        }
    }
}

/// The kernel, each binary (index + 1 as in the recording) and [unknown]
/// last, whose index is returned.
fn mappings(rec: &Recording, p: &mut Profile) -> usize {
    p.mappings.push(Mapping {
        name: "[kernel.kallsyms]".into(),
        build_id: bpfscope_sys::buildid::hex(&rec.meta.kernel_build_id),
        kernel: true,
    });
    for b in &rec.binaries {
        p.mappings.push(Mapping {
            name: b.paths.first().cloned().unwrap_or_else(|| {
                format!("[build id {}]", bpfscope_sys::buildid::hex(&b.build_id))
            }),
            build_id: bpfscope_sys::buildid::hex(&b.build_id),
            kernel: false,
        });
    }
    p.mappings.push(Mapping {
        name: "[unknown]".into(),
        build_id: String::new(),
        kernel: false,
    });
    p.mappings.len() - 1
}

/// Symbolizes every user offset of the recording, one batch per binary
/// (unique offsets), adding a location for each to `p` and `loc_index`.
fn user_locations(
    rec: &Recording,
    resolver: &mut Resolver,
    p: &mut Profile,
    loc_index: &mut HashMap<(usize, u64), usize>,
    cache: &mut NameCache,
) -> Vec<BinaryReport> {
    let mut per_bin: Vec<Vec<u64>> = vec![Vec::new(); rec.binaries.len()];
    for s in &rec.stacks {
        for (i, (&b, &o)) in s.user_binary.iter().zip(&s.user_offset).enumerate() {
            if b > 0 {
                per_bin[b as usize - 1].push(call_site(i, o));
            }
        }
    }
    cache.refresh += 1;
    let now = cache.refresh;
    let mut reports = Vec::new();
    for (i, offs) in per_bin.iter_mut().enumerate() {
        offs.sort_unstable();
        offs.dedup();
        let b = &rec.binaries[i];
        if !cache.files.contains_key(&b.build_id) {
            let found = resolver
                .find(&b.build_id, &b.paths)
                .map(|f| (f.path, f.origin));
            let weight = match (&found, cache.streaming) {
                (Some((path, _)), false) => bpfscope_symbolize::elf::symbol_bytes(path),
                _ => 0,
            };
            cache.files.insert(
                b.build_id.clone(),
                FileNames {
                    found,
                    names: HashMap::new(),
                    held: None,
                    table: None,
                    weight,
                    last: now,
                },
            );
        }
        // Only offsets not named before are looked up.
        let todo: Vec<u64> = match cache.files.get(&b.build_id) {
            Some(f) => offs
                .iter()
                .copied()
                .filter(|o| !f.names.contains_key(o))
                .collect(),
            None => Vec::new(),
        };
        let streaming = cache.streaming;
        let Some(file) = cache.files.get_mut(&b.build_id) else {
            continue;
        };
        file.last = now;
        if let Some(h) = file.held.as_mut() {
            h.last = now;
        }
        if !todo.is_empty() && file.held.is_none() && !streaming {
            let w = file.weight;
            cache.make_room(w);
        }
        let Some(file) = cache.files.get_mut(&b.build_id) else {
            continue;
        };
        let found = file.found.clone();
        if !todo.is_empty() {
            let held = file.held.get_or_insert_with(|| Held {
                resolver: (!streaming).then(|| resolver.sibling()),
                last: now,
            });
            held.last = now;
            // One report names with the caller's resolver (released below);
            // a live run with the file's own.
            let r = held.resolver.as_mut().unwrap_or(&mut *resolver);
            let results = match &found {
                Some((path, _)) => r.offsets(path, &b.segments, &todo),
                None => vec![None; todo.len()],
            };
            let mut new_lines: Vec<Vec<FuncLine>> = results
                .into_iter()
                .map(|r| r.map(|r| r.lines).unwrap_or_default())
                .collect();
            if new_lines.iter().any(Vec::is_empty) {
                let table = file
                    .table
                    .get_or_insert_with(|| unwind_table(b, found.as_ref().map(|f| f.0.as_path())));
                if let Some((t, path)) = table {
                    name_by_unwind_tables(b, t, path, &todo, &mut new_lines);
                }
            }
            for (o, l) in todo.iter().zip(new_lines) {
                file.names.insert(*o, (l, now));
            }
            if streaming {
                file.held = None;
                file.table = None;
                resolver.release();
            }
        }
        let lines: Vec<Vec<FuncLine>> = offs
            .iter()
            .map(|o| match file.names.get_mut(o) {
                Some((l, last)) => {
                    *last = now;
                    l.clone()
                }
                None => Vec::new(),
            })
            .collect();
        let symbolized = lines.iter().filter(|l| !l.is_empty()).count();
        reports.push(BinaryReport {
            build_id: bpfscope_sys::buildid::hex(&b.build_id),
            found: found.clone(),
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
        for (&o, l) in offs.iter().zip(lines) {
            loc_index.insert((i + 1, o), p.locations.len());
            p.locations.push(Location {
                mapping: i + 1,
                address: o,
                lines: l,
            });
        }
    }
    if !cache.streaming {
        cache.age();
    }
    reports
}

/// A binary's functions' bounds (its FDEs): the file itself has the CFI
/// (a separate debug file's .eh_frame is empty); the symbol file is tried
/// first, being at hand.
fn unwind_table(
    b: &bpfscope_recording::Binary,
    symbol_file: Option<&Path>,
) -> Option<(bpfscope_unwind::Functions, PathBuf)> {
    symbol_file
        .into_iter()
        .chain(b.paths.iter().map(Path::new))
        .find_map(|p| {
            let f = bpfscope_unwind::functions(p).ok()?;
            (!f.is_empty()).then(|| (f, p.to_path_buf()))
        })
}

/// Names the offsets no symbol named after the function their unwind
/// table entry (FDE) covers, `libfoo.so+0x15b80` at the FDE's first byte:
/// one frame per function of a stripped file, not one per address.
fn name_by_unwind_tables(
    b: &bpfscope_recording::Binary,
    table: &bpfscope_unwind::Functions,
    path: &Path,
    offs: &[u64],
    lines: &mut [Vec<FuncLine>],
) {
    let segments = if b.segments.is_empty() {
        bpfscope_symbolize::elf::inspect(path)
            .map(|i| i.segments)
            .unwrap_or_default()
    } else {
        b.segments.clone()
    };
    let base = b
        .paths
        .iter()
        .find(|p| !p.starts_with("/proc/self/fd/"))
        .and_then(|p| Path::new(p).file_name())
        .map(|n| n.to_string_lossy().into_owned());
    let Some(base) = base else {
        return;
    };
    for (&o, l) in offs.iter().zip(lines.iter_mut()) {
        if !l.is_empty() {
            continue;
        }
        let Some(seg) = segments
            .iter()
            .find(|s| s.executable && o >= s.file_offset && o < s.file_offset + s.file_size)
        else {
            continue;
        };
        let vaddr = o - seg.file_offset + seg.vaddr;
        if let Some((start, _)) = table.at(vaddr) {
            let Some(at) = (start + seg.file_offset).checked_sub(seg.vaddr) else {
                continue;
            };
            l.push(FuncLine {
                function: format!("{base}+{at:#x}"),
                file: None,
                line: 0,
            });
        }
    }
}

/// A kernel address's name: BPF JIT code first (kallsyms may no longer,
/// or never, have the program), then the recorded kallsyms entries.
fn kernel_lines(rec: &Recording, ktable: &kernel::KernelTable<'_>, a: u64) -> Vec<FuncLine> {
    if let Some(f) = bpfprog::lookup(&rec.bpf_programs, a) {
        return vec![FuncLine {
            function: f.symbol.to_string(),
            file: f.line.map(|l| l.file.clone()),
            line: f.line.map_or(0, |l| l.line),
        }];
    }
    ktable
        .lookup(a)
        .map(|k| {
            vec![FuncLine {
                function: if k.module.is_empty() {
                    k.name.clone()
                } else {
                    format!("{} [{}]", k.name, k.module)
                },
                file: None,
                line: 0,
            }]
        })
        .unwrap_or_default()
}

/// Where every sample of a CPU profile went, from the kernel's clocks to
/// the profile: a line of totals and, for recordings since 1.6, a line of
/// CPUs (idle time said as idle) and one of samples due on busy CPUs that
/// no sampler took. Empty for off-CPU profiles and recordings before 1.2.
pub fn sample_accounting(rec: &Recording) -> Vec<String> {
    let Some(l) = rec.meta.lost else {
        return Vec::new();
    };
    if rec.meta.mode != "cpu" || l.sampler_runs + l.samples_taken == 0 {
        return Vec::new();
    }
    // The sampling program's own: not the estimates, not the second sampler's.
    let stored: u64 = rec
        .stacks
        .iter()
        .filter(|s| s.comm != BPF_RUN_TIME)
        .map(|s| s.count)
        .sum::<u64>()
        .saturating_sub(l.bpf_sampled);
    // "Taken" is what the clocks fired: each run of the sampling program,
    // and each sample the second sampler took where that program could
    // not run (inside a BPF program holding the kernel's recursion guard).
    let taken = l.sampler_runs + l.bpf_sampled;
    let mut s = format!(
        "samples: {taken} taken by the clocks: {} in the profile",
        stored + l.bpf_sampled
    );
    if l.bpf_sampled > 0 {
        s.push_str(&format!(
            " ({} of them in kprobe, tracepoint or perf_event BPF programs, taken by a second sampler)",
            l.bpf_sampled
        ));
    }
    s.push_str(&format!(
        ", {} in processes not profiled, {} idle",
        l.other_samples, l.idle_samples
    ));
    if l.keys > 0 {
        s.push_str(&format!(
            ", {} lost (the count map was full: raise --max-stacks)",
            l.keys
        ));
    }
    let accounted = l.idle_samples + l.other_samples + stored + l.keys;
    if accounted != l.sampler_runs {
        s.push_str(&format!(
            "; {} unaccounted",
            l.sampler_runs.abs_diff(accounted)
        ));
    }
    if l.bpf_estimated > 0 {
        s.push_str(&format!(
            "; {} more estimated from BPF run time (under [bpf run time])",
            l.bpf_estimated
        ));
    }
    let mut lines = vec![s];
    lines.extend(cpu_lines(&rec.meta));
    lines
}

/// Seconds, for people: `9.95 s`.
fn secs(ns: u64) -> String {
    format!("{:.2} s", ns as f64 / 1e9)
}

/// Per CPU: samples taken, time idle (a CPU's clock may skip periods
/// while the CPU sleeps, which is no loss), and samples due on its busy
/// time that no sampler took, beyond what the measurements can tell apart.
fn cpu_lines(m: &bpfscope_recording::Meta) -> Vec<String> {
    if m.cpu_accounts.is_empty() || m.frequency_hz == 0 {
        return Vec::new();
    }
    let period = 1_000_000_000 / m.frequency_hz;
    // What the counts cannot tell apart: a clock's time against its timer
    // (2-4% apart on busy virtual machines, 5% allowed) and the idle time's resolution
    // (a 10 ms tick in /proc/stat, at each end).
    let slack = |due: u64| 2 + due / 20 + 20_000_000 / period;
    let mut parts = Vec::new();
    let mut quiet = 0;
    let mut short: Vec<(u32, u64)> = Vec::new();
    for c in &m.cpu_accounts {
        let taken = c.runs + c.guarded;
        let mut p = format!("CPU {} {taken} taken", c.cpu);
        let mut notable = false;
        if let Some(idle) = c.idle_ns {
            let due_idle = idle / period;
            if idle * 10 >= c.clock_ns {
                notable = true;
                p.push_str(&format!(
                    " ({} idle of {}: {} samples there",
                    secs(idle),
                    secs(c.clock_ns),
                    c.idle
                ));
                if due_idle > c.idle + slack(due_idle) {
                    p.push_str(&format!(
                        "; its clock skipped {} while the CPU slept, no loss",
                        due_idle - c.idle
                    ));
                }
                p.push(')');
            } else {
                p.push_str(&format!(
                    " (busy {} of {})",
                    secs(c.clock_ns - idle),
                    secs(c.clock_ns)
                ));
            }
            // Samples its busy time was due, against those taken in it.
            // Samples in the idle task beyond what its idle time was due
            // fell in time the kernel counts as busy (interrupts, the idle
            // loop before the CPU sleeps): they count as busy samples.
            let due = (c.clock_ns - idle) / period;
            let got = taken.saturating_sub(c.idle.min(due_idle));
            if due > got + slack(due) {
                notable = true;
                short.push((c.cpu, due - got));
            }
        }
        if notable || m.cpu_accounts.len() <= 8 {
            parts.push(p);
        } else {
            quiet += 1;
        }
    }
    if quiet > 0 {
        parts.push(format!("{quiet} more CPUs busy, none short"));
    }
    let mut lines = vec![format!(
        "per CPU at {} Hz: {}",
        m.frequency_hz,
        parts.join("; ")
    )];
    if !short.is_empty() {
        let n: u64 = short.iter().map(|(_, n)| n).sum();
        let each: Vec<String> = short.iter().map(|(c, n)| format!("CPU {c}: {n}")).collect();
        let second = m.cpu_accounts.iter().any(|c| c.guarded > 0);
        lines.push(format!(
            "not delivered: {n} samples due on busy CPU time were taken by no sampler ({}): a timer that fired late, or a kprobe, tracepoint or perf_event BPF program holding the kernel's recursion guard{}",
            each.join(", "),
            if second {
                " (the second sampler took those of other programs: bpfscope's own hooks remain)"
            } else {
                " (a second sampler takes those in whole-system profiles)"
            }
        ));
    }
    lines
}

/// What the recording lost, as notes for the reader.
/// One line per kind of loss, each with its own reason, and how user
/// stacks were unwound.
pub fn loss_notes(l: &LostCounts, mode: &str) -> Vec<String> {
    let mut notes = Vec::new();
    let unit = if mode == "offcpu" { "ns" } else { "samples" };
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
        (
            l.stack_collisions,
            "stacks had the 64-bit hash of another stack (a collision, detected by a second hash; not merged)",
        ),
        (
            l.files_lost,
            "files got no id (the kernel's file table was full): their frames are raw addresses",
        ),
    ];
    for (n, what) in items {
        if n > 0 {
            notes.push(format!("lost: {n} {what}"));
        }
    }
    notes.extend(unwind_line(l));
    notes.extend(python_line(l));
    if l.jit_frames > 0 {
        notes.push(format!(
            "jit: {} frames named from perf maps and jitdump files",
            l.jit_frames
        ));
    }
    if l.jit_no_map > 0 {
        notes.push(format!(
            "jit: {} processes ran code in anonymous memory without a /tmp/perf-PID.map or jitdump to name it (node --perf-basic-prof, jcmd PID Compiler.perfmap, DOTNET_PerfMapEnabled=1)",
            l.jit_no_map
        ));
    }
    if l.bpf_estimated > 0 {
        notes.push(format!(
            "{} samples are estimated from BPF run-time statistics: time in kprobe, tracepoint and perf_event BPF programs, during which the kernel runs no sampling program (shown under [bpf run time])",
            l.bpf_estimated
        ));
    }
    if l.bpf_sampled > 0 || l.second_sampler_lost > 0 {
        notes.push(format!(
            "{} samples in kprobe, tracepoint and perf_event BPF programs were taken by a second sampler (the sampling program cannot run inside them){}",
            l.bpf_sampled,
            if l.second_sampler_lost > 0 {
                format!("; it dropped {}", l.second_sampler_lost)
            } else {
                String::new()
            }
        ));
    }
    if l.unresolved_weight > 0 {
        notes.push(format!(
            "{} {unit} carry [unknown] user frames",
            l.unresolved_weight
        ));
    }
    notes
}

/// How user stacks were unwound (recordings since 1.3): by which method,
/// with what table memory, and where stacks ended other than at their
/// outermost frame.
fn unwind_line(l: &LostCounts) -> Option<String> {
    if l.table_frames + l.fp_frames + l.no_mappings == 0 {
        return None;
    }
    let mut s = format!(
        "unwinding: {} frames by unwind tables ({} files, {} KiB in the kernel), {} by frame pointers",
        l.table_frames,
        l.table_files,
        l.table_bytes.div_ceil(1024),
        l.fp_frames
    );
    if l.no_mappings > 0 {
        s.push_str(&format!(
            "; {} samples before their process's mappings were read (frame pointers only)",
            l.no_mappings
        ));
    }
    let ends = [
        (l.end_read, "a stack read failed"),
        (l.end_no_rule, "no unwind rule and no frame pointer"),
        (l.end_fp, "a frame-pointer chain ended"),
        (l.end_depth, "--max-depth"),
    ];
    let ends: Vec<String> = ends
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, why)| format!("{n} at {why}"))
        .collect();
    if !ends.is_empty() {
        s.push_str(&format!(
            "; stacks ended before their outermost frame: {}",
            ends.join(", ")
        ));
    }
    Some(s)
}

/// How Python frames went (recordings since 1.5), when there were any.
fn python_line(l: &LostCounts) -> Option<String> {
    if l.python_frames + l.python_no_thread + l.python_lost_code + l.python_unsupported == 0 {
        return None;
    }
    let mut s = format!("python: {} frames", l.python_frames);
    let issues = [
        (
            l.python_no_thread,
            "eval-loop frames whose thread state was not found (their Python frames are missing)",
        ),
        (
            l.python_lost_code,
            "frames whose code could not be announced (ring buffer full; shown as [unknown python code])",
        ),
        (l.python_unnamed, "frames of code never named"),
        (l.python_read, "frame chains cut short by a failed read"),
        (
            l.python_unplaced,
            "stacks whose outer Python frames came after the native walk ended",
        ),
        (
            l.python_truncated_tables,
            "line tables cut short (lines past the cut show as 0)",
        ),
        (
            l.python_unsupported,
            "interpreters of an unsupported version (their frames show as the interpreter's)",
        ),
    ];
    for (n, what) in issues {
        if n > 0 {
            s.push_str(&format!("; {n} {what}"));
        }
    }
    Some(s)
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

#[cfg(test)]
mod tests {
    use super::*;
    use bpfscope_recording::bpfprog::{BpfProg, LineInfo, Subprog};
    use bpfscope_recording::{Binary, KernelSymbol, LostCounts, Meta, Stack};
    use bpfscope_symbolize::{elf, SymbolConfig};

    #[test]
    fn loss_notes_name_each_cause_and_the_unwinding() {
        let mut l = LostCounts {
            kernel_stacks: 3,
            user_stacks: 2,
            kernel_stack_map_full: false,
            user_stack_map_full: true,
            stack_collisions: 4,
            ..Default::default()
        };
        assert_eq!(
            loss_notes(&l, "cpu"),
            [
                "lost: 3 kernel stacks could not be stored: the stack map was not full, but another stack held their hash slot (a hash collision)",
                "lost: 2 user stacks could not be stored: the stack map was full (raise --max-stacks)",
                "lost: 4 stacks had the 64-bit hash of another stack (a collision, detected by a second hash; not merged)",
            ]
        );
        l = LostCounts {
            table_frames: 900,
            fp_frames: 10,
            table_files: 3,
            table_bytes: 2048,
            no_mappings: 2,
            end_depth: 5,
            ..Default::default()
        };
        assert_eq!(
            loss_notes(&l, "cpu"),
            ["unwinding: 900 frames by unwind tables (3 files, 2 KiB in the kernel), 10 by frame pointers; 2 samples before their process's mappings were read (frame pointers only); stacks ended before their outermost frame: 5 at --max-depth"]
        );
        assert!(loss_notes(&LostCounts::default(), "cpu").is_empty());
    }

    #[inline(never)]
    #[no_mangle]
    pub extern "C" fn bpfscope_report_test_marker() -> u64 {
        std::hint::black_box(7)
    }

    /// A recording made by hand: one stack through a BPF program's JIT
    /// code, a kernel function and a module function in the kernel, and
    /// this test binary's marker function plus an unknown raw address in
    /// user space; one stack whose binary has no symbols anywhere.
    fn recording() -> Recording {
        let exe = std::env::current_exe().unwrap();
        let build_id = elf::inspect(&exe).unwrap().build_id.unwrap();
        let addr = bpfscope_report_test_marker as extern "C" fn() -> u64 as usize as u64;
        let m = bpfscope_sys::procfs::maps("self")
            .unwrap()
            .into_iter()
            .find(|m| m.executable() && addr >= m.start && addr < m.end)
            .unwrap();
        let prog = BpfProg {
            id: 9,
            name: "handler".into(),
            subprogs: vec![Subprog {
                symbol: "bpf_prog_00_handler".into(),
                addr: 0xffff_ffff_c000_0000,
                len: 0x100,
            }],
            lines: vec![LineInfo {
                addr: 0xffff_ffff_c000_0000,
                file: "/src/x.bpf.c".into(),
                line: 12,
                ..Default::default()
            }],
            ..Default::default()
        };
        Recording {
            meta: Meta {
                mode: "cpu".into(),
                frequency_hz: 99,
                lost: Some(LostCounts {
                    user_stacks: 3,
                    unresolved_frames: 1,
                    unresolved_weight: 2,
                    ..Default::default()
                }),
                ..Default::default()
            },
            binaries: vec![
                Binary {
                    build_id,
                    paths: vec![exe.display().to_string()],
                    segments: Vec::new(),
                },
                Binary {
                    build_id: vec![0xab; 20],
                    paths: vec!["/gone/libnothing.so".into()],
                    segments: Vec::new(),
                },
            ],
            kernel_symbols: vec![
                KernelSymbol {
                    addr: 0xffff_ffff_8100_0000,
                    name: "do_syscall_64".into(),
                    module: String::new(),
                },
                KernelSymbol {
                    addr: 0xffff_ffff_a000_0000,
                    name: "ext4_read".into(),
                    module: "ext4".into(),
                },
            ],
            stacks: vec![
                Stack {
                    pid: 1,
                    comm: "a".into(),
                    count: 2,
                    value: 2,
                    // The leaf is used as is; callers are return addresses.
                    kernel: vec![
                        0xffff_ffff_c000_0010,
                        0xffff_ffff_a000_0021,
                        0xffff_ffff_8100_0041,
                    ],
                    user_binary: vec![1, 0],
                    user_offset: vec![m.file_offset(addr), 0x1234],
                    ..Default::default()
                },
                Stack {
                    pid: 2,
                    comm: "b".into(),
                    count: 1,
                    value: 1,
                    kernel: Vec::new(),
                    // A native frame, a Python frame in place of the eval
                    // loop, and its native caller.
                    user_binary: vec![2, 0, 2],
                    user_offset: vec![0x10, 0, 0x20],
                    user_runtime: vec![0, 1, 0],
                    ..Default::default()
                },
            ],
            bpf_programs: vec![prog],
            runtime_frames: vec![bpfscope_recording::RuntimeFrame {
                kind: "python".into(),
                function: "App.handle".into(),
                file: "/srv/app.py".into(),
                line: 42,
            }],
        }
    }

    fn names(p: &Profile, s: &Sample) -> Vec<String> {
        s.locations
            .iter()
            .map(|&i| {
                let l = &p.locations[i];
                l.lines
                    .first()
                    .map(|f| f.function.clone())
                    .unwrap_or_else(|| l.fallback_name(&p.mappings))
            })
            .collect()
    }

    #[test]
    fn runtime_frames_keep_their_place_and_name() {
        let mut r = Resolver::new(&SymbolConfig::default(), false);
        let (p, _) = super::recording(&recording(), &mut r);
        let s = &p.samples[1];
        assert_eq!(s.locations.len(), 3);
        let py = &p.locations[s.locations[1]];
        assert_eq!(p.mappings[py.mapping].name, PYTHON_MAPPING);
        let l = &py.lines[0];
        assert_eq!(
            (l.function.as_str(), l.file.as_deref(), l.line),
            ("App.handle", Some("/srv/app.py"), 42)
        );
        let folded = p.folded();
        assert!(
            folded.iter().any(|f| f
                .starts_with("b;libnothing.so+0x1f;App.handle (app.py:42);libnothing.so+0x10 ")),
            "{folded:?}"
        );
    }

    #[test]
    fn a_recording_becomes_a_named_profile() {
        let mut r = Resolver::new(&SymbolConfig::default(), false);
        let (p, reports) = super::recording(&recording(), &mut r);
        assert_eq!(
            names(&p, &p.samples[0]),
            [
                "bpf_prog_00_handler",
                "ext4_read [ext4]",
                "do_syscall_64",
                "bpfscope_report_test_marker",
                "[unknown]"
            ]
        );
        assert_eq!(p.samples[0].kernel_frames, 3);
        let bpf = &p.locations[p.samples[0].locations[0]].lines[0];
        assert_eq!((bpf.file.as_deref(), bpf.line), (Some("/src/x.bpf.c"), 12));
        assert_eq!(
            names(&p, &p.samples[1]),
            ["libnothing.so+0x10", "App.handle", "libnothing.so+0x1f"]
        );
        assert_eq!(reports.len(), 2);
        assert_eq!((reports[0].frames, reports[0].symbolized), (1, 1));
        assert!(reports[1].found.is_none());
        let notes = p.notes.join("\n");
        assert!(
            notes.contains("no symbols for /gone/libnothing.so"),
            "{notes}"
        );
        assert!(
            notes.contains("lost: 3 user stacks could not be stored"),
            "{notes}"
        );
        assert!(
            notes.contains("2 samples carry [unknown] user frames"),
            "{notes}"
        );
    }

    /// A recording of one CPU-bound thread on a 2-CPU machine at 499 Hz:
    /// CPU 0 busy with it, CPU 1 idle for 1.99 of its 2 s and, as a sleeping
    /// CPU's clock can, firing only 40 times.
    fn two_cpus(cpu1_idle_ns: u64, cpu1_runs: u64, cpu1_idle: u64) -> Recording {
        let runs0 = 998;
        let other = 5 + (cpu1_runs - cpu1_idle);
        let stored = runs0 - 5;
        Recording {
            meta: Meta {
                mode: "cpu".into(),
                frequency_hz: 499,
                lost: Some(LostCounts {
                    samples_taken: 2010,
                    sampler_runs: runs0 + cpu1_runs,
                    idle_samples: cpu1_idle,
                    other_samples: other,
                    ..Default::default()
                }),
                cpu_accounts: vec![
                    bpfscope_recording::CpuAccount {
                        cpu: 0,
                        clock_ns: 2_004_000_000,
                        runs: runs0,
                        idle: 0,
                        other: 5,
                        keys: 0,
                        idle_ns: Some(2_000_000),
                        guarded: 0,
                    },
                    bpfscope_recording::CpuAccount {
                        cpu: 1,
                        clock_ns: 2_004_000_000,
                        runs: cpu1_runs,
                        idle: cpu1_idle,
                        other: cpu1_runs - cpu1_idle,
                        keys: 0,
                        idle_ns: Some(cpu1_idle_ns),
                        guarded: 0,
                    },
                ],
                ..Default::default()
            },
            stacks: vec![Stack {
                pid: 1,
                comm: "python3".into(),
                count: stored,
                value: stored,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn an_idle_cpu_is_said_as_idle_not_as_samples_not_delivered() {
        let lines = sample_accounting(&two_cpus(1_990_000_000, 40, 33));
        assert_eq!(
            lines,
            [
                "samples: 1038 taken by the clocks: 993 in the profile, 12 in processes not profiled, 33 idle",
                "per CPU at 499 Hz: CPU 0 998 taken (busy 2.00 s of 2.00 s); CPU 1 40 taken (1.99 s idle of 2.00 s: 33 samples there; its clock skipped 960 while the CPU slept, no loss)",
            ]
        );
    }

    #[test]
    fn idle_task_samples_in_busy_time_are_not_counted_as_lost() {
        // Seen on this machine at 199 Hz: /proc/stat idle 1.915 s of 2.00 s,
        // yet 397 samples in the idle task (381 due): the excess fell in
        // time counted as busy, which then holds 25 samples, not 9.
        let mut r = two_cpus(1_915_000_000, 406, 397);
        r.meta.frequency_hz = 199;
        r.meta.cpu_accounts[1].clock_ns = 2_000_000_000;
        let lines = sample_accounting(&r);
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(
            lines[1].contains("CPU 1 406 taken (1.92 s idle of 2.00 s: 397 samples there)"),
            "{lines:?}"
        );
    }

    #[test]
    fn samples_missing_on_a_busy_cpu_are_not_delivered_with_their_cpu() {
        // CPU 1 busy half the time but with 7 samples taken there, where
        // its busy second was due 500.
        let lines = sample_accounting(&two_cpus(1_000_000_000, 40, 33));
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert!(
            lines[2].starts_with("not delivered: 493 samples due on busy CPU time were taken by no sampler (CPU 1: 493): "),
            "{lines:?}"
        );
        // Recordings before 1.6 have totals only, and claim no loss.
        let mut old = two_cpus(1_000_000_000, 40, 33);
        old.meta.cpu_accounts.clear();
        assert_eq!(sample_accounting(&old).len(), 1);
    }

    #[test]
    fn stack_losses_name_their_cause() {
        assert!(stack_loss("user", true).contains("raise --max-stacks"));
        assert!(stack_loss("kernel", false).contains("hash collision"));
    }
}
