//! Property tests of the parsers that read user input or files: whatever
//! the input, no panic, and an error is one line that maps to exit status 2;
//! for valid input, the parse means what was written.
//!
//! Generators are grammar-aware (mostly valid input, then mutated) so that
//! cases reach deep into each parser instead of failing at the first byte.

use proptest::prelude::*;

use crate::filter::parse::{self, CmpOp, Expr, Literal};

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// An error message a user sees: one line.
fn one_line(msg: &str) -> Result<(), TestCaseError> {
    prop_assert!(!msg.contains('\n'), "multi-line error: {msg:?}");
    prop_assert!(!msg.is_empty());
    Ok(())
}

// ---- filter expressions ----

fn arb_name() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("pid".to_string()),
        Just("comm".to_string()),
        Just("count".to_string()),
        Just("args.pid".to_string()),
        // Words that start statements name no value in the language.
        "[a-z_][a-z0-9_]{0,6}".prop_filter("a keyword", |n| !matches!(
            n.as_str(),
            "if" | "else" | "unroll" | "while" | "return" | "break" | "continue" | "let" | "for"
        )),
    ]
}

fn arb_op() -> impl Strategy<Value = CmpOp> {
    prop_oneof![
        Just(CmpOp::Eq),
        Just(CmpOp::Ne),
        Just(CmpOp::Lt),
        Just(CmpOp::Le),
        Just(CmpOp::Gt),
        Just(CmpOp::Ge),
    ]
}

fn arb_literal() -> impl Strategy<Value = Literal> {
    prop_oneof![
        (-1_000_000i128..1_000_000).prop_map(Literal::Int),
        Just(Literal::Int(u64::MAX as i128)),
        Just(Literal::Int(i64::MIN as i128)),
        "[a-z*?. ]{0,8}".prop_map(Literal::Str),
    ]
}

fn arb_expr() -> impl Strategy<Value = Expr> {
    let leaf = prop_oneof![
        4 => (arb_name(), arb_op(), arb_literal()).prop_map(|(name, op, value)| Expr::Cmp {
            name,
            column: 0,
            op,
            value,
        }),
        1 => arb_name().prop_map(|name| Expr::Truthy { name, column: 0 }),
    ];
    leaf.prop_recursive(5, 32, 2, |inner| {
        prop_oneof![
            inner.clone().prop_map(|e| Expr::Not(Box::new(e))),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| Expr::And(Box::new(a), Box::new(b))),
            (inner.clone(), inner).prop_map(|(a, b)| Expr::Or(Box::new(a), Box::new(b))),
        ]
    })
}

fn lit(l: &Literal) -> String {
    match l {
        Literal::Int(i) => i.to_string(),
        Literal::Str(s) => format!("{s:?}"),
    }
}

/// Prints with as few parentheses as the precedence (! over && over ||,
/// both left-associative) allows: a parser with the wrong precedence or
/// associativity reads it back as another tree.
fn print(e: &Expr, parent: u8) -> String {
    let (prec, s) = match e {
        Expr::Cmp {
            name, op, value, ..
        } => (3, format!("{name} {op} {}", lit(value))),
        Expr::Truthy { name, .. } => (3, name.clone()),
        // `!` binds tighter than a comparison, as in C: `!(pid == 1)`.
        Expr::Not(x) => (3, format!("!{}", print(x, 4))),
        Expr::And(a, b) => (2, format!("{} && {}", print(a, 2), print(b, 3))),
        Expr::Or(a, b) => (1, format!("{} || {}", print(a, 1), print(b, 2))),
    };
    if prec < parent {
        format!("({s})")
    } else {
        s
    }
}

/// The tree without source columns, for comparing.
fn strip(e: &Expr) -> Expr {
    match e {
        Expr::Cmp {
            name, op, value, ..
        } => Expr::Cmp {
            name: name.clone(),
            column: 0,
            op: *op,
            value: value.clone(),
        },
        Expr::Truthy { name, .. } => Expr::Truthy {
            name: name.clone(),
            column: 0,
        },
        Expr::Not(x) => Expr::Not(Box::new(strip(x))),
        Expr::And(a, b) => Expr::And(Box::new(strip(a)), Box::new(strip(b))),
        Expr::Or(a, b) => Expr::Or(Box::new(strip(a)), Box::new(strip(b))),
    }
}

/// Mutations that keep most of a valid input: a byte dropped, doubled or
/// replaced by one of the grammar's own characters.
fn mutate(s: &str, at: usize, kind: u8, with: char) -> String {
    let chars: Vec<char> = s.chars().collect();
    if chars.is_empty() {
        return with.to_string();
    }
    let i = at % chars.len();
    let mut out: Vec<char> = chars.clone();
    match kind % 3 {
        0 => {
            out.remove(i);
        }
        1 => out.insert(i, chars[i]),
        _ => out[i] = with,
    }
    out.into_iter().collect()
}

fn grammar_char() -> impl Strategy<Value = char> {
    prop::sample::select(vec![
        '(', ')', '!', '&', '|', '=', '<', '>', '"', '\\', ' ', '1', '-', 'x', '*', '.', 'é', '\0',
    ])
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn filter_prints_and_parses_back_to_the_same_tree(e in arb_expr()) {
        let text = print(&e, 0);
        let parsed = parse::parse(&text).map_err(|err| TestCaseError::fail(format!("{text:?}: {err}")))?;
        prop_assert_eq!(strip(&parsed), strip(&e), "{}", text);
    }

    #[test]
    fn mutated_filters_never_panic_and_fail_in_one_line(
        e in arb_expr(), at in any::<usize>(), kind in any::<u8>(), with in grammar_char()
    ) {
        let text = mutate(&print(&e, 0), at, kind, with);
        if let Err(err) = parse::parse(&text) {
            one_line(&err.to_string())?;
            // The column points into the text (or just past its end).
            prop_assert!(err.column >= 1 && err.column <= text.chars().count() + 1, "{text:?}: {err}");
        }
    }

    #[test]
    fn arbitrary_filter_text_never_panics(text in any::<String>()) {
        if let Err(err) = parse::parse(&text) {
            one_line(&err.to_string())?;
        }
    }
}

// ---- probe specs and globs ----

fn arb_spec() -> impl Strategy<Value = String> {
    let kind = prop::sample::select(vec![
        "tracepoint",
        "t",
        "uprobe",
        "u",
        "uretprobe",
        "ur",
        "usdt",
        "U",
        "kprobe",
        "k",
        "kretprobe",
        "kr",
        "fentry",
        "f",
        "fexit",
        "fr",
        "bogus",
        "",
    ]);
    let part = "[a-z_*?/.+0-9x]{0,10}";
    (kind, prop::collection::vec(part, 0..5)).prop_map(|(k, parts)| {
        let mut s = k.to_string();
        for p in parts {
            s.push(':');
            s.push_str(&p);
        }
        s
    })
}

/// A reference glob matcher: `*` any run, `?` any one character.
fn glob_ref(p: &[char], s: &[char]) -> bool {
    match (p.first(), s.first()) {
        (None, None) => true,
        (None, Some(_)) => false,
        (Some('*'), _) => glob_ref(&p[1..], s) || (!s.is_empty() && glob_ref(p, &s[1..])),
        (Some('?'), Some(_)) => glob_ref(&p[1..], &s[1..]),
        (Some(a), Some(b)) if a == b => glob_ref(&p[1..], &s[1..]),
        _ => false,
    }
}

proptest! {
    #![proptest_config(config(1024))]

    #[test]
    fn probe_specs_never_panic_and_fail_in_one_line(s in arb_spec(), at in any::<usize>(), kind in any::<u8>(), with in grammar_char()) {
        for text in [s.clone(), mutate(&s, at, kind, with)] {
            if let Err(err) = crate::probe::ProbeSpec::parse(&text) {
                one_line(&err.to_string())?;
                let any = anyhow::Error::from(err);
                prop_assert_eq!(crate::error::exit_code(&any), 2);
            }
        }
    }

    #[test]
    fn globs_match_like_the_reference(p in "[ab*?]{0,8}", s in "[ab]{0,10}") {
        let (pc, sc): (Vec<char>, Vec<char>) = (p.chars().collect(), s.chars().collect());
        prop_assert_eq!(crate::probe::glob::matches(&p, &s), glob_ref(&pc, &sc), "{} vs {}", p, s);
    }
}

// ---- recordings ----

fn sample_recording() -> bpfscope_recording::Recording {
    use bpfscope_recording::{Binary, Recording, Stack};
    let mut r = Recording::default();
    r.meta.mode = "cpu".into();
    r.binaries.push(Binary {
        build_id: vec![0xab; 20],
        paths: vec!["/usr/bin/app".into()],
        ..Default::default()
    });
    for i in 0..3u32 {
        r.stacks.push(Stack {
            pid: 100 + i,
            comm: format!("app{i}"),
            count: 7 + u64::from(i),
            value: 7 + u64::from(i),
            kernel: vec![0xffff_ffff_8100_0000 + u64::from(i)],
            user_binary: vec![1, 0, 0],
            user_offset: vec![0x1234 + u64::from(i), 0x7fff_0000, 0],
            user_runtime: vec![0, 0, 1],
            thread: format!("t{i}"),
            cgroup_id: 1000 + u64::from(i),
        });
    }
    r.runtime_frames.push(bpfscope_recording::RuntimeFrame {
        kind: "python".into(),
        function: "handle".into(),
        file: "/srv/app.py".into(),
        line: 42,
    });
    r
}

#[test]
fn recordings_cut_anywhere_or_flipped_anywhere_fail_cleanly() {
    use bpfscope_recording::decode;
    let bytes = bpfscope_recording::encode(&sample_recording());
    let path = std::path::Path::new("sample.bscope");
    let back = decode(path, &bytes).expect("the whole recording reads back");
    assert_eq!(back.stacks.len(), 3);
    // Every truncation point.
    for n in 0..bytes.len() {
        if let Err(e) = decode(path, &bytes[..n]) {
            assert!(!e.to_string().contains('\n'), "cut at {n}: {e}");
        }
    }
    // Every byte, every bit.
    let mut b = bytes.clone();
    for i in 0..b.len() {
        for bit in 0..8 {
            b[i] ^= 1 << bit;
            if let Err(e) = decode(path, &b) {
                assert!(!e.to_string().contains('\n'), "flip {i}.{bit}: {e}");
            }
            b[i] ^= 1 << bit;
        }
    }
}

proptest! {
    #![proptest_config(config(256))]

    /// Length fields set to anything: the reader must check them against
    /// the file, not allocate what they claim.
    #[test]
    fn recordings_with_random_words_fail_cleanly(at in any::<usize>(), word in any::<u64>()) {
        let mut bytes = bpfscope_recording::encode(&sample_recording());
        let i = at % bytes.len().saturating_sub(8).max(1);
        bytes[i..i + 8].copy_from_slice(&word.to_le_bytes());
        if let Err(e) = bpfscope_recording::decode(std::path::Path::new("x"), &bytes) {
            one_line(&e.to_string())?;
        }
    }
}

// ---- ELF files and USDT notes ----

/// A small real ELF with a build id, symbols and a USDT note, built by cc.
fn small_elf() -> Option<Vec<u8>> {
    let dir = std::env::temp_dir().join(format!("bpfscope-props-{}", std::process::id()));
    std::fs::create_dir_all(&dir).ok()?;
    let src = dir.join("usdt.c");
    let out = dir.join("usdt");
    std::fs::write(
        &src,
        "#include <sys/sdt.h>\nint work(int x) { DTRACE_PROBE1(app, tick, x); return x + 1; }\n\
         int main(int c, char **v) { (void)v; return work(c); }\n",
    )
    .ok()?;
    let ok = std::process::Command::new("cc")
        .args(["-O1", "-g", "-Wl,--build-id", "-o"])
        .arg(&out)
        .arg(&src)
        .status()
        .ok()?
        .success();
    let bytes = if ok { std::fs::read(&out).ok() } else { None };
    let _ = std::fs::remove_dir_all(&dir);
    bytes
}

#[test]
fn hostile_elf_files_never_panic() {
    let Some(elf) = small_elf() else {
        eprintln!("SKIP hostile_elf_files_never_panic: cc with <sys/sdt.h> is not available");
        return;
    };
    let dir = std::env::temp_dir().join(format!("bpfscope-elf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("mutant");
    std::fs::write(&path, &elf).unwrap();
    let info = crate::probe::elf::read(&path).expect("the real file reads");
    assert!(
        info.usdt.iter().any(|n| n.name == "tick"),
        "the USDT note is found"
    );
    let mut runner = proptest::test_runner::TestRunner::new(config(300));
    let len = elf.len();
    runner
        .run(
            &(
                prop::collection::vec((0..len, any::<u8>()), 1..16),
                any::<bool>(),
            ),
            |(edits, headers_only)| {
                let mut b = elf.clone();
                for (at, v) in edits {
                    // Half the cases hit the headers and note area, where
                    // lengths and offsets live.
                    let at = if headers_only { at % len.min(4096) } else { at };
                    b[at] = v;
                }
                std::fs::write(&path, &b).unwrap();
                if let Err(e) = crate::probe::elf::read(&path) {
                    one_line(&e.to_string())?;
                }
                let _ = crate::probe::elf::decode(&b[..b.len().min(256)]);
                Ok(())
            },
        )
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
