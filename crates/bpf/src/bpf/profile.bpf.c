// SPDX-License-Identifier: GPL-2.0
/*
 * bpfscope's profiler. bpfscope_prof runs on a software cpu-clock perf
 * event on every CPU; bpfscope_offcpu runs at every context switch. Both
 * take the current task's kernel stack (plain addresses) and user stack
 * (unwound with unwind tables where a file has one, frame pointers where
 * not: unwind.bpf.h; each frame a file id + file offset) into `stack_map`,
 * keyed by a hash of their frames, and count the pair per process in
 * `counts`, so only unique stacks reach user space, once, at the end. The
 * first sample of a process, and the first sighting of a file, are
 * announced on a ring buffer: user space snapshots the process's mappings
 * (for paths) and loads the file's unwind table.
 */
#include "common.h"
#include "profile.h"

char LICENSE[] SEC("license") = "GPL";

#define EFAULT 14
#define PF_KTHREAD 0x00200000

/* Only the fields used here; CO-RE relocates them (see kernel.h). */
struct task_struct___bp {
	unsigned int flags;
} __attribute__((preserve_access_index));

const volatile u32 self_tgid = 0;
const volatile u32 target_mode = BP_TARGET_ALL;
const volatile u32 stacks = BP_STACKS_KERNEL | BP_STACKS_USER;
/* BP_TARGET_CGROUP: the cgroup's id and its depth below the root. */
const volatile u64 target_cgroup = 0;
const volatile u32 cgroup_level = 0;
/* Off-CPU intervals shorter than this are not counted. */
const volatile u64 min_block_ns = 0;
/* Key samples by thread name and cgroup too (struct bp_key). */
const volatile u32 key_labels = 0;
/* The current readout period, set by user space (struct bp_key). */
u32 epoch = 0;

/* Keeps ABI types in BTF so the skeleton generates them for user space. */
struct bp_abi {
	enum bp_limits limits;
	enum bp_lost lost;
	enum bp_target_mode target_mode;
	enum bp_stacks stacks;
	struct bp_key key;
	struct bp_val val;
	struct bp_offcpu_start start;
	struct bp_note note;
	enum bp_note_kind note_kind;
	enum bp_frame frame;
	enum bp_vdso vdso;
	enum bp_file_state file_state;
	struct bp_stack_head stack_head;
	struct bp_file file;
	struct bp_file_key file_key;
	struct bp_proc proc;
	struct bp_build_args build_args;
	struct bp_interp interp;
	struct bp_code_note code_note;
	enum bp_interp_kind interp_kind;
	enum bp_interp_limits interp_limits;
	enum bp_py_none py_none;
};
const volatile struct bp_abi bp_abi_types = {};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384); /* sized at load time */
	__type(key, struct bp_key);
	__type(value, struct bp_val);
} counts SEC(".maps");

/* Processes already announced to user space. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, u32);
	__type(value, u8);
} seen SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 << 10);
} procs SEC(".maps");

/* Off-CPU: thread id -> when and where it was switched out. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 32768);
	__type(key, u32);
	__type(value, struct bp_offcpu_start);
} starts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, BP_LOST_NR);
	__type(key, u32);
	__type(value, u64);
} lost SEC(".maps");

/* `tracked` (track.bpf.h): the tgids profiled in BP_TARGET_TRACKED mode. */
#include "track.bpf.h"
#include "unwind.bpf.h"

static __always_inline int bp_target_ok(u32 tgid)
{
	if (tgid == self_tgid)
		return 0;
	if (target_mode == BP_TARGET_TRACKED)
		return bs_tracked(tgid);
	if (target_mode == BP_TARGET_CGROUP)
		return bpf_get_current_ancestor_cgroup_id(cgroup_level) == target_cgroup;
	return 1;
}

/* The current task's stacks into key (0: none, or not stored and counted). */
static __always_inline void bp_stacks(void *ctx, struct task_struct *t, struct bp_key *key)
{
	struct task_struct___bp *tb = (void *)t;

	if (stacks & BP_STACKS_KERNEL)
		key->kstack = bp_kernel_stack(ctx);
	if ((stacks & BP_STACKS_USER) && !(BPF_CORE_READ(tb, flags) & PF_KTHREAD))
		key->ustack = bp_user_stack(t, key->tgid);
	if (key_labels) {
		key->cgroup = bpf_get_current_cgroup_id();
		__builtin_memcpy(key->thread, t->comm, BP_COMM_LEN);
	}
}

static __always_inline void bp_announce(u32 tgid)
{
	struct bp_note *n;
	u8 one = 1;

	/* User space reads a process's mappings for its user frames only. */
	if (!(stacks & BP_STACKS_USER))
		return;
	if (bpf_map_lookup_elem(&seen, &tgid))
		return;
	if (bpf_map_update_elem(&seen, &tgid, &one, BPF_NOEXIST))
		return;
	n = bpf_ringbuf_reserve(&procs, sizeof(*n), 0);
	if (!n) {
		bs_count(&lost, BP_LOST_NOTIFY);
		return;
	}
	__builtin_memset(n, 0, sizeof(*n));
	n->kind = BP_NOTE_PROC;
	n->tgid = tgid;
	bpf_ringbuf_submit(n, 0);
}

static __always_inline void bp_add(struct bp_key *key, u64 value, struct task_struct *t)
{
	struct bp_val *v;

	/* The period the sample is added in, not the one its start was taken
	 * in (off-CPU): a period already read out is not written again. */
	key->epoch = epoch;
	v = bpf_map_lookup_elem(&counts, key);
	if (!v) {
		struct bp_val nv = {};
		struct task_struct *leader = t->group_leader;

		__builtin_memcpy(nv.comm, leader->comm, BP_COMM_LEN);
		bpf_map_update_elem(&counts, key, &nv, BPF_NOEXIST);
		v = bpf_map_lookup_elem(&counts, key);
		if (!v) {
			bs_count(&lost, BP_LOST_KEYS);
			return;
		}
		bp_announce(key->tgid);
	}
	/* Atomics: the same key is counted from every CPU. */
	__sync_fetch_and_add(&v->value, value);
	__sync_fetch_and_add(&v->count, 1);
}

SEC("perf_event")
int bpfscope_prof(struct bpf_perf_event_data *ctx)
{
	struct task_struct *t = bpf_get_current_task_btf();
	struct bp_key key = {};

	bs_count(&lost, BP_SEEN_RUNS);
	/* The idle task: not work anyone asked about. */
	if (t->pid == 0) {
		bs_count(&lost, BP_SEEN_IDLE);
		return 0;
	}
	key.tgid = t->tgid;
	if (!bp_target_ok(key.tgid)) {
		bs_count(&lost, BP_SEEN_OTHER);
		return 0;
	}
	/* Counted even without frames (e.g. user-mode samples with
	 * --kernel-only), so totals stay the time on CPU. */
	bp_stacks(ctx, t, &key);
	bp_add(&key, 1, t);
	return 0;
}

/*
 * At a switch, `prev` is still the current task: remember where it stops.
 * When a remembered thread is switched back in, the time it was away is
 * added to the stacks it stopped at.
 */
SEC("tp_btf/sched_switch")
int BPF_PROG(bpfscope_offcpu, _Bool preempt, struct task_struct *prev, struct task_struct *next)
{
	u64 now = bpf_ktime_get_ns();
	struct bp_offcpu_start *st;
	u32 tid = prev->pid;

	if (tid && bp_target_ok(prev->tgid)) {
		struct bp_offcpu_start s = { .ts_ns = now };

		s.key.tgid = prev->tgid;
		bp_stacks(ctx, bpf_get_current_task_btf(), &s.key);
		if (bpf_map_update_elem(&starts, &tid, &s, BPF_ANY))
			bs_count(&lost, BP_LOST_OFFCPU);
	}
	tid = next->pid;
	if (!tid)
		return 0;
	st = bpf_map_lookup_elem(&starts, &tid);
	if (!st)
		return 0;
	if (now - st->ts_ns >= min_block_ns) {
		struct bp_key key = st->key;

		bp_add(&key, now - st->ts_ns, next);
	}
	bpf_map_delete_elem(&starts, &tid);
	return 0;
}

/*
 * After exec a process maps other files: forget that it was announced and
 * its mappings, so its next sample reads them again and announces it.
 */
SEC("raw_tp/sched_process_exec")
int bpfscope_exec(void *ctx)
{
	u32 tgid = bpf_get_current_task_btf()->tgid;

	bpf_map_delete_elem(&seen, &tgid);
	bpf_map_delete_elem(&procmaps, &tgid);
	/* The new image and its dynamic loader are mapped by now; libraries
	 * follow through mmap (bpfscope_mmap). */
	if ((stacks & BP_STACKS_USER) && bp_target_ok(tgid))
		bp_build_proc(bpf_get_current_task_btf(), tgid);
	return 0;
}

/*
 * A forked child maps what its parent maps: it starts with a copy of the
 * parent's mappings (a shell's child runs the shell's code until it execs).
 */
SEC("raw_tp/sched_process_fork")
int BPF_PROG(bpfscope_fork_maps, struct task_struct *parent, struct task_struct *child)
{
	u32 ptgid = BPF_CORE_READ(parent, tgid);
	u32 ctgid = BPF_CORE_READ(child, tgid);
	struct bp_proc *p;

	if (ptgid == ctgid)
		return 0;
	p = bpf_map_lookup_elem(&procmaps, &ptgid);
	if (p)
		bpf_map_update_elem(&procmaps, &ctgid, p, BPF_ANY);
	return 0;
}

struct sys_exit_ctx___bp {
	u64 common;
	long syscall_nr;
	long ret;
};

/*
 * After an mmap that made executable memory (ld.so mapping a library's
 * code, dlopen) in a process whose mappings are known: read them again,
 * here, where interrupts are on, before its next sample needs them.
 */
SEC("tracepoint/syscalls/sys_exit_mmap")
int bpfscope_mmap(struct sys_exit_ctx___bp *ctx)
{
	struct task_struct *t = bpf_get_current_task_btf();
	struct bpf_iter_task_vma it;
	struct vm_area_struct *v;
	u32 tgid = t->tgid;
	int exec = 0;

	if ((unsigned long)ctx->ret >= (unsigned long)-4095)
		return 0;
	if (!bpf_map_lookup_elem(&procmaps, &tgid) || !bpf_ksym_exists(bpf_iter_task_vma_new))
		return 0;
	if (!bpf_iter_task_vma_new(&it, t, ctx->ret)) {
		v = bpf_iter_task_vma_next(&it);
		exec = v && v->vm_start <= (unsigned long)ctx->ret && (v->vm_flags & VM_EXEC);
	}
	bpf_iter_task_vma_destroy(&it);
	if (exec)
		bp_build_proc(t, tgid);
	return 0;
}

extern struct task_struct *bpf_task_from_pid(__s32 pid) __weak __ksym;
extern void bpf_task_release(struct task_struct *p) __weak __ksym;

/* Run by user space (BPF_PROG_TEST_RUN): read a process's mappings. */
SEC("syscall")
int bpfscope_build(struct bp_build_args *args)
{
	struct task_struct *t;
	struct bp_proc *p;
	int n = -1;

	if (!bpf_ksym_exists(bpf_task_from_pid))
		return -1;
	t = bpf_task_from_pid(args->pid);
	if (!t)
		return -1;
	p = bp_build_proc(t, t->tgid);
	if (p)
		n = p->n;
	bpf_task_release(t);
	return n;
}

/* A process's mappings go when its group leader exits (a process whose
 * leader left early has them read again on its next request). */
SEC("raw_tp/sched_process_exit")
int bpfscope_exit(void *ctx)
{
	struct task_struct *t = bpf_get_current_task_btf();
	u32 tgid = t->tgid;

	if (t->pid == tgid)
		bpf_map_delete_elem(&procmaps, &tgid);
	return 0;
}

/*
 * bpfscope_fork (track.bpf.h): follows forks of tracked processes, so
 * `-- CMD` profiles all descendants. After the other programs, so it stays
 * this object's last.
 */
#define BS_TRACK_PROGRAM
#include "track.bpf.h"
