//! [`Shared`]: one gateway's state, as a composition of the handles that own it — the session
//! ([`SessionHandle`], with the cluster link observing it), the fleet ([`FleetHandle`]: pods,
//! discovery, the upstream client), admission ([`AdmissionHandle`]: slots, body budget, flow,
//! retries, shutdown) and telemetry ([`Telemetry`]: metrics, logs, decisions, traces).
//!
//! A function that needs one or two of them takes those; the request entry points (the HTTP
//! proxy, the ext_proc picker), the admin routes, the start and the spawned tasks take the
//! whole. Two things stay here because every layer reads them and none owns them: the config
//! (swapped whole on reload, read as one snapshot per request) and token mode's tokenizer with
//! its cache (given at start, read by the pipeline and the admin `/debug/score`). Everything is
//! given at start; nothing is set later.
//!
//! Memory: the handles' own bounds (each module says its); the config and tokenizer are fixed
//! in size, the token cache ≤ `--tokenization-cache-mib`.

pub use crate::handles::admission_handle::AdmissionHandle;
pub use crate::handles::fleet_handle::{FleetHandle, UpstreamClient};
pub use crate::handles::session::{ReplicaLink, SessionHandle};
pub use crate::handles::telemetry::Telemetry;

use crate::config::GatewayConfig;
use crate::decisions::{DecisionLog, DecisionRecord};
use crate::metrics::Metrics;
use crate::pods::PodChanges;
use arc_swap::ArcSwap;
use kvgate_core::RouterSession;
use kvgate_core::predictor::PredictorConfig;
use std::sync::Arc;

pub struct Shared {
    config: ArcSwap<GatewayConfig>,
    /// The core's request lifecycle: every decision, charge and training sample goes through
    /// it (its index is routed for every pod, engine for pods with live KV events).
    pub session: SessionHandle,
    pub fleet: FleetHandle,
    pub admission: AdmissionHandle,
    /// Shared apart too: a traffic connection holds only this.
    pub telemetry: Arc<Telemetry>,
    /// Token mode's tokenizer (`--tokenizer FILE`, else the built-in cl100k), given at start.
    pub tokenizer: Option<crate::tokenizer::GatewayTokenizer>,
    /// Token mode's tokenization reuse (`--tokenization-cache-mib`), given at start with the
    /// tokenizer; none, every prompt is tokenized whole.
    pub token_cache: Option<Arc<crate::token_cache::TokenCache>>,
}

/// What a gateway is given at start besides its config; none of it changes afterwards.
#[derive(Default)]
pub struct StartParts {
    pub tokenizer: Option<crate::tokenizer::GatewayTokenizer>,
    pub token_cache: Option<Arc<crate::token_cache::TokenCache>>,
    pub capture: Option<Arc<crate::capture::Capture>>,
    pub otel: Option<crate::otel::Tracing>,
    pub cluster: Option<Arc<dyn ReplicaLink>>,
    /// `--decisions-log FILE`.
    pub decisions_file: Option<crate::jsonl::JsonLines<DecisionRecord>>,
}

impl Shared {
    /// A gateway's state with nothing but its config (tests, tools).
    pub fn new(config: GatewayConfig) -> Arc<Shared> {
        match Shared::with(config, |_| {
            Ok::<_, std::convert::Infallible>(StartParts::default())
        }) {
            Ok(shared) => shared,
            Err(never) => match never {},
        }
    }

    /// A gateway's state with the parts `parts` builds (it sees the metrics, for the parts
    /// that count into them), or `parts`' error.
    pub fn with<E>(
        config: GatewayConfig,
        parts: impl FnOnce(&Metrics) -> Result<StartParts, E>,
    ) -> Result<Arc<Shared>, E> {
        let metrics = Metrics::new();
        let parts = parts(&metrics)?;
        let session = RouterSession::new(
            config.router,
            config.policy,
            PredictorConfig::for_router(&config.router),
            config.seed,
        );
        Ok(Arc::new(Shared {
            session: SessionHandle::new(session, parts.cluster),
            fleet: FleetHandle::new(config.connect_timeout),
            admission: AdmissionHandle::new(
                config.max_concurrent_requests,
                config.max_waiting_requests,
            ),
            telemetry: Arc::new(Telemetry {
                decisions: DecisionLog::new(config.decision_log_size, parts.decisions_file),
                live: crate::live::LiveHistory::default(),
                metrics,
                log_limit: crate::log_limit::LogLimiter::default(),
                capture: parts.capture,
                otel: parts.otel,
            }),
            config: ArcSwap::from_pointee(config),
            tokenizer: parts.tokenizer,
            token_cache: parts.token_cache,
        }))
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
        let new = Arc::new(new);
        let lru = new.router.lru_capacity_per_server;
        let changes = self.fleet.set_configured(&new.pods, lru, |changes| {
            self.session.reconfigure(&old, &new);
            self.forget_removed(changes);
            self.config.store(Arc::clone(&new));
        });
        changes.added
    }

    /// Replaces the discovered pods (`--discovery`): the table becomes the config's pods plus
    /// `pods`, as [`Shared::apply_config`] does. Returns the added pods (the caller starts
    /// their scrape loops).
    pub fn set_discovered(&self, pods: Vec<crate::pods::PodEntry>) -> Vec<Arc<crate::pods::Pod>> {
        let changes = self.fleet.set_discovered(pods, || self.config.load_full());
        self.forget_removed(&changes);
        changes.added
    }

    /// A removed pod's index entries and in-flight counters go away; both kinds of change are
    /// logged.
    fn forget_removed(&self, changes: &PodChanges) {
        self.session.remove_pods(&changes.removed);
        for pod in &changes.removed {
            self.telemetry.metrics.forget_pod(&pod.label());
            tracing::info!(pod = %pod.url, "pod removed");
        }
        for pod in &changes.added {
            tracing::info!(pod = %pod.url, class = %pod.class, role = pod.role.name(), id = pod.id.0, "pod added");
        }
    }

    /// The admin `/metrics` body (OpenMetrics text), gauges refreshed first.
    pub fn metrics_text(&self) -> Result<String, std::fmt::Error> {
        self.refresh_gauges();
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.telemetry.metrics.registry)?;
        Ok(text)
    }

    /// Refreshes the gauges computed from state (called before encoding `/metrics`).
    pub fn refresh_gauges(&self) {
        let m = &self.telemetry.metrics;
        if let Some(c) = self.session.cluster() {
            c.refresh_gauges(&m.cluster);
        }
        m.active_requests
            .set(i64::try_from(self.admission.slots.active()).unwrap_or(i64::MAX));
        m.queued_requests
            .set(i64::try_from(self.admission.slots.queued()).unwrap_or(i64::MAX));
        self.admission.flow.refresh_gauges(&m.flow);
        let pods = self.fleet.pods.all();
        let in_flight: Vec<kvgate_core::InFlight> = {
            let session = self.session.lock();
            pods.iter().map(|p| session.in_flight(p.id)).collect()
        };
        let now = std::time::Instant::now();
        for (pod, f) in pods.iter().zip(in_flight) {
            let label = pod.label();
            m.pod_healthy
                .get_or_create(&label)
                .set(i64::from(pod.is_healthy()));
            m.pod_breaker_open
                .get_or_create(&label)
                .set(i64::from(pod.breaker.is_open(now)));
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
        let (acc, classes, gate, routed_blocks, engine_blocks, stale) = {
            let session = self.session.lock();
            let index = session.index();
            let stale: Vec<bool> = pods.iter().map(|p| index.engine.is_stale(p.id)).collect();
            (
                session.predictor().accuracy(),
                session.predictor().class_reports(),
                session.router().gate_state(),
                kvgate_core::index::PrefixIndex::indexed_blocks(&index.routed),
                kvgate_core::index::PrefixIndex::indexed_blocks(&index.engine),
                stale,
            )
        };
        let now_ms = crate::decisions::unix_ms();
        for (pod, stale) in pods.iter().zip(stale) {
            m.kv_events_stale
                .get_or_create(&pod.label())
                .set(i64::from(stale));
            let last = pod
                .last_kv_batch_unix_ms
                .load(std::sync::atomic::Ordering::Relaxed);
            if last > 0 {
                m.kv_events_last_batch_age_seconds
                    .get_or_create(&pod.label())
                    .set(now_ms.saturating_sub(last) as f64 / 1e3);
            }
        }
        m.predictor_ttft_mape.set(acc.ttft_mape);
        m.predictor_tpot_mape.set(acc.tpot_mape);
        m.predictor_ttft_p90_coverage.set(acc.ttft_p90_coverage);
        m.predictor_samples
            .set(i64::try_from(acc.samples).unwrap_or(i64::MAX));
        for c in &classes {
            let label = crate::metrics::ClassLabel {
                class: c.class.clone(),
            };
            let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
            m.predictor_class_ttft_mape
                .get_or_create(&label)
                .set(c.ttft_recent_error);
            m.predictor_class_tpot_mape
                .get_or_create(&label)
                .set(c.tpot_recent_error);
            m.predictor_class_ttft_p90_coverage
                .get_or_create(&label)
                .set(c.ttft_p90_coverage);
            m.predictor_class_drift
                .get_or_create(&label)
                .set(i64::from(c.drift_active));
            let episodes = m.predictor_class_drift_episodes.get_or_create(&label);
            episodes.inc_by(c.drift_episodes.saturating_sub(episodes.get()));
            m.predictor_class_ttft_samples
                .get_or_create(&label)
                .set(count(c.ttft_samples));
            m.predictor_class_tpot_samples
                .get_or_create(&label)
                .set(count(c.tpot_samples));
        }
        if let Some(g) = gate {
            m.affinity_gate_tau.set(g.affinity_gate_tau);
            m.epsilon_explore_sticky.set(g.epsilon_explore_sticky);
        }
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
