//! The kernel's interrupt code as address ranges, for the programs'
//! `irq_text`: an event whose kernel stack passes through it ran in an
//! interrupt, and is traced even when the task it landed on is bpfscope's
//! own (trace.bpf.c's `bs_in_irq`). x86 needs them; arm64's programs read
//! the preempt count instead.

use std::thread::JoinHandle;

use bpfscope_bpf::abi::bs_limits;

use super::plan::{Path, Plan};

/// `[start, end)` pairs, zero where not found.
pub type Ranges = [u64; 2 * bs_limits::BS_IRQ_TEXTS.0 as usize];

/// Whether a probe on `path` can fire in an interrupt. Syscalls, user
/// probes and samples are always their task's own.
pub fn may_irq(path: &Path) -> bool {
    matches!(
        path,
        Path::RawTp { .. } | Path::Tracepoint { .. } | Path::Kfunc(_)
    )
}

/// Reads kallsyms in a thread of its own (50 ms here) while the object
/// loads, where some probe of `plan` can fire in an interrupt.
pub fn spawn(plan: &Plan) -> Option<JoinHandle<Ranges>> {
    plan.probes
        .iter()
        .any(|p| may_irq(&p.path))
        .then(|| std::thread::spawn(read))
}

/// The ranges from /proc/kallsyms; all zero when it cannot be read or
/// hides the addresses (then bpfscope's own task drops every event, as
/// before these ranges).
pub fn read() -> Ranges {
    std::fs::read_to_string("/proc/kallsyms")
        .map(|t| parse(&t))
        .unwrap_or_default()
}

/// Hard IRQ entry (`.irqentry.text`), softirq entry (`.softirqentry.text`:
/// `__do_softirq`, the whole loop before 6.9), and the softirq loop that
/// 6.9+ keeps outside it (`handle_softirqs`, up to the next symbol).
fn parse(kallsyms: &str) -> Ranges {
    let mut out = Ranges::default();
    let mut prev_softirqs = false;
    for line in kallsyms.lines() {
        let mut f = line.split_whitespace();
        let (Some(addr), Some(_), Some(name)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        let Ok(addr) = u64::from_str_radix(addr, 16) else {
            continue;
        };
        if prev_softirqs && out[4] != 0 {
            out[5] = addr;
            prev_softirqs = false;
        }
        match name {
            "__irqentry_text_start" => out[0] = addr,
            "__irqentry_text_end" => out[1] = addr,
            "__softirqentry_text_start" => out[2] = addr,
            "__softirqentry_text_end" => out[3] = addr,
            "handle_softirqs" if f.next().is_none() => {
                out[4] = addr;
                prev_softirqs = true;
            }
            _ => {}
        }
    }
    // A range with an end before its start (or none) is dropped whole.
    for r in out.chunks_exact_mut(2) {
        if r[0] == 0 || r[1] <= r[0] {
            r.fill(0);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_come_from_the_section_markers_and_the_softirq_loop() {
        let k = "ffffffff81000300 T __irqentry_text_start\n\
                 ffffffff81000f70 T __irqentry_text_end\n\
                 ffffffff81369560 t __pfx_handle_softirqs\n\
                 ffffffff81369570 t handle_softirqs\n\
                 ffffffff81369800 t __pfx___irq_exit_rcu\n\
                 ffffffffc0a01000 t handle_softirqs\t[some_module]\n\
                 ffffffff82270300 T __softirqentry_text_start\n\
                 ffffffff8227031c T __softirqentry_text_end\n";
        assert_eq!(
            parse(k),
            [
                0xffffffff81000300,
                0xffffffff81000f70,
                0xffffffff82270300,
                0xffffffff8227031c,
                0xffffffff81369570,
                0xffffffff81369800
            ]
        );
    }

    #[test]
    fn hidden_addresses_give_no_range() {
        // kptr_restrict: every address reads as zero.
        let k = "0000000000000000 T __irqentry_text_start\n\
                 0000000000000000 T __irqentry_text_end\n\
                 0000000000000000 t handle_softirqs\n\
                 0000000000000000 t __pfx___irq_exit_rcu\n";
        assert_eq!(parse(k), [0; 6]);
    }

    #[test]
    fn a_kernel_before_6_9_has_no_softirq_loop_outside_its_section() {
        let k = "ffffffff81000300 T __irqentry_text_start\n\
                 ffffffff81000f70 T __irqentry_text_end\n\
                 ffffffff82000000 T __softirqentry_text_start\n\
                 ffffffff82000400 T __do_softirq\n\
                 ffffffff82000500 T __softirqentry_text_end\n";
        let r = parse(k);
        assert_eq!(&r[2..4], &[0xffffffff82000000, 0xffffffff82000500]);
        assert_eq!(&r[4..], &[0, 0]);
    }
}
