//! Targets: the command bpfscope runs for `-- CMD`, held at the starting
//! line until its pid is in the kernel's tracked set.
//!
//! The child is forked by hand: std's Command::spawn waits for exec to
//! happen, which a child held at a gate never does before release.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use anyhow::{Context, Result};

/// A forked command that waits before exec until `release` is called.
pub struct GatedChild {
    pid: libc::pid_t,
    /// Write end of the gate pipe; one byte releases the child, EOF makes it exit.
    gate: Option<OwnedFd>,
}

/// A released command, to be waited for.
#[derive(Debug)]
pub struct RunningChild {
    pid: libc::pid_t,
}

impl RunningChild {
    pub fn pid(&self) -> u32 {
        self.pid as u32
    }

    /// Waits for the command to exit; returns its wait status.
    pub fn wait(&self) -> io::Result<i32> {
        let mut status = 0;
        loop {
            // SAFETY: waitpid writes the status into the local.
            let r = unsafe { libc::waitpid(self.pid, &mut status, 0) };
            if r == self.pid {
                return Ok(status);
            }
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::Interrupted {
                return Err(err);
            }
        }
    }
}

impl GatedChild {
    /// The gated command of a `-- CMD` target (None for other targets),
    /// and the pid to put in the kernel's tracked set before attaching.
    pub fn for_target(target: &crate::cli::Target) -> Result<(Option<GatedChild>, Option<u32>)> {
        use crate::cli::Target;
        Ok(match target {
            Target::Command { program, args } => {
                let g = GatedChild::spawn(program, args)?;
                let pid = g.pid();
                (Some(g), Some(pid))
            }
            Target::Pid(pid) => (None, Some(*pid)),
            Target::All => (None, None),
        })
    }

    pub fn spawn(program: &Path, args: &[String]) -> Result<GatedChild> {
        // Everything the child needs is allocated before fork.
        let prog =
            CString::new(program.as_os_str().as_bytes()).context("command path has a NUL byte")?;
        let mut argv_c = vec![prog.clone()];
        for a in args {
            argv_c.push(CString::new(a.as_bytes()).context("command argument has a NUL byte")?);
        }
        let mut argv: Vec<*const libc::c_char> = argv_c.iter().map(|c| c.as_ptr()).collect();
        argv.push(std::ptr::null());

        let mut fds = [0i32; 2];
        // SAFETY: fds has room for the two descriptors pipe2 writes.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error()).context("creating the start pipe");
        }
        // SAFETY: pipe2 succeeded, so both descriptors are open and owned by nobody else.
        let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };

        // SAFETY: fork has no memory-safety preconditions; the child branch
        // below only makes async-signal-safe calls (read, execv, _exit).
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(io::Error::last_os_error()).context("forking the command");
        }
        if pid == 0 {
            let mut b = 0u8;
            // SAFETY: async-signal-safe calls on valid buffers; execv's argv
            // is a NULL-terminated array of NUL-terminated strings kept alive
            // by this (copied) address space. _exit never returns.
            unsafe {
                let n = libc::read(rd.as_raw_fd(), (&mut b as *mut u8).cast(), 1);
                if n != 1 {
                    // bpfscope went away before releasing us: never run untraced.
                    libc::_exit(127);
                }
                libc::execv(prog.as_ptr(), argv.as_ptr());
                libc::_exit(127);
            }
        }
        drop(rd);
        Ok(GatedChild {
            pid,
            gate: Some(wr),
        })
    }

    pub fn pid(&self) -> u32 {
        self.pid as u32
    }

    /// Lets the child exec.
    pub fn release(mut self) -> Result<RunningChild> {
        let gate = self.gate.take().context("command already released")?;
        let b = [1u8];
        // SAFETY: gate is an open pipe write end; b is a valid 1-byte buffer.
        let n = unsafe { libc::write(gate.as_raw_fd(), b.as_ptr().cast(), 1) };
        if n != 1 {
            return Err(io::Error::last_os_error()).context("releasing the command");
        }
        let pid = self.pid;
        self.pid = 0;
        Ok(RunningChild { pid })
    }
}

impl Drop for GatedChild {
    /// Never released (an error came first): closing the gate makes it exit; reap it.
    fn drop(&mut self) {
        self.gate.take();
        if self.pid > 0 {
            let _ = RunningChild { pid: self.pid }.wait();
        }
    }
}
