//! Full NAT in the xdp area: its per-packet keys and its port exhaustion.
//!
//! The full-NAT cases run on a datapath of their own, loaded like the
//! bench's and filled by the real map writer (`rivora::dataplane::Writer`:
//! node sources and port range, full-NAT VIPs, the next hops rivorad's
//! watcher resolves in the bench namespace). They are measured through the
//! same wrapper, in the same rounds and slices as every other key: only the
//! program the wrapper tail-calls differs (this datapath's xdp_ingress), as
//! for the baseline's `_before_ns` keys. Its flow tables are the default
//! size, as the bench datapath's.
//!
//! A new flow every run needs a port every run. Full NAT's reverse entries
//! (fullnat_rev_map{,6}) are a plain hash of the flow table's size, freed
//! only by expiry and rivorad's sweep, and a (source, backend, backend
//! port, protocol) tuple has one range of ports. So the new-flow cases'
//! entries are deleted after each slice, outside the timed part
//! ([`FullNat::clear_new_flows`], which also proves every run of the slice
//! inserted one), and the range ([`PORTS`]) is wider than a slice's runs:
//! the shared cursor moves one port per allocation, so within a slice no
//! port comes round twice and every allocation's first port is free. Each
//! new flow then costs what the datapath is built to cost it: one port, one
//! affinity insert (into a full LRU that evicts, as `xdp_syn_nat_v4_ns`'s)
//! and one reverse insert. A larger `-flow-table-size` instead would make
//! every table (and every NAT case's insert) dearer and still run out
//! within a few rounds; letting entries expire would measure the take-over
//! of idle ports, not a new flow.
//!
//! `fullnat_port_exhaustion_*`: a range of 64 ports, one backend, 10,000
//! new flows offered from both CPUs at once; what was admitted, dropped and
//! whether any two live flows share a tuple ([`port_exhaustion`]).

use std::collections::HashMap;
use std::mem::size_of;
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::path::PathBuf;

use anyhow::{bail, ensure, Context, Result};
use etherparse::{NetSlice, PacketBuilder, SlicedPacket, TransportSlice};
use libbpf_rs::libbpf_sys;
use libbpf_rs::{MapCore, MapFlags};
use rivora::abi::*;
use rivora::dataplane::maps::{bytes_of, PinnedMap, Pod};
use rivora::dataplane::render::NextHop;
use rivora::dataplane::{Datapath, LoadOptions, Maps, Writer};
use rivora::model::{Affinity, Backend, Mac, Mode, Ports, Protocol, Vip};

use super::{
    pad8, tcp4, tcp4_from, tcp6_to, test_run_out, xdp_ctx, BACKENDS, BACKENDS6, CLIENT, CLIENT6,
    REPEAT, SLICES, XDP_TX,
};

const XDP_DROP: u32 = 1;

pub const VIP_FNAT: [u8; 4] = [10, 99, 100, 6];
pub const VIP6_FNAT: &str = "fd00:99:100::6";
/// node.snat's sources: the node's own addresses on rvb0.
const SRC4: Ipv4Addr = Ipv4Addr::new(10, 99, 2, 1);
const SRC6: &str = "fd00:99:2::1";
const BPORT: u16 = 8080;
/// The established flow's client port (`tcp4`'s and `tcp6_to`'s). The
/// new-flow cases start from the same packet, but the wrapper rewrites the
/// source port and address of every run: none of them is this client.
const CLIENT_PORT: u16 = 40000;

/// The measured cases' source ports: more than a slice's runs (its batch
/// and the checked run before it), so that no port comes round twice in a
/// slice (see the top of this file).
pub const PORTS: (u16, u16) = (1024, 65535);
const _: () = assert!((PORTS.1 - PORTS.0) as u32 + 1 > REPEAT / SLICES + 1);

/// `fullnat_port_exhaustion_*`: the range, and the flows offered to it.
const EXHAUSTION_PORTS: (u16, u16) = (20000, 20063);
const EXHAUSTION_OFFERED: u16 = 10_000;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Fam {
    V4,
    V6,
}

/// What a full-NAT case sends.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Role {
    /// The established flow's request.
    Established,
    /// Its backend's reply.
    Reply,
    /// A new flow every run.
    NewFlow,
}

fn src(fam: Fam) -> IpAddr {
    match fam {
        Fam::V4 => IpAddr::V4(SRC4),
        Fam::V6 => IpAddr::V6(SRC6.parse().expect("constant")),
    }
}

fn vip_addr(fam: Fam) -> IpAddr {
    match fam {
        Fam::V4 => IpAddr::V4(Ipv4Addr::from(VIP_FNAT)),
        Fam::V6 => IpAddr::V6(VIP6_FNAT.parse().expect("constant")),
    }
}

fn backends(fam: Fam) -> Vec<IpAddr> {
    match fam {
        Fam::V4 => BACKENDS
            .iter()
            .map(|b| IpAddr::V4(Ipv4Addr::from(*b)))
            .collect(),
        Fam::V6 => BACKENDS6
            .iter()
            .map(|b| IpAddr::V6(b.parse().expect("constant")))
            .collect(),
    }
}

/// A full-NAT TCP VIP on port 80 over `backends` (port 8080, the MACs the
/// bench namespace's neighbours have).
fn fullnat_vip(addr: IpAddr, backends: &[IpAddr]) -> Vip {
    Vip {
        addr,
        ports: Ports::One(80),
        proto: Protocol::Tcp,
        mode: Mode::FullNat,
        affinity: Affinity::None,
        rate_limit: None,
        source_ranges: None,
        backends: backends
            .iter()
            .enumerate()
            .map(|(i, a)| Backend {
                mac: Some(Mac([2, 0, 0, 0, 2, 11 + i as u8])),
                ..Backend::new(*a, BPORT)
            })
            .collect(),
    }
}

/// The established flow's request (client port [`CLIENT_PORT`]); with
/// `syn`, the packet the new-flow cases vary.
pub fn request(fam: Fam, syn: bool) -> Vec<u8> {
    match fam {
        Fam::V4 => tcp4(VIP_FNAT, syn),
        Fam::V6 => tcp6_to(VIP6_FNAT, syn),
    }
}

/// A backend's reply to full NAT's source and `port`, as it arrives here.
pub fn reply(fam: Fam, backend: IpAddr, port: u16) -> Result<Vec<u8>> {
    let b = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 2], [2, 0, 0, 0, 0, 1]);
    let mut v = Vec::new();
    match (fam, backend, src(fam)) {
        (Fam::V4, IpAddr::V4(be), IpAddr::V4(s)) => b
            .ipv4(be.octets(), s.octets(), 64)
            .tcp(BPORT, port, 1, 65535)
            .ack(1)
            // 14 + 20 + 20 + 10 = 64 bytes.
            .write(&mut v, &[0u8; 10])
            .context("building a reply")?,
        (Fam::V6, IpAddr::V6(be), IpAddr::V6(s)) => b
            .ipv6(be.octets(), s.octets(), 64)
            .tcp(BPORT, port, 1, 65535)
            .ack(1)
            // 14 + 40 + 20 + 14 = 88 bytes.
            .write(&mut v, &[0u8; 14])
            .context("building a reply")?,
        _ => bail!("{backend} is not an address of {fam:?}"),
    }
    Ok(pad8(v))
}

/// (source, source port, destination, destination port) of a TCP frame.
fn tuple(frame: &[u8]) -> Result<(IpAddr, u16, IpAddr, u16)> {
    let p = SlicedPacket::from_ethernet(frame).context("parsing a frame")?;
    let (s, d) = match p.net {
        Some(NetSlice::Ipv4(ip)) => (
            IpAddr::V4(ip.header().source_addr()),
            IpAddr::V4(ip.header().destination_addr()),
        ),
        Some(NetSlice::Ipv6(ip)) => (
            IpAddr::V6(ip.header().source_addr()),
            IpAddr::V6(ip.header().destination_addr()),
        ),
        _ => bail!("not an IP frame"),
    };
    match p.transport {
        Some(TransportSlice::Tcp(t)) => Ok((s, t.source_port(), d, t.destination_port())),
        _ => bail!("not a TCP frame"),
    }
}

/// A datapath of its own, in a pin directory of its own (removed on drop),
/// filled through the real writer.
pub struct FullNat {
    maps: Maps,
    dp: Datapath,
    pin_dir: PathBuf,
    rvb0: u32,
}

impl Drop for FullNat {
    fn drop(&mut self) {
        let _ = Datapath::unpin_all(&self.pin_dir);
    }
}

impl FullNat {
    /// Load a datapath and write, through the writer: full NAT's sources
    /// (node.snat) and `ports`, rvb0's MAC, the next hops `nh`, then
    /// `vips`. Returns it and the VIPs' service ids.
    fn load(
        tag: &str,
        nh: &HashMap<IpAddr, NextHop>,
        rvb0: u32,
        ports: (u16, u16),
        vips: &[Vip],
    ) -> Result<(Self, Vec<u32>)> {
        let pin_dir = PathBuf::from(format!(
            "/sys/fs/bpf/rivora-bench-{tag}-{}",
            std::process::id()
        ));
        let _ = Datapath::unpin_all(&pin_dir);
        let dp = Datapath::load(&LoadOptions {
            pin_dir: pin_dir.clone(),
            ..Default::default()
        })
        .with_context(|| format!("loading the {tag} datapath"))?;
        let maps = match Maps::open(&pin_dir) {
            Ok(m) => m,
            Err(e) => {
                let _ = Datapath::unpin_all(&pin_dir);
                return Err(e).context("opening its maps");
            }
        };
        let this = Self {
            maps,
            dp,
            pin_dir,
            rvb0,
        };
        let mut w = Writer::open_pinned(&this.pin_dir).context("the writer")?;
        let mut node = w.node().clone();
        let mac = nh
            .values()
            .find(|n| n.ifindex == rvb0)
            .map(|n| n.smac)
            .context("a next hop out of rvb0")?;
        node.interface_macs.insert(rvb0, Mac(mac));
        node.fullnat.src4 = Some(SRC4);
        node.fullnat.src6 = Some(SRC6.parse().expect("constant"));
        node.fullnat.port_min = ports.0;
        node.fullnat.port_max = ports.1;
        w.set_node(&node).context("node settings")?;
        w.set_next_hops(nh.clone()).context("next hops")?;
        let mut svcs = Vec::new();
        for vip in vips {
            w.upsert_vip(vip)
                .with_context(|| format!("writing {}", vip.key()))?;
            w.reclaim().context("reclaim")?;
            let a = w
                .allocations()
                .remove(&vip.key())
                .with_context(|| format!("{} not placed", vip.key()))?;
            // Every backend as the request path will read it: reached by
            // full NAT from a source, through a next hop it may send to.
            for id in &a.backend_ids {
                let nh = if vip.addr.is_ipv4() {
                    this.maps
                        .backend_map
                        .get::<u32, rv_backend>(id)?
                        .map(|b| b.nh)
                } else {
                    this.maps
                        .backend_map6
                        .get::<u32, rv_backend6>(id)?
                        .map(|b| b.nh)
                };
                let nh = nh.with_context(|| format!("backend {id} of {}", vip.key()))?;
                ensure!(
                    nh.fullnat_src != 0 && nh.flags & NextHop::VALID != 0,
                    "backend {id} of {}: full-NAT source {}, next hop flags {:#x}",
                    vip.key(),
                    nh.fullnat_src,
                    nh.flags
                );
            }
            svcs.push(a.svc_id);
        }
        Ok((this, svcs))
    }

    /// The measured cases' datapath: one full-NAT VIP per family over the
    /// bench's three backends, ports [`PORTS`].
    pub fn measured(nh: &HashMap<IpAddr, NextHop>, rvb0: u32) -> Result<Self> {
        let vips = [
            fullnat_vip(vip_addr(Fam::V4), &backends(Fam::V4)),
            fullnat_vip(vip_addr(Fam::V6), &backends(Fam::V6)),
        ];
        Ok(Self::load("fnat", nh, rvb0, PORTS, &vips)?.0)
    }

    pub fn xdp_fd(&self) -> RawFd {
        self.dp.xdp().progs.xdp_ingress.as_fd().as_raw_fd()
    }

    /// Send the established flow's request once, outside the timed part,
    /// and check how it left: by XDP_TX, from full NAT's source, to a
    /// backend. A new flow the first time, or again after the new-flow
    /// cases' inserts evicted its affinity entry from the LRU (a new port
    /// then, whose reverse entry is kept like the first). Returns the
    /// backend and the source port.
    pub fn prime(&self, fam: Fam) -> Result<(IpAddr, u16)> {
        let pkt = request(fam, false);
        let ctx = xdp_ctx(pkt.len(), self.rvb0);
        let (v, _, out) = test_run_out(&self.dp.xdp().progs.xdp_ingress, &pkt, 1, Some(&ctx))?;
        ensure!(
            v == XDP_TX,
            "the established full-NAT flow ({fam:?}): verdict {v}"
        );
        let (s, sport, d, dport) = tuple(&out)?;
        ensure!(
            s == src(fam)
                && (PORTS.0..=PORTS.1).contains(&sport)
                && backends(fam).contains(&d)
                && dport == BPORT,
            "the established full-NAT flow ({fam:?}) left as {s}:{sport} -> {d}:{dport}"
        );
        Ok((d, sport))
    }

    /// Packets this datapath dropped so far, every reason.
    pub fn drops(&self) -> Result<u64> {
        drops(&self.maps, None)
    }

    /// Delete the new-flow cases' reverse entries (every one but the
    /// established client's), outside the timed part; returns how many
    /// went: the allocations the slice made.
    pub fn clear_new_flows(&self, fam: Fam) -> Result<usize> {
        match fam {
            Fam::V4 => delete_where(
                &self.maps.fullnat_rev_map,
                |_: &rv_fullnat_key, v: &rv_fullnat_flow| {
                    !(v.client_addr[0] == be32(Ipv4Addr::from(CLIENT))
                        && v.client_port == be16(CLIENT_PORT))
                },
            ),
            Fam::V6 => {
                let c = be32x4(CLIENT6.parse().expect("constant"));
                delete_where(
                    &self.maps.fullnat_rev_map6,
                    |_: &rv_fullnat6_key, v: &rv_fullnat_flow| {
                        !(v.client_addr == c && v.client_port == be16(CLIENT_PORT))
                    },
                )
            }
        }
    }
}

/// Drops counted in drop_stats_map (summed over the CPUs): under `reason`,
/// or under every reason.
fn drops(maps: &Maps, reason: Option<rv_drop_reason>) -> Result<u64> {
    let mut n = 0;
    for r in DROP_REASONS
        .iter()
        .filter(|r| reason.is_none_or(|want| want == **r))
    {
        n += maps
            .drop_stats_map
            .get_percpu::<u32, rv_drop_stats>(&r.0)?
            .iter()
            .map(|d| d.packets)
            .sum::<u64>();
    }
    Ok(n)
}

/// Delete every entry `pred` selects, in one BPF_MAP_DELETE_BATCH.
fn delete_where<K: Pod, V: Pod>(m: &PinnedMap, pred: impl Fn(&K, &V) -> bool) -> Result<usize> {
    let keys: Vec<u8> = m
        .entries::<K, V>()?
        .iter()
        .filter(|(k, v)| pred(k, v))
        .flat_map(|(k, _)| bytes_of(k).to_vec())
        .collect();
    let n = keys.len() / size_of::<K>();
    if n > 0 {
        m.handle
            .delete_batch(&keys, n as u32, MapFlags::ANY, MapFlags::ANY)
            .with_context(|| format!("deleting {n} entries of {}", m.name))?;
    }
    Ok(n)
}

/// xdp_ingress once on `pkt`, as received on `ifindex`, through its fd
/// (a skeleton's program is not Sync; an fd is): the verdict.
fn run_fd(fd: RawFd, pkt: &[u8], ifindex: u32) -> Result<u32> {
    let mut out = vec![0u8; pkt.len() + 256];
    let mut ctx = xdp_ctx(pkt.len(), ifindex);
    let mut opts = libbpf_sys::bpf_test_run_opts {
        sz: size_of::<libbpf_sys::bpf_test_run_opts>() as u64,
        data_in: pkt.as_ptr().cast(),
        data_size_in: pkt.len() as u32,
        data_out: out.as_mut_ptr().cast(),
        data_size_out: out.len() as u32,
        ctx_in: ctx.as_mut_ptr().cast(),
        ctx_size_in: ctx.len() as u32,
        repeat: 1,
        ..Default::default()
    };
    // SAFETY: a valid program fd; the buffers outlive the call and their
    // sizes are the ones given.
    let rc = unsafe { libbpf_sys::bpf_prog_test_run_opts(fd, &mut opts) };
    ensure!(
        rc == 0,
        "BPF_PROG_TEST_RUN: {}",
        std::io::Error::last_os_error()
    );
    Ok(opts.retval)
}

/// What `fullnat_port_exhaustion_*` found.
pub struct Exhaustion {
    /// Ports in the range, and new flows offered.
    pub ports: u64,
    pub offered: u64,
    pub admitted: u64,
    pub dropped: u64,
    /// Admitted flows that share a (backend, source, port) tuple with
    /// another live flow.
    pub collisions: u64,
}

/// A range of 64 ports, one full-NAT VIP with one backend, and 10,000
/// distinct new flows (TCP SYNs from as many client ports) offered through
/// the real xdp_ingress, half from each CPU at once (a test run executes
/// on its caller's CPU, so the allocations race for real). Every flow must
/// come out admitted (XDP_TX) or dropped under
/// `RV_DROP_FULLNAT_PORTS_EXHAUSTED`; anything else is an error. Then the
/// maps: every admitted flow's affinity entry names a (backend, source,
/// port) tuple, and a collision is a flow whose tuple another flow's
/// affinity entry also names, or whose reverse entry is not its own.
/// Runs on the calling thread's network namespace (the bench's: rvb0).
pub fn port_exhaustion(nh: &HashMap<IpAddr, NextHop>, rvb0: u32) -> Result<Exhaustion> {
    let backend = backends(Fam::V4)[0];
    let (f, svcs) = FullNat::load(
        "fnatexh",
        nh,
        rvb0,
        EXHAUSTION_PORTS,
        &[fullnat_vip(vip_addr(Fam::V4), &[backend])],
    )?;
    let svc = svcs[0];
    let exhausted = rv_drop_reason::RV_DROP_FULLNAT_PORTS_EXHAUSTED;
    let drops0 = drops(&f.maps, Some(exhausted))?;
    let all0 = drops(&f.maps, None)?;

    let ncpu = std::thread::available_parallelism().map_or(1, |n| n.get().min(2));
    let client_ports = |cpu: usize| {
        (0..EXHAUSTION_OFFERED)
            .filter(move |i| usize::from(*i) % ncpu == cpu)
            .map(|i| 10_000 + i)
    };
    let fd = f.xdp_fd();
    let verdicts: Vec<Vec<(u16, u32)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..ncpu)
            .map(|cpu| {
                s.spawn(move || -> Result<Vec<(u16, u32)>> {
                    // Threads start in the spawning thread's network
                    // namespace: the bench's.
                    let mut set = nix::sched::CpuSet::new();
                    set.set(cpu).context("cpu set")?;
                    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)
                        .context("pinning a thread")?;
                    client_ports(cpu)
                        .map(|p| Ok((p, run_fd(fd, &tcp4_from(p, VIP_FNAT, true), rvb0)?)))
                        .collect()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .map_err(|_| anyhow::anyhow!("an offering thread panicked"))?
            })
            .collect::<Result<Vec<_>>>()
    })?;

    let offered = u64::from(EXHAUSTION_OFFERED);
    let (mut admitted, mut refused) = (Vec::new(), 0u64);
    for (p, v) in verdicts.into_iter().flatten() {
        match v {
            XDP_TX => admitted.push(p),
            XDP_DROP => refused += 1,
            other => bail!("port exhaustion: flow from client port {p}: verdict {other}"),
        }
    }
    let dropped = drops(&f.maps, Some(exhausted))? - drops0;
    let n_admitted = admitted.len() as u64;
    if n_admitted + dropped != offered
        || refused != dropped
        || drops(&f.maps, None)? - all0 != dropped
    {
        bail!(
            "port exhaustion: {offered} flows offered, {n_admitted} admitted, {dropped} counted as \
             exhausted ({refused} dropped, {} under any reason): every flow must be admitted or \
             dropped for its ports",
            drops(&f.maps, None)? - all0
        );
    }

    // The maps after: each admitted flow's affinity entry and the reverse
    // entry of the tuple it names.
    let client = be32(Ipv4Addr::from(CLIENT));
    let affinity: Vec<(rv_flow_key, rv_affinity_value)> = f
        .maps
        .connection_affinity_map
        .entries()?
        .into_iter()
        .filter(|(k, _): &(rv_flow_key, rv_affinity_value)| k.svc_id == svc)
        .collect();
    let mut by_client: Vec<u16> = affinity
        .iter()
        .filter(|(k, _)| k.saddr == client)
        .map(|(k, _)| port_from_be16(k.sport))
        .collect();
    by_client.sort_unstable();
    admitted.sort_unstable();
    ensure!(
        by_client == admitted,
        "port exhaustion: {} affinity entries for {} admitted flows (the flows with an entry are \
         not the admitted ones)",
        by_client.len(),
        admitted.len()
    );
    let rev: HashMap<(u32, u32, u16), rv_fullnat_flow> = f
        .maps
        .fullnat_rev_map
        .entries::<rv_fullnat_key, rv_fullnat_flow>()?
        .into_iter()
        .filter(|(k, _)| k.proto == 6 && k.backend_port == be16(BPORT))
        .map(|(k, v)| ((k.backend_addr, k.src_addr, k.src_port), v))
        .collect();
    let mut tuples: HashMap<(u32, u32, u16), u32> = HashMap::new();
    let mut named = Vec::new();
    for (k, a) in &affinity {
        let b = f
            .maps
            .backend_map
            .get::<u32, rv_backend>(&a.backend_id)?
            .with_context(|| format!("backend {}", a.backend_id))?;
        let s = f
            .maps
            .fullnat_src_map
            .get::<u32, rv_fullnat_src>(&u32::from(a.fullnat_src))?
            .with_context(|| format!("full-NAT source {}", a.fullnat_src))?;
        let t = (b.addr, s.addr[0], a.fullnat_port);
        *tuples.entry(t).or_default() += 1;
        named.push((t, k.saddr, k.sport));
    }
    let collisions = named
        .iter()
        .filter(|(t, caddr, cport)| {
            tuples[t] > 1
                || rev
                    .get(t)
                    .is_none_or(|e| e.client_addr[0] != *caddr || e.client_port != *cport)
        })
        .count() as u64;
    Ok(Exhaustion {
        ports: u64::from(EXHAUSTION_PORTS.1 - EXHAUSTION_PORTS.0) + 1,
        offered,
        admitted: n_admitted,
        dropped,
        collisions,
    })
}
