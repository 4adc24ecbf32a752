//! Attach stage: feature probes, the per-probe plan, loading the generic
//! programs and attaching them with cookies, and targets.

pub mod clock;
pub mod dispatch;
pub mod features;
pub mod irqtext;
pub mod kfunc;
pub mod plan;
pub mod session;
pub mod shape;
pub mod target;

/// libbpf's log: shown with -v, otherwise kept so that a failed load can
/// say why in one line.
pub mod libbpf_log {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Mutex;

    use libbpf_rs::PrintLevel;

    static VERBOSE: AtomicBool = AtomicBool::new(false);
    static LAST: Mutex<Vec<String>> = Mutex::new(Vec::new());

    fn print(level: PrintLevel, msg: String) {
        if VERBOSE.load(Ordering::Relaxed) && level != PrintLevel::Debug {
            eprint!("{msg}");
        }
        if level == PrintLevel::Warn {
            if let Ok(mut last) = LAST.lock() {
                if last.len() >= 64 {
                    last.remove(0);
                }
                last.push(msg.trim_end().to_string());
            }
        }
    }

    pub fn init(verbose: bool) {
        VERBOSE.store(verbose, Ordering::Relaxed);
        let level = if verbose {
            PrintLevel::Info
        } else {
            PrintLevel::Warn
        };
        libbpf_rs::set_print(Some((level, print)));
    }

    /// The most telling recent libbpf warning, formatted to append to an error.
    pub fn last_error_hint() -> String {
        let Ok(last) = LAST.lock() else {
            return String::new();
        };
        // The verifier states its reason on the line before "processed N insns".
        let reason = last
            .iter()
            .flat_map(|m| m.lines())
            .collect::<Vec<_>>()
            .windows(2)
            .rev()
            .find(|w| w[1].starts_with("processed "))
            .map(|w| w[0].trim().to_string());
        match reason {
            Some(r) => format!(" (verifier: {r}; rerun with -v for its log)"),
            None => last
                .last()
                .map(|l| format!(" ({l}; rerun with -v for details)"))
                .unwrap_or_default(),
        }
    }
}
