//! Command-line definitions (clap). Nothing outside `cli` sees these raw
//! strings: `Settings::from_cli` validates them once.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Debug, Parser)]
#[command(
    name = "bpfscope",
    version,
    about = "Trace, count and profile with eBPF: in-kernel filtering and aggregation, no compiler at run time",
    propagate_version = true,
    max_term_width = 100
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Count events in the kernel, grouped by keys
    Count(CountArgs),
    /// Histogram of a numeric field (log2 buckets, or --linear)
    Hist(HistArgs),
    /// Count, sum, min, max and average of a numeric field
    Stats(StatsArgs),
    /// Print one line per event
    Trace(TraceArgs),
    /// Latency histogram: function entry to return, or START to END events
    Latency(LatencyArgs),
    /// List probes and their fields
    List(ListArgs),
    /// Sample stacks (CPU, or off-CPU time) and write a flame graph, pprof, folded stacks or the top functions
    Profile(ProfileArgs),
    /// Sample stacks into an unsymbolized recording for a later `report`
    Record(RecordArgs),
    /// Symbolize a recording into a flame graph, pprof, folded stacks or the top functions
    Report(ReportArgs),
    /// Print function, file and line for addresses or file offsets
    Symbolize(SymbolizeArgs),
    /// Live view of the functions taking CPU, by self and total samples, like perf top
    Top(TopArgs),
    /// Compare two profiles (recordings or folded files): functions by change, differential flame graph
    Diff(DiffArgs),
    /// Samples per source line and per instruction of a function in a recording, like perf annotate
    Annotate(AnnotateArgs),
    /// Run continuously: whole-host CPU profiles in windows and kernel metrics, served over HTTP (Prometheus, pprof) and pushed to a profile store
    Agent(AgentArgs),
    /// Run a bpftrace-language script or one-liner on the precompiled programs (no compiler)
    Run(RunArgs),
    /// BPF programs: list them, watch their CPU time
    Bpf {
        #[command(subcommand)]
        command: BpfCommand,
    },
    /// Check this machine: which features work here, and why the others do not
    Doctor(DoctorArgs),
    /// Print shell completions
    Completions {
        /// Shell to generate completions for
        shell: clap_complete::Shell,
    },
    /// Write a man page per subcommand (bpfscope.1, bpfscope-count.1, ...) into DIR
    #[command(hide = true)]
    Manpages {
        /// Directory to write the pages into (created if missing)
        dir: PathBuf,
    },
}

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// One JSON object per line: the machine, then a check per feature
    #[arg(long)]
    pub json: bool,

    /// Only the checks that ask the kernel; no trial count and profile
    #[arg(long)]
    pub quick: bool,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The script file (`-` for standard input); its positional parameters ($1, $2, ...) follow it
    #[arg(value_name = "FILE", required_unless_present = "expr")]
    pub file: Option<String>,

    /// Positional parameters of the script ($1, $2, ...)
    #[arg(value_name = "PARAM", allow_hyphen_values = false)]
    pub params: Vec<String>,

    /// The program text instead of a file (the words after it are its parameters)
    #[arg(short = 'e', value_name = "PROGRAM")]
    pub expr: Option<String>,

    /// Run this command (a shell-split line, as bpftrace -c) and stop when it exits
    #[arg(short = 'c', value_name = "CMD")]
    pub command: Option<String>,

    /// User probes (uprobe, USDT) only in this process; stop when it exits
    #[arg(
        short = 'p',
        long = "pid",
        value_name = "PID",
        allow_negative_numbers = true
    )]
    pub pid: Option<i64>,

    /// Stop after this many seconds
    #[arg(long, value_name = "SECS", allow_negative_numbers = true)]
    pub duration: Option<f64>,

    /// bpftrace's JSON output (as bpftrace -f json)
    #[arg(long)]
    pub json: bool,

    /// Allow what changes the system (signal()), as bpftrace's --unsafe
    #[arg(long = "unsafe")]
    pub allow_unsafe: bool,

    /// Output format, as bpftrace's -f: text or json
    #[arg(short = 'f', value_name = "FORMAT", value_parser = ["text", "json"])]
    pub format: Option<String>,

    /// Parse, resolve and lower the script, print the plan, attach nothing
    #[arg(long)]
    pub dry_run: bool,

    /// Say which kernel paths were chosen, and the verifier's statistics
    #[arg(short, long)]
    pub verbose: bool,

    /// Run this command and stop when it exits (like -c, without shell splitting)
    #[arg(last = true, value_name = "CMD")]
    pub cmd: Vec<String>,
}

#[derive(Debug, Args)]
pub struct ProbeArgs {
    /// Probes: tracepoint:SUBSYS:EVENT (t:), uprobe:PATH:FUNC[+OFF] (u:),
    /// uretprobe:PATH:FUNC (ur:), usdt:PATH:PROVIDER:NAME (U:), kprobe:FUNC[+OFF] (k:),
    /// kretprobe:FUNC (kr:), fentry:FUNC (f:), fexit:FUNC (fr:); globs with * and ?
    #[arg(required = true, value_name = "PROBE")]
    pub probes: Vec<String>,

    /// Keep only events matching this expression, evaluated in the kernel,
    /// e.g. 'comm == "bash" && ret < 0'
    #[arg(long, value_name = "EXPR")]
    pub filter: Option<String>,
}

#[derive(Debug, Args)]
pub struct KeyArgs {
    /// Group by these keys: probe, comm, pid, tid, cpu, uid, cgroup, kstack,
    /// ustack or any event field
    #[arg(long = "by", value_name = "KEYS", value_delimiter = ',')]
    pub by: Vec<String>,

    /// Most distinct keys kept in the kernel; further keys are counted as lost
    #[arg(long, value_name = "N", default_value_t = 10240)]
    pub max_keys: u32,

    /// Most distinct stacks kept per stack key (kstack: 1 KiB each, ustack: 4 KiB)
    #[arg(long, value_name = "N", default_value_t = 4096)]
    pub max_stacks: u32,

    /// Write stack counts (with --by kstack or ustack) to FILE.folded or FILE.svg
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct TargetArgs {
    /// Only events of this process (all its threads)
    #[arg(
        short = 'p',
        long = "pid",
        value_name = "PID",
        allow_negative_numbers = true
    )]
    pub pid: Option<i64>,

    /// Stop after this many seconds
    #[arg(long, value_name = "SECS", allow_negative_numbers = true)]
    pub duration: Option<f64>,

    /// Print and reset the results every SECS seconds
    #[arg(long, value_name = "SECS", allow_negative_numbers = true)]
    pub interval: Option<f64>,

    /// Run this command, trace only it and its descendants, stop when it exits
    #[arg(last = true, value_name = "CMD")]
    pub cmd: Vec<String>,
}

#[derive(Debug, Args)]
pub struct OutputArgs {
    /// One JSON object per line instead of text
    #[arg(long)]
    pub json: bool,

    /// Say which kernel paths were chosen and why
    #[arg(short, long)]
    pub verbose: bool,
}

#[derive(Debug, Args)]
pub struct CountArgs {
    #[command(flatten)]
    pub probe: ProbeArgs,
    #[command(flatten)]
    pub keys: KeyArgs,
    #[command(flatten)]
    pub target: TargetArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Args)]
pub struct HistArgs {
    #[command(flatten)]
    pub probe: ProbeArgs,
    /// Numeric field to build the histogram of
    #[arg(long, value_name = "FIELD")]
    pub value: String,
    /// Linear buckets from MIN to MAX in steps of STEP instead of log2 buckets
    #[arg(long, value_name = "MIN:MAX:STEP")]
    pub linear: Option<String>,
    #[command(flatten)]
    pub keys: KeyArgs,
    #[command(flatten)]
    pub target: TargetArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Args)]
pub struct StatsArgs {
    #[command(flatten)]
    pub probe: ProbeArgs,
    /// Numeric field to summarize
    #[arg(long, value_name = "FIELD")]
    pub value: String,
    #[command(flatten)]
    pub keys: KeyArgs,
    #[command(flatten)]
    pub target: TargetArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Args)]
pub struct TraceArgs {
    #[command(flatten)]
    pub probe: ProbeArgs,
    /// Fields to print (default: all fields of the event)
    #[arg(long, value_name = "FIELDS", value_delimiter = ',')]
    pub fields: Vec<String>,
    /// Ring buffer size in KiB (rounded up to a power of two)
    #[arg(long, value_name = "KIB", default_value_t = 4096)]
    pub ringbuf_kib: u32,
    #[command(flatten)]
    pub target: TargetArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Args)]
pub struct LatencyArgs {
    /// A function probe (entry to return, per thread), or START and END probes
    #[arg(required = true, num_args = 1..=2, value_name = "PROBE")]
    pub probes: Vec<String>,
    /// Evaluated where the operation starts when the start probes have the fields, else at the end
    #[arg(long, value_name = "EXPR")]
    pub filter: Option<String>,
    /// Pair START and END on equal values of these fields (default: tid).
    /// A name is a field of the probe on each side when it has one, else
    /// the builtin (args.NAME forces the field); START_FIELD=END_FIELD pairs
    /// differently named fields, e.g. pid=next_pid
    #[arg(long = "match", value_name = "FIELDS", value_delimiter = ',')]
    pub matching: Vec<String>,
    /// Linear buckets in ns from MIN to MAX in steps of STEP instead of log2 buckets
    #[arg(long, value_name = "MIN:MAX:STEP")]
    pub linear: Option<String>,
    /// Write a heatmap (latency bucket x time, one column per interval) to FILE.svg
    #[arg(long, value_name = "FILE.svg")]
    pub heatmap: Option<PathBuf>,
    #[command(flatten)]
    pub keys: KeyArgs,
    #[command(flatten)]
    pub target: TargetArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Subcommand)]
pub enum BpfCommand {
    /// Loaded BPF programs: id, type, name, tag, attach points, runs, ns per run
    List {
        /// One JSON object per program
        #[arg(long)]
        json: bool,
    },
    /// Live view of BPF programs by CPU time (turns run-time statistics on while it runs)
    Top {
        /// Seconds between refreshes
        #[arg(
            long,
            value_name = "SECS",
            default_value_t = 1.0,
            allow_negative_numbers = true
        )]
        interval: f64,
        /// Stop after this many seconds
        #[arg(long, value_name = "SECS", allow_negative_numbers = true)]
        duration: Option<f64>,
        /// One JSON object per program per interval (the default when stdout is not a terminal)
        #[arg(long)]
        json: bool,
        /// Rows shown in the terminal view
        #[arg(short = 'n', long, value_name = "N", default_value_t = 20)]
        rows: usize,
    },
    /// Samples per source line of the BPF programs in a recording
    Annotate {
        /// A recording made by `bpfscope record`
        #[arg(long, value_name = "FILE")]
        recording: PathBuf,
        /// Only this program: its id or name
        #[arg(value_name = "ID|NAME")]
        prog: Option<String>,
        /// One JSON object per program
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// Pattern: a probe with globs (tracepoint:..., uprobe:PATH:FUNC, usdt:PATH:*:*,
    /// kprobe:FUNC with BTF signatures), SUBSYS:EVENT, or an event name
    pub pattern: Option<String>,
    /// Find library names among this process's mappings
    #[arg(short = 'p', long = "pid", value_name = "PID")]
    pub pid: Option<u32>,
    /// Names only, without fields
    #[arg(long)]
    pub names: bool,
    /// One JSON object per probe
    #[arg(long)]
    pub json: bool,
}

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

    /// Stop after this many seconds (Ctrl-C ends earlier) [default: 10,
    /// or with -- CMD when the command exits]
    #[arg(long, value_name = "SECS", allow_negative_numbers = true)]
    pub duration: Option<f64>,

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

    /// Most frames per user stack (1-1024; each stored stack takes 8 bytes per frame)
    #[arg(long, value_name = "N", default_value_t = 127)]
    pub max_depth: u32,

    /// Kernel memory for unwind tables, in MiB (8 bytes per entry; a C library takes about 0.2)
    #[arg(long, value_name = "MIB", default_value_t = 32)]
    pub unwind_memory: u32,

    /// Language runtimes whose frames to name: python (CPython 3.9-3.13
    /// frames read in the kernel), jit (perf maps and jitdump files), none;
    /// comma-separated [default: every one detected]
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_enum)]
    pub lang: Vec<Lang>,

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
    /// Folded stacks and flame graphs: a frame per thread name under each
    /// process (perf's comm sort key); JSON and pprof always carry it
    #[arg(long)]
    pub by_thread: bool,
    #[command(flatten)]
    pub symbols: SymbolArgs,
}

#[derive(Debug, Args)]
pub struct TopArgs {
    /// Samples per second on each CPU (software cpu-clock)
    #[arg(
        short = 'F',
        long = "frequency",
        value_name = "HZ",
        default_value_t = 99
    )]
    pub frequency: u64,

    /// Only this process (all its threads); the view ends when it exits
    #[arg(
        short = 'p',
        long = "pid",
        value_name = "PID",
        allow_negative_numbers = true
    )]
    pub pid: Option<i64>,

    /// Seconds between refreshes
    #[arg(
        long,
        value_name = "SECS",
        default_value_t = 1.0,
        allow_negative_numbers = true
    )]
    pub interval: f64,

    /// The view covers the samples of the last SECS seconds
    #[arg(
        long,
        value_name = "SECS",
        default_value_t = 5.0,
        allow_negative_numbers = true
    )]
    pub window: f64,

    /// Stop after this many seconds
    #[arg(long, value_name = "SECS", allow_negative_numbers = true)]
    pub duration: Option<f64>,

    /// Sort by self or total samples (keys s and t switch in the view)
    #[arg(long, value_enum, default_value_t = TopSort::SelfSamples)]
    pub sort: TopSort,

    /// Rows shown [default: the terminal's height]
    #[arg(short = 'n', long, value_name = "N")]
    pub rows: Option<usize>,

    /// One JSON object per refresh (the default when stdout is not a terminal)
    #[arg(long)]
    pub json: bool,

    /// User-space frames only
    #[arg(long, conflicts_with = "kernel_only")]
    pub user_only: bool,

    /// Kernel frames only
    #[arg(long)]
    pub kernel_only: bool,

    /// Language runtimes whose frames to name (python, jit, none)
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_enum)]
    pub lang: Vec<Lang>,

    #[command(flatten)]
    pub symbols: SymbolArgs,
}

#[derive(Debug, Args)]
pub struct DiffArgs {
    /// The baseline: a recording (`bpfscope record`) or folded stacks
    #[arg(value_name = "BASE")]
    pub base: PathBuf,
    /// The profile compared with it, of the same kind
    #[arg(value_name = "NEW")]
    pub new: PathBuf,
    /// Differential flame graph (.svg: red grew, blue shrank) or difffolded lines (.folded: stack BASE NEW)
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Rows of the table of functions [default: 25, 10 with -o]
    #[arg(short = 'n', long, value_name = "N")]
    pub rows: Option<usize>,
    /// One JSON object per function instead of the table
    #[arg(long)]
    pub json: bool,
    /// Recordings: a frame per thread name under each process
    #[arg(long)]
    pub by_thread: bool,
    #[command(flatten)]
    pub symbols: SymbolArgs,
}

#[derive(Debug, Args)]
pub struct AnnotateArgs {
    /// A recording made by `bpfscope record`
    #[arg(value_name = "RECORDING")]
    pub input: PathBuf,
    /// The function, as profiles name it (demangled)
    #[arg(value_name = "FUNCTION")]
    pub function: String,
    /// One JSON object instead of text
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub symbols: SymbolArgs,
}

/// What `top` sorts by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TopSort {
    #[value(name = "self")]
    SelfSamples,
    #[value(name = "total")]
    Total,
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
    /// Folded stacks and flame graphs: a frame per thread name under each
    /// process (perf's comm sort key); JSON and pprof always carry it
    #[arg(long)]
    pub by_thread: bool,
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

#[derive(Debug, Args)]
pub struct AgentArgs {
    /// TOML configuration; the options below override it. SIGHUP reads it again
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Address to serve /metrics and /debug/pprof on [default: 127.0.0.1:9464]
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,

    /// Profiling frequency per CPU in Hz (0: no profiling) [default: 19]
    #[arg(long, value_name = "HZ")]
    pub profile_hz: Option<u64>,

    /// Length of a profile window in seconds [default: 60]
    #[arg(long, value_name = "SECONDS")]
    pub window: Option<u64>,

    /// A metric, in the syntax of the count/hist/stats/latency commands, e.g.
    /// 'count tracepoint:syscalls:sys_enter_* --by probe,comm'; `--name NAME`
    /// inside it names the metric. Repeat for more
    #[arg(long, value_name = "SPEC")]
    pub metric: Vec<String>,

    /// Directory that keeps each window's profile (pprof) [default: none]
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,

    /// Pyroscope-compatible ingest URL windows are pushed to, e.g. http://pyroscope:4040
    #[arg(long, value_name = "URL")]
    pub push_url: Option<String>,

    /// File holding the bearer token every endpoint but /healthz requires
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
}

/// A language runtime `--lang` can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Lang {
    Python,
    Jit,
    None,
}
