//! Loading the profiler, one software cpu-clock perf event per CPU (or the
//! sched_switch hook for off-CPU), and reading the kernel's aggregated
//! stacks back. Links and perf event descriptors are owned here: dropping
//! the session detaches everything.

use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::os::fd::RawFd;

use anyhow::{Context, Result};
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{Link, MapCore, MapFlags, OpenObject};

use crate::attach::libbpf_log;
use crate::attach::target::Target;
use crate::error::Error;
use crate::profile::{Mode, SamplingConfig};
use bpfscope_bpf::profile::types::{
    bp_key, bp_limits, bp_lost, bp_stack_head, bp_stacks, bp_target_mode, bp_val,
};
use bpfscope_bpf::profile::{ProfileSkel, ProfileSkelBuilder};
use bpfscope_bpf::stack::{self, UserFrame};
use bpfscope_sys::pod;

use super::unwind::{TableMemory, UnwindCounts};

/// One unique (process, kernel stack, user stack) and its weight.
#[derive(Debug, Clone)]
pub struct RawStack {
    pub tgid: u32,
    pub comm: String,
    /// The thread's name and cgroup v2 id, when samples are keyed by them
    /// (`SamplingConfig::labels`); "" and 0 otherwise.
    pub thread: String,
    pub cgroup: u64,
    pub count: u64,
    pub value: u64,
    /// Leaf first.
    pub kernel: Vec<u64>,
    /// Leaf first.
    pub user: Vec<UserFrame>,
}

/// How Python frames went (BP_PY_* counters; bp_lost says what each is).
#[derive(Debug, Clone, Copy, Default)]
pub struct PythonCounts {
    pub frames: u64,
    pub no_thread: u64,
    pub lost_code: u64,
    pub read: u64,
    pub unplaced: u64,
}

/// One CPU's part of a CPU profile's accounting: what its clock counted,
/// what the sampling program did on it, how long it idled.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuCounts {
    pub cpu: u32,
    /// ns the CPU's clock counted while sampling (its time enabled).
    pub clock_ns: u64,
    /// Runs of the sampling program on it, and those in the idle task, in
    /// processes not profiled, or refused by a full count map; the rest
    /// are in the profile.
    pub runs: u64,
    pub idle: u64,
    pub other: u64,
    pub keys: u64,
    /// ns the CPU spent idle meanwhile; None when it could not be read.
    pub idle_ns: Option<u64>,
    /// Samples the second sampler took on it inside guarded BPF programs
    /// (in the profile; the sampling program could not run there).
    pub guarded: u64,
}

/// Kernel-side drop counters.
#[derive(Debug, Clone, Default)]
pub struct KernelLost {
    pub python: PythonCounts,
    pub kernel_stacks: u64,
    pub user_stacks: u64,
    /// Stacks whose 64-bit hash another stack already had.
    pub collisions: u64,
    /// Files the file table had no room for (their frames stay raw).
    pub files: u64,
    pub unwind: UnwindCounts,
    pub keys: u64,
    pub notifications: u64,
    pub offcpu_starts: u64,
    /// Runs of the CPU sampler, and those in the idle task or in processes
    /// not profiled (the rest are stored, or lost as `keys`).
    pub sampler_runs: u64,
    pub idle: u64,
    pub other: u64,
    /// Samples the kernel's clocks took (ns counted / period), all CPUs.
    pub taken: u64,
    /// The stack maps held as many stacks as they can.
    pub kernel_stack_map_full: bool,
    pub user_stack_map_full: bool,
    /// CPU profiles: the same counts per CPU, with the clocks' counts and
    /// the CPUs' idle time.
    pub cpus: Vec<CpuCounts>,
}

pub struct ProfileSession<'obj> {
    links: Vec<Link>,
    /// The CPU clocks' descriptors, owned by `links`: libbpf closes a perf
    /// event's descriptor when its link is destroyed, so these are only
    /// borrowed numbers, valid while `links` holds them.
    perf_fds: Vec<RawFd>,
    /// The CPU of each of `perf_fds`.
    cpus: Vec<u32>,
    /// Each CPU's idle time (ns since boot) when its clock started.
    idle_at_start: std::collections::BTreeMap<u32, u64>,
    /// Per CPU when the clocks were closed: (cpu, ns counted, ns idle).
    clocks: Vec<(u32, u64, Option<u64>)>,
    /// Samples the clocks took, read when they were closed.
    taken: u64,
    /// Sampling period in ns (software clocks sample at a fixed period).
    period_ns: u64,
    pub skel: ProfileSkel<'obj>,
    /// Space in `unwind_entries`.
    pub tables: TableMemory,
    /// Python code objects the kernel side announced.
    pub codes: super::python::Codes,
}

/// A cgroup v2 directory's id and depth, with `--cgroup` errors as usage errors.
fn cgroup_id(path: &std::path::Path) -> Result<(u64, u32), Error> {
    use bpfscope_sys::cgroup::{id_of, CgroupError};
    id_of(path).map_err(|e| match e {
        CgroupError::NotMounted => Error::Environment(e.to_string()),
        _ => crate::usage!("--cgroup {e}"),
    })
}

impl<'obj> ProfileSession<'obj> {
    pub fn load(
        storage: &'obj mut MaybeUninit<OpenObject>,
        s: &SamplingConfig,
    ) -> Result<ProfileSession<'obj>> {
        let cgroup = s.cgroup.as_deref().map(cgroup_id).transpose()?;
        let mut open = ProfileSkelBuilder::default()
            .open(storage)
            .context("opening the profiler's BPF object")?;
        let ro = open
            .maps
            .rodata_data
            .as_deref_mut()
            .context("BPF object has no .rodata")?;
        ro.self_tgid = std::process::id();
        ro.target_mode = match (&s.target, cgroup) {
            (_, Some(_)) => bp_target_mode::BP_TARGET_CGROUP.0,
            (Target::All, None) => bp_target_mode::BP_TARGET_ALL.0,
            _ => bp_target_mode::BP_TARGET_TRACKED.0,
        };
        if let Some((id, level)) = cgroup {
            ro.target_cgroup = id;
            ro.cgroup_level = level;
        }
        let mut stacks = 0;
        if s.kernel {
            stacks |= bp_stacks::BP_STACKS_KERNEL.0;
        }
        if s.user {
            stacks |= bp_stacks::BP_STACKS_USER.0;
        }
        ro.stacks = stacks;
        ro.max_depth = s.max_depth;
        ro.key_labels = u32::from(s.labels);
        // Kernel and user stacks share one map; a stack takes 8 bytes per
        // frame of --max-depth, preallocated.
        let nstacks = (s.max_stacks / 2).max(16);
        open.maps.counts.set_max_entries(s.max_stacks)?;
        open.maps.stack_map.set_max_entries(nstacks)?;
        let frames = s.max_depth.max(bp_limits::BP_KERNEL_DEPTH.0);
        open.maps
            .stack_map
            .set_value_size(std::mem::size_of::<bp_stack_head>() as u32 + 8 * frames)?;
        open.maps.unwind_entries.set_max_entries(if s.user {
            s.unwind_entries.max(1)
        } else {
            1
        })?;
        let progs = &mut open.progs;
        progs.bpfscope_prof.set_autoload(s.mode == Mode::Cpu);
        progs.bpfscope_offcpu.set_autoload(s.mode == Mode::OffCpu);
        progs
            .bpfscope_fork
            .set_autoload(matches!(s.target, Target::Command { .. }));
        if s.mode != Mode::OffCpu {
            open.maps.starts.set_max_entries(1)?;
        }
        let skel = open.load().map_err(|e| {
            anyhow::anyhow!("{e}").context(format!(
                "loading the profiler's BPF programs{}",
                libbpf_log::last_error_hint()
            ))
        })?;
        let mut tables = TableMemory::new(&skel.maps.unwind_entries);
        tables.interps.disabled = !s.runtimes.python;
        Ok(ProfileSession {
            links: Vec::new(),
            perf_fds: Vec::new(),
            cpus: Vec::new(),
            idle_at_start: Default::default(),
            clocks: Vec::new(),
            taken: 0,
            period_ns: 0,
            skel,
            tables,
            codes: Default::default(),
        })
    }

    /// Adds a process to the profiled set.
    pub fn track(&self, pid: u32) -> Result<()> {
        self.skel
            .maps
            .tracked
            .update(&pid.to_ne_bytes(), &[1u8], MapFlags::ANY)
            .context("adding the target process")
    }

    /// Starts sampling; returns how many CPUs (or hooks) are live.
    pub fn attach(&mut self, s: &SamplingConfig, follow_forks: bool) -> Result<usize> {
        self.links.push(
            self.skel
                .progs
                .bpfscope_exec
                .attach_raw_tracepoint("sched_process_exec")
                .context("attaching the exec hook")?,
        );
        self.links.push(
            self.skel
                .progs
                .bpfscope_exit
                .attach_raw_tracepoint("sched_process_exit")
                .context("attaching the exit hook")?,
        );
        if s.user {
            self.links.push(
                self.skel
                    .progs
                    .bpfscope_fork_maps
                    .attach_raw_tracepoint("sched_process_fork")
                    .context("attaching the fork hook")?,
            );
            // Libraries mapped after exec; without it, their frames wait
            // for user space to have the mappings read again.
            match self.skel.progs.bpfscope_mmap.attach() {
                Ok(l) => self.links.push(l),
                Err(e) => {
                    eprintln!("bpfscope: libraries mapped during the run are unwound late: {e}")
                }
            }
        }
        if follow_forks {
            self.links.push(
                self.skel
                    .progs
                    .bpfscope_fork
                    .attach_raw_tracepoint("sched_process_fork")
                    .context("attaching the fork follower")?,
            );
        }
        match s.mode {
            Mode::OffCpu => {
                self.links.push(
                    self.skel
                        .progs
                        .bpfscope_offcpu
                        .attach()
                        .context("attaching to sched_switch (tp_btf)")?,
                );
                Ok(1)
            }
            Mode::Cpu => {
                // hrtimer-based clocks map a frequency to a fixed period.
                self.period_ns = 1_000_000_000 / s.frequency.max(1);
                let cpus = bpfscope_sys::online_cpus().context("reading the online CPUs")?;
                for &cpu in &cpus {
                    let (link, fd) = crate::attach::clock::attach(
                        &self.skel.progs.bpfscope_prof,
                        cpu,
                        s.frequency,
                        0,
                    )
                    .context("attaching the sampler")?;
                    self.perf_fds.push(fd);
                    self.cpus.push(cpu);
                    self.links.push(link);
                }
                self.idle_at_start = bpfscope_sys::cpu_idle_ns();
                Ok(cpus.len())
            }
        }
    }

    /// File ids below `next` are taken (user space registered them before
    /// sampling); the kernel side hands out the rest.
    pub fn reserve_file_ids(&mut self, next: u32) {
        if let Some(bss) = self.skel.maps.bss_data.as_deref_mut() {
            bss.next_file_id = next - 1;
        }
    }

    /// Has the kernel side read a process's executable mappings (for the
    /// unwinder); their count, or None when it could not.
    pub fn build(&self, pid: u32) -> Option<u32> {
        let mut ctx = [0u8; 8];
        ctx[..4].copy_from_slice(&pid.to_ne_bytes());
        let input = libbpf_rs::ProgramInput {
            context_in: Some(&mut ctx),
            ..Default::default()
        };
        let out = self.skel.progs.bpfscope_build.test_run(input).ok()?;
        // The program returns the mapping count, or -1.
        u32::try_from(out.return_value as i32).ok()
    }

    /// Stops sampling; maps stay readable.
    pub fn detach(&mut self) {
        // A cpu-clock event counts the ns it was enabled; it overflows
        // (takes a sample) once per period. Read while the links, which
        // own the descriptors, still hold them.
        let counted: Vec<u64> = self
            .perf_fds
            .iter()
            .map(|&fd| read_count(fd).unwrap_or(0))
            .collect();
        let idle_now = bpfscope_sys::cpu_idle_ns();
        self.clocks = self
            .cpus
            .iter()
            .zip(&counted)
            .map(|(&cpu, &ns)| {
                let idle = match (self.idle_at_start.get(&cpu), idle_now.get(&cpu)) {
                    (Some(a), Some(b)) => Some(b.saturating_sub(*a).min(ns)),
                    _ => None,
                };
                (cpu, ns, idle)
            })
            .collect();
        let ns: u64 = counted.iter().sum();
        if let Some(taken) = ns.checked_div(self.period_ns) {
            self.taken = taken;
        }
        self.perf_fds.clear();
        self.links.clear();
    }

    pub fn lost(&self) -> Result<KernelLost> {
        let map = &self.skel.maps.lost;
        let per_cpu = |i: u32| -> Result<Vec<u64>> {
            let v = map
                .lookup_percpu(&i.to_ne_bytes(), MapFlags::ANY)
                .context("reading lost-stack counters")?
                .unwrap_or_default();
            Ok(v.iter().map(|b| pod::read::<u64>(b).unwrap_or(0)).collect())
        };
        let slot = |i: u32| -> Result<u64> { Ok(per_cpu(i)?.iter().sum()) };
        // A per-CPU map's values are indexed by CPU number.
        let (runs, idle, other, keys) = (
            per_cpu(bp_lost::BP_SEEN_RUNS.0)?,
            per_cpu(bp_lost::BP_SEEN_IDLE.0)?,
            per_cpu(bp_lost::BP_SEEN_OTHER.0)?,
            per_cpu(bp_lost::BP_LOST_KEYS.0)?,
        );
        let at = |v: &[u64], cpu: u32| v.get(cpu as usize).copied().unwrap_or(0);
        let cpus = self
            .clocks
            .iter()
            .map(|&(cpu, clock_ns, idle_ns)| CpuCounts {
                cpu,
                clock_ns,
                runs: at(&runs, cpu),
                idle: at(&idle, cpu),
                other: at(&other, cpu),
                keys: at(&keys, cpu),
                idle_ns,
                guarded: 0,
            })
            .collect();
        // Preallocated: an insert fails only when every entry is in use.
        let m = &self.skel.maps.stack_map;
        let full = m.keys().count() as u64 >= u64::from(m.max_entries());
        let kernel_stacks = slot(bp_lost::BP_LOST_KSTACK.0)?;
        let user_stacks = slot(bp_lost::BP_LOST_USTACK.0)?;
        Ok(KernelLost {
            kernel_stacks,
            user_stacks,
            collisions: slot(bp_lost::BP_LOST_COLLISION.0)?,
            files: slot(bp_lost::BP_LOST_FILES.0)?,
            unwind: UnwindCounts {
                table_frames: slot(bp_lost::BP_UNW_TABLE_FRAMES.0)?,
                fp_frames: slot(bp_lost::BP_UNW_FP_FRAMES.0)?,
                end_outermost: slot(bp_lost::BP_UNW_END_OUTERMOST.0)?,
                end_depth: slot(bp_lost::BP_UNW_END_DEPTH.0)?,
                end_read: slot(bp_lost::BP_UNW_END_READ.0)?,
                end_no_rule: slot(bp_lost::BP_UNW_END_NO_RULE.0)?,
                end_fp: slot(bp_lost::BP_UNW_END_FP.0)?,
                proc_busy: slot(bp_lost::BP_UNW_PROC_BUSY.0)?,
                no_proc: slot(bp_lost::BP_UNW_NO_PROC.0)?,
                rebuilds: slot(bp_lost::BP_UNW_REBUILDS.0)?,
            },
            keys: slot(bp_lost::BP_LOST_KEYS.0)?,
            notifications: slot(bp_lost::BP_LOST_NOTIFY.0)?,
            offcpu_starts: slot(bp_lost::BP_LOST_OFFCPU.0)?,
            sampler_runs: slot(bp_lost::BP_SEEN_RUNS.0)?,
            idle: slot(bp_lost::BP_SEEN_IDLE.0)?,
            other: slot(bp_lost::BP_SEEN_OTHER.0)?,
            python: PythonCounts {
                frames: slot(bp_lost::BP_PY_FRAMES.0)?,
                no_thread: slot(bp_lost::BP_PY_NO_THREAD.0)?,
                lost_code: slot(bp_lost::BP_PY_LOST_CODE.0)?,
                read: slot(bp_lost::BP_PY_READ.0)?,
                unplaced: slot(bp_lost::BP_PY_UNPLACED.0)?,
            },
            taken: self.taken,
            kernel_stack_map_full: full && kernel_stacks > 0,
            user_stack_map_full: full && user_stacks > 0,
            cpus,
        })
    }

    /// Every stored stack by key, frames leaf first.
    fn read_stack_map(&self) -> Result<HashMap<u64, Vec<u64>>> {
        let m = &self.skel.maps.stack_map;
        let mut out = HashMap::new();
        for k in m.keys() {
            let Some(key) = pod::read::<u64>(&k) else {
                continue;
            };
            let Some(v) = m.lookup(&k, MapFlags::ANY).context("reading a stack")? else {
                continue;
            };
            out.insert(key, stack::stored_frames(&v));
        }
        Ok(out)
    }

    /// Reads every aggregated stack; user frames stay as the kernel stored
    /// them (file id + offset, or raw addresses) for the caller to resolve.
    pub fn read_stacks(&self) -> Result<Vec<RawStack>> {
        let stored = self.read_stack_map()?;
        let mut out = Vec::new();
        for kb in self.skel.maps.counts.keys() {
            if let Some((_, r)) = self.read_key(&kb, &|k| stored.get(&k).cloned())? {
                out.push(r);
            }
        }
        Ok(out)
    }

    /// The readout period new samples are counted in.
    pub fn set_epoch(&mut self, epoch: u32) {
        if let Some(bss) = self.skel.maps.bss_data.as_deref_mut() {
            // SAFETY: bss is the mmap'd .bss of the loaded object, valid for
            // the skeleton's lifetime; a volatile store stays visible to the kernel.
            unsafe { std::ptr::write_volatile(&mut bss.epoch, epoch) };
        }
    }

    /// Reads and deletes the stacks counted in any epoch but `current` (the
    /// caller moved the programs on to `current` and let runs in flight
    /// finish; a run that still wrote an older epoch after that is read at
    /// the next drain, not lost), so the kernel map only ever holds about
    /// one period of keys. Stacks come from `cache` or, read once, from the
    /// kernel's stack map. On-CPU keys only: an off-CPU start may refer to
    /// a stack freed since (`reclaim_stacks`).
    pub fn drain(&self, current: u32, cache: &mut StackCache) -> Result<Vec<RawStack>> {
        let counts = &self.skel.maps.counts;
        let keys: Vec<Vec<u8>> = counts
            .keys()
            .filter(|k| pod::read::<bp_key>(k).is_some_and(|key| key.epoch != current))
            .collect();
        let mut out = Vec::with_capacity(keys.len());
        for kb in keys {
            let Some(key) = pod::read::<bp_key>(&kb) else {
                continue;
            };
            for h in [key.kstack, key.ustack] {
                if h != 0 && !cache.stacks.contains_key(&h) {
                    if let Some(v) = self
                        .skel
                        .maps
                        .stack_map
                        .lookup(&h.to_ne_bytes(), MapFlags::ANY)
                        .context("reading a stack")?
                    {
                        cache
                            .stacks
                            .insert(h, (stack::stored_frames(&v), cache.period));
                    }
                }
            }
            for h in [key.kstack, key.ustack] {
                if let Some((_, used)) = cache.stacks.get_mut(&h) {
                    *used = cache.period;
                }
            }
            // Read before the delete: a key deleted unread would be a loss.
            let stacks = &cache.stacks;
            if let Some((_, r)) = self.read_key(&kb, &|h| stacks.get(&h).map(|(f, _)| f.clone()))? {
                out.push(r);
            }
            counts
                .delete(&kb)
                .context("deleting a stack count read out")?;
        }
        Ok(out)
    }

    /// Frees the kernel's copies of the stacks `cache` holds (a sample that
    /// hits one again stores it again), so stacks of processes long gone
    /// do not fill the map in a run of days; and forgets cached stacks not
    /// used for `keep` periods. A stack whose kernel copy existed until now
    /// may be referred to by a key not read yet: it counts as used now, so
    /// it stays cached until that key has been read.
    pub fn reclaim_stacks(&self, cache: &mut StackCache, keep: u64) {
        let m = &self.skel.maps.stack_map;
        let now = cache.period;
        // Stacks no key read so far referred to (their key was lost, or is
        // still to be read) are cached first, so none stays in the kernel
        // for good and none that a key still needs is lost.
        let uncached: Vec<u64> = m
            .keys()
            .filter_map(|k| pod::read::<u64>(&k))
            .filter(|h| !cache.stacks.contains_key(h))
            .collect();
        for h in uncached {
            if let Ok(Some(v)) = m.lookup(&h.to_ne_bytes(), MapFlags::ANY) {
                cache.stacks.insert(h, (stack::stored_frames(&v), now));
            }
        }
        for (h, (_, used)) in cache.stacks.iter_mut() {
            if m.delete(&h.to_ne_bytes()).is_ok() {
                *used = now;
            }
        }
        cache
            .stacks
            .retain(|_, (_, used)| now.saturating_sub(*used) <= keep);
    }

    /// Samples the perf events have taken so far (ns counted / period).
    pub fn taken_so_far(&self) -> u64 {
        let ns: u64 = self.perf_fds.iter().filter_map(|&fd| read_count(fd)).sum();
        ns.checked_div(self.period_ns).unwrap_or(0)
    }

    /// One key of `counts` and its value, with its stacks from `frames`.
    fn read_key(
        &self,
        kb: &[u8],
        frames: &dyn Fn(u64) -> Option<Vec<u64>>,
    ) -> Result<Option<(bp_key, RawStack)>> {
        let Some(key) = pod::read::<bp_key>(kb) else {
            return Ok(None);
        };
        let Some(vb) = self
            .skel
            .maps
            .counts
            .lookup(kb, MapFlags::ANY)
            .context("reading stack counts")?
        else {
            return Ok(None);
        };
        let Some(val) = pod::read::<bp_val>(&vb) else {
            return Ok(None);
        };
        let get = |h: u64| {
            if h == 0 {
                Vec::new()
            } else {
                frames(h).unwrap_or_default()
            }
        };
        Ok(Some((
            key,
            RawStack {
                tgid: key.tgid,
                comm: c_string(&val.comm),
                thread: c_string(&key.thread),
                cgroup: key.cgroup,
                count: val.count,
                value: val.value,
                kernel: get(key.kstack),
                user: get(key.ustack)
                    .into_iter()
                    .map(stack::unwound_frame)
                    .collect(),
            },
        )))
    }
}

/// Stacks read out of the kernel's stack map, by hash, with the readout
/// period that last used each.
#[derive(Default)]
pub struct StackCache {
    stacks: HashMap<u64, (Vec<u64>, u64)>,
    /// The current readout period (advanced by the caller).
    pub period: u64,
}

impl StackCache {
    pub fn len(&self) -> usize {
        self.stacks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.stacks.is_empty()
    }
}

/// The skeleton types carry C `char` arrays as i8 on every target.
fn c_string(b: &[i8]) -> String {
    let bytes: Vec<u8> = b.iter().map(|&c| c as u8).take_while(|&c| c != 0).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The count of a perf event (read_format 0: one u64).
fn read_count(fd: RawFd) -> Option<u64> {
    let mut v = 0u64;
    // SAFETY: fd is open (its link holds it); reads at most 8 bytes into v,
    // which lives for the call.
    let n = unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) };
    (n == 8).then_some(v)
}
