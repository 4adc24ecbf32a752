//! Rules for the functions of an AArch64 vDSO built without CFI (Debian's
//! arm64 kernels), read from their instructions. Without them a sample in
//! `__kernel_clock_gettime` fell back to the frame-pointer walk, whose
//! first record is the caller's caller's: the C library's wrapper was lost,
//! and the callers above a function without frame pointers with it.
//!
//! The vDSO is the kernel's own small C, in two shapes: leaves that never
//! move SP nor save x30 (the clocks), and functions with one frame record
//! pushed at entry (`stp x29, x30, [sp, #-N]!; mov x29, sp`), popped before
//! each `ret` (`ldp x29, x30, [sp], #N`). Anything else that moves SP or
//! reloads x29 gives that function no rule: the walk falls back as before.

use object::read::elf::ElfFile64;
use object::read::ReadRef;
use object::{Endianness, Object, ObjectSection, ObjectSymbol, SymbolKind};

use crate::cfi::Row;
use crate::rule::{Cfa, ReturnAddress, Rule, SavedRbp};

/// Where the frame is at one instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Nothing pushed: the CFA is SP, the return address in x30.
    Leaf,
    /// The record is pushed at SP, x29 not yet set: CFA = SP + N.
    Pushed(u32),
    /// x29 points at the record: CFA = x29 + N.
    Framed(u32),
    /// The record popped, `ret` ahead: a leaf again until the function's
    /// body (framed at N) resumes after it.
    Popped(u32),
}

impl State {
    fn rule(self) -> Rule {
        let record = |n: u32| -> Option<i16> { i16::try_from(n).ok().map(|n| -n) };
        let (cfa, rbp, ra) = match self {
            State::Leaf | State::Popped(_) => (Cfa::Rsp(0), SavedRbp::Unchanged, ReturnAddress::Lr),
            State::Pushed(n) => match record(n) {
                Some(at) => (
                    Cfa::Rsp(n),
                    SavedRbp::AtCfa(at),
                    ReturnAddress::AtCfa(at + 8),
                ),
                None => return Rule::unsupported(false),
            },
            State::Framed(n) => match (record(n), u16::try_from(n)) {
                (Some(at), Ok(off)) => (
                    Cfa::Rbp(off),
                    SavedRbp::AtCfa(at),
                    ReturnAddress::AtCfa(at + 8),
                ),
                _ => return Rule::unsupported(false),
            },
        };
        Rule {
            cfa,
            rbp,
            ra,
            signal_frame: false,
        }
    }
}

const RET: [u32; 3] = [0xd65f_03c0, 0xd65f_0bff, 0xd65f_0fff]; // ret, retaa, retab
const MOV_X29_SP: u32 = 0x9100_03fd;

/// `stp x29, x30, [sp, #-N]!`: N.
fn push_record(i: u32) -> Option<u32> {
    if i & 0xffc0_7fff != 0xa980_7bfd {
        return None;
    }
    let imm = ((i >> 15) & 0x7f) as i32;
    let imm = if imm & 0x40 != 0 { imm - 0x80 } else { imm };
    u32::try_from(-imm * 8).ok().filter(|&n| n > 0)
}

/// `ldp x29, x30, [sp], #N`: N.
fn pop_record(i: u32) -> Option<u32> {
    let imm = (i >> 15) & 0x7f;
    if i & 0xffc0_7fff != 0xa8c0_7bfd || imm & 0x40 != 0 {
        return None;
    }
    Some(imm * 8).filter(|&n| n > 0)
}

/// The instruction writes SP: add/sub (immediate or extended register) to
/// SP, or a load or store with writeback to its SP base.
fn writes_sp(i: u32) -> bool {
    let rd_sp = i & 0x1f == 31;
    let add_sub_imm = i & 0x1f00_0000 == 0x1100_0000 && i & (1 << 29) == 0;
    let add_sub_ext = i & 0x1fe0_0000 == 0x0b20_0000 && i & (1 << 29) == 0;
    let base_sp = (i >> 5) & 0x1f == 31;
    // Load/store pair, post-index (01) or pre-index (11).
    let pair_wb = i & 0x3a00_0000 == 0x2800_0000 && (i >> 23) & 1 == 1;
    // Load/store register, immediate post- (01) or pre-index (11).
    let reg_wb = i & 0x3b20_0000 == 0x3800_0000 && (i >> 10) & 1 == 1;
    ((add_sub_imm || add_sub_ext) && rd_sp) || ((pair_wb || reg_wb) && base_sp)
}

/// The instruction loads x29 (a pair or a single register).
fn loads_x29(i: u32) -> bool {
    let rt = i & 0x1f;
    let pair_load = i & 0x3a40_0000 == 0x2840_0000;
    // LDR (64-bit): unsigned offset, or unscaled/indexed/register offset.
    let ldr_class = i & 0x3b00_0000 == 0x3900_0000 || i & 0x3b00_0000 == 0x3800_0000;
    let ldr = ldr_class && (i >> 22) & 3 == 1;
    (pair_load && (rt == 29 || (i >> 10) & 0x1f == 29)) || (ldr && rt == 29)
}

/// The rows of one function at `start` whose instructions are `code`, or
/// `None` when an instruction is not one the two shapes have.
fn function_rows(start: u64, code: &[u8]) -> Option<Vec<Row>> {
    let mut rows: Vec<Row> = Vec::new();
    let mut state = State::Leaf;
    // The state the function's body is in: where a path resumes after a
    // `ret` or tail call ends the one before it.
    let mut body = State::Leaf;
    let mut emit = |at: u64, s: State| match rows.last_mut() {
        Some(r) if r.rule == s.rule() => r.end = at + 4,
        _ => rows.push(Row {
            start: at,
            end: at + 4,
            rule: s.rule(),
            unsupported: None,
            rbp_dropped: false,
        }),
    };
    for (k, w) in code.chunks_exact(4).enumerate() {
        let at = start + 4 * k as u64;
        let i = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
        // The rule at an instruction is the state before it runs.
        emit(at, state);
        state = match state {
            State::Leaf => match push_record(i) {
                Some(n) => State::Pushed(n),
                None if writes_sp(i) || loads_x29(i) => return None,
                None => State::Leaf,
            },
            State::Pushed(n) if i == MOV_X29_SP => {
                body = State::Framed(n);
                body
            }
            State::Pushed(_) if writes_sp(i) || loads_x29(i) => return None,
            State::Pushed(n) => State::Pushed(n),
            State::Framed(n) => match pop_record(i) {
                Some(m) if m == n => State::Popped(n),
                Some(_) => return None,
                None if loads_x29(i) => return None,
                // SP moves freely below the record: the CFA is x29's.
                None => State::Framed(n),
            },
            State::Popped(n) => {
                let unconditional_branch = i & 0xfc00_0000 == 0x1400_0000;
                if RET.contains(&i) || unconditional_branch {
                    body
                } else if writes_sp(i) || loads_x29(i) {
                    return None;
                } else {
                    State::Popped(n)
                }
            }
        };
    }
    Some(rows)
}

/// Rows for the function symbols of a CFI-less AArch64 vDSO, but the
/// signal trampoline (described on its own), and how many functions got
/// rules.
pub(crate) fn rows<'a, R: ReadRef<'a>>(elf: &ElfFile64<'a, Endianness, R>) -> (Vec<Row>, usize) {
    let mut out = Vec::new();
    let mut functions = 0;
    for sym in elf.dynamic_symbols() {
        if sym.kind() != SymbolKind::Text
            || sym.size() < 4
            || sym.name() == Ok("__kernel_rt_sigreturn")
        {
            continue;
        }
        let Some(section) = sym
            .section_index()
            .and_then(|i| elf.section_by_index(i).ok())
        else {
            continue;
        };
        let Ok(data) = section.data() else {
            continue;
        };
        let Some(code) = sym
            .address()
            .checked_sub(section.address())
            .and_then(|off| usize::try_from(off).ok())
            .and_then(|off| data.get(off..off.checked_add(usize::try_from(sym.size()).ok()?)?))
        else {
            continue;
        };
        if let Some(rows) = function_rows(sym.address(), code) {
            functions += 1;
            out.extend(rows);
        }
    }
    (out, functions)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(insns: &[u32]) -> Vec<u8> {
        insns.iter().flat_map(|i| i.to_le_bytes()).collect()
    }

    fn states(insns: &[u32]) -> Option<Vec<(u64, Rule)>> {
        function_rows(0x1000, &bytes(insns)).map(|rows| {
            rows.iter()
                .flat_map(|r| (r.start..r.end).step_by(4).map(move |a| (a, r.rule)))
                .collect()
        })
    }

    #[test]
    fn a_leaf_is_one_row_returning_through_x30() {
        // __kernel_clock_gettime's shape: loads, a compare, `ret`.
        let rows = function_rows(
            0x340,
            &bytes(&[0xa940_a86b, 0x8b24_63e4, 0xa900_0026, 0xd65f_03c0]),
        )
        .unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!((rows[0].start, rows[0].end), (0x340, 0x350));
        assert_eq!(rows[0].rule, State::Leaf.rule());
        assert!(rows[0].rule.encode(crate::Arch::Aarch64).is_some());
    }

    #[test]
    fn a_frame_record_is_followed_through_prologue_and_each_epilogue() {
        // __kernel_getrandom's shape (6.12's vDSO).
        let s = states(&[
            0xd503_233f, // paciasp
            0xa9b8_7bfd, // stp x29, x30, [sp, #-128]!
            0x9100_03fd, // mov x29, sp
            0xa901_53f3, // stp x19, x20, [sp, #16]
            0xa8c8_7bfd, // ldp x29, x30, [sp], #128
            0xd503_23bf, // autiasp
            0xd65f_03c0, // ret
            0xa941_53f3, // ldp x19, x20, [sp, #16] (another path, framed)
            0xa8c8_7bfd, // ldp x29, x30, [sp], #128
            0xd65f_03c0, // ret
        ])
        .unwrap();
        let leaf = State::Leaf.rule();
        let pushed = State::Pushed(128).rule();
        let framed = State::Framed(128).rule();
        let want = [
            leaf, leaf, pushed, framed, framed, leaf, leaf, framed, framed, leaf,
        ];
        assert_eq!(s.iter().map(|x| x.1).collect::<Vec<_>>(), want);
        for r in [pushed, framed] {
            assert!(r.encode(crate::Arch::Aarch64).is_some(), "{r:?}");
        }
    }

    #[test]
    fn other_stack_moves_give_no_rule() {
        // sub sp, sp, #32 in a leaf; str x19, [sp, #-16]!; ldr x29, [sp].
        assert!(states(&[0xd100_83ff, 0xd65f_03c0]).is_none());
        assert!(states(&[0xf81f_0ff3, 0xd65f_03c0]).is_none());
        assert!(states(&[0xa9b8_7bfd, 0x9100_03fd, 0xf940_03fd, 0xd65f_03c0]).is_none());
        // A different pop than the push.
        assert!(states(&[0xa9b8_7bfd, 0x9100_03fd, 0xa8c1_7bfd, 0xd65f_03c0]).is_none());
    }
}
