//! Golden output of every record type, as JSON lines
//! (tests/golden/records.jsonl) and as text (tests/golden/records.txt).
//! `BLESS=1 cargo test --lib golden` rewrites both after a deliberate change;
//! a change to the JSON is a change of docs/output.md's schema.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::io::{self, Write};
use std::rc::Rc;
use std::time::Duration;

use super::printer::{self, Printer, Table};
use super::record::*;
use crate::attach::plan::Buckets;

/// A writer the test keeps a handle on (the printer owns its stderr).
#[derive(Clone, Default)]
struct Shared(Rc<RefCell<Vec<u8>>>);

impl Write for Shared {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.0.borrow_mut().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// What one case prints.
enum Case {
    Record(Record<'static>),
    Table(Table<'static>, Vec<Record<'static>>),
    Probe(ProbeEntry),
}

fn key(parts: &[(&'static str, Cell)]) -> Key<'static> {
    Key(parts.to_vec())
}

fn s(v: &str) -> String {
    v.to_string()
}

fn bucket(layout: Buckets, index: u32, count: u64) -> Bucket {
    let b = super::hist::bounds(layout, index);
    Bucket {
        low: b.low,
        high: b.high,
        count,
        index,
    }
}

fn bpf_prog(id: u32, run_cnt: u64, run_time_ns: u64) -> BpfProg {
    BpfProg {
        id,
        name: s("bpfscope_sysin"),
        tag: s("73c112966215dff7"),
        prog_type: s("raw_tracepoint"),
        attached: None,
        run_cnt,
        run_time_ns,
        avg_ns: None,
        cpu_pct: None,
    }
}

/// One or more records of every type, in the shapes they take.
fn cases() -> Vec<(&'static str, Case)> {
    let linear = Buckets::Linear {
        min: 0,
        step: 20_000_000,
        nbuckets: 1,
    };
    let stack = Cell::Frames(vec![s("work"), s("outer"), s("main")]);
    let comm = |c: &str| ("comm", Cell::Str(s(c)));
    vec![
        (
            "count table",
            Case::Table(
                Table::Aggregates {
                    keys: vec!["comm", "args.count"],
                    stats: false,
                    stacks: false,
                },
                vec![
                    Record::Count(Count {
                        key: key(&[comm("sh"), ("args.count", Cell::UInt(1))]),
                        count: 3,
                        interval: None,
                    }),
                    Record::Count(Count {
                        key: key(&[comm("bash"), ("args.count", Cell::UInt(4096))]),
                        count: 12,
                        interval: None,
                    }),
                ],
            ),
        ),
        (
            "count without keys, in an interval",
            Case::Record(Record::Count(Count {
                key: Key::default(),
                count: 0,
                interval: Some(2),
            })),
        ),
        (
            "count by stack",
            Case::Table(
                Table::Aggregates {
                    keys: vec!["ustack", "pid"],
                    stats: false,
                    stacks: true,
                },
                vec![Record::Count(Count {
                    key: key(&[("ustack", stack.clone()), ("pid", Cell::UInt(4242))]),
                    count: 5,
                    interval: None,
                })],
            ),
        ),
        (
            "stats table",
            Case::Table(
                Table::Aggregates {
                    keys: vec!["cpu"],
                    stats: true,
                    stacks: false,
                },
                vec![Record::Stats(Stats {
                    key: key(&[("cpu", Cell::UInt(0))]),
                    count: 9,
                    sum: Integer::Unsigned(8829),
                    min: Integer::Unsigned(0),
                    max: Integer::Unsigned(2996),
                    avg: 981.0,
                    interval: None,
                })],
            ),
        ),
        (
            "stats of a signed value by stack",
            Case::Record(Record::Stats(Stats {
                key: key(&[comm("uprobes"), ("ustack", stack)]),
                count: 4,
                sum: Integer::Signed(-6),
                min: Integer::Signed(-9),
                max: Integer::Signed(3),
                avg: -1.5,
                interval: Some(1),
            })),
        ),
        (
            "stats table, nothing counted",
            Case::Table(
                Table::Aggregates {
                    keys: vec![],
                    stats: true,
                    stacks: false,
                },
                vec![],
            ),
        ),
        (
            "hist, log2",
            Case::Record(Record::Hist(Hist {
                key: Key::default(),
                value: "count",
                unit: HistUnit::Count,
                buckets: vec![
                    bucket(Buckets::Log2, 2, 5),
                    bucket(Buckets::Log2, 3, 5),
                    bucket(Buckets::Log2, 10, 5),
                ],
                count: 15,
                sum: Integer::Unsigned(1515),
                interval: None,
                layout: Buckets::Log2,
            })),
        ),
        (
            "hist of a signed value, below zero",
            Case::Record(Record::Hist(Hist {
                key: key(&[comm("cat"), ("fd", Cell::Int(-1))]),
                value: "ret",
                unit: HistUnit::Count,
                buckets: vec![bucket(Buckets::Log2, 0, 2), bucket(Buckets::Log2, 1, 1)],
                count: 3,
                sum: Integer::Signed(-18),
                interval: None,
                layout: Buckets::Log2,
            })),
        ),
        (
            "latency, linear, in an interval",
            Case::Record(Record::Hist(Hist {
                key: key(&[comm("uprobes")]),
                value: "latency",
                unit: HistUnit::Ns,
                buckets: vec![bucket(linear, 1, 12), bucket(linear, 2, 4)],
                count: 16,
                sum: Integer::Unsigned(92_000_000),
                interval: Some(3),
                layout: linear,
            })),
        ),
        (
            "hist, empty",
            Case::Record(Record::Hist(Hist {
                key: Key::default(),
                value: "latency",
                unit: HistUnit::Ns,
                buckets: vec![],
                count: 0,
                sum: Integer::Unsigned(0),
                interval: None,
                layout: Buckets::Log2,
            })),
        ),
        (
            "event",
            Case::Record(Record::Event(Event {
                probe: "tracepoint:syscalls:sys_enter_openat",
                ts_ns: 1_717_883_663_435,
                pid: 25598,
                tid: 25598,
                comm: "cat",
                cpu: 1,
                fields: Fields(vec![
                    ("dfd", Some(Cell::Int(-100))),
                    ("filename", Some(Cell::Str(s("/etc/hostname")))),
                    ("flags", Some(Cell::UInt(0))),
                    ("mode", Some(Cell::UInt(0))),
                ]),
                faulted: vec![],
                truncated: vec![],
            })),
        ),
        (
            "event with a fault, a cut buffer, a pointer and a stack",
            Case::Record(Record::Event(Event {
                probe: "tracepoint:syscalls:sys_enter_write",
                ts_ns: 1_718_883_663_435,
                pid: 7,
                tid: 8,
                comm: "bufs",
                cpu: 0,
                fields: Fields(vec![
                    ("filename", None),
                    ("buf", Some(Cell::Bytes(s(r#"ab\x00"cd"#), true))),
                    ("ptr", Some(Cell::Hex(0x7ffe_1280_00a8))),
                    ("kstack", Some(Cell::Frames(vec![s("ksys_write")]))),
                ]),
                faulted: vec!["filename"],
                truncated: vec!["buf"],
            })),
        ),
        (
            "lost",
            Case::Record(Record::Lost(Lost {
                count: 20,
                what: LostWhat::Keys,
                interval: None,
            })),
        ),
        (
            "lost, in an interval",
            Case::Record(Record::Lost(Lost {
                count: 3,
                what: LostWhat::Events,
                interval: Some(4),
            })),
        ),
        (
            "unmatched",
            Case::Record(Record::Unmatched(Unmatched {
                count: 2,
                interval: None,
            })),
        ),
        (
            "bpf list",
            Case::Table(
                Table::BpfList,
                vec![
                    Record::BpfProg(BpfProg {
                        attached: Some(vec![s("raw_tp:sys_enter")]),
                        avg_ns: None,
                        ..bpf_prog(12, 0, 0)
                    }),
                    Record::BpfProg(BpfProg {
                        attached: Some(vec![]),
                        avg_ns: Some(84.6),
                        ..bpf_prog(13, 8126, 687_353)
                    }),
                ],
            ),
        ),
        (
            "bpf top",
            Case::Table(
                Table::BpfTop {
                    elapsed: Duration::from_millis(500),
                    rows: 1,
                },
                vec![
                    Record::BpfProg(BpfProg {
                        avg_ns: Some(84.5),
                        cpu_pct: Some(0.137),
                        ..bpf_prog(12, 8126, 686_647)
                    }),
                    Record::BpfProg(BpfProg {
                        avg_ns: Some(0.0),
                        cpu_pct: Some(0.0),
                        ..bpf_prog(13, 0, 0)
                    }),
                ],
            ),
        ),
        (
            "bpf annotate, source lines",
            Case::Record(Record::BpfAnnotate(BpfAnnotate {
                id: 23111,
                name: s("bpfscope_sysin"),
                tag: s("1a1e3a364e8fb969"),
                prog_type: s("raw_tracepoint"),
                symbol: s("bpf_prog_1a1e3a364e8fb969_bpfscope_sysin"),
                unit: "samples",
                total: 5,
                unloaded: true,
                lines: vec![
                    AnnotateLine::Source {
                        count: 4,
                        file: s("/src/trace.bpf.c"),
                        line: 674,
                        source: s("a = bpf_map_lookup_elem(&aggs, s->key);"),
                    },
                    AnnotateLine::Source {
                        count: 1,
                        file: s("/src/trace.bpf.c"),
                        line: 868,
                        source: s("if (nr >= BS_SYS_MAX)"),
                    },
                ],
                line_info: true,
            })),
        ),
        (
            "bpf annotate, JIT offsets",
            Case::Record(Record::BpfAnnotate(BpfAnnotate {
                id: 40,
                name: s("prog"),
                tag: s("0011223344556677"),
                prog_type: s("kprobe"),
                symbol: s("bpf_prog_0011223344556677_prog"),
                unit: "ns",
                total: 1_500_000,
                unloaded: false,
                lines: vec![AnnotateLine::Offset {
                    count: 1_500_000,
                    symbol: s("bpf_prog_0011223344556677_prog"),
                    offset: 0x4c,
                }],
                line_info: false,
            })),
        ),
        (
            "bpf annotate, no samples",
            Case::Record(Record::BpfAnnotate(BpfAnnotate {
                id: 41,
                name: s("idle"),
                tag: s("8899aabbccddeeff"),
                prog_type: s("tracing"),
                symbol: s("bpf_prog_8899aabbccddeeff_idle"),
                unit: "samples",
                total: 0,
                unloaded: false,
                lines: vec![],
                line_info: true,
            })),
        ),
        (
            "list, a tracepoint",
            Case::Probe(ProbeEntry {
                probe: s("tracepoint:sched:sched_switch"),
                signature: None,
                fields: vec![
                    ProbeField {
                        name: s("prev_comm"),
                        ctype: s("char"),
                        offset: Some(8),
                        size: Some(16),
                        signed: Some(false),
                        usable: Some(true),
                        array_len: Some(16),
                    },
                    ProbeField {
                        name: s("filename"),
                        ctype: s("const char *"),
                        offset: Some(24),
                        size: Some(8),
                        signed: Some(false),
                        usable: Some(true),
                        array_len: None,
                    },
                    ProbeField {
                        name: s("mask"),
                        ctype: s("unsigned long[4]"),
                        offset: Some(32),
                        size: Some(32),
                        signed: Some(false),
                        usable: Some(false),
                        array_len: None,
                    },
                ],
            }),
        ),
        (
            "list, a kernel function",
            Case::Probe(ProbeEntry {
                probe: s("fentry:vfs_read"),
                signature: Some(s(
                    "ssize_t vfs_read(struct file *file, char *buf, size_t count, loff_t *pos)",
                )),
                fields: vec![
                    ProbeField {
                        name: s("file"),
                        ctype: s("struct file *"),
                        offset: None,
                        size: None,
                        signed: None,
                        usable: None,
                        array_len: None,
                    },
                    ProbeField {
                        name: s("count"),
                        ctype: s("size_t"),
                        offset: None,
                        size: None,
                        signed: None,
                        usable: None,
                        array_len: None,
                    },
                ],
            }),
        ),
    ]
}

fn profile_document() -> ProfileDocument {
    ProfileDocument {
        mode: s("cpu"),
        frequency_hz: 99,
        duration_ns: 2_000_000_000,
        value_unit: "samples",
        stacks: vec![ProfileStack {
            pid: 42,
            comm: s("app"),
            thread: s("app-worker"),
            count: 3,
            value: 3,
            frames: vec![
                ProfileFrame {
                    kind: "native",
                    address: s("0x1139"),
                    module: Some(s("/usr/bin/app")),
                    build_id: Some(s("d2a1c0ffee")),
                    kernel: false,
                    functions: vec![
                        FrameFunction {
                            name: s("work"),
                            file: Some(s("app.c")),
                            line: 12,
                        },
                        FrameFunction {
                            name: s("inlined_helper"),
                            file: None,
                            line: 0,
                        },
                    ],
                },
                ProfileFrame {
                    kind: "unknown",
                    address: s("0xdeadbeef"),
                    module: None,
                    build_id: None,
                    kernel: false,
                    functions: vec![],
                },
            ],
        }],
        top: vec![
            TopFunction {
                function: s("work"),
                self_weight: 3,
                total: 3,
            },
            TopFunction {
                function: s("main"),
                self_weight: 0,
                total: 3,
            },
        ],
        notes: vec![s("1 binary had no symbols")],
    }
}

fn print(p: &mut Printer<Vec<u8>>, c: &Case) {
    match c {
        Case::Record(r) => p.record(r),
        Case::Table(head, rows) => p.table(head, rows),
        Case::Probe(e) => p.probe(e),
    }
    .unwrap();
}

/// The JSON lines of every case, then the profile document.
fn json_golden() -> String {
    let mut p = Printer::new(true, Vec::new());
    for (_, c) in cases() {
        print(&mut p, &c);
    }
    let mut out = std::mem::take(p.writer());
    printer::write_json(&mut out, &profile_document()).unwrap();
    String::from_utf8(out).unwrap()
}

/// The text of every case under its name (stderr after `(stderr)`), then
/// the profile's top functions.
fn text_golden() -> String {
    let mut out = String::new();
    for (name, c) in cases() {
        let err = Shared::default();
        let mut p = Printer::new(false, Vec::new())
            .with_t0(1_717_883_000_000)
            .with_stderr(Box::new(err.clone()));
        print(&mut p, &c);
        out += &format!("### {name}\n");
        out += std::str::from_utf8(p.writer()).unwrap();
        let e = err.0.borrow();
        if !e.is_empty() {
            out += "### (stderr)\n";
            out += std::str::from_utf8(&e).unwrap();
        }
    }
    let mut p = Printer::new(false, Vec::new()).names_only(true);
    for (_, c) in cases() {
        if let Case::Probe(e) = &c {
            p.probe(e).unwrap();
        }
    }
    out += "### list --names\n";
    out += std::str::from_utf8(p.writer()).unwrap();
    let doc = profile_document();
    let mut top = Vec::new();
    printer::top_functions(&mut top, "samples", 3, &doc.top).unwrap();
    out += "### profile top functions\n";
    out += std::str::from_utf8(&top).unwrap();
    out
}

fn check(file: &str, got: &str) {
    let path = format!("{}/tests/golden/{file}", env!("CARGO_MANIFEST_DIR"));
    if std::env::var_os("BLESS").is_some() {
        std::fs::write(&path, got).unwrap();
    }
    let want = std::fs::read_to_string(&path).unwrap_or_default();
    if want != got {
        let first = want
            .lines()
            .zip(got.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(want.lines().count().min(got.lines().count()));
        panic!(
            "{path} differs from the output at line {}:\n  want {:?}\n  got  {:?}\n(BLESS=1 rewrites it after a deliberate change)",
            first + 1,
            want.lines().nth(first),
            got.lines().nth(first)
        );
    }
}

#[test]
fn json_lines_match_golden() {
    check("records.jsonl", &json_golden());
}

#[test]
fn text_matches_golden() {
    check("records.txt", &text_golden());
}

/// The JSON as bpfscope has always printed it: keys sorted at every level
/// (this fails if serde_json's `preserve_order` gets turned on).
#[test]
fn keys_are_sorted() {
    let r = Record::Lost(Lost {
        count: 20,
        what: LostWhat::Keys,
        interval: Some(1),
    });
    let mut out = Vec::new();
    printer::write_json(&mut out, &r).unwrap();
    assert_eq!(
        std::str::from_utf8(&out).unwrap(),
        "{\"count\":20,\"interval\":1,\"type\":\"lost\",\"what\":\"keys\"}\n"
    );
    let e = Record::Event(Event {
        probe: "p",
        ts_ns: 1,
        pid: 2,
        tid: 3,
        comm: "c",
        cpu: 4,
        fields: Fields(vec![("z", Some(Cell::UInt(1))), ("a", None)]),
        faulted: vec!["a"],
        truncated: vec![],
    });
    let mut out = Vec::new();
    printer::write_json(&mut out, &e).unwrap();
    assert_eq!(
        std::str::from_utf8(&out).unwrap(),
        "{\"comm\":\"c\",\"cpu\":4,\"faulted\":[\"a\"],\"fields\":{\"a\":null,\"z\":1},\"pid\":2,\"probe\":\"p\",\"tid\":3,\"ts_ns\":1,\"type\":\"event\"}\n"
    );
}

/// Every type is in the golden cases, prints the `type` it is named by, and
/// has a section in docs/output.md, which states the schema version.
#[test]
fn every_type_is_covered_and_documented() {
    let mut seen = BTreeSet::new();
    for (name, c) in cases() {
        let rows = match &c {
            Case::Record(r) => vec![r],
            Case::Table(_, rows) => rows.iter().collect(),
            Case::Probe(_) => vec![],
        };
        for r in rows {
            let v = serde_json::to_value(r).unwrap();
            assert_eq!(v["type"], r.type_name(), "{name}");
            seen.insert(r.type_name());
        }
    }
    let all: BTreeSet<&str> = Record::TYPES.into_iter().collect();
    assert_eq!(seen, all, "each record type needs a golden case");
    let docs = include_str!("../../docs/output.md");
    for t in Record::TYPES {
        assert!(
            docs.contains(&format!("### `{t}`")),
            "docs/output.md has no section for `{t}`"
        );
    }
    for section in ["### `list` lines", "### The profile document"] {
        assert!(docs.contains(section), "docs/output.md lacks {section}");
    }
    assert!(
        docs.contains(SCHEMA_VERSION),
        "docs/output.md names another schema version"
    );
}

/// The JSON examples of README.md and docs/output.md are printed as
/// bpfscope prints (re-serialized, byte for byte) and are of known types.
#[test]
fn documented_examples_are_printed_form() {
    let docs = [
        ("README.md", include_str!("../../README.md")),
        ("docs/output.md", include_str!("../../docs/output.md")),
    ];
    let mut n = 0;
    for (file, text) in docs {
        for line in text.lines().map(str::trim).filter(|l| l.starts_with("{\"")) {
            let v: serde_json::Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("{file}: not JSON ({e}): {line}"));
            let mut again = Vec::new();
            printer::write_json(&mut again, &v).unwrap();
            assert_eq!(
                std::str::from_utf8(&again).unwrap().trim_end(),
                line,
                "{file}: not as bpfscope prints it"
            );
            match v.get("type").and_then(|t| t.as_str()) {
                // The profile tools' own lines (`annotate`, `diff`, `top`
                // with --json), not records of the tracing verbs' stream.
                Some("annotate") => {
                    assert!(v.get("function").is_some() && v.get("lines").is_some())
                }
                Some("diff") => {
                    assert!(v.get("function").is_some() && v.get("self_delta").is_some())
                }
                Some("top") => {
                    assert!(v.get("functions").is_some() && v.get("refresh").is_some())
                }
                Some(t) => assert!(Record::TYPES.contains(&t), "{file}: unknown type {t}"),
                // The untagged outputs: list lines and the profile document.
                None => assert!(v.get("probe").is_some() || v.get("stacks").is_some()),
            }
            n += 1;
        }
    }
    assert!(n >= 15, "only {n} examples found");
}
