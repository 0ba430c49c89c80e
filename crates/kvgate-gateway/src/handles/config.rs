//! Gateway configuration: defaults in code, then the config file (`--config`, TOML, or YAML by
//! extension `.yaml`/`.yml`), then command-line flags (flags win).
//!
//! Example `kvgate.toml`:
//!
//! ```toml
//! policy = "affinity-gate"
//! scrape_interval_ms = 50
//! response_headers = true          # x-kvgate-pod / x-kvgate-branch / x-kvgate-queue-ms
//! index = "engine"                 # routed (default) | engine: KV-cache events, token mode
//! # Pods: a list of URLs and tables (pods = ["http://a:8000", { url = "http://b:8000" }])
//! # or, as here, one [[pods]] table each (not both in one file).
//! # P/D disaggregation: role = "both" (default) | "prefill" | "decode" (docs/operation.md
//! # "Prefill/decode disaggregation"); `--pod URL,role=prefill` on the command line.
//! # A vLLM server with --data-parallel-size N: data_parallel_size = N, N engines behind one
//! # URL, each routed as its own pod URL#dp<rank> (docs/operation.md "Data-parallel servers"); `--pod
//! # URL,dp=N` on the command line.
//! [[pods]]
//! url = "http://10.0.0.5:8000"
//!
//! [[pods]]
//! url = "http://10.0.0.6:8000"
//! class = "h100"                   # hardware class: the predictor learns one model per class
//!
//! [[pods]]                         # a pod publishing vLLM KV-cache events
//! url = "http://10.0.0.7:8000"
//! events = "tcp://10.0.0.7:5557"   # its PUB endpoint
//! replay = "tcp://10.0.0.7:5558"   # its replay ROUTER endpoint (optional)
//! model = "llama"                  # optional: the model it serves (routing: until its own
//!                                  # /v1/models is learnt) and its chain seed (else the
//!                                  # model_name label of its metrics); `--pod URL,model=NAME`
//!
//! [router]                         # kvgate_core::RouterConfig; llm-d camelCase names accepted
//! gate_profile = "seed"            # the gate as specified; keys below override it
//! affinity_gate_tau = 0.80         # a pod is sticky above this prefix score
//! epsilon_explore_sticky = 0.01    # the probability of exploring instead
//! ```
//!
//! `[router]` is read by `RouterConfig`'s own `Deserialize`: the `gate_profile` first, the keys
//! given over it, as `kvgate decide` and `kvgate sim --router-config` read it.
//!
//! The file is re-read when its modification time changes (polled every second, see
//! [`crate::reload`]); a file that fails to parse or validate keeps the old config and logs why.
//! So does a reloaded file that is empty (or only whitespace), and one that leaves the gateway
//! with no configured pod while discovery is static, unless it says `allow_empty_pods = true`:
//! an editor's or `cat >`'s truncate-then-write, or an empty ConfigMap, would otherwise turn
//! every request into a 503 ([`GatewayConfig::check_reloaded`]).
//! Listener addresses, slots and queue, the connection cap, the connect timeout, the decision
//! ring's size, the seed, `index`, `--cluster`, `[tracing]` and the KV events of a pod already
//! routed to are read at start only: a reloaded file that changes any of them is refused whole,
//! naming them ([`GatewayConfig::start_only_changes`]). [`ConfigDump`] is the config in
//! force as the admin listener's `GET /debug/config` shows it.
//!
//! The config's plain data lives here too, so this module needs none of the modules that use
//! it: [`ServeArgs`] (one field per `kvgate serve` flag), [`DiscoveryKind`], [`ApiKeys`],
//! [`ClusterConfig`] (with [`valid_name`] and its defaults).

use crate::pods::PodEntry;
use http::HeaderValue;
use kvgate_core::policy::PolicyKind;
use kvgate_core::{PodRole, RouterConfig};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use subtle::ConstantTimeEq;
use thiserror::Error;

/// Default cap on a request body (a long-context prompt is a few MiB of JSON).
pub const DEFAULT_MAX_BODY_BYTES: usize = 32 << 20;
/// Default budget of request-body bytes held at once over all requests (read, queued or being
/// served): 1 GiB, i.e. 32 bodies at the default cap, or thousands of ordinary chat bodies.
pub const DEFAULT_MAX_BODY_BYTES_IN_FLIGHT: usize = 1 << 30;
/// Default time a client has to send its whole request body, from its arrival.
pub const DEFAULT_BODY_READ_TIMEOUT_MS: u64 = 30_000;
/// Default size of the `/debug/decisions` ring.
pub const DEFAULT_DECISION_LOG: usize = 256;
pub const DEFAULT_SCRAPE_INTERVAL_MS: u64 = 50;
/// Default `models_refresh_interval_ms`: how often each pod's `/v1/models` is read again
/// ([`crate::served_models`]). A pod's models change only when adapters are loaded or its engine
/// restarts (which an outage shows and which is re-read at once), so 10 s, 200 × the scrape.
pub const DEFAULT_MODELS_REFRESH_INTERVAL_MS: u64 = 10_000;
pub const DEFAULT_MAX_RETRIES: u32 = 2;
pub const DEFAULT_POD_CLASS: &str = "default";
/// Default number of requests served at once by the traffic listener.
pub const DEFAULT_MAX_CONCURRENT_REQUESTS: usize = 1024;
/// Default number of requests waiting for a slot before 429.
pub const DEFAULT_MAX_QUEUED_REQUESTS: usize = 1024;
/// Default time in-flight requests may still run after SIGTERM.
pub const DEFAULT_SHUTDOWN_GRACE_MS: u64 = 10_000;
/// Default upstream connect timeout.
pub const DEFAULT_CONNECT_TIMEOUT_MS: u64 = 2_000;
/// Default wait for a pod's response headers (a long prompt's prefill under load fits).
pub const DEFAULT_FIRST_BYTE_TIMEOUT_MS: u64 = 60_000;
/// Default silence allowed between two chunks of a response.
pub const DEFAULT_IDLE_CHUNK_TIMEOUT_MS: u64 = 60_000;
/// Default longest prompt accepted (1 Mi tokens: above every served model's context today).
pub const DEFAULT_MAX_PROMPT_TOKENS: u32 = 1 << 20;
/// Default longest life of one request, from admission to its last byte (a 32k-token answer
/// at 20 ms/token is about 11 minutes; 10 minutes covers the long generations of today's chats).
pub const DEFAULT_REQUEST_TIMEOUT_MS: u64 = 600_000;
/// Default pause on SIGTERM between `/readyz` turning 503 and the listener closing, so that load
/// balancers polling readiness (typically every 1–5 s) stop sending new requests first.
pub const DEFAULT_SHUTDOWN_DRAIN_MS: u64 = 5_000;
/// Default cap on open traffic connections (see [`crate::listener`]); beyond it a connection is
/// closed at accept.
pub const DEFAULT_MAX_CONNECTIONS: usize = 8192;
/// Default time a request head has to arrive whole (Go's common `ReadHeaderTimeout`).
pub const DEFAULT_HEADER_READ_TIMEOUT_MS: u64 = 10_000;
/// Default life of a keep-alive connection with nothing in flight (nginx's
/// `keepalive_timeout`: above the 60 s idle timeout of common load balancers).
pub const DEFAULT_IDLE_CONNECTION_TIMEOUT_MS: u64 = 75_000;
/// Default time a client may accept no byte of its response before its connection is closed
/// (the pods' idle-chunk timeout: no side of a stream stalls longer than a minute).
pub const DEFAULT_CLIENT_WRITE_TIMEOUT_MS: u64 = 60_000;
/// Default number of responses in a row that die mid-body on one pod before it is avoided.
pub const DEFAULT_POD_FAILURE_THRESHOLD: u32 = 3;
/// Default time a pod is avoided after that many failures in a row.
pub const DEFAULT_POD_FAILURE_COOLDOWN_MS: u64 = 10_000;

#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("[tracing]: {0}")]
    BadTracing(String),
    #[error("cannot parse {path}: {message}")]
    Parse { path: String, message: String },
    #[error("unknown policy {0:?}")]
    UnknownPolicy(String),
    #[error("invalid pod URL {0:?}: expected http://host:port")]
    BadPodUrl(String),
    #[error("{0}")]
    Router(#[from] kvgate_core::config::ConfigError),
    #[error("{0}")]
    BadCluster(String),
    #[error("{0} must be positive")]
    NotPositive(&'static str),
    #[error(
        "invalid pod option {0:?}: expected URL[,events=tcp://…|ipc://…][,replay=tcp://…|ipc://…][,model=NAME][,class=NAME][,role=both|prefill|decode][,dp=N]"
    )]
    BadPodOption(String),
    #[error("pod {url:?}: data_parallel_size must be 1..={max}, got {got}")]
    BadDataParallelSize { url: String, got: u32, max: u32 },
    #[error(
        "pod {url:?} has data_parallel_size {size} and KV events at {endpoint:?}: each rank \
         publishes on the endpoint's port + rank (vLLM's rule), so the endpoint must end in \
         :PORT (tcp://*:5557; vLLM 0.32 refuses an ipc endpoint for a DP server unless its \
         path holds \"tcp\" and ends in :PORT)"
    )]
    DataParallelEvents {
        url: String,
        size: u32,
        endpoint: String,
    },
    #[error("unknown index {0:?}: expected routed or engine")]
    UnknownIndex(String),
    #[error("{path} is empty")]
    EmptyFile { path: String },
    #[error(
        "no pods: neither the file nor --pod names one, and discovery is static \
         (set allow_empty_pods = true to run with none)"
    )]
    NoPods,
    #[error("{0}")]
    Flow(#[from] kvgate_core::flow::FlowConfigError),
    #[error("session_headers: {0:?} is not a header name")]
    BadSessionHeader(String),
}

/// `session_headers` as given (`None`: the defaults), lower-cased and checked to be header
/// names.
fn session_headers(given: Option<&[String]>) -> Result<Vec<String>, ConfigError> {
    let names: Vec<String> = match given {
        Some(g) => g.iter().map(|n| n.trim().to_ascii_lowercase()).collect(),
        None => crate::session_key::DEFAULT_SESSION_HEADERS
            .map(String::from)
            .to_vec(),
    };
    for n in &names {
        if http::HeaderName::from_bytes(n.as_bytes()).is_err() {
            return Err(ConfigError::BadSessionHeader(n.clone()));
        }
    }
    Ok(names)
}

/// Which prefix index routes (DESIGN.md §4); [`IndexKind::help`] says what each is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum IndexKind {
    #[default]
    Routed,
    Engine,
}

impl IndexKind {
    /// Every kind, in the order `kvgate serve --help` lists them.
    pub const ALL: [IndexKind; 2] = [IndexKind::Routed, IndexKind::Engine];

    /// The name in `--index` and the config file.
    pub fn name(self) -> &'static str {
        match self {
            IndexKind::Routed => "routed",
            IndexKind::Engine => "engine",
        }
    }

    /// What the kind is, as `kvgate serve --help` says it.
    pub fn help(self) -> &'static str {
        match self {
            IndexKind::Routed => "Learns from routing decisions (approximate, per replica)",
            IndexKind::Engine => {
                "Fed by the pods' KV-cache events (precise, shared by replicas); token mode with \
                 the built-in cl100k tokenizer; pods without events, or stale, use the routed index"
            }
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }
}

/// Where a pod publishes its KV-cache events.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PodEvents {
    /// The pod's base URL, as in [`GatewayConfig::pods`] (not repeated in `/debug/config`).
    #[serde(skip)]
    pub url: String,
    /// PUB endpoint, e.g. `tcp://10.0.0.5:5557`.
    pub endpoint: String,
    /// Replay ROUTER endpoint.
    pub replay: Option<String>,
    /// Model seeding the pod's block chains (else the scraped `model_name`).
    pub model: Option<String>,
}

/// A `--pod` value: `URL[,events=…][,replay=…][,model=…][,class=…][,role=…][,dp=N]`.
fn parse_pod_arg(arg: &str) -> Result<(PodEntry, Option<PodEvents>), ConfigError> {
    let mut parts = arg.split(',');
    let url = parts.next().unwrap_or("").trim().to_string();
    let (mut class, mut endpoint, mut replay, mut model) = (None, None, None, None);
    let mut role = PodRole::Both;
    let mut data_parallel_size = 1;
    for part in parts {
        let Some((key, value)) = part.split_once('=') else {
            return Err(ConfigError::BadPodOption(arg.to_string()));
        };
        let value = Some(value.trim().to_string());
        match key.trim() {
            "events" => endpoint = value,
            "replay" => replay = value,
            "model" => model = value,
            "class" => class = value,
            "role" => {
                role = value
                    .as_deref()
                    .and_then(PodRole::from_name)
                    .ok_or_else(|| ConfigError::BadPodOption(arg.to_string()))?
            }
            "dp" | "data_parallel_size" => {
                data_parallel_size = value
                    .as_deref()
                    .and_then(|v| v.parse().ok())
                    .ok_or_else(|| ConfigError::BadPodOption(arg.to_string()))?
            }
            _ => return Err(ConfigError::BadPodOption(arg.to_string())),
        }
    }
    let events = endpoint_events(&url, endpoint, replay, model.clone(), arg)?;
    let class = class.unwrap_or_else(|| DEFAULT_POD_CLASS.to_string());
    Ok((
        PodEntry {
            data_parallel_size,
            ..PodEntry::new(url, class).with_role(role).with_model(model)
        },
        events,
    ))
}

/// The endpoint data-parallel rank `rank` of a server publishes on, given rank 0's: its
/// trailing `:PORT` plus `rank`, as vLLM's `ZmqEventPublisher.offset_endpoint_port` does (a
/// port 0 stays 0). `None` when the endpoint has no trailing port (vLLM 0.32 then refuses to
/// start a DP server's rank 1, so such a config is rejected before).
pub fn rank_endpoint(endpoint: &str, rank: u32) -> Option<String> {
    if rank == 0 {
        return Some(endpoint.to_string());
    }
    let (head, port) = endpoint.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    if port == 0 {
        return Some(endpoint.to_string());
    }
    let port = u16::try_from(u32::from(port).checked_add(rank)?).ok()?;
    Some(format!("{head}:{port}"))
}

/// Checks a pod's data-parallel size and, for N > 1, that its event endpoints give each rank
/// its own ([`rank_endpoint`]).
fn check_data_parallel(pod: &PodEntry, events: Option<&PodEvents>) -> Result<(), ConfigError> {
    let size = pod.data_parallel_size;
    if size == 0 || size > crate::pods::MAX_DATA_PARALLEL_SIZE {
        return Err(ConfigError::BadDataParallelSize {
            url: crate::pods::redact_userinfo(&pod.url),
            got: size,
            max: crate::pods::MAX_DATA_PARALLEL_SIZE,
        });
    }
    if size == 1 {
        return Ok(());
    }
    let Some(events) = events else { return Ok(()) };
    for endpoint in std::iter::once(&events.endpoint).chain(&events.replay) {
        if rank_endpoint(endpoint, size - 1).is_none() {
            return Err(ConfigError::DataParallelEvents {
                url: crate::pods::redact_userinfo(&pod.url),
                size,
                endpoint: endpoint.clone(),
            });
        }
    }
    Ok(())
}

fn endpoint_events(
    url: &str,
    endpoint: Option<String>,
    replay: Option<String>,
    model: Option<String>,
    what: &str,
) -> Result<Option<PodEvents>, ConfigError> {
    let Some(endpoint) = endpoint else {
        return if replay.is_some() {
            Err(ConfigError::BadPodOption(what.to_string()))
        } else {
            Ok(None)
        };
    };
    // tcp:// or ipc:// (real vLLM binds its PUB socket only on a wildcard or an ipc endpoint).
    let zmq = |e: &str| e.starts_with("tcp://") || e.starts_with("ipc://");
    if !zmq(&endpoint) || replay.as_ref().is_some_and(|r| !zmq(r)) {
        return Err(ConfigError::BadPodOption(what.to_string()));
    }
    Ok(Some(PodEvents {
        url: url.trim_end_matches('/').to_string(),
        endpoint,
        replay,
        model,
    }))
}

/// A pod in the config file: a URL, or a table with a URL, a predictor class, KV-event
/// endpoints and a P/D role.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum PodSpec {
    Url(String),
    Full {
        url: String,
        #[serde(default)]
        class: Option<String>,
        #[serde(default)]
        events: Option<String>,
        #[serde(default)]
        replay: Option<String>,
        #[serde(default)]
        model: Option<String>,
        /// `both` (default), `prefill` or `decode`.
        #[serde(default)]
        role: Option<PodRole>,
        /// Engines behind the URL (vLLM `--data-parallel-size`); 1 by default.
        #[serde(default)]
        data_parallel_size: Option<u32>,
    },
}

/// The config file as written; every field optional.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FileConfig {
    pub listen: Option<SocketAddr>,
    pub admin_listen: Option<SocketAddr>,
    pub pods: Vec<PodSpec>,
    pub policy: Option<String>,
    pub scrape_interval_ms: Option<u64>,
    pub models_refresh_interval_ms: Option<u64>,
    pub response_headers: Option<bool>,
    pub max_body_bytes: Option<usize>,
    pub max_body_bytes_in_flight: Option<usize>,
    pub body_read_timeout_ms: Option<u64>,
    pub max_retries: Option<u32>,
    pub decision_log_size: Option<usize>,
    pub max_concurrent_requests: Option<usize>,
    pub max_queued_requests: Option<usize>,
    pub max_connections: Option<usize>,
    pub header_read_timeout_ms: Option<u64>,
    pub idle_connection_timeout_ms: Option<u64>,
    pub client_write_timeout_ms: Option<u64>,
    pub max_prompt_tokens: Option<u32>,
    pub seed: Option<u64>,
    pub index: Option<String>,
    /// Accept a reloaded file that leaves no configured pod (discovery static); default false.
    pub allow_empty_pods: Option<bool>,
    pub router: Option<RouterConfig>,
    /// `[flow_control]`: the router-side queue (`kvgate_core::flow`); off by default.
    pub flow_control: Option<kvgate_core::flow::FlowConfig>,
    /// `[tracing]`: OpenTelemetry traces over OTLP ([`crate::otel`]); off by default.
    pub tracing: Option<TracingConfig>,
    /// `--cluster`: the NATS server other replicas share routing state over (start only).
    pub cluster: Option<String>,
    /// `--cluster-name` (default `default`).
    pub cluster_name: Option<String>,
    /// A silent replica's charges are returned after this (default 3,000).
    pub cluster_lease_ms: Option<u64>,
    /// Share the predictor's training samples with the other replicas (default true).
    pub cluster_share_samples: Option<bool>,
    /// Headers naming the client's session, read while session affinity is on (default
    /// [`crate::session_key::DEFAULT_SESSION_HEADERS`]; `[]`: none).
    pub session_headers: Option<Vec<String>>,
}

impl FileConfig {
    /// Reads and parses a config file (YAML for `.yaml`/`.yml`, JSON for `.json`, else TOML).
    /// An empty file is all defaults.
    pub fn load(path: &Path) -> Result<FileConfig, ConfigError> {
        Self::read(path, false)
    }

    /// [`FileConfig::load`] for a reload: an empty or whitespace-only file is refused
    /// ([`ConfigError::EmptyFile`]): it is what a reader sees in the middle of a
    /// truncate-then-write, never a config anyone meant.
    pub fn load_reloaded(path: &Path) -> Result<FileConfig, ConfigError> {
        Self::read(path, true)
    }

    fn read(path: &Path, reloaded: bool) -> Result<FileConfig, ConfigError> {
        let p = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: p.clone(),
            source,
        })?;
        if reloaded && text.trim().is_empty() {
            return Err(ConfigError::EmptyFile { path: p });
        }
        let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
        let parsed = match ext {
            "yaml" | "yml" => serde_saphyr::from_str(&text).map_err(|e| e.to_string()),
            "json" => serde_json::from_str(&text).map_err(|e| e.to_string()),
            _ => toml::from_str(&text).map_err(|e| e.to_string()),
        };
        parsed.map_err(|message| ConfigError::Parse { path: p, message })
    }
}

/// The resolved configuration the gateway runs with.
#[derive(Debug, Clone, PartialEq)]
pub struct GatewayConfig {
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    /// Base URL, predictor class, P/D role.
    pub pods: Vec<PodEntry>,
    pub policy: PolicyKind,
    pub scrape_interval: Duration,
    /// How often each pod's `/v1/models` is read again (`models_refresh_interval_ms`).
    pub models_refresh_interval: Duration,
    pub response_headers: bool,
    pub max_body_bytes: usize,
    /// Request-body bytes held at once over all requests; beyond, 503 (see `limits`).
    pub max_body_bytes_in_flight: usize,
    /// A request's whole body must arrive within this of its arrival, before it takes a slot.
    pub body_read_timeout: Duration,
    pub max_retries: u32,
    pub decision_log_size: usize,
    /// Requests served at once (read at start only).
    pub max_concurrent_requests: usize,
    /// Requests waiting for a slot; beyond, 429 (read at start only).
    pub max_queued_requests: usize,
    /// Traffic connections open at once; beyond, closed at accept (read at start only).
    pub max_connections: usize,
    /// A request head must arrive whole within this (of the accept, or of its first byte).
    pub header_read_timeout: Duration,
    /// A keep-alive connection with nothing in flight is closed after this.
    pub idle_connection_timeout: Duration,
    /// A connection whose client accepts no byte for this long is closed.
    pub client_write_timeout: Duration,
    pub seed: u64,
    pub router: RouterConfig,
    pub index: IndexKind,
    /// Pods that publish KV-cache events.
    pub pod_events: Vec<PodEvents>,
    /// `--api-key`: keys required on /v1/* (empty: no authentication).
    pub api_keys: ApiKeys,
    /// `--forward-authorization`: pass the client's Authorization header to the pods.
    pub forward_authorization: bool,
    /// `--shutdown-grace-ms`: how long in-flight requests may run after SIGTERM.
    pub shutdown_grace: Duration,
    /// Upstream connect timeout (read at start only).
    pub connect_timeout: Duration,
    /// Longest wait for a pod's response headers.
    pub first_byte_timeout: Duration,
    /// Longest silence between two chunks of a pod's response.
    pub idle_chunk_timeout: Duration,
    /// Longest prompt accepted, tokens; longer: 400.
    pub max_prompt_tokens: u32,
    /// Longest life of one request, from admission to its last byte.
    pub request_timeout: Duration,
    /// `--shutdown-drain-ms`: pause between readiness turning false and the listener closing.
    pub shutdown_drain: Duration,
    /// Responses in a row dying mid-body on a pod before it is avoided (see [`crate::breaker`]).
    pub pod_failure_threshold: u32,
    /// How long such a pod is avoided.
    pub pod_failure_cooldown: Duration,
    /// `allow_empty_pods`: a reload may leave no configured pod (see [`Self::check_reloaded`]).
    pub allow_empty_pods: bool,
    /// `[flow_control]` (see `kvgate_core::flow`); `enabled = false` by default.
    pub flow: kvgate_core::flow::FlowConfig,
    /// `--cluster`: active-active replicas over NATS ([`crate::cluster`]; start only).
    pub cluster: Option<ClusterConfig>,
    /// `[tracing]`: OpenTelemetry traces ([`crate::otel`]; start only).
    pub tracing: TracingConfig,
    /// `session_headers`: the headers naming the client's session, lower case, in order of
    /// precedence ([`crate::session_key`]); read only while the router's session affinity is on.
    pub session_headers: Vec<String>,
}

/// `[tracing]`: OpenTelemetry traces exported over OTLP/HTTP (protobuf) ([`crate::otel`]). Read
/// at start only.
///
/// ```toml
/// [tracing]
/// otlp_traces_endpoint = "http://otel-collector:4318/v1/traces"  # set: tracing on
/// sampling_ratio = 0.01      # requests without a traceparent: the share traced (default 1.0)
/// service_name = "kvgate"    # the spans' service.name (default "kvgate")
/// ```
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct TracingConfig {
    /// The collector's OTLP/HTTP traces URL (`http://host:4318/v1/traces`; a URL with no path
    /// gets `/v1/traces`). Unset (the default): tracing off.
    pub otlp_traces_endpoint: Option<String>,
    /// Parent-based sampling: a request with a `traceparent` follows its sampled flag; one
    /// without is sampled with this probability (0.0–1.0, by trace id). Default 1.0.
    pub sampling_ratio: f64,
    /// The `service.name` resource attribute of kvgate's spans.
    pub service_name: String,
}

impl Default for TracingConfig {
    fn default() -> Self {
        TracingConfig {
            otlp_traces_endpoint: None,
            sampling_ratio: 1.0,
            service_name: "kvgate".to_string(),
        }
    }
}

impl TracingConfig {
    /// The export URL when tracing is on (`/v1/traces` added to a URL without a path).
    pub fn endpoint(&self) -> Option<String> {
        let url = self.otlp_traces_endpoint.as_deref()?;
        let rest = url.strip_prefix("http://")?;
        Some(match rest.find('/') {
            Some(i) if rest.len() > i + 1 => url.to_string(),
            _ => format!("http://{}/v1/traces", rest.trim_end_matches('/')),
        })
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if !(0.0..=1.0).contains(&self.sampling_ratio) {
            return Err(ConfigError::BadTracing(format!(
                "sampling_ratio must be within 0.0..=1.0, got {}",
                self.sampling_ratio
            )));
        }
        if let Some(url) = &self.otlp_traces_endpoint {
            let host = url.strip_prefix("http://").unwrap_or("");
            if host.is_empty() || host.starts_with('/') {
                // The exporter is built without a TLS stack: a plain-HTTP collector (or a local
                // agent) only.
                return Err(ConfigError::BadTracing(format!(
                    "otlp_traces_endpoint {url:?}: expected http://host:port[/path]"
                )));
            }
        }
        Ok(())
    }
}

impl GatewayConfig {
    /// Defaults ← `file` ← flags in `args`, validated.
    pub fn resolve(args: &ServeArgs, file: Option<&FileConfig>) -> Result<Self, ConfigError> {
        let empty = FileConfig::default();
        let file = file.unwrap_or(&empty);
        let policy_name = args
            .policy
            .clone()
            .or_else(|| file.policy.clone())
            .unwrap_or_else(|| PolicyKind::AffinityGate.name().to_string());
        let policy =
            PolicyKind::from_name(&policy_name).ok_or(ConfigError::UnknownPolicy(policy_name))?;
        let mut pods: Vec<PodEntry> = Vec::new();
        let mut pod_events: Vec<PodEvents> = Vec::new();
        for p in &file.pods {
            match p {
                PodSpec::Url(url) => pods.push(PodEntry::new(url.clone(), DEFAULT_POD_CLASS)),
                PodSpec::Full {
                    url,
                    class,
                    events,
                    replay,
                    model,
                    role,
                    data_parallel_size,
                } => {
                    let class = class.as_deref().unwrap_or(DEFAULT_POD_CLASS);
                    pods.push(PodEntry {
                        data_parallel_size: data_parallel_size.unwrap_or(1),
                        ..PodEntry::new(url.clone(), class)
                            .with_role(role.unwrap_or_default())
                            .with_model(model.clone())
                    });
                    pod_events.extend(endpoint_events(
                        url,
                        events.clone(),
                        replay.clone(),
                        model.clone(),
                        url,
                    )?);
                }
            }
        }
        for arg in &args.pod {
            let (pod, events) = parse_pod_arg(arg)?;
            pods.push(pod);
            pod_events.extend(events);
        }
        let index = match (&args.index, &file.index) {
            (Some(kind), _) => *kind,
            (None, Some(name)) => {
                IndexKind::from_name(name).ok_or_else(|| ConfigError::UnknownIndex(name.clone()))?
            }
            (None, None) => IndexKind::Routed,
        };
        for p in &pods {
            check_pod_url(&p.url)?;
            let url = p.url.trim_end_matches('/');
            check_data_parallel(p, pod_events.iter().find(|e| e.url == url))?;
        }
        let scrape_ms = args
            .scrape_interval_ms
            .or(file.scrape_interval_ms)
            .unwrap_or(DEFAULT_SCRAPE_INTERVAL_MS);
        if scrape_ms == 0 {
            return Err(ConfigError::NotPositive("scrape_interval_ms"));
        }
        let models_refresh_ms = args
            .models_refresh_interval_ms
            .or(file.models_refresh_interval_ms)
            .unwrap_or(DEFAULT_MODELS_REFRESH_INTERVAL_MS);
        if models_refresh_ms == 0 {
            return Err(ConfigError::NotPositive("models_refresh_interval_ms"));
        }
        let max_body_bytes = file.max_body_bytes.unwrap_or(DEFAULT_MAX_BODY_BYTES);
        if max_body_bytes == 0 {
            return Err(ConfigError::NotPositive("max_body_bytes"));
        }
        let max_body_bytes_in_flight = file
            .max_body_bytes_in_flight
            .unwrap_or(DEFAULT_MAX_BODY_BYTES_IN_FLIGHT);
        if max_body_bytes_in_flight == 0 {
            return Err(ConfigError::NotPositive("max_body_bytes_in_flight"));
        }
        let body_read_timeout_ms = file
            .body_read_timeout_ms
            .unwrap_or(DEFAULT_BODY_READ_TIMEOUT_MS);
        if body_read_timeout_ms == 0 {
            return Err(ConfigError::NotPositive("body_read_timeout_ms"));
        }
        let router = file.router.unwrap_or_default();
        router.validate()?;
        let max_concurrent_requests = args
            .max_concurrent_requests
            .or(file.max_concurrent_requests)
            .unwrap_or(DEFAULT_MAX_CONCURRENT_REQUESTS);
        if max_concurrent_requests == 0 {
            return Err(ConfigError::NotPositive("max_concurrent_requests"));
        }
        let positive_ms =
            |v: Option<u64>, default: u64, name: &'static str| match v.unwrap_or(default) {
                0 => Err(ConfigError::NotPositive(name)),
                ms => Ok(Duration::from_millis(ms)),
            };
        let connect_timeout = positive_ms(
            args.connect_timeout_ms,
            DEFAULT_CONNECT_TIMEOUT_MS,
            "connect_timeout_ms",
        )?;
        let first_byte_timeout = positive_ms(
            args.first_byte_timeout_ms,
            DEFAULT_FIRST_BYTE_TIMEOUT_MS,
            "first_byte_timeout_ms",
        )?;
        let idle_chunk_timeout = positive_ms(
            args.idle_chunk_timeout_ms,
            DEFAULT_IDLE_CHUNK_TIMEOUT_MS,
            "idle_chunk_timeout_ms",
        )?;
        let request_timeout = positive_ms(
            args.request_timeout_ms,
            DEFAULT_REQUEST_TIMEOUT_MS,
            "request_timeout_ms",
        )?;
        let pod_failure_cooldown = positive_ms(
            args.pod_failure_cooldown_ms,
            DEFAULT_POD_FAILURE_COOLDOWN_MS,
            "pod_failure_cooldown_ms",
        )?;
        let max_connections = args
            .max_connections
            .or(file.max_connections)
            .unwrap_or(DEFAULT_MAX_CONNECTIONS);
        if max_connections == 0 {
            return Err(ConfigError::NotPositive("max_connections"));
        }
        let header_read_timeout = positive_ms(
            args.header_read_timeout_ms.or(file.header_read_timeout_ms),
            DEFAULT_HEADER_READ_TIMEOUT_MS,
            "header_read_timeout_ms",
        )?;
        let idle_connection_timeout = positive_ms(
            args.idle_connection_timeout_ms
                .or(file.idle_connection_timeout_ms),
            DEFAULT_IDLE_CONNECTION_TIMEOUT_MS,
            "idle_connection_timeout_ms",
        )?;
        let client_write_timeout = positive_ms(
            args.client_write_timeout_ms
                .or(file.client_write_timeout_ms),
            DEFAULT_CLIENT_WRITE_TIMEOUT_MS,
            "client_write_timeout_ms",
        )?;
        let cluster = match args.cluster.clone().or_else(|| file.cluster.clone()) {
            None => None,
            Some(url) => {
                if !(url.starts_with("nats://") || url.starts_with("tls://"))
                    || url.len() <= "nats://".len()
                {
                    return Err(ConfigError::BadCluster(format!(
                        "invalid cluster URL {url:?}: expected nats://HOST:PORT"
                    )));
                }
                let name = args
                    .cluster_name
                    .clone()
                    .or_else(|| file.cluster_name.clone())
                    .unwrap_or_else(|| DEFAULT_CLUSTER_NAME.to_string());
                if !valid_name(&name) {
                    return Err(ConfigError::BadCluster(format!(
                        "invalid cluster name {name:?}: 1-64 of A-Z a-z 0-9 _ -"
                    )));
                }
                let lease =
                    positive_ms(file.cluster_lease_ms, DEFAULT_LEASE_MS, "cluster_lease_ms")?;
                Some(ClusterConfig {
                    url,
                    name,
                    lease,
                    share_samples: file.cluster_share_samples.unwrap_or(true),
                })
            }
        };
        let pod_failure_threshold = args
            .pod_failure_threshold
            .unwrap_or(DEFAULT_POD_FAILURE_THRESHOLD);
        if pod_failure_threshold == 0 {
            return Err(ConfigError::NotPositive("pod_failure_threshold"));
        }
        let flow = file.flow_control.unwrap_or_default();
        flow.validate()?;
        let tracing = file.tracing.clone().unwrap_or_default();
        tracing.validate()?;
        let session_headers = session_headers(file.session_headers.as_deref())?;
        Ok(GatewayConfig {
            listen: args.listen.or(file.listen).unwrap_or(default_listen()),
            admin_listen: args
                .admin_listen
                .or(file.admin_listen)
                .unwrap_or(default_admin_listen()),
            pods,
            policy,
            scrape_interval: Duration::from_millis(scrape_ms),
            models_refresh_interval: Duration::from_millis(models_refresh_ms),
            response_headers: !args.no_response_headers && file.response_headers.unwrap_or(true),
            max_body_bytes,
            max_body_bytes_in_flight,
            body_read_timeout: Duration::from_millis(body_read_timeout_ms),
            max_retries: file.max_retries.unwrap_or(DEFAULT_MAX_RETRIES),
            decision_log_size: file
                .decision_log_size
                .unwrap_or(DEFAULT_DECISION_LOG)
                .max(1),
            max_concurrent_requests,
            max_queued_requests: args
                .max_queued_requests
                .or(file.max_queued_requests)
                .unwrap_or(DEFAULT_MAX_QUEUED_REQUESTS),
            max_connections,
            header_read_timeout,
            idle_connection_timeout,
            client_write_timeout,
            seed: args.seed.or(file.seed).unwrap_or(0),
            router,
            index,
            pod_events,
            api_keys: ApiKeys::new(args.api_key.iter().map(String::as_str)),
            forward_authorization: args.forward_authorization,
            shutdown_grace: Duration::from_millis(
                args.shutdown_grace_ms.unwrap_or(DEFAULT_SHUTDOWN_GRACE_MS),
            ),
            connect_timeout,
            first_byte_timeout,
            idle_chunk_timeout,
            max_prompt_tokens: args
                .max_prompt_tokens
                .or(file.max_prompt_tokens)
                .unwrap_or(DEFAULT_MAX_PROMPT_TOKENS),
            request_timeout,
            shutdown_drain: Duration::from_millis(
                args.shutdown_drain_ms.unwrap_or(DEFAULT_SHUTDOWN_DRAIN_MS),
            ),
            pod_failure_threshold,
            pod_failure_cooldown,
            allow_empty_pods: file.allow_empty_pods.unwrap_or(false),
            flow,
            cluster,
            tracing,
            session_headers,
        })
    }

    /// What a reloaded config must also pass: at least one configured pod (the file's or
    /// `--pod`'s) unless `allow_empty_pods` or discovery supplies pods (with `--discovery
    /// kubernetes` the file's list may well be empty, and so may the discovered set at times).
    /// Not checked at start: a gateway started without pods reports not ready (`/readyz` 503)
    /// and there is no previous config to keep.
    pub fn check_reloaded(&self, discovery_supplies_pods: bool) -> Result<(), ConfigError> {
        if self.pods.is_empty() && !self.allow_empty_pods && !discovery_supplies_pods {
            return Err(ConfigError::NoPods);
        }
        Ok(())
    }

    /// The settings read at start only that differ from `running` (the config in force): a
    /// reload that changes any is refused whole ([`crate::reload`]), not half applied. They
    /// are the listeners, slots and queue, the connection cap, the connect timeout, the
    /// decision ring's size, the seed, `index` (it sets the blocks' mode and the KV-event
    /// subscribers at start), `--cluster` and `[tracing]`, and the KV events of a pod kept
    /// across the reload (a pod added by it may have events: its subscriber starts with it).
    pub fn start_only_changes(&self, running: &GatewayConfig) -> Vec<String> {
        let mut changed = Vec::new();
        macro_rules! check {
            ($($field:ident),*) => {$(
                if self.$field != running.$field {
                    changed.push(stringify!($field).to_string());
                }
            )*};
        }
        check!(
            listen,
            admin_listen,
            max_concurrent_requests,
            max_queued_requests,
            max_connections,
            connect_timeout,
            decision_log_size,
            seed,
            index,
            cluster,
            tracing
        );
        // A pod is kept across the reload as the pod table keeps it (`PodTable::replace`):
        // the same URL (without a trailing slash), class, role and data-parallel size; any
        // other change makes it a new pod, with a subscriber of its own.
        let url = |u: &str| u.trim_end_matches('/').to_string();
        let events = |c: &GatewayConfig, u: &str| {
            c.pod_events.iter().find(|e| url(&e.url) == url(u)).cloned()
        };
        let kept = |p: &PodEntry| {
            running.pods.iter().any(|r| {
                url(&r.url) == url(&p.url)
                    && r.class == p.class
                    && r.role == p.role
                    && r.data_parallel_size == p.data_parallel_size
            })
        };
        for pod in self.pods.iter().filter(|p| kept(p)) {
            if events(self, &pod.url) != events(running, &pod.url) {
                changed.push(format!(
                    "events of pod {}",
                    crate::pods::redact_userinfo(&url(&pod.url))
                ));
            }
        }
        changed
    }

    /// Loads `args.config` (if any) and resolves.
    pub fn from_args(args: &ServeArgs) -> Result<Self, ConfigError> {
        let file = match &args.config {
            Some(path) => Some(FileConfig::load(path)?),
            None => None,
        };
        GatewayConfig::resolve(args, file.as_ref())
    }
}

/// `GET /debug/config` (like Envoy's config dump): the configuration in force, as JSON. Key names
/// are the config file's and the flags' (durations in `_ms`); API keys appear as a count only.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ConfigDump {
    /// As configured (port 0: the port the OS chose is in the `kvgate serving on` line).
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    pub policy: &'static str,
    pub index: IndexKind,
    /// Token mode's tokenizer (`index = engine` only).
    pub tokenizer: Option<String>,
    pub seed: u64,
    pub response_headers: bool,
    /// Every router key with its value in force (the profile merged under the keys given).
    pub router: RouterConfig,
    pub limits: LimitsDump,
    pub auth: AuthDump,
    /// Whether a reload may leave no configured pod.
    pub allow_empty_pods: bool,
    /// `[flow_control]`, every key with its value in force.
    pub flow_control: kvgate_core::flow::FlowConfig,
    /// `[tracing]`, every key with its value in force.
    pub tracing: TracingConfig,
    /// The headers naming the client's session (read while session affinity is on).
    pub session_headers: Vec<String>,
    /// The pod table: the config's pods, then the discovered ones.
    pub pods: Vec<PodDump>,
}

/// What bounds a request and a pod (the README's "Limits, timeouts, shutdown" table).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LimitsDump {
    pub max_body_bytes: usize,
    pub max_body_bytes_in_flight: usize,
    pub body_read_timeout_ms: u64,
    pub max_prompt_tokens: u32,
    pub max_concurrent_requests: usize,
    pub max_queued_requests: usize,
    pub max_connections: usize,
    pub header_read_timeout_ms: u64,
    pub idle_connection_timeout_ms: u64,
    pub client_write_timeout_ms: u64,
    pub max_retries: u32,
    pub connect_timeout_ms: u64,
    pub first_byte_timeout_ms: u64,
    pub idle_chunk_timeout_ms: u64,
    pub request_timeout_ms: u64,
    pub pod_failure_threshold: u32,
    pub pod_failure_cooldown_ms: u64,
    pub scrape_interval_ms: u64,
    pub models_refresh_interval_ms: u64,
    pub decision_log_size: usize,
    pub shutdown_drain_ms: u64,
    pub shutdown_grace_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AuthDump {
    /// How many API keys are accepted (0: no authentication); never the keys.
    pub api_keys: usize,
    pub forward_authorization: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PodDump {
    pub url: String,
    pub class: String,
    /// `both`, `prefill` or `decode`.
    pub role: PodRole,
    /// Engines behind the URL, each routed as its own pod `URL#dp<rank>` (1: a plain pod).
    pub data_parallel_size: u32,
    /// `config` (the file or `--pod`) or `discovery`.
    pub source: &'static str,
    /// Its KV-cache event endpoints, when it publishes them.
    pub events: Option<PodEvents>,
}

impl ConfigDump {
    /// `config` in force, with `pod_table` (url, class), the pods routed to now.
    pub fn new(
        config: &GatewayConfig,
        pod_table: &[PodEntry],
        tokenizer: Option<String>,
    ) -> ConfigDump {
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let configured = |url: &str| {
            config
                .pods
                .iter()
                .any(|p| p.url.trim_end_matches('/') == url)
        };
        let pods = pod_table
            .iter()
            .map(|entry| {
                let url = entry.url.trim_end_matches('/');
                PodDump {
                    url: url.to_string(),
                    class: entry.class.clone(),
                    role: entry.role,
                    data_parallel_size: entry.data_parallel_size,
                    source: if configured(url) {
                        "config"
                    } else {
                        "discovery"
                    },
                    events: config.pod_events.iter().find(|e| e.url == url).cloned(),
                }
            })
            .collect();
        ConfigDump {
            listen: config.listen,
            admin_listen: config.admin_listen,
            policy: config.policy.name(),
            index: config.index,
            tokenizer,
            seed: config.seed,
            response_headers: config.response_headers,
            router: config.router,
            limits: LimitsDump {
                max_body_bytes: config.max_body_bytes,
                max_body_bytes_in_flight: config.max_body_bytes_in_flight,
                body_read_timeout_ms: ms(config.body_read_timeout),
                max_prompt_tokens: config.max_prompt_tokens,
                max_concurrent_requests: config.max_concurrent_requests,
                max_queued_requests: config.max_queued_requests,
                max_connections: config.max_connections,
                header_read_timeout_ms: ms(config.header_read_timeout),
                idle_connection_timeout_ms: ms(config.idle_connection_timeout),
                client_write_timeout_ms: ms(config.client_write_timeout),
                max_retries: config.max_retries,
                connect_timeout_ms: ms(config.connect_timeout),
                first_byte_timeout_ms: ms(config.first_byte_timeout),
                idle_chunk_timeout_ms: ms(config.idle_chunk_timeout),
                request_timeout_ms: ms(config.request_timeout),
                pod_failure_threshold: config.pod_failure_threshold,
                pod_failure_cooldown_ms: ms(config.pod_failure_cooldown),
                scrape_interval_ms: ms(config.scrape_interval),
                models_refresh_interval_ms: ms(config.models_refresh_interval),
                decision_log_size: config.decision_log_size,
                shutdown_drain_ms: ms(config.shutdown_drain),
                shutdown_grace_ms: ms(config.shutdown_grace),
            },
            auth: AuthDump {
                api_keys: config.api_keys.len(),
                forward_authorization: config.forward_authorization,
            },
            allow_empty_pods: config.allow_empty_pods,
            flow_control: config.flow,
            tracing: config.tracing.clone(),
            session_headers: config.session_headers.clone(),
            pods,
        }
    }
}

pub fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 8080))
}

pub fn default_admin_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 9090))
}

fn check_pod_url(url: &str) -> Result<(), ConfigError> {
    let bad = || ConfigError::BadPodUrl(url.to_string());
    let uri: http::Uri = url.parse().map_err(|_| bad())?;
    if uri.scheme_str() != Some("http") || uri.authority().is_none() {
        return Err(bad());
    }
    Ok(())
}

/// What `kvgate serve` was asked for: one field per flag, `None` (or empty, or false) where
/// the flag was not given, so the config file and the defaults fill in (see
/// [`GatewayConfig::resolve`]). The flags themselves (names, help, defaults shown, the
/// `KVGATE_API_KEYS` variable) are the binary's (`kvgate serve --help`); each field is named
/// after its flag.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ServeArgs {
    /// `--listen`: the traffic listener (OpenAI API).
    pub listen: Option<SocketAddr>,
    /// `--admin-listen`: the admin listener.
    pub admin_listen: Option<SocketAddr>,
    /// `--pod URL[,events=…,replay=…][,model=NAME][,class=NAME]`, repeatable.
    pub pod: Vec<String>,
    /// `--index`: which prefix index routes.
    pub index: Option<IndexKind>,
    /// `--tokenizer`: the served model's tokenizer.json, for token mode.
    pub tokenizer: Option<PathBuf>,
    /// `--chat-template`: a Jinja chat template replacing the one next to `--tokenizer`.
    pub chat_template: Option<PathBuf>,
    /// `--tokenization-cache-mib`: token mode's tokenization reuse budget (0: off; default 64).
    pub tokenization_cache_mib: Option<usize>,
    /// `--config`: the config file (TOML or YAML), reloaded when it changes.
    pub config: Option<PathBuf>,
    /// `--policy`: the routing policy by name.
    pub policy: Option<String>,
    /// `--scrape-interval-ms`: how often each pod's /metrics is scraped.
    pub scrape_interval_ms: Option<u64>,
    /// `--models-refresh-interval-ms`: how often each pod's /v1/models is read again.
    pub models_refresh_interval_ms: Option<u64>,
    /// `--seed`: the seed of the decision RNG.
    pub seed: Option<u64>,
    /// `--no-response-headers`: no x-kvgate-pod / x-kvgate-branch on responses.
    pub no_response_headers: bool,
    /// `--capture`: the Mooncake JSONL file served requests are appended to.
    pub capture: Option<PathBuf>,
    /// `--decisions-log`: the JSON-lines file every routed request's decision record, with
    /// its outcome, is appended to.
    pub decisions_log: Option<PathBuf>,
    /// `--ext-proc-listen`: also serve the Envoy ext_proc endpoint picker here.
    pub ext_proc_listen: Option<SocketAddr>,
    /// `--max-concurrent-requests`: requests served at once.
    pub max_concurrent_requests: Option<usize>,
    /// `--max-queued-requests`: requests waiting for a slot.
    pub max_queued_requests: Option<usize>,
    /// `--api-key` (repeatable) or `KVGATE_API_KEYS`: the accepted API keys.
    pub api_key: Vec<String>,
    /// `--forward-authorization`: forward the client's Authorization header.
    pub forward_authorization: bool,
    /// `--shutdown-grace-ms`: how long in-flight requests may still run on shutdown.
    pub shutdown_grace_ms: Option<u64>,
    /// `--connect-timeout-ms`: the upstream TCP connect timeout.
    pub connect_timeout_ms: Option<u64>,
    /// `--first-byte-timeout-ms`: the longest wait for a pod's response headers.
    pub first_byte_timeout_ms: Option<u64>,
    /// `--idle-chunk-timeout-ms`: the longest silence between two chunks.
    pub idle_chunk_timeout_ms: Option<u64>,
    /// `--max-prompt-tokens`: the longest prompt accepted.
    pub max_prompt_tokens: Option<u32>,
    /// `--discovery`: where pods come from besides `--pod` and the config file.
    pub discovery: Option<DiscoveryKind>,
    /// `--selector`: with kubernetes discovery, the model-server Pods' label selector.
    pub selector: Option<String>,
    /// `--namespace`: with kubernetes discovery, the Pods' namespace.
    pub namespace: Option<String>,
    /// `--target-port`: with kubernetes discovery, the model server's port.
    pub target_port: Option<u16>,
    /// `--request-timeout-ms`: the longest life of one request.
    pub request_timeout_ms: Option<u64>,
    /// `--shutdown-drain-ms`: how long /readyz answers 503 before the listener closes.
    pub shutdown_drain_ms: Option<u64>,
    /// `--pod-failure-threshold`: mid-body failures in a row before a pod is avoided.
    pub pod_failure_threshold: Option<u32>,
    /// `--pod-failure-cooldown-ms`: how long such a pod is avoided.
    pub pod_failure_cooldown_ms: Option<u64>,
    /// `--max-connections`: traffic connections open at once.
    pub max_connections: Option<usize>,
    /// `--header-read-timeout-ms`: the longest wait for a whole request head.
    pub header_read_timeout_ms: Option<u64>,
    /// `--idle-connection-timeout-ms`: the life of a keep-alive connection with nothing in flight.
    pub idle_connection_timeout_ms: Option<u64>,
    /// `--client-write-timeout-ms`: the longest a client may accept no byte of its response.
    pub client_write_timeout_ms: Option<u64>,
    /// `--cluster nats://HOST:PORT`: share routing state with the other replicas there.
    pub cluster: Option<String>,
    /// `--cluster-name`: the fleet's name on that NATS server.
    pub cluster_name: Option<String>,
}

/// `--discovery`; [`DiscoveryKind::help`] says what each is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DiscoveryKind {
    #[default]
    Static,
    Kubernetes,
}

impl DiscoveryKind {
    /// Every kind, in the order `kvgate serve --help` lists them.
    pub const ALL: [DiscoveryKind; 2] = [DiscoveryKind::Static, DiscoveryKind::Kubernetes];

    /// The name in `--discovery`.
    pub fn name(self) -> &'static str {
        match self {
            DiscoveryKind::Static => "static",
            DiscoveryKind::Kubernetes => "kubernetes",
        }
    }

    /// What the kind is, as `kvgate serve --help` says it.
    pub fn help(self) -> &'static str {
        match self {
            DiscoveryKind::Static => "Only `--pod` and the config file's pods",
            DiscoveryKind::Kubernetes => {
                "Also the ready Pods matching `--selector` (a build with `--features k8s`)"
            }
        }
    }
}

/// The configured API keys, as digests. Its `Debug` shows only how many there are.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ApiKeys(Vec<[u8; 16]>);

impl std::fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ApiKeys({} keys)", self.0.len())
    }
}

fn digest(key: &[u8]) -> [u8; 16] {
    xxhash_rust::xxh3::xxh3_128(key).to_le_bytes()
}

impl ApiKeys {
    /// Empty keys are ignored (a trailing comma in `KVGATE_API_KEYS`).
    pub fn new<'a>(keys: impl IntoIterator<Item = &'a str>) -> Self {
        ApiKeys(
            keys.into_iter()
                .map(str::trim)
                .filter(|k| !k.is_empty())
                .map(|k| digest(k.as_bytes()))
                .collect(),
        )
    }

    /// No key configured: the listener is open.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How many keys are accepted (`/debug/config` shows this, never the keys).
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether an `Authorization` header value is `Bearer <one of the keys>`; every key is
    /// compared, in constant time.
    pub fn allows(&self, authorization: Option<&HeaderValue>) -> bool {
        let Some(key) = authorization.and_then(|v| bearer_token(v.as_bytes())) else {
            return false;
        };
        let presented = digest(key);
        self.0
            .iter()
            .fold(subtle::Choice::from(0), |ok, k| ok | k.ct_eq(&presented))
            .into()
    }
}

/// The token of `Bearer <token>` (scheme case-insensitive).
pub(crate) fn bearer_token(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(7)?;
    if !scheme.eq_ignore_ascii_case(b"bearer ") {
        return None;
    }
    let token = rest.trim_ascii();
    (!token.is_empty()).then_some(token)
}

/// Default lease of a silent peer.
pub const DEFAULT_LEASE_MS: u64 = 3_000;

/// Default cluster name (the NATS subject prefix `kvgate.<name>.`).
pub const DEFAULT_CLUSTER_NAME: &str = "default";

/// `--cluster` and its companions (read at start only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    /// The NATS server, `nats://HOST:PORT`.
    pub url: String,
    /// Subject prefix: several fleets can share one NATS server.
    pub name: String,
    pub lease: Duration,
    /// Publish each normally completed request's training sample and learn from the peers'
    /// (`cluster_share_samples`, default true): every replica's predictor then learns from
    /// the fleet's requests, as one router's would.
    pub share_samples: bool,
}

/// A valid cluster name: 1–64 of `A-Za-z0-9_-` (it becomes a NATS subject token).
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_events_take_tcp_or_ipc_endpoints_and_nothing_else() {
        let (_, events) =
            parse_pod_arg("http://a:1,events=ipc:///run/vllm/ev.ipc,replay=tcp://a:5558").unwrap();
        let events = events.unwrap();
        assert_eq!(events.endpoint, "ipc:///run/vllm/ev.ipc");
        assert_eq!(events.replay.as_deref(), Some("tcp://a:5558"));
        assert!(parse_pod_arg("http://a:1,events=tcp://a:5557").is_ok());
        for bad in [
            "http://a:1,events=udp://a:5557",
            "http://a:1,events=tcp://a:1,replay=a:2",
        ] {
            assert!(
                matches!(parse_pod_arg(bad), Err(ConfigError::BadPodOption(_))),
                "{bad}"
            );
        }
    }

    fn no_flags() -> ServeArgs {
        ServeArgs::default()
    }

    /// The first ```toml block after `after` in `text`, with `prefix` stripped from each line.
    fn toml_example(text: &str, after: &str, prefix: &str) -> String {
        let start = text.find(after).expect("section") + after.len();
        text[start..]
            .lines()
            .map(|l| {
                l.strip_prefix(prefix)
                    .unwrap_or(l.trim_end_matches(prefix.trim_end()))
            })
            .skip_while(|l| *l != "```toml")
            .skip(1)
            .take_while(|l| *l != "```")
            .collect::<Vec<_>>()
            .join("\n")
    }

    #[test]
    fn session_headers_default_to_the_agent_clients_and_are_checked() {
        let file = |t: &str| toml::from_str::<FileConfig>(t).unwrap();
        let with_pod = |t: &str| format!("pods = [\"http://a:1\"]\n{t}");
        let c = GatewayConfig::resolve(&no_flags(), Some(&file(&with_pod("")))).unwrap();
        assert_eq!(
            c.session_headers,
            crate::session_key::DEFAULT_SESSION_HEADERS.map(String::from)
        );
        let c = GatewayConfig::resolve(
            &no_flags(),
            Some(&file(&with_pod("session_headers = [\"X-Agent-Run\"]"))),
        )
        .unwrap();
        assert_eq!(c.session_headers, ["x-agent-run"], "lower-cased");
        assert_eq!(
            ConfigDump::new(&c, &[], None).session_headers,
            ["x-agent-run"]
        );
        let none =
            GatewayConfig::resolve(&no_flags(), Some(&file(&with_pod("session_headers = []"))));
        assert!(none.unwrap().session_headers.is_empty());
        let bad = GatewayConfig::resolve(
            &no_flags(),
            Some(&file(&with_pod("session_headers = [\"a b\"]"))),
        );
        assert!(
            matches!(bad, Err(ConfigError::BadSessionHeader(_))),
            "{bad:?}"
        );
    }

    #[test]
    fn the_documented_example_configs_load() {
        let examples = [
            (
                "docs/operation.md",
                toml_example(
                    include_str!("../../../../docs/operation.md"),
                    "## Config file",
                    "",
                ),
            ),
            (
                "config.rs module doc",
                toml_example(include_str!("config.rs"), "Example `kvgate.toml`", "//! "),
            ),
        ];
        for (place, text) in examples {
            assert!(text.contains("[[pods]]"), "{place}: example not found");
            let file: FileConfig =
                toml::from_str(&text).unwrap_or_else(|e| panic!("{place}: {e}\n{text}"));
            let c = GatewayConfig::resolve(&no_flags(), Some(&file))
                .unwrap_or_else(|e| panic!("{place}: {e}"));
            assert_eq!(c.pods.len(), 3, "{place}");
            assert_eq!(c.pods[1].class, "h100", "{place}");
            assert_eq!(c.index, IndexKind::Engine, "{place}");
        }
    }

    #[test]
    fn the_cluster_is_off_by_default_and_read_from_flags_or_file() {
        assert_eq!(
            GatewayConfig::resolve(&no_flags(), None).unwrap().cluster,
            None
        );
        let flags = ServeArgs {
            cluster: Some("nats://127.0.0.1:4222".into()),
            ..no_flags()
        };
        let c = GatewayConfig::resolve(&flags, None)
            .unwrap()
            .cluster
            .unwrap();
        assert_eq!(c.url, "nats://127.0.0.1:4222");
        assert_eq!(c.name, "default");
        assert_eq!(c.lease, Duration::from_millis(3_000));
        let file: FileConfig = toml::from_str(
            "cluster = \"nats://n:4222\"\ncluster_name = \"fleet-a\"\ncluster_lease_ms = 500\n",
        )
        .unwrap();
        let c = GatewayConfig::resolve(&no_flags(), Some(&file))
            .unwrap()
            .cluster
            .unwrap();
        assert_eq!(
            (c.url.as_str(), c.name.as_str()),
            ("nats://n:4222", "fleet-a")
        );
        assert_eq!(c.lease, Duration::from_millis(500));
        for (url, name) in [
            ("http://n:4222", None),
            ("nats://", None),
            ("nats://n:4222", Some("a.b")),
            ("nats://n:4222", Some("")),
        ] {
            let flags = ServeArgs {
                cluster: Some(url.into()),
                cluster_name: name.map(str::to_string),
                ..no_flags()
            };
            assert!(
                matches!(
                    GatewayConfig::resolve(&flags, None),
                    Err(ConfigError::BadCluster(_))
                ),
                "{url} {name:?}"
            );
        }
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let c = GatewayConfig::resolve(&no_flags(), None).unwrap();
        assert_eq!(c.listen, default_listen());
        assert_eq!(c.admin_listen, default_admin_listen());
        assert_eq!(c.policy, PolicyKind::AffinityGate);
        assert_eq!(c.scrape_interval, Duration::from_millis(50));
        assert_eq!(c.max_body_bytes, 32 << 20);
        assert_eq!(c.decision_log_size, 256);
        assert_eq!(c.max_concurrent_requests, 1024);
        assert_eq!(c.max_queued_requests, 1024);
        assert_eq!(c.max_connections, 8192);
        assert_eq!(c.header_read_timeout, Duration::from_secs(10));
        assert_eq!(c.idle_connection_timeout, Duration::from_secs(75));
        assert_eq!(c.client_write_timeout, Duration::from_secs(60));
        assert_eq!(c.shutdown_grace, Duration::from_secs(10));
        assert_eq!(c.connect_timeout, Duration::from_secs(2));
        assert_eq!(c.first_byte_timeout, Duration::from_secs(60));
        assert_eq!(c.idle_chunk_timeout, Duration::from_secs(60));
        assert!(c.api_keys.is_empty());
        assert!(!c.forward_authorization);
        assert_eq!(c.max_prompt_tokens, 1 << 20);
        assert_eq!(c.request_timeout, Duration::from_secs(600));
        assert_eq!(c.shutdown_drain, Duration::from_secs(5));
        assert_eq!(c.pod_failure_threshold, 3);
        assert_eq!(c.pod_failure_cooldown, Duration::from_secs(10));
        assert!(c.response_headers);
        assert!(!c.allow_empty_pods);
    }

    #[test]
    fn flags_override_the_file_and_pods_add_up() {
        let file: FileConfig = toml::from_str(
            "policy = \"round-robin\"\nscrape_interval_ms = 200\npods = [\"http://a:1\", { url = \"http://b:2\", class = \"h100\" }]\n[router]\naffinityGateTau = 0.5\n",
        )
        .unwrap();
        let c = GatewayConfig::resolve(
            &ServeArgs {
                pod: vec!["http://c:3".into()],
                policy: Some("least-request".into()),
                ..no_flags()
            },
            Some(&file),
        )
        .unwrap();
        assert_eq!(c.policy, PolicyKind::LeastRequest);
        assert_eq!(c.scrape_interval, Duration::from_millis(200));
        assert_eq!(c.router.affinity_gate_tau, 0.5);
        assert_eq!(
            c.pods,
            vec![
                PodEntry::new("http://a:1", "default"),
                PodEntry::new("http://b:2", "h100"),
                PodEntry::new("http://c:3", "default"),
            ]
        );
    }

    #[test]
    fn data_parallel_size_comes_from_the_file_and_the_pod_flag_and_is_checked() {
        let file: FileConfig = toml::from_str(
            "pods = [{ url = \"http://p:1\", data_parallel_size = 4 }, \"http://b:2\"]\n",
        )
        .unwrap();
        let args = |pod: &str| ServeArgs {
            pod: vec![pod.into()],
            ..ServeArgs::default()
        };
        let c = GatewayConfig::resolve(&args("http://d:3,dp=2"), Some(&file)).unwrap();
        let sizes: Vec<u32> = c.pods.iter().map(|p| p.data_parallel_size).collect();
        assert_eq!(sizes, [4, 1, 2]);
        let ok = "http://d:3,dp=2,events=tcp://d:5557,replay=tcp://d:5558";
        assert!(GatewayConfig::resolve(&args(ok), None).is_ok());
        for bad in [
            "http://d:3,dp=0",
            "http://d:3,dp=x",
            "http://d:3,dp=257",
            "http://d:3,dp=2,events=ipc:///run/ev.ipc",
            "http://d:3,dp=2,events=tcp://d:65535",
        ] {
            assert!(GatewayConfig::resolve(&args(bad), None).is_err(), "{bad}");
        }
        // vLLM 0.32 runs a DP server with an ipc endpoint only when it ends in :PORT.
        assert!(
            GatewayConfig::resolve(&args("http://d:3,dp=2,events=ipc:///run/ev-tcp:5557"), None)
                .is_ok()
        );
    }

    #[test]
    fn rank_endpoints_shift_the_trailing_port_as_vllm_does() {
        assert_eq!(
            rank_endpoint("tcp://*:5557", 0).as_deref(),
            Some("tcp://*:5557")
        );
        assert_eq!(
            rank_endpoint("tcp://10.0.0.4:5557", 3).as_deref(),
            Some("tcp://10.0.0.4:5560")
        );
        assert_eq!(
            rank_endpoint("tcp://10.0.0.4:0", 3).as_deref(),
            Some("tcp://10.0.0.4:0")
        );
        assert_eq!(
            rank_endpoint("ipc:///r/ev-tcp:19040", 1).as_deref(),
            Some("ipc:///r/ev-tcp:19041")
        );
        assert_eq!(rank_endpoint("ipc:///r/ev.ipc", 1), None);
        assert_eq!(rank_endpoint("tcp://h:65535", 1), None);
    }

    #[test]
    fn pod_roles_come_from_the_file_and_the_pod_flag() {
        let file: FileConfig = toml::from_str(
            "pods = [{ url = \"http://p:1\", role = \"prefill\" }, \"http://b:2\"]\n",
        )
        .unwrap();
        let c = GatewayConfig::resolve(
            &ServeArgs {
                pod: vec!["http://d:3,role=decode".into()],
                ..no_flags()
            },
            Some(&file),
        )
        .unwrap();
        let roles: Vec<PodRole> = c.pods.iter().map(|p| p.role).collect();
        assert_eq!(roles, [PodRole::Prefill, PodRole::Both, PodRole::Decode]);
        let bad = GatewayConfig::resolve(
            &ServeArgs {
                pod: vec!["http://d:3,role=decoder".into()],
                ..no_flags()
            },
            None,
        );
        assert!(matches!(bad, Err(ConfigError::BadPodOption(_))), "{bad:?}");
        assert!(
            toml::from_str::<FileConfig>("pods = [{ url = \"http://p:1\", role = \"x\" }]")
                .is_err()
        );
    }

    #[test]
    fn yaml_is_accepted() {
        let dir = std::env::temp_dir().join(format!("kvgate-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("kvgate.yaml");
        std::fs::write(
            &path,
            "policy: prefix\npods:\n  - http://a:1\nrouter:\n  affinity_gate_tau: 0.9\n",
        )
        .unwrap();
        let file = FileConfig::load(&path).unwrap();
        let c = GatewayConfig::resolve(&no_flags(), Some(&file)).unwrap();
        assert_eq!(c.policy, PolicyKind::Prefix);
        assert_eq!(c.router.affinity_gate_tau, 0.9);
        assert_eq!(c.pods.len(), 1);
    }

    #[test]
    fn invalid_values_are_rejected_with_a_reason() {
        let bad = |toml_text: &str| {
            let file: FileConfig = toml::from_str(toml_text).unwrap();
            GatewayConfig::resolve(&no_flags(), Some(&file)).unwrap_err()
        };
        assert!(matches!(
            bad("policy = \"nope\""),
            ConfigError::UnknownPolicy(_)
        ));
        assert!(matches!(
            bad("pods = [\"ftp://x\"]"),
            ConfigError::BadPodUrl(_)
        ));
        // The router's own reader validates: an out-of-range value fails the file, naming the key.
        let err = toml::from_str::<FileConfig>("[router]\naffinity_gate_tau = 3.0").unwrap_err();
        assert!(err.to_string().contains("affinity_gate_tau"), "{err}");
        assert!(toml::from_str::<FileConfig>("unknown_key = 1").is_err());
        assert!(toml::from_str::<FileConfig>("[router]\naffinity_gate_tau = \"max\"").is_err());
    }

    fn temp_file(name: &str, text: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("kvgate-cfg-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn seed_gate_profile_in_a_toml_yaml_or_json_file_runs_the_seed_gate_with_given_keys_over_it() {
        let seed_with_spread = RouterConfig {
            cold_spread_window_ms: 20.0,
            ..RouterConfig::seed()
        };
        for (name, text) in [
            (
                "kvgate.toml",
                "[router]\ngate_profile = \"seed\"\ncold_spread_window_ms = 20\n",
            ),
            (
                "kvgate.yaml",
                "router:\n  gateProfile: seed\n  coldSpreadWindowMs: 20\n",
            ),
            (
                "kvgate.json",
                r#"{"router": {"gate_profile": "seed", "cold_spread_window_ms": 20}}"#,
            ),
        ] {
            let file = FileConfig::load(&temp_file(name, text)).unwrap();
            let c = GatewayConfig::resolve(&no_flags(), Some(&file)).unwrap();
            assert_eq!(c.router, seed_with_spread, "{name}");
            assert_eq!(
                c.router.explore_mode,
                kvgate_core::config::ExploreMode::BestOverall,
                "{name}"
            );
        }
    }

    #[test]
    fn config_dump_shows_the_merged_router_keys_the_limits_and_the_pods() {
        let file: FileConfig = toml::from_str(
            r#"max_body_bytes = 1000
max_retries = 1
pods = ["http://a:1/", { url = "http://b:2", class = "h100", events = "tcp://b:5557" }]
[router]
gate_profile = "seed"
explore_max_extra_ms = 9
"#,
        )
        .unwrap();
        let c = GatewayConfig::resolve(
            &ServeArgs {
                first_byte_timeout_ms: Some(1234),
                api_key: vec!["secret-one".into(), "secret-two".into()],
                index: Some(IndexKind::Engine),
                ..no_flags()
            },
            Some(&file),
        )
        .unwrap();
        let table = [
            PodEntry::new("http://a:1", "default"),
            PodEntry::new("http://b:2", "h100"),
            PodEntry::new("http://10.0.0.9:8000", "default"),
        ];
        let dump = ConfigDump::new(&c, &table, Some("built-in cl100k".into()));
        let v = serde_json::to_value(&dump).unwrap();
        assert_eq!(v["policy"], "affinity-gate");
        assert_eq!(v["index"], "engine");
        assert_eq!(v["tokenizer"], "built-in cl100k");
        let router = &v["router"];
        assert_eq!(router["gate_profile"], "seed");
        assert_eq!(router["explore_mode"], "best-overall");
        assert_eq!(router["affinity_relative_penalty"], 0.0);
        assert_eq!(router["explore_max_extra_ms"], 9.0);
        assert_eq!(router["affinity_gate_tau"], 0.8);
        let limits = &v["limits"];
        assert_eq!(limits["max_body_bytes"], 1000);
        assert_eq!(limits["max_retries"], 1);
        assert_eq!(limits["first_byte_timeout_ms"], 1234);
        assert_eq!(limits["request_timeout_ms"], 600_000);
        assert_eq!(limits["max_concurrent_requests"], 1024);
        assert_eq!(v["auth"]["api_keys"], 2);
        assert!(!v.to_string().contains("secret"), "{v}");
        assert_eq!(
            v["pods"],
            serde_json::json!([
                {"url": "http://a:1", "class": "default", "role": "both", "data_parallel_size": 1, "source": "config",
                    "events": null},
                {"url": "http://b:2", "class": "h100", "role": "both", "data_parallel_size": 1, "source": "config",
                    "events": {"endpoint": "tcp://b:5557", "replay": null, "model": null}},
                {"url": "http://10.0.0.9:8000", "class": "default", "role": "both", "data_parallel_size": 1,
                    "source": "discovery", "events": null},
            ])
        );
    }

    #[test]
    fn a_reloaded_config_names_the_start_only_settings_it_changes() {
        let running = GatewayConfig::resolve(
            &ServeArgs {
                listen: Some("127.0.0.1:7000".parse().unwrap()),
                pod: vec!["http://a:1,events=tcp://a:5557".into(), "http://b:1".into()],
                ..no_flags()
            },
            None,
        )
        .unwrap();
        let reload = |text: &str| {
            let file: FileConfig = toml::from_str(text).unwrap();
            GatewayConfig::resolve(
                &ServeArgs {
                    listen: Some("127.0.0.1:7000".parse().unwrap()),
                    ..no_flags()
                },
                Some(&file),
            )
            .unwrap()
        };
        let pods = "pods = [{ url = \"http://a:1\", events = \"tcp://a:5557\" }, \"http://b:1\"]\n";
        // Live settings only: nothing to refuse.
        let live = reload(&format!("{pods}max_retries = 0\n"));
        assert!(live.start_only_changes(&running).is_empty());
        let changed = reload(&format!(
            "{pods}admin_listen = \"127.0.0.1:7002\"\nmax_concurrent_requests = 8\nindex = \"engine\"\n"
        ));
        assert_eq!(
            changed.start_only_changes(&running),
            ["admin_listen", "max_concurrent_requests", "index"]
        );
        // A kept pod's events changed or dropped: start only; a new pod may bring its own.
        let events = reload(
            "pods = [{ url = \"http://a:1\", events = \"tcp://a:6000\" }, \"http://b:1\", \
             { url = \"http://c:1\", events = \"tcp://c:5557\" }]\n",
        );
        assert_eq!(
            events.start_only_changes(&running),
            ["events of pod http://a:1"]
        );
        let added = reload(
            "pods = [{ url = \"http://a:1\", events = \"tcp://a:5557\" }, \"http://b:1\", \
             { url = \"http://c:1\", events = \"tcp://c:5557\" }]\n",
        );
        assert!(added.start_only_changes(&running).is_empty());
        // The same pod written with a trailing slash is the same pod.
        let slash = reload(
            "pods = [{ url = \"http://a:1/\", events = \"tcp://a:6000\" }, \"http://b:1\"]\n",
        );
        assert_eq!(
            slash.start_only_changes(&running),
            ["events of pod http://a:1"]
        );
        // Another class makes it a new pod (a fresh subscriber): its events may change.
        let new_pod = reload(
            "pods = [{ url = \"http://a:1\", class = \"big\", events = \"tcp://a:6000\" }, \
             \"http://b:1\"]\n",
        );
        assert!(new_pod.start_only_changes(&running).is_empty());
    }

    #[test]
    fn connection_limits_come_from_the_file_or_the_flags_and_zero_is_refused() {
        let file: FileConfig = toml::from_str(
            "max_connections = 10\nheader_read_timeout_ms = 1\nidle_connection_timeout_ms = 2\n\
             client_write_timeout_ms = 3\n",
        )
        .unwrap();
        let c = GatewayConfig::resolve(&no_flags(), Some(&file)).unwrap();
        assert_eq!(c.max_connections, 10);
        assert_eq!(c.header_read_timeout, Duration::from_millis(1));
        assert_eq!(c.idle_connection_timeout, Duration::from_millis(2));
        assert_eq!(c.client_write_timeout, Duration::from_millis(3));
        let flags = ServeArgs {
            max_connections: Some(20),
            header_read_timeout_ms: Some(4),
            idle_connection_timeout_ms: Some(5),
            client_write_timeout_ms: Some(6),
            ..no_flags()
        };
        let c = GatewayConfig::resolve(&flags, Some(&file)).unwrap();
        assert_eq!(c.max_connections, 20);
        assert_eq!(c.header_read_timeout, Duration::from_millis(4));
        assert_eq!(c.idle_connection_timeout, Duration::from_millis(5));
        assert_eq!(c.client_write_timeout, Duration::from_millis(6));
        let dump = serde_json::to_value(ConfigDump::new(&c, &[], None)).unwrap();
        assert_eq!(dump["limits"]["max_connections"], 20);
        assert_eq!(dump["limits"]["client_write_timeout_ms"], 6);
        for key in [
            "max_connections",
            "header_read_timeout_ms",
            "idle_connection_timeout_ms",
            "client_write_timeout_ms",
        ] {
            let file: FileConfig = toml::from_str(&format!("{key} = 0")).unwrap();
            let err = GatewayConfig::resolve(&no_flags(), Some(&file)).unwrap_err();
            assert!(
                matches!(err, ConfigError::NotPositive(k) if k == key),
                "{key}: {err}"
            );
        }
        // The cap sizes the accept loop's semaphore: a reload cannot change it.
        let reloaded = GatewayConfig::resolve(&no_flags(), Some(&file_with_cap())).unwrap();
        let running = GatewayConfig::resolve(&no_flags(), None).unwrap();
        assert_eq!(reloaded.start_only_changes(&running), ["max_connections"]);
    }

    fn file_with_cap() -> FileConfig {
        toml::from_str("max_connections = 3\n").unwrap()
    }

    #[test]
    fn a_config_file_that_sets_a_removed_key_or_value_fails_to_load_naming_it() {
        for (name, text, names) in [
            // A removed key, in either spelling and in each file format.
            (
                "removed-key.toml",
                "[router]\npredictor_model = \"gbdt\"\n",
                "predictor_model was removed on 2026-12-07",
            ),
            (
                "removed-key.yaml",
                "router:\n  predictorModel: rls-split\n",
                "predictor_model was removed on 2026-12-07",
            ),
            // A removed value of a kept key.
            (
                "removed-value.toml",
                "[router]\naffinityGateTau = \"auto\"\nexperimentalOptions = true\n",
                "affinity_gate_tau = \"auto\" was removed on 2026-12-07",
            ),
            (
                "removed-value.json",
                r#"{"router": {"explore_mode": "least-loaded-non-sticky"}}"#,
                "explore_mode = \"least-loaded-non-sticky\" was removed on 2026-12-07",
            ),
        ] {
            let err = FileConfig::load(&temp_file(name, text)).unwrap_err();
            let message = err.to_string();
            assert!(
                matches!(err, ConfigError::Parse { .. }),
                "{name}: {message}"
            );
            assert!(message.contains(names), "{name}: {message}");
            assert!(message.contains("docs/decisions/"), "{name}: {message}");
        }
        // An integer is a number too.
        let file: FileConfig = toml::from_str("[router]\naffinity_gate_tau = 1\n").unwrap();
        let c = GatewayConfig::resolve(&no_flags(), Some(&file)).unwrap();
        assert_eq!(c.router.affinity_gate_tau, 1.0);
    }

    #[test]
    fn tracing_is_off_by_default_and_one_key_turns_it_on() {
        let c = GatewayConfig::resolve(&no_flags(), None).unwrap();
        assert_eq!(c.tracing, TracingConfig::default());
        assert_eq!(c.tracing.endpoint(), None);
        assert_eq!(c.tracing.sampling_ratio, 1.0);
        let on = |text: &str| -> Result<GatewayConfig, ConfigError> {
            let file: FileConfig = toml::from_str(text).unwrap();
            GatewayConfig::resolve(&no_flags(), Some(&file))
        };
        for (url, export) in [
            ("http://c:4318/v1/traces", "http://c:4318/v1/traces"),
            ("http://c:4318", "http://c:4318/v1/traces"),
            ("http://c:4318/", "http://c:4318/v1/traces"),
            ("http://c:9000/otlp/traces", "http://c:9000/otlp/traces"),
        ] {
            let c = on(&format!("[tracing]\notlp_traces_endpoint = \"{url}\"\n")).unwrap();
            assert_eq!(c.tracing.endpoint().as_deref(), Some(export), "{url}");
        }
        let c = on("[tracing]\notlp_traces_endpoint = \"http://c:4318\"\nsampling_ratio = 0.01\n")
            .unwrap();
        assert_eq!(c.tracing.sampling_ratio, 0.01);
        for bad in [
            "[tracing]\notlp_traces_endpoint = \"https://c:4318\"\n",
            "[tracing]\notlp_traces_endpoint = \"c:4318\"\n",
            "[tracing]\notlp_traces_endpoint = \"http://\"\n",
            "[tracing]\nsampling_ratio = 1.5\n",
            "[tracing]\nsampling_ratio = -0.1\n",
        ] {
            assert!(matches!(on(bad), Err(ConfigError::BadTracing(_))), "{bad}");
        }
        assert!(toml::from_str::<FileConfig>("[tracing]\nendpoint = \"x\"\n").is_err());
    }
}
