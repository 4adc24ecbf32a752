// Allowed here: a failed check panics: that is how a test fails.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// SPDX-License-Identifier: GPL-2.0
//! Checks pylines::line_for against line numbers CPython itself computes,
//! for every 2-byte code unit of every code object pylines/lines.py dumps,
//! under each CPython 3.9-3.13 installed here (Debian's, a pyenv tree's);
//! plus truncated tables and garbage input.

use bpfscope_symbolize::pylines::{line_for, line_for_prefix};
use std::path::PathBuf;
use std::sync::OnceLock;

struct Code {
    label: String,
    first: u32,
    table: Vec<u8>,
    /// Expected line per code unit (byte offset = index * 2).
    lines: Vec<Option<u32>>,
}

const MINORS: [u8; 5] = [9, 10, 11, 12, 13];

/// The interpreter of a version: Debian's, else the newest in a pyenv tree.
fn interpreter(minor: u8) -> Option<PathBuf> {
    let debian = PathBuf::from(format!("/usr/bin/python3.{minor}"));
    if debian.exists() {
        return Some(debian);
    }
    let root = std::env::var("PYENV_ROOT").unwrap_or_else(|_| "/root/.pyenv".into());
    let mut found: Vec<PathBuf> = std::fs::read_dir(format!("{root}/versions"))
        .ok()?
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(&format!("3.{minor}."))
        })
        .map(|e| e.path().join(format!("bin/python3.{minor}")))
        .filter(|p| p.exists())
        .collect();
    found.sort();
    found.pop()
}

/// The golden data of each version, dumped once per test run by the
/// interpreter itself (None when that version is not installed).
fn data(minor: u8) -> Option<&'static str> {
    static DATA: OnceLock<Vec<Option<String>>> = OnceLock::new();
    let all = DATA.get_or_init(|| {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/pylines/lines.py");
        let dir = std::env::temp_dir().join(format!("bpfscope-pylines-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let out = MINORS
            .iter()
            .map(|&m| {
                let Some(py) = interpreter(m) else {
                    println!("SKIP: CPython 3.{m} is not installed");
                    return None;
                };
                let path = dir.join(format!("lines-3.{m}.txt"));
                let ok = std::process::Command::new(&py)
                    .arg(&script)
                    .arg(&path)
                    .status()
                    .map(|s| s.success())
                    .unwrap_or(false);
                assert!(ok, "{} {} failed", py.display(), script.display());
                std::fs::read_to_string(&path).ok()
            })
            .collect();
        let _ = std::fs::remove_dir_all(&dir);
        out
    });
    let i = MINORS.iter().position(|&m| m == minor)?;
    all[i].as_deref()
}

fn hex(s: &str) -> Vec<u8> {
    if s == "-" {
        return Vec::new();
    }
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
        .collect()
}

fn line_tok(s: &str) -> Option<u32> {
    if s == "-" {
        None
    } else {
        Some(s.parse().unwrap())
    }
}

fn rle(s: &str) -> Vec<Option<u32>> {
    let mut out = Vec::new();
    if s == "-" {
        return out;
    }
    for tok in s.split(',') {
        let (v, n) = match tok.split_once('*') {
            Some((v, n)) => (v, n.parse().unwrap()),
            None => (tok, 1usize),
        };
        out.extend(std::iter::repeat_n(line_tok(v), n));
    }
    out
}

/// None when the data file for that version was not generated.
fn load(minor: u8) -> Option<Vec<Code>> {
    let text = data(minor)?;
    let mut codes = Vec::new();
    for l in text.lines().filter(|l| l.starts_with("C ")) {
        let f: Vec<&str> = l.split(' ').collect();
        assert_eq!(f.len(), 5, "bad line: {l}");
        codes.push(Code {
            label: f[1].to_string(),
            first: f[2].parse().unwrap(),
            table: hex(f[3]),
            lines: rle(f[4]),
        });
    }
    assert!(!codes.is_empty());
    Some(codes)
}

#[test]
fn golden_every_offset() {
    let mut versions = 0;
    for minor in MINORS {
        let Some(codes) = load(minor) else { continue };
        versions += 1;
        let mut checked = 0usize;
        for c in &codes {
            for (i, want) in c.lines.iter().enumerate() {
                let got = line_for(3, minor, &c.table, c.first, (i * 2) as u32);
                assert_eq!(got, *want, "3.{minor} {} @{}", c.label, i * 2);
                checked += 1;
            }
        }
        eprintln!(
            "3.{minor}: {} code objects, {checked} offsets ok",
            codes.len()
        );
    }
    if versions == 0 {
        println!("SKIP: no CPython 3.9-3.13 on this machine");
    }
}

/// Deterministic generator, so failures reproduce without a rand crate.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

#[test]
fn golden_truncated_prefix_never_lies() {
    let mut rng = Lcg(42);
    for minor in MINORS {
        let Some(codes) = load(minor) else { continue };
        for c in &codes {
            let n = c.table.len();
            let mut cuts: Vec<usize> = (0..6).map(|_| rng.next() as usize % (n + 1)).collect();
            cuts.extend([0, n / 2, n.saturating_sub(1)]);
            for cut in cuts {
                let t = &c.table[..cut.min(n)];
                for (i, want) in c.lines.iter().enumerate() {
                    let got = line_for_prefix(3, minor, t, c.first, (i * 2) as u32, false);
                    // A prefix may be unable to answer, but must never
                    // answer differently from the full table.
                    assert!(
                        got.is_none() || got == *want,
                        "3.{minor} {} cut {cut} @{}: {got:?} vs {want:?}",
                        c.label,
                        i * 2
                    );
                }
            }
        }
    }
}

#[test]
fn garbage_never_panics() {
    let mut rng = Lcg(7);
    let mut buf = Vec::new();
    for _ in 0..20_000 {
        let len = rng.next() as usize % 64;
        buf.clear();
        buf.extend((0..len).map(|_| rng.next() as u8));
        let first = match rng.next() % 3 {
            0 => 0,
            1 => u32::MAX,
            _ => rng.next() as u32,
        };
        let off = if rng.next() & 3 == 0 {
            u32::MAX
        } else {
            rng.next() as u32 % 256
        };
        for minor in 0..=15u8 {
            let _ = line_for(3, minor, &buf, first, off);
            let _ = line_for_prefix(3, minor, &buf, first, off, false);
        }
    }
    // Mutated real tables reach deeper into the decoders than pure noise.
    for minor in MINORS {
        let Some(codes) = load(minor) else { continue };
        for c in codes.iter().take(200) {
            let mut t = c.table.clone();
            for _ in 0..4 {
                if t.is_empty() {
                    break;
                }
                let at = rng.next() as usize % t.len();
                t[at] = rng.next() as u8;
                for i in 0..c.lines.len() + 4 {
                    let _ = line_for(3, minor, &t, c.first, (i * 2) as u32);
                }
            }
        }
    }
}
