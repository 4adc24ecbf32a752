//! Filter stage: the `--filter` language, parsed once, then compiled per
//! probe into the postfix program (struct bs_filter_op[]) that the BPF side
//! evaluates one step at a time before anything is copied out. Negations
//! are pushed down to the comparisons (De Morgan), so a program is the
//! comparisons joined by `&&`/`||`: n terms take 2n - 1 steps.

pub mod parse;
pub mod raw;

pub use parse::{parse, CmpOp, Expr, Literal, ParseError};

use crate::error::Error;
use crate::probe::glob;
use crate::usage;
use bpfscope_bpf::abi::{bs_filter_op, bs_limits, bs_op, bs_src};

/// What a name in an expression refers to, as the caller resolved it.
#[derive(Debug, Clone, Copy)]
pub struct Operand {
    pub src: bs_src,
    pub is_str: bool,
}

/// String constants of all filters, shipped to the kernel's `strs` map.
#[derive(Debug, Default, Clone)]
pub struct StrTable {
    pub strs: Vec<String>,
}

impl StrTable {
    pub(crate) fn intern(&mut self, s: &str) -> u32 {
        if let Some(i) = self.strs.iter().position(|x| x == s) {
            return i as u32;
        }
        self.strs.push(s.to_string());
        (self.strs.len() - 1) as u32
    }
}

impl From<ParseError> for Error {
    fn from(e: ParseError) -> Self {
        Error::Usage(e.to_string())
    }
}

/// Compiles an expression for one probe. `resolve` maps a name (and its
/// column, for errors) to the source the probe reads it from.
pub fn compile(
    expr: &Expr,
    resolve: &mut dyn FnMut(&str, usize) -> Result<Operand, Error>,
    strs: &mut StrTable,
) -> Result<Vec<bs_filter_op>, Error> {
    let mut ops = Vec::new();
    emit(expr, false, resolve, strs, &mut ops)?;
    let max = bs_limits::BS_MAX_FILTER_OPS.0 as usize;
    if ops.len() > max {
        let terms = ops.len().div_ceil(2);
        return Err(usage!(
            "filter: too long ({terms} comparisons, at most {}); split it or simplify",
            max / 2
        ));
    }
    Ok(ops)
}

fn op(code: bs_op) -> bs_filter_op {
    bs_filter_op {
        op: code.0 as u8,
        ..Default::default()
    }
}

/// Emits `expr`, or its negation when `neg` is set.
fn emit(
    expr: &Expr,
    neg: bool,
    resolve: &mut dyn FnMut(&str, usize) -> Result<Operand, Error>,
    strs: &mut StrTable,
    out: &mut Vec<bs_filter_op>,
) -> Result<(), Error> {
    match expr {
        Expr::And(a, b) | Expr::Or(a, b) => {
            emit(a, neg, resolve, strs, out)?;
            emit(b, neg, resolve, strs, out)?;
            // !(a && b) == !a || !b and !(a || b) == !a && !b.
            out.push(op(if matches!(expr, Expr::And(..)) != neg {
                bs_op::BS_OP_AND
            } else {
                bs_op::BS_OP_OR
            }));
        }
        Expr::Not(e) => emit(e, !neg, resolve, strs, out)?,
        Expr::Truthy { name, column } => {
            let o = resolve(name, *column)?;
            if o.is_str {
                return Err(usage!(
                    "filter: '{name}' is a string; compare it, e.g. {name} == \"value\" (column {column})"
                ));
            }
            let code = if neg {
                bs_op::BS_OP_EQ
            } else {
                bs_op::BS_OP_NE
            };
            out.push(bs_filter_op {
                src: o.src,
                op: code.0 as u8,
                imm: 0,
                ..Default::default()
            });
        }
        Expr::Cmp {
            name,
            column,
            op: cmp,
            value,
        } => {
            let o = resolve(name, *column)?;
            let mut c = compare(name, *column, o, *cmp, value, strs)?;
            if neg {
                c.op = negated(c.op);
            }
            out.push(c);
        }
    }
    Ok(())
}

/// The comparison that is true exactly when `code` is false.
fn negated(code: u8) -> u8 {
    let n = match bs_op(u32::from(code)) {
        bs_op::BS_OP_EQ => bs_op::BS_OP_NE,
        bs_op::BS_OP_NE => bs_op::BS_OP_EQ,
        bs_op::BS_OP_LT => bs_op::BS_OP_GE,
        bs_op::BS_OP_GE => bs_op::BS_OP_LT,
        bs_op::BS_OP_LE => bs_op::BS_OP_GT,
        bs_op::BS_OP_GT => bs_op::BS_OP_LE,
        bs_op::BS_OP_STR_EQ => bs_op::BS_OP_STR_NE,
        bs_op::BS_OP_STR_NE => bs_op::BS_OP_STR_EQ,
        bs_op::BS_OP_GLOB => bs_op::BS_OP_NGLOB,
        bs_op::BS_OP_NGLOB => bs_op::BS_OP_GLOB,
        other => other,
    };
    n.0 as u8
}

fn compare(
    name: &str,
    column: usize,
    o: Operand,
    cmp: CmpOp,
    value: &Literal,
    strs: &mut StrTable,
) -> Result<bs_filter_op, Error> {
    match (o.is_str, value) {
        (true, Literal::Str(s)) => {
            let max = bs_limits::BS_STR_MAX.0 as usize - 1;
            if s.len() > max {
                return Err(usage!(
                    "filter: string \"{s}\" is longer than {max} bytes (column {column})"
                ));
            }
            let code = match (cmp, glob::is_glob(s)) {
                (CmpOp::Eq, false) => bs_op::BS_OP_STR_EQ,
                (CmpOp::Ne, false) => bs_op::BS_OP_STR_NE,
                (CmpOp::Eq, true) => bs_op::BS_OP_GLOB,
                (CmpOp::Ne, true) => bs_op::BS_OP_NGLOB,
                _ => {
                    return Err(usage!(
                        "filter: strings compare with == or != only, not {cmp} (column {column})"
                    ))
                }
            };
            Ok(bs_filter_op {
                src: o.src,
                op: code.0 as u8,
                str_idx: strs.intern(s),
                ..Default::default()
            })
        }
        (true, Literal::Int(_)) => Err(usage!(
            "filter: '{name}' is a string and cannot be compared with a number (column {column})"
        )),
        (false, Literal::Str(_)) => Err(usage!(
            "filter: '{name}' is a number and cannot be compared with a string (column {column})"
        )),
        (false, Literal::Int(i)) => {
            let signed = o.src.is_signed != 0;
            if *i < 0 && !signed {
                return Err(usage!(
                    "filter: '{name}' is unsigned and cannot be compared with {i} (column {column})"
                ));
            }
            let code = match cmp {
                CmpOp::Eq => bs_op::BS_OP_EQ,
                CmpOp::Ne => bs_op::BS_OP_NE,
                CmpOp::Lt => bs_op::BS_OP_LT,
                CmpOp::Le => bs_op::BS_OP_LE,
                CmpOp::Gt => bs_op::BS_OP_GT,
                CmpOp::Ge => bs_op::BS_OP_GE,
            };
            Ok(bs_filter_op {
                src: o.src,
                op: code.0 as u8,
                // Two's complement bits; the kernel compares signed or unsigned per the source.
                imm: *i as i64 as u64,
                ..Default::default()
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn num(kind: u8, signed: bool) -> Operand {
        Operand {
            src: bs_src {
                kind,
                size: 8,
                is_signed: signed as u8,
                ..Default::default()
            },
            is_str: false,
        }
    }

    fn resolver(name: &str, column: usize) -> Result<Operand, Error> {
        match name {
            "pid" => Ok(num(3, false)),
            "ret" => Ok(num(9, true)),
            "comm" => Ok(Operand {
                src: bs_src {
                    kind: 2,
                    ..Default::default()
                },
                is_str: true,
            }),
            _ => Err(usage!("unknown field '{name}' at column {column}")),
        }
    }

    #[test]
    fn postfix_order() {
        let mut strs = StrTable::default();
        let e = parse(r#"comm == "ba*" && !(ret < 0) || pid == 1"#).unwrap();
        let ops = compile(&e, &mut resolver, &mut strs).unwrap();
        let codes: Vec<u8> = ops.iter().map(|o| o.op).collect();
        assert_eq!(
            codes,
            vec![
                bs_op::BS_OP_GLOB.0 as u8,
                bs_op::BS_OP_GE.0 as u8,
                bs_op::BS_OP_AND.0 as u8,
                bs_op::BS_OP_EQ.0 as u8,
                bs_op::BS_OP_OR.0 as u8,
            ]
        );
        assert_eq!(strs.strs, vec!["ba*".to_string()]);
        assert_eq!(ops[1].imm, 0);
    }

    #[test]
    fn negations_fold_into_comparisons() {
        let mut strs = StrTable::default();
        let e = parse(r#"!(comm == "sh" || !(pid > 3 && ret)) && !(comm != "b*")"#).unwrap();
        let ops = compile(&e, &mut resolver, &mut strs).unwrap();
        let codes: Vec<u32> = ops.iter().map(|o| u32::from(o.op)).collect();
        let want = [
            bs_op::BS_OP_STR_NE,
            bs_op::BS_OP_GT,
            bs_op::BS_OP_NE,
            bs_op::BS_OP_AND,
            bs_op::BS_OP_AND,
            bs_op::BS_OP_GLOB,
            bs_op::BS_OP_AND,
        ];
        assert_eq!(codes, want.map(|c| c.0));
    }

    #[test]
    fn thirty_two_terms_fit_and_thirty_three_do_not() {
        let mut strs = StrTable::default();
        let terms = |n: usize| {
            (0..n)
                .map(|i| format!("!(pid == {i})"))
                .collect::<Vec<_>>()
                .join(" || ")
        };
        let ops = compile(&parse(&terms(32)).unwrap(), &mut resolver, &mut strs).unwrap();
        assert_eq!(ops.len(), 63);
        let e = compile(&parse(&terms(33)).unwrap(), &mut resolver, &mut strs).unwrap_err();
        assert!(e.to_string().contains("33 comparisons, at most 32"), "{e}");
    }

    #[test]
    fn type_errors() {
        let mut strs = StrTable::default();
        for bad in [
            r#"pid == "x""#,
            "comm == 3",
            "comm",
            r#"comm < "a""#,
            "pid == -1",
            "nope == 1",
        ] {
            let e = parse(bad).unwrap();
            assert!(compile(&e, &mut resolver, &mut strs).is_err(), "{bad}");
        }
    }
}
