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

/*
 * Zeroes n bytes (a constant multiple of 8) a word at a time. Through a
 * char pointer clang assumes no alignment and stores a byte at a time (64
 * stores for a string slot), and word loads of those bytes that follow
 * (key caches, hashing) then wait for them. The programs' word stores to
 * unaligned addresses are allowed where the CPU has them (x86-64, arm64).
 */
static __always_inline void bs_zero_words(void *dst, const u32 n)
{
	u64 *d = dst;

#pragma unroll
	for (u32 i = 0; i < n / 8; i++)
		d[i] = 0;
}

/* Increment a per-CPU counter slot of an array map. */
static __always_inline void bs_count(void *map, u32 slot)
{
	u64 *v = bpf_map_lookup_elem(map, &slot);

	if (v)
		__sync_fetch_and_add(v, 1);
}

/* Add to a per-CPU counter slot of an array map (no atomics: per CPU). */
static __always_inline void bs_add(void *map, u32 slot, u64 n)
{
	u64 *v;

	if (!n)
		return;
	v = bpf_map_lookup_elem(map, &slot);
	if (v)
		*v += n;
}

#endif /* BPFSCOPE_COMMON_H */
