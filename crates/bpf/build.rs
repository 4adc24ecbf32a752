//! Builds the BPF objects into skeletons (libbpf-cargo) and the syscall
//! number table the raw_tp syscall path dispatches on.

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

    for name in OBJECTS {
        let src = format!("src/bpf/{name}.bpf.c");
        SkeletonBuilder::new()
            .source(&src)
            .clang(&clang)
            .clang_args([
                // Debian keeps asm/ headers under the multiarch directory.
                "-I/usr/include/x86_64-linux-gnu",
                "-Isrc/bpf",
                "-Wall",
                "-Wno-unused-function",
                "-mcpu=v3",
            ])
            .build_and_generate(out.join(format!("{name}.skel.rs")))
            .unwrap_or_else(|e| panic!("building {src} with {}: {e:#}", clang.display()));
    }

    write_syscall_table(&out);
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

/// x86_64 syscall names and numbers from the system's uapi header, as a
/// sorted Rust table. Syscalls newer than the header are traced through
/// their classic tracepoints instead of the raw_tp fast path.
fn write_syscall_table(out: &Path) {
    let header = "/usr/include/x86_64-linux-gnu/asm/unistd_64.h";
    println!("cargo:rerun-if-changed={header}");
    let text = fs::read_to_string(header)
        .unwrap_or_else(|e| panic!("reading {header} (install linux-libc-dev): {e}"));
    let mut table: Vec<(String, u32)> = text
        .lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            (it.next()? == "#define").then_some(())?;
            let name = it.next()?.strip_prefix("__NR_")?;
            let nr = it.next()?.parse().ok()?;
            Some((name.to_string(), nr))
        })
        .collect();
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
