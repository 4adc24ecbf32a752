//! `bpfscope annotate`: where in one user function a recording's samples
//! landed, per source line and per instruction, as `perf annotate` shows
//! it. A sample counts for the function when its user-mode pc (the leaf of
//! a sample taken in user mode) is in it; samples taken in the kernel on
//! the function's behalf (a system call it made) are counted apart. The
//! function's bounds are its FDE in the file's unwind table (the range
//! sampled where the file has none), its instructions are decoded from
//! the mapped file, and every instruction is named with the debug
//! information the symbolizer finds.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use bpfscope_recording::{Binary, Recording, Segment};
use bpfscope_symbolize::{elf, Resolver};
use iced_x86::{Decoder, DecoderOptions, Formatter, GasFormatter};

/// One instruction of the function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instruction {
    /// File offset, and ELF virtual address.
    pub offset: u64,
    pub vaddr: u64,
    /// AT&T syntax, as objdump and perf annotate print it.
    pub text: String,
    pub count: u64,
    /// The innermost source line at the instruction (inlined code names
    /// the inlined function's line).
    pub file: Option<String>,
    pub line: u32,
}

/// Samples per source line (every line of the function's code, sampled or not).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceLine {
    pub file: String,
    pub line: u32,
    pub count: u64,
    /// The line's text, when the source file is readable here.
    pub source: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Annotation {
    pub function: String,
    /// The file the function is in, and its build id.
    pub binary: String,
    pub build_id: String,
    /// User-mode samples in the function, and all samples of the profile.
    pub samples: u64,
    pub profile_samples: u64,
    /// Samples taken in the kernel for the function (its system calls).
    pub in_kernel: u64,
    /// Samples inside the function but on no decoded instruction (the
    /// file on disk no longer holds the bytes sampled).
    pub undecoded: u64,
    pub lines: Vec<SourceLine>,
    pub instructions: Vec<Instruction>,
}

/// Why no annotation: a sentence for the user, with the functions that
/// were sampled.
pub fn annotate(
    rec: &Recording,
    resolver: &mut Resolver,
    function: &str,
) -> Result<Annotation, String> {
    // User-mode leaves per (binary, offset), and kernel-mode samples by
    // their user leaf.
    let mut user: HashMap<(u32, u64), u64> = HashMap::new();
    let mut kernel: HashMap<(u32, u64), u64> = HashMap::new();
    let mut profile_samples = 0;
    for s in &rec.stacks {
        profile_samples += s.count;
        let (Some(&b), Some(&o)) = (s.user_binary.first(), s.user_offset.first()) else {
            continue;
        };
        if b == 0 || s.user_runtime.first().copied().unwrap_or(0) != 0 {
            continue;
        }
        let to = if s.kernel.is_empty() {
            &mut user
        } else {
            &mut kernel
        };
        // A leaf below the kernel is a return address: its call.
        let o = if s.kernel.is_empty() {
            o
        } else {
            o.saturating_sub(1)
        };
        *to.entry((b, o)).or_default() += s.count;
    }
    // Name each sampled offset's (outer) function.
    let mut per_bin: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    for &(b, o) in user.keys().chain(kernel.keys()) {
        per_bin.entry(b).or_default().push(o);
    }
    let mut named: HashMap<(u32, u64), String> = HashMap::new();
    for (b, offs) in &mut per_bin {
        offs.sort_unstable();
        offs.dedup();
        let Some(bin) = rec.binaries.get(*b as usize - 1) else {
            continue;
        };
        let Some(found) = resolver.find(&bin.build_id, &bin.paths) else {
            continue;
        };
        for (o, r) in offs
            .iter()
            .zip(resolver.offsets(&found.path, &bin.segments, offs))
        {
            if let Some(f) = r.and_then(|r| r.lines.into_iter().next()) {
                named.insert((*b, *o), f.function);
            }
        }
    }
    // The binary holding most of the function's samples.
    let mut by_bin: HashMap<u32, u64> = HashMap::new();
    for (k, n) in &user {
        if named.get(k).is_some_and(|f| f == function) {
            *by_bin.entry(k.0).or_default() += n;
        }
    }
    let in_kernel_any: u64 = kernel
        .iter()
        .filter(|(k, _)| named.get(k).is_some_and(|f| f == function))
        .map(|(_, n)| n)
        .sum();
    let Some((&b, _)) = by_bin
        .iter()
        .max_by_key(|(b, n)| (**n, std::cmp::Reverse(**b)))
    else {
        return Err(not_sampled(function, &user, &named, in_kernel_any));
    };
    let bin = &rec.binaries[b as usize - 1];
    let offsets: Vec<(u64, u64)> = user
        .iter()
        .filter(|(k, _)| k.0 == b && named.get(k).is_some_and(|f| f == function))
        .map(|(k, n)| (k.1, *n))
        .collect();
    let in_kernel: u64 = kernel
        .iter()
        .filter(|(k, _)| k.0 == b && named.get(k).is_some_and(|f| f == function))
        .map(|(_, n)| n)
        .sum();
    let samples: u64 = offsets.iter().map(|(_, n)| n).sum();
    let code = code_file(bin).ok_or_else(|| {
        format!(
            "{function}: the file it was sampled in ({}) is no longer on disk: its instructions cannot be read",
            bin.paths.first().map_or("?", String::as_str)
        )
    })?;
    let segments = if bin.segments.is_empty() {
        elf::inspect(&code).map(|i| i.segments).unwrap_or_default()
    } else {
        bin.segments.clone()
    };
    let (start, end) = bounds(&code, &segments, &offsets);
    let instructions = decode(&code, &segments, start, end)?;
    // Name every instruction with its line.
    let found = resolver.find(&bin.build_id, &bin.paths);
    let offs: Vec<u64> = instructions.iter().map(|i| i.0).collect();
    let lines_at = match &found {
        Some(f) => resolver.offsets(&f.path, &bin.segments, &offs),
        None => vec![None; offs.len()],
    };
    let counts: HashMap<u64, u64> = offsets.iter().copied().collect();
    let mut out: Vec<Instruction> = Vec::with_capacity(instructions.len());
    for ((offset, vaddr, text), r) in instructions.into_iter().zip(lines_at) {
        let inner = r.and_then(|r| r.lines.into_iter().last());
        out.push(Instruction {
            offset,
            vaddr,
            text,
            count: counts.get(&offset).copied().unwrap_or(0),
            file: inner.as_ref().and_then(|l| l.file.clone()),
            line: inner.map_or(0, |l| l.line),
        });
    }
    let undecoded = samples - out.iter().map(|i| i.count).sum::<u64>();
    // Every line the function's code has, sampled or not.
    let mut per_line: BTreeMap<(String, u32), u64> = BTreeMap::new();
    for i in &out {
        if let Some(f) = &i.file {
            *per_line.entry((f.clone(), i.line)).or_default() += i.count;
        }
    }
    let mut sources: HashMap<String, Option<Vec<String>>> = HashMap::new();
    let mut lines: Vec<SourceLine> = per_line
        .into_iter()
        .map(|((file, line), count)| {
            let text = sources
                .entry(file.clone())
                .or_insert_with(|| {
                    std::fs::read_to_string(&file)
                        .ok()
                        .map(|t| t.lines().map(String::from).collect())
                })
                .as_ref()
                .and_then(|v| v.get((line as usize).wrapping_sub(1)))
                .map(|s| s.trim().to_string());
            SourceLine {
                file,
                line,
                count,
                source: text,
            }
        })
        .collect();
    lines.sort_by(|a, b| b.count.cmp(&a.count).then(a.line.cmp(&b.line)));
    Ok(Annotation {
        function: function.to_string(),
        binary: bin
            .paths
            .iter()
            .find(|p| !p.starts_with("/proc/self/fd/"))
            .cloned()
            .unwrap_or_else(|| code.display().to_string()),
        build_id: bpfscope_sys::buildid::hex(&bin.build_id),
        samples,
        profile_samples,
        in_kernel,
        undecoded,
        lines,
        instructions: out,
    })
}

/// The function was not sampled in user mode: say which were.
fn not_sampled(
    function: &str,
    user: &HashMap<(u32, u64), u64>,
    named: &HashMap<(u32, u64), String>,
    in_kernel: u64,
) -> String {
    let mut by_fn: HashMap<&str, u64> = HashMap::new();
    for (k, n) in user {
        if let Some(f) = named.get(k) {
            *by_fn.entry(f).or_default() += n;
        }
    }
    let mut v: Vec<(&str, u64)> = by_fn.into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let top: Vec<String> = v
        .iter()
        .take(5)
        .map(|(f, n)| format!("{f} ({n})"))
        .collect();
    let kernel = if in_kernel > 0 {
        format!(" (only {in_kernel} samples in the kernel on its behalf)")
    } else {
        String::new()
    };
    if top.is_empty() {
        format!("{function}: no user-mode samples in the recording{kernel}")
    } else {
        format!(
            "{function}: no user-mode samples in it{kernel}; the functions sampled most: {}",
            top.join(", ")
        )
    }
}

/// The file whose bytes were mapped: a path that still has the build id.
fn code_file(b: &Binary) -> Option<PathBuf> {
    b.paths.iter().map(PathBuf::from).find(|p| {
        if bpfscope_sys::buildid::is_synthetic(&b.build_id) {
            std::fs::metadata(p).is_ok_and(|m| bpfscope_sys::buildid::synthetic(&m) == b.build_id)
        } else {
            elf::inspect(p).is_ok_and(|i| i.build_id.as_deref() == Some(&b.build_id[..]))
        }
    })
}

/// The executable segment holding a file offset.
fn segment(segments: &[Segment], off: u64) -> Option<&Segment> {
    segments
        .iter()
        .find(|s| s.executable && off >= s.file_offset && off < s.file_offset + s.file_size)
}

/// The function's file offsets [start, end): its FDE in the file's unwind
/// table, around the hottest sample; the range sampled where no FDE covers it.
fn bounds(code: &Path, segments: &[Segment], offsets: &[(u64, u64)]) -> (u64, u64) {
    let lo = offsets.iter().map(|o| o.0).min().unwrap_or(0);
    let hi = offsets.iter().map(|o| o.0).max().unwrap_or(0) + 16;
    let hottest = offsets
        .iter()
        .max_by_key(|o| (o.1, o.0))
        .map_or(lo, |o| o.0);
    let fde = (|| {
        let seg = segment(segments, hottest)?;
        let functions = bpfscope_unwind::functions(code).ok()?;
        let (s, e) = functions.at(hottest - seg.file_offset + seg.vaddr)?;
        Some((
            s - seg.vaddr + seg.file_offset,
            e - seg.vaddr + seg.file_offset,
        ))
    })();
    match fde {
        Some((s, e)) if s <= lo && e >= hi.saturating_sub(15) => (s, e),
        _ => (lo, hi),
    }
}

/// Longest function decoded (a bad bound must not decode a whole file).
const MAX_BYTES: u64 = 1 << 20;

/// The file is AArch64 code (else x86-64's is assumed).
fn is_aarch64(code: &Path) -> bool {
    use object::Object;
    let Ok(f) = std::fs::File::open(code) else {
        return false;
    };
    let cache = object::read::ReadCache::new(f);
    object::File::parse(&cache).is_ok_and(|o| o.architecture() == object::Architecture::Aarch64)
}

/// AArch64's fixed 4-byte instructions from file offset `start` (vaddr
/// `vstart`); a word that is no instruction is shown as `.inst`, as objdump
/// does.
fn decode_a64(bytes: &[u8], start: u64, vstart: u64) -> Vec<(u64, u64, String)> {
    use yaxpeax_arch::{Decoder as _, U8Reader};
    let decoder = yaxpeax_arm::armv8::a64::InstDecoder::default();
    bytes
        .chunks_exact(4)
        .enumerate()
        .map(|(i, w)| {
            let at = 4 * i as u64;
            let text = match decoder.decode(&mut U8Reader::new(w)) {
                Ok(ins) => ins.to_string(),
                Err(_) => format!(
                    ".inst 0x{:08x}",
                    u32::from_le_bytes([w[0], w[1], w[2], w[3]])
                ),
            };
            (start + at, vstart + at, text)
        })
        .collect()
}

/// (file offset, vaddr, text) of each instruction in [start, end).
fn decode(
    code: &Path,
    segments: &[Segment],
    start: u64,
    end: u64,
) -> Result<Vec<(u64, u64, String)>, String> {
    use std::io::{Read, Seek, SeekFrom};
    let len = end.saturating_sub(start).min(MAX_BYTES);
    let mut bytes = vec![0u8; len as usize];
    let read = (|| -> std::io::Result<()> {
        let mut f = std::fs::File::open(code)?;
        f.seek(SeekFrom::Start(start))?;
        f.read_exact(&mut bytes)
    })();
    read.map_err(|e| format!("{}: reading the function's code: {e}", code.display()))?;
    let vstart = segment(segments, start).map_or(start, |s| start - s.file_offset + s.vaddr);
    if is_aarch64(code) {
        return Ok(decode_a64(&bytes, start, vstart));
    }
    let mut decoder = Decoder::with_ip(64, &bytes, vstart, DecoderOptions::NONE);
    let mut fmt = GasFormatter::new();
    // As objdump prints them: lower-case hex, branch targets unpadded.
    fmt.options_mut().set_uppercase_hex(false);
    fmt.options_mut().set_branch_leading_zeros(false);
    let mut out = Vec::new();
    let mut text = String::new();
    while decoder.can_decode() {
        let ins = decoder.decode();
        text.clear();
        fmt.format(&ins, &mut text);
        let off = start + (ins.ip() - vstart);
        out.push((off, ins.ip(), text.clone()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::decode_a64;

    #[test]
    fn aarch64_words_decode_one_per_four_bytes() {
        let words: [u32; 4] = [0xa9b8_7bfd, 0x9100_03fd, 0xd65f_03c0, 0xffff_ffff];
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let got = decode_a64(&bytes, 0x800, 0x10800);
        let text: Vec<&str> = got.iter().map(|i| i.2.as_str()).collect();
        assert_eq!(
            text,
            [
                "stp x29, x30, [sp, #-0x80]!",
                "mov x29, sp",
                "ret",
                ".inst 0xffffffff"
            ]
        );
        assert_eq!((got[3].0, got[3].1), (0x80c, 0x1080c));
    }
}
