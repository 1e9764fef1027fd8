/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Parsing fills one packet descriptor that every later stage reads. It
 * returns 0 when the packet is something rivora may act on, RV_PARSE_PASS
 * when it is not ours to look at (non-IP, other L4 protocols), or a
 * negative RV_DROP_* reason for a malformed packet. Every read is checked
 * against data_end first; nothing beyond the packet is touched.
 */
#ifndef RV_PARSE_H
#define RV_PARSE_H

#include "common.h"

#define RV_PARSE_PASS 1

/* rv_pkt.flags */
#define RV_PKT_FRAG 0x01	/* part of a fragmented datagram */
#define RV_PKT_LATER_FRAG 0x02	/* a fragment with no L4 header */
#define RV_PKT_ICMP_ERR 0x04	/* an ICMP error we may steer */
#define RV_PKT_TCP_SYN 0x08	/* SYN without ACK */
#define RV_PKT_TCP_FIN_RST 0x10 /* FIN or RST: the flow is closing */

struct rv_pkt {
	__u32 l2_len; /* Ethernet plus VLAN tags */
	__u32 l3_off;
	__u32 l4_off;
	__u32 frag_hdr_off; /* IPv6: offset of the Fragment header, or 0 */
	__u32 ip_len;	    /* L3 length the IP header claims */
	__be32 saddr[4];    /* IPv4 uses [0] */
	__be32 daddr[4];
	__be32 frag_id; /* IPv4: the 16-bit id in network order */
	__be16 sport;
	__be16 dport;
	__u8 family; /* enum rv_family */
	__u8 proto;
	__u8 flags;
	__u8 pad;
};

/* Ethernet and up to two VLAN tags (802.1ad or 802.1Q outer, 802.1Q
 * inner). Returns the inner EtherType, or 0 for malformed. */
static __always_inline __be16 rv_parse_l2(void *data, void *data_end,
					  struct rv_pkt *pkt)
{
	struct ethhdr *eth = rv_hdr(struct ethhdr, data, data_end, 0);
	struct vlan_hdr *vh;
	__be16 proto;
	__u32 off = sizeof(*eth);
	int i;

	if (!eth)
		return 0;
	proto = eth->h_proto;
#pragma unroll
	for (i = 0; i < 2; i++) {
		if (proto != bpf_htons(RV_ETH_P_8021Q) &&
		    proto != bpf_htons(RV_ETH_P_8021AD))
			break;
		vh = rv_hdr(struct vlan_hdr, data, data_end, off);
		if (!vh)
			return 0;
		proto = vh->h_vlan_encapsulated_proto;
		off += sizeof(*vh);
	}
	pkt->l2_len = off;
	return proto;
}

static __always_inline int rv_parse_l4(void *data, void *data_end,
				       struct rv_pkt *pkt)
{
	__u32 off = pkt->l4_off;
	/* Headers end where the IP packet does, not where the frame does:
	 * bytes past ip_len are Ethernet padding (or junk), and a header
	 * completed by them is a truncated one. */
	__u32 ip_end = pkt->l3_off + pkt->ip_len;

	if (pkt->flags & RV_PKT_LATER_FRAG)
		return 0;

	if (pkt->proto == RV_IPPROTO_TCP) {
		struct tcphdr *th = rv_hdr(struct tcphdr, data, data_end, off);

		if (!th || th->doff < 5 || off + th->doff * 4 > ip_end)
			return -RV_DROP_MALFORMED_L4;
		pkt->sport = th->source;
		pkt->dport = th->dest;
		if (th->syn && !th->ack)
			pkt->flags |= RV_PKT_TCP_SYN;
		if (th->fin || th->rst)
			pkt->flags |= RV_PKT_TCP_FIN_RST;
		return 0;
	}
	if (pkt->proto == RV_IPPROTO_UDP) {
		struct udphdr *uh = rv_hdr(struct udphdr, data, data_end, off);

		if (!uh || off + sizeof(*uh) > ip_end)
			return -RV_DROP_MALFORMED_L4;
		pkt->sport = uh->source;
		pkt->dport = uh->dest;
		return 0;
	}
	if (pkt->proto == RV_IPPROTO_ICMP) {
		struct icmphdr *ih =
			rv_hdr(struct icmphdr, data, data_end, off);

		if (!ih || off + sizeof(*ih) > ip_end)
			return -RV_DROP_MALFORMED_L4;
		if (ih->type == RV_ICMP_DEST_UNREACH)
			pkt->flags |= RV_PKT_ICMP_ERR;
		return 0;
	}
	if (pkt->proto == RV_IPPROTO_ICMPV6) {
		struct icmp6hdr *ih =
			rv_hdr(struct icmp6hdr, data, data_end, off);

		if (!ih || off + sizeof(*ih) > ip_end)
			return -RV_DROP_MALFORMED_L4;
		if (ih->icmp6_type == RV_ICMPV6_DEST_UNREACH ||
		    ih->icmp6_type == RV_ICMPV6_PKT_TOOBIG)
			pkt->flags |= RV_PKT_ICMP_ERR;
		return 0;
	}
	return RV_PARSE_PASS;
}

static __always_inline int rv_parse_ipv4(void *data, void *data_end,
					 struct rv_pkt *pkt, int whole)
{
	struct iphdr *iph = rv_hdr(struct iphdr, data, data_end, pkt->l3_off);
	__u32 ihl_len, tot_len;
	__u16 frag;

	if (!iph)
		return -RV_DROP_MALFORMED_IPV4;
	ihl_len = iph->ihl * 4;
	tot_len = bpf_ntohs(iph->tot_len);
	/* Version, header length and total length, as ip_rcv_core() checks
	 * them: the kernel would drop these too, so dropping them here
	 * changes nothing but the count. Its header checksum check is not
	 * made: such a packet is forwarded (NAT's incremental update keeps
	 * the error) and the next kernel to receive it drops it. */
	if (iph->version != 4 || ihl_len < sizeof(*iph) || tot_len < ihl_len)
		return -RV_DROP_MALFORMED_IPV4;
	if (data + pkt->l3_off + ihl_len > data_end)
		return -RV_DROP_MALFORMED_IPV4;
	/* XDP sees the whole frame; an skb's linear part may end before
	 * its payload does (GSO, paged data), so tc only needs headers. */
	if (whole && data + pkt->l3_off + tot_len > data_end)
		return -RV_DROP_MALFORMED_IPV4;

	pkt->family = RV_FAMILY_V4;
	pkt->proto = iph->protocol;
	pkt->saddr[0] = iph->saddr;
	pkt->daddr[0] = iph->daddr;
	pkt->ip_len = tot_len;
	pkt->l4_off = pkt->l3_off + ihl_len;
	frag = bpf_ntohs(iph->frag_off);
	if (frag & (RV_IP_MF | RV_IP_OFFSET)) {
		pkt->flags |= RV_PKT_FRAG;
		pkt->frag_id = iph->id;
		if (frag & RV_IP_OFFSET)
			pkt->flags |= RV_PKT_LATER_FRAG;
	}
	return 0;
}

static __always_inline int rv_parse_ipv6(void *data, void *data_end,
					 struct rv_pkt *pkt, int whole)
{
	struct ipv6hdr *ip6h =
		rv_hdr(struct ipv6hdr, data, data_end, pkt->l3_off);
	__u32 off;
	__u8 nh;
	int i;

	if (!ip6h)
		return -RV_DROP_MALFORMED_IPV6;
	if (ip6h->version != 6)
		return -RV_DROP_MALFORMED_IPV6;
	pkt->ip_len = sizeof(*ip6h) + bpf_ntohs(ip6h->payload_len);
	if (whole && data + pkt->l3_off + pkt->ip_len > data_end)
		return -RV_DROP_MALFORMED_IPV6;
	pkt->family = RV_FAMILY_V6;
	__builtin_memcpy(pkt->saddr, &ip6h->saddr, 16);
	__builtin_memcpy(pkt->daddr, &ip6h->daddr, 16);

	nh = ip6h->nexthdr;
	off = pkt->l3_off + sizeof(*ip6h);
	/* No extension header, as nearly every packet: nothing to walk, and
	 * nothing the checks after the walk could refuse. */
	if (nh == RV_IPPROTO_TCP || nh == RV_IPPROTO_UDP) {
		pkt->proto = nh;
		pkt->l4_off = off;
		return 0;
	}
#pragma unroll
	for (i = 0; i < RV_MAX_EXT_HDRS; i++) {
		if (nh == RV_IPPROTO_HOPOPTS || nh == RV_IPPROTO_DSTOPTS ||
		    nh == RV_IPPROTO_ROUTING) {
			struct ipv6_opt_hdr *oh = rv_hdr(struct ipv6_opt_hdr,
							 data, data_end, off);

			/* Every extension header is at least 8 bytes, and
			 * inside payload_len (not merely inside the frame). */
			if (!oh || off + 8 > pkt->l3_off + pkt->ip_len)
				return -RV_DROP_MALFORMED_IPV6;
			nh = oh->nexthdr;
			off += (oh->hdrlen + 1) * 8;
			continue;
		}
		if (nh == RV_IPPROTO_FRAGMENT) {
			struct frag_hdr *fh =
				rv_hdr(struct frag_hdr, data, data_end, off);

			if (!fh ||
			    off + sizeof(*fh) > pkt->l3_off + pkt->ip_len)
				return -RV_DROP_MALFORMED_IPV6;
			pkt->flags |= RV_PKT_FRAG;
			pkt->frag_hdr_off = off;
			pkt->frag_id = fh->identification;
			/* Offset in the upper 13 bits; 0 means first. */
			if (bpf_ntohs(fh->frag_off) & 0xfff8)
				pkt->flags |= RV_PKT_LATER_FRAG;
			nh = fh->nexthdr;
			off += sizeof(*fh);
			if (pkt->flags & RV_PKT_LATER_FRAG)
				break;
			continue;
		}
		break;
	}
	/* Still inside an extension header chain after the last step: more
	 * headers than we walk, so not a packet rivora will forward. */
	if (nh == RV_IPPROTO_HOPOPTS || nh == RV_IPPROTO_DSTOPTS ||
	    nh == RV_IPPROTO_ROUTING ||
	    (nh == RV_IPPROTO_FRAGMENT && !(pkt->flags & RV_PKT_LATER_FRAG)))
		return RV_PARSE_PASS;
	/* An extension header that claims to run past the packet. */
	if (off > pkt->l3_off + pkt->ip_len)
		return -RV_DROP_MALFORMED_IPV6;
	pkt->proto = nh;
	pkt->l4_off = off;
	return 0;
}

/* Parse L2 and L3 (addresses, protocol, where L4 starts). `whole`: the
 * buffer holds the entire packet (XDP), so an IP length past its end is a
 * truncated packet; tc passes 0. */
static __always_inline int rv_parse_l3(void *data, void *data_end,
				       struct rv_pkt *pkt, int whole)
{
	__be16 proto = rv_parse_l2(data, data_end, pkt);

	if (!proto)
		return -RV_DROP_MALFORMED_L2;
	pkt->l3_off = pkt->l2_len;
	if (proto == bpf_htons(RV_ETH_P_IP))
		return rv_parse_ipv4(data, data_end, pkt, whole);
	if (proto == bpf_htons(RV_ETH_P_IPV6))
		return rv_parse_ipv6(data, data_end, pkt, whole);
	return RV_PARSE_PASS;
}

/* Parse from L2 to L4. */
static __always_inline int rv_parse(void *data, void *data_end,
				    struct rv_pkt *pkt, int whole)
{
	int ret = rv_parse_l3(data, data_end, pkt, whole);

	if (ret)
		return ret;
	return rv_parse_l4(data, data_end, pkt);
}

#endif /* RV_PARSE_H */
