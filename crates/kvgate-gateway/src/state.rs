//! State shared by every task of one gateway: config, pod table, router state, metrics, the
//! decision log and the upstream HTTP client.
//!
//! The core's decision state (router, prefix index, predictor, RNG) is single-threaded by
//! design, so it sits behind one mutex held only for a decision or a training sample
//! (microseconds), never across an `.await`.

use crate::config::GatewayConfig;
use crate::decisions::DecisionLog;
use crate::metrics::Metrics;
use crate::pods::PodTable;
use arc_swap::ArcSwap;
use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kvgate_core::index::PrefixIndex;
use kvgate_core::index::engine::HybridIndex;
use kvgate_core::predictor::{LatencyPredictor, PredictorConfig};
use kvgate_core::{DecisionRng, Router};
use parking_lot::Mutex;
use rand::SeedableRng;
use std::sync::Arc;
use std::time::Duration;

/// The upstream client (hyper-util legacy: pooled keep-alive, frame-by-frame bodies).
pub type UpstreamClient = Client<HttpConnector, Full<Bytes>>;

/// The core's single-threaded decision state.
pub struct RouterState {
    pub router: Router,
    /// Routed index for every pod, engine index for pods with live KV events.
    pub index: HybridIndex,
    pub predictor: LatencyPredictor,
    pub rng: DecisionRng,
}

pub struct Shared {
    config: ArcSwap<GatewayConfig>,
    pub pods: PodTable,
    pub router: Mutex<RouterState>,
    pub metrics: Metrics,
    pub decisions: DecisionLog,
    pub client: UpstreamClient,
    /// `--capture FILE`, when given.
    pub capture: std::sync::OnceLock<Arc<crate::capture::Capture>>,
    /// Slots and queue of the traffic listener (sized at start).
    pub admission: crate::limits::Admission,
    /// Set by [`crate::Gateway::shutdown`]: `/readyz` answers 503.
    pub shutting_down: std::sync::atomic::AtomicBool,
}

/// A fresh predictor with the configured model; tree models train in the background
/// ([`crate::trainer`]).
pub fn predictor_for(router: &kvgate_core::RouterConfig) -> LatencyPredictor {
    LatencyPredictor::new(PredictorConfig {
        model: router.predictor_model,
        gbdt_background_training: true,
        ..PredictorConfig::default()
    })
}

impl Shared {
    pub fn new(config: GatewayConfig) -> Arc<Shared> {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(config.connect_timeout));
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .pool_max_idle_per_host(1024)
            .build(connector);
        let router_state = RouterState {
            router: Router::new(config.router, config.policy),
            index: HybridIndex::new(),
            predictor: predictor_for(&config.router),
            rng: DecisionRng::seed_from_u64(config.seed),
        };
        Arc::new(Shared {
            admission: crate::limits::Admission::new(
                config.max_concurrent_requests,
                config.max_queued_requests,
            ),
            decisions: DecisionLog::new(config.decision_log_size),
            config: ArcSwap::from_pointee(config),
            pods: PodTable::default(),
            router: Mutex::new(router_state),
            metrics: Metrics::new(),
            client,
            capture: std::sync::OnceLock::new(),
            shutting_down: std::sync::atomic::AtomicBool::new(false),
        })
    }

    pub fn config(&self) -> arc_swap::Guard<Arc<GatewayConfig>> {
        self.config.load()
    }

    /// Applies a new config: pods added/removed (a removed pod's index entries go away, an
    /// added pod gets a scrape loop), router rebuilt if its parameters or policy changed.
    /// Listener addresses are not changed. Returns the added pods (the caller starts their
    /// scrape loops).
    pub fn apply_config(&self, new: GatewayConfig) -> Vec<Arc<crate::pods::Pod>> {
        let old = self.config.load_full();
        let changes = self
            .pods
            .replace(&new.pods, new.router.lru_capacity_per_server);
        {
            let mut st = self.router.lock();
            for pod in &changes.removed {
                st.index.remove_pod(pod.id);
            }
            if old.router != new.router || old.policy != new.policy {
                st.router = Router::new(new.router, new.policy);
            }
            if old.router.predictor_model != new.router.predictor_model {
                st.predictor = predictor_for(&new.router);
            }
        }
        for pod in &changes.removed {
            tracing::info!(pod = %pod.url, "pod removed");
        }
        for pod in &changes.added {
            tracing::info!(pod = %pod.url, class = %pod.class, id = pod.id.0, "pod added");
        }
        self.config.store(Arc::new(new));
        changes.added
    }

    /// The admin `/metrics` body (OpenMetrics text), gauges refreshed first.
    pub fn metrics_text(&self) -> Result<String, std::fmt::Error> {
        self.refresh_gauges();
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.metrics.registry)?;
        Ok(text)
    }

    /// Refreshes the gauges computed from state (called before encoding `/metrics`).
    pub fn refresh_gauges(&self) {
        let m = &self.metrics;
        m.active_requests
            .set(i64::try_from(self.admission.active()).unwrap_or(i64::MAX));
        m.queued_requests
            .set(i64::try_from(self.admission.queued()).unwrap_or(i64::MAX));
        for pod in self.pods.all().iter() {
            let label = pod.label();
            let f = pod.in_flight.load();
            m.pod_healthy
                .get_or_create(&label)
                .set(i64::from(pod.is_healthy()));
            m.in_flight_requests
                .get_or_create(&label)
                .set(i64::from(f.requests));
            m.in_flight_prefill_tokens
                .get_or_create(&label)
                .set(i64::try_from(f.prefill_tokens).unwrap_or(i64::MAX));
            m.in_flight_decode_tokens
                .get_or_create(&label)
                .set(i64::try_from(f.decode_tokens).unwrap_or(i64::MAX));
        }
        let (acc, routed_blocks, engine_blocks, stale) = {
            let st = self.router.lock();
            let stale: Vec<bool> = self
                .pods
                .all()
                .iter()
                .map(|p| st.index.engine.is_stale(p.id))
                .collect();
            (
                st.predictor.accuracy(),
                kvgate_core::index::PrefixIndex::indexed_blocks(&st.index.routed),
                kvgate_core::index::PrefixIndex::indexed_blocks(&st.index.engine),
                stale,
            )
        };
        for (pod, stale) in self.pods.all().iter().zip(stale) {
            m.kv_events_stale
                .get_or_create(&pod.label())
                .set(i64::from(stale));
        }
        m.predictor_ttft_mape.set(acc.ttft_mape);
        m.predictor_tpot_mape.set(acc.tpot_mape);
        m.predictor_ttft_p90_coverage.set(acc.ttft_p90_coverage);
        m.predictor_samples
            .set(i64::try_from(acc.samples).unwrap_or(i64::MAX));
        let routed_blocks = i64::try_from(routed_blocks).unwrap_or(i64::MAX);
        let engine_blocks = i64::try_from(engine_blocks).unwrap_or(i64::MAX);
        m.index_blocks
            .set(routed_blocks.saturating_add(engine_blocks));
        m.index_bytes.set(
            routed_blocks
                .saturating_mul(INDEX_BYTES_PER_BLOCK)
                .saturating_add(engine_blocks.saturating_mul(ENGINE_INDEX_BYTES_PER_BLOCK)),
        );
    }
}

/// Memory bound per indexed block of the routed index (ARCHITECTURE.md, measured in the core).
pub const INDEX_BYTES_PER_BLOCK: i64 = 96;
/// Memory bound per indexed block of the engine index (kvgate-core, `tests/engine_index_memory.rs`).
pub const ENGINE_INDEX_BYTES_PER_BLOCK: i64 = 192;
