/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Python frames in the profiler's user stacks (unwind.bpf.h). CPython
 * keeps its call stack in its own structures: the thread's state points
 * at the innermost frame, frames point at their caller and at their code
 * object (qualified name, file, line table). Each native activation of the
 * eval loop runs a run of those frames; where the native walk meets one,
 * the Python frames it runs are stored in its place, so native, kernel and
 * Python frames interleave as they called each other.
 *
 * Nothing is asked of the Python process. User space finds, per file, the
 * eval loop's extent, the runtime state's address and the version's
 * struct offsets (`interps`); everything else is read here, at sample
 * time. A Python frame is stored as (code id, instruction offset); the
 * first sighting of a code object announces it with its names and line
 * table (BP_NOTE_CODE), so a process that exits at once is still named.
 *
 * The thread's state is found by its pthread id, which CPython keeps in
 * it and which is, on x86-64, the thread's FS base: no TLS layout needed.
 * On arm64, whose thread pointer sits at a glibc-version-dependent
 * distance from the pthread, by the kernel thread id CPython 3.11 and
 * later keep as well.
 */
#ifndef BPFSCOPE_PYTHON_BPF_H
#define BPFSCOPE_PYTHON_BPF_H

#define BP_FRAME_INTERP (1ULL << BP_FRAME_INTERP_BIT)
/* Emission states of struct bp_unwind's py_state. */
#define BP_PY_UNKNOWN 0
#define BP_PY_READY 1
#define BP_PY_NONE_FOUND 2
#define BP_PY_THREADS_WALKED 128
/* PyASCIIObject.state bits, the same in 3.9 to 3.13. */
#define BP_PY_KIND_SHIFT 2
#define BP_PY_COMPACT_BIT 5
#define BP_PY_ASCII_BIT 6

#if !defined(__TARGET_ARCH_arm64)
struct thread_struct___bp {
	unsigned long fsbase;
} __attribute__((preserve_access_index));

struct task_struct___fs {
	struct thread_struct___bp thread;
} __attribute__((preserve_access_index));
#endif

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, BP_MAX_INTERPS);
	__type(key, u32);
	__type(value, struct bp_interp);
} interps SEC(".maps");

/* Thread id -> its PyThreadState, checked at each use. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, u32);
	__type(value, u64);
} pythreads SEC(".maps");

/* A code object in a process; its name and file pointers and first line
 * tell a freed code object from a new one at the same address. */
struct bp_code_key {
	u32 tgid;
	u32 firstlineno;
	u64 code;
	u64 names;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct bp_code_key);
	__type(value, u32);
} pycodes SEC(".maps");

/* The next code id; ids start at 1 (0: a code that could not be announced). */
u32 next_code_id = 0;

static __always_inline int bp_read_ptr(u64 *dst, u64 base, u32 off)
{
	if (off == BP_PY_NONE)
		return -1;
	return bpf_probe_read_user(dst, sizeof(*dst), (void *)(base + off));
}

/* Whether the thread state ts is the sampled thread's: its id field (the
 * native thread id on arm64, pthread_self, the fsbase, on x86-64) is
 * want_id; negative when it cannot be read. */
static __always_inline int bp_py_mine(struct bp_interp *in, u64 ts, u64 want_id)
{
	u64 id = 0;

#if defined(__TARGET_ARCH_arm64)
	if (bp_read_ptr(&id, ts, in->o.tstate_native_thread_id))
		return -1;
#else
	if (bp_read_ptr(&id, ts, in->o.tstate_thread_id))
		return -1;
#endif
	return id == want_id;
}

/* The sampled thread's PyThreadState: cached by thread id, else found in
 * the interpreter's thread list. 0 when there is none.
 *
 * A global function, so the verifier checks its loop once rather than once
 * per calling state (35,000 of the profiler's 146,000 verified
 * instructions). The interpreter comes by index, looked up inside: a
 * global function's pointer argument may be NULL and is checked anyway.
 * Every argument is read on every architecture: the verifier checks each
 * register the function's BTF declares, and clang leaves unset one the
 * body ignores (arm64's unused fsbase: "Caller passes invalid args"). */
__noinline u64 bp_py_tstate(u32 interp_idx, u64 runtime, u32 tid, u64 want_id)
{
	u64 ts = 0, interp = 0, *cached;
	u32 idx = interp_idx & (BP_MAX_INTERPS - 1);
	struct bp_interp *in = bpf_map_lookup_elem(&interps, &idx);
	int mine;

	if (!in)
		return 0;
	cached = bpf_map_lookup_elem(&pythreads, &tid);
	if (cached) {
		ts = *cached;
		if (bp_py_mine(in, ts, want_id) == 1)
			return ts;
	}
	if (bp_read_ptr(&interp, runtime, in->o.runtime_interpreters_head) || !interp)
		return 0;
	if (bp_read_ptr(&ts, interp, in->o.interp_threads_head))
		return 0;
	for (int i = 0; i < BP_PY_THREADS_WALKED; i++) {
		if (!ts)
			return 0;
		mine = bp_py_mine(in, ts, want_id);
		if (mine < 0)
			return 0;
		if (mine) {
			bpf_map_update_elem(&pythreads, &tid, &ts, BPF_ANY);
			return ts;
		}
		if (bp_read_ptr(&ts, ts, in->o.tstate_next))
			return 0;
	}
	return 0;
}

/* The innermost frame of a thread state (0: none). */
static __always_inline u64 bp_py_current(struct bp_interp *in, u64 ts)
{
	u64 f = 0;

	if (bp_read_ptr(&f, ts, in->o.tstate_frame))
		return 0;
	/* 3.11/3.12 go through the C frame record. */
	if (in->o.cframe_current_frame != BP_PY_NONE && f &&
	    bp_read_ptr(&f, f, in->o.cframe_current_frame))
		return 0;
	return f;
}

/* A str's characters into dst (at most cap bytes); *kind, *len describe
 * them. */
static __always_inline void bp_py_string(struct bp_interp *in, u64 s, char *dst, u32 cap,
					 u32 *kind, u32 *len)
{
	u32 state = 0, n;
	u64 length = 0, data;

	*kind = 0;
	*len = 0;
	if (!s || bpf_probe_read_user(&state, sizeof(state), (void *)(s + in->o.unicode_state)) ||
	    bp_read_ptr(&length, s, in->o.unicode_length))
		return;
	/* Not compact: the characters are elsewhere (never for names and
	 * file names the compiler made). */
	if (!(state & (1 << BP_PY_COMPACT_BIT)))
		return;
	*kind = (state >> BP_PY_KIND_SHIFT) & 7;
	if (!*kind)
		return;
	data = s + ((state & (1 << BP_PY_ASCII_BIT)) ? in->o.unicode_ascii_data :
						      in->o.unicode_compact_data);
	if (length > cap)
		length = cap;
	n = (u32)length * *kind;
	/* cap is a power of two: the mask is a bound every verifier (6.1
	 * on) follows, where a comparison alone is lost to the compiler
	 * (which drops the mask unless the barrier hides what it knows). */
	if (n > cap - 1)
		n = cap - 1;
	asm volatile("" : "+r"(n));
	n &= cap - 1;
	/* Whole characters only: the rest of the record is not zeroed. */
	*len = n / *kind;
	if (n)
		bpf_probe_read_user(dst, n, (void *)data);
}

/* Announces a code object: names, first line, the start of its line table. */
static __noinline int bp_py_announce(struct bp_interp *in, struct bp_code_key *k, u32 id,
				     u64 name)
{
	u64 code = k->code;
	struct bp_code_note *n = bpf_ringbuf_reserve(&procs, sizeof(*n), 0);
	u64 file = 0, table = 0, size = 0;

	if (!n)
		return -1;
	n->kind = BP_NOTE_CODE;
	n->tgid = k->tgid;
	n->code_id = id;
	n->version = in->version;
	n->code = code;
	n->firstlineno = k->firstlineno;
	bp_py_string(in, name, n->name, BP_CODE_NAME, &n->name_kind, &n->name_len);
	bp_read_ptr(&file, code, in->o.code_filename);
	bp_py_string(in, file, n->file, BP_CODE_FILE, &n->file_kind, &n->file_len);
	n->table_len = 0;
	if (!bp_read_ptr(&table, code, in->o.code_linetable) && table &&
	    !bp_read_ptr(&size, table, in->o.bytes_size)) {
		u32 copy;

		n->table_len = size;
		/* At most BP_CODE_TABLE - 1 bytes: a mask keeps the bound. */
		copy = size > BP_CODE_TABLE - 1 ? BP_CODE_TABLE - 1 : size;
		asm volatile("" : "+r"(copy));
		copy &= BP_CODE_TABLE - 1;
		if (copy)
			bpf_probe_read_user(n->table, copy, (void *)(table + in->o.bytes_data));
	}
	bpf_ringbuf_submit(n, 0);
	return 0;
}

/* The id of a frame's code object, announcing it at first sight (0: it
 * could not be). */
static __always_inline u32 bp_py_code_id(struct bp_interp *in, u64 code, u32 tgid)
{
	struct bp_code_key k = { .tgid = tgid, .code = code };
	u64 name = 0, file = 0;
	u32 *known, id;

	if (bp_read_ptr(&name, code, in->o.code_qualname != BP_PY_NONE ? in->o.code_qualname :
									in->o.code_name))
		return 0;
	bp_read_ptr(&file, code, in->o.code_filename);
	bpf_probe_read_user(&k.firstlineno, sizeof(k.firstlineno),
			    (void *)(code + in->o.code_firstlineno));
	k.names = name ^ (file << 1);
	known = bpf_map_lookup_elem(&pycodes, &k);
	if (known)
		return *known;
	id = __sync_fetch_and_add(&next_code_id, 1) + 1;
	if (id > BP_FRAME_ID_MASK || bp_py_announce(in, &k, id, name)) {
		bs_count(&lost, BP_PY_LOST_CODE);
		return 0;
	}
	bpf_map_update_elem(&pycodes, &k, &id, BPF_ANY);
	return id;
}

/*
 * The native walk is at an eval-loop frame (in, at runtime): find the
 * thread's Python frames if not yet done. 1 when this activation has
 * Python frames to store in its place.
 */
static __always_inline int bp_py_enter(struct bp_unwind *u, u32 interp, struct bp_interp *in,
				       u64 runtime, int at_eval)
{
	u64 ts;

	if (u->py_state == BP_PY_UNKNOWN) {
		ts = bp_py_tstate(interp, runtime, u->tid, u->py_thread_id);
		u->py_frame = ts ? bp_py_current(in, ts) : 0;
		u->py_state = u->py_frame ? BP_PY_READY : BP_PY_NONE_FOUND;
		u->py_interp = interp;
		if (!ts && at_eval)
			bs_count(&lost, BP_PY_NO_THREAD);
	}
	return u->py_state == BP_PY_READY && u->py_interp == interp && u->py_frame;
}

/* One Python frame: stored, then the walk moves to its caller. Clears
 * py_emit at the end of the eval activation it belongs to. */
static __always_inline void bp_py_frame(struct bp_unwind *u, struct bp_stack_buf *buf)
{
	u32 zero_idx = u->py_interp & (BP_MAX_INTERPS - 1);
	struct bp_interp *in = bpf_map_lookup_elem(&interps, &zero_idx);
	u64 f = u->py_frame, code = 0, prev = 0, raw = 0, off = 0;
	u32 d = u->depth;
	u8 flag = 0;

	if (!in || !f)
		goto done;
	if (bp_read_ptr(&prev, f, in->o.frame_previous) || bp_read_ptr(&code, f, in->o.frame_code))
		goto failed;
	if (in->o.frame_owner != BP_PY_NONE) {
		/* 3.12+: the eval loop's own entry record ends its activation. */
		if (bpf_probe_read_user(&flag, 1, (void *)(f + in->o.frame_owner)))
			goto failed;
		if (flag == in->o.owner_cstack) {
			u->py_frame = prev;
			u->py_emit = 0;
			return;
		}
	}
	if (in->o.code_code_adaptive == BP_PY_NONE) {
		/* 3.9/3.10: f_lasti, an int (bytes in 3.9, code units after). */
		__s32 lasti = 0;

		bpf_probe_read_user(&lasti, sizeof(lasti), (void *)(f + in->o.frame_lasti));
		off = lasti < 0 ? 0 : (u64)lasti;
		if (in->version >= 0x030a)
			off *= 2;
	} else if (!bp_read_ptr(&raw, f, in->o.frame_lasti)) {
		u64 start = code + in->o.code_code_adaptive;

		off = raw > start ? raw - start : 0;
	}
	if (d < max_depth && d < BP_DEPTH_LIMIT) {
		u64 id = bp_py_code_id(in, code, u->tgid);

		bp_record(u, buf, d, BP_FRAME_INTERP | ((id & BP_FRAME_ID_MASK) << BP_FRAME_ID_SHIFT) |
					     (off & BP_FRAME_OFFSET_MASK));
		u->depth = d + 1;
		u->py_frames++;
	} else {
		bs_count(&lost, BP_UNW_END_DEPTH);
		u->py_frame = 0;
		u->py_emit = 0;
		return;
	}
	u->py_frame = prev;
	/* 3.9/3.10: one frame per activation; 3.11: the entry frame is marked. */
	if (in->o.frame_is_entry != BP_PY_NONE) {
		if (bpf_probe_read_user(&flag, 1, (void *)(f + in->o.frame_is_entry)) || flag)
			u->py_emit = 0;
	} else if (in->o.frame_owner == BP_PY_NONE) {
		u->py_emit = 0;
	}
	return;
failed:
	bs_count(&lost, BP_PY_READ);
done:
	u->py_frame = 0;
	u->py_emit = 0;
}

#endif /* BPFSCOPE_PYTHON_BPF_H */
