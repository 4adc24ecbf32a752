//! The compiled tables against `readelf --debug-dump=frames-interp`: for
//! every row readelf prints (and addresses inside each row's range), the
//! table's rule must say the same CFA, RBP and return address rules; past
//! the end of every FDE there must be no rule. Real libraries, and C and
//! assembly workloads compiled here for the special cases.
//!
//! Tests that need a tool that is missing print `SKIP <reason>` and return.

// Allowed here: a failed check panics: that is how a test fails.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use bpfscope_unwind::{
    compile, lookup_in_bytes, parse_bytes, Arch, Cfa, ReturnAddress, Rule, SavedRbp, UnwindError,
    UnwindTable,
};

// ---------------------------------------------------------------- readelf

/// One row of readelf's interpreted table.
#[derive(Clone, Debug)]
struct RRow {
    loc: u64,
    cfa: String,
    /// Column name -> rule text (rbp, ra, ...); absent columns are
    /// registers never mentioned.
    regs: HashMap<String, String>,
}

#[derive(Clone, Debug)]
struct RFde {
    section: String,
    cie: u64,
    start: u64,
    end: u64,
    rows: Vec<RRow>,
}

#[derive(Default, Debug)]
struct Frames {
    /// (section, CIE offset) -> (augmentation, initial rows).
    cies: HashMap<(String, u64), (String, Vec<RRow>)>,
    fdes: Vec<RFde>,
}

fn hex(s: &str) -> Option<u64> {
    u64::from_str_radix(s, 16).ok()
}

fn parse_frames(text: &str) -> Frames {
    let mut f = Frames::default();
    let mut section = String::new();
    // What the current table belongs to.
    enum Cur {
        None,
        Cie(u64),
        Fde(usize),
    }
    let mut cur = Cur::None;
    let mut cols: Vec<String> = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("Contents of the ") {
            section = rest.split_whitespace().next().unwrap_or("").to_string();
            cur = Cur::None;
            continue;
        }
        // A register rule reads "r9 (r9)": one column.
        let mut words: Vec<&str> = Vec::new();
        let mut at = 0;
        for w in line.split_whitespace() {
            let start = line[at..].find(w).map_or(at, |i| at + i);
            at = start + w.len();
            match words.last_mut() {
                Some(last) if w.starts_with('(') && !last.starts_with('"') => {
                    let from = last.as_ptr() as usize - line.as_ptr() as usize;
                    *last = &line[from..at];
                }
                _ => words.push(&line[start..at]),
            }
        }
        if words.is_empty() {
            cols.clear();
            continue;
        }
        if words.len() >= 4 && words[3] == "CIE" && hex(words[0]).is_some() {
            let off = hex(words[0]).unwrap_or(0);
            let aug = words.get(4).unwrap_or(&"").trim_matches('"').to_string();
            f.cies.insert((section.clone(), off), (aug, Vec::new()));
            cur = Cur::Cie(off);
            cols.clear();
            continue;
        }
        if words.len() >= 6 && words[3] == "FDE" {
            let cie = words[4].strip_prefix("cie=").and_then(hex);
            let pc = words[5]
                .strip_prefix("pc=")
                .and_then(|p| p.split_once(".."));
            if let (Some(cie), Some((a, b))) = (cie, pc) {
                f.fdes.push(RFde {
                    section: section.clone(),
                    cie,
                    start: hex(a).unwrap_or(0),
                    end: hex(b).unwrap_or(0),
                    rows: Vec::new(),
                });
                cur = Cur::Fde(f.fdes.len() - 1);
            } else {
                cur = Cur::None;
            }
            cols.clear();
            continue;
        }
        if words[0] == "LOC" {
            cols = words.iter().map(|w| w.to_string()).collect();
            continue;
        }
        if cols.is_empty() || words.len() != cols.len() {
            continue;
        }
        let Some(loc) = hex(words[0]) else { continue };
        let mut row = RRow {
            loc,
            cfa: String::new(),
            regs: HashMap::new(),
        };
        for (c, w) in cols.iter().zip(&words).skip(1) {
            if c == "CFA" {
                row.cfa = w.to_string();
            } else {
                row.regs.insert(c.clone(), w.to_string());
            }
        }
        match cur {
            Cur::Cie(off) => {
                if let Some(c) = f.cies.get_mut(&(section.clone(), off)) {
                    c.1.push(row);
                }
            }
            Cur::Fde(i) => f.fdes[i].rows.push(row),
            Cur::None => {}
        }
    }
    f
}

fn readelf_frames(path: &Path) -> Option<Frames> {
    let out = Command::new("readelf")
        .arg("--debug-dump=frames-interp")
        .arg(path)
        .output()
        .ok()?;
    Some(parse_frames(&String::from_utf8_lossy(&out.stdout)))
}

fn have(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

// ---------------------------------------------------------------- expectations

const REGS: [&str; 16] = [
    "rax", "rdx", "rcx", "rbx", "rsi", "rdi", "rbp", "rsp", "r8", "r9", "r10", "r11", "r12", "r13",
    "r14", "r15",
];

/// readelf's "c-16" etc.
fn cfa_offset(s: &str) -> Option<i64> {
    s.strip_prefix('c').and_then(|n| n.parse().ok())
}

/// AArch64's rules against readelf's row: CFA `sp+N`, `x29+N` or `xN+M`;
/// the columns `ra` (x30) and `x29`.
fn agrees_aarch64(r: &RRow, signal: bool, rule: Rule) -> Result<(), String> {
    if rule.signal_frame != signal {
        return Err(format!("signal flag {} vs CIE", rule.signal_frame));
    }
    let ra_text = r.regs.get("ra").map(String::as_str).unwrap_or("u");
    let fp_text = r.regs.get("x29").map(String::as_str).unwrap_or("u");
    let plain_cfa = r.cfa.split_once('+').and_then(|(reg, off)| {
        let n = match reg {
            "sp" => 31,
            _ => reg.strip_prefix('x')?.parse().ok()?,
        };
        Some((n, off.parse::<i64>().ok()?))
    });
    match rule.cfa {
        Cfa::Unsupported => {
            // Plain rules that fit must not be unsupported.
            // (A register other than SP and x29 leaves no room for a
            // saved return address.)
            let (fits, base) = match plain_cfa {
                Some((29 | 31, o)) if (0..=65535).contains(&o) => (true, -o),
                Some((n, o)) if n < 29 && (0..=65535).contains(&o) => (ra_text == "u", i64::MIN),
                _ => (false, i64::MIN),
            };
            let near = |o: i64| o == base || (o % 8 == 0 && (-1024..=1016).contains(&o) && o != 0);
            let ra_fits = ra_text == "u" || cfa_offset(ra_text).is_some_and(near);
            let fp_fits = fp_text == "u"
                || (cfa_offset(fp_text).map(|o| o + 8) == cfa_offset(ra_text)
                    && cfa_offset(fp_text).is_some_and(near));
            return if fits && ra_fits && fp_fits {
                Err("unsupported, but readelf's rule fits".into())
            } else {
                Ok(())
            };
        }
        Cfa::SigContext => {
            return if signal && r.cfa == "x29+0" && fp_text == "c+0" && ra_text == "c+8" {
                Ok(())
            } else {
                Err("sigcontext, but not the kernel's signal frame".into())
            };
        }
        Cfa::Rsp(o) if plain_cfa == Some((31, o.into())) => {}
        Cfa::Rbp(o) if plain_cfa == Some((29, o.into())) => {}
        Cfa::Register { reg, offset } if plain_cfa == Some((reg.into(), offset.into())) => {}
        c => return Err(format!("CFA {c:?} vs {}", r.cfa)),
    }
    match (rule.ra, ra_text) {
        (ReturnAddress::Lr | ReturnAddress::Undefined, "u" | "s") => {}
        (ReturnAddress::AtCfa(o), t) if cfa_offset(t) == Some(o.into()) => {}
        (ra, t) => return Err(format!("RA {ra:?} vs {t}")),
    }
    match (rule.rbp, fp_text) {
        (SavedRbp::Unchanged, "u" | "s") => {}
        // The outermost frame keeps nothing.
        (SavedRbp::Unchanged, _) if rule.ra == ReturnAddress::Undefined => {}
        (SavedRbp::AtCfa(o), t) if cfa_offset(t) == Some(o.into()) => {}
        // x29 saved apart from the return address: no room, lost.
        (SavedRbp::Lost, t) if cfa_offset(t).is_some() || t == "exp" => {}
        (fp, t) => return Err(format!("x29 {fp:?} vs {t}")),
    }
    Ok(())
}

/// Whether the table's rule agrees with readelf's row; `Err` says how not.
fn agrees(r: &RRow, signal: bool, rule: Rule) -> Result<(), String> {
    if rule.signal_frame != signal {
        return Err(format!("signal flag {} vs CIE", rule.signal_frame));
    }
    let ra_text = r.regs.get("ra").map(String::as_str).unwrap_or("u");
    let rbp_text = r.regs.get("rbp").map(String::as_str).unwrap_or("u");
    // Rules readelf shows as expressions, or as registers the table has no
    // room for, may be unsupported; a plain rule may be only when its
    // numbers do not fit.
    let plain_cfa = {
        let (reg, off) = r.cfa.split_once('+').unwrap_or(("", ""));
        match (REGS.iter().position(|&n| n == reg), off.parse::<i64>()) {
            (Some(n), Ok(o)) => Some((n, o)),
            _ => None,
        }
    };
    let ra_plain = ra_text == "c-8" || ra_text == "u";
    match rule.cfa {
        Cfa::Unsupported => {
            let fits = match plain_cfa {
                Some((7, o)) => (0..=65535).contains(&o) || (o % 8 == 0 && o / 8 <= 65535),
                Some((_, o)) => (0..=65535).contains(&o),
                None => false,
            };
            return if fits && ra_plain {
                Err("unsupported, but readelf's rule fits".into())
            } else {
                Ok(())
            };
        }
        Cfa::SigContext => {
            return if r.cfa == "exp" && ra_text == "exp" && rbp_text == "exp" {
                Ok(())
            } else {
                Err("sigcontext, but readelf has no expressions".into())
            };
        }
        Cfa::Plt { .. } | Cfa::DerefRsp { .. } | Cfa::DerefRbp { .. } => {
            if r.cfa != "exp" {
                return Err(format!("CFA {:?} vs {}", rule.cfa, r.cfa));
            }
        }
        Cfa::Rsp(o) => {
            if plain_cfa != Some((7, o.into())) {
                return Err(format!("CFA {:?} vs {}", rule.cfa, r.cfa));
            }
        }
        Cfa::Rbp(o) => {
            if plain_cfa != Some((6, o.into())) {
                return Err(format!("CFA {:?} vs {}", rule.cfa, r.cfa));
            }
        }
        Cfa::Register { reg, offset } => {
            if plain_cfa != Some((reg.into(), offset.into())) {
                return Err(format!("CFA {:?} vs {}", rule.cfa, r.cfa));
            }
        }
    }
    match (rule.ra, ra_text) {
        (ReturnAddress::AtCfaMinus8, "c-8") | (ReturnAddress::Undefined, "u") => {}
        (ra, t) => return Err(format!("RA {ra:?} vs {t}")),
    }
    let aux_taken = matches!(rule.cfa, Cfa::Plt { .. } | Cfa::Register { .. });
    match (rule.rbp, rbp_text) {
        (SavedRbp::Unchanged, "u" | "s") | (SavedRbp::Lost, "u") => {}
        (SavedRbp::AtCfa(o), t) if cfa_offset(t) == Some(o.into()) => {}
        (SavedRbp::Lost, t) if cfa_offset(t).is_some() => {
            let o = cfa_offset(t).unwrap_or(0);
            if !aux_taken && o % 8 == 0 && (-1024..=1016).contains(&o) {
                return Err(format!("RBP lost vs {t}"));
            }
        }
        (SavedRbp::AtRbp(_) | SavedRbp::Lost, "exp") => {}
        // Other readelf rules (a register name, v+N, vexp) are not ours.
        (SavedRbp::Lost, t) if !matches!(t, "u" | "s" | "exp") && cfa_offset(t).is_none() => {}
        (rbp, t) => return Err(format!("RBP {rbp:?} vs {t}")),
    }
    Ok(())
}

#[derive(Default, Debug)]
struct Report {
    fdes: usize,
    rows: usize,
    addresses: usize,
    ends: usize,
    unsupported: usize,
    /// Of which in FDEs gimli refused part way.
    invalid_cfi: usize,
    skipped_fdes: usize,
    mismatches: Vec<String>,
}

/// The executable PT_LOAD ranges, as the compiler filters FDEs by them.
fn code_ranges(path: &Path) -> Vec<(u64, u64)> {
    use object::read::elf::{ElfFile64, ProgramHeader};
    let Ok(data) = std::fs::read(path) else {
        return Vec::new();
    };
    let Ok(elf) = ElfFile64::<object::Endianness>::parse(&*data) else {
        return Vec::new();
    };
    let e = elf.endian();
    elf.elf_program_headers()
        .iter()
        .filter(|p| p.p_type(e) == object::elf::PT_LOAD && p.p_flags(e).contains(object::elf::PF_X))
        .map(|p| (p.p_vaddr(e), p.p_vaddr(e) + p.p_memsz(e)))
        .collect()
}

/// Compares every FDE of `frames` the table is made of: those in
/// executable segments, from .eh_frame, and from .debug_frame where no
/// .eh_frame FDE covers the same code. Addresses two FDEs cover are left
/// out.
fn compare(path: &Path, table: &UnwindTable, frames: &Frames) -> Report {
    let bytes = table.to_bytes();
    let code = code_ranges(path);
    let in_code = |s: u64, e: u64| code.is_empty() || code.iter().any(|&(a, b)| s >= a && e <= b);
    let eh = Coverage::new(
        frames
            .fdes
            .iter()
            .filter(|f| f.section == ".eh_frame" && f.start < f.end && in_code(f.start, f.end))
            .map(|f| (f.start, f.end)),
    );
    // The FDEs the table is made of.
    let used: Vec<&RFde> = frames
        .fdes
        .iter()
        .filter(|f| f.start < f.end && in_code(f.start, f.end))
        .filter(|f| f.section == ".eh_frame" || !eh.meets(f.start, f.end))
        .collect();
    let cover = Coverage::new(used.iter().map(|f| (f.start, f.end)));
    let covered = |a: u64| cover.at(a);
    let mut rep = Report::default();
    // AArch64's PLT has no FDE; the table gives it the rule of code that
    // only jumps.
    let plt = sections(path)
        .get(".plt")
        .copied()
        .filter(|_| table.arch() == Arch::Aarch64);
    let in_plt = |a: u64| plt.is_some_and(|(s, n)| s <= a && a < s + n);
    let check = |a: u64, want: Option<(&RRow, bool)>, rep: &mut Report| {
        let got = table.lookup(a);
        if lookup_in_bytes(&bytes, a) != Ok(got) {
            rep.mismatches
                .push(format!("{a:#x}: to_bytes lookup differs from lookup"));
        }
        match (want, got) {
            (None, None) => {}
            (None, Some(r)) if in_plt(a) && (r.cfa, r.ra) == (Cfa::Rsp(0), ReturnAddress::Lr) => {}
            (None, Some(r)) => rep
                .mismatches
                .push(format!("{a:#x}: {r:?} past an FDE's end")),
            (Some((row, _)), None) => rep
                .mismatches
                .push(format!("{a:#x}: no rule, readelf has CFA {}", row.cfa)),
            (Some((row, signal)), Some(r)) => {
                if r.cfa == Cfa::Unsupported {
                    rep.unsupported += 1;
                    let invalid = table.invalid_cfi_ranges();
                    if invalid.iter().any(|&(s, e)| s <= a && a < e) {
                        rep.invalid_cfi += 1;
                        return;
                    }
                }
                let verdict = match table.arch() {
                    Arch::X86_64 => agrees(row, signal, r),
                    Arch::Aarch64 => agrees_aarch64(row, signal, r),
                };
                if let Err(why) = verdict {
                    rep.mismatches.push(format!("{a:#x}: {why} ({row:?})"));
                }
            }
        }
    };
    for f in &used {
        let Some((aug, cie_rows)) = frames.cies.get(&(f.section.clone(), f.cie)) else {
            rep.skipped_fdes += 1;
            continue;
        };
        let signal = aug.contains('S');
        // An FDE without instructions has the CIE's initial row.
        let rows: Vec<RRow> = if f.rows.is_empty() {
            match cie_rows.last() {
                Some(r) => vec![RRow {
                    loc: f.start,
                    ..r.clone()
                }],
                None => {
                    rep.skipped_fdes += 1;
                    continue;
                }
            }
        } else {
            f.rows.clone()
        };
        rep.fdes += 1;
        for (i, row) in rows.iter().enumerate() {
            let end = rows.get(i + 1).map_or(f.end, |n| n.loc).min(f.end);
            if row.loc >= end {
                continue;
            }
            rep.rows += 1;
            let mut samples = vec![row.loc, row.loc + 1, row.loc + (end - row.loc) / 2, end - 1];
            samples.sort_unstable();
            samples.dedup();
            for a in samples.into_iter().filter(|&a| a < end) {
                if covered(a) != 1 {
                    continue;
                }
                rep.addresses += 1;
                check(a, Some((row, signal)), &mut rep);
            }
        }
        if covered(f.end) == 0 {
            rep.ends += 1;
            check(f.end, None, &mut rep);
        }
        if f.start > 0 && covered(f.start - 1) == 0 {
            check(f.start - 1, None, &mut rep);
        }
    }
    rep
}

/// How many of a set of ranges cover each address.
struct Coverage {
    /// (address, ranges covering it from there on), by address.
    steps: Vec<(u64, i64)>,
}

impl Coverage {
    fn new(ranges: impl Iterator<Item = (u64, u64)>) -> Coverage {
        let mut ev: Vec<(u64, i64)> = ranges.flat_map(|(s, e)| [(s, 1), (e, -1)]).collect();
        ev.sort_unstable();
        let mut steps: Vec<(u64, i64)> = Vec::new();
        let mut n = 0;
        for (a, d) in ev {
            n += d;
            match steps.last_mut() {
                Some(last) if last.0 == a => last.1 = n,
                _ => steps.push((a, n)),
            }
        }
        Coverage { steps }
    }

    fn at(&self, a: u64) -> i64 {
        match self.steps.partition_point(|s| s.0 <= a) {
            0 => 0,
            i => self.steps[i - 1].1,
        }
    }

    /// Whether [s, e) meets any range.
    fn meets(&self, s: u64, e: u64) -> bool {
        if self.at(s) > 0 {
            return true;
        }
        let from = self.steps.partition_point(|st| st.0 <= s);
        self.steps[from..]
            .iter()
            .take_while(|st| st.0 < e)
            .any(|st| st.1 > 0)
    }
}

/// Compiles `path`, compares it with readelf, prints the counts, and
/// fails on any mismatch.
fn check_file(path: &Path) -> Option<(UnwindTable, Report)> {
    if !have("readelf") {
        eprintln!("SKIP readelf not installed");
        return None;
    }
    if !path.exists() {
        eprintln!("SKIP {} not installed", path.display());
        return None;
    }
    let table = match compile(path) {
        Ok(t) => t,
        Err(e) => panic!("{e}"),
    };
    let frames = readelf_frames(path)?;
    let rep = compare(path, &table, &frames);
    let s = table.stats();
    eprintln!(
        "{}: {} FDEs, {} rows compared at {} addresses (+{} FDE ends), {} unsupported ({} after invalid CFI), {} mismatches; \
         table {} rows -> {} entries ({} gaps), {} bytes, {} distinct rules, unsupported ranges {} ({:?})",
        path.display(),
        rep.fdes,
        rep.rows,
        rep.addresses,
        rep.ends,
        rep.unsupported,
        rep.invalid_cfi,
        rep.mismatches.len(),
        s.rows,
        s.entries,
        s.gap_entries,
        s.bytes,
        s.distinct_rules,
        s.unsupported_ranges,
        s.unsupported,
    );
    for m in rep.mismatches.iter().take(20) {
        eprintln!("  {m}");
    }
    assert!(rep.mismatches.is_empty(), "{}: mismatches", path.display());
    assert!(rep.rows > 0, "{}: no rows compared", path.display());
    // The bytes read back to the same entries.
    assert_eq!(
        parse_bytes(&table.to_bytes()).ok(),
        Some((table.base(), table.entries().to_vec()))
    );
    Some((table, rep))
}

// ---------------------------------------------------------------- workloads

struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("bpfscope-unwind-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Compiles `sources` with gcc and `flags` into `dir/name`.
fn gcc(dir: &Path, name: &str, sources: &[(&str, &str)], flags: &[&str]) -> PathBuf {
    cc("gcc", dir, name, sources, flags)
}

/// Compiles `sources` with the C compiler `compiler`.
fn cc(compiler: &str, dir: &Path, name: &str, sources: &[(&str, &str)], flags: &[&str]) -> PathBuf {
    let mut files = Vec::new();
    for (file, text) in sources {
        let p = dir.join(file);
        std::fs::write(&p, text).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        files.push(p);
    }
    let out = dir.join(name);
    let o = Command::new(compiler)
        .args(flags)
        .args(&files)
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap_or_else(|e| panic!("gcc: {e}"));
    assert!(
        o.status.success(),
        "{compiler} {flags:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

const WORKLOAD_C: &str = r#"
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

volatile sig_atomic_t hits;
volatile long sink;

/* A leaf without a prologue: CFA = RSP + 8 throughout. */
__attribute__((noinline)) long leaf(long a, long b) { return a * 31 + b; }

/* A signal handler: entered from the kernel's signal frame. */
static void on_signal(int sig) { hits += sig; sink += leaf(sig, hits); }

/* Several exits at different depths: DW_CFA_remember_state/restore_state. */
__attribute__((noinline)) long early_outs(long *v, long n) {
    long s = 0;
    for (long i = 0; i < n; i++) {
        if (v[i] < 0) return -1;
        if (v[i] == 42) { s += leaf(s, i); continue; }
        s += v[i] * early_outs(v + i + 1, n - i - 1 > 2 ? 2 : n - i - 1);
    }
    return s;
}

/* A VLA keeps a frame pointer even with -fomit-frame-pointer: CFA = RBP + 16. */
__attribute__((noinline)) long vla(long n) {
    long a[n];
    for (long i = 0; i < n; i++) a[i] = leaf(i, n);
    long s = 0;
    for (long i = 0; i < n; i++) s += a[i];
    return s;
}

/* A frame above 64 KiB. */
__attribute__((noinline)) long big_frame(long n) {
    volatile char buf[100000];
    for (long i = 0; i < (long)sizeof buf; i += 4096) buf[i] = (char)(i + n);
    return buf[n % sizeof buf];
}

/* Over-aligned locals and a VLA: gcc realigns the stack through r10
   (CFA = R10 for a few instructions) and then keeps the CFA in a slot
   below the frame pointer (CFA = *(RBP - N)), RBP saved at RBP. */
__attribute__((noinline)) long realigned(long n) {
    volatile long a[8] __attribute__((aligned(64)));
    long v[n];
    for (int i = 0; i < 8; i++) a[i] = leaf(i, n);
    for (long i = 0; i < n; i++) v[i] = leaf(i, a[i & 7]);
    return a[n & 7] + v[n - 1];
}

int main(int argc, char **argv) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGUSR1, &sa, NULL);
    raise(SIGUSR1);
    long v[5] = {1, 42, 3, argc, 5};
    long r = early_outs(v, 5) + vla(argc + 3) + big_frame(argc) + realigned(argc);
    printf("%ld %d %s\n", r, (int)hits, argv[0]);
    return 0;
}
"#;

/// Hand-written CFI for what compilers rarely write.
const ODD_S: &str = r#"
    .text
    .globl odd_cfi
    .type odd_cfi, @function
odd_cfi:
    .cfi_startproc
    push %rbx
    .cfi_def_cfa_offset 16
    .cfi_offset %rbx, -16
    sub $3, %rsp
    .cfi_def_cfa_offset 19
    add $3, %rsp
    .cfi_def_cfa_offset 16
    sub $70004, %rsp
    .cfi_def_cfa_offset 70020
    add $70004, %rsp
    .cfi_def_cfa_offset 16
    .cfi_remember_state
    mov %rsp, %r12
    .cfi_def_cfa_register %r12
    nop
    .cfi_restore_state
    push %rbp
    .cfi_def_cfa_offset 24
    .cfi_offset %rbp, -2000
    nop
    .cfi_offset %rbp, 1024
    nop
    .cfi_offset %rbp, -24
    pop %rbp
    .cfi_def_cfa_offset 16
    .cfi_restore %rbp
    /* CFA = RSP + 16 written as an expression no pattern knows:
       DW_CFA_def_cfa_expression (breg7 8; lit8; plus). */
    .cfi_escape 0x0f, 0x04, 0x77, 0x08, 0x38, 0x22
    nop
    .cfi_def_cfa %rsp, 16
    /* The return address kept in a register. */
    .cfi_register %rip, %rax
    nop
    .cfi_offset %rip, -8
    /* CFA = a register above r15. */
    .cfi_def_cfa 17, 16
    nop
    .cfi_def_cfa %rsp, 16
    pop %rbx
    .cfi_def_cfa_offset 8
    .cfi_restore %rbx
    ret
    .cfi_endproc
    .size odd_cfi, .-odd_cfi

    /* DWARF allows DW_CFA_def_cfa_register only after a register rule;
       gimli refuses it after an expression, readelf does not. */
    .globl invalid_cfi
    .type invalid_cfi, @function
invalid_cfi:
    .cfi_startproc
    push %rbx
    .cfi_def_cfa_offset 16
    nop
    /* CFA = *(RSP + 8) + 16 */
    .cfi_escape 0x0f, 0x05, 0x77, 0x08, 0x06, 0x23, 0x10
    nop
    .cfi_def_cfa_register %rsp
    nop
    pop %rbx
    .cfi_def_cfa_offset 8
    ret
    .cfi_endproc
    .size invalid_cfi, .-invalid_cfi

    .globl outermost
    .type outermost, @function
outermost:
    .cfi_startproc
    .cfi_undefined %rip
    xor %ebp, %ebp
    call odd_cfi
    hlt
    .cfi_endproc
    .size outermost, .-outermost

    .globl my_restore_rt
    .type my_restore_rt, @function
    .cfi_startproc simple
    .cfi_signal_frame
    .cfi_def_cfa %rsp, 8
    .cfi_offset %rip, -8
    nop
my_restore_rt:
    mov $15, %eax
    syscall
    .cfi_endproc
    .size my_restore_rt, .-my_restore_rt

    .section .note.GNU-stack,"",@progbits
"#;

const ODD_MAIN_C: &str = r#"
void odd_cfi(void);
int main(void) { return 0; }
"#;

// ---------------------------------------------------------------- tests

#[test]
fn libc_matches_readelf() {
    let Some((t, _)) = check_file(Path::new("/lib/x86_64-linux-gnu/libc.so.6")) else {
        return;
    };
    let s = t.stats();
    // The PLT, __restore_rt, and functions with a frame pointer.
    assert!(s.plt_rows > 0, "{s:?}");
    assert!(s.signal_fdes > 0 && s.sigcontext_rows > 0, "{s:?}");
    assert!(s.rbp_cfa_rows > 0, "{s:?}");
}

#[test]
fn python_matches_readelf() {
    check_file(Path::new("/usr/bin/python3.11"));
}

#[test]
fn xz_matches_readelf() {
    check_file(Path::new("/usr/bin/xz"));
}

#[test]
fn libc_restore_rt_is_a_signal_frame() {
    let libc = Path::new("/lib/x86_64-linux-gnu/libc.so.6");
    if !libc.exists() || !have("readelf") {
        eprintln!("SKIP libc or readelf missing");
        return;
    }
    let t = compile(libc).unwrap_or_else(|e| panic!("{e}"));
    // __restore_rt is a local symbol: in .symtab, which Debian keeps in
    // the separate debug file (libc6-dbg).
    let mut syms = symbols(libc);
    if !syms.contains_key("__restore_rt") {
        if let Some(debug) = build_id(libc).map(|id| debug_file(&id)) {
            if debug.exists() {
                syms = symbols(&debug);
            }
        }
    }
    let Some(&(addr, _)) = syms.get("__restore_rt") else {
        eprintln!("SKIP no symbol __restore_rt for libc (libc6-dbg not installed?)");
        return;
    };
    let want = Rule::sigcontext(true);
    assert_eq!(t.lookup(addr), Some(want));
    // The FDE starts one byte early, for lookups of the return address - 1.
    assert_eq!(t.lookup(addr - 1), Some(want));
}

#[test]
fn c_workload_matches_readelf() {
    if !have("gcc") || !have("readelf") {
        eprintln!("SKIP gcc or readelf not installed");
        return;
    }
    let dir = TempDir::new("c");
    let exe = gcc(
        &dir.0,
        "work",
        &[("work.c", WORKLOAD_C)],
        &["-O2", "-fomit-frame-pointer"],
    );
    let Some((t, _)) = check_file(&exe) else {
        return;
    };
    let s = t.stats();
    assert!(s.plt_rows > 0, "PLT: {s:?}");
    assert!(s.rbp_cfa_rows > 0, "VLA frame: {s:?}");
    assert!(s.deref_rows > 0 && s.register_rows > 0, "realigned: {s:?}");
    assert_eq!(s.unsupported.total(), 0, "{s:?}");
    let syms = symbols(&exe);
    // The leaf has no prologue: CFA = RSP + 8 from its first to last byte.
    let (leaf, leaf_size) = syms["leaf"];
    for a in leaf..leaf + leaf_size {
        assert_eq!(
            t.lookup(a).map(|r| r.cfa),
            Some(Cfa::Rsp(8)),
            "leaf+{}",
            a - leaf
        );
    }
    // The big frame is one the x8 encoding holds.
    let (big, big_size) = syms["big_frame"];
    assert!((big..big + big_size)
        .any(|a| matches!(t.lookup(a).map(|r| r.cfa), Some(Cfa::Rsp(o)) if o > 65_535)));
    // The signal handler is an ordinary function: its frame is below the
    // kernel's, which libc describes.
    let (h, _) = syms["on_signal"];
    assert_eq!(t.lookup(h).map(|r| r.cfa), Some(Cfa::Rsp(8)));
    // The realigned function: CFA saved below RBP, RBP saved at RBP.
    let (re, re_size) = syms["realigned"];
    assert!((re..re + re_size).any(|a| matches!(
        t.lookup(a),
        Some(Rule {
            cfa: Cfa::DerefRbp {
                offset: ..0,
                add: 0
            },
            rbp: SavedRbp::AtRbp(0),
            ra: ReturnAddress::AtCfaMinus8,
            signal_frame: false,
        })
    )));
    assert!((re..re + re_size).any(|a| matches!(
        t.lookup(a).map(|r| r.cfa),
        Some(Cfa::Register { reg: 10, offset: 0 })
    )));
}

#[test]
fn debug_frame_only_matches_readelf() {
    if !have("gcc") || !have("readelf") {
        eprintln!("SKIP gcc or readelf not installed");
        return;
    }
    let dir = TempDir::new("debug-frame");
    let exe = gcc(
        &dir.0,
        "work",
        &[("work.c", WORKLOAD_C)],
        &[
            "-O2",
            "-g",
            "-fomit-frame-pointer",
            "-fno-asynchronous-unwind-tables",
            "-fno-exceptions",
        ],
    );
    let Some((t, _)) = check_file(&exe) else {
        return;
    };
    assert!(t.stats().debug_frame_fdes > 0, "{:?}", t.stats());
    // Compressed .debug_frame (zlib) reads the same.
    let z = dir.0.join("work.z");
    let o = Command::new("objcopy")
        .args(["--compress-debug-sections=zlib"])
        .arg(&exe)
        .arg(&z)
        .output();
    if !o.is_ok_and(|o| o.status.success()) {
        eprintln!("SKIP objcopy could not compress debug sections");
        return;
    }
    let tz = compile(&z).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(tz.to_bytes(), t.to_bytes());
}

#[test]
fn hand_written_cfi_matches_readelf() {
    if !have("gcc") || !have("readelf") {
        eprintln!("SKIP gcc or readelf not installed");
        return;
    }
    let dir = TempDir::new("asm");
    let exe = gcc(
        &dir.0,
        "odd",
        &[("odd.S", ODD_S), ("main.c", ODD_MAIN_C)],
        &["-O2"],
    );
    let Some((t, _)) = check_file(&exe) else {
        return;
    };
    let s = t.stats();
    let syms = symbols(&exe);
    let (odd, odd_size) = syms["odd_cfi"];
    let rules: Vec<Rule> = (odd..odd + odd_size).filter_map(|a| t.lookup(a)).collect();
    let cfas: Vec<Cfa> = rules.iter().map(|r| r.cfa).collect();
    // sub $3: an odd offset fits as is.
    assert!(cfas.contains(&Cfa::Rsp(19)), "{cfas:?}");
    // 70020 is neither below 65536 nor a multiple of 8.
    assert!(s.unsupported.cfa_offset >= 1, "{s:?}");
    // remember/restore around CFA = r12.
    assert!(
        cfas.contains(&Cfa::Register {
            reg: 12,
            offset: 16
        }),
        "{cfas:?}"
    );
    // RBP at CFA-2000 or CFA+1024 does not fit: lost for those rows, kept
    // at CFA-24.
    assert_eq!(s.rbp_dropped_rows, 2, "{s:?}");
    assert!(rules
        .iter()
        .any(|r| r.cfa == Cfa::Rsp(24) && r.rbp == SavedRbp::AtCfa(-24)));
    assert!(s.unsupported.cfa_expression >= 1, "{s:?}");
    assert!(s.unsupported.return_address >= 1, "{s:?}");
    assert!(s.unsupported.cfa_register >= 1, "{s:?}");
    assert!(s.unsupported_ranges >= 2, "{s:?}");
    // Rows before the instruction gimli refuses stay; the rest of the
    // function is unsupported.
    let (inv, inv_size) = syms["invalid_cfi"];
    assert_eq!(t.lookup(inv + 1).map(|r| r.cfa), Some(Cfa::Rsp(16)));
    assert_eq!(
        t.lookup(inv + 2).map(|r| r.cfa),
        Some(Cfa::DerefRsp { offset: 8, add: 16 })
    );
    assert_eq!(t.invalid_cfi_ranges(), &[(inv + 3, inv + inv_size)]);
    assert_eq!(t.lookup(inv + 3).map(|r| r.cfa), Some(Cfa::Unsupported));
    assert_eq!(s.unsupported.invalid_cfi, 1, "{s:?}");
    assert_eq!(s.fde_errors, 1, "{s:?}");
    // The outermost frame: RA undefined.
    let (out, _) = syms["outermost"];
    assert_eq!(t.lookup(out).map(|r| r.ra), Some(ReturnAddress::Undefined));
    // A signal frame with plain rules keeps them, flagged.
    let (rt, _) = syms["my_restore_rt"];
    let r = t
        .lookup(rt)
        .unwrap_or_else(|| panic!("no rule at my_restore_rt"));
    assert!(r.signal_frame && r.cfa == Cfa::Rsp(8), "{r:?}");
    assert_eq!(t.lookup(rt - 1), Some(r));
}

#[test]
fn ibt_plt_and_plt_sec() {
    if !have("gcc") || !have("readelf") {
        eprintln!("SKIP gcc or readelf not installed");
        return;
    }
    let dir = TempDir::new("ibt");
    let flags = ["-O2", "-fcf-protection=full", "-Wl,-z,ibtplt"];
    let exe = gcc(&dir.0, "ibt", &[("work.c", WORKLOAD_C)], &flags);
    let secs = sections(&exe);
    let Some(&(plt_sec, plt_sec_size)) = secs.get(".plt.sec") else {
        eprintln!("SKIP the linker made no .plt.sec");
        return;
    };
    let Some((t, _)) = check_file(&exe) else {
        return;
    };
    let (plt, plt_size) = secs[".plt"];
    // PLT0 after the entry's push, after its own push, then the entries.
    assert_eq!(t.lookup(plt).map(|r| r.cfa), Some(Cfa::Rsp(16)));
    assert_eq!(t.lookup(plt + 6).map(|r| r.cfa), Some(Cfa::Rsp(24)));
    for a in (plt + 16..plt + plt_size).step_by(5) {
        assert_eq!(
            t.lookup(a).map(|r| r.cfa),
            Some(Cfa::Plt {
                offset: 8,
                threshold: 9
            }),
            "{a:#x}"
        );
    }
    for a in plt_sec..plt_sec + plt_sec_size {
        assert_eq!(t.lookup(a).map(|r| r.cfa), Some(Cfa::Rsp(8)));
    }
    assert_eq!(t.stats().synthesized_plt, 0);

    // Without the linker's unwind info the stubs get CFA = RSP + 8 all the
    // same; the lazy PLT itself has no rule.
    let mut flags = flags.to_vec();
    flags.push("-Wl,--no-ld-generated-unwind-info");
    let bare = gcc(&dir.0, "bare", &[("work.c", WORKLOAD_C)], &flags);
    let t = compile(&bare).unwrap_or_else(|e| panic!("{e}"));
    let secs = sections(&bare);
    let (plt_sec, plt_sec_size) = secs[".plt.sec"];
    let (plt, _) = secs[".plt"];
    assert!(t.stats().synthesized_plt >= 1, "{:?}", t.stats());
    for a in plt_sec..plt_sec + plt_sec_size {
        assert_eq!(t.lookup(a).map(|r| r.cfa), Some(Cfa::Rsp(8)));
    }
    assert_eq!(t.lookup(plt + 16), None);
}

#[test]
fn stripped_section_headers_find_eh_frame_through_the_header() {
    if !have("gcc") {
        eprintln!("SKIP gcc not installed");
        return;
    }
    let dir = TempDir::new("shstrip");
    let exe = gcc(&dir.0, "work", &[("work.c", WORKLOAD_C)], &["-O2"]);
    let mut data = std::fs::read(&exe).unwrap_or_else(|e| panic!("{e}"));
    // e_shoff (0x28, 8 bytes), e_shnum (0x3c), e_shstrndx (0x3e).
    data[0x28..0x30].fill(0);
    data[0x3c..0x40].fill(0);
    let stripped = dir.0.join("noshdr");
    std::fs::write(&stripped, &data).unwrap_or_else(|e| panic!("{e}"));
    let a = compile(&exe).unwrap_or_else(|e| panic!("{e}"));
    let b = compile(&stripped).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(a.to_bytes(), b.to_bytes());
    assert_eq!(a.stats().fdes, b.stats().fdes);
}

#[test]
fn typed_errors() {
    let dir = TempDir::new("errors");
    let missing = dir.0.join("missing");
    assert!(matches!(compile(&missing), Err(UnwindError::Io { .. })));
    let text = dir.0.join("text");
    std::fs::write(&text, b"not an ELF file at all").unwrap_or_else(|e| panic!("{e}"));
    assert!(matches!(compile(&text), Err(UnwindError::Parse { .. })));
    // A separate debug file: .eh_frame is NOBITS, and gcc writes no
    // .debug_frame.
    let libc = Path::new("/lib/x86_64-linux-gnu/libc.so.6");
    if let Some(debug) = build_id(libc).map(|id| debug_file(&id)) {
        if debug.exists() {
            let e = compile(&debug);
            assert!(matches!(e, Err(UnwindError::NoUnwindInfo { .. })), "{e:?}");
        } else {
            eprintln!("SKIP no debug file for libc (libc6-dbg)");
        }
    }
    if !have("gcc") {
        eprintln!("SKIP gcc not installed");
        return;
    }
    let obj = dir.0.join("o.o");
    let o = Command::new("gcc")
        .args(["-c", "-x", "c", "-", "-o"])
        .arg(&obj)
        .stdin(std::process::Stdio::null())
        .output();
    if o.is_ok_and(|o| o.status.success()) {
        assert!(matches!(
            compile(&obj),
            Err(UnwindError::Relocatable { .. })
        ));
    }
    if Command::new("gcc")
        .args(["-m32", "-x", "c", "-", "-c", "-o"])
        .arg(dir.0.join("32.o"))
        .stdin(std::process::Stdio::null())
        .output()
        .is_ok_and(|o| o.status.success())
    {
        assert!(matches!(
            compile(&dir.0.join("32.o")),
            Err(UnwindError::NotX86_64 { .. })
        ));
    }
}

// ---------------------------------------------------------------- ELF facts

/// Function symbols: name -> (address, size).
fn symbols(path: &Path) -> HashMap<String, (u64, u64)> {
    use object::{Object, ObjectSymbol};
    let data = std::fs::read(path).unwrap_or_else(|e| panic!("{e}"));
    let f = object::File::parse(&*data).unwrap_or_else(|e| panic!("{e}"));
    f.symbols()
        .filter_map(|s| Some((s.name().ok()?.to_string(), (s.address(), s.size()))))
        .collect()
}

fn sections(path: &Path) -> HashMap<String, (u64, u64)> {
    use object::{Object, ObjectSection};
    let data = std::fs::read(path).unwrap_or_else(|e| panic!("{e}"));
    let f = object::File::parse(&*data).unwrap_or_else(|e| panic!("{e}"));
    f.sections()
        .filter_map(|s| Some((s.name().ok()?.to_string(), (s.address(), s.size()))))
        .collect()
}

fn debug_file(build_id: &str) -> PathBuf {
    PathBuf::from(format!(
        "/usr/lib/debug/.build-id/{}/{}.debug",
        &build_id[..2],
        &build_id[2..]
    ))
}

fn build_id(path: &Path) -> Option<String> {
    use object::Object;
    let data = std::fs::read(path).ok()?;
    let f = object::File::parse(&*data).ok()?;
    let id = f.build_id().ok()??;
    Some(id.iter().map(|b| format!("{b:02x}")).collect())
}

/// Every ELF file of the directories in BPFSCOPE_UNWIND_READELF_DIRS
/// (colon-separated), compared like the libraries above: a wide check for
/// a session to run by hand (`/usr/bin:/usr/lib/x86_64-linux-gnu` takes
/// about a minute).
#[test]
fn directories_match_readelf() {
    let Ok(dirs) = std::env::var("BPFSCOPE_UNWIND_READELF_DIRS") else {
        eprintln!("SKIP BPFSCOPE_UNWIND_READELF_DIRS not set (an opt-in wide comparison)");
        return;
    };
    if !have("readelf") {
        eprintln!("SKIP readelf not installed");
        return;
    }
    let mut files = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for d in dirs.split(':').filter(|d| !d.is_empty()) {
        let Ok(rd) = std::fs::read_dir(d) else {
            continue;
        };
        for e in rd.flatten() {
            use std::os::unix::fs::MetadataExt;
            let p = e.path();
            let Ok(m) = std::fs::metadata(&p) else {
                continue;
            };
            let mut magic = [0u8; 4];
            let elf = std::fs::File::open(&p)
                .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
                .is_ok()
                && magic == *b"\x7fELF";
            if m.is_file() && elf && seen.insert((m.dev(), m.ino())) {
                files.push(p);
            }
        }
    }
    files.sort();
    let (mut n, mut rows, mut addrs, mut bad, mut invalid) = (0, 0, 0, 0, 0);
    for p in &files {
        let table = match compile(p) {
            Ok(t) => t,
            Err(UnwindError::NoUnwindInfo { .. } | UnwindError::Relocatable { .. }) => continue,
            Err(e) => panic!("{e}"),
        };
        let Some(frames) = readelf_frames(p) else {
            continue;
        };
        let rep = compare(p, &table, &frames);
        n += 1;
        rows += rep.rows;
        addrs += rep.addresses;
        invalid += rep.invalid_cfi;
        if !rep.mismatches.is_empty() {
            bad += 1;
            eprintln!("{}: {} mismatches", p.display(), rep.mismatches.len());
            for m in rep.mismatches.iter().take(5) {
                eprintln!("  {m}");
            }
        }
        if table.stats().fde_errors > 0 || table.stats().cfi_errors > 0 {
            eprintln!("{}: {:?}", p.display(), table.stats());
        }
    }
    eprintln!(
        "{n} files, {rows} rows compared at {addrs} addresses ({invalid} in FDEs gimli refused part way), {bad} files with mismatches"
    );
    assert_eq!(bad, 0);
}

// ---------------------------------------------------------------- AArch64

/// The cross compiler for AArch64 (gcc-aarch64-linux-gnu), whose C
/// library (libc6-arm64-cross) is Debian's glibc built for arm64.
const A64_GCC: &str = "aarch64-linux-gnu-gcc";
const A64_LIBC: &str = "/usr/aarch64-linux-gnu/lib/libc.so.6";

#[test]
fn aarch64_libc_matches_readelf() {
    let Some((t, _)) = check_file(Path::new(A64_LIBC)) else {
        return;
    };
    assert_eq!(t.arch(), Arch::Aarch64);
    let rules: Vec<Rule> = t.ranges().map(|r| r.2).collect();
    // Leaves and prologues (return address in x30), frame records, and
    // frames with CFA = x29.
    assert!(
        rules.iter().any(|r| r.ra == ReturnAddress::Lr),
        "no rule with x30"
    );
    assert!(rules.iter().any(|r| matches!(
        (r.ra, r.rbp),
        (ReturnAddress::AtCfa(ra), SavedRbp::AtCfa(fp)) if ra == fp + 8
    )));
    assert!(rules.iter().any(|r| matches!(r.cfa, Cfa::Rbp(_))));
    // _start ends the walk.
    assert!(rules.iter().any(|r| r.ra == ReturnAddress::Undefined));
    let s = t.stats();
    // Frames whose save area is more than 1 KiB from both the CFA and the
    // bottom of the frame: 0.5% of rows here.
    assert!(
        s.unsupported.total() * 100 <= s.rows,
        "more than 1% of rows unsupported: {s:?}"
    );
}

/// Functions in the shapes AArch64 code takes: a leaf that keeps its
/// return address in x30, frame records of several sizes, x30 saved
/// without x29, pointer authentication (`paciasp`: DW_CFA_AARCH64_negate_ra_state),
/// and the kernel's signal trampoline as the vDSO describes it.
const A64_C: &str = r#"
volatile long sink;
__attribute__((noinline)) long leaf(long a, long b) { return a * 31 + b; }
__attribute__((noinline)) long mid(long n) {
    long v[64];
    for (long i = 0; i < 64; i++) v[i] = leaf(i, n);
    long s = 0;
    for (long i = 0; i < 64; i++) s += v[i] * leaf(s, i);
    return s;
}
__attribute__((noinline)) long big(long n) {
    volatile char buf[100000];
    buf[n % 100000] = 1;
    return mid(buf[n % 7]);
}
int main(int argc, char **argv) { sink = big(argc) + mid(argc); return 0; }
"#;

const A64_S: &str = r#"
	.text
	/* x30 saved alone, x29 untouched: str x30, [sp, #-16]! */
	.globl lr_alone
	.type lr_alone, %function
lr_alone:
	.cfi_startproc
	str x30, [sp, #-16]!
	.cfi_def_cfa_offset 16
	.cfi_offset x30, -16
	bl leaf
	ldr x30, [sp], #16
	.cfi_restore x30
	.cfi_def_cfa_offset 0
	ret
	.cfi_endproc
	.size lr_alone, .-lr_alone

	/* The kernel's __kernel_rt_sigreturn (arch/arm64/kernel/vdso/sigreturn.S). */
	.globl my_sigreturn
	.type my_sigreturn, %function
	.cfi_startproc
	.cfi_signal_frame
	.cfi_def_cfa x29, 0
	.cfi_offset x29, 0 * 8
	.cfi_offset x30, 1 * 8
	nop
my_sigreturn:
	mov x8, #139
	svc #0
	.cfi_endproc
	.size my_sigreturn, .-my_sigreturn

	/* x29 saved far from x30: no room for both, x29 lost. */
	.globl apart
	.type apart, %function
apart:
	.cfi_startproc
	sub sp, sp, #64
	.cfi_def_cfa_offset 64
	str x29, [sp, #8]
	str x30, [sp, #56]
	.cfi_offset x29, -56
	.cfi_offset x30, -8
	ldr x29, [sp, #8]
	ldr x30, [sp, #56]
	add sp, sp, #64
	.cfi_def_cfa_offset 0
	ret
	.cfi_endproc
	.size apart, .-apart
"#;

#[test]
fn aarch64_code_matches_readelf() {
    if !have(A64_GCC) || !have("readelf") {
        eprintln!("SKIP {A64_GCC} or readelf not installed (scripts/install-deps)");
        return;
    }
    let dir = TempDir::new("a64");
    let exe = cc(
        A64_GCC,
        &dir.0,
        "a64",
        &[("a64.c", A64_C), ("a64.S", A64_S)],
        &[
            "-O2",
            "-fomit-frame-pointer",
            "-mbranch-protection=standard",
        ],
    );
    let Some((t, _)) = check_file(&exe) else {
        return;
    };
    let syms = symbols(&exe);
    let at = |name: &str, off: u64| t.lookup(syms[name].0 + off);
    // The leaf: return address in x30 throughout.
    let (leaf, leaf_size) = syms["leaf"];
    for a in (leaf..leaf + leaf_size).step_by(4) {
        let r = t
            .lookup(a)
            .unwrap_or_else(|| panic!("no rule in leaf at {a:#x}"));
        assert_eq!((r.cfa, r.ra), (Cfa::Rsp(0), ReturnAddress::Lr), "{a:#x}");
    }
    // mid saves x30 alone, at the bottom of its frame (after paciasp,
    // which changes no rule).
    let (mid, mid_size) = syms["mid"];
    let rules: Vec<Rule> = (mid..mid + mid_size)
        .step_by(4)
        .filter_map(|a| t.lookup(a))
        .collect();
    assert!(
        rules.iter().any(|r| matches!(
            (r.cfa, r.ra, r.rbp),
            (Cfa::Rsp(c), ReturnAddress::AtCfa(ra), SavedRbp::Unchanged) if i64::from(ra) == -i64::from(c)
        )),
        "{rules:?}"
    );
    // big's frame is above 64 KiB.
    let (big, big_size) = syms["big"];
    assert!((big..big + big_size)
        .step_by(4)
        .filter_map(|a| t.lookup(a))
        .any(|r| matches!(r.cfa, Cfa::Rsp(o) if o >= 100_000)));
    // x30 alone.
    assert_eq!(
        at("lr_alone", 4).map(|r| (r.cfa, r.ra, r.rbp)),
        Some((Cfa::Rsp(16), ReturnAddress::AtCfa(-16), SavedRbp::Unchanged))
    );
    // The signal trampoline, and the nop before it (return address - 1).
    assert_eq!(at("my_sigreturn", 0), Some(Rule::sigcontext(true)));
    assert_eq!(
        t.lookup(syms["my_sigreturn"].0 - 4),
        Some(Rule::sigcontext(true))
    );
    // x29 and x30 apart: x30 kept, x29 lost (and counted).
    let r = at("apart", 12).unwrap_or_else(|| panic!("no rule in apart"));
    assert_eq!((r.ra, r.rbp), (ReturnAddress::AtCfa(-8), SavedRbp::Lost));
    assert!(t.stats().rbp_dropped_rows >= 1);

    // With frame pointers: frame records, and CFA = x29 where SP moves.
    let exe = cc(
        A64_GCC,
        &dir.0,
        "a64fp",
        &[("a64.c", A64_C), ("a64.S", A64_S)],
        &[
            "-O2",
            "-fno-omit-frame-pointer",
            "-mbranch-protection=standard",
        ],
    );
    let Some((t, _)) = check_file(&exe) else {
        return;
    };
    let (mid, mid_size) = symbols(&exe)["mid"];
    let rules: Vec<Rule> = (mid..mid + mid_size)
        .step_by(4)
        .filter_map(|a| t.lookup(a))
        .collect();
    assert!(
        rules.iter().any(|r| matches!(
            (r.ra, r.rbp),
            (ReturnAddress::AtCfa(ra), SavedRbp::AtCfa(fp)) if ra == fp + 8
        )),
        "{rules:?}"
    );
}

/// A vDSO built without CFI (Debian's arm64 kernels): its signal
/// trampoline still gets the signal frame's rule, from its symbol.
#[test]
fn aarch64_vdso_without_cfi_has_its_signal_trampoline() {
    if !have(A64_GCC) {
        eprintln!("SKIP {A64_GCC} not installed (scripts/install-deps)");
        return;
    }
    let dir = TempDir::new("a64vdso");
    let so = cc(
        A64_GCC,
        &dir.0,
        "vdso.so",
        &[(
            "vdso.S",
            "\t.text\n\tnop\n\t.globl __kernel_rt_sigreturn\n\t.type __kernel_rt_sigreturn, %function\n__kernel_rt_sigreturn:\n\tmov x8, #139\n\tsvc #0\n\t.size __kernel_rt_sigreturn, 8\n",
        )],
        &["-shared", "-nostdlib", "-Wl,--hash-style=both"],
    );
    let t = compile(&so).unwrap_or_else(|e| panic!("{e}"));
    let (sym, _) = symbols(&so)["__kernel_rt_sigreturn"];
    assert_eq!(t.stats().synthesized_sigreturn, 1);
    for a in [sym - 4, sym, sym + 4] {
        assert_eq!(t.lookup(a), Some(Rule::sigcontext(true)), "{a:#x}");
    }
    assert_eq!(t.lookup(sym + 8), None);
}

/// `functions` finds every FDE readelf lists, and places addresses in them.
#[test]
fn functions_are_the_fdes_readelf_lists() {
    let mut seen = 0;
    for p in [
        "/usr/bin/true",
        "/usr/bin/ls",
        "/usr/lib/x86_64-linux-gnu/liblzma.so.5",
    ] {
        let path = Path::new(p);
        let Ok(o) = Command::new("readelf")
            .args(["--debug-dump=frames"])
            .arg(path)
            .output()
        else {
            eprintln!("SKIP functions_are_the_fdes_readelf_lists: no readelf");
            return;
        };
        if !path.exists() {
            continue;
        }
        let text = String::from_utf8_lossy(&o.stdout);
        let mut fdes: Vec<(u64, u64)> = text
            .lines()
            .filter_map(|l| l.split(" pc=").nth(1))
            .filter_map(|r| {
                let (a, b) = r.trim().split_once("..")?;
                Some((
                    u64::from_str_radix(a, 16).ok()?,
                    u64::from_str_radix(b, 16).ok()?,
                ))
            })
            .filter(|(a, b)| a < b)
            .collect();
        fdes.sort_unstable();
        fdes.dedup();
        let f = bpfscope_unwind::functions(path).unwrap();
        assert_eq!(f.len(), fdes.len(), "{p}");
        for &(a, b) in &fdes {
            assert_eq!(f.at(a), Some((a, b)), "{p} {a:#x}");
            assert_eq!(f.at(b - 1), Some((a, b)), "{p} {b:#x}");
        }
        seen += 1;
    }
    assert!(seen > 0);
}
