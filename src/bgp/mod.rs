//! The BGP glue: which routes this node announces, from the dataplane's
//! published status, and the speaker (`rivora-bgp`) configured from the
//! file's `bgp` section.
//!
//! A VIP address is announced (a /32 or /128) while at least one VIP at
//! that address is serving: it has a healthy backend with weight above 0
//! in this node's view ([`VipStatus::serving`]; with
//! externalTrafficPolicy Local the translation keeps only this node's
//! endpoints, so "this node's view" is the policy). It is withdrawn when
//! none is. The status is read through a [`StatusReader`], never the
//! reconciler's lock, and every new snapshot is turned into routes at
//! once: announce and withdraw follow the map writes within milliseconds.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rivora_bgp::{Family, PeerConfig, Route, RouteAttrs, Speaker, SpeakerConfig};
use rivora_model::config::bgp::{BgpSettings, PeerSettings, RoutePolicy};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::reconciler::status::{DataplaneStatus, StatusReader};

pub mod kubernetes;
pub mod metrics;

#[derive(Debug, thiserror::Error)]
pub enum BgpError {
    #[error(transparent)]
    Speaker(#[from] rivora_bgp::SpeakerError),
    #[error("no BGP router ID: set bgp.routerId (no IPv4 address toward any peer)")]
    NoRouterId,
}

fn attrs(p: &RoutePolicy) -> RouteAttrs {
    RouteAttrs {
        communities: p.communities.clone(),
        large_communities: p.large_communities.clone(),
        local_pref: p.local_pref,
        med: p.med,
    }
}

/// The speaker's view of one configured peer.
pub fn peer_config(p: &PeerSettings) -> PeerConfig {
    let mut families = Vec::new();
    if p.ipv4 {
        families.push(Family::Ipv4Unicast);
    }
    if p.ipv6 {
        families.push(Family::Ipv6Unicast);
    }
    PeerConfig {
        name: p.name.clone(),
        address: p.address,
        asn: p.asn,
        port: p.port,
        local_address: p.local_address,
        passive: p.passive,
        hold_time: p.hold_time,
        connect_retry: p.connect_retry,
        delay_open: None,
        password: p.password.clone(),
        families,
        next_hop4: p.next_hop_ipv4,
        next_hop6: p.next_hop_ipv6,
        bfd: p.bfd.map(|b| rivora_bgp::bfd::Timers {
            min_tx: b.min_tx,
            min_rx: b.min_rx,
            multiplier: b.multiplier,
        }),
        graceful_restart: p.graceful_restart,
        attrs: attrs(&p.policy),
    }
}

/// The routes a status calls for: one host route per VIP address with a
/// serving VIP, carrying the advertisements that match it.
pub fn routes_of(st: &DataplaneStatus, settings: &BgpSettings) -> Vec<Route> {
    let mut serving: BTreeMap<IpAddr, bool> = BTreeMap::new();
    for v in &st.vips {
        *serving.entry(v.key.addr).or_default() |= v.serving();
    }
    serving
        .into_iter()
        .filter(|(_, s)| *s)
        .map(|(a, _)| Route::host(a, attrs(&settings.policy_for(a))))
        .collect()
}

/// The router ID: configured, else this host's IPv4 address toward the
/// first IPv4 peer (or toward any address, for IPv6-only peers).
pub fn router_id(s: &BgpSettings) -> Option<Ipv4Addr> {
    if let Some(r) = s.router_id {
        return Some(r);
    }
    let toward = s
        .peers
        .iter()
        .map(|p| p.address)
        .find(IpAddr::is_ipv4)
        .unwrap_or(IpAddr::V4(Ipv4Addr::new(198, 51, 100, 1)));
    match rivora_bgp::speaker::local_toward(toward) {
        Some(IpAddr::V4(a)) if !a.is_unspecified() => Some(a),
        _ => None,
    }
}

/// The speaker and where its peers come from: the file's `bgp` section
/// (replaced on reload) and, with `-kubernetes`, the BGPPeer objects that
/// select this node ([`kubernetes`]). Cheap to clone.
#[derive(Clone)]
pub struct Bgp {
    pub speaker: Speaker,
    /// What the speaker started with: what a reload cannot change.
    started: Arc<BgpSettings>,
    peers: Arc<Mutex<PeerSources>>,
    /// The advertisements in force (the route policy), for the task that
    /// turns the status into routes.
    settings: Arc<watch::Sender<Arc<BgpSettings>>>,
}

#[derive(Default)]
struct PeerSources {
    file: Vec<PeerSettings>,
    kubernetes: Vec<PeerSettings>,
}

impl std::fmt::Debug for Bgp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bgp")
            .field("asn", &self.started.asn)
            .finish()
    }
}

/// Start the speaker and the task that keeps its routes to the status.
/// `persist`: the datapath outlives rivorad, so the forwarding-state bit
/// is set; `restarted`: this start found the maps pinned.
pub fn start(
    settings: BgpSettings,
    status: StatusReader,
    persist: bool,
    restarted: bool,
) -> Result<Bgp, BgpError> {
    let router_id = router_id(&settings).ok_or(BgpError::NoRouterId)?;
    let speaker = Speaker::start(&SpeakerConfig {
        asn: settings.asn,
        router_id,
        listen_port: settings.listen_port,
        restart_time: settings.restart_time,
        forwarding_preserved: persist,
        restarting: restarted && persist,
    })?;
    // Routes first, so a session that comes up sends the full table.
    speaker.set_routes(routes_of(&status.current(), &settings));
    let settings = Arc::new(settings);
    let (tx, rx) = watch::channel(settings.clone());
    let bgp = Bgp {
        speaker: speaker.clone(),
        started: settings.clone(),
        peers: Arc::new(Mutex::new(PeerSources {
            file: settings.peers.clone(),
            kubernetes: Vec::new(),
        })),
        settings: Arc::new(tx),
    };
    bgp.push_peers()?;
    tokio::spawn(follow(speaker, status, rx));
    Ok(bgp)
}

impl Bgp {
    /// Give the speaker every peer: the file's, then Kubernetes' (a
    /// BGPPeer at an address the file already has is left out: the file
    /// is the node's own word).
    fn push_peers(&self) -> Result<(), BgpError> {
        let peers: Vec<PeerConfig> = {
            let src = self.peers.lock().unwrap_or_else(|e| e.into_inner());
            let mut seen = std::collections::BTreeSet::new();
            src.file
                .iter()
                .chain(src.kubernetes.iter())
                .filter(|p| {
                    let new = seen.insert(p.address);
                    if !new {
                        warn!(peer = %p.address, name = %p.name, "a BGPPeer at an address the file already peers with: the file's session is kept");
                    }
                    new
                })
                .map(peer_config)
                .collect()
        };
        self.speaker.set_peers(peers)?;
        Ok(())
    }

    /// The peers the BGPPeer objects give this node.
    pub fn set_kubernetes_peers(&self, peers: Vec<PeerSettings>) -> Result<(), BgpError> {
        self.peers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .kubernetes = peers;
        self.push_peers()
    }

    /// A reload's `bgp` section: peers added, removed or reset (a changed
    /// peer's session restarts with Cease / other configuration change),
    /// advertisements applied to the routes at once. What identifies the
    /// speaker (AS, router ID, listen port, restart time) takes effect at
    /// the next restart: one warning each. No section any more: every
    /// session from the file ends (Cease / peer de-configured).
    pub fn reload(&self, new: Option<&BgpSettings>) -> Vec<String> {
        let mut warnings = new
            .map(|n| restart_only(&self.started, n))
            .unwrap_or_default();
        let settings = match new {
            Some(n) => n.clone(),
            None => BgpSettings {
                peers: Vec::new(),
                advertisements: Vec::new(),
                ..(*self.started).clone()
            },
        };
        self.peers.lock().unwrap_or_else(|e| e.into_inner()).file = settings.peers.clone();
        if let Err(e) = self.push_peers() {
            warnings.push(format!("bgp.peers not applied: {e}"));
        }
        self.settings.send_replace(Arc::new(settings));
        warnings
    }
}

/// What differs between the section the speaker started with and a
/// reloaded one that only a restart applies: one sentence each.
pub fn restart_only(was: &BgpSettings, now: &BgpSettings) -> Vec<String> {
    let mut warnings = Vec::new();
    let mut note = |what: &str, a: String, b: String| {
        if a != b {
            warnings.push(format!(
                "{what} changed from {a} to {b}: it takes effect at the next restart"
            ));
        }
    };
    note("bgp.asn", was.asn.to_string(), now.asn.to_string());
    let rid = |r: Option<Ipv4Addr>| {
        r.map_or_else(|| "none (from the peers)".to_string(), |a| a.to_string())
    };
    note("bgp.routerId", rid(was.router_id), rid(now.router_id));
    note(
        "bgp.listenPort",
        was.listen_port.to_string(),
        now.listen_port.to_string(),
    );
    note(
        "bgp.restartTime",
        format!("{}s", was.restart_time),
        format!("{}s", now.restart_time),
    );
    warnings
}

async fn follow(
    speaker: Speaker,
    mut status: StatusReader,
    mut settings: watch::Receiver<Arc<BgpSettings>>,
) {
    loop {
        tokio::select! {
            alive = status.changed() => if !alive { return },
            r = settings.changed() => if r.is_err() { return },
        }
        let s = settings.borrow_and_update().clone();
        let routes = routes_of(&status.current(), &s);
        let n = routes.len();
        let before = speaker.routes().len();
        speaker.set_routes(routes);
        if n != before {
            info!(routes = n, was = before, "BGP routes");
        }
    }
}

/// Stop the speaker: with a pinned datapath, close the sessions for the
/// peers' graceful restart to keep our routes; otherwise withdraw them
/// and say goodbye.
pub async fn stop(bgp: &Bgp, persist: bool) {
    bgp.speaker.shutdown(persist, Duration::from_secs(3)).await;
}

#[cfg(test)]
mod tests;
