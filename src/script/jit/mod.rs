//! Scripts at compiled speed without a compiler: a probe whose machine
//! code uses only operations with a translation here (numbers, builtins,
//! tracepoint fields and syscall arguments, comm, constant string
//! compares, keys, histograms, aggregations, plain map reads, writes and
//! deletes, forward jumps) is emitted as a BPF program of its own, in
//! Rust, and attached in place of the generic program for that probe. It
//! works on the machine's own scratch area and kernel maps, so output,
//! printing, clear/zero and END are unchanged. Any other probe (BEGIN,
//! END, intervals, printf, strings beyond comm, loops...) runs on the
//! script machine (vm.bpf.h) as before; `-v` says which run compiled and
//! why the others do not. BPFSCOPE_SCRIPT_VM=1 keeps every probe on the
//! machine (for comparisons and tests).

pub mod emit;
pub mod insn;
pub mod load;

pub use emit::{emit, Env, Hook, Prog};

use crate::script::ir::Lowered;

/// Set to keep every probe on the script machine.
pub const FORCE_VM: &str = "BPFSCOPE_SCRIPT_VM";

/// Whether BPFSCOPE_SCRIPT_VM asks for the machine everywhere.
pub fn forced_vm() -> bool {
    std::env::var_os(FORCE_VM).is_some_and(|v| !v.is_empty() && v != "0")
}

/// What this session's emitted code needs to know. The kernel's BTF is
/// read only for a script that reads `comm` (it costs milliseconds at start).
pub fn env(low: &Lowered) -> Env {
    use bpfscope_bpf::abi::{bs_src_kind, bs_vm_op};
    let comm = low.probes.iter().flat_map(|p| &p.code).any(|x| {
        bs_vm_op(u32::from(x.op)) == bs_vm_op::BS_VM_SRCSTR
            && low
                .srcs
                .get(x.arg as usize)
                .is_some_and(|s| bs_src_kind(u32::from(s.kind)) == bs_src_kind::BS_SRC_COMM)
    });
    Env {
        self_tgid: std::process::id(),
        comm_off: if comm { comm_offset() } else { None },
    }
}

/// task_struct.comm's offset, from the kernel's BTF.
fn comm_offset() -> Option<u32> {
    let btf = crate::probe::btf::vmlinux()?;
    let task = btf.struct_id("task_struct")?;
    let step = crate::probe::btf::Step {
        arrow: false,
        member: "comm".into(),
    };
    let w = btf.walk_in_memory("comm", task, &[step]).ok()?;
    w.path.is_empty().then_some(u32::from(w.leaf_off))
}

/// Compiled syscall probes of one direction at most: each is a program on
/// sys_enter or sys_exit that every syscall of the machine runs, where the
/// machine's shared program finds its probe with one lookup.
pub const SYSCALL_MAX: usize = 8;
/// Compiled probes at most: each is a program to verify at start.
pub const PROBES_MAX: usize = 64;

/// Each probe's program, or why it stays on the machine.
pub fn choose(low: &Lowered, env: &Env) -> Vec<Result<Prog, String>> {
    let forced = forced_vm();
    let mut out: Vec<Result<Prog, String>> = (0..low.probes.len())
        .map(|i| {
            if forced {
                Err(format!("{FORCE_VM} is set"))
            } else {
                emit(low, i, env)
            }
        })
        .collect();
    let (mut total, mut sys) = (0, [0usize; 2]);
    for (p, c) in low.probes.iter().zip(out.iter_mut()) {
        if c.is_err() {
            continue;
        }
        let dir = match p.path {
            crate::attach::plan::Path::Syscall(sc) => Some(usize::from(sc.exit)),
            _ => None,
        };
        if let Some(d) = dir {
            sys[d] += 1;
            if sys[d] > SYSCALL_MAX {
                *c = Err(format!(
                    "over {SYSCALL_MAX} syscall probes: the shared program serves the rest"
                ));
                continue;
            }
        }
        total += 1;
        if total > PROBES_MAX {
            *c = Err(format!("over {PROBES_MAX} compiled probes"));
        }
    }
    out
}

/// One line per probe for -v: compiled (and its size) or on the machine, and why.
pub fn describe(low: &Lowered, chosen: &[Result<Prog, String>]) -> Vec<String> {
    low.probes
        .iter()
        .zip(chosen)
        .map(|(p, c)| match c {
            Ok(prog) => {
                // Said when the hook is not the probe's own (raw_syscalls).
                let on = match (&prog.hook, &p.path) {
                    (Hook::RawTp(n), crate::attach::plan::Path::Tracepoint { .. }) => {
                        format!(", on the raw tracepoint {n}")
                    }
                    _ => String::new(),
                };
                format!(
                    "{}: compiled to BPF ({} instructions{on})",
                    p.probe.name,
                    prog.insns.len()
                )
            }
            Err(why) => format!("{}: script machine ({why})", p.probe.name),
        })
        .collect()
}

/// A compiled program as text, maps by the script's names.
pub fn listing(low: &Lowered, prog: &Prog) -> String {
    let name = |m: insn::MapRef| match m {
        insn::MapRef::Scratch => "scratch".to_string(),
        insn::MapRef::Bss(_) => "bss".to_string(),
        insn::MapRef::Full => "vm_full".to_string(),
        insn::MapRef::Events => "events".to_string(),
        insn::MapRef::Lost => "lost".to_string(),
        insn::MapRef::Script(id) => low
            .maps
            .get(id as usize)
            .map_or(format!("map#{id}"), |m| m.name.clone()),
    };
    insn::listing(&prog.insns, &prog.maps, &name)
}

#[cfg(test)]
mod tests;
