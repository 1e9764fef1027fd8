//! Adoption: reading the pinned maps back on start, so that every VIP
//! keeps its service id, slice and backend ids, and the allocators resume
//! without handing out anything still in use.
//!
//! What the maps cannot say (weights, weight-0 backends, the VIP's spec)
//! is not guessed: an adopted VIP carries what the maps hold, and the
//! first upsert or reconcile that names it compares its rendering against
//! that, writing only if they differ. Backends no slice references are
//! kept as orphans (flows pinned to them by affinity continue) until the
//! caller prunes.

use std::collections::{BTreeMap, BTreeSet};

use crate::abi;
use crate::dataplane::alloc::Slice;
use crate::dataplane::render::{BackendEntry, Health, MapImage, MatchKey, NodeImage, VipImage};
use crate::model::{BackendKey, Mac, Ports, Protocol, VipKey};

/// One VIP as the maps hold it.
#[derive(Debug, Clone)]
pub struct AdoptedVip {
    pub svc_id: u32,
    /// None when the match entries are gone or do not form one VIP (a
    /// crash between writes): such a leftover can never be claimed.
    pub key: Option<VipKey>,
    pub image: VipImage,
    /// Distinct backend ids its slice references.
    pub backend_ids: Vec<u32>,
    /// False when the slice overlaps another's or leaves the table: it is
    /// then not reserved, and is rebuilt or dropped rather than freed.
    pub slice_owned: bool,
}

/// Everything read back, and the repairs to make.
#[derive(Debug, Clone, Default)]
pub struct Adopted {
    pub vips: Vec<AdoptedVip>,
    pub backends: Vec<(u32, BackendKey, Health)>,
    pub node: NodeImage,
    /// Match entries naming no active service.
    pub stray_matches: Vec<MatchKey>,
    /// Service entries that are not active but not cleared either.
    pub stray_services: Vec<u32>,
    pub stray_rate_limits: Vec<u32>,
    /// Non-empty slots outside every adopted slice.
    pub stray_slots: Vec<u32>,
    /// Backend ids with no backend entry whose health is not "down".
    pub stray_health: Vec<u32>,
}

/// The VIP a service's match entries describe, if they describe one.
pub fn key_from_matches(ms: &[MatchKey]) -> Option<VipKey> {
    let first = ms.first()?;
    let addr = first.addr();
    match first {
        MatchKey::Exact { port, proto, .. } if ms.len() == 1 => Some(VipKey {
            addr,
            ports: Ports::One(*port),
            proto: Protocol::from_number(*proto)?,
        }),
        MatchKey::Exact { .. } => None,
        MatchKey::Range { proto, .. } => {
            let proto = *proto;
            let mut blocks: Vec<(u32, u32)> = Vec::with_capacity(ms.len());
            for m in ms {
                match *m {
                    MatchKey::Range {
                        addr: a,
                        proto: p,
                        port,
                        port_bits,
                    } if a == addr && p == proto && port_bits <= 16 => {
                        let lo = u32::from(port);
                        blocks.push((lo, lo + (1u32 << (16 - port_bits)) - 1));
                    }
                    _ => return None,
                }
            }
            blocks.sort_unstable();
            let (first, mut last) = blocks[0];
            for (lo, hi) in &blocks[1..] {
                if *lo != last + 1 {
                    return None;
                }
                last = *hi;
            }
            Some(VipKey {
                addr,
                ports: Ports::Range {
                    first: u16::try_from(first).ok()?,
                    last: u16::try_from(last).ok()?,
                },
                proto: Protocol::from_number(proto)?,
            })
        }
    }
}

fn backend_key(b: &BackendEntry) -> BackendKey {
    BackendKey {
        addr: b.addr,
        port: b.port,
        mac: (b.mac != [0; 6]).then_some(Mac(b.mac)),
        mode: b.mode,
    }
}

/// Decide what the image means. `table_size` bounds the slices.
pub fn adopt(img: &MapImage, table_size: u32) -> Adopted {
    let mut out = Adopted {
        node: img.node.clone(),
        ..Default::default()
    };
    for (id, b) in &img.backends {
        let h = img.health.get(id).copied().unwrap_or(Health::Down);
        out.backends.push((*id, backend_key(b), h));
    }
    for (id, h) in &img.health {
        if !img.backends.contains_key(id) && *h != Health::Down {
            out.stray_health.push(*id);
        }
    }
    let known: BTreeSet<u32> = img.backends.keys().copied().collect();

    let mut matches: BTreeMap<u32, Vec<MatchKey>> = BTreeMap::new();
    for (m, svc) in &img.matches {
        matches.entry(*svc).or_default().push(*m);
    }

    let mut taken: Vec<Slice> = Vec::new();
    let mut owned_slots = BTreeSet::new();
    for (svc_id, s) in &img.services {
        if !s.is_active() || *svc_id == 0 || *svc_id > abi::MAX_VIPS {
            out.stray_services.push(*svc_id);
            continue;
        }
        let slice = Slice {
            start: s.slice_start,
            len: s.slice_len,
        };
        let in_table =
            slice.len > 0 && u64::from(slice.start) + u64::from(slice.len) <= u64::from(table_size);
        let overlaps = taken
            .iter()
            .any(|t| t.start < slice.end() && slice.start < t.end());
        let slice_owned = in_table && !overlaps;
        let slots = if in_table {
            img.slice_of(s)
        } else {
            Vec::new()
        };
        if slice_owned {
            taken.push(slice);
            owned_slots.extend(slice.start..slice.end());
        }
        let ms = matches.remove(svc_id).unwrap_or_default();
        let key = key_from_matches(&ms);
        let backend_ids: Vec<u32> = slots
            .iter()
            .copied()
            .filter(|id| known.contains(id))
            .collect::<BTreeSet<u32>>()
            .into_iter()
            .collect();
        out.vips.push(AdoptedVip {
            svc_id: *svc_id,
            key,
            image: VipImage {
                matches: ms,
                service: *s,
                slots,
                rate_limit: img.svc_rate_limits.get(svc_id).copied(),
            },
            backend_ids,
            slice_owned,
        });
    }
    out.stray_matches = matches.into_values().flatten().collect();
    let active: BTreeSet<u32> = out.vips.iter().map(|v| v.svc_id).collect();
    out.stray_rate_limits = img
        .svc_rate_limits
        .keys()
        .filter(|id| !active.contains(id))
        .copied()
        .collect();
    out.stray_slots = img
        .slots
        .keys()
        .filter(|s| !owned_slots.contains(s))
        .copied()
        .collect();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataplane::render::match_keys;

    #[test]
    fn keys_round_trip_through_matches() {
        for k in [
            VipKey {
                addr: "10.0.0.1".parse().unwrap(),
                ports: Ports::One(80),
                proto: Protocol::Tcp,
            },
            VipKey {
                addr: "fd00::1".parse().unwrap(),
                ports: Ports::Range {
                    first: 1000,
                    last: 1999,
                },
                proto: Protocol::Udp,
            },
            VipKey {
                addr: "10.0.0.1".parse().unwrap(),
                ports: Ports::Range {
                    first: 1,
                    last: 65535,
                },
                proto: Protocol::Tcp,
            },
        ] {
            assert_eq!(key_from_matches(&match_keys(&k)), Some(k));
        }
        assert_eq!(key_from_matches(&[]), None);
    }
}
