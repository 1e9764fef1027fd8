//! Shared test harness: the real BPF objects loaded into a private pin
//! directory, packets run through BPF_PROG_TEST_RUN, maps filled and read
//! through the dataplane's typed map access.
#![allow(dead_code)]

pub mod netns;

use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

use libbpf_rs::ProgramInput;
use rivora::abi::{self, *};
use rivora::dataplane::{Datapath, LoadOptions, Maps};

pub const XDP_ABORTED: u32 = 0;
pub const XDP_DROP: u32 = 1;
pub const XDP_PASS: u32 = 2;
pub const XDP_TX: u32 = 3;
pub const XDP_REDIRECT: u32 = 4;
pub const TCX_NEXT: i32 = -1;
pub const TCX_PASS: i32 = 0;

pub const PROTO_TCP: u8 = 6;
pub const PROTO_UDP: u8 = 17;

/// ingress_ifindex of a BPF_PROG_TEST_RUN without a context: loopback.
pub const TEST_RUN_IFINDEX: u32 = 1;

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A unique name for this test's namespaces, links and pins: pid plus a
/// per-process counter, so parallel tests and parallel runs never collide.
pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}{}-{}",
        std::process::id() % 100_000,
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// The loaded datapath in its own pin directory, removed on drop (also
/// when the test panics).
pub struct TestDp {
    pub dp: Datapath,
    pub maps: Maps,
    pub pin_dir: PathBuf,
}

impl TestDp {
    pub fn new() -> Self {
        Self::with_maglev_size(abi::MAGLEV_DEFAULT_SIZE)
    }

    pub fn with_maglev_size(maglev_size: u32) -> Self {
        let pin_dir = PathBuf::from(format!("/sys/fs/bpf/{}", unique("rivora-test-")));
        let opts = LoadOptions {
            pin_dir: pin_dir.clone(),
            maglev_size,
        };
        let dp = match Datapath::load(&opts) {
            Ok(dp) => dp,
            Err(e) => {
                let _ = Datapath::unpin_all(&pin_dir);
                panic!("loading the datapath: {e}");
            }
        };
        let maps = Maps::open(&pin_dir).expect("opening pinned maps");
        Self { dp, maps, pin_dir }
    }

    /// Run xdp_ingress once on `pkt`; returns the verdict and the packet
    /// as the program left it.
    pub fn run_xdp(&self, pkt: &[u8]) -> (u32, Vec<u8>) {
        run_prog(&self.dp.xdp().progs.xdp_ingress, pkt)
    }

    /// Run tc_nat once on `pkt`; returns the TCX verdict and the packet.
    pub fn run_tc(&self, pkt: &[u8]) -> (i32, Vec<u8>) {
        let (v, out) = run_prog(&self.dp.tc().progs.tc_nat, pkt);
        (v as i32, out)
    }

    pub fn drops(&self, reason: rv_drop_reason) -> u64 {
        self.maps
            .drop_stats_map
            .get_percpu::<u32, rv_drop_stats>(&reason.0)
            .expect("reading drop_stats_map")
            .iter()
            .map(|d| d.packets)
            .sum()
    }

    pub fn vip_stats(&self, svc_id: u32) -> rv_vip_stats {
        let per_cpu: Vec<rv_vip_stats> = self
            .maps
            .stats_map
            .get_percpu(&svc_id)
            .expect("reading stats_map");
        per_cpu.iter().fold(rv_vip_stats::default(), |mut a, s| {
            a.packets += s.packets;
            a.bytes += s.bytes;
            a.rate_limited += s.rate_limited;
            a.no_backend += s.no_backend;
            a
        })
    }

    // Direct map writes, for tests of the datapath alone.

    pub fn vip4(&self, addr: Ipv4Addr, port: u16, proto: u8, svc_id: u32) {
        let k = rv_vip_key {
            addr: be32(addr),
            port: be16(port),
            proto,
            pad: 0,
        };
        self.maps
            .vip_map
            .put(&k, &rv_vip_value { svc_id })
            .expect("vip_map");
    }

    pub fn vip6(&self, addr: Ipv6Addr, port: u16, proto: u8, svc_id: u32) {
        let k = rv_vip6_key {
            addr: be32x4(addr),
            port: be16(port),
            proto,
            pad: 0,
        };
        self.maps
            .vip_map6
            .put(&k, &rv_vip_value { svc_id })
            .expect("vip_map6");
    }

    /// A port-prefix entry in the v4 range trie: `port_bits` leading bits of `port`.
    pub fn vip4_range(&self, addr: Ipv4Addr, port: u16, port_bits: u32, proto: u8, svc_id: u32) {
        let k = rv_vip_range_key {
            prefixlen: 64 + port_bits,
            proto,
            addr: be32(addr),
            port: be16(port),
            ..Default::default()
        };
        self.maps
            .vip_range_map
            .put(&k, &rv_vip_value { svc_id })
            .expect("vip_range_map");
    }

    pub fn vip6_range(&self, addr: Ipv6Addr, port: u16, port_bits: u32, proto: u8, svc_id: u32) {
        let k = rv_vip_range6_key {
            prefixlen: 160 + port_bits,
            proto,
            addr: be32x4(addr),
            port: be16(port),
            ..Default::default()
        };
        self.maps
            .vip_range_map6
            .put(&k, &rv_vip_value { svc_id })
            .expect("vip_range_map6");
    }

    /// A service whose slice holds `slots` (backend ids) starting at `start`.
    pub fn service(
        &self,
        svc_id: u32,
        mode: rv_mode,
        family: rv_family,
        start: u32,
        slots: &[u32],
    ) {
        self.service_with(svc_id, start, slots, |s| {
            s.mode = mode.0 as u8;
            s.family = family.0 as u8;
        });
    }

    pub fn service_with(
        &self,
        svc_id: u32,
        start: u32,
        slots: &[u32],
        f: impl FnOnce(&mut rv_service),
    ) {
        for (i, b) in slots.iter().enumerate() {
            self.maps
                .maglev_table
                .put(&(start + i as u32), &rv_maglev_slot { backend_id: *b })
                .expect("maglev_table");
        }
        let mut s = rv_service {
            flags: rv_service_flags::RV_SVC_F_ACTIVE.0,
            slice_start: start,
            slice_len: slots.len() as u32,
            backend_count: {
                let mut ids = slots.to_vec();
                ids.sort();
                ids.dedup();
                ids.len() as u32
            },
            ..Default::default()
        };
        f(&mut s);
        self.maps
            .service_config_map
            .put(&svc_id, &s)
            .expect("service_config_map");
    }

    pub fn backend4(&self, id: u32, addr: Ipv4Addr, port: u16, mac: [u8; 6]) {
        let b = rv_backend {
            addr: be32(addr),
            port: be16(port),
            mac,
        };
        self.maps.backend_map.put(&id, &b).expect("backend_map");
        self.health(id, rv_health::RV_HEALTH_HEALTHY);
    }

    pub fn backend6(&self, id: u32, addr: Ipv6Addr, port: u16, mac: [u8; 6]) {
        let b = rv_backend6 {
            addr: be32x4(addr),
            port: be16(port),
            mac,
        };
        self.maps.backend_map6.put(&id, &b).expect("backend_map6");
        self.health(id, rv_health::RV_HEALTH_HEALTHY);
    }

    pub fn health(&self, id: u32, state: rv_health) {
        let h = rv_backend_health {
            state: state.0 as u8,
            ..Default::default()
        };
        self.maps
            .backend_health_map
            .put(&id, &h)
            .expect("backend_health_map");
    }

    pub fn iface_mac(&self, ifindex: u32, mac: [u8; 6]) {
        self.maps
            .iface_mac_map
            .put(&ifindex, &rv_iface_mac { mac, pad: [0; 2] })
            .expect("iface_mac_map");
    }

    pub fn tunnel(&self, src4: Ipv4Addr, src6: Ipv6Addr) {
        let t = rv_tunnel_config {
            src4: be32(src4),
            src6: be32x4(src6),
        };
        self.maps
            .tunnel_config_map
            .put(&0u32, &t)
            .expect("tunnel_config_map");
    }

    pub fn node_rate_limit(&self, rate_per_sec: u32, burst: u32) {
        let c = rv_rl_config {
            enabled: 1,
            rate_per_sec,
            burst,
            pad: 0,
        };
        self.maps
            .rl_config_map
            .put(&0u32, &c)
            .expect("rl_config_map");
    }

    pub fn svc_rate_limit(&self, svc_id: u32, rate_per_sec: u32, burst: u32) {
        let c = rv_rl_config {
            enabled: 1,
            rate_per_sec,
            burst,
            pad: 0,
        };
        self.maps
            .svc_rl_config_map
            .put(&svc_id, &c)
            .expect("svc_rl_config_map");
    }
}

impl Drop for TestDp {
    fn drop(&mut self) {
        let _ = Datapath::unpin_all(&self.pin_dir);
    }
}

pub fn run_prog(prog: &libbpf_rs::ProgramMut<'_>, pkt: &[u8]) -> (u32, Vec<u8>) {
    // Room for an outer header pushed in front (L3 DSR) or a grown packet.
    let mut out = vec![0u8; pkt.len() + 256];
    let input = ProgramInput {
        data_in: Some(pkt),
        data_out: Some(&mut out),
        ..Default::default()
    };
    let output = prog.test_run(input).expect("BPF_PROG_TEST_RUN");
    let len = output.data.as_ref().map(|d| d.len()).unwrap_or(0);
    let verdict = output.return_value;
    out.truncate(len);
    (verdict, out)
}
