//! The second pass's tables: the script's maps with their key layouts,
//! the printf/print actions, value sources and constant strings every
//! probe's code refers to by index, and the completion of the code once
//! all maps are known (`finish_keys`, `check_size`).

use std::collections::HashMap;

use bpfscope_bpf::abi::{bs_insn, bs_src, bs_vm_op};

use super::{ir::*, types::*};
use crate::filter::StrTable;
use crate::lang::ast::*;

/// State shared by every probe's lowering: maps, actions, sources, strings.
#[derive(Default)]
pub struct Shared {
    pub maps: Vec<MapDef>,
    pub actions: Vec<Action>,
    pub srcs: Vec<bs_src>,
    pub(crate) src_index: HashMap<Vec<u8>, u32>,
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
    /// Texts values are shown with in user space (strftime()'s formats,
    /// cgroup_path()'s filters), by index.
    pub texts: Vec<String>,
    /// `--unsafe`: signal() may be used.
    pub unsafe_ok: bool,
    /// The types pass is walking: a statement that fails (a map it reads
    /// is not typed yet) is skipped, not the rest of its block.
    pub typing: bool,
    /// ... and an untyped map is not read as an integer (yet: see
    /// `types::infer`).
    pub strict: bool,
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
    pub(crate) fn undefined<T>(&self, name: &str, span: Span) -> Res<T> {
        err(
            span,
            format!("Undefined map: {name} (no statement of the script assigns it)"),
        )
    }

    pub(crate) fn map_id(&self, name: &str) -> Option<u32> {
        self.maps
            .iter()
            .position(|m| m.name == name)
            .map(|i| i as u32)
    }

    pub(crate) fn src(&mut self, s: bs_src) -> u32 {
        let key = bpfscope_sys::pod::bytes(&s).to_vec();
        if let Some(i) = self.src_index.get(&key) {
            return *i;
        }
        self.srcs.push(s);
        let i = (self.srcs.len() - 1) as u32;
        self.src_index.insert(key, i);
        i
    }

    /// A text's index (one entry per distinct text).
    pub(crate) fn text(&mut self, t: &str, span: Span) -> Res<u16> {
        if let Some(i) = self.texts.iter().position(|x| x == t) {
            return Ok(i as u16);
        }
        if self.texts.len() >= usize::from(NO_TEXT) {
            return err(span, "too many distinct formats in one script");
        }
        self.texts.push(t.to_string());
        Ok((self.texts.len() - 1) as u16)
    }

    pub(crate) fn action(&mut self, a: Action) -> u32 {
        if let Some(i) = self.actions.iter().position(|x| *x == a) {
            return i as u32;
        }
        self.actions.push(a);
        (self.actions.len() - 1) as u32
    }

    /// Declares a map's kind and key on first use; later uses must agree.
    /// `keys`: each part's type and the bytes it needs (see `KeyPart`).
    pub(crate) fn declare(
        &mut self,
        name: &str,
        kind: MapKind,
        keys: &[(Ty, usize)],
        span: Span,
    ) -> Res<u32> {
        self.declare_as(name, kind, keys, None, span)
    }

    /// A map of tuples of `shape` whose members have types `tys`: the map
    /// (the first member) and its member maps, their ids in member order.
    pub(crate) fn declare_tuple(
        &mut self,
        name: &str,
        shape: &TShape,
        tys: &[Ty],
        keys: &[(Ty, usize)],
        span: Span,
    ) -> Res<Vec<u32>> {
        let mut ids = Vec::with_capacity(tys.len());
        for (i, ty) in tys.iter().enumerate() {
            let tuple = (i == 0).then_some(shape);
            let n = member_map(name, i);
            let id = self
                .declare_as(&n, MapKind::Plain(*ty), keys, tuple, span)
                .map_err(|mut e| {
                    // Said of the member, not of the map that holds it.
                    if i > 0 {
                        e.msg = e.msg.replacen(
                            &format!("{n} holds"),
                            &format!("{name}'s tuples: member {i} (counting nested ones) holds"),
                            1,
                        );
                    }
                    e
                })?;
            ids.push(id);
        }
        Ok(ids)
    }

    fn declare_as(
        &mut self,
        name: &str,
        kind: MapKind,
        keys: &[(Ty, usize)],
        tuple: Option<&TShape>,
        span: Span,
    ) -> Res<u32> {
        let tys: Vec<Ty> = keys.iter().map(|k| k.0).collect();
        if let Some(id) = self.map_id(name) {
            let m = &mut self.maps[id as usize];
            let same_keys = m.keys.len() == keys.len()
                && m.keys.iter().zip(keys).all(|(a, b)| same_ty(a.ty, b.0));
            if !same_keys {
                return err(
                    span,
                    format!(
                        "{name} is used with keys of different types ({} here, {} before)",
                        describe_keys(&tys),
                        describe_keys(&m.keys.iter().map(|k| k.ty).collect::<Vec<_>>())
                    ),
                );
            }
            match (&m.tuple, tuple) {
                (None, None) => {}
                (Some(a), Some(b)) if a == b => {}
                (Some(_), Some(_)) => {
                    return err(
                        span,
                        format!(
                            "{name} holds tuples of another shape (members and nesting must agree)"
                        ),
                    )
                }
                (Some(_), None) => {
                    return err(
                        span,
                        format!(
                            "{name} holds tuples and cannot also hold {}",
                            describe_kind(kind)
                        ),
                    )
                }
                (None, Some(_)) => {
                    return err(
                        span,
                        format!(
                            "{name} holds {} and cannot also hold a tuple",
                            describe_kind(m.kind)
                        ),
                    )
                }
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
            // A part widens to the longest string any use puts in it.
            let lens: Vec<usize> = m
                .keys
                .iter()
                .zip(keys)
                .map(|(a, b)| a.len.max(b.1))
                .collect();
            if lens.iter().zip(&m.keys).any(|(l, p)| *l != p.len) {
                m.keys = key_parts(&tys, &lens, name, span)?;
            }
            return Ok(id);
        }
        let lens: Vec<usize> = keys.iter().map(|k| k.1).collect();
        let parts = key_parts(&tys, &lens, name, span)?;
        self.maps.push(MapDef {
            name: name.to_string(),
            kind,
            keys: parts,
            tuple: tuple.cloned(),
            slots: false,
            thread: false,
            thread_print: false,
            task_key: false,
            cache: None,
        });
        Ok((self.maps.len() - 1) as u32)
    }
}

/// A key's parts laid out in order after the map's id: numbers take 8
/// bytes, a string part `len` (at most a slot, in whole words).
fn key_parts(tys: &[Ty], lens: &[usize], name: &str, span: Span) -> Res<Vec<KeyPart>> {
    let mut off = KEY_ID_LEN;
    let mut parts = Vec::with_capacity(tys.len());
    for (&ty, &len) in tys.iter().zip(lens) {
        let len = if ty.in_slot() {
            len.clamp(8, STR_MAX).next_multiple_of(8)
        } else {
            8
        };
        parts.push(KeyPart { ty, off, len });
        off += len;
    }
    if off > KEY_MAX {
        return err(
            span,
            format!("{name}'s key takes {off} bytes; at most {KEY_MAX} fit (strings take up to {STR_MAX})"),
        );
    }
    Ok(parts)
}

/// Macros of the kernel headers scripts include (`#include <linux/sched.h>`):
/// BTF has enums, not macros, so the ones the shipped tools use are here.
pub(crate) const KNOWN_CONSTS: &[(&str, i64)] = &[
    ("TASK_RUNNING", 0),
    ("TASK_INTERRUPTIBLE", 1),
    ("TASK_UNINTERRUPTIBLE", 2),
    ("AF_INET", 2),
    ("AF_INET6", 10),
    ("AF_UNIX", 1),
];

/// A map's name as bpftrace prints it (the parser keeps it without its '@').
pub(crate) fn name_or_at(n: &str) -> String {
    format!("@{}", n.trim_start_matches('@'))
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
