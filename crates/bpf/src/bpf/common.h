/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* Includes and small helpers every bpfscope BPF object uses. */
#ifndef BPFSCOPE_COMMON_H
#define BPFSCOPE_COMMON_H

#include <stdbool.h>
#include <linux/types.h>
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "kernel.h"

typedef __u8 u8;
typedef __u16 u16;
typedef __u32 u32;
typedef __u64 u64;
typedef __s64 s64;

/* Increment a per-CPU counter slot of an array map. */
static __always_inline void bs_count(void *map, u32 slot)
{
	u64 *v = bpf_map_lookup_elem(map, &slot);

	if (v)
		__sync_fetch_and_add(v, 1);
}

/*
 * Adds a forked child to a map of tracked tgids when its parent is tracked,
 * so that `-- CMD` covers all its descendants.
 */
static __always_inline int bs_follow_fork(void *tracked, struct task_struct *parent,
					  struct task_struct *child)
{
	u32 ptgid = BPF_CORE_READ(parent, tgid);
	u32 ctgid;
	u8 one = 1;

	if (!bpf_map_lookup_elem(tracked, &ptgid))
		return 0;
	ctgid = BPF_CORE_READ(child, tgid);
	bpf_map_update_elem(tracked, &ctgid, &one, BPF_ANY);
	return 0;
}

#endif /* BPFSCOPE_COMMON_H */
