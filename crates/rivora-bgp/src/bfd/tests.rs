use super::*;

fn timers(ms: u64, mult: u8) -> Timers {
    Timers {
        min_tx: Duration::from_millis(ms),
        min_rx: Duration::from_millis(ms),
        multiplier: mult,
    }
}

#[test]
fn packets_round_trip_and_bad_ones_are_discarded() {
    let p = Packet {
        diag: 1,
        state: BfdState::Init,
        poll: true,
        final_: false,
        detect_mult: 3,
        my_discr: 7,
        your_discr: 9,
        desired_min_tx_us: 100_000,
        required_min_rx_us: 200_000,
    };
    assert_eq!(Packet::decode(&p.encode()), Some(p));
    let bad = |f: &dyn Fn(&mut [u8; PACKET_LEN])| {
        let mut b = p.encode();
        f(&mut b);
        Packet::decode(&b)
    };
    assert_eq!(bad(&|b| b[0] = 2 << 5), None, "version 2");
    assert_eq!(bad(&|b| b[3] = 23), None, "short length");
    assert_eq!(bad(&|b| b[3] = 40), None, "length past the datagram");
    assert_eq!(bad(&|b| b[2] = 0), None, "multiplier 0");
    assert_eq!(bad(&|b| b[1] |= 0x01), None, "multipoint");
    assert_eq!(
        bad(&|b| b[1] |= 0x04),
        None,
        "authentication not configured"
    );
    assert_eq!(
        bad(&|b| b[4..8].copy_from_slice(&[0; 4])),
        None,
        "my discriminator 0"
    );
    assert_eq!(
        bad(&|b| b[8..12].copy_from_slice(&[0; 4])),
        None,
        "your discriminator 0 from an Init peer"
    );
    assert!(Packet::decode(&[0u8; 10]).is_none());
}

/// Two sessions exchanging packets: Down, Init, Up (the three-way
/// handshake of RFC 5880 6.2), then the Poll Sequence to the fast rate.
#[test]
fn two_sessions_come_up_and_agree_on_the_fast_intervals() {
    let now = Instant::now();
    let mut a = Session::new(1, timers(100, 3));
    let mut b = Session::new(2, timers(50, 5));
    assert_eq!(
        a.tx_interval(),
        Some(Duration::from_secs(1)),
        "slow while Down"
    );
    let pa = a.packet();
    b.receive(&pa, now);
    assert_eq!(b.state, BfdState::Init);
    let pb = b.packet();
    a.receive(&pb, now);
    assert_eq!(a.state, BfdState::Up);
    let pa = a.packet();
    assert!(pa.poll, "a Poll Sequence announces the faster rate");
    assert_eq!(pa.desired_min_tx_us, 100_000);
    // What is announced is used at once: b's detection time now counts
    // on it (b asks for 50 ms at best, a sends every 100 ms).
    assert_eq!(a.tx_interval(), Some(Duration::from_millis(100)));
    b.receive(&pa, now);
    assert_eq!(b.state, BfdState::Up);
    assert!(b.send_final);
    let pb = b.packet();
    assert!(
        pb.final_ && !pb.poll,
        "Final for a's Poll (never both bits)"
    );
    a.receive(&pb, now);
    // a sends at max(its 100 ms, b's RequiredMinRx 50 ms).
    assert_eq!(a.tx_interval(), Some(Duration::from_millis(100)));
    // b's own Poll, answered.
    let pb = b.packet();
    assert!(pb.poll);
    a.receive(&pb, now);
    let pa = a.packet();
    assert!(pa.final_);
    b.receive(&pa, now);
    assert_eq!(
        b.tx_interval(),
        Some(Duration::from_millis(100)),
        "a can take 100 ms at best"
    );
    // Detection at a: b's multiplier (5) x max(a's RequiredMinRx, b's DesiredMinTx).
    assert_eq!(a.detection_time(), Some(Duration::from_millis(500)));
    assert_eq!(b.detection_time(), Some(Duration::from_millis(300)));
}

#[test]
fn silence_for_the_detection_time_is_down() {
    let t0 = Instant::now();
    let mut a = Session::new(1, timers(100, 3));
    let mut b = Session::new(2, timers(100, 3));
    b.receive(&a.packet(), t0);
    a.receive(&b.packet(), t0);
    b.receive(&a.packet(), t0);
    assert_eq!((a.state, b.state), (BfdState::Up, BfdState::Up));
    let detect = a.detection_time().unwrap();
    assert!(!a.check_expiry(t0 + detect));
    assert!(a.check_expiry(t0 + detect + Duration::from_millis(1)));
    assert_eq!(a.state, BfdState::Down);
    assert_eq!(a.local_diag, diag::CONTROL_DETECTION_TIME_EXPIRED);
    assert_eq!(a.remote_discr, 0);
}

#[test]
fn a_peer_saying_down_or_admin_down_takes_us_down() {
    let t0 = Instant::now();
    let up = || {
        let mut a = Session::new(1, timers(300, 3));
        let mut b = Session::new(2, timers(300, 3));
        b.receive(&a.packet(), t0);
        a.receive(&b.packet(), t0);
        (a, b)
    };
    let (mut a, _) = up();
    assert_eq!(a.state, BfdState::Up);
    let mut down = Packet::decode(&Session::new(2, timers(300, 3)).packet().encode()).unwrap();
    down.your_discr = 1;
    a.receive(&down, t0);
    assert_eq!(
        (a.state, a.local_diag),
        (BfdState::Down, diag::NEIGHBOR_SIGNALED_DOWN)
    );
    let (mut a, mut b) = up();
    b.state = BfdState::AdminDown;
    let mut p = b.packet();
    p.your_discr = 1;
    a.receive(&p, t0);
    assert_eq!(a.state, BfdState::Down);
}

#[test]
fn a_peer_that_wants_no_packets_gets_none() {
    let mut a = Session::new(1, timers(300, 3));
    let mut p = Session::new(2, timers(300, 3)).packet();
    p.required_min_rx_us = 0;
    a.receive(&p, Instant::now());
    assert_eq!(a.tx_interval(), None);
}

/// The expiry is the last packet plus the detection time, while Init or
/// Up; none while Down.
#[test]
fn the_expiry_follows_the_last_packet() {
    let t0 = Instant::now();
    let mut a = Session::new(1, timers(100, 3));
    let mut b = Session::new(2, timers(100, 3));
    assert_eq!(a.expires_at(), None);
    a.receive(&b.packet(), t0);
    // Init: b's slow rate (1 s) x its multiplier.
    assert_eq!(a.state, BfdState::Init);
    assert_eq!(a.expires_at(), Some(t0 + Duration::from_secs(3)));
    let t1 = t0 + Duration::from_millis(500);
    b.receive(&a.packet(), t1);
    a.receive(&b.packet(), t1);
    assert_eq!(a.state, BfdState::Up);
    // b is Up and announces 100 ms: 3 x 100 ms after its packet.
    assert_eq!(a.expires_at(), Some(t1 + Duration::from_millis(300)));
    assert!(!a.check_expiry(t1 + Duration::from_millis(300)));
    assert!(a.check_expiry(t1 + Duration::from_millis(301)));
    assert_eq!(a.expires_at(), None);
}
