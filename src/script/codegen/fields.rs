//! Record fields, probe arguments and BTF members of typed pointers.

use super::*;

impl<'a> Lower<'a> {
    /// `args->name`, `args.name`, and member paths from them.
    pub(super) fn field(&mut self, e: &Expr) -> Res<Val> {
        if let Some(TVal::One(v)) = self.map_tuple(e, false)? {
            return Ok(v);
        }
        if let (ExprKind::Map { name, .. }, true) = (&e.member_chain().0.kind, self.sh.typing) {
            // A member of a map the types pass has not typed yet (`@n =
            // (1, @n.1 + 1)`): waits in the first phase, then reads as an
            // integer, as an untyped map does.
            if self.sh.map_id(&name_or_at(name)).is_none() {
                if self.sh.strict {
                    return err(e.span, format!("{} is not typed yet", name_or_at(name)));
                }
                return self.int(0, e.span);
            }
        }
        if self.map_tuple_at(e).is_some() {
            return err(
                e.span,
                "this member is a tuple: print it, or take a member of it (.0)",
            );
        }
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
    pub(super) fn member_addr(
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
    pub(super) fn members(
        &mut self,
        v: Val,
        btf: u32,
        parts: &[(&str, bool)],
        span: Span,
    ) -> Res<Val> {
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
                Val::at(ty, r)
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
                Val::at(Ty::Str, slot)
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

    pub(super) fn ident(&mut self, name: &str, span: Span) -> Res<Val> {
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
    pub(super) fn param_str(&self, e: &Expr) -> Option<String> {
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
}

/// `struct NAME *` in a cast: NAME.
pub(super) fn struct_ptr_name(ty: &str) -> Option<&str> {
    let t = ty.trim().strip_suffix('*')?.trim();
    let t = t.strip_prefix("const ").unwrap_or(t).trim();
    t.strip_prefix("struct ")
        .or_else(|| t.strip_prefix("union "))
        .map(str::trim)
}

pub(super) fn btf_struct(name: &str) -> Option<u32> {
    crate::probe::btf::vmlinux()?.struct_id(name)
}

pub(super) fn arg_src(slot: u16, signed: bool, size: u8) -> bs_src {
    bs_src {
        kind: bs_src_kind::BS_SRC_ARG.0 as u8,
        r#type: bs_val_type::BS_T_NUM.0 as u8,
        size,
        is_signed: signed as u8,
        off: slot,
        ..Default::default()
    }
}
