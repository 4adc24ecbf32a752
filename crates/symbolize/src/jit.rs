// SPDX-License-Identifier: GPL-2.0
//! Names for JIT-compiled code, from the two perf conventions:
//! `/tmp/perf-PID.map` text files and `jit-PID.dump` binary jitdump files
//! (perf's jit-interface.txt and jitdump-specification.txt).
//!
//! Everything ends up in one [`JitSymbols`] table: sorted, non-overlapping
//! ranges, so a lookup is one binary search. When ranges overlap the newest
//! entry wins, because JITs reuse code memory after a method is recompiled
//! or freed; the older entry keeps only the parts not covered (as perf does
//! when a new mmap overlaps an old one).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// One range of the table. `start..end` is the part this entry still owns
/// after newer overlapping entries took theirs; `code_start`/`code_size` are
/// what the producer said, so offsets into the function stay right.
#[derive(Clone, Copy, Debug)]
struct Entry {
    start: u64,
    end: u64,
    code_start: u64,
    code_size: u64,
    name_off: usize,
    lines_off: usize,
    name_len: u32,
    lines_len: u32,
}

/// One jitdump debug entry: code from `off` bytes into the function on comes
/// from `file:line`. Relative, so moved code shares its table, uncopied.
#[derive(Clone, Copy, Debug)]
struct LineEntry {
    off: u64,
    line: u32,
    column: u32,
    file: u32,
}

/// Symbol table for JIT code of one process.
#[derive(Clone, Debug, Default)]
pub struct JitSymbols {
    entries: Vec<Entry>,
    // entries[i].start, apart: the binary search then touches 8 bytes per
    // step instead of a whole entry, which matters once the table outgrows
    // the caches (measured 1.7x faster on 500k entries).
    starts: Vec<u64>,
    // Arenas rather than a String per entry: a Node map has ~10^5..10^6
    // lines, and one allocation each costs time and memory.
    names: String,
    lines: Vec<LineEntry>,
    files: Vec<Box<str>>,
}

/// Result of [`JitSymbols::lookup`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JitSym<'a> {
    pub name: &'a str,
    /// Code start and size as the JIT reported them. A newer overlapping
    /// entry may own part of that range; lookups respect that.
    pub start: u64,
    pub size: u64,
    /// Source position, when a jitdump's debug info covers the address.
    pub source: Option<SourceLine<'a>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SourceLine<'a> {
    pub file: &'a str,
    pub line: u32,
    /// jitdump's `discrim` field; V8 puts the column there.
    pub column: u32,
}

/// Errors from reading jitdumps and files. Perf maps never fail: bad lines
/// are counted and skipped.
#[derive(Debug)]
pub enum JitError {
    Io {
        path: PathBuf,
        source: io::Error,
    },
    /// Shorter than the jitdump file header.
    TooShort,
    BadMagic(u32),
    UnsupportedVersion(u32),
    /// Header `total_size` smaller than the v1 header or past the end.
    BadHeader(u32),
}

impl fmt::Display for JitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JitError::Io { path, source } => write!(f, "{}: {}", path.display(), source),
            JitError::TooShort => write!(f, "jitdump: file shorter than its header"),
            JitError::BadMagic(m) => write!(f, "jitdump: bad magic {m:#010x}"),
            JitError::UnsupportedVersion(v) => write!(f, "jitdump: unsupported version {v}"),
            JitError::BadHeader(s) => write!(f, "jitdump: bad header size {s}"),
        }
    }
}

impl std::error::Error for JitError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            JitError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// Result of [`JitSymbols::from_perf_map_since`].
#[derive(Debug)]
pub struct PerfMapChunk {
    pub symbols: JitSymbols,
    /// Byte offset just past the last complete line; pass it next time.
    pub next_offset: usize,
    /// Complete, non-blank lines read.
    pub lines: usize,
    /// Lines that were not `START SIZE NAME`.
    pub malformed: usize,
    /// Well-formed lines with size 0: they cover no address, so not stored.
    pub empty: usize,
}

impl JitSymbols {
    pub fn new() -> JitSymbols {
        JitSymbols::default()
    }

    /// Parses a whole perf map. The text is taken as complete, so a last
    /// line without `\n` is parsed too; for a file still being written use
    /// [`from_perf_map_since`](Self::from_perf_map_since) or [`PerfMapTail`].
    pub fn from_perf_map(text: &str) -> JitSymbols {
        parse_perf_map(text.as_bytes(), 0, true).symbols
    }

    /// Parses only complete lines of `text[offset..]` (bytes, as read from
    /// the file: a JIT may write names that are not UTF-8). An offset past
    /// the end yields nothing and is returned unchanged.
    pub fn from_perf_map_since(text: &[u8], offset: usize) -> PerfMapChunk {
        parse_perf_map(text, offset, false)
    }

    /// Parses a jitdump. A truncated last record (the JIT is still writing)
    /// or a corrupt record ends parsing without error: what came before is
    /// kept. Only a bad file header is an error.
    pub fn from_jitdump(bytes: &[u8]) -> Result<JitSymbols, JitError> {
        parse_jitdump(bytes)
    }

    /// Adds `newer`; its entries win where they overlap ours.
    pub fn merge(&mut self, newer: JitSymbols) {
        if newer.entries.is_empty() {
            return;
        }
        if self.entries.is_empty() {
            *self = newer;
            return;
        }
        let name_base = self.names.len();
        self.names.push_str(&newer.names);
        let mut file_ix: HashMap<Box<str>, u32> = self
            .files
            .iter()
            .enumerate()
            .map(|(i, f)| (f.clone(), i as u32))
            .collect();
        let remap: Vec<u32> = newer
            .files
            .into_iter()
            .map(|f| intern(&mut self.files, &mut file_ix, f))
            .collect();
        let line_base = self.lines.len();
        self.lines.extend(newer.lines.iter().map(|l| LineEntry {
            file: remap.get(l.file as usize).copied().unwrap_or(0),
            ..*l
        }));
        // Both sides are sorted and overlap-free, so merging is linear; the
        // painter runs only if something actually overlaps.
        let new: Vec<Entry> = newer
            .entries
            .into_iter()
            .map(|e| Entry {
                name_off: e.name_off + name_base,
                lines_off: e.lines_off + line_base,
                ..e
            })
            .collect();
        if self.disjoint_from(&new) {
            merge_in_place(&mut self.entries, new);
        } else {
            let old = std::mem::take(&mut self.entries);
            let mut tagged = Vec::with_capacity(old.len() + new.len());
            merge_sorted(old, new.into_iter(), |e, tag| tagged.push((e, tag)));
            self.entries = resolve_sorted(tagged);
        }
        self.starts = self.entries.iter().map(|e| e.start).collect();
    }

    /// The entry covering `addr`, O(log n).
    pub fn lookup(&self, addr: u64) -> Option<JitSym<'_>> {
        let i = self.starts.partition_point(|&s| s <= addr);
        let e = self.entries.get(i.checked_sub(1)?)?;
        if addr >= e.end {
            return None;
        }
        Some(self.sym(e, self.source_line(e, addr)))
    }

    /// Number of ranges (an entry split by a newer one counts per piece).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// All ranges in address order, without source lines.
    pub fn iter(&self) -> impl Iterator<Item = JitSym<'_>> + '_ {
        self.entries.iter().map(|e| self.sym(e, None))
    }

    fn with_starts(mut self) -> JitSymbols {
        self.starts = self.entries.iter().map(|e| e.start).collect();
        self
    }

    /// True if no entry of `newer` overlaps ours (the usual case when
    /// polling a growing map): merging is then a plain sorted merge.
    fn disjoint_from(&self, newer: &[Entry]) -> bool {
        newer.iter().all(|e| {
            let i = self.starts.partition_point(|&s| s < e.end);
            i == 0 || self.entries.get(i - 1).is_none_or(|p| p.end <= e.start)
        })
    }

    fn sym<'a>(&'a self, e: &Entry, source: Option<SourceLine<'a>>) -> JitSym<'a> {
        let name = self
            .names
            .get(e.name_off..e.name_off.saturating_add(e.name_len as usize))
            .unwrap_or("");
        JitSym {
            name,
            start: e.code_start,
            size: e.code_size,
            source,
        }
    }

    fn source_line(&self, e: &Entry, addr: u64) -> Option<SourceLine<'_>> {
        let lines = self
            .lines
            .get(e.lines_off..e.lines_off.saturating_add(e.lines_len as usize))?;
        let rel = addr.wrapping_sub(e.code_start);
        let i = lines.partition_point(|l| l.off <= rel);
        let l = lines.get(i.checked_sub(1)?)?;
        let file = self.files.get(l.file as usize)?;
        Some(SourceLine {
            file,
            line: l.line,
            column: l.column,
        })
    }
}

/// Feeds two start-sorted runs to `f` in start order, tagging `a` (older)
/// 0 and `b` 1; on equal starts `a` comes first, as `paint` expects.
fn merge_sorted(a: Vec<Entry>, b: impl Iterator<Item = Entry>, mut f: impl FnMut(Entry, u32)) {
    let mut a = a.into_iter().peekable();
    let mut b = b.peekable();
    loop {
        let take_a = match (a.peek(), b.peek()) {
            (Some(x), Some(y)) => x.start <= y.start,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => break,
        };
        let next = if take_a {
            a.next().map(|e| (e, 0))
        } else {
            b.next().map(|e| (e, 1))
        };
        if let Some((e, tag)) = next {
            f(e, tag);
        }
    }
}

/// Merges disjoint sorted `new` into `v` from the back, in place: no second
/// table-sized allocation when a few lines are added to a big table.
fn merge_in_place(v: &mut Vec<Entry>, new: Vec<Entry>) {
    let (n, m) = (v.len(), new.len());
    let Some(&fill) = new.first() else { return };
    v.resize(n + m, fill);
    let (mut i, mut j, mut k) = (n, m, n + m);
    while j > 0 {
        k -= 1;
        if i > 0 && v[i - 1].start > new[j - 1].start {
            v[k] = v[i - 1];
            i -= 1;
        } else {
            v[k] = new[j - 1];
            j -= 1;
        }
    }
}

fn intern(files: &mut Vec<Box<str>>, ix: &mut HashMap<Box<str>, u32>, f: Box<str>) -> u32 {
    if let Some(&i) = ix.get(&f) {
        return i;
    }
    let i = files.len() as u32;
    files.push(f.clone());
    ix.insert(f, i);
    i
}

/// Turns entries sorted by (start, seq) into non-overlapping ranges where
/// higher `seq` wins. Overlaps are rare and local, so only clusters of
/// mutually overlapping entries go through the slower painter.
fn resolve_sorted(v: Vec<(Entry, u32)>) -> Vec<Entry> {
    let mut out = Vec::with_capacity(v.len());
    let mut i = 0;
    while i < v.len() {
        let mut max_end = v[i].0.end;
        let mut j = i + 1;
        while j < v.len() && v[j].0.start < max_end {
            max_end = max_end.max(v[j].0.end);
            j += 1;
        }
        if j == i + 1 {
            out.push(v[i].0);
        } else {
            paint(&v[i..j], &mut out);
        }
        i = j;
    }
    out
}

/// Lays entries down oldest first, each trimming or splitting what it covers.
fn paint(cluster: &[(Entry, u32)], out: &mut Vec<Entry>) {
    let mut order: Vec<&(Entry, u32)> = cluster.iter().collect();
    order.sort_by_key(|t| t.1); // stable: equal seq keeps address order
    let mut map: BTreeMap<u64, Entry> = BTreeMap::new();
    for &&(e, _) in &order {
        if e.start >= e.end {
            continue; // never built so, but BTreeMap::range would panic
        }
        if let Some((&k, &p)) = map.range(..e.start).next_back() {
            if p.end > e.start {
                map.insert(k, Entry { end: e.start, ..p });
                if p.end > e.end {
                    map.insert(e.end, Entry { start: e.end, ..p });
                }
            }
        }
        let inside: Vec<u64> = map.range(e.start..e.end).map(|(&k, _)| k).collect();
        for k in inside {
            if let Some(p) = map.remove(&k) {
                if p.end > e.end {
                    map.insert(e.end, Entry { start: e.end, ..p });
                }
            }
        }
        map.insert(e.start, e);
    }
    out.extend(map.into_values());
}

/// Builds a table from entries in the order the producer emitted them.
struct Builder {
    items: Vec<(Entry, u32)>,
    names: String,
    lines: Vec<LineEntry>,
    files: Vec<Box<str>>,
    file_ix: HashMap<Box<str>, u32>,
}

impl Builder {
    fn new() -> Builder {
        Builder {
            items: Vec::new(),
            names: String::new(),
            lines: Vec::new(),
            files: Vec::new(),
            file_ix: HashMap::new(),
        }
    }

    /// Adds code at `start..start+size` named `name` (lossy if not UTF-8).
    /// Empty or address-space-wrapping ranges cover nothing and are dropped.
    fn add(&mut self, start: u64, size: u64, name: &[u8], lines: (usize, u32)) -> bool {
        let end = match start.checked_add(size) {
            Some(end) if size > 0 => end,
            _ => return false,
        };
        // Names over 4 GiB cannot occur in practice; capping keeps u32 honest.
        let name = &name[..name.len().min(u32::MAX as usize)];
        let name_off = self.names.len();
        match std::str::from_utf8(name) {
            Ok(s) => self.names.push_str(s),
            Err(_) => self.names.push_str(&String::from_utf8_lossy(name)),
        }
        let name_len = (self.names.len() - name_off).min(u32::MAX as usize) as u32;
        let seq = self.items.len().min(u32::MAX as usize) as u32;
        let e = Entry {
            start,
            end,
            code_start: start,
            code_size: size,
            name_off,
            lines_off: lines.0,
            name_len,
            lines_len: lines.1,
        };
        self.items.push((e, seq));
        true
    }

    fn finish(self) -> JitSymbols {
        let mut items = self.items;
        // (start, seq): on equal starts the older comes first, as paint expects.
        items.sort_unstable_by_key(|t| (t.0.start, t.1));
        JitSymbols {
            entries: resolve_sorted(items),
            starts: Vec::new(),
            names: self.names,
            lines: self.lines,
            files: self.files,
        }
        .with_starts()
    }
}

// ---------------------------------------------------------------- perf map

fn parse_perf_map(text: &[u8], offset: usize, take_last_partial: bool) -> PerfMapChunk {
    let mut b = Builder::new();
    let (mut lines, mut malformed, mut empty) = (0, 0, 0);
    let mut pos = offset;
    let rest = text.get(offset..).unwrap_or(&[]);
    // Most lines are ~50-100 bytes; a rough reserve avoids regrowth.
    b.items.reserve(rest.len() / 64);
    b.names.reserve(rest.len() / 2);
    let mut cur = rest;
    loop {
        let (line, complete) = match cur.iter().position(|&c| c == b'\n') {
            Some(n) => (&cur[..n], true),
            None if take_last_partial && !cur.is_empty() => (cur, false),
            None => break,
        };
        let adv = line.len() + complete as usize;
        cur = &cur[adv..];
        pos += adv;
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        lines += 1;
        match parse_map_line(line) {
            Some((start, size, name)) => {
                if !b.add(start, size, name, (0, 0)) {
                    empty += 1;
                }
            }
            None => malformed += 1,
        }
    }
    let next_offset = if offset > text.len() { offset } else { pos };
    PerfMapChunk {
        symbols: b.finish(),
        next_offset,
        lines,
        malformed,
        empty,
    }
}

/// `START SIZE NAME`: hex with or without 0x, NAME is the rest of the line.
fn parse_map_line(line: &[u8]) -> Option<(u64, u64, &[u8])> {
    let (start, rest) = parse_hex(skip_ws(line))?;
    let (size, rest) = parse_hex(need_ws(rest)?)?;
    let name = trim_end(need_ws(rest)?);
    if name.is_empty() {
        return None;
    }
    Some((start, size, name))
}

fn skip_ws(s: &[u8]) -> &[u8] {
    let n = s.iter().take_while(|c| **c == b' ' || **c == b'\t').count();
    &s[n..]
}

/// Fields must be separated: "1000 10x" is not START SIZE.
fn need_ws(s: &[u8]) -> Option<&[u8]> {
    match s.first() {
        Some(b' ' | b'\t') => Some(skip_ws(s)),
        _ => None,
    }
}

fn trim_end(mut s: &[u8]) -> &[u8] {
    while let [rest @ .., last] = s {
        if last.is_ascii_whitespace() {
            s = rest;
        } else {
            break;
        }
    }
    s
}

fn parse_hex(s: &[u8]) -> Option<(u64, &[u8])> {
    let s = match s {
        [b'0', b'x' | b'X', rest @ ..] => rest,
        _ => s,
    };
    let mut v: u64 = 0;
    let mut n = 0;
    for &c in s {
        let d = match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'f' => c - b'a' + 10,
            b'A'..=b'F' => c - b'A' + 10,
            _ => break,
        };
        if v >> 60 != 0 {
            return None; // more than 64 bits
        }
        v = (v << 4) | d as u64;
        n += 1;
    }
    if n == 0 {
        return None;
    }
    Some((v, &s[n..]))
}

/// Follows a growing perf map, reading only what was appended since the
/// last poll (complete lines only; a half-written line waits for next time).
#[derive(Debug)]
pub struct PerfMapTail {
    path: PathBuf,
    offset: u64,
}

impl PerfMapTail {
    pub fn new(path: impl Into<PathBuf>) -> PerfMapTail {
        PerfMapTail {
            path: path.into(),
            offset: 0,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Merges new lines into `table` and returns how many entries they
    /// added. If the file shrank it was rewritten (e.g. the pid was reused),
    /// so `table` is replaced by a fresh read.
    pub fn poll(&mut self, table: &mut JitSymbols) -> Result<usize, JitError> {
        let path = self.path.clone();
        let io_err = |source| JitError::Io {
            path: path.clone(),
            source,
        };
        let mut f = std::fs::File::open(&self.path).map_err(io_err)?;
        let len = f.metadata().map_err(io_err)?.len();
        if len < self.offset {
            self.offset = 0;
            *table = JitSymbols::new();
        }
        f.seek(SeekFrom::Start(self.offset)).map_err(io_err)?;
        let mut buf = Vec::new();
        f.read_to_end(&mut buf).map_err(io_err)?;
        let chunk = JitSymbols::from_perf_map_since(&buf, 0);
        self.offset += chunk.next_offset as u64;
        let added = chunk.symbols.len();
        table.merge(chunk.symbols);
        Ok(added)
    }
}

// ---------------------------------------------------------------- jitdump

const JITDUMP_MAGIC: u32 = 0x4A69_5444; // "JiTD"
const JITDUMP_HEADER_SIZE: usize = 40;
const REC_HEADER_SIZE: usize = 16;
const JIT_CODE_LOAD: u32 = 0;
const JIT_CODE_MOVE: u32 = 1;
const JIT_CODE_DEBUG_INFO: u32 = 2;
const JIT_CODE_CLOSE: u32 = 3;
/// V8 writes this into the header's pad1 (perf's own agent writes 0).
const V8_PAD1: u32 = 0xDEAD_BEEF;
/// V8 adds this to its debug-entry addresses because `perf inject` puts the
/// code right after a 0x40-byte ELF header (V8's perf-jit.cc says so).
const V8_DEBUG_ADDR_BIAS: u64 = 0x40;

/// Bounds-checked reader: every read past the end is `None`, never a panic.
struct Rd<'a> {
    b: &'a [u8],
    pos: usize,
    be: bool,
}

impl<'a> Rd<'a> {
    fn bytes<const N: usize>(&mut self) -> Option<[u8; N]> {
        let end = self.pos.checked_add(N)?;
        let a: [u8; N] = self.b.get(self.pos..end)?.try_into().ok()?;
        self.pos = end;
        Some(a)
    }
    fn u32(&mut self) -> Option<u32> {
        let a = self.bytes::<4>()?;
        Some(if self.be {
            u32::from_be_bytes(a)
        } else {
            u32::from_le_bytes(a)
        })
    }
    fn u64(&mut self) -> Option<u64> {
        let a = self.bytes::<8>()?;
        Some(if self.be {
            u64::from_be_bytes(a)
        } else {
            u64::from_le_bytes(a)
        })
    }
    /// NUL-terminated string; `None` if the NUL is missing.
    fn cstr(&mut self) -> Option<&'a [u8]> {
        let rest = self.b.get(self.pos..)?;
        let n = rest.iter().position(|&c| c == 0)?;
        self.pos += n + 1;
        Some(&rest[..n])
    }
}

fn parse_jitdump(bytes: &[u8]) -> Result<JitSymbols, JitError> {
    let magic_raw: [u8; 4] = match bytes.get(..4).and_then(|s| s.try_into().ok()) {
        Some(m) => m,
        None => return Err(JitError::TooShort),
    };
    // The writer uses its native order; a swapped magic means the other one.
    let be = match u32::from_le_bytes(magic_raw) {
        JITDUMP_MAGIC => false,
        m if m.swap_bytes() == JITDUMP_MAGIC => true,
        m => return Err(JitError::BadMagic(m)),
    };
    let mut h = Rd {
        b: bytes,
        pos: 4,
        be,
    };
    let (version, total_size, _elf_mach, pad1) = match (h.u32(), h.u32(), h.u32(), h.u32()) {
        (Some(v), Some(t), Some(e), Some(p)) if bytes.len() >= JITDUMP_HEADER_SIZE => (v, t, e, p),
        _ => return Err(JitError::TooShort),
    };
    // perf refuses newer versions too: record layouts may have changed.
    if version != 1 {
        return Err(JitError::UnsupportedVersion(version));
    }
    let hdr = total_size as usize;
    if hdr < JITDUMP_HEADER_SIZE || hdr > bytes.len() {
        return Err(JitError::BadHeader(total_size));
    }
    let bias = if pad1 == V8_PAD1 {
        V8_DEBUG_ADDR_BIAS
    } else {
        0
    };

    let mut b = Builder::new();
    // code_addr -> line range in b.lines, waiting for its JIT_CODE_LOAD
    // (the spec puts the debug record before the load it belongs to).
    let mut pending: HashMap<u64, (usize, u32)> = HashMap::new();
    // code_addr -> last load there, so JIT_CODE_MOVE can carry name and lines.
    let mut live: HashMap<u64, usize> = HashMap::new();
    let mut off = hdr;
    while let Some(rh) = bytes.get(off..).filter(|r| r.len() >= REC_HEADER_SIZE) {
        let mut r = Rd { b: rh, pos: 0, be };
        let (id, size) = match (r.u32(), r.u32()) {
            (Some(i), Some(s)) => (i, s as usize),
            _ => break,
        };
        // Too small to be a record: garbage, and no way to resync.
        if size < REC_HEADER_SIZE {
            break;
        }
        // Past the end: the JIT is still writing it.
        let Some(rec) = rh.get(..size) else { break };
        let mut r = Rd {
            b: rec,
            pos: REC_HEADER_SIZE,
            be,
        };
        match id {
            JIT_CODE_LOAD => {
                if let Some((addr, csize, name)) = (|| {
                    let (_pid, _tid, _vma) = (r.u32()?, r.u32()?, r.u64()?);
                    let (addr, csize, _index) = (r.u64()?, r.u64()?, r.u64()?);
                    Some((addr, csize, r.cstr()?))
                })() {
                    let lines = pending.remove(&addr).unwrap_or((0, 0));
                    if b.add(addr, csize, name, lines) {
                        live.insert(addr, b.items.len() - 1);
                    }
                }
            }
            JIT_CODE_MOVE => {
                let moved = (|| {
                    let (_pid, _tid, _vma) = (r.u32()?, r.u32()?, r.u64()?);
                    Some((r.u64()?, r.u64()?, r.u64()?))
                })();
                let found = moved.and_then(|(old, new, csize)| {
                    let &(e, _) = live.remove(&old).and_then(|i| b.items.get(i))?;
                    Some((e, new, csize))
                });
                if let Some((e, new, csize)) = found {
                    let name = b.names.get(e.name_off..e.name_off + e.name_len as usize);
                    let name = name.unwrap_or("").as_bytes().to_vec();
                    // Lines are relative to the code start: they move along.
                    if b.add(new, csize, &name, (e.lines_off, e.lines_len)) {
                        live.insert(new, b.items.len() - 1);
                    }
                }
            }
            JIT_CODE_DEBUG_INFO => {
                if let Some((addr, lines)) = read_debug_info(&mut r, &mut b, bias) {
                    pending.insert(addr, lines);
                }
            }
            JIT_CODE_CLOSE => break,
            _ => {} // UNWINDING_INFO and future records: skipped by size
        }
        off += size;
    }
    Ok(b.finish())
}

/// Reads a DEBUG_INFO record into `b.lines`, sorted by address, and returns
/// the code address it is for and the range it occupies.
fn read_debug_info(r: &mut Rd<'_>, b: &mut Builder, bias: u64) -> Option<(u64, (usize, u32))> {
    let addr = r.u64()?;
    let nr = r.u64()?;
    let off = b.lines.len();
    let mut prev_file: Option<u32> = None;
    // nr comes from the file: trust the record bounds, not the count.
    for _ in 0..nr {
        let (Some(a), Some(line), Some(column), Some(name)) = (r.u64(), r.u32(), r.u32(), r.cstr())
        else {
            break;
        };
        // "\xff" alone means "same file as the previous entry" (the spec's
        // space saving; perf's genelf honours it).
        let file = match (name, prev_file) {
            ([0xff], Some(p)) => p,
            _ => {
                let s: Box<str> = String::from_utf8_lossy(name).into();
                intern(&mut b.files, &mut b.file_ix, s)
            }
        };
        prev_file = Some(file);
        b.lines.push(LineEntry {
            // Wrapping: an entry before the code gets a huge offset, never matched.
            off: a.wrapping_sub(addr).wrapping_sub(bias),
            line,
            column,
            file,
        });
        if b.lines.len() - off >= u32::MAX as usize {
            break;
        }
    }
    let len = b.lines.len() - off;
    b.lines[off..].sort_by_key(|l| l.off);
    Some((addr, (off, len as u32)))
}

// ---------------------------------------------------------------- live pids

/// Perf map and mapped jitdumps of a live process, those that exist.
///
/// A process in another pid/mount namespace (a container) writes
/// `/tmp/perf-<its pid>.map` in its own /tmp, so those paths are reached
/// through `/proc/PID/root`. Any mapped `jit-<digits>.dump` is taken: inside
/// a pid namespace the digits are the inner pid, not `pid`.
pub fn find_files(pid: u32) -> Vec<PathBuf> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    find_files_among(pid, maps.lines().filter_map(maps_path))
}

/// `find_files`, given the paths of the process's mappings (a caller that
/// has read /proc/PID/maps already saves reading it again).
pub fn find_files_among<'a>(pid: u32, mapped: impl Iterator<Item = &'a str>) -> Vec<PathBuf> {
    static OWN_MNT_NS: OnceLock<Option<PathBuf>> = OnceLock::new();
    let proc_dir = PathBuf::from(format!("/proc/{pid}"));
    let own = OWN_MNT_NS.get_or_init(|| std::fs::read_link("/proc/self/ns/mnt").ok());
    let other_mnt_ns = match (own, std::fs::read_link(proc_dir.join("ns/mnt"))) {
        (Some(a), Ok(b)) => *a != b,
        _ => false, // can't tell: assume ours
    };
    let in_proc_root = |p: &Path| -> PathBuf {
        if other_mnt_ns {
            proc_dir.join("root").join(p.strip_prefix("/").unwrap_or(p))
        } else {
            p.to_path_buf()
        }
    };

    let mut out: Vec<PathBuf> = Vec::new();
    let mut map_pids = vec![pid];
    if let Some(ns) = innermost_nspid(&proc_dir).filter(|&ns| ns != pid) {
        map_pids.push(ns);
    }
    for p in map_pids {
        let m = in_proc_root(Path::new(&format!("/tmp/perf-{p}.map")));
        if m.is_file() && !out.contains(&m) {
            out.push(m);
        }
    }
    for path in mapped {
        let is_dump = path.rsplit('/').next().is_some_and(|f| {
            f.strip_prefix("jit-")
                .and_then(|f| f.strip_suffix(".dump"))
                .is_some_and(|d| !d.is_empty() && d.bytes().all(|c| c.is_ascii_digit()))
        });
        if is_dump {
            let p = in_proc_root(Path::new(path));
            if p.is_file() && !out.contains(&p) {
                out.push(p);
            }
        }
    }
    out
}

/// Path column of a /proc/PID/maps line (the 6th field, may hold spaces).
fn maps_path(line: &str) -> Option<&str> {
    let mut rest = line;
    for _ in 0..5 {
        rest = rest.trim_start();
        rest = &rest[rest.find(' ')?..];
    }
    let p = rest.trim_start();
    p.starts_with('/').then_some(p)
}

fn innermost_nspid(proc_dir: &Path) -> Option<u32> {
    let status = std::fs::read_to_string(proc_dir.join("status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("NSpid:"))?;
    line.split_whitespace().last()?.parse().ok()
}

/// Everything known for `pid` in one table: perf maps first, then jitdumps
/// on top (same code, but jitdumps can carry source lines). A file that fails
/// is skipped while others succeed; if all fail the first error is returned.
pub fn load(pid: u32) -> Result<Option<JitSymbols>, JitError> {
    load_files(find_files(pid))
}

/// `load` of the files `find_files` or `find_files_among` found.
pub fn load_files(files: Vec<PathBuf>) -> Result<Option<JitSymbols>, JitError> {
    let mut table: Option<JitSymbols> = None;
    let mut first_err = None;
    let mut any_ok = false;
    for path in files {
        let io_err = |source| JitError::Io {
            path: path.clone(),
            source,
        };
        let is_map = path.extension().is_some_and(|e| e == "map");
        let res = std::fs::read(&path).map_err(io_err).and_then(|bytes| {
            if is_map {
                Ok(JitSymbols::from_perf_map_since(&bytes, 0).symbols)
            } else {
                JitSymbols::from_jitdump(&bytes)
            }
        });
        match res {
            Ok(t) => {
                any_ok = true;
                match &mut table {
                    Some(all) => all.merge(t),
                    None => table = Some(t),
                }
            }
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    match (any_ok, first_err) {
        (false, Some(e)) => Err(e),
        _ => Ok(table.filter(|t| !t.is_empty())),
    }
}
