//! What bpfscope needs to know about an ELF file: its build id, its loadable
//! segments (to turn the file offsets of build-id stacks into the virtual
//! addresses that debug information is keyed by) and whether it carries
//! symbols at all.

use std::fs::File;
use std::path::Path;

use object::read::ReadCache;
use object::{Object, ObjectSegment, SegmentFlags};

use crate::profile::format::Segment;

#[derive(Debug, Clone, Default)]
pub struct ElfInfo {
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
pub fn inspect(path: &Path) -> Result<ElfInfo, ElfError> {
    let name = || path.display().to_string();
    let f = File::open(path).map_err(|e| ElfError::Io(name(), e))?;
    let cache = ReadCache::new(f);
    let obj = object::File::parse(&cache).map_err(|e| ElfError::Parse(name(), e))?;
    let build_id = obj.build_id().ok().flatten().map(<[u8]>::to_vec);
    let segments = obj
        .segments()
        .map(|s| {
            let (file_offset, file_size) = s.file_range();
            let executable = match s.flags() {
                SegmentFlags::Elf { p_flags, .. } => p_flags.contains(object::elf::PF_X),
                _ => false,
            };
            Segment {
                file_offset,
                vaddr: s.address(),
                file_size,
                executable,
            }
        })
        .collect();
    let has_debug_info = obj.section_by_name(".debug_info").is_some();
    let has_symbols = has_debug_info || obj.section_by_name(".symtab").is_some();
    Ok(ElfInfo {
        build_id,
        segments,
        has_symbols,
        has_debug_info,
    })
}

/// The virtual address of a file offset: through the segment that holds
/// it, else through the executable segment's bias (debug files keep the
/// program headers but may report no file data).
pub fn file_to_virt(segments: &[Segment], off: u64) -> Option<u64> {
    let bias = |s: &Segment| s.vaddr.wrapping_sub(s.file_offset);
    segments
        .iter()
        .find(|s| off >= s.file_offset && off - s.file_offset < s.file_size)
        .or_else(|| segments.iter().find(|s| s.executable))
        .map(|s| off.wrapping_add(bias(s)))
}

/// Build id as lowercase hex.
pub fn hex(id: &[u8]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
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
        assert_eq!(file_to_virt(&segs, 0x9000), Some(0x409000));
        assert_eq!(file_to_virt(&[], 1), None);
    }

    #[test]
    fn inspects_libc() {
        let Ok(i) = inspect(Path::new("/proc/self/exe")) else {
            return;
        };
        assert!(i.segments.iter().any(|s| s.executable));
    }
}
