/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Matching a VIP and picking a backend. */
#ifndef RV_LB_H
#define RV_LB_H

#include "maps.h"
#include "hash.h"
#include "parse.h"

/* Affinity timestamps are refreshed at most this often, so an
 * established flow does not write its entry on every packet. */
#define RV_AFFINITY_TOUCH_NS (1ULL * RV_NSEC_PER_SEC)

/*
 * Whether a destination may be a VIP's address. Most traffic through a
 * node is no VIP's: one bit in an array read (inlined by the verifier)
 * tells it so before the port is parsed or a hash table or the port-range
 * trie is searched. Multiplicative hashing of the address (its four words
 * folded for IPv6); rivorad sets the bits with the same function
 * (rivora::abi::vip_filter_bit). A collision only costs the lookups.
 */
static __always_inline __u32 rv_vip_filter_bit(__u8 family, const __be32 *addr)
{
	__u32 x = addr[0];

	if (family == RV_FAMILY_V6)
		x ^= addr[1] ^ addr[2] ^ addr[3];
	return (x * 0x9E3779B1u) >> (32 - 12);
}

static __always_inline int rv_vip_filter_may_match(__u8 family,
						   const __be32 *addr)
{
	__u32 zero = 0, bit = rv_vip_filter_bit(family, addr);
	struct rv_vip_filter *f = bpf_map_lookup_elem(&vip_filter_map, &zero);

	if (!f || !f->active)
		return 1;
	return (f->bits[(bit / 64) & (RV_VIP_FILTER_WORDS - 1)] >> (bit % 64)) &
	       1;
}

/* The service id for (addr, port, proto): exact match first, then the
 * longest prefix in the port-range trie. 0 means no VIP. */
static __always_inline __u32 rv_vip_lookup(__u8 family, const __be32 *addr,
					   __be16 port, __u8 proto)
{
	struct rv_vip_value *v;

	if (family == RV_FAMILY_V4) {
		struct rv_vip_key k = { .addr = addr[0],
					.port = port,
					.proto = proto };
		struct rv_vip_range_key rk = {
			.prefixlen = 8 * (sizeof(rk) - sizeof(rk.prefixlen) -
					  sizeof(rk.pad2)),
			.proto = proto,
			.addr = addr[0],
			.port = port,
		};

		v = bpf_map_lookup_elem(&vip_map, &k);
		if (v)
			return v->svc_id;
		v = bpf_map_lookup_elem(&vip_range_map, &rk);
		return v ? v->svc_id : 0;
	} else {
		struct rv_vip6_key k = { .port = port, .proto = proto };
		struct rv_vip_range6_key rk = {
			.prefixlen = 8 * (sizeof(rk) - sizeof(rk.prefixlen) -
					  sizeof(rk.pad2)),
			.proto = proto,
			.port = port,
		};

		rv_addr6_copy(k.addr, addr);
		rv_addr6_copy(rk.addr, addr);
		v = bpf_map_lookup_elem(&vip_map6, &k);
		if (v)
			return v->svc_id;
		v = bpf_map_lookup_elem(&vip_range_map6, &rk);
		return v ? v->svc_id : 0;
	}
}

static __always_inline struct rv_service *rv_service_get(__u32 svc_id,
							 __u8 family)
{
	struct rv_service *svc =
		bpf_map_lookup_elem(&service_config_map, &svc_id);

	if (!svc || !(svc->flags & RV_SVC_F_ACTIVE) || svc->family != family ||
	    svc->slice_len == 0)
		return 0;
	return svc;
}

/*
 * Whether `saddr` may reach the service: always, unless it carries
 * source ranges; then only from inside one of them. Returns 0 or
 * -RV_DROP_SOURCE_RANGE, counted against the service.
 */
static __always_inline int rv_source_allowed(const struct rv_service *svc,
					     __u32 svc_id, __u8 family,
					     const __be32 *saddr)
{
	struct rv_source_refused *r;
	void *hit;

	if (!(svc->flags & RV_SVC_F_SOURCE_RANGES))
		return 0;
	if (family == RV_FAMILY_V4) {
		struct rv_source_range_key k = {
			.prefixlen = 64,
			.svc_id = bpf_htonl(svc_id),
			.addr = saddr[0],
		};

		hit = bpf_map_lookup_elem(&source_range_map, &k);
	} else {
		struct rv_source_range6_key k = {
			.prefixlen = 160,
			.svc_id = bpf_htonl(svc_id),
		};

		rv_addr6_copy(k.addr, saddr);
		hit = bpf_map_lookup_elem(&source_range6_map, &k);
	}
	if (hit)
		return 0;
	r = bpf_map_lookup_elem(&source_refused_map, &svc_id);
	if (r)
		r->packets++;
	return -RV_DROP_SOURCE_RANGE;
}

static __always_inline __u8 rv_backend_state(__u32 backend_id)
{
	struct rv_backend_health *h =
		bpf_map_lookup_elem(&backend_health_map, &backend_id);

	return h ? h->state : RV_HEALTH_DOWN;
}

/* The flow this packet (or, for an ICMP error, the quoted packet turned
 * around) belongs to, seen from the client. */
struct rv_flow {
	__be32 caddr[4];
	__be16 cport;
	__be16 vport;
	__u8 proto;
	__u8 family;
	__u8 pad[2];
};

/* Walk the VIP's slice from the hashed slot, stepping over draining and
 * down backends for at most RV_MAGLEV_PROBES slots.
 *
 * A global function, so the verifier checks its unrolled walk once, on its
 * own, instead of once for every path that reaches a pick: inlined, the
 * walk was a fifth of all the instructions the verifier processed, and the
 * load of xdp_ingress is most of a restart's time. Scalars only, so that
 * nothing about the caller's state is needed to verify it. */
__noinline __u32 rv_maglev_pick(__u32 slice_start, __u32 slice_len, __u32 hash)
{
	__u32 idx;
	int i;

	if (!slice_len)
		return 0;
	idx = hash % slice_len;
#pragma unroll
	for (i = 0; i < RV_MAGLEV_PROBES; i++) {
		__u32 slot = slice_start + idx;
		struct rv_maglev_slot *s =
			bpf_map_lookup_elem(&maglev_table, &slot);

		if (s && s->backend_id &&
		    rv_backend_state(s->backend_id) == RV_HEALTH_HEALTHY)
			return s->backend_id;
		if (++idx >= slice_len)
			idx = 0;
	}
	return 0;
}

static __always_inline void rv_flow_key4(struct rv_flow_key *k, __u32 svc_id,
					 int addr_only, const struct rv_flow *f)
{
	k->svc_id = svc_id;
	k->saddr = f->caddr[0];
	if (!addr_only) {
		k->sport = f->cport;
		k->dport = f->vport;
		k->proto = f->proto;
	}
}

static __always_inline void rv_flow_key6(struct rv_flow6_key *k, __u32 svc_id,
					 int addr_only, const struct rv_flow *f)
{
	k->svc_id = svc_id;
	rv_addr6_copy(k->saddr, f->caddr);
	if (!addr_only) {
		k->sport = f->cport;
		k->dport = f->vport;
		k->proto = f->proto;
	}
}

/* rv_target.pick flags. */
#define RV_PICK_NEW 0x1	      /* the affinity entry is to be written */
#define RV_PICK_REFRESHED 0x2 /* a remembered choice had its time refreshed */
/* clientIP affinity with full NAT: the flow's own entry (its source port)
 * is to be written beside the client's. */
#define RV_PICK_FLOW_NEW 0x4

/* What a forward step needs beyond the packet: the choice, and what
 * remembering it takes. */
struct rv_target {
	__u64 now; /* bpf_ktime_get_coarse_ns() at the pick */
	__u32 svc_id;
	__u32 backend_id;
	/* The remembered entry's rv_affinity_value.ranges_gen (0 for a new
	 * pick), what rv_remember() writes into a new entry; then, once the
	 * flow is remembered, the flow label of an IPv6 L3 DSR tunnel (only
	 * computed for those). One word for both: the established path
	 * zeroes and carries every byte of this struct. */
	union {
		__u32 ranges_gen;
		__u32 label;
	};
	/* Full NAT: the flow's source port (0: none yet), address index and,
	 * once rv_fullnat_prepare() has run, the address. */
	__be16 fnat_port;
	__u8 fnat_src;
	__u8 pick; /* RV_PICK_* */
	__be32 fnat_addr[4];
};

/* A backend as the forward step sees it: a copy of its entry, the port
 * it is sent to (the VIP's when the backend keeps it) and how it is
 * reached (its own mode, else its service's). No pointer: it is handed to
 * a global function, to which it is plain memory. */
struct rv_be {
	__be32 addr[4];
	__be16 port;
	__u8 mac[6];
	struct rv_nexthop nh;
	__u8 mode;
	__u8 pad[7];
};

/* The backend as full NAT sends to it: its address, the port (the VIP's
 * when the backend keeps it) and the index of the source towards it.
 * Free of pointers, so that handing it to a global function (which the
 * verifier assumes may write it) costs the caller no pointer it spilled. */
struct rv_fullnat_to {
	__be32 addr[4];
	__be16 port;
	__u8 src;
	__u8 pad;
};

/*
 * Is a remembered choice still good? A down backend never is; a draining
 * one keeps the flows it has. ClientIP affinity also expires (`expires`).
 * Returns 0 when unusable, else 1, or 1 | RV_PICK_REFRESHED when the
 * entry's time was refreshed (at most once a second per flow).
 */
static __always_inline int rv_affinity_usable(struct rv_affinity_value *a,
					      const struct rv_service *svc,
					      int expires, __u64 now)
{
	/* Another CPU may have stamped the entry a tick later than our
	 * coarse clock reads: that is age 0, not an underflow. */
	__u64 age = now > a->last_seen_ns ? now - a->last_seen_ns : 0;

	if (rv_backend_state(a->backend_id) == RV_HEALTH_DOWN)
		return 0;
	if (expires && svc->affinity_timeout_s &&
	    age > (__u64)svc->affinity_timeout_s * RV_NSEC_PER_SEC)
		return 0;
	if (age > RV_AFFINITY_TOUCH_NS) {
		a->last_seen_ns = now;
		return 1 | RV_PICK_REFRESHED;
	}
	return 1;
}

/*
 * The backend for a flow: its remembered one if still usable, else the
 * Maglev choice. Nothing is written here: a new choice sets RV_PICK_NEW
 * and rv_remember() writes it once the forward step has what the entry
 * holds (full NAT's port); ICMP errors look up and never remember. Fills
 * t->backend_id (0 when nothing healthy is left), t->pick, t->now and,
 * for a full-NAT flow, the port and source it has.
 *
 * With clientIP affinity and full-NAT backends, a flow keeps its source
 * port in an entry keyed by the whole flow, looked up first: the
 * client's entry names a backend, not a flow.
 *
 * One body per family (the key types and maps differ), each branch taken
 * once: helpers that each test the family again make the verifier walk
 * every mix of the two.
 */
#define RV_PICK_BODY(KEY, MAP, FILL)                                           \
	{                                                                      \
		struct rv_affinity_value *a;                                   \
		KEY k = {};                                                    \
		int usable;                                                    \
                                                                               \
		if (addr_only && (svc->flags & RV_SVC_F_FULLNAT)) {            \
			FILL(&k, t->svc_id, 0, f);                             \
			a = bpf_map_lookup_elem(&MAP, &k);                     \
			usable = a && a->fullnat_port                          \
					 ? rv_affinity_usable(a, svc, 0,       \
							      t->now)          \
					 : 0;                                  \
			if (usable) {                                          \
				t->pick = usable & RV_PICK_REFRESHED;          \
				t->backend_id = a->backend_id;                 \
				t->fnat_port = a->fullnat_port;                \
				t->fnat_src = a->fullnat_src;                  \
				t->ranges_gen = a->ranges_gen;                 \
				return;                                        \
			}                                                      \
			__builtin_memset(&k, 0, sizeof(k));                    \
		}                                                              \
		FILL(&k, t->svc_id, addr_only, f);                             \
		a = bpf_map_lookup_elem(&MAP, &k);                             \
		usable =                                                       \
			a ? rv_affinity_usable(a, svc, addr_only, t->now) : 0; \
		if (usable) {                                                  \
			t->pick = usable & RV_PICK_REFRESHED;                  \
			t->backend_id = a->backend_id;                         \
			t->ranges_gen = a->ranges_gen;                         \
			if (!addr_only) {                                      \
				t->fnat_port = a->fullnat_port;                \
				t->fnat_src = a->fullnat_src;                  \
			}                                                      \
			return;                                                \
		}                                                              \
	}

static __always_inline void rv_pick_backend(const struct rv_service *svc,
					    const struct rv_flow *f,
					    struct rv_target *t)
{
	int addr_only = svc->affinity == RV_AFFINITY_CLIENT_IP;

	/* The coarse clock (a tick's resolution) is enough for second-scale
	 * affinity times and costs a fraction of bpf_ktime_get_ns() on the
	 * established path. */
	t->now = bpf_ktime_get_coarse_ns();
	t->pick = 0;
	t->ranges_gen = 0;
	if (f->family == RV_FAMILY_V4)
		RV_PICK_BODY(struct rv_flow_key, connection_affinity_map,
			     rv_flow_key4)
	else
		RV_PICK_BODY(struct rv_flow6_key, connection_affinity_map6,
			     rv_flow_key6)
	t->backend_id =
		rv_maglev_pick(svc->slice_start, svc->slice_len,
			       rv_flow_hash(f->caddr, f->family, f->cport,
					    f->vport, f->proto, addr_only));
	t->pick = RV_PICK_NEW;
}

/* rv_pick_backend() as a global function: verified once, and its keys on
 * a frame of their own rather than on its callers'. */
__noinline int rv_pick(const struct rv_service *svc, const struct rv_flow *f,
		       struct rv_target *t)
{
	if (!svc || !f || !t)
		return 0;
	rv_pick_backend(svc, f, t);
	return 0;
}

/*
 * The source ranges for every packet of a flow, not only its first (a
 * range taken away ends the flows it let in), at the cost of one lookup
 * per flow and change of the ranges: a flow whose affinity entry says it
 * was inside the ranges of this generation skips the trie. `check` 0: the
 * packet was checked already (a SYN, before its rate limit). A new pick's
 * entry is written with the generation by rv_remember(); a remembered
 * one is stamped here once it passes.
 */
#define RV_STAMP_BODY(KEY, MAP, FILL)                                       \
	{                                                                   \
		KEY k = {};                                                 \
		struct rv_affinity_value *a;                                \
                                                                            \
		FILL(&k, t->svc_id, svc->affinity == RV_AFFINITY_CLIENT_IP, \
		     f);                                                    \
		a = bpf_map_lookup_elem(&MAP, &k);                          \
		if (a && a->backend_id == t->backend_id)                    \
			a->ranges_gen = gen;                                \
	}

static __always_inline int rv_source_admit(const struct rv_service *svc,
					   const struct rv_flow *f,
					   struct rv_target *t, int check)
{
	__u8 gen = svc->flags >> RV_SVC_RANGES_GEN_SHIFT;
	int ret;

	/* Generation 0 is no generation: a writer that set none leaves
	 * every packet checked. */
	if (gen && !(t->pick & RV_PICK_NEW) && t->ranges_gen == gen)
		return 0;
	if (check) {
		ret = rv_source_allowed(svc, t->svc_id, f->family, f->caddr);
		if (ret)
			return ret;
	}
	t->ranges_gen = gen;
	if (t->pick & RV_PICK_NEW)
		return 0;
	if (f->family == RV_FAMILY_V4)
		RV_STAMP_BODY(struct rv_flow_key, connection_affinity_map,
			      rv_flow_key4)
	else
		RV_STAMP_BODY(struct rv_flow6_key, connection_affinity_map6,
			      rv_flow_key6)
	return 0;
}

#define RV_REMEMBER_BODY(KEY, MAP, FILL)                            \
	{                                                           \
		KEY k = {};                                         \
                                                                    \
		if (t->pick & RV_PICK_NEW) {                        \
			FILL(&k, t->svc_id, addr_only, f);          \
			bpf_map_update_elem(&MAP, &k, &v, BPF_ANY); \
		}                                                   \
		if (t->pick & RV_PICK_FLOW_NEW) {                   \
			__builtin_memset(&k, 0, sizeof(k));         \
			v.fullnat_port = t->fnat_port;              \
			v.fullnat_src = t->fnat_src;                \
			FILL(&k, t->svc_id, 0, f);                  \
			bpf_map_update_elem(&MAP, &k, &v, BPF_ANY); \
		}                                                   \
	}

/* Write what the pick chose (rv_target.pick says which entries). */
static __always_inline void rv_remember(const struct rv_service *svc,
					const struct rv_flow *f,
					const struct rv_target *t)
{
	struct rv_affinity_value v = { .backend_id = t->backend_id,
				       .ranges_gen = t->ranges_gen,
				       .last_seen_ns = t->now };
	int addr_only = svc->affinity == RV_AFFINITY_CLIENT_IP;

	if (!addr_only) {
		v.fullnat_port = t->fnat_port;
		v.fullnat_src = t->fnat_src;
	}
	if (f->family == RV_FAMILY_V4)
		RV_REMEMBER_BODY(struct rv_flow_key, connection_affinity_map,
				 rv_flow_key4)
	else
		RV_REMEMBER_BODY(struct rv_flow6_key, connection_affinity_map6,
				 rv_flow_key6)
}

static __always_inline void rv_count_vip(__u32 svc_id, __u64 bytes)
{
	struct rv_vip_stats *s = bpf_map_lookup_elem(&stats_map, &svc_id);

	if (s) {
		s->packets++;
		s->bytes += bytes;
	}
}

#endif /* RV_LB_H */
