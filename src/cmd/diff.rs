//! `bpfscope diff BASE NEW`: two profiles, each a recording (symbolized
//! here) or folded stacks, compared as functions by the change in their
//! share, a differential flame graph or difffolded lines.

use std::io::{self, BufWriter, Write};
use std::path::Path;

use anyhow::{Context, Result};

use crate::cli::profile::{DiffSettings, Format};
use crate::render::diff::{self, Folded};
use crate::render::printer::write_json;
use crate::report;
use bpfscope_recording as format;
use bpfscope_symbolize::Resolver;
use bpfscope_sys::outfile::PendingFile;

pub fn run(s: DiffSettings) -> Result<()> {
    let output = s
        .output
        .as_ref()
        .map(|(p, f)| Ok::<_, anyhow::Error>((PendingFile::reserve(p)?, *f)))
        .transpose()?;
    let mut resolver = Resolver::new(&s.symbols, false);
    let base = load(&s.base, &mut resolver, s.by_thread)?;
    let new = load(&s.new, &mut resolver, s.by_thread)?;
    for n in resolver.notes() {
        eprintln!("bpfscope: {n}");
    }
    let rows = diff::functions_by_delta(&base, &new);
    let mut limit = s.rows.unwrap_or(25);
    if let Some((file, fmt)) = output {
        let lines = diff::difffolded(&base, &new).context("comparing the stacks")?;
        let mut buf = Vec::with_capacity(1 << 16);
        match fmt {
            Format::Svg => {
                let title = format!("bpfscope diff: {} -> {}", name(&s.base), name(&s.new));
                diff::svg(&lines, &title, &mut buf).context("drawing the flame graph")?;
            }
            _ => {
                for l in &lines {
                    writeln!(buf, "{l}")?;
                }
            }
        }
        let path = file.path().display().to_string();
        file.commit(&buf)
            .with_context(|| format!("writing {path}"))?;
        eprintln!("Wrote {path} ({} stacks)", lines.len());
        limit = s.rows.unwrap_or(10);
    }
    let mut out = BufWriter::new(io::stdout());
    let r = (|| -> io::Result<()> {
        if s.json {
            for r in rows.iter().take(limit) {
                write_json(&mut out, r)?;
            }
        } else {
            let total = |f: &Folded| f.values().sum::<u64>();
            diff::write_table(
                &mut out,
                &rows[..limit.min(rows.len())],
                total(&base),
                total(&new),
            )?;
        }
        out.flush()
    })();
    match r {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        r => r.context("writing the table"),
    }
}

fn name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| p.display().to_string())
}

/// A profile's folded stacks: a recording symbolized, or a folded file.
fn load(p: &Path, resolver: &mut Resolver, by_thread: bool) -> Result<Folded> {
    let bytes = std::fs::read(p).map_err(|e| crate::usage!("{}: cannot read: {e}", p.display()))?;
    if bytes.starts_with(format::MAGIC) {
        let rec = format::decode(p, &bytes).map_err(|e| crate::usage!("{e}"))?;
        let (mut profile, _) = report::recording(&rec, resolver);
        profile.by_thread = by_thread;
        let mut f = Folded::new();
        for l in profile.folded() {
            if let Some((s, n)) = l.rsplit_once(' ') {
                *f.entry(s.to_string()).or_default() += n.parse::<u64>().unwrap_or(0);
            }
        }
        return Ok(f);
    }
    let text = String::from_utf8(bytes).map_err(|_| {
        crate::usage!(
            "{}: neither a bpfscope recording nor folded stacks (text)",
            p.display()
        )
    })?;
    diff::parse_folded(&text).map_err(|e| crate::usage!("{}: {e}", p.display()).into())
}
