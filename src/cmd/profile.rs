//! `bpfscope profile | record | report | symbolize`: sampling, recordings,
//! offline symbolization and the profile outputs.

use std::io::{self, BufWriter, Read, Write};
use std::path::PathBuf;

use bpfscope_sys::outfile::PendingFile;

use anyhow::{Context, Result};

use crate::cli::profile::{
    parse_addr, Format, ProfileSettings, RecordSettings, ReportSettings, SymSource,
    SymbolizeSettings,
};
use crate::render::pprof;
use crate::render::printer::write_json;
use crate::report::{self, Profile};
use bpfscope_recording::{self as format, Recording};
use bpfscope_symbolize::{kernel, FuncLine, Resolved, Resolver};

pub fn profile(s: ProfileSettings) -> Result<()> {
    // A bad output path fails now, not after the whole run.
    let output = reserve(s.output.as_ref())?;
    let Some(sampled) = sample(&s.sample)? else {
        return Ok(());
    };
    // `sampled` (and the descriptors it holds) lives until symbolizing is done.
    let rec = crate::profile::to_recording(&s.sample, &sampled, true);
    emit(&rec, output, &s.symbols, s.sample.verbose, s.by_thread)
}

pub fn record(s: RecordSettings) -> Result<()> {
    let output = PendingFile::reserve(&s.output)?;
    let Some(sampled) = sample(&s.sample)? else {
        return Ok(());
    };
    let rec = crate::profile::to_recording(&s.sample, &sampled, false);
    output
        .commit(&format::encode(&rec))
        .with_context(|| format!("writing the recording {}", s.output.display()))?;
    let total: u64 = rec.stacks.iter().map(|s| s.count).sum();
    eprintln!(
        "Wrote {} unique stacks ({total} {}) of {} binaries to {}",
        rec.stacks.len(),
        if rec.meta.mode == "offcpu" {
            "off-CPU intervals"
        } else {
            "samples"
        },
        rec.binaries.len(),
        s.output.display()
    );
    report_lost(&rec);
    Ok(())
}

pub fn report(s: ReportSettings) -> Result<()> {
    let output = reserve(s.output.as_ref())?;
    let rec = format::read(&s.input).map_err(|e| crate::usage!("{e}"))?;
    emit(&rec, output, &s.symbols, s.verbose, s.by_thread)
}

/// Samples until the run ends; None when a signal came before sampling
/// started (nothing gathered, said on stderr, exit status 0).
fn sample(s: &crate::cli::profile::SamplingConfig) -> Result<Option<crate::profile::Sampled>> {
    match crate::profile::sample(s) {
        Err(e) if crate::error::is_interrupted(&e) => {
            eprintln!("bpfscope: interrupted before sampling; nothing gathered");
            Ok(None)
        }
        r => {
            // What follows (symbolizing, writing) has nothing partial worth
            // printing: from now on a signal ends the process at once.
            bpfscope_sys::signals::die_on_next();
            if let Ok(sampled) = &r {
                for n in &sampled.runtime_notes {
                    eprintln!("bpfscope: {n}");
                }
            }
            r.map(Some)
        }
    }
}

/// Opens the output file of `-o` before any work, so a bad path fails first.
fn reserve(output: Option<&(PathBuf, Format)>) -> Result<Option<(PendingFile, Format)>> {
    output
        .map(|(p, f)| Ok((PendingFile::reserve(p)?, *f)))
        .transpose()
}

fn report_lost(rec: &Recording) {
    if let Some(l) = rec.meta.lost {
        for line in report::loss_notes(&l, &rec.meta.mode) {
            eprintln!("bpfscope: {line}");
        }
    }
    for line in report::sample_accounting(rec) {
        eprintln!("bpfscope: {line}");
    }
}

/// Symbolizes a recording and writes the chosen output.
fn emit(
    rec: &Recording,
    output: Option<(PendingFile, Format)>,
    symbols: &bpfscope_symbolize::SymbolConfig,
    verbose: bool,
    by_thread: bool,
) -> Result<()> {
    let mut resolver = Resolver::new(symbols, true);
    let (mut profile, reports) = report::recording(rec, &mut resolver);
    profile.by_thread = by_thread;
    if verbose {
        for r in &reports {
            match &r.found {
                Some((p, o)) => eprintln!(
                    "{}: {}/{} offsets symbolized from {} ({o:?})",
                    r.build_id,
                    r.symbolized,
                    r.frames,
                    p.display()
                ),
                None => eprintln!("{}: no symbol file found", r.build_id),
            }
        }
        for l in resolver.debuginfod_log() {
            eprintln!("debuginfod: {l}");
        }
    }
    for n in profile.notes.iter().chain(&resolver.notes()) {
        eprintln!("bpfscope: {n}");
    }
    // With an output file, a short top list still says at a glance where time went.
    let top = match output {
        None => 25,
        Some((file, fmt)) => {
            let path = file.path().to_path_buf();
            write_output(&profile, file, fmt)?;
            eprintln!(
                "Wrote {} ({} {}, {} unique stacks)",
                path.display(),
                profile.total_weight(),
                profile.unit(),
                profile.samples.len()
            );
            10
        }
    };
    let mut out = BufWriter::new(io::stdout());
    match profile.write_top(&mut out, top).and_then(|_| out.flush()) {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        r => r.context("writing the top functions"),
    }
}

fn write_output(p: &Profile, file: PendingFile, fmt: Format) -> Result<()> {
    let mut buf: Vec<u8> = Vec::with_capacity(1 << 16);
    match fmt {
        Format::Folded => p.write_folded(&mut buf)?,
        Format::Svg => p.write_svg(&mut buf).context("drawing the flame graph")?,
        Format::Pprof => pprof::write(p, &mut buf)?,
        Format::Json => write_json(&mut buf, &p.document())?,
    }
    let path = file.path().display().to_string();
    file.commit(&buf).with_context(|| format!("writing {path}"))
}

/// One output line of `symbolize`.
/// One line per address, as `addr2line -f -i` reads innermost first: the
/// innermost function and where the address is in it, then each function
/// it is inlined into with the line of that call, the outer one with the
/// address's offset into it:
/// `0x7b65f _IO_acquire_lock_fct libioP.h:884 (inlined into _IO_wfile_underflow+0x16f wfileops.c:209)`.
fn sym_line(addr: u64, r: Option<&Resolved>) -> String {
    let Some(r) = r else {
        return format!("{addr:#x} ??");
    };
    let named = |i: usize, l: &FuncLine| {
        let mut s = l.function.clone();
        if i == 0 {
            if let Some(off) = r.offset {
                s.push_str(&format!("+{off:#x}"));
            }
        }
        if let Some(f) = &l.file {
            s.push_str(&format!(" {f}:{}", l.line));
        }
        s
    };
    let mut frames = r.lines.iter().enumerate().rev();
    let Some((i, inner)) = frames.next() else {
        return format!("{addr:#x} ??");
    };
    let mut s = format!("{addr:#x} {}", named(i, inner));
    let outer: Vec<String> = frames.map(|(i, l)| named(i, l)).collect();
    if !outer.is_empty() {
        s.push_str(&format!(
            " (inlined into {})",
            outer.join(", inlined into ")
        ));
    }
    s
}

pub fn symbolize(s: SymbolizeSettings) -> Result<()> {
    let addrs = if s.addrs.is_empty() {
        let mut text = String::new();
        io::stdin()
            .read_to_string(&mut text)
            .context("reading addresses from stdin")?;
        text.split_whitespace()
            .map(parse_addr)
            .collect::<Result<Vec<_>, _>>()?
    } else {
        s.addrs.clone()
    };
    // One line per address, with its inline chain.
    let mut resolver = Resolver::new(&s.symbols, true);
    let results: Vec<Option<Resolved>> = match &s.source {
        SymSource::Elf(p) => resolver.offsets(p, &[], &addrs),
        SymSource::BuildId(id) => match resolver.find(id, &[]) {
            Some(f) => resolver.offsets(&f.path, &f.info.segments, &addrs),
            None => {
                // Why it was not found belongs on the one error line.
                let why: String = resolver.notes().iter().map(|n| format!("; {n}")).collect();
                return Err(crate::usage!(
                    "no ELF file with build id {} in the debug directories{}{why}",
                    bpfscope_sys::buildid::hex(id),
                    if s.symbols.debuginfod.is_empty() {
                        " (no debuginfod server given)"
                    } else {
                        " or on the debuginfod servers"
                    }
                )
                .into());
            }
        },
        SymSource::Pid(pid) => resolver.process(*pid, &addrs),
        SymSource::Kernel => {
            if let Some(why) = kernel::addresses_hidden() {
                eprintln!("bpfscope: {why}");
            }
            kernel::symbolize_live(&addrs)
                .into_iter()
                .map(|r| {
                    r.map(|(name, off)| Resolved {
                        lines: vec![FuncLine {
                            function: name,
                            file: None,
                            line: 0,
                        }],
                        offset: Some(off),
                    })
                })
                .collect()
        }
    };
    for n in resolver.notes() {
        eprintln!("bpfscope: {n}");
    }
    let mut out = BufWriter::with_capacity(1 << 16, io::stdout());
    let r = (|| -> io::Result<()> {
        for (a, r) in addrs.iter().zip(&results) {
            writeln!(out, "{}", sym_line(*a, r.as_ref()))?;
        }
        out.flush()
    })();
    match r {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        r => r.context("writing symbols"),
    }
}

/// `annotate RECORDING FUNCTION`.
pub fn annotate(s: crate::cli::profile::AnnotateSettings) -> Result<()> {
    let rec = format::read(&s.input).map_err(|e| crate::usage!("{e}"))?;
    let mut resolver = Resolver::new(&s.symbols, true);
    let a = report::annotate::annotate(&rec, &mut resolver, &s.function)
        .map_err(|e| crate::usage!("{e}"))?;
    for n in resolver.notes() {
        eprintln!("bpfscope: {n}");
    }
    let doc = crate::render::annotate::document(&a);
    let mut out = BufWriter::new(io::stdout());
    let r = if s.json {
        write_json(&mut out, &doc)
    } else {
        crate::render::annotate::write_text(&mut out, &doc)
    };
    match r.and_then(|_| out.flush()) {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        r => r.context("writing the annotation"),
    }
}
