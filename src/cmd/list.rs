//! `bpfscope list`: probes and their fields.

use std::io::{self, BufWriter, Write};

use anyhow::Result;
use serde_json::json;

use crate::cli::ListSettings;
use crate::probe::{self, Field, FieldKind, ProbeKind};
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
    let mut w = BufWriter::new(io::stdout().lock());
    for p in &probes {
        // Kernel functions: the BTF prototype says it all (argN are the registers).
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
        if s.json {
            if let Some(sig) = &signature {
                let fields: Vec<_> = p
                    .fields
                    .iter()
                    .filter(|f| f.kind != FieldKind::Unsupported)
                    .map(|f| json!({"name": f.name, "type": f.ctype}))
                    .collect();
                serde_json::to_writer(
                    &mut w,
                    &json!({"probe": p.name, "signature": sig, "fields": fields}),
                )?;
                writeln!(w)?;
                continue;
            }
            let fields: Vec<_> = p
                .fields
                .iter()
                .map(|f| {
                    json!({"name": f.name, "type": f.ctype, "offset": f.offset,
                        "size": f.size, "signed": f.signed, "usable": f.kind != FieldKind::Unsupported})
                })
                .collect();
            serde_json::to_writer(&mut w, &json!({"probe": p.name, "fields": fields}))?;
            writeln!(w)?;
            continue;
        }
        writeln!(w, "{}", p.name)?;
        if s.names_only {
            continue;
        }
        if let Some(sig) = signature {
            writeln!(w, "    {sig}")?;
            continue;
        }
        for f in &p.fields {
            let note = if f.kind == FieldKind::Unsupported {
                "  (not usable)"
            } else {
                ""
            };
            writeln!(w, "    {}{note}", declaration(f))?;
        }
    }
    w.flush()?;
    Ok(())
}

/// A field as the tracepoint format declares it: `char comm[16]`, `const char * filename`.
fn declaration(f: &Field) -> String {
    let t = if f.ctype.ends_with('*') {
        f.ctype.clone()
    } else {
        format!("{} ", f.ctype)
    };
    match f.kind {
        FieldKind::InlineStr(n) => format!("{t}{}[{n}]", f.name),
        _ => format!("{t}{}", f.name),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::tracefs::parse_format;

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
                declaration(&Field {
                    name: r.name,
                    ctype: r.ctype,
                    kind,
                    offset: r.offset,
                    size: r.size as u8,
                    signed: r.signed,
                    arg_slot: None,
                    btf: None,
                })
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
