//! The unwind table compiler: one ELF file's call frame information
//! (`.eh_frame`, and `.debug_frame` where `.eh_frame` says nothing, as in
//! separate debug files) evaluated row by row through gimli and compiled
//! into a compact table sorted by address, for a BPF unwinder to
//! binary-search. x86-64 and AArch64 (the file's architecture decides the
//! rules and their encoding; `Arch`). One table per file, keyed by build
//! id, is shared by every process that maps the file.
//!
//! # The table
//!
//! `to_bytes` writes a header and the entries, all integers little-endian:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | magic `BSUW` |
//! | 4 | 2 | layout version, 1 |
//! | 6 | 2 | entry size, 8 |
//! | 8 | 4 | N, the number of entries |
//! | 12 | 2 | the architecture: its ELF `e_machine`, 62 (x86-64) or 183 (AArch64); 0 reads as x86-64 |
//! | 14 | 2 | reserved, 0 |
//! | 16 | 8 | base: the ELF virtual address entry addresses are relative to (0 unless the file's code lies above 4 GiB) |
//! | 24 | 8 N | the entries, by strictly increasing address |
//!
//! ```c
//! struct bs_unwind_entry {      /* 8 bytes */
//!     __u32 addr;  /* start of the range: ELF virtual address - base */
//!     __u16 arg;   /* the CFA kind's operand */
//!     __u8  kind;  /* bits 0-3 CFA kind, bit 4 signal frame, bit 5 RA undefined, bits 6-7 RBP rule */
//!     __u8  aux;   /* RBP offset / 8 (signed), or the CFA kind's second operand */
//! };
//! ```
//!
//! An entry's range runs up to the next entry's address. To look up an
//! address, take the last entry whose `addr` is at most `vaddr - base`
//! (`lookup_in_bytes` is the reference); none, or a gap, means no rule.
//! The last entry is always a gap, and so is every range between two
//! FDEs, so an address past a function's end never takes the rule of the
//! function before it. Consecutive ranges with the same rule are one entry.
//!
//! CFA kinds (bits 0-3 of `kind`):
//!
//! | kind | name | CFA | `arg` | `aux` |
//! |---|---|---|---|---|
//! | 0 | gap | no FDE covers the range (the whole entry is 0) | 0 | 0 |
//! | 1 | rsp | RSP + arg | offset | RBP rule |
//! | 2 | rsp x8 | RSP + 8 arg (frames of 64 KiB and more) | offset / 8 | RBP rule |
//! | 3 | rbp | RBP + arg | offset | RBP rule |
//! | 4 | register | REG + arg, REG the DWARF register `aux` (< 16): known only in the interrupted frame | offset | register |
//! | 5 | plt | RSP + arg, + 8 if (RIP & 15) >= aux (a 16-byte lazy PLT entry after its push) | offset | threshold |
//! | 6 | deref rsp | *(RSP + 8 (s8)(arg & 0xff)) + 8 (arg >> 8) | both / 8 | RBP rule |
//! | 7 | deref rbp | *(RBP + 8 (s8)(arg & 0xff)) + 8 (arg >> 8) | both / 8 | RBP rule |
//! | 8 | sigcontext | the kernel's signal frame: RSP, RIP, RBP at RSP + 160, 168, 120 | 0 | 0 |
//! | 15 | unsupported | not expressible: stop unwinding | 0 | 0 |
//!
//! Kinds 4 and 5 take `aux` for themselves, so their RBP rule is only ever
//! unchanged or lost.
//!
//! RBP rule (bits 6-7): 0 unchanged, 1 saved at CFA + 8 (s8)aux, 2 saved at
//! RBP + 8 (s8)aux (realigned frames), 3 lost (from here on the caller's
//! RBP is unknown; kinds 8 and 15 carry 3 as well).
//!
//! Unless bit 5 says the return address is undefined (the outermost frame:
//! stop), it is at CFA - 8 (kinds 1-7). Bit 4 marks FDEs whose CIE has the
//! `S` augmentation (signal trampolines).
//!
//! An unwinder looks up the interrupted frame's RIP as it is, and every
//! other frame's return address minus 1 (a call may be a function's last
//! instruction), except the frame right above a signal frame (kind 8),
//! whose RIP was interrupted, not returned to.
//!
//! ## AArch64
//!
//! The same entries and CFA kinds, with SP for RSP and the frame pointer
//! x29 for RBP; kind 4 names x0-x28; kinds 5-7 are not used. Kind 8 is the
//! kernel's signal trampoline in the vDSO: SP points at the signal frame,
//! where x29, x30, SP and PC of the interrupted code are at SP + 544, 552,
//! 560 and 568. Bits 6-7 say where the return address and x29 are,
//! `aux` (signed, times 8) their offset from the CFA:
//!
//! | bits 6-7 | return address | caller's x29 |
//! |---|---|---|
//! | 0 | in x30 (a leaf, a prologue): only the interrupted frame has it | unchanged |
//! | 1 | at CFA + 8 aux + 8 | at CFA + 8 aux (the frame record, `stp x29, x30`) |
//! | 2 | at CFA + 8 aux | unchanged |
//! | 3 | at CFA + 8 aux | lost |
//!
//! Kind 4 takes `aux` for its register, so its return address is in x30.
//! Return addresses read from the stack or x30 may carry a pointer
//! authentication code in their top bits (Debian builds with
//! `-mbranch-protection=standard`): the unwinder clears them.
//!
//! # Measured
//!
//! `cargo run --release -p bpfscope-unwind --example unwind_tables` compiles
//! the tables of every executable file mapped on the machine and compares
//! their entries with readelf's rows.

use std::borrow::Cow;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use gimli::{BaseAddresses, DebugFrame, EhFrame, EhFrameHdr, LittleEndian, Pointer};
use object::elf::{PF_X, PT_GNU_EH_FRAME, PT_LOAD, SHF_EXECINSTR};
use object::read::elf::{ElfFile64, ProgramHeader};
use object::read::{ReadCache, ReadRef};
use object::{
    Architecture, CompressionFormat, Endianness, FileKind, Object, ObjectKind, ObjectSection,
    SectionFlags,
};

mod a64_vdso;
mod cfi;
mod expr;
mod rule;
mod table;

pub use rule::{
    kind, Arch, Cfa, ReturnAddress, Rule, SavedRbp, A64_SIGCONTEXT_PC, A64_SIGCONTEXT_SP,
    A64_SIGCONTEXT_X29, A64_SIGCONTEXT_X30, SIGCONTEXT_RBP, SIGCONTEXT_RIP, SIGCONTEXT_RSP,
};
pub use table::{
    lookup_in_bytes, parse_bytes, Entry, LayoutError, ENTRY_SIZE, HEADER_SIZE, MAGIC, VERSION,
};

use cfi::{Admit, Row};
use table::Rows;

/// A compiled table (see the crate documentation for its layout).
#[derive(Clone, Debug)]
pub struct UnwindTable {
    arch: Arch,
    base: u64,
    entries: Vec<Entry>,
    stats: Stats,
    invalid_cfi: Vec<(u64, u64)>,
}

/// Rows that became `Cfa::Unsupported`, by reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnsupportedRows {
    /// A CFA expression of no known pattern.
    pub cfa_expression: usize,
    /// CFA = a register above r15.
    pub cfa_register: usize,
    /// A CFA offset out of range (negative, or above 65535 and not a
    /// multiple of 8).
    pub cfa_offset: usize,
    /// A return address neither at CFA - 8 nor undefined (kept in a
    /// register, or at an expression).
    pub return_address: usize,
    /// The rest of an FDE from an instruction gimli refuses (DWARF does
    /// not allow DW_CFA_def_cfa_register or _offset after a CFA
    /// expression; hand-written assembly does it).
    pub invalid_cfi: usize,
}

impl UnsupportedRows {
    pub fn total(&self) -> usize {
        self.cfa_expression
            + self.cfa_register
            + self.cfa_offset
            + self.return_address
            + self.invalid_cfi
    }
}

/// What compiling one file found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub cies: usize,
    /// FDEs compiled into the table.
    pub fdes: usize,
    /// Of which from .debug_frame.
    pub debug_frame_fdes: usize,
    /// FDEs whose CIE has the `S` augmentation.
    pub signal_fdes: usize,
    /// FDEs that did not parse (left out: their range is a gap) or whose
    /// evaluation failed part way (the rest is unsupported).
    pub fde_errors: usize,
    /// Entries of a section that did not parse further (the rest of that
    /// section is lost).
    pub cfi_errors: usize,
    /// FDEs covering no address.
    pub empty_fdes: usize,
    /// FDEs outside every executable segment (those of sections the linker
    /// discarded, left at address 0).
    pub fdes_outside_code: usize,
    /// .debug_frame FDEs for code .eh_frame already describes.
    pub debug_frame_shadowed: usize,
    /// Rows starting inside another FDE's range.
    pub overlaps: usize,
    /// .plt.sec/.plt.got stubs without an FDE, given CFA = RSP + 8 (on
    /// AArch64: .plt, the return address in x30).
    pub synthesized_plt: usize,
    /// AArch64's vDSO signal trampoline, described although the vDSO has
    /// no CFI (Debian's arm64 kernels build it without .eh_frame).
    pub synthesized_sigreturn: usize,
    /// Functions of a CFI-less AArch64 vDSO described from their
    /// instructions (`__kernel_clock_gettime` and its like).
    pub synthesized_vdso_functions: usize,
    /// Rows of Go functions, from their stack-pointer deltas (.gopclntab).
    pub go_rows: usize,
    /// CFI rows (address ranges with one rule) of the FDEs compiled.
    pub rows: usize,
    pub plt_rows: usize,
    pub sigcontext_rows: usize,
    /// CFA = RBP + offset.
    pub rbp_cfa_rows: usize,
    pub deref_rows: usize,
    pub register_rows: usize,
    pub unsupported: UnsupportedRows,
    /// Rows whose RBP rule is known but not expressible, stored as lost.
    pub rbp_dropped_rows: usize,
    /// Entries after merging, gaps included.
    pub entries: usize,
    pub gap_entries: usize,
    /// Entries of kind unsupported, and the code bytes they cover.
    pub unsupported_ranges: usize,
    pub unsupported_bytes: u64,
    /// Distinct rule words (gaps excluded): the size a rule table would
    /// have if entries referred to rules by index.
    pub distinct_rules: usize,
    /// `to_bytes().len()`.
    pub bytes: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum UnwindError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: not an ELF file ({source})", path.display())]
    Parse {
        path: PathBuf,
        source: object::Error,
    },
    #[error("{}: {what}, not an x86-64 or AArch64 ELF file", path.display())]
    NotX86_64 { path: PathBuf, what: String },
    #[error("{}: a relocatable object: its addresses are not final", path.display())]
    Relocatable { path: PathBuf },
    #[error("{}: no call frame information (.eh_frame or .debug_frame)", path.display())]
    NoUnwindInfo { path: PathBuf },
    #[error("{}: {section}: {what}", path.display())]
    Section {
        path: PathBuf,
        section: &'static str,
        what: String,
    },
    #[error("{}: code spans {low:#x}..{high:#x}, more than 4 GiB", path.display())]
    AddressSpan { path: PathBuf, low: u64, high: u64 },
}

/// Compiles the unwind table of an ELF file.
pub fn compile(path: &Path) -> Result<UnwindTable, UnwindError> {
    let file = File::open(path).map_err(|source| UnwindError::Io {
        path: path.to_owned(),
        source,
    })?;
    let cache = ReadCache::new(file);
    let collected = collect_rows(&cache, path)?;
    // The sections read (a compiler's .eh_frame is 8 MB) go before the
    // entries are made.
    drop(cache);
    let Collected {
        arch,
        rows,
        stats,
        mut invalid_cfi,
    } = collected;
    let (base, entries, stats) =
        table::build(rows, stats).map_err(|(low, high)| UnwindError::AddressSpan {
            path: path.to_owned(),
            low,
            high,
        })?;
    invalid_cfi.sort_unstable();
    Ok(UnwindTable {
        arch,
        base,
        entries,
        stats,
        invalid_cfi,
    })
}

/// A file's rows, before they are merged into entries.
struct Collected {
    arch: Arch,
    rows: Rows,
    stats: Stats,
    invalid_cfi: Vec<(u64, u64)>,
}

fn collect_rows<'a, R: ReadRef<'a>>(data: R, path: &Path) -> Result<Collected, UnwindError> {
    let parse_err = |source| UnwindError::Parse {
        path: path.to_owned(),
        source,
    };
    let not_x86 = |what: String| UnwindError::NotX86_64 {
        path: path.to_owned(),
        what,
    };
    let section_err = |section: &'static str, what: String| UnwindError::Section {
        path: path.to_owned(),
        section,
        what,
    };
    match FileKind::parse(data).map_err(parse_err)? {
        FileKind::Elf64 => {}
        k => return Err(not_x86(format!("{k:?}"))),
    }
    let elf = ElfFile64::<Endianness, R>::parse(data).map_err(parse_err)?;
    let arch = match elf.architecture() {
        _ if !elf.is_little_endian() => return Err(not_x86("big-endian".to_string())),
        Architecture::X86_64 => Arch::X86_64,
        Architecture::Aarch64 => Arch::Aarch64,
        a => return Err(not_x86(format!("{a:?}"))),
    };
    if elf.kind() == ObjectKind::Relocatable {
        return Err(UnwindError::Relocatable {
            path: path.to_owned(),
        });
    }
    let endian = elf.endian();
    let phdrs = elf.elf_program_headers();
    let code: Vec<(u64, u64)> = phdrs
        .iter()
        .filter(|p| p.p_type(endian) == PT_LOAD && p.p_flags(endian).contains(PF_X))
        .map(|p| {
            let v = p.p_vaddr(endian);
            (v, v.saturating_add(p.p_memsz(endian)))
        })
        .collect();
    let in_code = |s: u64, e: u64| code.is_empty() || code.iter().any(|&(a, b)| s >= a && e <= b);

    let section_addr = |name: &str| elf.section_by_name(name).map(|s| s.address());
    let mut bases = BaseAddresses::default();
    if let Some(a) = section_addr(".text") {
        bases = bases.set_text(a);
    }
    if let Some(a) = section_addr(".got") {
        bases = bases.set_got(a);
    }

    // .eh_frame: by section header, else (section headers stripped) through
    // PT_GNU_EH_FRAME, whose .eh_frame_hdr points at it.
    let eh = match elf.section_by_name(".eh_frame") {
        Some(s) if s.file_range().is_some() => {
            let d = s
                .data()
                .map_err(|e| section_err(".eh_frame", e.to_string()))?;
            Some((s.address(), d))
        }
        Some(_) => None,
        None => {
            eh_frame_from_segments(&elf, data).map_err(|what| section_err(".eh_frame_hdr", what))?
        }
    };
    let debug = match elf.section_by_name(".debug_frame") {
        Some(s) if s.file_range().is_some() => {
            let c = s
                .compressed_data()
                .map_err(|e| section_err(".debug_frame", e.to_string()))?;
            Some(
                decompress(c.format, c.data, c.uncompressed_size)
                    .map_err(|what| section_err(".debug_frame", what))?,
            )
        }
        _ => None,
    };
    let go = go_rows(&elf, data, arch);
    let tramp = match arch {
        Arch::Aarch64 => sigreturn(&elf),
        Arch::X86_64 => None,
    };
    let no_cfi = eh.is_none() && debug.is_none();
    if no_cfi && go.is_empty() && tramp.is_none() {
        return Err(UnwindError::NoUnwindInfo {
            path: path.to_owned(),
        });
    }

    let mut stats = Stats::default();
    let mut rows = Rows::new(arch, code.iter().map(|c| c.0).min());
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    let mut invalid_cfi: Vec<(u64, u64)> = Vec::new();
    // DW_CFA_AARCH64_negate_ra_state (pointer authentication) shares its
    // opcode with a SPARC one: gimli reads it as AArch64's when told.
    let vendor = match arch {
        Arch::Aarch64 => gimli::Vendor::AArch64,
        Arch::X86_64 => gimli::Vendor::Default,
    };
    if let Some((addr, d)) = eh {
        let mut section = EhFrame::new(d, LittleEndian);
        section.set_address_size(8);
        section.set_vendor(vendor);
        let bases = bases.clone().set_eh_frame(addr);
        let admit = |s, e| {
            if in_code(s, e) {
                Admit::Yes
            } else {
                Admit::OutsideCode
            }
        };
        cfi::collect(
            &section,
            arch,
            &bases,
            &admit,
            &mut stats,
            &mut rows,
            &mut ranges,
            &mut invalid_cfi,
        );
    }
    if let Some(d) = &debug {
        let mut section = DebugFrame::new(d, LittleEndian);
        section.set_address_size(8);
        section.set_vendor(vendor);
        let eh_ranges = RangeSet::new(ranges.clone());
        let admit = |s, e| {
            if !in_code(s, e) {
                Admit::OutsideCode
            } else if eh_ranges.meets(s, e) {
                Admit::Shadowed
            } else {
                Admit::Yes
            }
        };
        let before = stats.fdes;
        cfi::collect(
            &section,
            arch,
            &bases,
            &admit,
            &mut stats,
            &mut rows,
            &mut ranges,
            &mut invalid_cfi,
        );
        stats.debug_frame_fdes = stats.fdes - before;
    }

    // Go code has no CFI (only a cgo binary's C code does): its functions'
    // stack-pointer deltas give the rule wherever no FDE does.
    if !go.is_empty() {
        let fde = RangeSet::new(ranges.clone());
        for r in go {
            if in_code(r.start, r.end) && !fde.meets(r.start, r.end) {
                stats.go_rows += 1;
                rows.push(&r, &mut stats);
            }
        }
        ranges.extend(rows.ranges());
    }

    // Stubs that only jump (.plt.sec, .plt.got) with no FDE of their own
    // (linkers other than GNU ld, or --no-ld-generated-unwind-info): the
    // return address is on top of the stack at every instruction. On
    // AArch64 every PLT entry (.plt) only jumps, the return address in x30.
    let covered = RangeSet::new(ranges);
    let (stubs, stub_rule): (&[&str], Rule) = match arch {
        Arch::X86_64 => (
            &[".plt.sec", ".plt.got"],
            Rule {
                cfa: Cfa::Rsp(8),
                rbp: SavedRbp::Unchanged,
                ra: ReturnAddress::AtCfaMinus8,
                signal_frame: false,
            },
        ),
        Arch::Aarch64 => (
            &[".plt"],
            Rule {
                cfa: Cfa::Rsp(0),
                rbp: SavedRbp::Unchanged,
                ra: ReturnAddress::Lr,
                signal_frame: false,
            },
        ),
    };
    for &name in stubs {
        let Some(s) = elf.section_by_name(name) else {
            continue;
        };
        let (start, end) = (s.address(), s.address().saturating_add(s.size()));
        let exec = match s.flags() {
            SectionFlags::Elf { sh_flags, .. } => sh_flags.contains(SHF_EXECINSTR),
            _ => false,
        };
        if exec && start < end && !covered.meets(start, end) {
            stats.synthesized_plt += 1;
            rows.push(
                &Row {
                    start,
                    end,
                    rule: stub_rule,
                    unsupported: None,
                    rbp_dropped: false,
                },
                &mut stats,
            );
        }
    }

    // The kernel's AArch64 signal trampoline, `__kernel_rt_sigreturn` in
    // the vDSO, and the `nop` before it (a return address minus 1 lands
    // there), where the vDSO was built without CFI.
    if let Some((start, end)) = tramp {
        {
            if start < end && !covered.meets(start, end) {
                stats.synthesized_sigreturn += 1;
                rows.push(
                    &Row {
                        start,
                        end,
                        rule: Rule::sigcontext(true),
                        unsupported: None,
                        rbp_dropped: false,
                    },
                    &mut stats,
                );
            }
        }
    }

    // The rest of such a vDSO: its functions, read from their code.
    if tramp.is_some() && no_cfi {
        let (vdso, functions) = a64_vdso::rows(&elf);
        stats.synthesized_vdso_functions = functions;
        for r in vdso {
            if !covered.meets(r.start, r.end) {
                rows.push(&r, &mut stats);
            }
        }
    }

    Ok(Collected {
        arch,
        rows,
        stats,
        invalid_cfi,
    })
}

/// The functions a file's `.eh_frame` describes: its FDEs' ranges, for
/// naming a stripped file's code one frame per function. Only the FDE
/// headers are read (no row is evaluated), so this costs the section's
/// bytes and 16 bytes per function, not a table.
#[derive(Clone, Debug, Default)]
pub struct Functions {
    ranges: Vec<(u64, u64)>,
}

impl Functions {
    /// The FDE covering an ELF virtual address.
    pub fn at(&self, addr: u64) -> Option<(u64, u64)> {
        let i = self.ranges.partition_point(|&(s, _)| s <= addr);
        // FDEs may nest (a cold part inside another's range): the nearest
        // start below that still covers the address.
        self.ranges[..i]
            .iter()
            .rev()
            .take(8)
            .find(|&&(_, e)| addr < e)
            .copied()
    }

    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }
}

/// The FDE ranges of a file's `.eh_frame` (found through PT_GNU_EH_FRAME
/// when section headers are gone).
pub fn functions(path: &Path) -> Result<Functions, UnwindError> {
    let file = File::open(path).map_err(|source| UnwindError::Io {
        path: path.to_owned(),
        source,
    })?;
    let data = &ReadCache::new(file);
    let elf = ElfFile64::<Endianness, _>::parse(data).map_err(|source| UnwindError::Parse {
        path: path.to_owned(),
        source,
    })?;
    let section_err = |section: &'static str, what: String| UnwindError::Section {
        path: path.to_owned(),
        section,
        what,
    };
    let eh = match elf.section_by_name(".eh_frame") {
        Some(s) if s.file_range().is_some() => Some((
            s.address(),
            s.data()
                .map_err(|e| section_err(".eh_frame", e.to_string()))?,
        )),
        Some(_) => None,
        None => {
            eh_frame_from_segments(&elf, data).map_err(|what| section_err(".eh_frame_hdr", what))?
        }
    };
    let Some((addr, d)) = eh else {
        return Err(UnwindError::NoUnwindInfo {
            path: path.to_owned(),
        });
    };
    let mut bases = BaseAddresses::default().set_eh_frame(addr);
    if let Some(s) = elf.section_by_name(".text") {
        bases = bases.set_text(s.address());
    }
    if let Some(s) = elf.section_by_name(".got") {
        bases = bases.set_got(s.address());
    }
    let mut section = EhFrame::new(d, LittleEndian);
    section.set_address_size(8);
    let mut cies = std::collections::HashMap::new();
    let mut ranges = Vec::new();
    let mut entries = gimli::UnwindSection::entries(&section, &bases);
    while let Ok(Some(e)) = entries.next() {
        match e {
            gimli::CieOrFde::Cie(cie) => {
                cies.insert(cie.offset(), cie);
            }
            gimli::CieOrFde::Fde(partial) => {
                let fde = partial.parse(|sec, b, off| match cies.get(&off.0) {
                    Some(c) => Ok(c.clone()),
                    None => gimli::UnwindSection::cie_from_offset(sec, b, off),
                });
                if let Ok(fde) = fde {
                    if fde.initial_address() < fde.end_address() {
                        ranges.push((fde.initial_address(), fde.end_address()));
                    }
                }
            }
        }
    }
    ranges.sort_unstable();
    ranges.dedup();
    Ok(Functions { ranges })
}

/// Rows of a Go binary's functions from `.gopclntab` (none for other
/// files). On amd64 the CFA is RSP + delta + 8, and a function with a
/// frame keeps its caller's RBP right below the return address, where
/// Go's prologue saves it. On arm64 the call leaves the return address in
/// x30 and the CFA at SP + delta; a function with a frame stores x30 at
/// its new SP (CFA - delta) and the caller's x29 right below it.
fn go_rows<'a, R: ReadRef<'a>>(
    elf: &ElfFile64<'a, Endianness, R>,
    data: R,
    arch: Arch,
) -> Vec<Row> {
    let has_table = [".gopclntab", ".data.rel.ro.gopclntab"]
        .iter()
        .any(|n| elf.section_by_name(n).is_some());
    if !has_table {
        return Vec::new();
    }
    let Some(bytes) = data.len().ok().and_then(|n| data.read_bytes_at(0, n).ok()) else {
        return Vec::new();
    };
    let Some(t) = bpfscope_gopclntab::GoTable::parse(bytes) else {
        return Vec::new();
    };
    // Where Go's own traceback stops: a goroutine's first frame, a thread's,
    // and the switches to the scheduler's stack (what is above them on that
    // stack is not a caller).
    let outermost: std::collections::HashSet<u64> = t
        .functions()
        .filter(|(_, n)| {
            matches!(
                n.as_ref(),
                "runtime.goexit"
                    | "runtime.mstart"
                    | "runtime.rt0_go"
                    | "runtime.mcall"
                    | "runtime.morestack"
                    | "runtime.systemstack"
            )
        })
        .map(|(e, _)| e)
        .collect();
    // The signal restorer (the handler returns into it, RSP at the
    // kernel's ucontext): Go's table gives it no frame, so the return
    // address would be read from the ucontext's first word (its flags, 7).
    let restorers: std::collections::HashSet<u64> = t
        .functions()
        .filter(|(_, n)| {
            matches!(
                n.as_ref(),
                "runtime.sigreturn" | "runtime.sigreturn__sigaction"
            )
        })
        .map(|(e, _)| e)
        .collect();
    let mut rows: Vec<Row> = t
        .sp_deltas()
        .into_iter()
        .filter_map(|r| {
            if restorers.contains(&r.func) {
                // From its entry - 1, as glibc's __restore_rt FDE does: a
                // handler's return address is the entry, looked up 1 back.
                return Some(Row {
                    start: if r.start == r.func {
                        r.start - 1
                    } else {
                        r.start
                    },
                    end: r.end,
                    rule: Rule::sigcontext(true),
                    unsupported: None,
                    rbp_dropped: false,
                });
            }
            let delta = u32::try_from(r.sp_delta).ok()?;
            let last = outermost.contains(&r.func);
            let rule = match arch {
                Arch::X86_64 => Rule {
                    cfa: Cfa::Rsp(delta.checked_add(8)?),
                    rbp: if delta > 0 {
                        SavedRbp::AtCfa(-16)
                    } else {
                        SavedRbp::Unchanged
                    },
                    ra: if last {
                        ReturnAddress::Undefined
                    } else {
                        ReturnAddress::AtCfaMinus8
                    },
                    signal_frame: false,
                },
                Arch::Aarch64 => {
                    let d = i16::try_from(delta).ok()?;
                    let (ra, rbp) = match (last, d) {
                        (true, _) => (ReturnAddress::Undefined, SavedRbp::Unchanged),
                        (false, 0) => (ReturnAddress::Lr, SavedRbp::Unchanged),
                        (false, d) => (
                            ReturnAddress::AtCfa(-d),
                            SavedRbp::AtCfa(d.checked_add(8).map(|x| -x)?),
                        ),
                    };
                    Rule {
                        cfa: Cfa::Rsp(delta),
                        rbp,
                        ra,
                        signal_frame: false,
                    }
                }
            };
            Some(Row {
                start: r.start,
                end: r.end,
                rule,
                unsupported: None,
                rbp_dropped: false,
            })
        })
        .collect();
    // The byte before a restorer is its own (padding, or the end of the
    // function before it).
    for &e in &restorers {
        for r in rows.iter_mut() {
            if r.start < e - 1 && r.end > e - 1 && r.rule != Rule::sigcontext(true) {
                r.end = e - 1;
            }
        }
    }
    rows.retain(|r| r.start < r.end);
    rows
}

/// The range of AArch64's vDSO signal trampoline, from the `nop` before
/// `__kernel_rt_sigreturn` to its end, if the file has that symbol.
fn sigreturn<'a, R: ReadRef<'a>>(elf: &ElfFile64<'a, Endianness, R>) -> Option<(u64, u64)> {
    use object::ObjectSymbol;
    let sym = elf
        .dynamic_symbols()
        .chain(elf.symbols())
        .find(|s| s.name() == Ok("__kernel_rt_sigreturn"))?;
    Some((
        sym.address().checked_sub(4)?,
        sym.address() + sym.size().max(8),
    ))
}

/// Address ranges, for "does [s, e) meet any of them".
struct RangeSet {
    starts: Vec<u64>,
    /// The greatest end among the ranges up to each index (ranges may
    /// nest, so a long one can reach past shorter ones after it).
    max_end: Vec<u64>,
}

impl RangeSet {
    fn new(mut ranges: Vec<(u64, u64)>) -> RangeSet {
        ranges.sort_unstable();
        let mut m = 0;
        let max_end = ranges
            .iter()
            .map(|r| {
                m = m.max(r.1);
                m
            })
            .collect();
        RangeSet {
            starts: ranges.iter().map(|r| r.0).collect(),
            max_end,
        }
    }

    fn meets(&self, s: u64, e: u64) -> bool {
        let upto = self.starts.partition_point(|&a| a < e);
        upto > 0 && self.max_end[upto - 1] > s
    }
}

/// .eh_frame found through PT_GNU_EH_FRAME (section headers stripped): its
/// address from .eh_frame_hdr, its data up to the end of the loadable
/// segment holding it (the CFI ends with a zero terminator).
fn eh_frame_from_segments<'a, R: ReadRef<'a>>(
    elf: &ElfFile64<'a, Endianness, R>,
    data: R,
) -> Result<Option<(u64, &'a [u8])>, String> {
    let endian = elf.endian();
    let phdrs = elf.elf_program_headers();
    let Some(hdr) = phdrs
        .iter()
        .find(|p| p.p_type(endian) == PT_GNU_EH_FRAME && p.p_filesz(endian) > 0)
    else {
        return Ok(None);
    };
    let hdr_data = hdr
        .data(endian, data)
        .map_err(|()| "segment data out of the file".to_string())?;
    let bases = BaseAddresses::default().set_eh_frame_hdr(hdr.p_vaddr(endian));
    let parsed = EhFrameHdr::new(hdr_data, LittleEndian)
        .parse(&bases, 8)
        .map_err(|e| e.to_string())?;
    let addr = match parsed.eh_frame_ptr() {
        Pointer::Direct(a) => a,
        Pointer::Indirect(_) => return Err("indirect .eh_frame pointer".to_string()),
    };
    let Some(load) = phdrs.iter().find(|p| {
        let v = p.p_vaddr(endian);
        p.p_type(endian) == PT_LOAD && addr >= v && addr - v < p.p_filesz(endian)
    }) else {
        return Err(format!(".eh_frame at {addr:#x} is in no loaded file data"));
    };
    let skip = addr - load.p_vaddr(endian);
    let bytes = data
        .read_bytes_at(load.p_offset(endian) + skip, load.p_filesz(endian) - skip)
        .map_err(|()| "segment data out of the file".to_string())?;
    Ok(Some((addr, bytes)))
}

/// Section data as stored, or inflated (zlib; zstd is not supported).
fn decompress(format: CompressionFormat, data: &[u8], size: u64) -> Result<Cow<'_, [u8]>, String> {
    match format {
        CompressionFormat::None => Ok(Cow::Borrowed(data)),
        CompressionFormat::Zlib => {
            let mut out = Vec::with_capacity(usize::try_from(size).unwrap_or(0).min(1 << 30));
            flate2::read::ZlibDecoder::new(data)
                .take(size)
                .read_to_end(&mut out)
                .map_err(|e| format!("zlib: {e}"))?;
            Ok(Cow::Owned(out))
        }
        other => Err(format!("{other:?} compression is not supported")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_sets_look_back_over_long_ranges() {
        let r = RangeSet::new(vec![(0x40, 0x50), (0x10, 0x100), (0x20, 0x30)]);
        assert!(r.meets(0x60, 0x70));
        assert!(!r.meets(0x100, 0x110));
        assert!(!r.meets(0, 0x10));
        assert!(r.meets(0, 0x11));
        let r = RangeSet::new(vec![(0x20, 0x30)]);
        assert!(!r.meets(0x30, 0x40));
        assert!(r.meets(0x2f, 0x40));
    }
}
