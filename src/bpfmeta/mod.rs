//! BPF programs as profiling subjects: what a program is (id, tag, name,
//! JIT ranges of each sub-program, BTF line info), captured while it is
//! loaded and kept, so samples in its JIT code can be named and annotated
//! after it is gone; the side-band records that announce loads and unloads;
//! run-time statistics.

pub mod info;
pub mod sideband;
pub mod stats;

use serde::{Deserialize, Serialize};

/// One JIT-compiled function of a program (the main function is the first).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Subprog {
    /// The kernel's symbol: `bpf_prog_<tag>_<name>`.
    pub symbol: String,
    pub addr: u64,
    pub len: u32,
}

/// A source line of a program, at the JIT address where its code starts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Line {
    pub addr: u64,
    pub file: String,
    pub line: u32,
    pub col: u32,
    /// The source text, as the program's BTF carries it.
    pub text: String,
    /// Offset of the line's first instruction in the translated program (in instructions).
    pub insn_off: u32,
}

/// What bpfscope keeps of a BPF program.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BpfProg {
    pub id: u32,
    pub tag: String,
    pub name: String,
    pub prog_type: String,
    pub subprogs: Vec<Subprog>,
    /// Sorted by address.
    pub lines: Vec<Line>,
    /// Size of the JIT image and of the translated program, in bytes.
    pub jited_len: u32,
    pub xlated_len: u32,
    /// CLOCK_BOOTTIME-based load time (ns), as the kernel reports it.
    pub load_time_ns: u64,
    /// When the side-band reported the unload (perf clock, ns), if it did.
    pub unloaded_ns: Option<u64>,
}

/// Where an address falls in a program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BpfFrame<'a> {
    pub prog: &'a BpfProg,
    pub symbol: &'a str,
    /// Offset from the start of the sub-program.
    pub offset: u64,
    pub line: Option<&'a Line>,
}

impl BpfProg {
    /// The sub-program and source line holding a JIT address.
    pub fn frame(&self, addr: u64) -> Option<BpfFrame<'_>> {
        let sub = self
            .subprogs
            .iter()
            .find(|s| addr >= s.addr && addr < s.addr + u64::from(s.len))?;
        let end = sub.addr + u64::from(sub.len);
        let line = self
            .lines
            .iter()
            .rfind(|l| l.addr >= sub.addr && l.addr < end && l.addr <= addr);
        Some(BpfFrame {
            prog: self,
            symbol: &sub.symbol,
            offset: addr - sub.addr,
            line,
        })
    }

    /// `file:line` of the source line, shortened to the file name.
    pub fn short_line(line: &Line) -> String {
        let file = line.file.rsplit('/').next().unwrap_or(&line.file);
        format!("{file}:{}", line.line)
    }
}

/// Finds the program frame of a kernel address among known programs.
pub fn lookup(progs: &[BpfProg], addr: u64) -> Option<BpfFrame<'_>> {
    progs.iter().find_map(|p| p.frame(addr))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prog() -> BpfProg {
        let line = |addr, line| Line {
            addr,
            file: "/src/x.bpf.c".into(),
            line,
            col: 1,
            text: format!("line {line}"),
            insn_off: 0,
        };
        BpfProg {
            id: 7,
            tag: "0011223344556677".into(),
            name: "main".into(),
            prog_type: "kprobe".into(),
            subprogs: vec![
                Subprog {
                    symbol: "bpf_prog_0011223344556677_main".into(),
                    addr: 0x1000,
                    len: 0x100,
                },
                Subprog {
                    symbol: "bpf_prog_8899aabbccddeeff_helper".into(),
                    addr: 0x3000,
                    len: 0x40,
                },
            ],
            lines: vec![line(0x1000, 10), line(0x1040, 12), line(0x3000, 30)],
            jited_len: 0x140,
            xlated_len: 100,
            load_time_ns: 0,
            unloaded_ns: None,
        }
    }

    #[test]
    fn frames_and_lines() {
        let p = prog();
        let f = p.frame(0x1050).unwrap();
        assert_eq!(f.symbol, "bpf_prog_0011223344556677_main");
        assert_eq!(f.offset, 0x50);
        assert_eq!(f.line.map(|l| l.line), Some(12));
        let f = p.frame(0x3010).unwrap();
        assert_eq!(f.symbol, "bpf_prog_8899aabbccddeeff_helper");
        assert_eq!(
            f.line.map(BpfProg::short_line).as_deref(),
            Some("x.bpf.c:30")
        );
        assert!(p.frame(0x2000).is_none());
        assert!(lookup(&[p], 0x10ff).is_some());
    }
}
