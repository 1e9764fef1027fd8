//! Per-packet cost of xdp_ingress and tc_nat through BPF_PROG_TEST_RUN.
//!
//! The kernel does not reset the packet between repeats, so every run goes
//! through a wrapper (bpf/bench.bpf.c) that restores the original bytes and
//! tail-calls the program under test. The floor is the same wrapper
//! tail-calling a bare XDP_PASS, measured in the same rounds: ratios to it
//! are what the targets are stated in. Rounds interleave the scenarios and
//! the figure is the median of the rounds.

use std::fs::File;
use std::mem::MaybeUninit;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsFd, AsRawFd};
use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, ensure, Context, Result};
use etherparse::PacketBuilder;
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{MapCore, MapFlags, OpenObject, ProgramInput, ProgramMut};
use rivora::abi::*;
use rivora::bpf::bench::types::rv_bench_pkt;
use rivora::bpf::bench::BenchSkelBuilder;
use rivora::dataplane::{Datapath, LoadOptions, Maps};

use crate::{median, Results};

const ROUNDS: usize = 7;
const REPEAT: u32 = 1_000_000;

const XDP_PASS: u32 = 2;
const XDP_TX: u32 = 3;
const XDP_REDIRECT: u32 = 4;

const CLIENT: [u8; 4] = [10, 99, 0, 1];
const VIP_NAT: [u8; 4] = [10, 99, 100, 1];
const VIP_DSR: [u8; 4] = [10, 99, 100, 2];
const VIP_L3: [u8; 4] = [10, 99, 100, 3];
const VIP_UDP: [u8; 4] = [10, 99, 100, 4];
const BACKENDS: [[u8; 4]; 3] = [[10, 99, 2, 11], [10, 99, 2, 12], [10, 99, 2, 13]];
const CLIENT6: &str = "fd00:99:1::1";
const VIP6: &str = "fd00:99:100::1";
const BACKENDS6: [&str; 3] = ["fd00:99:2::11", "fd00:99:2::12", "fd00:99:2::13"];

/// Scenario: a packet, whether each run is a new flow, which program and
/// what verdicts are right.
struct Case {
    key: &'static str,
    pkt: Vec<u8>,
    vary: bool,
    prog: Prog,
    ok: &'static [u32],
}

#[derive(Clone, Copy, PartialEq)]
enum Prog {
    XdpFloor,
    Xdp,
    TcFloor,
    Tc,
}

/// A network namespace of our own for the run: bpf_fib_lookup in the L3 DSR
/// and NAT cases answers from its routes and resolved neighbours (every
/// backend of both families on `rvb0`), and nothing on the host is touched.
struct BenchNs(String);

impl BenchNs {
    fn new() -> Result<Self> {
        let name = format!("rvbench{}", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        sh(&format!("ip netns add {name}"))?;
        let ns = Self(name);
        let n = &ns.0;
        for cmd in [
            "ip link set lo up".to_string(),
            "ip link add rvb0 type veth peer name rvb1".to_string(),
            "ip link set rvb0 up".to_string(),
            "ip link set rvb1 up".to_string(),
            "ip addr add 10.99.2.1/24 dev rvb0".to_string(),
            "ip -6 addr add fd00:99:2::1/64 dev rvb0 nodad".to_string(),
            "sysctl -qw net.ipv4.ip_forward=1".to_string(),
            "sysctl -qw net.ipv6.conf.all.forwarding=1".to_string(),
            "ip neigh add 10.99.2.11 lladdr 02:00:00:00:02:0b dev rvb0 nud permanent".to_string(),
            "ip neigh add 10.99.2.12 lladdr 02:00:00:00:02:0c dev rvb0 nud permanent".to_string(),
            "ip neigh add 10.99.2.13 lladdr 02:00:00:00:02:0d dev rvb0 nud permanent".to_string(),
            "ip -6 neigh add fd00:99:2::11 lladdr 02:00:00:00:02:0b dev rvb0 nud permanent"
                .to_string(),
            "ip -6 neigh add fd00:99:2::12 lladdr 02:00:00:00:02:0c dev rvb0 nud permanent"
                .to_string(),
            "ip -6 neigh add fd00:99:2::13 lladdr 02:00:00:00:02:0d dev rvb0 nud permanent"
                .to_string(),
        ] {
            sh(&format!("nsenter --net=/run/netns/{n} {cmd}"))?;
        }
        Ok(ns)
    }
}

impl Drop for BenchNs {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

fn sh(cmd: &str) -> Result<()> {
    let out = Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .output()
        .with_context(|| format!("spawning `{cmd}`"))?;
    ensure!(
        out.status.success(),
        "`{cmd}` failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

fn pad8(mut v: Vec<u8>) -> Vec<u8> {
    // The wrapper restores in 8-byte words.
    assert!(
        v.len() % 8 == 0,
        "bench packets are built to a multiple of 8 bytes"
    );
    v.shrink_to_fit();
    v
}

fn tcp4(dst: [u8; 4], syn: bool) -> Vec<u8> {
    let b = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ipv4(CLIENT, dst, 64)
        .tcp(40000, 80, 1, 65535);
    let b = if syn { b.syn() } else { b.ack(1) };
    let mut v = Vec::new();
    // 14 + 20 + 20 + 10 = 64 bytes.
    b.write(&mut v, &[0u8; 10]).expect("building a packet");
    pad8(v)
}

fn tcp4_reply() -> Vec<u8> {
    let mut v = Vec::new();
    PacketBuilder::ethernet2([2, 0, 0, 0, 0, 2], [2, 0, 0, 0, 0, 1])
        .ipv4(BACKENDS[0], CLIENT, 64)
        .tcp(8080, 40000, 1, 65535)
        .ack(1)
        .write(&mut v, &[0u8; 10])
        .expect("building a packet");
    pad8(v)
}

fn udp4(dst: [u8; 4]) -> Vec<u8> {
    let mut v = Vec::new();
    // 14 + 20 + 8 + 22 = 64 bytes.
    PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ipv4(CLIENT, dst, 64)
        .udp(40000, 53)
        .write(&mut v, &[0u8; 22])
        .expect("building a packet");
    pad8(v)
}

fn tcp6(syn: bool) -> Vec<u8> {
    let c: Ipv6Addr = CLIENT6.parse().expect("constant");
    let d: Ipv6Addr = VIP6.parse().expect("constant");
    let b = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ipv6(c.octets(), d.octets(), 64)
        .tcp(40000, 80, 1, 65535);
    let b = if syn { b.syn() } else { b.ack(1) };
    let mut v = Vec::new();
    // 14 + 40 + 20 + 14 = 88 bytes.
    b.write(&mut v, &[0u8; 14]).expect("building a packet");
    pad8(v)
}

/// Fill the maps for the scenarios: a VIP per mode, three backends each,
/// a Maglev slice of 3 x 7 slots.
fn program_maps(maps: &Maps) -> Result<()> {
    let slots: Vec<u32> = (0..21).map(|i| [1, 2, 3][(i * 5) % 3]).collect();
    let mut next_slice = 0u32;
    let mut service =
        |svc_id: u32, mode: rv_mode, family: rv_family, ids: [u32; 3]| -> Result<()> {
            for (i, s) in slots.iter().enumerate() {
                maps.maglev_table.put(
                    &(next_slice + i as u32),
                    &rv_maglev_slot {
                        backend_id: ids[(*s - 1) as usize],
                    },
                )?;
            }
            let s = rv_service {
                mode: mode.0 as u8,
                family: family.0 as u8,
                flags: rv_service_flags::RV_SVC_F_ACTIVE.0,
                slice_start: next_slice,
                slice_len: slots.len() as u32,
                backend_count: 3,
                ..Default::default()
            };
            maps.service_config_map.put(&svc_id, &s)?;
            next_slice += slots.len() as u32;
            Ok(())
        };
    for (i, b) in BACKENDS.iter().enumerate() {
        let id = i as u32 + 1;
        let mac = [2, 0, 0, 0, 2, 11 + i as u8];
        maps.backend_map.put(
            &id,
            &rv_backend {
                addr: be32(Ipv4Addr::from(*b)),
                port: be16(8080),
                mac,
            },
        )?;
        maps.backend_health_map
            .put(&id, &rv_backend_health::default())?;
        let b6: Ipv6Addr = BACKENDS6[i].parse().expect("constant");
        let id6 = id + 10;
        maps.backend_map6.put(
            &id6,
            &rv_backend6 {
                addr: be32x4(b6),
                port: be16(8080),
                mac,
            },
        )?;
        maps.backend_health_map
            .put(&id6, &rv_backend_health::default())?;
    }
    let v4 = rv_family::RV_FAMILY_V4;
    service(1, rv_mode::RV_MODE_NAT, v4, [1, 2, 3])?;
    service(2, rv_mode::RV_MODE_DSR, v4, [1, 2, 3])?;
    service(3, rv_mode::RV_MODE_L3DSR, v4, [1, 2, 3])?;
    service(4, rv_mode::RV_MODE_NAT, v4, [1, 2, 3])?;
    service(
        5,
        rv_mode::RV_MODE_NAT,
        rv_family::RV_FAMILY_V6,
        [11, 12, 13],
    )?;
    for (addr, port, proto, svc) in [
        (VIP_NAT, 80, 6, 1),
        (VIP_DSR, 80, 6, 2),
        (VIP_L3, 80, 6, 3),
        (VIP_UDP, 53, 17, 4),
    ] {
        let k = rv_vip_key {
            addr: be32(Ipv4Addr::from(addr)),
            port: be16(port),
            proto,
            pad: 0,
        };
        maps.vip_map.put(&k, &rv_vip_value { svc_id: svc })?;
    }
    let vip6: Ipv6Addr = VIP6.parse().expect("constant");
    maps.vip_map6.put(
        &rv_vip6_key {
            addr: be32x4(vip6),
            port: be16(80),
            proto: 6,
            pad: 0,
        },
        &rv_vip_value { svc_id: 5 },
    )?;
    // Test runs arrive on loopback (ifindex 1). The backends are out of
    // rvb0, listed as an interface rivorad would be attached to, so that a
    // forward the FIB answers is measured to its end (a redirect).
    let rvb0 = rivora::dataplane::attach::ifindex("rvb0").context("rvb0 in the bench netns")?;
    for (ifindex, mac) in [(1u32, [2, 0, 0, 0, 0, 2]), (rvb0, [2, 0, 0, 0, 0, 3])] {
        maps.iface_mac_map
            .put(&ifindex, &rv_iface_mac { mac, pad: [0; 2] })?;
    }
    let src6: Ipv6Addr = "fd00:99:2::1".parse().expect("constant");
    maps.tunnel_config_map.put(
        &0u32,
        &rv_tunnel_config {
            src4: be32(Ipv4Addr::new(10, 99, 2, 1)),
            src6: be32x4(src6),
        },
    )?;
    Ok(())
}

fn set_pkt(map: &libbpf_rs::MapMut<'_>, case: &Case) -> Result<()> {
    let mut p = rv_bench_pkt {
        len: case.pkt.len() as u32,
        vary: case.vary as u32,
        ..Default::default()
    };
    ensure!(
        case.pkt.len() <= p.bytes.len(),
        "{}: packet too long for the wrapper",
        case.key
    );
    p.bytes[..case.pkt.len()].copy_from_slice(&case.pkt);
    // Vary the low half of the source address and the source port: the
    // IPv4 source address is at 14 + 12, the TCP/UDP source port at 14 + 20.
    p.ip_off = 26;
    p.port_off = 34;
    // SAFETY: rv_bench_pkt is a plain repr(C) struct with explicit fields.
    let bytes = unsafe {
        std::slice::from_raw_parts(
            (&p as *const rv_bench_pkt).cast::<u8>(),
            std::mem::size_of::<rv_bench_pkt>(),
        )
    };
    map.update(&0u32.to_ne_bytes(), bytes, MapFlags::ANY)
        .context("bench_pkt_map")?;
    Ok(())
}

fn test_run(prog: &ProgramMut<'_>, pkt: &[u8], repeat: u32) -> Result<(u32, f64)> {
    let mut out = vec![0u8; pkt.len() + 256];
    let input = ProgramInput {
        data_in: Some(pkt),
        data_out: Some(&mut out),
        repeat,
        ..Default::default()
    };
    let o = prog.test_run(input).context("BPF_PROG_TEST_RUN")?;
    Ok((o.return_value, o.duration.as_nanos() as f64))
}

pub fn run(results: &mut Results) -> Result<()> {
    let ns = BenchNs::new()?;
    let path = format!("/run/netns/{}", ns.0);
    // Everything runs on a thread inside the namespace.
    let measured = std::thread::spawn(move || -> Result<Vec<(String, f64)>> {
        let f = File::open(&path).context("opening the bench netns")?;
        nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET).context("setns")?;
        measure()
    })
    .join()
    .map_err(|_| anyhow::anyhow!("bench thread panicked"))??;
    drop(ns);

    let get = |k: &str| {
        measured
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| *v)
            .unwrap_or(f64::NAN)
    };
    let floor = get("xdp_floor_ns");
    let tc_floor = get("tc_floor_ns");
    for (k, v) in &measured {
        if k == "tc_floor_ns" {
            continue;
        }
        results.set(k, *v);
    }
    for (k, v) in &measured {
        let f = if k.starts_with("tc_") {
            tc_floor
        } else {
            floor
        };
        if k != "xdp_floor_ns" && k != "tc_floor_ns" {
            results.note(format!("  {k:<32} {:>6.2}x floor", v / f));
        }
    }
    results.note(format!(
        "  (floor = wrapper + tail call + return: XDP {floor:.1} ns, TC {tc_floor:.1} ns; targets: non-VIP <= 2x, established <= 3x, new flow <= 6x)"
    ));
    Ok(())
}

fn measure() -> Result<Vec<(String, f64)>> {
    let pin_dir = PathBuf::from(format!("/sys/fs/bpf/rivora-bench-{}", std::process::id()));
    let _ = Datapath::unpin_all(&pin_dir);
    struct Unpin(PathBuf);
    impl Drop for Unpin {
        fn drop(&mut self) {
            let _ = Datapath::unpin_all(&self.0);
        }
    }
    let _unpin = Unpin(pin_dir.clone());
    let dp = Datapath::load(&LoadOptions {
        pin_dir: pin_dir.clone(),
        ..Default::default()
    })?;
    let maps = Maps::open(&pin_dir)?;
    program_maps(&maps)?;

    let mut storage = MaybeUninit::<OpenObject>::uninit();
    let bench = BenchSkelBuilder::default()
        .open(&mut storage)
        .context("opening bench")?
        .load()
        .context("loading bench")?;

    let cases = vec![
        Case {
            key: "xdp_floor_ns",
            pkt: tcp4([10, 99, 50, 1], false),
            vary: false,
            prog: Prog::XdpFloor,
            ok: &[XDP_PASS],
        },
        Case {
            key: "xdp_nonvip_pass_ns",
            pkt: tcp4([10, 99, 50, 1], false),
            vary: false,
            prog: Prog::Xdp,
            ok: &[XDP_PASS],
        },
        Case {
            key: "xdp_syn_nat_v4_ns",
            pkt: tcp4(VIP_NAT, true),
            vary: true,
            prog: Prog::Xdp,
            ok: &[XDP_REDIRECT],
        },
        Case {
            key: "xdp_established_nat_v4_ns",
            pkt: tcp4(VIP_NAT, false),
            vary: false,
            prog: Prog::Xdp,
            ok: &[XDP_REDIRECT],
        },
        Case {
            key: "xdp_established_nat_v6_ns",
            pkt: tcp6(false),
            vary: false,
            prog: Prog::Xdp,
            ok: &[XDP_REDIRECT],
        },
        Case {
            key: "xdp_syn_dsr_v4_ns",
            pkt: tcp4(VIP_DSR, true),
            vary: true,
            prog: Prog::Xdp,
            ok: &[XDP_TX],
        },
        Case {
            key: "xdp_syn_l3dsr_v4_ns",
            pkt: tcp4(VIP_L3, true),
            vary: true,
            prog: Prog::Xdp,
            ok: &[XDP_TX, XDP_REDIRECT],
        },
        Case {
            key: "xdp_udp_nat_v4_ns",
            pkt: udp4(VIP_UDP),
            vary: false,
            prog: Prog::Xdp,
            ok: &[XDP_REDIRECT],
        },
        Case {
            key: "tc_floor_ns",
            pkt: tcp4_reply(),
            vary: false,
            prog: Prog::TcFloor,
            ok: &[u32::MAX],
        },
        Case {
            key: "tc_nat_reply_v4_ns",
            pkt: tcp4_reply(),
            vary: false,
            prog: Prog::Tc,
            ok: &[0],
        },
    ];

    let xdp_progs = &bench.maps.bench_xdp_progs;
    let tc_progs = &bench.maps.bench_tc_progs;
    let set_target = |map: &libbpf_rs::MapMut<'_>, fd: i32| -> Result<()> {
        map.update(&0u32.to_ne_bytes(), &fd.to_ne_bytes(), MapFlags::ANY)
            .context("prog array")
    };
    // tc_nat's reply must find the NAT entry of an established flow.
    let (v, _) = test_run(&dp.xdp().progs.xdp_ingress, &tcp4(VIP_NAT, false), 1)?;
    ensure!(v == XDP_REDIRECT, "priming the NAT flow: verdict {v}");

    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    for _round in 0..ROUNDS {
        for (i, c) in cases.iter().enumerate() {
            set_pkt(&bench.maps.bench_pkt_map, c)?;
            let (prog, target) = match c.prog {
                Prog::XdpFloor => (
                    &bench.progs.bench_wrap_xdp,
                    bench.progs.bench_pass_xdp.as_fd().as_raw_fd(),
                ),
                Prog::Xdp => (
                    &bench.progs.bench_wrap_xdp,
                    dp.xdp().progs.xdp_ingress.as_fd().as_raw_fd(),
                ),
                Prog::TcFloor => (
                    &bench.progs.bench_wrap_tc,
                    bench.progs.bench_pass_tc.as_fd().as_raw_fd(),
                ),
                Prog::Tc => (
                    &bench.progs.bench_wrap_tc,
                    dp.tc().progs.tc_nat.as_fd().as_raw_fd(),
                ),
            };
            match c.prog {
                Prog::XdpFloor | Prog::Xdp => set_target(xdp_progs, target)?,
                Prog::TcFloor | Prog::Tc => set_target(tc_progs, target)?,
            }
            // One checked run, then the measured batch, then its verdict:
            // a wrapper that failed to restore would show here.
            let (v, _) = test_run(prog, &c.pkt, 1)?;
            if !c.ok.contains(&v) {
                bail!("{}: verdict {v}, expected one of {:?}", c.key, c.ok);
            }
            let (v, ns) = test_run(prog, &c.pkt, REPEAT)?;
            if !c.ok.contains(&v) {
                bail!(
                    "{}: verdict {v} after {REPEAT} runs, expected one of {:?}",
                    c.key,
                    c.ok
                );
            }
            samples[i].push(ns);
        }
    }
    Ok(cases
        .iter()
        .zip(samples)
        .map(|(c, s)| (c.key.to_string(), median(s)))
        .collect())
}
