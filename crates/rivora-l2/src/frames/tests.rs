//! Against frames captured on this kind of machine (see
//! `testdata/capture.sh`): the parser reads what arping, ndisc6 and the
//! kernel send, and each builder writes, byte for byte, what the kernel
//! (or arping, for the reply form of gratuitous ARP) wrote for the same
//! question.

use std::net::{Ipv4Addr, Ipv6Addr};

use super::*;
use crate::pcap;

const A_OLD: Mac = [2, 0, 0, 0, 0, 0x01];
const A: Mac = [2, 0, 0, 0, 0, 0x0a];
const B: Mac = [2, 0, 0, 0, 0, 0x0b];
const A4: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 1);
const B4: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 2);
const A6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x250, 0, 0, 0, 0, 0, 1);

fn frame(pcap_bytes: &[u8]) -> Vec<u8> {
    let mut frames = pcap::read(pcap_bytes).expect("a capture");
    assert_eq!(frames.len(), 1, "one frame per capture file");
    frames.remove(0).frame
}

fn hex(b: &[u8]) -> String {
    b.chunks(16)
        .map(|c| {
            c.iter()
                .map(|x| format!("{x:02x}"))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn same(what: &str, built: &[u8], captured: &[u8]) {
    assert!(
        built == captured,
        "{what}: built\n{}\ncaptured\n{}",
        hex(built),
        hex(captured)
    );
}

#[test]
fn an_arping_request_is_a_question() {
    let f = frame(include_bytes!("../../testdata/arping-request.pcap"));
    assert_eq!(
        parse(&f),
        Some(Query::Arp {
            sender_mac: B,
            sender_ip: B4,
            target: A4,
        })
    );
}

#[test]
fn an_arp_probe_is_a_question_from_nobody() {
    let f = frame(include_bytes!("../../testdata/arping-probe.pcap"));
    let q = parse(&f).expect("a probe is answered: the address is in use");
    assert_eq!(
        q,
        Query::Arp {
            sender_mac: B,
            sender_ip: Ipv4Addr::UNSPECIFIED,
            target: A4,
        }
    );
}

#[test]
fn the_arp_reply_is_the_kernels() {
    let kernel = frame(include_bytes!("../../testdata/kernel-arp-reply.pcap"));
    // The kernel of `a` answered with the MAC it had then.
    same("ARP reply", &arp_reply(A_OLD, A4, B, B4), &kernel);
    let q = parse(&frame(include_bytes!("../../testdata/arping-request.pcap"))).unwrap();
    same("answer to arping", &answer(A_OLD, &q).unwrap(), &kernel);
    // Replies and announcements are not questions.
    assert_eq!(parse(&kernel), None);
}

#[test]
fn gratuitous_arp_in_both_forms() {
    let kernel = frame(include_bytes!("../../testdata/kernel-garp.pcap"));
    same("request form", &garp_request(A, A4), &kernel);
    let arping = frame(include_bytes!("../../testdata/arping-garp-reply.pcap"));
    same("reply form", &garp_reply(A, A4), &arping);
    // Another node's announcement is never answered (two owners would
    // answer each other's).
    assert_eq!(parse(&kernel), None);
    assert_eq!(parse(&arping), None);
    assert_eq!(announcements(A, A4.into()), vec![kernel, arping]);
}

#[test]
fn an_ndisc6_solicitation_is_a_question() {
    let f = frame(include_bytes!("../../testdata/ndisc6-ns.pcap"));
    assert_eq!(
        parse(&f),
        Some(Query::Ns {
            src_mac: B,
            src_ip: "fe80::ff:fe00:b".parse().unwrap(),
            target: A6,
            lladdr: Some(B),
        })
    );
}

#[test]
fn the_solicited_advertisement_is_the_kernels() {
    let ns = frame(include_bytes!("../../testdata/ndisc6-ns.pcap"));
    let kernel = frame(include_bytes!("../../testdata/kernel-na.pcap"));
    let q = parse(&ns).unwrap();
    same("solicited NA", &answer(A, &q).unwrap(), &kernel);
    assert_eq!(parse(&kernel), None);
}

#[test]
fn the_unsolicited_advertisement_is_the_kernels() {
    let kernel = frame(include_bytes!("../../testdata/kernel-unsol-na.pcap"));
    same("unsolicited NA", &na_unsolicited(A, A6), &kernel);
    assert_eq!(announcements(A, A6.into()), vec![kernel]);
}

#[test]
fn a_duplicate_address_check_is_answered_to_all_nodes() {
    let dad = frame(include_bytes!("../../testdata/kernel-dad-ns.pcap"));
    let target: Ipv6Addr = "fd00:250::99".parse().unwrap();
    let q = parse(&dad).expect("a DAD solicitation (with its nonce option) is a question");
    assert_eq!(
        q,
        Query::Ns {
            src_mac: B,
            src_ip: Ipv6Addr::UNSPECIFIED,
            target,
            lladdr: None,
        }
    );
    // Defended as the kernel defends its own: an unsolicited
    // advertisement to all-nodes.
    assert_eq!(answer(A, &q).unwrap(), na_unsolicited(A, target));
}

#[test]
fn malformed_and_foreign_frames_are_not_questions() {
    let ns = frame(include_bytes!("../../testdata/ndisc6-ns.pcap"));
    let arp = frame(include_bytes!("../../testdata/arping-request.pcap"));
    // Every truncation.
    for n in 0..ns.len() {
        assert_eq!(parse(&ns[..n]), None, "NS cut at {n}");
    }
    for n in 0..arp.len() {
        assert_eq!(parse(&arp[..n]), None, "ARP cut at {n}");
    }
    // A solicitation that crossed a router (hop limit below 255).
    let mut routed = ns.clone();
    routed[14 + 7] = 254;
    assert_eq!(parse(&routed), None);
    // A broken checksum.
    let mut bad = ns.clone();
    let last = bad.len() - 1;
    bad[last] ^= 1;
    assert_eq!(parse(&bad), None);
    // A solicitation for a multicast target.
    let mcast = {
        let mut f = ns.clone();
        // Target at 14 + 40 + 8; rewrite it and fix the checksum by
        // rebuilding through smoltcp.
        f[14 + 48] = 0xff;
        f
    };
    assert_eq!(parse(&mcast), None, "checksum or target refuses it");
    // A DAD solicitation sent elsewhere than the target's solicited-node
    // group, or with a source link-layer option, is dropped (RFC 4861
    // 7.1.1).
    let dad = frame(include_bytes!("../../testdata/kernel-dad-ns.pcap"));
    let mut elsewhere = dad.clone();
    elsewhere[14 + 24 + 15] ^= 1;
    assert_eq!(parse(&elsewhere), None);
    // Not ARP or IPv6 at all.
    let mut ipv4 = arp.clone();
    ipv4[12..14].copy_from_slice(&[0x08, 0x00]);
    assert_eq!(parse(&ipv4), None);
}

#[test]
fn solicited_node_groups_and_their_macs() {
    let g = solicited_node("fd00:250::1:2:abcd:ef01".parse().unwrap());
    assert_eq!(g, "ff02::1:ffcd:ef01".parse::<Ipv6Addr>().unwrap());
    assert_eq!(multicast_mac(g), [0x33, 0x33, 0xff, 0xcd, 0xef, 0x01]);
    assert_eq!(multicast_mac(ALL_NODES), [0x33, 0x33, 0, 0, 0, 1]);
    // What the captured DAD solicitation was sent to.
    let dad = frame(include_bytes!("../../testdata/kernel-dad-ns.pcap"));
    let target: Ipv6Addr = "fd00:250::99".parse().unwrap();
    assert_eq!(dad[..6], multicast_mac(solicited_node(target)));
}

#[test]
fn claims_are_read_from_captured_answers_and_announcements() {
    let c = |b: &[u8]| claim(&frame(b));
    assert_eq!(
        c(include_bytes!("../../testdata/kernel-arp-reply.pcap")),
        Some(Claim {
            addr: A4.into(),
            mac: A_OLD,
            gratuitous: false
        })
    );
    for garp in [
        &include_bytes!("../../testdata/kernel-garp.pcap")[..],
        &include_bytes!("../../testdata/arping-garp-reply.pcap")[..],
    ] {
        assert_eq!(
            c(garp),
            Some(Claim {
                addr: A4.into(),
                mac: A,
                gratuitous: true
            })
        );
    }
    assert_eq!(
        c(include_bytes!("../../testdata/kernel-na.pcap")),
        Some(Claim {
            addr: A6.into(),
            mac: A,
            gratuitous: false
        })
    );
    assert_eq!(
        c(include_bytes!("../../testdata/kernel-unsol-na.pcap")),
        Some(Claim {
            addr: A6.into(),
            mac: A,
            gratuitous: true
        })
    );
    // Questions claim nothing.
    for q in [
        &include_bytes!("../../testdata/arping-request.pcap")[..],
        &include_bytes!("../../testdata/arping-probe.pcap")[..],
        &include_bytes!("../../testdata/ndisc6-ns.pcap")[..],
        &include_bytes!("../../testdata/kernel-dad-ns.pcap")[..],
    ] {
        assert_eq!(c(q), None);
    }
    // What the builders write reads back as the claim it makes.
    let q = parse(&frame(include_bytes!("../../testdata/ndisc6-ns.pcap"))).unwrap();
    assert_eq!(claim(&answer(B, &q).unwrap()).map(|c| c.mac), Some(B));
}

#[test]
fn probes_ask_what_the_tools_ask() {
    let arping = frame(include_bytes!("../../testdata/arping-request.pcap"));
    assert_eq!(parse(&arp_request(B, B4, A4)), parse(&arping));
    let ndisc6 = frame(include_bytes!("../../testdata/ndisc6-ns.pcap"));
    let ll: Ipv6Addr = "fe80::ff:fe00:b".parse().unwrap();
    let ours = neighbour_solicitation(B, ll, A6);
    assert_eq!(parse(&ours), parse(&ndisc6));
    // The same frame but for ndisc6's random flow label (bytes 15-17).
    let mut theirs = ndisc6.clone();
    theirs[15..18].copy_from_slice(&[0, 0, 0]);
    theirs[14] &= 0xf0;
    same("neighbour solicitation", &ours, &theirs);
}
