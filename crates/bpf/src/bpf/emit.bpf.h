/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Event emission for `trace`: one record (struct bs_event_hdr, then the
 * probe's fields at their offsets) built in the scratch map and copied to the
 * `events` ring buffer. User space is woken only once wakeup_bytes are
 * waiting; it polls on its own period, so records never wait long.
 */
#ifndef BPFSCOPE_EMIT_BPF_H
#define BPFSCOPE_EMIT_BPF_H

#include "read.bpf.h"

/* The record header: what every record carries whatever made it. */
static __always_inline void bs_event_head(struct bs_scratch *s, u32 probe)
{
	struct bs_event_hdr *hdr = (struct bs_event_hdr *)s->ev;
	struct task_struct *t = bpf_get_current_task_btf();

	hdr->ts_ns = bpf_ktime_get_ns();
	hdr->probe = probe;
	hdr->pid = t->tgid;
	hdr->tid = t->pid;
	hdr->cpu = bpf_get_smp_processor_id();
	hdr->faults = 0;
	hdr->pad = 0;
	bs_comm(hdr->comm);
}

/* Sends the record in s->ev (header and `size` bytes), counting a full buffer. */
static __always_inline void bs_event_send(struct bs_scratch *s, u64 size)
{
	u64 flags = bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) >= wakeup_bytes ?
			    BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP;

	if (bpf_ringbuf_output(&events, s->ev, size, flags))
		bs_count(&lost, BS_LOST_EVENTS);
}

static __always_inline void bs_emit(void *ctx, const struct bs_probe_cfg *cfg,
				    struct bs_scratch *s, u32 idx)
{
	struct bs_event_hdr *hdr = (struct bs_event_hdr *)s->ev;

	bs_event_head(s, idx);
	for (int i = 0; i < BS_MAX_EMIT; i++) {
		const struct bs_src *src;

		if (i >= max_emit || i >= cfg->nemit)
			break;
		src = &cfg->emit[i];
		if (bs_put(ctx, src, s, idx,
			   s->ev + sizeof(*hdr) + (src->out_off & (BS_EVENT_DATA_MAX - 1))))
			hdr->faults |= 1u << i;
	}
	bs_event_send(s, sizeof(*hdr) + (cfg->event_size & (BS_EVENT_DATA_MAX - 1)));
}

#endif /* BPFSCOPE_EMIT_BPF_H */
