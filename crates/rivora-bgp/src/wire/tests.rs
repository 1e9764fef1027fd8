//! UPDATE building read back by the parser, OPEN checks, and the decoder
//! against malformed bytes: each gets the NOTIFICATION RFC 4271 6 names,
//! and no input makes it panic.

use super::*;
use proptest::prelude::*;

fn bytes_of(m: &BgpMessage) -> BytesMut {
    BytesMut::from(&encode(m)[..])
}

fn roundtrip(m: &BgpMessage, asn4: bool) -> Message {
    let mut b = bytes_of(m);
    let got = decode(&mut b, &mut parsing_context(asn4))
        .expect("decodes")
        .expect("one whole message");
    assert!(b.is_empty(), "all bytes consumed");
    got
}

fn params(ebgp: bool) -> UpdateParams {
    UpdateParams {
        local_asn: 4_200_000_001,
        ebgp,
        asn4: true,
        next_hop4: None,
        next_hop6: None,
    }
}

fn attrs() -> RouteAttrs {
    RouteAttrs {
        communities: vec![(65000 << 16) | 100, (65000 << 16) | 200],
        large_communities: vec![(4_200_000_001, 1, 2)],
        local_pref: Some(250),
        med: Some(10),
    }
}

fn update(m: Message) -> BgpUpdateMessage {
    match m {
        Message::Update(u) => u,
        other => panic!("not an UPDATE: {other:?}"),
    }
}

fn value(
    u: &BgpUpdateMessage,
    f: impl Fn(&PathAttributeValue) -> bool,
) -> Option<&PathAttributeValue> {
    u.path_attributes().iter().map(|a| a.value()).find(|v| f(v))
}

#[test]
fn an_ipv4_announcement_carries_nlri_next_hop_and_communities() {
    let nets: Vec<Ipv4Net> = vec![
        "10.0.0.1/32".parse().unwrap(),
        "10.0.0.2/32".parse().unwrap(),
    ];
    let m = announce_v4(&nets, &attrs(), &params(true), "192.0.2.1".parse().unwrap());
    let u = update(roundtrip(&m, true));
    let got: Vec<Ipv4Net> = u.nlri().iter().map(|n| n.network().address()).collect();
    assert_eq!(got, nets);
    assert!(matches!(
        value(&u, |v| matches!(v, PathAttributeValue::NextHop(_))),
        Some(PathAttributeValue::NextHop(h)) if h.next_hop() == "192.0.2.1".parse::<Ipv4Addr>().unwrap()
    ));
    match value(&u, |v| matches!(v, PathAttributeValue::Communities(_))) {
        Some(PathAttributeValue::Communities(c)) => {
            let vals: Vec<u32> = c.communities().iter().map(|c| c.value()).collect();
            assert_eq!(vals, attrs().communities);
        }
        other => panic!("communities: {other:?}"),
    }
    match value(&u, |v| matches!(v, PathAttributeValue::LargeCommunities(_))) {
        Some(PathAttributeValue::LargeCommunities(c)) => {
            let l = &c.communities()[0];
            assert_eq!(
                (l.global_admin(), l.local_data1(), l.local_data2()),
                (4_200_000_001, 1, 2)
            );
        }
        other => panic!("large communities: {other:?}"),
    }
    match value(&u, |v| matches!(v, PathAttributeValue::AsPath(_))) {
        Some(PathAttributeValue::AsPath(AsPath::As4PathSegments(s))) => {
            assert_eq!(s[0].as_numbers(), &[4_200_000_001]);
        }
        other => panic!("AS_PATH: {other:?}"),
    }
    assert!(value(&u, |v| matches!(
        v,
        PathAttributeValue::MultiExitDiscriminator(_)
    ))
    .is_some());
    // eBGP: no LOCAL_PREF (RFC 4271 5.1.5).
    assert!(value(&u, |v| matches!(v, PathAttributeValue::LocalPreference(_))).is_none());
}

#[test]
fn ibgp_gets_local_pref_and_an_empty_as_path() {
    let nets: Vec<Ipv4Net> = vec!["10.0.0.1/32".parse().unwrap()];
    let m = announce_v4(
        &nets,
        &attrs(),
        &params(false),
        "192.0.2.1".parse().unwrap(),
    );
    let u = update(roundtrip(&m, true));
    assert!(matches!(
        value(&u, |v| matches!(v, PathAttributeValue::LocalPreference(_))),
        Some(PathAttributeValue::LocalPreference(l)) if l.metric() == 250
    ));
    match value(&u, |v| matches!(v, PathAttributeValue::AsPath(_))) {
        Some(PathAttributeValue::AsPath(AsPath::As4PathSegments(s))) => assert!(s.is_empty()),
        other => panic!("AS_PATH: {other:?}"),
    }
}

#[test]
fn a_two_octet_peer_sees_as_trans_and_as4_path() {
    let p = UpdateParams {
        asn4: false,
        ..params(true)
    };
    let m = announce_v4(
        &["10.0.0.1/32".parse().unwrap()],
        &RouteAttrs::default(),
        &p,
        "192.0.2.1".parse().unwrap(),
    );
    let u = update(roundtrip(&m, false));
    match value(&u, |v| matches!(v, PathAttributeValue::AsPath(_))) {
        Some(PathAttributeValue::AsPath(AsPath::As2PathSegments(s))) => {
            assert_eq!(s[0].as_numbers(), &[AS_TRANS]);
        }
        other => panic!("AS_PATH: {other:?}"),
    }
    assert!(value(&u, |v| matches!(v, PathAttributeValue::As4Path(_))).is_some());
}

#[test]
fn ipv6_goes_in_mp_reach_and_mp_unreach() {
    let nets: Vec<Ipv6Net> = vec![
        "fd00::1/128".parse().unwrap(),
        "fd00::2/128".parse().unwrap(),
    ];
    let nh: Ipv6Addr = "fd00:1::2".parse().unwrap();
    let u = update(roundtrip(
        &announce_v6(&nets, &attrs(), &params(true), nh),
        true,
    ));
    assert!(u.nlri().is_empty());
    match value(&u, |v| matches!(v, PathAttributeValue::MpReach(_))) {
        Some(PathAttributeValue::MpReach(MpReach::Ipv6Unicast {
            next_hop_global,
            nlri,
            ..
        })) => {
            assert_eq!(*next_hop_global, nh);
            let got: Vec<Ipv6Net> = nlri.iter().map(|n| n.network().address()).collect();
            assert_eq!(got, nets);
        }
        other => panic!("MP_REACH: {other:?}"),
    }
    let u = update(roundtrip(&withdraw_v6(&nets), true));
    match value(&u, |v| matches!(v, PathAttributeValue::MpUnreach(_))) {
        Some(PathAttributeValue::MpUnreach(MpUnreach::Ipv6Unicast { nlri })) => {
            assert_eq!(nlri.len(), 2);
        }
        other => panic!("MP_UNREACH: {other:?}"),
    }
    assert_eq!(u.end_of_rib(), None, "a withdrawal is no End-of-RIB");
}

#[test]
fn withdrawals_and_end_of_rib() {
    let nets: Vec<Ipv4Net> = vec!["10.0.0.1/32".parse().unwrap()];
    let u = update(roundtrip(&withdraw_v4(&nets), true));
    assert_eq!(u.withdraw_routes().len(), 1);
    assert!(u.path_attributes().is_empty() && u.nlri().is_empty());
    let eor4 = update(roundtrip(&end_of_rib(Family::Ipv4Unicast), true));
    assert_eq!(eor4.end_of_rib(), Some(AddressType::Ipv4Unicast));
    assert_eq!(
        encode(&end_of_rib(Family::Ipv4Unicast)).len(),
        23,
        "the minimum UPDATE"
    );
    let eor6 = update(roundtrip(&end_of_rib(Family::Ipv6Unicast), true));
    assert_eq!(eor6.end_of_rib(), Some(AddressType::Ipv6Unicast));
}

#[test]
fn full_updates_stay_under_the_message_limit() {
    let mut many = attrs();
    many.communities = (0..64).collect();
    many.large_communities = (0..64).map(|i| (i, i, i)).collect();
    let v4: Vec<Ipv4Net> = (0..V4_PER_UPDATE as u32)
        .map(|i| Ipv4Net::new(Ipv4Addr::from(0x0a00_0000 + i), 32).unwrap())
        .collect();
    let m = announce_v4(&v4, &many, &params(false), "192.0.2.1".parse().unwrap());
    assert!(encode(&m).len() <= MAX_MESSAGE_LEN, "{}", encode(&m).len());
    let v6: Vec<Ipv6Net> = (0..V6_PER_UPDATE as u128)
        .map(|i| Ipv6Net::new(Ipv6Addr::from(0xfd00_u128 << 112 | i), 128).unwrap())
        .collect();
    let m = announce_v6(&v6, &many, &params(false), "fd00::1".parse().unwrap());
    assert!(encode(&m).len() <= MAX_MESSAGE_LEN, "{}", encode(&m).len());
}

fn ours() -> OpenParams {
    OpenParams {
        asn: 4_200_000_001,
        hold_time: 90,
        router_id: "192.0.2.1".parse().unwrap(),
        families: vec![Family::Ipv4Unicast, Family::Ipv6Unicast],
        graceful_restart: Some(GracefulRestart {
            restart_time: 120,
            restarting: true,
            forwarding_preserved: true,
        }),
    }
}

fn open_of(m: Message) -> BgpOpenMessage {
    match m {
        Message::Open(o) => o,
        other => panic!("not an OPEN: {other:?}"),
    }
}

#[test]
fn our_open_has_every_capability_and_checks_against_itself() {
    let o = open_of(roundtrip(&open_message(&ours()), true));
    assert_eq!(o.my_as(), AS_TRANS, "a 4-octet AS shows AS_TRANS");
    assert_eq!(o.my_asn4(), 4_200_000_001);
    let caps = o.capabilities();
    let gr = caps
        .iter()
        .find_map(|c| match c {
            BgpCapability::GracefulRestartCapability(g) => Some(g),
            _ => None,
        })
        .expect("GR capability");
    assert!(gr.restart() && gr.time() == 120);
    assert!(gr.address_families().iter().all(|f| f.forwarding_state()));
    assert_eq!(gr.address_families().len(), 2);
    // As a peer's OPEN: iBGP with another identifier.
    let mut me = ours();
    me.router_id = "192.0.2.9".parse().unwrap();
    me.hold_time = 30;
    let n = check_open(&o, &me, 4_200_000_001).expect("valid");
    assert_eq!(n.hold_time, 30);
    assert!(n.asn4 && n.peer_graceful_restart && n.route_refresh);
    assert_eq!(n.families, vec![Family::Ipv4Unicast, Family::Ipv6Unicast]);
}

/// What a peer's OPEN is refused with, by the parser or the checks after
/// it (whichever sees the problem first: the library refuses some itself).
fn refused(raw: &[u8], me: &OpenParams, peer_asn: u32) -> Notification {
    match decode(&mut BytesMut::from(raw), &mut parsing_context(true)) {
        Err(DecodeError::Open(n)) => n,
        Err(other) => panic!("not an OPEN error: {other:?}"),
        Ok(Some(Message::Open(o))) => check_open(&o, me, peer_asn).expect_err("refused"),
        Ok(other) => panic!("{other:?}"),
    }
}

#[test]
fn bad_opens_get_their_subcodes() {
    let peer = |asn: u32, hold: u16, id: &str| {
        encode(&open_message(&OpenParams {
            asn,
            hold_time: hold,
            router_id: id.parse().unwrap(),
            families: vec![Family::Ipv4Unicast],
            graceful_restart: None,
        }))
    };
    let me = ours();
    let sub = |raw: Vec<u8>, asn: u32| {
        let n = refused(&raw, &me, asn);
        assert_eq!(n.code, codes::OPEN_MESSAGE, "{n:?}");
        n.subcode
    };
    assert_eq!(sub(peer(65000, 90, "10.0.0.1"), 65001), codes::BAD_PEER_AS);
    assert_eq!(
        sub(peer(65000, 2, "10.0.0.1"), 65000),
        codes::UNACCEPTABLE_HOLD_TIME
    );
    assert_eq!(
        sub(peer(65000, 1, "10.0.0.1"), 65000),
        codes::UNACCEPTABLE_HOLD_TIME
    );
    assert_eq!(
        sub(peer(65000, 90, "0.0.0.0"), 65000),
        codes::BAD_BGP_IDENTIFIER
    );
    // iBGP with our own identifier.
    assert_eq!(
        sub(peer(me.asn, 90, "192.0.2.1"), me.asn),
        codes::BAD_BGP_IDENTIFIER
    );
    // Version 3.
    let mut v3 = peer(65000, 90, "10.0.0.1");
    v3[19] = 3;
    assert_eq!(sub(v3, 65000), codes::UNSUPPORTED_VERSION);
    // eBGP may share the identifier (RFC 6286).
    let o = open_of(roundtrip(
        &open_message(&OpenParams {
            asn: 65000,
            ..ours()
        }),
        true,
    ));
    assert!(check_open(&o, &me, 65000).is_ok());
    // No multiprotocol capability: IPv4 unicast alone.
    let bare = BgpOpenMessage::new(65000, 0, "10.0.0.1".parse().unwrap(), vec![]);
    let n = check_open(&bare, &me, 65000).unwrap();
    assert_eq!(n.families, vec![Family::Ipv4Unicast]);
    assert_eq!(n.hold_time, 0, "a zero hold time from either side wins");
}

fn keepalive() -> Vec<u8> {
    encode_keepalive()
}

fn err_of(raw: &[u8]) -> DecodeError {
    decode(&mut BytesMut::from(raw), &mut parsing_context(true)).expect_err("refused")
}

#[test]
fn malformed_headers_get_message_header_errors() {
    let mut m = keepalive();
    m[3] = 0;
    assert_eq!(err_of(&m), DecodeError::Header(Notification::new(1, 1)));
    let mut m = keepalive();
    m[17] = 18;
    assert_eq!(
        err_of(&m),
        DecodeError::Header(Notification::with_data(1, 2, &[0, 18]))
    );
    let mut m = keepalive();
    m[16] = 0x10;
    m[17] = 0x01; // 4097
    assert_eq!(err_of(&m).notification().subcode, codes::BAD_MESSAGE_LENGTH);
    let mut m = keepalive();
    m[18] = 9;
    assert_eq!(
        err_of(&m),
        DecodeError::Header(Notification::with_data(1, 3, &[9]))
    );
    // A KEEPALIVE of 20 bytes.
    let mut m = keepalive();
    m[17] = 20;
    m.push(0);
    assert_eq!(err_of(&m).notification().subcode, codes::BAD_MESSAGE_LENGTH);
    // An OPEN shorter than its minimum.
    let mut m = keepalive();
    m[18] = 1;
    m[17] = 20;
    m.push(4);
    assert_eq!(err_of(&m).notification().subcode, codes::BAD_MESSAGE_LENGTH);
    // Incomplete is not an error: more bytes may come.
    let m = keepalive();
    assert_eq!(
        decode(&mut BytesMut::from(&m[..10]), &mut parsing_context(true)),
        Ok(None)
    );
}

#[test]
fn malformed_updates_get_update_errors() {
    // Withdrawn routes length past the end of the message.
    let mut m = encode(&withdraw_v4(&["10.0.0.1/32".parse().unwrap()]));
    m[19] = 0;
    m[20] = 200;
    let e = err_of(&m);
    assert!(
        matches!(e, DecodeError::Update(ref n) if n.code == codes::UPDATE_MESSAGE),
        "{e:?}"
    );
    assert_eq!(e.notification().subcode, codes::MALFORMED_ATTRIBUTE_LIST);
    // Total path attribute length past the end.
    let mut m = encode(&end_of_rib(Family::Ipv4Unicast));
    m[22] = 9;
    let e = err_of(&m);
    assert_eq!(
        (e.notification().code, e.notification().subcode),
        (3, 1),
        "{e:?}"
    );
}

#[test]
fn a_notification_is_read_whole() {
    let n = Notification::with_data(6, 2, b"bye");
    let raw = encode_notification(&n);
    let got = decode(&mut BytesMut::from(&raw[..]), &mut parsing_context(true)).unwrap();
    assert_eq!(got, Some(Message::Notification(n)));
}

#[test]
fn two_messages_in_one_buffer_come_out_one_by_one() {
    let mut b = BytesMut::new();
    b.extend_from_slice(&keepalive());
    b.extend_from_slice(&encode(&end_of_rib(Family::Ipv4Unicast)));
    let mut ctx = parsing_context(true);
    assert_eq!(decode(&mut b, &mut ctx).unwrap(), Some(Message::Keepalive));
    assert!(matches!(
        decode(&mut b, &mut ctx).unwrap(),
        Some(Message::Update(_))
    ));
    assert_eq!(decode(&mut b, &mut ctx).unwrap(), None);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// Any bytes after a valid header: a message, an error with a
    /// NOTIFICATION, or a wait for more; never a panic.
    #[test]
    fn the_decoder_never_panics(kind in 1u8..=5, body in proptest::collection::vec(any::<u8>(), 0..600), cut in any::<u16>()) {
        let len = (19 + body.len()) as u16;
        let mut raw = vec![0xff; 16];
        raw.extend_from_slice(&len.to_be_bytes());
        raw.push(kind);
        raw.extend_from_slice(&body);
        let keep = (cut as usize % (raw.len() + 1)).max(raw.len() / 2);
        for asn4 in [true, false] {
            let mut b = BytesMut::from(&raw[..keep]);
            match decode(&mut b, &mut parsing_context(asn4)) {
                Ok(_) => {}
                Err(e) => {
                    let n = e.notification();
                    prop_assert!((1..=6).contains(&n.code), "{e:?}");
                }
            }
        }
    }

    /// Entirely random bytes.
    #[test]
    fn random_bytes_never_panic(raw in proptest::collection::vec(any::<u8>(), 0..200)) {
        let mut b = BytesMut::from(&raw[..]);
        let _ = decode(&mut b, &mut parsing_context(true));
    }

    /// What this speaker builds, it reads back.
    #[test]
    fn built_updates_read_back(n in 1usize..50, comms in proptest::collection::vec(any::<u32>(), 0..8), med in proptest::option::of(any::<u32>())) {
        let nets: Vec<Ipv4Net> = (0..n as u32).map(|i| Ipv4Net::new(Ipv4Addr::from(0x0a00_0000 + i), 32).unwrap()).collect();
        let a = RouteAttrs { communities: comms, med, ..RouteAttrs::default() };
        let u = update(roundtrip(&announce_v4(&nets, &a, &params(true), "192.0.2.1".parse().unwrap()), true));
        prop_assert_eq!(u.nlri().len(), n);
    }
}

#[test]
fn a_malformed_attribute_whose_routes_can_be_found_is_an_attribute_error() {
    // ORIGIN, AS_PATH (4-octet), NEXT_HOP, then `extra`; NLRI 10.9.0.0/24.
    let update = |extra: &[u8]| -> Vec<u8> {
        let mut attrs = vec![0x40, 1, 1, 0, 0x40, 2, 6, 2, 1, 0, 0, 0xfd, 0xe9];
        attrs.extend_from_slice(&[0x40, 3, 4, 10, 0, 0, 1]);
        attrs.extend_from_slice(extra);
        let mut body = vec![0, 0];
        body.extend_from_slice(&(attrs.len() as u16).to_be_bytes());
        body.extend_from_slice(&attrs);
        body.extend_from_slice(&[24, 10, 9, 0]);
        let mut m = vec![0xff; 16];
        m.extend_from_slice(&((19 + body.len()) as u16).to_be_bytes());
        m.push(2);
        m.extend_from_slice(&body);
        m
    };
    // COMMUNITIES of length 3: treated as a withdraw (RFC 7606).
    let e = err_of(&update(&[0xc0, 8, 3, 0, 1, 2]));
    assert!(
        matches!(e, DecodeError::Attribute(ref n) if n.code == codes::UPDATE_MESSAGE),
        "{e:?}"
    );
    // The same in an MP_REACH_NLRI (type 14) that cannot be read: its
    // routes cannot be found, so the session resets.
    let e = err_of(&update(&[0x80, 14, 3, 0, 1, 2]));
    assert!(matches!(e, DecodeError::Update(_)), "{e:?}");
}
