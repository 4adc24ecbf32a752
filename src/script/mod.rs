//! `bpfscope run`'s front end: a bpftrace-language script parsed
//! (`parse`), its attach points resolved into probes, each probe's blocks
//! lowered into script-machine code (`types`, `resources`, `codegen`: three passes), and the whole turned into
//! an attach plan the tracing session loads like any other. No compiler
//! runs: the kernel side is the same precompiled programs as the verbs'.

pub mod codegen;
pub mod cpp;
pub mod disasm;
pub mod ir;
pub mod jit;
pub mod resources;
pub mod trigger;
pub mod types;

#[cfg(test)]
mod golden;

// The language's front end is shared with --filter (crate::lang).
pub use crate::lang::{ast, parse};

use std::collections::BTreeSet;

use bpfscope_bpf::abi::{bs_cfg_flags, bs_probe_cfg};

use crate::attach::features::Features;
use crate::attach::plan::{Path, Plan, PlannedProbe, Role, VmImage};
use crate::error::Error;
use crate::probe::{self, Probe, ProbeKind, ProbeSpec};
use crate::usage;
use ast::{visit_stmts, Expr, ExprKind, ProbeBlock, Program, Span, Stmt};
use ir::{LowerError, Lowered, LoweredProbe, Trigger};
use resources::Shared;

/// A script ready to load: the attach plan, and what user space needs to
/// read its maps and records.
pub struct Compiled {
    pub plan: Plan,
    pub lowered: Lowered,
    /// Probes that matched a pattern but cannot be attached (name, why).
    pub skipped: Vec<(String, String)>,
    /// Attach points nothing matched, skipped as bpftrace skips them:
    /// `LINE:COL: reason` each.
    pub warnings: Vec<String>,
}

/// Where an attach point leads.
enum Point {
    Probes(Vec<Probe>),
    Trigger(Trigger, String),
    Clock {
        hz: u64,
        name: String,
    },
    /// A software or hardware perf event (`software:page-faults:100`).
    Perf {
        ty: u32,
        config: u64,
        period: u64,
        name: String,
    },
    /// Nothing matched (a function a library does not have, a tracepoint
    /// this kernel lacks): skipped with a warning, as bpftrace does.
    Missing(ProbeSpec),
}

/// What a script is compiled with besides its text.
#[derive(Debug, Clone)]
pub struct Options {
    /// Positional parameters ($1, $2, ...).
    pub params: Vec<String>,
    /// Narrows library lookups to a process.
    pub pid: Option<u32>,
    /// Keys each map holds (BPFTRACE_MAP_KEYS_MAX).
    pub keys_max: u32,
    /// `--unsafe`: signal() may be used.
    pub allow_unsafe: bool,
}

/// Parses, resolves and lowers a script.
pub fn compile(src: &str, opts: &Options, features: &Features) -> Result<Compiled, Error> {
    let (params, pid) = (opts.params.clone(), opts.pid);
    let program = parse::parse(src).map_err(|e| usage!("{e}"))?;
    let at = |span: Span, msg: String| usage!("{}", LowerError { span, msg }.render(src));
    let mut skipped = Vec::new();
    let mut warnings = Vec::new();
    // One resolver for every attach point: the tracepoint list and binaries
    // are read once, not once per point.
    let mut resolver = probe::Resolver::new(pid);
    // Attach points in order of first appearance, each with the blocks naming it.
    let mut points: Vec<(String, PointDef, Vec<usize>, Span)> = Vec::new();
    for (bi, block) in program.probes.iter().enumerate() {
        // This block's attach points nothing matched: (position, spec, parsed).
        let mut missing: Vec<(Span, &str, ProbeSpec)> = Vec::new();
        for (spec, span) in &block.specs {
            match point(spec, &mut resolver).map_err(|e| at(*span, e))? {
                (Point::Probes(ps), sk) => {
                    skipped.extend(sk);
                    for p in ps {
                        add(&mut points, p.name.clone(), PointDef::Probe(p), bi, *span);
                    }
                }
                (Point::Trigger(t, name), _) => add(
                    &mut points,
                    name.clone(),
                    PointDef::Trigger(t, name),
                    bi,
                    *span,
                ),
                (Point::Clock { hz, name }, _) => add(
                    &mut points,
                    name.clone(),
                    PointDef::Clock(hz, name),
                    bi,
                    *span,
                ),
                (
                    Point::Perf {
                        ty,
                        config,
                        period,
                        name,
                    },
                    _,
                ) => add(
                    &mut points,
                    name.clone(),
                    PointDef::Perf(Path::Perf { ty, config, period }, name),
                    bi,
                    *span,
                ),
                (Point::Missing(ps), _) => missing.push((*span, spec, ps)),
            }
        }
        if let Some((span, _, ps)) = missing.first() {
            let (l, c) = parse::line_col(src, span.start);
            warnings.push(match missing.len() {
                1 => format!("{l}:{c}: skipped: {}", resolver.why_missing(ps)),
                n => format!(
                    "{l}:{c}: skipped {n} attach points nothing matches: {}",
                    missing.iter().map(|m| m.1).collect::<Vec<_>>().join(", ")
                ),
            });
        }
    }
    if points.is_empty() {
        // Nothing at all to run: the first point skipped says why.
        return Err(usage!(
            "{}",
            warnings
                .first()
                .map_or("no attach points".to_string(), |w| w.replacen(
                    "skipped: ",
                    "",
                    1
                ))
        ));
    }
    let mut ctxs = Vec::new();
    for (_, def, blocks, span) in &points {
        let (probe, path, trig) = match def {
            PointDef::Probe(p) => {
                let fields = fields_read(&program, blocks);
                let fields: Vec<&str> = fields.iter().map(String::as_str).collect();
                // A kernel that refuses the probe's path: said at the attach point.
                let path =
                    crate::attach::plan::path_for(p, &fields, features).map_err(|e| match e {
                        Error::Usage(m) | Error::Environment(m) => at(*span, m),
                        e => e,
                    })?;
                (p.clone(), path, None)
            }
            PointDef::Trigger(t, name) => (synthetic(name), Path::Trigger, Some(*t)),
            PointDef::Clock(hz, name) => {
                (synthetic(name), Path::Clock { hz: *hz, cpu: None }, None)
            }
            PointDef::Perf(path, name) => (synthetic(name), path.clone(), None),
        };
        ctxs.push((probe, path, trig, blocks.clone()));
    }
    // Pass 1, types: every map's key and value types, from every probe,
    // to a fixed point (a probe may read what a later one writes).
    let defined = assigned_maps(&program);
    let mut defines = std::collections::HashMap::new();
    for d in &program.defines {
        let e = parse::parse_expr(&d.body)
            .map_err(|e| at(d.span, format!("#define {}: {}", d.name, e.msg)))?;
        defines.insert(d.name.clone(), e);
    }
    let macros = cpp::HeaderMacros::read(&program.includes);
    let shared = || {
        let mut sh = Shared::new(params.clone());
        sh.defined = defined.clone();
        sh.defines = defines.clone();
        sh.macros = macros.clone();
        sh.unsafe_ok = opts.allow_unsafe;
        sh
    };
    let mut probes: Vec<types::ProbeBlocks<'_>> = ctxs
        .iter()
        .map(|(probe, path, _, blocks)| types::ProbeBlocks {
            probe,
            path,
            blocks: blocks.iter().map(|&b| &program.probes[b]).collect(),
        })
        .collect();
    // A block none of whose attach points exist still declares its maps,
    // which print at the end as bpftrace's do (`@: 0` for a count); its
    // code is typed, never lowered.
    let attached: std::collections::HashSet<usize> =
        ctxs.iter().flat_map(|c| c.3.iter().copied()).collect();
    let orphan_probe = synthetic("(skipped)");
    let orphans: Vec<&ProbeBlock> = (0..program.probes.len())
        .filter(|b| !attached.contains(b))
        .map(|b| &program.probes[b])
        .collect();
    if !orphans.is_empty() {
        probes.push(types::ProbeBlocks {
            probe: &orphan_probe,
            path: &Path::Trigger,
            blocks: orphans,
        });
    }
    let mut maps = types::infer(&probes, &shared);
    // A keyless aggregation's buckets are array slots, unless delete()
    // names it (a slot per CPU cannot be deleted from one probe).
    let deleted = deleted_maps(&program, &defines);
    let threads = thread_maps(&program, &defines, features.thread_pidfd);
    for m in &mut maps {
        m.slots = m.keys.is_empty()
            && m.tuple.is_none()
            && matches!(m.kind, types::MapKind::Agg(..))
            && !deleted.contains(&m.name);
        let plain_number = m.keys.len() == 1
            && !m.keys[0].ty.in_slot()
            && m.tuple.is_none()
            && !m.is_member()
            && matches!(m.kind, types::MapKind::Plain(t) if !t.in_slot());
        let how = threads.get(&m.name).copied();
        m.thread = plain_number && how.is_some_and(|(_, field)| !field);
        m.thread_print = m.thread && how.is_some_and(|(p, _)| p);
        m.task_key = plain_number && how.is_some_and(|(_, field)| field);
    }
    // Passes 2 and 3, resources and code: the maps as typed, then each
    // probe's code, its errors now the script's.
    let mut sh = shared();
    sh.maps = maps;
    let mut lowered = Vec::new();
    for (probe, path, trig, blocks) in &ctxs {
        let pc = codegen::ProbeCtx { probe, path };
        let mut l = codegen::Lower::new(&mut sh, &pc);
        for &b in blocks {
            l.block(&program.probes[b])
                .map_err(|e| usage!("{}", e.render(src)))?;
        }
        let code = l.finish();
        lowered.push(LoweredProbe {
            probe: probe.clone(),
            path: path.clone(),
            trigger: *trig,
            code,
        });
    }
    thread_words(&mut lowered, &mut sh.maps);
    cache_maps(&lowered, &mut sh.maps);
    let key_size = sh
        .maps
        .iter()
        .map(|m| m.key_len())
        .max()
        .unwrap_or(ir::KEY_ID_LEN);
    for p in &mut lowered {
        resources::finish_keys(&mut p.code, &sh.maps, key_size);
    }
    let lowered = Lowered {
        probes: lowered,
        srcs: sh.srcs,
        strs: sh.strs,
        maps: sh.maps,
        actions: sh.actions,
        stacks: sh.stacks,
        texts: sh.texts,
        key_size,
    };
    let plan = plan_of(&lowered, opts.keys_max)?;
    Ok(Compiled {
        plan,
        lowered,
        skipped,
        warnings,
    })
}

enum PointDef {
    Probe(Probe),
    Trigger(Trigger, String),
    Clock(u64, String),
    Perf(Path, String),
}

fn add(
    points: &mut Vec<(String, PointDef, Vec<usize>, Span)>,
    name: String,
    def: PointDef,
    block: usize,
    span: Span,
) {
    match points.iter_mut().find(|p| p.0 == name) {
        Some(p) => {
            if !p.2.contains(&block) {
                p.2.push(block);
            }
        }
        None => points.push((name, def, vec![block], span)),
    }
}

/// A probe for a point bpfscope makes itself (BEGIN, END, interval, profile):
/// no target, no fields. (Its kind only names it; its path says how it runs.)
fn synthetic(name: &str) -> Probe {
    Probe {
        name: name.to_string(),
        kind: ProbeKind::Uprobe {
            binary: std::path::PathBuf::new(),
            func: name.to_string(),
            offset: 0,
            ret: false,
            entry: false,
        },
        fields: Vec::new(),
    }
}

/// An attach point as written: what it leads to, and what of a pattern was skipped.
fn point(spec: &str, r: &mut probe::Resolver) -> Result<(Point, Vec<(String, String)>), String> {
    let none = Vec::new();
    match spec {
        "BEGIN" => return Ok((Point::Trigger(Trigger::Begin, "BEGIN".into()), none)),
        "END" => return Ok((Point::Trigger(Trigger::End, "END".into()), none)),
        _ => {}
    }
    let parts: Vec<&str> = spec.split(':').collect();
    let unit_ns = |u: &str| -> Option<u64> {
        Some(match u {
            "s" => 1_000_000_000,
            "ms" => 1_000_000,
            "us" => 1_000,
            "hz" => 0,
            _ => return None,
        })
    };
    match parts.as_slice() {
        ["interval" | "i", unit, n] => {
            let n: u64 = n
                .parse()
                .map_err(|_| format!("{spec}: bad interval '{n}'"))?;
            let ns = match unit_ns(unit) {
                Some(0) if n > 0 => 1_000_000_000 / n,
                Some(ns) if ns > 0 && n > 0 => ns * n,
                _ => {
                    return Err(format!(
                        "{spec}: expected interval:s:N, interval:ms:N or interval:hz:N"
                    ))
                }
            };
            let ms = (ns / 1_000_000).max(1);
            Ok((
                Point::Trigger(Trigger::Interval { ms }, spec.to_string()),
                none,
            ))
        }
        ["profile" | "p", unit, n] => {
            let n: u64 = n.parse().map_err(|_| format!("{spec}: bad rate '{n}'"))?;
            let hz = match unit_ns(unit) {
                Some(0) => n,
                Some(ns) if n > 0 => 1_000_000_000 / (ns * n),
                _ => 0,
            };
            if hz == 0 {
                return Err(format!(
                    "{spec}: expected profile:hz:N, profile:s:N, profile:ms:N or profile:us:N"
                ));
            }
            Ok((
                Point::Clock {
                    hz,
                    name: spec.to_string(),
                },
                none,
            ))
        }
        ["software" | "s", ev, rest @ ..] if rest.len() <= 1 => {
            perf_point(spec, ev, rest.first().copied(), false)
        }
        ["hardware" | "h", ev, rest @ ..] if rest.len() <= 1 => {
            perf_point(spec, ev, rest.first().copied(), true)
        }
        ["watchpoint" | "w", ..] | ["asyncwatchpoint", ..] => Err(format!(
            "{spec}: {} probes are not supported by bpfscope run",
            parts[0]
        )),
        ["rawtracepoint", ..] => Err(format!(
            "{spec}: use tracepoint:SUBSYS:EVENT instead of rawtracepoint"
        )),
        ["kfunc" | "f", rest @ ..] => resolve(&format!("fentry:{}", rest.join(":")), r),
        ["kretfunc" | "fr", rest @ ..] => resolve(&format!("fexit:{}", rest.join(":")), r),
        _ => resolve(spec, r),
    }
}

/// bpftrace's software events: name, alias, perf config, default period.
const SOFTWARE_EVENTS: &[(&str, &str, u32, u64)] = &[
    (
        "alignment-faults",
        "",
        libbpf_sys::PERF_COUNT_SW_ALIGNMENT_FAULTS,
        1,
    ),
    ("bpf-output", "", libbpf_sys::PERF_COUNT_SW_BPF_OUTPUT, 1),
    (
        "context-switches",
        "cs",
        libbpf_sys::PERF_COUNT_SW_CONTEXT_SWITCHES,
        1000,
    ),
    (
        "cpu-clock",
        "cpu",
        libbpf_sys::PERF_COUNT_SW_CPU_CLOCK,
        1_000_000,
    ),
    (
        "cpu-migrations",
        "",
        libbpf_sys::PERF_COUNT_SW_CPU_MIGRATIONS,
        1,
    ),
    ("dummy", "", libbpf_sys::PERF_COUNT_SW_DUMMY, 1),
    (
        "emulation-faults",
        "",
        libbpf_sys::PERF_COUNT_SW_EMULATION_FAULTS,
        1,
    ),
    (
        "major-faults",
        "",
        libbpf_sys::PERF_COUNT_SW_PAGE_FAULTS_MAJ,
        1,
    ),
    (
        "minor-faults",
        "",
        libbpf_sys::PERF_COUNT_SW_PAGE_FAULTS_MIN,
        100,
    ),
    (
        "page-faults",
        "faults",
        libbpf_sys::PERF_COUNT_SW_PAGE_FAULTS,
        100,
    ),
    ("task-clock", "", libbpf_sys::PERF_COUNT_SW_TASK_CLOCK, 1),
];

/// bpftrace's hardware events, as above.
const HARDWARE_EVENTS: &[(&str, &str, u32, u64)] = &[
    (
        "backend-stalls",
        "",
        libbpf_sys::PERF_COUNT_HW_STALLED_CYCLES_BACKEND,
        1_000_000,
    ),
    (
        "branch-instructions",
        "branches",
        libbpf_sys::PERF_COUNT_HW_BRANCH_INSTRUCTIONS,
        100_000,
    ),
    (
        "branch-misses",
        "",
        libbpf_sys::PERF_COUNT_HW_BRANCH_MISSES,
        100_000,
    ),
    (
        "bus-cycles",
        "",
        libbpf_sys::PERF_COUNT_HW_BUS_CYCLES,
        100_000,
    ),
    (
        "cache-misses",
        "",
        libbpf_sys::PERF_COUNT_HW_CACHE_MISSES,
        1_000_000,
    ),
    (
        "cache-references",
        "",
        libbpf_sys::PERF_COUNT_HW_CACHE_REFERENCES,
        1_000_000,
    ),
    (
        "cpu-cycles",
        "cycles",
        libbpf_sys::PERF_COUNT_HW_CPU_CYCLES,
        1_000_000,
    ),
    (
        "frontend-stalls",
        "",
        libbpf_sys::PERF_COUNT_HW_STALLED_CYCLES_FRONTEND,
        1_000_000,
    ),
    (
        "instructions",
        "",
        libbpf_sys::PERF_COUNT_HW_INSTRUCTIONS,
        1_000_000,
    ),
    (
        "ref-cycles",
        "",
        libbpf_sys::PERF_COUNT_HW_REF_CPU_CYCLES,
        1_000_000,
    ),
];

/// `software:EVENT[:PERIOD]` or `hardware:...`: the event, checked by
/// opening it once on CPU 0 (a machine without a PMU refuses hardware
/// events: said here, at the attach point).
fn perf_point(
    spec: &str,
    ev: &str,
    period: Option<&str>,
    hw: bool,
) -> Result<(Point, Vec<(String, String)>), String> {
    let (table, ty, kind) = if hw {
        (HARDWARE_EVENTS, libbpf_sys::PERF_TYPE_HARDWARE, "hardware")
    } else {
        (SOFTWARE_EVENTS, libbpf_sys::PERF_TYPE_SOFTWARE, "software")
    };
    let Some(&(_, _, config, default)) = table
        .iter()
        .find(|(n, a, _, _)| *n == ev || (!a.is_empty() && *a == ev))
    else {
        let names: Vec<&str> = table.iter().map(|e| e.0).collect();
        return Err(format!(
            "{spec}: no {kind} event '{ev}'; the events are {}",
            names.join(", ")
        ));
    };
    let period = match period {
        None => default,
        Some(p) => p
            .parse::<u64>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("{spec}: bad count '{p}': expected a positive integer"))?,
    };
    crate::attach::clock::open_event(0, ty, u64::from(config), period)
        .map_err(|e| format!("{spec}: this kernel refuses it: {e:#}"))?;
    Ok((
        Point::Perf {
            ty,
            config: u64::from(config),
            period,
            name: spec.to_string(),
        },
        Vec::new(),
    ))
}

fn resolve(spec: &str, r: &mut probe::Resolver) -> Result<(Point, Vec<(String, String)>), String> {
    let ps = ProbeSpec::parse(spec).map_err(|e| e.to_string())?;
    match r.resolve_optional(&ps).map_err(|e| e.to_string())? {
        None => Ok((Point::Missing(ps), Vec::new())),
        Some(got) if got.probes.is_empty() => {
            // Everything matched was skipped: say why, as attaching would.
            let (name, why) = got.skipped.first().cloned().unwrap_or_default();
            Err(format!("{name}: {why}"))
        }
        Some(got) => Ok((Point::Probes(got.probes), got.skipped)),
    }
}

/// The maps a `delete()` names anywhere (in a statement, an expression
/// or a `#define`'s body), with their '@'.
fn deleted_maps(
    program: &Program,
    defines: &std::collections::HashMap<String, Expr>,
) -> std::collections::HashSet<String> {
    let mut out = std::collections::HashSet::new();
    let mut f = |e: &Expr| {
        if let ExprKind::Call { name, args } = &e.kind {
            if let Some(ExprKind::Map { name: m, .. }) = args.first().map(|a| &a.kind) {
                if name == "delete" {
                    out.insert(resources::name_or_at(m));
                }
            }
        }
        true
    };
    for b in &program.probes {
        if let Some(p) = &b.predicate {
            p.visit(&mut f);
        }
        visit_stmts(&b.body, &mut f);
    }
    defines.values().for_each(|e| e.visit(&mut f));
    out
}

/// The maps (with their '@') whose only uses are `@m[tid]` (read,
/// written, deleted) and a `clear(@m)` that END's body makes: no user
/// space read can tell a thread's own storage from a hash map keyed by
/// tid (a value of 0 reads as no key does), except where an exited
/// thread's id is reused, which then finds no value where bpftrace's map
/// keeps the old one. With `printed` (the kernel gives descriptors of
/// threads, to read their storage by), also those never cleared, printed
/// at the end (the value's first: true): what living threads hold is
/// read from their storage, what exited ones left from the hash map,
/// where each thread's value goes as it exits. The value's second: some
/// key is a sched event's task (`args.pid` in sched_wakeup...), not tid;
/// those maps are cleared at END, never printed.
fn thread_maps(
    program: &Program,
    defines: &std::collections::HashMap<String, Expr>,
    printed: bool,
) -> std::collections::HashMap<String, (bool, bool)> {
    use resources::name_or_at;
    use std::collections::{HashMap, HashSet};
    let (mut keyed, mut other, mut cleared) = (HashMap::new(), HashSet::new(), HashSet::new());
    let tid_is_macro = defines.contains_key("tid");
    let args_is_macro = defines.contains_key("args");
    for b in &program.probes {
        // The sched events whose task pointers the block's probes all have.
        let events: Option<Vec<&str>> = (!args_is_macro)
            .then(|| b.specs.iter().map(|(s, _)| sched_event(s)).collect())
            .flatten();
        // Every map named (a `for` loop's too, see `visit_stmts`), by how.
        let mut f = |e: &Expr| {
            if let ExprKind::Map { name, keys } = &e.kind {
                let key = match keys.as_slice() {
                    [k] => match &k.kind {
                        ExprKind::Ident(n) if n == "tid" && !tid_is_macro => Some(false),
                        ExprKind::Field { base, field, .. }
                            if matches!(&base.kind, ExprKind::Ident(n) if n == "args")
                                && events.as_ref().is_some_and(|ev| {
                                    ev.iter().all(|e| jit::typed::task_arg(e, field).is_some())
                                }) =>
                        {
                            Some(true)
                        }
                        _ => None,
                    },
                    _ => None,
                };
                match key {
                    Some(field) => *keyed.entry(name_or_at(name)).or_insert(false) |= field,
                    None => {
                        other.insert(name_or_at(name));
                    }
                }
            }
            true
        };
        let end = matches!(b.specs.as_slice(), [(s, _)] if s == "END") && b.predicate.is_none();
        if let Some(p) = &b.predicate {
            p.visit(&mut f);
        }
        for s in &b.body {
            if let (true, Stmt::Expr(e)) = (end, s) {
                if let ExprKind::Call { name, args } = &e.kind {
                    if let [Expr {
                        kind: ExprKind::Map { name: m, keys },
                        ..
                    }] = args.as_slice()
                    {
                        if name == "clear" && keys.is_empty() {
                            cleared.insert(name_or_at(m));
                            continue;
                        }
                    }
                }
            }
            visit_stmts(std::slice::from_ref(s), &mut f);
        }
    }
    // A map named in a macro's body: its uses are not all in sight.
    let mut named = |e: &Expr| {
        if let ExprKind::Map { name, .. } = &e.kind {
            other.insert(name_or_at(name));
        }
        true
    };
    defines.values().for_each(|e| e.visit(&mut named));
    keyed
        .into_iter()
        .filter(|(m, field)| !other.contains(m) && (cleared.contains(m) || (printed && !field)))
        .map(|(m, field)| {
            let p = !cleared.contains(&m);
            (m, (p, field))
        })
        .collect()
}

/// The event of a probe spec naming one sched tracepoint with a typed
/// translation (`tracepoint:sched:sched_switch`, `t:sched:...`).
fn sched_event(spec: &str) -> Option<&str> {
    let rest = spec
        .strip_prefix("tracepoint:sched:")
        .or_else(|| spec.strip_prefix("t:sched:"))?;
    jit::typed::EVENTS.contains(&rest).then_some(rest)
}

/// Marks each read, write and delete of a `thread` map (at most
/// BS_VM_TASK_MAPS, the rest stay hash maps) with BS_VMF_TASK and its word
/// in the thread's storage. Each is the instruction after its key's KEY1;
/// a map used otherwise (never, by the code the passes make), or not at
/// all, is not a thread map.
fn thread_words(probes: &mut [LoweredProbe], maps: &mut [types::MapDef]) {
    use bpfscope_bpf::abi::{bs_insn, bs_limits, bs_vm_flags, bs_vm_op};
    let op = |x: &bs_insn| bs_vm_op(u32::from(x.op));
    // The map whose key instruction `i` builds, and whether the map
    // operation after it uses that key alone.
    let keyed = |code: &[bs_insn], i: usize| -> Option<(usize, bool)> {
        let x = &code[i];
        if !matches!(op(x), bs_vm_op::BS_VM_KEY1 | bs_vm_op::BS_VM_KEYCLR) {
            return None;
        }
        let next = code.get(i + 1).map(op);
        let plain = op(x) == bs_vm_op::BS_VM_KEY1
            && matches!(
                next,
                Some(bs_vm_op::BS_VM_MGET | bs_vm_op::BS_VM_MSET | bs_vm_op::BS_VM_MDEL)
            );
        Some((x.arg as usize, plain))
    };
    let mut used = vec![false; maps.len()];
    for p in probes.iter() {
        for i in 0..p.code.len() {
            if let Some((id, plain)) = keyed(&p.code, i) {
                if let Some(m) = maps.get_mut(id) {
                    m.thread &= plain;
                    m.task_key &= plain;
                    used[id] = true;
                }
            }
        }
    }
    // Thread maps' words first, then task_key maps' (types::thread_word).
    let mut words = 0u32;
    let mut word_of = vec![None; maps.len()];
    for (id, m) in maps.iter_mut().enumerate() {
        m.thread &= used[id] && words < bs_limits::BS_VM_TASK_MAPS.0;
        m.thread_print &= m.thread;
        if m.thread {
            word_of[id] = Some(words);
            words += 1;
        }
    }
    // Only compiled probes use a task_key map's word: its code is not marked.
    for (id, m) in maps.iter_mut().enumerate() {
        m.task_key &= used[id] && words < bs_limits::BS_VM_TASK_MAPS.0;
        words += u32::from(m.task_key);
    }
    for p in probes.iter_mut() {
        for i in 0..p.code.len() {
            if let Some((id, true)) = keyed(&p.code, i) {
                if let Some(&Some(w)) = word_of.get(id) {
                    p.code[i + 1].flags |= bs_vm_flags::BS_VMF_TASK.0 as u8;
                    p.code[i + 1].arg2 = w;
                }
            }
        }
    }
}

/// Which aggregations add through the per-CPU cache (`MapDef::cache`):
/// keyed (not slots), keys of one or two words and no stack (printed keys
/// of stacks are grouped by their frames), and every key built for the
/// map in straight code followed by its aggregation and nothing else (no
/// read, delete or for loop in the kernel, which would miss the cache).
/// At most BS_VM_CACHE_MAPS, in order.
fn cache_maps(probes: &[LoweredProbe], maps: &mut [types::MapDef]) {
    use bpfscope_bpf::abi::{bs_limits, bs_vm_op};
    let mut ok: Vec<bool> = maps
        .iter()
        .map(|m| {
            matches!(m.kind, types::MapKind::Agg(..))
                && !m.slots
                && !m.thread
                && !m.keys.is_empty()
                && m.key_len() % 8 == 0
                && (1..=2).contains(&m.key_words())
                && !m
                    .keys
                    .iter()
                    .any(|p| matches!(p.ty, types::Ty::Stack { .. }))
        })
        .collect();
    let mut used = vec![false; maps.len()];
    for p in probes {
        for (i, x) in p.code.iter().enumerate() {
            if !matches!(
                bs_vm_op(u32::from(x.op)),
                bs_vm_op::BS_VM_KEY1 | bs_vm_op::BS_VM_KEYCLR
            ) {
                continue;
            }
            let id = x.arg as usize;
            // The instruction that uses the key: only key parts, values
            // and buckets may come between, in straight code.
            let user = p.code[i + 1..]
                .iter()
                .map(|y| bs_vm_op(u32::from(y.op)))
                .find(|op| {
                    !matches!(
                        *op,
                        bs_vm_op::BS_VM_KEYNUM
                            | bs_vm_op::BS_VM_KEYSTR
                            | bs_vm_op::BS_VM_LDI
                            | bs_vm_op::BS_VM_SRC
                            | bs_vm_op::BS_VM_SRCSTR
                            | bs_vm_op::BS_VM_MOV
                            | bs_vm_op::BS_VM_ALU
                            | bs_vm_op::BS_VM_BUCKET
                            | bs_vm_op::BS_VM_READ
                    )
                });
            if let Some(o) = ok.get_mut(id) {
                *o &= user == Some(bs_vm_op::BS_VM_AGG);
                used[id] = true;
            }
        }
    }
    let mut n = 0u32;
    for (id, m) in maps.iter_mut().enumerate() {
        m.cache = None;
        if ok[id] && used[id] && n < bs_limits::BS_VM_CACHE_MAPS.0 {
            m.cache = Some(n);
            n += 1;
        }
    }
}

/// The maps some statement assigns (`@m[k] = v`, `@m = count()`, `@m++`),
/// with their '@': the others are undefined.
fn assigned_maps(program: &Program) -> std::collections::HashSet<String> {
    fn walk(body: &[Stmt], out: &mut std::collections::HashSet<String>) {
        for s in body {
            match s {
                Stmt::Assign { target, .. } | Stmt::Incr { target, .. } => {
                    if let ExprKind::Map { name, .. } = &target.kind {
                        out.insert(resources::name_or_at(name));
                    }
                }
                Stmt::If { then, els, .. } => {
                    walk(then, out);
                    walk(els, out);
                }
                Stmt::Unroll { body, .. }
                | Stmt::While { body, .. }
                | Stmt::Block { body, .. }
                | Stmt::For { body, .. } => walk(body, out),
                Stmt::Expr(_)
                | Stmt::Return(_)
                | Stmt::Break(_)
                | Stmt::Continue(_)
                | Stmt::Let { .. } => {}
            }
        }
    }
    let mut out = std::collections::HashSet::new();
    for b in &program.probes {
        walk(&b.body, &mut out);
    }
    out
}

/// The `args` fields the blocks read, as the path choice needs them.
fn fields_read(program: &Program, blocks: &[usize]) -> Vec<String> {
    let mut out = BTreeSet::new();
    for &b in blocks {
        let block: &ProbeBlock = &program.probes[b];
        if let Some(p) = &block.predicate {
            expr_fields(p, &mut out);
        }
        stmts_fields(&block.body, &mut out);
    }
    out.into_iter().collect()
}

fn stmts_fields(body: &[Stmt], out: &mut BTreeSet<String>) {
    visit_stmts(body, &mut |e| fields_in(e, out));
}

fn expr_fields(e: &Expr, out: &mut BTreeSet<String>) {
    e.visit(&mut |x| fields_in(x, out));
}

/// An `args` field path where `e` starts one (then nothing inside it is
/// visited); else true, to visit inside.
fn fields_in(e: &Expr, out: &mut BTreeSet<String>) -> bool {
    if !matches!(e.kind, ExprKind::Field { .. }) {
        return true;
    }
    match e.args_path() {
        Some(path) => {
            out.insert(path);
        }
        None => expr_fields(e.member_chain().0, out),
    }
    false
}

/// The attach plan: one configuration per probe naming its code.
fn plan_of(l: &Lowered, keys_max: u32) -> Result<Plan, Error> {
    let mut code = Vec::new();
    let mut probes = Vec::new();
    for p in &l.probes {
        let mut cfg = bs_probe_cfg {
            flags: bs_cfg_flags::BS_CFG_VM.0,
            code_start: code.len() as u32,
            code_len: p.code.len() as u32,
            ..Default::default()
        };
        if p.trigger.is_some() {
            cfg.flags |= bs_cfg_flags::BS_CFG_SELF.0;
        }
        // Arguments are fetched only for code that reads one (fetching a
        // syscall's six from pt_regs costs a helper call per event).
        if p.path.uses_args() && reads_args(&p.code, &l.srcs) {
            cfg.flags |= bs_cfg_flags::BS_CFG_NEED_ARGS.0;
        }
        code.extend_from_slice(&p.code);
        probes.push(PlannedProbe {
            probe: p.probe.clone(),
            path: p.path.clone(),
            role: Role::Plain,
            cfg,
            event: Vec::new(),
        });
    }
    resources::check_size(code.len()).map_err(Error::Usage)?;
    let mut keys = Vec::new();
    if l.stacks.0 {
        keys.push(stack_slot(false));
    }
    if l.stacks.1 {
        keys.push(stack_slot(true));
    }
    Ok(Plan {
        probes,
        keys,
        key_size: l.key_size,
        strs: l.strs.clone(),
        value: None,
        latency: false,
        max_filter: 0,
        max_keys: 0,
        max_emit: 0,
        vm: Some(VmImage {
            code,
            srcs: l.srcs.clone(),
            maps: l.maps.iter().map(|m| vm_map(m, keys_max)).collect(),
            thread_maps: l.maps.iter().any(|m| m.thread || m.task_key),
            // Words are given in map order (thread_words).
            task_print: (0..l.maps.len())
                .filter(|&id| l.maps[id].thread_print)
                .filter_map(|id| Some((types::thread_word(&l.maps, id)?, id as u32)))
                .collect(),
            cache_maps: l.maps.iter().filter(|m| m.cache.is_some()).count() as u32,
        }),
    })
}

/// A map's kernel map: `keys_max` entries, as bpftrace's, where each
/// bucket of a histogram's key is an entry (bpftrace's key is the map's
/// key and the bucket). A keyless map holds its one key's buckets.
fn vm_map(m: &types::MapDef, keys_max: u32) -> crate::attach::plan::VmMap {
    use crate::attach::plan::VmMapKind;
    let kind = match m.kind {
        types::MapKind::Plain(_) => VmMapKind::Values,
        types::MapKind::Agg(..) if m.slots => VmMapKind::Slots,
        types::MapKind::Agg(..) => VmMapKind::Aggs,
    };
    // Sized for every key's every bucket (keys_max x 66 for a log2
    // histogram), a map cost its hash buckets' 8 MB and 10 ms of the start
    // each; cpuwalk's keyless lhist of 1,002 buckets took 49 ms and 64 MB.
    // A thread map's values are in the threads' storage: its hash map
    // (which END clears) is never written, and holds one entry.
    let entries = if m.thread && !m.thread_print {
        1
    } else if m.keys.is_empty() {
        m.buckets()
    } else {
        keys_max
    };
    crate::attach::plan::VmMap {
        name: m.name.clone(),
        kind,
        entries: entries.max(1),
    }
}

fn reads_args(code: &[bpfscope_bpf::abi::bs_insn], srcs: &[bpfscope_bpf::abi::bs_src]) -> bool {
    use bpfscope_bpf::abi::{bs_src_kind, bs_vm_op};
    let reads = [bs_vm_op::BS_VM_SRC.0 as u8, bs_vm_op::BS_VM_SRCSTR.0 as u8];
    code.iter().any(|i| {
        reads.contains(&i.op)
            && srcs
                .get(i.arg as usize)
                .is_some_and(|s| s.kind == bs_src_kind::BS_SRC_ARG.0 as u8)
    })
}

/// Stack maps are sized by the plan's key slots: a script that reads a
/// stack says so through a slot of that kind (its offset is not used).
fn stack_slot(user: bool) -> crate::attach::plan::Slot {
    crate::attach::plan::Slot {
        name: if user { "ustack" } else { "kstack" }.into(),
        kind: crate::attach::plan::ValueKind::Stack { user },
        off: 0,
        len: 0,
    }
}

#[cfg(test)]
mod task_key_tests {
    use super::*;

    fn maps(src: &str) -> Vec<(String, (bool, bool))> {
        let program = parse::parse(src).unwrap();
        let mut m: Vec<_> = thread_maps(&program, &Default::default(), true)
            .into_iter()
            .collect();
        m.sort();
        m
    }

    const RUNQLAT: &str = "tracepoint:sched:sched_wakeup, tracepoint:sched:sched_wakeup_new { @qtime[args.pid] = nsecs; }
        tracepoint:sched:sched_switch { if (args.prev_state == 0) { @qtime[args.prev_pid] = nsecs; }
            $ns = @qtime[args.next_pid]; if ($ns) { @usecs = hist((nsecs - $ns) / 1000); }
            delete(@qtime[args.next_pid]); }";

    /// runqlat.bt's @qtime is keyed by the tasks of sched events: a task
    /// map where it is cleared at END, never printed; keys of other
    /// fields, other events or wildcards keep it a hash map.
    #[test]
    fn maps_keyed_by_sched_events_tasks_are_task_maps() {
        let cleared = format!("{RUNQLAT} END {{ clear(@qtime); }}");
        assert_eq!(maps(&cleared), [("@qtime".to_string(), (false, true))]);
        assert_eq!(
            maps(&cleared.replace("tracepoint:sched:sched_switch", "t:sched:sched_switch")),
            [("@qtime".to_string(), (false, true))]
        );
        // tid and a task's id name the same storage.
        let mixed = format!("{cleared} tracepoint:sched:sched_waking {{ @qtime[tid] = 1; }}");
        assert_eq!(maps(&mixed), [("@qtime".to_string(), (false, true))]);
        // Printed at the end: a hash map (the end reads no other task's storage).
        assert!(maps(RUNQLAT).is_empty());
        for other in [
            "tracepoint:sched:sched_switch { @q[args.prev_prio] = 1; }",
            "tracepoint:sched:sched_wak* { @q[args.pid] = 1; }",
            "tracepoint:sched:sched_process_exit { @q[args.pid] = 1; }",
            "tracepoint:sched:sched_switch, tracepoint:syscalls:sys_enter_kill { @q[args.pid] = 1; }",
            "tracepoint:sched:sched_switch { @q[args.next_pid] = 1; print(@q); }",
        ] {
            assert!(
                maps(&format!("{other} END {{ clear(@q); }}")).is_empty(),
                "{other}"
            );
        }
    }
}
