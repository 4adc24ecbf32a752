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
	int prio;
	struct task_struct *group_leader;
	char comm[16];
} __attribute__((preserve_access_index));

#if defined(__TARGET_ARCH_arm64)
/* Code addresses of user space fit in 48 bits; a return address signed by
 * pointer authentication carries its code in the bits above. */
#define BP_ADDR_MASK ((1ULL << 48) - 1)
#else
#define BP_ADDR_MASK (~0ULL)
#endif

struct file___bp;

/* A mapping: the profiler's unwinder reads all of these, the tracing
 * programs start, offset and file (bpf_find_vma). */
struct vm_area_struct {
	unsigned long vm_start;
	unsigned long vm_end;
	unsigned long vm_flags;
	unsigned long vm_pgoff;
	struct file___bp *vm_file;
} __attribute__((preserve_access_index));

#if defined(__TARGET_ARCH_arm64)
/* arm64's pt_regs as the kernel has it (the uapi header has only the user
 * registers, struct user_pt_regs, which come first): the syscall raw
 * tracepoints read the syscall's first argument and number after them. */
struct pt_regs___bs {
	__u64 regs[31];
	__u64 sp;
	__u64 pc;
	__u64 pstate;
	__u64 orig_x0;
	__s32 syscallno;
} __attribute__((preserve_access_index));
#else
/* x86-64's pt_regs under the kernel's field names (the uapi header's are
 * rdi, orig_rax, ...): the syscall raw tracepoints read the arguments and
 * number in place through bpf_core_cast. */
struct pt_regs___bs {
	unsigned long r10;
	unsigned long r9;
	unsigned long r8;
	unsigned long dx;
	unsigned long si;
	unsigned long di;
	unsigned long orig_ax;
} __attribute__((preserve_access_index));
#endif

#if defined(__TARGET_ARCH_arm64)
/* arm64 keeps the preempt count in the task's thread_info. */
struct thread_info___bs {
	__u64 preempt_count;
} __attribute__((preserve_access_index));
struct task_struct___ti {
	struct thread_info___bs thread_info;
} __attribute__((preserve_access_index));
#endif
/* NMI, hard IRQ, and a softirq being served (not merely bottom halves
 * disabled): include/linux/preempt.h's NMI_MASK | HARDIRQ_MASK | SOFTIRQ_OFFSET. */
#define BS_IRQ_BITS 0x00ff0100

/* A pointer as the kernel's BTF type its id names, read with plain loads
 * the kernel guards (6.2+; the programs check bpf_ksym_exists first). */
extern void *bpf_rdonly_cast(const void *obj, __u32 btf_id) __ksym __weak;

#endif /* BPFSCOPE_KERNEL_H */
