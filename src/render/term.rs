//! The live views' terminal (`bpf top`, `top`): keys read one at a time
//! from stdin while the view refreshes, and waits that end on a refresh,
//! a stop reason, a key or another descriptor becoming readable.

use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use crate::collect::Stopper;

/// The terminal on stdin in cbreak mode (keys arrive one at a time,
/// unechoed; Ctrl-C still raises SIGINT), restored when dropped, whatever
/// ends the view. Three libc calls do not warrant a terminal crate.
pub struct Cbreak {
    saved: libc::termios,
}

impl Cbreak {
    /// None when stdin is not a terminal.
    pub fn enable() -> Option<Cbreak> {
        // SAFETY: isatty only inspects the descriptor.
        if unsafe { libc::isatty(libc::STDIN_FILENO) } != 1 {
            return None;
        }
        // SAFETY: termios is plain data; tcgetattr fills it or fails.
        let mut saved: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: a valid pointer to a termios for tcgetattr to fill.
        if unsafe { libc::tcgetattr(libc::STDIN_FILENO, &mut saved) } != 0 {
            return None;
        }
        let mut raw = saved;
        raw.c_lflag &= !(libc::ICANON | libc::ECHO);
        raw.c_cc[libc::VMIN] = 1;
        raw.c_cc[libc::VTIME] = 0;
        // SAFETY: a valid termios, copied from the terminal's own.
        if unsafe { libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, &raw) } != 0 {
            return None;
        }
        Some(Cbreak { saved })
    }
}

impl Drop for Cbreak {
    fn drop(&mut self) {
        // SAFETY: restores the settings read in enable().
        unsafe { libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, &self.saved) };
    }
}

/// Whether stdout is a terminal (the live view), not a pipe (JSON lines).
pub fn stdout_is_tty() -> bool {
    // SAFETY: isatty only inspects the descriptor.
    unsafe { libc::isatty(libc::STDOUT_FILENO) == 1 }
}

/// What ended a wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// The time for the next refresh came.
    Tick,
    /// A stop reason: a signal, --duration, the target's exit.
    Stop,
    /// A key pressed (with the terminal in cbreak mode).
    Key(u8),
    /// One of the caller's descriptors became readable.
    Ready,
}

/// Waits until `until`, a stop reason, a key (with `keys`) or one of
/// `extra` becoming readable. A terminal that hangs up stops being read.
pub fn next_event(
    stopper: &Stopper,
    until: Instant,
    keys: &mut Option<Cbreak>,
    extra: &[RawFd],
) -> Event {
    loop {
        if stopper.poll().is_some() {
            return Event::Stop;
        }
        let mut left = until.saturating_duration_since(Instant::now());
        if let Some(r) = stopper.remaining() {
            left = left.min(r);
        }
        if left.is_zero() {
            return if stopper.poll().is_some() {
                Event::Stop
            } else {
                Event::Tick
            };
        }
        let mut fds: Vec<libc::pollfd> = Vec::with_capacity(2 + extra.len());
        let wake = std::os::fd::AsRawFd::as_raw_fd(&stopper.wake_fd());
        fds.push(libc::pollfd {
            fd: wake,
            events: libc::POLLIN,
            revents: 0,
        });
        if keys.is_some() {
            fds.push(libc::pollfd {
                fd: libc::STDIN_FILENO,
                events: libc::POLLIN,
                revents: 0,
            });
        }
        fds.extend(extra.iter().map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        }));
        let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
        // SAFETY: fds is a valid array of pollfd for the call's duration.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if n <= 0 {
            continue;
        }
        if fds[0].revents != 0 {
            continue; // the stop reason is read at the top of the loop
        }
        let stdin_at = keys.is_some().then_some(1);
        if let Some(i) = stdin_at {
            if fds[i].revents != 0 {
                let mut b = [0u8; 1];
                // SAFETY: reads at most one byte into b.
                let got = unsafe { libc::read(libc::STDIN_FILENO, b.as_mut_ptr().cast(), 1) };
                if got <= 0 {
                    // End of input or an error: keep refreshing without keys.
                    *keys = None;
                    continue;
                }
                return Event::Key(b[0]);
            }
        }
        let first_extra = 1 + usize::from(stdin_at.is_some());
        if fds[first_extra..].iter().any(|p| p.revents != 0) {
            return Event::Ready;
        }
    }
}

/// `bpf top`'s wait: a refresh, a stop reason, or q.
pub enum Wake {
    Tick,
    Stop,
    Quit,
}

/// Waits up to `timeout` for a stop reason or, with the terminal in cbreak
/// mode, a `q` (other keys are ignored).
pub fn wait_or_key(stopper: &Stopper, timeout: Duration, keys: &mut Option<Cbreak>) -> Wake {
    let until = Instant::now() + timeout;
    loop {
        match next_event(stopper, until, keys, &[]) {
            Event::Tick => return Wake::Tick,
            Event::Stop => return Wake::Stop,
            Event::Key(b'q' | b'Q') => return Wake::Quit,
            Event::Key(_) | Event::Ready => {}
        }
    }
}
