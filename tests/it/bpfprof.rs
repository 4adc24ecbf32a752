//! BPF programs in profiles (run as root): a program loaded, made hot and
//! unloaded in the middle of a recording is named by tag and name, and
//! annotated by source line from the recording after it is gone.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::common::*;

fn tmp(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name)
}

/// (id, tag) of the programs a process holds, from its fdinfo and `bpf list`.
fn progs_of(pid: i32) -> Vec<(u64, String, String)> {
    let ids = prog_ids_of(pid);
    let list = ok(&run(&["bpf", "list", "--json"]));
    json_lines(&list)
        .into_iter()
        .filter(|v| ids.contains(&v["id"].as_u64().unwrap()))
        .map(|v| {
            (
                v["id"].as_u64().unwrap(),
                v["tag"].as_str().unwrap().to_string(),
                v["name"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
#[ignore = "needs root and BPF"]
fn program_loaded_and_unloaded_mid_profile_is_named_and_annotated() {
    require_root();
    let rec = tmp("bpfprof.bscope");
    let _ = std::fs::remove_file(&rec);
    let recorder = start(&[
        "record",
        "-F",
        "499",
        "--duration",
        "5",
        "-o",
        rec.to_str().unwrap(),
    ]);
    // A program that does not exist when recording starts...
    let counter = start(&[
        "count",
        "tracepoint:syscalls:sys_enter_write",
        "--by",
        "comm",
    ]);
    let progs = progs_of(counter.pid());
    let (id, tag, name) = progs
        .iter()
        .find(|p| p.2 == "bpfscope_sysin")
        .cloned()
        .unwrap_or_else(|| panic!("the counter's program: {progs:?}"));
    // ...made hot by a million writes...
    let w = workload("writer");
    let st = Command::new(&w)
        .args(["wr_bpfprof", "1000000", "1"])
        .status()
        .unwrap();
    assert!(st.success());
    // ...and unloaded while recording goes on.
    let _ = counter.interrupt();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while Command::new("bpftool")
        .args(["prog", "show", "id", &id.to_string()])
        .output()
        .unwrap()
        .status
        .success()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "program {id} still loaded"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut recorder = recorder;
    let (_, err) = recorder.finish();
    assert!(rec.exists(), "recording written: {err}");

    // Reported after the program is gone: named by the kernel's own scheme.
    let folded = tmp("bpfprof.folded");
    ok(&run(&[
        "report",
        rec.to_str().unwrap(),
        "-o",
        folded.to_str().unwrap(),
    ]));
    let text = std::fs::read_to_string(&folded).unwrap();
    // The kernel names JIT code after the tag of the program's main
    // function, which is the program's tag (bpftool's) only when it has no
    // subprograms; trace.bpf.c has some (the filter machine's readers).
    let suffix = format!("_{name}_[k]");
    let frame_of_prog = |f: &str| f.starts_with("bpf_prog_") && f.ends_with(&suffix);
    let symbol = text
        .lines()
        .flat_map(|l| l.rsplit_once(' ').map_or(l, |x| x.0).split(';'))
        .find(|f| frame_of_prog(f))
        .unwrap_or_else(|| panic!("no frame of {name} in the profile"))
        .to_string();
    assert!(
        tag.len() == 16 && symbol.len() == "bpf_prog_".len() + 16 + suffix.len(),
        "{symbol} (tag {tag})"
    );
    let in_prog: u64 = text
        .lines()
        .filter(|l| l.contains(&symbol))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert!(in_prog >= 5, "samples in {symbol}: {in_prog}");
    // With its BTF line info, the source line shows under the program.
    assert!(
        text.lines()
            .any(|l| l.contains(&format!("{symbol};trace.bpf.c:"))),
        "source lines under {symbol}"
    );

    // Annotated per source line, from the recording alone.
    let o = run(&[
        "bpf",
        "annotate",
        "--recording",
        rec.to_str().unwrap(),
        &id.to_string(),
        "--json",
    ]);
    let lines = json_lines(&ok(&o));
    assert_eq!(lines.len(), 1, "{lines:?}");
    let a = &lines[0];
    assert_eq!(a["tag"], tag.as_str());
    assert_eq!(a["unloaded"], true);
    let total = a["total"].as_u64().unwrap();
    assert!(total >= in_prog, "{a}");
    let per_line = a["lines"].as_array().unwrap();
    let sum: u64 = per_line.iter().map(|l| l["count"].as_u64().unwrap()).sum();
    assert_eq!(sum, total);
    assert!(per_line.iter().all(|l| {
        l["file"].as_str().unwrap().ends_with("trace.bpf.c")
            && l["line"].as_u64().unwrap() > 0
            && !l["source"].as_str().unwrap().is_empty()
    }));
    // The text form: COUNT  file:LINE  source.
    let text = ok(&run(&[
        "bpf",
        "annotate",
        "--recording",
        rec.to_str().unwrap(),
        &id.to_string(),
    ]));
    assert!(
        text.starts_with(&format!("{} (id {id}", symbol.trim_end_matches("_[k]"))),
        "{text}"
    );
    assert!(text
        .lines()
        .any(|l| l.contains("trace.bpf.c:")
            && l.trim_start().chars().next().unwrap().is_ascii_digit()));
}

#[test]
fn annotate_bad_input() {
    let rec = tmp("annotate-bad.bscope");
    std::fs::write(&rec, b"not a recording").unwrap();
    let o = run(&["bpf", "annotate", "--recording", rec.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("not a bpfscope recording"));
    let o = run(&["bpf", "annotate", "--recording", "/no/such/file"]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(stderr(&o).trim_end().lines().count(), 1);
}
