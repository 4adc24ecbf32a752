//! The syntax tree of a bpftrace-language script, as the parser builds it
//! and the lowering pass reads it. Every node that can be wrong carries
//! its span, so a refusal names the line and column.

/// Byte range in the script text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Span {
    pub start: usize,
    pub end: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Program {
    /// `#include` lines: types come from BTF, the headers' object-like
    /// macros are read from the system's headers (`script::cpp`).
    pub includes: Vec<String>,
    /// `#define NAME VALUE` lines of the script itself, in order.
    pub defines: Vec<Define>,
    pub probes: Vec<ProbeBlock>,
}

/// `#define NAME body` (object-like; a macro with parameters is refused).
#[derive(Debug, Clone, PartialEq)]
pub struct Define {
    pub name: String,
    /// The replacement text, comments and line continuations removed.
    pub body: String,
    pub span: Span,
}

/// `spec, spec /predicate/ { stmts }`
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeBlock {
    /// Each attach point as written, e.g. `tracepoint:syscalls:sys_enter_open`.
    pub specs: Vec<(String, Span)>,
    pub predicate: Option<Expr>,
    pub body: Vec<Stmt>,
    pub span: Span,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Stmt {
    Expr(Expr),
    /// `$x = e`, `@m[k] = e`, and the compound forms (`+=` is `op: Some(Add)`).
    Assign {
        target: Expr,
        op: Option<BinOp>,
        value: Expr,
        span: Span,
    },
    /// `x++`, `x--`, `++x`, `--x` as statements (on variables or maps).
    Incr {
        target: Expr,
        delta: i64,
        span: Span,
    },
    If {
        cond: Expr,
        then: Vec<Stmt>,
        els: Vec<Stmt>,
        span: Span,
    },
    Unroll {
        count: u64,
        body: Vec<Stmt>,
        span: Span,
    },
    While {
        cond: Expr,
        body: Vec<Stmt>,
        span: Span,
    },
    Return(Span),
    /// `break` and `continue` in a `while` loop.
    Break(Span),
    Continue(Span),
    /// `for ($kv : @map) { stmts }`: each entry of a map, its key as
    /// `$kv.0` and its value as `$kv.1` (bpftrace 0.19).
    For {
        var: String,
        map: String,
        body: Vec<Stmt>,
        span: Span,
    },
    /// `{ stmts }` as a statement: a scope for the `let`s inside it.
    Block {
        body: Vec<Stmt>,
        span: Span,
    },
    /// `let $x;`, `let $x = e;`, `let $x: type = e;`: a variable declared
    /// in the enclosing block, out of scope after it (bpftrace 0.21).
    Let {
        name: String,
        ty: Option<String>,
        value: Option<Expr>,
        span: Span,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    Mod,
    BitAnd,
    BitOr,
    BitXor,
    Shl,
    Shr,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    /// `&&` and `||` short-circuit.
    LAnd,
    LOr,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnOp {
    /// `-x`
    Neg,
    /// `!x`
    Not,
    /// `~x`
    BitNot,
    /// `*x`: a dereference.
    Deref,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Expr {
    pub kind: ExprKind,
    pub span: Span,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ExprKind {
    /// Integer literal (also `1e6`-style, `1_000`, hex, octal, char constants).
    Int(u64),
    Str(String),
    /// `pid`, `comm`, `nsecs`, `args`, `retval`, `arg0`, `func`, `probe`,
    /// `kstack`, `ustack`, `curtask`, ..., and identifiers such as enum
    /// constants or macros (`TASK_RUNNING`), resolved later.
    Ident(String),
    /// `$name`
    Var(String),
    /// `$1`, `$2`: positional parameters; `$#` is `PositionalCount`.
    Positional(u32),
    PositionalCount,
    /// `@name[keys]`; `@` alone has an empty name; no brackets: no keys.
    Map {
        name: String,
        keys: Vec<Expr>,
    },
    /// `base->field` or `base.field` (`args->filename`, `args.filename`).
    Field {
        base: Box<Expr>,
        field: String,
        arrow: bool,
    },
    /// `base[index]` on a non-map value (arrays, pointers).
    Index {
        base: Box<Expr>,
        index: Box<Expr>,
    },
    Unary {
        op: UnOp,
        expr: Box<Expr>,
    },
    Binary {
        op: BinOp,
        lhs: Box<Expr>,
        rhs: Box<Expr>,
    },
    Ternary {
        cond: Box<Expr>,
        then: Box<Expr>,
        els: Box<Expr>,
    },
    /// `name(args)`: builtin functions and aggregations (`count()`, `hist(x)`).
    Call {
        name: String,
        args: Vec<Expr>,
    },
    /// `(a, b, ...)`: a tuple of two or more members.
    Tuple(Vec<Expr>),
    /// A type where one is taken: `sizeof(struct task_struct)`.
    TypeName(String),
    /// `(type)expr`, e.g. `(uint64)x`, `(struct task_struct *)curtask`.
    Cast {
        ty: String,
        expr: Box<Expr>,
    },
}

impl Expr {
    /// A chain of member accesses (`base->a.b`): its base, and the members
    /// with their separators (`->`: true), in source order.
    pub fn member_chain(&self) -> (&Expr, Vec<(&str, bool)>) {
        let mut parts = Vec::new();
        let mut cur = self;
        while let ExprKind::Field { base, field, arrow } = &cur.kind {
            parts.push((field.as_str(), *arrow));
            cur = base;
        }
        parts.reverse();
        (cur, parts)
    }

    /// For `args->a->b.c`: the field path as probes name it (`a->b.c`);
    /// None when the chain does not start at `args`.
    pub fn args_path(&self) -> Option<String> {
        let (base, parts) = self.member_chain();
        if !matches!(&base.kind, ExprKind::Ident(n) if n == "args") || parts.is_empty() {
            return None;
        }
        let mut path = String::new();
        for (i, (f, arrow)) in parts.iter().enumerate() {
            if i > 0 {
                path.push_str(if *arrow { "->" } else { "." });
            }
            path.push_str(f);
        }
        Some(path)
    }

    /// Calls `f` on this expression, then (when `f` says true) on each
    /// expression inside it, in source order.
    pub fn visit(&self, f: &mut dyn FnMut(&Expr) -> bool) {
        if !f(self) {
            return;
        }
        match &self.kind {
            ExprKind::Map { keys: v, .. } | ExprKind::Call { args: v, .. } | ExprKind::Tuple(v) => {
                v.iter().for_each(|x| x.visit(f))
            }
            ExprKind::Field { base, .. } => base.visit(f),
            ExprKind::Index { base, index } => {
                base.visit(f);
                index.visit(f);
            }
            ExprKind::Unary { expr, .. } | ExprKind::Cast { expr, .. } => expr.visit(f),
            ExprKind::Binary { lhs, rhs, .. } => {
                lhs.visit(f);
                rhs.visit(f);
            }
            ExprKind::Ternary { cond, then, els } => {
                cond.visit(f);
                then.visit(f);
                els.visit(f);
            }
            ExprKind::Int(_)
            | ExprKind::Str(_)
            | ExprKind::Ident(_)
            | ExprKind::Var(_)
            | ExprKind::Positional(_)
            | ExprKind::PositionalCount
            | ExprKind::TypeName(_) => {}
        }
    }
}

/// [`Expr::visit`] on every expression the statements hold, nested
/// blocks' too, in source order; a `for` loop's map as the map it reads
/// whole (`@m`, no keys).
pub fn visit_stmts(body: &[Stmt], f: &mut dyn FnMut(&Expr) -> bool) {
    for s in body {
        match s {
            Stmt::Expr(e) | Stmt::Incr { target: e, .. } => e.visit(f),
            Stmt::Assign { target, value, .. } => {
                target.visit(f);
                value.visit(f);
            }
            Stmt::If {
                cond, then, els, ..
            } => {
                cond.visit(f);
                visit_stmts(then, f);
                visit_stmts(els, f);
            }
            Stmt::While { cond, body, .. } => {
                cond.visit(f);
                visit_stmts(body, f);
            }
            Stmt::For {
                map, body, span, ..
            } => {
                let whole = Expr {
                    kind: ExprKind::Map {
                        name: map.clone(),
                        keys: Vec::new(),
                    },
                    span: *span,
                };
                whole.visit(f);
                visit_stmts(body, f)
            }
            Stmt::Unroll { body, .. } | Stmt::Block { body, .. } => visit_stmts(body, f),
            Stmt::Let { value, .. } => value.iter().for_each(|v| v.visit(f)),
            Stmt::Return(_) | Stmt::Break(_) | Stmt::Continue(_) => {}
        }
    }
}
