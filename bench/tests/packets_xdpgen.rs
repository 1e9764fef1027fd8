//! The lab's XDP traffic generator (bench/bpf/xdpgen.bpf.c, `rivora_bench::xdpgen`):
//! what each frame carries, through plain BPF_PROG_TEST_RUN, and that live
//! frames really arrive at a veth's peer.

use std::collections::HashSet;
use std::net::Ipv4Addr;

use nix::sched::{sched_setaffinity, CpuSet};
use nix::unistd::Pid;
use rivora::dataplane::attach::ifindex;
use rivora::decap::Decap;
use rivora_bench::xdpgen::{Flows, Frame, Generator, FRAME_LEN, XDP_REDIRECT};
use rivora_testlab::netns::Netns;
use rivora_testlab::require::root_and_tools;

const RUNS: usize = 300;

fn frame() -> Frame {
    Frame {
        dst_mac: [2, 0, 0, 0, 0, 2],
        src_mac: [2, 0, 0, 0, 0, 1],
        src: Ipv4Addr::new(10, 211, 0, 1),
        dst: Ipv4Addr::new(10, 210, 100, 1),
        sport: 4242,
        dport: 9999,
    }
}

/// The one's-complement sum of an IPv4 header, its checksum included: a
/// valid header sums to 0xffff.
fn header_sum(hdr: &[u8]) -> u16 {
    let mut sum: u32 = hdr
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// The per-frame counter is per CPU: keep this thread on one.
fn pin_to_one_cpu() {
    let mut one = CpuSet::new();
    let cpu = nix::sched::sched_getaffinity(Pid::from_raw(0))
        .ok()
        .and_then(|set| (0..CpuSet::count()).find(|&c| set.is_set(c).unwrap_or(false)))
        .expect("an allowed CPU");
    one.set(cpu).expect("cpu set");
    sched_setaffinity(Pid::from_raw(0), &one).expect("pinning the test thread");
}

/// Runs `flows` RUNS times on a page of garbage (as a recycled live page
/// may hold) and checks each frame: XDP_REDIRECT, the template's bytes but
/// for the varied source, a valid IPv4 checksum, UDP checksum 0. Returns
/// each frame's (source address, source port).
fn frames(flows: Flows) -> Vec<(Ipv4Addr, u16)> {
    pin_to_one_cpu();
    let f = frame();
    let g = Generator::load(3, flows, 1 << 16, &f).expect("loading the generator");
    let template = *g.template();
    assert_eq!(header_sum(&template[14..34]), 0xffff, "template checksum");
    let mut seen = Vec::new();
    for i in 0..RUNS {
        let garbage = [(i as u8) ^ 0xa5; FRAME_LEN];
        let (verdict, out) = g.run_once(&garbage).expect("test run");
        assert_eq!(verdict, XDP_REDIRECT, "run {i}: verdict");
        assert_eq!(header_sum(&out[14..34]), 0xffff, "run {i}: IPv4 checksum");
        assert_eq!(&out[40..42], &[0, 0], "run {i}: UDP checksum 0");
        // Everything but the source address's low half, the source port
        // and the two checksums is the template's.
        for (k, (a, b)) in out.iter().zip(template.iter()).enumerate() {
            if !matches!(k, 24 | 25 | 28 | 29 | 34 | 35) {
                assert_eq!(a, b, "run {i}: byte {k}");
            }
        }
        let src = Ipv4Addr::new(out[26], out[27], out[28], out[29]);
        seen.push((src, u16::from_be_bytes([out[34], out[35]])));
    }
    seen
}

#[test]
fn one_flow_is_the_template() {
    root_and_tools("packets_xdpgen");
    for (src, port) in frames(Flows::One) {
        assert_eq!((src, port), (frame().src, frame().sport));
    }
}

#[test]
fn sixty_four_k_flows_vary_the_port() {
    root_and_tools("packets_xdpgen");
    let seen = frames(Flows::Many);
    let ports: HashSet<u16> = seen.iter().map(|&(_, p)| p).collect();
    assert_eq!(ports.len(), RUNS, "distinct source ports");
    for (src, port) in seen {
        assert_eq!(src, frame().src);
        assert_ne!(port, 0);
    }
}

#[test]
fn new_flows_are_all_distinct() {
    root_and_tools("packets_xdpgen");
    let seen = frames(Flows::New);
    let distinct: HashSet<(Ipv4Addr, u16)> = seen.iter().copied().collect();
    assert_eq!(distinct.len(), RUNS, "distinct (address, port)");
    let addrs: HashSet<Ipv4Addr> = seen.iter().map(|&(a, _)| a).collect();
    assert!(addrs.len() > 1, "the source address varies too");
    for (src, port) in seen {
        assert_eq!(src.octets()[..2], [10, 211], "{src}: inside 10.211/16");
        assert_ne!(port, 0);
    }
}

/// A veth's received packet count, read in its namespace.
fn rx_packets(ns: &Netns, dev: &str) -> u64 {
    let out = ns.exec(&format!("ip -s -o link show dev {dev}"));
    // "... RX: bytes packets ... \    N M ..." on one line with -o.
    let words: Vec<&str> = out.split_whitespace().collect();
    let at = words
        .iter()
        .position(|w| w.starts_with("RX:"))
        .unwrap_or_else(|| panic!("no RX statistics in `{out}`"));
    let labels = words[at + 1..].iter().take_while(|w| **w != "\\").count();
    words[at + 1 + labels + 2]
        .parse()
        .unwrap_or_else(|_| panic!("RX packets in `{out}`"))
}

/// Live frames (BPF_F_TEST_XDP_LIVE_FRAMES) redirected into a veth reach
/// its peer, every one of them.
#[test]
fn live_frames_arrive_at_the_peer() {
    root_and_tools("packets_xdpgen");
    const SENT: u32 = 5000;
    // One namespace per test process: the pid keeps parallel runs apart.
    let ns = Netns::new(&format!("xg{}", std::process::id() % 100_000));
    ns.sysctls(&[
        ("net.ipv6.conf.all.disable_ipv6", "1"),
        ("net.ipv6.conf.default.disable_ipv6", "1"),
    ]);
    ns.exec("ip link add g0 type veth peer name g1 && ip link set g0 up && ip link set g1 up");
    let before = rx_packets(&ns, "g1");
    ns.run(|| {
        pin_to_one_cpu();
        let decap = Decap::load().expect("loading xdp_pass");
        // A veth delivers redirected frames only when its peer runs XDP.
        let _link = decap
            .attach_pass(ifindex("g1").expect("g1"))
            .expect("xdp_pass on g1");
        let g = Generator::load(ifindex("g0").expect("g0"), Flows::New, 1 << 16, &frame())
            .expect("loading the generator");
        g.send(SENT, 64).expect("live frames");
    });
    // The peer's NAPI normally runs before the syscall returns; allow for
    // a loaded machine's ksoftirqd.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut got = rx_packets(&ns, "g1") - before;
    while got < u64::from(SENT) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
        got = rx_packets(&ns, "g1") - before;
    }
    assert_eq!(got, u64::from(SENT), "frames received by g1");
}
