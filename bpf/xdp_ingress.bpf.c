// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * xdp_ingress: parse, match a VIP, rate-limit, pick a backend, forward.
 * Helpers return a verdict or a negative RV_DROP_* reason; only this file
 * turns a reason into XDP_DROP and counts it.
 */
#include "lib/btf_enums.h"
#include "lib/common.h"
#include "lib/csum.h"
#include "lib/fullnat.h"
#include "lib/fwd.h"
#include "lib/hash.h"
#include "lib/icmp.h"
#include "lib/lb.h"
#include "lib/maps.h"
#include "lib/nat.h"
#include "lib/parse.h"
#include "lib/ratelimit.h"
#include "lib/tunnel.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Frame length for the byte counters; computed from the pointers so the
 * verifier never sees a packet pointer spilled as a 32-bit scalar. */
static __always_inline __u64 rv_xdp_len(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;

	return data_end - data;
}

/*
 * Record what tc_nat needs to translate the flow's replies. A VIP that
 * owns the backend's (address, port, protocol) records nothing: its
 * affinity entry is the proof tc_nat checks (lib/nat.h). Any other flow
 * inserts its nat_reverse_map entry when new; an established one checks
 * the entry only when its affinity time is refreshed (once a second): an
 * entry the LRU let go comes back within a second, and the per-packet
 * path carries no second table lookup.
 */
static __always_inline void rv_nat_record(const struct rv_pkt *pkt,
					  const __be32 *baddr, __be16 bport,
					  const struct rv_target *t)
{
	struct rv_nat_owner *o;

	if (!(t->pick & (RV_PICK_NEW | RV_PICK_REFRESHED)))
		return;
	o = rv_nat_owner_get(pkt->family, baddr, bport, pkt->proto);
	/* tc_nat proves a reply by the owner's affinity entry naming the
	 * owner's backend id, so only then may the flow record nothing. An
	 * owner entry of this VIP naming another id is one the writer has
	 * not rewritten yet (the backend left and came back under a new id
	 * before the old entry was reclaimed): such a flow records its
	 * reverse entry like any other. */
	if (o && o->svc_id == t->svc_id) {
		if (o->backend_id == t->backend_id)
			return;
	} else if (o && (t->pick & RV_PICK_NEW)) {
		rv_nat_owner_forget(pkt->family, o, pkt->saddr, pkt->sport,
				    pkt->proto);
	}
	if (pkt->family == RV_FAMILY_V4) {
		struct rv_nat_key k = {
			.backend_addr = baddr[0],
			.client_addr = pkt->saddr[0],
			.backend_port = bport,
			.client_port = pkt->sport,
			.proto = pkt->proto,
		};
		struct rv_nat_value v = {
			.vip_addr = pkt->daddr[0],
			.vip_port = pkt->dport,
			.svc_id = t->svc_id,
		};

		if (!(t->pick & RV_PICK_NEW) &&
		    bpf_map_lookup_elem(&nat_reverse_map, &k))
			return;
		bpf_map_update_elem(&nat_reverse_map, &k, &v, BPF_ANY);
	} else {
		struct rv_nat6_key k = {
			.backend_port = bport,
			.client_port = pkt->sport,
			.proto = pkt->proto,
		};
		struct rv_nat6_value v = {
			.vip_port = pkt->dport,
			.svc_id = t->svc_id,
		};

		rv_addr6_copy(k.backend_addr, baddr);
		rv_addr6_copy(k.client_addr, pkt->saddr);
		rv_addr6_copy(v.vip_addr, pkt->daddr);
		if (!(t->pick & RV_PICK_NEW) &&
		    bpf_map_lookup_elem(&nat_reverse_map6, &k))
			return;
		bpf_map_update_elem(&nat_reverse_map6, &k, &v, BPF_ANY);
	}
}

/* Load backend `id` into `be` (its address not for DSR, which has no use
 * for it), with the port it is sent to (`dport`, the VIP's, when the
 * backend keeps it) and how it is reached. */
static __always_inline int rv_backend_get(__u8 family,
					  const struct rv_service *svc,
					  __u32 id, __be16 dport,
					  struct rv_be *be)
{
	if (family == RV_FAMILY_V4) {
		struct rv_backend *b = bpf_map_lookup_elem(&backend_map, &id);

		if (!b || !b->addr)
			return -RV_DROP_NO_BACKEND;
		be->addr[0] = b->addr;
		be->port = b->port;
		__builtin_memcpy(be->mac, b->mac, RV_ETH_ALEN);
		be->nh = b->nh;
	} else {
		struct rv_backend6 *b = bpf_map_lookup_elem(&backend_map6, &id);

		if (!b || rv_addr6_is_zero(b->addr))
			return -RV_DROP_NO_BACKEND;
		if (svc->mode != RV_MODE_DSR || b->nh.mode)
			rv_addr6_copy(be->addr, b->addr);
		be->port = b->port;
		__builtin_memcpy(be->mac, b->mac, RV_ETH_ALEN);
		be->nh = b->nh;
	}
	if (!be->port)
		be->port = dport;
	be->mode = be->nh.mode ? be->nh.mode : svc->mode;
	return 0;
}

/*
 * Send the packet to `be` the way it is reached. A global function,
 * verified once rather than inlined at each of the three paths that
 * forward (a new or established flow, a later fragment, an ICMP error),
 * with a frame of its own. Full NAT's source is in t->fnat_addr and
 * t->fnat_port (rv_fullnat_prepare()).
 */
__noinline int rv_forward(struct xdp_md *ctx, struct rv_pkt *pkt,
			  struct rv_target *t, const struct rv_be *be)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	int ret;

	if (!pkt || !t || !be)
		return -RV_DROP_NO_BACKEND;
	switch (be->mode) {
	case RV_MODE_NAT:
		ret = rv_nat_forward(data, data_end, pkt, be->addr, be->port);
		if (ret)
			return ret;
		if (!(pkt->flags & RV_PKT_LATER_FRAG))
			rv_nat_record(pkt, be->addr, be->port, t);
		if (pkt->family == RV_FAMILY_V4)
			return rv_nat_route_v4(ctx, pkt, pkt->saddr[0],
					       be->addr[0], be->port, &be->nh,
					       t->backend_id);
		return rv_nat_route_v6(ctx, pkt, pkt->saddr, be->addr, be->port,
				       &be->nh, t->backend_id);
	case RV_MODE_FULLNAT:
		/* An ICMP error comes translated (rv_fullnat_icmp_to_backend):
		 * it only needs sending. */
		if (!(pkt->flags & RV_PKT_ICMP_ERR)) {
			ret = rv_rewrite_tuple(data, data_end, pkt,
					       t->fnat_addr, be->addr,
					       t->fnat_port, be->port);
			if (ret)
				return ret;
		}
		if (pkt->family == RV_FAMILY_V4)
			return rv_nat_route_v4(ctx, pkt, t->fnat_addr[0],
					       be->addr[0], be->port, &be->nh,
					       t->backend_id);
		return rv_nat_route_v6(ctx, pkt, t->fnat_addr, be->addr,
				       be->port, &be->nh, t->backend_id);
	case RV_MODE_DSR:
		return rv_dsr_forward(ctx, be->mac, &be->nh);
	case RV_MODE_L3DSR:
		if (pkt->family == RV_FAMILY_V4)
			return rv_l3dsr_v4(ctx, pkt, be->addr[0], &be->nh,
					   t->backend_id);
		return rv_l3dsr_v6(ctx, pkt, be->addr, t->label, &be->nh,
				   t->backend_id);
	default:
		return -RV_DROP_NO_SERVICE;
	}
}

/* Forward, and count the packet for its VIP only when it went out: a
 * packet dropped on the way is counted under its drop reason alone. */
static __always_inline int rv_forward_counted(struct xdp_md *ctx,
					      struct rv_pkt *pkt,
					      struct rv_target *t,
					      const struct rv_be *be)
{
	__u64 len = rv_xdp_len(ctx);
	int ret = rv_forward(ctx, pkt, t, be);

	if (ret >= 0)
		rv_count_vip(t->svc_id, len);
	return ret;
}

/* A fragment without ports follows the choice its first fragment made. */
__noinline int rv_later_fragment(struct xdp_md *ctx, struct rv_pkt *pkt)
{
	struct rv_target t = {};
	struct rv_frag_value *fv;
	struct rv_service *svc;
	struct rv_be be = {};
	int ret;

	if (!pkt)
		return RV_XDP_PASS;

	if (pkt->family == RV_FAMILY_V4) {
		struct rv_frag_key k = {
			.saddr = pkt->saddr[0],
			.daddr = pkt->daddr[0],
			.id = (__be16)pkt->frag_id,
			.proto = pkt->proto,
		};

		fv = bpf_map_lookup_elem(&frag_map, &k);
	} else {
		struct rv_frag6_key k = { .id = pkt->frag_id,
					  .proto = pkt->proto };

		rv_addr6_copy(k.saddr, pkt->saddr);
		rv_addr6_copy(k.daddr, pkt->daddr);
		fv = bpf_map_lookup_elem(&frag_map6, &k);
	}
	if (!fv) {
		ret = rv_fullnat_reply_later_frag(ctx, pkt);
		if (ret != RV_FULLNAT_NOT_OURS)
			return ret;
		rv_count_drop(RV_DROP_FRAG_NO_FIRST);
		return RV_XDP_PASS;
	}
	svc = rv_service_get(fv->svc_id, pkt->family);
	if (!svc)
		return -RV_DROP_NO_SERVICE;
	t.svc_id = fv->svc_id;
	t.backend_id = fv->backend_id;
	ret = rv_backend_get(pkt->family, svc, t.backend_id, 0, &be);
	if (ret)
		return ret;
	/* Full NAT: no port to rewrite, only the source address. */
	if (be.mode == RV_MODE_FULLNAT) {
		ret = rv_fullnat_src(pkt->family, be.nh.fullnat_src,
				     t.fnat_addr);
		if (ret)
			return ret;
	}
	if (be.mode == RV_MODE_L3DSR && pkt->family == RV_FAMILY_V6)
		t.label = rv_flow_label(pkt->saddr, 0, 0, 0);
	return rv_forward_counted(ctx, pkt, &t, &be);
}

static __always_inline void rv_frag_record(const struct rv_pkt *pkt,
					   const struct rv_target *t)
{
	struct rv_frag_value v = { .svc_id = t->svc_id,
				   .backend_id = t->backend_id };

	if (pkt->family == RV_FAMILY_V4) {
		struct rv_frag_key k = {
			.saddr = pkt->saddr[0],
			.daddr = pkt->daddr[0],
			.id = (__be16)pkt->frag_id,
			.proto = pkt->proto,
		};

		bpf_map_update_elem(&frag_map, &k, &v, BPF_ANY);
	} else {
		struct rv_frag6_key k = { .id = pkt->frag_id,
					  .proto = pkt->proto };

		rv_addr6_copy(k.saddr, pkt->saddr);
		rv_addr6_copy(k.daddr, pkt->daddr);
		bpf_map_update_elem(&frag_map6, &k, &v, BPF_ANY);
	}
}

static __always_inline void rv_count_vip_no_backend(__u32 svc_id)
{
	struct rv_vip_stats *s = bpf_map_lookup_elem(&stats_map, &svc_id);

	if (s)
		s->no_backend++;
}

__noinline int rv_icmp_error(struct xdp_md *ctx, struct rv_pkt *pkt)
{
	struct rv_icmp_quote q = {};
	struct rv_flow f = {};
	struct rv_target t = {};
	struct rv_service *svc;
	struct rv_be be = {};
	int ret;

	if (!pkt)
		return RV_XDP_PASS;
	if (rv_icmp_quote((void *)(long)ctx->data, (void *)(long)ctx->data_end,
			  pkt, &f, &q))
		return RV_XDP_PASS;
	t.svc_id = rv_vip_lookup(f.family, q.vip, f.vport, f.proto);
	if (!t.svc_id)
		return RV_XDP_PASS;
	svc = rv_service_get(t.svc_id, f.family);
	if (!svc)
		return -RV_DROP_NO_SERVICE;
	/* The error is about a flow to the quoted client: one the ranges
	 * keep out has nothing behind the VIP to tell. */
	ret = rv_source_allowed(svc, t.svc_id, f.family, f.caddr);
	if (ret)
		return ret;
	rv_pick(svc, &f, &t);
	/* An error creates no state: nothing is remembered. */
	t.pick = 0;
	if (!t.backend_id) {
		rv_count_vip_no_backend(t.svc_id);
		return -RV_DROP_NO_HEALTHY_BACKEND;
	}
	ret = rv_backend_get(f.family, svc, t.backend_id, f.vport, &be);
	if (ret)
		return ret;
	if (be.mode == RV_MODE_NAT) {
		ret = rv_icmp_nat(ctx, pkt, &q, &f, be.addr, be.port);
		if (ret)
			return ret;
		rv_count_vip(t.svc_id, rv_xdp_len(ctx));
		/* Unlike a request, the translated error is left to the
		 * kernel to forward: errors come a few per path change or
		 * lost peer, not one per packet, so the saving that pays for
		 * a FIB lookup on the request path is not there to have. */
		return RV_XDP_PASS;
	}
	if (be.mode == RV_MODE_FULLNAT) {
		/* The backend sent the quoted reply to this node's source and
		 * the flow's port. A flow with no port yet is no flow of
		 * ours. Sent, not left to the kernel: its source is this
		 * node's own address, which IPv4 forwarding refuses from
		 * outside. */
		if (!t.fnat_port)
			return RV_XDP_PASS;
		ret = rv_fullnat_src(f.family, t.fnat_src, t.fnat_addr);
		if (ret)
			return ret;
		ret = rv_fullnat_icmp_to_backend(ctx, pkt, &q, t.fnat_addr,
						 be.addr, be.port, t.fnat_port);
		if (ret)
			return ret;
		return rv_forward_counted(ctx, pkt, &t, &be);
	}
	if (be.mode == RV_MODE_L3DSR && f.family == RV_FAMILY_V6)
		t.label = rv_flow_label(f.caddr, f.cport, f.vport, f.proto);
	return rv_forward_counted(ctx, pkt, &t, &be);
}

/*
 * A TCP or UDP packet to a VIP's address: match, rate-limit, pick,
 * forward. `forced`, when not 0, is the backend another node chose and
 * tunnelled the packet here for (rv_tunnel_in()): that node rate-limited
 * it, and its choice is kept, remembered in the affinity table as this
 * node's own so that tc_nat knows the reply.
 *
 * This, the later fragment and the ICMP error are global functions, each
 * verified once on its own and each with a stack frame of its own:
 * xdp_ingress and the functions it calls share 512 bytes of stack, and
 * inlined into one frame these three and what they call left no room for
 * full NAT's. The packet descriptor is plain memory to them; the offsets
 * they read from it are bounded where they are used (rv_hdr).
 */
__noinline int rv_vip_path(struct xdp_md *ctx, struct rv_pkt *pkt, __u32 forced)
{
	struct rv_target t = {};
	struct rv_service *svc;
	struct rv_flow f = {};
	struct rv_be be = {};
	int ret;

	if (!pkt)
		return RV_XDP_PASS;
	t.svc_id =
		rv_vip_lookup(pkt->family, pkt->daddr, pkt->dport, pkt->proto);
	if (!t.svc_id)
		return RV_XDP_PASS;
	svc = rv_service_get(t.svc_id, pkt->family);
	if (!svc)
		return -RV_DROP_NO_SERVICE;
	/* A SYN before its rate limit, which a refused one must not drain.
	 * A tunnelled packet was checked by the node that took it in,
	 * against the client's address it still carries. */
	if ((pkt->flags & RV_PKT_TCP_SYN) && !forced) {
		ret = rv_source_allowed(svc, t.svc_id, pkt->family, pkt->saddr);
		if (ret)
			return ret;
	}

	if ((pkt->flags & RV_PKT_TCP_SYN) && !forced) {
		ret = rv_rate_limit(pkt, t.svc_id, svc);
		if (ret) {
			struct rv_vip_stats *s =
				bpf_map_lookup_elem(&stats_map, &t.svc_id);

			if (s)
				s->rate_limited++;
			return ret;
		}
	}

	rv_addr6_copy(f.caddr, pkt->saddr);
	f.cport = pkt->sport;
	f.vport = pkt->dport;
	f.proto = pkt->proto;
	f.family = pkt->family;
	rv_pick(svc, &f, &t);
	if (!forced && (svc->flags & RV_SVC_F_SOURCE_RANGES)) {
		ret = rv_source_admit(svc, &f, &t,
				      !(pkt->flags & RV_PKT_TCP_SYN));
		if (ret)
			return ret;
	}
	if (forced && t.backend_id != forced) {
		t.backend_id = forced;
		t.pick = RV_PICK_NEW;
		t.fnat_port = 0;
		t.fnat_src = 0;
	}
	if (!t.backend_id) {
		rv_count_vip_no_backend(t.svc_id);
		return -RV_DROP_NO_HEALTHY_BACKEND;
	}
	ret = rv_backend_get(pkt->family, svc, t.backend_id, pkt->dport, &be);
	if (ret)
		return ret;
	/* Only this node's own endpoints take tunnelled packets: anything
	 * else would send the packet on again. */
	if (forced && be.mode != RV_MODE_NAT)
		return -RV_DROP_NO_BACKEND;
	if (be.mode == RV_MODE_FULLNAT && t.fnat_port &&
	    !(t.pick & (RV_PICK_NEW | RV_PICK_REFRESHED)) &&
	    !(pkt->flags & (RV_PKT_TCP_SYN | RV_PKT_TCP_FIN_RST))) {
		/* An established flow with nothing to check or mark (its
		 * affinity time not due, no SYN, FIN or RST): its source is
		 * all it needs, read here rather than through a call, which
		 * costs most of what full NAT adds per packet. */
		ret = rv_fullnat_src(pkt->family, t.fnat_src, t.fnat_addr);
		if (ret)
			return ret;
	} else if (be.mode == RV_MODE_FULLNAT) {
		struct rv_fullnat_to to = { .port = be.port,
					    .src = be.nh.fullnat_src };

		rv_addr6_copy(to.addr, be.addr);
		ret = rv_fullnat_prepare(ctx, pkt, svc, &t, &to);
		if (ret)
			return ret;
	}
	/* What the pick chose is written once the flow has all it holds
	 * (full NAT's port); the packet leaves when the program returns. */
	if (t.pick & (RV_PICK_NEW | RV_PICK_FLOW_NEW))
		rv_remember(svc, &f, &t);
	if (be.mode == RV_MODE_L3DSR && f.family == RV_FAMILY_V6)
		t.label = rv_flow_label(f.caddr, f.cport, f.vport, f.proto);
	if (pkt->flags & RV_PKT_FRAG)
		rv_frag_record(pkt, &t);
	return rv_forward_counted(ctx, pkt, &t, &be);
}

/* rv_tunnel_in(): the packet is now the inner one, for rv_vip_path(). */
#define RV_TUNNEL_TAKEN 0x100

/*
 * DSR across nodes, the endpoint's side. Another node took a client's
 * packet to a VIP, chose an endpoint behind this node (a pod, whose
 * gateway this node is) and sent the packet on whole in IPIP or IPv6 in
 * IPv6 to the endpoint's address, which routes here. Taken when the
 * inner packet is to one of this node's VIPs and the outer destination is
 * one of that VIP's endpoints here (tunnel_ep_map): the outer header comes
 * off and the packet is NAT'd to that endpoint, the other node's choice,
 * by rv_vip_path() (called by the caller, whose stack frame it then
 * shares with no third: the two frames do not fit under xdp_ingress's
 * together). The endpoint's reply leaves by this node, its
 * gateway, where tc_nat turns it into VIP -> client: the client's address
 * is kept both ways and the reply goes straight back.
 *
 * Anything else (a tunnel of somebody else's, a fragmented outer or inner
 * packet, one in the other family) is passed untouched, as before: no
 * later stage acts on a protocol other than TCP, UDP and ICMP. `pkt` is
 * the outer packet's on entry and scratch after it (the inner packet's
 * once taken). Returns RV_TUNNEL_TAKEN with the endpoint's backend in
 * *backend, else a verdict.
 */
__noinline int rv_tunnel_in(struct xdp_md *ctx, struct rv_pkt *pkt,
			    __u32 *backend)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct rv_tunnel_ep_key k = {};
	struct rv_decap d = {};
	struct rv_tunnel_ep *ep;
	__u32 l2_len, outer_off, outer_end;
	__u32 backend_id;
	int ret;

	if (!pkt || !backend || (pkt->flags & RV_PKT_FRAG))
		return RV_XDP_PASS;
	l2_len = pkt->l2_len;
	outer_off = pkt->l3_off;
	outer_end = pkt->l3_off + pkt->ip_len;
	d.family = pkt->family;
	rv_addr6_copy(k.addr, pkt->daddr);
	if (pkt->family == RV_FAMILY_V4 && pkt->proto == RV_IPPROTO_IPIP) {
		struct iphdr *outer =
			rv_hdr(struct iphdr, data, data_end, outer_off);

		if (!outer)
			return RV_XDP_PASS;
		d.outer_ecn = outer->tos & RV_ECN_MASK;
		pkt->flags = 0;
		pkt->l3_off = pkt->l4_off;
		ret = rv_parse_ipv4(data, data_end, pkt, 1);
	} else if (pkt->family == RV_FAMILY_V6 &&
		   pkt->proto == RV_IPPROTO_IPV6 &&
		   pkt->l4_off == outer_off + sizeof(struct ipv6hdr)) {
		struct ipv6hdr *outer =
			rv_hdr(struct ipv6hdr, data, data_end, outer_off);

		if (!outer)
			return RV_XDP_PASS;
		d.outer_ecn = (bpf_ntohl(*(__be32 *)outer) >> 20) & RV_ECN_MASK;
		pkt->flags = 0;
		pkt->l3_off = pkt->l4_off;
		ret = rv_parse_ipv6(data, data_end, pkt, 1);
	} else {
		return RV_XDP_PASS;
	}
	/* The inner packet must end where the outer one does. */
	if (ret || (pkt->flags & RV_PKT_FRAG) ||
	    pkt->l3_off + pkt->ip_len != outer_end)
		return RV_XDP_PASS;
	if (pkt->proto != RV_IPPROTO_TCP && pkt->proto != RV_IPPROTO_UDP)
		return RV_XDP_PASS;
	if (rv_parse_l4(data, data_end, pkt))
		return RV_XDP_PASS;
	k.svc_id =
		rv_vip_lookup(pkt->family, pkt->daddr, pkt->dport, pkt->proto);
	if (!k.svc_id)
		return RV_XDP_PASS;
	ep = bpf_map_lookup_elem(&tunnel_ep_map, &k);
	if (!ep || !ep->backend_id || l2_len > RV_DECAP_L2_MAX)
		return RV_XDP_PASS;
	backend_id = ep->backend_id;

	d.outer_len = pkt->l3_off - outer_off;
	ret = rv_decap_strip(ctx, l2_len, &d);
	if (ret > 0)
		return RV_XDP_PASS;
	if (ret < 0)
		return -RV_DROP_HEADROOM;
	/* The inner packet now starts where the outer one did. */
	pkt->l3_off -= d.outer_len;
	pkt->l4_off -= d.outer_len;
	*backend = backend_id;
	return RV_TUNNEL_TAKEN;
}

static __always_inline int rv_process(struct xdp_md *ctx, struct rv_pkt *pkt)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	int ret;

	ret = rv_parse_l3(data, data_end, pkt, 1);
	if (ret < 0)
		return ret;
	if (ret == RV_PARSE_PASS)
		return RV_XDP_PASS;
	if (pkt->proto == RV_IPPROTO_IPIP || pkt->proto == RV_IPPROTO_IPV6) {
		__u32 backend = 0;

		ret = rv_tunnel_in(ctx, pkt, &backend);
		if (ret != RV_TUNNEL_TAKEN)
			return ret;
		return rv_vip_path(ctx, pkt, backend);
	}
	/* Not addressed to any VIP: the kernel's, whatever its L4 header
	 * holds (a truncated one included: not ours to judge). */
	if (!rv_vip_filter_may_match(pkt->family, pkt->daddr))
		return RV_XDP_PASS;
	ret = rv_parse_l4(data, data_end, pkt);
	if (ret < 0)
		return ret;
	if (ret == RV_PARSE_PASS)
		return RV_XDP_PASS;
	if (pkt->flags & RV_PKT_LATER_FRAG)
		return rv_later_fragment(ctx, pkt);
	if (pkt->flags & RV_PKT_ICMP_ERR) {
		/* About a request full NAT sent from this node: for its
		 * client. Else about a VIP's reply, for its backend. */
		ret = rv_fullnat_icmp(ctx, pkt);
		if (ret != RV_FULLNAT_NOT_OURS)
			return ret;
		return rv_icmp_error(ctx, pkt);
	}
	if (pkt->proto != RV_IPPROTO_TCP && pkt->proto != RV_IPPROTO_UDP)
		return RV_XDP_PASS;
	/* A backend's reply to one of full NAT's sources, before the VIP
	 * match: the source address may be a VIP's too. */
	if (rv_fullnat_may_be_src(rv_fullnat_cfg(), pkt->family, pkt->daddr,
				  pkt->dport)) {
		ret = rv_fullnat_reply(ctx, pkt);
		if (ret != RV_FULLNAT_NOT_OURS)
			return ret;
	}

	return rv_vip_path(ctx, pkt, 0);
}

/*
 * Full NAT's sweep, run by rivorad (BPF_PROG_TEST_RUN, any packet) every
 * few seconds: the entries of flows idle past their timeout, retired and
 * deleted (lib/fullnat.h says why here and not from user space, which
 * has no compare-and-swap to retire an entry before its delete). Returns
 * how many went.
 */
SEC("xdp")
int fullnat_sweep(struct xdp_md *ctx)
{
	struct rv_fullnat_sweep sw = { .now = bpf_ktime_get_coarse_ns() };

	sw.cfg = rv_fullnat_cfg();
	if (!sw.cfg || !sw.cfg->port_max)
		return 0;
	bpf_for_each_map_elem(&fullnat_rev_map, rv_fullnat_sweep4, &sw, 0);
	bpf_for_each_map_elem(&fullnat_rev_map6, rv_fullnat_sweep6, &sw, 0);
	return sw.removed;
}

SEC("xdp")
int xdp_ingress(struct xdp_md *ctx)
{
	struct rv_pkt pkt = {};
	int ret;

#ifdef RV_BUILD_VARIANT
	/* A build whose instructions differ from the default one and whose
	 * behaviour and maps do not: meta_map is an array of one entry, so
	 * the lookup of key 0 always succeeds and the branch is never taken.
	 * The restart tests upgrade to this build to show that a program
	 * swap behind the pinned links keeps every flow. */
	__u32 meta_key = 0;

	if (!bpf_map_lookup_elem(&meta_map, &meta_key))
		return RV_XDP_PASS;
#endif
	ret = rv_process(ctx, &pkt);

	if (ret < 0) {
		rv_count_drop(-ret);
		return RV_XDP_DROP;
	}
	return ret;
}
