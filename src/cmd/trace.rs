//! `bpfscope count|hist|stats|trace`: the tracing engine's pipeline.

use std::cell::{Cell as StdCell, RefCell};
use std::io;
use std::mem::MaybeUninit;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use libbpf_rs::RingBufferBuilder;

use crate::attach::features::Features;
use crate::attach::libbpf_log;
use crate::attach::plan::{self, Plan, Role};
use crate::attach::plan::{Path, ValueKind};
use crate::attach::session::Session;
use crate::attach::target::GatedChild;
use crate::cli::{Action, Target, TraceSettings};
use crate::collect::aggregate::KeyAgg;
use crate::collect::stacks;
use crate::collect::{aggregate, events, Lost, StopReason, Stopper};
use crate::probe;
use crate::render;
use crate::render::heatmap::Heatmap;
use crate::render::{Decoder, Output};
use bpfscope_sys::outfile::PendingFile;
use std::collections::{BTreeMap, BTreeSet};

/// How long in-flight program runs get to finish with the old epoch before it is read.
pub(crate) const EPOCH_GRACE: Duration = Duration::from_millis(10);

pub fn run(s: TraceSettings) -> Result<()> {
    libbpf_log::init(s.load.verbose);
    bpfscope_sys::require_privileges().map_err(crate::error::Error::from)?;
    let features = Features::detect();
    let (roles, resolve_skipped) = resolve_roles(&s)?;
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
    let globbed = globbed(&s.plan);
    let mut att = match session.attach(&plan, gated.is_some(), user_pid, globbed) {
        Err(e) if crate::error::is_interrupted(&e) => {
            eprintln!("bpfscope: interrupted while attaching; nothing gathered");
            return Ok(());
        }
        // Whatever the kernel refused, the run cannot start: one line, exit 2.
        r => r.map_err(crate::error::refused)?,
    };
    att.skipped.extend(resolve_skipped);
    report_skipped(&att, s.load.verbose);
    let n = att.probes;
    eprintln!("Attached {n} probe{}", if n == 1 { "" } else { "s" });
    stopper.start();
    let t0 = bpfscope_sys::monotonic_ns();
    if let Some(g) = gated {
        // A signal between the last check and here must not let the
        // command run untraced: dropping the gate kills it instead.
        if bpfscope_sys::signals::interrupted() {
            drop(g);
            eprintln!("bpfscope: interrupted before the command started; nothing gathered");
            return Ok(());
        }
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
        Err(e) if is_broken_pipe(&e) => Ok(()),
        r => r,
    }
}

/// Whether probes were named by a glob (whose refused matches are skipped).
pub(crate) fn globbed(plan: &crate::attach::plan::PlanConfig) -> bool {
    plan.probes.iter().any(|sp| match sp {
        probe::ProbeSpec::Tracepoint { subsys, event } => {
            [subsys, event].iter().any(|p| p.contains(['*', '?']))
        }
        probe::ProbeSpec::Usdt { provider, name, .. } => {
            [provider, name].iter().any(|p| p.contains(['*', '?']))
        }
        _ => false,
    })
}

/// Says which probes could not be attached (with -v, why, and how
/// kernel functions ended up attached).
pub(crate) fn report_skipped(att: &crate::attach::session::Attached, verbose: bool) {
    if verbose {
        for n in &att.notes {
            eprintln!("{n}");
        }
    }
    if att.skipped.is_empty() {
        return;
    }
    let n = att.skipped.len();
    if verbose {
        eprintln!("skipped {n} probe{}:", if n == 1 { "" } else { "s" });
        for (name, why) in &att.skipped {
            eprintln!("  {name}: {why}");
        }
        return;
    }
    const SHOWN: usize = 8;
    let names: Vec<&str> = att
        .skipped
        .iter()
        .take(SHOWN)
        .map(|(p, _)| p.as_str())
        .collect();
    let more = if n > SHOWN { ", ..." } else { "" };
    eprintln!(
        "skipped {n} probe{} that cannot be attached: {}{more} (-v says why)",
        if n == 1 { "" } else { "s" },
        names.join(", ")
    );
}

/// Probes in their latency roles, and (name, reason) of pattern matches that cannot be probed.
type Roles = (Vec<(probe::Probe, Role)>, Vec<(String, String)>);

/// Resolves the probes, and for latency the starts and ends they pair.
pub(crate) fn resolve_roles(s: &TraceSettings) -> Result<Roles> {
    let pid = match s.load.target {
        Target::Pid(p) => Some(p),
        _ => None,
    };
    let resolved = probe::resolve_all(&s.plan.probes, pid)?;
    let (starts, skipped) = (resolved.probes, resolved.skipped);
    if !matches!(s.plan.action, Action::Latency { .. }) {
        return Ok((
            starts.into_iter().map(|p| (p, Role::Plain)).collect(),
            skipped,
        ));
    }
    let mut out = Vec::new();
    match s.plan.latency_end() {
        // START and END events: every start pairs with every end on the match fields.
        Some(end) => {
            let ends = probe::resolve(std::slice::from_ref(end), pid)?;
            out.extend(starts.into_iter().map(|p| (p, Role::Start(0))));
            out.extend(ends.into_iter().map(|p| (p, Role::End(0))));
        }
        // A function: each entry pairs with its own return, per thread.
        None => {
            for (i, p) in starts.into_iter().enumerate() {
                let ret = probe::returning(&p).ok_or_else(|| {
                    crate::usage!("{}: latency needs a function entry probe", p.name)
                })?;
                out.push((p, Role::Start(i as u32)));
                out.push((ret, Role::End(i as u32)));
            }
        }
    }
    Ok((out, skipped))
}

/// Output files reserved before the run.
struct OutFiles {
    heatmap: Option<PendingFile>,
    stacks: Option<PendingFile>,
}

/// A reader that went away (`| head`): the run ends quietly.
pub(crate) fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<io::Error>()
            .is_some_and(|io| io.kind() == io::ErrorKind::BrokenPipe)
    })
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
    let mut lost = Lost::read(&session.skel.maps.lost)?;
    lost.nested = session.recursion_misses();
    lost.missed = session.kprobe_misses();
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
        set_epoch(session, epoch + 1);
        std::thread::sleep(EPOCH_GRACE);
        let data = aggregate::read(&session.skel.maps.aggs, Some(epoch), signed, true)?;
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
        let mut lost = Lost::read(&session.skel.maps.lost)?;
        lost.nested = session.recursion_misses();
        lost.missed = session.kprobe_misses();
        out.lost(lost.since(lost_before), Some(interval_no))?;
        lost_before = lost;
        out.flush()?;
    }
    // Detach first so the final numbers are complete and stable.
    session.detach();
    let data = aggregate::read(&session.skel.maps.aggs, None, signed, false)?;
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
    let mut lost = Lost::read(&session.skel.maps.lost)?;
    lost.nested = session.recursion_misses();
    lost.missed = session.kprobe_misses();
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
            let id = i64::from_ne_bytes(b.try_into().unwrap_or([0xff; 8]));
            if let Ok(id) = u32::try_from(id) {
                if user { &mut uids } else { &mut kids }.insert(id);
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

pub(crate) fn set_epoch(session: &mut Session<'_>, epoch: u32) {
    if let Some(bss) = session.skel.maps.bss_data.as_deref_mut() {
        // SAFETY: bss is the mmap'd .bss of the loaded object, valid for the
        // skeleton's lifetime; a volatile write keeps the store visible to the kernel.
        unsafe { std::ptr::write_volatile(&mut bss.epoch, epoch) };
    }
}
