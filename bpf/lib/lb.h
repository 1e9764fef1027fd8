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
					 const struct rv_service *svc,
					 const struct rv_flow *f)
{
	k->svc_id = svc_id;
	k->saddr = f->caddr[0];
	if (svc->affinity != RV_AFFINITY_CLIENT_IP) {
		k->sport = f->cport;
		k->dport = f->vport;
		k->proto = f->proto;
	}
}

static __always_inline void rv_flow_key6(struct rv_flow6_key *k, __u32 svc_id,
					 const struct rv_service *svc,
					 const struct rv_flow *f)
{
	k->svc_id = svc_id;
	rv_addr6_copy(k->saddr, f->caddr);
	if (svc->affinity != RV_AFFINITY_CLIENT_IP) {
		k->sport = f->cport;
		k->dport = f->vport;
		k->proto = f->proto;
	}
}

/* rv_pick_backend() outcome flags. */
#define RV_PICK_NEW 0x1	      /* a new choice was made and remembered */
#define RV_PICK_REFRESHED 0x2 /* a remembered choice had its time refreshed */

/*
 * Is a remembered choice still good? A down backend never is; a draining
 * one keeps the flows it has. ClientIP affinity also expires. Returns 0
 * when unusable, else 1, or 1 | RV_PICK_REFRESHED when the entry's time
 * was refreshed (at most once a second per flow).
 */
static __always_inline int rv_affinity_usable(struct rv_affinity_value *a,
					      const struct rv_service *svc,
					      __u64 now)
{
	/* Another CPU may have stamped the entry a tick later than our
	 * coarse clock reads: that is age 0, not an underflow. */
	__u64 age = now > a->last_seen_ns ? now - a->last_seen_ns : 0;

	if (rv_backend_state(a->backend_id) == RV_HEALTH_DOWN)
		return 0;
	if (svc->affinity == RV_AFFINITY_CLIENT_IP && svc->affinity_timeout_s &&
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
 * Maglev choice, remembered when `record` is set (ICMP errors look up
 * but never create state). *pick gets RV_PICK_* flags: whether a new
 * choice was made, or an old one refreshed. Returns a backend id, or 0
 * when nothing healthy is left.
 */
static __always_inline __u32 rv_pick_backend(__u32 svc_id,
					     const struct rv_service *svc,
					     const struct rv_flow *f,
					     int record, int *pick)
{
	struct rv_affinity_value *a, fresh = {};
	/* The coarse clock (a tick's resolution) is enough for second-scale
	 * affinity times and costs a fraction of bpf_ktime_get_ns() on the
	 * established path. */
	__u64 now = bpf_ktime_get_coarse_ns();
	int addr_only = svc->affinity == RV_AFFINITY_CLIENT_IP;
	__u32 backend_id;

	int usable;

	*pick = 0;
	if (f->family == RV_FAMILY_V4) {
		struct rv_flow_key k = {};

		rv_flow_key4(&k, svc_id, svc, f);
		a = bpf_map_lookup_elem(&connection_affinity_map, &k);
		usable = a ? rv_affinity_usable(a, svc, now) : 0;
		if (usable) {
			*pick = usable & RV_PICK_REFRESHED;
			return a->backend_id;
		}
		backend_id = rv_maglev_pick(svc->slice_start, svc->slice_len,
					    rv_flow_hash(f->caddr, f->family,
							 f->cport, f->vport,
							 f->proto, addr_only));
		if (!backend_id || !record)
			return backend_id;
		fresh.backend_id = backend_id;
		fresh.last_seen_ns = now;
		bpf_map_update_elem(&connection_affinity_map, &k, &fresh,
				    BPF_ANY);
	} else {
		struct rv_flow6_key k = {};

		rv_flow_key6(&k, svc_id, svc, f);
		a = bpf_map_lookup_elem(&connection_affinity_map6, &k);
		usable = a ? rv_affinity_usable(a, svc, now) : 0;
		if (usable) {
			*pick = usable & RV_PICK_REFRESHED;
			return a->backend_id;
		}
		backend_id = rv_maglev_pick(svc->slice_start, svc->slice_len,
					    rv_flow_hash(f->caddr, f->family,
							 f->cport, f->vport,
							 f->proto, addr_only));
		if (!backend_id || !record)
			return backend_id;
		fresh.backend_id = backend_id;
		fresh.last_seen_ns = now;
		bpf_map_update_elem(&connection_affinity_map6, &k, &fresh,
				    BPF_ANY);
	}
	*pick = RV_PICK_NEW;
	return backend_id;
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
