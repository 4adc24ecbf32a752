//! An eventfd that wakes a thread sleeping in poll(2), so loops can wait on
//! their own descriptors and this one instead of waking up to check: on a
//! VM every wakeup of a profiler's thread is time taken from the work on
//! that CPU.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

#[derive(Debug)]
pub struct EventFd(OwnedFd);

impl EventFd {
    /// A non-blocking, close-on-exec eventfd with a count of 0.
    pub fn new() -> io::Result<EventFd> {
        // SAFETY: eventfd has no memory-safety preconditions.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: eventfd returned a new descriptor that nothing else owns.
        Ok(EventFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Makes the descriptor readable (until `drain`).
    pub fn notify(&self) {
        let one = 1u64;
        // SAFETY: writes 8 bytes from a live u64 to the eventfd we own. It
        // can only fail when the count would overflow, and it is readable then.
        unsafe { libc::write(self.0.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Resets the count, so the descriptor is not readable until the next `notify`.
    pub fn drain(&self) {
        let mut v = 0u64;
        // SAFETY: reads 8 bytes into a live u64; non-blocking, so it returns
        // EAGAIN at once when nothing was notified.
        unsafe { libc::read(self.0.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
    }

    pub fn raw(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

impl AsFd for EventFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn readable(e: &EventFd) -> bool {
        let mut p = libc::pollfd {
            fd: e.raw(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, no wait.
        unsafe { libc::poll(&mut p, 1, 0) == 1 }
    }

    #[test]
    fn readable_from_notify_to_drain() {
        let e = EventFd::new().unwrap();
        assert!(!readable(&e));
        e.notify();
        e.notify();
        assert!(readable(&e));
        e.drain();
        assert!(!readable(&e));
    }
}
