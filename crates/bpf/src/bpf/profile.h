/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * Shared between profile.bpf.c and user space (through the skeleton's
 * generated types): the in-kernel stack aggregation of `bpfscope profile`.
 * Samples are counted per (process, kernel stack, user stack); only the
 * unique stacks and their counts ever cross to user space.
 */
#ifndef BPFSCOPE_PROFILE_H
#define BPFSCOPE_PROFILE_H

enum bp_limits {
	BP_COMM_LEN = 16,
	/* Frames per stack; the kernel's default perf_event_max_stack. */
	BP_MAX_DEPTH = 127,
	BP_BUILD_ID_SIZE = 20,
};

/* Aggregation key. A stack id below zero means "no such stack". */
struct bp_key {
	__u32 tgid;
	__s32 kstack;
	__s32 ustack;
	__u32 pad;
};

struct bp_val {
	/* Samples (on-CPU) or nanoseconds blocked (off-CPU). */
	__u64 value;
	/* Samples or off-CPU intervals summed into value. */
	__u64 count;
	/* The process's name (its group leader's comm) when the key was created. */
	char comm[BP_COMM_LEN];
};

/* Off-CPU: where a thread was when it was switched out. */
struct bp_offcpu_start {
	__u64 ts_ns;
	struct bp_key key;
};

/* Ring buffer record: a process was sampled for the first time. */
struct bp_new_proc {
	__u32 tgid;
	__u32 pad;
};

enum bp_lost {
	/* A kernel stack could not be stored (map full or hash collision). */
	BP_LOST_KSTACK = 0,
	/* A user stack could not be stored. */
	BP_LOST_USTACK = 1,
	/* The aggregation map was full. */
	BP_LOST_KEYS = 2,
	/* A new-process notification did not fit the ring buffer. */
	BP_LOST_NOTIFY = 3,
	/* Off-CPU: too many threads switched out at once to remember. */
	BP_LOST_OFFCPU = 4,
	/* Not losses: where every run of the CPU sampler went, so that user
	 * space can account for each sample (runs = idle + other + stored +
	 * BP_LOST_KEYS). */
	BP_SEEN_RUNS = 5,
	BP_SEEN_IDLE = 6,
	BP_SEEN_OTHER = 7,
	BP_LOST_NR = 8,
};

enum bp_target_mode {
	BP_TARGET_ALL = 0,
	BP_TARGET_TRACKED = 1, /* tgids in the tracked map */
	BP_TARGET_CGROUP = 2,  /* tasks in the cgroup subtree */
};

enum bp_stacks {
	BP_STACKS_KERNEL = 1,
	BP_STACKS_USER = 2,
};

#endif /* BPFSCOPE_PROFILE_H */
