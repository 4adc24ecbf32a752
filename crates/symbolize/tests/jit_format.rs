// Allowed here: a failed check panics: that is how a test fails.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// Format-level tests on hand-built inputs: perf map syntax, overlap rules,
// jitdump records in both byte orders, and garbage that must not panic.

use bpfscope_symbolize::jit::{JitError, JitSymbols, PerfMapTail};

fn names(t: &JitSymbols) -> Vec<(u64, u64, String)> {
    t.iter()
        .map(|s| (s.start, s.size, s.name.to_string()))
        .collect()
}

#[test]
fn perf_map_syntax() {
    let t = JitSymbols::from_perf_map(
        "1000 10 plain\n\
         0x2000 0x20 with 0x prefix and  spaces \r\n\
         \n\
         3000\t8\ttabbed\n\
         garbage line\n\
         4000 10\n\
         4000 1g bad size\n\
         5000 0 empty\n\
         ffffffffffffffff 2 wraps\n\
         10000000000000000 1 too big\n\
         6000 4 last-without-newline",
    );
    assert_eq!(
        names(&t),
        vec![
            (0x1000, 0x10, "plain".into()),
            (0x2000, 0x20, "with 0x prefix and  spaces".into()),
            (0x3000, 8, "tabbed".into()),
            (0x6000, 4, "last-without-newline".into()),
        ]
    );
    assert_eq!(t.lookup(0x1000).map(|s| s.name), Some("plain"));
    assert_eq!(t.lookup(0x100f).map(|s| s.name), Some("plain"));
    assert_eq!(t.lookup(0x1010), None);
    assert_eq!(t.lookup(0xfff), None);
    assert_eq!(t.lookup(0), None);
    assert_eq!(t.lookup(u64::MAX), None);
    let c = JitSymbols::from_perf_map_since(b"1000 10 a\nzz\n5000 0 e\n", 0);
    assert_eq!(
        (c.lines, c.malformed, c.empty, c.symbols.len()),
        (3, 1, 1, 1)
    );
}

#[test]
fn newest_wins_and_splits() {
    // B overwrites the middle of A; C replaces B exactly; D covers the end of A.
    let t = JitSymbols::from_perf_map("100 100 A\n140 20 B\n140 20 C\n1f0 20 D\n");
    let got: Vec<_> = [
        0x100, 0x13f, 0x140, 0x15f, 0x160, 0x1ef, 0x1f0, 0x20f, 0x210,
    ]
    .iter()
    .map(|&a| t.lookup(a).map(|s| s.name))
    .collect();
    assert_eq!(
        got,
        [
            Some("A"),
            Some("A"),
            Some("C"),
            Some("C"),
            Some("A"),
            Some("A"),
            Some("D"),
            Some("D"),
            None
        ]
    );
    // A's pieces still report A's own start and size.
    assert_eq!(
        t.lookup(0x160).map(|s| (s.start, s.size)),
        Some((0x100, 0x100))
    );
    assert_eq!(t.len(), 4);

    // An older entry that covers nothing newer is kept; a newer big one eats all.
    let t = JitSymbols::from_perf_map("100 10 a\n120 10 b\n140 10 c\n0 1000 big\n");
    assert_eq!(t.len(), 1);
    assert_eq!(t.lookup(0x125).map(|s| s.name), Some("big"));
}

#[test]
fn merge_newer_wins() {
    let mut a = JitSymbols::from_perf_map("100 100 old\n300 10 keep\n");
    let b = JitSymbols::from_perf_map("180 10 new\n400 10 added\n");
    a.merge(b);
    let at = |x| a.lookup(x).map(|s| s.name);
    assert_eq!(
        (at(0x17f), at(0x180), at(0x190), at(0x305), at(0x405)),
        (
            Some("old"),
            Some("new"),
            Some("old"),
            Some("keep"),
            Some("added")
        )
    );
    assert_eq!(a.len(), 5);
    let mut e = JitSymbols::new();
    e.merge(JitSymbols::from_perf_map("1 1 x\n"));
    assert_eq!(e.len(), 1);
}

#[test]
fn since_reads_only_complete_lines() {
    let full = b"1000 10 one\n2000 10 two\n3000 10 three\n";
    for cut in 0..=full.len() {
        let first = JitSymbols::from_perf_map_since(&full[..cut], 0);
        // The unfinished line must not be parsed ("3000 1" would be wrong).
        let nl = full[..cut]
            .iter()
            .rposition(|&c| c == b'\n')
            .map_or(0, |p| p + 1);
        assert_eq!(first.next_offset, nl);
        let second = JitSymbols::from_perf_map_since(full, first.next_offset);
        assert_eq!(second.next_offset, full.len());
        let mut t = first.symbols;
        t.merge(second.symbols);
        assert_eq!(
            names(&t),
            names(&JitSymbols::from_perf_map_since(full, 0).symbols)
        );
    }
    let past = JitSymbols::from_perf_map_since(full, 1000);
    assert_eq!((past.next_offset, past.symbols.len()), (1000, 0));
}

#[test]
fn tail_follows_growing_file() {
    let dir = std::env::temp_dir().join(format!("bpfscope-jit-tail-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("perf-1.map");
    std::fs::write(&path, "1000 10 one\n2000 1").unwrap();
    let mut tail = PerfMapTail::new(&path);
    let mut t = JitSymbols::new();
    assert_eq!(tail.poll(&mut t).unwrap(), 1);
    std::fs::write(&path, "1000 10 one\n2000 10 two\n").unwrap();
    assert_eq!(tail.poll(&mut t).unwrap(), 1);
    assert_eq!(t.lookup(0x2005).map(|s| s.size), Some(0x10));
    // Rewritten shorter: start over.
    std::fs::write(&path, "5 1 x\n").unwrap();
    assert_eq!(tail.poll(&mut t).unwrap(), 1);
    assert_eq!(t.len(), 1);
    std::fs::remove_dir_all(&dir).unwrap();
}

// ---------------------------------------------------------------- jitdump

struct W {
    be: bool,
    buf: Vec<u8>,
}

impl W {
    fn new(be: bool, pad1: u32) -> W {
        let mut w = W {
            be,
            buf: Vec::new(),
        };
        for v in [0x4A69_5444, 1, 40, 62, pad1, 1234] {
            w.u32(v);
        }
        w.u64(0);
        w.u64(0);
        w
    }
    fn u32(&mut self, v: u32) {
        let b = if self.be {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        };
        self.buf.extend_from_slice(&b);
    }
    fn u64(&mut self, v: u64) {
        let b = if self.be {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        };
        self.buf.extend_from_slice(&b);
    }
    fn rec(&mut self, id: u32, body: impl FnOnce(&mut W)) {
        let mut r = W {
            be: self.be,
            buf: Vec::new(),
        };
        body(&mut r);
        self.u32(id);
        self.u32(16 + r.buf.len() as u32);
        self.u64(42);
        self.buf.extend(r.buf);
    }
    fn load(&mut self, addr: u64, size: u64, name: &str) {
        self.rec(0, |r| {
            r.u32(1);
            r.u32(2);
            r.u64(addr);
            r.u64(addr);
            r.u64(size);
            r.u64(7);
            r.buf.extend_from_slice(name.as_bytes());
            r.buf.push(0);
            r.buf
                .extend(std::iter::repeat_n(0xcc, size.min(64) as usize));
        });
    }
    fn mv(&mut self, old: u64, new: u64, size: u64) {
        self.rec(1, |r| {
            r.u32(1);
            r.u32(2);
            r.u64(new);
            r.u64(old);
            r.u64(new);
            r.u64(size);
            r.u64(7);
        });
    }
    fn debug(&mut self, addr: u64, ents: &[(u64, u32, &[u8])]) {
        self.rec(2, |r| {
            r.u64(addr);
            r.u64(ents.len() as u64);
            for &(a, line, file) in ents {
                r.u64(a);
                r.u32(line);
                r.u32(0);
                r.buf.extend_from_slice(file);
                r.buf.push(0);
            }
        });
    }
}

fn sample_dump(be: bool, pad1: u32) -> Vec<u8> {
    let mut w = W::new(be, pad1);
    w.rec(4, |r| r.buf.extend_from_slice(&[1; 24])); // unwinding info: skipped
    w.rec(99, |r| r.buf.extend_from_slice(b"future")); // unknown: skipped
    w.debug(
        0x1000,
        &[
            (0x1010, 20, b"b.js"),
            (0x1000, 10, b"a.js"),
            (0x1020, 30, b"\xff"),
        ],
    );
    w.load(0x1000, 0x40, "JS:*hot");
    w.load(0x2000, 0x10, "stub");
    w.mv(0x1000, 0x5000, 0x40);
    w.load(0x1000, 0x8, "reused");
    w.rec(3, |_| {}); // close: nothing after counts
    w.load(0x9000, 0x10, "after-close");
    w.buf
}

#[test]
fn jitdump_both_byte_orders() {
    for be in [false, true] {
        let t = JitSymbols::from_jitdump(&sample_dump(be, 0)).unwrap();
        let s = |a| {
            t.lookup(a)
                .map(|s| (s.name, s.source.map(|l| (l.file, l.line))))
        };
        assert_eq!(s(0x1000), Some(("reused", None)), "be={be}");
        assert_eq!(s(0x1008), Some(("JS:*hot", Some(("a.js", 10)))));
        assert_eq!(s(0x1015), Some(("JS:*hot", Some(("b.js", 20)))));
        // "\xff" = same file as the previous entry in file order (a.js),
        // even though entries are looked up sorted by address.
        assert_eq!(s(0x103f), Some(("JS:*hot", Some(("a.js", 30)))));
        assert_eq!(s(0x2000), Some(("stub", None)));
        // Moved code keeps its name and its lines, shifted.
        assert_eq!(s(0x5000), Some(("JS:*hot", Some(("a.js", 10)))));
        assert_eq!(s(0x5015), Some(("JS:*hot", Some(("b.js", 20)))));
        assert_eq!(s(0x9000), None);
    }
}

#[test]
fn jitdump_v8_line_bias() {
    // V8 (header pad1 0xDEADBEEF) writes line addresses 0x40 high.
    let mut w = W::new(false, 0xDEAD_BEEF);
    w.debug(0x1000, &[(0x1040, 5, b"x.js"), (0x1050, 6, b"\xff")]);
    w.load(0x1000, 0x20, "JS:*f");
    let t = JitSymbols::from_jitdump(&w.buf).unwrap();
    let line = |a| t.lookup(a).and_then(|s| s.source).map(|l| l.line);
    assert_eq!(
        (line(0x1000), line(0x100f), line(0x1010)),
        (Some(5), Some(5), Some(6))
    );
}

#[test]
fn jitdump_header_errors() {
    let good = sample_dump(false, 0);
    assert!(matches!(
        JitSymbols::from_jitdump(&[]),
        Err(JitError::TooShort)
    ));
    assert!(matches!(
        JitSymbols::from_jitdump(&good[..39]),
        Err(JitError::TooShort)
    ));
    let mut bad = good.clone();
    bad[0] = b'X';
    assert!(matches!(
        JitSymbols::from_jitdump(&bad),
        Err(JitError::BadMagic(_))
    ));
    let mut v2 = good.clone();
    v2[4] = 2;
    assert!(matches!(
        JitSymbols::from_jitdump(&v2),
        Err(JitError::UnsupportedVersion(2))
    ));
    let mut hs = good.clone();
    hs[8] = 8;
    assert!(matches!(
        JitSymbols::from_jitdump(&hs),
        Err(JitError::BadHeader(8))
    ));
    // Display/Error are usable.
    let e: Box<dyn std::error::Error> = Box::new(JitError::BadMagic(1));
    assert!(e.to_string().contains("magic"));
}

#[test]
fn jitdump_truncated_keeps_prefix() {
    let good = sample_dump(true, 0);
    let full = JitSymbols::from_jitdump(&good).unwrap().len();
    let mut last = 0;
    for cut in 40..=good.len() {
        let t = JitSymbols::from_jitdump(&good[..cut]).unwrap();
        assert!(t.len() <= full + 1); // a load may exist before its later move/override
        last = t.len();
    }
    assert_eq!(last, full);
}

/// xorshift: deterministic garbage without a rand dependency.
fn rng(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

#[test]
fn garbage_never_panics() {
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let good = sample_dump(false, 0xDEAD_BEEF);
    for round in 0..20_000 {
        let mut b = good.clone();
        // Mutate a few bytes anywhere, including record sizes and counts.
        for _ in 0..(1 + rng(&mut seed) % 8) {
            let i = (rng(&mut seed) as usize) % b.len();
            b[i] = rng(&mut seed) as u8;
        }
        if round % 3 == 0 {
            b.truncate((rng(&mut seed) as usize) % (b.len() + 1));
        }
        if let Ok(t) = JitSymbols::from_jitdump(&b) {
            for _ in 0..8 {
                let _ = t.lookup(rng(&mut seed) % 0x10000);
            }
        }
        // The same bytes as a perf map.
        let m = JitSymbols::from_perf_map_since(&b, (rng(&mut seed) as usize) % (b.len() + 2));
        let _ = m.symbols.lookup(rng(&mut seed));
        let t = JitSymbols::from_perf_map(&String::from_utf8_lossy(&b));
        let _ = t.lookup(rng(&mut seed));
    }
    // Random text shaped like map lines, with overlaps everywhere.
    let mut text = String::new();
    for _ in 0..20_000 {
        let a = rng(&mut seed) % 0x4000;
        let s = rng(&mut seed) % 0x200;
        text.push_str(&format!("{a:x} {s:x} n{}\n", rng(&mut seed) % 100));
    }
    let t = JitSymbols::from_perf_map(&text);
    let v: Vec<_> = t.iter().collect();
    assert!(!v.is_empty());
    check_against_naive(&text, &t);
}

/// Newest-wins by brute force: the last line covering each address.
fn check_against_naive(text: &str, t: &JitSymbols) {
    let mut owner: Vec<Option<&str>> = vec![None; 0x4200];
    for line in text.lines() {
        let mut f = line.splitn(3, ' ');
        let (a, s, n) = (f.next().unwrap(), f.next().unwrap(), f.next().unwrap());
        let a = u64::from_str_radix(a, 16).unwrap() as usize;
        let s = u64::from_str_radix(s, 16).unwrap() as usize;
        for o in &mut owner[a..a + s] {
            *o = Some(n);
        }
    }
    for (addr, want) in owner.iter().enumerate() {
        assert_eq!(t.lookup(addr as u64).map(|s| s.name), *want, "at {addr:#x}");
    }
}

#[test]
fn chunked_merges_match_naive() {
    let mut seed = 0xDEAD_BEEF_1234_5678u64;
    for round in 0..40 {
        // Sparse rounds mostly take the disjoint fast path, dense ones paint.
        let spread = if round % 2 == 0 { 0x4000 } else { 0x400 };
        let mut text = String::new();
        for _ in 0..(50 + rng(&mut seed) % 400) {
            let a = rng(&mut seed) % spread;
            let s = 1 + rng(&mut seed) % 0x40;
            text.push_str(&format!("{a:x} {s:x} n{}\n", rng(&mut seed) % 1000));
        }
        let bytes = text.as_bytes();
        let mut t = JitSymbols::new();
        let mut off = 0;
        while off < bytes.len() {
            let cut = (off + 1 + (rng(&mut seed) as usize) % 600).min(bytes.len());
            let c = JitSymbols::from_perf_map_since(&bytes[..cut], off);
            t.merge(c.symbols);
            off = c.next_offset.max(off);
            if cut == bytes.len() {
                break;
            }
        }
        check_against_naive(&text, &t);
    }
}

#[test]
fn many_moves_share_line_tables() {
    // One function with 50k lines moved 50k times: must stay linear.
    let mut w = W::new(false, 0);
    let ents: Vec<(u64, u32, &[u8])> = (0..50_000u64)
        .map(|i| (0x1000 + i, i as u32, &b"\xff"[..]))
        .collect();
    w.debug(0x1000, &ents);
    w.load(0x1000, 50_000, "big");
    let mut at = 0x1000u64;
    for i in 1..=50_000u64 {
        let to = 0x1000_0000 * i;
        w.mv(at, to, 50_000);
        at = to;
    }
    let t0 = std::time::Instant::now();
    let t = JitSymbols::from_jitdump(&w.buf).unwrap();
    assert!(t0.elapsed().as_secs() < 5);
    let s = t.lookup(at + 123).unwrap();
    assert_eq!(
        (s.name, s.start, s.source.map(|l| l.line)),
        ("big", at, Some(123))
    );
}
