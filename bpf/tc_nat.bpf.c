// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * tc_nat (TCX egress): a NAT VIP's reply, on its way back to the client,
 * gets the VIP back as its source: the VIP that owns the backend when the
 * owner's affinity entry for the flow names it, else the nat_reverse_map
 * entry xdp_ingress recorded when it rewrote the request (lib/nat.h).
 *
 * The skb checksum helpers are used rather than XDP's arithmetic: a reply
 * forwarded from a backend may be CHECKSUM_PARTIAL (GSO), and
 * bpf_l4_csum_replace() knows how to fix that state too.
 */
#include "lib/common.h"
#include "lib/maps.h"
#include "lib/nat.h"
#include "lib/parse.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Enough for Ethernet, two tags, IPv6 with a few extension headers and
 * TCP; pulling the whole skb would linearise GSO packets. */
#define RV_TC_PULL_LEN 256

#define RV_IPV4_CSUM_OFF 10
#define RV_IPV4_SADDR_OFF 12
#define RV_IPV6_SADDR_OFF 8
#define RV_TCP_CSUM_OFF 16
#define RV_UDP_CSUM_OFF 6

static __always_inline int rv_l4_csum_off(__u8 proto)
{
	return proto == RV_IPPROTO_TCP ? RV_TCP_CSUM_OFF : RV_UDP_CSUM_OFF;
}

static __always_inline __u64 rv_l4_flags(__u8 proto, __u64 size)
{
	/* UDP over IPv4 may have no checksum: leave a 0 alone, and send a
	 * computed 0 as 0xffff. */
	return size | (proto == RV_IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0);
}

/* Source address (and checksums) of a v4 or v6 packet. */
static __always_inline int rv_snat_addr(struct __sk_buff *skb,
					const struct rv_pkt *pkt,
					const __be32 *vip, int l4)
{
	int csum_off = pkt->l4_off + rv_l4_csum_off(pkt->proto);
	__u64 l4_flags = rv_l4_flags(pkt->proto, 4) | BPF_F_PSEUDO_HDR;
	int i;

	if (pkt->family == RV_FAMILY_V4) {
		if (l4 && bpf_l4_csum_replace(skb, csum_off, pkt->saddr[0],
					      vip[0], l4_flags))
			return -1;
		if (bpf_l3_csum_replace(skb, pkt->l3_off + RV_IPV4_CSUM_OFF,
					pkt->saddr[0], vip[0], 4))
			return -1;
		return bpf_skb_store_bytes(skb, pkt->l3_off + RV_IPV4_SADDR_OFF,
					   vip, 4, 0);
	}
	if (l4) {
#pragma unroll
		for (i = 0; i < 4; i++)
			if (bpf_l4_csum_replace(skb, csum_off, pkt->saddr[i],
						vip[i], l4_flags))
				return -1;
	}
	return bpf_skb_store_bytes(skb, pkt->l3_off + RV_IPV6_SADDR_OFF, vip,
				   16, 0);
}

static __always_inline int rv_snat_port(struct __sk_buff *skb,
					const struct rv_pkt *pkt, __be16 port)
{
	int csum_off = pkt->l4_off + rv_l4_csum_off(pkt->proto);

	if (bpf_l4_csum_replace(skb, csum_off, pkt->sport, port,
				rv_l4_flags(pkt->proto, 2)))
		return -1;
	/* Source port is the first field of both TCP and UDP headers. */
	return bpf_skb_store_bytes(skb, pkt->l4_off, &port, 2, 0);
}

static __always_inline void rv_frag_rev_record(const struct rv_pkt *pkt,
					       const __be32 *vip, __u32 svc_id)
{
	if (pkt->family == RV_FAMILY_V4) {
		struct rv_frag_key k = {
			.saddr = pkt->saddr[0],
			.daddr = pkt->daddr[0],
			.id = (__be16)pkt->frag_id,
			.proto = pkt->proto,
		};
		struct rv_frag_rev_value v = { .vip_addr = vip[0],
					       .svc_id = svc_id };

		bpf_map_update_elem(&frag_rev_map, &k, &v, BPF_ANY);
	} else {
		struct rv_frag6_key k = { .id = pkt->frag_id,
					  .proto = pkt->proto };
		struct rv_frag_rev6_value v = { .svc_id = svc_id };

		rv_addr6_copy(k.saddr, pkt->saddr);
		rv_addr6_copy(k.daddr, pkt->daddr);
		rv_addr6_copy(v.vip_addr, vip);
		bpf_map_update_elem(&frag_rev_map6, &k, &v, BPF_ANY);
	}
}

/* A later fragment of a reply: only the address changes; the first
 * fragment's L4 checksum already accounts for it. */
static __always_inline int rv_reply_later_frag(struct __sk_buff *skb,
					       const struct rv_pkt *pkt)
{
	if (pkt->family == RV_FAMILY_V4) {
		struct rv_frag_key k = {
			.saddr = pkt->saddr[0],
			.daddr = pkt->daddr[0],
			.id = (__be16)pkt->frag_id,
			.proto = pkt->proto,
		};
		struct rv_frag_rev_value *v =
			bpf_map_lookup_elem(&frag_rev_map, &k);
		__be32 vip[4] = {};

		if (!v)
			return RV_TCX_NEXT;
		vip[0] = v->vip_addr;
		return rv_snat_addr(skb, pkt, vip, 0) ? RV_TCX_NEXT
						      : RV_TCX_PASS;
	} else {
		struct rv_frag6_key k = { .id = pkt->frag_id,
					  .proto = pkt->proto };
		struct rv_frag_rev6_value *v;
		__be32 vip[4];

		rv_addr6_copy(k.saddr, pkt->saddr);
		rv_addr6_copy(k.daddr, pkt->daddr);
		v = bpf_map_lookup_elem(&frag_rev_map6, &k);
		if (!v)
			return RV_TCX_NEXT;
		rv_addr6_copy(vip, v->vip_addr);
		return rv_snat_addr(skb, pkt, vip, 0) ? RV_TCX_NEXT
						      : RV_TCX_PASS;
	}
}

static __always_inline int rv_reply(struct __sk_buff *skb, struct rv_pkt *pkt)
{
	struct rv_nat_vip nv = {};

	if (rv_nat_vip_of(pkt->family, pkt->saddr, pkt->sport, pkt->daddr,
			  pkt->dport, pkt->proto, &nv))
		return RV_TCX_NEXT;
	if (pkt->flags & RV_PKT_FRAG)
		rv_frag_rev_record(pkt, nv.addr, nv.svc_id);
	if (rv_snat_port(skb, pkt, nv.port) ||
	    rv_snat_addr(skb, pkt, nv.addr, 1))
		return RV_TCX_NEXT;
	return RV_TCX_PASS;
}
/*
 * An ICMP error on its way to a client that quotes the client's own packet
 * as it left this node, i.e. after NAT: addressed to the backend. Such an
 * error comes from the backend or from this node (fragmentation needed on
 * the backend side, for one). The client only knows the VIP, so the quote
 * is turned back into client -> VIP:port, and a source that is the backend
 * becomes the VIP, with every checksum on the way fixed.
 */
static __always_inline int rv_reply_icmp(struct __sk_buff *skb,
					 const struct rv_pkt *pkt)
{
	__u32 icsum_off = pkt->l4_off + 2; /* icmphdr and icmp6hdr alike */
	__u32 in_l3 = pkt->l4_off + 8;
	__be32 old[4] = {}, vip[4] = {};
	__u16 old_c, new_c;
	__be16 ports[2], vport;
	__u32 ip_end = pkt->l3_off + pkt->ip_len;
	__u32 in_l4, l4c_off;
	__u64 pseudo = 0;
	__u8 proto;
	int i, words = 1;

	struct rv_nat_vip nv = {};

	if (pkt->family == RV_FAMILY_V4) {
		__be32 baddr[4] = {}, caddr[4] = {};
		struct iphdr in;

		if (bpf_skb_load_bytes(skb, in_l3, &in, sizeof(in)) ||
		    in.ihl < 5 || (in.frag_off & bpf_htons(RV_IP_OFFSET)) ||
		    in.saddr != pkt->daddr[0])
			return RV_TCX_NEXT;
		proto = in.protocol;
		in_l4 = in_l3 + in.ihl * 4;
		if ((proto != RV_IPPROTO_TCP && proto != RV_IPPROTO_UDP) ||
		    in_l4 + sizeof(ports) > ip_end ||
		    bpf_skb_load_bytes(skb, in_l4, ports, sizeof(ports)))
			return RV_TCX_NEXT;
		baddr[0] = in.daddr;
		caddr[0] = in.saddr;
		if (rv_nat_vip_of(RV_FAMILY_V4, baddr, ports[1], caddr,
				  ports[0], proto, &nv))
			return RV_TCX_NEXT;
		old[0] = in.daddr;
		vip[0] = nv.addr[0];
		vport = nv.port;
		/* The quoted IP header's checksum, and the ICMP checksum over
		 * both the address and that checksum. */
		if (bpf_l3_csum_replace(skb, in_l3 + 10, old[0], vip[0], 4) ||
		    bpf_skb_load_bytes(skb, in_l3 + 10, &new_c, 2) ||
		    bpf_skb_store_bytes(skb, in_l3 + 16, vip, 4, 0) ||
		    bpf_l4_csum_replace(skb, icsum_off, old[0], vip[0], 4) ||
		    bpf_l4_csum_replace(skb, icsum_off, in.check, new_c, 2))
			return RV_TCX_NEXT;
	} else {
		__be32 baddr[4], caddr[4];
		struct ipv6hdr in;

		if (bpf_skb_load_bytes(skb, in_l3, &in, sizeof(in)))
			return RV_TCX_NEXT;
		__builtin_memcpy(caddr, &in.saddr, 16);
		if (caddr[0] != pkt->daddr[0] || caddr[1] != pkt->daddr[1] ||
		    caddr[2] != pkt->daddr[2] || caddr[3] != pkt->daddr[3])
			return RV_TCX_NEXT;
		proto = in.nexthdr;
		in_l4 = in_l3 + sizeof(in);
		if ((proto != RV_IPPROTO_TCP && proto != RV_IPPROTO_UDP) ||
		    in_l4 + sizeof(ports) > ip_end ||
		    bpf_skb_load_bytes(skb, in_l4, ports, sizeof(ports)))
			return RV_TCX_NEXT;
		__builtin_memcpy(baddr, &in.daddr, 16);
		if (rv_nat_vip_of(RV_FAMILY_V6, baddr, ports[1], caddr,
				  ports[0], proto, &nv))
			return RV_TCX_NEXT;
		rv_addr6_copy(old, baddr);
		rv_addr6_copy(vip, nv.addr);
		vport = nv.port;
		words = 4;
		/* ICMPv6 sums a pseudo-header: the outer addresses count. */
		pseudo = BPF_F_PSEUDO_HDR;
		if (bpf_skb_store_bytes(skb, in_l3 + 24, vip, 16, 0))
			return RV_TCX_NEXT;
#pragma unroll
		for (i = 0; i < 4; i++)
			if (bpf_l4_csum_replace(skb, icsum_off, old[i], vip[i],
						4))
				return RV_TCX_NEXT;
	}

	/* The quoted L4 checksum, where the quote carries it (a UDP one of 0
	 * over IPv4 means none). The quote ends with the error's IP packet:
	 * what follows is padding, outside the ICMP checksum. */
	l4c_off = in_l4 + rv_l4_csum_off(proto);
	if (l4c_off + 2 <= ip_end &&
	    !bpf_skb_load_bytes(skb, l4c_off, &old_c, 2) &&
	    (old_c || proto != RV_IPPROTO_UDP || pkt->family == RV_FAMILY_V6)) {
#pragma unroll
		for (i = 0; i < 4; i++)
			if (i < words &&
			    bpf_l4_csum_replace(skb, l4c_off, old[i], vip[i],
						rv_l4_flags(proto, 4)))
				return RV_TCX_NEXT;
		if (bpf_l4_csum_replace(skb, l4c_off, ports[1], vport,
					rv_l4_flags(proto, 2)) ||
		    bpf_skb_load_bytes(skb, l4c_off, &new_c, 2) ||
		    bpf_l4_csum_replace(skb, icsum_off, old_c, new_c, 2))
			return RV_TCX_NEXT;
	}
	if (bpf_skb_store_bytes(skb, in_l4 + 2, &vport, 2, 0) ||
	    bpf_l4_csum_replace(skb, icsum_off, ports[1], vport, 2))
		return RV_TCX_NEXT;

	/* Sent by the backend itself: it must come from the VIP. From a
	 * router (this node included) it stays as it is. */
	if (pkt->saddr[0] != old[0] || pkt->saddr[1] != old[1] ||
	    pkt->saddr[2] != old[2] || pkt->saddr[3] != old[3])
		return RV_TCX_PASS;
	if (pkt->family == RV_FAMILY_V4) {
		if (bpf_l3_csum_replace(skb, pkt->l3_off + RV_IPV4_CSUM_OFF,
					old[0], vip[0], 4) ||
		    bpf_skb_store_bytes(skb, pkt->l3_off + RV_IPV4_SADDR_OFF,
					vip, 4, 0))
			return RV_TCX_NEXT;
		return RV_TCX_PASS;
	}
#pragma unroll
	for (i = 0; i < 4; i++)
		if (bpf_l4_csum_replace(skb, icsum_off, old[i], vip[i],
					4 | pseudo))
			return RV_TCX_NEXT;
	if (bpf_skb_store_bytes(skb, pkt->l3_off + RV_IPV6_SADDR_OFF, vip, 16,
				0))
		return RV_TCX_NEXT;
	return RV_TCX_PASS;
}

SEC("tcx/egress")
int tc_nat(struct __sk_buff *skb)
{
	struct rv_pkt pkt = {};
	void *data, *data_end;
	__u32 pull = skb->len < RV_TC_PULL_LEN ? skb->len : RV_TC_PULL_LEN;
	int ret;

	/* Headers may sit in a fragment page; a failed pull only means the
	 * parser below sees less and passes the packet on. */
	bpf_skb_pull_data(skb, pull);
	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	ret = rv_parse(data, data_end, &pkt, 0);
	if (ret)
		return RV_TCX_NEXT;
	if (pkt.flags & RV_PKT_LATER_FRAG)
		return rv_reply_later_frag(skb, &pkt);
	if (pkt.flags & RV_PKT_ICMP_ERR)
		return rv_reply_icmp(skb, &pkt);
	if (pkt.proto != RV_IPPROTO_TCP && pkt.proto != RV_IPPROTO_UDP)
		return RV_TCX_NEXT;
	return rv_reply(skb, &pkt);
}
