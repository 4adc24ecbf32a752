/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Reading a struct bs_src: builtins (pid, comm, cpu, stack ids...), record
 * fields at format-file offsets, argument slots, and values or strings
 * reached through pointer walks, with the kernel/user fallbacks that
 * arguments without __user tags need. Filters, keys and events all read
 * through these, and the two big readers (bs_read_num, bs_read_str) are not
 * inlined, so each program holds one copy of them whatever reads it.
 */
#ifndef BPFSCOPE_READ_BPF_H
#define BPFSCOPE_READ_BPF_H

#include "state.bpf.h"

/*
 * A task's comm, the 16 bytes the record's memcpy copies, as two word
 * loads through the BTF-typed pointer: a byte-wise copy is 32
 * instructions (see bs_zero_words), and bpf_get_current_comm() costs
 * several times more (strscpy plus padding) on the hottest path.
 */
static __always_inline void bs_copy_comm(const struct task_struct *t, void *dst)
{
	((u64 *)dst)[0] = *(u64 *)&t->comm[0];
	((u64 *)dst)[1] = *(u64 *)&t->comm[8];
}

/* The current task's comm. */
static __always_inline void bs_comm(char *dst)
{
	bs_copy_comm(bpf_get_current_task_btf(), dst);
}

#if defined(__TARGET_ARCH_arm64)
/* An address, and what bpf_find_vma found of its mapping. */
struct bs_vma_at {
	u64 addr;
	u64 file;
	u64 off;
};

static long bs_vma_at_cb(struct task_struct *task, struct vm_area_struct *vma, void *data)
{
	struct bs_vma_at *a = data;

	a->file = (u64)vma->vm_file;
	/* File offsets as the build-id stack map computes them (4 KiB pages). */
	a->off = a->addr - vma->vm_start + (vma->vm_pgoff << 12);
	return 0;
}

/*
 * At a uprobe on a function's first instruction: where the caller (the
 * link register) is in the file, relative to the probed instruction, or 0
 * when the two are not in one file (no frame to add then).
 */
static __always_inline s64 bs_entry_caller(void *ctx)
{
	struct task_struct *t = bpf_get_current_task_btf();
	struct bs_vma_at pc = {}, lr = {};
	u64 regs[3] = {}; /* x30, sp, pc: adjacent in user_pt_regs */
	s64 d;

	/* Read, not loaded: the same code serves tracepoint programs, whose
	 * context is no pt_regs (the verifier refuses the direct load there). */
	if (bpf_probe_read_kernel(regs, sizeof(regs),
				  ctx + __builtin_offsetof(struct user_pt_regs, regs[30])))
		return 0;
	pc.addr = regs[2];
	/* The link register is not signed yet at a function's entry; masked
	 * anyway, as the unwinder does. */
	lr.addr = regs[0] & BP_ADDR_MASK;
	if (bpf_find_vma(t, pc.addr, bs_vma_at_cb, &pc, 0) ||
	    bpf_find_vma(t, lr.addr, bs_vma_at_cb, &lr, 0) || !pc.file || pc.file != lr.file)
		return 0;
	d = (s64)(lr.off - pc.off);
	return d >= -(1LL << 30) && d < (1LL << 30) ? d : 0;
}
#endif

static __always_inline u64 bs_extend(u64 raw, u8 size, u8 is_signed)
{
	switch (size) {
	case 1:
		return is_signed ? (u64)(s64)(__s8)raw : (u64)(u8)raw;
	case 2:
		return is_signed ? (u64)(s64)(__s16)raw : (u64)(u16)raw;
	case 4:
		return is_signed ? (u64)(s64)(__s32)raw : (u64)(u32)raw;
	default:
		return raw;
	}
}

/*
 * Address of a walked value: follows the pointers stored at each path
 * offset from base, then adds the leaf offset. A failed read yields 0, and
 * every later read from near 0 fails too, so a broken chain reads as 0, or
 * as a string that faulted.
 */
static __always_inline u64 bs_walk(const struct bs_src *src, u64 base)
{
	for (int i = 0; i < BS_MAX_DEREF; i++) {
		u64 next = 0;

		if (i >= src->nderef)
			break;
		bpf_probe_read_kernel(&next, sizeof(next), (void *)(base + src->path[i]));
		base = next;
	}
	return base + src->leaf_off;
}

/*
 * A sched record field from the task its tracepoint argument points to
 * (struct bs_src.task): plain loads through the pointer, typed by the
 * kernel's BTF where the kernel can type it (6.2+), in place of a helper
 * read each. Elsewhere the source's walk reads the same bytes.
 */
static __always_inline int bs_task_typed(const struct bs_src *src)
{
	return src->task && bpf_ksym_exists(bpf_rdonly_cast);
}

/* pid_t and int, sign-extended as the record's fields are read. */
static __always_inline u64 bs_task_num(const struct bs_src *src, u64 p)
{
	struct task_struct *t = bpf_core_cast((void *)p, struct task_struct);

	if (src->task == BS_TASK_PRIO)
		return (u64)(s64)t->prio;
	return (u64)(s64)t->pid;
}

/*
 * An argument read without a walk through memory: a sched field's task
 * member loaded through the typed pointer, or the slot itself. Returns 0
 * when the source needs bs_walk.
 */
static __always_inline int bs_arg_direct(const struct bs_src *src, struct bs_scratch *s, u64 *v)
{
	u64 raw = s->args[src->off & (BS_NARGS - 1)];

	if (bs_task_typed(src)) {
		*v = bs_task_num(src, raw);
		return 1;
	}
	if (src->walk)
		return 0;
	*v = bs_extend(raw, src->size, src->is_signed);
	return 1;
}

/*
 * Not inlined, like bs_read_str: every operand, key part and event field
 * goes through one copy of the code, which keeps the programs small and the
 * filter step (verified once per load) cheap to verify.
 */
static __noinline u64 bs_read_num(void *ctx, const struct bs_src *src,
				  struct bs_scratch *s, u32 idx)
{
	u64 raw = 0;

	switch (src->kind) {
	case BS_SRC_PROBE:
		return idx;
	case BS_SRC_PID:
		return bpf_get_current_task_btf()->tgid;
	case BS_SRC_TID:
		return bpf_get_current_task_btf()->pid;
	case BS_SRC_CPU:
		return bpf_get_smp_processor_id();
	case BS_SRC_UID:
		return (u32)bpf_get_current_uid_gid();
	case BS_SRC_CGROUP:
		return bpf_get_current_cgroup_id();
	case BS_SRC_NSECS:
		return bpf_ktime_get_ns();
	case BS_SRC_ELAPSED:
		return bpf_ktime_get_ns() - vm_t0;
	case BS_SRC_GID:
		return bpf_get_current_uid_gid() >> 32;
	case BS_SRC_CURTASK:
		return (u64)bpf_get_current_task();
	case BS_SRC_RAND:
		return bpf_get_prandom_u32();
	case BS_SRC_JIFFIES:
		return bpf_jiffies64();
	case BS_SRC_KSTACK:
	case BS_SRC_USTACK: {
		long id = -1;

		/* One build-id lookup per program run succeeds: a key has at most one user stack. */
		if (use_stacks) {
			if (src->kind == BS_SRC_KSTACK)
				id = bpf_get_stackid(ctx, &kstacks, 0);
			else
				id = bpf_get_stackid(ctx, &ustacks, BPF_F_USER_STACK);
		}
		if (id < 0)
			bs_count(&lost, BS_LOST_STACKS);
#if defined(__TARGET_ARCH_arm64)
		if (id >= 0 && src->kind == BS_SRC_USTACK && src->off == BS_USTACK_ENTRY)
			return (u64)id | (((u64)bs_entry_caller(ctx) & 0x7fffffff) << 32);
#endif
		return (u64)id;
	}
	case BS_SRC_CTX: {
		u32 n = src->size;

		if (n > sizeof(raw))
			n = sizeof(raw);
		bpf_probe_read_kernel(&raw, n, ctx + src->off);
		return bs_extend(raw, src->size, src->is_signed);
	}
	case BS_SRC_ARG: {
		u64 addr;
		u32 n = src->size;

		if (bs_arg_direct(src, s, &raw))
			return raw;
		addr = bs_walk(src, s->args[src->off & (BS_NARGS - 1)]);
		if (n > sizeof(raw))
			n = sizeof(raw);
		bpf_probe_read_kernel(&raw, n, (void *)addr);
		return bs_extend(raw, src->size, src->is_signed);
	}
	default:
		return 0;
	}
}

/*
 * bs_read_num, with an argument (a syscall's, or a sched field's task
 * member) loaded in place: the call and the reader's switch cost more
 * than the load (sched_switch keyed by next_pid,next_prio: 23 ns of a
 * 176 ns run).
 */
static __always_inline u64 bs_num(void *ctx, const struct bs_src *src, struct bs_scratch *s,
				  u32 idx)
{
	u64 v;

	if (src->kind == BS_SRC_ARG && bs_arg_direct(src, s, &v))
		return v;
	return bs_read_num(ctx, src, s, idx);
}

/*
 * A string through a pointer. Without __user tags in the kernel's BTF a
 * `char *` argument may point into user memory: a failed kernel read is
 * retried as a user read. Returns 1 when the memory could not be read
 * (e.g. a user page not yet faulted in at syscall entry).
 */
static __always_inline int bs_read_ptr_str(const struct bs_src *src, u64 ptr, char *dst)
{
	if (src->type == BS_T_STR_UPTR)
		return bpf_probe_read_user_str(dst, BS_STR_MAX, (void *)ptr) < 0;
	if (bpf_probe_read_kernel_str(dst, BS_STR_MAX, (void *)ptr) >= 0)
		return 0;
	return bpf_probe_read_user_str(dst, BS_STR_MAX, (void *)ptr) < 0;
}

/* A pointer or length argument: an argument slot, or a record field at `off`. */
static __always_inline u64 bs_read_word(void *ctx, const struct bs_src *src,
					struct bs_scratch *s, u16 off)
{
	u64 v = 0;

	if (src->kind == BS_SRC_CTX)
		bpf_probe_read_kernel(&v, sizeof(v), ctx + off);
	else if (src->kind == BS_SRC_ARG)
		v = s->args[off & (BS_NARGS - 1)];
	return v;
}

/*
 * A user buffer with its length (BS_T_BUF_UPTR) into dst: the length as
 * given (u64), then min(length, BS_BUF_MAX) bytes. Returns 1 on a fault.
 */
static __always_inline int bs_read_buf(void *ctx, const struct bs_src *src,
				       struct bs_scratch *s, u8 *dst)
{
	u64 ptr = bs_read_word(ctx, src, s, src->off);
	u64 len = bs_read_word(ctx, src, s, src->path[0]);
	u64 n = len;

	if (n > BS_BUF_MAX)
		n = BS_BUF_MAX;
	*(u64 *)dst = len;
	bs_zero_words(dst + 8, BS_BUF_MAX);
	if (!ptr || !n)
		return 0;
	if (bpf_probe_read_user(dst + 8, n, (void *)ptr) < 0) {
		bs_zero_words(dst + 8, BS_BUF_MAX);
		return 1;
	}
	return 0;
}

/*
 * A sched comm through its task, where the kernel can type the pointer:
 * dst zeroed to BS_STR_MAX bytes and the comm copied. Returns 0 for any
 * other source.
 */
static __always_inline int bs_task_comm(const struct bs_src *src, struct bs_scratch *s, void *dst)
{
	if (src->kind != BS_SRC_ARG || src->task != BS_TASK_COMM || !bs_task_typed(src))
		return 0;
	bs_zero_words(dst, BS_STR_MAX);
	bs_copy_comm(bpf_core_cast((void *)s->args[src->off & (BS_NARGS - 1)], struct task_struct),
		     dst);
	return 1;
}

/*
 * Reads a string source into dst (at least BS_STR_MAX bytes), zero-padded.
 * Returns 1 when a pointer could not be followed (the string reads as "").
 * A null pointer is not a fault.
 */
static __noinline int bs_read_str(void *ctx, const struct bs_src *src,
				  struct bs_scratch *s, char *dst)
{
	u64 ptr = 0;
	u32 n;

	if (src->kind == BS_SRC_COMM) {
		bs_comm(dst);
		return 0;
	}
	if (bs_task_comm(src, s, dst))
		return 0;
	bs_zero_words(dst, BS_STR_MAX);
	if (src->walk && src->kind == BS_SRC_ARG) {
		u64 addr = bs_walk(src, s->args[src->off & (BS_NARGS - 1)]);

		if (src->type == BS_T_STR_INLINE) {
			/* A char array inside a kernel struct (e.g. net_device.name). */
			n = src->size;
			if (n > BS_STR_MAX - 1)
				n = BS_STR_MAX - 1;
			return bpf_probe_read_kernel(dst, n, (void *)addr) < 0;
		}
		if (bpf_probe_read_kernel(&ptr, sizeof(ptr), (void *)addr) < 0)
			return 1;
		if (!ptr)
			return 0;
		return bs_read_ptr_str(src, ptr, dst);
	}
	switch (src->type) {
	case BS_T_STR_INLINE:
		if (src->kind != BS_SRC_CTX)
			return 0;
		n = src->size;
		if (n > BS_STR_MAX - 1)
			n = BS_STR_MAX - 1;
		bpf_probe_read_kernel(dst, n, ctx + src->off);
		return 0;
	case BS_T_STR_DATALOC: {
		u32 loc = 0;

		if (src->kind != BS_SRC_CTX)
			return 0;
		bpf_probe_read_kernel(&loc, sizeof(loc), ctx + src->off);
		return bpf_probe_read_kernel_str(dst, BS_STR_MAX, ctx + (loc & 0xffff)) < 0;
	}
	case BS_T_STR_UPTR:
	case BS_T_STR_KPTR:
		ptr = bs_read_word(ctx, src, s, src->off);
		if (!ptr)
			return 0;
		return bs_read_ptr_str(src, ptr, dst);
	default:
		return 0;
	}
}

/* Writes one key or event part at dst; returns 1 when its memory could not be read. */
static __always_inline int bs_put(void *ctx, const struct bs_src *src,
				  struct bs_scratch *s, u32 idx, u8 *dst)
{
	if (src->type == BS_T_BUF_UPTR)
		return bs_read_buf(ctx, src, s, dst);
	/* As bs_read_str writes it, without its call. */
	if (bs_task_comm(src, s, dst))
		return 0;
	if (src->kind == BS_SRC_COMM || src->type != BS_T_NUM)
		return bs_read_str(ctx, src, s, (char *)dst);
	*(u64 *)dst = bs_num(ctx, src, s, idx);
	return 0;
}

#endif /* BPFSCOPE_READ_BPF_H */
