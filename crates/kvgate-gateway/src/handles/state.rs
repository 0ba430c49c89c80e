//! State shared by every task of one gateway: config, pod table, router state, metrics, the
//! decision log and the upstream HTTP client.
//!
//! The core's request lifecycle ([`RouterSession`]: router, prefix index, predictor, RNG and
//! in-flight ledger) is single-threaded by design, so it sits behind one mutex held only for a
//! transition (a decision, a first token, a finish: microseconds), never across an `.await`.

use crate::config::GatewayConfig;
use crate::decisions::DecisionLog;
use crate::metrics::{ClusterMetrics, Metrics};
use crate::pods::{Pod, PodTable};
use arc_swap::ArcSwap;
use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kvgate_core::predictor::{LatencyPredictor, PredictorConfig};
use kvgate_core::{BlockHash, RouterSession, TrainingSample};
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;

/// The upstream client (hyper-util legacy: pooled keep-alive, frame-by-frame bodies).
pub type UpstreamClient = Client<HttpConnector, Full<Bytes>>;

/// `--cluster`'s link to the other replicas, as the rest of the gateway uses it: the request
/// transitions [`crate::lifecycle::TicketGuard`] reports, and the gauges refreshed before
/// `/metrics` is encoded. Implemented by [`crate::cluster::Cluster`] (set at start in
/// [`Shared::cluster`]); a trait, so that this module does not depend on the cluster's.
pub trait ReplicaLink: Send + Sync {
    /// A request was routed to `pod` (its prompt's `blocks`); returns its id for the
    /// transitions below.
    fn routed(
        &self,
        shared: &Shared,
        pod: &Pod,
        blocks: &[BlockHash],
        input_tokens: u32,
        prefill_tokens: u64,
    ) -> u64;

    /// The request's first token (with the training sample learnt at it, if any).
    fn first_token(
        &self,
        shared: &Shared,
        request: u64,
        decode_tokens: u64,
        sample: Option<TrainingSample>,
    );

    /// `tokens` more decode tokens.
    fn tokens(&self, shared: &Shared, request: u64, tokens: u64);

    /// The request ended (with its training sample when it completed normally).
    fn finish(&self, shared: &Shared, request: u64, sample: Option<TrainingSample>);

    /// Refreshes `kvgate_cluster_*`'s gauges.
    fn refresh_gauges(&self, m: &ClusterMetrics);

    /// The implementation itself, for [`crate::cluster::Cluster::of`].
    fn into_any(self: Arc<Self>) -> Arc<dyn std::any::Any + Send + Sync>;
}

pub struct Shared {
    config: ArcSwap<GatewayConfig>,
    pub pods: PodTable,
    /// The core's request lifecycle: every decision, charge and training sample goes through
    /// it (its index is routed for every pod, engine for pods with live KV events).
    pub session: Mutex<RouterSession>,
    pub metrics: Metrics,
    /// The rate limit of per-request log lines (the counters in `metrics` stay exact).
    pub log_limit: crate::log_limit::LogLimiter,
    pub decisions: DecisionLog,
    /// The live page's branch counters and sampled history ([`crate::live`]).
    pub live: crate::live::LiveHistory,
    pub client: UpstreamClient,
    /// Token mode's tokenizer (`--tokenizer FILE`, else the built-in cl100k), given at start.
    pub tokenizer: Option<crate::tokenizer::GatewayTokenizer>,
    /// `--cluster`: this replica's membership, given at start ([`crate::cluster::Cluster`];
    /// its tasks start once they can hold the `Shared`).
    pub cluster: Option<Arc<dyn ReplicaLink>>,
    /// Token mode's tokenization reuse (`--tokenization-cache-mib`), given at start with the
    /// tokenizer; none, every prompt is tokenized whole.
    pub token_cache: Option<Arc<crate::token_cache::TokenCache>>,
    /// `--capture FILE`, when given.
    pub capture: Option<Arc<crate::capture::Capture>>,
    /// `[tracing]`: the OpenTelemetry tracer when tracing is on ([`crate::otel`]); none, every
    /// tracing hook is a no-op.
    pub otel: Option<crate::otel::Tracing>,
    /// Slots and queue of the traffic listener (sized at start).
    pub admission: crate::limits::Admission,
    /// Request-body bytes held now (`max_body_bytes_in_flight` bounds it).
    pub body_budget: Arc<crate::limits::BodyBudget>,
    /// Flow control's queue and driver state ([`crate::flow_gate`], driven by [`crate::flow`]).
    pub flow: crate::flow_gate::FlowGate,
    /// Set by [`crate::Gateway::shutdown`]: `/readyz` answers 503.
    pub shutting_down: std::sync::atomic::AtomicBool,
    /// Set when [`crate::Gateway::shutdown`]'s grace is over: streams in flight end with an SSE
    /// error event and `[DONE]`.
    pub grace_end: Arc<crate::grace::GraceEnd>,
    /// Retries in flight, bounded by the requests in flight ([`crate::retry_budget`]).
    pub retry_budget: Arc<crate::retry_budget::RetryBudget>,
    /// Pods found by `--discovery` (routed to besides the config's pods). Its lock also
    /// serialises pod-table updates, so a config reload and a discovery change never race.
    discovered: Mutex<Vec<crate::pods::PodEntry>>,
}

/// What a gateway is given at start besides its config; none of it changes afterwards.
#[derive(Default)]
pub struct StartParts {
    pub tokenizer: Option<crate::tokenizer::GatewayTokenizer>,
    pub token_cache: Option<Arc<crate::token_cache::TokenCache>>,
    pub capture: Option<Arc<crate::capture::Capture>>,
    pub otel: Option<crate::otel::Tracing>,
    pub cluster: Option<Arc<dyn ReplicaLink>>,
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
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(config.connect_timeout));
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .pool_max_idle_per_host(1024)
            .build(connector);
        let session = RouterSession::new(
            config.router,
            config.policy,
            PredictorConfig::for_router(&config.router),
            config.seed,
        );
        Ok(Arc::new(Shared {
            admission: crate::limits::Admission::new(
                config.max_concurrent_requests,
                config.max_waiting_requests,
            ),
            body_budget: Arc::default(),
            flow: crate::flow_gate::FlowGate::default(),
            decisions: DecisionLog::new(config.decision_log_size),
            live: crate::live::LiveHistory::default(),
            config: ArcSwap::from_pointee(config),
            pods: PodTable::default(),
            session: Mutex::new(session),
            metrics,
            log_limit: crate::log_limit::LogLimiter::default(),
            client,
            capture: parts.capture,
            otel: parts.otel,
            cluster: parts.cluster,
            tokenizer: parts.tokenizer,
            token_cache: parts.token_cache,
            shutting_down: std::sync::atomic::AtomicBool::new(false),
            grace_end: Arc::default(),
            retry_budget: Arc::default(),
            discovered: Mutex::new(Vec::new()),
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
        let discovered = self.discovered.lock();
        let old = self.config.load_full();
        let changes = self.pods.replace(
            &wanted_pods(&new.pods, &discovered),
            new.router.lru_capacity_per_server,
        );
        {
            let mut session = self.session.lock();
            if old.router != new.router || old.policy != new.policy {
                session.set_router(new.router, new.policy);
            }
            if PredictorConfig::for_router(&old.router) != PredictorConfig::for_router(&new.router)
            {
                session.set_predictor(LatencyPredictor::new(PredictorConfig::for_router(
                    &new.router,
                )));
            }
        }
        self.forget_removed(&changes);
        self.config.store(Arc::new(new));
        changes.added
    }

    /// Replaces the discovered pods (`--discovery`): the table becomes the config's pods plus
    /// `pods`, as [`Shared::apply_config`] does. Returns the added pods (the caller starts
    /// their scrape loops).
    pub fn set_discovered(&self, pods: Vec<crate::pods::PodEntry>) -> Vec<Arc<crate::pods::Pod>> {
        let mut discovered = self.discovered.lock();
        *discovered = pods;
        let cfg = self.config.load_full();
        let changes = self.pods.replace(
            &wanted_pods(&cfg.pods, &discovered),
            cfg.router.lru_capacity_per_server,
        );
        self.forget_removed(&changes);
        changes.added
    }

    /// A removed pod's index entries and in-flight counters go away; both kinds of change are
    /// logged.
    fn forget_removed(&self, changes: &crate::pods::PodChanges) {
        {
            let mut session = self.session.lock();
            for pod in &changes.removed {
                session.remove_pod(pod.id);
            }
        }
        for pod in &changes.removed {
            self.metrics.forget_pod(&pod.label());
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
        prometheus_client::encoding::text::encode(&mut text, &self.metrics.registry)?;
        Ok(text)
    }

    /// Refreshes the gauges computed from state (called before encoding `/metrics`).
    pub fn refresh_gauges(&self) {
        let m = &self.metrics;
        if let Some(c) = &self.cluster {
            c.refresh_gauges(&m.cluster);
        }
        m.active_requests
            .set(i64::try_from(self.admission.active()).unwrap_or(i64::MAX));
        m.queued_requests
            .set(i64::try_from(self.admission.queued()).unwrap_or(i64::MAX));
        self.flow.refresh_gauges(&m.flow);
        let pods = self.pods.all();
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

/// The pod table's wanted (url, class) list: configured pods first, then discovered ones.
fn wanted_pods(
    configured: &[crate::pods::PodEntry],
    discovered: &[crate::pods::PodEntry],
) -> Vec<crate::pods::PodEntry> {
    configured.iter().chain(discovered).cloned().collect()
}

/// Memory bound per indexed block of the routed index (ARCHITECTURE.md, measured in the core).
pub const INDEX_BYTES_PER_BLOCK: i64 = 96;
/// Memory bound per indexed block of the engine index (kvgate-core, `tests/engine_index_memory.rs`).
pub const ENGINE_INDEX_BYTES_PER_BLOCK: i64 = 192;
