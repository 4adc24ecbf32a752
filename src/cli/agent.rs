//! The agent's settings: one TOML file, overridden by command-line
//! options, validated once into `Config`. SIGHUP reads the file again and
//! the agent compares the new `Config` with the running one.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use serde::Deserialize;

use crate::agent::config::{
    Config, HttpConfig, MetricDef, ProfileConfig, PushConfig, StorageConfig, DEFAULT_LISTEN,
};
use crate::attach::plan::Action;
use crate::cli::{Cli, Settings, Target};
use crate::error::Error;
use crate::usage;

/// What the command line said (before the file is read).
#[derive(Debug, Clone, Default)]
pub struct AgentArgs {
    pub config: Option<PathBuf>,
    pub listen: Option<String>,
    pub profile_hz: Option<u64>,
    pub window: Option<u64>,
    pub metrics: Vec<String>,
    pub data_dir: Option<PathBuf>,
    pub push_url: Option<String>,
    pub token_file: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    listen: Option<String>,
    token_file: Option<PathBuf>,
    #[serde(default)]
    profile: ProfileFile,
    #[serde(default)]
    storage: StorageFile,
    #[serde(default)]
    push: PushFile,
    #[serde(default)]
    metrics: MetricsFile,
    #[serde(default)]
    http: HttpFile,
    #[serde(default)]
    metric: Vec<MetricFile>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProfileFile {
    hz: Option<u64>,
    window_seconds: Option<u64>,
    max_depth: Option<u32>,
    unwind_memory_mib: Option<u32>,
    max_stacks: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct StorageFile {
    dir: Option<PathBuf>,
    max_bytes: Option<u64>,
    max_age_seconds: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PushFile {
    url: Option<String>,
    app: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    token_file: Option<PathBuf>,
    tenant: Option<String>,
    queue: Option<usize>,
    timeout_seconds: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct MetricsFile {
    interval_seconds: Option<f64>,
    max_series: Option<usize>,
    series_expire_seconds: Option<u64>,
    bpf_prog_series: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct HttpFile {
    max_seconds: Option<u64>,
    max_profiles: Option<usize>,
    max_connections: Option<usize>,
    header_timeout_seconds: Option<f64>,
    write_timeout_seconds: Option<f64>,
    /// Settings of the thread-per-connection server this one replaced:
    /// still read, so that an existing file keeps loading, and said to
    /// have no effect.
    workers: Option<usize>,
    queue: Option<usize>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MetricFile {
    name: Option<String>,
    spec: String,
    max_series: Option<usize>,
}

/// Series of a metric unchanged this long are dropped by default.
const DEFAULT_EXPIRE: Duration = Duration::from_secs(3600);
const MAX_HZ: u64 = 1000;

/// Reads the file (if any) and applies the command line over it.
pub fn load(args: &AgentArgs) -> Result<Config, Error> {
    let file: File = match &args.config {
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(|e| {
                usage!(
                    "--config {}: {e}; give the path of a readable TOML file",
                    p.display()
                )
            })?;
            toml::from_str(&text).map_err(|e| {
                usage!(
                    "--config {}: {}",
                    p.display(),
                    e.to_string().lines().collect::<Vec<_>>().join(" ")
                )
            })?
        }
        None => File::default(),
    };
    let listen_text = args
        .listen
        .clone()
        .or(file.listen)
        .unwrap_or_else(|| DEFAULT_LISTEN.into());
    let listen: SocketAddr = listen_text.parse().map_err(|_| {
        usage!("listen address '{listen_text}' is not IP:PORT, e.g. 127.0.0.1:9464 or [::1]:9464")
    })?;
    let token = args
        .token_file
        .as_deref()
        .or(file.token_file.as_deref())
        .map(|p| read_token(p, "token_file"))
        .transpose()?;
    let hz = args.profile_hz.or(file.profile.hz).unwrap_or(19);
    if hz > MAX_HZ {
        return Err(usage!("profile hz {hz} is above {MAX_HZ}; an always-on profile needs far fewer (19 is the default)"));
    }
    let window_s = args.window.or(file.profile.window_seconds).unwrap_or(60);
    if !(1..=3600).contains(&window_s) {
        return Err(usage!("window of {window_s} s: give 1 to 3600 seconds"));
    }
    let max_depth = file.profile.max_depth.unwrap_or(127);
    if !(1..=1024).contains(&max_depth) {
        return Err(usage!("profile.max_depth {max_depth}: give 1 to 1024"));
    }
    let unwind_mib = file.profile.unwind_memory_mib.unwrap_or(32);
    if !(1..=1024).contains(&unwind_mib) {
        return Err(usage!(
            "profile.unwind_memory_mib {unwind_mib}: give 1 to 1024"
        ));
    }
    let max_stacks = file.profile.max_stacks.unwrap_or(16384);
    if !(64..=1 << 20).contains(&max_stacks) {
        return Err(usage!(
            "profile.max_stacks {max_stacks}: give 64 to 1048576"
        ));
    }
    let storage = args
        .data_dir
        .clone()
        .or(file.storage.dir)
        .map(|dir| StorageConfig {
            dir,
            max_bytes: file.storage.max_bytes.unwrap_or(256 << 20),
            max_age: Duration::from_secs(file.storage.max_age_seconds.unwrap_or(24 * 3600)),
        });
    let push = match args.push_url.clone().or(file.push.url) {
        Some(url) => {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(usage!(
                    "push url '{url}' must start with http:// or https://"
                ));
            }
            let app = file.push.app.unwrap_or_else(|| "bpfscope".into());
            check_push_name("push.app", &app, true)?;
            for (k, v) in &file.push.labels {
                check_push_name("push.labels key", k, false)?;
                if v.contains([',', '}', '{', '=']) || v.is_empty() {
                    return Err(usage!(
                        "push.labels.{k} = '{v}': a value may not be empty or hold , {{ }} or ="
                    ));
                }
            }
            Some(PushConfig {
                url: url.trim_end_matches('/').to_string(),
                app,
                labels: file.push.labels,
                token: file
                    .push
                    .token_file
                    .as_deref()
                    .map(|p| read_token(p, "push.token_file"))
                    .transpose()?,
                tenant: match file.push.tenant {
                    Some(t) if t.is_empty() || t.chars().any(char::is_control) => {
                        return Err(usage!(
                            "push.tenant '{}': give a tenant id without control characters",
                            t.escape_default()
                        ))
                    }
                    t => t,
                },
                queue: file.push.queue.unwrap_or(16).clamp(1, 1024),
                timeout: Duration::from_secs(file.push.timeout_seconds.unwrap_or(10).clamp(1, 300)),
            })
        }
        None => None,
    };
    let interval = file.metrics.interval_seconds.unwrap_or(5.0);
    if !(0.1..=3600.0).contains(&interval) {
        return Err(usage!(
            "metrics.interval_seconds {interval}: give 0.1 to 3600"
        ));
    }
    let max_series = file.metrics.max_series.unwrap_or(1000).max(1);
    let mut metrics = Vec::new();
    for m in &file.metric {
        metrics.push(metric(
            &m.spec,
            m.name.as_deref(),
            m.max_series.unwrap_or(max_series).max(1),
        )?);
    }
    for spec in &args.metrics {
        metrics.push(metric(spec, None, max_series)?);
    }
    check_families(&metrics)?;
    let expire = file
        .metrics
        .series_expire_seconds
        .map_or(DEFAULT_EXPIRE, Duration::from_secs);
    for m in &mut metrics {
        m.expire = expire;
    }
    let http = http_config(&file.http)?;
    Ok(Config {
        listen,
        token,
        profile: ProfileConfig {
            hz,
            window: Duration::from_secs(window_s),
            max_depth,
            unwind_mib,
            max_stacks,
        },
        storage,
        push,
        metrics_interval: Duration::from_secs_f64(interval),
        metrics,
        http,
        bpf_prog_series: file.metrics.bpf_prog_series.unwrap_or(64).min(4096),
    })
}

fn http_config(f: &HttpFile) -> Result<HttpConfig, Error> {
    if f.workers.is_some() || f.queue.is_some() {
        eprintln!(
            "bpfscope: http.workers and http.queue no longer have an effect (connections are \
             served as they come, up to http.max_connections); remove them from the file"
        );
    }
    let d = HttpConfig::default();
    let secs = |what: &str, v: Option<f64>, default: Duration| -> Result<Duration, Error> {
        match v {
            None => Ok(default),
            Some(s) if (0.1..=600.0).contains(&s) => Ok(Duration::from_secs_f64(s)),
            Some(s) => Err(usage!("http.{what} {s}: give 0.1 to 600 seconds")),
        }
    };
    Ok(HttpConfig {
        max_seconds: f.max_seconds.unwrap_or(d.max_seconds).clamp(1, 3600),
        max_profiles: f.max_profiles.unwrap_or(d.max_profiles).clamp(1, 64),
        max_connections: f
            .max_connections
            .unwrap_or(d.max_connections)
            .clamp(8, 16384),
        header_timeout: secs(
            "header_timeout_seconds",
            f.header_timeout_seconds,
            d.header_timeout,
        )?,
        write_timeout: secs(
            "write_timeout_seconds",
            f.write_timeout_seconds,
            d.write_timeout,
        )?,
    })
}

/// Families the agent exports itself.
const RESERVED: [&str; 2] = ["bpfscope_agent_", "bpfscope_bpf_prog_"];

/// Every family a metric exports must be its own: two with one name make
/// Prometheus refuse the whole scrape.
fn check_families(metrics: &[MetricDef]) -> Result<(), Error> {
    let mut taken: Vec<(String, &str)> = Vec::new();
    for m in metrics {
        for fam in m.sample_names() {
            if RESERVED.iter().any(|r| fam.starts_with(r)) {
                return Err(usage!(
                    "metric name {} is taken by the agent's own {fam}: choose another --name",
                    m.name
                ));
            }
            if let Some((_, other)) = taken.iter().find(|(f, _)| *f == fam) {
                return Err(usage!(
                    "metrics {} and {other} both export {fam}: add `--name NAME` to one of their specs",
                    m.name
                ));
            }
            taken.push((fam, m.name.as_str()));
        }
    }
    Ok(())
}

/// A token file: its first line, which must not be empty.
fn read_token(p: &Path, what: &str) -> Result<String, Error> {
    let text = std::fs::read_to_string(p).map_err(|e| {
        usage!(
            "{what} {}: {e}; give a readable file holding the token",
            p.display()
        )
    })?;
    let t = text.lines().next().unwrap_or("").trim().to_string();
    if t.is_empty() {
        return Err(usage!(
            "{what} {}: the file is empty; write the token on its first line",
            p.display()
        ));
    }
    Ok(t)
}

/// Pyroscope's name grammar has no escaping: keep names to what it parses.
fn check_push_name(what: &str, s: &str, app: bool) -> Result<(), Error> {
    let ok = !s.is_empty()
        && s.chars().all(|c| {
            c.is_ascii_alphanumeric() || c == '_' || c == '.' || (app && (c == '-' || c == '/'))
        });
    if ok {
        Ok(())
    } else {
        Err(usage!(
            "{what} '{s}': use letters, digits, _ and .{}",
            if app { ", - and /" } else { "" }
        ))
    }
}

/// A metric spec: the words of a count/hist/stats/latency command line,
/// with an optional `--name NAME`.
pub fn metric(spec: &str, name: Option<&str>, max_series: usize) -> Result<MetricDef, Error> {
    let bad = |why: &str| usage!("metric '{spec}': {why}");
    let mut words =
        shlex::split(spec).ok_or_else(|| bad("unbalanced quotes; quote it as on a shell line"))?;
    let mut given = name.map(str::to_string);
    if let Some(i) = words.iter().position(|w| w == "--name") {
        if i + 1 >= words.len() {
            return Err(bad("--name needs a NAME"));
        }
        given = Some(words.remove(i + 1));
        words.remove(i);
    }
    let Some(cmd) = words.first() else {
        return Err(bad("empty; start with count, hist, stats or latency"));
    };
    if !["count", "hist", "stats", "latency"].contains(&cmd.as_str()) {
        return Err(bad("starts with neither count, hist, stats nor latency"));
    }
    let cli = Cli::try_parse_from(std::iter::once("bpfscope".to_string()).chain(words.clone()))
        .map_err(|e| {
            let text = e.render().to_string();
            let line = text
                .lines()
                .map(str::trim)
                .find(|l| !l.is_empty())
                .unwrap_or("")
                .trim_start_matches("error: ")
                .to_string();
            bad(&line)
        })?;
    let Settings::Trace(settings) = Settings::from_cli(cli).map_err(|e| bad(&e.to_string()))?
    else {
        return Err(bad("not a count/hist/stats/latency command"));
    };
    if settings.duration.is_some() || settings.interval.is_some() {
        return Err(bad("--duration and --interval have no meaning here: metrics are read every metrics.interval_seconds"));
    }
    if settings.load.target != Target::All {
        return Err(bad("-p and -- CMD have no meaning for a metric: it counts the whole host (filter on pid or comm instead)"));
    }
    if settings.json || settings.heatmap.is_some() || settings.stack_output.is_some() {
        return Err(bad("output options have no meaning for a metric"));
    }
    if settings
        .plan
        .keys
        .iter()
        .any(|k| k == "kstack" || k == "ustack")
    {
        return Err(bad("stacks cannot be metric labels; profile instead"));
    }
    let action = &settings.plan.action;
    let name = match given {
        Some(n) => {
            if n.is_empty()
                || !n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                || n.starts_with(|c: char| c.is_ascii_digit())
            {
                return Err(bad("--name: use letters, digits and _ (not first)"));
            }
            // The unit is known for latency: it goes into the name, as
            // Prometheus names carry their unit.
            let n = n.strip_suffix("_total").unwrap_or(&n).to_string();
            if matches!(action, Action::Latency { .. }) && !n.ends_with("_seconds") {
                format!("{n}_seconds")
            } else {
                n
            }
        }
        None => default_name(&words, action),
    };
    let help = help_of(&words, action, &settings.plan.keys);
    Ok(MetricDef {
        name: format!("bpfscope_{name}"),
        spec: spec.to_string(),
        help,
        plan: settings.plan,
        load: settings.load,
        max_series,
        expire: DEFAULT_EXPIRE,
    })
}

/// What a metric is about, in words (its HELP lines start from this):
/// the events, then by what and where.
fn help_of(words: &[String], action: &Action, keys: &[String]) -> String {
    let probes: Vec<&str> = words
        .iter()
        .skip(1)
        .take_while(|w| !w.starts_with('-'))
        .map(String::as_str)
        .collect();
    let subject = match action {
        Action::Latency { end: Some(_), .. } => format!(
            "time from {} to its matching {}",
            probes.first().copied().unwrap_or("start"),
            probes.get(1).copied().unwrap_or("end")
        ),
        Action::Latency { .. } => format!("time spent in {}", probes.join(", ")),
        _ => format!("{} events", probes.join(", ")),
    };
    let by = if keys.is_empty() {
        String::new()
    } else {
        format!(", by {}", keys.join(", "))
    };
    let filter = words
        .iter()
        .position(|w| w == "--filter")
        .and_then(|i| words.get(i + 1))
        .map(|f| format!(", where {f}"))
        .unwrap_or_default();
    format!("{subject}{by}{filter}")
}

/// A name from the first probe and the action: `count
/// tracepoint:syscalls:sys_enter_*` -> `syscalls_sys_enter_events`.
fn default_name(words: &[String], action: &Action) -> String {
    let probe = words.get(1).map(String::as_str).unwrap_or("probe");
    // The probe's own name, without its type prefix (tracepoint:, u:, ...).
    let body = probe.split_once(':').map_or(probe, |(_, b)| b);
    let mut s: String = body
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect();
    while s.contains("__") {
        s = s.replace("__", "_");
    }
    let s = s.trim_matches('_').to_string();
    let suffix = match action {
        Action::Count | Action::Trace { .. } => "events".to_string(),
        Action::Stats { value } | Action::Hist { value, .. } => value.clone(),
        Action::Latency { .. } => "latency_seconds".to_string(),
    };
    let s = if s.is_empty() || s.starts_with(|c: char| c.is_ascii_digit()) {
        format!("m_{s}")
    } else {
        s
    };
    format!("{s}_{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_specs_parse_like_the_commands() {
        let m = metric(
            "count tracepoint:syscalls:sys_enter_* --by probe,comm",
            None,
            10,
        )
        .unwrap();
        assert_eq!(m.name, "bpfscope_syscalls_sys_enter_events");
        assert_eq!(m.plan.keys, ["probe", "comm"]);
        let m = metric(
            "hist t:syscalls:sys_exit_read --value ret --name read_bytes",
            None,
            10,
        )
        .unwrap();
        assert_eq!(m.name, "bpfscope_read_bytes");
        assert!(matches!(m.plan.action, Action::Hist { .. }));
    }

    #[test]
    fn metric_specs_refuse_what_has_no_meaning() {
        for (spec, word) in [
            ("trace t:syscalls:sys_enter_write", "neither"),
            (
                "count t:syscalls:sys_enter_write --duration 3",
                "--duration",
            ),
            ("count t:syscalls:sys_enter_write --by kstack", "stacks"),
            ("count 't:syscalls:sys_enter_write", "quotes"),
            ("count t:syscalls:sys_enter_write --name 9x", "--name"),
            ("count t:syscalls:sys_enter_write --bogus", "bogus"),
        ] {
            let e = metric(spec, None, 10).unwrap_err().to_string();
            assert!(e.contains(word), "{spec}: {e}");
            assert!(!e.contains('\n'), "{spec}: {e}");
        }
    }

    #[test]
    fn metric_families_must_not_clash() {
        let load_specs = |specs: &[&str]| {
            load(&AgentArgs {
                metrics: specs.iter().map(|s| s.to_string()).collect(),
                ..Default::default()
            })
        };
        let e = load_specs(&["count t:syscalls:sys_enter_write --name agent_windows_total"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("agent's own"), "{e}");
        let e = load_specs(&[
            "stats t:syscalls:sys_enter_write --value count --name w",
            "count t:syscalls:sys_enter_read --name w_events",
        ])
        .unwrap_err()
        .to_string();
        assert!(e.contains("both export bpfscope_w_events"), "{e}");
        assert!(load_specs(&[
            "count t:syscalls:sys_enter_write --name w",
            "count t:syscalls:sys_enter_read --name r",
        ])
        .is_ok());
    }

    /// The keys a section accepts, as serde lists them when refusing an
    /// unknown one.
    fn accepted_keys(section: &str) -> Vec<String> {
        let text = match section {
            "" => "bogus_key = 1\n".to_string(),
            "metric" => "[[metric]]\nspec = \"x\"\nbogus_key = 1\n".to_string(),
            s => format!("[{s}]\nbogus_key = 1\n"),
        };
        let e = toml::from_str::<File>(&text).unwrap_err().to_string();
        let list = e.split("expected").nth(1).unwrap_or_else(|| panic!("{e}"));
        list.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn every_key_is_documented() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let example = std::fs::read_to_string(root.join("packaging/agent.toml")).unwrap();
        let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
        for section in [
            "", "profile", "storage", "push", "metrics", "http", "metric",
        ] {
            let keys = accepted_keys(section);
            assert!(!keys.is_empty(), "{section}");
            for k in keys {
                // Kept only so that old files load (said to have no effect).
                if section == "http" && (k == "workers" || k == "queue") {
                    continue;
                }
                let sections = ["profile", "storage", "push", "metrics", "http", "metric"];
                if section.is_empty() && sections.contains(&k.as_str()) {
                    continue;
                }
                assert!(
                    example.lines().any(|l| l
                        .trim_start_matches(['#', ' '])
                        .starts_with(&format!("{k} ="))),
                    "packaging/agent.toml does not show {section}.{k}"
                );
                let dotted = if section.is_empty() || section == "metric" {
                    format!("`{k}`")
                } else {
                    format!("`{section}.{k}`")
                };
                assert!(
                    readme.contains(&dotted)
                        || (section == "metric" && readme.contains("`[[metric]]` `name`")),
                    "README does not name {dotted}"
                );
            }
        }
    }

    #[test]
    fn the_packaged_example_is_valid() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/agent.toml");
        let c = load(&AgentArgs {
            config: Some(path),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(c.listen.to_string(), DEFAULT_LISTEN);
        assert_eq!(c.metrics.len(), 3);
        assert!(c.push.is_none(), "the example's url is commented out");
    }

    #[test]
    fn file_settings_and_overrides() {
        let dir = std::env::temp_dir().join(format!("bpfscope-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cfg = dir.join("agent.toml");
        let tok = dir.join("token");
        std::fs::write(&tok, "s3cret\n").unwrap();
        std::fs::write(
            &cfg,
            format!(
                "listen = \"127.0.0.1:1234\"\ntoken_file = \"{}\"\n[profile]\nhz = 49\n[push]\nurl = \"http://x:4040/\"\nlabels = {{ env = \"prod\" }}\n[[metric]]\nspec = \"count t:syscalls:sys_enter_write --by comm\"\nname = \"writes\"\n",
                tok.display()
            ),
        )
        .unwrap();
        let args = AgentArgs {
            config: Some(cfg.clone()),
            profile_hz: Some(19),
            ..Default::default()
        };
        let c = load(&args).unwrap();
        assert_eq!(c.listen.to_string(), "127.0.0.1:1234");
        assert_eq!(c.token.as_deref(), Some("s3cret"));
        assert_eq!(c.profile.hz, 19);
        let push = c.push.unwrap();
        assert_eq!(push.url, "http://x:4040");
        assert_eq!(push.labels.get("env").map(String::as_str), Some("prod"));
        assert_eq!(c.metrics[0].name, "bpfscope_writes");
        std::fs::write(&cfg, "[profile]\nhzz = 3\n").unwrap();
        let e = load(&args).unwrap_err().to_string();
        assert!(e.contains("hzz") && !e.contains('\n'), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
