//! Filter expression grammar:
//!
//! ```text
//! expr    := and ('||' and)*
//! and     := unary ('&&' unary)*
//! unary   := '!' unary | '(' expr ')' | cmp
//! cmp     := NAME [op literal] | literal op NAME
//! op      := '==' | '!=' | '<' | '<=' | '>' | '>='
//! literal := integer (decimal, 0x hex, optional '-') | "string" (with \" and \\)
//! NAME    := identifier, optionally prefixed with `args.`, or a member
//!            path through a BTF-typed argument: `skb->dev->name`, `f.a.b`
//! ```

use std::fmt;

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

#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Name(String),
    Int(i128),
    Str(String),
    Op(CmpOp),
    And,
    Or,
    Not,
    LParen,
    RParen,
    End,
}

impl Tok {
    fn describe(&self) -> String {
        match self {
            Tok::Name(n) => format!("'{n}'"),
            Tok::Int(i) => format!("'{i}'"),
            Tok::Str(s) => format!("\"{s}\""),
            Tok::Op(o) => format!("'{o}'"),
            Tok::And => "'&&'".into(),
            Tok::Or => "'||'".into(),
            Tok::Not => "'!'".into(),
            Tok::LParen => "'('".into(),
            Tok::RParen => "')'".into(),
            Tok::End => "end of filter".into(),
        }
    }
}

fn err<T>(msg: impl Into<String>, column: usize) -> Result<T, ParseError> {
    Err(ParseError {
        msg: msg.into(),
        column,
    })
}

/// Splits the input into (token, column) pairs.
fn lex(src: &str) -> Result<Vec<(Tok, usize)>, ParseError> {
    let chars: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let col = i + 1;
        let next = chars.get(i + 1).copied();
        if c.is_whitespace() {
            i += 1;
            continue;
        }
        let two = |t: Tok, out: &mut Vec<(Tok, usize)>| out.push((t, col));
        match (c, next) {
            ('=', Some('=')) => {
                two(Tok::Op(CmpOp::Eq), &mut out);
                i += 2;
            }
            ('!', Some('=')) => {
                two(Tok::Op(CmpOp::Ne), &mut out);
                i += 2;
            }
            ('<', Some('=')) => {
                two(Tok::Op(CmpOp::Le), &mut out);
                i += 2;
            }
            ('>', Some('=')) => {
                two(Tok::Op(CmpOp::Ge), &mut out);
                i += 2;
            }
            ('&', Some('&')) => {
                two(Tok::And, &mut out);
                i += 2;
            }
            ('|', Some('|')) => {
                two(Tok::Or, &mut out);
                i += 2;
            }
            ('<', _) => {
                out.push((Tok::Op(CmpOp::Lt), col));
                i += 1;
            }
            ('>', _) => {
                out.push((Tok::Op(CmpOp::Gt), col));
                i += 1;
            }
            ('!', _) => {
                out.push((Tok::Not, col));
                i += 1;
            }
            ('(', _) => {
                out.push((Tok::LParen, col));
                i += 1;
            }
            (')', _) => {
                out.push((Tok::RParen, col));
                i += 1;
            }
            ('=', _) => return err("'=' is assignment; use '==' to compare", col),
            ('&', _) => return err("'&' is not supported; use '&&'", col),
            ('|', _) => return err("'|' is not supported; use '||'", col),
            ('"', _) => {
                let mut s = String::new();
                let mut j = i + 1;
                loop {
                    match chars.get(j) {
                        None => return err("unterminated string", col),
                        Some('"') => break,
                        Some('\\') => match chars.get(j + 1) {
                            Some(e @ ('"' | '\\')) => {
                                s.push(*e);
                                j += 2;
                            }
                            Some('n') => {
                                s.push('\n');
                                j += 2;
                            }
                            _ => return err("unknown escape in string", j + 1),
                        },
                        Some(ch) => {
                            s.push(*ch);
                            j += 1;
                        }
                    }
                }
                out.push((Tok::Str(s), col));
                i = j + 1;
            }
            (c, _)
                if c.is_ascii_digit() || (c == '-' && next.is_some_and(|n| n.is_ascii_digit())) =>
            {
                let neg = c == '-';
                let mut j = if neg { i + 1 } else { i };
                let start = j;
                while j < chars.len() && (chars[j].is_ascii_alphanumeric() || chars[j] == '_') {
                    j += 1;
                }
                let text: String = chars[start..j].iter().filter(|&&c| c != '_').collect();
                let parsed = if let Some(h) = text.strip_prefix("0x").or(text.strip_prefix("0X")) {
                    i128::from_str_radix(h, 16)
                } else {
                    text.parse::<i128>()
                };
                let v = match parsed {
                    Ok(v) if v <= u64::MAX as i128 => v,
                    _ => return err(format!("bad number '{}'", &text), col),
                };
                let v = if neg { -v } else { v };
                if v < i64::MIN as i128 {
                    return err(format!("number '-{text}' is out of range"), col);
                }
                out.push((Tok::Int(v), col));
                i = j;
            }
            (c, _) if c.is_ascii_alphabetic() || c == '_' => {
                let mut j = i;
                // A name, or a member path through BTF-typed arguments: a->b.c
                while j < chars.len() {
                    let c = chars[j];
                    if c.is_ascii_alphanumeric() || c == '_' || c == '.' {
                        j += 1;
                    } else if c == '-' && chars.get(j + 1) == Some(&'>') {
                        j += 2;
                    } else {
                        break;
                    }
                }
                let word: String = chars[i..j].iter().collect();
                // bpftrace spells tracepoint fields args.NAME; that form is kept
                // so it can name a field that shadows a builtin.
                let bare = word.strip_prefix("args.").unwrap_or(&word);
                if !crate::probe::btf::is_field_path(bare) {
                    return err(format!("bad name '{word}'"), col);
                }
                out.push((Tok::Name(word), col));
                i = j;
            }
            (c, _) => return err(format!("unexpected character '{c}'"), col),
        }
    }
    out.push((Tok::End, chars.len() + 1));
    Ok(out)
}

struct Parser {
    toks: Vec<(Tok, usize)>,
    pos: usize,
}

impl Parser {
    fn peek(&self) -> &(Tok, usize) {
        // lex() always ends the list with Tok::End and parsing never steps past it.
        &self.toks[self.pos.min(self.toks.len() - 1)]
    }

    fn bump(&mut self) -> (Tok, usize) {
        let t = self.peek().clone();
        if self.pos < self.toks.len() - 1 {
            self.pos += 1;
        }
        t
    }

    fn expr(&mut self) -> Result<Expr, ParseError> {
        let mut lhs = self.and()?;
        while self.peek().0 == Tok::Or {
            self.bump();
            let rhs = self.and()?;
            lhs = Expr::Or(Box::new(lhs), Box::new(rhs));
        }
        Ok(lhs)
    }

    fn and(&mut self) -> Result<Expr, ParseError> {
        let mut lhs = self.unary()?;
        while self.peek().0 == Tok::And {
            self.bump();
            let rhs = self.unary()?;
            lhs = Expr::And(Box::new(lhs), Box::new(rhs));
        }
        Ok(lhs)
    }

    fn unary(&mut self) -> Result<Expr, ParseError> {
        let (tok, col) = self.bump();
        match tok {
            Tok::Not => Ok(Expr::Not(Box::new(self.unary()?))),
            Tok::LParen => {
                let e = self.expr()?;
                let (t, c) = self.bump();
                if t != Tok::RParen {
                    return err(format!("expected ')' but found {}", t.describe()), c);
                }
                Ok(e)
            }
            Tok::Name(name) => {
                if let Tok::Op(op) = self.peek().0 {
                    self.bump();
                    let value = self.literal()?;
                    Ok(Expr::Cmp {
                        name,
                        column: col,
                        op,
                        value,
                    })
                } else {
                    Ok(Expr::Truthy { name, column: col })
                }
            }
            Tok::Int(_) | Tok::Str(_) => {
                let value = match tok {
                    Tok::Int(i) => Literal::Int(i),
                    Tok::Str(s) => Literal::Str(s),
                    _ => unreachable!("matched above"),
                };
                let (t, c) = self.bump();
                let Tok::Op(op) = t else {
                    return err(
                        format!(
                            "expected a comparison after the constant, found {}",
                            t.describe()
                        ),
                        c,
                    );
                };
                let (t, c) = self.bump();
                let Tok::Name(name) = t else {
                    return err(format!("expected a field name, found {}", t.describe()), c);
                };
                Ok(Expr::Cmp {
                    name,
                    column: c,
                    op: op.flipped(),
                    value,
                })
            }
            t => err(
                format!("expected a field, '!' or '(' but found {}", t.describe()),
                col,
            ),
        }
    }

    fn literal(&mut self) -> Result<Literal, ParseError> {
        let (t, c) = self.bump();
        match t {
            Tok::Int(i) => Ok(Literal::Int(i)),
            Tok::Str(s) => Ok(Literal::Str(s)),
            t => err(
                format!("expected a number or a \"string\", found {}", t.describe()),
                c,
            ),
        }
    }
}

/// Parses a filter expression.
pub fn parse(src: &str) -> Result<Expr, ParseError> {
    let toks = lex(src)?;
    let mut p = Parser { toks, pos: 0 };
    let e = p.expr()?;
    let (t, c) = p.bump();
    if t != Tok::End {
        return err(format!("unexpected {}", t.describe()), c);
    }
    Ok(e)
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
        assert_eq!(parse("skb-> == 1").unwrap_err().column, 1);
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
