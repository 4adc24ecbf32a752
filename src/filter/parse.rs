//! Filter expressions. The text is parsed by the language's own parser
//! (`crate::lang`, C's and bpftrace's precedence), and what the in-kernel
//! filter runs is taken from the tree:
//!
//! ```text
//! filter  := filter '||' filter | filter '&&' filter | '!' filter | '(' filter ')'
//!          | NAME op literal | literal op NAME | NAME
//! op      := '==' | '!=' | '<' | '<=' | '>' | '>='
//! literal := integer (decimal, 0x hex, 0 octal, 1e6, '_' separators,
//!            optional '-') | "string" (the script language's escapes)
//! NAME    := identifier, optionally prefixed with `args.`, or a member
//!            path through a BTF-typed argument: `skb->dev->name`, `f.a.b`
//! ```
//!
//! `!` binds tighter than a comparison: `!(pid == 1)`, not `!pid == 1`.

use std::fmt;

use crate::lang::ast::{BinOp, Expr as SExpr, ExprKind as SKind, UnOp};

/// A syntax error with the 1-based column where it was found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("filter: {msg} at column {column}")]
pub struct ParseError {
    pub msg: String,
    pub column: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl CmpOp {
    /// The operator with its operands swapped (`3 < x` is `x > 3`).
    fn flipped(self) -> Self {
        match self {
            CmpOp::Lt => CmpOp::Gt,
            CmpOp::Le => CmpOp::Ge,
            CmpOp::Gt => CmpOp::Lt,
            CmpOp::Ge => CmpOp::Le,
            o => o,
        }
    }
}

impl fmt::Display for CmpOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CmpOp::Eq => "==",
            CmpOp::Ne => "!=",
            CmpOp::Lt => "<",
            CmpOp::Le => "<=",
            CmpOp::Gt => ">",
            CmpOp::Ge => ">=",
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Literal {
    /// Integers keep their sign so that -1 and u64::MAX stay distinct.
    Int(i128),
    Str(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expr {
    Cmp {
        name: String,
        column: usize,
        op: CmpOp,
        value: Literal,
    },
    /// A bare name: true when non-zero.
    Truthy {
        name: String,
        column: usize,
    },
    Not(Box<Expr>),
    And(Box<Expr>, Box<Expr>),
    Or(Box<Expr>, Box<Expr>),
}

fn err<T>(msg: impl Into<String>, column: usize) -> Result<T, ParseError> {
    Err(ParseError {
        msg: msg.into(),
        column,
    })
}

/// Parses a filter expression. The text is read by the script language's
/// parser (`lang::parse::parse_expr`: one lexer, one operator table for
/// `--filter` and `bpfscope run`), then narrowed to what a filter runs in
/// the kernel: comparisons of a field with a literal, `!`, `&&`, `||`.
pub fn parse(src: &str) -> Result<Expr, ParseError> {
    let e = crate::lang::parse::parse_expr(src).map_err(|e| ParseError {
        msg: e.msg,
        column: column_of_line_col(src, e.line, e.col),
    })?;
    narrow(src, &e)
}

/// The 1-based character column of a (line, column) position the script
/// parser gives (a filter is one line, but may be given with newlines).
fn column_of_line_col(src: &str, line: usize, col: usize) -> usize {
    src.split('\n')
        .take(line.saturating_sub(1))
        .map(|l| l.chars().count() + 1)
        .sum::<usize>()
        + col
}

/// The 1-based character column of a byte offset.
fn column(src: &str, at: usize) -> usize {
    src.get(..at).map_or(at, |s| s.chars().count()) + 1
}

fn narrow(src: &str, e: &SExpr) -> Result<Expr, ParseError> {
    match &e.kind {
        SKind::Binary {
            op: BinOp::LAnd,
            lhs,
            rhs,
        } => Ok(Expr::And(
            Box::new(narrow(src, lhs)?),
            Box::new(narrow(src, rhs)?),
        )),
        SKind::Binary {
            op: BinOp::LOr,
            lhs,
            rhs,
        } => Ok(Expr::Or(
            Box::new(narrow(src, lhs)?),
            Box::new(narrow(src, rhs)?),
        )),
        SKind::Unary {
            op: UnOp::Not,
            expr,
        } => Ok(Expr::Not(Box::new(narrow(src, expr)?))),
        SKind::Binary { op, lhs, rhs } => {
            let Some(op) = cmp_op(*op) else {
                return err(
                    format!(
                        "'{}' is not supported in a filter (comparisons joined by && || !; `bpfscope run` takes any expression)",
                        &src[e.span.start..e.span.end]
                    ),
                    column(src, e.span.start),
                );
            };
            if let SKind::Unary { op: UnOp::Not, .. } = &lhs.kind {
                // C's (and bpftrace's) precedence: `!a == 1` is `(!a) == 1`.
                return err(
                    format!(
                        "'{}' compares the negation '!' makes; write '!(a == b)' to negate a comparison",
                        &src[e.span.start..e.span.end]
                    ),
                    column(src, lhs.span.start),
                );
            }
            match (name(lhs), name(rhs)) {
                (Some(n), None) => Ok(Expr::Cmp {
                    name: n,
                    column: column(src, lhs.span.start),
                    op,
                    value: literal(src, rhs)?,
                }),
                (None, Some(n)) => Ok(Expr::Cmp {
                    name: n,
                    column: column(src, rhs.span.start),
                    op: op.flipped(),
                    value: literal(src, lhs)?,
                }),
                (Some(_), Some(_)) => err(
                    "a filter compares a field with a literal, not two fields",
                    column(src, rhs.span.start),
                ),
                (None, None) => {
                    // The side that is not a literal (or the left one).
                    let odd = if literal(src, lhs).is_ok() { rhs } else { lhs };
                    err(
                        format!(
                            "'{}' is not a field: a filter compares a field with a literal (`bpfscope run` takes any expression)",
                            &src[odd.span.start..odd.span.end]
                        ),
                        column(src, odd.span.start),
                    )
                }
            }
        }
        _ => match name(e) {
            Some(n) => Ok(Expr::Truthy {
                name: n,
                column: column(src, e.span.start),
            }),
            None => err(
                format!(
                    "expected a field, a comparison, '!' or '(', found '{}'",
                    &src[e.span.start..e.span.end]
                ),
                column(src, e.span.start),
            ),
        },
    }
}

fn cmp_op(op: BinOp) -> Option<CmpOp> {
    Some(match op {
        BinOp::Eq => CmpOp::Eq,
        BinOp::Ne => CmpOp::Ne,
        BinOp::Lt => CmpOp::Lt,
        BinOp::Le => CmpOp::Le,
        BinOp::Gt => CmpOp::Gt,
        BinOp::Ge => CmpOp::Ge,
        _ => return None,
    })
}

/// A field as a filter names it: `pid`, `args.count`, `skb->dev->name`.
fn name(e: &SExpr) -> Option<String> {
    let (base, parts) = e.member_chain();
    let SKind::Ident(base) = &base.kind else {
        return None;
    };
    let mut out = base.clone();
    for (f, arrow) in parts {
        out.push_str(if arrow { "->" } else { "." });
        out.push_str(f);
    }
    let bare = out.strip_prefix("args.").unwrap_or(&out);
    crate::probe::btf::is_field_path(bare).then_some(out)
}

fn literal(src: &str, e: &SExpr) -> Result<Literal, ParseError> {
    match &e.kind {
        SKind::Int(v) => Ok(Literal::Int(i128::from(*v))),
        SKind::Unary {
            op: UnOp::Neg,
            expr,
        } => match &expr.kind {
            SKind::Int(v) if i128::from(*v) <= -(i64::MIN as i128) => {
                Ok(Literal::Int(-i128::from(*v)))
            }
            SKind::Int(_) => err(
                format!(
                    "number '{}' is out of range",
                    &src[e.span.start..e.span.end]
                ),
                column(src, e.span.start),
            ),
            _ => not_literal(src, e),
        },
        SKind::Str(s) => Ok(Literal::Str(s.clone())),
        _ => not_literal(src, e),
    }
}

fn not_literal<T>(src: &str, e: &SExpr) -> Result<T, ParseError> {
    err(
        format!(
            "expected a number or a \"string\", found '{}'",
            &src[e.span.start..e.span.end]
        ),
        column(src, e.span.start),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmp(name: &str, column: usize, op: CmpOp, value: Literal) -> Expr {
        Expr::Cmp {
            name: name.into(),
            column,
            op,
            value,
        }
    }

    #[test]
    fn precedence_and_forms() {
        let e = parse(r#"comm == "bash" || pid > 10 && !(ret < -1)"#).unwrap();
        assert_eq!(
            e,
            Expr::Or(
                Box::new(cmp("comm", 1, CmpOp::Eq, Literal::Str("bash".into()))),
                Box::new(Expr::And(
                    Box::new(cmp("pid", 19, CmpOp::Gt, Literal::Int(10))),
                    Box::new(Expr::Not(Box::new(cmp(
                        "ret",
                        33,
                        CmpOp::Lt,
                        Literal::Int(-1)
                    ))))
                ))
            )
        );
        assert_eq!(
            parse("4096 <= args.count").unwrap(),
            cmp("args.count", 9, CmpOp::Ge, Literal::Int(4096))
        );
        assert_eq!(
            parse("0x10 == fd").unwrap(),
            cmp("fd", 9, CmpOp::Eq, Literal::Int(16))
        );
    }

    #[test]
    fn errors_point_at_columns() {
        assert_eq!(parse("pid == ").unwrap_err().column, 8);
        assert_eq!(parse("pid = 3").unwrap_err().column, 5);
        assert_eq!(parse("(pid == 3").unwrap_err().column, 10);
        assert_eq!(parse("pid == 3)").unwrap_err().column, 9);
        assert_eq!(parse("comm == \"ba").unwrap_err().column, 9);
        assert_eq!(parse("pid == 3 && && 4").unwrap_err().column, 13);
        assert_eq!(
            parse("pid == 99999999999999999999999").unwrap_err().column,
            8
        );
        assert_eq!(parse("pid # 3").unwrap_err().column, 5);
        assert_eq!(parse("skb-> == 1").unwrap_err().column, 7);
        assert_eq!(parse("!pid == 0").unwrap_err().column, 1);
        assert_eq!(parse("pid + 1 == 3").unwrap_err().column, 1);
        assert_eq!(parse("pid == comm").unwrap_err().column, 8);
        assert_eq!(parse("count(pid)").unwrap_err().column, 1);
    }

    #[test]
    fn member_paths() {
        assert_eq!(
            parse(r#"skb->dev->name == "lo""#).unwrap(),
            cmp("skb->dev->name", 1, CmpOp::Eq, Literal::Str("lo".into()))
        );
        assert_eq!(
            parse("file->f_path.dentry->d_inode->i_ino>-1").unwrap(),
            cmp(
                "file->f_path.dentry->d_inode->i_ino",
                1,
                CmpOp::Gt,
                Literal::Int(-1)
            )
        );
    }
}
