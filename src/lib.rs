//! bpfscope: tracing, profiling and BPF program visibility on eBPF and perf.
//!
//! Every command is the same pipeline, and each stage has its module:
//! `cli` (arguments to settings) -> `probe` (resolve what to attach to) ->
//! `filter` (expressions compiled for the kernel) -> `attach` (load generic
//! programs, attach links with cookies) -> `collect` (maps, ring buffers,
//! lost counts) -> `render` (text, JSON). `cmd` runs them per subcommand.
//! Profiling adds `profile` (sampling with in-kernel stack aggregation,
//! recordings) and `symbolize` (build ids and addresses to names, offline).
//! `agent` runs the profiler and the tracing engine continuously and
//! serves what they gather over HTTP. `script` is `bpfscope run`'s front
//! end: a bpftrace-language script parsed, typed and lowered into code for
//! the in-kernel script machine, then attached like the verbs' probes.

pub mod agent;
pub mod attach;
pub mod bpfmeta;
pub mod cli;
pub mod cmd;
pub mod collect;
pub mod error;
pub mod filter;
pub mod lang;
pub mod probe;
pub mod profile;
pub mod render;
pub mod report;
pub mod script;

#[cfg(test)]
mod proptests;
