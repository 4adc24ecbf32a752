//! Render stage: aggregates, events and lost counts become records
//! (`record`, the schema of docs/output.md) that the printer `--json` chose
//! prints as JSON lines or as text (`printer`); profiles as folded stacks,
//! flame graphs, pprof, JSON or a top table.

pub mod annotate;
pub mod bpftrace;
pub mod diff;
pub mod exposition;
pub mod flame;
#[cfg(test)]
mod golden;
pub mod heatmap;
pub mod hist;
pub mod pprof;
pub mod printer;
pub mod profile;
pub mod record;
pub mod term;

use std::cell::OnceCell;
use std::collections::{BTreeMap, HashMap};
use std::io::{self, BufWriter, Stdout};

use crate::attach::plan::{Action, Buckets};
use crate::attach::plan::{Plan, Slot, ValueKind};
use crate::collect::aggregate::{AggVal, KeyAgg};
use crate::collect::events::{buf_field, c_str, escape_bytes, Event};
use crate::collect::stacks::StackTable;
use crate::collect::Lost;
use printer::{Printer, Table};
pub use record::Cell;
use record::{Bucket, Fields, HistUnit, Integer, Key, LostWhat, Record};

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
                let w = word(b);
                let id = w as i64;
                let found = if user {
                    self.stacks.user.get(&w)
                } else {
                    u32::try_from(id)
                        .ok()
                        .and_then(|i| self.stacks.kernel.get(&i))
                };
                match found {
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

    /// The key of an aggregate, its parts named after the plan's keys.
    fn key_of<'p>(&self, plan: &'p Plan, data: &[u8]) -> Key<'p> {
        Key(plan
            .keys
            .iter()
            .map(|s| (s.name.as_str(), self.cell(s, data)))
            .collect())
    }
}

fn avg_of(v: &AggVal, signed: bool) -> f64 {
    printer::avg(Integer::new(v.sum, signed), v.count)
}

/// Where results go: stdout, through the printer `--json` chose.
pub struct Output {
    p: Printer<BufWriter<Stdout>>,
}

impl Output {
    /// `t0_ns`: the monotonic time text event lines count from.
    pub fn new(json: bool, t0_ns: u64) -> Output {
        let w = BufWriter::with_capacity(1 << 16, io::stdout());
        Output {
            p: Printer::new(json, w).with_t0(t0_ns),
        }
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.p.flush()
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

    /// A line only the text form has (heatmap rows).
    pub fn raw_line(&mut self, s: &str) -> io::Result<()> {
        self.p.text(s)?;
        self.p.flush()
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
        let mut rows: Vec<(Key<'_>, &KeyAgg, AggVal)> = data
            .iter()
            .map(|(k, agg)| (dec.key_of(plan, k), agg, agg.total(signed)))
            .collect();
        match action {
            Action::Hist { .. } | Action::Latency { .. } => {
                rows.sort_by(|a, b| cmp_keys(&a.0, &b.0))
            }
            _ => rows.sort_by(|a, b| a.2.count.cmp(&b.2.count).then_with(|| cmp_keys(&a.0, &b.0))),
        }
        if let Some(i) = interval {
            self.p.interval(i)?;
        }
        match action {
            Action::Count | Action::Stats { .. } => {
                let stats = matches!(action, Action::Stats { .. });
                // Without keys a count is one number, and zero is an answer too.
                if rows.is_empty() && plan.keys.is_empty() && !stats {
                    rows.push((Key::default(), &EMPTY, AggVal::default()));
                }
                let records: Vec<Record<'_>> = rows
                    .into_iter()
                    .map(|(key, _, v)| {
                        if stats {
                            Record::Stats(record::Stats {
                                key,
                                count: v.count,
                                sum: Integer::new(v.sum, signed),
                                min: Integer::new(v.min, signed),
                                max: Integer::new(v.max, signed),
                                avg: avg_of(&v, signed),
                                interval,
                            })
                        } else {
                            Record::Count(record::Count {
                                key,
                                count: v.count,
                                interval,
                            })
                        }
                    })
                    .collect();
                let head = Table::Aggregates {
                    keys: plan.keys.iter().map(|k| k.name.as_str()).collect(),
                    stats,
                    stacks: plan
                        .keys
                        .iter()
                        .any(|k| matches!(k.kind, ValueKind::Stack { .. })),
                };
                self.p.table(&head, &records)
            }
            Action::Hist { value, buckets } => {
                for (key, agg, total) in rows {
                    let h = hist_record(
                        key,
                        value,
                        HistUnit::Count,
                        *buckets,
                        agg,
                        &total,
                        signed,
                        interval,
                    );
                    self.p.record(&Record::Hist(h))?;
                }
                Ok(())
            }
            Action::Latency { buckets, .. } => {
                for (key, agg, total) in rows {
                    let h = hist_record(
                        key,
                        "latency",
                        HistUnit::Ns,
                        *buckets,
                        agg,
                        &total,
                        false,
                        interval,
                    );
                    self.p.record(&Record::Hist(h))?;
                }
                Ok(())
            }
            Action::Trace { .. } => Ok(()),
        }
    }

    /// Prints one event.
    pub fn event(&mut self, plan: &Plan, ev: &Event<'_>, dec: &Decoder) -> io::Result<()> {
        let slots: &[Slot] = plan
            .probes
            .get(ev.probe as usize)
            .map_or(&[], |p| p.event.as_slice());
        // Fields whose memory could not be read, and buffers longer than shown.
        let faulted = |i: usize| i < 32 && ev.faults & (1 << i) != 0;
        let mut e = record::Event {
            probe: dec.probe_name(ev.probe),
            ts_ns: ev.ts_ns,
            pid: ev.pid,
            tid: ev.tid,
            comm: &ev.comm,
            cpu: ev.cpu,
            fields: Fields(Vec::with_capacity(slots.len())),
            faulted: Vec::new(),
            truncated: Vec::new(),
        };
        for (i, s) in slots.iter().enumerate() {
            if faulted(i) {
                e.faulted.push(&s.name);
                e.fields.0.push((&s.name, None));
                continue;
            }
            let c = dec.cell(s, ev.data);
            if let Cell::Bytes(_, true) = c {
                e.truncated.push(&s.name);
            }
            e.fields.0.push((&s.name, Some(c)));
        }
        self.p.record(&Record::Event(e))
    }

    /// Reports what was lost, if anything: in JSON as records, in text on stderr.
    pub fn lost(&mut self, lost: Lost, interval: Option<u64>) -> io::Result<()> {
        for r in lost_records(lost, interval) {
            self.p.record(&r)?;
        }
        Ok(())
    }
}

/// A key with no parts and nothing counted.
static EMPTY: KeyAgg = KeyAgg {
    buckets: BTreeMap::new(),
};

/// Keys in the order of their cells (the order of `--by`).
fn cmp_keys(a: &Key<'_>, b: &Key<'_>) -> std::cmp::Ordering {
    a.0.iter().map(|(_, c)| c).cmp(b.0.iter().map(|(_, c)| c))
}

#[allow(clippy::too_many_arguments)]
fn hist_record<'a>(
    key: Key<'a>,
    value: &'a str,
    unit: HistUnit,
    layout: Buckets,
    agg: &KeyAgg,
    total: &AggVal,
    signed: bool,
    interval: Option<u64>,
) -> record::Hist<'a> {
    let buckets = agg
        .buckets
        .iter()
        .map(|(&i, v)| {
            let b = hist::bounds(layout, i);
            Bucket {
                low: b.low,
                high: b.high,
                count: v.count,
                index: i,
            }
        })
        .collect();
    record::Hist {
        key,
        value,
        unit,
        buckets,
        count: total.count,
        sum: Integer::new(total.sum, signed),
        interval,
        layout,
    }
}

/// The records of a loss report: ends without a start first (not a loss),
/// then each kind of loss that happened.
pub fn lost_records(lost: Lost, interval: Option<u64>) -> Vec<Record<'static>> {
    let mut out = Vec::new();
    if lost.unmatched > 0 {
        out.push(Record::Unmatched(record::Unmatched {
            count: lost.unmatched,
            interval,
        }));
    }
    let parts = [
        (lost.events, LostWhat::Events),
        (lost.keys, LostWhat::Keys),
        (lost.stacks, LostWhat::Stacks),
        (lost.nested, LostWhat::Nested),
        (lost.missed, LostWhat::Missed),
    ];
    for (count, what) in parts {
        if count > 0 {
            out.push(Record::Lost(record::Lost {
                count,
                what,
                interval,
            }));
        }
    }
    out
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
