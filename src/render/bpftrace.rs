//! Placeholder until the formatter lands (replaced wholesale).
use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Int(i64),
    UInt(u64),
    Str(String),
    Stack(Vec<String>),
    Text(String),
}

#[derive(Debug, Clone, PartialEq)]
pub enum Agg {
    Scalar(Value),
    Count(u64),
    Sum(i64),
    Min(i64),
    Max(i64),
    Avg {
        count: u64,
        sum: i64,
    },
    Stats {
        count: u64,
        sum: i64,
    },
    Hist(BTreeMap<u32, u64>),
    Lhist {
        min: i64,
        max: i64,
        step: i64,
        buckets: BTreeMap<u32, u64>,
    },
}

pub struct MapData {
    pub name: String,
    pub entries: Vec<(Vec<Value>, Agg)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArgKind {
    Int,
    Str,
    Stack,
    Text,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FormatError(pub String);
impl std::fmt::Display for FormatError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn show(v: &Value) -> String {
    match v {
        Value::Int(i) => i.to_string(),
        Value::UInt(u) => u.to_string(),
        Value::Str(s) | Value::Text(s) => s.clone(),
        Value::Stack(f) => f.join("\n"),
    }
}

pub fn print_map(out: &mut String, map: &MapData, _top: usize, _div: u64) {
    for (k, a) in &map.entries {
        let key = if k.is_empty() {
            String::new()
        } else {
            format!("[{}]", k.iter().map(show).collect::<Vec<_>>().join(", "))
        };
        out.push_str(&format!("{}{}: {:?}\n", map.name, key, a));
    }
    out.push('\n');
}
pub fn printf(fmt: &str, args: &[Value]) -> Result<String, FormatError> {
    let mut s = fmt.to_string();
    for a in args {
        s.push_str(&show(a));
        s.push(' ');
    }
    Ok(s)
}
pub fn check_format(_fmt: &str, _kinds: &[ArgKind]) -> Result<(), FormatError> {
    Ok(())
}
pub fn time(fmt: Option<&str>, _unix_ns: i128) -> String {
    fmt.unwrap_or("").to_string()
}
pub fn print_value(out: &mut String, v: &Value) {
    out.push_str(&show(v));
    out.push('\n');
}
pub fn json_map(map: &MapData, top: usize, div: u64) -> String {
    let mut s = String::new();
    print_map(&mut s, map, top, div);
    s
}
pub fn json_printf(text: &str) -> String {
    text.to_string()
}
pub fn json_time(text: &str) -> String {
    text.to_string()
}
pub fn json_attached(n: usize) -> String {
    n.to_string()
}
pub fn json_value(v: &Value) -> String {
    show(v)
}
pub fn exit_maps_order(names: &mut Vec<String>) {
    names.sort();
}
