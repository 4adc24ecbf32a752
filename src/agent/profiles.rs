//! Profiles the agent hands out: windows and on-demand requests, taken
//! from the continuous profiler's ticks, symbolized and encoded as pprof.
//!
//! Requests are answered in batches: those that arrived in the same
//! second with the same span and selection share one profile (built once,
//! sent to each), and every profile of a batch shares one symbolizer, so
//! N concurrent requests cost about what one does.

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::{Context, Result};

use super::cgroups::CgroupNames;
use super::{ProfileRequest, Selection};
use crate::profile::continuous::{Built, Profiler};
use crate::profile::session::RawStack;
use bpfscope_symbolize::{Resolver, SymbolConfig};

/// A gzipped pprof and what it covers.
pub struct Pprof {
    pub bytes: Arc<Vec<u8>>,
    pub samples: u64,
    pub start_unix_ns: u64,
    pub end_unix_ns: u64,
}

/// What a request is answered with.
type Reply = Result<Arc<Vec<u8>>, String>;

/// A request waiting for its span to be read out.
pub struct Pending {
    pub from_ns: u64,
    pub req: ProfileRequest,
}

impl Pending {
    pub fn end_ns(&self) -> u64 {
        self.from_ns + self.req.seconds * 1_000_000_000
    }
}

/// A symbolizer for one batch of profiles. Not kept between batches: one
/// kept for the run would hold every binary ever sampled mapped and its
/// debug info parsed (tens of MiB once a compiler or an interpreter has
/// been on the CPU); opening them again costs less than holding them.
pub fn resolver() -> Resolver {
    Resolver::new(&SymbolConfig::from_env(), true)
}

/// The samples of (from_ns, to_ns] that `sel` selects, as a pprof.
pub fn build(
    p: &mut Profiler,
    from_ns: u64,
    to_ns: u64,
    sel: &Selection,
    cgroups: &mut CgroupNames,
    resolver: &mut Resolver,
) -> Result<Pprof> {
    let built = p.recording(from_ns, to_ns, |s| selected(s, sel, cgroups));
    encode(built, cgroups, resolver)
}

fn encode(b: Built, cgroups: &mut CgroupNames, resolver: &mut Resolver) -> Result<Pprof> {
    let (mut profile, _) = crate::report::recording(&b.recording, resolver);
    drop(b.recording);
    for s in &mut profile.samples {
        if let Some(l) = cgroups.labels(s.cgroup_id) {
            s.labels = l.pairs();
        }
    }
    let mut bytes = Vec::new();
    crate::render::pprof::write(&profile, &mut bytes).context("encoding the profile")?;
    Ok(Pprof {
        bytes: Arc::new(bytes),
        samples: b.samples,
        start_unix_ns: b.start_unix_ns,
        end_unix_ns: b.end_unix_ns,
    })
}

/// Answers `ready` (all read out up to `done_ns`): one profile per
/// distinct (span, selection), one symbolizer for all.
pub fn answer(p: &mut Profiler, ready: Vec<Pending>, done_ns: u64, cgroups: &mut CgroupNames) {
    if ready.is_empty() {
        return;
    }
    let mut resolver = resolver();
    let mut built: HashMap<(u64, u64, Selection), Reply> = HashMap::new();
    for r in ready {
        let end = r.end_ns().min(done_ns);
        let key = (r.from_ns, end, r.req.sel.clone());
        let reply = built
            .entry(key)
            .or_insert_with(|| {
                build(p, r.from_ns, end, &r.req.sel, cgroups, &mut resolver)
                    .map(|b| b.bytes)
                    .map_err(|e| format!("{e:#}"))
            })
            .clone();
        // The client may have gone: nothing to do then.
        let _ = r.req.reply.send(reply);
    }
    drop(resolver);
    crate::profile::continuous::give_back_memory();
}

fn selected(s: &RawStack, sel: &Selection, cgroups: &mut CgroupNames) -> bool {
    if sel.pid.is_some_and(|p| p != s.tgid) {
        return false;
    }
    if sel
        .comm
        .as_ref()
        .is_some_and(|c| *c != s.comm && *c != s.thread)
    {
        return false;
    }
    if let Some(prefix) = &sel.cgroup {
        let path = cgroups
            .labels(s.cgroup)
            .map(|l| l.path.as_str())
            .unwrap_or("");
        let under = path == prefix
            || path
                .strip_prefix(prefix.trim_end_matches('/'))
                .is_some_and(|rest| rest.starts_with('/'));
        if !under {
            return false;
        }
    }
    true
}
