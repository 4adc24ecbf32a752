// SPDX-License-Identifier: GPL-2.0
//! Go's own symbol table (`.gopclntab`): names, lines and inlined calls of
//! Go binaries (bpfscope's symbolizer), and the stack-pointer deltas Go's
//! own unwinder uses (bpfscope's unwind tables).
//!
//! Go keeps its own symbol/line table (pclntab) in every binary because the
//! runtime needs it for stack traces and GC; `-ldflags=-s -w` strips `.symtab`
//! and DWARF but not this table, so it is the only reliable source of names and
//! lines for stripped Go programs.
//!
//! Layout notes (written from Go's `debug/gosym/pclntab.go` and
//! `runtime/symtab.go`, not copied):
//! * header: magic u32, two zero pad bytes, pc quantum u8, pointer size u8,
//!   then pointer-sized words (counts and offsets relative to the header).
//! * functab: sorted (entry, funcoff) pairs followed by the end pc.
//! * `_func` records hold offsets of pc-value tables (pcfile, pcln, pcdata),
//!   which are sequences of (zig-zag value delta, pc delta) varints.
//! * file names: pcfile value indexes the function's compilation-unit slice of
//!   `cutab` (1.16+), which holds offsets into `filetab`.
//!
//! Addresses are ELF virtual addresses (unrelocated); for return addresses the
//! caller should pass `pc - 1` so the call instruction's line is reported.

use std::borrow::Cow;

use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol};

/// Table versions by header magic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Version {
    /// 0xfffffffb: Go 1.2 – 1.15.
    V12,
    /// 0xfffffffa: Go 1.16 – 1.17.
    V116,
    /// 0xfffffff0: Go 1.18 – 1.19.
    V118,
    /// 0xfffffff1: Go 1.20 and later.
    V120,
}

impl Version {
    fn from_magic(m: u32) -> Option<Version> {
        match m {
            0xffff_fffb => Some(Version::V12),
            0xffff_fffa => Some(Version::V116),
            0xffff_fff0 => Some(Version::V118),
            0xffff_fff1 => Some(Version::V120),
            _ => None,
        }
    }
}

// Runtime constants (stable since Go 1.12).
const PCDATA_INL_TREE_INDEX: u32 = 2;
const FUNCDATA_INL_TREE: u8 = 3;
/// Guards the inline walk against cycles in garbled trees.
const MAX_INLINE_DEPTH: usize = 64;

/// One symbolized pc.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoFrame<'a> {
    /// Name of the physical (outermost, non-inlined) function, as in `.symtab`.
    pub name: Cow<'a, str>,
    /// Source file of the pc itself (innermost position, inlined code included),
    /// as `go tool addr2line` reports it.
    pub file: Option<String>,
    /// Source line of the pc (same convention as `file`).
    pub line: Option<u32>,
    /// Entry address of the physical function.
    pub func_start: u64,
    /// Inlined calls active at this pc, innermost first. `inlined[0].name` is
    /// the function whose body `file:line` is in; each entry's call site is in
    /// the next entry's function, the last one's in `name`. Empty when the pc
    /// is not in inlined code or the inline tree is unavailable (see
    /// [`GoTable::has_inline_info`]).
    pub inlined: Vec<GoInlined<'a>>,
}

/// A function inlined at the looked-up pc.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoInlined<'a> {
    pub name: Cow<'a, str>,
    /// Where this function was inlined into its caller.
    pub call_file: Option<String>,
    pub call_line: Option<u32>,
}

/// Iterator over a pc-value table (`GoTable::pcvalue_steps`).
struct PcValueSteps<'a> {
    b: &'a [u8],
    pos: usize,
    val: i32,
    cur: u64,
    first: bool,
    quantum: u64,
    done: bool,
}

impl Iterator for PcValueSteps<'_> {
    type Item = Option<(u64, u64, i32)>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let step = (|| {
            let uv = varint(self.b, &mut self.pos)?;
            if uv == 0 && !self.first {
                return Some(None);
            }
            self.first = false;
            let delta = ((uv >> 1) as i32) ^ -((uv & 1) as i32);
            self.val = self.val.wrapping_add(delta);
            let pcd = u64::from(varint(self.b, &mut self.pos)?);
            let start = self.cur;
            self.cur = self.cur.checked_add(pcd.checked_mul(self.quantum)?)?;
            Some(Some((start, self.cur, self.val)))
        })();
        match step {
            Some(Some(s)) => Some(Some(s)),
            // The end marker.
            Some(None) => {
                self.done = true;
                None
            }
            // Malformed: said once, then nothing more.
            None => {
                self.done = true;
                Some(None)
            }
        }
    }
}

/// A pc range of a function and its stack-pointer delta (pcsp).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpRange {
    /// The function's entry.
    pub func: u64,
    pub start: u64,
    pub end: u64,
    /// Bytes below the return address: the CFA is RSP + sp_delta + 8
    /// (pointer size) on amd64.
    pub sp_delta: i32,
}

/// A parsed pclntab. Owns copies of the bytes it needs so the ELF image can be
/// dropped after [`GoTable::parse`].
pub struct GoTable {
    version: Version,
    big_endian: bool,
    ptr_size: usize,
    quantum: u64,
    /// The whole pclntab, starting at its header.
    tab: Vec<u8>,
    nfunc: usize,
    /// Functab entries are offsets from this for 1.18+, absolute before.
    text_start: u64,
    funcname_off: usize,
    cutab_off: usize,
    filetab_off: usize,
    pctab_off: usize,
    /// Start of functab; `_func` offsets are relative to it (1.16+) or to the
    /// table start (1.2).
    functab_off: usize,
    /// 1.2 only: offset of the file table (u32 count, then u32 name offsets).
    v12_filetab: usize,
    v12_nfiles: usize,
    /// Memory holding inline trees: (vaddr of byte 0, bytes). For 1.18+ byte 0
    /// is `moduledata.gofunc`, the base of the u32 funcdata offsets.
    inl_mem: Option<(u64, Vec<u8>)>,
}

/// Decoded fixed part of a `_func` record.
#[derive(Clone, Copy)]
struct Func {
    /// Offset of the record in `tab`.
    off: usize,
    entry: u64,
    nameoff: u32,
    pcsp: u32,
    pcfile: u32,
    pcln: u32,
    npcdata: u32,
    cu_offset: u32,
    nfuncdata: u8,
    /// Size of the fixed part; pcdata offsets follow it.
    fixed: usize,
}

/// Little/big-endian readers over a byte slice; all bounds-checked.
fn rd_u32(b: &[u8], off: usize, be: bool) -> Option<u32> {
    let s: [u8; 4] = b.get(off..off.checked_add(4)?)?.try_into().ok()?;
    Some(if be {
        u32::from_be_bytes(s)
    } else {
        u32::from_le_bytes(s)
    })
}

fn rd_u64(b: &[u8], off: usize, be: bool) -> Option<u64> {
    let s: [u8; 8] = b.get(off..off.checked_add(8)?)?.try_into().ok()?;
    Some(if be {
        u64::from_be_bytes(s)
    } else {
        u64::from_le_bytes(s)
    })
}

fn rd_ptr(b: &[u8], off: usize, ptr: usize, be: bool) -> Option<u64> {
    if ptr == 8 {
        rd_u64(b, off, be)
    } else {
        rd_u32(b, off, be).map(u64::from)
    }
}

/// Go's uint32 varint (LEB128); longer encodings are treated as corrupt.
fn varint(b: &[u8], pos: &mut usize) -> Option<u32> {
    let mut v: u32 = 0;
    for shift in (0..35).step_by(7) {
        let byte = *b.get(*pos)?;
        *pos += 1;
        v |= u32::from(byte & 0x7f).checked_shl(shift)?;
        if byte & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

fn usize_of(v: u64) -> Option<usize> {
    usize::try_from(v).ok()
}

/// Address-space view of the ELF used only while parsing.
struct Image<'d> {
    regions: Vec<Region<'d>>,
    /// RELATIVE dynamic relocations (place, addend), sorted by place: an
    /// external linker may leave pointer slots zero in the file and put the
    /// value only in the relocation.
    relocs: Vec<(u64, u64)>,
    /// Regions are segments because the file has no section headers.
    from_segments: bool,
    ptr_size: usize,
    big_endian: bool,
}

struct Region<'d> {
    addr: u64,
    data: &'d [u8],
    writable: bool,
}

impl<'d> Image<'d> {
    fn new(file: &object::File<'d>) -> Image<'d> {
        let mut regions = Vec::new();
        for s in file.sections() {
            let writable = match s.flags() {
                object::SectionFlags::Elf { sh_flags, .. } => sh_flags.0 & 1 != 0, // SHF_WRITE
                _ => false,
            };
            if s.address() == 0 {
                continue; // not loaded
            }
            if let Some(data) = s.data().ok().filter(|d| !d.is_empty()) {
                regions.push(Region {
                    addr: s.address(),
                    data,
                    writable,
                });
            }
        }
        let from_segments = regions.is_empty();
        if from_segments {
            // Section headers removed: fall back to loadable segments.
            for seg in file.segments() {
                let writable = match seg.flags() {
                    object::SegmentFlags::Elf { p_flags, .. } => p_flags.0 & 2 != 0, // PF_W
                    _ => false,
                };
                if let Some(data) = seg.data().ok().filter(|d| !d.is_empty()) {
                    regions.push(Region {
                        addr: seg.address(),
                        data,
                        writable,
                    });
                }
            }
        }
        let relative = match file.architecture() {
            object::Architecture::X86_64 => Some(8), // R_X86_64_RELATIVE
            object::Architecture::Aarch64 => Some(1027), // R_AARCH64_RELATIVE
            object::Architecture::PowerPc64 => Some(22), // R_PPC64_RELATIVE
            object::Architecture::S390x => Some(12), // R_390_RELATIVE
            object::Architecture::Riscv64 => Some(3), // R_RISCV_RELATIVE
            object::Architecture::LoongArch64 => Some(3), // R_LARCH_RELATIVE
            _ => None, // 32-bit targets use REL: the value is in place already
        };
        let mut relocs = Vec::new();
        if let (Some(rel), Some(iter)) = (relative, file.dynamic_relocations()) {
            for (place, r) in iter {
                if let object::RelocationFlags::Elf { r_type } = r.flags() {
                    if r_type.0 == rel {
                        relocs.push((place, r.addend() as u64));
                    }
                }
            }
            relocs.sort_unstable();
        }
        Image {
            regions,
            relocs,
            from_segments,
            ptr_size: if file.is_64() { 8 } else { 4 },
            big_endian: !file.is_little_endian(),
        }
    }

    fn region_of(&self, vaddr: u64) -> Option<&Region<'d>> {
        self.regions
            .iter()
            .find(|r| vaddr >= r.addr && vaddr - r.addr < r.data.len() as u64)
    }

    /// Bytes from `vaddr` to the end of its region.
    fn bytes_at(&self, vaddr: u64) -> Option<&'d [u8]> {
        let r = self.region_of(vaddr)?;
        r.data.get(usize_of(vaddr - r.addr)?..)
    }

    fn reloc_at(&self, vaddr: u64) -> Option<u64> {
        let i = self.relocs.binary_search_by_key(&vaddr, |&(p, _)| p).ok()?;
        self.relocs.get(i).map(|&(_, a)| a)
    }

    /// A pointer-sized word, preferring a RELATIVE relocation's addend when the
    /// file holds zero.
    fn ptr(&self, vaddr: u64) -> Option<u64> {
        let v = rd_ptr(self.bytes_at(vaddr)?, 0, self.ptr_size, self.big_endian)?;
        if v == 0 {
            return self.reloc_at(vaddr).or(Some(0));
        }
        Some(v)
    }
}

impl GoTable {
    /// From an ELF file's bytes: None when it has no usable `.gopclntab` (not
    /// Go, or an unsupported version).
    pub fn parse(elf: &[u8]) -> Option<GoTable> {
        let file = object::File::parse(elf).ok()?;
        if file.format() != object::BinaryFormat::Elf {
            return None;
        }
        // Files with section headers and none of a Go linker's are not Go:
        // said before `Image` reads every dynamic relocation (a C++ or Rust
        // library has tens of MB of them).
        let loaded = file
            .sections()
            .any(|s| s.address() != 0 && s.data().is_ok_and(|d| !d.is_empty()));
        if loaded && !made_by_go(&file) {
            return None;
        }
        let img = Image::new(&file);
        let hint = || text_hint(&file);
        let (tab_vaddr, mut t) = match find_pclntab(&file, &img) {
            Some((va, tab)) => (va, GoTable::from_pclntab(tab, va, &img, &hint)?),
            // Scanning is for stripped-of-section-headers files only: other
            // non-Go ELFs should be rejected without reading all their bytes.
            None if img.from_segments => scan_for_pclntab(&img, &hint)?,
            None => return None,
        };
        t.inl_mem = t.find_inline_memory(&img, &file, tab_vaddr);
        Some(t)
    }

    /// Go version family detected, for messages.
    pub fn format(&self) -> &'static str {
        match self.version {
            Version::V12 => "1.2-1.15",
            Version::V116 => "1.16-1.17",
            Version::V118 => "1.18-1.19",
            Version::V120 => "1.20+",
        }
    }

    /// Whether inlined frames can be reported (inline tree memory was found).
    pub fn has_inline_info(&self) -> bool {
        self.inl_mem.is_some()
    }

    /// Number of functions in the table.
    pub fn func_count(&self) -> usize {
        self.nfunc
    }

    /// `[start, end)` of the code the table covers.
    pub fn text_range(&self) -> Option<(u64, u64)> {
        Some((self.entry(0)?, self.entry(self.nfunc)?))
    }

    /// Every function's stack-pointer deltas (its pcsp table): per pc range
    /// `[start, end)`, the bytes the function has taken below its return
    /// address. Go's code has no CFI; this is how Go's runtime unwinds it,
    /// and frame pointers alone lose the caller of a leaf that has no frame.
    /// In address order; functions whose table cannot be read are left out.
    pub fn sp_deltas(&self) -> Vec<SpRange> {
        let mut out = Vec::new();
        for i in 0..self.nfunc {
            let (Some(f), Some(end)) = (self.func(i), self.entry(i + 1)) else {
                continue;
            };
            let before = out.len();
            if self
                .pcvalue_ranges(f.pcsp, f.entry, end, &mut out)
                .is_none()
            {
                out.truncate(before);
            }
        }
        out
    }

    /// Appends every `[start, end, value)` of a pc-value table, up to `end`.
    fn pcvalue_ranges(
        &self,
        table_off: u32,
        entry: u64,
        end: u64,
        out: &mut Vec<SpRange>,
    ) -> Option<()> {
        for step in self.pcvalue_steps(table_off, entry)? {
            let (start, next, val) = step?;
            if start >= end {
                break;
            }
            if next > start {
                out.push(SpRange {
                    func: entry,
                    start,
                    end: next.min(end),
                    sp_delta: val,
                });
            }
            if next >= end {
                break;
            }
        }
        Some(())
    }

    /// All functions as (entry address, name), in address order.
    pub fn functions(&self) -> impl Iterator<Item = (u64, Cow<'_, str>)> + '_ {
        (0..self.nfunc).filter_map(move |i| {
            let f = self.func(i)?;
            Some((f.entry, self.name(f.nameoff)?))
        })
    }

    /// The function containing a virtual address (ELF vaddr, not file
    /// offset), with the file and line of that pc.
    pub fn lookup(&self, vaddr: u64) -> Option<GoFrame<'_>> {
        let i = self.find_index(vaddr)?;
        let f = self.func(i)?;
        let name = self.name(f.nameoff)?;
        let (file, line) = self.file_line(&f, vaddr);
        let inlined = self.inlined(&f, vaddr);
        Some(GoFrame {
            name,
            file,
            line,
            func_start: f.entry,
            inlined,
        })
    }

    /// Name and entry of the function containing `vaddr`, without decoding
    /// line tables (a binary search and a string read).
    pub fn function_at(&self, vaddr: u64) -> Option<(u64, Cow<'_, str>)> {
        let f = self.func(self.find_index(vaddr)?)?;
        Some((f.entry, self.name(f.nameoff)?))
    }

    // ---- construction ----

    fn from_pclntab(
        tab: &[u8],
        tab_vaddr: u64,
        img: &Image,
        text_hint: &dyn Fn() -> Option<u64>,
    ) -> Option<GoTable> {
        let hdr = tab.get(..8)?;
        let (version, big_endian) = match (
            Version::from_magic(u32::from_le_bytes([hdr[0], hdr[1], hdr[2], hdr[3]])),
            Version::from_magic(u32::from_be_bytes([hdr[0], hdr[1], hdr[2], hdr[3]])),
        ) {
            (Some(v), _) => (v, false),
            (None, Some(v)) => (v, true),
            _ => return None,
        };
        // Pad bytes are zero; quantum is 1 (x86), 2 (s390x) or 4 (RISC).
        if hdr[4] != 0 || hdr[5] != 0 || !matches!(hdr[6], 1 | 2 | 4) || !matches!(hdr[7], 4 | 8) {
            return None;
        }
        let quantum = u64::from(hdr[6]);
        let ptr = usize::from(hdr[7]);
        let be = big_endian;
        let word = |i: usize| -> Option<usize> { usize_of(rd_ptr(tab, 8 + i * ptr, ptr, be)?) };

        let mut t = GoTable {
            version,
            big_endian,
            ptr_size: ptr,
            quantum,
            tab: Vec::new(),
            nfunc: word(0)?,
            text_start: 0,
            funcname_off: 0,
            cutab_off: 0,
            filetab_off: 0,
            pctab_off: 0,
            functab_off: 0,
            v12_filetab: 0,
            v12_nfiles: 0,
            inl_mem: None,
        };
        match version {
            Version::V12 => {
                t.functab_off = 8 + ptr;
                let ft_len = t.nfunc.checked_mul(2)?.checked_add(1)?.checked_mul(ptr)?;
                let fo = rd_u32(tab, t.functab_off.checked_add(ft_len)?, be)?;
                t.v12_filetab = usize_of(u64::from(fo))?;
                t.v12_nfiles = usize_of(u64::from(rd_u32(tab, t.v12_filetab, be)?))?;
            }
            Version::V116 => {
                t.funcname_off = word(2)?;
                t.cutab_off = word(3)?;
                t.filetab_off = word(4)?;
                t.pctab_off = word(5)?;
                t.functab_off = word(6)?;
            }
            Version::V118 | Version::V120 => {
                t.funcname_off = word(3)?;
                t.cutab_off = word(4)?;
                t.filetab_off = word(5)?;
                t.pctab_off = word(6)?;
                t.functab_off = word(7)?;
                // textStart is runtime.text; it may be an unapplied dynamic
                // relocation (zero in the file) in PIE, hence the fallbacks.
                let field = tab_vaddr.checked_add(8 + 2 * ptr as u64)?;
                t.text_start = match rd_ptr(tab, 8 + 2 * ptr, ptr, be)? {
                    0 => img.reloc_at(field).or_else(text_hint)?,
                    v => v,
                };
            }
        }
        if t.nfunc == 0 {
            return None;
        }
        // Functab, then the end sentinel, must fit.
        let fs = t.functab_field();
        let ft_end = t
            .nfunc
            .checked_mul(2)?
            .checked_add(1)?
            .checked_mul(fs)?
            .checked_add(t.functab_off)?;
        if ft_end > tab.len()
            || t.funcname_off > tab.len()
            || t.cutab_off > tab.len()
            || t.filetab_off > tab.len()
            || t.pctab_off > tab.len()
        {
            return None;
        }
        t.tab = tab.to_vec();
        // Lookups binary-search the entries, so insist they are sorted and
        // that every record offset is in range; O(n) and cheap.
        let mut prev = 0u64;
        for i in 0..=t.nfunc {
            let e = t.entry(i)?;
            if e < prev {
                return None;
            }
            prev = e;
            if i < t.nfunc {
                t.func_off(i)?;
            }
        }
        Some(t)
    }

    /// Locates memory holding inline trees (funcdata targets).
    fn find_inline_memory(
        &self,
        img: &Image,
        file: &object::File,
        tab_vaddr: u64,
    ) -> Option<(u64, Vec<u8>)> {
        match self.version {
            Version::V12 => None, // inline records of these versions are not decoded
            Version::V116 => {
                // Funcdata are absolute pointers: copy the region holding the
                // first inline tree found (Go puts them all in go.func.*).
                let p = (0..self.nfunc).find_map(|i| {
                    let f = self.func(i)?;
                    self.funcdata_ptr(&f, FUNCDATA_INL_TREE).filter(|&p| p != 0)
                })?;
                let r = img.region_of(p)?;
                Some((r.addr, cap_before(r.addr, r.data, tab_vaddr).to_vec()))
            }
            Version::V118 | Version::V120 => {
                let gofunc = self.find_gofunc(img, tab_vaddr).or_else(|| {
                    // Unstripped binaries name it directly.
                    file.symbols()
                        .find(|s| matches!(s.name(), Ok("go:func.*") | Ok("go.func.*")))
                        .map(|s| s.address())
                })?;
                let data = img.bytes_at(gofunc)?;
                Some((gofunc, cap_before(gofunc, data, tab_vaddr).to_vec()))
            }
        }
    }

    /// Finds `runtime.firstmoduledata` by its first field (a pointer to the
    /// pclntab header) and returns its `gofunc` field.
    fn find_gofunc(&self, img: &Image, tab_vaddr: u64) -> Option<u64> {
        let ptr = img.ptr_size;
        if ptr != self.ptr_size {
            return None;
        }
        let mut cands: Vec<u64> = Vec::new();
        for r in img.regions.iter().filter(|r| r.writable) {
            let mis = (ptr as u64 - r.addr % ptr as u64) % ptr as u64;
            let mut off = mis as usize;
            while off + ptr <= r.data.len() {
                if rd_ptr(r.data, off, ptr, img.big_endian) == Some(tab_vaddr) {
                    cands.push(r.addr.wrapping_add(off as u64));
                }
                off += ptr;
            }
        }
        cands.extend(
            img.relocs
                .iter()
                .filter(|&&(_, a)| a == tab_vaddr)
                .map(|&(p, _)| p),
        );
        let at = |md: u64, i: u64| img.ptr(md.checked_add(i * ptr as u64)?);
        // Word indices in moduledata: slices take three words; 1.20 inserted
        // covctrs/ecovctrs before `end`, moving gofunc from 38 to 40.
        let gofunc_idx = if self.version == Version::V120 {
            40
        } else {
            38
        };
        cands.into_iter().find_map(|md| {
            let ok = at(md, 1)? == tab_vaddr.checked_add(self.funcname_off as u64)?
                && at(md, 16)? == tab_vaddr.checked_add(self.functab_off as u64)?
                && at(md, 22)? == self.text_start;
            if !ok {
                return None;
            }
            let rodata = at(md, gofunc_idx - 1)?;
            let gofunc = at(md, gofunc_idx)?;
            (gofunc >= rodata && gofunc != 0).then_some(gofunc)
        })
    }

    // ---- table access ----

    fn functab_field(&self) -> usize {
        if self.version >= Version::V118 {
            4
        } else {
            self.ptr_size
        }
    }

    /// Entry pc of function `i`; `i == nfunc` gives the end of text.
    fn entry(&self, i: usize) -> Option<u64> {
        let fs = self.functab_field();
        let off = self.functab_off.checked_add(i.checked_mul(2 * fs)?)?;
        if self.version >= Version::V118 {
            self.text_start
                .checked_add(u64::from(rd_u32(&self.tab, off, self.big_endian)?))
        } else {
            rd_ptr(&self.tab, off, self.ptr_size, self.big_endian)
        }
    }

    /// Offset of function `i`'s `_func` record in `tab`, with its fixed part
    /// known to be in bounds.
    fn func_off(&self, i: usize) -> Option<usize> {
        let fs = self.functab_field();
        let at = self
            .functab_off
            .checked_add(i.checked_mul(2 * fs)?.checked_add(fs)?)?;
        let rel = usize_of(rd_ptr(&self.tab, at, fs, self.big_endian)?)?;
        let base = if self.version == Version::V12 {
            0
        } else {
            self.functab_off
        };
        let off = base.checked_add(rel)?;
        if off.checked_add(self.func_fixed_size())? > self.tab.len() {
            return None;
        }
        Some(off)
    }

    fn func_fixed_size(&self) -> usize {
        match self.version {
            // entry + 8 u32 fields (the 1.2 record has no cuOffset but the
            // nfuncdata u32 in that slot).
            Version::V12 => self.ptr_size + 32,
            Version::V116 => self.ptr_size + 36,
            Version::V118 => 40,
            Version::V120 => 44,
        }
    }

    fn func(&self, i: usize) -> Option<Func> {
        let off = self.func_off(i)?;
        let be = self.big_endian;
        let first = if self.version >= Version::V118 {
            4
        } else {
            self.ptr_size
        };
        // Fields after the entry, numbered from 1 as in the runtime's struct.
        let field = |n: usize| rd_u32(&self.tab, off + first + (n - 1) * 4, be);
        let fixed = self.func_fixed_size();
        let (cu_offset, nfuncdata) = match self.version {
            Version::V12 => (0, 0),
            _ => (field(8)?, *self.tab.get(off + fixed - 1)?),
        };
        Some(Func {
            off,
            entry: self.entry(i)?,
            nameoff: field(1)?,
            pcsp: field(4)?,
            pcfile: field(5)?,
            pcln: field(6)?,
            npcdata: field(7)?,
            cu_offset,
            nfuncdata,
            fixed,
        })
    }

    /// Largest index whose entry is <= pc, if pc is before the end of text.
    fn find_index(&self, pc: u64) -> Option<usize> {
        if pc < self.entry(0)? || pc >= self.entry(self.nfunc)? {
            return None;
        }
        let (mut lo, mut hi) = (0usize, self.nfunc);
        // Invariant: entry(lo) <= pc < entry(hi).
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if self.entry(mid)? <= pc {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        Some(lo)
    }

    fn cstr_at(&self, off: usize) -> Option<Cow<'_, str>> {
        let rest = self.tab.get(off..)?;
        let len = rest.iter().position(|&b| b == 0)?;
        Some(String::from_utf8_lossy(&rest[..len]))
    }

    fn name(&self, nameoff: u32) -> Option<Cow<'_, str>> {
        self.cstr_at(
            self.funcname_off
                .checked_add(usize_of(u64::from(nameoff))?)?,
        )
    }

    /// Value of the pc-value table at `table_off` for `pc` in a function
    /// starting at `entry`.
    fn pcvalue(&self, table_off: u32, entry: u64, pc: u64) -> Option<i32> {
        for step in self.pcvalue_steps(table_off, entry)? {
            let (_, end, val) = step?;
            if pc < end {
                return Some(val);
            }
        }
        None // end of table before reaching pc
    }

    /// The steps of a pc-value table as `[start, end, value)`: values start
    /// at -1; each step adds a zig-zag delta and advances the pc by `delta
    /// * quantum`. An item is None where the table is malformed.
    fn pcvalue_steps(&self, table_off: u32, entry: u64) -> Option<PcValueSteps<'_>> {
        if table_off == 0 {
            return None; // no table
        }
        let b = self.tab.get(
            self.pctab_off
                .checked_add(usize_of(u64::from(table_off))?)?..,
        )?;
        Some(PcValueSteps {
            b,
            pos: 0,
            val: -1,
            cur: entry,
            first: true,
            quantum: self.quantum,
            done: false,
        })
    }

    fn file_name(&self, f: &Func, fileno: i32) -> Option<String> {
        let fno = usize::try_from(fileno).ok()?;
        let be = self.big_endian;
        let off = if self.version == Version::V12 {
            // Index 0 of the 1.2 file table is the count, not a file.
            if fno == 0 || fno >= self.v12_nfiles {
                return None;
            }
            usize_of(u64::from(rd_u32(
                &self.tab,
                self.v12_filetab.checked_add(fno * 4)?,
                be,
            )?))?
        } else {
            let idx = usize_of(u64::from(f.cu_offset))?.checked_add(fno)?;
            let o = rd_u32(
                &self.tab,
                self.cutab_off.checked_add(idx.checked_mul(4)?)?,
                be,
            )?;
            if o == u32::MAX {
                return None; // file unused in this CU
            }
            self.filetab_off.checked_add(usize_of(u64::from(o))?)?
        };
        self.cstr_at(off).map(Cow::into_owned)
    }

    fn file_line(&self, f: &Func, pc: u64) -> (Option<String>, Option<u32>) {
        let file = self
            .pcvalue(f.pcfile, f.entry, pc)
            .and_then(|n| self.file_name(f, n));
        let line = self
            .pcvalue(f.pcln, f.entry, pc)
            .and_then(|l| u32::try_from(l).ok());
        (file, line)
    }

    fn pcdata_off(&self, f: &Func, i: u32) -> Option<u32> {
        if i >= f.npcdata {
            return None;
        }
        rd_u32(
            &self.tab,
            f.off
                .checked_add(f.fixed)?
                .checked_add(usize_of(u64::from(i))? * 4)?,
            self.big_endian,
        )
    }

    /// Address of funcdata slot `i`, or 0 when absent.
    fn funcdata_ptr(&self, f: &Func, i: u8) -> Option<u64> {
        if i >= f.nfuncdata {
            return None;
        }
        let be = self.big_endian;
        let start = f
            .off
            .checked_add(f.fixed)?
            .checked_add(usize_of(u64::from(f.npcdata))?.checked_mul(4)?)?;
        match self.version {
            Version::V12 => None,
            Version::V116 => {
                // Pointer array aligned to the pointer size; record offsets
                // are pointer-aligned, so aligning the offset is equivalent.
                let p = self.ptr_size;
                let start = start.checked_add((p - start % p) % p)?;
                rd_ptr(&self.tab, start.checked_add(usize::from(i) * p)?, p, be)
            }
            Version::V118 | Version::V120 => {
                let o = rd_u32(&self.tab, start.checked_add(usize::from(i) * 4)?, be)?;
                if o == u32::MAX {
                    return Some(0);
                }
                let (base, _) = self.inl_mem.as_ref()?;
                base.checked_add(u64::from(o))
            }
        }
    }

    /// Inline frames at `pc`, innermost first, following each record's
    /// parentPc back to the physical function.
    fn inlined(&self, f: &Func, pc: u64) -> Vec<GoInlined<'_>> {
        let mut out = Vec::new();
        let (Some((base, mem)), Some(idx_tab)) = (
            self.inl_mem.as_ref(),
            self.pcdata_off(f, PCDATA_INL_TREE_INDEX),
        ) else {
            return out;
        };
        let Some(tree) = self.funcdata_ptr(f, FUNCDATA_INL_TREE).filter(|&p| p != 0) else {
            return out;
        };
        let Some(tree_off) = tree.checked_sub(*base).and_then(usize_of) else {
            return out;
        };
        let be = self.big_endian;
        // Record layout: 1.20+ {funcID u8, pad, nameOff i32, parentPc i32,
        // startLine i32}; before {parent i16, funcID u8, pad, file i32,
        // line i32, func_ i32, parentPc i32}.
        let (size, name_at, parent_at) = if self.version == Version::V120 {
            (16, 4, 8)
        } else {
            (20, 12, 16)
        };
        let mut cur = pc;
        while out.len() < MAX_INLINE_DEPTH {
            let Some(ix) = self
                .pcvalue(idx_tab, f.entry, cur)
                .and_then(|v| usize::try_from(v).ok())
            else {
                break;
            };
            let field = |at: usize| {
                rd_u32(
                    mem,
                    ix.checked_mul(size)?
                        .checked_add(tree_off)?
                        .checked_add(at)?,
                    be,
                )
            };
            let (Some(nameoff), Some(parent_pc)) = (field(name_at), field(parent_at)) else {
                break;
            };
            // parent_pc is an offset from the physical function's entry.
            let caller_pc = f.entry.saturating_add(u64::from(parent_pc));
            let (call_file, call_line) = self.file_line(f, caller_pc);
            let name = self.name(nameoff).unwrap_or(Cow::Borrowed("?"));
            out.push(GoInlined {
                name,
                call_file,
                call_line,
            });
            cur = caller_pc;
        }
        out
    }
}

/// Stops a copied region at `stop` when it lies inside it, so copying inline
/// memory from a whole segment does not duplicate the pclntab.
fn cap_before(addr: u64, data: &[u8], stop: u64) -> &[u8] {
    if let Some(n) = (stop > addr)
        .then(|| usize::try_from(stop - addr).ok())
        .flatten()
        .filter(|&n| n < data.len())
    {
        return &data[..n];
    }
    data
}

/// Candidate text start when the header's field is unusable: `runtime.text`
/// or the `.text` section.
fn text_hint(file: &object::File) -> Option<u64> {
    file.symbols()
        .find(|s| s.name() == Ok("runtime.text"))
        .map(|s| s.address())
        .or_else(|| file.section_by_name(".text").map(|s| s.address()))
}

/// A Go linker's sections (`.gopclntab`, `.go.buildinfo`,
/// `.note.go.buildid`, `.gosymtab`...), which every Go ELF file with
/// section headers has.
fn made_by_go(file: &object::File) -> bool {
    file.sections().any(|s| {
        s.name().is_ok_and(|n| {
            n.ends_with("gopclntab")
                || n.ends_with("gosymtab")
                || n.ends_with(".go.buildinfo")
                || matches!(
                    n,
                    ".note.go.buildid" | ".noptrdata" | ".typelink" | ".itablink"
                )
        })
    })
}

/// Finds the pclntab by section name, else by the `runtime.pclntab` symbol.
fn find_pclntab<'d>(file: &object::File<'d>, img: &Image<'d>) -> Option<(u64, &'d [u8])> {
    // PIE builds name it .data.rel.ro.gopclntab.
    for name in [".gopclntab", ".data.rel.ro.gopclntab"] {
        if let Some(s) = file.section_by_name(name) {
            if let Some(d) = s.data().ok().filter(|d| d.len() >= 16) {
                return Some((s.address(), d));
            }
        }
    }
    // The symbol search reads the whole symbol table: only for files a Go
    // linker made, not every large C++ or Rust library without a table
    // (libLLVM's is 24 MB of names).
    if !made_by_go(file) {
        return None;
    }
    let sym = |n: &str| {
        file.symbols()
            .find(|s| s.name() == Ok(n))
            .map(|s| s.address())
    };
    if let Some(start) = sym("runtime.pclntab") {
        let data = img.bytes_at(start)?;
        let data = match sym("runtime.epclntab") {
            Some(end) if end > start => data.get(..usize_of(end - start)?).unwrap_or(data),
            _ => data,
        };
        return Some((start, data));
    }
    None
}

/// Without section or symbol, looks for a header whose tables check out in
/// the loaded regions (the table is pointer-aligned, so step by 8).
fn scan_for_pclntab(img: &Image, hint: &dyn Fn() -> Option<u64>) -> Option<(u64, GoTable)> {
    const MAGICS: [[u8; 4]; 6] = [
        [0xf1, 0xff, 0xff, 0xff],
        [0xf0, 0xff, 0xff, 0xff],
        [0xfa, 0xff, 0xff, 0xff],
        [0xff, 0xff, 0xff, 0xf1],
        [0xff, 0xff, 0xff, 0xf0],
        [0xff, 0xff, 0xff, 0xfa],
    ];
    for r in &img.regions {
        let mut off = 0usize;
        while off + 16 <= r.data.len() {
            if MAGICS.iter().any(|m| r.data[off..off + 4] == *m) {
                let va = r.addr.wrapping_add(off as u64);
                if let Some(t) = GoTable::from_pclntab(&r.data[off..], va, img, hint) {
                    return Some((va, t));
                }
            }
            off += 8;
        }
    }
    None
}
