//! BPF instructions as the kernel reads them (include/uapi/linux/bpf.h's
//! opcodes), built one at a time, and printed one a line for `-v` and the
//! golden listings. Map references are symbolic ([`MapRef`]) until load,
//! when [`super::load`] puts each map's descriptor in place.

use std::fmt::Write;

/// A register: r0 return value, r1-r5 arguments (clobbered by calls),
/// r6-r9 kept across calls, r10 the frame pointer.
pub type Reg = u8;

pub const R0: Reg = 0;
pub const R1: Reg = 1;
pub const R2: Reg = 2;
pub const R3: Reg = 3;
pub const R4: Reg = 4;
pub const R5: Reg = 5;
/// The program's context.
pub const R6: Reg = 6;
/// Kept across calls: an aggregate's value.
pub const R7: Reg = 7;
/// Kept across calls: the count before an update.
pub const R8: Reg = 8;
/// The per-CPU scratch area (registers, string slots, the key).
pub const R9: Reg = 9;
pub const FP: Reg = 10;

// Classes.
const LD: u8 = 0x00;
const LDX: u8 = 0x01;
const ST: u8 = 0x02;
const STX: u8 = 0x03;
const JMP: u8 = 0x05;
const ALU64: u8 = 0x07;
const ALU32: u8 = 0x04;
// Sizes.
pub const W: u8 = 0x00;
pub const H: u8 = 0x08;
pub const B: u8 = 0x10;
pub const DW: u8 = 0x18;
// Modes.
const IMM: u8 = 0x00;
const MEM: u8 = 0x60;
const ATOMIC: u8 = 0xc0;
// Operand sources.
const K: u8 = 0x00;
const X: u8 = 0x08;

/// ALU operations.
pub mod alu {
    pub const ADD: u8 = 0x00;
    pub const SUB: u8 = 0x10;
    pub const MUL: u8 = 0x20;
    pub const DIV: u8 = 0x30;
    pub const OR: u8 = 0x40;
    pub const AND: u8 = 0x50;
    pub const LSH: u8 = 0x60;
    pub const RSH: u8 = 0x70;
    pub const NEG: u8 = 0x80;
    pub const MOD: u8 = 0x90;
    pub const XOR: u8 = 0xa0;
    pub const MOV: u8 = 0xb0;
    pub const ARSH: u8 = 0xc0;
}

/// Jump conditions.
pub mod jmp {
    pub const JA: u8 = 0x00;
    pub const JEQ: u8 = 0x10;
    pub const JGT: u8 = 0x20;
    pub const JGE: u8 = 0x30;
    pub const JNE: u8 = 0x50;
    pub const JSGT: u8 = 0x60;
    pub const JSGE: u8 = 0x70;
    pub const CALL: u8 = 0x80;
    pub const EXIT: u8 = 0x90;
    pub const JLT: u8 = 0xa0;
    pub const JLE: u8 = 0xb0;
    pub const JSLT: u8 = 0xc0;
    pub const JSLE: u8 = 0xd0;
}

/// Helper functions (enum bpf_func_id).
pub mod helper {
    pub const MAP_LOOKUP_ELEM: i32 = 1;
    pub const MAP_UPDATE_ELEM: i32 = 2;
    pub const MAP_DELETE_ELEM: i32 = 3;
    pub const KTIME_GET_NS: i32 = 5;
    pub const GET_PRANDOM_U32: i32 = 7;
    pub const GET_SMP_PROCESSOR_ID: i32 = 8;
    pub const GET_CURRENT_PID_TGID: i32 = 14;
    pub const GET_CURRENT_UID_GID: i32 = 15;
    pub const GET_CURRENT_TASK: i32 = 35;
    pub const GET_STACK: i32 = 67;
    pub const GET_CURRENT_CGROUP_ID: i32 = 80;
    pub const PROBE_READ_KERNEL: i32 = 113;
    pub const JIFFIES64: i32 = 118;
    pub const RINGBUF_OUTPUT: i32 = 130;
    pub const TASK_STORAGE_GET: i32 = 156;
    pub const GET_CURRENT_TASK_BTF: i32 = 158;
}

/// A map an instruction refers to, resolved to a descriptor at load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MapRef {
    /// The per-CPU scratch area (`scratch`).
    Scratch,
    /// A value in the trace object's .bss, at this offset.
    Bss(u32),
    /// Updates refused by a full map (`vm_full`).
    Full,
    /// The ring buffer (`events`).
    Events,
    /// Loss counters (`lost`).
    Lost,
    /// A script map's own kernel map, by the script's map id.
    Script(u32),
    /// The threads' own storage of tid-keyed maps (`vm_task`).
    Task,
    /// The per-CPU caches of aggregations (`vm_cache`).
    Cache,
}

/// One instruction (two for a 64-bit immediate load).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Insn {
    pub code: u8,
    pub dst: Reg,
    pub src: Reg,
    pub off: i16,
    pub imm: i32,
}

impl Insn {
    /// As the kernel reads it.
    pub fn raw(&self) -> libbpf_sys::bpf_insn {
        let mut i = libbpf_sys::bpf_insn {
            code: self.code,
            off: self.off,
            imm: self.imm,
            ..Default::default()
        };
        i.set_dst_reg(self.dst);
        i.set_src_reg(self.src);
        i
    }
}

fn i(code: u8, dst: Reg, src: Reg, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        dst,
        src,
        off,
        imm,
    }
}

/// dst = src (64-bit).
pub fn mov(dst: Reg, src: Reg) -> Insn {
    i(ALU64 | alu::MOV | X, dst, src, 0, 0)
}

/// dst = imm, sign-extended.
pub fn movi(dst: Reg, imm: i32) -> Insn {
    i(ALU64 | alu::MOV | K, dst, 0, 0, imm)
}

/// dst = (u32)dst.
pub fn zext32(dst: Reg) -> Insn {
    i(ALU32 | alu::MOV | X, dst, dst, 0, 0)
}

/// dst op= src (64-bit).
pub fn alu(op: u8, dst: Reg, src: Reg) -> Insn {
    i(ALU64 | op | X, dst, src, 0, 0)
}

/// dst op= imm (64-bit, imm sign-extended).
pub fn alui(op: u8, dst: Reg, imm: i32) -> Insn {
    i(ALU64 | op | K, dst, 0, 0, imm)
}

/// dst = -dst.
pub fn neg(dst: Reg) -> Insn {
    i(ALU64 | alu::NEG, dst, 0, 0, 0)
}

/// dst = *(size *)(src + off), zero-extended.
pub fn ldx(size: u8, dst: Reg, src: Reg, off: i16) -> Insn {
    i(LDX | MEM | size, dst, src, off, 0)
}

/// *(size *)(dst + off) = src.
pub fn stx(size: u8, dst: Reg, off: i16, src: Reg) -> Insn {
    i(STX | MEM | size, dst, src, off, 0)
}

/// *(size *)(dst + off) = imm.
pub fn st(size: u8, dst: Reg, off: i16, imm: i32) -> Insn {
    i(ST | MEM | size, dst, 0, off, imm)
}

/// Atomic *(u64 *)(dst + off) += src; with `fetch`, src = the old value.
pub fn xadd(dst: Reg, off: i16, src: Reg, fetch: bool) -> Insn {
    // BPF_ADD, | BPF_FETCH.
    i(STX | ATOMIC | DW, dst, src, off, i32::from(fetch))
}

/// Atomic compare-and-exchange of the u32 at dst + off: if it equals
/// w0, it becomes src; w0 = the old value either way.
pub fn cmpxchg32(dst: Reg, off: i16, src: Reg) -> Insn {
    // BPF_CMPXCHG (0xf0 | BPF_FETCH).
    i(STX | ATOMIC | W, dst, src, off, 0xf1)
}

/// if dst <cond> src: jump off instructions on.
pub fn jx(cond: u8, dst: Reg, src: Reg, off: i16) -> Insn {
    i(JMP | cond | X, dst, src, off, 0)
}

/// if dst <cond> imm: jump off instructions on.
pub fn ji(cond: u8, dst: Reg, imm: i32, off: i16) -> Insn {
    i(JMP | cond | K, dst, 0, off, imm)
}

pub fn ja(off: i16) -> Insn {
    i(JMP | jmp::JA, 0, 0, off, 0)
}

pub fn call(helper: i32) -> Insn {
    i(JMP | jmp::CALL, 0, 0, 0, helper)
}

/// A call of the kernel function whose BTF id (in vmlinux) is `btf_id`
/// (BPF_PSEUDO_KFUNC_CALL).
pub fn kfunc_call(btf_id: u32) -> Insn {
    i(JMP | jmp::CALL, 0, 2, 0, btf_id as i32)
}

pub fn exit() -> Insn {
    i(JMP | jmp::EXIT, 0, 0, 0, 0)
}

/// dst = imm (64-bit): two instructions.
pub fn ld64(dst: Reg, imm: i64) -> [Insn; 2] {
    [
        i(LD | IMM | DW, dst, 0, 0, imm as i32),
        i(0, 0, 0, 0, (imm >> 32) as i32),
    ]
}

/// dst = a map (BPF_PSEUDO_MAP_FD) or the address of a value in it
/// (BPF_PSEUDO_MAP_VALUE, .bss): two instructions, the descriptor put in
/// the first at load.
pub fn ldmap(dst: Reg, m: MapRef) -> [Insn; 2] {
    let (pseudo, off) = match m {
        MapRef::Bss(off) => (2, off as i32),
        _ => (1, 0),
    };
    [i(LD | IMM | DW, dst, pseudo, 0, 0), i(0, 0, 0, 0, off)]
}

/// Whether this is the first half of a 64-bit immediate load.
pub fn is_ld64(x: &Insn) -> bool {
    x.code == LD | IMM | DW
}

fn reg(r: Reg) -> String {
    if r == FP {
        "fp".into()
    } else {
        format!("r{r}")
    }
}

fn size_name(code: u8) -> &'static str {
    match code & 0x18 {
        W => "u32",
        H => "u16",
        B => "u8",
        _ => "u64",
    }
}

fn alu_name(op: u8) -> &'static str {
    match op {
        alu::ADD => "+=",
        alu::SUB => "-=",
        alu::MUL => "*=",
        alu::DIV => "/=",
        alu::OR => "|=",
        alu::AND => "&=",
        alu::LSH => "<<=",
        alu::RSH => ">>=",
        alu::MOD => "%=",
        alu::XOR => "^=",
        alu::MOV => "=",
        alu::ARSH => "s>>=",
        _ => "?=",
    }
}

fn jmp_name(op: u8) -> &'static str {
    match op {
        jmp::JEQ => "==",
        jmp::JGT => ">",
        jmp::JGE => ">=",
        jmp::JNE => "!=",
        jmp::JSGT => "s>",
        jmp::JSGE => "s>=",
        jmp::JLT => "<",
        jmp::JLE => "<=",
        jmp::JSLT => "s<",
        jmp::JSLE => "s<=",
        _ => "?",
    }
}

fn helper_name(id: i32) -> String {
    match id {
        helper::MAP_LOOKUP_ELEM => "map_lookup_elem".into(),
        helper::MAP_UPDATE_ELEM => "map_update_elem".into(),
        helper::MAP_DELETE_ELEM => "map_delete_elem".into(),
        helper::KTIME_GET_NS => "ktime_get_ns".into(),
        helper::GET_PRANDOM_U32 => "get_prandom_u32".into(),
        helper::GET_SMP_PROCESSOR_ID => "get_smp_processor_id".into(),
        helper::GET_CURRENT_PID_TGID => "get_current_pid_tgid".into(),
        helper::GET_CURRENT_UID_GID => "get_current_uid_gid".into(),
        helper::GET_CURRENT_TASK => "get_current_task".into(),
        helper::GET_CURRENT_CGROUP_ID => "get_current_cgroup_id".into(),
        helper::PROBE_READ_KERNEL => "probe_read_kernel".into(),
        helper::JIFFIES64 => "jiffies64".into(),
        helper::RINGBUF_OUTPUT => "ringbuf_output".into(),
        helper::GET_CURRENT_TASK_BTF => "get_current_task_btf".into(),
        helper::GET_STACK => "get_stack".into(),
        helper::TASK_STORAGE_GET => "task_storage_get".into(),
        n => format!("helper#{n}"),
    }
}

fn mem(r: Reg, off: i16) -> String {
    if off < 0 {
        format!("{}-{}", reg(r), -i32::from(off))
    } else {
        format!("{}+{off}", reg(r))
    }
}

/// The program as text, one instruction a line (a 64-bit load on one),
/// maps by name: what `-v` and the golden listings show.
pub fn listing(
    insns: &[Insn],
    maps: &[(usize, MapRef)],
    map_name: &dyn Fn(MapRef) -> String,
) -> String {
    let mut out = String::new();
    let mut k = 0;
    while k < insns.len() {
        let x = insns[k];
        let class = x.code & 0x07;
        let text = if is_ld64(&x) {
            let hi = insns.get(k + 1).map_or(0, |n| n.imm);
            let t = match maps.iter().find(|(at, _)| *at == k) {
                Some((_, m @ MapRef::Bss(off))) => {
                    format!("{} = &{} (.bss+{off})", reg(x.dst), map_name(*m))
                }
                Some((_, m)) => format!("{} = map {}", reg(x.dst), map_name(*m)),
                None => format!(
                    "{} = {:#x} ll",
                    reg(x.dst),
                    (i64::from(hi) << 32) | i64::from(x.imm as u32)
                ),
            };
            let _ = writeln!(out, "  {k:4}  {t}");
            k += 2;
            continue;
        } else if class == LDX {
            format!(
                "{} = *({} *)({})",
                reg(x.dst),
                size_name(x.code),
                mem(x.src, x.off)
            )
        } else if class == STX && x.code & 0xe0 == ATOMIC {
            if x.imm == 0xf1 {
                format!(
                    "w0 = cmpxchg((u32 *)({}), w0, {})",
                    mem(x.dst, x.off),
                    reg(x.src)
                )
            } else if x.imm & 1 != 0 {
                format!(
                    "{} = atomic_fetch_add((u64 *)({}), {})",
                    reg(x.src),
                    mem(x.dst, x.off),
                    reg(x.src)
                )
            } else {
                format!("lock *(u64 *)({}) += {}", mem(x.dst, x.off), reg(x.src))
            }
        } else if class == STX {
            format!(
                "*({} *)({}) = {}",
                size_name(x.code),
                mem(x.dst, x.off),
                reg(x.src)
            )
        } else if class == ST {
            format!(
                "*({} *)({}) = {}",
                size_name(x.code),
                mem(x.dst, x.off),
                x.imm
            )
        } else if class == ALU64 || class == ALU32 {
            let w = if class == ALU32 { "w" } else { "r" };
            let op = x.code & 0xf0;
            let src = if x.src == FP {
                "fp".to_string()
            } else {
                format!("{w}{}", x.src)
            };
            if op == alu::NEG {
                format!("{w}{} = -{w}{}", x.dst, x.dst)
            } else if x.code & X != 0 {
                format!("{w}{} {} {src}", x.dst, alu_name(op))
            } else {
                format!("{w}{} {} {}", x.dst, alu_name(op), x.imm)
            }
        } else if class == JMP {
            let op = x.code & 0xf0;
            let to = k as i64 + 1 + i64::from(x.off);
            match op {
                jmp::JA => format!("goto {to}"),
                jmp::CALL if x.src == 2 => format!("call kfunc#{}", x.imm),
                jmp::CALL => format!("call {}", helper_name(x.imm)),
                jmp::EXIT => "exit".into(),
                _ if x.code & X != 0 => {
                    format!(
                        "if {} {} {} goto {to}",
                        reg(x.dst),
                        jmp_name(op),
                        reg(x.src)
                    )
                }
                _ => format!("if {} {} {} goto {to}", reg(x.dst), jmp_name(op), x.imm),
            }
        } else {
            format!("{:#04x} {} {} {} {}", x.code, x.dst, x.src, x.off, x.imm)
        };
        let _ = writeln!(out, "  {k:4}  {text}");
        k += 1;
    }
    out
}
