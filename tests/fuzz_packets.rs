//! Mutated frames through xdp_ingress and tc_nat (BPF_PROG_TEST_RUN), each
//! output held to what its verdict promises.
//!
//! Seeds are built with etherparse for every shape the datapath handles
//! (IPv4/IPv6; TCP/UDP; ICMP and ICMPv6 errors; fragments; IPv4 options,
//! IPv6 extension headers; 0, 1 and 2 VLAN tags), addressed to VIPs of
//! every mode written by the real map writer. A seeded mutator (bit flips,
//! interesting bytes, truncation, trailing bytes, length fields, extension
//! header chains, VLAN stacks, fragment bits, another VIP's address) makes
//! the mutants; replies to the NAT flows go through tc_nat the same way.
//!
//! The oracle, per verdict:
//! - never XDP_ABORTED, never a verdict the program does not return;
//! - XDP_DROP: exactly one drop counter moved, by one, and it is a named
//!   reason (not `none`, not `frag_no_first`, which passes);
//! - XDP_PASS: the frame is unchanged (with `frag_no_first` the only
//!   counter that may move), or it is a rewrite docs/datapath.md's packet path
//!   hands to the kernel: a NAT request whose next hop this program does
//!   not send to, an ICMP error translated for its backend, an L3 DSR
//!   packet encapsulated for the kernel to route;
//! - XDP_TX / XDP_REDIRECT: a DSR, NAT or L3 DSR rewrite, no counter moved.
//!
//! A rewrite may change only the fields its mode rewrites, to a backend of
//! a VIP of that mode, and every checksum it touches keeps its ones'
//! complement residual: a frame that verified still verifies, and one that
//! did not (docs/datapath.md: IPv4 header checksums are not verified on the way
//! in) is forwarded with the same error for the next hop to drop, never
//! with an error moved elsewhere. An encapsulated frame carries the input's
//! IP packet byte for byte behind a correct outer header.
//!
//! RIVORA_FUZZ_FRAMES sets the number of mutants (default: a bounded run
//! for `make test`; `make fuzz` runs a million), RIVORA_FUZZ_SEED the seed.

mod common;

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Instant;

use common::fixture::{backend, vip, vip_range, with_rate_limit, Fx, State};
use common::fixtures::{self, Frame, Vlan, IPPROTO_DSTOPTS, IPPROTO_HOPOPTS, IPPROTO_ROUTING};
use common::netns::Netns;
use common::{require, unique};
use common::{PROTO_TCP, PROTO_UDP, TCX_NEXT, TCX_PASS, XDP_DROP, XDP_PASS, XDP_REDIRECT, XDP_TX};
use etherparse::{
    Icmpv4Header, Icmpv4Type, Icmpv6Header, Icmpv6Type, IpNumber, Ipv4Header, Ipv6FlowLabel,
    Ipv6Header,
};
use rivora::abi::{self, rv_drop_reason, DROP_REASONS};
use rivora::model::{Mode, Vip};

const DEFAULT_FRAMES: u64 = 200_000;
const DEFAULT_SEED: u64 = 0x5eed_0fa1_1f1a;

const MAC_LB: [u8; 6] = [0x02, 0x1b, 0, 0, 0, 0x01];
const MAC_LB2: [u8; 6] = [0x02, 0x1b, 0, 0, 0, 0x02];
const MAC_GW: [u8; 6] = [0x02, 0x9a, 0, 0, 0, 0x01];
const MAC_GW2: [u8; 6] = [0x02, 0x9a, 0, 0, 0, 0x02];
const IPPROTO_FRAGMENT: u8 = 44;

// A deterministic generator (SplitMix64): the same seed gives the same
// mutants, so a failure is reproduced by its seed and index.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len())]
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number")),
        Err(_) => default,
    }
}

fn v4(s: &str) -> Ipv4Addr {
    s.parse().expect("IPv4 literal")
}

fn v6(s: &str) -> Ipv6Addr {
    s.parse().expect("IPv6 literal")
}

// Checksums: ones' complement sums, compared as residuals.

fn sum16(bytes: &[u8]) -> u64 {
    let mut s = 0u64;
    let mut it = bytes.chunks_exact(2);
    for w in &mut it {
        s += u64::from(u16::from_be_bytes([w[0], w[1]]));
    }
    if let [b] = it.remainder() {
        s += u64::from(*b) << 8;
    }
    s
}

/// The folded sum, with ones' complement's two zeros made one: a field
/// updated by RFC 1624 keeps this value exactly.
fn residual(mut s: u64) -> u16 {
    while s >> 16 != 0 {
        s = (s & 0xffff) + (s >> 16);
    }
    if s == 0xffff {
        0
    } else {
        s as u16
    }
}

fn be16(f: &[u8], off: usize) -> u16 {
    u16::from_be_bytes([f[off], f[off + 1]])
}

fn addr_at(f: &[u8], off: usize, v6: bool) -> IpAddr {
    if v6 {
        let b: [u8; 16] = f[off..off + 16].try_into().expect("16 bytes");
        IpAddr::V6(Ipv6Addr::from(b))
    } else {
        let b: [u8; 4] = f[off..off + 4].try_into().expect("4 bytes");
        IpAddr::V4(Ipv4Addr::from(b))
    }
}

/// A frame's layers as offsets, read the way docs/datapath.md describes the
/// datapath's parser (two VLAN tags at most, the IPv6 extension headers
/// it walks); only offsets and addresses, no judgement.
#[derive(Clone, Debug)]
struct Layers {
    l3: usize,
    v6: bool,
    /// End of the IP packet as its header claims it, clamped to the frame.
    ip_end: usize,
    proto: u8,
    /// None: a later fragment (no L4 header).
    l4: Option<usize>,
    frag: bool,
    src: IpAddr,
    dst: IpAddr,
}

impl Layers {
    fn parse(f: &[u8]) -> Option<Self> {
        let mut et = be16(f.get(..14)?, 12);
        let mut l3 = 14;
        for _ in 0..2 {
            if et != 0x8100 && et != 0x88a8 {
                break;
            }
            et = be16(f.get(..l3 + 4)?, l3 + 2);
            l3 += 4;
        }
        match et {
            0x0800 => {
                let h = f.get(l3..l3 + 20)?;
                let ihl = usize::from(h[0] & 0xf) * 4;
                let ip_end = (l3 + usize::from(be16(h, 2))).min(f.len());
                let frag = be16(h, 6);
                let later = frag & 0x1fff != 0;
                Some(Self {
                    l3,
                    v6: false,
                    ip_end,
                    proto: h[9],
                    l4: (!later).then_some(l3 + ihl),
                    frag: frag & 0x3fff != 0,
                    src: addr_at(f, l3 + 12, false),
                    dst: addr_at(f, l3 + 16, false),
                })
            }
            0x86dd => {
                let h = f.get(l3..l3 + 40)?;
                let ip_end = (l3 + 40 + usize::from(be16(h, 4))).min(f.len());
                let mut nh = h[6];
                let mut off = l3 + 40;
                let mut frag = false;
                let mut later = false;
                loop {
                    match nh {
                        IPPROTO_HOPOPTS | IPPROTO_DSTOPTS | IPPROTO_ROUTING => {
                            let e = f.get(off..off + 2)?;
                            nh = e[0];
                            off += (usize::from(e[1]) + 1) * 8;
                        }
                        IPPROTO_FRAGMENT => {
                            let e = f.get(off..off + 8)?;
                            nh = e[0];
                            frag = true;
                            later = be16(e, 2) & 0xfff8 != 0;
                            off += 8;
                            if later {
                                break;
                            }
                        }
                        _ => break,
                    }
                }
                Some(Self {
                    l3,
                    v6: true,
                    ip_end,
                    proto: nh,
                    l4: (!later).then_some(off),
                    frag,
                    src: addr_at(f, l3 + 8, true),
                    dst: addr_at(f, l3 + 24, true),
                })
            }
            _ => None,
        }
    }

    fn dst_off(&self) -> usize {
        self.l3 + if self.v6 { 24 } else { 16 }
    }

    fn src_off(&self) -> usize {
        self.l3 + if self.v6 { 8 } else { 12 }
    }

    fn alen(&self) -> usize {
        if self.v6 {
            16
        } else {
            4
        }
    }

    fn ihl(&self, f: &[u8]) -> usize {
        usize::from(f[self.l3] & 0xf) * 4
    }

    /// Residual of the IPv4 header checksum.
    fn ip4_residual(&self, f: &[u8]) -> u16 {
        residual(sum16(&f[self.l3..self.l3 + self.ihl(f)]))
    }
}

/// Residual of an L4 checksum over the pseudo-header of (src, dst) and the
/// bytes from `l4` to `end` (a fragment's or a quote's part of the segment:
/// a correct incremental update keeps even a partial sum).
fn l4_residual(
    f: &[u8],
    src: usize,
    dst: usize,
    alen: usize,
    proto: u8,
    l4: usize,
    end: usize,
) -> u16 {
    let end = end.max(l4).min(f.len());
    let mut s = sum16(&f[src..src + alen]) + sum16(&f[dst..dst + alen]);
    s += u64::from(proto) + (end - l4) as u64;
    s += sum16(&f[l4..end]);
    residual(s)
}

fn l4_csum_off(proto: u8) -> Option<usize> {
    match proto {
        PROTO_TCP => Some(16),
        PROTO_UDP => Some(6),
        _ => None,
    }
}

// What the maps say: every VIP of the test, by mode.

#[derive(Clone, Debug)]
struct VipInfo {
    addr: IpAddr,
    ports: (u16, u16),
    proto: u8,
    mode: Mode,
    /// (address, port; 0 keeps the client's destination port).
    backends: Vec<(IpAddr, u16, [u8; 6])>,
}

impl VipInfo {
    fn from_vip(v: &Vip) -> Self {
        let ports = match v.ports {
            rivora::model::Ports::One(p) => (p, p),
            rivora::model::Ports::Range { first, last } => (first, last),
        };
        Self {
            addr: v.addr,
            ports,
            proto: v.proto.number(),
            mode: v.mode,
            backends: v
                .backends
                .iter()
                .map(|b| (b.addr, b.port, b.mac.map(|m| m.0).unwrap_or([0; 6])))
                .collect(),
        }
    }

    fn has_port(&self, p: u16) -> bool {
        (self.ports.0..=self.ports.1).contains(&p)
    }
}

struct Env {
    vips: Vec<VipInfo>,
    tunnel4: Ipv4Addr,
    tunnel6: Ipv6Addr,
}

impl Env {
    /// The VIPs of `mode` a rewrite of a frame to `dst` (and, when the
    /// frame has ports, `port`/`proto`) may come from. Later fragments and
    /// ICMP errors are steered by state or by their quote, which names the
    /// same VIP address: so they match on the address alone.
    fn candidates(&self, mode: Mode, dst: IpAddr, port: Option<(u16, u8)>) -> Vec<&VipInfo> {
        self.vips
            .iter()
            .filter(|v| v.mode == mode && v.addr == dst)
            .filter(|v| port.is_none_or(|(p, proto)| v.proto == proto && v.has_port(p)))
            .collect()
    }

    /// Is (addr, port) where a backend of one of `vips` lives, for a
    /// client's destination port `vport` (None: any)?
    fn is_backend(vips: &[&VipInfo], addr: IpAddr, port: Option<u16>, vport: Option<u16>) -> bool {
        vips.iter().any(|v| {
            v.backends.iter().any(|&(a, p, _)| {
                a == addr
                    && match (port, p) {
                        (None, _) => true,
                        (Some(got), 0) => vport.is_none_or(|vp| vp == got) && v.has_port(got),
                        (Some(got), p) => got == p,
                    }
            })
        })
    }
}

/// Byte offsets a rewrite may change.
struct Allowed(Vec<std::ops::Range<usize>>);

impl Allowed {
    fn check(&self, inp: &[u8], out: &[u8]) -> Result<(), String> {
        for (i, (a, b)) in inp.iter().zip(out).enumerate() {
            if a != b && !self.0.iter().any(|r| r.contains(&i)) {
                return Err(format!(
                    "byte {i} changed ({a:#04x} -> {b:#04x}) outside the rewritten fields"
                ));
            }
        }
        Ok(())
    }
}

fn ensure(cond: bool, what: impl FnOnce() -> String) -> Result<(), String> {
    if cond {
        Ok(())
    } else {
        Err(what())
    }
}

/// The outcomes seen, by name, for the summary and the coverage check.
type Tally = BTreeMap<String, u64>;

// The XDP oracle.

fn check_xdp(
    env: &Env,
    inp: &[u8],
    verdict: u32,
    out: &[u8],
    moved: &[(usize, u64)],
) -> Result<String, String> {
    match verdict {
        XDP_DROP => {
            ensure(moved.len() == 1 && moved[0].1 == 1, || {
                format!("XDP_DROP moved drop counters {moved:?}, not exactly one by one")
            })?;
            let r = DROP_REASONS[moved[0].0];
            ensure(
                r != rv_drop_reason::RV_DROP_NONE && r != rv_drop_reason::RV_DROP_FRAG_NO_FIRST,
                || {
                    format!(
                        "XDP_DROP counted as {:?}, which is not a drop",
                        abi::drop_reason_label(r)
                    )
                },
            )?;
            let label = abi::drop_reason_label(r).ok_or("drop reason without a name")?;
            Ok(format!("xdp drop {label}"))
        }
        XDP_PASS | XDP_TX | XDP_REDIRECT => {
            let fwd = verdict != XDP_PASS;
            if out == inp && !fwd {
                return match moved {
                    [] => Ok("xdp pass unchanged".into()),
                    [(i, 1)] if DROP_REASONS[*i] == rv_drop_reason::RV_DROP_FRAG_NO_FIRST => {
                        Ok("xdp pass frag_no_first".into())
                    }
                    _ => Err(format!(
                        "XDP_PASS, unchanged, moved drop counters {moved:?}"
                    )),
                };
            }
            ensure(moved.is_empty(), || {
                format!("a rewrite moved drop counters {moved:?}")
            })?;
            let name = match verdict {
                XDP_TX => "tx",
                XDP_REDIRECT => "redirect",
                _ => "pass",
            };
            let kind = rewrite_xdp(env, inp, out, fwd)?;
            Ok(format!("xdp {name} {kind}"))
        }
        v => Err(format!("verdict {v} (XDP_ABORTED is 0)")),
    }
}

fn rewrite_xdp(env: &Env, inp: &[u8], out: &[u8], fwd: bool) -> Result<&'static str, String> {
    let p = Layers::parse(inp).ok_or("rewrote a frame that has no IP header")?;
    let grow = out.len() as isize - inp.len() as isize;
    if grow == 20 || grow == 40 {
        return l3dsr(env, &p, inp, out, fwd);
    }
    ensure(grow == 0, || format!("the frame grew by {grow} bytes"))?;
    if inp[12..] == out[12..] {
        // Only the MACs: DSR.
        ensure(fwd, || "a DSR rewrite with XDP_PASS".into())?;
        let vips = env.candidates(Mode::Dsr, p.dst, None);
        ensure(
            vips.iter()
                .any(|v| v.backends.iter().any(|b| b.2 == out[0..6])),
            || {
                format!(
                    "DSR to {:02x?}, not a backend of a DSR VIP at {}",
                    &out[0..6],
                    p.dst
                )
            },
        )?;
        ensure(out[6..12] == MAC_LB, || {
            "DSR source MAC is not the interface's".into()
        })?;
        return Ok("dsr");
    }
    let icmp = matches!((p.v6, p.proto), (false, 1) | (true, 58));
    if icmp && p.l4.is_some() {
        ensure(!fwd, || {
            "an ICMP error NAT'd and sent by XDP (docs/datapath.md: left to the kernel)".into()
        })?;
        return icmp_nat_xdp(env, &p, inp, out);
    }
    nat_xdp(env, &p, inp, out, fwd)
}

fn fwd_macs(out: &[u8]) -> Result<(), String> {
    ensure(
        (out[0..6] == MAC_GW && out[6..12] == MAC_LB)
            || (out[0..6] == MAC_GW2 && out[6..12] == MAC_LB2),
        || {
            format!(
                "forwarded with MACs {:02x?} -> {:02x?}, not the FIB's",
                &out[6..12],
                &out[0..6]
            )
        },
    )
}

fn nat_xdp(
    env: &Env,
    p: &Layers,
    inp: &[u8],
    out: &[u8],
    fwd: bool,
) -> Result<&'static str, String> {
    let mut allowed = Vec::new();
    allowed.push(p.dst_off()..p.dst_off() + p.alen());
    if fwd {
        allowed.push(0..12);
        fwd_macs(out)?;
    }
    let ttl = p.l3 + if p.v6 { 7 } else { 8 };
    if !p.v6 {
        allowed.push(p.l3 + 10..p.l3 + 12);
        allowed.push(ttl..ttl + 1);
    } else {
        allowed.push(ttl..ttl + 1);
    }
    let want_ttl = if fwd {
        inp[ttl].wrapping_sub(1)
    } else {
        inp[ttl]
    };
    ensure(out[ttl] == want_ttl, || {
        format!("TTL {} -> {} (forwarded: {fwd})", inp[ttl], out[ttl])
    })?;
    if !p.v6 {
        ensure(p.ip4_residual(inp) == p.ip4_residual(out), || {
            "the IPv4 header checksum's residual moved".into()
        })?;
    }
    let new_dst = addr_at(out, p.dst_off(), p.v6);
    let kind = match p.l4 {
        None => {
            let vips = env.candidates(Mode::Nat, p.dst, None);
            ensure(Env::is_backend(&vips, new_dst, None, None), || {
                format!(
                    "later fragment to {new_dst}: not a backend of a NAT VIP at {}",
                    p.dst
                )
            })?;
            "nat later-fragment"
        }
        Some(l4) => {
            let csum =
                l4_csum_off(p.proto).ok_or_else(|| format!("NAT of protocol {}", p.proto))?;
            ensure(l4 + csum + 2 <= inp.len(), || {
                "NAT of a frame that ends inside its L4 header".into()
            })?;
            allowed.push(l4 + 2..l4 + 4);
            allowed.push(l4 + csum..l4 + csum + 2);
            let (vport, bport) = (be16(inp, l4 + 2), be16(out, l4 + 2));
            let vips = env.candidates(Mode::Nat, p.dst, Some((vport, p.proto)));
            ensure(
                Env::is_backend(&vips, new_dst, Some(bport), Some(vport)),
                || {
                    format!(
                        "NAT to {new_dst}:{bport}: not a backend of a NAT VIP {}:{vport}/{}",
                        p.dst, p.proto
                    )
                },
            )?;
            let (in_c, out_c) = (be16(inp, l4 + csum), be16(out, l4 + csum));
            if p.proto == PROTO_UDP && !p.v6 && in_c == 0 {
                ensure(out_c == 0, || {
                    "an IPv4 UDP datagram without a checksum got one".into()
                })?;
            } else {
                ensure(p.proto != PROTO_UDP || out_c != 0, || {
                    "a UDP checksum became 0 (none)".into()
                })?;
                let r = |f: &[u8]| {
                    l4_residual(f, p.src_off(), p.dst_off(), p.alen(), p.proto, l4, p.ip_end)
                };
                ensure(r(inp) == r(out), || {
                    "the L4 checksum's residual moved".into()
                })?;
            }
            if p.frag {
                "nat first-fragment"
            } else {
                "nat"
            }
        }
    };
    Allowed(allowed).check(inp, out)?;
    Ok(kind)
}

/// Offsets of an ICMP error's quote: (inner l3, inner header length,
/// inner protocol, inner l4).
fn quote(p: &Layers, f: &[u8]) -> Option<(usize, usize, u8, usize)> {
    let in3 = p.l4? + 8;
    if p.v6 {
        let nh = *f.get(in3 + 6)?;
        Some((in3, 40, nh, in3 + 40))
    } else {
        let ihl = usize::from(f.get(in3)? & 0xf) * 4;
        Some((in3, ihl, *f.get(in3 + 9)?, in3 + ihl))
    }
}

fn icmp_nat_xdp(env: &Env, p: &Layers, inp: &[u8], out: &[u8]) -> Result<&'static str, String> {
    let l4 = p.l4.expect("checked by the caller");
    let (in3, ihl, proto, in4) = quote(p, inp).ok_or("an ICMP error rewritten without a quote")?;
    let asrc = in3 + if p.v6 { 8 } else { 12 };
    let adst = in3 + if p.v6 { 24 } else { 16 };
    let mut allowed = vec![
        p.dst_off()..p.dst_off() + p.alen(),
        l4 + 2..l4 + 4,
        asrc..asrc + p.alen(),
        in4..in4 + 2,
    ];
    if !p.v6 {
        allowed.push(p.l3 + 10..p.l3 + 12);
        allowed.push(in3 + 10..in3 + 12);
        ensure(p.ip4_residual(inp) == p.ip4_residual(out), || {
            "outer IPv4 checksum residual moved".into()
        })?;
        let r = |f: &[u8]| residual(sum16(&f[in3..in3 + ihl]));
        ensure(r(inp) == r(out), || {
            "quoted IPv4 checksum residual moved".into()
        })?;
    }
    let c = l4_csum_off(proto).ok_or("quote neither TCP nor UDP")?;
    // Only within the ICMP message: bytes past the IP packet's end are no
    // part of it, and its checksum cannot account for them.
    if in4 + c + 2 <= p.ip_end {
        allowed.push(in4 + c..in4 + c + 2);
    }
    ensure(in4 + 4 <= p.ip_end, || {
        "rewrote a quote whose ports lie past the IP packet's end".into()
    })?;
    let vport = be16(inp, in4);
    let (backend, bport) = (addr_at(out, p.dst_off(), p.v6), be16(out, in4));
    ensure(addr_at(out, asrc, p.v6) == backend, || {
        "the quote's source is not the error's new destination".into()
    })?;
    let vips = env.candidates(Mode::Nat, p.dst, Some((vport, proto)));
    ensure(
        Env::is_backend(&vips, backend, Some(bport), Some(vport)),
        || {
            format!(
                "ICMP error steered to {backend}:{bport}, not a backend of NAT VIP {}:{vport}",
                p.dst
            )
        },
    )?;
    let icmp_r = |f: &[u8]| {
        if p.v6 {
            l4_residual(f, p.src_off(), p.dst_off(), 16, 58, l4, p.ip_end)
        } else {
            residual(sum16(&f[l4..p.ip_end]))
        }
    };
    ensure(icmp_r(inp) == icmp_r(out), || {
        "the ICMP checksum's residual moved".into()
    })?;
    let q = |f: &[u8]| l4_residual(f, asrc, adst, p.alen(), proto, in4, p.ip_end);
    if in4 + c + 2 <= p.ip_end && !(proto == PROTO_UDP && !p.v6 && be16(inp, in4 + c) == 0) {
        ensure(q(inp) == q(out), || {
            "the quoted L4 checksum's residual moved".into()
        })?;
    }
    Allowed(allowed).check(inp, out)?;
    Ok("icmp-nat")
}

fn l3dsr(env: &Env, p: &Layers, inp: &[u8], out: &[u8], fwd: bool) -> Result<&'static str, String> {
    let hl = if p.v6 { 40 } else { 20 };
    ensure(out.len() == inp.len() + hl, || {
        "encapsulation of the wrong size for the family".into()
    })?;
    let l2 = p.l3;
    ensure(inp.len() >= p.l3 + hl, || {
        "encapsulated a frame shorter than its IP header".into()
    })?;
    if fwd {
        fwd_macs(out)?;
        ensure(out[12..l2] == inp[12..l2], || {
            "EtherType or tags changed".into()
        })?;
    } else {
        ensure(out[..l2] == inp[..l2], || {
            "L2 changed on an encapsulation left to the kernel".into()
        })?;
    }
    ensure(out[l2 + hl..] == inp[l2..], || {
        "the inner packet is not the input's, byte for byte".into()
    })?;
    let o = &out[l2..l2 + hl];
    let inner_len = if p.v6 {
        40 + be16(inp, p.l3 + 4)
    } else {
        be16(inp, p.l3 + 2)
    };
    let backend = if p.v6 {
        ensure(o[0] >> 4 == 6 && o[6] == 41 && o[7] == 64, || {
            "outer IPv6 header: version, next header 41, hop limit 64".into()
        })?;
        let tc_in = (be16(inp, p.l3) >> 4) & 0xff;
        ensure((be16(o, 0) >> 4) & 0xff == tc_in, || {
            "outer traffic class is not the inner's".into()
        })?;
        ensure(be16(o, 4) == inner_len, || "outer payload length".into())?;
        ensure(o[8..24] == env.tunnel6.octets(), || {
            "outer source is not the tunnel source".into()
        })?;
        addr_at(o, 24, true)
    } else {
        ensure(o[0] == 0x45 && o[8] == 64 && o[9] == 4, || {
            "outer IPv4 header: 0x45, TTL 64, protocol 4".into()
        })?;
        ensure(o[1] == inp[p.l3 + 1], || {
            "outer TOS is not the inner's".into()
        })?;
        ensure(be16(o, 2) == inner_len.wrapping_add(20), || {
            "outer total length".into()
        })?;
        let df = be16(inp, p.l3 + 6) & 0x4000;
        ensure(be16(o, 6) == df, || {
            "outer DF is not the inner's (and no offset)".into()
        })?;
        ensure(df == 0 || be16(o, 4) == 0, || {
            "an atomic datagram's outer id is not 0".into()
        })?;
        ensure(residual(sum16(o)) == 0, || {
            "outer IPv4 header checksum".into()
        })?;
        ensure(o[12..16] == env.tunnel4.octets(), || {
            "outer source is not the tunnel source".into()
        })?;
        addr_at(o, 16, false)
    };
    let vips = env.candidates(Mode::L3Dsr, p.dst, None);
    ensure(Env::is_backend(&vips, backend, None, None), || {
        format!(
            "encapsulated to {backend}, not a backend of an L3 DSR VIP at {}",
            p.dst
        )
    })?;
    Ok("l3dsr")
}

// The tc oracle.

fn check_tc(env: &Env, inp: &[u8], verdict: i32, out: &[u8]) -> Result<String, String> {
    match verdict {
        TCX_NEXT => {
            ensure(out == inp, || {
                "TCX_NEXT with a changed frame (a half-done rewrite)".into()
            })?;
            Ok("tc next".into())
        }
        TCX_PASS => {
            let p = Layers::parse(inp).ok_or("TCX_PASS for a frame without IP")?;
            ensure(out.len() == inp.len(), || {
                "tc changed the frame's length".into()
            })?;
            let icmp = matches!((p.v6, p.proto), (false, 1) | (true, 58));
            let kind = if icmp && p.l4.is_some() {
                icmp_rev_tc(env, &p, inp, out)?
            } else {
                snat_tc(env, &p, inp, out)?
            };
            Ok(format!("tc pass {kind}"))
        }
        v => Err(format!("tc verdict {v}")),
    }
}

/// The NAT VIPs that have `addr` (and `port`, if given) as a backend.
fn vips_of_backend(env: &Env, addr: IpAddr, port: Option<u16>) -> Vec<&VipInfo> {
    env.vips
        .iter()
        .filter(|v| v.mode == Mode::Nat)
        .filter(|v| {
            v.backends.iter().any(|&(a, p, _)| {
                a == addr && port.is_none_or(|got| p == got || (p == 0 && v.has_port(got)))
            })
        })
        .collect()
}

fn snat_tc(env: &Env, p: &Layers, inp: &[u8], out: &[u8]) -> Result<&'static str, String> {
    let mut allowed = Vec::new();
    allowed.push(p.src_off()..p.src_off() + p.alen());
    if !p.v6 {
        allowed.push(p.l3 + 10..p.l3 + 12);
        ensure(p.ip4_residual(inp) == p.ip4_residual(out), || {
            "the IPv4 header checksum's residual moved".into()
        })?;
    }
    let vip_addr = addr_at(out, p.src_off(), p.v6);
    let kind = match p.l4 {
        None => {
            ensure(
                vips_of_backend(env, p.src, None)
                    .iter()
                    .any(|v| v.addr == vip_addr),
                || {
                    format!(
                        "reply fragment from {} given source {vip_addr}: not a VIP of that backend",
                        p.src
                    )
                },
            )?;
            "snat later-fragment"
        }
        Some(l4) => {
            let c = l4_csum_off(p.proto)
                .ok_or_else(|| format!("reverse NAT of protocol {}", p.proto))?;
            ensure(l4 + c + 2 <= inp.len(), || {
                "reverse NAT of a frame that ends inside its L4 header".into()
            })?;
            allowed.push(l4..l4 + 2);
            allowed.push(l4 + c..l4 + c + 2);
            let (bport, vport) = (be16(inp, l4), be16(out, l4));
            ensure(
                vips_of_backend(env, p.src, Some(bport))
                    .iter()
                    .any(|v| v.addr == vip_addr && v.proto == p.proto && v.has_port(vport)),
                || {
                    format!("reply {}:{bport} given source {vip_addr}:{vport}: not a VIP of that backend", p.src)
                },
            )?;
            let (in_c, out_c) = (be16(inp, l4 + c), be16(out, l4 + c));
            if p.proto == PROTO_UDP && !p.v6 && in_c == 0 {
                ensure(out_c == 0, || {
                    "an IPv4 UDP reply without a checksum got one".into()
                })?;
            } else {
                ensure(p.proto != PROTO_UDP || out_c != 0, || {
                    "a UDP checksum became 0 (none)".into()
                })?;
                let r = |f: &[u8]| {
                    l4_residual(f, p.src_off(), p.dst_off(), p.alen(), p.proto, l4, p.ip_end)
                };
                ensure(r(inp) == r(out), || {
                    "the reply's L4 checksum residual moved".into()
                })?;
            }
            if p.frag {
                "snat first-fragment"
            } else {
                "snat"
            }
        }
    };
    Allowed(allowed).check(inp, out)?;
    Ok(kind)
}

fn icmp_rev_tc(env: &Env, p: &Layers, inp: &[u8], out: &[u8]) -> Result<&'static str, String> {
    let l4 = p.l4.expect("checked by the caller");
    let (in3, ihl, proto, in4) = quote(p, inp).ok_or("an ICMP error rewritten without a quote")?;
    let asrc = in3 + if p.v6 { 8 } else { 12 };
    let adst = in3 + if p.v6 { 24 } else { 16 };
    let c = l4_csum_off(proto).ok_or("quote neither TCP nor UDP")?;
    let mut allowed = vec![
        l4 + 2..l4 + 4,
        adst..adst + p.alen(),
        in4 + 2..in4 + 4,
        p.src_off()..p.src_off() + p.alen(),
    ];
    if in4 + c + 2 <= p.ip_end {
        allowed.push(in4 + c..in4 + c + 2);
    }
    if !p.v6 {
        allowed.push(p.l3 + 10..p.l3 + 12);
        allowed.push(in3 + 10..in3 + 12);
        ensure(p.ip4_residual(inp) == p.ip4_residual(out), || {
            "outer IPv4 checksum residual moved".into()
        })?;
        let r = |f: &[u8]| residual(sum16(&f[in3..in3 + ihl]));
        ensure(r(inp) == r(out), || {
            "quoted IPv4 checksum residual moved".into()
        })?;
    }
    ensure(in4 + 4 <= p.ip_end, || {
        "rewrote a quote whose ports lie past the IP packet's end".into()
    })?;
    let (backend, bport) = (addr_at(inp, adst, p.v6), be16(inp, in4 + 2));
    let (vip_addr, vport) = (addr_at(out, adst, p.v6), be16(out, in4 + 2));
    ensure(
        vips_of_backend(env, backend, Some(bport))
            .iter()
            .any(|v| v.addr == vip_addr && v.proto == proto && v.has_port(vport)),
        || format!("quote of {backend}:{bport} turned into {vip_addr}:{vport}: not its VIP"),
    )?;
    let src_out = addr_at(out, p.src_off(), p.v6);
    ensure(
        src_out == p.src || (p.src == backend && src_out == vip_addr),
        || format!("error source {} became {src_out}", p.src),
    )?;
    // The ICMP checksum covers the whole message: past the IP packet's end
    // nothing may change, and the quote must lie inside it to be summed.
    let end = p.ip_end;
    let icmp_r = |f: &[u8]| {
        if p.v6 {
            l4_residual(f, p.src_off(), p.dst_off(), 16, 58, l4, end)
        } else {
            residual(sum16(&f[l4..end]))
        }
    };
    ensure(icmp_r(inp) == icmp_r(out), || {
        "the ICMP checksum's residual moved".into()
    })?;
    let q = |f: &[u8]| l4_residual(f, asrc, adst, p.alen(), proto, in4, end);
    if in4 + c + 2 <= end && !(proto == PROTO_UDP && !p.v6 && be16(inp, in4 + c) == 0) {
        ensure(q(inp) == q(out), || {
            "the quoted L4 checksum's residual moved".into()
        })?;
    }
    Allowed(allowed).check(inp, out)?;
    Ok("icmp-rev")
}

// Seeds.

fn ip4_csum_fix(f: &mut [u8], l3: usize) {
    let ihl = usize::from(f[l3] & 0xf) * 4;
    f[l3 + 10..l3 + 12].copy_from_slice(&[0, 0]);
    let c = !residual_raw(sum16(&f[l3..l3 + ihl]));
    f[l3 + 10..l3 + 12].copy_from_slice(&c.to_be_bytes());
}

fn residual_raw(mut s: u64) -> u16 {
    while s >> 16 != 0 {
        s = (s & 0xffff) + (s >> 16);
    }
    s as u16
}

/// Recompute the checksums of a frame this test can parse (IPv4 header,
/// TCP/UDP over the packet as it claims to be): a mutant then carries
/// valid checksums around its mutation, so the forwarded paths see both.
fn fix_checksums(f: &mut [u8]) {
    let Some(p) = Layers::parse(f) else { return };
    if !p.v6 && f.len() >= p.l3 + 20 && p.ihl(f) >= 20 && f.len() >= p.l3 + p.ihl(f) {
        ip4_csum_fix(f, p.l3);
    }
    let Some(l4) = p.l4 else { return };
    let Some(c) = l4_csum_off(p.proto) else {
        return;
    };
    if l4 + c + 2 > p.ip_end || p.frag {
        return;
    }
    f[l4 + c..l4 + c + 2].copy_from_slice(&[0, 0]);
    let sum = !residual_raw({
        let mut s = sum16(&f[p.src_off()..p.src_off() + p.alen()])
            + sum16(&f[p.dst_off()..p.dst_off() + p.alen()]);
        s += u64::from(p.proto) + (p.ip_end - l4) as u64 + sum16(&f[l4..p.ip_end]);
        s
    });
    let sum = if sum == 0 && p.proto == PROTO_UDP {
        0xffff
    } else {
        sum
    };
    f[l4 + c..l4 + c + 2].copy_from_slice(&sum.to_be_bytes());
}

const VLANS: [Vlan; 3] = [Vlan::None, Vlan::Dot1q(100), Vlan::QinQ(200, 300)];

fn l4_frame(v6: bool, proto: u8, dst: IpAddr, dport: u16, sport: u16) -> Frame {
    let (src4, src6) = ("192.0.2.10", "2001:db8:c::10");
    let f = match (v6, proto) {
        (false, PROTO_TCP) => Frame::tcp4(src4, sport, "0.0.0.0", dport),
        (false, _) => Frame::udp4(src4, sport, "0.0.0.0", dport),
        (true, PROTO_TCP) => Frame::tcp6(src6, sport, "::", dport),
        (true, _) => Frame::udp6(src6, sport, "::", dport),
    };
    f.to(dst, dport)
}

/// IPv4: turn a built frame into a first (MF) or later fragment.
fn v4_frag(mut b: Vec<u8>, l3: usize, later: bool) -> Vec<u8> {
    // Later: offset 185 (1480 bytes), MF clear; first: MF set.
    let fo: u16 = if later { 185 } else { 0x2000 };
    b[l3 + 6..l3 + 8].copy_from_slice(&fo.to_be_bytes());
    ip4_csum_fix(&mut b, l3);
    b
}

/// ICMP(v6) destination unreachable / packet too big from a router to
/// `to`, quoting `quoted` (an IP packet) up to `quote_len` bytes.
fn icmp_error(
    v6: bool,
    from: IpAddr,
    to: IpAddr,
    quoted: &[u8],
    quote_len: usize,
    vlan: Vlan,
) -> Vec<u8> {
    let q = &quoted[..quote_len.min(quoted.len())];
    let mut out = Vec::new();
    let l2 = Frame::tcp4("1.1.1.1", 1, "1.1.1.1", 1).vlan(vlan).build();
    let l3 = 14 + vlan.len();
    out.extend_from_slice(&l2[..l3]);
    match (from, to) {
        (IpAddr::V4(s), IpAddr::V4(d)) if !v6 => {
            let icmp = Icmpv4Header::with_checksum(
                Icmpv4Type::DestinationUnreachable(
                    etherparse::icmpv4::DestUnreachableHeader::FragmentationNeeded {
                        next_hop_mtu: 1400,
                    },
                ),
                q,
            );
            let mut ip =
                Ipv4Header::new(0, 64, IpNumber::ICMP, s.octets(), d.octets()).expect("IPv4");
            ip.set_payload_len(icmp.header_len() + q.len())
                .expect("length");
            ip.header_checksum = ip.calc_header_checksum();
            ip.write(&mut out).expect("IPv4");
            icmp.write(&mut out).expect("ICMP");
        }
        (IpAddr::V6(s), IpAddr::V6(d)) if v6 => {
            let ip = Ipv6Header {
                traffic_class: 0,
                flow_label: Ipv6FlowLabel::ZERO,
                payload_length: (8 + q.len()) as u16,
                next_header: IpNumber::IPV6_ICMP,
                hop_limit: 64,
                source: s.octets(),
                destination: d.octets(),
            };
            let icmp = Icmpv6Header::with_checksum(
                Icmpv6Type::PacketTooBig { mtu: 1280 },
                s.octets(),
                d.octets(),
                q,
            )
            .expect("ICMPv6");
            ip.write(&mut out).expect("IPv6");
            icmp.write(&mut out).expect("ICMPv6");
        }
        _ => panic!("address family mismatch"),
    }
    out.extend_from_slice(q);
    out
}

/// Every seed shape towards every VIP (requests), as built frames.
fn request_seeds(env: &Env) -> Vec<Vec<u8>> {
    let mut seeds = Vec::new();
    let mut sport = 40_000;
    for v in &env.vips {
        let v6 = v.addr.is_ipv6();
        for (i, vlan) in VLANS.iter().enumerate() {
            sport += 1;
            let f = l4_frame(v6, v.proto, v.addr, v.ports.0, sport).vlan(*vlan);
            let l3 = f.l3_off();
            seeds.push(f.clone().build());
            seeds.push(f.clone().established(7).payload(&[0x5a; 33]).build());
            if v.proto == PROTO_UDP && !v6 {
                seeds.push(f.clone().udp_zero_csum().build());
            }
            if v.proto == PROTO_TCP {
                seeds.push(f.clone().tcp_options(&[2, 4, 5, 0xb4, 1, 1, 4, 2]).build());
            }
            if v6 {
                let exts = [
                    vec![fixtures::ext(IPPROTO_HOPOPTS)],
                    vec![
                        fixtures::ext(IPPROTO_DSTOPTS),
                        fixtures::ext(IPPROTO_ROUTING),
                    ],
                    vec![(IPPROTO_FRAGMENT, vec![0, 1, 0, 0, 0x12, 0x34 + i as u8])],
                ];
                for e in &exts {
                    seeds.push(f.clone().ipv6_exts(e).build());
                }
                // The later fragment of the datagram above: offset 8, no L4.
                let mut later = f
                    .clone()
                    .ipv6_exts(&[(IPPROTO_FRAGMENT, vec![0, 8, 0, 0, 0x12, 0x34 + i as u8])])
                    .build();
                later.truncate(l3 + 48 + 16);
                let pl = (later.len() - l3 - 40) as u16;
                later[l3 + 4..l3 + 6].copy_from_slice(&pl.to_be_bytes());
                seeds.push(later);
            } else {
                seeds.push(f.clone().ipv4_options(&[1, 1, 1, 0]).build());
                seeds.push(f.clone().ttl(1).build());
                seeds.push(v4_frag(f.clone().payload(&[0x33; 40]).build(), l3, false));
                seeds.push(v4_frag(f.clone().payload(&[0x33; 40]).build(), l3, true));
            }
            // An ICMP error about this VIP's reply to the client.
            let client = f.src_ip();
            let reply = l4_frame(v6, v.proto, client, sport, v.ports.0)
                .from(v.addr, v.ports.0)
                .build();
            let router: IpAddr = if v6 {
                IpAddr::V6(self::v6("2001:db8:f::1"))
            } else {
                IpAddr::V4(v4("198.51.100.1"))
            };
            for quote_len in [if v6 { 48 } else { 28 }, reply.len() - 14] {
                seeds.push(icmp_error(
                    v6,
                    router,
                    v.addr,
                    &reply[14..],
                    quote_len,
                    *vlan,
                ));
            }
        }
    }
    seeds
}

/// Replies from the backends the seeds reached (read from the outputs),
/// and ICMP errors about the client's translated packets, for tc_nat.
fn reply_seeds(nat_outputs: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let mut seeds = Vec::new();
    for out in nat_outputs {
        let Some(p) = Layers::parse(out) else {
            continue;
        };
        let Some(l4) = p.l4 else { continue };
        if p.proto != PROTO_TCP && p.proto != PROTO_UDP {
            continue;
        }
        let (cport, bport) = (be16(out, l4), be16(out, l4 + 2));
        let f = l4_frame(p.v6, p.proto, p.src, cport, bport).from(p.dst, bport);
        let r = f.clone().established(9).build();
        seeds.push(r.clone());
        if !p.v6 && !p.frag {
            seeds.push(v4_frag(f.clone().payload(&[0x44; 40]).build(), 14, false));
            seeds.push(v4_frag(f.clone().payload(&[0x44; 40]).build(), 14, true));
        }
        // The client's translated packet, quoted by a router and by the
        // backend itself.
        let router: IpAddr = if p.v6 {
            IpAddr::V6(v6("2001:db8:f::2"))
        } else {
            IpAddr::V4(v4("198.51.100.2"))
        };
        let l3 = p.l3;
        for from in [router, p.dst] {
            seeds.push(icmp_error(
                p.v6,
                from,
                p.src,
                &out[l3..p.ip_end],
                p.ip_end - l3,
                Vlan::None,
            ));
        }
    }
    seeds
}

// The mutator.

fn mutate(rng: &mut Rng, seed: &[u8], vip_addrs: &[IpAddr]) -> Vec<u8> {
    let mut f = seed.to_vec();
    let ops = 1 + rng.below(3);
    for _ in 0..ops {
        let p = Layers::parse(&f);
        match rng.below(11) {
            0 | 1 => {
                // Bit flips, mostly in the headers.
                for _ in 0..1 + rng.below(3) {
                    let span = if rng.chance(80) {
                        f.len().min(96)
                    } else {
                        f.len()
                    };
                    let i = rng.below(span);
                    f[i] ^= 1 << rng.below(8);
                }
            }
            2 => {
                let i = rng.below(f.len().min(96));
                f[i] = *rng.pick(&[0, 1, 0x7f, 0x80, 0xfe, 0xff, 0x05, 0x06, 0x11, 0x2c, 0x3a]);
            }
            3 => {
                // Truncation; the kernel refuses test runs under 14 bytes.
                if f.len() > 14 {
                    let n = 14 + rng.below(f.len() - 14);
                    f.truncate(n);
                }
            }
            4 => {
                // Trailing bytes (Ethernet padding or junk past the IP length).
                let n = 1 + rng.below(48);
                let fill = if rng.chance(50) { 0 } else { rng.next() as u8 };
                f.extend(std::iter::repeat_n(fill, n));
            }
            5 | 6 => length_field(rng, &mut f, p.as_ref()),
            7 => ext_chain(rng, &mut f, p.as_ref()),
            8 => vlan_stack(rng, &mut f),
            9 => {
                // Fragment bits and offsets.
                if let Some(p) = &p {
                    if !p.v6 && f.len() >= p.l3 + 8 {
                        let v: u16 =
                            *rng.pick(&[0x2000, 0x0001, 0x2001, 0x1fff, 0x4000, 0x0000, 0x8000]);
                        f[p.l3 + 6..p.l3 + 8].copy_from_slice(&v.to_be_bytes());
                    } else if p.v6 && f.len() >= p.l3 + 40 {
                        // Make the first header a Fragment header.
                        let nh = f[p.l3 + 6];
                        let off: u16 = *rng.pick(&[0x0001, 0x0008, 0x0009, 0xfff8, 0x0000]);
                        let mut h = vec![nh, 0];
                        h.extend_from_slice(&off.to_be_bytes());
                        h.extend_from_slice(&(rng.next() as u32 & 3).to_be_bytes());
                        f.splice(p.l3 + 40..p.l3 + 40, h);
                        f[p.l3 + 6] = IPPROTO_FRAGMENT;
                        let pl = be16(&f, p.l3 + 4).wrapping_add(8);
                        f[p.l3 + 4..p.l3 + 6].copy_from_slice(&pl.to_be_bytes());
                    }
                }
            }
            _ => {
                // Another VIP's address (same family), so that shapes meet
                // every mode and port mismatches happen.
                if let Some(p) = &p {
                    let same: Vec<&IpAddr> =
                        vip_addrs.iter().filter(|a| a.is_ipv6() == p.v6).collect();
                    let a = rng.pick(&same);
                    let bytes = match a {
                        IpAddr::V4(a) => a.octets().to_vec(),
                        IpAddr::V6(a) => a.octets().to_vec(),
                    };
                    if f.len() >= p.dst_off() + bytes.len() {
                        f[p.dst_off()..p.dst_off() + bytes.len()].copy_from_slice(&bytes);
                    }
                }
            }
        }
    }
    if rng.chance(35) {
        fix_checksums(&mut f);
    }
    f
}

fn set16(f: &mut [u8], off: usize, v: u16) {
    if f.len() >= off + 2 {
        f[off..off + 2].copy_from_slice(&v.to_be_bytes());
    }
}

fn length_field(rng: &mut Rng, f: &mut [u8], p: Option<&Layers>) {
    let Some(p) = p else { return };
    let actual = (f.len() - p.l3) as u16;
    let delta = |rng: &mut Rng, base: u16| -> u16 {
        *rng.pick(&[
            0,
            1,
            7,
            8,
            19,
            20,
            0xffff,
            base,
            base.wrapping_sub(1),
            base.wrapping_add(1),
            base.wrapping_sub(8),
            base.wrapping_add(8),
        ])
    };
    match rng.below(5) {
        0 if !p.v6 => {
            let v = delta(rng, actual);
            set16(f, p.l3 + 2, v);
        }
        0 => {
            let v = delta(rng, actual.wrapping_sub(40));
            set16(f, p.l3 + 4, v);
        }
        1 if !p.v6 => {
            if let Some(b) = f.get_mut(p.l3) {
                *b = 0x40 | *rng.pick(&[0u8, 1, 4, 5, 6, 7, 15]);
            }
        }
        2 | 1 => {
            // TCP data offset or UDP length.
            if let Some(l4) = p.l4 {
                if p.proto == PROTO_TCP && f.len() > l4 + 12 {
                    f[l4 + 12] = (*rng.pick(&[0u8, 1, 4, 5, 6, 15]) << 4) | (f[l4 + 12] & 0xf);
                } else if p.proto == PROTO_UDP {
                    let base = (p.ip_end.saturating_sub(l4)) as u16;
                    let v = delta(rng, base);
                    set16(f, l4 + 4, v);
                }
            }
        }
        3 => {
            // An extension header's length byte.
            if p.v6
                && f.len() > p.l3 + 41
                && matches!(
                    f[p.l3 + 6],
                    IPPROTO_HOPOPTS | IPPROTO_DSTOPTS | IPPROTO_ROUTING
                )
            {
                f[p.l3 + 41] = *rng.pick(&[0u8, 1, 2, 0x7f, 0xff]);
            }
        }
        _ => {
            // The quote's lengths in an ICMP error.
            if let Some(l4) = p.l4 {
                let in3 = l4 + 8;
                if !p.v6 {
                    if let Some(b) = f.get_mut(in3) {
                        *b = 0x40 | *rng.pick(&[0u8, 4, 5, 6, 15]);
                    }
                } else {
                    let v = delta(rng, 0);
                    set16(f, in3 + 4, v);
                }
            }
        }
    }
}

/// Insert an extension header at the front of an IPv6 chain (with a
/// payload length that follows it or not), or point a next-header byte at
/// an extension header (a chain that loops into the transport header).
fn ext_chain(rng: &mut Rng, f: &mut Vec<u8>, p: Option<&Layers>) {
    let Some(p) = p else { return };
    if !p.v6 || f.len() < p.l3 + 40 {
        return;
    }
    let kind = *rng.pick(&[
        IPPROTO_HOPOPTS,
        IPPROTO_DSTOPTS,
        IPPROTO_ROUTING,
        IPPROTO_FRAGMENT,
    ]);
    if rng.chance(75) {
        let n = if kind == IPPROTO_FRAGMENT {
            0
        } else {
            rng.below(3)
        };
        let mut h = vec![f[p.l3 + 6], n as u8];
        h.extend(std::iter::repeat_n(0u8, 6 + 8 * n));
        if kind == IPPROTO_ROUTING {
            h[2] = 253;
        } else if kind != IPPROTO_FRAGMENT {
            h[2] = 1;
            h[3] = (4 + 8 * n) as u8;
        }
        let grow = h.len() as u16;
        f.splice(p.l3 + 40..p.l3 + 40, h);
        f[p.l3 + 6] = kind;
        if rng.chance(80) {
            let pl = be16(f, p.l3 + 4).wrapping_add(grow);
            f[p.l3 + 4..p.l3 + 6].copy_from_slice(&pl.to_be_bytes());
        }
        // Up to RV_MAX_EXT_HDRS and beyond: sometimes several at once.
        if rng.chance(30) {
            ext_chain(rng, f, Layers::parse(f).as_ref());
        }
    } else if let Some(l4) = p.l4 {
        // The last header's next-header byte, if there is an extension
        // header, else the IPv6 header's: now an extension header.
        let at = if l4 > p.l3 + 40 { p.l3 + 40 } else { p.l3 + 6 };
        f[at] = kind;
    }
}

/// Add, remove or retype a VLAN tag: stacks of 0 to 3 tags, 802.1Q and
/// 802.1ad in either order.
fn vlan_stack(rng: &mut Rng, f: &mut Vec<u8>) {
    let tpid: u16 = *rng.pick(&[0x8100, 0x88a8, 0x9100]);
    match rng.below(3) {
        0 => {
            let mut tag = tpid.to_be_bytes().to_vec();
            tag.extend_from_slice(&(rng.next() as u16 & 0x0fff).to_be_bytes());
            // The tag goes after the MACs; the old EtherType moves behind it.
            f.splice(12..12, tag);
        }
        1 => {
            if f.len() >= 18 && matches!(be16(f, 12), 0x8100 | 0x88a8) {
                f.drain(12..16);
            }
        }
        _ => {
            if f.len() >= 14 {
                f[12..14].copy_from_slice(&tpid.to_be_bytes());
            }
        }
    }
}

// The run.

/// tc_nat once; None when the kernel refuses the test run itself.
fn try_run_tc(t: &common::TestDp, pkt: &[u8]) -> Result<(i32, Vec<u8>), libbpf_rs::Error> {
    let mut out = vec![0u8; pkt.len() + 256];
    let input = libbpf_rs::ProgramInput {
        data_in: Some(pkt),
        data_out: Some(&mut out),
        ..Default::default()
    };
    let output = t.dp.tc().progs.tc_nat.test_run(input)?;
    let len = output.data.as_ref().map(|d| d.len()).unwrap_or(0);
    let verdict = output.return_value as i32;
    out.truncate(len);
    Ok((verdict, out))
}

struct Setup {
    ns: Netns,
}

/// A namespace with the routes the FIB lookups meet: backends in 10.1/16
/// and fd01::/64 behind a resolved gateway on the ingress veth (XDP_TX),
/// 10.2/16 and fd02::/64 behind one on a second attached veth (a redirect),
/// 10.3/16 and fd03::/64 unreachable (a counted drop for L3 DSR), 10.9/16
/// and fd09::/64 unrouted (NAT hands the packet to the kernel).
fn setup() -> Setup {
    let ns = Netns::new(&unique("rvfuzz"));
    let mac = |m: [u8; 6]| {
        m.iter()
            .map(|b| format!("{b:02x}"))
            .collect::<Vec<_>>()
            .join(":")
    };
    ns.exec(&format!(
        "ip link add veth0 address {lb} type veth peer name veth1 && \
         ip link add veth2 address {lb2} type veth peer name veth3 && \
         for d in veth0 veth1 veth2 veth3; do ip link set $d up; done && \
         ip addr add 10.250.0.1/24 dev veth0 && ip addr add fd00:250::1/64 dev veth0 nodad && \
         ip addr add 10.251.0.1/24 dev veth2 && ip addr add fd00:251::1/64 dev veth2 nodad && \
         ip neigh add 10.250.0.2 lladdr {gw} dev veth0 nud permanent && \
         ip neigh add fd00:250::2 lladdr {gw} dev veth0 nud permanent && \
         ip neigh add 10.251.0.2 lladdr {gw2} dev veth2 nud permanent && \
         ip neigh add fd00:251::2 lladdr {gw2} dev veth2 nud permanent && \
         ip route add 10.1.0.0/16 via 10.250.0.2 && ip route add fd01::/64 via fd00:250::2 && \
         ip route add 10.2.0.0/16 via 10.251.0.2 && ip route add fd02::/64 via fd00:251::2 && \
         ip route add unreachable 10.3.0.0/16 && ip route add unreachable fd03::/64",
        lb = mac(MAC_LB),
        lb2 = mac(MAC_LB2),
        gw = mac(MAC_GW),
        gw2 = mac(MAC_GW2),
    ));
    ns.sysctls(&[
        ("net.ipv4.ip_forward", "1"),
        ("net.ipv6.conf.all.forwarding", "1"),
    ]);
    Setup { ns }
}

fn ifindex(dev: &str) -> u32 {
    std::fs::read_to_string(format!("/sys/class/net/{dev}/ifindex"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| {
            let c = std::ffi::CString::new(dev).expect("device name");
            // SAFETY: a valid C string; if_nametoindex reads it only.
            unsafe { libc::if_nametoindex(c.as_ptr()) }
        })
}

fn the_vips() -> Vec<Vip> {
    let a = |s: &str| -> IpAddr { s.parse().expect("address") };
    let be = |s: &str, port: u16, n: u8| backend(a(s), port, [0x02, 0xbe, 0, 0, 0, n]);
    let mut v = Vec::new();
    for proto in [PROTO_TCP, PROTO_UDP] {
        v.push(vip(
            a("10.100.0.1"),
            80,
            proto,
            Mode::Nat,
            vec![
                be("10.1.0.1", 8080, 1),
                be("10.1.0.2", 0, 2),
                be("10.2.0.1", 8081, 3),
            ],
        ));
        v.push(vip(
            a("fd10::1"),
            80,
            proto,
            Mode::Nat,
            vec![be("fd01::1", 8080, 4), be("fd02::1", 0, 5)],
        ));
        v.push(vip(
            a("10.100.0.2"),
            80,
            proto,
            Mode::Dsr,
            vec![be("10.1.0.3", 0, 6)],
        ));
        v.push(vip(
            a("fd10::2"),
            80,
            proto,
            Mode::Dsr,
            vec![be("fd01::3", 0, 7)],
        ));
        v.push(vip(
            a("10.100.0.3"),
            80,
            proto,
            Mode::L3Dsr,
            vec![be("10.1.0.4", 0, 8), be("10.2.0.4", 0, 9)],
        ));
        v.push(vip(
            a("fd10::3"),
            80,
            proto,
            Mode::L3Dsr,
            vec![be("fd01::4", 0, 10)],
        ));
        v.push(vip(
            a("10.100.0.4"),
            80,
            proto,
            Mode::L3Dsr,
            vec![be("10.3.0.1", 0, 11)],
        ));
        v.push(vip(
            a("fd10::4"),
            80,
            proto,
            Mode::L3Dsr,
            vec![be("fd03::1", 0, 12)],
        ));
        v.push(vip(
            a("10.100.0.8"),
            80,
            proto,
            Mode::Nat,
            vec![be("10.9.0.1", 9090, 13)],
        ));
        v.push(vip(
            a("fd10::8"),
            80,
            proto,
            Mode::Nat,
            vec![be("fd09::1", 9090, 14)],
        ));
        v.push(vip_range(
            a("10.100.0.7"),
            1000,
            1999,
            proto,
            Mode::Nat,
            vec![be("10.1.0.7", 0, 15)],
        ));
        v.push(vip(
            a("10.100.0.9"),
            80,
            proto,
            Mode::L3Dsr,
            vec![be("10.9.0.4", 0, 19)],
        ));
        v.push(vip(
            a("fd10::9"),
            80,
            proto,
            Mode::L3Dsr,
            vec![be("fd09::4", 0, 20)],
        ));
    }
    // SYNs over a limit: a counted drop.
    v.push(with_rate_limit(
        vip(
            a("10.100.0.5"),
            80,
            PROTO_TCP,
            Mode::Nat,
            vec![be("10.1.0.5", 0, 16)],
        ),
        1,
        1,
    ));
    v.push(with_rate_limit(
        vip(
            a("fd10::5"),
            80,
            PROTO_TCP,
            Mode::Nat,
            vec![be("fd01::5", 0, 17)],
        ),
        1,
        1,
    ));
    // No healthy backend: a counted drop.
    v.push(vip(
        a("10.100.0.6"),
        80,
        PROTO_UDP,
        Mode::Nat,
        vec![be("10.1.0.6", 8080, 18)],
    ));
    v
}

#[test]
fn mutated_frames_meet_the_oracle() {
    require::root_and_tools("fuzz_packets");
    let frames = env_u64("RIVORA_FUZZ_FRAMES", DEFAULT_FRAMES);
    let seed = env_u64("RIVORA_FUZZ_SEED", DEFAULT_SEED);
    let s = setup();
    let report = s.ns.run(move || run(frames, seed));
    drop(s);
    println!("{report}");
}

fn run(frames: u64, seed: u64) -> String {
    let started = Instant::now();
    let fx = Fx::new();
    let (veth0, veth2) = (ifindex("veth0"), ifindex("veth2"));
    fx.iface_mac(veth0, MAC_LB);
    fx.iface_mac(veth2, MAC_LB2);
    fx.tunnel(Some(v4("10.250.0.1")), Some(v6("fd00:250::1")));
    let vips = the_vips();
    for v in &vips {
        fx.apply(v);
    }
    fx.set_state("10.1.0.6".parse().expect("address"), 8080, State::Down);
    let env = Env {
        vips: vips.iter().map(VipInfo::from_vip).collect(),
        tunnel4: v4("10.250.0.1"),
        tunnel6: v6("fd00:250::1"),
    };
    let vip_addrs: Vec<IpAddr> = env.vips.iter().map(|v| v.addr).collect();

    let mut tally = Tally::new();
    let mut failures: Vec<String> = Vec::new();
    let fail = |failures: &mut Vec<String>, what: &str, i: u64, f: &[u8], out: &[u8], e: String| {
        if failures.len() < 10 {
            failures.push(format!(
                "{what} #{i}: {e}\n  in:  {f:02x?}\n  out: {out:02x?}"
            ));
        }
    };

    let mut counts = fixtures::drop_counts(&fx.t);
    let mut xdp =
        |f: &[u8], tally: &mut Tally, failures: &mut Vec<String>, i: u64| -> (u32, Vec<u8>) {
            let mut md = fixtures::xdp_md(f.len(), veth0);
            let (verdict, out) =
                fixtures::try_run_xdp(&fx.t, f, Some(&mut md[..])).unwrap_or_else(|e| {
                    panic!(
                        "BPF_PROG_TEST_RUN refused frame {i} ({} bytes): {e}",
                        f.len()
                    )
                });
            let now = fixtures::drop_counts(&fx.t);
            let moved: Vec<(usize, u64)> = now
                .iter()
                .zip(&counts)
                .enumerate()
                .filter(|(_, (a, b))| a != b)
                .map(|(i, (a, b))| (i, a - b))
                .collect();
            counts = now;
            match check_xdp(&env, f, verdict, &out, &moved) {
                Ok(kind) => *tally.entry(kind).or_default() += 1,
                Err(e) => fail(failures, "xdp", i, f, &out, e),
            }
            (verdict, out)
        };

    // The seeds, unmutated, first: they must all verify, and they leave the
    // state mutants meet (NAT entries, first fragments recorded).
    let seeds = request_seeds(&env);
    let mut nat_out = Vec::new();
    for (i, f) in seeds.iter().enumerate() {
        let (verdict, out) = xdp(f, &mut tally, &mut failures, i as u64);
        if verdict != XDP_DROP && out.len() == f.len() && out != *f {
            nat_out.push(out);
        }
    }
    let replies = reply_seeds(&nat_out);
    for (i, f) in replies.iter().enumerate() {
        let (v, out) = fx.t.run_tc(f);
        match check_tc(&env, f, v, &out) {
            Ok(kind) => *tally.entry(kind).or_default() += 1,
            Err(e) => fail(&mut failures, "tc seed", i as u64, f, &out, e),
        }
    }
    assert!(
        failures.is_empty(),
        "unmutated seeds fail the oracle:\n{}",
        failures.join("\n")
    );

    let mut rng = Rng(seed);
    let tc_share = 4; // one mutant in four is a reply through tc_nat
    let (mut n_xdp, mut n_tc) = (0u64, 0u64);
    // Mutants the kernel refuses to test-run do not count: `frames` is how
    // many a program ran.
    let mut i = 0u64;
    while n_xdp + n_tc < frames {
        i += 1;
        if i % tc_share == 0 && !replies.is_empty() {
            let base = rng.pick(&replies).clone();
            let f = mutate(&mut rng, &base, &vip_addrs);
            let (v, out) = match try_run_tc(&fx.t, &f) {
                Ok(r) => r,
                Err(e) => {
                    // The kernel's skb test run wants a whole IP header
                    // behind an IP EtherType; anything else it refuses is
                    // a failure of this test.
                    let et = be16(&f, 12);
                    let short = (et == 0x0800 && f.len() < 34) || (et == 0x86dd && f.len() < 54);
                    if short {
                        *tally
                            .entry("tc refused by the kernel (IP header incomplete)".into())
                            .or_default() += 1;
                    } else {
                        fail(
                            &mut failures,
                            "tc",
                            i,
                            &f,
                            &[],
                            format!("the kernel refused the test run: {e}"),
                        );
                    }
                    continue;
                }
            };
            match check_tc(&env, &f, v, &out) {
                Ok(kind) => *tally.entry(kind).or_default() += 1,
                Err(e) => fail(&mut failures, "tc", i, &f, &out, e),
            }
            n_tc += 1;
        } else {
            let base = rng.pick(&seeds).clone();
            let f = mutate(&mut rng, &base, &vip_addrs);
            xdp(&f, &mut tally, &mut failures, i);
            n_xdp += 1;
        }
    }
    let elapsed = started.elapsed();
    let mut report = format!(
        "fuzz_packets: seed {seed:#x}, {} request seeds, {} reply seeds, {n_xdp} mutants through xdp_ingress and {n_tc} through tc_nat in {:.1} s\n",
        seeds.len(),
        replies.len(),
        elapsed.as_secs_f64()
    );
    for (k, n) in &tally {
        report.push_str(&format!("  {n:>9}  {k}\n"));
    }
    assert!(
        failures.is_empty(),
        "{report}\nframes that fail the oracle:\n{}",
        failures.join("\n")
    );

    // The run must have reached every outcome the setup provides for:
    // otherwise the mutator or the setup has gone blind and the oracle
    // checked nothing.
    let mut want = vec![
        "xdp pass unchanged",
        "xdp pass nat",
        "xdp pass icmp-nat",
        "xdp pass l3dsr",
        "xdp tx nat",
        "xdp redirect nat",
        "xdp tx dsr",
        "xdp tx l3dsr",
        "xdp tx nat first-fragment",
        "xdp tx nat later-fragment",
        "xdp drop malformed_ipv4",
        "xdp drop malformed_ipv6",
        "xdp drop malformed_l4",
        "xdp drop rate_limited",
        "xdp drop no_healthy_backend",
        "xdp drop fib_unreachable",
        "tc next",
        "tc pass snat",
        "tc pass icmp-rev",
    ];
    if frames >= 20_000 {
        want.extend([
            "xdp drop malformed_l2",
            "xdp pass frag_no_first",
            "tc pass snat later-fragment",
        ]);
    }
    let missing: Vec<&&str> = want.iter().filter(|k| !tally.contains_key(**k)).collect();
    assert!(missing.is_empty(), "{report}\nnever reached: {missing:?}");
    report
}
