//! Targets: the command bpfscope runs for `-- CMD`, held at the starting
//! line until its pid is in the kernel's tracked set.
//!
//! The child is forked by hand: std's Command::spawn waits for exec to
//! happen, which a child held at a gate never does before release.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// Which processes are traced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    All,
    Pid(u32),
    /// Run this program (resolved path) with these arguments.
    Command {
        program: PathBuf,
        args: Vec<String>,
    },
}

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
    pub fn for_target(target: &Target) -> Result<(Option<GatedChild>, Option<u32>)> {
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
        // SAFETY: getpid has no preconditions.
        let parent = unsafe { libc::getpid() };

        // SAFETY: fork has no memory-safety preconditions; the child branch
        // below only makes async-signal-safe calls (prctl, getppid, close,
        // read, execv, _exit) on memory allocated before the fork.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(io::Error::last_os_error()).context("forking the command");
        }
        if pid == 0 {
            // SAFETY: see above; every pointer passed is to memory that this
            // (copied) address space keeps alive until execv or _exit.
            unsafe { gated_child(rd.as_raw_fd(), wr.as_raw_fd(), parent, &prog, &argv) }
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
    /// Never released (an error or a signal came first): the command must
    /// not run untraced, so end it and reap it. Closing the gate alone
    /// would do; the kill makes the wait certain to end.
    fn drop(&mut self) {
        self.gate.take();
        if self.pid > 0 {
            // SAFETY: kill has no memory-safety preconditions; the pid is our
            // own unreaped child, so it cannot name another process.
            unsafe { libc::kill(self.pid, libc::SIGKILL) };
            let _ = RunningChild { pid: self.pid }.wait();
        }
    }
}

/// The child side of the gate: dies with bpfscope, holds nothing of it,
/// waits for the release byte, then runs the command.
///
/// # Safety
/// Must only be called in a freshly forked child, with `rd`/`wr` the gate
/// pipe's descriptors and `argv` a NULL-terminated array of pointers into
/// `prog`'s and the arguments' live CStrings. Never returns.
unsafe fn gated_child(
    rd: i32,
    wr: i32,
    parent: libc::pid_t,
    prog: &CString,
    argv: &[*const libc::c_char],
) -> ! {
    // The write end must not stay open here, or the EOF that tells a
    // never-released child to give up could never come.
    libc::close(wr);
    // Killed with bpfscope, even by SIGKILL, while still held at the gate;
    // checked afterwards, since the parent may already have died.
    if libc::prctl(
        libc::PR_SET_PDEATHSIG,
        libc::SIGKILL as libc::c_ulong,
        0,
        0,
        0,
    ) != 0
        || libc::getppid() != parent
    {
        libc::_exit(127);
    }
    // bpfscope's signal handlers were copied with the fork, so a Ctrl-C
    // to the process group would only set a flag here: take the defaults.
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        libc::signal(sig, libc::SIG_DFL);
    }
    // Descriptors bpfscope opened are close-on-exec, but this child lives
    // before exec: drop every one of them now (stdio and the gate stay),
    // so a child left behind could never hold a BPF object.
    close_cloexec_fds(rd);
    let mut b = 0u8;
    let n = libc::read(rd, (&mut b as *mut u8).cast(), 1);
    if n != 1 {
        // bpfscope went away or gave up before releasing us: never run untraced.
        libc::_exit(127);
    }
    libc::close(rd);
    // Released: the command runs as long as bpfscope traces it; when
    // bpfscope ends, however it ends, the command is asked to end too
    // (SIGTERM, which it may handle), so nothing outlives the run.
    libc::prctl(
        libc::PR_SET_PDEATHSIG,
        libc::SIGTERM as libc::c_ulong,
        0,
        0,
        0,
    );
    libc::execv(prog.as_ptr(), argv.as_ptr());
    libc::_exit(127);
}

/// Closes the descriptors marked close-on-exec, except `keep`, without
/// allocating (getdents64 into a stack buffer): async-signal-safe for a
/// forked child. Descriptors the user handed down without the flag stay.
///
/// # Safety
/// Only for a forked child before exec: it closes descriptors that other
/// owners in the parent's address space believe open.
unsafe fn close_cloexec_fds(keep: i32) {
    let dir = libc::open(
        c"/proc/self/fd".as_ptr(),
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
    );
    if dir < 0 {
        return;
    }
    let mut buf = [0u8; 4096];
    let mut victims = [0i32; 512];
    loop {
        let n = libc::syscall(libc::SYS_getdents64, dir, buf.as_mut_ptr(), buf.len());
        if n <= 0 {
            break;
        }
        let mut nv = 0;
        let mut off = 0usize;
        while off + 19 < n as usize && nv < victims.len() {
            // struct linux_dirent64: u64 ino, i64 off, u16 reclen, u8 type, name.
            let reclen = u16::from_ne_bytes([buf[off + 16], buf[off + 17]]) as usize;
            if reclen == 0 {
                break;
            }
            let mut fd: i32 = 0;
            let mut digits = false;
            for &c in &buf[off + 19..(off + reclen).min(n as usize)] {
                if c.is_ascii_digit() {
                    fd = fd.saturating_mul(10).saturating_add((c - b'0') as i32);
                    digits = true;
                } else {
                    break;
                }
            }
            if digits && fd > 2 && fd != keep && fd != dir {
                let flags = libc::fcntl(fd, libc::F_GETFD);
                if flags >= 0 && flags & libc::FD_CLOEXEC != 0 {
                    victims[nv] = fd;
                    nv += 1;
                }
            }
            off += reclen;
        }
        // Closing while reading the directory is allowed, but closing after
        // each batch keeps the listing simple to reason about.
        for &fd in &victims[..nv] {
            libc::close(fd);
        }
    }
    libc::close(dir);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alive(pid: u32) -> bool {
        // SAFETY: signal 0 only asks whether the process exists.
        unsafe { libc::kill(pid as libc::pid_t, 0) == 0 }
    }

    #[test]
    fn targets_without_a_command() {
        let (child, pid) = GatedChild::for_target(&Target::All).unwrap();
        assert!(child.is_none() && pid.is_none());
        let (child, pid) = GatedChild::for_target(&Target::Pid(42)).unwrap();
        assert!(child.is_none());
        assert_eq!(pid, Some(42));
    }

    #[test]
    fn a_released_command_runs_to_its_end() {
        let target = Target::Command {
            program: "/bin/sh".into(),
            args: vec!["-c".into(), "exit 3".into()],
        };
        let (child, pid) = GatedChild::for_target(&target).unwrap();
        let child = child.unwrap();
        assert_eq!(pid, Some(child.pid()));
        let running = child.release().unwrap();
        let status = running.wait().unwrap();
        assert!(libc::WIFEXITED(status));
        assert_eq!(libc::WEXITSTATUS(status), 3);
    }

    #[test]
    fn a_command_never_released_never_runs() {
        let child = GatedChild::spawn(Path::new("/bin/true"), &[]).unwrap();
        let pid = child.pid();
        assert!(alive(pid));
        drop(child);
        // Killed and reaped: the pid is gone.
        assert!(!alive(pid));
    }

    #[test]
    fn arguments_with_nul_bytes_are_refused() {
        let e = GatedChild::spawn(Path::new("/bin/true"), &["a\0b".into()])
            .err()
            .unwrap();
        assert_eq!(e.to_string(), "command argument has a NUL byte");
    }
}
