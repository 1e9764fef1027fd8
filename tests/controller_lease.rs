//! rivora-controller's leader election against a real API server: one
//! leader among replicas, and a leader cut off from the API server stops
//! writing before another replica can take the Lease.

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::k8s::{shared, write_kubeconfig, ApiProxy, ApiState, Identity, Kube};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::Client;
use rivora_controller::leader::{Election, Leadership, LeaseSettings};

async fn client(kubeconfig: &Path) -> Client {
    let kc = Kubeconfig::read_from(kubeconfig).expect("a kubeconfig");
    let cfg = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("a client config");
    Client::try_from(cfg).expect("a client")
}

/// When `l` first says `want`, within `within`.
async fn when(l: &Leadership, want: bool, within: Duration) -> Instant {
    let mut rx = l.receiver();
    tokio::time::timeout(within, rx.wait_for(|v| *v == want))
        .await
        .unwrap_or_else(|_| panic!("leadership never became {want} within {within:?}"))
        .expect("the election runs");
    Instant::now()
}

#[test]
fn one_leader_and_a_cut_off_leader_stops_before_another_takes_over() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("rivora_lease=debug")
        .with_test_writer()
        .try_init();
    let sh = shared();
    let kube = Kube::admin();
    let ns = kube.namespace("lease-");
    let proxy = ApiProxy::start_here(sh.addr);
    let dir = tempfile::tempdir().expect("a temp dir");
    let via_proxy = dir.path().join("a.kubeconfig");
    write_kubeconfig(&via_proxy, &proxy.url(), &Identity::admin());
    let settings = |identity: &str| LeaseSettings {
        duration: Duration::from_secs(4),
        renew_deadline: Duration::from_secs(3),
        retry_period: Duration::from_secs(1),
        ..LeaseSettings::new(ns.name.clone(), "rivora-controller", identity)
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        let (ea, la) = Election::start(client(&via_proxy).await, &settings("a"))
            .await
            .expect("replica a's election");
        when(&la, true, Duration::from_secs(15)).await;
        let (eb, lb) = Election::start(client(&sh.server.kubeconfig).await, &settings("b"))
            .await
            .expect("replica b's election");
        // Never two leaders: sampled all along.
        let both_led = Arc::new(AtomicUsize::new(0));
        let overlap = {
            let (la, lb, both_led) = (la.clone(), lb.clone(), both_led.clone());
            tokio::spawn(async move {
                loop {
                    if la.leads() && lb.leads() {
                        both_led.fetch_add(1, Ordering::Relaxed);
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
        };
        // Two renewals of a's later, still one leader.
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert!(
            la.leads() && !lb.leads(),
            "a {} b {}",
            la.leads(),
            lb.leads()
        );

        // a's API server hangs: its renewals go nowhere (and land, late,
        // once it is up again). a must stop before b can take over.
        let cut = Instant::now();
        proxy.set(ApiState::Hung);
        let a_stopped = when(&la, false, Duration::from_secs(10)).await;
        let b_started = when(&lb, true, Duration::from_secs(20)).await;
        assert!(
            a_stopped < b_started,
            "b led {:?} before a stopped",
            a_stopped - b_started
        );
        // At most the renew deadline after a's last renewal was sent,
        // which was before the cut.
        assert!(
            a_stopped - cut <= Duration::from_millis(3_250),
            "a wrote on for {:?} after it was cut off",
            a_stopped - cut
        );
        eprintln!(
            "a stopped {:?} after the cut, b led {:?} after that",
            a_stopped - cut,
            b_started - a_stopped
        );

        // a back: whichever holds the Lease now, one of them leads.
        proxy.set(ApiState::Up);
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(
            la.leads() != lb.leads(),
            "a {} b {}: one leader",
            la.leads(),
            lb.leads()
        );

        // The leader shuts down gracefully: it releases the Lease, and
        // the other takes it without waiting for it to expire.
        let (leader, other, other_l) = if la.leads() {
            (ea, eb, lb)
        } else {
            (eb, ea, la)
        };
        let released = Instant::now();
        leader.stop().await;
        let again = when(&other_l, true, Duration::from_secs(10)).await;
        assert!(
            again - released < Duration::from_secs(4),
            "the other took {:?}: the Lease was not released",
            again - released
        );
        other.stop().await;
        assert!(!other_l.leads());
        overlap.abort();
        let both = both_led.load(Ordering::Relaxed);
        assert_eq!(both, 0, "both replicas led at once in {both} samples");
    });
}
