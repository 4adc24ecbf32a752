//! What the passes produce: the script machine's instructions (vm.bpf.h),
//! the limits they must fit, and the actions, triggers and probes that
//! user space and the attach stage read. `disasm` prints it.

use bpfscope_bpf::abi::{bs_insn, bs_limits, bs_src, bs_vm_op};

use super::types::*;
use crate::attach::plan::Path;
use crate::filter::StrTable;
use crate::lang::ast::*;
use crate::lang::parse::line_col;
use crate::probe::Probe;

pub(crate) const REGS: u8 = bs_limits::BS_VM_REGS.0 as u8;
pub(crate) const STRS: u8 = bs_limits::BS_VM_STRS.0 as u8;
pub const STR_MAX: usize = bs_limits::BS_STR_MAX.0 as usize;
pub(crate) const KEY_MAX: usize = bs_limits::BS_KEY_MAX.0 as usize;
pub(crate) const EVENT_MAX: usize = bs_limits::BS_EVENT_DATA_MAX.0 as usize;
pub const JOIN_MAX: usize = bs_limits::BS_VM_JOIN_MAX.0 as usize;
/// comm's bytes, its NUL included.
pub(crate) const COMM_LEN: usize = bs_limits::BS_COMM_LEN.0 as usize;
/// Key data starts with the map's id.
pub const KEY_ID_LEN: usize = 8;
/// Instructions in all probes' code.
pub(crate) const CODE_MAX: usize = bs_limits::BS_VM_CODE_MAX.0 as usize;
/// Macros expanded inside one another at most this deep.
pub(crate) const MAX_EXPANSION: usize = 32;
/// Frames a stack holds (the stack maps' depth; bpftrace's default).
pub const STACK_FRAMES: u8 = 127;
/// Buckets of a log2 histogram: negatives, zero, then [2^k, 2^(k+1)) for k in 0..64.
pub const LOG2_BUCKETS: u32 = 66;
/// `unroll` counts bpftrace accepts.
pub(crate) const UNROLL_MAX: u64 = 100;

/// An argument of a record: its type and offset after the record header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arg {
    pub ty: Ty,
    pub off: usize,
}

/// What user space does with a record (its header's `probe` field).
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    Printf {
        fmt: String,
        args: Vec<Arg>,
    },
    Time {
        fmt: Option<String>,
    },
    /// system(fmt, ...) (with --unsafe): the command printf makes, run by
    /// the shell when the record arrives, its output printed.
    System {
        fmt: String,
        args: Vec<Arg>,
    },
    /// cat(fmt, ...): the file printf names, printed when the record arrives.
    Cat {
        fmt: String,
        args: Vec<Arg>,
    },
    /// join(): strings after the header, separated by `sep`.
    Join {
        sep: String,
    },
    Print {
        map: u32,
        top: u64,
        div: u64,
    },
    PrintValue {
        arg: Arg,
    },
    Clear {
        map: u32,
    },
    Zero {
        map: u32,
    },
    Exit,
}

/// A special probe run by bpfscope itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    Begin,
    End,
    Interval { ms: u64 },
}

/// One attach point with its lowered code.
#[derive(Debug, Clone)]
pub struct LoweredProbe {
    pub probe: Probe,
    pub path: Path,
    /// A block bpfscope runs itself (BEGIN, END, interval).
    pub trigger: Option<Trigger>,
    pub code: Vec<bs_insn>,
}

/// The lowering's result: code per probe, and what user space needs to
/// make sense of the maps and records.
#[derive(Debug, Clone, Default)]
pub struct Lowered {
    pub probes: Vec<LoweredProbe>,
    pub srcs: Vec<bs_src>,
    pub strs: StrTable,
    pub maps: Vec<MapDef>,
    pub actions: Vec<Action>,
    pub stacks: (bool, bool),
    /// Texts values are shown with (`Ty::Time`'s formats...), by index.
    pub texts: Vec<String>,
    /// Largest key: the map id and parts.
    pub key_size: usize,
}

/// A lowering error at a span of the script.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LowerError {
    pub span: Span,
    pub msg: String,
}

impl LowerError {
    pub fn render(&self, src: &str) -> String {
        let (l, c) = line_col(src, self.span.start);
        format!("{l}:{c}: {}", self.msg)
    }
}

pub(crate) type Res<T> = Result<T, LowerError>;

pub(crate) fn err<T>(span: Span, msg: impl Into<String>) -> Res<T> {
    Err(LowerError {
        span,
        msg: msg.into(),
    })
}

/// Bytes an argument takes in a record.
pub fn arg_len(t: Ty) -> usize {
    if t.in_slot() {
        STR_MAX
    } else {
        8
    }
}

/// An instruction, built up by the helpers below.
pub(crate) fn insn(op: bs_vm_op, dst: u8, a: u8, b: u8) -> bs_insn {
    bs_insn {
        op: op.0 as u8,
        dst,
        a,
        b,
        ..Default::default()
    }
}

pub(crate) trait InsnExt {
    fn arg(self, v: u32) -> Self;
    fn imm(self, v: i64) -> Self;
    fn flags(self, f: u8) -> Self;
}

impl InsnExt for bs_insn {
    fn arg(mut self, v: u32) -> Self {
        self.arg = v;
        self
    }
    fn imm(mut self, v: i64) -> Self {
        self.imm = v;
        self
    }
    fn flags(mut self, f: u8) -> Self {
        self.flags |= f;
        self
    }
}
