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
    let mut segments: Vec<(Segment, u64)> = obj
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
            (seg, s.size())
        })
        .collect();
    if segments
        .iter()
        .any(|(s, mem)| s.executable && s.file_size == 0 && *mem > 0)
    {
        reconstruct_offsets(&mut segments);
    }
    let segments = segments.into_iter().map(|(s, _)| s).collect();
    let has_debug_info = obj.section_by_name(".debug_info").is_some();
    let has_symbols = has_debug_info || obj.section_by_name(".symtab").is_some();
    Ok(ElfSummary {
        build_id,
        segments,
        has_symbols,
        has_debug_info,
    })
}

/// A separate debug file (objcopy --only-keep-debug, distribution -dbg
/// packages) keeps the program headers' addresses but not their file
/// offsets. Linkers lay segments out in order, each at the first file
/// offset past the previous one that is congruent to its address modulo
/// the page size (what mmap needs), and the segments before the writable
/// one hold no bss; that gives back the original offsets of the segments
/// code lives in.
fn reconstruct_offsets(segs: &mut [(Segment, u64)]) {
    const PAGE: u64 = 0x1000;
    let mut next = 0u64;
    for (i, (s, mem)) in segs.iter_mut().enumerate() {
        let want = s.vaddr % PAGE;
        let off = if i == 0 {
            want
        } else {
            let base = next - next % PAGE + want;
            if base >= next {
                base
            } else {
                base + PAGE
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

#[cfg(test)]
mod tests {
    use super::*;

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
            (seg(0, false), 0x25388),
            (seg(0x26000, true), 0x1550fc),
            (seg(0x17c000, false), 0x52c31),
        ];
        reconstruct_offsets(&mut segs);
        let offs: Vec<u64> = segs.iter().map(|(s, _)| s.file_offset).collect();
        assert_eq!(offs, vec![0, 0x26000, 0x17c000]);
    }

    #[test]
    fn inspects_libc() {
        let Ok(i) = inspect(Path::new("/proc/self/exe")) else {
            return;
        };
        assert!(i.segments.iter().any(|s| s.executable));
    }
}
