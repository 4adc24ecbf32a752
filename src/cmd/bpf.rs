//! `bpfscope bpf list|top`: the BPF programs on this machine.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::time::{Duration, Instant};

use anyhow::Result;
use libbpf_rs::btf::{types::Func, Btf};
use libbpf_rs::query::{LinkInfoIter, LinkTypeInfo, PerfEventType};
use libbpf_rs::ProgramAttachType;

use crate::bpfmeta::stats::{self, StatsGuard};
use crate::cli::BpfSettings;
use crate::collect::Stopper;
use crate::render::printer::{Printer, Table};
use crate::render::record::{AnnotateLine, BpfAnnotate, BpfProg, Record};
use crate::render::term::{wait_or_key, Cbreak, Wake};

pub fn run(s: BpfSettings) -> Result<()> {
    if let BpfSettings::Annotate {
        recording,
        prog,
        json,
    } = &s
    {
        // Reads a file only: no privileges needed, and it works on any machine.
        return annotate(recording, prog.as_deref(), *json);
    }
    bpfscope_sys::require_privileges().map_err(crate::error::Error::from)?;
    match s {
        BpfSettings::List { json } => list(json),
        BpfSettings::Top {
            interval,
            duration,
            json,
            rows,
        } => top(interval, duration, json, rows),
        BpfSettings::Annotate { .. } => Ok(()),
    }
}

/// Where one sample landed in a program: a source line, or a JIT offset without line info.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Spot {
    Line {
        file: String,
        line: u32,
        text: String,
    },
    Offset {
        symbol: String,
        offset: u64,
    },
}

fn annotate(path: &std::path::Path, want: Option<&str>, json: bool) -> Result<()> {
    use bpfscope_recording::bpfprog::{lookup, BpfProg};
    let rec = bpfscope_recording::read(path).map_err(|e| crate::usage!("{e}"))?;
    let progs: Vec<&BpfProg> = rec
        .bpf_programs
        .iter()
        .filter(|p| want.is_none_or(|w| w == p.name || w.parse::<u32>() == Ok(p.id)))
        .collect();
    if let Some(w) = want {
        if progs.is_empty() {
            let have: Vec<String> = rec
                .bpf_programs
                .iter()
                .map(|p| format!("{} ({})", p.name, p.id))
                .collect();
            return Err(crate::usage!(
                "no BPF program '{w}' in {}; it has: {}",
                path.display(),
                if have.is_empty() {
                    "none".into()
                } else {
                    have.join(", ")
                }
            )
            .into());
        }
    }
    // Each sample goes to the innermost BPF program frame of its kernel
    // stack: the line that was running, or that called what was running.
    let mut per: BTreeMap<u32, (u64, BTreeMap<Spot, u64>)> = BTreeMap::new();
    for s in &rec.stacks {
        let hit = s.kernel.iter().enumerate().find_map(|(i, &a)| {
            // Return addresses point after the call; the call itself is one byte back.
            let a = if i > 0 { a.saturating_sub(1) } else { a };
            lookup(&rec.bpf_programs, a)
        });
        let Some(f) = hit else {
            continue;
        };
        if !progs.iter().any(|p| p.id == f.prog.id) {
            continue;
        }
        let spot = match f.line {
            Some(l) => Spot::Line {
                file: l.file.clone(),
                line: l.line,
                text: l.text.clone(),
            },
            None => Spot::Offset {
                symbol: f.symbol.to_string(),
                offset: f.offset,
            },
        };
        let e = per.entry(f.prog.id).or_default();
        e.0 += s.value;
        *e.1.entry(spot).or_default() += s.value;
    }
    let unit = if rec.meta.mode == "offcpu" {
        "ns"
    } else {
        "samples"
    };
    let mut out = Printer::new(json, io::BufWriter::new(io::stdout().lock()));
    for p in &progs {
        let (total, spots) = per.remove(&p.id).unwrap_or_default();
        let main = p
            .subprogs
            .first()
            .map_or(p.name.as_str(), |s| s.symbol.as_str());
        let lines = spots
            .into_iter()
            .map(|(spot, count)| match spot {
                Spot::Line { file, line, text } => AnnotateLine::Source {
                    count,
                    file,
                    line,
                    source: text,
                },
                Spot::Offset { symbol, offset } => AnnotateLine::Offset {
                    count,
                    symbol,
                    offset,
                },
            })
            .collect();
        out.record(&Record::BpfAnnotate(BpfAnnotate {
            id: p.id,
            name: p.name.clone(),
            tag: p.tag.clone(),
            prog_type: p.prog_type.clone(),
            symbol: main.to_string(),
            unit,
            total,
            unloaded: p.unloaded_ns.is_some(),
            lines,
            line_info: !p.lines.is_empty(),
        }))?;
    }
    if progs.is_empty() {
        out.text(&format!(
            "no BPF programs ran in the sampled kernel stacks of {}",
            path.display()
        ))?;
    }
    Ok(out.flush()?)
}

/// What each program is attached to, from the kernel's BPF links.
fn attach_points() -> HashMap<u32, Vec<String>> {
    let mut vmlinux: Option<Option<Btf<'static>>> = None;
    let mut out: HashMap<u32, Vec<String>> = HashMap::new();
    for link in LinkInfoIter::default() {
        let what = match &link.info {
            LinkTypeInfo::RawTracepoint(r) => format!("raw_tp:{}", r.name),
            LinkTypeInfo::Tracing(t) => {
                let kind = match t.attach_type {
                    ProgramAttachType::TraceFentry => "fentry",
                    ProgramAttachType::TraceFexit => "fexit",
                    ProgramAttachType::TraceRawTp => "tp_btf",
                    ProgramAttachType::ModifyReturn => "fmod_ret",
                    _ => "tracing",
                };
                // The target's name, from vmlinux BTF (module targets keep their id).
                let btf = vmlinux.get_or_insert_with(|| Btf::from_vmlinux().ok());
                let name = btf
                    .as_ref()
                    .and_then(|b| b.type_by_id::<Func<'_>>(t.target_btf_id.into()))
                    .and_then(|f| f.name().map(|n| n.to_string_lossy().into_owned()));
                match name {
                    Some(n) => format!("{kind}:{n}"),
                    None => format!("{kind}:btf#{}", t.target_btf_id),
                }
            }
            LinkTypeInfo::KprobeMulti(k) => {
                let kind = if k.flags & 1 != 0 {
                    "kretprobe_multi"
                } else {
                    "kprobe_multi"
                };
                format!("{kind} ({} functions)", k.count)
            }
            LinkTypeInfo::UprobeMulti(u) => format!(
                "uprobe_multi:{} ({} functions)",
                u.path
                    .as_ref()
                    .map_or("?".into(), |p| p.display().to_string()),
                u.count
            ),
            LinkTypeInfo::PerfEvent(p) => match &p.event_type {
                PerfEventType::Tracepoint { name, .. } => format!(
                    "tracepoint:{}",
                    name.as_ref().map_or("?".into(), |n| n.to_string_lossy())
                ),
                PerfEventType::Kprobe {
                    func_name,
                    is_retprobe,
                    ..
                } => format!(
                    "{}:{}",
                    if *is_retprobe { "kretprobe" } else { "kprobe" },
                    func_name
                        .as_ref()
                        .map_or("?".into(), |n| n.to_string_lossy())
                ),
                PerfEventType::Uprobe {
                    file_name,
                    is_retprobe,
                    offset,
                    ..
                } => format!(
                    "{}:{}+{offset:#x}",
                    if *is_retprobe { "uretprobe" } else { "uprobe" },
                    file_name
                        .as_ref()
                        .map_or("?".into(), |n| n.to_string_lossy())
                ),
                PerfEventType::Event {
                    config, event_type, ..
                } => format!("perf_event:{event_type}/{config}"),
                PerfEventType::Unknown(t) => format!("perf_event:{t}"),
            },
            LinkTypeInfo::Cgroup(c) => format!("cgroup:{} {:?}", c.cgroup_id, c.attach_type),
            LinkTypeInfo::Iter(i) => format!("iter:{}", i.target_name.to_string_lossy()),
            LinkTypeInfo::Xdp(x) => format!("xdp:ifindex {}", x.ifindex),
            LinkTypeInfo::Netfilter(_) => "netfilter".into(),
            LinkTypeInfo::NetNs(_) => "netns".into(),
            LinkTypeInfo::Tcx(_) => "tcx".into(),
            LinkTypeInfo::Netkit(_) => "netkit".into(),
            LinkTypeInfo::SockMap(_) => "sockmap".into(),
            LinkTypeInfo::StructOps(_) => "struct_ops".into(),
            _ => "link".into(),
        };
        out.entry(link.prog_id).or_default().push(what);
    }
    // Before 6.6 a perf event link's info has no event: its kind reads as
    // 0. The events themselves say what they are, asked through the
    // descriptors their owners hold.
    let untold = "perf_event:0";
    if out.values().flatten().any(|w| w == untold) {
        let events = crate::bpfmeta::info::perf_event_attachments();
        for (id, v) in out.iter_mut() {
            if let Some(told) = events.get(id).filter(|_| v.iter().any(|w| w == untold)) {
                v.retain(|w| w != untold);
                v.extend(told.iter().cloned());
            }
        }
    }
    out
}

fn avg(cnt: u64, time: u64) -> Option<f64> {
    (cnt > 0).then(|| time as f64 / cnt as f64)
}

fn list(json: bool) -> Result<()> {
    let progs = stats::snapshot();
    let mut attached = attach_points();
    let rows: Vec<Record<'_>> = progs
        .into_iter()
        .map(|p| {
            Record::BpfProg(BpfProg {
                attached: Some(attached.remove(&p.id).unwrap_or_default()),
                avg_ns: avg(p.run_cnt, p.run_time_ns),
                cpu_pct: None,
                id: p.id,
                name: p.name,
                tag: p.tag,
                prog_type: p.prog_type,
                run_cnt: p.run_cnt,
                run_time_ns: p.run_time_ns,
            })
        })
        .collect();
    let mut out = Printer::new(json, io::BufWriter::new(io::stdout().lock()));
    out.table(&Table::BpfList, &rows)?;
    Ok(out.flush()?)
}

fn top(interval: Duration, duration: Option<Duration>, json: bool, rows: usize) -> Result<()> {
    let json = json || !crate::render::term::stdout_is_tty();
    let _stats = StatsGuard::enable()?;
    let stopper = Stopper::new(duration)?;
    stopper.start();
    let mut prev: BTreeMap<u32, (u64, u64)> = stats::snapshot()
        .into_iter()
        .map(|p| (p.id, (p.run_cnt, p.run_time_ns)))
        .collect();
    let mut last = Instant::now();
    let mut out = Printer::new(json, io::BufWriter::new(io::stdout()));
    // Keys are read only in the terminal view, with the terminal on stdin.
    let mut keys = if json { None } else { Cbreak::enable() };
    eprintln!(
        "Watching BPF programs (run-time statistics on until bpfscope exits){}",
        if keys.is_some() { "; q quits" } else { "" }
    );
    loop {
        let stop = match wait_or_key(&stopper, interval.saturating_sub(last.elapsed()), &mut keys) {
            Wake::Quit => return Ok(()),
            Wake::Stop => Some(()),
            Wake::Tick => None,
        };
        let now = stats::snapshot();
        let elapsed = last.elapsed();
        last = Instant::now();
        let el_ns = elapsed.as_nanos().max(1) as f64;
        let mut rowv: Vec<BpfProg> = now
            .iter()
            .map(|p| {
                // A program loaded during the interval counts from zero.
                let (c0, t0) = prev.get(&p.id).copied().unwrap_or((0, 0));
                let (cnt, time) = (
                    p.run_cnt.saturating_sub(c0),
                    p.run_time_ns.saturating_sub(t0),
                );
                BpfProg {
                    id: p.id,
                    name: p.name.clone(),
                    tag: p.tag.clone(),
                    prog_type: p.prog_type.clone(),
                    attached: None,
                    run_cnt: cnt,
                    run_time_ns: time,
                    avg_ns: Some(avg(cnt, time).unwrap_or(0.0)),
                    cpu_pct: Some(time as f64 * 100.0 / el_ns),
                }
            })
            .collect();
        rowv.sort_by(|a, b| b.run_time_ns.cmp(&a.run_time_ns).then(a.id.cmp(&b.id)));
        let rowv: Vec<Record<'_>> = rowv.into_iter().map(Record::BpfProg).collect();
        let r = out
            .table(&Table::BpfTop { elapsed, rows }, &rowv)
            .and_then(|_| out.flush());
        if let Err(e) = r {
            if e.kind() == io::ErrorKind::BrokenPipe {
                return Ok(());
            }
            return Err(e.into());
        }
        prev = now
            .iter()
            .map(|p| (p.id, (p.run_cnt, p.run_time_ns)))
            .collect();
        if stop.is_some() {
            return Ok(());
        }
    }
}
