//! The next-hop cache's source of facts: what bpf_fib_lookup would answer
//! for each backend address, resolved from the kernel's routes, neighbours
//! and links, and resolved again whenever netlink reports a change (links,
//! addresses, neighbours, routes, rules, forwarding settings) or the
//! datapath reports a miss (`nh_miss_map`, polled). It writes nothing: it
//! sends the whole table to the reconciler (`Command::NextHops`), whose
//! writer rewrites the backend entries whose next hop changed.
//!
//! A next hop is cached only where one answer per destination is the
//! FIB's answer for every packet: no policy rules beyond the kernel's
//! defaults and a route with one next hop (else routing may depend on
//! the client's address or the flow's hash), forwarding on for every attached
//! interface (the FIB checks the ingress one), a unicast route. Anything
//! else leaves the backend without a cached next hop, and the datapath
//! asks the FIB for each packet, as it always did.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tracing::{debug, info, warn};

use crate::abi::rv_nh_miss;
use crate::dataplane::render::NextHop;
use crate::dataplane::Maps;
use crate::netlink::{self, Changes, Link, Netlink, NetlinkError};
use crate::reconciler::status::StatusReader;
use crate::reconciler::Command;

/// How often the datapath's misses are read (and how long a burst of
/// notifications is let settle before resolving).
const POLL: Duration = Duration::from_millis(20);
const MISS_POLL: Duration = Duration::from_millis(100);
/// An address that missed is probed (the kernel made to resolve it) at
/// most this often.
const PROBE_EVERY: Duration = Duration::from_secs(1);

/// What the resolution of every address shares.
struct Ctx {
    /// Interfaces rivorad is attached to, by ifindex.
    attached: BTreeSet<u32>,
    /// Of those, the ones it runs on as generic XDP: no redirect into
    /// them (no XDP transmit), XDP_TX out of them only.
    generic: BTreeSet<u32>,
    links: HashMap<u32, Link>,
    /// Per family (false: IPv4): whether one answer per destination is
    /// the FIB's, and forwarding is on for every attached interface.
    cacheable: [bool; 2],
    forwarding: [bool; 2],
}

fn sysctl_on(path: &str) -> bool {
    std::fs::read_to_string(path).is_ok_and(|v| v.trim() != "0")
}

impl Ctx {
    fn gather(
        nl: &mut Netlink,
        attached: BTreeSet<u32>,
        generic: BTreeSet<u32>,
    ) -> Result<Self, NetlinkError> {
        let mut links = HashMap::new();
        let mut forwarding = [true, true];
        for ifindex in &attached {
            if let Some(l) = nl.link_by_index(*ifindex)? {
                for (i, fam) in ["ipv4", "ipv6"].iter().enumerate() {
                    let p = format!("/proc/sys/net/{fam}/conf/{}/forwarding", l.name);
                    forwarding[i] &= sysctl_on(&p);
                }
                links.insert(*ifindex, l);
            } else {
                forwarding = [false, false];
            }
        }
        let cacheable = [!nl.policy_rules(false)?, !nl.policy_rules(true)?];
        Ok(Self {
            attached,
            generic,
            links,
            cacheable,
            forwarding,
        })
    }
}

/// Why an address has no cached next hop (the datapath asks the FIB).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Uncached {
    /// Routing that one answer per destination cannot stand for.
    Routing,
    /// No unicast route: the FIB refuses each packet itself.
    NoRoute,
    /// The neighbour is not resolved yet: probed, resolved again.
    Neighbour,
}

/// The next hop bpf_fib_lookup would give a forwarded packet to `addr`.
fn resolve(
    nl: &mut Netlink,
    ctx: &mut Ctx,
    addr: IpAddr,
) -> Result<Result<NextHop, Uncached>, NetlinkError> {
    let fam = usize::from(addr.is_ipv6());
    if !ctx.cacheable[fam] {
        return Ok(Err(Uncached::Routing));
    }
    let Some(route) = nl.route_get(addr)? else {
        return Ok(Err(Uncached::NoRoute));
    };
    let Some(oif) = route.oif.filter(|_| route.unicast) else {
        return Ok(Err(Uncached::NoRoute));
    };
    if nl.route_is_multipath(addr)? {
        return Ok(Err(Uncached::Routing));
    }
    // The FIB refuses to forward (FWD_DISABLED), or sends out of an
    // interface no redirect can reach: either way the kernel's packet.
    if !ctx.forwarding[fam] || !ctx.attached.contains(&oif) {
        return Ok(Ok(NextHop::kernel(oif)));
    }
    let link = match ctx.links.get(&oif) {
        Some(l) => l.clone(),
        None => match nl.link_by_index(oif)? {
            Some(l) => {
                ctx.links.insert(oif, l.clone());
                l
            }
            None => return Ok(Err(Uncached::NoRoute)),
        },
    };
    let Some(smac) = link.mac else {
        return Ok(Ok(NextHop::kernel(oif)));
    };
    // The MTU the FIB checks: a locked route's, else the device's (for
    // IPv6 its mtu6 setting).
    let mtu = match route.locked_mtu {
        Some(m) => m,
        None if addr.is_ipv6() => {
            let p = format!("/proc/sys/net/ipv6/conf/{}/mtu", link.name);
            std::fs::read_to_string(p)
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .or(link.mtu)
                .unwrap_or(1280)
        }
        None => link.mtu.unwrap_or(1500),
    };
    let hop = route.next_hop();
    let neigh = nl
        .neighbours(hop.is_ipv6())?
        .into_iter()
        .find(|n| n.addr == hop && n.ifindex == oif && n.usable());
    Ok(match neigh.and_then(|n| n.mac) {
        Some(dmac) => {
            let mut hop = NextHop::send(oif, mtu, dmac.0, smac.0);
            if ctx.generic.contains(&oif) {
                hop.flags |= NextHop::TX_ONLY;
            }
            Ok(hop)
        }
        None => Err(Uncached::Neighbour),
    })
}

/// Next hops by address, and why the others have none.
type Resolved = (HashMap<IpAddr, NextHop>, BTreeMap<IpAddr, Uncached>);

/// Resolve every address; the table to send, and what to probe.
fn resolve_all(
    nl: &mut Netlink,
    attached: &Attached,
    addrs: &BTreeSet<IpAddr>,
) -> Result<Resolved, NetlinkError> {
    let mut ctx = Ctx::gather(nl, attached.all.clone(), attached.generic.clone())?;
    let mut table = HashMap::new();
    let mut uncached = BTreeMap::new();
    for a in addrs {
        match resolve(nl, &mut ctx, *a)? {
            Ok(nh) => {
                table.insert(*a, nh);
            }
            Err(why) => {
                uncached.insert(*a, why);
            }
        }
    }
    Ok((table, uncached))
}

/// The interfaces rivorad is attached to, and which of them as generic
/// XDP (no redirect reaches those: they have no XDP transmit).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Attached {
    pub all: BTreeSet<u32>,
    pub generic: BTreeSet<u32>,
}

/// Backend addresses by backend id, and the attached interfaces, from the
/// reconciler's published status.
fn wanted(status: &StatusReader) -> (BTreeMap<u32, IpAddr>, Attached) {
    let s = status.current();
    let mut ids = BTreeMap::new();
    for v in &s.vips {
        for b in &v.backends {
            ids.insert(b.backend_id, b.target.addr);
        }
    }
    let attached = Attached {
        all: s.interfaces.iter().map(|i| i.ifindex).collect(),
        generic: s
            .interfaces
            .iter()
            .filter(|i| i.xdp_mode == Some(crate::dataplane::XdpMode::Generic))
            .map(|i| i.ifindex)
            .collect(),
    };
    (ids, attached)
}

/// The watcher: runs on a thread of its own (in rivorad's network
/// namespace) until the reconciler goes away.
pub struct Watcher {
    pub status: StatusReader,
    pub tx: mpsc::Sender<Command>,
    pub pin_dir: PathBuf,
}

impl Watcher {
    pub fn spawn(self) -> std::io::Result<std::thread::JoinHandle<()>> {
        std::thread::Builder::new()
            .name("nexthops".into())
            .spawn(move || {
                let tx = self.tx.clone();
                if let Err(e) = self.run() {
                    warn!(error = %e, "next-hop watcher stopped: every packet asks the FIB from now on");
                    // Nobody keeps the cache current any more: what it
                    // holds could go out of date unseen, so it goes.
                    let _ = tx.send(Command::NextHops(HashMap::new()));
                }
            })
    }

    fn run(self) -> Result<(), NetlinkError> {
        let mut changes = Changes::open()?;
        let mut nl = Netlink::open()?;
        let maps = Maps::open(&self.pin_dir).ok();
        if maps.is_none() {
            warn!("next-hop watcher: no pinned maps to read misses from");
        }
        let mut sent: Option<HashMap<IpAddr, NextHop>> = None;
        let mut known: (BTreeMap<u32, IpAddr>, Attached) = Default::default();
        let mut misses: HashMap<u32, u64> = HashMap::new();
        let mut probed: HashMap<IpAddr, Instant> = HashMap::new();
        let mut uncached: BTreeMap<IpAddr, Uncached> = BTreeMap::new();
        let mut last_miss_poll = Instant::now();
        let mut dirty = true;
        loop {
            if changes.wait(POLL)? > 0 {
                dirty = true;
                // Let a burst (a route change brings several) settle.
                while changes.wait(Duration::from_millis(2))? > 0 {}
            }
            if self.status.closed() {
                return Ok(());
            }
            let now = wanted(&self.status);
            if now != known {
                known = now;
                dirty = true;
            }
            if last_miss_poll.elapsed() >= MISS_POLL {
                last_miss_poll = Instant::now();
                if let Some(m) = &maps {
                    for (id, addr) in &known.0 {
                        let n: u64 = m
                            .nh_miss_map
                            .get_percpu::<u32, rv_nh_miss>(id)
                            .unwrap_or_default()
                            .iter()
                            .map(|c| c.packets)
                            .sum();
                        let before = misses.insert(*id, n).unwrap_or(n);
                        if n > before && uncached.get(addr) != Some(&Uncached::Routing) {
                            // Missed since: resolve again, and make the
                            // kernel resolve a neighbour it lacks.
                            dirty = true;
                            if probed.get(addr).is_none_or(|t| t.elapsed() >= PROBE_EVERY) {
                                probed.insert(*addr, Instant::now());
                                netlink::probe(*addr);
                            }
                        }
                    }
                }
            }
            if !dirty {
                continue;
            }
            dirty = false;
            let addrs: BTreeSet<IpAddr> = known.0.values().copied().collect();
            let t = Instant::now();
            let (mut table, why) = resolve_all(&mut nl, &known.1, &addrs)?;
            // A neighbour that went away: what was cached stays in the
            // entry, marked stale, until it is resolved again.
            for (a, w) in &why {
                if *w == Uncached::Neighbour {
                    if let Some(prev) = sent.as_ref().and_then(|s| s.get(a)) {
                        table.insert(*a, prev.stale());
                    }
                }
            }
            uncached = why;
            if sent.as_ref() != Some(&table) {
                debug!(
                    addresses = addrs.len(),
                    cached = table.len(),
                    resolve_us = t.elapsed().as_micros() as u64,
                    "next hops changed"
                );
                if sent.is_none() {
                    info!(
                        addresses = addrs.len(),
                        cached = table.len(),
                        "next hops resolved"
                    );
                }
                if self.tx.send(Command::NextHops(table.clone())).is_err() {
                    return Ok(());
                }
                sent = Some(table);
            }
        }
    }
}

/// The next hops of `addrs` as the watcher would resolve them now, for
/// interfaces `attached`, all native XDP (the bench and the tests compare
/// them with bpf_fib_lookup's answers). Addresses with none are left out.
pub fn resolve_now(
    attached: &BTreeSet<u32>,
    addrs: &BTreeSet<IpAddr>,
) -> Result<HashMap<IpAddr, NextHop>, NetlinkError> {
    resolve_now_with(
        &Attached {
            all: attached.clone(),
            generic: BTreeSet::new(),
        },
        addrs,
    )
}

/// [`resolve_now`], some of the interfaces generic XDP.
pub fn resolve_now_with(
    attached: &Attached,
    addrs: &BTreeSet<IpAddr>,
) -> Result<HashMap<IpAddr, NextHop>, NetlinkError> {
    let mut nl = Netlink::open()?;
    let (table, why) = resolve_all(&mut nl, attached, addrs)?;
    if std::env::var_os("RIVORA_NEXTHOP_DEBUG").is_some() {
        eprintln!("next hops: {table:?}; uncached: {why:?}");
    }
    Ok(table)
}
