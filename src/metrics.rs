//! Prometheus metrics on `prometheus-client`: one [`Registry`] holds the
//! probe latency histograms (fed as probes finish) and a collector that
//! encodes a plain [`MetricsSnapshot`] on each scrape. The daemon assembles
//! the snapshot from the stats maps, the health checker and the reload
//! counters; whatever else later needs metrics (the Kubernetes controller's
//! histograms) registers into the same registry, so one scrape serves all.
//!
//! The exposition is the Prometheus text format 0.0.4 (see
//! [`CONTENT_TYPE`]), not OpenMetrics: scrapers and the tests already read
//! that format, and its counter `# TYPE` lines name the series they type.
//!
//! Every family always prints its HELP and TYPE lines, even with no
//! samples, so dashboards see the metric exist from the first scrape.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{prometheus_text, DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use thiserror::Error;

use crate::api::BackendHealth;
use crate::healthcheck::Verdict;

/// The `Content-Type` of what [`Metrics::encode`] returns.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// Bucket upper bounds for probe latency, seconds: a local TCP connect is
/// well under a millisecond; a probe timeout is typically 1 to 5 s.
pub const PROBE_DURATION_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

#[derive(Debug, Clone, Default, PartialEq)]
pub struct MetricsSnapshot {
    pub version: String,
    pub vips: Vec<VipCounters>,
    pub backends: Vec<BackendHealthSample>,
    /// Keyed by the drop reason's label (`abi::drop_reason_label`).
    pub drops: BTreeMap<String, u64>,
    pub reloads_success: u64,
    pub reloads_failure: u64,
    /// VIP keys claimed by more than one source object (the first keeps
    /// it; the others are not applied).
    pub vip_conflicts: u64,
    /// VIPs wanted but not in the maps as wanted (retried).
    pub vips_not_applied: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VipCounters {
    /// The VIP's name (`tcp/10.0.0.1:80`).
    pub vip: String,
    pub packets: u64,
    pub bytes: u64,
    pub rate_limited_syns: u64,
    pub no_healthy_backend_drops: u64,
    /// Packets from outside its source ranges.
    pub source_refused: u64,
    /// Slots of its Maglev slice.
    pub maglev_slots: u64,
    /// Its slice is smaller than its weights need (the table is full).
    pub maglev_reduced_precision: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendHealthSample {
    /// `addr:port`.
    pub backend: String,
    pub state: BackendHealth,
}

#[derive(Debug, Error)]
pub enum MetricsError {
    #[error("encoding the metrics: {0}")]
    Encode(#[from] std::fmt::Error),
}

type ProbeLabels = [(&'static str, &'static str); 1];
const PROBE_SUCCESS: ProbeLabels = [("result", "success")];
const PROBE_FAILURE: ProbeLabels = [("result", "failure")];
/// Probes this node could not run (out of descriptors, memory, ports):
/// apart from failures, since they say nothing about the backend.
const PROBE_UNKNOWN: ProbeLabels = [("result", "unknown")];

fn probe_histogram() -> Histogram {
    Histogram::new(PROBE_DURATION_BUCKETS.iter().copied())
}

/// The registry and what feeds it. Shared (`Arc`) between the scrape
/// handler and the health checker's observer.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    probes: Family<ProbeLabels, Histogram>,
    /// The snapshot the collector encodes; replaced on every scrape.
    current: Arc<Mutex<MetricsSnapshot>>,
    /// Held across replace-and-encode, so a scrape returns the text of the
    /// snapshot it was given even when two scrapes overlap.
    scrape: Mutex<()>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// A poisoned lock here guards nothing that a panic could leave half
/// written: the snapshot is replaced whole on every scrape.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let probes = Family::<ProbeLabels, Histogram>::new_with_constructor(
            probe_histogram as fn() -> Histogram,
        );
        // Both series exist from the first scrape, all buckets at zero, so a
        // rate over them never starts from a missing series.
        for labels in [&PROBE_SUCCESS, &PROBE_FAILURE, &PROBE_UNKNOWN] {
            drop(probes.get_or_create(labels));
        }
        // The registry appends the full stop.
        registry.register(
            "rivora_health_probe_duration_seconds",
            "Duration of active health probes, by result",
            probes.clone(),
        );
        let current = Arc::new(Mutex::new(MetricsSnapshot::default()));
        registry.register_collector(Box::new(SnapshotCollector {
            current: current.clone(),
        }));
        Self {
            registry,
            probes,
            current,
            scrape: Mutex::new(()),
        }
    }

    /// For metrics owned elsewhere (the controller's), registered before
    /// the `Metrics` is shared.
    pub fn registry_mut(&mut self) -> &mut Registry {
        &mut self.registry
    }

    /// rivorad's probe budget gauges, set by its health checker.
    pub fn register_probe_load(&mut self, load: &crate::healthcheck::ProbeLoad) {
        self.registry.register(
            "rivora_health_probe_demand_per_second",
            "Health probes a second the VIPs' health checks ask for, before the node's budget",
            load.demand.clone(),
        );
        self.registry.register(
            "rivora_health_probe_interval_stretch",
            "Factor every health-check interval is stretched by to stay within -health-probe-budget (1: within it)",
            load.stretch.clone(),
        );
    }

    /// Records one finished health probe.
    pub fn observe_probe(&self, verdict: Verdict, seconds: f64) {
        let labels = match verdict {
            Verdict::Up => &PROBE_SUCCESS,
            Verdict::Down => &PROBE_FAILURE,
            Verdict::Unknown => &PROBE_UNKNOWN,
        };
        self.probes.get_or_create(labels).observe(seconds);
    }

    /// The text exposition of `snap` and of everything in the registry.
    pub fn encode(&self, snap: MetricsSnapshot) -> Result<String, MetricsError> {
        let _scrape = lock(&self.scrape);
        *lock(&self.current) = snap;
        let mut out = String::new();
        prometheus_text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

/// Encodes the current snapshot as constant metrics: the values are
/// cumulative in the kernel's per-CPU maps, so each scrape reports them
/// as they are rather than feeding counters.
#[derive(Debug)]
struct SnapshotCollector {
    current: Arc<Mutex<MetricsSnapshot>>,
}

type VipField = fn(&VipCounters) -> u64;

/// A counter family with one label. `name` lacks the `_total` that the
/// encoder appends.
fn counters<'v>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    label: &str,
    samples: impl IntoIterator<Item = (&'v str, u64)>,
) -> Result<(), std::fmt::Error> {
    let mut family = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (value, n) in samples {
        ConstCounter::new(n).encode(family.encode_family(&[(label, value)])?)?;
    }
    Ok(())
}

impl Collector for SnapshotCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = lock(&self.current);

        let mut build = enc.encode_descriptor(
            "rivora_build_info",
            "Build information; the value is always 1.",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(1i64).encode(build.encode_family(&[("version", s.version.as_str())])?)?;

        // Sorted by name so that two scrapes of the same state are
        // byte-identical.
        let mut vips: Vec<&VipCounters> = s.vips.iter().collect();
        vips.sort_by(|a, b| a.vip.cmp(&b.vip));
        let per_vip: [(&str, &str, VipField); 5] = [
            ("rivora_vip_packets", "Packets that matched the VIP.", |v| {
                v.packets
            }),
            (
                "rivora_vip_bytes",
                "Bytes of packets that matched the VIP.",
                |v| v.bytes,
            ),
            (
                "rivora_vip_rate_limited_syns",
                "TCP SYNs to the VIP dropped by the SYN rate limit.",
                |v| v.rate_limited_syns,
            ),
            (
                "rivora_vip_no_healthy_backend_drops",
                "Packets to the VIP dropped because no backend was healthy.",
                |v| v.no_healthy_backend_drops,
            ),
            (
                "rivora_vip_source_refused_packets",
                "Packets to the VIP dropped because their source is outside its source ranges.",
                |v| v.source_refused,
            ),
        ];
        for (name, help, get) in per_vip {
            let samples = vips.iter().map(|v| (v.vip.as_str(), get(v)));
            counters(&mut enc, name, help, "vip", samples)?;
        }
        let per_vip_gauges: [(&str, &str, VipField); 2] = [
            (
                "rivora_vip_maglev_slots",
                "Slots of the VIP's slice of the shared Maglev table.",
                |v| v.maglev_slots,
            ),
            (
                "rivora_vip_maglev_reduced_precision",
                "1 when the VIP's Maglev slice is smaller than its backends' weights need (a share may be off its weight's by more than 5 %: the table is too full), else 0.",
                |v| u64::from(v.maglev_reduced_precision),
            ),
        ];
        for (name, help, get) in per_vip_gauges {
            let mut family = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for v in &vips {
                ConstGauge::new(i64::try_from(get(v)).unwrap_or(i64::MAX))
                    .encode(family.encode_family(&[("vip", v.vip.as_str())])?)?;
            }
        }

        // One 0/1 series per state (a state set), so `== 1` selects the state
        // without knowing an enum encoding.
        let mut health = enc.encode_descriptor(
            "rivora_backend_health",
            "1 for the backend's current datapath state (healthy, draining, down), 0 for the others.",
            None,
            MetricType::Gauge,
        )?;
        let mut backends: Vec<&BackendHealthSample> = s.backends.iter().collect();
        backends.sort_by(|a, b| a.backend.cmp(&b.backend));
        for b in backends {
            for state in BackendHealth::ALL {
                let labels = [("backend", b.backend.as_str()), ("state", state.as_str())];
                ConstGauge::new(i64::from(b.state == state))
                    .encode(health.encode_family(&labels)?)?;
            }
        }

        counters(
            &mut enc,
            "rivora_drops",
            "Packets dropped by the datapath, by reason.",
            "reason",
            s.drops.iter().map(|(reason, n)| (reason.as_str(), *n)),
        )?;

        for (name, help, v) in [
            (
                "rivora_vip_conflicts",
                "VIP keys claimed by two sources' objects: the first keeps the VIP, the others are not applied.",
                s.vip_conflicts,
            ),
            (
                "rivora_vips_not_applied",
                "VIPs wanted but not in the datapath as wanted (retried; rivoractl status says why).",
                s.vips_not_applied,
            ),
        ] {
            let g = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
            ConstGauge::new(i64::try_from(v).unwrap_or(i64::MAX)).encode(g)?;
        }

        counters(
            &mut enc,
            "rivora_config_reloads",
            "Configuration reloads, by result; a failed reload keeps the running configuration.",
            "result",
            [
                ("success", s.reloads_success),
                ("failure", s.reloads_failure),
            ],
        )
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::metrics::histogram::Histogram;

    use super::*;

    #[derive(Debug)]
    struct Sample {
        name: String,
        labels: Vec<(String, String)>,
        value: f64,
    }

    /// The exposition, read back the way a scraper reads it.
    #[derive(Debug, Default)]
    struct Parsed {
        help: BTreeMap<String, String>,
        types: BTreeMap<String, String>,
        samples: Vec<Sample>,
    }

    impl Parsed {
        fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
            let mut want: Vec<(String, String)> = labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            want.sort();
            let found: Vec<f64> = self
                .samples
                .iter()
                .filter(|s| {
                    let mut have = s.labels.clone();
                    have.sort();
                    s.name == name && have == want
                })
                .map(|s| s.value)
                .collect();
            assert!(found.len() <= 1, "duplicate series {name} {labels:?}");
            found.first().copied()
        }

        fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
            self.get(name, labels)
                .unwrap_or_else(|| panic!("no {name}{labels:?} in {:#?}", self.samples))
        }

        /// The label values of `label` across `name`'s series, in output
        /// order.
        fn label_values(&self, name: &str, label: &str) -> Vec<String> {
            self.samples
                .iter()
                .filter(|s| s.name == name)
                .filter_map(|s| s.labels.iter().find(|(k, _)| k == label))
                .map(|(_, v)| v.clone())
                .collect()
        }

        fn count(&self, name: &str) -> usize {
            self.samples.iter().filter(|s| s.name == name).count()
        }
    }

    fn unescape(s: &str, quote: bool) -> String {
        let mut out = String::new();
        let mut chars = s.chars();
        while let Some(c) = chars.next() {
            if c != '\\' {
                out.push(c);
                continue;
            }
            match chars.next() {
                Some('\\') => out.push('\\'),
                Some('n') => out.push('\n'),
                Some('"') if quote => out.push('"'),
                other => panic!("bad escape \\{other:?} in {s:?}"),
            }
        }
        out
    }

    /// Text format 0.0.4: HELP and TYPE comments, then samples without
    /// timestamps. Any other comment (`# EOF`, `# UNIT`) is OpenMetrics and
    /// fails the parse; so does a sample whose family was not declared.
    fn parse(text: &str) -> Parsed {
        assert!(text.ends_with('\n'), "{text:?}");
        let mut p = Parsed::default();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, help) = rest.split_once(' ').expect("HELP name text");
                let dup = p.help.insert(name.into(), unescape(help, false));
                assert!(dup.is_none(), "second HELP for {name}");
                continue;
            }
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').expect("TYPE name kind");
                assert!(p.help.contains_key(name), "TYPE before HELP: {line}");
                let dup = p.types.insert(name.into(), kind.into());
                assert!(dup.is_none(), "second TYPE for {name}");
                continue;
            }
            assert!(!line.starts_with('#'), "unexpected comment: {line}");

            let end = line.find(['{', ' ']).expect("a sample has a value");
            let name = &line[..end];
            let mut rest = &line[end..];
            let mut labels = Vec::new();
            if let Some(mut l) = rest.strip_prefix('{') {
                while !l.starts_with('}') {
                    let (key, after) = l.split_once("=\"").expect("label=\"value\"");
                    // The value ends at the first quote not escaped.
                    let mut close = None;
                    let mut escaped = false;
                    for (i, c) in after.char_indices() {
                        match c {
                            _ if escaped => escaped = false,
                            '\\' => escaped = true,
                            '"' => {
                                close = Some(i);
                                break;
                            }
                            _ => {}
                        }
                    }
                    let close = close.expect("closing quote");
                    labels.push((key.to_string(), unescape(&after[..close], true)));
                    l = &after[close + 1..];
                    l = l.strip_prefix(',').unwrap_or(l);
                }
                rest = &l[1..];
            }
            let value = rest.strip_prefix(' ').expect("space before the value");
            let value: f64 = value.parse().unwrap_or_else(|_| panic!("value: {line}"));
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .filter_map(|suffix| name.strip_suffix(suffix))
                .find(|f| p.types.get(*f).map(String::as_str) == Some("histogram"))
                .unwrap_or(name);
            assert!(p.types.contains_key(family), "undeclared: {line}");
            p.samples.push(Sample {
                name: name.into(),
                labels,
                value,
            });
        }
        p
    }

    const FAMILIES: [(&str, &str); 14] = [
        ("rivora_build_info", "gauge"),
        ("rivora_vip_maglev_slots", "gauge"),
        ("rivora_vip_maglev_reduced_precision", "gauge"),
        ("rivora_vip_packets_total", "counter"),
        ("rivora_vip_bytes_total", "counter"),
        ("rivora_vip_rate_limited_syns_total", "counter"),
        ("rivora_vip_no_healthy_backend_drops_total", "counter"),
        ("rivora_vip_source_refused_packets_total", "counter"),
        ("rivora_backend_health", "gauge"),
        ("rivora_drops_total", "counter"),
        ("rivora_config_reloads_total", "counter"),
        ("rivora_health_probe_duration_seconds", "histogram"),
        ("rivora_vip_conflicts", "gauge"),
        ("rivora_vips_not_applied", "gauge"),
    ];

    fn assert_families(p: &Parsed) {
        let want: BTreeMap<String, String> = FAMILIES
            .iter()
            .map(|(n, t)| (n.to_string(), t.to_string()))
            .collect();
        assert_eq!(p.types, want);
    }

    fn snapshot() -> MetricsSnapshot {
        let mut drops = BTreeMap::new();
        drops.insert("no_healthy_backend".to_string(), 7);
        drops.insert("rate_limited".to_string(), 3);
        MetricsSnapshot {
            version: "0.1.0".into(),
            vips: vec![
                VipCounters {
                    vip: "udp/[2001:db8::1]:53".into(),
                    packets: 5,
                    bytes: 500,
                    rate_limited_syns: 0,
                    no_healthy_backend_drops: 0,
                    source_refused: 0,
                    maglev_slots: 96,
                    maglev_reduced_precision: true,
                },
                VipCounters {
                    vip: "tcp/10.0.0.1:80".into(),
                    packets: 1000,
                    bytes: 64000,
                    rate_limited_syns: 3,
                    no_healthy_backend_drops: 7,
                    source_refused: 9,
                    maglev_slots: 768,
                    maglev_reduced_precision: false,
                },
            ],
            backends: vec![BackendHealthSample {
                backend: "10.0.1.1:8080".into(),
                state: BackendHealth::Draining,
            }],
            drops,
            reloads_success: 2,
            reloads_failure: 1,
            vip_conflicts: 1,
            vips_not_applied: 4,
        }
    }

    #[test]
    fn snapshot_exposition() {
        let m = Metrics::new();
        for v in [0.005, 0.01, 0.05] {
            m.observe_probe(Verdict::Up, v);
        }
        m.observe_probe(Verdict::Down, 2.0);
        m.observe_probe(Verdict::Unknown, 0.0001);
        let text = m.encode(snapshot()).unwrap();
        let p = parse(&text);
        assert_families(&p);
        assert_eq!(
            p.help["rivora_vip_packets_total"],
            "Packets that matched the VIP."
        );
        assert_eq!(
            p.help["rivora_backend_health"],
            "1 for the backend's current datapath state (healthy, draining, down), 0 for the others."
        );
        assert_eq!(
            p.help["rivora_health_probe_duration_seconds"],
            "Duration of active health probes, by result."
        );

        assert_eq!(p.value("rivora_build_info", &[("version", "0.1.0")]), 1.0);
        let tcp = [("vip", "tcp/10.0.0.1:80")];
        let udp = [("vip", "udp/[2001:db8::1]:53")];
        for (name, at_tcp, at_udp) in [
            ("rivora_vip_packets_total", 1000.0, 5.0),
            ("rivora_vip_bytes_total", 64000.0, 500.0),
            ("rivora_vip_rate_limited_syns_total", 3.0, 0.0),
            ("rivora_vip_no_healthy_backend_drops_total", 7.0, 0.0),
            ("rivora_vip_source_refused_packets_total", 9.0, 0.0),
        ] {
            assert_eq!(p.value(name, &tcp), at_tcp, "{name}");
            assert_eq!(p.value(name, &udp), at_udp, "{name}");
            assert_eq!(
                p.label_values(name, "vip"),
                ["tcp/10.0.0.1:80", "udp/[2001:db8::1]:53"],
                "sorted by VIP"
            );
        }
        for (name, at_tcp, at_udp) in [
            ("rivora_vip_maglev_slots", 768.0, 96.0),
            ("rivora_vip_maglev_reduced_precision", 0.0, 1.0),
        ] {
            assert_eq!(p.value(name, &tcp), at_tcp, "{name}");
            assert_eq!(p.value(name, &udp), at_udp, "{name}");
        }
        for (state, v) in [("healthy", 0.0), ("draining", 1.0), ("down", 0.0)] {
            let labels = [("backend", "10.0.1.1:8080"), ("state", state)];
            assert_eq!(p.value("rivora_backend_health", &labels), v, "{state}");
        }
        let drops = |reason| p.value("rivora_drops_total", &[("reason", reason)]);
        assert_eq!(drops("no_healthy_backend"), 7.0);
        assert_eq!(drops("rate_limited"), 3.0);
        let reloads = |result| p.value("rivora_config_reloads_total", &[("result", result)]);
        assert_eq!(reloads("success"), 2.0);
        assert_eq!(reloads("failure"), 1.0);
        assert_eq!(p.value("rivora_vip_conflicts", &[]), 1.0);
        assert_eq!(p.value("rivora_vips_not_applied", &[]), 4.0);

        let h = "rivora_health_probe_duration_seconds";
        let bucket =
            |result, le| p.value(&format!("{h}_bucket"), &[("result", result), ("le", le)]);
        assert_eq!(bucket("success", "0.0025"), 0.0);
        assert_eq!(bucket("success", "0.005"), 1.0);
        assert_eq!(bucket("success", "0.01"), 2.0);
        assert_eq!(bucket("success", "0.025"), 2.0);
        assert_eq!(bucket("success", "0.05"), 3.0);
        assert_eq!(bucket("success", "+Inf"), 3.0);
        assert_eq!(bucket("failure", "1"), 0.0);
        assert_eq!(bucket("failure", "2.5"), 1.0);
        assert_eq!(bucket("failure", "+Inf"), 1.0);
        let sum = |result| p.value(&format!("{h}_sum"), &[("result", result)]);
        assert!((sum("success") - 0.065).abs() < 1e-12);
        assert_eq!(sum("failure"), 2.0);
        assert_eq!(
            p.value(&format!("{h}_count"), &[("result", "success")]),
            3.0
        );
        assert_eq!(
            p.value(&format!("{h}_count"), &[("result", "failure")]),
            1.0
        );
        assert_eq!(bucket("unknown", "0.0005"), 1.0);
        assert_eq!(
            p.value(&format!("{h}_count"), &[("result", "unknown")]),
            1.0
        );

        // Nothing beyond the above: 1 + (5 counters + 2 gauges) × 2 VIPs +
        // 3 states + 2 + 2 + the two gauges, and per result the 14 bounds,
        // +Inf, _sum and _count.
        assert_eq!(p.samples.len(), 1 + 14 + 3 + 2 + 2 + 2 + 3 * 17);
        assert_eq!(
            m.encode(snapshot()).unwrap(),
            text,
            "the same state encodes byte-identically"
        );
    }

    #[test]
    fn empty_snapshot_still_declares_every_family() {
        let p = parse(&Metrics::new().encode(MetricsSnapshot::default()).unwrap());
        assert_families(&p);
        assert_eq!(p.count("rivora_vip_packets_total"), 0);
        assert_eq!(p.count("rivora_drops_total"), 0);
        // Every probe result from the first scrape, every bucket present.
        let h = "rivora_health_probe_duration_seconds_bucket";
        for result in ["success", "failure", "unknown"] {
            let les: Vec<String> = p
                .samples
                .iter()
                .filter(|s| s.name == h && s.labels.contains(&("result".into(), result.into())))
                .map(|s| {
                    assert_eq!(s.value, 0.0);
                    s.labels.iter().find(|(k, _)| k == "le").unwrap().1.clone()
                })
                .collect();
            let want: Vec<String> = PROBE_DURATION_BUCKETS
                .iter()
                .map(|b| b.to_string())
                .chain(["+Inf".to_string()])
                .collect();
            assert_eq!(les, want, "{result}");
        }
        let reloads = |result| p.value("rivora_config_reloads_total", &[("result", result)]);
        assert_eq!((reloads("success"), reloads("failure")), (0.0, 0.0));
    }

    #[test]
    fn each_scrape_encodes_its_own_snapshot() {
        let m = Metrics::new();
        let p = parse(&m.encode(snapshot()).unwrap());
        assert_eq!(p.count("rivora_vip_packets_total"), 2);
        let mut later = snapshot();
        later.vips.retain(|v| v.vip.starts_with("udp/"));
        later.vips[0].packets = 9;
        let p = parse(&m.encode(later).unwrap());
        assert_eq!(
            p.label_values("rivora_vip_packets_total", "vip"),
            ["udp/[2001:db8::1]:53"],
            "a removed VIP's series goes"
        );
        assert_eq!(
            p.value(
                "rivora_vip_packets_total",
                &[("vip", "udp/[2001:db8::1]:53")]
            ),
            9.0
        );
    }

    #[test]
    fn label_values_are_escaped() {
        let version = "1.0\"-dirty\\\n";
        let snap = MetricsSnapshot {
            version: version.into(),
            ..Default::default()
        };
        let text = Metrics::new().encode(snap).unwrap();
        assert!(
            text.contains("rivora_build_info{version=\"1.0\\\"-dirty\\\\\\n\"} 1\n"),
            "{text}"
        );
        // The raw newline must not split the sample across lines.
        assert!(text
            .lines()
            .all(|l| l.starts_with('#') || l.starts_with("rivora_")));
        let p = parse(&text);
        assert_eq!(p.label_values("rivora_build_info", "version"), [version]);
    }

    #[test]
    fn buckets_are_cumulative_and_le_inclusive() {
        let m = Metrics::new();
        for v in [0.01, 0.0100001, 0.1, 0.5, 1.0, 1.5, 100.0, 0.0] {
            m.observe_probe(Verdict::Up, v);
        }
        let p = parse(&m.encode(MetricsSnapshot::default()).unwrap());
        let h = "rivora_health_probe_duration_seconds";
        let bucket = |le| p.value(&format!("{h}_bucket"), &[("result", "success"), ("le", le)]);
        // 0 and 0.01 fall in le=0.01; 1.0 in le=1.
        assert_eq!(bucket("0.005"), 1.0);
        assert_eq!(bucket("0.01"), 2.0);
        assert_eq!(bucket("0.025"), 3.0);
        assert_eq!(bucket("0.1"), 4.0);
        assert_eq!(bucket("1"), 6.0);
        assert_eq!(bucket("2.5"), 7.0);
        assert_eq!(bucket("10"), 7.0);
        assert_eq!(bucket("+Inf"), 8.0);
        let counts: Vec<f64> = p
            .samples
            .iter()
            .filter(|s| s.name == format!("{h}_bucket"))
            .filter(|s| s.labels.contains(&("result".into(), "success".into())))
            .map(|s| s.value)
            .collect();
        assert!(counts.windows(2).all(|w| w[0] <= w[1]), "{counts:?}");
        assert_eq!(
            p.value(&format!("{h}_count"), &[("result", "success")]),
            8.0
        );
        assert!(
            (p.value(&format!("{h}_sum"), &[("result", "success")]) - 103.1200001).abs() < 1e-9
        );
        assert_eq!(
            p.value(&format!("{h}_count"), &[("result", "failure")]),
            0.0,
            "a success is not counted as a failure"
        );
    }

    #[test]
    fn other_metrics_share_the_registry() {
        let mut m = Metrics::new();
        let programming = Histogram::new([0.1, 1.0]);
        m.registry_mut().register(
            "rivora_network_programming_seconds",
            "From an object change to the datapath programmed",
            programming.clone(),
        );
        programming.observe(0.5);
        let p = parse(&m.encode(snapshot()).unwrap());
        assert_eq!(p.types["rivora_network_programming_seconds"], "histogram");
        assert_eq!(
            p.value("rivora_network_programming_seconds_bucket", &[("le", "1")]),
            1.0
        );
        assert_eq!(
            p.value("rivora_vip_packets_total", &[("vip", "tcp/10.0.0.1:80")]),
            1000.0
        );
    }

    #[test]
    fn the_server_sends_this_format() {
        assert_eq!(crate::api::METRICS_CONTENT_TYPE, CONTENT_TYPE);
    }
}
