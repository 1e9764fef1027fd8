//! The real `rivoractl` binary against the API server with a fake state.

mod api_support;
mod bins;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;

use api_support::{Fake, B1, VIP4, VIP6, WATCH_ERROR};
use rivora::api::{serve_api, ApiConfig, ServerHandle, TcpApiConfig};

struct Server {
    // Field order: the handle must drop (and stop serving) while the
    // runtime is still alive.
    handle: Option<ServerHandle>,
    rt: tokio::runtime::Runtime,
    fake: Arc<Fake>,
    socket: PathBuf,
    _dir: tempfile::TempDir,
}

impl Server {
    fn start(tcp_token: Option<&str>) -> Self {
        Self::start_in(tempfile::tempdir().unwrap(), tcp_token)
    }

    fn start_in(dir: tempfile::TempDir, tcp_token: Option<&str>) -> Self {
        let socket = dir.path().join("rivorad.sock");
        let tcp = tcp_token.map(|token| {
            let token_file = dir.path().join("token");
            std::fs::write(&token_file, token).unwrap();
            std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).unwrap();
            TcpApiConfig {
                addr: "127.0.0.1:0".parse().unwrap(),
                token_file,
            }
        });
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let fake = Arc::new(Fake::default());
        let cfg = ApiConfig {
            socket_path: socket.clone(),
            tcp,
            ..ApiConfig::default()
        };
        let handle = rt.block_on(serve_api(cfg, fake.clone())).unwrap();
        Server {
            handle: Some(handle),
            rt,
            fake,
            socket,
            _dir: dir,
        }
    }

    fn ctl(&self, args: &[&str]) -> Output {
        run(&self.socket, args)
    }

    fn tcp_addr(&self) -> String {
        self.handle
            .as_ref()
            .unwrap()
            .tcp_addr()
            .unwrap()
            .to_string()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(h) = self.handle.take() {
            self.rt.block_on(h.shutdown());
        }
    }
}

fn run(socket: &Path, args: &[&str]) -> Output {
    Command::new(bins::rivoractl())
        .arg("--socket")
        .arg(socket)
        .args(args)
        .output()
        .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).unwrap()
}

#[track_caller]
fn assert_exit(o: &Output, code: i32) {
    assert_eq!(
        o.status.code(),
        Some(code),
        "stdout: {}\nstderr: {}",
        stdout(o),
        stderr(o)
    );
}

#[test]
fn vip_list_json_is_the_apis_json() {
    let s = Server::start(None);
    let o = s.ctl(&["-o", "json", "vip", "list"]);
    assert_exit(&o, 0);
    let got: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let want = serde_json::to_value(s.fake.all_vips()).unwrap();
    assert_eq!(got, want);
}

#[test]
fn tables_by_default() {
    let s = Server::start(None);

    let o = s.ctl(&["vip", "list"]);
    assert_exit(&o, 0);
    let out = stdout(&o);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    assert!(lines[0].starts_with("VIP "), "{out}");
    assert!(lines[1].starts_with(VIP4), "{out}");
    assert!(lines[2].starts_with(VIP6), "{out}");
    // Aligned: each column starts at the same offset on every line.
    let col = lines[0].find("MODE").unwrap();
    assert_eq!(&lines[1][col..col + 3], "nat");
    assert_eq!(&lines[2][col..col + 3], "dsr");
    // SOURCE last, whole: a Service's kind and name, or unclaimed.
    let col = lines[0].find("SOURCE").unwrap();
    assert!(lines[0].ends_with("NO_BACKEND  SOURCE"), "{out}");
    assert_eq!(&lines[1][col..], "service shop/web");
    assert_eq!(&lines[2][col..], "unclaimed");

    let o = s.ctl(&["vip", "show", VIP6]);
    assert_exit(&o, 0);
    let out = stdout(&o);
    assert!(out.contains("affinity      client_ip\n"), "{out}");
    assert!(out.contains("source        unclaimed\n"), "{out}");
    assert!(out.contains("[2001:db8::10]:53"), "{out}");

    let o = s.ctl(&["status"]);
    assert_exit(&o, 0);
    let out = stdout(&o);
    assert!(out.contains("config generation  3\n"), "{out}");
    assert!(
        out.contains("last reload        FAILED at 2023-11-14T22:13:20Z: rivora.yaml:12"),
        "{out}"
    );
    assert!(out.contains("veth-long-name"), "{out}");
    assert!(out.contains("maglev table       65537 slots\n"), "{out}");
    assert!(
        out.contains("flow tables        131072 entries each (65536 per CPU)\n"),
        "{out}"
    );
    // The sources, then the watches, each a table after a blank line.
    let sources = out
        .split_once("\nSOURCE ")
        .map(|(_, t)| format!("SOURCE {t}"))
        .unwrap_or_else(|| panic!("no sources table: {out}"));
    let sources: Vec<&str> = sources.lines().collect();
    // (The file's last update was in 2023: its age sets the column width.)
    assert_eq!(
        sources[0].split_whitespace().collect::<Vec<_>>(),
        ["SOURCE", "SYNCED", "OBJECTS", "UPDATES", "FAILED", "LAST", "UPDATE", "LAST", "ERROR"],
        "{out}"
    );
    assert!(
        sources[1].starts_with("file     yes           1        3       1  ")
            && sources[1].ends_with(" ago  rivora.yaml:12: vips[1].port: must be 1-65535"),
        "{out}"
    );
    assert_eq!(
        sources[2].split_whitespace().collect::<Vec<_>>(),
        ["service", "no", "1", "4", "0", "2h00m", "ago", "-"],
        "{out}"
    );
    assert_eq!(sources[3], "", "{out}");
    assert_eq!(sources[4], "Kubernetes watches", "{out}");
    assert_eq!(
        sources[5..],
        [
            "RESOURCE        SYNCED  OBJECTS  ERRORS  LAST ERROR",
            "services        yes           1       0  -",
            &format!("endpointslices  no            0       2  5h00m ago: {WATCH_ERROR}"),
        ],
        "{out}"
    );

    let o = s.ctl(&["backend", "list"]);
    assert_exit(&o, 0);
    assert!(stdout(&o).contains("10.0.1.2:8080"), "{}", stdout(&o));

    let o = s.ctl(&["stats"]);
    assert_exit(&o, 0);
    let out = stdout(&o);
    assert!(out.contains("rate_limited"), "{out}");
    assert!(
        !out.contains("no_service"),
        "zero drop reasons are left out: {out}"
    );

    let o = s.ctl(&["-o", "json", "stats"]);
    assert_exit(&o, 0);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["vips"][0]["packets"], 1500);
    assert_eq!(v["drops"]["by_reason"]["rate_limited"], 4);

    let o = s.ctl(&["reload"]);
    assert_exit(&o, 0);
    assert_eq!(stdout(&o), "reload ok at 2023-11-14T22:15:00Z\n");
}

#[test]
fn drain_and_undrain() {
    let s = Server::start(None);
    let o = s.ctl(&["drain", B1, "--vip", VIP4]);
    assert_exit(&o, 0);
    assert_eq!(stdout(&o), format!("drained {B1} on {VIP4}\n"));
    assert!(s
        .fake
        .drained()
        .contains(&(B1.parse().unwrap(), VIP4.to_string())));

    let o = s.ctl(&["drain", B1, "--vip", VIP4]);
    assert_exit(&o, 0);
    assert!(stdout(&o).contains("nothing changed"), "{}", stdout(&o));

    let o = s.ctl(&["-o", "json", "undrain", B1]);
    assert_exit(&o, 0);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["changed"], true);
    assert!(s.fake.drained().is_empty());
}

#[test]
fn api_errors_exit_1_with_the_message() {
    let s = Server::start(None);
    let o = s.ctl(&["vip", "show", "tcp/10.9.9.9:80"]);
    assert_exit(&o, 1);
    assert_eq!(stderr(&o), "rivoractl: no VIP tcp/10.9.9.9:80\n");

    let o = s.ctl(&["drain", "not-a-target"]);
    assert_exit(&o, 1);
    assert!(
        stderr(&o).contains("invalid backend target"),
        "{}",
        stderr(&o)
    );
    assert!(s.fake.calls().is_empty());

    s.fake
        .fail_reload
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let o = s.ctl(&["reload"]);
    assert_exit(&o, 1);
    assert!(
        stderr(&o).contains("running configuration kept"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn usage_errors_exit_2() {
    let s = Server::start(None);
    for args in [
        &["frobnicate"][..],
        &["vip"],
        &["vip", "show"],
        &["-o", "yaml", "status"],
        &["stats", "--interval", "1"],
        &["stats", "--watch", "--interval", "0"],
        &["--address", "127.0.0.1:1", "status"],
    ] {
        let o = s.ctl(args);
        assert_exit(&o, 2);
    }
    assert!(s.fake.calls().is_empty());
}

/// `config validate` runs rivorad's own validator offline: no daemon needed.
#[test]
fn config_validate_uses_the_daemons_validator() {
    let dir = tempfile::tempdir().unwrap();
    // Every example, one per mode.
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut good: Vec<_> = std::fs::read_dir(&examples)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    good.sort();
    assert!(
        good.iter().any(|p| p.ends_with("fullnat.yaml")),
        "examples: {good:?}"
    );
    for good in &good {
        let o = run(
            Path::new("/nonexistent"),
            &["config", "validate", good.to_str().unwrap()],
        );
        assert_exit(&o, 0);
        assert!(stdout(&o).contains("valid"), "{}", stdout(&o));
    }

    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "interfaces: [{name: eth0}]\nvips:\n  - address: 10.0.0.1\n    port: 80\n    protocol: tcp\n    mode: nat\n    backends: [{address: 10.1.0.1, weight: 2000000}]\n",
    )
    .unwrap();
    let o = run(
        Path::new("/nonexistent"),
        &["config", "validate", bad.to_str().unwrap()],
    );
    assert_exit(&o, 1);
    let err = stderr(&o);
    assert!(err.contains("bad.yaml:7"), "names the file and line: {err}");
    assert!(
        err.contains("vips[0].backends[0].weight"),
        "names the field: {err}"
    );
}

#[test]
fn completions() {
    let o = run(Path::new("/nonexistent"), &["completions", "bash"]);
    assert_exit(&o, 0);
    let out = stdout(&o);
    assert!(out.contains("_rivoractl()"), "{out}");
    assert!(out.contains("undrain"), "{out}");
}

#[test]
fn tcp_with_token_file() {
    let s = Server::start(Some("tok-123\n"));
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good");
    let bad = dir.path().join("bad");
    std::fs::write(&good, "tok-123").unwrap();
    std::fs::write(&bad, "tok-124").unwrap();
    let addr = s.tcp_addr();
    let ctl = |token: &Path| {
        Command::new(bins::rivoractl())
            .args(["--address", &addr, "--token-file"])
            .arg(token)
            .args(["-o", "json", "status"])
            .output()
            .unwrap()
    };
    let o = ctl(&good);
    assert_exit(&o, 0);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["version"], "0.1.0-test");

    let o = ctl(&bad);
    assert_exit(&o, 1);
    assert_eq!(stderr(&o), "rivoractl: missing or wrong bearer token\n");

    let o = ctl(&dir.path().join("missing"));
    assert_exit(&o, 1);
    let err = stderr(&o);
    assert!(err.contains("cannot read token file"), "{err}");
    assert_eq!(
        err.matches("os error").count(),
        1,
        "the OS error once: {err}"
    );
}

/// One `--watch` sample's VIP table: per VIP, column name -> value.
fn watch_sample(lines: &[String]) -> BTreeMap<String, BTreeMap<String, String>> {
    let header = lines
        .iter()
        .find(|l| l.starts_with("VIP "))
        .unwrap_or_else(|| panic!("no VIP table in {lines:?}"));
    let cols: Vec<&str> = header.split_whitespace().collect();
    lines
        .iter()
        .filter(|l| l.starts_with(VIP4) || l.starts_with(VIP6))
        .map(|l| {
            let cells: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(cells.len(), cols.len(), "{header}\n{l}");
            let row = cols
                .iter()
                .zip(&cells)
                .map(|(c, v)| (c.to_string(), v.to_string()))
                .collect();
            (cells[0].to_string(), row)
        })
        .collect()
}

/// `stats --watch` reads the counters again at every interval, and its
/// rates are the change between successive samples over the time between
/// them. The fake advances VIP4 by a known step at each read and VIP6 not
/// at all; the time between two samples is at least the interval (rivoractl
/// sleeps that long between them) and at most the time this test has been
/// waiting, so each rate is bounded on both sides, and the packet and byte
/// rates, divided by the same time, must agree with the steps' ratio.
#[test]
fn stats_watch_repeats_with_rates() {
    use api_support::{STEP_BYTES, STEP_PACKETS};
    use std::sync::atomic::Ordering::SeqCst;
    use std::time::{Duration, Instant};

    const INTERVAL: f64 = 0.2;
    const SAMPLES: usize = 3;
    let s = Server::start(None);
    s.fake.advance.store(true, SeqCst);
    let spawned = Instant::now();
    let mut child = Command::new(bins::rivoractl())
        .arg("--socket")
        .arg(&s.socket)
        .args(["stats", "--watch", "--interval", &INTERVAL.to_string()])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Read lines as they come until SAMPLES samples are complete (the
    // next one has begun), or a deadline far above the 0.6 s that takes:
    // a loaded machine only makes it slower, not wrong.
    let (tx, rx) = std::sync::mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut samples: Vec<Vec<String>> = Vec::new();
    while samples.len() <= SAMPLES {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) if line.starts_with("--- ") => samples.push(vec![line]),
            Ok(line) => match samples.last_mut() {
                Some(cur) => cur.push(line),
                None => panic!("output before the first sample's header: {line}"),
            },
            Err(_) => break,
        }
    }
    let waited = spawned.elapsed().as_secs_f64();
    child.kill().unwrap();
    child.wait().unwrap();
    reader.join().unwrap();
    assert!(
        samples.len() > SAMPLES,
        "{SAMPLES} complete samples within the deadline: {samples:#?}"
    );

    let tables: Vec<_> = samples[..SAMPLES]
        .iter()
        .map(|l| watch_sample(l.as_slice()))
        .collect();
    let num = |i: usize, vip: &str, col: &str| -> u64 {
        let v = tables[i]
            .get(vip)
            .and_then(|row| row.get(col))
            .unwrap_or_else(|| panic!("sample {i}: no {col} for {vip}: {:?}", samples[i]));
        v.parse()
            .unwrap_or_else(|_| panic!("sample {i}: {vip} {col} = {v:?}"))
    };
    assert!(
        !tables[0][VIP4].contains_key("PKT/S"),
        "no rate without an earlier sample: {:?}",
        samples[0]
    );
    for (i, at) in samples.iter().enumerate().take(SAMPLES).skip(1) {
        // Repeats: every sample is a new read, one step on.
        assert_eq!(
            num(i, VIP4, "PACKETS"),
            num(i - 1, VIP4, "PACKETS") + STEP_PACKETS,
            "{at:?}"
        );
        assert_eq!(
            num(i, VIP4, "BYTES"),
            num(i - 1, VIP4, "BYTES") + STEP_BYTES,
            "{at:?}"
        );
        assert_eq!(num(i, VIP6, "PACKETS"), num(i - 1, VIP6, "PACKETS"));

        // Rates: step / t with INTERVAL <= t <= waited, rounded.
        let (pps, bps) = (num(i, VIP4, "PKT/S"), num(i, VIP4, "BYTES/S"));
        let most = (STEP_PACKETS as f64 / INTERVAL).round() as u64;
        let least = (STEP_PACKETS as f64 / waited).floor() as u64;
        assert!(
            (least..=most).contains(&pps),
            "PKT/S {pps}: {STEP_PACKETS} packets over {INTERVAL} s to {waited:.2} s \
             gives {least} to {most}: {at:?}"
        );
        // Both rounded from step / t with the same t.
        let ratio = (STEP_BYTES / STEP_PACKETS) as f64;
        assert!(
            (bps as f64 / ratio - pps as f64).abs() <= 0.51,
            "BYTES/S {bps} and PKT/S {pps} are not over the same time: {at:?}"
        );
        assert_eq!(
            (num(i, VIP6, "PKT/S"), num(i, VIP6, "BYTES/S")),
            (0, 0),
            "VIP6's counters stand still: {at:?}"
        );
    }
}

/// The validator's newer refusals reach `config validate` as one short
/// line each: `file:line: field: message` with the value, the limit and
/// the count (issue 12: a 5,000-VIP file passed here, then a reload
/// applied 4,096 of its VIPs).
#[test]
fn config_validate_refuses_what_the_datapath_cannot_hold() {
    let dir = tempfile::tempdir().unwrap();
    let vip = |addr: &str, port: &str, backends: &str| {
        format!("  - {{address: {addr}, port: {port}, protocol: tcp, mode: nat, backends: [{backends}]}}\n")
    };
    let head = "interfaces: [{name: eth0}]\nvips:\n";
    let many: String = (0..5000)
        .map(|i| vip(&format!("10.0.{}.{}", i / 256, i % 256), "80", ""))
        .collect();
    let big: Vec<String> = (0..400)
        .map(|k| format!("{{address: 10.1.{}.{}}}", k / 256, k % 256))
        .collect();
    let cases: Vec<(&str, String, &[&str], &[&str])> = vec![
        (
            "5,000 VIPs",
            format!("{head}{many}"),
            &[],
            &[":4099: vips[4096]: 5000 VIPs, over the datapath's limit of 4096; the first past it is VIP tcp/10.0.16.0:80"],
        ),
        (
            "a backend at the VIP's address",
            format!("{head}{}", vip("10.0.0.1", "80", "{address: 10.1.0.1}, {address: 10.0.0.1}")),
            &[],
            &[":3: vips[0].backends[1].address: VIP tcp/10.0.0.1:80: backend 10.0.0.1 is the VIP's own address"],
        ),
        (
            "a broadcast VIP",
            format!("{head}{}", vip("255.255.255.255", "80", "")),
            &[],
            &[":3: vips[0].address: VIP tcp/255.255.255.255:80: 255.255.255.255 is the broadcast address"],
        ),
        (
            "a single port inside a range",
            format!("{head}{}{}", vip("10.0.0.1", "8000-8100", ""), vip("10.0.0.1", "8080", "")),
            &[],
            &[
                ":4: vips[1].port: VIP tcp/10.0.0.1:8080: port 8080 is also inside the range of VIP tcp/10.0.0.1:8000-8100 (vips[0])",
                "split the range around it (8000-8079 and 8081-8100)",
            ],
        ),
        (
            "a VIP too big for rivorad's -maglev-size",
            format!("{head}{}", vip("10.0.0.1", "80", &big.join(", "))),
            &["--maglev-size", "1021"],
            &[":3: vips[0]: the VIPs need at least 1536 Maglev slots (their smallest slices and room to rebuild the largest), over the table's 1021"],
        ),
    ];
    for (i, (what, text, flags, says)) in cases.iter().enumerate() {
        let file = dir.path().join(format!("case{i}.yaml"));
        std::fs::write(&file, text).unwrap();
        let mut args = vec!["config", "validate", file.to_str().unwrap()];
        args.extend_from_slice(flags);
        let o = run(Path::new("/nonexistent"), &args);
        assert_exit(&o, 1);
        let err = stderr(&o);
        let at = format!("rivoractl: {}:", file.display());
        assert!(err.starts_with(&at), "{what}: {err}");
        for s in *says {
            assert!(err.contains(s), "{what}: {err:?} lacks {s:?}");
        }
        assert_eq!(err.lines().count(), 1, "{what}: one line: {err}");
        assert!(err.len() < 400, "{what}: {} bytes: {err}", err.len());
    }
    // The same file fits the default table, as rivorad without the flag.
    let o = run(
        Path::new("/nonexistent"),
        &[
            "config",
            "validate",
            dir.path().join("case4.yaml").to_str().unwrap(),
        ],
    );
    assert_exit(&o, 0);
}

/// A table big enough for every VIP's smallest slice but not for the
/// slices their weights need: `config validate` accepts the file and
/// warns, naming the VIPs (table and JSON), as `rivorad -check` does.
#[test]
fn config_validate_warns_when_precision_will_be_reduced() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("canaries.yaml");
    let vips: String = (0..85)
        .map(|i| {
            format!(
                "  - {{address: 10.0.0.{i}, port: 80, protocol: tcp, mode: nat, backends: [{{address: 10.1.0.1, weight: 1}}, {{address: 10.1.0.2, weight: 999}}]}}\n"
            )
        })
        .collect();
    std::fs::write(
        &file,
        format!("interfaces: [{{name: eth0}}]\nvips:\n{vips}"),
    )
    .unwrap();
    let path = file.to_str().unwrap();
    let o = run(Path::new("/nonexistent"), &["config", "validate", path]);
    assert_exit(&o, 0);
    let out = stdout(&o);
    assert!(out.contains(": valid: "), "{out}");
    assert!(
        out.contains(
            "\n  warning: the Maglev table (65537 slots, rivorad -maglev-size) is too small for every VIP's weights: 85 VIP(s) will run with reduced precision"
        ),
        "{out}"
    );
    assert!(
        out.contains("vips[0] (tcp/10.0.0.0:80) gets 384 of the 768 slots"),
        "{out}"
    );
    let o = run(
        Path::new("/nonexistent"),
        &["-o", "json", "config", "validate", path],
    );
    assert_exit(&o, 0);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["valid"], true);
    assert_eq!(v["warnings"].as_array().map(Vec::len), Some(1), "{v}");
    // A bigger table: no warning.
    let o = run(
        Path::new("/nonexistent"),
        &["config", "validate", path, "--maglev-size", "131071"],
    );
    assert_exit(&o, 0);
    assert!(!stdout(&o).contains("warning"), "{}", stdout(&o));
}

/// The euid, without a libc binding: /proc/self belongs to it.
fn euid() -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").unwrap().uid()
}

/// Connection failures read as sentences, each naming where rivoractl
/// looked, with no OS error number (let alone twice).
#[test]
fn connection_errors_read_as_sentences() {
    let dir = tempfile::tempdir().unwrap();

    // No socket file at all, and a socket file nobody listens on.
    let absent = dir.path().join("absent.sock");
    let stale = dir.path().join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    for path in [&absent, &stale] {
        let o = run(path, &["status"]);
        assert_exit(&o, 1);
        assert_eq!(
            stderr(&o),
            format!("rivoractl: no rivorad is listening on {}\n", path.display())
        );
    }

    // A closed TCP port.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let token = dir.path().join("token");
    std::fs::write(&token, "t").unwrap();
    let o = Command::new(bins::rivoractl())
        .args(["--address", &format!("127.0.0.1:{port}"), "--token-file"])
        .arg(&token)
        .arg("status")
        .output()
        .unwrap();
    assert_exit(&o, 1);
    assert_eq!(
        stderr(&o),
        format!("rivoractl: no rivorad is listening on 127.0.0.1:{port}\n")
    );

    // Something listens and never answers: the queue holds the connection.
    let silent = dir.path().join("silent.sock");
    let _silent = std::os::unix::net::UnixListener::bind(&silent).unwrap();
    let start = std::time::Instant::now();
    let o = run(&silent, &["--timeout", "1", "status"]);
    assert_exit(&o, 1);
    assert_eq!(
        stderr(&o),
        format!(
            "rivoractl: rivorad did not answer within 1 s on {}\n",
            silent.display()
        )
    );
    assert!(start.elapsed() < std::time::Duration::from_secs(10));

    // Accepted, then closed without a word.
    let closing = dir.path().join("closing.sock");
    let listener = std::os::unix::net::UnixListener::bind(&closing).unwrap();
    let server = std::thread::spawn(move || drop(listener.accept().unwrap()));
    let o = run(&closing, &["status"]);
    server.join().unwrap();
    assert_exit(&o, 1);
    assert_eq!(
        stderr(&o),
        format!(
            "rivoractl: rivorad closed the connection on {} without answering\n",
            closing.display()
        )
    );
}

/// A user who may not use the socket is told so, and who may.
#[test]
fn permission_denied_names_the_socket() {
    use std::os::unix::process::CommandExt;
    // As /run/rivora is: others may enter the directory; the socket is 0600.
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let s = Server::start_in(dir, None);
    let mut cmd = Command::new(bins::rivoractl());
    cmd.arg("--socket").arg(&s.socket).arg("status");
    let owner = if euid() == 0 {
        // Root passes any mode: ask as nobody.
        cmd.uid(65534).gid(65534);
        "root".to_string()
    } else {
        std::fs::set_permissions(&s.socket, std::fs::Permissions::from_mode(0o000)).unwrap();
        format!("uid {}", euid())
    };
    let o = cmd.output().unwrap();
    assert_exit(&o, 1);
    let mode = std::fs::metadata(&s.socket).unwrap().permissions().mode() & 0o7777;
    assert_eq!(
        stderr(&o),
        format!(
            "rivoractl: permission denied on {}: the socket has mode {mode:04o} and belongs to \
             {owner}; run rivoractl as {owner}\n",
            s.socket.display()
        )
    );
    assert!(s.fake.calls().is_empty());
}
