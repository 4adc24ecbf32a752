// SPDX-License-Identifier: GPL-2.0
/*
 * bpfscope's generic tracing programs. Each attach type has one program;
 * every probe is an attachment of that program whose bpf_cookie (minus one)
 * indexes its struct bs_probe_cfg in the `probes` map. Syscall probes share
 * one raw_tp attachment on sys_enter/sys_exit and find their configuration
 * through the syscall number instead. Filtering, keys and aggregation all
 * happen here, so only results (or selected events) reach user space.
 */
#include "common.h"
#include "trace.h"
#include <bpf/usdt.bpf.h>

char LICENSE[] SEC("license") = "GPL";

const volatile u32 target_mode = BS_TARGET_ALL;
/* bpfscope's own tgid: never trace ourselves (printing events would feed back). */
const volatile u32 self_tgid = 0;
/* Force a ring buffer wakeup once this much data is waiting. */
const volatile u64 wakeup_bytes = 65536;
/*
 * The largest filter, key and event part counts among the loaded probes.
 * Frozen before verification, so the verifier walks only the loop
 * iterations this session can use and load time stays short.
 */
const volatile u32 max_filter_ops = BS_MAX_FILTER_OPS;
const volatile u32 max_key_parts = BS_MAX_KEY_PARTS;
const volatile u32 max_emit = BS_MAX_EMIT;
/* Stack keys are in use: only then do the programs call bpf_get_stackid. */
const volatile u32 use_stacks = 0;
/* Bytes of a latency start record: timestamp + key data. */
const volatile u32 start_size = 8;

/* Advanced by user space at each --interval; part of every aggregation key. */
u32 epoch = 0;

/*
 * Keeps the ABI types in BTF so the skeleton generates them for user space
 * (enum constants and structs that no map or global names directly).
 */
struct bs_abi {
	enum bs_limits limits;
	enum bs_src_kind src_kind;
	enum bs_val_type val_type;
	enum bs_op op;
	enum bs_agg agg;
	enum bs_cfg_flags cfg_flags;
	enum bs_lost lost;
	enum bs_target_mode target_mode;
	struct bs_key_hdr key_hdr;
	struct bs_agg_val agg_val;
	struct bs_event_hdr event_hdr;
	struct bs_str str;
	struct bs_match_key match_key;
};
const volatile struct bs_abi bs_abi_types = {};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1); /* resized to the number of probes */
	__type(key, u32);
	__type(value, struct bs_probe_cfg);
} probes SEC(".maps");

/* Syscall number -> probe index + 1 (0: not traced); exits at BS_SYS_EXIT_BASE + nr. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2 * BS_SYS_MAX);
	__type(key, u32);
	__type(value, u32);
} sys_probes SEC(".maps");

/* String constants of filters. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1); /* resized */
	__type(key, u32);
	__type(value, struct bs_str);
} strs SEC(".maps");

/*
 * Aggregates: struct bs_key_hdr + key data -> struct bs_agg_val per CPU.
 * The key size is set at load time to what the probes' keys need, so
 * hashing never covers unused bytes.
 */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 10240); /* --max-keys */
	__uint(key_size, sizeof(struct bs_key_hdr));
	__uint(value_size, sizeof(struct bs_agg_val));
} aggs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4 << 20);
} events SEC(".maps");

/* Stack keys (--by kstack / ustack): ids into these maps, sized at load (1 when unused). */
struct {
	__uint(type, BPF_MAP_TYPE_STACK_TRACE);
	__uint(max_entries, 1);
	__uint(key_size, sizeof(u32));
	__uint(value_size, 127 * sizeof(u64));
} kstacks SEC(".maps");

/* User stacks as build id + file offset, symbolized later, even after the process exits. */
struct {
	__uint(type, BPF_MAP_TYPE_STACK_TRACE);
	__uint(max_entries, 1);
	__uint(key_size, sizeof(u32));
	__uint(value_size, 127 * sizeof(struct bpf_stack_build_id));
	__uint(map_flags, BPF_F_STACK_BUILD_ID);
} ustacks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, BS_LOST_NR);
	__type(key, u32);
	__type(value, u64);
} lost SEC(".maps");

/* tgids being traced when target_mode is BS_TARGET_TRACKED. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, u32);
	__type(value, u8);
} tracked SEC(".maps");

/*
 * Latency starts waiting for their end: match key -> timestamp followed by
 * the start side's key data (value size set at load time).
 */
struct {
	/* LRU: starts whose end never comes (filtered, lost) age out instead of filling the map. */
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1); /* resized when latency is measured */
	__uint(key_size, sizeof(struct bs_match_key));
	__uint(value_size, 8);
} starts SEC(".maps");

/* Glob matching state, stepped by bpf_loop so the verifier checks one step. */
struct bs_glob {
	char s[BS_STR_MAX];
	char p[BS_STR_MAX];
	u32 i, j, star, mark;
	int has_star;
	int result; /* -1 running, 0 no match, 1 match */
};

struct bs_scratch {
	struct bs_match_key mk;
	u64 args[BS_NARGS];
	/* Slack after each buffer lets a masked offset plus a full string stay in bounds. */
	u8 key[sizeof(struct bs_key_hdr) + BS_KEY_MAX + BS_STR_MAX];
	u8 ev[sizeof(struct bs_event_hdr) + BS_EVENT_DATA_MAX + 8 + BS_BUF_MAX];
	struct bs_str str;
	struct bs_glob glob;
	/* The filter's boolean stack, bit 0 on top (see bs_filter_step). */
	u64 fstack;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct bs_scratch);
} scratch SEC(".maps");

/*
 * The current task's comm, copied with two plain loads through the
 * BTF-typed task pointer: bpf_get_current_comm() costs several times more
 * (strscpy plus padding) on the hottest path.
 */
static __always_inline void bs_comm(char *dst)
{
	struct task_struct *t = bpf_get_current_task_btf();

	__builtin_memcpy(dst, t->comm, BS_COMM_LEN);
}

/*
 * Whether this event belongs to the traced processes. Latency ends are
 * exempt: they often run in another context (a block I/O completion in an
 * interrupt) and only count when a traced start is waiting for them;
 * except function returns, which run in the task of their entry.
 */
static __always_inline int bs_target_ok(const struct bs_probe_cfg *cfg)
{
	u32 tgid;

	if ((cfg->flags & BS_CFG_LAT_END) && !(cfg->flags & BS_CFG_SAME_TASK))
		return 1;
	tgid = bpf_get_current_task_btf()->tgid;
	if (tgid == self_tgid)
		return 0;
	if (target_mode == BS_TARGET_TRACKED && !bpf_map_lookup_elem(&tracked, &tgid))
		return 0;
	return 1;
}

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
		return (u64)id;
	}
	case BS_SRC_CTX: {
		u32 n = src->size;

		if (n > sizeof(raw))
			n = sizeof(raw);
		bpf_probe_read_kernel(&raw, n, ctx + src->off);
		return bs_extend(raw, src->size, src->is_signed);
	}
	case BS_SRC_ARG:
		raw = s->args[src->off & (BS_NARGS - 1)];
		if (src->walk) {
			u64 addr = bs_walk(src, raw);
			u32 n = src->size;

			if (n > sizeof(raw))
				n = sizeof(raw);
			raw = 0;
			bpf_probe_read_kernel(&raw, n, (void *)addr);
		}
		return bs_extend(raw, src->size, src->is_signed);
	default:
		return 0;
	}
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
	__builtin_memset(dst + 8, 0, BS_BUF_MAX);
	if (!ptr || !n)
		return 0;
	if (bpf_probe_read_user(dst + 8, n, (void *)ptr) < 0) {
		__builtin_memset(dst + 8, 0, BS_BUF_MAX);
		return 1;
	}
	return 0;
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
	__builtin_memset(dst, 0, BS_STR_MAX);
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

static __always_inline int bs_str_eq(const char *a, const char *b)
{
	for (int i = 0; i < BS_STR_MAX; i++) {
		if (a[i] != b[i])
			return 0;
		if (!a[i])
			return 1;
	}
	return 1;
}

/*
 * The state lives in the per-CPU scratch map, reached through this stack
 * context: kernels before 6.7 verify a bpf_loop callback as if it ran once
 * and would treat a result kept on the stack as its initial constant,
 * pruning the match branch as dead code.
 */
struct bs_glob_ctx {
	struct bs_glob *g;
};

/*
 * One step of greedy matching with a single backtrack point (the same
 * algorithm as the user-space matcher in probe/glob.rs).
 */
static int bs_glob_step(u64 it, struct bs_glob_ctx *ctx)
{
	struct bs_glob *g = ctx->g;
	u32 i = g->i, j = g->j;
	char c = i < BS_STR_MAX ? g->s[i & (BS_STR_MAX - 1)] : 0;
	char p = j < BS_STR_MAX ? g->p[j & (BS_STR_MAX - 1)] : 0;

	if (!c) {
		/* Subject consumed: a match if only stars remain, one per step. */
		if (p == '*') {
			g->j = j + 1;
			return 0;
		}
		g->result = !p;
		return 1;
	}
	if (p == '*') {
		g->has_star = 1;
		g->star = j;
		g->mark = i;
		g->j = j + 1;
		return 0;
	}
	if (p && (p == '?' || p == c)) {
		g->i = i + 1;
		g->j = j + 1;
		return 0;
	}
	if (!g->has_star) {
		g->result = 0;
		return 1;
	}
	g->j = g->star + 1;
	g->mark++;
	g->i = g->mark;
	return 0;
}

static __always_inline int bs_glob_match(struct bs_glob *g, const char *s, const char *p)
{
	struct bs_glob_ctx ctx = { .g = g };

	/*
	 * Copied by a helper: an inline copy of two strings between map values
	 * is staged through the stack (472 bytes of bs_filter_term's frame),
	 * which kernels without private BPF stacks (6.12 and older) refuse in
	 * a chain of calls (512 bytes in all).
	 */
	bpf_probe_read_kernel(g->s, BS_STR_MAX, s);
	bpf_probe_read_kernel(g->p, BS_STR_MAX, p);
	g->i = g->j = g->star = g->mark = 0;
	g->has_star = 0;
	g->result = -1;
	/* Worst case with backtracking is len(s) * len(p) steps, plus trailing stars. */
	bpf_loop(BS_STR_MAX * BS_STR_MAX + BS_STR_MAX, bs_glob_step, &ctx, 0);
	return g->result == 1;
}

/*
 * One comparison of a filter program: the operand read through the shared
 * non-inlined readers, then compared with the constant.
 */
static __noinline u64 bs_filter_term(void *ctx, const struct bs_filter_op *op,
				     struct bs_scratch *s, u32 idx)
{
	u64 b = 0;

	switch (op->op) {
	case BS_OP_TRUE:
		return 1;
	case BS_OP_STR_EQ:
	case BS_OP_STR_NE:
	case BS_OP_GLOB:
	case BS_OP_NGLOB: {
		u32 si = op->str_idx;
		struct bs_str *pat = bpf_map_lookup_elem(&strs, &si);

		if (!pat)
			return 0;
		/* A string that faults compares as "". */
		bs_read_str(ctx, &op->src, s, s->str.s);
		if (op->op == BS_OP_STR_EQ || op->op == BS_OP_STR_NE)
			b = bs_str_eq(s->str.s, pat->s);
		else
			b = bs_glob_match(&s->glob, s->str.s, pat->s);
		if (op->op == BS_OP_STR_NE || op->op == BS_OP_NGLOB)
			b ^= 1;
		return b;
	}
	default: {
		u64 v = bs_read_num(ctx, &op->src, s, idx);
		u64 c = op->imm;

		if (op->src.is_signed) {
			s64 sv = v, sc = c;

			switch (op->op) {
			case BS_OP_EQ: b = sv == sc; break;
			case BS_OP_NE: b = sv != sc; break;
			case BS_OP_LT: b = sv < sc; break;
			case BS_OP_LE: b = sv <= sc; break;
			case BS_OP_GT: b = sv > sc; break;
			case BS_OP_GE: b = sv >= sc; break;
			}
		} else {
			switch (op->op) {
			case BS_OP_EQ: b = v == c; break;
			case BS_OP_NE: b = v != c; break;
			case BS_OP_LT: b = v < c; break;
			case BS_OP_LE: b = v <= c; break;
			case BS_OP_GT: b = v > c; break;
			case BS_OP_GE: b = v >= c; break;
			}
		}
		return b;
	}
	}
}

/* What a filter step needs; the program state itself lives in the scratch map. */
struct bs_filter_ctx {
	void *ctx;
	const struct bs_probe_cfg *cfg;
	struct bs_scratch *s;
	u32 idx;
};

/*
 * One step of the postfix program, run by bpf_loop. The verifier checks
 * this body once (or until its state repeats, from 6.7) instead of every
 * path through every unrolled step: the boolean stack is a bitmask in the
 * scratch map (bit 0 the top), an unknown value to the verifier, so no
 * combination of earlier results is tracked. Unrolled, 6 terms exceeded
 * the verifier's million-instruction budget.
 */
static int bs_filter_step(u64 i, struct bs_filter_ctx *fc)
{
	struct bs_scratch *s = fc->s;
	const struct bs_filter_op *op = &fc->cfg->filter[i & (BS_MAX_FILTER_OPS - 1)];
	u64 st = s->fstack;

	switch (op->op) {
	case BS_OP_AND:
		s->fstack = ((st >> 2) << 1) | (st & (st >> 1) & 1);
		return 0;
	case BS_OP_OR:
		s->fstack = ((st >> 2) << 1) | ((st | (st >> 1)) & 1);
		return 0;
	case BS_OP_NOT:
		s->fstack = st ^ 1;
		return 0;
	}
	st = bs_filter_term(fc->ctx, op, s, fc->idx);
	/* Re-read: the term may not keep it in a register across its calls. */
	s->fstack = (s->fstack << 1) | (st & 1);
	return 0;
}

static __always_inline int bs_filter(void *ctx, const struct bs_probe_cfg *cfg,
				     struct bs_scratch *s, u32 idx)
{
	struct bs_filter_ctx fc = { .ctx = ctx, .cfg = cfg, .s = s, .idx = idx };
	u32 n = cfg->nfilter;

	/* No filter in this session: the machine is left out of the programs. */
	if (!max_filter_ops)
		return 1;
	if (n > max_filter_ops)
		n = max_filter_ops;
	if (n > BS_MAX_FILTER_OPS)
		n = BS_MAX_FILTER_OPS;
	s->fstack = 0;
	bpf_loop(n, bs_filter_step, &fc, 0);
	return s->fstack & 1;
}

/* Writes one key or event part at dst; returns 1 when its memory could not be read. */
static __always_inline int bs_put(void *ctx, const struct bs_src *src,
				  struct bs_scratch *s, u32 idx, u8 *dst)
{
	if (src->type == BS_T_BUF_UPTR)
		return bs_read_buf(ctx, src, s, dst);
	if (src->kind == BS_SRC_COMM || src->type != BS_T_NUM)
		return bs_read_str(ctx, src, s, (char *)dst);
	*(u64 *)dst = bs_read_num(ctx, src, s, idx);
	return 0;
}

static __always_inline u32 bs_log2(u64 v)
{
	u32 r = 0;

	/* Branch-free floor(log2(v)) for v > 0. */
	if (v >> 32) { v >>= 32; r += 32; }
	if (v >> 16) { v >>= 16; r += 16; }
	if (v >> 8) { v >>= 8; r += 8; }
	if (v >> 4) { v >>= 4; r += 4; }
	if (v >> 2) { v >>= 2; r += 2; }
	if (v >> 1) { r += 1; }
	return r;
}

/*
 * Histogram bucket of v. Log2: 0 holds negatives, 1 holds zero, 2 + k holds
 * [2^k, 2^(k+1)). Linear: 0 is below the range, 1..n in range, n + 1 above.
 */
static __always_inline u32 bs_bucket(const struct bs_probe_cfg *cfg, u64 v)
{
	if (cfg->agg == BS_AGG_HIST_LOG2) {
		if (cfg->value.is_signed && (s64)v < 0)
			return 0;
		if (v == 0)
			return 1;
		return 2 + bs_log2(v);
	}
	if (cfg->agg == BS_AGG_HIST_LINEAR) {
		s64 sv = v, lo = cfg->lin_min;
		u64 step = cfg->lin_step ? cfg->lin_step : 1;
		u64 n;

		if (cfg->value.is_signed ? sv < lo : v < (u64)lo)
			return 0;
		n = ((u64)(sv - lo)) / step;
		if (n >= cfg->lin_nbuckets)
			return cfg->lin_nbuckets + 1;
		return n + 1;
	}
	return 0;
}

static __always_inline void bs_aggregate(const struct bs_probe_cfg *cfg,
					 struct bs_scratch *s, u64 v)
{
	struct bs_key_hdr *hdr = (struct bs_key_hdr *)s->key;
	struct bs_agg_val *a;
	u64 old;

	hdr->bucket = bs_bucket(cfg, v);
	hdr->epoch = epoch;
	a = bpf_map_lookup_elem(&aggs, s->key);
	if (!a) {
		struct bs_agg_val zero = {};

		bpf_map_update_elem(&aggs, s->key, &zero, BPF_NOEXIST);
		a = bpf_map_lookup_elem(&aggs, s->key);
		if (!a) {
			bs_count(&lost, BS_LOST_KEYS);
			return;
		}
	}
	/* Atomics: uprobe programs can be preempted by another task on this CPU. */
	old = __sync_fetch_and_add(&a->count, 1);
	if (cfg->agg == BS_AGG_COUNT)
		return;
	__sync_fetch_and_add(&a->sum, v);
	if (cfg->agg != BS_AGG_STATS)
		return;
	/* A slot with count 0 has no min/max yet (other CPUs' slots start zeroed). */
	if (cfg->value.is_signed) {
		if (!old || (s64)v < a->min)
			a->min = v;
		if (!old || (s64)v > a->max)
			a->max = v;
	} else {
		if (!old || v < (u64)a->min)
			a->min = v;
		if (!old || v > (u64)a->max)
			a->max = v;
	}
}

static __always_inline void bs_emit(void *ctx, const struct bs_probe_cfg *cfg,
				    struct bs_scratch *s, u32 idx)
{
	struct bs_event_hdr *hdr = (struct bs_event_hdr *)s->ev;
	struct task_struct *t = bpf_get_current_task_btf();
	u64 size, flags;

	hdr->ts_ns = bpf_ktime_get_ns();
	hdr->probe = idx;
	hdr->pid = t->tgid;
	hdr->tid = t->pid;
	hdr->cpu = bpf_get_smp_processor_id();
	hdr->faults = 0;
	hdr->pad = 0;
	bs_comm(hdr->comm);
	for (int i = 0; i < BS_MAX_EMIT; i++) {
		const struct bs_src *src;

		if (i >= max_emit || i >= cfg->nemit)
			break;
		src = &cfg->emit[i];
		if (bs_put(ctx, src, s, idx,
			   s->ev + sizeof(*hdr) + (src->out_off & (BS_EVENT_DATA_MAX - 1))))
			hdr->faults |= 1u << i;
	}
	size = sizeof(*hdr) + (cfg->event_size & (BS_EVENT_DATA_MAX - 1));
	flags = bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) >= wakeup_bytes ?
			BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP;
	if (bpf_ringbuf_output(&events, s->ev, size, flags))
		bs_count(&lost, BS_LOST_EVENTS);
}

static __always_inline void bs_keys(void *ctx, const struct bs_probe_cfg *cfg,
				    struct bs_scratch *s, u32 idx)
{
	for (int i = 0; i < BS_MAX_KEY_PARTS; i++) {
		const struct bs_src *src;

		if (i >= max_key_parts || i >= cfg->nkeys)
			break;
		src = &cfg->keys[i];
		bs_put(ctx, src, s, idx,
		       s->key + sizeof(struct bs_key_hdr) + (src->out_off & (BS_KEY_MAX - 1)));
	}
}

/* The match key of a latency start or end. */
static __always_inline void bs_match(void *ctx, const struct bs_probe_cfg *cfg,
				     struct bs_scratch *s, u32 idx)
{
	s->mk.pair = cfg->pair;
	s->mk.pad = 0;
	for (int i = 0; i < BS_MAX_MATCH; i++)
		s->mk.vals[i] = i < cfg->nmatch ? bs_read_num(ctx, &cfg->match[i], s, idx) : 0;
}

/* Everything after the probe is identified and its arguments are in place. */
static __always_inline int bs_handle(void *ctx, const struct bs_probe_cfg *cfg,
				     struct bs_scratch *s, u32 idx)
{
	u64 v = 0;

	if (cfg->nfilter && !bs_filter(ctx, cfg, s, idx))
		return 0;
	if (cfg->agg == BS_AGG_EVENT) {
		bs_emit(ctx, cfg, s, idx);
		return 0;
	}
	if (cfg->flags & BS_CFG_LAT_END) {
		u64 *start;

		bs_match(ctx, cfg, s, idx);
		start = bpf_map_lookup_elem(&starts, &s->mk);
		if (!start) {
			bs_count(&lost, BS_LOST_UNMATCHED);
			return 0;
		}
		/* The start side's key data comes first; end-side parts then fill their slots. */
		bpf_probe_read_kernel(s->key, start_size, start);
		v = bpf_ktime_get_ns() - *(u64 *)s->key;
		bpf_map_delete_elem(&starts, &s->mk);
	}
	bs_keys(ctx, cfg, s, idx);
	if (cfg->flags & BS_CFG_LAT_START) {
		/* The 8-byte key header holds the timestamp in a start record. */
		*(u64 *)s->key = bpf_ktime_get_ns();
		bs_match(ctx, cfg, s, idx);
		if (bpf_map_update_elem(&starts, &s->mk, s->key, BPF_ANY))
			bs_count(&lost, BS_LOST_KEYS);
		return 0;
	}
	if (cfg->agg != BS_AGG_COUNT && !(cfg->flags & BS_CFG_LAT_END))
		v = bs_read_num(ctx, &cfg->value, s, idx);
	bs_aggregate(cfg, s, v);
	return 0;
}

static __always_inline struct bs_scratch *bs_scratch(void)
{
	u32 zero = 0;

	return bpf_map_lookup_elem(&scratch, &zero);
}

/* Probe index from the attachment's cookie (index + 1; 0 means none). */
static __always_inline int bs_cookie_probe(void *ctx, u32 *idx)
{
	u64 cookie = bpf_get_attach_cookie(ctx);

	if (!cookie)
		return 0;
	*idx = cookie - 1;
	return 1;
}

/* Syscall arguments from pt_regs, in the syscall calling convention. */
static __always_inline void bs_syscall_args(struct pt_regs *regs, struct bs_scratch *s)
{
	/* r10..rdi are contiguous in pt_regs: one read instead of six. */
	u64 r[8];

	bpf_probe_read_kernel(r, sizeof(r), (void *)regs + __builtin_offsetof(struct pt_regs, r10));
	s->args[0] = r[7]; /* rdi */
	s->args[1] = r[6]; /* rsi */
	s->args[2] = r[5]; /* rdx */
	s->args[3] = r[0]; /* r10 */
	s->args[4] = r[2]; /* r8 */
	s->args[5] = r[1]; /* r9 */
}

static __always_inline int bs_syscall(u64 *ctx, u32 slot, int exit)
{
	struct bs_probe_cfg *cfg;
	struct bs_scratch *s;
	u32 *p, idx;

	p = bpf_map_lookup_elem(&sys_probes, &slot);
	if (!p || !*p)
		return 0;
	idx = *p - 1;
	cfg = bpf_map_lookup_elem(&probes, &idx);
	s = bs_scratch();
	if (!cfg || !s || !bs_target_ok(cfg))
		return 0;
	if (cfg->flags & BS_CFG_NEED_ARGS) {
		struct pt_regs *regs = (struct pt_regs *)ctx[0];

		if (exit)
			s->args[BS_ARG_RET] = ctx[1];
		else
			bs_syscall_args(regs, s);
		s->args[BS_ARG_NR] = slot % BS_SYS_MAX;
	}
	return bs_handle(ctx, cfg, s, idx);
}

SEC("raw_tp/sys_enter")
int bpfscope_sysin(u64 *ctx)
{
	/* ctx[1] is the syscall number. */
	u64 nr = ctx[1];

	if (nr >= BS_SYS_MAX)
		return 0;
	return bs_syscall(ctx, nr, 0);
}

SEC("raw_tp/sys_exit")
int bpfscope_sysout(u64 *ctx)
{
	struct pt_regs *regs = (struct pt_regs *)ctx[0];
	u64 nr = 0;

	bpf_probe_read_kernel(&nr, sizeof(nr), (void *)regs + __builtin_offsetof(struct pt_regs, orig_rax));
	if (nr >= BS_SYS_MAX)
		return 0;
	return bs_syscall(ctx, BS_SYS_EXIT_BASE + nr, 1);
}

/* Any raw tracepoint, configured by cookie (kernel 6.10+). Keys use builtins only. */
SEC("raw_tp")
int bpfscope_rawtp(u64 *ctx)
{
	struct bs_probe_cfg *cfg;
	struct bs_scratch *s;
	u32 idx;

	if (!bs_cookie_probe(ctx, &idx))
		return 0;
	cfg = bpf_map_lookup_elem(&probes, &idx);
	s = bs_scratch();
	if (!cfg || !s || !bs_target_ok(cfg))
		return 0;
	return bs_handle(ctx, cfg, s, idx);
}

/*
 * Classic tracepoint: ctx is the event record as the format file describes.
 * Returning 0 tells the kernel not to submit the event to perf buffers.
 */
SEC("tracepoint")
int bpfscope_tp(void *ctx)
{
	struct bs_probe_cfg *cfg;
	struct bs_scratch *s;
	u32 idx;

	if (!bs_cookie_probe(ctx, &idx))
		return 0;
	cfg = bpf_map_lookup_elem(&probes, &idx);
	s = bs_scratch();
	if (!cfg || !s || !bs_target_ok(cfg))
		return 0;
	return bs_handle(ctx, cfg, s, idx);
}

static __always_inline int bs_user_probe(struct pt_regs *ctx, u32 idx, int usdt)
{
	struct bs_probe_cfg *cfg;
	struct bs_scratch *s;

	cfg = bpf_map_lookup_elem(&probes, &idx);
	s = bs_scratch();
	if (!cfg || !s || !bs_target_ok(cfg))
		return 0;
	if (cfg->flags & BS_CFG_NEED_ARGS) {
		if (usdt) {
			int n = bpf_usdt_arg_cnt(ctx);

			for (int i = 0; i < BS_MAX_ARGS; i++) {
				long v = 0;

				if (i >= n)
					break;
				bpf_usdt_arg(ctx, i, &v);
				s->args[i] = v;
			}
		} else {
			/* The x86-64 calling convention. */
			s->args[0] = PT_REGS_PARM1(ctx);
			s->args[1] = PT_REGS_PARM2(ctx);
			s->args[2] = PT_REGS_PARM3(ctx);
			s->args[3] = PT_REGS_PARM4(ctx);
			s->args[4] = PT_REGS_PARM5(ctx);
			s->args[5] = PT_REGS_PARM6(ctx);
			s->args[BS_ARG_RET] = PT_REGS_RC(ctx);
		}
	}
	return bs_handle(ctx, cfg, s, idx);
}

/* pt_regs programs configured by cookie: kprobes, uprobes, their multi links. */
static __always_inline int bs_regs_cookie(struct pt_regs *ctx)
{
	u32 idx;

	if (!bs_cookie_probe(ctx, &idx))
		return 0;
	return bs_user_probe(ctx, idx, 0);
}

/* A kernel function through a kprobe or kretprobe; pt_regs as for uprobes. */
SEC("kprobe")
int bpfscope_kprobe(struct pt_regs *ctx)
{
	return bs_regs_cookie(ctx);
}

/* Many kernel functions in one kprobe_multi link; each function's cookie names it. */
SEC("kprobe.multi")
int bpfscope_kmulti(struct pt_regs *ctx)
{
	return bs_regs_cookie(ctx);
}

/*
 * fentry/fexit: the trampoline passes the arguments as u64 slots, read
 * with bpf_get_func_arg (and the return value with bpf_get_func_ret), so
 * the same code serves every target. The target is fixed at load time:
 * user space loads these instructions once per function (see
 * attach/kfunc.rs) and attaches each copy with its cookie.
 */
static __always_inline int bs_tramp(void *ctx, int ret)
{
	struct bs_probe_cfg *cfg;
	struct bs_scratch *s;
	u32 idx;

	if (!bs_cookie_probe(ctx, &idx))
		return 0;
	cfg = bpf_map_lookup_elem(&probes, &idx);
	s = bs_scratch();
	if (!cfg || !s || !bs_target_ok(cfg))
		return 0;
	if (cfg->flags & BS_CFG_NEED_ARGS) {
		u64 n = bpf_get_func_arg_cnt(ctx);

		for (int i = 0; i < 6; i++) {
			u64 v = 0;

			if (i >= n)
				break;
			bpf_get_func_arg(ctx, i, &v);
			s->args[i] = v;
		}
		if (ret) {
			u64 v = 0;

			bpf_get_func_ret(ctx, &v);
			s->args[BS_ARG_RET] = v;
		}
	}
	return bs_handle(ctx, cfg, s, idx);
}

SEC("fentry")
int bpfscope_fentry(void *ctx)
{
	return bs_tramp(ctx, 0);
}

SEC("fexit")
int bpfscope_fexit(void *ctx)
{
	return bs_tramp(ctx, 1);
}

/* One uprobe or uretprobe per function (kernels without uprobe_multi). */
SEC("uprobe")
int bpfscope_uprobe(struct pt_regs *ctx)
{
	return bs_regs_cookie(ctx);
}

/* Many functions of one binary in one link; each function's cookie names it. */
SEC("uprobe.multi")
int bpfscope_umulti(struct pt_regs *ctx)
{
	return bs_regs_cookie(ctx);
}

/* USDT probes through libbpf's USDT support (arguments, semaphores). */
SEC("usdt")
int bpfscope_usdt(struct pt_regs *ctx)
{
	long cookie = bpf_usdt_cookie(ctx);

	if (!cookie)
		return 0;
	return bs_user_probe(ctx, cookie - 1, 1);
}

/* Follows forks of tracked processes, so `-- CMD` sees all descendants. */
SEC("raw_tp/sched_process_fork")
int BPF_PROG(bpfscope_fork, struct task_struct *parent, struct task_struct *child)
{
	return bs_follow_fork(&tracked, parent, child);
}
