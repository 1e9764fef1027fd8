//! One NAT SYN through xdp_ingress and its reply through tc_nat, byte for
//! byte: the first thing to check when every other packet test fails.

use crate::common;

use common::*;
use etherparse::PacketBuilder;
use rivora::abi::*;

#[test]
fn nat_v4_tcp_syn_is_rewritten_and_reply_restored() {
    let t = TestDp::new();
    let vip = "10.0.0.100".parse().unwrap();
    let be = "10.1.0.1".parse().unwrap();
    t.vip4(vip, 80, PROTO_TCP, 1);
    t.backend4(1, be, 8080, [2, 0, 0, 0, 0, 1]);
    t.service(1, rv_mode::RV_MODE_NAT, rv_family::RV_FAMILY_V4, 0, &[1; 7]);

    let mut pkt = Vec::new();
    PacketBuilder::ethernet2([1; 6], [2; 6])
        .ipv4([10, 9, 0, 1], [10, 0, 0, 100], 64)
        .tcp(40000, 80, 1, 1000)
        .syn()
        .write(&mut pkt, b"hello")
        .unwrap();
    let (v, out) = t.run_xdp(&pkt);
    assert_eq!(v, XDP_PASS);
    let mut want = Vec::new();
    PacketBuilder::ethernet2([1; 6], [2; 6])
        .ipv4([10, 9, 0, 1], [10, 1, 0, 1], 64)
        .tcp(40000, 8080, 1, 1000)
        .syn()
        .write(&mut want, b"hello")
        .unwrap();
    assert_eq!(out, want);

    let mut reply = Vec::new();
    PacketBuilder::ethernet2([2; 6], [1; 6])
        .ipv4([10, 1, 0, 1], [10, 9, 0, 1], 64)
        .tcp(8080, 40000, 7, 1000)
        .syn()
        .ack(2)
        .write(&mut reply, b"")
        .unwrap();
    let (v, out) = t.run_tc(&reply);
    assert_eq!(v, TCX_PASS);
    let mut want = Vec::new();
    PacketBuilder::ethernet2([2; 6], [1; 6])
        .ipv4([10, 0, 0, 100], [10, 9, 0, 1], 64)
        .tcp(80, 40000, 7, 1000)
        .syn()
        .ack(2)
        .write(&mut want, b"")
        .unwrap();
    assert_eq!(out, want);
}
