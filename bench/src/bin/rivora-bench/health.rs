//! `health_probe_cpu_pct_n1000`: the CPU share of one core the health
//! checker uses probing 1,000 backends every second (target: at most 5%).
//!
//! The backends (half TCP listeners, half HTTP servers answering 200) live
//! in a child process, this same binary re-executed with
//! [`SERVER_ENV`] set, so that this process's CPU time (getrusage
//! RUSAGE_SELF) is the checker's alone: its runtime thread, its timers and
//! its sockets' kernel work on the probing side. The kernel work of the
//! servers' side of each loopback connection is charged to the child and
//! printed separately for context.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use nix::sys::resource::{getrlimit, getrusage, setrlimit, Resource, UsageWho};
use nix::sys::time::TimeVal;
use nix::unistd::{sysconf, SysconfVar};
use rivora::healthcheck::{HealthCheckSpec, HealthChecker, Observation, ProbeKind, ProbeTarget};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::Results;

/// Set in the child's environment: serve the backends instead of benching.
pub const SERVER_ENV: &str = "RIVORA_BENCH_HEALTH_SERVERS";

const BACKENDS: usize = 1000;
const INTERVAL: Duration = Duration::from_secs(1);
/// Long enough that the first probes (spread over one interval by the
/// checker's jitter) have all run and the connections are warm.
const WARMUP: Duration = Duration::from_secs(2);
const WINDOW: Duration = Duration::from_secs(10);

pub fn run(results: &mut Results) -> Result<()> {
    raise_nofile_limit()?;
    let mut child = Command::new(std::env::current_exe().context("locating rivora-bench")?)
        .env(SERVER_ENV, "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("starting the backend server process")?;
    let outcome = bench(&mut child, results);
    // The child exits when its stdin closes; kill it only if it does not.
    drop(child.stdin.take());
    let deadline = Instant::now() + Duration::from_secs(5);
    while child
        .try_wait()
        .context("waiting for the server process")?
        .is_none()
    {
        if Instant::now() > deadline {
            child.kill().context("killing the server process")?;
            child.wait().context("reaping the server process")?;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    outcome
}

fn bench(child: &mut Child, results: &mut Results) -> Result<()> {
    let stdout = child.stdout.take().context("server stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let mut addrs = Vec::with_capacity(BACKENDS);
    for _ in 0..BACKENDS {
        let line = lines
            .next()
            .context("server process exited before listing its ports")?
            .context("reading the server's ports")?;
        let addr: SocketAddr = line
            .trim()
            .parse()
            .with_context(|| format!("server printed {line:?}, not an address"))?;
        addrs.push(addr);
    }

    // The checker's own runtime: one worker, as rivorad would give it.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("rivora-health")
        .enable_all()
        .build()
        .context("building the checker runtime")?;
    let probes = Arc::new(AtomicU64::new(0));
    let failures = Arc::new(AtomicU64::new(0));
    let latency_ns = Arc::new(AtomicU64::new(0));
    let observer = {
        let (probes, failures, latency_ns) = (probes.clone(), failures.clone(), latency_ns.clone());
        Arc::new(move |_key: &SocketAddr, obs: &Observation| {
            probes.fetch_add(1, Ordering::Relaxed);
            if !obs.success() {
                failures.fetch_add(1, Ordering::Relaxed);
            }
            let ns = u64::try_from(obs.latency.as_nanos()).unwrap_or(u64::MAX);
            latency_ns.fetch_add(ns, Ordering::Relaxed);
        })
    };
    let (mut checker, _events) = HealthChecker::with_observer(rt.handle().clone(), observer);
    let targets = addrs
        .iter()
        .enumerate()
        .map(|(i, &addr)| {
            let spec = HealthCheckSpec {
                kind: if i % 2 == 0 {
                    ProbeKind::Tcp
                } else {
                    ProbeKind::Http
                },
                interval: INTERVAL,
                timeout: Duration::from_millis(500),
                path: (i % 2 == 1).then(|| "/healthz".to_string()),
                ..HealthCheckSpec::default()
            };
            ProbeTarget::new(addr, spec)
        })
        .collect();
    checker.set_targets(targets).context("setting targets")?;

    std::thread::sleep(WARMUP);
    let (p0, f0, l0) = (
        probes.load(Ordering::Relaxed),
        failures.load(Ordering::Relaxed),
        latency_ns.load(Ordering::Relaxed),
    );
    let cpu0 = self_cpu()?;
    let child0 = process_cpu(child.id())?;
    let t0 = Instant::now();
    std::thread::sleep(WINDOW);
    let wall = t0.elapsed();
    let cpu = self_cpu()? - cpu0;
    let child_cpu = process_cpu(child.id())? - child0;
    let n = probes.load(Ordering::Relaxed) - p0;
    let failed = failures.load(Ordering::Relaxed) - f0;
    let lat = latency_ns.load(Ordering::Relaxed) - l0;
    drop(checker);
    drop(rt);

    // The figure means something only if the probes really ran and passed.
    let expected = BACKENDS as f64 * wall.as_secs_f64() / INTERVAL.as_secs_f64();
    ensure!(
        (n as f64) > expected * 0.95,
        "only {n} probes in {wall:?}, expected about {expected:.0}"
    );
    ensure!(
        failed == 0,
        "{failed} of {n} probes failed against live servers"
    );

    let pct = cpu.as_secs_f64() / wall.as_secs_f64() * 100.0;
    let child_pct = child_cpu.as_secs_f64() / wall.as_secs_f64() * 100.0;
    results.set("health_probe_cpu_pct_n1000", pct);
    results.note(format!(
        "health: {n} probes in {:.1} s ({:.0}/s, half TCP connect, half HTTP GET), 0 failed, \
         mean latency {:.0} us; checker {:.2} s CPU = {pct:.2}% of one core (target <= 5%); \
         the {BACKENDS} servers in their own process used {child_pct:.2}%",
        wall.as_secs_f64(),
        n as f64 / wall.as_secs_f64(),
        lat as f64 / n.max(1) as f64 / 1e3,
        cpu.as_secs_f64(),
    ));
    Ok(())
}

/// This process's user + system CPU time.
fn self_cpu() -> Result<Duration> {
    let ru = getrusage(UsageWho::RUSAGE_SELF).context("getrusage")?;
    let tv = |t: TimeVal| {
        Duration::from_secs(t.tv_sec() as u64) + Duration::from_micros(t.tv_usec() as u64)
    };
    Ok(tv(ru.user_time()) + tv(ru.system_time()))
}

/// Another process's user + system CPU time, from /proc/PID/stat.
fn process_cpu(pid: u32) -> Result<Duration> {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    // Fields after the ")" closing the command name; utime and stime are
    // the 14th and 15th fields of the whole line, in clock ticks.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .with_context(|| format!("parsing {path}"))?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| -> Result<u64> {
        f.get(i)
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("parsing field {} of {path}", i + 3))
    };
    let hz = sysconf(SysconfVar::CLK_TCK)
        .context("sysconf(_SC_CLK_TCK)")?
        .filter(|&hz| hz > 0)
        .context("sysconf(_SC_CLK_TCK) gave no tick rate")?;
    let total = ticks(11)? + ticks(12)?;
    Ok(Duration::from_secs_f64(total as f64 / hz as f64))
}

/// 1,000 listeners and their probes' sockets need more descriptors than a
/// default soft limit of 1,024.
fn raise_nofile_limit() -> Result<()> {
    let (_, max) = getrlimit(Resource::RLIMIT_NOFILE).context("getrlimit")?;
    setrlimit(Resource::RLIMIT_NOFILE, max, max).context("setrlimit")?;
    ensure!(
        max >= 3 * BACKENDS as u64,
        "RLIMIT_NOFILE hard limit {} is below {}",
        max,
        3 * BACKENDS
    );
    Ok(())
}

/// The child: 1,000 loopback listeners, even ones closing each connection
/// (a TCP probe needs only the handshake), odd ones answering an HTTP GET
/// with 200. Prints one address a line, then serves until stdin closes.
pub fn serve_child() -> Result<()> {
    raise_nofile_limit()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("building the server runtime")?;
    rt.block_on(async {
        let mut out = std::io::stdout().lock();
        for i in 0..BACKENDS {
            let listener = TcpListener::bind("127.0.0.1:0")
                .await
                .context("binding a backend listener")?;
            writeln!(
                out,
                "{}",
                listener.local_addr().context("listener address")?
            )
            .context("writing to the parent")?;
            tokio::spawn(serve(listener, i % 2 == 1));
        }
        out.flush().context("writing to the parent")?;
        drop(out);
        // The parent closing our stdin (or dying) ends the benchmark.
        tokio::task::spawn_blocking(|| {
            let _ = std::io::stdin().read_to_end(&mut Vec::new());
        })
        .await
        .context("watching stdin")?;
        Ok(())
    })
}

async fn serve(listener: TcpListener, http: bool) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            // Out of descriptors, most likely: back off rather than spin.
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        if !http {
            continue;
        }
        tokio::spawn(async move {
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
                .await;
        });
    }
}
