/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Taking the outer header of an L3 DSR tunnel (IPIP, RFC 2003; IPv6 in
 * IPv6, RFC 2473) off a frame in XDP: a backend's decap program does it
 * for the VIPs it holds, xdp_ingress for the endpoints another node's L3
 * DSR sends to through this one.
 */
#ifndef RV_TUNNEL_H
#define RV_TUNNEL_H

#include "common.h"
#include "csum.h"

/* Ethernet with no, one or two VLAN tags (rv_parse_l2() accepts two). */
#define RV_DECAP_L2_UNTAGGED 14
#define RV_DECAP_L2_ONE_TAG 18
#define RV_DECAP_L2_MAX 22
/* ECN codepoints (RFC 3168) in the low two bits of the TOS octet. */
#define RV_ECN_MASK 0x03
#define RV_ECN_CE 0x03

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

#endif /* RV_TUNNEL_H */
