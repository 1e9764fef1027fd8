//! The objects load, every map is pinned by name, and the pins carry BTF:
//! `bpftool map dump pinned` prints field names, not hex.

mod common;

use std::process::Command;

use common::{TestDp, PROTO_TCP};
use rivora::abi::*;
use rivora::dataplane::Maps;

#[test]
fn programs_load_and_share_pinned_maps() {
    let t = TestDp::new();
    for name in Maps::NAMES {
        assert!(t.pin_dir.join(name).exists(), "{name} pinned");
    }
}

#[test]
fn bpftool_dumps_named_fields() {
    let t = TestDp::new();
    t.service(
        7,
        rv_mode::RV_MODE_NAT,
        rv_family::RV_FAMILY_V4,
        100,
        &[1, 2],
    );
    t.vip4("10.0.0.1".parse().unwrap(), 80, PROTO_TCP, 7);
    for (map, fields) in [
        (
            "service_config_map",
            &["\"mode\"", "\"slice_start\"", "\"slice_len\""][..],
        ),
        ("vip_map", &["\"addr\"", "\"port\"", "\"svc_id\""][..]),
    ] {
        let out = Command::new("bpftool")
            .args(["-j", "map", "dump", "pinned"])
            .arg(t.pin_dir.join(map))
            .output()
            .expect("bpftool runs (make test installs it)");
        assert!(
            out.status.success(),
            "bpftool: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        for f in fields {
            assert!(text.contains(f), "{map} dump lacks {f}: {text}");
        }
    }
}
