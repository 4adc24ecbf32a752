//! A thread reading one perf event per CPU through libbpf's raw perf buffer
//! (per-CPU mmap rings, wrap-around, epoll), for events whose attributes
//! libbpf's own openers do not cover: the side-band records of BPF loads,
//! and the second sampler of `guarded`. Records go to a callback under the
//! caller's state lock; the thread stops and frees everything on `stop`.

use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use anyhow::{anyhow, Context, Result};
use bpfscope_sys::eventfd::EventFd;
use libbpf_rs::{MapHandle, MapType};
use libbpf_sys::perf_event_header;

/// What the thread calls: on each record, and after each poll (returning
/// how long the next poll may wait, in ms; -1 for until a record or `stop`).
pub struct Handlers<S> {
    pub record: fn(&mut S, &[u8]),
    pub after_poll: fn(&mut S) -> i32,
    /// Called once, after the last records are read.
    pub finish: fn(&mut S),
}

struct Ctx<S> {
    state: Arc<Mutex<S>>,
    record: fn(&mut S, &[u8]),
}

unsafe extern "C" fn on_event<S>(
    ctx: *mut std::ffi::c_void,
    _cpu: std::ffi::c_int,
    event: *mut perf_event_header,
) -> libbpf_sys::bpf_perf_event_ret {
    // SAFETY: ctx is the Ctx<S> that the reading thread owns for as long as
    // the buffer lives; event points at a record of `size` bytes that
    // libbpf keeps valid for the duration of this call.
    unsafe {
        let ctx = &*(ctx as *const Ctx<S>);
        let size = (*event).size as usize;
        let rec = std::slice::from_raw_parts(event as *const u8, size);
        if let Ok(mut s) = ctx.state.lock() {
            (ctx.record)(&mut s, rec);
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

/// The reading thread; stopping it (or dropping) reads what is left.
pub struct Reader {
    stop: Arc<AtomicBool>,
    /// Wakes the thread for `stop`, so it need not wake up to check.
    wake: Arc<EventFd>,
    thread: Option<JoinHandle<()>>,
}

impl Reader {
    /// Opens `attr` on every CPU with `pages` pages of ring each and reads
    /// it on a thread of its own until stopped.
    pub fn spawn<S: Send + 'static>(
        what: &'static str,
        mut attr: libbpf_sys::perf_event_attr,
        pages: usize,
        state: Arc<Mutex<S>>,
        handlers: Handlers<S>,
    ) -> Result<Reader> {
        let stop = Arc::new(AtomicBool::new(false));
        let wake = Arc::new(EventFd::new().context("creating an eventfd")?);
        let (tx, rx) = mpsc::channel::<Result<()>>();
        let sp = stop.clone();
        let twake = wake.clone();
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
                    let _ = tx.send(Err(anyhow!(e).context(format!("creating the {what} map"))));
                    return;
                }
            };
            let ctx = Box::new(Ctx {
                state: state.clone(),
                record: handlers.record,
            });
            let ctx_ptr = &*ctx as *const Ctx<S> as *mut std::ffi::c_void;
            // SAFETY: attr is valid for the call; ctx_ptr stays valid while
            // the returned buffer lives (ctx is dropped after it); opts may
            // be null.
            let pb = unsafe {
                libbpf_sys::perf_buffer__new_raw(
                    map.as_fd().as_raw_fd(),
                    pages as libbpf_sys::size_t,
                    &mut attr,
                    Some(on_event::<S>),
                    ctx_ptr,
                    std::ptr::null(),
                )
            };
            // SAFETY: libbpf_get_error only inspects the pointer value.
            let err = unsafe { libbpf_sys::libbpf_get_error(pb as *const _) };
            if pb.is_null() || err != 0 {
                let _ = tx.send(Err(anyhow!(
                    "opening the {what}: {}",
                    std::io::Error::from_raw_os_error((-err) as i32)
                )));
                return;
            }
            let pb = RawBuffer(pb);
            let _ = tx.send(Ok(()));
            // SAFETY: pb is a live perf buffer owned by this thread.
            let epfd = unsafe { libbpf_sys::perf_buffer__epoll_fd(pb.0) };
            let mut ms = 100;
            while !sp.load(Ordering::Relaxed) {
                // libbpf's epoll descriptor is readable while any CPU's ring
                // has data; consuming reads every ring.
                let mut pfds = [
                    libc::pollfd {
                        fd: epfd,
                        events: libc::POLLIN,
                        revents: 0,
                    },
                    libc::pollfd {
                        fd: twake.raw(),
                        events: libc::POLLIN,
                        revents: 0,
                    },
                ];
                // SAFETY: pfds is a valid array of two pollfds.
                unsafe { libc::poll(pfds.as_mut_ptr(), 2, ms) };
                // SAFETY: as above.
                unsafe { libbpf_sys::perf_buffer__consume(pb.0) };
                if let Ok(mut s) = state.lock() {
                    ms = (handlers.after_poll)(&mut s);
                }
            }
            // Whatever arrived before the stop.
            // SAFETY: as above.
            unsafe { libbpf_sys::perf_buffer__consume(pb.0) };
            if let Ok(mut s) = state.lock() {
                (handlers.finish)(&mut s);
            }
            // The buffer goes before the map it registered its events in,
            // and before the context its callback reads.
            drop(pb);
            drop(map);
            drop(ctx);
        });
        rx.recv()
            .with_context(|| format!("the {what} reader stopped"))??;
        Ok(Reader {
            stop,
            wake,
            thread: Some(thread),
        })
    }

    /// Stops the thread after it has read what is left.
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.wake.notify();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.stop();
    }
}
