//! Arguments and settings of `profile`, `record`, `report` and `symbolize`.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::{parse_target, seconds, Target};
use crate::error::Error;
use crate::usage;
use bpfscope_symbolize::SymbolConfig;

#[derive(Debug, Args)]
pub struct SampleArgs {
    /// Samples per second on each CPU (software cpu-clock)
    #[arg(
        short = 'F',
        long = "frequency",
        value_name = "HZ",
        default_value_t = 99
    )]
    pub frequency: u64,

    /// Stop after this many seconds (Ctrl-C ends earlier)
    #[arg(
        long,
        value_name = "SECS",
        default_value_t = 10.0,
        allow_negative_numbers = true
    )]
    pub duration: f64,

    /// Only this process (all its threads)
    #[arg(
        short = 'p',
        long = "pid",
        value_name = "PID",
        allow_negative_numbers = true
    )]
    pub pid: Option<i64>,

    /// Only tasks in this cgroup (v2) and its descendants: a path under the cgroup2 mount, or relative to it
    #[arg(long, value_name = "PATH")]
    pub cgroup: Option<PathBuf>,

    /// Where threads wait instead of where they run: stacks at each switch-out, weighted by the time until they run again
    #[arg(long)]
    pub off_cpu: bool,

    /// User-space frames only
    #[arg(long, conflicts_with = "kernel_only")]
    pub user_only: bool,

    /// Kernel frames only
    #[arg(long)]
    pub kernel_only: bool,

    /// Most distinct (process, stack) pairs kept in the kernel; more are counted as lost
    #[arg(long, value_name = "N", default_value_t = 16384)]
    pub max_stacks: u32,

    /// Say what is happening
    #[arg(short, long)]
    pub verbose: bool,

    /// Profile this command and its descendants, stop when it exits
    #[arg(last = true, value_name = "CMD")]
    pub cmd: Vec<String>,
}

#[derive(Debug, Args)]
pub struct SymbolArgs {
    /// More directories with debug files in the build-id layout (DIR/.build-id/xx/rest.debug); /usr/lib/debug is always searched
    #[arg(long = "debug-dir", value_name = "DIR")]
    pub debug_dirs: Vec<PathBuf>,

    /// debuginfod server to fetch debug files from (repeatable; DEBUGINFOD_URLS is used as well)
    #[arg(long = "debuginfod", value_name = "URL")]
    pub debuginfod: Vec<String>,

    /// Do not use debuginfod, not even through DEBUGINFOD_URLS
    #[arg(long)]
    pub no_debuginfod: bool,
}

#[derive(Debug, Args)]
pub struct ProfileArgs {
    #[command(flatten)]
    pub sample: SampleArgs,
    /// Output file; the format follows the extension: .svg, .folded, .pb.gz (pprof), .json; default: top functions on stdout
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
    #[command(flatten)]
    pub symbols: SymbolArgs,
}

#[derive(Debug, Args)]
pub struct RecordArgs {
    #[command(flatten)]
    pub sample: SampleArgs,
    /// The recording to write (unsymbolized; turn it into outputs with `bpfscope report`)
    #[arg(
        short = 'o',
        long = "output",
        value_name = "FILE",
        default_value = "bpfscope.bscope"
    )]
    pub output: PathBuf,
}

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// A recording written by `bpfscope record`
    #[arg(value_name = "RECORDING")]
    pub input: PathBuf,
    /// Output file; the format follows the extension: .svg, .folded, .pb.gz (pprof), .json; default: top functions on stdout
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
    #[command(flatten)]
    pub symbols: SymbolArgs,
    /// Say where symbols came from
    #[arg(short, long)]
    pub verbose: bool,
}

#[derive(Debug, Args)]
pub struct SymbolizeArgs {
    /// Addresses in hex (also read from stdin, whitespace-separated, when none are given)
    #[arg(value_name = "ADDR")]
    pub addrs: Vec<String>,
    /// File offsets in this ELF file
    #[arg(long, value_name = "FILE", group = "source")]
    pub elf: Option<PathBuf>,
    /// File offsets in the ELF file with this build id (looked up in debug directories and debuginfod)
    #[arg(long, value_name = "HEX", group = "source")]
    pub build_id: Option<String>,
    /// Absolute addresses in this running process
    #[arg(
        long,
        value_name = "PID",
        group = "source",
        allow_negative_numbers = true
    )]
    pub pid: Option<i64>,
    /// Absolute kernel addresses (kallsyms)
    #[arg(long, group = "source")]
    pub kernel: bool,
    #[command(flatten)]
    pub symbols: SymbolArgs,
}

/// What is sampled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// On-CPU samples at a frequency.
    Cpu,
    /// Time blocked, from context switches.
    OffCpu,
}

/// A validated profiling run.
#[derive(Debug, Clone)]
pub struct SampleSettings {
    pub mode: Mode,
    pub frequency: u64,
    pub duration: Duration,
    pub target: Target,
    /// cgroup v2 path, when the target is a cgroup.
    pub cgroup: Option<PathBuf>,
    pub kernel: bool,
    pub user: bool,
    pub max_stacks: u32,
    pub verbose: bool,
}

/// Output formats, chosen by the output file's extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Svg,
    Folded,
    Pprof,
    Json,
}

#[derive(Debug, Clone)]
pub struct ProfileSettings {
    pub sample: SampleSettings,
    /// None: print the top functions.
    pub output: Option<(PathBuf, Format)>,
    pub symbols: SymbolConfig,
}

#[derive(Debug, Clone)]
pub struct RecordSettings {
    pub sample: SampleSettings,
    pub output: PathBuf,
}

#[derive(Debug, Clone)]
pub struct ReportSettings {
    pub input: PathBuf,
    pub output: Option<(PathBuf, Format)>,
    pub symbols: SymbolConfig,
    pub verbose: bool,
}

/// What `symbolize` looks addresses up in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SymSource {
    Elf(PathBuf),
    BuildId(Vec<u8>),
    Pid(u32),
    Kernel,
}

#[derive(Debug, Clone)]
pub struct SymbolizeSettings {
    pub source: SymSource,
    /// Addresses from the command line; empty: read stdin.
    pub addrs: Vec<u64>,
    pub symbols: SymbolConfig,
}

const MAX_FREQUENCY: u64 = 100_000;
/// (process, stack) pairs; the stack maps get half as many 4 KiB entries,
/// so 131072 is up to 256 MiB of kernel memory per stack map.
pub const MAX_PROFILE_STACKS: u32 = 1 << 17;

pub fn sample_settings(a: SampleArgs) -> Result<SampleSettings, Error> {
    if a.frequency == 0 || a.frequency > MAX_FREQUENCY {
        return Err(usage!(
            "-F {}: must be between 1 and {MAX_FREQUENCY} Hz",
            a.frequency
        ));
    }
    if !(16..=MAX_PROFILE_STACKS).contains(&a.max_stacks) {
        return Err(usage!(
            "--max-stacks {}: must be between 16 and {MAX_PROFILE_STACKS}",
            a.max_stacks
        ));
    }
    let duration = seconds(Some(a.duration), "--duration")?.unwrap_or(Duration::from_secs(10));
    let targets = [a.pid.is_some(), a.cgroup.is_some(), !a.cmd.is_empty()];
    if targets.iter().filter(|&&t| t).count() > 1 {
        return Err(usage!(
            "-p, --cgroup and -- CMD exclude each other; use one"
        ));
    }
    let target = parse_target(&super::args::TargetArgs {
        pid: a.pid,
        duration: None,
        interval: None,
        cmd: a.cmd,
    })?;
    Ok(SampleSettings {
        mode: if a.off_cpu { Mode::OffCpu } else { Mode::Cpu },
        frequency: a.frequency,
        duration,
        target,
        cgroup: a.cgroup,
        kernel: !a.user_only,
        user: !a.kernel_only,
        max_stacks: a.max_stacks,
        verbose: a.verbose,
    })
}

pub fn symbol_config(a: SymbolArgs) -> Result<SymbolConfig, Error> {
    let mut urls = a.debuginfod;
    if !a.no_debuginfod {
        if let Ok(env) = std::env::var("DEBUGINFOD_URLS") {
            urls.extend(env.split_whitespace().map(String::from));
        }
    } else {
        urls.clear();
    }
    for u in &urls {
        if !(u.starts_with("http://") || u.starts_with("https://")) {
            return Err(usage!(
                "debuginfod URL '{u}': expected http://HOST[:PORT][/PATH] or https://..."
            ));
        }
    }
    for d in &a.debug_dirs {
        if !d.is_dir() {
            return Err(usage!("--debug-dir {}: not a directory", d.display()));
        }
    }
    urls.dedup();
    Ok(SymbolConfig {
        debug_dirs: a.debug_dirs,
        debuginfod: urls,
    })
}

pub fn output_format(path: &std::path::Path) -> Result<Format, Error> {
    let name = path.to_string_lossy();
    let f = if name.ends_with(".svg") {
        Format::Svg
    } else if name.ends_with(".folded") {
        Format::Folded
    } else if name.ends_with(".pb.gz") {
        Format::Pprof
    } else if name.ends_with(".json") {
        Format::Json
    } else {
        return Err(usage!(
            "-o {name}: unknown output format; use .svg, .folded, .pb.gz or .json"
        ));
    };
    Ok(f)
}

pub fn symbolize_settings(a: SymbolizeArgs) -> Result<SymbolizeSettings, Error> {
    let source = match (a.elf, a.build_id, a.pid, a.kernel) {
        (Some(p), None, None, false) => {
            if !p.is_file() {
                return Err(usage!("--elf {}: no such file", p.display()));
            }
            SymSource::Elf(p)
        }
        (None, Some(h), None, false) => SymSource::BuildId(parse_build_id(&h)?),
        (None, None, Some(pid), false) => {
            let pid = u32::try_from(pid)
                .ok()
                .filter(|&p| p > 0)
                .ok_or_else(|| usage!("--pid {pid}: not a process id"))?;
            if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
                return Err(usage!("--pid {pid}: no such process"));
            }
            SymSource::Pid(pid)
        }
        (None, None, None, true) => SymSource::Kernel,
        _ => {
            return Err(usage!(
                "symbolize needs one of --elf FILE, --build-id HEX, --pid PID or --kernel"
            ))
        }
    };
    let addrs = a
        .addrs
        .iter()
        .map(|s| parse_addr(s))
        .collect::<Result<_, _>>()?;
    Ok(SymbolizeSettings {
        source,
        addrs,
        symbols: symbol_config(a.symbols)?,
    })
}

/// A hex address, with or without 0x.
pub fn parse_addr(s: &str) -> Result<u64, Error> {
    let t = s.trim();
    let h = t
        .strip_prefix("0x")
        .or_else(|| t.strip_prefix("0X"))
        .unwrap_or(t);
    u64::from_str_radix(h, 16).map_err(|_| usage!("'{t}' is not a hex address"))
}

pub fn parse_build_id(s: &str) -> Result<Vec<u8>, Error> {
    let s = s.trim();
    let bad = || usage!("--build-id '{s}': expected an even number of hex digits (2 to 64)");
    if s.len() < 2 || s.len() > 64 || s.len() % 2 != 0 {
        return Err(bad());
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2).unwrap_or(""), 16).map_err(|_| bad()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_and_build_ids() {
        assert_eq!(parse_addr("0x1f").unwrap(), 0x1f);
        assert_eq!(parse_addr("1F").unwrap(), 0x1f);
        assert!(parse_addr("xyz").is_err());
        assert_eq!(parse_build_id("0aff").unwrap(), vec![0x0a, 0xff]);
        assert!(parse_build_id("abc").is_err());
        assert!(parse_build_id("zz").is_err());
    }

    #[test]
    fn formats_by_extension() {
        use std::path::Path;
        assert_eq!(output_format(Path::new("a.svg")).unwrap(), Format::Svg);
        assert_eq!(output_format(Path::new("a.pb.gz")).unwrap(), Format::Pprof);
        assert_eq!(
            output_format(Path::new("x/a.folded")).unwrap(),
            Format::Folded
        );
        assert_eq!(output_format(Path::new("a.json")).unwrap(), Format::Json);
        assert!(output_format(Path::new("a.txt")).is_err());
    }
}
