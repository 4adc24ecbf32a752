//! Stack keys (`--by kstack`, `--by ustack`): reading the stack maps after
//! a run and naming the frames. User frames come as build id + file
//! offset, so they are named even when the process is gone, with the
//! profiler's symbolizer.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;

use libbpf_rs::{MapCore, MapFlags};

use bpfscope_bpf::stack::{call_site, kernel_frames, user_frames, UserFrame};
use bpfscope_symbolize::SymbolConfig;
use bpfscope_symbolize::{elf, kernel, Resolver};
use bpfscope_sys::{buildid, procfs};

/// Frame names per stack id (user stacks: per key word, see
/// [`user_word`]), leaf first.
#[derive(Debug, Default, Clone)]
pub struct StackTable {
    pub kernel: HashMap<u32, Vec<String>>,
    pub user: HashMap<u64, Vec<String>>,
    /// User frames the kernel could only give as raw addresses.
    pub unresolved: u64,
}

/// A user stack's key word: the stack map's id in bits 0-31, and at a
/// uprobe on a function's entry (arm64) the caller's file offset relative
/// to the probed instruction's in bits 32-62 (signed; 0: none). `None` for
/// a stack the kernel could not take (a negative word).
pub fn user_word(word: u64) -> Option<(u32, i64)> {
    if (word as i64) < 0 {
        return None;
    }
    // Bits 32-62, sign-extended from bit 62.
    let caller = (((word >> 32) << 33) as i64) >> 33;
    Some((word as u32, caller))
}

fn read_stack(map: &dyn MapCore, id: u32) -> Option<Vec<u8>> {
    map.lookup(&id.to_ne_bytes(), MapFlags::ANY).ok().flatten()
}

/// Names the kernel stacks with kallsyms, now (the kernel is still here).
fn kernel_stacks(map: &dyn MapCore, ids: &BTreeSet<u32>) -> HashMap<u32, Vec<String>> {
    let stacks: Vec<(u32, Vec<u64>)> = ids
        .iter()
        .filter_map(|&id| {
            let b = read_stack(map, id)?;
            let ips = kernel_frames(&b)
                .into_iter()
                .enumerate()
                .map(|(i, a)| call_site(i, a))
                .collect();
            Some((id, ips))
        })
        .collect();
    let all: Vec<u64> = stacks.iter().flat_map(|(_, v)| v.iter().copied()).collect();
    let names = kernel::symbolize_live(&all);
    let mut it = names.into_iter();
    stacks
        .into_iter()
        .map(|(id, ips)| {
            let frames = ips
                .iter()
                .map(|a| match it.next().flatten() {
                    Some((name, _)) => name,
                    None => format!("{a:#x}"),
                })
                .collect();
            (id, frames)
        })
        .collect()
}

/// Files that may hold the build ids: the probed binaries, and every file
/// mapped by a live process (what a process used is usually still around).
fn candidates(probed: &[&Path]) -> HashMap<Vec<u8>, String> {
    let mut paths: BTreeSet<String> = probed.iter().map(|p| p.display().to_string()).collect();
    for pid in procfs::pids() {
        for m in procfs::maps(pid).unwrap_or_default() {
            if m.is_file() {
                paths.insert(m.path);
            }
        }
    }
    paths
        .into_iter()
        .filter_map(|p| {
            let id = elf::inspect(Path::new(&p)).ok()?.build_id?;
            Some((id, p))
        })
        .collect()
}

fn user_stacks(
    map: &dyn MapCore,
    words: &BTreeSet<u64>,
    probed: &[&Path],
    symbols: &SymbolConfig,
    offsets: bool,
    unresolved: &mut u64,
) -> HashMap<u64, Vec<String>> {
    let stacks: Vec<(u64, Vec<UserFrame>)> = words
        .iter()
        .filter_map(|&w| {
            let (id, caller) = user_word(w)?;
            let mut frames = user_frames(&read_stack(map, id)?);
            // The frame-pointer walk from a function's entry skips its
            // caller, which was in the link register: put it back, in the
            // probed function's file.
            if caller != 0 {
                if let Some(UserFrame::BuildId(b, off)) = frames.first() {
                    if let Some(at) = off.checked_add_signed(caller) {
                        frames.insert(1, UserFrame::BuildId(b.clone(), at));
                    }
                }
            }
            Some((w, frames))
        })
        .collect();
    // Offsets per build id, symbolized in one batch each.
    let mut per_bin: HashMap<Vec<u8>, BTreeSet<u64>> = HashMap::new();
    for (_, frames) in &stacks {
        for (i, f) in frames.iter().enumerate() {
            if let UserFrame::BuildId(b, off) = f {
                per_bin
                    .entry(b.clone())
                    .or_default()
                    .insert(call_site(i, *off));
            }
        }
    }
    let index = if per_bin.is_empty() {
        HashMap::new()
    } else {
        candidates(probed)
    };
    let mut resolver = Resolver::new(symbols, false);
    // (build id, call-site offset) -> function, and the offset into it.
    let mut names: HashMap<(Vec<u8>, u64), (String, Option<u64>)> = HashMap::new();
    for (bin, offs) in &per_bin {
        let paths: Vec<String> = index.get(bin).cloned().into_iter().collect();
        let Some(found) = resolver.find(bin, &paths) else {
            continue;
        };
        // File offsets map to virtual addresses through the binary's own segments.
        let segments = paths
            .first()
            .and_then(|p| elf::inspect(Path::new(p)).ok())
            .map(|i| i.segments)
            .unwrap_or_else(|| found.info.segments.clone());
        let offs: Vec<u64> = offs.iter().copied().collect();
        for (o, r) in offs
            .iter()
            .zip(resolver.offsets(&found.path, &segments, &offs))
        {
            if let Some(r) = r {
                if let Some(l) = r.lines.first() {
                    names.insert((bin.clone(), *o), (l.function.clone(), r.offset));
                }
            }
        }
    }
    stacks
        .into_iter()
        .map(|(id, frames)| {
            let named = frames
                .iter()
                .enumerate()
                .map(|(i, f)| match f {
                    UserFrame::BuildId(b, off) => {
                        let o = call_site(i, *off);
                        let named = names.get(&(b.clone(), o)).map(|(f, at)| match at {
                            // The offset of the return address, not of the
                            // call site symbolized: as bpftrace prints it.
                            Some(at) if offsets => format!("{f}+{}", at + (off - o)),
                            _ => f.clone(),
                        });
                        named.unwrap_or_else(|| {
                            // The file and offset, as profiles name such frames.
                            let file = index
                                .get(b)
                                .and_then(|p| Path::new(p).file_name())
                                .map(|n| n.to_string_lossy().into_owned())
                                .unwrap_or_else(|| format!("[build id {}]", buildid::hex(b)));
                            format!("{file}+{o:#x}")
                        })
                    }
                    UserFrame::Ip(ip) | UserFrame::Anon(ip) => {
                        *unresolved += 1;
                        format!("[unknown {ip:#x}]")
                    }
                    // Only the profiler's unwinder stores file ids.
                    UserFrame::File(id, off, _) => {
                        *unresolved += 1;
                        format!("[file {id}]+{off:#x}")
                    }
                    UserFrame::Interp(id, off) => {
                        *unresolved += 1;
                        format!("[code {id}]+{off:#x}")
                    }
                })
                .collect();
            (id, named)
        })
        .collect()
}

/// Reads and names the stacks the keys refer to.
pub fn resolve(
    kmap: &dyn MapCore,
    umap: &dyn MapCore,
    kernel_ids: &BTreeSet<u32>,
    user_words: &BTreeSet<u64>,
    probed: &[&Path],
    symbols: &SymbolConfig,
) -> StackTable {
    let mut unresolved = 0;
    StackTable {
        kernel: kernel_stacks(kmap, kernel_ids),
        user: user_stacks(umap, user_words, probed, symbols, false, &mut unresolved),
        unresolved,
    }
}

/// User stacks by id with each frame as bpftrace's ustack prints it:
/// `function+offset` (stacks that differ by an offset differ), the file and
/// offset where no symbol names it, the address where the kernel gave no
/// build id. Leaf first.
pub fn user_with_offsets(
    umap: &dyn MapCore,
    ids: &BTreeSet<u32>,
    symbols: &SymbolConfig,
) -> HashMap<u32, Vec<String>> {
    let mut unresolved = 0;
    let words = ids.iter().map(|&id| u64::from(id)).collect();
    user_stacks(umap, &words, &[], symbols, true, &mut unresolved)
        .into_iter()
        .map(|(w, frames)| (w as u32, frames))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::user_word;

    #[test]
    fn user_words_carry_the_id_and_a_signed_caller() {
        // The layout read.bpf.h writes: id | (caller & 0x7fffffff) << 32.
        let word = |id: u32, caller: i64| u64::from(id) | (((caller as u64) & 0x7fff_ffff) << 32);
        assert_eq!(user_word(7), Some((7, 0)));
        assert_eq!(user_word(word(7, 0x40)), Some((7, 0x40)));
        assert_eq!(user_word(word(9, -0x1234)), Some((9, -0x1234)));
        assert_eq!(
            user_word(word(u32::MAX >> 1, -(1 << 30))),
            Some((u32::MAX >> 1, -(1 << 30)))
        );
        // A failed capture: a negative errno, sign-extended.
        assert_eq!(user_word(-14i64 as u64), None);
    }
}
