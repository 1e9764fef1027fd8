//! Full NAT's port allocations (fullnat_rev_map{,6}) are a plain hash, not
//! an LRU (bpf/lib/maps.h says why): an entry whose flow has been idle past
//! its timeout is taken over by the next allocation that meets its port,
//! and the rest are swept, so the maps do not fill with flows long gone.
//! The sweep is a BPF program (`fullnat_sweep` in xdp_ingress's object),
//! because deleting an entry safely takes a compare-and-swap of its time
//! first (bpf/lib/fullnat.h), which user space cannot do on a map value.
//! This runs it.

use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Duration;

use tracing::{debug, warn};

use crate::dataplane::DataplaneError;
use crate::reconciler::status::StatusReader;

/// Run the sweep program once; how many entries it removed.
pub fn sweep(prog: &OwnedFd) -> Result<u32, DataplaneError> {
    // XDP's test run wants a packet; the sweep reads none of it.
    let pkt = [0u8; 64];
    let mut opts = libbpf_sys::bpf_test_run_opts {
        sz: std::mem::size_of::<libbpf_sys::bpf_test_run_opts>() as u64,
        data_in: pkt.as_ptr().cast(),
        data_size_in: pkt.len() as u32,
        repeat: 1,
        ..Default::default()
    };
    // SAFETY: a valid program fd; the input buffer outlives the call and
    // its size is the one given; no output buffer.
    let rc = unsafe { libbpf_sys::bpf_prog_test_run_opts(prog.as_raw_fd(), &mut opts) };
    if rc != 0 {
        return Err(DataplaneError::load(format!(
            "running fullnat_sweep: {}",
            std::io::Error::last_os_error()
        )));
    }
    Ok(opts.retval)
}

/// Sweeps every `every` on a thread of its own, until rivorad stops.
pub struct Sweeper {
    /// The loaded `fullnat_sweep` program (a duplicate of its fd).
    pub prog: OwnedFd,
    pub status: StatusReader,
    pub every: Duration,
}

impl Sweeper {
    pub fn spawn(self) -> std::io::Result<std::thread::JoinHandle<()>> {
        std::thread::Builder::new()
            .name("fullnat-sweep".into())
            .spawn(move || self.run())
    }

    fn run(self) {
        let step = Duration::from_millis(200);
        let mut waited = Duration::ZERO;
        while !self.status.closed() {
            std::thread::sleep(step);
            waited += step;
            if waited < self.every {
                continue;
            }
            waited = Duration::ZERO;
            match sweep(&self.prog) {
                Ok(0) => {}
                Ok(n) => debug!(removed = n, "full NAT: idle flows' ports taken back"),
                Err(e) => warn!(error = %e, "sweeping full NAT's idle flows"),
            }
        }
    }
}
