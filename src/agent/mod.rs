//! `bpfscope agent`: the profiler and the tracing engine, run continuously.
//!
//! One thread owns every BPF object (libbpf skeletons are not Send): it
//! reads the profiler out every second, the metrics every interval, closes
//! profile windows (kept on disk, pushed, served as /debug/pprof/recent)
//! and builds the profiles HTTP requests ask for. The HTTP server (`http`,
//! hyper on tokio) only reads what this thread published, or hands it a
//! request and waits: no client can hold the kernel side.
//!
//! A reload (SIGHUP) is all or nothing: the new configuration is loaded,
//! its new listener bound, its new metrics and profiler attached beside
//! the running ones; only when all of that worked does it replace what
//! runs. Counters never go back: metrics kept across a reload keep their
//! programs, a metric whose spec changed goes on from its totals, and the
//! sampler's counters carry over from the profiler a reload replaced.

pub mod cgroups;
pub mod config;
mod health;
mod http;
mod metrics;
mod profiles;
mod push;
mod store;

use std::cell::RefCell;
use std::collections::VecDeque;
use std::net::TcpListener;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;

use crate::attach::dispatch::Dispatch;
use crate::attach::features::Features;
use crate::attach::libbpf_log;
use crate::bpfmeta::stats::StatsGuard;
use crate::error::Error;
use crate::profile::continuous::{now_ns, ContinuousConfig, Profiler};
use crate::render::exposition::{Family, Kind, Value};
use cgroups::CgroupNames;
use config::{Config, ProfileConfig};
use health::{ProgTotals, SampleCounts, SampleTotals};
use metrics::MetricRun;
use profiles::Pending;
use push::{PushStats, Pusher, Window};

/// How often the profiler is read out (and the granularity of profiles).
const TICK: Duration = Duration::from_secs(1);
/// Profile requests handed to the BPF thread and not yet taken.
const HANDOVER_QUEUE: usize = 64;
/// How long requests in progress get to finish when the server stops.
const STOP_GRACE: Duration = Duration::from_secs(2);

/// A profile an HTTP request waits for.
pub struct ProfileRequest {
    pub seconds: u64,
    /// When the server received it (`now_ns`): the span starts there, not
    /// when the profiler's loop gets to it (seconds later when the loop is
    /// busy, say on an emulated CPU).
    pub arrived_ns: u64,
    pub sel: Selection,
    pub reply: tokio::sync::oneshot::Sender<Result<Arc<Vec<u8>>, String>>,
}

/// Which samples a profile request wants.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Selection {
    pub pid: Option<u32>,
    /// A process or thread name.
    pub comm: Option<String>,
    /// A cgroup path prefix.
    pub cgroup: Option<String>,
}

/// What the BPF thread publishes for the HTTP server.
pub struct Shared {
    families: Mutex<Arc<Vec<Family>>>,
    recent: Mutex<Option<Arc<Vec<u8>>>>,
    requests: Mutex<Option<SyncSender<ProfileRequest>>>,
    profiling: AtomicBool,
    window_s: AtomicU64,
    max_seconds: AtomicU64,
    http: Arc<http::Stats>,
    push: Arc<PushStats>,
}

impl Shared {
    fn new(requests: SyncSender<ProfileRequest>) -> Shared {
        Shared {
            families: Mutex::default(),
            recent: Mutex::default(),
            requests: Mutex::new(Some(requests)),
            profiling: AtomicBool::new(false),
            window_s: AtomicU64::new(0),
            max_seconds: AtomicU64::new(0),
            http: Arc::default(),
            push: Arc::default(),
        }
    }

    /// What /metrics shows now: the families published last, and the
    /// server's and process's own, fresh.
    fn families_now(&self) -> Vec<Family> {
        let mut fams: Vec<Family> = self
            .families
            .lock()
            .map(|f| f.as_ref().clone())
            .unwrap_or_default();
        fams.extend(health::server_families(&self.http, &self.push));
        fams.extend(health::process_families());
        fams
    }

    fn recent(&self) -> Option<Arc<Vec<u8>>> {
        self.recent.lock().ok().and_then(|r| r.clone())
    }

    fn profiling(&self) -> bool {
        self.profiling.load(Ordering::SeqCst)
    }

    fn max_seconds(&self) -> u64 {
        self.max_seconds.load(Ordering::SeqCst)
    }

    fn window_s(&self) -> u64 {
        self.window_s.load(Ordering::SeqCst)
    }

    fn hand_over(&self, r: ProfileRequest) -> Result<(), TrySendError<ProfileRequest>> {
        match self.requests.lock() {
            Ok(g) => match g.as_ref() {
                Some(tx) => tx.try_send(r),
                None => Err(TrySendError::Disconnected(r)),
            },
            Err(_) => Err(TrySendError::Disconnected(r)),
        }
    }
}

/// Runs the agent until SIGINT or SIGTERM; `reload` gives the
/// configuration anew on SIGHUP.
pub fn run(cfg: Config, mut reload: impl FnMut() -> Result<Config, Error>) -> Result<()> {
    libbpf_log::init(false);
    bpfscope_sys::require_privileges().map_err(Error::from)?;
    let features = Features::detect();
    let (req_tx, req_rx) = sync_channel(HANDOVER_QUEUE);
    let shared = Arc::new(Shared::new(req_tx));
    // Bound before anything is loaded: a taken port is a usage error, and
    // nothing is left attached.
    let listener = bind(&cfg)?;
    let mut agent = Agent::start(cfg, &features, shared, listener)?;
    let result = agent.serve(&mut reload, &features, &req_rx);
    agent.finish(&req_rx);
    result
}

fn bind(cfg: &Config) -> Result<TcpListener, Error> {
    TcpListener::bind(cfg.listen).map_err(|e| {
        crate::usage!(
            "listen address {}: {e}; choose a free address with --listen or listen in the config",
            cfg.listen
        )
    })
}

fn sampler(p: &ProfileConfig) -> ContinuousConfig {
    ContinuousConfig {
        hz: p.hz,
        max_depth: p.max_depth,
        unwind_mib: p.unwind_mib,
        max_stacks: p.max_stacks,
    }
}

struct Agent {
    cfg: Config,
    shared: Arc<Shared>,
    server: Option<http::Server>,
    profiler: Option<Profiler>,
    metrics: Vec<MetricRun>,
    /// The raw_tp on sys_enter/sys_exit every metric's syscalls go through.
    dispatch: Option<Rc<RefCell<Dispatch>>>,
    pusher: Option<Pusher>,
    cgroups: CgroupNames,
    pending: VecDeque<Pending>,
    window_start_ns: u64,
    next_tick: Instant,
    next_metrics: Instant,
    next_window: Instant,
    windows: u64,
    last_window_s: f64,
    reloads_ok: u64,
    reloads_failed: u64,
    samples: SampleTotals,
    progs: ProgTotals,
    /// BPF run-time statistics, on while bpfscope_bpf_prog_* is exported.
    stats: Option<StatsGuard>,
    host: String,
}

/// A reload's new parts, loaded and attached beside the running ones.
struct Staged {
    cfg: Config,
    listener: Option<TcpListener>,
    metrics: Vec<MetricRun>,
    profiler: Option<Option<Profiler>>,
}

impl Agent {
    fn start(
        cfg: Config,
        features: &Features,
        shared: Arc<Shared>,
        listener: TcpListener,
    ) -> Result<Agent> {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        // BPF run-time statistics for bpfscope_bpf_prog_* (what `bpf top`
        // shows); restored when the agent ends. They cost every BPF program
        // on the host two clock reads a run, so bpf_prog_series = 0 leaves
        // them off.
        let stats_guard = stats_for(cfg.bpf_prog_series);
        let dispatch = match Dispatch::load() {
            Ok(d) => Some(Rc::new(RefCell::new(d))),
            Err(e) => {
                eprintln!("bpfscope: syscall metrics use tracepoints of their own: {e:#}");
                None
            }
        };
        let mut a = Agent {
            shared,
            server: None,
            profiler: None,
            metrics: Vec::new(),
            dispatch,
            pusher: None,
            cgroups: CgroupNames::new(Duration::from_secs(1)),
            pending: VecDeque::new(),
            window_start_ns: now_ns(),
            next_tick: Instant::now() + TICK,
            next_metrics: Instant::now() + cfg.metrics_interval,
            next_window: Instant::now() + cfg.profile.window,
            windows: 0,
            last_window_s: 0.0,
            reloads_ok: 0,
            reloads_failed: 0,
            samples: SampleTotals::default(),
            progs: ProgTotals::default(),
            stats: stats_guard,
            host,
            cfg,
        };
        a.apply_limits();
        let mut taken = Vec::new();
        for def in a.cfg.metrics.clone() {
            let m = MetricRun::start(def, features, a.dispatch.as_ref(), &taken)?;
            taken.extend(m.slots());
            a.metrics.push(m);
        }
        for m in &mut a.metrics {
            m.install()?;
        }
        if a.cfg.profile.hz > 0 {
            a.profiler = Some(Profiler::start(&sampler(&a.cfg.profile))?);
            a.shared.profiling.store(true, Ordering::SeqCst);
        }
        a.window_start_ns = now_ns();
        a.pusher = a
            .cfg
            .push
            .clone()
            .map(|p| Pusher::start(p, a.cfg.profile.hz, a.host.clone(), a.shared.push.clone()));
        a.publish();
        a.server = Some(http::Server::start(
            listener,
            &a.cfg.http,
            a.cfg.token.clone(),
            a.shared.clone(),
        )?);
        let probes: usize = a.metrics.iter().map(|m| m.probes).sum();
        eprintln!(
            "Listening on http://{} ({} metric{} on {probes} probes, profiling {})",
            a.server.as_ref().map_or(a.cfg.listen, |s| s.local_addr()),
            a.metrics.len(),
            if a.metrics.len() == 1 { "" } else { "s" },
            if a.cfg.profile.hz > 0 {
                format!(
                    "at {} Hz in {} s windows",
                    a.cfg.profile.hz,
                    a.cfg.profile.window.as_secs()
                )
            } else {
                "off".into()
            }
        );
        Ok(a)
    }

    fn apply_limits(&self) {
        self.shared
            .window_s
            .store(self.cfg.profile.window.as_secs(), Ordering::SeqCst);
        self.shared
            .max_seconds
            .store(self.cfg.http.max_seconds, Ordering::SeqCst);
    }

    /// The BPF thread's loop, until SIGINT or SIGTERM.
    fn serve(
        &mut self,
        reload: &mut impl FnMut() -> Result<Config, Error>,
        features: &Features,
        requests: &Receiver<ProfileRequest>,
    ) -> Result<()> {
        loop {
            if bpfscope_sys::signals::interrupted() {
                return Ok(());
            }
            if bpfscope_sys::signals::take_reload() {
                self.reload(reload, features, requests);
            }
            let now = Instant::now();
            let due = self
                .next_tick
                .min(self.next_metrics)
                .saturating_duration_since(now)
                .min(Duration::from_millis(100));
            match &mut self.profiler {
                Some(p) => {
                    crate::profile::wait_readable(&[p.wait_fd()], Some(due));
                    if let Err(e) = p.pump() {
                        eprintln!("bpfscope: process notifications: {e:#}");
                    }
                }
                None => std::thread::sleep(due),
            }
            self.take_requests(requests);
            self.drop_abandoned();
            let now = Instant::now();
            if now >= self.next_tick {
                self.next_tick += TICK;
                if self.next_tick < now {
                    self.next_tick = now + TICK;
                }
                if let Some(p) = &mut self.profiler {
                    if let Err(e) = p.tick() {
                        eprintln!("bpfscope: profile readout: {e:#}");
                    }
                }
                self.answer_ready(false);
                self.forget_old_ticks();
            }
            if now >= self.next_metrics {
                self.next_metrics = now + self.cfg.metrics_interval;
                self.read_metrics();
                self.publish();
            }
            if now >= self.next_window {
                self.next_window = now + self.cfg.profile.window;
                // Catch-up ticks after a late loop (an emulated CPU, a
                // stalled host) can leave less than a second read out since
                // the last window: pushed alone, whole seconds would give it
                // the same start and end. It joins the next window instead.
                let read = self.profiler.as_ref().map(|p| p.read_until_ns());
                if read.is_none_or(|r| r.saturating_sub(self.window_start_ns) >= 1_000_000_000) {
                    self.close_window();
                    // The window's counts are news too (not only every metrics interval).
                    self.publish();
                }
            }
        }
    }

    /// Ticks are kept from the window's start or the oldest request's,
    /// whichever is earlier.
    fn forget_old_ticks(&mut self) {
        let oldest = self
            .pending
            .iter()
            .map(|r| r.from_ns)
            .min()
            .unwrap_or(u64::MAX)
            .min(self.window_start_ns);
        if let Some(p) = &mut self.profiler {
            p.forget_before(oldest);
        }
    }

    /// Moves the requests the server handed over into `pending`, each
    /// starting where the tick it arrived in started: requests that arrive
    /// in the same second for the same span and selection get one profile.
    fn take_requests(&mut self, requests: &Receiver<ProfileRequest>) {
        while let Ok(r) = requests.try_recv() {
            match &self.profiler {
                None => {
                    let _ = r
                        .reply
                        .send(Err("profiling is off (profile hz is 0)".into()));
                }
                Some(p) => self.pending.push_back(Pending {
                    from_ns: p.tick_start_at(r.arrived_ns),
                    req: r,
                }),
            }
        }
    }

    /// Forgets the requests whose client went away: no work is done for them.
    fn drop_abandoned(&mut self) {
        let before = self.pending.len();
        self.pending.retain(|r| !r.req.reply.is_closed());
        let gone = (before - self.pending.len()) as u64;
        if gone > 0 {
            self.shared
                .http
                .cancelled
                .fetch_add(gone, Ordering::Relaxed);
            self.forget_old_ticks();
        }
    }

    /// Answers the requests whose time has been read out (or all, at exit).
    fn answer_ready(&mut self, all: bool) {
        let Some(p) = &mut self.profiler else {
            return;
        };
        let done = p.read_until_ns();
        let (ready, still): (Vec<Pending>, Vec<Pending>) = self
            .pending
            .drain(..)
            .partition(|r| all || r.end_ns() <= done);
        self.pending = still.into();
        profiles::answer(p, ready, done, &mut self.cgroups);
    }

    fn read_metrics(&mut self) {
        if self.metrics.is_empty() {
            return;
        }
        for m in &mut self.metrics {
            m.flip();
        }
        std::thread::sleep(crate::collect::EPOCH_GRACE);
        for m in &mut self.metrics {
            if let Err(e) = m.collect() {
                eprintln!("bpfscope: metric {}: {e:#}", m.def.name);
            }
        }
    }

    /// Ends the current window: symbolized, kept, pushed, and served as
    /// /debug/pprof/recent. A window without samples is neither kept nor
    /// pushed.
    fn close_window(&mut self) {
        let Some(p) = &mut self.profiler else {
            return;
        };
        let t0 = Instant::now();
        let end = p.read_until_ns();
        let mut resolver = profiles::resolver();
        let built = profiles::build(
            p,
            self.window_start_ns,
            end,
            &Selection::default(),
            &mut self.cgroups,
            &mut resolver,
        );
        drop(resolver);
        crate::profile::continuous::give_back_memory();
        self.window_start_ns = end;
        if let Err(e) = p.reclaim() {
            eprintln!("bpfscope: freeing kernel stacks: {e:#}");
        }
        self.cgroups.forget_unused(self.cfg.profile.window * 2);
        let b = match built {
            Ok(b) => b,
            Err(e) => {
                eprintln!("bpfscope: window: {e:#}");
                return;
            }
        };
        self.windows += 1;
        self.last_window_s = t0.elapsed().as_secs_f64();
        if b.samples == 0 {
            return;
        }
        if let Some(s) = &self.cfg.storage {
            if let Err(e) = store::keep(s, b.start_unix_ns, b.end_unix_ns, &b.bytes) {
                eprintln!("bpfscope: {e:#}");
            }
        }
        if let Some(pu) = &self.pusher {
            pu.offer(
                Window {
                    pprof: b.bytes.clone(),
                    start_ns: b.start_unix_ns,
                    end_ns: b.end_unix_ns,
                },
                &self.shared.push,
            );
        }
        if let Ok(mut r) = self.shared.recent.lock() {
            *r = Some(b.bytes);
        }
    }

    /// Reads the sampler's counters into their running totals.
    fn read_samples(&mut self) {
        if let Some(p) = &self.profiler {
            // Counted at the last read-out: errors reading them were said
            // there.
            self.samples.update(SampleCounts::of(p, p.counted()));
        }
    }

    /// Families of the metrics and of the agent's own state.
    fn publish(&mut self) {
        let mut fams: Vec<Family> = Vec::new();
        for m in &self.metrics {
            fams.extend(m.families(&mut self.cgroups));
        }
        let label = |m: &MetricRun| vec![("metric".to_string(), m.def.name.clone())];
        let per_metric = |name: &str, help: &str, f: &dyn Fn(&MetricRun) -> u64| {
            Family::new(
                name,
                help,
                Kind::Counter,
                self.metrics
                    .iter()
                    .map(|m| (label(m), Value::Count(f(m))))
                    .collect(),
            )
        };
        fams.push(per_metric(
            "bpfscope_agent_metric_dropped_events_total",
            "Events not counted because their metric had reached its cap on label sets \
             (max_series)",
            &|m| m.dropped_events,
        ));
        fams.push(per_metric(
            "bpfscope_agent_metric_series_expired_total",
            "Label sets dropped because their count had not changed for \
             metrics.series_expire_seconds",
            &|m| m.expired_series,
        ));
        fams.push(per_metric(
            "bpfscope_agent_metric_unmatched_ends_total",
            "Latency ends without a recorded start: the start came before the agent, or \
             was filtered out (not a loss)",
            &|m| m.lost().unmatched,
        ));
        let mut lost = Vec::new();
        for m in &self.metrics {
            let l = m.lost();
            // (Metrics have no ring buffer and no stack keys.)
            for (why, n) in [("keys", l.keys), ("nested", l.nested), ("missed", l.missed)] {
                let mut ls = label(m);
                ls.push(("reason".into(), why.into()));
                lost.push((ls, Value::Count(n)));
            }
        }
        fams.push(Family::new(
            "bpfscope_agent_metric_lost_events_total",
            "Events a metric's programs could not count, by reason: its map full (keys), \
             a run skipped by the kernel (nested, missed)",
            Kind::Counter,
            lost,
        ));
        self.read_samples();
        if self.profiler.is_some() || self.samples.get() != SampleCounts::default() {
            fams.extend(health::sample_families(&self.samples.get()));
        }
        if let Some(p) = &self.profiler {
            fams.push(health::gauge(
                "bpfscope_agent_stacks_cached",
                "Unique stacks held in user space",
                p.cached_stacks() as f64,
            ));
            fams.push(health::gauge(
                "bpfscope_agent_processes_tracked",
                "Processes whose mappings the agent keeps",
                p.tracked_processes() as f64,
            ));
            fams.push(health::gauge(
                "bpfscope_agent_unwind_table_bytes",
                "Kernel memory used by unwind tables",
                p.table_bytes() as f64,
            ));
            fams.push(health::gauge(
                "bpfscope_agent_window_build_seconds",
                "Time the last window took to symbolize and encode",
                self.last_window_s,
            ));
        }
        fams.push(health::counter(
            "bpfscope_agent_windows_total",
            "Profile windows closed",
            self.windows,
        ));
        fams.push(Family::new(
            "bpfscope_agent_reloads_total",
            "Configuration reloads (SIGHUP), by result: failed ones changed nothing",
            Kind::Counter,
            vec![
                (
                    vec![("result".into(), "ok".into())],
                    Value::Count(self.reloads_ok),
                ),
                (
                    vec![("result".into(), "failed".into())],
                    Value::Count(self.reloads_failed),
                ),
            ],
        ));
        if self.cfg.bpf_prog_series > 0 {
            self.progs.update(self.cfg.bpf_prog_series);
        }
        fams.extend(self.progs.families());
        fams.push(health::counter(
            "bpfscope_agent_bpf_prog_untracked_total",
            "Readings of BPF programs left out of bpfscope_bpf_prog_* because \
             metrics.bpf_prog_series label sets were taken",
            self.progs.untracked,
        ));
        if let Ok(mut f) = self.shared.families.lock() {
            *f = Arc::new(fams);
        }
    }

    /// SIGHUP: reads the configuration again and applies it all or not at
    /// all. A bad file, a metric that does not resolve or attach, a port
    /// taken or a profiler that does not load: nothing changes, the reason
    /// is said and counted.
    fn reload(
        &mut self,
        load: &mut impl FnMut() -> Result<Config, Error>,
        features: &Features,
        requests: &Receiver<ProfileRequest>,
    ) {
        let staged = load()
            .map_err(anyhow::Error::from)
            .and_then(|cfg| self.stage(cfg, features));
        match staged {
            Ok(s) => {
                let changes = self.commit(s, requests);
                self.reloads_ok += 1;
                eprintln!(
                    "bpfscope: reloaded: {}",
                    if changes.is_empty() {
                        "nothing changed".to_string()
                    } else {
                        changes.join(", ")
                    }
                );
            }
            Err(e) => {
                self.reloads_failed += 1;
                eprintln!("bpfscope: reload refused, nothing changed: {e:#}");
            }
        }
        self.publish();
    }

    /// Loads and attaches what the new configuration needs that does not
    /// run yet, beside what runs; on any failure what was started is
    /// dropped (detached) and nothing else was touched.
    fn stage(&self, cfg: Config, features: &Features) -> Result<Staged> {
        let listener = if cfg.listen != self.cfg.listen {
            Some(bind(&cfg)?)
        } else {
            None
        };
        // Syscall slots stay with the metrics kept; those of metrics that
        // go or change are free for the new ones.
        let leaving: Vec<_> = self
            .metrics
            .iter()
            .filter(|m| !cfg.metrics.iter().any(|d| m.def.same_run(d)))
            .filter_map(MetricRun::owner)
            .collect();
        let mut taken = self
            .dispatch
            .as_ref()
            .map(|d| d.borrow().taken(&leaving))
            .unwrap_or_default();
        let mut metrics = Vec::new();
        for d in &cfg.metrics {
            if self.metrics.iter().any(|m| m.def.same_run(d)) {
                continue;
            }
            let m = MetricRun::start(d.clone(), features, self.dispatch.as_ref(), &taken)?;
            taken.extend(m.slots());
            metrics.push(m);
        }
        let profiler = if sampler(&cfg.profile) != sampler(&self.cfg.profile) {
            Some(if cfg.profile.hz > 0 {
                Some(Profiler::start(&sampler(&cfg.profile))?)
            } else {
                None
            })
        } else {
            None
        };
        Ok(Staged {
            cfg,
            listener,
            metrics,
            profiler,
        })
    }

    /// Puts a staged configuration in place; says what changed.
    fn commit(&mut self, s: Staged, requests: &Receiver<ProfileRequest>) -> Vec<String> {
        let mut changes = Vec::new();
        let new = s.cfg;
        // Metrics: what is kept keeps its programs and totals; the new runs
        // take their syscalls over (each slot at once, from whichever run
        // had it), then the runs that go are read out a last time, and a
        // metric whose spec changed goes on from the old run's totals.
        let mut started = s.metrics;
        for m in &mut started {
            if let Err(e) = m.install() {
                eprintln!("bpfscope: reload: {e:#}");
            }
        }
        self.read_metrics();
        let mut old: Vec<MetricRun> = std::mem::take(&mut self.metrics);
        for d in &new.metrics {
            if let Some(i) = old.iter().position(|m| m.def.same_run(d)) {
                let mut m = old.remove(i);
                m.def.max_series = d.max_series;
                m.def.expire = d.expire;
                m.def.help = d.help.clone();
                self.metrics.push(m);
            } else if let Some(i) = started.iter().position(|m| m.def.same_run(d)) {
                let mut m = started.remove(i);
                if let Some(prev) = old.iter().find(|o| o.def.name == d.name) {
                    m.continue_from(prev);
                    changes.push(format!("~{}", d.name));
                } else {
                    changes.push(format!("+{}", d.name));
                }
                self.metrics.push(m);
            }
        }
        for mut m in old {
            if !new.metrics.iter().any(|d| d.name == m.def.name) {
                changes.push(format!("-{}", m.def.name));
            }
            m.detach();
        }
        // The profiler: replaced only if how it samples changed.
        if let Some(next) = s.profiler {
            // The second in progress is read out before the programs go,
            // and requests waiting get what there is.
            if let Some(p) = &mut self.profiler {
                if let Err(e) = p.tick() {
                    eprintln!("bpfscope: profile readout: {e:#}");
                }
            }
            self.take_requests(requests);
            self.answer_ready(true);
            self.close_window();
            self.read_samples();
            if let Some(mut p) = self.profiler.take() {
                p.stop();
                self.samples.retire();
            }
            self.profiler = next;
            self.shared
                .profiling
                .store(self.profiler.is_some(), Ordering::SeqCst);
            self.window_start_ns = now_ns();
            self.next_window = Instant::now() + new.profile.window;
            changes.push(format!("profile {} Hz", new.profile.hz));
        } else if new.profile.window != self.cfg.profile.window {
            self.next_window = Instant::now() + new.profile.window;
            changes.push(format!("window {} s", new.profile.window.as_secs()));
        }
        // The pushed sample rate is the profiler's.
        let rate_changed = new.profile.hz != self.cfg.profile.hz && new.push.is_some();
        if new.push != self.cfg.push || rate_changed {
            if let Some(p) = self.pusher.take() {
                p.stop(Duration::from_secs(1));
            }
            self.pusher = new.push.clone().map(|p| {
                Pusher::start(
                    p,
                    new.profile.hz,
                    self.host.clone(),
                    self.shared.push.clone(),
                )
            });
            changes.push("push".into());
        }
        if new.storage != self.cfg.storage {
            changes.push("storage".into());
        }
        let server_changed =
            s.listener.is_some() || new.token != self.cfg.token || new.http != self.cfg.http;
        let metrics_interval = new.metrics_interval;
        match (new.bpf_prog_series > 0, self.stats.is_some()) {
            (true, false) => self.stats = stats_for(new.bpf_prog_series),
            (false, true) => self.stats = None,
            _ => {}
        }
        self.cfg = new;
        self.next_metrics = self.next_metrics.min(Instant::now() + metrics_interval);
        self.apply_limits();
        if server_changed {
            // Requests waiting on a profile get what there is now,
            // instead of waiting on a server that stops.
            self.take_requests(requests);
            self.answer_ready(true);
            let old = self.server.take().and_then(|srv| srv.stop(STOP_GRACE));
            // The new address was bound while staging; the same address
            // keeps its socket.
            let listener = match s.listener.or(old) {
                Some(l) => Ok(l),
                None => bind(&self.cfg).map_err(anyhow::Error::from),
            };
            match listener.and_then(|l| {
                http::Server::start(
                    l,
                    &self.cfg.http,
                    self.cfg.token.clone(),
                    self.shared.clone(),
                )
                .map_err(anyhow::Error::from)
            }) {
                Ok(srv) => self.server = Some(srv),
                Err(e) => eprintln!("bpfscope: reload: HTTP server: {e:#}"),
            }
            changes.push(format!("http {}", self.cfg.listen));
        }
        changes
    }

    /// SIGTERM or SIGINT: the current window is written and pushed, the
    /// waiting requests are answered, everything is detached.
    fn finish(&mut self, requests: &Receiver<ProfileRequest>) {
        // No request can be handed over from now on: every one already
        // handed over is answered below, so no client waits on a reply
        // that will not come.
        if let Ok(mut r) = self.shared.requests.lock() {
            *r = None;
        }
        if let Some(p) = &mut self.profiler {
            if let Err(e) = p.tick() {
                eprintln!("bpfscope: last readout: {e:#}");
            }
        }
        self.take_requests(requests);
        self.answer_ready(true);
        self.close_window();
        if let Some(s) = self.server.take() {
            let _ = s.stop(STOP_GRACE);
        }
        if let Some(p) = self.pusher.take() {
            p.stop(Duration::from_secs(3));
        }
        if let Some(p) = &mut self.profiler {
            p.stop();
        }
        for m in &mut self.metrics {
            m.detach();
        }
        let sent = self.shared.push.sent.load(Ordering::Relaxed);
        let dropped = self.shared.push.dropped.load(Ordering::Relaxed);
        eprintln!(
            "bpfscope: agent stopped: {} windows{}",
            self.windows,
            if self.cfg.push.is_some() || sent + dropped > 0 {
                format!(", {sent} pushed, {dropped} dropped")
            } else {
                String::new()
            }
        );
    }
}

/// BPF run-time statistics while `series` > 0 (restored when dropped).
fn stats_for(series: usize) -> Option<StatsGuard> {
    if series == 0 {
        return None;
    }
    match StatsGuard::enable() {
        Ok(g) => Some(g),
        Err(e) => {
            eprintln!("bpfscope: BPF program run times will read 0: {e:#}");
            None
        }
    }
}
