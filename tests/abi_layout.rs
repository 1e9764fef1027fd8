//! Pinned maps outlive upgrades: a change to any ABI struct's size or field
//! offsets must be seen and handled on purpose (bump RV_ABI_VERSION, plan a
//! migration). This snapshots every shared type against
//! tests/golden/abi_layout.txt and checks none has implicit padding (the
//! Pod byte views in the dataplane rely on that).
//!
//! After an intended change: `RIVORA_BLESS=1 cargo test --test abi_layout`.

use std::fmt::Write as _;
use std::mem::{offset_of, size_of, size_of_val};

use rivora::abi::*;

macro_rules! layout {
    ($out:expr, $t:ident { $($f:ident),* $(,)? }) => {{
        let v = $t::default();
        let mut fields = 0usize;
        write!($out, "{} size={}", stringify!($t), size_of::<$t>()).unwrap();
        $(
            write!($out, " {}@{}:{}", stringify!($f), offset_of!($t, $f), size_of_val(&v.$f)).unwrap();
            fields += size_of_val(&v.$f);
        )*
        writeln!($out).unwrap();
        assert_eq!(fields, size_of::<$t>(), "{} has implicit padding", stringify!($t));
    }};
}

fn snapshot() -> String {
    let mut s = String::new();
    writeln!(s, "abi_version={ABI_VERSION}").unwrap();
    layout!(
        s,
        rv_vip_key {
            addr,
            port,
            proto,
            pad
        }
    );
    layout!(
        s,
        rv_vip6_key {
            addr,
            port,
            proto,
            pad
        }
    );
    layout!(s, rv_vip_value { svc_id });
    layout!(
        s,
        rv_vip_range_key {
            prefixlen,
            proto,
            pad,
            addr,
            port,
            pad2
        }
    );
    layout!(
        s,
        rv_vip_range6_key {
            prefixlen,
            proto,
            pad,
            addr,
            port,
            pad2
        }
    );
    layout!(
        s,
        rv_service {
            mode,
            affinity,
            family,
            proto,
            flags,
            slice_start,
            slice_len,
            backend_count,
            affinity_timeout_s
        }
    );
    layout!(s, rv_maglev_slot { backend_id });
    layout!(s, rv_backend { addr, port, mac });
    layout!(s, rv_backend6 { addr, port, mac });
    layout!(s, rv_backend_health { state, pad });
    layout!(
        s,
        rv_flow_key {
            svc_id,
            saddr,
            sport,
            dport,
            proto,
            pad
        }
    );
    layout!(
        s,
        rv_flow6_key {
            svc_id,
            saddr,
            sport,
            dport,
            proto,
            pad
        }
    );
    layout!(
        s,
        rv_affinity_value {
            backend_id,
            pad,
            last_seen_ns
        }
    );
    layout!(
        s,
        rv_nat_key {
            backend_addr,
            client_addr,
            backend_port,
            client_port,
            proto,
            pad
        }
    );
    layout!(
        s,
        rv_nat6_key {
            backend_addr,
            client_addr,
            backend_port,
            client_port,
            proto,
            pad
        }
    );
    layout!(
        s,
        rv_nat_value {
            vip_addr,
            vip_port,
            pad,
            svc_id
        }
    );
    layout!(
        s,
        rv_nat6_value {
            vip_addr,
            vip_port,
            pad,
            svc_id
        }
    );
    layout!(
        s,
        rv_frag_key {
            saddr,
            daddr,
            id,
            proto,
            pad
        }
    );
    layout!(
        s,
        rv_frag6_key {
            saddr,
            daddr,
            id,
            proto,
            pad
        }
    );
    layout!(s, rv_frag_value { svc_id, backend_id });
    layout!(s, rv_frag_rev_value { vip_addr, svc_id });
    layout!(s, rv_frag_rev6_value { vip_addr, svc_id });
    layout!(
        s,
        rv_vip_stats {
            packets,
            bytes,
            rate_limited,
            no_backend
        }
    );
    layout!(s, rv_drop_stats { packets });
    layout!(
        s,
        rv_rl_config {
            enabled,
            rate_per_sec,
            burst,
            pad
        }
    );
    layout!(s, rv_rl_key { svc_id, saddr });
    layout!(s, rv_rl6_key { svc_id, saddr });
    layout!(
        s,
        rv_rl_bucket {
            tokens_milli,
            last_ns
        }
    );
    layout!(s, rv_iface_mac { mac, pad });
    layout!(s, rv_tunnel_config { src4, src6 });
    layout!(
        s,
        rv_meta {
            abi_version,
            maglev_size
        }
    );
    s
}

#[test]
fn abi_layout_matches_snapshot() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/abi_layout.txt");
    let now = snapshot();
    if std::env::var_os("RIVORA_BLESS").is_some() {
        std::fs::write(path, &now).expect("writing the snapshot");
        return;
    }
    let golden = std::fs::read_to_string(path).expect("tests/golden/abi_layout.txt exists");
    assert_eq!(
        now, golden,
        "the kernel ABI changed: bump RV_ABI_VERSION, plan the pinned-map migration, then re-bless"
    );
}

/// rivora-model cannot link the skeleton, so it mirrors the capacities
/// its validator checks; a mirror that drifted from `rv_limits` would
/// accept files the maps cannot hold (or refuse ones they can).
#[test]
fn the_models_capacities_are_the_abis() {
    use rivora::model;
    assert_eq!(model::MAX_VIPS, MAX_VIPS as usize, "RV_MAX_VIPS");
    assert_eq!(
        model::MAX_BACKENDS,
        MAX_BACKENDS as usize,
        "RV_MAX_BACKENDS"
    );
    assert_eq!(
        model::MAGLEV_DEFAULT_SIZE,
        MAGLEV_DEFAULT_SIZE,
        "RV_MAGLEV_DEFAULT_SIZE"
    );
    assert_eq!(
        model::MAX_IFACES,
        rv_limits::RV_MAX_IFACES.0 as usize,
        "RV_MAX_IFACES"
    );
}
