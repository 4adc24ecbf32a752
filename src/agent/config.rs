//! The agent's validated settings. `cli::agent` builds them from the TOML
//! file and the command line; on SIGHUP the agent asks for a new `Config`
//! and compares it with the running one.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::attach::plan::{Action, PlanConfig};
use crate::attach::session::LoadConfig;

pub const DEFAULT_LISTEN: &str = "127.0.0.1:9464";

/// The validated settings of a running agent.
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    pub token: Option<String>,
    pub profile: ProfileConfig,
    pub storage: Option<StorageConfig>,
    pub push: Option<PushConfig>,
    /// How often the kernel's aggregations are read into /metrics.
    pub metrics_interval: Duration,
    pub metrics: Vec<MetricDef>,
    pub http: HttpConfig,
    /// Label sets of `bpfscope_bpf_prog_*` (programs by name and type).
    pub bpf_prog_series: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProfileConfig {
    /// 0: no profiling.
    pub hz: u64,
    pub window: Duration,
    pub max_depth: u32,
    pub unwind_mib: u32,
    pub max_stacks: u32,
}

impl ProfileConfig {
    /// Whether the programs must be loaded anew for `other` (what and how
    /// they sample differs); the window alone does not.
    pub fn sampler_differs(&self, other: &ProfileConfig) -> bool {
        self.hz != other.hz
            || self.max_depth != other.max_depth
            || self.unwind_mib != other.unwind_mib
            || self.max_stacks != other.max_stacks
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageConfig {
    pub dir: PathBuf,
    pub max_bytes: u64,
    pub max_age: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushConfig {
    /// Base URL; windows go to `{url}/ingest`.
    pub url: String,
    pub app: String,
    pub labels: BTreeMap<String, String>,
    /// Bearer token (`push.token_file`).
    pub token: Option<String>,
    /// Sent as `X-Scope-OrgID` (`push.tenant`).
    pub tenant: Option<String>,
    pub queue: usize,
    /// Per attempt (`push.timeout_seconds`).
    pub timeout: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpConfig {
    /// Longest `seconds` a profile request may ask for.
    pub max_seconds: u64,
    /// Profile requests served at once; more get 429.
    pub max_profiles: usize,
    /// Open connections; more are answered 503 and closed.
    pub max_connections: usize,
    /// A request's head must arrive within this from the connection's
    /// start (or the previous response, on a kept-alive connection).
    pub header_timeout: Duration,
    /// A response whose client takes no bytes for this long is dropped.
    pub write_timeout: Duration,
}

impl Default for HttpConfig {
    fn default() -> HttpConfig {
        HttpConfig {
            max_seconds: 300,
            max_profiles: 4,
            max_connections: 256,
            header_timeout: Duration::from_secs(5),
            write_timeout: Duration::from_secs(10),
        }
    }
}

/// One metric: its name and the tracing run behind it.
#[derive(Debug, Clone)]
pub struct MetricDef {
    /// Metric family name, `bpfscope_` included (counters without `_total`).
    pub name: String,
    /// The spec as written: two definitions with the same spec and name
    /// are the same metric across a reload.
    pub spec: String,
    /// What the metric counts, for its HELP line.
    pub help: String,
    pub plan: PlanConfig,
    pub load: LoadConfig,
    pub max_series: usize,
    /// A label set whose count has not changed for this long is dropped
    /// (processes that are gone); zero: kept for the run.
    pub expire: Duration,
}

impl MetricDef {
    /// Whether `other` runs the same programs (a reload keeps this one).
    pub fn same_run(&self, other: &MetricDef) -> bool {
        self.name == other.name && self.spec == other.spec
    }

    /// Every sample name the metric may write (negative-value families
    /// included, whether or not its value turns out to be signed): two
    /// metrics must not share any, or Prometheus refuses the scrape.
    pub fn sample_names(&self) -> Vec<String> {
        let n = &self.name;
        match self.plan.action {
            Action::Count | Action::Trace { .. } => vec![format!("{n}_total")],
            Action::Stats { .. } => [
                "_events_total",
                "_sum_total",
                "_negative_events_total",
                "_negative_sum_total",
                "_min",
                "_max",
            ]
            .iter()
            .map(|s| format!("{n}{s}"))
            .collect(),
            Action::Hist { .. } | Action::Latency { .. } => {
                ["_bucket", "_sum", "_count", "_negative_total"]
                    .iter()
                    .map(|s| format!("{n}{s}"))
                    .collect()
            }
        }
    }
}
