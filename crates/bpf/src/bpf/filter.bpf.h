/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The filter machine: a --filter compiled by user space into a postfix
 * program of struct bs_filter_op, run one step per bpf_loop callback over a
 * boolean stack kept as a bitmask in the scratch map, so the verifier checks
 * one step instead of every path through every term. String comparisons and
 * globs (stepped by a nested bpf_loop, the same algorithm as probe/glob.rs)
 * live here too.
 */
#ifndef BPFSCOPE_FILTER_BPF_H
#define BPFSCOPE_FILTER_BPF_H

#include "read.bpf.h"

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

/* A numeric comparison's result for the operand's value v. */
static __always_inline u64 bs_cmp(const struct bs_filter_op *op, u64 v)
{
	u64 c = op->imm, b = 0;

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
	default:
		return bs_cmp(op, bs_read_num(ctx, &op->src, s, idx));
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
	/*
	 * One comparison, the common filter (a program of one op is a term):
	 * the term alone, without the loop's steps and the stack kept in the
	 * scratch map.
	 */
	if (n == 1) {
		const struct bs_filter_op *op = &cfg->filter[0];

		/* A number compared here: an argument is read in place (bs_num). */
		if (op->op >= BS_OP_EQ && op->op <= BS_OP_GE)
			return bs_cmp(op, bs_num(ctx, &op->src, s, idx));
		return bs_filter_term(ctx, op, s, idx) & 1;
	}
	s->fstack = 0;
	bpf_loop(n, bs_filter_step, &fc, 0);
	return s->fstack & 1;
}

#endif /* BPFSCOPE_FILTER_BPF_H */
