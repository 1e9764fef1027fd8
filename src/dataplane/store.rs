//! The writer's view of the maps: the handful of operations it needs,
//! over decoded image types. [`Maps`] implements it on the pinned maps;
//! [`MemStore`] in memory, with the same capacities and optional injected
//! failures, so that the writer's ordering, rollback and adoption are
//! tested without root.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::abi::{self, *};
use crate::dataplane::maps::Maps;
use crate::dataplane::render::{
    self, BackendEntry, FullNatConfig, Health, MapImage, MatchKey, NatOwner, NatOwnerKey, NextHop,
    NodeImage, ServiceEntry,
};
use crate::dataplane::DataplaneError;
use crate::model::{Mac, RateLimit};
use crate::source_range::SourceRange;

/// Map operations in the writer's terms. Each call is one or a few map
/// updates; the writer orders calls so that the datapath never sees a
/// dangling reference.
pub trait MapStore {
    /// Slots in the Maglev table.
    fn table_size(&self) -> u32;
    fn put_backends(&mut self, entries: &[(u32, BackendEntry)]) -> Result<(), DataplaneError>;
    /// Clear backend entries (both families).
    fn clear_backends(&mut self, ids: &[u32]) -> Result<(), DataplaneError>;
    fn put_health(&mut self, entries: &[(u32, Health)]) -> Result<(), DataplaneError>;
    /// Write `ids` into consecutive slots from `start`.
    fn put_slots(&mut self, start: u32, ids: &[u32]) -> Result<(), DataplaneError>;
    /// One service_config_map update (the default entry clears it).
    fn put_service(&mut self, svc: u32, entry: &ServiceEntry) -> Result<(), DataplaneError>;
    fn put_svc_rate_limit(&mut self, svc: u32, rl: Option<RateLimit>)
        -> Result<(), DataplaneError>;
    fn put_match(&mut self, m: &MatchKey, svc: u32) -> Result<(), DataplaneError>;
    fn remove_match(&mut self, m: &MatchKey) -> Result<(), DataplaneError>;
    fn zero_stats(&mut self, svc: u32) -> Result<(), DataplaneError>;
    /// Forget flow state of these services: affinity, NAT reverse,
    /// fragment and rate-limit bucket entries.
    fn scrub_flows(&mut self, svcs: &BTreeSet<u32>) -> Result<(), DataplaneError>;
    fn put_node(&mut self, node: &NodeImage, previous: &NodeImage) -> Result<(), DataplaneError>;
    /// Write (Some) or delete (None) a nat_owner_map{,6} entry.
    fn put_nat_owner(
        &mut self,
        k: &NatOwnerKey,
        o: Option<&NatOwner>,
    ) -> Result<(), DataplaneError>;
    /// Write (Some: the backend id) or delete (None) a tunnel_ep_map entry.
    fn put_tunnel_ep(
        &mut self,
        svc: u32,
        addr: IpAddr,
        backend: Option<u32>,
    ) -> Result<(), DataplaneError>;
    /// Write (true) or delete (false) a source_range_map{,6} entry.
    fn put_source_range(
        &mut self,
        svc: u32,
        r: &SourceRange,
        on: bool,
    ) -> Result<(), DataplaneError>;
    /// Write vip_filter_map's one entry, active with these bits.
    fn put_vip_filter(&mut self, bits: &[u64; abi::VIP_FILTER_WORDS])
        -> Result<(), DataplaneError>;
    /// Everything the maps hold, decoded.
    fn read(&self) -> Result<MapImage, DataplaneError>;
    /// Wait until every program run that started before this call has
    /// finished, so that what it may have read can be cleared.
    fn synchronize(&mut self) -> Result<(), DataplaneError>;
    /// The same wait, without the store: for a thread of its own that
    /// waits while the writer goes on (the writer's `grace_ticket`).
    fn grace_period() -> Result<(), DataplaneError>
    where
        Self: Sized;
}

/// MEMBARRIER_CMD_GLOBAL: the kernel runs synchronize_rcu(), and BPF
/// programs run inside RCU read-side sections, so on return no program
/// run still holds a pointer read before the call. Through rustix: nix has
/// no membarrier wrapper.
fn synchronize_rcu() -> Result<(), DataplaneError> {
    rustix::thread::membarrier(rustix::thread::MembarrierCommand::Global)
        .map_err(|e| DataplaneError::GracePeriod(e.into()))
}

fn fullnat_src(addr: IpAddr) -> rv_fullnat_src {
    rv_fullnat_src {
        addr: match addr {
            IpAddr::V4(a) => [abi::be32(a), 0, 0, 0],
            IpAddr::V6(a) => abi::be32x4(a),
        },
    }
}

/// An address in four words as the maps keep both families: IPv4 when
/// only its first word is set (an IPv6 address with three zero words after
/// its first is no unicast address a node would hold), None when empty.
fn addr_from_words(w: [u32; 4]) -> Option<IpAddr> {
    match w {
        [0, 0, 0, 0] => None,
        [a, 0, 0, 0] => Some(IpAddr::V4(abi::ipv4_from_be32(a))),
        w => Some(IpAddr::V6(abi::ipv6_from_be32x4(w))),
    }
}

fn fullnat_src_addr(s: &rv_fullnat_src) -> Option<IpAddr> {
    addr_from_words(s.addr)
}

fn tunnel_ep_key(svc: u32, addr: IpAddr) -> rv_tunnel_ep_key {
    rv_tunnel_ep_key {
        svc_id: svc,
        addr: fullnat_src(addr).addr,
    }
}

/// The trie's key: the service id's 32 bits, then the range's.
fn source_range_key(svc: u32, r: &SourceRange) -> Result<rv_source_range_key, [u32; 4]> {
    match r.addr() {
        IpAddr::V4(a) => Ok(rv_source_range_key {
            prefixlen: 32 + u32::from(r.prefix_len()),
            svc_id: svc.to_be(),
            addr: abi::be32(a),
        }),
        IpAddr::V6(a) => Err(abi::be32x4(a)),
    }
}

fn source_range6_key(svc: u32, r: &SourceRange, addr: [u32; 4]) -> rv_source_range6_key {
    rv_source_range6_key {
        prefixlen: 32 + u32::from(r.prefix_len()),
        svc_id: svc.to_be(),
        addr,
    }
}

fn rl_config(rl: Option<RateLimit>) -> rv_rl_config {
    match rl {
        Some(r) => rv_rl_config {
            enabled: 1,
            rate_per_sec: r.rate_per_sec,
            burst: r.burst,
            pad: 0,
        },
        None => rv_rl_config::default(),
    }
}

fn rl_from(c: &rv_rl_config) -> Option<RateLimit> {
    (c.enabled != 0).then_some(RateLimit {
        rate_per_sec: c.rate_per_sec,
        burst: c.burst,
    })
}

fn range_key4(addr: Ipv4Addr, proto: u8, port: u16, bits: u8) -> rv_vip_range_key {
    rv_vip_range_key {
        prefixlen: MatchKey::prefixlen(IpAddr::V4(addr), bits),
        proto,
        addr: abi::be32(addr),
        port: abi::be16(port),
        ..Default::default()
    }
}

fn range_key6(addr: Ipv6Addr, proto: u8, port: u16, bits: u8) -> rv_vip_range6_key {
    rv_vip_range6_key {
        prefixlen: MatchKey::prefixlen(IpAddr::V6(addr), bits),
        proto,
        addr: abi::be32x4(addr),
        port: abi::be16(port),
        ..Default::default()
    }
}

/// The port bits of a range block from its LPM prefix length; None when
/// the prefix does not cover the whole address (not something rivora
/// writes).
fn port_bits(prefixlen: u32, fixed: u32) -> Option<u8> {
    (prefixlen >= fixed && prefixlen <= fixed + 16).then(|| (prefixlen - fixed) as u8)
}

impl MapStore for Maps {
    fn synchronize(&mut self) -> Result<(), DataplaneError> {
        synchronize_rcu()
    }

    fn grace_period() -> Result<(), DataplaneError> {
        synchronize_rcu()
    }

    fn table_size(&self) -> u32 {
        self.maglev_table.max_entries()
    }

    fn put_backends(&mut self, entries: &[(u32, BackendEntry)]) -> Result<(), DataplaneError> {
        let (mut k4, mut v4, mut k6, mut v6) = (vec![], vec![], vec![], vec![]);
        for (id, b) in entries {
            match b.addr {
                IpAddr::V4(a) => {
                    k4.push(*id);
                    v4.push(rv_backend {
                        addr: abi::be32(a),
                        port: abi::be16(b.port),
                        mac: b.mac,
                        nh: b.nexthop_abi(),
                    });
                }
                IpAddr::V6(a) => {
                    k6.push(*id);
                    v6.push(rv_backend6 {
                        addr: abi::be32x4(a),
                        port: abi::be16(b.port),
                        mac: b.mac,
                        nh: b.nexthop_abi(),
                    });
                }
            }
        }
        self.backend_map.put_batch(&k4, &v4)?;
        self.backend_map6.put_batch(&k6, &v6)
    }

    fn clear_backends(&mut self, ids: &[u32]) -> Result<(), DataplaneError> {
        self.backend_map
            .put_batch(ids, &vec![rv_backend::default(); ids.len()])?;
        self.backend_map6
            .put_batch(ids, &vec![rv_backend6::default(); ids.len()])
    }

    fn put_health(&mut self, entries: &[(u32, Health)]) -> Result<(), DataplaneError> {
        let keys: Vec<u32> = entries.iter().map(|e| e.0).collect();
        let vals: Vec<rv_backend_health> = entries
            .iter()
            .map(|e| rv_backend_health {
                state: e.1.raw(),
                pad: [0; 3],
            })
            .collect();
        self.backend_health_map.put_batch(&keys, &vals)
    }

    fn put_slots(&mut self, start: u32, ids: &[u32]) -> Result<(), DataplaneError> {
        let keys: Vec<u32> = (start..start + ids.len() as u32).collect();
        let vals: Vec<rv_maglev_slot> = ids
            .iter()
            .map(|id| rv_maglev_slot { backend_id: *id })
            .collect();
        self.maglev_table.put_batch(&keys, &vals)
    }

    fn put_service(&mut self, svc: u32, entry: &ServiceEntry) -> Result<(), DataplaneError> {
        self.service_config_map.put(&svc, &entry.to_abi())
    }

    fn put_svc_rate_limit(
        &mut self,
        svc: u32,
        rl: Option<RateLimit>,
    ) -> Result<(), DataplaneError> {
        self.svc_rl_config_map.put(&svc, &rl_config(rl))
    }

    fn put_match(&mut self, m: &MatchKey, svc: u32) -> Result<(), DataplaneError> {
        let v = rv_vip_value { svc_id: svc };
        match *m {
            MatchKey::Exact {
                addr: IpAddr::V4(a),
                port,
                proto,
            } => self.vip_map.put(
                &rv_vip_key {
                    addr: abi::be32(a),
                    port: abi::be16(port),
                    proto,
                    pad: 0,
                },
                &v,
            ),
            MatchKey::Exact {
                addr: IpAddr::V6(a),
                port,
                proto,
            } => self.vip_map6.put(
                &rv_vip6_key {
                    addr: abi::be32x4(a),
                    port: abi::be16(port),
                    proto,
                    pad: 0,
                },
                &v,
            ),
            MatchKey::Range {
                addr: IpAddr::V4(a),
                proto,
                port,
                port_bits,
            } => self
                .vip_range_map
                .put(&range_key4(a, proto, port, port_bits), &v),
            MatchKey::Range {
                addr: IpAddr::V6(a),
                proto,
                port,
                port_bits,
            } => self
                .vip_range_map6
                .put(&range_key6(a, proto, port, port_bits), &v),
        }
    }

    fn remove_match(&mut self, m: &MatchKey) -> Result<(), DataplaneError> {
        match *m {
            MatchKey::Exact {
                addr: IpAddr::V4(a),
                port,
                proto,
            } => self.vip_map.remove(&rv_vip_key {
                addr: abi::be32(a),
                port: abi::be16(port),
                proto,
                pad: 0,
            }),
            MatchKey::Exact {
                addr: IpAddr::V6(a),
                port,
                proto,
            } => self.vip_map6.remove(&rv_vip6_key {
                addr: abi::be32x4(a),
                port: abi::be16(port),
                proto,
                pad: 0,
            }),
            MatchKey::Range {
                addr: IpAddr::V4(a),
                proto,
                port,
                port_bits,
            } => self
                .vip_range_map
                .remove(&range_key4(a, proto, port, port_bits)),
            MatchKey::Range {
                addr: IpAddr::V6(a),
                proto,
                port,
                port_bits,
            } => self
                .vip_range_map6
                .remove(&range_key6(a, proto, port, port_bits)),
        }
    }

    fn zero_stats(&mut self, svc: u32) -> Result<(), DataplaneError> {
        let ncpus = libbpf_rs::num_possible_cpus().map_err(|source| DataplaneError::Map {
            map: "stats_map",
            op: "count possible cpus",
            source,
        })?;
        self.stats_map
            .zero_percpu::<u32, rv_vip_stats>(&svc, ncpus)?;
        self.source_refused_map
            .zero_percpu::<u32, rv_source_refused>(&svc, ncpus)
    }

    fn scrub_flows(&mut self, svcs: &BTreeSet<u32>) -> Result<(), DataplaneError> {
        if svcs.is_empty() {
            return Ok(());
        }
        let by_key = |svc: u32| svcs.contains(&svc);
        self.connection_affinity_map
            .remove_where::<rv_flow_key, rv_affinity_value>(|k, _| by_key(k.svc_id))?;
        self.connection_affinity_map6
            .remove_where::<rv_flow6_key, rv_affinity_value>(|k, _| by_key(k.svc_id))?;
        self.nat_reverse_map
            .remove_where::<rv_nat_key, rv_nat_value>(|_, v| by_key(v.svc_id))?;
        self.nat_reverse_map6
            .remove_where::<rv_nat6_key, rv_nat6_value>(|_, v| by_key(v.svc_id))?;
        self.frag_map
            .remove_where::<rv_frag_key, rv_frag_value>(|_, v| by_key(v.svc_id))?;
        self.frag_map6
            .remove_where::<rv_frag6_key, rv_frag_value>(|_, v| by_key(v.svc_id))?;
        self.frag_rev_map
            .remove_where::<rv_frag_key, rv_frag_rev_value>(|_, v| by_key(v.svc_id))?;
        self.frag_rev_map6
            .remove_where::<rv_frag6_key, rv_frag_rev6_value>(|_, v| by_key(v.svc_id))?;
        // Full NAT's ports go with their flows: a reused id must not find
        // them held, and they are free for other flows at once.
        self.fullnat_rev_map
            .remove_where::<rv_fullnat_key, rv_fullnat_flow>(|_, v| by_key(v.svc_id))?;
        self.fullnat_rev_map6
            .remove_where::<rv_fullnat6_key, rv_fullnat_flow>(|_, v| by_key(v.svc_id))?;
        // A reused service id must not inherit a SYN flood's empty buckets.
        self.rl_buckets_map
            .remove_where::<rv_rl_key, rv_rl_bucket>(|k, _| by_key(k.svc_id))?;
        self.rl_buckets_map6
            .remove_where::<rv_rl6_key, rv_rl_bucket>(|k, _| by_key(k.svc_id))?;
        Ok(())
    }

    fn put_node(&mut self, node: &NodeImage, previous: &NodeImage) -> Result<(), DataplaneError> {
        self.rl_config_map
            .put(&0u32, &rl_config(node.syn_rate_limit))?;
        self.tunnel_config_map.put(
            &0u32,
            &rv_tunnel_config {
                src4: node.tunnel_src4.map_or(0, abi::be32),
                src6: node.tunnel_src6.map_or([0; 4], abi::be32x4),
            },
        )?;
        for (ifindex, mac) in &node.interface_macs {
            let flags = if node.generic_xdp.contains(ifindex) {
                abi::rv_iface_flags::RV_IFACE_F_GENERIC_XDP.0 as u8
            } else {
                0
            };
            self.iface_mac_map.put(
                ifindex,
                &rv_iface_mac {
                    mac: mac.0,
                    flags,
                    pad: 0,
                },
            )?;
        }
        for ifindex in previous.interface_macs.keys() {
            if !node.interface_macs.contains_key(ifindex) {
                self.iface_mac_map.remove(ifindex)?;
            }
        }
        // Sources before the filter that lets replies to them through.
        for (idx, addr) in &node.fullnat_srcs {
            if previous.fullnat_srcs.get(idx) != Some(addr) {
                self.fullnat_src_map
                    .put(&u32::from(*idx), &fullnat_src(*addr))?;
            }
        }
        self.fullnat_config_map.put(&0u32, &node.fullnat.to_abi())?;
        for idx in previous.fullnat_srcs.keys() {
            if !node.fullnat_srcs.contains_key(idx) {
                self.fullnat_src_map
                    .put(&u32::from(*idx), &rv_fullnat_src::default())?;
            }
        }
        Ok(())
    }

    fn read(&self) -> Result<MapImage, DataplaneError> {
        let mut img = MapImage::default();
        for (k, v) in self.vip_map.entries::<rv_vip_key, rv_vip_value>()? {
            img.matches.insert(
                MatchKey::Exact {
                    addr: IpAddr::V4(abi::ipv4_from_be32(k.addr)),
                    port: abi::port_from_be16(k.port),
                    proto: k.proto,
                },
                v.svc_id,
            );
        }
        for (k, v) in self.vip_map6.entries::<rv_vip6_key, rv_vip_value>()? {
            img.matches.insert(
                MatchKey::Exact {
                    addr: IpAddr::V6(abi::ipv6_from_be32x4(k.addr)),
                    port: abi::port_from_be16(k.port),
                    proto: k.proto,
                },
                v.svc_id,
            );
        }
        for (k, v) in self
            .vip_range_map
            .entries_by_walk::<rv_vip_range_key, rv_vip_value>()?
        {
            if let Some(bits) = port_bits(k.prefixlen, 64) {
                img.matches.insert(
                    MatchKey::Range {
                        addr: IpAddr::V4(abi::ipv4_from_be32(k.addr)),
                        proto: k.proto,
                        port: abi::port_from_be16(k.port),
                        port_bits: bits,
                    },
                    v.svc_id,
                );
            }
        }
        for (k, v) in self
            .vip_range_map6
            .entries_by_walk::<rv_vip_range6_key, rv_vip_value>()?
        {
            if let Some(bits) = port_bits(k.prefixlen, 160) {
                img.matches.insert(
                    MatchKey::Range {
                        addr: IpAddr::V6(abi::ipv6_from_be32x4(k.addr)),
                        proto: k.proto,
                        port: abi::port_from_be16(k.port),
                        port_bits: bits,
                    },
                    v.svc_id,
                );
            }
        }
        for (id, s) in self.service_config_map.entries::<u32, rv_service>()? {
            let e = ServiceEntry::from_abi(&s);
            if e != ServiceEntry::default() {
                img.services.insert(id, e);
            }
        }
        for (slot, v) in self.maglev_table.entries::<u32, rv_maglev_slot>()? {
            if v.backend_id != 0 {
                img.slots.insert(slot, v.backend_id);
            }
        }
        for (id, b) in self.backend_map.entries::<u32, rv_backend>()? {
            if b.addr != 0 {
                img.backends.insert(
                    id,
                    BackendEntry {
                        addr: IpAddr::V4(abi::ipv4_from_be32(b.addr)),
                        port: abi::port_from_be16(b.port),
                        mac: b.mac,
                        nexthop: NextHop::from_abi(&b.nh),
                        mode: render::mode_from_raw(b.nh.mode),
                        fullnat_src: b.nh.fullnat_src,
                    },
                );
            }
        }
        for (id, b) in self.backend_map6.entries::<u32, rv_backend6>()? {
            if b.addr != [0; 4] {
                img.backends.insert(
                    id,
                    BackendEntry {
                        addr: IpAddr::V6(abi::ipv6_from_be32x4(b.addr)),
                        port: abi::port_from_be16(b.port),
                        mac: b.mac,
                        nexthop: NextHop::from_abi(&b.nh),
                        mode: render::mode_from_raw(b.nh.mode),
                        fullnat_src: b.nh.fullnat_src,
                    },
                );
            }
        }
        for (id, h) in self
            .backend_health_map
            .entries::<u32, rv_backend_health>()?
        {
            let h = Health::from_raw(h.state);
            if h != Health::Down || img.backends.contains_key(&id) {
                img.health.insert(id, h);
            }
        }
        for (id, c) in self.svc_rl_config_map.entries::<u32, rv_rl_config>()? {
            if let Some(rl) = rl_from(&c) {
                img.svc_rate_limits.insert(id, rl);
            }
        }
        if let Some(c) = self.rl_config_map.get::<u32, rv_rl_config>(&0)? {
            img.node.syn_rate_limit = rl_from(&c);
        }
        if let Some(t) = self.tunnel_config_map.get::<u32, rv_tunnel_config>(&0)? {
            img.node.tunnel_src4 = (t.src4 != 0).then(|| abi::ipv4_from_be32(t.src4));
            img.node.tunnel_src6 = (t.src6 != [0; 4]).then(|| abi::ipv6_from_be32x4(t.src6));
        }
        for (ifindex, m) in self.iface_mac_map.entries::<u32, rv_iface_mac>()? {
            img.node.interface_macs.insert(ifindex, Mac(m.mac));
            if m.flags & abi::rv_iface_flags::RV_IFACE_F_GENERIC_XDP.0 as u8 != 0 {
                img.node.generic_xdp.insert(ifindex);
            }
        }
        if let Some(c) = self.fullnat_config_map.get::<u32, rv_fullnat_config>(&0)? {
            img.node.fullnat = FullNatConfig::from_abi(&c);
        }
        for (idx, s) in self.fullnat_src_map.entries::<u32, rv_fullnat_src>()? {
            if let (Ok(idx), Some(addr)) = (u8::try_from(idx), fullnat_src_addr(&s)) {
                img.node.fullnat_srcs.insert(idx, addr);
            }
        }
        for (k, v) in self
            .nat_owner_map
            .entries::<rv_nat_owner_key, rv_nat_owner>()?
        {
            img.nat_owners.insert(
                NatOwnerKey {
                    addr: IpAddr::V4(abi::ipv4_from_be32(k.backend_addr)),
                    port: abi::port_from_be16(k.backend_port),
                    proto: k.proto,
                },
                nat_owner_from(&v, false),
            );
        }
        for (k, v) in self
            .nat_owner_map6
            .entries::<rv_nat_owner6_key, rv_nat_owner>()?
        {
            img.nat_owners.insert(
                NatOwnerKey {
                    addr: IpAddr::V6(abi::ipv6_from_be32x4(k.backend_addr)),
                    port: abi::port_from_be16(k.backend_port),
                    proto: k.proto,
                },
                nat_owner_from(&v, true),
            );
        }
        for (k, v) in self
            .tunnel_ep_map
            .entries::<rv_tunnel_ep_key, rv_tunnel_ep>()?
        {
            if let Some(addr) = addr_from_words(k.addr) {
                img.tunnel_eps.insert((k.svc_id, addr), v.backend_id);
            }
        }
        let v4 = self
            .source_range_map
            .entries_by_walk::<rv_source_range_key, rv_source_range>()?
            .into_iter()
            .map(|(k, _)| {
                (
                    k.prefixlen,
                    k.svc_id,
                    IpAddr::V4(abi::ipv4_from_be32(k.addr)),
                )
            });
        let v6 = self
            .source_range6_map
            .entries_by_walk::<rv_source_range6_key, rv_source_range>()?
            .into_iter()
            .map(|(k, _)| {
                (
                    k.prefixlen,
                    k.svc_id,
                    IpAddr::V6(abi::ipv6_from_be32x4(k.addr)),
                )
            });
        for (prefixlen, svc, addr) in v4.chain(v6) {
            // The key's first 32 bits are the service id's.
            let len = prefixlen.checked_sub(32).and_then(|l| u8::try_from(l).ok());
            if let Some(r) = len.and_then(|l| SourceRange::masked(addr, l)) {
                img.source_ranges.insert((u32::from_be(svc), r));
            }
        }
        if let Some(f) = self.vip_filter_map.get::<u32, rv_vip_filter>(&0)? {
            img.vip_filter = (f.active != 0).then_some(f.bits);
        }
        Ok(img)
    }

    fn put_nat_owner(
        &mut self,
        k: &NatOwnerKey,
        o: Option<&NatOwner>,
    ) -> Result<(), DataplaneError> {
        let port = abi::be16(k.port);
        match k.addr {
            IpAddr::V4(a) => {
                let key = rv_nat_owner_key {
                    backend_addr: abi::be32(a),
                    backend_port: port,
                    proto: k.proto,
                    pad: 0,
                };
                match o {
                    Some(o) => self.nat_owner_map.put(&key, &nat_owner_abi(o)),
                    None => self.nat_owner_map.remove(&key),
                }
            }
            IpAddr::V6(a) => {
                let key = rv_nat_owner6_key {
                    backend_addr: abi::be32x4(a),
                    backend_port: port,
                    proto: k.proto,
                    pad: 0,
                };
                match o {
                    Some(o) => self.nat_owner_map6.put(&key, &nat_owner_abi(o)),
                    None => self.nat_owner_map6.remove(&key),
                }
            }
        }
    }

    fn put_tunnel_ep(
        &mut self,
        svc: u32,
        addr: IpAddr,
        backend: Option<u32>,
    ) -> Result<(), DataplaneError> {
        let k = tunnel_ep_key(svc, addr);
        match backend {
            Some(id) => self.tunnel_ep_map.put(&k, &rv_tunnel_ep { backend_id: id }),
            None => self.tunnel_ep_map.remove(&k),
        }
    }

    fn put_source_range(
        &mut self,
        svc: u32,
        r: &SourceRange,
        on: bool,
    ) -> Result<(), DataplaneError> {
        let v = rv_source_range {
            len: u32::from(r.prefix_len()),
        };
        match source_range_key(svc, r) {
            Ok(k) if on => self.source_range_map.put(&k, &v),
            Ok(k) => self.source_range_map.remove(&k),
            Err(addr) if on => self
                .source_range6_map
                .put(&source_range6_key(svc, r, addr), &v),
            Err(addr) => self
                .source_range6_map
                .remove(&source_range6_key(svc, r, addr)),
        }
    }

    fn put_vip_filter(
        &mut self,
        bits: &[u64; abi::VIP_FILTER_WORDS],
    ) -> Result<(), DataplaneError> {
        self.vip_filter_map.put(
            &0u32,
            &rv_vip_filter {
                active: 1,
                pad: 0,
                bits: *bits,
            },
        )
    }
}

fn nat_owner_abi(o: &NatOwner) -> rv_nat_owner {
    rv_nat_owner {
        svc_id: o.svc_id,
        backend_id: o.backend_id,
        vip_addr: match o.vip {
            IpAddr::V4(a) => [abi::be32(a), 0, 0, 0],
            IpAddr::V6(a) => abi::be32x4(a),
        },
        vip_port: abi::be16(o.vip_port),
        pad: 0,
    }
}

fn nat_owner_from(v: &rv_nat_owner, v6: bool) -> NatOwner {
    NatOwner {
        svc_id: v.svc_id,
        backend_id: v.backend_id,
        vip: if v6 {
            IpAddr::V6(abi::ipv6_from_be32x4(v.vip_addr))
        } else {
            IpAddr::V4(abi::ipv4_from_be32(v.vip_addr[0]))
        },
        vip_port: abi::port_from_be16(v.vip_port),
    }
}

/// The maps in memory, with the kernel maps' capacities. Unallocated
/// array entries hold their cleared value, except backend health, which
/// starts "healthy" (zero) as a fresh kernel array does.
#[derive(Debug, Clone)]
pub struct MemStore {
    pub image: MapImage,
    table_size: u32,
    /// Health of every id 0..=RV_MAX_BACKENDS, as a kernel array holds it.
    health: Vec<Health>,
    /// Fail the n-th mutating call from now (0 = the next one), once.
    pub fail_at: Option<u64>,
    /// Mutating calls so far.
    pub ops: u64,
    /// Every service id written, in order: what a change re-rendered.
    pub service_writes: Vec<u32>,
}

impl MemStore {
    pub fn new(table_size: u32) -> Self {
        Self {
            image: MapImage::default(),
            table_size,
            health: vec![Health::Healthy; abi::BACKEND_ID_SLOTS as usize],
            fail_at: None,
            ops: 0,
            service_writes: Vec::new(),
        }
    }

    fn step(&mut self, map: &'static str) -> Result<(), DataplaneError> {
        self.ops += 1;
        match self.fail_at {
            Some(0) => {
                self.fail_at = None;
                Err(DataplaneError::Map {
                    map,
                    op: "update (injected failure)",
                    source: libbpf_rs::Error::from_raw_os_error(nix::errno::Errno::EIO as i32),
                })
            }
            Some(n) => {
                self.fail_at = Some(n - 1);
                Ok(())
            }
            None => Ok(()),
        }
    }

    fn bounds(map: &'static str, key: u32, max: u32) -> Result<(), DataplaneError> {
        if key >= max {
            return Err(DataplaneError::Map {
                map,
                op: "update",
                source: libbpf_rs::Error::from_raw_os_error(nix::errno::Errno::E2BIG as i32),
            });
        }
        Ok(())
    }
}

impl MapStore for MemStore {
    fn synchronize(&mut self) -> Result<(), DataplaneError> {
        Ok(())
    }

    fn grace_period() -> Result<(), DataplaneError> {
        Ok(())
    }

    fn table_size(&self) -> u32 {
        self.table_size
    }

    fn put_backends(&mut self, entries: &[(u32, BackendEntry)]) -> Result<(), DataplaneError> {
        self.step("backend_map")?;
        for (id, b) in entries {
            Self::bounds("backend_map", *id, abi::BACKEND_ID_SLOTS)?;
            self.image.backends.insert(*id, *b);
        }
        Ok(())
    }

    fn clear_backends(&mut self, ids: &[u32]) -> Result<(), DataplaneError> {
        self.step("backend_map")?;
        for id in ids {
            self.image.backends.remove(id);
        }
        Ok(())
    }

    fn put_health(&mut self, entries: &[(u32, Health)]) -> Result<(), DataplaneError> {
        self.step("backend_health_map")?;
        for (id, h) in entries {
            Self::bounds("backend_health_map", *id, abi::BACKEND_ID_SLOTS)?;
            self.health[*id as usize] = *h;
        }
        Ok(())
    }

    fn put_slots(&mut self, start: u32, ids: &[u32]) -> Result<(), DataplaneError> {
        self.step("maglev_table")?;
        Self::bounds(
            "maglev_table",
            start + ids.len().saturating_sub(1) as u32,
            self.table_size,
        )?;
        for (i, id) in ids.iter().enumerate() {
            let slot = start + i as u32;
            if *id == 0 {
                self.image.slots.remove(&slot);
            } else {
                self.image.slots.insert(slot, *id);
            }
        }
        Ok(())
    }

    fn put_service(&mut self, svc: u32, entry: &ServiceEntry) -> Result<(), DataplaneError> {
        self.step("service_config_map")?;
        Self::bounds("service_config_map", svc, abi::SVC_ID_SLOTS)?;
        self.service_writes.push(svc);
        if *entry == ServiceEntry::default() {
            self.image.services.remove(&svc);
        } else {
            self.image.services.insert(svc, *entry);
        }
        Ok(())
    }

    fn put_svc_rate_limit(
        &mut self,
        svc: u32,
        rl: Option<RateLimit>,
    ) -> Result<(), DataplaneError> {
        self.step("svc_rl_config_map")?;
        Self::bounds("svc_rl_config_map", svc, abi::SVC_ID_SLOTS)?;
        match rl {
            Some(r) => self.image.svc_rate_limits.insert(svc, r),
            None => self.image.svc_rate_limits.remove(&svc),
        };
        Ok(())
    }

    fn put_match(&mut self, m: &MatchKey, svc: u32) -> Result<(), DataplaneError> {
        let (map, cap) = match m {
            MatchKey::Exact { addr, .. } => (
                if addr.is_ipv4() {
                    "vip_map"
                } else {
                    "vip_map6"
                },
                abi::MAX_VIPS as usize,
            ),
            MatchKey::Range { addr, .. } => (
                if addr.is_ipv4() {
                    "vip_range_map"
                } else {
                    "vip_range_map6"
                },
                4 * abi::MAX_VIPS as usize,
            ),
        };
        self.step(map)?;
        let same_kind = |k: &MatchKey| {
            std::mem::discriminant(k) == std::mem::discriminant(m)
                && k.addr().is_ipv4() == m.addr().is_ipv4()
        };
        if !self.image.matches.contains_key(m)
            && self.image.matches.keys().filter(|k| same_kind(k)).count() >= cap
        {
            return Err(DataplaneError::Map {
                map,
                op: "update",
                source: libbpf_rs::Error::from_raw_os_error(nix::errno::Errno::ENOSPC as i32),
            });
        }
        self.image.matches.insert(*m, svc);
        Ok(())
    }

    fn remove_match(&mut self, m: &MatchKey) -> Result<(), DataplaneError> {
        self.step("vip_map")?;
        self.image.matches.remove(m);
        Ok(())
    }

    fn zero_stats(&mut self, _svc: u32) -> Result<(), DataplaneError> {
        self.step("stats_map")
    }

    fn scrub_flows(&mut self, _svcs: &BTreeSet<u32>) -> Result<(), DataplaneError> {
        self.step("connection_affinity_map")
    }

    fn put_node(&mut self, node: &NodeImage, _previous: &NodeImage) -> Result<(), DataplaneError> {
        self.step("rl_config_map")?;
        self.image.node = node.clone();
        Ok(())
    }

    fn put_nat_owner(
        &mut self,
        k: &NatOwnerKey,
        o: Option<&NatOwner>,
    ) -> Result<(), DataplaneError> {
        self.step("nat_owner_map")?;
        match o {
            Some(o) => {
                if !self.image.nat_owners.contains_key(k)
                    && self.image.nat_owners.len() >= abi::MAX_NAT_OWNERS as usize
                {
                    return Err(DataplaneError::Map {
                        map: "nat_owner_map",
                        op: "update",
                        source: libbpf_rs::Error::from_raw_os_error(
                            nix::errno::Errno::E2BIG as i32,
                        ),
                    });
                }
                self.image.nat_owners.insert(*k, *o);
            }
            None => {
                self.image.nat_owners.remove(k);
            }
        }
        Ok(())
    }

    fn put_source_range(
        &mut self,
        svc: u32,
        r: &SourceRange,
        on: bool,
    ) -> Result<(), DataplaneError> {
        let map = if r.is_ipv4() {
            "source_range_map"
        } else {
            "source_range6_map"
        };
        self.step(map)?;
        if !on {
            self.image.source_ranges.remove(&(svc, *r));
            return Ok(());
        }
        let same_family = self
            .image
            .source_ranges
            .iter()
            .filter(|(_, x)| x.is_ipv4() == r.is_ipv4())
            .count();
        if !self.image.source_ranges.contains(&(svc, *r))
            && same_family >= abi::MAX_SOURCE_RANGES as usize
        {
            return Err(DataplaneError::Map {
                map,
                op: "update",
                source: libbpf_rs::Error::from_raw_os_error(nix::errno::Errno::ENOSPC as i32),
            });
        }
        self.image.source_ranges.insert((svc, *r));
        Ok(())
    }

    fn put_tunnel_ep(
        &mut self,
        svc: u32,
        addr: IpAddr,
        backend: Option<u32>,
    ) -> Result<(), DataplaneError> {
        self.step("tunnel_ep_map")?;
        match backend {
            Some(id) => {
                if !self.image.tunnel_eps.contains_key(&(svc, addr))
                    && self.image.tunnel_eps.len() >= abi::MAX_BACKENDS as usize
                {
                    return Err(DataplaneError::Map {
                        map: "tunnel_ep_map",
                        op: "update",
                        source: libbpf_rs::Error::from_raw_os_error(
                            nix::errno::Errno::E2BIG as i32,
                        ),
                    });
                }
                self.image.tunnel_eps.insert((svc, addr), id);
            }
            None => {
                self.image.tunnel_eps.remove(&(svc, addr));
            }
        }
        Ok(())
    }

    fn put_vip_filter(
        &mut self,
        bits: &[u64; abi::VIP_FILTER_WORDS],
    ) -> Result<(), DataplaneError> {
        self.step("vip_filter_map")?;
        self.image.vip_filter = Some(*bits);
        Ok(())
    }

    fn read(&self) -> Result<MapImage, DataplaneError> {
        let mut img = self.image.clone();
        img.health = self
            .health
            .iter()
            .enumerate()
            .filter(|(id, h)| **h != Health::Down || img.backends.contains_key(&(*id as u32)))
            .map(|(id, h)| (id as u32, *h))
            .collect();
        Ok(img)
    }
}
