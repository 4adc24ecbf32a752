//! Compiles the unwind table of every executable file mapped by any process
//! on this machine (unique by device and inode) and reports their sizes,
//! the compile time and, when readelf is installed, the number of rows
//! readelf prints for the same files.
//!
//!     cargo run --release -p bpfscope-unwind --example unwind_tables -- \
//!         [--dir DIR]... [--no-readelf] [--per-file]
//!
//! `--dir DIR` adds every ELF file directly in DIR (a wider sample than
//! what happens to run).

// Allowed here: an example stops at its first error.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use bpfscope_unwind::{compile, Stats, HEADER_SIZE};

struct Args {
    dirs: Vec<PathBuf>,
    readelf: bool,
    per_file: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        dirs: Vec::new(),
        readelf: true,
        per_file: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--dir" => a
                .dirs
                .push(it.next().ok_or("--dir needs a directory")?.into()),
            "--no-readelf" => a.readelf = false,
            "--per-file" => a.per_file = true,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(a)
}

/// Executable file mappings of every process: (dev, inode) -> a path to
/// open (through map_files, which works across mount namespaces and for
/// deleted files, else the mapped path).
fn mapped_files() -> BTreeMap<(String, u64), (PathBuf, String)> {
    let mut out = BTreeMap::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return out;
    };
    for p in procs.flatten() {
        let pid = p.file_name();
        let Some(pid) = pid
            .to_str()
            .filter(|s| s.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else {
            continue;
        };
        for line in maps.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            // Files only: not anonymous memory (memfd: and the like).
            if f.len() < 6
                || !f[1].contains('x')
                || !f[5].starts_with('/')
                || f[5].starts_with("/memfd:")
            {
                continue;
            }
            let Ok(inode) = f[4].parse::<u64>() else {
                continue;
            };
            if inode == 0 {
                continue;
            }
            let name = f[5..].join(" ");
            out.entry((f[3].to_string(), inode)).or_insert_with(|| {
                let via = PathBuf::from(format!("/proc/{pid}/map_files/{}", f[0]));
                let path = if std::fs::metadata(&via).is_ok() {
                    via
                } else {
                    PathBuf::from(&name)
                };
                (path, name)
            });
        }
    }
    out
}

fn is_elf(p: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 4];
    std::fs::File::open(p)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok()
        && magic == *b"\x7fELF"
}

fn dir_files(dir: &Path, seen: &mut HashSet<(u64, u64)>) -> Vec<(PathBuf, String)> {
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    let mut paths: Vec<PathBuf> = rd.flatten().map(|e| e.path()).collect();
    paths.sort();
    for p in paths {
        let Ok(m) = std::fs::metadata(&p) else {
            continue;
        };
        if m.is_file() && seen.insert((m.dev(), m.ino())) && is_elf(&p) {
            let name = p.display().to_string();
            out.push((p, name));
        }
    }
    out
}

/// Rows in the FDE tables readelf prints (CIE initial rows left out).
fn readelf_rows(path: &Path) -> Option<u64> {
    let out = Command::new("readelf")
        .arg("--debug-dump=frames-interp")
        .arg(path)
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut in_fde = false;
    let mut rows = 0;
    for line in text.lines() {
        let mut w = line.split_whitespace();
        let first = w.next().unwrap_or("");
        if line.contains(" FDE cie=") {
            in_fde = true;
        } else if line.contains(" CIE") && !line.starts_with(' ') {
            in_fde = false;
        } else if in_fde
            && first.len() == 16
            && first.bytes().all(|b| b.is_ascii_hexdigit())
            && w.next().is_some()
        {
            rows += 1;
        }
    }
    Some(rows)
}

struct One {
    name: String,
    stats: Stats,
    time: Duration,
    readelf_rows: Option<u64>,
}

fn human(b: u64) -> String {
    if b >= 1 << 20 {
        format!("{:.1} MiB", b as f64 / f64::from(1 << 20))
    } else if b >= 1 << 10 {
        format!("{:.1} KiB", b as f64 / 1024.0)
    } else {
        format!("{b} B")
    }
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("unwind_tables: {e}");
            return ExitCode::from(2);
        }
    };
    let mapped = mapped_files();
    let mut files: Vec<(PathBuf, String)> = mapped.into_values().collect();
    let mapped_count = files.len();
    let mut seen = HashSet::new();
    {
        use std::os::unix::fs::MetadataExt;
        for (p, _) in &files {
            if let Ok(m) = std::fs::metadata(p) {
                seen.insert((m.dev(), m.ino()));
            }
        }
    }
    for d in &args.dirs {
        files.extend(dir_files(d, &mut seen));
    }
    let readelf = args.readelf
        && Command::new("readelf")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());

    let mut done: Vec<One> = Vec::new();
    let mut errors: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let started = Instant::now();
    let mut compile_time = Duration::ZERO;
    for (path, name) in &files {
        let t0 = Instant::now();
        let r = compile(path);
        let dt = t0.elapsed();
        compile_time += dt;
        match r {
            Ok(t) => done.push(One {
                name: name.clone(),
                stats: t.stats().clone(),
                time: dt,
                readelf_rows: if readelf { readelf_rows(path) } else { None },
            }),
            Err(e) => {
                let kind = format!("{e:?}");
                let kind = kind.split([' ', '{', '(']).next().unwrap_or("").to_string();
                errors.entry(kind).or_default().push(e.to_string());
            }
        }
    }
    let wall = started.elapsed();

    if args.per_file {
        println!(
            "{:>9} {:>9} {:>9} {:>10} {:>6} {:>8} {:>6}  file",
            "rows", "readelf", "entries", "bytes", "rules", "unsupp", "ms"
        );
        for o in &done {
            let s = &o.stats;
            println!(
                "{:>9} {:>9} {:>9} {:>10} {:>6} {:>8} {:>6.1}  {}",
                s.rows,
                o.readelf_rows.map_or("-".to_string(), |r| r.to_string()),
                s.entries,
                s.bytes,
                s.distinct_rules,
                s.unsupported_ranges,
                o.time.as_secs_f64() * 1e3,
                o.name
            );
        }
        println!();
    }

    let sum = |f: &dyn Fn(&Stats) -> u64| done.iter().map(|o| f(&o.stats)).sum::<u64>();
    let entries = sum(&|s| s.entries as u64);
    let bytes = sum(&|s| s.bytes as u64);
    let rows = sum(&|s| s.rows as u64);
    let gaps = sum(&|s| s.gap_entries as u64);
    let fdes = sum(&|s| s.fdes as u64);
    let rules = sum(&|s| s.distinct_rules as u64);
    let mut per_file: Vec<u64> = done.iter().map(|o| o.stats.bytes as u64).collect();
    per_file.sort_unstable();
    let median = per_file.get(per_file.len() / 2).copied().unwrap_or(0);
    let max = done.iter().max_by_key(|o| o.stats.bytes);
    let slowest = done.iter().max_by_key(|o| o.time);

    println!(
        "files: {} ({} mapped executable files, unique by device+inode{}); compiled {}, failed {}",
        files.len(),
        mapped_count,
        if args.dirs.is_empty() {
            String::new()
        } else {
            format!(", + files of {}", args.dirs.len())
        },
        done.len(),
        errors.values().map(Vec::len).sum::<usize>()
    );
    for (kind, list) in &errors {
        println!("  {kind}: {} (e.g. {})", list.len(), list[0]);
    }
    println!(
        "FDEs: {fdes}; CFI rows: {rows}; entries: {entries} ({gaps} gaps, {} without)",
        entries - gaps
    );
    println!(
        "bytes: {} total ({} B; a table is {} bytes of header + 8 per entry); per file median {}, max {}{}",
        human(bytes),
        bytes,
        HEADER_SIZE,
        human(median),
        max.map_or("-".into(), |o| human(o.stats.bytes as u64)),
        max.map_or(String::new(), |o| format!(" ({})", o.name)),
    );
    println!(
        "compile time: {:.2} s total ({:.2} s wall with readelf), slowest {:.1} ms{}",
        compile_time.as_secs_f64(),
        wall.as_secs_f64(),
        slowest.map_or(0.0, |o| o.time.as_secs_f64() * 1e3),
        slowest.map_or(String::new(), |o| format!(" ({})", o.name)),
    );
    if rows > 0 {
        println!(
            "entries / CFI rows: {:.3} (merging identical neighbours, adding a gap after each function not followed by another)",
            entries as f64 / rows as f64
        );
    }
    let with_readelf: Vec<&One> = done.iter().filter(|o| o.readelf_rows.is_some()).collect();
    if !with_readelf.is_empty() {
        let r: u64 = with_readelf.iter().filter_map(|o| o.readelf_rows).sum();
        let e: u64 = with_readelf.iter().map(|o| o.stats.entries as u64).sum();
        println!(
            "readelf rows: {r} over {} files; entries / readelf rows: {:.3}",
            with_readelf.len(),
            e as f64 / r.max(1) as f64
        );
    }
    // The alternative layout: 6-byte entries (u32 address + u16 rule index)
    // and a per-file table of distinct 4-byte rule words.
    let dedup: u64 = done
        .iter()
        .map(|o| {
            let s = &o.stats;
            (HEADER_SIZE + 6 * s.entries + 4 * s.distinct_rules) as u64
        })
        .sum();
    println!(
        "rule dedup alternative: {} distinct rules in all ({} per file on average); 6-byte entries + rule table = {} ({:.1}% of the inline layout), but 8 bytes again once each entry is its own array map element",
        rules,
        rules / (done.len().max(1) as u64),
        human(dedup),
        100.0 * dedup as f64 / bytes.max(1) as f64
    );
    let u = |f: &dyn Fn(&Stats) -> usize| done.iter().map(|o| f(&o.stats)).sum::<usize>();
    println!(
        "unsupported: {} ranges covering {} of code in {} files; rows by reason: CFA expression {}, CFA register {}, CFA offset {}, return address {}, CFI gimli refuses {}; RBP rule dropped in {} rows",
        u(&|s| s.unsupported_ranges),
        human(sum(&|s| s.unsupported_bytes)),
        done.iter().filter(|o| o.stats.unsupported_ranges > 0).count(),
        u(&|s| s.unsupported.cfa_expression),
        u(&|s| s.unsupported.cfa_register),
        u(&|s| s.unsupported.cfa_offset),
        u(&|s| s.unsupported.return_address),
        u(&|s| s.unsupported.invalid_cfi),
        u(&|s| s.rbp_dropped_rows),
    );
    println!(
        "special rows: PLT {}, signal frames {} (FDEs {}), CFA=RBP {}, deref {}, register {}; synthesized PLT stubs {}; FDEs outside code {}, overlapping rows {}, FDE errors {}",
        u(&|s| s.plt_rows),
        u(&|s| s.sigcontext_rows),
        u(&|s| s.signal_fdes),
        u(&|s| s.rbp_cfa_rows),
        u(&|s| s.deref_rows),
        u(&|s| s.register_rows),
        u(&|s| s.synthesized_plt),
        u(&|s| s.fdes_outside_code),
        u(&|s| s.overlaps),
        u(&|s| s.fde_errors),
    );
    ExitCode::SUCCESS
}
