//! Per-packet cost of xdp_ingress and tc_nat through BPF_PROG_TEST_RUN.
//!
//! The kernel does not reset the packet between repeats, so every run goes
//! through a wrapper (bench/bpf/bench.bpf.c) that restores the original bytes and
//! tail-calls the program under test. The floor is the same wrapper
//! tail-calling a bare XDP_PASS, measured in the same rounds: ratios to it
//! are what the targets are stated in. Within a round the scenarios take
//! turns in slices (see SLICES); the figure is the median of the rounds,
//! and the table also prints each key's spread over the rounds.
//! `RIVORA_BENCH_ONLY=key,key` measures only those keys (while looking into
//! one path).
//!
//! Full NAT's cases run on a datapath of their own, filled by the
//! real writer, in the same rounds and slices: `xdp/fullnat.rs`.

mod fullnat;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::mem::MaybeUninit;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsFd, AsRawFd};
use std::path::PathBuf;

use anyhow::{bail, ensure, Context, Result};
use etherparse::PacketBuilder;
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{MapCore, MapFlags, MapHandle, OpenObject, ProgramInput, ProgramMut};
use rivora::abi::*;
use rivora::dataplane::render::NextHop;
use rivora::dataplane::{Datapath, LoadOptions};
use rivora_bench::bpf::bench::types::rv_bench_pkt;
use rivora_bench::bpf::bench::BenchSkelBuilder;
use rivora_testlab::netns::{spawn_in, Netns};

use crate::{median, Results};
use fullnat::{Exhaustion, Fam, FullNat, Role};

/// This shared VM's noise comes in stretches of a fraction of a second to
/// seconds (about one long batch in five ran 20-40% slow). A round runs each
/// key's REPEAT in SLICES batches, the keys taking turns, so that a slow
/// stretch falls on every key of the round alike and the ratios within a
/// round hold; the figure is still the median of the rounds.
const ROUNDS: usize = 15;
const REPEAT: u32 = 400_000;
const SLICES: u32 = 8;

const XDP_PASS: u32 = 2;
const XDP_TX: u32 = 3;

const CLIENT: [u8; 4] = [10, 99, 0, 1];
const VIP_NAT: [u8; 4] = [10, 99, 100, 1];
const VIP_DSR: [u8; 4] = [10, 99, 100, 2];
const VIP_L3: [u8; 4] = [10, 99, 100, 3];
const VIP_UDP: [u8; 4] = [10, 99, 100, 4];
const VIP_DSR_UDP: [u8; 4] = [10, 99, 100, 5];
/// NAT, as VIP_NAT, with SOURCE_RANGES source ranges, one of them the
/// client's.
const VIP_NAT_RANGES: [u8; 4] = [10, 99, 100, 6];
const SOURCE_RANGES: u32 = 64;
const BACKENDS: [[u8; 4]; 3] = [[10, 99, 2, 11], [10, 99, 2, 12], [10, 99, 2, 13]];
const CLIENT6: &str = "fd00:99:1::1";
const VIP6: &str = "fd00:99:100::1";
const VIP6_DSR: &str = "fd00:99:100::2";
const VIP6_L3: &str = "fd00:99:100::3";
const BACKENDS6: [&str; 3] = ["fd00:99:2::11", "fd00:99:2::12", "fd00:99:2::13"];

/// Scenario: a packet, whether each run is a new flow, which program and
/// what verdicts are right.
struct Case {
    key: &'static str,
    /// Also measured through the baseline's xdp_ingress, as `<key>` with
    /// `_ns` replaced by `_before_ns`.
    before: bool,
    pkt: Vec<u8>,
    vary: bool,
    prog: Prog,
    ok: &'static [u32],
}

#[derive(Clone, Copy, PartialEq)]
enum Prog {
    XdpFloor,
    Xdp,
    /// xdp_ingress of the full-NAT datapath (`fullnat::FullNat`).
    XdpFullNat(Role, Fam),
    TcFloor,
    Tc,
}

/// A network namespace of our own for the run: bpf_fib_lookup in the L3 DSR
/// and NAT cases answers from its routes and resolved neighbours (every
/// backend of both families on `rvb0`), and nothing on the host is touched.
fn bench_ns() -> Result<Netns> {
    let ns = Netns::try_new(&format!("rvbench{}", std::process::id()))?;
    for cmd in [
        "ip link add rvb0 type veth peer name rvb1",
        "ip link set rvb0 up",
        "ip link set rvb1 up",
        "ip addr add 10.99.2.1/24 dev rvb0",
        "ip -6 addr add fd00:99:2::1/64 dev rvb0 nodad",
        "sysctl -qw net.ipv4.ip_forward=1",
        "sysctl -qw net.ipv6.conf.all.forwarding=1",
        "ip neigh add 10.99.2.11 lladdr 02:00:00:00:02:0b dev rvb0 nud permanent",
        "ip neigh add 10.99.2.12 lladdr 02:00:00:00:02:0c dev rvb0 nud permanent",
        "ip neigh add 10.99.2.13 lladdr 02:00:00:00:02:0d dev rvb0 nud permanent",
        "ip -6 neigh add fd00:99:2::11 lladdr 02:00:00:00:02:0b dev rvb0 nud permanent",
        "ip -6 neigh add fd00:99:2::12 lladdr 02:00:00:00:02:0c dev rvb0 nud permanent",
        "ip -6 neigh add fd00:99:2::13 lladdr 02:00:00:00:02:0d dev rvb0 nud permanent",
    ] {
        ns.try_exec(cmd)?;
    }
    Ok(ns)
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
    tcp4_from(40000, dst, syn)
}

fn tcp4_from(sport: u16, dst: [u8; 4], syn: bool) -> Vec<u8> {
    let b = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ipv4(CLIENT, dst, 64)
        .tcp(sport, 80, 1, 65535);
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

fn udp4_dst(dst: [u8; 4], port: u16) -> Vec<u8> {
    let mut v = Vec::new();
    PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ipv4(CLIENT, dst, 64)
        .udp(40000, port)
        .write(&mut v, &[0u8; 22])
        .expect("building a packet");
    pad8(v)
}

fn tcp6(syn: bool) -> Vec<u8> {
    tcp6_to(VIP6, syn)
}

fn tcp6_to(vip: &str, syn: bool) -> Vec<u8> {
    let c: Ipv6Addr = CLIENT6.parse().expect("constant");
    let d: Ipv6Addr = vip.parse().expect("constant");
    let b = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ipv6(c.octets(), d.octets(), 64)
        .tcp(40000, 80, 1, 65535);
    let b = if syn { b.syn() } else { b.ack(1) };
    let mut v = Vec::new();
    // 14 + 40 + 20 + 14 = 88 bytes.
    b.write(&mut v, &[0u8; 14]).expect("building a packet");
    pad8(v)
}

/// Writes one entry into a pinned map by name; values longer than the
/// map's value are cut to it (the baseline's backend entries are today's
/// without the next hop that follows them), and maps the pinned set does
/// not have (the baseline's) are skipped.
struct PinWriter(PathBuf);

impl PinWriter {
    fn put<K, V>(&self, name: &str, key: &K, val: &V) -> Result<()> {
        let path = self.0.join(name);
        if !path.exists() {
            return Ok(());
        }
        let m = MapHandle::from_pinned_path(&path).with_context(|| format!("opening {name}"))?;
        // SAFETY: K and V are the ABI's plain repr(C) structs and integers.
        let kb = unsafe {
            std::slice::from_raw_parts((key as *const K).cast::<u8>(), std::mem::size_of::<K>())
        };
        let vb = unsafe {
            std::slice::from_raw_parts((val as *const V).cast::<u8>(), std::mem::size_of::<V>())
        };
        let vs = (m.value_size() as usize).min(vb.len());
        m.update(kb, &vb[..vs], MapFlags::ANY)
            .with_context(|| format!("writing {name}"))
    }
}

/// Fill the maps for the scenarios: a VIP per mode and family, three
/// backends each, a Maglev slice of 3 x 7 slots. `nh` gives the next hops
/// rivorad's watcher would cache (empty for the baseline, which has none).
fn program_maps(w: &PinWriter, nh: &HashMap<IpAddr, NextHop>, rvb0: u32) -> Result<()> {
    let slots: Vec<u32> = (0..21).map(|i| [1, 2, 3][(i * 5) % 3]).collect();
    let mut next_slice = 0u32;
    let mut service =
        |svc_id: u32, mode: rv_mode, family: rv_family, ids: [u32; 3]| -> Result<()> {
            for (i, s) in slots.iter().enumerate() {
                w.put(
                    "maglev_table",
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
            w.put("service_config_map", &svc_id, &s)?;
            next_slice += slots.len() as u32;
            Ok(())
        };
    let nh_of = |a: IpAddr| nh.get(&a).copied().unwrap_or_default().to_abi();
    for (i, b) in BACKENDS.iter().enumerate() {
        let id = i as u32 + 1;
        let mac = [2, 0, 0, 0, 2, 11 + i as u8];
        let a = Ipv4Addr::from(*b);
        w.put(
            "backend_map",
            &id,
            &rv_backend {
                addr: be32(a),
                port: be16(8080),
                mac,
                nh: nh_of(IpAddr::V4(a)),
            },
        )?;
        w.put("backend_health_map", &id, &rv_backend_health::default())?;
        let b6: Ipv6Addr = BACKENDS6[i].parse().expect("constant");
        let id6 = id + 10;
        w.put(
            "backend_map6",
            &id6,
            &rv_backend6 {
                addr: be32x4(b6),
                port: be16(8080),
                mac,
                nh: nh_of(IpAddr::V6(b6)),
            },
        )?;
        w.put("backend_health_map", &id6, &rv_backend_health::default())?;
    }
    let (v4, v6) = (rv_family::RV_FAMILY_V4, rv_family::RV_FAMILY_V6);
    service(1, rv_mode::RV_MODE_NAT, v4, [1, 2, 3])?;
    service(2, rv_mode::RV_MODE_DSR, v4, [1, 2, 3])?;
    service(3, rv_mode::RV_MODE_L3DSR, v4, [1, 2, 3])?;
    service(4, rv_mode::RV_MODE_NAT, v4, [1, 2, 3])?;
    service(5, rv_mode::RV_MODE_NAT, v6, [11, 12, 13])?;
    service(6, rv_mode::RV_MODE_DSR, v6, [11, 12, 13])?;
    service(7, rv_mode::RV_MODE_L3DSR, v6, [11, 12, 13])?;
    service(8, rv_mode::RV_MODE_DSR, v4, [1, 2, 3])?;
    // Backends of its own (port 8081), which it owns as VIP_NAT owns
    // its: the new-flow case then pays for its ranges, not for the second
    // insert of a VIP that shares its backends.
    for (i, b) in BACKENDS.iter().enumerate() {
        let a = Ipv4Addr::from(*b);
        w.put(
            "backend_map",
            &(21 + i as u32),
            &rv_backend {
                addr: be32(a),
                port: be16(8081),
                mac: [2, 0, 0, 0, 2, 11 + i as u8],
                nh: nh_of(IpAddr::V4(a)),
            },
        )?;
        w.put(
            "backend_health_map",
            &(21 + i as u32),
            &rv_backend_health::default(),
        )?;
    }
    service(9, rv_mode::RV_MODE_NAT, v4, [21, 22, 23])?;
    source_ranges(w, 9)?;
    let mut vip_addrs: Vec<IpAddr> = Vec::new();
    for (addr, port, proto, svc) in [
        (VIP_NAT, 80, 6, 1),
        (VIP_DSR, 80, 6, 2),
        (VIP_L3, 80, 6, 3),
        (VIP_UDP, 53, 17, 4),
        (VIP_DSR_UDP, 53, 17, 8),
        (VIP_NAT_RANGES, 80, 6, 9),
    ] {
        let k = rv_vip_key {
            addr: be32(Ipv4Addr::from(addr)),
            port: be16(port),
            proto,
            pad: 0,
        };
        w.put("vip_map", &k, &rv_vip_value { svc_id: svc })?;
        vip_addrs.push(IpAddr::V4(Ipv4Addr::from(addr)));
    }
    for (vip, svc) in [(VIP6, 5), (VIP6_DSR, 6), (VIP6_L3, 7)] {
        let vip6: Ipv6Addr = vip.parse().expect("constant");
        w.put(
            "vip_map6",
            &rv_vip6_key {
                addr: be32x4(vip6),
                port: be16(80),
                proto: 6,
                pad: 0,
            },
            &rv_vip_value { svc_id: svc },
        )?;
        vip_addrs.push(IpAddr::V6(vip6));
    }
    // What the writer keeps: the VIP filter, and the NAT VIPs owning
    // their backends (one insert per new flow).
    w.put(
        "vip_filter_map",
        &0u32,
        &rv_vip_filter {
            active: 1,
            pad: 0,
            bits: rivora::dataplane::render::vip_filter(vip_addrs),
        },
    )?;
    for (svc, vip, port, proto, ids, bport) in [
        (
            1u32,
            IpAddr::V4(Ipv4Addr::from(VIP_NAT)),
            80u16,
            6u8,
            [1u32, 2, 3],
            8080u16,
        ),
        (
            4,
            IpAddr::V4(Ipv4Addr::from(VIP_UDP)),
            53,
            17,
            [1, 2, 3],
            8080,
        ),
        (
            9,
            IpAddr::V4(Ipv4Addr::from(VIP_NAT_RANGES)),
            80,
            6,
            [21, 22, 23],
            8081,
        ),
    ] {
        for (i, id) in ids.iter().enumerate() {
            let _ = port;
            w.put(
                "nat_owner_map",
                &rv_nat_owner_key {
                    backend_addr: be32(Ipv4Addr::from(BACKENDS[i])),
                    backend_port: be16(bport),
                    proto,
                    pad: 0,
                },
                &rv_nat_owner {
                    svc_id: svc,
                    backend_id: *id,
                    vip_addr: match vip {
                        IpAddr::V4(a) => [be32(a), 0, 0, 0],
                        IpAddr::V6(a) => be32x4(a),
                    },
                    vip_port: be16(port),
                    pad: 0,
                },
            )?;
        }
    }
    for (i, b6) in BACKENDS6.iter().enumerate() {
        let a: Ipv6Addr = b6.parse().expect("constant");
        let vip6: Ipv6Addr = VIP6.parse().expect("constant");
        w.put(
            "nat_owner_map6",
            &rv_nat_owner6_key {
                backend_addr: be32x4(a),
                backend_port: be16(8080),
                proto: 6,
                pad: 0,
            },
            &rv_nat_owner {
                svc_id: 5,
                backend_id: 11 + i as u32,
                vip_addr: be32x4(vip6),
                vip_port: be16(80),
                pad: 0,
            },
        )?;
    }
    // Runs arrive on rvb0 (the XDP context's ingress ifindex), the one
    // interface rivorad is attached to here; the backends are out of it.
    w.put(
        "iface_mac_map",
        &rvb0,
        &rv_iface_mac {
            mac: [2, 0, 0, 0, 0, 3],
            flags: 0,
            pad: 0,
        },
    )?;
    let src6: Ipv6Addr = "fd00:99:2::1".parse().expect("constant");
    w.put(
        "tunnel_config_map",
        &0u32,
        &rv_tunnel_config {
            src4: be32(Ipv4Addr::new(10, 99, 2, 1)),
            src6: be32x4(src6),
        },
    )?;
    Ok(())
}

/// Service `svc` admits only sources in SOURCE_RANGES prefixes: the
/// client's /16 among others of every length, as the writer keys them
/// (the service id's 32 bits first), and the flag that says to look.
fn source_ranges(w: &PinWriter, svc: u32) -> Result<()> {
    let put = |addr: [u8; 4], len: u32| -> Result<()> {
        w.put(
            "source_range_map",
            &rv_source_range_key {
                prefixlen: 32 + len,
                svc_id: svc.to_be(),
                addr: be32(Ipv4Addr::from(addr)),
            },
            &rv_source_range { len },
        )
    };
    // A /16: the new-flow case varies the low half of the source.
    put([CLIENT[0], CLIENT[1], 0, 0], 16)?;
    for i in 1..SOURCE_RANGES {
        let len = 8 + (i * 7) % 25;
        let a = u32::from(Ipv4Addr::new(
            11 + (i % 200) as u8,
            i as u8,
            (i * 3) as u8,
            0,
        ));
        let masked = a & u32::MAX.checked_shl(32 - len).unwrap_or(0);
        put(Ipv4Addr::from(masked).octets(), len)?;
    }
    let path = w.0.join("service_config_map");
    let m = MapHandle::from_pinned_path(&path).context("opening service_config_map")?;
    let cur = m
        .lookup(&svc.to_ne_bytes(), MapFlags::ANY)
        .context("reading service_config_map")?
        .context("the service's entry")?;
    let mut s = rv_service::default();
    ensure!(
        cur.len() == std::mem::size_of::<rv_service>(),
        "rv_service's size"
    );
    // SAFETY: rv_service is a plain repr(C) struct of integers, as long
    // as the value read.
    unsafe {
        std::ptr::copy_nonoverlapping(
            cur.as_ptr(),
            (&mut s as *mut rv_service).cast::<u8>(),
            cur.len(),
        )
    };
    // Generation 1, as the writer's first: a flow stamped with it skips
    // the trie.
    s.flags |= rv_service_flags::RV_SVC_F_SOURCE_RANGES.0 | (1 << RANGES_GEN_SHIFT);
    w.put("service_config_map", &svc, &s)
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
    // IPv4 source address is at 14 + 12, the TCP/UDP source port at 14 + 20;
    // IPv6's source address ends at 14 + 8 + 16 (the wrapper writes the
    // last 16 bits of the word at ip_off), its L4 header is at 14 + 40.
    let ipv6 = case.pkt.get(12..14) == Some(&[0x86, 0xdd][..]);
    (p.ip_off, p.port_off) = if ipv6 { (34, 54) } else { (26, 34) };
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

/// `struct xdp_md` as BPF_PROG_TEST_RUN takes it: the packet received on
/// `ifindex` (data 0, data_end the length, the rest 0).
fn xdp_ctx(len: usize, ifindex: u32) -> Vec<u8> {
    [0u32, len as u32, 0, ifindex, 0, 0]
        .iter()
        .flat_map(|w| w.to_ne_bytes())
        .collect()
}

fn test_run(
    prog: &ProgramMut<'_>,
    pkt: &[u8],
    repeat: u32,
    ctx: Option<&[u8]>,
) -> Result<(u32, f64)> {
    let (v, ns, _) = test_run_out(prog, pkt, repeat, ctx)?;
    Ok((v, ns))
}

/// [`test_run`], with the packet as the last run left it.
fn test_run_out(
    prog: &ProgramMut<'_>,
    pkt: &[u8],
    repeat: u32,
    ctx: Option<&[u8]>,
) -> Result<(u32, f64, Vec<u8>)> {
    let mut out = vec![0u8; pkt.len() + 256];
    let mut ctx = ctx.map(<[u8]>::to_vec);
    let input = ProgramInput {
        data_in: Some(pkt),
        data_out: Some(&mut out),
        context_in: ctx.as_deref_mut(),
        repeat,
        ..Default::default()
    };
    let o = prog.test_run(input).context("BPF_PROG_TEST_RUN")?;
    let data = o.data.map(|d| d.to_vec()).unwrap_or_default();
    Ok((o.return_value, o.duration.as_nanos() as f64, data))
}

pub fn run(results: &mut Results) -> Result<()> {
    let ns = bench_ns()?;
    // Everything runs on a thread inside the namespace.
    let (measured, exhaustion) = spawn_in(&ns, measure)
        .join()
        .map_err(|_| anyhow::anyhow!("bench thread panicked"))??;
    drop(ns);

    let get = |k: &str| {
        measured
            .iter()
            .find(|(n, _, _)| n == k)
            .map(|(_, v, _)| *v)
            .unwrap_or(f64::NAN)
    };
    let floor = get("xdp_floor_ns");
    let tc_floor = get("tc_floor_ns");
    for (k, v, _) in &measured {
        if k == "tc_floor_ns" {
            continue;
        }
        results.set(k, *v);
    }
    for (k, v, (lo, hi)) in &measured {
        let f = if k.starts_with("tc_") {
            tc_floor
        } else {
            floor
        };
        let times = if k != "xdp_floor_ns" && k != "tc_floor_ns" {
            format!("{:>6.2}x floor", v / f)
        } else {
            String::new()
        };
        results.note(format!("  {k:<40} {times:>13}  rounds {lo:.0}-{hi:.0} ns"));
    }
    results.note(format!(
        "  (floor = wrapper + tail call + return: XDP {floor:.1} ns, TC {tc_floor:.1} ns)"
    ));
    // The per-packet targets: ratios within this run.
    let net = |k: &str| get(k) - floor;
    let ratio = |a: &str, b: &str| get(a) / get(b);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    results.note(format!(
        "  per-packet targets (load {}): nat/dsr v4 {:.2} (<= 1.15), l3dsr/dsr v4 {:.2} (<= 1.25), v6/v4 nat {:.2} dsr {:.2} l3dsr {:.2} (<= 1.15), syn nat/dsr {:.2} (<= 1.2), nonvip/floor {:.2} (<= 1.6), dsr v4 after/before {:.2} (< 1); over the floor: nat/dsr v4 {:.2}, l3dsr/dsr v4 {:.2}",
        load.split_whitespace().take(3).collect::<Vec<_>>().join(" "),
        ratio("xdp_established_nat_v4_ns", "xdp_established_dsr_v4_ns"),
        ratio("xdp_established_l3dsr_v4_ns", "xdp_established_dsr_v4_ns"),
        ratio("xdp_established_nat_v6_ns", "xdp_established_nat_v4_ns"),
        ratio("xdp_established_dsr_v6_ns", "xdp_established_dsr_v4_ns"),
        ratio("xdp_established_l3dsr_v6_ns", "xdp_established_l3dsr_v4_ns"),
        ratio("xdp_syn_nat_v4_ns", "xdp_syn_dsr_v4_ns"),
        ratio("xdp_nonvip_pass_ns", "xdp_floor_ns"),
        ratio("xdp_established_dsr_v4_ns", "xdp_established_dsr_v4_before_ns"),
        net("xdp_established_nat_v4_ns") / net("xdp_established_dsr_v4_ns"),
        net("xdp_established_l3dsr_v4_ns") / net("xdp_established_dsr_v4_ns"),
    ));
    if measured
        .iter()
        .any(|(n, ..)| n == "xdp_established_nat_v4_sourceranges_ns")
    {
        let r = ratio(
            "xdp_established_nat_v4_sourceranges_ns",
            "xdp_established_nat_v4_ns",
        );
        results.set("xdp_established_nat_v4_sourceranges_ratio", r);
        results.note(format!(
            "  source ranges: NAT v4 with {SOURCE_RANGES} source ranges / without: established {r:.2} (<= 1.1), new flow {:.2}",
            ratio("xdp_syn_nat_v4_sourceranges_ns", "xdp_syn_nat_v4_ns"),
        ));
    }
    if FULLNAT_CASES
        .iter()
        .any(|(k, ..)| measured.iter().any(|(n, ..)| n == k))
    {
        results.note(format!(
            "  full NAT: fullnat/dsr established v4 {:.2} (<= 1.15), fullnat reply/dsr established v4 {:.2} (<= 1.15), syn fullnat/nat v4 {:.2} (<= 1.2), v6/v4 fullnat established {:.2} reply {:.2} syn {:.2} (<= 1.15)",
            ratio("xdp_established_fullnat_v4_ns", "xdp_established_dsr_v4_ns"),
            ratio("xdp_fullnat_reply_v4_ns", "xdp_established_dsr_v4_ns"),
            ratio("xdp_syn_fullnat_v4_ns", "xdp_syn_nat_v4_ns"),
            ratio("xdp_established_fullnat_v6_ns", "xdp_established_fullnat_v4_ns"),
            ratio("xdp_fullnat_reply_v6_ns", "xdp_fullnat_reply_v4_ns"),
            ratio("xdp_syn_fullnat_v6_ns", "xdp_syn_fullnat_v4_ns"),
        ));
    }
    if let Some(e) = exhaustion {
        results.set("fullnat_port_exhaustion_admitted", e.admitted as f64);
        results.set("fullnat_port_exhaustion_dropped", e.dropped as f64);
        results.set("fullnat_port_exhaustion_collisions", e.collisions as f64);
        results.note(format!(
            "  full NAT's ports: {} ports, one backend, {} new flows from {} CPUs: {} admitted ({}), {} dropped as exhausted ({}), {} flows sharing a tuple with another (0)",
            e.ports,
            e.offered,
            std::thread::available_parallelism().map_or(1, |n| n.get().min(2)),
            e.admitted,
            e.ports,
            e.dropped,
            e.offered - e.ports,
            e.collisions
        ));
    }
    Ok(())
}

/// Full NAT's timed cases (`fullnat.rs`): key, what is sent, the family.
const FULLNAT_CASES: [(&str, Role, Fam); 6] = [
    ("xdp_established_fullnat_v4_ns", Role::Established, Fam::V4),
    ("xdp_established_fullnat_v6_ns", Role::Established, Fam::V6),
    ("xdp_fullnat_reply_v4_ns", Role::Reply, Fam::V4),
    ("xdp_fullnat_reply_v6_ns", Role::Reply, Fam::V6),
    ("xdp_syn_fullnat_v4_ns", Role::NewFlow, Fam::V4),
    ("xdp_syn_fullnat_v6_ns", Role::NewFlow, Fam::V6),
];

/// `fullnat::port_exhaustion`'s keys: counts, not times.
const EXHAUSTION_KEYS: [&str; 3] = [
    "fullnat_port_exhaustion_admitted",
    "fullnat_port_exhaustion_dropped",
    "fullnat_port_exhaustion_collisions",
];

/// The baseline's xdp_ingress (bench/build.rs, `make bench-compare
/// BASE=REV`), loaded with maps of its own
/// pinned under `dir`: the program and the object that keeps it alive.
#[cfg(rivora_baseline)]
fn load_baseline<'a>(
    dir: &std::path::Path,
    storage: &'a mut MaybeUninit<OpenObject>,
) -> Result<rivora_bench::bpf::xdp_ingress_base::XdpIngressSkel<'a>> {
    use rivora_bench::bpf::xdp_ingress_base::XdpIngressSkelBuilder;
    std::fs::create_dir_all(dir).context("baseline pin dir")?;
    let mut open = XdpIngressSkelBuilder::default()
        .open(storage)
        .context("opening the baseline xdp_ingress")?;
    for mut m in open.open_object_mut().maps_mut() {
        let name = m.name().to_string_lossy().to_string();
        // .rodata and friends (named "xdp_ingr.rodata") belong to the
        // object: pinning them fails with EPERM.
        if name.contains('.') {
            continue;
        }
        m.set_pin_path(dir.join(&name))
            .with_context(|| format!("pin path of {name}"))?;
    }
    open.load().context("loading the baseline xdp_ingress")
}

/// Per key: the median of the rounds, and their (min, max).
type Measured = Vec<(String, f64, (f64, f64))>;

fn measure() -> Result<(Measured, Option<Exhaustion>)> {
    let pin_dir = PathBuf::from(format!("/sys/fs/bpf/rivora-bench-{}", std::process::id()));
    let base_dir = PathBuf::from(format!(
        "/sys/fs/bpf/rivora-bench-base-{}",
        std::process::id()
    ));
    let _ = Datapath::unpin_all(&pin_dir);
    struct Unpin(PathBuf, PathBuf);
    impl Drop for Unpin {
        fn drop(&mut self) {
            let _ = Datapath::unpin_all(&self.0);
            let _ = std::fs::remove_dir_all(&self.1);
        }
    }
    let _unpin = Unpin(pin_dir.clone(), base_dir.clone());
    let dp = Datapath::load(&LoadOptions {
        pin_dir: pin_dir.clone(),
        ..Default::default()
    })?;
    let rvb0 = rivora::dataplane::attach::ifindex("rvb0").context("rvb0 in the bench netns")?;
    // The next hops rivorad's watcher resolves here, from the namespace's
    // routes and permanent neighbours.
    let addrs: BTreeSet<IpAddr> = BACKENDS
        .iter()
        .map(|b| IpAddr::V4(Ipv4Addr::from(*b)))
        .chain(
            BACKENDS6
                .iter()
                .map(|b| IpAddr::V6(b.parse().expect("constant"))),
        )
        .collect();
    let nh = rivora::nexthop::resolve_now(&BTreeSet::from([rvb0]), &addrs)
        .context("resolving next hops")?;
    ensure!(
        nh.len() == addrs.len() && nh.values().all(|n| n.flags == NextHop::VALID),
        "next hops not all resolved: {nh:?}"
    );
    program_maps(&PinWriter(pin_dir.clone()), &nh, rvb0)?;

    let only = std::env::var("RIVORA_BENCH_ONLY").ok();
    let wanted = |key: &str| {
        only.as_deref()
            .is_none_or(|o| o.split(',').any(|k| k == key))
    };
    // Counts, not times: on a datapath of its own, before the rounds.
    let exhaustion = if EXHAUSTION_KEYS.iter().any(|k| wanted(k)) {
        Some(fullnat::port_exhaustion(&nh, rvb0).context("full NAT's port exhaustion")?)
    } else {
        None
    };
    let fnat = if FULLNAT_CASES.iter().any(|(k, ..)| wanted(k)) {
        Some(FullNat::measured(&nh, rvb0).context("the full-NAT datapath")?)
    } else {
        None
    };

    let mut base_storage = MaybeUninit::<OpenObject>::uninit();
    #[cfg(rivora_baseline)]
    let base = {
        let b = load_baseline(&base_dir, &mut base_storage)?;
        program_maps(&PinWriter(base_dir.clone()), &HashMap::new(), rvb0)?;
        Some(b)
    };
    #[cfg(not(rivora_baseline))]
    let base: Option<()> = {
        let _ = &mut base_storage;
        eprintln!(
            "rivora-bench: no baseline datapath, so no *_before_ns keys (make bench-compare BASE=REV builds one)"
        );
        None
    };
    #[cfg(rivora_baseline)]
    let base_fd = base
        .as_ref()
        .map(|b| b.progs.xdp_ingress.as_fd().as_raw_fd());
    #[cfg(not(rivora_baseline))]
    let base_fd: Option<i32> = base.map(|()| 0);

    let mut storage = MaybeUninit::<OpenObject>::uninit();
    let bench = BenchSkelBuilder::default()
        .open(&mut storage)
        .context("opening bench")?
        .load()
        .context("loading bench")?;

    let case = |key, before, pkt, vary, prog, ok| Case {
        key,
        before,
        pkt,
        vary,
        prog,
        ok,
    };
    const TX: &[u32] = &[XDP_TX];
    let mut cases = vec![
        case(
            "xdp_floor_ns",
            false,
            tcp4([10, 99, 50, 1], false),
            false,
            Prog::XdpFloor,
            &[XDP_PASS][..],
        ),
        case(
            "xdp_nonvip_pass_ns",
            true,
            tcp4([10, 99, 50, 1], false),
            false,
            Prog::Xdp,
            &[XDP_PASS],
        ),
        case(
            "xdp_syn_nat_v4_ns",
            true,
            tcp4(VIP_NAT, true),
            true,
            Prog::Xdp,
            TX,
        ),
        case(
            "xdp_established_nat_v4_ns",
            true,
            tcp4(VIP_NAT, false),
            false,
            Prog::Xdp,
            TX,
        ),
        case(
            "xdp_established_nat_v4_sourceranges_ns",
            false,
            tcp4(VIP_NAT_RANGES, false),
            false,
            Prog::Xdp,
            TX,
        ),
        case(
            "xdp_syn_nat_v4_sourceranges_ns",
            false,
            tcp4(VIP_NAT_RANGES, true),
            true,
            Prog::Xdp,
            TX,
        ),
        case(
            "xdp_established_nat_v6_ns",
            true,
            tcp6(false),
            false,
            Prog::Xdp,
            TX,
        ),
        case(
            "xdp_syn_dsr_v4_ns",
            true,
            tcp4(VIP_DSR, true),
            true,
            Prog::Xdp,
            TX,
        ),
        case(
            "xdp_established_dsr_v4_ns",
            true,
            tcp4(VIP_DSR, false),
            false,
            Prog::Xdp,
            TX,
        ),
        case(
            "xdp_established_dsr_v6_ns",
            true,
            tcp6_to(VIP6_DSR, false),
            false,
            Prog::Xdp,
            TX,
        ),
        case(
            "xdp_udp_dsr_v4_ns",
            true,
            udp4_dst(VIP_DSR_UDP, 53),
            false,
            Prog::Xdp,
            TX,
        ),
        case(
            "xdp_syn_l3dsr_v4_ns",
            true,
            tcp4(VIP_L3, true),
            true,
            Prog::Xdp,
            TX,
        ),
        case(
            "xdp_established_l3dsr_v4_ns",
            true,
            tcp4(VIP_L3, false),
            false,
            Prog::Xdp,
            TX,
        ),
        case(
            "xdp_established_l3dsr_v6_ns",
            true,
            tcp6_to(VIP6_L3, false),
            false,
            Prog::Xdp,
            TX,
        ),
        case(
            "xdp_udp_nat_v4_ns",
            true,
            udp4(VIP_UDP),
            false,
            Prog::Xdp,
            TX,
        ),
        case(
            "tc_floor_ns",
            false,
            tcp4_reply(),
            false,
            Prog::TcFloor,
            &[u32::MAX],
        ),
        case(
            "tc_nat_reply_v4_ns",
            false,
            tcp4_reply(),
            false,
            Prog::Tc,
            &[0],
        ),
    ];
    if let Some(f) = &fnat {
        for (key, role, fam) in FULLNAT_CASES {
            let pkt = match role {
                Role::Established => fullnat::request(fam, false),
                Role::NewFlow => fullnat::request(fam, true),
                // The reply to the established flow's port: its reverse
                // entry stays for the whole run (clear_new_flows keeps
                // it, and it does not expire: the replies refresh it).
                Role::Reply => {
                    let (backend, port) = f.prime(fam)?;
                    fullnat::reply(fam, backend, port)?
                }
            };
            cases.push(case(
                key,
                false,
                pkt,
                role == Role::NewFlow,
                Prog::XdpFullNat(role, fam),
                TX,
            ));
        }
    }
    let fnat_fd = fnat.as_ref().map(FullNat::xdp_fd);

    // The new-flow cases take each run's flow from the wrapper's counter,
    // which is per CPU. The bench thread may move to the other CPU between
    // batches and go on from that CPU's count, which may repeat counts the
    // first CPU sent moments ago: such a run is an established flow, not a
    // new one (seen: a full-NAT slice with one allocation fewer than its
    // runs). Each CPU counts from its own share of the 32 bits instead (a
    // run's flow is a one-to-one function of the count), far more than a
    // whole run of the bench sends.
    let ncpus = libbpf_rs::num_possible_cpus().context("possible CPUs")?;
    let stride = (1u64 << 32) / ncpus.max(1) as u64;
    let starts: Vec<Vec<u8>> = (0..ncpus as u64)
        .map(|i| ((i * stride) as u32).to_ne_bytes().to_vec())
        .collect();
    bench
        .maps
        .bench_ctr
        .update_percpu(&0u32.to_ne_bytes(), &starts, MapFlags::ANY)
        .context("bench_ctr")?;
    let xdp_progs = &bench.maps.bench_xdp_progs;
    let tc_progs = &bench.maps.bench_tc_progs;
    let set_target = |map: &libbpf_rs::MapMut<'_>, fd: i32| -> Result<()> {
        map.update(&0u32.to_ne_bytes(), &fd.to_ne_bytes(), MapFlags::ANY)
            .context("prog array")
    };
    // tc_nat's reply must find the NAT flow of an established flow (its
    // owner's affinity entry). Primed before every reply batch: the new-flow
    // cases insert a million flows each into the same LRU tables, and can
    // evict it (the reply then failed its verdict check: one run of five
    // here).
    let prime = tcp4(VIP_NAT, false);
    let prime_ctx = xdp_ctx(prime.len(), rvb0);
    let prime_flow = || -> Result<()> {
        let (v, _) = test_run(&dp.xdp().progs.xdp_ingress, &prime, 1, Some(&prime_ctx))?;
        ensure!(v == XDP_TX, "priming the NAT flow: verdict {v}");
        Ok(())
    };
    prime_flow()?;

    let new_fd = dp.xdp().progs.xdp_ingress.as_fd().as_raw_fd();
    let cases: Vec<&Case> = cases.iter().filter(|c| wanted(c.key)).collect();
    let mut samples: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for _round in 0..ROUNDS {
        // Per key: the round's total ns and runs, over its slices.
        let mut round: BTreeMap<String, (f64, f64)> = BTreeMap::new();
        for c in (0..SLICES).flat_map(|_| cases.iter().copied()) {
            if matches!(c.prog, Prog::Tc) {
                prime_flow()?;
            }
            // Full NAT: the established flow in place (the new-flow cases
            // may have evicted its affinity entry), and the drops so far.
            let fnat_drops = match c.prog {
                Prog::XdpFullNat(role, fam) => {
                    let f = fnat.as_ref().context("the full-NAT datapath")?;
                    if role == Role::Established {
                        f.prime(fam)?;
                    }
                    Some(f.drops()?)
                }
                _ => None,
            };
            set_pkt(&bench.maps.bench_pkt_map, c)?;
            let ctx = xdp_ctx(c.pkt.len(), rvb0);
            // Today's program, then (interleaved, same packet) the
            // baseline's.
            let mut runs: Vec<(String, &ProgramMut<'_>, i32, bool)> = Vec::new();
            match c.prog {
                Prog::XdpFloor => runs.push((
                    c.key.to_string(),
                    &bench.progs.bench_wrap_xdp,
                    bench.progs.bench_pass_xdp.as_fd().as_raw_fd(),
                    true,
                )),
                Prog::Xdp => {
                    runs.push((c.key.to_string(), &bench.progs.bench_wrap_xdp, new_fd, true));
                    if let (true, Some(fd)) = (c.before, base_fd) {
                        runs.push((
                            c.key.replace("_ns", "_before_ns"),
                            &bench.progs.bench_wrap_xdp,
                            fd,
                            true,
                        ));
                    }
                }
                Prog::XdpFullNat(..) => runs.push((
                    c.key.to_string(),
                    &bench.progs.bench_wrap_xdp,
                    fnat_fd.context("the full-NAT datapath")?,
                    true,
                )),
                Prog::TcFloor => runs.push((
                    c.key.to_string(),
                    &bench.progs.bench_wrap_tc,
                    bench.progs.bench_pass_tc.as_fd().as_raw_fd(),
                    false,
                )),
                Prog::Tc => runs.push((
                    c.key.to_string(),
                    &bench.progs.bench_wrap_tc,
                    dp.tc().progs.tc_nat.as_fd().as_raw_fd(),
                    false,
                )),
            }
            for (key, prog, target, xdp) in runs {
                if xdp {
                    set_target(xdp_progs, target)?;
                } else {
                    set_target(tc_progs, target)?;
                }
                let cx = xdp.then_some(ctx.as_slice());
                // One checked run, then the measured batch, then its
                // verdict: a wrapper that failed to restore would show.
                let (v, _) = test_run(prog, &c.pkt, 1, cx)?;
                if !c.ok.contains(&v) {
                    bail!("{key}: verdict {v}, expected one of {:?}", c.ok);
                }
                let (v, ns) = test_run(prog, &c.pkt, REPEAT / SLICES, cx)?;
                if !c.ok.contains(&v) {
                    bail!(
                        "{key}: verdict {v} after {} runs, expected one of {:?}",
                        REPEAT / SLICES,
                        c.ok
                    );
                }
                let t = round.entry(key).or_default();
                t.0 += ns * f64::from(REPEAT / SLICES);
                t.1 += f64::from(REPEAT / SLICES);
            }
            // Full NAT, beyond the verdicts of the batch's first and last
            // runs: no run of it dropped, and each new-flow run allocated
            // a port (its reverse entry, deleted here, outside the timed
            // part, so that the next slice's allocations find every port
            // free: fullnat.rs).
            if let (Prog::XdpFullNat(role, fam), Some(before)) = (c.prog, fnat_drops) {
                let f = fnat.as_ref().context("the full-NAT datapath")?;
                let dropped = f.drops()? - before;
                ensure!(dropped == 0, "{}: {dropped} runs dropped", c.key);
                if role == Role::NewFlow {
                    let runs = 1 + REPEAT / SLICES;
                    let n = f.clear_new_flows(fam)?;
                    ensure!(
                        n == runs as usize,
                        "{}: {n} ports allocated in {runs} runs, one a run expected",
                        c.key
                    );
                }
            }
        }
        for (key, (total, runs)) in round {
            samples.entry(key).or_default().push(total / runs);
        }
    }
    #[cfg(rivora_baseline)]
    drop(base);
    let measured = samples
        .into_iter()
        .map(|(k, s)| {
            let spread = s
                .iter()
                .copied()
                .fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
            (k, median(s), spread)
        })
        .collect();
    Ok((measured, exhaustion))
}
