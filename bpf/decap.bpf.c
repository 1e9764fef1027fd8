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

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Ethernet with no, one or two VLAN tags (rv_parse_l2() accepts two). */
#define RV_DECAP_L2_UNTAGGED 14
#define RV_DECAP_L2_ONE_TAG 18
#define RV_DECAP_L2_MAX 22
/* ECN codepoints (RFC 3168) in the low two bits of the TOS octet. */
#define RV_ECN_MASK 0x03
#define RV_ECN_CE 0x03

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

/* What the checks found: how much to strip, and the outer ECN field. */
struct rv_decap {
	__u32 outer_len;
	__u8 outer_ecn;
	__u8 family;
	__u8 pad[2];
};

/*
 * RFC 6040 (normal mode), simplified: congestion marked on the outer
 * header must not be lost with it. A CE outer over an ECN-capable inner
 * marks the inner CE; a not-ECT inner is left as it is (RFC 6040 would
 * drop it, but the node copies the inner TOS outwards, so a CE outer over
 * a not-ECT inner means a router broke the rules, not a congestion signal
 * the endpoints could act on).
 */
static __always_inline void rv_ecn_decap4(struct iphdr *inner, __u8 outer_ecn)
{
	/* TOS is the low byte of the header's first 16-bit word, the unit
	 * the checksum is updated in. The word is read and written through
	 * one pointer type only: mixing it with iphdr field accesses lets
	 * the compiler's alias analysis reuse the old word (seen here: the
	 * checksum was left stale). */
	__be16 *w = (__be16 *)inner;
	__be16 old = *w;
	__u16 ecn = bpf_ntohs(old) & RV_ECN_MASK;

	if (outer_ecn != RV_ECN_CE || !ecn || ecn == RV_ECN_CE)
		return;
	*w = old | bpf_htons(RV_ECN_CE);
	rv_csum_replace2(&inner->check, old, *w);
}

static __always_inline void rv_ecn_decap6(struct ipv6hdr *inner, __u8 outer_ecn)
{
	/* Traffic class is bits 20..27 of the first word, ECN its low two. */
	__be32 *w = (__be32 *)inner;
	__u32 ce = RV_ECN_CE << 20;
	__u32 first = bpf_ntohl(*w);

	if (outer_ecn != RV_ECN_CE || !(first & ce) || (first & ce) == ce)
		return;
	*w = bpf_htonl(first | ce);
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

/*
 * Drop the outer header: save the L2 header, move the packet start past
 * the outer header, write the L2 header back in front of the inner one,
 * then carry the outer ECN mark over. Copy sizes are constants per tag
 * count so the verifier sees fixed bounds. Returns 0 when done, 1 when
 * the packet was left untouched, -1 when it is broken beyond passing.
 */
static __always_inline int rv_decap_strip(struct xdp_md *ctx, __u32 l2_len,
					  const struct rv_decap *d)
{
	__u8 l2[RV_DECAP_L2_MAX];
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;

	/* The caller saw L2, outer and inner IP headers: repeated for the
	 * verifier. */
	if (data + sizeof(l2) > data_end)
		return 1;
	__builtin_memcpy(l2, data, sizeof(l2));
	if (bpf_xdp_adjust_head(ctx, (int)d->outer_len))
		return 1;
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	/* The inner IP header (20 bytes at least) follows the L2 header, so
	 * this holds; if it did not, the frame has already lost its outer
	 * header and cannot be handed on. */
	if (data + sizeof(l2) > data_end)
		return -1;
	if (l2_len == RV_DECAP_L2_UNTAGGED)
		__builtin_memcpy(data, l2, RV_DECAP_L2_UNTAGGED);
	else if (l2_len == RV_DECAP_L2_ONE_TAG)
		__builtin_memcpy(data, l2, RV_DECAP_L2_ONE_TAG);
	else
		__builtin_memcpy(data, l2, RV_DECAP_L2_MAX);

	if (d->family == RV_FAMILY_V4) {
		struct iphdr *inner =
			rv_hdr(struct iphdr, data, data_end, l2_len);

		if (!inner)
			return -1;
		rv_ecn_decap4(inner, d->outer_ecn);
	} else {
		struct ipv6hdr *inner =
			rv_hdr(struct ipv6hdr, data, data_end, l2_len);

		if (!inner)
			return -1;
		rv_ecn_decap6(inner, d->outer_ecn);
	}
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
