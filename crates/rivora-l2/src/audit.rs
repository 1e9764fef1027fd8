//! Reading a capture for who answered for a VIP and when: the judge of
//! the end-to-end tests and of `rivora-bench l2`.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::Duration;

use crate::frames::{self, Mac, Query};
use crate::pcap::Captured;

fn asked_by(q: &Query, asker: Mac) -> bool {
    match q {
        Query::Arp { sender_mac, .. } => *sender_mac == asker,
        Query::Ns { src_mac, .. } => *src_mac == asker,
    }
}

/// What a capture says about one VIP, as seen by one asker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// The intervals in which two nodes answered for the VIP: maximal
    /// runs of consecutive windows (between two of the asker's questions)
    /// in which two or more MACs claimed it, counted when, from the window
    /// before the run to the window after it, a MAC claimed it again
    /// after another had (A, B, A). A handover quicker than one window
    /// (the old owner's last answer, then the new owner's first claim,
    /// the old one silent from then on: a SIGTERM handover takes a few
    /// milliseconds) puts two MACs in one window without two nodes ever
    /// answering at once, and is not counted.
    pub dual_intervals: u64,
    /// How often the claiming MAC changed from one claim to the next.
    pub changes: u64,
    /// The asker's questions for the VIP.
    pub questions: u64,
}

/// Judge `frames` for `vip`: between each two consecutive questions of
/// `asker` for it, the set of MACs that claimed it (answers to anyone,
/// gratuitous ARP, advertisements); see [`Verdict::dual_intervals`].
pub fn judge(frames: &[Captured], asker: Mac, vip: IpAddr) -> Verdict {
    let mut questions: Vec<Duration> = Vec::new();
    let mut claims: Vec<(Duration, Mac)> = Vec::new();
    for f in frames {
        if let Some(q) = frames::parse(&f.frame) {
            if asked_by(&q, asker) && q.target() == vip {
                questions.push(f.at);
            }
        } else if let Some(c) = frames::claim(&f.frame) {
            if c.addr == vip {
                claims.push((f.at, c.mac));
            }
        }
    }
    claims.sort_by_key(|c| c.0);
    // Each window's claims, as a range of `claims`.
    let mut windows: Vec<std::ops::Range<usize>> = Vec::new();
    let mut c = 0;
    for w in questions.windows(2) {
        while c < claims.len() && claims[c].0 < w[0] {
            c += 1;
        }
        let first = c;
        while c < claims.len() && claims[c].0 < w[1] {
            c += 1;
        }
        windows.push(first..c);
    }
    let several = |r: &std::ops::Range<usize>| {
        claims[r.clone()]
            .iter()
            .map(|c| c.1)
            .collect::<BTreeSet<_>>()
            .len()
            >= 2
    };
    let mut dual_intervals = 0;
    let mut i = 0;
    while i < windows.len() {
        if !several(&windows[i]) {
            i += 1;
            continue;
        }
        let mut end = i;
        while end + 1 < windows.len() && several(&windows[end + 1]) {
            end += 1;
        }
        let from = windows[i.saturating_sub(1)].start;
        let to = windows[(end + 1).min(windows.len() - 1)].end;
        if claimed_again(&claims[from..to]) {
            dual_intervals += 1;
        }
        i = end + 1;
    }
    Verdict {
        dual_intervals,
        changes: claims.windows(2).filter(|w| w[0].1 != w[1].1).count() as u64,
        questions: questions.len() as u64,
    }
}

/// Whether, in `claims` (in time order), a MAC claims again after another
/// MAC's claim followed its own.
fn claimed_again(claims: &[(Duration, Mac)]) -> bool {
    let mut done = BTreeSet::new();
    let mut last: Option<Mac> = None;
    for (_, mac) in claims {
        if last == Some(*mac) {
            continue;
        }
        if done.contains(mac) {
            return true;
        }
        if let Some(prev) = last {
            done.insert(prev);
        }
        last = Some(*mac);
    }
    false
}

/// In `[from, to]`: how often `asker` asked for `vip`, and how often `by`
/// claimed it.
pub fn asked_and_claimed(
    frames: &[Captured],
    asker: Mac,
    by: Mac,
    vip: IpAddr,
    from: Duration,
    to: Duration,
) -> (usize, usize) {
    let (mut asked, mut claimed) = (0, 0);
    for f in frames.iter().filter(|f| f.at >= from && f.at <= to) {
        if let Some(q) = frames::parse(&f.frame) {
            asked += usize::from(asked_by(&q, asker) && q.target() == vip);
        } else if let Some(c) = frames::claim(&f.frame) {
            claimed += usize::from(c.addr == vip && c.mac == by);
        }
    }
    (asked, claimed)
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use super::*;
    use crate::frames::*;

    const P: Mac = [2, 0, 0, 0, 0, 0x99];
    const A: Mac = [2, 0, 0, 0, 0, 0x0a];
    const B: Mac = [2, 0, 0, 0, 0, 0x0b];
    const ME: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 3);
    const V4: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 200);
    const V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 0x200);

    fn at(ms: u64, frame: Vec<u8>) -> Captured {
        Captured {
            at: Duration::from_millis(ms),
            frame,
        }
    }

    /// Questions every 10 ms from 0 to `until`, each answered by `who(t)`.
    fn run(until: u64, who: impl Fn(u64) -> Vec<Mac>) -> Vec<Captured> {
        let mut out = Vec::new();
        for t in (0..=until).step_by(10) {
            out.push(at(t, arp_request(P, ME, V4)));
            for m in who(t) {
                out.push(at(t + 1, arp_reply(m, V4, P, ME)));
            }
        }
        out
    }

    #[test]
    fn a_clean_handover_has_no_dual_interval() {
        // A answers until 500 ms, nobody for 300 ms, then B.
        let f = run(1_500, |t| match t {
            0..=500 => vec![A],
            501..=800 => vec![],
            _ => vec![B],
        });
        let v = judge(&f, P, V4.into());
        assert_eq!(v.dual_intervals, 0);
        assert_eq!(v.changes, 1);
        assert_eq!(v.questions, 151);
    }

    #[test]
    fn two_answering_at_once_is_an_interval_each_time() {
        let f = run(2_000, |t| match t {
            0..=500 => vec![A],
            501..=700 => vec![A, B],
            701..=1_200 => vec![B],
            1_201..=1_300 => vec![A, B],
            _ => vec![A],
        });
        let v = judge(&f, P, V4.into());
        assert_eq!(v.dual_intervals, 2);
    }

    #[test]
    fn a_handover_within_one_window_is_not_dual() {
        // A answers until 500 ms, is silent from its last answer on, and B
        // claims 5 ms later (a SIGTERM handover): one window holds both.
        let mut f = run(1_000, |t| if t <= 500 { vec![A] } else { vec![B] });
        f.retain(|c| c.at != Duration::from_millis(511));
        f.push(at(506, garp_request(B, V4)));
        f.sort_by_key(|c| c.at);
        let v = judge(&f, P, V4.into());
        assert_eq!((v.dual_intervals, v.changes), (0, 1));
        // The same with A answering once more after B's claim: dual.
        f.push(at(508, arp_reply(A, V4, P, ME)));
        f.sort_by_key(|c| c.at);
        assert_eq!(judge(&f, P, V4.into()).dual_intervals, 1);
    }

    #[test]
    fn an_announcement_inside_anothers_tenure_counts() {
        let mut f = run(1_000, |_| vec![A]);
        // B's gratuitous ARP (either form) and an advertisement for the
        // other VIP, amid A's answers.
        f.push(at(405, garp_request(B, V4)));
        f.push(at(703, garp_reply(B, V4)));
        f.push(at(505, na_unsolicited(B, V6)));
        f.sort_by_key(|c| c.at);
        assert_eq!(judge(&f, P, V4.into()).dual_intervals, 2);
        // Questions of someone else do not make windows.
        assert_eq!(judge(&f, B, V4.into()).questions, 0);
        assert_eq!(judge(&f, B, V4.into()).dual_intervals, 0);
    }

    #[test]
    fn ipv6_claims_are_judged_the_same() {
        let ll: Ipv6Addr = "fe80::99".parse().unwrap();
        let mut f = Vec::new();
        for t in (0..=300).step_by(10) {
            f.push(at(t, neighbour_solicitation(P, ll, V6)));
            let q = parse(&neighbour_solicitation(P, ll, V6)).unwrap();
            f.push(at(t + 1, answer(A, &q).unwrap()));
            if t == 150 {
                f.push(at(t + 2, answer(B, &q).unwrap()));
            }
        }
        let v = judge(&f, P, V6.into());
        assert_eq!((v.dual_intervals, v.questions), (1, 31));
    }

    #[test]
    fn asked_and_claimed_within_a_window() {
        let mut f = vec![
            at(10, arp_request(A, ME, V4)),
            at(20, garp_request(B, V4)),
            at(30, garp_reply(B, V4)),
            at(40, arp_request(A, ME, V4)),
        ];
        f.push(at(50, garp_request(A, V4)));
        let ms = Duration::from_millis;
        assert_eq!(
            asked_and_claimed(&f, A, B, V4.into(), ms(15), ms(35)),
            (0, 2)
        );
        assert_eq!(
            asked_and_claimed(&f, A, B, V4.into(), ms(0), ms(100)),
            (2, 2)
        );
    }
}
