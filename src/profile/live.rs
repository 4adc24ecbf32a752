//! A profile read out while it runs (`bpfscope top`): the session stays
//! attached and every refresh moves the sampler on to a new epoch and
//! reads the old one's stacks out (and deletes them), so the kernel maps
//! hold about one refresh of keys however long it runs. Processes and
//! files are announced and handled between refreshes, as in `sample`.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::mem::MaybeUninit;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use libbpf_rs::{OpenObject, RingBuffer};

use super::maps::Snapshots;
use super::session::{KernelLost, ProfileSession, RawStack, StackCache};
use super::{Note, Sampled, SamplingConfig, RELOOK};
use crate::attach::target::Target;
use bpfscope_recording::{KernelSymbol, Recording};
use bpfscope_symbolize::kernel;

/// How long kallsyms as read is used to name new kernel addresses.
const KALLSYMS_AGE: Duration = Duration::from_secs(30);
/// Runs in flight finish with the old epoch before it is read.
const GRACE: Duration = Duration::from_millis(10);
/// Cached stacks unused for this many refreshes are forgotten, and the
/// kernel's copies are freed every so many refreshes.
const STACK_KEEP: u64 = 2;
const RECLAIM_EVERY: u64 = 10;

pub struct Live<'obj> {
    sampling: SamplingConfig,
    session: ProfileSession<'obj>,
    ring: RingBuffer<'obj>,
    notes: super::NoteQueue,
    snapshots: Snapshots,
    cache: StackCache,
    epoch: u32,
    again: VecDeque<(Instant, u32)>,
    /// Kernel symbols of every kernel address seen, named by kallsyms as
    /// read once (a read costs tens of ms) and again every KALLSYMS_AGE,
    /// for BPF programs loaded meanwhile.
    ksyms: HashMap<u64, Option<KernelSymbol>>,
    kallsyms: (kernel::KernelSymbolizer, Instant),
    pub cpus: u32,
}

impl<'obj> Live<'obj> {
    /// Loads and attaches the sampler on every CPU; `-p` targets are
    /// tracked, others are the whole system.
    pub fn start(
        storage: &'obj mut MaybeUninit<OpenObject>,
        sampling: &SamplingConfig,
    ) -> Result<Live<'obj>> {
        let mut session = ProfileSession::load(storage, sampling).map_err(crate::error::refused)?;
        if let Target::Pid(pid) = sampling.target {
            session.track(pid)?;
        }
        let mut snapshots = Snapshots::with_jit(sampling.runtimes.jit);
        if sampling.user {
            let next_id = super::preload_shared(&mut session, &mut snapshots);
            session.reserve_file_ids(next_id);
        }
        let (notes, ring) = super::note_ring(&session)?;
        let n = session
            .attach(sampling, false)
            .map_err(crate::error::refused)?;
        // Processes already running: their mappings, for the unwinder.
        if sampling.user {
            match sampling.target {
                Target::Pid(pid) => {
                    session.build(pid);
                }
                _ => {
                    for pid in bpfscope_sys::procfs::pids() {
                        session.build(pid);
                    }
                }
            }
        }
        Ok(Live {
            sampling: sampling.clone(),
            session,
            ring,
            notes,
            snapshots,
            cache: StackCache::default(),
            epoch: 0,
            again: VecDeque::new(),
            ksyms: HashMap::new(),
            kallsyms: (kernel::KernelSymbolizer::new(), Instant::now()),
            cpus: n as u32,
        })
    }

    /// The ring buffer's descriptor, to wait on between refreshes.
    pub fn wait_fd(&self) -> i32 {
        self.ring.epoll_fd()
    }

    /// When the next second look at a process's mappings is due.
    pub fn next_due(&self) -> Option<Instant> {
        self.again.front().map(|(t, _)| *t)
    }

    /// Handles process and file announcements and due second looks.
    pub fn pump(&mut self) -> Result<()> {
        self.ring
            .consume()
            .context("reading process notifications")?;
        let notes: Vec<Note> = self.notes.borrow_mut().drain(..).collect();
        let now = Instant::now();
        for n in notes {
            if let Some(pid) = super::handle_note_or_say(&mut self.session, &mut self.snapshots, &n)
            {
                self.again.push_back((now + RELOOK[0], pid));
            }
        }
        while self.again.front().is_some_and(|(t, _)| *t <= now) {
            if let Some((_, pid)) = self.again.pop_front() {
                self.snapshots.snapshot(pid);
            }
        }
        Ok(())
    }

    /// The stacks sampled since the last refresh, as a recording (user
    /// frames by build id and offset, kernel frames with their kallsyms
    /// entries), symbolized in this process.
    pub fn refresh(&mut self) -> Result<Recording> {
        self.epoch = self.epoch.wrapping_add(1);
        self.session.set_epoch(self.epoch);
        std::thread::sleep(GRACE);
        self.cache.period += 1;
        let stacks = self.session.drain(self.epoch, &mut self.cache)?;
        for s in &stacks {
            if !self.snapshots.has(s.tgid) {
                self.snapshots.snapshot(s.tgid);
            }
        }
        if self.cache.period % RECLAIM_EVERY == 0 {
            self.session.reclaim_stacks(&mut self.cache, STACK_KEEP);
            self.forget_gone(&stacks);
        }
        let kernel_symbols = self.kernel_symbols(&stacks);
        let sampled = Sampled {
            stacks,
            snapshots: std::mem::take(&mut self.snapshots),
            lost: KernelLost::default(),
            kernel_symbols,
            bpf_programs: Vec::new(),
            sideband_lost: 0,
            start_unix_ns: 0,
            duration: Duration::ZERO,
            cpus: self.cpus,
            blocked_bpf_ns: Vec::new(),
            bpf_sampled: 0,
            guarded_lost: 0,
            tables: Default::default(),
            table_bytes: 0,
            codes: std::mem::take(&mut self.session.codes),
            runtime_notes: Vec::new(),
            python_unsupported: 0,
        };
        let mut rec = super::to_recording(&self.sampling, &sampled, true);
        rec.meta.lost = None;
        self.snapshots = sampled.snapshots;
        self.session.codes = sampled.codes;
        Ok(rec)
    }

    /// The kallsyms entries of the stacks' kernel addresses, read from
    /// kallsyms for the addresses not seen before.
    fn kernel_symbols(&mut self, stacks: &[RawStack]) -> Vec<KernelSymbol> {
        let addrs: BTreeSet<u64> = stacks
            .iter()
            .flat_map(|s| s.kernel.iter().copied())
            .collect();
        let new: Vec<u64> = addrs
            .iter()
            .copied()
            .filter(|a| !self.ksyms.contains_key(a))
            .collect();
        if !new.is_empty() {
            if self.kallsyms.1.elapsed() > KALLSYMS_AGE {
                self.kallsyms = (kernel::KernelSymbolizer::new(), Instant::now());
            }
            let found = self.kallsyms.0.symbols(&new);
            let table = kernel::KernelTable::new(&found);
            for a in new {
                self.ksyms.insert(a, table.lookup(a).cloned());
            }
        }
        let mut out: Vec<KernelSymbol> = addrs
            .iter()
            .filter_map(|a| self.ksyms.get(a).cloned().flatten())
            .collect();
        out.sort_by_key(|s| s.addr);
        out.dedup_by_key(|s| s.addr);
        out
    }

    /// Processes gone and not in the latest stacks: their mappings go.
    fn forget_gone(&mut self, latest: &[RawStack]) {
        let seen: BTreeSet<u32> = latest.iter().map(|s| s.tgid).collect();
        for pid in self.snapshots.pids() {
            if !seen.contains(&pid) && !bpfscope_sys::procfs::exists(pid) {
                self.snapshots.forget(pid);
            }
        }
    }

    /// Cumulative counts of the kernel side (samples taken, losses).
    pub fn lost(&self) -> Result<KernelLost> {
        let mut l = self.session.lost()?;
        l.taken = self.session.taken_so_far();
        Ok(l)
    }
}
