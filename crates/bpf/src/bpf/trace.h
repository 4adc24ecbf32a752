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
	/* Ranges of the kernel's interrupt code in irq_text (state.bpf.h). */
	BS_IRQ_TEXTS = 3,
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
	/*
	 * Script machine (vm.bpf.h): registers, string slots, steps per run
	 * (bpf_loop's own limit, BPF_MAX_LOOPS: over a million passes of a
	 * small loop), instructions in all (as a BPF program's 1M).
	 */
	BS_VM_REGS = 32,
	BS_VM_STRS = 8,
	BS_VM_STEPS = 1 << 23,
	BS_VM_CODE_MAX = 1 << 20,
	/* Strings join() reads from an argv-style array. */
	BS_VM_JOIN_MAX = 16,
	/* Bytes of a plain (non-aggregating) map value: a number or a string. */
	BS_VAL_MAX = 64,
	/* Script maps of numbers keyed by tid that live in the thread's own storage. */
	BS_VM_TASK_MAPS = 8,
	/* Script aggregations with a per-CPU cache in front of their hash map (vm_cache). */
	BS_VM_CACHE_MAPS = 8,
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
	BS_SRC_NSECS = 12,  /* monotonic ns */
	BS_SRC_ELAPSED = 13, /* ns since the session's start (vm_t0) */
	BS_SRC_GID = 14,
	BS_SRC_CURTASK = 15, /* current task_struct address */
	BS_SRC_RAND = 16,
	BS_SRC_JIFFIES = 17,
};

/*
 * `off` of a BS_SRC_USTACK source: the probe is a uprobe at a function's
 * first instruction. On arm64 the caller is then only in the link register
 * (the frame-pointer walk starts at the caller's own record, and skips it):
 * its file offset relative to the probed instruction's goes in bits 32-62
 * of the stack's key word (signed; 0 when it is in another file). Bit 63
 * stays the sign of a failed capture.
 */
enum bs_ustack_flags {
	BS_USTACK_ENTRY = 1,
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
	/*
	 * enum bs_task_member, on a walk of no steps from a task_struct
	 * pointer (a sched tracepoint's task argument): the member, loaded
	 * directly where the kernel can type the pointer (6.2+), read at
	 * leaf_off otherwise.
	 */
	__u8 task;
	__u8 pad[3];
};

/* A task_struct member a sched record field copies (struct bs_src.task). */
enum bs_task_member {
	BS_TASK_NONE = 0,
	BS_TASK_PID = 1,
	BS_TASK_PRIO = 2,
	BS_TASK_COMM = 3,
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
	/*
	 * The agent's exposition: a log2 histogram whose buckets end at a power
	 * of two, inclusive (Prometheus `le`): 0 negatives, 1 zero, 2 + k holds
	 * (2^(k-1), 2^k]; and stats kept apart for negative values (bucket 1).
	 */
	BS_AGG_HIST_POW2 = 5,
	BS_AGG_STATS_SIGN = 6,
};

enum bs_cfg_flags {
	BS_CFG_NEED_ARGS = 1,  /* fill argument slots before evaluating */
	BS_CFG_LAT_START = 2,  /* latency start: remember time and key by match key */
	BS_CFG_LAT_END = 4,    /* latency end: value is the time since the matching start */
	BS_CFG_SAME_TASK = 8,  /* latency end in its start's task (a function return): targeted too */
	BS_CFG_VM = 16,        /* run the script machine's code at code_start */
	BS_CFG_SELF = 32,      /* a trigger in bpfscope itself (BEGIN, END, interval) */
};

/*
 * The script machine's operations (see vm.bpf.h). Registers r[], string
 * slots sv[], the key being built (s->key) and the record being built
 * (s->ev) live in the per-CPU scratch map.
 */
enum bs_vm_op {
	BS_VM_HALT = 0,
	BS_VM_LDI = 1,     /* r[dst] = imm */
	BS_VM_SRC = 2,     /* r[dst] = number from source arg (vm_srcs) */
	BS_VM_SRCSTR = 3,  /* sv[dst] = string from source arg */
	BS_VM_CSTR = 4,    /* sv[dst] = constant string arg (strs) */
	BS_VM_STRPTR = 5,  /* sv[dst] = string at address r[a] (user, then kernel); imm: max length (0: all) */
	BS_VM_MOV = 6,     /* r[dst] = r[a] */
	BS_VM_SMOV = 7,    /* sv[dst] = sv[a] */
	BS_VM_ALU = 8,     /* r[dst] = r[a] <arg: enum bs_vm_alu> (r[b] or imm with BS_VMF_IMM) */
	BS_VM_STREQ = 9,   /* r[dst] = sv[a] == sv[b]; imm: compare at most this many bytes (0: all) */
	BS_VM_JMP = 10,    /* pc = arg (relative to the probe's code_start) */
	BS_VM_JZ = 11,     /* if !r[a]: pc = arg */
	BS_VM_JNZ = 12,    /* if r[a]: pc = arg */
	BS_VM_KEYCLR = 13, /* key data: map id arg, then imm zero words from byte arg2 */
	BS_VM_KEYNUM = 14, /* key data at arg: r[a] (8 bytes) */
	BS_VM_KEYSTR = 15, /* key data at arg: sv[a], 64 bytes */
	BS_VM_BUCKET = 16, /* r[dst] = histogram bucket of r[a]: log2, or linear with min imm, step arg, arg2 buckets */
	BS_VM_AGG = 17,    /* aggs[key, bucket r[b] (BS_VMF_BUCKET)] += r[a]; BS_VMF_MINMAX: min/max too */
	BS_VM_MSET = 18,   /* vals[key] = r[a] */
	BS_VM_MSETSTR = 19, /* vals[key] = sv[a] */
	BS_VM_MGET = 20,   /* r[dst] = vals[key] (0 when missing) */
	BS_VM_MGETSTR = 21, /* sv[dst] = vals[key] ("" when missing) */
	BS_VM_MDEL = 22,   /* delete vals[key] (BS_VMF_AGG: aggs[key] of bucket 0) */
	BS_VM_EVNUM = 23,  /* record data at arg: r[a] */
	BS_VM_EVSTR = 24,  /* record data at arg: sv[a], 64 bytes */
	BS_VM_JOIN = 25,   /* record data at arg: up to BS_VM_JOIN_MAX strings from the pointer array at r[a] */
	BS_VM_EMIT = 26,   /* send the record: action arg, arg2 data bytes */
	BS_VM_READ = 28,   /* r[dst] = arg (1, 2, 4, 8) bytes at address r[a], kernel then user; BS_VMF_SIGNED extends */
	BS_VM_STREQC = 29, /* r[dst] = sv[a] == constant string arg (strs); imm: at most this many bytes */
	BS_VM_KEY1 = 30,   /* KEYCLR, then r[a] as the one key part (KEYNUM at 8) */
	/*
	 * sv[dst] = an IP address (ntop): byte 0 the family (imm, or r[b] with
	 * BS_VMF_REGLEN), bytes 8.. the address: r[a]'s 4 bytes (arg 0), 4 or 16
	 * bytes read at address r[a] (arg 4, 16), or from sv[a] (arg 36, 48).
	 */
	BS_VM_NTOP = 31,
	BS_VM_STRSTR = 32, /* r[dst] = sv[b] occurs in sv[a] (strcontains) */
	BS_VM_SIGNAL = 33, /* send signal r[a] to the current process (signal(), --unsafe) */
	/* sv[dst] = buf(): byte 0 the length n (r[b], or imm), then n <= 63 bytes at address r[a] */
	BS_VM_BUF = 34,
	BS_VM_USYM = 35,   /* sv[dst] = r[a] at 0, the current tgid at 8 (usym: named in user space) */
	/*
	 * for ($kv : @map): the map's entry number r[b] (the map is the key's
	 * map id, set by KEYCLR) into the key buffer (its key data) and sv[dst]
	 * (its value; an aggregate's count, sum, min, max); r[a] = 1 when there
	 * was one, 0 past the last.
	 */
	BS_VM_NEXT = 36,
	/*
	 * for-each's key members: r[dst] = the 8 bytes of key data at arg, or
	 * (arg2 1) sv[dst] = the 64 bytes there.
	 */
	BS_VM_KEYGET = 37,
	BS_VM_SVNUM = 38,  /* r[dst] = sv[a]'s first 8 bytes (for-each's number value) */
};

enum bs_vm_alu {
	BS_ALU_ADD = 0,
	BS_ALU_SUB = 1,
	BS_ALU_MUL = 2,
	BS_ALU_DIV = 3,
	BS_ALU_MOD = 4,
	BS_ALU_AND = 5,
	BS_ALU_OR = 6,
	BS_ALU_XOR = 7,
	BS_ALU_SHL = 8,
	BS_ALU_SHR = 9,
	BS_ALU_EQ = 10,
	BS_ALU_NE = 11,
	BS_ALU_LT = 12,
	BS_ALU_LE = 13,
	BS_ALU_GT = 14,
	BS_ALU_GE = 15,
	BS_ALU_NEG = 16,  /* -r[a] */
	BS_ALU_NOT = 17,  /* !r[a] */
	BS_ALU_BNOT = 18, /* ~r[a] */
	BS_ALU_BOOL = 19, /* r[a] != 0 */
	BS_ALU_BSWAP = 20, /* r[a]'s bytes reversed in its low imm bits (16, 32, 64) */
};

enum bs_vm_flags {
	BS_VMF_IMM = 1,    /* the second operand is imm */
	BS_VMF_SIGNED = 2, /* signed comparison, division, shift, extension */
	BS_VMF_MINMAX = 4,
	BS_VMF_AGG = 8,
	/* AGG: the map has no key: a per-CPU array of arg2 buckets (vm_slots), map id in arg */
	BS_VMF_SLOTS = 8,
	BS_VMF_LOG2 = 16,  /* BUCKET: log2 */
	/* MGET, MSET, MDEL: the map is word arg2 of the thread's own storage (vm_task) */
	BS_VMF_TASK = 16,
	BS_VMF_REGLEN = 32, /* STRPTR: the length limit is r[b], not imm */
	BS_VMF_COUNT = 64,  /* AGG: count only (no value, bucket or sum) */
	BS_VMF_BUCKET = 128, /* AGG: the bucket is r[b] (else 0) */
};

struct bs_insn {
	__u8 op;     /* enum bs_vm_op */
	__u8 dst;
	__u8 a;
	__u8 b;
	__u8 flags;  /* enum bs_vm_flags */
	__u8 pad[3];
	__u32 arg;
	__u32 arg2;
	__s64 imm;
};

struct bs_probe_cfg {
	__u32 flags;     /* enum bs_cfg_flags */
	__u8 agg;        /* enum bs_agg */
	__u8 nkeys;
	__u8 nfilter;
	__u8 nemit;
	__u16 event_size; /* bytes of event data after the header */
	__u8 nargs;      /* raw_tp: the tracepoint's arguments copied to slots */
	__u8 pad;
	__u32 lin_nbuckets; /* in-range buckets of a linear histogram */
	__u32 pair;      /* latency: start and end of a pair share this id */
	__u8 nmatch;     /* latency: match fields */
	__u8 pad2[3];
	/* Script machine code (BS_CFG_VM): the first instruction and the count. */
	__u32 code_start;
	__u32 code_len;
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

/*
 * The keyed plain path's per-CPU cache (fast.bpf.h): one struct bs_cache
 * per epoch half, BS_CACHE_N entries each, indexed by a hash of the key
 * data (at most two words) and bucket. The first key to reach an entry in
 * an epoch keeps it; others go to `aggs`. User space reads both.
 */
enum bs_cache_limits {
	BS_CACHE_N = 128,
};

struct bs_cache_ent {
	__u64 k[2];
	__u32 bucket;
	__u32 used;
	/* Taken (1) while a run updates the entry: a nested run goes to the hash map. */
	__u32 lock;
	__u32 pad;
	struct bs_agg_val val;
};

struct bs_cache {
	struct bs_cache_ent e[BS_CACHE_N];
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
	BS_LOST_NESTED = 4,   /* a run nested in another on its CPU */
	BS_LOST_NR = 5,
};

/*
 * A script's notices: a record whose header's `probe` has one of these
 * bits is not an action's. The first run of a probe cut short at
 * BS_VM_STEPS (the low bits: the probe's index) and the first update a
 * full map refused (the low bits: the map's id) each send one at once;
 * vm_cut and vm_full count every occurrence.
 */
enum bs_note {
	BS_NOTE_CUT = 0x40000000,
	BS_NOTE_FULL = 0x20000000,
	BS_NOTE_INDEX = 0x0fffffff,
};

enum bs_target_mode {
	BS_TARGET_ALL = 0,
	BS_TARGET_TRACKED = 1, /* only tgids in the tracked map */
};

/*
 * Where bench/event_cost.py stops the programs to measure each stage of
 * the path (bench_stage in state.bpf.h); BS_STAGE_OFF in every other run.
 */
enum bs_bench_stage {
	BS_STAGE_OFF = 0,
	BS_STAGE_ENTRY = 1,    /* at the program's entry: an empty program */
	BS_STAGE_DISPATCH = 2, /* the syscall's slot looked up (a syscall with a probe), or the cookie read */
	BS_STAGE_CONFIG = 3,   /* the probe's configuration and the scratch area */
	BS_STAGE_TARGET = 4,   /* the target check passed */
	BS_STAGE_FILTER = 5,   /* arguments read and the filter passed */
	BS_STAGE_KEY = 6,      /* the key built; after it only the aggregation's update */
};

#endif /* BPFSCOPE_TRACE_H */
