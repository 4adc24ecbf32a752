//! Sched tracepoints on their typed raw tracepoints (tp_btf). The classic
//! tracepoint builds a record for each event before its program runs (the
//! floor figures in bench/event_cost.py: ~190 ns added per event on a
//! classic tracepoint, ~22 on a raw one); the typed one passes the task
//! pointers the record is built from. A probe whose record fields all have
//! a translation here (the event's TP_fast_assign, per field) reads them
//! through those pointers and runs without the record.

use super::insn::*;
use crate::probe::sched::{self, Member};

/// The events served, in the order of [`SchedBtf::ids`].
pub const EVENTS: [&str; 4] = [
    "sched_switch",
    "sched_wakeup",
    "sched_wakeup_new",
    "sched_waking",
];

/// What the emitted reads need from the kernel's BTF.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedBtf {
    /// task_struct's `pid`, `prio` and `exit_state` offsets.
    pub pid: u32,
    pub prio: u32,
    pub exit_state: u32,
    /// Each event's `btf_trace_<event>` typedef (the program's attach
    /// point), per [`EVENTS`]; 0 where the kernel has none.
    pub ids: [u32; 4],
    /// Task storage is allocated from the BPF allocator (6.5+; its map
    /// has `selem_ma`): a task's storage can be created under the
    /// scheduler's locks, where sched_wakeup and sched_switch run. Older
    /// kernels allocate with GFP_ATOMIC, which may wake kswapd on the
    /// runqueue whose lock is held.
    pub storage_anywhere: bool,
}

impl SchedBtf {
    /// The attach point of `event`, when it is one served here.
    pub fn id(&self, event: &str) -> Option<u32> {
        let i = EVENTS.iter().position(|e| *e == event)?;
        self.ids.get(i).copied().filter(|&id| id != 0)
    }

    /// Reads the kernel's BTF; None if any part is missing.
    pub fn from_btf(btf: &libbpf_rs::btf::Btf<'_>) -> Option<Self> {
        use libbpf_rs::btf::types::Typedef;
        let mut ids = [0u32; 4];
        for (id, e) in ids.iter_mut().zip(EVENTS) {
            if let Some(t) = btf.type_by_name::<Typedef<'_>>(&format!("btf_trace_{e}")) {
                *id = u32::from(t.type_id());
            }
        }
        Some(Self {
            pid: member_offset(btf, "task_struct", "pid")?,
            prio: member_offset(btf, "task_struct", "prio")?,
            exit_state: member_offset(btf, "task_struct", "exit_state")?,
            ids,
            storage_anywhere: member_offset(btf, "bpf_local_storage_map", "selem_ma").is_some(),
        })
    }
}

/// A member's byte offset in a struct of the kernel's BTF.
pub fn member_offset(btf: &libbpf_rs::btf::Btf<'_>, ty: &str, member: &str) -> Option<u32> {
    use libbpf_rs::btf::types::{MemberAttr, Struct};
    let s = btf.type_by_name::<Struct<'_>>(ty)?;
    let off = s.iter().find_map(|m| {
        let name = m.name.and_then(|n| n.to_str())?;
        match m.attr {
            MemberAttr::Normal { offset } if name == member && offset % 8 == 0 => Some(offset / 8),
            _ => None,
        }
    });
    off
}

/// A record field, as the typed tracepoint's arguments give it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Typed {
    /// An int member of the task that argument `arg` points to.
    Task { arg: i16, member: Member },
    /// sched_switch's `prev_state` (__trace_sched_switch_state).
    SwitchState,
}

/// The int fields read here (the comms are copied by the emitter's
/// string reads, through [`comm_arg`]).
fn typed(event: &str, field: &str) -> Option<Typed> {
    if (event, field) == ("sched_switch", "prev_state") {
        return Some(Typed::SwitchState);
    }
    match sched::task_field(event, field)? {
        (_, Member::Comm) => None,
        (arg, member) => Some(Typed::Task {
            arg: i16::from(arg),
            member,
        }),
    }
}

/// The argument pointing to the task whose id record field `field` of
/// `event` is (`args.pid`, `args.prev_pid`, `args.next_pid`).
pub fn task_arg(event: &str, field: &str) -> Option<i16> {
    match sched::task_field(event, field)? {
        (arg, Member::Pid) => Some(i16::from(arg)),
        _ => None,
    }
}

/// The argument pointing to the task whose comm record field `field` of
/// `event` is (`args.comm`, `args.prev_comm`, `args.next_comm`: the
/// record's copy of its 16 bytes).
pub fn comm_arg(event: &str, field: &str) -> Option<i16> {
    match sched::task_field(event, field)? {
        (arg, Member::Comm) => Some(i16::from(arg)),
        _ => None,
    }
}

/// task_state bits (include/linux/sched.h), stable since 5.14.
const TASK_REPORT: i32 = 0x7f;
const TASK_IDLE: i32 = 0x402;
const TASK_RTLOCK_WAIT: i32 = 0x1000;
const TASK_FROZEN: i32 = 0x8000;
const TASK_REPORT_IDLE: i32 = TASK_REPORT + 1;
const TASK_REPORT_MAX: i32 = TASK_REPORT_IDLE << 1;
const TASK_UNINTERRUPTIBLE: i32 = 2;

/// The instructions that leave record field `field` of `event` (`size`
/// bytes in the record) in r0, with the context in r6; they use r1-r3.
pub fn read(event: &str, field: &str, size: u8, b: &SchedBtf) -> Result<Vec<Insn>, String> {
    let t = typed(event, field)
        .ok_or_else(|| format!("{event}'s field {field} has no typed translation"))?;
    let mut out = Vec::new();
    match t {
        Typed::Task { arg, member } => {
            if size != 4 {
                return Err(format!("{event}'s {field} is {size} bytes, not an int"));
            }
            let off = match member {
                Member::Pid => b.pid,
                Member::Prio => b.prio,
                Member::Comm => return Err(format!("{event}'s {field} is a string")),
            };
            let off = i16::try_from(off).map_err(|_| "task_struct member past 32K")?;
            out.push(ldx(DW, R1, R6, 8 * arg));
            out.push(ldx(W, R0, R1, off));
            // pid_t and int: the record's field is signed.
            out.push(alui(alu::LSH, R0, 32));
            out.push(alui(alu::ARSH, R0, 32));
        }
        Typed::SwitchState => {
            // __trace_sched_switch_state(preempt, prev_state, prev), as
            // 6.18 (and the stable kernels since frozen tasks are reported
            // as D) compute it: preempted tasks are TASK_REPORT_MAX; else
            // the highest bit of __task_state_index's state, or 0.
            let exit_state = i16::try_from(b.exit_state).map_err(|_| "exit_state past 32K")?;
            out.push(movi(R0, TASK_REPORT_MAX));
            out.push(ldx(DW, R1, R6, 0));
            let preempted = out.len();
            out.push(ji(jmp::JNE, R1, 0, 0));
            out.push(ldx(DW, R1, R6, 8));
            out.push(ldx(W, R2, R1, exit_state));
            out.push(ldx(DW, R3, R6, 24));
            out.push(mov(R0, R3));
            out.push(alu(alu::OR, R0, R2));
            out.push(alui(alu::AND, R0, TASK_REPORT));
            out.push(mov(R1, R3));
            out.push(alui(alu::AND, R1, TASK_IDLE));
            out.push(ji(jmp::JNE, R1, TASK_IDLE, 1));
            out.push(movi(R0, TASK_REPORT_IDLE));
            out.push(mov(R1, R3));
            out.push(alui(alu::AND, R1, TASK_RTLOCK_WAIT | TASK_FROZEN));
            out.push(ji(jmp::JEQ, R1, 0, 1));
            out.push(movi(R0, TASK_UNINTERRUPTIBLE));
            // state < 0x100: its highest bit by smearing it down.
            for sh in [1, 2, 4] {
                out.push(mov(R1, R0));
                out.push(alui(alu::RSH, R1, sh));
                out.push(alu(alu::OR, R0, R1));
            }
            out.push(mov(R1, R0));
            out.push(alui(alu::RSH, R1, 1));
            out.push(alu(alu::SUB, R0, R1));
            let end = out.len();
            if let Some(j) = out.get_mut(preempted) {
                j.off = (end - preempted - 1) as i16;
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The state computation run on the instructions' own semantics: the
    /// emitted code against __trace_sched_switch_state, for every state
    /// bit pattern that matters.
    #[test]
    fn switch_state_matches_the_kernels() {
        fn kernel(preempt: bool, s: u32, exit: u32) -> u64 {
            if preempt {
                return TASK_REPORT_MAX as u64;
            }
            let mut st = (s | exit) & TASK_REPORT as u32;
            if s & TASK_IDLE as u32 == TASK_IDLE as u32 {
                st = TASK_REPORT_IDLE as u32;
            }
            if s & (TASK_RTLOCK_WAIT | TASK_FROZEN) as u32 != 0 {
                st = TASK_UNINTERRUPTIBLE as u32;
            }
            let fls = 32 - st.leading_zeros();
            if fls == 0 {
                0
            } else {
                1 << (fls - 1)
            }
        }
        let b = SchedBtf {
            pid: 0,
            prio: 4,
            exit_state: 8,
            ids: [1, 2, 3, 4],
            storage_anywhere: true,
        };
        let code = read("sched_switch", "prev_state", 8, &b).unwrap();
        let states = [
            0u32,
            1,
            2,
            4,
            8,
            0x10,
            0x20,
            0x40,
            0x80,
            0x100,
            0x200,
            0x402,
            0x1000,
            0x2001,
            0x8000,
            0x80 | 0x400,
        ];
        for preempt in [false, true] {
            for &s in &states {
                for exit in [0u32, 0x10, 0x20] {
                    let got = run(&code, preempt, s, exit);
                    assert_eq!(got, kernel(preempt, s, exit), "{preempt} {s:#x} {exit:#x}");
                }
            }
        }
    }

    /// A tiny interpreter of the instructions `read` emits: ctx words
    /// (preempt, prev, next, prev_state), prev's exit_state at offset 8.
    /// Opcodes as include/uapi/linux/bpf.h numbers them.
    fn run(code: &[Insn], preempt: bool, s: u32, exit: u32) -> u64 {
        let ctx = [u64::from(preempt), 1, 2, u64::from(s)];
        let mut r = [0u64; 11];
        let mut pc = 0usize;
        while pc < code.len() {
            let x = code[pc];
            let (d, sr) = (usize::from(x.dst), usize::from(x.src));
            let imm = x.imm as i64 as u64;
            pc += 1;
            match x.code {
                0x79 if sr == 6 => r[d] = ctx[x.off as usize / 8],
                0x61 if sr == 1 => {
                    assert_eq!(x.off, 8);
                    r[d] = u64::from(exit);
                }
                0xb7 => r[d] = imm,
                0xbf => r[d] = r[sr],
                0x4f => r[d] |= r[sr],
                0x1f => r[d] -= r[sr],
                0x57 => r[d] &= imm,
                0x77 => r[d] >>= imm,
                0x55 if r[d] != imm => pc += x.off as usize,
                0x15 if r[d] == imm => pc += x.off as usize,
                0x55 | 0x15 => {}
                c => panic!("instruction {c:#x} not interpreted"),
            }
        }
        r[0]
    }
}
