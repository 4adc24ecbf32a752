//! Lowering: a parsed script, per probe, into instructions of the script
//! machine (vm.bpf.h). Types are checked here, as each expression is
//! lowered: what the machine cannot do is refused with the line and column
//! of the expression, before anything is loaded.
//!
//! Every probe a block's attach points resolve to gets the code of every
//! block that names it, in script order (bpftrace runs them in that order),
//! so builtins that are constant per probe (`probe`, `func`) are constants.

use std::collections::HashMap;

use bpfscope_bpf::abi::{
    bs_insn, bs_limits, bs_src, bs_src_kind, bs_val_type, bs_vm_alu, bs_vm_flags, bs_vm_op,
};

use super::ast::*;
use super::parse::line_col;
use crate::attach::plan::{Path, ValueKind};
use crate::filter::StrTable;
use crate::probe::{Probe, ProbeKind};

const REGS: u8 = bs_limits::BS_VM_REGS.0 as u8;
const STRS: u8 = bs_limits::BS_VM_STRS.0 as u8;
pub const STR_MAX: usize = bs_limits::BS_STR_MAX.0 as usize;
const KEY_MAX: usize = bs_limits::BS_KEY_MAX.0 as usize;
const EVENT_MAX: usize = bs_limits::BS_EVENT_DATA_MAX.0 as usize;
pub const JOIN_MAX: usize = bs_limits::BS_VM_JOIN_MAX.0 as usize;
/// Key data starts with the map's id.
pub const KEY_ID_LEN: usize = 8;
/// Instructions in all probes' code.
const CODE_MAX: usize = bs_limits::BS_VM_CODE_MAX.0 as usize;
/// Macros expanded inside one another at most this deep.
const MAX_EXPANSION: usize = 32;
/// Frames a stack holds (the stack maps' depth; bpftrace's default).
pub const STACK_FRAMES: u8 = 127;
/// Buckets of a log2 histogram: negatives, zero, then [2^k, 2^(k+1)) for k in 0..64.
pub const LOG2_BUCKETS: u32 = 66;
/// `unroll` counts bpftrace accepts.
const UNROLL_MAX: u64 = 100;

/// A value's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ty {
    Int {
        signed: bool,
    },
    Str,
    /// A stack id in the kernel or user stack map, printed with at most
    /// `limit` frames, in bpftrace's mode or perf's (`kstack(perf, 8)`).
    Stack {
        user: bool,
        limit: u8,
        perf: bool,
    },
    /// A user id, shown as the user's name (`username`).
    User,
    /// An IP address (ntop()), in a string slot: the family, then the bytes.
    Inet,
    /// Bytes (buf()), in a string slot: their count, then them; printed
    /// with `\xNN` escapes.
    Buf,
    /// A kernel address shown as its symbol (ksym()).
    KSym,
    /// A user address and its process, in a string slot (usym()): named
    /// in user space.
    USym,
    /// An address of a struct whose BTF type id is `btf` (a cast, or a
    /// typed pointer member): its members can be read.
    Ptr {
        btf: u32,
    },
    /// An address of integers (`(uint16 *)p`): `*p` and `p[i]` read them.
    IntPtr {
        bits: u8,
        signed: bool,
    },
}

impl Ty {
    /// Integers and addresses: what arithmetic, conditions and %d take.
    pub fn is_num(self) -> bool {
        matches!(self, Ty::Int { .. } | Ty::Ptr { .. } | Ty::IntPtr { .. })
    }

    /// Held in a string slot (64 bytes) rather than a register.
    pub fn in_slot(self) -> bool {
        matches!(self, Ty::Str | Ty::Inet | Ty::Buf | Ty::USym)
    }

    /// As a plain integer (a typed pointer is an unsigned address).
    fn plain(self) -> Ty {
        match self {
            Ty::Ptr { .. } | Ty::IntPtr { .. } => Ty::Int { signed: false },
            t => t,
        }
    }
}

/// What made a map's values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AggFn {
    Count,
    Sum,
    Avg,
    Min,
    Max,
    Stats,
    Hist,
    Lhist { min: i64, max: i64, step: i64 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MapKind {
    /// Plain assignments of this type.
    Plain(Ty),
    Agg(AggFn, /* signed value */ bool),
}

/// One key part: its type and offset in the key data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyPart {
    pub ty: Ty,
    pub off: usize,
    pub len: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub struct MapDef {
    /// With its '@'.
    pub name: String,
    pub kind: MapKind,
    pub keys: Vec<KeyPart>,
}

impl MapDef {
    pub fn key_len(&self) -> usize {
        self.keys.last().map_or(KEY_ID_LEN, |k| k.off + k.len)
    }
}

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

type Res<T> = Result<T, LowerError>;

fn err<T>(span: Span, msg: impl Into<String>) -> Res<T> {
    Err(LowerError {
        span,
        msg: msg.into(),
    })
}

/// A lowered expression: its type and where it is (a register, or a string slot).
#[derive(Debug, Clone, Copy)]
struct Val {
    ty: Ty,
    loc: u8,
    /// An integer literal: takes the other operand's signedness.
    lit: bool,
    /// Bits of an integer as read (a u16 member: 16), for bswap().
    bits: u8,
}

/// Where a probe block's reads come from.
pub struct ProbeCtx<'a> {
    pub probe: &'a Probe,
    pub path: &'a Path,
}

/// State shared by every probe's lowering: maps, actions, sources, strings.
#[derive(Default)]
pub struct Shared {
    pub maps: Vec<MapDef>,
    pub actions: Vec<Action>,
    pub srcs: Vec<bs_src>,
    src_index: HashMap<Vec<u8>, u32>,
    pub strs: StrTable,
    pub stacks: (bool, bool),
    /// Positional parameters ($1...).
    pub params: Vec<String>,
    /// Constants known by name (macros of the headers scripts include).
    pub consts: HashMap<String, i64>,
    /// Maps some statement of the script assigns (with '@'): any other
    /// map named is undefined, as bpftrace says.
    pub defined: std::collections::HashSet<String>,
    /// The script's own `#define`s, each body parsed as an expression.
    pub defines: HashMap<String, Expr>,
    /// Object-like macros of the headers the script includes.
    pub macros: super::cpp::HeaderMacros,
    /// `--unsafe`: signal() may be used.
    pub unsafe_ok: bool,
}

impl Shared {
    pub fn new(params: Vec<String>) -> Shared {
        let consts = KNOWN_CONSTS
            .iter()
            .map(|(n, v)| (n.to_string(), *v))
            .collect();
        Shared {
            params,
            consts,
            ..Default::default()
        }
    }

    /// A map no statement assigns.
    fn undefined<T>(&self, name: &str, span: Span) -> Res<T> {
        err(
            span,
            format!("Undefined map: {name} (no statement of the script assigns it)"),
        )
    }

    fn map_id(&self, name: &str) -> Option<u32> {
        self.maps
            .iter()
            .position(|m| m.name == name)
            .map(|i| i as u32)
    }

    fn src(&mut self, s: bs_src) -> u32 {
        let key = bpfscope_sys::pod::bytes(&s).to_vec();
        if let Some(i) = self.src_index.get(&key) {
            return *i;
        }
        self.srcs.push(s);
        let i = (self.srcs.len() - 1) as u32;
        self.src_index.insert(key, i);
        i
    }

    fn action(&mut self, a: Action) -> u32 {
        if let Some(i) = self.actions.iter().position(|x| *x == a) {
            return i as u32;
        }
        self.actions.push(a);
        (self.actions.len() - 1) as u32
    }

    /// Declares a map's kind and key on first use; later uses must agree.
    fn declare(&mut self, name: &str, kind: MapKind, keys: &[Ty], span: Span) -> Res<u32> {
        if let Some(id) = self.map_id(name) {
            let m = &mut self.maps[id as usize];
            let same_keys = m.keys.len() == keys.len()
                && m.keys.iter().zip(keys).all(|(a, b)| same_ty(a.ty, *b));
            if !same_keys {
                return err(
                    span,
                    format!(
                        "{name} is used with keys of different types ({} here, {} before)",
                        describe_keys(keys),
                        describe_keys(&m.keys.iter().map(|k| k.ty).collect::<Vec<_>>())
                    ),
                );
            }
            match (m.kind, kind) {
                (MapKind::Plain(a), MapKind::Plain(b)) if same_ty(a, b) => {
                    if let (Ty::Int { signed: x }, Ty::Int { signed: y }) = (a, b) {
                        m.kind = MapKind::Plain(Ty::Int { signed: x || y });
                    }
                }
                (MapKind::Agg(a, s1), MapKind::Agg(b, s2)) if a == b => {
                    m.kind = MapKind::Agg(a, s1 || s2);
                }
                (a, b) => {
                    return err(
                        span,
                        format!(
                            "{name} holds {} and cannot also hold {}",
                            describe_kind(a),
                            describe_kind(b)
                        ),
                    )
                }
            }
            return Ok(id);
        }
        let mut off = KEY_ID_LEN;
        let mut parts = Vec::new();
        for &ty in keys {
            let len = if ty.in_slot() { STR_MAX } else { 8 };
            parts.push(KeyPart { ty, off, len });
            off += len;
        }
        if off > KEY_MAX {
            return err(
                span,
                format!("{name}'s key takes {off} bytes; at most {KEY_MAX} fit (strings take {STR_MAX})"),
            );
        }
        self.maps.push(MapDef {
            name: name.to_string(),
            kind,
            keys: parts,
        });
        Ok((self.maps.len() - 1) as u32)
    }
}

fn cannot<T>(op: BinOp, a: Ty, b: Ty, span: Span) -> Res<T> {
    err(
        span,
        format!(
            "{op:?} of {} and {} is not possible",
            describe_ty(a),
            describe_ty(b)
        ),
    )
}

fn same_ty(a: Ty, b: Ty) -> bool {
    (a.is_num() && b.is_num()) || a == b
}

fn describe_ty(t: Ty) -> &'static str {
    match t {
        Ty::Int { .. } => "an integer",
        Ty::Str => "a string",
        Ty::Stack { user: false, .. } => "a kernel stack",
        Ty::Stack { user: true, .. } => "a user stack",
        Ty::Ptr { .. } | Ty::IntPtr { .. } => "a pointer",
        Ty::User => "a user name",
        Ty::Inet => "an IP address",
        Ty::Buf => "a buffer",
        Ty::KSym => "a kernel symbol",
        Ty::USym => "a user symbol",
    }
}

fn describe_keys(k: &[Ty]) -> String {
    if k.is_empty() {
        return "none".into();
    }
    k.iter()
        .map(|t| describe_ty(*t))
        .collect::<Vec<_>>()
        .join(", ")
}

fn describe_kind(k: MapKind) -> String {
    match k {
        MapKind::Plain(t) => describe_ty(t).to_string(),
        MapKind::Agg(f, _) => format!("{f:?}() results").to_lowercase(),
    }
}

/// Macros of the kernel headers scripts include (`#include <linux/sched.h>`):
/// BTF has enums, not macros, so the ones the shipped tools use are here.
const KNOWN_CONSTS: &[(&str, i64)] = &[
    ("TASK_RUNNING", 0),
    ("TASK_INTERRUPTIBLE", 1),
    ("TASK_UNINTERRUPTIBLE", 2),
    ("AF_INET", 2),
    ("AF_INET6", 10),
    ("AF_UNIX", 1),
];

/// The lowering of one probe's code.
pub struct Lower<'a> {
    sh: &'a mut Shared,
    pc: &'a ProbeCtx<'a>,
    code: Vec<bs_insn>,
    vars: HashMap<String, Val>,
    /// Variables count up from 0, temporaries down from the top.
    next_var_reg: u8,
    next_var_str: u8,
    tmp_reg: u8,
    tmp_str: u8,
    /// Jumps to the end of the block (`return`), patched when it closes.
    exits: Vec<usize>,
    /// Script macros being expanded inside one another.
    expanding: usize,
    /// The loops around the statement being lowered, innermost last.
    loops: Vec<Loop>,
    /// The variables `let` declared in each block around the statement
    /// being lowered, innermost last: they go out of scope with it.
    scopes: Vec<Vec<String>>,
    /// Variables that hold tuples, with their member counts: a tuple's
    /// members are variables of their own, named `t.0`, `t.1`, ... (a
    /// nested tuple's `t.1.0`), so a member is read as any variable is.
    tuples: HashMap<String, usize>,
}

/// A tuple as evaluated: each member a value, or a tuple of its own.
#[derive(Clone)]
enum TVal {
    One(Val),
    Many(Vec<TVal>),
}

impl TVal {
    /// The members in order, nested tuples flattened (a tuple as map keys).
    fn flatten(&self, out: &mut Vec<Val>) {
        match self {
            TVal::One(v) => out.push(*v),
            TVal::Many(m) => m.iter().for_each(|t| t.flatten(out)),
        }
    }
}

/// A loop being lowered: where `continue` goes, and the `break` jumps to
/// patch to its end.
struct Loop {
    top: u32,
    breaks: Vec<usize>,
}

impl<'a> Lower<'a> {
    pub fn new(sh: &'a mut Shared, pc: &'a ProbeCtx<'a>) -> Lower<'a> {
        Lower {
            sh,
            pc,
            code: Vec::new(),
            vars: HashMap::new(),
            next_var_reg: 0,
            next_var_str: 0,
            tmp_reg: REGS,
            tmp_str: STRS,
            exits: Vec::new(),
            expanding: 0,
            loops: Vec::new(),
            scopes: Vec::new(),
            tuples: HashMap::new(),
        }
    }

    /// One probe block: its predicate, then its statements. Variables are
    /// the block's own.
    pub fn block(&mut self, b: &ProbeBlock) -> Res<()> {
        self.vars.clear();
        self.tuples.clear();
        self.next_var_reg = 0;
        self.next_var_str = 0;
        let mut skip = None;
        if let Some(p) = &b.predicate {
            let v = self.expr(p)?;
            let r = self.truth(v, p.span)?;
            skip = Some(self.emit(insn(bs_vm_op::BS_VM_JZ, 0, r, 0)));
            self.reset_tmps();
        }
        self.stmts(&b.body)?;
        if let Some(j) = skip {
            self.patch(j);
        }
        Ok(())
    }

    /// The probe's code. `return` and `exit()` jump to its end: running
    /// off the end ends the run, with no halt instruction to step through.
    pub fn finish(mut self) -> Vec<bs_insn> {
        for j in std::mem::take(&mut self.exits) {
            self.patch(j);
        }
        self.code
    }

    fn emit(&mut self, i: bs_insn) -> usize {
        self.code.push(i);
        self.code.len() - 1
    }

    /// Points the jump at `at` to the next instruction.
    fn patch(&mut self, at: usize) {
        let to = self.code.len() as u32;
        self.code[at].arg = to;
    }

    fn reset_tmps(&mut self) {
        self.tmp_reg = REGS;
        self.tmp_str = STRS;
    }

    fn reg(&mut self, span: Span) -> Res<u8> {
        if self.tmp_reg <= self.next_var_reg + 1 {
            return err(
                span,
                format!("expression too complex: the machine has {REGS} registers"),
            );
        }
        self.tmp_reg -= 1;
        Ok(self.tmp_reg)
    }

    fn slot(&mut self, span: Span) -> Res<u8> {
        if self.tmp_str <= self.next_var_str {
            return err(
                span,
                format!("too many strings at once: the machine has {STRS} string slots"),
            );
        }
        self.tmp_str -= 1;
        Ok(self.tmp_str)
    }

    /// A block's statements, in a scope of their own for `let`.
    fn stmts(&mut self, body: &[Stmt]) -> Res<()> {
        self.scopes.push(Vec::new());
        let r = body.iter().try_for_each(|s| {
            self.stmt(s)?;
            self.reset_tmps();
            Ok(())
        });
        for name in self.scopes.pop().unwrap_or_default() {
            self.forget(&name);
        }
        r
    }

    /// A variable out of scope: itself, or a tuple and its members.
    fn forget(&mut self, name: &str) {
        self.vars.remove(name);
        if self.tuples.remove(name).is_some() {
            let members = format!("{name}.");
            self.vars.retain(|n, _| !n.starts_with(&members));
            self.tuples.retain(|n, _| !n.starts_with(&members));
        }
    }

    /// The tuple an expression makes, if it makes one: a literal, a
    /// tuple variable or a member of one that is a tuple itself.
    fn tuple_of(&mut self, e: &Expr) -> Res<Option<TVal>> {
        match &e.kind {
            ExprKind::Tuple(items) => {
                let mut out = Vec::with_capacity(items.len());
                for x in items {
                    out.push(match self.tuple_of(x)? {
                        Some(t) => t,
                        None => TVal::One(self.expr(x)?),
                    });
                }
                Ok(Some(TVal::Many(out)))
            }
            _ => Ok(self
                .tuple_path(e)
                .filter(|p| self.tuples.contains_key(p))
                .map(|p| self.tuple_var(&p))),
        }
    }

    /// `$t.1.0` as the variable holding it (`t.1.0`); None for any other
    /// expression.
    fn tuple_path(&self, e: &Expr) -> Option<String> {
        let (base, parts) = e.member_chain();
        let ExprKind::Var(name) = &base.kind else {
            return None;
        };
        let mut path = name.clone();
        for (f, arrow) in parts {
            if arrow || !f.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            path.push('.');
            path.push_str(f);
        }
        Some(path)
    }

    fn tuple_var(&self, name: &str) -> TVal {
        let n = self.tuples.get(name).copied().unwrap_or(0);
        TVal::Many(
            (0..n)
                .map(|i| {
                    let m = format!("{name}.{i}");
                    match self.vars.get(&m) {
                        Some(v) => TVal::One(*v),
                        None => self.tuple_var(&m),
                    }
                })
                .collect(),
        )
    }

    /// `$t = (a, b)`: each member into a variable of its own.
    fn bind_tuple(&mut self, name: &str, t: TVal, span: Span) -> Res<()> {
        let TVal::Many(members) = t else {
            return err(
                span,
                format!("${name} holds a tuple; it cannot be assigned a value"),
            );
        };
        match self.tuples.get(name) {
            Some(&n) if n != members.len() => {
                return err(
                    span,
                    format!(
                        "${name} holds a tuple of {n} members; it cannot be assigned one of {}",
                        members.len()
                    ),
                )
            }
            None if self.vars.contains_key(name) => {
                return err(
                    span,
                    format!("${name} holds a value; it cannot be assigned a tuple"),
                )
            }
            _ => {}
        }
        self.tuples.insert(name.to_string(), members.len());
        for (i, m) in members.into_iter().enumerate() {
            let member = format!("{name}.{i}");
            match m {
                TVal::One(v) => {
                    if self.tuples.contains_key(&member) {
                        return err(
                            span,
                            format!("${member} holds a tuple; it cannot be assigned a value"),
                        );
                    }
                    self.set_var(&member, v, span)?
                }
                many => self.bind_tuple(&member, many, span)?,
            }
        }
        Ok(())
    }

    /// `for ($kv : @map) { ... }`: the map's entries one after another
    /// (BS_VM_NEXT finds the n-th), its key as `$kv.0` (a tuple of the
    /// key's parts when there are several) and its value as `$kv.1`.
    fn for_each(&mut self, var: &str, map: &str, body: &[Stmt], span: Span) -> Res<()> {
        let mname = name_or_at(map);
        let Some(id) = self.sh.map_id(&mname) else {
            return self.sh.undefined(&mname, span);
        };
        let m = &self.sh.maps[id as usize];
        let MapKind::Plain(vty) = m.kind else {
            return err(
                span,
                format!(
                    "for ($kv : {mname}): {mname} holds {}; bpfscope run iterates maps of assigned values, not aggregations (print the map instead)",
                    describe_kind(m.kind)
                ),
            );
        };
        if m.keys.is_empty() {
            return err(
                span,
                format!("for ($kv : {mname}): {mname} has no keys to iterate"),
            );
        }
        let keys: Vec<KeyPart> = m.keys.clone();
        if self.vars.contains_key(var) || self.tuples.contains_key(var) {
            return err(
                span,
                format!("for (${var} : {mname}): ${var} is already a variable here"),
            );
        }
        // The entry number: a variable of its own, out of the script's names.
        let counter = format!("for.{}", self.code.len());
        let zero = self.int(0, span)?;
        self.set_var(&counter, Val { lit: false, ..zero }, span)?;
        let n = self.vars.get(&counter).map_or(0, |v| v.loc);
        self.reset_tmps();
        let top = self.code.len() as u32;
        self.emit(insn(bs_vm_op::BS_VM_KEYCLR, 0, 0, 0).arg(id));
        let vslot = self.slot(span)?;
        let found = self.reg(span)?;
        self.emit(insn(bs_vm_op::BS_VM_NEXT, vslot, found, n));
        let done = self.emit(insn(bs_vm_op::BS_VM_JZ, 0, found, 0));
        self.emit(
            insn(bs_vm_op::BS_VM_ALU, n, n, 0)
                .arg(bs_vm_alu::BS_ALU_ADD.0)
                .flags(bs_vm_flags::BS_VMF_IMM.0 as u8)
                .imm(1),
        );
        let mut parts = Vec::with_capacity(keys.len());
        for k in &keys {
            let (loc, text) = if k.ty.in_slot() {
                (self.slot(span)?, 1)
            } else {
                (self.reg(span)?, 0)
            };
            let mut i = insn(bs_vm_op::BS_VM_KEYGET, loc, 0, 0).arg(k.off as u32);
            i.arg2 = text;
            self.emit(i);
            parts.push(TVal::One(Val {
                ty: k.ty,
                loc,
                lit: false,
                bits: 64,
            }));
        }
        let value = if vty.in_slot() {
            Val {
                ty: vty,
                loc: vslot,
                lit: false,
                bits: 64,
            }
        } else {
            let r = self.reg(span)?;
            self.emit(insn(bs_vm_op::BS_VM_SVNUM, r, vslot, 0));
            Val {
                ty: vty,
                loc: r,
                lit: false,
                bits: 64,
            }
        };
        let key = if parts.len() == 1 {
            parts.remove(0)
        } else {
            TVal::Many(parts)
        };
        self.scopes.push(vec![var.to_string()]);
        let bound = self.bind_tuple(var, TVal::Many(vec![key, TVal::One(value)]), span);
        self.reset_tmps();
        self.loops.push(Loop {
            top,
            breaks: Vec::new(),
        });
        let r = bound.and_then(|_| self.stmts(body));
        let lp = self.loops.pop();
        for name in self.scopes.pop().unwrap_or_default() {
            self.forget(&name);
        }
        r?;
        self.emit(insn(bs_vm_op::BS_VM_JMP, 0, 0, 0).arg(top));
        self.patch(done);
        for b in lp.map(|l| l.breaks).unwrap_or_default() {
            self.patch(b);
        }
        Ok(())
    }

    /// `let $x [: type] [= value]`: declared in the innermost block.
    fn let_stmt(
        &mut self,
        name: &str,
        ty: Option<&str>,
        value: Option<&Expr>,
        span: Span,
    ) -> Res<()> {
        let declared = self.scopes.iter().flatten().any(|n| n == name);
        if declared || self.vars.contains_key(name) {
            return err(
                span,
                format!("${name} is already declared: a variable is declared once in its block and the blocks inside it"),
            );
        }
        if let Some(scope) = self.scopes.last_mut() {
            scope.push(name.to_string());
        }
        let value = match (ty, value) {
            (None, None) => return Ok(()),
            (None, Some(v)) => v.clone(),
            (Some(t), v) => Expr {
                kind: ExprKind::Cast {
                    ty: t.to_string(),
                    expr: Box::new(v.cloned().unwrap_or(Expr {
                        kind: ExprKind::Int(0),
                        span,
                    })),
                },
                span,
            },
        };
        let target = Expr {
            kind: ExprKind::Var(name.to_string()),
            span,
        };
        self.assign(&target, None, &value, span)
    }

    fn stmt(&mut self, s: &Stmt) -> Res<()> {
        match s {
            Stmt::Expr(e) => self.expr_stmt(e),
            Stmt::Assign {
                target,
                op,
                value,
                span,
            } => self.assign(target, *op, value, *span),
            Stmt::Incr {
                target,
                delta,
                span,
            } => {
                let one = Expr {
                    kind: ExprKind::Int(delta.unsigned_abs()),
                    span: *span,
                };
                let op = if *delta < 0 { BinOp::Sub } else { BinOp::Add };
                self.assign(target, Some(op), &one, *span)
            }
            Stmt::If {
                cond,
                then,
                els,
                span,
            } => {
                let v = self.expr(cond)?;
                let r = self.truth(v, *span)?;
                let j = self.emit(insn(bs_vm_op::BS_VM_JZ, 0, r, 0));
                self.reset_tmps();
                self.stmts(then)?;
                if els.is_empty() {
                    self.patch(j);
                } else {
                    let over = self.emit(insn(bs_vm_op::BS_VM_JMP, 0, 0, 0));
                    self.patch(j);
                    self.stmts(els)?;
                    self.patch(over);
                }
                Ok(())
            }
            Stmt::Unroll { count, body, span } => {
                if *count == 0 || *count > UNROLL_MAX {
                    return err(*span, format!("unroll count must be 1 to {UNROLL_MAX}"));
                }
                for _ in 0..*count {
                    self.stmts(body)?;
                }
                Ok(())
            }
            Stmt::While { cond, body, span } => {
                let top = self.code.len() as u32;
                let v = self.expr(cond)?;
                let r = self.truth(v, *span)?;
                let j = self.emit(insn(bs_vm_op::BS_VM_JZ, 0, r, 0));
                self.reset_tmps();
                self.loops.push(Loop {
                    top,
                    breaks: Vec::new(),
                });
                let body = self.stmts(body);
                let lp = self.loops.pop();
                body?;
                self.emit(insn(bs_vm_op::BS_VM_JMP, 0, 0, 0).arg(top));
                self.patch(j);
                for b in lp.map(|l| l.breaks).unwrap_or_default() {
                    self.patch(b);
                }
                Ok(())
            }
            Stmt::Break(span) | Stmt::Continue(span) => {
                let brk = matches!(s, Stmt::Break(_));
                let Some(top) = self.loops.last().map(|l| l.top) else {
                    return err(
                        *span,
                        format!(
                            "'{}' is only allowed in a loop",
                            if brk { "break" } else { "continue" }
                        ),
                    );
                };
                if brk {
                    let j = self.emit(insn(bs_vm_op::BS_VM_JMP, 0, 0, 0));
                    if let Some(l) = self.loops.last_mut() {
                        l.breaks.push(j);
                    }
                } else {
                    self.emit(insn(bs_vm_op::BS_VM_JMP, 0, 0, 0).arg(top));
                }
                Ok(())
            }
            Stmt::Block { body, .. } => self.stmts(body),
            Stmt::For {
                var,
                map,
                body,
                span,
            } => self.for_each(var, map, body, *span),
            Stmt::Let {
                name,
                ty,
                value,
                span,
            } => self.let_stmt(name, ty.as_deref(), value.as_ref(), *span),
            Stmt::Return(_) => {
                let j = self.emit(insn(bs_vm_op::BS_VM_JMP, 0, 0, 0));
                self.exits.push(j);
                Ok(())
            }
        }
    }

    /// An integer condition's register (0 is false).
    fn truth(&mut self, v: Val, span: Span) -> Res<u8> {
        if v.ty.is_num() {
            return Ok(v.loc);
        }
        err(
            span,
            format!("a condition must be an integer, not {}", describe_ty(v.ty)),
        )
    }

    fn assign(&mut self, target: &Expr, op: Option<BinOp>, value: &Expr, span: Span) -> Res<()> {
        // `@x = count()` and friends aggregate.
        if let (ExprKind::Map { name, keys }, ExprKind::Call { name: f, args }, None) =
            (&target.kind, &value.kind, op)
        {
            if let Some(agg) = self.agg_fn(f, args, value.span)? {
                return self.aggregate(name, keys, agg, args, target.span);
            }
        }
        if op.is_none() {
            if let Some(t) = self.tuple_of(value)? {
                return match &target.kind {
                    ExprKind::Var(name) => self.bind_tuple(name, t, span),
                    ExprKind::Map { name, .. } => err(
                        value.span,
                        format!("tuples as map values are not supported by bpfscope run: keep each member in a map of its own ({}_0, {}_1, ...)", name_or_at(name), name_or_at(name)),
                    ),
                    _ => err(target.span, "only $variables and @maps can be assigned"),
                };
            }
        }
        let v = match op {
            None => self.expr(value)?,
            Some(op) => {
                let cur = self.expr(target)?;
                let rhs = self.expr(value)?;
                self.binary_vals(op, cur, rhs, span)?
            }
        };
        match &target.kind {
            ExprKind::Var(name) => self.set_var(name, v, span),
            ExprKind::Map { name, keys } => {
                let keyvals = self.keys(keys)?;
                let kinds: Vec<Ty> = keyvals.iter().map(|k| k.ty.plain()).collect();
                let ty = match v.ty {
                    Ty::Int { .. } | Ty::Ptr { .. } | Ty::IntPtr { .. } | Ty::User | Ty::KSym => {
                        v.ty.plain()
                    }
                    Ty::Str | Ty::Inet | Ty::Buf | Ty::USym => v.ty,
                    Ty::Stack { .. } => {
                        return err(value.span, "a stack can be a map key, not a map value")
                    }
                };
                let id = self
                    .sh
                    .declare(&name_or_at(name), MapKind::Plain(ty), &kinds, span)?;
                self.build_key(id, &keyvals);
                let op = if ty.in_slot() {
                    bs_vm_op::BS_VM_MSETSTR
                } else {
                    bs_vm_op::BS_VM_MSET
                };
                self.emit(insn(op, 0, v.loc, 0));
                Ok(())
            }
            _ => err(target.span, "only $variables and @maps can be assigned"),
        }
    }

    fn set_var(&mut self, name: &str, v: Val, span: Span) -> Res<()> {
        let var = match self.vars.get(name) {
            Some(old) if same_ty(old.ty, v.ty) => *old,
            Some(old) => {
                return err(
                    span,
                    format!(
                        "${name} holds {}; it cannot be assigned {}",
                        describe_ty(old.ty),
                        describe_ty(v.ty)
                    ),
                )
            }
            None => {
                let loc = if v.ty.in_slot() {
                    if self.next_var_str + 1 >= self.tmp_str {
                        return err(span, "too many string variables");
                    }
                    self.next_var_str += 1;
                    self.next_var_str - 1
                } else {
                    if self.next_var_reg + 2 >= self.tmp_reg {
                        return err(span, "too many variables");
                    }
                    self.next_var_reg += 1;
                    self.next_var_reg - 1
                };
                let var = Val {
                    ty: v.ty,
                    loc,
                    lit: false,
                    bits: v.bits,
                };
                self.vars.insert(name.to_string(), var);
                var
            }
        };
        let op = if v.ty.in_slot() {
            bs_vm_op::BS_VM_SMOV
        } else {
            bs_vm_op::BS_VM_MOV
        };
        if var.loc != v.loc && !self.retarget(v, var.loc) {
            self.emit(insn(op, var.loc, v.loc, 0));
        }
        if let (Ty::Int { signed: a }, Ty::Int { signed: b }) = (var.ty, v.ty) {
            if b && !a && !v.lit {
                if let Some(x) = self.vars.get_mut(name) {
                    x.ty = Ty::Int { signed: true };
                }
            }
        }
        Ok(())
    }

    /// The aggregation a call makes, if it is one.
    fn agg_fn(&mut self, f: &str, args: &[Expr], span: Span) -> Res<Option<AggFn>> {
        let want = |n: usize| -> Res<()> {
            if args.len() != n {
                return err(
                    span,
                    format!("{f}() takes {n} argument{}", if n == 1 { "" } else { "s" }),
                );
            }
            Ok(())
        };
        Ok(Some(match f {
            "count" => {
                want(0)?;
                AggFn::Count
            }
            "sum" | "avg" | "min" | "max" | "stats" | "hist" => {
                want(1)?;
                match f {
                    "sum" => AggFn::Sum,
                    "avg" => AggFn::Avg,
                    "min" => AggFn::Min,
                    "max" => AggFn::Max,
                    "stats" => AggFn::Stats,
                    _ => AggFn::Hist,
                }
            }
            "lhist" => {
                want(4)?;
                let c = |e: &Expr, what: &str| -> Res<i64> {
                    self.const_int(e, 0).map_or_else(
                        || err(e.span, format!("lhist()'s {what} must be a constant")),
                        Ok,
                    )
                };
                let (min, max, step) = (
                    c(&args[1], "min")?,
                    c(&args[2], "max")?,
                    c(&args[3], "step")?,
                );
                if step <= 0 || max <= min {
                    return err(span, "lhist() needs min < max and a step above 0");
                }
                if (max - min) / step > 1000 {
                    return err(span, "lhist() would have more than 1000 buckets");
                }
                AggFn::Lhist { min, max, step }
            }
            _ => return Ok(None),
        }))
    }

    fn aggregate(
        &mut self,
        name: &str,
        keys: &[Expr],
        agg: AggFn,
        args: &[Expr],
        span: Span,
    ) -> Res<()> {
        let keyvals = self.keys(keys)?;
        let (vreg, signed) = match args.first() {
            Some(a) => {
                let v = self.expr(a)?;
                match v.ty {
                    Ty::Int { signed } => (v.loc, signed || v.lit),
                    Ty::Ptr { .. } => (v.loc, false),
                    t => {
                        return err(
                            a.span,
                            format!("aggregating {} is not possible", describe_ty(t)),
                        )
                    }
                }
            }
            // count(): AGG takes no value (BS_VMF_COUNT).
            None => (0, false),
        };
        let kinds: Vec<Ty> = keyvals.iter().map(|k| k.ty.plain()).collect();
        let id = self
            .sh
            .declare(&name_or_at(name), MapKind::Agg(agg, signed), &kinds, span)?;
        let bucket = if matches!(agg, AggFn::Hist | AggFn::Lhist { .. }) {
            self.reg(span)?
        } else {
            0
        };
        let sflag = if signed {
            bs_vm_flags::BS_VMF_SIGNED.0 as u8
        } else {
            0
        };
        match agg {
            AggFn::Hist => {
                self.emit(
                    insn(bs_vm_op::BS_VM_BUCKET, bucket, vreg, 0)
                        .flags(bs_vm_flags::BS_VMF_LOG2.0 as u8 | sflag),
                );
            }
            AggFn::Lhist { min, max, step } => {
                let n = ((max - min) / step) as u32;
                let mut i = insn(bs_vm_op::BS_VM_BUCKET, bucket, vreg, 0).imm(min);
                i.arg = step as u32;
                i.arg2 = n;
                self.emit(i);
            }
            // Bucket 0, without a register.
            _ => {}
        }
        self.build_key(id, &keyvals);
        let mut flags = sflag;
        match agg {
            AggFn::Min | AggFn::Max | AggFn::Stats => flags |= bs_vm_flags::BS_VMF_MINMAX.0 as u8,
            AggFn::Hist | AggFn::Lhist { .. } => flags |= bs_vm_flags::BS_VMF_BUCKET.0 as u8,
            AggFn::Count => flags |= bs_vm_flags::BS_VMF_COUNT.0 as u8,
            AggFn::Sum | AggFn::Avg => {}
        }
        self.emit(insn(bs_vm_op::BS_VM_AGG, 0, vreg, bucket).flags(flags));
        Ok(())
    }

    /// Key parts evaluated (before the key buffer is touched: a part may
    /// itself read a map).
    /// A map's key parts; a tuple's members are parts of their own
    /// (`@m[(a, b)]` is `@m[a, b]`).
    fn keys(&mut self, keys: &[Expr]) -> Res<Vec<Val>> {
        let mut out = Vec::with_capacity(keys.len());
        for k in keys {
            match self.tuple_of(k)? {
                Some(t) => t.flatten(&mut out),
                None => out.push(self.expr(k)?),
            }
        }
        Ok(out)
    }

    /// The key of map `id` (the zeros past it are set by `finish_keys`,
    /// once every map's key length is known).
    fn build_key(&mut self, id: u32, vals: &[Val]) {
        // The most common key, one integer (`@start[tid]`), in one step.
        if let [v] = vals {
            if !v.ty.in_slot() {
                self.emit(insn(bs_vm_op::BS_VM_KEY1, 0, v.loc, 0).arg(id));
                return;
            }
        }
        self.emit(insn(bs_vm_op::BS_VM_KEYCLR, 0, 0, 0).arg(id));
        let mut off = KEY_ID_LEN;
        for v in vals {
            if v.ty.in_slot() {
                self.emit(insn(bs_vm_op::BS_VM_KEYSTR, 0, v.loc, 0).arg(off as u32));
                off += STR_MAX;
            } else {
                self.emit(insn(bs_vm_op::BS_VM_KEYNUM, 0, v.loc, 0).arg(off as u32));
                off += 8;
            }
        }
    }

    /// Statements made of one expression: mostly calls with effects.
    fn expr_stmt(&mut self, e: &Expr) -> Res<()> {
        let ExprKind::Call { name, args } = &e.kind else {
            self.expr(e)?;
            return Ok(());
        };
        match name.as_str() {
            "printf" => self.printf(args, e.span),
            "time" => {
                let fmt = match args.first() {
                    None => None,
                    Some(Expr {
                        kind: ExprKind::Str(s),
                        ..
                    }) => Some(s.clone()),
                    Some(a) => return err(a.span, "time()'s format must be a string literal"),
                };
                let act = self.sh.action(Action::Time { fmt });
                self.emit_record(act, 0);
                Ok(())
            }
            "join" => {
                let (Some(arr), true) = (args.first(), args.len() <= 2) else {
                    return err(
                        e.span,
                        "join() takes an array pointer and an optional separator",
                    );
                };
                let sep = match args.get(1) {
                    None => " ".to_string(),
                    Some(Expr {
                        kind: ExprKind::Str(s),
                        ..
                    }) => s.clone(),
                    Some(a) => return err(a.span, "join()'s separator must be a string literal"),
                };
                let v = self.expr(arr)?;
                if !v.ty.is_num() {
                    return err(
                        arr.span,
                        "join() takes a pointer to an array of strings (such as args->argv)",
                    );
                }
                self.emit(insn(bs_vm_op::BS_VM_JOIN, 0, v.loc, 0));
                let act = self.sh.action(Action::Join { sep });
                self.emit_record(act, (JOIN_MAX * STR_MAX) as u32);
                Ok(())
            }
            "print" => self.print(args, e.span),
            "clear" | "zero" => {
                let id = self.map_arg(args, name, e.span)?;
                let a = if name == "clear" {
                    Action::Clear { map: id }
                } else {
                    Action::Zero { map: id }
                };
                let act = self.sh.action(a);
                self.emit_record(act, 0);
                Ok(())
            }
            "delete" => {
                let Some(Expr {
                    kind: ExprKind::Map { name: m, keys },
                    span,
                }) = args.first()
                else {
                    return err(
                        e.span,
                        "delete() takes a map element, e.g. delete(@start[tid])",
                    );
                };
                let m = name_or_at(m);
                let Some(id) = self.sh.map_id(&m) else {
                    if !self.sh.defined.contains(&m) {
                        return self.sh.undefined(&m, *span);
                    }
                    // Written only in skipped blocks: nothing to delete.
                    return Ok(());
                };
                let keyvals = self.keys(keys)?;
                let def = &self.sh.maps[id as usize];
                if def.keys.len() != keyvals.len() {
                    return err(*span, format!("{m} has {} key parts", def.keys.len()));
                }
                let agg = matches!(def.kind, MapKind::Agg(..));
                self.build_key(id, &keyvals);
                let f = if agg {
                    bs_vm_flags::BS_VMF_AGG.0 as u8
                } else {
                    0
                };
                self.emit(insn(bs_vm_op::BS_VM_MDEL, 0, 0, 0).flags(f));
                Ok(())
            }
            "exit" => {
                let act = self.sh.action(Action::Exit);
                self.emit_record(act, 0);
                let j = self.emit(insn(bs_vm_op::BS_VM_JMP, 0, 0, 0));
                self.exits.push(j);
                Ok(())
            }
            "system" | "cat" | "override" | "printbuf" | "cgroup_path" => {
                err(e.span, format!("{name}() is not supported by bpfscope run"))
            }
            _ => {
                self.expr(e)?;
                Ok(())
            }
        }
    }

    fn map_arg(&mut self, args: &[Expr], f: &str, span: Span) -> Res<u32> {
        match args.first() {
            Some(Expr {
                kind: ExprKind::Map { name, keys },
                span: s,
            }) if keys.is_empty() => {
                let n = name_or_at(name);
                match self.sh.map_id(&n) {
                    Some(id) => Ok(id),
                    None if !self.sh.defined.contains(&n) => self.sh.undefined(&n, *s),
                    // Assigned only in blocks whose attach points were all
                    // skipped: an integer map that stays empty.
                    None => self
                        .sh
                        .declare(&n, MapKind::Plain(Ty::Int { signed: true }), &[], *s),
                }
            }
            _ => err(span, format!("{f}() takes a map, e.g. {f}(@name)")),
        }
    }

    fn print(&mut self, args: &[Expr], span: Span) -> Res<()> {
        let Some(first) = args.first() else {
            return err(span, "print() takes a map or a value");
        };
        if let ExprKind::Map { keys, .. } = &first.kind {
            if keys.is_empty() {
                let id = self.map_arg(args, "print", span)?;
                let c = |e: Option<&Expr>, d: u64| -> Res<u64> {
                    match e {
                        None => Ok(d),
                        Some(e) => match self.const_int(e, 0) {
                            Some(v) if v >= 0 => Ok(v as u64),
                            _ => err(e.span, "print()'s top and div must be constants"),
                        },
                    }
                };
                let top = c(args.get(1), 0)?;
                let div = c(args.get(2), 1)?.max(1);
                let act = self.sh.action(Action::Print { map: id, top, div });
                self.emit_record(act, 0);
                return Ok(());
            }
        }
        if let Some(t) = self.tuple_of(first)? {
            return self.print_tuple(&t, span);
        }
        let v = self.expr(first)?;
        let arg = Arg {
            ty: v.ty.plain(),
            off: 0,
        };
        self.put_arg(v, 0);
        let act = self.sh.action(Action::PrintValue { arg });
        self.emit_record(act, arg_len(v.ty) as u32);
        Ok(())
    }

    /// print((a, b)): as bpftrace, `(1, abc)` and nested tuples in
    /// parentheses, through printf's formatting of each member.
    fn print_tuple(&mut self, t: &TVal, span: Span) -> Res<()> {
        fn layout(t: &TVal, fmt: &mut String, vals: &mut Vec<Val>) {
            match t {
                TVal::One(v) => {
                    fmt.push_str(match v.ty {
                        Ty::Int { signed: true } => "%ld",
                        Ty::Int { signed: false } => "%lu",
                        Ty::Ptr { .. } | Ty::IntPtr { .. } => "0x%lx",
                        Ty::Buf => "%r",
                        _ => "%s",
                    });
                    vals.push(*v);
                }
                TVal::Many(m) => {
                    fmt.push('(');
                    for (i, x) in m.iter().enumerate() {
                        if i > 0 {
                            fmt.push_str(", ");
                        }
                        layout(x, fmt, vals);
                    }
                    fmt.push(')');
                }
            }
        }
        let (mut fmt, mut vals) = (String::new(), Vec::new());
        layout(t, &mut fmt, &mut vals);
        fmt.push('\n');
        self.printf_vals(&fmt, &vals, span)
    }

    fn printf(&mut self, args: &[Expr], span: Span) -> Res<()> {
        let Some(Expr {
            kind: ExprKind::Str(fmt),
            ..
        }) = args.first()
        else {
            return err(span, "printf()'s first argument must be a string literal");
        };
        let mut vals = Vec::new();
        for a in &args[1..] {
            vals.push(self.expr(a)?);
        }
        self.printf_vals(fmt, &vals, span)
    }

    fn printf_vals(&mut self, fmt: &str, vals: &[Val], span: Span) -> Res<()> {
        let kinds: Vec<crate::render::bpftrace::ArgKind> =
            vals.iter().map(|v| arg_kind(v.ty)).collect();
        if let Err(e) = crate::render::bpftrace::check_format(fmt, &kinds) {
            return err(span, format!("printf: {e}"));
        }
        let mut off = 0;
        let mut out = Vec::new();
        for v in vals {
            self.put_arg(*v, off);
            out.push(Arg {
                ty: v.ty.plain(),
                off,
            });
            off += arg_len(v.ty);
        }
        if off > EVENT_MAX {
            return err(span, format!("printf's arguments take {off} bytes; at most {EVENT_MAX} fit (a string takes {STR_MAX})"));
        }
        let act = self.sh.action(Action::Printf {
            fmt: fmt.to_string(),
            args: out,
        });
        self.emit_record(act, off as u32);
        Ok(())
    }

    fn put_arg(&mut self, v: Val, off: usize) {
        let op = if v.ty.in_slot() {
            bs_vm_op::BS_VM_EVSTR
        } else {
            bs_vm_op::BS_VM_EVNUM
        };
        self.emit(insn(op, 0, v.loc, 0).arg(off as u32));
    }

    fn emit_record(&mut self, action: u32, size: u32) {
        let mut i = insn(bs_vm_op::BS_VM_EMIT, 0, 0, 0).arg(action);
        i.arg2 = size;
        self.emit(i);
    }

    /// Whether a jump lands on the last instruction or just after it.
    fn last_is_jumped_to(&self) -> bool {
        let end = self.code.len() as u32;
        let jumps = [
            bs_vm_op::BS_VM_JMP.0 as u8,
            bs_vm_op::BS_VM_JZ.0 as u8,
            bs_vm_op::BS_VM_JNZ.0 as u8,
        ];
        self.code
            .iter()
            .any(|i| jumps.contains(&i.op) && i.arg + 1 >= end)
    }

    /// When the last instruction is `op` writing `dst` (a literal just
    /// loaded), removes it and gives it back, so its use can take the
    /// constant in place (an ALU immediate, a string compared in place):
    /// one step fewer per use at run time.
    fn take_last(&mut self, op: bs_vm_op, dst: u8) -> Option<bs_insn> {
        let last = self.code.last()?;
        if last.op != op.0 as u8 || last.dst != dst {
            return None;
        }
        // Not a jump target: a jump to the end of the code would then skip it.
        if self.last_is_jumped_to() {
            return None;
        }
        self.code.pop()
    }

    /// When `v` is an integer temporary the last instruction just wrote,
    /// makes that instruction write `to` instead (a variable's register):
    /// the move is saved. Only for operations whose one effect is on dst.
    fn retarget(&mut self, v: Val, to: u8) -> bool {
        let pure = [
            bs_vm_op::BS_VM_LDI,
            bs_vm_op::BS_VM_SRC,
            bs_vm_op::BS_VM_MOV,
            bs_vm_op::BS_VM_ALU,
            bs_vm_op::BS_VM_BUCKET,
            bs_vm_op::BS_VM_MGET,
            bs_vm_op::BS_VM_READ,
            bs_vm_op::BS_VM_STREQ,
            bs_vm_op::BS_VM_STREQC,
        ];
        if v.ty.in_slot() || v.loc < self.tmp_reg {
            return false;
        }
        let Some(last) = self.code.last() else {
            return false;
        };
        if last.dst != v.loc || !pure.iter().any(|o| o.0 as u8 == last.op) {
            return false;
        }
        // Not when a jump lands after it: another path reaches the move.
        if self.last_is_jumped_to() {
            return false;
        }
        if let Some(l) = self.code.last_mut() {
            l.dst = to;
        }
        true
    }

    fn int(&mut self, v: i64, span: Span) -> Res<Val> {
        let r = self.reg(span)?;
        self.emit(insn(bs_vm_op::BS_VM_LDI, r, 0, 0).imm(v));
        Ok(Val {
            ty: Ty::Int { signed: true },
            loc: r,
            lit: true,
            bits: 64,
        })
    }

    fn cstr(&mut self, s: &str, span: Span) -> Res<Val> {
        if crate::filter::raw::len(s) >= STR_MAX {
            return err(span, format!("strings are at most {} bytes", STR_MAX - 1));
        }
        let idx = self.sh.strs.intern(s);
        let slot = self.slot(span)?;
        self.emit(insn(bs_vm_op::BS_VM_CSTR, slot, 0, 0).arg(idx));
        Ok(Val {
            ty: Ty::Str,
            loc: slot,
            lit: false,
            bits: 64,
        })
    }

    fn read_src(&mut self, src: bs_src, ty: Ty, span: Span) -> Res<Val> {
        let idx = self.sh.src(src);
        if ty == Ty::Str {
            let slot = self.slot(span)?;
            self.emit(insn(bs_vm_op::BS_VM_SRCSTR, slot, 0, 0).arg(idx));
            return Ok(Val {
                ty,
                loc: slot,
                lit: false,
                bits: 64,
            });
        }
        let r = self.reg(span)?;
        self.emit(insn(bs_vm_op::BS_VM_SRC, r, 0, 0).arg(idx));
        Ok(Val {
            ty,
            loc: r,
            lit: false,
            bits: 64,
        })
    }

    fn expr(&mut self, e: &Expr) -> Res<Val> {
        match &e.kind {
            ExprKind::Int(v) => self.int(*v as i64, e.span),
            ExprKind::Str(s) => self.cstr(s, e.span),
            ExprKind::Ident(name) => self.ident(name, e.span),
            ExprKind::Var(name) => match self.vars.get(name) {
                Some(v) => Ok(*v),
                None if self.tuples.contains_key(name) => err(
                    e.span,
                    format!("${name} is a tuple: print it, or take a member (${name}.0)"),
                ),
                None => err(e.span, format!("${name} is used before it is assigned")),
            },
            ExprKind::Tuple(_) => err(
                e.span,
                "a tuple is not a value here: print it, assign it to a $variable, or use it as a map key",
            ),
            ExprKind::Positional(0) => err(e.span, "positional parameters start at $1"),
            ExprKind::Positional(n) => {
                let p = self.sh.params.get(*n as usize - 1).cloned();
                match p {
                    Some(p) => match parse_int(&p) {
                        Some(v) => self.int(v, e.span),
                        None => self.cstr(&p, e.span),
                    },
                    // bpftrace reads a missing parameter as 0.
                    None => self.int(0, e.span),
                }
            }
            ExprKind::PositionalCount => {
                let n = self.sh.params.len() as i64;
                self.int(n, e.span)
            }
            ExprKind::Map { name, keys } => self.map_read(name, keys, e.span),
            ExprKind::Field { .. } => self.field(e),
            ExprKind::Index { base, index } => self.index(base, index, e.span),
            ExprKind::TypeName(t) => err(
                e.span,
                format!("the type '{t}' is not a value (sizeof({t}) is)"),
            ),
            ExprKind::Unary { op, expr } => {
                let v = self.expr(expr)?;
                let Ty::Int { signed } = v.ty.plain() else {
                    return err(
                        e.span,
                        format!("{op:?} of {} is not possible", describe_ty(v.ty)),
                    );
                };
                let (alu, ty) = match op {
                    UnOp::Neg => (bs_vm_alu::BS_ALU_NEG, Ty::Int { signed: true }),
                    UnOp::Not => (bs_vm_alu::BS_ALU_NOT, Ty::Int { signed: false }),
                    UnOp::BitNot => (bs_vm_alu::BS_ALU_BNOT, Ty::Int { signed }),
                    UnOp::Deref => {
                        let (bits, signed) = match v.ty {
                            Ty::IntPtr { bits, signed } => (bits, signed),
                            _ => (64, false),
                        };
                        return self.read_at(v.loc, bits, signed, e.span);
                    }
                };
                let r = self.reg(e.span)?;
                self.emit(insn(bs_vm_op::BS_VM_ALU, r, v.loc, 0).arg(alu.0));
                Ok(Val {
                    ty,
                    loc: r,
                    lit: v.lit,
                    bits: 64,
                })
            }
            ExprKind::Binary { op, lhs, rhs } => {
                if matches!(op, BinOp::LAnd | BinOp::LOr) {
                    return self.logical(*op, lhs, rhs, e.span);
                }
                let a = self.expr(lhs)?;
                let b = self.expr(rhs)?;
                self.binary_vals(*op, a, b, e.span)
            }
            ExprKind::Ternary { cond, then, els } => {
                let c = self.expr(cond)?;
                let r = self.truth(c, cond.span)?;
                let j = self.emit(insn(bs_vm_op::BS_VM_JZ, 0, r, 0));
                let t = self.expr(then)?;
                // A result of its own: a branch may be a variable, which must not be written.
                let (op, res) = if t.ty.in_slot() {
                    (bs_vm_op::BS_VM_SMOV, self.slot(e.span)?)
                } else {
                    (bs_vm_op::BS_VM_MOV, self.reg(e.span)?)
                };
                self.emit(insn(op, res, t.loc, 0));
                let over = self.emit(insn(bs_vm_op::BS_VM_JMP, 0, 0, 0));
                self.patch(j);
                let f = self.expr(els)?;
                if !same_ty(t.ty, f.ty) {
                    return err(
                        e.span,
                        format!(
                            "the branches give {} and {}",
                            describe_ty(t.ty),
                            describe_ty(f.ty)
                        ),
                    );
                }
                self.emit(insn(op, res, f.loc, 0));
                self.patch(over);
                let ty = match (t.ty, f.ty) {
                    (Ty::Ptr { .. }, _) | (_, Ty::Ptr { .. }) if t.ty == f.ty => t.ty,
                    (a, b) if a.is_num() && b.is_num() => Ty::Int {
                        signed: a.plain() == Ty::Int { signed: true }
                            || b.plain() == Ty::Int { signed: true },
                    },
                    _ => t.ty,
                };
                Ok(Val {
                    ty,
                    loc: res,
                    lit: t.lit && f.lit,
                    bits: 64,
                })
            }
            ExprKind::Call { name, args } => self.call(name, args, e.span),
            ExprKind::Cast { ty, expr } => {
                let v = self.expr(expr)?;
                if !v.ty.is_num() {
                    return err(
                        e.span,
                        format!("casting {} is not possible", describe_ty(v.ty)),
                    );
                }
                if let Some(name) = struct_ptr_name(ty) {
                    let id = btf_struct(name).ok_or_else(|| LowerError {
                        span: e.span,
                        msg: format!("the kernel's BTF has no struct {name}"),
                    })?;
                    return Ok(Val {
                        ty: Ty::Ptr { btf: id },
                        loc: v.loc,
                        lit: false,
                        bits: 64,
                    });
                }
                let t = ty.trim();
                if let Some(pointee) = t.strip_suffix('*') {
                    // A pointer to integers: `*p` and `p[i]` read them.
                    let (bits, signed) = match pointee.trim() {
                        "void" | "const void" => (8, false),
                        p => int_type(p.trim_start_matches("const ").trim()).ok_or_else(|| {
                            LowerError {
                                span: e.span,
                                msg: format!("a cast to {t}: bpfscope run takes pointers to integers and to structs (struct NAME *)"),
                            }
                        })?,
                    };
                    return Ok(Val {
                        ty: Ty::IntPtr {
                            bits: bits as u8,
                            signed,
                        },
                        loc: v.loc,
                        lit: false,
                        bits: 64,
                    });
                }
                let Some((bits, signed)) = int_type(t) else {
                    return err(e.span, format!("unknown type '{t}' in a cast"));
                };
                let r = self.reg(e.span)?;
                self.emit(insn(bs_vm_op::BS_VM_MOV, r, v.loc, 0));
                if bits < 64 {
                    let sh = i64::from(64 - bits);
                    self.emit(
                        insn(bs_vm_op::BS_VM_ALU, r, r, 0)
                            .arg(bs_vm_alu::BS_ALU_SHL.0)
                            .imm(sh)
                            .flags(bs_vm_flags::BS_VMF_IMM.0 as u8),
                    );
                    let f = bs_vm_flags::BS_VMF_IMM.0 as u8
                        | if signed {
                            bs_vm_flags::BS_VMF_SIGNED.0 as u8
                        } else {
                            0
                        };
                    self.emit(
                        insn(bs_vm_op::BS_VM_ALU, r, r, 0)
                            .arg(bs_vm_alu::BS_ALU_SHR.0)
                            .imm(sh)
                            .flags(f),
                    );
                }
                Ok(Val {
                    ty: Ty::Int { signed },
                    loc: r,
                    lit: false,
                    bits: bits as u8,
                })
            }
        }
    }

    /// An integer of `bits` read at the address in register `at`.
    fn read_at(&mut self, at: u8, bits: u8, signed: bool, span: Span) -> Res<Val> {
        let r = self.reg(span)?;
        let f = if signed {
            bs_vm_flags::BS_VMF_SIGNED.0 as u8
        } else {
            0
        };
        self.emit(
            insn(bs_vm_op::BS_VM_READ, r, at, 0)
                .arg(u32::from(bits / 8).max(1))
                .flags(f),
        );
        Ok(Val {
            ty: Ty::Int { signed },
            loc: r,
            lit: false,
            bits,
        })
    }

    /// `base[i]`: an element of what a pointer points to (a cast's integers,
    /// a struct pointer's structs, a record field's `T *`), read at
    /// base + i * its size.
    fn index(&mut self, base: &Expr, index: &Expr, span: Span) -> Res<Val> {
        // What the base points to, from the record field's C type when it is one.
        let field_elem = base.args_path().and_then(|p| {
            let f = self.pc.probe.field(&p)?;
            let t = f.ctype.trim().strip_suffix('*')?.trim().to_string();
            Some(t)
        });
        // A struct member that is an array: indexed in place.
        if let ExprKind::Field { .. } = &base.kind {
            if base.args_path().is_none() {
                let (mark, tr, ts) = (self.code.len(), self.tmp_reg, self.tmp_str);
                let (root, parts) = base.member_chain();
                let v = self.expr(root)?;
                if let Ty::Ptr { btf } = v.ty {
                    let (r, w) = self.member_addr(v, btf, &parts, base.span)?;
                    let elem = match w.shape {
                        crate::probe::btf::Shape::Array { elem, signed, .. } => {
                            Some((elem, signed))
                        }
                        crate::probe::btf::Shape::CharArray(_) => Some((1, true)),
                        _ => None,
                    };
                    if let Some((elem, signed)) = elem {
                        let i = self.expr(index)?;
                        let Ty::Int { .. } = i.ty.plain() else {
                            return err(index.span, "an index must be an integer");
                        };
                        let a = self.reg(span)?;
                        self.emit(
                            insn(bs_vm_op::BS_VM_ALU, a, i.loc, 0)
                                .arg(bs_vm_alu::BS_ALU_MUL.0)
                                .imm(i64::from(elem))
                                .flags(bs_vm_flags::BS_VMF_IMM.0 as u8),
                        );
                        self.emit(insn(bs_vm_op::BS_VM_ALU, a, a, r).arg(bs_vm_alu::BS_ALU_ADD.0));
                        return self.read_at(a, elem * 8, signed, span);
                    }
                }
                // Not an array: lowered again below as a value.
                self.code.truncate(mark);
                self.tmp_reg = tr;
                self.tmp_str = ts;
            }
        }
        let b = self.expr(base)?;
        let i = self.expr(index)?;
        let Ty::Int { .. } = i.ty.plain() else {
            return err(index.span, "an index must be an integer");
        };
        enum Elem {
            Int(u8, bool),
            Struct(u32, u64),
            Ptr,
        }
        let elem = match (b.ty, field_elem) {
            (Ty::IntPtr { bits, signed }, _) => Elem::Int(bits, signed),
            (Ty::Ptr { btf }, _) => {
                let size = crate::probe::btf::vmlinux()
                    .and_then(|k| k.struct_size(btf))
                    .ok_or_else(|| LowerError {
                        span,
                        msg: "the struct's size is not in BTF".into(),
                    })?;
                Elem::Struct(btf, size)
            }
            (_, Some(t)) if t.contains('*') => Elem::Ptr,
            (_, Some(t)) => {
                let t = t.trim_start_matches("const ").trim();
                match int_type(t) {
                    Some((bits, signed)) => Elem::Int(bits as u8, signed),
                    None => match struct_ptr_name(&format!("{t} *")).and_then(btf_struct) {
                        Some(id) => Elem::Struct(
                            id,
                            crate::probe::btf::vmlinux()
                                .and_then(|k| k.struct_size(id))
                                .unwrap_or(0),
                        ),
                        None => return err(span, format!("indexing a pointer to {t} is not supported by bpfscope run (integers, pointers and structs are)")),
                    },
                }
            }
            _ => {
                return err(
                    span,
                    format!(
                        "indexing {} is not supported: bpfscope run indexes typed pointers ((uint32 *)p, struct pointers, a record field's T *)",
                        describe_ty(b.ty)
                    ),
                )
            }
        };
        let size = match elem {
            Elem::Int(bits, _) => u64::from(bits / 8).max(1),
            Elem::Struct(_, size) => size,
            Elem::Ptr => 8,
        };
        let a = self.reg(span)?;
        let imm = bs_vm_flags::BS_VMF_IMM.0 as u8;
        self.emit(
            insn(bs_vm_op::BS_VM_ALU, a, i.loc, 0)
                .arg(bs_vm_alu::BS_ALU_MUL.0)
                .imm(size as i64)
                .flags(imm),
        );
        self.emit(insn(bs_vm_op::BS_VM_ALU, a, a, b.loc).arg(bs_vm_alu::BS_ALU_ADD.0));
        match elem {
            Elem::Int(bits, signed) => self.read_at(a, bits, signed, span),
            Elem::Ptr => self.read_at(a, 64, false, span),
            Elem::Struct(btf, _) => Ok(Val {
                ty: Ty::Ptr { btf },
                loc: a,
                lit: false,
                bits: 64,
            }),
        }
    }

    fn logical(&mut self, op: BinOp, lhs: &Expr, rhs: &Expr, span: Span) -> Res<Val> {
        let r = self.reg(span)?;
        let a = self.expr(lhs)?;
        let ar = self.truth(a, lhs.span)?;
        self.emit(insn(bs_vm_op::BS_VM_ALU, r, ar, 0).arg(bs_vm_alu::BS_ALU_BOOL.0));
        let jop = if op == BinOp::LAnd {
            bs_vm_op::BS_VM_JZ
        } else {
            bs_vm_op::BS_VM_JNZ
        };
        let j = self.emit(insn(jop, 0, r, 0));
        let b = self.expr(rhs)?;
        let br = self.truth(b, rhs.span)?;
        self.emit(insn(bs_vm_op::BS_VM_ALU, r, br, 0).arg(bs_vm_alu::BS_ALU_BOOL.0));
        self.patch(j);
        Ok(Val {
            ty: Ty::Int { signed: false },
            loc: r,
            lit: false,
            bits: 64,
        })
    }

    fn binary_vals(&mut self, op: BinOp, a: Val, b: Val, span: Span) -> Res<Val> {
        if a.ty == Ty::Str || b.ty == Ty::Str {
            if a.ty != b.ty || !matches!(op, BinOp::Eq | BinOp::Ne) {
                return cannot(op, a.ty, b.ty, span);
            }
            let r = self.reg(span)?;
            // A string literal is compared in place.
            match self.take_last(bs_vm_op::BS_VM_CSTR, b.loc) {
                Some(c) => self.emit(insn(bs_vm_op::BS_VM_STREQC, r, a.loc, 0).arg(c.arg)),
                None => self.emit(insn(bs_vm_op::BS_VM_STREQ, r, a.loc, b.loc)),
            };
            if op == BinOp::Ne {
                self.emit(insn(bs_vm_op::BS_VM_ALU, r, r, 0).arg(bs_vm_alu::BS_ALU_NOT.0));
            }
            return Ok(Val {
                ty: Ty::Int { signed: false },
                loc: r,
                lit: false,
                bits: 64,
            });
        }
        let (Ty::Int { signed: sa }, Ty::Int { signed: sb }) = (a.ty.plain(), b.ty.plain()) else {
            return cannot(op, a.ty, b.ty, span);
        };
        // A literal takes the other side's signedness.
        let signed = match (a.lit, b.lit) {
            (true, false) => sb,
            (false, true) => sa,
            _ => sa && sb,
        };
        let alu = match op {
            BinOp::Add => bs_vm_alu::BS_ALU_ADD,
            BinOp::Sub => bs_vm_alu::BS_ALU_SUB,
            BinOp::Mul => bs_vm_alu::BS_ALU_MUL,
            BinOp::Div => bs_vm_alu::BS_ALU_DIV,
            BinOp::Mod => bs_vm_alu::BS_ALU_MOD,
            BinOp::BitAnd => bs_vm_alu::BS_ALU_AND,
            BinOp::BitOr => bs_vm_alu::BS_ALU_OR,
            BinOp::BitXor => bs_vm_alu::BS_ALU_XOR,
            BinOp::Shl => bs_vm_alu::BS_ALU_SHL,
            BinOp::Shr => bs_vm_alu::BS_ALU_SHR,
            BinOp::Eq => bs_vm_alu::BS_ALU_EQ,
            BinOp::Ne => bs_vm_alu::BS_ALU_NE,
            BinOp::Lt => bs_vm_alu::BS_ALU_LT,
            BinOp::Le => bs_vm_alu::BS_ALU_LE,
            BinOp::Gt => bs_vm_alu::BS_ALU_GT,
            BinOp::Ge => bs_vm_alu::BS_ALU_GE,
            BinOp::LAnd | BinOp::LOr => return err(span, "internal: logical operator"),
        };
        let cmp = matches!(
            op,
            BinOp::Eq | BinOp::Ne | BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge
        );
        let r = self.reg(span)?;
        let f = if signed {
            bs_vm_flags::BS_VMF_SIGNED.0 as u8
        } else {
            0
        };
        // An integer literal on the right is an immediate.
        let imm = if b.lit {
            self.take_last(bs_vm_op::BS_VM_LDI, b.loc)
        } else {
            None
        };
        match imm {
            Some(l) => self.emit(
                insn(bs_vm_op::BS_VM_ALU, r, a.loc, 0)
                    .arg(alu.0)
                    .imm(l.imm)
                    .flags(f | bs_vm_flags::BS_VMF_IMM.0 as u8),
            ),
            None => self.emit(
                insn(bs_vm_op::BS_VM_ALU, r, a.loc, b.loc)
                    .arg(alu.0)
                    .flags(f),
            ),
        };
        let ty = Ty::Int {
            signed: if cmp { false } else { signed },
        };
        Ok(Val {
            ty,
            loc: r,
            lit: a.lit && b.lit,
            bits: 64,
        })
    }

    fn map_read(&mut self, name: &str, keys: &[Expr], span: Span) -> Res<Val> {
        let m = name_or_at(name);
        let keyvals = self.keys(keys)?;
        let Some(id) = self.sh.map_id(&m) else {
            if !self.sh.defined.contains(&m) {
                return self.sh.undefined(&m, span);
            }
            // Written only in skipped blocks (or later, in the first pass):
            // it reads as 0, as in bpftrace.
            return self.int(0, span);
        };
        let def = self.sh.maps[id as usize].clone();
        if def.keys.len() != keyvals.len() {
            return err(
                span,
                format!(
                    "{m} has {} key part{}",
                    def.keys.len(),
                    if def.keys.len() == 1 { "" } else { "s" }
                ),
            );
        }
        let ty = match def.kind {
            MapKind::Plain(t) => t,
            MapKind::Agg(..) => {
                return err(
                    span,
                    format!(
                    "{m} holds an aggregation; its value can only be printed, not read in a probe"
                ),
                )
            }
        };
        self.build_key(id, &keyvals);
        if ty.in_slot() {
            let slot = self.slot(span)?;
            self.emit(insn(bs_vm_op::BS_VM_MGETSTR, slot, 0, 0));
            return Ok(Val {
                ty,
                loc: slot,
                lit: false,
                bits: 64,
            });
        }
        let r = self.reg(span)?;
        self.emit(insn(bs_vm_op::BS_VM_MGET, r, 0, 0));
        Ok(Val {
            ty,
            loc: r,
            lit: false,
            bits: 64,
        })
    }

    /// `args->name`, `args.name`, and member paths from them.
    fn field(&mut self, e: &Expr) -> Res<Val> {
        if let Some(path) = self.tuple_path(e) {
            if let Some(v) = self.vars.get(&path) {
                return Ok(*v);
            }
            if self.tuples.contains_key(&path) {
                return err(
                    e.span,
                    format!("${path} is a tuple: print it, or take a member (${path}.0)"),
                );
            }
            if let Some(owner) = path.rsplit_once('.').map(|p| p.0) {
                if let Some(n) = self.tuples.get(owner) {
                    return err(
                        e.span,
                        format!("${owner} is a tuple of {n} members: ${path} is not one of them"),
                    );
                }
            }
        }
        let (base, parts) = e.member_chain();
        let Some(path) = e.args_path() else {
            // A typed pointer's members: `$task->se.cfs_rq`.
            let v = self.expr(base)?;
            let Ty::Ptr { btf } = v.ty else {
                return err(
                    e.span,
                    format!(
                        "only args and struct pointers have members; this is {}",
                        describe_ty(v.ty)
                    ),
                );
            };
            return self.members(v, btf, &parts, e.span);
        };
        // `args.` keeps a field named like a builtin (kill's `pid`) a field.
        let name = format!("args.{path}");
        let direct = crate::attach::plan::source_for(self.pc.probe, self.pc.path, &name);
        if let (Err(x), true) = (&direct, parts.len() > 1) {
            // A record field that points to a struct (`args->rqtp->tv_sec`):
            // the pointer is read, its struct found in BTF by the field's C type.
            let first = parts[0].0;
            let st = self
                .pc
                .probe
                .field(first)
                .and_then(|f| struct_ptr_name(&f.ctype))
                .and_then(btf_struct)
                .ok_or_else(|| LowerError {
                    span: e.span,
                    msg: x.to_string(),
                })?;
            let (mut src, _, _) = crate::attach::plan::source_for(
                self.pc.probe,
                self.pc.path,
                &format!("args.{first}"),
            )
            .map_err(|x| LowerError {
                span: e.span,
                msg: x.to_string(),
            })?;
            src.r#type = bs_val_type::BS_T_NUM.0 as u8;
            src.size = 8;
            src.is_signed = 0;
            let p = self.read_src(src, Ty::Int { signed: false }, e.span)?;
            return self.members(p, st, &parts[1..], e.span);
        }
        let (mut src, kind, _) = direct.map_err(|x| LowerError {
            span: e.span,
            msg: x.to_string(),
        })?;
        let ty = match kind {
            ValueKind::Int { signed } => Ty::Int { signed },
            ValueKind::Hex | ValueKind::Buf | ValueKind::Cgroup | ValueKind::Probe => {
                Ty::Int { signed: false }
            }
            ValueKind::Stack { user } => Ty::Stack {
                user,
                limit: STACK_FRAMES,
                perf: false,
            },
            ValueKind::Str => {
                let t = bs_val_type(src.r#type.into());
                if t == bs_val_type::BS_T_STR_UPTR || t == bs_val_type::BS_T_STR_KPTR {
                    // A `char *` is a pointer until str() reads it, as in bpftrace.
                    src.r#type = bs_val_type::BS_T_NUM.0 as u8;
                    src.size = 8;
                    src.is_signed = 0;
                    Ty::Int { signed: false }
                } else {
                    Ty::Str
                }
            }
        };
        if ty == (Ty::Int { signed: false }) && src.r#type == bs_val_type::BS_T_BUF_UPTR.0 as u8 {
            src.r#type = bs_val_type::BS_T_NUM.0 as u8;
            src.size = 8;
        }
        let bits = if src.r#type == bs_val_type::BS_T_NUM.0 as u8 {
            src.size.clamp(1, 8) * 8
        } else {
            64
        };
        let v = self.read_src(src, ty, e.span)?;
        Ok(Val { bits, ..v })
    }

    /// The address of a member path from the struct at the address in
    /// `v` (BTF type `btf`): each pointer on the way read. A register holding
    /// it, and what the walk found there.
    fn member_addr(
        &mut self,
        v: Val,
        btf: u32,
        parts: &[(&str, bool)],
        span: Span,
    ) -> Res<(u8, crate::probe::btf::Walk)> {
        let k = crate::probe::btf::vmlinux().ok_or_else(|| LowerError {
            span,
            msg: "the kernel has no BTF, so struct members cannot be read".into(),
        })?;
        // The address is in hand: the first step reads from it either way.
        let steps: Vec<crate::probe::btf::Step> = parts
            .iter()
            .enumerate()
            .map(|(i, (m, arrow))| crate::probe::btf::Step {
                arrow: *arrow && i > 0,
                member: m.to_string(),
            })
            .collect();
        let w = k
            .walk_in_memory("value", btf, &steps)
            .map_err(|m| LowerError { span, msg: m })?;
        let r = self.reg(span)?;
        let imm = bs_vm_flags::BS_VMF_IMM.0 as u8;
        self.emit(insn(bs_vm_op::BS_VM_MOV, r, v.loc, 0));
        for off in &w.path {
            self.emit(
                insn(bs_vm_op::BS_VM_ALU, r, r, 0)
                    .arg(bs_vm_alu::BS_ALU_ADD.0)
                    .imm(i64::from(*off))
                    .flags(imm),
            );
            self.emit(insn(bs_vm_op::BS_VM_READ, r, r, 0).arg(8));
        }
        self.emit(
            insn(bs_vm_op::BS_VM_ALU, r, r, 0)
                .arg(bs_vm_alu::BS_ALU_ADD.0)
                .imm(i64::from(w.leaf_off))
                .flags(imm),
        );
        Ok((r, w))
    }

    /// Members of the struct at the address in `v` (BTF type `btf`): each
    /// pointer on the way read, the leaf read by its type.
    fn members(&mut self, v: Val, btf: u32, parts: &[(&str, bool)], span: Span) -> Res<Val> {
        let k = crate::probe::btf::vmlinux().ok_or_else(|| LowerError {
            span,
            msg: "the kernel has no BTF, so struct members cannot be read".into(),
        })?;
        let (r, w) = self.member_addr(v, btf, parts, span)?;
        use crate::probe::btf::Shape;
        let read = |l: &mut Self, size: u8, signed: bool| {
            let f = if signed {
                bs_vm_flags::BS_VMF_SIGNED.0 as u8
            } else {
                0
            };
            l.emit(
                insn(bs_vm_op::BS_VM_READ, r, r, 0)
                    .arg(u32::from(size))
                    .flags(f),
            );
        };
        Ok(match w.shape {
            Shape::Int { size, signed } => {
                read(self, size, signed);
                Val {
                    ty: Ty::Int { signed },
                    loc: r,
                    lit: false,
                    bits: size * 8,
                }
            }
            Shape::Pointer => {
                read(self, 8, false);
                let ty = match k.pointee_struct(w.ty) {
                    Some(id) => Ty::Ptr { btf: id },
                    None => Ty::Int { signed: false },
                };
                Val {
                    ty,
                    loc: r,
                    lit: false,
                    bits: 64,
                }
            }
            Shape::KernelStr | Shape::UserStr => {
                read(self, 8, false);
                Val {
                    ty: Ty::Int { signed: false },
                    loc: r,
                    lit: false,
                    bits: 64,
                }
            }
            Shape::CharArray(n) => {
                let slot = self.slot(span)?;
                self.emit(insn(bs_vm_op::BS_VM_STRPTR, slot, r, 0).imm(i64::from(n)));
                Val {
                    ty: Ty::Str,
                    loc: slot,
                    lit: false,
                    bits: 64,
                }
            }
            Shape::Array { len, .. } => {
                return err(
                    span,
                    format!("this member is an array of {len}: index it ([i]), or give it to ntop() or buf()"),
                )
            }
            Shape::Composite | Shape::Unsupported => {
                return err(span, "this member cannot be read")
            }
        })
    }

    fn ident(&mut self, name: &str, span: Span) -> Res<Val> {
        let b = |kind: bs_src_kind| bs_src {
            kind: kind.0 as u8,
            r#type: bs_val_type::BS_T_NUM.0 as u8,
            size: 8,
            ..Default::default()
        };
        let u = Ty::Int { signed: false };
        let (src, ty) = match name {
            "pid" => (b(bs_src_kind::BS_SRC_PID), u),
            "tid" => (b(bs_src_kind::BS_SRC_TID), u),
            "uid" => (b(bs_src_kind::BS_SRC_UID), u),
            "gid" => (b(bs_src_kind::BS_SRC_GID), u),
            "cpu" => (b(bs_src_kind::BS_SRC_CPU), u),
            "cgroup" => (b(bs_src_kind::BS_SRC_CGROUP), u),
            "nsecs" => (b(bs_src_kind::BS_SRC_NSECS), u),
            "elapsed" => (b(bs_src_kind::BS_SRC_ELAPSED), u),
            "curtask" => (b(bs_src_kind::BS_SRC_CURTASK), u),
            "rand" => (b(bs_src_kind::BS_SRC_RAND), u),
            "jiffies" => (b(bs_src_kind::BS_SRC_JIFFIES), u),
            "kstack" | "ustack" => return self.stack(name == "ustack", &[], span),
            "username" => (b(bs_src_kind::BS_SRC_UID), Ty::User),
            "comm" => {
                let s = bs_src {
                    kind: bs_src_kind::BS_SRC_COMM.0 as u8,
                    r#type: bs_val_type::BS_T_STR_INLINE.0 as u8,
                    size: 16,
                    ..Default::default()
                };
                return self.read_src(s, Ty::Str, span);
            }
            "probe" => {
                let n = self.pc.probe.name.clone();
                return self.cstr(&n, span);
            }
            "func" => {
                let f = match &self.pc.probe.kind {
                    ProbeKind::Uprobe { func, .. } | ProbeKind::Kfunc { func, .. } => func.clone(),
                    _ => {
                        return err(
                            span,
                            "func is only known in uprobes and kernel function probes",
                        )
                    }
                };
                return self.cstr(&f, span);
            }
            "retval" => {
                if !self.returns() {
                    return err(
                        span,
                        "retval is only known in return probes (uretprobe, kretprobe, kretfunc)",
                    );
                }
                (
                    arg_src(bs_limits::BS_ARG_RET.0 as u16, true, 8),
                    Ty::Int { signed: true },
                )
            }
            "args" => return err(span, "args is read by its fields: args->name"),
            n if n.starts_with("arg") && n[3..].parse::<u16>().is_ok() => {
                let i: u16 = n[3..].parse().unwrap_or(0);
                if !self.pc.path.uses_args() || matches!(self.pc.path, Path::Syscall(_)) || i >= 6 {
                    return err(span, format!("{n} is only known in uprobes and kernel function probes (arg0 to arg5)"));
                }
                (arg_src(i, false, 8), u)
            }
            n => {
                if let Some(body) = self.sh.defines.get(n).cloned() {
                    // A macro of the script: its expression, at its use.
                    if self.expanding > MAX_EXPANSION {
                        return err(span, format!("macro '{n}' expands into itself"));
                    }
                    self.expanding += 1;
                    let v = self.expr(&at_span(&body, span));
                    self.expanding -= 1;
                    return v;
                }
                return match self.constant(n) {
                    Some(v) => self.int(v, span),
                    None => err(span, format!("unknown identifier '{n}' (not a builtin, a macro of the headers included, nor an enum constant in the kernel's BTF)")),
                };
            }
        };
        self.read_src(src, ty, span)
    }

    /// The text of a string positional parameter `$N`, or of `$N + k`
    /// (its bytes from k on, empty past its end).
    fn param_str(&self, e: &Expr) -> Option<String> {
        let param = |e: &Expr| match e.kind {
            ExprKind::Positional(n) => {
                let p = self.sh.params.get((n as usize).checked_sub(1)?)?;
                parse_int(p).is_none().then(|| p.clone())
            }
            _ => None,
        };
        match &e.kind {
            ExprKind::Positional(_) => param(e),
            ExprKind::Binary {
                op: BinOp::Add,
                lhs,
                rhs,
            } => {
                let ExprKind::Int(k) = rhs.kind else {
                    return None;
                };
                let p = param(lhs)?;
                Some(p.get(k as usize..).unwrap_or_default().to_string())
            }
            _ => None,
        }
    }

    /// ntop([af,] addr): an IPv4 address from an integer (4 bytes, network
    /// order as in memory), or IPv4/IPv6 from a 4- or 16-byte array (a
    /// struct member's, or a record field's).
    fn ntop(&mut self, args: &[Expr], span: Span) -> Res<Val> {
        let (af, a) = match args {
            [a] => (None, a),
            [f, a] => (Some(f), a),
            _ => {
                return err(
                    span,
                    "ntop() takes an address, and before it an optional family",
                )
            }
        };
        // Where the bytes are: (register or slot, how: enum bs_vm_op's NTOP arg).
        let (loc, how) = match &a.kind {
            ExprKind::Field { .. } if a.args_path().is_none() => {
                let (base, parts) = a.member_chain();
                let v = self.expr(base)?;
                let Ty::Ptr { btf } = v.ty else {
                    return err(a.span, "ntop() takes an integer or a byte array");
                };
                let (r, w) = self.member_addr(v, btf, &parts, a.span)?;
                use crate::probe::btf::Shape;
                match w.shape {
                    Shape::CharArray(n @ (4 | 16)) => (r, n as u32),
                    Shape::Array {
                        elem: 1,
                        len: n @ (4 | 16),
                        ..
                    } => (r, n),
                    Shape::Int { size, .. } if size <= 4 => {
                        self.emit(insn(bs_vm_op::BS_VM_READ, r, r, 0).arg(4));
                        (r, 0)
                    }
                    _ => {
                        return err(
                            a.span,
                            "ntop() takes a 4-byte integer or a 4- or 16-byte array",
                        )
                    }
                }
            }
            _ if self.record_bytes(a).is_some() => {
                let (src, n) = self.record_bytes(a).unwrap_or_default();
                let v = self.read_src(src, Ty::Str, a.span)?;
                match n {
                    4 => (v.loc, 36),
                    16 => (v.loc, 48),
                    _ => return err(a.span, "ntop() takes a 4- or 16-byte array"),
                }
            }
            _ => {
                let v = self.expr(a)?;
                match v.ty {
                    Ty::Str => {
                        // A record field's bytes, read into a slot.
                        let n = a
                            .args_path()
                            .and_then(|p| self.pc.probe.field(&p).map(|f| f.size))
                            .unwrap_or(0);
                        match n {
                            4 => (v.loc, 36),
                            16 => (v.loc, 48),
                            _ => return err(a.span, "ntop() takes a 4- or 16-byte array"),
                        }
                    }
                    t if t.is_num() => (v.loc, 0),
                    t => {
                        return err(
                            a.span,
                            format!("ntop() of {} is not possible", describe_ty(t)),
                        )
                    }
                }
            }
        };
        const AF_INET: i64 = 2;
        const AF_INET6: i64 = 10;
        let default_af = if matches!(how, 16 | 48) {
            AF_INET6
        } else {
            AF_INET
        };
        let slot = self.slot(span)?;
        let mut i = insn(bs_vm_op::BS_VM_NTOP, slot, loc, 0).arg(how);
        match af.map(|f| (f, self.const_int(f, 0))) {
            None => i = i.imm(default_af),
            Some((_, Some(v))) => i = i.imm(v),
            Some((f, None)) => {
                let v = self.expr(f)?;
                if !v.ty.is_num() {
                    return err(f.span, "ntop()'s family must be an integer");
                }
                i.b = v.loc;
                i = i.flags(bs_vm_flags::BS_VMF_REGLEN.0 as u8);
            }
        }
        self.emit(i);
        Ok(Val {
            ty: Ty::Inet,
            loc: slot,
            lit: false,
            bits: 64,
        })
    }

    /// A record field that is an array of bytes (`__u8 saddr[4]`): the
    /// source of its raw bytes, and how many.
    fn record_bytes(&self, e: &Expr) -> Option<(bs_src, u8)> {
        let f = self.pc.probe.field(&e.args_path()?)?;
        if !matches!(self.pc.path, Path::Tracepoint { .. })
            || f.kind != crate::probe::FieldKind::Unsupported
            || !matches!(f.array_bytes, 4 | 16)
        {
            return None;
        }
        let n = f.array_bytes as u8;
        Some((
            bs_src {
                kind: bs_src_kind::BS_SRC_CTX.0 as u8,
                r#type: bs_val_type::BS_T_STR_INLINE.0 as u8,
                size: n,
                off: f.offset,
                ..Default::default()
            },
            n,
        ))
    }

    /// buf(addr[, len]): bytes at an address (at most 63), or a struct
    /// member's byte array whole.
    fn buf(&mut self, args: &[Expr], span: Span) -> Res<Val> {
        let (a, len) = match args {
            [a] => (a, None),
            [a, l] => (a, Some(l)),
            _ => return err(span, "buf() takes an address and a length"),
        };
        let (loc, n) = match &a.kind {
            ExprKind::Field { .. } if a.args_path().is_none() => {
                let (base, parts) = a.member_chain();
                let v = self.expr(base)?;
                let Ty::Ptr { btf } = v.ty else {
                    return err(a.span, "buf() takes an address or a byte array");
                };
                let (r, w) = self.member_addr(v, btf, &parts, a.span)?;
                match w.shape {
                    crate::probe::btf::Shape::CharArray(n) => (r, Some(u64::from(n))),
                    crate::probe::btf::Shape::Array { elem, len, .. } => {
                        (r, Some(u64::from(elem) * u64::from(len)))
                    }
                    _ => {
                        self.emit(insn(bs_vm_op::BS_VM_READ, r, r, 0).arg(8));
                        (r, None)
                    }
                }
            }
            _ => {
                let v = self.expr(a)?;
                if !v.ty.is_num() {
                    return err(a.span, "buf() takes an address");
                }
                (v.loc, None)
            }
        };
        let slot = self.slot(span)?;
        let mut i = insn(bs_vm_op::BS_VM_BUF, slot, loc, 0);
        match (len, n) {
            (Some(l), _) => match self.const_int(l, 0) {
                Some(c) => i = i.imm(c.clamp(0, STR_MAX as i64 - 1)),
                None => {
                    let v = self.expr(l)?;
                    if !v.ty.is_num() {
                        return err(l.span, "buf()'s length must be an integer");
                    }
                    i.b = v.loc;
                    i = i.flags(bs_vm_flags::BS_VMF_REGLEN.0 as u8);
                }
            },
            (None, Some(n)) => i = i.imm(n.min(STR_MAX as u64 - 1) as i64),
            (None, None) => return err(span, "buf() of an address needs a length: buf(ptr, len)"),
        }
        self.emit(i);
        Ok(Val {
            ty: Ty::Buf,
            loc: slot,
            lit: false,
            bits: 64,
        })
    }

    /// sizeof(TYPE) or sizeof(expr), in bytes.
    fn size_of(&mut self, a: &Expr) -> Res<u64> {
        let named = match &a.kind {
            ExprKind::TypeName(t) => Some(t.clone()),
            // comm is a char[16].
            ExprKind::Ident(n) if n == "comm" => return Ok(16),
            ExprKind::Ident(n)
                if !is_builtin(n)
                    && !self.sh.defines.contains_key(n)
                    && self.constant(n).is_none() =>
            {
                Some(n.clone())
            }
            _ => None,
        };
        if let Some(t) = named {
            let t = t.trim();
            if t.ends_with('*') {
                return Ok(8);
            }
            if let Some((bits, _)) = int_type(t) {
                return Ok(u64::from(bits / 8));
            }
            return crate::probe::btf::vmlinux()
                .and_then(|k| k.size_of_named(t))
                .ok_or_else(|| LowerError {
                    span: a.span,
                    msg: format!("sizeof: no type '{t}' in the kernel's BTF"),
                });
        }
        // An expression: its type's size, without running it.
        let mark = self.code.len();
        let (tr, ts) = (self.tmp_reg, self.tmp_str);
        let v = self.expr(a);
        self.code.truncate(mark);
        self.tmp_reg = tr;
        self.tmp_str = ts;
        let v = v?;
        Ok(match v.ty {
            Ty::Str => STR_MAX as u64,
            Ty::Inet => 24,
            Ty::Buf => STR_MAX as u64,
            Ty::Int { .. } => u64::from(v.bits / 8).max(1),
            _ => 8,
        })
    }

    /// A named constant: a macro of the headers included, a kernel enum
    /// constant (BTF), or one of the kernel-internal macros the shipped
    /// tools use (`TASK_RUNNING`, not in any installed header).
    fn constant(&self, n: &str) -> Option<i64> {
        self.sh
            .macros
            .value(n)
            .or_else(|| crate::probe::btf::vmlinux()?.enum_value(n))
            .or_else(|| self.sh.consts.get(n).copied())
    }

    /// An expression that must be a constant (lhist's bounds, print's top
    /// and div): literals, named constants, and arithmetic on them.
    fn const_int(&self, e: &Expr, depth: usize) -> Option<i64> {
        if depth > MAX_EXPANSION {
            return None;
        }
        match &e.kind {
            ExprKind::Int(v) => Some(*v as i64),
            ExprKind::Ident(n) => match self.sh.defines.get(n) {
                Some(body) => self.const_int(body, depth + 1),
                None => self.constant(n),
            },
            ExprKind::Positional(n) => {
                parse_int(self.sh.params.get((*n as usize).checked_sub(1)?)?)
            }
            ExprKind::Unary { op, expr } => {
                let v = self.const_int(expr, depth + 1)?;
                match op {
                    UnOp::Neg => Some(v.wrapping_neg()),
                    UnOp::BitNot => Some(!v),
                    UnOp::Not => Some(i64::from(v == 0)),
                    UnOp::Deref => None,
                }
            }
            ExprKind::Binary { op, lhs, rhs } => {
                let (a, b) = (
                    self.const_int(lhs, depth + 1)?,
                    self.const_int(rhs, depth + 1)?,
                );
                Some(match op {
                    BinOp::Add => a.wrapping_add(b),
                    BinOp::Sub => a.wrapping_sub(b),
                    BinOp::Mul => a.wrapping_mul(b),
                    BinOp::Div => a.checked_div(b)?,
                    BinOp::Mod => a.checked_rem(b)?,
                    BinOp::BitAnd => a & b,
                    BinOp::BitOr => a | b,
                    BinOp::BitXor => a ^ b,
                    BinOp::Shl => a.wrapping_shl(b as u32),
                    BinOp::Shr => a.wrapping_shr(b as u32),
                    _ => return None,
                })
            }
            _ => None,
        }
    }

    fn returns(&self) -> bool {
        match &self.pc.probe.kind {
            ProbeKind::Uprobe { ret, .. } => *ret,
            ProbeKind::Kfunc { kind, .. } => kind.is_ret(),
            _ => false,
        }
    }

    /// `kstack`, `ustack(8)`, `kstack(perf)`, `ustack(bpftrace, 3)`.
    fn stack(&mut self, user: bool, args: &[Expr], span: Span) -> Res<Val> {
        let mut limit = STACK_FRAMES;
        let mut perf = false;
        let bad = |at: Span| {
            err(
                at,
                format!(
                    "{}stack takes a mode (bpftrace or perf) and a frame count, e.g. {}stack(perf, 8)",
                    if user { "u" } else { "k" },
                    if user { "u" } else { "k" }
                ),
            )
        };
        if args.len() > 2 {
            return bad(span);
        }
        for (i, a) in args.iter().enumerate() {
            match &a.kind {
                ExprKind::Ident(m) if i == 0 && (m == "perf" || m == "bpftrace") => {
                    perf = m == "perf";
                }
                ExprKind::Int(n) if i + 1 == args.len() => {
                    if *n == 0 || *n > u64::from(STACK_FRAMES) {
                        return err(a.span, format!("a stack holds 1 to {STACK_FRAMES} frames"));
                    }
                    limit = *n as u8;
                }
                _ => return bad(a.span),
            }
        }
        if user {
            self.sh.stacks.1 = true;
        } else {
            self.sh.stacks.0 = true;
        }
        let kind = if user {
            bs_src_kind::BS_SRC_USTACK
        } else {
            bs_src_kind::BS_SRC_KSTACK
        };
        let s = bs_src {
            kind: kind.0 as u8,
            r#type: bs_val_type::BS_T_NUM.0 as u8,
            size: 8,
            ..Default::default()
        };
        self.read_src(s, Ty::Stack { user, limit, perf }, span)
    }

    fn call(&mut self, name: &str, args: &[Expr], span: Span) -> Res<Val> {
        match name {
            "str" => {
                let Some(a) = args.first() else {
                    return err(span, "str() takes a pointer and an optional length");
                };
                // A string parameter, or past its first bytes (`str($1 + 2)`,
                // bpftrace's pointer arithmetic on it): a constant.
                if let Some(c) = self.param_str(a) {
                    let c = match args.get(1) {
                        Some(Expr {
                            kind: ExprKind::Int(n),
                            ..
                        }) => c.chars().take(*n as usize).collect(),
                        _ => c,
                    };
                    return self.cstr(&c, span);
                }
                // A constant limit, or one read at run time (str(buf, count)).
                let limit = match args.get(1) {
                    None => None,
                    Some(Expr {
                        kind: ExprKind::Int(n),
                        ..
                    }) => Some(Err(*n as i64)),
                    Some(x) => {
                        let l = self.expr(x)?;
                        if !l.ty.is_num() {
                            return err(x.span, "str()'s length must be an integer");
                        }
                        Some(Ok(l.loc))
                    }
                };
                let v = self.expr(a)?;
                match v.ty {
                    Ty::Str => Ok(v),
                    t if t.is_num() => {
                        let slot = self.slot(span)?;
                        let mut i = insn(bs_vm_op::BS_VM_STRPTR, slot, v.loc, 0);
                        match limit {
                            Some(Err(n)) => i = i.imm(n),
                            Some(Ok(r)) => {
                                i.b = r;
                                i = i.flags(bs_vm_flags::BS_VMF_REGLEN.0 as u8);
                            }
                            None => {}
                        }
                        self.emit(i);
                        Ok(Val {
                            ty: Ty::Str,
                            loc: slot,
                            lit: false,
                            bits: 64,
                        })
                    }
                    t => err(
                        a.span,
                        format!("str() of {} is not possible", describe_ty(t)),
                    ),
                }
            }
            "strncmp" => {
                let (
                    Some(a),
                    Some(b),
                    Some(Expr {
                        kind: ExprKind::Int(n),
                        ..
                    }),
                ) = (args.first(), args.get(1), args.get(2))
                else {
                    return err(span, "strncmp() takes two strings and a constant length");
                };
                let (x, y) = (self.expr(a)?, self.expr(b)?);
                if x.ty != Ty::Str || y.ty != Ty::Str {
                    return err(span, "strncmp() compares two strings");
                }
                let r = self.reg(span)?;
                self.emit(insn(bs_vm_op::BS_VM_STREQ, r, x.loc, y.loc).imm(*n as i64));
                // strncmp is 0 when equal.
                self.emit(insn(bs_vm_op::BS_VM_ALU, r, r, 0).arg(bs_vm_alu::BS_ALU_NOT.0));
                Ok(Val {
                    ty: Ty::Int { signed: false },
                    loc: r,
                    lit: false,
                    bits: 64,
                })
            }
            "kstack" | "ustack" => self.stack(name == "ustack", args, span),
            "kaddr" => {
                let Some(Expr {
                    kind: ExprKind::Str(sym),
                    ..
                }) = args.first()
                else {
                    return err(
                        span,
                        "kaddr() takes a kernel symbol's name as a string literal",
                    );
                };
                let addr = kallsyms_addr(sym).ok_or_else(|| LowerError {
                    span,
                    msg: format!("kaddr: no kernel symbol '{sym}' in /proc/kallsyms"),
                })?;
                let v = self.int(addr as i64, span)?;
                Ok(Val {
                    ty: Ty::Int { signed: false },
                    ..v
                })
            }
            "ntop" => self.ntop(args, span),
            "bswap" => {
                let [a] = args else {
                    return err(span, "bswap() takes one integer");
                };
                let v = self.expr(a)?;
                let Ty::Int { .. } = v.ty.plain() else {
                    return err(a.span, "bswap() takes an integer");
                };
                if v.bits <= 8 {
                    return Ok(v);
                }
                let r = self.reg(span)?;
                self.emit(
                    insn(bs_vm_op::BS_VM_ALU, r, v.loc, 0)
                        .arg(bs_vm_alu::BS_ALU_BSWAP.0)
                        .imm(i64::from(v.bits))
                        .flags(bs_vm_flags::BS_VMF_IMM.0 as u8),
                );
                Ok(Val {
                    ty: Ty::Int { signed: false },
                    loc: r,
                    lit: false,
                    bits: v.bits,
                })
            }
            "strcontains" => {
                let [h, n] = args else {
                    return err(span, "strcontains() takes two strings");
                };
                let (h, n) = (self.expr(h)?, self.expr(n)?);
                if h.ty != Ty::Str || n.ty != Ty::Str {
                    return err(span, "strcontains() takes two strings");
                }
                let r = self.reg(span)?;
                self.emit(insn(bs_vm_op::BS_VM_STRSTR, r, h.loc, n.loc));
                Ok(Val {
                    ty: Ty::Int { signed: false },
                    loc: r,
                    lit: false,
                    bits: 64,
                })
            }
            "sizeof" => {
                let [a] = args else {
                    return err(span, "sizeof() takes a type or an expression");
                };
                let n = self.size_of(a)?;
                self.int(n as i64, span)
            }
            "signal" => {
                let [a] = args else {
                    return err(
                        span,
                        "signal() takes a signal: a name (\"SIGKILL\") or a number",
                    );
                };
                if !self.sh.unsafe_ok {
                    return err(
                        span,
                        "signal() sends signals: it needs --unsafe, as in bpftrace",
                    );
                }
                if matches!(self.pc.path, Path::Trigger) {
                    return err(
                        span,
                        "signal() in BEGIN, END or interval would signal bpfscope itself",
                    );
                }
                let sig = match &a.kind {
                    ExprKind::Str(n) => Some(signal_number(n).ok_or_else(|| LowerError {
                        span: a.span,
                        msg: format!("unknown signal '{n}'"),
                    })?),
                    _ => self.const_int(a, 0),
                };
                let v = match sig {
                    Some(n) if (1..=64).contains(&n) => self.int(n, a.span)?,
                    Some(n) => return err(a.span, format!("signal {n} is not in 1..64")),
                    None => {
                        let v = self.expr(a)?;
                        if !v.ty.is_num() {
                            return err(a.span, "signal() takes a name or a number");
                        }
                        v
                    }
                };
                self.emit(insn(bs_vm_op::BS_VM_SIGNAL, 0, v.loc, 0));
                self.int(0, span)
            }
            "ksym" => {
                let [a] = args else {
                    return err(span, "ksym() takes a kernel address");
                };
                let v = self.expr(a)?;
                if !v.ty.is_num() {
                    return err(a.span, "ksym() takes an address");
                }
                Ok(Val { ty: Ty::KSym, ..v })
            }
            "usym" => {
                let [a] = args else {
                    return err(span, "usym() takes a user address");
                };
                let v = self.expr(a)?;
                if !v.ty.is_num() {
                    return err(a.span, "usym() takes an address");
                }
                let slot = self.slot(span)?;
                self.emit(insn(bs_vm_op::BS_VM_USYM, slot, v.loc, 0));
                Ok(Val {
                    ty: Ty::USym,
                    loc: slot,
                    lit: false,
                    bits: 64,
                })
            }
            "buf" => self.buf(args, span),
            // Address spaces: bpfscope reads user memory, then kernel, either way.
            "kptr" | "uptr" => match args {
                [a] => self.expr(a),
                _ => err(span, format!("{name}() takes an address")),
            },
            "count" | "sum" | "avg" | "min" | "max" | "stats" | "hist" | "lhist" => err(
                span,
                format!("{name}() must be assigned to a map, e.g. @x = {name}(...)"),
            ),
            _ => err(span, format!("unknown or unsupported function {name}()")),
        }
    }
}

fn arg_kind(t: Ty) -> crate::render::bpftrace::ArgKind {
    use crate::render::bpftrace::ArgKind;
    match t {
        Ty::Int { .. } | Ty::Ptr { .. } | Ty::IntPtr { .. } => ArgKind::Int,
        Ty::Str | Ty::User | Ty::Inet | Ty::KSym | Ty::USym => ArgKind::Str,
        Ty::Buf => ArgKind::Buf,
        Ty::Stack { .. } => ArgKind::Stack,
    }
}

/// A builtin's name (not a type's, in sizeof()).
fn is_builtin(n: &str) -> bool {
    const BUILTINS: &[&str] = &[
        "pid", "tid", "uid", "gid", "cpu", "cgroup", "nsecs", "elapsed", "curtask", "rand",
        "jiffies", "kstack", "ustack", "username", "probe", "func", "retval", "args", "comm",
    ];
    BUILTINS.contains(&n)
        || n.strip_prefix("arg")
            .is_some_and(|i| i.parse::<u8>().is_ok())
}

/// A signal's number by name (`SIGKILL` or `KILL`), as signal() takes it.
fn signal_number(name: &str) -> Option<i64> {
    let n = name.strip_prefix("SIG").unwrap_or(name);
    Some(match n {
        "HUP" => 1,
        "INT" => 2,
        "QUIT" => 3,
        "ILL" => 4,
        "TRAP" => 5,
        "ABRT" => 6,
        "BUS" => 7,
        "FPE" => 8,
        "KILL" => 9,
        "USR1" => 10,
        "SEGV" => 11,
        "USR2" => 12,
        "PIPE" => 13,
        "ALRM" => 14,
        "TERM" => 15,
        "STKFLT" => 16,
        "CHLD" => 17,
        "CONT" => 18,
        "STOP" => 19,
        "TSTP" => 20,
        "TTIN" => 21,
        "TTOU" => 22,
        "URG" => 23,
        "XCPU" => 24,
        "XFSZ" => 25,
        "VTALRM" => 26,
        "PROF" => 27,
        "WINCH" => 28,
        "IO" | "POLL" => 29,
        "PWR" => 30,
        "SYS" => 31,
        _ => return None,
    })
}

/// An integer type's bits and signedness: bpftrace's names (`uint32`) and
/// C's (`unsigned int`, `u16`, `__s64`).
fn int_type(t: &str) -> Option<(u32, bool)> {
    Some(match t {
        "int8" | "s8" | "__s8" | "char" | "signed char" | "int8_t" => (8, true),
        "int16" | "s16" | "__s16" | "short" | "short int" | "int16_t" => (16, true),
        "int32" | "s32" | "__s32" | "int" | "signed int" | "signed" | "int32_t" => (32, true),
        "int64" | "s64" | "__s64" | "long" | "long int" | "long long" | "long long int"
        | "int64_t" | "ssize_t" => (64, true),
        "uint8" | "u8" | "__u8" | "unsigned char" | "uint8_t" | "bool" => (8, false),
        "uint16" | "u16" | "__u16" | "__be16" | "__le16" | "unsigned short" | "uint16_t" => {
            (16, false)
        }
        "uint32" | "u32" | "__u32" | "__be32" | "__le32" | "unsigned int" | "unsigned"
        | "uint32_t" => (32, false),
        "uint64" | "u64" | "__u64" | "__be64" | "__le64" | "unsigned long"
        | "unsigned long long" | "uint64_t" | "size_t" => (64, false),
        _ => return None,
    })
}

/// `struct NAME *` in a cast: NAME.
fn struct_ptr_name(ty: &str) -> Option<&str> {
    let t = ty.trim().strip_suffix('*')?.trim();
    let t = t.strip_prefix("const ").unwrap_or(t).trim();
    t.strip_prefix("struct ")
        .or_else(|| t.strip_prefix("union "))
        .map(str::trim)
}

fn btf_struct(name: &str) -> Option<u32> {
    crate::probe::btf::vmlinux()?.struct_id(name)
}

/// A kernel symbol's address, as root reads it from /proc/kallsyms.
fn kallsyms_addr(sym: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/kallsyms").ok()?;
    text.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        let (a, _, n) = (f.next()?, f.next()?, f.next()?);
        (n == sym)
            .then(|| u64::from_str_radix(a, 16).ok())
            .flatten()
            .filter(|&a| a != 0)
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

/// A map's name as bpftrace prints it (the parser keeps it without its '@').
fn name_or_at(n: &str) -> String {
    format!("@{}", n.trim_start_matches('@'))
}

/// A positional parameter as a number, as bpftrace reads one (C's
/// strtoll with base 0): `0x` hex, a leading 0 octal, else decimal.
fn parse_int(s: &str) -> Option<i64> {
    let (neg, t) = match s.strip_prefix('-') {
        Some(t) => (true, t),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    let v = if let Some(h) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        i64::from_str_radix(h, 16).ok()?
    } else if t.len() > 1 && t.starts_with('0') {
        i64::from_str_radix(&t[1..], 8).ok()?
    } else if !t.is_empty() && t.bytes().all(|c| c.is_ascii_digit()) {
        t.parse().ok()?
    } else {
        return None;
    };
    Some(if neg { -v } else { v })
}

fn arg_src(slot: u16, signed: bool, size: u8) -> bs_src {
    bs_src {
        kind: bs_src_kind::BS_SRC_ARG.0 as u8,
        r#type: bs_val_type::BS_T_NUM.0 as u8,
        size,
        is_signed: signed as u8,
        off: slot,
        ..Default::default()
    }
}

/// A macro's expression placed at its use: every span is the use's, so
/// what is wrong in it is said where the macro is used.
fn at_span(e: &Expr, span: Span) -> Expr {
    let mut e = e.clone();
    fn set(e: &mut Expr, span: Span) {
        e.span = span;
        match &mut e.kind {
            ExprKind::Map { keys, .. } => keys.iter_mut().for_each(|k| set(k, span)),
            ExprKind::Field { base, .. } => set(base, span),
            ExprKind::Index { base, index } => {
                set(base, span);
                set(index, span);
            }
            ExprKind::Unary { expr, .. } | ExprKind::Cast { expr, .. } => set(expr, span),
            ExprKind::Binary { lhs, rhs, .. } => {
                set(lhs, span);
                set(rhs, span);
            }
            ExprKind::Ternary { cond, then, els } => {
                set(cond, span);
                set(then, span);
                set(els, span);
            }
            ExprKind::Call { args, .. } => args.iter_mut().for_each(|a| set(a, span)),
            _ => {}
        }
    }
    set(&mut e, span);
    e
}

/// An instruction, built up by the helpers below.
fn insn(op: bs_vm_op, dst: u8, a: u8, b: u8) -> bs_insn {
    bs_insn {
        op: op.0 as u8,
        dst,
        a,
        b,
        ..Default::default()
    }
}

trait InsnExt {
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

/// Completes every key's KEYCLR once all maps are known: the words from
/// the end of its map's key to the longest key are zeroed (hashed keys
/// must not carry what a longer key left there).
pub fn finish_keys(code: &mut [bs_insn], maps: &[MapDef], key_size: usize) {
    let clears = [bs_vm_op::BS_VM_KEYCLR.0 as u8, bs_vm_op::BS_VM_KEY1.0 as u8];
    for i in code.iter_mut() {
        if !clears.contains(&i.op) {
            continue;
        }
        let len = maps.get(i.arg as usize).map_or(key_size, MapDef::key_len);
        i.arg2 = len as u32;
        i.imm = (key_size.saturating_sub(len) / 8) as i64;
    }
}

/// Checks the total code size against the machine's limit.
pub fn check_size(total: usize) -> Result<(), String> {
    if total > CODE_MAX {
        return Err(format!(
            "the script lowers to {total} instructions; at most {CODE_MAX} fit"
        ));
    }
    Ok(())
}
