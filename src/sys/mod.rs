//! System facts and process-wide state every stage may need (signals,
//! output files that appear whole or not at all). A leaf: it imports
//! nothing else of bpfscope.

pub mod outfile;
pub mod signals;

/// Raises the soft open-file limit to the hard one: every probe is a
/// descriptor or two (a perf event and its link), and a glob over every
/// tracepoint needs thousands where shells start with a soft limit of 1024.
/// A hard limit set by the user (`ulimit -n`, which sets both) still holds.
pub fn raise_fd_limit() {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the rlimit passed; setrlimit reads it.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 && r.rlim_cur < r.rlim_max {
            r.rlim_cur = r.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}
