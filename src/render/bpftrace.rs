//! Output exactly as bpftrace 0.17 writes it: maps (`print()` and the maps
//! printed at exit), `printf`, `time`, `print(value)`, and the `-f json` lines.
//!
//! Every rule here was read from bpftrace v0.17.0's `output.cpp`,
//! `bpftrace.cpp`, `format_string.cpp` and `mapkey.cpp` and checked against
//! the binary (the goldens under `tests/golden/bpftrace/`). bpftrace's own
//! quirks are kept on purpose, since scripts' users diff our output against
//! it: ksym-valued maps run together on one line, JSON escapes bytes >= 0x80
//! as `\uffffffXX`, `%%` after the last conversion stays `%%`, and so on.
//!
//! Text forms come with their newlines; `json_*` forms are one line each
//! without the newline (and "" where bpftrace writes no line at all).

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;

/// A value as a script produced it, already decoded from kernel bytes.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Int(i64),
    UInt(u64),
    Str(String),
    /// A stack as symbolized frames, innermost first ("func+off" or
    /// "0x7f..." each), printed the way bpftrace prints kstack/ustack (in
    /// printf %s, in map keys, in print()). An empty stack is one bpftrace
    /// could not look up (e.g. kstack in a uprobe) and prints as "".
    Stack(Vec<String>),
    /// Text printed as is: a symbol from ksym/usym, an ntop() address.
    /// As a map *value* it behaves like bpftrace's ksym/usym/inet types: the
    /// entries of such a map are joined without a newline (bpftrace's own
    /// output). A probe name or username value prints like a string, so pass
    /// those as `Str` when they are map values; as map keys pass a probe as
    /// `Text` (bpftrace leaves probe keys unsorted).
    Text(String),
    /// Bytes from buf(), printed with printable ASCII as is and the rest
    /// as `\xNN` (bpftrace's `%r`).
    Buf(Vec<u8>),
    /// A tuple, as a map's value: `(1, abc, (2, x))`, in JSON an array.
    Tuple(Vec<Value>),
}

impl Value {
    /// The printf argument kind of this value.
    pub fn kind(&self) -> ArgKind {
        match self {
            Value::Int(_) | Value::UInt(_) => ArgKind::Int,
            Value::Str(_) => ArgKind::Str,
            Value::Stack(_) => ArgKind::Stack,
            Value::Text(_) => ArgKind::Text,
            Value::Buf(_) => ArgKind::Buf,
            Value::Tuple(_) => ArgKind::Text,
        }
    }
}

/// A buffer as bpftrace's %r prints it: printable ASCII as is, other bytes `\xNN`.
pub fn buf_text(b: &[u8]) -> String {
    let mut s = String::with_capacity(b.len());
    for &c in b {
        if (32..=126).contains(&c) {
            s.push(char::from(c));
        } else {
            s.push_str(&format!("\\x{c:02x}"));
        }
    }
    s
}

/// A map's value per key, by the function that made it.
#[derive(Debug, Clone, PartialEq)]
pub enum Agg {
    /// A plain assignment (`@x = 5`, `@s = "abc"`, `@t[tid] = nsecs`).
    Scalar(Value),
    Count(u64),
    Sum(i64),
    /// By the value's signedness: an unsigned minimum or maximum past
    /// 2^63 stays positive.
    Min(i128),
    Max(i128),
    Avg {
        count: u64,
        sum: i64,
    },
    Stats {
        count: u64,
        sum: i64,
    },
    /// log2 histogram: bucket index -> count. Bucket 0 holds negative
    /// values, 1 holds 0, 2 + k holds [2^k, 2^(k+1)) (so 2 is exactly 1, 3 is
    /// [2,4), ...).
    Hist(BTreeMap<u32, u64>),
    /// lhist(v, min, max, step): bucket 0 below min, 1..=n the in-range
    /// buckets of `step` from min, n + 1 at or above max
    /// (n = (max - min) / step).
    Lhist {
        min: i64,
        max: i64,
        step: i64,
        buckets: BTreeMap<u32, u64>,
    },
}

impl Agg {
    /// Which function made this value (what decides sorting and layout).
    pub fn kind(&self) -> AggKind {
        match self {
            Agg::Scalar(_) => AggKind::Scalar,
            Agg::Count(_) => AggKind::Count,
            Agg::Sum(_) => AggKind::Sum,
            Agg::Min(_) => AggKind::Min,
            Agg::Max(_) => AggKind::Max,
            Agg::Avg { .. } => AggKind::Avg,
            Agg::Stats { .. } => AggKind::Stats,
            Agg::Hist(_) => AggKind::Hist,
            Agg::Lhist { .. } => AggKind::Lhist,
        }
    }
}

/// The function behind a map, for a map that has no entries to tell it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AggKind {
    Scalar,
    Count,
    Sum,
    Min,
    Max,
    Avg,
    Stats,
    Hist,
    Lhist,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct MapData {
    /// With its '@' (`@`, `@bytes`).
    pub name: String,
    /// Key parts (empty for a map without keys) and value. For count, sum,
    /// min, max and integer maps give the entries in the order the kernel
    /// hash map yields them (bpf_get_next_key): bpftrace sorts them with
    /// std::sort, which is not stable, and this module replays that sort, so
    /// ties come out as bpftrace's do only from the same starting order.
    pub entries: Vec<(Vec<Value>, Agg)>,
}

/// What a printf argument is, for checking a format before values exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArgKind {
    /// Any integer or pointer (signed or not: printf sees the same 64 bits).
    Int,
    /// A string.
    Str,
    /// kstack/ustack (printed as a string).
    Stack,
    /// ksym/usym/probe/ntop/... (printed as a string).
    Text,
    /// buf(): for `%r`.
    Buf,
}

/// A printf format bpftrace would reject, or whose output is undefined.
///
/// `message()` is the whole line bpftrace writes after `ERROR: ` (e.g.
/// "printf: Too many arguments for format string (1 supplied, 0
/// expected)"); Display leaves out the leading "printf: ", for callers that
/// write `printf: {e}` themselves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FormatError {
    message: String,
}

impl FormatError {
    fn new(message: String) -> Self {
        FormatError { message }
    }

    /// The one-line message, worded as bpftrace's where bpftrace rejects it.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for FormatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = &self.message;
        f.write_str(m.strip_prefix("printf: ").unwrap_or(m))
    }
}

impl std::error::Error for FormatError {}

/// bpftrace's default format for `time()` with no argument.
pub const DEFAULT_TIME_FORMAT: &str = "%H:%M:%S\n";

/// Written to stdout (always stdout, even with `-f json` or `-o FILE`) when
/// the program ends, right before the maps; see [`exit_maps_order`].
pub const EXIT_SEPARATOR: &str = "\n\n";

// ---------------------------------------------------------------- stacks

/// BPFtrace::get_stack: a newline, then one indented frame per line.
fn stack_str(frames: &[String], indent: usize) -> String {
    if frames.is_empty() {
        // The stack id did not resolve (-EFAULT): bpftrace prints nothing.
        return String::new();
    }
    let pad = " ".repeat(indent);
    let mut s = String::from("\n");
    for f in frames {
        // perf's mode (`kstack(perf)`): the frame is its own line, a tab first.
        if !f.starts_with('\t') {
            s.push_str(&pad);
        }
        s.push_str(f);
        s.push('\n');
    }
    s
}

/// A key part as MapKey::argument_value prints it: integers are read back
/// as int64 (so a u64 above i64::MAX prints negative), stacks indent by 4.
fn key_part_str(v: &Value) -> String {
    match v {
        Value::Int(i) => i.to_string(),
        Value::UInt(u) => (*u as i64).to_string(),
        Value::Str(s) | Value::Text(s) => s.clone(),
        Value::Buf(b) => buf_text(b),
        Value::Stack(f) => stack_str(f, 4),
        Value::Tuple(_) => value_str(v, 1),
    }
}

/// A value as Output::value_to_str prints it (stacks indent by 8).
fn value_str(v: &Value, div: u32) -> String {
    match v {
        Value::Int(i) => i.wrapping_div(i64::from(div)).to_string(),
        Value::UInt(u) => (u / u64::from(div)).to_string(),
        Value::Str(s) | Value::Text(s) => s.clone(),
        Value::Buf(b) => buf_text(b),
        Value::Stack(f) => stack_str(f, 8),
        // Members as bpftrace's tuple printing has them: no divisor.
        Value::Tuple(m) => {
            let parts: Vec<String> = m.iter().map(|x| value_str(x, 1)).collect();
            format!("({})", parts.join(", "))
        }
    }
}

/// JsonOutput::value_to_str: strings, stacks and symbols are quoted.
fn json_value_str(v: &Value, div: u32) -> String {
    match v {
        Value::Int(_) | Value::UInt(_) => value_str(v, div),
        // An array, without spaces, as bpftrace's JSON tuples.
        Value::Tuple(m) => {
            let parts: Vec<String> = m.iter().map(|x| json_value_str(x, 1)).collect();
            format!("[{}]", parts.join(","))
        }
        _ => format!("\"{}\"", json_escape(value_str(v, div).as_bytes())),
    }
}

/// JsonOutput::json_escape, byte for byte. `char` is signed in bpftrace, so
/// every byte >= 0x80 also passes its `c <= '\x1f'` test and comes out as
/// `\uffffffXX` (invalid JSON, but what bpftrace writes).
fn json_escape(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len());
    for &b in bytes {
        match b {
            b'"' => s.push_str("\\\""),
            b'\\' => s.push_str("\\\\"),
            b'\n' => s.push_str("\\n"),
            b'\r' => s.push_str("\\r"),
            b'\t' => s.push_str("\\t"),
            0..=0x1f => s.push_str(&format!("\\u{b:04x}")),
            0x80..=0xff => s.push_str(&format!("\\u{:08x}", 0xffff_ff00u32 | u32::from(b))),
            _ => s.push(char::from(b)),
        }
    }
    s
}

// ---------------------------------------------------------------- sorting

/// libstdc++'s std::sort (introsort, median of three, final insertion
/// sort), step for step, over a permutation. bpftrace sorts map entries
/// with it and it is not stable, so ties come out in an order only the same
/// algorithm reproduces.
mod gnu_sort {
    const THRESHOLD: usize = 16;

    pub fn sort(v: &mut [usize], less: &dyn Fn(usize, usize) -> bool) {
        let n = v.len();
        if n == 0 {
            return;
        }
        let lg = (usize::BITS - 1 - n.leading_zeros()) as usize;
        introsort_loop(v, 0, n, lg * 2, less);
        final_insertion_sort(v, 0, n, less);
    }

    fn introsort_loop(
        v: &mut [usize],
        first: usize,
        mut last: usize,
        mut depth: usize,
        less: &dyn Fn(usize, usize) -> bool,
    ) {
        while last - first > THRESHOLD {
            if depth == 0 {
                partial_sort(v, first, last, less);
                return;
            }
            depth -= 1;
            let cut = unguarded_partition_pivot(v, first, last, less);
            introsort_loop(v, cut, last, depth, less);
            last = cut;
        }
    }

    fn unguarded_partition_pivot(
        v: &mut [usize],
        first: usize,
        last: usize,
        less: &dyn Fn(usize, usize) -> bool,
    ) -> usize {
        let mid = first + (last - first) / 2;
        move_median_to_first(v, first, first + 1, mid, last - 1, less);
        unguarded_partition(v, first + 1, last, first, less)
    }

    fn move_median_to_first(
        v: &mut [usize],
        result: usize,
        a: usize,
        b: usize,
        c: usize,
        less: &dyn Fn(usize, usize) -> bool,
    ) {
        let l = |v: &[usize], x: usize, y: usize| less(v[x], v[y]);
        let pick = if l(v, a, b) {
            if l(v, b, c) {
                b
            } else if l(v, a, c) {
                c
            } else {
                a
            }
        } else if l(v, a, c) {
            a
        } else if l(v, b, c) {
            c
        } else {
            b
        };
        v.swap(result, pick);
    }

    fn unguarded_partition(
        v: &mut [usize],
        mut first: usize,
        mut last: usize,
        pivot: usize,
        less: &dyn Fn(usize, usize) -> bool,
    ) -> usize {
        loop {
            while first < v.len() && less(v[first], v[pivot]) {
                first += 1;
            }
            last -= 1;
            while last > 0 && less(v[pivot], v[last]) {
                last -= 1;
            }
            if first >= last {
                return first;
            }
            v.swap(first, last);
            first += 1;
        }
    }

    fn final_insertion_sort(
        v: &mut [usize],
        first: usize,
        last: usize,
        less: &dyn Fn(usize, usize) -> bool,
    ) {
        if last - first > THRESHOLD {
            insertion_sort(v, first, first + THRESHOLD, less);
            for i in first + THRESHOLD..last {
                unguarded_linear_insert(v, i, less);
            }
        } else {
            insertion_sort(v, first, last, less);
        }
    }

    fn insertion_sort(
        v: &mut [usize],
        first: usize,
        last: usize,
        less: &dyn Fn(usize, usize) -> bool,
    ) {
        if first == last {
            return;
        }
        for i in first + 1..last {
            if less(v[i], v[first]) {
                let val = v[i];
                v.copy_within(first..i, first + 1);
                v[first] = val;
            } else {
                unguarded_linear_insert(v, i, less);
            }
        }
    }

    fn unguarded_linear_insert(
        v: &mut [usize],
        mut last: usize,
        less: &dyn Fn(usize, usize) -> bool,
    ) {
        let val = v[last];
        // The element in front always stops the walk for a strict weak
        // order; `last > 0` only keeps a bad comparator from panicking.
        while last > 0 && less(val, v[last - 1]) {
            v[last] = v[last - 1];
            last -= 1;
        }
        v[last] = val;
    }

    /// std::__partial_sort(first, last, last): heap select, then sort_heap.
    pub fn partial_sort(
        v: &mut [usize],
        first: usize,
        last: usize,
        less: &dyn Fn(usize, usize) -> bool,
    ) {
        make_heap(v, first, last, less);
        let mut end = last;
        while end - first > 1 {
            end -= 1;
            let value = v[end];
            v[end] = v[first];
            adjust_heap(v, first, 0, end - first, value, less);
        }
    }

    fn make_heap(v: &mut [usize], first: usize, last: usize, less: &dyn Fn(usize, usize) -> bool) {
        let len = last - first;
        if len < 2 {
            return;
        }
        let mut parent = (len - 2) / 2;
        loop {
            let value = v[first + parent];
            adjust_heap(v, first, parent, len, value, less);
            if parent == 0 {
                return;
            }
            parent -= 1;
        }
    }

    fn adjust_heap(
        v: &mut [usize],
        first: usize,
        mut hole: usize,
        len: usize,
        value: usize,
        less: &dyn Fn(usize, usize) -> bool,
    ) {
        let top = hole;
        let mut second = hole;
        while len > 0 && second < (len - 1) / 2 {
            second = 2 * (second + 1);
            if less(v[first + second], v[first + second - 1]) {
                second -= 1;
            }
            v[first + hole] = v[first + second];
            hole = second;
        }
        if len >= 2 && len & 1 == 0 && second == (len - 2) / 2 {
            second = 2 * (second + 1);
            v[first + hole] = v[first + second - 1];
            hole = second - 1;
        }
        // std::__push_heap; the parent index is signed in libstdc++.
        let mut parent = (hole as isize - 1) / 2;
        while hole > top && less(v[first + parent as usize], value) {
            v[first + hole] = v[first + parent as usize];
            hole = parent as usize;
            parent = (hole as isize - 1) / 2;
        }
        v[first + hole] = value;
    }
}

/// Key order of std::map<std::vector<uint8_t>, ...> in print_map_hist /
/// print_map_stats: the raw key bytes, integers little-endian 8 bytes,
/// strings zero-padded. Stacks and symbols are kernel ids there, which we do
/// not have, so they keep the caller's order.
fn key_bytes_cmp(a: &[Value], b: &[Value]) -> Ordering {
    for (x, y) in a.iter().zip(b) {
        let o = match (int_bits(x), int_bits(y)) {
            (Some(p), Some(q)) => p.to_le_bytes().cmp(&q.to_le_bytes()),
            _ => match (x, y) {
                (Value::Str(p), Value::Str(q)) => p.as_bytes().cmp(q.as_bytes()),
                _ => Ordering::Equal,
            },
        };
        if o != Ordering::Equal {
            return o;
        }
    }
    Ordering::Equal
}

/// BPFtrace::sort_by_key: stable sorts from the last key part to the first;
/// integers as uint64, strings with strncmp, other types not at all.
fn sort_by_key_cmp(a: &[Value], b: &[Value]) -> Ordering {
    for (x, y) in a.iter().zip(b) {
        let o = match (int_bits(x), int_bits(y)) {
            (Some(p), Some(q)) => p.cmp(&q),
            _ => match (x, y) {
                (Value::Str(p), Value::Str(q)) => c_str(p.as_bytes()).cmp(c_str(q.as_bytes())),
                _ => Ordering::Equal,
            },
        };
        if o != Ordering::Equal {
            return o;
        }
    }
    Ordering::Equal
}

fn int_bits(v: &Value) -> Option<u64> {
    match v {
        Value::Int(i) => Some(*i as u64),
        Value::UInt(u) => Some(*u),
        _ => None,
    }
}

/// The bytes up to the first NUL, as C string functions see them.
fn c_str(b: &[u8]) -> &[u8] {
    match b.iter().position(|&c| c == 0) {
        Some(n) => &b[..n],
        None => b,
    }
}

fn avg_of(count: u64, sum: i64) -> i64 {
    let count = count as i64;
    if count == 0 {
        0
    } else {
        sum.wrapping_div(count)
    }
}

fn hist_total(buckets: &BTreeMap<u32, u64>) -> u64 {
    // An int64_t accumulator stored into a uint64_t pair member.
    buckets.values().fold(0u64, |a, &c| a.wrapping_add(c))
}

/// The numeric sort key print_map uses for count/sum/min/max/int maps.
fn numeric_key(a: &Agg) -> Option<i128> {
    Some(match a {
        Agg::Count(c) => i128::from(*c),
        Agg::Sum(s) => i128::from(*s),
        Agg::Min(m) | Agg::Max(m) => *m,
        Agg::Scalar(Value::Int(i)) => i128::from(*i),
        Agg::Scalar(Value::UInt(u)) => i128::from(*u),
        _ => return None,
    })
}

/// Entry indices in the order bpftrace prints them (before `top`).
fn sorted_order(map: &MapData) -> Vec<usize> {
    let e = &map.entries;
    let mut idx: Vec<usize> = (0..e.len()).collect();
    let Some(first) = e.first() else {
        return idx;
    };
    match &first.1 {
        Agg::Hist(_) | Agg::Lhist { .. } => {
            idx.sort_by(|&a, &b| key_bytes_cmp(&e[a].0, &e[b].0));
            let total = |i: usize| match &e[i].1 {
                Agg::Hist(b) | Agg::Lhist { buckets: b, .. } => hist_total(b),
                _ => 0,
            };
            gnu_sort::sort(&mut idx, &|a, b| total(a) < total(b));
        }
        Agg::Avg { .. } | Agg::Stats { .. } => {
            idx.sort_by(|&a, &b| key_bytes_cmp(&e[a].0, &e[b].0));
            let avg = |i: usize| match &e[i].1 {
                Agg::Avg { count, sum } | Agg::Stats { count, sum } => avg_of(*count, *sum),
                _ => 0,
            };
            gnu_sort::sort(&mut idx, &|a, b| avg(a) < avg(b));
        }
        a if numeric_key(a).is_some() => {
            let key = |i: usize| numeric_key(&e[i].1).unwrap_or(0);
            gnu_sort::sort(&mut idx, &|a, b| key(a) < key(b));
        }
        _ => idx.sort_by(|&a, &b| sort_by_key_cmp(&e[a].0, &e[b].0)),
    }
    idx
}

/// The last `top` of the sorted entries (all when top is 0). stats() maps
/// ignore top in bpftrace (it warns at parse time), avg() maps do not.
fn apply_top(order: Vec<usize>, top: usize, kind: AggKind) -> Vec<usize> {
    if top == 0 || kind == AggKind::Stats || order.len() <= top {
        return order;
    }
    let skip = order.len() - top;
    order.into_iter().skip(skip).collect()
}

/// print()'s div is a uint32_t in bpftrace, and 0 means none.
fn norm_div(div: u64) -> u32 {
    match div as u32 {
        0 => 1,
        d => d,
    }
}

// ---------------------------------------------------------------- histograms

const HIST_BUCKETS: usize = 65;
const LHIST_BUCKETS: usize = 1002;
const BAR_WIDTH: usize = 52;
const MAX_BAR: usize = BAR_WIDTH * 1024;

fn dense(buckets: &BTreeMap<u32, u64>, n: usize) -> Vec<u64> {
    let mut v = vec![0u64; n];
    for (&i, &c) in buckets {
        if let Some(slot) = v.get_mut(i as usize) {
            *slot = c;
        }
    }
    v
}

/// `int bar_width = values.at(i)/(float)max_value*max_width;`
fn bar(count: u64, max_value: i32) -> String {
    let w = (count as f32 / max_value as f32) * BAR_WIDTH as f32;
    // C truncates toward zero; a NaN or negative width cannot happen for
    // counts below 2^31 (bpftrace would crash on those anyway).
    let w = if w.is_nan() || w < 0.0 {
        0
    } else {
        w as i32 as usize
    };
    // Only counts of 2^31 and more (which bpftrace reads into an int, and
    // crashes on) can make a bar longer than 52; keep memory bounded.
    "@".repeat(w.min(MAX_BAR))
}

/// Output::hist_prepare: bpftrace reads each count into an `int`.
fn hist_prepare(values: &[u64]) -> Option<(usize, usize, i32)> {
    let mut min_index = None;
    let mut max_index = None;
    let mut max_value = 0i32;
    for (i, &c) in values.iter().enumerate() {
        let v = c as i32;
        if v > 0 {
            min_index.get_or_insert(i);
            max_index = Some(i);
        }
        max_value = max_value.max(v);
    }
    Some((min_index?, max_index?, max_value))
}

/// TextOutput::hist_index_label.
fn hist_index_label(power: i32) -> String {
    let (suffix, p) = match power {
        p if p >= 40 => ("T", p - 40),
        p if p >= 30 => ("G", p - 30),
        p if p >= 20 => ("M", p - 20),
        p if p >= 10 => ("K", p - 10),
        p => ("", p),
    };
    format!("{}{suffix}", 1i32.wrapping_shl(p as u32))
}

fn hist_line(out: &mut String, header: &str, shown: u64, count: u64, max_value: i32) {
    out.push_str(&format!(
        "{header:<16}{shown:>8} |{:<width$}|\n",
        bar(count, max_value),
        width = BAR_WIDTH
    ));
}

fn hist_text(buckets: &BTreeMap<u32, u64>, div: u32) -> String {
    let values = dense(buckets, HIST_BUCKETS);
    let Some((lo, hi, max_value)) = hist_prepare(&values) else {
        return String::new();
    };
    let mut out = String::new();
    for (i, &count) in values.iter().enumerate().take(hi + 1).skip(lo) {
        let header = match i {
            0 => "(..., 0)".to_string(),
            1 => "[0]".to_string(),
            2 => "[1]".to_string(),
            _ => {
                let p = i as i32 - 2;
                format!("[{}, {})", hist_index_label(p), hist_index_label(p + 1))
            }
        };
        hist_line(&mut out, &header, count / u64::from(div), count, max_value);
    }
    out
}

fn hist_json(buckets: &BTreeMap<u32, u64>, div: u32) -> String {
    let values = dense(buckets, HIST_BUCKETS);
    let Some((lo, hi, _)) = hist_prepare(&values) else {
        return "[]".to_string();
    };
    let mut parts = Vec::new();
    for (i, &count) in values.iter().enumerate().take(hi + 1).skip(lo) {
        let range = match i {
            0 => "\"max\": -1, ".to_string(),
            1 => "\"min\": 0, \"max\": 0, ".to_string(),
            2 => "\"min\": 1, \"max\": 1, ".to_string(),
            _ => {
                // `1 << n` on an int, as x86 computes it (n taken mod 32).
                let low = 1i32.wrapping_shl(i as u32 - 2);
                let high = 1i32.wrapping_shl(i as u32 - 1).wrapping_sub(1);
                format!("\"min\": {low}, \"max\": {high}, ")
            }
        };
        parts.push(format!("{{{range}\"count\": {}}}", count / u64::from(div)));
    }
    format!("[{}]", parts.join(", "))
}

/// TextOutput::lhist_index_label.
fn lhist_index_label(n: i64) -> String {
    if n == 0 {
        "0".to_string()
    } else if n % 1_048_576 == 0 {
        format!("{}M", n / 1_048_576)
    } else if n % 1024 == 0 {
        format!("{}K", n / 1024)
    } else {
        n.to_string()
    }
}

struct LhistShape {
    n: i64,
    start: usize,
    end: usize,
    max_value: i32,
}

/// Output::lhist_prepare (counts read into an `int` again).
fn lhist_prepare(values: &[u64], min: i64, max: i64, step: i64) -> Option<LhistShape> {
    let mut any = false;
    let mut max_value = 0i32;
    for &c in values {
        let v = c as i32;
        any |= v != 0;
        max_value = max_value.max(v);
    }
    if !any {
        return None;
    }
    // bpftrace validates these at parse time; wrap rather than panic.
    let n = if step == 0 {
        0
    } else {
        max.wrapping_sub(min).wrapping_div(step)
    };
    let mut start = None;
    let mut end = 0;
    for (i, &c) in values.iter().enumerate().take((n + 2).max(0) as usize) {
        if c > 0 {
            start.get_or_insert(i);
            end = i;
        }
    }
    Some(LhistShape {
        n,
        start: start.unwrap_or(0),
        end,
        max_value,
    })
}

/// The lowest value of in-range lhist bucket `i` (1-based).
fn bucket_low(i: i64, min: i64, step: i64) -> i64 {
    (i - 1).wrapping_mul(step).wrapping_add(min)
}

fn lhist_text(min: i64, max: i64, step: i64, buckets: &BTreeMap<u32, u64>) -> String {
    let values = dense(buckets, LHIST_BUCKETS);
    let Some(s) = lhist_prepare(&values, min, max, step) else {
        return String::new();
    };
    let mut out = String::new();
    for (i, &count) in values.iter().enumerate().take(s.end + 1).skip(s.start) {
        let i64i = i as i64;
        let header = if i == 0 {
            format!("(..., {})", lhist_index_label(min))
        } else if i64i == s.n + 1 {
            format!("[{}, ...)", lhist_index_label(max))
        } else {
            format!(
                "[{}, {})",
                lhist_index_label(bucket_low(i64i, min, step)),
                lhist_index_label(bucket_low(i64i + 1, min, step))
            )
        };
        // lhist counts are never divided.
        hist_line(&mut out, &header, count, count, s.max_value);
    }
    out
}

fn lhist_json(min: i64, max: i64, step: i64, buckets: &BTreeMap<u32, u64>) -> String {
    let values = dense(buckets, LHIST_BUCKETS);
    let Some(s) = lhist_prepare(&values, min, max, step) else {
        return "[]".to_string();
    };
    let mut parts = Vec::new();
    for (i, &count) in values.iter().enumerate().take(s.end + 1).skip(s.start) {
        let i64i = i as i64;
        let range = if i == 0 {
            format!("\"max\": {}, ", min.wrapping_sub(1))
        } else if i64i == s.n + 1 {
            format!("\"min\": {max}, ")
        } else {
            let low = bucket_low(i64i, min, step);
            let high = bucket_low(i64i + 1, min, step).wrapping_sub(1);
            format!("\"min\": {low}, \"max\": {high}, ")
        };
        parts.push(format!("{{{range}\"count\": {count}}}"));
    }
    format!("[{}]", parts.join(", "))
}

// ---------------------------------------------------------------- maps

fn agg_text(a: &Agg, div: u32) -> String {
    let d = i64::from(div);
    match a {
        Agg::Scalar(v) => value_str(v, div),
        Agg::Count(c) => (c / u64::from(div)).to_string(),
        Agg::Sum(s) => s.wrapping_div(d).to_string(),
        Agg::Min(m) | Agg::Max(m) => (m / i128::from(div.max(1))).to_string(),
        Agg::Avg { count, sum } => avg_of(*count, *sum).wrapping_div(d).to_string(),
        // stats() ignores div.
        Agg::Stats { count, sum } => format!(
            "count {}, average {}, total {}",
            *count as i64,
            avg_of(*count, *sum),
            sum
        ),
        Agg::Hist(b) => hist_text(b, div),
        Agg::Lhist {
            min,
            max,
            step,
            buckets,
        } => lhist_text(*min, *max, *step, buckets),
    }
}

fn agg_json(a: &Agg, div: u32) -> String {
    match a {
        Agg::Scalar(v) => json_value_str(v, div),
        Agg::Stats { count, sum } => format!(
            "{{\"count\": {}, \"average\": {}, \"total\": {}}}",
            *count as i64,
            avg_of(*count, *sum),
            sum
        ),
        Agg::Hist(b) => hist_json(b, div),
        Agg::Lhist {
            min,
            max,
            step,
            buckets,
        } => lhist_json(*min, *max, *step, buckets),
        _ => agg_text(a, div),
    }
}

/// Maps whose value is a stack or a symbol are joined with no newline
/// (TextOutput::map_elem_delim_to_str): the stack text ends in one, a ksym
/// does not, so ksym maps run together on one line, as in bpftrace.
fn text_delim(a: &Agg) -> &'static str {
    match a {
        Agg::Scalar(Value::Stack(_)) | Agg::Scalar(Value::Text(_)) => "",
        _ => "\n",
    }
}

/// What print(@map), print(@map, top, div) and the maps printed at exit
/// write, exactly as bpftrace 0.17: count/sum/min/max/integer maps sorted by
/// value ascending, string/stack-valued maps by key, hist/lhist by total
/// count, avg/stats by average; `top` keeps the last (largest) `top`
/// entries; `div` divides counts, sums, averages and hist counts (not lhist
/// or stats, as bpftrace). Ends with a newline (two after avg/stats, and hist
/// text already ends in one, so hist maps end in a blank line).
///
/// An empty map prints "\n"; an empty avg()/stats() map prints "\n\n" in
/// bpftrace, but an empty MapData cannot say it is one, so call
/// [`print_empty_map`] for those.
pub fn print_map(out: &mut String, map: &MapData, top: usize, div: u64) {
    let div = norm_div(div);
    let Some(first) = map.entries.first() else {
        out.push('\n');
        return;
    };
    let kind = first.1.kind();
    let order = apply_top(sorted_order(map), top, kind);
    let mut elems = Vec::with_capacity(order.len());
    for i in order {
        let (key, agg) = &map.entries[i];
        let mut s = map.name.clone();
        if !key.is_empty() {
            let parts: Vec<String> = key.iter().map(key_part_str).collect();
            s.push('[');
            s.push_str(&parts.join(", "));
            s.push(']');
        }
        s.push_str(": ");
        if matches!(kind, AggKind::Hist | AggKind::Lhist) {
            s.push('\n');
        }
        s.push_str(&agg_text(agg, div));
        elems.push(s);
    }
    out.push_str(&elems.join(text_delim(&first.1)));
    out.push('\n');
    if matches!(kind, AggKind::Avg | AggKind::Stats) {
        out.push('\n');
    }
}

/// What bpftrace prints for a map with no entries, by the map's function.
pub fn print_empty_map(out: &mut String, kind: AggKind) {
    out.push('\n');
    if matches!(kind, AggKind::Avg | AggKind::Stats) {
        out.push('\n');
    }
}

/// print(value) of a non-map value (print(5), print("a"), print(comm)).
pub fn print_value(out: &mut String, v: &Value) {
    out.push_str(&value_str(v, 1));
    out.push('\n');
}

/// "Attaching N probe(s)...\n", which bpftrace writes to stdout once the
/// probes are attached, before any output of BEGIN.
pub fn attaching(n: usize) -> String {
    if n == 1 {
        "Attaching 1 probe...\n".to_string()
    } else {
        format!("Attaching {n} probes...\n")
    }
}

/// Text for lost perf events.
pub fn lost_events(n: u64) -> String {
    format!("Lost {n} events\n")
}

/// Sorts map names into the order bpftrace 0.17 prints them at exit.
///
/// What bpftrace 0.17 writes, all on stdout:
/// - at start, once the probes are attached, "Attaching 1 probe...\n" or
///   "Attaching N probes...\n" (`-f json`: `{"type": "attached_probes",
///   "data": {"probes": N}}`); it comes before anything BEGIN prints.
///   (stderr gets only diagnostics, e.g. the RLIMIT_MEMLOCK notice and
///   parse-time warnings.)
/// - when the program ends (exit(), Ctrl-C, or the traced command exiting),
///   after END's output: [`EXIT_SEPARATOR`], i.e. "\n\n", written straight
///   to std::cout, so also in `-f json` mode and even with `-o FILE`.
/// - then every map the script names, including empty ones, each as
///   print(@map) would print it ([`print_map`]): in name order, i.e. byte
///   order ("@" < "@A" < "@_x" < "@a" < "@ab" < "@b"), not the order of the
///   script, since bpftrace keeps its maps in a std::map by name. No blank
///   line is added between maps: the blank lines seen come from the maps
///   themselves (hist/lhist end in one, avg/stats add one, an empty map is
///   an empty line, two for empty avg/stats). In `-f json` mode empty maps
///   print nothing and each other map is one line ([`json_map`]).
pub fn exit_maps_order(names: &mut Vec<String>) {
    names.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    names.dedup();
}

// ---------------------------------------------------------------- JSON

/// One `-f json` line for a map, without its newline (as every `json_*`
/// function here: the writer ends the line); "" for an empty map, which
/// bpftrace skips in JSON mode, so write nothing at all then. Types: "map"
/// for scalar/count/sum/min/max, "hist" for hist/lhist, "stats" for
/// avg/stats; keys are the key parts joined with "," (no space) as a JSON
/// string. Sorting, `top` and `div` as in [`print_map`].
pub fn json_map(map: &MapData, top: usize, div: u64) -> String {
    let div = norm_div(div);
    let Some(first) = map.entries.first() else {
        return String::new();
    };
    let kind = first.1.kind();
    let ty = match kind {
        AggKind::Hist | AggKind::Lhist => "hist",
        AggKind::Avg | AggKind::Stats => "stats",
        _ => "map",
    };
    let keyed = !first.0.is_empty();
    let order = apply_top(sorted_order(map), top, kind);
    let mut elems = Vec::with_capacity(order.len());
    for i in order {
        let (key, agg) = &map.entries[i];
        let val = agg_json(agg, div);
        if key.is_empty() {
            elems.push(val);
        } else {
            let parts: Vec<String> = key.iter().map(key_part_str).collect();
            elems.push(format!(
                "\"{}\": {val}",
                json_escape(parts.join(",").as_bytes())
            ));
        }
    }
    let body = elems.join(", ");
    let name = json_escape(map.name.as_bytes());
    if keyed {
        format!("{{\"type\": \"{ty}\", \"data\": {{\"{name}\": {{{body}}}}}}}")
    } else {
        format!("{{\"type\": \"{ty}\", \"data\": {{\"{name}\": {body}}}}}")
    }
}

fn json_message(ty: &str, text: &str) -> String {
    format!(
        "{{\"type\": \"{ty}\", \"data\": \"{}\"}}",
        json_escape(text.as_bytes())
    )
}

/// The `-f json` line for one printf's output (as [`printf`] made it).
pub fn json_printf(text: &str) -> String {
    json_message("printf", text)
}

/// The `-f json` line for what a command system() ran printed.
pub fn json_system(text: &str) -> String {
    json_message("syscall", text)
}

/// The `-f json` line for a file cat() printed.
pub fn json_cat(text: &str) -> String {
    json_message("cat", text)
}

/// The `-f json` line for time()'s output; "" when [`time`] gave "" (its
/// strftime failed, and bpftrace then prints nothing at all: write no line).
pub fn json_time(text: &str) -> String {
    if text.is_empty() {
        return String::new();
    }
    json_message("time", text)
}

/// The `-f json` line bpftrace writes once the probes are attached.
pub fn json_attached(n: usize) -> String {
    format!("{{\"type\": \"attached_probes\", \"data\": {{\"probes\": {n}}}}}")
}

/// The `-f json` line for lost perf events.
pub fn json_lost_events(n: u64) -> String {
    format!("{{\"type\": \"lost_events\", \"data\": {{\"events\": {n}}}}}")
}

/// The `-f json` line for print(value).
pub fn json_value(v: &Value) -> String {
    format!(
        "{{\"type\": \"value\", \"data\": {}}}",
        json_value_str(v, 1)
    )
}

// ---------------------------------------------------------------- time

/// time(fmt): strftime of the local time at `unix_ns` (whole seconds, as
/// bpftrace's time(NULL)), into bpftrace's 64-byte buffer; "" when the
/// result does not fit or is empty (bpftrace logs "strftime returned 0" to
/// stderr and prints nothing). Unlike strftime(), time() has no `%f`. No
/// newline is added: the default format ends in one.
pub fn time(fmt: Option<&str>, unix_ns: i128) -> String {
    let fmt = fmt.unwrap_or(DEFAULT_TIME_FORMAT);
    let Ok(secs) = libc::time_t::try_from(unix_ns.div_euclid(1_000_000_000)) else {
        return String::new();
    };
    // The format is a C string in bpftrace, so it ends at a NUL.
    let Ok(cfmt) = std::ffi::CString::new(c_str(fmt.as_bytes())) else {
        return String::new();
    };
    // SAFETY: an all-zero `tm` is a valid value (tm_zone null).
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are to live locals of the right types.
    if unsafe { libc::localtime_r(&secs, &mut tm) }.is_null() {
        return String::new();
    }
    let mut buf = [0u8; 64];
    // SAFETY: buf is writable for its length, cfmt is NUL-terminated and tm
    // was filled by localtime_r.
    let n = unsafe { libc::strftime(buf.as_mut_ptr().cast(), buf.len(), cfmt.as_ptr(), &tm) };
    if n == 0 || n > buf.len() {
        return String::new();
    }
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

// ---------------------------------------------------------------- printf

/// bpftrace's printf_format_types, all 64-bit integers except `s` (string)
/// and `r`/`rx`/`rh` (buf()), longest first where one is a prefix of
/// another (its regex picks `%rx` over `%r`).
const FORMAT_TYPES: &[&str] = &[
    "rx", "rh", "s", "r", "c", "d", "u", "o", "x", "X", "p", "hhd", "hhu", "hho", "hhx", "hhX",
    "hhp", "hd", "hu", "ho", "hx", "hX", "hp", "ld", "lu", "lo", "lx", "lX", "lp", "lld", "llu",
    "llo", "llx", "llX", "llp", "jd", "ju", "jo", "jx", "jX", "jp", "zd", "zu", "zo", "zx", "zX",
    "zp", "td", "tu", "to", "tx", "tX", "tp",
];

/// bpftrace's limit: printf() takes up to 128 arguments, format included.
const MAX_PRINTF_ARGS: usize = 128;

#[derive(Debug, Clone, Copy)]
struct Token {
    end: usize,
    ty: &'static str,
}

/// Matches bpftrace's `%-?[0-9]*(\.[0-9]+)?(TYPES)` at `i`.
fn token_at(b: &[u8], i: usize) -> Option<Token> {
    let mut j = i + 1;
    if b.get(j) == Some(&b'-') {
        j += 1;
    }
    while b.get(j).is_some_and(u8::is_ascii_digit) {
        j += 1;
    }
    if b.get(j) == Some(&b'.') && b.get(j + 1).is_some_and(u8::is_ascii_digit) {
        j += 1;
        while b.get(j).is_some_and(u8::is_ascii_digit) {
            j += 1;
        }
    }
    let rest = &b[j.min(b.len())..];
    let ty = FORMAT_TYPES
        .iter()
        .filter(|t| rest.starts_with(t.as_bytes()))
        .max_by_key(|t| t.len())?;
    Some(Token {
        end: j + ty.len(),
        ty,
    })
}

/// The conversions bpftrace counts, found as its std::regex_iterator does.
fn tokens(b: &[u8]) -> Vec<Token> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            if let Some(t) = token_at(b, i) {
                out.push(t);
                i = t.end;
                continue;
            }
        }
        i += 1;
    }
    out
}

fn kind_type_name(k: ArgKind) -> &'static str {
    match k {
        ArgKind::Int => "integer",
        ArgKind::Buf => "buffer",
        _ => "string",
    }
}

fn token_type_name(ty: &str) -> &'static str {
    match ty {
        "s" => "string",
        "r" | "rx" | "rh" => "buffer",
        _ => "integer",
    }
}

/// One conversion as glibc's printf parses it.
#[derive(Debug, Clone, Copy, Default)]
struct Spec {
    minus: bool,
    plus: bool,
    space: bool,
    hash: bool,
    zero: bool,
    width: usize,
    prec: Option<usize>,
    /// Argument width in bytes for integer conversions (1, 2, 4 or 8).
    int_bytes: u8,
    has_len: bool,
    conv: u8,
}

#[derive(Debug, Clone)]
enum Seg {
    Lit(Vec<u8>),
    Conv(Spec),
}

fn undefined(part: &[u8], why: &str) -> FormatError {
    FormatError::new(format!(
        "printf: \"{}\" {why}: bpftrace 0.17 passes it to snprintf as is and prints garbage",
        String::from_utf8_lossy(part).escape_debug()
    ))
}

/// Parses one part of the format the way glibc's snprintf will, so that a
/// part that would read an argument bpftrace never passed is refused rather
/// than printed as garbage.
fn glibc_segments(part: &[u8]) -> Result<Vec<Seg>, FormatError> {
    let b = c_str(part);
    let mut segs = Vec::new();
    let mut lit = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'%' {
            lit.push(b[i]);
            i += 1;
            continue;
        }
        let mut s = Spec {
            int_bytes: 4,
            ..Spec::default()
        };
        let mut k = i + 1;
        while let Some(&c) = b.get(k) {
            match c {
                b'-' => s.minus = true,
                b'+' => s.plus = true,
                b' ' => s.space = true,
                b'#' => s.hash = true,
                b'0' => s.zero = true,
                // Grouping and locale digits change nothing in the C locale.
                b'\'' | b'I' => {}
                _ => break,
            }
            k += 1;
        }
        while let Some(&c) = b.get(k).filter(|c| c.is_ascii_digit()) {
            s.width = s
                .width
                .saturating_mul(10)
                .saturating_add(usize::from(c - b'0'));
            k += 1;
        }
        if s.width > i32::MAX as usize {
            // glibc fails with EOVERFLOW and bpftrace exits.
            return Err(undefined(part, "has a width past INT_MAX"));
        }
        if b.get(k) == Some(&b'.') {
            k += 1;
            let mut p = 0usize;
            while let Some(&c) = b.get(k).filter(|c| c.is_ascii_digit()) {
                p = p.saturating_mul(10).saturating_add(usize::from(c - b'0'));
                k += 1;
            }
            if p > i32::MAX as usize {
                return Err(undefined(part, "has a precision past INT_MAX"));
            }
            s.prec = Some(p);
        }
        let rest = &b[k.min(b.len())..];
        let (len, bytes) = if rest.starts_with(b"hh") {
            (2, 1)
        } else if rest.starts_with(b"ll") {
            (2, 8)
        } else {
            match rest.first() {
                Some(b'h') => (1, 2),
                Some(b'l' | b'q' | b'L' | b'j' | b'z' | b'Z' | b't') => (1, 8),
                _ => (0, 4),
            }
        };
        k += len;
        s.has_len = len > 0;
        s.int_bytes = bytes;
        let Some(&conv) = b.get(k) else {
            return Err(undefined(part, "ends inside a conversion"));
        };
        s.conv = conv;
        match conv {
            // glibc prints a lone '%' whatever the flags and width.
            b'%' => lit.push(b'%'),
            b'd' | b'i' | b'u' | b'o' | b'x' | b'X' | b'p' => {
                segs.push(Seg::Lit(std::mem::take(&mut lit)));
                segs.push(Seg::Conv(s));
            }
            b'c' | b's' if !s.has_len => {
                segs.push(Seg::Lit(std::mem::take(&mut lit)));
                segs.push(Seg::Conv(s));
            }
            _ => {
                let spec = String::from_utf8_lossy(&b[i..=k]).into_owned();
                return Err(undefined(
                    part,
                    &format!("has {spec}, which bpftrace does not handle"),
                ));
            }
        }
        i = k + 1;
    }
    segs.push(Seg::Lit(lit));
    Ok(segs)
}

/// A checked format: the parts bpftrace hands to snprintf, one per
/// argument, and the text after the last conversion (printed verbatim).
struct Plan<'a> {
    parts: Vec<(Vec<Seg>, &'a [u8])>,
    tail: &'a [u8],
}

fn plan<'a>(fmt: &'a str, kinds: &[ArgKind]) -> Result<Plan<'a>, FormatError> {
    let nargs = kinds.len();
    if nargs + 1 > MAX_PRINTF_ARGS {
        return Err(FormatError::new(format!(
            "printf() takes up to {MAX_PRINTF_ARGS} arguments ({} provided)",
            nargs + 1
        )));
    }
    let b = fmt.as_bytes();
    let toks = tokens(b);
    if nargs < toks.len() {
        return Err(FormatError::new(format!(
            "printf: Not enough arguments for format string ({nargs} supplied, {} expected)",
            toks.len()
        )));
    }
    if nargs > toks.len() {
        return Err(FormatError::new(format!(
            "printf: Too many arguments for format string ({nargs} supplied, {} expected)",
            toks.len()
        )));
    }
    for (t, &k) in toks.iter().zip(kinds) {
        let want = token_type_name(t.ty);
        let have = kind_type_name(k);
        if want != have {
            return Err(FormatError::new(format!(
                "printf: %{} specifier expects a value of type {want} ({have} supplied)",
                t.ty
            )));
        }
    }
    let mut parts = Vec::with_capacity(toks.len());
    let mut last = 0;
    for (t, &k) in toks.iter().zip(kinds) {
        let part = &b[last..t.end];
        last = t.end;
        // bpftrace hands a buffer's %r to snprintf as %s of its text.
        let segs = match t.ty.strip_prefix('r') {
            Some(rest) if t.ty.starts_with('r') => {
                let mut p = part[..part.len() - 1 - rest.len()].to_vec();
                p.push(b's');
                glibc_segments(&p)?
            }
            _ => glibc_segments(part)?,
        };
        let mut convs = segs.iter().filter_map(|s| match s {
            Seg::Conv(c) => Some(c),
            Seg::Lit(_) => None,
        });
        // Zero conversions is fine: e.g. "%%d" prints "%d" and drops the arg.
        if let Some(c) = convs.next() {
            if convs.next().is_some() {
                return Err(undefined(
                    part,
                    "reads more than the one argument bpftrace passes",
                ));
            }
            let wants_str = c.conv == b's';
            if wants_str != (k != ArgKind::Int) {
                return Err(undefined(part, "converts the argument as the wrong type"));
            }
        }
        parts.push((segs, part));
    }
    Ok(Plan {
        parts,
        tail: &b[last..],
    })
}

/// Checks a format against argument kinds without values (used before the
/// script runs): the same rules, and the same errors, as [`printf`].
pub fn check_format(fmt: &str, kinds: &[ArgKind]) -> Result<(), FormatError> {
    plan(fmt, kinds).map(|_| ())
}

/// bpftrace's printf. Conversions are those bpftrace 0.17 recognises:
/// `%[-][width][.prec]` then `s`, `c`, or `d u o x X p` with an optional
/// `hh h l ll j z t` (a leading 0 in the width zero-pads). Each argument
/// goes to snprintf as a 64-bit value, so `%d`/`%u`/`%x` print its low 32
/// bits (-1 under `%u` is 4294967295), `%ld`/`%lld`/`%lu`/`%lx` all 64, `%hhd`
/// the low byte; `%c` takes the low byte and a NUL ends that conversion's
/// output; `%p` is `0x...` or `(nil)`.
///
/// Not conversions to bpftrace: `%i`, `%%`, and `+`, space and `#` flags.
/// With no arguments the format prints verbatim (`%%` stays `%%`); with
/// arguments, text up to each conversion goes through snprintf (`%%` there
/// prints `%`) and text after the last one prints verbatim (`%%` again).
/// A stray conversion glibc would read a second value for (say `%+d` before
/// a `%d`) is an error here, where bpftrace prints stack garbage.
///
/// Errors, one line, worded as bpftrace's: argument count mismatch, type
/// mismatch (`%d` given a string, `%s` an integer), more than 128 args.
///
/// Output bytes are those glibc writes; `%.Ns` can cut a UTF-8 character,
/// and such bytes are replaced by U+FFFD in the returned String.
pub fn printf(fmt: &str, args: &[Value]) -> Result<String, FormatError> {
    let kinds: Vec<ArgKind> = args.iter().map(Value::kind).collect();
    let p = plan(fmt, &kinds)?;
    let mut out = Vec::new();
    for ((segs, _), arg) in p.parts.iter().zip(args) {
        let mut buf = Vec::new();
        for seg in segs {
            match seg {
                Seg::Lit(l) => buf.extend_from_slice(l),
                Seg::Conv(s) => format_conv(&mut buf, s, arg),
            }
        }
        // bpftrace streams the snprintf buffer as a C string.
        out.extend_from_slice(c_str(&buf));
    }
    out.extend_from_slice(p.tail);
    Ok(match String::from_utf8(out) {
        Ok(s) => s,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    })
}

fn pad(out: &mut Vec<u8>, s: &Spec, body: &[u8]) {
    let fill = s.width.saturating_sub(body.len());
    if s.minus {
        out.extend_from_slice(body);
        out.resize(out.len() + fill, b' ');
    } else {
        out.resize(out.len() + fill, b' ');
        out.extend_from_slice(body);
    }
}

fn format_conv(out: &mut Vec<u8>, s: &Spec, arg: &Value) {
    let bits = match arg {
        Value::Int(i) => *i as u64,
        Value::UInt(u) => *u,
        _ => 0,
    };
    match s.conv {
        b's' => {
            let text = match arg {
                Value::Str(t) | Value::Text(t) => t.clone(),
                Value::Buf(b) => buf_text(b),
                Value::Stack(f) => stack_str(f, 8),
                Value::Tuple(_) => value_str(arg, 1),
                Value::Int(_) | Value::UInt(_) => String::new(),
            };
            let mut body = c_str(text.as_bytes());
            if let Some(p) = s.prec {
                body = &body[..p.min(body.len())];
            }
            pad(out, s, body);
        }
        // int -> unsigned char; glibc pads %c (and strings) with spaces.
        b'c' => pad(out, s, &[bits as u8]),
        b'p' if bits == 0 => pad(out, s, b"(nil)"),
        _ => format_int(out, s, bits),
    }
}

/// glibc's integer conversions for the 64 bits bpftrace passes.
fn format_int(out: &mut Vec<u8>, s: &Spec, bits: u64) {
    let pointer = s.conv == b'p';
    let signed = matches!(s.conv, b'd' | b'i');
    // %p ignores length modifiers and takes all 64 bits.
    let bytes = if pointer { 8 } else { s.int_bytes };
    let (neg, mag) = if signed {
        let v = match bytes {
            1 => i64::from(bits as u8 as i8),
            2 => i64::from(bits as u16 as i16),
            4 => i64::from(bits as u32 as i32),
            _ => bits as i64,
        };
        (v < 0, v.unsigned_abs())
    } else {
        let v = match bytes {
            1 => u64::from(bits as u8),
            2 => u64::from(bits as u16),
            4 => u64::from(bits as u32),
            _ => bits,
        };
        (false, v)
    };
    let mut digits = match s.conv {
        b'o' => format!("{mag:o}"),
        b'x' | b'p' => format!("{mag:x}"),
        b'X' => format!("{mag:X}"),
        _ => mag.to_string(),
    }
    .into_bytes();
    if s.prec == Some(0) && mag == 0 {
        digits.clear();
    }
    if let Some(p) = s.prec {
        if digits.len() < p {
            let mut z = vec![b'0'; p - digits.len()];
            z.extend_from_slice(&digits);
            digits = z;
        }
    }
    if s.hash && s.conv == b'o' && digits.first() != Some(&b'0') {
        digits.insert(0, b'0');
    }
    let mut prefix: Vec<u8> = Vec::new();
    if signed || pointer {
        if neg {
            prefix.push(b'-');
        } else if s.plus {
            prefix.push(b'+');
        } else if s.space {
            prefix.push(b' ');
        }
    }
    if pointer || (s.hash && mag != 0 && matches!(s.conv, b'x' | b'X')) {
        prefix.extend_from_slice(if s.conv == b'X' { b"0X" } else { b"0x" });
    }
    let len = prefix.len() + digits.len();
    if !s.minus && s.zero && s.prec.is_none() && s.width > len {
        out.extend_from_slice(&prefix);
        out.resize(out.len() + (s.width - len), b'0');
        out.extend_from_slice(&digits);
    } else {
        let mut body = prefix;
        body.extend_from_slice(&digits);
        pad(out, s, &body);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where the goldens live, relative to CARGO_MANIFEST_DIR.
    const GOLDEN_DIR: &str = "tests/golden/bpftrace";

    fn golden(name: &str) -> String {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join(GOLDEN_DIR)
            .join(name);
        match std::fs::read_to_string(&path) {
            Ok(s) => s,
            Err(e) => panic!("{}: {e}", path.display()),
        }
    }

    fn check(name: &str, text: &str, json: &str) {
        let want = golden(&format!("{name}.out"));
        assert_eq!(text, want, "{name}.out");
        let want = golden(&format!("{name}.json.out"));
        assert_eq!(json, want, "{name}.json.out");
    }

    /// A JSON line as a writer puts it out: nothing for "".
    fn line(s: String) -> String {
        if s.is_empty() {
            s
        } else {
            s + "\n"
        }
    }

    /// Builds both outputs of one bpftrace run from what the script did.
    struct Run {
        text: String,
        json: String,
    }

    impl Run {
        fn new(probes: usize) -> Run {
            Run {
                text: attaching(probes),
                json: line(json_attached(probes)),
            }
        }

        fn printf(&mut self, fmt: &str, args: &[Value]) {
            let s = match printf(fmt, args) {
                Ok(s) => s,
                Err(e) => panic!("{fmt:?}: {e}"),
            };
            self.text.push_str(&s);
            self.json.push_str(&line(json_printf(&s)));
        }

        fn print_value(&mut self, v: Value) {
            print_value(&mut self.text, &v);
            self.json.push_str(&line(json_value(&v)));
        }

        fn print(&mut self, m: &MapData, top: usize, div: u64) {
            print_map(&mut self.text, m, top, div);
            self.json.push_str(&line(json_map(m, top, div)));
        }

        fn time(&mut self, fmt: &str) {
            let s = time(Some(fmt), 0);
            self.text.push_str(&s);
            self.json.push_str(&line(json_time(&s)));
        }

        /// The maps printed at exit, given in any order.
        fn exit(mut self, maps: &[MapData], empty: &[(&str, AggKind)]) -> (String, String) {
            self.text.push_str(EXIT_SEPARATOR);
            self.json.push_str(EXIT_SEPARATOR);
            let mut names: Vec<String> = maps.iter().map(|m| m.name.clone()).collect();
            names.extend(empty.iter().map(|e| e.0.to_string()));
            exit_maps_order(&mut names);
            for n in names {
                if let Some(m) = maps.iter().find(|m| m.name == n) {
                    print_map(&mut self.text, m, 0, 0);
                    self.json.push_str(&line(json_map(m, 0, 0)));
                } else if let Some(e) = empty.iter().find(|e| e.0 == n) {
                    print_empty_map(&mut self.text, e.1);
                }
            }
            (self.text, self.json)
        }
    }

    fn map(name: &str, entries: Vec<(Vec<Value>, Agg)>) -> MapData {
        MapData {
            name: name.to_string(),
            entries,
        }
    }

    fn one(name: &str, a: Agg) -> MapData {
        map(name, vec![(vec![], a)])
    }

    fn i(v: i64) -> Value {
        Value::Int(v)
    }

    fn u(v: u64) -> Value {
        Value::UInt(v)
    }

    fn s(v: &str) -> Value {
        Value::Str(v.to_string())
    }

    fn stack(frames: &[&str]) -> Value {
        Value::Stack(frames.iter().map(|f| f.to_string()).collect())
    }

    fn hist(b: &[(u32, u64)]) -> Agg {
        Agg::Hist(b.iter().copied().collect())
    }

    fn lhist(min: i64, max: i64, step: i64, b: &[(u32, u64)]) -> Agg {
        Agg::Lhist {
            min,
            max,
            step,
            buckets: b.iter().copied().collect(),
        }
    }

    /// hist() bucket index of a value, as bpftrace 0.17's log2 codegen,
    /// whose five shift steps stop at 2^31: everything from 2G up lands in
    /// bucket 33 ("[2G, 4G)").
    fn hb(v: i64) -> u32 {
        if v < 0 {
            0
        } else if v == 0 {
            1
        } else {
            2 + (63 - (v as u64).leading_zeros()).min(31)
        }
    }

    /// Adds values to hist buckets.
    fn hist_of(vals: &[i64]) -> Agg {
        let mut b = BTreeMap::new();
        for &v in vals {
            *b.entry(hb(v)).or_insert(0) += 1;
        }
        Agg::Hist(b)
    }

    /// lhist() bucket index of a value.
    fn lb(v: i64, min: i64, max: i64, step: i64) -> u32 {
        if v < min {
            0
        } else if v >= max {
            ((max - min) / step + 1) as u32
        } else {
            ((v - min) / step + 1) as u32
        }
    }

    fn lhist_of(vals: &[i64], min: i64, max: i64, step: i64) -> Agg {
        let mut b = BTreeMap::new();
        for &v in vals {
            *b.entry(lb(v, min, max, step)).or_insert(0) += 1;
        }
        Agg::Lhist {
            min,
            max,
            step,
            buckets: b,
        }
    }

    fn lhist_of_keyed(k: Value, vals: &[i64], min: i64, max: i64, step: i64) -> (Vec<Value>, Agg) {
        (vec![k], lhist_of(vals, min, max, step))
    }

    #[test]
    fn sorting() {
        let run = Run::new(1);
        let text = |v: &str| Value::Text(v.to_string());
        let maps = vec![
            map(
                "@cnt",
                vec![
                    (vec![s("c")], Agg::Count(3)),
                    (vec![s("a")], Agg::Count(1)),
                    (vec![s("b")], Agg::Count(2)),
                ],
            ),
            map(
                "@sum",
                vec![
                    (vec![i(1)], Agg::Sum(-10)),
                    (vec![i(2)], Agg::Sum(3)),
                    (vec![i(3)], Agg::Sum(-1)),
                    (vec![i(4)], Agg::Sum(1_000_000_000_000)),
                ],
            ),
            map(
                "@mn",
                vec![
                    (vec![i(1)], Agg::Min(-3)),
                    (vec![i(2)], Agg::Min(10)),
                    (vec![i(3)], Agg::Min(0)),
                ],
            ),
            map(
                "@mx",
                vec![
                    (vec![i(1)], Agg::Max(10)),
                    (vec![i(2)], Agg::Max(3)),
                    (vec![i(3)], Agg::Max(4_000_000_000)),
                ],
            ),
            map(
                "@int",
                vec![
                    (vec![i(1)], Agg::Scalar(i(100))),
                    (vec![i(2)], Agg::Scalar(i(-100))),
                    (vec![i(3)], Agg::Scalar(i(0))),
                ],
            ),
            map(
                "@uint",
                vec![
                    (vec![i(1)], Agg::Scalar(u(u64::MAX))),
                    (vec![i(2)], Agg::Scalar(u(5))),
                ],
            ),
            map(
                "@name",
                vec![
                    (vec![i(3)], Agg::Scalar(s("c"))),
                    (vec![i(1)], Agg::Scalar(s("a"))),
                    (vec![i(-1)], Agg::Scalar(s("neg"))),
                    (vec![i(256)], Agg::Scalar(s("x"))),
                    (vec![u(u64::MAX - 1)], Agg::Scalar(s("big"))),
                ],
            ),
            map(
                "@sk",
                vec![
                    (vec![s("b")], Agg::Scalar(s("2"))),
                    (vec![s("a")], Agg::Scalar(s("1"))),
                    (vec![s("ab")], Agg::Scalar(s("3"))),
                    (vec![s("B")], Agg::Scalar(s("4"))),
                    (vec![s("")], Agg::Scalar(s("empty"))),
                ],
            ),
            map(
                "@multi",
                vec![
                    (vec![s("b"), i(1)], Agg::Scalar(s("x"))),
                    (vec![s("a"), i(2)], Agg::Scalar(s("y"))),
                    (vec![s("a"), i(1)], Agg::Scalar(s("z"))),
                ],
            ),
            map("@mixed", vec![(vec![i(7), s("k"), i(-2)], Agg::Count(1))]),
            map("@ukey", vec![(vec![u(u64::MAX)], Agg::Scalar(i(1)))]),
            map(
                "@ks",
                vec![
                    (vec![i(2)], Agg::Scalar(text("0"))),
                    (vec![i(1)], Agg::Scalar(text("0"))),
                ],
            ),
            map("@probe", vec![(vec![text("BEGIN")], Agg::Count(1))]),
            one("@last", Agg::Scalar(s("BEGIN"))),
            one("@", Agg::Scalar(i(1))),
            one("@A", Agg::Scalar(i(2))),
            one("@_x", Agg::Scalar(i(3))),
        ];
        let (t, j) = run.exit(&maps, &[]);
        check("sorting", &t, &j);
    }

    #[test]
    fn hists() {
        let run = Run::new(1);
        let mut tie: Vec<(Vec<Value>, Agg)> =
            (0..20).map(|k| (vec![i(k)], hist_of(&[k]))).collect();
        tie.push((vec![i(300)], hist_of(&[1])));
        tie.push((vec![i(256)], hist_of(&[1])));
        let maps = vec![
            map("@tie", tie),
            one("@one", hist_of(&[1])),
            one("@zero", hist_of(&[0])),
            one("@neg", hist_of(&[-5])),
            one(
                "@big",
                hist_of(&[1_073_741_824, 3_000_000_000, 1_099_511_627_776]),
            ),
            map(
                "@k",
                vec![
                    (vec![s("b")], hist_of(&[10])),
                    (vec![s("a")], hist_of(&[10, 10])),
                    (vec![s("c")], hist_of(&[1])),
                ],
            ),
            one("@lin", lhist_of(&[-1, 3, 3, 100], 0, 10, 1)),
            one("@below", lhist_of(&[-100], 0, 100, 10)),
            one("@above", lhist_of(&[100, 1000], 0, 100, 10)),
            one("@kilo", lhist_of(&[5000, 2048], 0, 10240, 1024)),
            one(
                "@mega",
                lhist_of(&[3_145_728, 5_000_000], 0, 4_194_304, 1_048_576),
            ),
            one("@off", lhist_of(&[2000], 1000, 5096, 1024)),
            map(
                "@lk",
                vec![
                    lhist_of_keyed(i(2), &[5], 0, 10, 5),
                    lhist_of_keyed(i(1), &[5, 0], 0, 10, 5),
                ],
            ),
        ];
        let (t, j) = run.exit(&maps, &[]);
        check("hists", &t, &j);
    }

    #[test]
    fn print_top_div() {
        let mut r = Run::new(1);
        let c = map(
            "@c",
            vec![
                (vec![i(1)], Agg::Count(1)),
                (vec![i(2)], Agg::Count(2)),
                (vec![i(3)], Agg::Count(3)),
            ],
        );
        r.print(&c, 0, 1);
        r.print(&c, 2, 1);
        r.print(&c, 2, 2);
        r.print(&c, 10, 3);
        let n = map(
            "@n",
            vec![
                (vec![i(-7)], Agg::Sum(-7)),
                (vec![i(5)], Agg::Sum(5)),
                (vec![i(9)], Agg::Sum(9)),
            ],
        );
        r.print(&n, 0, 2);
        r.print(&n, 1, 1);
        let st = map(
            "@s",
            vec![
                (vec![i(1)], Agg::Stats { count: 1, sum: 10 }),
                (vec![i(2)], Agg::Stats { count: 2, sum: 50 }),
            ],
        );
        r.print(&st, 1, 10);
        let v = map(
            "@v",
            vec![
                (vec![i(1)], Agg::Avg { count: 1, sum: 10 }),
                (vec![i(2)], Agg::Avg { count: 1, sum: 20 }),
                (vec![i(3)], Agg::Avg { count: 1, sum: -7 }),
            ],
        );
        r.print(&v, 2, 3);
        let h = map(
            "@h",
            vec![
                (vec![i(1)], hist_of(&[3])),
                (vec![i(2)], hist_of(&[3, 9, 9])),
                (vec![i(3)], hist_of(&[100])),
            ],
        );
        r.print(&h, 1, 2);
        r.print(&h, 2, 0);
        let l = map(
            "@l",
            vec![
                lhist_of_keyed(i(1), &[3, 3], 0, 10, 1),
                lhist_of_keyed(i(2), &[-3, 13, 13], 0, 10, 1),
            ],
        );
        r.print(&l, 1, 2);
        let x = one("@x", Agg::Scalar(i(5)));
        r.print(&x, 0, 2);
        let strs = map(
            "@str",
            vec![
                (vec![i(2)], Agg::Scalar(s("two"))),
                (vec![i(1)], Agg::Scalar(s("one"))),
                (vec![i(3)], Agg::Scalar(s("three"))),
            ],
        );
        r.print(&strs, 2, 1);
        let mx = map(
            "@mx",
            vec![(vec![i(1)], Agg::Max(100)), (vec![i(2)], Agg::Max(7))],
        );
        r.print(&mx, 1, 3);
        let mn = map(
            "@mn",
            vec![(vec![i(1)], Agg::Min(-100)), (vec![i(2)], Agg::Min(7))],
        );
        r.print(&mn, 0, 3);
        let (t, j) = r.exit(&[c, n, st, v, h, l, x, strs, mx, mn], &[]);
        check("print_top_div", &t, &j);
    }

    /// Addresses of one recorded run of stacks.bt (they differ per run).
    struct StackRun {
        user: &'static str,
        user3: &'static str,
        /// _einittext offsets of printf's kstack(1), @k, @ks and @ku.
        k: [u64; 4],
    }

    fn stacks_run(a: &StackRun) -> (String, String) {
        let mut r = Run::new(1);
        let top = |o: u64| format!("_einittext+{o}");
        let kframes = [
            "__bpf_prog_test_run_raw_tp+106",
            "bpf_prog_test_run_raw_tp+279",
            "__sys_bpf+2593",
            "__x64_sys_bpf+29",
            "do_syscall_64+113",
            "entry_SYSCALL_64_after_hwframe+118",
        ];
        let kstack = |o: u64, n: usize| {
            let mut f = vec![top(o)];
            f.extend(kframes.iter().take(n - 1).map(|s| s.to_string()));
            Value::Stack(f)
        };
        let u2 = stack(&["syscall+25", a.user]);
        r.printf("[%s]\n", std::slice::from_ref(&u2));
        r.printf("%-10s|\n", &[kstack(a.k[0], 1)]);
        r.print_value(u2.clone());
        let maps = vec![
            map("@k", vec![(vec![kstack(a.k[1], 7)], Agg::Count(1))]),
            map(
                "@u",
                vec![(vec![stack(&["syscall+25", a.user, a.user3])], Agg::Count(1))],
            ),
            map(
                "@ku",
                vec![(vec![kstack(a.k[3], 2), u2.clone()], Agg::Sum(5))],
            ),
            map(
                "@us",
                vec![
                    (vec![i(1)], Agg::Scalar(u2)),
                    // ustack(1) comes back empty from bpftrace 0.17.
                    (vec![i(2)], Agg::Scalar(stack(&[]))),
                ],
            ),
            one("@ks", Agg::Scalar(kstack(a.k[2], 3))),
        ];
        r.exit(&maps, &[])
    }

    #[test]
    fn stacks() {
        let (text, _) = stacks_run(&StackRun {
            user: "0x7fff54bb2408",
            user3: "0x55f0adf63a60",
            k: [1015207827, 1015207090, 1015207682, 1015207354],
        });
        let (_, json) = stacks_run(&StackRun {
            user: "0x7fffcba39618",
            user3: "0x55b819a99a60",
            k: [1015207819, 1015207082, 1015207674, 1015207346],
        });
        check("stacks", &text, &json);
    }

    #[test]
    fn empty_stack() {
        // kstack in a uprobe cannot be looked up: bpftrace prints "".
        let e = stack(&[]);
        assert_eq!(
            printf("[%s]\n", std::slice::from_ref(&e)),
            Ok("[]\n".to_string())
        );
        let mut out = String::new();
        print_value(&mut out, &e);
        assert_eq!(out, "\n");
        let mut out = String::new();
        print_map(
            &mut out,
            &map("@k", vec![(vec![e.clone()], Agg::Count(1))]),
            0,
            0,
        );
        assert_eq!(out, "@k[]: 1\n");
        let mut out = String::new();
        print_map(&mut out, &one("@v", Agg::Scalar(e)), 0, 0);
        assert_eq!(out, "@v: \n");
    }

    #[test]
    fn empty_maps() {
        let mut r = Run::new(1);
        let z = map(
            "@z",
            vec![(vec![i(1)], hist(&[])), (vec![i(2)], hist(&[(4, 0)]))],
        );
        r.print(&map("@a", vec![]), 0, 0);
        print_empty_map(&mut r.text, AggKind::Stats);
        r.print(&z, 0, 0);
        let maps = vec![
            z,
            map("@zs", vec![(vec![i(1)], Agg::Stats { count: 0, sum: 0 })]),
            map("@zc", vec![(vec![i(1)], Agg::Count(0))]),
            one("@zl", lhist(0, 10, 1, &[(4, 0)])),
            one("@zz", Agg::Avg { count: 0, sum: 0 }),
            one("@after", Agg::Count(1)),
        ];
        let empty = [
            ("@a", AggKind::Scalar),
            ("@h", AggKind::Hist),
            ("@s", AggKind::Stats),
            ("@v", AggKind::Avg),
            ("@e", AggKind::Scalar),
        ];
        let (t, j) = r.exit(&maps, &empty);
        check("empty_maps", &t, &j);
    }

    #[test]
    fn values() {
        let mut r = Run::new(1);
        r.print_value(i(5));
        r.print_value(i(-1));
        r.print_value(u(u64::MAX));
        r.print_value(s("a\tb"));
        r.print_value(s(""));
        r.print_value(s("bpftrace"));
        r.print_value(s("\u{e9}\x7f\x1f\x01\r\"\\"));
        r.time("--\n");
        r.time("%%literal %% percent\n");
        r.printf("\u{e9} %s\n", &[s("\u{fc}")]);
        r.printf("ctl\x01\x1f\x7f\n", &[]);
        let maps = vec![
            map(
                "@s",
                vec![(vec![s("\u{e9}\"q\\\t")], Agg::Scalar(s("x\ny\x01\u{e9}")))],
            ),
            map(
                "@p",
                vec![(vec![s("C:\\path"), s("new\nline")], Agg::Count(1))],
            ),
        ];
        let (t, j) = r.exit(&maps, &[]);
        check("values", &t, &j);
    }

    #[test]
    fn huge_counts() {
        let mut out = String::new();
        let m = map(
            "@h",
            vec![(vec![], hist(&[(3, 1), (4, 3_000_000_000), (5, 2)]))],
        );
        print_map(&mut out, &m, 0, 0);
        // bpftrace reads counts into an int: 3e9 wraps negative, so the
        // widest bar is the count of 2, and the huge bucket's bar is capped.
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines[1],
            format!("[2, 4)                 1 |{:<52}|", "@".repeat(26))
        );
        assert!(lines[2].starts_with(&format!("{:<16}3000000000 |@@@@", "[4, 8)")));
        assert!(lines[2].len() <= 100 + MAX_BAR);
        let mut out = String::new();
        let m = map(
            "@c",
            vec![
                (vec![i(1)], Agg::Count(u64::MAX)),
                (vec![i(2)], Agg::Sum(i64::MIN)),
            ],
        );
        print_map(&mut out, &m, 0, 0);
        assert_eq!(
            out,
            "@c[2]: -9223372036854775808\n@c[1]: 18446744073709551615\n"
        );
        let mut out = String::new();
        // max() of signed values is signed, as min() (bpftrace 0.17 read
        // it as unsigned, or printed nothing).
        print_map(&mut out, &one("@m", Agg::Max(-5)), 0, 0);
        assert_eq!(out, "@m: -5\n");
        // A count past 2^32 wraps to a small int: bpftrace shows no rows.
        let mut out = String::new();
        print_map(&mut out, &one("@w", hist(&[(3, 1 << 32)])), 0, 0);
        assert_eq!(out, "@w: \n\n");
    }

    #[test]
    fn exit_order() {
        let mut n: Vec<String> = ["@b", "@ab", "@a", "@", "@_x", "@A", "@a"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        exit_maps_order(&mut n);
        assert_eq!(n, ["@", "@A", "@_x", "@a", "@ab", "@b"]);
        assert_eq!(attaching(2), "Attaching 2 probes...\n");
        assert_eq!(
            json_lost_events(3),
            "{\"type\": \"lost_events\", \"data\": {\"events\": 3}}"
        );
        assert_eq!(lost_events(3), "Lost 3 events\n");
    }

    #[test]
    fn end_probe() {
        let mut r = Run::new(2);
        r.printf("begin\n", &[]);
        r.printf("end %d\n", &[i(1)]);
        let x = one("@x", Agg::Scalar(i(1)));
        r.print(&x, 0, 0);
        let y = map("@y", vec![(vec![i(1)], Agg::Count(1))]);
        let (t, j) = r.exit(&[y, x], &[]);
        check("end_probe", &t, &j);
    }

    fn stats_of(vals: &[i64]) -> (u64, i64) {
        (vals.len() as u64, vals.iter().sum())
    }

    #[test]
    fn maps_basic() {
        let run = Run::new(1);
        let (c, sm) = stats_of(&[5, 10]);
        let maps = vec![
            map(
                "@a",
                vec![(vec![i(1)], Agg::Count(1)), (vec![i(2)], Agg::Count(2))],
            ),
            one("@h", hist_of(&[5, 0, -1, 1000])),
            one("@l", lhist_of(&[7], 0, 100, 10)),
            one("@s", Agg::Stats { count: c, sum: sm }),
            one("@v", Agg::Avg { count: 1, sum: 3 }),
            map("@b", vec![(vec![s("x"), s("y")], Agg::Sum(4))]),
            one("@c", Agg::Scalar(i(5))),
            one("@str", Agg::Scalar(s("abc"))),
        ];
        let (t, j) = run.exit(&maps, &[]);
        check("maps_basic", &t, &j);
    }

    #[test]
    fn printf_golden() {
        let mut r = Run::new(1);
        r.printf(
            "%-6d %-16s %4d %3d %s\n",
            &[i(1234), s("bash"), i(3), i(-1), s("/etc/passwd")],
        );
        r.printf(
            "%-10u %-8s %-8d %7u %5d %s\n",
            &[u(12345678), s("root"), i(-5), u(42), i(0), s("x")],
        );
        r.printf(
            "%llu %lu %lld %ld\n",
            &[u(u64::MAX), u(u64::MAX), i(-1), i(i64::MIN)],
        );
        r.printf(
            "%lx %lX %016lx %llx\n",
            &[u(0xdead_beef_cafe), u(0xdead_beef_cafe), u(0xbeef), i(-1)],
        );
        r.printf("%u %x %X %o\n", &[i(-1), i(-1), i(-2), i(-1)]);
        r.printf(
            "%d %d %d\n",
            &[i(4_294_967_296), i(2_147_483_648), u(0xffff_ffff)],
        );
        r.printf(
            "%hhd %hhu %hd %hu %hhx\n",
            &[i(511), i(-1), i(98_304), i(-1), i(0x1ff)],
        );
        r.printf(
            "%zd %zu %jd %td %zx\n",
            &[i(-1), i(-1), i(-7), i(-9), i(-1)],
        );
        r.printf(
            "[%c][%c][%c][%3c][%-3c]\n",
            &[i(65), i(321), i(-191), i(122), i(122)],
        );
        r.printf("[%c][%3c][%-3c]x\n", &[i(0), i(0), i(0)]);
        r.printf(
            "[%p][%p][%20p][%-20p][%05p]\n",
            &[i(0), i(255), i(0), i(4096), i(1)],
        );
        r.printf(
            "[%lp][%hhp][%.8p][%018p]\n",
            &[
                u(0xffff_ffff_8100_0000),
                i(0x1234),
                i(16),
                u(0xffff_8880_0000_0000),
            ],
        );
        r.printf(
            "[%s][%10s][%-10s][%.2s][%-5.3s][%5.1s]\n",
            &[
                s("abc"),
                s("abc"),
                s("abc"),
                s("abc"),
                s("abcdef"),
                s("xyz"),
            ],
        );
        r.printf(
            "[%-10.10s][%.0s][%-s][%8s]\n",
            &[s("0123456789abc"), s("gone"), s("dash"), s("")],
        );
        r.printf(
            "[%05d][%-05d][%.3d][%8.3d][%-8.3d][%08.3d]\n",
            &[i(42), i(42), i(7), i(-7), i(7), i(7)],
        );
        r.printf(
            "[%.0d][%.0x][%5.0d][%010d][%010u]\n",
            &[i(0), i(0), i(0), i(-42), i(-42)],
        );
        r.printf("[%3d][%3d][%-3d|]\n", &[i(123_456), i(-12), i(-1)]);
        r.printf(
            "load averages: %d.%03d %d.%03d %d.%03d\n",
            &[i(0), i(52), i(1), i(5), i(12), i(340)],
        );
        r.printf(
            "%-8s %-6s %-16s %s\n",
            &[s("TIME"), s("PID"), s("COMM"), s("ARGS")],
        );
        r.printf(
            "%39s:%-6d %39s:%-6d %-10s\n",
            &[s("127.0.0.1"), i(22), s("::1"), i(54_321), s("ESTABLISHED")],
        );
        r.printf(
            "%-5d %-10.10s %-15s %-5d %-15s %-6d ",
            &[
                i(7),
                s("ssh-agent-long"),
                s("10.0.0.1"),
                i(80),
                s("10.0.0.2"),
                i(443),
            ],
        );
        r.printf("%d/%d\n", &[i(3), i(4)]);
        r.printf(
            "ruid=%d euid=%d suid=%d (%d)\n",
            &[i(0), i(1000), i(-1), i(0)],
        );
        r.printf("%5s %5s %s\n", &[s("a"), s("bb"), s("ccc")]);
        r.printf("%5d %5d %d\n", &[i(1), i(-22), i(333)]);
        r.printf(
            "%-12u %-7s %-16s %-6d %7d\n",
            &[u(99), s("R"), s("kworker/0:1"), i(17), i(-3)],
        );
        r.printf("%d%%\n", &[i(50)]);
        r.printf("%% %d|%%\n", &[i(5)]);
        r.printf("100%%\n", &[]);
        r.printf("%%d\n", &[i(5)]);
        r.printf("%+d%%d\n", &[i(5)]);
        r.printf("a%%%db\n", &[i(9)]);
        r.printf("%i|\n", &[]);
        r.printf("%5.2f %+d\n", &[]);
        r.printf("tab\there \"quoted\" back\\slash\n", &[]);
        r.printf("%s|%s\n", &[s("\u{e9}t\u{e9}"), s("\u{1f600}")]);
        r.printf("%o %5o\n", &[i(8), i(8)]);
        r.printf("%x %X %lx\n", &[i(255), i(255), i(-256)]);
        r.printf("%-4d|%4d|%04d|%-04d|\n", &[i(-3), i(-3), i(-3), i(-3)]);
        r.printf("%u %lu\n", &[i(i64::MIN), i(i64::MIN)]);
        r.printf(
            "%20d|%-20lld|\n",
            &[i(-2_147_483_648), i(-9_223_372_036_854_775_807)],
        );
        r.printf("%s", &[s("no newline, ")]);
        r.printf("%d\n", &[u(7)]);
        let (t, j) = r.exit(&[], &[]);
        check("printf", &t, &j);
    }

    #[test]
    fn printf_errors() {
        let e = |f: &str, a: &[Value]| match printf(f, a) {
            Err(e) => e.message().to_string(),
            Ok(s) => panic!("{f:?} gave {s:?}"),
        };
        assert_eq!(
            e("%i|\n", &[i(5)]),
            "printf: Too many arguments for format string (1 supplied, 0 expected)"
        );
        assert_eq!(
            e("%d %d\n", &[i(5)]),
            "printf: Not enough arguments for format string (1 supplied, 2 expected)"
        );
        assert_eq!(
            e("%d\n", &[s("x")]),
            "printf: %d specifier expects a value of type integer (string supplied)"
        );
        assert_eq!(
            e("%-5s\n", &[i(1)]),
            "printf: %s specifier expects a value of type string (integer supplied)"
        );
        assert_eq!(
            e("%rx\n", &[i(1)]),
            "printf: %rx specifier expects a value of type buffer (integer supplied)"
        );
        assert_eq!(
            e("%llu\n", &[stack(&["f"])]),
            "printf: %llu specifier expects a value of type integer (string supplied)"
        );
        // bpftrace accepts these and prints stack garbage for the second.
        assert!(e("%+d|%d\n", &[i(5)]).contains("more than the one argument"));
        assert!(e("%f %d\n", &[i(5)]).contains("%f"));
        assert!(e("%n%d\n", &[i(5)]).contains("%n"));
        assert!(e("%*d%d\n", &[i(5)]).starts_with("printf: "));
        let many = vec![i(1); 128];
        assert_eq!(
            e(&"%d".repeat(128), &many),
            "printf() takes up to 128 arguments (129 provided)"
        );
        assert!(printf(&"%d".repeat(127), &many[..127]).is_ok());
        assert_eq!(
            check_format("%d %s", &[ArgKind::Int, ArgKind::Text]),
            Ok(())
        );
        assert!(check_format("%d %s", &[ArgKind::Int, ArgKind::Int]).is_err());
        assert!(!e("%d %d\n", &[i(5)]).contains('\n'));
        // Display leaves the "printf: " to the caller.
        let err = printf("%d\n", &[]).err().map(|e| e.to_string());
        assert_eq!(
            err.as_deref(),
            Some("Not enough arguments for format string (0 supplied, 1 expected)")
        );
        // A lone conversion that is not bpftrace's still prints as glibc's.
        assert_eq!(printf("%+d%%d\n", &[i(5)]), Ok("+5%d\n".to_string()));
    }

    /// Every integer, char, string and pointer conversion against the real
    /// glibc snprintf, which is what bpftrace calls.
    #[test]
    fn printf_matches_glibc() {
        let flags = ["", "-", "0", "-0", "+", " ", "#", "+0", "#0", "#-"];
        let widths = ["", "1", "5", "12", "24"];
        let precs = ["", ".0", ".1", ".3", ".10"];
        let lens = ["", "hh", "h", "l", "ll", "z", "j", "t"];
        let convs = ["d", "i", "u", "o", "x", "X", "p", "c"];
        let ints: [u64; 12] = [
            0,
            1,
            7,
            255,
            256,
            0x7fff_ffff,
            0x8000_0000,
            0xffff_ffff,
            0x1_0000_0000,
            u64::MAX,
            i64::MIN as u64,
            0xffff_ffff_ffff_ff80,
        ];
        let mut n = 0;
        for f in flags {
            for w in widths {
                for p in precs {
                    for l in lens {
                        for c in convs {
                            if c == "c" && !l.is_empty() {
                                continue;
                            }
                            let spec = format!("<%{f}{w}{p}{l}{c}>");
                            for &v in &ints {
                                let ours = emulate(&spec, &u(v));
                                let want = c_snprintf_int(&spec, v);
                                assert_eq!(ours, want, "{spec} {v:#x}");
                                n += 1;
                            }
                        }
                    }
                }
            }
        }
        for f in ["", "-", "0", "-0", "+", " ", "#"] {
            for w in ["", "1", "4", "9"] {
                for p in ["", ".0", ".2", ".5", ".9"] {
                    let spec = format!("<%{f}{w}{p}s>");
                    for v in ["", "a", "abcdef", "\u{e9}\u{e9}"] {
                        let ours = emulate(&spec, &s(v));
                        let want = c_snprintf_str(&spec, v);
                        assert_eq!(ours, want, "{spec} {v:?}");
                        n += 1;
                    }
                }
            }
        }
        assert!(n > 10_000);
    }

    /// One snprintf call as this module makes it (before the NUL cut).
    fn emulate(spec: &str, arg: &Value) -> Vec<u8> {
        let segs = match glibc_segments(spec.as_bytes()) {
            Ok(s) => s,
            Err(e) => panic!("{spec}: {e}"),
        };
        let mut buf = Vec::new();
        for seg in &segs {
            match seg {
                Seg::Lit(l) => buf.extend_from_slice(l),
                Seg::Conv(c) => format_conv(&mut buf, c, arg),
            }
        }
        buf
    }

    fn c_snprintf_int(fmt: &str, v: u64) -> Vec<u8> {
        let f = std::ffi::CString::new(fmt).unwrap();
        let mut buf = vec![0u8; 256];
        // SAFETY: the format holds exactly one conversion that reads one
        // 64-bit integer or pointer, and buf is large enough.
        let n = unsafe { libc::snprintf(buf.as_mut_ptr().cast(), buf.len(), f.as_ptr(), v) };
        assert!(n >= 0 && (n as usize) < buf.len());
        buf.truncate(n as usize);
        buf
    }

    fn c_snprintf_str(fmt: &str, v: &str) -> Vec<u8> {
        let f = std::ffi::CString::new(fmt).unwrap();
        let a = std::ffi::CString::new(v).unwrap();
        let mut buf = vec![0u8; 256];
        // SAFETY: one %s conversion, given a NUL-terminated string.
        let n =
            unsafe { libc::snprintf(buf.as_mut_ptr().cast(), buf.len(), f.as_ptr(), a.as_ptr()) };
        assert!(n >= 0 && (n as usize) < buf.len());
        buf.truncate(n as usize);
        buf
    }

    #[test]
    fn time_formats() {
        assert_eq!(time(Some("x%%y"), 0), "x%y");
        assert_eq!(time(Some(""), 0), "");
        // 64 bytes or more do not fit bpftrace's buffer: nothing printed.
        assert_eq!(time(Some(&"a".repeat(63)), 0), "a".repeat(63));
        assert_eq!(time(Some(&"a".repeat(64)), 0), "");
        let d = time(None, 1_700_000_000_123_456_789);
        let b = d.as_bytes();
        assert_eq!(b.len(), 9, "{d:?}");
        assert!(b[2] == b':' && b[5] == b':' && b[8] == b'\n', "{d:?}");
        // The same second whatever the nanoseconds.
        assert_eq!(
            time(Some("%s"), 1_700_000_000_999_999_999),
            "1700000000".to_string()
        );
        assert_eq!(json_time(""), "");
        assert_eq!(
            json_time("12:00:00\n"),
            "{\"type\": \"time\", \"data\": \"12:00:00\\n\"}"
        );
    }

    #[test]
    fn sort_matches_libstdcxx() {
        // Orders recorded from a C++ program running std::sort and
        // std::partial_sort (heap path) over the same keys, index ties kept.
        let keys: Vec<u32> = (0..40).map(|k| (k * 7 + 3) % 5).collect();
        let mut idx: Vec<usize> = (0..keys.len()).collect();
        gnu_sort::sort(&mut idx, &|a, b| keys[a] < keys[b]);
        assert_eq!(idx, GNU_SORT_40);
        let mut idx: Vec<usize> = (0..keys.len()).collect();
        gnu_sort::partial_sort(&mut idx, 0, keys.len(), &|a, b| keys[a] < keys[b]);
        assert_eq!(idx, GNU_HEAP_40);
    }

    const GNU_SORT_40: [usize; 40] = [
        1, 36, 31, 6, 26, 21, 11, 16, 39, 34, 29, 24, 19, 14, 9, 4, 37, 12, 17, 2, 32, 22, 7, 27,
        0, 35, 30, 5, 25, 20, 10, 15, 28, 8, 23, 33, 3, 18, 38, 13,
    ];
    const GNU_HEAP_40: [usize; 40] = [
        26, 6, 21, 16, 11, 36, 1, 31, 39, 34, 9, 4, 24, 19, 29, 14, 32, 7, 17, 37, 22, 12, 2, 27,
        15, 35, 20, 10, 5, 25, 0, 30, 33, 3, 8, 18, 38, 23, 13, 28,
    ];
}
