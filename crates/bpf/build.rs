//! Builds the BPF objects into skeletons (libbpf-cargo) and the syscall
//! number table the raw_tp syscall path dispatches on, for the target's
//! architecture (x86_64 or aarch64; libbpf-cargo passes clang
//! `-D__TARGET_ARCH_x86` or `_arm64` from cargo's target).

// Allowed here: a build script fails by panicking; cargo shows the message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::env;
use std::fs;
use std::path::{Path, PathBuf};

use libbpf_cargo::SkeletonBuilder;

/// BPF objects under src/bpf/, each becoming `<name>.skel.rs` in OUT_DIR.
const OBJECTS: &[&str] = &["trace", "profile", "dispatch"];

fn main() {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR is set by cargo"));
    let clang = find_clang();
    println!("cargo:rerun-if-env-changed=BPF_CLANG");
    println!("cargo:rerun-if-changed=src/bpf");
    let arch = env::var("CARGO_CFG_TARGET_ARCH").expect("cargo sets the target architecture");
    let multiarch = match arch.as_str() {
        "x86_64" => "x86_64-linux-gnu",
        "aarch64" => "aarch64-linux-gnu",
        other => panic!("bpfscope builds for x86_64 and aarch64, not {other}"),
    };
    let uapi = uapi_dir(multiarch);
    let uapi_arg = format!("-I{}", uapi.display());

    for name in OBJECTS {
        let src = format!("src/bpf/{name}.bpf.c");
        SkeletonBuilder::new()
            .source(&src)
            .clang(&clang)
            .clang_args([
                // The target's asm/ headers (pt_regs, syscall numbers).
                uapi_arg.as_str(),
                "-Isrc/bpf",
                "-Wall",
                "-Wno-unused-function",
                "-mcpu=v3",
            ])
            .build_and_generate(out.join(format!("{name}.skel.rs")))
            .unwrap_or_else(|e| panic!("building {src} with {}: {e:#}", clang.display()));
    }

    write_syscall_table(&out, &clang, &uapi, multiarch);
}

/// The directory holding the target architecture's `asm/` uapi headers:
/// Debian's multiarch directory (linux-libc-dev), or, cross-building, the
/// cross toolchain's (linux-libc-dev-arm64-cross) or `$BPF_SYSROOT`'s.
fn uapi_dir(multiarch: &str) -> PathBuf {
    println!("cargo:rerun-if-env-changed=BPF_SYSROOT");
    let mut dirs = Vec::new();
    if let Some(root) = env::var_os("BPF_SYSROOT") {
        dirs.push(Path::new(&root).join("usr/include").join(multiarch));
    }
    dirs.push(Path::new("/usr/include").join(multiarch));
    dirs.push(Path::new("/usr").join(multiarch).join("include"));
    dirs.iter()
        .find(|d| d.join("asm/unistd.h").exists())
        .cloned()
        .unwrap_or_else(|| {
            panic!(
                "no asm/unistd.h for {multiarch} in {dirs:?}: install linux-libc-dev \
                 (cross-building: linux-libc-dev-arm64-cross, with gcc-aarch64-linux-gnu)"
            )
        })
}

/// The clang that compiles BPF: $BPF_CLANG, else the newest versioned clang, else `clang`.
fn find_clang() -> PathBuf {
    if let Some(c) = env::var_os("BPF_CLANG") {
        return PathBuf::from(c);
    }
    for v in (14..=21).rev() {
        let p = PathBuf::from(format!("/usr/bin/clang-{v}"));
        if p.exists() {
            return p;
        }
    }
    PathBuf::from("clang")
}

/// The target's syscall names and numbers, as a sorted Rust table: the
/// `__NR_*` macros of its uapi `asm/unistd.h` as the preprocessor leaves
/// them (arm64's come from asm-generic/unistd.h, some through aliases such
/// as `__NR_fcntl` -> `__NR3264_fcntl`). Syscalls newer than the headers
/// are traced through their classic tracepoints instead of the raw_tp fast
/// path.
fn write_syscall_table(out: &Path, clang: &Path, uapi: &Path, multiarch: &str) {
    let header = uapi.join("asm/unistd.h");
    println!("cargo:rerun-if-changed={}", header.display());
    let target = format!("--target={multiarch}");
    let dm = std::process::Command::new(clang)
        .args(["-E", "-dM", "-x", "c", "-nostdinc", &target])
        .arg(format!("-I{}", uapi.display()))
        // linux/ and asm-generic/ headers, shared by every architecture.
        .arg("-I/usr/include")
        .arg(&header)
        .output()
        .unwrap_or_else(|e| panic!("running {} -E -dM: {e}", clang.display()));
    assert!(
        dm.status.success(),
        "preprocessing {}: {}",
        header.display(),
        String::from_utf8_lossy(&dm.stderr)
    );
    let text = String::from_utf8_lossy(&dm.stdout).into_owned();
    let macros: HashMap<&str, &str> = text
        .lines()
        .filter_map(|l| {
            let mut it = l.splitn(3, ' ');
            (it.next()? == "#define").then_some(())?;
            Some((it.next()?, it.next()?.trim()))
        })
        .collect();
    // A value, or the name of a macro whose value it is.
    fn resolve<'a>(macros: &HashMap<&'a str, &'a str>, mut v: &'a str) -> Option<u32> {
        for _ in 0..8 {
            if let Ok(n) = v.parse() {
                return Some(n);
            }
            v = macros.get(v)?;
        }
        None
    }
    let mut table: Vec<(String, u32)> = macros
        .iter()
        .filter_map(|(name, value)| {
            let name = name.strip_prefix("__NR_")?;
            // The generic table's count and placeholder, not syscalls.
            if matches!(name, "syscalls" | "arch_specific_syscall") {
                return None;
            }
            Some((name.to_string(), resolve(&macros, value)?))
        })
        .collect();
    assert!(
        table.iter().any(|(n, _)| n == "write") && table.len() > 250,
        "{}: the syscall table came out with {} entries",
        header.display(),
        table.len()
    );
    table.sort();
    let mut rs = String::from(
        "/// (name, number), sorted by name.\npub static SYSCALLS: &[(&str, u32)] = &[\n",
    );
    for (name, nr) in &table {
        rs.push_str(&format!("    (\"{name}\", {nr}),\n"));
    }
    rs.push_str("];\n");
    fs::write(out.join("syscalls.rs"), rs).expect("writing syscalls.rs");
}
