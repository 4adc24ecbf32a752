// SPDX-License-Identifier: GPL-2.0
//! Bytecode offset -> source line, for the three CPython line-table formats:
//!
//! * 3.9 `co_lnotab`: pairs (byte delta u8, line delta i8). The line holds
//!   from the pair's address until the next address; the last line runs to
//!   the end of the bytecode, so the table does not say how far it reaches.
//! * 3.10 `co_linetable` (PEP 626): pairs (range length in bytes u8, line
//!   delta i8); each pair is a half-open range, delta -128 = no line.
//! * 3.11-3.13 location table (Objects/locations.md): entries whose first
//!   byte has bit 7 set, bits 3-6 a form code and bits 0-2 the length in code
//!   units minus one; forms 13/14 carry a signed varint line delta, 10-12 an
//!   implicit delta of 0-2, 15 = no location, the rest delta 0. Column bytes
//!   follow but never affect the line.
//!
//! Every decoder mirrors the arithmetic of CPython's own PyCode_Addr2Line,
//! since that is what tracebacks and `frame.f_lineno` report. Inputs are
//! untrusted (read from another process, possibly torn or truncated), so no
//! path may panic and all arithmetic is checked or done in i64.

/// Source line of the instruction at `byte_offset` (as returned by
/// `offsets::instr_offset`) in a code object of CPython `major.minor`.
///
/// `linetable` is the raw content of `co_lnotab` (3.9) / `co_linetable`
/// (3.10+); it may be a prefix of the real table. `None` means: no line for
/// that instruction, an unsupported version, or a table that ends before
/// the entry covering the offset.
///
/// 3.9 caveat: `co_lnotab` does not cover the tail of the bytecode, so a
/// prefix is indistinguishable from the whole table; this function assumes
/// the whole table. Use [`line_for_prefix`] with `table_complete = false`
/// when a 3.9 table may have been cut short.
pub fn line_for(
    major: u8,
    minor: u8,
    linetable: &[u8],
    firstlineno: u32,
    byte_offset: u32,
) -> Option<u32> {
    line_for_prefix(major, minor, linetable, firstlineno, byte_offset, true)
}

/// Like [`line_for`], but says whether `linetable` is the complete table.
/// Only 3.9 needs to know; 3.10+ tables cover every code unit explicitly,
/// so a short table is detected by itself.
pub fn line_for_prefix(
    major: u8,
    minor: u8,
    linetable: &[u8],
    firstlineno: u32,
    byte_offset: u32,
    table_complete: bool,
) -> Option<u32> {
    let first = i64::from(firstlineno);
    let off = i64::from(byte_offset);
    let line = match (major, minor) {
        (3, 9) => lnotab(linetable, first, off, table_complete),
        (3, 10) => linetable_310(linetable, first, off),
        (3, 11..=13) => locations(linetable, first, off),
        _ => None,
    }?;
    // CPython uses negative lines to mean "none"; anything above u32 can
    // only come from garbage input.
    u32::try_from(line).ok()
}

/// 3.9: walk pairs until the next address passes the offset.
fn lnotab(t: &[u8], first: i64, off: i64, complete: bool) -> Option<i64> {
    let mut line = first;
    let mut addr: i64 = 0;
    let mut pairs = t.chunks_exact(2);
    for p in &mut pairs {
        addr += i64::from(p[0]);
        if addr > off {
            return Some(line);
        }
        line += i64::from(p[1] as i8);
    }
    // A dangling address byte of a cut pair still bounds the current line.
    if matches!(pairs.remainder(), [b] if addr + i64::from(*b) > off) {
        return Some(line);
    }
    // Out of pairs: in a complete table the last line reaches the end.
    complete.then_some(line)
}

/// 3.10: find the non-empty range holding the offset. Empty ranges still
/// move the line, exactly as CPython's advance() does.
fn linetable_310(t: &[u8], first: i64, off: i64) -> Option<i64> {
    let mut line = first;
    let mut end: i64 = 0;
    for p in t.chunks_exact(2) {
        let start = end;
        end += i64::from(p[0]);
        let delta = p[1] as i8;
        let here = if delta == -128 {
            None
        } else {
            line += i64::from(delta);
            Some(line)
        };
        if start <= off && off < end {
            return here;
        }
    }
    None
}

/// Location-table form codes that matter for the line (bits 3-6).
const FORM_ONE_LINE0: u8 = 10;
const FORM_ONE_LINE2: u8 = 12;
const FORM_NO_COLUMNS: u8 = 13;
const FORM_LONG: u8 = 14;
const FORM_NONE: u8 = 15;

/// 3.11+: step entry by entry; each covers 1-8 code units.
fn locations(t: &[u8], first: i64, off: i64) -> Option<i64> {
    let mut line = first;
    let mut end: i64 = 0;
    let mut pos = 0usize;
    while let Some(&head) = t.get(pos) {
        pos += 1;
        // Only entry heads have bit 7; CPython skips anything else the
        // same way when it moves to the next entry.
        if head & 0x80 == 0 {
            continue;
        }
        let form = (head >> 3) & 0x0f;
        let start = end;
        end += (i64::from(head & 7) + 1) * 2;
        let delta = match form {
            FORM_NO_COLUMNS | FORM_LONG => {
                // A cut varint leaves this and every later line unknown.
                signed_varint(t.get(pos..).unwrap_or(&[]))?
            }
            FORM_ONE_LINE0..=FORM_ONE_LINE2 => i64::from(form - FORM_ONE_LINE0),
            _ => 0,
        };
        line += delta;
        if start <= off && off < end {
            return if form == FORM_NONE { None } else { Some(line) };
        }
        // Skip column data up to the next entry head.
        while t.get(pos).is_some_and(|b| b & 0x80 == 0) {
            pos += 1;
        }
    }
    None
}

/// Zig-zag-like signed varint of the location table: 6 data bits per byte,
/// least significant chunk first, bit 6 = more follows; the low bit of the
/// assembled value is the sign. `None` if cut short or absurdly long.
fn signed_varint(b: &[u8]) -> Option<i64> {
    let mut val: u64 = 0;
    let mut shift = 0u32;
    for &byte in b {
        // A head byte inside a varint means the data is not a location
        // table; treat like truncation rather than guessing.
        if byte & 0x80 != 0 {
            return None;
        }
        val |= u64::from(byte & 63) << shift;
        if byte & 64 == 0 {
            let mag = (val >> 1) as i64;
            return Some(if val & 1 == 1 { -mag } else { mag });
        }
        shift += 6;
        // CPython accumulates in 32 bits; longer chains are corrupt.
        if shift > 30 {
            return None;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    // Small hand-built tables: each line pins one rule of a format, so a
    // golden-data failure can be narrowed down quickly.
    #[test]
    fn lnotab_basics() {
        // 0..6 -> 10, 6..10 -> 12, 10.. -> 11 (negative delta)
        let t = [6, 2, 4, 0xff];
        assert_eq!(line_for(3, 9, &t, 10, 0), Some(10));
        assert_eq!(line_for(3, 9, &t, 10, 5), Some(10));
        assert_eq!(line_for(3, 9, &t, 10, 6), Some(12));
        assert_eq!(line_for(3, 9, &t, 10, 10), Some(11));
        assert_eq!(line_for(3, 9, &t, 10, 400), Some(11));
        assert_eq!(line_for_prefix(3, 9, &t, 10, 400, false), None);
        assert_eq!(line_for_prefix(3, 9, &t[..3], 10, 9, false), Some(12));
        assert_eq!(line_for(3, 9, &[], 7, 0), Some(7));
    }

    #[test]
    fn linetable_310_basics() {
        // 0..4 -> 5, 4..4 empty (+3 still applies), 4..8 none, 8..10 -> 7
        let t = [4, 0, 0, 3, 4, 0x80, 2, 0xff];
        assert_eq!(line_for(3, 10, &t, 5, 0), Some(5));
        assert_eq!(line_for(3, 10, &t, 5, 4), None);
        assert_eq!(line_for(3, 10, &t, 5, 8), Some(7));
        assert_eq!(line_for(3, 10, &t, 5, 10), None);
        assert_eq!(line_for(3, 10, &t[..7], 5, 8), None);
    }

    #[test]
    fn locations_basics() {
        let t = [
            0x80 | (FORM_ONE_LINE2 << 3) | 1,
            0,
            4,                       // 2 units, +2 -> 12
            0x80 | (FORM_NONE << 3), // 1 unit, no line
            0x80 | (FORM_LONG << 3),
            0x41,
            0x01,
            0,
            1,
            2, // 1 unit, delta -32
            0x80 | (3 << 3) | 2,
            7, // short form, 3 units, +0
        ];
        // varint 0x41,0x01 = 1 | 1 << 6 = 65: odd, so -(65 >> 1) = -32
        assert_eq!(line_for(3, 11, &t, 10, 0), Some(12));
        assert_eq!(line_for(3, 11, &t, 10, 2), Some(12));
        assert_eq!(line_for(3, 12, &t, 10, 4), None);
        assert_eq!(line_for(3, 13, &t, 100, 6), Some(70));
        assert_eq!(line_for(3, 13, &t, 100, 8), Some(70));
        assert_eq!(line_for(3, 13, &t, 100, 12), Some(70));
        assert_eq!(line_for(3, 13, &t, 100, 14), None);
        // cut inside the long form's varint
        assert_eq!(line_for(3, 13, &t[..6], 100, 6), None);
        // cut after the line varint: line known, columns missing
        assert_eq!(line_for(3, 13, &t[..7], 100, 6), Some(70));
        assert_eq!(line_for(3, 8, &t, 100, 0), None);
    }

    #[test]
    fn negative_line_is_none() {
        let t = [0x80 | (FORM_NO_COLUMNS << 3), 0x05]; // delta -2
        assert_eq!(line_for(3, 12, &t, 1, 0), None);
    }
}
