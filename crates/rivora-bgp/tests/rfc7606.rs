//! Error handling against the real session, with a raw peer on loopback
//! whose messages are written byte by byte (RFC 7606, RFC 4271 6.3):
//! - an UPDATE with a malformed attribute (COMMUNITIES of length 3) is
//!   treated as a withdraw: no NOTIFICATION, the session stays
//!   Established and does not flap;
//! - an UPDATE whose attribute list does not add up (the routes cannot be
//!   found) still resets the session, with UPDATE Message Error /
//!   Malformed Attribute List.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use rivora_bgp::{wire, PeerConfig, Speaker, SpeakerConfig, State};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::timeout;

const PEER_ASN: u32 = 65001;
const WAIT: Duration = Duration::from_secs(10);

/// One whole message off `s`.
async fn read_msg(s: &mut TcpStream) -> Vec<u8> {
    let mut m = vec![0u8; 19];
    s.read_exact(&mut m).await.expect("a message header");
    let len = usize::from(u16::from_be_bytes([m[16], m[17]]));
    assert!((19..=4096).contains(&len), "length {len}");
    m.resize(len, 0);
    s.read_exact(&mut m[19..]).await.expect("a message body");
    m
}

/// A message of `kind` with `body`.
fn msg(kind: u8, body: &[u8]) -> Vec<u8> {
    let mut m = vec![0xff; 16];
    m.extend_from_slice(&u16::try_from(19 + body.len()).expect("short").to_be_bytes());
    m.push(kind);
    m.extend_from_slice(body);
    m
}

/// An UPDATE for 10.9.0.0/24 with ORIGIN, a 4-octet AS_PATH, NEXT_HOP and
/// `extra` attributes; `attr_len_delta` is added to the Total Path
/// Attribute Length as written.
fn update(extra: &[u8], attr_len_delta: i32) -> Vec<u8> {
    let mut attrs = vec![0x40, 1, 1, 0]; // ORIGIN IGP
    attrs.extend_from_slice(&[0x40, 2, 6, 2, 1]); // AS_PATH: AS_SEQUENCE of one
    attrs.extend_from_slice(&PEER_ASN.to_be_bytes());
    attrs.extend_from_slice(&[0x40, 3, 4, 127, 0, 0, 1]); // NEXT_HOP
    attrs.extend_from_slice(extra);
    let written = i32::try_from(attrs.len()).expect("short") + attr_len_delta;
    let mut body = vec![0, 0]; // no withdrawn routes
    body.extend_from_slice(&u16::try_from(written).expect("a length").to_be_bytes());
    body.extend_from_slice(&attrs);
    body.extend_from_slice(&[24, 10, 9, 0]);
    msg(2, &body)
}

fn state(sp: &Speaker) -> (State, u64) {
    let st = sp.status();
    let p = st.first().expect("one peer");
    (p.state, p.flaps)
}

/// The speaker with one peer (this test, on a loopback port) and the
/// session Established over the connection it opened.
async fn established() -> (Speaker, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = l.local_addr().expect("addr").port();
    let sp = Speaker::start(&SpeakerConfig {
        asn: 65000,
        router_id: Ipv4Addr::new(10, 0, 0, 1),
        listen_port: 0,
        restart_time: 120,
        forwarding_preserved: false,
        restarting: false,
    })
    .expect("the speaker");
    let mut p = PeerConfig::new(IpAddr::V4(Ipv4Addr::LOCALHOST), PEER_ASN);
    p.port = port;
    p.hold_time = 9;
    p.graceful_restart = false;
    p.connect_retry = Duration::from_secs(1);
    sp.set_peers(vec![p]).expect("the peer");
    let (mut s, _) = timeout(WAIT, l.accept())
        .await
        .expect("the speaker connects")
        .expect("accept");
    let open = read_msg(&mut s).await;
    assert_eq!(open[18], 1, "its first message is an OPEN: {open:02x?}");
    let ours = wire::encode(&wire::open_message(&wire::OpenParams {
        asn: PEER_ASN,
        hold_time: 9,
        router_id: Ipv4Addr::new(10, 0, 0, 9),
        families: vec![wire::Family::of(IpAddr::V4(Ipv4Addr::LOCALHOST))],
        graceful_restart: None,
    }));
    s.write_all(&ours).await.expect("our OPEN");
    s.write_all(&wire::encode_keepalive())
        .await
        .expect("a KEEPALIVE");
    let ka = read_msg(&mut s).await;
    assert_eq!(ka[18], 4, "its KEEPALIVE: {ka:02x?}");
    timeout(WAIT, async {
        while state(&sp).0 != State::Established {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("Established");
    (sp, s)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_attribute_is_treated_as_withdraw() {
    let (sp, mut s) = established().await;
    // COMMUNITIES (optional transitive, type 8) of length 3.
    s.write_all(&update(&[0xc0, 8, 3, 0, 1, 2], 0))
        .await
        .expect("the UPDATE");
    // Three seconds of what the speaker sends: KEEPALIVEs and its
    // End-of-RIB, never a NOTIFICATION; ours keep its hold timer.
    let until = tokio::time::Instant::now() + Duration::from_secs(3);
    while tokio::time::Instant::now() < until {
        s.write_all(&wire::encode_keepalive())
            .await
            .expect("a KEEPALIVE");
        if let Ok(m) = timeout(Duration::from_millis(500), read_msg(&mut s)).await {
            assert_ne!(m[18], 3, "a NOTIFICATION: {m:02x?}");
        }
    }
    assert_eq!(state(&sp), (State::Established, 0));
    let st = sp.status();
    assert!(
        st[0]
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("withdraw")),
        "{:?}",
        st[0].last_error
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_attribute_list_still_resets() {
    let (sp, mut s) = established().await;
    // The Total Path Attribute Length says 40 bytes more than there are.
    s.write_all(&update(&[], 40)).await.expect("the UPDATE");
    let got = timeout(WAIT, async {
        loop {
            let m = read_msg(&mut s).await;
            if m[18] == 3 {
                return m;
            }
        }
    })
    .await
    .expect("a NOTIFICATION");
    assert_eq!(
        (got[19], got[20]),
        (3, 1),
        "UPDATE Message Error / Malformed Attribute List: {got:02x?}"
    );
    timeout(WAIT, async {
        while state(&sp).0 == State::Established {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the session went down");
}
