// SPDX-License-Identifier: GPL-2.0
//! Byte offsets into CPython 3.9–3.13 runtime structures (x86-64, default
//! release builds: no Py_DEBUG / Py_TRACE_REFS / Py_GIL_DISABLED), for
//! reading another process's Python stacks with plain memory reads.
//!
//! Walk per version (all pointers are user-space addresses in the target):
//!
//! ```text
//! interp = *(_PyRuntime + runtime_interpreters_head)  // newest interpreter (= main without subinterpreters)
//! ts     = *(interp + interp_threads_head)            // newest thread; then ts = *(ts + tstate_next)
//! 3.9/3.10:  f = *(ts + tstate_frame)                     // PyFrameObject*
//! 3.11/3.12: cf = *(ts + tstate_frame); f = *(cf + cframe_current_frame)
//! 3.13:      f = *(ts + tstate_frame)                     // _PyInterpreterFrame*
//! loop: code = *(f + frame_code); raw = *(f + frame_lasti); f = *(f + frame_previous)
//! ```
//!
//! 3.12/3.13 push a shim "entry" frame owned by the C stack each time C code
//! calls back into the eval loop; skip frames whose `owner` byte equals
//! `owner_cstack` (their code is the interpreter trampoline in 3.12 and
//! `None`, not a code object, in 3.13). 3.11 has no shim frames; `is_entry`
//! only marks where a C caller sits below, so keep walking past it.

/// Marks a field that does not exist in a given CPython version.
pub const NONE: u32 = u32::MAX;

// Bit layout of `PyASCIIObject.state` (a 32-bit bitfield word at
// `unicode_state`, read as a little-endian u32). gcc on x86-64 allocates
// bitfields from the least significant bit, so the header declaration order
// gives, for every version 3.9..=3.13:
//   bits 0-1 interned, bits 2-4 kind (1/2/4 = bytes per char; 0 = legacy
//   wchar_t string, 3.9-3.11 only), bit 5 compact, bit 6 ascii,
//   bit 7 ready (3.9-3.11) / statically_allocated (3.12+).
// scripts/python-offsets/offsets.c measures these at run time from each version's headers and
// scripts/python-offsets/gen.sh refuses to emit a table if they differ from the consts below.

/// Shift of the 3-bit `kind` field in the unicode `state` word.
pub const STATE_KIND_SHIFT: u32 = 2;
/// Mask of `kind` after shifting.
pub const STATE_KIND_MASK: u32 = 0b111;
/// Bit number of `compact` in the unicode `state` word.
pub const STATE_COMPACT_BIT: u32 = 5;
/// Bit number of `ascii` in the unicode `state` word.
pub const STATE_ASCII_BIT: u32 = 6;

/// Offsets (bytes) of the fields a stack walker reads; `NONE` = absent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PyOffsets {
    /// `_PyRuntimeState.interpreters.head` (PyInterpreterState*).
    pub runtime_interpreters_head: u32,
    /// `PyInterpreterState.tstate_head` (3.9/3.10) / `.threads.head` (3.11+).
    pub interp_threads_head: u32,
    /// `PyThreadState.next`.
    pub tstate_next: u32,
    /// `PyThreadState.thread_id` (pthread_self() of the thread).
    pub tstate_thread_id: u32,
    /// `PyThreadState.native_thread_id` (kernel tid), 3.11+.
    pub tstate_native_thread_id: u32,
    /// `frame` (3.9/3.10), `cframe` (3.11/3.12), `current_frame` (3.13).
    pub tstate_frame: u32,
    /// `_PyCFrame.current_frame` (3.11/3.12).
    pub cframe_current_frame: u32,
    /// `PyFrameObject.f_back` (3.9/3.10), `_PyInterpreterFrame.previous`.
    pub frame_previous: u32,
    /// `f_code` (3.9-3.12), `f_executable` (3.13; may be `None`, check type).
    pub frame_code: u32,
    /// `f_lasti` (int, 3.9/3.10), `prev_instr` (3.11/3.12), `instr_ptr` (3.13).
    pub frame_lasti: u32,
    /// `_PyInterpreterFrame.is_entry` (bool), 3.11 only.
    pub frame_is_entry: u32,
    /// `_PyInterpreterFrame.owner` (char), 3.12/3.13. (3.11 has `owner` too,
    /// at 69, but no C-stack owner value, so it is not exposed.)
    pub frame_owner: u32,
    /// Value of `FRAME_OWNED_BY_CSTACK`, 3.12/3.13.
    pub owner_cstack: u32,
    /// `PyCodeObject.co_filename` (str*).
    pub code_filename: u32,
    /// `PyCodeObject.co_name` (str*).
    pub code_name: u32,
    /// `PyCodeObject.co_qualname` (str*), 3.11+.
    pub code_qualname: u32,
    /// `PyCodeObject.co_firstlineno` (int).
    pub code_firstlineno: u32,
    /// `co_lnotab` (3.9) / `co_linetable` (3.10+), a bytes object pointer.
    pub code_linetable: u32,
    /// `PyCodeObject.co_code_adaptive` (inline bytecode array), 3.11+.
    pub code_code_adaptive: u32,
    /// `PyASCIIObject.state` (32-bit bitfield word, see STATE_* consts).
    pub unicode_state: u32,
    /// `sizeof(PyASCIIObject)`: data of compact ASCII strings starts here.
    pub unicode_ascii_data: u32,
    /// `sizeof(PyCompactUnicodeObject)`: data of other compact strings.
    pub unicode_compact_data: u32,
    /// `PyASCIIObject.length` (code points).
    pub unicode_length: u32,
    /// `PyVarObject.ob_size` = byte length of a bytes object.
    pub bytes_size: u32,
    /// `PyBytesObject.ob_sval`.
    pub bytes_data: u32,
}

// The table below is produced by scripts/python-offsets/gen.sh (scripts/python-offsets/offsets.c compiled against
// each pyenv CPython's include/python3.X and include/python3.X/internal);
// edit the generator, not these lines.
// BEGIN GENERATED
// CPython 3.9.18 (PY_VERSION_HEX 0x030912f0); unicode state bits: kind@2/3 compact@5/1 ascii@6/1
static PY_3_9: PyOffsets = PyOffsets {
    runtime_interpreters_head: 32,
    interp_threads_head: 8,
    tstate_next: 8,
    tstate_thread_id: 176,
    tstate_native_thread_id: NONE,
    tstate_frame: 24,
    cframe_current_frame: NONE,
    frame_previous: 24,
    frame_code: 32,
    frame_lasti: 104,
    frame_is_entry: NONE,
    frame_owner: NONE,
    owner_cstack: NONE,
    code_filename: 104,
    code_name: 112,
    code_qualname: NONE,
    code_firstlineno: 40,
    code_linetable: 120,
    code_code_adaptive: NONE,
    unicode_state: 32,
    unicode_ascii_data: 48,
    unicode_compact_data: 72,
    unicode_length: 16,
    bytes_size: 16,
    bytes_data: 32,
};
// CPython 3.10.13 (PY_VERSION_HEX 0x030a0df0); unicode state bits: kind@2/3 compact@5/1 ascii@6/1
static PY_3_10: PyOffsets = PyOffsets {
    runtime_interpreters_head: 32,
    interp_threads_head: 8,
    tstate_next: 8,
    tstate_thread_id: 176,
    tstate_native_thread_id: NONE,
    tstate_frame: 24,
    cframe_current_frame: NONE,
    frame_previous: 24,
    frame_code: 32,
    frame_lasti: 96,
    frame_is_entry: NONE,
    frame_owner: NONE,
    owner_cstack: NONE,
    code_filename: 104,
    code_name: 112,
    code_qualname: NONE,
    code_firstlineno: 40,
    code_linetable: 120,
    code_code_adaptive: NONE,
    unicode_state: 32,
    unicode_ascii_data: 48,
    unicode_compact_data: 72,
    unicode_length: 16,
    bytes_size: 16,
    bytes_data: 32,
};
// CPython 3.11.7 (PY_VERSION_HEX 0x030b07f0); unicode state bits: kind@2/3 compact@5/1 ascii@6/1
static PY_3_11: PyOffsets = PyOffsets {
    runtime_interpreters_head: 40,
    interp_threads_head: 16,
    tstate_next: 8,
    tstate_thread_id: 152,
    tstate_native_thread_id: 160,
    tstate_frame: 56,
    cframe_current_frame: 8,
    frame_previous: 48,
    frame_code: 32,
    frame_lasti: 56,
    frame_is_entry: 68,
    frame_owner: NONE,
    owner_cstack: NONE,
    code_filename: 112,
    code_name: 120,
    code_qualname: 128,
    code_firstlineno: 72,
    code_linetable: 136,
    code_code_adaptive: 184,
    unicode_state: 32,
    unicode_ascii_data: 48,
    unicode_compact_data: 72,
    unicode_length: 16,
    bytes_size: 16,
    bytes_data: 32,
};
// CPython 3.12.1 (PY_VERSION_HEX 0x030c01f0); unicode state bits: kind@2/3 compact@5/1 ascii@6/1
static PY_3_12: PyOffsets = PyOffsets {
    runtime_interpreters_head: 40,
    interp_threads_head: 72,
    tstate_next: 8,
    tstate_thread_id: 136,
    tstate_native_thread_id: 144,
    tstate_frame: 56,
    cframe_current_frame: 0,
    frame_previous: 8,
    frame_code: 0,
    frame_lasti: 56,
    frame_is_entry: NONE,
    frame_owner: 70,
    owner_cstack: 3,
    code_filename: 112,
    code_name: 120,
    code_qualname: 128,
    code_firstlineno: 68,
    code_linetable: 136,
    code_code_adaptive: 192,
    unicode_state: 32,
    unicode_ascii_data: 40,
    unicode_compact_data: 56,
    unicode_length: 16,
    bytes_size: 16,
    bytes_data: 32,
};
// CPython 3.13.0 (PY_VERSION_HEX 0x030d00f0); unicode state bits: kind@2/3 compact@5/1 ascii@6/1
static PY_3_13: PyOffsets = PyOffsets {
    runtime_interpreters_head: 632,
    interp_threads_head: 7344,
    tstate_next: 8,
    tstate_thread_id: 152,
    tstate_native_thread_id: 160,
    tstate_frame: 72,
    cframe_current_frame: NONE,
    frame_previous: 8,
    frame_code: 0,
    frame_lasti: 56,
    frame_is_entry: NONE,
    frame_owner: 70,
    owner_cstack: 3,
    code_filename: 112,
    code_name: 120,
    code_qualname: 128,
    code_firstlineno: 68,
    code_linetable: 136,
    code_code_adaptive: 200,
    unicode_state: 32,
    unicode_ascii_data: 40,
    unicode_compact_data: 56,
    unicode_length: 16,
    bytes_size: 16,
    bytes_data: 32,
};
// END GENERATED

/// Offsets for CPython `major.minor`, or `None` for unsupported versions.
pub fn offsets(major: u8, minor: u8) -> Option<&'static PyOffsets> {
    match (major, minor) {
        (3, 9) => Some(&PY_3_9),
        (3, 10) => Some(&PY_3_10),
        (3, 11) => Some(&PY_3_11),
        (3, 12) => Some(&PY_3_12),
        (3, 13) => Some(&PY_3_13),
        _ => None,
    }
}

/// Where a string's characters start, from its `state` word; `None` for
/// non-compact (legacy / subclass) strings, whose data sits behind a pointer
/// and which code object names and file names never are in practice.
pub fn unicode_data_offset(state: u32, o: &PyOffsets) -> Option<u32> {
    if state >> STATE_COMPACT_BIT & 1 == 0 {
        return None;
    }
    if state >> STATE_ASCII_BIT & 1 == 1 {
        Some(o.unicode_ascii_data)
    } else {
        Some(o.unicode_compact_data)
    }
}

/// Byte offset into the code object's bytecode of the instruction whose
/// source line the frame is on, from the raw value read at `frame_lasti`.
/// Pass the result to `lines::line_for` unchanged, in every version.
///
/// * 3.9: `f_lasti` (C `int`) is already a byte offset: that of the
///   instruction being executed (for a call in progress: the CALL_*). It
///   points at the first EXTENDED_ARG prefix when the instruction has one,
///   which co_lnotab maps to the same line.
/// * 3.10: `f_lasti` counts 2-byte code units, so the byte offset is
///   `f_lasti * 2`.
/// * 3.9/3.10: `f_lasti == -1` means the frame has not run an instruction
///   yet; returns `None` (CPython then reports `co_firstlineno`). Only the
///   low 32 bits of `raw` are used, so a 4-byte read zero- or sign-extended
///   both work.
/// * 3.11/3.12: `prev_instr` points at the last code unit of the last
///   instruction started: its opcode, or one of its inline CACHE units (e.g.
///   a CALL in progress leaves it on the CALL's last cache). Offset =
///   `prev_instr - (code_addr + co_code_adaptive)`. Do *not* add 2 to reach
///   "the next instruction": CPython's own `f_lineno` queries this exact
///   unit, and the location table maps cache units to their instruction's
///   line. A frame that has not started has `prev_instr` one unit before the
///   bytecode: negative, `None` (CPython reports `co_firstlineno`).
/// * 3.13: `instr_ptr` points at the opcode (or first EXTENDED_ARG) of the
///   instruction currently executing or about to begin, including the CALL
///   of a caller frame; query it as is. Do *not* subtract 2 as one would if
///   it were a "next instruction" pointer: that yields the previous
///   instruction, which can be on another line.
///
/// Returns `None` as well for odd or out-of-range pointer differences, which
/// only come from torn or stale reads.
pub fn instr_offset(
    ver: (u8, u8),
    raw_lasti_or_ptr: u64,
    code_addr: u64,
    o: &PyOffsets,
) -> Option<u32> {
    match ver {
        (3, 9) | (3, 10) => {
            // f_lasti is a C int; truncating first makes -1 negative
            // whatever width the caller read it with.
            let lasti = raw_lasti_or_ptr as u32 as i32;
            if lasti < 0 {
                return None;
            }
            let unit = if ver.1 == 10 { 2 } else { 1 };
            (lasti as u32).checked_mul(unit)
        }
        (3, 11..=13) => {
            if o.code_code_adaptive == NONE {
                return None;
            }
            let base = code_addr.checked_add(u64::from(o.code_code_adaptive))?;
            let off = raw_lasti_or_ptr.checked_sub(base)?;
            // Code units are 2 bytes; an odd distance cannot be an
            // instruction boundary.
            if off % 2 != 0 {
                return None;
            }
            u32::try_from(off).ok()
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_present() {
        for minor in 9..=13 {
            assert!(offsets(3, minor).is_some());
        }
        assert!(offsets(3, 8).is_none());
        assert!(offsets(3, 14).is_none());
        assert!(offsets(2, 7).is_none());
    }

    // Guards the hand-written parts of the table contract: which fields are
    // version-specific.
    #[test]
    fn none_fields_match_versions() {
        for minor in 9..=13u8 {
            let o = offsets(3, minor).unwrap();
            assert_eq!(o.tstate_native_thread_id == NONE, minor < 11);
            assert_eq!(o.cframe_current_frame == NONE, !(11..=12).contains(&minor));
            assert_eq!(o.frame_is_entry == NONE, minor != 11);
            assert_eq!(o.frame_owner == NONE, minor < 12);
            assert_eq!(o.owner_cstack == NONE, minor < 12);
            assert_eq!(o.code_qualname == NONE, minor < 11);
            assert_eq!(o.code_code_adaptive == NONE, minor < 11);
        }
    }

    #[test]
    fn instr_offset_semantics() {
        let o39 = offsets(3, 9).unwrap();
        let o310 = offsets(3, 10).unwrap();
        let o312 = offsets(3, 12).unwrap();
        assert_eq!(instr_offset((3, 9), 10, 0, o39), Some(10));
        assert_eq!(instr_offset((3, 10), 10, 0, o310), Some(20));
        assert_eq!(instr_offset((3, 10), 0xffff_ffff, 0, o310), None);
        assert_eq!(instr_offset((3, 9), u64::MAX, 0, o39), None);
        let code = 0x1000u64;
        let base = code + u64::from(o312.code_code_adaptive);
        assert_eq!(instr_offset((3, 12), base + 8, code, o312), Some(8));
        assert_eq!(instr_offset((3, 12), base - 2, code, o312), None);
        assert_eq!(instr_offset((3, 12), base + 3, code, o312), None);
        assert_eq!(instr_offset((3, 12), u64::MAX, u64::MAX, o312), None);
        assert_eq!(instr_offset((3, 14), base, code, o312), None);
    }

    #[test]
    fn unicode_data() {
        let o = offsets(3, 12).unwrap();
        let compact_ascii = 1 << STATE_COMPACT_BIT | 1 << STATE_ASCII_BIT | 1 << STATE_KIND_SHIFT;
        assert_eq!(
            unicode_data_offset(compact_ascii, o),
            Some(o.unicode_ascii_data)
        );
        let compact_ucs2 = 1 << STATE_COMPACT_BIT | 2 << STATE_KIND_SHIFT;
        assert_eq!(
            unicode_data_offset(compact_ucs2, o),
            Some(o.unicode_compact_data)
        );
        assert_eq!(compact_ucs2 >> STATE_KIND_SHIFT & STATE_KIND_MASK, 2);
        assert_eq!(unicode_data_offset(0, o), None);
    }
}
