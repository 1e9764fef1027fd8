/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The three ways out: NAT, DSR and L3 DSR (IPIP / IPv6-in-IPv6). */
#ifndef RV_FWD_H
#define RV_FWD_H

#include "csum.h"
#include "maps.h"
#include "parse.h"

#define RV_AF_INET 2
#define RV_AF_INET6 10
#define RV_TUNNEL_TTL 64

/* bpf_fib_lookup's 64 bytes of parameters, in a per-CPU scratch entry
 * rather than on the stack: xdp_ingress and the functions it calls share
 * 512 bytes, and inlined, each way out kept a copy of its own. Only asking
 * the FIB (no cached next hop) touches it. Holds nothing between runs. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct bpf_fib_lookup);
} fib_scratch_map SEC(".maps");

/* The scratch parameters, zeroed; NULL only if the map cannot be read. */
static __always_inline struct bpf_fib_lookup *rv_fib_params(void)
{
	__u32 zero = 0;
	struct bpf_fib_lookup *p = bpf_map_lookup_elem(&fib_scratch_map, &zero);

	if (p)
		__builtin_memset(p, 0, sizeof(*p));
	return p;
}

/* Write the L4 destination port and fix the L4 checksum for a new
 * destination address and port, in one fold. addr_from/addr_to are 1 or 4
 * words. */
static __always_inline int rv_nat_l4_dst(void *data, void *data_end,
					 const struct rv_pkt *pkt,
					 const __be32 *addr_from,
					 const __be32 *addr_to, __be16 port_to)
{
	__u16 *check;
	__be16 *dest;
	__u32 c;

	if (pkt->proto == RV_IPPROTO_TCP) {
		struct tcphdr *th =
			rv_hdr(struct tcphdr, data, data_end, pkt->l4_off);

		if (!th)
			return -RV_DROP_MALFORMED_L4;
		check = &th->check;
		dest = &th->dest;
	} else if (pkt->proto == RV_IPPROTO_UDP) {
		struct udphdr *uh =
			rv_hdr(struct udphdr, data, data_end, pkt->l4_off);

		if (!uh)
			return -RV_DROP_MALFORMED_L4;
		/* No checksum (IPv4 only): none to fix. */
		if (!uh->check && pkt->family == RV_FAMILY_V4) {
			uh->dest = port_to;
			return 0;
		}
		check = &uh->check;
		dest = &uh->dest;
	} else {
		return 0;
	}
	c = rv_csum_open(*check);
	if (pkt->family == RV_FAMILY_V4)
		c = rv_csum_swap(c, addr_from[0], addr_to[0]);
	else
		c = rv_csum_swap16(c, addr_from, addr_to);
	*check = rv_csum_fold(rv_csum_swap(c, *dest, port_to));
	if (pkt->proto == RV_IPPROTO_UDP)
		rv_udp_csum_fixup(check);
	*dest = port_to;
	return 0;
}

/* Destination NAT of a request: address, port, every checksum. A later
 * fragment has no L4 header; its first fragment's checksum already
 * covers it. */
static __always_inline int rv_nat_forward(void *data, void *data_end,
					  const struct rv_pkt *pkt,
					  const __be32 *baddr, __be16 bport)
{
	if (pkt->family == RV_FAMILY_V4) {
		struct iphdr *iph =
			rv_hdr(struct iphdr, data, data_end, pkt->l3_off);

		if (!iph)
			return -RV_DROP_MALFORMED_IPV4;
		rv_csum_replace4(&iph->check, iph->daddr, baddr[0]);
		iph->daddr = baddr[0];
	} else {
		struct ipv6hdr *ip6h =
			rv_hdr(struct ipv6hdr, data, data_end, pkt->l3_off);

		if (!ip6h)
			return -RV_DROP_MALFORMED_IPV6;
		__builtin_memcpy(&ip6h->daddr, baddr, 16);
	}
	if (pkt->flags & RV_PKT_LATER_FRAG)
		return 0;
	return rv_nat_l4_dst(data, data_end, pkt, pkt->daddr, baddr, bport);
}

/* What a cached next hop lets the datapath do. */
enum rv_nh_way {
	RV_NH_ASK,  /* none cached, or stale: ask the FIB */
	RV_NH_SEND, /* send it out of nh->ifindex to nh->dmac */
	RV_NH_PASS, /* an egress rivorad is not attached to: the kernel's */
};

/* Read a backend's cached next hop; a miss is counted by backend id for
 * rivorad to resolve (it polls nh_miss_map). */
static __always_inline int
rv_nh_use(struct xdp_md *ctx, const struct rv_nexthop *nh, __u32 backend_id)
{
	__u8 flags = nh->flags;
	struct rv_nh_miss *m;

	if (!(flags & RV_NH_F_STALE)) {
		if ((flags & RV_NH_F_TX_ONLY) &&
		    nh->ifindex != ctx->ingress_ifindex)
			return RV_NH_PASS;
		if (flags & RV_NH_F_VALID)
			return RV_NH_SEND;
		if (flags & RV_NH_F_KERNEL)
			return RV_NH_PASS;
	}
	m = bpf_map_lookup_elem(&nh_miss_map, &backend_id);
	if (m)
		m->packets++;
	return RV_NH_ASK;
}

/* Set the MACs and send: XDP_TX out of the ingress interface, else a
 * redirect (to an interface rivorad is attached to, which runs XDP, as a
 * redirect into a veth needs). One call site per path: clang merges the
 * context loads of two inlined copies into one with a variable offset,
 * which the verifier refuses. */
static __always_inline int rv_send(struct xdp_md *ctx, __u32 ifindex,
				   const __u8 *dmac, const __u8 *smac)
{
	void *data = rv_xdp_data(ctx);
	void *data_end = rv_xdp_data_end(ctx);
	struct ethhdr *eth = rv_hdr(struct ethhdr, data, data_end, 0);

	if (!eth)
		return -RV_DROP_MALFORMED_L2;
	__builtin_memcpy(eth->h_dest, dmac, RV_ETH_ALEN);
	__builtin_memcpy(eth->h_source, smac, RV_ETH_ALEN);
	if (ifindex == ctx->ingress_ifindex)
		return RV_XDP_TX;
	return bpf_redirect(ifindex, 0);
}

/* DSR: the backend holds the VIP itself; only the frame changes hands,
 * out of the interface it came in on. Its source MAC is that interface's:
 * the cached next hop's when the backend is reached through it (one read
 * of the backend entry already made), else iface_mac_map's. */
static __always_inline int rv_dsr_forward(struct xdp_md *ctx,
					  const __u8 *backend_mac,
					  const struct rv_nexthop *nh)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = rv_hdr(struct ethhdr, data, data_end, 0);
	__u32 ifindex = ctx->ingress_ifindex;
	struct rv_iface_mac *own;

	if (!eth)
		return -RV_DROP_MALFORMED_L2;
	if ((nh->flags & (RV_NH_F_VALID | RV_NH_F_STALE)) == RV_NH_F_VALID &&
	    nh->ifindex == ifindex) {
		__builtin_memcpy(eth->h_source, nh->smac, RV_ETH_ALEN);
	} else {
		own = bpf_map_lookup_elem(&iface_mac_map, &ifindex);
		if (!own)
			return -RV_DROP_NO_IFACE_MAC;
		__builtin_memcpy(eth->h_source, own->mac, RV_ETH_ALEN);
	}
	__builtin_memcpy(eth->h_dest, backend_mac, RV_ETH_ALEN);
	return RV_XDP_TX;
}

/*
 * Make room for an outer header of `room` bytes between the L2 header
 * (tags included) and the IP header. Handed to the kernel afterwards
 * (`keep_l2`), the frame keeps the L2 header it came with: the first 22
 * bytes (Ethernet and two tags at most) are copied forward whatever l2_len
 * is, and the bytes past l2_len land where the outer header goes and are
 * overwritten. Sent by us from an untagged frame, only the EtherType is
 * written here (`proto`, the inner packet's, as the outer header is of the
 * same family); rv_send writes the MACs.
 */
static __always_inline int rv_push_room(struct xdp_md *ctx, int room,
					int keep_l2, __u32 l2_len, __be16 proto)
{
	__u8 l2[sizeof(struct ethhdr) + 2 * sizeof(struct vlan_hdr)];
	void *data = rv_xdp_data(ctx);
	void *data_end = rv_xdp_data_end(ctx);
	struct ethhdr *eth;

	if (!keep_l2 && l2_len == sizeof(struct ethhdr)) {
		if (bpf_xdp_adjust_head(ctx, -room))
			return -RV_DROP_HEADROOM;
		eth = rv_hdr(struct ethhdr, rv_xdp_data(ctx),
			     rv_xdp_data_end(ctx), 0);
		if (!eth)
			return -RV_DROP_HEADROOM;
		eth->h_proto = proto;
		return 0;
	}
	if (data + sizeof(l2) > data_end)
		return -RV_DROP_MALFORMED_L2;
	__builtin_memcpy(l2, data, sizeof(l2));
	if (bpf_xdp_adjust_head(ctx, -room))
		return -RV_DROP_HEADROOM;
	data = rv_xdp_data(ctx);
	data_end = rv_xdp_data_end(ctx);
	if (data + sizeof(l2) > data_end)
		return -RV_DROP_HEADROOM;
	__builtin_memcpy(data, l2, sizeof(l2));
	return 0;
}

/* The route says nobody is there: decided before the packet is touched. */
static __always_inline int rv_fib_says_unreachable(int rc)
{
	return rc == BPF_FIB_LKUP_RET_BLACKHOLE ||
	       rc == BPF_FIB_LKUP_RET_UNREACHABLE ||
	       rc == BPF_FIB_LKUP_RET_PROHIBIT;
}

/*
 * Whether a FIB answer lets this program send the frame itself. XDP_TX
 * needs nothing more; a redirect needs XDP on the target device (veth and
 * many drivers drop redirected frames silently otherwise), and the
 * interfaces rivorad attaches to are the ones in iface_mac_map, less those
 * it runs on as generic XDP, which have no XDP transmit (a bridge).
 */
static __always_inline int rv_fib_can_send(struct xdp_md *ctx, int rc,
					   const struct bpf_fib_lookup *p)
{
	__u32 ifindex = p->ifindex;
	struct rv_iface_mac *to;

	if (rc != BPF_FIB_LKUP_RET_SUCCESS)
		return 0;
	if (ifindex == ctx->ingress_ifindex)
		return 1;
	to = bpf_map_lookup_elem(&iface_mac_map, &ifindex);
	return to && !(to->flags & RV_IFACE_F_GENERIC_XDP);
}

/* The kernel routes every fragment, the first included, without ports (its
 * flow dissector stops at a fragment's IP header): so do we, and all the
 * fragments of a datagram take one path. */
static __always_inline void rv_fib_ports(struct bpf_fib_lookup *p,
					 const struct rv_pkt *pkt, __be16 bport)
{
	if (pkt->flags & RV_PKT_FRAG)
		return;
	p->sport = pkt->sport;
	p->dport = bport;
}

/* Where an encapsulated packet goes, and how it leaves. */
struct rv_l3dsr_out {
	const __u8 *dmac;
	const __u8 *smac;
	__u32 ifindex;
};

/*
 * Where an encapsulated packet goes, decided before it is built: by the
 * cached next hop (larger than its MTU: the kernel's, as the FIB would say
 * FRAG_NEEDED), or by the FIB's answer: send it ourselves (1, `out` says
 * where), let the kernel finish the job (0: no neighbour entry yet,
 * forwarding off, too big for the egress MTU: the kernel resolves, refuses
 * or fragments; an egress rivorad is not attached to, which a redirect
 * could not reach), or drop it because the route says nobody is there.
 */
static __always_inline int rv_l3dsr_route(struct xdp_md *ctx, int use,
					  const struct rv_nexthop *nh,
					  __u32 tot_len, int rc,
					  const struct bpf_fib_lookup *p,
					  struct rv_l3dsr_out *out)
{
	if (use == RV_NH_PASS)
		return 0;
	if (use == RV_NH_SEND) {
		if (tot_len > nh->mtu)
			return 0;
		out->ifindex = nh->ifindex;
		out->dmac = nh->dmac;
		out->smac = nh->smac;
		return 1;
	}
	if (!p || !rv_fib_can_send(ctx, rc, p))
		return rv_fib_says_unreachable(rc) ? -RV_DROP_FIB_UNREACHABLE
						   : 0;
	out->ifindex = p->ifindex;
	out->dmac = p->dmac;
	out->smac = p->smac;
	return 1;
}

/*
 * A NAT'd request leaves as a router would send it, without a trip through
 * the kernel's stack, when the FIB names a resolved next hop out of an
 * interface we can send to. Anything else is the kernel's to finish after
 * the rewrite, as before: it resolves a missing neighbour, sends Time
 * Exceeded, frag-needed or Packet Too Big, refuses when forwarding is off,
 * and counts. A TTL that would expire is checked before the lookup, which
 * it would make useless. The ports are the rewritten ones, so policy
 * routing and multipath hashing see the flow the backend will see. VLAN
 * tags stay as they arrived, as with L3 DSR. `src` is the source the packet
 * leaves with (the client's under NAT, this node's under full NAT).
 */
static __always_inline int rv_nat_route_v4(struct xdp_md *ctx,
					   const struct rv_pkt *pkt, __be32 src,
					   __be32 backend, __be16 bport,
					   const struct rv_nexthop *nh,
					   __u32 backend_id)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct iphdr *iph = rv_hdr(struct iphdr, data, data_end, pkt->l3_off);
	struct bpf_fib_lookup *p;
	const __u8 *dmac, *smac;
	__u32 ifindex;
	__u8 ttl;
	int rc, use;

	if (!iph)
		return -RV_DROP_MALFORMED_IPV4;
	ttl = iph->ttl;
	/* Options (record route, timestamps, source routes) are acted on by
	 * the kernel's forwarding; they are rare enough to leave to it. */
	if (ttl <= 1 || iph->ihl != 5)
		return RV_XDP_PASS;
	/* The cached next hop is the FIB's answer, kept by rivorad: the
	 * same MTU rule (larger than it: the kernel's, to fragment or
	 * refuse), the same egress. */
	use = rv_nh_use(ctx, nh, backend_id);
	if (use == RV_NH_PASS || (use == RV_NH_SEND && pkt->ip_len > nh->mtu))
		return RV_XDP_PASS;
	if (use == RV_NH_SEND) {
		ifindex = nh->ifindex;
		dmac = nh->dmac;
		smac = nh->smac;
		goto send;
	}
	p = rv_fib_params();
	if (!p)
		return RV_XDP_PASS;
	p->family = RV_AF_INET;
	p->tos = iph->tos;
	p->l4_protocol = pkt->proto;
	rv_fib_ports(p, pkt, bport);
	/* Set, so that the lookup checks the egress MTU: the device's, or
	 * the route's only when locked (`mtu lock`). A plain route MTU,
	 * which the kernel's forwarding honours, goes unseen here. */
	p->tot_len = pkt->ip_len;
	p->ipv4_src = src;
	p->ipv4_dst = backend;
	p->ifindex = ctx->ingress_ifindex;
	rc = bpf_fib_lookup(ctx, p, sizeof(*p), 0);
	if (!rv_fib_can_send(ctx, rc, p))
		return RV_XDP_PASS;
	ifindex = p->ifindex;
	dmac = p->dmac;
	smac = p->smac;
send:
	rv_ip_decrease_ttl(iph, ttl);
	return rv_send(ctx, ifindex, dmac, smac);
}

static __always_inline int
rv_nat_route_v6(struct xdp_md *ctx, const struct rv_pkt *pkt, const __be32 *src,
		const __be32 *backend, __be16 bport,
		const struct rv_nexthop *nh, __u32 backend_id)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ipv6hdr *ip6h =
		rv_hdr(struct ipv6hdr, data, data_end, pkt->l3_off);
	struct bpf_fib_lookup *p;
	const __u8 *dmac, *smac;
	__u32 ifindex;
	int rc, use;

	if (!ip6h)
		return -RV_DROP_MALFORMED_IPV6;
	/* Hop-by-Hop options are for every router on the way to act on. */
	if (ip6h->hop_limit <= 1 || ip6h->nexthdr == RV_IPPROTO_HOPOPTS)
		return RV_XDP_PASS;
	use = rv_nh_use(ctx, nh, backend_id);
	if (use == RV_NH_PASS || (use == RV_NH_SEND && pkt->ip_len > nh->mtu))
		return RV_XDP_PASS;
	if (use == RV_NH_SEND) {
		ifindex = nh->ifindex;
		dmac = nh->dmac;
		smac = nh->smac;
		goto send;
	}
	p = rv_fib_params();
	if (!p)
		return RV_XDP_PASS;
	p->family = RV_AF_INET6;
	/* Traffic class and flow label: what the kernel's own route lookup
	 * for a forwarded packet keys on. */
	p->flowinfo = *(__be32 *)ip6h & bpf_htonl(0x0fffffff);
	p->l4_protocol = pkt->proto;
	rv_fib_ports(p, pkt, bport);
	p->tot_len = pkt->ip_len;
	rv_addr6_copy(p->ipv6_src, src);
	rv_addr6_copy(p->ipv6_dst, backend);
	p->ifindex = ctx->ingress_ifindex;
	rc = bpf_fib_lookup(ctx, p, sizeof(*p), 0);
	if (!rv_fib_can_send(ctx, rc, p))
		return RV_XDP_PASS;
	ifindex = p->ifindex;
	dmac = p->dmac;
	smac = p->smac;
send:
	ip6h->hop_limit--;
	return rv_send(ctx, ifindex, dmac, smac);
}

/* The checksum of the IPIP outer header we build (no options, TTL
 * RV_TUNNEL_TTL), from the values written rather than read back from the
 * packet. Host-order reads of its 16-bit words are what is summed, so each
 * operand is taken as those bytes would read. */
static __always_inline __u16 rv_ipip_csum(__u8 tos, __u16 tot_len, __be16 id,
					  __be16 frag_off, __be32 saddr,
					  __be32 daddr)
{
	__u64 c = (__u64)bpf_htons(0x4500 | tos) + bpf_htons(tot_len) + id +
		  frag_off + bpf_htons((RV_TUNNEL_TTL << 8) | RV_IPPROTO_IPIP) +
		  saddr + daddr;

	c = (c & 0xffffffff) + (c >> 32);
	c = (c & 0xffffffff) + (c >> 32);
	return rv_csum_fold((__u32)c);
}

/* L3 DSR for IPv4: IPIP to the backend (RFC 2003). */
static __always_inline int rv_l3dsr_v4(struct xdp_md *ctx,
				       const struct rv_pkt *pkt, __be32 backend,
				       const struct rv_nexthop *nh,
				       __u32 backend_id)
{
	/* Only when the FIB is asked: the cached next hop's path has no use
	 * for it. */
	struct bpf_fib_lookup *p = 0;
	struct rv_l3dsr_out out = {};
	struct rv_tunnel_config *tc;
	struct iphdr *outer, *inner;
	void *data, *data_end;
	__u32 zero = 0;
	__u16 tot_len;
	__u8 tos;
	__be16 df, id;
	int rc = 0, ret, use, send;

	tc = bpf_map_lookup_elem(&tunnel_config_map, &zero);
	if (!tc || !tc->src4)
		return -RV_DROP_NO_TUNNEL_SRC;
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	inner = rv_hdr(struct iphdr, data, data_end, pkt->l3_off);
	if (!inner)
		return -RV_DROP_MALFORMED_IPV4;
	tos = inner->tos;
	df = inner->frag_off & bpf_htons(RV_IP_DF);
	tot_len = pkt->ip_len + sizeof(struct iphdr);

	use = rv_nh_use(ctx, nh, backend_id);
	if (use == RV_NH_ASK) {
		p = rv_fib_params();
		if (!p)
			return RV_XDP_PASS;
		p->family = RV_AF_INET;
		p->tos = tos;
		p->l4_protocol = RV_IPPROTO_IPIP;
		p->tot_len = tot_len;
		p->ipv4_src = tc->src4;
		p->ipv4_dst = backend;
		p->ifindex = ctx->ingress_ifindex;
		rc = bpf_fib_lookup(ctx, p, sizeof(*p), 0);
		if (rv_fib_says_unreachable(rc))
			return -RV_DROP_FIB_UNREACHABLE;
	}

	send = rv_l3dsr_route(ctx, use, nh, tot_len, rc, p, &out);
	if (send < 0)
		return send;
	ret = rv_push_room(ctx, sizeof(struct iphdr), !send, pkt->l2_len,
			   bpf_htons(RV_ETH_P_IP));
	if (ret)
		return ret;
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	outer = rv_hdr(struct iphdr, data, data_end, pkt->l2_len);
	if (!outer)
		return -RV_DROP_HEADROOM;
	/* RFC 6864: an atomic datagram's id means nothing, so DF packets
	 * carry 0; one that may be fragmented on the way needs an id not
	 * reused within the reassembly window, and a random one is that
	 * without shared state (the flow hash would repeat per packet). */
	id = df ? 0 : (__be16)bpf_get_prandom_u32();
	outer->version = 4;
	outer->ihl = 5;
	outer->tos = tos;
	outer->tot_len = bpf_htons(tot_len);
	outer->id = id;
	outer->frag_off = df;
	outer->ttl = RV_TUNNEL_TTL;
	outer->protocol = RV_IPPROTO_IPIP;
	outer->saddr = tc->src4;
	outer->daddr = backend;
	outer->check = rv_ipip_csum(tos, tot_len, id, df, tc->src4, backend);
	if (!send)
		return RV_XDP_PASS;
	return rv_send(ctx, out.ifindex, out.dmac, out.smac);
}

/* L3 DSR for IPv6: IPv6-in-IPv6 to the backend (RFC 2473). */
static __always_inline int
rv_l3dsr_v6(struct xdp_md *ctx, const struct rv_pkt *pkt, const __be32 *backend,
	    __u32 label, const struct rv_nexthop *nh, __u32 backend_id)
{
	struct bpf_fib_lookup *p = 0; /* only when the FIB is asked */
	struct rv_l3dsr_out out = {};
	struct rv_tunnel_config *tc;
	struct ipv6hdr *outer, *inner;
	void *data, *data_end;
	__u32 zero = 0, tclass, tot_len = pkt->ip_len + sizeof(*outer);
	int rc = 0, ret, use, send;

	tc = bpf_map_lookup_elem(&tunnel_config_map, &zero);
	if (!tc || rv_addr6_is_zero(tc->src6))
		return -RV_DROP_NO_TUNNEL_SRC;
	inner = rv_hdr(struct ipv6hdr, (void *)(long)ctx->data,
		       (void *)(long)ctx->data_end, pkt->l3_off);
	if (!inner)
		return -RV_DROP_MALFORMED_IPV6;
	tclass = (bpf_ntohl(*(__be32 *)inner) >> 20) & 0xff;

	use = rv_nh_use(ctx, nh, backend_id);
	if (use == RV_NH_ASK) {
		p = rv_fib_params();
		if (!p)
			return RV_XDP_PASS;
		p->family = RV_AF_INET6;
		p->l4_protocol = RV_IPPROTO_IPV6;
		p->tot_len = tot_len;
		rv_addr6_copy(p->ipv6_src, tc->src6);
		rv_addr6_copy(p->ipv6_dst, backend);
		p->ifindex = ctx->ingress_ifindex;
		rc = bpf_fib_lookup(ctx, p, sizeof(*p), 0);
		if (rv_fib_says_unreachable(rc))
			return -RV_DROP_FIB_UNREACHABLE;
	}

	send = rv_l3dsr_route(ctx, use, nh, tot_len, rc, p, &out);
	if (send < 0)
		return send;
	ret = rv_push_room(ctx, sizeof(struct ipv6hdr), !send, pkt->l2_len,
			   bpf_htons(RV_ETH_P_IPV6));
	if (ret)
		return ret;
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	outer = rv_hdr(struct ipv6hdr, data, data_end, pkt->l2_len);
	if (!outer)
		return -RV_DROP_HEADROOM;
	/* Version 6, the inner traffic class (as IPv4 copies TOS), and the
	 * flow's label (rv_flow_label) so that ECMP between here and the
	 * backend keeps a flow on one path. */
	*(__be32 *)outer =
		bpf_htonl(0x60000000 | (tclass << 20) | (label & 0xfffff));
	outer->payload_len = bpf_htons(pkt->ip_len);
	outer->nexthdr = RV_IPPROTO_IPV6;
	outer->hop_limit = RV_TUNNEL_TTL;
	__builtin_memcpy(&outer->saddr, tc->src6, 16);
	__builtin_memcpy(&outer->daddr, backend, 16);
	if (!send)
		return RV_XDP_PASS;
	return rv_send(ctx, out.ifindex, out.dmac, out.smac);
}

#endif /* RV_FWD_H */
