/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Full NAT: a request leaves with this node's address and a port of the
 * node's range as its source, so its backend answers here wherever it is
 * (another node's pod, a host whose route to the client is not us). The
 * reply is turned back into VIP -> client here, in XDP, before the VIP
 * match, and sent out the way the request came in.
 *
 * State, per flow: the affinity entry (the forward direction) holds the
 * flow's source port and address index beside its backend; the
 * fullnat_rev_map{,6} entry (the reverse direction), keyed by the reply's
 * tuple, holds the client and the VIP. A new flow costs one insert each.
 *
 * The steps that hold a flow's keys and entry on the stack are functions of
 * their own (static, so verified with their callers' knowledge of every
 * argument): inlined, their stack added to the rest of xdp_ingress's past
 * the 512 bytes BPF allows.
 *
 * Ports. The reverse entry is the port's allocation: it is inserted with
 * BPF_NOEXIST, so of any number of CPUs offering the same tuple one wins,
 * and a tuple is never given to two live flows. Where to try comes from
 * one cursor for all CPUs, moved by an atomic add: every allocation tries
 * ports no other is trying, so a range of N free ports takes exactly its
 * first N flows whatever the CPUs, and a port is offered again only after
 * the cursor has gone round the whole range: the longest rest a tuple the
 * backend may still hold in TIME_WAIT can get. A cursor per CPU (tried
 * first: no shared cache line written per new flow) had the CPUs walk the
 * same ports behind each other, and a flow was refused after its probes
 * met another CPU's run of held ports while ports were free elsewhere;
 * ranges split per CPU leave one CPU exhausted while another has ports to
 * spare, as RSS rarely spreads evenly. The add costs a new flow a shared
 * cache line, a few tens of nanoseconds when CPUs contend; established
 * flows never touch it.
 *
 * An entry's last_seen_ns is also its claim: an allocation that meets a
 * port whose flow has been idle past its timeout takes the entry over in
 * place by a compare-and-swap of that time (and only then writes its own
 * flow in), a flow that refreshes its time does so by one too, and the
 * sweep (fullnat_sweep, run by rivorad) deletes an idle entry only after
 * swapping its time for RV_FULLNAT_RETIRED. So two CPUs never both take
 * an entry, and a delete never removes an entry another CPU has just
 * claimed or revived: a delete after a plain "is it idle?" read did,
 * seen by the two-CPU property test (tests/packets/fullnat.rs).
 *
 * An established flow's entry is checked (and its time refreshed) when
 * its affinity time is refreshed (once a second), on a SYN and on a FIN
 * or RST: a port can only have passed to another flow after a timeout of
 * seconds, so the flow that lost it is idle long enough for its next
 * packet to be checked, and it gets a new port instead of sharing one.
 */
#ifndef RV_FULLNAT_H
#define RV_FULLNAT_H

#include "csum.h"
#include "fwd.h"
#include "icmp.h"
#include "lb.h"
#include "maps.h"
#include "parse.h"

#define RV_NSEC_PER_MSEC 1000000ULL

/* Not a verdict: the packet is not a full-NAT reply, go on. */
#define RV_FULLNAT_NOT_OURS 0x100

/* last_seen_ns of an entry the sweep is about to delete: no flow's, and
 * never idle past a timeout (nothing takes it over). */
#define RV_FULLNAT_RETIRED (~0ULL)

static __always_inline struct rv_fullnat_config *rv_fullnat_cfg(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&fullnat_config_map, &zero);
}

/* The bit of rv_fullnat_config.src_filter an address sets: the VIP
 * filter's hash, its top six bits (rivora::abi::fullnat_src_bit). */
static __always_inline __u32 rv_fullnat_src_bit(__u8 family, const __be32 *addr)
{
	__u32 x = addr[0];

	if (family == RV_FAMILY_V6)
		x ^= addr[1] ^ addr[2] ^ addr[3];
	return (x * 0x9E3779B1u) >> (32 - 6);
}

/* Whether (addr, port) may be one of full NAT's sources: an address of
 * fullnat_src_map and a port of the range. Two reads of one array entry
 * for the packets that get this far (the VIP filter let them by). */
static __always_inline int
rv_fullnat_may_be_src(const struct rv_fullnat_config *c, __u8 family,
		      const __be32 *addr, __be16 port)
{
	__u16 p = bpf_ntohs(port);

	if (!c || !c->port_max || p < c->port_min || p > c->port_max)
		return 0;
	return (c->src_filter >> rv_fullnat_src_bit(family, addr)) & 1;
}

static __always_inline __u64
rv_fullnat_timeout_ns(const struct rv_fullnat_config *c, __u8 proto, __u8 flags)
{
	__u32 ms;

	if (proto != RV_IPPROTO_TCP)
		ms = c->udp_timeout_ms;
	else if (flags & RV_FULLNAT_F_CLOSING)
		ms = c->tcp_closing_timeout_ms;
	else
		ms = c->tcp_timeout_ms;
	return (__u64)ms * RV_NSEC_PER_MSEC;
}

/* Whether a flow last seen at `seen` (its entry's flags `flags`) is idle
 * past its timeout at `now`. A time a CPU stamped a tick ahead of this
 * one's coarse clock is no underflow; a retired entry is never idle. */
static __always_inline int rv_fullnat_expired(const struct rv_fullnat_config *c,
					      __u64 seen, __u8 flags,
					      __u8 proto, __u64 now)
{
	return now > seen &&
	       now - seen > rv_fullnat_timeout_ns(c, proto, flags);
}

/* Take over the entry of a flow idle since `seen`: whoever swaps its time
 * first owns it; then the new flow is written in. */
static __always_inline int rv_fullnat_claim(struct rv_fullnat_flow *e,
					    __u64 seen,
					    const struct rv_fullnat_flow *v)
{
	if (__sync_val_compare_and_swap(&e->last_seen_ns, seen,
					v->last_seen_ns) != seen)
		return 0;
	rv_addr6_copy(e->client_addr, v->client_addr);
	rv_addr6_copy(e->vip_addr, v->vip_addr);
	e->client_port = v->client_port;
	e->vip_port = v->vip_port;
	e->svc_id = v->svc_id;
	e->backend_id = v->backend_id;
	e->ifindex = v->ifindex;
	__builtin_memcpy(e->dmac, v->dmac, RV_ETH_ALEN);
	__builtin_memcpy(e->smac, v->smac, RV_ETH_ALEN);
	e->flags = v->flags;
	return 1;
}

/* A live flow's time, moved on from `seen` to `now`; 0 when the entry is
 * no longer the flow's (taken over, or retired by the sweep). */
static __always_inline int rv_fullnat_touch(struct rv_fullnat_flow *e,
					    __u64 seen, __u64 now)
{
	if (seen == RV_FULLNAT_RETIRED)
		return 0;
	return __sync_val_compare_and_swap(&e->last_seen_ns, seen, now) == seen;
}

/* Either family's reverse key; the packet's family says which. */
struct rv_fullnat_keys {
	union {
		struct rv_fullnat_key k4;
		struct rv_fullnat6_key k6;
	};
};

static __always_inline void rv_fullnat_key(struct rv_fullnat_keys *k,
					   __u8 family, const __be32 *baddr,
					   const __be32 *src, __be16 bport,
					   __be16 sport, __u8 proto)
{
	if (family == RV_FAMILY_V4) {
		k->k4.backend_addr = baddr[0];
		k->k4.src_addr = src[0];
		k->k4.backend_port = bport;
		k->k4.src_port = sport;
		k->k4.proto = proto;
	} else {
		rv_addr6_copy(k->k6.backend_addr, baddr);
		rv_addr6_copy(k->k6.src_addr, src);
		k->k6.backend_port = bport;
		k->k6.src_port = sport;
		k->k6.proto = proto;
	}
}

/* A new flow's reverse entry and key: per-CPU scratch rather than stack
 * (xdp_ingress and the functions it calls have 512 bytes in all). */
struct rv_fullnat_scratch {
	struct rv_fullnat_flow v;
	struct rv_fullnat_keys k;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct rv_fullnat_scratch);
} fullnat_scratch_map SEC(".maps");

/* The scratch entry, zeroed; NULL only if the map cannot be read. */
static __always_inline struct rv_fullnat_scratch *rv_fullnat_scratch(void)
{
	__u32 zero = 0;
	struct rv_fullnat_scratch *s =
		bpf_map_lookup_elem(&fullnat_scratch_map, &zero);

	if (s)
		__builtin_memset(s, 0, sizeof(*s));
	return s;
}

static __always_inline struct rv_fullnat_flow *
rv_fullnat_rev_get(__u8 family, const struct rv_fullnat_keys *k)
{
	if (family == RV_FAMILY_V4)
		return bpf_map_lookup_elem(&fullnat_rev_map, &k->k4);
	return bpf_map_lookup_elem(&fullnat_rev_map6, &k->k6);
}

/* Whether a reverse entry is the one of this client's flow to this VIP. */
static __always_inline int rv_fullnat_owns(const struct rv_fullnat_flow *e,
					   __u32 svc_id,
					   const struct rv_pkt *pkt)
{
	return e->svc_id == svc_id && e->client_port == pkt->sport &&
	       e->vip_port == pkt->dport &&
	       e->client_addr[0] == pkt->saddr[0] &&
	       e->client_addr[1] == pkt->saddr[1] &&
	       e->client_addr[2] == pkt->saddr[2] &&
	       e->client_addr[3] == pkt->saddr[3];
}

static __always_inline void rv_fullnat_count(__u32 svc_id, int reason)
{
	struct rv_fullnat_stats *s =
		bpf_map_lookup_elem(&fullnat_stats_map, &svc_id);

	if (!s)
		return;
	if (reason == RV_DROP_FULLNAT_TABLE_FULL)
		s->table_full++;
	else
		s->ports_exhausted++;
}

/*
 * Give the flow a source port towards (baddr, bport) from `src` (in the
 * key `k`): the first of the shared cursor's next RV_FULLNAT_PROBES ports whose
 * tuple nobody holds, or whose holder has been idle past its timeout. The
 * reverse entry `v` is inserted as the port's allocation. Returns the
 * port (network order), or a negative RV_DROP_* reason.
 *
 * A global function per family: the verifier checks each loop once, on
 * its own, rather than at every path that reaches an allocation (inlined,
 * or as one function branching on the family inside the loop, the
 * probes' paths took it past its million instructions). Its pointers are
 * plain memory to it, checked.
 */
#define RV_FULLNAT_ALLOC(NAME, MAP, KEY)                                       \
	static __always_inline int NAME(                                       \
		const struct rv_fullnat_config *c, KEY *k,                     \
		const struct rv_fullnat_flow *v, __u32 proto, __u64 now)       \
	{                                                                      \
		struct rv_fullnat_cursor *cur;                                 \
		struct rv_fullnat_flow *e;                                     \
		__u32 zero = 0, range, start;                                  \
		int i, full = 0;                                               \
		__be16 port = 0;                                               \
		__u64 seen;                                                    \
                                                                               \
		if (!c || !k || !v || !c->port_max ||                          \
		    c->port_max < c->port_min)                                 \
			return -RV_DROP_FULLNAT_PORTS_EXHAUSTED;               \
		cur = bpf_map_lookup_elem(&fullnat_cursor_map, &zero);         \
		if (!cur)                                                      \
			return -RV_DROP_FULLNAT_PORTS_EXHAUSTED;               \
		range = (__u32)c->port_max - c->port_min + 1;                  \
		/* One port first (nearly every allocation takes it), then     \
		 * the rest of the probes as one window. The offset is taken   \
		 * modulo the range, not wrapped by a comparison: a branch on  \
		 * it would give the verifier two states of the range's        \
		 * bounds per probe. */                                        \
		start = __sync_fetch_and_add(&cur->next, 1);                   \
		for (i = 0; i < RV_FULLNAT_PROBES; i++) {                      \
			if (i >= range)                                        \
				break;                                         \
			if (i == 1)                                            \
				start = __sync_fetch_and_add(                  \
						&cur->next,                    \
						RV_FULLNAT_PROBES - 1) -       \
					1;                                     \
			port = bpf_htons(c->port_min + (start + i) % range);   \
			k->src_port = port;                                    \
			if (!bpf_map_update_elem(&MAP, k, v, BPF_NOEXIST))     \
				return port;                                   \
			e = bpf_map_lookup_elem(&MAP, k);                      \
			if (!e) {                                              \
				/* Not there, yet not inserted: the map is     \
				 * full (or the sweep deleted it just now). */ \
				full = 1;                                      \
				continue;                                      \
			}                                                      \
			seen = e->last_seen_ns;                                \
			if (rv_fullnat_expired(c, seen, e->flags, proto,       \
					       now) &&                         \
			    rv_fullnat_claim(e, seen, v))                      \
				return port;                                   \
		}                                                              \
		return full ? -RV_DROP_FULLNAT_TABLE_FULL                      \
			    : -RV_DROP_FULLNAT_PORTS_EXHAUSTED;                \
	}

RV_FULLNAT_ALLOC(rv_fullnat_alloc4, fullnat_rev_map, struct rv_fullnat_key)
RV_FULLNAT_ALLOC(rv_fullnat_alloc6, fullnat_rev_map6, struct rv_fullnat6_key)

/* The source address of index `idx` into `src`; 0, or a negative
 * RV_DROP_* reason when there is none. */
static __always_inline int rv_fullnat_src(__u8 family, __u32 idx, __be32 *src)
{
	struct rv_fullnat_src *s;

	if (!idx)
		return -RV_DROP_NO_FULLNAT_SRC;
	s = bpf_map_lookup_elem(&fullnat_src_map, &idx);
	if (!s || !s->addr[0] ||
	    (family == RV_FAMILY_V6 && rv_addr6_is_zero(s->addr)))
		return -RV_DROP_NO_FULLNAT_SRC;
	rv_addr6_copy(src, s->addr);
	return 0;
}

/*
 * A request's source for full NAT, into t->fnat_addr and t->fnat_port:
 * the flow's own (checked when it is time, see the top of this file), or
 * a new allocation from the backend's source address, which marks the
 * affinity entry for writing. A later fragment has no port and takes the
 * backend's address.
 */
__noinline int rv_fullnat_prepare(struct xdp_md *ctx, const struct rv_pkt *pkt,
				  const struct rv_service *svc,
				  struct rv_target *t,
				  const struct rv_fullnat_to *to)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct rv_fullnat_config *c = rv_fullnat_cfg();
	struct rv_fullnat_scratch *s;
	struct rv_fullnat_flow *e, *v;
	struct rv_fullnat_keys *k;
	struct ethhdr *eth;
	__be16 bport;
	__u8 src_idx;
	int port, ret;

	if (!pkt || !svc || !t || !to)
		return -RV_DROP_NO_BACKEND;
	bport = to->port;
	src_idx = to->src;
	if (pkt->flags & RV_PKT_LATER_FRAG)
		return rv_fullnat_src(pkt->family, src_idx, t->fnat_addr);
	if (t->fnat_port && !(t->pick & RV_PICK_NEW)) {
		ret = rv_fullnat_src(pkt->family, t->fnat_src, t->fnat_addr);
		if (ret)
			return ret;
		if (!(t->pick & RV_PICK_REFRESHED) &&
		    !(pkt->flags & (RV_PKT_TCP_SYN | RV_PKT_TCP_FIN_RST)))
			return 0;
		s = rv_fullnat_scratch();
		if (!s)
			return 0;
		rv_fullnat_key(&s->k, pkt->family, to->addr, t->fnat_addr,
			       bport, t->fnat_port, pkt->proto);
		e = rv_fullnat_rev_get(pkt->family, &s->k);
		if (e && rv_fullnat_owns(e, t->svc_id, pkt) &&
		    rv_fullnat_touch(e, e->last_seen_ns, t->now)) {
			/* A SYN opens the client's tuple again (a reused
			 * port after a close): no longer closing. */
			if (pkt->flags & RV_PKT_TCP_SYN)
				e->flags &= ~RV_FULLNAT_F_CLOSING;
			if (pkt->flags & RV_PKT_TCP_FIN_RST)
				e->flags |= RV_FULLNAT_F_CLOSING;
			return 0;
		}
		/* The port went to another flow while this one was idle
		 * past its timeout: a new one, from the backend's source. */
	}

	ret = rv_fullnat_src(pkt->family, src_idx, t->fnat_addr);
	if (ret)
		return ret;
	s = rv_fullnat_scratch();
	if (!s)
		return -RV_DROP_FULLNAT_PORTS_EXHAUSTED;
	v = &s->v;
	k = &s->k;
	rv_addr6_copy(v->client_addr, pkt->saddr);
	rv_addr6_copy(v->vip_addr, pkt->daddr);
	v->client_port = pkt->sport;
	v->vip_port = pkt->dport;
	v->svc_id = t->svc_id;
	v->backend_id = t->backend_id;
	v->last_seen_ns = t->now;
	if (pkt->flags & RV_PKT_TCP_FIN_RST)
		v->flags |= RV_FULLNAT_F_CLOSING;
	/* The reply leaves the way the request came in: back to the MAC it
	 * came from, from the one it was sent to. A tagged frame's tags
	 * would have to be pushed again; its reply is routed instead. */
	eth = rv_hdr(struct ethhdr, data, data_end, 0);
	if (eth && pkt->l2_len == sizeof(*eth)) {
		v->ifindex = ctx->ingress_ifindex;
		__builtin_memcpy(v->dmac, eth->h_source, RV_ETH_ALEN);
		__builtin_memcpy(v->smac, eth->h_dest, RV_ETH_ALEN);
		v->flags |= RV_FULLNAT_F_RETURN_PATH;
	}
	rv_fullnat_key(k, pkt->family, to->addr, t->fnat_addr, bport, 0,
		       pkt->proto);
	if (pkt->family == RV_FAMILY_V4)
		port = rv_fullnat_alloc4(c, &k->k4, v, pkt->proto, t->now);
	else
		port = rv_fullnat_alloc6(c, &k->k6, v, pkt->proto, t->now);
	if (port < 0) {
		rv_fullnat_count(t->svc_id, -port);
		return port;
	}
	t->fnat_port = port;
	t->fnat_src = src_idx;
	t->pick |= svc->affinity == RV_AFFINITY_CLIENT_IP ? RV_PICK_FLOW_NEW
							  : RV_PICK_NEW;
	return 0;
}

/*
 * Rewrite a packet's addresses and ports (a later fragment: its addresses
 * only; its first fragment's checksum covers the rest), every checksum in
 * one fold. The old values are the descriptor's.
 */
static __always_inline int rv_rewrite_tuple(void *data, void *data_end,
					    const struct rv_pkt *pkt,
					    const __be32 *saddr,
					    const __be32 *daddr, __be16 sport,
					    __be16 dport)
{
	struct rv_ports *ports;
	__u16 *check;
	__u32 c;

	if (pkt->family == RV_FAMILY_V4) {
		struct iphdr *iph =
			rv_hdr(struct iphdr, data, data_end, pkt->l3_off);

		if (!iph)
			return -RV_DROP_MALFORMED_IPV4;
		c = rv_csum_open(iph->check);
		c = rv_csum_swap(c, iph->saddr, saddr[0]);
		c = rv_csum_swap(c, iph->daddr, daddr[0]);
		iph->check = rv_csum_fold(c);
		iph->saddr = saddr[0];
		iph->daddr = daddr[0];
	} else {
		struct ipv6hdr *ip6h =
			rv_hdr(struct ipv6hdr, data, data_end, pkt->l3_off);

		if (!ip6h)
			return -RV_DROP_MALFORMED_IPV6;
		__builtin_memcpy(&ip6h->saddr, saddr, 16);
		__builtin_memcpy(&ip6h->daddr, daddr, 16);
	}
	if (pkt->flags & RV_PKT_LATER_FRAG)
		return 0;
	ports = rv_hdr(struct rv_ports, data, data_end, pkt->l4_off);
	if (!ports)
		return -RV_DROP_MALFORMED_L4;
	if (pkt->proto == RV_IPPROTO_TCP) {
		struct tcphdr *th =
			rv_hdr(struct tcphdr, data, data_end, pkt->l4_off);

		if (!th)
			return -RV_DROP_MALFORMED_L4;
		check = &th->check;
	} else {
		struct udphdr *uh =
			rv_hdr(struct udphdr, data, data_end, pkt->l4_off);

		if (!uh)
			return -RV_DROP_MALFORMED_L4;
		check = &uh->check;
		/* No checksum (IPv4 only): none to fix. */
		if (!uh->check && pkt->family == RV_FAMILY_V4)
			goto ports;
	}
	c = rv_csum_open(*check);
	if (pkt->family == RV_FAMILY_V4) {
		c = rv_csum_swap(c, pkt->saddr[0], saddr[0]);
		c = rv_csum_swap(c, pkt->daddr[0], daddr[0]);
	} else {
		c = rv_csum_swap16(c, pkt->saddr, saddr);
		c = rv_csum_swap16(c, pkt->daddr, daddr);
	}
	c = rv_csum_swap(c, rv_ports_word(pkt->sport, pkt->dport),
			 rv_ports_word(sport, dport));
	*check = rv_csum_fold(c);
	if (pkt->proto == RV_IPPROTO_UDP)
		rv_udp_csum_fixup(check);
ports:
	ports->source = sport;
	ports->dest = dport;
	return 0;
}

/* Record where a fragmented reply went, for its later fragments. */
static __always_inline void
rv_fullnat_frag_record(const struct rv_pkt *pkt,
		       const struct rv_fullnat_flow *e)
{
	struct rv_fullnat_frag v = {};

	rv_addr6_copy(v.client_addr, e->client_addr);
	rv_addr6_copy(v.vip_addr, e->vip_addr);
	if (pkt->family == RV_FAMILY_V4) {
		struct rv_frag_key k = {
			.saddr = pkt->saddr[0],
			.daddr = pkt->daddr[0],
			.id = (__be16)pkt->frag_id,
			.proto = pkt->proto,
		};

		bpf_map_update_elem(&fullnat_frag_map, &k, &v, BPF_ANY);
	} else {
		struct rv_frag6_key k = { .id = pkt->frag_id,
					  .proto = pkt->proto };

		rv_addr6_copy(k.saddr, pkt->saddr);
		rv_addr6_copy(k.daddr, pkt->daddr);
		bpf_map_update_elem(&fullnat_frag_map6, &k, &v, BPF_ANY);
	}
}

/*
 * Send a translated reply towards the client: out the way its request came
 * in when the flow knows it (a router's work: TTL or hop limit down), else
 * the kernel's to route (it is then VIP -> client, an ordinary forwarded
 * packet). A TTL that would expire is the kernel's too, to answer.
 */
static __always_inline int rv_fullnat_send(struct xdp_md *ctx,
					   const struct rv_pkt *pkt,
					   const struct rv_fullnat_flow *e)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;

	if (!(e->flags & RV_FULLNAT_F_RETURN_PATH) ||
	    pkt->l2_len != sizeof(struct ethhdr))
		return RV_XDP_PASS;
	if (pkt->family == RV_FAMILY_V4) {
		struct iphdr *iph =
			rv_hdr(struct iphdr, data, data_end, pkt->l3_off);

		if (!iph)
			return -RV_DROP_MALFORMED_IPV4;
		if (iph->ttl <= 1 || iph->ihl != 5)
			return RV_XDP_PASS;
		rv_ip_decrease_ttl(iph, iph->ttl);
	} else {
		struct ipv6hdr *ip6h =
			rv_hdr(struct ipv6hdr, data, data_end, pkt->l3_off);

		if (!ip6h)
			return -RV_DROP_MALFORMED_IPV6;
		if (ip6h->hop_limit <= 1 || ip6h->nexthdr == RV_IPPROTO_HOPOPTS)
			return RV_XDP_PASS;
		ip6h->hop_limit--;
	}
	return rv_send(ctx, e->ifindex, e->dmac, e->smac);
}

/*
 * A reply from a backend to one of full NAT's (address, port) tuples:
 * back into VIP -> client and on its way, or RV_FULLNAT_NOT_OURS when no
 * flow holds the tuple.
 */
__noinline int rv_fullnat_reply(struct xdp_md *ctx, const struct rv_pkt *pkt)
{
	struct rv_fullnat_keys k = {};
	struct rv_fullnat_flow *e;
	__u64 now, seen;
	int ret;

	if (!pkt)
		return RV_FULLNAT_NOT_OURS;
	rv_fullnat_key(&k, pkt->family, pkt->saddr, pkt->daddr, pkt->sport,
		       pkt->dport, pkt->proto);
	e = rv_fullnat_rev_get(pkt->family, &k);
	if (!e)
		return RV_FULLNAT_NOT_OURS;
	seen = e->last_seen_ns;
	if (seen == RV_FULLNAT_RETIRED)
		return RV_FULLNAT_NOT_OURS;
	now = bpf_ktime_get_coarse_ns();
	/* At most once a second, as the affinity time: a lost race to
	 * another refresh loses nothing. */
	if (now > seen + RV_AFFINITY_TOUCH_NS ||
	    ((pkt->flags & RV_PKT_TCP_FIN_RST) &&
	     !(e->flags & RV_FULLNAT_F_CLOSING))) {
		rv_fullnat_touch(e, seen, now);
		if (pkt->flags & RV_PKT_TCP_FIN_RST)
			e->flags |= RV_FULLNAT_F_CLOSING;
	}
	if (pkt->flags & RV_PKT_FRAG)
		rv_fullnat_frag_record(pkt, e);
	ret = rv_rewrite_tuple((void *)(long)ctx->data,
			       (void *)(long)ctx->data_end, pkt, e->vip_addr,
			       e->client_addr, e->vip_port, e->client_port);
	if (ret)
		return ret;
	return rv_fullnat_send(ctx, pkt, e);
}

/* A later fragment of a full-NAT reply: its addresses as its first
 * fragment's, then the kernel routes it. RV_FULLNAT_NOT_OURS when no
 * first fragment was seen. */
static __always_inline int rv_fullnat_reply_later_frag(struct xdp_md *ctx,
						       const struct rv_pkt *pkt)
{
	struct rv_fullnat_frag *v;

	if (pkt->family == RV_FAMILY_V4) {
		struct rv_frag_key k = {
			.saddr = pkt->saddr[0],
			.daddr = pkt->daddr[0],
			.id = (__be16)pkt->frag_id,
			.proto = pkt->proto,
		};

		v = bpf_map_lookup_elem(&fullnat_frag_map, &k);
	} else {
		struct rv_frag6_key k = { .id = pkt->frag_id,
					  .proto = pkt->proto };

		rv_addr6_copy(k.saddr, pkt->saddr);
		rv_addr6_copy(k.daddr, pkt->daddr);
		v = bpf_map_lookup_elem(&fullnat_frag_map6, &k);
	}
	if (!v)
		return RV_FULLNAT_NOT_OURS;
	return rv_rewrite_tuple((void *)(long)ctx->data,
				(void *)(long)ctx->data_end, pkt, v->vip_addr,
				v->client_addr, 0, 0)
		       ?: RV_XDP_PASS;
}

/*
 * An ICMP error about a full-NAT request, from its backend or a router on
 * the way: addressed to this node's source address, quoting (source,
 * port) -> (backend, port). It goes to the client as an error about what
 * the client sent: the quote becomes client -> VIP, the error's
 * destination the client, and an error the backend sent itself comes
 * from the VIP. RV_FULLNAT_NOT_OURS when no flow holds the quoted tuple.
 */
__noinline int rv_fullnat_icmp(struct xdp_md *ctx, const struct rv_pkt *pkt)
{
	struct rv_fullnat_scratch *s;
	struct rv_icmp_quote q = {};
	struct rv_fullnat_flow *e;
	struct rv_icmp_xlat *x;
	struct rv_flow f = {};
	int ret;

	if (!pkt || rv_icmp_quote((void *)(long)ctx->data,
				  (void *)(long)ctx->data_end, pkt, &f, &q))
		return RV_FULLNAT_NOT_OURS;
	if (!rv_fullnat_may_be_src(rv_fullnat_cfg(), f.family, q.vip, f.vport))
		return RV_FULLNAT_NOT_OURS;
	s = rv_fullnat_scratch();
	x = rv_icmp_xlat();
	if (!s || !x)
		return RV_FULLNAT_NOT_OURS;
	/* The quote, as rv_icmp_quote read it: the node's source (q.vip)
	 * and port (f.vport) to the backend (f.caddr, f.cport). */
	rv_fullnat_key(&s->k, pkt->family, f.caddr, q.vip, f.cport, f.vport,
		       f.proto);
	e = rv_fullnat_rev_get(pkt->family, &s->k);
	if (!e)
		return RV_FULLNAT_NOT_OURS;
	rv_addr6_copy(x->outer_src, pkt->saddr);
	if (pkt->saddr[0] == f.caddr[0] && pkt->saddr[1] == f.caddr[1] &&
	    pkt->saddr[2] == f.caddr[2] && pkt->saddr[3] == f.caddr[3])
		rv_addr6_copy(x->outer_src, e->vip_addr);
	rv_addr6_copy(x->outer_dst, e->client_addr);
	rv_addr6_copy(x->in_src, e->client_addr);
	rv_addr6_copy(x->in_dst, e->vip_addr);
	x->in_sport = e->client_port;
	x->in_dport = e->vip_port;
	ret = rv_icmp_translate(ctx, pkt, &q, x);
	if (ret)
		return ret;
	return rv_fullnat_send(ctx, pkt, e);
}

/*
 * An ICMP error from the client's side about a full-NAT flow's reply (the
 * quote is VIP -> client): for the backend, as an error about what the
 * backend sent (backend -> this node's source and the flow's port), from
 * this node's source address, which the backend knows the way back to.
 */
static __always_inline int
rv_fullnat_icmp_to_backend(struct xdp_md *ctx, const struct rv_pkt *pkt,
			   const struct rv_icmp_quote *q, const __be32 *src,
			   const __be32 *baddr, __be16 bport, __be16 port)
{
	struct rv_icmp_xlat *x = rv_icmp_xlat();

	if (!x)
		return -RV_DROP_MALFORMED_L4;
	x->in_sport = bport;
	x->in_dport = port;
	rv_addr6_copy(x->outer_src, src);
	rv_addr6_copy(x->outer_dst, baddr);
	rv_addr6_copy(x->in_src, baddr);
	rv_addr6_copy(x->in_dst, src);
	return rv_icmp_translate(ctx, pkt, q, x);
}

/* What one sweep of fullnat_rev_map{,6} needs and counts. */
struct rv_fullnat_sweep {
	__u64 now;
	struct rv_fullnat_config *cfg;
	__u32 removed;
	__u32 pad;
};

/* One entry of the sweep: an idle one is retired (its time swapped, so
 * nothing claims or revives it meanwhile), then deleted. */
static __always_inline void rv_fullnat_sweep_one(void *map, void *key,
						 struct rv_fullnat_flow *e,
						 __u8 proto,
						 struct rv_fullnat_sweep *sw)
{
	__u64 seen = e->last_seen_ns;

	if (!rv_fullnat_expired(sw->cfg, seen, e->flags, proto, sw->now))
		return;
	if (__sync_val_compare_and_swap(&e->last_seen_ns, seen,
					RV_FULLNAT_RETIRED) != seen)
		return;
	if (!bpf_map_delete_elem(map, key))
		sw->removed++;
}

static long rv_fullnat_sweep4(void *map, struct rv_fullnat_key *k,
			      struct rv_fullnat_flow *e,
			      struct rv_fullnat_sweep *sw)
{
	rv_fullnat_sweep_one(map, k, e, k->proto, sw);
	return 0;
}

static long rv_fullnat_sweep6(void *map, struct rv_fullnat6_key *k,
			      struct rv_fullnat_flow *e,
			      struct rv_fullnat_sweep *sw)
{
	rv_fullnat_sweep_one(map, k, e, k->proto, sw);
	return 0;
}

#endif /* RV_FULLNAT_H */
