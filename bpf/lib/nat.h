/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Which VIP a NAT reply belongs to. A backend's (address, port, protocol)
 * that serves one NAT VIP is owned by it (nat_owner_map, written by
 * rivorad): its flows record nothing for their replies, and a reply is
 * proven to be one of them by the owner's own affinity entry for the
 * client's flow, which must name this backend. Every other flow records a
 * nat_reverse_map entry, looked up when the owner's check fails. So a new
 * NAT flow costs one LRU insert (the affinity entry), not two.
 */
#ifndef RV_NAT_H
#define RV_NAT_H

#include "maps.h"

/* The VIP side of a NAT flow, found from its reply. */
struct rv_nat_vip {
	__be32 addr[4];
	__be16 port;
	__u16 pad;
	__u32 svc_id;
};

static __always_inline struct rv_nat_owner *
rv_nat_owner_get(__u8 family, const __be32 *baddr, __be16 bport, __u8 proto)
{
	if (family == RV_FAMILY_V4) {
		struct rv_nat_owner_key k = { .backend_addr = baddr[0],
					      .backend_port = bport,
					      .proto = proto };

		return bpf_map_lookup_elem(&nat_owner_map, &k);
	} else {
		struct rv_nat_owner6_key k = { .backend_port = bport,
					       .proto = proto };

		rv_addr6_copy(k.backend_addr, baddr);
		return bpf_map_lookup_elem(&nat_owner_map6, &k);
	}
}

/* Whether the owner's affinity entry for the client's flow names the
 * owner's backend: then the reply belongs to the owner's flow. */
static __always_inline int rv_nat_owner_flow(__u8 family,
					     const struct rv_nat_owner *o,
					     const __be32 *caddr, __be16 cport,
					     __u8 proto)
{
	struct rv_affinity_value *a;

	if (family == RV_FAMILY_V4) {
		struct rv_flow_key k = { .svc_id = o->svc_id,
					 .saddr = caddr[0],
					 .sport = cport,
					 .dport = o->vip_port,
					 .proto = proto };

		a = bpf_map_lookup_elem(&connection_affinity_map, &k);
	} else {
		struct rv_flow6_key k = { .svc_id = o->svc_id,
					  .sport = cport,
					  .dport = o->vip_port,
					  .proto = proto };

		rv_addr6_copy(k.saddr, caddr);
		a = bpf_map_lookup_elem(&connection_affinity_map6, &k);
	}
	return a && a->backend_id == o->backend_id;
}

/*
 * A new flow of another VIP to the owner's backend, from the client's
 * (address, port): the backend sees the same connection as any owner's
 * flow from there, which is therefore over. Its affinity entry goes, or
 * it would claim this flow's replies for the owner's VIP (the reverse
 * entry this flow records is looked up only when the owner's check
 * fails). Costs a delete on such new flows alone.
 */
static __always_inline void rv_nat_owner_forget(__u8 family,
						const struct rv_nat_owner *o,
						const __be32 *caddr,
						__be16 cport, __u8 proto)
{
	if (family == RV_FAMILY_V4) {
		struct rv_flow_key k = { .svc_id = o->svc_id,
					 .saddr = caddr[0],
					 .sport = cport,
					 .dport = o->vip_port,
					 .proto = proto };

		bpf_map_delete_elem(&connection_affinity_map, &k);
	} else {
		struct rv_flow6_key k = { .svc_id = o->svc_id,
					  .sport = cport,
					  .dport = o->vip_port,
					  .proto = proto };

		rv_addr6_copy(k.saddr, caddr);
		bpf_map_delete_elem(&connection_affinity_map6, &k);
	}
}

/* The VIP a reply from (baddr, bport) to (caddr, cport) must come from.
 * Returns 0 when found, -1 when the reply is no NAT flow's. */
static __always_inline int rv_nat_vip_of(__u8 family, const __be32 *baddr,
					 __be16 bport, const __be32 *caddr,
					 __be16 cport, __u8 proto,
					 struct rv_nat_vip *out)
{
	struct rv_nat_owner *o = rv_nat_owner_get(family, baddr, bport, proto);

	if (o && rv_nat_owner_flow(family, o, caddr, cport, proto)) {
		rv_addr6_copy(out->addr, o->vip_addr);
		out->port = o->vip_port;
		out->svc_id = o->svc_id;
		return 0;
	}
	if (family == RV_FAMILY_V4) {
		struct rv_nat_key k = {
			.backend_addr = baddr[0],
			.client_addr = caddr[0],
			.backend_port = bport,
			.client_port = cport,
			.proto = proto,
		};
		struct rv_nat_value *v =
			bpf_map_lookup_elem(&nat_reverse_map, &k);

		if (!v)
			return -1;
		out->addr[0] = v->vip_addr;
		out->port = v->vip_port;
		out->svc_id = v->svc_id;
	} else {
		struct rv_nat6_key k = {
			.backend_port = bport,
			.client_port = cport,
			.proto = proto,
		};
		struct rv_nat6_value *v;

		rv_addr6_copy(k.backend_addr, baddr);
		rv_addr6_copy(k.client_addr, caddr);
		v = bpf_map_lookup_elem(&nat_reverse_map6, &k);
		if (!v)
			return -1;
		rv_addr6_copy(out->addr, v->vip_addr);
		out->port = v->vip_port;
		out->svc_id = v->svc_id;
	}
	return 0;
}

#endif /* RV_NAT_H */
