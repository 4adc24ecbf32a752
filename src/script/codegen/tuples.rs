//! Tuples (members as variables of their own) and for-each over maps.

use super::*;

impl<'a> Lower<'a> {
    /// A variable out of scope: itself, or a tuple and its members.
    pub(super) fn forget(&mut self, name: &str) {
        self.vars.remove(name);
        if self.tuples.remove(name).is_some() {
            let members = format!("{name}.");
            self.vars.retain(|n, _| !n.starts_with(&members));
            self.tuples.retain(|n, _| !n.starts_with(&members));
        }
    }

    /// The tuple an expression makes, if it makes one: a literal, a
    /// tuple variable or a member of one that is a tuple itself.
    pub(super) fn tuple_of(&mut self, e: &Expr) -> Res<Option<TVal>> {
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
            _ if self.map_tuple_at(e).is_some() => self.map_tuple(e, true),
            _ => Ok(self
                .tuple_path(e)
                .filter(|p| self.tuples.contains_key(p))
                .map(|p| self.tuple_var(&p))),
        }
    }

    /// The shape at a member chain on a map of tuples (`@m[k]`,
    /// `@m[k].1.0`), if `e` is one and the members exist; nothing is read.
    pub(super) fn map_tuple_at(&self, e: &Expr) -> Option<TShape> {
        let (base, parts) = e.member_chain();
        let ExprKind::Map { name, .. } = &base.kind else {
            return None;
        };
        let id = self.sh.map_id(&name_or_at(name))?;
        let mut at = self.sh.maps[id as usize].tuple.as_ref()?;
        for (f, arrow) in parts {
            let i: usize = f.parse().ok().filter(|_| !arrow)?;
            match at {
                TShape::Tuple(m) => at = m.get(i)?,
                TShape::Value => return None,
            }
        }
        Some(at.clone())
    }

    /// A map of tuples read (`@m[k]`), or a member of its tuple
    /// (`@m[k].1`): only the member maps that hold it are read. None when
    /// `e` is not one, or is not a tuple when `tuple` (a value when not).
    pub(super) fn map_tuple(&mut self, e: &Expr, tuple: bool) -> Res<Option<TVal>> {
        let (base, parts) = e.member_chain();
        let ExprKind::Map { name, keys } = &base.kind else {
            return Ok(None);
        };
        let m = name_or_at(name);
        let Some(id) = self.sh.map_id(&m) else {
            return Ok(None);
        };
        let Some(shape) = self.sh.maps[id as usize].tuple.clone() else {
            return Ok(None);
        };
        // The members' place among the flattened values: the ones before.
        let (mut at, mut first) = (&shape, 0);
        for (f, arrow) in &parts {
            let members = match at {
                TShape::Tuple(m) => m,
                TShape::Value => {
                    return err(
                        e.span,
                        format!("{m}'s tuples have no member .{f} (it is a value)"),
                    )
                }
            };
            match f.parse::<usize>() {
                Ok(i) if !arrow && i < members.len() => {
                    first += members[..i].iter().map(TShape::leaves).sum::<usize>();
                    at = &members[i];
                }
                _ => {
                    return err(
                        e.span,
                        format!(
                            "{m}'s tuples have {} members: .{f} is not one of them",
                            members.len()
                        ),
                    )
                }
            }
        }
        if matches!(at, TShape::Tuple(_)) != tuple {
            return Ok(None);
        }
        let keyvals = self.keys(keys)?;
        let def = &self.sh.maps[id as usize];
        if def.keys.len() != keyvals.len() {
            return err(e.span, format!("{m} has {} key parts", def.keys.len()));
        }
        let mut vals = Vec::with_capacity(at.leaves());
        for i in first..first + at.leaves() {
            let n = member_map(&m, i);
            let Some(mid) = self.sh.map_id(&n) else {
                return err(e.span, format!("{n} is not typed yet"));
            };
            let MapKind::Plain(ty) = self.sh.maps[mid as usize].kind else {
                return err(e.span, format!("{n} holds no tuple member"));
            };
            if i == first {
                self.build_key(mid, &keyvals);
            } else {
                // The same key parts: only the map id changes.
                self.emit(insn(bs_vm_op::BS_VM_KEYCLR, 0, 0, 0).arg(mid));
            }
            vals.push(self.mget(ty, e.span)?);
        }
        Ok(Some(TVal::shaped(at, &mut vals.into_iter())))
    }

    /// The value of type `ty` under the key built, in a new register or slot.
    pub(super) fn mget(&mut self, ty: Ty, span: Span) -> Res<Val> {
        if ty.in_slot() {
            let slot = self.slot(span)?;
            self.emit(insn(bs_vm_op::BS_VM_MGETSTR, slot, 0, 0));
            return Ok(Val::at(ty, slot));
        }
        let r = self.reg(span)?;
        self.emit(insn(bs_vm_op::BS_VM_MGET, r, 0, 0));
        Ok(Val::at(ty, r))
    }

    /// `@m[k] = (a, b)`: each member into its map, under one key.
    pub(super) fn map_tuple_set(
        &mut self,
        name: &str,
        keys: &[Expr],
        t: &TVal,
        span: Span,
    ) -> Res<()> {
        let keyvals = self.keys(keys)?;
        let kinds = self.key_kinds(keys, &keyvals);
        let mut vals = Vec::new();
        t.flatten(&mut vals);
        let tys = vals
            .iter()
            .map(|v| value_ty(v.ty, span))
            .collect::<Res<Vec<Ty>>>()?;
        let ids = self
            .sh
            .declare_tuple(&name_or_at(name), &t.shape(), &tys, &kinds, span)?;
        for (i, (id, v)) in ids.iter().zip(&vals).enumerate() {
            if i == 0 {
                self.build_key(*id, &keyvals);
            } else {
                self.emit(insn(bs_vm_op::BS_VM_KEYCLR, 0, 0, 0).arg(*id));
            }
            let op = if v.ty.in_slot() {
                bs_vm_op::BS_VM_MSETSTR
            } else {
                bs_vm_op::BS_VM_MSET
            };
            self.emit(insn(op, 0, v.loc, 0));
        }
        Ok(())
    }

    /// `$t.1.0` as the variable holding it (`t.1.0`); None for any other
    /// expression.
    pub(super) fn tuple_path(&self, e: &Expr) -> Option<String> {
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

    pub(super) fn tuple_var(&self, name: &str) -> TVal {
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
    pub(super) fn bind_tuple(&mut self, name: &str, t: TVal, span: Span) -> Res<()> {
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
    pub(super) fn for_each(&mut self, var: &str, map: &str, body: &[Stmt], span: Span) -> Res<()> {
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
            // A string part's length (its slot is padded past it); 0: a number.
            let (loc, text) = if k.ty.in_slot() {
                (self.slot(span)?, k.len as u32)
            } else {
                (self.reg(span)?, 0)
            };
            let mut i = insn(bs_vm_op::BS_VM_KEYGET, loc, 0, 0).arg(k.off as u32);
            i.arg2 = text;
            self.emit(i);
            parts.push(TVal::One(Val::at(k.ty, loc)));
        }
        let first = if vty.in_slot() {
            Val::at(vty, vslot)
        } else {
            let r = self.reg(span)?;
            self.emit(insn(bs_vm_op::BS_VM_SVNUM, r, vslot, 0));
            Val::at(vty, r)
        };
        // A map of tuples: the other members from their maps, by the key found.
        let value = match self.sh.maps[id as usize].tuple.clone() {
            None => TVal::One(first),
            Some(shape) => {
                let mut vals = vec![first];
                for i in 1..shape.leaves() {
                    let n = member_map(&mname, i);
                    let Some(mid) = self.sh.map_id(&n) else {
                        return err(span, format!("{n} is not typed yet"));
                    };
                    let MapKind::Plain(ty) = self.sh.maps[mid as usize].kind else {
                        return err(span, format!("{n} holds no tuple member"));
                    };
                    self.emit(insn(bs_vm_op::BS_VM_KEYCLR, 0, 0, 0).arg(mid));
                    vals.push(self.mget(ty, span)?);
                }
                TVal::shaped(&shape, &mut vals.into_iter())
            }
        };
        let key = if parts.len() == 1 {
            parts.remove(0)
        } else {
            TVal::Many(parts)
        };
        self.scopes.push(vec![var.to_string()]);
        let r = self
            .bind_tuple(var, TVal::Many(vec![key, value]), span)
            .and_then(|_| {
                self.reset_tmps();
                self.loop_body(top, done, body)
            });
        self.pop_scope();
        r
    }
}
