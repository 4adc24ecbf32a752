//! `bpfscope list`: probes and their fields.

use std::io::{self, BufWriter, Write};

use anyhow::Result;
use serde_json::json;

use crate::cli::ListSettings;
use crate::probe::{self, FieldKind};

pub fn run(s: ListSettings) -> Result<()> {
    super::require_privileges()?;
    let probes = probe::list(s.pattern.as_deref(), s.pid)?;
    let mut w = BufWriter::new(io::stdout().lock());
    for p in &probes {
        if s.json {
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
