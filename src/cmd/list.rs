//! `bpfscope list`: probes and their fields.

use std::io::{self, BufWriter};

use anyhow::Result;

use crate::cli::ListSettings;
use crate::probe::{self, Field, FieldKind, Probe, ProbeKind};
use crate::render::printer::Printer;
use crate::render::record::{ProbeEntry, ProbeField};
use crate::usage;

pub fn run(s: ListSettings) -> Result<()> {
    if s.pattern.as_deref().is_some_and(|p| p.trim().is_empty()) {
        return Err(usage!(
            "list: the pattern is empty; give a probe glob such as 'tracepoint:sched:*', or no pattern for all tracepoints"
        )
        .into());
    }
    bpfscope_sys::require_privileges().map_err(crate::error::Error::from)?;
    let probes = probe::list(s.pattern.as_deref(), s.pid)?;
    if probes.is_empty() {
        // The same wording as the tracing verbs' no-match error.
        return Err(usage!(
            "no probe matches '{}'; 'bpfscope list' shows them",
            s.pattern.as_deref().unwrap_or("tracepoint:*:*")
        )
        .into());
    }
    let mut out =
        Printer::new(s.json, BufWriter::new(io::stdout().lock())).names_only(s.names_only);
    for p in &probes {
        out.probe(&entry(p))?;
    }
    out.flush()?;
    Ok(())
}

/// A probe as `list` shows it. Kernel functions: the BTF prototype says it
/// all (argN are the registers), with the usable arguments' names and types.
fn entry(p: &Probe) -> ProbeEntry {
    let signature = match &p.kind {
        ProbeKind::Kfunc {
            signature, module, ..
        } => Some(match (signature, module) {
            (Some(sig), _) => sig.clone(),
            (None, Some(m)) => format!("(module {m}: no BTF prototype; arguments arg0..arg5)"),
            (None, None) => "(no BTF prototype; arguments arg0..arg5)".to_string(),
        }),
        _ => None,
    };
    let fields = if signature.is_some() {
        p.fields
            .iter()
            .filter(|f| f.kind != FieldKind::Unsupported)
            .map(|f| ProbeField {
                name: f.name.clone(),
                ctype: f.ctype.clone(),
                offset: None,
                size: None,
                signed: None,
                usable: None,
                array_len: None,
            })
            .collect()
    } else {
        p.fields.iter().map(field).collect()
    };
    ProbeEntry {
        probe: p.name.clone(),
        signature,
        fields,
    }
}

fn field(f: &Field) -> ProbeField {
    ProbeField {
        name: f.name.clone(),
        ctype: f.ctype.clone(),
        offset: Some(f.offset),
        size: Some(f.size),
        signed: Some(f.signed),
        usable: Some(f.kind != FieldKind::Unsupported),
        array_len: match f.kind {
            FieldKind::InlineStr(n) => Some(n),
            _ => None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::tracefs::parse_format;
    use crate::render::printer::declaration;

    #[test]
    fn arrays_keep_their_dimension() {
        let text = "\tfield:char prev_comm[16];\toffset:8;\tsize:16;\tsigned:0;\n\
                    \tfield:pid_t prev_pid;\toffset:24;\tsize:4;\tsigned:1;\n\
                    \tfield:const char * filename;\toffset:16;\tsize:8;\tsigned:0;\n";
        let shown: Vec<String> = parse_format(text)
            .into_iter()
            .map(|r| {
                let kind = match r.array_len {
                    Some(n) => FieldKind::InlineStr(n as u16),
                    None if r.ctype.ends_with('*') => FieldKind::Pointer,
                    None => FieldKind::Int,
                };
                declaration(&field(&Field {
                    name: r.name,
                    ctype: r.ctype,
                    kind,
                    offset: r.offset,
                    size: r.size as u8,
                    array_bytes: 0,
                    signed: r.signed,
                    arg_slot: None,
                    btf: None,
                }))
            })
            .collect();
        assert_eq!(
            shown,
            [
                "char prev_comm[16]",
                "pid_t prev_pid",
                "const char *filename"
            ]
        );
    }
}
