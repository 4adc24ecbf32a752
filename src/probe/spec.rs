//! The probe grammar: `KIND:TARGET...`, parsed before anything touches the kernel.

use crate::error::Error;
use crate::usage;

/// A probe as the user wrote it, split into its parts (which may be globs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeSpec {
    /// `tracepoint:SUBSYS:EVENT` or `t:SUBSYS:EVENT`.
    Tracepoint { subsys: String, event: String },
}

impl ProbeSpec {
    /// Parses one probe argument.
    pub fn parse(s: &str) -> Result<Self, Error> {
        let (kind, rest) = s.split_once(':').ok_or_else(|| {
            usage!("probe '{s}': expected KIND:..., e.g. tracepoint:syscalls:sys_enter_write")
        })?;
        match kind {
            "tracepoint" | "t" => {
                let (subsys, event) = rest.split_once(':').ok_or_else(|| {
                    usage!("probe '{s}': expected tracepoint:SUBSYS:EVENT, e.g. tracepoint:sched:sched_switch")
                })?;
                if subsys.is_empty() || event.is_empty() || event.contains(':') {
                    return Err(usage!(
                        "probe '{s}': expected tracepoint:SUBSYS:EVENT, e.g. tracepoint:sched:sched_switch"
                    ));
                }
                Ok(ProbeSpec::Tracepoint {
                    subsys: subsys.to_string(),
                    event: event.to_string(),
                })
            }
            _ => Err(usage!(
                "probe '{s}': unknown probe kind '{kind}' (supported: tracepoint, t)"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ProbeSpec;

    #[test]
    fn parses_tracepoints() {
        assert_eq!(
            ProbeSpec::parse("t:syscalls:sys_enter_*").unwrap(),
            ProbeSpec::Tracepoint {
                subsys: "syscalls".into(),
                event: "sys_enter_*".into()
            }
        );
        assert!(ProbeSpec::parse("tracepoint:syscalls").is_err());
        assert!(ProbeSpec::parse("nonsense").is_err());
        assert!(ProbeSpec::parse("foo:bar:baz").is_err());
    }
}
