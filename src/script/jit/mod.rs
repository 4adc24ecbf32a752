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
pub mod typed;

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
        sched: Some(typed::SchedBtf {
            pid: 0,
            prio: 0,
            exit_state: 0,
            ids: [1; typed::EVENTS.len()],
            storage_anywhere: true,
        }),
        task_keys: 0,
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
    let sched = low.probes.iter().any(|p| match &p.path {
        Path::Tracepoint { subsys, event } => {
            subsys == "sched" && typed::EVENTS.contains(&event.as_str())
        }
        _ => false,
    });
    // libbpf's parser, not crate::probe::btf's index of every function:
    // 6 ms at start here, against 27.
    let btf = (comm || regs || sched)
        .then(|| libbpf_rs::btf::Btf::from_vmlinux().ok())
        .flatten();
    let btf = btf.as_ref();
    Env {
        self_tgid: std::process::id(),
        // Typed sched tracepoints read their tasks' comms at the same offset.
        comm_off: btf.filter(|_| comm || sched).and_then(comm_offset),
        regs_cast: btf.filter(|_| regs).and_then(regs_cast),
        sched: btf.filter(|_| sched).and_then(typed::SchedBtf::from_btf),
        task_keys: 0,
    }
}

/// task_struct.comm's offset.
fn comm_offset(btf: &libbpf_rs::btf::Btf<'_>) -> Option<u32> {
    typed::member_offset(btf, "task_struct", "comm")
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
    let mut out = choose_each(
        low,
        &Env {
            task_keys: 0,
            ..*env
        },
    );
    settle(low, env, &mut out);
    out
}

/// The task_key map words each probe's code names.
fn task_words(low: &Lowered, p: &crate::script::ir::LoweredProbe) -> u8 {
    use bpfscope_bpf::abi::bs_vm_op;
    p.code
        .iter()
        .filter(|x| {
            matches!(
                bs_vm_op(u32::from(x.op)),
                bs_vm_op::BS_VM_KEY1 | bs_vm_op::BS_VM_KEYCLR
            )
        })
        .filter(|x| low.maps.get(x.arg as usize).is_some_and(|m| m.task_key))
        .filter_map(|x| crate::script::types::thread_word(&low.maps, x.arg as usize))
        .fold(0, |b, w| b | 1 << w)
}

/// Puts each task_key map in the tasks' storage where every probe naming
/// it is compiled onto a typed tracepoint (the machine has no task
/// pointers), emitting those probes again; the others stay hash maps.
/// Run again once a probe is left on the machine after all (its program
/// refused): its maps go back to their hash maps in every probe.
pub fn settle(low: &Lowered, env: &Env, chosen: &mut [Result<Prog, String>]) {
    if !env.sched.is_some_and(|b| b.storage_anywhere) {
        return;
    }
    let words: Vec<u8> = low.probes.iter().map(|p| task_words(low, p)).collect();
    let mut bits = 0u8;
    for (w, c) in words.iter().zip(chosen.iter()) {
        if *w != 0 && matches!(c, Ok(p) if matches!(p.hook, Hook::BtfTp { .. })) {
            bits |= w;
        }
    }
    for (w, c) in words.iter().zip(chosen.iter()) {
        if !matches!(c, Ok(p) if matches!(p.hook, Hook::BtfTp { .. })) {
            bits &= !w;
        }
    }
    // Each pass emits the probes whose storage maps changed; a probe whose
    // program cannot be emitted so takes its maps back to the hash maps.
    loop {
        let mut again = false;
        for (i, c) in chosen.iter_mut().enumerate() {
            let want = bits & words[i];
            let Ok(prog) = c else { continue };
            if prog.task_keys == want {
                continue;
            }
            match emit(
                low,
                i,
                &Env {
                    task_keys: bits,
                    ..*env
                },
            ) {
                Ok(p) if p.task_keys == want => *c = Ok(p),
                _ => {
                    bits &= !words[i];
                    again = true;
                }
            }
        }
        if !again {
            break;
        }
    }
}

fn choose_each(low: &Lowered, env: &Env) -> Vec<Result<Prog, String>> {
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
    let stored = (chosen.iter().flatten()).fold(0u8, |b, p| b | p.task_keys);
    let task = (low.maps.iter().enumerate())
        .filter(|(id, m)| {
            m.task_key
                && crate::script::types::thread_word(&low.maps, *id)
                    .is_some_and(|w| stored & (1 << w) != 0)
        })
        .map(|(_, m)| {
            format!(
                "{}: in each task's own storage (keyed by the task's id), by typed tracepoints",
                m.name
            )
        });
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
                    (Hook::BtfTp { event, .. }, _) => {
                        format!(", on the typed raw tracepoint {event}, without the record")
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
        .chain(task)
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
