// SPDX-License-Identifier: GPL-2.0
//! Test helpers: build the Go test program on demand and get ground truth
//! from tools that do not share code with the crate (ELF .symtab via
//! `object`, `go tool addr2line`, `llvm-symbolizer` on DWARF).
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use object::{Object, ObjectSection, ObjectSymbol};

pub struct Built {
    pub go: PathBuf,
    pub dir: PathBuf,
    pub plain: PathBuf,
    pub stripped: PathBuf,
    pub pie: PathBuf,
    pub pie_stripped: PathBuf,
    /// (GOARCH, plain, stripped) for other architectures: 32-bit pointers
    /// (386), pc quantum 4 (arm64), big-endian with quantum 2 (s390x),
    /// big-endian quantum 4 (ppc64).
    pub cross: Vec<(&'static str, PathBuf, PathBuf)>,
}

/// The `go` command, if usable.
pub fn go() -> Option<PathBuf> {
    let cands = [
        std::env::var_os("GO").map(PathBuf::from),
        Some(PathBuf::from("go")),
        Some("/usr/bin/go".into()),
    ];
    cands.into_iter().flatten().find(|g| {
        Command::new(g)
            .arg("version")
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    })
}

fn go_cmd(go: &Path, dir: &Path) -> Command {
    let mut c = Command::new(go);
    c.current_dir(dir.join("src"))
        .env("GOCACHE", dir.join("cache"))
        .env("GOPATH", dir.join("gopath"))
        .env("GOFLAGS", "-buildvcs=false")
        .env("GO111MODULE", "on")
        .env("GOTOOLCHAIN", "local")
        .env("CGO_ENABLED", "0");
    c
}

/// Builds tests/data/main.go four ways (plain, -s -w, PIE, PIE -s -w) into
/// the cargo target tmpdir, once per test binary. None (with a printed
/// reason) when Go is unavailable.
pub fn built() -> Option<&'static Built> {
    static B: OnceLock<Option<Built>> = OnceLock::new();
    B.get_or_init(|| {
        let Some(go) = go() else {
            println!("SKIP: no `go` command found; Go-built test binaries unavailable");
            return None;
        };
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("gosym-go");
        std::fs::create_dir_all(dir.join("src")).ok()?;
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/main.go");
        std::fs::copy(&src, dir.join("src/main.go")).ok()?;
        std::fs::write(dir.join("src/go.mod"), "module gosymtest\n\ngo 1.16\n").ok()?;
        let variants: [(&str, &[&str]); 4] = [
            ("plain", &[]),
            ("stripped", &["-ldflags=-s -w"]),
            ("pie", &["-buildmode=pie"]),
            ("pie_stripped", &["-buildmode=pie", "-ldflags=-s -w"]),
        ];
        for (name, flags) in variants {
            let out = go_cmd(&go, &dir)
                .arg("build")
                .args(flags)
                .arg("-o")
                .arg(dir.join(name))
                .arg(".")
                .output();
            match out {
                Ok(o) if o.status.success() => {}
                Ok(o) => {
                    println!(
                        "SKIP: go build {name} failed: {}",
                        String::from_utf8_lossy(&o.stderr)
                    );
                    return None;
                }
                Err(e) => {
                    println!("SKIP: go build {name}: {e}");
                    return None;
                }
            }
        }
        let mut cross = Vec::new();
        for arch in ["386", "arm64", "s390x", "ppc64"] {
            let (plain, stripped) = (
                dir.join(format!("{arch}_plain")),
                dir.join(format!("{arch}_stripped")),
            );
            let ok = [(&plain, None), (&stripped, Some("-ldflags=-s -w"))]
                .iter()
                .all(|(out, flag)| {
                    let o = go_cmd(&go, &dir)
                        .env("GOARCH", arch)
                        .arg("build")
                        .args(flag.iter())
                        .arg("-o")
                        .arg(out)
                        .arg(".")
                        .output();
                    matches!(o, Ok(o) if o.status.success())
                });
            if ok {
                cross.push((arch, plain, stripped));
            } else {
                println!("SKIP: cross build for GOARCH={arch} failed");
            }
        }
        Some(Built {
            cross,
            plain: dir.join("plain"),
            stripped: dir.join("stripped"),
            pie: dir.join("pie"),
            pie_stripped: dir.join("pie_stripped"),
            go,
            dir,
        })
    })
    .as_ref()
}

/// Function symbols (start, end, name) from .symtab, sorted by start.
pub fn symtab_funcs(elf: &[u8]) -> Vec<(u64, u64, String)> {
    let Ok(f) = object::File::parse(elf) else {
        return Vec::new();
    };
    let mut v: Vec<_> = f
        .symbols()
        .filter(|s| s.kind() == object::SymbolKind::Text && s.size() > 0)
        .filter_map(|s| {
            Some((
                s.address(),
                s.address() + s.size(),
                s.name().ok()?.to_string(),
            ))
        })
        .collect();
    v.sort();
    v.dedup_by_key(|e| e.0);
    v
}

pub fn sym_at(funcs: &[(u64, u64, String)], pc: u64) -> Option<&str> {
    let i = funcs.partition_point(|f| f.0 <= pc);
    let f = funcs.get(i.checked_sub(1)?)?;
    (pc < f.1).then_some(f.2.as_str())
}

pub fn has_section(elf: &[u8], name: &str) -> bool {
    object::File::parse(elf)
        .map(|f| f.section_by_name(name).is_some())
        .unwrap_or(false)
}

/// Deterministic PRNG (xorshift) so samples are reproducible.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
}

/// Spread `n` pcs over functions: for those `must` selects, start, middle
/// and last byte; then alternately starts and random interior pcs of
/// functions picked evenly across the list.
pub fn sample_pcs(
    funcs: &[(u64, u64, String)],
    n: usize,
    must: impl Fn(&str) -> bool,
    seed: u64,
) -> Vec<u64> {
    let mut pcs = Vec::new();
    for f in funcs.iter().filter(|f| must(&f.2)) {
        pcs.extend([f.0, f.0 + (f.1 - f.0) / 2, f.1 - 1]);
    }
    let mut rng = Rng(seed | 1);
    let left = n.saturating_sub(pcs.len());
    for k in 0..left {
        let Some(f) = funcs.get(k * funcs.len() / left.max(1)) else {
            break;
        };
        pcs.push(if k % 2 == 0 {
            f.0
        } else {
            f.0 + rng.below(f.1 - f.0)
        });
    }
    pcs
}

/// Runs a line-oriented symbolizer, feeding stdin from a thread so large
/// outputs cannot deadlock the pipe.
fn run_filter(mut cmd: Command, input: String) -> Option<Vec<String>> {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let mut stdin = child.stdin.take()?;
    let w = std::thread::spawn(move || {
        let _ = stdin.write_all(input.as_bytes());
    });
    let lines: Vec<String> = BufReader::new(child.stdout.take()?)
        .lines()
        .map_while(Result::ok)
        .collect();
    let _ = w.join();
    let _ = child.wait();
    Some(lines)
}

pub struct Truth {
    pub name: String,
    pub file: String,
    pub line: u32,
}

/// `go tool addr2line` (Go's debug/gosym): name and file:line per pc.
pub fn go_addr2line(go: &Path, bin: &Path, pcs: &[u64]) -> Option<Vec<Truth>> {
    let mut cmd = Command::new(go);
    cmd.args(["tool", "addr2line"]).arg(bin);
    let input: String = pcs.iter().map(|p| format!("0x{p:x}\n")).collect();
    let lines = run_filter(cmd, input)?;
    if lines.len() != 2 * pcs.len() {
        return None;
    }
    Some(
        lines
            .chunks(2)
            .map(|c| {
                let (file, line) = c[1].rsplit_once(':').unwrap_or((&c[1], "0"));
                Truth {
                    name: c[0].clone(),
                    file: file.to_string(),
                    line: line.parse().unwrap_or(0),
                }
            })
            .collect(),
    )
}

/// llvm-symbolizer on DWARF: per pc, the frames (function, file, line),
/// innermost first (a single frame when `inlining` is false).
pub fn llvm_symbolize(
    bin: &Path,
    pcs: &[u64],
    inlining: bool,
) -> Option<Vec<Vec<(String, String, u32)>>> {
    let mut cmd = Command::new("llvm-symbolizer");
    cmd.arg(format!("--obj={}", bin.display()))
        .arg(if inlining {
            "--inlining=true"
        } else {
            "--inlining=false"
        })
        .arg("--functions=linkage");
    let input: String = pcs.iter().map(|p| format!("0x{p:x}\n")).collect();
    let lines = run_filter(cmd, input)?;
    let mut out = Vec::new();
    let mut cur = Vec::new();
    let mut it = lines.into_iter();
    while let Some(l) = it.next() {
        if l.is_empty() {
            out.push(std::mem::take(&mut cur));
            continue;
        }
        let loc = it.next()?;
        // file:line:col
        let mut parts = loc.rsplitn(3, ':');
        let _col = parts.next();
        let line = parts.next().and_then(|s| s.parse().ok()).unwrap_or(0);
        let file = parts.next().unwrap_or("").to_string();
        cur.push((l, file, line));
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    (out.len() == pcs.len()).then_some(out)
}

pub fn have_llvm_symbolizer() -> bool {
    Command::new("llvm-symbolizer")
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// File range of a section, for the garbling test.
pub fn section_file_range(elf: &[u8], name: &str) -> Option<(usize, usize)> {
    let f = object::File::parse(elf).ok()?;
    let s = f.section_by_name(name)?;
    let (off, size) = s.file_range()?;
    Some((off as usize, size as usize))
}

/// Whether a pclntab name is the .symtab name `sym`. The linker spells
/// some names differently: assembly functions carry an ".abi0" suffix only
/// in .symtab, and Go 1.18-1.2x pclntabs elide everything from the first
/// '[' to the last ']' as "[...]" (generic instantiations, array types in
/// type..eq names); newer ones keep the full name.
pub fn symtab_name_matches(ours: &str, sym: &str) -> bool {
    let s = sym.strip_suffix(".abi0").unwrap_or(sym);
    if ours == s {
        return true;
    }
    match (s.find('['), s.rfind(']')) {
        (Some(a), Some(b)) if a < b => ours == format!("{}[...]{}", &s[..a], &s[b + 1..]),
        _ => false,
    }
}

/// For 1.18+ tables: the header's textStart minus the .text section start,
/// when the binary has no `runtime.text` symbol. Go 1.19's `go tool
/// addr2line` then assumes textStart == .text start, which is wrong for
/// externally linked binaries (C start-up code precedes Go code), so its
/// queries must be shifted by this much.
pub fn addr2line_text_skew(elf: &[u8]) -> u64 {
    let Ok(f) = object::File::parse(elf) else {
        return 0;
    };
    if f.symbols().any(|s| s.name() == Ok("runtime.text")) {
        return 0;
    }
    let (Some(tab), Some(text)) = (f.section_by_name(".gopclntab"), f.section_by_name(".text"))
    else {
        return 0;
    };
    let Ok(d) = tab.data() else { return 0 };
    if d.len() < 32
        || !(d[..4] == [0xf0, 0xff, 0xff, 0xff] || d[..4] == [0xf1, 0xff, 0xff, 0xff])
        || d[7] != 8
    {
        return 0;
    }
    let hdr_text = u64::from_le_bytes(d[24..32].try_into().unwrap_or([0; 8]));
    hdr_text.saturating_sub(text.address())
}

/// Compares our (file, line) with a DWARF row. Some(true/false) when
/// comparable; None when DWARF has no real position: Go emits line 0 (with a
/// dummy file such as "go.go") for compiler-generated wrappers, where the
/// pclntab says "<autogenerated>:1". DWARF prefixes relative names with
/// "./" ("./<autogenerated>", "./_cgo_gotypes.go"), the pclntab does not.
pub fn dwarf_agrees(
    file: Option<&str>,
    line: Option<u32>,
    dfile: &str,
    dline: u32,
) -> Option<bool> {
    if dline == 0 {
        return None;
    }
    let dfile = dfile.strip_prefix("./").unwrap_or(dfile);
    Some(file == Some(dfile) && line == Some(dline))
}

/// The code byte at `vaddr`, to recognise inter-function padding (INT3 on
/// amd64), where Go has no line information.
pub fn code_byte(elf: &[u8], vaddr: u64) -> Option<u8> {
    let f = object::File::parse(elf).ok()?;
    let s = f
        .sections()
        .find(|s| vaddr >= s.address() && vaddr < s.address() + s.size())?;
    s.data().ok()?.get((vaddr - s.address()) as usize).copied()
}
