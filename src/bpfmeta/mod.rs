//! BPF programs as profiling subjects, live: reading what a program is
//! while it is loaded (`info`), the side-band records that announce loads
//! and unloads (`sideband`), the second sampler that sees inside programs
//! the sampling program cannot (`guarded`), both read through `perfbuf`,
//! and run-time statistics (`stats`). What is
//! captured is kept as `bpfscope_recording::bpfprog` types, so samples in
//! its JIT code can be named and annotated after it is gone.

pub mod guarded;
pub mod info;
pub mod perfbuf;
pub mod sideband;
pub mod stats;
