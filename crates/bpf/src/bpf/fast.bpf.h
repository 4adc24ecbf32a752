/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The plain aggregation path: sessions whose probes all count, take stats
 * or build histograms, without latency pairs, events or scripts. What such
 * a session fixes for all its events is set in .rodata at load
 * (attach/shape.rs), so the verifier keeps only this session's code:
 * - fast_agg: the aggregation, so its bucket and update are known;
 * - fast_slots: no key, so aggregates go to a slot of a per-CPU array (an
 *   index, where a hash map would hash and compare a key); also set for
 *   a keyless latency pair, whose ends take the general path otherwise;
 * - fast_key: the one key part is a builtin, written in place instead of
 *   through the general readers;
 * - fast_comm_op: the filter is `comm == "X"` (1) or `comm != "X"` (2),
 *   compared as two masked words instead of run by the filter machine;
 * - fast_cache: keyed, with key data of at most two words: a key's
 *   aggregate is kept in a per-CPU direct-mapped cache (`kcache`) when its
 *   entry is free, else in the hash map; user space reads both. A hash
 *   map update hashes the key, walks a bucket and compares (33 ns of a
 *   104 ns run, bench/event_cost.py); a cache hit is an index, two
 *   compares and adds.
 */
#ifndef BPFSCOPE_FAST_BPF_H
#define BPFSCOPE_FAST_BPF_H

#include "agg.bpf.h"
#include "filter.bpf.h"

/* 0: not a plain aggregation session (the general path). */
const volatile u32 fast_path = 0;
/* enum bs_agg of every probe. */
const volatile u32 fast_agg = BS_AGG_COUNT;
/* No key: aggregates live in `slots`, slot_buckets per epoch. */
const volatile u32 fast_slots = 0;
const volatile u32 slot_buckets = 1;
/* The enum bs_src_kind of the one key part when it is a builtin, else BS_SRC_NONE. */
const volatile u32 fast_key = BS_SRC_NONE;
/* 0: no comm filter; 1: comm == X; 2: comm != X. X and its NUL, as words and masks. */
const volatile u32 fast_comm_op = 0;
const volatile u64 fast_comm[2] = {};
const volatile u64 fast_comm_mask[2] = {};

/* Key data words the cache compares (1 or 2; 0: no cache), and the masks
 * of the key's bytes in them (bytes past the key are not the key's). */
const volatile u32 fast_cache = 0;
const volatile u64 cache_mask[2] = {};

/* Per CPU, a struct bs_cache per epoch half (index: epoch & 1), so that
 * user space reads and clears the half of the epoch it has left. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, u32);
	__type(value, struct bs_cache);
} kcache SEC(".maps");

/*
 * Keyless aggregates: per CPU, a struct bs_agg_val per bucket, in two
 * halves that alternate with the epoch's parity, so that user space reads
 * and clears the half of the epoch it has left while events fill the
 * other. Sized at load (2 x slot_buckets).
 */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct bs_agg_val);
} slots SEC(".maps");

static __always_inline void bs_slot_add(u32 bucket, u64 v, int is_signed)
{
	u32 i = (epoch & 1) * slot_buckets + bucket;
	struct bs_agg_val *a = bpf_map_lookup_elem(&slots, &i);

	if (!a) {
		bs_count(&lost, BS_LOST_KEYS);
		return;
	}
	bs_agg_val_add(a, v, fast_agg != BS_AGG_COUNT,
		       fast_agg == BS_AGG_STATS || fast_agg == BS_AGG_STATS_SIGN, is_signed);
}

/* The entry holds another key. */
static __always_inline int bs_cache_other(const struct bs_cache_ent *e, u64 k0, u64 k1,
					  u32 bucket)
{
	return e->used && (e->k[0] != k0 || e->k[1] != k1 || e->bucket != bucket);
}

/*
 * Adds v to the key in s->key (and bucket) through the cache. Returns 0
 * when done, -1 when the caller is to use the hash map: the entry holds
 * another key (the first key to reach an entry in an epoch keeps it, so
 * many keys cost a check each, never a flush), or the run this one
 * interrupted (or preempted) is updating it, or the map is full.
 */
static __always_inline int bs_cache_add(struct bs_scratch *s, u32 bucket, u64 v, int is_signed)
{
	u64 *d = (u64 *)(s->key + sizeof(struct bs_key_hdr));
	u64 k0 = d[0] & cache_mask[0];
	u64 k1 = fast_cache > 1 ? d[1] & cache_mask[1] : 0;
	u32 ep = epoch, half = ep & 1;
	struct bs_cache *c = bpf_map_lookup_elem(&kcache, &half);
	struct bs_cache_ent *e;
	u64 h;

	if (!c)
		return -1;
	/* Multiplicative hashing; the top bits index the entries. */
	h = k0 * 0x9E3779B97F4A7C15ull ^ k1 * 0xC2B2AE3D27D4EB4Full ^
	    (u64)bucket * 0x165667B19E3779F9ull;
	e = &c->e[(h >> 57) & (BS_CACHE_N - 1)];
	/* Another key's: checked again under the entry's lock. */
	if (bs_cache_other(e, k0, k1, bucket))
		return -1;
	if (__sync_lock_test_and_set(&e->lock, 1))
		return -1;
	if (bs_cache_other(e, k0, k1, bucket)) {
		*(volatile u32 *)&e->lock = 0;
		return -1;
	}
	if (!e->used) {
		struct bs_key_hdr *hdr = (struct bs_key_hdr *)s->key;
		struct bs_agg_val zero = {};

		/*
		 * The key takes a place in the map (an empty aggregate) before
		 * it takes the entry, so --max-keys bounds the keys as on the
		 * hash path: when the map is full, the hash path counts the
		 * event lost.
		 */
		hdr->bucket = bucket;
		hdr->epoch = ep;
		if (!bs_agg_slot(&aggs, s->key)) {
			*(volatile u32 *)&e->lock = 0;
			return -1;
		}
		e->k[0] = k0;
		e->k[1] = k1;
		e->bucket = bucket;
		e->val = zero;
		e->used = 1;
	}
	/* Plain adds: the entry's lock keeps other runs out. */
	bs_agg_val_update(&e->val, v, fast_agg != BS_AGG_COUNT,
			  fast_agg == BS_AGG_STATS || fast_agg == BS_AGG_STATS_SIGN, is_signed, 0);
	/* Released after the updates: a later run on this CPU sees them. */
	asm volatile("" ::: "memory");
	*(volatile u32 *)&e->lock = 0;
	return 0;
}

/* The one builtin key part, as bs_put would write it (numbers as u64). */
static __always_inline void bs_builtin_key(struct bs_scratch *s, u32 idx,
					   const struct task_struct *t)
{
	u64 *d = (u64 *)(s->key + sizeof(struct bs_key_hdr));

	switch (fast_key) {
	case BS_SRC_COMM:
		bs_copy_comm(t, d);
		return;
	case BS_SRC_PROBE:
		d[0] = idx;
		return;
	case BS_SRC_PID:
		d[0] = t->tgid;
		return;
	case BS_SRC_TID:
		d[0] = t->pid;
		return;
	case BS_SRC_CPU:
		d[0] = bpf_get_smp_processor_id();
		return;
	case BS_SRC_UID:
		d[0] = (u32)bpf_get_current_uid_gid();
		return;
	case BS_SRC_CGROUP:
		d[0] = bpf_get_current_cgroup_id();
		return;
	}
}

/* The comm filter: the task's comm is padded with NULs, but only the bytes
 * through X's NUL are compared, as a string comparison would. */
static __always_inline int bs_comm_pass(const struct task_struct *t)
{
	u64 a = *(u64 *)&t->comm[0], b = *(u64 *)&t->comm[8];
	int eq = !((a ^ fast_comm[0]) & fast_comm_mask[0]) &&
		 !((b ^ fast_comm[1]) & fast_comm_mask[1]);

	return fast_comm_op == 1 ? eq : !eq;
}

/* bs_handle for a plain aggregation session. */
static __always_inline int bs_plain(void *ctx, const struct bs_probe_cfg *cfg,
				    struct bs_scratch *s, u32 idx, const struct task_struct *t)
{
	u32 bucket = 0;
	u64 v = 0;

	if (fast_comm_op) {
		if (!bs_comm_pass(t))
			return 0;
	} else if (cfg->nfilter && !bs_filter(ctx, cfg, s, idx)) {
		return 0;
	}
	BS_STAGE(BS_STAGE_FILTER);
	if (fast_agg != BS_AGG_COUNT) {
		v = bs_num(ctx, &cfg->value, s, idx);
		bucket = bs_bucket_of(fast_agg, cfg, v);
	}
	if (fast_slots) {
		BS_STAGE(BS_STAGE_KEY);
		bs_slot_add(bucket, v, cfg->value.is_signed);
		return 0;
	}
	if (fast_key)
		bs_builtin_key(s, idx, t);
	else
		bs_keys(ctx, cfg, s, idx);
	BS_STAGE(BS_STAGE_KEY);
	if (fast_cache && !bs_cache_add(s, bucket, v, cfg->value.is_signed))
		return 0;
	if (bs_agg_add_to(&aggs, s, bucket, v, fast_agg != BS_AGG_COUNT,
			  fast_agg == BS_AGG_STATS || fast_agg == BS_AGG_STATS_SIGN,
			  cfg->value.is_signed))
		bs_count(&lost, BS_LOST_KEYS);
	return 0;
}

#endif /* BPFSCOPE_FAST_BPF_H */
