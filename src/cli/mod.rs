//! CLI stage: arguments parsed once into validated settings. Later stages
//! never see raw strings.

pub mod agent;
mod args;
pub mod profile;

use std::path::{Path, PathBuf};
use std::time::Duration;

use args::{BpfCommand, KeyArgs, OutputArgs, ProbeArgs, TargetArgs};
pub use args::{Cli, Command, TopSort};

pub use crate::attach::plan::{Action, Buckets, PlanConfig};
pub use crate::attach::session::LoadConfig;
pub use crate::attach::target::Target;
use crate::error::Error;
use crate::filter;
use crate::probe::ProbeSpec;
use crate::usage;

/// `count`, `stats`, `hist`, `trace` and `latency`: one config per stage
/// (what to plan, how to load) and what the run itself needs.
#[derive(Debug, Clone)]
pub struct TraceSettings {
    pub plan: PlanConfig,
    pub load: LoadConfig,
    pub duration: Option<Duration>,
    pub interval: Option<Duration>,
    pub json: bool,
    /// Stack counts to write: .folded or .svg.
    pub stack_output: Option<PathBuf>,
    /// Latency: heatmap SVG to write.
    pub heatmap: Option<PathBuf>,
}

#[derive(Debug, Clone)]
pub struct ListSettings {
    pub pattern: Option<String>,
    pub pid: Option<u32>,
    pub names_only: bool,
    pub json: bool,
}

/// `run`: a script and how to run it.
#[derive(Debug, Clone)]
pub struct RunSettings {
    /// The script's text, and what to call it in errors.
    pub source: String,
    pub origin: String,
    pub params: Vec<String>,
    /// Keys each map holds (bpftrace's BPFTRACE_MAP_KEYS_MAX, 4096 by default).
    pub map_keys_max: u32,
    /// `--unsafe`: signal() may be used.
    pub allow_unsafe: bool,
    /// A command to run (not a filter: as bpftrace -c, every event counts).
    pub command: Option<Target>,
    pub pid: Option<u32>,
    pub duration: Option<Duration>,
    pub json: bool,
    pub dry_run: bool,
    pub verbose: bool,
}

/// `bpf` subcommands.
#[derive(Debug, Clone)]
pub enum BpfSettings {
    List {
        json: bool,
    },
    Top {
        interval: Duration,
        duration: Option<Duration>,
        json: bool,
        rows: usize,
    },
    Annotate {
        recording: PathBuf,
        prog: Option<String>,
        json: bool,
    },
}

/// Validated settings for one run.
#[derive(Debug, Clone)]
pub enum Settings {
    Trace(Box<TraceSettings>),
    List(ListSettings),
    Bpf(BpfSettings),
    Completions(clap_complete::Shell),
    Manpages(PathBuf),
    Doctor { json: bool, quick: bool },
    Profile(Box<profile::ProfileSettings>),
    Record(Box<profile::RecordSettings>),
    Report(Box<profile::ReportSettings>),
    Symbolize(Box<profile::SymbolizeSettings>),
    Top(Box<profile::TopSettings>),
    Diff(Box<profile::DiffSettings>),
    Annotate(Box<profile::AnnotateSettings>),
    Agent(Box<agent::AgentArgs>),
    Run(Box<RunSettings>),
}

const MAX_LINEAR_BUCKETS: u64 = 1000;
/// Kernel map sizes are checked here, where the user can be told the
/// limit, rather than failing later in the kernel with E2BIG. Aggregation
/// keys: a hash map of up to ~100-byte entries, so ~100 MiB at most.
pub const MAX_KEYS: u32 = 1 << 20;
/// Stacks per stack map: each entry is preallocated (kstack 1 KiB, ustack
/// 4 KiB), so 65536 is up to 256 MiB of kernel memory.
pub const MAX_TRACE_STACKS: u32 = 1 << 16;
/// Longest duration or interval (about 31 years); longer is a typo.
pub const MAX_SECONDS: f64 = 1e9;

impl Settings {
    pub fn from_cli(cli: Cli) -> Result<Settings, Error> {
        Ok(match cli.command {
            Command::Count(a) => Settings::Trace(Box::new(trace_settings(
                Action::Count,
                a.probe,
                Some(a.keys),
                a.target,
                a.output,
                None,
            )?)),
            Command::Stats(a) => Settings::Trace(Box::new(trace_settings(
                Action::Stats {
                    value: field_name(&a.value, "--value")?,
                },
                a.probe,
                Some(a.keys),
                a.target,
                a.output,
                None,
            )?)),
            Command::Hist(a) => {
                let buckets = match &a.linear {
                    None => Buckets::Log2,
                    Some(s) => parse_linear(s)?,
                };
                Settings::Trace(Box::new(trace_settings(
                    Action::Hist {
                        value: field_name(&a.value, "--value")?,
                        buckets,
                    },
                    a.probe,
                    Some(a.keys),
                    a.target,
                    a.output,
                    None,
                )?))
            }
            Command::Trace(a) => trace_command(a)?,
            Command::Latency(a) => latency_command(a)?,
            Command::List(a) => Settings::List(ListSettings {
                pattern: a.pattern,
                pid: a.pid,
                names_only: a.names,
                json: a.json,
            }),
            Command::Bpf { command } => Settings::Bpf(bpf_settings(command)?),
            Command::Run(a) => Settings::Run(Box::new(run_settings(a)?)),
            Command::Completions { shell } => Settings::Completions(shell),
            Command::Manpages { dir } => Settings::Manpages(dir),
            Command::Doctor(a) => Settings::Doctor {
                json: a.json,
                quick: a.quick,
            },
            Command::Profile(a) => Settings::Profile(Box::new(profile::ProfileSettings {
                output: a
                    .output
                    .map(|p| profile::output_format(&p).map(|f| (p, f)))
                    .transpose()?,
                sample: profile::sampling_config(a.sample)?,
                symbols: profile::symbol_config(a.symbols)?,
                by_thread: a.by_thread,
            })),
            Command::Record(a) => Settings::Record(Box::new(profile::RecordSettings {
                sample: profile::sampling_config(a.sample)?,
                output: a.output,
            })),
            Command::Report(a) => Settings::Report(Box::new(profile::ReportSettings {
                output: a
                    .output
                    .map(|p| profile::output_format(&p).map(|f| (p, f)))
                    .transpose()?,
                input: a.input,
                symbols: profile::symbol_config(a.symbols)?,
                verbose: a.verbose,
                by_thread: a.by_thread,
            })),
            Command::Top(a) => Settings::Top(Box::new(profile::top_settings(a)?)),
            Command::Diff(a) => Settings::Diff(Box::new(profile::diff_settings(a)?)),
            Command::Annotate(a) => Settings::Annotate(Box::new(profile::annotate_settings(a)?)),
            Command::Agent(a) => Settings::Agent(Box::new(agent::AgentArgs {
                config: a.config,
                listen: a.listen,
                profile_hz: a.profile_hz,
                window: a.window,
                metrics: a.metric,
                data_dir: a.data_dir,
                push_url: a.push_url,
                token_file: a.token_file,
            })),
            Command::Symbolize(a) => Settings::Symbolize(Box::new(profile::symbolize_settings(a)?)),
        })
    }
}

/// `trace`: the fields to print and the ring buffer they go through.
fn trace_command(a: args::TraceArgs) -> Result<Settings, Error> {
    let fields = a
        .fields
        .iter()
        .map(|f| field_name(f, "--fields"))
        .collect::<Result<_, _>>()?;
    if a.ringbuf_kib == 0 || a.ringbuf_kib > 1 << 20 {
        return Err(usage!(
            "--ringbuf-kib {}: must be between 1 and 1048576",
            a.ringbuf_kib
        ));
    }
    let bytes = (a.ringbuf_kib.next_power_of_two() * 1024).max(4096);
    Ok(Settings::Trace(Box::new(trace_settings(
        Action::Trace { fields },
        a.probe,
        None,
        a.target,
        a.output,
        Some(bytes),
    )?)))
}

/// `latency`: one function probe (entry to return) or START and END
/// probes paired on `--match` fields, and the optional heatmap.
fn latency_command(a: args::LatencyArgs) -> Result<Settings, Error> {
    let buckets = match &a.linear {
        None => Buckets::Log2,
        Some(s) => parse_linear(s)?,
    };
    let (start, end) = match a.probes.as_slice() {
        [one] => (one.clone(), None),
        [start, end] => (start.clone(), Some(ProbeSpec::parse(end)?)),
        _ => return Err(usage!("latency takes one function probe, or START and END")),
    };
    let probe = ProbeArgs {
        probes: vec![start],
        filter: a.filter,
    };
    let mut matching = Vec::new();
    for m in &a.matching {
        matching.push(match_entry(m)?);
    }
    let mut t = trace_settings(
        Action::Latency {
            buckets,
            end: end.clone(),
            matching,
        },
        probe,
        Some(a.keys),
        a.target,
        a.output,
        None,
    )?;
    if end.is_none() {
        if !a.matching.is_empty() {
            return Err(usage!(
                "--match pairs START and END probes; a function probe pairs entry and return by thread"
            ));
        }
        if t.plan.probes.iter().any(|p| p.returning().is_none()) {
            return Err(usage!(
                "latency with one probe needs a function entry (uprobe:PATH:FUNC, kprobe:FUNC, fentry:FUNC); for events give START and END probes"
            ));
        }
    }
    if let Some(h) = &a.heatmap {
        if h.extension().and_then(|e| e.to_str()) != Some("svg") {
            return Err(usage!(
                "--heatmap {}: the file name must end in .svg",
                h.display()
            ));
        }
        // A heatmap has one column per interval.
        t.interval.get_or_insert(Duration::from_secs(1));
    }
    t.heatmap = a.heatmap;
    Ok(Settings::Trace(Box::new(t)))
}

/// `bpf list`, `bpf top`, `bpf annotate`.
fn bpf_settings(command: BpfCommand) -> Result<BpfSettings, Error> {
    Ok(match command {
        BpfCommand::List { json } => BpfSettings::List { json },
        BpfCommand::Top {
            interval,
            duration,
            json,
            rows,
        } => BpfSettings::Top {
            interval: seconds(Some(interval), "--interval")?.unwrap_or(Duration::from_secs(1)),
            duration: seconds(duration, "--duration")?,
            json,
            rows: rows.max(1),
        },
        BpfCommand::Annotate {
            recording,
            prog,
            json,
        } => BpfSettings::Annotate {
            recording,
            prog,
            json,
        },
    })
}

fn trace_settings(
    action: Action,
    probe: ProbeArgs,
    keys: Option<KeyArgs>,
    target: TargetArgs,
    output: OutputArgs,
    ringbuf_bytes: Option<u32>,
) -> Result<TraceSettings, Error> {
    let probes = probe
        .probes
        .iter()
        .map(|p| ProbeSpec::parse(p))
        .collect::<Result<Vec<_>, _>>()?;
    let filter = probe.filter.as_deref().map(filter::parse).transpose()?;
    let (keys, max_keys, max_stacks, stack_output) = match keys {
        Some(k) => {
            if k.max_keys == 0 || k.max_keys > MAX_KEYS {
                return Err(usage!(
                    "--max-keys {}: must be between 1 and {MAX_KEYS}",
                    k.max_keys
                ));
            }
            if k.max_stacks == 0 || k.max_stacks > MAX_TRACE_STACKS {
                return Err(usage!(
                    "--max-stacks {}: must be between 1 and {MAX_TRACE_STACKS}",
                    k.max_stacks
                ));
            }
            let mut names = Vec::new();
            for key in &k.by {
                let key = field_name(key, "--by")?;
                if names.contains(&key) {
                    return Err(usage!("--by: key '{key}' is given twice"));
                }
                names.push(key);
            }
            if let Some(o) = &k.output {
                let ext = o.extension().and_then(|e| e.to_str()).unwrap_or("");
                if !matches!(ext, "folded" | "svg") {
                    return Err(usage!(
                        "-o {}: stack counts go to a .folded or .svg file",
                        o.display()
                    ));
                }
                if !names.iter().any(|n| n == "kstack" || n == "ustack") {
                    return Err(usage!(
                        "-o {}: writes stack counts; add --by kstack or --by ustack",
                        o.display()
                    ));
                }
            }
            let stacks = names.iter().any(|n| n == "kstack" || n == "ustack");
            (
                names,
                Some(k.max_keys),
                stacks.then_some(k.max_stacks),
                k.output,
            )
        }
        None => (Vec::new(), None, None, None),
    };
    Ok(TraceSettings {
        plan: PlanConfig {
            action,
            probes,
            keys,
            filter,
        },
        load: LoadConfig {
            target: parse_target(&target)?,
            max_keys,
            max_stacks,
            ringbuf_bytes,
            verbose: output.verbose,
            compiled: Vec::new(),
        },
        duration: seconds(target.duration, "--duration")?,
        interval: seconds(target.interval, "--interval")?,
        json: output.json,
        stack_output,
        heatmap: None,
    })
}

/// Field names are identifiers; `args.NAME` (bpftrace's spelling) names
/// the event field even where a builtin has the same name. BTF-typed
/// arguments take member paths: `skb->dev->name`, `file->f_path.dentry`.
fn field_name(s: &str, opt: &str) -> Result<String, Error> {
    let s = s.trim();
    let bare = s.strip_prefix("args.").unwrap_or(s);
    let ok = crate::probe::btf::is_field_path(bare);
    if ok {
        Ok(s.to_string())
    } else {
        Err(usage!("{opt}: '{s}' is not a field name"))
    }
}

/// A `--match` entry: NAME, or START_NAME=END_NAME to pair differently
/// named fields (wakeup's `pid` with switch's `next_pid`).
fn match_entry(m: &str) -> Result<String, Error> {
    match m.split_once('=') {
        Some((start, end)) => Ok(format!(
            "{}={}",
            field_name(start, "--match")?,
            field_name(end, "--match")?
        )),
        None => field_name(m, "--match"),
    }
}

fn seconds(v: Option<f64>, opt: &str) -> Result<Option<Duration>, Error> {
    match v {
        None => Ok(None),
        Some(s) if s.is_finite() && s > 0.0 && s <= MAX_SECONDS => {
            Ok(Some(Duration::from_secs_f64(s)))
        }
        Some(s) if s > MAX_SECONDS => Err(usage!(
            "{opt} {s}: too large; at most {MAX_SECONDS:.0} seconds (about 31 years)"
        )),
        Some(s) => Err(usage!("{opt} {s}: must be a positive number of seconds")),
    }
}

fn parse_linear(s: &str) -> Result<Buckets, Error> {
    let bad = || {
        usage!("--linear '{s}': expected MIN:MAX:STEP with MIN < MAX and STEP > 0, e.g. 0:4096:256")
    };
    let parts: Vec<&str> = s.split(':').collect();
    let [min, max, step] = parts.as_slice() else {
        return Err(bad());
    };
    let min: i64 = min.trim().parse().map_err(|_| bad())?;
    let max: i64 = max.trim().parse().map_err(|_| bad())?;
    let step: u64 = step.trim().parse().map_err(|_| bad())?;
    if min >= max || step == 0 {
        return Err(bad());
    }
    let span = (max as i128 - min as i128) as u128;
    let n = span.div_ceil(step as u128);
    if n > MAX_LINEAR_BUCKETS as u128 {
        return Err(usage!(
            "--linear '{s}': {n} buckets; at most {MAX_LINEAR_BUCKETS} (raise STEP)"
        ));
    }
    Ok(Buckets::Linear {
        min,
        step,
        nbuckets: n as u32,
    })
}

fn run_settings(a: args::RunArgs) -> Result<RunSettings, Error> {
    let (source, origin, params) = match (a.expr, a.file) {
        (Some(e), file) => {
            // With -e, what clap took for the file is the first parameter.
            let mut params: Vec<String> = file.into_iter().collect();
            params.extend(a.params);
            (e, "-e".to_string(), params)
        }
        (None, Some(f)) if f == "-" => {
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut std::io::stdin(), &mut bytes)
                .map_err(|e| usage!("reading the script from standard input: {e}"))?;
            let text = crate::filter::raw::decode(&bytes).into_owned();
            (text, "<stdin>".to_string(), a.params)
        }
        (None, Some(f)) => {
            // Comments and strings may hold bytes that are not UTF-8.
            let bytes = std::fs::read(&f).map_err(|e| usage!("cannot read script '{f}': {e}"))?;
            let text = crate::filter::raw::decode(&bytes).into_owned();
            (text, f, a.params)
        }
        (None, None) => return Err(usage!("give a script file or -e 'PROGRAM'")),
    };
    let line = match (a.command, a.cmd.as_slice()) {
        (Some(_), [_, ..]) => return Err(usage!("-c and -- CMD exclude each other; use one")),
        (Some(c), []) => {
            Some(shlex::split(&c).ok_or_else(|| usage!("-c '{c}': unbalanced quotes"))?)
        }
        (None, []) => None,
        (None, cmd) => Some(cmd.to_vec()),
    };
    let command = match line {
        Some(words) => match words.split_first() {
            Some((prog, args)) => Some(Target::Command {
                program: find_program(prog)?,
                args: args.to_vec(),
            }),
            None => return Err(usage!("-c: the command is empty")),
        },
        None => None,
    };
    let pid = a.pid.map(parse_pid).transpose()?;
    if pid.is_some() && command.is_some() {
        return Err(usage!("-p and -c exclude each other; use one"));
    }
    Ok(RunSettings {
        source,
        origin,
        params,
        map_keys_max: map_keys_max(std::env::var("BPFTRACE_MAP_KEYS_MAX").ok().as_deref())?,
        allow_unsafe: a.allow_unsafe,
        command,
        pid,
        duration: seconds(a.duration, "--duration")?,
        json: a.json || a.format.as_deref() == Some("json"),
        dry_run: a.dry_run,
        verbose: a.verbose,
    })
}

/// Keys per script map: bpftrace's default, or BPFTRACE_MAP_KEYS_MAX as
/// bpftrace reads it (a positive integer).
fn map_keys_max(env: Option<&str>) -> Result<u32, Error> {
    const DEFAULT: u32 = 4096;
    let Some(v) = env else {
        return Ok(DEFAULT);
    };
    v.trim()
        .parse::<u32>()
        .ok()
        .filter(|n| (1..=MAX_KEYS).contains(n))
        .ok_or_else(|| {
            usage!("BPFTRACE_MAP_KEYS_MAX={v}: expected a number of keys from 1 to {MAX_KEYS}")
        })
}

/// `-p PID`: a process that exists.
fn parse_pid(pid: i64) -> Result<u32, Error> {
    let pid = u32::try_from(pid)
        .ok()
        .filter(|&p| p > 0)
        .ok_or_else(|| usage!("-p {pid}: not a process id"))?;
    if !Path::new(&format!("/proc/{pid}")).exists() {
        return Err(usage!("-p {pid}: no such process"));
    }
    Ok(pid)
}

fn parse_target(t: &TargetArgs) -> Result<Target, Error> {
    match (t.pid, t.cmd.as_slice()) {
        (Some(_), [_, ..]) => Err(usage!("-p and -- CMD exclude each other; use one")),
        (Some(pid), []) => Ok(Target::Pid(parse_pid(pid)?)),
        (None, []) => Ok(Target::All),
        (None, [prog, args @ ..]) => Ok(Target::Command {
            program: find_program(prog)?,
            args: args.to_vec(),
        }),
    }
}

/// Resolves a command the way execvp would, so a missing one fails before anything is attached.
fn find_program(prog: &str) -> Result<PathBuf, Error> {
    use std::os::unix::fs::PermissionsExt;
    let runnable = |p: &Path| {
        p.metadata()
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    };
    if prog.contains('/') {
        let p = PathBuf::from(prog);
        return if runnable(&p) {
            Ok(p)
        } else if p.exists() {
            Err(usage!("command '{prog}' is not executable"))
        } else {
            Err(usage!("command '{prog}' does not exist"))
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .map(|d| d.join(prog))
        .find(|p| runnable(p))
        .ok_or_else(|| usage!("command '{prog}' not found in PATH"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linear_buckets() {
        assert_eq!(
            parse_linear("0:4096:256").unwrap(),
            Buckets::Linear {
                min: 0,
                step: 256,
                nbuckets: 16
            }
        );
        assert_eq!(
            parse_linear("-10:10:3").unwrap(),
            Buckets::Linear {
                min: -10,
                step: 3,
                nbuckets: 7
            }
        );
        for bad in ["", "1:2", "5:5:1", "9:1:1", "0:10:0", "a:b:c", "0:100000:1"] {
            assert!(parse_linear(bad).is_err(), "{bad}");
        }
    }

    fn usage_text(r: Result<Option<Duration>, Error>) -> String {
        r.unwrap_err().to_string()
    }

    #[test]
    fn durations_name_their_limits() {
        assert_eq!(
            seconds(Some(1.5), "--duration").unwrap(),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            seconds(Some(1e9), "--interval").unwrap(),
            Some(Duration::from_secs(1_000_000_000))
        );
        assert_eq!(
            usage_text(seconds(Some(1e30), "--duration")),
            "--duration 1000000000000000000000000000000: too large; at most 1000000000 seconds (about 31 years)"
        );
        assert_eq!(
            usage_text(seconds(Some(f64::INFINITY), "--interval")),
            "--interval inf: too large; at most 1000000000 seconds (about 31 years)"
        );
        assert_eq!(
            usage_text(seconds(Some(-1.0), "--duration")),
            "--duration -1: must be a positive number of seconds"
        );
        assert_eq!(
            usage_text(seconds(Some(f64::NAN), "--duration")),
            "--duration NaN: must be a positive number of seconds"
        );
    }

    fn parse(args: &[&str]) -> Result<Settings, Error> {
        use clap::Parser;
        let cli = Cli::try_parse_from(args).unwrap();
        Settings::from_cli(cli)
    }

    #[test]
    fn map_sizes_are_checked_at_parse_time() {
        let err = |args: &[&str]| match parse(args) {
            Err(e @ Error::Usage(_)) => e.to_string(),
            other => panic!("{args:?}: {other:?}"),
        };
        let tp = "tracepoint:sched:sched_switch";
        assert_eq!(
            err(&["bpfscope", "count", tp, "--max-keys", "4294967295"]),
            "--max-keys 4294967295: must be between 1 and 1048576"
        );
        assert_eq!(
            err(&["bpfscope", "count", tp, "--max-keys", "0"]),
            "--max-keys 0: must be between 1 and 1048576"
        );
        assert_eq!(
            err(&[
                "bpfscope",
                "hist",
                tp,
                "--value",
                "prev_pid",
                "--max-stacks",
                "65537"
            ]),
            "--max-stacks 65537: must be between 1 and 65536"
        );
        assert_eq!(
            err(&["bpfscope", "trace", tp, "--ringbuf-kib", "4294967295"]),
            "--ringbuf-kib 4294967295: must be between 1 and 1048576"
        );
        assert_eq!(
            err(&["bpfscope", "profile", "--max-stacks", "4294967295"]),
            "--max-stacks 4294967295: must be between 16 and 131072"
        );
        assert_eq!(
            err(&["bpfscope", "record", "-F", "18446744073709551615"]),
            "-F 18446744073709551615: must be between 1 and 100000 Hz"
        );
        assert_eq!(
            err(&["bpfscope", "bpf", "top", "--interval", "1e30"]),
            "--interval 1000000000000000000000000000000: too large; at most 1000000000 seconds (about 31 years)"
        );
        assert_eq!(
            err(&["bpfscope", "profile", "--duration", "1e30"]),
            "--duration 1000000000000000000000000000000: too large; at most 1000000000 seconds (about 31 years)"
        );
        assert!(parse(&["bpfscope", "count", tp, "--max-keys", "1048576"]).is_ok());
    }

    #[test]
    fn match_entries() {
        assert_eq!(match_entry("pid").unwrap(), "pid");
        assert_eq!(match_entry("pid=next_pid").unwrap(), "pid=next_pid");
        assert_eq!(
            match_entry(" args.pid = next_pid").unwrap(),
            "args.pid=next_pid"
        );
        for bad in ["pid=", "=pid", "a=b=c", "pid==x"] {
            assert!(match_entry(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn field_names() {
        assert_eq!(field_name("args.count", "--value").unwrap(), "args.count");
        assert_eq!(field_name(" pid", "--by").unwrap(), "pid");
        assert!(field_name("a-b", "--by").is_err());
        assert!(field_name("1x", "--by").is_err());
        assert_eq!(
            field_name("skb->dev->name", "--by").unwrap(),
            "skb->dev->name"
        );
        assert!(field_name("f.d_name.name", "--by").is_ok());
        for bad in ["skb->", "skb->->x", "a..b", "a->1x"] {
            assert!(field_name(bad, "--by").is_err(), "{bad}");
        }
    }
}
