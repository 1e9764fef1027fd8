// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * The lab's XDP traffic generator (rivora-bench xdpgen, bench/src/xdpgen.rs):
 * run with BPF_PROG_TEST_RUN and BPF_F_TEST_XDP_LIVE_FRAMES, every frame is
 * redirected into a veth whose peer then receives an xdp_frame, as from a
 * NIC, with no skb and no copy into an XDP buffer. Not loaded by rivorad.
 *
 * Live frames come from a page pool that is filled with data_in only when a
 * page is first allocated: a recycled page holds whatever the last program
 * to see it left (the node's NAT rewrites addresses and MACs). So every run
 * writes the whole frame from the template, then its source for the flow
 * pattern, then the IPv4 header checksum from scratch (UDP checksum 0).
 */
#include "lib/common.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Ethernet, IPv4 without options, UDP, 18 bytes of payload: a 64-byte frame
 * on a wire with its FCS, as the lab's trafgen sends. */
#define RV_XDPGEN_LEN 60
#define RV_XDPGEN_IP_OFF 14
#define RV_XDPGEN_UDP_OFF 34

enum rv_xdpgen_flows {
	RV_XDPGEN_ONE = 0, /* every frame the template's flow */
	RV_XDPGEN_64K = 1, /* source port 1..65535 in turn */
	RV_XDPGEN_NEW = 2, /* a new (source address, port) every frame */
};

struct rv_xdpgen_cfg {
	__u32 ifindex; /* where every frame is redirected */
	__u32 flows;   /* enum rv_xdpgen_flows */
	__u32 seed;    /* added to the frame counter */
	__u32 pad;
	__u8 frame[RV_XDPGEN_LEN + 4];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct rv_xdpgen_cfg);
} xdpgen_cfg SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} xdpgen_ctr SEC(".maps");

SEC("xdp")
int xdpgen_redirect(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u32 zero = 0, n, sum = 0;
	struct rv_xdpgen_cfg *cfg = bpf_map_lookup_elem(&xdpgen_cfg, &zero);
	__u32 *ctr = bpf_map_lookup_elem(&xdpgen_ctr, &zero);
	struct iphdr *ip;
	struct udphdr *udp;
	__u16 *w;
	int i;

	if (!cfg || !ctr)
		return XDP_ABORTED;
	if (data + RV_XDPGEN_LEN > data_end)
		return XDP_ABORTED;
	__builtin_memcpy(data, cfg->frame, RV_XDPGEN_LEN);
	ip = data + RV_XDPGEN_IP_OFF;
	udp = data + RV_XDPGEN_UDP_OFF;
	n = ++*ctr + cfg->seed;
	switch (cfg->flows) {
	case RV_XDPGEN_64K:
		udp->source = bpf_htons((__u16)(1 + n % 65535));
		break;
	case RV_XDPGEN_NEW:
		/* n -> (address, port) is one to one: 2^32 frames before a
		 * flow repeats. */
		((__u16 *)&ip->saddr)[1] = bpf_htons((__u16)n);
		udp->source = bpf_htons((__u16)(n >> 16));
		break;
	}
	udp->check = 0;
	ip->check = 0;
	w = (__u16 *)ip;
#pragma unroll
	for (i = 0; i < 10; i++)
		sum += w[i];
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	ip->check = (__u16)~sum;
	return bpf_redirect(cfg->ifindex, 0);
}
