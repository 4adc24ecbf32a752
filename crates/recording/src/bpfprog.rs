//! What a BPF program is (id, tag, name, JIT ranges of each sub-program,
//! BTF line info), as captured while it was loaded: the BPF_PROGRAMS
//! section of recordings (protobuf messages, see docs/recording-format.md)
//! and what names samples in JIT code after the program is gone.

use prost::Message;

/// One JIT-compiled function of a program (the main function is the first).
#[derive(Clone, PartialEq, Message)]
pub struct Subprog {
    /// The kernel's symbol: `bpf_prog_<tag>_<name>`.
    #[prost(string, tag = "1")]
    pub symbol: String,
    #[prost(uint64, tag = "2")]
    pub addr: u64,
    #[prost(uint32, tag = "3")]
    pub len: u32,
}

/// A source line of a program, at the JIT address where its code starts.
#[derive(Clone, PartialEq, Message)]
pub struct LineInfo {
    #[prost(uint64, tag = "1")]
    pub addr: u64,
    #[prost(string, tag = "2")]
    pub file: String,
    #[prost(uint32, tag = "3")]
    pub line: u32,
    #[prost(uint32, tag = "4")]
    pub col: u32,
    /// The source text, as the program's BTF carries it.
    #[prost(string, tag = "5")]
    pub text: String,
    /// Offset of the line's first instruction in the translated program (in instructions).
    #[prost(uint32, tag = "6")]
    pub insn_off: u32,
}

/// What bpfscope keeps of a BPF program.
#[derive(Clone, PartialEq, Message)]
pub struct BpfProg {
    #[prost(uint32, tag = "1")]
    pub id: u32,
    #[prost(string, tag = "2")]
    pub tag: String,
    #[prost(string, tag = "3")]
    pub name: String,
    #[prost(string, tag = "4")]
    pub prog_type: String,
    #[prost(message, repeated, tag = "5")]
    pub subprogs: Vec<Subprog>,
    /// Sorted by address.
    #[prost(message, repeated, tag = "6")]
    pub lines: Vec<LineInfo>,
    /// Size of the JIT image and of the translated program, in bytes.
    #[prost(uint32, tag = "7")]
    pub jited_len: u32,
    #[prost(uint32, tag = "8")]
    pub xlated_len: u32,
    /// Load time (ns since boot), as the kernel reports it.
    #[prost(uint64, tag = "9")]
    pub load_time_ns: u64,
    /// When the side-band reported the unload (CLOCK_MONOTONIC ns), if it did.
    #[prost(uint64, optional, tag = "10")]
    pub unloaded_ns: Option<u64>,
}

/// The BPF_PROGRAMS section of a recording.
#[derive(Clone, PartialEq, Message)]
pub struct BpfProgs {
    #[prost(message, repeated, tag = "1")]
    pub programs: Vec<BpfProg>,
}

impl BpfProg {
    /// Whether a kernel address falls in one of this program's JIT images.
    pub fn contains(&self, addr: u64) -> bool {
        self.subprogs
            .iter()
            .any(|s| addr >= s.addr && addr < s.addr + u64::from(s.len))
    }
}

/// Where an address falls in a program.
#[derive(Debug, Clone, PartialEq)]
pub struct BpfFrame<'a> {
    pub prog: &'a BpfProg,
    pub symbol: &'a str,
    /// Offset from the start of the sub-program.
    pub offset: u64,
    pub line: Option<&'a LineInfo>,
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
    pub fn short_line(line: &LineInfo) -> String {
        let file = line.file.rsplit('/').next().unwrap_or(&line.file);
        format!("{file}:{}", line.line)
    }
}

/// Finds the program frame of a kernel address among known programs.
/// JIT memory is reused: a program unloaded in a recording's span can
/// share addresses with one loaded after it. Without the sample's time,
/// the later one is taken (the other held the address only until its
/// unload): the one still loaded, else the one unloaded last.
pub fn lookup(progs: &[BpfProg], addr: u64) -> Option<BpfFrame<'_>> {
    progs.iter().filter_map(|p| p.frame(addr)).max_by_key(|f| {
        (
            f.prog.unloaded_ns.is_none(),
            f.prog.unloaded_ns,
            f.prog.load_time_ns,
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prog() -> BpfProg {
        let line = |addr, line| LineInfo {
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

    #[test]
    fn reused_jit_addresses_name_the_later_program() {
        let old = BpfProg {
            id: 3,
            name: "old".into(),
            unloaded_ns: Some(500),
            ..prog()
        };
        let mut new = BpfProg {
            id: 9,
            name: "new".into(),
            load_time_ns: 600,
            ..prog()
        };
        new.subprogs[0].symbol = "bpf_prog_ffeeddccbbaa9988_new".into();
        // In either order, the one still loaded.
        for list in [
            vec![old.clone(), new.clone()],
            vec![new.clone(), old.clone()],
        ] {
            assert_eq!(lookup(&list, 0x1010).map(|f| f.prog.id), Some(9));
        }
        // Both gone: the one unloaded last.
        new.unloaded_ns = Some(700);
        for list in [
            vec![old.clone(), new.clone()],
            vec![new.clone(), old.clone()],
        ] {
            assert_eq!(lookup(&list, 0x1010).map(|f| f.prog.id), Some(9));
        }
    }
}
