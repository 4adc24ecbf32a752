//! Following BPF program loads and unloads while recording: one dummy
//! software perf event per CPU with `bpf_event` and `ksymbol` set delivers
//! PERF_RECORD_BPF_EVENT and PERF_RECORD_KSYMBOL. On every load the
//! program's info is read at once (it may be gone soon); the programs
//! already loaded at start are read too.
//!
//! The ring buffers are read by `perfbuf`.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use bpfscope_sys::eventfd::EventFd;

use super::info;
use super::perfbuf::{Handlers, Reader};
use bpfscope_recording::bpfprog::{BpfProg, Subprog};

/// What the side-band has seen so far.
#[derive(Debug, Default)]
struct State {
    progs: BTreeMap<u32, BpfProg>,
    /// JIT symbols announced by KSYMBOL records: name -> (addr, len).
    ksyms: HashMap<String, (u64, u32)>,
    /// Records the kernel dropped because a ring buffer was full.
    lost: u64,
    /// Load and unload records read so far: a change says the set of
    /// programs changed (a cache of it is stale).
    events: u64,
    /// Loads whose program could not be read yet: (id, tag, first try).
    pending: Vec<(u32, Option<String>, Instant)>,
    /// Readable once a program was loaded (its info read, or given up on):
    /// a profiler waiting for one sleeps on it instead of looking every so often.
    loads: Option<Arc<EventFd>>,
    /// Called on this thread with each program loaded once its info is read.
    on_load: Option<OnLoad>,
}

/// What `SideBand::on_load` runs.
struct OnLoad(Box<dyn FnMut(&BpfProg) + Send>);

impl std::fmt::Debug for OnLoad {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OnLoad")
    }
}

impl State {
    fn on_record(&mut self, rec: &[u8]) {
        let Some(h) = rec.get(..8) else {
            return;
        };
        let ty = u32::from_ne_bytes([h[0], h[1], h[2], h[3]]);
        let body = &rec[8..];
        let u16_at = |o: usize| body.get(o..o + 2).map(|b| u16::from_ne_bytes([b[0], b[1]]));
        let u32_at = |o: usize| {
            body.get(o..o + 4)
                .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
        };
        let u64_at = |o: usize| {
            body.get(o..o + 8)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_ne_bytes)
        };
        match ty {
            libbpf_sys::PERF_RECORD_KSYMBOL => {
                // u64 addr; u32 len; u16 ksym_type; u16 flags; char name[].
                let (Some(addr), Some(len), Some(kty), Some(flags)) =
                    (u64_at(0), u32_at(8), u16_at(12), u16_at(14))
                else {
                    return;
                };
                if u32::from(kty) != libbpf_sys::PERF_RECORD_KSYMBOL_TYPE_BPF {
                    return;
                }
                let name_bytes = body.get(16..).unwrap_or(&[]);
                let end = name_bytes
                    .iter()
                    .position(|&c| c == 0)
                    .unwrap_or(name_bytes.len());
                let name = String::from_utf8_lossy(&name_bytes[..end]).into_owned();
                if flags & libbpf_sys::PERF_RECORD_KSYMBOL_FLAGS_UNREGISTER as u16 == 0 {
                    self.ksyms.insert(name, (addr, len));
                }
            }
            libbpf_sys::PERF_RECORD_BPF_EVENT => {
                // u16 type; u16 flags; u32 id; u8 tag[8].
                let (Some(kind), Some(id)) = (u16_at(0), u32_at(4)) else {
                    return;
                };
                self.events += 1;
                let tag = body.get(8..16).map(|t| {
                    let mut a = [0u8; 8];
                    a.copy_from_slice(t);
                    info::tag_of(&a)
                });
                match u32::from(kind) {
                    libbpf_sys::PERF_BPF_EVENT_PROG_LOAD => {
                        // The record can come before the id is published: retry shortly.
                        match info::fetch(id) {
                            Ok(prog) => {
                                self.progs.insert(id, prog);
                                self.loaded(id);
                            }
                            Err(_) => self.pending.push((id, tag, Instant::now())),
                        }
                    }
                    libbpf_sys::PERF_BPF_EVENT_PROG_UNLOAD => {
                        let now = bpfscope_sys::monotonic_ns();
                        // Gone before its info could be read: what the JIT symbols told.
                        if let Some(i) = self.pending.iter().position(|p| p.0 == id) {
                            let (_, tag, _) = self.pending.remove(i);
                            let prog = self.gone_prog(id, tag);
                            self.progs.insert(id, prog);
                        }
                        let prog = self
                            .progs
                            .entry(id)
                            .or_insert_with(|| Self::placeholder(id, tag.clone()));
                        prog.unloaded_ns = Some(now);
                    }
                    _ => {}
                }
            }
            libbpf_sys::PERF_RECORD_LOST => {
                // u64 id; u64 lost.
                self.lost += u64_at(8).unwrap_or(0);
            }
            _ => {}
        }
    }

    fn loaded(&mut self, id: u32) {
        if let Some(l) = &self.loads {
            l.notify();
        }
        if let (Some(h), Some(p)) = (self.on_load.as_mut(), self.progs.get(&id)) {
            (h.0)(p);
        }
    }

    /// Tries the pending loads again; gives up on those older than PENDING_MAX.
    fn retry_pending(&mut self) {
        let pending = std::mem::take(&mut self.pending);
        for (id, tag, since) in pending {
            match info::fetch(id) {
                Ok(prog) => {
                    self.progs.insert(id, prog);
                    self.loaded(id);
                }
                Err(_) if since.elapsed() > PENDING_MAX => {
                    let prog = self.gone_prog(id, tag);
                    self.progs.insert(id, prog);
                    self.loaded(id);
                }
                Err(_) => self.pending.push((id, tag, since)),
            }
        }
    }

    fn placeholder(id: u32, tag: Option<String>) -> BpfProg {
        BpfProg {
            id,
            tag: tag.unwrap_or_default(),
            name: String::new(),
            prog_type: String::new(),
            subprogs: Vec::new(),
            lines: Vec::new(),
            jited_len: 0,
            xlated_len: 0,
            load_time_ns: 0,
            unloaded_ns: None,
        }
    }

    /// A program gone before its info could be read: what the JIT symbols told.
    fn gone_prog(&self, id: u32, tag: Option<String>) -> BpfProg {
        let mut p = Self::placeholder(id, tag.clone());
        if let Some(tag) = &tag {
            let prefix = format!("bpf_prog_{tag}_");
            for (name, (addr, len)) in &self.ksyms {
                if let Some(n) = name.strip_prefix(&prefix) {
                    p.name = n.to_string();
                    p.subprogs.push(Subprog {
                        symbol: name.clone(),
                        addr: *addr,
                        len: *len,
                    });
                }
            }
        }
        p
    }
}

/// The side-band reader, running in its own thread until stopped.
pub struct SideBand {
    state: Arc<Mutex<State>>,
    loads: Arc<EventFd>,
    reader: Reader,
}

/// Per-CPU ring size in pages: loads are rare, records small.
const PAGES: usize = 16;
/// How long a load may stay unreadable before only its JIT symbols are kept
/// (and its type is unknown, so it cannot start the second sampler). The
/// loader can be descheduled between the record and publishing the id:
/// half a second was not enough for bpftrace on one busy emulated CPU.
const PENDING_MAX: Duration = Duration::from_secs(5);

fn attr() -> libbpf_sys::perf_event_attr {
    let mut attr = libbpf_sys::perf_event_attr {
        type_: libbpf_sys::PERF_TYPE_SOFTWARE,
        size: std::mem::size_of::<libbpf_sys::perf_event_attr>() as u32,
        config: u64::from(libbpf_sys::PERF_COUNT_SW_DUMMY),
        sample_type: u64::from(libbpf_sys::PERF_SAMPLE_TIME),
        ..Default::default()
    };
    attr.set_bpf_event(1);
    attr.set_ksymbol(1);
    attr.set_sample_id_all(1);
    // Wake the reader for every record: loads are rare and must be read
    // while the program exists. wakeup_events counts samples only; side-band
    // records wake readers through the watermark.
    attr.set_watermark(1);
    attr.__bindgen_anon_2.wakeup_watermark = 1;
    attr
}

impl SideBand {
    /// Starts following loads and unloads, then reads the programs already loaded.
    pub fn start() -> Result<SideBand> {
        let loads = Arc::new(EventFd::new().context("creating an eventfd")?);
        let state = Arc::new(Mutex::new(State {
            loads: Some(loads.clone()),
            ..State::default()
        }));
        let reader = Reader::spawn(
            "BPF side-band events",
            attr(),
            PAGES,
            state.clone(),
            Handlers {
                record: State::on_record,
                after_poll: |s| {
                    s.retry_pending();
                    // Short waits while a load waits to be readable; else
                    // sleep until a record comes (each one wakes the reader).
                    if s.pending.is_empty() {
                        -1
                    } else {
                        2
                    }
                },
                finish: |s| {
                    s.retry_pending();
                    // Stopping: what is still unreadable keeps its JIT symbols.
                    for (id, tag, _) in std::mem::take(&mut s.pending) {
                        let prog = s.gone_prog(id, tag);
                        s.progs.insert(id, prog);
                    }
                },
            },
        )?;
        // Programs loaded before the side-band started. A program loaded since
        // is already in the map; fetching again only refreshes it.
        let existing = info::fetch_all();
        if let Ok(mut s) = state.lock() {
            for p in existing {
                s.progs.entry(p.id).or_insert(p);
            }
        }
        Ok(SideBand {
            state,
            loads,
            reader,
        })
    }

    /// Runs `f` with each program loaded from now on, on the side-band's
    /// own thread, as soon as its info is read: what must not wait for the
    /// caller's loop (which can be busy for seconds compiling a large
    /// binary's unwind tables) runs there.
    pub fn on_load(&self, f: impl FnMut(&BpfProg) + Send + 'static) {
        if let Ok(mut s) = self.state.lock() {
            s.on_load = Some(OnLoad(Box::new(f)));
        }
    }

    /// Becomes readable when a program is loaded; `loads_seen` resets it.
    pub fn loads_fd(&self) -> i32 {
        self.loads.raw()
    }

    /// Called before looking at the programs, so a load after the look
    /// makes the descriptor readable again.
    pub fn loads_seen(&self) {
        self.loads.drain();
    }

    /// Whether a program that is loaded now, not one of `own`, has one of
    /// these types.
    pub fn any_loaded(&self, types: &[&str], own: &[u32]) -> bool {
        self.state.lock().is_ok_and(|s| {
            s.progs.values().any(|p| {
                p.unloaded_ns.is_none()
                    && types.contains(&p.prog_type.as_str())
                    && !own.contains(&p.id)
            })
        })
    }

    /// Every program seen so far (loaded, or unloaded since), for a
    /// long-running profiler that names JIT frames window by window.
    pub fn programs(&self) -> Vec<BpfProg> {
        self.state
            .lock()
            .map(|s| s.progs.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Load and unload records read so far (grows whenever programs come
    /// or go).
    pub fn events(&self) -> u64 {
        self.state.lock().map(|s| s.events).unwrap_or(0)
    }

    /// Records the kernel dropped so far.
    pub fn lost(&self) -> u64 {
        self.state.lock().map(|s| s.lost).unwrap_or(0)
    }

    /// Forgets programs unloaded before `ns` (CLOCK_MONOTONIC, as the
    /// records' times), so a run of days does not keep every program ever
    /// loaded.
    pub fn forget_unloaded_before(&self, ns: u64) {
        if let Ok(mut s) = self.state.lock() {
            s.progs.retain(|_, p| p.unloaded_ns.is_none_or(|t| t >= ns));
        }
    }

    /// Stops following and returns every program seen, and records lost.
    pub fn finish(mut self) -> (Vec<BpfProg>, u64) {
        self.reader.stop();
        let Ok(mut s) = self.state.lock() else {
            return (Vec::new(), 0);
        };
        // Kernels up to 6.1 free a program's id before they write its
        // unload record (from a work item when the last reference went in
        // an interrupt), so a program unloaded just before the stop can be
        // gone with no record read: its id says so.
        let now = bpfscope_sys::monotonic_ns();
        for (id, p) in s.progs.iter_mut() {
            if p.unloaded_ns.is_none() && info::is_gone(*id) {
                p.unloaded_ns = Some(now);
            }
        }
        let progs = std::mem::take(&mut s.progs).into_values().collect();
        (progs, s.lost)
    }
}
