//! Collect stage: reading what the kernel gathered (aggregates, events,
//! lost-event counters) and deciding when a run stops.

pub mod aggregate;
pub mod events;
pub mod stacks;
pub mod threads;

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use libbpf_rs::{MapCore, MapFlags};

use bpfscope_bpf::abi::bs_lost;
use bpfscope_sys::eventfd::EventFd;

/// How long in-flight program runs get to finish with the old epoch before it is read.
pub const EPOCH_GRACE: Duration = Duration::from_millis(10);

/// Why a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    Signal,
    ChildExited,
    Duration,
    /// The process of `-p PID` exited.
    TargetExited,
    /// The output went away (e.g. a closed pipe).
    OutputClosed,
}

/// Lost-event counters, summed over CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Lost {
    /// Events dropped because the ring buffer was full.
    pub events: u64,
    /// Keys not recorded because the aggregation map was full.
    pub keys: u64,
    /// Stacks that could not be captured.
    pub stacks: u64,
    /// Ends without a matching start.
    pub unmatched: u64,
    /// Runs skipped because a BPF program was already running on that
    /// CPU: by the kernel (a program's recursion misses), or by bpfscope's
    /// programs (a run nested in another, which would overwrite its
    /// scratch area).
    pub nested: u64,
    /// Kernel function hits the kernel skipped: kprobe misses (no return
    /// instance free, a probe inside a probe) and fentry/fexit recursion
    /// misses.
    pub missed: u64,
}

/// One lost-event counter (an `enum bs_lost` reason), summed over CPUs.
pub fn lost_counter(map: &dyn MapCore, reason: u32) -> Result<u64> {
    let v = map
        .lookup_percpu(&reason.to_ne_bytes(), MapFlags::ANY)
        .context("reading lost-event counters")?
        .unwrap_or_default();
    Ok(v.iter()
        .map(|b| {
            b.get(..8)
                .map_or(0, |w| u64::from_ne_bytes(w.try_into().unwrap_or([0; 8])))
        })
        .sum())
}

impl Lost {
    /// A session's losses: its `lost` counters, and the runs the kernel
    /// skipped on its programs (nested) and kernel function probes (missed).
    pub fn of_session(session: &crate::attach::session::Session) -> Result<Lost> {
        let mut lost = Lost::read(&session.skel.maps.lost)?;
        lost.nested += session.recursion_misses();
        lost.missed = session.kprobe_misses();
        Ok(lost)
    }

    pub fn read(map: &dyn MapCore) -> Result<Lost> {
        let slot = |i: u32| lost_counter(map, i);
        Ok(Lost {
            events: slot(bs_lost::BS_LOST_EVENTS.0)?,
            keys: slot(bs_lost::BS_LOST_KEYS.0)?,
            stacks: slot(bs_lost::BS_LOST_STACKS.0)?,
            unmatched: slot(bs_lost::BS_LOST_UNMATCHED.0)?,
            nested: slot(bs_lost::BS_LOST_NESTED.0)?,
            missed: 0,
        })
    }

    /// What was lost since `earlier`.
    pub fn since(self, earlier: Lost) -> Lost {
        Lost {
            events: self.events.saturating_sub(earlier.events),
            keys: self.keys.saturating_sub(earlier.keys),
            stacks: self.stacks.saturating_sub(earlier.stacks),
            unmatched: self.unmatched.saturating_sub(earlier.unmatched),
            nested: self.nested.saturating_sub(earlier.nested),
            missed: self.missed.saturating_sub(earlier.missed),
        }
    }
}

/// Gathers the reasons a run can stop: signals, the traced command's
/// exit and the --duration deadline.
pub struct Stopper {
    tx: Sender<StopReason>,
    rx: Receiver<StopReason>,
    /// Readable once a reason was sent: lets a loop sleep in poll(2) on its
    /// own descriptors and this one instead of waking up to check.
    wake: Arc<EventFd>,
    /// Set by `start`: the --duration counts from when the run really
    /// starts, not from before loading (slow on emulated or busy machines).
    deadline: std::cell::Cell<Option<Instant>>,
    duration: Option<Duration>,
}

impl Stopper {
    pub fn new(duration: Option<Duration>) -> Result<Stopper> {
        let (tx, rx) = channel();
        let mut signals = signal_hook::iterator::Signals::new([
            signal_hook::consts::SIGINT,
            signal_hook::consts::SIGTERM,
            signal_hook::consts::SIGHUP,
        ])
        .context("installing signal handlers")?;
        let wake = Arc::new(EventFd::new().context("creating an eventfd")?);
        let stx = tx.clone();
        let swake = wake.clone();
        std::thread::spawn(move || {
            for _ in signals.forever() {
                if stx.send(StopReason::Signal).is_err() {
                    break;
                }
                swake.notify();
            }
        });
        // A signal that came before this Stopper existed (while resolving) counts too.
        if bpfscope_sys::signals::interrupted() {
            let _ = tx.send(StopReason::Signal);
            wake.notify();
        }
        Ok(Stopper {
            tx,
            rx,
            wake,
            deadline: std::cell::Cell::new(None),
            duration,
        })
    }

    /// Starts the --duration clock: call once everything is attached.
    pub fn start(&self) {
        self.deadline.set(self.duration.map(|d| Instant::now() + d));
    }

    /// Stops the run when process `pid` exits (the target of `-p`).
    /// Fails with a usage error when there is no such process.
    pub fn watch_pid(&self, pid: u32) -> Result<()> {
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            // pidfd_open takes a process (ESRCH: none), not one of its
            // threads (ENOENT/EINVAL): name the process to give instead.
            let tgid = std::fs::read_to_string(format!("/proc/{pid}/status"))
                .ok()
                .and_then(|s| {
                    s.lines()
                        .find_map(|l| l.strip_prefix("Tgid:"))
                        .map(|v| v.trim().to_string())
                });
            return Err(match (e.raw_os_error(), tgid) {
                (Some(libc::ENOENT) | Some(libc::EINVAL), Some(t)) if t != pid.to_string() => {
                    crate::usage!("{pid} is a thread of process {t}: give -p {t}").into()
                }
                (Some(libc::ESRCH) | Some(libc::ENOENT), _) => {
                    crate::usage!("no process with pid {pid}: check the pid (pgrep NAME)").into()
                }
                _ => anyhow::Error::from(e).context(format!("watching process {pid}")),
            });
        }
        // SAFETY: pidfd_open returned a new descriptor that nothing else owns.
        let pidfd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        let tx = self.tx.clone();
        let wake = self.wake.clone();
        std::thread::spawn(move || {
            // A pidfd becomes readable when the process exits.
            let mut p = libc::pollfd {
                fd: pidfd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            loop {
                // SAFETY: p is one valid pollfd.
                let r = unsafe { libc::poll(&mut p, 1, -1) };
                if r > 0 {
                    break;
                }
                if r < 0
                    && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted
                {
                    return;
                }
            }
            eprintln!("note: process {pid} exited");
            let _ = tx.send(StopReason::TargetExited);
            wake.notify();
        });
        Ok(())
    }

    /// Stops the run when the child exits (reaping it); bpfscope then exits
    /// with the child's status (`error::command_status`).
    pub fn watch_child(&self, child: crate::attach::target::RunningChild) {
        let tx = self.tx.clone();
        let wake = self.wake.clone();
        std::thread::spawn(move || {
            // A failed command explains an empty result: say so (the
            // results are still printed; bpfscope itself did not fail).
            if let Ok(status) = child.wait() {
                crate::error::set_command_status(status);
                let status = std::process::ExitStatus::from_raw(status);
                if !status.success() {
                    eprintln!("note: the command ended with {status}");
                }
            }
            let _ = tx.send(StopReason::ChildExited);
            wake.notify();
        });
    }

    /// Waits up to `timeout` for a reason to stop.
    pub fn wait(&self, timeout: Duration) -> Option<StopReason> {
        let timeout = match self.deadline.get() {
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Some(StopReason::Duration);
                }
                timeout.min(left)
            }
            None => timeout,
        };
        match self.rx.recv_timeout(timeout) {
            Ok(r) => Some(r),
            Err(RecvTimeoutError::Timeout) => self
                .deadline
                .get()
                .filter(|d| Instant::now() >= *d)
                .map(|_| StopReason::Duration),
            Err(RecvTimeoutError::Disconnected) => None,
        }
    }

    /// Becomes readable when a stop reason (other than the deadline) arrives.
    pub fn wake_fd(&self) -> BorrowedFd<'_> {
        self.wake.as_fd()
    }

    /// Time left until the --duration deadline, if there is one.
    pub fn remaining(&self) -> Option<Duration> {
        self.deadline
            .get()
            .map(|d| d.saturating_duration_since(Instant::now()))
    }

    /// Checks without waiting.
    pub fn poll(&self) -> Option<StopReason> {
        if self.deadline.get().is_some_and(|d| Instant::now() >= d) {
            return Some(StopReason::Duration);
        }
        self.rx.try_recv().ok()
    }
}
