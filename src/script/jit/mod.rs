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

pub use emit::{emit, Env, Hook, Prog, RegsCast};

use bpfscope_bpf::abi::bs_insn;

use crate::script::ir::Lowered;

/// Set to keep every probe on the script machine.
pub const FORCE_VM: &str = "BPFSCOPE_SCRIPT_VM";

/// Whether BPFSCOPE_SCRIPT_VM asks for the machine everywhere.
pub fn forced_vm() -> bool {
    std::env::var_os(FORCE_VM).is_some_and(|v| !v.is_empty() && v != "0")
}

/// The session as `choose` takes it before the kernel's BTF is read (in
/// parallel with the object's load): which probes compile does not depend
/// on the offsets and ids (a `comm` read assumes the offset is found; if
/// not, `choose` with [`env`] says so and the run loads again).
pub fn assumed() -> Env {
    Env {
        self_tgid: std::process::id(),
        comm_off: Some(0),
        regs_cast: None,
    }
}

/// What this session's emitted code needs to know. The kernel's BTF is
/// read only for a script that reads `comm`, or has syscall probes that
/// read the registers (sys_exit's number, or an argument at sys_enter).
pub fn env(low: &Lowered) -> Env {
    use crate::attach::plan::Path;
    use bpfscope_bpf::abi::{bs_src_kind, bs_vm_op};
    let reads = |code: &[bs_insn], op: bs_vm_op, kind: bs_src_kind| {
        code.iter().any(|x| {
            bs_vm_op(u32::from(x.op)) == op
                && low
                    .srcs
                    .get(x.arg as usize)
                    .is_some_and(|s| bs_src_kind(u32::from(s.kind)) == kind)
        })
    };
    let comm = low
        .probes
        .iter()
        .any(|p| reads(&p.code, bs_vm_op::BS_VM_SRCSTR, bs_src_kind::BS_SRC_COMM));
    let regs = low.probes.iter().any(|p| match &p.path {
        Path::Syscall(sc) => {
            sc.exit || reads(&p.code, bs_vm_op::BS_VM_SRC, bs_src_kind::BS_SRC_ARG)
        }
        _ => false,
    });
    // libbpf's parser, not crate::probe::btf's index of every function:
    // 6 ms at start here, against 27.
    let btf = (comm || regs)
        .then(|| libbpf_rs::btf::Btf::from_vmlinux().ok())
        .flatten();
    let btf = btf.as_ref();
    Env {
        self_tgid: std::process::id(),
        comm_off: btf.filter(|_| comm).and_then(comm_offset),
        regs_cast: btf.filter(|_| regs).and_then(regs_cast),
    }
}

/// task_struct.comm's offset.
fn comm_offset(btf: &libbpf_rs::btf::Btf<'_>) -> Option<u32> {
    use libbpf_rs::btf::types::{MemberAttr, Struct};
    let task = btf.type_by_name::<Struct<'_>>("task_struct")?;
    let off = task.iter().find_map(|m| {
        let name = m.name.and_then(|n| n.to_str())?;
        match (name, m.attr) {
            ("comm", MemberAttr::Normal { offset }) if offset % 8 == 0 => Some(offset / 8),
            _ => None,
        }
    });
    off
}

/// bpf_rdonly_cast's and struct pt_regs' ids, where the kernel has both.
fn regs_cast(btf: &libbpf_rs::btf::Btf<'_>) -> Option<RegsCast> {
    use libbpf_rs::btf::types::{Func, Struct};
    let kfunc = btf.type_by_name::<Func<'_>>("bpf_rdonly_cast")?;
    let regs = btf.type_by_name::<Struct<'_>>("pt_regs")?;
    Some(RegsCast {
        kfunc: u32::from(kfunc.type_id()),
        pt_regs: u32::from(regs.type_id()),
    })
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
    let thread = (low.maps.iter())
        .filter(|m| m.thread)
        .map(|m| format!("{}: in each thread's own storage (keyed by tid)", m.name));
    // Only compiled probes add through the cache.
    let cache = (low.maps.iter())
        .filter(|m| m.cache.is_some() && chosen.iter().any(Result::is_ok))
        .map(|m| {
            format!(
                "{}: added through a per-CPU cache by compiled probes",
                m.name
            )
        });
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
        .chain(thread)
        .chain(cache)
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
        insn::MapRef::Task => "task".to_string(),
        insn::MapRef::Cache => "cache".to_string(),
        insn::MapRef::Script(id) => low
            .maps
            .get(id as usize)
            .map_or(format!("map#{id}"), |m| m.name.clone()),
    };
    insn::listing(&prog.insns, &prog.maps, &name)
}

#[cfg(test)]
mod tests;
