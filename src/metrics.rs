//! Prometheus text exposition (format 0.0.4), rendered by hand from a plain
//! [`MetricsSnapshot`]: the daemon assembles the snapshot from the stats
//! maps, the health checker and the reload counters, and this module only
//! formats it, so the exact output is golden-tested without root.
//!
//! Every family always prints its HELP and TYPE lines, even with no
//! samples, so dashboards see the metric exist from the first scrape.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use thiserror::Error;

use crate::api::BackendHealth;

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
    pub probe_success: Histogram,
    pub probe_failure: Histogram,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VipCounters {
    /// The VIP's name (`tcp/10.0.0.1:80`).
    pub vip: String,
    pub packets: u64,
    pub bytes: u64,
    pub rate_limited_syns: u64,
    pub no_healthy_backend_drops: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendHealthSample {
    /// `addr:port`.
    pub backend: String,
    pub state: BackendHealth,
}

#[derive(Debug, Clone, PartialEq, Error)]
pub enum HistogramError {
    #[error("histogram bounds must be finite and strictly increasing")]
    BadBounds,
}

/// A cumulative-on-render histogram. Counts are kept per bucket (not
/// cumulative) so `observe` touches one slot; the last slot is `+Inf`.
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    bounds: Vec<f64>,
    counts: Vec<u64>,
    sum: f64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self::probe_duration()
    }
}

impl Histogram {
    pub fn new(bounds: &[f64]) -> Result<Self, HistogramError> {
        let finite = bounds.iter().all(|b| b.is_finite());
        let increasing = bounds.windows(2).all(|w| w[0] < w[1]);
        if !finite || !increasing {
            return Err(HistogramError::BadBounds);
        }
        Ok(Self {
            bounds: bounds.to_vec(),
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
        })
    }

    /// With [`PROBE_DURATION_BUCKETS`].
    pub fn probe_duration() -> Self {
        Self {
            bounds: PROBE_DURATION_BUCKETS.to_vec(),
            counts: vec![0; PROBE_DURATION_BUCKETS.len() + 1],
            sum: 0.0,
        }
    }

    pub fn observe(&mut self, value: f64) {
        // `le` is inclusive: a value equal to a bound counts in that bucket.
        let i = self.bounds.partition_point(|b| *b < value);
        self.counts[i] += 1;
        self.sum += value;
    }

    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    pub fn sum(&self) -> f64 {
        self.sum
    }

    /// `(upper bound, cumulative count)`, ending with `(+Inf, count)`.
    pub fn cumulative(&self) -> Vec<(f64, u64)> {
        let mut acc = 0;
        self.bounds
            .iter()
            .copied()
            .chain(std::iter::once(f64::INFINITY))
            .zip(&self.counts)
            .map(|(b, c)| {
                acc += c;
                (b, acc)
            })
            .collect()
    }
}

/// Escapes a label value: backslash, double quote and line feed.
pub fn escape_label_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// A float as the exposition format spells it.
fn fmt_float(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v == f64::INFINITY {
        "+Inf".into()
    } else if v == f64::NEG_INFINITY {
        "-Inf".into()
    } else {
        // Rust's shortest round-trip form: 0.005, 1, 2.5.
        format!("{v}")
    }
}

struct Writer {
    out: String,
}

impl Writer {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        // HELP text escapes only backslash and line feed.
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: &str) {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{k}=\"{}\"", escape_label_value(v));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {value}");
    }
}

type VipField = fn(&VipCounters) -> u64;

/// Renders the snapshot. VIPs and backends are sorted by name so that two
/// scrapes of the same state are byte-identical.
pub fn render(s: &MetricsSnapshot) -> String {
    let mut w = Writer { out: String::new() };

    w.family(
        "rivora_build_info",
        "gauge",
        "Build information; the value is always 1.",
    );
    w.sample("rivora_build_info", &[("version", &s.version)], "1");

    let mut vips: Vec<&VipCounters> = s.vips.iter().collect();
    vips.sort_by(|a, b| a.vip.cmp(&b.vip));
    let per_vip: [(&str, &str, VipField); 4] = [
        (
            "rivora_vip_packets_total",
            "Packets that matched the VIP.",
            |v| v.packets,
        ),
        (
            "rivora_vip_bytes_total",
            "Bytes of packets that matched the VIP.",
            |v| v.bytes,
        ),
        (
            "rivora_vip_rate_limited_syns_total",
            "TCP SYNs to the VIP dropped by the SYN rate limit.",
            |v| v.rate_limited_syns,
        ),
        (
            "rivora_vip_no_healthy_backend_drops_total",
            "Packets to the VIP dropped because no backend was healthy.",
            |v| v.no_healthy_backend_drops,
        ),
    ];
    for (name, help, get) in per_vip {
        w.family(name, "counter", help);
        for v in &vips {
            w.sample(name, &[("vip", &v.vip)], &get(v).to_string());
        }
    }

    // One 0/1 series per state (a state set), so `== 1` selects the state
    // without knowing an enum encoding.
    w.family(
        "rivora_backend_health",
        "gauge",
        "1 for the backend's current datapath state (healthy, draining, down), 0 for the others.",
    );
    let mut backends: Vec<&BackendHealthSample> = s.backends.iter().collect();
    backends.sort_by(|a, b| a.backend.cmp(&b.backend));
    for b in backends {
        for state in BackendHealth::ALL {
            let v = if b.state == state { "1" } else { "0" };
            w.sample(
                "rivora_backend_health",
                &[("backend", &b.backend), ("state", state.as_str())],
                v,
            );
        }
    }

    w.family(
        "rivora_drops_total",
        "counter",
        "Packets dropped by the datapath, by reason.",
    );
    for (reason, n) in &s.drops {
        w.sample("rivora_drops_total", &[("reason", reason)], &n.to_string());
    }

    w.family(
        "rivora_config_reloads_total",
        "counter",
        "Configuration reloads, by result; a failed reload keeps the running configuration.",
    );
    w.sample(
        "rivora_config_reloads_total",
        &[("result", "success")],
        &s.reloads_success.to_string(),
    );
    w.sample(
        "rivora_config_reloads_total",
        &[("result", "failure")],
        &s.reloads_failure.to_string(),
    );

    let name = "rivora_health_probe_duration_seconds";
    w.family(
        name,
        "histogram",
        "Duration of active health probes, by result.",
    );
    for (result, h) in [("success", &s.probe_success), ("failure", &s.probe_failure)] {
        for (le, n) in h.cumulative() {
            w.sample(
                &format!("{name}_bucket"),
                &[("result", result), ("le", &fmt_float(le))],
                &n.to_string(),
            );
        }
        w.sample(
            &format!("{name}_sum"),
            &[("result", result)],
            &fmt_float(h.sum()),
        );
        w.sample(
            &format!("{name}_count"),
            &[("result", result)],
            &h.count().to_string(),
        );
    }

    w.out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small_histogram(values: &[f64]) -> Histogram {
        let mut h = Histogram::new(&[0.01, 0.1, 1.0]).unwrap();
        for v in values {
            h.observe(*v);
        }
        h
    }

    #[test]
    fn golden_text() {
        let mut drops = BTreeMap::new();
        drops.insert("no_healthy_backend".to_string(), 7);
        drops.insert("rate_limited".to_string(), 3);
        let snap = MetricsSnapshot {
            version: "0.1.0".into(),
            vips: vec![
                VipCounters {
                    vip: "udp/[2001:db8::1]:53".into(),
                    packets: 5,
                    bytes: 500,
                    rate_limited_syns: 0,
                    no_healthy_backend_drops: 0,
                },
                VipCounters {
                    vip: "tcp/10.0.0.1:80".into(),
                    packets: 1000,
                    bytes: 64000,
                    rate_limited_syns: 3,
                    no_healthy_backend_drops: 7,
                },
            ],
            backends: vec![BackendHealthSample {
                backend: "10.0.1.1:8080".into(),
                state: BackendHealth::Draining,
            }],
            drops,
            reloads_success: 2,
            reloads_failure: 1,
            probe_success: small_histogram(&[0.005, 0.01, 0.05]),
            probe_failure: small_histogram(&[2.0]),
        };
        let expected = r#"# HELP rivora_build_info Build information; the value is always 1.
# TYPE rivora_build_info gauge
rivora_build_info{version="0.1.0"} 1
# HELP rivora_vip_packets_total Packets that matched the VIP.
# TYPE rivora_vip_packets_total counter
rivora_vip_packets_total{vip="tcp/10.0.0.1:80"} 1000
rivora_vip_packets_total{vip="udp/[2001:db8::1]:53"} 5
# HELP rivora_vip_bytes_total Bytes of packets that matched the VIP.
# TYPE rivora_vip_bytes_total counter
rivora_vip_bytes_total{vip="tcp/10.0.0.1:80"} 64000
rivora_vip_bytes_total{vip="udp/[2001:db8::1]:53"} 500
# HELP rivora_vip_rate_limited_syns_total TCP SYNs to the VIP dropped by the SYN rate limit.
# TYPE rivora_vip_rate_limited_syns_total counter
rivora_vip_rate_limited_syns_total{vip="tcp/10.0.0.1:80"} 3
rivora_vip_rate_limited_syns_total{vip="udp/[2001:db8::1]:53"} 0
# HELP rivora_vip_no_healthy_backend_drops_total Packets to the VIP dropped because no backend was healthy.
# TYPE rivora_vip_no_healthy_backend_drops_total counter
rivora_vip_no_healthy_backend_drops_total{vip="tcp/10.0.0.1:80"} 7
rivora_vip_no_healthy_backend_drops_total{vip="udp/[2001:db8::1]:53"} 0
# HELP rivora_backend_health 1 for the backend's current datapath state (healthy, draining, down), 0 for the others.
# TYPE rivora_backend_health gauge
rivora_backend_health{backend="10.0.1.1:8080",state="healthy"} 0
rivora_backend_health{backend="10.0.1.1:8080",state="draining"} 1
rivora_backend_health{backend="10.0.1.1:8080",state="down"} 0
# HELP rivora_drops_total Packets dropped by the datapath, by reason.
# TYPE rivora_drops_total counter
rivora_drops_total{reason="no_healthy_backend"} 7
rivora_drops_total{reason="rate_limited"} 3
# HELP rivora_config_reloads_total Configuration reloads, by result; a failed reload keeps the running configuration.
# TYPE rivora_config_reloads_total counter
rivora_config_reloads_total{result="success"} 2
rivora_config_reloads_total{result="failure"} 1
# HELP rivora_health_probe_duration_seconds Duration of active health probes, by result.
# TYPE rivora_health_probe_duration_seconds histogram
rivora_health_probe_duration_seconds_bucket{result="success",le="0.01"} 2
rivora_health_probe_duration_seconds_bucket{result="success",le="0.1"} 3
rivora_health_probe_duration_seconds_bucket{result="success",le="1"} 3
rivora_health_probe_duration_seconds_bucket{result="success",le="+Inf"} 3
rivora_health_probe_duration_seconds_sum{result="success"} 0.065
rivora_health_probe_duration_seconds_count{result="success"} 3
rivora_health_probe_duration_seconds_bucket{result="failure",le="0.01"} 0
rivora_health_probe_duration_seconds_bucket{result="failure",le="0.1"} 0
rivora_health_probe_duration_seconds_bucket{result="failure",le="1"} 0
rivora_health_probe_duration_seconds_bucket{result="failure",le="+Inf"} 1
rivora_health_probe_duration_seconds_sum{result="failure"} 2
rivora_health_probe_duration_seconds_count{result="failure"} 1
"#;
        assert_eq!(render(&snap), expected);
    }

    #[test]
    fn empty_snapshot_still_declares_every_family() {
        let text = render(&MetricsSnapshot::default());
        for family in [
            "rivora_build_info gauge",
            "rivora_vip_packets_total counter",
            "rivora_vip_bytes_total counter",
            "rivora_vip_rate_limited_syns_total counter",
            "rivora_vip_no_healthy_backend_drops_total counter",
            "rivora_backend_health gauge",
            "rivora_drops_total counter",
            "rivora_config_reloads_total counter",
            "rivora_health_probe_duration_seconds histogram",
        ] {
            assert!(text.contains(&format!("# TYPE {family}\n")), "{family}");
        }
        // Default buckets, all empty, and the +Inf bucket equals _count.
        assert!(text.contains(
            "rivora_health_probe_duration_seconds_bucket{result=\"success\",le=\"0.0005\"} 0\n"
        ));
        assert!(text.contains(
            "rivora_health_probe_duration_seconds_bucket{result=\"failure\",le=\"+Inf\"} 0\n"
        ));
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape_label_value(r#"a\b"c"#), r#"a\\b\"c"#);
        assert_eq!(escape_label_value("line\nbreak"), "line\\nbreak");
        assert_eq!(escape_label_value("tcp/[::1]:80"), "tcp/[::1]:80");
        let snap = MetricsSnapshot {
            version: "1.0\"-dirty\\\n".into(),
            ..Default::default()
        };
        let text = render(&snap);
        assert!(text.contains("rivora_build_info{version=\"1.0\\\"-dirty\\\\\\n\"} 1\n"));
        // The raw newline must not split the sample across lines.
        assert!(text
            .lines()
            .all(|l| l.starts_with('#') || l.starts_with("rivora_")));
    }

    #[test]
    fn buckets_are_cumulative_and_le_inclusive() {
        let h = small_histogram(&[0.01, 0.0100001, 0.1, 0.5, 1.0, 1.5, 100.0, 0.0]);
        let c = h.cumulative();
        assert_eq!(
            c,
            vec![(0.01, 2), (0.1, 4), (1.0, 6), (f64::INFINITY, 8)],
            "0 and 0.01 fall in le=0.01; 1.0 in le=1"
        );
        assert!(c.windows(2).all(|w| w[0].1 <= w[1].1));
        assert_eq!(c.last().map(|l| l.1), Some(h.count()));
        assert!((h.sum() - 103.1200001).abs() < 1e-9);
    }

    #[test]
    fn histogram_bounds_are_checked() {
        assert!(Histogram::new(&[1.0, 1.0]).is_err());
        assert!(Histogram::new(&[2.0, 1.0]).is_err());
        assert!(Histogram::new(&[1.0, f64::INFINITY]).is_err());
        assert!(Histogram::new(&[f64::NAN]).is_err());
        assert!(Histogram::new(&[]).is_ok());
    }

    #[test]
    fn floats_use_exposition_spelling() {
        assert_eq!(fmt_float(f64::INFINITY), "+Inf");
        assert_eq!(fmt_float(f64::NEG_INFINITY), "-Inf");
        assert_eq!(fmt_float(f64::NAN), "NaN");
        assert_eq!(fmt_float(2.5), "2.5");
        assert_eq!(fmt_float(1.0), "1");
        assert_eq!(fmt_float(0.0005), "0.0005");
    }
}
