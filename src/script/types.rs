//! The types of a script's values and maps, and the first pass over a
//! script: every map's key and value types, learned from its uses in every
//! probe and repeated until nothing changes (`infer`), so that a probe may
//! read a map a later probe writes.

use super::ir::*;
use crate::attach::plan::Path;
use crate::lang::ast::*;
use crate::probe::Probe;

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
    /// A MAC address (macaddr()), in a string slot as buf() reads it.
    Mac,
    /// Nanoseconds since boot shown as local time by strftime()'s format
    /// (the script's text number `fmt`), in user space.
    Time {
        fmt: u16,
    },
    /// An errno shown as its message (strerror()).
    Errno,
    /// A cgroup id shown as its paths in the cgroup hierarchies
    /// (cgroup_path()), those whose names match text `filter` (NO_TEXT: all).
    Cgroup {
        filter: u16,
    },
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

/// No text (`Ty::Cgroup`'s filter when none is given).
pub const NO_TEXT: u16 = u16::MAX;

impl Ty {
    /// Integers and addresses: what arithmetic, conditions and %d take.
    pub fn is_num(self) -> bool {
        matches!(self, Ty::Int { .. } | Ty::Ptr { .. } | Ty::IntPtr { .. })
    }

    /// Held in a string slot (64 bytes) rather than a register.
    pub fn in_slot(self) -> bool {
        matches!(self, Ty::Str | Ty::Inet | Ty::Buf | Ty::USym | Ty::Mac)
    }

    /// As a plain integer (a typed pointer is an unsigned address).
    pub(crate) fn plain(self) -> Ty {
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

/// One key part: its type, offset and length in the key data. A number
/// takes 8 bytes; a string as many as the longest string the map's writes
/// can put there, its NUL included (comm: 16; anything not bounded: a whole
/// slot), so a `@[comm]` key hashes and compares 16 bytes, not 64. A longer
/// string looked up (never stored) is cut to the part: with no NUL in it, it
/// matches no key, as it would whole.
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
    /// A map of tuples (`@m[k] = (a, (b, c))`): their shape. The map
    /// holds the first member (flattened, nested tuples in order); member
    /// i > 0 is held, under the same key, by the map named `@m.i` (a name
    /// no script can write), so every value fits the machine's 64 bytes.
    pub tuple: Option<TShape>,
    /// A keyless aggregation that no `delete()` names: per CPU, an array
    /// of its buckets (BS_VMF_SLOTS), not a hash map keyed by its id.
    pub slots: bool,
    /// Numbers keyed by `tid` alone, cleared at END and otherwise never
    /// named whole: a word in the thread's own storage holds each thread's
    /// value (BS_VMF_TASK), on compiled probes and the machine alike.
    pub thread: bool,
    /// A `thread` map printed at the end (not cleared at END): a thread
    /// leaving hands its value to the map's hash map, and the end reads
    /// the living threads' storage beside it.
    pub thread_print: bool,
    /// Numbers keyed by a task's id alone, `tid` or a sched event's task
    /// (`args.pid`, `args.prev_pid`, `args.next_pid`), at least once the
    /// latter, cleared at END and otherwise never named whole: where every
    /// probe naming it is compiled onto a typed tracepoint, a word in each
    /// task's storage holds its value (jit::choose); the machine, which
    /// has no task pointers, keeps it in its hash map.
    pub task_key: bool,
    /// An aggregation the code only ever adds to, with a key of one or
    /// two words: compiled probes add through a per-CPU cache in front of
    /// its hash map (element `cache` of `vm_cache`), which user space
    /// adds in when it reads the map.
    pub cache: Option<u32>,
}

impl MapDef {
    /// The buckets one key's aggregate has: a log2 histogram's, an
    /// lhist's steps and the two beyond its ends, else one.
    pub fn buckets(&self) -> u32 {
        match self.kind {
            MapKind::Agg(AggFn::Hist, _) => LOG2_BUCKETS,
            MapKind::Agg(AggFn::Lhist { min, max, step }, _) => ((max - min) / step) as u32 + 2,
            _ => 1,
        }
    }

    pub fn key_len(&self) -> usize {
        self.keys.last().map_or(KEY_ID_LEN, |k| k.off + k.len)
    }

    /// Whole words of key data after the map's id (the cache compares
    /// and keeps these).
    pub fn key_words(&self) -> usize {
        self.key_len().saturating_sub(KEY_ID_LEN) / 8
    }

    /// A member map of a map of tuples (`@m.1`): printed, cleared and
    /// deleted with its map, never on its own.
    pub fn is_member(&self) -> bool {
        self.name.contains('.')
    }
}

/// Map `id`'s word in a thread's storage, if it is a thread or task_key
/// map: its rank among the thread maps, then the task_key maps after
/// them, as `thread_words` gives the words.
pub fn thread_word(maps: &[MapDef], id: usize) -> Option<u32> {
    let m = maps.get(id)?;
    let rank = |f: fn(&MapDef) -> bool, to: usize| maps[..to].iter().filter(|m| f(m)).count();
    if m.thread {
        Some(rank(|m| m.thread, id) as u32)
    } else if m.task_key {
        Some((rank(|m| m.thread, maps.len()) + rank(|m| m.task_key, id)) as u32)
    } else {
        None
    }
}

/// A tuple's shape: its members, each a value or a tuple.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TShape {
    Value,
    Tuple(Vec<TShape>),
}

impl TShape {
    /// Values in the tuple, nested ones counted.
    pub fn leaves(&self) -> usize {
        match self {
            TShape::Value => 1,
            TShape::Tuple(m) => m.iter().map(TShape::leaves).sum(),
        }
    }
}

/// The map holding member `i` of map of tuples `name` (member 0: itself).
pub fn member_map(name: &str, i: usize) -> String {
    if i == 0 {
        name.to_string()
    } else {
        format!("{name}.{i}")
    }
}

pub(crate) fn cannot<T>(op: BinOp, a: Ty, b: Ty, span: Span) -> Res<T> {
    err(
        span,
        format!(
            "{op:?} of {} and {} is not possible",
            describe_ty(a),
            describe_ty(b)
        ),
    )
}

pub(crate) fn same_ty(a: Ty, b: Ty) -> bool {
    (a.is_num() && b.is_num()) || a == b
}

pub(crate) fn describe_ty(t: Ty) -> &'static str {
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
        Ty::Time { .. } => "a time (strftime())",
        Ty::Errno => "an error message (strerror())",
        Ty::Mac => "a MAC address",
        Ty::Cgroup { .. } => "a cgroup path",
        Ty::USym => "a user symbol",
    }
}

pub(crate) fn describe_keys(k: &[Ty]) -> String {
    if k.is_empty() {
        return "none".into();
    }
    k.iter()
        .map(|t| describe_ty(*t))
        .collect::<Vec<_>>()
        .join(", ")
}

pub(crate) fn describe_kind(k: MapKind) -> String {
    match k {
        MapKind::Plain(t) => describe_ty(t).to_string(),
        MapKind::Agg(f, _) => format!("{f:?}() results").to_lowercase(),
    }
}

/// An integer type's bits and signedness: bpftrace's names (`uint32`) and
/// C's (`unsigned int`, `u16`, `__s64`).
pub(crate) fn int_type(t: &str) -> Option<(u32, bool)> {
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

/// One attach point's probe and the blocks that run on it, in order.
pub struct ProbeBlocks<'a> {
    pub probe: &'a Probe,
    pub path: &'a Path,
    pub blocks: Vec<&'a ProbeBlock>,
}

/// The types pass: every probe's blocks are walked with the maps known so
/// far (code generation's own walk, its code and errors thrown away), each
/// walk declaring the maps its statements write, until a walk declares
/// nothing new. First strictly: a statement that reads a map no walk has
/// typed yet is skipped, so `@y = @x` waits for the probe that writes @x,
/// wherever it is. Then, for maps only their own statements could type
/// (`@n = @n + 1`), an untyped map reads as an integer, as bpftrace's do.
pub fn infer(
    probes: &[ProbeBlocks<'_>],
    shared: &dyn Fn() -> super::resources::Shared,
) -> Vec<MapDef> {
    let mut maps: Vec<MapDef> = Vec::new();
    for strict in [true, false] {
        // Declarations only add maps or widen their types, so each phase
        // ends; the bound is a guard, far above any script's map count.
        for _ in 0..4096 {
            let mut sh = shared();
            sh.maps = maps.clone();
            sh.typing = true;
            sh.strict = strict;
            for p in probes {
                let pc = super::codegen::ProbeCtx {
                    probe: p.probe,
                    path: p.path,
                };
                let mut l = super::codegen::Lower::new(&mut sh, &pc);
                for b in &p.blocks {
                    // Errors are said by code generation, with every map typed.
                    let _ = l.block(b);
                }
            }
            if sh.maps == maps {
                break;
            }
            maps = sh.maps;
        }
    }
    maps
}
