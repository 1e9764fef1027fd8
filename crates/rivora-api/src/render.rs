//! Human-readable tables for `rivoractl`. Pure functions of the API types,
//! so the binary stays thin and the layout is unit-tested.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use crate::types::{
    Affinity, BackendHealth, BackendInfo, DrainOutcome, Drops, L2Info, ReloadResult, SourceInfo,
    Status, VipInfo, VipMode, WatchInfo, XdpMode,
};

/// Columns padded to their widest cell, two spaces apart. Numeric columns
/// are right-aligned so digits line up.
#[derive(Debug, Clone)]
pub struct Table {
    headers: Vec<&'static str>,
    right: Vec<bool>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// Headers ending in `>` are right-aligned (the `>` is not printed).
    pub fn new(headers: &[&'static str]) -> Self {
        Self {
            headers: headers.iter().map(|h| h.trim_end_matches('>')).collect(),
            right: headers.iter().map(|h| h.ends_with('>')).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) -> &mut Self {
        self.rows.push(cells);
        self
    }

    pub fn render(&self) -> String {
        let cols = self.headers.len();
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate().take(cols) {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
        let mut out = String::new();
        let header: Vec<String> = self.headers.iter().map(|h| h.to_string()).collect();
        for row in std::iter::once(&header).chain(&self.rows) {
            let mut line = String::new();
            for (i, (width, right)) in widths.iter().zip(&self.right).enumerate() {
                let cell = row.get(i).map(String::as_str).unwrap_or("");
                if i > 0 {
                    line.push_str("  ");
                }
                let pad = width - cell.chars().count();
                if *right {
                    line.extend(std::iter::repeat_n(' ', pad));
                    line.push_str(cell);
                } else {
                    line.push_str(cell);
                    line.extend(std::iter::repeat_n(' ', pad));
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// Unix seconds as RFC 3339 UTC, without pulling in a date crate.
pub fn fmt_unix_utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// A duration in whole seconds, to two units: `45s`, `3m12s`, `2h05m`,
/// `3d04h`.
pub fn fmt_age(secs: u64) -> String {
    let (d, h, m, s) = (secs / 86_400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    if secs < 60 {
        format!("{s}s")
    } else if secs < 3600 {
        format!("{m}m{s:02}s")
    } else if secs < 86_400 {
        format!("{h}h{m:02}m")
    } else {
        format!("{d}d{h:02}h")
    }
}

/// How long before `now` a Unix time was; a time ahead of this clock
/// (another host's, under `--address`) reads as just now.
fn ago(at: u64, now: u64) -> String {
    format!("{} ago", fmt_age(now.saturating_sub(at)))
}

/// Free text (an error from a source or the API server) as one table
/// cell: whitespace runs, newlines included, become one space.
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn mode(m: VipMode) -> &'static str {
    match m {
        VipMode::Nat => "nat",
        VipMode::Dsr => "dsr",
        VipMode::L3dsr => "l3dsr",
        VipMode::Fullnat => "fullnat",
    }
}

fn affinity(a: Affinity) -> &'static str {
    match a {
        Affinity::None => "none",
        Affinity::ClientIp => "client_ip",
    }
}

fn yes_no(b: bool) -> String {
    if b { "yes" } else { "no" }.to_string()
}

/// The outcome, then one indented line per warning.
pub fn reload_line(r: &ReloadResult) -> String {
    let mut out = match (&r.ok, &r.error) {
        (true, _) => format!("ok at {}", fmt_unix_utc(r.at)),
        (false, Some(e)) => format!("FAILED at {}: {e}", fmt_unix_utc(r.at)),
        (false, None) => format!("FAILED at {}", fmt_unix_utc(r.at)),
    };
    for w in &r.warnings {
        let _ = write!(out, "\n  warning: {w}");
    }
    out
}

/// `rivoractl status`. `now` (Unix seconds) dates the sources' last
/// updates and the watches' last errors.
pub fn status(s: &Status, now: u64) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "version            {}", s.version);
    let _ = writeln!(out, "config generation  {}", s.config_generation);
    let _ = writeln!(out, "last reload        {}", reload_line(&s.last_reload));
    let _ = writeln!(out, "VIPs               {}", s.vip_count);
    let _ = writeln!(out, "backends           {}", s.backend_count);
    let _ = writeln!(out, "maglev table       {} slots", s.maglev_size);
    let _ = writeln!(
        out,
        "flow tables        {} entries each ({} per CPU)",
        s.flow_table_size, s.flow_table_per_cpu
    );
    if s.unclaimed_vips > 0 {
        let _ = writeln!(
            out,
            "unclaimed VIPs     {} (adopted; kept until every source has synced)",
            s.unclaimed_vips
        );
    }
    out.push_str(&unapplied(s));
    out.push('\n');
    let mut t = Table::new(&["INTERFACE", "IFINDEX>", "XDP", "TC NAT"]);
    for i in &s.interfaces {
        let xdp = match i.xdp_mode {
            XdpMode::Native => "native",
            XdpMode::Generic => "generic",
        };
        t.row(vec![
            i.name.clone(),
            i.ifindex.to_string(),
            xdp.into(),
            if i.tc_attached {
                "attached"
            } else {
                "detached"
            }
            .into(),
        ]);
    }
    out.push_str(&t.render());
    if !s.sources.is_empty() {
        out.push('\n');
        out.push_str(&sources(&s.sources, now));
    }
    if !s.watches.is_empty() {
        out.push_str("\nKubernetes watches\n");
        out.push_str(&watches(&s.watches, now));
    }
    if let Some(l2) = &s.l2 {
        out.push_str("\nL2 announcements\n");
        out.push_str(&l2_groups(l2, now));
    }
    out
}

/// The L2 speaker: each group this node stands for, whether it owns it
/// and since when, who holds its Lease, where and what it answers.
pub fn l2_groups(l2: &L2Info, now: u64) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "mode {}{}",
        l2.mode,
        l2.identity
            .as_deref()
            .map_or_else(String::new, |i| format!(", identity {i}"))
    );
    if let Some(e) = &l2.last_error {
        let _ = writeln!(out, "last error: {}", one_line(e));
    }
    if l2.groups.is_empty() {
        out.push_str("no group: no VIP this node serves is to be announced\n");
        return out;
    }
    let mut t = Table::new(&["GROUP", "OWNER", "SINCE", "INTERFACES", "VIPS>", "HOLDER"]);
    for g in &l2.groups {
        t.row(vec![
            g.name.clone(),
            yes_no(g.owner),
            match g.since {
                0 => "-".into(),
                at => ago(at, now),
            },
            g.interfaces.join(","),
            g.vips.len().to_string(),
            g.holder.clone().unwrap_or_else(|| "-".into()),
        ]);
    }
    out.push_str(&t.render());
    out
}

/// Each source of desired state: synced, objects, updates and the last
/// error (which stays until an update succeeds).
pub fn sources(sources: &[SourceInfo], now: u64) -> String {
    let mut t = Table::new(&[
        "SOURCE",
        "SYNCED",
        "OBJECTS>",
        "UPDATES>",
        "FAILED>",
        "LAST UPDATE",
        "LAST ERROR",
    ]);
    for s in sources {
        t.row(vec![
            s.kind.clone(),
            yes_no(s.synced),
            s.objects.to_string(),
            s.updates_ok.to_string(),
            s.updates_failed.to_string(),
            match s.last_at {
                0 => "never".into(),
                at => ago(at, now),
            },
            s.last_error.as_deref().map_or_else(|| "-".into(), one_line),
        ]);
    }
    t.render()
}

/// The Kubernetes source's watches. A watch's last error stays after it
/// recovers, so its age tells an old hiccup from a current outage.
pub fn watches(watches: &[WatchInfo], now: u64) -> String {
    let mut t = Table::new(&["RESOURCE", "SYNCED", "OBJECTS>", "ERRORS>", "LAST ERROR"]);
    for w in watches {
        t.row(vec![
            w.resource.clone(),
            yes_no(w.synced),
            w.objects.to_string(),
            w.errors.to_string(),
            match (&w.last_error, w.last_error_at) {
                (None, _) => "-".into(),
                (Some(e), 0) => one_line(e),
                (Some(e), at) => format!("{}: {}", ago(at, now), one_line(e)),
            },
        ]);
    }
    t.render()
}

/// A VIP's source; `-` from an older rivorad that does not say.
fn source(v: &VipInfo) -> String {
    if v.source.is_empty() {
        "-".into()
    } else {
        v.source.clone()
    }
}

fn healthy_of(v: &VipInfo) -> String {
    let healthy = v
        .backends
        .iter()
        .filter(|b| b.health == BackendHealth::Healthy)
        .count();
    format!("{healthy}/{}", v.backends.len())
}

/// The VIPs wanted and not in the maps as wanted (a key another object
/// holds, an address no pool admits), one line each with why.
pub fn unapplied(s: &Status) -> String {
    let mut out = String::new();
    for c in &s.conflicts {
        let _ = writeln!(out, "CONFLICT           {c}");
    }
    for f in &s.failed_vips {
        let _ = writeln!(out, "NOT APPLIED        {f}");
    }
    out
}

/// `rivoractl vip list`: the VIPs in the maps, then those wanted and not
/// there, with why.
pub fn vip_list_and_unapplied(vips: &[VipInfo], s: &Status) -> String {
    let mut out = vip_list(vips);
    let rest = unapplied(s);
    if !rest.is_empty() {
        out.push('\n');
        out.push_str(&rest);
    }
    out
}

pub fn vip_list(vips: &[VipInfo]) -> String {
    let mut t = Table::new(&[
        "VIP",
        "MODE",
        "AFFINITY",
        "HEALTHY>",
        "PACKETS>",
        "BYTES>",
        "RATE_LIMITED>",
        "NO_BACKEND>",
        // Last: the one cell with a space in it (`service ns/name`), so
        // the columns before it split on whitespace as they always have.
        "SOURCE",
    ]);
    for v in vips {
        t.row(vec![
            v.vip.clone(),
            mode(v.mode).into(),
            affinity(v.affinity).into(),
            healthy_of(v),
            v.packets.to_string(),
            v.bytes.to_string(),
            v.rate_limited.to_string(),
            v.no_backend.to_string(),
            source(v),
        ]);
    }
    t.render()
}

pub fn vip_show(v: &VipInfo) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "vip           {}", v.vip);
    let _ = writeln!(out, "source        {}", source(v));
    let _ = writeln!(out, "mode          {}", mode(v.mode));
    let _ = writeln!(out, "affinity      {}", affinity(v.affinity));
    let _ = writeln!(out, "service id    {}", v.service_id);
    match &v.source_ranges {
        None => {}
        Some(l) if l.is_empty() => {
            let _ = writeln!(
                out,
                "sources       none admitted (no source range of the VIP's family)"
            );
        }
        Some(l) => {
            let _ = writeln!(out, "sources       {}", l.join(", "));
        }
    }
    let p = &v.slice_precision;
    let _ = write!(
        out,
        "maglev slice  {}..{} ({} slots",
        v.slice_start,
        u64::from(v.slice_start) + u64::from(v.slice_len),
        v.slice_len
    );
    if p.needed > 0 {
        let _ = write!(out, "; weights need {}, wants {}", p.needed, p.wanted);
    }
    let _ = writeln!(out, ")");
    if p.reduced {
        let _ = writeln!(
            out,
            "precision     reduced: {} of the {} slots its weights need (the Maglev table is \
             full); shares may be off their weights by more than 5 %",
            v.slice_len, p.needed
        );
    }
    let _ = writeln!(out, "packets       {}", v.packets);
    let _ = writeln!(out, "bytes         {}", v.bytes);
    let _ = writeln!(out, "rate limited  {}", v.rate_limited);
    let _ = writeln!(out, "no backend    {}", v.no_backend);
    if v.source_ranges.is_some() {
        let _ = writeln!(
            out,
            "refused       {} (source outside the ranges)",
            v.source_refused
        );
    }
    if v.fullnat_ports_exhausted > 0 || v.fullnat_table_full > 0 {
        let _ = writeln!(
            out,
            "full NAT      {} new flows dropped with every port held, {} with the port table full",
            v.fullnat_ports_exhausted, v.fullnat_table_full
        );
    }
    out.push('\n');
    // VIA: how each backend is reached (Kubernetes reaches a Service's
    // endpoints on other nodes by full NAT or a tunnel to their node, its
    // own node's by NAT), and NODE where it lives when its source says.
    let nodes = v.backends.iter().any(|b| b.node.is_some());
    let mut cols = vec!["BACKEND", "ID>", "WEIGHT>", "HEALTH", "DRAINED", "VIA"];
    if nodes {
        cols.push("NODE");
    }
    let mut t = Table::new(&cols);
    for b in &v.backends {
        let mut row = vec![
            b.target.to_string(),
            b.backend_id.to_string(),
            b.weight.to_string(),
            b.health.as_str().into(),
            yes_no(b.drained),
            mode(b.mode.unwrap_or(v.mode)).into(),
        ];
        if nodes {
            row.push(b.node.clone().unwrap_or_else(|| "-".into()));
        }
        t.row(row);
    }
    out.push_str(&t.render());
    out
}

pub fn backend_list(backends: &[BackendInfo]) -> String {
    let mut t = Table::new(&["BACKEND", "ID>", "HEALTH", "PROBE", "DRAINED", "VIPS"]);
    for b in backends {
        t.row(vec![
            b.target.to_string(),
            b.backend_id.to_string(),
            b.health.as_str().into(),
            b.probe.as_str().into(),
            yes_no(b.drained_by_operator),
            b.vips.join(","),
        ]);
    }
    t.render()
}

pub fn drain_outcome(verb: &str, o: &DrainOutcome) -> String {
    let vips = if o.vips.is_empty() {
        "no VIP".to_string()
    } else {
        o.vips.join(", ")
    };
    if o.changed {
        format!("{verb} {} on {vips}\n", o.target)
    } else {
        format!("{} already {verb} on {vips}: nothing changed\n", o.target)
    }
}

/// One sample of `rivoractl stats`: counters, and per-second rates when an
/// earlier sample and the time since it are given (`--watch`).
pub fn stats(vips: &[VipInfo], drops: &Drops, previous: Option<(&[VipInfo], Duration)>) -> String {
    let prev: BTreeMap<&str, (u64, u64)> = previous
        .map(|(p, _)| {
            p.iter()
                .map(|v| (v.vip.as_str(), (v.packets, v.bytes)))
                .collect()
        })
        .unwrap_or_default();
    let secs = previous.map(|(_, d)| d.as_secs_f64()).filter(|s| *s > 0.0);
    let mut t = if secs.is_some() {
        Table::new(&[
            "VIP",
            "PACKETS>",
            "BYTES>",
            "PKT/S>",
            "BYTES/S>",
            "RATE_LIMITED>",
            "NO_BACKEND>",
        ])
    } else {
        Table::new(&["VIP", "PACKETS>", "BYTES>", "RATE_LIMITED>", "NO_BACKEND>"])
    };
    for v in vips {
        let mut row = vec![v.vip.clone(), v.packets.to_string(), v.bytes.to_string()];
        if let Some(secs) = secs {
            // A VIP new since the last sample, or counters that went back
            // (a VIP re-created), shows no rate rather than a bogus one.
            let rate = |now: u64, before: Option<u64>| match before {
                Some(b) if now >= b => format!("{:.0}", (now - b) as f64 / secs),
                _ => "-".to_string(),
            };
            let before = prev.get(v.vip.as_str());
            row.push(rate(v.packets, before.map(|p| p.0)));
            row.push(rate(v.bytes, before.map(|p| p.1)));
        }
        row.push(v.rate_limited.to_string());
        row.push(v.no_backend.to_string());
        t.row(row);
    }
    let mut out = t.render();
    out.push('\n');
    let mut d = Table::new(&["DROP REASON", "PACKETS>"]);
    for (reason, n) in drops.by_reason.iter().filter(|(_, n)| **n > 0) {
        d.row(vec![reason.clone(), n.to_string()]);
    }
    out.push_str(&d.render());
    out
}

/// `rivoractl bgp peers`.
pub fn bgp_peers(peers: &[crate::types::BgpPeerInfo]) -> String {
    if peers.is_empty() {
        return "no BGP peers (no bgp section in the configuration)\n".into();
    }
    let mut t = Table::new(&[
        "PEER",
        "ASN>",
        "STATE",
        "UPTIME>",
        "FLAPS>",
        "SENT>",
        "RECEIVED>",
        "ROUTES>",
        "BFD",
        "LAST ERROR",
    ]);
    for p in peers {
        let bfd = match &p.bfd_state {
            Some(s) if p.bfd_detect_ms > 0 => format!("{s} ({} ms)", p.bfd_detect_ms),
            Some(s) => s.clone(),
            None => "-".into(),
        };
        t.row(vec![
            if p.name == p.address.to_string() {
                p.name.clone()
            } else {
                format!("{} ({})", p.name, p.address)
            },
            p.asn.to_string(),
            p.state.clone(),
            if p.uptime_seconds > 0 {
                fmt_age(p.uptime_seconds)
                    .trim_end_matches(" ago")
                    .to_string()
            } else {
                "-".into()
            },
            p.flaps.to_string(),
            p.updates_sent.to_string(),
            p.updates_received.to_string(),
            p.advertised.to_string(),
            bfd,
            p.last_error.clone().unwrap_or_else(|| "-".into()),
        ]);
    }
    t.render()
}

/// `rivoractl bgp routes`.
pub fn bgp_routes(routes: &[crate::types::BgpRouteInfo]) -> String {
    if routes.is_empty() {
        return "no routes announced\n".into();
    }
    let mut t = Table::new(&["PREFIX", "COMMUNITIES", "LOCAL PREF>", "MED>", "PEERS"]);
    let or_dash = |v: Vec<String>| {
        if v.is_empty() {
            "-".to_string()
        } else {
            v.join(",")
        }
    };
    for r in routes {
        let mut c = r.communities.clone();
        c.extend(r.large_communities.iter().cloned());
        t.row(vec![
            r.prefix.clone(),
            or_dash(c),
            r.local_pref.map_or_else(|| "-".into(), |v| v.to_string()),
            r.med.map_or_else(|| "-".into(), |v| v.to_string()),
            or_dash(r.peers.clone()),
        ]);
    }
    t.render()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Ports, Proto, SlicePrecision, VipBackend};

    #[test]
    fn reload_line_lists_each_warning() {
        let mut r = ReloadResult {
            ok: true,
            at: 0,
            error: None,
            warnings: vec![],
        };
        assert_eq!(reload_line(&r), format!("ok at {}", fmt_unix_utc(0)));
        r.warnings = vec![
            "metrics.listen changed from none to 127.0.0.1:9440: it takes effect at the next restart"
                .into(),
            "api.socket changed from /a to /b: it takes effect at the next restart".into(),
        ];
        assert_eq!(
            reload_line(&r),
            format!(
                "ok at {}\n  warning: {}\n  warning: {}",
                fmt_unix_utc(0),
                r.warnings[0],
                r.warnings[1]
            )
        );
        // An answer without the field (an older rivorad) reads as none.
        let old: ReloadResult =
            serde_json::from_str(r#"{"ok":true,"at":0,"error":null}"#).expect("old answer");
        assert!(old.warnings.is_empty());
    }

    fn vip(name: &str, packets: u64, bytes: u64) -> VipInfo {
        VipInfo {
            vip: name.into(),
            addr: "10.0.0.1".parse().unwrap(),
            ports: Ports {
                first: 80,
                last: 80,
            },
            proto: Proto::Tcp,
            mode: VipMode::Nat,
            affinity: Affinity::None,
            service_id: 1,
            slice_start: 0,
            slice_len: 7,
            backends: vec![
                VipBackend {
                    target: "10.0.1.1:8080".parse().unwrap(),
                    backend_id: 1,
                    weight: 1,
                    health: BackendHealth::Healthy,
                    drained: false,
                    mode: None,
                    node: None,
                },
                VipBackend {
                    target: "10.0.1.2:8080".parse().unwrap(),
                    backend_id: 2,
                    weight: 10,
                    health: BackendHealth::Down,
                    drained: false,
                    mode: Some(VipMode::Fullnat),
                    node: Some("node-2".into()),
                },
            ],
            packets,
            bytes,
            rate_limited: 3,
            no_backend: 0,
            fullnat_ports_exhausted: 0,
            fullnat_table_full: 0,
            source: "file".into(),
            slice_precision: SlicePrecision::default(),
            source_ranges: None,
            source_refused: 0,
        }
    }

    #[test]
    fn vip_show_names_the_source_ranges_and_what_they_refused() {
        let mut v = vip("tcp/10.0.0.1:80", 1, 64);
        assert!(!vip_show(&v).contains("sources"), "none: every client");
        v.source_ranges = Some(vec!["192.0.2.0/24".into(), "fd00::/64".into()]);
        v.source_refused = 4;
        let out = vip_show(&v);
        assert!(
            out.contains("sources       192.0.2.0/24, fd00::/64\n"),
            "{out}"
        );
        assert!(
            out.contains("refused       4 (source outside the ranges)\n"),
            "{out}"
        );
        v.source_ranges = Some(vec![]);
        assert!(vip_show(&v).contains("sources       none admitted"));
    }

    #[test]
    fn tables_align_columns() {
        let mut t = Table::new(&["NAME", "N>", "NOTE"]);
        t.row(vec!["a".into(), "1".into(), "".into()]);
        t.row(vec!["long-name".into(), "12345".into(), "x".into()]);
        assert_eq!(
            t.render(),
            "NAME           N  NOTE\n\
             a              1\n\
             long-name  12345  x\n"
        );
    }

    #[test]
    fn vip_list_golden() {
        let out = vip_list(&[vip("tcp/10.0.0.1:80", 1234, 99999)]);
        assert_eq!(
            out,
            "VIP              MODE  AFFINITY  HEALTHY  PACKETS  BYTES  RATE_LIMITED  NO_BACKEND  SOURCE\n\
             tcp/10.0.0.1:80  nat   none          1/2     1234  99999             3           0  file\n"
        );
    }

    #[test]
    fn vip_list_shows_each_source() {
        let mut svc = vip("tcp/10.0.0.2:443", 1, 2);
        svc.source = "service shop/web-frontend".into();
        let mut adopted = vip("udp/10.0.0.3:53", 0, 0);
        adopted.source = "unclaimed".into();
        let mut old = vip("tcp/10.0.0.4:80", 0, 0);
        old.source = String::new();
        let out = vip_list(&[vip("tcp/10.0.0.1:80", 5, 6), svc, adopted, old]);
        assert_eq!(
            out,
            "VIP               MODE  AFFINITY  HEALTHY  PACKETS  BYTES  RATE_LIMITED  NO_BACKEND  SOURCE\n\
             tcp/10.0.0.1:80   nat   none          1/2        5      6             3           0  file\n\
             tcp/10.0.0.2:443  nat   none          1/2        1      2             3           0  service shop/web-frontend\n\
             udp/10.0.0.3:53   nat   none          1/2        0      0             3           0  unclaimed\n\
             tcp/10.0.0.4:80   nat   none          1/2        0      0             3           0  -\n"
        );
        // Every column before SOURCE still splits on whitespace.
        for line in out.lines().skip(1) {
            assert_eq!(line.split_whitespace().nth(7), Some("0"), "{line}");
        }
    }

    #[test]
    fn vip_list_ends_with_what_is_not_applied() {
        let vips = [vip("tcp/10.0.0.1:80", 5, 6)];
        let mut st = status_fixture();
        st.conflicts.clear();
        st.failed_vips.clear();
        assert_eq!(vip_list_and_unapplied(&vips, &st), vip_list(&vips));
        st.failed_vips = vec!["tcp/10.9.0.1:80: 10.9.0.1 is in no AddressPool in use".into()];
        st.conflicts = vec!["VIP tcp/10.0.0.1:80 is claimed by a and by b".into()];
        assert_eq!(
            vip_list_and_unapplied(&vips, &st),
            format!(
                "{}\n\
                 CONFLICT           VIP tcp/10.0.0.1:80 is claimed by a and by b\n\
                 NOT APPLIED        tcp/10.9.0.1:80: 10.9.0.1 is in no AddressPool in use\n",
                vip_list(&vips)
            )
        );
    }

    #[test]
    fn vip_show_says_when_precision_is_reduced() {
        let mut v = vip("tcp/10.0.0.2:443", 1, 2);
        v.slice_precision = SlicePrecision {
            needed: 96,
            wanted: 768,
            reduced: false,
        };
        let out = vip_show(&v);
        assert!(
            out.contains("maglev slice  0..7 (7 slots; weights need 96, wants 768)\npackets"),
            "{out}"
        );
        v.slice_precision.reduced = true;
        let out = vip_show(&v);
        assert!(
            out.contains(
                "maglev slice  0..7 (7 slots; weights need 96, wants 768)\n\
                 precision     reduced: 7 of the 96 slots its weights need (the Maglev table is \
                 full); shares may be off their weights by more than 5 %\npackets"
            ),
            "{out}"
        );
        // Unknown (an unclaimed VIP, an older rivorad): the slice alone.
        v.slice_precision = SlicePrecision::default();
        assert!(vip_show(&v).contains("maglev slice  0..7 (7 slots)\n"));
    }

    #[test]
    fn vip_show_says_how_each_backend_is_reached() {
        let mut v = vip("tcp/10.0.0.2:443", 1, 2);
        let out = vip_show(&v);
        assert!(
            out.ends_with(
                "BACKEND        ID  WEIGHT  HEALTH   DRAINED  VIA      NODE\n\
                 10.0.1.1:8080   1       1  healthy  no       nat      -\n\
                 10.0.1.2:8080   2      10  down     no       fullnat  node-2\n"
            ),
            "{out}"
        );
        // No node known for any backend (a static file): no NODE column.
        let mut bare = v.clone();
        for b in &mut bare.backends {
            b.node = None;
        }
        assert!(
            vip_show(&bare).ends_with(
                "BACKEND        ID  WEIGHT  HEALTH   DRAINED  VIA\n\
                 10.0.1.1:8080   1       1  healthy  no       nat\n\
                 10.0.1.2:8080   2      10  down     no       fullnat\n"
            ),
            "{}",
            vip_show(&bare)
        );
        assert!(!out.contains("full NAT"), "{out}");
        v.fullnat_ports_exhausted = 7;
        assert!(
            vip_show(&v).contains(
                "full NAT      7 new flows dropped with every port held, 0 with the port table full\n"
            ),
            "{}",
            vip_show(&v)
        );
    }

    #[test]
    fn vip_show_names_the_source() {
        let mut v = vip("tcp/10.0.0.2:443", 1, 2);
        v.source = "service shop/web".into();
        let out = vip_show(&v);
        assert!(
            out.starts_with(
                "vip           tcp/10.0.0.2:443\nsource        service shop/web\nmode "
            ),
            "{out}"
        );
    }

    fn status_fixture() -> Status {
        Status {
            version: "0.1.0".into(),
            config_generation: 1,
            last_reload: ReloadResult {
                ok: true,
                at: 1_700_000_000,
                error: None,
                warnings: vec![],
            },
            interfaces: vec![],
            vip_count: 1000,
            backend_count: 10000,
            maglev_size: 65537,
            flow_table_size: 131072,
            flow_table_per_cpu: 65536,
            apply_in_progress: false,
            unclaimed_vips: 0,
            conflicts: vec![],
            failed_vips: vec![],
            sources: vec![],
            watches: vec![],
            l2: None,
        }
    }

    const NOW: u64 = 1_700_000_000;

    #[test]
    fn status_without_sources_or_watches_has_neither_section() {
        let out = status(&status_fixture(), NOW);
        assert!(!out.contains("SOURCE"), "{out}");
        assert!(!out.contains("Kubernetes watches"), "{out}");
        assert!(!out.contains("L2 announcements"), "{out}");
        assert!(out.ends_with("INTERFACE  IFINDEX  XDP  TC NAT\n"), "{out}");
    }

    #[test]
    fn status_sources_and_watches_golden() {
        let mut s = status_fixture();
        s.sources = vec![
            SourceInfo {
                kind: "file".into(),
                synced: true,
                objects: 1,
                updates_ok: 1,
                updates_failed: 0,
                last_at: NOW - 3725,
                last_error: None,
            },
            SourceInfo {
                kind: "service".into(),
                synced: false,
                objects: 998,
                updates_ok: 1532,
                updates_failed: 2,
                last_at: NOW - 4,
                last_error: Some("shop/web: no free\n  Maglev space".into()),
            },
        ];
        s.watches = vec![
            WatchInfo {
                resource: "services".into(),
                synced: true,
                objects: 1000,
                errors: 0,
                last_error: None,
                last_error_at: 0,
            },
            WatchInfo {
                resource: "endpointslices".into(),
                synced: false,
                objects: 9980,
                errors: 3,
                last_error: Some("connection refused".into()),
                last_error_at: NOW - 192,
            },
            WatchInfo {
                resource: "servicepolicies".into(),
                synced: true,
                objects: 0,
                errors: 1,
                // An error from a clock ahead of this one: just now.
                last_error: Some("forbidden".into()),
                last_error_at: NOW + 30,
            },
        ];
        let out = status(&s, NOW);
        let tail = out.split_once("TC NAT\n").expect("interfaces table").1;
        assert_eq!(
            tail,
            "\n\
             SOURCE   SYNCED  OBJECTS  UPDATES  FAILED  LAST UPDATE  LAST ERROR\n\
             file     yes           1        1       0  1h02m ago    -\n\
             service  no          998     1532       2  4s ago       shop/web: no free Maglev space\n\
             \n\
             Kubernetes watches\n\
             RESOURCE         SYNCED  OBJECTS  ERRORS  LAST ERROR\n\
             services         yes        1000       0  -\n\
             endpointslices   no         9980       3  3m12s ago: connection refused\n\
             servicepolicies  yes           0       1  0s ago: forbidden\n"
        );
    }

    #[test]
    fn status_l2_golden() {
        use crate::types::L2Group;
        let mut s = status_fixture();
        s.l2 = Some(L2Info {
            mode: "kubernetes".into(),
            identity: Some("node-a_1f2e3".into()),
            groups: vec![
                L2Group {
                    name: "rivora-l2-web".into(),
                    owner: true,
                    since: NOW - 75,
                    holder: Some("node-a_1f2e3".into()),
                    interfaces: vec!["eth0".into()],
                    vips: vec!["10.0.0.1".parse().unwrap(), "fd00::1".parse().unwrap()],
                },
                L2Group {
                    name: "rivora-l2-web-10-0-0-7".into(),
                    owner: false,
                    since: NOW - 3725,
                    holder: Some("node-b_88aa".into()),
                    interfaces: vec!["eth0".into(), "eth1".into()],
                    vips: vec!["10.0.0.7".parse().unwrap()],
                },
            ],
            last_error: None,
        });
        let out = status(&s, NOW);
        let tail = out.split_once("TC NAT\n").expect("interfaces table").1;
        assert_eq!(
            tail,
            "\n\
             L2 announcements\n\
             mode kubernetes, identity node-a_1f2e3\n\
             GROUP                   OWNER  SINCE      INTERFACES  VIPS  HOLDER\n\
             rivora-l2-web           yes    1m15s ago  eth0           2  node-a_1f2e3\n\
             rivora-l2-web-10-0-0-7  no     1h02m ago  eth0,eth1      1  node-b_88aa\n"
        );
        let none = l2_groups(
            &L2Info {
                mode: "static".into(),
                identity: None,
                groups: vec![],
                last_error: Some("watching AddressPools: forbidden".into()),
            },
            NOW,
        );
        assert_eq!(
            none,
            "mode static\nlast error: watching AddressPools: forbidden\nno group: no VIP this node serves is to be announced\n"
        );
    }

    #[test]
    fn a_source_never_updated_says_so() {
        let out = sources(
            &[SourceInfo {
                kind: "service".into(),
                synced: false,
                objects: 0,
                updates_ok: 0,
                updates_failed: 0,
                last_at: 0,
                last_error: None,
            }],
            NOW,
        );
        assert!(
            out.ends_with("service  no            0        0       0  never        -\n"),
            "{out}"
        );
    }

    #[test]
    fn ages() {
        for (secs, want) in [
            (0, "0s"),
            (59, "59s"),
            (60, "1m00s"),
            (192, "3m12s"),
            (3599, "59m59s"),
            (3600, "1h00m"),
            (86_399, "23h59m"),
            (86_400, "1d00h"),
            (3 * 86_400 + 4 * 3600 + 59, "3d04h"),
        ] {
            assert_eq!(fmt_age(secs), want, "{secs}");
        }
    }

    #[test]
    fn stats_rates_from_previous_sample() {
        let before = [vip("tcp/10.0.0.1:80", 100, 1000)];
        let now = [
            vip("tcp/10.0.0.1:80", 300, 5000),
            vip("udp/10.0.0.2:53", 5, 50),
        ];
        let mut drops = Drops::default();
        drops.by_reason.insert("no_service".into(), 0);
        drops.by_reason.insert("rate_limited".into(), 3);
        let out = stats(&now, &drops, Some((&before, Duration::from_secs(2))));
        assert_eq!(
            out,
            "VIP              PACKETS  BYTES  PKT/S  BYTES/S  RATE_LIMITED  NO_BACKEND\n\
             tcp/10.0.0.1:80      300   5000    100     2000             3           0\n\
             udp/10.0.0.2:53        5     50      -        -             3           0\n\
             \n\
             DROP REASON   PACKETS\n\
             rate_limited        3\n"
        );
    }

    #[test]
    fn unix_time_formatting() {
        assert_eq!(fmt_unix_utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(fmt_unix_utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(fmt_unix_utc(1_700_000_000), "2023-11-14T22:13:20Z");
    }
}
