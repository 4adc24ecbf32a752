//! Builtin functions and the actions that become records (printf, print...).

use super::*;

impl<'a> Lower<'a> {
    /// Statements made of one expression: mostly calls with effects.
    pub(super) fn expr_stmt(&mut self, e: &Expr) -> Res<()> {
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
                // A map of tuples: its members' maps too, under the same key.
                let members = self.sh.maps[id as usize]
                    .tuple
                    .as_ref()
                    .map_or(1, TShape::leaves);
                for i in 1..members {
                    if let Some(mid) = self.sh.map_id(&member_map(&m, i)) {
                        self.emit(insn(bs_vm_op::BS_VM_KEYCLR, 0, 0, 0).arg(mid));
                        self.emit(insn(bs_vm_op::BS_VM_MDEL, 0, 0, 0));
                    }
                }
                Ok(())
            }
            "exit" => {
                let act = self.sh.action(Action::Exit);
                self.emit_record(act, 0);
                let j = self.emit(insn(bs_vm_op::BS_VM_JMP, 0, 0, 0));
                self.exits.push(j);
                Ok(())
            }
            "system" | "cat" => {
                if name == "system" && !self.sh.unsafe_ok {
                    return err(
                        e.span,
                        "system() runs commands: it needs --unsafe, as in bpftrace",
                    );
                }
                let Some(Expr {
                    kind: ExprKind::Str(fmt),
                    ..
                }) = args.first()
                else {
                    return err(
                        e.span,
                        format!("{name}()'s first argument must be a string literal"),
                    );
                };
                let mut vals = Vec::new();
                for a in &args[1..] {
                    vals.push(self.expr(a)?);
                }
                let make = if name == "system" {
                    |fmt, args| Action::System { fmt, args }
                } else {
                    |fmt, args| Action::Cat { fmt, args }
                };
                self.record_vals(fmt, &vals, e.span, make)
            }
            "override" | "printbuf" => {
                err(e.span, format!("{name}() is not supported by bpfscope run"))
            }
            _ => {
                self.expr(e)?;
                Ok(())
            }
        }
    }

    pub(super) fn map_arg(&mut self, args: &[Expr], f: &str, span: Span) -> Res<u32> {
        match args.first() {
            Some(Expr {
                kind: ExprKind::Map { name, keys },
                span: s,
            }) if keys.is_empty() => {
                let n = name_or_at(name);
                match self.sh.map_id(&n) {
                    Some(id) => Ok(id),
                    None if !self.sh.defined.contains(&n) => self.sh.undefined(&n, *s),
                    // Not typed by its writes yet: the types pass waits.
                    None if self.sh.typing => err(*s, format!("{n} is not typed yet")),
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

    pub(super) fn print(&mut self, args: &[Expr], span: Span) -> Res<()> {
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
    pub(super) fn print_tuple(&mut self, t: &TVal, span: Span) -> Res<()> {
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

    pub(super) fn printf(&mut self, args: &[Expr], span: Span) -> Res<()> {
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

    pub(super) fn printf_vals(&mut self, fmt: &str, vals: &[Val], span: Span) -> Res<()> {
        self.record_vals(fmt, vals, span, |fmt, args| Action::Printf { fmt, args })
    }

    /// A record of `vals` for an action that formats them as printf
    /// does (printf, system, cat).
    pub(super) fn record_vals(
        &mut self,
        fmt: &str,
        vals: &[Val],
        span: Span,
        make: fn(String, Vec<Arg>) -> Action,
    ) -> Res<()> {
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
        let act = self.sh.action(make(fmt.to_string(), out));
        self.emit_record(act, off as u32);
        Ok(())
    }

    pub(super) fn put_arg(&mut self, v: Val, off: usize) {
        let op = if v.ty.in_slot() {
            bs_vm_op::BS_VM_EVSTR
        } else {
            bs_vm_op::BS_VM_EVNUM
        };
        self.emit(insn(op, 0, v.loc, 0).arg(off as u32));
    }

    pub(super) fn emit_record(&mut self, action: u32, size: u32) {
        let mut i = insn(bs_vm_op::BS_VM_EMIT, 0, 0, 0).arg(action);
        i.arg2 = size;
        self.emit(i);
    }

    /// ntop([af,] addr): an IPv4 address from an integer (4 bytes, network
    /// order as in memory), or IPv4/IPv6 from a 4- or 16-byte array (a
    /// struct member's, or a record field's).
    pub(super) fn ntop(&mut self, args: &[Expr], span: Span) -> Res<Val> {
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
        Ok(Val::at(Ty::Inet, slot))
    }

    /// A record field that is an array of bytes (`__u8 saddr[4]`): the
    /// source of its raw bytes, and how many.
    pub(super) fn record_bytes(&self, e: &Expr) -> Option<(bs_src, u8)> {
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
    pub(super) fn buf(&mut self, args: &[Expr], span: Span) -> Res<Val> {
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
        Ok(Val::at(Ty::Buf, slot))
    }

    /// sizeof(TYPE) or sizeof(expr), in bytes.
    pub(super) fn size_of(&mut self, a: &Expr) -> Res<u64> {
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
    pub(super) fn constant(&self, n: &str) -> Option<i64> {
        self.sh
            .macros
            .value(n)
            .or_else(|| crate::probe::btf::vmlinux()?.enum_value(n))
            .or_else(|| self.sh.consts.get(n).copied())
    }

    /// An expression that must be a constant (lhist's bounds, print's top
    /// and div): literals, named constants, and arithmetic on them.
    pub(super) fn const_int(&self, e: &Expr, depth: usize) -> Option<i64> {
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

    pub(super) fn returns(&self) -> bool {
        match &self.pc.probe.kind {
            ProbeKind::Uprobe { ret, .. } => *ret,
            ProbeKind::Kfunc { kind, .. } => kind.is_ret(),
            _ => false,
        }
    }

    /// `kstack`, `ustack(8)`, `kstack(perf)`, `ustack(bpftrace, 3)`.
    pub(super) fn stack(&mut self, user: bool, args: &[Expr], span: Span) -> Res<Val> {
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

    pub(super) fn call(&mut self, name: &str, args: &[Expr], span: Span) -> Res<Val> {
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
                        Ok(Val::at(Ty::Str, slot))
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
                Ok(Val::at(Ty::USym, slot))
            }
            "buf" => self.buf(args, span),
            // Six bytes of an array, as buf() reads them, named in user space.
            "macaddr" => match args {
                [a @ Expr {
                    kind: ExprKind::Field { .. },
                    ..
                }] => {
                    let len = Expr {
                        kind: ExprKind::Int(6),
                        span: a.span,
                    };
                    let v = self.buf(&[a.clone(), len], span)?;
                    Ok(Val { ty: Ty::Mac, ..v })
                }
                _ => err(
                    span,
                    "macaddr() takes a 6-byte array (a struct member such as ethhdr's h_source)",
                ),
            },
            // Shown in user space, as bpftrace does: the value stays an integer.
            "strftime" => {
                let [Expr {
                    kind: ExprKind::Str(f),
                    ..
                }, a] = args
                else {
                    return err(
                        span,
                        "strftime() takes a format string literal and nanoseconds since boot (nsecs)",
                    );
                };
                let fmt = self.sh.text(f, span)?;
                let v = self.num_arg(a, "strftime()'s time")?;
                Ok(Val {
                    ty: Ty::Time { fmt },
                    ..v
                })
            }
            "strerror" => {
                let [a] = args else {
                    return err(span, "strerror() takes an error number");
                };
                let v = self.num_arg(a, "strerror()'s error number")?;
                Ok(Val { ty: Ty::Errno, ..v })
            }
            "cgroup_path" => {
                let (a, filter) =
                    match args {
                        [a] => (a, NO_TEXT),
                        [a, Expr {
                            kind: ExprKind::Str(f),
                            ..
                        }] => (a, self.sh.text(f, span)?),
                        _ => return err(
                            span,
                            "cgroup_path() takes a cgroup id and an optional filter string literal",
                        ),
                    };
                let v = self.num_arg(a, "cgroup_path()'s cgroup id")?;
                Ok(Val {
                    ty: Ty::Cgroup { filter },
                    ..v
                })
            }
            // Address spaces: bpfscope reads user memory, then kernel, either way.
            "kptr" | "uptr" => match args {
                [a] => self.expr(a),
                _ => err(span, format!("{name}() takes an address")),
            },
            "path" => err(
                span,
                "path() is not supported by bpfscope run: the kernel's bpf_d_path may only be called by fentry/fexit and LSM programs of a list of functions, and the script machine runs in a program of its own",
            ),
            "system" | "cat" | "printf" | "print" | "time" | "join" | "clear" | "zero"
            | "delete" | "exit" => err(
                span,
                format!("{name}() is a statement: it has no value to assign or compare"),
            ),
            "count" | "sum" | "avg" | "min" | "max" | "stats" | "hist" | "lhist" => err(
                span,
                format!("{name}() must be assigned to a map, e.g. @x = {name}(...)"),
            ),
            _ => err(span, format!("unknown or unsupported function {name}()")),
        }
    }
}

impl<'a> Lower<'a> {
    /// An argument that must be an integer.
    fn num_arg(&mut self, a: &Expr, what: &str) -> Res<Val> {
        let v = self.expr(a)?;
        if !v.ty.is_num() {
            return err(
                a.span,
                format!("{what} must be an integer, not {}", describe_ty(v.ty)),
            );
        }
        Ok(v)
    }
}

pub(super) fn arg_kind(t: Ty) -> crate::render::bpftrace::ArgKind {
    use crate::render::bpftrace::ArgKind;
    match t {
        Ty::Int { .. } | Ty::Ptr { .. } | Ty::IntPtr { .. } => ArgKind::Int,
        Ty::Str | Ty::User | Ty::Inet | Ty::KSym | Ty::USym => ArgKind::Str,
        Ty::Time { .. } | Ty::Errno | Ty::Cgroup { .. } | Ty::Mac => ArgKind::Str,
        Ty::Buf => ArgKind::Buf,
        Ty::Stack { .. } => ArgKind::Stack,
    }
}

/// A builtin's name (not a type's, in sizeof()).
pub(super) fn is_builtin(n: &str) -> bool {
    const BUILTINS: &[&str] = &[
        "pid", "tid", "uid", "gid", "cpu", "cgroup", "nsecs", "elapsed", "curtask", "rand",
        "jiffies", "kstack", "ustack", "username", "probe", "func", "retval", "args", "comm",
    ];
    BUILTINS.contains(&n)
        || n.strip_prefix("arg")
            .is_some_and(|i| i.parse::<u8>().is_ok())
}

/// A signal's number by name (`SIGKILL` or `KILL`), as signal() takes it.
pub(super) fn signal_number(name: &str) -> Option<i64> {
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

/// A kernel symbol's address, as root reads it from /proc/kallsyms.
pub(super) fn kallsyms_addr(sym: &str) -> Option<u64> {
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
