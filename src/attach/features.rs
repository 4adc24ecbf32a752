//! Feature probes: what this kernel offers, asked of the kernel itself.

use std::cell::OnceCell;
use std::collections::HashSet;

use libbpf_rs::btf::{
    types::{Struct, Typedef},
    Btf,
};

/// Kernel capabilities that decide which path a probe takes.
#[derive(Debug, Default)]
pub struct Features {
    /// raw_tp programs can read a per-attachment cookie (Linux 6.10+).
    pub raw_tp_cookie: bool,
    /// Raw tracepoint names from vmlinux BTF (`btf_trace_NAME` typedefs), read on first use.
    raw_tps: OnceCell<HashSet<String>>,
    /// Struct names of vmlinux BTF, read on first use.
    structs: OnceCell<HashSet<String>>,
}

impl Features {
    pub fn detect() -> Features {
        Features {
            raw_tp_cookie: helper_supported(
                libbpf_sys::BPF_PROG_TYPE_RAW_TRACEPOINT,
                libbpf_sys::BPF_FUNC_get_attach_cookie,
            ),
            raw_tps: OnceCell::new(),
            structs: OnceCell::new(),
        }
    }

    /// uprobe_multi links (Linux 6.6+), found by the kernel's link type in BTF.
    pub fn uprobe_multi(&self) -> bool {
        self.structs
            .get_or_init(|| {
                let Ok(btf) = Btf::from_vmlinux() else {
                    return HashSet::new();
                };
                btf.type_by_kind::<Struct<'_>>()
                    .filter_map(|t| Some(t.name()?.to_str()?.to_string()))
                    .filter(|n| n.starts_with("bpf_") && n.ends_with("_link"))
                    .collect()
            })
            .contains("bpf_uprobe_multi_link")
    }

    /// True when a raw tracepoint of this name exists in vmlinux.
    pub fn has_raw_tp(&self, name: &str) -> bool {
        self.raw_tps
            .get_or_init(|| {
                let Ok(btf) = Btf::from_vmlinux() else {
                    return HashSet::new();
                };
                btf.type_by_kind::<Typedef<'_>>()
                    .filter_map(|t| {
                        let n = t.name()?.to_str()?;
                        n.strip_prefix("btf_trace_").map(str::to_string)
                    })
                    .collect()
            })
            .contains(name)
    }
}

/// Asks the kernel whether programs of this type may call this helper.
fn helper_supported(prog_type: libbpf_sys::bpf_prog_type, helper: libbpf_sys::bpf_func_id) -> bool {
    // SAFETY: libbpf_probe_bpf_helper only reads its arguments; opts may be null.
    let rc = unsafe { libbpf_sys::libbpf_probe_bpf_helper(prog_type, helper, std::ptr::null()) };
    rc == 1
}
