//! The recording file (`bpfscope record`, read by `bpfscope report`):
//! a fixed header, then typed sections, each a protobuf message with its
//! own length and CRC-32, ending with an END section. docs/recording-format.md
//! describes it for other readers.
//!
//! Protobuf (prost) carries the section bodies so that fields can be added
//! without breaking older readers (unknown fields are skipped), and
//! unknown sections are skipped unless flagged as required.

pub mod bpfprog;

use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use prost::Message;

/// The process name (`Stack::comm`, pid 0) of stacks estimated from BPF
/// run time rather than sampled (`LostCounts::bpf_estimated`).
pub const BPF_RUN_TIME: &str = "[bpf run time]";

/// First bytes of every recording.
pub const MAGIC: &[u8; 8] = b"BPFSCOPE";
/// Readers refuse other major versions; minor versions only add fields or sections.
pub const VERSION_MAJOR: u16 = 1;
pub const VERSION_MINOR: u16 = 6;
const HEADER_LEN: usize = 16;
const SECTION_HEADER_LEN: usize = 24;
/// A section that a reader must understand to use the file.
pub const FLAG_REQUIRED: u32 = 1;
/// Sections larger than this are taken for corruption rather than allocated.
const MAX_SECTION: u64 = 1 << 32;

/// Section kinds. Numbers are never reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum SectionKind {
    Meta = 1,
    Binaries = 2,
    KernelSymbols = 3,
    Stacks = 4,
    /// BPF programs whose JIT code the kernel frames hit: id, tag, name,
    /// JIT ranges, BTF line info with source text (optional).
    BpfPrograms = 5,
    /// Since 1.5: frames no ELF file names (interpreted functions, JIT
    /// code), named while their process lived.
    RuntimeFrames = 6,
    End = 0xffff,
}

/// What was recorded and how.
#[derive(Clone, PartialEq, Message)]
pub struct Meta {
    #[prost(string, tag = "1")]
    pub tool_version: String,
    #[prost(string, tag = "2")]
    pub hostname: String,
    #[prost(string, tag = "3")]
    pub kernel_release: String,
    /// GNU build id of the running kernel (from /sys/kernel/notes).
    #[prost(bytes = "vec", tag = "4")]
    pub kernel_build_id: Vec<u8>,
    /// "cpu" (values are samples) or "offcpu" (values are nanoseconds blocked).
    #[prost(string, tag = "5")]
    pub mode: String,
    #[prost(uint64, tag = "6")]
    pub frequency_hz: u64,
    /// Wall-clock start, nanoseconds since the Unix epoch.
    #[prost(uint64, tag = "7")]
    pub start_unix_ns: u64,
    #[prost(uint64, tag = "8")]
    pub duration_ns: u64,
    /// What was profiled: "all", "pid 123", "cgroup /x", "command ./a b".
    #[prost(string, tag = "9")]
    pub target: String,
    #[prost(bool, tag = "10")]
    pub kernel_stacks: bool,
    #[prost(bool, tag = "11")]
    pub user_stacks: bool,
    #[prost(message, optional, tag = "12")]
    pub lost: Option<LostCounts>,
    #[prost(uint32, tag = "13")]
    pub cpus: u32,
    /// Since 1.6, CPU profiles: where each CPU's samples went.
    #[prost(message, repeated, tag = "14")]
    pub cpu_accounts: Vec<CpuAccount>,
}

/// One CPU's samples in a CPU profile (since 1.6): what its clock counted,
/// what the sampling program did on it, how long it idled. runs = idle +
/// other + keys + the samples of the CPU in the profile.
#[derive(Clone, Copy, PartialEq, Message)]
pub struct CpuAccount {
    #[prost(uint32, tag = "1")]
    pub cpu: u32,
    /// ns its clock counted while sampling.
    #[prost(uint64, tag = "2")]
    pub clock_ns: u64,
    #[prost(uint64, tag = "3")]
    pub runs: u64,
    #[prost(uint64, tag = "4")]
    pub idle: u64,
    #[prost(uint64, tag = "5")]
    pub other: u64,
    #[prost(uint64, tag = "6")]
    pub keys: u64,
    /// ns it spent idle meanwhile (cpuidle residency or /proc/stat).
    #[prost(uint64, optional, tag = "7")]
    pub idle_ns: Option<u64>,
    /// Samples the second sampler took on it inside guarded BPF programs.
    #[prost(uint64, tag = "8")]
    pub guarded: u64,
}

/// What could not be captured or resolved.
#[derive(Clone, Copy, PartialEq, Message)]
pub struct LostCounts {
    #[prost(uint64, tag = "1")]
    pub kernel_stacks: u64,
    #[prost(uint64, tag = "2")]
    pub user_stacks: u64,
    /// Samples not counted because the (process, stack) map was full.
    #[prost(uint64, tag = "3")]
    pub keys: u64,
    #[prost(uint64, tag = "4")]
    pub notifications: u64,
    #[prost(uint64, tag = "5")]
    pub offcpu_starts: u64,
    /// User frames the kernel gave as raw addresses that no mapping snapshot explained.
    #[prost(uint64, tag = "6")]
    pub unresolved_frames: u64,
    /// Samples (or nanoseconds) carrying such frames.
    #[prost(uint64, tag = "7")]
    pub unresolved_weight: u64,
    /// BPF program load/unload records the kernel dropped (side-band ring full).
    #[prost(uint64, tag = "8")]
    pub bpf_events: u64,
    /// Whether the kernel (user) stack map was full at the end: stacks lost
    /// while it was not full hit a slot another stack held (the kernel's
    /// stack map keeps one stack per hash slot).
    #[prost(bool, tag = "9")]
    pub kernel_stack_map_full: bool,
    #[prost(bool, tag = "10")]
    pub user_stack_map_full: bool,
    /// Samples' worth of time in BPF programs during which the kernel runs
    /// no sampling program (kprobe, tracepoint and perf_event programs hold
    /// the kernel's BPF recursion guard), measured with BPF run-time
    /// statistics and added as `[bpf run time]` stacks (since 1.2).
    #[prost(uint64, tag = "11")]
    pub bpf_estimated: u64,
    /// CPU profiles (since 1.2): samples the kernel's clocks took on all
    /// CPUs, runs of the sampling program, and those in the idle task or in
    /// processes not profiled. taken - runs were skipped by the kernel;
    /// runs = idle + other + stored samples + keys.
    #[prost(uint64, tag = "12")]
    pub samples_taken: u64,
    #[prost(uint64, tag = "13")]
    pub sampler_runs: u64,
    #[prost(uint64, tag = "14")]
    pub idle_samples: u64,
    #[prost(uint64, tag = "15")]
    pub other_samples: u64,
    /// Since 1.3 (the profiler's own unwinder): stacks lost because another
    /// stack had the same 64-bit hash.
    #[prost(uint64, tag = "16")]
    pub stack_collisions: u64,
    /// User frames stepped through with unwind tables and with frame pointers.
    #[prost(uint64, tag = "17")]
    pub table_frames: u64,
    #[prost(uint64, tag = "18")]
    pub fp_frames: u64,
    /// Samples taken before their process's mappings were known (unwound
    /// with frame pointers, frames as raw addresses).
    #[prost(uint64, tag = "19")]
    pub no_mappings: u64,
    /// Why user stacks ended short of their outermost frame: a stack read
    /// failed, no rule and no frame pointer, a frame-pointer chain ended,
    /// --max-depth.
    #[prost(uint64, tag = "20")]
    pub end_read: u64,
    #[prost(uint64, tag = "21")]
    pub end_no_rule: u64,
    #[prost(uint64, tag = "22")]
    pub end_fp: u64,
    #[prost(uint64, tag = "23")]
    pub end_depth: u64,
    /// Unwind tables loaded into the kernel: files and bytes.
    #[prost(uint64, tag = "24")]
    pub table_files: u64,
    #[prost(uint64, tag = "25")]
    pub table_bytes: u64,
    /// Files whose frames stay raw: the file table was full.
    #[prost(uint64, tag = "26")]
    pub files_lost: u64,
    /// Samples in kprobe, tracepoint and perf_event BPF programs taken by a
    /// second, plain perf sampler (the profiler's own cannot run inside
    /// them); they are stacks of their own, with kernel frames only.
    #[prost(uint64, tag = "27")]
    pub bpf_sampled: u64,
    /// Samples the second sampler dropped (its ring full, or no room).
    #[prost(uint64, tag = "28")]
    pub second_sampler_lost: u64,
    /// Since 1.5, Python frames: stored; eval-loop frames whose thread
    /// state was not found (their Python frames are missing); frames whose
    /// code could not be announced (ring buffer full); frame chains cut by
    /// a failed read; frames stored after the native walk ended (not placed
    /// beside their eval loop); frames whose code was never named; line
    /// tables cut short (lines past the cut are unknown).
    #[prost(uint64, tag = "29")]
    pub python_frames: u64,
    #[prost(uint64, tag = "30")]
    pub python_no_thread: u64,
    #[prost(uint64, tag = "31")]
    pub python_lost_code: u64,
    #[prost(uint64, tag = "32")]
    pub python_read: u64,
    #[prost(uint64, tag = "33")]
    pub python_unplaced: u64,
    #[prost(uint64, tag = "34")]
    pub python_unnamed: u64,
    #[prost(uint64, tag = "35")]
    pub python_truncated_tables: u64,
    /// Files with a Python runtime whose frames cannot be read (an
    /// unsupported version): their processes show the interpreter's frames.
    #[prost(uint64, tag = "36")]
    pub python_unsupported: u64,
    /// Since 1.5: frames in JIT code named from the runtime's perf map or
    /// jitdump; processes with frames in anonymous memory and neither file.
    #[prost(uint64, tag = "37")]
    pub jit_frames: u64,
    #[prost(uint64, tag = "38")]
    pub jit_no_map: u64,
}

/// One ELF file seen in user stacks.
#[derive(Clone, PartialEq, Message)]
pub struct Binary {
    #[prost(bytes = "vec", tag = "1")]
    pub build_id: Vec<u8>,
    /// Paths it was mapped from by the profiled processes.
    #[prost(string, repeated, tag = "2")]
    pub paths: Vec<String>,
    /// Its PT_LOAD segments, to turn file offsets into virtual addresses
    /// when only a separate debug file is at hand.
    #[prost(message, repeated, tag = "3")]
    pub segments: Vec<Segment>,
}

#[derive(Clone, Copy, PartialEq, Message)]
pub struct Segment {
    #[prost(uint64, tag = "1")]
    pub file_offset: u64,
    #[prost(uint64, tag = "2")]
    pub vaddr: u64,
    #[prost(uint64, tag = "3")]
    pub file_size: u64,
    #[prost(bool, tag = "4")]
    pub executable: bool,
}

#[derive(Clone, PartialEq, Message)]
pub struct Binaries {
    #[prost(message, repeated, tag = "1")]
    pub binaries: Vec<Binary>,
}

/// The kallsyms entries that the recorded kernel addresses fall into: an
/// address belongs to the entry with the greatest start not above it.
#[derive(Clone, PartialEq, Message)]
pub struct KernelSymbols {
    #[prost(message, repeated, tag = "1")]
    pub symbols: Vec<KernelSymbol>,
}

#[derive(Clone, PartialEq, Message)]
pub struct KernelSymbol {
    #[prost(uint64, tag = "1")]
    pub addr: u64,
    #[prost(string, tag = "2")]
    pub name: String,
    /// Module name, empty for the kernel image.
    #[prost(string, tag = "3")]
    pub module: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct Stacks {
    #[prost(message, repeated, tag = "1")]
    pub stacks: Vec<Stack>,
}

/// A unique (process, kernel stack, user stack) and what it weighed.
/// Frames are leaf first.
#[derive(Clone, PartialEq, Message)]
pub struct Stack {
    #[prost(uint32, tag = "1")]
    pub pid: u32,
    /// Process name (its main thread's comm).
    #[prost(string, tag = "2")]
    pub comm: String,
    /// Samples, or off-CPU intervals.
    #[prost(uint64, tag = "3")]
    pub count: u64,
    /// Samples, or nanoseconds off CPU.
    #[prost(uint64, tag = "4")]
    pub value: u64,
    #[prost(uint64, repeated, tag = "5")]
    pub kernel: Vec<u64>,
    /// Per user frame: index + 1 into Binaries, or 0 for an unresolved raw address.
    #[prost(uint32, repeated, tag = "6")]
    pub user_binary: Vec<u32>,
    /// Per user frame: file offset in that binary, or the raw address.
    #[prost(uint64, repeated, tag = "7")]
    pub user_offset: Vec<u64>,
    /// Since 1.4 (the agent): the thread's name, and its cgroup v2 id; ""
    /// and 0 when samples were not keyed by them.
    #[prost(string, tag = "8")]
    pub thread: String,
    #[prost(uint64, tag = "9")]
    pub cgroup_id: u64,
    /// Since 1.5: per user frame, index + 1 into RuntimeFrames where a
    /// runtime named the frame (its user_binary and user_offset are then
    /// 0), else 0; empty when no frame of the stack is one.
    #[prost(uint32, repeated, tag = "10")]
    pub user_runtime: Vec<u32>,
}

/// A frame a language runtime named: a Python function at a line, or JIT
/// code named by the runtime's perf map or jitdump.
#[derive(Clone, PartialEq, Eq, Hash, Message)]
pub struct RuntimeFrame {
    /// "python" or "jit".
    #[prost(string, tag = "1")]
    pub kind: String,
    #[prost(string, tag = "2")]
    pub function: String,
    /// Source file, "" when unknown.
    #[prost(string, tag = "3")]
    pub file: String,
    /// Source line, 0 when unknown.
    #[prost(uint32, tag = "4")]
    pub line: u32,
}

#[derive(Clone, PartialEq, Message)]
pub struct RuntimeFrames {
    #[prost(message, repeated, tag = "1")]
    pub frames: Vec<RuntimeFrame>,
}

/// A whole recording in memory.
#[derive(Clone, PartialEq, Default)]
pub struct Recording {
    pub meta: Meta,
    pub binaries: Vec<Binary>,
    pub kernel_symbols: Vec<KernelSymbol>,
    pub stacks: Vec<Stack>,
    pub bpf_programs: Vec<crate::bpfprog::BpfProg>,
    pub runtime_frames: Vec<RuntimeFrame>,
}

/// Why a recording could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{0}: cannot read: {1}")]
    Io(PathBuf, io::Error),
    #[error("{0}: not a bpfscope recording (bad magic)")]
    Foreign(PathBuf),
    #[error("{0}: recording format version {1}.{2} is not supported (this bpfscope reads {VERSION_MAJOR}.x)")]
    Version(PathBuf, u16, u16),
    #[error("{0}: truncated recording ({1})")]
    Truncated(PathBuf, String),
    #[error("{0}: corrupt recording ({1})")]
    Corrupt(PathBuf, String),
}

fn section(out: &mut Vec<u8>, kind: SectionKind, flags: u32, body: &[u8]) {
    let mut crc = flate2::Crc::new();
    crc.update(body);
    out.extend_from_slice(&(kind as u32).to_le_bytes());
    out.extend_from_slice(&flags.to_le_bytes());
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(&crc.sum().to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(body);
}

/// The recording as bytes.
pub fn encode(r: &Recording) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 << 16);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION_MAJOR.to_le_bytes());
    out.extend_from_slice(&VERSION_MINOR.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    section(
        &mut out,
        SectionKind::Meta,
        FLAG_REQUIRED,
        &r.meta.encode_to_vec(),
    );
    let bins = Binaries {
        binaries: r.binaries.clone(),
    };
    section(
        &mut out,
        SectionKind::Binaries,
        FLAG_REQUIRED,
        &bins.encode_to_vec(),
    );
    let ks = KernelSymbols {
        symbols: r.kernel_symbols.clone(),
    };
    section(&mut out, SectionKind::KernelSymbols, 0, &ks.encode_to_vec());
    let st = Stacks {
        stacks: r.stacks.clone(),
    };
    section(
        &mut out,
        SectionKind::Stacks,
        FLAG_REQUIRED,
        &st.encode_to_vec(),
    );
    if !r.bpf_programs.is_empty() {
        let bp = crate::bpfprog::BpfProgs {
            programs: r.bpf_programs.clone(),
        };
        // Not required: a reader that does not know it still reports the rest.
        section(&mut out, SectionKind::BpfPrograms, 0, &bp.encode_to_vec());
    }
    if !r.runtime_frames.is_empty() {
        let rf = RuntimeFrames {
            frames: r.runtime_frames.clone(),
        };
        // Not required: an older reader shows these frames as [unknown].
        section(&mut out, SectionKind::RuntimeFrames, 0, &rf.encode_to_vec());
    }
    // Since 1.2, END's body is the CRC-32 of every byte before END: the
    // section checksums cover bodies only, and a flipped section kind or
    // flag byte would otherwise pass (an optional section silently skipped).
    let mut whole = flate2::Crc::new();
    whole.update(&out);
    section(
        &mut out,
        SectionKind::End,
        FLAG_REQUIRED,
        &whole.sum().to_le_bytes(),
    );
    out
}

pub fn read(path: &Path) -> Result<Recording, ReadError> {
    let mut f = File::open(path).map_err(|e| ReadError::Io(path.into(), e))?;
    let mut bytes = Vec::new();
    f.read_to_end(&mut bytes)
        .map_err(|e| ReadError::Io(path.into(), e))?;
    decode(path, &bytes)
}

fn le32(b: &[u8]) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[..4]);
    u32::from_le_bytes(w)
}

fn le64(b: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[..8]);
    u64::from_le_bytes(w)
}

pub fn decode(path: &Path, bytes: &[u8]) -> Result<Recording, ReadError> {
    let p = || path.to_path_buf();
    if bytes.len() < MAGIC.len() || &bytes[..MAGIC.len()] != MAGIC {
        if MAGIC.starts_with(bytes) {
            return Err(ReadError::Truncated(p(), "header cut short".into()));
        }
        return Err(ReadError::Foreign(p()));
    }
    if bytes.len() < HEADER_LEN {
        return Err(ReadError::Truncated(p(), "header cut short".into()));
    }
    let major = u16::from_le_bytes([bytes[8], bytes[9]]);
    let minor = u16::from_le_bytes([bytes[10], bytes[11]]);
    if major != VERSION_MAJOR {
        return Err(ReadError::Version(p(), major, minor));
    }
    let mut rec = Recording::default();
    let (mut meta, mut bins, mut stacks) = (false, false, false);
    let mut pos = HEADER_LEN;
    loop {
        if bytes.len() - pos < SECTION_HEADER_LEN {
            return Err(ReadError::Truncated(
                p(),
                format!("section header at byte {pos} cut short; the END section is missing"),
            ));
        }
        let h = &bytes[pos..pos + SECTION_HEADER_LEN];
        let (kind, flags, len, crc) = (le32(h), le32(&h[4..]), le64(&h[8..]), le32(&h[16..]));
        if len > MAX_SECTION {
            return Err(ReadError::Corrupt(
                p(),
                format!("section at byte {pos} claims {len} bytes"),
            ));
        }
        let start = pos + SECTION_HEADER_LEN;
        let avail = (bytes.len() - start) as u64;
        if len > avail {
            return Err(ReadError::Truncated(
                p(),
                format!("section {kind} at byte {pos} needs {len} bytes, {avail} left"),
            ));
        }
        let body = &bytes[start..start + len as usize];
        let mut c = flate2::Crc::new();
        c.update(body);
        if c.sum() != crc {
            return Err(ReadError::Corrupt(
                p(),
                format!("checksum mismatch in section {kind} at byte {pos}"),
            ));
        }
        let bad = |what: &str, e: prost::DecodeError| {
            ReadError::Corrupt(p(), format!("{what} section does not decode: {e}"))
        };
        match kind {
            k if k == SectionKind::Meta as u32 => {
                rec.meta = Meta::decode(body).map_err(|e| bad("meta", e))?;
                meta = true;
            }
            k if k == SectionKind::Binaries as u32 => {
                rec.binaries = Binaries::decode(body)
                    .map_err(|e| bad("binaries", e))?
                    .binaries;
                bins = true;
            }
            k if k == SectionKind::KernelSymbols as u32 => {
                rec.kernel_symbols = KernelSymbols::decode(body)
                    .map_err(|e| bad("kernel symbols", e))?
                    .symbols;
            }
            k if k == SectionKind::Stacks as u32 => {
                rec.stacks = Stacks::decode(body).map_err(|e| bad("stacks", e))?.stacks;
                stacks = true;
            }
            k if k == SectionKind::BpfPrograms as u32 => {
                rec.bpf_programs = crate::bpfprog::BpfProgs::decode(body)
                    .map_err(|e| bad("BPF programs", e))?
                    .programs;
            }
            k if k == SectionKind::RuntimeFrames as u32 => {
                rec.runtime_frames = RuntimeFrames::decode(body)
                    .map_err(|e| bad("runtime frames", e))?
                    .frames;
            }
            k if k == SectionKind::End as u32 => {
                // Every writer has written END required and reserved 0:
                // anything else in the one header no checksum covers is damage.
                if flags != FLAG_REQUIRED || le32(&h[20..]) != 0 {
                    return Err(ReadError::Corrupt(
                        p(),
                        format!("END section at byte {pos} has a damaged header"),
                    ));
                }
                // 1.0 and 1.1 files have an empty END.
                if let Ok(sum) = <[u8; 4]>::try_from(body) {
                    let mut whole = flate2::Crc::new();
                    whole.update(&bytes[..pos]);
                    if whole.sum() != u32::from_le_bytes(sum) {
                        return Err(ReadError::Corrupt(
                            p(),
                            "checksum mismatch over the section headers".into(),
                        ));
                    }
                }
                break;
            }
            k if flags & FLAG_REQUIRED != 0 => {
                return Err(ReadError::Corrupt(
                    p(),
                    format!(
                        "required section {k} is unknown to this bpfscope; a newer one may read it"
                    ),
                ));
            }
            _ => {}
        }
        pos = start + len as usize;
    }
    if !(meta && bins && stacks) {
        return Err(ReadError::Corrupt(
            p(),
            "meta, binaries or stacks section missing".into(),
        ));
    }
    // Indexes must point into the tables; a bad one is corruption, not a panic later.
    let nb = rec.binaries.len() as u32;
    for (i, s) in rec.stacks.iter().enumerate() {
        if s.user_binary.len() != s.user_offset.len() {
            return Err(ReadError::Corrupt(
                p(),
                format!("stack {i} has mismatched user frame arrays"),
            ));
        }
        if let Some(b) = s.user_binary.iter().find(|&&b| b > nb) {
            return Err(ReadError::Corrupt(
                p(),
                format!("stack {i} refers to binary {b} of {nb}"),
            ));
        }
    }
    Ok(rec)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Recording {
        Recording {
            bpf_programs: Vec::new(),
            meta: Meta {
                mode: "cpu".into(),
                frequency_hz: 99,
                ..Default::default()
            },
            binaries: vec![Binary {
                build_id: vec![1, 2, 3],
                paths: vec!["/bin/x".into()],
                segments: vec![],
            }],
            kernel_symbols: vec![],
            stacks: vec![Stack {
                pid: 7,
                comm: "x".into(),
                count: 3,
                value: 3,
                kernel: vec![0xffff_ffff_8100_0000],
                user_binary: vec![1, 0, 0],
                user_offset: vec![0x1234, 0x7fff_0000, 0],
                user_runtime: vec![0, 0, 1],
                thread: "worker".into(),
                cgroup_id: 4242,
            }],
            runtime_frames: vec![RuntimeFrame {
                kind: "python".into(),
                function: "main".into(),
                file: "/srv/app.py".into(),
                line: 7,
            }],
        }
    }

    #[test]
    fn round_trip() {
        let r = sample();
        let b = encode(&r);
        assert!(decode(Path::new("t"), &b).unwrap() == r);
    }

    #[test]
    fn every_truncation_is_an_error() {
        let b = encode(&sample());
        for n in 0..b.len() {
            assert!(decode(Path::new("t"), &b[..n]).is_err(), "length {n}");
        }
    }

    #[test]
    fn every_flipped_byte_is_an_error() {
        let b = encode(&sample());
        for at in 0..b.len() {
            for mask in [0x01, 0x5a, 0x80] {
                let mut c = b.clone();
                c[at] ^= mask;
                assert!(
                    decode(Path::new("t"), &c).is_err(),
                    "byte {at} ^ {mask:#x} was accepted"
                );
            }
        }
    }

    #[test]
    fn files_with_an_empty_end_still_read() {
        // 1.0 and 1.1 writers: END without the whole-file checksum.
        let mut b = encode(&sample());
        let end = b.len() - SECTION_HEADER_LEN - 4;
        b.truncate(end);
        section(&mut b, SectionKind::End, FLAG_REQUIRED, &[]);
        b[10] = 1;
        assert!(decode(Path::new("t"), &b).is_ok());
    }

    #[test]
    fn corruption_and_foreign_files() {
        let mut b = encode(&sample());
        // The last byte of the section before END (END: header + 4-byte sum).
        let last = b.len() - SECTION_HEADER_LEN - 4 - 3;
        b[last] ^= 0xff;
        assert!(matches!(
            decode(Path::new("t"), &b),
            Err(ReadError::Corrupt(..))
        ));
        assert!(matches!(
            decode(Path::new("t"), b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0"),
            Err(ReadError::Foreign(..))
        ));
        let mut v = encode(&sample());
        v[8] = 9;
        assert!(matches!(
            decode(Path::new("t"), &v),
            Err(ReadError::Version(..))
        ));
    }
}
