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

/*
 * NAT for an ICMP error: the quoted reply left here with the VIP as its
 * source (tc_nat put it there), so the backend must see its own address
 * and port in the quote, and the error must be addressed to it. Every
 * checksum on the way is fixed incrementally: outer IP, quoted IP, quoted
 * L4 (when the quote carries it), and the ICMP checksum over all of them.
 */
static __always_inline int rv_icmp_nat(void *data, void *data_end,
				       const struct rv_pkt *pkt,
				       const struct rv_icmp_quote *q,
				       const __be32 *baddr, __be16 bport)
{
	struct rv_ports *ports;
	__u16 *icsum, *l4csum = 0;
	__u16 old_l4csum = 0;
	__u32 csum_off;
	__u8 proto;

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
		rv_csum_replace4(&outer->check, outer->daddr, baddr[0]);
		outer->daddr = baddr[0];

		old_icheck = in->check;
		rv_csum_replace4(&in->check, in->saddr, baddr[0]);
		rv_csum_replace4(icsum, in->saddr, baddr[0]);
		rv_csum_replace2(icsum, old_icheck, in->check);
		in->saddr = baddr[0];
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
		/* ICMPv6 sums a pseudo-header: the outer destination too. */
		rv_csum_replace16(icsum, (__be32 *)&outer->daddr, baddr);
		__builtin_memcpy(&outer->daddr, baddr, 16);
		rv_csum_replace16(icsum, (__be32 *)&in->saddr, baddr);
		__builtin_memcpy(&in->saddr, baddr, 16);
	}

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
	ports = rv_hdr(struct rv_ports, data, data_end, q->inner_l4);
	if (!ports)
		return -RV_DROP_MALFORMED_L4;
	if (l4csum) {
		old_l4csum = *l4csum;
		if (pkt->family == RV_FAMILY_V4)
			rv_csum_replace4(l4csum, q->vip[0], baddr[0]);
		else
			rv_csum_replace16(l4csum, q->vip, baddr);
		rv_csum_replace2(l4csum, ports->source, bport);
		if (proto == RV_IPPROTO_UDP)
			rv_udp_csum_fixup(l4csum);
		rv_csum_replace2(icsum, old_l4csum, *l4csum);
	}
	rv_csum_replace2(icsum, ports->source, bport);
	ports->source = bport;
	return 0;
}

#endif /* RV_ICMP_H */
