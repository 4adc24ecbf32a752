//! Continuous whole-host CPU profiling (the agent's): the profile command's programs,
//! loaded once, read out every second ("ticks": the sampler moves to the
//! next epoch, the previous epoch's stacks are read and deleted), so the
//! kernel only holds about a second of keys however long the agent runs.
//! Windows and on-demand profiles are merges of ticks, handed out as
//! recordings with process, thread and cgroup in each stack.

use std::collections::{HashMap, VecDeque};
use std::mem::MaybeUninit;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use libbpf_rs::{OpenObject, RingBuffer};

use crate::attach::target::Target;
use crate::bpfmeta::guarded::GuardedSampler;
use crate::bpfmeta::sideband::SideBand;
use crate::profile::maps::Snapshots;
use crate::profile::session::{KernelLost, ProfileSession, RawStack, StackCache};
use crate::profile::Note;
use crate::profile::{Mode, Sampled, SamplingConfig};
use bpfscope_recording::bpfprog::BpfProg;
use bpfscope_recording::Recording;
use bpfscope_symbolize::kernel;

/// When an announced process's mappings are read again (as `profile` does).
const RELOOK: Duration = crate::profile::RELOOK[0];
/// How long runs in flight get to finish with the old epoch.
const GRACE: Duration = Duration::from_millis(10);
/// Stacks cached in user space are dropped after this many ticks unused.
const STACK_KEEP_TICKS: u64 = 2;
/// How often the kernel's copies of stacks are freed (in ticks): a stack
/// that keeps recurring is stored again once per period.
const RECLAIM_TICKS: u64 = 10;

/// What makes two ticks' stacks the same: process, names, cgroup, frames.
type StackKey = (
    u32,
    String,
    String,
    u64,
    Vec<u64>,
    Vec<bpfscope_bpf::stack::UserFrame>,
);

/// A second of samples.
struct Tick {
    start_ns: u64,
    end_ns: u64,
    stacks: Vec<RawStack>,
}

/// The samples of a span, ready to symbolize.
pub struct Built {
    pub recording: Recording,
    pub samples: u64,
    pub start_unix_ns: u64,
    pub end_unix_ns: u64,
}

/// How the continuous profiler samples.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContinuousConfig {
    pub hz: u64,
    pub max_depth: u32,
    /// Kernel memory for unwind tables.
    pub unwind_mib: u32,
    pub max_stacks: u32,
}

pub struct Profiler {
    pub cfg: ContinuousConfig,
    sampling: SamplingConfig,
    session: ProfileSession<'static>,
    notes: super::NoteQueue,
    ring: RingBuffer<'static>,
    snapshots: Snapshots,
    cache: StackCache,
    epoch: u32,
    ticks: VecDeque<Tick>,
    tick_start_ns: u64,
    /// Processes re-read shortly after they were announced.
    again: VecDeque<(Instant, u32)>,
    /// Samples read out so far.
    pub samples: u64,
    /// BPF program loads and unloads, so JIT frames keep their program's
    /// name and source line after it is gone (None: could not start).
    sideband: Option<SideBand>,
    cpus: u32,
    /// The second sampler: samples inside kprobe, tracepoint and
    /// perf_event BPF programs, which the kernel's recursion guard keeps
    /// from the sampling program. Started once such a program of another
    /// tool is loaded.
    guarded: Option<GuardedSampler>,
    guarded_failed: bool,
    /// This process's own program ids, as of `own_progs_at` side-band events.
    own_progs: Vec<u32>,
    own_progs_at: Option<u64>,
    /// Samples in guarded programs added to profiles, and those the second
    /// sampler lost (kernel ring full, or no room).
    pub bpf_samples: u64,
    pub bpf_samples_lost: u64,
    /// Unwind table bytes when memory was last given back.
    trimmed_at_bytes: u64,
    /// The kernel's counters as of the last read-out (zero before the
    /// first, as `samples` is): what `samples` has placed, counted at the
    /// same moment.
    counted: KernelLost,
}

/// The clock for ticks, windows and requests: CLOCK_MONOTONIC, so
/// a step of the wall clock (NTP, a resumed VM) cannot empty a window.
pub fn now_ns() -> u64 {
    bpfscope_sys::monotonic_ns()
}

/// Wall-clock time (Unix ns) of a `now_ns` instant, for what leaves the
/// agent: profile times, pushed from/until, file names.
fn to_wall(mono: u64) -> u64 {
    let wall = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    wall.saturating_sub(now_ns().saturating_sub(mono))
}

impl Profiler {
    /// Loads and attaches the sampler on every CPU.
    pub fn start(cfg: &ContinuousConfig) -> Result<Profiler> {
        let sampling = SamplingConfig {
            runtimes: Default::default(),
            mode: Mode::Cpu,
            frequency: cfg.hz,
            duration: Duration::MAX,
            target: Target::All,
            cgroup: None,
            kernel: true,
            user: true,
            max_stacks: cfg.max_stacks,
            max_depth: cfg.max_depth,
            unwind_entries: cfg.unwind_mib * (1 << 20) / 8,
            labels: true,
            verbose: false,
        };
        // The object outlives the session, which lives until the agent
        // ends or a reload changes the profiler: a few hundred bytes each.
        let storage: &'static mut MaybeUninit<OpenObject> =
            Box::leak(Box::new(MaybeUninit::uninit()));
        let mut session =
            ProfileSession::load(storage, &sampling).map_err(crate::error::refused)?;
        let mut snapshots = Snapshots::with_jit(true);
        let next_id = crate::profile::preload_shared(&mut session, &mut snapshots);
        session.reserve_file_ids(next_id);
        let sideband = match SideBand::start() {
            Ok(sb) => Some(sb),
            Err(e) => {
                eprintln!("bpfscope: BPF programs will show without names: {e:#}");
                None
            }
        };
        let (notes, ring) = super::note_ring(&session)?;
        let n = session
            .attach(&sampling, false)
            .map_err(crate::error::refused)?;
        // Processes already running: their mappings, for the unwinder.
        for pid in bpfscope_sys::procfs::pids() {
            session.build(pid);
        }
        eprintln!("Profiling {n} CPUs at {} Hz", cfg.hz);
        // Compiling the tables of every running process's files took
        // memory that glibc would otherwise keep.
        give_back_memory();
        Ok(Profiler {
            cfg: cfg.clone(),
            sampling,
            session,
            notes,
            ring,
            snapshots,
            cache: StackCache::default(),
            epoch: 0,
            ticks: VecDeque::new(),
            tick_start_ns: now_ns(),
            again: VecDeque::new(),
            samples: 0,
            sideband,
            cpus: n as u32,
            guarded: None,
            guarded_failed: false,
            own_progs: Vec::new(),
            own_progs_at: None,
            bpf_samples: 0,
            bpf_samples_lost: 0,
            trimmed_at_bytes: 0,
            counted: KernelLost::default(),
        })
    }

    /// The ring buffer's descriptor, to wait on.
    pub fn wait_fd(&self) -> i32 {
        self.ring.epoll_fd()
    }

    /// Handles process and file announcements: mappings read while the
    /// process exists, unwind tables loaded within milliseconds.
    pub fn pump(&mut self) -> Result<()> {
        self.ring
            .consume()
            .context("reading process notifications")?;
        let notes: Vec<Note> = self.notes.borrow_mut().drain(..).collect();
        let now = Instant::now();
        for n in notes {
            if let Some(pid) =
                crate::profile::handle_note_or_say(&mut self.session, &mut self.snapshots, &n)
            {
                self.again.push_back((now + RELOOK, pid));
            }
        }
        while self.again.front().is_some_and(|(t, _)| *t <= now) {
            if let Some((_, pid)) = self.again.pop_front() {
                self.snapshots.snapshot(pid);
            }
        }
        Ok(())
    }

    /// Reads out the last second: the sampler moves on to the next epoch,
    /// runs in flight finish, the old epoch is read and deleted.
    pub fn tick(&mut self) -> Result<()> {
        // The counters are read just before the epoch moves on. The sampler
        // counts a run before it stores it, so every run counted here is
        // read out below: published with `samples`, runs and their places
        // agree (before, runs of the second in progress had no place yet).
        let counted = self.lost();
        self.epoch = self.epoch.wrapping_add(1);
        self.session.set_epoch(self.epoch);
        std::thread::sleep(GRACE);
        let end_ns = now_ns();
        self.cache.period += 1;
        let mut stacks = self.session.drain(self.epoch, &mut self.cache)?;
        stacks.extend(self.guarded_stacks(&stacks));
        self.samples += stacks.iter().map(|s| s.count).sum::<u64>();
        // Processes seen for the first time in this tick whose
        // announcement raced the read: their mappings now.
        for s in &stacks {
            if !self.snapshots.has(s.tgid) {
                self.snapshots.snapshot(s.tgid);
            }
        }
        self.ticks.push_back(Tick {
            start_ns: self.tick_start_ns,
            end_ns,
            stacks,
        });
        self.tick_start_ns = end_ns;
        // New files' tables were compiled this second: what that took goes
        // back to the system (a large library's compile takes tens of MiB
        // for a moment).
        let bytes = self.session.tables.used_bytes();
        if bytes != self.trimmed_at_bytes {
            self.trimmed_at_bytes = bytes;
            give_back_memory();
        }
        if self.cache.period % RECLAIM_TICKS == 0 {
            self.session
                .reclaim_stacks(&mut self.cache, STACK_KEEP_TICKS);
        }
        self.counted = counted.context("reading the sampler's counters")?;
        Ok(())
    }

    /// The second sampler's samples of the last second inside other tools'
    /// guarded programs; starts it once such a program is loaded.
    fn guarded_stacks(&mut self, seen: &[RawStack]) -> Vec<RawStack> {
        let Some(sb) = &self.sideband else {
            return Vec::new();
        };
        // This process's own programs, read again only when programs came
        // or went: reading them is a look at each of its ~600 descriptors
        // (a second of it each second cost the agent ~0.7% of a core).
        let events = sb.events();
        if self.own_progs_at != Some(events) {
            self.own_progs = crate::bpfmeta::info::own_prog_ids();
            self.own_progs_at = Some(events);
        }
        let own = &self.own_progs;
        if self.guarded.is_none() && !self.guarded_failed {
            if !sb.any_loaded(crate::profile::GUARDED_TYPES, own) {
                return Vec::new();
            }
            match GuardedSampler::start(self.cfg.hz) {
                Ok(g) => self.guarded = Some(g),
                Err(e) => {
                    eprintln!("bpfscope: time in kprobe and tracepoint BPF programs will be missing: {e:#}");
                    self.guarded_failed = true;
                }
            }
        }
        let Some(g) = &self.guarded else {
            return Vec::new();
        };
        let got = g.drain();
        self.bpf_samples_lost = got.lost + got.no_room;
        let (extra, _per_cpu) = crate::profile::guarded_stacks(got, &sb.programs(), own, seen);
        self.bpf_samples += extra.iter().map(|s| s.count).sum::<u64>();
        extra
    }

    /// Drops the ticks that ended at or before `ns` (no window or request
    /// needs them any more): memory holds one window, not the run.
    pub fn forget_before(&mut self, ns: u64) {
        while self.ticks.front().is_some_and(|t| t.end_ns <= ns) {
            self.ticks.pop_front();
        }
    }

    /// End of the latest tick read out.
    pub fn read_until_ns(&self) -> u64 {
        self.tick_start_ns
    }

    /// The start of the tick that `ns` fell in: the one in progress, a kept
    /// one, or (older than every kept tick) the oldest kept.
    pub fn tick_start_at(&self, ns: u64) -> u64 {
        if ns >= self.tick_start_ns {
            return self.tick_start_ns;
        }
        self.ticks
            .iter()
            .find(|t| ns < t.end_ns)
            .map_or(self.tick_start_ns, |t| t.start_ns)
    }

    /// Housekeeping once per window: processes that are gone and in no
    /// kept tick are forgotten, so memory does not grow with processes
    /// that came and went.
    pub fn reclaim(&mut self) -> Result<()> {
        // Programs unloaded before the oldest tick kept can no longer be hit.
        if let (Some(sb), Some(t)) = (&self.sideband, self.ticks.front()) {
            sb.forget_unloaded_before(t.start_ns);
        }
        let referenced: std::collections::HashSet<u32> = self
            .ticks
            .iter()
            .flat_map(|t| t.stacks.iter().map(|s| s.tgid))
            .collect();
        for pid in self.snapshots.pids() {
            if !referenced.contains(&pid) && !bpfscope_sys::procfs::exists(pid) {
                self.snapshots.forget(pid);
            }
        }
        Ok(())
    }

    /// Cumulative kernel-side counts (samples taken, losses).
    fn lost(&self) -> Result<KernelLost> {
        let mut l = self.session.lost()?;
        l.taken = self.session.taken_so_far();
        Ok(l)
    }

    /// The counters as of the last read-out, to publish beside `samples`.
    pub fn counted(&self) -> &KernelLost {
        &self.counted
    }

    pub fn cached_stacks(&self) -> usize {
        self.cache.len()
    }

    pub fn tracked_processes(&self) -> usize {
        self.snapshots.pids().len()
    }

    pub fn table_bytes(&self) -> u64 {
        self.session.tables.used_bytes()
    }

    /// The samples of the ticks that overlap (from_ns, to_ns] that `keep`
    /// selects, merged, as a recording (to symbolize and render), with
    /// the monotonic span its ticks cover. Windows start and end where
    /// ticks do; a request's span ends anywhere, and the tick read out
    /// across its end is in it: when the loop was held up (tables compiled,
    /// a profile symbolized; seconds on an emulated CPU), one tick can
    /// outlast a short span, which would otherwise get no samples at all.
    pub fn recording(
        &mut self,
        from_ns: u64,
        to_ns: u64,
        mut keep: impl FnMut(&RawStack) -> bool,
    ) -> Built {
        let mut merged: HashMap<StackKey, RawStack> = HashMap::new();
        let mut start_ns = to_ns;
        // The time the samples cover: from the first included tick's start
        // to the last one's end (not the request's own bounds).
        let mut last_end = 0;
        for t in self
            .ticks
            .iter()
            .filter(|t| t.end_ns > from_ns && t.start_ns < to_ns)
        {
            start_ns = start_ns.min(t.start_ns);
            last_end = last_end.max(t.end_ns);
            for s in &t.stacks {
                if !keep(s) {
                    continue;
                }
                let k = (
                    s.tgid,
                    s.comm.clone(),
                    s.thread.clone(),
                    s.cgroup,
                    s.kernel.clone(),
                    s.user.clone(),
                );
                match merged.get_mut(&k) {
                    Some(m) => {
                        m.count += s.count;
                        m.value += s.value;
                    }
                    None => {
                        merged.insert(k, s.clone());
                    }
                }
            }
        }
        let stacks: Vec<RawStack> = merged.into_values().collect();
        // What the profile covers: its ticks, or the asked-for span when
        // it has none.
        let span = if last_end == 0 {
            (from_ns, to_ns)
        } else {
            (start_ns, last_end)
        };
        let samples = stacks.iter().map(|s| s.count).sum();
        let kernel_addrs: Vec<u64> = stacks
            .iter()
            .flat_map(|s| s.kernel.iter().copied())
            .collect::<std::collections::BTreeSet<u64>>()
            .into_iter()
            .collect();
        let sampled = Sampled {
            stacks,
            snapshots: std::mem::take(&mut self.snapshots),
            lost: KernelLost::default(),
            kernel_symbols: kernel::snapshot_symbols(&kernel_addrs),
            bpf_programs: self.programs_hit(&kernel_addrs, span.0),
            sideband_lost: 0,
            start_unix_ns: to_wall(span.0),
            duration: Duration::from_nanos(span.1.saturating_sub(span.0)),
            cpus: self.cpus,
            blocked_bpf_ns: Vec::new(),
            bpf_sampled: 0,
            guarded_lost: 0,
            tables: Default::default(),
            table_bytes: 0,
            codes: std::mem::take(&mut self.session.codes),
            runtime_notes: Vec::new(),
            python_unsupported: self.session.tables.interps.unsupported.len() as u64,
        };
        let mut rec = crate::profile::to_recording(&self.sampling, &sampled, true);
        self.snapshots = sampled.snapshots;
        self.session.codes = sampled.codes;
        rec.meta.lost = None;
        Built {
            recording: rec,
            samples,
            start_unix_ns: to_wall(span.0),
            end_unix_ns: to_wall(span.1),
        }
    }

    /// The BPF programs whose JIT code these kernel addresses, sampled
    /// from `since_ns` on, fall into.
    fn programs_hit(&self, addrs: &[u64], since_ns: u64) -> Vec<BpfProg> {
        let Some(sb) = &self.sideband else {
            return Vec::new();
        };
        programs_hit(sb.programs(), addrs, since_ns)
    }

    /// Side-band records the kernel dropped (program loads or unloads missed).
    pub fn sideband_lost(&self) -> u64 {
        self.sideband.as_ref().map_or(0, SideBand::lost)
    }

    pub fn stop(&mut self) {
        if let Some(g) = self.guarded.take() {
            let _ = g.finish();
        }
        self.session.detach();
        if let Some(sb) = self.sideband.take() {
            sb.finish();
        }
    }
}

/// The programs whose JIT code holds one of `addrs` (return addresses
/// are one past the call: a program's last call can sit at its end),
/// leaving out those unloaded before `since_ns`: JIT memory is reused,
/// and a program gone before the span would take the name of samples in
/// the one loaded at its address since (a CI run named a bpftrace
/// program's samples after a bpfscope program unloaded before them).
fn programs_hit(progs: Vec<BpfProg>, addrs: &[u64], since_ns: u64) -> Vec<BpfProg> {
    progs
        .into_iter()
        .filter(|p| p.unloaded_ns.is_none_or(|u| u >= since_ns))
        .filter(|p| {
            addrs
                .iter()
                .any(|&a| p.contains(a) || p.contains(a.saturating_sub(1)))
        })
        .collect()
}

/// Returns the heap freed by symbolizing to the system: glibc keeps freed
/// memory in its arenas otherwise, and the agent's resident set would stay
/// at the peak of its largest window.
pub fn give_back_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bpfscope_recording::bpfprog::Subprog;

    fn prog(id: u32, addr: u64, unloaded_ns: Option<u64>) -> BpfProg {
        BpfProg {
            id,
            subprogs: vec![Subprog {
                symbol: format!("bpf_prog_{id}"),
                addr,
                len: 0x100,
            }],
            unloaded_ns,
            ..Default::default()
        }
    }

    #[test]
    fn programs_gone_before_the_span_are_not_hit() {
        // 1 held 0x1000 until 50, 2 holds it since; 3 went during the span.
        let progs = vec![
            prog(1, 0x1000, Some(50)),
            prog(2, 0x1000, None),
            prog(3, 0x2000, Some(150)),
            prog(4, 0x3000, None),
        ];
        let hit = programs_hit(progs, &[0x1010, 0x2100], 100);
        let ids: Vec<u32> = hit.iter().map(|p| p.id).collect();
        // 0x2100 is one past 3's end: a return address.
        assert_eq!(ids, [2, 3]);
    }
}
