//! bpfscope's integration tests: one test binary, `it`, with a module per
//! area and the helpers they share in `common`. A test is addressed as
//! `module::name` (`cargo test --release -- trace::pid_target`).
//!
//! Two tiers:
//!
//! - Plain tests need nothing privileged: bad input refused before the
//!   kernel is asked anything, symbolization, debuginfod clients against
//!   fake servers. `cargo test --release` runs them, as any user.
//! - Tests marked `#[ignore = "needs root and BPF"]` load BPF programs into
//!   the running kernel. They run only when asked for, as root:
//!   `cargo test --release -- --include-ignored` (`scripts/test` does).
//!   Asked for without root, they fail (`common::require_root`) instead of
//!   passing having tested nothing.
//!
//! A test that cannot do its work here for a reason of this machine or
//! kernel (kprobes refused under lockdown, a kernel feature missing, a tool
//! not installed) passes and prints `SKIP module::name: reason` to stderr,
//! past the harness's capture (`common::skip`), so the run shows it.
//!
//! Workloads are built from `tests/workloads/` into the target directory;
//! `tests/guest/run-tests` runs the modules of the tracing engine again
//! inside other kernels.

// Allowed here: a failed check panics: that is how a test fails.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

mod agent;
mod agent_clients;
mod bpf;
mod bpfprof;
mod doctor;
mod faults;
mod kfunc;
mod parsers;
mod profile;
mod run;
mod run_lang;
mod runtimes;
mod targets;
mod top;
mod trace;
mod unwind;
mod uprobes;
