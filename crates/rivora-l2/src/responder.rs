//! The responder of one interface: answers ARP requests and neighbour
//! solicitations for the addresses it is given, each only while that
//! address's [`Fence`] is open, and sends announcements on demand.
//!
//! The fence is checked right before each frame is sent, against the
//! clock, not against a flag a timer flips: a holder whose renewals have
//! stopped falls quiet at its deadline even if the runtime is late.

use std::collections::{BTreeSet, HashMap};
use std::io;
use std::net::{IpAddr, Ipv6Addr, UdpSocket};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Instant;

use prometheus_client::metrics::counter::Counter;
use tokio::sync::watch;
use tracing::{debug, warn};

use crate::frames::{self, Mac, Query};
use crate::socket::PacketSocket;

/// When an address may be answered for.
#[derive(Debug, Clone)]
pub enum Fence {
    /// Always (the static path: no Lease).
    Always,
    /// Until the instant the Lease's holder must be quiet by (None: this
    /// node does not hold it).
    Until(watch::Receiver<Option<Instant>>),
    /// While any of these is: an address this node answers for under two
    /// Leases at once (a shared group's and the address's own, while one
    /// hands it to the other), answered until the later falls.
    Any(Vec<Fence>),
}

impl Fence {
    pub fn open(&self, now: Instant) -> bool {
        match self {
            Fence::Always => true,
            Fence::Until(rx) => rx.borrow().is_some_and(|until| now < until),
            Fence::Any(all) => all.iter().any(|f| f.open(now)),
        }
    }

    /// This fence or `other`, whichever is open.
    pub fn or(self, other: Fence) -> Fence {
        match self {
            Fence::Any(mut all) => {
                all.push(other);
                Fence::Any(all)
            }
            one => Fence::Any(vec![one, other]),
        }
    }
}

/// The addresses answered for on one interface, each with its fence.
pub type Answers = HashMap<IpAddr, Fence>;

/// An interface the speaker answers on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interface {
    pub name: String,
    pub ifindex: u32,
    pub mac: Mac,
}

/// What the responders count, shared by all of them (metrics).
#[derive(Debug, Clone, Default)]
pub struct Counters {
    pub replies_v4: Counter,
    pub replies_v6: Counter,
    pub gratuitous: Counter,
}

/// Joined IPv6 multicast groups: the solicited-node group of each IPv6
/// address answered for, so that solicitations sent there reach this
/// interface. Joined at the IPv6 layer (not PACKET_ADD_MEMBERSHIP): the
/// kernel then also reports the membership by MLD, which a switch that
/// snoops MLD needs before it forwards the group to this port.
struct Groups {
    socket: Option<UdpSocket>,
    joined: BTreeSet<Ipv6Addr>,
}

pub struct Responder {
    iface: Interface,
    arp: PacketSocket,
    ns: Option<PacketSocket>,
    answers: RwLock<Arc<Answers>>,
    groups: Mutex<Groups>,
    counters: Counters,
}

impl Responder {
    /// Open the sockets of `iface`. Without IPv6 on the interface (no
    /// IPv6 socket can be had) it answers ARP alone, and says so.
    pub fn open(iface: Interface, counters: Counters) -> io::Result<Arc<Self>> {
        let arp = PacketSocket::arp(iface.ifindex)?;
        let (ns, socket) = match (
            PacketSocket::neighbour_solicitations(iface.ifindex),
            UdpSocket::bind("[::]:0"),
        ) {
            (Ok(ns), Ok(u)) => (Some(ns), Some(u)),
            (ns, u) => {
                warn!(
                    interface = %iface.name,
                    packet = ?ns.err(),
                    udp = ?u.err(),
                    "no IPv6 here: neighbour solicitations are not answered on this interface"
                );
                (None, None)
            }
        };
        Ok(Arc::new(Self {
            iface,
            arp,
            ns,
            answers: RwLock::new(Arc::new(Answers::new())),
            groups: Mutex::new(Groups {
                socket,
                joined: BTreeSet::new(),
            }),
            counters,
        }))
    }

    pub fn interface(&self) -> &Interface {
        &self.iface
    }

    /// Answer for these from now on (and join their solicited-node
    /// groups, leaving those no longer needed).
    pub fn set_answers(&self, answers: Answers) {
        let wanted: BTreeSet<Ipv6Addr> = answers
            .keys()
            .filter_map(|a| match a {
                IpAddr::V6(v6) => Some(frames::solicited_node(*v6)),
                IpAddr::V4(_) => None,
            })
            .collect();
        {
            let mut g = self.groups.lock().unwrap_or_else(PoisonError::into_inner);
            let Groups { socket, joined } = &mut *g;
            if let Some(s) = socket.as_ref() {
                for group in wanted.difference(joined) {
                    if let Err(e) = s.join_multicast_v6(group, self.iface.ifindex) {
                        warn!(interface = %self.iface.name, %group, error = %e, "joining a solicited-node group");
                    }
                }
                for group in joined.difference(&wanted) {
                    if let Err(e) = s.leave_multicast_v6(group, self.iface.ifindex) {
                        debug!(interface = %self.iface.name, %group, error = %e, "leaving a solicited-node group");
                    }
                }
                *joined = wanted;
            }
        }
        *self.answers.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(answers);
    }

    fn answers(&self) -> Arc<Answers> {
        self.answers
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Send `frame` if `fence` is open this instant.
    fn send_fenced(&self, fence: &Fence, frame: &[u8]) -> bool {
        if !fence.open(Instant::now()) {
            return false;
        }
        let sock = if frame.get(12..14) == Some(&[0x86, 0xdd]) {
            match &self.ns {
                Some(s) => s,
                None => return false,
            }
        } else {
            &self.arp
        };
        match sock.send(frame) {
            Ok(()) => true,
            Err(e) => {
                warn!(interface = %self.iface.name, error = %e, "sending a frame");
                false
            }
        }
    }

    /// Announce each of `addrs` whose fence is open: gratuitous ARP in
    /// both forms, an unsolicited advertisement. Returns the frames sent.
    pub fn announce(&self, addrs: &[IpAddr]) -> u64 {
        let answers = self.answers();
        let mut sent = 0;
        for a in addrs {
            let Some(fence) = answers.get(a) else {
                continue;
            };
            for f in frames::announcements(self.iface.mac, *a) {
                if self.send_fenced(fence, &f) {
                    self.counters.gratuitous.inc();
                    sent += 1;
                }
            }
        }
        sent
    }

    /// Answer one received frame, if it asks for an address answered for
    /// and its fence is open.
    fn handle(&self, frame: &[u8]) {
        let Some(q) = frames::parse(frame) else {
            return;
        };
        let answers = self.answers();
        let Some(fence) = answers.get(&q.target()) else {
            return;
        };
        let Some(reply) = frames::answer(self.iface.mac, &q) else {
            return;
        };
        if self.send_fenced(fence, &reply) {
            match q {
                Query::Arp { .. } => self.counters.replies_v4.inc(),
                Query::Ns { .. } => self.counters.replies_v6.inc(),
            };
        }
    }

    /// Receive and answer until the sockets fail.
    pub async fn run(self: Arc<Self>) {
        let mut arp_buf = vec![0u8; 2048];
        let mut ns_buf = vec![0u8; 2048];
        loop {
            let got = tokio::select! {
                r = self.arp.recv(&mut arp_buf) => r.map(|n| (false, n)),
                r = async {
                    match &self.ns {
                        Some(s) => s.recv(&mut ns_buf).await.map(|n| (true, n)),
                        None => std::future::pending().await,
                    }
                } => r,
            };
            match got {
                Ok((false, n)) => self.handle(&arp_buf[..n]),
                Ok((true, n)) => self.handle(&ns_buf[..n]),
                Err(e) => {
                    warn!(interface = %self.iface.name, error = %e, "receiving; the responder stops");
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn an_address_under_two_leases_is_answered_while_either_fence_is_open() {
        let now = Instant::now();
        let s = Duration::from_secs(1);
        let (shared, shared_rx) = watch::channel(None);
        let (_own, own_rx) = watch::channel(Some(now + s));
        let f = Fence::Until(shared_rx).or(Fence::Until(own_rx));
        assert!(f.open(now));
        assert!(!f.open(now + s), "both closed at the own Lease's deadline");
        shared.send_replace(Some(now + 2 * s));
        assert!(f.open(now + s));
        assert!(!f.open(now + 2 * s));
        assert!(Fence::Until(watch::channel(None).1)
            .or(Fence::Always)
            .open(now));
    }
}
