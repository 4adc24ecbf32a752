/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * The few kernel-internal types bpfscope's BPF programs touch. CO-RE
 * (preserve_access_index) relocates every field access against the running
 * kernel's BTF, so only the fields used need to be declared, and the layout
 * here does not have to match any particular kernel.
 */
#ifndef BPFSCOPE_KERNEL_H
#define BPFSCOPE_KERNEL_H

struct task_struct {
	int pid;
	int tgid;
	struct task_struct *group_leader;
	char comm[16];
} __attribute__((preserve_access_index));

#endif /* BPFSCOPE_KERNEL_H */
