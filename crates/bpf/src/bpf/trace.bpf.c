// SPDX-License-Identifier: GPL-2.0
/*
 * bpfscope's generic tracing programs. Each attach type has one program;
 * every probe is an attachment of that program whose bpf_cookie (minus one)
 * indexes its struct bs_probe_cfg in the `probes` map. Syscall probes share
 * one raw_tp attachment on sys_enter/sys_exit and find their configuration
 * through the syscall number instead. Filtering, keys and aggregation all
 * happen here, so only results (or selected events) reach user space.
 *
 * This file holds the entry points and the glue between the parts, each in
 * a header of its own: state.bpf.h (constants, maps, scratch), read.bpf.h
 * (sources), filter.bpf.h (the filter machine), agg.bpf.h (keys,
 * histograms, aggregates), emit.bpf.h (events) and track.bpf.h (`-- CMD`
 * and its forks, shared with profile.bpf.c).
 */
#include "common.h"
#include "trace.h"
#include <bpf/usdt.bpf.h>

char LICENSE[] SEC("license") = "GPL";

#include "state.bpf.h"
#include "read.bpf.h"
#include "filter.bpf.h"
#include "agg.bpf.h"
#include "emit.bpf.h"
#include "vm.bpf.h"
#include "fast.bpf.h"
#include "sysnr.bpf.h"

/* Kernel stack frames looked at for interrupt code (a softirq's TCP
 * receive path is about 25 deep). */
#define BS_IRQ_FRAMES 40
_Static_assert(BS_IRQ_FRAMES * 8 <= sizeof(((struct bs_scratch *)0)->ev),
	       "the frames are taken into the event buffer");

/*
 * Whether this event ran in an interrupt (a hard IRQ, a softirq, an NMI):
 * then the current task is whichever one it interrupted, and the event is
 * not that task's. arm64 keeps the preempt count, which says it, in the
 * task; x86 in a per-CPU variable, which programs can read only on kernels
 * built with KALLSYMS_ALL (this machine's is not), so there the kernel
 * stack is looked at for the interrupt code user space found in kallsyms
 * (irq_text). The stack is neither: 6.13+ runs a program with a large
 * frame on a per-CPU stack, and an interrupt of user mode runs on the
 * task's. Asked only when the task is bpfscope's, off the common path.
 */
static __always_inline int bs_in_irq(void *ctx, struct bs_scratch *s,
				     const struct task_struct *t)
{
#if defined(__TARGET_ARCH_arm64)
	return ((const struct task_struct___ti *)t)->thread_info.preempt_count & BS_IRQ_BITS;
#else
	u64 *ip = (u64 *)s->ev;
	long n = bpf_get_stack(ctx, ip, BS_IRQ_FRAMES * 8, 0);

	for (int i = 0; i < BS_IRQ_FRAMES; i++) {
		if (i * 8 >= n)
			break;
		for (int r = 0; r < BS_IRQ_TEXTS; r++) {
			u64 lo = irq_text[2 * r], hi = irq_text[2 * r + 1];

			if (ip[i] - lo < hi - lo)
				return 1;
		}
	}
	return 0;
#endif
}

/*
 * Whether this event belongs to the traced processes. Latency ends are
 * exempt: they often run in another context (a block I/O completion in an
 * interrupt) and only count when a traced start is waiting for them;
 * except function returns, which run in the task of their entry.
 */
static __always_inline int bs_target_ok(const struct bs_probe_cfg *cfg,
					const struct task_struct *t, void *ctx,
					struct bs_scratch *s, int may_irq)
{
	u32 tgid;

	if ((cfg->flags & BS_CFG_LAT_END) && !(cfg->flags & BS_CFG_SAME_TASK))
		return 1;
	tgid = t->tgid;
	/* A script's BEGIN, END and interval run in bpfscope itself, and only there. */
	if (cfg->flags & BS_CFG_SELF)
		return tgid == self_tgid;
	/* bpfscope's own events are never traced (printing them would feed
	 * back), but an interrupt that lands on it (a packet's softirq, a
	 * timer) is the kernel's event, and bpftrace sees it. */
	if (tgid == self_tgid && !(may_irq && bs_in_irq(ctx, s, t)))
		return 0;
	if (target_mode == BS_TARGET_TRACKED && !bs_tracked(tgid))
		return 0;
	return 1;
}

/*
 * Everything after the probe is identified and its arguments are in place.
 * t is the current task, got once per run by the entry point, where the
 * target check, a comm filter and a builtin key each called the helper
 * (count --by comm filtered by comm: 90.5 -> 82.3 ns per run).
 */
static __always_inline int bs_handle(void *ctx, const struct bs_probe_cfg *cfg,
				     struct bs_scratch *s, u32 idx, struct task_struct *t)
{
	u64 v = 0;

	/*
	 * A script session has only script probes, a verbs session none:
	 * with use_vm frozen, the verifier checks one side, not both.
	 */
	if (use_vm) {
		/* Ended: only END (a trigger) still runs. */
		if (*(volatile u32 *)&vm_stopped && !(cfg->flags & BS_CFG_SELF))
			return 0;
		return cfg->flags & BS_CFG_VM ? bs_vm_run(ctx, cfg, s, idx) : 0;
	}
	if (fast_path)
		return bs_plain(ctx, cfg, s, idx, t);
	if (cfg->nfilter && !bs_filter(ctx, cfg, s, idx))
		return 0;
	BS_STAGE(BS_STAGE_FILTER);
	if (cfg->agg == BS_AGG_EVENT) {
		bs_emit(ctx, cfg, s, idx);
		return 0;
	}
	if (cfg->flags & BS_CFG_LAT_END) {
		u64 *start;

		bs_match(ctx, cfg, s, idx);
		start = bpf_map_lookup_elem(&starts, &s->mk);
		if (!start) {
			bs_count(&lost, BS_LOST_UNMATCHED);
			return 0;
		}
		if (fast_slots) {
			/*
			 * Keyless: the start record is its timestamp, and the
			 * pair's aggregate is a slot of a per-CPU array
			 * (fast.bpf.h), where the general path copies the
			 * record and hashes an empty key.
			 */
			v = bpf_ktime_get_ns() - *start;
			bpf_map_delete_elem(&starts, &s->mk);
			BS_STAGE(BS_STAGE_KEY);
			bs_slot_add(bs_bucket_of(fast_agg, cfg, v), v, cfg->value.is_signed);
			return 0;
		}
		/* The start side's key data comes first; end-side parts then fill their slots. */
		bpf_probe_read_kernel(s->key, start_size, start);
		v = bpf_ktime_get_ns() - *(u64 *)s->key;
		bpf_map_delete_elem(&starts, &s->mk);
	}
	bs_keys(ctx, cfg, s, idx);
	BS_STAGE(BS_STAGE_KEY);
	if (cfg->flags & BS_CFG_LAT_START) {
		/* The 8-byte key header holds the timestamp in a start record. */
		*(u64 *)s->key = bpf_ktime_get_ns();
		bs_match(ctx, cfg, s, idx);
		if (bpf_map_update_elem(&starts, &s->mk, s->key, BPF_ANY))
			bs_count(&lost, BS_LOST_KEYS);
		return 0;
	}
	if (cfg->agg != BS_AGG_COUNT && !(cfg->flags & BS_CFG_LAT_END))
		v = bs_num(ctx, &cfg->value, s, idx);
	bs_aggregate(cfg, s, v);
	return 0;
}

static __always_inline struct bs_scratch *bs_scratch(void)
{
	u32 zero = 0;

	return bpf_map_lookup_elem(&scratch, &zero);
}

/*
 * `run` (a call) on this CPU's scratch area s, unless another run holds
 * it: a program on an interrupt's tracepoint that fires while a raw
 * tracepoint's program runs on that CPU (the kernel keeps only classic
 * tracepoint programs from nesting in each other) would overwrite the
 * area under it, and both events came out wrong or not at all, uncounted
 * (1-5 of 200,000 getppid lines here, beside a timer probe). The nested
 * run is dropped and counted instead, as the kernel counts a classic
 * tracepoint program it skips. The stores are volatile and fenced: an
 * interrupt sees them in program order.
 */
#define BS_ON_SCRATCH(s, run)                                  \
	({                                                     \
		int __ret = 0;                                 \
		if (*(volatile u32 *)&(s)->busy) {             \
			bs_count(&lost, BS_LOST_NESTED);       \
		} else {                                       \
			*(volatile u32 *)&(s)->busy = 1;       \
			asm volatile("" ::: "memory");         \
			__ret = (run);                         \
			asm volatile("" ::: "memory");         \
			*(volatile u32 *)&(s)->busy = 0;       \
		}                                              \
		__ret;                                         \
	})

/* Probe index from the attachment's cookie (index + 1; 0 means none). */
static __always_inline int bs_cookie_probe(void *ctx, u32 *idx)
{
	u64 cookie = bpf_get_attach_cookie(ctx);

	if (!cookie)
		return 0;
	*idx = cookie - 1;
	return 1;
}

/* The probe the attachment's cookie names, its configuration and this
 * CPU's scratch area; 0 where one is missing (or a bench stage ends here). */
static __always_inline int bs_cookie_find(void *ctx, u32 *idx, struct bs_probe_cfg **cfg,
					  struct bs_scratch **s)
{
	BS_STAGE(BS_STAGE_ENTRY);
	if (!bs_cookie_probe(ctx, idx))
		return 0;
	BS_STAGE(BS_STAGE_DISPATCH);
	*cfg = bpf_map_lookup_elem(&probes, idx);
	*s = bs_scratch();
	if (!*cfg || !*s)
		return 0;
	BS_STAGE(BS_STAGE_CONFIG);
	return 1;
}

/* Syscall arguments from pt_regs, in the syscall calling convention. */
static __always_inline void bs_syscall_args(struct pt_regs *regs, struct bs_scratch *s)
{
	/*
	 * Six plain loads where the kernel can type the pointer (6.2+), in
	 * place of a helper call that copies 64 bytes (bench/event_cost.py's
	 * field shapes: 7-23 ns less per run, medians of 6 attachments).
	 */
	if (bpf_ksym_exists(bpf_rdonly_cast)) {
		struct pt_regs___bs *r = bpf_core_cast(regs, struct pt_regs___bs);

#if defined(__TARGET_ARCH_arm64)
		s->args[0] = r->orig_x0;
		s->args[1] = r->regs[1];
		s->args[2] = r->regs[2];
		s->args[3] = r->regs[3];
		s->args[4] = r->regs[4];
		s->args[5] = r->regs[5];
#else
		s->args[0] = r->di;
		s->args[1] = r->si;
		s->args[2] = r->dx;
		s->args[3] = r->r10;
		s->args[4] = r->r8;
		s->args[5] = r->r9;
#endif
		return;
	}
#if defined(__TARGET_ARCH_arm64)
	/* x0..x5; x0 as the syscall was entered (orig_x0), as the kernel's
	 * own syscall wrappers read it. */
	struct pt_regs___bs *r = (void *)regs;
	u64 x[6];

	bpf_probe_read_kernel(x, sizeof(x), (void *)r + bpf_core_field_offset(r->regs));
	s->args[0] = BPF_CORE_READ(r, orig_x0);
	s->args[1] = x[1];
	s->args[2] = x[2];
	s->args[3] = x[3];
	s->args[4] = x[4];
	s->args[5] = x[5];
#else
	/* r10..rdi are contiguous in pt_regs: one read instead of six. */
	u64 r[8];

	bpf_probe_read_kernel(r, sizeof(r), (void *)regs + __builtin_offsetof(struct pt_regs, r10));
	s->args[0] = r[7]; /* rdi */
	s->args[1] = r[6]; /* rsi */
	s->args[2] = r[5]; /* rdx */
	s->args[3] = r[0]; /* r10 */
	s->args[4] = r[2]; /* r8 */
	s->args[5] = r[1]; /* r9 */
#endif
}

static __always_inline int bs_syscall_run(u64 *ctx, const struct bs_probe_cfg *cfg,
					  struct bs_scratch *s, u32 idx, u32 slot, int exit)
{
	struct task_struct *t = bpf_get_current_task_btf();

	if (!bs_target_ok(cfg, t, ctx, s, 0))
		return 0;
	BS_STAGE(BS_STAGE_TARGET);
	if (cfg->flags & BS_CFG_NEED_ARGS) {
		struct pt_regs *regs = (struct pt_regs *)ctx[0];

		if (exit)
			s->args[BS_ARG_RET] = ctx[1];
		else
			bs_syscall_args(regs, s);
		s->args[BS_ARG_NR] = slot % BS_SYS_MAX;
	}
	return bs_handle(ctx, cfg, s, idx, t);
}

static __always_inline int bs_syscall(u64 *ctx, u32 slot, int exit)
{
	struct bs_probe_cfg *cfg;
	struct bs_scratch *s;
	u32 *p, idx;

	p = bpf_map_lookup_elem(&sys_probes, &slot);
	if (!p || !*p)
		return 0;
	BS_STAGE(BS_STAGE_DISPATCH);
	idx = *p - 1;
	cfg = bpf_map_lookup_elem(&probes, &idx);
	s = bs_scratch();
	if (!cfg || !s)
		return 0;
	BS_STAGE(BS_STAGE_CONFIG);
	return BS_ON_SCRATCH(s, bs_syscall_run(ctx, cfg, s, idx, slot, exit));
}

SEC("raw_tp/sys_enter")
int bpfscope_sysin(u64 *ctx)
{
	/* ctx[1] is the syscall number. */
	u64 nr = ctx[1];

	BS_STAGE(BS_STAGE_ENTRY);
	if (nr >= BS_SYS_MAX)
		return 0;
	return bs_syscall(ctx, nr, 0);
}

SEC("raw_tp/sys_exit")
int bpfscope_sysout(u64 *ctx)
{
	u64 nr = bs_syscall_nr((struct pt_regs *)ctx[0]);

	BS_STAGE(BS_STAGE_ENTRY);
	if (nr >= BS_SYS_MAX)
		return 0;
	return bs_syscall(ctx, BS_SYS_EXIT_BASE + nr, 1);
}

_Static_assert(BS_MAX_ARGS == 12, "bs_raw_args loads one argument per BS_RAW_ARG");

/*
 * A raw tracepoint's first n arguments into their slots: loaded in place
 * through the context typed as the kernel's bpf_raw_tracepoint_args, whose
 * flexible array gives the verifier no size to tie to one tracepoint, where
 * the kernel can type it (6.2+); copied by a helper call otherwise.
 */
static __always_inline void bs_raw_args(void *ctx, struct bs_scratch *s, u32 n)
{
	if (bpf_ksym_exists(bpf_rdonly_cast) &&
	    bpf_core_type_exists(struct bpf_raw_tracepoint_args)) {
		struct bpf_raw_tracepoint_args *a =
			bpf_core_cast(ctx, struct bpf_raw_tracepoint_args);

		/*
		 * Straight code, a constant index each: clang turned a loop
		 * here into eight-at-a-time rounds whose count the 6.12
		 * verifier could not bound.
		 */
#define BS_RAW_ARG(i)                          \
	do {                                   \
		if (n <= (i))                  \
			return;                \
		s->args[i] = a->args[i];       \
	} while (0)
		BS_RAW_ARG(0);
		BS_RAW_ARG(1);
		BS_RAW_ARG(2);
		BS_RAW_ARG(3);
		BS_RAW_ARG(4);
		BS_RAW_ARG(5);
		BS_RAW_ARG(6);
		BS_RAW_ARG(7);
		BS_RAW_ARG(8);
		BS_RAW_ARG(9);
		BS_RAW_ARG(10);
		BS_RAW_ARG(11);
#undef BS_RAW_ARG
		return;
	}
	if (n > BS_MAX_ARGS)
		n = BS_MAX_ARGS;
	bpf_probe_read_kernel(s->args, n * sizeof(u64), ctx);
}

/* A probe whose link's cookie names its configuration: raw_tp and classic
 * tracepoints share everything but the context they are given. */
static __always_inline int bs_by_cookie_run(void *ctx, const struct bs_probe_cfg *cfg,
					    struct bs_scratch *s, u32 idx, int may_irq)
{
	struct task_struct *t = bpf_get_current_task_btf();

	if (!bs_target_ok(cfg, t, ctx, s, may_irq))
		return 0;
	BS_STAGE(BS_STAGE_TARGET);
	/*
	 * A raw tracepoint's arguments (a classic tracepoint's probes read
	 * its record, never slots): sched fields are read through the task
	 * pointers they give, as the record would have copied them. Only as
	 * many as read, and never as ctx[i]: the verifier would tie a load
	 * there to tracepoints with more than i arguments.
	 */
	if (cfg->flags & BS_CFG_NEED_ARGS)
		bs_raw_args(ctx, s, cfg->nargs);
	return bs_handle(ctx, cfg, s, idx, t);
}

static __always_inline int bs_by_cookie(void *ctx, int may_irq)
{
	struct bs_probe_cfg *cfg;
	struct bs_scratch *s;
	u32 idx;

	if (!bs_cookie_find(ctx, &idx, &cfg, &s))
		return 0;
	return BS_ON_SCRATCH(s, bs_by_cookie_run(ctx, cfg, s, idx, may_irq));
}

/* Any raw tracepoint, configured by cookie (kernel 6.10+). Keys use builtins only. */
SEC("raw_tp")
int bpfscope_rawtp(u64 *ctx)
{
	return bs_by_cookie(ctx, 1);
}

/*
 * Classic tracepoint: ctx is the event record as the format file describes.
 * Returning 0 tells the kernel not to submit the event to perf buffers.
 */
SEC("tracepoint")
int bpfscope_tp(void *ctx)
{
	return bs_by_cookie(ctx, 1);
}

static __always_inline int bs_user_probe_run(struct pt_regs *ctx, const struct bs_probe_cfg *cfg,
					     struct bs_scratch *s, u32 idx, int usdt, int may_irq)
{
	struct task_struct *t = bpf_get_current_task_btf();

	if (!bs_target_ok(cfg, t, ctx, s, may_irq))
		return 0;
	if (cfg->flags & BS_CFG_NEED_ARGS) {
		if (usdt) {
			int n = bpf_usdt_arg_cnt(ctx);

			for (int i = 0; i < BS_MAX_ARGS; i++) {
				long v = 0;

				if (i >= n)
					break;
				bpf_usdt_arg(ctx, i, &v);
				s->args[i] = v;
			}
		} else {
			/* The C calling convention (bpf_tracing.h: rdi... on
			 * x86-64, x0... on arm64); six registers on both. */
			s->args[0] = PT_REGS_PARM1(ctx);
			s->args[1] = PT_REGS_PARM2(ctx);
			s->args[2] = PT_REGS_PARM3(ctx);
			s->args[3] = PT_REGS_PARM4(ctx);
			s->args[4] = PT_REGS_PARM5(ctx);
			s->args[5] = PT_REGS_PARM6(ctx);
			s->args[BS_ARG_RET] = PT_REGS_RC(ctx);
		}
	}
	return bs_handle(ctx, cfg, s, idx, t);
}

static __always_inline int bs_user_probe(struct pt_regs *ctx, u32 idx, int usdt,
					 int may_irq)
{
	struct bs_probe_cfg *cfg = bpf_map_lookup_elem(&probes, &idx);
	struct bs_scratch *s = bs_scratch();

	if (!cfg || !s)
		return 0;
	return BS_ON_SCRATCH(s, bs_user_probe_run(ctx, cfg, s, idx, usdt, may_irq));
}

/* pt_regs programs configured by cookie: kprobes, uprobes, their multi links. */
static __always_inline int bs_regs_cookie(struct pt_regs *ctx, int may_irq)
{
	u32 idx;

	if (!bs_cookie_probe(ctx, &idx))
		return 0;
	return bs_user_probe(ctx, idx, 0, may_irq);
}

/* A kernel function through a kprobe or kretprobe; pt_regs as for uprobes. */
SEC("kprobe")
int bpfscope_kprobe(struct pt_regs *ctx)
{
	return bs_regs_cookie(ctx, 1);
}

/* Many kernel functions in one kprobe_multi link; each function's cookie names it. */
SEC("kprobe.multi")
int bpfscope_kmulti(struct pt_regs *ctx)
{
	return bs_regs_cookie(ctx, 1);
}

/*
 * fentry/fexit: the trampoline passes the arguments as u64 slots, read
 * with bpf_get_func_arg (and the return value with bpf_get_func_ret), so
 * the same code serves every target. The target is fixed at load time:
 * user space loads these instructions once per function (see
 * attach/kfunc.rs) and attaches each copy with its cookie.
 */
static __always_inline int bs_tramp_run(void *ctx, const struct bs_probe_cfg *cfg,
					struct bs_scratch *s, u32 idx, int ret)
{
	struct task_struct *t = bpf_get_current_task_btf();

	if (!bs_target_ok(cfg, t, ctx, s, 1))
		return 0;
	BS_STAGE(BS_STAGE_TARGET);
	if (cfg->flags & BS_CFG_NEED_ARGS) {
		u64 n = bpf_get_func_arg_cnt(ctx);

		for (int i = 0; i < 6; i++) {
			u64 v = 0;

			if (i >= n)
				break;
			bpf_get_func_arg(ctx, i, &v);
			s->args[i] = v;
		}
		if (ret) {
			u64 v = 0;

			bpf_get_func_ret(ctx, &v);
			s->args[BS_ARG_RET] = v;
		}
	}
	return bs_handle(ctx, cfg, s, idx, t);
}

static __always_inline int bs_tramp(void *ctx, int ret)
{
	struct bs_probe_cfg *cfg;
	struct bs_scratch *s;
	u32 idx;

	if (!bs_cookie_find(ctx, &idx, &cfg, &s))
		return 0;
	return BS_ON_SCRATCH(s, bs_tramp_run(ctx, cfg, s, idx, ret));
}

SEC("fentry")
int bpfscope_fentry(void *ctx)
{
	return bs_tramp(ctx, 0);
}

SEC("fexit")
int bpfscope_fexit(void *ctx)
{
	return bs_tramp(ctx, 1);
}

/*
 * A thread leaving: the words it holds of thread maps printed at the end
 * go to their maps' hash maps, keyed by its id as the machine keys them
 * (bs_vm_key_whole, the map's id, the tid), so that the end prints what
 * exited threads left, as bpftrace does. Attached only for such a script;
 * it runs after the probes stop, until the maps are printed.
 */
static __always_inline int bs_task_exit_run(struct task_struct *task,
					    struct bs_vm_task_vals *t, struct bs_scratch *s)
{
	u64 val[BS_VAL_MAX / 8] = {};

	for (u32 w = 0; w < BS_VM_TASK_MAPS; w++) {
		u32 id = vm_task_ids[w];
		void *m;

		if (!(t->set & vm_task_print & (1ull << w)))
			continue;
		m = bpf_map_lookup_elem(&vm_vals, &id);
		if (!m)
			continue;
		__builtin_memset(s->key, 0, sizeof(s->key));
		*(u64 *)(s->key + sizeof(struct bs_key_hdr)) = id;
		*(u64 *)(s->key + sizeof(struct bs_key_hdr) + 8) = (u32)task->pid;
		val[0] = t->v[w];
		if (bpf_map_update_elem(m, s->key, val, BPF_ANY))
			bs_vm_note(BS_NOTE_FULL, id);
	}
	return 0;
}

SEC("raw_tp/sched_process_exit")
int bpfscope_task_exit(u64 *ctx)
{
	struct task_struct *task = bpf_get_current_task_btf();
	struct bs_vm_task_vals *t;
	struct bs_scratch *s;

	if (!vm_task_print)
		return 0;
	t = bpf_task_storage_get(&vm_task, task, NULL, 0);
	s = bs_scratch();
	if (!t || !s || !(t->set & vm_task_print))
		return 0;
	return BS_ON_SCRATCH(s, bs_task_exit_run(task, t, s));
}

/*
 * A script's BEGIN, END and interval blocks, run by bpfscope itself with
 * BPF_PROG_TEST_RUN (never attached): ctx[0] is the probe's index, and
 * only probes marked as triggers run, in bpfscope's own task.
 */
SEC("raw_tp")
int bpfscope_trigger(u64 *ctx)
{
	struct bs_probe_cfg *cfg;
	struct bs_scratch *s;
	struct task_struct *t;
	u32 idx = ctx[0];

	cfg = bpf_map_lookup_elem(&probes, &idx);
	s = bs_scratch();
	if (!cfg || !s || !(cfg->flags & BS_CFG_SELF))
		return 0;
	t = bpf_get_current_task_btf();
	if (!bs_target_ok(cfg, t, ctx, s, 0))
		return 0;
	return BS_ON_SCRATCH(s, bs_handle(ctx, cfg, s, idx, t));
}

/* A software clock (a script's profile:hz:N), configured by cookie. */
SEC("perf_event")
int bpfscope_clock(void *ctx)
{
	/* A sample of bpfscope is its own, though taken in an interrupt. */
	return bs_by_cookie(ctx, 0);
}

/* One uprobe or uretprobe per function (kernels without uprobe_multi). */
SEC("uprobe")
int bpfscope_uprobe(struct pt_regs *ctx)
{
	return bs_regs_cookie(ctx, 0);
}

/* Many functions of one binary in one link; each function's cookie names it. */
SEC("uprobe.multi")
int bpfscope_umulti(struct pt_regs *ctx)
{
	return bs_regs_cookie(ctx, 0);
}

/* USDT probes through libbpf's USDT support (arguments, semaphores). */
SEC("usdt")
int bpfscope_usdt(struct pt_regs *ctx)
{
	long cookie = bpf_usdt_cookie(ctx);

	if (!cookie)
		return 0;
	return bs_user_probe(ctx, cookie - 1, 1, 0);
}

/*
 * bpfscope_fork (track.bpf.h): follows forks of tracked processes, so
 * `-- CMD` traces all descendants. After the other programs, so it stays
 * this object's last.
 */
#define BS_TRACK_PROGRAM
#include "track.bpf.h"
