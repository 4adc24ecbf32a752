/* SPDX-License-Identifier: GPL-2.0 */
/*
 * What every part of trace.bpf.c works on: the session's constants in
 * .rodata (set by user space and frozen before verification, so the verifier
 * sees them as known values and walks only the loop iterations in use), the
 * interval epoch in .bss, the maps (probe configurations, aggregates, the
 * event ring buffer, stack maps, lost counters, latency starts) and the
 * per-CPU scratch area that stands in for the 512-byte BPF stack. The
 * `tracked` map comes from track.bpf.h, shared with profile.bpf.c, in the
 * place it always had among the maps. Names here are the skeleton's (maps,
 * .rodata/.bss fields), so they stay as user space knows them.
 */
#ifndef BPFSCOPE_STATE_BPF_H
#define BPFSCOPE_STATE_BPF_H

#include "common.h"
#include "trace.h"

const volatile u32 target_mode = BS_TARGET_ALL;
/* bpfscope's own tgid: never trace ourselves (printing events would feed back). */
const volatile u32 self_tgid = 0;
/* Force a ring buffer wakeup once this much data is waiting. */
const volatile u64 wakeup_bytes = 65536;
/*
 * The largest filter, key and event part counts among the loaded probes.
 * Frozen before verification, so the verifier walks only the loop
 * iterations this session can use and load time stays short.
 */
const volatile u32 max_filter_ops = BS_MAX_FILTER_OPS;
const volatile u32 max_key_parts = BS_MAX_KEY_PARTS;
const volatile u32 max_emit = BS_MAX_EMIT;
/* Stack keys are in use: only then do the programs call bpf_get_stackid. */
const volatile u32 use_stacks = 0;
/* Bytes of a latency start record: timestamp + key data. */
const volatile u32 start_size = 8;

/* Scripts are loaded (vm.bpf.h): only then is the script machine in the programs. */
const volatile u32 use_vm = 0;
/* The script machine's operations the session's code uses (bit per enum bs_vm_op). */
const volatile u64 vm_ops = ~0ull;
/* Some map lives in the threads' own storage (BS_VMF_TASK): only then is vm_task created and used. */
const volatile u32 vm_task_on = 0;
/*
 * The words of thread maps printed at the end (not cleared at END), a bit
 * each, and each word's map id: a thread leaving with such a word set
 * leaves it in the map's hash map (bpfscope_task_exit), as bpftrace's map
 * keeps what exited threads left.
 */
const volatile u32 vm_task_print = 0;
const volatile u32 vm_task_ids[BS_VM_TASK_MAPS] = {};

/*
 * bench/event_cost.py's breakdown (BPFSCOPE_BENCH_STAGE): the programs
 * return after this stage (enum bs_bench_stage). In every other run it is
 * BS_STAGE_OFF, frozen before verification like the values above: the
 * verifier sees each BS_STAGE check as never taken and removes its branch
 * and its return; a load of the constant stays (an L1 hit).
 */
const volatile u32 bench_stage = BS_STAGE_OFF;
#define BS_STAGE(n)                         \
	do {                                \
		if (bench_stage == (n))     \
			return 0;           \
	} while (0)

/* Advanced by user space at each --interval; part of every aggregation key. */
u32 epoch = 0;
/* The session's start (monotonic ns), for a script's `elapsed`. */
u64 vm_t0 = 0;
/* Set by user space when a script ends: its probes do nothing from then on. */
u32 vm_stopped = 0;
/*
 * The kernel's interrupt code as [start, end) pairs, from kallsyms, set by
 * user space before attaching: an event whose kernel stack passes through
 * it ran in an interrupt (trace.bpf.c's bs_in_irq). Zero: none known.
 */
u64 irq_text[2 * BS_IRQ_TEXTS] = {};

/*
 * Keeps the ABI types in BTF so the skeleton generates them for user space
 * (enum constants and structs that no map or global names directly).
 */
struct bs_abi {
	enum bs_limits limits;
	enum bs_src_kind src_kind;
	enum bs_ustack_flags ustack_flags;
	enum bs_val_type val_type;
	enum bs_task_member task_member;
	enum bs_op op;
	enum bs_agg agg;
	enum bs_cfg_flags cfg_flags;
	enum bs_lost lost;
	enum bs_target_mode target_mode;
	struct bs_key_hdr key_hdr;
	struct bs_agg_val agg_val;
	enum bs_cache_limits cache_limits;
	struct bs_cache_ent cache_ent;
	struct bs_cache cache;
	struct bs_event_hdr event_hdr;
	struct bs_str str;
	struct bs_match_key match_key;
	enum bs_vm_op vm_op;
	enum bs_vm_alu vm_alu;
	enum bs_vm_flags vm_flags;
	struct bs_insn insn;
	enum bs_note note;
	enum bs_bench_stage bench_stage;
};
const volatile struct bs_abi bs_abi_types = {};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1); /* resized to the number of probes */
	__type(key, u32);
	__type(value, struct bs_probe_cfg);
} probes SEC(".maps");

/* Syscall number -> probe index + 1 (0: not traced); exits at BS_SYS_EXIT_BASE + nr. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2 * BS_SYS_MAX);
	__type(key, u32);
	__type(value, u32);
} sys_probes SEC(".maps");

/* String constants of filters. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1); /* resized */
	__type(key, u32);
	__type(value, struct bs_str);
} strs SEC(".maps");

/*
 * Aggregates: struct bs_key_hdr + key data -> struct bs_agg_val per CPU.
 * The key size is set at load time to what the probes' keys need, so
 * hashing never covers unused bytes.
 */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 10240); /* --max-keys */
	__uint(key_size, sizeof(struct bs_key_hdr));
	__uint(value_size, sizeof(struct bs_agg_val));
} aggs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4 << 20);
} events SEC(".maps");

/* Stack keys (--by kstack / ustack): ids into these maps, sized at load (1 when unused). */
struct {
	__uint(type, BPF_MAP_TYPE_STACK_TRACE);
	__uint(max_entries, 1);
	__uint(key_size, sizeof(u32));
	__uint(value_size, 127 * sizeof(u64));
} kstacks SEC(".maps");

/* User stacks as build id + file offset, symbolized later, even after the process exits. */
struct {
	__uint(type, BPF_MAP_TYPE_STACK_TRACE);
	__uint(max_entries, 1);
	__uint(key_size, sizeof(u32));
	__uint(value_size, 127 * sizeof(struct bpf_stack_build_id));
	__uint(map_flags, BPF_F_STACK_BUILD_ID);
} ustacks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, BS_LOST_NR);
	__type(key, u32);
	__type(value, u64);
} lost SEC(".maps");

/* `tracked` (track.bpf.h): the tgids traced when target_mode is BS_TARGET_TRACKED. */
#include "track.bpf.h"

/*
 * Latency starts waiting for their end: match key -> timestamp followed by
 * the start side's key data (value size set at load time).
 */
struct {
	/* LRU: starts whose end never comes (filtered, lost) age out instead of filling the map. */
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1); /* resized when latency is measured */
	__uint(key_size, sizeof(struct bs_match_key));
	__uint(value_size, 8);
} starts SEC(".maps");

/* Script machine code of every probe (vm.bpf.h), sized at load. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct bs_insn);
} vm_code SEC(".maps");

/* Sources the script machine reads (BS_VM_SRC, BS_VM_SRCSTR), sized at load. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct bs_src);
} vm_srcs SEC(".maps");

/*
 * A script's maps, each a kernel map of its own (so each has its own
 * capacity, and a full one is known by name): the script's map id, the
 * first word of its key data, indexes the outer array. Aggregations are
 * per-CPU (struct bs_agg_val per key and bucket, as `aggs`), plain values
 * (`@start[tid] = nsecs`) a number or a string. The key is struct
 * bs_key_hdr (bucket; epoch 0) then the key data, of the script's longest
 * key. User space sizes the inner template's key before load and puts
 * one inner map per script map in the outer array, sized to its capacity.
 */
struct bs_vm_aggmap {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 1);
	__uint(key_size, sizeof(struct bs_key_hdr));
	__uint(value_size, sizeof(struct bs_agg_val));
	/* A map's keys come as they come, and most maps hold few. */
	__uint(map_flags, BPF_F_NO_PREALLOC);
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, 1);
	__type(key, u32);
	__array(values, struct bs_vm_aggmap);
} vm_aggs SEC(".maps");

/*
 * A keyless aggregation's map (`@ = count()`, `@h = hist(x)`): per CPU, a
 * struct bs_agg_val per bucket, indexed by the bucket (an array lookup,
 * where a hash map would hash and compare a key). Only plain arrays take
 * BPF_F_INNER_MAP, so all of a script's have the size of its largest.
 */
struct bs_vm_slotmap {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct bs_agg_val);
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, 1);
	__type(key, u32);
	__array(values, struct bs_vm_slotmap);
} vm_slots SEC(".maps");

/* Preallocated, as bpftrace's: `@start[tid]` inserts and deletes at every event. */
struct bs_vm_valmap {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__uint(key_size, sizeof(struct bs_key_hdr));
	__uint(value_size, BS_VAL_MAX);
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, 1);
	__type(key, u32);
	__array(values, struct bs_vm_valmap);
} vm_vals SEC(".maps");

/*
 * A script's maps of numbers keyed by the current thread's id alone
 * (`@start[tid]`, cleared at END, never read whole): a word each in the
 * thread's own storage, where a hash map would hash, insert and delete at
 * every event. Created only for such a script (autocreate off otherwise;
 * vm_task_on then leaves its uses out of the programs).
 */
struct bs_vm_task_vals {
	u64 v[BS_VM_TASK_MAPS];
	/* The words that hold a value (bit per word): a key, where 0 is a value too. */
	u64 set;
};

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct bs_vm_task_vals);
} vm_task SEC(".maps");

/*
 * Per CPU, a struct bs_cache per script aggregation whose compiled probes
 * only ever add to it (`@[comm] = count()`, keys of one or two words): a
 * direct-mapped cache in front of its per-CPU hash map, where a hit is an
 * index and three compares instead of a hash, a bucket walk and a key
 * compare. Only the compiled probes (emitted in user space) use it; user
 * space adds both when it reads the map. Sized at load, one element per
 * such map; created only for a script that has one.
 */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct bs_cache);
} vm_cache SEC(".maps");

/*
 * Runs of each probe cut short at BS_VM_STEPS, and updates each map
 * refused because it was full (enum bs_note): sized at load.
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, u64);
} vm_cut SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, u64);
} vm_full SEC(".maps");

/* Glob matching state, stepped by bpf_loop so the verifier checks one step. */
struct bs_glob {
	char s[BS_STR_MAX];
	char p[BS_STR_MAX];
	u32 i, j, star, mark;
	int has_star;
	int result; /* -1 running, 0 no match, 1 match */
};

struct bs_scratch {
	struct bs_match_key mk;
	u64 args[BS_NARGS];
	/* Slack after each buffer lets a masked offset plus a full string stay in bounds. */
	u8 key[sizeof(struct bs_key_hdr) + BS_KEY_MAX + BS_STR_MAX];
	u8 ev[sizeof(struct bs_event_hdr) + BS_EVENT_DATA_MAX + 8 + BS_BUF_MAX];
	struct bs_str str;
	struct bs_glob glob;
	/* The filter's boolean stack, bit 0 on top (see bs_filter_step). */
	u64 fstack;
	/* The script machine (vm.bpf.h): registers, string slots, next instruction. */
	u64 r[BS_VM_REGS];
	char sv[BS_VM_STRS][BS_STR_MAX];
	u32 pc;
	/* Held (1) by the run using this area (trace.bpf.c's BS_ON_SCRATCH). */
	u32 busy;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct bs_scratch);
} scratch SEC(".maps");

#endif /* BPFSCOPE_STATE_BPF_H */
