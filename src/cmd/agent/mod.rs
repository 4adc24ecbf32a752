//! `bpfscope agent`: the profiler and the tracing engine, run continuously.
//!
//! One thread owns every BPF object (libbpf skeletons are not Send): it
//! reads the profiler out every second, the metrics every interval, closes
//! profile windows (kept on disk, pushed, served as /debug/pprof/recent)
//! and builds the profiles HTTP requests ask for. The HTTP workers only
//! read what this thread published, or hand it a request and wait: a slow
//! scraper holds one worker, never the kernel side.

pub mod http;
pub mod labels;
pub mod metrics;
pub mod profiler;
pub mod push;
pub mod store;

use std::collections::VecDeque;
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use prometheus_client::metrics::MetricType;

use crate::attach::features::Features;
use crate::attach::libbpf_log;
use crate::bpfmeta::stats::{self, StatsGuard};
use crate::cli::agent::{self as config, AgentArgs, Config};
use crate::usage;
use http::{Handler, Request, Response};
use labels::CgroupNames;
use metrics::{Family, MetricRun, Value};
use profiler::{now_ns, Profiler, Selection};
use push::{PushStats, Pusher, Window};

/// How often the profiler is read out (and the granularity of profiles).
const TICK: Duration = Duration::from_secs(1);
/// Profile requests waiting for the BPF thread at most.
const PENDING_REQUESTS: usize = 16;

/// A profile an HTTP worker waits for.
struct ProfileRequest {
    from_ns: u64,
    seconds: u64,
    sel: Selection,
    reply: SyncSender<Result<Arc<Vec<u8>>, String>>,
}

/// What the BPF thread publishes for the HTTP workers.
#[derive(Default)]
struct Shared {
    families: Mutex<Arc<Vec<Family>>>,
    recent: Mutex<Option<Arc<Vec<u8>>>>,
    requests: Mutex<Option<SyncSender<ProfileRequest>>>,
    profiling: AtomicBool,
    window_s: AtomicU64,
    max_seconds: AtomicU64,
    http: Arc<http::Stats>,
    push: Arc<PushStats>,
    stopping: AtomicBool,
}

pub fn run(args: AgentArgs) -> Result<()> {
    libbpf_log::init(false);
    // Bad input is said as such, with or without privileges.
    let cfg = config::load(&args)?;
    bpfscope_sys::require_privileges().map_err(crate::error::Error::from)?;
    let features = Features::detect();
    let shared = Arc::new(Shared::default());
    let (req_tx, req_rx) = sync_channel(PENDING_REQUESTS);
    if let Ok(mut r) = shared.requests.lock() {
        *r = Some(req_tx);
    }
    // Bound before anything is loaded: a taken port is a usage error, and
    // nothing is left attached.
    let listener = bind(&cfg)?;
    let mut agent = Agent::start(cfg, &features, shared.clone(), listener)?;
    let result = agent.serve(&args, &features, &req_rx);
    agent.finish(&req_rx);
    result
}

fn bind(cfg: &Config) -> Result<TcpListener> {
    TcpListener::bind(cfg.listen).map_err(|e| {
        usage!(
            "listen address {}: {e}; choose a free address with --listen or listen in the config",
            cfg.listen
        )
        .into()
    })
}

struct Agent {
    cfg: Config,
    shared: Arc<Shared>,
    server: Option<http::Server>,
    profiler: Option<Profiler>,
    metrics: Vec<MetricRun>,
    pusher: Option<Pusher>,
    cgroups: CgroupNames,
    pending: VecDeque<ProfileRequest>,
    window_start_ns: u64,
    next_tick: Instant,
    next_metrics: Instant,
    next_window: Instant,
    windows: u64,
    last_window_s: f64,
    reloads_ok: u64,
    reloads_failed: u64,
    _stats: Option<StatsGuard>,
    host: String,
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
        // shows); restored when the agent ends.
        let stats_guard = match StatsGuard::enable() {
            Ok(g) => Some(g),
            Err(e) => {
                eprintln!("bpfscope: BPF program run times will read 0: {e:#}");
                None
            }
        };
        let mut a = Agent {
            shared,
            server: None,
            profiler: None,
            metrics: Vec::new(),
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
            _stats: stats_guard,
            host,
            cfg,
        };
        a.apply_limits();
        for def in a.cfg.metrics.clone() {
            a.metrics.push(MetricRun::start(def, features)?);
        }
        if a.cfg.profile.hz > 0 {
            a.profiler = Some(Profiler::start(&a.cfg.profile)?);
            a.shared.profiling.store(true, Ordering::SeqCst);
        }
        a.window_start_ns = now_ns();
        a.pusher = a
            .cfg
            .push
            .clone()
            .map(|p| Pusher::start(p, a.cfg.profile.hz, a.host.clone(), a.shared.push.clone()));
        a.publish();
        a.server = Some(start_server(&a.cfg, listener, &a.shared)?);
        eprintln!(
            "Listening on http://{} ({} metric{}, profiling {})",
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
        args: &AgentArgs,
        features: &Features,
        requests: &Receiver<ProfileRequest>,
    ) -> Result<()> {
        loop {
            if bpfscope_sys::signals::interrupted() {
                return Ok(());
            }
            if bpfscope_sys::signals::take_reload() {
                self.reload(args, features, requests);
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
                // Ticks are kept from the window's start or the oldest
                // request's, whichever is earlier.
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
            if now >= self.next_metrics {
                self.next_metrics = now + self.cfg.metrics_interval;
                self.read_metrics();
                self.publish();
            }
            if now >= self.next_window {
                self.next_window = now + self.cfg.profile.window;
                self.close_window();
                // The window's counts are news too (not only every metrics interval).
                self.publish();
            }
        }
    }

    /// Moves the requests the workers handed over into `pending`.
    fn take_requests(&mut self, requests: &Receiver<ProfileRequest>) {
        while let Ok(r) = requests.try_recv() {
            if self.profiler.is_none() {
                let _ = r
                    .reply
                    .try_send(Err("profiling is off (profile hz is 0)".into()));
            } else {
                self.pending.push_back(r);
            }
        }
    }

    /// Answers the requests whose time has been read out (or all, at exit).
    fn answer_ready(&mut self, all: bool) {
        let Some(p) = &mut self.profiler else {
            return;
        };
        let done = p.read_until_ns();
        let mut still = VecDeque::new();
        while let Some(r) = self.pending.pop_front() {
            let end = r.from_ns + r.seconds * 1_000_000_000;
            if done < end && !all {
                still.push_back(r);
                continue;
            }
            let reply = p
                .build(r.from_ns, end.min(done), &r.sel, &mut self.cgroups)
                .map(|b| Arc::new(b.pprof))
                .map_err(|e| format!("{e:#}"));
            profiler::give_back_memory();
            // The worker may have given up: nothing to do then.
            let _ = r.reply.try_send(reply);
        }
        self.pending = still;
    }

    fn read_metrics(&mut self) {
        if self.metrics.is_empty() {
            return;
        }
        for m in &mut self.metrics {
            m.flip();
        }
        std::thread::sleep(crate::cmd::trace::EPOCH_GRACE);
        for m in &mut self.metrics {
            if let Err(e) = m.collect() {
                eprintln!("bpfscope: metric {}: {e:#}", m.def.name);
            }
        }
    }

    /// Ends the current window: symbolized, kept, pushed, and served as
    /// /debug/pprof/recent.
    fn close_window(&mut self) {
        let Some(p) = &mut self.profiler else {
            return;
        };
        let t0 = Instant::now();
        let end = p.read_until_ns();
        let built = p.build(
            self.window_start_ns,
            end,
            &Selection::default(),
            &mut self.cgroups,
        );
        profiler::give_back_memory();
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
        let pprof = Arc::new(b.pprof);
        if let Some(s) = &self.cfg.storage {
            if let Err(e) = store::keep(s, b.start_unix_ns, b.end_unix_ns, &pprof) {
                eprintln!("bpfscope: {e:#}");
            }
        }
        if let Some(pu) = &self.pusher {
            pu.offer(
                Window {
                    pprof: pprof.clone(),
                    start_ns: b.start_unix_ns,
                    end_ns: b.end_unix_ns,
                },
                &self.shared.push,
            );
        }
        if let Ok(mut r) = self.shared.recent.lock() {
            *r = Some(pprof);
        }
        self.windows += 1;
        self.last_window_s = t0.elapsed().as_secs_f64();
    }

    /// Families of the metrics and of the agent's own state.
    fn publish(&mut self) {
        let mut fams: Vec<Family> = Vec::new();
        for m in &self.metrics {
            fams.extend(m.families(&mut self.cgroups));
        }
        let label = |m: &MetricRun| vec![("metric".to_string(), m.def.name.clone())];
        fams.push(Family::new(
            "bpfscope_dropped_series_total",
            "Events not counted because their metric had reached its cap on label sets (metrics.max_series)",
            MetricType::Counter,
            self.metrics
                .iter()
                .map(|m| (label(m), Value::Counter(m.dropped_events as f64)))
                .collect(),
        ));
        fams.push(Family::new(
            "bpfscope_metric_series_expired_total",
            "Label sets dropped because their count had not changed for metrics.series_expire_seconds",
            MetricType::Counter,
            self.metrics
                .iter()
                .map(|m| (label(m), Value::Counter(m.expired_series as f64)))
                .collect(),
        ));
        let mut lost = Vec::new();
        for m in &self.metrics {
            let l = m.lost;
            for (why, n) in [
                ("ringbuf", l.events),
                ("keys", l.keys),
                ("stacks", l.stacks),
                ("unmatched", l.unmatched),
                ("nested", l.nested),
                ("missed", l.missed),
            ] {
                let mut ls = label(m);
                ls.push(("reason".into(), why.into()));
                lost.push((ls, Value::Counter(n as f64)));
            }
        }
        fams.push(Family::new(
            "bpfscope_metric_lost_events_total",
            "Events a metric's programs could not count, by reason",
            MetricType::Counter,
            lost,
        ));
        if let Some(p) = &self.profiler {
            let c = |name: &str, help: &str, v: u64| {
                Family::one(
                    name,
                    help,
                    MetricType::Counter,
                    vec![],
                    Value::Counter(v as f64),
                )
            };
            let g = |name: &str, help: &str, v: f64| {
                Family::one(name, help, MetricType::Gauge, vec![], Value::Gauge(v))
            };
            fams.push(c(
                "bpfscope_agent_samples_total",
                "Samples read into profiles",
                p.samples,
            ));
            if let Ok(l) = p.lost() {
                fams.push(c(
                    "bpfscope_agent_samples_taken_total",
                    "Samples the perf events took (their own count)",
                    l.taken,
                ));
                fams.push(c(
                    "bpfscope_agent_sampler_runs_total",
                    "Runs of the sampling program (idle CPUs and bpfscope itself included)",
                    l.sampler_runs,
                ));
                // Taken = in profiles + idle + the agent's own + lost: every
                // sample has a place.
                fams.push(c(
                    "bpfscope_agent_samples_idle_total",
                    "Samples of idle CPUs (not in profiles)",
                    l.idle,
                ));
                fams.push(c(
                    "bpfscope_agent_samples_own_total",
                    "Samples of the agent itself (not in profiles)",
                    l.other,
                ));
                fams.push(c(
                    "bpfscope_agent_samples_not_run_total",
                    "Samples the perf events counted whose program did not run: an idle CPU without its tick, another BPF program running on that CPU (the kernel's recursion guard), or a late timer",
                    l.taken.saturating_sub(l.sampler_runs),
                ));
                fams.push(Family::new(
                    "bpfscope_agent_samples_lost_total",
                    "Samples or parts of them lost in the kernel, by reason",
                    MetricType::Counter,
                    [
                        ("keys", l.keys),
                        ("kernel_stack", l.kernel_stacks),
                        ("user_stack", l.user_stacks),
                        ("stack_collision", l.collisions),
                        ("notification", l.notifications),
                        ("files", l.files),
                    ]
                    .into_iter()
                    .map(|(w, n)| {
                        (
                            vec![("reason".to_string(), w.to_string())],
                            Value::Counter(n as f64),
                        )
                    })
                    .collect(),
                ));
            }
            fams.push(g(
                "bpfscope_agent_stacks_cached",
                "Unique stacks held in user space",
                p.cached_stacks() as f64,
            ));
            fams.push(g(
                "bpfscope_agent_processes_tracked",
                "Processes whose mappings the agent keeps",
                p.tracked_processes() as f64,
            ));
            fams.push(g(
                "bpfscope_agent_unwind_table_bytes",
                "Kernel memory used by unwind tables",
                p.table_bytes() as f64,
            ));
            fams.push(c(
                "bpfscope_agent_windows_total",
                "Profile windows closed",
                self.windows,
            ));
            fams.push(c(
                "bpfscope_agent_bpf_events_lost_total",
                "BPF program loads or unloads the kernel dropped (their programs' frames may go unnamed)",
                p.sideband_lost(),
            ));
            fams.push(g(
                "bpfscope_agent_window_build_seconds",
                "Time the last window took to symbolize and encode",
                self.last_window_s,
            ));
        }
        fams.push(Family::new(
            "bpfscope_agent_reloads_total",
            "Configuration reloads (SIGHUP), by result",
            MetricType::Counter,
            vec![
                (
                    vec![("result".into(), "ok".into())],
                    Value::Counter(self.reloads_ok as f64),
                ),
                (
                    vec![("result".into(), "failed".into())],
                    Value::Counter(self.reloads_failed as f64),
                ),
            ],
        ));
        fams.extend(bpf_prog_families());
        if let Ok(mut f) = self.shared.families.lock() {
            *f = Arc::new(fams);
        }
    }

    /// SIGHUP: reads the configuration again and changes only what
    /// changed. Metrics whose spec is unchanged keep their programs and
    /// totals (no gap, no double count). A bad file changes nothing.
    fn reload(
        &mut self,
        args: &AgentArgs,
        features: &Features,
        requests: &Receiver<ProfileRequest>,
    ) {
        let new = match config::load(args) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("bpfscope: reload refused, the running configuration stays: {e}");
                self.reloads_failed += 1;
                self.publish();
                return;
            }
        };
        let mut changes = Vec::new();
        // Metrics: keep, stop, start.
        let mut kept = Vec::new();
        for mut m in std::mem::take(&mut self.metrics) {
            if new
                .metrics
                .iter()
                .any(|d| d.name == m.def.name && d.spec == m.def.spec)
            {
                // Same programs and totals; the cap may have changed.
                if let Some(d) = new.metrics.iter().find(|d| d.name == m.def.name) {
                    m.def.max_series = d.max_series;
                    m.def.expire = d.expire;
                }
                kept.push(m);
            } else {
                changes.push(format!("-{}", m.def.name));
                m.detach();
            }
        }
        for d in &new.metrics {
            if kept
                .iter()
                .any(|m| m.def.name == d.name && m.def.spec == d.spec)
            {
                continue;
            }
            match MetricRun::start(d.clone(), features) {
                Ok(m) => {
                    changes.push(format!("+{}", d.name));
                    kept.push(m);
                }
                Err(e) => eprintln!("bpfscope: reload: metric {} not started: {e:#}", d.name),
            }
        }
        self.metrics = kept;
        // The profiler: programs are reloaded only if how they sample changed.
        let sampler_changed = new.profile.hz != self.cfg.profile.hz
            || new.profile.max_depth != self.cfg.profile.max_depth
            || new.profile.unwind_mib != self.cfg.profile.unwind_mib
            || new.profile.max_stacks != self.cfg.profile.max_stacks;
        if sampler_changed {
            // The second in progress is read out before the programs go.
            if let Some(p) = &mut self.profiler {
                if let Err(e) = p.tick() {
                    eprintln!("bpfscope: profile readout: {e:#}");
                }
            }
            self.take_requests(requests);
            self.answer_ready(true);
            self.close_window();
            if let Some(mut p) = self.profiler.take() {
                p.stop();
            }
            self.shared.profiling.store(false, Ordering::SeqCst);
            if new.profile.hz > 0 {
                match Profiler::start(&new.profile) {
                    Ok(p) => {
                        self.profiler = Some(p);
                        self.shared.profiling.store(true, Ordering::SeqCst);
                    }
                    Err(e) => eprintln!("bpfscope: reload: profiler not started: {e:#}"),
                }
            }
            self.window_start_ns = now_ns();
            changes.push(format!("profile {} Hz", new.profile.hz));
        }
        if new.profile.window != self.cfg.profile.window {
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
        let server_changed = new.listen != self.cfg.listen
            || new.token != self.cfg.token
            || new.http != self.cfg.http;
        let old_listen = self.cfg.listen;
        let metrics_interval = new.metrics_interval;
        self.cfg = new;
        self.next_metrics = self.next_metrics.min(Instant::now() + metrics_interval);
        self.apply_limits();
        if server_changed {
            // Stopping the server waits for its workers: those waiting on a
            // profile get what there is now, instead of waiting on this thread.
            self.take_requests(requests);
            self.answer_ready(true);
            if let Some(s) = self.server.take() {
                s.stop();
            }
            match bind(&self.cfg).and_then(|l| start_server(&self.cfg, l, &self.shared)) {
                Ok(s) => self.server = Some(s),
                Err(e) => {
                    eprintln!("bpfscope: reload: {e:#}; serving on {old_listen} again");
                    self.cfg.listen = old_listen;
                    self.server = bind(&self.cfg)
                        .and_then(|l| start_server(&self.cfg, l, &self.shared))
                        .ok();
                }
            }
            changes.push(format!("http {}", self.cfg.listen));
        }
        self.reloads_ok += 1;
        self.publish();
        eprintln!(
            "bpfscope: reloaded: {}",
            if changes.is_empty() {
                "nothing changed".to_string()
            } else {
                changes.join(", ")
            }
        );
    }

    /// SIGTERM or SIGINT: the current window is written and pushed, the
    /// waiting requests are answered, everything is detached.
    fn finish(&mut self, requests: &Receiver<ProfileRequest>) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        // No request can be handed over from now on (workers send under
        // this lock): every one already handed over is answered below, so
        // no worker waits on a reply that will not come.
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
            s.stop();
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
            if self.pusher.is_some() || sent + dropped > 0 {
                format!(", {sent} pushed, {dropped} dropped")
            } else {
                String::new()
            }
        );
    }
}

/// BPF programs' run counts and times, as `bpf top` shows them.
fn bpf_prog_families() -> Vec<Family> {
    let progs = stats::snapshot();
    let labels = |p: &stats::ProgStats| {
        vec![
            ("id".to_string(), p.id.to_string()),
            ("name".to_string(), p.name.clone()),
            ("type".to_string(), p.prog_type.clone()),
        ]
    };
    vec![
        Family::new(
            "bpfscope_bpf_prog_run_seconds_total",
            "Time each loaded BPF program has run (BPF run-time statistics)",
            MetricType::Counter,
            progs
                .iter()
                .map(|p| (labels(p), Value::Counter(p.run_time_ns as f64 / 1e9)))
                .collect(),
        ),
        Family::new(
            "bpfscope_bpf_prog_runs_total",
            "Runs of each loaded BPF program (BPF run-time statistics)",
            MetricType::Counter,
            progs
                .iter()
                .map(|p| (labels(p), Value::Counter(p.run_cnt as f64)))
                .collect(),
        ),
    ]
}

fn start_server(cfg: &Config, listener: TcpListener, shared: &Arc<Shared>) -> Result<http::Server> {
    let limits = http::Limits {
        workers: cfg.http.workers,
        queue: cfg.http.queue,
        ..Default::default()
    };
    let handler = Arc::new(Routes {
        shared: shared.clone(),
    });
    http::Server::start(
        listener,
        handler,
        limits,
        cfg.token.clone(),
        shared.http.clone(),
    )
    .context("starting the HTTP server")
}

/// The HTTP side: reads what the BPF thread published.
struct Routes {
    shared: Arc<Shared>,
}

impl Handler for Routes {
    fn handle(&self, req: &Request) -> Response {
        match req.path.as_str() {
            "/healthz" => Response::text(200, "ok"),
            "/metrics" => self.metrics(req),
            "/debug/pprof/profile" => self.profile(req),
            "/debug/pprof/recent" => self.recent(req),
            "/" => Response::text(
                200,
                "bpfscope agent: /metrics /debug/pprof/profile?seconds=N /debug/pprof/recent /healthz",
            ),
            p => Response::text(404, &format!("no such path {p}; try /metrics or /debug/pprof/profile")),
        }
    }
}

/// An error pprof prints (it shows the body of text/plain answers that
/// carry X-Go-Pprof).
fn pprof_error(status: u16, msg: &str) -> Response {
    Response::text(status, msg).with_header("X-Go-Pprof", "1")
}

fn refuse_unknown(req: &Request, known: &[&str]) -> Option<Response> {
    req.query
        .iter()
        .find(|(k, _)| !known.contains(&k.as_str()))
        .map(|(k, _)| {
            pprof_error(
                400,
                &format!(
                    "unknown parameter '{k}'; this path takes {}",
                    known.join(", ")
                ),
            )
        })
}

impl Routes {
    fn metrics(&self, req: &Request) -> Response {
        if let Some(r) = refuse_unknown(req, &[]) {
            return r;
        }
        let mut fams: Vec<Family> = self
            .shared
            .families
            .lock()
            .map(|f| f.as_ref().clone())
            .unwrap_or_default();
        fams.extend(self_families(&self.shared));
        match metrics::render(fams) {
            Ok(text) => Response::new(
                200,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                text,
            ),
            Err(e) => Response::text(500, &format!("{e:#}")),
        }
    }

    fn profile(&self, req: &Request) -> Response {
        if let Some(r) = refuse_unknown(req, &["seconds", "pid", "comm", "cgroup"]) {
            return r;
        }
        if !self.shared.profiling.load(Ordering::SeqCst) {
            return pprof_error(404, "profiling is off: set profile hz above 0");
        }
        if self.shared.stopping.load(Ordering::SeqCst) {
            return pprof_error(503, "the agent is stopping").with_header("Retry-After", "1");
        }
        let max = self.shared.max_seconds.load(Ordering::SeqCst);
        let seconds = match req.param("seconds") {
            None => 30.min(max),
            Some(s) => match s.parse::<u64>() {
                Ok(n) if (1..=max).contains(&n) => n,
                _ => {
                    return pprof_error(
                        400,
                        &format!("seconds={s}: give a whole number from 1 to {max}"),
                    )
                }
            },
        };
        let pid = match req.param("pid").map(str::parse::<u32>) {
            None => None,
            Some(Ok(p)) if p > 0 => Some(p),
            Some(_) => return pprof_error(400, "pid: give a process id (a positive number)"),
        };
        let comm = req.param("comm").map(str::to_string);
        if comm.as_ref().is_some_and(|c| c.is_empty() || c.len() > 15) {
            return pprof_error(400, "comm: give a process or thread name of 1 to 15 bytes");
        }
        let cgroup = req.param("cgroup").map(str::to_string);
        if cgroup.as_ref().is_some_and(|c| !c.starts_with('/')) {
            return pprof_error(
                400,
                "cgroup: give a cgroup path starting with /, e.g. /system.slice",
            );
        }
        let (tx, rx) = sync_channel(1);
        let r = ProfileRequest {
            from_ns: now_ns(),
            seconds,
            sel: Selection { pid, comm, cgroup },
            reply: tx,
        };
        let sent = match self.shared.requests.lock() {
            Ok(g) => match g.as_ref().map(|s| s.try_send(r)) {
                Some(Ok(())) => Ok(()),
                Some(Err(TrySendError::Full(_))) => {
                    Err("too many profiles in progress; retry later")
                }
                _ => Err("the agent is stopping"),
            },
            Err(_) => Err("the agent is stopping"),
        };
        if let Err(why) = sent {
            return pprof_error(503, why).with_header("Retry-After", "1");
        }
        match rx.recv_timeout(Duration::from_secs(seconds + 30)) {
            Ok(Ok(body)) => pprof_body(body.as_ref().clone()),
            Ok(Err(e)) => pprof_error(500, &e),
            Err(_) => pprof_error(503, "the profile was not ready in time"),
        }
    }

    fn recent(&self, req: &Request) -> Response {
        if let Some(r) = refuse_unknown(req, &[]) {
            return r;
        }
        let recent = self.shared.recent.lock().ok().and_then(|r| r.clone());
        match recent {
            Some(b) => pprof_body(b.as_ref().clone()),
            None => pprof_error(
                404,
                &format!(
                    "no window has finished yet (windows are {} s); try again then",
                    self.shared.window_s.load(Ordering::SeqCst)
                ),
            ),
        }
    }
}

fn pprof_body(body: Vec<u8>) -> Response {
    Response::new(200, "application/octet-stream", body)
        .with_header("Content-Disposition", "attachment; filename=\"profile\"")
        .with_header("X-Content-Type-Options", "nosniff")
}

/// The agent's own health, fresh at every scrape.
fn self_families(shared: &Shared) -> Vec<Family> {
    let mut out = Vec::new();
    let g = |name: &str, help: &str, v: f64| {
        Family::one(name, help, MetricType::Gauge, vec![], Value::Gauge(v))
    };
    let c = |name: &str, help: &str, v: f64| {
        Family::one(name, help, MetricType::Counter, vec![], Value::Counter(v))
    };
    if let Some(kib) = bpfscope_sys::procfs::status_field("self", "VmRSS").and_then(|v| {
        v.split_whitespace()
            .next()
            .and_then(|n| n.parse::<f64>().ok())
    }) {
        out.push(g(
            "bpfscope_agent_resident_bytes",
            "The agent's resident memory",
            kib * 1024.0,
        ));
    }
    if let Some(cpu) = cpu_seconds() {
        out.push(c(
            "bpfscope_agent_cpu_seconds_total",
            "CPU time of the agent's process (user + system)",
            cpu,
        ));
    }
    let h = &shared.http;
    for (name, help, v) in [
        (
            "bpfscope_agent_http_requests_total",
            "HTTP requests answered",
            &h.requests,
        ),
        (
            "bpfscope_agent_http_busy_total",
            "HTTP connections refused with 503 (workers and queue full)",
            &h.busy,
        ),
        (
            "bpfscope_agent_http_bad_requests_total",
            "Malformed or refused HTTP requests",
            &h.bad,
        ),
        (
            "bpfscope_agent_http_unauthorized_total",
            "HTTP requests without the right bearer token",
            &h.unauthorized,
        ),
    ] {
        out.push(c(name, help, v.load(Ordering::Relaxed) as f64));
    }
    let p = &shared.push;
    for (name, help, v) in [
        (
            "bpfscope_agent_push_sent_total",
            "Windows pushed to the profile store",
            &p.sent,
        ),
        (
            "bpfscope_agent_push_failed_total",
            "Push attempts that failed (retried or not)",
            &p.failed,
        ),
        (
            "bpfscope_agent_push_dropped_total",
            "Windows given up: queue full, refused or out of attempts",
            &p.dropped,
        ),
    ] {
        out.push(c(name, help, v.load(Ordering::Relaxed) as f64));
    }
    out
}

/// utime + stime of this process.
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command (which may hold spaces) start after ')'.
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    // SAFETY: sysconf has no memory effects.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    Some(ticks / hz.max(1) as f64)
}
