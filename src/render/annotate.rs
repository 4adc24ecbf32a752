//! `bpfscope annotate`'s output: per source line (heaviest first, with the
//! line's text) and per instruction (in address order, each new source
//! line announced above its instructions), as `perf annotate` prints.

use std::io::{self, Write};

use super::record::{AnnotatedInstruction, AnnotatedLine, FunctionAnnotate};
use crate::report::annotate::Annotation;

pub fn document(a: &Annotation) -> FunctionAnnotate {
    FunctionAnnotate {
        kind: "annotate",
        function: a.function.clone(),
        binary: a.binary.clone(),
        build_id: a.build_id.clone(),
        samples: a.samples,
        profile_samples: a.profile_samples,
        in_kernel: a.in_kernel,
        undecoded: a.undecoded,
        lines: a
            .lines
            .iter()
            .map(|l| AnnotatedLine {
                file: l.file.clone(),
                line: l.line,
                count: l.count,
                source: l.source.clone(),
            })
            .collect(),
        instructions: a
            .instructions
            .iter()
            .map(|i| AnnotatedInstruction {
                offset: format!("{:#x}", i.offset),
                address: format!("{:#x}", i.vaddr),
                text: i.text.clone(),
                count: i.count,
                file: i.file.clone(),
                line: i.line,
            })
            .collect(),
    }
}

fn base(f: &str) -> &str {
    f.rsplit('/').next().unwrap_or(f)
}

pub fn write_text(w: &mut dyn Write, a: &FunctionAnnotate) -> io::Result<()> {
    let pct = |n: u64| {
        if a.samples == 0 {
            0.0
        } else {
            100.0 * n as f64 / a.samples as f64
        }
    };
    writeln!(
        w,
        "{} in {} (build id {}): {} samples, {:.1}% of the profile's {}",
        a.function,
        a.binary,
        a.build_id,
        a.samples,
        if a.profile_samples == 0 {
            0.0
        } else {
            100.0 * a.samples as f64 / a.profile_samples as f64
        },
        a.profile_samples
    )?;
    if a.in_kernel > 0 {
        writeln!(
            w,
            "  and {} samples in the kernel on its behalf (system calls it made)",
            a.in_kernel
        )?;
    }
    if a.undecoded > 0 {
        writeln!(
            w,
            "  {} samples at addresses the file on disk no longer decodes as this function",
            a.undecoded
        )?;
    }
    writeln!(w, "\nBy source line:")?;
    if a.lines.iter().all(|l| l.count == 0) {
        writeln!(
            w,
            "  (no line information: build with -g, or give --debug-dir)"
        )?;
    }
    for l in a.lines.iter().filter(|l| l.count > 0) {
        writeln!(
            w,
            "{:>8} {:>6.2}%  {}:{}  {}",
            l.count,
            pct(l.count),
            base(&l.file),
            l.line,
            l.source.as_deref().unwrap_or("")
        )?;
    }
    writeln!(w, "\nBy instruction:")?;
    let mut at: Option<(Option<&str>, u32)> = None;
    for i in &a.instructions {
        let here = (i.file.as_deref(), i.line);
        if at != Some(here) {
            if let Some(f) = i.file.as_deref() {
                let src = a
                    .lines
                    .iter()
                    .find(|l| l.file == f && l.line == i.line)
                    .and_then(|l| l.source.as_deref())
                    .unwrap_or("");
                writeln!(w, "{:>17}  {}:{}  {src}", "", base(f), i.line)?;
            }
            at = Some(here);
        }
        let count = if i.count > 0 {
            format!("{:>8} {:>6.2}%", i.count, pct(i.count))
        } else {
            format!("{:>8} {:>7}", "", "")
        };
        writeln!(w, "{count}  {:>8}:  {}", &i.address[2..], i.text)?;
    }
    Ok(())
}
