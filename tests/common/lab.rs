//! The test's own datapath on a lab: [`Lab`] builds a
//! [`Topology`](super::topology::Topology), loads the real datapath,
//! attaches it to the node's `n0` and fills its maps itself (one TCP and
//! one UDP service per family). Tests that run the real rivorad on the
//! node use the topology alone.

use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};

use rivora::abi::{rv_family, rv_mode};
use rivora::dataplane::attach::ifindex;
use rivora::dataplane::{AttachedLink, XdpMode};

pub use super::topology::{Backend, Mode, Topology, NAT_BACKEND_PORT, VIP_PORT};
use super::{flow_hash, TestDp, PROTO_TCP, PROTO_UDP};

fn rv(mode: Mode) -> rv_mode {
    match mode {
        Mode::Nat => rv_mode::RV_MODE_NAT,
        Mode::Dsr => rv_mode::RV_MODE_DSR,
        Mode::L3Dsr => rv_mode::RV_MODE_L3DSR,
        Mode::FullNat => rv_mode::RV_MODE_FULLNAT,
    }
}

/// Backends per lab.
pub const BACKENDS: usize = 3;
/// Maglev slots per backend in each service's slice.
pub const SLOTS_PER_BACKEND: usize = 7;

/// Service ids: one per (family, protocol).
pub const SVC_V4_TCP: u32 = 1;
pub const SVC_V4_UDP: u32 = 2;
pub const SVC_V6_TCP: u32 = 3;
pub const SVC_V6_UDP: u32 = 4;

/// A [`Topology`] with the real datapath loaded by the test itself and
/// attached to the node's `n0`, its maps filled for one TCP and one UDP
/// service per family. Dereferences to its topology.
pub struct Lab {
    // Dropped in declaration order: the node's links first (detach), then
    // the datapath pins, then the topology.
    links: Vec<AttachedLink>,
    pub dp: TestDp,
    /// Each service's Maglev slice as written: (service id, backend ids).
    pub slices: Vec<(u32, Vec<u32>)>,
    topo: Topology,
}

impl std::ops::Deref for Lab {
    type Target = Topology;

    fn deref(&self) -> &Topology {
        &self.topo
    }
}

fn dup(fd: std::os::fd::BorrowedFd<'_>) -> OwnedFd {
    fd.try_clone_to_owned().expect("duplicating a program fd")
}

/// A slice of `BACKENDS * SLOTS_PER_BACKEND` slots holding each of `ids`
/// equally often in a shuffled order (a fixed-seed Fisher-Yates), as a real
/// Maglev table would rather than a tidy round robin.
pub fn maglev_slice(ids: &[u32], seed: u64) -> Vec<u32> {
    let mut slots: Vec<u32> = ids
        .iter()
        .flat_map(|&id| std::iter::repeat_n(id, SLOTS_PER_BACKEND))
        .collect();
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for i in (1..slots.len()).rev() {
        // xorshift64
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let j = (x % (i as u64 + 1)) as usize;
        slots.swap(i, j);
    }
    slots
}

impl Lab {
    /// A topology with the test's own datapath attached to the node's n0
    /// and its maps filled.
    pub fn new(mode: Mode) -> Self {
        // Full NAT needs its sources, ports and the sweep programmed as
        // rivorad does (tests/e2e_fullnat.rs runs it): not filled here.
        assert_ne!(
            mode,
            Mode::FullNat,
            "Lab fills NAT, DSR and L3 DSR only; run rivorad for full NAT"
        );
        let topo = Topology::new(mode);
        let (node, backends) = (&topo.node, &topo.backends);
        let (vip4, vip6) = (topo.vip4, topo.vip6);

        // The datapath, loaded here and attached from a thread inside the
        // node (an ifindex is per namespace).
        let dp = TestDp::new();
        let xdp_fd = dup(dp.dp.xdp().progs.xdp_ingress.as_fd());
        let tc_fd = dup(dp.dp.tc().progs.tc_nat.as_fd());
        let (links, n0_index) = node.run(move || {
            let idx = ifindex("n0").expect("n0 in the node");
            let x =
                AttachedLink::attach_xdp(&xdp_fd, idx, XdpMode::Native).expect("xdp_ingress on n0");
            let t = AttachedLink::attach_tcx_egress(&tc_fd, idx).expect("tc_nat on n0");
            (vec![x, t], idx)
        });

        if mode == Mode::L3Dsr {
            // While the node has no neighbour entry for a backend,
            // bpf_fib_lookup answers NO_NEIGH and xdp_ingress hands the
            // tunnelled packet to the kernel, whose source is one of the
            // node's own addresses: without accept_local the kernel drops
            // it as a martian, and since XDP never triggers neighbour
            // resolution itself, the entry never appears and every packet
            // to that backend is lost. The lab leaves the neighbour table
            // cold on purpose, so the first packets take that kernel path
            // and the rest XDP_TX.
            node.sysctls(&[
                ("net.ipv4.conf.all.accept_local", "1"),
                ("net.ipv4.conf.n0.accept_local", "1"),
            ]);
        }

        // Maps: backends, then slices and services, then the VIPs.
        let bport = match mode {
            Mode::Nat | Mode::FullNat => NAT_BACKEND_PORT,
            Mode::Dsr | Mode::L3Dsr => 0,
        };
        for b in backends {
            dp.backend4(b.id4, b.v4, bport, b.mac);
            dp.backend6(b.id6, b.v6, bport, b.mac);
        }
        let ids4: Vec<u32> = backends.iter().map(|b| b.id4).collect();
        let ids6: Vec<u32> = backends.iter().map(|b| b.id6).collect();
        let slice_len = (BACKENDS * SLOTS_PER_BACKEND) as u32;
        let mut slices = Vec::new();
        for (svc, family, ids) in [
            (SVC_V4_TCP, rv_family::RV_FAMILY_V4, &ids4),
            (SVC_V4_UDP, rv_family::RV_FAMILY_V4, &ids4),
            (SVC_V6_TCP, rv_family::RV_FAMILY_V6, &ids6),
            (SVC_V6_UDP, rv_family::RV_FAMILY_V6, &ids6),
        ] {
            let start = (svc - 1) * slice_len;
            let slice = maglev_slice(ids, u64::from(svc));
            dp.service(svc, rv(mode), family, start, &slice);
            slices.push((svc, slice));
        }
        dp.iface_mac(n0_index, node.mac_of("n0"));
        dp.tunnel(topo.node_v4, topo.node_v6);
        dp.vip4(vip4, VIP_PORT, PROTO_TCP, SVC_V4_TCP);
        dp.vip4(vip4, VIP_PORT, PROTO_UDP, SVC_V4_UDP);
        dp.vip6(vip6, VIP_PORT, PROTO_TCP, SVC_V6_TCP);
        dp.vip6(vip6, VIP_PORT, PROTO_UDP, SVC_V6_UDP);

        Lab {
            links,
            dp,
            slices,
            topo,
        }
    }

    /// The backend Maglev assigns to a new flow from `client` to service
    /// `svc` on the VIP port (every backend healthy, so the hashed slot
    /// itself): the datapath's flow hash, modulo the slice.
    pub fn maglev_backend(&self, svc: u32, client: SocketAddr, proto: u8) -> &Backend {
        let (_, slice) = self
            .slices
            .iter()
            .find(|(id, _)| *id == svc)
            .unwrap_or_else(|| panic!("no service {svc} in the lab"));
        let hash = flow_hash(client.ip(), client.port(), VIP_PORT, proto, false);
        let id = slice[hash as usize % slice.len()];
        self.backends
            .iter()
            .find(|b| b.id4 == id || b.id6 == id)
            .unwrap_or_else(|| panic!("slot holds unknown backend id {id}"))
    }
}
