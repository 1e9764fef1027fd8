// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * decap: the backend's side of L3 DSR. xdp_ingress on the node wraps a
 * request in IPIP (RFC 2003) or IPv6-in-IPv6 (RFC 2473) and sends it to the
 * backend's own address; the backend's kernel would hand that to the ipip
 * or ip6_tunnel module, and many hosts have neither. This program removes
 * the outer header in XDP instead, when the inner destination is a VIP this
 * backend holds (decap_vips, decap_vips6, filled by the backend's agent),
 * and passes the inner packet to the stack as if it had arrived bare. The
 * Ethernet header (with its VLAN tags, if any) is moved up over the outer
 * header; the EtherType stays, since both shapes keep the address family.
 *
 * Anything else (not a tunnel, a tunnel to a VIP this host does not hold,
 * a malformed or fragmented outer packet) is passed untouched: the stack
 * then does what it would have done without this program.
 *
 * The maps belong to this object alone and are not pinned: they are not
 * part of the node's rivora-lb ABI.
 *
 * xdp_pass lives here too: a frame that XDP_TX or XDP_REDIRECT sends into
 * a veth is delivered only if the peer has an XDP program of its own.
 */
#include "lib/common.h"
#include "lib/csum.h"
#include "lib/parse.h"
#include "lib/tunnel.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/*
 * Per-CPU counters, one set at index 0. decap4/decap6: packets
 * decapsulated. not_vip: tunnel packets to a VIP not held here (passed).
 * malformed: tunnel packets not decapsulated because the outer or inner
 * header is bad, truncated or fragmented (passed; dropped only if the
 * outer header was already gone, which the checks rule out).
 */
struct rv_decap_stats {
	__u64 decap4;
	__u64 decap6;
	__u64 not_vip;
	__u64 malformed;
};

/* Value of decap_vips / decap_vips6: 1 while the VIP is held. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, RV_MAX_VIPS);
	__type(key, __be32);
	__type(value, __u8);
} decap_vips SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, RV_MAX_VIPS);
	__type(key, __be32[4]);
	__type(value, __u8);
} decap_vips6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct rv_decap_stats);
} decap_stats SEC(".maps");

static __always_inline struct rv_decap_stats *rv_decap_stats(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&decap_stats, &zero);
}

/*
 * IPIP to a VIP held here: fill d and return 1; anything else: 0, and the
 * packet is passed untouched.
 */
static __always_inline int rv_decap_check4(void *data, void *data_end, __u32 l3,
					   struct rv_decap *d,
					   struct rv_decap_stats *st)
{
	struct iphdr *outer = rv_hdr(struct iphdr, data, data_end, l3);
	struct iphdr *inner;
	__u32 outer_len, outer_tot;

	if (!outer || outer->protocol != RV_IPPROTO_IPIP)
		return 0;
	outer_len = outer->ihl * 4;
	outer_tot = bpf_ntohs(outer->tot_len);
	/* A fragmented outer packet would have to be reassembled first;
	 * the node sends whole packets (DF copied from the inner header),
	 * so any fragment is left to the kernel. */
	if (outer->version != 4 || outer_len < sizeof(*outer) ||
	    outer_tot < outer_len + sizeof(*inner) ||
	    (outer->frag_off & bpf_htons(RV_IP_MF | RV_IP_OFFSET)))
		goto malformed;
	if (data + l3 + outer_tot > data_end)
		goto malformed;
	inner = rv_hdr(struct iphdr, data, data_end, l3 + outer_len);
	if (!inner)
		goto malformed;
	if (inner->version != 4 || inner->ihl < 5 ||
	    bpf_ntohs(inner->tot_len) > outer_tot - outer_len)
		goto malformed;
	if (!bpf_map_lookup_elem(&decap_vips, &inner->daddr)) {
		if (st)
			st->not_vip++;
		return 0;
	}
	d->outer_len = outer_len;
	d->outer_ecn = outer->tos & RV_ECN_MASK;
	d->family = RV_FAMILY_V4;
	return 1;
malformed:
	if (st)
		st->malformed++;
	return 0;
}

/* IPv6-in-IPv6 directly after the fixed header (the node adds no
 * extension headers); the same contract as rv_decap_check4(). */
static __always_inline int rv_decap_check6(void *data, void *data_end, __u32 l3,
					   struct rv_decap *d,
					   struct rv_decap_stats *st)
{
	struct ipv6hdr *outer = rv_hdr(struct ipv6hdr, data, data_end, l3);
	struct ipv6hdr *inner;
	__u32 payload;

	if (!outer || outer->nexthdr != RV_IPPROTO_IPV6)
		return 0;
	payload = bpf_ntohs(outer->payload_len);
	if (outer->version != 6 || payload < sizeof(*inner))
		goto malformed;
	if (data + l3 + sizeof(*outer) + payload > data_end)
		goto malformed;
	inner = rv_hdr(struct ipv6hdr, data, data_end, l3 + sizeof(*outer));
	if (!inner)
		goto malformed;
	if (inner->version != 6 ||
	    sizeof(*inner) + bpf_ntohs(inner->payload_len) > payload)
		goto malformed;
	if (!bpf_map_lookup_elem(&decap_vips6, &inner->daddr)) {
		if (st)
			st->not_vip++;
		return 0;
	}
	d->outer_len = sizeof(*outer);
	d->outer_ecn = (bpf_ntohl(*(__be32 *)outer) >> 20) & RV_ECN_MASK;
	d->family = RV_FAMILY_V6;
	return 1;
malformed:
	if (st)
		st->malformed++;
	return 0;
}

SEC("xdp")
int xdp_decap(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct rv_decap_stats *st;
	struct rv_decap d = {};
	struct rv_pkt pkt = {};
	__be16 proto;
	__u32 l2_len;
	int found, ret;

	proto = rv_parse_l2(data, data_end, &pkt);
	if (proto != bpf_htons(RV_ETH_P_IP) &&
	    proto != bpf_htons(RV_ETH_P_IPV6))
		return RV_XDP_PASS;
	l2_len = pkt.l2_len;
	if (l2_len > RV_DECAP_L2_MAX)
		return RV_XDP_PASS;
	st = rv_decap_stats();
	if (proto == bpf_htons(RV_ETH_P_IP))
		found = rv_decap_check4(data, data_end, l2_len, &d, st);
	else
		found = rv_decap_check6(data, data_end, l2_len, &d, st);
	if (!found)
		return RV_XDP_PASS;
	ret = rv_decap_strip(ctx, l2_len, &d);
	if (ret < 0) {
		if (st)
			st->malformed++;
		return RV_XDP_DROP;
	}
	if (ret > 0) {
		if (st)
			st->malformed++;
		return RV_XDP_PASS;
	}
	if (st) {
		if (d.family == RV_FAMILY_V4)
			st->decap4++;
		else
			st->decap6++;
	}
	return RV_XDP_PASS;
}

SEC("xdp")
int xdp_pass(struct xdp_md *ctx)
{
	return RV_XDP_PASS;
}
