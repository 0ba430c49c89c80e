//! [`FleetHandle`]: the pods the gateway routes to — the pod table (the config's pods and
//! those `--discovery` found, each with its health, breaker and scraped metrics) and the
//! upstream HTTP client every request, scrape and `/v1/models` call goes out through.
//!
//! Memory: ≤ [`crate::pods::MAX_PODS`] pods, each with its last scrape; the client's pool ≤
//! 1,024 idle connections per pod, closed after 60 s idle.

use crate::config::GatewayConfig;
use crate::pods::{PodChanges, PodEntry, PodTable};
use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;

/// The upstream client (hyper-util legacy: pooled keep-alive, frame-by-frame bodies).
pub type UpstreamClient = Client<HttpConnector, Full<Bytes>>;

/// The pods and the client to reach them; see the module docs.
pub struct FleetHandle {
    pub pods: PodTable,
    pub client: UpstreamClient,
    /// Pods found by `--discovery` (routed to besides the config's pods). Its lock also
    /// serialises pod-table updates, so a config reload and a discovery change never race.
    discovered: Mutex<Vec<PodEntry>>,
}

impl FleetHandle {
    /// No pods yet; the client connects within `connect_timeout`.
    pub fn new(connect_timeout: Duration) -> FleetHandle {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(connect_timeout));
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .pool_max_idle_per_host(1024)
            .build(connector);
        FleetHandle {
            pods: PodTable::default(),
            client,
            discovered: Mutex::new(Vec::new()),
        }
    }

    /// Makes the table the `configured` pods plus the discovered ones; `then` runs with the
    /// changes before another update can start (the caller's config swap goes there).
    pub fn set_configured(
        &self,
        configured: &[PodEntry],
        default_kv_blocks: u32,
        then: impl FnOnce(&PodChanges),
    ) -> PodChanges {
        let discovered = self.discovered.lock();
        let changes = self
            .pods
            .replace(&wanted_pods(configured, &discovered), default_kv_blocks);
        then(&changes);
        changes
    }

    /// Replaces the discovered pods: the table becomes the pods of `config()` (read under
    /// the lock, so that a reload in between is not lost) plus `pods`.
    pub fn set_discovered(
        &self,
        pods: Vec<PodEntry>,
        config: impl FnOnce() -> Arc<GatewayConfig>,
    ) -> PodChanges {
        let mut discovered = self.discovered.lock();
        *discovered = pods;
        let cfg = config();
        self.pods.replace(
            &wanted_pods(&cfg.pods, &discovered),
            cfg.router.lru_capacity_per_server,
        )
    }
}

/// The pod table's wanted (url, class) list: configured pods first, then discovered ones.
fn wanted_pods(configured: &[PodEntry], discovered: &[PodEntry]) -> Vec<PodEntry> {
    configured.iter().chain(discovered).cloned().collect()
}
