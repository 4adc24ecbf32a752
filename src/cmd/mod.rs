//! One function per subcommand, each running the stages in order:
//! resolve -> attach -> collect -> symbolize -> render.

pub mod agent;
pub mod bpf;
pub mod diff;
pub mod doctor;
pub mod list;
pub mod profile;
pub mod run;
pub mod top;
pub mod trace;

use anyhow::Result;
use clap::CommandFactory;

use crate::cli::{Cli, Settings};

pub fn run(settings: Settings) -> Result<()> {
    // Commands that attach nothing have nothing to finish on a signal:
    // the first one ends them at once.
    if matches!(
        settings,
        Settings::List(_)
            | Settings::Report(_)
            | Settings::Symbolize(_)
            | Settings::Completions(_)
            | Settings::Manpages(_)
            | Settings::Diff(_)
            | Settings::Annotate(_)
    ) {
        bpfscope_sys::signals::die_on_next();
    }
    match settings {
        Settings::Trace(s) => trace::run(*s),
        Settings::List(s) => list::run(s),
        Settings::Profile(s) => profile::profile(*s),
        Settings::Record(s) => profile::record(*s),
        Settings::Report(s) => profile::report(*s),
        Settings::Symbolize(s) => profile::symbolize(*s),
        Settings::Top(s) => top::run(*s),
        Settings::Diff(s) => diff::run(*s),
        Settings::Annotate(s) => profile::annotate(*s),
        Settings::Bpf(s) => bpf::run(s),
        Settings::Agent(s) => agent::run(*s),
        Settings::Run(s) => run::run(*s),
        Settings::Completions(shell) => {
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "bpfscope",
                &mut std::io::stdout(),
            );
            Ok(())
        }
        Settings::Manpages(dir) => manpages(&dir),
        Settings::Doctor { json, quick } => doctor::run(json, quick),
    }
}

/// `bpfscope.1` and one page per (non-hidden) subcommand, `bpfscope-bpf-top.1`
/// included, from the same clap definitions as `--help`.
fn manpages(dir: &std::path::Path) -> Result<()> {
    use anyhow::Context;
    std::fs::create_dir_all(dir)
        .with_context(|| format!("creating {}: choose a writable directory", dir.display()))?;
    clap_mangen::generate_to(Cli::command(), dir)
        .with_context(|| format!("writing man pages into {}", dir.display()))
}
