// Allowed here: a failed check panics: that is how a test fails.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// SPDX-License-Identifier: GPL-2.0
//! Real-binary tests: the crate's answers on stripped Go binaries against
//! independent truth from the unstripped build.

#[path = "support/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::time::Instant;

use bpfscope_gopclntab::GoTable;
use common::*;

fn read(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
}

/// Compares lookups on `stripped` with .symtab names of `plain` (same code
/// layout, symbols kept) and file:line from `go tool addr2line` on `plain`,
/// or from its DWARF via llvm-symbolizer when `dwarf` is set (Go 1.19's
/// addr2line does not find the table in PIE builds).
fn compare_stripped(b: &Built, plain: &Path, stripped: &Path, dwarf: bool) -> (usize, usize) {
    let plain_bytes = read(plain);
    let funcs = symtab_funcs(&plain_bytes);
    assert!(funcs.len() > 100, "unstripped build has a symtab");
    let table = GoTable::parse(&read(stripped)).expect("stripped binary has a pclntab");
    assert!(GoTable::parse(&plain_bytes).is_some());
    let (lo, hi) = table.text_range().expect("text range");
    // Only Go functions are in the pclntab; .text may hold a few non-Go bytes.
    let funcs: Vec<_> = funcs
        .into_iter()
        .filter(|f| f.0 >= lo && f.0 < hi)
        .collect();
    let pcs = sample_pcs(&funcs, 600, |n| n.starts_with("main."), 0x5eed);
    let (truth, how): (Vec<(String, u32)>, &str) = if dwarf {
        let Some(d) = llvm_symbolize(plain, &pcs, false) else {
            println!(
                "SKIP: llvm-symbolizer unavailable; {} not compared",
                stripped.display()
            );
            return (0, 0);
        };
        (
            d.into_iter()
                .map(|f| {
                    f.into_iter()
                        .next()
                        .map(|(_, f, l)| (f, l))
                        .unwrap_or_default()
                })
                .collect(),
            "DWARF via llvm-symbolizer",
        )
    } else {
        let a = go_addr2line(&b.go, plain, &pcs).expect("go tool addr2line");
        for (pc, t) in pcs.iter().zip(&a) {
            assert!(
                symtab_name_matches(&t.name, sym_at(&funcs, *pc).unwrap_or("?")),
                "addr2line and .symtab agree"
            );
        }
        (
            a.into_iter().map(|t| (t.file, t.line)).collect(),
            "go tool addr2line",
        )
    };
    let mut agree = 0;
    let mut compared = 0;
    let mut bad = Vec::new();
    for (pc, (file, line)) in pcs.iter().zip(&truth) {
        let sym = sym_at(&funcs, *pc).unwrap_or("?");
        let got = table.lookup(*pc);
        let pos_ok = match &got {
            None => Some(false),
            Some(g) if dwarf => dwarf_agrees(g.file.as_deref(), g.line, file, *line),
            Some(g) => Some(g.file.as_deref() == Some(file.as_str()) && g.line == Some(*line)),
        };
        // Names are always compared; positions only where the truth has one.
        let ok = got
            .as_ref()
            .is_some_and(|g| symtab_name_matches(&g.name, sym))
            && pos_ok != Some(false);
        compared += 1;
        if ok {
            agree += 1;
        } else if bad.len() < 10 {
            bad.push(format!("{pc:#x}: got {got:?}; symtab {sym}, {file}:{line}"));
        }
    }
    println!(
        "{} ({}): {}/{} pcs agree (name vs .symtab, file:line vs {how} on the unstripped build)",
        stripped.file_name().unwrap_or_default().to_string_lossy(),
        table.format(),
        agree,
        compared
    );
    for l in &bad {
        println!("  MISMATCH {l}");
    }
    (pcs.len(), agree)
}

#[test]
fn self_built_stripped_matches_unstripped() {
    let Some(b) = built() else { return };
    let (n, a) = compare_stripped(b, &b.plain, &b.stripped, false);
    assert!(n >= 500);
    assert_eq!(n, a, "all sampled pcs must agree");
    let (n, a) = compare_stripped(b, &b.plain, &b.stripped, true);
    assert_eq!(n, a, "all sampled pcs must agree with DWARF too");
    let (n, a) = compare_stripped(b, &b.pie, &b.pie_stripped, true);
    assert_eq!(n, a, "all sampled PIE pcs must agree");

    // The interesting functions are found by name at their entry.
    let t = GoTable::parse(&read(&b.stripped)).expect("parse");
    let names: Vec<String> = t.functions().map(|(_, n)| n.into_owned()).collect();
    for want in [
        "main.hot",
        "main.outer",
        "main.inner",
        "main.(*Acc).Add",
        "main.main.func1",
        "main.apply",
        "main.main",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} in function list");
    }
}

/// Inline frames vs DWARF (llvm-symbolizer --inlining) for `pcs`:
/// (compared, names agree, call lines agree, pcs in inlined code).
fn inline_vs_dwarf(
    t: &GoTable,
    bin: &Path,
    pcs: &[u64],
    label: &str,
) -> Option<(usize, usize, usize, usize)> {
    let dwarf = llvm_symbolize(bin, pcs, true)?;
    let (mut n, mut names_ok, mut lines_ok, mut inlined) = (0, 0, 0, 0);
    let mut shown = 0;
    for (pc, frames) in pcs.iter().zip(&dwarf) {
        let Some(g) = t.lookup(*pc) else { continue };
        n += 1;
        let want: Vec<&str> = frames
            .iter()
            .take(frames.len().saturating_sub(1))
            .map(|f| f.0.as_str())
            .collect();
        let got: Vec<&str> = g.inlined.iter().map(|i| i.name.as_ref()).collect();
        inlined += usize::from(!got.is_empty());
        if want.len() == got.len()
            && want
                .iter()
                .zip(&got)
                .all(|(w, o)| symtab_name_matches(o, w))
        {
            names_ok += 1;
        } else if shown < 5 {
            shown += 1;
            println!(
                "  INLINE DIFF {label} {pc:#x} in {}: dwarf {want:?} ours {got:?}",
                g.name
            );
        }
        // Frame k+1 of DWARF holds the call site of inlined[k].
        let want_lines: Vec<u32> = frames.iter().skip(1).map(|f| f.2).collect();
        let got_lines: Vec<u32> = g.inlined.iter().map(|i| i.call_line.unwrap_or(0)).collect();
        lines_ok += usize::from(want_lines == got_lines);
    }
    println!(
        "{label}: inline frames vs DWARF: {n} pcs ({inlined} in inlined code): names {names_ok}/{n}, call lines {lines_ok}/{n}"
    );
    Some((n, names_ok, lines_ok, inlined))
}

/// Same comparison for cross-compiled builds: other pointer sizes,
/// quanta and byte orders.
#[test]
fn cross_arch_stripped_matches_unstripped() {
    let Some(b) = built() else { return };
    for (arch, plain, stripped) in &b.cross {
        let (n, a) = compare_stripped(b, plain, stripped, false);
        assert!(n >= 500);
        assert_eq!(n, a, "GOARCH={arch}: all sampled pcs must agree");
        let t = GoTable::parse(&read(stripped)).expect("parse");
        assert!(t.has_inline_info(), "GOARCH={arch}: inline tree found");
        let g = t
            .functions()
            .find(|(_, n)| n == "main.inner")
            .and_then(|(e, _)| {
                (e..e + 400)
                    .filter_map(|pc| t.lookup(pc))
                    .find(|g| g.name == "main.inner" && !g.inlined.is_empty())
            });
        let g = g.unwrap_or_else(|| panic!("GOARCH={arch}: inlined frame in main.inner"));
        assert!(
            g.inlined.iter().any(|i| i.name == "main.small"),
            "GOARCH={arch}: {g:?}"
        );
        if have_llvm_symbolizer() {
            let funcs = symtab_funcs(&read(plain));
            let pcs = sample_pcs(&funcs, 1500, |n| n.starts_with("main."), 3);
            let label = format!("GOARCH={arch}");
            if let Some((n, names_ok, lines_ok, _)) = inline_vs_dwarf(&t, plain, &pcs, &label) {
                assert!(
                    names_ok * 1000 >= n * 995 && lines_ok * 1000 >= n * 995,
                    "{label}: inline vs DWARF"
                );
            }
        }
        println!(
            "GOARCH={arch}: {a}/{n} agree; inline sample {:?}",
            g.inlined.iter().map(|i| &i.name).collect::<Vec<_>>()
        );
    }
}

#[test]
fn inline_frames_match_dwarf() {
    let Some(b) = built() else { return };
    if !have_llvm_symbolizer() {
        println!("SKIP: llvm-symbolizer not found; inline frames not checked");
        return;
    }
    let plain_bytes = read(&b.plain);
    let funcs = symtab_funcs(&plain_bytes);
    let t = &GoTable::parse(&read(&b.stripped)).expect("parse");
    assert!(
        t.has_inline_info(),
        "gofunc found via moduledata in a stripped binary"
    );
    let (lo, hi) = t.text_range().expect("range");
    let funcs: Vec<_> = funcs
        .into_iter()
        .filter(|f| f.0 >= lo && f.0 < hi)
        .collect();
    // Every pc of the main package plus a spread over the rest.
    let mut pcs: Vec<u64> = funcs
        .iter()
        .filter(|f| f.2.starts_with("main."))
        .flat_map(|f| f.0..f.1)
        .collect();
    pcs.extend(sample_pcs(&funcs, 2000, |_| false, 77));
    let (n, names_ok, lines_ok, _) =
        inline_vs_dwarf(t, &b.plain, &pcs, "self-built").expect("llvm-symbolizer output");
    let main_inlined = pcs
        .iter()
        .filter_map(|&pc| t.lookup(pc))
        .filter(|g| g.name.starts_with("main.") && !g.inlined.is_empty())
        .count();
    println!("  {main_inlined} pcs of main.* are in inlined code");
    assert!(main_inlined > 0, "small/twice are inlined into main.*");
    // DWARF and pclntab come from the same compiler inline tree, but DWARF
    // omits inlining inside compiler-generated wrappers; allow a sliver.
    assert!(
        names_ok * 1000 >= n * 995,
        "inline names agree for >= 99.5%"
    );
    assert!(lines_ok * 1000 >= n * 995, "call lines agree for >= 99.5%");

    // Two-level inline: twice inside small inside main.inner.
    let twice = pcs.iter().filter_map(|&pc| t.lookup(pc)).find(|g| {
        g.name == "main.inner" && g.inlined.len() == 2 && g.inlined[0].name == "main.twice"
    });
    let g = twice.expect("a pc in main.twice inlined via main.small into main.inner");
    assert_eq!(g.inlined[1].name, "main.small");
    assert!(g.file.as_deref().is_some_and(|f| f.ends_with("main.go")));
}

/// Flips bytes and shrinks the table section in a real binary: parse and
/// lookup must never panic, whatever they return.
#[test]
fn garbled_tables_do_not_panic() {
    let Some(b) = built() else { return };
    let orig = read(&b.stripped);
    let (off, size) = section_file_range(&orig, ".gopclntab").expect(".gopclntab");
    let good = GoTable::parse(&orig).expect("parse");
    let (lo, hi) = good.text_range().expect("range");
    let mut rng = Rng(0x1234_5678);
    let probe = |t: &GoTable, rng: &mut Rng| {
        for _ in 0..300 {
            let pc = lo.wrapping_sub(64).wrapping_add(rng.below(hi - lo + 128));
            let _ = t.lookup(pc);
        }
        let _ = t.functions().take(2000).count();
        let _ = t.format();
    };
    let mut parsed = 0;
    let rounds = 400;
    for round in 0..rounds {
        let mut elf = orig.clone();
        match round % 4 {
            // Header and functab area: counts, offsets, entries.
            0 => {
                for _ in 0..1 + rng.below(4) {
                    let i = off + rng.below(256.min(size as u64)) as usize;
                    elf[i] = rng.next() as u8;
                }
            }
            // Anywhere in the table: names, pc-value tables, cutab.
            1 => {
                for _ in 0..1 + rng.below(64) {
                    let i = off + rng.below(size as u64) as usize;
                    elf[i] = rng.next() as u8;
                }
            }
            // Truncated table: zero-fill the tail (the section size stays,
            // so offsets point into garbage) ...
            2 => {
                let cut = off + rng.below(size as u64) as usize;
                elf[cut..off + size].fill(0);
            }
            // ... or a truncated file ...
            3 if round % 8 == 3 => {
                let cut = rng.below(elf.len() as u64) as usize;
                elf.truncate(cut);
            }
            // ... or garbled ELF/program/section headers (addresses, sizes).
            _ => {
                let shoff = u64::from_le_bytes(orig[0x28..0x30].try_into().unwrap()) as usize;
                for _ in 0..1 + rng.below(8) {
                    let i = if rng.below(2) == 0 {
                        rng.below(0x40 + 56 * 12) as usize
                    } else {
                        (shoff + rng.below(64 * 40) as usize).min(elf.len() - 1)
                    };
                    elf[i] = rng.next() as u8;
                }
            }
        }
        if let Some(t) = GoTable::parse(&elf) {
            parsed += 1;
            probe(&t, &mut rng);
        }
    }
    // Random bytes in every position of the first 64 header bytes.
    for i in 0..64.min(size) {
        for v in [0u8, 0xff, 0x7f, 0x80] {
            let mut elf = orig.clone();
            elf[off + i] = v;
            if let Some(t) = GoTable::parse(&elf) {
                probe(&t, &mut rng);
            }
        }
    }
    // Not Go / not ELF / empty.
    assert!(GoTable::parse(&[]).is_none());
    assert!(GoTable::parse(&orig[..64]).is_none());
    assert!(GoTable::parse(b"\x7fELF garbage").is_none());
    println!("garbled: {rounds} mutated binaries, {parsed} still parsed; no panics");
}

/// With the section headers gone entirely (sstrip-like), the table is found
/// by scanning the loadable segments.
#[test]
fn no_section_headers() {
    let Some(b) = built() else { return };
    let mut elf = read(&b.stripped);
    // ELF64: e_shoff @0x28 (8 bytes), e_shnum @0x3c, e_shstrndx @0x3e.
    elf[0x28..0x30].fill(0);
    elf[0x3c..0x40].fill(0);
    let t = GoTable::parse(&elf).expect("found by segment scan");
    let ref_t = GoTable::parse(&read(&b.stripped)).expect("parse");
    let (lo, hi) = ref_t.text_range().expect("range");
    let mut rng = Rng(99);
    for _ in 0..500 {
        let pc = lo + rng.below(hi - lo);
        assert_eq!(t.lookup(pc), ref_t.lookup(pc));
    }
    assert_eq!(t.has_inline_info(), ref_t.has_inline_info());
}

fn go_tool_dir(go: &Path) -> Option<PathBuf> {
    let o = std::process::Command::new(go)
        .args(["env", "GOTOOLDIR"])
        .output()
        .ok()?;
    let s = String::from_utf8(o.stdout).ok()?;
    Some(PathBuf::from(s.trim()))
}

/// Go binaries nobody here wrote: Go toolchain binaries and whatever else
/// is installed. Truth: `go tool addr2line` where the local Go can read the
/// table (<= 1.19 formats), else .symtab + DWARF, else plausibility.
#[test]
fn foreign_go_binaries() {
    let go = go();
    let mut bins: Vec<PathBuf> = Vec::new();
    if let Some(dir) = go.as_deref().and_then(go_tool_dir) {
        for t in ["compile", "link", "addr2line", "vet", "pprof"] {
            bins.push(dir.join(t));
        }
    }
    // Extra binaries, e.g. old Go builds (none of <= 1.17 ship here):
    // GOSYM_EXTRA_BINARIES=/path/a:/path/b
    if let Some(extra) = std::env::var_os("GOSYM_EXTRA_BINARIES") {
        bins.extend(std::env::split_paths(&extra));
    }
    for p in [
        "/usr/bin/prometheus",
        "/usr/local/bin/docker",
        "/usr/local/bin/terraform",
        "/usr/lib/google-cloud-sdk/bin/kubectl.1.27",
        "/usr/lib/google-cloud-sdk/bin/gke-gcloud-auth-plugin",
        "/usr/lib/google-cloud-sdk/bin/cloud_spanner_emulator/gateway_main",
        "/usr/lib/google-cloud-sdk/bin/local-extract",
    ] {
        bins.push(PathBuf::from(p));
    }
    let bins: Vec<_> = bins.into_iter().filter(|p| p.exists()).collect();
    if bins.is_empty() {
        println!("SKIP: no foreign Go binaries on this machine");
        return;
    }
    let (mut total, mut total_ok) = (0usize, 0usize);
    for bin in &bins {
        let bytes = read(bin);
        let t0 = Instant::now();
        let Some(t) = GoTable::parse(&bytes) else {
            panic!("{}: no usable pclntab", bin.display());
        };
        let parse_ms = t0.elapsed().as_secs_f64() * 1e3;
        let (lo, hi) = t.text_range().expect("range");
        let entries: Vec<u64> = t.functions().map(|(e, _)| e).collect();
        let mut rng = Rng(0xabc);
        let mut pcs: Vec<u64> = (0..1500)
            .map(|k| entries[k * entries.len() / 1500])
            .collect();
        pcs.extend((0..1500).map(|_| lo + rng.below(hi - lo)));
        let syms = symtab_funcs(&bytes);
        let go_readable = matches!(t.format(), "1.16-1.17" | "1.18-1.19" | "1.2-1.15");
        let label = match bin.file_name().and_then(|n| n.to_str()) {
            Some(n) if n != "esbuild" => n.to_string(),
            _ => bin.display().to_string(), // generic names: keep the path
        };
        let (n, ok, how) = if let (true, Some(go)) = (go_readable, go.as_deref()) {
            let skew = addr2line_text_skew(&bytes);
            if skew != 0 {
                println!(
                    "  note: {label}: header textStart is .text+{skew:#x}; shifting go tool addr2line queries (it assumes .text start)"
                );
            }
            let shifted: Vec<u64> = pcs.iter().map(|p| p - skew).collect();
            let truth = go_addr2line(go, bin, &shifted).expect("go tool addr2line");
            let mut ok = 0;
            let mut shown = 0;
            for (pc, tr) in pcs.iter().zip(&truth) {
                let g = t.lookup(*pc);
                let good = g.as_ref().is_some_and(|g| {
                    // addr2line prints ":0" where the pc has no line entry
                    // (padding after a function's last instruction).
                    let file_ok = match g.file.as_deref() {
                        Some(f) => f == tr.file,
                        None => tr.file.is_empty() || tr.file == "?",
                    };
                    g.name == tr.name && file_ok && g.line.unwrap_or(0) == tr.line
                });
                if good {
                    ok += 1;
                } else if shown < 5 {
                    shown += 1;
                    println!(
                        "  MISMATCH {label} {pc:#x}: {g:?} vs {} {}:{}",
                        tr.name, tr.file, tr.line
                    );
                }
            }
            // addr2line has no inline output: check inline frames for sanity.
            let (mut inl, mut inl_ok) = (0, 0);
            for pc in &pcs {
                for f in t.lookup(*pc).map(|g| g.inlined).unwrap_or_default() {
                    inl += 1;
                    inl_ok += usize::from(
                        !f.name.is_empty()
                            && f.call_line.is_some_and(|l| l > 0)
                            && f.call_file.is_some(),
                    );
                }
            }
            if inl > 0 {
                println!("  {label}: {inl_ok}/{inl} inline frames have a name and call site");
            }
            (pcs.len(), ok, "go tool addr2line")
        } else if !syms.is_empty() {
            // Names from .symtab; lines from DWARF if present.
            let in_go: Vec<u64> = pcs
                .iter()
                .copied()
                .filter(|&pc| sym_at(&syms, pc).is_some())
                .collect();
            let dwarf = if have_llvm_symbolizer()
                && (has_section(&bytes, ".debug_line") || has_section(&bytes, ".zdebug_line"))
            {
                llvm_symbolize(bin, &in_go, false)
            } else {
                None
            };
            let mut ok = 0;
            let mut shown = 0;
            for (k, pc) in in_go.iter().enumerate() {
                let g = t.lookup(*pc);
                let sym = sym_at(&syms, *pc).unwrap_or("?");
                let name_ok = g
                    .as_ref()
                    .is_some_and(|g| symtab_name_matches(&g.name, sym));
                let line_ok = match dwarf
                    .as_ref()
                    .and_then(|d| d.get(k))
                    .and_then(|f| f.first())
                {
                    Some((_, file, line)) => g.as_ref().is_some_and(|g| {
                        dwarf_agrees(g.file.as_deref(), g.line, file, *line) != Some(false)
                    }),
                    None => true,
                };
                if name_ok && line_ok {
                    ok += 1;
                } else if shown < 15 {
                    shown += 1;
                    println!(
                        "  MISMATCH {label} {pc:#x}: {g:?} vs {sym} {:?}",
                        dwarf.as_ref().and_then(|d| d.get(k))
                    );
                }
            }
            let inl = dwarf
                .as_ref()
                .and_then(|_| inline_vs_dwarf(&t, bin, &in_go, &label));
            if let Some((n, names_ok, _, _)) = inl {
                assert!(
                    names_ok * 100 >= n * 99,
                    "{label}: inline names agree for >= 99%"
                );
            }
            (
                in_go.len(),
                ok,
                if dwarf.is_some() {
                    ".symtab + DWARF (llvm-symbolizer)"
                } else {
                    ".symtab names only"
                },
            )
        } else {
            // Stripped and newer than the local Go: plausibility only.
            let mut ok = 0;
            let mut shown = 0;
            for pc in &pcs {
                let g = t.lookup(*pc);
                // No position is fine only in INT3 padding after a function.
                let padding = code_byte(&bytes, *pc) == Some(0xcc);
                let good = g.as_ref().is_some_and(|g| {
                    !g.name.is_empty()
                        && g.name.chars().all(|c| !c.is_control())
                        && g.func_start <= *pc
                        && (g.file.as_deref().is_some_and(|f| {
                            f.ends_with(".go") || f.ends_with(".s") || f == "<autogenerated>"
                        }) && g.line.is_some()
                            || padding && g.file.is_none() && g.line.is_none())
                });
                if good {
                    ok += 1;
                } else if shown < 5 {
                    shown += 1;
                    println!("  IMPLAUSIBLE {label} {pc:#x}: {g:?}");
                }
            }
            (
                pcs.len(),
                ok,
                "plausibility: name, .go/.s file and line, or none in INT3 padding",
            )
        };
        let named = ["runtime.main", "main.main"]
            .iter()
            .all(|want| t.functions().any(|(_, n)| n == *want));
        println!(
            "{label}: Go {} nfunc={} inline={} parse={parse_ms:.1}ms: {ok}/{n} agree [{how}]{}",
            t.format(),
            t.func_count(),
            t.has_inline_info(),
            if named {
                ""
            } else {
                " (runtime.main/main.main missing!)"
            }
        );
        assert!(named);
        total += n;
        total_ok += ok;
        assert!(ok * 100 >= n * 99, "{label}: at least 99% agree");
    }
    println!("foreign total: {total_ok}/{total} pcs agree");
}

/// Parse and lookup cost on a big binary (printed; not asserted beyond sanity).
#[test]
fn timings() {
    let mut bins: Vec<PathBuf> = Vec::new();
    if let Some(dir) = go().as_deref().and_then(go_tool_dir) {
        bins.push(dir.join("compile"));
    }
    bins.push("/usr/local/bin/terraform".into());
    for bin in bins.into_iter().filter(|p| p.exists()) {
        let bytes = read(&bin);
        let t0 = Instant::now();
        let t = GoTable::parse(&bytes).expect("parse");
        let parse = t0.elapsed();
        let (lo, hi) = t.text_range().expect("range");
        let mut rng = Rng(42);
        let pcs: Vec<u64> = (0..200_000).map(|_| lo + rng.below(hi - lo)).collect();
        let t1 = Instant::now();
        let mut found = 0usize;
        for &pc in &pcs {
            if let Some(g) = t.lookup(pc) {
                found += g.line.is_some() as usize + g.inlined.len();
            }
        }
        let per = t1.elapsed().as_nanos() as f64 / pcs.len() as f64;
        let t2 = Instant::now();
        for &pc in &pcs {
            found += t.function_at(pc).map_or(0, |f| f.1.len());
        }
        let per_name = t2.elapsed().as_nanos() as f64 / pcs.len() as f64;
        for &pc in pcs.iter().step_by(97) {
            let (start, name) = t.function_at(pc).expect("in range");
            let g = t.lookup(pc).expect("in range");
            assert_eq!((start, name), (g.func_start, g.name));
        }
        println!(
            "timing {}: {:.1} MB, nfunc={}, parse {:.2} ms, lookup {:.0} ns/pc (name+file+line+inline), function_at {:.0} ns/pc ({} random pcs, {})",
            bin.display(),
            bytes.len() as f64 / 1e6,
            t.func_count(),
            parse.as_secs_f64() * 1e3,
            per,
            per_name,
            pcs.len(),
            if cfg!(debug_assertions) {
                "test profile"
            } else {
                "release"
            }
        );
        assert!(found > 0);
    }
}

/// Non-Go ELF files are rejected, and quickly (a profiler tries every
/// mapped binary).
#[test]
fn non_go_binaries_rejected() {
    let mut n = 0;
    for p in [
        "/bin/sh",
        "/usr/bin/bash",
        "/usr/lib/x86_64-linux-gnu/libc.so.6",
        "/usr/bin/perf",
    ] {
        let Ok(bytes) = std::fs::read(p) else {
            continue;
        };
        let t0 = Instant::now();
        assert!(GoTable::parse(&bytes).is_none(), "{p} is not Go");
        println!(
            "{p}: rejected in {:.2} ms",
            t0.elapsed().as_secs_f64() * 1e3
        );
        n += 1;
    }
    if n == 0 {
        println!("SKIP: no non-Go ELF files found");
    }
}
