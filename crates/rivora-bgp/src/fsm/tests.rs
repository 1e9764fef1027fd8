//! Every event of RFC 4271 8.1 in every state of 8.2.2: the next state
//! (one table, written from the RFC's text), then the actions that matter
//! for the transitions a session lives by.

use super::*;

fn n() -> Notification {
    Notification::new(codes::OPEN_MESSAGE, codes::BAD_PEER_AS)
}

/// One event of each number, 1 to 28.
fn events() -> Vec<Event> {
    vec![
        Event::ManualStart,
        Event::ManualStop,
        Event::AutomaticStart,
        Event::ManualStartPassive,
        Event::AutomaticStartPassive,
        Event::AutomaticStartDamped,
        Event::AutomaticStartDampedPassive,
        Event::AutomaticStop(codes::PEER_DECONFIGURED),
        Event::ConnectRetryTimerExpires,
        Event::HoldTimerExpires,
        Event::KeepaliveTimerExpires,
        Event::DelayOpenTimerExpires,
        Event::IdleHoldTimerExpires,
        Event::TcpConnectionValid,
        Event::TcpCrInvalid,
        Event::TcpCrAcked,
        Event::TcpConnectionConfirmed,
        Event::TcpConnectionFails,
        Event::BgpOpen { hold_time: 90 },
        Event::BgpOpenWithDelayOpenTimer { hold_time: 90 },
        Event::BgpHeaderErr(n()),
        Event::BgpOpenMsgErr(n()),
        Event::OpenCollisionDump,
        Event::NotifMsgVerErr,
        Event::NotifMsg,
        Event::KeepAliveMsg,
        Event::UpdateMsg,
        Event::UpdateMsgErr(n()),
    ]
}

/// An FSM (active, no DelayOpen) brought into `s` by real events.
fn in_state(s: State, cfg: FsmConfig) -> Fsm {
    let mut f = Fsm::new(cfg);
    let path: &[Event] = match s {
        State::Idle => &[],
        State::Connect => &[Event::ManualStart],
        State::Active => &[Event::ManualStartPassive],
        State::OpenSent => &[Event::ManualStart, Event::TcpCrAcked],
        State::OpenConfirm => &[
            Event::ManualStart,
            Event::TcpCrAcked,
            Event::BgpOpen { hold_time: 90 },
        ],
        State::Established => &[
            Event::ManualStart,
            Event::TcpCrAcked,
            Event::BgpOpen { hold_time: 90 },
            Event::KeepAliveMsg,
        ],
    };
    for e in path {
        f.handle(e.clone());
    }
    assert_eq!(f.state(), s, "reaching {s}");
    f
}

#[test]
fn every_event_in_every_state_goes_where_rfc_4271_says() {
    use State::*;
    // Rows: events 1..=28; columns: Idle, Connect, Active, OpenSent,
    // OpenConfirm, Established. An active session without DelayOpen.
    let table: [[State; 6]; 28] = [
        /* 1 ManualStart          */
        [Connect, Connect, Active, OpenSent, OpenConfirm, Established],
        /* 2 ManualStop           */ [Idle, Idle, Idle, Idle, Idle, Idle],
        /* 3 AutomaticStart       */
        [Connect, Connect, Active, OpenSent, OpenConfirm, Established],
        /* 4 ManualStart passive  */
        [Active, Connect, Active, OpenSent, OpenConfirm, Established],
        /* 5 AutoStart passive    */
        [Active, Connect, Active, OpenSent, OpenConfirm, Established],
        /* 6 AutoStart damped     */
        [Connect, Connect, Active, OpenSent, OpenConfirm, Established],
        /* 7 damped passive       */
        [Active, Connect, Active, OpenSent, OpenConfirm, Established],
        /* 8 AutomaticStop        */ [Idle, Idle, Idle, Idle, Idle, Idle],
        /* 9 ConnectRetry expires */ [Idle, Connect, Connect, Idle, Idle, Idle],
        /* 10 Hold expires        */ [Idle, Idle, Idle, Idle, Idle, Idle],
        /* 11 Keepalive expires   */ [Idle, Idle, Idle, Idle, OpenConfirm, Established],
        /* 12 DelayOpen expires   */ [Idle, Idle, Idle, Idle, Idle, Idle],
        /* 13 IdleHold expires    */ [Connect, Idle, Idle, Idle, Idle, Idle],
        /* 14 TcpConnectionValid  */
        [Idle, Connect, Active, OpenSent, OpenConfirm, Established],
        /* 15 Tcp_CR_Invalid      */
        [Idle, Connect, Active, OpenSent, OpenConfirm, Established],
        /* 16 Tcp_CR_Acked        */
        [Idle, OpenSent, OpenSent, OpenSent, OpenConfirm, Established],
        /* 17 TcpConnConfirmed    */
        [Idle, OpenSent, OpenSent, OpenSent, OpenConfirm, Established],
        /* 18 TcpConnectionFails  */ [Idle, Idle, Idle, Active, Idle, Idle],
        /* 19 BGPOpen             */ [Idle, Idle, Idle, OpenConfirm, Idle, Idle],
        /* 20 BGPOpen + DelayOpen */ [Idle, Idle, Idle, Idle, Idle, Idle],
        /* 21 BGPHeaderErr        */ [Idle, Idle, Idle, Idle, Idle, Idle],
        /* 22 BGPOpenMsgErr       */ [Idle, Idle, Idle, Idle, Idle, Idle],
        /* 23 OpenCollisionDump   */ [Idle, Idle, Idle, Idle, Idle, Idle],
        /* 24 NotifMsgVerErr      */ [Idle, Idle, Idle, Idle, Idle, Idle],
        /* 25 NotifMsg            */ [Idle, Idle, Idle, Idle, Idle, Idle],
        /* 26 KeepAliveMsg        */ [Idle, Idle, Idle, Idle, Established, Established],
        /* 27 UpdateMsg           */ [Idle, Idle, Idle, Idle, Idle, Established],
        /* 28 UpdateMsgErr        */ [Idle, Idle, Idle, Idle, Idle, Idle],
    ];
    let evs = events();
    assert_eq!(evs.len(), 28);
    for (i, ev) in evs.iter().enumerate() {
        assert_eq!(ev.number() as usize, i + 1);
        for (j, s) in State::ALL.iter().enumerate() {
            let mut f = in_state(*s, FsmConfig::default());
            let actions = f.handle(ev.clone());
            assert_eq!(
                f.state(),
                table[i][j],
                "event {} ({ev:?}) in {s}: actions {actions:?}",
                ev.number()
            );
        }
    }
}

#[test]
fn a_passive_session_waits_and_never_connects() {
    let mut f = Fsm::new(FsmConfig {
        passive: true,
        delay_open: false,
    });
    let a = f.handle(Event::AutomaticStart);
    assert_eq!(f.state(), State::Active);
    assert!(a.contains(&Action::ListenTcp) && !a.contains(&Action::InitiateTcp));
    let a = f.handle(Event::ConnectRetryTimerExpires);
    assert_eq!(f.state(), State::Active);
    assert!(!a.contains(&Action::InitiateTcp), "{a:?}");
    let a = f.handle(Event::TcpConnectionConfirmed);
    assert_eq!(f.state(), State::OpenSent);
    assert_eq!(
        a,
        vec![
            Action::StopConnectRetryTimer,
            Action::SendOpen,
            Action::StartHoldTimer(LARGE_HOLD_TIME)
        ]
    );
    // Restarted after a failure, it listens again.
    f.handle(Event::TcpConnectionFails);
    assert_eq!(f.state(), State::Active);
    f.handle(Event::HoldTimerExpires);
    assert_eq!(f.state(), State::Idle);
    let a = f.handle(Event::IdleHoldTimerExpires);
    assert_eq!(f.state(), State::Active);
    assert!(a.contains(&Action::ListenTcp));
}

#[test]
fn the_happy_path_sends_open_keepalive_and_comes_up() {
    let mut f = Fsm::new(FsmConfig::default());
    assert_eq!(
        f.handle(Event::ManualStart),
        vec![Action::StartConnectRetryTimer, Action::InitiateTcp]
    );
    assert_eq!(
        f.handle(Event::TcpCrAcked),
        vec![
            Action::StopConnectRetryTimer,
            Action::SendOpen,
            Action::StartHoldTimer(240)
        ]
    );
    assert_eq!(
        f.handle(Event::BgpOpen { hold_time: 9 }),
        vec![
            Action::StopConnectRetryTimer,
            Action::SendKeepalive,
            Action::StartKeepaliveTimer,
            Action::StartHoldTimer(9)
        ]
    );
    assert_eq!(
        f.handle(Event::KeepAliveMsg),
        vec![Action::StartHoldTimer(9), Action::SessionUp]
    );
    assert_eq!(f.state(), State::Established);
    assert_eq!(
        f.handle(Event::KeepaliveTimerExpires),
        vec![Action::SendKeepalive, Action::StartKeepaliveTimer]
    );
    assert_eq!(
        f.handle(Event::UpdateMsg),
        vec![Action::ProcessUpdate, Action::StartHoldTimer(9)]
    );
    assert_eq!(
        f.handle(Event::KeepAliveMsg),
        vec![Action::StartHoldTimer(9)]
    );
}

#[test]
fn a_zero_hold_time_means_no_keepalives() {
    let mut f = in_state(State::OpenSent, FsmConfig::default());
    let a = f.handle(Event::BgpOpen { hold_time: 0 });
    assert!(!a.contains(&Action::StartKeepaliveTimer), "{a:?}");
    assert!(a.contains(&Action::StartHoldTimer(0)));
    f.handle(Event::KeepAliveMsg);
    let a = f.handle(Event::KeepaliveTimerExpires);
    assert_eq!(a, vec![Action::SendKeepalive]);
}

#[test]
fn errors_send_the_notification_they_carry_and_back_off() {
    for s in [State::OpenSent, State::OpenConfirm] {
        let mut f = in_state(s, FsmConfig::default());
        let before = f.connect_retry_counter;
        let a = f.handle(Event::BgpOpenMsgErr(n()));
        assert_eq!(a[0], Action::SendNotification(n()), "{s}");
        assert!(a.contains(&Action::DropTcp) && a.contains(&Action::StartIdleHoldTimer));
        assert_eq!(f.connect_retry_counter, before + 1);
    }
    let mut f = in_state(State::Established, FsmConfig::default());
    let upd = Notification::new(codes::UPDATE_MESSAGE, codes::MALFORMED_ATTRIBUTE_LIST);
    let a = f.handle(Event::UpdateMsgErr(upd.clone()));
    assert_eq!(a[0], Action::SendNotification(upd));
    // A 4,097-byte message while Established: Bad Message Length with the
    // length (6.1), not an FSM error.
    let mut f = in_state(State::Established, FsmConfig::default());
    let long = Notification::with_data(
        codes::MESSAGE_HEADER,
        codes::BAD_MESSAGE_LENGTH,
        &[0x10, 0x01],
    );
    let a = f.handle(Event::BgpHeaderErr(long.clone()));
    assert_eq!(a[0], Action::SendNotification(long));
    assert_eq!(f.state(), State::Idle);
    // Connect and Active send no NOTIFICATION before an OPEN.
    let mut f = in_state(State::Connect, FsmConfig::default());
    let a = f.handle(Event::BgpHeaderErr(n()));
    assert!(!a.iter().any(|a| matches!(a, Action::SendNotification(_))));
}

#[test]
fn unexpected_messages_are_fsm_errors_with_rfc_6608_subcodes() {
    for (s, sub) in [
        (State::OpenSent, codes::FSM_UNEXPECTED_IN_OPENSENT),
        (State::OpenConfirm, codes::FSM_UNEXPECTED_IN_OPENCONFIRM),
        (State::Established, codes::FSM_UNEXPECTED_IN_ESTABLISHED),
    ] {
        let mut f = in_state(s, FsmConfig::default());
        let a = f.handle(Event::ConnectRetryTimerExpires);
        assert_eq!(
            a[0],
            Action::SendNotification(Notification::new(codes::FSM, sub)),
            "{s}"
        );
        assert_eq!(f.state(), State::Idle);
    }
    let mut f = in_state(State::OpenSent, FsmConfig::default());
    let a = f.handle(Event::UpdateMsg);
    assert_eq!(
        a[0],
        Action::SendNotification(Notification::new(codes::FSM, 1))
    );
}

#[test]
fn stops_send_cease_and_a_manual_stop_resets_the_counter() {
    let mut f = in_state(State::Established, FsmConfig::default());
    f.connect_retry_counter = 3;
    let a = f.handle(Event::ManualStop);
    assert_eq!(
        a[0],
        Action::SendNotification(Notification::new(6, codes::ADMINISTRATIVE_SHUTDOWN))
    );
    assert_eq!(f.connect_retry_counter, 0);
    assert!(!a.contains(&Action::StartIdleHoldTimer));
    let mut f = in_state(State::Established, FsmConfig::default());
    let a = f.handle(Event::AutomaticStop(codes::PEER_DECONFIGURED));
    assert_eq!(
        a[0],
        Action::SendNotification(Notification::new(6, codes::PEER_DECONFIGURED))
    );
    let mut f = in_state(State::Established, FsmConfig::default());
    let a = f.handle(Event::HoldTimerExpires);
    assert_eq!(a[0], Action::SendNotification(Notification::new(4, 0)));
    let mut f = in_state(State::Established, FsmConfig::default());
    let a = f.handle(Event::OpenCollisionDump);
    assert_eq!(
        a[0],
        Action::SendNotification(Notification::new(6, codes::CONNECTION_COLLISION_RESOLUTION))
    );
}

#[test]
fn second_connections_are_tracked_for_collision_resolution() {
    for s in [State::OpenSent, State::OpenConfirm, State::Established] {
        for ev in [
            Event::TcpConnectionValid,
            Event::TcpCrAcked,
            Event::TcpConnectionConfirmed,
        ] {
            let mut f = in_state(s, FsmConfig::default());
            assert_eq!(f.handle(ev), vec![Action::TrackSecondConnection], "{s}");
            assert_eq!(f.state(), s);
        }
    }
    let mut f = in_state(State::Connect, FsmConfig::default());
    assert_eq!(f.handle(Event::TcpConnectionValid), vec![Action::AcceptTcp]);
    assert_eq!(f.handle(Event::TcpCrInvalid), vec![Action::RejectTcp]);
}

#[test]
fn delay_open_waits_for_the_peers_open_or_the_timer() {
    let cfg = FsmConfig {
        passive: false,
        delay_open: true,
    };
    // The timer expires: OPEN sent, OpenSent.
    let mut f = Fsm::new(cfg);
    f.handle(Event::ManualStart);
    let a = f.handle(Event::TcpCrAcked);
    assert_eq!(
        a,
        vec![Action::StopConnectRetryTimer, Action::StartDelayOpenTimer]
    );
    assert_eq!(f.state(), State::Connect);
    assert!(f.delay_open_running());
    let a = f.handle(Event::DelayOpenTimerExpires);
    assert_eq!(a, vec![Action::SendOpen, Action::StartHoldTimer(240)]);
    assert_eq!(f.state(), State::OpenSent);
    // The peer's OPEN first (event 20): OPEN and KEEPALIVE, OpenConfirm.
    let mut f = Fsm::new(cfg);
    f.handle(Event::ManualStart);
    f.handle(Event::TcpCrAcked);
    let a = f.handle(Event::BgpOpenWithDelayOpenTimer { hold_time: 30 });
    assert_eq!(f.state(), State::OpenConfirm);
    assert!(a.contains(&Action::SendOpen) && a.contains(&Action::SendKeepalive));
    assert!(a.contains(&Action::StartHoldTimer(30)));
    // The connection fails while waiting: Active, listening.
    let mut f = Fsm::new(cfg);
    f.handle(Event::ManualStart);
    f.handle(Event::TcpCrAcked);
    f.handle(Event::TcpConnectionFails);
    assert_eq!(f.state(), State::Active);
    // From Active, a NOTIFICATION with a version error while waiting does
    // not count against the peer.
    let mut f = Fsm::new(cfg);
    f.handle(Event::ManualStartPassive);
    f.handle(Event::TcpConnectionConfirmed);
    let before = f.connect_retry_counter;
    f.handle(Event::NotifMsgVerErr);
    assert_eq!((f.state(), f.connect_retry_counter), (State::Idle, before));
}

#[test]
fn connect_retry_expiry_retries_the_connection() {
    let mut f = in_state(State::Connect, FsmConfig::default());
    assert_eq!(
        f.handle(Event::ConnectRetryTimerExpires),
        vec![
            Action::DropTcp,
            Action::StartConnectRetryTimer,
            Action::InitiateTcp
        ]
    );
    let mut f = Fsm::new(FsmConfig::default());
    f.handle(Event::ManualStart);
    let a = f.handle(Event::TcpConnectionFails);
    assert_eq!(f.state(), State::Idle);
    assert!(a.contains(&Action::StartIdleHoldTimer));
    let a = f.handle(Event::IdleHoldTimerExpires);
    assert_eq!(f.state(), State::Connect);
    assert!(a.contains(&Action::InitiateTcp));
}
