//! Every record bpfscope prints, as types. The wire format is documented
//! in docs/output.md; the JSON printer serializes these types and the text
//! printer draws the same values (see `printer`).

use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Serialize, Serializer};

use crate::attach::plan::Buckets;

/// The version of the output schema that docs/output.md describes. It is
/// not printed: records only gain fields and types within a version.
pub const SCHEMA_VERSION: &str = "bpfscope output schema 1";

/// One record of bpfscope's JSON lines output (`--json` of `count`,
/// `stats`, `hist`, `latency`, `trace`, `bpf list`, `bpf top` and
/// `bpf annotate`), tagged by its `type` field.
///
/// The schema of every variant, its text form and the schema version are in
/// docs/output.md; a unit test keeps each `type` named there. Printed
/// objects have their keys in alphabetical order (see
/// `printer::write_json`), as bpfscope has always printed them.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Record<'a> {
    /// Events counted per key (`count`).
    Count(Count<'a>),
    /// Count, sum, min, max and average of a value per key (`stats`).
    Stats(Stats<'a>),
    /// A histogram per key (`hist`, `latency`).
    Hist(Hist<'a>),
    /// One traced event (`trace`).
    Event(Event<'a>),
    /// Events, keys or stacks that were dropped.
    Lost(Lost),
    /// Latency ends that had no traced start.
    Unmatched(Unmatched),
    /// A BPF program and its run-time statistics (`bpf list`, `bpf top`).
    BpfProg(BpfProg),
    /// Samples per source line of a BPF program (`bpf annotate`).
    BpfAnnotate(BpfAnnotate),
}

impl Record<'_> {
    /// Every `type` a record can have, as printed.
    pub const TYPES: [&'static str; 8] = [
        "count",
        "stats",
        "hist",
        "event",
        "lost",
        "unmatched",
        "bpf_prog",
        "bpf_annotate",
    ];

    /// The record's `type`.
    pub fn type_name(&self) -> &'static str {
        match self {
            Record::Count(_) => "count",
            Record::Stats(_) => "stats",
            Record::Hist(_) => "hist",
            Record::Event(_) => "event",
            Record::Lost(_) => "lost",
            Record::Unmatched(_) => "unmatched",
            Record::BpfProg(_) => "bpf_prog",
            Record::BpfAnnotate(_) => "bpf_annotate",
        }
    }
}

/// One decoded key part or event field.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Cell {
    Int(i64),
    UInt(u64),
    /// Printed as a `0x` hex string.
    Hex(u64),
    Str(String),
    /// A buffer's bytes, escaped (see `escape_bytes`), and whether its
    /// length went beyond what was copied.
    Bytes(String, bool),
    /// Stack frames, leaf first.
    Frames(Vec<String>),
}

impl Cell {
    pub fn text(&self) -> String {
        match self {
            Cell::Int(v) => v.to_string(),
            Cell::UInt(v) => v.to_string(),
            Cell::Hex(v) => format!("{v:#x}"),
            Cell::Str(s) => s.clone(),
            Cell::Bytes(s, cut) => format!("{s}{}", if *cut { "..." } else { "" }),
            Cell::Frames(f) => f.join("\n"),
        }
    }

    /// On one line: stacks as `leaf <- caller <- ...`.
    pub fn inline(&self) -> String {
        match self {
            Cell::Frames(f) => f.join(" <- "),
            c => c.text(),
        }
    }
}

/// JSON: a number, a string (hex numbers, strings, escaped buffers) or an
/// array of frame names.
impl Serialize for Cell {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Cell::Int(v) => s.serialize_i64(*v),
            Cell::UInt(v) => s.serialize_u64(*v),
            Cell::Hex(v) => s.serialize_str(&format!("{v:#x}")),
            Cell::Str(v) | Cell::Bytes(v, _) => s.serialize_str(v),
            Cell::Frames(f) => {
                let mut seq = s.serialize_seq(Some(f.len()))?;
                for frame in f {
                    seq.serialize_element(frame)?;
                }
                seq.end()
            }
        }
    }
}

/// The key of an aggregate: its parts in `--by` order, each under its key
/// name. JSON: an object (empty without `--by`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Key<'a>(pub Vec<(&'a str, Cell)>);

impl Serialize for Key<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (name, cell) in &self.0 {
            m.serialize_entry(name, cell)?;
        }
        m.end()
    }
}

/// An event's fields in `--fields` order; None: its memory could not be
/// read (JSON: null).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Fields<'a>(pub Vec<(&'a str, Option<Cell>)>);

impl Serialize for Fields<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (name, cell) in &self.0 {
            m.serialize_entry(name, cell)?;
        }
        m.end()
    }
}

/// An aggregated value: signed or unsigned as the field's C type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Integer {
    Signed(i64),
    Unsigned(u64),
}

impl Integer {
    /// The value of raw 64 bits, read as the field's signedness says.
    pub fn new(raw: i64, signed: bool) -> Integer {
        if signed {
            Integer::Signed(raw)
        } else {
            Integer::Unsigned(raw as u64)
        }
    }

    pub fn as_f64(self) -> f64 {
        match self {
            Integer::Signed(v) => v as f64,
            Integer::Unsigned(v) => v as f64,
        }
    }
}

impl std::fmt::Display for Integer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Integer::Signed(v) => v.fmt(f),
            Integer::Unsigned(v) => v.fmt(f),
        }
    }
}

/// `count`: how many events a key saw.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Count<'a> {
    pub key: Key<'a>,
    pub count: u64,
    /// The interval's number (from 1) with `--interval`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interval: Option<u64>,
}

/// `stats`: a value's count, sum, min, max and average per key.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Stats<'a> {
    pub key: Key<'a>,
    pub count: u64,
    pub sum: Integer,
    pub min: Integer,
    pub max: Integer,
    /// sum / count; 0 when count is 0.
    pub avg: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interval: Option<u64>,
}

/// What a histogram counts in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HistUnit {
    /// Values of a field (`hist --value`).
    Count,
    /// Latencies in nanoseconds (`latency`).
    Ns,
}

/// `hist`: a histogram of a value per key.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Hist<'a> {
    pub key: Key<'a>,
    /// The field measured, or `latency`.
    pub value: &'a str,
    pub unit: HistUnit,
    /// The buckets that counted something, lowest first.
    pub buckets: Vec<Bucket>,
    pub count: u64,
    pub sum: Integer,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interval: Option<u64>,
    /// Text only: the bucket layout, to show the empty buckets in between.
    #[serde(skip)]
    pub layout: Buckets,
}

/// A histogram bucket, half-open: [low, high).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Bucket {
    /// i64::MIN for the lowest bucket.
    pub low: i128,
    /// u64::MAX for the highest bucket.
    pub high: i128,
    pub count: u64,
    /// Text only: the bucket's index in its layout.
    #[serde(skip)]
    pub index: u32,
}

/// `event`: one traced event.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Event<'a> {
    pub probe: &'a str,
    /// CLOCK_MONOTONIC nanoseconds.
    pub ts_ns: u64,
    pub pid: u32,
    pub tid: u32,
    pub comm: &'a str,
    pub cpu: u32,
    pub fields: Fields<'a>,
    /// Fields whose memory could not be read (their value is null).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub faulted: Vec<&'a str>,
    /// Buffers longer than the bytes shown.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub truncated: Vec<&'a str>,
}

/// What a `lost` record counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LostWhat {
    Events,
    Keys,
    Stacks,
    Nested,
    Missed,
}

impl LostWhat {
    pub fn name(self) -> &'static str {
        match self {
            LostWhat::Events => "events",
            LostWhat::Keys => "keys",
            LostWhat::Stacks => "stacks",
            LostWhat::Nested => "nested",
            LostWhat::Missed => "missed",
        }
    }

    /// Why, and what to do about it (text form only).
    pub fn why(self) -> &'static str {
        match self {
            LostWhat::Events => "the ring buffer was full; raise --ringbuf-kib or filter more",
            LostWhat::Keys => "the key map was full; raise --max-keys",
            LostWhat::Stacks => {
                "stacks could not be stored: the stack map was full (raise --max-stacks), another stack held their hash slot, or the thread had no user stack (kernel threads)"
            }
            LostWhat::Nested => {
                "events fired while a BPF program was running on that CPU: the kernel skips a program nested in itself or in another tracepoint's, bpfscope a run nested in one of its own"
            }
            LostWhat::Missed => {
                "kernel function hits the kernel skipped (all kprobe return instances in use, a probe inside a probe, or an fentry/fexit program already running on that CPU)"
            }
        }
    }
}

/// `lost`: what could not be recorded.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Lost {
    pub count: u64,
    pub what: LostWhat,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interval: Option<u64>,
}

/// `unmatched`: latency ends whose start was not traced (filtered, before
/// attach, other processes). Not a loss.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Unmatched {
    pub count: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interval: Option<u64>,
}

/// `bpf_prog`: one BPF program. `bpf list` gives its totals and attach
/// points, `bpf top` its activity over the last interval and CPU share.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BpfProg {
    pub id: u32,
    pub name: String,
    pub tag: String,
    pub prog_type: String,
    /// `bpf list` only: what the program is attached to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attached: Option<Vec<String>>,
    pub run_cnt: u64,
    pub run_time_ns: u64,
    /// run_time_ns / run_cnt; `bpf list`: null without runs, `bpf top`: 0.
    pub avg_ns: Option<f64>,
    /// `bpf top` only: percent of one CPU over the interval.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_pct: Option<f64>,
}

/// `bpf_annotate`: where the samples of one program in a recording landed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BpfAnnotate {
    pub id: u32,
    pub name: String,
    pub tag: String,
    pub prog_type: String,
    /// The main function's symbol (`bpf_prog_<tag>_<name>`).
    pub symbol: String,
    /// `samples`, or `ns` for an off-CPU recording.
    pub unit: &'static str,
    pub total: u64,
    /// Unloaded before the recording ended.
    pub unloaded: bool,
    pub lines: Vec<AnnotateLine>,
    /// Text only: whether the program has BTF line info.
    #[serde(skip)]
    pub line_info: bool,
}

/// Samples at one place of a BPF program.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum AnnotateLine {
    /// A source line (from BTF line info).
    Source {
        count: u64,
        file: String,
        line: u32,
        source: String,
    },
    /// A JIT offset in a sub-program without line info.
    Offset {
        count: u64,
        symbol: String,
        offset: u64,
    },
}

/// One line of `bpfscope list --json`: a probe and its fields. Untagged (it
/// has no `type`), as it always was.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProbeEntry {
    pub probe: String,
    /// Kernel functions: the BTF prototype (their fields are the usable
    /// arguments, name and type only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
    pub fields: Vec<ProbeField>,
}

/// A field of a listed probe.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProbeField {
    pub name: String,
    /// The C type.
    #[serde(rename = "type")]
    pub ctype: String,
    /// The rest: probes without a signature only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offset: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size: Option<u8>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signed: Option<bool>,
    /// Whether it can be a key, value, filter operand or traced field.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usable: Option<bool>,
    /// Text only: the length of a char array (`char comm[16]`).
    #[serde(skip)]
    pub array_len: Option<u16>,
}

/// The document `profile`/`report -o FILE.json` writes: one JSON object, untagged.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProfileDocument {
    /// `cpu` or `offcpu`.
    pub mode: String,
    pub frequency_hz: u64,
    pub duration_ns: u64,
    /// What a stack's `value` counts: `samples` or `nanoseconds`.
    pub value_unit: &'static str,
    pub stacks: Vec<ProfileStack>,
    /// The heaviest functions by self weight, at most 100.
    pub top: Vec<TopFunction>,
    pub notes: Vec<String>,
}

/// A unique stack of a profile.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProfileStack {
    pub pid: u32,
    pub comm: String,
    /// The thread's name (the process's where none was recorded).
    pub thread: String,
    pub count: u64,
    pub value: u64,
    /// Leaf first.
    pub frames: Vec<ProfileFrame>,
}

/// One frame of a profile stack.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProfileFrame {
    /// What code it is: kernel, bpf, native, python, jit or unknown.
    pub kind: &'static str,
    /// Hex: a file offset (user), a kernel address, or a raw address.
    pub address: String,
    pub module: Option<String>,
    pub build_id: Option<String>,
    pub kernel: bool,
    /// Outer function first (inlined functions follow); empty without symbols.
    pub functions: Vec<FrameFunction>,
}

/// A function at a frame, with its source line when known.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FrameFunction {
    pub name: String,
    pub file: Option<String>,
    pub line: u32,
}

/// `bpfscope annotate --json`: a function's samples per source line and
/// per instruction.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FunctionAnnotate {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: String,
    pub binary: String,
    pub build_id: String,
    pub samples: u64,
    pub profile_samples: u64,
    pub in_kernel: u64,
    pub undecoded: u64,
    /// Heaviest first.
    pub lines: Vec<AnnotatedLine>,
    /// In address order.
    pub instructions: Vec<AnnotatedInstruction>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AnnotatedLine {
    pub file: String,
    pub line: u32,
    pub count: u64,
    pub source: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AnnotatedInstruction {
    /// Hex file offset, and ELF virtual address.
    pub offset: String,
    pub address: String,
    pub text: String,
    pub count: u64,
    pub file: Option<String>,
    pub line: u32,
}

/// A function of `bpfscope diff --json`: its share of each profile's
/// samples (percent), self and total, and the change.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DiffFunction {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: String,
    pub base_self: f64,
    pub new_self: f64,
    pub self_delta: f64,
    pub base_total: f64,
    pub new_total: f64,
    pub total_delta: f64,
}

/// One refresh of `bpfscope top --json`: the functions of the samples of
/// the last `seconds`, heaviest first by the sort in use.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TopRefresh {
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// 1 for the first refresh.
    pub refresh: u64,
    /// The time the counts cover, in seconds.
    pub seconds: f64,
    pub samples: u64,
    /// "self" or "total".
    pub sort: &'static str,
    pub functions: Vec<TopFunction>,
}

/// A function's self and total weight in a profile (the `top` of the JSON
/// document; the table on stdout).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TopFunction {
    pub function: String,
    #[serde(rename = "self")]
    pub self_weight: u64,
    pub total: u64,
}
