//! Traffic at a steady rate: a sender paced against the clock (not by
//! sleeping a fixed gap, which drifts by every send's own time), and a UDP
//! send that retries a transient error instead of hiding a loss.

use std::net::UdpSocket;
use std::time::{Duration, Instant};

/// The k-th send is due `k / rate` seconds after the first.
pub struct Pacer {
    start: Instant,
    rate: u64,
    sent: u64,
}

impl Pacer {
    /// `rate` sends a second (at least one).
    pub fn new(rate: u64) -> Self {
        Self {
            start: Instant::now(),
            rate: rate.max(1),
            sent: 0,
        }
    }

    /// Sleep until the next send is due; returns its number (0, 1, ...).
    pub fn wait(&mut self) -> u64 {
        let k = self.sent;
        let due = self.start + Duration::from_nanos(k.saturating_mul(1_000_000_000) / self.rate);
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
        self.sent += 1;
        k
    }

    /// Sends so far, and the time since the first.
    pub fn sent(&self) -> (u64, Duration) {
        (self.sent, self.start.elapsed())
    }
}

/// Send `msg` on a connected socket. A send that fails (ENOBUFS, or an
/// ICMP error queued on the socket by an earlier datagram) is retried for
/// up to a second: counted as sent but never sent, it would look like a
/// loss on the path under test.
pub fn send_retrying(sock: &UdpSocket, msg: &[u8]) -> std::io::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        match sock.send(msg) {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_micros(100)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pacer_keeps_to_its_rate() {
        let mut p = Pacer::new(1_000);
        let t0 = Instant::now();
        for k in 0..50 {
            assert_eq!(p.wait(), k);
        }
        // 49 gaps of 1 ms: never early; late only by what the host adds.
        assert!(t0.elapsed() >= Duration::from_millis(49));
        assert_eq!(p.sent().0, 50);
    }
}
