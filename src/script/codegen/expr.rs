//! Expressions: literals, variables, operators, indexing.

use super::*;

impl<'a> Lower<'a> {
    /// Whether a jump lands on the last instruction or just after it.
    pub(super) fn last_is_jumped_to(&self) -> bool {
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
    pub(super) fn take_last(&mut self, op: bs_vm_op, dst: u8) -> Option<bs_insn> {
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
    pub(super) fn retarget(&mut self, v: Val, to: u8) -> bool {
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

    pub(super) fn int(&mut self, v: i64, span: Span) -> Res<Val> {
        let r = self.reg(span)?;
        self.emit(insn(bs_vm_op::BS_VM_LDI, r, 0, 0).imm(v));
        Ok(Val {
            ty: Ty::Int { signed: true },
            loc: r,
            lit: true,
            bits: 64,
        })
    }

    pub(super) fn cstr(&mut self, s: &str, span: Span) -> Res<Val> {
        if crate::filter::raw::len(s) >= STR_MAX {
            return err(span, format!("strings are at most {} bytes", STR_MAX - 1));
        }
        let idx = self.sh.strs.intern(s);
        let slot = self.slot(span)?;
        self.emit(insn(bs_vm_op::BS_VM_CSTR, slot, 0, 0).arg(idx));
        Ok(Val::at(Ty::Str, slot))
    }

    pub(super) fn read_src(&mut self, src: bs_src, ty: Ty, span: Span) -> Res<Val> {
        let idx = self.sh.src(src);
        if ty == Ty::Str {
            let slot = self.slot(span)?;
            self.emit(insn(bs_vm_op::BS_VM_SRCSTR, slot, 0, 0).arg(idx));
            return Ok(Val::at(ty, slot));
        }
        let r = self.reg(span)?;
        self.emit(insn(bs_vm_op::BS_VM_SRC, r, 0, 0).arg(idx));
        Ok(Val::at(ty, r))
    }

    pub(super) fn expr(&mut self, e: &Expr) -> Res<Val> {
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
    pub(super) fn read_at(&mut self, at: u8, bits: u8, signed: bool, span: Span) -> Res<Val> {
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
    pub(super) fn index(&mut self, base: &Expr, index: &Expr, span: Span) -> Res<Val> {
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

    pub(super) fn logical(&mut self, op: BinOp, lhs: &Expr, rhs: &Expr, span: Span) -> Res<Val> {
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

    pub(super) fn binary_vals(&mut self, op: BinOp, a: Val, b: Val, span: Span) -> Res<Val> {
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
}

/// A positional parameter as a number, as bpftrace reads one (C's
/// strtoll with base 0): `0x` hex, a leading 0 octal, else decimal.
pub(super) fn parse_int(s: &str) -> Option<i64> {
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

/// A macro's expression placed at its use: every span is the use's, so
/// what is wrong in it is said where the macro is used.
pub(super) fn at_span(e: &Expr, span: Span) -> Expr {
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
