//! `kvgate serve`: start-up and shutdown of one gateway (its options, [`ServeArgs`], are
//! [`crate::config`]'s).
//!
//! [`Gateway::start`] binds both listeners (port 0 allowed, for tests), scrapes every pod once,
//! then spawns the scrape loops, the config watcher and the two HTTP servers. Dropping the
//! [`Gateway`] stops them.

use crate::config::DiscoveryKind;
pub use crate::config::ServeArgs;
use crate::config::{ConfigError, GatewayConfig};
use crate::state::Shared;
use kvgate_core::InFlight;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot open capture file {path}: {source}")]
    Capture {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot open decisions log {path}: {source}")]
    DecisionsLog {
        path: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Tokenizer(#[from] crate::tokenizer::TokenizerError),
    #[error("the traffic and admin listeners must differ ({0})")]
    SameListener(SocketAddr),
    #[error(transparent)]
    Discovery(#[from] crate::discovery::DiscoveryError),
    #[error("cannot start OpenTelemetry tracing: {0}")]
    Tracing(String),
}

/// A running gateway.
pub struct Gateway {
    pub traffic_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    /// The ext_proc (gRPC) listener, with `--ext-proc-listen`.
    pub ext_proc_addr: Option<SocketAddr>,
    shared: Arc<Shared>,
    tasks: Vec<JoinHandle<()>>,
    /// The traffic listener's task, awaited by [`Gateway::shutdown`].
    traffic_task: Option<JoinHandle<()>>,
    /// Tells the traffic listener to stop accepting.
    stop: tokio::sync::watch::Sender<bool>,
    /// Turns the ext_proc gRPC readiness NOT_SERVING (with `/readyz` 503) when draining begins.
    draining: tokio::sync::watch::Sender<bool>,
}

/// How long the streams ended at the end of the shutdown grace have to write their last event
/// and `[DONE]` before their connections are cut.
pub const GRACE_END_WRITE: std::time::Duration = std::time::Duration::from_secs(1);

async fn bind(addr: SocketAddr) -> Result<TcpListener, ServeError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { addr, source })
}

impl Gateway {
    pub async fn start(args: ServeArgs) -> Result<Gateway, ServeError> {
        let loaded = args.config.as_deref().and_then(crate::reload::stamp);
        let config = GatewayConfig::from_args(&args)?;
        // Flags checked (and a build without `k8s` refused) before anything is bound.
        let discovery = crate::discovery::kubernetes_target(&config)?;
        #[cfg(not(feature = "k8s"))]
        if config.discovery == DiscoveryKind::Kubernetes {
            return Err(crate::discovery::DiscoveryError::NotBuilt.into());
        }
        let tokenizer = crate::tokenizer::GatewayTokenizer::load(
            config.tokenizer.as_deref(),
            config.chat_template.as_deref(),
        )?;
        if config.listen == config.admin_listen && config.listen.port() != 0 {
            return Err(ServeError::SameListener(config.listen));
        }
        let traffic = bind(config.listen).await?;
        let admin = bind(config.admin_listen).await?;
        let traffic_addr = traffic.local_addr().map_err(|source| ServeError::Bind {
            addr: config.listen,
            source,
        })?;
        let admin_addr = admin.local_addr().map_err(|source| ServeError::Bind {
            addr: config.admin_listen,
            source,
        })?;
        let ext_proc = match config.ext_proc_listen {
            Some(addr) => {
                let l = bind(addr).await?;
                let local = l
                    .local_addr()
                    .map_err(|source| ServeError::Bind { addr, source })?;
                Some((l, local))
            }
            None => None,
        };
        let ext_proc_addr = ext_proc.as_ref().map(|(_, a)| *a);
        let tokenizer_name = tokenizer.describe();
        let cache_bytes = config.tokenization_cache_mib.saturating_mul(1 << 20);
        let rule = tokenizer.split_rule().unwrap_or_else(|why| {
            tracing::info!(tokenizer = %tokenizer_name, why = %why,
                "tokenization reuse: no safe split points; only whole prompts are reused");
            crate::token_cache::SplitRule::Whole
        });
        let mut cluster = None;
        let shared = Shared::with(config.clone(), |metrics| {
            // The files first, the tracer (a thread of its own) last: an error before it
            // leaves nothing running.
            let decisions_file = match &config.decisions_log {
                Some(path) => Some(
                    crate::jsonl::JsonLines::open(path, metrics.decisions_log_dropped.clone())
                        .map_err(|source| ServeError::DecisionsLog {
                            path: path.display().to_string(),
                            source,
                        })?,
                ),
                None => None,
            };
            let capture = match &config.capture {
                Some(path) => Some(
                    crate::capture::Capture::open(path, metrics.capture_dropped.clone()).map_err(
                        |source| ServeError::Capture {
                            path: path.display().to_string(),
                            source,
                        },
                    )?,
                ),
                None => None,
            };
            let otel = match config.tracing.endpoint() {
                Some(endpoint) => {
                    let tracing = crate::otel::Tracing::start(&config.tracing, &endpoint)
                        .map_err(ServeError::Tracing)?;
                    tracing::info!(%endpoint, sampling_ratio = config.tracing.sampling_ratio,
                        "OpenTelemetry traces on");
                    Some(tracing)
                }
                None => None,
            };
            cluster = config
                .cluster_config()
                .map(|c| crate::cluster::prepare(c, &metrics.cluster));
            Ok::<_, ServeError>(crate::state::StartParts {
                token_cache: Some(Arc::new(crate::token_cache::TokenCache::new(
                    rule,
                    cache_bytes,
                ))),
                tokenizer: Some(tokenizer),
                capture,
                otel,
                cluster: cluster
                    .as_ref()
                    .map(|c| c.cluster.clone() as Arc<dyn crate::state::ReplicaLink>),
                decisions_file,
            })
        })?;
        if config.pods.is_empty() && config.discovery == DiscoveryKind::Static {
            // Kept as before (a start has no previous config to fall back on), but said: every
            // request answers 503 and /readyz stays 503 until a reload names a pod.
            tracing::warn!("no pods configured and discovery is static: every request answers 503");
        }
        let pods = shared.apply_config(config);
        // One scrape of every pod before taking traffic, so that healthy pods are known.
        let mut first = tokio::task::JoinSet::new();
        for pod in &pods {
            let (s, p) = (shared.clone(), pod.clone());
            first.spawn(async move { crate::scrape::scrape_once(&s, &p).await });
        }
        while first.join_next().await.is_some() {}
        let mut tasks = Vec::new();
        if shared.config().index == crate::config::IndexKind::Engine {
            tracing::info!(
                tokenizer = %tokenizer_name,
                "engine index: token mode; pods without live KV events use the routed index"
            );
            if let Some(t) = shared.tokenizer.as_ref()
                && matches!(t, crate::tokenizer::GatewayTokenizer::HuggingFace { .. })
                && t.chat_template().is_none()
            {
                tracing::warn!(
                    tokenizer = %tokenizer_name,
                    "no chat template next to the tokenizer (chat_template.jinja, or \
                     tokenizer_config.json's chat_template) and no --chat-template: chat prompts \
                     use kvgate's own rendering and will not match the engine's blocks"
                );
            }
        }
        for pod in pods {
            tasks.extend(crate::kv_events::spawn_for(&shared, &pod));
            tasks.push(tokio::spawn(crate::served_models::models_loop(
                shared.clone(),
                pod.clone(),
            )));
            tasks.push(tokio::spawn(crate::scrape::scrape_loop(
                shared.clone(),
                pod,
            )));
        }
        if let Some(cluster) = cluster {
            tasks.extend(crate::cluster::start(&shared, cluster).await);
        }
        tasks.push(tokio::spawn(crate::ui::sample_loop(shared.clone())));
        tasks.push(tokio::spawn(summarise_log_lines(shared.clone())));
        match crate::discovery::start(&shared, discovery).await {
            Ok(task) => tasks.extend(task),
            Err(e) => {
                for t in &tasks {
                    t.abort();
                }
                return Err(e.into());
            }
        }
        tasks.push(tokio::spawn(crate::reload::watch(
            shared.clone(),
            args,
            loaded,
        )));
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let app = crate::proxy::traffic_router(shared.clone());
        let traffic_task = tokio::spawn(crate::listener::serve(
            traffic,
            app,
            shared.clone(),
            stopped,
        ));
        let (draining, _) = tokio::sync::watch::channel(false);
        if let Some((listener, _)) = ext_proc {
            tasks.push(tokio::spawn(crate::ext_proc::serve(
                shared.clone(),
                listener,
                draining.subscribe(),
            )));
        }
        let admin_app = crate::admin::admin_router(shared.clone());
        tasks.push(tokio::spawn(async move {
            if let Err(e) = axum::serve(admin, admin_app).await {
                tracing::error!(error = %e, "admin listener stopped");
            }
        }));
        Ok(Gateway {
            traffic_addr,
            admin_addr,
            ext_proc_addr,
            shared,
            tasks,
            traffic_task: Some(traffic_task),
            stop,
            draining,
        })
    }

    /// The first step of a graceful shutdown: `/readyz` answers 503 and the ext_proc gRPC
    /// readiness turns NOT_SERVING, while the traffic listener still accepts and serves, so
    /// that load balancers polling readiness stop sending before it closes. Idempotent.
    pub fn begin_drain(&self) {
        self.shared
            .admission
            .shutting_down
            .store(true, Ordering::Release);
        let _ = self.draining.send(true);
    }

    /// Graceful shutdown after a drain pause: [`Gateway::begin_drain`], then `drain` (cut short
    /// when `skip` completes, e.g. a second signal), then [`Gateway::shutdown`] with `grace`.
    pub async fn drain_and_shutdown(
        self,
        drain: std::time::Duration,
        grace: std::time::Duration,
        skip: impl std::future::Future<Output = ()>,
    ) {
        self.begin_drain();
        tokio::select! {
            _ = tokio::time::sleep(drain) => {}
            _ = skip => tracing::info!("drain pause cut short"),
        }
        self.shutdown(grace).await;
    }

    /// Graceful shutdown: `/readyz` (and the ext_proc gRPC readiness) turns 503 first (see
    /// [`Gateway::begin_drain`]), then the traffic listener stops accepting
    /// (idle keep-alive connections are closed) while in-flight requests, streams included,
    /// may finish for up to `grace`. Streams still in flight then end with the `shutting_down`
    /// SSE error event and `[DONE]` (see [`crate::grace::GraceEnd`]), given up to
    /// [`GRACE_END_WRITE`] to reach their clients; the other requests are cut. Then every task of
    /// the gateway stops.
    pub async fn shutdown(mut self, grace: std::time::Duration) {
        self.begin_drain();
        let _ = self.stop.send(true);
        let deadline = tokio::time::Instant::now() + grace;
        if let Some(mut task) = self.traffic_task.take()
            && tokio::time::timeout_at(deadline, &mut task).await.is_err()
        {
            tracing::warn!(
                grace_ms = grace.as_millis() as u64,
                streams = self.shared.admission.grace_end.streams(),
                "shutdown grace over; ending the streams in flight with an error event and \
                 cutting the other requests"
            );
            self.shared.admission.grace_end.end(grace);
            if tokio::time::timeout(GRACE_END_WRITE, &mut task)
                .await
                .is_err()
            {
                task.abort();
                let _ = task.await;
            }
        }
        // ext_proc streams live in their own tasks and hold an admission slot until Envoy's
        // response ends: they get the same grace.
        while self.shared.admission.slots.active() > 0 {
            if tokio::time::Instant::now() >= deadline {
                tracing::warn!(
                    active = self.shared.admission.slots.active(),
                    "shutdown grace over; cutting the ext_proc streams still in flight"
                );
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        // The other replicas release this one's charges now rather than after its lease.
        crate::cluster::leave(&self.shared.session, std::time::Duration::from_millis(200)).await;
        // The spans of the requests just ended go out before the process exits.
        if let Some(tracing) = self.shared.telemetry.otel.as_ref() {
            tracing.shutdown().await;
        }
    }

    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The in-flight counters of the pod at `url` (None: no such pod).
    pub fn in_flight(&self, url: &str) -> Option<InFlight> {
        let pod = self.shared.fleet.pods.by_url(url)?;
        Some(self.shared.session.in_flight(pod.id))
    }

    /// Whether the pod at `url` is currently considered healthy.
    pub fn pod_healthy(&self, url: &str) -> Option<bool> {
        self.shared.fleet.pods.by_url(url).map(|p| p.is_healthy())
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        for pod in self.shared.fleet.pods.all().iter() {
            pod.removed.store(true, Ordering::Relaxed);
        }
        for t in self.tasks.iter().chain(&self.traffic_task) {
            t.abort();
        }
    }
}

/// Runs `kvgate serve` until Ctrl-C.
pub async fn serve(args: ServeArgs) -> Result<(), ServeError> {
    let gw = Gateway::start(args).await?;
    let cfg = gw.shared.config().clone();
    tracing::info!(
        listen = %gw.traffic_addr,
        admin = %gw.admin_addr,
        pods = cfg.pods.len(),
        policy = cfg.policy.name(),
        "kvgate serving"
    );
    eprintln!(
        "kvgate serving on http://{} (admin http://{}), {} pods, policy {}",
        gw.traffic_addr,
        gw.admin_addr,
        cfg.pods.len(),
        cfg.policy.name()
    );
    if let Some(addr) = gw.ext_proc_addr {
        eprintln!("kvgate ext_proc (Envoy endpoint picker) on grpc://{addr}");
    }
    stop_signal().await;
    // Read now: a reload may have changed them since the start.
    let cfg = gw.shared.config().clone();
    let (drain, grace) = (cfg.shutdown_drain, cfg.shutdown_grace);
    eprintln!(
        "kvgate: shutting down: /readyz 503 and still serving for {} ms (a second signal skips this), then in-flight requests may finish for {} ms",
        drain.as_millis(),
        grace.as_millis()
    );
    gw.drain_and_shutdown(drain, grace, stop_signal()).await;
    Ok(())
}

/// Reports the suppressed log lines ([`crate::log_limit`]) of kinds that went quiet, every
/// [`crate::log_limit::WINDOW`], until dropped.
async fn summarise_log_lines(shared: std::sync::Arc<crate::state::Shared>) {
    let mut ticker = tokio::time::interval(crate::log_limit::WINDOW);
    loop {
        ticker.tick().await;
        for (kind, n) in shared.telemetry.log_limit.flush(std::time::Instant::now()) {
            crate::log_limit::report(kind, n);
        }
    }
}

/// SIGTERM or Ctrl-C.
async fn stop_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

/// Logs to stderr; level from `RUST_LOG` (default `info`).
pub fn init_tracing() {
    init_tracing_with_default("info");
}

/// Logs to stderr; level from `RUST_LOG`, else `default_level`.
pub fn init_tracing_with_default(default_level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
