//! The last pass, code generation: a parsed script, per probe, into
//! instructions of the script machine (vm.bpf.h), with the maps the types
//! pass found. What the machine cannot do is refused with the line and
//! column of the expression, before anything is loaded.
//!
//! Every probe a block's attach points resolve to gets the code of every
//! block that names it, in script order (bpftrace runs them in that order),
//! so builtins that are constant per probe (`probe`, `func`) are constants.
//!
//! The generator is one `Lower` per probe, its methods by concern:
//! statements here, `expr` (operators, literals, variables), `fields`
//! (record fields, BTF members, arguments), `maps` (keys, aggregations,
//! reads), `calls` (builtin functions and actions), `tuples` (tuples and
//! for-each).

use std::collections::HashMap;

use bpfscope_bpf::abi::{
    bs_insn, bs_limits, bs_src, bs_src_kind, bs_val_type, bs_vm_alu, bs_vm_flags, bs_vm_op,
};

use super::{ir::*, resources::*, types::*};
use crate::attach::plan::{Path, ValueKind};
use crate::lang::ast::*;
use crate::probe::{Probe, ProbeKind};

mod calls;
mod expr;
mod fields;
mod maps;
mod tuples;

use self::{expr::*, fields::*};

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

impl Val {
    /// A value read or computed at `loc`: not a literal, all 64 bits.
    fn at(ty: Ty, loc: u8) -> Val {
        Val {
            ty,
            loc,
            lit: false,
            bits: 64,
        }
    }
}

/// Where a probe block's reads come from.
pub struct ProbeCtx<'a> {
    pub probe: &'a Probe,
    pub path: &'a Path,
}

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
    /// Its shape, without the values.
    fn shape(&self) -> TShape {
        match self {
            TVal::One(_) => TShape::Value,
            TVal::Many(m) => TShape::Tuple(m.iter().map(TVal::shape).collect()),
        }
    }

    /// A tuple of `shape` from its values in order.
    fn shaped(shape: &TShape, vals: &mut impl Iterator<Item = Val>) -> TVal {
        match shape {
            TShape::Value => TVal::One(vals.next().unwrap_or(Val::at(Ty::Int { signed: true }, 0))),
            TShape::Tuple(m) => TVal::Many(m.iter().map(|s| TVal::shaped(s, vals)).collect()),
        }
    }

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
            let r = self.stmt(s);
            self.reset_tmps();
            // Typing, the next statements still declare their maps.
            if self.sh.typing {
                return Ok(());
            }
            r
        });
        self.pop_scope();
        r
    }

    /// Ends the innermost block's scope: its `let`s are forgotten.
    fn pop_scope(&mut self) {
        for name in self.scopes.pop().unwrap_or_default() {
            self.forget(&name);
        }
    }

    /// A loop's body, then the jump back to `top` (where `continue` goes);
    /// `done`, the loop's exit test, and each `break` land after it.
    fn loop_body(&mut self, top: u32, done: usize, body: &[Stmt]) -> Res<()> {
        self.loops.push(Loop {
            top,
            breaks: Vec::new(),
        });
        let r = self.stmts(body);
        let lp = self.loops.pop();
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
                self.loop_body(top, j, body)
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
                    ExprKind::Map { name, keys } => self.map_tuple_set(name, keys, &t, span),
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
                let kinds = self.key_kinds(keys, &keyvals);
                let ty = value_ty(v.ty, value.span)?;
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
}

/// A map value's type for a value of type `t`.
fn value_ty(t: Ty, span: Span) -> Res<Ty> {
    match t {
        Ty::Int { .. } | Ty::Ptr { .. } | Ty::IntPtr { .. } | Ty::User | Ty::KSym => Ok(t.plain()),
        Ty::Time { .. } | Ty::Errno | Ty::Cgroup { .. } => Ok(t),
        Ty::Str | Ty::Inet | Ty::Buf | Ty::USym | Ty::Mac => Ok(t),
        Ty::Stack { .. } => err(span, "a stack can be a map key, not a map value"),
    }
}
