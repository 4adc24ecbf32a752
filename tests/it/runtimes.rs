//! Stacks through language runtimes, against the real kernel (as root):
//! Python frames read in the kernel from CPython's own structures, under
//! every CPython 3.9-3.13 on the machine (Debian's, a pyenv tree's); an
//! unsupported version reported, not mis-unwound; a Python process that
//! exits before the report.

use std::path::{Path, PathBuf};

use crate::common::*;

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/workloads")
        .join(name)
}

/// CPython executables by version: Debian's where it has one, else the
/// newest of that version in a pyenv tree.
fn pythons(minors: std::ops::RangeInclusive<u8>) -> Vec<(u8, PathBuf)> {
    let root = std::env::var("PYENV_ROOT").unwrap_or_else(|_| "/root/.pyenv".into());
    let mut out = Vec::new();
    for minor in minors {
        let debian = PathBuf::from(format!("/usr/bin/python3.{minor}"));
        if debian.exists() {
            out.push((minor, debian));
        }
        let mut found: Vec<PathBuf> = std::fs::read_dir(format!("{root}/versions"))
            .map(|rd| {
                rd.flatten()
                    .filter(|e| {
                        e.file_name()
                            .to_string_lossy()
                            .starts_with(&format!("3.{minor}."))
                    })
                    .map(|e| e.path().join(format!("bin/python3.{minor}")))
                    .filter(|p| p.exists())
                    .collect()
            })
            .unwrap_or_default();
        found.sort();
        out.extend(found.pop().map(|p| (minor, p)));
    }
    out
}

/// The Python frames of a folded stack (`func (file.py:LINE)`), outer first.
fn py_frames(stack: &[String], file: &str) -> Vec<String> {
    let tag = format!("({file}:");
    stack.iter().filter(|f| f.contains(&tag)).cloned().collect()
}

/// Profiles `python script args` at 499 Hz, user stacks only.
fn profile_python(
    python: &Path,
    dir: &Path,
    script: &Path,
    args: &[&str],
) -> Vec<(Vec<String>, u64)> {
    let out = dir.join(format!(
        "{}.folded",
        python.to_string_lossy().replace('/', "_")
    ));
    let mut argv = vec![
        "profile",
        "-F",
        "499",
        "--user-only",
        "-o",
        out.to_str().unwrap(),
        "--",
        python.to_str().unwrap(),
        script.to_str().unwrap(),
    ];
    argv.extend(args);
    let o = run(&argv);
    ok(&o);
    folded(&out)
}

#[test]
#[ignore = "needs root and BPF"]
fn python_split_and_lines_under_each_cpython() {
    require_root();
    let all = pythons(9..=13);
    if all.len() < 3 {
        skip(&format!(
            "fewer than three CPython 3.9-3.13 installed ({all:?}); scripts/install-deps installs Debian's"
        ));
        if all.is_empty() {
            return;
        }
    }
    let dir = scratch_dir("runtimes-split");
    let s = script("pysplit.py");
    for (minor, py) in &all {
        let lines = profile_python(py, &dir, &s, &["2"]);
        let what = format!("{} (3.{minor})", py.display());
        let total: u64 = lines.iter().map(|(_, n)| n).sum();
        let (mut heavy, mut light, mut with_py) = (0u64, 0u64, 0u64);
        for (stack, n) in &lines {
            let frames = py_frames(stack, "pysplit.py");
            if frames.is_empty() {
                continue;
            }
            with_py += n;
            // Outer first: the module, main at its call of heavy or light,
            // then that function at its call of work, then work's loop.
            assert_eq!(frames[0], "<module> (pysplit.py:29)", "{what}: {stack:?}");
            if frames.len() >= 2 {
                assert!(
                    [
                        "main (pysplit.py:23)",
                        "main (pysplit.py:24)",
                        "main (pysplit.py:25)",
                        "main (pysplit.py:26)"
                    ]
                    .contains(&frames[1].as_str()),
                    "{what}: {stack:?}"
                );
            }
            match frames.get(2).map(String::as_str) {
                Some("heavy (pysplit.py:17)") => {
                    heavy += n;
                    assert_eq!(frames[1], "main (pysplit.py:25)", "{what}: {stack:?}");
                }
                Some("light (pysplit.py:20)") => {
                    light += n;
                    assert_eq!(frames[1], "main (pysplit.py:26)", "{what}: {stack:?}");
                }
                _ => {}
            }
            if let Some(w) = frames.get(3) {
                assert!(
                    w.starts_with("work (pysplit.py:1")
                        && ["11)", "12)", "13)", "14)"].iter().any(|l| w.ends_with(l)),
                    "{what}: {stack:?}"
                );
            }
        }
        assert!(total > 500, "{what}: too few samples: {total}");
        // Every sample but interpreter start-up and exit has Python frames.
        assert!(
            with_py as f64 >= 0.9 * total as f64,
            "{what}: {with_py} of {total} samples have Python frames\n{lines:?}"
        );
        let share = heavy as f64 / (heavy + light) as f64;
        assert!(
            (0.72..=0.78).contains(&share),
            "{what}: heavy share {share:.3} (heavy {heavy}, light {light}), expected 0.75"
        );
        eprintln!("{what}: heavy share {share:.3}, {with_py}/{total} samples with Python frames");
    }
}

#[test]
#[ignore = "needs root and BPF"]
fn python_threads_each_find_their_own_frames() {
    require_root();
    let Some((_, py)) = pythons(11..=11).into_iter().next() else {
        skip("no CPython 3.11 (scripts/install-deps installs Debian's)");
        return;
    };
    let dir = scratch_dir("runtimes-threads");
    let lines = profile_python(&py, &dir, &script("pythreads.py"), &["2"]);
    let (mut red, mut blue) = (0u64, 0u64);
    for (stack, n) in &lines {
        let frames = py_frames(stack, "pythreads.py");
        let r = frames.iter().any(|f| f.starts_with("spin_red ("));
        let b = frames.iter().any(|f| f.starts_with("spin_blue ("));
        assert!(!(r && b), "one thread's stack holds both: {stack:?}");
        if r || b {
            // A thread's outermost frames are the threading module's.
            assert!(
                stack
                    .iter()
                    .any(|f| f.starts_with("Thread.run (") || f.starts_with("run (")),
                "{stack:?}"
            );
        }
        if r {
            red += n;
        }
        if b {
            blue += n;
        }
    }
    assert!(red > 300 && blue > 300, "red {red}, blue {blue}\n{lines:?}");
    let share = red as f64 / (red + blue) as f64;
    assert!((0.35..=0.65).contains(&share), "red share {share:.3}");
}

#[test]
#[ignore = "needs root and BPF"]
fn python_recording_reports_after_the_process_is_gone() {
    require_root();
    let Some((_, py)) = pythons(11..=13).into_iter().next() else {
        skip("no CPython 3.11-3.13 installed");
        return;
    };
    let dir = scratch_dir("runtimes-record");
    let rec = dir.join("py.bpfscope");
    let s = dir.join("pysplit.py");
    std::fs::copy(script("pysplit.py"), &s).unwrap();
    let o = run(&[
        "record",
        "-F",
        "499",
        "--user-only",
        "-o",
        rec.to_str().unwrap(),
        "--",
        py.to_str().unwrap(),
        s.to_str().unwrap(),
        "1",
    ]);
    ok(&o);
    // The process is gone, and so is the script: the recording names it.
    std::fs::remove_file(&s).unwrap();
    let out = dir.join("py.folded");
    let o = run(&["report", rec.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    ok(&o);
    let lines = folded(&out);
    let named = lines
        .iter()
        .filter(|(s, _)| s.iter().any(|f| f.starts_with("work (pysplit.py:")))
        .map(|(_, n)| n)
        .sum::<u64>();
    assert!(named > 200, "{named}\n{lines:?}");
}

#[test]
#[ignore = "needs root and BPF"]
fn unsupported_python_is_reported_not_misunwound() {
    require_root();
    let Some((minor, py)) = pythons(6..=8).into_iter().last() else {
        skip("no CPython before 3.9 installed (a pyenv tree has them)");
        return;
    };
    let dir = scratch_dir("runtimes-unsupported");
    let out = dir.join("old.folded");
    let s = script("pysplit.py");
    let o = run(&[
        "profile",
        "-F",
        "499",
        "--user-only",
        "-o",
        out.to_str().unwrap(),
        "--",
        py.to_str().unwrap(),
        s.to_str().unwrap(),
        "1",
    ]);
    ok(&o);
    let err = stderr(&o);
    assert!(
        err.lines().any(|l| l.starts_with("bpfscope: ")
            && l.contains(&format!("Python 3.{minor} is not supported"))),
        "{err}"
    );
    assert!(
        err.contains("1 interpreters of an unsupported version"),
        "{err}"
    );
    let lines = folded(&out);
    assert!(
        lines
            .iter()
            .all(|(s, _)| py_frames(s, "pysplit.py").is_empty()),
        "{lines:?}"
    );
    assert!(lines.iter().map(|(_, n)| n).sum::<u64>() > 200);
}
