//! Per-peer BGP metrics, encoded from the speaker's status on each scrape
//! (registered into rivorad's one registry before the speaker exists).

use std::sync::{Arc, OnceLock};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use rivora_bgp::{PeerStatus, Speaker, State};

/// Filled once the speaker runs; empty scrapes before (and without BGP)
/// still print every family's HELP and TYPE.
#[derive(Debug, Default, Clone)]
pub struct BgpCollector {
    pub speaker: Arc<OnceLock<Speaker>>,
}

type Field = fn(&PeerStatus) -> u64;

impl Collector for BgpCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let peers: Vec<PeerStatus> = self.speaker.get().map(|s| s.status()).unwrap_or_default();
        let label = |p: &PeerStatus| p.address.to_string();
        let mut st = enc.encode_descriptor(
            "rivora_bgp_session_state",
            "1 for the BGP session's current RFC 4271 state, 0 for the others.",
            None,
            MetricType::Gauge,
        )?;
        for p in &peers {
            let peer = label(p);
            for s in State::ALL {
                ConstGauge::new(i64::from(p.state == s))
                    .encode(st.encode_family(&[("peer", peer.as_str()), ("state", s.as_str())])?)?;
            }
        }
        let counters: [(&str, &str, Field); 3] = [
            (
                "rivora_bgp_updates_sent",
                "UPDATE messages sent to the peer.",
                |p| p.updates_sent,
            ),
            (
                "rivora_bgp_updates_received",
                "UPDATE messages received from the peer.",
                |p| p.updates_received,
            ),
            (
                "rivora_bgp_session_flaps",
                "Times the session left Established.",
                |p| p.flaps,
            ),
        ];
        for (name, help, get) in counters {
            let mut fam = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
            for p in &peers {
                let peer = label(p);
                ConstCounter::new(get(p)).encode(fam.encode_family(&[("peer", peer.as_str())])?)?;
            }
        }
        let gauges: [(&str, &str, Field); 3] = [
            (
                "rivora_bgp_session_uptime_seconds",
                "Seconds the session has been Established (0 when not).",
                |p| p.uptime().as_secs(),
            ),
            (
                "rivora_bgp_routes_advertised",
                "Routes the peer holds from this node.",
                |p| p.advertised.len() as u64,
            ),
            (
                "rivora_bgp_bfd_up",
                "1 while the peer's BFD session is Up (0 when down or not configured).",
                |p| {
                    u64::from(
                        p.bfd
                            .is_some_and(|b| b.state == rivora_bgp::bfd::BfdState::Up),
                    )
                },
            ),
        ];
        for (name, help, get) in gauges {
            let mut fam = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for p in &peers {
                let peer = label(p);
                ConstGauge::new(get(p) as i64)
                    .encode(fam.encode_family(&[("peer", peer.as_str())])?)?;
            }
        }
        Ok(())
    }
}
