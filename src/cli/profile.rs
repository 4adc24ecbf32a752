//! Arguments and settings of `profile`, `record`, `report` and `symbolize`.

use std::path::PathBuf;
use std::time::Duration;

use super::args::{SampleArgs, SymbolArgs, SymbolizeArgs, TargetArgs};
use super::{parse_target, seconds};
use crate::error::Error;
pub use crate::profile::{Mode, Runtimes, SamplingConfig};
use crate::usage;
use bpfscope_symbolize::SymbolConfig;

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
    pub sample: SamplingConfig,
    /// None: print the top functions.
    pub output: Option<(PathBuf, Format)>,
    pub symbols: SymbolConfig,
    /// A frame per thread name under each process (`--by-thread`).
    pub by_thread: bool,
}

/// `annotate RECORDING FUNCTION`.
#[derive(Debug, Clone)]
pub struct AnnotateSettings {
    pub input: PathBuf,
    pub function: String,
    pub json: bool,
    pub symbols: SymbolConfig,
}

pub fn annotate_settings(a: super::args::AnnotateArgs) -> Result<AnnotateSettings, Error> {
    if a.function.trim().is_empty() {
        return Err(usage!("annotate: name a function"));
    }
    Ok(AnnotateSettings {
        input: a.input,
        function: a.function,
        json: a.json,
        symbols: symbol_config(a.symbols)?,
    })
}

/// `diff BASE NEW`.
#[derive(Debug, Clone)]
pub struct DiffSettings {
    pub base: PathBuf,
    pub new: PathBuf,
    /// A differential flame graph, or difffolded lines.
    pub output: Option<(PathBuf, Format)>,
    pub rows: Option<usize>,
    pub json: bool,
    pub by_thread: bool,
    pub symbols: SymbolConfig,
}

pub fn diff_settings(a: super::args::DiffArgs) -> Result<DiffSettings, Error> {
    for p in [&a.base, &a.new] {
        if !p.is_file() {
            return Err(usage!("{}: no such file", p.display()));
        }
    }
    let output = match a.output {
        Some(p) => match output_format(&p)? {
            f @ (Format::Svg | Format::Folded) => Some((p, f)),
            _ => {
                return Err(usage!(
                "-o {}: diff writes .svg (a differential flame graph) or .folded (stack BASE NEW)",
                p.display()
            ))
            }
        },
        None => None,
    };
    Ok(DiffSettings {
        base: a.base,
        new: a.new,
        output,
        rows: a.rows,
        json: a.json,
        by_thread: a.by_thread,
        symbols: symbol_config(a.symbols)?,
    })
}

/// `top`: a live profile, refreshed.
#[derive(Debug, Clone)]
pub struct TopSettings {
    pub sample: SamplingConfig,
    pub interval: Duration,
    pub window: Duration,
    pub duration: Option<Duration>,
    pub sort: super::args::TopSort,
    pub rows: Option<usize>,
    pub json: bool,
    pub symbols: SymbolConfig,
}

#[derive(Debug, Clone)]
pub struct RecordSettings {
    pub sample: SamplingConfig,
    pub output: PathBuf,
}

#[derive(Debug, Clone)]
pub struct ReportSettings {
    pub input: PathBuf,
    pub output: Option<(PathBuf, Format)>,
    pub symbols: SymbolConfig,
    pub verbose: bool,
    pub by_thread: bool,
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
/// (process, stack) pairs; the stack map gets half as many entries of 8
/// bytes per frame (1 KiB at the default depth, 8 KiB at the largest).
pub const MAX_PROFILE_STACKS: u32 = 1 << 17;
/// `BP_DEPTH_LIMIT` of profile.h.
pub const MAX_DEPTH: u32 = 1024;
/// The unwind table array is one BPF array of 8-byte entries.
const MAX_UNWIND_MIB: u32 = 1024;

pub fn sampling_config(a: SampleArgs) -> Result<SamplingConfig, Error> {
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
    if !(1..=MAX_DEPTH).contains(&a.max_depth) {
        return Err(usage!(
            "--max-depth {}: must be between 1 and {MAX_DEPTH}",
            a.max_depth
        ));
    }
    if !(1..=MAX_UNWIND_MIB).contains(&a.unwind_memory) {
        return Err(usage!(
            "--unwind-memory {}: must be between 1 and {MAX_UNWIND_MIB} MiB",
            a.unwind_memory
        ));
    }
    // A command runs to its end, as under perf record; other targets
    // have no end of their own.
    let duration = match seconds(a.duration, "--duration")? {
        Some(d) => d,
        None if !a.cmd.is_empty() => crate::profile::UNTIL_STOPPED,
        None => Duration::from_secs(10),
    };
    let targets = [a.pid.is_some(), a.cgroup.is_some(), !a.cmd.is_empty()];
    if targets.iter().filter(|&&t| t).count() > 1 {
        return Err(usage!(
            "-p, --cgroup and -- CMD exclude each other; use one"
        ));
    }
    let target = parse_target(&TargetArgs {
        pid: a.pid,
        duration: None,
        interval: None,
        cmd: a.cmd,
    })?;
    Ok(SamplingConfig {
        mode: if a.off_cpu { Mode::OffCpu } else { Mode::Cpu },
        frequency: a.frequency,
        duration,
        target,
        cgroup: a.cgroup,
        kernel: !a.user_only,
        user: !a.kernel_only,
        max_stacks: a.max_stacks,
        max_depth: a.max_depth,
        unwind_entries: a.unwind_memory * (1 << 20) / 8,
        // Samples keyed by thread name too: every output names threads.
        labels: true,
        runtimes: runtimes(&a.lang)?,
        verbose: a.verbose,
    })
}

pub fn top_settings(a: super::args::TopArgs) -> Result<TopSettings, Error> {
    if a.frequency == 0 || a.frequency > MAX_FREQUENCY {
        return Err(usage!(
            "-F {}: must be between 1 and {MAX_FREQUENCY} Hz",
            a.frequency
        ));
    }
    let interval = seconds(Some(a.interval), "--interval")?.unwrap_or(Duration::from_secs(1));
    let window = seconds(Some(a.window), "--window")?.unwrap_or(Duration::from_secs(5));
    if window < interval {
        return Err(usage!(
            "--window {}: shorter than --interval {}; give a window of at least one refresh",
            a.window,
            a.interval
        ));
    }
    if a.rows == Some(0) {
        return Err(usage!("-n 0: show at least one row"));
    }
    let target = parse_target(&TargetArgs {
        pid: a.pid,
        duration: None,
        interval: None,
        cmd: Vec::new(),
    })?;
    Ok(TopSettings {
        sample: SamplingConfig {
            mode: Mode::Cpu,
            frequency: a.frequency,
            duration: crate::profile::UNTIL_STOPPED,
            target,
            cgroup: None,
            kernel: !a.user_only,
            user: !a.kernel_only,
            max_stacks: 16384,
            max_depth: 127,
            unwind_entries: 32 * (1 << 20) / 8,
            labels: false,
            runtimes: runtimes(&a.lang)?,
            verbose: false,
        },
        interval,
        window,
        duration: seconds(a.duration, "--duration")?,
        sort: a.sort,
        rows: a.rows,
        json: a.json,
        symbols: symbol_config(a.symbols)?,
    })
}

/// `--lang`: every runtime when not given.
fn runtimes(lang: &[crate::cli::args::Lang]) -> Result<Runtimes, Error> {
    use crate::cli::args::Lang;
    if lang.contains(&Lang::None) && lang.len() > 1 {
        return Err(usage!("--lang none: give it alone"));
    }
    Ok(Runtimes {
        python: lang.is_empty() || lang.contains(&Lang::Python),
        jit: lang.is_empty() || lang.contains(&Lang::Jit),
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
