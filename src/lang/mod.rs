//! The expression language of bpfscope: one lexer, one parser and one
//! syntax tree for the `--filter` expressions of the tracing verbs and for
//! the bpftrace-language scripts `bpfscope run` compiles. `filter` narrows
//! a parsed expression to what its in-kernel filter runs; `script` lowers
//! whole programs.

pub mod ast;
pub mod parse;
