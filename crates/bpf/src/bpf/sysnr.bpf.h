/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The number of the syscall returning, from the registers the sys_exit raw
 * tracepoint hands over (its classic record has the number, the raw one
 * only the registers): per architecture, shared by the tracing programs and
 * the agent's syscall dispatcher.
 */
#ifndef BPFSCOPE_SYSNR_BPF_H
#define BPFSCOPE_SYSNR_BPF_H

#include "common.h"
#include "trace.h"

static __always_inline u64 bs_syscall_nr(struct pt_regs *regs)
{
#if defined(__TARGET_ARCH_arm64)
	__s32 nr;

	/* A plain load where the kernel can type the pointer (6.2+). */
	if (bpf_ksym_exists(bpf_rdonly_cast))
		nr = bpf_core_cast(regs, struct pt_regs___bs)->syscallno;
	else
		nr = BPF_CORE_READ((struct pt_regs___bs *)regs, syscallno);
	return nr < 0 ? BS_SYS_MAX : (u64)nr;
#else
	u64 nr = 0;

	if (bpf_ksym_exists(bpf_rdonly_cast))
		return bpf_core_cast(regs, struct pt_regs___bs)->orig_ax;
	bpf_probe_read_kernel(&nr, sizeof(nr), (void *)regs + __builtin_offsetof(struct pt_regs, orig_rax));
	return nr;
#endif
}

#endif /* BPFSCOPE_SYSNR_BPF_H */
