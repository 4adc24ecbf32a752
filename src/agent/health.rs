//! The agent's own families (`bpfscope_agent_*`) and the host's BPF
//! programs (`bpfscope_bpf_prog_*`), kept monotonic: a counter read from
//! a profiler or a program that is replaced or unloaded carries on from
//! what it had reached, so Prometheus never sees a reset while the agent
//! runs.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;

use crate::bpfmeta::stats;
use crate::profile::session::KernelLost;
use crate::render::exposition::{Family, Kind, Value};

/// The sampler's counts, as the kernel gives them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SampleCounts {
    pub samples: u64,
    pub taken: u64,
    pub runs: u64,
    pub idle: u64,
    pub own: u64,
    pub not_run: u64,
    pub keys: u64,
    pub kernel_stacks: u64,
    pub user_stacks: u64,
    pub collisions: u64,
    pub notifications: u64,
    pub files: u64,
    pub bpf_events_lost: u64,
    pub in_bpf: u64,
    pub in_bpf_lost: u64,
}

impl SampleCounts {
    pub fn of(p: &crate::profile::continuous::Profiler, l: &KernelLost) -> SampleCounts {
        SampleCounts {
            samples: p.samples,
            taken: l.taken,
            runs: l.sampler_runs,
            idle: l.idle,
            own: l.other,
            // Read at slightly different moments, the clocks' count can
            // trail the runs': the difference is clamped, and kept from
            // going down below.
            not_run: l.taken.saturating_sub(l.sampler_runs),
            keys: l.keys,
            kernel_stacks: l.kernel_stacks,
            user_stacks: l.user_stacks,
            collisions: l.collisions,
            notifications: l.notifications,
            files: l.files,
            bpf_events_lost: p.sideband_lost(),
            in_bpf: p.bpf_samples,
            in_bpf_lost: p.bpf_samples_lost,
        }
    }

    fn fields(&mut self) -> [&mut u64; 15] {
        [
            &mut self.samples,
            &mut self.taken,
            &mut self.runs,
            &mut self.idle,
            &mut self.own,
            &mut self.not_run,
            &mut self.keys,
            &mut self.kernel_stacks,
            &mut self.user_stacks,
            &mut self.collisions,
            &mut self.notifications,
            &mut self.files,
            &mut self.bpf_events_lost,
            &mut self.in_bpf,
            &mut self.in_bpf_lost,
        ]
    }

    fn plus(mut self, mut o: SampleCounts) -> SampleCounts {
        for (a, b) in self.fields().into_iter().zip(o.fields()) {
            *a += *b;
        }
        self
    }

    fn max(mut self, mut o: SampleCounts) -> SampleCounts {
        for (a, b) in self.fields().into_iter().zip(o.fields()) {
            *a = (*a).max(*b);
        }
        self
    }
}

/// Sampler counts over every profiler the agent ran.
#[derive(Debug, Default)]
pub struct SampleTotals {
    /// Profilers that stopped (a reload that changed how they sample).
    before: SampleCounts,
    /// The running profiler's highest reading.
    now: SampleCounts,
}

impl SampleTotals {
    pub fn update(&mut self, c: SampleCounts) {
        self.now = self.now.max(c);
    }

    /// The running profiler stops: what it counted stays.
    pub fn retire(&mut self) {
        self.before = self.before.plus(self.now);
        self.now = SampleCounts::default();
    }

    pub fn get(&self) -> SampleCounts {
        self.before.plus(self.now)
    }
}

/// Run counts and times of the host's BPF programs by name and type, as
/// `bpf top` shows them: a program's id changes with every load, its name
/// and type do not. Programs that unload leave their counts in their
/// label set's total.
#[derive(Debug, Default)]
pub struct ProgTotals {
    /// (name, type) -> (run ns, runs) of programs no longer loaded.
    gone: BTreeMap<(String, String), (u64, u64)>,
    /// Loaded programs: id -> (label set, run ns, runs) as last read.
    live: HashMap<u32, ((String, String), u64, u64)>,
    /// Label sets not tracked because `max` were already.
    pub untracked: u64,
}

impl ProgTotals {
    pub fn update(&mut self, max: usize) {
        let now = stats::snapshot();
        let mut live = HashMap::with_capacity(now.len());
        for p in now {
            let label = (p.name, p.prog_type);
            let known = self.gone.contains_key(&label)
                || self.live.values().any(|(l, _, _)| *l == label)
                || live
                    .values()
                    .any(|(l, _, _): &((String, String), u64, u64)| *l == label);
            if !known && self.labels() >= max {
                self.untracked += 1;
                continue;
            }
            live.insert(p.id, (label, p.run_time_ns, p.run_cnt));
        }
        for (id, (label, ns, runs)) in self.live.drain() {
            if !live.contains_key(&id) {
                let g = self.gone.entry(label).or_default();
                g.0 += ns;
                g.1 += runs;
            }
        }
        self.live = live;
    }

    fn labels(&self) -> usize {
        let mut n = self.gone.len();
        for (l, _, _) in self.live.values() {
            if !self.gone.contains_key(l) {
                n += 1;
            }
        }
        n
    }

    pub fn families(&self) -> Vec<Family> {
        let mut sums: BTreeMap<&(String, String), (u64, u64)> = BTreeMap::new();
        for (l, v) in &self.gone {
            let s = sums.entry(l).or_default();
            s.0 += v.0;
            s.1 += v.1;
        }
        for (l, ns, runs) in self.live.values() {
            let s = sums.entry(l).or_default();
            s.0 += ns;
            s.1 += runs;
        }
        let labels = |l: &(String, String)| {
            vec![
                ("name".to_string(), l.0.clone()),
                ("type".to_string(), l.1.clone()),
            ]
        };
        vec![
            Family::new(
                "bpfscope_bpf_prog_run_seconds_total",
                "Time the host's BPF programs of this name and type have run while the agent \
                 ran (BPF run-time statistics), unloaded ones included",
                Kind::Counter,
                sums.iter()
                    .map(|(l, v)| (labels(l), Value::Counter(v.0 as f64 / 1e9)))
                    .collect(),
            ),
            Family::new(
                "bpfscope_bpf_prog_runs_total",
                "Runs of the host's BPF programs of this name and type while the agent ran \
                 (BPF run-time statistics), unloaded ones included",
                Kind::Counter,
                sums.iter()
                    .map(|(l, v)| (labels(l), Value::Count(v.1)))
                    .collect(),
            ),
        ]
    }
}

pub fn counter(name: &str, help: &str, v: u64) -> Family {
    Family::one(name, help, Kind::Counter, Value::Count(v))
}

pub fn gauge(name: &str, help: &str, v: f64) -> Family {
    Family::one(name, help, Kind::Gauge, Value::Gauge(v))
}

/// The sampler's families.
pub fn sample_families(c: &SampleCounts) -> Vec<Family> {
    vec![
        counter(
            "bpfscope_agent_samples_total",
            "Samples read into profiles",
            c.samples,
        ),
        counter(
            "bpfscope_agent_samples_taken_total",
            "Samples the CPU clocks fired (their own count: time counted over the period)",
            c.taken,
        ),
        counter(
            "bpfscope_agent_sampler_runs_total",
            "Runs of the sampling program (idle CPUs and the agent itself included)",
            c.runs,
        ),
        counter(
            "bpfscope_agent_samples_idle_total",
            "Samples of idle CPUs (not in profiles)",
            c.idle,
        ),
        counter(
            "bpfscope_agent_samples_own_total",
            "Samples of the agent itself (not in profiles)",
            c.own,
        ),
        counter(
            "bpfscope_agent_samples_not_run_total",
            "Samples the clocks counted whose program did not run: an idle CPU without its \
             tick, another BPF program running on that CPU (the kernel's recursion guard; \
             those are in bpfscope_agent_samples_in_bpf_total), or a late timer",
            c.not_run,
        ),
        Family::new(
            "bpfscope_agent_samples_lost_total",
            "Samples or parts of them lost in the kernel, by reason",
            Kind::Counter,
            [
                ("keys", c.keys),
                ("kernel_stack", c.kernel_stacks),
                ("user_stack", c.user_stacks),
                ("stack_collision", c.collisions),
                ("notification", c.notifications),
                ("files", c.files),
                ("second_sampler", c.in_bpf_lost),
            ]
            .into_iter()
            .map(|(w, n)| (vec![("reason".to_string(), w.to_string())], Value::Count(n)))
            .collect(),
        ),
        counter(
            "bpfscope_agent_samples_in_bpf_total",
            "Samples inside other tools' kprobe, tracepoint and perf_event BPF programs, \
             which the kernel keeps from the sampling program: taken by a second, plain \
             perf sampler, and in profiles",
            c.in_bpf,
        ),
        counter(
            "bpfscope_agent_bpf_events_lost_total",
            "BPF program loads or unloads the kernel dropped (their programs' frames may go \
             unnamed)",
            c.bpf_events_lost,
        ),
    ]
}

/// The HTTP server's and the pusher's counters, fresh at every scrape.
pub fn server_families(h: &super::http::Stats, p: &super::push::PushStats) -> Vec<Family> {
    let n = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    vec![
        counter(
            "bpfscope_agent_http_requests_total",
            "HTTP requests answered, any status",
            n(&h.requests),
        ),
        Family::new(
            "bpfscope_agent_http_refused_total",
            "HTTP connections refused with 503 (http.max_connections open) and profile \
             requests refused with 429 (http.max_profiles in progress)",
            Kind::Counter,
            vec![
                (
                    vec![("reason".into(), "connections".into())],
                    Value::Count(n(&h.refused_connections)),
                ),
                (
                    vec![("reason".into(), "profiles".into())],
                    Value::Count(n(&h.refused_profiles)),
                ),
            ],
        ),
        counter(
            "bpfscope_agent_http_bad_requests_total",
            "HTTP requests refused as malformed: 400, 405, 413",
            n(&h.bad),
        ),
        counter(
            "bpfscope_agent_http_unauthorized_total",
            "HTTP requests without the right bearer token",
            n(&h.unauthorized),
        ),
        counter(
            "bpfscope_agent_http_profiles_cancelled_total",
            "Profile requests whose client went away before the answer (their work stopped)",
            n(&h.cancelled),
        ),
        gauge(
            "bpfscope_agent_http_profiles_in_progress",
            "Profile requests being gathered now (at most http.max_profiles)",
            n(&h.profiles_in_progress) as f64,
        ),
        counter(
            "bpfscope_agent_push_sent_total",
            "Windows pushed to the profile store",
            n(&p.sent),
        ),
        counter(
            "bpfscope_agent_push_failed_total",
            "Push attempts that failed (retried or not)",
            n(&p.failed),
        ),
        counter(
            "bpfscope_agent_push_dropped_total",
            "Windows given up: queue full, refused or out of attempts",
            n(&p.dropped),
        ),
    ]
}

/// The agent process's memory and CPU.
pub fn process_families() -> Vec<Family> {
    let mut out = Vec::new();
    if let Some(kib) = bpfscope_sys::procfs::status_field("self", "VmRSS").and_then(|v| {
        v.split_whitespace()
            .next()
            .and_then(|n| n.parse::<f64>().ok())
    }) {
        out.push(gauge(
            "bpfscope_agent_resident_bytes",
            "The agent's resident memory",
            kib * 1024.0,
        ));
    }
    if let Some(cpu) = cpu_seconds() {
        out.push(Family::one(
            "bpfscope_agent_cpu_seconds_total",
            "CPU time of the agent's process (user + system)",
            Kind::Counter,
            Value::Counter(cpu),
        ));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_totals_survive_a_new_profiler_and_never_go_down() {
        let mut t = SampleTotals::default();
        let c = |taken, runs| SampleCounts {
            taken,
            runs,
            not_run: u64::saturating_sub(taken, runs),
            ..Default::default()
        };
        t.update(c(10, 7));
        t.update(c(11, 9)); // not_run would read 2 after 3
        assert_eq!(t.get().not_run, 3);
        assert_eq!(t.get().taken, 11);
        t.retire();
        t.update(c(2, 2));
        assert_eq!(t.get().taken, 13);
        assert_eq!(t.get().not_run, 3);
    }
}
