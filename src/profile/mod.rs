//! Profile stage: sampling stacks with in-kernel aggregation (on-CPU via
//! perf events, off-CPU via sched_switch), snapshots of mappings for raw
//! frames, and the recording format that carries it all to `report`.

pub mod continuous;
pub mod live;
pub mod maps;
pub mod python;
pub mod session;
pub mod unwind;

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::mem::MaybeUninit;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use libbpf_rs::RingBufferBuilder;

use crate::attach::libbpf_log;
use crate::attach::target::GatedChild;
use crate::attach::target::Target;
use crate::bpfmeta::guarded::{Guarded, GuardedSampler};
use crate::bpfmeta::sideband::SideBand;
use crate::bpfmeta::stats::{self, StatsGuard};
use crate::collect::{StopReason, Stopper};
use bpfscope_bpf::profile::types::{bp_note, bp_note_kind};
use bpfscope_bpf::stack::UserFrame;
use bpfscope_recording::bpfprog::BpfProg;
use bpfscope_recording::{
    Binary, CpuAccount, KernelSymbol, LostCounts, Meta, Recording, RuntimeFrame, Stack,
    BPF_RUN_TIME,
};
use bpfscope_symbolize::kernel;
use bpfscope_sys::pod;
use maps::Snapshots;
use session::{KernelLost, ProfileSession, RawStack};

/// When announced processes' mappings are read again (once: reads cost
/// CPU, and libraries opened later in long-lived processes are caught by
/// the last look at the end).
pub const RELOOK: [Duration; 1] = [Duration::from_millis(50)];

/// What is sampled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// On-CPU samples at a frequency.
    Cpu,
    /// Time blocked, from context switches.
    OffCpu,
}

/// A `SamplingConfig::duration` that never ends the run: it runs until a
/// signal or the command's exit (or, in the agent, for good).
pub const UNTIL_STOPPED: Duration = Duration::MAX;

/// The sampling stage's config: what is sampled, where, how often.
#[derive(Debug, Clone)]
pub struct SamplingConfig {
    pub mode: Mode,
    pub frequency: u64,
    /// `UNTIL_STOPPED`: no deadline.
    pub duration: Duration,
    pub target: Target,
    /// cgroup v2 path, when the target is a cgroup.
    pub cgroup: Option<PathBuf>,
    pub kernel: bool,
    pub user: bool,
    pub max_stacks: u32,
    /// Frames per user stack (kernel stacks stop at 127).
    pub max_depth: u32,
    /// Unwind table entries the kernel side can hold (8 bytes each).
    pub unwind_entries: u32,
    /// Key samples by thread name and cgroup as well (the agent's labels).
    pub labels: bool,
    /// Which language runtimes' frames to name.
    pub runtimes: Runtimes,
    pub verbose: bool,
}

/// Language runtimes whose frames are named (`--lang`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Runtimes {
    /// CPython frames, read in the kernel.
    pub python: bool,
    /// JIT code named from perf maps and jitdump files.
    pub jit: bool,
}

impl Default for Runtimes {
    fn default() -> Self {
        Runtimes {
            python: true,
            jit: true,
        }
    }
}

/// What a sampling run gathered, before it becomes a recording.
pub struct Sampled {
    pub stacks: Vec<RawStack>,
    pub snapshots: Snapshots,
    pub lost: KernelLost,
    /// kallsyms entries of the kernel frames, taken while bpfscope's own
    /// programs were still loaded (their kallsyms entries go with them).
    pub kernel_symbols: Vec<KernelSymbol>,
    /// BPF programs whose JIT code the kernel frames hit, as captured while loaded.
    pub bpf_programs: Vec<BpfProg>,
    /// Side-band records the kernel dropped (program loads or unloads missed).
    pub sideband_lost: u64,
    pub start_unix_ns: u64,
    pub duration: Duration,
    pub cpus: u32,
    /// Run time (ns) during the run of each BPF program that keeps the
    /// sampling program from running (by program id), from BPF run-time
    /// statistics; empty for off-CPU profiles or without statistics.
    pub blocked_bpf_ns: Vec<(u32, u64)>,
    /// Samples in guarded BPF programs taken by the second sampler (in
    /// `stacks`), and its samples dropped (ring full or no room).
    pub bpf_sampled: u64,
    pub guarded_lost: u64,
    /// What loading unwind tables cost, and the memory they took.
    pub tables: unwind::TableStats,
    pub table_bytes: u64,
    /// Python code objects announced, to name Python frames.
    pub codes: python::Codes,
    /// Notes on interpreters: those found, and those whose frames could not
    /// be read (an unsupported version).
    pub runtime_notes: Vec<String>,
    /// Files with a Python runtime whose frames could not be read.
    pub python_unsupported: u64,
}

/// Runs one sampling session until the duration, Ctrl-C or the command's exit.
pub fn sample(s: &SamplingConfig) -> Result<Sampled> {
    libbpf_log::init(s.verbose);
    bpfscope_sys::require_privileges().map_err(crate::error::Error::from)?;
    bpfscope_sys::signals::install().context("installing signal handlers")?;
    let stopper = Stopper::new((s.duration != UNTIL_STOPPED).then_some(s.duration))?;
    // The command is forked before any BPF object exists, so it can never
    // hold one; it waits at its gate until sampling runs.
    let (gated, tracked) = GatedChild::for_target(&s.target)?;
    if let Target::Pid(pid) = s.target {
        stopper.watch_pid(pid)?;
    }
    let mut storage = MaybeUninit::uninit();
    let mut session = ProfileSession::load(&mut storage, s).map_err(crate::error::refused)?;
    if let Some(pid) = tracked {
        session.track(pid)?;
    }
    // Follow BPF program loads from before sampling starts: a program may
    // come and go during the profile, and its info must be read while it exists.
    let sideband = match SideBand::start() {
        Ok(sb) => Some(sb),
        Err(e) => {
            eprintln!("bpfscope: BPF programs will show without names: {e:#}");
            None
        }
    };
    // Tables that every process needs, before any hook can hand out file
    // ids (the counter is set once, here, while no program is attached).
    let mut snapshots = Snapshots::with_jit(s.runtimes.jit);
    if s.user {
        let mut next_id = preload_shared(&mut session, &mut snapshots);
        if let Target::Command { program, .. } = &s.target {
            if let Err(e) = unwind::preload_program(
                program,
                unwind::FileMaps::of(&session.skel),
                &mut session.tables,
                &mut snapshots,
                &mut next_id,
            ) {
                eprintln!("bpfscope: the command's unwind table loads on first use: {e:#}");
            }
        }
        session.reserve_file_ids(next_id);
    }
    if bpfscope_sys::signals::interrupted() {
        return Err(crate::error::Error::Interrupted.into());
    }
    let n = session
        .attach(s, gated.is_some())
        .map_err(crate::error::refused)?;
    // A running process's mappings, for the unwinder, before its first sample.
    if let (Target::Pid(pid), true) = (&s.target, s.user) {
        session.build(*pid);
    }
    let own_progs = crate::bpfmeta::info::own_prog_ids();
    let mut blocked = BlockedBpf::new(s);
    if let Some(b) = blocked.as_mut() {
        if let Some(sb) = &sideband {
            b.watch(sb, own_progs.clone());
        }
        b.check(sideband.as_ref(), &own_progs);
    }
    let start_unix_ns = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    stopper.start();
    let t0 = Instant::now();
    // A signal since attaching must not let the command run untraced. The
    // ready line comes after that last check: a signal from then on ends a
    // run that writes what it gathered (a signal sent on the line once
    // found this check, and the run ended with nothing written).
    if gated.is_some() && bpfscope_sys::signals::interrupted() {
        return Err(crate::error::Error::Interrupted.into());
    }
    announce(s, n);
    if let Some(g) = gated {
        stopper.watch_child(g.release()?);
    }

    // New processes are announced on a ring buffer; their mappings are
    // read right away, while they still exist.
    let reason = follow_processes(
        &mut session,
        &stopper,
        &mut snapshots,
        blocked
            .as_mut()
            .map(|b| (b, sideband.as_ref(), &own_progs[..])),
    )?;
    if let (Some(StopReason::Duration), Target::Command { .. }) = (reason, &s.target) {
        eprintln!(
            "bpfscope: --duration ended the profile before the command exited; it is sent SIGTERM when bpfscope exits"
        );
    }
    let (blocked_bpf_ns, guarded) = match blocked {
        Some(b) => b.finish(&own_progs),
        None => (Vec::new(), None),
    };
    let (mut all_progs, sideband_lost) = sideband.map(SideBand::finish).unwrap_or_default();
    // Programs measured but not seen by the side-band (it failed to start).
    for &(id, _) in &blocked_bpf_ns {
        if !all_progs.iter().any(|p| p.id == id) {
            if let Ok(p) = crate::bpfmeta::info::fetch(id) {
                all_progs.push(p);
            }
        }
    }
    let duration = t0.elapsed();
    let codes = std::mem::take(&mut session.codes);
    let mut sampled = read_out(
        s,
        &session,
        snapshots,
        all_progs,
        blocked_bpf_ns,
        guarded.map(|g| (g, own_progs)),
    )?;
    sampled.sideband_lost = sideband_lost;
    sampled.codes = codes;
    sampled.start_unix_ns = start_unix_ns;
    sampled.duration = duration;
    Ok(sampled)
}

/// Loads the unwind tables every process needs (the vDSO, the C library
/// and dynamic loader bpfscope itself maps) before any hook can hand out
/// file ids; the first id left for the kernel side to give out.
pub fn preload_shared(session: &mut ProfileSession<'_>, snapshots: &mut Snapshots) -> u32 {
    if let Err(e) = unwind::load_vdso(
        unwind::FileMaps::of(&session.skel),
        &mut session.tables,
        snapshots,
    ) {
        eprintln!("bpfscope: frames in the vDSO are unwound by frame pointers: {e:#}");
    }
    let mut next_id = unwind::VDSO_ID + 1;
    if let Err(e) = unwind::preload_own(
        unwind::FileMaps::of(&session.skel),
        &mut session.tables,
        snapshots,
        &mut next_id,
    ) {
        eprintln!("bpfscope: shared libraries' unwind tables load on first use: {e:#}");
    }
    next_id
}

/// The first line of a run: what is sampled, where.
fn announce(s: &SamplingConfig, n: usize) {
    match s.mode {
        Mode::Cpu => eprintln!(
            "Attached: sampling {n} CPU{} at {} Hz{}",
            if n == 1 { "" } else { "s" },
            s.frequency,
            describe_target(s)
        ),
        Mode::OffCpu => eprintln!(
            "Attached: off-CPU time at sched_switch{}",
            describe_target(s)
        ),
    }
}

/// Until the run stops: snapshots the mappings of every process the
/// programs announce, and looks again shortly after (a process is often
/// announced while the dynamic loader is still mapping its libraries).
/// Detaches the programs when the run stops.
fn follow_processes(
    session: &mut ProfileSession<'_>,
    stopper: &Stopper,
    snapshots: &mut Snapshots,
    mut blocked: Option<(&mut BlockedBpf, Option<&SideBand>, &[u32])>,
) -> Result<Option<StopReason>> {
    let fresh: RefCell<Vec<Note>> = RefCell::new(Vec::new());
    let reason;
    {
        let mut builder = RingBufferBuilder::new();
        builder.add(&session.skel.maps.procs, |data: &[u8]| {
            if let Some(n) = Note::parse(data) {
                fresh.borrow_mut().push(n);
            }
            0
        })?;
        let rb = builder.build().context("setting up the ring buffer")?;
        let mut again: VecDeque<(Instant, u32, usize)> = VecDeque::new();
        loop {
            // Sleep until a process is announced, a stop reason arrives, a
            // second look is due or the duration ends: no periodic wakeups.
            let due = again
                .front()
                .map(|(t, _, _)| t.saturating_duration_since(Instant::now()));
            let timeout = match (stopper.remaining(), due) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            // While no program that blocks sampling is loaded, look again
            // whenever the side-band sees a load.
            let mut fds = vec![rb.epoll_fd(), stopper.wake_fd().as_raw_fd()];
            if let Some((b, sb, own)) = blocked.as_mut() {
                if let Some(sb) = sb {
                    sb.loads_seen();
                }
                b.check(*sb, own);
                // (Without a side-band, `check` never leaves it waiting.)
                if let (true, Some(sb)) = (b.waiting(), sb) {
                    fds.push(sb.loads_fd());
                }
            }
            wait_readable(&fds, timeout);
            rb.consume().context("reading process notifications")?;
            let now = Instant::now();
            let notes: Vec<Note> = fresh.borrow_mut().drain(..).collect();
            for n in notes {
                if let Some(pid) = handle_note_or_say(session, snapshots, &n) {
                    again.push_back((now + RELOOK[0], pid, 1));
                }
            }
            while again.front().is_some_and(|(t, _, _)| *t <= now) {
                let Some((_, pid, n)) = again.pop_front() else {
                    break;
                };
                if snapshots.snapshot(pid) {
                    if let Some(d) = RELOOK.get(n) {
                        // Keep the queue ordered by due time.
                        let at = now + *d;
                        let i = again.partition_point(|(t, _, _)| *t <= at);
                        again.insert(i, (at, pid, n + 1));
                    }
                }
            }
            if let Some(r) = stopper.poll() {
                reason = Some(r);
                break;
            }
        }
        session.detach();
        let _ = rb.consume();
    }
    for n in fresh.into_inner() {
        match n {
            Note::Code(data) => session.codes.note(&data),
            Note::Plain(n) if n.kind == bp_note_kind::BP_NOTE_FILE.0 => {
                if let Err(e) = load_noted_file(session, snapshots, &n) {
                    say_note_failed(&e);
                }
            }
            Note::Plain(n) => {
                snapshots.snapshot(n.tgid);
            }
        }
    }
    Ok(reason)
}

/// A record of the profiler's ring buffer.
pub enum Note {
    /// A process, a file, or a process whose mappings went stale.
    Plain(bp_note),
    /// A Python code object seen for the first time: the record, kept
    /// until it is read (it is larger than the others).
    Code(Vec<u8>),
}

impl Note {
    pub fn parse(data: &[u8]) -> Option<Note> {
        let kind = pod::read::<u32>(data)?;
        if kind == bp_note_kind::BP_NOTE_CODE.0 {
            return Some(Note::Code(data.to_vec()));
        }
        pod::read::<bp_note>(data).map(Note::Plain)
    }
}

/// Acts on one announcement: a file's unwind table is loaded; a process's
/// mappings are built for the unwinder and snapshotted; a code object is
/// kept. The process to look at again shortly, when a new one was
/// snapshotted (the dynamic loader may still be mapping its libraries).
pub fn handle_note(
    session: &mut ProfileSession<'_>,
    snapshots: &mut Snapshots,
    note: &Note,
) -> Result<Option<u32>> {
    let n = match note {
        Note::Code(data) => {
            session.codes.note(data);
            return Ok(None);
        }
        Note::Plain(n) => n,
    };
    if n.kind == bp_note_kind::BP_NOTE_FILE.0 {
        load_noted_file(session, snapshots, n)?;
        return Ok(None);
    }
    session.build(n.tgid);
    Ok((n.kind == bp_note_kind::BP_NOTE_PROC.0 && snapshots.snapshot(n.tgid)).then_some(n.tgid))
}

/// `handle_note`, a failure said (the first one) and not passed on: one
/// file or process that cannot be read must not cost the others theirs
/// (the notes read with it were dropped, their files' frames unnamed for
/// the rest of the run), nor end the profile.
pub fn handle_note_or_say(
    session: &mut ProfileSession<'_>,
    snapshots: &mut Snapshots,
    note: &Note,
) -> Option<u32> {
    handle_note(session, snapshots, note).unwrap_or_else(|e| {
        say_note_failed(&e);
        None
    })
}

/// Says the first announcement that could not be handled (more would
/// repeat it for every process of the same kind).
fn say_note_failed(e: &anyhow::Error) {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
        eprintln!("bpfscope: a process or file announcement could not be handled (its frames may stay unnamed; later ones not said): {e:#}");
    }
}

/// Loads the unwind table of a file the kernel side announced.
fn load_noted_file(
    session: &mut ProfileSession<'_>,
    snapshots: &mut Snapshots,
    n: &bp_note,
) -> Result<()> {
    unwind::load_file(
        n,
        unwind::FileMaps::of(&session.skel),
        &mut session.tables,
        snapshots,
    )
}

/// After the run: the unique stacks, the kernel symbols and BPF programs
/// their kernel frames hit, the mappings of every process seen, the losses.
fn read_out(
    s: &SamplingConfig,
    session: &ProfileSession<'_>,
    mut snapshots: Snapshots,
    all_progs: Vec<BpfProg>,
    blocked_bpf_ns: Vec<(u32, u64)>,
    guarded: Option<(Guarded, Vec<u32>)>,
) -> Result<Sampled> {
    let mut stacks = session.read_stacks()?;
    let mut bpf_sampled = 0;
    let mut guarded_lost = 0;
    let mut guarded_per_cpu: HashMap<u32, u64> = HashMap::new();
    if let Some((g, own)) = guarded {
        guarded_lost = g.lost + g.no_room;
        let (extra, per_cpu) = guarded_stacks(g, &all_progs, &own, &stacks);
        bpf_sampled = extra.iter().map(|s| s.count).sum();
        stacks.extend(extra);
        guarded_per_cpu = per_cpu;
    }
    let kernel_addrs: BTreeSet<u64> = stacks
        .iter()
        .flat_map(|s| s.kernel.iter().copied())
        .collect();
    // Return addresses are one past the call: a program's last call can sit at its end.
    let bpf_programs: Vec<BpfProg> = all_progs
        .into_iter()
        .filter(|p| {
            blocked_bpf_ns.iter().any(|&(id, _)| id == p.id)
                || kernel_addrs
                    .iter()
                    .any(|&a| p.contains(a) || p.contains(a.saturating_sub(1)))
        })
        .collect();
    let kernel_symbols = kernel::snapshot_symbols(&kernel_addrs.into_iter().collect::<Vec<_>>());
    if s.mode == Mode::OffCpu {
        strip_own_frames(&mut stacks, &kernel_symbols);
    }
    // Processes whose announcement was missed, and later mappings of live ones.
    let pids: BTreeSet<u32> = stacks.iter().map(|s| s.tgid).collect();
    for pid in pids {
        snapshots.snapshot(pid);
    }
    let mut lost = session.lost()?;
    for c in &mut lost.cpus {
        c.guarded = guarded_per_cpu.get(&c.cpu).copied().unwrap_or(0);
    }
    Ok(Sampled {
        bpf_sampled,
        guarded_lost,
        tables: session.tables.stats.clone(),
        table_bytes: session.tables.used_bytes(),
        stacks,
        snapshots,
        lost,
        kernel_symbols,
        bpf_programs,
        sideband_lost: 0,
        start_unix_ns: 0,
        duration: Duration::ZERO,
        cpus: bpfscope_sys::online_cpus()
            .map(|c| c.len() as u32)
            .unwrap_or(0),
        blocked_bpf_ns,
        codes: python::Codes::default(),
        runtime_notes: session.tables.interps.notes(s.verbose),
        python_unsupported: session.tables.interps.unsupported.len() as u64,
    })
}

/// BPF programs whose runs no sample of the profiler's own can see.
/// kprobe, tracepoint and perf_event programs run under the kernel's
/// per-CPU BPF recursion guard (`bpf_prog_active`); a perf_event sampling
/// program that fires meanwhile is not run, so the sample vanishes. A
/// second, plain perf sampler (`bpfmeta::guarded`) sees them as perf does.
/// It doubles the timer interrupts (the cost that dominates sampling on a
/// virtual machine), so it runs only while such a program is loaded: from
/// the start, or from the moment the side-band sees one load. Where it
/// cannot run, their run time is measured instead, with BPF run-time
/// statistics held on for the run, and added as estimated samples.
///
/// The side-band starts it from its own thread the moment such a program's
/// load is read (`watch`): the profile's loop can be busy for seconds
/// compiling a large binary's unwind tables (bpftrace's, LLVM included, is
/// one), and a look from there came that much late.
struct BlockedBpf {
    frequency: u64,
    verbose: bool,
    state: Arc<Mutex<Blocked>>,
}

#[derive(Default)]
struct Blocked {
    sampler: Option<GuardedSampler>,
    /// The sampler could not start: run-time statistics instead.
    measured: Option<(StatsGuard, Vec<stats::ProgStats>)>,
    failed: bool,
}

/// Program types whose runs hold the recursion guard.
pub(crate) const GUARDED_TYPES: &[&str] = &["kprobe", "tracepoint", "perf_event"];

impl Blocked {
    /// Neither way has started, nor been given up.
    fn waiting(&self) -> bool {
        self.sampler.is_none() && self.measured.is_none() && !self.failed
    }

    /// The second sampler, or the fallback; said once if neither can run.
    fn start(&mut self, frequency: u64) {
        if !self.waiting() {
            return;
        }
        let sampler_err = match GuardedSampler::start(frequency) {
            Ok(g) => {
                self.sampler = Some(g);
                return;
            }
            Err(e) => e,
        };
        match StatsGuard::enable() {
            Ok(g) => {
                eprintln!(
                    "bpfscope: time in kprobe and tracepoint BPF programs is estimated from their run time: {sampler_err:#}"
                );
                self.measured = Some((g, stats::snapshot()));
            }
            Err(e) => {
                eprintln!(
                    "bpfscope: time in kprobe and tracepoint BPF programs will be missing: {sampler_err:#}; {e:#}"
                );
                self.failed = true;
            }
        }
    }
}

impl BlockedBpf {
    /// None for off-CPU profiles (no samples to lose) and profiles of some
    /// processes (both ways see programs, not processes).
    fn new(s: &SamplingConfig) -> Option<BlockedBpf> {
        if s.mode != Mode::Cpu || s.target != Target::All || s.cgroup.is_some() {
            return None;
        }
        Some(BlockedBpf {
            frequency: s.frequency,
            verbose: s.verbose,
            state: Arc::new(Mutex::new(Blocked::default())),
        })
    }

    /// Whether the profile's loop should still look (see `check`).
    fn waiting(&self) -> bool {
        self.state.lock().is_ok_and(|b| b.waiting())
    }

    /// Starts the second sampler (or the fallback) if a guarded program
    /// other than bpfscope's own is loaded now; without the side-band,
    /// assumes so (better the cost than the loss).
    fn check(&mut self, sideband: Option<&SideBand>, own: &[u32]) {
        if !self.waiting() {
            return;
        }
        // The side-band's lock is taken and let go before this one: its
        // thread holds it while it runs `watch`'s hook, which takes ours.
        let loaded = sideband.is_none_or(|sb| sb.any_loaded(GUARDED_TYPES, own));
        if loaded {
            if self.verbose {
                eprintln!("bpfscope: a kprobe, tracepoint or perf_event BPF program is loaded: second sampler started");
            }
            if let Ok(mut b) = self.state.lock() {
                b.start(self.frequency);
            }
        }
    }

    /// From now on the side-band starts it when a guarded program other
    /// than one of `own` is loaded.
    fn watch(&self, sideband: &SideBand, own: Vec<u32>) {
        let state = self.state.clone();
        let frequency = self.frequency;
        let verbose = self.verbose;
        sideband.on_load(move |p| {
            if GUARDED_TYPES.contains(&p.prog_type.as_str()) && !own.contains(&p.id) {
                if let Ok(mut b) = state.lock() {
                    if verbose && b.waiting() {
                        eprintln!(
                            "bpfscope: {} program {} ({}) loaded: second sampler started",
                            p.prog_type, p.id, p.name
                        );
                    }
                    b.start(frequency);
                }
            }
        });
    }

    /// The second sampler's samples, or the run time per guarded program
    /// since the fallback started; bpfscope's own programs excepted (their
    /// cost is the profiler's, not the system's).
    fn finish(self, own: &[u32]) -> (Vec<(u32, u64)>, Option<Guarded>) {
        // Taken, and marked given up, so a load the side-band reads after
        // this starts nothing.
        let b = match self.state.lock() {
            Ok(mut b) => {
                let taken = std::mem::take(&mut *b);
                b.failed = true;
                taken
            }
            Err(_) => return (Vec::new(), None),
        };
        if let Some(g) = b.sampler {
            return (Vec::new(), Some(g.finish()));
        }
        let Some((_guard, before)) = b.measured else {
            return (Vec::new(), None);
        };
        let ns = stats::snapshot()
            .into_iter()
            .filter(|p| GUARDED_TYPES.contains(&p.prog_type.as_str()) && !own.contains(&p.id))
            .filter_map(|p| {
                let was = before
                    .iter()
                    .find(|b| b.id == p.id)
                    .map_or(0, |b| b.run_time_ns);
                let ns = p.run_time_ns.saturating_sub(was);
                (ns > 0).then_some((p.id, ns))
            })
            .collect();
        (ns, None)
    }
}

/// The second sampler's samples inside guarded programs (not bpfscope's
/// own) or the kernel code that runs them, as stacks with kernel frames
/// only, named by the process's comm; and how many there were per CPU.
pub(crate) fn guarded_stacks(
    g: Guarded,
    progs: &[BpfProg],
    own: &[u32],
    seen: &[RawStack],
) -> (Vec<RawStack>, HashMap<u32, u64>) {
    let guarded: Vec<&BpfProg> = progs
        .iter()
        .filter(|p| GUARDED_TYPES.contains(&p.prog_type.as_str()) && !own.contains(&p.id))
        .collect();
    // The guard is also held around the programs, in the glue that runs
    // them (trace_call_bpf, for kprobes and tracepoints): samples there are
    // lost to the sampling program as well, and perf counts them outside
    // the programs. Their addresses, named once.
    let addrs: Vec<u64> = g
        .samples
        .iter()
        .flat_map(|(_, _, c)| c.iter().copied())
        .collect::<BTreeSet<u64>>()
        .into_iter()
        .collect();
    let syms = kernel::snapshot_symbols(&addrs);
    let table = kernel::KernelTable::new(&syms);
    let in_glue = |a: u64| table.lookup(a).is_some_and(|k| k.name == "trace_call_bpf");
    let mut agg: HashMap<(u32, Vec<u64>), u64> = HashMap::new();
    let mut per_cpu: HashMap<u32, u64> = HashMap::new();
    for (pid, cpu, chain) in g.samples {
        // Return addresses are one past the call.
        let hit = chain.iter().any(|&a| {
            in_glue(a)
                || guarded
                    .iter()
                    .any(|p| p.contains(a) || p.contains(a.saturating_sub(1)))
        });
        if hit {
            *agg.entry((pid, chain)).or_default() += 1;
            *per_cpu.entry(cpu).or_default() += 1;
        }
    }
    let mut comms: HashMap<u32, String> = HashMap::new();
    let stacks = agg
        .into_iter()
        .map(|((pid, kernel), n)| {
            let comm = comms
                .entry(pid)
                .or_insert_with(|| {
                    seen.iter()
                        .find(|s| s.tgid == pid)
                        .map(|s| s.comm.clone())
                        .or_else(|| read_comm(pid))
                        .unwrap_or_else(|| "[unknown]".into())
                })
                .clone();
            RawStack {
                tgid: pid,
                comm,
                thread: String::new(),
                cgroup: 0,
                count: n,
                value: n,
                kernel,
                user: Vec::new(),
            }
        })
        .collect();
    (stacks, per_cpu)
}

fn read_comm(pid: u32) -> Option<String> {
    let c = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    Some(c.trim_end().to_string())
}

/// Off-CPU kernel stacks are taken inside the sched_switch hook, so they
/// start with the hook's own frames (bpfscope's program and the tracepoint
/// glue that ran it): drop those, leaving __schedule and its callers.
/// Other BPF programs on the way stay: they are part of the picture.
fn strip_own_frames(stacks: &mut [RawStack], syms: &[KernelSymbol]) {
    let table = kernel::KernelTable::new(syms);
    for s in stacks {
        let glue = s.kernel.iter().take(4).rposition(|&a| {
            table.lookup(a).is_some_and(|k| {
                k.name.starts_with("bpf_trace_run")
                    || (k.name.starts_with("bpf_prog_") && k.name.ends_with("_bpfscope_offcpu"))
            })
        });
        if let Some(i) = glue {
            s.kernel.drain(..=i);
        }
    }
}

/// Waits until one of `fds` is readable or `timeout` passes (EINTR counts
/// as a wakeup: the caller checks why it woke).
pub fn wait_readable(fds: &[i32], timeout: Option<Duration>) {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ms = timeout.map_or(-1, |t| t.as_millis().min(i32::MAX as u128) as i32 + 1);
    // SAFETY: pfds is a valid array of pollfd of the given length.
    unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, ms) };
}

fn describe_target(s: &SamplingConfig) -> String {
    match (&s.target, &s.cgroup) {
        (_, Some(c)) => format!(", cgroup {}", c.display()),
        (Target::All, None) => ", all processes".into(),
        (Target::Pid(p), None) => format!(", pid {p}"),
        (Target::Command { program, .. }, None) => {
            format!(", command {} and its children", program.display())
        }
    }
}

fn target_text(s: &SamplingConfig) -> String {
    match (&s.target, &s.cgroup) {
        (_, Some(c)) => format!("cgroup {}", c.display()),
        (Target::All, None) => "all".into(),
        (Target::Pid(p), None) => format!("pid {p}"),
        (Target::Command { program, args }, None) => {
            let mut v = vec![program.display().to_string()];
            v.extend(args.iter().cloned());
            format!("command {}", v.join(" "))
        }
    }
}

/// Turns what was sampled into a self-contained recording: user frames as
/// build id + file offset (raw addresses explained through the mapping
/// snapshots where possible), kernel frames with the kallsyms entries they
/// fall into.
/// With `in_process`, binaries also list descriptors opened while they
/// were mapped (for symbolizing right away, even deleted files); such a
/// recording must not be written out.
/// Samples' worth of each blocked program's run time: at `frequency` Hz
/// per CPU, a CPU busy for `ns` would have taken `ns * frequency / 1e9`.
fn blocked_samples<'a>(s: &SamplingConfig, sampled: &'a Sampled) -> Vec<(&'a BpfProg, u64)> {
    sampled
        .blocked_bpf_ns
        .iter()
        .filter_map(|&(id, ns)| {
            let prog = sampled.bpf_programs.iter().find(|p| p.id == id)?;
            let n = (u128::from(ns) * u128::from(s.frequency) + 500_000_000) / 1_000_000_000;
            (n > 0).then_some((prog, n as u64))
        })
        .collect()
}

pub fn to_recording(s: &SamplingConfig, sampled: &Sampled, in_process: bool) -> Recording {
    let paths = sampled.snapshots.paths_by_build_id();
    let mut bin_index: HashMap<Vec<u8>, u32> = HashMap::new();
    let mut binaries: Vec<Binary> = Vec::new();
    let mut intern = |id: &[u8]| -> u32 {
        if let Some(&i) = bin_index.get(id) {
            return i;
        }
        binaries.push(Binary {
            build_id: id.to_vec(),
            paths: Vec::new(),
            segments: Vec::new(),
        });
        let i = binaries.len() as u32;
        bin_index.insert(id.to_vec(), i);
        i
    };
    let mut lost = LostCounts {
        kernel_stacks: sampled.lost.kernel_stacks,
        user_stacks: sampled.lost.user_stacks,
        keys: sampled.lost.keys,
        notifications: sampled.lost.notifications,
        bpf_events: sampled.sideband_lost,
        offcpu_starts: sampled.lost.offcpu_starts,
        unresolved_frames: 0,
        unresolved_weight: 0,
        kernel_stack_map_full: sampled.lost.kernel_stack_map_full,
        user_stack_map_full: sampled.lost.user_stack_map_full,
        bpf_estimated: 0,
        samples_taken: sampled.lost.taken,
        sampler_runs: sampled.lost.sampler_runs,
        idle_samples: sampled.lost.idle,
        other_samples: sampled.lost.other,
        stack_collisions: sampled.lost.collisions,
        table_frames: sampled.lost.unwind.table_frames,
        fp_frames: sampled.lost.unwind.fp_frames,
        no_mappings: sampled.lost.unwind.no_proc,
        end_read: sampled.lost.unwind.end_read,
        end_no_rule: sampled.lost.unwind.end_no_rule,
        end_fp: sampled.lost.unwind.end_fp,
        end_depth: sampled.lost.unwind.end_depth,
        table_files: u64::from(sampled.tables.files),
        table_bytes: sampled.table_bytes,
        files_lost: sampled.lost.files,
        bpf_sampled: sampled.bpf_sampled,
        second_sampler_lost: sampled.guarded_lost,
        python_frames: sampled.lost.python.frames,
        python_no_thread: sampled.lost.python.no_thread,
        python_lost_code: sampled.lost.python.lost_code,
        python_read: sampled.lost.python.read,
        python_unplaced: sampled.lost.python.unplaced,
        python_unnamed: 0,
        python_truncated_tables: sampled.codes.truncated,
        python_unsupported: sampled.python_unsupported,
        jit_frames: 0,
        jit_no_map: 0,
    };
    let mut stacks = Vec::with_capacity(sampled.stacks.len());
    let mut runtime_frames: Vec<RuntimeFrame> = Vec::new();
    let mut runtime_index: HashMap<RuntimeFrame, u32> = HashMap::new();
    // Processes with frames in anonymous executable memory and no perf map
    // to name them.
    let mut no_jit_map: BTreeSet<u32> = BTreeSet::new();
    for (prog, samples) in blocked_samples(s, sampled) {
        lost.bpf_estimated += samples;
        // The program's entry names it (and, with line info, its first line).
        stacks.push(Stack {
            pid: 0,
            comm: BPF_RUN_TIME.into(),
            thread: String::new(),
            cgroup_id: 0,
            count: samples,
            value: samples,
            kernel: prog.subprogs.first().map(|s| s.addr).into_iter().collect(),
            user_binary: Vec::new(),
            user_offset: Vec::new(),
            user_runtime: Vec::new(),
        });
    }
    for r in &sampled.stacks {
        let mut user_binary = Vec::with_capacity(r.user.len());
        let mut user_offset = Vec::with_capacity(r.user.len());
        let mut user_runtime = Vec::new();
        let mut unresolved = false;
        for (i, f) in r.user.iter().enumerate() {
            if let Some(frame) = runtime_frame(sampled, r.tgid, f, &mut lost) {
                let n = runtime_frames.len() as u32 + 1;
                let idx = *runtime_index.entry(frame.clone()).or_insert_with(|| {
                    runtime_frames.push(frame);
                    n
                });
                user_runtime.resize(i, 0);
                user_runtime.push(idx);
                user_binary.push(0);
                user_offset.push(0);
                continue;
            }
            match *f {
                UserFrame::BuildId(ref id, off) => {
                    user_binary.push(intern(id));
                    user_offset.push(off);
                }
                UserFrame::File(id, off, exact) => match sampled.snapshots.file_by_id(id) {
                    Some(file) if file.build_id.is_some() => {
                        let id = file.build_id.as_deref().unwrap_or_default();
                        user_binary.push(intern(id));
                        // Readers look a caller's offset up one byte back
                        // (at its call); an interrupted pc is its own site.
                        user_offset.push(off + u64::from(exact));
                    }
                    _ => {
                        lost.unresolved_frames += 1;
                        unresolved = true;
                        user_binary.push(0);
                        user_offset.push(off);
                    }
                },
                UserFrame::Interp(..) => {}
                UserFrame::Ip(ip) | UserFrame::Anon(ip) => {
                    match sampled.snapshots.resolve(r.tgid, ip) {
                        Some((file, off)) if file.build_id.is_some() => {
                            let id = file.build_id.as_deref().unwrap_or_default();
                            user_binary.push(intern(id));
                            user_offset.push(off);
                        }
                        _ => {
                            lost.unresolved_frames += 1;
                            // The hint to write a perf map is for code that
                            // really ran from anonymous executable memory, not
                            // for frames sampled before a process's mappings
                            // were read.
                            if !sampled.snapshots.has_jit(r.tgid) && matches!(f, UserFrame::Anon(_))
                            {
                                no_jit_map.insert(r.tgid);
                            }
                            unresolved = true;
                            user_binary.push(0);
                            user_offset.push(ip);
                        }
                    }
                }
            }
        }
        if unresolved {
            lost.unresolved_weight += r.value;
        }
        if !user_runtime.is_empty() {
            user_runtime.resize(user_binary.len(), 0);
        }
        stacks.push(Stack {
            pid: r.tgid,
            comm: r.comm.clone(),
            thread: r.thread.clone(),
            cgroup_id: r.cgroup,
            count: r.count,
            value: r.value,
            kernel: r.kernel.clone(),
            user_binary,
            user_offset,
            user_runtime,
        });
    }
    if s.runtimes.jit {
        lost.jit_no_map = no_jit_map.len() as u64;
    }
    for b in &mut binaries {
        if let Some(p) = paths.get(&b.build_id) {
            b.paths = p.iter().cloned().collect();
        }
        if let Some(f) = sampled.snapshots.file(&b.build_id) {
            b.segments = f.segments.clone();
            // The descriptor path only means something inside this process.
            if in_process {
                b.paths.extend(Snapshots::open_path(f));
            }
        }
    }
    let kernel_symbols = sampled.kernel_symbols.clone();
    let meta = Meta {
        tool_version: env!("CARGO_PKG_VERSION").into(),
        hostname: read_trim("/proc/sys/kernel/hostname"),
        kernel_release: read_trim("/proc/sys/kernel/osrelease"),
        kernel_build_id: kernel::build_id().unwrap_or_default(),
        mode: match s.mode {
            Mode::Cpu => "cpu".into(),
            Mode::OffCpu => "offcpu".into(),
        },
        frequency_hz: s.frequency,
        start_unix_ns: sampled.start_unix_ns,
        duration_ns: sampled.duration.as_nanos() as u64,
        target: target_text(s),
        kernel_stacks: s.kernel,
        user_stacks: s.user,
        lost: Some(lost),
        cpus: sampled.cpus,
        cpu_accounts: sampled
            .lost
            .cpus
            .iter()
            .map(|c| CpuAccount {
                cpu: c.cpu,
                clock_ns: c.clock_ns,
                runs: c.runs,
                idle: c.idle,
                other: c.other,
                keys: c.keys,
                idle_ns: c.idle_ns,
                guarded: c.guarded,
            })
            .collect(),
    };
    Recording {
        meta,
        binaries,
        kernel_symbols,
        stacks,
        bpf_programs: sampled.bpf_programs.clone(),
        runtime_frames,
    }
}

/// A frame a runtime named: Python code, or JIT code that no file mapping
/// explains but the process's perf map or jitdump does (counted in `lost`).
fn runtime_frame(
    sampled: &Sampled,
    pid: u32,
    f: &UserFrame,
    lost: &mut LostCounts,
) -> Option<RuntimeFrame> {
    match *f {
        UserFrame::Interp(id, off) => Some(match sampled.codes.frame(id, off) {
            Some(p) => RuntimeFrame {
                kind: "python".into(),
                function: p.function,
                file: p.file,
                line: p.line,
            },
            None => {
                lost.python_unnamed += 1;
                RuntimeFrame {
                    kind: "python".into(),
                    function: "[unknown python code]".into(),
                    ..Default::default()
                }
            }
        }),
        UserFrame::Ip(ip) | UserFrame::Anon(ip) if sampled.snapshots.resolve(pid, ip).is_none() => {
            let j = sampled.snapshots.jit_symbol(pid, ip)?;
            lost.jit_frames += 1;
            Some(RuntimeFrame {
                kind: "jit".into(),
                function: j.name.to_string(),
                file: j.source.map(|s| s.file.to_string()).unwrap_or_default(),
                line: j.source.map_or(0, |s| s.line),
            })
        }
        _ => None,
    }
}

fn read_trim(p: &str) -> String {
    std::fs::read_to_string(p)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Process announcements the sampling program queues, read off its `procs`
/// ring buffer into a list a long-running profiler drains between reads.
pub(crate) type NoteQueue = std::rc::Rc<RefCell<Vec<Note>>>;

/// The ring buffer on `procs` and the list its records are parsed into.
pub(crate) fn note_ring<'a>(
    session: &ProfileSession<'_>,
) -> Result<(NoteQueue, libbpf_rs::RingBuffer<'a>)> {
    let notes: NoteQueue = NoteQueue::default();
    let sink = notes.clone();
    let mut builder = RingBufferBuilder::new();
    builder.add(&session.skel.maps.procs, move |data: &[u8]| {
        if let Some(n) = Note::parse(data) {
            sink.borrow_mut().push(n);
        }
        0
    })?;
    let ring = builder.build().context("setting up the ring buffer")?;
    Ok((notes, ring))
}
