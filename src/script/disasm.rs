//! The script machine's code as text, one instruction a line: what
//! `bpfscope run --dry-run -v` prints, and what the golden files under
//! tests/golden/run/ hold (the code generator's output, checked without
//! root). Registers are `r0..r31`, string slots `s0..s7`; operands that
//! name a table entry (action, constant string, source, map) are shown
//! with the entry.

use std::fmt::Write;

use bpfscope_bpf::abi::{bs_insn, bs_vm_alu, bs_vm_flags, bs_vm_op};

use super::ir::{Action, Lowered};

/// Every probe's code, with the maps and actions it refers to.
pub fn listing(l: &Lowered) -> String {
    let mut out = String::new();
    for (i, m) in l.maps.iter().enumerate() {
        let keys: Vec<String> = m.keys.iter().map(|k| format!("{:?}", k.ty)).collect();
        let _ = writeln!(out, "map#{i} {} [{}] {:?}", m.name, keys.join(", "), m.kind);
    }
    for (i, a) in l.actions.iter().enumerate() {
        let _ = writeln!(out, "action#{i} {}", action(a));
    }
    for p in &l.probes {
        let _ = writeln!(out, "\n{}:", p.probe.name);
        for (pc, i) in p.code.iter().enumerate() {
            let _ = writeln!(out, "  {pc:4}  {}", insn(i, l));
        }
    }
    out
}

fn action(a: &Action) -> String {
    // The action's own Debug form, on one line: every field shown.
    format!("{a:?}")
}

pub(crate) fn op_name(op: u8) -> String {
    let name = match bs_vm_op(u32::from(op)) {
        bs_vm_op::BS_VM_HALT => "halt",
        bs_vm_op::BS_VM_LDI => "ldi",
        bs_vm_op::BS_VM_SRC => "src",
        bs_vm_op::BS_VM_SRCSTR => "srcstr",
        bs_vm_op::BS_VM_CSTR => "cstr",
        bs_vm_op::BS_VM_STRPTR => "strptr",
        bs_vm_op::BS_VM_MOV => "mov",
        bs_vm_op::BS_VM_SMOV => "smov",
        bs_vm_op::BS_VM_ALU => "alu",
        bs_vm_op::BS_VM_STREQ => "streq",
        bs_vm_op::BS_VM_JMP => "jmp",
        bs_vm_op::BS_VM_JZ => "jz",
        bs_vm_op::BS_VM_JNZ => "jnz",
        bs_vm_op::BS_VM_KEYCLR => "keyclr",
        bs_vm_op::BS_VM_KEYNUM => "keynum",
        bs_vm_op::BS_VM_KEYSTR => "keystr",
        bs_vm_op::BS_VM_BUCKET => "bucket",
        bs_vm_op::BS_VM_AGG => "agg",
        bs_vm_op::BS_VM_MSET => "mset",
        bs_vm_op::BS_VM_MSETSTR => "msetstr",
        bs_vm_op::BS_VM_MGET => "mget",
        bs_vm_op::BS_VM_MGETSTR => "mgetstr",
        bs_vm_op::BS_VM_MDEL => "mdel",
        bs_vm_op::BS_VM_EVNUM => "evnum",
        bs_vm_op::BS_VM_EVSTR => "evstr",
        bs_vm_op::BS_VM_JOIN => "join",
        bs_vm_op::BS_VM_EMIT => "emit",
        bs_vm_op::BS_VM_READ => "read",
        bs_vm_op::BS_VM_STREQC => "streqc",
        bs_vm_op::BS_VM_KEY1 => "key1",
        bs_vm_op::BS_VM_NTOP => "ntop",
        bs_vm_op::BS_VM_STRSTR => "strstr",
        bs_vm_op::BS_VM_SIGNAL => "signal",
        bs_vm_op::BS_VM_BUF => "buf",
        bs_vm_op::BS_VM_USYM => "usym",
        bs_vm_op::BS_VM_NEXT => "next",
        bs_vm_op::BS_VM_KEYGET => "keyget",
        bs_vm_op::BS_VM_SVNUM => "svnum",
        _ => return format!("op{op}"),
    };
    name.to_string()
}

fn alu_name(arg: u32) -> &'static str {
    match bs_vm_alu(arg) {
        bs_vm_alu::BS_ALU_ADD => "add",
        bs_vm_alu::BS_ALU_SUB => "sub",
        bs_vm_alu::BS_ALU_MUL => "mul",
        bs_vm_alu::BS_ALU_DIV => "div",
        bs_vm_alu::BS_ALU_MOD => "mod",
        bs_vm_alu::BS_ALU_AND => "and",
        bs_vm_alu::BS_ALU_OR => "or",
        bs_vm_alu::BS_ALU_XOR => "xor",
        bs_vm_alu::BS_ALU_SHL => "shl",
        bs_vm_alu::BS_ALU_SHR => "shr",
        bs_vm_alu::BS_ALU_EQ => "eq",
        bs_vm_alu::BS_ALU_NE => "ne",
        bs_vm_alu::BS_ALU_LT => "lt",
        bs_vm_alu::BS_ALU_LE => "le",
        bs_vm_alu::BS_ALU_GT => "gt",
        bs_vm_alu::BS_ALU_GE => "ge",
        bs_vm_alu::BS_ALU_NEG => "neg",
        bs_vm_alu::BS_ALU_NOT => "not",
        bs_vm_alu::BS_ALU_BNOT => "bnot",
        bs_vm_alu::BS_ALU_BOOL => "bool",
        bs_vm_alu::BS_ALU_BSWAP => "bswap",
        _ => "?",
    }
}

fn flags(f: u8) -> String {
    const NAMES: [(bs_vm_flags, &str); 8] = [
        (bs_vm_flags::BS_VMF_IMM, "imm"),
        (bs_vm_flags::BS_VMF_SIGNED, "signed"),
        (bs_vm_flags::BS_VMF_MINMAX, "minmax"),
        (bs_vm_flags::BS_VMF_AGG, "agg"),
        (bs_vm_flags::BS_VMF_LOG2, "log2"),
        (bs_vm_flags::BS_VMF_REGLEN, "reglen"),
        (bs_vm_flags::BS_VMF_COUNT, "count"),
        (bs_vm_flags::BS_VMF_BUCKET, "bucket"),
    ];
    let set: Vec<&str> = NAMES
        .iter()
        .filter(|(b, _)| u32::from(f) & b.0 != 0)
        .map(|(_, n)| *n)
        .collect();
    if set.is_empty() {
        String::new()
    } else {
        format!(" [{}]", set.join(" "))
    }
}

/// One instruction: the operands each operation reads, named by kind.
fn insn(i: &bs_insn, l: &Lowered) -> String {
    let (d, a, b) = (i.dst, i.a, i.b);
    let map = |id: u32| {
        l.maps
            .get(id as usize)
            .map_or(format!("map#{id}"), |m| m.name.clone())
    };
    let cstr = |n: u32| {
        l.strs
            .strs
            .get(n as usize)
            .map_or(format!("str#{n}"), |s| format!("{s:?}"))
    };
    let op = op_name(i.op);
    let task = matches!(
        bs_vm_op(u32::from(i.op)),
        bs_vm_op::BS_VM_MSET | bs_vm_op::BS_VM_MGET | bs_vm_op::BS_VM_MDEL
    ) && u32::from(i.flags) & bs_vm_flags::BS_VMF_TASK.0 != 0;
    let ops = match bs_vm_op(u32::from(i.op)) {
        bs_vm_op::BS_VM_LDI => format!("r{d}, {}", i.imm),
        bs_vm_op::BS_VM_SRC | bs_vm_op::BS_VM_SRCSTR => {
            let reg = if i.op == bs_vm_op::BS_VM_SRC.0 as u8 {
                "r"
            } else {
                "s"
            };
            format!("{reg}{d}, src#{}", i.arg)
        }
        bs_vm_op::BS_VM_CSTR => format!("s{d}, {}", cstr(i.arg)),
        bs_vm_op::BS_VM_STRPTR => format!("s{d}, [r{a}], max {}", i.imm),
        bs_vm_op::BS_VM_MOV => format!("r{d}, r{a}"),
        bs_vm_op::BS_VM_SMOV => format!("s{d}, s{a}"),
        bs_vm_op::BS_VM_ALU => {
            let rhs = if u32::from(i.flags) & bs_vm_flags::BS_VMF_IMM.0 != 0 {
                i.imm.to_string()
            } else {
                format!("r{b}")
            };
            format!("{} r{d}, r{a}, {rhs}", alu_name(i.arg))
        }
        bs_vm_op::BS_VM_STREQ => format!("r{d}, s{a}, s{b}, n {}", i.imm),
        bs_vm_op::BS_VM_STREQC => format!("r{d}, s{a}, {}, n {}", cstr(i.arg), i.imm),
        bs_vm_op::BS_VM_STRSTR => format!("r{d}, s{a}, s{b}"),
        bs_vm_op::BS_VM_JMP => format!("-> {}", i.arg),
        bs_vm_op::BS_VM_JZ | bs_vm_op::BS_VM_JNZ => format!("r{a} -> {}", i.arg),
        bs_vm_op::BS_VM_KEYCLR => format!("{}, key {} B, zero {} words", map(i.arg), i.arg2, i.imm),
        bs_vm_op::BS_VM_KEY1 => format!(
            "{}, r{a}, key {} B, zero {} words",
            map(i.arg),
            i.arg2,
            i.imm
        ),
        bs_vm_op::BS_VM_KEYNUM => format!("key+{}, r{a}", i.arg),
        bs_vm_op::BS_VM_KEYSTR => format!("key+{}, s{a}", i.arg),
        bs_vm_op::BS_VM_KEYGET if i.arg2 != 0 => format!("s{d}, key+{}", i.arg),
        bs_vm_op::BS_VM_KEYGET => format!("r{d}, key+{}", i.arg),
        bs_vm_op::BS_VM_BUCKET => format!("r{d}, r{a}, min {} step {} n {}", i.imm, i.arg, i.arg2),
        // A keyless map's array (BS_VMF_SLOTS, which shares AGG's bit).
        bs_vm_op::BS_VM_AGG if u32::from(i.flags) & bs_vm_flags::BS_VMF_SLOTS.0 != 0 => {
            format!("r{a}, bucket r{b}, {} slots {}", map(i.arg), i.arg2)
        }
        bs_vm_op::BS_VM_AGG => format!("r{a}, bucket r{b}"),
        // A map in the thread's own storage (BS_VMF_TASK, LOG2's bit).
        bs_vm_op::BS_VM_MSET | bs_vm_op::BS_VM_MGET | bs_vm_op::BS_VM_MDEL if task => {
            let reg = match bs_vm_op(u32::from(i.op)) {
                bs_vm_op::BS_VM_MSET => format!("r{a}, "),
                bs_vm_op::BS_VM_MGET => format!("r{d}, "),
                _ => String::new(),
            };
            format!("{reg}thread word {}", i.arg2)
        }
        bs_vm_op::BS_VM_MSET | bs_vm_op::BS_VM_EVNUM if i.op == bs_vm_op::BS_VM_MSET.0 as u8 => {
            format!("r{a}")
        }
        bs_vm_op::BS_VM_MSETSTR => format!("s{a}"),
        bs_vm_op::BS_VM_MGET => format!("r{d}"),
        bs_vm_op::BS_VM_MGETSTR => format!("s{d}"),
        bs_vm_op::BS_VM_MDEL => String::new(),
        bs_vm_op::BS_VM_EVNUM => format!("ev+{}, r{a}", i.arg),
        bs_vm_op::BS_VM_EVSTR => format!("ev+{}, s{a}", i.arg),
        bs_vm_op::BS_VM_JOIN => format!("ev, [r{a}]"),
        bs_vm_op::BS_VM_EMIT => format!("action#{}, {} B", i.arg, i.arg2),
        bs_vm_op::BS_VM_READ => format!("r{d}, [r{a}], {} B", i.arg),
        bs_vm_op::BS_VM_NEXT => format!("s{d}, found r{a}, index r{b}"),
        bs_vm_op::BS_VM_SVNUM => format!("r{d}, s{a}"),
        _ => format!(
            "dst {d} a {a} b {b} arg {} arg2 {} imm {}",
            i.arg, i.arg2, i.imm
        ),
    };
    // On AGG, the bit BS_VMF_AGG names is BS_VMF_SLOTS, and on a map
    // operation LOG2's is BS_VMF_TASK, said in the operands.
    let f = if i.op == bs_vm_op::BS_VM_AGG.0 as u8 {
        i.flags & !(bs_vm_flags::BS_VMF_SLOTS.0 as u8)
    } else if task {
        i.flags & !(bs_vm_flags::BS_VMF_TASK.0 as u8)
    } else {
        i.flags
    };
    format!("{op:<8} {ops}{}", flags(f)).trim_end().to_string()
}
