//! Constants a script names that the kernel's BTF does not hold: the
//! object-like macros of the headers it `#include`s (`CLONE_THREAD`,
//! `AF_INET`), read from the system's header files and evaluated as C
//! integer constant expressions, without a compiler. bpftrace gets them
//! from clang; a header this machine does not have, and a macro that is
//! not a constant (a macro with parameters, a string), give no value, and
//! the name is then unknown where the script uses it.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

/// Headers followed from a script's `#include`s at most this deep.
const MAX_DEPTH: usize = 8;
/// Macros expanded inside one another at most this deep.
const MAX_EXPANSION: usize = 32;

/// Object-like macros by name: their replacement text.
#[derive(Debug, Default, Clone)]
pub struct HeaderMacros {
    defs: HashMap<String, String>,
}

impl HeaderMacros {
    /// The macros of `includes` (as written: `<linux/sched.h>`,
    /// `"net/sock.h"`) and of the headers they include, in the system's
    /// include directories and the running kernel's headers where installed.
    pub fn read(includes: &[String]) -> HeaderMacros {
        let dirs = include_dirs();
        let mut m = HeaderMacros::default();
        let mut seen = HashSet::new();
        for inc in includes {
            let name = inc.trim_matches(|c| matches!(c, '<' | '>' | '"'));
            m.header(name, &dirs, &mut seen, 0);
        }
        m
    }

    fn header(&mut self, name: &str, dirs: &[PathBuf], seen: &mut HashSet<PathBuf>, depth: usize) {
        if depth > MAX_DEPTH {
            return;
        }
        let Some(path) = dirs.iter().map(|d| d.join(name)).find(|p| p.is_file()) else {
            return;
        };
        if !seen.insert(path.clone()) {
            return;
        }
        let Ok(bytes) = std::fs::read(&path) else {
            return;
        };
        let text = String::from_utf8_lossy(&bytes);
        for line in logical_lines(&text) {
            let Some(d) = line.trim_start().strip_prefix('#') else {
                continue;
            };
            let d = d.trim_start();
            if let Some(rest) = d.strip_prefix("include") {
                let rest = rest.trim();
                let inner = rest
                    .strip_prefix('<')
                    .and_then(|r| r.split('>').next())
                    .or_else(|| rest.strip_prefix('"').and_then(|r| r.split('"').next()));
                if let Some(inner) = inner {
                    self.header(inner, dirs, seen, depth + 1);
                }
            } else if let Some(rest) = d.strip_prefix("define") {
                if !rest.starts_with([' ', '\t']) {
                    continue;
                }
                let rest = rest.trim_start();
                let n = rest
                    .bytes()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == b'_')
                    .count();
                // Function-like macros are not constants.
                if n == 0 || rest.as_bytes().get(n) == Some(&b'(') {
                    continue;
                }
                let body = crate::lang::parse::clean_macro_body(&rest[n..]);
                // The first definition wins, as the first #if branch usually does.
                self.defs.entry(rest[..n].to_string()).or_insert(body);
            }
        }
    }

    /// The value of macro `name`, if it is an integer constant expression.
    pub fn value(&self, name: &str) -> Option<i64> {
        self.eval_name(name, 0)
    }

    fn eval_name(&self, name: &str, depth: usize) -> Option<i64> {
        if depth > MAX_EXPANSION {
            return None;
        }
        let body = self.defs.get(name)?;
        let toks = tokens(body)?;
        let mut e = Eval {
            toks: &toks,
            at: 0,
            macros: self,
            depth,
        };
        let v = e.expr(0)?;
        (e.at == toks.len()).then_some(v)
    }
}

/// The include directories searched, in order.
fn include_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = [
        "/usr/local/include",
        "/usr/include/x86_64-linux-gnu",
        "/usr/include",
    ]
    .iter()
    .map(PathBuf::from)
    .collect();
    // The running kernel's own headers, when installed (bpftrace's too).
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    for root in [
        format!("/lib/modules/{}/build", release.trim()),
        format!("/usr/src/linux-headers-{}", release.trim()),
    ] {
        let root = Path::new(&root);
        for sub in [
            "include",
            "include/uapi",
            "arch/x86/include",
            "arch/x86/include/uapi",
            "arch/x86/include/generated",
            "arch/x86/include/generated/uapi",
        ] {
            let d = root.join(sub);
            if d.is_dir() {
                dirs.push(d);
            }
        }
    }
    dirs
}

/// Lines with their backslash continuations joined.
fn logical_lines(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for l in text.lines() {
        match l.strip_suffix('\\') {
            Some(part) => {
                cur.push_str(part);
                cur.push(' ');
            }
            None => {
                cur.push_str(l);
                out.push(std::mem::take(&mut cur));
            }
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Num(i64),
    Ident(String),
    Op(&'static str),
}

const OPS: &[&str] = &[
    "<<", ">>", "<=", ">=", "==", "!=", "&&", "||", "+", "-", "*", "/", "%", "&", "|", "^", "~",
    "!", "(", ")", "<", ">", "?", ":",
];

/// C tokens of a macro body; None for what is not an integer expression
/// (strings, floating point, braces).
fn tokens(s: &str) -> Option<Vec<Tok>> {
    let b = s.as_bytes();
    let mut i = 0;
    let mut out = Vec::new();
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_whitespace() {
            i += 1;
        } else if c.is_ascii_digit() {
            let start = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            let lit = s[start..i].trim_end_matches(['u', 'U', 'l', 'L']);
            let v = if let Some(h) = lit.strip_prefix("0x").or_else(|| lit.strip_prefix("0X")) {
                u64::from_str_radix(h, 16).ok()? as i64
            } else if lit.len() > 1 && lit.starts_with('0') {
                i64::from_str_radix(&lit[1..], 8).ok()?
            } else {
                lit.parse::<u64>().ok()? as i64
            };
            out.push(Tok::Num(v));
        } else if c.is_ascii_alphabetic() || c == b'_' {
            let start = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            out.push(Tok::Ident(s[start..i].to_string()));
        } else if c == b'\'' {
            // A character constant: 'a' or '\n'.
            let (v, len) = match (b.get(i + 1), b.get(i + 2), b.get(i + 3)) {
                (Some(b'\\'), Some(e), Some(b'\'')) => (
                    match e {
                        b'n' => 10,
                        b't' => 9,
                        b'0' => 0,
                        b'r' => 13,
                        x => i64::from(*x),
                    },
                    4,
                ),
                (Some(x), Some(b'\''), _) => (i64::from(*x), 3),
                _ => return None,
            };
            out.push(Tok::Num(v));
            i += len;
        } else {
            let op = OPS.iter().find(|o| s[i..].starts_with(**o))?;
            out.push(Tok::Op(op));
            i += op.len();
        }
    }
    Some(out)
}

/// Words that may make up a cast's type: `(unsigned long)`, `(__u32)`.
fn is_type_word(w: &str) -> bool {
    matches!(
        w,
        "unsigned" | "signed" | "int" | "long" | "short" | "char" | "const" | "volatile"
    ) || w.starts_with("__u")
        || w.starts_with("__s")
        || w.starts_with("u") && w[1..].parse::<u8>().is_ok()
        || w.starts_with("s") && w[1..].parse::<u8>().is_ok()
        || w.ends_with("_t")
}

/// Precedence climbing over a macro's tokens.
struct Eval<'a> {
    toks: &'a [Tok],
    at: usize,
    macros: &'a HeaderMacros,
    depth: usize,
}

impl Eval<'_> {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.at)
    }

    fn binop(t: &Tok) -> Option<(&'static str, u8)> {
        let Tok::Op(o) = t else { return None };
        Some((
            o,
            match *o {
                "?" => 1,
                "||" => 2,
                "&&" => 3,
                "|" => 4,
                "^" => 5,
                "&" => 6,
                "==" | "!=" => 7,
                "<" | "<=" | ">" | ">=" => 8,
                "<<" | ">>" => 9,
                "+" | "-" => 10,
                "*" | "/" | "%" => 11,
                _ => return None,
            },
        ))
    }

    fn expr(&mut self, min: u8) -> Option<i64> {
        let mut lhs = self.unary()?;
        while let Some((op, bp)) = self.peek().and_then(Self::binop) {
            if bp < min {
                break;
            }
            self.at += 1;
            if op == "?" {
                let a = self.expr(0)?;
                if self.peek() != Some(&Tok::Op(":")) {
                    return None;
                }
                self.at += 1;
                let b = self.expr(1)?;
                lhs = if lhs != 0 { a } else { b };
                continue;
            }
            let rhs = self.expr(bp + 1)?;
            lhs = match op {
                "||" => i64::from(lhs != 0 || rhs != 0),
                "&&" => i64::from(lhs != 0 && rhs != 0),
                "|" => lhs | rhs,
                "^" => lhs ^ rhs,
                "&" => lhs & rhs,
                "==" => i64::from(lhs == rhs),
                "!=" => i64::from(lhs != rhs),
                "<" => i64::from(lhs < rhs),
                "<=" => i64::from(lhs <= rhs),
                ">" => i64::from(lhs > rhs),
                ">=" => i64::from(lhs >= rhs),
                "<<" => lhs.wrapping_shl(rhs as u32),
                ">>" => lhs.wrapping_shr(rhs as u32),
                "+" => lhs.wrapping_add(rhs),
                "-" => lhs.wrapping_sub(rhs),
                "*" => lhs.wrapping_mul(rhs),
                "/" => lhs.checked_div(rhs)?,
                "%" => lhs.checked_rem(rhs)?,
                _ => return None,
            };
        }
        Some(lhs)
    }

    fn unary(&mut self) -> Option<i64> {
        let t = self.peek()?.clone();
        self.at += 1;
        match t {
            Tok::Num(v) => Some(v),
            Tok::Ident(n) => self.macros.eval_name(&n, self.depth + 1),
            Tok::Op("-") => self.unary().map(i64::wrapping_neg),
            Tok::Op("+") => self.unary(),
            Tok::Op("~") => self.unary().map(|v| !v),
            Tok::Op("!") => self.unary().map(|v| i64::from(v == 0)),
            Tok::Op("(") => {
                // A cast: type words, maybe stars, then ')'.
                let start = self.at;
                let mut n = 0;
                while let Some(Tok::Ident(w)) = self.peek() {
                    if !is_type_word(w) || self.macros.defs.contains_key(w) {
                        break;
                    }
                    self.at += 1;
                    n += 1;
                }
                while self.peek() == Some(&Tok::Op("*")) && n > 0 {
                    self.at += 1;
                }
                if n > 0 && self.peek() == Some(&Tok::Op(")")) {
                    self.at += 1;
                    return self.unary();
                }
                self.at = start;
                let v = self.expr(0)?;
                if self.peek() != Some(&Tok::Op(")")) {
                    return None;
                }
                self.at += 1;
                Some(v)
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn macros(defs: &[(&str, &str)]) -> HeaderMacros {
        HeaderMacros {
            defs: defs
                .iter()
                .map(|(n, b)| (n.to_string(), b.to_string()))
                .collect(),
        }
    }

    #[test]
    fn constant_expressions_evaluate() {
        let m = macros(&[
            ("A", "0x00010000"),
            ("B", "(A | 0x100)"),
            ("C", "((unsigned long)1 << 4)"),
            ("D", "B"),
            ("E", "(-1)"),
            ("F", "010"),
            ("G", "16UL"),
            ("H", "'a'"),
            ("S", "\"str\""),
            ("FN", "foo(1)"),
            ("LOOP", "LOOP"),
            ("T", "(1 ? 2 : 3)"),
        ]);
        assert_eq!(m.value("A"), Some(0x10000));
        assert_eq!(m.value("B"), Some(0x10100));
        assert_eq!(m.value("C"), Some(16));
        assert_eq!(m.value("D"), Some(0x10100));
        assert_eq!(m.value("E"), Some(-1));
        assert_eq!(m.value("F"), Some(8));
        assert_eq!(m.value("G"), Some(16));
        assert_eq!(m.value("H"), Some(97));
        assert_eq!(m.value("T"), Some(2));
        assert_eq!(m.value("S"), None);
        assert_eq!(m.value("FN"), None);
        assert_eq!(m.value("LOOP"), None);
        assert_eq!(m.value("NOPE"), None);
    }

    #[test]
    fn system_headers_give_their_macros() {
        // linux-libc-dev is a build dependency (the syscall table).
        let m = HeaderMacros::read(&["<linux/sched.h>".to_string()]);
        assert_eq!(m.value("CLONE_THREAD"), Some(0x10000));
        let m = HeaderMacros::read(&["<sys/socket.h>".to_string()]);
        assert_eq!(m.value("AF_INET"), Some(2));
        assert_eq!(m.value("AF_INET6"), Some(10));
    }
}
