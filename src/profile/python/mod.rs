//! Python frames in profiles (the kernel side is python.bpf.h). Here:
//! finding CPython in the files the unwinder is told about (its version,
//! its eval loop, its runtime state) and handing the kernel side the
//! version's struct offsets; then keeping the code objects the kernel
//! side announces, so that each stored Python frame (code id, instruction
//! offset) can be named `function (file.py:LINE)`, even after the process
//! has gone.

pub mod offsets;

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use anyhow::{Context, Result};
use libbpf_rs::{MapCore, MapFlags};
use object::{Object, ObjectSection};

use bpfscope_bpf::profile::types::{
    bp_code_note, bp_interp, bp_interp_kind, bp_interp_limits, bp_py_offsets,
};
use bpfscope_symbolize::pylines;
use bpfscope_sys::pod;

/// The eval loop's symbol: every Python call runs in an activation of it.
const EVAL: &str = "_PyEval_EvalFrameDefault";
const RUNTIME: &str = "_PyRuntime";

/// What a file holds, as far as Python frames go.
#[derive(Debug, Clone, PartialEq)]
pub enum Found {
    /// No CPython runtime in it.
    None,
    /// CPython whose frames cannot be read: the reason, for a note.
    Unsupported(String),
    Python(PyFile),
}

/// A CPython interpreter in an ELF file (the `python3.X` executable or
/// `libpython3.X.so`), in virtual addresses.
#[derive(Debug, Clone, PartialEq)]
pub struct PyFile {
    pub major: u8,
    pub minor: u8,
    pub runtime: u64,
    /// The eval loop, and its cold part where the symbols show one.
    pub eval: Vec<(u64, u64)>,
}

/// Looks for CPython in an ELF file. Only files whose name says python are
/// read (every other file the unwinder meets would be read for nothing).
pub fn detect(open: &Path, name: &str) -> Found {
    let base = name.rsplit('/').next().unwrap_or(name);
    if !base.contains("python") {
        return Found::None;
    }
    // Read on demand: the symbol tables and one word of data, not the
    // whole file (libpython with debug info is over 20 MB).
    let Ok(file) = std::fs::File::open(open) else {
        return Found::None;
    };
    let cache = object::ReadCache::new(file);
    detect_in(&cache, base)
}

fn detect_in<'d, R: object::ReadRef<'d>>(data: R, base: &str) -> Found {
    use object::read::elf::{ElfFile64, FileHeader, SectionHeader, Sym};
    let Ok(elf) = ElfFile64::<object::Endianness, R>::parse(data) else {
        return Found::None;
    };
    let endian = elf.endian();
    let Ok(sections) = elf.elf_header().sections(endian, data) else {
        return Found::None;
    };
    let mut runtime = None;
    let mut eval = Vec::new();
    let mut py_version_at = None;
    for kind in [object::elf::SHT_DYNSYM, object::elf::SHT_SYMTAB] {
        let Ok(table) = sections.symbols(endian, data, kind) else {
            continue;
        };
        // Its strings in one read: the table's own string table reads each
        // name on its own, through a read cache a pair of system calls per
        // symbol (35,000 for libpython).
        let Ok(strings) = sections
            .section(table.string_section())
            .and_then(|s| s.data(endian, data))
        else {
            continue;
        };
        let strings = object::StringTable::new(strings, 0, strings.len() as u64);
        for sym in table.symbols() {
            let Ok(n) = sym.name(endian, strings) else {
                continue;
            };
            // Extension modules (`_json`, `_asyncio`, ...) refer to the
            // runtime's symbols without defining them: only a definition
            // says the runtime is in this file.
            if sym.st_shndx(endian) == object::elf::SHN_UNDEF {
                continue;
            }
            let (value, size) = (sym.st_value(endian), sym.st_size(endian));
            let range = (value, value + size.max(1));
            if n == RUNTIME.as_bytes() {
                runtime = Some(value);
            } else if n == b"Py_Version" {
                py_version_at = Some(value);
            } else if n
                .strip_prefix(EVAL.as_bytes())
                .is_some_and(|rest| rest.is_empty() || rest.starts_with(b".cold"))
            {
                eval.push(range);
            }
        }
    }
    let py_version = py_version_at.and_then(|a| read_u32(&elf, data, a));
    let Some(runtime) = runtime else {
        return Found::None;
    };
    // 3.11 and later say their version in Py_Version (0xMMmmPPxx); older
    // ones only in their file name.
    let version = py_version
        .map(|v| ((v >> 24) as u8, (v >> 16) as u8))
        .or_else(|| version_in_name(base));
    let Some((major, minor)) = version else {
        return Found::Unsupported(format!(
            "{base}: a Python runtime of unknown version (its frames show as the interpreter's)"
        ));
    };
    if offsets::offsets(major, minor).is_none() {
        return Found::Unsupported(format!(
            "{base}: Python {major}.{minor} is not supported (3.9 to 3.13): its frames show as the interpreter's"
        ));
    }
    eval.sort_unstable();
    eval.dedup();
    if eval.is_empty() {
        return Found::Unsupported(format!(
            "{base}: Python {major}.{minor} without the symbol {EVAL}: its frames show as the interpreter's"
        ));
    }
    Found::Python(PyFile {
        major,
        minor,
        runtime,
        eval,
    })
}

/// A u32 at a virtual address of the file's data (read alone, not with
/// its section).
fn read_u32<'d, R: object::ReadRef<'d>>(
    obj: &object::read::elf::ElfFile64<'d, object::Endianness, R>,
    data: R,
    addr: u64,
) -> Option<u32> {
    obj.sections().find_map(|s| {
        if addr < s.address() || addr + 4 > s.address() + s.size() {
            return None;
        }
        let (off, _) = s.file_range()?;
        let b = data.read_bytes_at(off + (addr - s.address()), 4).ok()?;
        Some(u32::from_ne_bytes(b.try_into().ok()?))
    })
}

/// `python3.10`, `libpython3.9.so.1.0` -> (3, 10), (3, 9).
fn version_in_name(base: &str) -> Option<(u8, u8)> {
    let at = base.find("python")? + "python".len();
    let rest = &base[at..];
    let (major, rest) = rest.split_once('.')?;
    let minor: String = rest.chars().take_while(char::is_ascii_digit).collect();
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// The interpreters the kernel side knows, by file.
#[derive(Debug, Default)]
pub struct Interpreters {
    next: u32,
    /// Files by build id (a file under several paths is one interpreter).
    by_build_id: HashMap<Vec<u8>, u32>,
    /// Versions found, for -v and notes: "python3.11 (3.11)".
    pub found: Vec<String>,
    /// Files with a Python runtime whose frames cannot be read.
    pub unsupported: Vec<String>,
    /// `--lang` left Python out: no file is looked at.
    pub disabled: bool,
}

impl Interpreters {
    /// One line each: interpreters found (with -v), then those whose
    /// frames cannot be read (always).
    pub fn notes(&self, verbose: bool) -> Vec<String> {
        self.found
            .iter()
            .filter(|_| verbose)
            .map(|f| format!("Python frames from {f}"))
            .chain(self.unsupported.iter().cloned())
            .collect()
    }

    /// The `interps` index of a file (0: none): detected, and written to
    /// the kernel side, the first time a file is seen. `delta` is the
    /// executable segment's vaddr - file offset.
    pub fn for_file(
        &mut self,
        map: &libbpf_rs::Map<'_>,
        build_id: &[u8],
        open: &Path,
        name: &str,
        delta: u64,
    ) -> Result<u32> {
        if self.disabled {
            return Ok(0);
        }
        if let Some(&i) = self.by_build_id.get(build_id) {
            return Ok(i);
        }
        let index = match detect(open, name) {
            Found::None => 0,
            Found::Unsupported(why) => {
                if !self.unsupported.contains(&why) {
                    self.unsupported.push(why);
                }
                0
            }
            Found::Python(py) => self.add(map, &py, name, delta)?,
        };
        if !build_id.is_empty() {
            self.by_build_id.insert(build_id.to_vec(), index);
        }
        Ok(index)
    }

    fn add(
        &mut self,
        map: &libbpf_rs::Map<'_>,
        py: &PyFile,
        name: &str,
        delta: u64,
    ) -> Result<u32> {
        let Some(o) = offsets::offsets(py.major, py.minor) else {
            return Ok(0);
        };
        if self.next + 1 >= bp_interp_limits::BP_MAX_INTERPS.0 {
            self.unsupported.push(format!(
                "{name}: more Python interpreters than bpfscope tracks at once (63)"
            ));
            return Ok(0);
        }
        self.next += 1;
        let mut v = bp_interp {
            kind: bp_interp_kind::BP_INTERP_PYTHON.0,
            version: (u32::from(py.major) << 8) | u32::from(py.minor),
            runtime_rel: py.runtime.wrapping_sub(delta) as i64,
            o: to_bpf(o),
            ..Default::default()
        };
        for (i, &(s, e)) in py.eval.iter().take(2).enumerate() {
            v.eval_start[i] = s.wrapping_sub(delta);
            v.eval_end[i] = e.wrapping_sub(delta);
        }
        map.update(&self.next.to_ne_bytes(), pod::bytes(&v), MapFlags::ANY)
            .context("loading a Python interpreter's layout")?;
        self.found
            .push(format!("{name} (Python {}.{})", py.major, py.minor));
        Ok(self.next)
    }
}

fn to_bpf(o: &offsets::PyOffsets) -> bp_py_offsets {
    bp_py_offsets {
        runtime_interpreters_head: o.runtime_interpreters_head,
        interp_threads_head: o.interp_threads_head,
        tstate_next: o.tstate_next,
        tstate_thread_id: o.tstate_thread_id,
        tstate_native_thread_id: o.tstate_native_thread_id,
        tstate_frame: o.tstate_frame,
        cframe_current_frame: o.cframe_current_frame,
        frame_previous: o.frame_previous,
        frame_code: o.frame_code,
        frame_lasti: o.frame_lasti,
        frame_is_entry: o.frame_is_entry,
        frame_owner: o.frame_owner,
        owner_cstack: o.owner_cstack,
        code_filename: o.code_filename,
        code_name: o.code_name,
        code_qualname: o.code_qualname,
        code_firstlineno: o.code_firstlineno,
        code_linetable: o.code_linetable,
        code_code_adaptive: o.code_code_adaptive,
        unicode_state: o.unicode_state,
        unicode_length: o.unicode_length,
        unicode_ascii_data: o.unicode_ascii_data,
        unicode_compact_data: o.unicode_compact_data,
        bytes_size: o.bytes_size,
        bytes_data: o.bytes_data,
    }
}

/// A code object as announced.
#[derive(Debug, Clone)]
pub struct Code {
    pub major: u8,
    pub minor: u8,
    pub name: String,
    pub file: String,
    pub firstlineno: u32,
    pub table: Vec<u8>,
    /// The table is whole (3.9's cannot tell a prefix from the whole).
    pub complete: bool,
}

/// The code objects the kernel side announced, by id.
#[derive(Debug, Default)]
pub struct Codes {
    codes: HashMap<u32, Code>,
    /// Line tables longer than an announcement carries that could not be
    /// read whole (the process had gone): their later lines are unknown.
    pub truncated: u64,
}

/// A Python frame named: function, file, line (0: unknown).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PyFrame {
    pub function: String,
    pub file: String,
    pub line: u32,
}

impl Codes {
    /// Keeps an announcement (a ring buffer record of BP_NOTE_CODE).
    pub fn note(&mut self, data: &[u8]) {
        let Some(n) = pod::read::<bp_code_note>(data) else {
            return;
        };
        let major = (n.version >> 8) as u8;
        let minor = n.version as u8;
        // The kernel side copies at most one byte less than the buffer.
        let copied = (n.table_len as usize).min(n.table.len() - 1);
        let mut table = n.table[..copied].to_vec();
        let mut complete = true;
        if (n.table_len as usize) > copied {
            match read_table(n.tgid, n.code, major, minor, n.table_len as usize) {
                Some(t) => table = t,
                None => {
                    self.truncated += 1;
                    complete = false;
                }
            }
        }
        self.codes.insert(
            n.code_id,
            Code {
                major,
                minor,
                name: text(&n.name, n.name_kind, n.name_len),
                file: text(&n.file, n.file_kind, n.file_len),
                firstlineno: n.firstlineno,
                table,
                complete,
            },
        );
    }

    pub fn len(&self) -> usize {
        self.codes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.codes.is_empty()
    }

    /// A stored Python frame named; None for a code never announced.
    pub fn frame(&self, id: u32, offset: u64) -> Option<PyFrame> {
        let c = self.codes.get(&id)?;
        let line = u32::try_from(offset)
            .ok()
            .and_then(|o| {
                pylines::line_for_prefix(c.major, c.minor, &c.table, c.firstlineno, o, c.complete)
            })
            .unwrap_or(0);
        Some(PyFrame {
            function: c.name.clone(),
            file: c.file.clone(),
            line,
        })
    }
}

/// Characters as CPython stores a compact str: `kind` bytes each.
/// (The skeleton types carry C `char` arrays as i8 on every target.)
fn text(raw: &[i8], kind: u32, len: u32) -> String {
    let bytes: Vec<u8> = raw.iter().map(|&c| c as u8).collect();
    let n = len as usize;
    match kind {
        1 => bytes.iter().take(n).map(|&b| char::from(b)).collect(),
        2 => bytes
            .chunks_exact(2)
            .take(n)
            .filter_map(|c| char::from_u32(u32::from(u16::from_ne_bytes([c[0], c[1]]))))
            .collect(),
        4 => bytes
            .chunks_exact(4)
            .take(n)
            .filter_map(|c| char::from_u32(u32::from_ne_bytes([c[0], c[1], c[2], c[3]])))
            .collect(),
        _ => String::new(),
    }
}

/// A code object's whole line table, from the live process.
fn read_table(pid: u32, code: u64, major: u8, minor: u8, len: usize) -> Option<Vec<u8>> {
    let o = offsets::offsets(major, minor)?;
    let mut mem = std::fs::File::open(format!("/proc/{pid}/mem")).ok()?;
    let mut word = [0u8; 8];
    mem.seek(SeekFrom::Start(code + u64::from(o.code_linetable)))
        .ok()?;
    mem.read_exact(&mut word).ok()?;
    let bytes = u64::from_ne_bytes(word);
    // Line tables are small; a bad length is a changed object, not a table.
    if len > 1 << 20 {
        return None;
    }
    let mut table = vec![0u8; len];
    mem.seek(SeekFrom::Start(bytes + u64::from(o.bytes_data)))
        .ok()?;
    mem.read_exact(&mut table).ok()?;
    Some(table)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CPython executables on this machine: Debian's, and a pyenv tree's.
    pub fn installed_interpreters() -> Vec<std::path::PathBuf> {
        let mut out = Vec::new();
        for minor in 9..=13 {
            let debian = std::path::PathBuf::from(format!("/usr/bin/python3.{minor}"));
            if debian.exists() {
                out.push(debian);
            }
        }
        if let Ok(rd) = std::fs::read_dir("/root/.pyenv/versions") {
            for e in rd.flatten() {
                let v = e.file_name().to_string_lossy().into_owned();
                let Some(mm) = v.rsplit_once('.').map(|(mm, _)| mm.to_string()) else {
                    continue;
                };
                let p = e.path().join(format!("bin/python{mm}"));
                if p.exists() && offsets::offsets(3, mm[2..].parse().unwrap_or(0)).is_some() {
                    out.push(p);
                }
            }
        }
        out
    }

    #[test]
    fn versions_from_file_names() {
        assert_eq!(version_in_name("python3.10"), Some((3, 10)));
        assert_eq!(version_in_name("libpython3.9.so.1.0"), Some((3, 9)));
        assert_eq!(version_in_name("python3"), None);
        assert_eq!(version_in_name("python"), None);
    }

    #[test]
    fn strings_in_each_width() {
        let mut raw = [0i8; 16];
        for (i, b) in b"abc".iter().enumerate() {
            raw[i] = *b as i8;
        }
        assert_eq!(text(&raw, 1, 3), "abc");
        let mut wide = [0i8; 16];
        for (i, b) in 0x00e9u16
            .to_ne_bytes()
            .iter()
            .chain(&0x4e2du16.to_ne_bytes())
            .enumerate()
        {
            wide[i] = *b as i8;
        }
        assert_eq!(text(&wide, 2, 2), "é中");
        assert_eq!(text(&raw, 3, 3), "");
    }

    /// The interpreters on this machine are found with their version.
    /// Extension modules name `_PyRuntime` without defining it (Debian's
    /// `_json`, `_asyncio`, `math`...): no runtime there, and no warning.
    #[test]
    fn extension_modules_are_not_runtimes() {
        let mut seen = 0;
        for dir in [
            "/usr/lib/python3.11/lib-dynload",
            "/usr/lib/python3.12/lib-dynload",
        ] {
            let Ok(rd) = std::fs::read_dir(dir) else {
                continue;
            };
            for e in rd.flatten() {
                let p = e.path();
                let name = p.to_string_lossy().into_owned();
                if !name.ends_with(".so") {
                    continue;
                }
                let data = std::fs::read(&p).unwrap();
                let undefined_runtime = object::File::parse(&*data).is_ok_and(|f| {
                    use object::{ObjectSymbol, ObjectSymbolTable};
                    f.dynamic_symbol_table().is_some_and(|t| {
                        t.symbols()
                            .any(|s| s.name() == Ok(RUNTIME) && s.is_undefined())
                    })
                });
                if undefined_runtime {
                    seen += 1;
                    assert_eq!(detect(&p, &name), Found::None, "{name}");
                }
            }
        }
        if seen == 0 {
            eprintln!("SKIP extension_modules_are_not_runtimes: no CPython extension module here");
        }
    }

    #[test]
    fn finds_the_installed_interpreters() {
        let mut seen = 0;
        for exe in installed_interpreters() {
            // A shared build keeps the runtime in libpython3.X.so.
            let lib = exe.parent().and_then(|bin| {
                let v = exe.file_name()?.to_string_lossy().into_owned();
                Some(bin.join(format!("../lib/lib{v}.so.1.0")))
            });
            let p = match detect(&exe, &exe.to_string_lossy()) {
                Found::None => lib.filter(|l| l.exists()).unwrap_or(exe),
                _ => exe,
            };
            let name = p.to_string_lossy().into_owned();
            match detect(&p, &name) {
                Found::Python(py) => {
                    seen += 1;
                    assert!(!py.eval.is_empty(), "{name}");
                    assert!(py.runtime > 0, "{name}");
                    assert!(
                        name.contains(&format!("{}.{}", py.major, py.minor)),
                        "{name}: {py:?}"
                    );
                }
                other => panic!("{name}: {other:?}"),
            }
        }
        if seen == 0 {
            println!("SKIP: no CPython 3.9-3.13 on this machine");
        }
    }

    /// The symbol tables read whole give what object's reader gives, for
    /// the runtime and every part of the eval loop.
    #[test]
    fn symbol_tables_agree_with_objects_reader() {
        use object::ObjectSymbol;
        let mut seen = 0;
        for exe in installed_interpreters() {
            let v = exe
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_default();
            let lib = exe.with_file_name(format!("../lib/lib{v}.so.1.0"));
            for p in [exe.clone(), lib] {
                let Ok(data) = std::fs::read(&p) else {
                    continue;
                };
                let name = p.to_string_lossy().into_owned();
                let Found::Python(py) = detect(&p, &name) else {
                    continue;
                };
                let obj = object::File::parse(&*data).unwrap();
                let mut runtime = None;
                let mut eval = Vec::new();
                for sym in obj.dynamic_symbols().chain(obj.symbols()) {
                    let n = sym.name().unwrap_or_default();
                    if n == RUNTIME {
                        runtime = Some(sym.address());
                    } else if n == EVAL || n.starts_with(&format!("{EVAL}.cold")) {
                        eval.push((sym.address(), sym.address() + sym.size().max(1)));
                    }
                }
                eval.sort_unstable();
                eval.dedup();
                assert_eq!(Some(py.runtime), runtime, "{name}");
                assert_eq!(py.eval, eval, "{name}");
                seen += 1;
            }
        }
        if seen == 0 {
            println!("SKIP: no CPython 3.9-3.13 on this machine");
        }
    }
}
