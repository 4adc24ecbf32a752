//! `bpfscope count|hist|stats|trace`: the tracing engine's pipeline.

use std::cell::{Cell as StdCell, RefCell};
use std::io;
use std::mem::MaybeUninit;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use libbpf_rs::RingBufferBuilder;

use crate::attach::features::Features;
use crate::attach::libbpf_log;
use crate::attach::plan::{self, Plan};
use crate::attach::plan::{Path, ValueKind};
use crate::attach::session::Session;
use crate::attach::target::GatedChild;
use crate::cli::{Action, Target, TraceSettings};
use crate::collect::aggregate::KeyAgg;
use crate::collect::stacks;
use crate::collect::{aggregate, events, Lost, StopReason, Stopper};
use crate::render;
use crate::render::heatmap::Heatmap;
use crate::render::{Decoder, Output};
use bpfscope_sys::outfile::PendingFile;
use std::collections::{BTreeMap, BTreeSet};

pub fn run(s: TraceSettings) -> Result<()> {
    libbpf_log::init(s.load.verbose);
    bpfscope_sys::require_privileges().map_err(crate::error::Error::from)?;
    let features = Features::detect();
    let (roles, resolve_skipped) = plan::resolve_roles(&s.plan, &s.load.target)?;
    let plan = plan::build(&s.plan, roles, &features)?;
    if s.load.verbose {
        eprintln!(
            "raw_tp cookies: {}",
            if features.raw_tp_cookie { "yes" } else { "no" }
        );
        for p in &plan.probes {
            eprintln!("{}: {}", p.probe.name, p.path.describe());
        }
    }

    // Output files are opened before anything is loaded: a bad path must
    // not throw a whole run away at its end.
    let heatmap_file = s.heatmap.as_deref().map(PendingFile::reserve).transpose()?;
    let stack_file = s
        .stack_output
        .as_deref()
        .map(PendingFile::reserve)
        .transpose()?;

    bpfscope_sys::signals::install().context("installing signal handlers")?;
    let stopper = Stopper::new(s.duration)?;
    // The command is forked before any BPF object exists, so it can never
    // hold one; it waits at its gate until the probes are attached.
    let (gated, tracked) = GatedChild::for_target(&s.load.target)?;
    if let Target::Pid(pid) = s.load.target {
        stopper.watch_pid(pid)?;
    }
    let mut storage = MaybeUninit::uninit();
    let mut session =
        Session::load(&mut storage, &plan, &s.load, &features).map_err(crate::error::refused)?;
    if s.load.verbose {
        eprintln!("per-event path: {}", session.shape.describe());
    }
    if let Some(pid) = tracked {
        session.track(pid)?;
    }
    let user_pid = match s.load.target {
        Target::Pid(p) => p as i32,
        _ => -1,
    };
    match stopper.poll() {
        Some(StopReason::TargetExited) => {
            eprintln!(
                "bpfscope: the process exited before the probes were attached; nothing gathered"
            );
            return Ok(());
        }
        Some(_) => {
            eprintln!("bpfscope: interrupted before attaching; nothing gathered");
            return Ok(());
        }
        None => {}
    }
    // Events of a glob the kernel refuses are skipped and named; a probe
    // named on its own must attach.
    let globbed = plan::globbed(&s.plan);
    let mut att = match session.attach(&plan, gated.is_some(), user_pid, globbed) {
        Err(e) if crate::error::is_interrupted(&e) => {
            eprintln!("bpfscope: interrupted while attaching; nothing gathered");
            return Ok(());
        }
        // Whatever the kernel refused, the run cannot start: one line, exit 2.
        r => r.map_err(crate::error::refused)?,
    };
    att.skipped.extend(resolve_skipped);
    crate::attach::session::report_skipped(&att, s.load.verbose);
    // A signal between the last check and here must not let the command
    // run untraced: dropping the gate kills it instead. The ready line
    // comes after this last check: a signal from then on ends a run that
    // prints what it gathered.
    if gated.is_some() && bpfscope_sys::signals::interrupted() {
        eprintln!("bpfscope: interrupted before the command started; nothing gathered");
        return Ok(());
    }
    let n = att.probes;
    eprintln!("Attached {n} probe{}", if n == 1 { "" } else { "s" });
    stopper.start();
    let t0 = bpfscope_sys::monotonic_ns();
    if let Some(g) = gated {
        stopper.watch_child(g.release()?);
    }

    let mut out = Output::new(s.json, t0);
    let mut dec = Decoder::new(&plan);
    let result = if matches!(s.plan.action, Action::Trace { .. }) {
        run_events(&mut session, &plan, &stopper, &mut out, &dec)
    } else {
        let files = OutFiles {
            heatmap: heatmap_file,
            stacks: stack_file,
        };
        run_aggregates(&mut session, &plan, &s, &stopper, &mut out, &mut dec, files)
    };
    match result {
        Err(e) if crate::error::is_broken_pipe(&e) => Ok(()),
        r => r,
    }
}

/// Output files reserved before the run.
struct OutFiles {
    heatmap: Option<PendingFile>,
    stacks: Option<PendingFile>,
}

fn run_events(
    session: &mut Session<'_>,
    plan: &Plan,
    stopper: &Stopper,
    out: &mut Output,
    dec: &Decoder,
) -> Result<()> {
    let write_failed: StdCell<Option<io::Error>> = StdCell::new(None);
    {
        // The callback and the loop both write: the loop flushes after each
        // batch, so a pipe gets every line within one poll period, not when
        // a 64 KiB buffer fills.
        let shared = RefCell::new(&mut *out);
        let mut builder = RingBufferBuilder::new();
        builder.add(&session.skel.maps.events, |data: &[u8]| {
            if let Some(ev) = events::decode(data) {
                if let Err(e) = shared.borrow_mut().event(plan, &ev, dec) {
                    write_failed.set(Some(e));
                    return -1;
                }
            }
            0
        })?;
        let rb = builder.build().context("setting up the ring buffer")?;
        loop {
            // A callback error surfaces through write_failed; poll's own error is then moot.
            let polled = rb.poll(Duration::from_millis(10));
            if let Some(e) = write_failed.take() {
                return Err(e.into());
            }
            match polled {
                // A signal (Ctrl-C, or SIGSTOP/SIGCONT) only wakes the loop.
                Err(e) if e.kind() == libbpf_rs::ErrorKind::Interrupted => {}
                r => r.context("reading events")?,
            }
            // The program asks for a wakeup only once 64 KiB wait (a wakeup
            // per event costs more than the event): a slow trickle is read
            // here, so each line is out within one poll period.
            let consumed = rb.consume();
            if let Some(e) = write_failed.take() {
                return Err(e.into());
            }
            consumed.context("reading events")?;
            {
                let mut o = shared.borrow_mut();
                o.flush()?;
                // The reader went away (`| head` exited) while nothing was written.
                if o.closed() {
                    return Ok(());
                }
            }
            if let Some(reason) = stopper.poll() {
                if reason == StopReason::OutputClosed {
                    return Ok(());
                }
                break;
            }
        }
        session.detach();
        // Events already in the buffer still count.
        let drained = rb.consume();
        if let Some(e) = write_failed.take() {
            return Err(e.into());
        }
        drained.context("reading events")?;
    }
    let lost = Lost::of_session(session)?;
    out.lost(lost, None)?;
    out.flush()?;
    Ok(())
}

fn run_aggregates(
    session: &mut Session<'_>,
    plan: &Plan,
    s: &TraceSettings,
    stopper: &Stopper,
    out: &mut Output,
    dec: &mut Decoder,
    files: OutFiles,
) -> Result<()> {
    let signed = plan.value.as_ref().is_some_and(|v| v.1);
    let mut interval_no = 0u64;
    let started = Instant::now();
    let mut next = s.interval.map(|i| started + i);
    let mut lost_before = Lost::default();
    // Latency with intervals: a heatmap row per interval, the whole run's histogram at the end.
    let mut heat = match s.plan.action {
        Action::Latency { buckets, .. } if s.interval.is_some() => Some(Heatmap::new(buckets)),
        _ => None,
    };
    // In text, a heatmap row per interval stands for the interval's
    // histograms; JSON keeps a record per interval.
    let rows = heat.is_some() && !s.json;
    let mut total: BTreeMap<Vec<u8>, KeyAgg> = BTreeMap::new();
    if rows {
        if let Some(h) = &heat {
            out.raw_line(&h.terminal_header())?;
        }
    }
    loop {
        let wait = next.map_or(Duration::from_secs(3600), |n| {
            n.saturating_duration_since(Instant::now())
        });
        if stopper.wait(wait).is_some() {
            break;
        }
        let (Some(n), Some(every)) = (next, s.interval) else {
            continue;
        };
        if Instant::now() < n {
            continue;
        }
        interval_no += 1;
        next = Some(n + every);
        let epoch = interval_no as u32 - 1;
        session.set_epoch(epoch + 1);
        std::thread::sleep(crate::collect::EPOCH_GRACE);
        let data = aggregate::read_session(session, Some(epoch), signed, true)?;
        name_stacks(session, plan, &data, dec);
        if let Some(h) = &mut heat {
            h.add(started.elapsed().as_secs_f64(), &data);
            aggregate::merge_into(&mut total, &data, signed);
        }
        if rows {
            if let Some(h) = &heat {
                out.raw_line(&h.terminal_row())?;
            }
        } else {
            out.aggregates(plan, &s.plan.action, &data, dec, Some(interval_no))?;
        }
        let lost = Lost::of_session(session)?;
        out.lost(lost.since(lost_before), Some(interval_no))?;
        lost_before = lost;
        out.flush()?;
    }
    // Detach first so the final numbers are complete and stable.
    session.detach();
    let data = aggregate::read_session(session, None, signed, false)?;
    name_stacks(session, plan, &data, dec);
    let interval = s.interval.map(|_| interval_no + 1);
    if let Some(h) = &mut heat {
        h.add(started.elapsed().as_secs_f64(), &data);
        aggregate::merge_into(&mut total, &data, signed);
        if rows {
            out.raw_line(&h.terminal_row())?;
            out.raw_line("")?;
            out.aggregates(plan, &s.plan.action, &total, dec, None)?;
        } else {
            out.aggregates(plan, &s.plan.action, &data, dec, interval)?;
        }
        if let Some(f) = files.heatmap {
            let title = probe_names(plan, " -> ");
            commit(f, h.svg(&format!("latency: {title}")).as_bytes())?;
        }
    } else {
        out.aggregates(plan, &s.plan.action, &data, dec, interval)?;
    }
    if let Some(f) = files.stacks {
        let path = f.path().to_path_buf();
        let lines = render::folded_stacks(plan, &data, dec);
        let mut bytes = Vec::new();
        if path.extension().and_then(|e| e.to_str()) == Some("svg") {
            let title = probe_names(plan, ", ");
            render::flame::svg(
                &lines,
                &format!("bpfscope: {title}"),
                "events",
                false,
                &mut bytes,
            )?;
        } else {
            for l in &lines {
                bytes.extend_from_slice(l.as_bytes());
                bytes.push(b'\n');
            }
        }
        commit(f, &bytes)?;
    }
    let lost = Lost::of_session(session)?;
    out.lost(lost.since(lost_before), interval)?;
    out.flush()?;
    Ok(())
}

/// The probes' names, for titles.
fn probe_names(plan: &Plan, sep: &str) -> String {
    plan.probes
        .iter()
        .map(|p| p.probe.name.as_str())
        .collect::<Vec<_>>()
        .join(sep)
}

/// Names the stacks that stack keys refer to (the maps keep them after detaching).
fn name_stacks(
    session: &Session<'_>,
    plan: &Plan,
    data: &BTreeMap<Vec<u8>, KeyAgg>,
    dec: &mut Decoder,
) {
    let (k, u) = plan.stacks();
    if !(k || u) {
        return;
    }
    let (mut kids, mut uids) = (BTreeSet::new(), BTreeSet::new());
    for key in data.keys() {
        for slot in &plan.keys {
            let ValueKind::Stack { user } = slot.kind else {
                continue;
            };
            let Some(b) = key.get(slot.off..slot.off + 8) else {
                continue;
            };
            let w = u64::from_ne_bytes(b.try_into().unwrap_or([0xff; 8]));
            if user {
                if stacks::user_word(w).is_some() {
                    uids.insert(w);
                }
            } else if let Ok(id) = u32::try_from(w as i64) {
                kids.insert(id);
            }
        }
    }
    let probed: Vec<&std::path::Path> = plan
        .probes
        .iter()
        .filter_map(|p| match &p.path {
            Path::Uprobe { binary, .. } | Path::Usdt { binary, .. } => Some(binary.as_path()),
            _ => None,
        })
        .collect();
    let table = stacks::resolve(
        &session.skel.maps.kstacks,
        &session.skel.maps.ustacks,
        &kids,
        &uids,
        &probed,
        &bpfscope_symbolize::SymbolConfig::from_env(),
    );
    if table.unresolved > 0 {
        eprintln!(
            "bpfscope: {} user frames had no build id (shown as [unknown ADDR])",
            table.unresolved
        );
    }
    dec.set_stacks(table);
}

/// Gives a reserved output file its contents.
fn commit(f: PendingFile, bytes: &[u8]) -> Result<()> {
    let path = f.path().display().to_string();
    f.commit(bytes).with_context(|| format!("writing {path}"))
}
