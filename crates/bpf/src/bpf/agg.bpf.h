/* SPDX-License-Identifier: GPL-2.0 */
/*
 * In-kernel aggregation: the aggregation key (struct bs_key_hdr, then the
 * probe's key parts at their offsets), histogram buckets (log2 and linear),
 * the per-CPU count/sum/min/max update in `aggs`, and the match key that
 * pairs a latency start with its end. Only the aggregates reach user space,
 * read at each --interval or at the end.
 */
#ifndef BPFSCOPE_AGG_BPF_H
#define BPFSCOPE_AGG_BPF_H

#include "read.bpf.h"

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
 * [2^k, 2^(k+1)). Pow2: 0 negatives, 1 zero, 2 + k holds (2^(k-1), 2^k].
 * Linear: 0 is below the range, 1..n in range, n + 1 above.
 */
static __always_inline u32 bs_bucket_of(u32 agg, const struct bs_probe_cfg *cfg, u64 v)
{
	if (agg == BS_AGG_HIST_LOG2) {
		if (cfg->value.is_signed && (s64)v < 0)
			return 0;
		if (v == 0)
			return 1;
		return 2 + bs_log2(v);
	}
	if (agg == BS_AGG_HIST_POW2) {
		if (cfg->value.is_signed && (s64)v < 0)
			return 0;
		if (v <= 1)
			return 1 + v;
		return 3 + bs_log2(v - 1);
	}
	if (agg == BS_AGG_STATS_SIGN)
		return cfg->value.is_signed && (s64)v < 0;
	if (agg == BS_AGG_HIST_LINEAR) {
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

static __always_inline u32 bs_bucket(const struct bs_probe_cfg *cfg, u64 v)
{
	return bs_bucket_of(cfg->agg, cfg, v);
}

/*
 * Adds v to an aggregate: the count always, the sum with `sum`, min and
 * max with `minmax` (compared signed with `is_signed`); the count and sum
 * atomically with `atomic` (a constant at each call).
 */
static __always_inline void bs_agg_val_update(struct bs_agg_val *a, u64 v, int sum, int minmax,
					      int is_signed, int atomic)
{
	u64 old;

	if (atomic) {
		old = __sync_fetch_and_add(&a->count, 1);
	} else {
		old = a->count;
		a->count = old + 1;
	}
	if (!sum)
		return;
	if (atomic)
		__sync_fetch_and_add(&a->sum, v);
	else
		a->sum += v;
	if (!minmax)
		return;
	/* A slot with count 0 has no min/max yet (other CPUs' slots start zeroed). */
	if (is_signed) {
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

/* Atomics: uprobe programs can be preempted by another task on this CPU. */
static __always_inline void bs_agg_val_add(struct bs_agg_val *a, u64 v, int sum, int minmax,
					   int is_signed)
{
	bs_agg_val_update(a, v, sum, minmax, is_signed, 1);
}

/* The aggregate of `key` in `map`, inserted empty if new; NULL when the
 * map is full. */
static __always_inline struct bs_agg_val *bs_agg_slot(void *map, const void *key)
{
	struct bs_agg_val *a = bpf_map_lookup_elem(map, key);

	if (!a) {
		struct bs_agg_val zero = {};

		bpf_map_update_elem(map, key, &zero, BPF_NOEXIST);
		a = bpf_map_lookup_elem(map, key);
	}
	return a;
}

/*
 * Adds v to the aggregate of the key in s->key, in `bucket`, in `map`
 * (the verbs' `aggs`, or a script map's own): the count always, the sum
 * with `sum`, min and max with `minmax` (compared signed with
 * `is_signed`). Returns -1 when the map is full.
 */
static __always_inline int bs_agg_add_to(void *map, struct bs_scratch *s, u32 bucket, u64 v,
					 int sum, int minmax, int is_signed)
{
	struct bs_key_hdr *hdr = (struct bs_key_hdr *)s->key;
	struct bs_agg_val *a;

	hdr->bucket = bucket;
	hdr->epoch = epoch;
	a = bs_agg_slot(map, s->key);
	if (!a)
		return -1;
	bs_agg_val_add(a, v, sum, minmax, is_signed);
	return 0;
}

static __always_inline void bs_aggregate(const struct bs_probe_cfg *cfg,
					 struct bs_scratch *s, u64 v)
{
	if (bs_agg_add_to(&aggs, s, bs_bucket(cfg, v), v, cfg->agg != BS_AGG_COUNT,
			  cfg->agg == BS_AGG_STATS || cfg->agg == BS_AGG_STATS_SIGN,
			  cfg->value.is_signed))
		bs_count(&lost, BS_LOST_KEYS);
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
		s->mk.vals[i] = i < cfg->nmatch ? bs_num(ctx, &cfg->match[i], s, idx) : 0;
}

#endif /* BPFSCOPE_AGG_BPF_H */
