/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * Shared between profile.bpf.c and user space (through the skeleton's
 * generated types): the in-kernel stack aggregation of `bpfscope profile`.
 * Samples are counted per (process, kernel stack, user stack); only the
 * unique stacks and their counts ever cross to user space.
 */
#ifndef BPFSCOPE_PROFILE_H
#define BPFSCOPE_PROFILE_H

enum bp_limits {
	BP_COMM_LEN = 16,
	/* Default frames per stack: the kernel's default perf_event_max_stack. */
	BP_MAX_DEPTH = 127,
	/* The most --max-depth allows (a power of two: indexes are masked). */
	BP_DEPTH_LIMIT = 1024,
	/* Kernel frames per stack (bpf_get_stack's own limit). */
	BP_KERNEL_DEPTH = 127,
	/* Executable mappings per process the unwinder knows (a power of two). */
	BP_MAX_MAPPINGS = 256,
	BP_BUILD_ID_SIZE = 20,
};

/*
 * A user frame as the unwinder stores it: bit 63 set means a file frame,
 * the file's id (bits 40-61, from `files`) and the file offset (bits 0-39),
 * with bit 62 set when the offset is where the frame was interrupted (a
 * signal arrived there, or it is the signal trampoline itself) rather than
 * a return address; bit 63 clear is a raw address (anonymous or JIT
 * memory, or a process whose mappings are unknown; bit 61 set: in an
 * executable mapping no file backs).
 */
enum bp_frame {
	BP_FRAME_FILE_BIT = 63,
	BP_FRAME_EXACT_BIT = 62,
	BP_FRAME_ID_SHIFT = 40,
	BP_FRAME_ID_BITS = 22,
	/* With bit 63 clear (user addresses never have it): an interpreter
	 * frame, the code's id (bits 40-61, announced by BP_NOTE_CODE) and
	 * the byte offset of its instruction in the code (bits 0-39). */
	BP_FRAME_INTERP_BIT = 62,
	/* With bits 63 and 62 clear: a raw address in an executable mapping
	 * no file backs (JIT code), as the process's mappings said when it
	 * was sampled. */
	BP_FRAME_ANON_BIT = 61,
};

/* The vDSO's key in `files` (it has no inode), registered by user space. */
enum bp_vdso {
	BP_VDSO_DEV = 0,
	BP_VDSO_INO = 1,
};

/*
 * Aggregation key. Stacks are keyed by a 64-bit hash of their frames in
 * `stack_map`; 0 means "no such stack".
 */
struct bp_key {
	__u32 tgid;
	/* The readout period it was counted in (the agent reads one period
	 * while the next is counted; 0 for one-shot runs). */
	__u32 epoch;
	__u64 kstack;
	__u64 ustack;
	/* With `key_labels` (the agent): the thread's cgroup v2 id and name,
	 * which its profiles carry as labels; 0 and "" otherwise, so one-shot
	 * profiles keep one key per process and stack. */
	__u64 cgroup;
	char thread[BP_COMM_LEN];
};

struct bp_val {
	/* Samples (on-CPU) or nanoseconds blocked (off-CPU). */
	__u64 value;
	/* Samples or off-CPU intervals summed into value. */
	__u64 count;
	/* The process's name (its group leader's comm) when the key was created. */
	char comm[BP_COMM_LEN];
};

/*
 * A value of `stack_map`: the frame count, a second hash of the frames (a
 * stack whose 64-bit key matches but whose length or check differs is a
 * collision, counted as BP_LOST_COLLISION), then `len` frames, leaf first.
 */
struct bp_stack_head {
	__u32 len;
	__u32 check;
};

struct bp_stack_buf {
	struct bp_stack_head head;
	__u64 frames[BP_DEPTH_LIMIT];
};

/* A file as the kernel names it: its inode's device and number. */
struct bp_file_key {
	__u64 dev;
	__u64 ino;
};

enum bp_file_state {
	/* Seen by the kernel, announced, not yet looked at by user space. */
	BP_FILE_PENDING = 0,
	/* Unwind table loaded: entries [table_start, table_start + table_len). */
	BP_FILE_TABLE = 1,
	/* No usable unwind information: frame pointers only. */
	BP_FILE_NO_TABLE = 2,
};

struct bp_file {
	/* The id in file frames (from 1), assigned by the kernel side. */
	__u32 id;
	__u32 state;
	__u32 table_start;
	__u32 table_len;
	/* Table address = file offset + bias (ELF vaddr - offset - table base). */
	__s64 bias;
	/* The file holds an interpreter: its index in `interps` (0: none). */
	__u32 interp;
	__u32 pad;
};

enum bp_interp_limits {
	/* Interpreter files the unwinder knows (indexes 1..BP_MAX_INTERPS-1). */
	BP_MAX_INTERPS = 64,
	/* Bytes of a code object's name, file name and line table that its
	 * announcement carries (user space reads longer tables while the
	 * process lives). */
	BP_CODE_NAME = 128,
	BP_CODE_FILE = 256,
	BP_CODE_TABLE = 2048,
	/* Threads searched for the sampled one's interpreter state. */
	BP_MAX_PY_THREADS = 256,
};

enum bp_interp_kind {
	BP_INTERP_NONE = 0,
	BP_INTERP_PYTHON = 1,
};

/*
 * Where CPython keeps what the unwinder reads, for one version (byte
 * offsets; BP_PY_NONE where the version has no such field). user space
 * fills them from its per-version table (src/runtime/python).
 */
enum bp_py_none {
	BP_PY_NONE = 0xffffffff,
};

struct bp_py_offsets {
	__u32 runtime_interpreters_head;
	__u32 interp_threads_head;
	__u32 tstate_next;
	__u32 tstate_thread_id;
	/* 3.11+: the kernel's thread id (how arm64 finds a thread's state). */
	__u32 tstate_native_thread_id;
	/* 3.9/3.10: PyFrameObject *frame; 3.11/3.12: _PyCFrame *cframe;
	 * 3.13: _PyInterpreterFrame *current_frame. */
	__u32 tstate_frame;
	__u32 cframe_current_frame;
	__u32 frame_previous;
	__u32 frame_code;
	/* 3.9/3.10: int f_lasti; 3.11+: a pointer into the code's bytecode. */
	__u32 frame_lasti;
	/* 3.11: bool is_entry; 3.12+: char owner (entry frames: owner_cstack). */
	__u32 frame_is_entry;
	__u32 frame_owner;
	__u32 owner_cstack;
	__u32 code_filename;
	__u32 code_name;
	__u32 code_qualname;
	__u32 code_firstlineno;
	__u32 code_linetable;
	__u32 code_code_adaptive;
	__u32 unicode_state;
	__u32 unicode_length;
	__u32 unicode_ascii_data;
	__u32 unicode_compact_data;
	__u32 bytes_size;
	__u32 bytes_data;
};

/* An interpreter in a file, as the unwinder uses it. */
struct bp_interp {
	__u32 kind;
	/* major << 8 | minor */
	__u32 version;
	/* The eval loop's code, as file offsets [start, end): its function
	 * and, where the symbols show one, its cold part. */
	__u64 eval_start[2];
	__u64 eval_end[2];
	/* The runtime state's address is the address of file offset 0 in the
	 * executable mapping plus this. */
	__s64 runtime_rel;
	struct bp_py_offsets o;
};

/* A code object announcement (BP_NOTE_CODE). */
struct bp_code_note {
	__u32 kind;
	__u32 tgid;
	__u32 code_id;
	__u32 version;
	__u64 code;
	__u32 firstlineno;
	/* Characters' width (1, 2 or 4 bytes) and the characters copied of
	 * the name and file name (length * width bytes, under the buffer's
	 * size). */
	__u32 name_kind;
	__u32 name_len;
	__u32 file_kind;
	__u32 file_len;
	/* The line table's full length in bytes (at most its first
	 * BP_CODE_TABLE - 1 bytes are copied). */
	__u32 table_len;
	char name[BP_CODE_NAME];
	char file[BP_CODE_FILE];
	__u8 table[BP_CODE_TABLE];
};

/* One executable mapping of a process. */
struct bp_mapping {
	__u64 start;
	__u64 end;
	/* File offset of start. */
	__u64 pgoff;
	/* Zero for anonymous memory. */
	struct bp_file_key file;
	/* The file's entry in `files`, copied at first use once it is final
	 * (a table or none): saves a hash lookup per frame. */
	struct bp_file cached;
	__u32 has_cached;
	__u32 pad;
};

/*
 * A process's executable mappings, sorted by address, read in the kernel
 * from its VMAs (unwind.bpf.h says when).
 */
struct bp_proc {
	__u32 n;
	/* More executable mappings than BP_MAX_MAPPINGS. */
	__u32 truncated;
	__u64 built_ns;
	/* When a sample last found a frame outside them (0: never). */
	__u64 stale;
	struct bp_mapping m[BP_MAX_MAPPINGS];
};

/* Ring buffer records. */
enum bp_note_kind {
	/* A process was sampled for the first time (or after exec). */
	BP_NOTE_PROC = 1,
	/* A file was seen for the first time: its table is wanted. */
	BP_NOTE_FILE = 2,
	/* A sample's frame fell outside the process's known mappings. */
	BP_NOTE_STALE = 3,
	/* An interpreter's code object was seen for the first time
	 * (struct bp_code_note). */
	BP_NOTE_CODE = 4,
};

/* bpfscope_build's context: the process whose mappings to read. */
struct bp_build_args {
	__u32 pid;
	__u32 pad;
};

struct bp_note {
	__u32 kind;
	__u32 tgid;
	__u32 file_id;
	__u32 pad;
	/* BP_NOTE_FILE: the mapping it was seen in, to open it by. */
	__u64 start;
	__u64 end;
	__u64 pgoff;
	struct bp_file_key file;
};

/* Off-CPU: where a thread was when it was switched out. */
struct bp_offcpu_start {
	__u64 ts_ns;
	struct bp_key key;
};


enum bp_lost {
	/* A kernel stack could not be stored: `stack_map` was full. */
	BP_LOST_KSTACK = 0,
	/* A user stack could not be stored: `stack_map` was full. */
	BP_LOST_USTACK = 1,
	/* The aggregation map was full. */
	BP_LOST_KEYS = 2,
	/* A new-process notification did not fit the ring buffer. */
	BP_LOST_NOTIFY = 3,
	/* Off-CPU: too many threads switched out at once to remember. */
	BP_LOST_OFFCPU = 4,
	/* Not losses: where every run of the CPU sampler went, so that user
	 * space can account for each sample (runs = idle + other + stored +
	 * BP_LOST_KEYS). */
	BP_SEEN_RUNS = 5,
	BP_SEEN_IDLE = 6,
	BP_SEEN_OTHER = 7,
	/* Two different stacks with the same 64-bit hash: the later one is lost. */
	BP_LOST_COLLISION = 8,
	/* The file table (`files`) was full: frames of new files stay raw. */
	BP_LOST_FILES = 9,
	/* How user stacks were unwound and why they ended (not losses). */
	BP_UNW_TABLE_FRAMES = 10, /* frames stepped through with an unwind table */
	BP_UNW_FP_FRAMES = 11,    /* frames stepped through with frame pointers */
	BP_UNW_END_OUTERMOST = 12, /* ended at a frame with no caller (_start, clone) */
	BP_UNW_END_DEPTH = 13,    /* cut at --max-depth */
	BP_UNW_END_READ = 14,     /* a stack read failed (paged out, or a bad rule) */
	BP_UNW_END_NO_RULE = 15,  /* no table entry and no frame pointer */
	BP_UNW_END_FP = 16,       /* a frame-pointer walk ended (null or bad frame) */
	BP_UNW_PROC_BUSY = 17,    /* mappings could not be read (the iterator refused) */
	BP_UNW_NO_PROC = 18,      /* samples unwound without the process's mappings */
	BP_UNW_REBUILDS = 19,     /* process mapping tables built or rebuilt */
	/* Interpreter frames (not losses, except where said). */
	BP_PY_FRAMES = 20,        /* interpreter frames stored */
	BP_PY_NO_THREAD = 21,     /* eval-loop frames whose thread state was not found */
	BP_PY_LOST_CODE = 22,     /* frames whose code could not be announced (ring full) */
	BP_PY_READ = 23,          /* interpreter frame chains cut by a failed read */
	BP_PY_UNPLACED = 24,      /* interpreter frames after the native walk ended */
	BP_LOST_NR = 25,
};

enum bp_target_mode {
	BP_TARGET_ALL = 0,
	BP_TARGET_TRACKED = 1, /* tgids in the tracked map */
	BP_TARGET_CGROUP = 2,  /* tasks in the cgroup subtree */
};

enum bp_stacks {
	BP_STACKS_KERNEL = 1,
	BP_STACKS_USER = 2,
};

#endif /* BPFSCOPE_PROFILE_H */
