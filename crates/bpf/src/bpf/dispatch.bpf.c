// SPDX-License-Identifier: GPL-2.0
/*
 * One raw_tp on sys_enter and one on sys_exit for many trace objects (the
 * agent's metrics): each syscall's slot in `sys_progs` holds the program of
 * the object that traces it, which this program tail-calls with its own
 * context. A syscall no object traces costs this program's run and an
 * empty slot's lookup, once, however many objects there are; each object
 * keeps its own maps, configuration and epoch.
 */
#include "common.h"
#include "trace.h"
#include "sysnr.bpf.h"

char LICENSE[] SEC("license") = "GPL";

/* Slots as trace.bpf.c's sys_probes: the syscall number on entry,
 * BS_SYS_EXIT_BASE + the number on exit. */
struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, BS_SYS_EXIT_BASE + BS_SYS_MAX);
	__type(key, u32);
	__type(value, u32);
} sys_progs SEC(".maps");

SEC("raw_tp/sys_enter")
int bpfscope_dispatch_in(u64 *ctx)
{
	/* ctx[1] is the syscall number. */
	u64 nr = ctx[1];

	if (nr < BS_SYS_MAX)
		bpf_tail_call(ctx, &sys_progs, nr);
	return 0;
}

SEC("raw_tp/sys_exit")
int bpfscope_dispatch_out(u64 *ctx)
{
	u64 nr = bs_syscall_nr((struct pt_regs *)ctx[0]);

	if (nr < BS_SYS_MAX)
		bpf_tail_call(ctx, &sys_progs, BS_SYS_EXIT_BASE + nr);
	return 0;
}
