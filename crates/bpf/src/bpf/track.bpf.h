/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Following `-- CMD` and its descendants, shared by trace.bpf.c and
 * profile.bpf.c: the `tracked` map of tgids, the lookup their target checks
 * use (bs_tracked), and bpfscope_fork, which adds a forked child to the map
 * when its parent is in it. Each object that includes this header gets a
 * map and a program of its own under these names, which user space fills
 * and attaches per object. An object includes it twice: first where the map
 * belongs among its maps, then, with BS_TRACK_PROGRAM defined, after its
 * other programs, so that bpfscope_fork stays the object's last program
 * (the order the skeleton and the -v load report list programs in) and the
 * map keeps its place in the skeleton's generated types.
 */
#ifndef BPFSCOPE_TRACK_BPF_H
#define BPFSCOPE_TRACK_BPF_H

#include "common.h"

/* tgids followed in the tracked target mode (BS_/BP_TARGET_TRACKED). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, u32);
	__type(value, u8);
} tracked SEC(".maps");

static __always_inline int bs_tracked(u32 tgid)
{
	return bpf_map_lookup_elem(&tracked, &tgid) != 0;
}

#endif /* BPFSCOPE_TRACK_BPF_H */

#if defined(BS_TRACK_PROGRAM) && !defined(BPFSCOPE_TRACK_PROGRAM_DONE)
#define BPFSCOPE_TRACK_PROGRAM_DONE

/* Follows forks of tracked processes, so `-- CMD` covers all descendants. */
SEC("raw_tp/sched_process_fork")
int BPF_PROG(bpfscope_fork, struct task_struct *parent, struct task_struct *child)
{
	u32 ptgid = BPF_CORE_READ(parent, tgid);
	u32 ctgid;
	u8 one = 1;

	if (!bs_tracked(ptgid))
		return 0;
	ctgid = BPF_CORE_READ(child, tgid);
	bpf_map_update_elem(&tracked, &ctgid, &one, BPF_ANY);
	return 0;
}

#endif /* BS_TRACK_PROGRAM */
