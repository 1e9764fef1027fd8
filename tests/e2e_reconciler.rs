//! The real rivorad's reconciler seen from outside: readers are never held
//! up by map writes. A reload to the ABI's full scale (4,096 VIPs) runs
//! while `GET /v1/status` is polled through the API; some answers must
//! come while the writes are under way (`apply_in_progress`), from the
//! state before them. A daemon whose API waited on the writer's lock
//! could not answer until the apply had finished.

mod common;

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::netns::Netns;
use common::rivorad::{Home, Rivorad};
use common::unique;
use rivora::abi;
use rivora::api::client::Client;

/// One interface to attach to, `vips` NAT VIPs of two backends each
/// (4,096 x 2 = the ABI's 8,192 backends), probes off.
fn config(home: &Home, vips: u32) -> String {
    let mut y = format!(
        "interfaces:\n  - name: n0\n    xdpMode: native\napi:\n  socket: {}\nvips:\n",
        home.socket().display()
    );
    for i in 0..vips {
        let (hi, lo) = (i >> 8, i & 0xff);
        let _ = write!(
            y,
            "  - address: 10.0.{hi}.{lo}\n    port: 80\n    protocol: tcp\n    mode: nat\n    \
             healthCheck: false\n    backends:\n      - {{ address: 10.1.{hi}.{lo}, port: 8080 }}\n      \
             - {{ address: 10.2.{hi}.{lo}, port: 8080 }}\n"
        );
    }
    y
}

#[test]
fn status_answers_while_a_full_scale_apply_runs() {
    common::require::root_and_tools("e2e_reconciler");
    let node = Netns::new(&unique("rvrec-"));
    node.exec("ip link add n0 type veth peer name n1 && ip link set n0 up && ip link set n1 up");
    let home = Home::new();
    let big = config(&home, abi::MAX_VIPS);
    // The same length as the big one, so that the swap below is one the
    // file watcher cannot see: the reload through the API is the only one.
    let mut small = config(&home, 1);
    small.push('#');
    small.push_str(&" ".repeat(big.len() - small.len()));
    let mut rd = Rivorad::start(&node, home, &small, &[]);
    assert_eq!(rd.generation(), 1);

    let socket = rd.home.socket();
    let polling = Arc::new(AtomicBool::new(true));
    let poller = {
        let polling = polling.clone();
        let client = Client::unix(&socket).with_timeout(Duration::from_secs(60));
        std::thread::spawn(move || {
            // (answered at, apply_in_progress, config_generation, VIPs)
            let mut seen = Vec::new();
            while polling.load(Ordering::Acquire) {
                let st = client.status().expect("GET /v1/status");
                seen.push((
                    Instant::now(),
                    st.apply_in_progress,
                    st.config_generation,
                    st.vip_count,
                ));
                std::thread::sleep(Duration::from_millis(1));
            }
            seen
        })
    };
    // Some polls before the reload, so the poller is surely running.
    std::thread::sleep(Duration::from_millis(100));
    rd.write_config_unseen(&big);
    let client = Client::unix(&socket).with_timeout(Duration::from_secs(120));
    let reload = client.reload().expect("POST /v1/reload");
    let reloaded_at = Instant::now();
    assert!(reload.ok, "{reload:?}");
    std::thread::sleep(Duration::from_millis(100));
    polling.store(false, Ordering::Release);
    let seen = poller.join().expect("the poller");

    let during: Vec<_> = seen.iter().filter(|s| s.1).collect();
    eprintln!(
        "{} status answers, {} while the apply ran",
        seen.len(),
        during.len()
    );
    assert!(
        !during.is_empty(),
        "no status answer came while the 4,096 VIPs were written ({} answers in all)",
        seen.len()
    );
    for (at, _, generation, vips) in &during {
        assert!(
            *at <= reloaded_at,
            "an apply_in_progress answer after the reload"
        );
        // The state before the writes: the answer did not wait for them.
        assert_eq!(
            (*generation, *vips),
            (1, 1),
            "answered from the state before the apply"
        );
    }
    let st = rd.status();
    assert_eq!(st["config_generation"], 2, "{st}");
    assert_eq!(st["vip_count"], abi::MAX_VIPS, "{st}");
    assert_eq!(st["apply_in_progress"], false, "{st}");
    rd.stop();
}
