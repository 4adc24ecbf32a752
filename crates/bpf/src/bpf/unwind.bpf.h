/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The user-stack unwinder of profile.bpf.c. Code without frame pointers is
 * walked with its file's unwind table (compiled from .eh_frame by the
 * bpfscope-unwind crate; its documentation has the entry layout, and
 * `lookup_in_bytes` there is the reference for bp_rule below). Tables live
 * in one array, `unwind_entries`, one slice per file, keyed by the file's
 * inode, so every process mapping a file shares one copy. A process's
 * executable mappings are read in the kernel from its VMAs (the task_vma
 * iterator) at exec, after an mmap of executable code, at fork (copied),
 * and when user space asks (bp_build_proc says why never in the sampler),
 * so tables of files seen before are in use from a new process's first
 * sample, and frames are stored as (file id, file offset) at sample time:
 * nothing about a short-lived process needs to be read from /proc after
 * it is gone.
 *
 * One frame per bpf_loop callback, with all state in per-CPU scratch maps
 * reached through the callback context (kernels before 6.7 verify a
 * callback as if it ran once; see filter.bpf.h).
 */
#ifndef BPFSCOPE_UNWIND_BPF_H
#define BPFSCOPE_UNWIND_BPF_H

#define VM_EXEC 0x4
#define BP_FRAME_FILE (1ULL << BP_FRAME_FILE_BIT)
#define BP_FRAME_OFFSET_MASK ((1ULL << BP_FRAME_ID_SHIFT) - 1)
#define BP_FRAME_ID_MASK ((1ULL << BP_FRAME_ID_BITS) - 1)
#define BP_FRAME_EXACT (1ULL << BP_FRAME_EXACT_BIT)
/* A process whose frames fall outside its known mappings (dlopen) is
 * announced for a re-read at most this often. */
#define BP_REBUILD_NS 10000000ULL

/* Entry kinds (bpfscope-unwind's rule::kind). */
#define K_GAP 0
#define K_RSP 1
#define K_RSP_X8 2
#define K_RBP 3
#define K_REGISTER 4
#define K_PLT 5
#define K_DEREF_RSP 6
#define K_DEREF_RBP 7
#define K_SIGCONTEXT 8
#define K_SIGNAL_FRAME (1 << 4)
#define K_RA_UNDEFINED (1 << 5)
#define K_RBP_SHIFT 6
#define K_RBP_AT_CFA 1
#define K_RBP_AT_RBP 2
#define K_RBP_LOST 3
/* Offsets into the kernel's signal frame (rule::SIGCONTEXT_*). */
#define SIGCONTEXT_RBP (40 + 10 * 8)
#define SIGCONTEXT_RSP (40 + 15 * 8)
#define SIGCONTEXT_RIP (40 + 16 * 8)

#if defined(__TARGET_ARCH_arm64)
/* AArch64 (the crate documentation's AArch64 section): bits 6-7 of the
 * kind byte say where the return address and x29 are. */
#define K_A64_LR 0
#define K_A64_RECORD 1
#define K_A64_RA 2
#define K_A64_RA_FP_LOST 3
/* The signal frame at SP in __kernel_rt_sigreturn (rule::A64_SIGCONTEXT_*). */
#define A64_SIGCONTEXT_X29 (128 + 176 + 8 + 29 * 8)
#define A64_SIGCONTEXT_X30 (128 + 176 + 8 + 30 * 8)
#define A64_SIGCONTEXT_SP (128 + 176 + 8 + 31 * 8)
#define A64_SIGCONTEXT_PC (128 + 176 + 8 + 32 * 8)
/* struct user_pt_regs: x0-x30, sp, pc, pstate. */
#define BP_NREGS 34
#define BP_REG_FP 29
#define BP_REG_LR 30
#define BP_REG_SP 31
#define BP_REG_PC 32
#else
/* struct pt_regs, r15 to ss. */
#define BP_NREGS 21
#define BP_REG_FP 4
#define BP_REG_SP 19
#define BP_REG_PC 16
#endif

struct super_block___bp {
	unsigned int s_dev;
} __attribute__((preserve_access_index));

struct inode___bp {
	unsigned long i_ino;
	struct super_block___bp *i_sb;
} __attribute__((preserve_access_index));

struct file___bp {
	struct inode___bp *f_inode;
} __attribute__((preserve_access_index));

struct mm_context___bp {
	void *vdso;
} __attribute__((preserve_access_index));

struct mm_struct___bp {
	struct mm_context___bp context;
} __attribute__((preserve_access_index));

struct task_struct___mm {
	struct mm_struct___bp *mm;
} __attribute__((preserve_access_index));

struct bpf_iter_task_vma {
	__u64 __opaque[1];
} __attribute__((aligned(8)));

extern int bpf_iter_task_vma_new(struct bpf_iter_task_vma *it, struct task_struct *task,
				 __u64 addr) __weak __ksym;
extern struct vm_area_struct *bpf_iter_task_vma_next(struct bpf_iter_task_vma *it) __weak __ksym;
extern void bpf_iter_task_vma_destroy(struct bpf_iter_task_vma *it) __weak __ksym;

/* Frames deeper than this are cut (and counted); at most BP_DEPTH_LIMIT. */
const volatile u32 max_depth = BP_MAX_DEPTH;

/* Every file's table, one slice each (sized and filled by user space,
 * which writes a new slice through a mapping of just its pages). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, 1); /* sized at load time */
	__type(key, u32);
	__type(value, u64);
} unwind_entries SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192); /* sized at load time */
	__type(key, struct bp_file_key);
	__type(value, struct bp_file);
} files SEC(".maps");

/* tgid -> executable mappings; allocated as processes are sampled. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 16384);
	__type(key, u32);
	__type(value, struct bp_proc);
} procmaps SEC(".maps");

/* `stack_map`: every stack, kernel and user, by the 64-bit hash of its frames. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192); /* sized at load time */
	__uint(key_size, sizeof(u64));
	__uint(value_size, sizeof(struct bp_stack_buf)); /* sized at load time */
} stack_map SEC(".maps");

/* The unwinder's registers and the stack being built. */
struct bp_unwind {
	u64 pc, sp, bp;
	u64 h1, h2;
	u32 depth;
	/* bp holds the frame's RBP (not lost on the way up). */
	u32 bp_valid;
	/* pc is where the frame was interrupted, not a return address. */
	u32 exact;
	/* pc came from registers or a table rule, not a frame-pointer guess. */
	u32 trusted;
	u32 tgid;
	/* Frames stepped by table and by frame pointer, counted once per
	 * stack (a shared counter per frame costs more than the step). */
	u32 table_frames;
	u32 fp_frames;
	u32 pad;
	/* Binary search bounds, kept in memory so that the verifier does not
	 * follow every path of a search with concrete bounds. */
	u32 lo, hi;
	/* Python frames (python.bpf.h): the thread, the id its thread state
	 * holds (pthread_self, the fsbase, on x86-64; the native thread id on
	 * arm64), its innermost frame not yet stored, whether it was looked
	 * for, whether the walk is storing an activation's frames, and in
	 * which interpreter. */
	u32 tid;
	u32 py_state;
	u64 py_thread_id;
	u64 py_frame;
	u32 py_emit;
	u32 py_interp;
	u32 py_frames;
	/* The native walk has ended: only Python frames are left. */
	u32 native_done;
	/* arm64: lr holds the frame's return address (x30: only the
	 * interrupted frame, or one a signal frame restored, knows it); sp
	 * is the frame's SP (after a frame-pointer step it is not known). */
	u32 lr_valid;
	u32 sp_valid;
	u64 lr;
	/* The first frame's registers, in struct pt_regs order (arm64:
	 * struct user_pt_regs). */
	u64 regs[BP_NREGS];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct bp_unwind);
} unwind_state SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct bp_stack_buf);
} stack_buf SEC(".maps");

/*
 * An empty process, the source of new `procmaps` entries, which are then
 * filled in place: the hooks that read mappings run preemptibly (syscall
 * tracepoints may fault), so no per-CPU scratch may hold one across a run.
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_RDONLY_PROG);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct bp_proc);
} proc_empty SEC(".maps");

/* The next file id; ids start at 1. */
u32 next_file_id = 0;

static __always_inline void bp_hash(struct bp_unwind *u, u64 frame)
{
	u->h1 = (u->h1 ^ frame) * 0x100000001b3ULL;
	u->h2 = (u->h2 + frame) * 0x9e3779b97f4a7c15ULL;
	u->h2 ^= u->h2 >> 29;
}

/*
 * Stores buf (len frames, hashed into u) in `stack_map`; the stack's key, or
 * 0 when it could not be stored (counted under lost_slot or as a collision).
 */
static __always_inline u64 bp_store(struct bp_stack_buf *buf, struct bp_unwind *u, u32 len,
				    u32 lost_slot)
{
	struct bp_stack_head *old;
	u64 key = u->h1 ^ len;
	u32 check = (u32)(u->h2 >> 32) ^ (u32)u->h2;

	if (!key)
		key = 1;
	buf->head.len = len;
	buf->head.check = check;
	old = bpf_map_lookup_elem(&stack_map, &key);
	if (old) {
		if (old->len != len || old->check != check) {
			bs_count(&lost, BP_LOST_COLLISION);
			return 0;
		}
		return key;
	}
	/* -EEXIST: another CPU stored it first. */
	if (bpf_map_update_elem(&stack_map, &key, buf, BPF_NOEXIST) && !bpf_map_lookup_elem(&stack_map, &key)) {
		bs_count(&lost, lost_slot);
		return 0;
	}
	return key;
}

/* The kernel stack of this sample, stored; 0 when there is none. */
static __always_inline u64 bp_kernel_stack(void *ctx)
{
	u32 zero = 0, kdepth = max_depth < BP_KERNEL_DEPTH ? max_depth : BP_KERNEL_DEPTH;
	struct bp_stack_buf *buf = bpf_map_lookup_elem(&stack_buf, &zero);
	struct bp_unwind *u = bpf_map_lookup_elem(&unwind_state, &zero);
	long n;

	if (!buf || !u)
		return 0;
	n = bpf_get_stack(ctx, buf->frames, kdepth * sizeof(u64), 0);
	if (n <= 0)
		return 0;
	n /= sizeof(u64);
	u->h1 = 0xcbf29ce484222325ULL;
	u->h2 = 1;
	for (int i = 0; i < BP_KERNEL_DEPTH; i++) {
		if (i >= n)
			break;
		bp_hash(u, buf->frames[i]);
	}
	return bp_store(buf, u, n, BP_LOST_KSTACK);
}

/* The file id of a mapping's file, announcing files seen for the first time. */
static __always_inline void bp_see_file(u32 tgid, struct bp_mapping *m)
{
	struct bp_file f = {};
	struct bp_note *n;

	if (bpf_map_lookup_elem(&files, &m->file))
		return;
	f.id = __sync_fetch_and_add(&next_file_id, 1) + 1;
	f.state = BP_FILE_PENDING;
	if (f.id > BP_FRAME_ID_MASK) {
		bs_count(&lost, BP_LOST_FILES);
		return;
	}
	if (bpf_map_update_elem(&files, &m->file, &f, BPF_NOEXIST)) {
		if (!bpf_map_lookup_elem(&files, &m->file))
			bs_count(&lost, BP_LOST_FILES);
		return;
	}
	n = bpf_ringbuf_reserve(&procs, sizeof(*n), 0);
	if (!n) {
		bs_count(&lost, BP_LOST_NOTIFY);
		return;
	}
	n->kind = BP_NOTE_FILE;
	n->tgid = tgid;
	n->file_id = f.id;
	n->pad = 0;
	n->start = m->start;
	n->end = m->end;
	n->pgoff = m->pgoff;
	n->file = m->file;
	bpf_ringbuf_submit(n, 0);
}

struct bp_see_ctx {
	struct bp_proc *p;
	u32 tgid;
};

static int bp_see_step(u64 i, struct bp_see_ctx *c)
{
	struct bp_mapping *m;

	if (i >= c->p->n || i >= BP_MAX_MAPPINGS)
		return 1;
	m = &c->p->m[i & (BP_MAX_MAPPINGS - 1)];
	if (m->file.ino)
		bp_see_file(c->tgid, m);
	return 0;
}

/*
 * Reads a process's executable mappings from its VMAs into `procmaps`, in
 * place: a sampler reading the entry meanwhile sees a prefix of them.
 * The task_vma iterator refuses contexts with interrupts off (the sampler
 * runs in one), so this runs at exec, after an mmap that made executable
 * memory, and when user space asks (bpfscope_build); the sampler only reads
 * the result. NULL when the kernel lacks the iterator (before 6.7) or
 * refused it.
 */
static __noinline struct bp_proc *bp_build_proc(struct task_struct *t, u32 tgid)
{
	struct bpf_iter_task_vma it;
	struct vm_area_struct *vma;
	struct bp_see_ctx c = {};
	struct bp_proc *p;
	u32 zero = 0;
	u64 vdso;

	if (!bpf_ksym_exists(bpf_iter_task_vma_new))
		return NULL;
	vdso = (u64)BPF_CORE_READ((struct task_struct___mm *)t, mm, context.vdso);
	p = bpf_map_lookup_elem(&procmaps, &tgid);
	if (!p) {
		struct bp_proc *empty = bpf_map_lookup_elem(&proc_empty, &zero);

		if (!empty || bpf_map_update_elem(&procmaps, &tgid, empty, BPF_NOEXIST) == -12)
			return NULL;
		p = bpf_map_lookup_elem(&procmaps, &tgid);
		if (!p)
			return NULL;
	}
	if (bpf_iter_task_vma_new(&it, t, 0)) {
		bpf_iter_task_vma_destroy(&it);
		bs_count(&lost, BP_UNW_PROC_BUSY);
		return NULL;
	}
	p->n = 0;
	p->truncated = 0;
	while ((vma = bpf_iter_task_vma_next(&it))) {
		struct vm_area_struct *v = vma;
		struct bp_mapping *m;
		struct file___bp *file;
		/* Counted in the map value, not a register, so the verifier
		 * sees one loop body instead of one per mapping. */
		u32 n = p->n;

		if (!(v->vm_flags & VM_EXEC))
			continue;
		if (n >= BP_MAX_MAPPINGS) {
			p->truncated = 1;
			break;
		}
		m = &p->m[n & (BP_MAX_MAPPINGS - 1)];
		m->start = v->vm_start;
		m->end = v->vm_end;
		m->pgoff = v->vm_pgoff << 12;
		file = v->vm_file;
		m->has_cached = 0;
		if (file) {
			m->file.ino = BPF_CORE_READ(file, f_inode, i_ino);
			m->file.dev = BPF_CORE_READ(file, f_inode, i_sb, s_dev);
		} else if (v->vm_start == vdso) {
			m->file.ino = BP_VDSO_INO;
			m->file.dev = BP_VDSO_DEV;
		} else {
			m->file.ino = 0;
			m->file.dev = 0;
		}
		p->n = n + 1;
	}
	bpf_iter_task_vma_destroy(&it);
	p->built_ns = bpf_ktime_get_ns();
	p->stale = 0;
	/* Files after the lock is gone: announcing takes the ring buffer. */
	c.p = p;
	c.tgid = tgid;
	bpf_loop(BP_MAX_MAPPINGS, bp_see_step, &c, 0);
	bs_count(&lost, BP_UNW_REBUILDS);
	return p;
}

/* The mapping holding pc: the last one starting at or below it. */
static __always_inline struct bp_mapping *bp_find_mapping(struct bp_unwind *u, struct bp_proc *p,
							  u64 pc)
{
	struct bp_mapping *m;
	u32 lo;

	u->lo = 0;
	u->hi = p->n < BP_MAX_MAPPINGS ? p->n : BP_MAX_MAPPINGS;
	for (int i = 0; i < 10; i++) {
		u32 mid;

		if (u->lo >= u->hi)
			break;
		mid = (u->lo + u->hi) / 2;
		/* The compiler knows mid < 256 and would drop the mask; older
		 * verifiers (6.1) cannot see that bound, so keep it. */
		asm volatile("" : "+r"(mid));
		mid &= BP_MAX_MAPPINGS - 1;
		if (p->m[mid].start <= pc)
			u->lo = mid + 1;
		else
			u->hi = mid;
	}
	lo = u->lo;
	if (!lo)
		return NULL;
	lo--;
	asm volatile("" : "+r"(lo));
	m = &p->m[lo & (BP_MAX_MAPPINGS - 1)];
	return pc < m->end ? m : NULL;
}

/* The table entry for a table address: the last entry at or below it. */
static __always_inline u64 bp_rule(struct bp_unwind *u, struct bp_file *f, u64 addr)
{
	u32 start = f->table_start, lo;
	u64 *e;

	if (addr > 0xffffffffULL)
		return 0;
	u->lo = start;
	u->hi = start + f->table_len;
	for (int i = 0; i < 26; i++) {
		u32 mid;

		if (u->lo >= u->hi)
			break;
		mid = u->lo + (u->hi - u->lo) / 2;
		e = bpf_map_lookup_elem(&unwind_entries, &mid);
		if (!e)
			return 0;
		if ((u32)*e <= (u32)addr)
			u->lo = mid + 1;
		else
			u->hi = mid;
	}
	lo = u->lo;
	if (lo == start)
		return 0;
	lo--;
	e = bpf_map_lookup_elem(&unwind_entries, &lo);
	return e ? *e : 0;
}

static __always_inline int bp_read(u64 *dst, u64 addr)
{
	return bpf_probe_read_user(dst, sizeof(*dst), (void *)addr);
}

/* A DWARF register's value in the first frame (struct pt_regs order). */
static __always_inline int bp_dwarf_reg(struct bp_unwind *u, u32 reg, u64 *out)
{
	u32 slot;

#if defined(__TARGET_ARCH_arm64)
	/* x0-x30 are DWARF 0-30, in that order in user_pt_regs. */
	slot = reg;
	asm volatile("" : "+r"(slot));
	if (slot >= 31)
		return -1;
	*out = u->regs[slot];
	return 0;
#endif
	switch (reg) {
	case 0: slot = 10; break; /* rax */
	case 1: slot = 12; break; /* rdx */
	case 2: slot = 11; break; /* rcx */
	case 3: slot = 5; break;  /* rbx */
	case 4: slot = 13; break; /* rsi */
	case 5: slot = 14; break; /* rdi */
	case 8: slot = 9; break;
	case 9: slot = 8; break;
	case 10: slot = 7; break;
	case 11: slot = 6; break;
	case 12: slot = 3; break;
	case 13: slot = 2; break;
	case 14: slot = 1; break;
	case 15: slot = 0; break;
	default: return -1;
	}
	/* Keeps the bound visible to the verifier after the compiler's folding. */
	asm volatile("" : "+r"(slot));
	if (slot >= BP_NREGS)
		return -1;
	*out = u->regs[slot];
	return 0;
}

struct bp_uctx {
	struct bp_unwind *u;
	struct bp_stack_buf *buf;
	struct bp_proc *p;
};

/*
 * A frame the process's mappings do not cover (a library mapped since they
 * were read): ask user space to have them read again, at most once per
 * BP_REBUILD_NS.
 */
static __always_inline void bp_stale(struct bp_proc *p, u32 tgid)
{
	struct bp_note *n;
	u64 now = bpf_ktime_get_ns();

	if (p->stale && now - p->stale < BP_REBUILD_NS)
		return;
	p->stale = now;
	n = bpf_ringbuf_reserve(&procs, sizeof(*n), 0);
	if (!n) {
		bs_count(&lost, BP_LOST_NOTIFY);
		return;
	}
	__builtin_memset(n, 0, sizeof(*n));
	n->kind = BP_NOTE_STALE;
	n->tgid = tgid;
	bpf_ringbuf_submit(n, 0);
}

#if defined(__TARGET_ARCH_arm64)
/*
 * The start of the function the call before return address `ra` entered:
 * the target of the BL there, 0 for anything else (BLR, no call).
 */
static __always_inline u64 bp_a64_callee(u64 ra)
{
	u32 insn = 0;
	s64 imm;

	if (ra < 4 || bpf_probe_read_user(&insn, sizeof(insn), (void *)(ra - 4)) ||
	    (insn & 0xfc000000) != 0x94000000)
		return 0;
	imm = (s64)((u64)(insn & 0x3ffffff) << 38) >> 36;
	return ra - 4 + imm;
}

/*
 * Frame pointers alone at the interrupted frame: a leaf that pushed no
 * frame record returns through x30, and the record at x29 is its caller's,
 * so the caller would be skipped. x30 is taken as the caller when the call
 * before it entered the function pc is in (a BL to a start at most 64 KiB
 * below pc) more closely than the call before the record's return address
 * did; when that one is closer, the record is pc's function's own and x30
 * a stale return from a call it made.
 */
static __always_inline int bp_a64_leaf_caller(struct bp_unwind *u, u64 record_ra)
{
	u64 t_lr, t_rec;

	if (!u->lr_valid || !u->lr || u->lr == record_ra)
		return 0;
	t_lr = bp_a64_callee(u->lr);
	if (!t_lr || t_lr > u->pc || u->pc - t_lr >= 65536)
		return 0;
	t_rec = bp_a64_callee(record_ra);
	return !(t_rec && t_rec <= u->pc && t_rec >= t_lr);
}
#endif

/* One step up by frame pointers; 1 when the walk ends. */
static __always_inline int bp_fp_step(struct bp_unwind *u)
{
	u64 next_bp, ra;

	if (!u->bp_valid || u->bp < u->sp || (u->bp & 7)) {
		bs_count(&lost, BP_UNW_END_FP);
		return 1;
	}
	u64 pair[2];

	/* One read for the saved RBP and the return address above it. */
	if (bpf_probe_read_user(pair, sizeof(pair), (void *)u->bp) || !pair[1]) {
		bs_count(&lost, BP_UNW_END_FP);
		return 1;
	}
	next_bp = pair[0];
	ra = pair[1] & BP_ADDR_MASK;
	/* Not a user address (user space ends below 2^57 with 5-level page
	 * tables): the chain ran into code without frame pointers and read
	 * something else. Kept, its high bits would read as a frame's flags. */
	if (ra >> 57) {
		bs_count(&lost, BP_UNW_END_FP);
		return 1;
	}
	u->fp_frames++;
#if defined(__TARGET_ARCH_arm64)
	if (bp_a64_leaf_caller(u, ra)) {
		/* x29 and SP stay: the record is the next frame's. */
		u->pc = u->lr;
		u->lr_valid = 0;
		u->exact = 0;
		u->trusted = 0;
		return 0;
	}
#endif
	u->sp = u->bp + 16;
#if defined(__TARGET_ARCH_arm64)
	/* The frame record sits anywhere in the caller's frame, not at its
	 * top: its SP is not known, only frame pointers go on from here. */
	u->sp_valid = 0;
	u->lr_valid = 0;
#endif
	u->bp = next_bp;
	u->pc = ra;
	u->exact = 0;
	u->trusted = 0;
	return 0;
}

#if defined(__TARGET_ARCH_arm64)
/* One step up by a table rule (entry e), AArch64's word; 1 when the walk ends. */
static __always_inline int bp_table_step(struct bp_unwind *u, u64 e)
{
	u32 w = e >> 32;
	u32 arg = w & 0xffff;
	u32 kb = (w >> 16) & 0xff;
	u32 aux = w >> 24;
	u64 cfa, base, ra, at, v;

	switch (kb & 0xf) {
	case K_RSP:
	case K_RSP_X8:
		/* Above a frame-pointer step the SP is not known. */
		if (!u->sp_valid)
			return bp_fp_step(u);
		base = u->sp;
		cfa = base + ((kb & 0xf) == K_RSP ? (u64)arg : (u64)arg * 8);
		break;
	case K_RBP:
		if (!u->bp_valid)
			goto no_rule;
		base = u->bp;
		cfa = base + arg;
		break;
	case K_REGISTER:
		/* Only the interrupted frame's registers are known. */
		if (u->depth != 1 || bp_dwarf_reg(u, aux, &v))
			goto no_rule;
		base = v;
		cfa = v + arg;
		break;
	case K_SIGCONTEXT:
		/* The handler returned here: the interrupted registers are in
		 * the signal frame at SP. */
		if (!u->sp_valid)
			goto no_rule;
		v = u->sp;
		if (bp_read(&u->pc, v + A64_SIGCONTEXT_PC) ||
		    bp_read(&u->bp, v + A64_SIGCONTEXT_X29) ||
		    bp_read(&u->lr, v + A64_SIGCONTEXT_X30) ||
		    bp_read(&u->sp, v + A64_SIGCONTEXT_SP))
			goto read_failed;
		u->bp_valid = 1;
		u->lr_valid = 1;
		u->sp_valid = 1;
		u->exact = 1;
		u->trusted = 1;
		u->table_frames++;
		return 0;
	default:
		goto no_rule;
	}
	if (kb & K_RA_UNDEFINED) {
		bs_count(&lost, BP_UNW_END_OUTERMOST);
		return 1;
	}
	/* The caller's stack is above the callee's (a leaf's CFA is its SP). */
	if (u->sp_valid && cfa < u->sp)
		goto read_failed;
	/* aux 0: the save is where the CFA's register points. */
	at = aux ? cfa + (s64)(__s8)aux * 8 : base;
	switch (kb >> K_RBP_SHIFT) {
	case K_A64_LR:
		/* Only the interrupted frame (or a signal frame's) has x30. */
		if (!u->lr_valid)
			goto no_rule;
		ra = u->lr;
		break;
	case K_A64_RECORD: {
		/* The frame record: x29, then the return address. One read. */
		u64 pair[2];

		if (bpf_probe_read_user(pair, sizeof(pair), (void *)at))
			goto read_failed;
		u->bp = pair[0];
		u->bp_valid = 1;
		ra = pair[1];
		break;
	}
	case K_A64_RA:
		if (bp_read(&ra, at))
			goto read_failed;
		break;
	default:
		if (bp_read(&ra, at))
			goto read_failed;
		u->bp_valid = 0;
		break;
	}
	u->table_frames++;
	u->sp = cfa;
	u->sp_valid = 1;
	u->lr_valid = 0;
	u->pc = ra & BP_ADDR_MASK;
	u->exact = 0;
	u->trusted = 1;
	return 0;
no_rule:
	bs_count(&lost, BP_UNW_END_NO_RULE);
	return 1;
read_failed:
	bs_count(&lost, BP_UNW_END_READ);
	return 1;
}
#else
/* One step up by a table rule (entry e); 1 when the walk ends. */
static __always_inline int bp_table_step(struct bp_unwind *u, u64 e)
{
	u32 w = e >> 32;
	u32 arg = w & 0xffff;
	u32 kb = (w >> 16) & 0xff;
	s64 aux = (__s8)(w >> 24);
	u64 cfa, ra, v;

	switch (kb & 0xf) {
	case K_RSP:
		cfa = u->sp + arg;
		break;
	case K_RSP_X8:
		cfa = u->sp + (u64)arg * 8;
		break;
	case K_RBP:
		if (!u->bp_valid)
			goto no_rule;
		cfa = u->bp + arg;
		break;
	case K_REGISTER:
		/* Only the interrupted frame's registers are known. */
		if (u->depth != 1 || bp_dwarf_reg(u, (w >> 24) & 0xff, &v))
			goto no_rule;
		cfa = v + arg;
		break;
	case K_PLT:
		cfa = u->sp + arg + (((u->pc & 15) >= ((w >> 24) & 0xff)) ? 8 : 0);
		break;
	case K_DEREF_RSP:
	case K_DEREF_RBP:
		v = (kb & 0xf) == K_DEREF_RSP ? u->sp : u->bp;
		if ((kb & 0xf) == K_DEREF_RBP && !u->bp_valid)
			goto no_rule;
		if (bp_read(&cfa, v + (s64)(__s8)(arg & 0xff) * 8))
			goto read_failed;
		cfa += (u64)(arg >> 8) * 8;
		break;
	case K_SIGCONTEXT:
		/* The handler returned here: the interrupted registers are in
		 * the ucontext at RSP. */
		if (bp_read(&u->pc, u->sp + SIGCONTEXT_RIP) ||
		    bp_read(&u->bp, u->sp + SIGCONTEXT_RBP) ||
		    bp_read(&u->sp, u->sp + SIGCONTEXT_RSP))
			goto read_failed;
		u->bp_valid = 1;
		u->exact = 1;
		u->trusted = 1;
		u->table_frames++;
		return 0;
	default:
		goto no_rule;
	}
	if (kb & K_RA_UNDEFINED) {
		bs_count(&lost, BP_UNW_END_OUTERMOST);
		return 1;
	}
	/* The caller's stack is above the callee's. */
	if (cfa <= u->sp)
		goto read_failed;
	if ((kb >> K_RBP_SHIFT) == K_RBP_AT_CFA && aux == -2) {
		/* `push rbp` right below the return address, the common case:
		 * one read for both. */
		u64 pair[2];

		if (bpf_probe_read_user(pair, sizeof(pair), (void *)(cfa - 16)))
			goto read_failed;
		u->bp = pair[0];
		u->bp_valid = 1;
		ra = pair[1];
	} else if (bp_read(&ra, cfa - 8)) {
		goto read_failed;
	}
	switch (kb >> K_RBP_SHIFT) {
	case K_RBP_AT_CFA:
		if (aux == -2)
			break;
		if (bp_read(&u->bp, cfa + aux * 8))
			goto read_failed;
		u->bp_valid = 1;
		break;
	case K_RBP_AT_RBP:
		if (!u->bp_valid || bp_read(&u->bp, u->bp + aux * 8))
			goto read_failed;
		break;
	case K_RBP_LOST:
		u->bp_valid = 0;
		break;
	}
	u->table_frames++;
	u->sp = cfa;
	u->pc = ra;
	u->exact = 0;
	u->trusted = 1;
	return 0;
no_rule:
	bs_count(&lost, BP_UNW_END_NO_RULE);
	return 1;
read_failed:
	bs_count(&lost, BP_UNW_END_READ);
	return 1;
}

#endif

static __always_inline void bp_record(struct bp_unwind *u, struct bp_stack_buf *buf, u32 d,
				      u64 frame)
{
	/* The callers have checked d; the compiler would drop the mask for
	 * it, and older verifiers (6.1) lose that check across a spill. */
	asm volatile("" : "+r"(d));
	buf->frames[d & (BP_DEPTH_LIMIT - 1)] = frame;
	bp_hash(u, frame);
}

#include "python.bpf.h"

/*
 * Whether the frame at file offset fo of mapping m (file f) is an eval
 * loop whose Python frames are stored in its place.
 */
static __always_inline int bp_interp_frame(struct bp_unwind *u, struct bp_mapping *m,
					   struct bp_file *f, u64 fo)
{
	u32 idx = f->interp & (BP_MAX_INTERPS - 1);
	struct bp_interp *in;

	if (!idx)
		return 0;
	in = bpf_map_lookup_elem(&interps, &idx);
	if (!in || in->kind != BP_INTERP_PYTHON)
		return 0;
	if (!((fo >= in->eval_start[0] && fo < in->eval_end[0]) ||
	      (fo >= in->eval_start[1] && fo < in->eval_end[1])))
		return 0;
	return bp_py_enter(u, idx, in, m->start - m->pgoff + in->runtime_rel, 1);
}

/*
 * The native walk ended before it met an eval loop (a frame it could not
 * step through): a Python thread's frames are still read, through the
 * first interpreter among the process's mappings, and stored after the
 * native ones, so the sample keeps its Python stack.
 *
 * A global function: the verifier checks its loop over 256 mappings once,
 * not in each of the three places a native step ends, nor once per state
 * there (the three copies took 68,000 of 104,000 verified instructions;
 * with bp_py_tstate global too the profiler's load went from 146,189 to
 * 42,335 and 462 ms to 67). It takes only the tgid and looks up the
 * process and the walk's state again: one hash and one array lookup at a
 * walk's end, against the 2-3 us of the walk.
 */
__noinline int bp_py_late(u32 tgid)
{
	u32 zero = 0;
	struct bp_unwind *u = bpf_map_lookup_elem(&unwind_state, &zero);
	struct bp_proc *p = bpf_map_lookup_elem(&procmaps, &tgid);

	if (!u || !p || u->py_state != BP_PY_UNKNOWN)
		return 0;
	for (int i = 0; i < BP_MAX_MAPPINGS; i++) {
		struct bp_mapping *m;
		struct bp_interp *in;
		u32 idx;

		if (i >= p->n)
			return 0;
		m = &p->m[i & (BP_MAX_MAPPINGS - 1)];
		if (!m->has_cached || !m->cached.interp)
			continue;
		idx = m->cached.interp & (BP_MAX_INTERPS - 1);
		in = bpf_map_lookup_elem(&interps, &idx);
		if (in && in->kind == BP_INTERP_PYTHON)
			bp_py_enter(u, idx, in, m->start - m->pgoff + in->runtime_rel, 0);
		return 0;
	}
	return 0;
}

/* After the native walk (bp_native_end set native_done and counted it):
 * the Python frames no eval frame took (1: none left). */
static __always_inline int bp_py_tail(struct bp_unwind *u, struct bp_stack_buf *buf)
{
	if (!u->py_frame || u->py_state != BP_PY_READY)
		return 1;
	bp_py_frame(u, buf);
	return 0;
}

/* A native step's end: Python frames left over are stored after it. */
static __always_inline int bp_native_end(struct bp_unwind *u, struct bp_proc *p, int ended)
{
	if (ended && p)
		bp_py_late(u->tgid);
	if (ended && u->py_frame && u->py_state == BP_PY_READY) {
		u->native_done = 1;
		bs_count(&lost, BP_PY_UNPLACED);
		return 0;
	}
	return ended;
}

/* One frame: record pc, then step to the caller. */
static int bp_unwind_step(u64 i, struct bp_uctx *c)
{
	struct bp_unwind *u = c->u;
	struct bp_stack_buf *buf = c->buf;
	struct bp_mapping *m = NULL;
	struct bp_file *f = NULL;
	u64 pc = u->pc, frame = pc, fo = 0, e;
	u32 d = u->depth;
	int interp = 0;

	if (u->native_done)
		return bp_py_tail(u, buf);
	/* Storing the Python frames of the eval activation just stepped over. */
	if (u->py_emit) {
		bp_py_frame(u, buf);
		return 0;
	}
	if (!pc)
		return bp_native_end(u, c->p, 1);
	if (d >= max_depth || d >= BP_DEPTH_LIMIT) {
		bs_count(&lost, BP_UNW_END_DEPTH);
		return 1;
	}
	if (c->p) {
		m = bp_find_mapping(u, c->p, pc);
		if (!m && u->trusted)
			bp_stale(c->p, u->tgid);
	}
	if (m && m->file.ino) {
		fo = pc - m->start + m->pgoff;
		if (m->has_cached) {
			f = &m->cached;
		} else {
			f = bpf_map_lookup_elem(&files, &m->file);
			if (f && f->state != BP_FILE_PENDING) {
				m->cached = *f;
				m->has_cached = 1;
			}
		}
		if (f)
			frame = BP_FRAME_FILE | ((u64)(f->id & BP_FRAME_ID_MASK) << BP_FRAME_ID_SHIFT) |
				(fo & BP_FRAME_OFFSET_MASK);
	} else if (m) {
		/* Executable memory without a file: JIT code. */
		frame |= 1ULL << BP_FRAME_ANON_BIT;
	}
	/* The leaf's pc was interrupted too, but every reader knows that. */
	if (f && u->exact && d)
		frame |= BP_FRAME_EXACT;
	u->depth = d + 1;
	/* An eval loop running Python frames: they take its place, stored
	 * after the step to its caller. */
	if (f && f->interp && bp_interp_frame(u, m, f, fo - (u->exact ? 0 : 1))) {
		interp = 1;
		u->depth = d;
	}
	if (f && f->state == BP_FILE_TABLE) {
		/* A return address is one past its call, which may be the
		 * function's last instruction: look up the call. */
		e = bp_rule(u, f, fo + f->bias - (u->exact ? 0 : 1));
		if (((e >> 48) & 0xf) != K_GAP) {
			/* The signal trampoline: returned to, yet its own
			 * first instruction, not a call, is what names it. */
			if (((e >> 48) & K_SIGNAL_FRAME) && d)
				frame |= BP_FRAME_EXACT;
			if (interp)
				u->py_emit = 1;
			else
				bp_record(u, buf, d, frame);
			return bp_native_end(u, c->p, bp_table_step(u, e));
		}
		/* No FDE covers it (hand-written code): try the frame pointer. */
	}
	if (interp)
		u->py_emit = 1;
	else
		bp_record(u, buf, d, frame);
	return bp_native_end(u, c->p, bp_fp_step(u));
}

/* The current task's user stack, unwound and stored; 0 when there is none. */
static __always_inline u64 bp_user_stack(struct task_struct *t, u32 tgid)
{
	u32 zero = 0;
	struct bp_unwind *u = bpf_map_lookup_elem(&unwind_state, &zero);
	struct bp_stack_buf *buf = bpf_map_lookup_elem(&stack_buf, &zero);
	struct bp_uctx c = {};
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(t);
	struct bp_proc *p;

	if (!u || !buf || !regs)
		return 0;
	if (bpf_probe_read_kernel(u->regs, sizeof(u->regs), regs))
		return 0;
	u->pc = u->regs[BP_REG_PC];
	u->sp = u->regs[BP_REG_SP];
	u->bp = u->regs[BP_REG_FP];
	u->bp_valid = 1;
	u->sp_valid = 1;
#if defined(__TARGET_ARCH_arm64)
	u->lr = u->regs[BP_REG_LR] & BP_ADDR_MASK;
	u->lr_valid = 1;
#else
	u->lr = 0;
	u->lr_valid = 0;
#endif
	u->exact = 1;
	u->trusted = 1;
	u->depth = 0;
	u->table_frames = 0;
	u->fp_frames = 0;
	u->tgid = tgid;
	u->tid = t->pid;
	u->py_state = BP_PY_UNKNOWN;
	u->py_frame = 0;
	u->py_emit = 0;
	u->py_interp = 0;
	u->py_frames = 0;
	u->native_done = 0;
#if defined(__TARGET_ARCH_arm64)
	u->py_thread_id = t->pid;
#else
	u->py_thread_id = BPF_CORE_READ((struct task_struct___fs *)t, thread.fsbase);
#endif
	u->h1 = 0x84222325cbf29ce4ULL;
	u->h2 = 2;
	p = bpf_map_lookup_elem(&procmaps, &tgid);
	if (!p)
		bs_count(&lost, BP_UNW_NO_PROC);
	c.u = u;
	c.buf = buf;
	c.p = p;
	bpf_loop(BP_DEPTH_LIMIT, bp_unwind_step, &c, 0);
	bs_add(&lost, BP_UNW_TABLE_FRAMES, u->table_frames);
	bs_add(&lost, BP_UNW_FP_FRAMES, u->fp_frames);
	bs_add(&lost, BP_PY_FRAMES, u->py_frames);
	if (!u->depth)
		return 0;
	return bp_store(buf, u, u->depth, BP_LOST_USTACK);
}

#endif /* BPFSCOPE_UNWIND_BPF_H */
