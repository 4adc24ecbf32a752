//! Loading the tracing programs, specialized and sized for one plan, and
//! attaching every probe as a BPF link with its cookie. Links are file
//! descriptors owned here: dropping the session (or the process dying)
//! detaches everything; nothing is pinned.

use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use anyhow::{Context, Result};
use libbpf_rs::skel::{OpenSkel, Skel, SkelBuilder};
use libbpf_rs::{
    KprobeMultiOpts, KprobeOpts, Link, MapCore, MapFlags, MapHandle, MapType, OpenObject,
    RawTracepointOpts, TracepointCategory, TracepointOpts, UprobeMultiOpts, UprobeOpts, UsdtOpts,
};

use crate::attach::features::{Features, Template};
use crate::attach::kfunc::{self, ProgImage, RawLink};

use crate::attach::libbpf_log;
use crate::attach::plan::{KfuncPath, Mech, Path, Plan, PlannedProbe, VmImage, VmMapKind};
use crate::attach::shape::{self, Shape};
use crate::attach::target::Target;
use bpfscope_bpf::abi::{bs_limits, bs_match_key, bs_target_mode};
use bpfscope_bpf::trace::{OpenTraceSkel, TraceSkel, TraceSkelBuilder};
use bpfscope_sys::pod;

const PAGE: u32 = 4096;
/// Latency starts waiting for their end (LRU: the oldest unmatched age out).
const STARTS_MAX: u32 = 65536;
/// Probe counts from which attaching is announced before it starts.
const SLOW_ATTACH: usize = 200;

/// Loaded programs and maps of one tracing run, and its links.
pub struct Session<'obj> {
    pub skel: TraceSkel<'obj>,
    links: Vec<Link>,
    uprobe_multi: bool,
    /// Kernel function links, and the fentry/fexit program copies they run.
    klinks: Vec<KLink>,
    kprogs: Vec<OwnedFd>,
    /// kprobe_misses() as it was when the links were dropped.
    missed_at_detach: u64,
    /// The loaded fentry and fexit programs, to load copies per function.
    images: [Option<ProgImage>; 2],
    template: Option<Template>,
    /// The template fentry/fexit program was attached: a loaded tracing
    /// program attaches to its load-time target once, later ones are copies.
    template_used: [bool; 2],
    /// Syscall probes reach this session through a dispatcher's tail calls
    /// (attach::dispatch), not raw_tp links of its own.
    routed_syscalls: bool,
    /// A script's maps by id, each a kernel map of its own.
    pub vm_maps: Vec<MapHandle>,
    /// The per-event path the programs were specialized for: where the
    /// aggregates are (`slots` or `aggs`).
    pub shape: Shape,
    /// Probes that run a program of their own (a compiled script probe):
    /// `attach` leaves them to it.
    own_program: Vec<bool>,
}

/// A kernel function link, held to be dropped: dropping detaches.
#[allow(dead_code, reason = "the links are only held, never read")]
enum KLink {
    Libbpf(Link),
    Fd(OwnedFd),
    Raw(RawLink),
}

/// The uprobes of one binary and direction: (probe index, file offset) each.
type UprobeGroup<'a> = (&'a std::path::Path, bool, Vec<(usize, u64)>);

/// What attaching gave.
#[derive(Debug, Default)]
pub struct Attached {
    /// Probes live.
    pub probes: usize,
    /// (probe, reason) of probes that could not be attached.
    pub skipped: Vec<(String, String)>,
    /// How kernel functions were attached, for -v.
    pub notes: Vec<String>,
}

/// How the trace object is sized and loaded, besides what the plan says.
#[derive(Debug, Clone)]
pub struct LoadConfig {
    pub target: Target,
    /// Aggregation keys the maps hold (`--max-keys`); None: the run only
    /// emits events.
    pub max_keys: Option<u32>,
    /// Stacks each stack map holds (`--max-stacks`); None: no stack keys.
    pub max_stacks: Option<u32>,
    /// Ring buffer size for events (`--ringbuf-kib`); None: no events.
    pub ringbuf_bytes: Option<u32>,
    /// Report load times and verifier statistics.
    pub verbose: bool,
    /// Probes (by index) that run as programs of their own (a script's
    /// compiled probes): a generic program only they would use is not
    /// loaded (bpfscope_tp's verifier pass is a third of a start).
    pub compiled: Vec<usize>,
}

impl<'obj> Session<'obj> {
    /// Opens, specializes, sizes and loads the trace object for this plan.
    pub fn load(
        storage: &'obj mut MaybeUninit<OpenObject>,
        plan: &Plan,
        s: &LoadConfig,
        features: &Features,
    ) -> Result<Session<'obj>> {
        let irq_text = super::irqtext::spawn(plan);
        let mut open = TraceSkelBuilder::default()
            .open(storage)
            .context("opening the BPF object")?;
        let shape = Shape::of(plan);
        specialize(&mut open, plan, s, &shape)?;
        let vm_maps = size_maps(&mut open, plan, s, &shape)?;
        let progs = Programs::for_plan(plan, s, features);
        let template = progs.template(features)?;
        progs.select(&mut open, template.as_ref())?;
        let mut skel = load_filling(open, s.verbose, vm_maps.as_ref())?;
        if let (Some(read), Some(bss)) = (irq_text, skel.maps.bss_data.as_deref_mut()) {
            // A panicked reader leaves the ranges zero: bpfscope's own
            // task drops every event, as without them.
            let ranges = read.join().unwrap_or_default();
            // SAFETY: bss is the mmap'd .bss of the loaded object, valid for
            // the skeleton's lifetime; nothing is attached yet.
            unsafe { std::ptr::write_volatile(&mut bss.irq_text, ranges) };
        }
        let images = [
            progs
                .fentry
                .then(|| ProgImage::of(skel.object(), &skel.progs.bpfscope_fentry)),
            progs
                .fexit
                .then(|| ProgImage::of(skel.object(), &skel.progs.bpfscope_fexit)),
        ];
        let session = Session {
            skel,
            links: Vec::new(),
            uprobe_multi: progs.umulti,
            klinks: Vec::new(),
            kprogs: Vec::new(),
            missed_at_detach: 0,
            images,
            template,
            template_used: [false; 2],
            routed_syscalls: false,
            vm_maps: vm_maps.map(|m| m.inner).unwrap_or_default(),
            shape,
            own_program: Vec::new(),
        };
        session.fill(plan)?;
        Ok(session)
    }

    /// Writes every probe's configuration and the string table.
    fn fill(&self, plan: &Plan) -> Result<()> {
        let maps = &self.skel.maps;
        for (i, p) in plan.probes.iter().enumerate() {
            let key = (i as u32).to_ne_bytes();
            maps.probes
                .update(&key, pod::bytes(&p.cfg), MapFlags::ANY)
                .context("writing probe configuration")?;
            if let Path::Syscall(sc) = p.path {
                maps.sys_probes
                    .update(
                        &sc.slot().to_ne_bytes(),
                        &(i as u32 + 1).to_ne_bytes(),
                        MapFlags::ANY,
                    )
                    .context("writing syscall dispatch")?;
            }
        }
        let max = bs_limits::BS_STR_MAX.0 as usize;
        for (i, s) in plan.strs.strs.iter().enumerate() {
            let mut buf = vec![0u8; max];
            let b = crate::filter::raw::encode(s);
            let n = b.len().min(max);
            buf[..n].copy_from_slice(&b[..n]);
            maps.strs
                .update(&(i as u32).to_ne_bytes(), &buf, MapFlags::ANY)
                .context("writing filter strings")?;
        }
        if let Some(vm) = &plan.vm {
            // In one call: a long script is a million instructions.
            if !vm.code.is_empty() {
                let keys: Vec<u8> = (0..vm.code.len() as u32)
                    .flat_map(u32::to_ne_bytes)
                    .collect();
                let vals: Vec<u8> = vm
                    .code
                    .iter()
                    .flat_map(|i| pod::bytes(i).iter().copied())
                    .collect();
                maps.vm_code
                    .update_batch(
                        &keys,
                        &vals,
                        vm.code.len() as u32,
                        MapFlags::ANY,
                        MapFlags::ANY,
                    )
                    .context("writing script code")?;
            }
            for (i, src) in vm.srcs.iter().enumerate() {
                maps.vm_srcs
                    .update(&(i as u32).to_ne_bytes(), pod::bytes(src), MapFlags::ANY)
                    .context("writing script sources")?;
            }
        }
        Ok(())
    }

    /// Adds a process to the traced set.
    pub fn track(&self, pid: u32) -> Result<()> {
        self.skel
            .maps
            .tracked
            .update(&pid.to_ne_bytes(), &[1u8], MapFlags::ANY)
            .context("adding the target process")
    }

    /// Attaches every probe; says how many are live and which were skipped.
    /// `pid` restricts user probes to one process (-1: every process).
    /// `skip_refused`: the probes came from a glob, so an event the kernel
    /// refuses is skipped and named instead of failing the run.
    pub fn attach(
        &mut self,
        plan: &Plan,
        follow_forks: bool,
        pid: i32,
        skip_refused: bool,
    ) -> Result<Attached> {
        let mut out = Attached::default();
        self.attach_kfuncs(plan, &mut out);
        // Links made here are kept only once every probe is attached.
        let mut links = self.attach_syscalls(plan)?;
        self.attach_uprobe_groups(plan, pid, &mut out);
        links.extend(self.attach_events(plan, pid, skip_refused, &mut out)?);
        links.extend(self.attach_clocks(plan)?);
        if follow_forks {
            links.push(self.attach_fork_follower()?);
        }
        if plan.vm.as_ref().is_some_and(|vm| !vm.task_print.is_empty()) {
            links.push(
                self.skel
                    .progs
                    .bpfscope_task_exit
                    .attach_raw_tracepoint("sched_process_exit")
                    .context("attaching the thread-exit hook of thread maps")?,
            );
        }
        self.links.extend(links);
        out.probes = plan.probes.len() - out.skipped.len();
        if out.probes == 0 {
            let (name, why) = out.skipped.first().cloned().unwrap_or_default();
            return Err(crate::error::Error::Environment(if out.skipped.len() == 1 {
                format!("{name}: {why}")
            } else {
                format!("no probe could be attached ({name}: {why})")
            })
            .into());
        }
        Ok(out)
    }

    /// Marks probes that run a program of their own (loaded and attached
    /// by its owner, then given to [`Session::adopt`]): `attach` skips them,
    /// and the shared syscall programs no longer dispatch to them (one
    /// that another probe attaches would run them a second time).
    pub fn set_own_programs(&mut self, plan: &Plan, probes: &[usize]) -> Result<()> {
        for &i in probes {
            if self.own_program.len() <= i {
                self.own_program.resize(i + 1, false);
            }
            self.own_program[i] = true;
            if let Some(Path::Syscall(sc)) = plan.probes.get(i).map(|p| &p.path) {
                let key = sc.slot().to_ne_bytes();
                let held = self.skel.maps.sys_probes.lookup(&key, MapFlags::ANY)?;
                if held.as_deref() == Some(&(i as u32 + 1).to_ne_bytes()[..]) {
                    self.skel
                        .maps
                        .sys_probes
                        .update(&key, &0u32.to_ne_bytes(), MapFlags::ANY)
                        .context("writing syscall dispatch")?;
                }
            }
        }
        Ok(())
    }

    fn own(&self, i: usize) -> bool {
        self.own_program.get(i).copied().unwrap_or(false)
    }

    /// Keeps programs and links made elsewhere for this session's probes:
    /// they are detached with the session's own.
    pub fn adopt(&mut self, progs: Vec<OwnedFd>, links: Vec<OwnedFd>) {
        self.klinks.extend(links.into_iter().map(KLink::Fd));
        self.kprogs.extend(progs);
    }

    /// Leaves the syscall probes to a dispatcher: `attach` attaches no
    /// raw_tp for them, and `syscall_routes` says what to route.
    pub fn route_syscalls(&mut self) {
        self.routed_syscalls = true;
    }

    /// The dispatcher slots this plan's syscall probes need, each with the
    /// program that serves it (sys_enter's or sys_exit's).
    pub fn syscall_routes(&self, plan: &Plan) -> Vec<(u32, BorrowedFd<'_>)> {
        let progs = &self.skel.progs;
        let mut out: Vec<(u32, BorrowedFd<'_>)> = Vec::new();
        for p in &plan.probes {
            if let Path::Syscall(sc) = p.path {
                let slot = sc.slot();
                let prog = if sc.exit {
                    &progs.bpfscope_sysout
                } else {
                    &progs.bpfscope_sysin
                };
                if !out.iter().any(|(s, _)| *s == slot) {
                    out.push((slot, prog.as_fd()));
                }
            }
        }
        out
    }

    /// The shared raw_tp programs on sys_enter and sys_exit, each when a
    /// syscall probe of its direction needs it.
    fn attach_syscalls(&self, plan: &Plan) -> Result<Vec<Link>> {
        let progs = &self.skel.progs;
        let mut links = Vec::new();
        if self.routed_syscalls {
            return Ok(links);
        }
        for (exit, prog, tp) in [
            (false, &progs.bpfscope_sysin, "sys_enter"),
            (true, &progs.bpfscope_sysout, "sys_exit"),
        ] {
            if plan.probes.iter().enumerate().any(|(i, p)| {
                !self.own(i) && matches!(p.path, Path::Syscall(sc) if sc.exit == exit)
            }) {
                links.push(
                    prog.attach_raw_tracepoint(tp)
                        .with_context(|| format!("attaching to raw tracepoint {tp}"))?,
                );
            }
        }
        Ok(links)
    }

    /// User functions: one uprobe_multi link (or a uprobe each) per binary
    /// and direction; the functions the kernel refuses are skipped.
    fn attach_uprobe_groups(&mut self, plan: &Plan, pid: i32, out: &mut Attached) {
        for (binary, ret, items) in uprobe_groups(plan) {
            // With no pid filter, the kernel checks each probed instruction
            // as it installs the breakpoint in every process mapping the
            // file. Mapped here too, the file gets that check now, where a
            // refusal can be reported, not at a later exec where the kernel
            // drops it silently (a `-- CMD` not started yet).
            let _view = (pid < 0).then(|| exec_view(binary)).flatten();
            let failed = if self.uprobe_multi {
                self.attach_umulti(binary, ret, &items, pid)
            } else {
                self.attach_uprobes(binary, ret, &items, pid)
            };
            for (i, err) in failed {
                let offset = items.iter().find(|(j, _)| *j == i).map_or(0, |x| x.1);
                out.skipped.push((
                    plan.probes[i].probe.name.clone(),
                    uprobe_refusal(binary, offset, ret, &err),
                ));
            }
        }
    }

    /// Tracepoints and USDT probes, a link each with its cookie. Attaching
    /// thousands of tracepoints takes seconds: that is announced, and a
    /// signal stops it at once.
    fn attach_events(
        &self,
        plan: &Plan,
        pid: i32,
        skip_refused: bool,
        out: &mut Attached,
    ) -> Result<Vec<Link>> {
        // A script prints bpftrace's own "Attaching N probes..." on stdout.
        if plan.probes.len() >= SLOW_ATTACH && plan.vm.is_none() {
            eprintln!("Attaching {} probes...", plan.probes.len());
        }
        let mut links = Vec::new();
        for (i, p) in plan.probes.iter().enumerate() {
            if bpfscope_sys::signals::interrupted() {
                return Err(crate::error::Error::Interrupted.into());
            }
            match self.attach_event(i, p, pid) {
                None => {}
                Some(Ok(l)) => links.push(l),
                // One event of many that the kernel refuses is skipped and
                // named (as kernel-function globs do); running out of
                // descriptors or memory would refuse the rest too.
                Some(Err(e)) if skip_refused && !exhausted(&e) => {
                    out.skipped.push((p.probe.name.clone(), format!("{e:#}")));
                }
                Some(Err(e)) => return Err(e),
            }
        }
        Ok(links)
    }

    /// The link of the probe at index `i`; None for paths attached
    /// together elsewhere (syscalls, uprobes, kernel functions).
    fn attach_event(&self, i: usize, p: &PlannedProbe, pid: i32) -> Option<Result<Link>> {
        // Cookie 0 means "no configuration", so indexes are shifted by one.
        let cookie = i as u64 + 1;
        let name = &p.probe.name;
        if self.own(i) {
            return None;
        }
        Some(match &p.path {
            Path::Syscall(_)
            | Path::Uprobe { .. }
            | Path::Kfunc(_)
            | Path::Clock { .. }
            | Path::Perf { .. }
            | Path::Trigger => return None,
            Path::Usdt {
                binary,
                provider,
                name: usdt,
            } => self.attach_usdt(binary, provider, usdt, pid, cookie, name),
            Path::RawTp { name: tp } => self.attach_raw_tp(tp, cookie, name),
            Path::Tracepoint { subsys, event } => {
                self.attach_tracepoint(subsys, event, cookie, name)
            }
        })
    }

    /// A USDT probe (all its sites) through libbpf's USDT support.
    fn attach_usdt(
        &self,
        binary: &std::path::Path,
        provider: &str,
        usdt: &str,
        pid: i32,
        cookie: u64,
        name: &str,
    ) -> Result<Link> {
        let opts = UsdtOpts {
            cookie,
            ..Default::default()
        };
        self.skel
            .progs
            .bpfscope_usdt
            .attach_usdt_with_opts(pid, binary, provider, usdt, opts)
            .with_context(|| format!("attaching {name}"))
    }

    /// A raw tracepoint with a cookie (Linux 6.10+).
    fn attach_raw_tp(&self, tp: &str, cookie: u64, name: &str) -> Result<Link> {
        let opts = RawTracepointOpts {
            cookie,
            ..Default::default()
        };
        self.skel
            .progs
            .bpfscope_rawtp
            .attach_raw_tracepoint_with_opts(tp, opts)
            .with_context(|| format!("attaching {name} (raw_tp {tp})"))
    }

    /// A classic tracepoint through a perf link with a cookie.
    fn attach_tracepoint(
        &self,
        subsys: &str,
        event: &str,
        cookie: u64,
        name: &str,
    ) -> Result<Link> {
        let opts = TracepointOpts {
            cookie,
            ..Default::default()
        };
        self.skel
            .progs
            .bpfscope_tp
            .attach_tracepoint_with_opts(
                TracepointCategory::Custom(subsys.to_string()),
                event,
                opts,
            )
            .with_context(|| format!("attaching {name}"))
    }

    /// Runs a script's trigger probe (BEGIN, END, an interval) at index
    /// `idx` now, on this CPU, in this task: BPF_PROG_TEST_RUN of the
    /// trigger program. Nothing is attached, so nothing is to detach (a
    /// uprobe's detach costs a tasks-trace RCU grace period, ~150 ms here).
    pub fn fire(&self, idx: usize) -> Result<()> {
        let mut ctx = (idx as u64).to_ne_bytes();
        let input = libbpf_rs::ProgramInput {
            context_in: Some(&mut ctx),
            ..Default::default()
        };
        self.skel
            .progs
            .bpfscope_trigger
            .test_run(input)
            .map(|_| ())
            .context("running a script's BEGIN/END/interval block (BPF_PROG_TEST_RUN)")
    }

    /// `profile:hz:N` probes: a software cpu-clock per CPU (or on the one
    /// CPU given), each link with the probe's cookie.
    fn attach_clocks(&self, plan: &Plan) -> Result<Vec<Link>> {
        let mut links = Vec::new();
        for (i, p) in plan.probes.iter().enumerate() {
            let (cpus, ev) = match &p.path {
                Path::Clock { hz, cpu: Some(c) } => (vec![*c], Err(*hz)),
                Path::Clock { hz, cpu: None } => (Vec::new(), Err(*hz)),
                Path::Perf { ty, config, period } => (Vec::new(), Ok((*ty, *config, *period))),
                _ => continue,
            };
            let cpus = match cpus.is_empty() {
                false => cpus,
                true => bpfscope_sys::online_cpus().context("reading the online CPUs")?,
            };
            let prog = &self.skel.progs.bpfscope_clock;
            for c in cpus {
                let cookie = i as u64 + 1;
                let (link, _) = match ev {
                    Err(hz) => crate::attach::clock::attach(prog, c, hz, cookie),
                    Ok((ty, config, period)) => {
                        crate::attach::clock::attach_event(prog, c, ty, config, period, cookie)
                    }
                }
                .with_context(|| format!("attaching {}", p.probe.name))?;
                links.push(link);
            }
        }
        Ok(links)
    }

    /// The fork follower: children of traced processes are traced too.
    fn attach_fork_follower(&self) -> Result<Link> {
        self.skel
            .progs
            .bpfscope_fork
            .attach_raw_tracepoint("sched_process_fork")
            .context("attaching the fork follower")
    }

    /// Runs the kernel skipped because the same program was already running
    /// on that CPU (its recursion guard), summed over this session's
    /// programs but the fentry/fexit templates (counted as missed hits by
    /// [`Self::kprobe_misses`], like the per-function copies).
    pub fn recursion_misses(&self) -> u64 {
        self.object_misses(false)
    }

    /// Recursion misses of the object's programs: the fentry/fexit
    /// templates alone (`templates`), or every other program.
    fn object_misses(&self, templates: bool) -> u64 {
        use libbpf_rs::AsRawLibbpf;
        // The templates by identity, as the skeleton holds them.
        let tmpl = [
            self.skel.progs.bpfscope_fentry.as_libbpf_object().as_ptr(),
            self.skel.progs.bpfscope_fexit.as_libbpf_object().as_ptr(),
        ];
        self.skel
            .object()
            .progs()
            .filter(|p| templates == tmpl.contains(&p.as_libbpf_object().as_ptr()))
            .filter_map(|p| {
                // SAFETY: the program pointer is valid for the object's lifetime.
                let fd = unsafe { libbpf_sys::bpf_program__fd(p.as_libbpf_object().as_ptr()) };
                if fd < 0 {
                    return None; // not loaded
                }
                // SAFETY: fd is a loaded program's descriptor, owned by the
                // object, which outlives this borrow.
                recursion_misses(unsafe { BorrowedFd::borrow_raw(fd) })
            })
            .sum()
    }

    /// Hits the kernel missed on this session's kernel function probes:
    /// the kprobe machinery's own misses (counted from 6.7 on; 0 before)
    /// and fentry/fexit calls skipped by the programs' recursion guard.
    pub fn kprobe_misses(&self) -> u64 {
        // The templates stay loaded after detach and keep their count;
        // the links and copies go, so theirs is kept at detach.
        self.missed_at_detach + self.link_misses() + self.object_misses(true)
    }

    /// Missed hits counted on the links and the per-function copies.
    fn link_misses(&self) -> u64 {
        use libbpf_rs::query::{LinkInfo, LinkTypeInfo, PerfEventType};
        let live: u64 = self
            .klinks
            .iter()
            .filter_map(|l| {
                let info = match l {
                    KLink::Libbpf(l) => l.info().ok()?,
                    KLink::Raw(r) => LinkInfo::from_fd(r.as_fd()?).ok()?,
                    KLink::Fd(_) => return None, // fentry/fexit: no such counter
                };
                match info.info {
                    LinkTypeInfo::KprobeMulti(k) => Some(k.missed),
                    LinkTypeInfo::PerfEvent(p) => match p.event_type {
                        PerfEventType::Kprobe { missed, .. } => Some(missed),
                        _ => None,
                    },
                    _ => None,
                }
            })
            .sum();
        // fentry/fexit programs run under a per-program recursion guard:
        // a call that arrives while the program runs on that CPU (it was
        // preempted inside it) is skipped and counted as a recursion miss.
        let recursion: u64 = self
            .kprogs
            .iter()
            .filter_map(|f| recursion_misses(f.as_fd()))
            .sum();
        live + recursion
    }

    /// Moves the programs on to `epoch`: their runs from now on update
    /// keys of the new epoch, and the old one can be read once runs in
    /// flight have finished (`collect::EPOCH_GRACE`).
    pub fn set_epoch(&mut self, epoch: u32) {
        if let Some(bss) = self.skel.maps.bss_data.as_deref_mut() {
            // SAFETY: bss is the mmap'd .bss of the loaded object, valid for the
            // skeleton's lifetime; a volatile write keeps the store visible to the kernel.
            unsafe { std::ptr::write_volatile(&mut bss.epoch, epoch) };
        }
    }

    /// Detaches every probe; maps stay readable (and a script's END can still run).
    pub fn detach(&mut self) {
        self.missed_at_detach += self.link_misses();
        detach_all(std::mem::take(&mut self.links));
        detach_all(std::mem::take(&mut self.klinks));
        self.kprogs.clear();
    }

    /// Detaches every probe without waiting for the kernel: a forked child
    /// holds the links (it shares every descriptor) until this process is
    /// gone, then exits, so the last close of each, and the RCU grace
    /// period a tracepoint's detach waits for (about 100 ms each here), is
    /// the child's. Call it last: the probes stay attached until then, so
    /// the programs must already be idle (a script's `vm_stopped`). Falls
    /// back to `detach` when the fork fails.
    pub fn detach_in_background(&mut self) {
        // SAFETY: the child only calls async-signal-safe functions (getppid,
        // nanosleep, _exit) before it exits, as a fork of a threaded
        // process must.
        let parent = unsafe { libc::getpid() };
        // SAFETY: as above.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // A reader of our output (a pipe) must see its end when we
            // exit, not when this child does.
            for fd in 0..3 {
                // SAFETY: close is async-signal-safe; these are the
                // child's own copies of the standard descriptors.
                unsafe { libc::close(fd) };
            }
            let ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: 2_000_000,
            };
            // SAFETY: getppid and nanosleep have no memory-safety
            // preconditions; ts lives on this stack for each call.
            while unsafe { libc::getppid() } == parent {
                unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) };
            }
            // SAFETY: ends the child without running the parent's destructors.
            unsafe { libc::_exit(0) };
        }
        if pid < 0 {
            return self.detach();
        }
        // Our closes are no longer the last ones: they return at once.
        self.links.clear();
        self.klinks.clear();
        self.kprogs.clear();
    }

    /// Attaches the kernel function probes, each through its planned
    /// mechanism, then its fallback for those that failed; the rest are skipped.
    fn attach_kfuncs(&mut self, plan: &Plan, out: &mut Attached) {
        let mut pending: Vec<(usize, Mech)> = Vec::new();
        for (i, p) in plan.probes.iter().enumerate() {
            if let Path::Kfunc(k) = &p.path {
                match &k.unavailable {
                    Some(why) => out.skipped.push((p.probe.name.clone(), why.clone())),
                    None => pending.push((i, k.mech)),
                }
            }
        }
        for round in 0..2 {
            if pending.is_empty() {
                break;
            }
            let failed = self.attach_kfunc_round(plan, &pending);
            pending = fallbacks(plan, round == 0, failed, out);
        }
    }

    /// Attaches each pending function through the mechanism given, entries
    /// first; returns the failures.
    fn attach_kfunc_round(
        &mut self,
        plan: &Plan,
        pending: &[(usize, Mech)],
    ) -> Vec<(usize, Mech, String)> {
        let items = |m: Mech, ret: bool| -> Vec<(usize, &KfuncPath)> {
            pending
                .iter()
                .filter(|(_, pm)| *pm == m)
                .filter_map(|(i, _)| Some((*i, kfunc_path(plan, *i)?)))
                .filter(|(_, k)| k.ret == ret)
                .collect()
        };
        let mut failed = Vec::new();
        for ret in [false, true] {
            for (i, e) in self.attach_fentry(&items(Mech::Fentry, ret), ret) {
                failed.push((i, Mech::Fentry, e));
            }
            for (i, e) in self.attach_multi(&items(Mech::KprobeMulti, ret), ret) {
                failed.push((i, Mech::KprobeMulti, e));
            }
            for (i, k) in items(Mech::Kprobe, ret) {
                if let Err(e) = self.attach_kprobe(i, k) {
                    failed.push((i, Mech::Kprobe, e));
                }
            }
        }
        failed
    }

    /// Loads a copy of the fentry (or fexit) program per function and
    /// attaches it; returns the failures.
    fn attach_fentry(&mut self, items: &[(usize, &KfuncPath)], ret: bool) -> Vec<(usize, String)> {
        let mut failed = Vec::new();
        if items.is_empty() {
            return failed;
        }
        if self.images[ret as usize].is_none() {
            return items
                .iter()
                .map(|(i, _)| (*i, "the fentry program is not loaded".to_string()))
                .collect();
        }
        let mut todo: Vec<(usize, u32)> = Vec::new();
        for (i, k) in items {
            let Some(id) = k.btf_id else {
                failed.push((*i, "no BTF prototype".to_string()));
                continue;
            };
            match self.attach_template(*i, id, ret) {
                Some(Ok(())) => {}
                Some(Err(e)) => failed.push((*i, e)),
                None => todo.push((*i, id)),
            }
        }
        let loaded = match &self.images[ret as usize] {
            Some(image) => load_copies(image, &todo, ret),
            None => Vec::new(),
        };
        for (i, r) in loaded {
            match r {
                Ok((prog, link)) => {
                    self.kprogs.push(prog);
                    self.klinks.push(KLink::Fd(link));
                }
                Err(e) => failed.push((i, e)),
            }
        }
        failed
    }

    /// Attaches the loaded fentry (or fexit) program itself to the
    /// function of this BTF id when it is the template it was loaded
    /// against, once per direction; None when it is not.
    fn attach_template(&mut self, i: usize, btf_id: u32, ret: bool) -> Option<Result<(), String>> {
        let aimed = self.template.as_ref().is_some_and(|t| t.btf_id == btf_id);
        if !aimed || self.template_used[ret as usize] {
            return None;
        }
        self.template_used[ret as usize] = true;
        let prog = if ret {
            &self.skel.progs.bpfscope_fexit
        } else {
            &self.skel.progs.bpfscope_fentry
        };
        Some(
            match kfunc::attach_tracing(prog.as_fd(), ret, i as u64 + 1) {
                Ok(l) => {
                    self.klinks.push(KLink::Fd(l));
                    Ok(())
                }
                Err(e) => Err(e.to_string()),
            },
        )
    }

    /// One kprobe_multi link for all these functions; when the kernel
    /// refuses the set, halves are tried until the functions it refuses are
    /// found. Returns the failures.
    fn attach_multi(&mut self, items: &[(usize, &KfuncPath)], ret: bool) -> Vec<(usize, String)> {
        let mut failed = Vec::new();
        let mut stack: Vec<&[(usize, &KfuncPath)]> = Vec::new();
        if !items.is_empty() {
            stack.push(items);
        }
        while let Some(set) = stack.pop() {
            let opts = KprobeMultiOpts {
                symbols: set.iter().map(|(_, k)| k.func.clone()).collect(),
                cookies: set.iter().map(|(i, _)| *i as u64 + 1).collect(),
                retprobe: ret,
                ..Default::default()
            };
            match self
                .skel
                .progs
                .bpfscope_kmulti
                .attach_kprobe_multi_with_opts(opts)
            {
                Ok(l) => self.klinks.push(KLink::Libbpf(l)),
                Err(e) if set.len() == 1 => failed.push((set[0].0, e.to_string())),
                Err(_) => {
                    let (a, b) = set.split_at(set.len() / 2);
                    stack.push(a);
                    stack.push(b);
                }
            }
        }
        failed
    }

    /// One uprobe_multi link for these (probe index, file offset) pairs of
    /// one binary, each with its probe's cookie. When the kernel refuses the
    /// set for a reason that belongs to one function (an instruction it
    /// cannot probe, an offset outside the file), halves are tried until
    /// the refused functions are found. Returns the failures.
    fn attach_umulti(
        &mut self,
        binary: &std::path::Path,
        ret: bool,
        items: &[(usize, u64)],
        pid: i32,
    ) -> Vec<(usize, libbpf_rs::Error)> {
        let mut failed = Vec::new();
        let mut stack: Vec<&[(usize, u64)]> = Vec::new();
        if !items.is_empty() {
            stack.push(items);
        }
        while let Some(set) = stack.pop() {
            let opts = UprobeMultiOpts {
                offsets: set.iter().map(|(_, o)| *o as usize).collect(),
                cookies: set.iter().map(|(i, _)| *i as u64 + 1).collect(),
                retprobe: ret,
                ..Default::default()
            };
            match self
                .skel
                .progs
                .bpfscope_umulti
                .attach_uprobe_multi_with_opts(pid, binary, "", opts)
            {
                Ok(l) => self.links.push(l),
                Err(e) if set.len() > 1 && per_function(&e) => {
                    let (a, b) = set.split_at(set.len() / 2);
                    stack.push(b);
                    stack.push(a);
                }
                Err(e) => {
                    // Shared by the whole set (no such file, no permission):
                    // every function in it fails the same way.
                    let why = e.to_string();
                    failed.extend(
                        set.iter()
                            .map(|(i, _)| (*i, libbpf_rs::Error::from(io_like(&e, &why)))),
                    );
                }
            }
        }
        failed
    }

    /// One uprobe perf link per function (kernels without uprobe_multi).
    fn attach_uprobes(
        &mut self,
        binary: &std::path::Path,
        ret: bool,
        items: &[(usize, u64)],
        pid: i32,
    ) -> Vec<(usize, libbpf_rs::Error)> {
        let mut failed = Vec::new();
        for &(i, offset) in items {
            match self.skel.progs.bpfscope_uprobe.attach_uprobe_with_opts(
                pid,
                binary,
                offset as usize,
                UprobeOpts {
                    cookie: i as u64 + 1,
                    retprobe: ret,
                    ..Default::default()
                },
            ) {
                Ok(l) => self.links.push(l),
                Err(e) => failed.push((i, e)),
            }
        }
        failed
    }

    /// One kprobe or kretprobe.
    fn attach_kprobe(&mut self, i: usize, k: &KfuncPath) -> Result<(), String> {
        let cookie = i as u64 + 1;
        let prog = &self.skel.progs.bpfscope_kprobe;
        let link = if k.offset == 0 {
            prog.attach_kprobe_with_opts(
                k.ret,
                &k.func,
                KprobeOpts {
                    cookie,
                    ..Default::default()
                },
            )
            .map(KLink::Libbpf)
            .map_err(|e| e.to_string())?
        } else {
            kfunc::attach_kprobe_at(prog, &k.func, k.offset, k.ret, cookie)
                .map(KLink::Raw)
                .map_err(|e| e.to_string())?
        };
        self.klinks.push(link);
        Ok(())
    }
}

/// The kernel function path of the probe at index `i`.
fn kfunc_path(plan: &Plan, i: usize) -> Option<&KfuncPath> {
    match &plan.probes[i].path {
        Path::Kfunc(k) => Some(k),
        _ => None,
    }
}

/// After a round of kernel function attaches: the failed functions to
/// try again through their fallback (in the first round), noted for -v;
/// the others are skipped with the reason.
fn fallbacks(
    plan: &Plan,
    first: bool,
    failed: Vec<(usize, Mech, String)>,
    out: &mut Attached,
) -> Vec<(usize, Mech)> {
    let mut pending = Vec::new();
    for (i, mech, err) in failed {
        let name = plan.probes[i].probe.name.clone();
        let Some(k) = kfunc_path(plan, i) else {
            continue;
        };
        match k.fallback {
            Some(fb) if first => {
                out.notes.push(format!(
                    "{name}: {} failed ({err}); trying {}",
                    mech.describe(k.ret),
                    fb.describe(k.ret)
                ));
                pending.push((i, fb));
            }
            _ => out
                .skipped
                .push((name, format!("{}: {err}", mech.describe(k.ret)))),
        }
    }
    pending
}

/// A loaded and attached copy of a program (program, link), or why not.
type Loaded = (usize, Result<(OwnedFd, OwnedFd), String>);

/// Loads and attaches a copy of `image` per (probe index, BTF id). Loads
/// run on several threads: the verifier takes most of the time, and each
/// function needs its own pass.
fn load_copies(image: &ProgImage, todo: &[(usize, u32)], ret: bool) -> Vec<Loaded> {
    let workers = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .clamp(1, 4);
    let per = todo.len().div_ceil(workers).max(1);
    let one = |&(i, id): &(usize, u32)| -> Loaded {
        let r = image.load_for(id).and_then(|prog| {
            let link = kfunc::attach_tracing(prog.as_fd(), ret, i as u64 + 1)
                .map_err(|e| format!("attaching: {e}"))?;
            Ok((prog, link))
        });
        (i, r)
    };
    std::thread::scope(|sc| {
        let handles: Vec<_> = todo
            .chunks(per)
            .map(|chunk| sc.spawn(move || chunk.iter().map(one).collect::<Vec<Loaded>>()))
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_default())
            .collect()
    })
}

/// Fixes this run's constants in .rodata, so the verifier sees them and
/// the programs loop only as far as this plan needs.
fn specialize(
    open: &mut OpenTraceSkel<'_>,
    plan: &Plan,
    s: &LoadConfig,
    shape: &Shape,
) -> Result<()> {
    let (kst, ust) = plan.stacks();
    let ro = open
        .maps
        .rodata_data
        .as_deref_mut()
        .context("BPF object has no .rodata")?;
    ro.self_tgid = std::process::id();
    ro.target_mode = match s.target {
        Target::All => bs_target_mode::BS_TARGET_ALL.0,
        _ => bs_target_mode::BS_TARGET_TRACKED.0,
    };
    ro.max_filter_ops = plan.max_filter as u32;
    ro.max_key_parts = plan.max_keys as u32;
    ro.max_emit = plan.max_emit as u32;
    ro.start_size = start_size(plan);
    ro.use_stacks = u32::from(kst || ust);
    ro.use_vm = u32::from(plan.vm.is_some());
    if let Some(vm) = &plan.vm {
        ro.vm_ops = vm.code.iter().fold(0u64, |m, i| m | 1u64 << (i.op & 63));
        ro.vm_task_on = u32::from(vm.thread_maps);
        for &(w, id) in &vm.task_print {
            ro.vm_task_print |= 1 << w;
            if let Some(slot) = ro.vm_task_ids.get_mut(w as usize) {
                *slot = id;
            }
        }
    }
    ro.wakeup_bytes = u64::from(ringbuf_bytes(s) / 4);
    ro.bench_stage = shape::bench_stage()?;
    ro.fast_path = u32::from(shape.plain);
    ro.fast_agg = shape.agg;
    ro.fast_slots = u32::from(shape.slot_buckets.is_some());
    ro.slot_buckets = shape.slot_buckets.unwrap_or(1);
    ro.fast_key = shape.builtin_key;
    (ro.fast_cache, ro.cache_mask) = shape.cache_words();
    if let Some(f) = shape.comm_filter {
        ro.fast_comm_op = if f.negate { 2 } else { 1 };
        ro.fast_comm = f.words;
        ro.fast_comm_mask = f.masks;
        // The filter machine is left out of the programs.
        ro.max_filter_ops = 0;
    }
    Ok(())
}

/// Bytes of an aggregation key (or a latency start): the header, then the plan's key.
fn start_size(plan: &Plan) -> u32 {
    let hdr = std::mem::size_of::<bpfscope_bpf::abi::bs_key_hdr>() as u32;
    hdr + plan.key_size as u32
}

/// Bytes of a latency match key the map hashes and compares: the pair and
/// the values its probes match on, not all BS_MAX_MATCH of them (the rest
/// are zeros: a 16-byte key where there were 40, three times a pair).
fn match_key_size(plan: &Plan) -> u32 {
    let most = bs_limits::BS_MAX_MATCH.0 as u8;
    let n = plan
        .probes
        .iter()
        .map(|p| p.cfg.nmatch.min(most))
        .max()
        .unwrap_or(0);
    (std::mem::offset_of!(bs_match_key, vals) + usize::from(n) * std::mem::size_of::<u64>()) as u32
}

fn ringbuf_bytes(s: &LoadConfig) -> u32 {
    s.ringbuf_bytes.unwrap_or(PAGE)
}

/// Sizes the maps for this plan: what it does not use takes one entry.
/// Returns a script's maps, made here so that their arrays fill while the
/// object loads.
fn size_maps(
    open: &mut OpenTraceSkel<'_>,
    plan: &Plan,
    s: &LoadConfig,
    shape: &Shape,
) -> Result<Option<VmMaps>> {
    let maps = &mut open.maps;
    let mut vm_maps = None;
    if shape.cache_key.is_none() {
        // Without the key cache its code is left out at load; one entry
        // (8 KiB per CPU) stays, as a map cannot have none.
        maps.kcache.set_max_entries(1)?;
    }
    if let Some(n) = shape.slot_buckets {
        // Keyless: the slots hold the aggregates, the hash map is not used.
        maps.slots.set_max_entries(2 * n)?;
        maps.aggs.set_max_entries(1)?;
    }
    maps.probes
        .set_max_entries((plan.probes.len() as u32).max(1))?;
    maps.strs
        .set_max_entries((plan.strs.strs.len() as u32).max(1))?;
    maps.aggs.set_key_size(start_size(plan))?;
    if plan.latency {
        maps.starts.set_value_size(start_size(plan))?;
        maps.starts.set_key_size(match_key_size(plan))?;
        maps.starts.set_max_entries(STARTS_MAX)?;
    }
    let (kst, ust) = plan.stacks();
    if kst {
        maps.kstacks.set_max_entries(s.max_stacks.unwrap_or(1))?;
    }
    if ust {
        maps.ustacks.set_max_entries(s.max_stacks.unwrap_or(1))?;
    }
    if shape.slot_buckets.is_none() {
        maps.aggs.set_max_entries(s.max_keys.unwrap_or(1))?;
    }
    if let Some(vm) = &plan.vm {
        maps.vm_code
            .set_max_entries((vm.code.len() as u32).max(1))?;
        maps.vm_srcs
            .set_max_entries((vm.srcs.len() as u32).max(1))?;
        let nmaps = (vm.maps.len() as u32).max(1);
        let made = VmMaps::create(vm, start_size(plan))?;
        for (outer, (h, _, _)) in [&mut maps.vm_aggs, &mut maps.vm_vals, &mut maps.vm_slots]
            .into_iter()
            .zip(&made.outer)
        {
            outer
                .reuse_fd(h.as_fd())
                .context("handing the script maps' arrays to the object")?;
        }
        vm_maps = Some(made);
        maps.vm_full.set_max_entries(nmaps)?;
        maps.vm_cut
            .set_max_entries((plan.probes.len() as u32).max(1))?;
    }
    // The threads' storage only for a script with maps there: a kernel
    // program that names it (a compiled probe's) is loaded after.
    maps.vm_task
        .set_autocreate(plan.vm.as_ref().is_some_and(|vm| vm.thread_maps))?;
    // The aggregations' caches only for a script with such a map: only
    // compiled probes (loaded after) name it.
    let caches = plan.vm.as_ref().map_or(0, |vm| vm.cache_maps);
    maps.vm_cache.set_autocreate(caches > 0)?;
    maps.vm_cache.set_max_entries(caches.max(1))?;
    maps.events.set_max_entries(ringbuf_bytes(s))?;
    // Only a run that follows processes fills `tracked` (65,536 entries
    // preallocated cost 1.6 ms of every other run's start).
    if matches!(s.target, Target::All) {
        maps.tracked.set_max_entries(1)?;
    }
    Ok(vm_maps)
}

/// The inner template of a script's array of maps (vm_aggs, vm_vals,
/// vm_slots): its inner maps must have the template's key size, the
/// script's longest key, and the per-CPU arrays (vm_slots) its `slots`
/// entries, as the kernel checks an array's size against its template's
/// (BPF_F_INNER_MAP, any size, is for plain arrays only). Held until the
/// object is loaded.
fn inner_template(kind: VmMapKind, key_size: u32, slots: u32) -> Result<MapHandle> {
    let entries = if kind == VmMapKind::Slots { slots } else { 1 };
    inner_map(kind, "bs_inner", key_size, entries)
}

/// A script map's kernel map: per-CPU aggregates allocated as keys come
/// (most maps hold few), plain values preallocated (as bpftrace's), or a
/// keyless aggregation's buckets in a per-CPU array.
fn inner_map(kind: VmMapKind, name: &str, key_size: u32, entries: u32) -> Result<MapHandle> {
    let agg_val = std::mem::size_of::<bpfscope_bpf::abi::bs_agg_val>() as u32;
    let (ty, key_size, value_size, flags) = match kind {
        VmMapKind::Aggs => (
            MapType::PercpuHash,
            key_size,
            agg_val,
            libbpf_sys::BPF_F_NO_PREALLOC,
        ),
        VmMapKind::Values => (MapType::Hash, key_size, bs_limits::BS_VAL_MAX.0, 0),
        VmMapKind::Slots => (MapType::PercpuArray, 4, agg_val, 0),
    };
    let opts = libbpf_sys::bpf_map_create_opts {
        sz: std::mem::size_of::<libbpf_sys::bpf_map_create_opts>() as libbpf_sys::size_t,
        map_flags: flags,
        ..Default::default()
    };
    Ok(MapHandle::create(
        ty,
        Some(name),
        key_size,
        value_size,
        entries,
        &opts,
    )?)
}

/// A script's maps, each a kernel map of its own, put in its outer array
/// (vm_aggs or vm_vals) at its id. Each update of an array of maps waits
/// for an RCU grace period (about 15 ms here): the arrays are made before
/// the object loads and filled, one batch each, while it loads.
struct VmMaps {
    /// Each script map's kernel map, in id order.
    inner: Vec<MapHandle>,
    /// vm_aggs, vm_vals and vm_slots (in `OUTER`'s order), each with the
    /// ids and map fds it is filled with.
    outer: Vec<(MapHandle, Vec<u8>, Vec<u8>)>,
}

/// The script maps' arrays, by kind.
const OUTER: [(VmMapKind, &str); 3] = [
    (VmMapKind::Aggs, "vm_aggs"),
    (VmMapKind::Values, "vm_vals"),
    (VmMapKind::Slots, "vm_slots"),
];

impl VmMaps {
    fn create(vm: &VmImage, key_size: u32) -> Result<VmMaps> {
        let nmaps = (vm.maps.len() as u32).max(1);
        let slots = vm
            .maps
            .iter()
            .filter(|m| m.kind == VmMapKind::Slots)
            .map(|m| m.entries)
            .max()
            .unwrap_or(1);
        let mut outer = Vec::with_capacity(OUTER.len());
        for (kind, name) in OUTER {
            // The kernel keeps the template's shape: it may go once the
            // array exists.
            let t = inner_template(kind, key_size, slots)
                .context("creating the script maps' template")?;
            let opts = libbpf_sys::bpf_map_create_opts {
                sz: std::mem::size_of::<libbpf_sys::bpf_map_create_opts>() as libbpf_sys::size_t,
                inner_map_fd: t.as_fd().as_raw_fd() as u32,
                ..Default::default()
            };
            let h = MapHandle::create(MapType::ArrayOfMaps, Some(name), 4, 4, nmaps, &opts)
                .context("creating the script maps' array")?;
            outer.push((h, Vec::new(), Vec::new()));
        }
        let mut inner = Vec::with_capacity(vm.maps.len());
        for (id, m) in vm.maps.iter().enumerate() {
            // Named after the script's map where bpftool shows it (15 bytes).
            let name: String = m
                .name
                .chars()
                .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
                .take(12)
                .collect();
            let entries = if m.kind == VmMapKind::Slots {
                slots
            } else {
                m.entries
            };
            let h =
                inner_map(m.kind, &format!("bs_{name}"), key_size, entries).with_context(|| {
                    format!(
                        "creating the kernel map of {} ({} entries)",
                        m.name, m.entries
                    )
                })?;
            let fd = h.as_fd().as_raw_fd() as u32;
            let at = OUTER.iter().position(|o| o.0 == m.kind).unwrap_or(0);
            let (_, keys, fds) = &mut outer[at];
            keys.extend_from_slice(&(id as u32).to_ne_bytes());
            fds.extend_from_slice(&fd.to_ne_bytes());
            inner.push(h);
        }
        Ok(VmMaps { inner, outer })
    }
}

/// Puts the script maps in one outer array.
fn fill_outer((outer, keys, fds): &(MapHandle, Vec<u8>, Vec<u8>)) -> Result<()> {
    let n = (keys.len() / 4) as u32;
    if n == 0 {
        return Ok(());
    }
    if outer
        .update_batch(keys, fds, n, MapFlags::ANY, MapFlags::ANY)
        .is_err()
    {
        // A kernel without batch updates of arrays of maps: one by one.
        for (k, v) in keys.chunks(4).zip(fds.chunks(4)) {
            outer
                .update(k, v, MapFlags::ANY)
                .context("adding a script map's kernel map to its array")?;
        }
    }
    Ok(())
}

/// Loads the object while other threads fill the script maps' arrays:
/// their grace periods pass during the verifier's work instead of after it
/// (a 6-map script: 65 ms to its end before, 45 ms now, paired medians).
fn load_filling<'obj>(
    open: OpenTraceSkel<'obj>,
    verbose: bool,
    vm_maps: Option<&VmMaps>,
) -> Result<TraceSkel<'obj>> {
    let outers = vm_maps.map(|m| m.outer.as_slice()).unwrap_or_default();
    std::thread::scope(|sc| {
        let fills: Vec<_> = outers
            .iter()
            .map(|o| sc.spawn(move || fill_outer(o)))
            .collect();
        let skel = load_object(open, verbose);
        let mut filled = Ok(());
        for f in fills {
            let r = f
                .join()
                .unwrap_or_else(|_| Err(anyhow::anyhow!("filling a script map array failed")));
            if filled.is_ok() {
                filled = r;
            }
        }
        let skel = skel?;
        filled?;
        Ok(skel)
    })
}

/// The programs a plan needs loaded; the others are not loaded at all.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Programs {
    sysin: bool,
    sysout: bool,
    rawtp: bool,
    tp: bool,
    /// uprobes through uprobe_multi links, or one link each.
    umulti: bool,
    uprobe: bool,
    usdt: bool,
    /// Software clocks of a script's profile probes.
    clock: bool,
    /// A script's BEGIN/END/interval blocks, run with BPF_PROG_TEST_RUN.
    trigger: bool,
    fork: bool,
    /// A thread leaving hands its printed thread-map values to the maps.
    task_exit: bool,
    /// Kernel functions: what the plan tries first, and its fallbacks.
    kprobe: bool,
    kmulti: bool,
    fentry: bool,
    fexit: bool,
}

impl Programs {
    fn for_plan(plan: &Plan, s: &LoadConfig, features: &Features) -> Programs {
        let has = |f: &dyn Fn(&Path) -> bool| {
            (plan.probes.iter().enumerate()).any(|(i, p)| !s.compiled.contains(&i) && f(&p.path))
        };
        let uses = |m: Mech, ret: Option<bool>| {
            plan.probes.iter().any(|p| {
                matches!(&p.path, Path::Kfunc(k) if k.unavailable.is_none()
                    && (k.mech == m || k.fallback == Some(m))
                    && ret.is_none_or(|r| r == k.ret))
            })
        };
        let uprobes = has(&|p| matches!(p, Path::Uprobe { .. }));
        let umulti = uprobes && features.uprobe_multi();
        let triggers = has(&|p| matches!(p, Path::Trigger));
        Programs {
            sysin: has(&|p| matches!(p, Path::Syscall(sc) if !sc.exit)),
            sysout: has(&|p| matches!(p, Path::Syscall(sc) if sc.exit)),
            rawtp: has(&|p| matches!(p, Path::RawTp { .. })),
            tp: has(&|p| matches!(p, Path::Tracepoint { .. })),
            umulti,
            uprobe: uprobes && !umulti,
            trigger: triggers,
            clock: has(&|p| matches!(p, Path::Clock { .. } | Path::Perf { .. })),
            usdt: has(&|p| matches!(p, Path::Usdt { .. })),
            fork: matches!(s.target, Target::Command { .. }),
            task_exit: plan.vm.as_ref().is_some_and(|vm| !vm.task_print.is_empty()),
            kprobe: uses(Mech::Kprobe, None),
            kmulti: uses(Mech::KprobeMulti, None),
            fentry: uses(Mech::Fentry, Some(false)),
            fexit: uses(Mech::Fentry, Some(true)),
        }
    }

    /// The function fentry/fexit programs are loaded against, when any is used.
    fn template(&self, features: &Features) -> Result<Option<Template>> {
        if !(self.fentry || self.fexit) {
            return Ok(None);
        }
        let t = features
            .fentry()
            .map_err(|e| anyhow::anyhow!("fentry is not available: {e}"))?;
        Ok(Some(t.clone()))
    }

    /// Marks the programs to load. fentry/fexit are aimed at the template
    /// function here; copies of the loaded instructions serve the real
    /// targets (attach/kfunc.rs).
    fn select(&self, open: &mut OpenTraceSkel<'_>, template: Option<&Template>) -> Result<()> {
        let progs = &mut open.progs;
        progs.bpfscope_sysin.set_autoload(self.sysin);
        progs.bpfscope_sysout.set_autoload(self.sysout);
        progs.bpfscope_rawtp.set_autoload(self.rawtp);
        progs.bpfscope_tp.set_autoload(self.tp);
        progs.bpfscope_umulti.set_autoload(self.umulti);
        progs.bpfscope_uprobe.set_autoload(self.uprobe);
        progs.bpfscope_usdt.set_autoload(self.usdt);
        progs.bpfscope_clock.set_autoload(self.clock);
        progs.bpfscope_trigger.set_autoload(self.trigger);
        progs.bpfscope_fork.set_autoload(self.fork);
        progs.bpfscope_task_exit.set_autoload(self.task_exit);
        progs.bpfscope_kprobe.set_autoload(self.kprobe);
        progs.bpfscope_kmulti.set_autoload(self.kmulti);
        for (prog, on) in [
            (&mut progs.bpfscope_fentry, self.fentry),
            (&mut progs.bpfscope_fexit, self.fexit),
        ] {
            prog.set_autoload(on);
            if let (true, Some(t)) = (on, template) {
                prog.set_attach_target(0, Some(t.func.clone()))
                    .context("aiming the fentry program")?;
            }
        }
        Ok(())
    }
}

/// Loads the object: the verifier's reason when it refuses, load times with -v.
fn load_object(open: OpenTraceSkel<'_>, verbose: bool) -> Result<TraceSkel<'_>> {
    let t0 = std::time::Instant::now();
    let skel = open.load().map_err(|e| {
        anyhow::anyhow!("{e}").context(format!(
            "loading BPF programs{}",
            libbpf_log::last_error_hint()
        ))
    })?;
    if verbose {
        report_load(&skel, t0.elapsed());
    }
    Ok(skel)
}

/// The plan's uprobes by binary and direction, in the order first seen:
/// one uprobe_multi link each.
fn uprobe_groups(plan: &Plan) -> Vec<UprobeGroup<'_>> {
    let mut groups: Vec<UprobeGroup> = Vec::new();
    for (i, p) in plan.probes.iter().enumerate() {
        if let Path::Uprobe {
            binary,
            offset,
            ret,
        } = &p.path
        {
            match groups
                .iter_mut()
                .find(|g| g.0 == binary.as_path() && g.1 == *ret)
            {
                Some(g) => g.2.push((i, *offset)),
                None => groups.push((binary, *ret, vec![(i, *offset)])),
            }
        }
    }
    groups
}

/// The errno behind a libbpf error, if any. libbpf-rs keeps the
/// io::Error private inside its own error chain, and only its text shows
/// the number: "... (os error 524)".
fn errno(e: &libbpf_rs::Error) -> Option<i32> {
    let text = format!("{e:?}");
    let at = text.rfind("(os error ")?;
    text[at + 10..].split(')').next()?.parse().ok()
}

/// ENOTSUPP: the kernel's uprobe code cannot handle the instruction
/// (not in errno.h: a kernel-internal value that reaches user space).
const ENOTSUPP: i32 = 524;

/// Whether a refused uprobe_multi link may be down to some of its
/// functions (the instruction, the offset), so that smaller sets can work.
fn per_function(e: &libbpf_rs::Error) -> bool {
    matches!(
        errno(e),
        Some(ENOTSUPP | libc::EINVAL | libc::ENOEXEC | libc::EFAULT | libc::EEXIST)
    )
}

/// The same error again, for each function of a set that failed as a whole.
fn io_like(e: &libbpf_rs::Error, why: &str) -> std::io::Error {
    match errno(e) {
        Some(n) => std::io::Error::from_raw_os_error(n),
        None => std::io::Error::other(why.to_string()),
    }
}

/// Why the kernel refused a uprobe, in words, with what to do.
fn uprobe_refusal(
    binary: &std::path::Path,
    offset: u64,
    ret: bool,
    e: &libbpf_rs::Error,
) -> String {
    match errno(e) {
        Some(ENOTSUPP) => {
            let insn = crate::probe::elf::insn_at(binary, offset);
            match insn {
                // A return probe needs the entry: only another function will do.
                Some(i) if ret => format!(
                    "the kernel cannot place a uprobe on the instruction there, {}; trace another function's return",
                    i.describe()
                ),
                Some(i) => format!(
                    "the kernel cannot place a uprobe on the instruction there, {}; probe another function, or this one past that instruction (+{:#x})",
                    i.describe(),
                    i.len
                ),
                None => "the kernel cannot place a uprobe on the instruction there; probe another function".to_string(),
            }
        }
        Some(libc::EINVAL) => {
            format!("the kernel refused a uprobe at file offset {offset:#x} (EINVAL)")
        }
        _ => format!("attaching failed: {e}"),
    }
}

/// A binary mapped executable, read-only and private, into this process
/// while its uprobes are registered (see `attach`); unmapped on drop.
fn exec_view(path: &std::path::Path) -> Option<bpfscope_sys::mmap::Mapping> {
    use std::os::fd::AsFd;
    let f = std::fs::File::open(path).ok()?;
    let len = usize::try_from(f.metadata().ok()?.len()).ok()?;
    bpfscope_sys::mmap::Mapping::exec_view(f.as_fd(), len).ok()
}

/// Drops links in parallel: each tracepoint detach waits for an RCU grace
/// period, a classic (perf event) tracepoint link about 100 ms, and the
/// waits overlap across threads. The links are dealt out round-robin:
/// the slow ones sit next to each other in the list, and 64 threads take
/// thousands of links down in a few hundred ms, where 8 contiguous chunks
/// took seconds.
pub fn detach_all<L: Send>(links: Vec<L>) {
    if links.len() < 2 {
        drop(links);
        return;
    }
    let threads = links.len().min(64);
    let mut hands: Vec<Vec<L>> = (0..threads).map(|_| Vec::new()).collect();
    for (i, l) in links.into_iter().enumerate() {
        hands[i % threads].push(l);
    }
    std::thread::scope(|s| {
        for hand in hands {
            s.spawn(move || drop(hand));
        }
    });
}

/// True when an attach failed for lack of a resource (descriptors,
/// memory) that every further attach would lack too.
fn exhausted(e: &anyhow::Error) -> bool {
    let msg = format!("{e:#}");
    [libc::EMFILE, libc::ENFILE, libc::ENOMEM]
        .iter()
        .any(|n| msg.contains(&format!("(os error {n})")))
}

/// -v: how long loading took and how many instructions the verifier
/// processed per program (what a filter or key layout costs at load).
fn report_load(skel: &TraceSkel<'_>, took: std::time::Duration) {
    use libbpf_rs::AsRawLibbpf;
    let mut parts = Vec::new();
    for p in skel.object().progs() {
        // SAFETY: the program pointer is valid for the object's lifetime.
        let fd = unsafe { libbpf_sys::bpf_program__fd(p.as_libbpf_object().as_ptr()) };
        if fd < 0 {
            continue; // not loaded
        }
        let mut info = libbpf_sys::bpf_prog_info::default();
        let mut len = std::mem::size_of::<libbpf_sys::bpf_prog_info>() as u32;
        // SAFETY: fd is a loaded program's descriptor, owned by the object;
        // info and len describe a writable buffer of that size.
        let rc = unsafe { libbpf_sys::bpf_prog_get_info_by_fd(fd, &mut info, &mut len) };
        if rc == 0 {
            parts.push(format!(
                "{} {} insns",
                p.name().to_string_lossy(),
                info.verified_insns
            ));
        }
    }
    if parts.is_empty() {
        // Every probe runs as a compiled program of its own.
        parts.push("no generic program".into());
    }
    eprintln!(
        "loaded in {:.1} ms; verifier processed: {}",
        took.as_secs_f64() * 1e3,
        parts.join(", ")
    );
}

/// A loaded program's recursion misses (bpf_prog_info, Linux 5.12+).
fn recursion_misses(fd: BorrowedFd<'_>) -> Option<u64> {
    let mut info = libbpf_sys::bpf_prog_info::default();
    let mut len = std::mem::size_of::<libbpf_sys::bpf_prog_info>() as u32;
    // SAFETY: info and len are valid for writes of len bytes for the call.
    let r = unsafe { libbpf_sys::bpf_prog_get_info_by_fd(fd.as_raw_fd(), &mut info, &mut len) };
    (r == 0).then_some(info.recursion_misses)
}

/// Says which probes could not be attached (with -v, why, and how
/// kernel functions ended up attached).
pub fn report_skipped(att: &Attached, verbose: bool) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attach::plan::fixtures::*;
    use crate::attach::plan::{build, Action};
    use crate::probe::KfuncKind;

    fn plan_of(probes: Vec<crate::probe::Probe>, features: &Features) -> Plan {
        build(&config(Action::Count, &[], None), plain(probes), features).unwrap()
    }

    #[test]
    fn match_keys_hash_only_the_values_matched() {
        // The pair and one value: 16 bytes of the struct's 40.
        let one = wakeup_to_switch(&["pid=next_pid"], &[]);
        assert_eq!(match_key_size(&one), 16);
        assert_eq!(std::mem::size_of::<bs_match_key>(), 40);
        let two = wakeup_to_switch(&["pid=next_pid", "prio=next_prio"], &[]);
        assert_eq!(match_key_size(&two), 24);
    }

    fn command() -> Target {
        Target::Command {
            program: "/bin/true".into(),
            args: Vec::new(),
        }
    }

    #[test]
    fn programs_for_what_the_plan_uses() {
        let f = features();
        let plan = plan_of(
            vec![
                sys_enter_openat(),
                sys_exit_read(),
                sched_switch(),
                uprobe("work", 0x10),
                kfunc("vfs_read", KfuncKind::Kprobe, Some(1), true),
                kfunc("vfs_write", KfuncKind::Kprobe, None, true),
                kfunc("ksys_read", KfuncKind::Kretprobe, Some(2), false),
            ],
            &f,
        );
        let p = Programs::for_plan(&plan, &loading(command(), &[]), &f);
        let want = Programs {
            sysin: true,
            sysout: true,
            rawtp: true,
            umulti: true,
            fork: true,
            kmulti: true,
            fentry: true,
            fexit: true,
            ..Default::default()
        };
        assert_eq!(p, want);
        assert_eq!(p.template(&f).unwrap().unwrap().func, "vfs_read");
    }

    fn loading(target: Target, compiled: &[usize]) -> LoadConfig {
        LoadConfig {
            target,
            max_keys: None,
            max_stacks: None,
            ringbuf_bytes: None,
            verbose: false,
            compiled: compiled.to_vec(),
        }
    }

    #[test]
    fn programs_without_multi_links() {
        let f = Features::assumed(&[], Err("no".into()), Ok(()), false, false);
        let plan = plan_of(
            vec![
                uprobe("work", 0x10),
                sched_wakeup(),
                kfunc("vfs_read", KfuncKind::Kprobe, Some(1), true),
                kfunc("vfs_write", KfuncKind::Kprobe, None, true),
            ],
            &f,
        );
        let p = Programs::for_plan(&plan, &loading(Target::All, &[]), &f);
        let want = Programs {
            tp: true,
            uprobe: true,
            kprobe: true,
            ..Default::default()
        };
        assert_eq!(p, want);
        // The tracepoint's probe compiled: its generic program is left out.
        let p = Programs::for_plan(&plan, &loading(Target::All, &[1]), &f);
        assert_eq!(p, Programs { tp: false, ..want });
        assert_eq!(p.template(&f).unwrap(), None);
        // Used fentry on a kernel that refuses it (the plan came from elsewhere).
        let fentry = Programs {
            fexit: true,
            ..Default::default()
        };
        let e = fentry.template(&f).unwrap_err();
        assert_eq!(e.to_string(), "fentry is not available: no");
    }

    #[test]
    fn skipped_kernel_functions_load_nothing() {
        let f = Features::assumed(
            &[],
            Ok(Template {
                func: "vfs_read".into(),
                btf_id: 1,
            }),
            Err("no".into()),
            false,
            false,
        );
        let plan = plan_of(vec![kfunc("f", KfuncKind::Fentry, None, true)], &f);
        assert!(matches!(&plan.probes[0].path, Path::Kfunc(k) if k.unavailable.is_some()));
        assert_eq!(
            Programs::for_plan(&plan, &loading(Target::Pid(1), &[]), &f),
            Programs::default()
        );
    }

    #[test]
    fn failed_kernel_functions_fall_back_once() {
        let plan = plan_of(
            vec![
                kfunc("vfs_read", KfuncKind::Kprobe, Some(1), true),
                kfunc("vfs_write", KfuncKind::Kprobe, None, true),
            ],
            &features(),
        );
        let failed = || {
            vec![
                (0, Mech::Fentry, "EPERM".to_string()),
                (1, Mech::KprobeMulti, "ENOENT".to_string()),
            ]
        };
        let mut out = Attached::default();
        // vfs_read has kprobe_multi to fall back on; vfs_write nothing.
        assert_eq!(
            fallbacks(&plan, true, failed(), &mut out),
            [(0, Mech::KprobeMulti)]
        );
        assert_eq!(
            out.notes,
            ["kprobe:vfs_read: fentry with cookie failed (EPERM); trying kprobe_multi with cookies"]
        );
        assert_eq!(
            out.skipped,
            [(
                "kprobe:vfs_write".to_string(),
                "kprobe_multi with cookies: ENOENT".to_string()
            )]
        );
        let mut out = Attached::default();
        assert!(fallbacks(&plan, false, failed(), &mut out).is_empty());
        assert_eq!(out.skipped.len(), 2);
        assert!(out.notes.is_empty());
    }

    #[test]
    fn uprobes_group_by_binary_and_direction() {
        let mut other = uprobe("main", 0x99);
        if let crate::probe::ProbeKind::Uprobe { binary, .. } = &mut other.kind {
            *binary = "/bin/other".into();
        }
        let probes = vec![
            uprobe("a", 0x10),
            sched_switch(),
            other,
            crate::probe::returning(&uprobe("a", 0x10)).unwrap(),
            uprobe("b", 0x20),
        ];
        let plan = plan_of(probes, &features());
        let groups = uprobe_groups(&plan);
        let demo = std::path::Path::new(DEMO);
        assert_eq!(
            groups,
            [
                (demo, false, vec![(0, 0x10), (4, 0x20)]),
                (std::path::Path::new("/bin/other"), false, vec![(2, 0x99)]),
                (demo, true, vec![(3, 0x10)]),
            ]
        );
    }

    #[test]
    fn keys_and_starts_are_header_and_key() {
        let s = config(Action::Count, &["comm", "pid"], None);
        let plan = build(&s, plain(vec![sched_switch()]), &features()).unwrap();
        assert_eq!(start_size(&plan), 8 + 24);
        assert_eq!(ringbuf_bytes(&loading(Target::All, &[])), PAGE);
    }

    fn libbpf_err(errno: i32) -> libbpf_rs::Error {
        libbpf_rs::Error::from(std::io::Error::from_raw_os_error(errno))
    }

    #[test]
    fn refusals_by_errno() {
        assert_eq!(errno(&libbpf_err(ENOTSUPP)), Some(ENOTSUPP));
        assert!(per_function(&libbpf_err(ENOTSUPP)));
        assert!(per_function(&libbpf_err(libc::EINVAL)));
        assert!(!per_function(&libbpf_err(libc::ENOENT)));
        assert!(!per_function(&libbpf_err(libc::EPERM)));
        let again = io_like(&libbpf_err(libc::ENOENT), "x");
        assert_eq!(again.raw_os_error(), Some(libc::ENOENT));
        let why = uprobe_refusal(
            std::path::Path::new(DEMO),
            0x40,
            false,
            &libbpf_err(libc::EINVAL),
        );
        assert_eq!(
            why,
            "the kernel refused a uprobe at file offset 0x40 (EINVAL)"
        );
    }

    #[test]
    fn exhaustion_ends_a_glob() {
        let e = |n| anyhow::Error::from(std::io::Error::from_raw_os_error(n)).context("attaching");
        assert!(exhausted(&e(libc::EMFILE)));
        assert!(exhausted(&e(libc::ENOMEM)));
        assert!(!exhausted(&e(libc::ENOENT)));
    }

    #[test]
    fn detach_all_drops_every_link() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static DROPPED: AtomicUsize = AtomicUsize::new(0);
        struct Link;
        impl Drop for Link {
            fn drop(&mut self) {
                DROPPED.fetch_add(1, Ordering::Relaxed);
            }
        }
        detach_all((0..3).map(|_| Link).collect());
        detach_all((0..100).map(|_| Link).collect());
        assert_eq!(DROPPED.load(Ordering::Relaxed), 103);
    }
}
