//! What bpfscope needs to know about an ELF file: its build id, its loadable
//! segments (to turn the file offsets of build-id stacks into the virtual
//! addresses that debug information is keyed by) and whether it carries
//! symbols at all.

use std::fs::File;
use std::path::Path;

use object::read::ReadCache;
use object::{Object, ObjectSegment, SegmentFlags};

use bpfscope_recording::Segment;

#[derive(Debug, Clone, Default)]
pub struct ElfSummary {
    pub build_id: Option<Vec<u8>>,
    pub segments: Vec<Segment>,
    /// Has .symtab or DWARF: worth symbolizing from directly.
    pub has_symbols: bool,
    pub has_debug_info: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum ElfError {
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    #[error("{0}: not an ELF file ({1})")]
    Parse(String, object::Error),
}

/// Reads headers only (lazily, through a read cache), never whole files.
pub fn inspect(path: &Path) -> Result<ElfSummary, ElfError> {
    let name = || path.display().to_string();
    let f = File::open(path).map_err(|e| ElfError::Io(name(), e))?;
    let cache = ReadCache::new(f);
    let obj = object::File::parse(&cache).map_err(|e| ElfError::Parse(name(), e))?;
    let build_id = obj.build_id().ok().flatten().map(<[u8]>::to_vec);
    let mut segments: Vec<(Segment, u64, u64)> = obj
        .segments()
        .map(|s| {
            let (file_offset, file_size) = s.file_range();
            let executable = match s.flags() {
                SegmentFlags::Elf { p_flags, .. } => p_flags.contains(object::elf::PF_X),
                _ => false,
            };
            let seg = Segment {
                file_offset,
                vaddr: s.address(),
                file_size,
                executable,
            };
            (seg, s.size(), s.align())
        })
        .collect();
    // Code has no bss: an executable segment shorter in the file than in
    // memory lost its contents (all of it on x86-64; on AArch64 the first
    // segment keeps the headers and notes it starts with).
    if segments
        .iter()
        .any(|(s, mem, _)| s.executable && s.file_size < *mem)
    {
        reconstruct_offsets(&mut segments);
    }
    let segments = segments.into_iter().map(|(s, _, _)| s).collect();
    let has_debug_info = obj.section_by_name(".debug_info").is_some();
    let has_symbols = has_debug_info || obj.section_by_name(".symtab").is_some();
    Ok(ElfSummary {
        build_id,
        segments,
        has_symbols,
        has_debug_info,
    })
}

/// Bytes of the sections a symbolizer reads and keeps mapped or indexed
/// (symbol and string tables, debug information): what holding the file
/// open for lookups costs in memory, to within a factor of about one.
pub fn symbol_bytes(path: &Path) -> u64 {
    use object::read::elf::{FileHeader, SectionHeader};
    // Section headers only: a parse of the whole file reads its symbol
    // tables (4 MB for a compiler's library).
    let Ok(f) = File::open(path) else {
        return 0;
    };
    let cache = ReadCache::new(f);
    let data = &cache;
    let Ok(header) = object::elf::FileHeader64::<object::Endianness>::parse(data) else {
        return 0;
    };
    let Ok(endian) = header.endian() else {
        return 0;
    };
    let Ok(sections) = header.sections(endian, data) else {
        return 0;
    };
    sections
        .iter()
        .filter(|s| {
            sections.section_name(endian, s).is_ok_and(|n| {
                matches!(n, b".symtab" | b".strtab" | b".dynsym" | b".dynstr")
                    || n.starts_with(b".debug_")
                    || n.starts_with(b".zdebug_")
            })
        })
        .map(|s| s.sh_size(endian))
        .sum()
}

/// A separate debug file (objcopy --only-keep-debug, distribution -dbg
/// packages) keeps the program headers' addresses but not their file
/// offsets. Linkers lay segments out in order, each at the first file
/// offset past the previous one that is congruent to its address modulo
/// the segment's alignment (the maximum page size: 4 KiB on x86-64, 64 KiB
/// on AArch64), and the segments before the writable one hold no bss; that
/// gives back the original offsets of the segments code lives in.
fn reconstruct_offsets(segs: &mut [(Segment, u64, u64)]) {
    let mut next = 0u64;
    for (i, (s, mem, align)) in segs.iter_mut().enumerate() {
        let page = if align.is_power_of_two() && *align >= 0x1000 {
            *align
        } else {
            0x1000
        };
        let want = s.vaddr % page;
        let off = if i == 0 {
            want
        } else {
            let base = next - next % page + want;
            if base >= next {
                base
            } else {
                base + page
            }
        };
        s.file_offset = off;
        s.file_size = *mem;
        next = off + *mem;
    }
}

/// The virtual address of a file offset, through the segment that holds it.
pub fn file_to_virt(segments: &[Segment], off: u64) -> Option<u64> {
    segments
        .iter()
        .find(|s| off >= s.file_offset && off - s.file_offset < s.file_size)
        .map(|s| off.wrapping_add(s.vaddr.wrapping_sub(s.file_offset)))
}

/// PLT stubs by address: a call through the PLT is sampled in a stub that
/// no symbol covers, and a symbol lookup would name whatever precedes it
/// (`_init`). Stubs are named as binutils does, `puts@plt`, from
/// `.rela.plt` (its n-th relocation is the n-th stub of `.plt.sec`, or the
/// (n+1)-th of `.plt`, after the resolver's), or `[plt]` where the
/// relocations are not in the file (a separate debug file).
pub struct PltStubs {
    /// (start, end, index of the first stub's relocation) per section;
    /// `None` for a section whose stubs are not named by index.
    ranges: Vec<(u64, u64, Option<i64>)>,
    names: Vec<String>,
}

/// Stubs are 16 bytes in the lazy `.plt`, `.plt.sec` (IBT) and `.plt.got`.
const PLT_ENTRY: u64 = 16;

impl PltStubs {
    pub fn read(path: &Path) -> Option<PltStubs> {
        use object::read::elf::{ElfFile64, FileHeader, SectionHeader};
        use object::{Endianness, ObjectSection};
        // Headers and the few sections needed, never the whole file.
        let file = File::open(path).ok()?;
        let cache = ReadCache::new(file);
        let data = &cache;
        let elf = ElfFile64::<Endianness, _>::parse(data).ok()?;
        let endian = elf.endian();
        let mut names = Vec::new();
        if let (Some(rela), Some(dynsym)) = (
            elf.section_by_name(".rela.plt"),
            elf.elf_header()
                .sections(endian, data)
                .ok()
                .and_then(|s| s.symbols(endian, data, object::elf::SHT_DYNSYM).ok()),
        ) {
            if let Ok(bytes) = rela.data() {
                for r in bytes.chunks_exact(24) {
                    let info = u64::from_le_bytes(r[8..16].try_into().ok()?);
                    let name = dynsym
                        .symbol(object::SymbolIndex((info >> 32) as usize))
                        .ok()
                        .and_then(|s| dynsym.symbol_name(endian, s).ok())
                        .map(|n| String::from_utf8_lossy(n).into_owned())
                        .unwrap_or_default();
                    names.push(name);
                }
            }
        }
        let mut ranges = Vec::new();
        for (name, first) in [
            (".plt.sec", Some(0)),
            // With .plt.sec, .plt holds the lazy-binding halves: still by index.
            (".plt", Some(-1)),
            (".plt.got", None),
        ] {
            if let Some(s) = elf.section_by_name(name) {
                let hdr = s.elf_section_header();
                let start = hdr.sh_addr(endian);
                let end = start + hdr.sh_size(endian);
                ranges.push((start, end, first));
            }
        }
        (!ranges.is_empty()).then_some(PltStubs { ranges, names })
    }

    /// The stub's name and the address's offset into it, if `vaddr` is in a PLT.
    pub fn name(&self, vaddr: u64) -> Option<(String, u64)> {
        let &(start, _, first) = self
            .ranges
            .iter()
            .find(|(s, e, _)| vaddr >= *s && vaddr < *e)?;
        let slot = (vaddr - start) / PLT_ENTRY;
        let offset = (vaddr - start) % PLT_ENTRY;
        let named = first
            .and_then(|f| usize::try_from(slot as i64 + f).ok())
            .and_then(|i| self.names.get(i))
            .filter(|n| !n.is_empty());
        Some(match named {
            Some(n) => (format!("{n}@plt"), offset),
            None => ("[plt]".to_string(), offset),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `name@plt` stub objdump finds in this test binary gets the same
    /// name, wherever in the stub the address falls.
    #[test]
    fn plt_stubs_are_named_as_objdump_names_them() {
        let exe = std::env::current_exe().unwrap();
        let Ok(out) = std::process::Command::new("objdump")
            .args(["-d", "-j", ".plt", "-j", ".plt.sec"])
            .arg(&exe)
            .output()
        else {
            eprintln!("SKIP plt_stubs_are_named_as_objdump_names_them: objdump is not installed");
            return;
        };
        let text = String::from_utf8_lossy(&out.stdout);
        let stubs: Vec<(u64, String)> = text
            .lines()
            .filter_map(|l| {
                let (addr, rest) = l.split_once(' ')?;
                let name = rest.strip_prefix('<')?.strip_suffix(">:")?;
                name.ends_with("@plt")
                    .then(|| Some((u64::from_str_radix(addr, 16).ok()?, name.to_string())))?
            })
            .collect();
        assert!(!stubs.is_empty(), "objdump found no PLT stubs:\n{text}");
        let plt = PltStubs::read(&exe).expect("the test binary has a PLT");
        for (addr, name) in &stubs {
            assert_eq!(plt.name(*addr), Some((name.clone(), 0)));
            assert_eq!(plt.name(addr + 7), Some((name.clone(), 7)));
        }
    }

    #[test]
    fn offsets_through_segments() {
        let segs = [
            Segment {
                file_offset: 0,
                vaddr: 0,
                file_size: 0x1000,
                executable: false,
            },
            Segment {
                file_offset: 0x1000,
                vaddr: 0x401000,
                file_size: 0x2000,
                executable: true,
            },
        ];
        assert_eq!(file_to_virt(&segs, 0x1234), Some(0x401234));
        assert_eq!(file_to_virt(&segs, 0x10), Some(0x10));
        assert_eq!(file_to_virt(&segs, 0x9000), None);
        assert_eq!(file_to_virt(&[], 1), None);
    }

    #[test]
    fn debug_file_offsets_rebuilt() {
        // libc's segments as its -dbg debug file shows them (offsets and sizes lost).
        let seg = |vaddr, x| Segment {
            file_offset: 0,
            vaddr,
            file_size: 0,
            executable: x,
        };
        let mut segs = vec![
            (seg(0, false), 0x25388, 0x1000),
            (seg(0x26000, true), 0x1550fc, 0x1000),
            (seg(0x17c000, false), 0x52c31, 0x1000),
        ];
        reconstruct_offsets(&mut segs);
        let offs: Vec<u64> = segs.iter().map(|(s, _, _)| s.file_offset).collect();
        assert_eq!(offs, vec![0, 0x26000, 0x17c000]);
    }

    #[test]
    fn aarch64_debug_file_offsets_rebuilt() {
        // An AArch64 PIE's segments in its objcopy --only-keep-debug file:
        // the code segment keeps its headers (0x298 of 0x1078 bytes), the
        // writable one is aligned to 64 KiB (at 0xfdc8 in the binary).
        let seg = |vaddr, file_size, x| Segment {
            file_offset: 0,
            vaddr,
            file_size,
            executable: x,
        };
        let mut segs = vec![
            (seg(0, 0x298, true), 0x1078, 0x10000),
            (seg(0x1fdc8, 0, false), 0x2c8, 0x10000),
        ];
        reconstruct_offsets(&mut segs);
        let got: Vec<(u64, u64)> = segs
            .iter()
            .map(|(s, _, _)| (s.file_offset, s.file_size))
            .collect();
        assert_eq!(got, vec![(0, 0x1078), (0xfdc8, 0x2c8)]);
        let segs: Vec<Segment> = segs.into_iter().map(|(s, _, _)| s).collect();
        assert_eq!(file_to_virt(&segs, 0xc60), Some(0xc60));
    }

    #[test]
    fn inspects_libc() {
        let Ok(i) = inspect(Path::new("/proc/self/exe")) else {
            return;
        };
        assert!(i.segments.iter().any(|s| s.executable));
    }
}
