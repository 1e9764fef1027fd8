//! The controller's metrics and its health endpoints: `/metrics`,
//! `/healthz` (the process answers) and `/readyz` (every watch has
//! listed; a follower is ready too, so that it can take over at once).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use rivora_api::{serve_routes, ConnLimits, ServeError, ServerHandle, METRICS_CONTENT_TYPE};
use warp::filters::BoxedFilter;
use warp::http::{header, HeaderValue, StatusCode};
use warp::reply::Response;
use warp::Filter;

use crate::ipam::PoolGauges;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabels {
    pub pool: String,
    pub family: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabels {
    /// `service` or `pool`.
    pub kind: String,
    /// `ok`, `conflict` (the object changed under the write: planned
    /// again) or `error`.
    pub result: String,
}

pub struct Metrics {
    registry: Mutex<Registry>,
    pub is_leader: Gauge,
    pub assigned: Family<PoolLabels, Gauge>,
    pub available: Family<PoolLabels, Gauge>,
    pub writes: Family<WriteLabels, Counter>,
    pub reconcile_errors: Counter,
    pub ready: AtomicBool,
    /// What is not ready yet, for `/readyz`'s answer.
    pub not_ready: Mutex<String>,
}

impl Metrics {
    pub fn new() -> Arc<Self> {
        let mut registry = Registry::with_prefix("rivora_controller");
        let is_leader = Gauge::default();
        registry.register(
            "is_leader",
            "1 while this replica holds the Lease and may write",
            is_leader.clone(),
        );
        let assigned = Family::<PoolLabels, Gauge>::default();
        registry.register(
            "pool_addresses_assigned",
            "Addresses of a pool held by Services (the leader's count)",
            assigned.clone(),
        );
        let available = Family::<PoolLabels, Gauge>::default();
        registry.register(
            "pool_addresses_available",
            "Addresses of a pool free to assign, saturating at 2^63-1 (the leader's count)",
            available.clone(),
        );
        let writes = Family::<WriteLabels, Counter>::default();
        registry.register("status_writes", "Status writes sent", writes.clone());
        let reconcile_errors = Counter::default();
        registry.register(
            "reconcile_errors",
            "Status writes that failed for another reason than a conflict",
            reconcile_errors.clone(),
        );
        Arc::new(Self {
            registry: Mutex::new(registry),
            is_leader,
            assigned,
            available,
            writes,
            reconcile_errors,
            ready: AtomicBool::new(false),
            not_ready: Mutex::new("the watches have not listed yet".into()),
        })
    }

    pub fn set_pools(&self, g: &PoolGauges) {
        self.assigned.clear();
        self.available.clear();
        let sat = |n: u128| i64::try_from(n).unwrap_or(i64::MAX);
        for ((pool, family), (a, f)) in g {
            let l = PoolLabels {
                pool: pool.clone(),
                family: (*family).to_string(),
            };
            self.assigned.get_or_create(&l).set(sat(*a));
            self.available.get_or_create(&l).set(sat(*f));
        }
    }

    pub fn wrote(&self, kind: &str, result: &str) {
        self.writes
            .get_or_create(&WriteLabels {
                kind: kind.into(),
                result: result.into(),
            })
            .inc();
        if result == "error" {
            self.reconcile_errors.inc();
        }
    }

    pub fn set_ready(&self, ready: bool, why: &str) {
        self.ready.store(ready, Ordering::Relaxed);
        if let Ok(mut n) = self.not_ready.lock() {
            *n = why.to_string();
        }
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Ok(r) = self.registry.lock() {
            // Writing into a String cannot fail.
            let _ = encode(&mut out, &r);
        }
        out
    }
}

/// The routes: `/metrics`, `/healthz`, `/readyz`.
pub fn routes(m: Arc<Metrics>) -> BoxedFilter<(Response,)> {
    let text = |status: StatusCode, body: String| {
        let mut r = Response::new(body.into());
        *r.status_mut() = status;
        r
    };
    let metrics = {
        let m = m.clone();
        warp::path!("metrics").and(warp::get()).map(move || {
            let mut r = Response::new(m.encode().into());
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static(METRICS_CONTENT_TYPE),
            );
            r
        })
    };
    let healthz = warp::path!("healthz")
        .and(warp::get())
        .map(move || text(StatusCode::OK, "ok\n".into()));
    let readyz = warp::path!("readyz").and(warp::get()).map(move || {
        if m.ready.load(Ordering::Relaxed) {
            text(StatusCode::OK, "ok\n".into())
        } else {
            let why = m.not_ready.lock().map(|w| w.clone()).unwrap_or_default();
            text(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not ready: {why}\n"),
            )
        }
    });
    metrics
        .or(healthz)
        .unify()
        .or(readyz)
        .unify()
        .or(warp::any().map(move || text(StatusCode::NOT_FOUND, "not found\n".into())))
        .unify()
        .boxed()
}

/// Serve [`routes`] on `addr`, with the API's connection limits.
pub async fn serve(addr: SocketAddr, m: Arc<Metrics>) -> Result<ServerHandle, ServeError> {
    serve_routes(addr, routes(m), ConnLimits::METRICS, "metrics and health").await
}
