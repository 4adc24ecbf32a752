// SPDX-License-Identifier: GPL-2.0
//
// Prints the CPython struct offsets that src/offsets.rs needs, computed by
// the compiler from the interpreter's own (internal) headers, so the table in
// offsets.rs is reproducible rather than hand-copied.  Build and run via
// gen/gen.sh, once per installed CPython.
//
// Output modes (argv[1]):
//   rust : one `PyOffsets { ... }` literal, pasted by gen.sh into offsets.rs
//   kv   : `name value` lines, consumed by gen/verify_live.py
// Unicode `state` bit positions are measured at run time (set a bitfield in a
// zeroed struct, see which bits flipped) because C gives no offsetof() for
// bitfields and reading them by eye from the header is error-prone.

#define Py_BUILD_CORE 1
#include <Python.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#if PY_VERSION_HEX < 0x03090000 || PY_VERSION_HEX >= 0x030e0000
#error "generator only knows CPython 3.9 .. 3.13"
#endif

// A debug / trace-refs / free-threaded build changes PyObject itself, so
// every number below would be wrong for the ordinary release interpreters.
#if defined(Py_DEBUG) || defined(Py_TRACE_REFS) || defined(Py_GIL_DISABLED)
#error "headers are not from a default release build"
#endif

#if PY_VERSION_HEX < 0x030b0000
// 3.9/3.10 keep struct _frame in the public-but-not-included frameobject.h.
#include <frameobject.h>
#endif

#include "pycore_runtime.h"
#include "pycore_interp.h"
#if PY_VERSION_HEX >= 0x030b0000
#include "pycore_frame.h"
#include "pycore_code.h"
#endif

#define NONE 0xffffffffu

// Finds the lowest set bit of a mask laid over the state word, so we report
// positions rather than masks.
static unsigned lowest_bit(const unsigned char *b, size_t n)
{
    for (size_t i = 0; i < n * 8; i++)
        if (b[i / 8] & (1u << (i % 8)))
            return (unsigned)i;
    return NONE;
}

// Width is reported too so the check in gen.sh catches a field that grew.
static unsigned popcount_bytes(const unsigned char *b, size_t n)
{
    unsigned c = 0;
    for (size_t i = 0; i < n; i++)
        c += (unsigned)__builtin_popcount(b[i]);
    return c;
}

// Each probe uses a fresh zeroed object so exactly one field's bits are set.
#define STATE_PROBE(field, val, pos, width)                                   \
    do {                                                                      \
        PyASCIIObject o;                                                      \
        memset(&o, 0, sizeof o);                                              \
        o.state.field = (val);                                                \
        const unsigned char *b = (const unsigned char *)&o.state;             \
        pos = lowest_bit(b, sizeof o.state);                                  \
        width = popcount_bytes(b, sizeof o.state);                            \
    } while (0)

int main(int argc, char **argv)
{
    int rust = argc > 1 && strcmp(argv[1], "rust") == 0;

    unsigned runtime_interpreters_head =
        offsetof(_PyRuntimeState, interpreters.head);
#if PY_VERSION_HEX >= 0x030b0000
    // 3.11 moved the list into `threads` (the brief's "tstate_head" is gone).
    unsigned interp_threads_head = offsetof(PyInterpreterState, threads.head);
#else
    unsigned interp_threads_head = offsetof(PyInterpreterState, tstate_head);
#endif
    unsigned tstate_next = offsetof(PyThreadState, next);
    unsigned tstate_thread_id = offsetof(PyThreadState, thread_id);
#if PY_VERSION_HEX >= 0x030b0000
    unsigned tstate_native_thread_id =
        offsetof(PyThreadState, native_thread_id);
#else
    unsigned tstate_native_thread_id = NONE;
#endif

    unsigned tstate_frame, cframe_current_frame = NONE;
    unsigned frame_previous, frame_code, frame_lasti;
    unsigned frame_is_entry = NONE, frame_owner = NONE, owner_cstack = NONE;
#if PY_VERSION_HEX >= 0x030d0000
    tstate_frame = offsetof(PyThreadState, current_frame);
    frame_previous = offsetof(_PyInterpreterFrame, previous);
    frame_code = offsetof(_PyInterpreterFrame, f_executable);
    frame_lasti = offsetof(_PyInterpreterFrame, instr_ptr);
    frame_owner = offsetof(_PyInterpreterFrame, owner);
    owner_cstack = FRAME_OWNED_BY_CSTACK;
#elif PY_VERSION_HEX >= 0x030b0000
    tstate_frame = offsetof(PyThreadState, cframe);
    cframe_current_frame = offsetof(_PyCFrame, current_frame);
    frame_previous = offsetof(_PyInterpreterFrame, previous);
    frame_code = offsetof(_PyInterpreterFrame, f_code);
    frame_lasti = offsetof(_PyInterpreterFrame, prev_instr);
#if PY_VERSION_HEX >= 0x030c0000
    frame_owner = offsetof(_PyInterpreterFrame, owner);
    owner_cstack = FRAME_OWNED_BY_CSTACK;
#else
    frame_is_entry = offsetof(_PyInterpreterFrame, is_entry);
#endif
#else
    tstate_frame = offsetof(PyThreadState, frame);
    frame_previous = offsetof(PyFrameObject, f_back);
    frame_code = offsetof(PyFrameObject, f_code);
    frame_lasti = offsetof(PyFrameObject, f_lasti);
#endif

    unsigned code_filename = offsetof(PyCodeObject, co_filename);
    unsigned code_name = offsetof(PyCodeObject, co_name);
    unsigned code_firstlineno = offsetof(PyCodeObject, co_firstlineno);
#if PY_VERSION_HEX >= 0x030b0000
    unsigned code_qualname = offsetof(PyCodeObject, co_qualname);
    unsigned code_code_adaptive = offsetof(PyCodeObject, co_code_adaptive);
#else
    unsigned code_qualname = NONE;
    unsigned code_code_adaptive = NONE;
#endif
#if PY_VERSION_HEX >= 0x030a0000
    unsigned code_linetable = offsetof(PyCodeObject, co_linetable);
#else
    unsigned code_linetable = offsetof(PyCodeObject, co_lnotab);
#endif

    unsigned unicode_state = offsetof(PyASCIIObject, state);
    unsigned unicode_ascii_data = sizeof(PyASCIIObject);
    unsigned unicode_compact_data = sizeof(PyCompactUnicodeObject);
    unsigned unicode_length = offsetof(PyASCIIObject, length);
    unsigned bytes_size = offsetof(PyVarObject, ob_size);
    unsigned bytes_data = offsetof(PyBytesObject, ob_sval);

    unsigned kind_pos, kind_w, compact_pos, compact_w, ascii_pos, ascii_w;
    STATE_PROBE(kind, 7, kind_pos, kind_w);
    STATE_PROBE(compact, 1, compact_pos, compact_w);
    STATE_PROBE(ascii, 1, ascii_pos, ascii_w);

    // Emitting through one table keeps the two output modes in sync.
    struct { const char *name; unsigned v; } f[] = {
        {"runtime_interpreters_head", runtime_interpreters_head},
        {"interp_threads_head", interp_threads_head},
        {"tstate_next", tstate_next},
        {"tstate_thread_id", tstate_thread_id},
        {"tstate_native_thread_id", tstate_native_thread_id},
        {"tstate_frame", tstate_frame},
        {"cframe_current_frame", cframe_current_frame},
        {"frame_previous", frame_previous},
        {"frame_code", frame_code},
        {"frame_lasti", frame_lasti},
        {"frame_is_entry", frame_is_entry},
        {"frame_owner", frame_owner},
        {"owner_cstack", owner_cstack},
        {"code_filename", code_filename},
        {"code_name", code_name},
        {"code_qualname", code_qualname},
        {"code_firstlineno", code_firstlineno},
        {"code_linetable", code_linetable},
        {"code_code_adaptive", code_code_adaptive},
        {"unicode_state", unicode_state},
        {"unicode_ascii_data", unicode_ascii_data},
        {"unicode_compact_data", unicode_compact_data},
        {"unicode_length", unicode_length},
        {"bytes_size", bytes_size},
        {"bytes_data", bytes_data},
    };
    size_t n = sizeof f / sizeof f[0];

    if (rust) {
        printf("// CPython %s (PY_VERSION_HEX 0x%08x); unicode state bits: "
               "kind@%u/%u compact@%u/%u ascii@%u/%u\n",
               PY_VERSION, (unsigned)PY_VERSION_HEX, kind_pos, kind_w,
               compact_pos, compact_w, ascii_pos, ascii_w);
        printf("static PY_%d_%d: PyOffsets = PyOffsets {\n", PY_MAJOR_VERSION,
               PY_MINOR_VERSION);
        for (size_t i = 0; i < n; i++) {
            if (f[i].v == NONE)
                printf("    %s: NONE,\n", f[i].name);
            else
                printf("    %s: %u,\n", f[i].name, f[i].v);
        }
        printf("};\n");
    } else {
        printf("version %d.%d\n", PY_MAJOR_VERSION, PY_MINOR_VERSION);
        for (size_t i = 0; i < n; i++)
            printf("%s %u\n", f[i].name, f[i].v);
        printf("state_kind_shift %u\nstate_kind_width %u\n", kind_pos, kind_w);
        printf("state_compact_bit %u\nstate_compact_width %u\n", compact_pos,
               compact_w);
        printf("state_ascii_bit %u\nstate_ascii_width %u\n", ascii_pos,
               ascii_w);
    }
    return 0;
}
