//! The BGP finite state machine of RFC 4271 section 8, pure: an event in,
//! the new state and the actions out. The session driver
//! ([`crate::session`]) owns the socket and the timers and does what the
//! actions say; this module decides, so every transition is a unit test.
//!
//! Optional session attributes (8.1.1) as Rivora sets them:
//! `AllowAutomaticStart` and `AllowAutomaticStop` true (the speaker starts
//! and stops sessions as configuration changes), `DampPeerOscillations`
//! true (after a failure the driver waits the IdleHoldTimer, doubling from
//! 1 s to 30 s, before the next automatic start: connect-retry with
//! backoff), `PassiveTcpEstablishment` per peer, `DelayOpen` per peer
//! (off by default), `CollisionDetectEstablishedState`,
//! `SendNOTIFICATIONwithoutOPEN` and `TrackTcpState` false.
//!
//! A second connection during OpenSent, OpenConfirm or Established is the
//! driver's business (collision resolution, section 6.8): the FSM only
//! says to track it (events 14, 16, 17 there).

use std::fmt;

/// RFC 4271 8.2.2's states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum State {
    Idle,
    Connect,
    Active,
    OpenSent,
    OpenConfirm,
    Established,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Idle => "Idle",
            State::Connect => "Connect",
            State::Active => "Active",
            State::OpenSent => "OpenSent",
            State::OpenConfirm => "OpenConfirm",
            State::Established => "Established",
        }
    }

    /// Every state, in the RFC's order.
    pub const ALL: [State; 6] = [
        State::Idle,
        State::Connect,
        State::Active,
        State::OpenSent,
        State::OpenConfirm,
        State::Established,
    ];
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A NOTIFICATION to send: error code, subcode and data (RFC 4271 4.5).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Notification {
    pub code: u8,
    pub subcode: u8,
    pub data: Vec<u8>,
}

impl Notification {
    pub fn new(code: u8, subcode: u8) -> Self {
        Self {
            code,
            subcode,
            data: Vec::new(),
        }
    }

    pub fn with_data(code: u8, subcode: u8, data: &[u8]) -> Self {
        Self {
            code,
            subcode,
            data: data.to_vec(),
        }
    }
}

impl fmt::Display for Notification {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{} ({})",
            self.code,
            self.subcode,
            codes::describe(self.code, self.subcode)
        )
    }
}

/// Error codes and subcodes (RFC 4271 4.5, 6.x; RFC 4486 for Cease; RFC
/// 6608 for FSM errors; RFC 9384 for BFD Down).
pub mod codes {
    pub const MESSAGE_HEADER: u8 = 1;
    pub const OPEN_MESSAGE: u8 = 2;
    pub const UPDATE_MESSAGE: u8 = 3;
    pub const HOLD_TIMER_EXPIRED: u8 = 4;
    pub const FSM: u8 = 5;
    pub const CEASE: u8 = 6;

    // Message header.
    pub const CONNECTION_NOT_SYNCHRONIZED: u8 = 1;
    pub const BAD_MESSAGE_LENGTH: u8 = 2;
    pub const BAD_MESSAGE_TYPE: u8 = 3;
    // OPEN.
    pub const UNSUPPORTED_VERSION: u8 = 1;
    pub const BAD_PEER_AS: u8 = 2;
    pub const BAD_BGP_IDENTIFIER: u8 = 3;
    pub const UNSUPPORTED_OPTIONAL_PARAMETER: u8 = 4;
    pub const UNACCEPTABLE_HOLD_TIME: u8 = 6;
    // UPDATE.
    pub const MALFORMED_ATTRIBUTE_LIST: u8 = 1;
    // FSM (RFC 6608).
    pub const FSM_UNEXPECTED_IN_OPENSENT: u8 = 1;
    pub const FSM_UNEXPECTED_IN_OPENCONFIRM: u8 = 2;
    pub const FSM_UNEXPECTED_IN_ESTABLISHED: u8 = 3;
    // Cease (RFC 4486, RFC 9384).
    pub const ADMINISTRATIVE_SHUTDOWN: u8 = 2;
    pub const PEER_DECONFIGURED: u8 = 3;
    pub const CONNECTION_REJECTED: u8 = 5;
    pub const OTHER_CONFIGURATION_CHANGE: u8 = 6;
    pub const CONNECTION_COLLISION_RESOLUTION: u8 = 7;
    pub const BFD_DOWN: u8 = 10;

    /// A few words for a code and subcode, for logs and status.
    pub fn describe(code: u8, subcode: u8) -> &'static str {
        match (code, subcode) {
            (1, 1) => "connection not synchronized",
            (1, 2) => "bad message length",
            (1, 3) => "bad message type",
            (1, _) => "message header error",
            (2, 1) => "unsupported version number",
            (2, 2) => "bad peer AS",
            (2, 3) => "bad BGP identifier",
            (2, 4) => "unsupported optional parameter",
            (2, 6) => "unacceptable hold time",
            (2, 7) => "unsupported capability",
            (2, _) => "OPEN message error",
            (3, 1) => "malformed attribute list",
            (3, 2) => "unrecognized well-known attribute",
            (3, 3) => "missing well-known attribute",
            (3, 4) => "attribute flags error",
            (3, 5) => "attribute length error",
            (3, 6) => "invalid ORIGIN",
            (3, 8) => "invalid NEXT_HOP",
            (3, 9) => "optional attribute error",
            (3, 10) => "invalid network field",
            (3, 11) => "malformed AS_PATH",
            (3, _) => "UPDATE message error",
            (4, _) => "hold timer expired",
            (5, 1) => "unexpected message in OpenSent",
            (5, 2) => "unexpected message in OpenConfirm",
            (5, 3) => "unexpected message in Established",
            (5, _) => "finite state machine error",
            (6, 1) => "maximum prefixes reached",
            (6, 2) => "administrative shutdown",
            (6, 3) => "peer de-configured",
            (6, 4) => "administrative reset",
            (6, 5) => "connection rejected",
            (6, 6) => "other configuration change",
            (6, 7) => "connection collision resolution",
            (6, 8) => "out of resources",
            (6, 9) => "hard reset",
            (6, 10) => "BFD down",
            (6, _) => "cease",
            _ => "unknown error",
        }
    }
}

/// RFC 4271 8.1's events, numbered as there. Errors carry the
/// NOTIFICATION the FSM sends for them; an OPEN its negotiated hold time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// 1
    ManualStart,
    /// 2
    ManualStop,
    /// 3
    AutomaticStart,
    /// 4
    ManualStartPassive,
    /// 5
    AutomaticStartPassive,
    /// 6
    AutomaticStartDamped,
    /// 7
    AutomaticStartDampedPassive,
    /// 8 (with the Cease subcode to send)
    AutomaticStop(u8),
    /// 9
    ConnectRetryTimerExpires,
    /// 10
    HoldTimerExpires,
    /// 11
    KeepaliveTimerExpires,
    /// 12
    DelayOpenTimerExpires,
    /// 13
    IdleHoldTimerExpires,
    /// 14
    TcpConnectionValid,
    /// 15
    TcpCrInvalid,
    /// 16
    TcpCrAcked,
    /// 17
    TcpConnectionConfirmed,
    /// 18
    TcpConnectionFails,
    /// 19: a valid OPEN; the hold time negotiated with it (seconds, 0: none).
    BgpOpen { hold_time: u16 },
    /// 20: a valid OPEN while the DelayOpenTimer runs.
    BgpOpenWithDelayOpenTimer { hold_time: u16 },
    /// 21
    BgpHeaderErr(Notification),
    /// 22
    BgpOpenMsgErr(Notification),
    /// 23
    OpenCollisionDump,
    /// 24
    NotifMsgVerErr,
    /// 25
    NotifMsg,
    /// 26
    KeepAliveMsg,
    /// 27
    UpdateMsg,
    /// 28
    UpdateMsgErr(Notification),
}

impl Event {
    /// The RFC's number for this event.
    pub fn number(&self) -> u8 {
        match self {
            Event::ManualStart => 1,
            Event::ManualStop => 2,
            Event::AutomaticStart => 3,
            Event::ManualStartPassive => 4,
            Event::AutomaticStartPassive => 5,
            Event::AutomaticStartDamped => 6,
            Event::AutomaticStartDampedPassive => 7,
            Event::AutomaticStop(_) => 8,
            Event::ConnectRetryTimerExpires => 9,
            Event::HoldTimerExpires => 10,
            Event::KeepaliveTimerExpires => 11,
            Event::DelayOpenTimerExpires => 12,
            Event::IdleHoldTimerExpires => 13,
            Event::TcpConnectionValid => 14,
            Event::TcpCrInvalid => 15,
            Event::TcpCrAcked => 16,
            Event::TcpConnectionConfirmed => 17,
            Event::TcpConnectionFails => 18,
            Event::BgpOpen { .. } => 19,
            Event::BgpOpenWithDelayOpenTimer { .. } => 20,
            Event::BgpHeaderErr(_) => 21,
            Event::BgpOpenMsgErr(_) => 22,
            Event::OpenCollisionDump => 23,
            Event::NotifMsgVerErr => 24,
            Event::NotifMsg => 25,
            Event::KeepAliveMsg => 26,
            Event::UpdateMsg => 27,
            Event::UpdateMsgErr(_) => 28,
        }
    }
}

/// What the driver must do, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Start (or restart) the ConnectRetryTimer with its initial value.
    StartConnectRetryTimer,
    /// Stop it and set it to zero.
    StopConnectRetryTimer,
    StartDelayOpenTimer,
    StopDelayOpenTimer,
    /// Start the HoldTimer with this many seconds (0: stop it).
    StartHoldTimer(u16),
    /// Start the KeepaliveTimer at a third of the negotiated hold time.
    StartKeepaliveTimer,
    /// Open a TCP connection to the peer.
    InitiateTcp,
    /// Wait for the peer to connect.
    ListenTcp,
    /// Accept a connection (event 14).
    AcceptTcp,
    /// Refuse a connection (event 15).
    RejectTcp,
    /// A second connection is in progress: the driver resolves the
    /// collision (RFC 4271 6.8).
    TrackSecondConnection,
    DropTcp,
    SendOpen,
    SendKeepalive,
    SendNotification(Notification),
    /// Parse and (for an announce-only speaker) discard a route update.
    ProcessUpdate,
    /// Entering Established: send the Adj-RIB-Out and End-of-RIB.
    SessionUp,
    /// Forget what was sent and received on the session.
    ReleaseResources,
    /// The session failed: wait the IdleHoldTimer (backoff) before the
    /// next automatic start.
    StartIdleHoldTimer,
}

/// How this session starts and runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FsmConfig {
    /// Never connect: wait for the peer (PassiveTcpEstablishment).
    pub passive: bool,
    /// DelayOpen: wait this long after the connection for the peer's OPEN.
    pub delay_open: bool,
}

/// Hold time the FSM sets until the OPENs are exchanged (RFC 4271: "a
/// large value", 4 minutes suggested).
pub const LARGE_HOLD_TIME: u16 = 240;

#[derive(Debug, Clone)]
pub struct Fsm {
    state: State,
    cfg: FsmConfig,
    /// ConnectRetryCounter.
    pub connect_retry_counter: u32,
    /// Negotiated hold time, seconds (0: no keepalives).
    pub hold_time: u16,
    delay_open_running: bool,
}

impl Fsm {
    pub fn new(cfg: FsmConfig) -> Self {
        Self {
            state: State::Idle,
            cfg,
            connect_retry_counter: 0,
            hold_time: 0,
            delay_open_running: false,
        }
    }

    pub fn state(&self) -> State {
        self.state
    }

    pub fn config(&self) -> FsmConfig {
        self.cfg
    }

    /// Whether the DelayOpenTimer runs (so an OPEN is event 20, not 19).
    pub fn delay_open_running(&self) -> bool {
        self.delay_open_running
    }

    /// Take one event; returns the actions in order. The state is
    /// [`Fsm::state`] afterwards.
    pub fn handle(&mut self, ev: Event) -> Vec<Action> {
        use Action as A;
        use Event as E;
        use State as S;
        let mut out = Vec::new();
        match (self.state, ev) {
            // ---------------- Idle ----------------
            (S::Idle, E::ManualStart | E::AutomaticStart | E::AutomaticStartDamped) => {
                self.connect_retry_counter = 0;
                out.push(A::StartConnectRetryTimer);
                if self.cfg.passive {
                    out.push(A::ListenTcp);
                    self.state = S::Active;
                } else {
                    out.push(A::InitiateTcp);
                    self.state = S::Connect;
                }
            }
            (
                S::Idle,
                E::ManualStartPassive | E::AutomaticStartPassive | E::AutomaticStartDampedPassive,
            ) => {
                self.connect_retry_counter = 0;
                out.push(A::StartConnectRetryTimer);
                out.push(A::ListenTcp);
                self.state = S::Active;
            }
            // The damping wait is over: the automatic start it delayed.
            (S::Idle, E::IdleHoldTimerExpires) => {
                out.push(A::StartConnectRetryTimer);
                if self.cfg.passive {
                    out.push(A::ListenTcp);
                    self.state = S::Active;
                } else {
                    out.push(A::InitiateTcp);
                    self.state = S::Connect;
                }
            }
            // Any other event in Idle changes nothing.
            (S::Idle, _) => {}

            // ---------------- Connect and Active ----------------
            (
                S::Connect | S::Active,
                E::ManualStart
                | E::AutomaticStart
                | E::ManualStartPassive
                | E::AutomaticStartPassive
                | E::AutomaticStartDamped
                | E::AutomaticStartDampedPassive,
            ) => {}
            (S::Connect | S::Active, E::ManualStop) => {
                out.extend([A::DropTcp, A::ReleaseResources, A::StopConnectRetryTimer]);
                if self.delay_open_running {
                    out.push(A::StopDelayOpenTimer);
                    self.delay_open_running = false;
                }
                self.connect_retry_counter = 0;
                self.state = S::Idle;
            }
            (S::Connect, E::ConnectRetryTimerExpires) => {
                out.push(A::DropTcp);
                out.push(A::StartConnectRetryTimer);
                if self.delay_open_running {
                    out.push(A::StopDelayOpenTimer);
                    self.delay_open_running = false;
                }
                out.push(A::InitiateTcp);
            }
            (S::Active, E::ConnectRetryTimerExpires) => {
                if self.cfg.passive {
                    // A passive session never connects: it keeps waiting.
                    out.push(A::StartConnectRetryTimer);
                } else {
                    out.push(A::StartConnectRetryTimer);
                    out.push(A::InitiateTcp);
                    self.state = S::Connect;
                }
            }
            (S::Connect | S::Active, E::DelayOpenTimerExpires) if self.delay_open_running => {
                self.delay_open_running = false;
                out.push(A::SendOpen);
                out.push(A::StartHoldTimer(LARGE_HOLD_TIME));
                self.state = S::OpenSent;
            }
            (S::Connect | S::Active, E::TcpConnectionValid) => out.push(A::AcceptTcp),
            (S::Connect | S::Active, E::TcpCrInvalid) => out.push(A::RejectTcp),
            (S::Connect | S::Active, E::TcpCrAcked | E::TcpConnectionConfirmed) => {
                out.push(A::StopConnectRetryTimer);
                if self.cfg.delay_open {
                    self.delay_open_running = true;
                    out.push(A::StartDelayOpenTimer);
                } else {
                    out.push(A::SendOpen);
                    out.push(A::StartHoldTimer(LARGE_HOLD_TIME));
                    self.state = S::OpenSent;
                }
            }
            (S::Connect, E::TcpConnectionFails) => {
                if self.delay_open_running {
                    self.delay_open_running = false;
                    out.extend([
                        A::StartConnectRetryTimer,
                        A::StopDelayOpenTimer,
                        A::ListenTcp,
                    ]);
                    self.state = S::Active;
                } else {
                    out.extend([A::StopConnectRetryTimer, A::DropTcp, A::ReleaseResources]);
                    out.push(A::StartIdleHoldTimer);
                    self.state = S::Idle;
                }
            }
            (S::Active, E::TcpConnectionFails) => {
                out.push(A::StartConnectRetryTimer);
                if self.delay_open_running {
                    self.delay_open_running = false;
                    out.push(A::StopDelayOpenTimer);
                }
                out.push(A::ReleaseResources);
                self.connect_retry_counter += 1;
                out.push(A::StartIdleHoldTimer);
                self.state = S::Idle;
            }
            (S::Connect | S::Active, E::BgpOpenWithDelayOpenTimer { hold_time })
                if self.delay_open_running =>
            {
                self.delay_open_running = false;
                out.extend([A::StopConnectRetryTimer, A::StopDelayOpenTimer]);
                out.extend([A::SendOpen, A::SendKeepalive]);
                self.hold_time = hold_time;
                if hold_time != 0 {
                    out.push(A::StartKeepaliveTimer);
                    out.push(A::StartHoldTimer(hold_time));
                } else {
                    out.push(A::StartHoldTimer(0));
                }
                self.state = S::OpenConfirm;
            }
            (S::Connect | S::Active, E::BgpHeaderErr(_) | E::BgpOpenMsgErr(_)) => {
                // SendNOTIFICATIONwithoutOPEN is false: no NOTIFICATION.
                out.extend([A::StopConnectRetryTimer, A::ReleaseResources, A::DropTcp]);
                self.connect_retry_counter += 1;
                out.push(A::StartIdleHoldTimer);
                self.delay_open_running = false;
                self.state = S::Idle;
            }
            (S::Connect | S::Active, E::NotifMsgVerErr) => {
                out.extend([A::StopConnectRetryTimer, A::ReleaseResources, A::DropTcp]);
                if self.delay_open_running {
                    self.delay_open_running = false;
                    out.push(A::StopDelayOpenTimer);
                } else {
                    self.connect_retry_counter += 1;
                }
                out.push(A::StartIdleHoldTimer);
                self.state = S::Idle;
            }
            // Any other event (8, 10, 11, 13, 19, 23, 25-28, and 12 or 20
            // without DelayOpen).
            (S::Connect | S::Active, _) => {
                out.push(A::StopConnectRetryTimer);
                if self.delay_open_running {
                    self.delay_open_running = false;
                    out.push(A::StopDelayOpenTimer);
                }
                out.extend([A::ReleaseResources, A::DropTcp]);
                self.connect_retry_counter += 1;
                out.push(A::StartIdleHoldTimer);
                self.state = S::Idle;
            }

            // ---------------- OpenSent ----------------
            (
                S::OpenSent | S::OpenConfirm | S::Established,
                E::ManualStart
                | E::AutomaticStart
                | E::ManualStartPassive
                | E::AutomaticStartPassive
                | E::AutomaticStartDamped
                | E::AutomaticStartDampedPassive,
            ) => {}
            (S::OpenSent | S::OpenConfirm | S::Established, E::ManualStop) => {
                out.push(A::SendNotification(Notification::new(
                    codes::CEASE,
                    codes::ADMINISTRATIVE_SHUTDOWN,
                )));
                out.extend([A::StopConnectRetryTimer, A::ReleaseResources, A::DropTcp]);
                self.connect_retry_counter = 0;
                self.state = S::Idle;
            }
            (S::OpenSent | S::OpenConfirm | S::Established, E::AutomaticStop(sub)) => {
                out.push(A::SendNotification(Notification::new(codes::CEASE, sub)));
                out.extend([A::StopConnectRetryTimer, A::ReleaseResources, A::DropTcp]);
                self.connect_retry_counter += 1;
                self.state = S::Idle;
            }
            (S::OpenSent | S::OpenConfirm | S::Established, E::HoldTimerExpires) => {
                out.push(A::SendNotification(Notification::new(
                    codes::HOLD_TIMER_EXPIRED,
                    0,
                )));
                self.fail(&mut out);
            }
            (
                S::OpenSent | S::OpenConfirm | S::Established,
                E::TcpConnectionValid | E::TcpCrAcked | E::TcpConnectionConfirmed,
            ) => out.push(A::TrackSecondConnection),
            (S::OpenSent | S::OpenConfirm | S::Established, E::TcpCrInvalid) => {}
            (S::OpenSent, E::TcpConnectionFails) => {
                out.extend([A::DropTcp, A::StartConnectRetryTimer, A::ListenTcp]);
                self.state = S::Active;
            }
            (S::OpenSent, E::BgpOpen { hold_time }) => {
                self.delay_open_running = false;
                out.push(A::StopConnectRetryTimer);
                out.push(A::SendKeepalive);
                self.hold_time = hold_time;
                if hold_time != 0 {
                    out.push(A::StartKeepaliveTimer);
                }
                out.push(A::StartHoldTimer(hold_time));
                self.state = S::OpenConfirm;
            }
            (S::OpenSent | S::OpenConfirm, E::BgpHeaderErr(n) | E::BgpOpenMsgErr(n)) => {
                out.push(A::SendNotification(n));
                self.fail(&mut out);
            }
            (S::OpenSent | S::OpenConfirm | S::Established, E::OpenCollisionDump) => {
                out.push(A::SendNotification(Notification::new(
                    codes::CEASE,
                    codes::CONNECTION_COLLISION_RESOLUTION,
                )));
                self.fail(&mut out);
            }
            (S::OpenSent | S::OpenConfirm, E::NotifMsgVerErr) => {
                out.extend([A::StopConnectRetryTimer, A::ReleaseResources, A::DropTcp]);
                out.push(A::StartIdleHoldTimer);
                self.state = S::Idle;
            }
            // Any other event (9, 11-13, 20, 25-28).
            (S::OpenSent, _) => {
                out.push(A::SendNotification(Notification::new(
                    codes::FSM,
                    codes::FSM_UNEXPECTED_IN_OPENSENT,
                )));
                self.fail(&mut out);
            }

            // ---------------- OpenConfirm ----------------
            (S::OpenConfirm | S::Established, E::KeepaliveTimerExpires) => {
                out.push(A::SendKeepalive);
                if self.hold_time != 0 {
                    out.push(A::StartKeepaliveTimer);
                }
            }
            (S::OpenConfirm, E::TcpConnectionFails | E::NotifMsg) => self.fail(&mut out),
            // A second OPEN on this connection: the collision function
            // (6.8) drops one of the two; on one connection, this one.
            (S::OpenConfirm, E::BgpOpen { .. }) => {
                out.push(A::SendNotification(Notification::new(
                    codes::CEASE,
                    codes::CONNECTION_COLLISION_RESOLUTION,
                )));
                self.fail(&mut out);
            }
            (S::OpenConfirm, E::KeepAliveMsg) => {
                out.push(A::StartHoldTimer(self.hold_time));
                out.push(A::SessionUp);
                self.state = S::Established;
            }
            // Any other event (9, 12, 13, 20, 27, 28).
            (S::OpenConfirm, _) => {
                out.push(A::SendNotification(Notification::new(
                    codes::FSM,
                    codes::FSM_UNEXPECTED_IN_OPENCONFIRM,
                )));
                self.fail(&mut out);
            }

            // ---------------- Established ----------------
            (S::Established, E::TcpConnectionFails | E::NotifMsgVerErr | E::NotifMsg) => {
                self.fail(&mut out)
            }
            (S::Established, E::KeepAliveMsg) => out.push(A::StartHoldTimer(self.hold_time)),
            (S::Established, E::UpdateMsg) => {
                out.push(A::ProcessUpdate);
                out.push(A::StartHoldTimer(self.hold_time));
            }
            // A header error is answered with what 6.1 says (Message
            // Header Error, the subcode and the bad field), in this state
            // as in the others, not with 8.2.2's FSM Error.
            (S::Established, E::UpdateMsgErr(n) | E::BgpHeaderErr(n)) => {
                out.push(A::SendNotification(n));
                self.fail(&mut out);
            }
            // Any other event (9, 12, 13, 19-22): with
            // CollisionDetectEstablishedState false, an OPEN on the
            // established connection is unexpected.
            (S::Established, _) => {
                out.push(A::SendNotification(Notification::new(
                    codes::FSM,
                    codes::FSM_UNEXPECTED_IN_ESTABLISHED,
                )));
                self.fail(&mut out);
            }
        }
        out
    }

    /// The common error exit of OpenSent, OpenConfirm and Established:
    /// ConnectRetryTimer to zero, resources released, connection dropped,
    /// counter incremented, damped restart, Idle.
    fn fail(&mut self, out: &mut Vec<Action>) {
        out.extend([
            Action::StopConnectRetryTimer,
            Action::ReleaseResources,
            Action::DropTcp,
        ]);
        self.connect_retry_counter += 1;
        self.delay_open_running = false;
        out.push(Action::StartIdleHoldTimer);
        self.state = State::Idle;
    }
}

#[cfg(test)]
mod tests;
