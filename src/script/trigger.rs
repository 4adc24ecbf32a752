//! BEGIN, END and interval blocks run in the kernel like every other
//! block: bpfscope calls a function of its own, on which those blocks'
//! uprobe is attached (limited to this process), with the trigger's id as
//! its argument. Their effects (map writes, records) are then exactly
//! those of the same code in any other probe.

use std::path::PathBuf;

/// Called to run the script blocks of trigger `id`. Not inlined and
/// exported, so it exists once, at an address a uprobe can be put on.
#[no_mangle]
#[inline(never)]
pub extern "C" fn bpfscope_script_trigger(id: u64) -> u64 {
    // Keeps the argument (and the call) from being optimized away.
    std::hint::black_box(id)
}

/// Runs the blocks of trigger `id` now, in the kernel, on this thread.
pub fn fire(id: u64) {
    std::hint::black_box(bpfscope_script_trigger(std::hint::black_box(id)));
}

/// The executable and the file offset of the trigger function: from its
/// address and this process's mapping of the file that holds it.
pub fn location() -> std::io::Result<(PathBuf, u64)> {
    let addr = bpfscope_script_trigger as *const () as u64;
    let maps = std::fs::read_to_string("/proc/self/maps")?;
    for line in maps.lines() {
        let mut f = line.split_whitespace();
        let (Some(range), Some(_perms), Some(off), Some(_dev), Some(_ino), Some(path)) =
            (f.next(), f.next(), f.next(), f.next(), f.next(), f.next())
        else {
            continue;
        };
        let Some((lo, hi)) = range.split_once('-') else {
            continue;
        };
        let (Ok(lo), Ok(hi), Ok(off)) = (
            u64::from_str_radix(lo, 16),
            u64::from_str_radix(hi, 16),
            u64::from_str_radix(off, 16),
        ) else {
            continue;
        };
        if (lo..hi).contains(&addr) && path.starts_with('/') {
            return Ok((PathBuf::from(path), addr - lo + off));
        }
    }
    Err(std::io::Error::other(
        "the trigger function is in no file mapping of this process",
    ))
}
