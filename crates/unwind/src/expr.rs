//! The few DWARF expressions that compilers and linkers write into CFI and
//! that the table has a rule for. Anything else is "unsupported".

use gimli::{Encoding, Expression, Operation, Reader};

use crate::rule::{REG_RIP, REG_RSP};

/// The operations these patterns use; anything else is `Other`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    /// DW_OP_bregN offset.
    RegOffset(u16, i64),
    /// DW_OP_deref of an address-sized value.
    Deref,
    /// DW_OP_plus_uconst.
    PlusConst(u64),
    /// DW_OP_litN, DW_OP_constN (non-negative).
    Const(u64),
    And,
    Ge,
    Shl,
    Plus,
    Other,
}

/// Longer expressions are none of ours.
const MAX_OPS: usize = 16;

/// The operations of an expression, `None` if it does not parse.
pub(crate) fn ops<R: Reader>(expr: Expression<R>, encoding: Encoding) -> Option<Vec<Op>> {
    let mut bytes = expr.0;
    let mut out = Vec::new();
    while !bytes.is_empty() {
        if out.len() == MAX_OPS {
            return None;
        }
        let op = Operation::parse(&mut bytes, encoding).ok()?;
        out.push(match op {
            Operation::RegisterOffset {
                register, offset, ..
            } => Op::RegOffset(register.0, offset),
            Operation::Deref {
                size, space: false, ..
            } if size == encoding.address_size => Op::Deref,
            Operation::PlusConstant { value } => Op::PlusConst(value),
            Operation::UnsignedConstant { value } => Op::Const(value),
            Operation::SignedConstant { value } if value >= 0 => Op::Const(value.unsigned_abs()),
            Operation::And => Op::And,
            Operation::Ge => Op::Ge,
            Operation::Shl => Op::Shl,
            Operation::Plus => Op::Plus,
            _ => Op::Other,
        });
    }
    Some(out)
}

/// The CFA of a 16-byte lazy PLT entry as GNU ld describes it:
/// `breg7 OFF; breg16 0; lit15; and; litT; ge; lit3; shl; plus`, that is
/// RSP + OFF + (((RIP & 15) >= T) << 3). Returns (OFF, T).
pub(crate) fn plt(ops: &[Op]) -> Option<(i64, u64)> {
    use Op::*;
    match ops {
        [RegOffset(REG_RSP, off), RegOffset(REG_RIP, 0), Const(15), And, Const(t), Ge, Const(3), Shl, Plus] => {
            Some((*off, *t))
        }
        _ => None,
    }
}

/// `bregN OFF; deref` with an optional `plus_uconst ADD`: the CFA is a
/// value saved on the stack. Returns (N, OFF, ADD).
pub(crate) fn deref(ops: &[Op]) -> Option<(u16, i64, u64)> {
    use Op::*;
    match ops {
        [RegOffset(r, off), Deref] => Some((*r, *off, 0)),
        [RegOffset(r, off), Deref, PlusConst(add)] => Some((*r, *off, *add)),
        _ => None,
    }
}

/// `bregN OFF` alone: a register saved at register + offset. Returns (N, OFF).
pub(crate) fn reg_offset(ops: &[Op]) -> Option<(u16, i64)> {
    match ops {
        [Op::RegOffset(r, off)] => Some((*r, *off)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gimli::{EndianSlice, Format, LittleEndian};

    fn parse(bytes: &[u8]) -> Option<Vec<Op>> {
        let enc = Encoding {
            address_size: 8,
            format: Format::Dwarf32,
            version: 1,
        };
        ops(Expression(EndianSlice::new(bytes, LittleEndian)), enc)
    }

    #[test]
    fn recognises_the_ld_plt() {
        // breg7 8; breg16 0; lit15; and; lit11; ge; lit3; shl; plus
        let b = [0x77, 8, 0x80, 0, 0x3f, 0x1a, 0x3b, 0x2a, 0x33, 0x24, 0x22];
        let o = parse(&b).unwrap_or_default();
        assert_eq!(plt(&o), Some((8, 11)));
        // The IBT PLT: lit9.
        let b = [0x77, 8, 0x80, 0, 0x3f, 0x1a, 0x39, 0x2a, 0x33, 0x24, 0x22];
        assert_eq!(plt(&parse(&b).unwrap_or_default()), Some((8, 9)));
        // Another mask is not a 16-byte PLT.
        let b = [0x77, 8, 0x80, 0, 0x37, 0x1a, 0x39, 0x2a, 0x33, 0x24, 0x22];
        assert_eq!(plt(&parse(&b).unwrap_or_default()), None);
    }

    #[test]
    fn recognises_derefs() {
        // breg6 -8; deref
        assert_eq!(
            deref(&parse(&[0x76, 0x78, 0x06]).unwrap_or_default()),
            Some((6, -8, 0))
        );
        // breg7 24; deref; plus_uconst 8
        assert_eq!(
            deref(&parse(&[0x77, 24, 0x06, 0x23, 8]).unwrap_or_default()),
            Some((7, 24, 8))
        );
        // breg7 160; deref (sleb128 160 = 0xa0 0x01)
        assert_eq!(
            deref(&parse(&[0x77, 0xa0, 0x01, 0x06]).unwrap_or_default()),
            Some((7, 160, 0))
        );
        assert_eq!(
            reg_offset(&parse(&[0x76, 0x00]).unwrap_or_default()),
            Some((6, 0))
        );
        // Truncated: no parse.
        assert_eq!(parse(&[0x77]), None);
    }
}
