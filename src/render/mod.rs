//! Render stage: aggregates, events and lost counts as text or JSON lines;
//! profiles as folded stacks, flame graphs, pprof, JSON or a top table.

pub mod flame;
pub mod heatmap;
pub mod hist;
pub mod pprof;
pub mod profile;

use std::cell::OnceCell;
use std::collections::{BTreeMap, HashMap};
use std::io::{self, BufWriter, Stdout, Write};

use serde_json::{json, Map, Value};

use crate::attach::plan::{Action, Buckets};
use crate::attach::plan::{Plan, Slot, ValueKind};
use crate::collect::aggregate::{AggVal, KeyAgg};
use crate::collect::events::{buf_field, c_str, escape_bytes, Event};
use crate::collect::stacks::StackTable;
use crate::collect::Lost;

/// One decoded key part or field.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Cell {
    Int(i64),
    UInt(u64),
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

    pub fn json(&self) -> Value {
        match self {
            Cell::Int(v) => json!(v),
            Cell::UInt(v) => json!(v),
            Cell::Hex(v) => json!(format!("{v:#x}")),
            Cell::Str(s) | Cell::Bytes(s, _) => json!(s),
            Cell::Frames(f) => json!(f),
        }
    }
}

/// Turns slot bytes into cells, naming probes and cgroups.
pub struct Decoder {
    probe_names: Vec<String>,
    cgroups: OnceCell<HashMap<u64, String>>,
    stacks: StackTable,
}

fn word(b: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    let n = b.len().min(8);
    w[..n].copy_from_slice(&b[..n]);
    u64::from_ne_bytes(w)
}

impl Decoder {
    pub fn new(plan: &Plan) -> Decoder {
        Decoder {
            probe_names: plan.probes.iter().map(|p| p.probe.name.clone()).collect(),
            cgroups: OnceCell::new(),
            stacks: StackTable::default(),
        }
    }

    /// Named stacks for stack keys, read after the run.
    pub fn set_stacks(&mut self, stacks: StackTable) {
        self.stacks = stacks;
    }

    pub fn probe_name(&self, idx: u32) -> &str {
        self.probe_names
            .get(idx as usize)
            .map_or("?", String::as_str)
    }

    pub fn cell(&self, slot: &Slot, data: &[u8]) -> Cell {
        let b = data.get(slot.off..slot.off + slot.len).unwrap_or(&[]);
        match slot.kind {
            ValueKind::Probe => Cell::Str(self.probe_name(word(b) as u32).to_string()),
            ValueKind::Cgroup => {
                let id = word(b);
                let names = self.cgroups.get_or_init(bpfscope_sys::cgroup::id_paths);
                Cell::Str(
                    names
                        .get(&id)
                        .cloned()
                        .unwrap_or_else(|| format!("cgroup:{id}")),
                )
            }
            ValueKind::Int { signed: true } => Cell::Int(word(b) as i64),
            ValueKind::Int { signed: false } => Cell::UInt(word(b)),
            ValueKind::Hex => Cell::Hex(word(b)),
            ValueKind::Str => Cell::Str(c_str(b)),
            ValueKind::Buf => {
                let (bytes, cut) = buf_field(b);
                Cell::Bytes(escape_bytes(bytes), cut)
            }
            ValueKind::Stack { user } => {
                let id = word(b) as i64;
                let table = if user {
                    &self.stacks.user
                } else {
                    &self.stacks.kernel
                };
                match u32::try_from(id).ok().and_then(|i| table.get(&i)) {
                    Some(f) => Cell::Frames(f.clone()),
                    // A failed stack capture is counted as lost.
                    None if id < 0 => Cell::Frames(vec!["[stack not captured]".into()]),
                    None => Cell::Frames(vec!["[stack gone]".into()]),
                }
            }
        }
    }

    fn key(&self, plan: &Plan, data: &[u8]) -> Vec<Cell> {
        plan.keys.iter().map(|s| self.cell(s, data)).collect()
    }
}

fn key_json(plan: &Plan, cells: &[Cell]) -> Value {
    let mut m = Map::new();
    for (slot, c) in plan.keys.iter().zip(cells) {
        m.insert(slot.name.clone(), c.json());
    }
    Value::Object(m)
}

fn num(v: i64, signed: bool) -> Value {
    if signed {
        json!(v)
    } else {
        json!(v as u64)
    }
}

fn num_text(v: i64, signed: bool) -> String {
    if signed {
        v.to_string()
    } else {
        (v as u64).to_string()
    }
}

fn avg(v: &AggVal, signed: bool) -> f64 {
    if v.count == 0 {
        return 0.0;
    }
    let sum = if signed {
        v.sum as f64
    } else {
        v.sum as u64 as f64
    };
    sum / v.count as f64
}

/// What a histogram measures.
struct HistOf<'a> {
    value: &'a str,
    unit: &'a str,
    buckets: Buckets,
}

/// Where results go: stdout, as text or JSON lines.
pub struct Output {
    w: BufWriter<Stdout>,
    pub json: bool,
}

impl Output {
    pub fn new(json: bool) -> Output {
        Output {
            w: BufWriter::with_capacity(1 << 16, io::stdout()),
            json,
        }
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.w.flush()
    }

    /// True when stdout is a pipe whose reader has gone (poll reports
    /// POLLERR on the write end), so a quiet run can end without writing.
    pub fn closed(&self) -> bool {
        let mut p = libc::pollfd {
            fd: libc::STDOUT_FILENO,
            events: 0,
            revents: 0,
        };
        // SAFETY: p is one valid pollfd; a zero timeout never blocks.
        let r = unsafe { libc::poll(&mut p, 1, 0) };
        r > 0 && p.revents & libc::POLLERR != 0
    }

    /// A line of plain text.
    pub fn raw_line(&mut self, s: &str) -> io::Result<()> {
        writeln!(self.w, "{s}")?;
        self.w.flush()
    }

    fn line(&mut self, v: &Value) -> io::Result<()> {
        serde_json::to_writer(&mut self.w, v)?;
        self.w.write_all(b"\n")
    }

    /// Prints the aggregates of one run or interval.
    pub fn aggregates(
        &mut self,
        plan: &Plan,
        action: &Action,
        data: &BTreeMap<Vec<u8>, KeyAgg>,
        dec: &Decoder,
        interval: Option<u64>,
    ) -> io::Result<()> {
        let signed = plan.value.as_ref().is_some_and(|v| v.1);
        let mut rows: Vec<(Vec<Cell>, &KeyAgg, AggVal)> = data
            .iter()
            .map(|(k, agg)| (dec.key(plan, k), agg, agg.total(signed)))
            .collect();
        match action {
            Action::Hist { .. } | Action::Latency { .. } => rows.sort_by(|a, b| a.0.cmp(&b.0)),
            _ => rows.sort_by(|a, b| a.2.count.cmp(&b.2.count).then_with(|| a.0.cmp(&b.0))),
        }
        if !self.json {
            if let Some(i) = interval {
                writeln!(self.w, "{}", interval_header(i))?;
            }
        }
        match action {
            Action::Count | Action::Stats { .. } => {
                self.table(plan, action, &rows, signed, interval)
            }
            Action::Hist { value, buckets } => {
                for (cells, agg, total) in &rows {
                    let h = HistOf {
                        value,
                        unit: "count",
                        buckets: *buckets,
                    };
                    self.hist(plan, &h, cells, agg, total, signed, interval)?;
                }
                Ok(())
            }
            Action::Latency { buckets, .. } => {
                for (cells, agg, total) in &rows {
                    let h = HistOf {
                        value: "latency",
                        unit: "ns",
                        buckets: *buckets,
                    };
                    self.hist(plan, &h, cells, agg, total, false, interval)?;
                }
                Ok(())
            }
            Action::Trace { .. } => Ok(()),
        }
    }

    fn table(
        &mut self,
        plan: &Plan,
        action: &Action,
        rows: &[(Vec<Cell>, &KeyAgg, AggVal)],
        signed: bool,
        interval: Option<u64>,
    ) -> io::Result<()> {
        let stats = matches!(action, Action::Stats { .. });
        // Without keys a count is one number, and zero is an answer too.
        let zero: [(Vec<Cell>, AggVal); 1] = [(Vec::new(), AggVal::default())];
        let flat: Vec<(&[Cell], AggVal)> = if rows.is_empty() && plan.keys.is_empty() && !stats {
            zero.iter().map(|(c, v)| (c.as_slice(), *v)).collect()
        } else {
            rows.iter().map(|(c, _, v)| (c.as_slice(), *v)).collect()
        };
        if self.json {
            for &(cells, ref v) in &flat {
                let mut o = if stats {
                    json!({"type": "stats", "key": key_json(plan, cells), "count": v.count,
                        "sum": num(v.sum, signed), "min": num(v.min, signed),
                        "max": num(v.max, signed), "avg": avg(v, signed)})
                } else {
                    json!({"type": "count", "key": key_json(plan, cells), "count": v.count})
                };
                if let (Some(i), Some(m)) = (interval, o.as_object_mut()) {
                    m.insert("interval".into(), json!(i));
                }
                self.line(&o)?;
            }
            return Ok(());
        }
        if plan
            .keys
            .iter()
            .any(|k| matches!(k.kind, ValueKind::Stack { .. }))
        {
            return self.stack_blocks(plan, rows, stats, signed);
        }
        let mut header: Vec<String> = plan.keys.iter().map(|k| k.name.to_uppercase()).collect();
        header.push("COUNT".into());
        if stats {
            header.extend(["SUM", "MIN", "MAX", "AVG"].map(String::from));
        }
        let body: Vec<Vec<String>> = flat
            .iter()
            .map(|&(cells, ref v)| {
                let mut r: Vec<String> = cells.iter().map(Cell::text).collect();
                r.push(v.count.to_string());
                if stats {
                    r.push(num_text(v.sum, signed));
                    r.push(num_text(v.min, signed));
                    r.push(num_text(v.max, signed));
                    r.push(format!("{:.2}", avg(v, signed)));
                }
                r
            })
            .collect();
        let nkeys = plan.keys.len();
        let widths: Vec<usize> = (0..header.len())
            .map(|c| {
                body.iter()
                    .map(|r| r[c].len())
                    .chain([header[c].len()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let fmt_row = |r: &[String]| {
            r.iter()
                .enumerate()
                .map(|(c, s)| {
                    if c < nkeys {
                        format!("{s:<w$}", w = widths[c])
                    } else {
                        format!("{s:>w$}", w = widths[c])
                    }
                })
                .collect::<Vec<_>>()
                .join("  ")
                .trim_end()
                .to_string()
        };
        writeln!(self.w, "{}", fmt_row(&header))?;
        for r in &body {
            writeln!(self.w, "{}", fmt_row(r))?;
        }
        Ok(())
    }

    /// Rows whose keys hold stacks: a block per key, frames one per line, leaf first.
    fn stack_blocks(
        &mut self,
        plan: &Plan,
        rows: &[(Vec<Cell>, &KeyAgg, AggVal)],
        stats: bool,
        signed: bool,
    ) -> io::Result<()> {
        for (cells, _, v) in rows {
            let flat: Vec<String> = plan
                .keys
                .iter()
                .zip(cells)
                .filter(|(_, c)| !matches!(c, Cell::Frames(_)))
                .map(|(k, c)| format!("{}={}", k.name, c.text()))
                .collect();
            writeln!(self.w, "@[{}]:", flat.join(", "))?;
            for (k, c) in plan.keys.iter().zip(cells) {
                if let Cell::Frames(f) = c {
                    writeln!(self.w, "  {}:", k.name)?;
                    for frame in f {
                        writeln!(self.w, "    {frame}")?;
                    }
                }
            }
            if stats {
                writeln!(
                    self.w,
                    "  count {}, sum {}, min {}, max {}, avg {:.2}\n",
                    v.count,
                    num_text(v.sum, signed),
                    num_text(v.min, signed),
                    num_text(v.max, signed),
                    avg(v, signed)
                )?;
            } else {
                writeln!(self.w, "  count {}\n", v.count)?;
            }
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn hist(
        &mut self,
        plan: &Plan,
        h: &HistOf<'_>,
        cells: &[Cell],
        agg: &KeyAgg,
        total: &AggVal,
        signed: bool,
        interval: Option<u64>,
    ) -> io::Result<()> {
        let (value, buckets) = (h.value, h.buckets);
        if self.json {
            let list: Vec<Value> = agg
                .buckets
                .iter()
                .map(|(&i, v)| {
                    let b = hist::bounds(buckets, i);
                    json!({"low": big(b.low), "high": big(b.high), "count": v.count})
                })
                .collect();
            let mut o = json!({"type": "hist", "key": key_json(plan, cells), "value": value,
                "unit": h.unit, "buckets": list, "count": total.count, "sum": num(total.sum, signed)});
            if let (Some(i), Some(m)) = (interval, o.as_object_mut()) {
                m.insert("interval".into(), json!(i));
            }
            return self.line(&o);
        }
        let title: Vec<String> = plan
            .keys
            .iter()
            .zip(cells)
            .map(|(k, c)| format!("{}={}", k.name, c.inline()))
            .collect();
        let name = if h.unit == "ns" {
            format!("{value}_ns")
        } else {
            value.to_string()
        };
        if title.is_empty() {
            writeln!(self.w, "@{name}:")?;
        } else {
            writeln!(self.w, "@{name}[{}]:", title.join(", "))?;
        }
        let (Some(&lo), Some(&hi)) = (agg.buckets.keys().next(), agg.buckets.keys().last()) else {
            return Ok(());
        };
        let max = agg.buckets.values().map(|v| v.count).max().unwrap_or(0);
        let labels: Vec<String> = (lo..=hi).map(|i| hist::label(buckets, i)).collect();
        let lw = labels.iter().map(String::len).max().unwrap_or(0);
        for (i, label) in (lo..=hi).zip(&labels) {
            let c = agg.buckets.get(&i).map_or(0, |v| v.count);
            writeln!(self.w, "{label:<lw$} {c:>10} {}", hist::bar(c, max, 52))?;
        }
        writeln!(
            self.w,
            "count {}, sum {}, avg {:.2}\n",
            total.count,
            num_text(total.sum, signed),
            avg(total, signed)
        )
    }

    /// Prints one event.
    pub fn event(
        &mut self,
        plan: &Plan,
        ev: &Event<'_>,
        dec: &Decoder,
        t0_ns: u64,
    ) -> io::Result<()> {
        let slots: &[Slot] = plan
            .probes
            .get(ev.probe as usize)
            .map_or(&[], |p| p.event.as_slice());
        let probe = dec.probe_name(ev.probe);
        // Fields whose memory could not be read, and buffers longer than shown.
        let faulted = |i: usize| i < 32 && ev.faults & (1 << i) != 0;
        if self.json {
            let mut fields = Map::new();
            let (mut bad, mut cut) = (Vec::new(), Vec::new());
            for (i, s) in slots.iter().enumerate() {
                let c = dec.cell(s, ev.data);
                if faulted(i) {
                    bad.push(json!(s.name));
                    fields.insert(s.name.clone(), Value::Null);
                    continue;
                }
                if let Cell::Bytes(_, true) = c {
                    cut.push(json!(s.name));
                }
                fields.insert(s.name.clone(), c.json());
            }
            let mut o = json!({"type": "event", "probe": probe, "ts_ns": ev.ts_ns,
                "pid": ev.pid, "tid": ev.tid, "comm": ev.comm, "cpu": ev.cpu,
                "fields": Value::Object(fields)});
            // Only when there is something to say: other events stay as they were.
            if let Some(m) = o.as_object_mut() {
                if !bad.is_empty() {
                    m.insert("faulted".into(), Value::Array(bad));
                }
                if !cut.is_empty() {
                    m.insert("truncated".into(), Value::Array(cut));
                }
            }
            return self.line(&o);
        }
        let t = ev.ts_ns.saturating_sub(t0_ns) as f64 / 1e9;
        write!(
            self.w,
            "{t:.6} {probe} pid={} tid={} comm={} cpu={}",
            ev.pid, ev.tid, ev.comm, ev.cpu
        )?;
        for (i, s) in slots.iter().enumerate() {
            if faulted(i) {
                write!(self.w, " {}=<fault>", s.name)?;
                continue;
            }
            match dec.cell(s, ev.data) {
                Cell::Str(v) => write!(self.w, " {}={v:?}", s.name)?,
                // Already escaped; a cut buffer ends in `...` after the quote.
                Cell::Bytes(v, cut) => write!(
                    self.w,
                    " {}=\"{}\"{}",
                    s.name,
                    v.replace('"', "\\\""),
                    if cut { "..." } else { "" }
                )?,
                c => write!(self.w, " {}={}", s.name, c.text())?,
            }
        }
        writeln!(self.w)
    }

    /// Reports what was lost, if anything: in JSON as records, in text on stderr.
    pub fn lost(&mut self, lost: Lost, interval: Option<u64>) -> io::Result<()> {
        let parts = [
            (
                lost.events,
                "events",
                "the ring buffer was full; raise --ringbuf-kib or filter more",
            ),
            (lost.keys, "keys", "the key map was full; raise --max-keys"),
            (lost.stacks, "stacks", "stacks could not be captured"),
            (
                lost.nested,
                "nested",
                "events fired while the same program was running on that CPU (the kernel skips them)",
            ),
            (
                lost.missed,
                "missed",
                "kernel function hits the kprobe machinery missed (all return instances in use, or a probe inside a probe)",
            ),
        ];
        if lost.unmatched > 0 {
            // Not a loss: ends whose start was not traced (filtered, before attach, other processes).
            if self.json {
                let mut o = json!({"type": "unmatched", "count": lost.unmatched});
                if let (Some(i), Some(m)) = (interval, o.as_object_mut()) {
                    m.insert("interval".into(), json!(i));
                }
                self.line(&o)?;
            } else {
                self.w.flush()?;
                eprintln!(
                    "bpfscope: {} ends had no matching start and were not timed",
                    lost.unmatched
                );
            }
        }
        for (n, what, why) in parts {
            if n == 0 {
                continue;
            }
            if self.json {
                let mut o = json!({"type": "lost", "count": n, "what": what});
                if let (Some(i), Some(m)) = (interval, o.as_object_mut()) {
                    m.insert("interval".into(), json!(i));
                }
                self.line(&o)?;
            } else {
                self.w.flush()?;
                eprintln!("bpfscope: lost {n} {what}: {why}");
            }
        }
        Ok(())
    }
}

/// Stack counts as folded lines: the other key parts are the root frame
/// (`all` without any), then user frames and kernel frames (`_[k]`), root
/// first, then the count. Identical stacks are summed.
pub fn folded_stacks(plan: &Plan, data: &BTreeMap<Vec<u8>, KeyAgg>, dec: &Decoder) -> Vec<String> {
    let mut agg: BTreeMap<String, u64> = BTreeMap::new();
    for (k, a) in data {
        let cells = dec.key(plan, k);
        let root: Vec<String> = plan
            .keys
            .iter()
            .zip(&cells)
            .filter(|(s, _)| !matches!(s.kind, ValueKind::Stack { .. }))
            .map(|(_, c)| c.inline().replace([';', ' '], "_"))
            .collect();
        let mut frames = vec![if root.is_empty() {
            "all".to_string()
        } else {
            root.join(",")
        }];
        for user in [true, false] {
            for (s, c) in plan.keys.iter().zip(&cells) {
                if let (ValueKind::Stack { user: u }, Cell::Frames(f)) = (s.kind, c) {
                    if u == user {
                        let suffix = if user { "" } else { "_[k]" };
                        frames.extend(
                            f.iter()
                                .rev()
                                .map(|n| format!("{}{suffix}", n.replace([';', ' '], "_"))),
                        );
                    }
                }
            }
        }
        *agg.entry(frames.join(";")).or_default() += a.total(false).count;
    }
    agg.into_iter().map(|(k, v)| format!("{k} {v}")).collect()
}

/// Bucket bounds as JSON integers.
fn big(v: i128) -> Value {
    if v < 0 {
        json!(v as i64)
    } else {
        json!(v as u64)
    }
}

fn interval_header(i: u64) -> String {
    let mut t: libc::time_t = 0;
    // SAFETY: time() and localtime_r only write into the locals passed.
    let tm = unsafe {
        libc::time(&mut t);
        let mut tm: libc::tm = std::mem::zeroed();
        libc::localtime_r(&t, &mut tm);
        tm
    };
    format!(
        "-- interval {i} at {:02}:{:02}:{:02} --",
        tm.tm_hour, tm.tm_min, tm.tm_sec
    )
}
