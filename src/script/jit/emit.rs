//! One probe's script machine code as straight BPF instructions: each
//! machine instruction becomes the few BPF instructions that do what
//! vm.bpf.h's case for it does, on the same per-CPU scratch area
//! (registers, string slots, the key being built) and the same kernel
//! maps, so what user space reads is the same whichever ran. An
//! operation with no translation here leaves the probe on the machine
//! ([`emit`] says which and why).

use std::mem::{offset_of, size_of};

use bpfscope_bpf::abi::{
    bs_agg_val, bs_cache_ent, bs_cache_limits, bs_event_hdr, bs_insn, bs_key_hdr, bs_limits,
    bs_lost, bs_note, bs_scratch, bs_src, bs_src_kind, bs_vm_alu, bs_vm_flags, bs_vm_op,
};

use super::insn::*;
use crate::attach::plan::Path;
use crate::script::ir::{Lowered, LoweredProbe};

/// What the emitted code needs to know of this machine and session.
#[derive(Debug, Clone, Copy)]
pub struct Env {
    /// bpfscope's own tgid: its own events are never traced.
    pub self_tgid: u32,
    /// Offset of task_struct.comm (from the kernel's BTF).
    pub comm_off: Option<u32>,
    /// bpf_rdonly_cast's and struct pt_regs' BTF ids, where the kernel has
    /// the kfunc (6.2+): syscall probes read the registers in place.
    pub regs_cast: Option<RegsCast>,
    /// What probes on sched tracepoints read through the typed raw
    /// tracepoint's task pointers (see [`super::typed`]).
    pub sched: Option<super::typed::SchedBtf>,
    /// The `task_key` maps (a bit per storage word) whose every probe is
    /// compiled onto a typed tracepoint: those keep each task's value in
    /// its storage (see [`super::choose`]); the others are hash maps.
    pub task_keys: u8,
}

/// Whose storage a task map's key names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TaskOf {
    /// The current thread (`tid`).
    Current,
    /// The task a typed tracepoint's argument points to (`args.pid`...).
    Arg(i16),
}

/// What a typed read of pt_regs takes (see `Env::regs_cast`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegsCast {
    pub kfunc: u32,
    pub pt_regs: u32,
}

/// Where a compiled probe runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hook {
    /// A raw tracepoint (sys_enter, sys_exit, or one named by the probe).
    RawTp(String),
    /// A classic tracepoint (perf link).
    Tracepoint { subsys: String, event: String },
    /// A typed raw tracepoint (tp_btf): `btf_id` is its `btf_trace_`
    /// typedef's.
    BtfTp { event: String, btf_id: u32 },
}

/// A probe's BPF program, its maps still symbolic.
#[derive(Debug, Clone)]
pub struct Prog {
    pub insns: Vec<Insn>,
    /// (instruction, map) of each map load.
    pub maps: Vec<(usize, MapRef)>,
    pub hook: Hook,
    /// The words of task_key maps it keeps in the tasks' storage.
    pub task_keys: u8,
}

const SCRATCH_R: usize = offset_of!(bs_scratch, r);
const SCRATCH_SV: usize = offset_of!(bs_scratch, sv);
const SCRATCH_KEY: usize = offset_of!(bs_scratch, key);
const SCRATCH_STR: usize = offset_of!(bs_scratch, str);
const SCRATCH_ARGS: usize = offset_of!(bs_scratch, args);
const SCRATCH_BUSY: i16 = offset_of!(bs_scratch, busy) as i16;
const SCRATCH_KEY_LEN: usize = size_of::<[u8; 328]>();
const KEYDATA: usize = SCRATCH_KEY + size_of::<bs_key_hdr>();
const STR_MAX: usize = bs_limits::BS_STR_MAX.0 as usize;
const KEY_MASK: u32 = bs_limits::BS_KEY_MAX.0 - 1;
const REG_MASK: u8 = bs_limits::BS_VM_REGS.0 as u8 - 1;
const STR_MASK: u8 = bs_limits::BS_VM_STRS.0 as u8 - 1;
const HDR: usize = size_of::<bs_event_hdr>();
const AGG_VAL: usize = size_of::<bs_agg_val>();
/// struct bs_vm_task_vals (state.bpf.h): the words, then `set`, a bit per word.
const TASK_SET: i16 = 8 * bs_limits::BS_VM_TASK_MAPS.0 as i16;
const BSS_EPOCH: u32 = offset_of!(bpfscope_bpf::abi::bss, epoch) as u32;
const BSS_T0: u32 = offset_of!(bpfscope_bpf::abi::bss, vm_t0) as u32;
const BSS_STOPPED: u32 = offset_of!(bpfscope_bpf::abi::bss, vm_stopped) as u32;
/// x86-64 pt_regs: r10 (the first of the 8 words read: r10, r9, r8, ax,
/// cx, dx, si, di) and orig_ax, the syscall number (8 bytes).
#[cfg(target_arch = "x86_64")]
mod regs {
    pub const ARGS: i32 = 56;
    pub const NR: i32 = 120;
    pub const NR_SIZE: u8 = 8;
    /// Argument slot -> word of the 8 read (di, si, dx, r10, r8, r9).
    pub const ARG_WORD: [usize; 6] = [7, 6, 5, 0, 2, 1];
}
/// arm64 pt_regs: x0..x7 from its start (at sys_enter x0 is still the
/// first argument, orig_x0), and syscallno (an s32 after orig_x0). The
/// layout up to syscallno is the same from 4.x to 6.18.
#[cfg(target_arch = "aarch64")]
mod regs {
    pub const ARGS: i32 = 0;
    pub const NR: i32 = 280;
    pub const NR_SIZE: u8 = 4;
    pub const ARG_WORD: [usize; 6] = [0, 1, 2, 3, 4, 5];
}
use regs::ARG_WORD;
/// Frame slots: a u32 map key, a zeroed aggregate, a notice's header.
const FP_KEY: i16 = -8;
const FP_ZERO: i16 = -8 - AGG_VAL as i16;
const FP_HDR: i16 = FP_ZERO - HDR as i16;
const FP_CACHE: i16 = FP_HDR - 8;
/// The thread's storage as the last lookup in straight code found it (or
/// null): the next one reads it here (`task_in`).
const FP_TASK: i16 = FP_CACHE - 8;
/// Values fixed for the run read earlier in straight code (`src_in`).
const FP_SRCS: usize = 4;
fn fp_src(i: usize) -> i16 {
    FP_TASK - 8 * (i as i16 + 1)
}
/// The cache entry an aggregation claimed, filled after its hash map
/// has the key (0: none claimed).
const FP_CENT: i16 = FP_TASK - 8 * (FP_SRCS as i16 + 1);
/// The storage of the task a typed tracepoint's argument `arg` points
/// to, as the last lookup in straight code found it (or null).
fn fp_arg_task(arg: i16) -> i16 {
    FP_CENT - 8 * (arg + 1)
}
/// Typed tracepoint arguments whose tasks' storage is kept in the frame.
const ARG_TASKS: i16 = 4;
const _: () = assert!(FP_CENT - 8 * ARG_TASKS >= -512);
const CACHE_N: i32 = bs_cache_limits::BS_CACHE_N.0 as i32;
const CENT: usize = size_of::<bs_cache_ent>();
const _: () = assert!(CENT.is_power_of_two() && (CACHE_N as usize).is_power_of_two());

/// Sources a helper call makes, one value for the whole run: worth a
/// frame slot (the others are an immediate or a load already).
fn made_once(kind: bs_src_kind) -> bool {
    matches!(
        kind,
        bs_src_kind::BS_SRC_PID
            | bs_src_kind::BS_SRC_TID
            | bs_src_kind::BS_SRC_CPU
            | bs_src_kind::BS_SRC_UID
            | bs_src_kind::BS_SRC_GID
            | bs_src_kind::BS_SRC_CGROUP
            | bs_src_kind::BS_SRC_CURTASK
    )
}

/// Sources that give one value for the whole run.
fn fixed_src(kind: bs_src_kind) -> bool {
    made_once(kind)
        || matches!(
            kind,
            bs_src_kind::BS_SRC_PROBE | bs_src_kind::BS_SRC_CTX | bs_src_kind::BS_SRC_ARG
        )
}

/// A jump's destination before the code is laid out.
#[derive(Clone, Copy)]
enum To {
    /// A machine instruction, by its index.
    Pc(usize),
    /// The end: release the scratch area, return 0.
    End,
    /// The end, for a run that never took the scratch area: return 0.
    Out,
}

struct E<'a> {
    out: Vec<Insn>,
    maps: Vec<(usize, MapRef)>,
    /// (instruction, destination) of jumps to machine instructions or the end.
    far: Vec<(usize, To)>,
    low: &'a Lowered,
    idx: usize,
    env: Env,
    /// The body reads a syscall's arguments: the entry fetches them.
    need_args: bool,
    /// Per machine register: the source it holds, when that source gives
    /// one value for the whole run (tid, a record field...).
    prov: [Option<u32>; 32],
    /// What the key buffer holds, when known: a one-part key of a value
    /// that is the same for the whole run.
    key: Option<KeyId>,
    /// A plain map value read for that key, kept in FP_CACHE: read again
    /// before any write to a plain map, it is not looked up twice.
    cached: Option<KeyId>,
    /// Slots (a bit each) that hold the task's comm, read earlier in
    /// straight code: a second read (`/comm == "x"/ { @[comm] = count(); }`)
    /// is not made again. comm does not change within a run.
    comm_in: u8,
    /// FP_TASK holds the thread's storage (or null), looked up earlier in
    /// straight code: the storage of a running thread stays for its run.
    task_in: u8,
    /// The sources whose values FP_SRCS's frame slots hold.
    src_in: [Option<u32>; FP_SRCS],
    /// raw_syscalls:sys_enter (false) or sys_exit (true) compiled onto the
    /// raw tracepoint of that name: its context is (regs, id or ret), not
    /// the record, so only `id` (enter) and `ret` (exit) can be read.
    raw_sys: Option<bool>,
    /// A sched tracepoint compiled onto its typed raw tracepoint: record
    /// fields are read through its arguments (see [`super::typed`]).
    typed: bool,
    /// The task whose storage the key being built names.
    task_of: TaskOf,
    /// Words of task_key maps read or written in the tasks' storage.
    task_used: u8,
}

/// A key by what it is made of: (map id, the source of its one part,
/// where the zeroing starts, how many words).
type KeyId = (u32, u32, u32, i64);

type R<T> = Result<T, String>;

fn reg_off(r: u8) -> i16 {
    (SCRATCH_R + 8 * usize::from(r & REG_MASK)) as i16
}

fn sv_off(s: u8) -> usize {
    SCRATCH_SV + STR_MAX * usize::from(s & STR_MASK)
}

impl E<'_> {
    fn put(&mut self, x: Insn) -> usize {
        self.out.push(x);
        self.out.len() - 1
    }

    fn put2(&mut self, x: [Insn; 2]) {
        self.out.extend(x);
    }

    fn map(&mut self, dst: Reg, m: MapRef) {
        self.maps.push((self.out.len(), m));
        self.put2(ldmap(dst, m));
    }

    /// dst = imm, as short as it fits.
    fn imm(&mut self, dst: Reg, v: i64) {
        match i32::try_from(v) {
            Ok(v) => {
                self.put(movi(dst, v));
            }
            Err(_) => self.put2(ld64(dst, v)),
        }
    }

    fn load_r(&mut self, dst: Reg, r: u8) {
        self.put(ldx(DW, dst, R9, reg_off(r)));
    }

    fn store_r(&mut self, r: u8, src: Reg) {
        self.put(stx(DW, R9, reg_off(r), src));
    }

    /// A forward jump within this instruction's code, patched by `here`.
    fn fwd(&mut self, x: Insn) -> usize {
        self.put(x)
    }

    /// Points the forward jump at `at` to the next instruction.
    fn here(&mut self, at: usize) {
        self.out[at].off = (self.out.len() - at - 1) as i16;
    }

    fn far(&mut self, x: Insn, to: To) {
        let at = self.put(x);
        self.far.push((at, to));
    }

    /// r2 = &s->key, r1 = script map `id`.
    fn map_key(&mut self, id: u32) {
        self.map(R1, MapRef::Script(id));
        self.put(mov(R2, R9));
        self.put(alui(alu::ADD, R2, SCRATCH_KEY as i32));
    }

    /// bs_count(&lost, slot).
    fn count_lost(&mut self, slot: u32) {
        self.put(st(W, FP, FP_KEY, slot as i32));
        self.map(R1, MapRef::Lost);
        self.put(mov(R2, FP));
        self.put(alui(alu::ADD, R2, i32::from(FP_KEY)));
        self.put(call(helper::MAP_LOOKUP_ELEM));
        let j = self.fwd(ji(jmp::JEQ, R0, 0, 0));
        self.put(movi(R1, 1));
        self.put(xadd(R0, 0, R1, false));
        self.here(j);
    }

    /// bs_vm_note(BS_NOTE_FULL, id): counted, and the first one sent at once.
    fn note_full(&mut self, id: u32) {
        self.put(st(W, FP, FP_KEY, id as i32));
        self.map(R1, MapRef::Full);
        self.put(mov(R2, FP));
        self.put(alui(alu::ADD, R2, i32::from(FP_KEY)));
        self.put(call(helper::MAP_LOOKUP_ELEM));
        let none = self.fwd(ji(jmp::JEQ, R0, 0, 0));
        self.put(movi(R1, 1));
        self.put(xadd(R0, 0, R1, true));
        let seen = self.fwd(ji(jmp::JNE, R1, 0, 0));
        for w in 0..HDR / 8 {
            self.put(st(DW, FP, FP_HDR + 8 * w as i16, 0));
        }
        self.put(call(helper::KTIME_GET_NS));
        self.put(stx(
            DW,
            FP,
            FP_HDR + offset_of!(bs_event_hdr, ts_ns) as i16,
            R0,
        ));
        let probe = bs_note::BS_NOTE_FULL.0 | (id & bs_note::BS_NOTE_INDEX.0);
        self.put(st(
            W,
            FP,
            FP_HDR + offset_of!(bs_event_hdr, probe) as i16,
            probe as i32,
        ));
        self.map(R1, MapRef::Events);
        self.put(mov(R2, FP));
        self.put(alui(alu::ADD, R2, i32::from(FP_HDR)));
        self.put(movi(R3, HDR as i32));
        // BPF_RB_FORCE_WAKEUP
        self.put(movi(R4, 2));
        self.put(call(helper::RINGBUF_OUTPUT));
        let sent = self.fwd(ji(jmp::JEQ, R0, 0, 0));
        self.count_lost(bs_lost::BS_LOST_EVENTS.0);
        self.here(sent);
        self.here(seen);
        self.here(none);
    }

    fn src(&self, i: u32) -> R<&bs_src> {
        self.low
            .srcs
            .get(i as usize)
            .ok_or_else(|| format!("source #{i} is missing"))
    }

    fn probe(&self) -> &LoweredProbe {
        &self.low.probes[self.idx]
    }

    /// r0 = a number from a source (bs_read_num).
    fn read_num(&mut self, i: u32) -> R<()> {
        let s = *self.src(i)?;
        let kind = bs_src_kind(u32::from(s.kind));
        let helper_then = |e: &mut Self, h: i32| {
            e.put(call(h));
        };
        match kind {
            bs_src_kind::BS_SRC_PROBE => {
                self.imm(R0, self.idx as i64);
            }
            bs_src_kind::BS_SRC_PID => {
                helper_then(self, helper::GET_CURRENT_PID_TGID);
                self.put(alui(alu::RSH, R0, 32));
            }
            bs_src_kind::BS_SRC_TID => {
                helper_then(self, helper::GET_CURRENT_PID_TGID);
                self.put(zext32(R0));
            }
            bs_src_kind::BS_SRC_CPU => helper_then(self, helper::GET_SMP_PROCESSOR_ID),
            bs_src_kind::BS_SRC_UID => {
                helper_then(self, helper::GET_CURRENT_UID_GID);
                self.put(zext32(R0));
            }
            bs_src_kind::BS_SRC_GID => {
                helper_then(self, helper::GET_CURRENT_UID_GID);
                self.put(alui(alu::RSH, R0, 32));
            }
            bs_src_kind::BS_SRC_CGROUP => helper_then(self, helper::GET_CURRENT_CGROUP_ID),
            bs_src_kind::BS_SRC_NSECS => helper_then(self, helper::KTIME_GET_NS),
            bs_src_kind::BS_SRC_ELAPSED => {
                helper_then(self, helper::KTIME_GET_NS);
                self.map(R1, MapRef::Bss(BSS_T0));
                self.put(ldx(DW, R1, R1, 0));
                self.put(alu(alu::SUB, R0, R1));
            }
            bs_src_kind::BS_SRC_CURTASK => helper_then(self, helper::GET_CURRENT_TASK),
            bs_src_kind::BS_SRC_RAND => helper_then(self, helper::GET_PRANDOM_U32),
            bs_src_kind::BS_SRC_JIFFIES => helper_then(self, helper::JIFFIES64),
            bs_src_kind::BS_SRC_CTX if self.typed => {
                let b = self
                    .env
                    .sched
                    .ok_or("a typed read without the kernel's BTF")?;
                let (event, field) = (self.typed_name(s.off))
                    .ok_or_else(|| format!("no record field at offset {}", s.off))?;
                for x in super::typed::read(event, field, s.size, &b)? {
                    self.put(x);
                }
            }
            bs_src_kind::BS_SRC_CTX if matches!(self.probe().path, Path::Tracepoint { .. }) => {
                let (size, off) = (s.size, s.off);
                let code = match size {
                    1 => B,
                    2 => H,
                    4 => W,
                    8 => DW,
                    n => return Err(format!("a {n}-byte record field")),
                };
                // The kernel allows a tracepoint program to load its
                // record's fields past the common header, aligned.
                if off < 8 || off % u16::from(size) != 0 {
                    return Err(format!("a record field at offset {off}"));
                }
                // On the raw tracepoint the record's `id` (enter, offset
                // 8) or `ret` (exit, offset 16) is the second word.
                let off = match self.raw_sys {
                    None => off,
                    Some(exit) if size == 8 && off == if exit { 16 } else { 8 } => 8,
                    Some(_) => return Err("a record field the raw tracepoint lacks".into()),
                };
                self.put(ldx(code, R0, R6, off as i16));
                self.extend(R0, size, s.is_signed != 0);
            }
            bs_src_kind::BS_SRC_ARG if matches!(self.probe().path, Path::Syscall(_)) => {
                if s.walk != 0 {
                    return Err("a pointer walk from an argument".into());
                }
                let Path::Syscall(sc) = self.probe().path else {
                    return Err("an argument outside a syscall".into());
                };
                let slot = u32::from(s.off);
                if slot == bs_limits::BS_ARG_NR.0 {
                    self.imm(R0, i64::from(sc.nr));
                } else if slot == bs_limits::BS_ARG_RET.0 && sc.exit {
                    self.put(ldx(DW, R0, R6, 8));
                } else if (slot as usize) < ARG_WORD.len() && !sc.exit {
                    self.need_args = true;
                    let off = SCRATCH_ARGS + 8 * ARG_WORD[slot as usize];
                    self.put(ldx(DW, R0, R9, off as i16));
                } else {
                    return Err(format!("argument slot {slot}"));
                }
                self.extend(R0, s.size, s.is_signed != 0);
            }
            k => return Err(format!("source kind {} on this probe's path", k.0)),
        }
        Ok(())
    }

    /// Widens the low `size` bytes of r (bs_extend).
    fn extend(&mut self, r: Reg, size: u8, signed: bool) {
        if !(1..8).contains(&size) || !matches!(size, 1 | 2 | 4) {
            return;
        }
        let sh = 64 - 8 * i32::from(size);
        self.put(alui(alu::LSH, r, sh));
        self.put(alui(if signed { alu::ARSH } else { alu::RSH }, r, sh));
    }

    /// One machine instruction.
    fn insn(&mut self, pc: usize, x: &bs_insn, cur_map: &mut Option<u32>) -> R<()> {
        let op = bs_vm_op(u32::from(x.op));
        match op {
            bs_vm_op::BS_VM_HALT => self.far(ja(0), To::End),
            bs_vm_op::BS_VM_LDI => match i32::try_from(x.imm) {
                Ok(v) => {
                    self.put(st(DW, R9, reg_off(x.dst), v));
                }
                Err(_) => {
                    self.put2(ld64(R1, x.imm));
                    self.store_r(x.dst, R1);
                }
            },
            bs_vm_op::BS_VM_MOV => {
                self.load_r(R1, x.a);
                self.store_r(x.dst, R1);
            }
            bs_vm_op::BS_VM_SRC => {
                // A value fixed for the run (tid, pid, a field...) read
                // earlier in straight code is kept in the frame: read
                // there, not made again (`@s[tid]` in a predicate, then
                // in the body and its delete).
                let fixed = made_once(bs_src_kind(u32::from(self.src(x.arg)?.kind)));
                if let Some(i) = self.src_in.iter().position(|s| fixed && *s == Some(x.arg)) {
                    self.put(ldx(DW, R0, FP, fp_src(i)));
                } else {
                    self.read_num(x.arg)?;
                    if let Some(i) = self.src_in.iter().position(|s| fixed && s.is_none()) {
                        self.put(stx(DW, FP, fp_src(i), R0));
                        self.src_in[i] = Some(x.arg);
                    }
                }
                self.store_r(x.dst, R0);
            }
            bs_vm_op::BS_VM_SRCSTR => {
                let s = *self.src(x.arg)?;
                // The current task's comm, or (typed sched tracepoints) a
                // record's copy of an argument task's.
                let of = match bs_src_kind(u32::from(s.kind)) {
                    bs_src_kind::BS_SRC_COMM => TaskOf::Current,
                    bs_src_kind::BS_SRC_CTX => (self.task_comm_arg(s.off))
                        .map(TaskOf::Arg)
                        .ok_or("a record string field without a typed translation")?,
                    _ => return Err("a string source other than comm".into()),
                };
                let Some(comm) = self.env.comm_off else {
                    return Err("task_struct.comm not found in the kernel's BTF".into());
                };
                let bit = 1u8 << (x.dst & STR_MASK);
                if of == TaskOf::Current && self.comm_in & bit != 0 {
                    return Ok(());
                }
                let base = sv_off(x.dst);
                // Two plain loads through the BTF-typed task, as bs_comm;
                // the rest of the slot zeroed (keys hash all 64 bytes).
                match of {
                    TaskOf::Arg(arg) => self.put(ldx(DW, R0, R6, 8 * arg)),
                    TaskOf::Current => self.put(call(helper::GET_CURRENT_TASK_BTF)),
                };
                for w in 0..2 {
                    self.put(ldx(DW, R1, R0, (comm + 8 * w) as i16));
                    self.put(stx(DW, R9, (base + 8 * w as usize) as i16, R1));
                }
                for w in 2..STR_MAX / 8 {
                    self.put(st(DW, R9, (base + 8 * w) as i16, 0));
                }
            }
            bs_vm_op::BS_VM_ALU => self.alu(x)?,
            bs_vm_op::BS_VM_STREQC => self.streqc(x)?,
            bs_vm_op::BS_VM_JMP | bs_vm_op::BS_VM_JZ | bs_vm_op::BS_VM_JNZ => {
                let to = x.arg as usize;
                if to <= pc {
                    // A loop: the verifier would have to prove it ends.
                    return Err("a backward jump (a loop)".into());
                }
                let to = if to >= self.probe().code.len() {
                    To::End
                } else {
                    To::Pc(to)
                };
                if op == bs_vm_op::BS_VM_JMP {
                    self.far(ja(0), to);
                } else {
                    self.load_r(R1, x.a);
                    let c = if op == bs_vm_op::BS_VM_JZ {
                        jmp::JEQ
                    } else {
                        jmp::JNE
                    };
                    self.far(ji(c, R1, 0, 0), to);
                }
            }
            bs_vm_op::BS_VM_KEYCLR | bs_vm_op::BS_VM_KEY1
                if self.low.maps.get(x.arg as usize).is_some_and(|m| m.thread) =>
            {
                // The key is the current thread: its storage is the map,
                // which the next instruction reads or writes (BS_VMF_TASK).
                let tid = self.prov[usize::from(x.a & REG_MASK)]
                    .map(|s| self.src(s).map(|s| bs_src_kind(u32::from(s.kind))))
                    .transpose()?;
                if op != bs_vm_op::BS_VM_KEY1 || tid != Some(bs_src_kind::BS_SRC_TID) {
                    return Err("a thread-storage map keyed by other than tid".into());
                }
                self.task_of = TaskOf::Current;
                *cur_map = Some(x.arg);
            }
            bs_vm_op::BS_VM_KEYCLR | bs_vm_op::BS_VM_KEY1 if self.task_word(x.arg).is_some() => {
                // The key is a task's id: that task's storage is the map.
                let src = self.prov[usize::from(x.a & REG_MASK)]
                    .map(|s| self.src(s).copied())
                    .transpose()?;
                self.task_of = match src {
                    _ if op != bs_vm_op::BS_VM_KEY1 => None,
                    Some(s) if bs_src_kind(u32::from(s.kind)) == bs_src_kind::BS_SRC_TID => {
                        Some(TaskOf::Current)
                    }
                    Some(s) if bs_src_kind(u32::from(s.kind)) == bs_src_kind::BS_SRC_CTX => (self
                        .task_arg(s.off))
                    .filter(|a| (0..ARG_TASKS).contains(a))
                    .map(TaskOf::Arg),
                    _ => None,
                }
                .ok_or("a task-storage map keyed by other than a task's id")?;
                *cur_map = Some(x.arg);
            }
            bs_vm_op::BS_VM_KEYCLR | bs_vm_op::BS_VM_KEY1 => {
                self.imm(R1, i64::from(x.arg));
                self.put(stx(DW, R9, KEYDATA as i16, R1));
                let from = KEYDATA + (x.arg2 & KEY_MASK) as usize;
                let words = (x.imm.clamp(0, 32)) as usize;
                if from + 8 * words > SCRATCH_KEY + SCRATCH_KEY_LEN {
                    return Err("a key past the key buffer".into());
                }
                for w in 0..words {
                    self.put(st(DW, R9, (from + 8 * w) as i16, 0));
                }
                if op == bs_vm_op::BS_VM_KEY1 {
                    self.load_r(R1, x.a);
                    self.put(stx(DW, R9, (KEYDATA + 8) as i16, R1));
                }
                *cur_map = Some(x.arg);
            }
            bs_vm_op::BS_VM_KEYNUM => {
                self.load_r(R1, x.a);
                let at = KEYDATA + (x.arg & KEY_MASK) as usize;
                self.put(stx(DW, R9, at as i16, R1));
            }
            bs_vm_op::BS_VM_KEYSTR => {
                let at = KEYDATA + (x.arg & KEY_MASK) as usize;
                let from = sv_off(x.a);
                // The part's words (arg2: its length), as the machine copies.
                let len = match x.arg2 as usize {
                    0 => STR_MAX,
                    n => n.min(STR_MAX),
                };
                for w in 0..len.div_ceil(8) {
                    self.put(ldx(DW, R1, R9, (from + 8 * w) as i16));
                    self.put(stx(DW, R9, (at + 8 * w) as i16, R1));
                }
            }
            bs_vm_op::BS_VM_BUCKET => self.bucket(x),
            bs_vm_op::BS_VM_AGG if u32::from(x.flags) & bs_vm_flags::BS_VMF_SLOTS.0 != 0 => {
                self.slot_agg(x)
            }
            bs_vm_op::BS_VM_AGG => {
                let id = cur_map.ok_or("an aggregation whose map is not known here")?;
                self.agg(x, id);
            }
            bs_vm_op::BS_VM_MSET | bs_vm_op::BS_VM_MGET | bs_vm_op::BS_VM_MDEL
                if u32::from(x.flags) & bs_vm_flags::BS_VMF_TASK.0 != 0 =>
            {
                let id = cur_map.ok_or("a thread-storage map not known here")?;
                self.task_op(op, x, id, x.arg2);
            }
            bs_vm_op::BS_VM_MSET | bs_vm_op::BS_VM_MGET | bs_vm_op::BS_VM_MDEL
                if cur_map.and_then(|id| self.task_word(id)).is_some() =>
            {
                let id = cur_map.ok_or("a task-storage map not known here")?;
                let word = self
                    .task_word(id)
                    .ok_or("a task-storage map without a word")?;
                self.task_used |= 1 << word;
                self.task_op(op, x, id, word);
            }
            bs_vm_op::BS_VM_MSET => {
                let id = cur_map.ok_or("a map update whose map is not known here")?;
                // One update, as bpftrace's, not the machine's lookup then
                // update: a number's value is its first 8 bytes and zeros
                // after them (staged in s->str), whether the key is new or
                // not, so the map holds the same bytes either way.
                self.put(st(DW, R9, SCRATCH_KEY as i16, 0));
                for w in 1..STR_MAX / 8 {
                    self.put(st(DW, R9, (SCRATCH_STR + 8 * w) as i16, 0));
                }
                self.load_r(R1, x.a);
                self.put(stx(DW, R9, SCRATCH_STR as i16, R1));
                self.map_key(id);
                self.put(mov(R3, R9));
                self.put(alui(alu::ADD, R3, SCRATCH_STR as i32));
                // BPF_ANY
                self.put(movi(R4, 0));
                self.put(call(helper::MAP_UPDATE_ELEM));
                let ok = self.fwd(ji(jmp::JEQ, R0, 0, 0));
                self.note_full(id);
                self.here(ok);
            }
            bs_vm_op::BS_VM_MGET => {
                let id = cur_map.ok_or("a map read whose map is not known here")?;
                if self.cached_read(x.dst) {
                    return Ok(());
                }
                self.put(st(DW, R9, SCRATCH_KEY as i16, 0));
                self.map_key(id);
                self.put(call(helper::MAP_LOOKUP_ELEM));
                self.read_value(x.dst, 0);
            }
            bs_vm_op::BS_VM_MDEL => {
                let id = cur_map.ok_or("a delete whose map is not known here")?;
                self.put(st(DW, R9, SCRATCH_KEY as i16, 0));
                self.map_key(id);
                self.put(call(helper::MAP_DELETE_ELEM));
            }
            _ => {
                return Err(format!(
                    "`{}` runs on the machine",
                    crate::script::disasm::op_name(x.op)
                ))
            }
        }
        Ok(())
    }

    /// Register `dst` = the value read just before for the same key (a
    /// predicate's `@s[tid]`, then the body's), if it was: no second lookup.
    fn cached_read(&mut self, dst: u8) -> bool {
        if self.key.is_none() || self.cached != self.key {
            return false;
        }
        self.put(ldx(DW, R1, FP, FP_CACHE));
        self.store_r(dst, R1);
        true
    }

    /// Register `dst` = the number at R0 + `off`, 0 when R0 is null (no
    /// such key); kept for `cached_read` when the key is known.
    fn read_value(&mut self, dst: u8, off: i16) {
        self.put(movi(R1, 0));
        let j = self.fwd(ji(jmp::JEQ, R0, 0, 0));
        self.put(ldx(DW, R1, R0, off));
        self.here(j);
        self.store_r(dst, R1);
        if self.key.is_some() {
            self.put(stx(DW, FP, FP_CACHE, R1));
            self.cached = self.key;
        }
    }

    /// Map `id`'s word in the tasks' storage, when it is a `task_key` map
    /// this session keeps there.
    fn task_word(&self, id: u32) -> Option<u32> {
        let maps = &self.low.maps;
        maps.get(id as usize)
            .filter(|m| m.task_key)
            .and_then(|_| crate::script::types::thread_word(maps, id as usize))
            .filter(|w| self.env.task_keys & (1 << w) != 0)
    }

    /// The argument of this typed tracepoint that points to the task whose
    /// id the record field at `off` is.
    fn task_arg(&self, off: u16) -> Option<i16> {
        self.typed_field(off, super::typed::task_arg)
    }

    /// The argument of this typed tracepoint that points to the task whose
    /// comm the record field at `off` copies.
    fn task_comm_arg(&self, off: u16) -> Option<i16> {
        self.typed_field(off, super::typed::comm_arg)
    }

    /// `of` (event, field name) for the record field at `off`, on a typed
    /// tracepoint.
    fn typed_field(&self, off: u16, of: fn(&str, &str) -> Option<i16>) -> Option<i16> {
        let (event, field) = self.typed_name(off)?;
        of(event, field)
    }

    /// (event, field name) of the record field at `off`, on a typed
    /// tracepoint.
    fn typed_name(&self, off: u16) -> Option<(&str, &str)> {
        let p = self.probe();
        let Path::Tracepoint { event, .. } = &p.path else {
            return None;
        };
        let f = p.probe.fields.iter().find(|f| f.offset == off)?;
        self.typed.then_some((event.as_str(), f.name.as_str()))
    }

    /// A read, write or delete of map `id`'s word (`word`) in the storage
    /// of the task its key names (created by a write only). A value of 0
    /// reads as no key does, so a delete writes 0; a write the kernel
    /// refuses storage for is counted as a full map's.
    fn task_op(&mut self, op: bs_vm_op, x: &bs_insn, id: u32, word: u32) {
        let word = 8 * (word & (bs_limits::BS_VM_TASK_MAPS.0 - 1)) as i16;
        let of = std::mem::replace(&mut self.task_of, TaskOf::Current);
        let create = op == bs_vm_op::BS_VM_MSET;
        if op == bs_vm_op::BS_VM_MGET && self.cached_read(x.dst) {
            return;
        }
        // The task's storage, as found earlier in this run (task_in: bit
        // 0 the current thread's, bit 1 + arg an argument's task's).
        let (slot, bit) = match of {
            TaskOf::Arg(arg) if (0..ARG_TASKS).contains(&arg) => (fp_arg_task(arg), 2 << arg),
            _ => (FP_TASK, 1u8),
        };
        let mut found = None;
        let known = self.task_in & bit != 0;
        if known {
            self.put(ldx(DW, R0, FP, slot));
            // A write without one looks it up again, to create it.
            if create {
                found = Some(self.fwd(ji(jmp::JNE, R0, 0, 0)));
            }
        }
        if !known || create {
            match of {
                TaskOf::Arg(arg) => self.put(ldx(DW, R2, R6, 8 * arg)),
                TaskOf::Current => {
                    self.put(call(helper::GET_CURRENT_TASK_BTF));
                    self.put(mov(R2, R0))
                }
            };
            self.map(R1, MapRef::Task);
            self.put(movi(R3, 0));
            // BPF_LOCAL_STORAGE_GET_F_CREATE
            self.put(movi(R4, i32::from(create)));
            self.put(call(helper::TASK_STORAGE_GET));
            self.put(stx(DW, FP, slot, R0));
        }
        if let Some(j) = found {
            self.here(j);
        }
        // Two slots can name one task (tid and sched_switch's prev_pid,
        // a task waking itself): after a lookup that may have created the
        // storage, the others are looked up again.
        self.task_in = if create { bit } else { self.task_in | bit };
        // Only the end's print and a thread's exit read the set bits.
        let printed = (self.low.maps.get(id as usize)).is_some_and(|m| m.thread_print);
        match op {
            bs_vm_op::BS_VM_MGET => self.read_value(x.dst, word),
            bs_vm_op::BS_VM_MSET => {
                let none = self.fwd(ji(jmp::JEQ, R0, 0, 0));
                self.load_r(R1, x.a);
                self.put(stx(DW, R0, word, R1));
                // The word holds a value (a key, for the end's print).
                if printed {
                    self.put(ldx(DW, R1, R0, TASK_SET));
                    self.put(alui(alu::OR, R1, 1 << (word / 8)));
                    self.put(stx(DW, R0, TASK_SET, R1));
                }
                let done = self.fwd(ja(0));
                self.here(none);
                self.note_full(id);
                self.here(done);
            }
            _ => {
                let none = self.fwd(ji(jmp::JEQ, R0, 0, 0));
                self.put(st(DW, R0, word, 0));
                if printed {
                    self.put(ldx(DW, R1, R0, TASK_SET));
                    self.put(alui(alu::AND, R1, !(1 << (word / 8))));
                    self.put(stx(DW, R0, TASK_SET, R1));
                }
                self.here(none);
            }
        }
    }

    /// What an instruction leaves known: the sources registers hold, the
    /// key, the cached map value.
    fn track(&mut self, x: &bs_insn) -> R<()> {
        let op = bs_vm_op(u32::from(x.op));
        let dst = usize::from(x.dst & REG_MASK);
        match op {
            bs_vm_op::BS_VM_SRC => {
                let kind = bs_src_kind(u32::from(self.src(x.arg)?.kind));
                self.prov[dst] = fixed_src(kind).then_some(x.arg);
            }
            bs_vm_op::BS_VM_LDI
            | bs_vm_op::BS_VM_MOV
            | bs_vm_op::BS_VM_ALU
            | bs_vm_op::BS_VM_STREQC
            | bs_vm_op::BS_VM_MGET
            | bs_vm_op::BS_VM_BUCKET => self.prov[dst] = None,
            bs_vm_op::BS_VM_KEY1 => {
                let a = usize::from(x.a & REG_MASK);
                self.key = self.prov[a].map(|p| (x.arg, p, x.arg2, x.imm));
            }
            bs_vm_op::BS_VM_KEYCLR | bs_vm_op::BS_VM_KEYNUM | bs_vm_op::BS_VM_KEYSTR => {
                self.key = None;
            }
            // A plain map written: what was read from it may be stale.
            bs_vm_op::BS_VM_MSET | bs_vm_op::BS_VM_MDEL => self.cached = None,
            _ => {}
        }
        match op {
            // The slot holds the current task's comm, or another string.
            bs_vm_op::BS_VM_SRCSTR => {
                let bit = 1 << (x.dst & STR_MASK);
                let kind = bs_src_kind(u32::from(self.src(x.arg)?.kind));
                if kind == bs_src_kind::BS_SRC_COMM {
                    self.comm_in |= bit;
                } else {
                    self.comm_in &= !bit;
                }
            }
            // Operations that write no slot.
            bs_vm_op::BS_VM_AGG
            | bs_vm_op::BS_VM_ALU
            | bs_vm_op::BS_VM_BUCKET
            | bs_vm_op::BS_VM_HALT
            | bs_vm_op::BS_VM_JMP
            | bs_vm_op::BS_VM_JZ
            | bs_vm_op::BS_VM_JNZ
            | bs_vm_op::BS_VM_KEY1
            | bs_vm_op::BS_VM_KEYCLR
            | bs_vm_op::BS_VM_KEYNUM
            | bs_vm_op::BS_VM_KEYSTR
            | bs_vm_op::BS_VM_LDI
            | bs_vm_op::BS_VM_MDEL
            | bs_vm_op::BS_VM_MGET
            | bs_vm_op::BS_VM_MOV
            | bs_vm_op::BS_VM_MSET
            | bs_vm_op::BS_VM_SRC
            | bs_vm_op::BS_VM_STREQC => {}
            // Any other may write the slot it names.
            _ => self.comm_in &= !(1 << (x.dst & STR_MASK)),
        }
        Ok(())
    }

    fn alu(&mut self, x: &bs_insn) -> R<()> {
        let flags = u32::from(x.flags);
        let signed = flags & bs_vm_flags::BS_VMF_SIGNED.0 != 0;
        self.load_r(R1, x.a);
        if flags & bs_vm_flags::BS_VMF_IMM.0 != 0 {
            self.imm(R2, x.imm);
        } else {
            self.load_r(R2, x.b);
        }
        let cmp = |e: &mut Self, c: u8| {
            e.put(movi(R3, 1));
            e.put(jx(c, R1, R2, 1));
            e.put(movi(R3, 0));
            e.put(mov(R1, R3));
        };
        match bs_vm_alu(x.arg) {
            bs_vm_alu::BS_ALU_ADD => {
                self.put(alu(alu::ADD, R1, R2));
            }
            bs_vm_alu::BS_ALU_SUB => {
                self.put(alu(alu::SUB, R1, R2));
            }
            bs_vm_alu::BS_ALU_MUL => {
                self.put(alu(alu::MUL, R1, R2));
            }
            bs_vm_alu::BS_ALU_AND => {
                self.put(alu(alu::AND, R1, R2));
            }
            bs_vm_alu::BS_ALU_OR => {
                self.put(alu(alu::OR, R1, R2));
            }
            bs_vm_alu::BS_ALU_XOR => {
                self.put(alu(alu::XOR, R1, R2));
            }
            bs_vm_alu::BS_ALU_DIV | bs_vm_alu::BS_ALU_MOD if signed => {
                // BPF's signed division is 6.6's (cpu v4), which 6.1 lacks:
                // unsigned on the magnitudes, the sign put back (a quotient
                // negative when one operand is, a remainder when the
                // dividend is), 0 for a zero divisor, as the machine.
                let div = bs_vm_alu(x.arg) == bs_vm_alu::BS_ALU_DIV;
                let zero = self.fwd(ji(jmp::JEQ, R2, 0, 0));
                self.put(movi(R4, 0));
                self.put(ji(jmp::JSGE, R1, 0, 2));
                self.put(neg(R1));
                self.put(alui(alu::XOR, R4, 1));
                if div {
                    self.put(ji(jmp::JSGE, R2, 0, 2));
                    self.put(neg(R2));
                    self.put(alui(alu::XOR, R4, 1));
                } else {
                    self.put(ji(jmp::JSGE, R2, 0, 1));
                    self.put(neg(R2));
                }
                self.put(alu(if div { alu::DIV } else { alu::MOD }, R1, R2));
                self.put(ji(jmp::JEQ, R4, 0, 1));
                self.put(neg(R1));
                let done = self.fwd(ja(0));
                self.here(zero);
                self.put(movi(R1, 0));
                self.here(done);
            }
            // Division by zero gives 0, as the BPF instruction does.
            bs_vm_alu::BS_ALU_DIV => {
                self.put(alu(alu::DIV, R1, R2));
            }
            bs_vm_alu::BS_ALU_MOD => {
                // BPF leaves the dividend on a zero divisor; the machine gives 0.
                self.put(ji(jmp::JNE, R2, 0, 2));
                self.put(movi(R1, 0));
                self.put(ja(1));
                self.put(alu(alu::MOD, R1, R2));
            }
            bs_vm_alu::BS_ALU_SHL => {
                self.put(alui(alu::AND, R2, 63));
                self.put(alu(alu::LSH, R1, R2));
            }
            bs_vm_alu::BS_ALU_SHR => {
                self.put(alui(alu::AND, R2, 63));
                self.put(alu(if signed { alu::ARSH } else { alu::RSH }, R1, R2));
            }
            bs_vm_alu::BS_ALU_EQ => cmp(self, jmp::JEQ),
            bs_vm_alu::BS_ALU_NE => cmp(self, jmp::JNE),
            bs_vm_alu::BS_ALU_LT => cmp(self, if signed { jmp::JSLT } else { jmp::JLT }),
            bs_vm_alu::BS_ALU_LE => cmp(self, if signed { jmp::JSLE } else { jmp::JLE }),
            bs_vm_alu::BS_ALU_GT => cmp(self, if signed { jmp::JSGT } else { jmp::JGT }),
            bs_vm_alu::BS_ALU_GE => cmp(self, if signed { jmp::JSGE } else { jmp::JGE }),
            bs_vm_alu::BS_ALU_NEG => {
                self.put(neg(R1));
            }
            bs_vm_alu::BS_ALU_NOT => {
                self.put(movi(R2, 0));
                cmp(self, jmp::JEQ);
            }
            bs_vm_alu::BS_ALU_BNOT => {
                self.put(alui(alu::XOR, R1, -1));
            }
            bs_vm_alu::BS_ALU_BOOL => {
                self.put(movi(R2, 0));
                cmp(self, jmp::JNE);
            }
            a => return Err(format!("ALU operation {}", a.0)),
        }
        self.store_r(x.dst, R1);
        Ok(())
    }

    /// r[dst] = sv[a] == a constant string, on at most imm bytes: the
    /// constant is known, so the bytes that decide are compared a word at
    /// a time (through its NUL, or the first imm).
    fn streqc(&mut self, x: &bs_insn) -> R<()> {
        let s = self
            .low
            .strs
            .strs
            .get(x.arg as usize)
            .ok_or_else(|| format!("constant string #{} is missing", x.arg))?;
        let b = crate::filter::raw::encode(s);
        let b = &b[..b.len().min(STR_MAX)];
        let len = b.iter().position(|&b| b == 0).unwrap_or(b.len());
        let limit = if x.imm == 0 {
            STR_MAX as u64
        } else {
            x.imm as u64
        };
        let m = (limit.min(len as u64 + 1).min(STR_MAX as u64)) as usize;
        let base = sv_off(x.a);
        let mut fails = Vec::new();
        for (w, (want, mask)) in crate::filter::raw::masked_words(b, m)
            .into_iter()
            .enumerate()
        {
            self.put(ldx(DW, R1, R9, (base + 8 * w) as i16));
            if mask != u64::MAX {
                self.put2(ld64(R2, mask as i64));
                self.put(alu(alu::AND, R1, R2));
            }
            self.put2(ld64(R2, want as i64));
            fails.push(self.fwd(jx(jmp::JNE, R1, R2, 0)));
        }
        self.put(movi(R1, 1));
        let done = self.fwd(ja(0));
        for f in fails {
            self.here(f);
        }
        self.put(movi(R1, 0));
        self.here(done);
        self.store_r(x.dst, R1);
        Ok(())
    }

    /// r[dst] = the histogram bucket of r[a] (vm.bpf.h's BS_VM_BUCKET).
    fn bucket(&mut self, x: &bs_insn) {
        let flags = u32::from(x.flags);
        self.load_r(R1, x.a);
        let mut ends = Vec::new();
        if flags & bs_vm_flags::BS_VMF_LOG2.0 != 0 {
            if flags & bs_vm_flags::BS_VMF_SIGNED.0 != 0 {
                let j = self.fwd(ji(jmp::JSGE, R1, 0, 0));
                self.put(movi(R2, 0));
                ends.push(self.fwd(ja(0)));
                self.here(j);
            }
            let j = self.fwd(ji(jmp::JNE, R1, 0, 0));
            self.put(movi(R2, 1));
            ends.push(self.fwd(ja(0)));
            self.here(j);
            // 2 + floor(log2(v)), as bs_log2: halve while anything is left.
            self.put(movi(R2, 2));
            for sh in [32, 16, 8, 4, 2, 1] {
                self.put(mov(R3, R1));
                self.put(alui(alu::RSH, R3, sh));
                self.put(ji(jmp::JEQ, R3, 0, 2));
                self.put(mov(R1, R3));
                self.put(alui(alu::ADD, R2, sh));
            }
        } else {
            // Linear: 0 below min (signed), n + 1 in range, arg2 + 1 above.
            self.imm(R3, x.imm);
            let j = self.fwd(jx(jmp::JSGE, R1, R3, 0));
            self.put(movi(R2, 0));
            ends.push(self.fwd(ja(0)));
            self.here(j);
            self.put(alu(alu::SUB, R1, R3));
            self.imm(R3, i64::from(x.arg.max(1)));
            self.put(alu(alu::DIV, R1, R3));
            self.imm(R3, i64::from(x.arg2));
            self.put(mov(R2, R3));
            self.put(alui(alu::ADD, R2, 1));
            let above = self.fwd(jx(jmp::JGE, R1, R3, 0));
            self.put(mov(R2, R1));
            self.put(alui(alu::ADD, R2, 1));
            self.here(above);
        }
        for e in ends {
            self.here(e);
        }
        self.store_r(x.dst, R2);
    }

    /// The aggregate of the key in s->key in script map `id` (bs_vm_agg),
    /// through the map's per-CPU cache when it has one (`cached_agg`).
    fn agg(&mut self, x: &bs_insn, id: u32) {
        // The key's header: bucket (the cache's too), then epoch (the
        // hash map's alone: a cache hit does not store it).
        self.store_bucket(x, R9, SCRATCH_KEY as i16);
        let cache = (self.low.maps.get(id as usize)).and_then(|m| Some((m.cache?, m.key_words())));
        let mut done = Vec::new();
        if let Some((slot, words)) = cache {
            done.push(self.cached_agg(x, slot, words));
        }
        self.map(R1, MapRef::Bss(BSS_EPOCH));
        self.put(ldx(W, R1, R1, 0));
        self.put(stx(W, R9, SCRATCH_KEY as i16 + 4, R1));
        self.map_key(id);
        self.put(call(helper::MAP_LOOKUP_ELEM));
        let found = self.fwd(ji(jmp::JNE, R0, 0, 0));
        for w in 0..AGG_VAL / 8 {
            self.put(st(DW, FP, FP_ZERO + 8 * w as i16, 0));
        }
        self.map_key(id);
        self.put(mov(R3, FP));
        self.put(alui(alu::ADD, R3, i32::from(FP_ZERO)));
        // BPF_NOEXIST
        self.put(movi(R4, 1));
        self.put(call(helper::MAP_UPDATE_ELEM));
        self.map_key(id);
        self.put(call(helper::MAP_LOOKUP_ELEM));
        let found2 = self.fwd(ji(jmp::JNE, R0, 0, 0));
        self.note_full(id);
        if cache.is_some() {
            // The key has no place in the map: neither has it in the cache.
            self.put(ldx(DW, R1, FP, FP_CENT));
            done.push(self.fwd(ji(jmp::JEQ, R1, 0, 0)));
            self.put(st(W, R1, offset_of!(bs_cache_ent, used) as i16, 0));
        }
        done.push(self.fwd(ja(0)));
        self.here(found);
        self.here(found2);
        self.agg_add(x);
        if let Some((_, words)) = cache {
            // The entry this run claimed now holds the key (the map has
            // it): the key's next runs on this CPU add there.
            self.put(ldx(DW, R1, FP, FP_CENT));
            done.push(self.fwd(ji(jmp::JEQ, R1, 0, 0)));
            for w in 0..words {
                self.put(ldx(DW, R2, R9, (KEYDATA + 8 + 8 * w) as i16));
                self.put(stx(
                    DW,
                    R1,
                    (offset_of!(bs_cache_ent, k) + 8 * w) as i16,
                    R2,
                ));
            }
            self.put(ldx(W, R2, R9, SCRATCH_KEY as i16));
            self.put(stx(W, R1, offset_of!(bs_cache_ent, bucket) as i16, R2));
            self.put(st(W, R1, offset_of!(bs_cache_ent, used) as i16, 1));
        }
        for d in done {
            self.here(d);
        }
    }

    /// The cache's side of `agg`: the key's entry in the map's element
    /// of `vm_cache` (by a multiplicative hash of its words and bucket,
    /// as fast.bpf.h's). Held by the key: added to there, and the
    /// returned jump (to be pointed past the hash map's code) taken.
    /// Free: claimed (used 2, by compare-and-exchange, as a run this one
    /// interrupted may be claiming it), its pointer left in FP_CENT, for
    /// `agg` to fill once the hash map has the key. Else FP_CENT is 0,
    /// and the hash map alone counts.
    fn cached_agg(&mut self, x: &bs_insn, slot: u32, words: usize) -> usize {
        let used = offset_of!(bs_cache_ent, used) as i16;
        let key = |w: usize| (KEYDATA + 8 + 8 * w) as i16;
        let bucketed = self.bucketed(x);
        self.put(st(DW, FP, FP_CENT, 0));
        self.put(st(W, FP, FP_KEY, slot as i32));
        self.map(R1, MapRef::Cache);
        self.put(mov(R2, FP));
        self.put(alui(alu::ADD, R2, i32::from(FP_KEY)));
        self.put(call(helper::MAP_LOOKUP_ELEM));
        let mut to_hash = vec![self.fwd(ji(jmp::JEQ, R0, 0, 0))];
        const MIX: [i64; 3] = [
            0x9E37_79B9_7F4A_7C15u64 as i64,
            0xC2B2_AE3D_27D4_EB4Fu64 as i64,
            0x1656_67B1_9E37_79F9u64 as i64,
        ];
        self.put(ldx(DW, R1, R9, key(0)));
        self.put2(ld64(R3, MIX[0]));
        self.put(alu(alu::MUL, R1, R3));
        if words > 1 {
            self.put(ldx(DW, R2, R9, key(1)));
            self.put2(ld64(R3, MIX[1]));
            self.put(alu(alu::MUL, R2, R3));
            self.put(alu(alu::XOR, R1, R2));
        }
        if bucketed {
            self.put(ldx(W, R2, R9, SCRATCH_KEY as i16));
            self.put2(ld64(R3, MIX[2]));
            self.put(alu(alu::MUL, R2, R3));
            self.put(alu(alu::XOR, R1, R2));
        }
        // The top bits index the entries.
        self.put(alui(alu::RSH, R1, 64 - CACHE_N.trailing_zeros() as i32));
        self.put(alui(alu::AND, R1, CACHE_N - 1));
        self.put(alui(alu::LSH, R1, CENT.trailing_zeros() as i32));
        self.put(alu(alu::ADD, R0, R1));
        self.put(ldx(W, R1, R0, used));
        let free = self.fwd(ji(jmp::JNE, R1, 1, 0));
        for w in 0..words {
            self.put(ldx(
                DW,
                R1,
                R0,
                (offset_of!(bs_cache_ent, k) + 8 * w) as i16,
            ));
            self.put(ldx(DW, R2, R9, key(w)));
            to_hash.push(self.fwd(jx(jmp::JNE, R1, R2, 0)));
        }
        if bucketed {
            self.put(ldx(W, R1, R0, offset_of!(bs_cache_ent, bucket) as i16));
            self.put(ldx(W, R2, R9, SCRATCH_KEY as i16));
            to_hash.push(self.fwd(jx(jmp::JNE, R1, R2, 0)));
        }
        self.put(alui(alu::ADD, R0, offset_of!(bs_cache_ent, val) as i32));
        self.agg_add(x);
        let done = self.fwd(ja(0));
        self.here(free);
        to_hash.push(self.fwd(ji(jmp::JNE, R1, 0, 0)));
        self.put(mov(R1, R0));
        self.put(movi(R0, 0));
        self.put(movi(R2, 2));
        self.put(cmpxchg32(R1, used, R2));
        to_hash.push(self.fwd(ji(jmp::JNE, R0, 0, 0)));
        self.put(stx(DW, FP, FP_CENT, R1));
        for j in to_hash {
            self.here(j);
        }
        done
    }

    /// The aggregate of a keyless map's bucket, in its array
    /// (bs_vm_slot_agg): an index where `agg` hashes a key.
    fn slot_agg(&mut self, x: &bs_insn) {
        self.store_bucket(x, FP, FP_KEY);
        self.map(R1, MapRef::Script(x.arg));
        self.put(mov(R2, FP));
        self.put(alui(alu::ADD, R2, i32::from(FP_KEY)));
        self.put(call(helper::MAP_LOOKUP_ELEM));
        let found = self.fwd(ji(jmp::JNE, R0, 0, 0));
        // Past the array: never, as the compiler bounds buckets.
        self.note_full(x.arg);
        let done = self.fwd(ja(0));
        self.here(found);
        self.agg_add(x);
        self.here(done);
    }

    /// AGG's bucket is r[b] (else 0).
    fn bucketed(&self, x: &bs_insn) -> bool {
        let flags = u32::from(x.flags);
        flags & bs_vm_flags::BS_VMF_COUNT.0 == 0 && flags & bs_vm_flags::BS_VMF_BUCKET.0 != 0
    }

    /// AGG's bucket as a 4-byte word at base+off: r[b] with
    /// BS_VMF_BUCKET, else (and for count()) 0.
    fn store_bucket(&mut self, x: &bs_insn, base: Reg, off: i16) {
        if self.bucketed(x) {
            self.load_r(R1, x.b);
            self.put(stx(W, base, off, R1));
        } else {
            self.put(st(W, base, off, 0));
        }
    }

    /// Adds to the aggregate R0 points to, as bs_agg_val_add does.
    fn agg_add(&mut self, x: &bs_insn) {
        let flags = u32::from(x.flags);
        let count_only = flags & bs_vm_flags::BS_VMF_COUNT.0 != 0;
        let minmax = !count_only && flags & bs_vm_flags::BS_VMF_MINMAX.0 != 0;
        let signed = flags & bs_vm_flags::BS_VMF_SIGNED.0 != 0;
        // Atomics, as bs_agg_val_add: uprobes can be preempted on a CPU.
        self.put(mov(R7, R0));
        self.put(movi(R8, 1));
        self.put(xadd(R7, offset_of!(bs_agg_val, count) as i16, R8, minmax));
        if !count_only {
            self.load_r(R2, x.a);
            self.put(xadd(R7, offset_of!(bs_agg_val, sum) as i16, R2, false));
        }
        if minmax {
            // A slot with count 0 has no min/max yet.
            let (lt, gt) = if signed {
                (jmp::JSLT, jmp::JSGT)
            } else {
                (jmp::JLT, jmp::JGT)
            };
            let min = offset_of!(bs_agg_val, min) as i16;
            let max = offset_of!(bs_agg_val, max) as i16;
            self.load_r(R2, x.a);
            for (off, c) in [(min, lt), (max, gt)] {
                self.put(ji(jmp::JEQ, R8, 0, 3));
                self.put(ldx(DW, R3, R7, off));
                self.put(jx(c, R2, R3, 1));
                self.put(ja(1));
                self.put(stx(DW, R7, off, R2));
            }
        }
    }
}

/// The probe at `idx` as a BPF program, or why it stays on the machine.
pub fn emit(low: &Lowered, idx: usize, env: &Env) -> Result<Prog, String> {
    let p = low.probes.get(idx).ok_or("no such probe")?;
    if p.trigger.is_some() {
        return Err("run by bpfscope itself".into());
    }
    let hook = match &p.path {
        Path::Syscall(sc) => Hook::RawTp(if sc.exit { "sys_exit" } else { "sys_enter" }.into()),
        Path::RawTp { name } => Hook::RawTp(name.clone()),
        Path::Tracepoint { subsys, event } => {
            // raw_syscalls' records are built from the raw tracepoint's
            // arguments on every syscall; a probe that reads only what
            // those arguments hold runs on the raw tracepoint, without
            // the record (measured in bench/run_vs_bpftrace.py).
            let raw = match (subsys.as_str(), event.as_str()) {
                ("raw_syscalls", "sys_enter") => Some(false),
                ("raw_syscalls", "sys_exit") => Some(true),
                _ => None,
            };
            if let Some(exit) = raw {
                if let Ok(prog) = emit_on(low, idx, env, Hook::RawTp(event.clone()), Some(exit)) {
                    return Ok(prog);
                }
            }
            // Sched events' records are built from task pointers; a probe
            // that reads only fields those give runs on the typed raw
            // tracepoint (bench/run_vs_bpftrace.py's runqlat.bt).
            let typed = (env.sched)
                .filter(|_| subsys == "sched")
                .and_then(|b| b.id(event));
            if let Some(btf_id) = typed {
                let hook = Hook::BtfTp {
                    event: event.clone(),
                    btf_id,
                };
                if let Ok(prog) = emit_on(low, idx, env, hook, None) {
                    return Ok(prog);
                }
            }
            Hook::Tracepoint {
                subsys: subsys.clone(),
                event: event.clone(),
            }
        }
        other => return Err(format!("its path ({}) is not compiled", other.describe())),
    };
    emit_on(low, idx, env, hook, None)
}

/// The probe's program on `hook`; `raw_sys` as in [`E`].
fn emit_on(
    low: &Lowered,
    idx: usize,
    env: &Env,
    hook: Hook,
    raw_sys: Option<bool>,
) -> Result<Prog, String> {
    let p = low.probes.get(idx).ok_or("no such probe")?;
    let mut e = E {
        out: Vec::new(),
        maps: Vec::new(),
        far: Vec::new(),
        low,
        idx,
        env: *env,
        need_args: false,
        prov: [None; 32],
        key: None,
        cached: None,
        comm_in: 0,
        task_in: 0,
        src_in: [None; FP_SRCS],
        raw_sys,
        typed: matches!(hook, Hook::BtfTp { .. }),
        task_of: TaskOf::Current,
        task_used: 0,
    };
    // The body first, to know whether it reads a syscall's arguments; the
    // entry is put before it after.
    let targets: std::collections::HashSet<usize> = p
        .code
        .iter()
        .filter(|x| {
            matches!(
                bs_vm_op(u32::from(x.op)),
                bs_vm_op::BS_VM_JMP | bs_vm_op::BS_VM_JZ | bs_vm_op::BS_VM_JNZ
            )
        })
        .map(|x| x.arg as usize)
        .collect();
    let mut starts = Vec::with_capacity(p.code.len());
    let mut cur_map = None;
    // The tasks' storage found on every path into a jump target (jumps go
    // forward): `@s[args.next_pid]` read in a branch and deleted after it
    // is looked up once.
    let mut task_at: std::collections::HashMap<usize, u8> = Default::default();
    let mut falls = true;
    for (pc, x) in p.code.iter().enumerate() {
        starts.push(e.out.len());
        // The key's map is known only along straight code.
        if targets.contains(&pc) {
            cur_map = None;
            e.prov = [None; 32];
            e.key = None;
            e.cached = None;
            e.comm_in = 0;
            let through = if falls { e.task_in } else { u8::MAX };
            e.task_in = through & task_at.get(&pc).copied().unwrap_or(0);
            e.src_in = [None; FP_SRCS];
        }
        e.insn(pc, x, &mut cur_map)?;
        e.track(x)?;
        let op = bs_vm_op(u32::from(x.op));
        if matches!(
            op,
            bs_vm_op::BS_VM_JMP | bs_vm_op::BS_VM_JZ | bs_vm_op::BS_VM_JNZ
        ) {
            *task_at.entry(x.arg as usize).or_insert(u8::MAX) &= e.task_in;
        }
        falls = !matches!(op, bs_vm_op::BS_VM_JMP | bs_vm_op::BS_VM_HALT);
    }
    let end = e.out.len();
    e.put(st(W, R9, SCRATCH_BUSY, 0));
    e.put(movi(R0, 0));
    e.put(exit());
    for (at, to) in std::mem::take(&mut e.far) {
        let dest = match to {
            To::Pc(pc) => starts[pc],
            To::End => end,
            To::Out => end + 1,
        };
        e.out[at].off = i16::try_from(dest as i64 - at as i64 - 1)
            .map_err(|_| "a jump too long for BPF".to_string())?;
    }
    let body = std::mem::take(&mut e.out);
    let body_maps = std::mem::take(&mut e.maps);
    // Syscalls (raw_syscalls' too) are always their task's own.
    let may_irq = crate::attach::irqtext::may_irq(&p.path) && raw_sys.is_none();
    entry(&mut e, &p.path, may_irq);
    let shift = e.out.len();
    // The entry's early returns go to the body's end.
    for (at, to) in std::mem::take(&mut e.far) {
        let dest = shift + end + usize::from(matches!(to, To::Out));
        e.out[at].off = (dest - at - 1) as i16;
    }
    e.maps
        .extend(body_maps.into_iter().map(|(at, m)| (at + shift, m)));
    e.out.extend(body);
    if e.out.len() > 4096 {
        return Err(format!("{} BPF instructions", e.out.len()));
    }
    Ok(Prog {
        insns: e.out,
        maps: e.maps,
        hook,
        task_keys: e.task_used,
    })
}

/// R0 = the context's pt_regs as the kernel's BTF type (bpf_rdonly_cast,
/// which the verifier inlines): its fields are then plain loads the kernel
/// guards, where a helper call (bpf_probe_read_kernel) would copy them.
fn typed_regs(e: &mut E<'_>, c: RegsCast) {
    e.put(ldx(DW, R1, R6, 0));
    e.put(movi(R2, c.pt_regs as i32));
    e.put(kfunc_call(c.kfunc));
}

/// r0 = this CPU's scratch area; the run ends where there is none.
fn scratch(e: &mut E<'_>) {
    e.put(st(W, FP, FP_KEY, 0));
    e.map(R1, MapRef::Scratch);
    e.put(mov(R2, FP));
    e.put(alui(alu::ADD, R2, i32::from(FP_KEY)));
    e.put(call(helper::MAP_LOOKUP_ELEM));
    e.far(ji(jmp::JEQ, R0, 0, 0), To::Out);
}

/// Kernel stack frames looked at for interrupt code (trace.bpf.c's
/// BS_IRQ_FRAMES), taken into the scratch area's event buffer.
const IRQ_FRAMES: i32 = 40;
const SCRATCH_EV: usize = offset_of!(bs_scratch, ev);
const BSS_IRQ_TEXT: u32 = offset_of!(bpfscope_bpf::abi::bss, irq_text) as u32;
const IRQ_TEXTS: i16 = bs_limits::BS_IRQ_TEXTS.0 as i16;

/// Ends the run on an event of bpfscope's own (r0 holds the current
/// tgid), as trace.bpf.c's bs_target_ok does: unless the probe can fire
/// in an interrupt and its kernel stack passes through the interrupt
/// code (`irq_text`, see bs_in_irq): such an event only landed on
/// bpfscope's task. arm64's programs would read the preempt count; the
/// compiled ones do not yet, and drop every event on bpfscope's task.
fn not_self(e: &mut E<'_>, may_irq: bool) {
    if !may_irq || cfg!(not(target_arch = "x86_64")) {
        e.far(ji(jmp::JEQ, R0, e.env.self_tgid as i32, 0), To::End);
        return;
    }
    let mut irq = vec![e.fwd(ji(jmp::JNE, R0, e.env.self_tgid as i32, 0))];
    e.put(mov(R1, R6));
    e.put(mov(R2, R9));
    e.put(alui(alu::ADD, R2, SCRATCH_EV as i32));
    e.put(movi(R3, IRQ_FRAMES * 8));
    e.put(movi(R4, 0));
    e.put(call(helper::GET_STACK));
    // r8: the bytes of frames taken (negative on failure), r3 the offset
    // of the frame looked at, r2 the ranges; the frames go to the scratch
    // area's event buffer, which this run holds.
    e.put(mov(R8, R0));
    e.map(R2, MapRef::Bss(BSS_IRQ_TEXT));
    e.put(movi(R3, 0));
    let top = e.out.len();
    e.far(jx(jmp::JSGE, R3, R8, 0), To::End);
    // A constant bound too: 6.1's verifier loses r3's through the loop.
    e.far(ji(jmp::JGE, R3, IRQ_FRAMES * 8, 0), To::End);
    e.put(mov(R4, R9));
    e.put(alu(alu::ADD, R4, R3));
    e.put(ldx(DW, R4, R4, SCRATCH_EV as i16));
    for k in 0..IRQ_TEXTS {
        // ip - lo < hi - lo: inside [lo, hi); an empty range never is.
        e.put(ldx(DW, R1, R2, 16 * k));
        e.put(ldx(DW, R5, R2, 16 * k + 8));
        e.put(alu(alu::SUB, R5, R1));
        e.put(mov(R0, R4));
        e.put(alu(alu::SUB, R0, R1));
        irq.push(e.fwd(jx(jmp::JLT, R0, R5, 0)));
    }
    e.put(alui(alu::ADD, R3, 8));
    let back = e.out.len();
    e.put(ja((top as i64 - back as i64 - 1) as i16));
    for j in irq {
        e.here(j);
    }
}

/// What the generic programs do before a probe's code: which syscall,
/// not bpfscope itself, not after the script ended, the scratch area, a
/// syscall's arguments.
fn entry(e: &mut E<'_>, path: &Path, may_irq: bool) {
    e.put(mov(R6, R1));
    let size = if regs::NR_SIZE == 8 { DW } else { W };
    if let Path::Syscall(sc) = path {
        if let (true, Some(c)) = (sc.exit, e.env.regs_cast) {
            // sys_exit's number: one load through the typed registers.
            typed_regs(e, c);
            e.put(ldx(size, R1, R0, regs::NR as i16));
        } else if sc.exit {
            // sys_exit's number: pt_regs' orig_ax or syscallno (the
            // tracepoint has none).
            e.put(ldx(DW, R3, R6, 0));
            e.put(alui(alu::ADD, R3, regs::NR));
            e.put(mov(R1, FP));
            e.put(alui(alu::ADD, R1, i32::from(FP_KEY)));
            e.put(movi(R2, i32::from(regs::NR_SIZE)));
            e.put(call(helper::PROBE_READ_KERNEL));
            e.put(ldx(size, R1, FP, FP_KEY));
        } else {
            e.put(ldx(DW, R1, R6, 8));
        }
        e.far(ji(jmp::JNE, R1, sc.nr as i32, 0), To::Out);
    }
    e.map(R1, MapRef::Bss(BSS_STOPPED));
    e.put(ldx(W, R1, R1, 0));
    e.far(ji(jmp::JNE, R1, 0, 0), To::Out);
    scratch(e);
    e.put(mov(R9, R0));
    // A run nested in another on this CPU is dropped and counted: the
    // scratch area is the other's (trace.bpf.c's BS_ON_SCRATCH).
    e.put(ldx(W, R1, R9, SCRATCH_BUSY));
    let free = e.fwd(ji(jmp::JEQ, R1, 0, 0));
    e.count_lost(bs_lost::BS_LOST_NESTED.0);
    e.far(ja(0), To::Out);
    e.here(free);
    e.put(st(W, R9, SCRATCH_BUSY, 1));
    e.put(call(helper::GET_CURRENT_PID_TGID));
    e.put(alui(alu::RSH, R0, 32));
    not_self(e, may_irq);
    if let (true, Some(c)) = (e.need_args, e.env.regs_cast) {
        // The arguments' words through the typed registers, where
        // bs_syscall_args' one read would put them.
        typed_regs(e, c);
        for w in ARG_WORD {
            let at = regs::ARGS + 8 * w as i32;
            e.put(ldx(DW, R1, R0, at as i16));
            e.put(stx(DW, R9, (SCRATCH_ARGS + 8 * w) as i16, R1));
        }
    } else if e.need_args {
        // The 8 words holding the arguments in one read (regs::ARGS), as
        // bs_syscall_args reads them.
        e.put(mov(R1, R9));
        e.put(alui(alu::ADD, R1, SCRATCH_ARGS as i32));
        e.put(movi(R2, 64));
        e.put(ldx(DW, R3, R6, 0));
        e.put(alui(alu::ADD, R3, regs::ARGS));
        e.put(call(helper::PROBE_READ_KERNEL));
    }
}
