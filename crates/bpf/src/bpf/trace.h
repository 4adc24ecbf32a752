/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * Shared between trace.bpf.c and user space (through the skeleton's
 * generated types): the per-attachment configuration that the generic
 * programs interpret. One struct bs_probe_cfg per probe; an attachment's
 * bpf_cookie (or, for syscalls, the syscall number) selects it.
 */
#ifndef BPFSCOPE_TRACE_H
#define BPFSCOPE_TRACE_H

/* Limits, as an enum so that the skeleton carries them to user space. */
enum bs_limits {
	BS_MAX_KEY_PARTS = 8,
	/* Postfix steps: 32 comparisons joined by 31 && or || (negations fold into the comparisons). */
	BS_MAX_FILTER_OPS = 64,
	BS_MAX_EMIT = 16,
	/* Key data after the 8-byte header; a power of two so offsets can be masked. */
	BS_KEY_MAX = 256,
	BS_STR_MAX = 64,
	/* Bytes of a syscall buffer argument (write's buf) copied into an event. */
	BS_BUF_MAX = 64,
	BS_COMM_LEN = 16,
	BS_EVENT_DATA_MAX = 1024,
	BS_NARGS = 16,
	/* Syscall numbers the dispatch table covers; exits live at BS_SYS_EXIT_BASE + nr. */
	BS_SYS_MAX = 512,
	BS_SYS_EXIT_BASE = 512,
	/* Argument slots: 0..11 are call or USDT arguments, then the return value, the syscall number. */
	BS_MAX_ARGS = 12,
	BS_ARG_RET = 12,
	BS_ARG_NR = 13,
	/* Fields that pair a latency start with its end. */
	BS_MAX_MATCH = 4,
	/* Pointers followed by one BTF-typed access such as skb->dev->name. */
	BS_MAX_DEREF = 4,
};

/* Where a value comes from. */
enum bs_src_kind {
	BS_SRC_NONE = 0,
	BS_SRC_PROBE = 1,  /* index of the probe */
	BS_SRC_COMM = 2,   /* current task's comm */
	BS_SRC_PID = 3,    /* tgid */
	BS_SRC_TID = 4,    /* kernel pid */
	BS_SRC_CPU = 5,
	BS_SRC_UID = 6,
	BS_SRC_CGROUP = 7, /* cgroup v2 id */
	BS_SRC_CTX = 8,    /* tracepoint record field at `off` */
	BS_SRC_ARG = 9,    /* argument slot `off` (see BS_ARG_*) */
	BS_SRC_KSTACK = 10, /* kernel stack id */
	BS_SRC_USTACK = 11, /* user stack id */
};

/* How the bytes at the source are to be read. */
enum bs_val_type {
	BS_T_NUM = 0,        /* integer of `size` bytes, `is_signed` */
	BS_T_STR_INLINE = 1, /* char array of `size` bytes in place */
	BS_T_STR_DATALOC = 2, /* __data_loc: u32 (len << 16 | offset) in the record */
	BS_T_STR_UPTR = 3,   /* pointer to a user-space string */
	BS_T_STR_KPTR = 4,   /* pointer to a kernel string */
	/*
	 * Pointer to user bytes whose length is another argument (write's buf
	 * and count): path[0] is the length's argument slot or record offset
	 * (same kind as the pointer). Output: u64 length as given, then up to
	 * BS_BUF_MAX bytes.
	 */
	BS_T_BUF_UPTR = 5,
};

struct bs_src {
	__u8 kind;      /* enum bs_src_kind */
	__u8 type;      /* enum bs_val_type */
	__u8 size;      /* numeric width, or inline string length */
	__u8 is_signed;
	__u16 off;      /* record offset or argument slot */
	__u16 out_off;  /* destination offset in the key or event data */
	/*
	 * Pointer walk from an argument (offsets resolved from BTF in user
	 * space): when `walk` is set, the argument is a pointer; the pointers
	 * stored at path[0..nderef) are followed in turn, and the value itself
	 * is read at leaf_off from the last one, each step a bounded probe read.
	 */
	__u8 walk;
	__u8 nderef;
	__u16 leaf_off;
	__u16 path[BS_MAX_DEREF];
	__u32 pad;
};

enum bs_op {
	BS_OP_EQ = 1,
	BS_OP_NE = 2,
	BS_OP_LT = 3,
	BS_OP_LE = 4,
	BS_OP_GT = 5,
	BS_OP_GE = 6,
	BS_OP_STR_EQ = 7,   /* exact string match */
	BS_OP_STR_NE = 8,
	BS_OP_GLOB = 9,     /* '*' and '?' wildcards */
	BS_OP_NGLOB = 10,
	BS_OP_AND = 11,
	BS_OP_OR = 12,
	BS_OP_NOT = 13,
	BS_OP_TRUE = 14,
};

/* One step of a postfix filter program over a stack of booleans. */
struct bs_filter_op {
	struct bs_src src;
	__u8 op;        /* enum bs_op */
	__u8 pad[3];
	__u32 str_idx;  /* index into the strs map for string ops */
	__u64 imm;      /* right-hand constant for numeric ops */
};

enum bs_agg {
	BS_AGG_COUNT = 0,
	BS_AGG_STATS = 1,
	BS_AGG_HIST_LOG2 = 2,
	BS_AGG_HIST_LINEAR = 3,
	BS_AGG_EVENT = 4,
};

enum bs_cfg_flags {
	BS_CFG_NEED_ARGS = 1,  /* fill argument slots before evaluating */
	BS_CFG_LAT_START = 2,  /* latency start: remember time and key by match key */
	BS_CFG_LAT_END = 4,    /* latency end: value is the time since the matching start */
	BS_CFG_SAME_TASK = 8,  /* latency end in its start's task (a function return): targeted too */
};

struct bs_probe_cfg {
	__u32 flags;     /* enum bs_cfg_flags */
	__u8 agg;        /* enum bs_agg */
	__u8 nkeys;
	__u8 nfilter;
	__u8 nemit;
	__u16 event_size; /* bytes of event data after the header */
	__u16 pad;
	__u32 lin_nbuckets; /* in-range buckets of a linear histogram */
	__u32 pair;      /* latency: start and end of a pair share this id */
	__u8 nmatch;     /* latency: match fields */
	__u8 pad2[3];
	struct bs_src match[BS_MAX_MATCH];
	struct bs_src value;
	__s64 lin_min;
	__u64 lin_step;
	struct bs_src keys[BS_MAX_KEY_PARTS];
	struct bs_filter_op filter[BS_MAX_FILTER_OPS];
	struct bs_src emit[BS_MAX_EMIT];
};

/* Aggregation key header; key data follows. The map's key size is set at load time. */
struct bs_key_hdr {
	__u32 bucket;
	__u32 epoch;
};

/* Pairs a latency end with its start: the pair id and the match field values. */
struct bs_match_key {
	__u32 pair;
	__u32 pad;
	__u64 vals[BS_MAX_MATCH];
};

struct bs_agg_val {
	__u64 count;
	__s64 sum;
	__s64 min; /* compared as unsigned when the value is unsigned */
	__s64 max;
};

struct bs_event_hdr {
	__u64 ts_ns;
	__u32 probe;
	__u32 pid;
	__u32 tid;
	__u32 cpu;
	/* Bit i: event field i could not be read (a faulting pointer). */
	__u32 faults;
	__u32 pad;
	char comm[BS_COMM_LEN];
};

struct bs_str {
	char s[BS_STR_MAX];
};

enum bs_lost {
	BS_LOST_EVENTS = 0,   /* ring buffer full */
	BS_LOST_KEYS = 1,     /* aggregation map full */
	BS_LOST_STACKS = 2,   /* stack could not be captured */
	BS_LOST_UNMATCHED = 3, /* end without a start (latency) */
	BS_LOST_NR = 4,
};

enum bs_target_mode {
	BS_TARGET_ALL = 0,
	BS_TARGET_TRACKED = 1, /* only tgids in the tracked map */
};

#endif /* BPFSCOPE_TRACE_H */
