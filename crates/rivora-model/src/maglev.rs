//! Weighted Maglev: how big each VIP's slice of the shared table is, and
//! which backend each slot of it names.
//!
//! The table stays a Maglev lookup table (Eisenbud et al., "Maglev: A Fast
//! and Reliable Software Network Load Balancer", NSDI 2016): one slice per
//! VIP, every backend walking its own permutation of the slots (an offset
//! and a skip from a fixed hash of its identity), the same on every node
//! and across restarts for the same backends and weights. Two things
//! differ from the paper, both measured (docs/datapath.md "Maglev"):
//!
//! - **Population.** The paper's backends take turns, and on its turn a
//!   backend searches its permutation for the next free slot. When one
//!   backend leaves, every later search of every other backend can end
//!   elsewhere, so the fill cascades: 4.2x the optimal share of slots
//!   moves when 1 of 100 backends leaves at 25 slots each, still 2x at
//!   250. Here a turn is a single try: the backend's next permutation
//!   slot, claimed if free, else the turn is spent ([`populate`]). A slot
//!   then goes to the backend whose walk reaches it first, which does not
//!   depend on what other slots hold, so a leaving backend's slots go to
//!   whoever reaches them next and little else moves. Tries alone leave
//!   counts uneven (luck), so each backend's count is held in a band of
//!   ±4 % around its exact share ([`bands`]): it always claims up to the
//!   band's floor, and past it only up to the ceiling and while a shared
//!   pool of the slots left over after every floor lasts.
//! - **Size.** A slice is sized from the backends and their weights
//!   ([`slice_need`]): the smallest size at which every share is within
//!   the precision rule ([`PRECISION`]), and a bigger wanted size (192
//!   slots per unit of the backend-count class) at which the population
//!   moves about the optimum; the shared table is then arbitrated between
//!   VIPs ([`plan`]).
//!
//! Sizes come from a ladder, 12 times a power of two: 12 divides evenly
//! among 1, 2, 3 and 4 backends, and a VIP's size changes only when its
//! backend-count class, its precision or the table's water level crosses a
//! rung. `hash % len` keeps its meaning between such changes.
//!
//! Everything here is deterministic: fixed hash keys, backends ordered by
//! identity (never by the caller's list order), integer arithmetic for
//! every bound. Every node behind ECMP and every restart computes the same
//! slices for the same VIPs.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Sizes are `LADDER_MIN << j`: 12, 24, 48, ..., [`MAX_SLICE`].
pub const LADDER_MIN: u32 = 12;

/// The largest slice: the top of the ladder under 32,768, half the default
/// table, so a slice that size can still be rebuilt into free space next
/// to the live one.
pub const MAX_SLICE: u32 = 24_576;

/// Wanted slots per unit of the backend-count class (`class(n)`: `n`
/// rounded up to a power of two, at least 4). At 100 backends that is
/// 24,576 slots, where removing one backend moves 1.1x the optimal share
/// of slots (docs/datapath.md "Maglev"); smaller slices are fine but move more.
pub const SLOTS_PER_BACKEND: u32 = 192;

/// Slots the datapath steps over from the hashed one when a backend is
/// draining or down (`RV_MAGLEV_PROBES`, checked against the ABI by the
/// dataplane's tests): the population keeps every run of one backend
/// shorter than this where it can ([`spread_runs`]).
pub const PROBE_WINDOW: usize = 8;

/// The precision rule: a backend's share of its slice is within 5 %
/// (relative) of its weight's share, or within 0.05 percentage points for
/// shares under 1 %. As a tolerance in slots for a backend of weight `w`
/// among total `W` in a slice of `L`: `L * max(100 w, W) / (2000 W)`.
pub const PRECISION: f64 = 0.05;

/// The tolerance formula's denominator for the rule itself.
const DENOM_RULE: i128 = 2000;

/// The band the population keeps counts in where it holds an integer:
/// ±4 % of the exact share (relative, whatever the share: 4/5 of the
/// rule for shares of 1 % and more, so rounding and the pool never push
/// a share to the rule's edge; and balance within 4 % for many small
/// equal shares, where the rule alone would allow 0.05 points).
const BAND_PERCENT: i128 = 4;

/// At this size every weight profile meets the precision rule (the
/// tolerance is at least one slot for every backend), so the ladder rung
/// above it is the largest `need` can be.
const PRECISION_SURE: u32 = 2000;

/// Ladder rungs, ascending.
pub fn ladder() -> impl DoubleEndedIterator<Item = u32> + Clone {
    (0..)
        .map(|j| LADDER_MIN << j)
        .take_while(|s| *s <= MAX_SLICE)
        .collect::<Vec<u32>>()
        .into_iter()
}

/// The smallest rung holding `x` slots, the top rung for anything bigger.
pub fn rung_at_least(x: u64) -> u32 {
    ladder().find(|r| u64::from(*r) >= x).unwrap_or(MAX_SLICE)
}

/// The backend-count class: `n` rounded up to a power of two, at least 4
/// (so 1 to 4 backends share one size).
pub fn class(n: usize) -> u64 {
    (n.max(4) as u64).next_power_of_two()
}

/// How big a VIP's slice may be, from its weights (every listed backend,
/// weight-0 ones included).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SliceNeed {
    /// The smallest slice: a slot per backend of non-zero weight (on the
    /// ladder). Below it a VIP cannot be written.
    pub min: u32,
    /// The smallest slice at which every share meets the precision rule
    /// (and does at every rung above). Below it the VIP runs with reduced
    /// precision.
    pub need: u32,
    /// The size the VIP gets when the table has room: at least `need`,
    /// and [`SLOTS_PER_BACKEND`] per unit of its backend-count class.
    pub want: u32,
}

impl SliceNeed {
    /// A slice whose size must not change (an adopted VIP nothing has
    /// claimed: the maps keep no weights to size it anew).
    pub fn fixed(len: u32) -> Self {
        Self {
            min: len,
            need: len,
            want: len,
        }
    }
}

/// Sizes for a VIP of these weights (in any order).
pub fn slice_need(weights: &[u32]) -> SliceNeed {
    let nonzero: Vec<u32> = weights.iter().copied().filter(|w| *w > 0).collect();
    let min = rung_at_least(nonzero.len().max(1) as u64);
    if nonzero.is_empty() {
        return SliceNeed::fixed(min);
    }
    let mut need = min;
    if nonzero.len() > 1 {
        // The last rung under PRECISION_SURE that fails decides: every
        // rung above it passes.
        for r in ladder().filter(|r| *r >= min && *r < PRECISION_SURE) {
            if !precision_met(&nonzero, r) {
                need = ladder().find(|x| *x > r).unwrap_or(MAX_SLICE);
            }
        }
    }
    let class_size = u64::from(SLOTS_PER_BACKEND) * class(weights.len());
    let want = need.max(rung_at_least(class_size.min(u64::from(MAX_SLICE))));
    SliceNeed { min, need, want }
}

/// The counts within the precision rule for a backend of weight `w` among
/// `total` in a slice of `len`: `(lo, hi)`, empty (`lo > hi`) when no
/// count is.
fn rule_bounds(w: u32, total: u64, len: u32) -> (i64, i64) {
    let (w, total, len) = (i128::from(w), i128::from(total), i128::from(len));
    let m = (100 * w).max(total);
    bounds(
        DENOM_RULE * len * w - len * m,
        DENOM_RULE * len * w + len * m,
        DENOM_RULE * total,
    )
}

/// The counts within ±[`BAND_PERCENT`] of the exact share.
fn band_bounds(w: u32, total: u64, len: u32) -> (i64, i64) {
    let (w, total, len) = (i128::from(w), i128::from(total), i128::from(len));
    let exact = 100 * len * w;
    bounds(
        exact - BAND_PERCENT * len * w,
        exact + BAND_PERCENT * len * w,
        100 * total,
    )
}

/// `(ceil(lo / d), floor(hi / d))`, lo clamped at 0; `hi` and `d` are
/// positive.
fn bounds(lo: i128, hi: i128, d: i128) -> (i64, i64) {
    let lo = lo.max(0);
    (((lo + d - 1) / d) as i64, (hi / d) as i64)
}

/// Each backend's count band at `len` (weights all non-zero), and
/// whether the bands keep every share within the precision rule.
///
/// The band is ±[`BAND_PERCENT`] of the exact share where that holds an
/// integer (always inside the rule's tolerance), else the rule's whole
/// tolerance. Bands must sum around `len` (floors at most, ceilings at
/// least): where the narrow bands do not, every band is the rule's whole
/// tolerance; where those do not either, or some backend has no count
/// within its tolerance, floor and ceiling of the exact share, which
/// always do (precision then not met).
pub fn bands(weights: &[u32], len: u32) -> (Vec<(u32, u32)>, bool) {
    let total: u64 = weights.iter().map(|w| u64::from(*w)).sum();
    if total == 0 || len == 0 {
        return (vec![(0, 0); weights.len()], true);
    }
    let rule: Vec<(i64, i64)> = weights
        .iter()
        .map(|w| rule_bounds(*w, total, len))
        .collect();
    let feasible = |b: &[(i64, i64)]| {
        let lo: i64 = b.iter().map(|x| x.0).sum();
        let hi: i64 = b.iter().map(|x| x.1).sum();
        b.iter().all(|x| x.0 <= x.1) && lo <= i64::from(len) && hi >= i64::from(len)
    };
    let narrow: Vec<(i64, i64)> = weights
        .iter()
        .zip(&rule)
        .map(|(w, r)| {
            let b = band_bounds(*w, total, len);
            if b.0 <= b.1 {
                b
            } else {
                *r
            }
        })
        .collect();
    let as_u32 = |b: Vec<(i64, i64)>| b.into_iter().map(|(l, h)| (l as u32, h as u32)).collect();
    if feasible(&narrow) {
        return (as_u32(narrow), true);
    }
    if feasible(&rule) {
        return (as_u32(rule), true);
    }
    let floor_ceil: Vec<(u32, u32)> = weights
        .iter()
        .map(|w| {
            let exact = u128::from(len) * u128::from(*w);
            let f = (exact / u128::from(total)) as u32;
            let c = if exact % u128::from(total) == 0 {
                f
            } else {
                f + 1
            };
            (f, c)
        })
        .collect();
    let met = floor_ceil
        .iter()
        .zip(&rule)
        .all(|((f, c), r)| i64::from(*f) >= r.0 && i64::from(*c) <= r.1);
    (floor_ceil, met)
}

/// Whether a slice of `len` gives every backend (weights all non-zero) a
/// share within the precision rule: [`bands`]' verdict, in one pass and
/// without allocating (sizing every VIP of a full-scale apply asks this
/// at every rung).
pub fn precision_met(weights: &[u32], len: u32) -> bool {
    let total: u64 = weights.iter().map(|w| u64::from(*w)).sum();
    if total == 0 || len == 0 {
        return true;
    }
    let (mut narrow, mut rule) = ((0i64, 0i64, true), (0i64, 0i64, true));
    let mut floor_ceil_within = true;
    for w in weights {
        let r = rule_bounds(*w, total, len);
        let b = band_bounds(*w, total, len);
        let n = if b.0 <= b.1 { b } else { r };
        narrow = (narrow.0 + n.0, narrow.1 + n.1, narrow.2 && n.0 <= n.1);
        rule = (rule.0 + r.0, rule.1 + r.1, rule.2 && r.0 <= r.1);
        let exact = u128::from(len) * u128::from(*w);
        let f = (exact / u128::from(total)) as i64;
        let c = if exact % u128::from(total) == 0 {
            f
        } else {
            f + 1
        };
        floor_ceil_within &= f >= r.0 && c <= r.1;
    }
    let feasible = |(lo, hi, nonempty): (i64, i64, bool)| {
        nonempty && lo <= i64::from(len) && hi >= i64::from(len)
    };
    feasible(narrow) || feasible(rule) || floor_ceil_within
}

/// Why the VIPs cannot all be written: even at their smallest slices
/// (plus room to rebuild the largest) they need more than the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanShortfall {
    /// Index of the first VIP past the table.
    pub index: usize,
    /// Slots the VIPs up to it need, room to rebuild included.
    pub needed: u64,
}

/// Slice sizes for VIPs of these needs sharing a table of `table` slots.
///
/// The sizes and the room to rebuild the largest (a rebuild writes the
/// new slice next to the live one) fit the table. Everyone gets `want`
/// when that fits; else a water level `C` on the ladder caps the wants,
/// never going under `need` (the highest `C` that fits); if even every
/// `need` does not fit, `C` caps the needs instead, never under `min`,
/// and the VIPs above it run with reduced precision. A pure function of
/// the needs, in any order: every node holding the same VIPs plans the
/// same sizes, and the level moves only when the set crosses a rung, so
/// one VIP more or less resizes only the VIPs at the level.
pub fn plan(needs: &[SliceNeed], table: u32) -> Result<Vec<u32>, PlanShortfall> {
    let fits = |sizes: &[u32]| {
        let sum: u64 = sizes.iter().map(|s| u64::from(*s)).sum();
        let max = sizes.iter().copied().max().unwrap_or(0);
        sum + u64::from(max) <= u64::from(table)
    };
    let phases: [fn(&SliceNeed, u32) -> u32; 2] = [
        |n, c| n.need.max(n.want.min(c)),
        |n, c| n.min.max(n.need.min(c)),
    ];
    for phase in phases {
        for c in ladder().rev() {
            let sizes: Vec<u32> = needs.iter().map(|n| phase(n, c)).collect();
            if fits(&sizes) {
                return Ok(sizes);
            }
        }
    }
    let (mut sum, mut max) = (0u64, 0u32);
    for (i, n) in needs.iter().enumerate() {
        sum += u64::from(n.min);
        max = max.max(n.min);
        if sum + u64::from(max) > u64::from(table) {
            return Err(PlanShortfall {
                index: i,
                needed: sum + u64::from(max),
            });
        }
    }
    // Unreachable: the minimums fit, so the last phase's lowest level did.
    Err(PlanShortfall {
        index: needs.len(),
        needed: sum + u64::from(max),
    })
}

/// One backend as Maglev sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry<'a> {
    /// Stable identity (address and port bytes): decides the permutation.
    pub identity: &'a [u8],
    /// Relative share; 0 takes no slots.
    pub weight: u32,
    /// What the slots hold (the backend id); must not be 0.
    pub id: u32,
}

/// FNV-1a over the identity, finished with the murmur3 64-bit mixer so
/// that close identities (10.0.0.1 vs 10.0.0.2) land far apart. The seed
/// selects one of two independent hashes (offset and skip).
pub fn hash64(seed: u64, bytes: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

const OFFSET_SEED: u64 = 0x5249_5652_4f46_4653; // "RIVROFFS"
const SKIP_SEED: u64 = 0x5249_5652_534b_4950; // "RIVRSKIP"

/// `x` with `a * x = 1 (mod m)`, for `a` coprime to `m` (1 when `m` is).
fn mod_inverse(a: u64, m: u64) -> u64 {
    let (mut r0, mut r1) = (i128::from(m), i128::from(a % m));
    let (mut t0, mut t1) = (0i128, 1i128);
    while r1 != 0 {
        let q = r0 / r1;
        (r0, r1) = (r1, r0 - q * r1);
        (t0, t1) = (t1, t0 - q * t1);
    }
    t0.rem_euclid(i128::from(m)) as u64
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// (offset, skip) of a backend's permutation of `size` slots. The skip is
/// coprime to the size, so the walk visits every slot once even when the
/// size is not prime.
fn permutation(identity: &[u8], size: u32) -> (u32, u32) {
    let m = u64::from(size);
    let offset = hash64(OFFSET_SEED, identity) % m;
    if m == 1 {
        return (0, 0);
    }
    let mut skip = hash64(SKIP_SEED, identity) % (m - 1) + 1;
    while gcd(skip, m) != 1 {
        skip = if skip + 1 >= m { 1 } else { skip + 1 };
    }
    (offset as u32, skip as u32)
}

/// Backends of non-zero weight in identity order: the caller's list order
/// never matters.
fn ordered<'a>(entries: &'a [Entry<'a>]) -> Vec<&'a Entry<'a>> {
    let mut order: Vec<&Entry<'_>> = entries.iter().filter(|e| e.weight > 0).collect();
    order.sort_by(|a, b| a.identity.cmp(b.identity).then(a.id.cmp(&b.id)));
    order
}

/// One backend's walk while a slice fills (20 bytes: a slice has at most
/// `u32::MAX` slots).
#[derive(Debug, Clone, Copy)]
struct Walker {
    /// Next slot of its permutation, and the step to the one after.
    pos: u32,
    skip: u32,
    id: u32,
    /// Claims left below its band's floor (it always claims those), and
    /// below its ceiling (past the floor, only while the pool lasts).
    to_floor: u32,
    to_ceil: u32,
}

impl Walker {
    /// Whether it may still claim. Never true again once false: counts
    /// only grow and the pool only shrinks.
    #[inline]
    fn may_claim(&self, pool: u32) -> bool {
        self.to_floor > 0 || (self.to_ceil > 0 && pool > 0)
    }

    /// One turn: a try at the next slot of its walk, claimed if free and
    /// the band allows. Whether it claimed.
    #[inline]
    fn turn(&mut self, f: &mut Fill) -> bool {
        let p = self.pos as usize;
        // `pos + skip - len` without overflowing u32 at any size.
        let back = f.len - self.skip;
        self.pos = if self.pos >= back {
            self.pos - back
        } else {
            self.pos + self.skip
        };
        // The bitmap, not the table: most tries late in a fill hit taken
        // slots, and 8 KB of bits stay in cache where 256 KB of slots do
        // not (the build's cost is these misses).
        let (word, bit) = (p >> 6, 1u64 << (p & 63));
        if f.taken[word] & bit != 0 {
            return false;
        }
        if self.to_floor == 0 {
            if f.pool == 0 || self.to_ceil == 0 {
                return false;
            }
            f.pool -= 1;
        } else {
            self.to_floor -= 1;
        }
        self.to_ceil -= 1;
        f.taken[word] |= bit;
        f.table[p] = self.id;
        f.filled += 1;
        true
    }
}

/// A one-group fill goes on by free slot ([`Fill::finish_by_arrival`])
/// once free slots times walkers is at most the size over this: its
/// cost grows with that product, the tries it saves about
/// `len * ln(free)` (measured: 1 to 4 are alike, 8 is slower).
const ARRIVAL_BUDGET: usize = 2;

/// A slice while it fills.
struct Fill {
    table: Vec<u32>,
    /// One bit per slot: taken.
    taken: Vec<u64>,
    len: u32,
    filled: usize,
    /// Slots left once every backend has its floor: shared, first come.
    pool: u32,
}

impl Fill {
    /// One turn of each walker of a group, in order; walkers that may not
    /// claim any more leave it.
    fn turns(&mut self, group: &mut Vec<Walker>) {
        let pool_before = self.pool;
        let mut leaving = false;
        for w in group.iter_mut() {
            if w.turn(self) {
                leaving |= !w.may_claim(self.pool);
            }
        }
        // The pool running out stops every walker at its floor.
        if leaving || (pool_before > 0 && self.pool == 0) {
            let pool = self.pool;
            group.retain(|w| w.may_claim(pool));
        }
    }

    /// The rest of a one-group fill, by free slot rather than by try: the
    /// same table as taking the turns, far fewer steps once few slots are
    /// free (1,000 backends in 65,537 slots: the last 300 free slots take
    /// 250,000 of the 600,000 tries).
    ///
    /// Walker `j`'s try in round `r` (counted from now) is at
    /// `pos_j + r * skip_j`, so it reaches a free slot `s` in round
    /// `(s - pos_j) / skip_j` (mod `len`: the skip is invertible). A try
    /// at a taken slot changes nothing but the walk, so the fill is the
    /// sequence of tries at free slots in (round, group order): each slot
    /// goes to the first walker reaching it that may still claim then.
    /// Whether a walker may claim only ever turns false, and only through
    /// claims, so each slot keeps its earliest candidate and is looked at
    /// again when the candidate fails by then; the slot whose candidate
    /// comes first is always the next claim. Leaving the group at the end
    /// of a round (`turns`) is what failing a try does here: a walker that
    /// may not claim never claims again.
    fn finish_by_arrival(&mut self, group: &mut [Walker]) {
        let len = u64::from(self.len);
        let inverse: Vec<u64> = group
            .iter()
            .map(|w| mod_inverse(u64::from(w.skip), len))
            .collect();
        // `x % len` for `x < 2^64` by a multiply (Barrett): the quotient
        // from `2^64 / len` is low by at most 1.
        let recip = u64::MAX / len;
        let reduce = |x: u64| -> u64 {
            let q = ((u128::from(x) * u128::from(recip)) >> 64) as u64;
            let r = x - q * len;
            if r >= len {
                r - len
            } else {
                r
            }
        };
        // (round << 32 | index): the order tries happen in.
        let arrival = |w: &Walker, inv: u64, j: usize, s: u32| -> u64 {
            let d = if s >= w.pos {
                s - w.pos
            } else {
                s + (self.len - w.pos)
            };
            reduce(u64::from(d) * inv) << 32 | j as u64
        };
        // The first try at `s` from `from` on by a walker that may claim.
        let candidate = |group: &[Walker], pool: u32, s: u32, from: u64| -> u64 {
            let mut best = u64::MAX;
            for (j, w) in group.iter().enumerate() {
                if w.may_claim(pool) {
                    let a = arrival(w, inverse[j], j, s);
                    if a >= from && a < best {
                        best = a;
                    }
                }
            }
            best
        };
        // Free slots by their candidate's try; a slot without one (no
        // walker left that may claim) stays free, as with the turns.
        let mut next: BinaryHeap<Reverse<(u64, u32)>> = BinaryHeap::new();
        for (i, word) in self.taken.iter().enumerate() {
            let mut open = !word;
            while open != 0 {
                let s = (i as u64 * 64 + u64::from(open.trailing_zeros())) as u32;
                if s >= self.len {
                    break;
                }
                let key = candidate(group, self.pool, s, 0);
                if key != u64::MAX {
                    next.push(Reverse((key, s)));
                }
                open &= open - 1;
            }
        }
        while let Some(Reverse((key, s))) = next.pop() {
            let w = &mut group[(key & 0xffff_ffff) as usize];
            if !w.may_claim(self.pool) {
                let key = candidate(group, self.pool, s, key + 1);
                if key != u64::MAX {
                    next.push(Reverse((key, s)));
                }
                continue;
            }
            if w.to_floor == 0 {
                self.pool -= 1;
            } else {
                w.to_floor -= 1;
            }
            w.to_ceil -= 1;
            self.taken[s as usize >> 6] |= 1u64 << (s & 63);
            self.table[s as usize] = w.id;
            self.filled += 1;
        }
    }
}

/// Populate a slice of `size` slots. Returns slot -> id, 0 for a slot no
/// backend holds (only when every weight is 0 or there is no backend).
///
/// Backends take turns, and a turn is one try at the backend's next
/// permutation slot: claimed if free and the backend's band allows
/// ([`Walker::turn`]), else spent. Backends of one weight take their
/// turns together, in identity order; weights space the groups' turns
/// 1/w apart (stride scheduling in fixed point, 2^64 / w, starting half a
/// stride in; ties to the heavier weight). With equal weights that is a
/// plain round robin. A backend that may not claim any more leaves the
/// turns. Every count ends within its band ([`bands`]); runs of one
/// backend are then broken up where the datapath's probe window needs it
/// ([`spread_runs`]).
///
/// Termination: while a slot is free some backend may claim (the pool is
/// what the floors leave, and the ceilings sum to at least the size), and
/// a walk visits every slot in `size` tries.
pub fn populate(entries: &[Entry<'_>], size: u32) -> Vec<u32> {
    populate_with(entries, size, true)
}

/// [`populate`], finishing a one-group fill by free slot or not
/// ([`Fill::finish_by_arrival`]; the tests check both give one table).
fn populate_with(entries: &[Entry<'_>], size: u32, by_arrival: bool) -> Vec<u32> {
    let m = size as usize;
    let order = ordered(entries);
    if m == 0 || order.is_empty() {
        return vec![0; m];
    }
    let weights: Vec<u32> = order.iter().map(|e| e.weight).collect();
    let (band, _) = bands(&weights, size);
    let floors: u64 = band.iter().map(|b| u64::from(b.0)).sum();
    let mut f = Fill {
        table: vec![0u32; m],
        taken: vec![0u64; m.div_ceil(64)],
        len: size,
        filled: 0,
        pool: (u64::from(size) - floors) as u32,
    };
    let walkers = order.iter().zip(&band).map(|(e, (lo, hi))| {
        let (pos, skip) = permutation(e.identity, size);
        Walker {
            pos,
            skip,
            id: e.id,
            to_floor: *lo,
            to_ceil: *hi,
        }
    });
    // Groups of one weight, heaviest first, members in identity order.
    let mut ws: Vec<u32> = weights.clone();
    ws.sort_unstable_by(|a, b| b.cmp(a));
    ws.dedup();
    let mut groups: Vec<Vec<Walker>> = vec![Vec::new(); ws.len()];
    for (w, walker) in weights.iter().zip(walkers) {
        if let Ok(g) = ws.binary_search_by(|x| w.cmp(x)) {
            groups[g].push(walker);
        }
    }
    if groups.len() == 1 {
        let g = &mut groups[0];
        while f.filled < m && !g.is_empty() {
            if by_arrival && (m - f.filled) * g.len() <= m / ARRIVAL_BUDGET {
                f.finish_by_arrival(g);
                break;
            }
            f.turns(g);
        }
    } else {
        let stride: Vec<u128> = ws.iter().map(|w| (1u128 << 64) / u128::from(*w)).collect();
        let mut heap: BinaryHeap<Reverse<(u128, usize)>> = (0..groups.len())
            .map(|g| Reverse((stride[g] / 2, g)))
            .collect();
        // Once the pool has run out (in some group's turn), each group
        // drops its walkers at their floor before its next turn: left in,
        // they would take turns for nothing, a heavy one a million between
        // two turns of a light one that still needs a slot.
        let mut purged = vec![false; groups.len()];
        while f.filled < m {
            let Some(Reverse((pass, g))) = heap.pop() else {
                break;
            };
            if f.pool == 0 && !purged[g] {
                groups[g].retain(|w| w.may_claim(0));
                purged[g] = true;
            }
            f.turns(&mut groups[g]);
            if !groups[g].is_empty() {
                heap.push(Reverse((pass + stride[g], g)));
            }
        }
    }
    let mut table = f.table;
    spread_runs(&mut table);
    table
}

/// Break up runs of [`PROBE_WINDOW`] or more slots of one backend, so that
/// a flow hashed into the run still finds another backend within the
/// window when this one is draining or down. Each fix swaps the run's
/// last slot with the nearest slot (either side, at most 4 windows away)
/// of another backend where the swap makes no run that long itself:
/// counts do not change. A backend whose share leaves too few other slots
/// around keeps some runs (1:99: the datapath can only find the light
/// backend within the window of one of its slots).
pub fn spread_runs(table: &mut [u32]) {
    let m = table.len();
    let w = PROBE_WINDOW;
    if m <= w {
        return;
    }
    // Start after a change of backend, so no run wraps past the start.
    let Some(start) = (0..m).find(|&s| table[(s + m - 1) % m] != table[s]) else {
        return;
    };
    // `(start + s) % m` without a division per slot.
    let at = |s: usize| {
        if s < m - start {
            start + s
        } else {
            s - (m - start)
        }
    };
    // Length of the run of `id` through slot `s` (cyclic), capped at m.
    let run_through = |t: &[u32], s: usize, id: u32| -> usize {
        let mut n = 1;
        let mut k = (s + m - 1) % m;
        while t[k] == id && n < m {
            n += 1;
            k = (k + m - 1) % m;
        }
        let mut k = (s + 1) % m;
        while t[k] == id && n < m {
            n += 1;
            k = (k + 1) % m;
        }
        n
    };
    let radius = 4 * w;
    let mut run = 0usize;
    let mut prev = 0u32;
    for step in 0..m {
        let j = at(step);
        let id = table[j];
        run = if step > 0 && id == prev { run + 1 } else { 1 };
        prev = id;
        if run < w || id == 0 {
            continue;
        }
        let mut fixed = false;
        'search: for d in 1..=radius.min(m / 2) {
            for k in [(j + d) % m, (j + m - d) % m] {
                let other = table[k];
                if other == id || other == 0 {
                    continue;
                }
                table[j] = other;
                table[k] = id;
                if run_through(table, j, other) < w && run_through(table, k, id) < w {
                    fixed = true;
                    break 'search;
                }
                table[j] = id;
                table[k] = other;
            }
        }
        if fixed {
            prev = table[j];
            run = run_through_left(table, j, prev);
        }
    }
}

/// Length of the run of `id` ending at slot `s` (cyclic, leftwards).
fn run_through_left(t: &[u32], s: usize, id: u32) -> usize {
    let m = t.len();
    let mut n = 1;
    let mut k = (s + m - 1) % m;
    while t[k] == id && n < m {
        n += 1;
        k = (k + m - 1) % m;
    }
    n
}

/// The paper's population (round-robin turns, each searching for the next
/// free slot of the backend's permutation; weights as more turns), kept
/// as the reference the chosen population is measured against (tests and
/// `rivora-bench`). Counts are exact to within one slot.
pub fn populate_paper(entries: &[Entry<'_>], size: u32) -> Vec<u32> {
    let m = size as usize;
    let order = ordered(entries);
    if m == 0 || order.is_empty() {
        return vec![0; m];
    }
    let weights: Vec<u32> = order.iter().map(|e| e.weight).collect();
    // Exact counts: floors, then one more for the largest remainders.
    let total: u128 = weights.iter().map(|w| u128::from(*w)).sum();
    let mut target = Vec::with_capacity(weights.len());
    let mut rem: Vec<(Reverse<u128>, usize)> = Vec::new();
    let mut given = 0u64;
    for (i, w) in weights.iter().enumerate() {
        let exact = u128::from(size) * u128::from(*w);
        target.push((exact / total) as u32);
        given += u64::from(target[i]);
        rem.push((Reverse(exact % total), i));
    }
    rem.sort_unstable();
    for (_, i) in rem.into_iter().take((u64::from(size) - given) as usize) {
        target[i] += 1;
    }
    let mut table = vec![0u32; m];
    let mut pos: Vec<usize> = Vec::with_capacity(order.len());
    let mut skip: Vec<usize> = Vec::with_capacity(order.len());
    for e in &order {
        let (o, s) = permutation(e.identity, size);
        pos.push(o as usize);
        skip.push(s as usize);
    }
    let mut taken = vec![0u32; order.len()];
    let mut filled = 0usize;
    let claim = |i: usize, table: &mut [u32], pos: &mut [usize], taken: &mut [u32]| {
        let mut p = pos[i];
        while table[p] != 0 {
            p += skip[i];
            if p >= m {
                p -= m;
            }
        }
        table[p] = order[i].id;
        p += skip[i];
        if p >= m {
            p -= m;
        }
        pos[i] = p;
        taken[i] += 1;
    };
    if weights.iter().all(|w| *w == weights[0]) {
        // The paper's loop: plain round robin in identity order.
        while filled < m {
            for i in 0..order.len() {
                if taken[i] < target[i] && filled < m {
                    claim(i, &mut table, &mut pos, &mut taken);
                    filled += 1;
                }
            }
        }
        return table;
    }
    let stride: Vec<u128> = weights
        .iter()
        .map(|w| (1u128 << 64) / u128::from(*w))
        .collect();
    let mut heap: BinaryHeap<Reverse<(u128, usize)>> = (0..order.len())
        .filter(|i| target[*i] > 0)
        .map(|i| Reverse((stride[i] / 2, i)))
        .collect();
    while filled < m {
        let Some(Reverse((pass, i))) = heap.pop() else {
            break;
        };
        claim(i, &mut table, &mut pos, &mut taken);
        filled += 1;
        if taken[i] < target[i] {
            heap.push(Reverse((pass + stride[i], i)));
        }
    }
    table
}

/// Largest slots-per-weight over the mean slots-per-weight, over backends
/// of non-zero weight: 1.0 is perfect balance.
pub fn imbalance(entries: &[Entry<'_>], table: &[u32]) -> f64 {
    let total_w: f64 = entries.iter().map(|e| f64::from(e.weight)).sum();
    if total_w == 0.0 || table.is_empty() {
        return 1.0;
    }
    let mean = table.len() as f64 / total_w;
    let counts = counts(table);
    entries
        .iter()
        .filter(|e| e.weight > 0)
        .map(|e| *counts.get(&e.id).unwrap_or(&0) as f64 / f64::from(e.weight) / mean)
        .fold(0.0, f64::max)
}

fn counts(table: &[u32]) -> std::collections::HashMap<u32, u64> {
    let mut counts = std::collections::HashMap::new();
    for id in table {
        *counts.entry(*id).or_insert(0u64) += 1;
    }
    counts
}

/// The worst share error of a slice, in the precision rule's terms: over
/// backends of non-zero weight, `|slot share - weight share|` divided by
/// the weight share, or by 1 % for shares under 1 %. At most
/// [`PRECISION`] (0.05) when the rule holds.
pub fn share_error(entries: &[Entry<'_>], table: &[u32]) -> f64 {
    let total_w: f64 = entries.iter().map(|e| f64::from(e.weight)).sum();
    if total_w == 0.0 || table.is_empty() {
        return 0.0;
    }
    let counts = counts(table);
    entries
        .iter()
        .filter(|e| e.weight > 0)
        .map(|e| {
            let want = f64::from(e.weight) / total_w;
            let got = *counts.get(&e.id).unwrap_or(&0) as f64 / table.len() as f64;
            (got - want).abs() / want.max(0.01)
        })
        .fold(0.0, f64::max)
}

/// Share of slots whose backend differs between two tables of one size.
pub fn moved_share(before: &[u32], after: &[u32]) -> f64 {
    if before.is_empty() {
        return 0.0;
    }
    let moved = before.iter().zip(after).filter(|(a, b)| a != b).count();
    moved as f64 / before.len() as f64
}

/// The longest run of one backend in a slice, cyclically (the datapath's
/// probe window wraps around the slice).
pub fn longest_run(table: &[u32]) -> usize {
    let m = table.len();
    if m == 0 {
        return 0;
    }
    let Some(start) = (0..m).find(|&s| table[(s + m - 1) % m] != table[s]) else {
        return m;
    };
    let (mut best, mut run) = (0usize, 0usize);
    for step in 0..m {
        let j = (start + step) % m;
        run = if step > 0 && table[j] == table[(j + m - 1) % m] {
            run + 1
        } else {
            1
        };
        best = best.max(run);
    }
    best
}

#[cfg(test)]
mod tests;
