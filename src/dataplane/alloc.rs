//! Allocators: service ids, backend ids (one per backend identity,
//! reference counted across VIPs) and slices of the shared Maglev table.
//! Pure bookkeeping; the writer decides when the maps follow.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use crate::dataplane::render::Health;
use crate::model::{BackendKey, BackendTarget};

/// Ids 1..=max. Id 0 means "none" in every map, so it is never handed out.
///
/// Freed ids are reused last-freed-last (FIFO), and never-used ids go
/// first: an id that just stopped naming a backend may still sit in LRU
/// affinity entries, and reusing it late gives those entries time to
/// expire before the id means something else.
#[derive(Debug, Clone)]
pub struct IdAllocator {
    max: u32,
    next: u32,
    freed: VecDeque<u32>,
    used: BTreeSet<u32>,
}

impl IdAllocator {
    pub fn new(max: u32) -> Self {
        Self {
            max,
            next: 1,
            freed: VecDeque::new(),
            used: BTreeSet::new(),
        }
    }

    /// Resume after a restart: `used` are the ids the maps hold. Ids below
    /// the highest used one that are free are queued for reuse, in order.
    pub fn resume(max: u32, used: impl IntoIterator<Item = u32>) -> Self {
        let used: BTreeSet<u32> = used
            .into_iter()
            .filter(|id| *id >= 1 && *id <= max)
            .collect();
        let next = used.last().map_or(1, |m| m + 1);
        let freed = (1..next).filter(|id| !used.contains(id)).collect();
        Self {
            max,
            next,
            freed,
            used,
        }
    }

    pub fn alloc(&mut self) -> Option<u32> {
        let id = if self.next <= self.max {
            self.next += 1;
            self.next - 1
        } else {
            self.freed.pop_front()?
        };
        self.used.insert(id);
        Some(id)
    }

    pub fn free(&mut self, id: u32) {
        if self.used.remove(&id) {
            self.freed.push_back(id);
        }
    }

    pub fn is_used(&self, id: u32) -> bool {
        self.used.contains(&id)
    }

    pub fn used(&self) -> impl Iterator<Item = u32> + '_ {
        self.used.iter().copied()
    }

    pub fn free_count(&self) -> u32 {
        self.max - self.used.len() as u32
    }

    pub fn capacity(&self) -> u32 {
        self.max
    }
}

/// A contiguous run of table slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Slice {
    pub start: u32,
    pub len: u32,
}

impl Slice {
    pub fn end(&self) -> u32 {
        self.start + self.len
    }

    fn overlaps(&self, other: &Slice) -> bool {
        self.start < other.end() && other.start < self.end()
    }
}

/// Moving a live slice elsewhere (copy, switch the service, free the old
/// run) so that a contiguous run opens up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Move {
    pub svc_id: u32,
    pub from: Slice,
    pub to: Slice,
}

/// Free runs of the shared table, coalesced.
#[derive(Debug, Clone)]
pub struct SliceAllocator {
    size: u32,
    free: BTreeMap<u32, u32>,
}

impl SliceAllocator {
    pub fn new(size: u32) -> Self {
        let mut free = BTreeMap::new();
        if size > 0 {
            free.insert(0, size);
        }
        Self { size, free }
    }

    pub fn size(&self) -> u32 {
        self.size
    }

    /// Best fit (the smallest run that holds `len`, lowest start on a
    /// tie): keeps big runs whole for big slices.
    pub fn alloc(&mut self, len: u32) -> Option<Slice> {
        if len == 0 {
            return None;
        }
        let (&start, &run) = self
            .free
            .iter()
            .filter(|(_, l)| **l >= len)
            .min_by_key(|(s, l)| (**l, **s))?;
        self.free.remove(&start);
        if run > len {
            self.free.insert(start + len, run - len);
        }
        Some(Slice { start, len })
    }

    /// Return a run. Freeing what is already free is a bookkeeping bug;
    /// it is refused rather than corrupting the free list.
    pub fn free(&mut self, s: Slice) -> bool {
        if s.len == 0 || s.end() > self.size || self.overlaps_free(s) {
            return false;
        }
        let mut start = s.start;
        let mut len = s.len;
        if let Some((&ps, &pl)) = self.free.range(..start).next_back() {
            if ps + pl == start {
                self.free.remove(&ps);
                start = ps;
                len += pl;
            }
        }
        if let Some(&nl) = self.free.get(&(s.end())) {
            self.free.remove(&s.end());
            len += nl;
        }
        self.free.insert(start, len);
        true
    }

    fn overlaps_free(&self, s: Slice) -> bool {
        if let Some((&ps, &pl)) = self.free.range(..s.end()).next_back() {
            if (Slice { start: ps, len: pl }).overlaps(&s) {
                return true;
            }
        }
        false
    }

    /// Mark a run used (adoption). False if any of it is not free.
    pub fn reserve(&mut self, s: Slice) -> bool {
        if s.len == 0 || s.end() > self.size {
            return false;
        }
        let Some((&ps, &pl)) = self.free.range(..=s.start).next_back() else {
            return false;
        };
        if ps + pl < s.end() {
            return false;
        }
        self.free.remove(&ps);
        if s.start > ps {
            self.free.insert(ps, s.start - ps);
        }
        if ps + pl > s.end() {
            self.free.insert(s.end(), ps + pl - s.end());
        }
        true
    }

    pub fn free_total(&self) -> u32 {
        self.free.values().sum()
    }

    pub fn largest_free(&self) -> u32 {
        self.free.values().copied().max().unwrap_or(0)
    }

    pub fn free_runs(&self) -> impl Iterator<Item = Slice> + '_ {
        self.free.iter().map(|(s, l)| Slice { start: *s, len: *l })
    }

    /// Which live slices to move so that a run of `len` opens up, moving
    /// as few slots as possible. `live` is every allocated slice with its
    /// service id. None when no plan exists (not enough free slots, or
    /// none that the moves can reach).
    ///
    /// Each candidate window [a, a+len) is tried: the slices overlapping
    /// it must each fit in free space outside the window (a moved slice
    /// never overlaps its old run, since the copy is written while the old
    /// one still forwards).
    pub fn plan_compaction(&self, len: u32, live: &[(u32, Slice)]) -> Option<Vec<Move>> {
        if len == 0 || len > self.size || self.free_total() < len {
            return None;
        }
        let mut candidates: BTreeSet<u32> = BTreeSet::new();
        candidates.insert(0);
        candidates.insert(self.size - len);
        for (_, s) in live {
            candidates.insert(s.start);
            if s.end() >= len {
                candidates.insert(s.end() - len);
            }
        }
        for r in self.free_runs() {
            candidates.insert(r.start);
            if r.end() >= len {
                candidates.insert(r.end() - len);
            }
        }
        let mut best: Option<(u64, Vec<Move>)> = None;
        for a in candidates {
            if a + len > self.size {
                continue;
            }
            let window = Slice { start: a, len };
            let mut over: Vec<(u32, Slice)> = live
                .iter()
                .filter(|(_, s)| s.overlaps(&window))
                .copied()
                .collect();
            let cost: u64 = over.iter().map(|(_, s)| u64::from(s.len)).sum();
            if best.as_ref().is_some_and(|(c, _)| *c <= cost) {
                continue;
            }
            over.sort_by_key(|(id, s)| (std::cmp::Reverse(s.len), *id));
            if let Some(plan) = self.simulate(window, &over) {
                best = Some((cost, plan));
            }
        }
        best.map(|(_, p)| p)
    }

    fn simulate(&self, window: Slice, over: &[(u32, Slice)]) -> Option<Vec<Move>> {
        let mut sim = self.clone();
        // Hold the window's free parts so no move lands in it.
        let free_in_window: Vec<Slice> = sim.free_runs().filter_map(|r| clip(r, window)).collect();
        for part in &free_in_window {
            sim.reserve(*part);
        }
        let mut plan = Vec::with_capacity(over.len());
        for (svc_id, from) in over {
            let to = sim.alloc(from.len)?;
            plan.push(Move {
                svc_id: *svc_id,
                from: *from,
                to,
            });
            // What the moved slice vacates is not reused within the plan:
            // old slices become free only after a grace period, which the
            // writer waits for once, after all the moves.
        }
        Some(plan)
    }
}

fn clip(r: Slice, w: Slice) -> Option<Slice> {
    let start = r.start.max(w.start);
    let end = r.end().min(w.end());
    (start < end).then(|| Slice {
        start,
        len: end - start,
    })
}

/// One backend id's bookkeeping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendRecord {
    pub key: BackendKey,
    /// VIPs listing this backend.
    pub refs: u32,
}

/// Probe and drain state are kept apart and combined on write, so that a
/// failed probe always wins over a drain and an undrain never hides a
/// failed probe.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HealthInputs {
    pub probe_down: bool,
    pub draining: bool,
}

impl HealthInputs {
    pub fn state(&self) -> Health {
        if self.probe_down {
            Health::Down
        } else if self.draining {
            Health::Draining
        } else {
            Health::Healthy
        }
    }

    /// The inputs that explain a state read back from the maps.
    pub fn from_state(h: Health) -> Self {
        Self {
            probe_down: h == Health::Down,
            draining: h == Health::Draining,
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("all {capacity} backend ids are in use")]
pub struct BackendIdsExhausted {
    pub capacity: u32,
}

/// Backend identities to ids, reference counted: a backend listed by
/// several VIPs is one id, so its health is stated once.
#[derive(Debug, Clone)]
pub struct BackendRegistry {
    ids: IdAllocator,
    by_key: HashMap<BackendKey, u32>,
    records: BTreeMap<u32, BackendRecord>,
    /// Health per probe target; outlives nothing: dropped with the last
    /// backend id of that target.
    health: HashMap<BackendTarget, HealthInputs>,
}

impl BackendRegistry {
    pub fn new(max: u32) -> Self {
        Self {
            ids: IdAllocator::new(max),
            by_key: HashMap::new(),
            records: BTreeMap::new(),
            health: HashMap::new(),
        }
    }

    /// Resume from adopted backends (id, identity, state). Their
    /// reference counts start at 0; adopted VIPs then `add_ref` theirs,
    /// and whatever stays at 0 is an orphan for `prune_orphans`.
    pub fn resume(max: u32, backends: &[(u32, BackendKey, Health)]) -> Self {
        let mut r = Self {
            ids: IdAllocator::resume(max, backends.iter().map(|b| b.0)),
            by_key: HashMap::new(),
            records: BTreeMap::new(),
            health: HashMap::new(),
        };
        for (id, key, h) in backends {
            r.by_key.insert(*key, *id);
            r.records.insert(*id, BackendRecord { key: *key, refs: 0 });
            // Two ids of one target may disagree after a crash; the worse
            // state is the safe one to keep.
            let inputs = HealthInputs::from_state(*h);
            let e = r.health.entry(key.target()).or_default();
            e.probe_down |= inputs.probe_down;
            e.draining |= inputs.draining;
        }
        r
    }

    /// The id for `key`, allocating one if it has none; the reference
    /// count goes up either way. `true` when the id is new (its map
    /// entries must be written before anything references it).
    pub fn acquire(&mut self, key: &BackendKey) -> Result<(u32, bool), BackendIdsExhausted> {
        if let Some(&id) = self.by_key.get(key) {
            if let Some(r) = self.records.get_mut(&id) {
                r.refs += 1;
            }
            return Ok((id, false));
        }
        let id = self.ids.alloc().ok_or(BackendIdsExhausted {
            capacity: self.ids.capacity(),
        })?;
        self.by_key.insert(*key, id);
        self.records
            .insert(id, BackendRecord { key: *key, refs: 1 });
        self.health.entry(key.target()).or_default();
        Ok((id, true))
    }

    pub fn add_ref(&mut self, id: u32) {
        if let Some(r) = self.records.get_mut(&id) {
            r.refs += 1;
        }
    }

    /// Drop one reference; returns the record when that was the last (the
    /// id is then free and its map entries must be cleared).
    pub fn release(&mut self, id: u32) -> Option<BackendRecord> {
        let r = self.records.get_mut(&id)?;
        r.refs = r.refs.saturating_sub(1);
        if r.refs > 0 {
            return None;
        }
        self.forget(id)
    }

    fn forget(&mut self, id: u32) -> Option<BackendRecord> {
        let r = self.records.remove(&id)?;
        self.by_key.remove(&r.key);
        self.ids.free(id);
        let target = r.key.target();
        if !self.records.values().any(|o| o.key.target() == target) {
            self.health.remove(&target);
        }
        Some(r)
    }

    /// Remove adopted backends no VIP references (ids freed).
    pub fn prune_orphans(&mut self) -> Vec<(u32, BackendRecord)> {
        let orphans: Vec<u32> = self
            .records
            .iter()
            .filter(|(_, r)| r.refs == 0)
            .map(|(id, _)| *id)
            .collect();
        orphans
            .into_iter()
            .filter_map(|id| self.forget(id).map(|r| (id, r)))
            .collect()
    }

    pub fn id_of(&self, key: &BackendKey) -> Option<u32> {
        self.by_key.get(key).copied()
    }

    pub fn get(&self, id: u32) -> Option<&BackendRecord> {
        self.records.get(&id)
    }

    pub fn records(&self) -> impl Iterator<Item = (u32, &BackendRecord)> {
        self.records.iter().map(|(id, r)| (*id, r))
    }

    /// Ids of every backend with this probe target.
    pub fn ids_of_target(&self, t: &BackendTarget) -> Vec<u32> {
        self.records
            .iter()
            .filter(|(_, r)| r.key.target() == *t)
            .map(|(id, _)| *id)
            .collect()
    }

    /// The invariant `knows_target` relies on: the health map holds a
    /// target exactly while some id has it. A scan: for tests only (it
    /// was a debug assertion in every status publish, which made a debug
    /// build's publish at 4,096 VIPs take seconds).
    #[cfg(test)]
    pub fn health_index_consistent(&self) -> bool {
        let targets: std::collections::HashSet<BackendTarget> =
            self.records.values().map(|r| r.key.target()).collect();
        targets.len() == self.health.len() && targets.iter().all(|t| self.health.contains_key(t))
    }

    /// Whether some backend id has this address and port. The health
    /// map holds an entry exactly while one does (acquire adds it, the
    /// last release removes it): a lookup, not a scan of every id.
    pub fn knows_target(&self, t: &BackendTarget) -> bool {
        self.health.contains_key(t)
    }

    pub fn health_inputs(&self, t: &BackendTarget) -> HealthInputs {
        self.health.get(t).copied().unwrap_or_default()
    }

    /// Every target whose inputs satisfy `f`.
    pub fn targets_where(&self, f: impl Fn(&HealthInputs) -> bool) -> Vec<BackendTarget> {
        let mut v: Vec<BackendTarget> = self
            .health
            .iter()
            .filter(|(_, h)| f(h))
            .map(|(t, _)| *t)
            .collect();
        v.sort_unstable();
        v
    }

    pub fn set_health_inputs(&mut self, t: &BackendTarget, h: HealthInputs) {
        if let Some(e) = self.health.get_mut(t) {
            *e = h;
        }
    }

    pub fn state_of(&self, id: u32) -> Health {
        self.records.get(&id).map_or(Health::Down, |r| {
            self.health_inputs(&r.key.target()).state()
        })
    }

    pub fn free_count(&self) -> u32 {
        self.ids.free_count()
    }

    pub fn capacity(&self) -> u32 {
        self.ids.capacity()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_start_at_one_and_reuse_late() {
        let mut a = IdAllocator::new(3);
        assert_eq!(a.alloc(), Some(1));
        assert_eq!(a.alloc(), Some(2));
        a.free(1);
        assert_eq!(a.alloc(), Some(3), "never-used ids first");
        assert_eq!(a.alloc(), Some(1));
        assert_eq!(a.alloc(), None);
        assert_eq!(a.free_count(), 0);
    }

    #[test]
    fn resume_keeps_used_ids() {
        let mut a = IdAllocator::resume(10, [2, 5]);
        let got: Vec<u32> = std::iter::from_fn(|| a.alloc()).collect();
        assert_eq!(got, vec![6, 7, 8, 9, 10, 1, 3, 4]);
    }

    #[test]
    fn slices_coalesce_and_best_fit() {
        let mut s = SliceAllocator::new(100);
        let a = s.alloc(10).unwrap();
        let b = s.alloc(20).unwrap();
        let c = s.alloc(10).unwrap();
        assert_eq!((a.start, b.start, c.start), (0, 10, 30));
        assert!(s.free(a));
        assert!(!s.free(a), "double free refused");
        // A 10-slot hole at 0 and 60 at 40: best fit takes the hole.
        assert_eq!(s.alloc(10).unwrap().start, 0);
        assert!(s.free(Slice { start: 0, len: 10 }));
        assert!(s.free(b));
        assert!(s.free(c));
        assert_eq!(
            s.free_runs().collect::<Vec<_>>(),
            vec![Slice { start: 0, len: 100 }]
        );
    }

    #[test]
    fn reserve_carves_runs() {
        let mut s = SliceAllocator::new(100);
        assert!(s.reserve(Slice { start: 40, len: 10 }));
        assert!(!s.reserve(Slice { start: 45, len: 10 }));
        assert_eq!(s.free_total(), 90);
        assert_eq!(s.largest_free(), 50);
    }

    #[test]
    fn compaction_opens_a_run() {
        // Slices of 10 at 0, 15, 30 in 60 slots: free 10..15, 25..30 and
        // 40..60; 30 free but no run of 21 until slice 3 moves to 46..56.
        let mut s = SliceAllocator::new(60);
        let live = [
            (1, Slice { start: 0, len: 10 }),
            (2, Slice { start: 15, len: 10 }),
            (3, Slice { start: 30, len: 10 }),
        ];
        for (_, l) in &live {
            assert!(s.reserve(*l));
        }
        assert_eq!(s.alloc(21), None);
        let plan = s.plan_compaction(21, &live).expect("a plan");
        // Apply it and check a run of 12 is now free.
        for m in &plan {
            assert!(!m.to.overlaps(&m.from));
            assert!(s.reserve(m.to), "target {:?} free", m.to);
            assert!(s.free(m.from));
        }
        assert!(s.alloc(21).is_some());
        assert_eq!(plan.len(), 1);
    }

    #[test]
    fn compaction_impossible_when_full() {
        let mut s = SliceAllocator::new(20);
        let live = [(1, Slice { start: 0, len: 15 })];
        s.reserve(live[0].1);
        assert!(s.plan_compaction(6, &live).is_none());
    }

    #[test]
    fn registry_shares_ids_and_counts() {
        let key = BackendKey {
            addr: "10.0.0.1".parse().unwrap(),
            port: 80,
            mac: None,
            mode: None,
        };
        let mut r = BackendRegistry::new(2);
        assert_eq!(r.acquire(&key), Ok((1, true)));
        assert_eq!(r.acquire(&key), Ok((1, false)));
        assert!(r.release(1).is_none());
        assert!(r.release(1).is_some());
        assert_eq!(r.free_count(), 2);
    }

    #[test]
    fn probe_down_wins_over_drain() {
        let mut h = HealthInputs {
            probe_down: true,
            draining: true,
        };
        assert_eq!(h.state(), Health::Down);
        h.probe_down = false;
        assert_eq!(h.state(), Health::Draining);
        h.draining = false;
        assert_eq!(h.state(), Health::Healthy);
    }
}
