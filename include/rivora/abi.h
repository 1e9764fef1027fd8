/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The one definition of everything that crosses the kernel boundary: map
 * keys and values, enums, capacities and drop reasons. The BPF programs
 * include it directly; Rust sees the same types through the BTF-generated
 * skeleton `types` module. Pinned maps outlive upgrades, so any change to a
 * layout here is an ABI change: bump RV_ABI_VERSION and plan a migration
 * (tests/abi_layout.rs snapshots every size and offset).
 *
 * Rules: fixed-width types only, explicit padding, no bool, no bitfields,
 * byte order in the type (__be*) or the field name.
 */
#ifndef RIVORA_ABI_H
#define RIVORA_ABI_H

/*
 * Enums instead of #defines: only enums reach BTF, and so Rust and
 * bpftool. Each enum carries a final sentinel so that Rust can check
 * exhaustiveness against the C side.
 */
enum rv_abi {
	/* Layout version of the pinned maps; stored in rv_meta. Version 2
	 * and 3 pins are upgraded in place (README, "Map layout versions"):
	 * 3 only adds maps, names three pad fields, and re-creates
	 * drop_stats_map larger (counters only); 4 only adds maps (source
	 * ranges), so that a binary that would ignore them refuses the
	 * pins instead of opening a restricted VIP. */
	RV_ABI_VERSION = 4,
};

enum rv_limits {
	RV_MAX_VIPS = 4096,
	RV_MAX_BACKENDS = 8192,
	/* Arrays indexed by id: ids start at 1 (0 means none), so each
	 * holds one more entry than the capacity. */
	RV_SVC_ID_SLOTS = RV_MAX_VIPS + 1,
	RV_BACKEND_ID_SLOTS = RV_MAX_BACKENDS + 1,
	RV_MAGLEV_DEFAULT_SIZE = 65537,
	/* Flow tables (connection_affinity_map{,6}, nat_reverse_map{,6}):
	 * the default of a load-time setting (rivorad -flow-table-size).
	 * LRU with per-CPU lists, so each CPU keeps only its share (max /
	 * possible CPUs). With 65,536 a 2-CPU node whose flows all land on
	 * one CPU kept 32,768, and 64k live flows evicted each other on
	 * every packet. Bigger costs every new flow more (its insert evicts
	 * from a table that outgrows the caches: 262,144 made a DSR new flow
	 * 2.5x dearer here), hence a default sized for a small node. */
	RV_FLOW_TABLE_DEFAULT_SIZE = 131072,
	RV_MAX_FRAGS = 16384,
	RV_MAX_RL_BUCKETS = 65536,
	RV_MAX_IFACES = 256,
	/* Maglev probe window: how many slots past the hashed one a lookup
	 * may step over draining or down backends before giving up. */
	RV_MAGLEV_PROBES = 8,
	/* IPv6 extension headers stepped over before giving up. */
	RV_MAX_EXT_HDRS = 6,
	/* Service ids start at 1; 0 scopes the node-wide rate-limit buckets. */
	RV_RL_NODE_SVC = 0,
	/* nat_owner_map{,6}: one entry per (backend address, port, protocol)
	 * a NAT VIP claims. A full map only costs the VIPs that find no room
	 * a second insert per new flow (see rv_nat_owner). */
	RV_MAX_NAT_OWNERS = 16384,
	/* vip_filter_map: bits indexed by a hash of a VIP's address; a
	 * packet whose destination's bit is clear is no VIP's. */
	RV_VIP_FILTER_BITS = 4096,
	RV_VIP_FILTER_WORDS = RV_VIP_FILTER_BITS / 64,
	/* drop_stats_map's entries: room for reasons added later, so that
	 * a new reason is not a change of the pinned map's size. */
	RV_DROP_STATS_SLOTS = 64,
	/* fullnat_src_map: the node addresses full NAT takes as sources,
	 * by index (0: none). */
	RV_FULLNAT_SRCS = 64,
	/* Ports a new full-NAT flow tries (from the shared cursor) before
	 * it is dropped as exhausted. */
	RV_FULLNAT_PROBES = 32,
	/* source_range_map{,6}: (service, prefix) entries, all VIPs
	 * together. An LPM trie allocates per entry, so the bound costs
	 * nothing until used. */
	RV_MAX_SOURCE_RANGES = 65536,
	/* rv_service.flags' top byte: the generation of the service's
	 * source ranges (1-255, a new one at every change of them). */
	RV_SVC_RANGES_GEN_SHIFT = 24,
};

enum rv_mode {
	RV_MODE_NONE = 0,
	RV_MODE_NAT = 1,
	RV_MODE_DSR = 2,
	RV_MODE_L3DSR = 3,
	/* Source and destination rewritten: the source becomes an address
	 * of this node and a port of fullnat_config_map's range, so the
	 * reply comes back here wherever the backend is. */
	RV_MODE_FULLNAT = 4,
	RV_MODE_MAX,
};

enum rv_affinity {
	RV_AFFINITY_NONE = 0,
	RV_AFFINITY_CLIENT_IP = 1,
	RV_AFFINITY_MAX,
};

enum rv_health {
	RV_HEALTH_HEALTHY = 0,
	RV_HEALTH_DRAINING = 1,
	RV_HEALTH_DOWN = 2,
	RV_HEALTH_MAX,
};

enum rv_family {
	RV_FAMILY_NONE = 0,
	RV_FAMILY_V4 = 4,
	RV_FAMILY_V6 = 6,
};

/* rv_service.flags */
enum rv_service_flags {
	RV_SVC_F_ACTIVE = 1 << 0,
	RV_SVC_F_RATE_LIMIT = 1 << 1,
	RV_SVC_F_PORT_RANGE = 1 << 2,
	/* Some backend is reached by full NAT (its own mode or the
	 * service's): with clientIP affinity, each flow then keeps its
	 * source port in an affinity entry of its own. */
	RV_SVC_F_FULLNAT = 1 << 3,
	/* Only sources in source_range_map{,6} under this service id
	 * reach it (loadBalancerSourceRanges, sourceRanges in the file).
	 * Set with no entry of the VIP's family: no source does. */
	RV_SVC_F_SOURCE_RANGES = 1 << 4,
};

/*
 * Why a packet was dropped; the index into drop_stats_map. Rust maps each
 * to a metric label with an exhaustive match, so a new reason must be
 * named there before it builds.
 */
enum rv_drop_reason {
	RV_DROP_NONE = 0,
	RV_DROP_MALFORMED_L2 = 1,
	RV_DROP_MALFORMED_IPV4 = 2,
	RV_DROP_MALFORMED_IPV6 = 3,
	RV_DROP_MALFORMED_L4 = 4,
	RV_DROP_RATE_LIMITED = 5,
	RV_DROP_NO_HEALTHY_BACKEND = 6,
	RV_DROP_NO_SERVICE = 7,
	RV_DROP_NO_BACKEND = 8,
	/* A later fragment with no record of its first: counted, but handed
	 * to the kernel rather than dropped, since without ports it cannot
	 * be told from a fragment of traffic that is not rivora's. */
	RV_DROP_FRAG_NO_FIRST = 9,
	RV_DROP_FIB_UNREACHABLE = 10,
	RV_DROP_HEADROOM = 11,
	RV_DROP_NO_IFACE_MAC = 12,
	RV_DROP_NO_TUNNEL_SRC = 13,
	/* Full NAT: every port tried for a new flow's (source, backend)
	 * is held by a live flow. */
	RV_DROP_FULLNAT_PORTS_EXHAUSTED = 14,
	/* Full NAT: fullnat_rev_map{,6} is full. */
	RV_DROP_FULLNAT_TABLE_FULL = 15,
	/* Full NAT: no source address for the backend (fullnat_src_map). */
	RV_DROP_NO_FULLNAT_SRC = 16,
	/* The source is outside the VIP's source ranges. */
	RV_DROP_SOURCE_RANGE = 17,
	RV_DROP_MAX,
};

/* vip_map: exact (address, port, protocol) match. */
struct rv_vip_key {
	__be32 addr;
	__be16 port;
	__u8 proto;
	__u8 pad;
};

struct rv_vip6_key {
	__be32 addr[4];
	__be16 port;
	__u8 proto;
	__u8 pad;
};

struct rv_vip_value {
	__u32 svc_id;
};

/*
 * vip_range_map: LPM trie. The trie matches bytes in order after
 * prefixlen, so the protocol comes first, then the address, then the
 * port: a port range is stored as the prefix blocks that cover it.
 */
struct rv_vip_range_key {
	__u32 prefixlen;
	__u8 proto;
	__u8 pad[3];
	__be32 addr;
	__be16 port;
	__u16 pad2;
};

struct rv_vip_range6_key {
	__u32 prefixlen;
	__u8 proto;
	__u8 pad[3];
	__be32 addr[4];
	__be16 port;
	__u16 pad2;
};

/* service_config_map: indexed by service id. */
struct rv_service {
	__u8 mode;     /* enum rv_mode */
	__u8 affinity; /* enum rv_affinity */
	__u8 family;   /* enum rv_family */
	__u8 proto;
	__u32 flags; /* enum rv_service_flags */
	__u32 slice_start;
	__u32 slice_len;
	__u32 backend_count;
	__u32 affinity_timeout_s;
};

/* maglev_table: one shared array; each service owns a slice. */
struct rv_maglev_slot {
	__u32 backend_id;
};

/* rv_nexthop.flags */
enum rv_nexthop_flags {
	/* ifindex, MACs and mtu are what bpf_fib_lookup would answer for
	 * the backend, out of an interface rivorad is attached to. */
	RV_NH_F_VALID = 1 << 0,
	/* The FIB sends the backend's packets out of an interface rivorad
	 * is not attached to: the kernel forwards them (XDP_PASS). */
	RV_NH_F_KERNEL = 1 << 1,
	/* What was cached no longer holds (the neighbour went away): ask
	 * the FIB until rivorad has resolved it again. */
	RV_NH_F_STALE = 1 << 2,
	/* With VALID: the egress runs rivorad as generic XDP, which has no
	 * XDP transmit (a bridge): XDP_TX out of it when the packet came in
	 * by it, else the kernel forwards (as rv_fib_can_send()). */
	RV_NH_F_TX_ONLY = 1 << 3,
};

/*
 * The next hop towards a backend (NAT) or tunnel destination (L3 DSR),
 * resolved by rivorad from the kernel's routes, neighbours and links and
 * kept current from their netlink notifications. flags 0: none cached,
 * the datapath asks bpf_fib_lookup and counts the miss in nh_miss_map.
 */
struct rv_nexthop {
	__u32 ifindex; /* egress */
	__u32 mtu;     /* what the FIB checks tot_len against */
	__u8 dmac[6];
	__u8 smac[6];
	__u8 flags; /* enum rv_nexthop_flags */
	/* How the backend is reached when not by its service's mode
	 * (enum rv_mode; RV_MODE_NONE: the service's). Here because the
	 * backend's entry had no other room: a pad byte in layout 2. */
	__u8 mode;
	/* Full NAT's source address towards the backend: an index into
	 * fullnat_src_map (0: none). Also a pad byte in layout 2. */
	__u8 fullnat_src;
	__u8 pad;
};

struct rv_backend {
	__be32 addr;
	__be16 port; /* 0: keep the destination port */
	__u8 mac[6];
	struct rv_nexthop nh;
};

struct rv_backend6 {
	__be32 addr[4];
	__be16 port;
	__u8 mac[6];
	struct rv_nexthop nh;
};

/* nh_miss_map (per-CPU): by backend id, packets that found no usable
 * cached next hop and asked the FIB. rivorad polls it. */
struct rv_nh_miss {
	__u64 packets;
};

struct rv_backend_health {
	__u8 state; /* enum rv_health */
	__u8 pad[3];
};

/*
 * connection_affinity_map: the flow as the client sent it, scoped by
 * service. ClientIP affinity zeroes the ports and protocol.
 */
struct rv_flow_key {
	__u32 svc_id;
	__be32 saddr;
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 pad[3];
};

struct rv_flow6_key {
	__u32 svc_id;
	__be32 saddr[4];
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 pad[3];
};

struct rv_affinity_value {
	__u32 backend_id;
	/* Full NAT: the flow's source port and address index (0: none);
	 * the pad word of layout 2. */
	__be16 fullnat_port;
	__u8 fullnat_src;
	/* The generation of the service's source ranges this flow was
	 * last found inside (0: never checked; the pad byte of layout 3):
	 * the flow's packets skip the lookup until the ranges change. */
	__u8 ranges_gen;
	__u64 last_seen_ns; /* bpf_ktime_get_ns() */
};

/*
 * nat_reverse_map: keyed by the reply as the backend sends it (backend
 * to client), holding the VIP to restore as its source.
 */
struct rv_nat_key {
	__be32 backend_addr;
	__be32 client_addr;
	__be16 backend_port;
	__be16 client_port;
	__u8 proto;
	__u8 pad[3];
};

struct rv_nat6_key {
	__be32 backend_addr[4];
	__be32 client_addr[4];
	__be16 backend_port;
	__be16 client_port;
	__u8 proto;
	__u8 pad[3];
};

struct rv_nat_value {
	__be32 vip_addr;
	__be16 vip_port;
	__u16 pad;
	__u32 svc_id;
};

struct rv_nat6_value {
	__be32 vip_addr[4];
	__be16 vip_port;
	__u16 pad;
	__u32 svc_id;
};

/*
 * nat_owner_map: replies need no per-flow entry when the backend's
 * (address, port, protocol) serves one NAT VIP: the VIP that owns it.
 * tc_nat finds the owner by the reply's source and checks the flow in
 * the owner's connection_affinity_map entry (the backend it names must
 * be this one). Flows of other VIPs sharing the backend record a
 * nat_reverse_map entry as before. Written by rivorad; an owner keeps
 * its entry until it lets the backend go, so its flows never lose it.
 */
struct rv_nat_owner_key {
	__be32 backend_addr;
	__be16 backend_port;
	__u8 proto;
	__u8 pad;
};

struct rv_nat_owner6_key {
	__be32 backend_addr[4];
	__be16 backend_port;
	__u8 proto;
	__u8 pad;
};

struct rv_nat_owner {
	__u32 svc_id;
	__u32 backend_id;
	__be32 vip_addr[4]; /* IPv4 uses [0] */
	__be16 vip_port;
	__u16 pad;
};

/* vip_filter_map: one entry. While `active` (rivorad's writer keeps it
 * so), bit rv_vip_filter_bit(addr) is set for every VIP address; an
 * inactive (all-zero) filter lets every packet through to the lookups. */
struct rv_vip_filter {
	__u32 active;
	__u32 pad;
	__u64 bits[RV_VIP_FILTER_WORDS];
};

/*
 * frag_map: a datagram's fragments by (source, destination, id, proto),
 * holding the first fragment's decision. frag_rev_map is the same for
 * NAT replies, holding the VIP to restore.
 */
struct rv_frag_key {
	__be32 saddr;
	__be32 daddr;
	__be16 id;
	__u8 proto;
	__u8 pad;
};

struct rv_frag6_key {
	__be32 saddr[4];
	__be32 daddr[4];
	__be32 id;
	__u8 proto;
	__u8 pad[3];
};

struct rv_frag_value {
	__u32 svc_id;
	__u32 backend_id;
};

struct rv_frag_rev_value {
	__be32 vip_addr;
	__u32 svc_id;
};

struct rv_frag_rev6_value {
	__be32 vip_addr[4];
	__u32 svc_id;
};

/* stats_map (per-CPU): indexed by service id. */
struct rv_vip_stats {
	__u64 packets;
	__u64 bytes;
	__u64 rate_limited;
	__u64 no_backend;
};

/*
 * source_range_map: LPM trie. The service id is the first 32 bits of
 * every prefix, so one lookup of (id, source) at full length finds the
 * longest range of that service alone; prefixlen is 32 + the range's.
 */
struct rv_source_range_key {
	__u32 prefixlen;
	__be32 svc_id; /* network order: the trie matches bytes in order */
	__be32 addr;
};

struct rv_source_range6_key {
	__u32 prefixlen;
	__be32 svc_id;
	__be32 addr[4];
};

struct rv_source_range {
	/* The range's own length, for dumps; the trie keeps it too. */
	__u32 len;
};

/* source_refused_map (per-CPU): indexed by service id. Kept apart from
 * rv_vip_stats so that the pinned stats keep their layout. */
struct rv_source_refused {
	__u64 packets;
};

/* drop_stats_map (per-CPU): indexed by enum rv_drop_reason. */
struct rv_drop_stats {
	__u64 packets;
};

/* rl_config_map (one entry, node-wide) and svc_rl_config_map (per service). */
struct rv_rl_config {
	__u32 enabled;
	__u32 rate_per_sec; /* SYNs per second per source */
	__u32 burst;
	__u32 pad;
};

struct rv_rl_key {
	__u32 svc_id; /* RV_RL_NODE_SVC (0) for the node-wide bucket */
	__be32 saddr;
};

struct rv_rl6_key {
	__u32 svc_id;
	__be32 saddr[4];
};

struct rv_rl_bucket {
	__u64 tokens_milli; /* tokens x 1000, for sub-token refill */
	__u64 last_ns;
};

/* rv_iface_mac.flags */
enum rv_iface_flags {
	/* rivorad's XDP program runs on it as generic (skb) XDP: the device
	 * has no XDP transmit of its own (a bridge has none), and a frame
	 * redirected into it from native XDP is dropped without a trace.
	 * Packets routed out of it are left to the kernel to send. */
	RV_IFACE_F_GENERIC_XDP = 1 << 0,
};

/* iface_mac_map: the interfaces rivorad is attached to, by ifindex. */
struct rv_iface_mac {
	__u8 mac[6];
	__u8 flags; /* enum rv_iface_flags */
	__u8 pad;
};

struct rv_tunnel_config {
	__be32 src4;
	__be32 src6[4];
};

/*
 * tunnel_ep_map: the endpoints behind this node that another node's L3 DSR
 * may tunnel to (IPIP or IPv6-in-IPv6 addressed to the endpoint itself),
 * by the service of the inner packet's VIP and the outer destination
 * (IPv4 uses addr[0]). The value is the backend this node NATs the inner
 * packet to: the choice the other node made, kept.
 */
struct rv_tunnel_ep_key {
	__u32 svc_id;
	__be32 addr[4];
};

struct rv_tunnel_ep {
	__u32 backend_id;
};

/* fullnat_config_map: one entry, written by rivorad. */
struct rv_fullnat_config {
	/* The source ports full NAT gives out, host order, inclusive; both
	 * 0: none (full NAT drops every new flow as exhausted). */
	__u16 port_min;
	__u16 port_max;
	/* Idle times after which a flow's ports may be given again. */
	__u32 tcp_timeout_ms;
	__u32 tcp_closing_timeout_ms; /* once a FIN or RST was seen */
	__u32 udp_timeout_ms;
	/* Bit rv_fullnat_src_bit(addr) is set for every address of
	 * fullnat_src_map: a packet to another address is no reply. */
	__u64 src_filter;
};

/* fullnat_src_map: by index (1..RV_FULLNAT_SRCS-1). IPv4 uses [0]. */
struct rv_fullnat_src {
	__be32 addr[4];
};

/*
 * fullnat_rev_map{,6}: keyed by the reply as the backend sends it (backend
 * to this node's source address and port). The entry is the port's
 * allocation: inserted with BPF_NOEXIST, so a tuple has one flow, and
 * given again only once the flow has been idle past its timeout.
 */
struct rv_fullnat_key {
	__be32 backend_addr;
	__be32 src_addr;
	__be16 backend_port;
	__be16 src_port;
	__u8 proto;
	__u8 pad[3];
};

struct rv_fullnat6_key {
	__be32 backend_addr[4];
	__be32 src_addr[4];
	__be16 backend_port;
	__be16 src_port;
	__u8 proto;
	__u8 pad[3];
};

/* rv_fullnat_flow.flags */
enum rv_fullnat_flags {
	/* ifindex and the MACs are the way the request came in: the reply
	 * leaves by it (an untagged frame on an attached interface). */
	RV_FULLNAT_F_RETURN_PATH = 1 << 0,
	/* A FIN or RST was seen: the closing timeout applies. */
	RV_FULLNAT_F_CLOSING = 1 << 1,
};

struct rv_fullnat_flow {
	__be32 client_addr[4]; /* IPv4 uses [0] */
	__be32 vip_addr[4];
	__be16 client_port;
	__be16 vip_port;
	__u32 svc_id;
	__u32 backend_id;
	__u32 ifindex;
	__u8 dmac[6]; /* the request's source MAC */
	__u8 smac[6]; /* the request's destination MAC */
	__u8 flags;   /* enum rv_fullnat_flags */
	__u8 pad[3];
	__u64 last_seen_ns; /* bpf_ktime_get_coarse_ns() */
};

/* fullnat_cursor_map: where the next port is tried, as a count the range
 * is taken modulo of; moved by an atomic add. */
struct rv_fullnat_cursor {
	__u32 next;
};

/* fullnat_stats_map (per-CPU): by service id. */
struct rv_fullnat_stats {
	__u64 ports_exhausted;
	__u64 table_full;
};

/* fullnat_frag_map{,6}: a reply datagram's later fragments by (backend,
 * this node's source address, id, proto): where the first one went. */
struct rv_fullnat_frag {
	__be32 client_addr[4];
	__be32 vip_addr[4];
};

/* meta_map: what wrote the pinned maps, read back on adoption. */
struct rv_meta {
	__u32 abi_version;
	__u32 maglev_size;
};

#endif /* RIVORA_ABI_H */
