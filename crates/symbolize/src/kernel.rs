//! Kernel symbols: the running kernel's build id, kallsyms lookups at
//! record time (kept in the recording), and lookups in a recorded table.

use blazesym::symbolize::source::{Kernel, Source};
use blazesym::symbolize::{Input, Symbolizer};
use blazesym::MaybeDefault;

use bpfscope_recording::KernelSymbol;

/// GNU build id of the running kernel, from the ELF notes in /sys/kernel/notes.
pub fn build_id() -> Option<Vec<u8>> {
    let b = std::fs::read("/sys/kernel/notes").ok()?;
    let mut pos = 0usize;
    let word = |p: usize| -> Option<usize> {
        Some(u32::from_ne_bytes(b.get(p..p + 4)?.try_into().ok()?) as usize)
    };
    let pad = |n: usize| n.div_ceil(4) * 4;
    while pos + 12 <= b.len() {
        let (namesz, descsz, kind) = (word(pos)?, word(pos + 4)?, word(pos + 8)?);
        let name = b.get(pos + 12..pos + 12 + namesz)?;
        let desc_at = pos + 12 + pad(namesz);
        if kind == 3 && name.starts_with(b"GNU") {
            return b.get(desc_at..desc_at + descsz).map(<[u8]>::to_vec);
        }
        pos = desc_at + pad(descsz);
    }
    None
}

/// The kallsyms source only: vmlinux discovery is slow and rarely there.
fn kallsyms_source() -> Source<'static> {
    Source::Kernel(Kernel {
        vmlinux: MaybeDefault::None,
        debug_syms: false,
        ..Default::default()
    })
}

/// The kallsyms entries (start, name, module) that `addrs` fall into.
pub fn snapshot_symbols(addrs: &[u64]) -> Vec<KernelSymbol> {
    KernelSymbolizer::new().symbols(addrs)
}

/// kallsyms, read once and kept (a read costs tens of milliseconds): for
/// a live view that names new kernel addresses every second. It does not
/// see BPF programs loaded after it read kallsyms: make a new one now
/// and then.
pub struct KernelSymbolizer {
    symbolizer: Symbolizer,
}

impl Default for KernelSymbolizer {
    fn default() -> Self {
        Self::new()
    }
}

impl KernelSymbolizer {
    pub fn new() -> KernelSymbolizer {
        KernelSymbolizer {
            symbolizer: Symbolizer::builder()
                .enable_code_info(false)
                .enable_inlined_fns(false)
                .build(),
        }
    }

    /// The kallsyms entries (start, name, module) that `addrs` fall into.
    pub fn symbols(&self, addrs: &[u64]) -> Vec<KernelSymbol> {
        if addrs.is_empty() {
            return Vec::new();
        }
        let Ok(syms) = self
            .symbolizer
            .symbolize(&kallsyms_source(), Input::AbsAddr(addrs))
        else {
            return Vec::new();
        };
        entries(syms)
    }
}

fn entries(syms: Vec<blazesym::symbolize::Symbolized<'_>>) -> Vec<KernelSymbol> {
    let mut out: Vec<KernelSymbol> = syms
        .into_iter()
        .filter_map(|s| s.into_sym())
        .map(|s| KernelSymbol {
            addr: s.addr,
            name: s.name.into_owned(),
            module: s
                .module
                .map(|m| m.to_string_lossy().into_owned())
                .unwrap_or_default(),
        })
        .collect();
    out.sort_by_key(|s| s.addr);
    out.dedup_by_key(|s| s.addr);
    out
}

/// Lookups in a recorded table: the entry with the greatest start not above the address.
pub struct KernelTable<'a> {
    syms: Vec<&'a KernelSymbol>,
}

impl<'a> KernelTable<'a> {
    pub fn new(syms: &'a [KernelSymbol]) -> KernelTable<'a> {
        let mut syms: Vec<&KernelSymbol> = syms.iter().collect();
        syms.sort_by_key(|s| s.addr);
        KernelTable { syms }
    }

    pub fn lookup(&self, addr: u64) -> Option<&'a KernelSymbol> {
        let i = self.syms.partition_point(|s| s.addr <= addr);
        i.checked_sub(1).and_then(|i| self.syms.get(i).copied())
    }
}

/// Live kallsyms lookups for `symbolize --kernel`: (name, offset) per address.
pub fn symbolize_live(addrs: &[u64]) -> Vec<Option<(String, u64)>> {
    let symbolizer = Symbolizer::new();
    match symbolizer.symbolize(&kallsyms_source(), Input::AbsAddr(addrs)) {
        Ok(v) => v
            .into_iter()
            .map(|s| s.into_sym().map(|s| (s.name.into_owned(), s.offset as u64)))
            .collect(),
        Err(_) => vec![None; addrs.len()],
    }
}

/// Why kernel addresses cannot be symbolized by this process, if they
/// cannot: /proc/kallsyms shows every address as zero to users that
/// kernel.kptr_restrict hides them from.
pub fn addresses_hidden() -> Option<String> {
    use std::io::{BufRead, BufReader};
    let f = std::fs::File::open("/proc/kallsyms").ok();
    // The first text symbol's line: the per-CPU symbols before it (type
    // A) really are at 0 on x86_64 kernels before 6.15
    // (`0000000000000000 A fixed_percpu_data`), visible or not.
    let first = f.and_then(|f| {
        BufReader::new(f)
            .lines()
            .map_while(Result::ok)
            .find(|l| matches!(l.split_whitespace().nth(1), Some("t" | "T")))
    });
    let sysctl = |name: &str| {
        std::fs::read_to_string(format!("/proc/sys/kernel/{name}"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
    };
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    hidden_reason(
        first.as_deref(),
        sysctl("kptr_restrict"),
        sysctl("perf_event_paranoid"),
        root,
    )
}

/// The one-line reason for `addresses_hidden`, from the first text
/// symbol's kallsyms line (None: no such line could be read).
/// With kptr_restrict 0 the kernel still hides them from users without
/// CAP_SYSLOG unless perf_event_paranoid is at most 1.
fn hidden_reason(
    first: Option<&str>,
    kptr_restrict: Option<i32>,
    paranoid: Option<i32>,
    root: bool,
) -> Option<String> {
    let who = if root {
        "root"
    } else {
        "a user without CAP_SYSLOG"
    };
    let fix = if root {
        "lower kernel.kptr_restrict"
    } else {
        "run as root"
    };
    let Some(line) = first else {
        return Some(format!(
            "kernel addresses cannot be symbolized: /proc/kallsyms is not readable; {fix}"
        ));
    };
    let addr = line.split_whitespace().next().unwrap_or("");
    if !addr.is_empty() && addr.bytes().all(|b| b == b'0') {
        let why = match (kptr_restrict, paranoid) {
            (Some(0), Some(p)) => format!(
                "kernel.kptr_restrict=0 with kernel.perf_event_paranoid={p} hides them from {who}"
            ),
            (Some(n), _) => format!("kernel.kptr_restrict={n} hides them from {who}"),
            (None, _) => format!("they are hidden from {who}"),
        };
        return Some(format!(
            "kernel addresses are hidden (/proc/kallsyms shows zeros: {why}); {fix}"
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::hidden_reason;

    #[test]
    fn hidden_addresses_are_explained() {
        assert_eq!(
            hidden_reason(Some("0000000000000000 T startup_64"), Some(1), Some(2), false).as_deref(),
            Some("kernel addresses are hidden (/proc/kallsyms shows zeros: kernel.kptr_restrict=1 hides them from a user without CAP_SYSLOG); run as root")
        );
        assert_eq!(
            hidden_reason(Some("0000000000000000 T startup_64"), Some(2), Some(2), true).as_deref(),
            Some("kernel addresses are hidden (/proc/kallsyms shows zeros: kernel.kptr_restrict=2 hides them from root); lower kernel.kptr_restrict")
        );
        assert_eq!(
            hidden_reason(Some("ffffffff81000000 T _stext"), Some(1), Some(2), true),
            None
        );
        assert_eq!(
            hidden_reason(Some("0000000000000000 T _stext"), Some(0), Some(2), false).as_deref(),
            Some("kernel addresses are hidden (/proc/kallsyms shows zeros: kernel.kptr_restrict=0 with kernel.perf_event_paranoid=2 hides them from a user without CAP_SYSLOG); run as root")
        );
        assert!(hidden_reason(None, None, None, false).is_some());
    }
}
