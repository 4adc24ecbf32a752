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
            _ => Ok(self
                .tuple_path(e)
                .filter(|p| self.tuples.contains_key(p))
                .map(|p| self.tuple_var(&p))),
        }
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
            let (loc, text) = if k.ty.in_slot() {
                (self.slot(span)?, 1)
            } else {
                (self.reg(span)?, 0)
            };
            let mut i = insn(bs_vm_op::BS_VM_KEYGET, loc, 0, 0).arg(k.off as u32);
            i.arg2 = text;
            self.emit(i);
            parts.push(TVal::One(Val::at(k.ty, loc)));
        }
        let value = if vty.in_slot() {
            Val::at(vty, vslot)
        } else {
            let r = self.reg(span)?;
            self.emit(insn(bs_vm_op::BS_VM_SVNUM, r, vslot, 0));
            Val::at(vty, r)
        };
        let key = if parts.len() == 1 {
            parts.remove(0)
        } else {
            TVal::Many(parts)
        };
        self.scopes.push(vec![var.to_string()]);
        let r = self
            .bind_tuple(var, TVal::Many(vec![key, TVal::One(value)]), span)
            .and_then(|_| {
                self.reset_tmps();
                self.loop_body(top, done, body)
            });
        self.pop_scope();
        r
    }
}
