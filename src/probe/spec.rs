//! The probe grammar: `KIND:TARGET...`, parsed before anything touches the kernel.

use crate::error::Error;
use crate::usage;

/// A probe as the user wrote it, split into its parts (which may be globs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeSpec {
    /// `tracepoint:SUBSYS:EVENT` or `t:SUBSYS:EVENT`.
    Tracepoint { subsys: String, event: String },
    /// `uprobe:PATH:FUNC[+OFFSET]` (`u:`), `uretprobe:PATH:FUNC` (`ur:`).
    Uprobe {
        path: String,
        func: String,
        offset: u64,
        ret: bool,
    },
    /// `usdt:PATH:PROVIDER:NAME` (`U:`).
    Usdt {
        path: String,
        provider: String,
        name: String,
    },
    /// `kprobe:FUNC[+OFFSET]` (`k:`), `kretprobe:FUNC` (`kr:`),
    /// `fentry:FUNC` (`f:`), `fexit:FUNC` (`fr:`): a kernel function.
    Kfunc {
        func: String,
        offset: u64,
        kind: KfuncKind,
    },
}

/// What the user asked of a kernel function.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum KfuncKind {
    /// Entry; fentry when the kernel allows it, else a kprobe.
    Kprobe,
    /// Return; fexit when the kernel allows it, else a kretprobe.
    Kretprobe,
    /// Entry through fentry only.
    Fentry,
    /// Return through fexit only.
    Fexit,
}

impl KfuncKind {
    pub fn prefix(self) -> &'static str {
        match self {
            KfuncKind::Kprobe => "kprobe",
            KfuncKind::Kretprobe => "kretprobe",
            KfuncKind::Fentry => "fentry",
            KfuncKind::Fexit => "fexit",
        }
    }

    /// At the function's return.
    pub fn is_ret(self) -> bool {
        matches!(self, KfuncKind::Kretprobe | KfuncKind::Fexit)
    }

    /// Only through fentry/fexit.
    pub fn is_fentry(self) -> bool {
        matches!(self, KfuncKind::Fentry | KfuncKind::Fexit)
    }

    /// The same mechanism at the return.
    pub fn returning(self) -> KfuncKind {
        match self {
            KfuncKind::Kprobe | KfuncKind::Kretprobe => KfuncKind::Kretprobe,
            KfuncKind::Fentry | KfuncKind::Fexit => KfuncKind::Fexit,
        }
    }
}

const KINDS: &str = "tracepoint (t), uprobe (u), uretprobe (ur), usdt (U), kprobe (k), kretprobe (kr), fentry (f), fexit (fr)";

fn parse_offset(s: &str, probe: &str) -> Result<u64, Error> {
    let v = match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    };
    v.map_err(|_| usage!("probe '{probe}': bad offset '+{s}'"))
}

impl ProbeSpec {
    /// Parses one probe argument.
    pub fn parse(s: &str) -> Result<Self, Error> {
        let (kind, rest) = s.split_once(':').ok_or_else(|| {
            usage!("probe '{s}': expected KIND:..., e.g. tracepoint:syscalls:sys_enter_write")
        })?;
        match kind {
            "tracepoint" | "t" => {
                let bad = || {
                    usage!("probe '{s}': expected tracepoint:SUBSYS:EVENT, e.g. tracepoint:sched:sched_switch")
                };
                let (subsys, event) = rest.split_once(':').ok_or_else(bad)?;
                if subsys.is_empty() || event.is_empty() || event.contains(':') {
                    return Err(bad());
                }
                Ok(ProbeSpec::Tracepoint {
                    subsys: subsys.to_string(),
                    event: event.to_string(),
                })
            }
            "uprobe" | "u" | "uretprobe" | "ur" => {
                let ret = matches!(kind, "uretprobe" | "ur");
                let bad =
                    || usage!("probe '{s}': expected {kind}:PATH:FUNC, e.g. {kind}:libc:malloc");
                let (path, func) = rest.rsplit_once(':').ok_or_else(bad)?;
                if path.is_empty() || func.is_empty() {
                    return Err(bad());
                }
                let (func, offset) = match func.split_once('+') {
                    Some((f, o)) => {
                        if ret {
                            return Err(usage!(
                                "probe '{s}': uretprobes fire at the return, an offset makes no sense"
                            ));
                        }
                        (f, parse_offset(o, s)?)
                    }
                    None => (func, 0),
                };
                Ok(ProbeSpec::Uprobe {
                    path: path.to_string(),
                    func: func.to_string(),
                    offset,
                    ret,
                })
            }
            "usdt" | "U" => {
                let bad = || usage!("probe '{s}': expected usdt:PATH:PROVIDER:NAME");
                let (rest, name) = rest.rsplit_once(':').ok_or_else(bad)?;
                let (path, provider) = rest.rsplit_once(':').ok_or_else(bad)?;
                if path.is_empty() || provider.is_empty() || name.is_empty() {
                    return Err(bad());
                }
                Ok(ProbeSpec::Usdt {
                    path: path.to_string(),
                    provider: provider.to_string(),
                    name: name.to_string(),
                })
            }
            "kprobe" | "k" | "kretprobe" | "kr" | "fentry" | "f" | "fexit" | "fr" => {
                let kind = match kind {
                    "kprobe" | "k" => KfuncKind::Kprobe,
                    "kretprobe" | "kr" => KfuncKind::Kretprobe,
                    "fentry" | "f" => KfuncKind::Fentry,
                    _ => KfuncKind::Fexit,
                };
                let p = kind.prefix();
                let bad = || usage!("probe '{s}': expected {p}:FUNC, e.g. {p}:vfs_read");
                let (func, offset) = match rest.split_once('+') {
                    Some((f, o)) => {
                        if kind != KfuncKind::Kprobe {
                            return Err(usage!(
                                "probe '{s}': only kprobe: takes an offset (+OFFSET)"
                            ));
                        }
                        (f, parse_offset(o, s)?)
                    }
                    None => (rest, 0),
                };
                let ok = !func.is_empty()
                    && func
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '*' | '?'));
                if !ok {
                    return Err(bad());
                }
                if offset > 0 && super::glob::is_glob(func) {
                    return Err(usage!(
                        "probe '{s}': an offset needs one function, not a pattern"
                    ));
                }
                Ok(ProbeSpec::Kfunc {
                    func: func.to_string(),
                    offset,
                    kind,
                })
            }
            _ => Err(usage!(
                "probe '{s}': unknown probe kind '{kind}' (supported: {KINDS})"
            )),
        }
    }

    /// The same probe at function return (latency pairs entries with returns).
    pub fn returning(&self) -> Option<ProbeSpec> {
        match self {
            ProbeSpec::Uprobe {
                path,
                func,
                offset: 0,
                ret: false,
            } => Some(ProbeSpec::Uprobe {
                path: path.clone(),
                func: func.clone(),
                offset: 0,
                ret: true,
            }),
            ProbeSpec::Kfunc {
                func,
                offset: 0,
                kind: kind @ (KfuncKind::Kprobe | KfuncKind::Fentry),
            } => Some(ProbeSpec::Kfunc {
                func: func.clone(),
                offset: 0,
                kind: kind.returning(),
            }),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{KfuncKind, ProbeSpec};

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

    #[test]
    fn parses_user_probes() {
        assert_eq!(
            ProbeSpec::parse("uprobe:/usr/lib/x86_64-linux-gnu/libc.so.6:str*").unwrap(),
            ProbeSpec::Uprobe {
                path: "/usr/lib/x86_64-linux-gnu/libc.so.6".into(),
                func: "str*".into(),
                offset: 0,
                ret: false
            }
        );
        assert_eq!(
            ProbeSpec::parse("u:./app:parse+0x10").unwrap(),
            ProbeSpec::Uprobe {
                path: "./app".into(),
                func: "parse".into(),
                offset: 16,
                ret: false
            }
        );
        assert!(ProbeSpec::parse("ur:./app:parse+4").is_err());
        assert_eq!(
            ProbeSpec::parse("usdt:./app:myprov:request").unwrap(),
            ProbeSpec::Usdt {
                path: "./app".into(),
                provider: "myprov".into(),
                name: "request".into()
            }
        );
        assert!(ProbeSpec::parse("usdt:./app:request").is_err());
    }

    #[test]
    fn parses_kernel_functions() {
        assert_eq!(
            ProbeSpec::parse("k:tcp_*").unwrap(),
            ProbeSpec::Kfunc {
                func: "tcp_*".into(),
                offset: 0,
                kind: KfuncKind::Kprobe
            }
        );
        assert_eq!(
            ProbeSpec::parse("kprobe:vfs_read+0x8").unwrap(),
            ProbeSpec::Kfunc {
                func: "vfs_read".into(),
                offset: 8,
                kind: KfuncKind::Kprobe
            }
        );
        let fr = ProbeSpec::parse("fr:vfs_read").unwrap();
        assert_eq!(
            fr,
            ProbeSpec::Kfunc {
                func: "vfs_read".into(),
                offset: 0,
                kind: KfuncKind::Fexit
            }
        );
        assert_eq!(fr.returning(), None);
        assert_eq!(
            ProbeSpec::parse("fentry:vfs_read")
                .unwrap()
                .returning()
                .unwrap(),
            fr
        );
        for bad in [
            "kretprobe:f+4",
            "fentry:a+1",
            "kprobe:",
            "kprobe:a b",
            "k:tcp_*+4",
        ] {
            assert!(ProbeSpec::parse(bad).is_err(), "{bad}");
        }
    }
}
