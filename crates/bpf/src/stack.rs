//! Stacks as the BPF objects store them: the tracer's stack maps (kernel
//! stacks as addresses, user stacks as `struct bpf_stack_build_id`
//! records of a `BPF_F_STACK_BUILD_ID` map), and the profiler's
//! `stack_map` values (a header, then frames; user frames as file id +
//! offset from its own unwinder). One decoder for every reader.

use bpfscope_sys::buildid;

/// One user frame as the kernel stored it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum UserFrame {
    /// ELF build id (trimmed to its real length) and file offset.
    BuildId(Vec<u8>, u64),
    /// The kernel could not read the build id, or the address is in no
    /// file (anonymous or JIT memory): a raw address.
    Ip(u64),
    /// The profiler's unwinder: a raw address in an executable mapping no
    /// file backs (JIT code), as the process's mappings said at the sample.
    Anon(u64),
    /// The profiler's unwinder: a file by the id the kernel gave it (see
    /// `bp_note`), the file offset, and whether the offset is where the
    /// frame was interrupted (a signal) rather than a return address.
    File(u32, u64, bool),
    /// An interpreter frame (a Python function): the id of its code as
    /// the kernel side announced it (0: never announced) and the byte
    /// offset of its current instruction in the code.
    Interp(u32, u64),
}

/// A `stack_map` value of the profiler: `struct bp_stack_head` (frame
/// count, check hash), then the frames.
pub fn stored_frames(b: &[u8]) -> Vec<u64> {
    let Some(len) = b
        .get(..4)
        .and_then(|h| h.try_into().ok())
        .map(u32::from_ne_bytes)
    else {
        return Vec::new();
    };
    b.get(8..)
        .unwrap_or_default()
        .chunks_exact(8)
        .take(len as usize)
        .filter_map(|c| Some(u64::from_ne_bytes(c.try_into().ok()?)))
        .collect()
}

/// One user frame of the profiler's unwinder (`enum bp_frame`): bit 63
/// set is a file id (bits 40-61), file offset (bits 0-39) and bit 62 for
/// an interrupted (not returned-to) frame; bit 63 clear is a raw address,
/// or with bit 62 set an interpreter frame (code id, instruction offset).
pub fn unwound_frame(f: u64) -> UserFrame {
    use crate::profile::types::bp_frame;
    let file_bit = 1u64 << bp_frame::BP_FRAME_FILE_BIT.0;
    let shift = bp_frame::BP_FRAME_ID_SHIFT.0;
    let id = (f >> shift) & ((1u64 << bp_frame::BP_FRAME_ID_BITS.0) - 1);
    if f & file_bit == 0 {
        if f & (1u64 << bp_frame::BP_FRAME_INTERP_BIT.0) != 0 {
            return UserFrame::Interp(id as u32, f & ((1u64 << shift) - 1));
        }
        let anon = 1u64 << bp_frame::BP_FRAME_ANON_BIT.0;
        if f & anon != 0 {
            return UserFrame::Anon(f & !anon);
        }
        return UserFrame::Ip(f);
    }
    let exact = f & (1u64 << bp_frame::BP_FRAME_EXACT_BIT.0) != 0;
    UserFrame::File(id as u32, f & ((1u64 << shift) - 1), exact)
}

/// Size of `struct bpf_stack_build_id`: s32 status, u8 build_id[20],
/// union { u64 offset; u64 ip }.
const BUILD_ID_FRAME: usize = 32;

/// The addresses of a kernel stack map value, up to the first empty slot.
pub fn kernel_frames(b: &[u8]) -> Vec<u64> {
    b.chunks_exact(8)
        .map_while(|c| Some(u64::from_ne_bytes(c.try_into().ok()?)))
        .take_while(|&ip| ip != 0)
        .collect()
}

/// The frames of a build-id user stack map value, up to the first empty
/// slot. A frame-pointer walk ends on a return address that is no code
/// address (0, where a frame chain ends, or garbage from code without
/// frame pointers); the kernel still looks it up with find_vma(), which
/// returns the next mapping *above* the address, and stores `address -
/// mapping start + file offset` as VALID: a negative offset, wrapped (0 -
/// 0x5648bbd29000 gives 0xffffa9b7442d7000). No file has offsets that
/// large: the stack ends there, like perf's does at such a frame.
pub fn user_frames(b: &[u8]) -> Vec<UserFrame> {
    b.chunks_exact(BUILD_ID_FRAME)
        .map_while(|e| {
            let status = i32::from_ne_bytes(e[..4].try_into().ok()?);
            let id: &[u8; 20] = e[4..24].try_into().ok()?;
            let v = u64::from_ne_bytes(e[24..32].try_into().ok()?);
            match status as u32 {
                libbpf_sys::BPF_STACK_BUILD_ID_VALID if v > i64::MAX as u64 => None,
                libbpf_sys::BPF_STACK_BUILD_ID_VALID => {
                    Some(UserFrame::BuildId(buildid::trim(id).to_vec(), v))
                }
                libbpf_sys::BPF_STACK_BUILD_ID_IP => Some(UserFrame::Ip(v)),
                _ => None,
            }
        })
        .collect()
}

/// Every return address but the leaf's is one past its call instruction:
/// the call site is what names the caller's line.
pub fn call_site(depth: usize, addr: u64) -> u64 {
    if depth > 0 {
        addr.saturating_sub(1)
    } else {
        addr
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(status: u32, id: u8, v: u64) -> Vec<u8> {
        let mut b = (status as i32).to_ne_bytes().to_vec();
        b.extend([id; 20]);
        b.extend(v.to_ne_bytes());
        b
    }

    #[test]
    fn decodes_user_frames() {
        assert_eq!(
            std::mem::size_of::<libbpf_sys::bpf_stack_build_id>(),
            BUILD_ID_FRAME
        );
        let mut b = frame(libbpf_sys::BPF_STACK_BUILD_ID_VALID, 7, 0x1234);
        b.extend(frame(libbpf_sys::BPF_STACK_BUILD_ID_IP, 0, 0x7fff_0000));
        b.extend(frame(
            libbpf_sys::BPF_STACK_BUILD_ID_VALID,
            7,
            0xffff_a9b7_442d_7000,
        ));
        b.extend(frame(libbpf_sys::BPF_STACK_BUILD_ID_VALID, 7, 0x99));
        let f = user_frames(&b);
        assert_eq!(
            f,
            vec![
                UserFrame::BuildId(vec![7; 20], 0x1234),
                UserFrame::Ip(0x7fff_0000)
            ]
        );
        assert!(user_frames(&frame(libbpf_sys::BPF_STACK_BUILD_ID_EMPTY, 0, 1)).is_empty());
    }

    #[test]
    fn decodes_unwound_frames() {
        let f = (1u64 << 63) | (5u64 << 40) | 0x1234;
        assert_eq!(unwound_frame(f), UserFrame::File(5, 0x1234, false));
        assert_eq!(
            unwound_frame(f | (1 << 62)),
            UserFrame::File(5, 0x1234, true)
        );
        assert_eq!(unwound_frame(0x7fff_1234), UserFrame::Ip(0x7fff_1234));
        assert_eq!(
            unwound_frame((1 << 62) | (9u64 << 40) | 0x2e),
            UserFrame::Interp(9, 0x2e)
        );
        let mut b = 2u32.to_ne_bytes().to_vec();
        b.extend(9u32.to_ne_bytes());
        for v in [f, 7u64, 8u64] {
            b.extend(v.to_ne_bytes());
        }
        assert_eq!(stored_frames(&b), vec![f, 7]);
    }

    #[test]
    fn decodes_kernel_frames() {
        let b: Vec<u8> = [5u64, 6, 0, 7]
            .iter()
            .flat_map(|v| v.to_ne_bytes())
            .collect();
        assert_eq!(kernel_frames(&b), vec![5, 6]);
        assert_eq!((call_site(0, 10), call_site(1, 10)), (10, 9));
    }
}
