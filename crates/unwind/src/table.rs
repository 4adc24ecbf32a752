//! Rows to the sorted, merged entry list, and the entry list to and from
//! its bytes (the layout is in the crate documentation).

use std::collections::HashSet;

use crate::cfi::{Reason, Row};
use crate::rule::{kind, Arch, Cfa, Rule, GAP_WORD};
use crate::{Stats, UnwindTable};

pub const MAGIC: [u8; 4] = *b"BSUW";
pub const VERSION: u16 = 1;
pub const HEADER_SIZE: usize = 24;
pub const ENTRY_SIZE: usize = 8;

/// One entry: from `offset` (relative to the table's base) up to the next
/// entry's offset, `word` applies (`Rule::decode`; 0 is a gap).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub offset: u32,
    pub word: u32,
}

impl Entry {
    /// The entry's rule in a table of `arch`; `None` for a gap.
    pub fn rule(&self, arch: Arch) -> Option<Rule> {
        Rule::decode(self.word, arch).ok().flatten()
    }

    /// The CFA kind (bits 0-3 of the kind byte).
    pub fn cfa_kind(&self) -> u8 {
        ((self.word >> 16) & 0x0f) as u8
    }
}

/// Why the bytes handed to `lookup_in_bytes` are not a table.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error("not an unwind table (magic or version)")]
    Header,
    #[error("unwind table truncated: {entries} entries announced, {bytes} bytes")]
    Truncated { entries: u32, bytes: usize },
    #[error("unwind table entries out of order at index {0}")]
    Order(usize),
    #[error("unwind table entry {0} has an invalid rule word")]
    Word(usize),
}

/// Appends an entry, merging it with the previous one when the rule is the
/// same and replacing the previous one when the offset is.
fn push(out: &mut Vec<Entry>, offset: u32, word: u32) {
    if let Some(last) = out.last_mut() {
        if last.offset == offset {
            last.word = word;
            let n = out.len();
            if n >= 2 && out[n - 2].word == word {
                out.pop();
            }
            return;
        }
        if last.word == word {
            return;
        }
    } else if word == GAP_WORD {
        return;
    }
    out.push(Entry { offset, word });
}

/// A row as the merge needs it: 16 bytes where a `Row` takes 40, made as
/// each row is collected. A compiler's library has over a million rows:
/// collected as `Row`s they took 56 MB, and its compile peaked at 72 MB.
#[derive(Clone, Copy)]
struct Compact {
    /// From the collection's base.
    start: u32,
    len: u32,
    word: u32,
    /// The row's place among all rows: sorting by (start, seq) without a
    /// scratch buffer keeps the order a stable sort would.
    seq: u32,
}

/// The rows of every FDE (any order) as they are collected, with the
/// stats that count rows.
pub(crate) struct Rows {
    arch: Arch,
    /// Row starts are kept relative to this address (the lowest code
    /// segment's, lowered if a row starts below it).
    base: u64,
    rows: Vec<Compact>,
    /// A row 32 bits cannot hold from the base: (low, high) for the error.
    span: Option<(u64, u64)>,
}

impl Rows {
    /// `base`: the lowest code segment's address, if the file says; else
    /// the first row's start.
    pub(crate) fn new(arch: Arch, base: Option<u64>) -> Rows {
        Rows {
            arch,
            base: base.unwrap_or(u64::MAX),
            rows: Vec::new(),
            span: None,
        }
    }

    /// Counts a row in `stats` and keeps it, if its rule has a word.
    pub(crate) fn push(&mut self, r: &Row, stats: &mut Stats) {
        stats.rows += 1;
        match r.unsupported {
            Some(Reason::CfaExpression) => stats.unsupported.cfa_expression += 1,
            Some(Reason::CfaRegister) => stats.unsupported.cfa_register += 1,
            Some(Reason::CfaOffset) => stats.unsupported.cfa_offset += 1,
            Some(Reason::ReturnAddress) => stats.unsupported.return_address += 1,
            Some(Reason::InvalidCfi) => stats.unsupported.invalid_cfi += 1,
            None => {}
        }
        if r.rbp_dropped {
            stats.rbp_dropped_rows += 1;
        }
        match r.rule.cfa {
            Cfa::Plt { .. } => stats.plt_rows += 1,
            Cfa::SigContext => stats.sigcontext_rows += 1,
            Cfa::Rbp(_) => stats.rbp_cfa_rows += 1,
            Cfa::DerefRsp { .. } | Cfa::DerefRbp { .. } => stats.deref_rows += 1,
            Cfa::Register { .. } => stats.register_rows += 1,
            _ => {}
        }
        let Some(word) = r.rule.encode(self.arch) else {
            return;
        };
        if self.rows.is_empty() && self.span.is_none() {
            self.base = self.base.min(r.start);
        } else if r.start < self.base {
            self.rebase(r.start);
        }
        let start = u32::try_from(r.start - self.base);
        let len = u32::try_from(r.end.saturating_sub(r.start));
        let seq = u32::try_from(self.rows.len());
        match (start, len, seq) {
            (Ok(start), Ok(len), Ok(seq)) => self.rows.push(Compact {
                start,
                len,
                word,
                seq,
            }),
            _ => {
                let (low, high) = self.span.unwrap_or((r.start, r.end));
                self.span = Some((low.min(r.start).min(self.base), high.max(r.end)));
            }
        }
    }

    /// Moves the base down to `to` (a row below the code segments: rare).
    fn rebase(&mut self, to: u64) {
        let delta = self.base - to;
        let mut over = None;
        for r in &mut self.rows {
            match u32::try_from(u64::from(r.start) + delta) {
                Ok(s) => r.start = s,
                Err(_) => over = Some(self.base + u64::from(r.start) + u64::from(r.len)),
            }
        }
        if let Some(high) = over {
            self.span = Some((to, high));
        }
        self.base = to;
    }

    /// The rows' ranges (start, end), in the order collected.
    pub(crate) fn ranges(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.rows.iter().map(|r| {
            let s = self.base + u64::from(r.start);
            (s, s + u64::from(r.len))
        })
    }
}

/// Builds the entries from the rows of every FDE, filling the stats that
/// only the whole table knows.
pub(crate) fn build(rows: Rows, mut stats: Stats) -> Result<(u64, Vec<Entry>, Stats), (u64, u64)> {
    if let Some(span) = rows.span {
        return Err(span);
    }
    let at = rows.base;
    let mut rows = rows.rows;
    rows.shrink_to_fit();
    // In the order of a stable sort by start: rows of one FDE keep their
    // order, and an FDE that starts where another does follows it.
    rows.sort_unstable_by_key(|r| (r.start, r.seq));
    // Entries are pushed in address order: the first is the first row's
    // start, the last the last row's end.
    let (low, high) = match (rows.first(), rows.last()) {
        (Some(f), Some(l)) => (
            at + u64::from(f.start),
            at + u64::from(l.start) + u64::from(l.len),
        ),
        _ => (0, 0),
    };
    let base = if high <= u64::from(u32::MAX) { 0 } else { low };
    if high.saturating_sub(base) > u64::from(u32::MAX) {
        return Err((low, high));
    }
    let rel = |a: u64| (a - base) as u32;
    let mut entries: Vec<Entry> = Vec::with_capacity(rows.len() + rows.len() / 8);
    let mut end: Option<u64> = None;
    for r in &rows {
        let start = at + u64::from(r.start);
        match end {
            Some(e) if e < start => push(&mut entries, rel(e), GAP_WORD),
            // Rows of one FDE are contiguous, so this is another FDE
            // overlapping: the later one wins from its start on, up to its
            // end.
            Some(e) if e > start => stats.overlaps += 1,
            _ => {}
        }
        push(&mut entries, rel(start), r.word);
        end = Some(start + u64::from(r.len));
    }
    if let Some(e) = end {
        push(&mut entries, rel(e), GAP_WORD);
    }
    drop(rows);
    entries.shrink_to_fit();
    let mut distinct = HashSet::new();
    for (i, e) in entries.iter().enumerate() {
        distinct.insert(e.word);
        if e.word == GAP_WORD {
            stats.gap_entries += 1;
        } else if e.cfa_kind() == kind::UNSUPPORTED {
            stats.unsupported_ranges += 1;
            if let Some(next) = entries.get(i + 1) {
                stats.unsupported_bytes += u64::from(next.offset - e.offset);
            }
        }
    }
    distinct.remove(&GAP_WORD);
    stats.distinct_rules = distinct.len();
    stats.entries = entries.len();
    stats.bytes = HEADER_SIZE + ENTRY_SIZE * entries.len();
    Ok((base, entries, stats))
}

/// The index of the entry that covers `rel`, if any.
fn find(entries: &[Entry], rel: u32) -> Option<usize> {
    entries.partition_point(|e| e.offset <= rel).checked_sub(1)
}

impl UnwindTable {
    /// The ELF virtual address the entries' offsets are relative to (0
    /// unless the file's code lies above 4 GiB).
    pub fn base(&self) -> u64 {
        self.base
    }

    /// The architecture of the file, whose word layout the entries have.
    pub fn arch(&self) -> Arch {
        self.arch
    }

    /// The entries, sorted by offset; the last is a gap.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// The ranges marked unsupported because gimli refused an instruction
    /// of their FDE there (from that instruction to the FDE's end).
    pub fn invalid_cfi_ranges(&self) -> &[(u64, u64)] {
        &self.invalid_cfi
    }

    /// The rule for an ELF virtual address; `None` where no FDE applies.
    pub fn lookup(&self, addr: u64) -> Option<Rule> {
        let rel = u32::try_from(addr.checked_sub(self.base)?).ok()?;
        self.entries.get(find(&self.entries, rel)?)?.rule(self.arch)
    }

    /// The ranges with a rule: (start, end, rule), ELF virtual addresses.
    pub fn ranges(&self) -> impl Iterator<Item = (u64, u64, Rule)> + '_ {
        self.entries.windows(2).filter_map(|w| {
            let rule = w[0].rule(self.arch)?;
            Some((
                self.base + u64::from(w[0].offset),
                self.base + u64::from(w[1].offset),
                rule,
            ))
        })
    }

    /// The table as the BPF side reads it (crate documentation).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(HEADER_SIZE + ENTRY_SIZE * self.entries.len());
        b.extend_from_slice(&MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&(ENTRY_SIZE as u16).to_le_bytes());
        b.extend_from_slice(&(self.entries.len() as u32).to_le_bytes());
        b.extend_from_slice(&self.arch.e_machine().to_le_bytes());
        b.extend_from_slice(&0u16.to_le_bytes());
        b.extend_from_slice(&self.base.to_le_bytes());
        for e in &self.entries {
            b.extend_from_slice(&e.offset.to_le_bytes());
            b.extend_from_slice(&e.word.to_le_bytes());
        }
        b
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(w)
}

/// The architecture in a table's header (`e_machine` at offset 12; 0 in
/// tables written before there was a choice: x86-64).
fn header_arch(b: &[u8]) -> Option<Arch> {
    match u16::from_le_bytes([b[12], b[13]]) {
        0 => Some(Arch::X86_64),
        m => Arch::from_e_machine(m),
    }
}

/// Checks the bytes of a table and returns its base and entries.
pub fn parse_bytes(b: &[u8]) -> Result<(u64, Vec<Entry>), LayoutError> {
    if b.len() < HEADER_SIZE
        || b[0..4] != MAGIC
        || b[4..6] != VERSION.to_le_bytes()
        || b[6..8] != (ENTRY_SIZE as u16).to_le_bytes()
    {
        return Err(LayoutError::Header);
    }
    let arch = header_arch(b).ok_or(LayoutError::Header)?;
    let n = u32_at(b, 8);
    let need = (n as usize)
        .checked_mul(ENTRY_SIZE)
        .and_then(|x| x.checked_add(HEADER_SIZE));
    if need != Some(b.len()) {
        return Err(LayoutError::Truncated {
            entries: n,
            bytes: b.len(),
        });
    }
    let base = u64::from(u32_at(b, 16)) | (u64::from(u32_at(b, 20)) << 32);
    let mut entries = Vec::with_capacity(n as usize);
    for i in 0..n as usize {
        let at = HEADER_SIZE + i * ENTRY_SIZE;
        let e = Entry {
            offset: u32_at(b, at),
            word: u32_at(b, at + 4),
        };
        if Rule::decode(e.word, arch).is_err() {
            return Err(LayoutError::Word(i));
        }
        if entries.last().is_some_and(|p: &Entry| p.offset >= e.offset) {
            return Err(LayoutError::Order(i));
        }
        entries.push(e);
    }
    Ok((base, entries))
}

/// What the BPF program does: a binary search over the raw entries for
/// the last one whose address is at most `addr - base`. Reads only the
/// header and the entries it visits.
pub fn lookup_in_bytes(b: &[u8], addr: u64) -> Result<Option<Rule>, LayoutError> {
    if b.len() < HEADER_SIZE || b[0..4] != MAGIC || b[4..6] != VERSION.to_le_bytes() {
        return Err(LayoutError::Header);
    }
    let arch = header_arch(b).ok_or(LayoutError::Header)?;
    let n = u32_at(b, 8) as usize;
    if b.len() < HEADER_SIZE + n * ENTRY_SIZE {
        return Err(LayoutError::Truncated {
            entries: n as u32,
            bytes: b.len(),
        });
    }
    let base = u64::from(u32_at(b, 16)) | (u64::from(u32_at(b, 20)) << 32);
    let Some(rel) = addr.checked_sub(base).and_then(|r| u32::try_from(r).ok()) else {
        return Ok(None);
    };
    // Invariant: entries below lo start at or before rel, from hi on after.
    let (mut lo, mut hi) = (0usize, n);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if u32_at(b, HEADER_SIZE + mid * ENTRY_SIZE) <= rel {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    if lo == 0 {
        return Ok(None);
    }
    let at = HEADER_SIZE + (lo - 1) * ENTRY_SIZE;
    Rule::decode(u32_at(b, at + 4), arch).map_err(|()| LayoutError::Word(lo - 1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rule::{ReturnAddress, SavedRbp};

    fn rule(off: u32) -> Rule {
        Rule {
            cfa: Cfa::Rsp(off),
            rbp: SavedRbp::Unchanged,
            ra: ReturnAddress::AtCfaMinus8,
            signal_frame: false,
        }
    }

    fn row(start: u64, end: u64, off: u32) -> Row {
        Row {
            start,
            end,
            rule: rule(off),
            unsupported: None,
            rbp_dropped: false,
        }
    }

    fn table(rows: Vec<Row>) -> UnwindTable {
        let mut stats = Stats::default();
        let mut collected = Rows::new(Arch::X86_64, None);
        for r in &rows {
            collected.push(r, &mut stats);
        }
        match build(collected, stats) {
            Ok((base, entries, stats)) => UnwindTable {
                arch: Arch::X86_64,
                base,
                entries,
                stats,
                invalid_cfi: Vec::new(),
            },
            Err(e) => panic!("{e:?}"),
        }
    }

    #[test]
    fn gaps_merges_and_lookups() {
        // f: 0x100..0x110 (8 then 16), g: 0x110..0x120 (8), padding, h: 0x130..0x140 (16).
        let t = table(vec![
            row(0x130, 0x140, 16),
            row(0x100, 0x104, 8),
            row(0x104, 0x110, 16),
            row(0x110, 0x120, 8),
            row(0x120, 0x120, 8),
        ]);
        let offs: Vec<(u32, Option<Rule>)> = t
            .entries()
            .iter()
            .map(|e| (e.offset, e.rule(Arch::X86_64)))
            .collect();
        assert_eq!(
            offs,
            vec![
                (0x100, Some(rule(8))),
                (0x104, Some(rule(16))),
                (0x110, Some(rule(8))),
                (0x120, None),
                (0x130, Some(rule(16))),
                (0x140, None),
            ]
        );
        assert_eq!(t.lookup(0xff), None);
        assert_eq!(t.lookup(0x100), Some(rule(8)));
        assert_eq!(t.lookup(0x10f), Some(rule(16)));
        assert_eq!(t.lookup(0x125), None);
        assert_eq!(t.lookup(0x13f), Some(rule(16)));
        assert_eq!(t.lookup(0x140), None);
        let b = t.to_bytes();
        assert_eq!(b.len(), t.stats().bytes);
        for a in 0xf0..0x150 {
            assert_eq!(lookup_in_bytes(&b, a), Ok(t.lookup(a)), "{a:#x}");
        }
        assert_eq!(parse_bytes(&b), Ok((0, t.entries().to_vec())));
        let ranges: Vec<(u64, u64, Rule)> = t.ranges().collect();
        assert_eq!(
            ranges,
            vec![
                (0x100, 0x104, rule(8)),
                (0x104, 0x110, rule(16)),
                (0x110, 0x120, rule(8)),
                (0x130, 0x140, rule(16)),
            ]
        );
        assert_eq!(t.stats().gap_entries, 2);
        assert_eq!(t.stats().distinct_rules, 2);
    }

    #[test]
    fn contiguous_functions_with_the_same_rule_merge() {
        let t = table(vec![row(0x10, 0x20, 8), row(0x20, 0x30, 8)]);
        assert_eq!(t.entries().len(), 2);
        assert_eq!(t.stats().overlaps, 0);
    }

    #[test]
    fn a_later_overlapping_fde_wins_and_is_counted() {
        let t = table(vec![row(0x10, 0x40, 8), row(0x20, 0x30, 16)]);
        assert_eq!(t.stats().overlaps, 1);
        assert_eq!(t.lookup(0x1f), Some(rule(8)));
        assert_eq!(t.lookup(0x20), Some(rule(16)));
        assert_eq!(t.lookup(0x30), None);
    }

    #[test]
    fn high_addresses_get_a_base() {
        let t = table(vec![row(0x7_0000_1000, 0x7_0000_2000, 8)]);
        assert_eq!(t.base(), 0x7_0000_1000);
        assert_eq!(t.lookup(0x7_0000_1800), Some(rule(8)));
        assert_eq!(t.lookup(0x1800), None);
        let b = t.to_bytes();
        assert_eq!(lookup_in_bytes(&b, 0x7_0000_1800), Ok(Some(rule(8))));
        let mut stats = Stats::default();
        let mut rows = Rows::new(Arch::X86_64, None);
        rows.push(&row(0x10, 0x20, 8), &mut stats);
        rows.push(&row(1 << 33, (1 << 33) + 1, 8), &mut stats);
        assert!(build(rows, stats).is_err());
        // Rows below the first one's start move the base down.
        let t = table(vec![
            row(0x7_0000_2000, 0x7_0000_3000, 16),
            row(0x7_0000_1000, 0x7_0000_2000, 8),
        ]);
        assert_eq!(t.base(), 0x7_0000_1000);
        assert_eq!(t.lookup(0x7_0000_1800), Some(rule(8)));
        assert_eq!(t.lookup(0x7_0000_2800), Some(rule(16)));
    }

    #[test]
    fn damaged_bytes_are_refused() {
        let t = table(vec![row(0x10, 0x20, 8), row(0x30, 0x40, 16)]);
        let b = t.to_bytes();
        assert_eq!(
            parse_bytes(&b[..b.len() - 1]).map(|_| ()),
            Err(LayoutError::Truncated {
                entries: 4,
                bytes: b.len() - 1
            })
        );
        let mut bad = b.clone();
        bad[0] = b'X';
        assert_eq!(parse_bytes(&bad).map(|_| ()), Err(LayoutError::Header));
        // A machine without a layout.
        let mut bad = b.clone();
        bad[12] = 3;
        assert_eq!(parse_bytes(&bad).map(|_| ()), Err(LayoutError::Header));
        let mut bad = b.clone();
        bad[HEADER_SIZE + ENTRY_SIZE + 6] = 0x0e; // kind 14: unassigned
        assert_eq!(parse_bytes(&bad).map(|_| ()), Err(LayoutError::Word(1)));
        let mut bad = b;
        bad[HEADER_SIZE + ENTRY_SIZE..HEADER_SIZE + ENTRY_SIZE + 4]
            .copy_from_slice(&0u32.to_le_bytes());
        assert_eq!(parse_bytes(&bad).map(|_| ()), Err(LayoutError::Order(1)));
    }
}
