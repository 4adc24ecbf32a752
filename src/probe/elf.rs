//! What a user-space binary offers to probe: function symbols with file
//! offsets, USDT notes (.note.stapsdt) with their argument specs, build id.

use std::path::{Path, PathBuf};

use object::read::elf::{ElfFile64, FileHeader, SectionHeader};
use object::{Endianness, Object, ObjectSection, ObjectSegment, ObjectSymbol, SymbolKind};

use crate::error::Error;
use crate::usage;

/// A function symbol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Func {
    pub name: String,
    /// Offset of the entry in the file (what uprobes attach at).
    pub file_offset: u64,
    pub size: u64,
    /// A GNU indirect function: the symbol is a resolver that picks the real
    /// implementation once, at load time.
    pub ifunc: bool,
}

/// One USDT argument as its note describes it (`-4@%edi`: signed, 4 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UsdtArg {
    pub size: u8,
    pub signed: bool,
}

/// One USDT probe site.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsdtNote {
    pub provider: String,
    pub name: String,
    pub file_offset: u64,
    /// File offset of the semaphore, for probes guarded by one.
    pub semaphore: Option<u64>,
    pub args: Vec<UsdtArg>,
}

#[derive(Debug, Clone)]
pub struct ElfProbes {
    pub path: PathBuf,
    pub funcs: Vec<Func>,
    pub usdt: Vec<UsdtNote>,
}

/// The separate debug file of a build id in the system's debug directory.
fn debug_file_by_build_id(id: &[u8]) -> Option<PathBuf> {
    let hex = bpfscope_sys::buildid::hex(id);
    if hex.len() < 3 {
        return None;
    }
    let p = PathBuf::from(format!(
        "/usr/lib/debug/.build-id/{}/{}.debug",
        &hex[..2],
        &hex[2..]
    ));
    p.is_file().then_some(p)
}

/// The name that stands for aliases sharing one address: public before
/// `_`-prefixed, then the shortest (strtol, not strtoimax).
pub fn canonical_rank(name: &str) -> (bool, usize, &str) {
    (name.starts_with('_'), name.len(), name)
}

/// Maps a virtual address to a file offset through the loadable segments.
fn file_offset(segments: &[(u64, u64, u64)], vaddr: u64) -> Option<u64> {
    segments
        .iter()
        .find(|(addr, size, _)| vaddr >= *addr && vaddr < addr + size)
        .map(|(addr, _, off)| vaddr - addr + off)
}

pub fn read(path: &Path) -> Result<ElfProbes, Error> {
    let data = std::fs::read(path).map_err(|e| usage!("cannot read {}: {e}", path.display()))?;
    let file = object::File::parse(&*data).map_err(|e| {
        usage!(
            "{} is not an ELF file bpfscope can read: {e}",
            path.display()
        )
    })?;
    let segments: Vec<(u64, u64, u64)> = file
        .segments()
        .map(|s| (s.address(), s.file_range().1, s.file_range().0))
        .collect();

    let elf = ElfFile64::<Endianness>::parse(&*data)
        .map_err(|e| usage!("{} is not a 64-bit ELF file: {e}", path.display()))?;
    let endian = elf.endian();
    let mut funcs: Vec<Func> = elf
        .symbols()
        .chain(elf.dynamic_symbols())
        // is_definition() leaves out IFUNCs; any defined text symbol will do.
        .filter(|s| s.kind() == SymbolKind::Text && !s.is_undefined() && s.address() != 0)
        .filter_map(|s| {
            Some(Func {
                name: s.name().ok()?.to_string(),
                file_offset: file_offset(&segments, s.address())?,
                size: s.size(),
                ifunc: s.elf_symbol().st_type() == object::elf::STT_GNU_IFUNC,
            })
        })
        .filter(|f| !f.name.is_empty())
        .collect();
    let _ = endian;
    // Stripped binaries keep their full symbol table (local functions too) in
    // a separate debug file; its addresses map through this file's segments.
    if let Some(debug) = file
        .build_id()
        .ok()
        .flatten()
        .and_then(debug_file_by_build_id)
    {
        if let Ok(ddata) = std::fs::read(&debug) {
            if let Ok(dfile) = object::File::parse(&*ddata) {
                funcs.extend(
                    dfile
                        .symbols()
                        .filter(|s| {
                            s.kind() == SymbolKind::Text && !s.is_undefined() && s.address() != 0
                        })
                        .filter_map(|s| {
                            Some(Func {
                                name: s.name().ok()?.to_string(),
                                file_offset: file_offset(&segments, s.address())?,
                                size: s.size(),
                                ifunc: false,
                            })
                        })
                        .filter(|f| !f.name.is_empty()),
                );
            }
        }
    }
    // One entry per name (symtab, dynsym and the debug file repeat each other).
    // An IFUNC entry (from dynsym) sorts before the debug file's plain copy of the name.
    funcs.sort_by(|a, b| {
        a.name
            .cmp(&b.name)
            .then(b.ifunc.cmp(&a.ifunc))
            .then(a.file_offset.cmp(&b.file_offset))
    });
    funcs.dedup_by(|a, b| a.name == b.name);

    let usdt = usdt_notes(&data, &file, &segments).unwrap_or_default();
    Ok(ElfProbes {
        path: path.to_path_buf(),
        funcs,
        usdt,
    })
}

fn usdt_notes(
    data: &[u8],
    file: &object::File<'_>,
    segments: &[(u64, u64, u64)],
) -> Option<Vec<UsdtNote>> {
    let elf = ElfFile64::<Endianness>::parse(data).ok()?;
    let endian = elf.endian();
    // Prelinked binaries move .stapsdt.base; notes record the link-time base.
    let base_addr = file.section_by_name(".stapsdt.base").map(|s| s.address());
    let mut out = Vec::new();
    for section in elf.elf_header().sections(endian, data).ok()?.iter() {
        let Ok(Some(mut notes)) = section.notes(endian, data) else {
            continue;
        };
        while let Ok(Some(note)) = notes.next() {
            if note.name() != b"stapsdt" || note.n_type(endian) != object::elf::NoteType(3) {
                continue;
            }
            if let Some(n) = parse_stapsdt(note.desc(), base_addr, segments) {
                out.push(n);
            }
        }
    }
    Some(out)
}

/// The stapsdt v3 note: pc, base, semaphore (u64 each), then provider, name
/// and argument strings, NUL-terminated.
fn parse_stapsdt(
    desc: &[u8],
    base_addr: Option<u64>,
    segments: &[(u64, u64, u64)],
) -> Option<UsdtNote> {
    let word = |i: usize| -> Option<u64> {
        Some(u64::from_le_bytes(
            desc.get(i * 8..i * 8 + 8)?.try_into().ok()?,
        ))
    };
    let (mut pc, base, mut sema) = (word(0)?, word(1)?, word(2)?);
    if let Some(actual) = base_addr {
        let delta = actual.wrapping_sub(base);
        pc = pc.wrapping_add(delta);
        if sema != 0 {
            sema = sema.wrapping_add(delta);
        }
    }
    let mut strs = desc.get(24..)?.split(|&b| b == 0);
    let provider = String::from_utf8_lossy(strs.next()?).into_owned();
    let name = String::from_utf8_lossy(strs.next()?).into_owned();
    let args = strs
        .next()
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .unwrap_or_default();
    Some(UsdtNote {
        provider,
        name,
        file_offset: file_offset(segments, pc)?,
        semaphore: (sema != 0).then(|| file_offset(segments, sema)).flatten(),
        args: usdt_arg_specs(&args).filter_map(parse_usdt_arg).collect(),
    })
}

/// The argument specs of a USDT note, separated by spaces: x86-64's
/// `-4@-20(%rbp)`, or AArch64's `-4@[sp, 12]`, whose memory operands hold
/// a space of their own.
fn usdt_arg_specs(args: &str) -> impl Iterator<Item = &str> {
    let mut depth = 0u32;
    args.split(move |c: char| {
        match c {
            '[' => depth += 1,
            ']' => depth = depth.saturating_sub(1),
            _ => {}
        }
        c.is_ascii_whitespace() && depth == 0
    })
    .filter(|s| !s.is_empty())
}

/// `[-]SIZE@LOCATION`; a negative size means signed.
fn parse_usdt_arg(spec: &str) -> Option<UsdtArg> {
    let (size, _) = spec.split_once('@')?;
    let n: i32 = size.parse().ok()?;
    Some(UsdtArg {
        size: n.unsigned_abs().min(8) as u8,
        signed: n < 0,
    })
}

/// Where an indirect function's implementation lives in `binary`, as the
/// dynamic linker resolves it on this CPU. Only for libraries bpfscope
/// itself has loaded (the C library): asking dlsym resolves the IFUNC the
/// way it is resolved for every process on this machine, without loading
/// anything new.
pub fn resolve_ifunc(binary: &Path, name: &str) -> Option<u64> {
    let ours: Vec<(u64, u64, u64)> = bpfscope_sys::procfs::maps("self")
        .ok()?
        .into_iter()
        .filter(|m| {
            m.is_file() && Path::new(&m.path).canonicalize().ok().as_deref() == Some(binary)
        })
        .map(|m| (m.start, m.end, m.offset))
        .collect();
    if ours.is_empty() {
        return None;
    }
    let cname = std::ffi::CString::new(name).ok()?;
    // SAFETY: dlsym only looks the name up among already loaded objects;
    // the name is a valid NUL-terminated string.
    let addr = unsafe { libc::dlsym(libc::RTLD_DEFAULT, cname.as_ptr()) } as u64;
    ours.iter()
        .find(|(a, b, _)| addr >= *a && addr < *b)
        .map(|(a, _, off)| addr - a + off)
}

/// One decoded instruction of a function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Insn {
    /// Offset from the function's entry.
    pub offset: u64,
    pub len: u64,
    /// Lower-case mnemonic, e.g. `vpxor`.
    pub mnemonic: String,
    pub bytes: Vec<u8>,
}

impl Insn {
    /// `vpxor (c5 f9 ef c0)`, for messages.
    pub fn describe(&self) -> String {
        let hex: Vec<String> = self.bytes.iter().map(|b| format!("{b:02x}")).collect();
        format!("{} ({})", self.mnemonic, hex.join(" "))
    }
}

/// Reads up to `len` bytes of code at `file_offset` of `path`.
pub fn read_code(path: &Path, file_offset: u64, len: u64) -> Result<Vec<u8>, Error> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f =
        std::fs::File::open(path).map_err(|e| usage!("cannot read {}: {e}", path.display()))?;
    f.seek(SeekFrom::Start(file_offset))
        .map_err(|e| usage!("cannot read {}: {e}", path.display()))?;
    let mut buf = Vec::new();
    f.take(len)
        .read_to_end(&mut buf)
        .map_err(|e| usage!("cannot read {}: {e}", path.display()))?;
    Ok(buf)
}

/// Decodes code from a function's entry, instruction by instruction, until
/// the bytes end. AArch64's instructions are 4 bytes each, always: where
/// one starts is all a uprobe needs to know (the mnemonic is left out).
#[cfg(target_arch = "aarch64")]
pub fn decode(code: &[u8]) -> Vec<Insn> {
    code.chunks_exact(4)
        .enumerate()
        .map(|(i, b)| Insn {
            offset: 4 * i as u64,
            len: 4,
            mnemonic: "instruction".to_string(),
            bytes: b.to_vec(),
        })
        .collect()
}

/// Decodes x86-64 code from a function's entry, instruction by instruction,
/// until the bytes end or stop being valid code (data after a jump table).
#[cfg(not(target_arch = "aarch64"))]
pub fn decode(code: &[u8]) -> Vec<Insn> {
    use iced_x86::{Decoder, DecoderOptions};
    let mut d = Decoder::with_ip(64, code, 0, DecoderOptions::NONE);
    let mut out = Vec::new();
    while d.can_decode() {
        let i = d.decode();
        if i.is_invalid() {
            break;
        }
        let (start, len) = (i.ip(), i.len() as u64);
        out.push(Insn {
            offset: start,
            len,
            mnemonic: format!(
                "{}{:?}",
                if i.has_lock_prefix() { "lock " } else { "" },
                i.mnemonic()
            )
            .to_lowercase(),
            bytes: code
                .get(start as usize..(start + len) as usize)
                .unwrap_or_default()
                .to_vec(),
        });
    }
    out
}

/// The instruction at `file_offset` of `path`, for saying why the kernel
/// refuses a uprobe there.
pub fn insn_at(path: &Path, file_offset: u64) -> Option<Insn> {
    // 15 bytes: the longest x86 instruction.
    let code = read_code(path, file_offset, 15).ok()?;
    decode(&code).into_iter().next()
}

/// First instructions at many file offsets of one file, read through one
/// descriptor.
pub fn insns_at(path: &Path, offsets: &[u64]) -> Vec<Option<Insn>> {
    use std::os::unix::fs::FileExt;
    let Ok(f) = std::fs::File::open(path) else {
        return vec![None; offsets.len()];
    };
    offsets
        .iter()
        .map(|&off| {
            let mut buf = [0u8; 15];
            let n = f.read_at(&mut buf, off).ok()?;
            decode(&buf[..n]).into_iter().next()
        })
        .collect()
}

/// Opcode bytes Linux's x86 uprobes take for jumps when deciding to
/// emulate an instruction instead of single-stepping it
/// (branch_setup_xol_ops: jcc 0x70-0x7f, nop 0x90, call 0xe8, jmp 0xe9/0xeb).
/// The check reads the opcode byte without looking at a VEX/EVEX/XOP
/// prefix, so `vpbroadcastb %esi,%ymm16` (EVEX opcode 0x7a, "jp") or
/// `vpcmpeqb` (VEX 0x74, "je") is "emulated" as a jump: never executed,
/// and the probed program goes on with stale registers (memset and strchr
/// of the C library on AVX-512 machines return garbage, in every process).
#[cfg(not(target_arch = "aarch64"))]
fn kernel_takes_for_branch(op: u8) -> bool {
    matches!(op, 0x70..=0x7f | 0x90 | 0xe8 | 0xe9 | 0xeb)
}

/// Why a uprobe must not go on this instruction although the kernel
/// accepts it, if so (x86-64's uprobes only: arm64's single-step or
/// simulate every instruction they accept).
#[cfg(target_arch = "aarch64")]
pub fn misemulated(_: &Insn) -> Option<String> {
    None
}

/// Why a uprobe must not go on this instruction although the kernel
/// accepts it, if so.
#[cfg(not(target_arch = "aarch64"))]
pub fn misemulated(i: &Insn) -> Option<String> {
    let b = &i.bytes;
    let mut p = 0;
    while b.get(p).is_some_and(|x| {
        matches!(
            x,
            0x66 | 0x67 | 0xf2 | 0xf3 | 0x26 | 0x2e | 0x36 | 0x3e | 0x64 | 0x65
        )
    }) {
        p += 1;
    }
    // The opcode byte's place after each prefix: c5 (2-byte VEX) R.vvvv.L.pp;
    // c4 (3-byte VEX) and 8f (XOP) two payload bytes; 62 (EVEX) three.
    let at = match (b.get(p)?, b.get(p + 1)?) {
        (0xc5, _) => p + 2,
        (0xc4, _) => p + 3,
        // 8f with ModRM.reg = 0 is pop, not XOP.
        (0x8f, m) if m & 0x1f >= 8 => p + 3,
        (0x62, _) => p + 4,
        _ => return None,
    };
    let op = *b.get(at)?;
    kernel_takes_for_branch(op).then(|| {
        format!(
            "the kernel would take the instruction there, {}, for a jump (opcode byte {op:#04x} behind a VEX/EVEX prefix) and skip it instead of running it, corrupting the traced program",
            i.describe()
        )
    })
}

/// Why `+offset` of a function of `size` bytes (0: unknown) starting at
/// `file_offset` cannot take a uprobe: outside the function, or inside an
/// instruction (a uprobe there corrupts the instruction: SIGILL or worse).
pub fn check_offset(path: &Path, file_offset: u64, size: u64, offset: u64) -> Result<(), String> {
    if offset == 0 {
        return Ok(());
    }
    if size > 0 && offset >= size {
        return Err(format!(
            "offset {offset:#x} is outside the function, which is {size} ({size:#x}) bytes long"
        ));
    }
    // Without a size, decode just past the offset: enough to know whether
    // an instruction starts there.
    let len = if size > 0 { size } else { offset + 15 };
    let code = read_code(path, file_offset, len).map_err(|e| e.to_string())?;
    let insns = decode(&code);
    if insns.iter().any(|i| i.offset == offset) {
        return Ok(());
    }
    match insns
        .iter()
        .find(|i| i.offset < offset && offset < i.offset + i.len)
    {
        Some(i) => Err(format!(
            "offset {offset:#x} falls inside the {} instruction at +{:#x}; the nearest instruction boundaries are +{:#x} and +{:#x}",
            i.describe(),
            i.offset,
            i.offset,
            i.offset + i.len
        )),
        None => Err(format!(
            "offset {offset:#x} is not an instruction boundary the decoder reaches (the code there is not valid machine code)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usdt_arg_specs() {
        assert_eq!(
            parse_usdt_arg("-4@%edi"),
            Some(UsdtArg {
                size: 4,
                signed: true
            })
        );
        assert_eq!(
            parse_usdt_arg("8@-8(%rbp)"),
            Some(UsdtArg {
                size: 8,
                signed: false
            })
        );
        assert_eq!(parse_usdt_arg("garbage"), None);
        // AArch64's operands: registers, memory with a space inside, constants.
        let a64: Vec<&str> =
            super::usdt_arg_specs("-4@x0 8@[sp, 16]  -8@[x19, -8] 4@[x1] 8@x2 -4@5").collect();
        assert_eq!(
            a64,
            [
                "-4@x0",
                "8@[sp, 16]",
                "-8@[x19, -8]",
                "4@[x1]",
                "8@x2",
                "-4@5"
            ]
        );
        let parsed: Vec<UsdtArg> = a64.into_iter().filter_map(parse_usdt_arg).collect();
        assert_eq!(parsed.len(), 6);
        assert_eq!(
            parsed[1],
            UsdtArg {
                size: 8,
                signed: false
            }
        );
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn decodes_instruction_boundaries() {
        // push %rbp; mov %rsp,%rbp; vpxor %xmm0,%xmm0,%xmm0; ret
        let code = [0x55, 0x48, 0x89, 0xe5, 0xc5, 0xf9, 0xef, 0xc0, 0xc3];
        let offs: Vec<(u64, u64)> = decode(&code).iter().map(|i| (i.offset, i.len)).collect();
        assert_eq!(offs, vec![(0, 1), (1, 3), (4, 4), (8, 1)]);
        assert_eq!(decode(&code)[2].describe(), "vpxor (c5 f9 ef c0)");
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn vex_opcodes_the_kernel_takes_for_jumps() {
        let first = |b: &[u8]| decode(b).into_iter().next().unwrap();
        // vpbroadcastb %esi,%ymm16 (EVEX 0x7a), vpcmpeqb (VEX 0x74), vpor (0xeb): refused.
        for b in [
            &[0x62, 0xe2, 0x7d, 0x28, 0x7a, 0xc6][..],
            &[0xc5, 0xf9, 0x74, 0xc0],
            &[0xc5, 0xe1, 0xeb, 0xc2],
        ] {
            assert!(misemulated(&first(b)).is_some(), "{b:x?}");
        }
        // vpaddb (VEX 0xfc), a real jp, mov, pop (8f /0): fine.
        for b in [
            &[0xc5, 0xe1, 0xfc, 0xc2][..],
            &[0x7a, 0x02],
            &[0x48, 0x89, 0xf8],
            &[0x8f, 0x00],
        ] {
            assert!(misemulated(&first(b)).is_none(), "{b:x?}");
        }
    }

    #[test]
    fn reads_libc_functions() {
        let libc = Path::new(bpfscope_sys::arch::LIB_DIRS[0]).join("libc.so.6");
        let Ok(info) = read(&libc) else {
            return;
        };
        let strlen = info.funcs.iter().find(|f| f.name == "strlen");
        assert!(strlen.is_some_and(|f| f.file_offset > 0));
    }
}
