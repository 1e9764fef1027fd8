//! The kernel ABI as Rust sees it: the skeleton's BTF-generated types
//! (their one definition is `include/rivora/abi.h`), plus constructors,
//! byte-order helpers and metric labels around them.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

pub use crate::bpf::xdp_ingress::types::{
    rv_affinity, rv_affinity_value, rv_backend, rv_backend6, rv_backend_health, rv_drop_reason,
    rv_drop_stats, rv_family, rv_flow6_key, rv_flow_key, rv_frag6_key, rv_frag_key,
    rv_frag_rev6_value, rv_frag_rev_value, rv_frag_value, rv_fullnat6_key, rv_fullnat_config,
    rv_fullnat_cursor, rv_fullnat_flags, rv_fullnat_flow, rv_fullnat_frag, rv_fullnat_key,
    rv_fullnat_src, rv_fullnat_stats, rv_health, rv_iface_flags, rv_iface_mac, rv_limits,
    rv_maglev_slot, rv_meta, rv_mode, rv_nat6_key, rv_nat6_value, rv_nat_key, rv_nat_owner,
    rv_nat_owner6_key, rv_nat_owner_key, rv_nat_value, rv_nexthop, rv_nexthop_flags, rv_nh_miss,
    rv_rl6_key, rv_rl_bucket, rv_rl_config, rv_rl_key, rv_service, rv_service_flags,
    rv_source_range, rv_source_range6_key, rv_source_range_key, rv_source_refused,
    rv_tunnel_config, rv_tunnel_ep, rv_tunnel_ep_key, rv_vip6_key, rv_vip_filter, rv_vip_key,
    rv_vip_range6_key, rv_vip_range_key, rv_vip_stats, rv_vip_value,
};

/// Layout version of the pinned maps (`RV_ABI_VERSION`).
pub const ABI_VERSION: u32 = crate::bpf::xdp_ingress::types::rv_abi::RV_ABI_VERSION.0;
pub const MAX_VIPS: u32 = rv_limits::RV_MAX_VIPS.0;
pub const MAX_BACKENDS: u32 = rv_limits::RV_MAX_BACKENDS.0;
/// Entries of the arrays indexed by service id (ids start at 1).
pub const SVC_ID_SLOTS: u32 = rv_limits::RV_SVC_ID_SLOTS.0;
/// Entries of the arrays indexed by backend id (ids start at 1).
pub const BACKEND_ID_SLOTS: u32 = rv_limits::RV_BACKEND_ID_SLOTS.0;
pub const MAGLEV_DEFAULT_SIZE: u32 = rv_limits::RV_MAGLEV_DEFAULT_SIZE.0;
pub const MAGLEV_PROBES: u32 = rv_limits::RV_MAGLEV_PROBES.0;
/// Entries in each per-flow table (`connection_affinity_map{,6}`,
/// `nat_reverse_map{,6}`) unless the loader is told otherwise.
pub const FLOW_TABLE_DEFAULT_SIZE: u32 = rv_limits::RV_FLOW_TABLE_DEFAULT_SIZE.0;

pub const MAX_NAT_OWNERS: u32 = rv_limits::RV_MAX_NAT_OWNERS.0;
pub const VIP_FILTER_BITS: u32 = rv_limits::RV_VIP_FILTER_BITS.0;
pub const VIP_FILTER_WORDS: usize = rv_limits::RV_VIP_FILTER_WORDS.0 as usize;
/// Entries of fullnat_src_map (index 0 means none).
pub const FULLNAT_SRCS: u32 = rv_limits::RV_FULLNAT_SRCS.0;
/// Entries of each `source_range_map{,6}`, every VIP's together.
pub const MAX_SOURCE_RANGES: u32 = rv_limits::RV_MAX_SOURCE_RANGES.0;
/// Where `rv_service.flags` keeps the generation of its source ranges.
pub const RANGES_GEN_SHIFT: u32 = rv_limits::RV_SVC_RANGES_GEN_SHIFT.0;

/// The bit of `vip_filter_map` an address sets: `rv_vip_filter_bit` in
/// `bpf/lib/lb.h`, on the address words as the kernel holds them.
pub fn vip_filter_bit(addr: IpAddr) -> u32 {
    let x = match addr {
        IpAddr::V4(a) => be32(a),
        IpAddr::V6(a) => {
            let w = be32x4(a);
            w[0] ^ w[1] ^ w[2] ^ w[3]
        }
    };
    x.wrapping_mul(0x9E37_79B1) >> (32 - VIP_FILTER_BITS.trailing_zeros())
}

/// The bit of `rv_fullnat_config.src_filter` an address sets:
/// `rv_fullnat_src_bit` in `bpf/lib/fullnat.h` (the VIP filter's hash,
/// its top six bits).
pub fn fullnat_src_bit(addr: IpAddr) -> u32 {
    let x = match addr {
        IpAddr::V4(a) => be32(a),
        IpAddr::V6(a) => {
            let w = be32x4(a);
            w[0] ^ w[1] ^ w[2] ^ w[3]
        }
    };
    x.wrapping_mul(0x9E37_79B1) >> (32 - 6)
}

/// Network-order 32-bit word from an IPv4 address, as the kernel stores
/// `__be32`: the in-memory bytes are the address octets.
pub fn be32(addr: Ipv4Addr) -> u32 {
    u32::from_ne_bytes(addr.octets())
}

pub fn ipv4_from_be32(v: u32) -> Ipv4Addr {
    Ipv4Addr::from(v.to_ne_bytes())
}

/// `__be32[4]` from an IPv6 address.
pub fn be32x4(addr: Ipv6Addr) -> [u32; 4] {
    let o = addr.octets();
    std::array::from_fn(|i| {
        u32::from_ne_bytes([o[4 * i], o[4 * i + 1], o[4 * i + 2], o[4 * i + 3]])
    })
}

pub fn ipv6_from_be32x4(v: [u32; 4]) -> Ipv6Addr {
    let mut o = [0u8; 16];
    for (i, w) in v.iter().enumerate() {
        o[4 * i..4 * i + 4].copy_from_slice(&w.to_ne_bytes());
    }
    Ipv6Addr::from(o)
}

/// `__be16` from a host-order port.
pub fn be16(port: u16) -> u16 {
    port.to_be()
}

pub fn port_from_be16(v: u16) -> u16 {
    u16::from_be(v)
}

pub fn ip_family(addr: IpAddr) -> u8 {
    match addr {
        IpAddr::V4(_) => rv_family::RV_FAMILY_V4.0 as u8,
        IpAddr::V6(_) => rv_family::RV_FAMILY_V6.0 as u8,
    }
}

/// Every drop reason the datapath counts, in `drop_stats_map` order.
pub const DROP_REASONS: &[rv_drop_reason] = &[
    rv_drop_reason::RV_DROP_NONE,
    rv_drop_reason::RV_DROP_MALFORMED_L2,
    rv_drop_reason::RV_DROP_MALFORMED_IPV4,
    rv_drop_reason::RV_DROP_MALFORMED_IPV6,
    rv_drop_reason::RV_DROP_MALFORMED_L4,
    rv_drop_reason::RV_DROP_RATE_LIMITED,
    rv_drop_reason::RV_DROP_NO_HEALTHY_BACKEND,
    rv_drop_reason::RV_DROP_NO_SERVICE,
    rv_drop_reason::RV_DROP_NO_BACKEND,
    rv_drop_reason::RV_DROP_FRAG_NO_FIRST,
    rv_drop_reason::RV_DROP_FIB_UNREACHABLE,
    rv_drop_reason::RV_DROP_HEADROOM,
    rv_drop_reason::RV_DROP_NO_IFACE_MAC,
    rv_drop_reason::RV_DROP_NO_TUNNEL_SRC,
    rv_drop_reason::RV_DROP_FULLNAT_PORTS_EXHAUSTED,
    rv_drop_reason::RV_DROP_FULLNAT_TABLE_FULL,
    rv_drop_reason::RV_DROP_NO_FULLNAT_SRC,
    rv_drop_reason::RV_DROP_SOURCE_RANGE,
];

/// The metric label of a drop reason. Exhaustive over the C enum: a
/// reason added in `abi.h` without a label here fails `drop_labels_cover_enum`.
pub fn drop_reason_label(r: rv_drop_reason) -> Option<&'static str> {
    Some(match r {
        rv_drop_reason::RV_DROP_NONE => "none",
        rv_drop_reason::RV_DROP_MALFORMED_L2 => "malformed_l2",
        rv_drop_reason::RV_DROP_MALFORMED_IPV4 => "malformed_ipv4",
        rv_drop_reason::RV_DROP_MALFORMED_IPV6 => "malformed_ipv6",
        rv_drop_reason::RV_DROP_MALFORMED_L4 => "malformed_l4",
        rv_drop_reason::RV_DROP_RATE_LIMITED => "rate_limited",
        rv_drop_reason::RV_DROP_NO_HEALTHY_BACKEND => "no_healthy_backend",
        rv_drop_reason::RV_DROP_NO_SERVICE => "no_service",
        rv_drop_reason::RV_DROP_NO_BACKEND => "no_backend",
        rv_drop_reason::RV_DROP_FRAG_NO_FIRST => "frag_no_first",
        rv_drop_reason::RV_DROP_FIB_UNREACHABLE => "fib_unreachable",
        rv_drop_reason::RV_DROP_HEADROOM => "headroom",
        rv_drop_reason::RV_DROP_NO_IFACE_MAC => "no_iface_mac",
        rv_drop_reason::RV_DROP_NO_TUNNEL_SRC => "no_tunnel_src",
        rv_drop_reason::RV_DROP_FULLNAT_PORTS_EXHAUSTED => "fullnat_ports_exhausted",
        rv_drop_reason::RV_DROP_FULLNAT_TABLE_FULL => "fullnat_table_full",
        rv_drop_reason::RV_DROP_NO_FULLNAT_SRC => "no_fullnat_src",
        rv_drop_reason::RV_DROP_SOURCE_RANGE => "source_range",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drop_labels_cover_enum() {
        let max = rv_drop_reason::RV_DROP_MAX.0;
        assert_eq!(
            DROP_REASONS.len() as u32,
            max,
            "DROP_REASONS lists every reason"
        );
        for (i, r) in DROP_REASONS.iter().enumerate() {
            assert_eq!(r.0, i as u32);
            assert!(
                drop_reason_label(*r).is_some(),
                "reason {} has no label",
                r.0
            );
        }
        assert!(drop_reason_label(rv_drop_reason(max)).is_none());
    }

    #[test]
    fn vip_filter_bits_spread_and_fit() {
        assert_eq!(VIP_FILTER_BITS, 1 << 12, "lb.h shifts by 32 - 12");
        let mut seen = std::collections::BTreeSet::new();
        for i in 0..256u32 {
            let b = vip_filter_bit(IpAddr::V4(Ipv4Addr::from(0x0a00_6400 + i)));
            assert!(b < VIP_FILTER_BITS);
            seen.insert(b);
        }
        // Consecutive VIP addresses land on (nearly) distinct bits.
        assert!(seen.len() > 240, "{} distinct bits of 256", seen.len());
        let v6: Ipv6Addr = "fd00::100".parse().unwrap();
        assert!(vip_filter_bit(IpAddr::V6(v6)) < VIP_FILTER_BITS);
    }

    #[test]
    fn address_round_trips() {
        let a: Ipv4Addr = "10.1.2.3".parse().unwrap();
        assert_eq!(be32(a).to_ne_bytes(), [10, 1, 2, 3]);
        assert_eq!(ipv4_from_be32(be32(a)), a);
        let b: Ipv6Addr = "fd00::1:2".parse().unwrap();
        assert_eq!(ipv6_from_be32x4(be32x4(b)), b);
        assert_eq!(be16(80).to_ne_bytes(), [0, 80]);
    }
}
