//! `bpfscope agent`: the settings read once here, and again on each
//! SIGHUP, for the agent layer that runs everything.

use anyhow::Result;

use crate::cli::agent::{self as config, AgentArgs};

pub fn run(args: AgentArgs) -> Result<()> {
    // Bad input is said as such, with or without privileges.
    let cfg = config::load(&args)?;
    crate::agent::run(cfg, move || config::load(&args))
}
