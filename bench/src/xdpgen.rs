//! The lab's XDP traffic generator (`rivora-bench xdpgen`, used by
//! scripts/lab-bench.sh beside trafgen).
//!
//! trafgen sends skbs: a veth hands them to its peer's XDP program only
//! after copying each one into an XDP buffer, a cost a NIC never charges.
//! This generator runs `bench/bpf/xdpgen.bpf.c` with BPF_PROG_TEST_RUN and
//! `BPF_F_TEST_XDP_LIVE_FRAMES`: the kernel builds real `xdp_frame`s from a
//! page pool and acts on the program's verdict, and the program redirects
//! every frame into a veth, so the program on the peer (the node's
//! xdp_ingress) receives frames with no skb, as from a NIC's ring. The
//! kernel's own xdp-trafficgen (xdp-tools) works this way.
//!
//! Frames are 60-byte IPv4 UDP frames built from a template (the frame the
//! lab's trafgen sends); the program writes the source per frame for one
//! flow, 64k flows (source ports 1..65535 in turn) or a new flow every
//! frame (source address low 16 bits and source port from a per-CPU
//! counter), the IPv4 checksum from scratch and a UDP checksum of 0. Run it
//! on one CPU (the counter is per CPU: two CPUs would repeat flows).

use std::mem::size_of;
use std::net::Ipv4Addr;
use std::os::fd::{AsFd, AsRawFd};
use std::str::FromStr;

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{MapCore, MapFlags};

use crate::bpf::xdpgen::types::rv_xdpgen_cfg;
use crate::bpf::xdpgen::{XdpgenSkel, XdpgenSkelBuilder};
use rivora::dataplane::loader::Owned;
use rivora::dataplane::DataplaneError;

/// Bytes of every frame (with its FCS, 64 on a wire).
pub const FRAME_LEN: usize = 60;
/// The kernel's largest live-frames batch (TEST_XDP_MAX_BATCH).
pub const MAX_BATCH: u32 = 256;
/// The verdict every frame must get.
pub const XDP_REDIRECT: u32 = 4;

/// Which source each frame gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flows {
    /// The template's source, every frame.
    One,
    /// Source ports 1..65535 in turn from the template's address.
    Many,
    /// A new source address (low 16 bits) and port every frame: 2^32
    /// frames before one repeats.
    New,
}

impl Flows {
    fn code(self) -> u32 {
        match self {
            Flows::One => 0,
            Flows::Many => 1,
            Flows::New => 2,
        }
    }
}

impl FromStr for Flows {
    type Err = XdpgenError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "1" => Ok(Flows::One),
            "64k" => Ok(Flows::Many),
            "new" => Ok(Flows::New),
            other => Err(XdpgenError::Flows(other.to_string())),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum XdpgenError {
    #[error("unknown flow pattern {0:?}: 1, 64k or new")]
    Flows(String),
    #[error("batch size {0} is out of range: 1 to {MAX_BATCH} frames")]
    Batch(u32),
    #[error("loading the generator: {0}")]
    Load(#[from] DataplaneError),
    #[error("writing the generator's configuration: {0}")]
    Config(libbpf_rs::Error),
    #[error("BPF_PROG_TEST_RUN{}: {source}", if *.live { " with BPF_F_TEST_XDP_LIVE_FRAMES" } else { "" })]
    Run {
        live: bool,
        #[source]
        source: std::io::Error,
    },
}

/// What every frame carries before the program varies its source.
#[derive(Clone, Debug)]
pub struct Frame {
    pub dst_mac: [u8; 6],
    pub src_mac: [u8; 6],
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub sport: u16,
    pub dport: u16,
}

impl Frame {
    /// The template: Ethernet, IPv4 (TTL 64, DF, valid checksum), UDP
    /// (checksum 0), 18 zero bytes of payload.
    pub fn bytes(&self) -> [u8; FRAME_LEN] {
        let mut f = [0u8; FRAME_LEN];
        f[0..6].copy_from_slice(&self.dst_mac);
        f[6..12].copy_from_slice(&self.src_mac);
        f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        let ip = &mut f[14..34];
        ip[0] = 0x45;
        ip[2..4].copy_from_slice(&((FRAME_LEN - 14) as u16).to_be_bytes());
        ip[6] = 0x40; // DF
        ip[8] = 64;
        ip[9] = 17;
        ip[12..16].copy_from_slice(&self.src.octets());
        ip[16..20].copy_from_slice(&self.dst.octets());
        let sum = ipv4_checksum(ip);
        ip[10..12].copy_from_slice(&sum.to_be_bytes());
        let udp = &mut f[34..42];
        udp[0..2].copy_from_slice(&self.sport.to_be_bytes());
        udp[2..4].copy_from_slice(&self.dport.to_be_bytes());
        udp[4..6].copy_from_slice(&((FRAME_LEN - 34) as u16).to_be_bytes());
        f
    }
}

/// The IPv4 header checksum of `hdr` with its checksum field taken as 0:
/// what belongs in the field (a header carrying it sums to 0xffff).
pub fn ipv4_checksum(hdr: &[u8]) -> u16 {
    let mut sum: u32 = hdr
        .chunks(2)
        .enumerate()
        .filter(|(i, _)| *i != 5)
        .map(|(_, w)| u32::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// The loaded generator program and its configuration.
pub struct Generator {
    skel: Owned<XdpgenSkel<'static>>,
    template: [u8; FRAME_LEN],
}

impl Generator {
    /// Load the program to redirect every frame to `ifindex` (in the
    /// caller's network namespace) with `flows`; the per-frame counter
    /// starts at `seed`.
    pub fn load(ifindex: u32, flows: Flows, seed: u32, frame: &Frame) -> Result<Self, XdpgenError> {
        let skel = Owned::load(|storage| {
            XdpgenSkelBuilder::default()
                .open(storage)
                .map_err(|e| DataplaneError::Load(format!("opening xdpgen: {e}")))?
                .load()
                .map_err(|e| DataplaneError::Load(format!("loading xdpgen: {e}")))
        })?;
        let template = frame.bytes();
        let mut cfg = Vec::with_capacity(size_of::<rv_xdpgen_cfg>());
        for word in [ifindex, flows.code(), seed, 0] {
            cfg.extend_from_slice(&word.to_ne_bytes());
        }
        cfg.extend_from_slice(&template);
        cfg.resize(size_of::<rv_xdpgen_cfg>(), 0);
        skel.get()
            .maps
            .xdpgen_cfg
            .update(&0u32.to_ne_bytes(), &cfg, MapFlags::ANY)
            .map_err(XdpgenError::Config)?;
        Ok(Self { skel, template })
    }

    /// The frame every run starts from.
    pub fn template(&self) -> &[u8; FRAME_LEN] {
        &self.template
    }

    /// One plain BPF_PROG_TEST_RUN on `input` (nothing is sent): the
    /// verdict and the frame as the program left it. A live frame's page
    /// holds what the last program to see it left, so any input must come
    /// out as the template with its source varied. For tests.
    pub fn run_once(&self, input: &[u8; FRAME_LEN]) -> Result<(u32, [u8; FRAME_LEN]), XdpgenError> {
        let mut out = [0u8; FRAME_LEN];
        let mut opts = libbpf_sys::bpf_test_run_opts {
            sz: size_of::<libbpf_sys::bpf_test_run_opts>() as _,
            data_in: input.as_ptr().cast(),
            data_size_in: FRAME_LEN as u32,
            data_out: out.as_mut_ptr().cast(),
            data_size_out: FRAME_LEN as u32,
            repeat: 1,
            ..Default::default()
        };
        self.test_run(&mut opts, false)?;
        Ok((opts.retval, out))
    }

    /// Send `frames` live frames in batches of `batch` (1 to 256): each
    /// goes where the program redirects it. Returns when the kernel has
    /// run them all; the frames a full veth ring refuses are dropped
    /// there, so count what arrives at the far end.
    pub fn send(&self, frames: u32, batch: u32) -> Result<(), XdpgenError> {
        if batch == 0 || batch > MAX_BATCH {
            return Err(XdpgenError::Batch(batch));
        }
        let mut opts = libbpf_sys::bpf_test_run_opts {
            sz: size_of::<libbpf_sys::bpf_test_run_opts>() as _,
            data_in: self.template.as_ptr().cast(),
            data_size_in: FRAME_LEN as u32,
            repeat: frames as _,
            flags: libbpf_sys::BPF_F_TEST_XDP_LIVE_FRAMES,
            batch_size: batch,
            ..Default::default()
        };
        self.test_run(&mut opts, true)
    }

    fn test_run(
        &self,
        opts: &mut libbpf_sys::bpf_test_run_opts,
        live: bool,
    ) -> Result<(), XdpgenError> {
        let fd = self.skel.get().progs.xdpgen_redirect.as_fd().as_raw_fd();
        // SAFETY: opts points at buffers that outlive the call (the
        // template or the input, and `out` in run_once) with their sizes
        // beside them.
        let rc = unsafe { libbpf_sys::bpf_prog_test_run_opts(fd, opts) };
        if rc < 0 {
            return Err(XdpgenError::Run {
                live,
                source: std::io::Error::from_raw_os_error(-rc),
            });
        }
        Ok(())
    }
}
