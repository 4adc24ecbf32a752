//! Following BPF program loads and unloads while recording: one dummy
//! software perf event per CPU with `bpf_event` and `ksymbol` set delivers
//! PERF_RECORD_BPF_EVENT and PERF_RECORD_KSYMBOL. On every load the
//! program's info is read at once (it may be gone soon); the programs
//! already loaded at start are read too.
//!
//! The ring buffers are libbpf's raw perf buffer (per-CPU mmap, wrap-around,
//! epoll), which takes any perf event attributes.

use std::collections::{BTreeMap, HashMap};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use libbpf_rs::{MapHandle, MapType};
use libbpf_sys::perf_event_header;

use super::info;
use bpfscope_recording::bpfprog::{BpfProg, Subprog};

/// What the side-band has seen so far.
#[derive(Debug, Default)]
struct State {
    progs: BTreeMap<u32, BpfProg>,
    /// JIT symbols announced by KSYMBOL records: name -> (addr, len).
    ksyms: HashMap<String, (u64, u32)>,
    /// Records the kernel dropped because a ring buffer was full.
    lost: u64,
    /// Loads whose program could not be read yet: (id, tag, first try).
    pending: Vec<(u32, Option<String>, Instant)>,
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

    /// Tries the pending loads again; gives up on those older than PENDING_MAX.
    fn retry_pending(&mut self) {
        let pending = std::mem::take(&mut self.pending);
        for (id, tag, since) in pending {
            match info::fetch(id) {
                Ok(prog) => {
                    self.progs.insert(id, prog);
                }
                Err(_) if since.elapsed() > PENDING_MAX => {
                    let prog = self.gone_prog(id, tag);
                    self.progs.insert(id, prog);
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
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// Per-CPU ring size in pages: loads are rare, records small.
const PAGES: usize = 16;
/// How long a load may stay unreadable before only its JIT symbols are kept.
const PENDING_MAX: Duration = Duration::from_millis(500);

unsafe extern "C" fn on_event(
    ctx: *mut std::ffi::c_void,
    _cpu: std::ffi::c_int,
    event: *mut perf_event_header,
) -> libbpf_sys::bpf_perf_event_ret {
    // SAFETY: ctx is the &Mutex<State> passed to perf_buffer__new_raw by the
    // thread that polls, which keeps it alive; event points at a record of
    // `size` bytes that libbpf keeps valid for the duration of this call.
    unsafe {
        let state = &*(ctx as *const Mutex<State>);
        let size = (*event).size as usize;
        let rec = std::slice::from_raw_parts(event as *const u8, size);
        if let Ok(mut s) = state.lock() {
            s.on_record(rec);
        }
    }
    libbpf_sys::LIBBPF_PERF_EVENT_CONT
}

/// Owns a libbpf perf buffer; frees it on drop.
struct RawBuffer(*mut libbpf_sys::perf_buffer);

impl Drop for RawBuffer {
    fn drop(&mut self) {
        // SAFETY: the pointer came from perf_buffer__new_raw and is freed once.
        unsafe { libbpf_sys::perf_buffer__free(self.0) };
    }
}

fn open_buffer(state: &Arc<Mutex<State>>, map: &MapHandle) -> Result<RawBuffer> {
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
    let ctx = Arc::as_ptr(state) as *mut std::ffi::c_void;
    // SAFETY: attr is valid for the call; ctx stays valid while the returned
    // buffer lives (the caller holds the Arc); opts may be null.
    let pb = unsafe {
        libbpf_sys::perf_buffer__new_raw(
            map.as_fd().as_raw_fd(),
            PAGES as libbpf_sys::size_t,
            &mut attr,
            Some(on_event),
            ctx,
            std::ptr::null(),
        )
    };
    // SAFETY: libbpf_get_error only inspects the pointer value.
    let err = unsafe { libbpf_sys::libbpf_get_error(pb as *const _) };
    if pb.is_null() || err != 0 {
        return Err(anyhow!(
            "opening the BPF side-band events: {}",
            std::io::Error::from_raw_os_error((-err) as i32)
        ));
    }
    Ok(RawBuffer(pb))
}

impl SideBand {
    /// Starts following loads and unloads, then reads the programs already loaded.
    pub fn start() -> Result<SideBand> {
        let state = Arc::new(Mutex::new(State::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel::<Result<()>>();
        let (st, sp) = (state.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let ncpus = libbpf_rs::num_possible_cpus().unwrap_or(1) as u32;
            let map = match MapHandle::create(
                MapType::PerfEventArray,
                None::<&str>,
                4,
                4,
                ncpus.max(1),
                &libbpf_sys::bpf_map_create_opts {
                    sz: std::mem::size_of::<libbpf_sys::bpf_map_create_opts>() as _,
                    ..Default::default()
                },
            ) {
                Ok(m) => m,
                Err(e) => {
                    let _ = tx.send(Err(anyhow!(e).context("creating the side-band map")));
                    return;
                }
            };
            let pb = match open_buffer(&st, &map) {
                Ok(pb) => pb,
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            };
            let _ = tx.send(Ok(()));
            while !sp.load(Ordering::Relaxed) {
                // Short waits while a load waits to be readable, long ones otherwise.
                let waiting = st.lock().map(|s| !s.pending.is_empty()).unwrap_or(false);
                let ms = if waiting { 2 } else { 100 };
                // SAFETY: pb is a live perf buffer owned by this thread.
                unsafe { libbpf_sys::perf_buffer__poll(pb.0, ms) };
                if let Ok(mut s) = st.lock() {
                    s.retry_pending();
                }
            }
            // Whatever arrived before the stop.
            // SAFETY: as above.
            unsafe { libbpf_sys::perf_buffer__consume(pb.0) };
            if let Ok(mut s) = st.lock() {
                s.retry_pending();
                // Stopping: what is still unreadable keeps its JIT symbols.
                for (id, tag, _) in std::mem::take(&mut s.pending) {
                    let prog = s.gone_prog(id, tag);
                    s.progs.insert(id, prog);
                }
            }
            // The buffer goes before the map it registered its events in.
            drop(pb);
            drop(map);
        });
        rx.recv().context("the side-band reader stopped")??;
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
            stop,
            thread: Some(thread),
        })
    }

    /// Stops following and returns every program seen, and records lost.
    pub fn finish(mut self) -> (Vec<BpfProg>, u64) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let Ok(mut s) = self.state.lock() else {
            return (Vec::new(), 0);
        };
        let progs = std::mem::take(&mut s.progs).into_values().collect();
        (progs, s.lost)
    }
}

impl Drop for SideBand {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
