//! `bpfscope run`: a bpftrace-language script on the generic programs.
//! The script is lowered (script/), loaded and attached like the verbs'
//! probes; BEGIN runs, then records (printf, time, join, print, clear,
//! exit) are formatted as they arrive, intervals fire on time; at the end
//! END runs and the maps left are printed as bpftrace prints them.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::io::Write;
use std::mem::MaybeUninit;
use std::os::unix::ffi::OsStrExt;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use libbpf_rs::{MapCore, MapFlags, RingBufferBuilder};

use crate::attach::features::Features;
use crate::attach::libbpf_log;
use crate::attach::session::{LoadConfig, Session};
use crate::attach::target::{GatedChild, Target};
use crate::cli::RunSettings;
use crate::collect::aggregate::AggVal;
use crate::collect::{stacks, Lost, StopReason, Stopper};
use crate::render::bpftrace::{self as fmt, Agg, MapData, Value};
use crate::script::ir::{Action, Arg, Lowered, Trigger, JOIN_MAX, STR_MAX};
use crate::script::types::{member_map, thread_word, AggFn, MapKind, TShape, Ty};
use crate::script::{self, trigger};
use bpfscope_bpf::abi::{
    bs_cache_ent, bs_event_hdr, bs_key_hdr, bs_limits, bs_note, bs_vm_task_vals,
};
use bpfscope_sys::pod;

const MAX_STACKS: u32 = 4096;
const RINGBUF: u32 = 4 << 20;
/// Longest wait for records: a command's exit or a signal is seen within it.
const POLL: Duration = Duration::from_millis(10);
const HDR: usize = std::mem::size_of::<bs_event_hdr>();
/// Steps one run of a probe takes at most.
const STEPS: u32 = bs_limits::BS_VM_STEPS.0;
const KHDR: usize = std::mem::size_of::<bs_key_hdr>();

pub fn run(s: RunSettings) -> Result<()> {
    libbpf_log::init(s.verbose);
    let features = Features::detect();
    let pid = s.pid;
    let opts = script::Options {
        params: s.params.clone(),
        pid,
        keys_max: s.map_keys_max,
        allow_unsafe: s.allow_unsafe,
    };
    let compiled = script::compile(&s.source, &opts, &features).map_err(|e| match e {
        crate::error::Error::Usage(m) => crate::error::Error::Usage(format!("{}:{m}", s.origin)),
        e => e,
    })?;
    for w in &compiled.warnings {
        eprintln!("bpfscope: warning: {}:{w}", s.origin);
    }
    let plan = &compiled.plan;
    let low = &compiled.lowered;
    if s.dry_run || s.verbose {
        for p in &plan.probes {
            eprintln!(
                "{}: {} ({} instructions)",
                p.probe.name,
                p.path.describe(),
                p.cfg.code_len
            );
        }
    }
    // Probes whose code has a BPF translation run as programs of their
    // own; the others on the script machine.
    if s.dry_run {
        let chosen = script::jit::choose(low, &script::jit::env(low));
        if s.verbose {
            for l in script::jit::describe(low, &chosen) {
                eprintln!("{l}");
            }
            // The generated code, as the golden files hold it.
            eprint!("{}", crate::script::disasm::listing(low));
            for (p, c) in low.probes.iter().zip(&chosen) {
                if let Ok(prog) = c {
                    eprint!(
                        "\n{} (BPF):\n{}",
                        p.probe.name,
                        script::jit::listing(low, prog)
                    );
                }
            }
        }
        return Ok(());
    }
    bpfscope_sys::require_privileges().map_err(crate::error::Error::from)?;
    let stopper = Stopper::new(s.duration)?;
    let (gated, _) = match &s.command {
        Some(t) => GatedChild::for_target(t)?,
        None => (None, None),
    };
    if let Some(p) = pid {
        stopper.watch_pid(p)?;
    }
    // Which probes compile is known before the object loads (see
    // jit::assumed); their programs are emitted again once the BTF is read.
    let mut chosen = script::jit::choose(low, &script::jit::assumed());
    let ok = |chosen: &[Result<script::jit::Prog, String>]| -> Vec<usize> {
        (chosen.iter().enumerate())
            .filter(|(_, c)| c.is_ok())
            .map(|(i, _)| i)
            .collect()
    };
    let mut load = LoadConfig {
        target: Target::All,
        // The script's maps are kernel maps of their own (vm_aggs, vm_vals, vm_slots).
        max_keys: None,
        max_stacks: (low.stacks.0 || low.stacks.1).then_some(MAX_STACKS),
        ringbuf_bytes: Some(RINGBUF),
        verbose: s.verbose,
        compiled: ok(&chosen),
    };
    let (mut storage, mut again) = (MaybeUninit::uninit(), MaybeUninit::uninit());
    // The kernel's BTF (comm's offset, the registers' cast) is read while
    // the object loads: 5 ms of a 30 ms start.
    let (session, env) = std::thread::scope(|sc| {
        let env = sc.spawn(|| script::jit::env(low));
        let session = Session::load(&mut storage, plan, &load, &features);
        (session, env.join())
    });
    let mut session = session.map_err(crate::error::refused)?;
    let env = env.map_err(|_| anyhow::anyhow!("reading the kernel's BTF failed"))?;
    chosen = script::jit::choose(low, &env);
    let mut compiled_progs = script::jit::load::load_all(&session, &mut chosen);
    if ok(&chosen) != load.compiled {
        // A probe left on the machine after all (its program refused, or
        // comm's offset not found) needs the generic program for its path,
        // which was left out: the object is loaded again with it, and the
        // others' programs against its maps.
        drop(compiled_progs);
        drop(session);
        load.compiled = ok(&chosen);
        session =
            Session::load(&mut again, plan, &load, &features).map_err(crate::error::refused)?;
        // Maps in the tasks' storage go back to their hash maps where a
        // probe naming them is on the machine now.
        script::jit::settle(low, &env, &mut chosen);
        compiled_progs = script::jit::load::load_all(&session, &mut chosen);
    }
    if let Some(bss) = session.skel.maps.bss_data.as_deref_mut() {
        bss.vm_t0 = bpfscope_sys::monotonic_ns();
    }
    session.set_own_programs(
        plan,
        &compiled_progs.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
    )?;
    if s.verbose {
        for l in script::jit::describe(low, &chosen) {
            eprintln!("{l}");
        }
    }
    let upid = pid.map_or(-1, |p| p as i32);
    // BEGIN runs before the other probes are attached: its records come
    // first in the ring buffer, as its output comes first in bpftrace.
    for i in trigger::of(low, Trigger::Begin) {
        session.fire(i)?;
    }
    // Ctrl-C while attaching ends the run as it would a moment later:
    // END runs and the maps print (bpftrace does the same).
    let mut att = match session.attach(plan, false, upid, true) {
        Err(e) if crate::error::is_interrupted(&e) => crate::attach::session::Attached::default(),
        r => r.map_err(crate::error::refused)?,
    };
    let (mut progs, mut links) = (Vec::new(), Vec::new());
    for (i, fd) in compiled_progs {
        let Ok(prog) = &chosen[i] else { continue };
        match script::jit::load::attach(&fd, &prog.hook) {
            Ok(l) => links.push(l),
            Err(e) => att.skipped.push((
                plan.probes[i].probe.name.clone(),
                format!("attaching its compiled program: {e}"),
            )),
        }
        progs.push(fd);
    }
    session.adopt(progs, links);
    let mut out = Out::new(s.json);
    // As bpftrace counts: BEGIN and END are probes too.
    let n = plan.probes.len().saturating_sub(att.skipped.len());
    att.skipped.extend(compiled.skipped.iter().cloned());
    crate::attach::session::report_skipped(&att, s.verbose);
    out.attached(n)?;
    stopper.start();
    let mut ctx = RunCtx {
        session: &mut session,
        low,
        out,
        exit: false,
        keys_max: s.map_keys_max,
        // bpftrace's limit on what cat() prints, and its variable.
        cat_max: std::env::var("BPFTRACE_CAT_BYTES_MAX")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(10240),
        syms: RefCell::new(SymCache::new(&low.texts)),
        kept: HashMap::new(),
        storage: RefCell::new(None),
    };
    let result = ctx.main_loop(&stopper, gated);
    match result {
        Err(e) if crate::error::is_broken_pipe(&e) => Ok(()),
        r => r,
    }
}

/// Where output goes: text as bpftrace prints it, or its JSON lines.
struct Out {
    json: bool,
    w: std::io::BufWriter<std::io::Stdout>,
}

impl Out {
    fn new(json: bool) -> Out {
        Out {
            json,
            w: std::io::BufWriter::new(std::io::stdout()),
        }
    }

    fn attached(&mut self, n: usize) -> Result<()> {
        if self.json {
            writeln!(self.w, "{}", fmt::json_attached(n))?;
        } else {
            writeln!(
                self.w,
                "Attaching {n} probe{}...",
                if n == 1 { "" } else { "s" }
            )?;
        }
        self.w.flush()?;
        Ok(())
    }

    fn text(&mut self, t: &str, json: impl FnOnce(&str) -> String) -> Result<()> {
        if self.json {
            writeln!(self.w, "{}", json(t))?;
        } else {
            self.w.write_all(&crate::filter::raw::encode(t))?;
        }
        Ok(())
    }
}

struct RunCtx<'a, 'obj> {
    session: &'a mut Session<'obj>,
    low: &'a Lowered,
    out: Out,
    exit: bool,
    keys_max: u32,
    cat_max: u64,
    syms: RefCell<SymCache>,
    /// Per keyless aggregation (by map id), the buckets zero() kept:
    /// they print as 0, as a hash map's zeroed keys do, until clear().
    kept: HashMap<u32, BTreeSet<u32>>,
    /// The living threads' storage (tid, value), read once at the end for
    /// every thread map printed there (a walk of /proc and a descriptor
    /// per thread), before any of their hash maps.
    storage: RefCell<Option<ThreadValues>>,
}

/// Each living thread's id and its value in a task storage map.
type ThreadValues = Vec<(u32, Vec<u8>)>;

impl RunCtx<'_, '_> {
    fn main_loop(&mut self, stopper: &Stopper, gated: Option<GatedChild>) -> Result<()> {
        let queue: RefCell<VecDeque<Vec<u8>>> = RefCell::new(VecDeque::new());
        let mut builder = RingBufferBuilder::new();
        builder.add(&self.session.skel.maps.events, |data: &[u8]| {
            queue.borrow_mut().push_back(data.to_vec());
            0
        })?;
        let rb = builder.build().context("setting up the ring buffer")?;
        // Interrupted before the command was let go: it never runs (the
        // gate's drop kills it), and the run ends at once, with END.
        let early = bpfscope_sys::signals::interrupted();
        if let Some(g) = gated {
            if early {
                drop(g);
            } else {
                stopper.watch_child(g.release()?);
            }
        }
        let mut intervals = trigger::Intervals::new(self.low, Instant::now());
        if !early {
            loop {
                rb.consume().context("reading records")?;
                self.drain(&queue)?;
                if self.exit {
                    break;
                }
                if let Some(reason) = stopper.poll() {
                    if reason == StopReason::OutputClosed {
                        return Ok(());
                    }
                    break;
                }
                for i in intervals.take_due(Instant::now()) {
                    self.session.fire(i)?;
                }
                let wait = intervals.wait(Instant::now()).unwrap_or(POLL).min(POLL);
                match rb.poll(wait) {
                    Err(e) if e.kind() == libbpf_rs::ErrorKind::Interrupted => {}
                    r => r.context("reading records")?,
                }
            }
        }
        // The probes stop before END runs, so what END prints and clears is
        // what the maps hold at the end, as in bpftrace: they are told to
        // (at once), and detached in the background at the very end.
        if let Some(bss) = self.session.skel.maps.bss_data.as_deref_mut() {
            // SAFETY: a volatile store into the mapped .bss, read by the programs.
            unsafe { std::ptr::write_volatile(&mut bss.vm_stopped, 1) };
        }
        rb.consume().context("reading records")?;
        self.drain(&queue)?;
        for i in trigger::of(self.low, Trigger::End) {
            self.session.fire(i)?;
        }
        rb.consume().context("reading records")?;
        self.drain(&queue)?;
        self.print_all()?;
        let lost = Lost::of_session(self.session)?;
        let mut parts = Vec::new();
        for (i, n) in counts(&self.session.skel.maps.vm_cut, self.low.probes.len()) {
            parts.push(format!(
                "{n} runs of {} cut short at {STEPS} steps",
                self.low.probes[i].probe.name
            ));
        }
        for (i, n) in counts(&self.session.skel.maps.vm_full, self.low.maps.len()) {
            let m = &self.low.maps[i];
            parts.push(if m.thread && m.thread_print {
                // Either: a thread refused storage, or exited threads'
                // values filled the hash map.
                format!(
                    "{n} updates of {} (no thread storage, or full at {} keys)",
                    m.name, self.keys_max
                )
            } else if m.thread {
                format!("{n} updates of {} (no thread storage)", m.name)
            } else {
                format!("{n} updates of {} (full at {} keys)", m.name, self.keys_max)
            });
        }
        self.out.w.flush()?;
        report_lost(lost, parts);
        self.session.detach_in_background();
        Ok(())
    }

    fn drain(&mut self, queue: &RefCell<VecDeque<Vec<u8>>>) -> Result<()> {
        loop {
            let Some(rec) = queue.borrow_mut().pop_front() else {
                break;
            };
            self.record(&rec)?;
        }
        self.out.w.flush()?;
        Ok(())
    }

    /// One record from the kernel: what its action says.
    fn record(&mut self, rec: &[u8]) -> Result<()> {
        let Some(hdr) = pod::read::<bs_event_hdr>(rec) else {
            return Ok(());
        };
        if hdr.probe & (bs_note::BS_NOTE_CUT.0 | bs_note::BS_NOTE_FULL.0) != 0 {
            self.notice(hdr.probe);
            return Ok(());
        }
        let data = rec.get(HDR..).unwrap_or(&[]);
        let Some(action) = self.low.actions.get(hdr.probe as usize).cloned() else {
            return Ok(());
        };
        match action {
            Action::Printf { fmt: f, args } => {
                let vals: Vec<Value> = args.iter().map(|a| self.arg_value(data, *a)).collect();
                let text = fmt::printf(&f, &vals).map_err(|e| anyhow::anyhow!("printf: {e}"))?;
                self.out.text(&text, fmt::json_printf)?;
            }
            Action::System { fmt: f, args } => {
                let vals: Vec<Value> = args.iter().map(|a| self.arg_value(data, *a)).collect();
                let cmd = fmt::printf(&f, &vals).map_err(|e| anyhow::anyhow!("system: {e}"))?;
                // Run as bpftrace runs it (popen): by the shell, its output
                // in order with the script's, its errors on stderr.
                self.out.w.flush()?;
                let run = std::process::Command::new("/bin/sh")
                    .arg("-c")
                    .arg(std::ffi::OsStr::from_bytes(&crate::filter::raw::encode(
                        &cmd,
                    )))
                    .stdin(std::process::Stdio::null())
                    .stderr(std::process::Stdio::inherit())
                    .output();
                match run {
                    Ok(o) => {
                        let text = crate::filter::raw::decode(&o.stdout).into_owned();
                        self.out.text(&text, fmt::json_system)?;
                    }
                    Err(e) => eprintln!("bpfscope: system(): cannot run /bin/sh: {e}"),
                }
            }
            Action::Cat { fmt: f, args } => {
                let vals: Vec<Value> = args.iter().map(|a| self.arg_value(data, *a)).collect();
                let path = fmt::printf(&f, &vals).map_err(|e| anyhow::anyhow!("cat: {e}"))?;
                let path =
                    std::ffi::OsStr::from_bytes(&crate::filter::raw::encode(&path)).to_os_string();
                match cat_file(&path, self.cat_max) {
                    Ok(b) => {
                        let text = crate::filter::raw::decode(&b).into_owned();
                        self.out.text(&text, fmt::json_cat)?;
                    }
                    Err(e) => {
                        eprintln!(
                            "bpfscope: cat(): failed to open file '{}': {}",
                            path.to_string_lossy(),
                            e.raw_os_error()
                                .map_or_else(|| e.to_string(), |n| errno_text(i64::from(n)))
                        );
                        // Nothing printed, but bpftrace's JSON has the line.
                        self.out.text("", fmt::json_cat)?;
                    }
                }
            }
            Action::Time { fmt: f } => {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos() as i128);
                let text = fmt::time(f.as_deref(), now);
                // An empty time (strftime overflow) prints nothing, as in bpftrace.
                if !text.is_empty() {
                    self.out.text(&text, fmt::json_time)?;
                }
            }
            Action::Join { sep } => {
                let parts: Vec<String> = (0..JOIN_MAX)
                    .map(|i| cstr(data.get(i * STR_MAX..(i + 1) * STR_MAX).unwrap_or(&[])))
                    .take_while(|s| !s.is_empty())
                    .collect();
                let text = format!("{}\n", parts.join(&sep));
                self.out.text(&text, fmt::json_printf)?;
            }
            Action::Print { map, top, div } => {
                let m = self.read_map(map)?;
                self.write_map(&m, top as usize, div)?;
            }
            Action::PrintValue { arg } => {
                let v = self.arg_value(data, arg);
                if self.out.json {
                    writeln!(self.out.w, "{}", fmt::json_value(&v))?;
                } else {
                    let mut s = String::new();
                    fmt::print_value(&mut s, &v);
                    self.out.w.write_all(&crate::filter::raw::encode(&s))?;
                }
            }
            Action::Clear { map } => self.clear_map(map)?,
            Action::Zero { map } => self.zero_map(map)?,
            Action::Exit => self.exit = true,
        }
        Ok(())
    }

    /// A limit the kernel side hit, said at once (the first time for each
    /// probe or map; the end of the run says how often).
    fn notice(&mut self, note: u32) {
        let i = (note & bs_note::BS_NOTE_INDEX.0) as usize;
        // Said after what the script printed before it.
        let _ = self.out.w.flush();
        if note & bs_note::BS_NOTE_CUT.0 != 0 {
            let name = self
                .low
                .probes
                .get(i)
                .map_or("?", |p| p.probe.name.as_str());
            eprintln!(
                "bpfscope: warning: {name}: a run was cut short at {STEPS} steps, the most one run of a probe takes; its effects so far stay"
            );
        } else if let Some(m) = self.low.maps.get(i).filter(|m| m.thread && m.thread_print) {
            eprintln!(
                "bpfscope: warning: {}: the kernel gave a thread no storage for it, or the values exited threads left fill it ({} keys): updates are dropped and counted",
                m.name, self.keys_max
            );
        } else if let Some(m) = self.low.maps.get(i).filter(|m| m.thread) {
            eprintln!(
                "bpfscope: warning: {}: the kernel gave a thread no storage for it (out of memory, or a probe run inside another): its updates are dropped and counted",
                m.name
            );
        } else if let Some(m) = self.low.maps.get(i) {
            eprintln!(
                "bpfscope: warning: {} is full ({} keys): new keys are dropped (BPFTRACE_MAP_KEYS_MAX sets the size)",
                m.name, self.keys_max
            );
        }
    }

    /// A record's argument.
    fn arg_value(&self, data: &[u8], a: Arg) -> Value {
        let b = data.get(a.off..).unwrap_or(&[]);
        let names = match a.ty {
            Ty::Stack { user, .. } => self.name_stacks([(user, word(b))]),
            _ => StackNames::new(),
        };
        value_of(a.ty, b, &names, &self.syms)
    }

    /// The frames of stacks by (user?, id), named in one batch, as bpftrace
    /// names them: kernel frames `function+offset` from the return
    /// addresses, starting at the traced code (not at the script machine's
    /// frames, nor the BPF dispatch of a raw tracepoint or trampoline);
    /// user frames `function+offset` through their build ids (after the
    /// process has gone too), `0x...` where nothing names them.
    fn name_stacks(&self, ids: impl IntoIterator<Item = (bool, u64)>) -> StackNames {
        let (mut kernel, mut user) = (BTreeSet::new(), BTreeSet::new());
        for (u, id) in ids {
            // A negative id is a stack that could not be taken.
            if let Ok(id) = u32::try_from(id as i64) {
                if u {
                    user.insert(id);
                } else {
                    kernel.insert(id);
                }
            }
        }
        let maps = &self.session.skel.maps;
        let mut out = StackNames::new();
        if kernel.is_empty() && user.is_empty() {
            // Naming reads kallsyms: not for maps without stacks.
            return out;
        }
        let frames: Vec<(u32, Vec<u64>)> = kernel
            .iter()
            .filter_map(|&id| {
                let b = maps
                    .kstacks
                    .lookup(&id.to_ne_bytes(), MapFlags::ANY)
                    .ok()??;
                Some((id, bpfscope_bpf::stack::kernel_frames(&b)))
            })
            .collect();
        let all: Vec<u64> = frames.iter().flat_map(|(_, v)| v.iter().copied()).collect();
        let mut names = if all.is_empty() {
            Vec::new()
        } else {
            bpfscope_symbolize::kernel::symbolize_live(&all)
        }
        .into_iter();
        for (id, ips) in frames {
            let named = ips
                .iter()
                .map(|&ip| match names.next().flatten() {
                    Some((name, off)) => (ip, format!("{name}+{off}")),
                    None => (ip, format!("{ip:#x}")),
                })
                .skip_while(|(_, f)| is_dispatch_frame(f))
                .collect();
            out.insert((false, id), named);
        }
        if !user.is_empty() {
            let table = stacks::user_with_offsets(
                &maps.ustacks,
                &user,
                &bpfscope_symbolize::SymbolConfig::default(),
            );
            for (id, frames) in table {
                let named = frames
                    .into_iter()
                    .map(|f| {
                        match f
                            .strip_prefix("[unknown ")
                            .and_then(|x| x.strip_suffix(']'))
                        {
                            Some(hex) => {
                                let ip = u64::from_str_radix(hex.trim_start_matches("0x"), 16)
                                    .unwrap_or(0);
                                (ip, hex.to_string())
                            }
                            None => (0, f),
                        }
                    })
                    .collect();
                out.insert((true, id), named);
            }
        }
        out
    }

    /// A map's entries, decoded, as the formatter takes them. Stacks in
    /// keys are named together, in one batch.
    fn read_map(&self, id: u32) -> Result<MapData> {
        let def = &self.low.maps[id as usize];
        let map = self.map_of(id);
        let keys: Vec<Vec<u8>> = if def.slots {
            // A keyless aggregation's array: every bucket, as a key header.
            (0..def.buckets()).map(slot_key).collect()
        } else {
            map.keys().collect()
        };
        let stack_ids = keys.iter().flat_map(|k| {
            let data = k.get(KHDR..).unwrap_or(&[]);
            def.keys.iter().filter_map(move |p| match p.ty {
                Ty::Stack { user, .. } => Some((user, word(data.get(p.off..).unwrap_or(&[])))),
                _ => None,
            })
        });
        let names = self.name_stacks(stack_ids);
        let decode_key = |k: &[u8]| -> Vec<Value> {
            let data = k.get(KHDR..).unwrap_or(&[]);
            def.keys
                .iter()
                .map(|p| {
                    value_of(
                        p.ty,
                        data.get(p.off..p.off + p.len).unwrap_or(&[]),
                        &names,
                        &self.syms,
                    )
                })
                .collect()
        };
        // Keys whose stacks print the same (cut to their frame limit) are
        // one key, as in bpftrace, whose stack map holds only that many.
        let has_stack = def.keys.iter().any(|p| matches!(p.ty, Ty::Stack { .. }));
        let group = |k: &[u8]| -> Vec<u8> {
            if has_stack {
                format!("{:?}", decode_key(k)).into_bytes()
            } else {
                k.get(KHDR..).unwrap_or(&[]).to_vec()
            }
        };
        let mut entries = Vec::new();
        match def.kind {
            MapKind::Plain(ty) => {
                // A living thread's value is its storage's (one that
                // exited left its own in the hash map, under its id: a
                // thread that took that id since holds the key's value).
                // Read first: a thread leaving meanwhile is then in one or
                // both, with the same value, never in neither.
                let living = self.thread_rows(id);
                let mut rows = BTreeMap::new();
                for k in map.keys() {
                    if let Some(v) = map.lookup(&k, MapFlags::ANY).context("reading a map")? {
                        rows.insert(k, v);
                    }
                }
                rows.extend(living);
                let mut seen = BTreeSet::new();
                for (k, v) in rows {
                    if has_stack && !seen.insert(group(&k)) {
                        continue;
                    }
                    let first = value_of(ty, &v, &names, &self.syms);
                    let value = match &def.tuple {
                        None => first,
                        Some(shape) => self.tuple_value(id, shape, &k, first, &names),
                    };
                    entries.push((decode_key(&k), Agg::Scalar(value)));
                }
            }
            MapKind::Agg(f, signed) => {
                // Key data (without the bucket) -> per-bucket totals.
                let mut rows = Vec::with_capacity(keys.len());
                for k in keys {
                    let bucket = u32::from_ne_bytes(k[..4].try_into().unwrap_or([0; 4]));
                    let at = if def.slots { &k[..4] } else { &k[..] };
                    let Some(per_cpu) = map
                        .lookup_percpu(at, MapFlags::ANY)
                        .context("reading a map")?
                    else {
                        continue;
                    };
                    // An array's bucket exists once counted (or kept by zero()).
                    if def.slots
                        && !counted(&per_cpu)
                        && !self.kept.get(&id).is_some_and(|b| b.contains(&bucket))
                    {
                        continue;
                    }
                    let vals = per_cpu.iter().map(|c| AggVal::from_bytes(c)).collect();
                    rows.push((k, vals));
                }
                // What compiled probes added through the map's cache: the
                // key is in the hash map too (its first run put it there).
                rows.extend(self.cached_rows(id)?.into_iter().map(|(k, v)| (k, vec![v])));
                let mut acc: BTreeMap<Vec<u8>, KeyTotals> = BTreeMap::new();
                for (k, vals) in rows {
                    let bucket = u32::from_ne_bytes(k[..4].try_into().unwrap_or([0; 4]));
                    let e = acc
                        .entry(group(&k))
                        .or_insert_with(|| (decode_key(&k), BTreeMap::new(), AggVal::default()));
                    for v in vals {
                        *e.1.entry(bucket).or_insert(0) += v.count;
                        e.2.merge(v, signed);
                    }
                }
                for (_, (key, buckets, t)) in acc {
                    let agg = match f {
                        AggFn::Count => Agg::Count(t.count),
                        AggFn::Sum => Agg::Sum(t.sum),
                        AggFn::Avg => Agg::Avg {
                            count: t.count,
                            sum: t.sum,
                        },
                        AggFn::Stats => Agg::Stats {
                            count: t.count,
                            sum: t.sum,
                        },
                        AggFn::Min => Agg::Min(by_sign(t.min, signed)),
                        AggFn::Max => Agg::Max(by_sign(t.max, signed)),
                        AggFn::Hist => Agg::Hist(buckets),
                        AggFn::Lhist { min, max, step } => Agg::Lhist {
                            min,
                            max,
                            step,
                            buckets,
                        },
                    };
                    entries.push((key, agg));
                }
            }
        }
        // A count() map without keys always has its value (bpftrace's is an
        // array): never updated, it prints `@c: 0`.
        if entries.is_empty()
            && def.keys.is_empty()
            && matches!(def.kind, MapKind::Agg(AggFn::Count, _))
        {
            entries.push((Vec::new(), Agg::Count(0)));
        }
        Ok(MapData {
            name: def.name.clone(),
            entries,
        })
    }

    /// The entries of map `id`'s per-CPU cache (`MapDef::cache`), each
    /// one CPU's, with the key as the hash map holds it (bucket, epoch 0,
    /// the map's id, the key's words, zeros to the key's size).
    fn cached_rows(&self, id: u32) -> Result<Vec<(Vec<u8>, AggVal)>> {
        let def = &self.low.maps[id as usize];
        let Some(slot) = def.cache else {
            return Ok(Vec::new());
        };
        let words = def.key_words();
        let size = self.map_of(id).key_size() as usize;
        let Some(per_cpu) = self
            .session
            .skel
            .maps
            .vm_cache
            .lookup_percpu(&slot.to_ne_bytes(), MapFlags::ANY)
            .context("reading a map's cache")?
        else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for cpu in &per_cpu {
            for raw in cpu.chunks_exact(std::mem::size_of::<bs_cache_ent>()) {
                let Some(e) = pod::read::<bs_cache_ent>(raw) else {
                    continue;
                };
                if e.used != 1 || e.val.count == 0 {
                    continue;
                }
                let k = hash_key(e.bucket, id, e.k.iter().take(words), size);
                out.push((k, AggVal::from(e.val)));
            }
        }
        Ok(out)
    }

    /// The values of thread map `id` (printed at the end) that living
    /// threads hold in their own storage, each with the key the hash map
    /// would hold it under (bucket and epoch 0, the map's id, the tid,
    /// zeros to the key's size) and its 64-byte value.
    fn thread_rows(&self, id: u32) -> Vec<(Vec<u8>, Vec<u8>)> {
        let def = &self.low.maps[id as usize];
        if !(def.thread && def.thread_print) {
            return Vec::new();
        }
        let Some(w) = thread_word(&self.low.maps, id as usize) else {
            return Vec::new();
        };
        let size = self.map_of(id).key_size() as usize;
        let mut out = Vec::new();
        let mut storage = self.storage.borrow_mut();
        let storage = storage.get_or_insert_with(|| {
            crate::collect::threads::values(&self.session.skel.maps.vm_task)
        });
        for (tid, raw) in storage.iter() {
            let Some(t) = pod::read::<bs_vm_task_vals>(raw) else {
                continue;
            };
            let (Some(&v), true) = (t.v.get(w as usize), t.set & (1 << w) != 0) else {
                continue;
            };
            let k = hash_key(0, id, [&u64::from(*tid)], size);
            let mut val = v.to_ne_bytes().to_vec();
            val.resize(bs_limits::BS_VAL_MAX.0 as usize, 0);
            out.push((k, val));
        }
        out
    }

    /// Empties map `id`'s per-CPU cache, on every CPU (clear() and zero():
    /// the keys stay in the hash map for zero(), with their values zeroed
    /// there). Runs adding meanwhile may be lost, as with the hash map's
    /// keys deleted one by one.
    fn clear_cache(&self, id: u32) {
        let Some(slot) = self.low.maps[id as usize].cache else {
            return;
        };
        let m = &self.session.skel.maps.vm_cache;
        let key = slot.to_ne_bytes();
        if let Ok(Some(per_cpu)) = m.lookup_percpu(&key, MapFlags::ANY) {
            let zero: Vec<Vec<u8>> = per_cpu.iter().map(|c| vec![0u8; c.len()]).collect();
            m.update_percpu(&key, &zero, MapFlags::ANY).ok();
        }
    }

    /// The tuple of map of tuples `id` under key `k` (whose first member,
    /// in map `id` itself, is `first`): the other members from their maps.
    fn tuple_value(
        &self,
        id: u32,
        shape: &TShape,
        k: &[u8],
        first: Value,
        names: &StackNames,
    ) -> Value {
        let name = &self.low.maps[id as usize].name;
        let mut vals = vec![first];
        for i in 1..shape.leaves() {
            let member = member_map(name, i);
            let v = self
                .low
                .maps
                .iter()
                .position(|m| m.name == member)
                .and_then(|mid| {
                    let MapKind::Plain(ty) = self.low.maps[mid].kind else {
                        return None;
                    };
                    // The same key, with the member map's id in its first word.
                    let mut key = k.to_vec();
                    key.get_mut(KHDR..KHDR + 8)?
                        .copy_from_slice(&(mid as u64).to_ne_bytes());
                    let map = self.map_of(mid as u32);
                    let b = map.lookup(&key, MapFlags::ANY).ok().flatten();
                    Some(value_of(
                        ty,
                        b.as_deref().unwrap_or(&[0; 64]),
                        names,
                        &self.syms,
                    ))
                });
            vals.push(v.unwrap_or(Value::Int(0)));
        }
        fn build(shape: &TShape, vals: &mut std::vec::IntoIter<Value>) -> Value {
            match shape {
                TShape::Value => vals.next().unwrap_or(Value::Int(0)),
                TShape::Tuple(m) => Value::Tuple(m.iter().map(|s| build(s, vals)).collect()),
            }
        }
        build(shape, &mut vals.into_iter())
    }

    /// A map and, for a map of tuples, its member maps.
    fn with_members(&self, id: u32) -> Vec<u32> {
        let def = &self.low.maps[id as usize];
        let n = def.tuple.as_ref().map_or(1, TShape::leaves);
        (0..n)
            .filter_map(|i| {
                let name = member_map(&def.name, i);
                self.low.maps.iter().position(|m| m.name == name)
            })
            .map(|i| i as u32)
            .collect()
    }

    /// clear(): the map loses its entries (a count() without keys then
    /// reads 0, as bpftrace's array does).
    fn clear_map(&mut self, id: u32) -> Result<()> {
        for id in self.with_members(id) {
            if self.low.maps[id as usize].slots {
                self.kept.remove(&id);
                self.zero_slots(id, false);
                continue;
            }
            self.clear_cache(id);
            let map = self.map_of(id);
            let keys: Vec<Vec<u8>> = map.keys().collect();
            for k in keys {
                // A key another CPU deleted meanwhile is not an error.
                let _ = map.delete(&k);
            }
        }
        Ok(())
    }

    /// zero(): every entry kept, its value zero.
    fn zero_map(&mut self, id: u32) -> Result<()> {
        for id in self.with_members(id) {
            self.zero_one(id);
        }
        Ok(())
    }

    /// A keyless aggregation's buckets zeroed on every CPU; with `keep`,
    /// those counted so far are kept (see `kept`).
    fn zero_slots(&mut self, id: u32, keep: bool) {
        let map = self.map_of(id);
        let mut seen = BTreeSet::new();
        for b in 0..self.low.maps[id as usize].buckets() {
            let k = b.to_ne_bytes();
            let Ok(Some(per_cpu)) = map.lookup_percpu(&k, MapFlags::ANY) else {
                continue;
            };
            if !counted(&per_cpu) {
                continue;
            }
            seen.insert(b);
            let zero: Vec<Vec<u8>> = per_cpu.iter().map(|v| vec![0u8; v.len()]).collect();
            // Events may land between the read and the write, as with a
            // hash map's keys deleted one by one.
            map.update_percpu(&k, &zero, MapFlags::ANY).ok();
        }
        if keep {
            self.kept.entry(id).or_default().extend(seen);
        }
    }

    fn zero_one(&mut self, id: u32) {
        if self.low.maps[id as usize].slots {
            self.zero_slots(id, true);
            return;
        }
        let plain = matches!(self.low.maps[id as usize].kind, MapKind::Plain(_));
        self.clear_cache(id);
        let map = self.map_of(id);
        let keys: Vec<Vec<u8>> = map.keys().collect();
        for k in keys {
            if plain {
                let zero = vec![0u8; map.value_size() as usize];
                map.update(&k, &zero, MapFlags::EXIST).ok();
                continue;
            }
            if let Ok(Some(per_cpu)) = map.lookup_percpu(&k, MapFlags::ANY) {
                let zero: Vec<Vec<u8>> = per_cpu.iter().map(|v| vec![0u8; v.len()]).collect();
                map.update_percpu(&k, &zero, MapFlags::EXIST).ok();
            }
        }
    }

    fn map_of(&self, id: u32) -> &dyn MapCore {
        &self.session.vm_maps[id as usize]
    }

    /// The maps left at the end, as bpftrace prints them: a blank-line
    /// separator, then every map the script names, in name order, the
    /// empty ones too (as the blank lines bpftrace prints for them).
    fn print_all(&mut self) -> Result<()> {
        self.out.w.write_all(fmt::EXIT_SEPARATOR.as_bytes())?;
        // A map of tuples prints its member maps' values itself.
        let mut names: Vec<String> = (self.low.maps.iter())
            .filter(|m| !m.is_member())
            .map(|m| m.name.clone())
            .collect();
        fmt::exit_maps_order(&mut names);
        for name in names {
            let Some(id) = self.low.maps.iter().position(|m| m.name == name) else {
                continue;
            };
            let m = self.read_map(id as u32)?;
            if !m.entries.is_empty() {
                self.write_map(&m, 0, 1)?;
            } else if !self.out.json {
                let mut s = String::new();
                fmt::print_empty_map(&mut s, agg_kind(self.low.maps[id].kind));
                self.out.w.write_all(&crate::filter::raw::encode(&s))?;
            }
        }
        Ok(())
    }

    /// A map as print(@map, top, div) prints it, in text or JSON.
    fn write_map(&mut self, m: &MapData, top: usize, div: u64) -> Result<()> {
        if self.out.json {
            writeln!(self.out.w, "{}", fmt::json_map(m, top, div))?;
        } else {
            let mut s = String::new();
            fmt::print_map(&mut s, m, top, div);
            self.out.w.write_all(&crate::filter::raw::encode(&s))?;
        }
        Ok(())
    }
}

fn agg_kind(k: MapKind) -> fmt::AggKind {
    match k {
        MapKind::Plain(_) => fmt::AggKind::Scalar,
        MapKind::Agg(f, _) => match f {
            AggFn::Count => fmt::AggKind::Count,
            AggFn::Sum => fmt::AggKind::Sum,
            AggFn::Avg => fmt::AggKind::Avg,
            AggFn::Min => fmt::AggKind::Min,
            AggFn::Max => fmt::AggKind::Max,
            AggFn::Stats => fmt::AggKind::Stats,
            AggFn::Hist => fmt::AggKind::Hist,
            AggFn::Lhist { .. } => fmt::AggKind::Lhist,
        },
    }
}

/// A minimum or maximum as its values' type reads it.
fn by_sign(v: i64, signed: bool) -> i128 {
    if signed {
        i128::from(v)
    } else {
        i128::from(v as u64)
    }
}

/// Stack frames by (user?, stack id): address (0 where only a file
/// offset is known) and name, leaf first.
type StackNames = HashMap<(bool, u32), Vec<(u64, String)>>;

/// Frames above the traced code in a kernel stack taken in the script
/// machine: the BPF program itself, a raw tracepoint's dispatch
/// (`bpf_trace_run2`, `__bpf_trace_sys_enter`, and `__traceiter_sys_enter`
/// when several programs share the tracepoint) and a trampoline's.
/// bpftrace's stacks start below them.
fn is_dispatch_frame(f: &str) -> bool {
    f.starts_with("bpf_prog_")
        || f.starts_with("bpf_trace_run")
        || f.starts_with("__bpf_trace_")
        || f.starts_with("__traceiter_")
        || f.starts_with("bpf_trampoline_")
}

/// The first 8 bytes as a number (0 when short).
fn word(b: &[u8]) -> u64 {
    b.get(..8)
        .and_then(|x| x.try_into().ok())
        .map_or(0, u64::from_ne_bytes)
}

/// Whether a per-CPU aggregate was counted on some CPU.
fn counted(per_cpu: &[Vec<u8>]) -> bool {
    per_cpu.iter().any(|c| AggVal::from_bytes(c).count != 0)
}

/// A key as a script map's hash map holds it: the header (`bucket`, epoch
/// 0), the map's id, key data `words`, zeros to `size`.
fn hash_key<'a>(
    bucket: u32,
    id: u32,
    words: impl IntoIterator<Item = &'a u64>,
    size: usize,
) -> Vec<u8> {
    let mut k = bucket.to_ne_bytes().to_vec();
    k.extend_from_slice(&[0; 4]);
    k.extend_from_slice(&u64::from(id).to_ne_bytes());
    for w in words {
        k.extend_from_slice(&w.to_ne_bytes());
    }
    k.resize(size.max(k.len()), 0);
    k
}

/// A keyless aggregation's bucket `b` as `read_map` takes keys: the key
/// header (bucket, epoch 0), with no key data.
fn slot_key(b: u32) -> Vec<u8> {
    let mut k = b.to_ne_bytes().to_vec();
    k.extend_from_slice(&[0; 4]);
    k
}

/// Kernel and user addresses named so far (ksym(), usym()), and the
/// symbolizer of user ones: a printf per event names the same few.
#[derive(Default)]
struct SymCache {
    kernel: HashMap<u64, String>,
    user: HashMap<(u32, u64), String>,
    resolver: Option<bpfscope_symbolize::Resolver>,
    /// The script's texts (strftime() formats, cgroup_path() filters).
    texts: Vec<String>,
    /// Wall-clock nanoseconds at boot: strftime() adds nsecs to them.
    boot_ns: i128,
    /// cgroup_path() by (cgroup id, filter).
    cgroups: HashMap<(u64, u16), String>,
}

impl SymCache {
    fn new(texts: &[String]) -> SymCache {
        SymCache {
            texts: texts.to_vec(),
            boot_ns: boot_wall_ns(),
            ..Default::default()
        }
    }

    /// strftime(fmt, ns): the local time `ns` after boot, `%f` its
    /// microseconds (as bpftrace 0.17).
    fn time(&self, fmt: u16, ns: u64) -> String {
        let at = self.boot_ns + i128::from(ns);
        let micros = format!("{:06}", at.rem_euclid(1_000_000_000) / 1000);
        let fmt = self.texts.get(usize::from(fmt)).map_or("", String::as_str);
        fmt::time(Some(&fmt.replace("%f", &micros)), at)
    }

    /// cgroup_path(id[, filter]): `hierarchy:path` for each cgroup
    /// hierarchy mounted where a cgroup has this id, joined by commas:
    /// the unified (v2) one first, then the v1 ones by name, as bpftrace.
    fn cgroup(&mut self, id: u64, filter: u16) -> String {
        if let Some(s) = self.cgroups.get(&(id, filter)) {
            return s.clone();
        }
        let want = self.texts.get(usize::from(filter)).cloned();
        let s = cgroup_hierarchies()
            .into_iter()
            .filter(|(name, _)| want.as_deref().is_none_or(|w| glob(w, name)))
            .filter_map(|(name, root)| {
                let path = find_inode(&root, id, 0)?;
                let rel = path
                    .strip_prefix(&root)
                    .ok()?
                    .to_string_lossy()
                    .into_owned();
                Some(format!("{name}:/{rel}"))
            })
            .collect::<Vec<_>>()
            .join(",");
        self.cgroups.insert((id, filter), s.clone());
        s
    }

    /// ksym(): the function, or the address in hex (as bpftrace).
    fn kernel(&mut self, addr: u64) -> String {
        self.kernel
            .entry(addr)
            .or_insert_with(|| {
                bpfscope_symbolize::kernel::symbolize_live(&[addr])
                    .into_iter()
                    .next()
                    .flatten()
                    .map_or_else(|| format!("{addr:#x}"), |(name, _)| name)
            })
            .clone()
    }

    /// usym(): the function in the process, or the address in hex.
    fn user(&mut self, pid: u32, addr: u64) -> String {
        if let Some(n) = self.user.get(&(pid, addr)) {
            return n.clone();
        }
        let r = self.resolver.get_or_insert_with(|| {
            bpfscope_symbolize::Resolver::new(&bpfscope_symbolize::SymbolConfig::default(), false)
        });
        let name = r
            .process(pid, &[addr])
            .into_iter()
            .next()
            .flatten()
            .and_then(|r| r.lines.first().map(|l| l.function.clone()))
            .unwrap_or_else(|| format!("{addr:#x}"));
        self.user.insert((pid, addr), name.clone());
        name
    }
}

/// An IP address as ntop() gives it: the family in byte 0, the bytes at 8.
fn inet_text(b: &[u8]) -> String {
    let a = b.get(8..24).unwrap_or(&[]);
    match b.first() {
        Some(10) if a.len() == 16 => {
            let mut x = [0u8; 16];
            x.copy_from_slice(a);
            std::net::Ipv6Addr::from(x).to_string()
        }
        _ if a.len() >= 4 => std::net::Ipv4Addr::new(a[0], a[1], a[2], a[3]).to_string(),
        _ => String::new(),
    }
}

/// A value of type `ty` from its bytes (in a record, a key or a plain
/// map's value); stacks by their names in `stacks`, symbols through `syms`.
fn value_of(ty: Ty, b: &[u8], stacks: &StackNames, syms: &RefCell<SymCache>) -> Value {
    match ty {
        Ty::Int { signed: true } => Value::Int(word(b) as i64),
        Ty::Int { signed: false } | Ty::Ptr { .. } | Ty::IntPtr { .. } => Value::UInt(word(b)),
        Ty::Str => Value::Str(cstr(b.get(..STR_MAX).unwrap_or(b))),
        Ty::Stack { user, limit, perf } => Value::Stack(
            u32::try_from(word(b) as i64)
                .ok()
                .and_then(|id| stacks.get(&(user, id)))
                .map(|frames| {
                    frames
                        .iter()
                        .take(usize::from(limit))
                        .map(|(ip, name)| {
                            if perf {
                                // perf's form: a tab, the address, the symbol.
                                format!("\t{ip:x} {name}")
                            } else {
                                name.clone()
                            }
                        })
                        .collect()
                })
                .unwrap_or_default(),
        ),
        Ty::User => Value::Str(user_name(word(b) as u32)),
        Ty::Inet => Value::Text(inet_text(b)),
        Ty::Buf => {
            let n = usize::from(b.first().copied().unwrap_or(0));
            Value::Buf(b.get(1..1 + n).unwrap_or(&[]).to_vec())
        }
        Ty::KSym => Value::Text(syms.borrow_mut().kernel(word(b))),
        Ty::Time { fmt } => Value::Str(syms.borrow().time(fmt, word(b))),
        Ty::Errno => Value::Str(errno_text(word(b) as i64)),
        Ty::Mac => Value::Str(
            (0..6)
                .map(|i| format!("{:02X}", b.get(1 + i).copied().unwrap_or(0)))
                .collect::<Vec<_>>()
                .join(":"),
        ),
        Ty::Cgroup { filter } => Value::Str(syms.borrow_mut().cgroup(word(b), filter)),
        Ty::USym => {
            let pid = word(b.get(8..).unwrap_or(&[])) as u32;
            Value::Text(syms.borrow_mut().user(pid, word(b)))
        }
    }
}

/// One key's decoded parts, counts per bucket, and totals.
type KeyTotals = (Vec<Value>, BTreeMap<u32, u64>, AggVal);

/// A user's name from /etc/passwd, or the uid as text (as bpftrace prints one it cannot name).
fn user_name(uid: u32) -> String {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    passwd
        .lines()
        .find_map(|l| {
            let mut f = l.split(':');
            let name = f.next()?;
            let id: u32 = f.nth(1)?.parse().ok()?;
            (id == uid).then(|| name.to_string())
        })
        .unwrap_or_else(|| uid.to_string())
}

fn cstr(b: &[u8]) -> String {
    let n = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    // Bytes that are not UTF-8 are kept, and written back as they were.
    crate::filter::raw::decode(&b[..n]).into_owned()
}

/// The non-zero counts of an array of u64 (vm_cut, vm_full), by index.
fn counts(map: &dyn MapCore, n: usize) -> Vec<(usize, u64)> {
    (0..n)
        .filter_map(|i| {
            let v = map
                .lookup(&(i as u32).to_ne_bytes(), MapFlags::ANY)
                .ok()??;
            Some((i, word(&v))).filter(|(_, n)| *n > 0)
        })
        .collect()
}

/// Drops are never silent: what was lost goes to stderr.
fn report_lost(lost: Lost, mut parts: Vec<String>) {
    if lost.events > 0 {
        parts.push(format!("{} records (ring buffer full)", lost.events));
    }
    if lost.keys > 0 {
        parts.push(format!("{} map updates (map full)", lost.keys));
    }
    if lost.stacks > 0 {
        parts.push(format!("{} stacks", lost.stacks));
    }
    let skipped = lost.nested + lost.missed;
    if skipped > 0 {
        parts.push(format!(
            "{skipped} events skipped (fired while a BPF program was running on that CPU, or a kernel function probe's miss)"
        ));
    }
    if !parts.is_empty() {
        eprintln!("bpfscope: lost {}", parts.join(", "));
    }
}

/// The wall clock at boot, in nanoseconds: CLOCK_REALTIME less
/// CLOCK_BOOTTIME, as bpftrace computes it for strftime().
fn boot_wall_ns() -> i128 {
    let now = |clock| {
        let mut t = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: t is a live timespec the call fills.
        unsafe { libc::clock_gettime(clock, &mut t) };
        i128::from(t.tv_sec) * 1_000_000_000 + i128::from(t.tv_nsec)
    };
    now(libc::CLOCK_REALTIME) - now(libc::CLOCK_BOOTTIME)
}

/// strerror(): the C library's message for an errno.
fn errno_text(e: i64) -> String {
    std::io::Error::from_raw_os_error(e as i32)
        .to_string()
        .split(" (os error")
        .next()
        .unwrap_or_default()
        .to_string()
}

/// The cgroup hierarchies mounted: (name, root), the unified one first
/// ("unified"), then the v1 ones by name (their controllers, or name=).
fn cgroup_hierarchies() -> Vec<(String, std::path::PathBuf)> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let (mut v2, mut v1) = (Vec::new(), Vec::new());
    for l in info.lines() {
        let Some((pre, post)) = l.split_once(" - ") else {
            continue;
        };
        let root = pre.split(' ').nth(4).unwrap_or("");
        let mut post = post.split(' ');
        let (fstype, opts) = (post.next().unwrap_or(""), post.nth(1).unwrap_or(""));
        match fstype {
            "cgroup2" => v2.push(("unified".to_string(), root.into())),
            "cgroup" => {
                let name = opts
                    .split(',')
                    .filter(|o| !matches!(*o, "rw" | "ro") && !o.contains("xattr"))
                    .map(|o| o.strip_prefix("name=").unwrap_or(o))
                    .collect::<Vec<_>>()
                    .join(",");
                v1.push((name, root.into()));
            }
            _ => {}
        }
    }
    v1.sort();
    v2.extend(v1);
    v2
}

/// The directory under `dir` whose inode (a cgroup's id) is `id`.
fn find_inode(dir: &std::path::Path, id: u64, depth: usize) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::MetadataExt;
    if std::fs::metadata(dir).ok()?.ino() == id {
        return Some(dir.to_path_buf());
    }
    // Cgroup trees are shallow; the bound stops a loop of bind mounts.
    if depth > 32 {
        return None;
    }
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .find_map(|e| find_inode(&e.path(), id, depth + 1))
}

/// Whether `name` matches `pat`, whose `*` stands for any characters.
fn glob(pat: &str, name: &str) -> bool {
    match pat.split_once('*') {
        None => pat == name,
        Some((head, rest)) => {
            let Some(tail) = name.strip_prefix(head) else {
                return false;
            };
            (0..=tail.len())
                .filter(|&i| tail.is_char_boundary(i))
                .any(|i| glob(rest, &tail[i..]))
        }
    }
}

/// cat(): a file's first `max` bytes (bpftrace's BPFTRACE_CAT_BYTES_MAX).
fn cat_file(path: &std::ffi::OsStr, max: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut b = Vec::new();
    std::fs::File::open(path)?.take(max).read_to_end(&mut b)?;
    Ok(b)
}
