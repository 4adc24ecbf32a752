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
    if err.chain().any(|e| e.downcast_ref::<Error>().is_some()) {
        2
    } else {
        1
    }
}
