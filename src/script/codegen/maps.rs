//! Map keys, aggregations, assignments' map declarations and map reads.

use super::*;

impl<'a> Lower<'a> {
    /// The aggregation a call makes, if it is one.
    pub(super) fn agg_fn(&mut self, f: &str, args: &[Expr], span: Span) -> Res<Option<AggFn>> {
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

    pub(super) fn aggregate(
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
        let kinds = self.key_kinds(keys, &keyvals);
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
        let mut flags = sflag;
        match agg {
            AggFn::Min | AggFn::Max | AggFn::Stats => flags |= bs_vm_flags::BS_VMF_MINMAX.0 as u8,
            AggFn::Hist | AggFn::Lhist { .. } => flags |= bs_vm_flags::BS_VMF_BUCKET.0 as u8,
            AggFn::Count => flags |= bs_vm_flags::BS_VMF_COUNT.0 as u8,
            AggFn::Sum | AggFn::Avg => {}
        }
        let def = &self.sh.maps[id as usize];
        if def.slots {
            // No key: the bucket indexes the map's array (map id in arg,
            // its buckets in arg2).
            let mut i = insn(bs_vm_op::BS_VM_AGG, 0, vreg, bucket)
                .flags(flags | bs_vm_flags::BS_VMF_SLOTS.0 as u8)
                .arg(id);
            i.arg2 = def.buckets();
            self.emit(i);
            return Ok(());
        }
        self.build_key(id, &keyvals);
        self.emit(insn(bs_vm_op::BS_VM_AGG, 0, vreg, bucket).flags(flags));
        Ok(())
    }

    /// Key parts evaluated (before the key buffer is touched: a part may
    /// itself read a map).
    /// A map's key parts; a tuple's members are parts of their own
    /// (`@m[(a, b)]` is `@m[a, b]`).
    pub(super) fn keys(&mut self, keys: &[Expr]) -> Res<Vec<Val>> {
        let mut out = Vec::with_capacity(keys.len());
        for k in keys {
            match self.tuple_of(k)? {
                Some(t) => t.flatten(&mut out),
                None => out.push(self.expr(k)?),
            }
        }
        Ok(out)
    }

    /// Key parts as `declare` takes them: each one's type and the bytes
    /// it needs. A string part needs what its expression can hold: comm
    /// 16 bytes, a literal its length and NUL, anything else (a variable,
    /// str(), a tuple's member) a whole slot.
    pub(super) fn key_kinds(&self, keys: &[Expr], vals: &[Val]) -> Vec<(Ty, usize)> {
        // A tuple key was flattened: its members' expressions are not at hand.
        let exact = keys.len() == vals.len();
        vals.iter()
            .enumerate()
            .map(|(i, v)| {
                let len = match (v.ty, exact.then(|| &keys[i].kind)) {
                    (t, _) if !t.in_slot() => 8,
                    (Ty::Str, Some(ExprKind::Ident(n)))
                        if n == "comm" && !self.sh.defines.contains_key(n) =>
                    {
                        COMM_LEN
                    }
                    (Ty::Str, Some(ExprKind::Str(s))) => crate::filter::raw::len(s) + 1,
                    _ => STR_MAX,
                };
                (v.ty.plain(), len)
            })
            .collect()
    }

    /// The key of map `id`, each part where its map keeps it (the zeros
    /// past the key are set by `finish_keys`, once every map's key length
    /// is known).
    pub(super) fn build_key(&mut self, id: u32, vals: &[Val]) {
        // The most common key, one integer (`@start[tid]`), in one step.
        if let [v] = vals {
            if !v.ty.in_slot() {
                self.emit(insn(bs_vm_op::BS_VM_KEY1, 0, v.loc, 0).arg(id));
                return;
            }
        }
        self.emit(insn(bs_vm_op::BS_VM_KEYCLR, 0, 0, 0).arg(id));
        let parts = self
            .sh
            .maps
            .get(id as usize)
            .map(|m| m.keys.clone())
            .unwrap_or_default();
        // A map declared has a part per value; the layout before parts had
        // lengths (whole slots) otherwise.
        let mut off = KEY_ID_LEN;
        for (i, v) in vals.iter().enumerate() {
            let whole = if v.ty.in_slot() { STR_MAX } else { 8 };
            let (at, len) = parts.get(i).map_or((off, whole), |p| (p.off, p.len));
            if v.ty.in_slot() {
                let mut k = insn(bs_vm_op::BS_VM_KEYSTR, 0, v.loc, 0).arg(at as u32);
                k.arg2 = len as u32;
                self.emit(k);
            } else {
                self.emit(insn(bs_vm_op::BS_VM_KEYNUM, 0, v.loc, 0).arg(at as u32));
            }
            off = at + len;
        }
    }

    pub(super) fn map_read(&mut self, name: &str, keys: &[Expr], span: Span) -> Res<Val> {
        let m = name_or_at(name);
        let keyvals = self.keys(keys)?;
        let Some(id) = self.sh.map_id(&m) else {
            if !self.sh.defined.contains(&m) {
                return self.sh.undefined(&m, span);
            }
            if self.sh.strict {
                return err(span, format!("{m} is not typed yet"));
            }
            // Written only in skipped blocks (or later, in the first pass):
            // it reads as 0, as in bpftrace.
            return self.int(0, span);
        };
        let def = self.sh.maps[id as usize].clone();
        if def.tuple.is_some() {
            return err(
                span,
                format!("{m} holds tuples: print one, assign it to a $variable, or take a member ({m}[...].0)"),
            );
        }
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
        self.mget(ty, span)
    }
}
