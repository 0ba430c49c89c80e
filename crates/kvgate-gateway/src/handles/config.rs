//! Gateway configuration: one [`Settings`] tree for `kvgate serve`, laid in layers, each over
//! the one before: the defaults in code (with `[router]`'s `gate_profile` applied first, the
//! router keys given over it), the config file (`--config`: TOML, YAML by extension
//! `.yaml`/`.yml`, JSON by `.json`), the environment (`KVGATE_MAX_RETRIES=1`,
//! `KVGATE_ROUTER__EPSILON_EXPLORE_STICKY=0`), then the flags (`--set key.path=value`, and the
//! everyday flags that are sugar for keys). One generic merge does it ([`layers`]); no key is
//! merged by hand.
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
//! [`crate::reload`]) and laid again under the same environment and flags; a file that fails to
//! parse or validate keeps the old config and logs why. So does a reloaded file that is empty
//! (or only whitespace), and one that leaves the gateway with no configured pod while discovery
//! is static, unless it says `allow_empty_pods = true`: an editor's or `cat >`'s
//! truncate-then-write, or an empty ConfigMap, would otherwise turn every request into a 503
//! ([`GatewayConfig::check_reloaded`]). Every key says whether a reload may change it
//! ([`KEYS`]); a reloaded file that changes a start-only key, or the KV events of a pod already
//! routed to, is refused whole, naming them ([`GatewayConfig::start_only_changes`]).
//! [`GatewayConfig::dump`] is the settings in force as the admin listener's `GET /debug/config`
//! shows them: [`Settings`] serialised, which read back as a config file starts the same gateway.
//!
//! The config's plain data lives here too, so this module needs none of the modules that use
//! it: [`ServeArgs`] (the layers `kvgate serve` was given), [`DiscoveryKind`], [`ApiKeys`],
//! [`ClusterConfig`] (with [`valid_name`] and its defaults).

mod layers;
pub use layers::{ENV_PREFIX, RENAMED};

use crate::pods::PodEntry;
use http::HeaderValue;
use kvgate_core::policy::PolicyKind;
use kvgate_core::{PodRole, RouterConfig};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::PathBuf;
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
/// Default number of requests waiting for a slot before 429 (`max_waiting_requests`).
pub const DEFAULT_MAX_WAITING_REQUESTS: usize = 1024;
/// Default port of the model server on a discovered Pod (vLLM's default).
pub const DEFAULT_TARGET_PORT: u16 = 8000;
/// Default token-mode tokenization reuse budget (`tokenization_cache_mib`).
pub const DEFAULT_TOKENIZATION_CACHE_MIB: usize = crate::token_cache::DEFAULT_BUDGET_BYTES >> 20;
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
    #[error("{path} is empty")]
    EmptyFile { path: String },
    #[error(
        "no pods: neither the file nor --pod names one, and discovery is static \
         (set allow_empty_pods = true to run with none)"
    )]
    NoPods,
    #[error("{0}")]
    Flow(#[from] kvgate_core::flow::FlowConfigError),
}

/// The old default of `session_headers`, a key removed with session affinity.
const REMOVED_SESSION_HEADERS_DEFAULT: [&str; 3] = [
    "x-session-id",
    "x-claude-code-session-id",
    "x-session-affinity",
];

/// `session_headers`, a key removed with session affinity (it named the headers session
/// affinity read): its old default (the three headers above, in that order, any case) is
/// accepted and ignored, so a config that only named the default keeps working; any other
/// value is refused.
fn removed_session_headers<'de, D: serde::Deserializer<'de>>(d: D) -> Result<(), D::Error> {
    let given = <Vec<String> as Deserialize>::deserialize(d)?;
    let old_default = given.len() == REMOVED_SESSION_HEADERS_DEFAULT.len()
        && given
            .iter()
            .zip(REMOVED_SESSION_HEADERS_DEFAULT)
            .all(|(g, d)| g.trim().eq_ignore_ascii_case(d));
    if old_default {
        return Ok(());
    }
    Err(serde::de::Error::custom(kvgate_core::config::removed(
        "session_headers",
        "docs/decisions/session-affinity.md: session affinity, which read these headers, \
         measured neutral on compacted agent sessions in the simulator, on real vLLM, and with a \
         lossy engine index; leave the key out",
    )))
}

/// Which prefix index routes (DESIGN.md §4); [`IndexKind::help`] says what each is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
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

/// A pod in the settings: a URL (optionally with `--pod`'s `,events=…` options), or a table with
/// a URL, a predictor class, KV-event endpoints, a P/D role and a data-parallel size.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum PodSpec {
    Url(String),
    Full {
        url: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        class: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        events: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        replay: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        model: Option<String>,
        /// `both` (default), `prefill` or `decode`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        role: Option<PodRole>,
        /// Engines behind the URL (vLLM `--data-parallel-size`); 1 by default.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        data_parallel_size: Option<u32>,
    },
}

/// Durations are written in milliseconds (the keys end in `_ms`).
mod millis {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_millis)
    }
}

/// Whether a reload may change a key ([`KEYS`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reload {
    /// A reloaded file applies it.
    Live,
    /// Read at start only: a reloaded file that changes it is refused whole.
    StartOnly,
}

/// Every top-level key of [`Settings`] and whether a reload may change it (the nested keys of
/// `[router]` and `[flow_control]` are live, those of `[tracing]` start-only). A test checks
/// that this names every key. Besides, the KV events of a pod kept across a reload are
/// start-only ([`GatewayConfig::start_only_changes`]).
pub const KEYS: &[(&str, Reload)] = &[
    ("listen", Reload::StartOnly),
    ("admin_listen", Reload::StartOnly),
    ("ext_proc_listen", Reload::StartOnly),
    ("pods", Reload::Live),
    ("allow_empty_pods", Reload::Live),
    ("discovery", Reload::StartOnly),
    ("selector", Reload::StartOnly),
    ("namespace", Reload::StartOnly),
    ("target_port", Reload::StartOnly),
    ("policy", Reload::Live),
    ("index", Reload::StartOnly),
    ("seed", Reload::StartOnly),
    ("tokenizer", Reload::StartOnly),
    ("chat_template", Reload::StartOnly),
    ("tokenization_cache_mib", Reload::StartOnly),
    ("response_headers", Reload::Live),
    ("forward_authorization", Reload::Live),
    ("scrape_interval_ms", Reload::Live),
    ("models_refresh_interval_ms", Reload::Live),
    ("max_concurrent_requests", Reload::StartOnly),
    ("max_waiting_requests", Reload::StartOnly),
    ("max_connections", Reload::StartOnly),
    ("max_body_bytes", Reload::Live),
    ("max_body_bytes_in_flight", Reload::Live),
    ("max_prompt_tokens", Reload::Live),
    ("max_retries", Reload::Live),
    ("decision_log_size", Reload::StartOnly),
    ("body_read_timeout_ms", Reload::Live),
    ("header_read_timeout_ms", Reload::Live),
    ("idle_connection_timeout_ms", Reload::Live),
    ("client_write_timeout_ms", Reload::Live),
    ("connect_timeout_ms", Reload::StartOnly),
    ("first_byte_timeout_ms", Reload::Live),
    ("idle_chunk_timeout_ms", Reload::Live),
    ("request_timeout_ms", Reload::Live),
    ("pod_failure_threshold", Reload::Live),
    ("pod_failure_cooldown_ms", Reload::Live),
    ("shutdown_drain_ms", Reload::Live),
    ("shutdown_grace_ms", Reload::Live),
    ("capture", Reload::StartOnly),
    ("decisions_log", Reload::StartOnly),
    ("cluster", Reload::StartOnly),
    ("cluster_name", Reload::StartOnly),
    ("cluster_lease_ms", Reload::StartOnly),
    ("cluster_share_samples", Reload::StartOnly),
    ("router", Reload::Live),
    ("flow_control", Reload::Live),
    ("tracing", Reload::StartOnly),
];

/// `kvgate serve`'s settings: every key, with its value. The one type of the config file, the
/// `KVGATE_…` environment, `--set` and `/debug/config` (this, serialised); the layers are
/// merged by [`layers`] and read here once. Durations are keys ending in `_ms`. See
/// docs/operation.md for every key, its default and whether a reload may change it ([`KEYS`]).
/// API keys are secrets, not settings: they come separately ([`ServeArgs::api_key`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// Traffic listener (OpenAI API).
    pub listen: SocketAddr,
    /// Admin listener (`/metrics`, `/debug/*`, `/healthz`, `/readyz`).
    pub admin_listen: SocketAddr,
    /// Also serve the Envoy ext_proc endpoint picker here.
    pub ext_proc_listen: Option<SocketAddr>,
    /// The configured pods (discovered ones are not settings).
    pub pods: Vec<PodSpec>,
    /// A reloaded file may leave no configured pod while discovery is static.
    pub allow_empty_pods: bool,
    /// Where pods come from besides `pods`.
    pub discovery: DiscoveryKind,
    /// Kubernetes discovery: the model-server Pods' label selector.
    pub selector: Option<String>,
    /// Kubernetes discovery: the Pods' namespace (default: the client's).
    pub namespace: Option<String>,
    /// Kubernetes discovery: the model server's port on each Pod.
    pub target_port: u16,
    pub policy: PolicyKind,
    pub index: IndexKind,
    /// Seed of the decision RNG.
    pub seed: u64,
    /// Token mode's tokenizer.json (default: the built-in cl100k).
    pub tokenizer: Option<PathBuf>,
    /// A Jinja chat template replacing the model's own.
    pub chat_template: Option<PathBuf>,
    /// Token mode's tokenization reuse budget, MiB (0: off).
    pub tokenization_cache_mib: usize,
    /// x-kvgate-pod / x-kvgate-branch / x-kvgate-queue-ms on responses.
    pub response_headers: bool,
    /// Removed on 2026-12-07 with session affinity ([`removed_session_headers`]): read only
    /// to accept its old default or refuse anything else; never written.
    #[serde(
        rename = "session_headers",
        skip_serializing,
        deserialize_with = "removed_session_headers"
    )]
    pub removed_session_headers: (),
    /// Pass the client's Authorization header to the pods.
    pub forward_authorization: bool,
    #[serde(rename = "scrape_interval_ms", with = "millis")]
    pub scrape_interval: Duration,
    /// How often each pod's `/v1/models` is read again.
    #[serde(rename = "models_refresh_interval_ms", with = "millis")]
    pub models_refresh_interval: Duration,
    /// Requests served at once.
    pub max_concurrent_requests: usize,
    /// Requests waiting for a slot (the admission queue); beyond, 429. Formerly
    /// `max_queued_requests`, the name `[flow_control]` keeps for its own queue.
    pub max_waiting_requests: usize,
    /// Traffic connections open at once; beyond, closed at accept.
    pub max_connections: usize,
    pub max_body_bytes: usize,
    /// Request-body bytes held at once over all requests; beyond, 503 (see `limits`).
    pub max_body_bytes_in_flight: usize,
    /// Longest prompt accepted, tokens; longer: 400.
    pub max_prompt_tokens: u32,
    pub max_retries: u32,
    /// Size of the `/debug/decisions` ring.
    pub decision_log_size: usize,
    /// A request's whole body must arrive within this of its arrival, before it takes a slot.
    #[serde(rename = "body_read_timeout_ms", with = "millis")]
    pub body_read_timeout: Duration,
    /// A request head must arrive whole within this (of the accept, or of its first byte).
    #[serde(rename = "header_read_timeout_ms", with = "millis")]
    pub header_read_timeout: Duration,
    /// A keep-alive connection with nothing in flight is closed after this.
    #[serde(rename = "idle_connection_timeout_ms", with = "millis")]
    pub idle_connection_timeout: Duration,
    /// A connection whose client accepts no byte for this long is closed.
    #[serde(rename = "client_write_timeout_ms", with = "millis")]
    pub client_write_timeout: Duration,
    /// Upstream connect timeout.
    #[serde(rename = "connect_timeout_ms", with = "millis")]
    pub connect_timeout: Duration,
    /// Longest wait for a pod's response headers.
    #[serde(rename = "first_byte_timeout_ms", with = "millis")]
    pub first_byte_timeout: Duration,
    /// Longest silence between two chunks of a pod's response.
    #[serde(rename = "idle_chunk_timeout_ms", with = "millis")]
    pub idle_chunk_timeout: Duration,
    /// Longest life of one request, from admission to its last byte.
    #[serde(rename = "request_timeout_ms", with = "millis")]
    pub request_timeout: Duration,
    /// Responses in a row dying mid-body on a pod before it is avoided ([`crate::breaker`]).
    pub pod_failure_threshold: u32,
    /// How long such a pod is avoided.
    #[serde(rename = "pod_failure_cooldown_ms", with = "millis")]
    pub pod_failure_cooldown: Duration,
    /// On SIGTERM: pause between readiness turning false and the listener closing.
    #[serde(rename = "shutdown_drain_ms", with = "millis")]
    pub shutdown_drain: Duration,
    /// On SIGTERM: how long in-flight requests may still run.
    #[serde(rename = "shutdown_grace_ms", with = "millis")]
    pub shutdown_grace: Duration,
    /// The Mooncake JSONL file served requests are appended to.
    pub capture: Option<PathBuf>,
    /// The JSON-lines file every routed request's decision, with its outcome, is appended to.
    pub decisions_log: Option<PathBuf>,
    /// The NATS server other replicas share routing state over (`nats://HOST:PORT`).
    pub cluster: Option<String>,
    /// The fleet's name on that server.
    pub cluster_name: String,
    /// A silent replica's charges are returned after this.
    #[serde(rename = "cluster_lease_ms", with = "millis")]
    pub cluster_lease: Duration,
    /// Share the predictor's training samples with the other replicas.
    pub cluster_share_samples: bool,
    /// `[router]`: `kvgate_core::RouterConfig` (its `gate_profile` first, the keys given over
    /// it; llm-d camelCase names accepted).
    pub router: RouterConfig,
    /// `[flow_control]` (see `kvgate_core::flow`); `enabled = false` by default.
    #[serde(rename = "flow_control")]
    pub flow: kvgate_core::flow::FlowConfig,
    /// `[tracing]`: OpenTelemetry traces ([`crate::otel`]).
    pub tracing: TracingConfig,
}

impl Default for Settings {
    fn default() -> Self {
        let ms = Duration::from_millis;
        Settings {
            listen: default_listen(),
            admin_listen: default_admin_listen(),
            ext_proc_listen: None,
            pods: Vec::new(),
            allow_empty_pods: false,
            discovery: DiscoveryKind::Static,
            selector: None,
            namespace: None,
            target_port: DEFAULT_TARGET_PORT,
            policy: PolicyKind::AffinityGate,
            index: IndexKind::Routed,
            seed: 0,
            tokenizer: None,
            chat_template: None,
            tokenization_cache_mib: DEFAULT_TOKENIZATION_CACHE_MIB,
            response_headers: true,
            removed_session_headers: (),
            forward_authorization: false,
            scrape_interval: ms(DEFAULT_SCRAPE_INTERVAL_MS),
            models_refresh_interval: ms(DEFAULT_MODELS_REFRESH_INTERVAL_MS),
            max_concurrent_requests: DEFAULT_MAX_CONCURRENT_REQUESTS,
            max_waiting_requests: DEFAULT_MAX_WAITING_REQUESTS,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            max_body_bytes_in_flight: DEFAULT_MAX_BODY_BYTES_IN_FLIGHT,
            max_prompt_tokens: DEFAULT_MAX_PROMPT_TOKENS,
            max_retries: DEFAULT_MAX_RETRIES,
            decision_log_size: DEFAULT_DECISION_LOG,
            body_read_timeout: ms(DEFAULT_BODY_READ_TIMEOUT_MS),
            header_read_timeout: ms(DEFAULT_HEADER_READ_TIMEOUT_MS),
            idle_connection_timeout: ms(DEFAULT_IDLE_CONNECTION_TIMEOUT_MS),
            client_write_timeout: ms(DEFAULT_CLIENT_WRITE_TIMEOUT_MS),
            connect_timeout: ms(DEFAULT_CONNECT_TIMEOUT_MS),
            first_byte_timeout: ms(DEFAULT_FIRST_BYTE_TIMEOUT_MS),
            idle_chunk_timeout: ms(DEFAULT_IDLE_CHUNK_TIMEOUT_MS),
            request_timeout: ms(DEFAULT_REQUEST_TIMEOUT_MS),
            pod_failure_threshold: DEFAULT_POD_FAILURE_THRESHOLD,
            pod_failure_cooldown: ms(DEFAULT_POD_FAILURE_COOLDOWN_MS),
            shutdown_drain: ms(DEFAULT_SHUTDOWN_DRAIN_MS),
            shutdown_grace: ms(DEFAULT_SHUTDOWN_GRACE_MS),
            capture: None,
            decisions_log: None,
            cluster: None,
            cluster_name: DEFAULT_CLUSTER_NAME.to_string(),
            cluster_lease: ms(DEFAULT_LEASE_MS),
            cluster_share_samples: true,
            router: RouterConfig::default(),
            flow: kvgate_core::flow::FlowConfig::default(),
            tracing: TracingConfig::default(),
        }
    }
}

impl Settings {
    /// The top-level key names (the environment layer reads only these).
    pub fn top_keys() -> Vec<&'static str> {
        KEYS.iter().map(|(k, _)| *k).collect()
    }

    /// Reads a merged tree of keys; `source` names the layer(s) for the error, and the error
    /// names the key (`router.affinity_gate_tau: …`).
    fn from_tree(tree: serde_json::Value, source: &str) -> Result<Settings, ConfigError> {
        serde_path_to_error::deserialize(tree).map_err(|e| {
            let key = e.path().to_string();
            let inner = e.into_inner();
            ConfigError::Parse {
                path: source.to_string(),
                message: if key == "." {
                    inner.to_string()
                } else {
                    format!("{key}: {inner}")
                },
            }
        })
    }

    /// Checks every value, and normalises the few that have one spelling in force
    /// (`decision_log_size` at least 1).
    fn validate(&mut self) -> Result<(), ConfigError> {
        for (value, name) in [
            (self.scrape_interval, "scrape_interval_ms"),
            (self.models_refresh_interval, "models_refresh_interval_ms"),
            (self.body_read_timeout, "body_read_timeout_ms"),
            (self.header_read_timeout, "header_read_timeout_ms"),
            (self.idle_connection_timeout, "idle_connection_timeout_ms"),
            (self.client_write_timeout, "client_write_timeout_ms"),
            (self.connect_timeout, "connect_timeout_ms"),
            (self.first_byte_timeout, "first_byte_timeout_ms"),
            (self.idle_chunk_timeout, "idle_chunk_timeout_ms"),
            (self.request_timeout, "request_timeout_ms"),
            (self.pod_failure_cooldown, "pod_failure_cooldown_ms"),
            (self.cluster_lease, "cluster_lease_ms"),
        ] {
            if value.is_zero() {
                return Err(ConfigError::NotPositive(name));
            }
        }
        for (value, name) in [
            (self.max_body_bytes, "max_body_bytes"),
            (self.max_body_bytes_in_flight, "max_body_bytes_in_flight"),
            (self.max_concurrent_requests, "max_concurrent_requests"),
            (self.max_connections, "max_connections"),
            (self.pod_failure_threshold as usize, "pod_failure_threshold"),
        ] {
            if value == 0 {
                return Err(ConfigError::NotPositive(name));
            }
        }
        self.decision_log_size = self.decision_log_size.max(1);
        self.router.validate()?;
        self.flow.validate()?;
        self.tracing.validate()?;
        if let Some(url) = &self.cluster {
            if !(url.starts_with("nats://") || url.starts_with("tls://"))
                || url.len() <= "nats://".len()
            {
                return Err(ConfigError::BadCluster(format!(
                    "invalid cluster URL {url:?}: expected nats://HOST:PORT"
                )));
            }
            if !valid_name(&self.cluster_name) {
                return Err(ConfigError::BadCluster(format!(
                    "invalid cluster name {:?}: 1-64 of A-Z a-z 0-9 _ -",
                    self.cluster_name
                )));
            }
        }
        Ok(())
    }

    /// `--cluster` and its companions, when clustering is on.
    pub fn cluster_config(&self) -> Option<ClusterConfig> {
        self.cluster.as_ref().map(|url| ClusterConfig {
            url: url.clone(),
            name: self.cluster_name.clone(),
            lease: self.cluster_lease,
            share_samples: self.cluster_share_samples,
        })
    }
}

/// The configuration the gateway runs with: the [`Settings`] (every key, as `/debug/config`
/// shows them) and what is derived from them once: the pod table's entries and their KV-event
/// endpoints, and the API keys' digests. It derefs to its settings, so that
/// `config.request_timeout` reads the key wherever the config is used.
#[derive(Debug, Clone, PartialEq)]
pub struct GatewayConfig {
    /// The keys in force; `pods` written out as tables, one per configured pod.
    pub settings: Settings,
    /// The configured pods: base URL, predictor class, P/D role, data-parallel size.
    pub pods: Vec<PodEntry>,
    /// Pods that publish KV-cache events.
    pub pod_events: Vec<PodEvents>,
    /// `--api-key` / `KVGATE_API_KEYS`: keys required on /v1/* (empty: no authentication).
    pub api_keys: ApiKeys,
}

impl std::ops::Deref for GatewayConfig {
    type Target = Settings;
    fn deref(&self) -> &Settings {
        &self.settings
    }
}

impl std::ops::DerefMut for GatewayConfig {
    fn deref_mut(&mut self) -> &mut Settings {
        &mut self.settings
    }
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
    /// Validates `settings` and derives the pod table's entries (the `pods` written out as
    /// tables) and the API keys' digests.
    pub fn new(mut settings: Settings, api_keys: &[String]) -> Result<Self, ConfigError> {
        settings.validate()?;
        let mut pods: Vec<PodEntry> = Vec::new();
        let mut pod_events: Vec<PodEvents> = Vec::new();
        for p in &settings.pods {
            let (pod, events) = match p {
                PodSpec::Url(arg) => parse_pod_arg(arg)?,
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
                    let pod = PodEntry {
                        data_parallel_size: data_parallel_size.unwrap_or(1),
                        ..PodEntry::new(url.clone(), class)
                            .with_role(role.unwrap_or_default())
                            .with_model(model.clone())
                    };
                    let events =
                        endpoint_events(url, events.clone(), replay.clone(), model.clone(), url)?;
                    (pod, events)
                }
            };
            check_pod_url(&pod.url)?;
            check_data_parallel(&pod, events.as_ref())?;
            pods.push(pod);
            pod_events.extend(events);
        }
        // Written out as tables: what `/debug/config` shows, and reads back the same.
        settings.pods = pods
            .iter()
            .map(|pod| {
                let url = pod.url.trim_end_matches('/');
                let events = pod_events.iter().find(|e| e.url == url);
                PodSpec::Full {
                    url: pod.url.clone(),
                    class: Some(pod.class.clone()),
                    events: events.map(|e| e.endpoint.clone()),
                    replay: events.and_then(|e| e.replay.clone()),
                    model: pod.model.clone(),
                    role: Some(pod.role),
                    data_parallel_size: Some(pod.data_parallel_size),
                }
            })
            .collect();
        Ok(GatewayConfig {
            settings,
            pods,
            pod_events,
            api_keys: ApiKeys::new(api_keys.iter().map(String::as_str)),
        })
    }

    /// The settings `args` ask for: defaults ← file ← environment ← flags.
    pub fn from_args(args: &ServeArgs) -> Result<Self, ConfigError> {
        Self::layered(args, false)
    }

    /// [`GatewayConfig::from_args`] for a reload: an empty file is refused
    /// ([`ConfigError::EmptyFile`]).
    pub fn from_args_reloaded(args: &ServeArgs) -> Result<Self, ConfigError> {
        Self::layered(args, true)
    }

    fn layered(args: &ServeArgs, reloaded: bool) -> Result<Self, ConfigError> {
        let mut tree = serde_json::Value::Object(serde_json::Map::new());
        // Each layer is read alone first, so that an error names its layer (a file's path,
        // the environment, --set); then the merged tree once.
        let mut lay = |layer: serde_json::Value, source: &str| {
            Settings::from_tree(layer.clone(), source)?;
            layers::merge(&mut tree, layer);
            Ok::<_, ConfigError>(())
        };
        if let Some(path) = &args.config {
            lay(
                layers::file_tree(path, reloaded)?,
                &path.display().to_string(),
            )?;
        }
        let env = args.env.iter().map(|(k, v)| (k.as_str(), v.as_str()));
        lay(
            layers::env_tree(env, &Settings::top_keys())?,
            &layers::describe_env(),
        )?;
        let mut flags = args.typed_tree();
        layers::apply_sets(&mut flags, &args.set)?;
        lay(flags, "--set")?;
        // `pods+=`: appended to the pods of the layers below, not laid over them.
        let appended = args.pod.iter().map(|p| format!("pods+={p}"));
        layers::apply_sets(&mut tree, &appended.collect::<Vec<_>>())?;
        let settings = Settings::from_tree(tree, "the merged settings")?;
        GatewayConfig::new(settings, &args.api_key)
    }

    /// What a reloaded config must also pass: at least one configured pod unless
    /// `allow_empty_pods` or discovery supplies pods (with kubernetes discovery the file's list
    /// may well be empty, and so may the discovered set at times). Not checked at start: a
    /// gateway started without pods reports not ready (`/readyz` 503) and there is no previous
    /// config to keep.
    pub fn check_reloaded(&self) -> Result<(), ConfigError> {
        let discovery_supplies_pods = self.discovery != DiscoveryKind::Static;
        if self.pods.is_empty() && !self.allow_empty_pods && !discovery_supplies_pods {
            return Err(ConfigError::NoPods);
        }
        Ok(())
    }

    /// The start-only keys ([`KEYS`]) whose values differ from `running` (the config in
    /// force), and the KV events of a pod kept across the reload (a pod added by it may have
    /// events: its subscriber starts with it): a reload that changes any is refused whole
    /// ([`crate::reload`]), not half applied.
    pub fn start_only_changes(&self, running: &GatewayConfig) -> Vec<String> {
        let (new, old) = (self.dump(), running.dump());
        let mut changed: Vec<String> = KEYS
            .iter()
            .filter(|(key, reload)| *reload == Reload::StartOnly && new[key] != old[key])
            .map(|(key, _)| key.to_string())
            .collect();
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

    /// `GET /debug/config` (like Envoy's config dump): the [`Settings`] in force, serialised.
    /// Given back as a config file it starts the same gateway; API keys (secrets, given
    /// separately) and discovered pods are not settings, so not in it.
    pub fn dump(&self) -> serde_json::Value {
        serde_json::to_value(&self.settings).unwrap_or_else(|e| {
            // Settings hold only strings, numbers and addresses: unreachable.
            serde_json::json!({ "error": e.to_string() })
        })
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

/// What `kvgate serve` was given, as layers over the defaults ([`GatewayConfig::from_args`]):
/// the config file, the environment, and the flags. The flags' layer is the typed fields below
/// (the everyday keys, for the binary's sugar flags, tests and embedders; a field left `None`,
/// `false` or empty is not given), then `set` (`key.path=value`, in order), then `pod` appended
/// to the pods. Each typed field is named after its key and read through the same generic
/// merge as `--set`: no field is merged by hand.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ServeArgs {
    /// `--config`: the file layer (TOML, YAML or JSON), reloaded when it changes.
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// The environment layer: the process's variables (only `KVGATE_<KEY>…` ones are read).
    #[serde(skip)]
    pub env: Vec<(String, String)>,
    /// `--set key.path=value` / `key+=value`, in order, over the typed fields.
    #[serde(skip)]
    pub set: Vec<String>,
    /// `--pod URL[,events=…,replay=…][,model=NAME][,class=NAME][,role=…][,dp=N]`, repeatable:
    /// added to the pods of the layers below.
    #[serde(skip)]
    pub pod: Vec<String>,
    /// `--api-key` (repeatable) or `KVGATE_API_KEYS`: the accepted API keys (secrets: not
    /// settings, never in `/debug/config`).
    #[serde(skip)]
    pub api_key: Vec<String>,
    pub listen: Option<SocketAddr>,
    pub admin_listen: Option<SocketAddr>,
    pub index: Option<IndexKind>,
    pub tokenizer: Option<PathBuf>,
    pub chat_template: Option<PathBuf>,
    pub tokenization_cache_mib: Option<usize>,
    pub policy: Option<String>,
    pub scrape_interval_ms: Option<u64>,
    pub models_refresh_interval_ms: Option<u64>,
    pub seed: Option<u64>,
    pub capture: Option<PathBuf>,
    pub decisions_log: Option<PathBuf>,
    pub ext_proc_listen: Option<SocketAddr>,
    pub max_concurrent_requests: Option<usize>,
    pub max_waiting_requests: Option<usize>,
    pub forward_authorization: bool,
    pub shutdown_grace_ms: Option<u64>,
    pub connect_timeout_ms: Option<u64>,
    pub first_byte_timeout_ms: Option<u64>,
    pub idle_chunk_timeout_ms: Option<u64>,
    pub max_prompt_tokens: Option<u32>,
    pub discovery: Option<DiscoveryKind>,
    pub selector: Option<String>,
    pub namespace: Option<String>,
    pub target_port: Option<u16>,
    pub request_timeout_ms: Option<u64>,
    pub shutdown_drain_ms: Option<u64>,
    pub pod_failure_threshold: Option<u32>,
    pub pod_failure_cooldown_ms: Option<u64>,
    pub max_connections: Option<usize>,
    pub header_read_timeout_ms: Option<u64>,
    pub idle_connection_timeout_ms: Option<u64>,
    pub client_write_timeout_ms: Option<u64>,
    pub cluster: Option<String>,
    pub cluster_name: Option<String>,
}

impl ServeArgs {
    /// The typed fields given, as a tree of keys: `None` and `false` are not given.
    fn typed_tree(&self) -> serde_json::Value {
        let mut tree = serde_json::to_value(self)
            .unwrap_or_else(|_| serde_json::Value::Object(serde_json::Map::new()));
        if let serde_json::Value::Object(map) = &mut tree {
            map.retain(|_, v| {
                !matches!(v, serde_json::Value::Null | serde_json::Value::Bool(false))
            });
        }
        tree
    }

    /// `key=value` added to the flags' layer (after those given before), as `--set` does.
    pub fn with(mut self, key: &str, value: impl std::fmt::Display) -> Self {
        self.set.push(format!("{key}={value}"));
        self
    }
}

/// `discovery`; [`DiscoveryKind::help`] says what each is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
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

    /// A config file written for a test.
    #[derive(Debug)]
    struct File(PathBuf);

    /// `text` as a TOML config file, parsed (not validated), as the old file type read it.
    fn toml_file(text: &str) -> Result<File, ConfigError> {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        load_file(&temp_file(&format!("f{n}.toml"), text))
    }

    /// The file at `path`, parsed (not validated).
    fn load_file(path: &std::path::Path) -> Result<File, ConfigError> {
        Settings::from_tree(layers::file_tree(path, false)?, "test")?;
        Ok(File(path.to_path_buf()))
    }

    /// `args` with `file` as the config file, laid and validated.
    fn resolve(args: &ServeArgs, file: Option<&File>) -> Result<GatewayConfig, ConfigError> {
        GatewayConfig::from_args(&ServeArgs {
            config: file.map(|f| f.0.clone()),
            ..args.clone()
        })
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
    fn session_headers_is_accepted_at_its_old_default_and_refused_otherwise() {
        let file = |t: &str| toml_file(t).unwrap();
        let with_pod = |t: &str| format!("pods = [\"http://a:1\"]\n{t}");
        let plain = resolve(&no_flags(), Some(&file(&with_pod("")))).unwrap();
        let old_default = resolve(
            &no_flags(),
            Some(&file(&with_pod(
                "session_headers = [\"x-session-id\", \"X-Claude-Code-Session-Id\", \
                 \"x-session-affinity\"]",
            ))),
        )
        .unwrap();
        assert_eq!(old_default.dump(), plain.dump(), "ignored");
        assert!(
            plain.dump().get("session_headers").is_none(),
            "never written"
        );
        for other in ["[\"X-Agent-Run\"]", "[]", "[\"x-session-id\"]"] {
            let err = toml_file(&with_pod(&format!("session_headers = {other}")))
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("session_headers was removed on 2026-12-07"),
                "{other}: {err}"
            );
            assert!(err.contains("docs/decisions/session-affinity.md"), "{err}");
        }
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
            let file = toml_file(&text).unwrap_or_else(|e| panic!("{place}: {e}\n{text}"));
            let c = resolve(&no_flags(), Some(&file)).unwrap_or_else(|e| panic!("{place}: {e}"));
            assert_eq!(c.pods.len(), 3, "{place}");
            assert_eq!(c.pods[1].class, "h100", "{place}");
            assert_eq!(c.index, IndexKind::Engine, "{place}");
        }
    }

    #[test]
    fn the_cluster_is_off_by_default_and_read_from_flags_or_file() {
        assert_eq!(resolve(&no_flags(), None).unwrap().cluster_config(), None);
        let flags = ServeArgs {
            cluster: Some("nats://127.0.0.1:4222".into()),
            ..no_flags()
        };
        let c = resolve(&flags, None).unwrap().cluster_config().unwrap();
        assert_eq!(c.url, "nats://127.0.0.1:4222");
        assert_eq!(c.name, "default");
        assert_eq!(c.lease, Duration::from_millis(3_000));
        let file = toml_file(
            "cluster = \"nats://n:4222\"\ncluster_name = \"fleet-a\"\ncluster_lease_ms = 500\n",
        )
        .unwrap();
        let c = resolve(&no_flags(), Some(&file))
            .unwrap()
            .cluster_config()
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
                matches!(resolve(&flags, None), Err(ConfigError::BadCluster(_))),
                "{url} {name:?}"
            );
        }
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let c = resolve(&no_flags(), None).unwrap();
        assert_eq!(c.listen, default_listen());
        assert_eq!(c.admin_listen, default_admin_listen());
        assert_eq!(c.policy, PolicyKind::AffinityGate);
        assert_eq!(c.scrape_interval, Duration::from_millis(50));
        assert_eq!(c.max_body_bytes, 32 << 20);
        assert_eq!(c.decision_log_size, 256);
        assert_eq!(c.max_concurrent_requests, 1024);
        assert_eq!(c.max_waiting_requests, 1024);
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
        let file = toml_file(
            "policy = \"round-robin\"\nscrape_interval_ms = 200\npods = [\"http://a:1\", { url = \"http://b:2\", class = \"h100\" }]\n[router]\naffinityGateTau = 0.5\n",
        )
        .unwrap();
        let c = resolve(
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
        let file = toml_file(
            "pods = [{ url = \"http://p:1\", data_parallel_size = 4 }, \"http://b:2\"]\n",
        )
        .unwrap();
        let args = |pod: &str| ServeArgs {
            pod: vec![pod.into()],
            ..ServeArgs::default()
        };
        let c = resolve(&args("http://d:3,dp=2"), Some(&file)).unwrap();
        let sizes: Vec<u32> = c.pods.iter().map(|p| p.data_parallel_size).collect();
        assert_eq!(sizes, [4, 1, 2]);
        let ok = "http://d:3,dp=2,events=tcp://d:5557,replay=tcp://d:5558";
        assert!(resolve(&args(ok), None).is_ok());
        for bad in [
            "http://d:3,dp=0",
            "http://d:3,dp=x",
            "http://d:3,dp=257",
            "http://d:3,dp=2,events=ipc:///run/ev.ipc",
            "http://d:3,dp=2,events=tcp://d:65535",
        ] {
            assert!(resolve(&args(bad), None).is_err(), "{bad}");
        }
        // vLLM 0.32 runs a DP server with an ipc endpoint only when it ends in :PORT.
        assert!(resolve(&args("http://d:3,dp=2,events=ipc:///run/ev-tcp:5557"), None).is_ok());
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
        let file =
            toml_file("pods = [{ url = \"http://p:1\", role = \"prefill\" }, \"http://b:2\"]\n")
                .unwrap();
        let c = resolve(
            &ServeArgs {
                pod: vec!["http://d:3,role=decode".into()],
                ..no_flags()
            },
            Some(&file),
        )
        .unwrap();
        let roles: Vec<PodRole> = c.pods.iter().map(|p| p.role).collect();
        assert_eq!(roles, [PodRole::Prefill, PodRole::Both, PodRole::Decode]);
        let bad = resolve(
            &ServeArgs {
                pod: vec!["http://d:3,role=decoder".into()],
                ..no_flags()
            },
            None,
        );
        assert!(matches!(bad, Err(ConfigError::BadPodOption(_))), "{bad:?}");
        assert!(toml_file("pods = [{ url = \"http://p:1\", role = \"x\" }]").is_err());
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
        let file = load_file(&path).unwrap();
        let c = resolve(&no_flags(), Some(&file)).unwrap();
        assert_eq!(c.policy, PolicyKind::Prefix);
        assert_eq!(c.router.affinity_gate_tau, 0.9);
        assert_eq!(c.pods.len(), 1);
    }

    #[test]
    fn invalid_values_are_rejected_with_a_reason() {
        let bad = |toml_text: &str| {
            let file = toml_file(toml_text).unwrap();
            resolve(&no_flags(), Some(&file)).unwrap_err()
        };
        // An unknown name fails the file, naming it.
        let err = toml_file("policy = \"nope\"").unwrap_err();
        assert!(
            matches!(&err, ConfigError::Parse { message, .. } if message.contains("nope")),
            "{err}"
        );
        assert!(matches!(
            bad("pods = [\"ftp://x\"]"),
            ConfigError::BadPodUrl(_)
        ));
        // The router's own reader validates: an out-of-range value fails the file, naming the key.
        let err = toml_file("[router]\naffinity_gate_tau = 3.0").unwrap_err();
        assert!(err.to_string().contains("affinity_gate_tau"), "{err}");
        assert!(toml_file("unknown_key = 1").is_err());
        let err = toml_file("max_retries = \"x\"").unwrap_err().to_string();
        assert!(err.contains("max_retries: invalid type"), "{err}");
        let err = GatewayConfig::from_args(&no_flags().with("router.load_break_pays_prefill", 3))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--set") && err.contains("router.load_break_pays_prefill"),
            "{err}"
        );
        assert!(toml_file("[router]\naffinity_gate_tau = \"max\"").is_err());
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
        let seed_with_window = RouterConfig {
            balance_window_ms: 20.0,
            ..RouterConfig::seed()
        };
        for (name, text) in [
            (
                "kvgate.toml",
                "[router]\ngate_profile = \"seed\"\nbalance_window_ms = 20\n",
            ),
            (
                "kvgate.yaml",
                "router:\n  gateProfile: seed\n  balanceWindowMs: 20\n",
            ),
            (
                "kvgate.json",
                r#"{"router": {"gate_profile": "seed", "balance_window_ms": 20}}"#,
            ),
        ] {
            let file = load_file(&temp_file(name, text)).unwrap();
            let c = resolve(&no_flags(), Some(&file)).unwrap();
            assert_eq!(c.router, seed_with_window, "{name}");
            assert_eq!(
                c.router.explore_mode,
                kvgate_core::config::ExploreMode::BestOverall,
                "{name}"
            );
        }
    }

    #[test]
    fn config_dump_shows_the_merged_router_keys_the_limits_and_the_pods() {
        let file = toml_file(
            r#"max_body_bytes = 1000
max_retries = 1
pods = ["http://a:1/", { url = "http://b:2", class = "h100", events = "tcp://b:5557" }]
[router]
gate_profile = "seed"
explore_max_extra_ms = 9
"#,
        )
        .unwrap();
        let c = resolve(
            &ServeArgs {
                first_byte_timeout_ms: Some(1234),
                api_key: vec!["secret-one".into(), "secret-two".into()],
                index: Some(IndexKind::Engine),
                ..no_flags()
            },
            Some(&file),
        )
        .unwrap();
        let v = c.dump();
        assert_eq!(v["policy"], "affinity-gate");
        assert_eq!(v["index"], "engine");
        let router = &v["router"];
        assert_eq!(router["gate_profile"], "seed");
        assert_eq!(router["explore_mode"], "best-overall");
        assert_eq!(router["affinity_relative_penalty"], 0.0);
        assert_eq!(router["explore_max_extra_ms"], 9.0);
        assert_eq!(router["affinity_gate_tau"], 0.8);
        assert_eq!(v["max_body_bytes"], 1000);
        assert_eq!(v["max_retries"], 1);
        assert_eq!(v["first_byte_timeout_ms"], 1234);
        assert_eq!(v["request_timeout_ms"], 600_000);
        assert_eq!(v["max_concurrent_requests"], 1024);
        assert_eq!(c.api_keys.len(), 2);
        assert!(!v.to_string().contains("secret"), "{v}");
        assert_eq!(
            v["pods"],
            serde_json::json!([
                {"url": "http://a:1/", "class": "default", "role": "both", "data_parallel_size": 1},
                {"url": "http://b:2", "class": "h100", "role": "both", "data_parallel_size": 1,
                    "events": "tcp://b:5557"},
            ])
        );
    }

    #[test]
    fn keys_names_every_setting_once() {
        let dump = GatewayConfig::from_args(&no_flags()).unwrap().dump();
        let mut keys: Vec<&str> = dump
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        let mut listed = Settings::top_keys();
        keys.sort_unstable();
        listed.sort_unstable();
        assert_eq!(keys, listed);
    }

    /// Every key set away from its default, in every layer's way of writing it.
    fn everything_set() -> ServeArgs {
        let file = temp_file(
            "everything.yaml",
            "pods:\n  - http://a:1\n  - url: http://b:2\n    class: h100\n    events: tcp://b:5557\n    \
             replay: tcp://b:5558\n    model: llama\n    role: prefill\n\
             max_queued_requests: 7\nrouter:\n  gateProfile: seed\n  balanceWindowMs: 20\n\
             flow_control:\n  enabled: true\n  max_queued_requests: 9\n\
             tracing:\n  otlp_traces_endpoint: http://c:4318\n  sampling_ratio: 0.5\n\
             allow_empty_pods: true\n",
        );
        ServeArgs {
            config: Some(file),
            env: vec![
                ("KVGATE_MAX_RETRIES".into(), "0".into()),
                ("KVGATE_ROUTER__EPSILON_EXPLORE_STICKY".into(), "0".into()),
                ("KVGATE_CLUSTER".into(), "nats://n:4222".into()),
            ],
            set: vec![
                "first_byte_timeout_ms=1234".into(),
                "listen=127.0.0.1:7000".into(),
                "index=engine".into(),
                "ext_proc_listen=127.0.0.1:7002".into(),
                "capture=/tmp/cap.jsonl".into(),
                "discovery=kubernetes".into(),
                "selector=app=vllm".into(),
            ],
            pod: vec!["http://c:3,events=tcp://c:5557,dp=2,model=m".into()],
            api_key: vec!["secret-one".into()],
            ..no_flags()
        }
    }

    #[test]
    fn the_dump_given_back_as_a_config_file_starts_an_identical_gateway() {
        let args = everything_set();
        let c = GatewayConfig::from_args(&args).unwrap();
        assert_eq!(c.max_waiting_requests, 7, "the old top-level name");
        assert_eq!(c.flow.max_queued_requests, 9);
        assert_eq!(c.max_retries, 0);
        assert_eq!(c.router.epsilon_explore_sticky, 0.0);
        assert_eq!(c.router.balance_window_ms, 20.0);
        assert_eq!(c.pods.len(), 3);
        let dump = c.dump();
        assert!(!dump.to_string().contains("secret"), "{dump}");
        let path = temp_file("dump.json", &serde_json::to_string_pretty(&dump).unwrap());
        let again = GatewayConfig::from_args(&ServeArgs {
            config: Some(path),
            api_key: args.api_key.clone(),
            ..no_flags()
        })
        .unwrap();
        assert_eq!(again, c);
        assert_eq!(again.dump(), dump);
    }

    #[test]
    fn layers_lay_defaults_under_the_file_under_the_environment_under_set() {
        // One key of each kind: a `[router]` key (in the file by its llm-d camelCase name), a
        // limit that was file-only, and a timeout that was a flag only.
        let keys = [
            (
                "router.affinity_gate_tau",
                "[router]\naffinityGateTau = 0.5\n",
                [0.8, 0.5, 0.7, 0.9],
            ),
            (
                "max_body_bytes",
                "max_body_bytes = 5\n",
                [33554432.0, 5.0, 7.0, 9.0],
            ),
            (
                "first_byte_timeout_ms",
                "first_byte_timeout_ms = 5\n",
                [60000.0, 5.0, 7.0, 9.0],
            ),
        ];
        for (n, (key, file_text, [default, file, env, set])) in keys.into_iter().enumerate() {
            let read = |args: &ServeArgs| {
                let dump = GatewayConfig::from_args(args).unwrap().dump();
                key.split('.')
                    .fold(dump, |v, k| v[k].clone())
                    .as_f64()
                    .unwrap()
            };
            let var = format!("KVGATE_{}", key.replace('.', "__").to_ascii_uppercase());
            let mut args = no_flags();
            assert_eq!(read(&args), default, "{key}: the default");
            args.config = Some(temp_file(&format!("layer{n}.toml"), file_text));
            assert_eq!(read(&args), file, "{key}: the file over the default");
            args.env = vec![(var, env.to_string())];
            assert_eq!(read(&args), env, "{key}: the environment over the file");
            args = args.with(key, set);
            assert_eq!(read(&args), set, "{key}: --set over the environment");
        }
    }

    #[test]
    fn a_reloaded_config_names_the_start_only_settings_it_changes() {
        let running = resolve(
            &ServeArgs {
                listen: Some("127.0.0.1:7000".parse().unwrap()),
                pod: vec!["http://a:1,events=tcp://a:5557".into(), "http://b:1".into()],
                ..no_flags()
            },
            None,
        )
        .unwrap();
        let reload = |text: &str| {
            let file = toml_file(text).unwrap();
            resolve(
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
            ["admin_listen", "index", "max_concurrent_requests"]
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
        let file = toml_file(
            "max_connections = 10\nheader_read_timeout_ms = 1\nidle_connection_timeout_ms = 2\n\
             client_write_timeout_ms = 3\n",
        )
        .unwrap();
        let c = resolve(&no_flags(), Some(&file)).unwrap();
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
        let c = resolve(&flags, Some(&file)).unwrap();
        assert_eq!(c.max_connections, 20);
        assert_eq!(c.header_read_timeout, Duration::from_millis(4));
        assert_eq!(c.idle_connection_timeout, Duration::from_millis(5));
        assert_eq!(c.client_write_timeout, Duration::from_millis(6));
        let dump = c.dump();
        assert_eq!(dump["max_connections"], 20);
        assert_eq!(dump["client_write_timeout_ms"], 6);
        for key in [
            "max_connections",
            "header_read_timeout_ms",
            "idle_connection_timeout_ms",
            "client_write_timeout_ms",
        ] {
            let file = toml_file(&format!("{key} = 0")).unwrap();
            let err = resolve(&no_flags(), Some(&file)).unwrap_err();
            assert!(
                matches!(err, ConfigError::NotPositive(k) if k == key),
                "{key}: {err}"
            );
        }
        // The cap sizes the accept loop's semaphore: a reload cannot change it.
        let reloaded = resolve(&no_flags(), Some(&file_with_cap())).unwrap();
        let running = resolve(&no_flags(), None).unwrap();
        assert_eq!(reloaded.start_only_changes(&running), ["max_connections"]);
    }

    fn file_with_cap() -> File {
        toml_file("max_connections = 3\n").unwrap()
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
            let err = load_file(&temp_file(name, text)).unwrap_err();
            let message = err.to_string();
            assert!(
                matches!(err, ConfigError::Parse { .. }),
                "{name}: {message}"
            );
            assert!(message.contains(names), "{name}: {message}");
            assert!(message.contains("docs/decisions/"), "{name}: {message}");
        }
        // An integer is a number too.
        let file = toml_file("[router]\naffinity_gate_tau = 1\n").unwrap();
        let c = resolve(&no_flags(), Some(&file)).unwrap();
        assert_eq!(c.router.affinity_gate_tau, 1.0);
    }

    #[test]
    fn tracing_is_off_by_default_and_one_key_turns_it_on() {
        let c = resolve(&no_flags(), None).unwrap();
        assert_eq!(c.tracing, TracingConfig::default());
        assert_eq!(c.tracing.endpoint(), None);
        assert_eq!(c.tracing.sampling_ratio, 1.0);
        let on = |text: &str| -> Result<GatewayConfig, ConfigError> {
            let file = toml_file(text).unwrap();
            resolve(&no_flags(), Some(&file))
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
        assert!(toml_file("[tracing]\nendpoint = \"x\"\n").is_err());
    }
}
