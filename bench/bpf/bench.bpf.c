// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Benchmark wrappers for BPF_PROG_TEST_RUN. With repeat=N the kernel hands
 * every run the packet as the previous run left it: a NAT'd or
 * encapsulated packet would then be measured as non-VIP traffic. Each
 * wrapper puts the original bytes back (undoing any head adjustment) and
 * tail-calls the program under test; the floor is the same wrapper
 * tail-calling a program that only returns XDP_PASS, so the copy and the
 * tail call cancel out of the ratios. Not loaded by rivorad.
 */
#include "lib/common.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define RV_BENCH_MAX 256
#define RV_TC_ACT_SHOT 2

struct rv_bench_pkt {
	__u32 len;	/* a multiple of 8, at most RV_BENCH_MAX */
	__u32 vary;	/* non-zero: every run is a new flow */
	__u32 ip_off;	/* where to write the varying source address word */
	__u32 port_off; /* where to write the varying source port */
	__u8 bytes[RV_BENCH_MAX];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct rv_bench_pkt);
} bench_pkt_map SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} bench_ctr SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} bench_xdp_progs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} bench_tc_progs SEC(".maps");

static __always_inline void rv_bench_vary(void *data, void *data_end,
					  const struct rv_bench_pkt *p)
{
	__u32 zero = 0, *ctr = bpf_map_lookup_elem(&bench_ctr, &zero);
	__u32 ip_off = p->ip_off, port_off = p->port_off;
	__u32 n;

	if (!ctr)
		return;
	n = ++*ctr;
	if (ip_off > RV_BENCH_MAX - 4 || port_off > RV_BENCH_MAX - 2)
		return;
	if (data + ip_off + 4 <= data_end)
		*(__u16 *)(data + ip_off + 2) = (__u16)(n >> 16) ^ (__u16)n;
	if (data + port_off + 2 <= data_end)
		*(__u16 *)(data + port_off) = (__u16)n;
}

SEC("xdp")
int bench_wrap_xdp(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u32 zero = 0;
	struct rv_bench_pkt *p = bpf_map_lookup_elem(&bench_pkt_map, &zero);
	int delta, i;
	__u64 cur;

	if (!p)
		return XDP_ABORTED;
	/* The program under test may have pushed an outer header: pull the
	 * head back to where the original packet started. */
	cur = data_end - data;
	/* Keep clang from folding this into 32-bit pointer arithmetic,
	 * which the verifier refuses. */
	asm volatile("" : "+r"(cur));
	delta = (int)cur - (int)p->len;
	if (delta && bpf_xdp_adjust_head(ctx, delta))
		return XDP_ABORTED;
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
#pragma unroll
	for (i = 0; i < RV_BENCH_MAX / 8; i++) {
		if (i * 8 >= p->len || data + i * 8 + 8 > data_end)
			break;
		*(__u64 *)(data + i * 8) = *(__u64 *)(p->bytes + i * 8);
	}
	if (p->vary)
		rv_bench_vary(data, data_end, p);
	bpf_tail_call(ctx, &bench_xdp_progs, 0);
	return XDP_ABORTED;
}

SEC("xdp")
int bench_pass_xdp(struct xdp_md *ctx)
{
	return XDP_PASS;
}

SEC("tcx/egress")
int bench_wrap_tc(struct __sk_buff *skb)
{
	__u32 zero = 0;
	struct rv_bench_pkt *p = bpf_map_lookup_elem(&bench_pkt_map, &zero);
	__u32 len;

	if (!p)
		return RV_TC_ACT_SHOT;
	len = p->len;
	if (len == 0 || len > RV_BENCH_MAX || len > skb->len)
		return RV_TC_ACT_SHOT;
	if (bpf_skb_store_bytes(skb, 0, p->bytes, len, 0))
		return RV_TC_ACT_SHOT;
	bpf_tail_call(skb, &bench_tc_progs, 0);
	return RV_TC_ACT_SHOT;
}

SEC("tcx/egress")
int bench_pass_tc(struct __sk_buff *skb)
{
	return RV_TCX_NEXT;
}
