//! Golden files of the compiler's output: each script under
//! tests/golden/run/NAME.bt is compiled (BEGIN, END and interval probes
//! only, so nothing of this machine's kernel is read and no root is
//! needed) and its listing (`disasm`) compared with NAME.insns. A change
//! to code generation shows here as a diff of instructions; `BLESS=1`
//! rewrites the files after the change has been read.

use super::*;

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/run");

fn listing_of(src: &str) -> String {
    let opts = Options {
        params: vec!["3".into(), "hello".into()],
        pid: None,
        keys_max: 4096,
        allow_unsafe: false,
    };
    match compile(src, &opts, &Features::default()) {
        Ok(c) => disasm::listing(&c.lowered),
        Err(e) => format!("error: {e}\n"),
    }
}

/// Compares, for each NAME.bt in `dir` (at least `min` of them), the
/// listing `listing(name, source)` makes with NAME.`ext`; `BLESS=1`
/// rewrites the files. Every difference is shown at once.
pub(crate) fn check_dir(dir: &str, ext: &str, min: usize, listing: impl Fn(&str, &str) -> String) {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            name.strip_suffix(".bt").map(str::to_string)
        })
        .collect();
    names.sort();
    assert!(names.len() >= min, "golden scripts in {dir}: {names:?}");
    let mut differ = Vec::new();
    for name in &names {
        let src = std::fs::read_to_string(format!("{dir}/{name}.bt")).unwrap();
        let got = listing(name, &src);
        let path = format!("{dir}/{name}.{ext}");
        if std::env::var_os("BLESS").is_some() {
            std::fs::write(&path, &got).unwrap();
        }
        let want = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{path}: {e} (BLESS=1 writes it)"));
        if want != got {
            differ.push(format!("--- {path}\n{want}\n+++ generated\n{got}"));
        }
    }
    assert!(differ.is_empty(), "{}", differ.join("\n"));
}

#[test]
fn listings_match_the_golden_files() {
    check_dir(DIR, "insns", 5, |name, src| {
        let got = listing_of(src);
        assert!(!got.starts_with("error:"), "{name}.bt: {got}");
        got
    });
}

#[test]
fn the_types_pass_reaches_a_fixed_point() {
    // @y is typed from @x, which only the last probe writes: one pass
    // of the old two-run scheme left @y untyped where the first probe
    // reads it.
    let src = "interval:ms:1 { printf(\"%s\\n\", @y); } interval:ms:2 { @y = @x; } interval:ms:3 { @x = comm; }";
    let l = listing_of(src);
    assert!(l.contains("map#1 @y [] Plain(Str)"), "{l}");
    assert!(l.contains("map#0 @x [] Plain(Str)"), "{l}");
}
