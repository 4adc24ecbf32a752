//! The bpfscope binary: parse, run, map errors to exit codes.

use clap::error::ErrorKind;
use clap::Parser;

use bpfscope::cli::{Cli, Settings};
use bpfscope::error::exit_code;

fn main() {
    // A panic on any thread ends the whole process at once, as the release
    // profile's `panic = "abort"` did (dropped so that test builds share
    // its dependencies): no thread goes on with the others gone.
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        std::process::abort();
    }));
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            if matches!(
                e.kind(),
                ErrorKind::DisplayHelp
                    | ErrorKind::DisplayVersion
                    | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) {
                let _ = e.print();
                std::process::exit(e.exit_code());
            }
            eprintln!("bpfscope: error: {}", one_line(&e.render().to_string()));
            std::process::exit(2);
        }
    };
    // Before resolving probes (which can take a while), so that a signal
    // at any moment ends the run the way the stages expect.
    // The agent is a service: SIGHUP reloads it instead of ending it.
    let installed = if matches!(cli.command, bpfscope::cli::Command::Agent(_)) {
        bpfscope_sys::signals::install_reloadable()
    } else {
        bpfscope_sys::signals::install()
    };
    if let Err(e) = installed {
        eprintln!("bpfscope: error: installing signal handlers: {e}");
        std::process::exit(1);
    }
    bpfscope_sys::raise_fd_limit();
    // `run` keeps bpftrace's exit status (0 whatever `-c CMD` returned).
    let command_status = !matches!(cli.command, bpfscope::cli::Command::Run(_));
    let result = Settings::from_cli(cli)
        .map_err(anyhow::Error::from)
        .and_then(bpfscope::cmd::run);
    if let Err(e) = result {
        eprintln!("bpfscope: error: {e:#}");
        std::process::exit(exit_code(&e));
    }
    // A run of `-- CMD` ends with the command's status, as `perf record`
    // and `time` do, so a script sees the command fail through bpfscope.
    if let Some(status) = bpfscope::error::command_status().filter(|_| command_status) {
        std::process::exit(status);
    }
}

/// clap's multi-line message as one line, without the usage and help hints.
fn one_line(msg: &str) -> String {
    msg.lines()
        .map(str::trim)
        .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"))
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
        .trim_start_matches("error: ")
        .to_string()
}
