//! Probe stage: what the user named, resolved against this kernel into
//! concrete probes with the fields each one offers.

pub mod binary;
pub mod btf;
pub mod elf;
pub mod glob;
pub mod kfunc;
pub mod sched;
pub mod spec;
pub mod syscalls;
pub mod tracefs;

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use bpfscope_bpf::abi::bs_limits;

use crate::error::Error;
use crate::usage;
pub use spec::{KfuncKind, ProbeSpec};

/// How a field's bytes are interpreted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldKind {
    /// Integer; `size` and `signed` give its C type.
    Int,
    /// Pointer, shown in hex and usable as a number.
    Pointer,
    /// char array of this length in the record.
    InlineStr(u16),
    /// `__data_loc char[]`: string stored after the fixed part of the record.
    DataLocStr,
    /// Pointer to a user-space string (syscall `const char *` arguments).
    UserStr,
    /// Pointer to a kernel string (`char *` arguments of kernel functions).
    KernelStr,
    /// Arrays and other types bpfscope cannot use as keys, values or filters.
    Unsupported,
}

impl FieldKind {
    pub fn is_str(self) -> bool {
        matches!(
            self,
            FieldKind::InlineStr(_)
                | FieldKind::DataLocStr
                | FieldKind::UserStr
                | FieldKind::KernelStr
        )
    }
    pub fn is_num(self) -> bool {
        matches!(self, FieldKind::Int | FieldKind::Pointer)
    }
}

/// A field the user can name in keys, values, filters and trace output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    pub name: String,
    /// The C type, as the format file spells it.
    pub ctype: String,
    pub kind: FieldKind,
    /// Offset in a classic tracepoint record.
    pub offset: u16,
    /// Width of the value in bytes and its signedness, per the C type.
    pub size: u8,
    /// Bytes of an array in the record (`__u8 saddr_v6[16]`: 16); 0 else.
    pub array_bytes: u16,
    pub signed: bool,
    /// Argument slot (see BS_ARG_*) when the probe runs on the raw syscall path.
    pub arg_slot: Option<u8>,
    /// BTF type id (kernel function arguments): members can be read through it.
    pub btf: Option<u32>,
}

/// A syscall tracepoint that the raw_tp sys_enter/sys_exit path can serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyscallTp {
    pub nr: u32,
    pub exit: bool,
}

impl SyscallTp {
    /// Its dispatch slot (`sys_probes`, the dispatcher's `sys_progs`): the
    /// number on entry, BS_SYS_EXIT_BASE + the number on exit.
    pub fn slot(&self) -> u32 {
        if self.exit {
            bs_limits::BS_SYS_EXIT_BASE.0 + self.nr
        } else {
            self.nr
        }
    }
}

/// What a probe attaches to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeKind {
    Tracepoint {
        subsys: String,
        event: String,
        /// Set for syscalls:sys_enter_*/sys_exit_* whose number is known.
        syscall: Option<SyscallTp>,
    },
    /// A user function entry (or return, `ret`) at a file offset.
    Uprobe {
        binary: PathBuf,
        func: String,
        offset: u64,
        ret: bool,
        /// At the function's first instruction (no `+offset`).
        entry: bool,
    },
    /// A USDT probe (all its sites in the binary).
    Usdt {
        binary: PathBuf,
        provider: String,
        name: String,
        /// Guarded by a semaphore (libbpf maintains it through ref_ctr_offset).
        semaphore: bool,
    },
    /// A kernel function's entry (at `offset`) or return.
    Kfunc {
        func: String,
        /// The module defining it (None: vmlinux).
        module: Option<String>,
        offset: u64,
        kind: KfuncKind,
        /// Its prototype, when vmlinux BTF describes it (needed for fentry/fexit).
        sig: Option<btf::FuncSig>,
        /// The C prototype, for listings.
        signature: Option<String>,
        /// Not in the kprobe blacklist.
        kprobe_ok: bool,
    },
}

/// A concrete probe on this kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// Full name, e.g. `tracepoint:syscalls:sys_enter_write`.
    pub name: String,
    pub kind: ProbeKind,
    pub fields: Vec<Field>,
}

impl Probe {
    pub fn field(&self, name: &str) -> Option<&Field> {
        self.fields.iter().find(|f| f.name == name)
    }

    /// Field names, for error messages.
    pub fn field_names(&self) -> String {
        let names: Vec<&str> = self.fields.iter().map(|f| f.name.as_str()).collect();
        if names.is_empty() {
            "none".to_string()
        } else {
            names.join(", ")
        }
    }
}

/// tracefs's mount point and its (subsystem, event) list.
type TracefsEvents = (PathBuf, Vec<(String, String)>);

/// Resolution state shared across specs: tracefs listing and parsed binaries, each read once.
/// Resolves probe specs, keeping what it read (the tracepoint list,
/// binaries' symbols, kernel functions) for the next specs: a script
/// resolves its attach points one by one with one of these.
pub struct Resolver {
    pid: Option<u32>,
    tracefs: Option<TracefsEvents>,
    elves: HashMap<PathBuf, elf::ElfProbes>,
    kfuncs: Option<Rc<kfunc::Catalog>>,
    /// Functions a pattern matched that cannot be probed, with the reason.
    skipped: Vec<(String, String)>,
}

impl Resolver {
    /// `pid` lets library names be found among that process's mappings.
    pub fn new(pid: Option<u32>) -> Resolver {
        Resolver {
            pid,
            tracefs: None,
            elves: HashMap::new(),
            kfuncs: None,
            skipped: Vec::new(),
        }
    }

    /// Like the module's `resolve_all`, with this resolver's caches; what
    /// it skipped is this call's only.
    pub fn resolve_all(&mut self, specs: &[ProbeSpec]) -> Result<Resolved, Error> {
        let first_skip = self.skipped.len();
        let mut seen = BTreeSet::new();
        let mut out = Vec::new();
        for spec in specs {
            let before = self.skipped.len();
            let matched = self.matches(spec)?;
            if matched.is_empty() && self.skipped.len() == before {
                return Err(self.unknown(spec));
            }
            for p in matched {
                if seen.insert(p.name.clone()) {
                    out.push(p);
                }
            }
        }
        let skipped = self.skipped[first_skip..].to_vec();
        if out.is_empty() {
            // Everything matched was skipped: say why, as attaching would.
            let (name, why) = skipped.first().cloned().unwrap_or_default();
            return Err(if skipped.len() == 1 {
                usage!("{name}: {why}")
            } else {
                usage!(
                    "none of the {} matching probes can be attached ({name}: {why})",
                    skipped.len()
                )
            });
        }
        Ok(Resolved {
            probes: out,
            skipped,
        })
    }

    /// As `resolve_all` for one spec, except that a spec nothing matches is
    /// no error but None, so a script can skip it as bpftrace does
    /// (`why_missing` says why). A binary that does not exist is an error.
    pub fn resolve_optional(&mut self, spec: &ProbeSpec) -> Result<Option<Resolved>, Error> {
        let before = self.skipped.len();
        let matched = self.matches(spec)?;
        if matched.is_empty() && self.skipped.len() == before {
            return Ok(None);
        }
        let mut seen = BTreeSet::new();
        let probes = matched
            .into_iter()
            .filter(|p| seen.insert(p.name.clone()))
            .collect();
        Ok(Some(Resolved {
            probes,
            skipped: self.skipped[before..].to_vec(),
        }))
    }

    /// What `resolve_all` says of a spec nothing matches, with the nearest
    /// names. Asked only when shown: scoring every symbol of a large
    /// library took a quarter of a script's start (sslsnoop.bt skips 14
    /// libcrypto functions).
    pub fn why_missing(&mut self, spec: &ProbeSpec) -> String {
        self.unknown(spec).to_string()
    }

    fn kfuncs(&mut self) -> Result<Rc<kfunc::Catalog>, Error> {
        if let Some(c) = &self.kfuncs {
            return Ok(c.clone());
        }
        let c = Rc::new(kfunc::Catalog::read(btf::vmlinux().as_deref())?);
        self.kfuncs = Some(c.clone());
        Ok(c)
    }

    fn kernel_functions(
        &mut self,
        func: &str,
        offset: u64,
        kind: KfuncKind,
    ) -> Result<Vec<Probe>, Error> {
        let cat = self.kfuncs()?;
        let k = btf::vmlinux();
        let prefix = kind.prefix();
        let names: Vec<&String> = if glob::is_glob(func) {
            if cat.from_ftrace {
                // Described by BTF but not traceable: inlined everywhere, or notrace.
                if let Some(k) = &k {
                    let mut gone: Vec<&str> = k
                        .func_names()
                        .filter(|n| glob::matches(func, n) && !cat.funcs.contains_key(*n))
                        .collect();
                    gone.sort_unstable();
                    self.skipped.extend(gone.into_iter().map(|n| {
                        (
                            format!("{prefix}:{n}"),
                            "not traceable (inlined or notrace)".to_string(),
                        )
                    }));
                }
            }
            cat.funcs
                .keys()
                .filter(|n| glob::matches(func, n))
                .collect()
        } else {
            match cat.funcs.get_key_value(func) {
                Some((n, _)) => vec![n],
                None if cat.from_ftrace
                    && k.as_ref().is_some_and(|k| k.func(func).is_some()) =>
                {
                    return Err(usage!(
                        "{prefix}:{func}: the kernel cannot trace this function (inlined or notrace)"
                    ))
                }
                None => Vec::new(),
            }
        };
        Ok(names
            .into_iter()
            .map(|n| {
                let module = cat.funcs.get(n).cloned().flatten();
                // Module functions are described by module BTF; bpfscope reads
                // vmlinux's only, so they get untyped arguments.
                let sig = if module.is_none() {
                    k.as_ref().and_then(|k| k.func(n))
                } else {
                    None
                };
                let signature = sig.as_ref().zip(k.as_ref()).map(|(s, k)| k.signature(n, s));
                let suffix = if offset > 0 {
                    format!("+{offset:#x}")
                } else {
                    String::new()
                };
                Probe {
                    name: format!("{prefix}:{n}{suffix}"),
                    fields: kfunc::fields(
                        if offset > 0 { None } else { sig.as_ref() },
                        kind.is_ret(),
                        kind != KfuncKind::Kretprobe,
                    ),
                    kind: ProbeKind::Kfunc {
                        func: n.clone(),
                        module,
                        offset,
                        kind,
                        sig,
                        signature,
                        kprobe_ok: !cat.blacklist.contains(n.as_str()),
                    },
                }
            })
            .collect())
    }

    fn tracefs(&mut self) -> Result<&TracefsEvents, Error> {
        if self.tracefs.is_none() {
            let root = tracefs::root()?;
            let all = tracefs::events(&root)?;
            self.tracefs = Some((root, all));
        }
        // Filled just above.
        self.tracefs
            .as_ref()
            .ok_or_else(|| Error::Environment("tracefs unavailable".into()))
    }

    fn elf(&mut self, path: &str) -> Result<&elf::ElfProbes, Error> {
        let bin = binary::resolve(path, self.pid)?;
        if !self.elves.contains_key(&bin) {
            let info = elf::read(&bin)?;
            self.elves.insert(bin.clone(), info);
        }
        self.elves
            .get(&bin)
            .ok_or_else(|| usage!("cannot read {}", bin.display()))
    }

    /// Every probe a spec matches (possibly none).
    fn matches(&mut self, spec: &ProbeSpec) -> Result<Vec<Probe>, Error> {
        match spec {
            ProbeSpec::Tracepoint { subsys, event } => {
                let (root, all) = self.tracefs()?;
                let root = root.clone();
                let found: Vec<(String, String)> = all
                    .iter()
                    .filter(|(s, e)| glob::matches(subsys, s) && glob::matches(event, e))
                    .cloned()
                    .collect();
                found.iter().map(|(s, e)| tracepoint(&root, s, e)).collect()
            }
            ProbeSpec::Uprobe {
                path,
                func,
                offset,
                ret,
            } => {
                let info = self.elf(path)?;
                let bin_path = info.path.clone();
                let kind = if *ret { "uretprobe" } else { "uprobe" };
                let mut matched: Vec<elf::Func> = info
                    .funcs
                    .iter()
                    .filter(|f| glob::matches(func, &f.name))
                    .map(|f| {
                        // An IFUNC symbol is its resolver; probe the implementation instead.
                        let mut f = f.clone();
                        if f.ifunc {
                            if let Some(off) = elf::resolve_ifunc(&info.path, &f.name) {
                                f.file_offset = off;
                            }
                        }
                        f
                    })
                    .collect();
                // Aliases share an entry point: one uprobe per address, under its canonical name.
                matched.sort_by(|a, b| {
                    a.file_offset.cmp(&b.file_offset).then_with(|| {
                        elf::canonical_rank(&a.name).cmp(&elf::canonical_rank(&b.name))
                    })
                });
                matched.dedup_by_key(|f| f.file_offset);
                matched.sort_by(|a, b| a.name.cmp(&b.name));
                if *offset > 0 {
                    // An offset must start an instruction of the function: a
                    // breakpoint inside one corrupts it (the program dies of
                    // SIGILL), and past the end it is not this function.
                    let path = info.path.clone();
                    let size_at = |f: &elf::Func| {
                        // A resolved IFUNC's size is its resolver's: take the implementation's.
                        info.funcs
                            .iter()
                            .filter(|g| g.file_offset == f.file_offset && !g.ifunc)
                            .map(|g| g.size)
                            .max()
                            .unwrap_or(if f.ifunc { 0 } else { f.size })
                    };
                    let checked: Vec<(elf::Func, Result<(), String>)> = matched
                        .into_iter()
                        .map(|f| {
                            let r = elf::check_offset(&path, f.file_offset, size_at(&f), *offset);
                            (f, r)
                        })
                        .collect();
                    matched = Vec::new();
                    for (f, r) in checked {
                        match r {
                            Ok(()) => matched.push(f),
                            Err(why) if !glob::is_glob(func) => {
                                return Err(usage!(
                                    "{kind}:{}:{}+{offset:#x}: {why}",
                                    path.display(),
                                    f.name
                                ))
                            }
                            Err(why) => self.skipped.push((
                                format!("{kind}:{}:{}+{offset:#x}", path.display(), f.name),
                                why,
                            )),
                        }
                    }
                }
                // Instructions the kernel accepts but mis-emulates (see
                // elf::misemulated) would corrupt every process running them.
                let at: Vec<u64> = matched.iter().map(|f| f.file_offset + offset).collect();
                let insns = elf::insns_at(&bin_path, &at);
                let mut kept = Vec::new();
                for (f, insn) in matched.into_iter().zip(insns) {
                    let suffix = if *offset > 0 {
                        format!("+{offset:#x}")
                    } else {
                        String::new()
                    };
                    match insn.as_ref().and_then(elf::misemulated) {
                        None => kept.push(f),
                        Some(why) if !glob::is_glob(func) => {
                            let hint = if *ret {
                                "; trace another function's return".to_string()
                            } else {
                                format!(
                                    "; probe another function, or this one past that instruction (+{:#x})",
                                    offset + insn.map_or(0, |i| i.len)
                                )
                            };
                            return Err(usage!(
                                "{kind}:{}:{}{suffix}: {why}{hint}",
                                bin_path.display(),
                                f.name
                            ));
                        }
                        Some(why) => self.skipped.push((
                            format!("{kind}:{}:{}{suffix}", bin_path.display(), f.name),
                            why,
                        )),
                    }
                }
                let matched = kept;
                let info = self
                    .elves
                    .values()
                    .find(|i| i.path == bin_path)
                    .ok_or_else(|| usage!("cannot read {}", bin_path.display()))?;
                Ok(matched
                    .iter()
                    .map(|f| {
                        let suffix = if *offset > 0 {
                            format!("+{offset:#x}")
                        } else {
                            String::new()
                        };
                        Probe {
                            name: format!("{kind}:{}:{}{suffix}", info.path.display(), f.name),
                            kind: ProbeKind::Uprobe {
                                binary: info.path.clone(),
                                func: f.name.clone(),
                                offset: f.file_offset + offset,
                                ret: *ret,
                                entry: *offset == 0,
                            },
                            fields: user_fields(*ret),
                        }
                    })
                    .collect())
            }
            ProbeSpec::Usdt {
                path,
                provider,
                name,
            } => {
                let info = self.elf(path)?;
                let mut seen = BTreeSet::new();
                Ok(info
                    .usdt
                    .iter()
                    .filter(|n| {
                        glob::matches(provider, &n.provider) && glob::matches(name, &n.name)
                    })
                    .filter(|n| seen.insert((n.provider.clone(), n.name.clone())))
                    .map(|n| Probe {
                        name: format!("usdt:{}:{}:{}", info.path.display(), n.provider, n.name),
                        kind: ProbeKind::Usdt {
                            binary: info.path.clone(),
                            provider: n.provider.clone(),
                            name: n.name.clone(),
                            semaphore: n.semaphore.is_some(),
                        },
                        fields: usdt_fields(&n.args),
                    })
                    .collect())
            }
            ProbeSpec::Kfunc { func, offset, kind } => self.kernel_functions(func, *offset, *kind),
        }
    }

    fn unknown(&mut self, spec: &ProbeSpec) -> Error {
        let (wanted, names, prefix): (String, Vec<String>, String) = match spec {
            ProbeSpec::Tracepoint { subsys, event } => {
                let all = self.tracefs().map(|t| t.1.clone()).unwrap_or_default();
                (
                    format!("{subsys}:{event}"),
                    all.iter().map(|(s, e)| format!("{s}:{e}")).collect(),
                    "tracepoint:".into(),
                )
            }
            ProbeSpec::Uprobe {
                path, func, ret, ..
            } => {
                let kind = if *ret { "uretprobe" } else { "uprobe" };
                match self.elf(path) {
                    Ok(info) => (
                        func.clone(),
                        info.funcs.iter().map(|f| f.name.clone()).collect(),
                        format!("{kind}:{}:", info.path.display()),
                    ),
                    Err(e) => return e,
                }
            }
            ProbeSpec::Usdt {
                path,
                provider,
                name,
            } => match self.elf(path) {
                Ok(info) => (
                    format!("{provider}:{name}"),
                    info.usdt
                        .iter()
                        .map(|n| format!("{}:{}", n.provider, n.name))
                        .collect(),
                    format!("usdt:{}:", info.path.display()),
                ),
                Err(e) => return e,
            },
            ProbeSpec::Kfunc { func, kind, .. } => match self.kfuncs() {
                Ok(cat) => (
                    func.clone(),
                    cat.funcs.keys().cloned().collect(),
                    format!("{}:", kind.prefix()),
                ),
                Err(e) => return e,
            },
        };
        let mut scored: Vec<(f64, &String)> = names
            .iter()
            .map(|n| (strsim::jaro_winkler(&wanted, n), n))
            .filter(|(score, _)| *score > 0.85)
            .collect();
        scored.sort_by(|a, b| b.0.total_cmp(&a.0));
        scored.dedup_by(|a, b| a.1 == b.1);
        let hints: Vec<String> = scored
            .into_iter()
            .take(3)
            .map(|(_, n)| format!("{prefix}{n}"))
            .collect();
        if hints.is_empty() {
            usage!("no probe matches '{prefix}{wanted}'; 'bpfscope list' shows them")
        } else {
            usage!(
                "no probe matches '{prefix}{wanted}'; did you mean {}?",
                hints.join(" or ")
            )
        }
    }
}

/// Resolves probe specs into probes, in the order given, without duplicates.
/// `pid` lets library names be found among the target's mappings.
pub fn resolve(specs: &[ProbeSpec], pid: Option<u32>) -> Result<Vec<Probe>, Error> {
    resolve_all(specs, pid).map(|r| r.probes)
}

/// Probes, and what patterns matched that cannot be probed.
#[derive(Debug, Default)]
pub struct Resolved {
    pub probes: Vec<Probe>,
    /// (probe name, reason) of matches skipped.
    pub skipped: Vec<(String, String)>,
}

/// Like `resolve`, also returning what patterns matched that cannot be probed.
pub fn resolve_all(specs: &[ProbeSpec], pid: Option<u32>) -> Result<Resolved, Error> {
    Resolver::new(pid).resolve_all(specs)
}

/// Lists probes matching a pattern: any probe spec, or for tracepoints
/// `SUBSYS:EVENT` or a bare event name without the `tracepoint:` prefix.
pub fn list(pattern: Option<&str>, pid: Option<u32>) -> Result<Vec<Probe>, Error> {
    let spec = match pattern {
        None => ProbeSpec::Tracepoint {
            subsys: "*".into(),
            event: "*".into(),
        },
        Some(p) => match ProbeSpec::parse(p) {
            Ok(spec) => spec,
            Err(_) => match p.split_once(':') {
                Some((s, e)) if !e.contains(':') => ProbeSpec::Tracepoint {
                    subsys: s.into(),
                    event: e.into(),
                },
                Some(_) => return ProbeSpec::parse(p).map(|_| Vec::new()),
                None => ProbeSpec::Tracepoint {
                    subsys: "*".into(),
                    event: p.into(),
                },
            },
        },
    };
    Resolver::new(pid).matches(&spec)
}

/// The return probe of a function entry probe (for latency).
pub fn returning(p: &Probe) -> Option<Probe> {
    match &p.kind {
        ProbeKind::Uprobe {
            binary,
            func,
            offset,
            ret: false,
            entry,
        } => Some(Probe {
            name: format!("uretprobe:{}:{func}", binary.display()),
            kind: ProbeKind::Uprobe {
                binary: binary.clone(),
                func: func.clone(),
                offset: *offset,
                ret: true,
                entry: *entry,
            },
            fields: user_fields(true),
        }),
        ProbeKind::Kfunc {
            func,
            module,
            offset: 0,
            kind: kind @ (KfuncKind::Kprobe | KfuncKind::Fentry),
            sig,
            signature,
            kprobe_ok,
        } => {
            let kind = kind.returning();
            Some(Probe {
                name: format!("{}:{func}", kind.prefix()),
                fields: kfunc::fields(sig.as_ref(), true, kind != KfuncKind::Kretprobe),
                kind: ProbeKind::Kfunc {
                    func: func.clone(),
                    module: module.clone(),
                    offset: 0,
                    kind,
                    sig: sig.clone(),
                    signature: signature.clone(),
                    kprobe_ok: *kprobe_ok,
                },
            })
        }
        _ => None,
    }
}

/// Arguments by the x86-64 calling convention, as signed 64-bit values
/// (without debug info their types are unknown); `retval` at returns.
pub(crate) fn user_fields(ret: bool) -> Vec<Field> {
    let field = |name: String, slot: u8| Field {
        name,
        ctype: "long".into(),
        kind: FieldKind::Int,
        offset: 0,
        size: 8,
        array_bytes: 0,
        signed: true,
        arg_slot: Some(slot),
        btf: None,
    };
    if ret {
        vec![field("retval".into(), bs_limits::BS_ARG_RET.0 as u8)]
    } else {
        (0..6).map(|i| field(format!("arg{i}"), i)).collect()
    }
}

/// USDT arguments as the note's specs describe them.
fn usdt_fields(args: &[elf::UsdtArg]) -> Vec<Field> {
    args.iter()
        .take(bs_limits::BS_MAX_ARGS.0 as usize)
        .enumerate()
        .map(|(i, a)| Field {
            name: format!("arg{i}"),
            ctype: format!("{}{}", if a.signed { "s" } else { "u" }, a.size as u32 * 8),
            kind: FieldKind::Int,
            offset: 0,
            size: a.size,
            array_bytes: 0,
            signed: a.signed,
            arg_slot: Some(i as u8),
            btf: None,
        })
        .collect()
}

fn tracepoint(root: &Path, subsys: &str, event: &str) -> Result<Probe, Error> {
    let raw = tracefs::format(root, subsys, event)?;
    Ok(tracepoint_of(subsys, event, raw))
}

/// A tracepoint probe from the fields of its format file.
pub(crate) fn tracepoint_of(subsys: &str, event: &str, raw: Vec<tracefs::RawField>) -> Probe {
    let syscall = (subsys == "syscalls").then(|| syscall_of(event)).flatten();
    let is_syscall = subsys == "syscalls";
    let fields = raw
        .into_iter()
        .filter(|f| !f.name.starts_with("common_"))
        .map(|f| field_of(f, is_syscall, syscall))
        .collect();
    Probe {
        name: format!("tracepoint:{subsys}:{event}"),
        kind: ProbeKind::Tracepoint {
            subsys: subsys.to_string(),
            event: event.to_string(),
            syscall,
        },
        fields,
    }
}

fn syscall_of(event: &str) -> Option<SyscallTp> {
    let (name, exit) = if let Some(n) = event.strip_prefix("sys_enter_") {
        (n, false)
    } else if let Some(n) = event.strip_prefix("sys_exit_") {
        (n, true)
    } else {
        return None;
    };
    syscalls::number(name).map(|nr| SyscallTp { nr, exit })
}

fn field_of(f: tracefs::RawField, is_syscall: bool, syscall: Option<SyscallTp>) -> Field {
    let kind = if f.ctype.starts_with("__data_loc") {
        if f.ctype.contains("char") {
            FieldKind::DataLocStr
        } else {
            FieldKind::Unsupported
        }
    } else if let Some(n) = f.array_len {
        if f.ctype == "char" {
            FieldKind::InlineStr(n.min(u16::MAX as u32) as u16)
        } else {
            FieldKind::Unsupported
        }
    } else if f.ctype.contains('*') {
        // Syscall inputs declared `const char *` are user strings (paths, names).
        if is_syscall && f.ctype == "const char *" {
            FieldKind::UserStr
        } else {
            FieldKind::Pointer
        }
    } else if matches!(f.size, 1 | 2 | 4 | 8) {
        FieldKind::Int
    } else {
        FieldKind::Unsupported
    };
    let (mut size, mut signed) = (f.size.min(8) as u8, f.signed);
    if is_syscall && kind == FieldKind::Int {
        // Syscall records widen every argument to 8 unsigned bytes; the C type says what it is.
        if let Some((s, sg)) = syscalls::c_int_type(&f.ctype) {
            size = s;
            signed = sg;
        }
    }
    if kind == FieldKind::Pointer {
        signed = false;
    }
    let arg_slot = syscall.and_then(|sc| syscalls::arg_slot(&f.name, f.offset, sc.exit));
    Field {
        array_bytes: f.array_len.map_or(0, |_| f.size),
        name: f.name,
        ctype: f.ctype,
        kind,
        offset: f.offset,
        size,
        signed,
        arg_slot,
        btf: None,
    }
}
