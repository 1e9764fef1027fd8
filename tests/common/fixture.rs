//! Maps filled the way rivorad fills them: `Vip` values handed to the real
//! map writer (`rivora::dataplane::Writer`) over the test's pinned maps, so
//! the packets meet the writer's output (service ids, backend ids, Maglev
//! slices, flags) and not a hand-written imitation of it.
//!
//! What a test expects is taken from the maps as they were written (the
//! slice read back from `maglev_table`, the health read back from
//! `backend_health_map`) and the flow hash written again in
//! `common::flow_hash`: an oracle independent of the writer's renderer, so
//! a renderer bug and a datapath bug cannot cancel out.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use rivora::abi::*;
use rivora::dataplane::{LoadOptions, Maps, Probe, Writer};
use rivora::model::{
    Affinity, Backend, BackendTarget, Mac, Mode, NodeSettings, Ports, Protocol, RateLimit, Vip,
};

use super::fixtures::Be;
use super::{flow_hash, TestDp};

/// A backend state as the tests name it; the writer derives it from a
/// probe result and a drain flag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Healthy,
    Draining,
    Down,
}

impl State {
    fn abi(self) -> rv_health {
        match self {
            State::Healthy => rv_health::RV_HEALTH_HEALTHY,
            State::Draining => rv_health::RV_HEALTH_DRAINING,
            State::Down => rv_health::RV_HEALTH_DOWN,
        }
    }
}

/// Where the writer put a VIP: its service id and the backend ids,
/// parallel to `Vip::backends`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placed {
    pub svc: u32,
    pub ids: Vec<u32>,
}

/// A loaded datapath and a writer over its pinned maps. The writer sits
/// in a RefCell so that a test can hold `&fx.t` while it changes what the
/// writer wrote.
pub struct Fx {
    pub t: TestDp,
    pub w: RefCell<Writer<Maps>>,
}

impl Default for Fx {
    fn default() -> Self {
        Self::new()
    }
}

impl Fx {
    pub fn new() -> Self {
        Self::from_dp(TestDp::new())
    }

    pub fn with_options(opts: LoadOptions) -> Self {
        Self::from_dp(TestDp::with_options(opts))
    }

    fn from_dp(t: TestDp) -> Self {
        let w = Writer::open_pinned(&t.pin_dir).expect("the writer over the test's pinned maps");
        Self {
            t,
            w: RefCell::new(w),
        }
    }

    /// Create or update one VIP and reclaim what the update retired (old
    /// slices, backends no VIP lists), as the reconciler does after a
    /// batch; returns where it lives.
    pub fn apply(&self, vip: &Vip) -> Placed {
        self.w
            .borrow_mut()
            .upsert_vip(vip)
            .unwrap_or_else(|e| panic!("upsert {}: {e}", vip.key()));
        self.w.borrow_mut().reclaim().expect("reclaim");
        self.placed(vip)
    }

    pub fn placed(&self, vip: &Vip) -> Placed {
        let a = self
            .w
            .borrow()
            .allocations()
            .remove(&vip.key())
            .unwrap_or_else(|| panic!("{} not placed", vip.key()));
        Placed {
            svc: a.svc_id,
            ids: a.backend_ids,
        }
    }

    pub fn remove(&self, vip: &Vip) {
        assert!(
            self.w
                .borrow_mut()
                .remove_vip(&vip.key())
                .expect("remove_vip"),
            "{} was not there",
            vip.key()
        );
        self.w.borrow_mut().reclaim().expect("reclaim");
    }

    /// Rewrite `vip` with new backend weights (parallel to its
    /// backends), everything else kept. A weight of 0 takes a backend out
    /// of the slice but keeps its id and health, so established flows
    /// (affinity, fragments) still reach it; the ids must not move.
    pub fn reweight(&self, vip: &mut Vip, weights: &[u32]) -> Placed {
        assert_eq!(weights.len(), vip.backends.len(), "one weight a backend");
        let before = self.placed(vip);
        for (b, w) in vip.backends.iter_mut().zip(weights) {
            b.weight = *w;
        }
        let after = self.apply(vip);
        assert_eq!(
            after,
            before,
            "{}: a weight change keeps the service and backend ids",
            vip.key()
        );
        after
    }

    /// Change the node settings the writer holds with `f`, and write them.
    pub fn edit_node(&self, f: impl FnOnce(&mut NodeSettings)) {
        let mut node = self.w.borrow().node().clone();
        f(&mut node);
        self.node(&node);
    }

    /// The interface's MAC (DSR's and FIB-forwarding's source; also what
    /// says the interface is one rivorad is attached to).
    pub fn iface_mac(&self, ifindex: u32, mac: [u8; 6]) {
        self.edit_node(|n| {
            n.interface_macs.insert(ifindex, Mac(mac));
        });
    }

    /// Say rivorad's XDP on the interface is generic (true) or native.
    pub fn generic_xdp(&self, ifindex: u32, generic: bool) {
        self.edit_node(|n| {
            if generic {
                n.generic_xdp.insert(ifindex);
            } else {
                n.generic_xdp.remove(&ifindex);
            }
        });
    }

    pub fn no_iface_mac(&self, ifindex: u32) {
        self.edit_node(|n| {
            n.interface_macs.remove(&ifindex);
        });
    }

    /// L3 DSR's outer source addresses (None: not configured).
    pub fn tunnel(&self, src4: Option<Ipv4Addr>, src6: Option<Ipv6Addr>) {
        self.edit_node(|n| {
            n.tunnel_src4 = src4;
            n.tunnel_src6 = src6;
        });
    }

    pub fn node(&self, node: &NodeSettings) {
        self.w.borrow_mut().set_node(node).expect("set_node");
    }

    /// Put every backend id of `addr:port` into `state` through the
    /// writer's probe and drain inputs, and check that the map says so.
    pub fn set_state(&self, addr: IpAddr, port: u16, state: State) {
        let t = BackendTarget { addr, port };
        let probe = if state == State::Down {
            Probe::Down
        } else {
            Probe::Up
        };
        let n = self
            .w
            .borrow_mut()
            .set_health(&t, probe)
            .expect("set_health");
        assert!(n > 0, "{t} is no backend of any VIP");
        self.w
            .borrow_mut()
            .set_drain(&t, state == State::Draining)
            .expect("set_drain");
        let ids: Vec<u32> = self
            .w
            .borrow()
            .allocations()
            .values()
            .flat_map(|a| a.backend_ids.clone())
            .collect();
        for id in ids {
            let Some(b) = self.backend_entry(id) else {
                continue;
            };
            if b == (addr, port) {
                assert_eq!(self.health(id), state.abi(), "{t}: backend_health_map");
            }
        }
    }

    /// (address, port) of a backend id, read from the backend maps.
    pub fn backend_entry(&self, id: u32) -> Option<(IpAddr, u16)> {
        let m = &self.t.maps;
        if let Some(b) = m
            .backend_map
            .get::<u32, rv_backend>(&id)
            .expect("backend_map")
        {
            if b.addr != 0 {
                return Some((IpAddr::V4(ipv4_from_be32(b.addr)), port_from_be16(b.port)));
            }
        }
        if let Some(b) = m
            .backend_map6
            .get::<u32, rv_backend6>(&id)
            .expect("backend_map6")
        {
            if b.addr != [0; 4] {
                return Some((IpAddr::V6(ipv6_from_be32x4(b.addr)), port_from_be16(b.port)));
            }
        }
        None
    }

    /// The health state backend_health_map holds for an id (an id with
    /// no entry reads as down, as the datapath reads it).
    pub fn health(&self, id: u32) -> rv_health {
        self.t
            .maps
            .backend_health_map
            .get::<u32, rv_backend_health>(&id)
            .expect("backend_health_map")
            .map_or(rv_health::RV_HEALTH_DOWN, |h| rv_health(u32::from(h.state)))
    }

    /// The service entry as the maps hold it.
    pub fn service(&self, svc: u32) -> rv_service {
        self.t
            .maps
            .service_config_map
            .get(&svc)
            .expect("service_config_map")
            .unwrap_or_else(|| panic!("no service {svc}"))
    }

    /// One slot of maglev_table.
    fn slot(&self, i: u32) -> u32 {
        self.t
            .maps
            .maglev_table
            .get::<u32, rv_maglev_slot>(&i)
            .expect("maglev_table")
            .map_or(0, |v| v.backend_id)
    }

    /// The service's Maglev slice as the maps hold it.
    /// Every entry the maps hold, read back by the writer's decoder.
    pub fn image(&self) -> rivora::dataplane::render::MapImage {
        self.w.borrow().read_maps().expect("reading the maps")
    }

    pub fn slice(&self, svc: u32) -> Vec<u32> {
        let s = self.service(svc);
        (s.slice_start..s.slice_start + s.slice_len)
            .map(|i| self.slot(i))
            .collect()
    }

    /// Which backend id a new flow of `svc` must get: the hashed slot of
    /// the slice read back from the maps, stepping over empty, draining
    /// and down slots for at most RV_MAGLEV_PROBES slots (bpf/lib/lb.h's
    /// rv_maglev_pick, from its description). None: a counted drop. Reads
    /// the window's slots only: slices run to thousands of slots.
    pub fn pick(&self, svc: u32, hash: u32) -> Option<u32> {
        let s = self.service(svc);
        let len = s.slice_len;
        assert!(len > 0, "service {svc} has an empty slice");
        let start = hash % len;
        (0..MAGLEV_PROBES)
            .map(|i| self.slot(s.slice_start + (start + i) % len))
            .find(|&id| id != 0 && self.health(id) == rv_health::RV_HEALTH_HEALTHY)
    }

    /// `pick` for a client's 5-tuple flow (no clientIP affinity).
    pub fn pick_flow(
        &self,
        svc: u32,
        client: IpAddr,
        sport: u16,
        dport: u16,
        proto: u8,
    ) -> Option<u32> {
        self.pick(svc, flow_hash(client, sport, dport, proto, false))
    }

    /// Every backend id the writer placed, with the (address, port) the
    /// backend maps hold for it.
    pub fn backend_ids(&self) -> BTreeMap<u32, (IpAddr, u16)> {
        let ids: Vec<u32> = self
            .w
            .borrow()
            .allocations()
            .values()
            .flat_map(|a| a.backend_ids.clone())
            .collect();
        ids.into_iter()
            .filter_map(|id| self.backend_entry(id).map(|b| (id, b)))
            .collect()
    }
}

// Building `Vip` values.

/// A VIP on one port with no affinity and no rate limit of its own.
pub fn vip(addr: IpAddr, port: u16, proto: u8, mode: Mode, backends: Vec<Backend>) -> Vip {
    Vip {
        addr,
        ports: Ports::One(port),
        proto: Protocol::from_number(proto).expect("TCP or UDP"),
        mode,
        affinity: Affinity::None,
        rate_limit: None,
        source_ranges: None,
        backends,
    }
}

/// A VIP over a port range.
pub fn vip_range(
    addr: IpAddr,
    first: u16,
    last: u16,
    proto: u8,
    mode: Mode,
    backends: Vec<Backend>,
) -> Vip {
    Vip {
        ports: Ports::Range { first, last },
        ..vip(addr, first, proto, mode, backends)
    }
}

/// A backend of weight 1; port 0 keeps the VIP's port.
pub fn backend(addr: IpAddr, port: u16, mac: [u8; 6]) -> Backend {
    Backend {
        addr,
        port,
        weight: 1,
        mac: Some(Mac(mac)),
        mode: None,
        node: None,
    }
}

pub fn weighted(b: Backend, weight: u32) -> Backend {
    Backend { weight, ..b }
}

pub fn with_affinity(v: Vip, timeout_s: u32) -> Vip {
    Vip {
        affinity: Affinity::ClientIp { timeout_s },
        ..v
    }
}

pub fn with_rate_limit(v: Vip, rate_per_sec: u32, burst: u32) -> Vip {
    Vip {
        rate_limit: Some(RateLimit {
            rate_per_sec,
            burst,
        }),
        ..v
    }
}

/// Single-backend VIPs a test knows by a name (a number), as the writer
/// placed them: `named[&name]` is the backend (with the id the writer
/// gave it), `named.id(name)` the service id.
#[derive(Default)]
pub struct Named {
    be: BTreeMap<u32, Be>,
    svc: BTreeMap<u32, u32>,
}

impl std::ops::Index<&u32> for Named {
    type Output = Be;

    fn index(&self, name: &u32) -> &Be {
        self.be
            .get(name)
            .unwrap_or_else(|| panic!("no VIP named {name}"))
    }
}

impl Named {
    /// The service id of the VIP named `name`.
    pub fn id(&self, name: u32) -> u32 {
        *self
            .svc
            .get(&name)
            .unwrap_or_else(|| panic!("no VIP named {name}"))
    }
}

impl Fx {
    /// Write VIP `addr:port/proto` in `mode` with the one backend `be`
    /// (its `id` is ignored: the writer chooses), and record both under
    /// `name`.
    pub fn add_named(
        &self,
        named: &mut Named,
        name: u32,
        mode: Mode,
        (addr, port, proto): (IpAddr, u16, u8),
        be: Be,
    ) {
        let b = backend(be.addr, be.port, be.mac);
        let placed = self.apply(&vip(addr, port, proto, mode, vec![b]));
        named.be.insert(
            name,
            Be {
                id: placed.ids[0],
                ..be
            },
        );
        named.svc.insert(name, placed.svc);
    }
}
