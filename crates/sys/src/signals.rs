//! Termination signals as a flag the stages check, so that Ctrl-C or
//! SIGTERM ends a run at any stage (loading, attaching, running) instead
//! of only while the collect loop is waiting.
//!
//! The first SIGINT, SIGTERM or SIGHUP sets the flag; the stages notice it
//! and end the run, printing what was gathered. A second one (or any one
//! after [`die_on_next`]) gets the default action: the process ends at
//! once, and the kernel closes every BPF descriptor, so nothing stays
//! attached.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

const SIGNALS: [i32; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

static FLAG: OnceLock<Arc<AtomicBool>> = OnceLock::new();

static RELOAD: OnceLock<Arc<AtomicBool>> = OnceLock::new();

/// Installs the handlers (once; later calls do nothing).
pub fn install() -> io::Result<()> {
    install_for(&SIGNALS)
}

/// For a long-running service: SIGINT and SIGTERM end it, SIGHUP asks it
/// to read its configuration again ([`take_reload`]).
pub fn install_reloadable() -> io::Result<()> {
    if RELOAD.get().is_none() {
        let flag = Arc::new(AtomicBool::new(false));
        signal_hook::flag::register(libc::SIGHUP, flag.clone())?;
        let _ = RELOAD.set(flag);
    }
    install_for(&SIGNALS[..2])
}

/// True once per SIGHUP since the last call.
pub fn take_reload() -> bool {
    RELOAD
        .get()
        .is_some_and(|f| f.swap(false, Ordering::SeqCst))
}

fn install_for(signals: &[i32]) -> io::Result<()> {
    if FLAG.get().is_some() {
        return Ok(());
    }
    let flag = Arc::new(AtomicBool::new(false));
    // Held back while the two actions are registered: a signal between
    // them found the process catching it (the first) but not yet setting
    // the flag, and was lost (a Ctrl-C right at the start ran on).
    let _held = Blocked::new(signals);
    for &sig in signals {
        // Order matters: the default action is armed by the flag of an
        // earlier signal, so it must run before this signal sets the flag.
        signal_hook::flag::register_conditional_default(sig, flag.clone())?;
        signal_hook::flag::register(sig, flag.clone())?;
    }
    let _ = FLAG.set(flag);
    Ok(())
}

/// Signals blocked in this thread until dropped (then the previous mask
/// again: one that arrived meanwhile is delivered then).
struct Blocked {
    old: libc::sigset_t,
}

impl Blocked {
    fn new(signals: &[i32]) -> Blocked {
        // SAFETY: sigset_t is plain data; sigemptyset initializes it.
        let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: as above; the old mask is written by pthread_sigmask.
        let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: set and old are valid sigset_t; the signal numbers are valid.
        unsafe {
            libc::sigemptyset(&mut set);
            for &sig in signals {
                libc::sigaddset(&mut set, sig);
            }
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
        }
        Blocked { old }
    }
}

impl Drop for Blocked {
    fn drop(&mut self) {
        // SAFETY: old is the mask pthread_sigmask returned.
        unsafe {
            libc::pthread_sigmask(libc::SIG_SETMASK, &self.old, std::ptr::null_mut());
        }
    }
}

/// True once a termination signal arrived.
pub fn interrupted() -> bool {
    FLAG.get().is_some_and(|f| f.load(Ordering::SeqCst))
}

/// From now on the next termination signal ends the process at once:
/// for stages that have nothing to print if interrupted half-way.
pub fn die_on_next() {
    if let Some(f) = FLAG.get() {
        f.store(true, Ordering::SeqCst);
    }
}
