//! Stack keys (`--by kstack`, `--by ustack`): reading the stack maps after
//! a run and naming the frames. User frames come as build id + file
//! offset, so they are named even when the process is gone, with the
//! profiler's symbolizer.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;

use libbpf_rs::{MapCore, MapFlags};

use crate::cli::profile::SymbolSettings;
use crate::profile::trim_build_id;
use crate::symbolize::{elf, kernel, Resolver};

/// Frame names per stack id, leaf first.
#[derive(Debug, Default, Clone)]
pub struct StackTable {
    pub kernel: HashMap<u32, Vec<String>>,
    pub user: HashMap<u32, Vec<String>>,
    /// User frames the kernel could only give as raw addresses.
    pub unresolved: u64,
}

/// Every return address but the leaf is one past its call instruction.
fn call_site(i: usize, a: u64) -> u64 {
    if i > 0 {
        a.saturating_sub(1)
    } else {
        a
    }
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
            let ips = b
                .chunks_exact(8)
                .map(|c| u64::from_ne_bytes(c.try_into().unwrap_or([0; 8])))
                .take_while(|&ip| ip != 0)
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

/// One user frame as the kernel stored it (struct bpf_stack_build_id:
/// s32 status, u8 build_id[20], u64 offset or ip).
enum UserFrame {
    BuildId(Vec<u8>, u64),
    Ip(u64),
}

/// The frames of a user stack, up to the first empty slot. A frame-pointer
/// walk ends on a return address that is no code address (0, where a frame
/// chain ends, or garbage from code without frame pointers); the kernel
/// still looks it up with find_vma(), which returns the next mapping
/// *above* the address, and stores `address - mapping start + file offset`
/// as VALID: a negative offset, wrapped (0 - 0x5648bbd29000 gives
/// 0xffffa9b7442d7000). No file has offsets that large: the stack ends
/// there, like perf's does at such a frame.
fn user_frames(b: &[u8]) -> Vec<UserFrame> {
    b.chunks_exact(32)
        .map_while(|e| {
            let status = i32::from_ne_bytes(e[..4].try_into().ok()?);
            let mut id = [0u8; 20];
            id.copy_from_slice(&e[4..24]);
            let v = u64::from_ne_bytes(e[24..32].try_into().ok()?);
            match status as u32 {
                libbpf_sys::BPF_STACK_BUILD_ID_VALID if v > i64::MAX as u64 => None,
                libbpf_sys::BPF_STACK_BUILD_ID_VALID => {
                    Some(UserFrame::BuildId(trim_build_id(&id).to_vec(), v))
                }
                libbpf_sys::BPF_STACK_BUILD_ID_IP => Some(UserFrame::Ip(v)),
                _ => None,
            }
        })
        .collect()
}

/// Files that may hold the build ids: the probed binaries, and every file
/// mapped by a live process (what a process used is usually still around).
fn candidates(probed: &[&Path]) -> HashMap<Vec<u8>, String> {
    let mut paths: BTreeSet<String> = probed.iter().map(|p| p.display().to_string()).collect();
    if let Ok(rd) = std::fs::read_dir("/proc") {
        for e in rd.flatten() {
            let name = e.file_name();
            if !name.to_string_lossy().bytes().all(|c| c.is_ascii_digit()) {
                continue;
            }
            let Ok(maps) = std::fs::read_to_string(e.path().join("maps")) else {
                continue;
            };
            for l in maps.lines() {
                if let Some(p) = l.split_whitespace().nth(5).filter(|p| p.starts_with('/')) {
                    paths.insert(p.to_string());
                }
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
    ids: &BTreeSet<u32>,
    probed: &[&Path],
    unresolved: &mut u64,
) -> HashMap<u32, Vec<String>> {
    let stacks: Vec<(u32, Vec<UserFrame>)> = ids
        .iter()
        .filter_map(|&id| Some((id, user_frames(&read_stack(map, id)?))))
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
    let mut resolver = Resolver::new(&SymbolSettings::from_env(), false);
    let mut names: HashMap<(Vec<u8>, u64), String> = HashMap::new();
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
            if let Some((lines, _)) = r {
                if let Some(l) = lines.first() {
                    names.insert((bin.clone(), *o), l.function.clone());
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
                        names
                            .get(&(b.clone(), o))
                            .cloned()
                            .unwrap_or_else(|| format!("[{}+{o:#x}]", elf::hex(b)))
                    }
                    UserFrame::Ip(ip) => {
                        *unresolved += 1;
                        format!("[unknown {ip:#x}]")
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
    user_ids: &BTreeSet<u32>,
    probed: &[&Path],
) -> StackTable {
    let mut unresolved = 0;
    StackTable {
        kernel: kernel_stacks(kmap, kernel_ids),
        user: user_stacks(umap, user_ids, probed, &mut unresolved),
        unresolved,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(status: u32, id: u8, v: u64) -> Vec<u8> {
        let mut e = (status as i32).to_ne_bytes().to_vec();
        e.extend([id; 20]);
        e.extend(v.to_ne_bytes());
        e
    }

    #[test]
    fn a_wrapped_offset_ends_the_user_stack() {
        let mut b = entry(libbpf_sys::BPF_STACK_BUILD_ID_VALID, 7, 0x1139);
        b.extend(entry(
            libbpf_sys::BPF_STACK_BUILD_ID_IP,
            0,
            0x7f00_0000_1000,
        ));
        // ip 0 below a PIE mapped at 0x5648bbd29000, as the kernel stores it.
        b.extend(entry(
            libbpf_sys::BPF_STACK_BUILD_ID_VALID,
            7,
            0u64.wrapping_sub(0x5648_bbd2_9000),
        ));
        b.extend(entry(libbpf_sys::BPF_STACK_BUILD_ID_VALID, 7, 0x2000));
        b.extend(entry(libbpf_sys::BPF_STACK_BUILD_ID_EMPTY, 0, 0));
        let f = user_frames(&b);
        assert_eq!(f.len(), 2);
        assert!(matches!(&f[0], UserFrame::BuildId(id, 0x1139) if id.len() == 20));
        assert!(matches!(f[1], UserFrame::Ip(0x7f00_0000_1000)));
        // Empty slots end it too.
        assert!(user_frames(&entry(libbpf_sys::BPF_STACK_BUILD_ID_EMPTY, 0, 0)).is_empty());
    }
}
