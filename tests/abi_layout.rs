//! Pinned maps outlive upgrades: a change to any ABI struct's size or field
//! offsets must be seen and handled on purpose (bump RV_ABI_VERSION, plan a
//! migration). This snapshots every shared type against
//! tests/golden/abi_layout.txt and checks none has implicit padding (the
//! Pod byte views in the dataplane rely on that).
//!
//! The snapshot also keeps, for every layout version ever blessed, a hash
//! of its layout. A version's layout is fixed once blessed: re-blessing a
//! changed layout under the same RV_ABI_VERSION is refused, so the only way
//! past a layout change is a version bump (which makes rivorad refuse maps
//! pinned by the old layout instead of misreading them). Anything that
//! changes the snapshot's lines counts, a new ABI type included: a map
//! missing from a pinned set is a migration too.
//!
//! After an intended change and a version bump:
//! `RIVORA_BLESS=1 cargo test --test abi_layout`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::mem::{offset_of, size_of, size_of_val};

use rivora::abi::*;

macro_rules! layout {
    ($out:expr, $t:ident { $($f:ident),* $(,)? }) => {{
        let v = $t::default();
        let mut fields = 0usize;
        write!($out, "{} size={}", stringify!($t), size_of::<$t>()).unwrap();
        $(
            write!($out, " {}@{}:{}", stringify!($f), offset_of!($t, $f), size_of_val(&v.$f)).unwrap();
            fields += size_of_val(&v.$f);
        )*
        writeln!($out).unwrap();
        assert_eq!(fields, size_of::<$t>(), "{} has implicit padding", stringify!($t));
    }};
}

/// The layout lines of every ABI type, one per type.
fn snapshot() -> String {
    let mut s = String::new();
    layout!(
        s,
        rv_vip_key {
            addr,
            port,
            proto,
            pad
        }
    );
    layout!(
        s,
        rv_vip6_key {
            addr,
            port,
            proto,
            pad
        }
    );
    layout!(s, rv_vip_value { svc_id });
    layout!(
        s,
        rv_vip_range_key {
            prefixlen,
            proto,
            pad,
            addr,
            port,
            pad2
        }
    );
    layout!(
        s,
        rv_vip_range6_key {
            prefixlen,
            proto,
            pad,
            addr,
            port,
            pad2
        }
    );
    layout!(
        s,
        rv_service {
            mode,
            affinity,
            family,
            proto,
            flags,
            slice_start,
            slice_len,
            backend_count,
            affinity_timeout_s
        }
    );
    layout!(s, rv_maglev_slot { backend_id });
    layout!(
        s,
        rv_nexthop {
            ifindex,
            mtu,
            dmac,
            smac,
            flags,
            mode,
            fullnat_src,
            pad
        }
    );
    layout!(
        s,
        rv_backend {
            addr,
            port,
            mac,
            nh
        }
    );
    layout!(
        s,
        rv_backend6 {
            addr,
            port,
            mac,
            nh
        }
    );
    layout!(s, rv_nh_miss { packets });
    layout!(
        s,
        rv_nat_owner_key {
            backend_addr,
            backend_port,
            proto,
            pad
        }
    );
    layout!(
        s,
        rv_nat_owner6_key {
            backend_addr,
            backend_port,
            proto,
            pad
        }
    );
    layout!(
        s,
        rv_nat_owner {
            svc_id,
            backend_id,
            vip_addr,
            vip_port,
            pad
        }
    );
    layout!(s, rv_vip_filter { active, pad, bits });
    layout!(s, rv_backend_health { state, pad });
    layout!(
        s,
        rv_flow_key {
            svc_id,
            saddr,
            sport,
            dport,
            proto,
            pad
        }
    );
    layout!(
        s,
        rv_flow6_key {
            svc_id,
            saddr,
            sport,
            dport,
            proto,
            pad
        }
    );
    layout!(
        s,
        rv_affinity_value {
            backend_id,
            fullnat_port,
            fullnat_src,
            ranges_gen,
            last_seen_ns
        }
    );
    layout!(
        s,
        rv_nat_key {
            backend_addr,
            client_addr,
            backend_port,
            client_port,
            proto,
            pad
        }
    );
    layout!(
        s,
        rv_nat6_key {
            backend_addr,
            client_addr,
            backend_port,
            client_port,
            proto,
            pad
        }
    );
    layout!(
        s,
        rv_nat_value {
            vip_addr,
            vip_port,
            pad,
            svc_id
        }
    );
    layout!(
        s,
        rv_nat6_value {
            vip_addr,
            vip_port,
            pad,
            svc_id
        }
    );
    layout!(
        s,
        rv_frag_key {
            saddr,
            daddr,
            id,
            proto,
            pad
        }
    );
    layout!(
        s,
        rv_frag6_key {
            saddr,
            daddr,
            id,
            proto,
            pad
        }
    );
    layout!(s, rv_frag_value { svc_id, backend_id });
    layout!(s, rv_frag_rev_value { vip_addr, svc_id });
    layout!(s, rv_frag_rev6_value { vip_addr, svc_id });
    layout!(
        s,
        rv_vip_stats {
            packets,
            bytes,
            rate_limited,
            no_backend
        }
    );
    layout!(s, rv_drop_stats { packets });
    layout!(
        s,
        rv_rl_config {
            enabled,
            rate_per_sec,
            burst,
            pad
        }
    );
    layout!(s, rv_rl_key { svc_id, saddr });
    layout!(s, rv_rl6_key { svc_id, saddr });
    layout!(
        s,
        rv_rl_bucket {
            tokens_milli,
            last_ns
        }
    );
    layout!(s, rv_iface_mac { mac, flags, pad });
    layout!(s, rv_tunnel_config { src4, src6 });
    layout!(s, rv_tunnel_ep_key { svc_id, addr });
    layout!(s, rv_tunnel_ep { backend_id });
    layout!(
        s,
        rv_source_range_key {
            prefixlen,
            svc_id,
            addr
        }
    );
    layout!(
        s,
        rv_source_range6_key {
            prefixlen,
            svc_id,
            addr
        }
    );
    layout!(s, rv_source_range { len });
    layout!(s, rv_source_refused { packets });
    layout!(
        s,
        rv_meta {
            abi_version,
            maglev_size
        }
    );
    layout!(
        s,
        rv_fullnat_config {
            port_min,
            port_max,
            tcp_timeout_ms,
            tcp_closing_timeout_ms,
            udp_timeout_ms,
            src_filter
        }
    );
    layout!(s, rv_fullnat_src { addr });
    layout!(
        s,
        rv_fullnat_key {
            backend_addr,
            src_addr,
            backend_port,
            src_port,
            proto,
            pad
        }
    );
    layout!(
        s,
        rv_fullnat6_key {
            backend_addr,
            src_addr,
            backend_port,
            src_port,
            proto,
            pad
        }
    );
    layout!(
        s,
        rv_fullnat_flow {
            client_addr,
            vip_addr,
            client_port,
            vip_port,
            svc_id,
            backend_id,
            ifindex,
            dmac,
            smac,
            flags,
            pad,
            last_seen_ns
        }
    );
    layout!(s, rv_fullnat_cursor { next });
    layout!(
        s,
        rv_fullnat_stats {
            ports_exhausted,
            table_full
        }
    );
    layout!(
        s,
        rv_fullnat_frag {
            client_addr,
            vip_addr
        }
    );
    s
}

const GOLDEN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/abi_layout.txt");

#[test]
fn abi_layout_matches_snapshot() {
    let text = std::fs::read_to_string(GOLDEN).expect("tests/golden/abi_layout.txt exists");
    let golden = Golden::parse(&text).unwrap_or_else(|e| panic!("{GOLDEN}: {e}"));
    let bless = std::env::var_os("RIVORA_BLESS").is_some();
    match bless_or_check(&golden, ABI_VERSION, &snapshot(), bless) {
        Ok(Some(new)) => std::fs::write(GOLDEN, new).expect("writing the snapshot"),
        Ok(None) => {}
        Err(e) => panic!("{e}"),
    }
}

/// FNV-1a, 64 bits: a stable fingerprint of a layout's text (no
/// adversary here, only an accidental edit to notice).
fn fnv1a64(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// tests/golden/abi_layout.txt: the layout hash of every version ever
/// blessed, then the current version and its layout in full (the lines a
/// reviewer reads in a diff).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Golden {
    history: BTreeMap<u32, u64>,
    version: u32,
    layout: String,
}

const HEADER: &str = "\
# Written by `RIVORA_BLESS=1 cargo test --test abi_layout` (tests/abi_layout.rs).
# Every layout version ever blessed, with the FNV-1a 64 hash of its layout
# lines: a version's layout never changes, a changed layout needs a new
# RV_ABI_VERSION (include/rivora/abi.h).
";

impl Golden {
    fn parse(text: &str) -> Result<Self, String> {
        let mut history = BTreeMap::new();
        let mut version = None;
        let mut layout = String::new();
        for (n, line) in text.lines().enumerate() {
            let n = n + 1;
            if line.starts_with('#') || (version.is_none() && line.is_empty()) {
                continue;
            }
            if let Some(rest) = line.strip_prefix("version ") {
                let parsed = rest.split_once(" fnv1a64=").and_then(|(v, h)| {
                    Some((v.parse::<u32>().ok()?, u64::from_str_radix(h, 16).ok()?))
                });
                let Some((v, h)) = parsed else {
                    return Err(format!(
                        "line {n}: expected `version N fnv1a64=HEX`: {line}"
                    ));
                };
                if history.insert(v, h).is_some() {
                    return Err(format!("line {n}: version {v} recorded twice"));
                }
            } else if let Some(v) = line.strip_prefix("abi_version=") {
                let v = v
                    .parse()
                    .map_err(|_| format!("line {n}: bad abi_version: {line}"))?;
                if version.replace(v).is_some() {
                    return Err(format!("line {n}: a second abi_version line"));
                }
            } else if version.is_some() {
                layout.push_str(line);
                layout.push('\n');
            } else {
                return Err(format!(
                    "line {n}: a layout line before abi_version: {line}"
                ));
            }
        }
        let version = version.ok_or("no abi_version line")?;
        // The file as the test writes it: a hand edit that skips a step
        // is as suspect as a layout change.
        let last = history.keys().next_back().copied();
        if last != Some(version) {
            return Err(format!(
                "abi_version={version} is not the last recorded version ({last:?})"
            ));
        }
        if history.get(&version) != Some(&fnv1a64(&layout)) {
            return Err(format!(
                "the layout of version {version} does not match its recorded hash"
            ));
        }
        Ok(Self {
            history,
            version,
            layout,
        })
    }

    fn render(&self) -> String {
        let mut s = HEADER.to_string();
        for (v, h) in &self.history {
            writeln!(s, "version {v} fnv1a64={h:016x}").unwrap();
        }
        writeln!(s, "\nabi_version={}", self.version).unwrap();
        s + &self.layout
    }
}

/// Why this build's layout cannot be checked against, or blessed into,
/// the snapshot.
#[derive(Debug, PartialEq, Eq)]
enum LayoutError {
    /// The layout differs from the one recorded under the same version.
    ChangedUnderVersion {
        version: u32,
        recorded: u64,
        now: u64,
        /// The first differing line, recorded then now (None past the end).
        first_difference: Option<(Option<String>, Option<String>)>,
    },
    /// RV_ABI_VERSION is lower than a version already recorded.
    VersionWentBack { recorded: u32, now: u32 },
    /// A new version, not blessed yet.
    NotBlessed { version: u32 },
}

impl std::fmt::Display for LayoutError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::ChangedUnderVersion {
                version,
                recorded,
                now,
                first_difference,
            } => {
                write!(
                    f,
                    "the kernel ABI layout changed under RV_ABI_VERSION {version}: recorded \
                     fnv1a64={recorded:016x}, this build fnv1a64={now:016x}"
                )?;
                if let Some((was, is)) = first_difference {
                    let show = |l: &Option<String>| l.as_deref().unwrap_or("(none)").to_string();
                    write!(
                        f,
                        "; first difference: `{}` is now `{}`",
                        show(was),
                        show(is)
                    )?;
                }
                write!(
                    f,
                    ". Maps pinned by the old layout would be misread: bump RV_ABI_VERSION in \
                     include/rivora/abi.h, plan the pinned-map migration, then re-bless \
                     (re-blessing without the bump is refused)"
                )
            }
            Self::VersionWentBack { recorded, now } => write!(
                f,
                "RV_ABI_VERSION is {now}, but version {recorded} is already recorded: \
                 versions only go up"
            ),
            Self::NotBlessed { version } => write!(
                f,
                "RV_ABI_VERSION {version} is new and its layout is not in \
                 tests/golden/abi_layout.txt: plan the pinned-map migration, then \
                 `RIVORA_BLESS=1 cargo test --test abi_layout`"
            ),
        }
    }
}

/// Check `layout` at `version` against `golden`. Ok(None): nothing to
/// write. Ok(Some(text)): the snapshot to write (only when blessing a new
/// version). A changed layout under a recorded version is an error
/// whether or not `bless` is set.
fn bless_or_check(
    golden: &Golden,
    version: u32,
    layout: &str,
    bless: bool,
) -> Result<Option<String>, LayoutError> {
    let now = fnv1a64(layout);
    if let Some(&recorded) = golden.history.get(&version) {
        if recorded != now {
            let first_difference = (version == golden.version).then(|| {
                let (mut was, mut is) = (golden.layout.lines(), layout.lines());
                loop {
                    match (was.next(), is.next()) {
                        (a, b) if a != b => break (a.map(String::from), b.map(String::from)),
                        (None, None) => break (None, None),
                        _ => {}
                    }
                }
            });
            return Err(LayoutError::ChangedUnderVersion {
                version,
                recorded,
                now,
                first_difference,
            });
        }
    }
    if version < golden.version {
        return Err(LayoutError::VersionWentBack {
            recorded: golden.version,
            now: version,
        });
    }
    if version == golden.version {
        return Ok(None);
    }
    if !bless {
        return Err(LayoutError::NotBlessed { version });
    }
    let mut next = golden.clone();
    next.history.insert(version, now);
    next.version = version;
    next.layout = layout.to_string();
    Ok(Some(next.render()))
}

/// The guard itself, on layouts made up here.
#[test]
fn a_layout_change_needs_a_version_bump() {
    let v1 = "rv_a size=8 x@0:4 y@4:4\nrv_b size=4 z@0:4\n";
    let v1_changed = "rv_a size=8 x@0:4 y@4:4\nrv_b size=8 z@0:8\n";
    let golden = Golden {
        history: [(1, fnv1a64(v1))].into(),
        version: 1,
        layout: v1.to_string(),
    };
    let text = golden.render();
    assert_eq!(
        Golden::parse(&text),
        Ok(golden.clone()),
        "round trip: {text}"
    );

    // Unchanged: nothing to do, blessed or not.
    for bless in [false, true] {
        assert_eq!(bless_or_check(&golden, 1, v1, bless), Ok(None));
    }

    // Changed under the same version: refused, blessing or not, naming
    // the version, both hashes and the line that changed.
    for bless in [false, true] {
        let e = bless_or_check(&golden, 1, v1_changed, bless).expect_err("same version");
        assert_eq!(
            e,
            LayoutError::ChangedUnderVersion {
                version: 1,
                recorded: fnv1a64(v1),
                now: fnv1a64(v1_changed),
                first_difference: Some((
                    Some("rv_b size=4 z@0:4".into()),
                    Some("rv_b size=8 z@0:8".into())
                )),
            }
        );
        let msg = e.to_string();
        for needle in [
            "RV_ABI_VERSION 1".to_string(),
            format!("{:016x}", fnv1a64(v1)),
            format!("{:016x}", fnv1a64(v1_changed)),
            "`rv_b size=4 z@0:4` is now `rv_b size=8 z@0:8`".to_string(),
            "bump RV_ABI_VERSION".to_string(),
        ] {
            assert!(msg.contains(&needle), "{msg:?} lacks {needle:?}");
        }
    }
    // A type added at the end is a change too.
    let added = format!("{v1}rv_c size=4 w@0:4\n");
    assert!(matches!(
        bless_or_check(&golden, 1, &added, true),
        Err(LayoutError::ChangedUnderVersion {
            first_difference: Some((None, Some(_))),
            ..
        })
    ));

    // Bumped: refused until blessed; blessing records the new version
    // beside the old one, and the written file then checks clean.
    assert_eq!(
        bless_or_check(&golden, 2, v1_changed, false),
        Err(LayoutError::NotBlessed { version: 2 })
    );
    let written = bless_or_check(&golden, 2, v1_changed, true)
        .expect("a bumped version blesses")
        .expect("something to write");
    let g2 = Golden::parse(&written).expect("the blessed file parses");
    assert_eq!(
        g2.history,
        [(1, fnv1a64(v1)), (2, fnv1a64(v1_changed))].into()
    );
    assert_eq!((g2.version, g2.layout.as_str()), (2, v1_changed));
    assert_eq!(bless_or_check(&g2, 2, v1_changed, false), Ok(None));
    // Version 1's layout stays fixed in the history: going back to it,
    // or to any earlier number, is refused; so is changing it again.
    assert_eq!(
        bless_or_check(&g2, 1, v1, true),
        Err(LayoutError::VersionWentBack {
            recorded: 2,
            now: 1
        })
    );
    assert!(matches!(
        bless_or_check(&g2, 1, v1_changed, true),
        Err(LayoutError::ChangedUnderVersion {
            version: 1,
            first_difference: None,
            ..
        })
    ));
    // A bump without a layout change is fine (a change of meaning).
    assert!(matches!(
        bless_or_check(&g2, 3, v1_changed, true),
        Ok(Some(_))
    ));

    // A hand edit of the layout lines that skips the bump is caught when
    // the file is read.
    let edited = text.replace("rv_b size=4 z@0:4", "rv_b size=8 z@0:8");
    assert!(
        Golden::parse(&edited)
            .expect_err("hash mismatch")
            .contains("does not match its recorded hash"),
        "{edited}"
    );
    let edited = text.replace("abi_version=1", "abi_version=2");
    assert!(Golden::parse(&edited).is_err(), "{edited}");
}

/// rivora-model cannot link the skeleton, so it mirrors the capacities
/// its validator checks; a mirror that drifted from `rv_limits` would
/// accept files the maps cannot hold (or refuse ones they can).
#[test]
fn the_models_capacities_are_the_abis() {
    use rivora::model;
    assert_eq!(model::MAX_VIPS, MAX_VIPS as usize, "RV_MAX_VIPS");
    assert_eq!(
        model::MAX_BACKENDS,
        MAX_BACKENDS as usize,
        "RV_MAX_BACKENDS"
    );
    assert_eq!(
        model::MAGLEV_DEFAULT_SIZE,
        MAGLEV_DEFAULT_SIZE,
        "RV_MAGLEV_DEFAULT_SIZE"
    );
    assert_eq!(
        model::MAX_IFACES,
        rv_limits::RV_MAX_IFACES.0 as usize,
        "RV_MAX_IFACES"
    );
    // The population keeps runs of one backend shorter than the window
    // the datapath steps over.
    assert_eq!(
        rivora::maglev::PROBE_WINDOW,
        MAGLEV_PROBES as usize,
        "RV_MAGLEV_PROBES"
    );
    // The largest slice rebuilds next to itself in the default table.
    const { assert!(2 * rivora::maglev::MAX_SLICE <= MAGLEV_DEFAULT_SIZE) };
}
