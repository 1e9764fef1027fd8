/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * ICMP errors about a VIP flow (fragmentation needed, packet too big,
 * unreachable) quote the packet that caused them: a reply the VIP sent.
 * Turned around, the quote names the client flow, and so the backend that
 * owns it; without this, path MTU discovery breaks for every VIP.
 */
#ifndef RV_ICMP_H
#define RV_ICMP_H

#include "csum.h"
#include "lb.h"

#define RV_ICMP_HDR_LEN 8

struct rv_ports {
	__be16 source;
	__be16 dest;
};

/* Offsets of the quoted packet, for the NAT translation. */
struct rv_icmp_quote {
	__u32 inner_l3;
	__u32 inner_l4;
	__be32 vip[4];
};

/* Read the quote into a client-side flow. Returns 0, or RV_PARSE_PASS for
 * a quote that is not a TCP or UDP packet from the address the error was
 * sent to (not ours to steer). */
static __always_inline int rv_icmp_quote(void *data, void *data_end,
					 const struct rv_pkt *pkt,
					 struct rv_flow *f,
					 struct rv_icmp_quote *q)
{
	struct rv_ports *ports;

	q->inner_l3 = pkt->l4_off + RV_ICMP_HDR_LEN;
	if (pkt->family == RV_FAMILY_V4) {
		struct iphdr *in =
			rv_hdr(struct iphdr, data, data_end, q->inner_l3);

		if (!in || in->ihl < 5)
			return RV_PARSE_PASS;
		if (in->saddr != pkt->daddr[0])
			return RV_PARSE_PASS;
		/* A quoted later fragment has no L4 header: the bytes past
		 * its IP header are payload, not ports, and must be neither
		 * matched against a VIP nor rewritten. */
		if (in->frag_off & bpf_htons(RV_IP_OFFSET))
			return RV_PARSE_PASS;
		f->proto = in->protocol;
		f->caddr[0] = in->daddr;
		q->vip[0] = in->saddr;
		q->inner_l4 = q->inner_l3 + in->ihl * 4;
	} else {
		struct ipv6hdr *in =
			rv_hdr(struct ipv6hdr, data, data_end, q->inner_l3);

		if (!in)
			return RV_PARSE_PASS;
		__builtin_memcpy(q->vip, &in->saddr, 16);
		if (q->vip[0] != pkt->daddr[0] || q->vip[1] != pkt->daddr[1] ||
		    q->vip[2] != pkt->daddr[2] || q->vip[3] != pkt->daddr[3])
			return RV_PARSE_PASS;
		f->proto = in->nexthdr;
		__builtin_memcpy(f->caddr, &in->daddr, 16);
		q->inner_l4 = q->inner_l3 + sizeof(*in);
	}
	if (f->proto != RV_IPPROTO_TCP && f->proto != RV_IPPROTO_UDP)
		return RV_PARSE_PASS;
	/* The quote ends where the error's IP packet does: bytes past it are
	 * padding or junk, outside the ICMP checksum, and no ports. */
	if (q->inner_l4 + sizeof(*ports) > pkt->l3_off + pkt->ip_len)
		return RV_PARSE_PASS;
	ports = rv_hdr(struct rv_ports, data, data_end, q->inner_l4);
	if (!ports)
		return RV_PARSE_PASS;
	f->family = pkt->family;
	f->vport = ports->source;
	f->cport = ports->dest;
	return 0;
}

/* What an ICMP error is turned into: its outer addresses and the quoted
 * packet's addresses and ports (IPv4 uses word 0). */
struct rv_icmp_xlat {
	__be32 outer_src[4];
	__be32 outer_dst[4];
	__be32 in_src[4];
	__be32 in_dst[4];
	__be16 in_sport;
	__be16 in_dport;
};

/* What an error becomes, in per-CPU scratch rather than on the stack
 * (xdp_ingress and its calls have 512 bytes in all). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct rv_icmp_xlat);
} icmp_scratch_map SEC(".maps");

/* The scratch entry, zeroed; NULL only if the map cannot be read. */
static __always_inline struct rv_icmp_xlat *rv_icmp_xlat(void)
{
	__u32 zero = 0;
	struct rv_icmp_xlat *x = bpf_map_lookup_elem(&icmp_scratch_map, &zero);

	if (x)
		__builtin_memset(x, 0, sizeof(*x));
	return x;
}

/* The quoted ports as one word (source then destination, as on the
 * wire): ones' complement sums take them in one swap. */
static __always_inline __u32 rv_ports_word(__be16 sport, __be16 dport)
{
	struct rv_ports p = { .source = sport, .dest = dport };

	return *(__u32 *)&p;
}

/*
 * Rewrite an ICMP error to `x`, fixing every checksum on the way
 * incrementally: outer IP, quoted IP, quoted L4 (when the quote carries
 * it), and the ICMP checksum over all of them (with ICMPv6's
 * pseudo-header, the outer addresses too). A field that keeps its value
 * changes no sum.
 *
 * A global function: verified once, with a stack frame of its own (the
 * swaps of IPv6's words spill registers, and inlined they pushed
 * xdp_ingress's stack past its 512 bytes). Its pointers are plain memory
 * to it, checked; the offsets it reads from them are bounded by rv_hdr.
 */
__noinline int rv_icmp_translate(struct xdp_md *ctx, const struct rv_pkt *pkt,
				 const struct rv_icmp_quote *q,
				 const struct rv_icmp_xlat *x)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct rv_ports *ports;
	__u16 *icsum, *l4csum;
	/* din: what the quoted addresses' change adds to a sum over them,
	 * added once to each checksum that covers them. */
	__u32 csum_off, c, ic, din, dports;
	__u16 old_l4csum;
	__u8 proto;
	int i;

	if (!pkt || !q || !x)
		return -RV_DROP_MALFORMED_L4;
	if (pkt->family == RV_FAMILY_V4) {
		struct iphdr *outer =
			rv_hdr(struct iphdr, data, data_end, pkt->l3_off);
		struct icmphdr *ih =
			rv_hdr(struct icmphdr, data, data_end, pkt->l4_off);
		struct iphdr *in =
			rv_hdr(struct iphdr, data, data_end, q->inner_l3);
		__u16 old_icheck;

		if (!outer || !ih || !in)
			return -RV_DROP_MALFORMED_L4;
		icsum = &ih->checksum;
		proto = in->protocol;
		c = rv_csum_open(outer->check);
		c = rv_csum_swap(c, outer->saddr, x->outer_src[0]);
		c = rv_csum_swap(c, outer->daddr, x->outer_dst[0]);
		outer->check = rv_csum_fold(c);
		outer->saddr = x->outer_src[0];
		outer->daddr = x->outer_dst[0];

		din = rv_csum_swap(0, in->saddr, x->in_src[0]);
		din = rv_csum_swap(din, in->daddr, x->in_dst[0]);
		old_icheck = in->check;
		in->check =
			rv_csum_fold(rv_csum_add(rv_csum_open(in->check), din));
		ic = rv_csum_add(rv_csum_open(*icsum), din);
		ic = rv_csum_swap(ic, old_icheck, in->check);
		in->saddr = x->in_src[0];
		in->daddr = x->in_dst[0];
	} else {
		struct ipv6hdr *outer =
			rv_hdr(struct ipv6hdr, data, data_end, pkt->l3_off);
		struct icmp6hdr *ih =
			rv_hdr(struct icmp6hdr, data, data_end, pkt->l4_off);
		struct ipv6hdr *in =
			rv_hdr(struct ipv6hdr, data, data_end, q->inner_l3);

		if (!outer || !ih || !in)
			return -RV_DROP_MALFORMED_L4;
		icsum = &ih->icmp6_cksum;
		proto = in->nexthdr;
		/* ICMPv6 sums a pseudo-header: the outer addresses too. Word
		 * by word, each written as it is summed: clang otherwise
		 * loads all 64 words first and spills them to the stack. */
		ic = rv_csum_open(*icsum);
		din = 0;
#pragma clang loop unroll(disable)
		for (i = 0; i < 4; i++) {
			__be32 *os = (__be32 *)&outer->saddr + i;
			__be32 *od = (__be32 *)&outer->daddr + i;
			__be32 *is = (__be32 *)&in->saddr + i;
			__be32 *id = (__be32 *)&in->daddr + i;

			ic = rv_csum_swap(ic, *os, x->outer_src[i]);
			ic = rv_csum_swap(ic, *od, x->outer_dst[i]);
			din = rv_csum_swap(din, *is, x->in_src[i]);
			din = rv_csum_swap(din, *id, x->in_dst[i]);
			*os = x->outer_src[i];
			*od = x->outer_dst[i];
			*is = x->in_src[i];
			*id = x->in_dst[i];
		}
		ic = rv_csum_add(ic, din);
	}

	ports = rv_hdr(struct rv_ports, data, data_end, q->inner_l4);
	if (!ports)
		return -RV_DROP_MALFORMED_L4;
	dports = rv_csum_swap(0, rv_ports_word(ports->source, ports->dest),
			      rv_ports_word(x->in_sport, x->in_dport));
	/* The quoted L4 checksum, where the quote is long enough to hold it
	 * (RFC 792 promises only 8 bytes: TCP's checksum is past them).
	 * Long enough means inside the error's IP packet: a checksum field
	 * found in the frame's padding is no part of the ICMP message, and
	 * changing it would break the ICMP checksum. */
	csum_off = q->inner_l4 + (proto == RV_IPPROTO_UDP ? 6 : 16);
	l4csum = rv_hdr(__u16, data, data_end, csum_off);
	if (l4csum && (csum_off + 2 > pkt->l3_off + pkt->ip_len ||
		       (proto == RV_IPPROTO_UDP && !*l4csum &&
			pkt->family == RV_FAMILY_V4)))
		l4csum = 0;
	if (l4csum) {
		old_l4csum = *l4csum;
		c = rv_csum_add(rv_csum_open(*l4csum), din);
		*l4csum = rv_csum_fold(rv_csum_add(c, dports));
		if (proto == RV_IPPROTO_UDP)
			rv_udp_csum_fixup(l4csum);
		ic = rv_csum_swap(ic, old_l4csum, *l4csum);
	}
	*icsum = rv_csum_fold(rv_csum_add(ic, dports));
	ports->source = x->in_sport;
	ports->dest = x->in_dport;
	return 0;
}

/*
 * NAT for an ICMP error: the quoted reply left here with the VIP as its
 * source (tc_nat put it there), so the backend must see its own address
 * and port in the quote, and the error must be addressed to it.
 */
static __always_inline int rv_icmp_nat(struct xdp_md *ctx,
				       const struct rv_pkt *pkt,
				       const struct rv_icmp_quote *q,
				       const struct rv_flow *f,
				       const __be32 *baddr, __be16 bport)
{
	struct rv_icmp_xlat *x = rv_icmp_xlat();

	if (!x)
		return -RV_DROP_MALFORMED_L4;
	x->in_sport = bport;
	x->in_dport = f->cport;
	rv_addr6_copy(x->outer_src, pkt->saddr);
	rv_addr6_copy(x->outer_dst, baddr);
	rv_addr6_copy(x->in_src, baddr);
	rv_addr6_copy(x->in_dst, f->caddr);
	return rv_icmp_translate(ctx, pkt, q, x);
}

#endif /* RV_ICMP_H */
