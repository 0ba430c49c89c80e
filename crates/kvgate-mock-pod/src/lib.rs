//! `kvgate mock-pod`: a vLLM-compatible server on CPU whose timing comes from the simulator's
//! engine model (`kvgate_sim::engine::Engine`) run in wall-clock time.
//!
//! Data flow of one pod:
//!
//! ```text
//! HTTP (api) ── parse (kvgate-core request) ── tokenize (tokenizer) ── block hashes ──┐
//!    ▲                                                                                  ▼
//!    └── per-request channel ◄── driver: Engine::add_request / step, sleeps each step ◄─┘
//!                                   │            (wall time = model time / time_scale)
//!                                   ├─► metrics (vLLM names, /metrics)
//!                                   └─► kv_events (ZMQ PUB + replay ROUTER, vLLM wire format)
//! ```
//!
//! **Fidelity.** Where a router can see it, the pod behaves like vLLM 0.32 as observed on a
//! real CPU pod (`shared/reference/real-vllm.md`): the HTTP surface and error shapes (`api`),
//! the metric names, labels and `_created` samples (`metrics`), the KV events and replay
//! framing (`kv_events`), prefix hits in whole blocks of `--block-size` tokens, `x-request-id`
//! ids and abort on client disconnect (`driver`). `scripts/conformance/pod_conformance.py` checks
//! all of it against both the mock (`tests/conformance.rs`) and a real vLLM; what the mock does
//! not mirror is listed in `docs/simulator.md` ("What the mock pod mirrors").
//!
//! Library use (the gateway's `kvgate demo`, tests): [`spawn_pod`] on a bound listener, or
//! [`spawn_pods`] for `count` pods on consecutive ports; each returns a [`RunningPod`] whose
//! drop stops it. The CLI entry is [`run`] with [`MockPodArgs`], plain options: the flags, their
//! help and defaults are the `kvgate` binary's (`crates/kvgate/src/mock_pod_cli.rs`), and this
//! crate does not depend on clap.

pub mod api;
pub mod driver;
pub mod kv_events;
pub mod metrics;
pub mod tokenizer;

use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use anyhow::{Context, bail};
use axum::serve::ListenerExt;
use kvgate_sim::engine::Engine;
use kvgate_sim::profiles::Profile;
use tokio::net::TcpListener;

pub use kv_events::KvEventsEncoding;
pub use metrics::PodMetrics;

/// `max_tokens` when a request gives none (vLLM uses 16 for completions).
pub const DEFAULT_MAX_TOKENS: u32 = 16;
/// The served model name when `--model` is not given.
pub const DEFAULT_MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";

/// `kvgate mock-pod`'s options, plain: the flags (their names, help and defaults) are defined in
/// the binary (`crates/kvgate/src/mock_pod_cli.rs`); [`PodConfig::from_args`] validates them.
#[derive(Debug, Clone, PartialEq)]
pub struct MockPodArgs {
    /// Address of the first pod's HTTP server; pod i listens on port + i.
    pub listen: SocketAddr,
    /// Engine step-time profile: a kvgate-sim profile name, or a JSON file (`*.json`, e.g.
    /// written by `scripts/real-vllm/calibrate.py --profile-out`).
    pub profile: String,
    /// Model time runs this many times faster than wall time.
    pub time_scale: f64,
    /// KV-cache blocks of `--block-size` tokens (default: the profile's token capacity in
    /// such blocks).
    pub kv_blocks: Option<u32>,
    /// Tokens per KV block: 16 (vLLM's CUDA default) or e.g. 128 (vLLM CPU's default). The
    /// engine model, prefix hits, KV events and `vllm:cache_config_info` follow it. Default:
    /// the profile's `block_size_tokens`.
    pub block_size: Option<u32>,
    /// Serve `/v1/completions/render` and `/v1/chat/completions/render` (vLLM's
    /// `--enable-scale-out`); without it they answer 403 as vLLM does.
    pub enable_scale_out: bool,
    /// Longest prompt + output in tokens (default: the profile's).
    pub max_model_len: Option<u32>,
    /// Served model name; requests for another model get 404.
    pub model: String,
    /// `max_tokens` for requests that give none.
    pub default_max_tokens: u32,
    /// Bind a ZMQ PUB socket here for KV events (e.g. tcp://127.0.0.1:5557); pod i uses port + i.
    pub kv_events: Option<String>,
    /// Bind the KV events replay ROUTER socket here; pod i uses port + i.
    pub kv_events_replay: Option<String>,
    /// Event layout: `map` (current vLLM) or `array` (older vLLM).
    pub kv_events_encoding: KvEventsEncoding,
    /// Topic frame of every KV event message.
    pub kv_events_topic: String,
    /// Number of pods to start in this process, on consecutive ports.
    pub count: u16,
    /// Fault injection: cut every stream (connection broken, no `[DONE]`) after N tokens.
    pub fail_after: Option<u32>,
    /// Fault injection: accept completion requests and never answer them.
    pub hang: bool,
    /// Fault injection: `/metrics` answers garbage text.
    pub garbage_metrics: bool,
    /// Prefill/decode disaggregation, as vLLM's `NixlConnector` `kv_role`: `producer` (a
    /// request with `kv_transfer_params.do_remote_decode` answers with the parameters a decode
    /// pod pulls its KV with), `consumer` (a request with `kv_transfer_params.do_remote_prefill`
    /// computes no prompt token), `both`. Without it, `kv_transfer_params` are ignored, as
    /// vLLM without a KV connector does.
    pub kv_role: Option<api::KvRole>,
    /// Engines behind the one HTTP port, as vLLM's `--data-parallel-size`: a request goes to
    /// the engine its `X-data-parallel-rank` header names (out of range: 400), else round
    /// robin; `/metrics` repeats every series per `engine` label; engine r publishes KV events
    /// on the endpoints' port + r.
    pub data_parallel_size: u32,
}

/// Everything one pod needs (ports of the endpoints are those of pod 0; see [`PodConfig::for_pod`]).
#[derive(Debug, Clone)]
pub struct PodConfig {
    pub profile: Profile,
    /// KV blocks of `block_size_tokens`; `None`: the profile's token capacity (its 16-token
    /// blocks) in blocks of this size.
    pub kv_blocks: Option<u32>,
    pub block_size_tokens: u32,
    pub enable_scale_out: bool,
    pub time_scale: f64,
    pub model: String,
    pub default_max_tokens: u32,
    pub kv_events: Option<String>,
    pub kv_events_replay: Option<String>,
    pub kv_events_encoding: KvEventsEncoding,
    pub kv_events_topic: String,
    /// Injected faults (`--fail-after`, `--hang`, `--garbage-metrics`); none by default.
    pub faults: api::Faults,
    /// `--kv-role`: P/D disaggregation (none: `kv_transfer_params` ignored).
    pub kv_role: Option<api::KvRole>,
    /// `--data-parallel-size`: engines behind the port (1 by default).
    pub data_parallel_size: u32,
}

impl Default for PodConfig {
    fn default() -> Self {
        PodConfig {
            profile: Profile::default_profile().clone(),
            kv_blocks: None,
            block_size_tokens: kvgate_core::blocks::DEFAULT_BLOCK_SIZE_TOKENS,
            enable_scale_out: false,
            time_scale: 1.0,
            model: DEFAULT_MODEL.to_owned(),
            default_max_tokens: DEFAULT_MAX_TOKENS,
            kv_events: None,
            kv_events_replay: None,
            kv_events_encoding: KvEventsEncoding::Map,
            kv_events_topic: String::new(),
            faults: api::Faults::default(),
            kv_role: None,
            data_parallel_size: 1,
        }
    }
}

impl PodConfig {
    /// The configuration of `args`, validated.
    pub fn from_args(args: &MockPodArgs) -> anyhow::Result<Self> {
        let profile = Profile::resolve(&args.profile)?;
        let mut profile = profile.clone();
        if let Some(len) = args.max_model_len {
            profile.max_model_len = len;
        }
        let block_size_tokens = args.block_size.unwrap_or(profile.block_size_tokens);
        let config = PodConfig {
            profile,
            kv_blocks: args.kv_blocks,
            block_size_tokens,
            enable_scale_out: args.enable_scale_out,
            time_scale: args.time_scale,
            model: args.model.clone(),
            default_max_tokens: args.default_max_tokens,
            kv_events: args.kv_events.clone(),
            kv_events_replay: args.kv_events_replay.clone(),
            kv_events_encoding: args.kv_events_encoding,
            kv_events_topic: args.kv_events_topic.clone(),
            faults: api::Faults {
                fail_after_tokens: args.fail_after,
                hang: args.hang,
                garbage_metrics: args.garbage_metrics,
            },
            kv_role: args.kv_role,
            data_parallel_size: args.data_parallel_size,
        };
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> anyhow::Result<()> {
        if !(self.time_scale.is_finite() && self.time_scale > 0.0) {
            bail!(
                "--time-scale must be a positive number, got {}",
                self.time_scale
            );
        }
        if self.kv_blocks == Some(0) {
            bail!("--kv-blocks must be at least 1");
        }
        if self.block_size_tokens == 0 {
            bail!("--block-size must be at least 1");
        }
        if self.default_max_tokens == 0 {
            bail!("--default-max-tokens must be at least 1");
        }
        if !(1..=64).contains(&self.data_parallel_size) {
            bail!(
                "--data-parallel-size must be 1..=64, got {}",
                self.data_parallel_size
            );
        }
        Ok(())
    }

    /// KV blocks of the pod: `kv_blocks`, else the profile's capacity in tokens (its blocks
    /// are 16 tokens) in blocks of `block_size_tokens`, at least 1.
    pub fn kv_blocks_of_block_size(&self) -> u32 {
        self.kv_blocks.unwrap_or_else(|| {
            let tokens =
                u64::from(self.profile.kv_blocks) * u64::from(kvgate_sim::SIM_BLOCK_SIZE_TOKENS);
            let blocks = tokens / u64::from(self.block_size_tokens.max(1));
            u32::try_from(blocks).unwrap_or(u32::MAX).max(1)
        })
    }

    /// The configuration of pod `i`: event endpoint ports shifted by `i` (port 0 stays 0).
    pub fn for_pod(&self, i: u16) -> anyhow::Result<PodConfig> {
        let mut c = self.clone();
        c.kv_events = self
            .kv_events
            .as_deref()
            .map(|e| offset_port(e, i))
            .transpose()?;
        c.kv_events_replay = self
            .kv_events_replay
            .as_deref()
            .map(|e| offset_port(e, i))
            .transpose()?;
        Ok(c)
    }
}

/// `tcp://host:port` with `port + i` (0 stays 0, meaning "any free port").
fn offset_port(endpoint: &str, i: u16) -> anyhow::Result<String> {
    let (head, port) = endpoint
        .rsplit_once(':')
        .with_context(|| format!("endpoint {endpoint:?} has no port"))?;
    let port: u16 = port
        .parse()
        .with_context(|| format!("endpoint {endpoint:?} has no valid port"))?;
    if port == 0 {
        return Ok(endpoint.to_owned());
    }
    let port = port
        .checked_add(i)
        .with_context(|| format!("port {port} + {i} is past 65535"))?;
    Ok(format!("{head}:{port}"))
}

/// A pod started in this process. Dropping it stops it.
#[derive(Debug)]
pub struct RunningPod {
    pub addr: SocketAddr,
    /// The KV events PUB endpoint as bound (ports resolved), when enabled.
    pub kv_events_endpoint: Option<String>,
    pub kv_events_replay_endpoint: Option<String>,
    pub metrics: Arc<Mutex<PodMetrics>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// Stops the HTTP server (listener and connections).
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl RunningPod {
    /// `http://addr`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops the pod's server, engine and sockets.
    pub fn shutdown(self) {}
}

impl Drop for RunningPod {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Starts one pod serving HTTP on `listener`. Must run inside a tokio runtime.
pub async fn spawn_pod(config: PodConfig, listener: TcpListener) -> anyhow::Result<RunningPod> {
    config.validate()?;
    let addr = listener.local_addr()?;
    let mut tasks = Vec::new();
    let mut engines: Vec<api::EngineRank> = Vec::new();
    let mut sources: Vec<serde_json::Value> = Vec::new();
    let (mut kv_events_endpoint, mut kv_events_replay_endpoint) = (None, None);
    let mut publishers = bind_publishers(&config).await?.into_iter();
    for rank in 0..config.data_parallel_size {
        let mut pod_metrics = PodMetrics::default();
        pod_metrics.block_size_tokens = config.block_size_tokens;
        pod_metrics.engine_rank = rank;
        let metrics = Arc::new(Mutex::new(pod_metrics));
        let (sink, endpoint, replay) = match publishers.next().flatten() {
            Some(publisher) => {
                tasks.extend(publisher.tasks);
                (
                    Some(driver::EventSink {
                        tx: publisher.tx,
                        encoding: config.kv_events_encoding,
                        rank,
                    }),
                    Some(publisher.endpoint),
                    publisher.replay_endpoint,
                )
            }
            None => (None, None, None),
        };
        sources.push(api::kv_event_source(
            endpoint.as_deref(),
            replay.as_deref(),
            &config.kv_events_topic,
        ));
        if rank == 0 {
            kv_events_endpoint = endpoint;
            kv_events_replay_endpoint = replay;
        }
        let engine = Engine::with_block_size(
            &config.profile,
            Some(config.kv_blocks_of_block_size()),
            config.block_size_tokens,
        );
        let (handle, engine_task) = driver::spawn(engine, config.time_scale, metrics.clone(), sink);
        tasks.push(engine_task);
        engines.push(api::EngineRank {
            engine: handle,
            metrics,
        });
    }
    let metrics = engines[0].metrics.clone();
    let handle = engines[0].engine.clone();
    let state = Arc::new(api::PodState {
        model: config.model.clone(),
        max_model_len: config.profile.max_model_len,
        default_max_tokens: config.default_max_tokens,
        engine: handle,
        metrics: metrics.clone(),
        tokenizer: tokenizer::PromptTokenizer::cl100k(),
        next_id: AtomicU64::new(0),
        faults: config.faults,
        kv_role: config.kv_role,
        addr,
        enable_scale_out: config.enable_scale_out,
        kv_event_sources: api::kv_event_sources(sources),
        engines,
        next_rank: AtomicU64::new(0),
    });
    // Every response names the pod that served it (`x-mock-pod: ip:port`), so that tests of
    // proxies in front of the pods (Envoy) can tell where a request went.
    let served_by = axum::http::HeaderValue::from_str(&addr.to_string())?;
    let app = api::router(state).layer(axum::middleware::map_response(
        move |mut resp: axum::response::Response| {
            let served_by = served_by.clone();
            async move {
                resp.headers_mut().insert("x-mock-pod", served_by);
                resp
            }
        },
    ));
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    // Not aborted on drop but shut down gracefully: aborting `axum::serve` would leave its
    // per-connection tasks serving on open keep-alive connections (a dropped pod would still
    // answer scrapes). The graceful shutdown closes the listener and idle connections at once.
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let shutdown = async move {
            let _ = stopped.await;
        };
        if let Err(e) = axum::serve(listener, app)
            .with_graceful_shutdown(shutdown)
            .await
        {
            tracing::error!("mock pod HTTP server stopped: {e}");
        }
    });
    Ok(RunningPod {
        addr,
        kv_events_endpoint,
        kv_events_replay_endpoint,
        metrics,
        tasks,
        stop: Some(stop),
    })
}

/// The KV-event publishers of the pod's engines (none without `kv_events`): engine r on the
/// configured endpoints' port + r, as vLLM does. With port 0, engine 0 binds a free port and
/// engine r that port + r; when one of those is taken, all are bound again elsewhere (at most
/// 20 tries).
async fn bind_publishers(config: &PodConfig) -> anyhow::Result<Vec<Option<kv_events::Publisher>>> {
    let n = config.data_parallel_size;
    let Some(endpoint) = config.kv_events.as_deref() else {
        return Ok((0..n).map(|_| None).collect());
    };
    let replay = config.kv_events_replay.as_deref();
    let any_port = endpoint.ends_with(":0") || replay.is_some_and(|r| r.ends_with(":0"));
    let mut last_error = None;
    for _ in 0..20 {
        let mut bound: Vec<Option<kv_events::Publisher>> = Vec::new();
        let mut failed = None;
        for rank in 0..n {
            let shift = |configured: &str, first: Option<&str>| -> anyhow::Result<String> {
                let base = match first {
                    Some(b) if configured.ends_with(":0") => b,
                    _ => configured,
                };
                offset_port(base, u16::try_from(rank)?)
            };
            let first = bound.first().and_then(Option::as_ref);
            let attempt = async {
                let e = shift(endpoint, first.map(|p| p.endpoint.as_str()))?;
                let r = replay
                    .map(|r| shift(r, first.and_then(|p| p.replay_endpoint.as_deref())))
                    .transpose()?;
                kv_events::start(&e, r.as_deref(), config.kv_events_topic.clone()).await
            };
            match attempt.await {
                Ok(p) => bound.push(Some(p)),
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        match failed {
            None => return Ok(bound),
            Some(e) if any_port && n > 1 => {
                for p in bound.into_iter().flatten() {
                    p.tasks.iter().for_each(|t| t.abort());
                }
                last_error = Some(e);
            }
            Some(e) => return Err(e),
        }
    }
    Err(last_error.unwrap_or_else(|| anyhow::anyhow!("no free consecutive event ports")))
}

/// Starts `count` pods: pod i listens on `first.port() + i` (every pod on a free port when the
/// port is 0) and binds its event sockets at the configured ports + i.
pub async fn spawn_pods(
    config: &PodConfig,
    first: SocketAddr,
    count: u16,
) -> anyhow::Result<Vec<RunningPod>> {
    let mut pods = Vec::with_capacity(usize::from(count));
    for i in 0..count {
        let mut addr = first;
        if first.port() != 0 {
            let port = first
                .port()
                .checked_add(i)
                .with_context(|| format!("port {} + {i} is past 65535", first.port()))?;
            addr.set_port(port);
        }
        let listener = TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding {addr}"))?;
        pods.push(spawn_pod(config.for_pod(i)?, listener).await?);
    }
    Ok(pods)
}

/// `kvgate mock-pod`: starts the pods and serves until Ctrl-C.
pub fn run(args: MockPodArgs) -> anyhow::Result<()> {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let config = PodConfig::from_args(&args)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let pods = spawn_pods(&config, args.listen, args.count).await?;
        for (i, pod) in pods.iter().enumerate() {
            let events = match (&pod.kv_events_endpoint, &pod.kv_events_replay_endpoint) {
                (Some(e), Some(r)) => format!(", KV events {e} (replay {r})"),
                (Some(e), None) => format!(", KV events {e}"),
                _ => String::new(),
            };
            println!(
                "mock pod {i}: http://{} model {} profile {} time-scale {}{events}",
                pod.addr, config.model, config.profile.name, config.time_scale
            );
        }
        tokio::signal::ctrl_c().await?;
        drop(pods);
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_ports_shift_by_pod_index_except_zero() {
        assert_eq!(
            offset_port("tcp://127.0.0.1:5557", 3).unwrap(),
            "tcp://127.0.0.1:5560"
        );
        assert_eq!(
            offset_port("tcp://127.0.0.1:0", 3).unwrap(),
            "tcp://127.0.0.1:0"
        );
        assert!(offset_port("tcp://127.0.0.1:65535", 1).is_err());
        assert!(offset_port("tcp://nope", 1).is_err());
    }
}
