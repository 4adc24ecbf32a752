//! `bpfscope top`: a live view of the functions taking CPU, whole system
//! or one process, refreshed every interval over the samples of the last
//! window, like `perf top`. The sampler stays attached; each refresh reads
//! out (and deletes) what was sampled since the last one and names only
//! the frames not named before.

use std::collections::{HashMap, VecDeque};
use std::io::{self, BufWriter, Write};
use std::mem::MaybeUninit;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::attach::libbpf_log;
use crate::attach::target::Target;
use crate::cli::profile::TopSettings;
use crate::cli::TopSort;
use crate::collect::Stopper;
use crate::profile::live::Live;
use crate::render::printer::{live_top, write_json};
use crate::render::record::{TopFunction, TopRefresh};
use crate::render::term::{next_event, stdout_is_tty, Cbreak, Event};
use crate::report::{self, NameCache};
use bpfscope_symbolize::Resolver;

/// One refresh's samples: per function, self and total.
struct Slice {
    at: Instant,
    samples: u64,
    functions: HashMap<String, (u64, u64)>,
}

pub fn run(s: TopSettings) -> Result<()> {
    libbpf_log::init(false);
    bpfscope_sys::require_privileges().map_err(crate::error::Error::from)?;
    let stopper = Stopper::new(s.duration)?;
    if let Target::Pid(pid) = s.sample.target {
        stopper.watch_pid(pid)?;
    }
    let mut storage = MaybeUninit::uninit();
    let mut live = Live::start(&mut storage, &s.sample)?;
    stopper.start();
    let json = s.json || !stdout_is_tty();
    let mut keys = if json { None } else { Cbreak::enable() };
    eprintln!(
        "Attached: sampling {} CPUs at {} Hz, {}; every {:.1} s, the last {:.1} s{}",
        live.cpus,
        s.sample.frequency,
        match s.sample.target {
            Target::Pid(p) => format!("pid {p}"),
            _ => "all processes".into(),
        },
        s.interval.as_secs_f64(),
        s.window.as_secs_f64(),
        if keys.is_some() {
            "; s/t sort by self/total, q quits"
        } else {
            ""
        }
    );
    // Names are what matters here; inlined frames would cost lookups.
    let mut resolver = Resolver::new(&s.symbols, false);
    let mut cache = NameCache::default();
    let mut slices: VecDeque<Slice> = VecDeque::new();
    let mut sort = s.sort;
    let mut out = BufWriter::new(io::stdout());
    let mut refreshes = 0u64;
    let mut next = Instant::now() + s.interval;
    loop {
        let ev = next_event(&stopper, next, &mut keys, &[live.wait_fd()]);
        match ev {
            Event::Ready => {
                live.pump()?;
                continue;
            }
            Event::Key(b'q' | b'Q') => return Ok(()),
            Event::Key(k @ (b's' | b't')) => {
                sort = if k == b's' {
                    TopSort::SelfSamples
                } else {
                    TopSort::Total
                };
                if refreshes > 0 && !json {
                    draw(&mut out, &s, &live, &slices, sort)?;
                }
                continue;
            }
            Event::Key(_) => continue,
            Event::Tick | Event::Stop => {}
        }
        live.pump()?;
        let rec = live.refresh()?;
        let (profile, _) = report::recording_cached(&rec, &mut resolver, &mut cache);
        drop(rec);
        // What symbolizing freed (a file's symbol index let go) goes back
        // to the system, not to glibc's free lists.
        crate::profile::continuous::give_back_memory();
        let now = Instant::now();
        slices.push_back(Slice {
            at: now,
            samples: profile.total_weight(),
            functions: profile
                .top()
                .into_iter()
                .map(|f| (f.function, (f.self_weight, f.total)))
                .collect(),
        });
        while slices
            .front()
            .is_some_and(|f| now.duration_since(f.at) + Duration::from_millis(100) > s.window)
            && slices.len() > 1
        {
            slices.pop_front();
        }
        refreshes += 1;
        let r = if json {
            let (samples, rows) = merged(&slices, sort, s.rows.unwrap_or(25));
            let seconds = covered(&slices, s.interval);
            write_json(
                &mut out,
                &TopRefresh {
                    kind: "top",
                    refresh: refreshes,
                    seconds,
                    samples,
                    sort: match sort {
                        TopSort::SelfSamples => "self",
                        TopSort::Total => "total",
                    },
                    functions: rows,
                },
            )
            .and_then(|_| out.flush())
        } else {
            draw(&mut out, &s, &live, &slices, sort)
        };
        match r {
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => return Ok(()),
            r => r.context("writing the view")?,
        }
        if ev == Event::Stop {
            return Ok(());
        }
        // A refresh that ran late does not make the next ones hurry.
        next += s.interval;
        if next < Instant::now() {
            next = Instant::now() + s.interval;
        }
    }
}

/// The time the kept refreshes cover.
fn covered(slices: &VecDeque<Slice>, interval: Duration) -> f64 {
    match (slices.front(), slices.back()) {
        (Some(a), Some(b)) => (b.at.duration_since(a.at) + interval).as_secs_f64(),
        _ => 0.0,
    }
}

/// The functions of all kept refreshes, sorted, the first `rows`; and the
/// samples they hold.
fn merged(slices: &VecDeque<Slice>, sort: TopSort, rows: usize) -> (u64, Vec<TopFunction>) {
    let mut all: HashMap<&str, (u64, u64)> = HashMap::new();
    for s in slices {
        for (f, (a, b)) in &s.functions {
            let e = all.entry(f.as_str()).or_default();
            e.0 += a;
            e.1 += b;
        }
    }
    let mut v: Vec<TopFunction> = all
        .into_iter()
        .map(|(f, (a, b))| TopFunction {
            function: f.to_string(),
            self_weight: a,
            total: b,
        })
        .collect();
    v.sort_by(|a, b| {
        let key = |f: &TopFunction| match sort {
            TopSort::SelfSamples => (f.self_weight, f.total),
            TopSort::Total => (f.total, f.self_weight),
        };
        key(b).cmp(&key(a)).then(a.function.cmp(&b.function))
    });
    v.truncate(rows);
    (slices.iter().map(|s| s.samples).sum(), v)
}

/// The terminal's size (rows, columns), or 25 x 120 when unknown.
fn term_size() -> (usize, usize) {
    // SAFETY: winsize is plain data that TIOCGWINSZ fills.
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a winsize for the ioctl to fill.
    let r = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut ws) };
    if r != 0 || ws.ws_row == 0 {
        return (25, 120);
    }
    (ws.ws_row as usize, ws.ws_col as usize)
}

fn draw(
    out: &mut dyn Write,
    s: &TopSettings,
    live: &Live<'_>,
    slices: &VecDeque<Slice>,
    sort: TopSort,
) -> io::Result<()> {
    let (height, width) = term_size();
    let rows = s.rows.unwrap_or(height.saturating_sub(5).max(1));
    let (samples, top) = merged(slices, sort, rows);
    let header = format!(
        "bpfscope top: {samples} samples in the last {:.1} s ({} CPUs at {} Hz, {}), by {} samples",
        covered(slices, s.interval),
        live.cpus,
        s.sample.frequency,
        match s.sample.target {
            Target::Pid(p) => format!("pid {p}"),
            _ => "all processes".into(),
        },
        match sort {
            TopSort::SelfSamples => "self",
            TopSort::Total => "total",
        }
    );
    live_top(out, &header, samples, &top, width)?;
    out.flush()
}
