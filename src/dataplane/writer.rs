//! The map writer: the one place that turns desired state into map
//! entries. It owns the maps, the allocators and the health state.
//!
//! Write order, so that the datapath never follows a reference to
//! something not written yet (or already gone):
//!
//! 1. backends and their health,
//! 2. the new slice, into free table space (the old one keeps serving),
//! 3. the per-VIP rate limit, if it gains one,
//! 4. service_config_map in one update: the atomic switch of slice
//!    start and length (and mode, affinity, flags),
//! 5. the old slice cleared and freed, backends no VIP lists any more
//!    cleared,
//! 6. the VIP match entries, last, so a packet matches only a VIP whose
//!    service is complete.
//!
//! Removal runs the other way. A failing write before step 4 leaves the
//! VIP's old state forwarding (what was allocated for the new one is
//! given back); after step 4 the new state is live and the error is
//! still reported.
//!
//! Step 5 waits for a grace period: a program run that read the old
//! service entry just before the switch may still read the old slice and
//! the backends it names. The writer waits with membarrier (the kernel's
//! synchronize_rcu, about 16 ms here), too slow to pay per update, so
//! what an update or removal retires (old slices, backends no VIP lists,
//! removed service ids) is queued and reclaimed in batches: whenever an
//! allocation would otherwise fail, on [`Writer::reclaim`] (which waits
//! for a grace period itself), and on [`Writer::reclaim_covered`] once a
//! grace period that began after [`Writer::grace_ticket`] has ended, so
//! the reconciler can have one waited for elsewhere and keep writing.
//! Until then retired slices stay reserved and retired service ids
//! unissued.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::path::Path;

use crate::abi;
use crate::dataplane::adopt::{self, AdoptedVip};
use crate::dataplane::alloc::{
    BackendRegistry, HealthInputs, IdAllocator, Move, Slice, SliceAllocator,
};
use crate::dataplane::render::{
    self, Allocation, Health, MapImage, MatchKey, NatOwner, NatOwnerKey, NextHop, NodeImage,
    VipImage,
};
use crate::dataplane::store::MapStore;
use crate::dataplane::{DataplaneError, Maps};
use crate::maglev::{self, SliceNeed};
use crate::model::{
    Affinity, BackendKey, BackendTarget, DesiredState, Mode, ModelError, NodeSettings, Ports, Vip,
    VipKey,
};
use crate::source_range::SourceRange;

/// A health probe's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    Up,
    Down,
}

/// A VIP the writer holds.
#[derive(Debug, Clone)]
struct LiveVip {
    svc_id: u32,
    key: Option<VipKey>,
    /// None for an adopted VIP no upsert has named yet.
    spec: Option<Vip>,
    /// What the maps hold for it.
    image: VipImage,
    /// One reference each in the backend registry.
    backend_ids: Vec<u32>,
    claimed: bool,
    slice_owned: bool,
    /// nat_owner_map keys this VIP owns.
    nat_owned: Vec<NatOwnerKey>,
    /// Its tunnel_ep_map entries: endpoint address to backend id.
    tunnel_eps: BTreeMap<IpAddr, u32>,
    /// Its source_range_map{,6} entries.
    source_ranges: BTreeSet<SourceRange>,
    /// How big its slice may be: from its spec's weights, or its current
    /// length for an adopted VIP no upsert has named (the maps keep no
    /// weights).
    need: SliceNeed,
}

impl LiveVip {
    fn slice(&self) -> Slice {
        Slice {
            start: self.image.service.slice_start,
            len: self.image.service.slice_len,
        }
    }
}

/// What callers see of a VIP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VipInfo {
    pub svc_id: u32,
    pub key: Option<VipKey>,
    pub slice: Slice,
    pub backend_ids: Vec<u32>,
    /// False for a VIP adopted from the maps that no upsert or reconcile
    /// has named since: `prune_unclaimed` removes those.
    pub claimed: bool,
    /// How big its slice may be (see [`maglev::slice_need`]); an adopted
    /// VIP no upsert has named: its current length, fixed.
    pub need: SliceNeed,
}

impl VipInfo {
    /// Its slice is smaller than its weights need: some backend's share
    /// is off its weight's by more than the precision rule allows (the
    /// table is too full to give it more).
    pub fn reduced_precision(&self) -> bool {
        self.slice.len < self.need.need
    }
}

/// What a reconcile did. VIPs that failed (a full table, a map write)
/// are listed with their error; every other VIP was applied.
#[derive(Debug, Default)]
pub struct ReconcileReport {
    pub created: usize,
    pub updated: usize,
    pub unchanged: usize,
    pub removed: usize,
    pub failed: Vec<(VipKey, DataplaneError)>,
}

/// What the maps hold for an adopted VIP no upsert or reconcile has named
/// yet ([`Writer::unclaimed`]). The maps keep no weights (see
/// [`adopt`]): each backend comes with the Maglev slots it holds in the
/// VIP's slice instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnclaimedVip {
    pub svc_id: u32,
    pub key: VipKey,
    pub slice: Slice,
    /// None when service_config_map names no mode this build knows.
    pub mode: Option<Mode>,
    pub affinity: Affinity,
    /// (backend id, backend, slots), in backend id order.
    pub backends: Vec<(u32, BackendKey, u32)>,
}

/// What an upsert did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upsert {
    Created,
    Updated,
    Unchanged,
}

/// Work retired by a switch, done after the next grace period. Retired
/// slices stay reserved and retired service ids allocated until then.
#[derive(Debug, Clone)]
enum Cleanup {
    Slots(Slice),
    Backends(Vec<u32>),
    SvcRateLimit(u32),
    /// nat_owner_map keys a VIP let go of: held (so no other VIP claims
    /// them) until deleted.
    NatOwners(Vec<NatOwnerKey>),
    /// Scrub flow state, then free the ids.
    Services(BTreeSet<u32>),
}

/// The writer, generic over where the maps are ([`Maps`] for the pinned
/// maps, `MemStore` in tests).
pub struct Writer<S: MapStore = Maps> {
    store: S,
    node: NodeSettings,
    node_image: NodeImage,
    svc_ids: IdAllocator,
    backends: BackendRegistry,
    slices: SliceAllocator,
    vips: BTreeMap<u32, LiveVip>,
    by_key: HashMap<VipKey, u32>,
    /// Retired work, each stamped with the generation it was retired in:
    /// a grace period asked for by [`Writer::grace_ticket`] covers every
    /// generation up to the ticket.
    pending: Vec<(u64, Cleanup)>,
    generation: u64,
    /// Next hops by backend address, as last given ([`Writer::set_next_hops`]).
    next_hops: HashMap<IpAddr, NextHop>,
    /// The next hop each backend id's entry holds.
    nh_written: HashMap<u32, NextHop>,
    /// Full NAT's source towards each backend address, as last given
    /// ([`Writer::set_fullnat_source`]: the route's preferred source); the
    /// node's configured source of the family wins over it.
    fullnat_routes: HashMap<IpAddr, IpAddr>,
    /// The full-NAT source index each backend id's entry holds.
    src_written: HashMap<u32, u8>,
    /// nat_owner_map: each key's owner as written.
    nat_owners: HashMap<NatOwnerKey, NatOwner>,
    /// vip_filter_map: match entries per filter bit, and the bits written.
    filter_counts: HashMap<u32, u32>,
    filter_bits: [u64; abi::VIP_FILTER_WORDS],
    /// Between [`Writer::begin`] and [`Writer::finish`]: the slice length
    /// planned for each VIP of the batch (absent: no room even at its
    /// smallest slice).
    batch: Option<HashMap<VipKey, u32>>,
}

impl Writer<Maps> {
    /// Open the maps pinned under `dir` and adopt what they hold.
    pub fn open_pinned(dir: &Path) -> Result<Self, DataplaneError> {
        Self::open(Maps::open(dir)?)
    }
}

/// Service ids 1..=RV_MAX_VIPS and backend ids 1..=RV_MAX_BACKENDS: the
/// arrays are indexed by id (one entry more than the capacity) and id 0
/// means none.
const MAX_SVC_ID: u32 = abi::MAX_VIPS;
const MAX_BACKEND_ID: u32 = abi::MAX_BACKENDS;

impl<S: MapStore> Writer<S> {
    /// Adopt whatever the maps hold (nothing, the first time) and repair
    /// what no VIP explains: stray match entries, slots and health.
    pub fn open(mut store: S) -> Result<Self, DataplaneError> {
        let img = store.read()?;
        let table = store.table_size();
        let a = adopt::adopt(&img, table);

        // Repairs first: none of it is reachable by a packet that matches
        // a complete VIP.
        for m in &a.stray_matches {
            store.remove_match(m)?;
        }
        for svc in &a.stray_services {
            store.put_service(*svc, &Default::default())?;
        }
        for svc in &a.stray_rate_limits {
            store.put_svc_rate_limit(*svc, None)?;
        }
        if !a.stray_slots.is_empty() {
            for run in runs(&a.stray_slots) {
                store.put_slots(run.start, &vec![0; run.len as usize])?;
            }
        }
        let backends = BackendRegistry::resume(MAX_BACKEND_ID, &a.backends);
        // Unallocated ids read as "down" so that an affinity entry naming
        // one re-picks; a fresh array says "healthy" (zero).
        let mut down: Vec<(u32, Health)> = Vec::new();
        let allocated: BTreeSet<u32> = a.backends.iter().map(|b| b.0).collect();
        for id in 0..abi::BACKEND_ID_SLOTS {
            if !allocated.contains(&id)
                && img.health.get(&id).copied().unwrap_or(Health::Down) != Health::Down
            {
                down.push((id, Health::Down));
            }
        }
        if !down.is_empty() {
            store.put_health(&down)?;
        }

        // Fresh maps (or maps of layout 2, upgraded) hold no full-NAT
        // config: the defaults', written now, so that the maps say what
        // the writer holds from the start.
        let node = settings_from_image(&a.node);
        let node_image = if a.node.fullnat.port_max == 0 {
            let img = NodeImage::from_settings(&node, &a.node.fullnat_srcs);
            store.put_node(&img, &a.node)?;
            img
        } else {
            a.node.clone()
        };
        let mut w = Self {
            svc_ids: IdAllocator::resume(MAX_SVC_ID, a.vips.iter().map(|v| v.svc_id)),
            backends,
            slices: SliceAllocator::new(table),
            node,
            node_image,
            vips: BTreeMap::new(),
            by_key: HashMap::new(),
            pending: Vec::new(),
            generation: 0,
            next_hops: HashMap::new(),
            nh_written: img
                .backends
                .iter()
                .map(|(id, b)| (*id, b.nexthop))
                .collect(),
            fullnat_routes: HashMap::new(),
            src_written: img
                .backends
                .iter()
                .map(|(id, b)| (*id, b.fullnat_src))
                .collect(),
            nat_owners: HashMap::new(),
            filter_counts: HashMap::new(),
            filter_bits: [0; abi::VIP_FILTER_WORDS],
            batch: None,
            store,
        };
        for v in a.vips {
            w.adopt_vip(v);
        }
        // Owners whose service is gone (or not a VIP any more) go; each
        // adopted VIP keeps the keys it owned, so its flows keep them.
        for (k, o) in &img.nat_owners {
            match w.vips.get_mut(&o.svc_id) {
                Some(v) => {
                    v.nat_owned.push(*k);
                    w.nat_owners.insert(*k, *o);
                }
                None => w.store.put_nat_owner(k, None)?,
            }
        }
        for ((svc, addr), id) in &img.tunnel_eps {
            match w.vips.get_mut(svc) {
                Some(v) => {
                    v.tunnel_eps.insert(*addr, *id);
                }
                None => w.store.put_tunnel_ep(*svc, *addr, None)?,
            }
        }
        // A range no VIP explains would admit its sources to whichever
        // VIP gets the id next.
        for (svc, r) in &img.source_ranges {
            match w.vips.get_mut(svc) {
                Some(v) => {
                    v.source_ranges.insert(*r);
                }
                None => w.store.put_source_range(*svc, r, false)?,
            }
        }
        // The filter from what the maps match now, and full NAT's sources
        // (replies come to them), active from here on.
        let mut matches: Vec<MatchKey> = w
            .vips
            .values()
            .flat_map(|v| v.image.matches.clone())
            .collect();
        matches.extend(w.node_image.fullnat_srcs.values().map(|a| src_match(*a)));
        w.filter_count(&matches, 1);
        w.store.put_vip_filter(&w.filter_bits)?;
        Ok(w)
    }

    /// Count match entries in (delta 1) or out (-1) of the VIP filter;
    /// true when the bits changed.
    fn filter_count(&mut self, ms: &[MatchKey], delta: i32) -> bool {
        let mut changed = false;
        for m in ms {
            let bit = abi::vip_filter_bit(m.addr());
            let (w, b) = ((bit / 64) as usize, 1u64 << (bit % 64));
            let c = self.filter_counts.entry(bit).or_default();
            if delta > 0 {
                *c += 1;
                if *c == 1 {
                    self.filter_bits[w] |= b;
                    changed = true;
                }
            } else {
                *c = c.saturating_sub(1);
                if *c == 0 {
                    self.filter_counts.remove(&bit);
                    self.filter_bits[w] &= !b;
                    changed = true;
                }
            }
        }
        changed
    }

    /// Set the filter bits of match entries about to be written: before
    /// them, so a packet never meets an entry its bit would hide.
    fn filter_add(&mut self, ms: &[MatchKey]) -> Result<(), DataplaneError> {
        if self.filter_count(ms, 1) {
            let bits = self.filter_bits;
            self.store.put_vip_filter(&bits)?;
        }
        Ok(())
    }

    /// Clear the bits of match entries removed (after them).
    fn filter_remove(&mut self, ms: &[MatchKey]) -> Result<(), DataplaneError> {
        if self.filter_count(ms, -1) {
            let bits = self.filter_bits;
            self.store.put_vip_filter(&bits)?;
        }
        Ok(())
    }

    /// The next hop a backend at `addr` gets (none until told).
    pub fn next_hop(&self, addr: IpAddr) -> NextHop {
        self.next_hops.get(&addr).copied().unwrap_or_default()
    }

    /// Take the next hops of backend addresses (the whole table: an
    /// address it does not list has none) and rewrite the backend entries
    /// whose next hop changed, in place: the backend's address, port and
    /// MAC stay, so no packet in flight is sent anywhere it would not be
    /// by either the old next hop or the new one (or, for the one packet
    /// that reads the entry while it is written, a mix of the two).
    /// Returns how many entries were rewritten.
    pub fn set_next_hops(
        &mut self,
        hops: HashMap<IpAddr, NextHop>,
    ) -> Result<usize, DataplaneError> {
        self.next_hops = hops;
        let mut out: Vec<(u32, render::BackendEntry)> = Vec::new();
        for (id, rec) in self.backends.records() {
            let want = self.next_hop(rec.key.addr);
            if self.nh_written.get(&id).copied().unwrap_or_default() != want {
                out.push((
                    id,
                    render::BackendEntry {
                        addr: rec.key.addr,
                        port: rec.key.port,
                        mac: rec.key.mac.map_or([0; 6], |m| m.0),
                        nexthop: want,
                        mode: rec.key.mode,
                        fullnat_src: self.src_written.get(&id).copied().unwrap_or(0),
                    },
                ));
            }
        }
        if out.is_empty() {
            return Ok(0);
        }
        // An entry in use (VALID or KERNEL) that changes for anything but
        // turning STALE is first marked STALE, the old next hop kept, and
        // rewritten only once every program run that may have read it as
        // usable has ended: a packet then goes by the old next hop whole,
        // or asks the FIB, never a mix of the old and new MACs. (A run
        // that reads the flags during the second write sees STALE or the
        // new entry whole as long as the copy stores the flags, the last
        // field, after the MACs, which the kernel's forward memcpy does.)
        let marked: Vec<(u32, render::BackendEntry)> = out
            .iter()
            .filter_map(|(id, b)| {
                let old = self.nh_written.get(id).copied().unwrap_or_default();
                let in_use = old.flags & NextHop::STALE == 0
                    && old.flags & (NextHop::VALID | NextHop::KERNEL) != 0;
                (in_use && b.nexthop != old.stale()).then(|| {
                    (
                        *id,
                        render::BackendEntry {
                            nexthop: old.stale(),
                            ..*b
                        },
                    )
                })
            })
            .collect();
        if !marked.is_empty() {
            self.store.put_backends(&marked)?;
            for (id, b) in &marked {
                self.nh_written.insert(*id, b.nexthop);
            }
            self.store.synchronize()?;
        }
        self.store.put_backends(&out)?;
        for (id, b) in &out {
            self.nh_written.insert(*id, b.nexthop);
        }
        Ok(out.len())
    }

    /// Claim the owner keys of a NAT VIP's backends that no other VIP
    /// owns, and refresh those it owns (their backend id may have
    /// changed); keys it no longer uses are returned, to be deleted once
    /// the VIP's new state is switched in. A key that cannot be written
    /// (a full map) is left unowned: the VIP's flows to that backend then
    /// record reverse entries, as every flow did before owners.
    fn claim_nat_owners(
        &mut self,
        svc: u32,
        vip: &Vip,
        ids: &[u32],
        owned: &[NatOwnerKey],
    ) -> (Vec<NatOwnerKey>, Vec<NatOwnerKey>) {
        let mut keep = Vec::new();
        for (b, id) in vip.backends.iter().zip(ids) {
            let Some(k) = render::nat_owner_key(vip, b) else {
                continue;
            };
            if keep.contains(&k) {
                continue;
            }
            // A key this VIP let go of in an earlier apply and whose
            // deletion still waits for its grace period is still its own:
            // taken back (and spared by that cleanup, which skips keys a
            // VIP holds), or the VIP would lose its backend's key for good
            // to a deletion that runs after this claim.
            let held = self.nat_owners.get(&k).map(|o| o.svc_id);
            let mine = owned.contains(&k) || held == Some(svc);
            if !mine && held.is_some() {
                continue;
            }
            let o = NatOwner {
                svc_id: svc,
                backend_id: *id,
                vip: vip.addr,
                vip_port: render::vip_port(vip),
            };
            if self.nat_owners.get(&k) == Some(&o) {
                keep.push(k);
            } else if self.store.put_nat_owner(&k, Some(&o)).is_ok() {
                self.nat_owners.insert(k, o);
                keep.push(k);
            } else if mine {
                // Still the entry that was there: it stays owned.
                keep.push(k);
            }
        }
        let drop = owned
            .iter()
            .filter(|k| !keep.contains(k))
            .copied()
            .collect();
        (keep, drop)
    }

    /// Owner entries a VIP let go of: deleted with what the batch
    /// retired (a failed delete is retried there), held until then.
    fn release_nat_owners(&mut self, keys: &[NatOwnerKey]) {
        if !keys.is_empty() {
            self.retire(Cleanup::NatOwners(keys.to_vec()));
        }
    }

    fn adopt_vip(&mut self, v: AdoptedVip) {
        let slice = Slice {
            start: v.image.service.slice_start,
            len: v.image.service.slice_len,
        };
        let slice_owned = v.slice_owned && self.slices.reserve(slice);
        for id in &v.backend_ids {
            self.backends.add_ref(*id);
        }
        let key = v.key.filter(|k| !self.by_key.contains_key(k));
        if let Some(k) = key {
            self.by_key.insert(k, v.svc_id);
        }
        self.vips.insert(
            v.svc_id,
            LiveVip {
                svc_id: v.svc_id,
                key,
                spec: None,
                need: SliceNeed::fixed(v.image.service.slice_len),
                image: v.image,
                backend_ids: v.backend_ids,
                claimed: false,
                slice_owned,
                nat_owned: Vec::new(),
                tunnel_eps: BTreeMap::new(),
                source_ranges: BTreeSet::new(),
            },
        );
    }

    pub fn store(&self) -> &S {
        &self.store
    }

    pub fn store_mut(&mut self) -> &mut S {
        &mut self.store
    }

    /// Everything the maps hold now.
    pub fn read_maps(&self) -> Result<MapImage, DataplaneError> {
        self.store.read()
    }

    pub fn node(&self) -> &NodeSettings {
        &self.node
    }

    /// Write the node-wide settings (SYN limit, tunnel sources, MACs,
    /// full NAT's ports, timeouts and sources).
    pub fn set_node(&mut self, node: &NodeSettings) -> Result<(), DataplaneError> {
        node.validate()?;
        let img = NodeImage::from_settings(node, &self.node_image.fullnat_srcs);
        if img != self.node_image {
            self.store.put_node(&img, &self.node_image)?;
            self.node_image = img;
        }
        self.node = node.clone();
        self.refresh_fullnat_srcs()
    }

    /// Full NAT's source towards the backend at `addr`: the node's
    /// configured source of its family, else the one last given.
    pub fn fullnat_source(&self, addr: IpAddr) -> Option<IpAddr> {
        self.node
            .fullnat
            .src_for(addr.is_ipv6())
            .or_else(|| self.fullnat_routes.get(&addr).copied())
    }

    /// Record the source the node's route to `backend` prefers, full NAT's
    /// source towards it unless the node configures one for its family,
    /// and rewrite the entries of backends at that address whose source
    /// changes. A flow keeps the source it was given (its affinity entry
    /// holds the index), so a change moves new flows only.
    pub fn set_fullnat_source(
        &mut self,
        backend: IpAddr,
        src: IpAddr,
    ) -> Result<(), DataplaneError> {
        if self.fullnat_routes.get(&backend) == Some(&src) {
            return Ok(());
        }
        self.fullnat_routes.insert(backend, src);
        self.refresh_fullnat_srcs()
    }

    /// fullnat_src_map as written: the sources full NAT sends from.
    pub fn fullnat_srcs(&self) -> &BTreeMap<u8, IpAddr> {
        &self.node_image.fullnat_srcs
    }

    /// The index of full NAT's source towards a backend at `addr`, as the
    /// maps hold it (0: none).
    pub fn fullnat_src_index(&self, addr: IpAddr) -> u8 {
        self.fullnat_source(addr)
            .and_then(|src| {
                self.node_image
                    .fullnat_srcs
                    .iter()
                    .find(|(_, a)| **a == src)
                    .map(|(i, _)| *i)
            })
            .unwrap_or(0)
    }

    /// The index of full NAT's source `src`, given one if it has none:
    /// its fullnat_src_map entry, the config's source filter and the VIP
    /// filter's bit are written before anything can send from it.
    /// Indices are not given back while the writer lives: an
    /// established flow holds its index in its affinity entry.
    fn src_index(&mut self, src: IpAddr) -> Result<u8, DataplaneError> {
        if let Some((idx, _)) = self
            .node_image
            .fullnat_srcs
            .iter()
            .find(|(_, a)| **a == src)
        {
            return Ok(*idx);
        }
        let idx = (1..abi::FULLNAT_SRCS)
            .filter_map(|i| u8::try_from(i).ok())
            .find(|i| !self.node_image.fullnat_srcs.contains_key(i))
            .ok_or(DataplaneError::FullNatSourcesFull {
                src,
                capacity: abi::FULLNAT_SRCS - 1,
            })?;
        let mut srcs = self.node_image.fullnat_srcs.clone();
        srcs.insert(idx, src);
        let img = NodeImage::from_settings(&self.node, &srcs);
        self.filter_add(&[src_match(src)])?;
        self.store.put_node(&img, &self.node_image)?;
        self.node_image = img;
        Ok(idx)
    }

    /// The full-NAT source index a backend at `addr` gets (0: none known).
    fn src_index_for(&mut self, addr: IpAddr) -> Result<u8, DataplaneError> {
        match self.fullnat_source(addr) {
            Some(src) => self.src_index(src),
            None => Ok(0),
        }
    }

    /// Rewrite the entries whose full-NAT source is not the one they
    /// should hold now.
    fn refresh_fullnat_srcs(&mut self) -> Result<(), DataplaneError> {
        let records: Vec<(u32, crate::model::BackendKey)> =
            self.backends.records().map(|(id, r)| (id, r.key)).collect();
        let mut out = Vec::new();
        for (id, key) in records {
            let want = self.src_index_for(key.addr)?;
            if self.src_written.get(&id).copied().unwrap_or(0) != want {
                out.push((
                    id,
                    render::BackendEntry {
                        addr: key.addr,
                        port: key.port,
                        mac: key.mac.map_or([0; 6], |m| m.0),
                        nexthop: self.nh_written.get(&id).copied().unwrap_or_default(),
                        mode: key.mode,
                        fullnat_src: want,
                    },
                ));
            }
        }
        if out.is_empty() {
            return Ok(());
        }
        self.store.put_backends(&out)?;
        for (id, b) in &out {
            self.src_written.insert(*id, b.fullnat_src);
        }
        Ok(())
    }

    /// Reclaim what earlier changes retired: wait one grace period, then
    /// clear old slices, freed backends and removed services' flow state,
    /// and free them. Cheap when nothing is queued. Callers of
    /// upsert/remove should call it (or have a grace period waited for
    /// through [`Writer::grace_ticket`]) after a batch.
    pub fn reclaim(&mut self) -> Result<(), DataplaneError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        self.store.synchronize()?;
        self.clear_retired(u64::MAX)
    }

    /// A ticket for what is retired and not yet covered by an earlier
    /// ticket: once a grace period that began after this call has ended,
    /// [`Writer::reclaim_covered`] with it clears that work without
    /// waiting. None when nothing new was retired.
    pub fn grace_ticket(&mut self) -> Option<u64> {
        let g = self.generation;
        if !self.pending.iter().any(|(stamp, _)| *stamp == g) {
            return None;
        }
        self.generation += 1;
        Some(g)
    }

    /// Clear what `ticket` covers. The caller vouches that a grace period
    /// began after [`Writer::grace_ticket`] gave it and has ended.
    pub fn reclaim_covered(&mut self, ticket: u64) -> Result<(), DataplaneError> {
        self.clear_retired(ticket)
    }

    /// Clear and free retired work of generations up to `upto`; what
    /// fails, and what comes after it, stays queued for the next attempt.
    fn clear_retired(&mut self, upto: u64) -> Result<(), DataplaneError> {
        let (covered, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.pending)
            .into_iter()
            .partition(|(stamp, _)| *stamp <= upto);
        self.pending = later;
        for (i, (_, c)) in covered.iter().enumerate() {
            let r = match c {
                Cleanup::Slots(s) => {
                    self.store
                        .put_slots(s.start, &vec![0; s.len as usize])
                        .map(|()| {
                            self.slices.free(*s);
                        })
                }
                Cleanup::Backends(ids) => {
                    // An id handed out again meanwhile was rewritten whole.
                    let ids: Vec<u32> = ids
                        .iter()
                        .copied()
                        .filter(|id| self.backends.get(*id).is_none())
                        .collect();
                    if ids.is_empty() {
                        Ok(())
                    } else {
                        self.clear_backend_entries(&ids)
                    }
                }
                Cleanup::SvcRateLimit(svc) => {
                    if self
                        .vips
                        .get(svc)
                        .is_some_and(|v| v.image.rate_limit.is_some())
                    {
                        Ok(())
                    } else {
                        self.store.put_svc_rate_limit(*svc, None)
                    }
                }
                Cleanup::NatOwners(keys) => {
                    let mut r = Ok(());
                    for k in keys {
                        let taken_back = self.nat_owners.get(k).is_some_and(|o| {
                            self.vips
                                .get(&o.svc_id)
                                .is_some_and(|v| v.nat_owned.contains(k))
                        });
                        if !self.nat_owners.contains_key(k) || taken_back {
                            continue;
                        }
                        r = self.store.put_nat_owner(k, None);
                        if r.is_err() {
                            break;
                        }
                        self.nat_owners.remove(k);
                    }
                    r
                }
                Cleanup::Services(svcs) => self.finish_removals(svcs),
            };
            if let Err(e) = r {
                // Kept for the next attempt (a finished service scrub
                // freed its ids already and is not retried).
                let keep = if matches!(c, Cleanup::Services(_)) {
                    i + 1
                } else {
                    i
                };
                let mut back: Vec<(u64, Cleanup)> = covered[keep..].to_vec();
                back.append(&mut self.pending);
                self.pending = back;
                return Err(e);
            }
        }
        Ok(())
    }

    /// Retire `c`: done after the next grace period.
    fn retire(&mut self, c: Cleanup) {
        self.pending.push((self.generation, c));
    }

    /// Work queued for the next reclaim (0 when the maps hold nothing
    /// retired).
    pub fn pending_reclaim(&self) -> usize {
        self.pending.len()
    }

    fn release_slice(&mut self, s: Slice) {
        self.retire(Cleanup::Slots(s));
    }

    fn release_backend_entries(&mut self, ids: Vec<u32>) {
        if !ids.is_empty() {
            self.retire(Cleanup::Backends(ids));
        }
    }

    /// Create or update one VIP. Claims it if it was adopted.
    ///
    /// Its slice length comes from the plan over every VIP this writer
    /// holds ([`maglev::plan`]): inside a batch ([`Writer::begin`]) the
    /// batch's plan, and other VIPs are resized at [`Writer::finish`];
    /// alone, VIPs the plan shrinks are rebuilt smaller first (room for
    /// this one) and VIPs it lets grow are rebuilt after, so that sizes
    /// always follow the set of VIPs held, whatever the order they came
    /// in. Resizing another VIP that fails here is retried by the next
    /// upsert, removal or `finish`.
    pub fn upsert_vip(&mut self, vip: &Vip) -> Result<Upsert, DataplaneError> {
        vip.validate()?;
        vip.check_resolved()?;
        self.node.check_vip(vip)?;
        let key = vip.key();
        self.check_overlap(vip)?;
        if let Some(planned) = self.batch.as_ref().and_then(|b| b.get(&key)).copied() {
            return self.write_vip(vip, planned);
        }
        let (sizes, len) = self
            .plan_held(Some(vip))
            .map_err(|s| self.no_room(&key, s))?;
        let _ = self.resize(&sizes, false);
        let r = self.write_vip(vip, len.unwrap_or(maglev::LADDER_MIN));
        if self.batch.is_none() {
            self.resize_held();
        }
        r
    }

    fn write_vip(&mut self, vip: &Vip, len: u32) -> Result<Upsert, DataplaneError> {
        match self.by_key.get(&vip.key()).copied() {
            None => self.create(vip, len).map(|()| Upsert::Created),
            Some(svc) => self.update(svc, vip, len),
        }
    }

    fn no_room(&self, vip: &VipKey, s: maglev::PlanShortfall) -> DataplaneError {
        DataplaneError::MaglevNoRoom {
            vip: *vip,
            needed: s.needed,
            size: self.slices.size(),
        }
    }

    /// Slice lengths for the VIPs this writer holds, with `add` (a VIP
    /// about to be created or changed) in place of the one of its key:
    /// by service id, and `add`'s.
    fn plan_held(
        &self,
        add: Option<&Vip>,
    ) -> Result<(BTreeMap<u32, u32>, Option<u32>), maglev::PlanShortfall> {
        let add_key = add.map(Vip::key);
        let held: Vec<(u32, SliceNeed)> = self
            .vips
            .values()
            .filter(|v| add_key.is_none() || v.key != add_key)
            .map(|v| (v.svc_id, v.need))
            .collect();
        let mut needs: Vec<SliceNeed> = held.iter().map(|h| h.1).collect();
        if let Some(v) = add {
            needs.push(v.slice_need());
        }
        let sizes = maglev::plan(&needs, self.slices.size())?;
        let by_svc = held
            .iter()
            .zip(&sizes)
            .map(|((svc, _), len)| (*svc, *len))
            .collect();
        Ok((by_svc, add.and(sizes.last().copied())))
    }

    /// Rebuild the VIPs whose slice length differs from `sizes`, smaller
    /// ones first (they free room for the rest); with `grow` false, only
    /// those. Adopted VIPs nothing has named keep theirs (the maps keep
    /// no weights to rebuild them by). Each is the usual switch: new slice
    /// into free space, then the service entry. Every VIP is tried; the
    /// failures are returned.
    fn resize(&mut self, sizes: &BTreeMap<u32, u32>, grow: bool) -> Vec<(u32, DataplaneError)> {
        let mut todo: Vec<(bool, u32, u32)> = sizes
            .iter()
            .filter_map(|(svc, len)| {
                let v = self.vips.get(svc)?;
                v.spec.as_ref()?;
                let cur = v.image.service.slice_len;
                (*len != cur && (grow || *len < cur)).then_some((*len > cur, *svc, *len))
            })
            .collect();
        todo.sort_unstable();
        let mut failed = Vec::new();
        for (_, svc, len) in todo {
            let Some(spec) = self.vips.get(&svc).and_then(|v| v.spec.clone()) else {
                continue;
            };
            if let Err(e) = self.update(svc, &spec, len) {
                failed.push((svc, e));
            }
        }
        failed
    }

    /// Bring every VIP held to the plan of what is held.
    fn resize_held(&mut self) -> Vec<(u32, DataplaneError)> {
        match self.plan_held(None) {
            Ok((sizes, _)) => self.resize(&sizes, true),
            // What is held does not fit at its smallest (an adoption of
            // maps written for a bigger plan): leave sizes as they are.
            Err(_) => Vec::new(),
        }
    }

    /// Start a batch: `vips` are the VIPs the writer is to hold once the
    /// caller has removed the others it holds and upserted each of these
    /// (adopted VIPs nothing has named stay too, at their size). Plans
    /// the slices of that set and rebuilds smaller the VIPs whose spec
    /// stays but whose slice shrinks, so that the upserts find room.
    /// Until [`Writer::finish`], upserts use the plan and removals and
    /// upserts leave other VIPs alone. VIPs that do not fit even at their
    /// smallest slice (the first in the order: held ones, by service id,
    /// then new ones as listed) fail their upsert with
    /// [`DataplaneError::MaglevNoRoom`].
    pub fn begin(&mut self, vips: &[Vip]) {
        self.start_batch(vips, true);
    }

    fn start_batch(&mut self, vips: &[Vip], keep_unclaimed: bool) {
        let listed: HashMap<VipKey, &Vip> = vips.iter().map(|v| (v.key(), v)).collect();
        let mut held: Vec<(Option<VipKey>, u32, SliceNeed)> = Vec::new();
        for v in self.vips.values() {
            match v.key.and_then(|k| listed.get(&k)) {
                Some(spec) => held.push((v.key, v.svc_id, spec.slice_need())),
                // About to be removed.
                None if v.spec.is_some() || !keep_unclaimed => {}
                None => held.push((None, v.svc_id, SliceNeed::fixed(v.image.service.slice_len))),
            }
        }
        // Fixed ones first: they stay whatever happens.
        held.sort_by_key(|(k, svc, _)| (k.is_some(), *svc));
        let new: Vec<&Vip> = vips
            .iter()
            .filter(|v| !self.by_key.contains_key(&v.key()))
            .collect();
        let mut needs: Vec<SliceNeed> = held.iter().map(|h| h.2).collect();
        needs.extend(new.iter().map(|v| v.slice_need()));
        let size = self.slices.size();
        let mut fit = needs.len();
        let sizes = loop {
            match maglev::plan(&needs[..fit], size) {
                Ok(s) => break Some(s),
                Err(s) if s.index >= held.len() && s.index < fit => fit = s.index,
                Err(_) if fit > held.len() => fit = held.len(),
                Err(_) => break None,
            }
        };
        let mut batch = HashMap::new();
        let mut shrink = BTreeMap::new();
        if let Some(sizes) = sizes {
            for ((key, svc, _), len) in held.iter().zip(&sizes) {
                if let Some(k) = key {
                    batch.insert(*k, *len);
                    let same =
                        self.vips.get(svc).and_then(|v| v.spec.as_ref()) == listed.get(k).copied();
                    if same {
                        shrink.insert(*svc, *len);
                    }
                }
            }
            for (v, len) in new.iter().zip(&sizes[held.len()..]) {
                batch.insert(v.key(), *len);
            }
        } else {
            for (key, svc, _) in &held {
                if let (Some(k), Some(v)) = (key, self.vips.get(svc)) {
                    batch.insert(*k, v.image.service.slice_len);
                }
            }
        }
        let _ = self.resize(&shrink, false);
        self.batch = Some(batch);
    }

    /// A port range must not overlap another VIP's range on the same
    /// address and protocol (the trie would give each port to one only).
    fn check_overlap(&self, vip: &Vip) -> Result<(), ModelError> {
        let Ports::Range { first, last } = vip.ports else {
            return Ok(());
        };
        let key = vip.key();
        for other in self.by_key.keys() {
            if *other == key || other.addr != key.addr || other.proto != key.proto {
                continue;
            }
            if let Ports::Range { first: f, last: l } = other.ports {
                if first <= l && f <= last {
                    return Err(ModelError::OverlappingRanges {
                        vip: key,
                        other: *other,
                    });
                }
            }
        }
        Ok(())
    }

    /// Remove one VIP; false if there was none. Outside a batch, the
    /// VIPs the plan now lets grow are rebuilt bigger (see `upsert_vip`).
    pub fn remove_vip(&mut self, key: &VipKey) -> Result<bool, DataplaneError> {
        let Some(svc) = self.by_key.get(key).copied() else {
            return Ok(false);
        };
        self.remove_svc(svc)?;
        self.retire(Cleanup::Services(BTreeSet::from([svc])));
        if self.batch.is_none() {
            self.resize_held();
        }
        Ok(true)
    }

    /// Make the maps hold exactly `desired`: VIPs it does not list are
    /// removed (adopted ones included), the rest created or updated where
    /// they differ. Invalid desired state is rejected whole before any
    /// write; a VIP that cannot be applied (a full table, a failed write)
    /// is reported in the result and every other VIP is still applied.
    pub fn reconcile(&mut self, desired: &DesiredState) -> Result<ReconcileReport, DataplaneError> {
        desired.validate()?;
        self.set_node(&desired.node)?;
        let mut report = ReconcileReport::default();
        let wanted: BTreeSet<VipKey> = desired.vips.iter().map(|v| v.key()).collect();
        // Adopted VIPs the state does not list go too: not planned for.
        self.start_batch(&desired.vips, false);
        // Removals first: they free ids and slots for the new VIPs.
        let gone: Vec<u32> = self
            .vips
            .values()
            .filter(|v| v.key.is_none_or(|k| !wanted.contains(&k)))
            .map(|v| v.svc_id)
            .collect();
        let mut scrub = BTreeSet::new();
        for svc in gone {
            let key = self.vips.get(&svc).and_then(|v| v.key);
            match self.remove_svc(svc) {
                Ok(()) => {
                    scrub.insert(svc);
                    report.removed += 1;
                }
                Err(e) => {
                    if let Some(k) = key {
                        report.failed.push((k, e));
                    } else {
                        return Err(e);
                    }
                }
            }
        }
        if !scrub.is_empty() {
            self.retire(Cleanup::Services(scrub));
            // The removed VIPs' ids and slots may be needed right below.
            self.reclaim()?;
        }
        for vip in &desired.vips {
            match self.upsert_vip(vip) {
                Ok(Upsert::Created) => report.created += 1,
                Ok(Upsert::Updated) => report.updated += 1,
                Ok(Upsert::Unchanged) => report.unchanged += 1,
                Err(e) => report.failed.push((vip.key(), e)),
            }
        }
        self.batch = None;
        self.prune_orphan_backends();
        for (svc, e) in self.resize_held() {
            if let Some(k) = self.vips.get(&svc).and_then(|v| v.key) {
                report.failed.push((k, e));
            }
        }
        self.reclaim()?;
        Ok(report)
    }

    /// Remove every adopted VIP nothing has claimed since (and backends
    /// nothing lists). For sources that upsert VIP by VIP: call once every
    /// reconciler has finished its first full pass.
    pub fn prune_unclaimed(&mut self) -> Result<Vec<Option<VipKey>>, DataplaneError> {
        let unclaimed: Vec<(u32, Option<VipKey>)> = self
            .vips
            .values()
            .filter(|v| !v.claimed)
            .map(|v| (v.svc_id, v.key))
            .collect();
        let mut scrub = BTreeSet::new();
        let mut out = Vec::new();
        for (svc, key) in unclaimed {
            self.remove_svc(svc)?;
            scrub.insert(svc);
            out.push(key);
        }
        self.prune_orphan_backends();
        if !scrub.is_empty() {
            // Rare (once after the first full pass): wait here. Nothing
            // pruned, nothing to wait for, whatever else is queued.
            self.retire(Cleanup::Services(scrub));
            self.reclaim()?;
            // The VIPs left may grow into the room.
            if let Some((_, e)) = self.resize_held().into_iter().next() {
                return Err(e);
            }
        }
        Ok(out)
    }

    /// Close a batch of upserts and removals: free backends no VIP lists
    /// any more, bring every VIP's slice to the plan of what is now held
    /// (smaller ones first), and reclaim what the batch retired (one grace
    /// period). The first resize that failed is returned (the VIP keeps
    /// forwarding with its slice; the next finish tries again).
    pub fn finish(&mut self) -> Result<(), DataplaneError> {
        let failed = self.close_batch();
        self.reclaim()?;
        failed.into_iter().next().map_or(Ok(()), Err)
    }

    /// Close a batch without waiting: free backends no VIP lists any
    /// more, bring every slice to the plan (as `finish`), and return the
    /// ticket of a grace period to have waited for elsewhere
    /// ([`Writer::grace_ticket`], then [`Writer::reclaim_covered`]) with
    /// the resizes that failed.
    pub fn finish_deferred(&mut self) -> (Option<u64>, Vec<DataplaneError>) {
        let failed = self.close_batch();
        (self.grace_ticket(), failed)
    }

    fn close_batch(&mut self) -> Vec<DataplaneError> {
        self.batch = None;
        self.prune_orphan_backends();
        let failed = self.resize_held();
        failed
            .into_iter()
            .map(|(svc, e)| match self.vips.get(&svc).and_then(|v| v.key) {
                Some(vip) if !matches!(e, DataplaneError::Vip { .. }) => DataplaneError::Vip {
                    vip,
                    source: Box::new(e),
                },
                _ => e,
            })
            .collect()
    }

    /// Mark an adopted VIP as still wanted without changing it.
    pub fn claim(&mut self, key: &VipKey) -> bool {
        match self.by_key.get(key).and_then(|s| self.vips.get_mut(s)) {
            Some(v) => {
                v.claimed = true;
                true
            }
            None => false,
        }
    }

    pub fn vips(&self) -> Vec<VipInfo> {
        self.vips
            .values()
            .map(|v| VipInfo {
                svc_id: v.svc_id,
                key: v.key,
                slice: v.slice(),
                backend_ids: v.backend_ids.clone(),
                claimed: v.claimed,
                need: v.need,
            })
            .collect()
    }

    /// Adopted VIPs nothing has claimed since, as the maps hold them.
    /// Leftovers whose match entries do not form a VIP (no key) are left
    /// out: nothing can claim them, and the next prune removes them.
    pub fn unclaimed(&self) -> Vec<UnclaimedVip> {
        self.vips
            .values()
            .filter(|v| !v.claimed)
            .filter_map(|v| {
                let key = v.key?;
                let mut slots: BTreeMap<u32, u32> = BTreeMap::new();
                for id in &v.image.slots {
                    *slots.entry(*id).or_default() += 1;
                }
                let svc = &v.image.service;
                let affinity =
                    if u32::from(svc.affinity) == abi::rv_affinity::RV_AFFINITY_CLIENT_IP.0 {
                        Affinity::ClientIp {
                            timeout_s: svc.affinity_timeout_s,
                        }
                    } else {
                        Affinity::None
                    };
                Some(UnclaimedVip {
                    svc_id: v.svc_id,
                    key,
                    slice: v.slice(),
                    mode: render::mode_from_raw(svc.mode),
                    affinity,
                    backends: v
                        .backend_ids
                        .iter()
                        .filter_map(|id| {
                            let rec = self.backends.get(*id)?;
                            Some((*id, rec.key, slots.get(id).copied().unwrap_or(0)))
                        })
                        .collect(),
                })
            })
            .collect()
    }

    /// The VIPs as last upserted (adopted VIPs not named since are absent).
    pub fn specs(&self) -> Vec<Vip> {
        self.vips.values().filter_map(|v| v.spec.clone()).collect()
    }

    /// Where each upserted VIP lives, for [`render::render`].
    pub fn allocations(&self) -> BTreeMap<VipKey, Allocation> {
        self.vips
            .values()
            .filter_map(|v| {
                let spec = v.spec.as_ref()?;
                Some((
                    spec.key(),
                    Allocation {
                        svc_id: v.svc_id,
                        slice_start: v.image.service.slice_start,
                        slice_len: v.image.service.slice_len,
                        backend_ids: v.backend_ids.clone(),
                        nat_owned: v.nat_owned.clone(),
                    },
                ))
            })
            .collect()
    }

    /// The state the maps hold for a backend target, if it is known.
    pub fn health(&self, t: &BackendTarget) -> Option<Health> {
        // Called for every backend of every VIP when the reconciler
        // publishes its status: a scan of all ids here made that
        // quadratic (about 120 ms at 4,096 VIPs x 2 backends).
        // The writer tests check the index this relies on after every
        // step (`health_index_consistent`).
        self.backends
            .knows_target(t)
            .then(|| self.backends.health_inputs(t).state())
    }

    #[cfg(test)]
    pub(crate) fn health_index_consistent(&self) -> bool {
        self.backends.health_index_consistent()
    }

    /// Targets the maps (or this writer) hold as draining. After adoption
    /// this is what backend_health_map said: a target that was both
    /// drained and down reads as down alone.
    pub fn draining_targets(&self) -> Vec<BackendTarget> {
        self.backends.targets_where(|h| h.draining)
    }

    /// Targets a probe (or the adopted maps) hold as down.
    pub fn down_targets(&self) -> Vec<BackendTarget> {
        self.backends.targets_where(|h| h.probe_down)
    }

    /// Record a probe result for every backend id at this address and
    /// port. Returns how many ids it covers (0: not a backend of any VIP).
    pub fn set_health(&mut self, t: &BackendTarget, probe: Probe) -> Result<usize, DataplaneError> {
        let mut h = self.backends.health_inputs(t);
        h.probe_down = probe == Probe::Down;
        self.write_health(t, h)
    }

    /// Drain (take no new flows, keep established ones) or undrain. A
    /// failed probe still wins: draining a down backend leaves it down.
    pub fn set_drain(
        &mut self,
        t: &BackendTarget,
        draining: bool,
    ) -> Result<usize, DataplaneError> {
        let mut h = self.backends.health_inputs(t);
        h.draining = draining;
        self.write_health(t, h)
    }

    fn write_health(
        &mut self,
        t: &BackendTarget,
        h: HealthInputs,
    ) -> Result<usize, DataplaneError> {
        let ids = self.backends.ids_of_target(t);
        if ids.is_empty() {
            return Ok(0);
        }
        let before = self.backends.health_inputs(t);
        if before.state() != h.state() {
            let entries: Vec<(u32, Health)> = ids.iter().map(|id| (*id, h.state())).collect();
            self.store.put_health(&entries)?;
        }
        self.backends.set_health_inputs(t, h);
        Ok(ids.len())
    }

    pub fn free_service_ids(&self) -> u32 {
        self.svc_ids.free_count()
    }

    pub fn free_backend_ids(&self) -> u32 {
        self.backends.free_count()
    }

    pub fn free_slots(&self) -> u32 {
        self.slices.free_total()
    }

    pub fn largest_free_run(&self) -> u32 {
        self.slices.largest_free()
    }

    // ---- internals ----

    /// Ids for a VIP's backends (one reference each), writing the entries
    /// of new ids. On error nothing is held.
    fn acquire_backends(&mut self, vip: &Vip) -> Result<Vec<u32>, DataplaneError> {
        let new = vip
            .backends
            .iter()
            .filter(|b| self.backends.id_of(&b.key()).is_none())
            .count();
        if new as u32 > self.backends.free_count() {
            self.reclaim()?;
        }
        let mut ids = Vec::with_capacity(vip.backends.len());
        let mut fresh: Vec<(u32, render::BackendEntry)> = Vec::new();
        for b in &vip.backends {
            let src = match self.src_index_for(b.addr) {
                Ok(i) => i,
                Err(e) => {
                    self.release_backends(&ids, false);
                    return Err(e);
                }
            };
            match self.backends.acquire(&b.key()) {
                Ok((id, new)) => {
                    ids.push(id);
                    if new {
                        fresh.push((id, render::backend_entry(b, self.next_hop(b.addr), src)));
                    }
                }
                Err(e) => {
                    self.release_backends(&ids, false);
                    return Err(DataplaneError::BackendIdsExhausted {
                        vip: vip.key(),
                        capacity: e.capacity,
                    });
                }
            }
        }
        if fresh.is_empty() {
            return Ok(ids);
        }
        let health: Vec<(u32, Health)> = fresh
            .iter()
            .map(|(id, _)| (*id, self.backends.state_of(*id)))
            .collect();
        let written = self
            .store
            .put_backends(&fresh)
            .and_then(|()| self.store.put_health(&health));
        if let Err(e) = written {
            self.release_backends(&ids, true);
            return Err(e);
        }
        for (id, b) in &fresh {
            self.nh_written.insert(*id, b.nexthop);
            self.src_written.insert(*id, b.fullnat_src);
        }
        Ok(ids)
    }

    /// Drop references; ids nobody holds any more are cleared in the maps
    /// when `clear` (their entries were written), and freed.
    fn release_backends(&mut self, ids: &[u32], clear: bool) -> Vec<u32> {
        let mut freed = Vec::new();
        for id in ids {
            if self.backends.release(*id).is_some() {
                freed.push(*id);
            }
        }
        if clear && !freed.is_empty() {
            // Best effort: an entry left behind names no slot, and the id
            // is rewritten in full before it is used again.
            let _ = self.clear_backend_entries(&freed);
        }
        freed
    }

    fn clear_backend_entries(&mut self, ids: &[u32]) -> Result<(), DataplaneError> {
        let down: Vec<(u32, Health)> = ids.iter().map(|id| (*id, Health::Down)).collect();
        self.store.put_health(&down)?;
        self.store.clear_backends(ids)?;
        for id in ids {
            self.nh_written.remove(id);
            self.src_written.remove(id);
        }
        Ok(())
    }

    /// A free run of `len` slots, moving other slices if the free space is
    /// there but not in one piece.
    fn alloc_slice(&mut self, len: u32, vip: VipKey) -> Result<Slice, DataplaneError> {
        if let Some(s) = self.slices.alloc(len) {
            return Ok(s);
        }
        if !self.pending.is_empty() {
            self.reclaim()?;
            if let Some(s) = self.slices.alloc(len) {
                return Ok(s);
            }
        }
        let full = |w: &Self| DataplaneError::MaglevTableFull {
            vip,
            needed: len,
            free: w.slices.free_total(),
            largest: w.slices.largest_free(),
        };
        let live: Vec<(u32, Slice)> = self
            .vips
            .values()
            .filter(|v| v.slice_owned)
            .map(|v| (v.svc_id, v.slice()))
            .collect();
        let plan = self
            .slices
            .plan_compaction(len, &live)
            .ok_or_else(|| full(self))?;
        for mv in plan {
            self.move_slice(mv)?;
        }
        // The vacated runs are free once no run can still read them.
        self.reclaim()?;
        self.slices.alloc(len).ok_or_else(|| full(self))
    }

    /// Move a live slice: copy into free space, switch the service, clear
    /// and free the old run. The same switch as a rebuild, so just as
    /// atomic for the datapath.
    fn move_slice(&mut self, mv: Move) -> Result<(), DataplaneError> {
        let Some(v) = self.vips.get(&mv.svc_id) else {
            return Ok(());
        };
        let slots = v.image.slots.clone();
        let mut service = v.image.service;
        if !self.slices.reserve(mv.to) {
            return Err(DataplaneError::SliceBookkeeping {
                slice_start: mv.to.start,
            });
        }
        service.slice_start = mv.to.start;
        let switched = self
            .store
            .put_slots(mv.to.start, &slots)
            .and_then(|()| self.store.put_service(mv.svc_id, &service));
        if let Err(e) = switched {
            self.slices.free(mv.to);
            return Err(e);
        }
        if let Some(v) = self.vips.get_mut(&mv.svc_id) {
            v.image.service = service;
        }
        self.release_slice(mv.from);
        Ok(())
    }

    fn create(&mut self, vip: &Vip, len: u32) -> Result<(), DataplaneError> {
        let key = vip.key();
        if self.svc_ids.free_count() == 0 {
            self.reclaim()?;
        }
        let svc = self
            .svc_ids
            .alloc()
            .ok_or(DataplaneError::ServiceIdsExhausted {
                vip: key,
                capacity: MAX_SVC_ID,
            })?;
        let ids = match self.acquire_backends(vip) {
            Ok(ids) => ids,
            Err(e) => {
                self.svc_ids.free(svc);
                return Err(e);
            }
        };
        let slice = match self.alloc_slice(len, key) {
            Ok(s) => s,
            Err(e) => {
                self.release_backends(&ids, true);
                self.svc_ids.free(svc);
                return Err(e);
            }
        };
        let mut image = render::render_vip(vip, (slice.start, len), &ids);
        image.service.flags |= ranges_gen(None, &image.service, &BTreeSet::new(), &BTreeSet::new());
        let (owned, _) = self.claim_nat_owners(svc, vip, &ids, &[]);
        let tunnel_eps = render::tunnel_eps(vip, &ids);
        let want_ranges = render::source_ranges(vip);
        let mut ranges = BTreeSet::new();
        let mut matched: Vec<MatchKey> = Vec::new();
        let mut tunnelled: Vec<IpAddr> = Vec::new();
        let mut filtered = false;
        let result = (|| {
            self.store.put_slots(slice.start, &image.slots)?;
            if let Some(rl) = image.rate_limit {
                self.store.put_svc_rate_limit(svc, Some(rl))?;
            }
            // Fresh counters: the id may have counted another VIP before.
            self.store.zero_stats(svc)?;
            // Before the service entry that says to look them up.
            add_ranges(&mut self.store, svc, &mut ranges, &want_ranges)?;
            self.store.put_service(svc, &image.service)?;
            for (addr, id) in &tunnel_eps {
                self.store.put_tunnel_ep(svc, *addr, Some(*id))?;
                tunnelled.push(*addr);
            }
            filtered = true;
            self.filter_add(&image.matches)?;
            for m in &image.matches {
                self.store.put_match(m, svc)?;
                matched.push(*m);
            }
            Ok(())
        })();
        if let Err(e) = result {
            // Undo in reverse; best effort, the VIP never matched fully.
            for m in matched.iter().rev() {
                let _ = self.store.remove_match(m);
            }
            if filtered {
                let _ = self.filter_remove(&image.matches);
            }
            for addr in &tunnelled {
                let _ = self.store.put_tunnel_ep(svc, *addr, None);
            }
            self.release_nat_owners(&owned);
            let _ = self.store.put_service(svc, &Default::default());
            let _ = drop_ranges(&mut self.store, svc, &mut ranges, &BTreeSet::new());
            if image.rate_limit.is_some() {
                let _ = self.store.put_svc_rate_limit(svc, None);
            }
            let _ = self
                .store
                .put_slots(slice.start, &vec![0; slice.len as usize]);
            self.slices.free(slice);
            self.release_backends(&ids, true);
            self.svc_ids.free(svc);
            return Err(DataplaneError::Vip {
                vip: key,
                source: Box::new(e),
            });
        }
        self.by_key.insert(key, svc);
        self.vips.insert(
            svc,
            LiveVip {
                svc_id: svc,
                key: Some(key),
                spec: Some(vip.clone()),
                image,
                backend_ids: ids,
                claimed: true,
                slice_owned: true,
                nat_owned: owned,
                tunnel_eps,
                source_ranges: ranges,
                need: vip.slice_need(),
            },
        );
        Ok(())
    }

    /// Write `vip` over the VIP `svc` with a slice of `len`: a rebuilt
    /// slice when the slots differ (another length, other backends or
    /// weights, a population of another rule read back from the maps).
    fn update(&mut self, svc: u32, vip: &Vip, len: u32) -> Result<Upsert, DataplaneError> {
        let key = vip.key();
        let Some(cur) = self.vips.get_mut(&svc) else {
            return Err(DataplaneError::SliceBookkeeping { slice_start: 0 });
        };
        cur.claimed = true;
        if cur.spec.as_ref() == Some(vip) && cur.image.service.slice_len == len {
            return Ok(Upsert::Unchanged);
        }
        let ids = self.acquire_backends(vip)?;
        let slots = render::maglev_slots(vip, &ids, len);
        let (old_slots, old_slice, old_owned) = {
            let cur = &self.vips[&svc];
            (cur.image.slots.clone(), cur.slice(), cur.slice_owned)
        };
        let rebuild = slots != old_slots || !old_owned;
        let new_slice = if rebuild {
            match self.alloc_slice(slots.len() as u32, key) {
                Ok(s) => Some(s),
                Err(e) => {
                    self.release_backends(&ids, true);
                    return Err(e);
                }
            }
        } else {
            None
        };
        // A compaction may have moved this VIP's own slice.
        let old_slice = if old_owned {
            self.vips[&svc].slice()
        } else {
            old_slice
        };
        let start = new_slice.map_or(old_slice.start, |s| s.start);
        let mut image = render::vip_image(vip, start, slots);
        let (old_service, old_rl, old_matches, old_ranges) = {
            let cur = &self.vips[&svc];
            (
                cur.image.service,
                cur.image.rate_limit,
                cur.image.matches.clone(),
                cur.source_ranges.clone(),
            )
        };
        let want_ranges = render::source_ranges(vip);
        image.service.flags |= ranges_gen(
            Some(&old_service),
            &image.service,
            &old_ranges,
            &want_ranges,
        );
        let restricted = image.service.flags & SOURCE_RANGES != 0;
        let mut ranges = old_ranges.clone();
        let switched = (|| {
            if let Some(s) = new_slice {
                self.store.put_slots(s.start, &image.slots)?;
            }
            if image.rate_limit.is_some() && image.rate_limit != old_rl {
                self.store.put_svc_rate_limit(svc, image.rate_limit)?;
            }
            // The entries as they are to be before the service entry
            // that names their generation: a flow stamped with it was
            // checked against these alone. Without ranges from now on,
            // they go once nothing looks them up.
            add_ranges(&mut self.store, svc, &mut ranges, &want_ranges)?;
            if restricted {
                drop_ranges(&mut self.store, svc, &mut ranges, &want_ranges)?;
            }
            if image.service != old_service {
                self.store.put_service(svc, &image.service)?;
            }
            Ok(())
        })();
        if let Err(e) = switched {
            if let Some(s) = new_slice {
                let _ = self.store.put_slots(s.start, &vec![0; s.len as usize]);
                self.slices.free(s);
            }
            if image.rate_limit.is_some() && image.rate_limit != old_rl {
                let _ = self.store.put_svc_rate_limit(svc, old_rl);
            }
            let _ = add_ranges(&mut self.store, svc, &mut ranges, &old_ranges);
            let _ = drop_ranges(&mut self.store, svc, &mut ranges, &old_ranges);
            self.release_backends(&ids, true);
            return Err(DataplaneError::Vip {
                vip: key,
                source: Box::new(e),
            });
        }
        // Committed: the datapath now reads the new slice. Bookkeeping
        // follows before anything that can still fail.
        let old_ids = {
            let cur = self
                .vips
                .get_mut(&svc)
                .ok_or(DataplaneError::SliceBookkeeping { slice_start: start })?;
            cur.spec = Some(vip.clone());
            cur.need = vip.slice_need();
            cur.image.service = image.service;
            cur.image.slots = image.slots.clone();
            cur.image.rate_limit = image.rate_limit;
            cur.slice_owned = true;
            std::mem::replace(&mut cur.backend_ids, ids)
        };
        let freed: Vec<u32> = old_ids
            .iter()
            .filter(|id| self.backends.release(**id).is_some())
            .copied()
            .collect();
        if new_slice.is_some() && old_owned {
            self.release_slice(old_slice);
        }
        if old_rl.is_some() && image.rate_limit.is_none() {
            self.retire(Cleanup::SvcRateLimit(svc));
        }
        self.release_backend_entries(freed);
        // Owner keys after the switch: a flow that starts before its VIP
        // owns the key records a reverse entry, so nothing needs undoing
        // if the switch fails.
        let held = self.vips[&svc].nat_owned.clone();
        let new_ids = self.vips[&svc].backend_ids.clone();
        let (owned, unowned) = self.claim_nat_owners(svc, vip, &new_ids, &held);
        if let Some(cur) = self.vips.get_mut(&svc) {
            cur.nat_owned = owned;
        }
        self.release_nat_owners(&unowned);
        let mut cleanup = self.sync_tunnel_eps(svc, render::tunnel_eps(vip, &new_ids));
        cleanup = cleanup.and(drop_ranges(&mut self.store, svc, &mut ranges, &want_ranges));
        if let Some(cur) = self.vips.get_mut(&svc) {
            cur.source_ranges = ranges;
        }
        // Match entries: the same for a VIP written by this writer; an
        // adopted one may hold different blocks.
        let added: Vec<MatchKey> = image
            .matches
            .iter()
            .filter(|m| !old_matches.contains(m))
            .copied()
            .collect();
        let gone: Vec<MatchKey> = old_matches
            .iter()
            .filter(|m| !image.matches.contains(m))
            .copied()
            .collect();
        cleanup = cleanup.and(self.filter_add(&added));
        for m in &added {
            cleanup = cleanup.and(self.store.put_match(m, svc));
        }
        for m in &gone {
            cleanup = cleanup.and(self.store.remove_match(m));
        }
        cleanup = cleanup.and(self.filter_remove(&gone));
        if let Some(cur) = self.vips.get_mut(&svc) {
            cur.image.matches = image.matches;
        }
        cleanup.map_err(|e| DataplaneError::Vip {
            vip: key,
            source: Box::new(e),
        })?;
        Ok(Upsert::Updated)
    }

    /// Take a VIP out of the maps in reverse order. With `scrub`, its flow
    /// state goes and its id is freed now; without, the caller batches
    /// that through `finish_removals`.
    fn remove_svc(&mut self, svc: u32) -> Result<(), DataplaneError> {
        let Some(cur) = self.vips.get(&svc).cloned() else {
            return Ok(());
        };
        let ctx = |e: DataplaneError| match cur.key {
            Some(vip) => DataplaneError::Vip {
                vip,
                source: Box::new(e),
            },
            None => e,
        };
        for (i, m) in cur.image.matches.iter().enumerate() {
            if let Err(e) = self.store.remove_match(m) {
                if let Some(v) = self.vips.get_mut(&svc) {
                    v.image.matches.drain(..i);
                }
                let _ = self.filter_remove(&cur.image.matches[..i]);
                return Err(ctx(e));
            }
        }
        if let Some(v) = self.vips.get_mut(&svc) {
            v.image.matches.clear();
        }
        self.filter_remove(&cur.image.matches).map_err(ctx)?;
        self.store
            .put_service(svc, &Default::default())
            .map_err(ctx)?;
        // Unreachable from here on: the rest is cleanup.
        let mut ranges = cur.source_ranges.clone();
        let tunnels = self.sync_tunnel_eps(svc, BTreeMap::new()).and(drop_ranges(
            &mut self.store,
            svc,
            &mut ranges,
            &BTreeSet::new(),
        ));
        if let Some(k) = cur.key {
            self.by_key.remove(&k);
        }
        self.vips.remove(&svc);
        self.release_nat_owners(&cur.nat_owned);
        let freed = self.release_backends(&cur.backend_ids, false);
        if cur.image.rate_limit.is_some() {
            self.retire(Cleanup::SvcRateLimit(svc));
        }
        if cur.slice_owned {
            self.release_slice(cur.slice());
        }
        self.release_backend_entries(freed);
        // The service id stays allocated until its flow state is scrubbed
        // (a queued Services cleanup), so a new VIP never inherits it.
        tunnels.and(self.store.zero_stats(svc)).map_err(ctx)
    }

    /// Make the VIP `svc`'s tunnel_ep_map entries `want`: changed and new
    /// ones written, gone ones deleted. What was done is remembered even
    /// when a step fails, so a later call finishes the job.
    fn sync_tunnel_eps(
        &mut self,
        svc: u32,
        want: BTreeMap<IpAddr, u32>,
    ) -> Result<(), DataplaneError> {
        let Some(have) = self.vips.get(&svc).map(|v| v.tunnel_eps.clone()) else {
            return Ok(());
        };
        let mut result = Ok(());
        let mut now = have.clone();
        for (addr, id) in &want {
            if have.get(addr) != Some(id) {
                match self.store.put_tunnel_ep(svc, *addr, Some(*id)) {
                    Ok(()) => {
                        now.insert(*addr, *id);
                    }
                    Err(e) => result = result.and(Err(e)),
                }
            }
        }
        for addr in have.keys().filter(|a| !want.contains_key(a)) {
            match self.store.put_tunnel_ep(svc, *addr, None) {
                Ok(()) => {
                    now.remove(addr);
                }
                Err(e) => result = result.and(Err(e)),
            }
        }
        if let Some(v) = self.vips.get_mut(&svc) {
            v.tunnel_eps = now;
        }
        result
    }

    /// Scrub the flow state of removed services in one pass over the LRU
    /// maps, then free their ids (and zero their counters once more, as
    /// in-flight runs may have counted after the removal). Ids are freed even if the scrub fails:
    /// the VIP is gone either way, and holding its id would leak it.
    fn finish_removals(&mut self, svcs: &BTreeSet<u32>) -> Result<(), DataplaneError> {
        if svcs.is_empty() {
            return Ok(());
        }
        let mut r = self.store.scrub_flows(svcs);
        for svc in svcs {
            r = r.and(self.store.zero_stats(*svc));
            self.svc_ids.free(*svc);
        }
        r
    }

    /// Free adopted backends that no VIP lists.
    fn prune_orphan_backends(&mut self) {
        let freed: Vec<u32> = self
            .backends
            .prune_orphans()
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        self.release_backend_entries(freed);
    }
}

fn settings_from_image(n: &NodeImage) -> NodeSettings {
    NodeSettings {
        syn_rate_limit: n.syn_rate_limit,
        tunnel_src4: n.tunnel_src4,
        tunnel_src6: n.tunnel_src6,
        interface_macs: n.interface_macs.clone(),
        generic_xdp: n.generic_xdp.clone(),
        // The maps say which sources are in use, not which the node
        // configured: none until the node's settings are given.
        fullnat: if n.fullnat.port_max == 0 {
            crate::model::FullNatSettings::default()
        } else {
            n.fullnat.settings()
        },
    }
}

/// The VIP filter counts addresses through match keys: a full-NAT
/// source's stands for the replies sent to it.
fn src_match(addr: IpAddr) -> MatchKey {
    MatchKey::Exact {
        addr,
        port: 0,
        proto: 0,
    }
}

/// Consecutive runs of sorted slot numbers.
fn runs(slots: &[u32]) -> Vec<Slice> {
    let mut out: Vec<Slice> = Vec::new();
    for s in slots {
        match out.last_mut() {
            Some(r) if r.end() == *s => r.len += 1,
            _ => out.push(Slice { start: *s, len: 1 }),
        }
    }
    out
}

/// Write the entries of `want` that `have` (the VIP `svc`'s, as the maps
/// hold them) lacks; `have` follows every write that lands.
fn add_ranges<S: MapStore>(
    store: &mut S,
    svc: u32,
    have: &mut BTreeSet<SourceRange>,
    want: &BTreeSet<SourceRange>,
) -> Result<(), DataplaneError> {
    for r in want.difference(&have.clone()) {
        store.put_source_range(svc, r, true)?;
        have.insert(*r);
    }
    Ok(())
}

/// Delete the entries of `have` that `want` lacks.
fn drop_ranges<S: MapStore>(
    store: &mut S,
    svc: u32,
    have: &mut BTreeSet<SourceRange>,
    want: &BTreeSet<SourceRange>,
) -> Result<(), DataplaneError> {
    for r in have.clone().difference(want) {
        store.put_source_range(svc, r, false)?;
        have.remove(r);
    }
    Ok(())
}

const SOURCE_RANGES: u32 = abi::rv_service_flags::RV_SVC_F_SOURCE_RANGES.0;

/// The generation bits of `new` (a service entry as rendered, which
/// carries none): none without source ranges; else `old`'s while its
/// ranges stay `want`, the next one (1-255, never 0: the datapath reads 0
/// as "check every packet") when they start or change, so that every
/// flow is checked again against the new ones.
fn ranges_gen(
    old: Option<&render::ServiceEntry>,
    new: &render::ServiceEntry,
    have: &BTreeSet<SourceRange>,
    want: &BTreeSet<SourceRange>,
) -> u32 {
    if new.flags & SOURCE_RANGES == 0 {
        return 0;
    }
    let old_gen = old
        .filter(|o| o.flags & SOURCE_RANGES != 0)
        .map(|o| o.flags >> abi::RANGES_GEN_SHIFT);
    let gen = match old_gen {
        Some(g) if g != 0 && have == want => g,
        Some(g) => g % 255 + 1,
        None => 1,
    };
    gen << abi::RANGES_GEN_SHIFT
}
