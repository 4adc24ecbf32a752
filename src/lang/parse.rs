// Parser for the bpftrace 0.17 script language.
//
// Hand-written lexer and Pratt parser rather than winnow: bpftrace lexes
// context-dependently (an attach point is raw text in which '/', '*', '.'
// and ':' are ordinary characters, while a predicate's '/' delimits an
// expression that may itself divide), and precedence climbing over an
// on-demand token stream gives exact byte spans and "expected X, found Y"
// messages with very little machinery.

use super::ast::*;

/// A syntax error with the 1-based position it was found at.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{line}:{col}: {msg}")]
pub struct ParseError {
    pub line: usize,
    pub col: usize,
    pub msg: String,
}

/// Parses a whole script.
pub fn parse(src: &str) -> Result<Program, ParseError> {
    Parser::new(src).program().map_err(|f| {
        let (line, col) = line_col(src, f.at);
        ParseError {
            line,
            col,
            msg: f.msg,
        }
    })
}

/// Parses one expression (a `#define`'s body): the whole text must be it.
pub fn parse_expr(src: &str) -> Result<Expr, ParseError> {
    let mut p = Parser::new(src);
    let r = p.expr().and_then(|e| {
        let t = p.peek()?;
        if t.tok == Tok::Eof {
            Ok(e)
        } else {
            Err(p.found(&t, "the end of the expression", ""))
        }
    });
    r.map_err(|f| {
        let (line, col) = line_col(src, f.at);
        ParseError {
            line,
            col,
            msg: f.msg,
        }
    })
}

/// 1-based line and column of a byte offset (used by later passes for their errors).
///
/// Columns count characters, not bytes; an offset past the end or inside a
/// multi-byte character is clamped to the character boundary before it.
pub fn line_col(src: &str, offset: usize) -> (usize, usize) {
    let mut end = offset.min(src.len());
    while !src.is_char_boundary(end) {
        end -= 1;
    }
    let before = src.get(..end).unwrap_or_default();
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let col = before.get(line_start..).unwrap_or_default().chars().count() + 1;
    (line, col)
}

/// Deepest nesting of expressions, blocks and `else if` chains accepted;
/// it keeps hostile input from overflowing the stack, and no real script
/// comes close.
const MAX_DEPTH: usize = 64;

/// Precedence of `?:`, the loosest operator (assignment is a statement).
const TERNARY_BP: u8 = 1;

/// Operators, longest first so that `<<=` is not lexed as `<` `<=`.
const PUNCTS: &[&str] = &[
    "<<=", ">>=", "->", "++", "--", "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=", "<<", ">>",
    "<=", ">=", "==", "!=", "&&", "||", "+", "-", "*", "/", "%", "&", "|", "^", "<", ">", "=", "!",
    "~", "?", ":", ".", ",", ";", "(", ")", "[", "]", "{", "}",
];

/// Words that start statements and so cannot name a value.
const KEYWORDS: &[&str] = &[
    "if", "else", "unroll", "while", "return", "break", "continue", "let", "for",
];

/// Words that may precede the last word of a cast's type, as in
/// `(unsigned long)` or `(struct sock *)`.
const TYPE_PREFIXES: &[&str] = &[
    "struct", "union", "enum", "const", "volatile", "unsigned", "signed", "long", "short",
];

/// Scalar type names: `(name)` is always a cast with these.
const SCALAR_TYPES: &[&str] = &[
    "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bool", "char",
    "short", "int", "long", "void", "unsigned", "signed",
];

/// A `#` line worth keeping.
enum Directive {
    Include(String),
    Define(Define),
}

/// A macro's replacement text as one line: continuations joined, comments
/// dropped, spaces trimmed.
pub fn clean_macro_body(body: &str) -> String {
    let joined = body.replace("\\\r\n", " ").replace("\\\n", " ");
    let mut out = String::new();
    let mut rest = joined.as_str();
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix("/*") {
            rest = r.find("*/").map_or("", |i| &r[i + 2..]);
            out.push(' ');
        } else if rest.starts_with("//") {
            break;
        } else {
            let c = rest.chars().next().unwrap_or(' ');
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out.trim().to_string()
}

/// An error before it is given a line and column.
#[derive(Debug)]
struct Fail {
    at: usize,
    msg: String,
}

fn fail<T>(at: usize, msg: impl Into<String>) -> Result<T, Fail> {
    Err(Fail {
        at,
        msg: msg.into(),
    })
}

type PResult<T> = Result<T, Fail>;

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Int(u64),
    Str(String),
    Var(String),
    Positional(u32),
    PositionalCount,
    Map(String),
    Punct(&'static str),
    Eof,
}

#[derive(Debug, Clone)]
struct Token {
    tok: Tok,
    span: Span,
}

impl Token {
    fn is(&self, p: &str) -> bool {
        matches!(self.tok, Tok::Punct(q) if q == p)
    }

    fn is_word(&self, w: &str) -> bool {
        matches!(&self.tok, Tok::Ident(s) if s == w)
    }

    /// Whether this token can begin the operand of a cast. `-` and `*` are
    /// left out so that `(x) - 1` stays a subtraction.
    fn starts_operand(&self) -> bool {
        match &self.tok {
            Tok::Ident(w) => !KEYWORDS.contains(&w.as_str()),
            Tok::Int(_)
            | Tok::Str(_)
            | Tok::Var(_)
            | Tok::Positional(_)
            | Tok::PositionalCount
            | Tok::Map(_) => true,
            Tok::Punct(p) => matches!(*p, "(" | "!" | "~"),
            Tok::Eof => false,
        }
    }
}

fn span(start: usize, end: usize) -> Span {
    Span { start, end }
}

fn is_ident_start(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'_'
}

fn is_ident_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

fn binop(t: &Token) -> Option<(BinOp, u8)> {
    let Tok::Punct(p) = t.tok else {
        return None;
    };
    Some(match p {
        "||" => (BinOp::LOr, 2),
        "&&" => (BinOp::LAnd, 3),
        "|" => (BinOp::BitOr, 4),
        "^" => (BinOp::BitXor, 5),
        "&" => (BinOp::BitAnd, 6),
        "==" => (BinOp::Eq, 7),
        "!=" => (BinOp::Ne, 7),
        "<" => (BinOp::Lt, 8),
        "<=" => (BinOp::Le, 8),
        ">" => (BinOp::Gt, 8),
        ">=" => (BinOp::Ge, 8),
        "<<" => (BinOp::Shl, 9),
        ">>" => (BinOp::Shr, 9),
        "+" => (BinOp::Add, 10),
        "-" => (BinOp::Sub, 10),
        "*" => (BinOp::Mul, 11),
        "/" => (BinOp::Div, 11),
        "%" => (BinOp::Mod, 11),
        _ => return None,
    })
}

/// `=` gives `Some(None)`, `+=` gives `Some(Some(Add))`, anything else `None`.
fn assign_op(t: &Token) -> Option<Option<BinOp>> {
    let Tok::Punct(p) = t.tok else {
        return None;
    };
    Some(match p {
        "=" => None,
        "+=" => Some(BinOp::Add),
        "-=" => Some(BinOp::Sub),
        "*=" => Some(BinOp::Mul),
        "/=" => Some(BinOp::Div),
        "%=" => Some(BinOp::Mod),
        "&=" => Some(BinOp::BitAnd),
        "|=" => Some(BinOp::BitOr),
        "^=" => Some(BinOp::BitXor),
        "<<=" => Some(BinOp::Shl),
        ">>=" => Some(BinOp::Shr),
        _ => return None,
    })
}

fn is_lvalue(e: &Expr) -> bool {
    matches!(e.kind, ExprKind::Var(_) | ExprKind::Map { .. })
}

fn boxed(e: Expr) -> Box<Expr> {
    Box::new(e)
}

struct Parser<'s> {
    src: &'s str,
    /// End of the last consumed token (or raw text at the top level).
    pos: usize,
    /// The token lexed at a position, so that peeking twice lexes once.
    peeked: Option<(usize, Token)>,
    /// Inside `/.../`, where a `/` followed by `{` ends the predicate.
    in_predicate: bool,
    depth: usize,
}

impl<'s> Parser<'s> {
    fn new(src: &'s str) -> Self {
        Parser {
            src,
            pos: 0,
            peeked: None,
            in_predicate: false,
            depth: 0,
        }
    }

    fn byte(&self, i: usize) -> Option<u8> {
        self.src.as_bytes().get(i).copied()
    }

    fn text(&self, s: Span) -> &'s str {
        self.src.get(s.start..s.end).unwrap_or_default()
    }

    fn line_col_text(&self, at: usize) -> String {
        let (l, c) = line_col(self.src, at);
        format!("{l}:{c}")
    }

    // ---- lexing ----------------------------------------------------------

    /// Skips whitespace and comments.
    fn skip_trivia(&self, mut pos: usize) -> PResult<usize> {
        loop {
            match (self.byte(pos), self.byte(pos + 1)) {
                (Some(c), _) if c.is_ascii_whitespace() => pos += 1,
                (Some(b'/'), Some(b'/')) => {
                    let rest = self.src.get(pos..).unwrap_or_default();
                    pos += rest.find('\n').unwrap_or(rest.len());
                }
                (Some(b'/'), Some(b'*')) => {
                    let rest = self.src.get(pos + 2..).unwrap_or_default();
                    match rest.find("*/") {
                        Some(i) => pos += 2 + i + 2,
                        None => {
                            return fail(
                                pos,
                                "unterminated comment: expected '*/', found end of input",
                            )
                        }
                    }
                }
                _ => return Ok(pos),
            }
        }
    }

    /// Lexes the token starting at or after `pos`.
    fn lex(&self, pos: usize) -> PResult<Token> {
        let start = self.skip_trivia(pos)?;
        let Some(c) = self.byte(start) else {
            return Ok(Token {
                tok: Tok::Eof,
                span: span(start, start),
            });
        };
        let (tok, end) = match c {
            c if is_ident_start(c) => {
                let end = self.ident_end(start);
                (Tok::Ident(self.text(span(start, end)).to_string()), end)
            }
            b'0'..=b'9' => self.lex_number(start)?,
            b'"' => self.lex_string(start)?,
            b'\'' => self.lex_char(start)?,
            b'$' => match self.byte(start + 1) {
                Some(b'#') => (Tok::PositionalCount, start + 2),
                Some(d) if d.is_ascii_digit() => {
                    let end = self.digits_end(start + 1);
                    let digits = self.text(span(start + 1, end));
                    match digits.parse::<u32>() {
                        Ok(n) => (Tok::Positional(n), end),
                        Err(_) => {
                            return fail(
                                start,
                                format!("positional parameter '${digits}' is too large"),
                            )
                        }
                    }
                }
                Some(d) if is_ident_start(d) => {
                    let end = self.ident_end(start + 1);
                    (Tok::Var(self.text(span(start + 1, end)).to_string()), end)
                }
                _ => {
                    return fail(
                        start,
                        format!(
                            "expected a variable name, a digit or '#' after '$', found {}",
                            self.describe_char(start + 1)
                        ),
                    )
                }
            },
            b'@' => {
                let end = match self.byte(start + 1) {
                    Some(d) if is_ident_start(d) => self.ident_end(start + 1),
                    _ => start + 1,
                };
                (Tok::Map(self.text(span(start + 1, end)).to_string()), end)
            }
            _ => {
                let rest = self.src.get(start..).unwrap_or_default();
                match PUNCTS.iter().find(|p| rest.starts_with(**p)) {
                    Some(p) => (Tok::Punct(p), start + p.len()),
                    None => {
                        return fail(
                            start,
                            format!(
                                "expected an operator, a value or punctuation, found invalid character {}",
                                self.describe_char(start)
                            ),
                        )
                    }
                }
            }
        };
        Ok(Token {
            tok,
            span: span(start, end),
        })
    }

    fn ident_end(&self, mut i: usize) -> usize {
        while self.byte(i).is_some_and(is_ident_char) {
            i += 1;
        }
        i
    }

    fn digits_end(&self, mut i: usize) -> usize {
        while self.byte(i).is_some_and(|c| c.is_ascii_digit()) {
            i += 1;
        }
        i
    }

    /// The character at `i`, quoted, for messages.
    fn describe_char(&self, i: usize) -> String {
        match self.src.get(i..).and_then(|r| r.chars().next()) {
            Some(c) if c.is_control() => format!("{c:?}"),
            Some(c) => format!("'{c}'"),
            None => "end of input".to_string(),
        }
    }

    /// Integers: decimal with `_` separators, `0x` hex, C-style octal, and
    /// `1e6`-style decimal exponents.
    fn lex_number(&self, start: usize) -> PResult<(Tok, usize)> {
        let too_big = |end: usize| {
            fail(
                start,
                format!(
                    "integer literal '{}' does not fit in 64 bits",
                    self.text(span(start, end))
                ),
            )
        };
        let mut i;
        let value;
        if self.byte(start) == Some(b'0') && matches!(self.byte(start + 1), Some(b'x' | b'X')) {
            i = start + 2;
            let mut v: u64 = 0;
            while let Some(d) = self.byte(i).and_then(|c| (c as char).to_digit(16)) {
                match v.checked_mul(16).and_then(|v| v.checked_add(u64::from(d))) {
                    Some(n) => v = n,
                    None => return too_big(self.ident_end(i)),
                }
                i += 1;
            }
            if i == start + 2 {
                return fail(
                    start,
                    format!(
                        "expected hex digits after '0x', found {}",
                        self.describe_char(i)
                    ),
                );
            }
            value = v;
        } else {
            i = start;
            while self
                .byte(i)
                .is_some_and(|c| c.is_ascii_digit() || c == b'_')
            {
                i += 1;
            }
            let digits: String = self
                .text(span(start, i))
                .chars()
                .filter(|c| *c != '_')
                .collect();
            let octal = digits.len() > 1 && digits.starts_with('0');
            let radix = if octal { 8 } else { 10 };
            let mut v: u64 = 0;
            for d in digits.chars() {
                let Some(d) = d.to_digit(radix) else {
                    return fail(
                        start,
                        format!("invalid digit '{d}' in octal literal '{digits}'"),
                    );
                };
                match v
                    .checked_mul(u64::from(radix))
                    .and_then(|v| v.checked_add(u64::from(d)))
                {
                    Some(n) => v = n,
                    None => return too_big(i),
                }
            }
            if !octal
                && matches!(self.byte(i), Some(b'e' | b'E'))
                && self.byte(i + 1).is_some_and(|c| c.is_ascii_digit())
            {
                let exp_end = self.digits_end(i + 1);
                let exp = self.text(span(i + 1, exp_end)).parse::<u32>().ok();
                match exp
                    .and_then(|e| 10u64.checked_pow(e))
                    .and_then(|p| v.checked_mul(p))
                {
                    Some(n) => v = n,
                    None => return too_big(exp_end),
                }
                i = exp_end;
            }
            value = v;
        }
        // After a '.', digits are a tuple member (`$t.0.1`), not a fraction.
        let member = start > 0 && self.byte(start - 1) == Some(b'.');
        if !member
            && self.byte(i) == Some(b'.')
            && self.byte(i + 1).is_some_and(|c| c.is_ascii_digit())
        {
            let end = self.digits_end(i + 1);
            return fail(
                start,
                format!(
                    "expected an integer, found the floating-point literal '{}' (bpftrace has no floating point)",
                    self.text(span(start, end))
                ),
            );
        }
        if self.byte(i).is_some_and(is_ident_char) {
            let end = self.ident_end(i);
            return fail(
                start,
                format!(
                    "invalid integer literal '{}': expected a digit or the end of the number, found {}",
                    self.text(span(start, end)),
                    self.describe_char(i)
                ),
            );
        }
        Ok((Tok::Int(value), i))
    }

    /// Reads one escape sequence; `i` is just past the backslash. Returns
    /// the character and the position after the sequence.
    fn lex_escape(&self, i: usize) -> PResult<(char, usize)> {
        let Some(c) = self.byte(i) else {
            return fail(
                i,
                "expected an escape character after '\\', found end of input",
            );
        };
        let simple = match c {
            b'n' => Some('\n'),
            b't' => Some('\t'),
            b'r' => Some('\r'),
            b'"' => Some('"'),
            b'\'' => Some('\''),
            b'\\' => Some('\\'),
            _ => None,
        };
        if let Some(ch) = simple {
            return Ok((ch, i + 1));
        }
        // Numeric escapes: up to three octal digits or two hex digits.
        let (digits_start, radix, max_len) = match c {
            b'0'..=b'7' => (i, 8, 3),
            b'x' => (i + 1, 16, 2),
            _ => {
                return fail(
                    i - 1,
                    format!(
                        "invalid escape '\\{}' in string: expected one of \\n \\t \\r \\\" \\\\ \\' \\0 \\NNN \\xNN",
                        self.describe_char(i).trim_matches('\'')
                    ),
                )
            }
        };
        let mut end = digits_start;
        let mut v: u32 = 0;
        while end - digits_start < max_len {
            match self.byte(end).and_then(|b| (b as char).to_digit(radix)) {
                Some(d) => v = v * radix + d,
                None => break,
            }
            end += 1;
        }
        if end == digits_start {
            return fail(
                i - 1,
                format!(
                    "expected hex digits after '\\x', found {}",
                    self.describe_char(end)
                ),
            );
        }
        // The tree holds strings as UTF-8 text, so only ASCII bytes fit.
        match u8::try_from(v).ok().filter(u8::is_ascii) {
            Some(b) => Ok((char::from(b), end)),
            None => fail(
                i - 1,
                format!(
                    "escape '\\{}' is not ASCII; expected a value of at most 0x7f",
                    self.text(span(i, end))
                ),
            ),
        }
    }

    fn lex_string(&self, start: usize) -> PResult<(Tok, usize)> {
        let mut out = String::new();
        let mut i = start + 1;
        loop {
            let Some(c) = self.src.get(i..).and_then(|r| r.chars().next()) else {
                return fail(
                    start,
                    "unterminated string: expected '\"', found end of input",
                );
            };
            match c {
                '"' => return Ok((Tok::Str(out), i + 1)),
                '\n' => {
                    return fail(
                        start,
                        "unterminated string: expected '\"' before the end of the line",
                    )
                }
                '\\' => {
                    let (ch, next) = self.lex_escape(i + 1)?;
                    out.push(ch);
                    i = next;
                }
                c => {
                    out.push(c);
                    i += c.len_utf8();
                }
            }
        }
    }

    fn lex_char(&self, start: usize) -> PResult<(Tok, usize)> {
        let bad = || {
            fail(
                start,
                "invalid character literal: expected one ASCII character or escape between single quotes",
            )
        };
        let (ch, next) = match self.byte(start + 1) {
            Some(b'\\') => self.lex_escape(start + 2)?,
            Some(c) if c.is_ascii() && c != b'\'' && c != b'\n' => (char::from(c), start + 2),
            _ => return bad(),
        };
        if self.byte(next) != Some(b'\'') {
            return bad();
        }
        Ok((Tok::Int(u64::from(u32::from(ch))), next + 1))
    }

    // ---- token stream ----------------------------------------------------

    fn peek(&mut self) -> PResult<Token> {
        if let Some((at, t)) = &self.peeked {
            if *at == self.pos {
                return Ok(t.clone());
            }
        }
        let t = self.lex(self.pos)?;
        self.peeked = Some((self.pos, t.clone()));
        Ok(t)
    }

    fn next(&mut self) -> PResult<Token> {
        let t = self.peek()?;
        self.pos = t.span.end;
        Ok(t)
    }

    fn describe(&self, t: &Token) -> String {
        if t.tok == Tok::Eof {
            return "end of input".to_string();
        }
        let text = self.text(t.span);
        let short: String = text.chars().take(30).collect();
        let more = if short.len() < text.len() { "..." } else { "" };
        match t.tok {
            Tok::Str(_) => format!("string {short}{more}"),
            _ => format!("'{short}{more}'"),
        }
    }

    /// The token at a raw position, described for a message.
    fn describe_at(&self, pos: usize) -> String {
        match self.lex(pos) {
            Ok(t) => self.describe(&t),
            Err(_) => self.describe_char(pos),
        }
    }

    fn expect(&mut self, p: &str, context: &str) -> PResult<Token> {
        let t = self.peek()?;
        if t.is(p) {
            self.next()
        } else {
            Err(self.found(&t, &format!("'{p}' {context}"), ""))
        }
    }

    /// "expected {expected}, found {t}{note}". Errors are built out of line
    /// so that the recursive parsing functions keep small stack frames.
    #[cold]
    #[inline(never)]
    fn found(&self, t: &Token, expected: &str, note: &str) -> Fail {
        Fail {
            at: t.span.start,
            msg: format!("expected {expected}, found {}{note}", self.describe(t)),
        }
    }

    fn enter(&mut self) -> PResult<()> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(self.too_deep());
        }
        Ok(())
    }

    #[cold]
    #[inline(never)]
    fn too_deep(&self) -> Fail {
        Fail {
            at: self.pos,
            msg: format!(
                "nesting too deep: expected at most {MAX_DEPTH} levels of expressions or blocks"
            ),
        }
    }

    fn leave(&mut self) {
        self.depth = self.depth.saturating_sub(1);
    }

    // ---- top level -------------------------------------------------------

    fn program(&mut self) -> PResult<Program> {
        let mut includes = Vec::new();
        let mut defines = Vec::new();
        let mut probes = Vec::new();
        if self.src.starts_with("#!") {
            self.pos = self.line_end(0);
        }
        loop {
            self.pos = self.skip_trivia(self.pos)?;
            let rest = self.src.get(self.pos..).unwrap_or_default();
            if rest.is_empty() {
                break;
            }
            if rest.starts_with('#') {
                match self.directive()? {
                    Some(Directive::Include(inc)) => includes.push(inc),
                    Some(Directive::Define(d)) => defines.push(d),
                    None => {}
                }
            } else if ["struct", "union", "enum", "typedef"].iter().any(|kw| {
                rest.starts_with(kw) && !self.byte(self.pos + kw.len()).is_some_and(is_ident_char)
            }) {
                self.skip_c_definition()?;
            } else {
                probes.push(self.probe()?);
            }
        }
        if probes.is_empty() {
            return fail(
                self.pos,
                "expected a probe such as 'BEGIN { ... }', found end of input",
            );
        }
        Ok(Program {
            includes,
            defines,
            probes,
        })
    }

    /// End of the line holding `pos`, before its newline; a trailing
    /// backslash continues a preprocessor line onto the next one.
    fn line_end(&self, pos: usize) -> usize {
        let mut i = pos;
        loop {
            let rest = self.src.get(i..).unwrap_or_default();
            match rest.find('\n') {
                None => return self.src.len(),
                Some(n) => {
                    let nl = i + n;
                    let line = self.text(span(pos, nl)).trim_end_matches('\r');
                    if !line.ends_with('\\') {
                        return nl;
                    }
                    i = nl + 1;
                }
            }
        }
    }

    /// A `#` line: an `#include`'s header, or a `#define`; conditionals are
    /// tolerated and ignored, since types come from BTF and the headers
    /// they choose between do not matter.
    fn directive(&mut self) -> PResult<Option<Directive>> {
        let start = self.pos;
        let end = self.line_end(start);
        self.pos = end;
        let after_hash = self.text(span(start + 1, end));
        let body = after_hash.trim_start();
        let name_len = body.bytes().take_while(|c| is_ident_char(*c)).count();
        let name = body.get(..name_len).unwrap_or_default();
        match name {
            "include" => {
                let arg_off = start + 1 + (after_hash.len() - body.len()) + name_len;
                let raw = self.text(span(arg_off, end));
                let arg = raw.trim_start();
                let arg_at = arg_off + (raw.len() - arg.len());
                let close = match arg.as_bytes().first() {
                    Some(b'<') => arg.find('>'),
                    Some(b'"') => arg.get(1..).and_then(|r| r.find('"')).map(|i| i + 1),
                    _ => None,
                };
                match close.and_then(|c| arg.get(..=c)) {
                    Some(header) => Ok(Some(Directive::Include(header.to_string()))),
                    None => fail(
                        arg_at,
                        format!(
                            "expected <file> or \"file\" after #include, found {}",
                            self.describe_char(arg_at)
                        ),
                    ),
                }
            }
            "if" | "ifdef" | "ifndef" | "elif" | "else" | "endif" => Ok(None),
            "define" => {
                let name_at = start + 1 + (after_hash.len() - body.len()) + name_len;
                let raw = self.text(span(name_at, end));
                let rest = raw.trim_start();
                let name_at = name_at + (raw.len() - rest.len());
                let n = rest.bytes().take_while(|c| is_ident_char(*c)).count();
                let name = rest.get(..n).unwrap_or_default();
                if n == 0 || !rest.as_bytes()[0].is_ascii_alphabetic() && rest.as_bytes()[0] != b'_' {
                    return fail(
                        name_at,
                        format!(
                            "expected a macro name after #define, found {}",
                            self.describe_char(name_at)
                        ),
                    );
                }
                if rest.as_bytes().get(n) == Some(&b'(') {
                    return fail(
                        name_at,
                        format!("#define {name}(...): macros with parameters are not supported by bpfscope run (object-like macros are)"),
                    );
                }
                let body = rest.get(n..).unwrap_or_default();
                Ok(Some(Directive::Define(Define {
                    name: name.to_string(),
                    body: clean_macro_body(body),
                    span: span(start, end),
                })))
            }
            _ => fail(
                start,
                format!(
                    "expected #include or a conditional (#if, #ifdef, #ifndef, #else, #endif), found '#{name}'"
                ),
            ),
        }
    }

    /// Skips a C `struct`/`union`/`enum` definition or `typedef` at the
    /// top level: bpftrace hands these to clang, but here types come from
    /// BTF, so they are tolerated and dropped.
    fn skip_c_definition(&mut self) -> PResult<()> {
        let start = self.pos;
        let mut depth = 0usize;
        let mut i = start;
        loop {
            i = self.skip_trivia(i)?;
            match self.byte(i) {
                None => {
                    return fail(
                        start,
                        "unterminated C definition: expected '}' and ';', found end of input",
                    )
                }
                Some(b'{') => depth += 1,
                Some(b'}') if depth == 0 => {
                    return fail(i, "expected ';' to end the C definition, found '}'")
                }
                Some(b'}') => {
                    depth -= 1;
                    if depth == 0 {
                        let after = self.lex(i + 1)?;
                        if !after.is(";") {
                            return fail(
                                after.span.start,
                                format!(
                                    "expected ';' after the C definition, found {}",
                                    self.describe(&after)
                                ),
                            );
                        }
                    }
                }
                Some(b';') if depth == 0 => {
                    self.pos = i + 1;
                    return Ok(());
                }
                _ => {}
            }
            i += 1;
        }
    }

    /// `spec, spec /predicate/ { body }`
    fn probe(&mut self) -> PResult<ProbeBlock> {
        let mut specs = Vec::new();
        loop {
            let at = self.skip_trivia(self.pos)?;
            let s = self.attach_point(at)?;
            self.pos = s.1.end;
            specs.push(s);
            let next = self.skip_trivia(self.pos)?;
            if self.byte(next) == Some(b',') {
                self.pos = next + 1;
            } else {
                break;
            }
        }
        let start = specs.first().map_or(self.pos, |s| s.1.start);
        let t = self.peek()?;
        let predicate = if t.is("/") {
            Some(self.predicate()?)
        } else if t.is("{") {
            None
        } else {
            let last = specs.last().map_or("", |s| s.0.as_str());
            return fail(
                t.span.start,
                format!(
                    "expected ',', a predicate '/.../' or '{{' after attach point '{last}', found {}",
                    self.describe(&t)
                ),
            );
        };
        let (body, body_span) = self.block("to start the probe body")?;
        Ok(ProbeBlock {
            specs,
            predicate,
            body,
            span: span(start, body_span.end),
        })
    }

    /// One attach point as raw text: it runs to whitespace, `,` or `{`, so
    /// paths (`uprobe:/bin/bash:readline`) and wildcards keep their '/'
    /// and '*'. A double-quoted part may hold spaces.
    fn attach_point(&self, start: usize) -> PResult<(String, Span)> {
        if !self.byte(start).is_some_and(|c| c.is_ascii_alphabetic()) {
            return fail(
                start,
                format!(
                    "expected an attach point such as 'BEGIN' or 'kprobe:vfs_read', found {}",
                    self.describe_at(start)
                ),
            );
        }
        let mut i = start;
        while let Some(c) = self.byte(i) {
            if c.is_ascii_whitespace() || matches!(c, b',' | b'{' | b'}' | b';') {
                break;
            }
            if c == b'"' {
                let quote = i;
                i += 1;
                loop {
                    match self.byte(i) {
                        None | Some(b'\n') => {
                            return fail(
                                quote,
                                "unterminated quoted attach point: expected '\"' before the end of the line",
                            )
                        }
                        Some(b'\\') => i += 2,
                        Some(b'"') => break,
                        Some(_) => i += 1,
                    }
                }
            }
            i += 1;
        }
        let sp = span(start, i);
        Ok((self.text(sp).to_string(), sp))
    }

    /// `/expr/`: the closing '/' is the first one followed by `{`.
    fn predicate(&mut self) -> PResult<Expr> {
        let open = self.next()?;
        let t = self.peek()?;
        if t.is("/") {
            return fail(
                open.span.start,
                "empty predicate: expected an expression between '/' and '/'",
            );
        }
        self.in_predicate = true;
        let e = self.expr();
        self.in_predicate = false;
        let e = e?;
        self.expect("/", "to end the predicate")?;
        Ok(e)
    }

    // ---- statements ------------------------------------------------------

    /// `{ stmt; stmt; ... }`; returns the statements and the span of the braces.
    fn block(&mut self, context: &str) -> PResult<(Vec<Stmt>, Span)> {
        let open = self.expect("{", context)?;
        self.enter()?;
        let mut stmts = Vec::new();
        let close = loop {
            let t = self.peek()?;
            match t.tok {
                Tok::Punct("}") => break self.next()?,
                // Stray semicolons are harmless.
                Tok::Punct(";") => {
                    self.next()?;
                    continue;
                }
                Tok::Eof => {
                    return fail(
                        t.span.start,
                        format!(
                            "expected '}}' to close the block opened at {}, found end of input",
                            self.line_col_text(open.span.start)
                        ),
                    )
                }
                _ => {}
            }
            let s = self.stmt()?;
            let braced = matches!(
                s,
                Stmt::If { .. }
                    | Stmt::Unroll { .. }
                    | Stmt::While { .. }
                    | Stmt::Block { .. }
                    | Stmt::For { .. }
            );
            // A bare word followed by `{` or `:` is most likely the next
            // probe's attach point after a forgotten `}`.
            let probe_like = matches!(
                &s,
                Stmt::Expr(Expr {
                    kind: ExprKind::Ident(_),
                    ..
                })
            );
            stmts.push(s);
            if !braced {
                let t = self.peek()?;
                if t.is(";") {
                    self.next()?;
                } else if !t.is("}") {
                    let hint = if probe_like && (t.is("{") || t.is(":")) {
                        " (is a '}' missing before this probe?)"
                    } else {
                        ""
                    };
                    return fail(
                        t.span.start,
                        format!(
                            "expected ';' or '}}' after a statement, found {}{hint}",
                            self.describe(&t)
                        ),
                    );
                }
            }
        };
        self.leave();
        Ok((stmts, span(open.span.start, close.span.end)))
    }

    fn stmt(&mut self) -> PResult<Stmt> {
        let t = self.peek()?;
        if let Tok::Ident(w) = &t.tok {
            match w.as_str() {
                "if" => return self.if_stmt(),
                "while" => return self.while_stmt(),
                "unroll" => return self.unroll_stmt(),
                "return" => {
                    self.next()?;
                    return Ok(Stmt::Return(t.span));
                }
                "let" => return self.let_stmt(),
                "for" => return self.for_stmt(),
                "break" => {
                    self.next()?;
                    return Ok(Stmt::Break(t.span));
                }
                "continue" => {
                    self.next()?;
                    return Ok(Stmt::Continue(t.span));
                }
                "else" => {
                    return fail(
                        t.span.start,
                        "expected a statement, found 'else' without an 'if' block before it",
                    )
                }
                _ => {}
            }
        }
        if t.is("{") {
            let (body, sp) = self.block("a block")?;
            return Ok(Stmt::Block { body, span: sp });
        }
        if t.is("++") || t.is("--") {
            self.next()?;
            let target = self.postfix()?;
            let end = target.span.end;
            return self.incr(target, &t, span(t.span.start, end));
        }
        let target = self.expr_bp(0)?;
        let t = self.peek()?;
        if let Some(op) = assign_op(&t) {
            if !is_lvalue(&target) {
                return fail(
                    target.span.start,
                    format!(
                        "expected a $variable or @map before '{}', found an expression",
                        self.text(t.span)
                    ),
                );
            }
            self.next()?;
            let value = self.expr()?;
            let sp = span(target.span.start, value.span.end);
            return Ok(Stmt::Assign {
                target,
                op,
                value,
                span: sp,
            });
        }
        if t.is("++") || t.is("--") {
            self.next()?;
            let start = target.span.start;
            return self.incr(target, &t, span(start, t.span.end));
        }
        Ok(Stmt::Expr(target))
    }

    /// Builds `x++`-style statements covering `sp`.
    fn incr(&self, target: Expr, op: &Token, sp: Span) -> PResult<Stmt> {
        if !is_lvalue(&target) {
            return fail(
                target.span.start,
                format!(
                    "expected a $variable or @map with '{}', found an expression",
                    self.text(op.span)
                ),
            );
        }
        Ok(Stmt::Incr {
            delta: if op.is("++") { 1 } else { -1 },
            span: sp,
            target,
        })
    }

    /// `(cond)` after `if` or `while`.
    fn condition(&mut self, kw: &str) -> PResult<Expr> {
        self.expect("(", &format!("after '{kw}'"))?;
        let cond = self.expr()?;
        self.expect(")", &format!("after the {kw} condition"))?;
        Ok(cond)
    }

    /// The braced body of `if`/`else`/`while`/`unroll`: bpftrace requires braces.
    fn braced_body(&mut self, what: &str) -> PResult<(Vec<Stmt>, Span)> {
        let t = self.peek()?;
        if !t.is("{") {
            return fail(
                t.span.start,
                format!(
                    "expected '{{' after {what} (braces are required), found {}",
                    self.describe(&t)
                ),
            );
        }
        self.block(what)
    }

    fn if_stmt(&mut self) -> PResult<Stmt> {
        let kw = self.next()?;
        self.enter()?;
        let cond = self.condition("if")?;
        let (then, then_span) = self.braced_body("the if condition")?;
        let mut end = then_span.end;
        let mut els = Vec::new();
        if self.peek()?.is_word("else") {
            self.next()?;
            let t = self.peek()?;
            if t.is_word("if") {
                let s = self.if_stmt()?;
                if let Stmt::If { span, .. } = &s {
                    end = span.end;
                }
                els.push(s);
            } else if t.is("{") {
                let (b, sp) = self.block("after 'else'")?;
                els = b;
                end = sp.end;
            } else {
                return fail(
                    t.span.start,
                    format!(
                        "expected '{{' or 'if' after 'else' (braces are required), found {}",
                        self.describe(&t)
                    ),
                );
            }
        }
        self.leave();
        Ok(Stmt::If {
            cond,
            then,
            els,
            span: span(kw.span.start, end),
        })
    }

    /// `let $x`, optionally `: type`, optionally `= value`.
    fn let_stmt(&mut self) -> PResult<Stmt> {
        let kw = self.next()?;
        let t = self.next()?;
        let Tok::Var(name) = t.tok else {
            return fail(
                t.span.start,
                format!(
                    "expected a $variable after 'let', found {}",
                    self.describe(&t)
                ),
            );
        };
        let mut end = t.span.end;
        let mut ty = None;
        if self.peek()?.is(":") {
            self.next()?;
            let mut words = Vec::new();
            let mut stars = 0;
            loop {
                let w = self.peek()?;
                match &w.tok {
                    Tok::Ident(x) if stars == 0 => words.push(x.clone()),
                    Tok::Punct("*") if !words.is_empty() => stars += 1,
                    _ => break,
                }
                end = w.span.end;
                self.next()?;
            }
            if words.is_empty() {
                let w = self.peek()?;
                return fail(
                    w.span.start,
                    format!(
                        "expected a type after 'let ${name}:', found {}",
                        self.describe(&w)
                    ),
                );
            }
            let mut s = words.join(" ");
            if stars > 0 {
                s.push(' ');
                s.push_str(&"*".repeat(stars));
            }
            ty = Some(s);
        }
        let mut value = None;
        if self.peek()?.is("=") {
            self.next()?;
            let v = self.expr()?;
            end = v.span.end;
            value = Some(v);
        }
        Ok(Stmt::Let {
            name,
            ty,
            value,
            span: span(kw.span.start, end),
        })
    }

    fn while_stmt(&mut self) -> PResult<Stmt> {
        let kw = self.next()?;
        let cond = self.condition("while")?;
        let (body, sp) = self.braced_body("the while condition")?;
        Ok(Stmt::While {
            cond,
            body,
            span: span(kw.span.start, sp.end),
        })
    }

    /// `for ($kv : @map) { ... }`
    fn for_stmt(&mut self) -> PResult<Stmt> {
        let kw = self.next()?;
        self.expect("(", "after 'for'")?;
        let v = self.next()?;
        let Tok::Var(var) = v.tok else {
            return Err(self.found(&v, "a $variable after 'for ('", " (for ($kv : @map))"));
        };
        self.expect(":", "after the for variable (for ($kv : @map))")?;
        let m = self.next()?;
        let Tok::Map(map) = m.tok else {
            return Err(self.found(&m, "a @map after ':'", " (for ($kv : @map))"));
        };
        self.expect(")", "after the map of 'for'")?;
        let (body, sp) = self.braced_body("the for header")?;
        Ok(Stmt::For {
            var,
            map,
            body,
            span: span(kw.span.start, sp.end),
        })
    }

    fn unroll_stmt(&mut self) -> PResult<Stmt> {
        let kw = self.next()?;
        self.expect("(", "after 'unroll'")?;
        let t = self.next()?;
        let Tok::Int(count) = t.tok else {
            return fail(
                t.span.start,
                format!(
                    "expected an integer literal as the unroll count, found {}",
                    self.describe(&t)
                ),
            );
        };
        self.expect(")", "after the unroll count")?;
        let (body, sp) = self.braced_body("the unroll count")?;
        Ok(Stmt::Unroll {
            count,
            body,
            span: span(kw.span.start, sp.end),
        })
    }

    // ---- expressions -----------------------------------------------------

    /// A whole expression where `x++` is not allowed (everywhere but the
    /// start of a statement).
    fn expr(&mut self) -> PResult<Expr> {
        let e = self.expr_bp(0)?;
        let t = self.peek()?;
        if t.is("++") || t.is("--") {
            return Err(self.found(
                &t,
                "an operator or the end of the expression",
                " ('++' and '--' are statements, as in '@x++;')",
            ));
        }
        Ok(e)
    }

    /// Precedence climbing: parses operators binding at least `min_bp`.
    fn expr_bp(&mut self, min_bp: u8) -> PResult<Expr> {
        self.enter()?;
        let mut lhs = self.unary()?;
        loop {
            let t = self.peek()?;
            if t.is("?") {
                if TERNARY_BP < min_bp {
                    break;
                }
                self.next()?;
                let then = self.expr_bp(0)?;
                self.expect(":", "in the conditional expression 'c ? a : b'")?;
                // Right-associative: `a ? b : c ? d : e`.
                let els = self.expr_bp(TERNARY_BP)?;
                let sp = span(lhs.span.start, els.span.end);
                lhs = Expr {
                    kind: ExprKind::Ternary {
                        cond: boxed(lhs),
                        then: boxed(then),
                        els: boxed(els),
                    },
                    span: sp,
                };
                continue;
            }
            let Some((op, bp)) = binop(&t) else {
                break;
            };
            if bp < min_bp {
                break;
            }
            if op == BinOp::Div && self.in_predicate {
                let after = self.lex(t.span.end)?;
                if after.is("{") || after.tok == Tok::Eof {
                    break;
                }
            }
            self.next()?;
            let rhs = self.expr_bp(bp + 1)?;
            let sp = span(lhs.span.start, rhs.span.end);
            lhs = Expr {
                kind: ExprKind::Binary {
                    op,
                    lhs: boxed(lhs),
                    rhs: boxed(rhs),
                },
                span: sp,
            };
        }
        self.leave();
        Ok(lhs)
    }

    fn unary(&mut self) -> PResult<Expr> {
        let t = self.peek()?;
        let op = match t.tok {
            Tok::Punct("-") => UnOp::Neg,
            Tok::Punct("!") => UnOp::Not,
            Tok::Punct("~") => UnOp::BitNot,
            Tok::Punct("*") => UnOp::Deref,
            Tok::Punct("++" | "--") => {
                return Err(self.found(
                    &t,
                    "an expression",
                    " ('++' and '--' are statements, as in '++@x;')",
                ))
            }
            Tok::Punct("(") => {
                return match self.cast_type(&t)? {
                    Some((ty, close)) => {
                        self.pos = close;
                        self.enter()?;
                        let e = self.unary()?;
                        self.leave();
                        Ok(Expr {
                            span: span(t.span.start, e.span.end),
                            kind: ExprKind::Cast { ty, expr: boxed(e) },
                        })
                    }
                    None => self.postfix(),
                }
            }
            _ => return self.postfix(),
        };
        self.next()?;
        self.enter()?;
        let e = self.unary()?;
        self.leave();
        Ok(Expr {
            span: span(t.span.start, e.span.end),
            kind: ExprKind::Unary { op, expr: boxed(e) },
        })
    }

    /// If the `(` token `open` starts a cast, returns the type as text
    /// (`struct sock *`) and the position after its `)`.
    fn cast_type(&self, open: &Token) -> PResult<Option<(String, usize)>> {
        let mut pos = open.span.end;
        let mut words = Vec::new();
        loop {
            let t = self.lex(pos)?;
            let Tok::Ident(w) = t.tok else { break };
            words.push(w);
            pos = t.span.end;
        }
        let Some(last) = words.last() else {
            return Ok(None);
        };
        let prefixes_ok = words[..words.len() - 1]
            .iter()
            .all(|w| TYPE_PREFIXES.contains(&w.as_str()));
        if !prefixes_ok || KEYWORDS.contains(&last.as_str()) {
            return Ok(None);
        }
        let mut stars = 0;
        let close = loop {
            let t = self.lex(pos)?;
            if t.is("*") {
                stars += 1;
                pos = t.span.end;
            } else if t.is(")") {
                break t;
            } else {
                return Ok(None);
            }
        };
        if words.len() == 1 && stars == 0 && !SCALAR_TYPES.contains(&last.as_str()) {
            // `(name)` could be a parenthesised identifier or a cast to a
            // typedef: it is a cast only if an operand follows.
            if !self.lex(close.span.end)?.starts_operand() {
                return Ok(None);
            }
        }
        if matches!(words[0].as_str(), "struct" | "union" | "enum") && words.len() != 2 {
            return fail(
                open.span.start,
                format!(
                    "expected a name after '{}' in the cast, found {}",
                    words[0],
                    if words.len() == 1 {
                        "')'".to_string()
                    } else {
                        format!("'{}'", words[2])
                    }
                ),
            );
        }
        let mut ty = words.join(" ");
        if stars > 0 {
            ty.push(' ');
            ty.push_str(&"*".repeat(stars));
        }
        Ok(Some((ty, close.span.end)))
    }

    /// After `(`: a type name and `)` (`struct sock`, `unsigned int *`),
    /// its text and the position after the `)`; None when it is not one.
    fn type_in_parens(&self, open: &Token) -> PResult<Option<(String, usize)>> {
        let mut pos = open.span.end;
        let mut words = Vec::new();
        loop {
            let t = self.lex(pos)?;
            let Tok::Ident(w) = t.tok else { break };
            words.push(w);
            pos = t.span.end;
        }
        let typed = matches!(
            words.first().map(String::as_str),
            Some("struct" | "union" | "enum")
        ) || (!words.is_empty()
            && words.iter().all(|w| SCALAR_TYPES.contains(&w.as_str())));
        if !typed {
            return Ok(None);
        }
        let mut stars = 0;
        loop {
            let t = self.lex(pos)?;
            if t.is("*") {
                stars += 1;
                pos = t.span.end;
            } else if t.is(")") {
                let mut ty = words.join(" ");
                if stars > 0 {
                    ty.push(' ');
                    ty.push_str(&"*".repeat(stars));
                }
                return Ok(Some((ty, t.span.end)));
            } else {
                return Ok(None);
            }
        }
    }

    fn postfix(&mut self) -> PResult<Expr> {
        let mut e = self.primary()?;
        loop {
            let t = self.peek()?;
            if t.is("->") || t.is(".") {
                self.next()?;
                let f = self.next()?;
                let field = match &f.tok {
                    Tok::Ident(name) => name.clone(),
                    // Tuple members: `$t.0`.
                    Tok::Int(n) if t.is(".") => n.to_string(),
                    _ if t.is("->") => return Err(self.found(&f, "a field name after '->'", "")),
                    _ => return Err(self.found(&f, "a field name after '.'", "")),
                };
                e = Expr {
                    span: span(e.span.start, f.span.end),
                    kind: ExprKind::Field {
                        base: boxed(e),
                        field,
                        arrow: t.is("->"),
                    },
                };
            } else if t.is("[") {
                self.next()?;
                let index = self.expr()?;
                let close = self.expect("]", "to close the index")?;
                e = Expr {
                    span: span(e.span.start, close.span.end),
                    kind: ExprKind::Index {
                        base: boxed(e),
                        index: boxed(index),
                    },
                };
            } else {
                return Ok(e);
            }
        }
    }

    fn primary(&mut self) -> PResult<Expr> {
        let t = self.next()?;
        let start = t.span.start;
        let (kind, end) = match t.tok.clone() {
            Tok::Int(v) => (ExprKind::Int(v), t.span.end),
            Tok::Str(s) => (ExprKind::Str(s), t.span.end),
            Tok::Var(n) => (ExprKind::Var(n), t.span.end),
            Tok::Positional(n) => (ExprKind::Positional(n), t.span.end),
            Tok::PositionalCount => (ExprKind::PositionalCount, t.span.end),
            Tok::Map(name) => {
                if self.peek()?.is("[") {
                    self.next()?;
                    let (keys, close) = self.list("]", None)?;
                    (ExprKind::Map { name, keys }, close)
                } else {
                    (
                        ExprKind::Map {
                            name,
                            keys: Vec::new(),
                        },
                        t.span.end,
                    )
                }
            }
            Tok::Ident(name) => {
                if KEYWORDS.contains(&name.as_str()) {
                    return Err(self.found(&t, "an expression", " (a keyword)"));
                }
                if matches!(name.as_str(), "struct" | "union" | "enum") {
                    return Err(self.found(
                        &t,
                        "an expression",
                        " (type names may only appear in casts)",
                    ));
                }
                if self.peek()?.is("(") {
                    let open = self.next()?;
                    // sizeof(struct task_struct): a type, not an expression.
                    if name == "sizeof" {
                        if let Some((ty, close)) = self.type_in_parens(&open)? {
                            self.pos = close;
                            let arg = Expr {
                                kind: ExprKind::TypeName(ty),
                                span: span(open.span.end, close - 1),
                            };
                            return Ok(Expr {
                                kind: ExprKind::Call {
                                    name,
                                    args: vec![arg],
                                },
                                span: span(start, close),
                            });
                        }
                    }
                    let (args, close) = self.list(")", Some(&name))?;
                    (ExprKind::Call { name, args }, close)
                } else {
                    (ExprKind::Ident(name), t.span.end)
                }
            }
            Tok::Punct("(") => {
                let inner = self.expr()?;
                if self.peek()?.is(",") {
                    // A tuple: `(a, b, ...)`.
                    let mut items = vec![inner];
                    while self.peek()?.is(",") {
                        self.next()?;
                        items.push(self.expr()?);
                    }
                    let close = self.expect(")", "to close the tuple")?;
                    return Ok(Expr {
                        kind: ExprKind::Tuple(items),
                        span: span(start, close.span.end),
                    });
                }
                let close = self.expect(")", "to close the parenthesis")?;
                // The parentheses are part of the expression's text.
                return Ok(Expr {
                    kind: inner.kind,
                    span: span(start, close.span.end),
                });
            }
            _ => return Err(self.found(&t, "an expression", "")),
        };
        Ok(Expr {
            kind,
            span: span(start, end),
        })
    }

    /// Comma-separated expressions up to `close` (already past the opener):
    /// the arguments of `call`, or map keys if it is `None`. Returns them
    /// and the end of the closer.
    fn list(&mut self, close: &str, call: Option<&str>) -> PResult<(Vec<Expr>, usize)> {
        let mut items = Vec::new();
        if !self.peek()?.is(close) {
            loop {
                items.push(self.expr()?);
                if self.peek()?.is(",") {
                    self.next()?;
                } else {
                    break;
                }
            }
        }
        let t = self.peek()?;
        if !t.is(close) {
            let expected = match call {
                Some(name) => format!("',' or '{close}' to close the arguments of '{name}'"),
                None => format!("',' or '{close}' to close the map keys"),
            };
            return Err(self.found(&t, &expected, ""));
        }
        self.next()?;
        Ok((items, t.span.end))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// One-liners in the style of bpftrace's tutorial and reference guide;
    /// each was checked with `bpftrace -d` (0.17) to be valid syntax. The
    /// same lines are the project's tests/golden/bt_oneliners.txt fixture.
    const ONELINERS: &[&str] = &[
        r#"BEGIN { printf("hello world\n"); }"#,
        r#"BEGIN { printf("Tracing... Hit Ctrl-C to end.\n"); } END { printf("done\n"); }"#,
        r#"tracepoint:syscalls:sys_enter_openat { printf("%s %s\n", comm, str(args->filename)); }"#,
        r#"tracepoint:syscalls:sys_enter_openat /str(args->filename) == "/etc/passwd"/ { printf("%s opened passwd\n", comm); }"#,
        r#"tracepoint:raw_syscalls:sys_enter { @[comm] = count(); }"#,
        r#"tracepoint:raw_syscalls:sys_enter /pid == 1234/ { @[probe] = count(); }"#,
        r#"tracepoint:syscalls:sys_exit_read /args->ret/ { @[comm] = sum(args->ret); }"#,
        r#"tracepoint:syscalls:sys_exit_read { @[comm] = hist(args->ret); }"#,
        r#"tracepoint:syscalls:sys_exit_read /pid == 18644/ { @bytes = hist(args->ret); }"#,
        r#"tracepoint:syscalls:sys_exit_read /args->ret > 0/ { @bytes = stats(args->ret); }"#,
        r#"tracepoint:syscalls:sys_exit_openat /args->ret < 0/ { @errors[-args->ret] = count(); }"#,
        r#"tracepoint:syscalls:sys_enter_write /args->fd == 1/ { printf("%s\n", str(args->buf, args->count)); }"#,
        r#"tracepoint:syscalls:sys_enter_kill { printf("%d -> %d sig %d\n", pid, args->pid, args->sig); }"#,
        r#"tracepoint:syscalls:sys_enter_nanosleep { printf("%s is sleeping.\n", comm); }"#,
        r#"tracepoint:syscalls:sys_enter_execve { join(args->argv); }"#,
        r#"tracepoint:syscalls:sys_enter_exec* { printf("%-6d ", pid); join(args->argv); }"#,
        r#"tracepoint:syscalls:sys_enter_* { @[probe] = count(); }"#,
        r#"tracepoint:sched:sched* { @[probe] = count(); } interval:s:5 { exit(); }"#,
        r#"tracepoint:sched:sched_switch { @[kstack] = count(); }"#,
        r#"tracepoint:sched:sched_process_exec { printf("%s\n", comm); }"#,
        r#"tracepoint:block:block_rq_issue { @ = hist(args->bytes); }"#,
        r#"t:sched:sched_switch /args->prev_state == 0/ { @[args->prev_comm] = count(); }"#,
        r#"kprobe:do_nanosleep { printf("PID %d sleeping...\n", pid); }"#,
        r#"kprobe:do_sys_open { printf("%s: %s\n", comm, str(arg1)); }"#,
        r#"kprobe:do_sys_open { time("%H:%M:%S "); printf("%s\n", str(arg1)); }"#,
        r#"kprobe:vfs_read { @start[tid] = nsecs; } kretprobe:vfs_read /@start[tid]/ { @ns[comm] = hist(nsecs - @start[tid]); delete(@start[tid]); }"#,
        r#"kprobe:vfs_read { @start[tid] = nsecs; } kretprobe:vfs_read /@start[tid]/ { $dur = nsecs - @start[tid]; if ($dur > 1000000) { printf("slow read %d\n", $dur); } delete(@start[tid]); }"#,
        r#"kprobe:vfs_read /comm == "bash"/ { @reads = count(); }"#,
        r#"kprobe:vfs_read /uid == 0/ { @[username] = count(); }"#,
        r#"kprobe:vfs_read { @[cgroup] = count(); }"#,
        r#"kprobe:vfs_read { @[cpu] = count(); } interval:s:1 { print(@); clear(@); }"#,
        r#"kprobe:vfs_* { @[func] = count(); }"#,
        r#"kprobe:vfs_write { @[pid, comm] = sum(arg2); } END { print(@, 10); clear(@); }"#,
        r#"kprobe:tcp_connect { @[kstack(5)] = count(); }"#,
        r#"kprobe:do_nanosleep { $task = (struct task_struct *)curtask; printf("%d %d\n", $task->pid, $task->tgid); }"#,
        r#"kretprobe:vfs_read { @bytes = hist(retval); }"#,
        r#"kretprobe:vfs_read { @bytes = lhist(retval, 0, 2000, 200); }"#,
        r#"kretprobe:vfs_read { @min = min(retval); @max = max(retval); @avg = avg(retval); }"#,
        r#"kretprobe:do_sys_open* /(int64)retval < 0/ { @fails[comm] = count(); }"#,
        r#"profile:hz:99 { @[kstack] = count(); }"#,
        r#"profile:hz:99 /pid == 189/ { @[ustack] = count(); }"#,
        r#"profile:hz:49 /pid/ { @samples[ustack(perf, 10)] = count(); }"#,
        r#"profile:hz:99 { @[cpu] = count(); }"#,
        r#"software:faults:1 { @[comm] = count(); }"#,
        r#"software:cpu-clock:1000 { @[comm] = count(); }"#,
        r#"hardware:cache-misses:1000000 { @[comm, pid] = count(); }"#,
        r#"interval:s:1 { print(@); clear(@); }"#,
        r#"interval:ms:100 { @ticks++; } END { printf("%d\n", @ticks); }"#,
        r#"uretprobe:/bin/bash:readline { printf("%s\n", str(retval)); }"#,
        r#"uprobe:/bin/bash:readline { printf("arg0: %d\n", arg0); }"#,
        r#"uprobe:libc:malloc { @bytes[comm] = sum(arg0); }"#,
        r#"uretprobe:/lib/x86_64-linux-gnu/libc.so.6:getaddrinfo { printf("%d\n", retval); }"#,
        r#"tracepoint:syscalls:sys_enter_openat { @[str(args->filename)] = count(); }"#,
        r#"kfunc:vfs_read { @[comm] = count(); }"#,
        r#"BEGIN { $i = 0; while ($i < 5) { printf("%d\n", $i); $i++; } exit(); }"#,
        r#"BEGIN { unroll (3) { printf("hi\n"); } exit(); }"#,
        r#"BEGIN { printf("%d args, first %s\n", $#, str($1)); exit(); }"#,
        r#"BEGIN { @x = 5_000; @y = 1e6; @z = 0x10; printf("%d %d %d\n", @x, @y, @z); exit(); }"#,
        r#"kprobe:do_sys_open { @[ksym(reg("ip"))] = count(); }"#,
        r#"kretprobe:inet_csk_accept { $sk = (struct sock *)retval; printf("%s\n", ntop($sk->__sk_common.skc_daddr)); }"#,
        r#"tracepoint:syscalls:sys_enter_read { @reads[comm] += 1; @total -= 0; @flags |= 1; }"#,
        r#"kretprobe:vfs_read { if (retval < 0) { @errors = count(); } else { @bytes = sum(retval); } }"#,
        r#"kretprobe:vfs_read { @sign[retval < 0 ? "error" : "ok"] = count(); }"#,
    ];

    fn ok(src: &str) -> Program {
        match parse(src) {
            Ok(p) => p,
            Err(e) => panic!("{e}\nin: {src}"),
        }
    }

    fn err(src: &str) -> String {
        match parse(src) {
            Ok(p) => panic!("expected an error for {src:?}, got {p:?}"),
            Err(e) => e.to_string(),
        }
    }

    fn op_str(op: BinOp) -> &'static str {
        match op {
            BinOp::Add => "+",
            BinOp::Sub => "-",
            BinOp::Mul => "*",
            BinOp::Div => "/",
            BinOp::Mod => "%",
            BinOp::BitAnd => "&",
            BinOp::BitOr => "|",
            BinOp::BitXor => "^",
            BinOp::Shl => "<<",
            BinOp::Shr => ">>",
            BinOp::Eq => "==",
            BinOp::Ne => "!=",
            BinOp::Lt => "<",
            BinOp::Le => "<=",
            BinOp::Gt => ">",
            BinOp::Ge => ">=",
            BinOp::LAnd => "&&",
            BinOp::LOr => "||",
        }
    }

    fn list(items: impl IntoIterator<Item = String>) -> String {
        items.into_iter().collect::<Vec<_>>().join(" ")
    }

    /// The tree as an S-expression, to assert on shapes compactly.
    fn sx(e: &Expr) -> String {
        match &e.kind {
            ExprKind::Int(v) => v.to_string(),
            ExprKind::Str(s) => format!("{s:?}"),
            ExprKind::Ident(n) => n.clone(),
            ExprKind::Var(n) => format!("${n}"),
            ExprKind::Positional(n) => format!("${n}"),
            ExprKind::PositionalCount => "$#".into(),
            ExprKind::Map { name, keys } if keys.is_empty() => format!("@{name}"),
            ExprKind::Map { name, keys } => format!("@{name}[{}]", list(keys.iter().map(sx))),
            ExprKind::Field { base, field, arrow } => {
                format!("({} {} {field})", if *arrow { "->" } else { "." }, sx(base))
            }
            ExprKind::Index { base, index } => format!("(index {} {})", sx(base), sx(index)),
            ExprKind::Unary { op, expr } => {
                let o = match op {
                    UnOp::Neg => "-",
                    UnOp::Not => "!",
                    UnOp::BitNot => "~",
                    UnOp::Deref => "*",
                };
                format!("({o} {})", sx(expr))
            }
            ExprKind::Binary { op, lhs, rhs } => {
                format!("({} {} {})", op_str(*op), sx(lhs), sx(rhs))
            }
            ExprKind::Ternary { cond, then, els } => {
                format!("(? {} {} {})", sx(cond), sx(then), sx(els))
            }
            ExprKind::Call { name, args } if args.is_empty() => format!("({name})"),
            ExprKind::Call { name, args } => format!("({name} {})", list(args.iter().map(sx))),
            ExprKind::Cast { ty, expr } => format!("(cast '{ty}' {})", sx(expr)),
            ExprKind::Tuple(items) => format!("(tuple {})", list(items.iter().map(sx))),
            ExprKind::TypeName(t) => format!("(type '{t}')"),
        }
    }

    fn sx_block(b: &[Stmt]) -> String {
        format!("[{}]", list(b.iter().map(sx_stmt)))
    }

    fn sx_stmt(s: &Stmt) -> String {
        match s {
            Stmt::Expr(e) => sx(e),
            Stmt::Assign {
                target, op, value, ..
            } => {
                let o = op.map_or(String::new(), |o| op_str(o).to_string());
                format!("({o}= {} {})", sx(target), sx(value))
            }
            Stmt::Incr { target, delta, .. } => {
                format!("({} {})", if *delta > 0 { "++" } else { "--" }, sx(target))
            }
            Stmt::If {
                cond, then, els, ..
            } => format!("(if {} {} {})", sx(cond), sx_block(then), sx_block(els)),
            Stmt::Unroll { count, body, .. } => format!("(unroll {count} {})", sx_block(body)),
            Stmt::While { cond, body, .. } => format!("(while {} {})", sx(cond), sx_block(body)),
            Stmt::Return(_) => "return".into(),
            Stmt::Break(_) => "break".into(),
            Stmt::Continue(_) => "continue".into(),
            Stmt::Block { body, .. } => format!("(block {})", sx_block(body)),
            Stmt::For { var, map, body, .. } => {
                format!("(for ${var} @{map} {})", sx_block(body))
            }
            Stmt::Let {
                name, ty, value, ..
            } => format!(
                "(let ${name} {} {})",
                ty.as_deref().unwrap_or("_"),
                value.as_ref().map_or("_".to_string(), sx)
            ),
        }
    }

    fn stmt_span(s: &Stmt) -> Span {
        match s {
            Stmt::Expr(e) => e.span,
            Stmt::Assign { span, .. }
            | Stmt::Incr { span, .. }
            | Stmt::If { span, .. }
            | Stmt::Unroll { span, .. }
            | Stmt::While { span, .. }
            | Stmt::Return(span)
            | Stmt::Break(span)
            | Stmt::Continue(span)
            | Stmt::Block { span, .. }
            | Stmt::For { span, .. }
            | Stmt::Let { span, .. } => *span,
        }
    }

    /// The statements of the only probe of `BEGIN { <body> }`, as S-expressions.
    fn body(stmts: &str) -> Vec<String> {
        let p = ok(&format!("BEGIN {{ {stmts} }}"));
        p.probes[0].body.iter().map(sx_stmt).collect()
    }

    /// The expression `e` as an S-expression.
    fn ex(e: &str) -> String {
        let p = ok(&format!("BEGIN {{ {e}; }}"));
        match &p.probes[0].body[..] {
            [Stmt::Expr(e)] => sx(e),
            other => panic!("not one expression: {other:?}"),
        }
    }

    fn slice(src: &str, s: Span) -> &str {
        &src[s.start..s.end]
    }

    /// Checks every span in an expression lies inside its parent's.
    fn check_spans(src: &str, e: &Expr, outer: Span) {
        assert!(
            outer.start <= e.span.start && e.span.end <= outer.end && e.span.start < e.span.end,
            "span {:?} of {:?} outside {:?} in {src}",
            e.span,
            slice(src, e.span),
            outer
        );
        let kids: Vec<&Expr> = match &e.kind {
            ExprKind::Map { keys, .. } => keys.iter().collect(),
            ExprKind::Call { args, .. } | ExprKind::Tuple(args) => args.iter().collect(),
            ExprKind::Field { base, .. } => vec![base],
            ExprKind::Index { base, index } => vec![base, index],
            ExprKind::Unary { expr, .. } | ExprKind::Cast { expr, .. } => vec![expr],
            ExprKind::Binary { lhs, rhs, .. } => vec![lhs, rhs],
            ExprKind::Ternary { cond, then, els } => vec![cond, then, els],
            _ => vec![],
        };
        for k in kids {
            check_spans(src, k, e.span);
        }
    }

    fn check_stmt_spans(src: &str, s: &Stmt, outer: Span) {
        let sp = stmt_span(s);
        assert!(outer.start <= sp.start && sp.end <= outer.end, "{s:?}");
        match s {
            Stmt::Expr(e) => check_spans(src, e, sp),
            Stmt::Assign { target, value, .. } => {
                check_spans(src, target, sp);
                check_spans(src, value, sp);
            }
            Stmt::Incr { target, .. } => check_spans(src, target, sp),
            Stmt::If {
                cond, then, els, ..
            } => {
                check_spans(src, cond, sp);
                for s in then.iter().chain(els) {
                    check_stmt_spans(src, s, sp);
                }
            }
            Stmt::Unroll { body, .. } | Stmt::Block { body, .. } | Stmt::For { body, .. } => {
                for s in body {
                    check_stmt_spans(src, s, sp);
                }
            }
            Stmt::Let { value, .. } => {
                if let Some(v) = value {
                    check_spans(src, v, sp);
                }
            }
            Stmt::While { cond, body, .. } => {
                check_spans(src, cond, sp);
                for s in body {
                    check_stmt_spans(src, s, sp);
                }
            }
            Stmt::Return(_) | Stmt::Break(_) | Stmt::Continue(_) => {}
        }
    }

    fn check_program_spans(src: &str, p: &Program) {
        for probe in &p.probes {
            for (text, sp) in &probe.specs {
                assert_eq!(slice(src, *sp), text);
                assert!(probe.span.start <= sp.start);
            }
            assert!(slice(src, probe.span).ends_with('}'));
            if let Some(pred) = &probe.predicate {
                check_spans(src, pred, probe.span);
            }
            for s in &probe.body {
                check_stmt_spans(src, s, probe.span);
            }
        }
    }

    // ---- corpora -----------------------------------------------------------

    #[test]
    fn usr_sbin_scripts_parse() {
        let Ok(dir) = std::fs::read_dir("/usr/sbin") else {
            println!("skipped: /usr/sbin is not readable");
            return;
        };
        let mut paths: Vec<_> = dir
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "bt"))
            .collect();
        paths.sort();
        if paths.is_empty() {
            println!("skipped: no /usr/sbin/*.bt scripts on this machine");
            return;
        }
        for path in &paths {
            let src = std::fs::read_to_string(path).expect("read script");
            match parse(&src) {
                Ok(p) => {
                    assert!(!p.probes.is_empty(), "{}", path.display());
                    check_program_spans(&src, &p);
                }
                Err(e) => panic!("{}:{e}", path.display()),
            }
            // Truncated scripts must fail cleanly, never panic.
            for cut in (0..src.len())
                .step_by(7)
                .filter(|&c| src.is_char_boundary(c))
            {
                let _ = parse(&src[..cut]);
            }
        }
        println!("parsed {} scripts", paths.len());
    }

    #[test]
    fn oneliners_parse() {
        assert!(ONELINERS.len() >= 40);
        for src in ONELINERS {
            let p = ok(src);
            check_program_spans(src, &p);
        }
    }

    // ---- expressions ---------------------------------------------------------

    #[test]
    fn precedence() {
        assert_eq!(ex("1 + 2 * 3"), "(+ 1 (* 2 3))");
        assert_eq!(ex("1 - 2 - 3"), "(- (- 1 2) 3)");
        assert_eq!(ex("8 / 4 % 3"), "(% (/ 8 4) 3)");
        assert_eq!(
            ex("a || b && c | d ^ e & f == g < h << i + j * k"),
            "(|| a (&& b (| c (^ d (& e (== f (< g (<< h (+ i (* j k))))))))))"
        );
        assert_eq!(
            ex("a * b + c << d > e != f & g ^ h | i && j || k"),
            "(|| (&& (| (^ (& (!= (> (<< (+ (* a b) c) d) e) f) g) h) i) j) k)"
        );
        assert_eq!(ex("a <= b >= c"), "(>= (<= a b) c)");
        assert_eq!(ex("-a * b"), "(* (- a) b)");
        assert_eq!(ex("!a == b"), "(== (! a) b)");
        assert_eq!(ex("~a & - - b"), "(& (~ a) (- (- b)))");
        assert_eq!(ex("*a->b"), "(* (-> a b))");
        assert_eq!(ex("(1 + 2) * 3"), "(* (+ 1 2) 3)");
        assert_eq!(ex("c ? a : b ? d : e"), "(? c a (? b d e))");
        assert_eq!(ex("a || b ? c + 1 : d"), "(? (|| a b) (+ c 1) d)");
        assert_eq!(ex("a ? b ? c : d : e"), "(? a (? b c d) e)");
    }

    #[test]
    fn casts() {
        assert_eq!(ex("(uint64)a + b"), "(+ (cast 'uint64' a) b)");
        assert_eq!(ex("(int32)-1"), "(cast 'int32' (- 1))");
        assert_eq!(
            ex("(struct sock *)arg0->sk"),
            "(cast 'struct sock *' (-> arg0 sk))"
        );
        assert_eq!(
            ex("((struct sock *) arg0)->sk"),
            "(-> (cast 'struct sock *' arg0) sk)"
        );
        assert_eq!(ex("(const char *)arg1"), "(cast 'const char *' arg1)");
        assert_eq!(ex("(struct foo **)0"), "(cast 'struct foo **' 0)");
        assert_eq!(ex("(unsigned long)$x"), "(cast 'unsigned long' $x)");
        assert_eq!(ex("(int8*)0"), "(cast 'int8 *' 0)");
        assert_eq!(ex("(pid_t)$x"), "(cast 'pid_t' $x)");
        // A parenthesised name is a cast only when an operand follows.
        assert_eq!(ex("(pid) - 1"), "(- pid 1)");
        assert_eq!(ex("(pid) * 2"), "(* pid 2)");
        assert_eq!(ex("(TASK_RUNNING)"), "TASK_RUNNING");
        assert_eq!(ex("(args)->x"), "(-> args x)");
    }

    #[test]
    fn postfix_and_primaries() {
        assert_eq!(ex("args->filename"), "(-> args filename)");
        assert_eq!(ex("args.filename"), "(. args filename)");
        assert_eq!(
            ex("$sk->__sk_common.skc_v6_daddr.in6_u.u6_addr8"),
            "(. (. (. (-> $sk __sk_common) skc_v6_daddr) in6_u) u6_addr8)"
        );
        assert_eq!(ex("$t.0"), "(. $t 0)");
        assert_eq!(ex("$a[0]"), "(index $a 0)");
        assert_eq!(ex("args->argv[1 + 1]"), "(index (-> args argv) (+ 1 1))");
        assert_eq!(ex("@x[1, 2][3]"), "(index @x[1 2] 3)");
        assert_eq!(ex("@x[comm]"), "@x[comm]");
        assert_eq!(ex("@"), "@");
        assert_eq!(ex("@[pid, comm]"), "@[pid comm]");
        assert_eq!(ex("@x[(1)]"), "@x[1]");
        assert_eq!(ex("$1 + $22"), "(+ $1 $22)");
        assert_eq!(ex("$#"), "$#");
        assert_eq!(ex("$my_var"), "$my_var");
        assert_eq!(ex("exit()"), "(exit)");
        assert_eq!(ex("kstack"), "kstack");
        assert_eq!(ex("kstack(5)"), "(kstack 5)");
        assert_eq!(ex("ustack(perf, 10)"), "(ustack perf 10)");
        assert_eq!(
            ex("printf(\"%d %s\\n\", pid, comm)"),
            "(printf \"%d %s\\n\" pid comm)"
        );
        assert_eq!(ex("join(args->argv)"), "(join (-> args argv))");
        assert_eq!(ex("@m[kstack] == @n"), "(== @m[kstack] @n)");
    }

    #[test]
    fn literals() {
        assert_eq!(ex("1e6"), "1000000");
        assert_eq!(ex("2E3"), "2000");
        assert_eq!(ex("5_000"), "5000");
        assert_eq!(ex("0x1F"), "31");
        assert_eq!(ex("0XffFFffFFffFFffFF"), u64::MAX.to_string());
        assert_eq!(ex("010"), "8");
        assert_eq!(ex("0"), "0");
        assert_eq!(ex("18446744073709551615"), u64::MAX.to_string());
        assert_eq!(ex("'a'"), "97");
        assert_eq!(ex(r"'\n'"), "10");
        assert_eq!(ex(r"'\''"), "39");
        assert_eq!(ex(r"'\x41'"), "65");
        assert_eq!(
            ex(r#""a\n\t\r\"\\\0\x41\101 é""#),
            format!("{:?}", "a\n\t\r\"\\\0AA é")
        );
    }

    #[test]
    fn spans() {
        let src = "BEGIN { $x = (a + b) * @m[1, c]; }";
        let p = ok(src);
        let Stmt::Assign {
            target,
            value,
            span,
            ..
        } = &p.probes[0].body[0]
        else {
            panic!("not an assignment")
        };
        assert_eq!(slice(src, *span), "$x = (a + b) * @m[1, c]");
        assert_eq!(slice(src, target.span), "$x");
        assert_eq!(slice(src, value.span), "(a + b) * @m[1, c]");
        let ExprKind::Binary { lhs, rhs, .. } = &value.kind else {
            panic!("not binary")
        };
        assert_eq!(slice(src, lhs.span), "(a + b)");
        assert_eq!(slice(src, rhs.span), "@m[1, c]");
        let ExprKind::Map { keys, .. } = &rhs.kind else {
            panic!("not a map")
        };
        assert_eq!(slice(src, keys[1].span), "c");
        assert_eq!(slice(src, p.probes[0].span), src);

        let src = "// c\nkprobe:a, kprobe:b\n/pid == 1/\n{ @x++; if (1) { return; } else { @y = -1; } }\n";
        let p = ok(src);
        let probe = &p.probes[0];
        assert_eq!(
            probe.specs,
            vec![
                ("kprobe:a".to_string(), Span { start: 5, end: 13 }),
                ("kprobe:b".to_string(), Span { start: 15, end: 23 }),
            ]
        );
        assert_eq!(slice(src, probe.span), &src[5..src.len() - 1]);
        assert_eq!(
            slice(
                src,
                probe.predicate.as_ref().map(|e| e.span).unwrap_or_default()
            ),
            "pid == 1"
        );
        let spans: Vec<&str> = probe
            .body
            .iter()
            .map(|s| slice(src, stmt_span(s)))
            .collect();
        assert_eq!(spans, ["@x++", "if (1) { return; } else { @y = -1; }"]);
        let Stmt::If { then, els, .. } = &probe.body[1] else {
            panic!("not if")
        };
        assert_eq!(slice(src, stmt_span(&then[0])), "return");
        assert_eq!(slice(src, stmt_span(&els[0])), "@y = -1");
        assert_eq!(line_col(src, stmt_span(&probe.body[1]).start), (4, 9));
    }

    #[test]
    fn line_col_counts_characters() {
        let src = "ab\ncé\n\nx";
        assert_eq!(line_col(src, 0), (1, 1));
        assert_eq!(line_col(src, 2), (1, 3));
        assert_eq!(line_col(src, 3), (2, 1));
        assert_eq!(line_col(src, 6), (2, 3));
        // Inside 'é' is clamped to its start; past the end to the end.
        assert_eq!(line_col(src, 5), (2, 2));
        assert_eq!(line_col(src, 8), (4, 1));
        assert_eq!(line_col(src, 1000), (4, 2));
        assert_eq!(line_col("", 3), (1, 1));
    }

    // ---- statements ----------------------------------------------------------

    #[test]
    fn statement_forms() {
        assert_eq!(
            body("let $a; let $b = 1; let $c: uint8 = 2; let $d: struct sock * = 0; { let $e = 3; $a = $e } $b++"),
            [
                "(let $a _ _)",
                "(let $b _ 1)",
                "(let $c uint8 2)",
                "(let $d struct sock * 0)",
                "(block [(let $e _ 3) (= $a $e)])",
                "(++ $b)"
            ]
        );
        assert_eq!(
            body("$x = 1; @x = 2; @x[1, 2] = 3; @ = 4; @[comm] = 5"),
            [
                "(= $x 1)",
                "(= @x 2)",
                "(= @x[1 2] 3)",
                "(= @ 4)",
                "(= @[comm] 5)"
            ]
        );
        assert_eq!(
            body("$a += 1; $a -= 1; $a *= 1; $a /= 1; $a %= 1; @a &= 1; @a |= 1; @a ^= 1; @a <<= 1; @a >>= 1;"),
            [
                "(+= $a 1)",
                "(-= $a 1)",
                "(*= $a 1)",
                "(/= $a 1)",
                "(%= $a 1)",
                "(&= @a 1)",
                "(|= @a 1)",
                "(^= @a 1)",
                "(<<= @a 1)",
                "(>>= @a 1)"
            ]
        );
        assert_eq!(
            body("@x++; $x--; ++@x; --$y; @m[pid]++; ++@m[tid]"),
            [
                "(++ @x)",
                "(-- $x)",
                "(++ @x)",
                "(-- $y)",
                "(++ @m[pid])",
                "(++ @m[tid])"
            ]
        );
        assert_eq!(
            body("print(@x); clear(@x); delete(@x[k]); exit(); time(\"%H\"); join(args->argv)"),
            [
                "(print @x)",
                "(clear @x)",
                "(delete @x[k])",
                "(exit)",
                "(time \"%H\")",
                "(join (-> args argv))"
            ]
        );
        assert_eq!(
            body("if (a) { @x = 1; } else if (b) { @x = 2 } else { return; } @y = 3"),
            ["(if a [(= @x 1)] [(if b [(= @x 2)] [return])])", "(= @y 3)"]
        );
        assert_eq!(body("if (a) {}"), ["(if a [] [])"]);
        assert_eq!(
            body("unroll (3) { @i++; } while ($i < 10) { $i++; if ($i == 5) { return } }"),
            [
                "(unroll 3 [(++ @i)])",
                "(while (< $i 10) [(++ $i) (if (== $i 5) [return] [])])"
            ]
        );
        assert_eq!(body("return"), ["return"]);
        assert_eq!(
            body("for ($kv : @m) { print($kv.0) } $t = (1, (\"a\", $x)); @k[(1, 2)] = 1"),
            [
                "(for $kv @m [(print (. $kv 0))])",
                "(= $t (tuple 1 (tuple \"a\" $x)))",
                "(= @k[(tuple 1 2)] 1)",
            ]
        );
        assert_eq!(body(""), Vec::<String>::new());
        assert_eq!(body(";; exit();;"), ["(exit)"]);
    }

    #[test]
    fn attach_points_are_raw_text() {
        let specs = [
            "BEGIN",
            "END",
            "tracepoint:syscalls:sys_enter_open",
            "tracepoint:syscalls:sys_enter_exec*",
            "t:sched:sched_switch",
            "kprobe:vfs_read",
            "kretprobe:do_sys_open*",
            "kprobe:lookup_fast.constprop.*",
            "uprobe:/bin/bash:readline",
            "uretprobe:/lib/x86_64-linux-gnu/libc.so.6:getaddrinfo",
            "usdt:/path:provider:name",
            "interval:s:1",
            "interval:ms:100",
            "profile:hz:99",
            "software:cpu-clock:1000",
            "rawtracepoint:sched_switch",
            "kfunc:vfs_read",
            "uprobe:libc:malloc",
            "uprobe:\"/tmp/my app\":main",
            "kprobe:f+0x10",
        ];
        for spec in specs {
            for src in [
                format!("{spec} {{ }}"),
                format!("{spec}{{}}"),
                format!("  {spec}\n/pid/\n{{ exit(); }}"),
            ] {
                let p = ok(&src);
                assert_eq!(p.probes[0].specs[0].0, spec, "{src}");
                check_program_spans(&src, &p);
            }
        }
        let p = ok("kprobe:a,kprobe:b ,\n  kprobe:c /1/ {}");
        let names: Vec<&str> = p.probes[0].specs.iter().map(|s| s.0.as_str()).collect();
        assert_eq!(names, ["kprobe:a", "kprobe:b", "kprobe:c"]);
    }

    #[test]
    fn predicates_divide() {
        let p = ok("kprobe:f /a / b/ { }");
        assert_eq!(
            p.probes[0].predicate.as_ref().map(sx).as_deref(),
            Some("(/ a b)")
        );
        let p = ok("kprobe:f /(nsecs / 1000) > 5/ /* c */\n{ }");
        assert_eq!(
            p.probes[0].predicate.as_ref().map(sx).as_deref(),
            Some("(> (/ nsecs 1000) 5)")
        );
        let p = ok("uprobe:/bin/sh:main /@x[tid] != 0/{}");
        assert_eq!(p.probes[0].specs[0].0, "uprobe:/bin/sh:main");
        assert_eq!(
            p.probes[0].predicate.as_ref().map(sx).as_deref(),
            Some("(!= @x[tid] 0)")
        );
    }

    #[test]
    fn preamble() {
        let src = "#!/usr/bin/env bpftrace\n#include <linux/sched.h>\n#ifndef BPFTRACE_HAVE_BTF\n#include \"net/sock.h\" // x\nstruct foo {\n  int a; // }\n  struct { int b; } c;\n};\n#else\n#endif\nBEGIN { }\n";
        let p = ok(src);
        assert_eq!(p.includes, ["<linux/sched.h>", "\"net/sock.h\""]);
        assert_eq!(p.probes.len(), 1);
        assert_eq!(p.probes[0].specs[0].0, "BEGIN");
    }

    // ---- real script shapes --------------------------------------------------

    #[test]
    fn opensnoop_shape() {
        let src = r#"
tracepoint:syscalls:sys_enter_open,
tracepoint:syscalls:sys_enter_openat
{
	@filename[tid] = args->filename;
}

tracepoint:syscalls:sys_exit_open,
tracepoint:syscalls:sys_exit_openat
/@filename[tid]/
{
	$ret = args->ret;
	$fd = $ret >= 0 ? $ret : -1;
	$errno = $ret >= 0 ? 0 : - $ret;

	printf("%-6d %-16s %4d %3d %s\n", pid, comm, $fd, $errno,
	    str(@filename[tid]));
	delete(@filename[tid]);
}

END
{
	clear(@filename);
}
"#;
        let p = ok(src);
        assert_eq!(p.probes.len(), 3);
        let enter = &p.probes[0];
        assert_eq!(
            enter.specs.iter().map(|s| s.0.as_str()).collect::<Vec<_>>(),
            [
                "tracepoint:syscalls:sys_enter_open",
                "tracepoint:syscalls:sys_enter_openat"
            ]
        );
        assert_eq!(enter.predicate, None);
        assert_eq!(
            sx_block(&enter.body),
            "[(= @filename[tid] (-> args filename))]"
        );
        let exit = &p.probes[1];
        assert_eq!(
            exit.predicate.as_ref().map(sx).as_deref(),
            Some("@filename[tid]")
        );
        assert_eq!(
            exit.body.iter().map(sx_stmt).collect::<Vec<_>>(),
            [
                "(= $ret (-> args ret))",
                "(= $fd (? (>= $ret 0) $ret (- 1)))",
                "(= $errno (? (>= $ret 0) 0 (- $ret)))",
                "(printf \"%-6d %-16s %4d %3d %s\\n\" pid comm $fd $errno (str @filename[tid]))",
                "(delete @filename[tid])"
            ]
        );
        assert_eq!(sx_block(&p.probes[2].body), "[(clear @filename)]");
        assert_eq!(line_col(src, exit.span.start), (8, 1));
        check_program_spans(src, &p);
    }

    #[test]
    fn runqlat_shape() {
        let src = r#"#include <linux/sched.h>

tracepoint:sched:sched_wakeup,
tracepoint:sched:sched_wakeup_new
{
	@qtime[args->pid] = nsecs;
}

tracepoint:sched:sched_switch
{
	if (args->prev_state == TASK_RUNNING) {
		@qtime[args->prev_pid] = nsecs;
	}

	$ns = @qtime[args->next_pid];
	if ($ns) {
		@usecs = hist((nsecs - $ns) / 1000);
	}
	delete(@qtime[args->next_pid]);
}
"#;
        let p = ok(src);
        assert_eq!(p.includes, ["<linux/sched.h>"]);
        assert_eq!(
            sx_block(&p.probes[0].body),
            "[(= @qtime[(-> args pid)] nsecs)]"
        );
        assert_eq!(
            p.probes[1].body.iter().map(sx_stmt).collect::<Vec<_>>(),
            [
                "(if (== (-> args prev_state) TASK_RUNNING) [(= @qtime[(-> args prev_pid)] nsecs)] [])",
                "(= $ns @qtime[(-> args next_pid)])",
                "(if $ns [(= @usecs (hist (/ (- nsecs $ns) 1000)))] [])",
                "(delete @qtime[(-> args next_pid)])"
            ]
        );
        check_program_spans(src, &p);
    }

    #[test]
    fn execsnoop_shape() {
        let src = "BEGIN\n{\n\tprintf(\"%-10s %-5s %s\\n\", \"TIME(ms)\", \"PID\", \"ARGS\");\n}\n\ntracepoint:syscalls:sys_enter_exec*\n{\n\tprintf(\"%-10u %-5d \", elapsed / 1e6, pid);\n\tjoin(args->argv);\n}\n";
        let p = ok(src);
        assert_eq!(
            p.probes[1].specs[0].0,
            "tracepoint:syscalls:sys_enter_exec*"
        );
        assert_eq!(
            p.probes[1].body.iter().map(sx_stmt).collect::<Vec<_>>(),
            [
                "(printf \"%-10u %-5d \" (/ elapsed 1000000) pid)",
                "(join (-> args argv))"
            ]
        );
        check_program_spans(src, &p);
    }

    // ---- errors ----------------------------------------------------------------

    #[test]
    fn errors_are_precise() {
        let cases: &[(&str, &str)] = &[
            (
                "BEGIN {\n  printf(\"a\")\n  printf(\"b\");\n}",
                "3:3: expected ';' or '}' after a statement, found 'printf'",
            ),
            (
                "BEGIN {\n  exit();\n",
                "3:1: expected '}' to close the block opened at 1:7, found end of input",
            ),
            (
                "BEGIN {\n  if (1) {\n    exit();\n}\nEND { }",
                "5:5: expected ';' or '}' after a statement, found '{' (is a '}' missing before this probe?)",
            ),
            (
                "BEGIN { printf(\"abc); }\nEND {}",
                "1:16: unterminated string: expected '\"' before the end of the line",
            ),
            (
                "BEGIN { printf(\"abc",
                "1:16: unterminated string: expected '\"', found end of input",
            ),
            (
                "BEGIN { @x = 1 ` 2; }",
                "1:16: expected an operator, a value or punctuation, found invalid character '`'",
            ),
            (
                "BEGIN {\n  @x[1 = 2;\n}",
                "2:8: expected ',' or ']' to close the map keys, found '='",
            ),
            (
                "BEGIN { @x[",
                "1:12: expected an expression, found end of input",
            ),
            (
                "BEGIN { if (1) exit(); }",
                "1:16: expected '{' after the if condition (braces are required), found 'exit'",
            ),
            (
                "BEGIN { if (1) { } else exit(); }",
                "1:25: expected '{' or 'if' after 'else' (braces are required), found 'exit'",
            ),
            (
                "BEGIN { if 1 { } }",
                "1:12: expected '(' after 'if', found '1'",
            ),
            (
                "BEGIN {\n  exit();\n\ntracepoint:sched:sched_switch { }",
                "4:11: expected ';' or '}' after a statement, found ':' (is a '}' missing before this probe?)",
            ),
            (
                "kprobe:f / / { }",
                "1:10: empty predicate: expected an expression between '/' and '/'",
            ),
            (
                "kprobe:f /pid { }",
                "1:15: expected '/' to end the predicate, found '{'",
            ),
            (
                "kprobe:f\nkprobe:g { }",
                "2:1: expected ',', a predicate '/.../' or '{' after attach point 'kprobe:f', found 'kprobe'",
            ),
            (
                "kprobe:f, { }",
                "1:11: expected an attach point such as 'BEGIN' or 'kprobe:vfs_read', found '{'",
            ),
            ("BEGIN { } }", "1:11: expected an attach point such as 'BEGIN' or 'kprobe:vfs_read', found '}'"),
            ("", "1:1: expected a probe such as 'BEGIN { ... }', found end of input"),
            (
                "// nothing\n#include <x.h>\n",
                "3:1: expected a probe such as 'BEGIN { ... }', found end of input",
            ),
            (
                "#define N(x) x\nBEGIN { }",
                "1:9: #define N(...): macros with parameters are not supported by bpfscope run (object-like macros are)",
            ),
            ("#define\nBEGIN { }", "1:8: expected a macro name after #define, found '\\n'"),
            (
                "#pragma once\nBEGIN { }",
                "1:1: expected #include or a conditional (#if, #ifdef, #ifndef, #else, #endif), found '#pragma'",
            ),
            ("#include linux\nBEGIN { }", "1:10: expected <file> or \"file\" after #include, found 'l'"),
            ("BEGIN { /* x", "1:9: unterminated comment: expected '*/', found end of input"),
            ("BEGIN { $x = (1, 2; }", "1:19: expected ')' to close the tuple, found ';'"),
            ("BEGIN { for (kv : @m) { } }", "1:14: expected a $variable after 'for (', found 'kv' (for ($kv : @map))"),
            ("BEGIN { for ($kv in @m) { } }", "1:18: expected ':' after the for variable (for ($kv : @map)), found 'in'"),
            ("BEGIN { for ($kv : $m) { } }", "1:20: expected a @map after ':', found '$m' (for ($kv : @map))"),
            ("BEGIN { let x = 1; }", "1:13: expected a $variable after 'let', found 'x'"),
            ("BEGIN { let $x: = 1; }", "1:17: expected a type after 'let $x:', found '='"),
            ("BEGIN { $x = @y++; }", "1:16: expected an operator or the end of the expression, found '++' ('++' and '--' are statements, as in '@x++;')"),
            ("BEGIN { $x = ++@y; }", "1:14: expected an expression, found '++' ('++' and '--' are statements, as in '++@x;')"),
            ("BEGIN { args->x = 1; }", "1:9: expected a $variable or @map before '=', found an expression"),
            ("BEGIN { pid++; }", "1:9: expected a $variable or @map with '++', found an expression"),
            ("BEGIN { unroll ($1) { } }", "1:17: expected an integer literal as the unroll count, found '$1'"),
            ("BEGIN { else { } }", "1:9: expected a statement, found 'else' without an 'if' block before it"),
            ("BEGIN { $x = 1 +; }", "1:17: expected an expression, found ';'"),
            ("BEGIN { $x = 10ms; }", "1:14: invalid integer literal '10ms': expected a digit or the end of the number, found 'm'"),
            ("BEGIN { $x = 1.5; }", "1:14: expected an integer, found the floating-point literal '1.5' (bpftrace has no floating point)"),
            ("BEGIN { $x = 0x; }", "1:14: expected hex digits after '0x', found ';'"),
            ("BEGIN { $x = 09; }", "1:14: invalid digit '9' in octal literal '09'"),
            ("BEGIN { $x = 99999999999999999999; }", "1:14: integer literal '99999999999999999999' does not fit in 64 bits"),
            ("BEGIN { $x = 1e20; }", "1:14: integer literal '1e20' does not fit in 64 bits"),
            ("BEGIN { $x = \"\\q\"; }", "1:15: invalid escape '\\q' in string: expected one of \\n \\t \\r \\\" \\\\ \\' \\0 \\NNN \\xNN"),
            ("BEGIN { $x = \"\\xff\"; }", "1:15: escape '\\xff' is not ASCII; expected a value of at most 0x7f"),
            ("BEGIN { $x = 'ab'; }", "1:14: invalid character literal: expected one ASCII character or escape between single quotes"),
            ("BEGIN { $ = 1; }", "1:9: expected a variable name, a digit or '#' after '$', found ' '"),
            ("BEGIN { $x = args->; }", "1:20: expected a field name after '->', found ';'"),
            ("BEGIN { $x = (struct)0; }", "1:14: expected a name after 'struct' in the cast, found ')'"),
            ("BEGIN { $x = foo(struct foo); }", "1:18: expected an expression, found 'struct' (type names may only appear in casts)"),
            ("BEGIN { $x = a ? b; }", "1:19: expected ':' in the conditional expression 'c ? a : b', found ';'"),
            ("BEGIN { f(1, 2; }", "1:15: expected ',' or ')' to close the arguments of 'f', found ';'"),
            ("BEGIN { $x = if; }", "1:14: expected an expression, found 'if' (a keyword)"),
            ("struct x { int a; }\nBEGIN { }", "2:1: expected ';' after the C definition, found 'BEGIN'"),
            ("BEGIN { printf(\"%s\", \"a very long string that goes on and on\" \"x\"); }", "1:63: expected ',' or ')' to close the arguments of 'printf', found string \"x\""),
            ("BEGIN { exit() \"a very long string that goes on and on\"; }", "1:16: expected ';' or '}' after a statement, found string \"a very long string that goes ..."),
        ];
        let wrong: Vec<String> = cases
            .iter()
            .filter(|(src, want)| err(src) != *want)
            .map(|(src, want)| format!("{src:?}\n  got:  {}\n  want: {want}", err(src)))
            .collect();
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    #[test]
    fn deep_nesting_is_refused_not_a_crash() {
        let deep = format!(
            "BEGIN {{ $x = {}1{}; }}",
            "(".repeat(5000),
            ")".repeat(5000)
        );
        assert!(err(&deep).contains("nesting too deep"));
        let deep = format!("BEGIN {{ $x = {}1; }}", "!".repeat(5000));
        assert!(err(&deep).contains("nesting too deep"));
        let deep = format!("BEGIN {{ {} }}", "if (1) { ".repeat(5000));
        assert!(err(&deep).contains("nesting too deep"));
        let chain = format!(
            "BEGIN {{ if (1) {{ }}{} }}",
            " else if (1) { }".repeat(5000)
        );
        assert!(err(&chain).contains("nesting too deep"));
        // The deepest accepted nesting fits in a default 2 MiB thread even
        // in a debug build (about 1.1 MiB measured; a tenth of that in release).
        let near_limit = [
            format!(
                "BEGIN {{ $x = {}1{}; }}",
                "(".repeat(MAX_DEPTH - 2),
                ")".repeat(MAX_DEPTH - 2)
            ),
            format!("BEGIN {{ $x = {}1; }}", "!".repeat(MAX_DEPTH - 2)),
            format!(
                "BEGIN {{ $x = {}1{}; }}",
                "f(".repeat(MAX_DEPTH - 2),
                ")".repeat(MAX_DEPTH - 2)
            ),
            format!(
                "BEGIN {{ $x = {}1{}; }}",
                "@m[".repeat(MAX_DEPTH - 2),
                "]".repeat(MAX_DEPTH - 2)
            ),
            format!(
                "BEGIN {{ {}{} }}",
                "if (1) { ".repeat(MAX_DEPTH / 2 - 1),
                "}".repeat(MAX_DEPTH / 2 - 1)
            ),
        ];
        for src in near_limit {
            let child = std::thread::Builder::new()
                .stack_size(2 << 20)
                .spawn(move || parse(&src).map(|_| ()))
                .expect("spawn");
            assert_eq!(child.join().expect("no stack overflow"), Ok(()));
        }
        // Reasonable nesting is fine.
        ok(&format!(
            "BEGIN {{ $x = {}1{}; }}",
            "(".repeat(30),
            ")".repeat(30)
        ));
    }

    // ---- robustness --------------------------------------------------------------

    /// Every prefix of every one-liner fails cleanly or parses.
    #[test]
    fn truncations_do_not_panic() {
        for src in ONELINERS {
            for cut in (0..=src.len()).filter(|&c| src.is_char_boundary(c)) {
                let _ = parse(&src[..cut]);
            }
        }
    }

    const VOCAB: &[&str] = &[
        "BEGIN",
        "kprobe:f",
        "uprobe:/a/b:c",
        "{",
        "}",
        "(",
        ")",
        "[",
        "]",
        "/",
        "//",
        "/*",
        "*/",
        ",",
        ";",
        "@",
        "@x",
        "$",
        "$1",
        "$#",
        "$y",
        "\"",
        "'",
        "\\",
        "\"s\\n\"",
        "'c'",
        "->",
        ".",
        "?",
        ":",
        "=",
        "+=",
        "++",
        "--",
        "-",
        "*",
        "!",
        "~",
        "<<=",
        "&&",
        "||",
        "if",
        "else",
        "while",
        "unroll",
        "return",
        "let $v",
        "let $v: uint8",
        "for",
        "{ }",
        "struct",
        "(struct s *)",
        "(uint64)",
        "0x",
        "1e",
        "1e6",
        "077",
        "09",
        "#include <a.h>",
        "#define X",
        "#",
        "#!",
        "\n",
        " ",
        "é",
        "\0",
        "pid",
        "printf",
        "count()",
        "0",
    ];

    /// A program built from the grammar's productions: its text (every
    /// compound expression parenthesized, so precedence cannot matter) and
    /// the S-expression the parser must read back.
    #[derive(Debug, Clone)]
    struct Gen {
        text: String,
        sx: String,
    }

    fn g(text: impl Into<String>, sx: impl Into<String>) -> Gen {
        Gen {
            text: text.into(),
            sx: sx.into(),
        }
    }

    fn arb_gexpr() -> impl Strategy<Value = Gen> {
        let leaf = prop_oneof![
            (0u64..100_000).prop_map(|v| g(v.to_string(), v.to_string())),
            "[a-z]{1,6}".prop_map(|s| g(format!("\"{s}\""), format!("{s:?}"))),
            prop::sample::select(vec!["pid", "comm", "nsecs", "tid", "cpu", "retval"])
                .prop_map(|n| g(n, n)),
            "[a-z]{1,4}".prop_map(|n| g(format!("${n}"), format!("${n}"))),
            (1u32..9).prop_map(|n| g(format!("${n}"), format!("${n}"))),
            "[a-z]{1,4}".prop_map(|n| g(format!("@{n}"), format!("@{n}"))),
        ];
        leaf.prop_recursive(4, 48, 3, |inner| {
            let ops = prop::sample::select(vec![
                "+", "-", "*", "/", "%", "&", "|", "^", "<<", ">>", "==", "!=", "<", "<=", ">",
                ">=", "&&", "||",
            ]);
            prop_oneof![
                (ops, inner.clone(), inner.clone()).prop_map(|(o, a, b)| g(
                    format!("({} {o} {})", a.text, b.text),
                    format!("({o} {} {})", a.sx, b.sx)
                )),
                (prop::sample::select(vec!["-", "!", "~"]), inner.clone())
                    .prop_map(|(o, a)| g(format!("({o}{})", a.text), format!("({o} {})", a.sx))),
                (inner.clone(), inner.clone(), inner.clone()).prop_map(|(c, a, b)| g(
                    format!("({} ? {} : {})", c.text, a.text, b.text),
                    format!("(? {} {} {})", c.sx, a.sx, b.sx)
                )),
                ("[a-z]{1,4}", prop::collection::vec(inner.clone(), 1..3)).prop_map(|(m, ks)| g(
                    format!(
                        "@{m}[{}]",
                        ks.iter()
                            .map(|k| k.text.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                    format!(
                        "@{m}[{}]",
                        ks.iter()
                            .map(|k| k.sx.as_str())
                            .collect::<Vec<_>>()
                            .join(" ")
                    )
                )),
                (
                    prop::sample::select(vec!["str", "ntop", "bswap", "ksym"]),
                    inner.clone()
                )
                    .prop_map(|(f, a)| g(format!("{f}({})", a.text), format!("({f} {})", a.sx))),
                prop::collection::vec(inner.clone(), 2..4).prop_map(|xs| g(
                    format!(
                        "({})",
                        xs.iter()
                            .map(|x| x.text.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                    format!(
                        "(tuple {})",
                        xs.iter()
                            .map(|x| x.sx.as_str())
                            .collect::<Vec<_>>()
                            .join(" ")
                    )
                )),
                (inner.clone(), "[a-z]{1,5}")
                    .prop_map(|(b, f)| g(format!("{}->{f}", b.text), format!("(-> {} {f})", b.sx))),
                (
                    prop::sample::select(vec!["uint8", "int64", "struct task_struct *"]),
                    inner
                )
                    .prop_map(|(t, a)| g(
                        format!("(({t}){})", a.text),
                        format!("(cast '{t}' {})", a.sx)
                    )),
            ]
        })
    }

    fn arb_gstmts() -> impl Strategy<Value = Gen> {
        let simple = prop_oneof![
            arb_gexpr().prop_map(|e| g(format!("print({})", e.text), format!("(print {})", e.sx))),
            ("[a-z]{1,4}", arb_gexpr())
                .prop_map(|(v, e)| g(format!("${v} = {}", e.text), format!("(= ${v} {})", e.sx))),
            ("[a-z]{1,4}", arb_gexpr(), arb_gexpr()).prop_map(|(m, k, e)| g(
                format!("@{m}[{}] += {}", k.text, e.text),
                format!("(+= @{m}[{}] {})", k.sx, e.sx)
            )),
            ("[a-z]{1,4}", arb_gexpr()).prop_map(|(m, k)| g(
                format!("@{m}[{}] = count()", k.text),
                format!("(= @{m}[{}] (count))", k.sx)
            )),
            Just(g("exit()", "(exit)")),
        ];
        let block = |b: Vec<Gen>| -> (String, String) {
            (
                format!(
                    "{{ {} }}",
                    b.iter()
                        .map(|s| s.text.as_str())
                        .collect::<Vec<_>>()
                        .join("; ")
                ),
                format!(
                    "[{}]",
                    b.iter()
                        .map(|s| s.sx.as_str())
                        .collect::<Vec<_>>()
                        .join(" ")
                ),
            )
        };
        simple.prop_recursive(3, 24, 3, move |inner| {
            let body = prop::collection::vec(inner, 0..3);
            prop_oneof![
                (arb_gexpr(), body.clone(), body.clone()).prop_map(move |(c, t, e)| {
                    let (tt, ts) = block(t);
                    let (et, es) = block(e);
                    g(
                        format!("if ({}) {tt} else {et}", c.text),
                        format!("(if {} {ts} {es})", c.sx),
                    )
                }),
                (arb_gexpr(), body.clone()).prop_map(move |(c, b)| {
                    let (bt, bs) = block(b);
                    g(
                        format!("while ({}) {bt}", c.text),
                        format!("(while {} {bs})", c.sx),
                    )
                }),
                ("[a-z]{1,4}", "[a-z]{1,4}", body).prop_map(move |(v, m, b)| {
                    let (bt, bs) = block(b);
                    g(
                        format!("for (${v} : @{m}) {bt}"),
                        format!("(for ${v} @{m} {bs})"),
                    )
                }),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn arbitrary_text_does_not_panic(s in "\\PC{0,80}") {
            let _ = parse(&s);
        }

        /// Programs of the grammar's own productions parse to the tree
        /// they were made from.
        #[test]
        fn generated_programs_parse_to_their_tree(stmts in prop::collection::vec(arb_gstmts(), 1..4)) {
            let text = format!(
                "BEGIN {{ {} }}",
                stmts.iter().map(|s| s.text.as_str()).collect::<Vec<_>>().join("; ")
            );
            let p = parse(&text).map_err(|e| TestCaseError::fail(format!("{e}\nin: {text}")))?;
            let got: Vec<String> = p.probes[0].body.iter().map(sx_stmt).collect();
            let want: Vec<String> = stmts.iter().map(|s| s.sx.clone()).collect();
            prop_assert_eq!(got, want, "{}", text);
        }

        /// With a byte dropped or one of the grammar's tokens put in, a
        /// generated program parses or fails in one line whose position is
        /// inside the text (or just past its end).
        #[test]
        fn mutated_programs_fail_at_a_position(
            stmt in arb_gstmts(),
            at in any::<prop::sample::Index>(),
            tok in prop::sample::select(VOCAB),
            drop in any::<bool>(),
        ) {
            let mut text = format!("BEGIN {{ {} }}", stmt.text);
            let mut i = at.index(text.len());
            while !text.is_char_boundary(i) {
                i -= 1;
            }
            if drop {
                text.remove(i);
            } else {
                text.insert_str(i, tok);
            }
            if let Err(e) = parse(&text) {
                let msg = e.to_string();
                prop_assert!(!msg.contains('\n'), "{}", msg);
                let lines: Vec<&str> = text.split('\n').collect();
                prop_assert!(e.line >= 1 && e.line <= lines.len(), "{}: {}", text, msg);
                let width = lines[e.line - 1].chars().count();
                prop_assert!(e.col >= 1 && e.col <= width + 1, "{:?}: {}", text, msg);
            }
        }

        #[test]
        fn token_soup_does_not_panic(toks in prop::collection::vec(prop::sample::select(VOCAB), 0..40)) {
            let _ = parse(&toks.join(""));
            let _ = parse(&toks.join(" "));
        }

        #[test]
        fn mutated_oneliners_do_not_panic(
            which in 0..ONELINERS.len(),
            edits in prop::collection::vec((any::<prop::sample::Index>(), 0u8..3, prop::sample::select(VOCAB)), 1..4),
        ) {
            let mut s = ONELINERS[which].to_string();
            for (at, kind, text) in edits {
                let mut i = at.index(s.len() + 1);
                while !s.is_char_boundary(i) {
                    i -= 1;
                }
                match kind {
                    0 => s.insert_str(i, text),
                    1 => {
                        let mut j = (i + text.len()).min(s.len());
                        while !s.is_char_boundary(j) {
                            j -= 1;
                        }
                        s.replace_range(i..j, "");
                    }
                    _ => s.truncate(i),
                }
            }
            let _ = parse(&s);
        }
    }
}
