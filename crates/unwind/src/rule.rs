//! What one table entry says about its address range (`Rule`), and the
//! 32-bit word it is stored as (the low 4 bytes of an entry are its address,
//! the high 4 bytes this word; the layout is in the crate documentation).
//! The word's layout depends on the architecture (`Arch`): x86-64 keeps
//! its return address at CFA - 8 and needs room for PLT and realignment
//! rules; AArch64 keeps it in the link register, or saves it anywhere in
//! the frame, usually beside the frame pointer (the frame record).
//!
//! A `Rule` is only ever built from a word (`decode`) or checked by
//! encoding it (`encode` returns `None` when a field does not fit), so every
//! rule a table hands out is exactly what the BPF side will read.

/// The architecture a table is for: the ELF file's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Arch {
    X86_64,
    Aarch64,
}

impl Arch {
    /// The architecture bpfscope runs on (whose processes it unwinds).
    pub const fn native() -> Arch {
        if cfg!(target_arch = "aarch64") {
            Arch::Aarch64
        } else {
            Arch::X86_64
        }
    }

    /// The ELF `e_machine`, which the table's header carries.
    pub const fn e_machine(self) -> u16 {
        match self {
            Arch::X86_64 => 62,
            Arch::Aarch64 => 183,
        }
    }

    pub fn from_e_machine(m: u16) -> Option<Arch> {
        match m {
            62 => Some(Arch::X86_64),
            183 => Some(Arch::Aarch64),
            _ => None,
        }
    }
}

/// DWARF register numbers of x86-64 (System V psABI, figure 3.36).
pub(crate) const REG_RBP: u16 = 6;
pub(crate) const REG_RSP: u16 = 7;
pub(crate) const REG_RIP: u16 = 16;

/// DWARF register numbers of AArch64 (DWARF for the Arm 64-bit
/// architecture): the frame pointer x29 and SP (the link register is x30).
pub(crate) const REG_X29: u16 = 29;
pub(crate) const REG_SP: u16 = 31;

/// Offsets from SP, at the kernel's AArch64 signal trampoline
/// (`__kernel_rt_sigreturn` in the vDSO), of the interrupted registers:
/// SP points at `struct rt_sigframe` (siginfo, 128 bytes, then the
/// ucontext, whose `uc_mcontext` is at 176: `fault_address`, `regs[31]`,
/// `sp`, `pc`).
pub const A64_SIGCONTEXT_X29: u16 = 128 + 176 + 8 + 29 * 8;
pub const A64_SIGCONTEXT_X30: u16 = 128 + 176 + 8 + 30 * 8;
pub const A64_SIGCONTEXT_SP: u16 = 128 + 176 + 8 + 31 * 8;
pub const A64_SIGCONTEXT_PC: u16 = 128 + 176 + 8 + 32 * 8;

/// Offsets in the Linux x86-64 signal frame: when the kernel enters a
/// handler, the return address it pushes points at `__restore_rt`, and once
/// the handler has returned RSP points at the `struct ucontext` of
/// `struct rt_sigframe`; the interrupted registers are in its
/// `uc_mcontext` (at offset 40), in `struct sigcontext` order.
pub const SIGCONTEXT_RBP: u16 = 40 + 10 * 8;
pub const SIGCONTEXT_RSP: u16 = 40 + 15 * 8;
pub const SIGCONTEXT_RIP: u16 = 40 + 16 * 8;

/// How to compute the canonical frame address (the caller's RSP before the
/// call, which is where the return address sits just below). On AArch64
/// `Rsp` is SP, `Rbp` the frame pointer x29.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Cfa {
    /// CFA = RSP + offset. Offsets above 65535 must be multiples of 8
    /// (at most 8 * 65535).
    Rsp(u32),
    /// CFA = RBP + offset (after `push rbp; mov rbp, rsp`: offset 16).
    Rbp(u16),
    /// CFA = register + offset, for a DWARF register below 16 other than
    /// RSP and RBP (`lea r10, [rsp+8]` before realigning the stack). Only
    /// the interrupted frame knows such a register.
    Register { reg: u8, offset: u16 },
    /// A lazy-binding PLT entry (16 bytes, the gcc/ld pattern):
    /// CFA = RSP + offset, plus 8 once the entry has pushed its relocation
    /// index, i.e. when `(RIP & 15) >= threshold` (11 in the classic PLT,
    /// 9 in the IBT one).
    Plt { offset: u16, threshold: u8 },
    /// CFA = *(RSP + offset) + add (hand-written assembly that keeps the
    /// original RSP in a stack slot). Both multiples of 8.
    DerefRsp { offset: i16, add: u16 },
    /// CFA = *(RBP + offset) + add (gcc's stack realignment: the CFA is
    /// saved below the frame pointer). Both multiples of 8.
    DerefRbp { offset: i16, add: u16 },
    /// The kernel's signal frame (`__restore_rt`): RSP, RIP and RBP of the
    /// interrupted code are at RSP + `SIGCONTEXT_RSP`, `SIGCONTEXT_RIP`,
    /// `SIGCONTEXT_RBP` (on AArch64, `__kernel_rt_sigreturn`: SP, PC, x29
    /// and x30 at SP + `A64_SIGCONTEXT_*`). The caller's RIP is where the
    /// signal hit, not a return address: look it up without subtracting 1.
    SigContext,
    /// The CFI says something this table cannot express (an unknown
    /// expression, a register above 15, an offset out of range, or a return
    /// address not at CFA - 8): unwinding stops here. The table's stats say
    /// why.
    Unsupported,
}

/// Where the caller's RBP is (on AArch64: its frame pointer, x29).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SavedRbp {
    /// Not saved (or DW_CFA_same_value): RBP still holds the caller's.
    Unchanged,
    /// Saved at CFA + offset (a multiple of 8, -1024..=1016).
    AtCfa(i16),
    /// Saved at RBP + offset (a multiple of 8, -1024..=1016): realigned
    /// frames, whose CFA is `DerefRbp`.
    AtRbp(i16),
    /// Unknown from here on (an expression or register rule this table
    /// cannot express, or DW_CFA_undefined).
    Lost,
    /// In the signal context (`Cfa::SigContext`).
    SigContext,
}

/// Where the return address is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReturnAddress {
    /// At CFA - 8, where `call` put it (x86-64).
    AtCfaMinus8,
    /// Still in the link register, x30 (AArch64: a leaf, or a prologue
    /// before x30 is saved). Known only in the interrupted frame.
    Lr,
    /// Saved at CFA + offset (AArch64), a multiple of 8.
    AtCfa(i16),
    /// DW_CFA_undefined: the outermost frame (`_start`, thread entry).
    Undefined,
    /// In the signal context (`Cfa::SigContext`).
    SigContext,
    /// `Cfa::Unsupported`.
    Unknown,
}

/// The unwind rule of an address range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Rule {
    pub cfa: Cfa,
    pub rbp: SavedRbp,
    pub ra: ReturnAddress,
    /// The FDE's CIE has the `S` augmentation: this frame was interrupted
    /// by a signal, not a call (glibc's `__restore_rt` and its like).
    pub signal_frame: bool,
}

/// Values of the entry's CFA kind (bits 0-3 of the kind byte).
pub mod kind {
    pub const GAP: u8 = 0;
    pub const RSP: u8 = 1;
    pub const RSP_X8: u8 = 2;
    pub const RBP: u8 = 3;
    pub const REGISTER: u8 = 4;
    pub const PLT: u8 = 5;
    pub const DEREF_RSP: u8 = 6;
    pub const DEREF_RBP: u8 = 7;
    pub const SIGCONTEXT: u8 = 8;
    pub const UNSUPPORTED: u8 = 15;

    /// Bit 4: the CIE's `S` augmentation.
    pub const SIGNAL_FRAME: u8 = 1 << 4;
    /// Bit 5: the return address is undefined (outermost frame).
    pub const RA_UNDEFINED: u8 = 1 << 5;
    /// Bits 6-7: the RBP rule.
    pub const RBP_SHIFT: u8 = 6;
    pub const RBP_UNCHANGED: u8 = 0;
    pub const RBP_AT_CFA: u8 = 1;
    pub const RBP_AT_RBP: u8 = 2;
    pub const RBP_LOST: u8 = 3;

    /// AArch64: bits 6-7 say where the return address and x29 are.
    /// The return address is in x30, x29 unchanged.
    pub const A64_LR: u8 = 0;
    /// The frame record: x29 at CFA + 8 aux, the return address after it.
    pub const A64_RECORD: u8 = 1;
    /// The return address at CFA + 8 aux, x29 unchanged.
    pub const A64_RA: u8 = 2;
    /// The return address at CFA + 8 aux, x29 lost.
    pub const A64_RA_FP_LOST: u8 = 3;
}

/// The word of a gap (no FDE covers the range).
pub(crate) const GAP_WORD: u32 = 0;

fn word(arg: u16, kind_byte: u8, aux: u8) -> u32 {
    u32::from(arg) | (u32::from(kind_byte) << 16) | (u32::from(aux) << 24)
}

/// A multiple of 8 in -1024..=1016 as an i8 count of 8 bytes.
fn slots(v: i64) -> Option<u8> {
    if v % 8 != 0 {
        return None;
    }
    i8::try_from(v / 8).ok().map(|s| s as u8)
}

/// A multiple of 8 in 0..=2040 as a u8 count of 8 bytes.
fn uslots(v: u64) -> Option<u8> {
    if v % 8 != 0 {
        return None;
    }
    u8::try_from(v / 8).ok()
}

impl Rule {
    /// A range whose CFI cannot be expressed.
    pub const fn unsupported(signal_frame: bool) -> Rule {
        Rule {
            cfa: Cfa::Unsupported,
            rbp: SavedRbp::Lost,
            ra: ReturnAddress::Unknown,
            signal_frame,
        }
    }

    /// The kernel's signal frame.
    pub const fn sigcontext(signal_frame: bool) -> Rule {
        Rule {
            cfa: Cfa::SigContext,
            rbp: SavedRbp::SigContext,
            ra: ReturnAddress::SigContext,
            signal_frame,
        }
    }

    /// The 32-bit word of this rule for `arch` (`arg` in bits 0-15, the
    /// kind byte in 16-23, `aux` in 24-31), or `None` when a field does not
    /// fit or the combination is not one the layout has.
    pub fn encode(&self, arch: Arch) -> Option<u32> {
        match arch {
            Arch::X86_64 => self.encode_x86_64(),
            Arch::Aarch64 => self.encode_aarch64(),
        }
    }

    fn encode_x86_64(&self) -> Option<u32> {
        let mut kb = if self.signal_frame {
            kind::SIGNAL_FRAME
        } else {
            0
        };
        match (self.cfa, self.ra, self.rbp) {
            (Cfa::SigContext, ReturnAddress::SigContext, SavedRbp::SigContext) => {
                return Some(word(0, kb | kind::SIGCONTEXT, 0));
            }
            (Cfa::Unsupported, ReturnAddress::Unknown, SavedRbp::Lost) => {
                return Some(word(
                    0,
                    kb | kind::UNSUPPORTED | (kind::RBP_LOST << kind::RBP_SHIFT),
                    0,
                ));
            }
            (Cfa::SigContext | Cfa::Unsupported, _, _) => return None,
            (
                _,
                ReturnAddress::SigContext
                | ReturnAddress::Unknown
                | ReturnAddress::Lr
                | ReturnAddress::AtCfa(_),
                _,
            ) => return None,
            (_, _, SavedRbp::SigContext) => return None,
            _ => {}
        }
        if self.ra == ReturnAddress::Undefined {
            kb |= kind::RA_UNDEFINED;
        }
        let (rbp_kind, rbp_aux) = match self.rbp {
            SavedRbp::Unchanged => (kind::RBP_UNCHANGED, None),
            SavedRbp::Lost => (kind::RBP_LOST, None),
            SavedRbp::AtCfa(off) => (kind::RBP_AT_CFA, Some(slots(off.into())?)),
            SavedRbp::AtRbp(off) => (kind::RBP_AT_RBP, Some(slots(off.into())?)),
            SavedRbp::SigContext => return None,
        };
        kb |= rbp_kind << kind::RBP_SHIFT;
        // `aux` belongs to the RBP rule unless the CFA kind needs it, and
        // those kinds (REGISTER, PLT) take only an RBP rule without offset.
        let (cfa_kind, arg, cfa_aux) = match self.cfa {
            Cfa::Rsp(off) => match u16::try_from(off) {
                Ok(a) => (kind::RSP, a, None),
                Err(_) if off % 8 == 0 => (kind::RSP_X8, u16::try_from(off / 8).ok()?, None),
                Err(_) => return None,
            },
            Cfa::Rbp(off) => (kind::RBP, off, None),
            Cfa::Register { reg, offset } => {
                if reg >= 16 || u16::from(reg) == REG_RSP || u16::from(reg) == REG_RBP {
                    return None;
                }
                (kind::REGISTER, offset, Some(reg))
            }
            Cfa::Plt { offset, threshold } => {
                if threshold > 15 {
                    return None;
                }
                (kind::PLT, offset, Some(threshold))
            }
            Cfa::DerefRsp { offset, add } | Cfa::DerefRbp { offset, add } => {
                let k = if matches!(self.cfa, Cfa::DerefRsp { .. }) {
                    kind::DEREF_RSP
                } else {
                    kind::DEREF_RBP
                };
                let lo = slots(offset.into())?;
                let hi = uslots(add.into())?;
                (k, u16::from(lo) | (u16::from(hi) << 8), None)
            }
            Cfa::SigContext | Cfa::Unsupported => return None,
        };
        let aux = match (cfa_aux, rbp_aux) {
            (Some(_), Some(_)) => return None,
            (Some(a), None) | (None, Some(a)) => a,
            (None, None) => 0,
        };
        Some(word(arg, kb | cfa_kind, aux))
    }

    /// AArch64's word: the CFA kinds of x86-64 but PLT and the
    /// dereferences (SP for RSP, x29 for RBP, a register x0-x28), and in
    /// bits 6-7 where the return address and x29 are (`kind::A64_*`), with
    /// their offset in `aux`.
    fn encode_aarch64(&self) -> Option<u32> {
        let mut kb = if self.signal_frame {
            kind::SIGNAL_FRAME
        } else {
            0
        };
        match (self.cfa, self.ra, self.rbp) {
            (Cfa::SigContext, ReturnAddress::SigContext, SavedRbp::SigContext) => {
                return Some(word(0, kb | kind::SIGCONTEXT, 0));
            }
            (Cfa::Unsupported, ReturnAddress::Unknown, SavedRbp::Lost) => {
                return Some(word(
                    0,
                    kb | kind::UNSUPPORTED | (kind::A64_RA_FP_LOST << kind::RBP_SHIFT),
                    0,
                ));
            }
            (Cfa::SigContext | Cfa::Unsupported, _, _) => return None,
            (Cfa::Plt { .. } | Cfa::DerefRsp { .. } | Cfa::DerefRbp { .. }, _, _) => return None,
            (_, ReturnAddress::SigContext | ReturnAddress::Unknown, _) => return None,
            (_, ReturnAddress::AtCfaMinus8, _) => return None,
            (_, _, SavedRbp::SigContext | SavedRbp::AtRbp(_)) => return None,
            _ => {}
        }
        let (cfa_kind, arg, cfa_aux) = match self.cfa {
            Cfa::Rsp(off) => match u16::try_from(off) {
                Ok(a) => (kind::RSP, a, None),
                Err(_) if off % 8 == 0 => (kind::RSP_X8, u16::try_from(off / 8).ok()?, None),
                Err(_) => return None,
            },
            Cfa::Rbp(off) => (kind::RBP, off, None),
            Cfa::Register { reg, offset } => {
                if u16::from(reg) >= REG_X29 {
                    return None;
                }
                (kind::REGISTER, offset, Some(reg))
            }
            _ => return None,
        };
        // A save area at the bottom of the frame (large frames keep their
        // record below the locals, more than 1 KiB from the CFA) is where
        // the CFA's register points: aux 0, an offset no save has (saves
        // are below the CFA).
        let base = match self.cfa {
            Cfa::Rsp(off) => i16::try_from(off).ok().map(|o| -o),
            Cfa::Rbp(off) => i16::try_from(off).ok().map(|o| -o),
            _ => None,
        };
        let at = |off: i16| -> Option<u8> {
            if Some(off) == base {
                return Some(0);
            }
            slots(off.into()).filter(|&a| a != 0)
        };
        // (bits 6-7, aux) for the return address and x29.
        let (ra_kind, ra_aux) = match (self.ra, self.rbp) {
            (ReturnAddress::Undefined, SavedRbp::Unchanged) => {
                kb |= kind::RA_UNDEFINED;
                (kind::A64_LR, None)
            }
            (ReturnAddress::Undefined, _) => return None,
            (ReturnAddress::Lr, SavedRbp::Unchanged) => (kind::A64_LR, None),
            (ReturnAddress::Lr, _) => return None,
            (ReturnAddress::AtCfa(ra), SavedRbp::AtCfa(fp))
                if i32::from(fp) + 8 == i32::from(ra) =>
            {
                (kind::A64_RECORD, Some(at(fp)?))
            }
            (ReturnAddress::AtCfa(ra), SavedRbp::Unchanged) => (kind::A64_RA, Some(at(ra)?)),
            (ReturnAddress::AtCfa(ra), SavedRbp::Lost) => (kind::A64_RA_FP_LOST, Some(at(ra)?)),
            (ReturnAddress::AtCfa(_), _) => return None,
            _ => return None,
        };
        kb |= ra_kind << kind::RBP_SHIFT;
        let aux = match (cfa_aux, ra_aux) {
            (Some(_), Some(_)) => return None,
            (Some(a), None) | (None, Some(a)) => a,
            (None, None) => 0,
        };
        Some(word(arg, kb | cfa_kind, aux))
    }

    /// The rule of a word of `arch`: `Ok(None)` for a gap, `Err(())` for a
    /// word no encoder writes.
    #[allow(clippy::result_unit_err)]
    pub fn decode(w: u32, arch: Arch) -> Result<Option<Rule>, ()> {
        match arch {
            Arch::X86_64 => Rule::decode_x86_64(w),
            Arch::Aarch64 => Rule::decode_aarch64(w),
        }
    }

    fn decode_aarch64(w: u32) -> Result<Option<Rule>, ()> {
        let arg = (w & 0xffff) as u16;
        let kb = ((w >> 16) & 0xff) as u8;
        let aux = (w >> 24) as u8;
        let signal_frame = kb & kind::SIGNAL_FRAME != 0;
        // aux 0: at the CFA's register (CFA - arg), see encode_aarch64.
        let base = match kb & 0x0f {
            kind::RSP | kind::RBP => i16::try_from(arg).ok().map(|a| -a),
            _ => None,
        };
        let off = if aux == 0 {
            base.unwrap_or(0)
        } else {
            i16::from(aux as i8) * 8
        };
        let ra_kind = kb >> kind::RBP_SHIFT;
        let (ra, rbp) = match ra_kind {
            _ if kb & kind::RA_UNDEFINED != 0 => (ReturnAddress::Undefined, SavedRbp::Unchanged),
            kind::A64_LR => (ReturnAddress::Lr, SavedRbp::Unchanged),
            kind::A64_RECORD => (ReturnAddress::AtCfa(off + 8), SavedRbp::AtCfa(off)),
            kind::A64_RA => (ReturnAddress::AtCfa(off), SavedRbp::Unchanged),
            _ => (ReturnAddress::AtCfa(off), SavedRbp::Lost),
        };
        let aux_taken = ra_kind != kind::A64_LR;
        let cfa = match kb & 0x0f {
            kind::GAP if w == GAP_WORD => return Ok(None),
            kind::SIGCONTEXT => Cfa::SigContext,
            kind::UNSUPPORTED => Cfa::Unsupported,
            kind::RSP => Cfa::Rsp(arg.into()),
            kind::RSP_X8 => Cfa::Rsp(u32::from(arg) * 8),
            kind::RBP => Cfa::Rbp(arg),
            kind::REGISTER if !aux_taken => Cfa::Register {
                reg: aux,
                offset: arg,
            },
            _ => return Err(()),
        };
        let rule = match cfa {
            Cfa::SigContext => Rule::sigcontext(signal_frame),
            Cfa::Unsupported => Rule::unsupported(signal_frame),
            _ => Rule {
                cfa,
                rbp,
                ra,
                signal_frame,
            },
        };
        if rule.encode_aarch64() == Some(w) {
            Ok(Some(rule))
        } else {
            Err(())
        }
    }

    fn decode_x86_64(w: u32) -> Result<Option<Rule>, ()> {
        let arg = (w & 0xffff) as u16;
        let kb = ((w >> 16) & 0xff) as u8;
        let aux = (w >> 24) as u8;
        let signal_frame = kb & kind::SIGNAL_FRAME != 0;
        let ra = if kb & kind::RA_UNDEFINED != 0 {
            ReturnAddress::Undefined
        } else {
            ReturnAddress::AtCfaMinus8
        };
        let rbp_kind = kb >> kind::RBP_SHIFT;
        let rbp = match rbp_kind {
            kind::RBP_UNCHANGED => SavedRbp::Unchanged,
            kind::RBP_AT_CFA => SavedRbp::AtCfa(i16::from(aux as i8) * 8),
            kind::RBP_AT_RBP => SavedRbp::AtRbp(i16::from(aux as i8) * 8),
            _ => SavedRbp::Lost,
        };
        let rbp_has_aux = matches!(rbp_kind, kind::RBP_AT_CFA | kind::RBP_AT_RBP);
        let deref = || {
            let offset = i16::from((arg & 0xff) as u8 as i8) * 8;
            let add = (arg >> 8) * 8;
            (offset, add)
        };
        let cfa = match kb & 0x0f {
            kind::GAP if w == GAP_WORD => return Ok(None),
            kind::SIGCONTEXT => Cfa::SigContext,
            kind::UNSUPPORTED => Cfa::Unsupported,
            kind::RSP => Cfa::Rsp(arg.into()),
            kind::RSP_X8 => Cfa::Rsp(u32::from(arg) * 8),
            kind::RBP => Cfa::Rbp(arg),
            kind::REGISTER if !rbp_has_aux => Cfa::Register {
                reg: aux,
                offset: arg,
            },
            kind::PLT if !rbp_has_aux => Cfa::Plt {
                offset: arg,
                threshold: aux,
            },
            kind::DEREF_RSP => {
                let (offset, add) = deref();
                Cfa::DerefRsp { offset, add }
            }
            kind::DEREF_RBP => {
                let (offset, add) = deref();
                Cfa::DerefRbp { offset, add }
            }
            _ => return Err(()),
        };
        let rule = match cfa {
            Cfa::SigContext => Rule::sigcontext(signal_frame),
            Cfa::Unsupported => Rule::unsupported(signal_frame),
            _ => Rule {
                cfa,
                rbp,
                ra,
                signal_frame,
            },
        };
        // Only canonical words: what encode writes for the rule it decodes to.
        if rule.encode_x86_64() == Some(w) {
            Ok(Some(rule))
        } else {
            Err(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rt(r: Rule) {
        rt_for(r, Arch::X86_64);
    }

    fn rt_for(r: Rule, arch: Arch) {
        let w = r
            .encode(arch)
            .unwrap_or_else(|| panic!("{r:?} does not encode"));
        assert_ne!(w, GAP_WORD);
        assert_eq!(Rule::decode(w, arch), Ok(Some(r)), "{r:?} -> {w:#x}");
    }

    fn plain(cfa: Cfa, rbp: SavedRbp) -> Rule {
        Rule {
            cfa,
            rbp,
            ra: ReturnAddress::AtCfaMinus8,
            signal_frame: false,
        }
    }

    #[test]
    fn round_trips() {
        for off in [0, 8, 16, 65535, 65536, 500_112, 8 * 65535] {
            rt(plain(Cfa::Rsp(off), SavedRbp::Unchanged));
        }
        rt(plain(Cfa::Rbp(16), SavedRbp::AtCfa(-16)));
        rt(plain(Cfa::Rsp(24), SavedRbp::AtCfa(-1024)));
        rt(plain(Cfa::Rsp(24), SavedRbp::AtCfa(1016)));
        rt(plain(
            Cfa::DerefRbp { offset: -8, add: 0 },
            SavedRbp::AtRbp(0),
        ));
        rt(plain(
            Cfa::DerefRsp {
                offset: 24,
                add: 64,
            },
            SavedRbp::AtCfa(-16),
        ));
        rt(plain(
            Cfa::Plt {
                offset: 8,
                threshold: 11,
            },
            SavedRbp::Unchanged,
        ));
        rt(plain(Cfa::Register { reg: 10, offset: 0 }, SavedRbp::Lost));
        rt(Rule {
            ra: ReturnAddress::Undefined,
            ..plain(Cfa::Rsp(8), SavedRbp::Unchanged)
        });
        rt(Rule::sigcontext(true));
        rt(Rule::unsupported(false));
        rt(Rule::unsupported(true));
        rt(Rule {
            signal_frame: true,
            ..plain(Cfa::Rsp(8), SavedRbp::Unchanged)
        });
    }

    #[test]
    fn refuses_what_does_not_fit() {
        let no = |r: Rule| assert_eq!(r.encode(Arch::X86_64), None, "{r:?}");
        no(plain(Cfa::Rsp(65537), SavedRbp::Unchanged));
        no(plain(Cfa::Rsp(8 * 65536), SavedRbp::Unchanged));
        no(plain(Cfa::Rsp(16), SavedRbp::AtCfa(-12)));
        no(plain(Cfa::Rsp(16), SavedRbp::AtCfa(-1032)));
        no(plain(
            Cfa::Plt {
                offset: 8,
                threshold: 11,
            },
            SavedRbp::AtCfa(-16),
        ));
        no(plain(
            Cfa::Register { reg: 7, offset: 8 },
            SavedRbp::Unchanged,
        ));
        no(plain(
            Cfa::DerefRsp { offset: 4, add: 0 },
            SavedRbp::Unchanged,
        ));
        no(plain(Cfa::SigContext, SavedRbp::Unchanged));
    }

    #[test]
    fn every_word_decodes_to_itself_or_is_refused() {
        // All kind bytes against a spread of arg/aux values, both layouts.
        for arch in [Arch::X86_64, Arch::Aarch64] {
            for kb in 0..=255u32 {
                for arg in [0u32, 1, 8, 0x00f8, 0x0808, 0xffff] {
                    for aux in [0u32, 1, 11, 0xfe, 0xff] {
                        let w = arg | (kb << 16) | (aux << 24);
                        if let Ok(Some(r)) = Rule::decode(w, arch) {
                            assert_eq!(r.encode(arch), Some(w), "{arch:?} {w:#x} {r:?}");
                        }
                    }
                }
            }
        }
    }

    fn a64(cfa: Cfa, ra: ReturnAddress, rbp: SavedRbp) -> Rule {
        Rule {
            cfa,
            rbp,
            ra,
            signal_frame: false,
        }
    }

    #[test]
    fn aarch64_round_trips() {
        use ReturnAddress::{AtCfa, Lr, Undefined};
        let rt = |r| rt_for(r, Arch::Aarch64);
        // A leaf: CFA = SP, the return address in x30.
        rt(a64(Cfa::Rsp(0), Lr, SavedRbp::Unchanged));
        // After `stp x29, x30, [sp, #-96]!`: the frame record.
        rt(a64(Cfa::Rsp(96), AtCfa(-88), SavedRbp::AtCfa(-96)));
        rt(a64(Cfa::Rbp(16), AtCfa(-8), SavedRbp::AtCfa(-16)));
        rt(a64(
            Cfa::Rsp(8 * 65535),
            AtCfa(-1016),
            SavedRbp::AtCfa(-1024),
        ));
        // Large frames: the record at the bottom, where SP (or x29) points.
        rt(a64(Cfa::Rsp(4608), AtCfa(-4600), SavedRbp::AtCfa(-4608)));
        rt(a64(Cfa::Rbp(1088), AtCfa(-1080), SavedRbp::AtCfa(-1088)));
        rt(a64(Cfa::Rsp(1392), AtCfa(-1392), SavedRbp::Unchanged));
        // x30 saved alone, x29 untouched or lost.
        rt(a64(Cfa::Rsp(32), AtCfa(-24), SavedRbp::Unchanged));
        rt(a64(Cfa::Rsp(32), AtCfa(-16), SavedRbp::Lost));
        rt(a64(
            Cfa::Register { reg: 16, offset: 0 },
            Lr,
            SavedRbp::Unchanged,
        ));
        rt(a64(Cfa::Rsp(0), Undefined, SavedRbp::Unchanged));
        rt(Rule::sigcontext(true));
        rt(Rule::unsupported(false));
        rt(Rule {
            signal_frame: true,
            ..a64(Cfa::Rsp(16), AtCfa(-8), SavedRbp::AtCfa(-16))
        });
        let no = |r: Rule| assert_eq!(r.encode(Arch::Aarch64), None, "{r:?}");
        // x86-64's rules have no AArch64 word, and the reverse.
        no(a64(
            Cfa::Rsp(8),
            ReturnAddress::AtCfaMinus8,
            SavedRbp::Unchanged,
        ));
        no(a64(
            Cfa::Plt {
                offset: 8,
                threshold: 11,
            },
            Lr,
            SavedRbp::Unchanged,
        ));
        assert_eq!(
            a64(Cfa::Rsp(0), Lr, SavedRbp::Unchanged).encode(Arch::X86_64),
            None
        );
        // x29 saved while the return address is still in x30 (no room).
        no(a64(Cfa::Rsp(16), Lr, SavedRbp::AtCfa(-16)));
        // The record's two halves not side by side, an odd offset, x29 as
        // the CFA register through `Register`.
        no(a64(Cfa::Rsp(32), AtCfa(-16), SavedRbp::AtCfa(-32)));
        no(a64(Cfa::Rsp(32), AtCfa(-12), SavedRbp::Unchanged));
        // Far from the CFA and not at the bottom; a save at the CFA itself.
        no(a64(Cfa::Rsp(4608), AtCfa(-2000), SavedRbp::Unchanged));
        no(a64(Cfa::Rsp(16), AtCfa(0), SavedRbp::Unchanged));
        no(a64(
            Cfa::Register { reg: 29, offset: 0 },
            Lr,
            SavedRbp::Unchanged,
        ));
        no(a64(
            Cfa::Register { reg: 3, offset: 0 },
            AtCfa(-8),
            SavedRbp::Unchanged,
        ));
    }
}
