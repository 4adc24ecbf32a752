/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The script machine: what `bpfscope run` lowers a bpftrace-language probe
 * block into, run here with no code generated at run time. It grows the
 * filter machine (filter.bpf.h) from a boolean stack into registers, string
 * slots and jumps: each probe's configuration names a range of struct
 * bs_insn in vm_code, and bpf_loop runs one instruction per callback, so the
 * verifier checks one step whatever the script. Values are read through the
 * same readers as filters and keys (read.bpf.h); aggregations go to `aggs`
 * like the verbs' (a map id in the key's first data bytes); plain map
 * script maps are kernel maps of their own (`vm_aggs`, `vm_vals`: arrays of
 * maps indexed by the map id in the key); printf, time, join, print, clear
 * and exit become records in the `events` ring buffer, formatted in user
 * space. A run cut short at BS_VM_STEPS and an update a full map refused
 * are counted and announced at once (enum bs_note).
 */
#ifndef BPFSCOPE_VM_BPF_H
#define BPFSCOPE_VM_BPF_H

#include "filter.bpf.h"
#include "agg.bpf.h"
#include "emit.bpf.h"

/*
 * 64 bytes between string slots, keys and records as eight word moves: a
 * helper call (bpf_probe_read_kernel) costs more than the copy. Offsets
 * into keys and records are multiples of 8.
 */
static __always_inline void bs_copy64(void *dst, const void *src)
{
	u64 *d = dst;
	const u64 *q = src;

	for (int k = 0; k < BS_STR_MAX / 8; k++)
		d[k] = q[k];
}

/*
 * A string key part of `len` bytes (a multiple of 8; 0: a whole slot)
 * copied from src, the rest of dst's slot zeroed: a part is as long as the
 * longest string its map's keys hold (comm: 16), so a part read back into
 * a slot is padded as every slot is.
 */
static __always_inline void bs_copy_part(void *dst, const void *src, u32 len)
{
	u64 *d = dst;
	const u64 *q = src;

	if (!len)
		len = BS_STR_MAX;
	for (int k = 0; k < BS_STR_MAX / 8; k++)
		d[k] = k * 8 < len ? q[k] : 0;
}

/*
 * Whether this session's code uses an operation: `vm_ops` is frozen
 * .rodata, so the verifier drops the cases no script of the session
 * uses and checks only the rest (load time falls with the script's size).
 */
#define BS_ON(op) (vm_ops & (1ull << (op)))

struct bs_vm_ctx {
	void *ctx;
	struct bs_scratch *s;
	u32 idx;
	u32 start;
	u32 len;
};

#define BS_R(i) (s->r[(i) & (BS_VM_REGS - 1)])
#define BS_SV(i) (s->sv[(i) & (BS_VM_STRS - 1)])
#define BS_KEYDATA (s->key + sizeof(struct bs_key_hdr))
#define BS_EVDATA (s->ev + sizeof(struct bs_event_hdr))

/* The map id the key being built names (its first word). */
static __always_inline u32 bs_vm_map_id(struct bs_scratch *s)
{
	return *(u64 *)BS_KEYDATA;
}

static __always_inline u64 bs_vm_alu(const struct bs_insn *in, u64 x, u64 y)
{
	int sg = in->flags & BS_VMF_SIGNED;
	s64 sx = x, sy = y;

	switch (in->arg) {
	case BS_ALU_ADD: return x + y;
	case BS_ALU_SUB: return x - y;
	case BS_ALU_MUL: return x * y;
	/* Division by zero gives 0, as the BPF instruction does. */
	case BS_ALU_DIV:
		if (!y)
			return 0;
		if (sg && (sx < 0 || sy < 0)) {
			u64 q = (sx < 0 ? -sx : sx) / (sy < 0 ? -sy : sy);

			return (sx < 0) != (sy < 0) ? -q : q;
		}
		return x / y;
	case BS_ALU_MOD:
		if (!y)
			return 0;
		if (sg && (sx < 0 || sy < 0)) {
			u64 m = (sx < 0 ? -sx : sx) % (sy < 0 ? -sy : sy);

			return sx < 0 ? -m : m;
		}
		return x % y;
	case BS_ALU_AND: return x & y;
	case BS_ALU_OR: return x | y;
	case BS_ALU_XOR: return x ^ y;
	case BS_ALU_SHL: return x << (y & 63);
	case BS_ALU_SHR: return sg ? (u64)(sx >> (y & 63)) : x >> (y & 63);
	case BS_ALU_EQ: return x == y;
	case BS_ALU_NE: return x != y;
	case BS_ALU_LT: return sg ? sx < sy : x < y;
	case BS_ALU_LE: return sg ? sx <= sy : x <= y;
	case BS_ALU_GT: return sg ? sx > sy : x > y;
	case BS_ALU_GE: return sg ? sx >= sy : x >= y;
	case BS_ALU_NEG: return -x;
	case BS_ALU_NOT: return !x;
	case BS_ALU_BNOT: return ~x;
	case BS_ALU_BOOL: return x != 0;
	case BS_ALU_BSWAP:
		return y == 16 ? (u64)__builtin_bswap16(x) :
		       y == 32 ? (u64)__builtin_bswap32(x) : __builtin_bswap64(x);
	default: return 0;
	}
}

/* A string at an address: user memory first (syscall arguments), then kernel. */
static __noinline void bs_vm_strptr(char *dst, u64 ptr, u64 max)
{
	u32 n = max && max < BS_STR_MAX ? max + 1 : BS_STR_MAX;

	/*
	 * Hidden from the compiler, then masked: the verifier sees 1..64
	 * whatever copies of n the compiler makes (6.1 loses a bound checked
	 * on another register).
	 */
	asm volatile("" : "+r"(n));
	n = ((n - 1) & (BS_STR_MAX - 1)) + 1;
	bs_zero_words(dst, BS_STR_MAX);
	if (!ptr)
		return;
	if (bpf_probe_read_user_str(dst, n, (void *)ptr) < 0)
		bpf_probe_read_kernel_str(dst, n, (void *)ptr);
}

/* ntop(): the family and the address bytes (enum bs_vm_op's BS_VM_NTOP). */
static __noinline void bs_vm_ntop(char *dst, u64 af, u64 v, const char *from, u32 how)
{
	bs_zero_words(dst, BS_STR_MAX);
	dst[0] = af;
	switch (how) {
	case 0:
		*(u32 *)(dst + 8) = v;
		break;
	case 4:
		bpf_probe_read_kernel(dst + 8, 4, (void *)v);
		break;
	case 16:
		bpf_probe_read_kernel(dst + 8, 16, (void *)v);
		break;
	case 36:
		__builtin_memcpy(dst + 8, from, 4);
		break;
	case 48:
		__builtin_memcpy(dst + 8, from, 16);
		break;
	}
}

/* strcontains(): whether `needle` occurs in `hay` (both NUL-terminated slots). */
struct bs_strstr {
	const char *hay;
	const char *needle;
	int found;
};

static int bs_strstr_at(u64 i, struct bs_strstr *c)
{
	for (u64 k = 0; k < BS_STR_MAX; k++) {
		char n = c->needle[k];
		u64 at = i + k;

		if (!n) {
			c->found = 1;
			return 1;
		}
		if (at >= BS_STR_MAX)
			return 1;
		/*
		 * 64-bit and masked after a barrier: 6.1's verifier lost the
		 * bound of a 32-bit sum ("value -2147483648 makes map_value
		 * pointer be out of bounds").
		 */
		asm volatile("" : "+r"(at));
		at &= BS_STR_MAX - 1;
		if (c->hay[at] != n) {
			u64 h = i;

			/* Masked for the verifier, which cannot derive i <= at. */
			asm volatile("" : "+r"(h));
			h &= BS_STR_MAX - 1;
			return c->hay[h] ? 0 : 1;
		}
	}
	return 0;
}

static __noinline u64 bs_vm_strstr(const char *hay, const char *needle)
{
	struct bs_strstr c = { .hay = hay, .needle = needle };

	bpf_loop(BS_STR_MAX, bs_strstr_at, &c, 0);
	return c.found;
}

/* buf(): n (at most BS_STR_MAX - 1) bytes at an address, user memory first, after their length. */
static __noinline void bs_vm_buf(u8 *dst, u64 ptr, u64 n)
{
	bs_zero_words(dst, BS_STR_MAX);
	if (n > BS_STR_MAX - 1)
		n = BS_STR_MAX - 1;
	asm volatile("" : "+r"(n));
	n &= BS_STR_MAX - 1;
	dst[0] = n;
	if (!ptr || !n)
		return;
	if (bpf_probe_read_user(dst + 1, n, (void *)ptr) < 0)
		bpf_probe_read_kernel(dst + 1, n, (void *)ptr);
}

/* for-each: the entry `left` entries on, its key into s->key and its value into `val`. */
struct bs_next {
	struct bs_scratch *s;
	char *val;
	u64 left;
	int found;
};

static long bs_vm_next_cb(void *map, void *key, void *val, struct bs_next *c)
{
	if (c->left) {
		c->left--;
		return 0;
	}
	bpf_probe_read_kernel(c->s->key, start_size, key);
	bs_copy64(c->val, val);
	c->found = 1;
	return 1;
}

static __noinline u64 bs_vm_next(struct bs_scratch *s, char *val, u64 n)
{
	u32 id = bs_vm_map_id(s);
	void *m = bpf_map_lookup_elem(&vm_vals, &id);
	struct bs_next c = { .s = s, .val = val, .left = n };

	if (!m)
		return 0;
	bpf_for_each_map_elem(m, bs_vm_next_cb, &c, 0);
	return c.found;
}

/* join(): the strings of a NULL-terminated pointer array into BS_VM_JOIN_MAX slots. */
static __noinline void bs_vm_join(u8 *dst, u64 arr)
{
	for (int i = 0; i < BS_VM_JOIN_MAX; i++) {
		u64 p = 0;
		char *d = (char *)dst + i * BS_STR_MAX;

		d[0] = 0;
		if (bpf_probe_read_user(&p, sizeof(p), (void *)(arr + i * 8)) < 0 || !p)
			break;
		if (bpf_probe_read_user_str(d, BS_STR_MAX, (void *)p) < 0)
			d[0] = 0;
	}
}

/*
 * Counts a notice (enum bs_note) for probe or map `i`, and sends the first
 * of its kind at once: a header of its own, since s->ev may hold a record
 * being built.
 */
static __noinline void bs_vm_note(u32 what, u32 i)
{
	struct bs_event_hdr h = {};
	u64 *n;

	if (what == BS_NOTE_CUT)
		n = bpf_map_lookup_elem(&vm_cut, &i);
	else
		n = bpf_map_lookup_elem(&vm_full, &i);
	if (!n || __sync_fetch_and_add(n, 1))
		return;
	h.ts_ns = bpf_ktime_get_ns();
	h.probe = what | (i & BS_NOTE_INDEX);
	if (bpf_ringbuf_output(&events, &h, sizeof(h), BPF_RB_FORCE_WAKEUP))
		bs_count(&lost, BS_LOST_EVENTS);
}

/* The aggregation update of BS_VM_AGG, on the key in s->key, in its map. */
static __noinline void bs_vm_agg(struct bs_scratch *s, u32 bucket, u64 v, u32 flags)
{
	u32 id = bs_vm_map_id(s);
	void *m = bpf_map_lookup_elem(&vm_aggs, &id);

	if (!m || bs_agg_add_to(m, s, bucket, v, !(flags & BS_VMF_COUNT), flags & BS_VMF_MINMAX,
				flags & BS_VMF_SIGNED))
		bs_vm_note(BS_NOTE_FULL, id);
}

/* BS_VM_AGG on a keyless map (BS_VMF_SLOTS): its bucket's slot, by index. */
static __noinline void bs_vm_slot_agg(u32 id, u32 bucket, u64 v, u32 flags)
{
	void *m = bpf_map_lookup_elem(&vm_slots, &id);
	struct bs_agg_val *a = m ? bpf_map_lookup_elem(m, &bucket) : NULL;

	if (!a) {
		bs_vm_note(BS_NOTE_FULL, id);
		return;
	}
	bs_agg_val_add(a, v, !(flags & BS_VMF_COUNT), flags & BS_VMF_MINMAX, flags & BS_VMF_SIGNED);
}

/* A record of a script's action: printf arguments, join's strings... */
static __noinline void bs_vm_emit(struct bs_scratch *s, u32 action, u32 size)
{
	bs_event_head(s, action);
	/* A full record (join's BS_EVENT_DATA_MAX bytes) is allowed: clamp, not mask. */
	asm volatile("" : "+r"(size));
	size &= 2 * BS_EVENT_DATA_MAX - 1;
	if (size > BS_EVENT_DATA_MAX)
		size = BS_EVENT_DATA_MAX;
	bs_event_send(s, sizeof(struct bs_event_hdr) + size);
}

/*
 * The key's header for a plain map's value, or an aggregate's bucket 0
 * (delete): no bucket, no epoch.
 */
static __always_inline void bs_vm_key_whole(struct bs_scratch *s)
{
	((struct bs_key_hdr *)s->key)->bucket = 0;
	((struct bs_key_hdr *)s->key)->epoch = 0;
}

/* The plain map the key being built names. */
static __always_inline void *bs_vm_valmap(struct bs_scratch *s)
{
	u32 id = bs_vm_map_id(s);

	return bpf_map_lookup_elem(&vm_vals, &id);
}

/* A plain map's value for key s->key: number or string. */
static __always_inline void *bs_vm_val(struct bs_scratch *s)
{
	void *m = bs_vm_valmap(s);

	bs_vm_key_whole(s);
	return m ? bpf_map_lookup_elem(m, s->key) : NULL;
}

/* vals[key] = the value staged at v (BS_VAL_MAX bytes), for a new key. */
static __noinline void bs_vm_insert(struct bs_scratch *s, const void *v)
{
	void *m = bs_vm_valmap(s);

	if (!m || bpf_map_update_elem(m, s->key, v, BPF_ANY))
		bs_vm_note(BS_NOTE_FULL, bs_vm_map_id(s));
}

/*
 * BS_VMF_TASK: the current thread's own storage, which holds the map's
 * word (in->arg2), made there by a write (flags
 * BPF_LOCAL_STORAGE_GET_F_CREATE) only. The key is the thread's id, so
 * the thread's storage is the key's value.
 */
static __always_inline struct bs_vm_task_vals *bs_vm_task(u64 flags)
{
	if (!vm_task_on)
		return NULL;
	return bpf_task_storage_get(&vm_task, bpf_get_current_task_btf(), NULL, flags);
}

/*
 * One instruction. The program counter lives in the scratch map: the
 * callback's index only bounds the run.
 */
static int bs_vm_step(u64 i, struct bs_vm_ctx *vc)
{
	struct bs_scratch *s = vc->s;
	u32 pc = s->pc, at;
	struct bs_insn *in;

	if (pc >= vc->len)
		return 1;
	at = vc->start + pc;
	in = bpf_map_lookup_elem(&vm_code, &at);
	if (!in)
		return 1;
	s->pc = pc + 1;
	switch (in->op) {
	case BS_VM_HALT:
		s->pc = vc->len;
		return 1;
	case BS_VM_LDI:
		BS_R(in->dst) = in->imm;
		break;
	case BS_VM_SRC: {
		if (!BS_ON(BS_VM_SRC))
			break;
		u32 k = in->arg;
		struct bs_src *src = bpf_map_lookup_elem(&vm_srcs, &k);

		BS_R(in->dst) = src ? bs_read_num(vc->ctx, src, s, vc->idx) : 0;
		break;
	}
	case BS_VM_SRCSTR: {
		if (!BS_ON(BS_VM_SRCSTR))
			break;
		u32 k = in->arg;
		struct bs_src *src = bpf_map_lookup_elem(&vm_srcs, &k);

		/* Zeroed first: a comm fills 16 bytes, and keys hash all 64. */
		bs_zero_words(BS_SV(in->dst), BS_STR_MAX);
		if (src)
			bs_read_str(vc->ctx, src, s, BS_SV(in->dst));
		break;
	}
	case BS_VM_CSTR: {
		if (!BS_ON(BS_VM_CSTR))
			break;
		u32 k = in->arg;
		struct bs_str *c = bpf_map_lookup_elem(&strs, &k);

		if (c)
			bs_copy64(BS_SV(in->dst), c->s);
		break;
	}
	case BS_VM_STRPTR:
		if (!BS_ON(BS_VM_STRPTR))
			break;
		bs_vm_strptr(BS_SV(in->dst), BS_R(in->a),
			     in->flags & BS_VMF_REGLEN ? BS_R(in->b) : in->imm);
		break;
	case BS_VM_MOV:
		BS_R(in->dst) = BS_R(in->a);
		break;
	case BS_VM_SMOV:
		if (!BS_ON(BS_VM_SMOV))
			break;
		bs_copy64(BS_SV(in->dst), BS_SV(in->a));
		break;
	case BS_VM_ALU: {
		if (!BS_ON(BS_VM_ALU))
			break;
		u64 y = in->flags & BS_VMF_IMM ? (u64)in->imm : BS_R(in->b);

		BS_R(in->dst) = bs_vm_alu(in, BS_R(in->a), y);
		break;
	}
	case BS_VM_STREQ:
	case BS_VM_STREQC: {
		if (!BS_ON(BS_VM_STREQ) && !BS_ON(BS_VM_STREQC))
			break;
		const char *x = BS_SV(in->a), *y = BS_SV(in->b);
		u64 n = in->imm ? in->imm : BS_STR_MAX;
		u64 eq = 1;

		if (in->op == BS_VM_STREQC) {
			u32 k = in->arg;
			struct bs_str *c = bpf_map_lookup_elem(&strs, &k);

			if (!c) {
				BS_R(in->dst) = 0;
				break;
			}
			y = c->s;
		}
		for (int k = 0; k < BS_STR_MAX; k++) {
			if (k >= n)
				break;
			if (x[k] != y[k]) {
				eq = 0;
				break;
			}
			if (!x[k])
				break;
		}
		BS_R(in->dst) = eq;
		break;
	}
	case BS_VM_JMP:
		s->pc = in->arg;
		break;
	case BS_VM_JZ:
		if (!BS_R(in->a))
			s->pc = in->arg;
		break;
	case BS_VM_JNZ:
		if (BS_R(in->a))
			s->pc = in->arg;
		break;
	case BS_VM_KEYCLR:
	case BS_VM_KEY1: {
		if (!BS_ON(BS_VM_KEYCLR) && !BS_ON(BS_VM_KEY1))
			break;
		/*
		 * The map id, and zeros past this map's key (imm words from arg2):
		 * its parts are written whole, but another map's longer key may
		 * have left bytes there. One map's script clears nothing.
		 */
		u64 *w = (u64 *)(BS_KEYDATA + (in->arg2 & (BS_KEY_MAX - 1)));

		*(u64 *)BS_KEYDATA = in->arg;
		for (int k = 0; k < BS_KEY_MAX / 8; k++) {
			if (k >= in->imm)
				break;
			w[k] = 0;
		}
		if (in->op == BS_VM_KEY1)
			*(u64 *)(BS_KEYDATA + 8) = BS_R(in->a);
		break;
	}
	case BS_VM_KEYNUM:
		*(u64 *)(BS_KEYDATA + (in->arg & (BS_KEY_MAX - 1))) = BS_R(in->a);
		break;
	case BS_VM_KEYSTR:
		if (!BS_ON(BS_VM_KEYSTR))
			break;
	{
		/* The part's words only (arg2: its length): they hold the whole
		 * string and its NUL, the slot's zero padding the rest; the words
		 * after it belong to the next part or lie past the key. */
		u64 *d = (u64 *)(BS_KEYDATA + (in->arg & (BS_KEY_MAX - 1)));
		const u64 *q = (const u64 *)BS_SV(in->a);
		u32 len = in->arg2 ? in->arg2 : BS_STR_MAX;

		for (int k = 0; k < BS_STR_MAX / 8; k++)
			if (k * 8 < len)
				d[k] = q[k];
		break;
	}
	case BS_VM_BUCKET: {
		if (!BS_ON(BS_VM_BUCKET))
			break;
		u64 v = BS_R(in->a);

		if (in->flags & BS_VMF_LOG2) {
			if (((in->flags & BS_VMF_SIGNED) && (s64)v < 0))
				BS_R(in->dst) = 0;
			else
				BS_R(in->dst) = v ? 2 + bs_log2(v) : 1;
		} else {
			s64 sv = v, lo = in->imm;
			u64 step = in->arg ? in->arg : 1;
			u64 n;

			if (sv < lo) {
				BS_R(in->dst) = 0;
			} else {
				n = ((u64)(sv - lo)) / step;
				BS_R(in->dst) = n >= in->arg2 ? in->arg2 + 1 : n + 1;
			}
		}
		break;
	}
	case BS_VM_AGG: {
		if (!BS_ON(BS_VM_AGG))
			break;
		/* count(): no value, no bucket, no sum. */
		int count = in->flags & BS_VMF_COUNT;
		u32 bucket = !count && (in->flags & BS_VMF_BUCKET) ? BS_R(in->b) : 0;
		u64 v = count ? 0 : BS_R(in->a);

		if (in->flags & BS_VMF_SLOTS)
			bs_vm_slot_agg(in->arg, bucket, v, in->flags);
		else
			bs_vm_agg(s, bucket, v, in->flags);
		break;
	}
	case BS_VM_MSET:
	case BS_VM_MSETSTR: {
		if (!BS_ON(BS_VM_MSET) && !BS_ON(BS_VM_MSETSTR))
			break;
		if (in->flags & BS_VMF_TASK) {
			struct bs_vm_task_vals *t = bs_vm_task(BPF_LOCAL_STORAGE_GET_F_CREATE);
			u32 w = in->arg2 & (BS_VM_TASK_MAPS - 1);

			if (t) {
				t->v[w] = BS_R(in->a);
				t->set |= 1ull << w;
			} else {
				bs_vm_note(BS_NOTE_FULL, bs_vm_map_id(s));
			}
			break;
		}
		u64 *val = bs_vm_val(s);

		if (val) {
			/* In place: no copy of the 64-byte value through the stack. */
			if (in->op == BS_VM_MSET)
				*val = BS_R(in->a);
			else
				bpf_probe_read_kernel(val, BS_VAL_MAX, BS_SV(in->a));
			break;
		}
		/* A new key: the value is staged in the string slot it reads from, or in s->str. */
		if (in->op == BS_VM_MSET) {
			bs_zero_words(s->str.s, BS_STR_MAX);
			*(u64 *)s->str.s = BS_R(in->a);
			bs_vm_insert(s, s->str.s);
		} else {
			bs_vm_insert(s, BS_SV(in->a));
		}
		break;
	}
	case BS_VM_MGET: {
		if (!BS_ON(BS_VM_MGET))
			break;
		if (in->flags & BS_VMF_TASK) {
			struct bs_vm_task_vals *t = bs_vm_task(0);

			BS_R(in->dst) = t ? t->v[in->arg2 & (BS_VM_TASK_MAPS - 1)] : 0;
			break;
		}
		u64 *val = bs_vm_val(s);

		BS_R(in->dst) = val ? *val : 0;
		break;
	}
	case BS_VM_MGETSTR: {
		if (!BS_ON(BS_VM_MGETSTR))
			break;
		u64 *val = bs_vm_val(s);

		if (val)
			bpf_probe_read_kernel(BS_SV(in->dst), BS_STR_MAX, val);
		else
			BS_SV(in->dst)[0] = 0;
		break;
	}
	case BS_VM_MDEL: {
		if (!BS_ON(BS_VM_MDEL))
			break;
		u32 id = bs_vm_map_id(s);
		void *m;

		if (in->flags & BS_VMF_TASK) {
			/* 0 reads as no key does. */
			struct bs_vm_task_vals *t = bs_vm_task(0);
			u32 w = in->arg2 & (BS_VM_TASK_MAPS - 1);

			if (t) {
				t->v[w] = 0;
				t->set &= ~(1ull << w);
			}
			break;
		}

		bs_vm_key_whole(s);
		if (in->flags & BS_VMF_AGG)
			m = bpf_map_lookup_elem(&vm_aggs, &id);
		else
			m = bpf_map_lookup_elem(&vm_vals, &id);
		if (m)
			bpf_map_delete_elem(m, s->key);
		break;
	}
	case BS_VM_EVNUM:
		*(u64 *)(BS_EVDATA + (in->arg & (BS_EVENT_DATA_MAX - 1))) = BS_R(in->a);
		break;
	case BS_VM_EVSTR:
		if (!BS_ON(BS_VM_EVSTR))
			break;
		bs_copy64(BS_EVDATA + (in->arg & (BS_EVENT_DATA_MAX - 1)), BS_SV(in->a));
		break;
	case BS_VM_JOIN:
		if (!BS_ON(BS_VM_JOIN))
			break;
		/* The record holds at most BS_VM_JOIN_MAX strings after the header. */
		bs_vm_join(BS_EVDATA, BS_R(in->a));
		break;
	case BS_VM_EMIT:
		if (!BS_ON(BS_VM_EMIT))
			break;
		bs_vm_emit(s, in->arg, in->arg2);
		break;
	case BS_VM_READ: {
		if (!BS_ON(BS_VM_READ))
			break;
		/* 16 bytes, so a masked length (the verifier's bound) always fits. */
		u64 v[2] = {}, a = BS_R(in->a);
		u32 n = in->arg;

		asm volatile("" : "+r"(n));
		n &= 15;
		if (bpf_probe_read_kernel(v, n, (void *)a) < 0)
			bpf_probe_read_user(v, n, (void *)a);
		if (n < 8)
			v[0] = bs_extend(v[0], n, in->flags & BS_VMF_SIGNED);
		BS_R(in->dst) = v[0];
		break;
	}
	case BS_VM_NTOP:
		if (!BS_ON(BS_VM_NTOP))
			break;
		bs_vm_ntop(BS_SV(in->dst), in->flags & BS_VMF_REGLEN ? BS_R(in->b) : in->imm,
			   BS_R(in->a), BS_SV(in->a), in->arg);
		break;
	case BS_VM_STRSTR:
		if (!BS_ON(BS_VM_STRSTR))
			break;
		BS_R(in->dst) = bs_vm_strstr(BS_SV(in->a), BS_SV(in->b));
		break;
	case BS_VM_SIGNAL:
		if (!BS_ON(BS_VM_SIGNAL))
			break;
		bpf_send_signal(BS_R(in->a));
		break;
	case BS_VM_BUF:
		if (!BS_ON(BS_VM_BUF))
			break;
		bs_vm_buf((u8 *)BS_SV(in->dst), BS_R(in->a),
			  in->flags & BS_VMF_REGLEN ? BS_R(in->b) : in->imm);
		break;
	case BS_VM_USYM:
		if (!BS_ON(BS_VM_USYM))
			break;
		bs_zero_words(BS_SV(in->dst), BS_STR_MAX);
		*(u64 *)BS_SV(in->dst) = BS_R(in->a);
		*(u64 *)(BS_SV(in->dst) + 8) = bpf_get_current_task_btf()->tgid;
		break;
	case BS_VM_NEXT:
		if (!BS_ON(BS_VM_NEXT))
			break;
		BS_R(in->a) = bs_vm_next(s, BS_SV(in->dst), BS_R(in->b));
		break;
	case BS_VM_KEYGET:
		if (!BS_ON(BS_VM_KEYGET))
			break;
		/* arg2: a string part's length, 0 for a number. */
		if (in->arg2)
			bs_copy_part(BS_SV(in->dst), BS_KEYDATA + (in->arg & (BS_KEY_MAX - 1)),
				     in->arg2);
		else
			BS_R(in->dst) = *(u64 *)(BS_KEYDATA + (in->arg & (BS_KEY_MAX - 1)));
		break;
	case BS_VM_SVNUM:
		if (!BS_ON(BS_VM_SVNUM))
			break;
		BS_R(in->dst) = *(u64 *)BS_SV(in->a);
		break;
	default:
		break;
	}
	/* Stop at the end now, not one more callback later. */
	return s->pc >= vc->len;
}

static __always_inline int bs_vm_run(void *ctx, const struct bs_probe_cfg *cfg,
				     struct bs_scratch *s, u32 idx)
{
	struct bs_vm_ctx vc = {
		.ctx = ctx, .s = s, .idx = idx,
		.start = cfg->code_start, .len = cfg->code_len,
	};

	if (!use_vm)
		return 0;
	s->pc = 0;
	bpf_loop(BS_VM_STEPS, bs_vm_step, &vc, 0);
	if (s->pc < vc.len)
		bs_vm_note(BS_NOTE_CUT, idx);
	return 0;
}

#endif /* BPFSCOPE_VM_BPF_H */
