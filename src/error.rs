//! Error kinds that decide the exit status. Library code returns these (or
//! its own typed errors that convert into them); the binary adds context
//! with anyhow and maps the kind to an exit code.

/// An error the user can fix by changing the invocation or the machine
/// (bad input, missing privilege or kernel feature): exit status 2.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad arguments, probe names, fields, filters or files.
    #[error("{0}")]
    Usage(String),
    /// Missing privileges or a kernel facility.
    #[error("{0}")]
    Environment(String),
    /// A termination signal arrived before the run could start; the
    /// command ends quietly (exit status 0, like Ctrl-C during a run).
    #[error("interrupted")]
    Interrupted,
}

impl From<bpfscope_sys::MissingPrivileges> for Error {
    fn from(e: bpfscope_sys::MissingPrivileges) -> Error {
        Error::Environment(e.to_string())
    }
}

/// Shorthand for returning a usage error.
#[macro_export]
macro_rules! usage {
    ($($arg:tt)*) => {
        $crate::error::Error::Usage(format!($($arg)*))
    };
}

/// Exit status for an error chain: 2 when any link is a usage or
/// environment error, 1 otherwise.
pub fn exit_code(err: &anyhow::Error) -> i32 {
    if err
        .chain()
        .any(|e| matches!(e.downcast_ref::<Error>(), Some(Error::Interrupted)))
    {
        0
    } else if err.chain().any(|e| {
        e.downcast_ref::<Error>().is_some()
            || e.downcast_ref::<bpfscope_sys::outfile::OutputError>()
                .is_some()
    }) {
        2
    } else {
        1
    }
}

/// The wait status of the `-- CMD` command, once it has ended (-1 before).
static COMMAND_STATUS: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);

/// Notes how the `-- CMD` command ended (its wait status).
pub fn set_command_status(wait_status: i32) {
    COMMAND_STATUS.store(wait_status, std::sync::atomic::Ordering::Relaxed);
}

/// The exit status a run passes on from its `-- CMD` command, as `perf
/// record` does (and a shell): the command's own, or 128 + the signal that
/// ended it. None while it runs, and for runs without a command.
pub fn command_status() -> Option<i32> {
    let st = COMMAND_STATUS.load(std::sync::atomic::Ordering::Relaxed);
    if st < 0 {
        None
    } else if libc::WIFSIGNALED(st) {
        Some(128 + libc::WTERMSIG(st))
    } else {
        Some(libc::WEXITSTATUS(st))
    }
}

/// True when the chain ends in [`Error::Interrupted`].
pub fn is_interrupted(err: &anyhow::Error) -> bool {
    err.chain()
        .any(|c| matches!(c.downcast_ref::<Error>(), Some(Error::Interrupted)))
}

/// What the kernel refused while setting up a run, as an environment error
/// (exit 2) in one line, with the fix when the cause is a known one.
pub fn refused(err: anyhow::Error) -> Error {
    let errno = err.chain().find_map(|c| {
        c.downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::raw_os_error)
            .or_else(|| {
                // libbpf-rs errors carry the errno in their message only.
                let s = c.to_string();
                let n = s.rsplit_once("(os error ")?.1.trim_end_matches(')');
                n.parse().ok()
            })
    });
    let hint = match errno {
        Some(libc::EMFILE) | Some(libc::ENFILE) => {
            " (each probe needs a file descriptor: raise the open-file limit with 'ulimit -n', or attach fewer probes)"
        }
        Some(libc::ENOMEM) => " (the kernel is out of memory for BPF objects: lower --max-keys or attach fewer probes)",
        _ => "",
    };
    Error::Environment(format!("{err:#}{hint}"))
}

/// A reader that went away (`| head`): the run ends quietly.
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
