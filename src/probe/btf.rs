//! Kernel BTF (/sys/kernel/btf/vmlinux): signatures of kernel functions,
//! and member paths such as `skb->dev->name` resolved to the offsets the
//! BPF side follows with bounded probe reads.

use std::cell::OnceCell;
use std::collections::HashMap;
use std::rc::Rc;

use libbpf_rs::btf::types::{Array, Composite, Enum, Enum64, FuncProto, Int, MemberAttr};
use libbpf_rs::btf::{Btf, BtfKind, BtfType, HasSize, TypeId};

use bpfscope_bpf::abi::bs_limits;

const MAX_DEREF: usize = bs_limits::BS_MAX_DEREF.0 as usize;
/// Argument registers of the x86-64 calling convention (what kprobes read).
pub const ARG_REGS: u8 = 6;

/// The parsed vmlinux BTF and an index of its functions.
pub struct KernelBtf {
    btf: Btf<'static>,
    funcs: HashMap<String, TypeId>,
    /// Enum constants by name, indexed on first use.
    enums: OnceCell<HashMap<String, i64>>,
}

thread_local! {
    // Btf is not Send; one parse per thread (in practice, per run) is what is wanted.
    static VMLINUX: OnceCell<Option<Rc<KernelBtf>>> = const { OnceCell::new() };
}

/// The running kernel's BTF, parsed on first use; None when the kernel has none.
pub fn vmlinux() -> Option<Rc<KernelBtf>> {
    VMLINUX.with(|c| c.get_or_init(|| KernelBtf::load().map(Rc::new)).clone())
}

/// How a value of some type is read and shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    Int {
        size: u8,
        signed: bool,
    },
    Pointer,
    /// `char *` into kernel memory.
    KernelStr,
    /// `char __user *`.
    UserStr,
    /// `char name[N]` in place.
    CharArray(u16),
    /// Any other array of integers in place (`__u8 addr[16]`, `int v[4]`):
    /// its element size and signedness, and its length.
    Array {
        elem: u8,
        signed: bool,
        len: u32,
    },
    /// A struct or union: only its members can be read.
    Composite,
    Unsupported,
}

/// One parameter of a function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Param {
    pub name: Option<String>,
    pub ty: u32,
    /// Argument register (u64 slot) holding it; None past the registers or
    /// after a parameter passed by value in several slots or in memory.
    pub slot: Option<u8>,
}

/// A kernel function's prototype.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FuncSig {
    /// BTF id of the FUNC (the attach target of fentry/fexit).
    pub func_id: u32,
    /// Return type id; 0 is void.
    pub ret: u32,
    pub params: Vec<Param>,
}

/// `a->b.c` after the base name: each step's separator and member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub arrow: bool,
    pub member: String,
}

/// Splits `base->m1.m2` into the base name and its steps; None when it has no steps.
pub fn split_path(name: &str) -> Option<(&str, Vec<Step>)> {
    let first = name.find(['.', '-'])?;
    let (base, mut rest) = name.split_at(first);
    let mut steps = Vec::new();
    while !rest.is_empty() {
        let (arrow, after) = if let Some(r) = rest.strip_prefix("->") {
            (true, r)
        } else if let Some(r) = rest.strip_prefix('.') {
            (false, r)
        } else {
            return None;
        };
        let end = after.find(['.', '-']).unwrap_or(after.len());
        steps.push(Step {
            arrow,
            member: after[..end].to_string(),
        });
        rest = &after[end..];
    }
    Some((base, steps))
}

/// Whether a name is an identifier or a member path of identifiers (`a->b.c`).
pub fn is_field_path(name: &str) -> bool {
    let ident = |w: &str| {
        !w.is_empty()
            && w.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !w.starts_with(|c: char| c.is_ascii_digit())
    };
    match split_path(name) {
        Some((base, steps)) => ident(base) && steps.iter().all(|s| ident(&s.member)),
        None => ident(name),
    }
}

/// A member path resolved against BTF: what the BPF side follows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Walk {
    /// Offsets of the pointers followed, in order.
    pub path: Vec<u16>,
    /// Offset of the value from the last pointer.
    pub leaf_off: u16,
    pub ty: u32,
    pub shape: Shape,
}

impl KernelBtf {
    fn load() -> Option<KernelBtf> {
        let btf = Btf::from_vmlinux().ok()?;
        let funcs = (1..btf.len() as u32)
            .filter_map(|id| {
                let t = btf.type_by_id::<BtfType<'_>>(TypeId::from(id))?;
                if t.kind() != BtfKind::Func {
                    return None;
                }
                Some((t.name()?.to_str()?.to_string(), TypeId::from(id)))
            })
            .collect();
        Some(KernelBtf {
            btf,
            funcs,
            enums: OnceCell::new(),
        })
    }

    /// The value of an enum constant (`SKB_DROP_REASON_NOT_SPECIFIED`,
    /// `TCP_ESTABLISHED`), as a script names it.
    pub fn enum_value(&self, name: &str) -> Option<i64> {
        self.enums
            .get_or_init(|| {
                let mut m = HashMap::new();
                for id in 1..self.btf.len() as u32 {
                    let Some(t) = self.ty(id) else { continue };
                    if let Ok(e) = Enum::try_from(t) {
                        for v in e.iter() {
                            if let Some(n) = v.name.and_then(|n| n.to_str()) {
                                m.entry(n.to_string()).or_insert(v.value);
                            }
                        }
                    } else if let Ok(e) = Enum64::try_from(t) {
                        for v in e.iter() {
                            if let Some(n) = v.name.and_then(|n| n.to_str()) {
                                m.entry(n.to_string()).or_insert(v.value as i64);
                            }
                        }
                    }
                }
                m
            })
            .get(name)
            .copied()
    }

    /// Bytes of `struct NAME`, `union NAME`, `enum NAME` or a typedef, as
    /// sizeof() takes them.
    pub fn size_of_named(&self, name: &str) -> Option<u64> {
        let (kinds, bare): (&[BtfKind], &str) = if let Some(n) = name.strip_prefix("struct ") {
            (&[BtfKind::Struct], n.trim())
        } else if let Some(n) = name.strip_prefix("union ") {
            (&[BtfKind::Union], n.trim())
        } else if let Some(n) = name.strip_prefix("enum ") {
            (&[BtfKind::Enum, BtfKind::Enum64], n.trim())
        } else {
            (&[BtfKind::Typedef, BtfKind::Int], name.trim())
        };
        (1..self.btf.len() as u32).find_map(|id| {
            let t = self.ty(id)?;
            if !kinds.contains(&t.kind()) || t.name().and_then(|n| n.to_str()) != Some(bare) {
                return None;
            }
            self.size_of(self.resolve(t)).map(|s| s as u64)
        })
    }

    /// Names of every function BTF describes.
    pub fn func_names(&self) -> impl Iterator<Item = &str> {
        self.funcs.keys().map(String::as_str)
    }

    fn ty(&self, id: u32) -> Option<BtfType<'_>> {
        self.btf.type_by_id(TypeId::from(id))
    }

    /// The prototype of a kernel function, when BTF describes it.
    pub fn func(&self, name: &str) -> Option<FuncSig> {
        let id = *self.funcs.get(name)?;
        let func = self.btf.type_by_id::<BtfType<'_>>(id)?;
        let proto = FuncProto::try_from(func.next_type()?).ok()?;
        let ret = proto.next_type().map_or(0, |t| u32::from(t.type_id()));
        let mut slot = 0u8;
        let mut lost = false;
        let params = proto
            .iter()
            .map(|p| {
                let ty = u32::from(p.ty);
                let fits = matches!(
                    self.shape(ty),
                    Shape::Int { .. } | Shape::Pointer | Shape::KernelStr | Shape::UserStr
                );
                // A struct or float argument takes registers bpfscope does not
                // track: later parameters cannot be placed reliably.
                lost |= !fits;
                let s = (!lost && slot < ARG_REGS).then_some(slot);
                slot = slot.saturating_add(1);
                Param {
                    name: p.name.and_then(|n| n.to_str()).map(str::to_string),
                    ty,
                    slot: s,
                }
            })
            .collect();
        Some(FuncSig {
            func_id: u32::from(id),
            ret: if self.ty(ret).is_some_and(|t| t.kind() == BtfKind::Void) {
                0
            } else {
                ret
            },
            params,
        })
    }

    /// `ssize_t vfs_read(struct file *file, char *buf, size_t count, loff_t *pos)`.
    pub fn signature(&self, name: &str, sig: &FuncSig) -> String {
        let params: Vec<String> = sig
            .params
            .iter()
            .map(|p| {
                let t = self.type_name(p.ty);
                match &p.name {
                    Some(n) if t.ends_with('*') => format!("{t}{n}"),
                    Some(n) => format!("{t} {n}"),
                    None => t,
                }
            })
            .collect();
        let ret = self.type_name(sig.ret);
        let sep = if ret.ends_with('*') { "" } else { " " };
        format!("{ret}{sep}{name}({})", params.join(", "))
    }

    /// The C spelling of a type.
    pub fn type_name(&self, id: u32) -> String {
        self.type_name_depth(id, 0)
    }

    fn type_name_depth(&self, id: u32, depth: u32) -> String {
        let Some(t) = self.ty(id) else {
            return "?".into();
        };
        if depth > 16 {
            return "...".into();
        }
        let name = || t.name().and_then(|n| n.to_str()).unwrap_or("");
        let inner = || {
            t.next_type().map_or("void".to_string(), |n| {
                self.type_name_depth(u32::from(n.type_id()), depth + 1)
            })
        };
        match t.kind() {
            BtfKind::Void => "void".into(),
            BtfKind::Int | BtfKind::Float | BtfKind::Typedef => name().into(),
            BtfKind::Struct => format!("struct {}", or_anon(name())),
            BtfKind::Union => format!("union {}", or_anon(name())),
            BtfKind::Enum | BtfKind::Enum64 => format!("enum {}", or_anon(name())),
            BtfKind::Fwd => format!("struct {}", name()),
            BtfKind::Ptr => {
                if t.next_type()
                    .is_some_and(|n| n.kind() == BtfKind::FuncProto)
                {
                    return "void (*)()".into();
                }
                let i = inner();
                if i.ends_with('*') {
                    format!("{i}*")
                } else {
                    format!("{i} *")
                }
            }
            BtfKind::Const => format!("const {}", inner()),
            BtfKind::Volatile => format!("volatile {}", inner()),
            BtfKind::TypeTag if name() == "user" => format!("{} __user", inner()),
            BtfKind::Restrict | BtfKind::TypeTag | BtfKind::DeclTag => inner(),
            BtfKind::Array => match Array::try_from(t) {
                Ok(a) => format!(
                    "{}[{}]",
                    self.type_name_depth(u32::from(a.ty()), depth + 1),
                    a.capacity()
                ),
                Err(_) => "?".into(),
            },
            BtfKind::FuncProto => "void ()".into(),
            _ => "?".into(),
        }
    }

    /// Follows typedefs and qualifiers.
    fn resolve<'s>(&'s self, t: BtfType<'s>) -> BtfType<'s> {
        let mut t = t;
        for _ in 0..32 {
            if !(t.is_mod() || t.kind() == BtfKind::Typedef) {
                break;
            }
            match t.next_type() {
                Some(n) => t = n,
                None => break,
            }
        }
        t
    }

    /// Size in bytes of a type, when it has one.
    fn size_of(&self, t: BtfType<'_>) -> Option<usize> {
        let t = self.resolve(t);
        match t.kind() {
            BtfKind::Int => Int::try_from(t).ok().map(|i| i.size()),
            BtfKind::Enum => Enum::try_from(t).ok().map(|e| e.size()),
            BtfKind::Enum64 => Enum64::try_from(t).ok().map(|e| e.size()),
            BtfKind::Ptr => Some(8),
            BtfKind::Struct | BtfKind::Union => Composite::try_from(t).ok().map(|c| c.size()),
            _ => None,
        }
    }

    /// Whether a type, qualifiers aside but typedefs kept, is a char type.
    fn is_char(&self, t: BtfType<'_>) -> bool {
        let mut t = t;
        while t.is_mod() {
            match t.next_type() {
                Some(n) => t = n,
                None => return false,
            }
        }
        t.kind() == BtfKind::Int
            && t.name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.contains("char"))
    }

    /// How a value of this type is read.
    pub fn shape(&self, id: u32) -> Shape {
        let Some(t) = self.ty(id) else {
            return Shape::Unsupported;
        };
        let r = self.resolve(t);
        match r.kind() {
            BtfKind::Int | BtfKind::Enum | BtfKind::Enum64 => {
                let signed = match r.kind() {
                    BtfKind::Int => Int::try_from(r).is_ok_and(|i| {
                        matches!(i.encoding, libbpf_rs::btf::types::IntEncoding::Signed)
                    }),
                    BtfKind::Enum => Enum::try_from(r).is_ok_and(|e| e.is_signed()),
                    _ => Enum64::try_from(r).is_ok_and(|e| e.is_signed()),
                };
                match self.size_of(r) {
                    Some(s @ (1 | 2 | 4 | 8)) => Shape::Int {
                        size: s as u8,
                        signed,
                    },
                    _ => Shape::Unsupported,
                }
            }
            BtfKind::Ptr => {
                let Some(pointee) = r.next_type() else {
                    return Shape::Pointer;
                };
                // `char __user *`: a type tag between the pointer and the char.
                let mut user = false;
                let mut p = pointee;
                while p.is_mod() {
                    if p.kind() == BtfKind::TypeTag
                        && p.name().and_then(|n| n.to_str()) == Some("user")
                    {
                        user = true;
                    }
                    match p.next_type() {
                        Some(n) => p = n,
                        None => break,
                    }
                }
                if self.is_char(p) {
                    if user {
                        Shape::UserStr
                    } else {
                        Shape::KernelStr
                    }
                } else {
                    Shape::Pointer
                }
            }
            BtfKind::Array => match Array::try_from(r) {
                Ok(a) if self.is_char(a.contained_type()) && a.capacity() > 0 => {
                    Shape::CharArray(a.capacity().min(u16::MAX as usize) as u16)
                }
                Ok(a) if a.capacity() > 0 => {
                    match self.shape(u32::from(a.contained_type().type_id())) {
                        Shape::Int { size, signed } => Shape::Array {
                            elem: size,
                            signed,
                            len: a.capacity().min(u32::MAX as usize) as u32,
                        },
                        _ => Shape::Unsupported,
                    }
                }
                _ => Shape::Unsupported,
            },
            BtfKind::Struct | BtfKind::Union => Shape::Composite,
            _ => Shape::Unsupported,
        }
    }

    /// The struct or union a type id stands for, typedefs and qualifiers aside.
    fn composite(&self, id: u32) -> Option<Composite<'_>> {
        self.ty(id)
            .map(|t| self.resolve(t))
            .and_then(|t| Composite::try_from(t).ok())
    }

    /// A member of a struct or union by name, looking into anonymous
    /// members: (bit offset, type id, bitfield).
    fn member(&self, c: &Composite<'_>, name: &str) -> Option<(u32, u32, bool)> {
        for m in c.iter() {
            let (off, bitfield) = match m.attr {
                MemberAttr::Normal { offset } => (offset, false),
                MemberAttr::BitField { offset, .. } => (offset, true),
            };
            match m.name.and_then(|n| n.to_str()) {
                Some(n) if n == name => return Some((off, u32::from(m.ty), bitfield)),
                Some(_) => {}
                None => {
                    if let Some(inner) = self.composite(u32::from(m.ty)) {
                        if let Some((o, t, b)) = self.member(&inner, name) {
                            return Some((off + o, t, b));
                        }
                    }
                }
            }
        }
        None
    }

    /// Member names of a struct or union, anonymous members flattened.
    fn member_names(&self, c: &Composite<'_>, out: &mut Vec<String>) {
        for m in c.iter() {
            match m.name.and_then(|n| n.to_str()) {
                Some(n) => out.push(n.to_string()),
                None => {
                    if let Some(inner) = self.composite(u32::from(m.ty)) {
                        self.member_names(&inner, out);
                    }
                }
            }
        }
    }

    /// The id of `struct NAME` (or union), for a script's pointer casts.
    pub fn struct_id(&self, name: &str) -> Option<u32> {
        (1..self.btf.len() as u32).find(|&id| {
            self.ty(id).is_some_and(|t| {
                matches!(t.kind(), BtfKind::Struct | BtfKind::Union)
                    && t.name().and_then(|n| n.to_str()) == Some(name)
            })
        })
    }

    /// Bytes of the struct or union with this type id.
    pub fn struct_size(&self, id: u32) -> Option<u64> {
        self.size_of(self.resolve(self.ty(id)?)).map(|s| s as u64)
    }

    /// The struct a pointer type points to, if it points to one.
    pub fn pointee_struct(&self, ptr: u32) -> Option<u32> {
        let t = self.resolve(self.ty(ptr)?);
        if t.kind() != BtfKind::Ptr {
            return None;
        }
        let p = self.resolve(t.next_type()?);
        Composite::try_from(p).ok().map(|c| u32::from(c.type_id()))
    }

    /// Resolves member steps from a struct in memory (a script's typed
    /// pointer: its address is known, so `.` steps start from it).
    pub fn walk_in_memory(&self, what: &str, base: u32, steps: &[Step]) -> Result<Walk, String> {
        self.walk_from(what, base, steps, Some(0))
    }

    /// Resolves the steps after a value of type `base` (named `what` in errors).
    pub fn walk(&self, what: &str, base: u32, steps: &[Step]) -> Result<Walk, String> {
        self.walk_from(what, base, steps, None)
    }

    fn walk_from(
        &self,
        what: &str,
        base: u32,
        steps: &[Step],
        start: Option<u32>,
    ) -> Result<Walk, String> {
        let mut ty = base;
        let mut at: Option<u32> = start;
        let mut path: Vec<u32> = Vec::new();
        let mut so_far = what.to_string();
        for step in steps {
            let t = self
                .ty(ty)
                .map(|t| self.resolve(t))
                .ok_or_else(|| format!("'{so_far}' has no type information"))?;
            let composite = if step.arrow {
                if t.kind() != BtfKind::Ptr {
                    return Err(if Composite::try_from(t).is_ok() {
                        format!(
                            "'{so_far}' is a struct, not a pointer: use '{so_far}.{}'",
                            step.member
                        )
                    } else {
                        format!(
                            "'{so_far}' is {}, not a pointer to a struct",
                            self.type_name(ty)
                        )
                    });
                }
                let pointee = t.next_type().map(|p| self.resolve(p));
                let c = pointee
                    .and_then(|p| Composite::try_from(p).ok())
                    .ok_or_else(|| {
                        format!(
                            "'{so_far}' is {}, not a pointer to a struct",
                            self.type_name(ty)
                        )
                    })?;
                // The pointer itself is in memory unless it is the argument.
                if let Some(o) = at {
                    path.push(o);
                }
                at = Some(0);
                c
            } else {
                if t.kind() == BtfKind::Ptr {
                    return Err(format!(
                        "'{so_far}' is a pointer: use '{so_far}->{}'",
                        step.member
                    ));
                }
                let c = Composite::try_from(t)
                    .map_err(|_| format!("'{so_far}' is {}, not a struct", self.type_name(ty)))?;
                if at.is_none() {
                    return Err(format!(
                        "'{so_far}' is a struct passed by value, which bpfscope cannot read"
                    ));
                }
                c
            };
            let (bits, mty, bitfield) = self.member(&composite, &step.member).ok_or_else(|| {
                let mut names = Vec::new();
                self.member_names(&composite, &mut names);
                format!(
                    "{} has no member '{}'; its members: {}",
                    self.type_name(u32::from(composite.type_id())),
                    step.member,
                    names.join(", ")
                )
            })?;
            so_far = format!(
                "{so_far}{}{}",
                if step.arrow { "->" } else { "." },
                step.member
            );
            if bitfield || bits % 8 != 0 {
                return Err(format!(
                    "'{so_far}' is a bit field, which bpfscope cannot read"
                ));
            }
            at = at.map(|o| o + bits / 8);
            ty = mty;
        }
        if path.len() > MAX_DEREF {
            return Err(format!(
                "'{so_far}' follows {} pointers; at most {MAX_DEREF}",
                path.len()
            ));
        }
        let narrow =
            |v: u32| u16::try_from(v).map_err(|_| format!("'{so_far}': offset {v} is too large"));
        let shape = self.shape(ty);
        match shape {
            Shape::Composite => {
                let mut names = Vec::new();
                if let Some(c) = self.composite(ty) {
                    self.member_names(&c, &mut names);
                }
                return Err(format!(
                    "'{so_far}' is {}; name one of its members: {}",
                    self.type_name(ty),
                    names.join(", ")
                ));
            }
            Shape::Unsupported => {
                return Err(format!(
                    "'{so_far}' has type {}, which bpfscope cannot read",
                    self.type_name(ty)
                ))
            }
            _ => {}
        }
        Ok(Walk {
            path: path.into_iter().map(narrow).collect::<Result<_, _>>()?,
            leaf_off: narrow(at.unwrap_or(0))?,
            ty,
            shape,
        })
    }
}

fn or_anon(name: &str) -> &str {
    if name.is_empty() {
        "{...}"
    } else {
        name
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_paths() {
        assert_eq!(split_path("skb"), None);
        let (base, steps) = split_path("file->f_path.dentry->d_name.name").unwrap();
        assert_eq!(base, "file");
        let s: Vec<(bool, &str)> = steps.iter().map(|s| (s.arrow, s.member.as_str())).collect();
        assert_eq!(
            s,
            vec![
                (true, "f_path"),
                (false, "dentry"),
                (true, "d_name"),
                (false, "name")
            ]
        );
        assert_eq!(split_path("a-b"), None);
    }

    #[test]
    fn walks_kernel_structs() {
        // Needs the running kernel's BTF (present on every supported kernel).
        let Some(k) = vmlinux() else { return };
        let sig = k.func("vfs_read").expect("vfs_read in BTF");
        assert_eq!(sig.params[0].name.as_deref(), Some("file"));
        let (_, steps) = split_path("file->f_path.dentry->d_name.name").unwrap();
        let w = k.walk("file", sig.params[0].ty, &steps).unwrap();
        assert_eq!(w.path.len(), 1);
        assert_eq!(w.shape, Shape::KernelStr);
        let (_, steps) = split_path("file->f_pth").unwrap();
        let e = k.walk("file", sig.params[0].ty, &steps).unwrap_err();
        assert!(
            e.contains("struct file has no member 'f_pth'; its members: "),
            "{e}"
        );
        assert!(e.contains("f_path"), "{e}");
        assert!(k
            .signature("vfs_read", &sig)
            .starts_with("ssize_t vfs_read(struct file *file"));
    }
}
