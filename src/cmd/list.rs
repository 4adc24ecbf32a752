//! `bpfscope list`: probes and their fields.

use std::io::{self, BufWriter, Write};

use anyhow::Result;
use serde_json::json;

use crate::cli::ListSettings;
use crate::probe::{self, FieldKind, ProbeKind};

pub fn run(s: ListSettings) -> Result<()> {
    super::require_privileges()?;
    let probes = probe::list(s.pattern.as_deref(), s.pid)?;
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
            let t = if f.ctype.ends_with('*') {
                f.ctype.clone()
            } else {
                format!("{} ", f.ctype)
            };
            let note = if f.kind == FieldKind::Unsupported {
                "  (not usable)"
            } else {
                ""
            };
            writeln!(w, "    {t}{}{note}", f.name)?;
        }
    }
    w.flush()?;
    Ok(())
}
