//! One raw_tp on sys_enter and sys_exit for many trace sessions (the
//! agent's metrics), each syscall routed to the session that traces it by
//! a tail call (dispatch.bpf.c). A session whose syscall probes are routed
//! here attaches no raw_tp of its own: N metrics cost one raw tracepoint
//! run per syscall, not N, and keep their own maps, epochs and counters.

use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, BorrowedFd};

use anyhow::{Context, Result};
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{Link, MapCore, MapFlags, OpenObject};

use bpfscope_bpf::abi::bs_limits;
use bpfscope_bpf::dispatch::{DispatchSkel, DispatchSkelBuilder};

/// Who routes a slot: an id the caller gives each session.
pub type Owner = u64;

pub struct Dispatch {
    skel: DispatchSkel<'static>,
    enter: Option<Link>,
    exit: Option<Link>,
    owners: HashMap<u32, Owner>,
}

/// Whether a slot is a syscall's exit.
fn is_exit(slot: u32) -> bool {
    slot >= bs_limits::BS_SYS_EXIT_BASE.0
}

impl Dispatch {
    pub fn load() -> Result<Dispatch> {
        // The object outlives the skeleton, which lives as long as the
        // agent: a few hundred bytes, once.
        let storage: &'static mut MaybeUninit<OpenObject> =
            Box::leak(Box::new(MaybeUninit::uninit()));
        let skel = DispatchSkelBuilder::default()
            .open(storage)
            .context("opening the syscall dispatcher")?
            .load()
            .context("loading the syscall dispatcher")?;
        Ok(Dispatch {
            skel,
            enter: None,
            exit: None,
            owners: HashMap::new(),
        })
    }

    /// Slots routed to a session other than `except`.
    pub fn taken(&self, except: &[Owner]) -> Vec<u32> {
        self.owners
            .iter()
            .filter(|(_, o)| !except.contains(o))
            .map(|(s, _)| *s)
            .collect()
    }

    /// Routes each slot to its program (a session's sys_enter or sys_exit
    /// program), replacing whoever routed it before: a session taking
    /// over from another loses no event in between.
    pub fn route(&mut self, owner: Owner, routes: &[(u32, BorrowedFd<'_>)]) -> Result<()> {
        for (slot, prog) in routes {
            self.skel
                .maps
                .sys_progs
                .update(
                    &slot.to_ne_bytes(),
                    &prog.as_raw_fd().to_ne_bytes(),
                    MapFlags::ANY,
                )
                .with_context(|| format!("routing syscall slot {slot}"))?;
            self.owners.insert(*slot, owner);
        }
        self.attach_needed()
    }

    /// Takes `owner`'s slots out of the table (those another session has
    /// taken over stay).
    pub fn unroute(&mut self, owner: Owner) {
        let mine: Vec<u32> = self
            .owners
            .iter()
            .filter(|(_, o)| **o == owner)
            .map(|(s, _)| *s)
            .collect();
        for slot in mine {
            // Already gone is fine.
            let _ = self.skel.maps.sys_progs.delete(&slot.to_ne_bytes());
            self.owners.remove(&slot);
        }
        // Detaching a raw_tp is immediate; neither runs without a slot.
        if !self.owners.keys().any(|s| !is_exit(*s)) {
            self.enter = None;
        }
        if !self.owners.keys().any(|s| is_exit(*s)) {
            self.exit = None;
        }
    }

    /// Attaches the raw_tp of each direction some slot needs.
    fn attach_needed(&mut self) -> Result<()> {
        let progs = &self.skel.progs;
        if self.enter.is_none() && self.owners.keys().any(|s| !is_exit(*s)) {
            self.enter = Some(
                progs
                    .bpfscope_dispatch_in
                    .attach_raw_tracepoint("sys_enter")
                    .context("attaching the dispatcher to raw tracepoint sys_enter")?,
            );
        }
        if self.exit.is_none() && self.owners.keys().any(|s| is_exit(*s)) {
            self.exit = Some(
                progs
                    .bpfscope_dispatch_out
                    .attach_raw_tracepoint("sys_exit")
                    .context("attaching the dispatcher to raw tracepoint sys_exit")?,
            );
        }
        Ok(())
    }
}
