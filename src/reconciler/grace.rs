//! Grace periods waited for on a thread of their own.
//!
//! What a map switch retires (an old Maglev slice, backend ids no VIP
//! lists) may still be read by a program run that began before the
//! switch, so it is cleared only after a grace period: membarrier, the
//! kernel's synchronize_rcu, 10 to 20 ms here. Waited for on the
//! reconciler's thread, that wait ended every apply, and an EndpointSlice
//! change arriving meanwhile queued behind it: at one change every 10 ms
//! the reconciler did nothing but wait. Here the wait runs beside it: the
//! reconciler asks for a grace period with the writer's ticket and goes
//! on applying; once the period has ended it clears what the ticket
//! covers. Until then retired slots stay reserved, so nothing is reused
//! early; the writer still waits itself when it needs the space.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

use tracing::error;

use crate::dataplane::DataplaneError;

#[derive(Default)]
struct Shared {
    /// One more than the highest ticket whose grace period has ended; 0
    /// while none has.
    done: AtomicU64,
    failed: AtomicBool,
}

pub(crate) struct GraceWaiter {
    requests: Option<mpsc::Sender<u64>>,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl GraceWaiter {
    /// A thread that waits with `wait` for every ticket asked for.
    pub(crate) fn spawn(wait: fn() -> Result<(), DataplaneError>) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel::<u64>();
        let shared = Arc::new(Shared::default());
        let s = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("grace".into())
            .spawn(move || {
                while let Ok(mut ticket) = rx.recv() {
                    // Tickets only grow, and a period that begins after
                    // the latest was asked for covers the earlier ones.
                    while let Ok(t) = rx.try_recv() {
                        ticket = ticket.max(t);
                    }
                    match wait() {
                        Ok(()) => s.done.store(ticket + 1, Ordering::Release),
                        Err(e) => {
                            error!(error = %e, "waiting for a grace period; the reconciler waits itself from now on");
                            s.failed.store(true, Ordering::Release);
                            return;
                        }
                    }
                }
            })?;
        Ok(Self {
            requests: Some(tx),
            shared,
            thread: Some(thread),
        })
    }

    /// Ask for a grace period covering `ticket`. False when the thread is
    /// gone (it failed): the caller must wait itself.
    pub(crate) fn request(&self, ticket: u64) -> bool {
        !self.failed()
            && self
                .requests
                .as_ref()
                .is_some_and(|r| r.send(ticket).is_ok())
    }

    /// The highest ticket whose grace period has ended.
    pub(crate) fn covered(&self) -> Option<u64> {
        self.shared.done.load(Ordering::Acquire).checked_sub(1)
    }

    pub(crate) fn failed(&self) -> bool {
        self.shared.failed.load(Ordering::Acquire)
    }
}

impl Drop for GraceWaiter {
    fn drop(&mut self) {
        // The thread ends when its channel closes.
        self.requests = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    fn wait_covered(g: &GraceWaiter, ticket: u64) {
        let t0 = Instant::now();
        while g.covered().is_none_or(|c| c < ticket) {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "ticket {ticket} never covered"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn tickets_are_covered_in_order_and_only_after_a_wait() {
        let g = GraceWaiter::spawn(|| Ok(())).unwrap();
        assert_eq!(g.covered(), None, "nothing asked, nothing covered");
        assert!(g.request(0));
        wait_covered(&g, 0);
        assert!(g.request(1));
        assert!(g.request(2));
        wait_covered(&g, 2);
        assert!(!g.failed());
    }

    #[test]
    fn a_failed_wait_covers_nothing_and_says_so() {
        let g = GraceWaiter::spawn(|| {
            Err(DataplaneError::GracePeriod(
                std::io::Error::from_raw_os_error(libc::EPERM),
            ))
        })
        .unwrap();
        assert!(g.request(0));
        let t0 = Instant::now();
        while !g.failed() {
            assert!(t0.elapsed() < Duration::from_secs(10));
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(g.covered(), None);
        assert!(!g.request(1), "a failed waiter takes no more tickets");
    }
}
