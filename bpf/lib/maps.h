/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Every map, declared once, with BTF key and value types so that
 * `bpftool map dump` prints fields. Map names are ABI: they are the pin
 * paths under /sys/fs/bpf/rivora-lb, shared by xdp_ingress and tc_nat
 * (the loader points both objects at the same pins).
 */
#ifndef RV_MAPS_H
#define RV_MAPS_H

#include "common.h"

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct rv_meta);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} meta_map SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, RV_MAX_VIPS);
	__type(key, struct rv_vip_key);
	__type(value, struct rv_vip_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} vip_map SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, RV_MAX_VIPS);
	__type(key, struct rv_vip6_key);
	__type(value, struct rv_vip_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} vip_map6 SEC(".maps");

/* A port range decomposes into at most 30 prefix blocks; the tries are
 * sized so every VIP could be a worst-case range. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, RV_MAX_VIPS * 4);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct rv_vip_range_key);
	__type(value, struct rv_vip_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} vip_range_map SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, RV_MAX_VIPS * 4);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct rv_vip_range6_key);
	__type(value, struct rv_vip_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} vip_range_map6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, RV_SVC_ID_SLOTS);
	__type(key, __u32);
	__type(value, struct rv_service);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} service_config_map SEC(".maps");

/* max_entries is a load-time setting (the loader resizes it). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, RV_MAGLEV_DEFAULT_SIZE);
	__type(key, __u32);
	__type(value, struct rv_maglev_slot);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} maglev_table SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, RV_BACKEND_ID_SLOTS);
	__type(key, __u32);
	__type(value, struct rv_backend);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} backend_map SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, RV_BACKEND_ID_SLOTS);
	__type(key, __u32);
	__type(value, struct rv_backend6);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} backend_map6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, RV_BACKEND_ID_SLOTS);
	__type(key, __u32);
	__type(value, struct rv_backend_health);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} backend_health_map SEC(".maps");

/*
 * The per-flow tables: max_entries of these four is a load-time setting
 * (the loader resizes them, all four alike).
 */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, RV_FLOW_TABLE_DEFAULT_SIZE);
	__uint(map_flags, BPF_F_NO_COMMON_LRU);
	__type(key, struct rv_flow_key);
	__type(value, struct rv_affinity_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} connection_affinity_map SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, RV_FLOW_TABLE_DEFAULT_SIZE);
	__uint(map_flags, BPF_F_NO_COMMON_LRU);
	__type(key, struct rv_flow6_key);
	__type(value, struct rv_affinity_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} connection_affinity_map6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, RV_FLOW_TABLE_DEFAULT_SIZE);
	__uint(map_flags, BPF_F_NO_COMMON_LRU);
	__type(key, struct rv_nat_key);
	__type(value, struct rv_nat_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} nat_reverse_map SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, RV_FLOW_TABLE_DEFAULT_SIZE);
	__uint(map_flags, BPF_F_NO_COMMON_LRU);
	__type(key, struct rv_nat6_key);
	__type(value, struct rv_nat6_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} nat_reverse_map6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, RV_MAX_FRAGS);
	__uint(map_flags, BPF_F_NO_COMMON_LRU);
	__type(key, struct rv_frag_key);
	__type(value, struct rv_frag_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} frag_map SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, RV_MAX_FRAGS);
	__uint(map_flags, BPF_F_NO_COMMON_LRU);
	__type(key, struct rv_frag6_key);
	__type(value, struct rv_frag_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} frag_map6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, RV_MAX_FRAGS);
	__uint(map_flags, BPF_F_NO_COMMON_LRU);
	__type(key, struct rv_frag_key);
	__type(value, struct rv_frag_rev_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} frag_rev_map SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, RV_MAX_FRAGS);
	__uint(map_flags, BPF_F_NO_COMMON_LRU);
	__type(key, struct rv_frag6_key);
	__type(value, struct rv_frag_rev6_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} frag_rev_map6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, RV_SVC_ID_SLOTS);
	__type(key, __u32);
	__type(value, struct rv_vip_stats);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} stats_map SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, RV_DROP_STATS_SLOTS);
	__type(key, __u32);
	__type(value, struct rv_drop_stats);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} drop_stats_map SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, RV_MAX_SOURCE_RANGES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct rv_source_range_key);
	__type(value, struct rv_source_range);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} source_range_map SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, RV_MAX_SOURCE_RANGES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct rv_source_range6_key);
	__type(value, struct rv_source_range);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} source_range6_map SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, RV_SVC_ID_SLOTS);
	__type(key, __u32);
	__type(value, struct rv_source_refused);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} source_refused_map SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct rv_rl_config);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} rl_config_map SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, RV_SVC_ID_SLOTS);
	__type(key, __u32);
	__type(value, struct rv_rl_config);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} svc_rl_config_map SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, RV_MAX_RL_BUCKETS);
	__uint(map_flags, BPF_F_NO_COMMON_LRU);
	__type(key, struct rv_rl_key);
	__type(value, struct rv_rl_bucket);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} rl_buckets_map SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, RV_MAX_RL_BUCKETS);
	__uint(map_flags, BPF_F_NO_COMMON_LRU);
	__type(key, struct rv_rl6_key);
	__type(value, struct rv_rl_bucket);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} rl_buckets_map6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, RV_MAX_IFACES);
	__type(key, __u32); /* ifindex */
	__type(value, struct rv_iface_mac);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} iface_mac_map SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct rv_tunnel_config);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tunnel_config_map SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, RV_MAX_BACKENDS);
	__type(key, struct rv_tunnel_ep_key);
	__type(value, struct rv_tunnel_ep);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tunnel_ep_map SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, RV_BACKEND_ID_SLOTS);
	__type(key, __u32);
	__type(value, struct rv_nh_miss);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} nh_miss_map SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, RV_MAX_NAT_OWNERS);
	__type(key, struct rv_nat_owner_key);
	__type(value, struct rv_nat_owner);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} nat_owner_map SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, RV_MAX_NAT_OWNERS);
	__type(key, struct rv_nat_owner6_key);
	__type(value, struct rv_nat_owner);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} nat_owner_map6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct rv_vip_filter);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} vip_filter_map SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct rv_fullnat_config);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fullnat_config_map SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, RV_FULLNAT_SRCS);
	__type(key, __u32);
	__type(value, struct rv_fullnat_src);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fullnat_src_map SEC(".maps");

/*
 * Full NAT's port allocations, one per live flow. A plain hash, not an
 * LRU: an entry evicted under pressure would free a port its flow still
 * sends from, and the next flow given it would share the flow's tuple.
 * Entries go when their flow has been idle past its timeout (reclaimed by
 * the next allocation that meets them, and swept by rivorad); a full map
 * drops new flows (RV_DROP_FULLNAT_TABLE_FULL). Sized with the flow
 * tables (the loader resizes these two with them).
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, RV_FLOW_TABLE_DEFAULT_SIZE);
	__type(key, struct rv_fullnat_key);
	__type(value, struct rv_fullnat_flow);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fullnat_rev_map SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, RV_FLOW_TABLE_DEFAULT_SIZE);
	__type(key, struct rv_fullnat6_key);
	__type(value, struct rv_fullnat_flow);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fullnat_rev_map6 SEC(".maps");

/* One cursor for every CPU, moved with an atomic add (bpf/lib/fullnat.h
 * says why not one per CPU). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct rv_fullnat_cursor);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fullnat_cursor_map SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, RV_SVC_ID_SLOTS);
	__type(key, __u32);
	__type(value, struct rv_fullnat_stats);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fullnat_stats_map SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, RV_MAX_FRAGS);
	__uint(map_flags, BPF_F_NO_COMMON_LRU);
	__type(key, struct rv_frag_key);
	__type(value, struct rv_fullnat_frag);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fullnat_frag_map SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, RV_MAX_FRAGS);
	__uint(map_flags, BPF_F_NO_COMMON_LRU);
	__type(key, struct rv_frag6_key);
	__type(value, struct rv_fullnat_frag);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fullnat_frag_map6 SEC(".maps");

static __always_inline void rv_count_drop(__u32 reason)
{
	struct rv_drop_stats *d = bpf_map_lookup_elem(&drop_stats_map, &reason);

	if (d)
		d->packets++;
}

#endif /* RV_MAPS_H */
