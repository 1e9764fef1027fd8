//! `rivorad_rss_mib_full_scale`: the resident memory of the real rivorad
//! (the release build next to this binary) serving a configuration at the
//! ABI's full scale, 4,096 VIPs and 8,192 backends, health checks off
//! (target: at most 64 MiB). Also prints how long it took to start.
//!
//! rivorad runs in a throwaway network namespace with one veth pair to
//! attach to, its pins in a private directory; everything is removed on
//! the way out, also on error.
//!
//! `api_status_p99_ms_during_full_apply`: with that rivorad, the file is
//! rewritten so that every VIP's Maglev slice changes (one backend's
//! weight flips between 1 and 2) and reloaded through the API, several
//! times; meanwhile `GET /v1/status` is polled every 10 ms. The p99 of
//! the polls made while a reload was under way (target: at most 20 ms).

use std::fmt::Write as _;
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use rivora::abi;
use rivora::api::client::Client;

use rivora_testlab::try_sh;

use crate::Results;

const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// Everything the bench creates, removed on drop: rivorad (SIGTERM, then
/// SIGKILL), its pins, the namespace, the work directory.
struct Scratch {
    ns: String,
    dir: PathBuf,
    pin_dir: PathBuf,
    child: Option<Child>,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            crate::signal_child(&c, nix::sys::signal::Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(10);
            while matches!(c.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = rivora::daemon::cleanup(&self.pin_dir);
        let _ = fs::remove_dir_all(&self.pin_dir);
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).output();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Full re-applies measured, and the status poll period during them.
const APPLY_ROUNDS: usize = 6;
const POLL_EVERY: Duration = Duration::from_millis(10);

/// 4,096 NAT VIPs of 2 backends each (8,192 backends), probing off. The
/// first backend's weight is `weight`: changing it changes every slice.
fn full_scale_config(socket: &Path, weight: u32) -> String {
    let mut y = format!(
        "interfaces:\n  - name: v0\n    xdpMode: native\napi:\n  socket: {}\nvips:\n",
        socket.display()
    );
    for i in 0..abi::MAX_VIPS {
        let (hi, lo) = (i >> 8, i & 0xff);
        let _ = write!(
            y,
            "  - address: 10.0.{hi}.{lo}\n    port: 80\n    protocol: tcp\n    mode: nat\n    \
             healthCheck: false\n    backends:\n      - {{ address: 10.1.{hi}.{lo}, port: 8080, weight: {weight} }}\n      \
             - {{ address: 10.2.{hi}.{lo}, port: 8080 }}\n"
        );
    }
    y
}

/// VmRSS of `pid`, in KiB.
fn rss_kib(pid: u32) -> Result<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no VmRSS in /proc/PID/status")
}

pub fn run(results: &mut Results) -> Result<()> {
    let exe = std::env::current_exe().context("locating rivora-bench")?;
    let rivorad = exe
        .parent()
        .context("rivora-bench has no directory")?
        .join("rivorad");
    ensure!(
        rivorad.exists(),
        "{} is missing: build it with `cargo build --release --bins`",
        rivorad.display()
    );
    let id = std::process::id();
    let mut s = Scratch {
        ns: format!("rvbench-daemon-{id}"),
        dir: std::env::temp_dir().join(format!("rivora-bench-daemon-{id}")),
        pin_dir: PathBuf::from(format!("/sys/fs/bpf/rivora-bench-daemon-{id}")),
        child: None,
    };
    let _ = fs::remove_dir_all(&s.dir);
    fs::create_dir_all(&s.dir).context("creating the work directory")?;
    let _ = Command::new("ip").args(["netns", "del", &s.ns]).output();
    try_sh(&format!("ip netns add {}", s.ns))?;
    try_sh(&format!(
        "nsenter --net=/run/netns/{} sh -c 'ip link add v0 type veth peer name v1 && ip link set v1 up && ip link set v0 up'",
        s.ns
    ))?;

    let config = s.dir.join("rivora.yaml");
    let socket = s.dir.join("rivorad.sock");
    fs::write(&config, full_scale_config(&socket, 1)).context("writing the config")?;
    let log = s.dir.join("rivorad.log");
    let out = File::create(&log).context("creating the log")?;
    let err = out.try_clone().context("cloning the log fd")?;
    let started = Instant::now();
    let child = Command::new("nsenter")
        .arg(format!("--net=/run/netns/{}", s.ns))
        .arg(&rivorad)
        .arg("-config")
        .arg(&config)
        .arg("-pin-dir")
        .arg(&s.pin_dir)
        .args(["-log-format", "json"])
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .context("starting rivorad")?;
    let pid = child.id();
    s.child = Some(child);
    loop {
        let text = fs::read_to_string(&log).unwrap_or_default();
        if text.contains("\"message\":\"ready\"") {
            ensure!(
                text.contains(&format!("\"created\":{}", abi::MAX_VIPS)),
                "rivorad did not create {} VIPs:\n{text}",
                abi::MAX_VIPS
            );
            break;
        }
        if let Some(c) = s.child.as_mut() {
            if let Some(st) = c.try_wait().context("waiting for rivorad")? {
                bail!("rivorad exited ({st}) before it was ready:\n{text}");
            }
        }
        if started.elapsed() > READY_TIMEOUT {
            bail!("rivorad not ready within {READY_TIMEOUT:?}:\n{text}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let start_ms = started.elapsed().as_secs_f64() * 1000.0;
    // Settled: the highest of a few samples over a second.
    let mut rss = 0;
    for _ in 0..10 {
        rss = rss.max(rss_kib(pid)?);
        std::thread::sleep(Duration::from_millis(100));
    }
    results.set("rivorad_rss_mib_full_scale", rss as f64 / 1024.0);
    println!("  (rivorad start to ready at full scale: {start_ms:.0} ms)");
    results.note(format!(
        "rivorad_rss_mib_full_scale: VmRSS of rivorad with {} VIPs x 2 backends, probes off, \
         after ready (target <= 64); start to ready took {start_ms:.0} ms",
        abi::MAX_VIPS
    ));
    status_during_applies(&config, &socket, results)
}

/// Poll the status while full-scale reloads run; the p99 of the polls
/// that overlapped a reload.
fn status_during_applies(config: &Path, socket: &Path, results: &mut Results) -> Result<()> {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    let client = Client::unix(socket).with_timeout(Duration::from_secs(60));
    let reloading = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicBool::new(false));
    let poller = {
        let (reloading, done) = (reloading.clone(), done.clone());
        let client = Client::unix(socket).with_timeout(Duration::from_secs(60));
        std::thread::spawn(move || -> Result<(Vec<f64>, usize)> {
            let mut during = Vec::new();
            let mut saw_applying = 0;
            while !done.load(Ordering::Acquire) {
                let overlapping = reloading.load(Ordering::Acquire);
                let t = Instant::now();
                let st = client.status().context("GET /v1/status")?;
                let ms = t.elapsed().as_secs_f64() * 1000.0;
                if overlapping || reloading.load(Ordering::Acquire) {
                    during.push(ms);
                    saw_applying += usize::from(st.apply_in_progress);
                }
                std::thread::sleep(POLL_EVERY.saturating_sub(t.elapsed()));
            }
            Ok((during, saw_applying))
        })
    };
    let mut apply_ms = Vec::new();
    let result = (|| -> Result<()> {
        for round in 0..APPLY_ROUNDS {
            let weight = if round % 2 == 0 { 2 } else { 1 };
            fs::write(config, full_scale_config(socket, weight)).context("rewriting the config")?;
            reloading.store(true, Ordering::Release);
            let t = Instant::now();
            let r = client.reload();
            apply_ms.push(t.elapsed().as_secs_f64() * 1000.0);
            reloading.store(false, Ordering::Release);
            let r = r.context("POST /v1/reload")?;
            ensure!(r.ok, "reload failed: {:?}", r.error);
            // Let the file watcher's own reload of the same file (no
            // change for the maps) pass before the next round.
            std::thread::sleep(Duration::from_millis(1500));
        }
        Ok(())
    })();
    done.store(true, Ordering::Release);
    let (mut during, saw_applying) = poller
        .join()
        .map_err(|_| anyhow::anyhow!("the status poller panicked"))??;
    result?;
    ensure!(!during.is_empty(), "no status poll overlapped a reload");
    during.sort_by(|a, b| a.total_cmp(b));
    let p99 = during[((during.len() as f64 * 0.99).ceil() as usize).clamp(1, during.len()) - 1];
    apply_ms.sort_by(|a, b| a.total_cmp(b));
    let apply_median = apply_ms[apply_ms.len() / 2];
    results.set("api_status_p99_ms_during_full_apply", p99);
    results.note(format!(
        "api_status_p99_ms_during_full_apply: p99 of {} GET /v1/status polls (every {} ms) \
         made during {APPLY_ROUNDS} full-scale reloads (every slice changes; median reload \
         {apply_median:.0} ms); {saw_applying} of them answered while map writes were under \
         way (target <= 20)",
        during.len(),
        POLL_EVERY.as_millis()
    ));
    Ok(())
}
