//! The vLLM-compatible HTTP surface (`reference/interfaces.md` §2.4).
//!
//! | route | what |
//! |---|---|
//! | `POST /v1/completions`, `POST /v1/chat/completions` | stream (SSE) and non-stream |
//! | `GET /v1/models` | the one served model |
//! | `GET /health` | 200, empty body |
//! | `GET /version` | `{"version": …}` (the mock's own) |
//! | `POST /tokenize` | `{"prompt": …}` or `{"messages": […]}` → `{count, max_model_len, tokens}` |
//! | `GET /kv_event_sources` | the KV events config per data-parallel rank, as vLLM 0.32: `{"0": {"enable_kv_cache_events", "publisher", "endpoint", "replay_endpoint", "buffer_steps", "hwm", "max_queue_size", "topic"}}` (endpoints as bound) |
//! | `POST /v1/completions/render`, `POST /v1/chat/completions/render` | 403 `PermissionDeniedError` unless `--enable-scale-out`; then see below |
//! | `GET /metrics` | see `metrics` |
//! | `GET /server_info`, `GET /model_info` (and the older `/get_server_info`, `/get_model_info`) | SGLang's metadata endpoints, see below |
//!
//! **Request parsing** is `kvgate_core::request::parse_request_value`, the one the gateway
//! uses: `model`, `prompt` (string, list of strings, token ids), `messages`, `cache_salt`,
//! `stream`, `max_completion_tokens` / `max_tokens`. Also read here: `stream_options.include_usage`
//! (true when `stream_options` is present, as in vLLM) and `ignore_eos` (accepted; the mock never
//! samples an end-of-sequence token, so every request generates exactly `max_tokens` tokens —
//! default [`crate::DEFAULT_MAX_TOKENS`] — with `finish_reason: "length"`, with or without it).
//!
//! **Chat template**: the messages are rendered by `kvgate_core::request::render_chat` (a
//! length-prefixed, prefix-stable rendering documented there), then tokenized; a router
//! tokenizing the same rendering gets the same block hashes.
//!
//! **Prompt blocks**: `BlockHasher::hash_tokens` over the token ids, seeded by
//! `BlockHasher::chain_seed(model, cache_salt)`.
//!
//! **Request ids**: a client's `x-request-id` header becomes the completion id as in vLLM 0.32
//! (`_base_request_id`): `cmpl-<x-request-id>` for completions, `chatcmpl-<x-request-id>` for
//! chats; without it the id is `cmpl-<n>` / `chatcmpl-<n>` with a per-pod counter.
//!
//! **Trace context**: a completion request's W3C `traceparent` and `tracestate` headers come
//! back in the response headers `x-mock-traceparent` and `x-mock-tracestate` (the mock has no tracer; vLLM would make it the parent
//! of its own span instead), so a test sees the trace context the router passed on.
//!
//! **Render** (`--enable-scale-out`, vLLM's scale-out API that vllm-router calls):
//! `/v1/completions/render` answers a JSON array, one `GenerateRequest` per prompt (a list of
//! strings or of token-id lists is several prompts): `request_id` (`cmpl-<id>`, `-<i>` appended
//! when there are several), `token_ids` (the mock's tokenization: cl100k, the chat rendering
//! below for chats), `sampling_params` (a subset of vLLM's: `n`, `temperature`, `top_p`,
//! `max_tokens`, `ignore_eos`, `seed`), `model`, `output_mode: "tokens"`, `stream`,
//! `stream_options`, `cache_salt`, `priority` and vLLM's other fields as null;
//! `/v1/chat/completions/render` answers one such object (`chatcmpl-<id>`).
//!
//! **Client gone**: a stream whose client disconnects (hyper drops the body on the next write)
//! and a non-stream request whose handler is dropped abort the request in the engine model
//! (`driver::AbortOnDrop`): `vllm:num_requests_running` goes down and its KV blocks are freed.
//!
//! **Output**: deterministic: output token `i` (1-based) is the word `WORDS[(i − 1) % 16]`
//! preceded by a space. `usage.prompt_tokens_details.cached_tokens` is the engine model's
//! prefix-cache hit for the request (always present, as with vLLM's
//! `--enable-prompt-tokens-details`). Streams send the role chunk with the first token, one
//! chunk per token (the last with `finish_reason`), then the usage chunk (`choices: []`) when
//! asked, then `data: [DONE]`.
//!
//! **Errors** are vLLM/OpenAI bodies `{"error": {"message", "type", "param", "code"}}`: 400
//! `Bad Request` (vLLM's type for a body that fails its schema) for invalid JSON or a
//! malformed request, 400 `BadRequestError` for an empty prompt, `max_tokens` 0, a prompt +
//! `max_tokens` longer than `max_model_len` or than the KV cache; 404 `NotFoundError` with
//! `param: "model"` and vLLM 0.32's message (``The model `x` does not exist. Valid aliases:
//! m.``) for an unknown model; 503 `ServiceUnavailableError` past the driver's request limit. Each
//! is counted in `kvgate_mock_pod_rejected_requests_total{reason}` and logged at debug level.
//! Bodies are limited to [`MAX_BODY_BYTES`].
//!
//! **SGLang metadata.** sglang-router (PyPI `sglang-router` 0.3.x) registers a worker by asking
//! `/server_info` then `/model_info` (falling back to the `get_` names); the model id it serves
//! and routes by is `served_model_name`, and without it every worker is model `unknown`, its
//! `/v1/models` says `unknown` and clients that take the model from there get 404s here (and
//! then 503s from the router, its circuit breaker presumably open). So `/server_info` answers the subset of SGLang's server
//! args a router reads — `served_model_name`, `context_length`, `dp_size` 1, `tp_size` 1,
//! `page_size` (the block size, as in `vllm:cache_config_info`), `version` — and
//! `/model_info` answers `is_generation: true`, `model_type`, `has_image_understanding` and
//! `has_audio_understanding` false. `model_path` and `tokenizer_path` are left out on purpose: a
//! router that sees them tries to download that tokenizer (from Hugging Face), which a mock pod
//! must not cause.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use kvgate_core::BlockHasher;
use kvgate_core::request::{CHAT_COMPLETIONS_PATH, COMPLETIONS_PATH, Prompt, parse_request_value};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::driver::{AbortOnDrop, EngineHandle, RequestEvent, Submission};
use crate::metrics::{PodMetrics, RejectReason};
use crate::tokenizer::PromptTokenizer;

/// Largest request body accepted.
pub const MAX_BODY_BYTES: usize = 32 * 1024 * 1024;

/// The words generated text cycles through.
pub const WORDS: [&str; 16] = [
    "the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "mock", "pods",
    "serve", "tokens", "on", "time",
];

/// Faults a pod injects, for reliability tests of what sits in front of it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Faults {
    /// Cut every stream after this many tokens: the connection breaks, no `[DONE]`.
    pub fail_after_tokens: Option<u32>,
    /// Accept completion requests and never answer them.
    pub hang: bool,
    /// `/metrics` answers text that is not Prometheus exposition.
    pub garbage_metrics: bool,
}

/// What `/metrics` answers with `--garbage-metrics`.
pub const GARBAGE_METRICS: &str =
    "vllm:num_requests_waiting{ nonsense\n\u{0}\u{1}}}} NaN? 12 13 14\n#### \n\u{7f}garbage\n";

/// The pod's part in P/D disaggregation (`--kv-role`, vLLM's `kv_role` of `NixlConnector`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvRole {
    /// `kv_producer`: answers `do_remote_decode` requests with transfer parameters.
    Producer,
    /// `kv_consumer`: pulls the KV of `do_remote_prefill` requests.
    Consumer,
    /// `kv_both`.
    Both,
}

impl KvRole {
    /// Every role, in the order `kvgate mock-pod --help` lists them.
    pub const ALL: [KvRole; 3] = [KvRole::Producer, KvRole::Consumer, KvRole::Both];

    /// The name in `--kv-role`.
    pub fn name(self) -> &'static str {
        match self {
            KvRole::Producer => "producer",
            KvRole::Consumer => "consumer",
            KvRole::Both => "both",
        }
    }

    /// What the role is, as `kvgate mock-pod --help` says it.
    pub fn help(self) -> &'static str {
        match self {
            KvRole::Producer => {
                "`kv_producer`: answers `do_remote_decode` requests with transfer parameters"
            }
            KvRole::Consumer => "`kv_consumer`: pulls the KV of `do_remote_prefill` requests",
            KvRole::Both => "`kv_both`",
        }
    }

    fn produces(self) -> bool {
        self != KvRole::Consumer
    }

    fn consumes(self) -> bool {
        self != KvRole::Producer
    }
}

impl std::str::FromStr for KvRole {
    type Err = String;

    /// By [`KvRole::name`].
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|r| r.name() == s)
            .ok_or_else(|| format!("unknown KV role `{s}` (producer, consumer or both)"))
    }
}

/// What a request's `kv_transfer_params` ask of this pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transfer {
    None,
    /// Prefill for a remote decode: answer with transfer parameters.
    Produce,
    /// The prompt's KV comes from a prefill pod: compute none of it.
    Consume,
}

/// A request's `kv_transfer_params` as this pod reads them (ignored without `--kv-role`, and
/// for a role the pod does not have, as vLLM does).
fn transfer_of(value: &Value, role: Option<KvRole>) -> Transfer {
    let (Some(role), Some(p)) = (role, value.get("kv_transfer_params")) else {
        return Transfer::None;
    };
    let flag = |k: &str| p.get(k).and_then(Value::as_bool).unwrap_or(false);
    if flag("do_remote_decode") && role.produces() {
        Transfer::Produce
    } else if flag("do_remote_prefill") && role.consumes() {
        Transfer::Consume
    } else {
        Transfer::None
    }
}

/// What a producer answers a `do_remote_decode` request with: the fields vLLM 0.32's
/// `NixlConnector` returns (the block ids are the prompt's full-block indices here).
fn produced_params(st: &PodState, id: &str, prompt_tokens: u32, blocks: usize) -> Value {
    json!({
        "do_remote_prefill": true,
        "do_remote_decode": false,
        "remote_block_ids": (0..blocks as u64).collect::<Vec<u64>>(),
        "remote_engine_id": format!("mock-{}", st.addr),
        "remote_request_id": id,
        "remote_host": st.addr.ip().to_string(),
        "remote_port": st.addr.port(),
        "remote_num_tokens": prompt_tokens,
        "transfer_mode": "pull",
        "tp_size": 1,
    })
}

/// What the handlers share.
#[derive(Debug)]
pub struct PodState {
    pub model: String,
    pub max_model_len: u32,
    pub default_max_tokens: u32,
    pub engine: EngineHandle,
    pub metrics: Arc<Mutex<PodMetrics>>,
    pub tokenizer: PromptTokenizer,
    pub next_id: AtomicU64,
    pub faults: Faults,
    /// `--kv-role` (P/D disaggregation).
    pub kv_role: Option<KvRole>,
    /// The pod's HTTP address (in the transfer parameters it produces).
    pub addr: std::net::SocketAddr,
    /// `--enable-scale-out`: serve the render endpoints.
    pub enable_scale_out: bool,
    /// What `/kv_event_sources` answers ([`kv_event_sources`]).
    pub kv_event_sources: Value,
    /// Every engine behind the port, in rank order (`--data-parallel-size`; one by default);
    /// `engine` and `metrics` above are engine 0's.
    pub engines: Vec<EngineRank>,
    /// Round robin over the engines for requests without `X-data-parallel-rank`.
    pub next_rank: AtomicU64,
}

/// One engine of the pod (a data-parallel rank).
#[derive(Debug)]
pub struct EngineRank {
    pub engine: EngineHandle,
    pub metrics: Arc<Mutex<PodMetrics>>,
}

/// The header that pins a request to one engine (vLLM's data parallelism).
pub const DATA_PARALLEL_RANK_HEADER: &str = "x-data-parallel-rank";

/// `/kv_event_sources` as vLLM 0.32 answers it: vLLM's `KVEventsConfig` per data-parallel rank
/// (`"0"`, `"1"`, …; [`kv_event_source`] each).
pub fn kv_event_sources(ranks: Vec<Value>) -> Value {
    Value::Object(
        ranks
            .into_iter()
            .enumerate()
            .map(|(rank, source)| (rank.to_string(), source))
            .collect(),
    )
}

/// One rank's `KVEventsConfig`, with the endpoints as bound. Without events: vLLM's defaults
/// with `enable_kv_cache_events: false` and publisher `null` (not observed on a real pod).
pub fn kv_event_source(endpoint: Option<&str>, replay: Option<&str>, topic: &str) -> Value {
    json!({
        "enable_kv_cache_events": endpoint.is_some(),
        "publisher": if endpoint.is_some() { "zmq" } else { "null" },
        "endpoint": endpoint.unwrap_or("tcp://*:5557"),
        "replay_endpoint": replay,
        "buffer_steps": crate::kv_events::REPLAY_BUFFER_BATCHES,
        "hwm": 100_000,
        "max_queue_size": 100_000,
        "topic": topic,
    })
}

/// vLLM 0.32's answer to a render request without `--enable-scale-out`.
pub const SCALE_OUT_DISABLED: &str =
    "Scale-out endpoints are disabled. Restart vllm serve with --enable-scale-out to enable them.";

pub fn router(state: Arc<PodState>) -> Router {
    Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/models", get(models))
        .route("/health", get(|| async { StatusCode::OK }))
        .route("/version", get(version))
        .route("/tokenize", post(tokenize))
        .route("/kv_event_sources", get(event_sources))
        .route("/v1/completions/render", post(render_completions))
        .route("/v1/chat/completions/render", post(render_chat_completions))
        .route("/server_info", get(server_info))
        .route("/get_server_info", get(server_info))
        .route("/model_info", get(model_info))
        .route("/get_model_info", get(model_info))
        .route("/metrics", get(metrics))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn json_response(status: StatusCode, body: &Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// An OpenAI-style error, counted and logged; the `type` vLLM gives each reason.
fn reject(st: &PodState, reason: RejectReason, status: StatusCode, message: String) -> Response {
    if let Ok(mut m) = st.metrics.lock() {
        m.reject(reason);
    }
    tracing::debug!(reason = reason.as_str(), "request rejected: {message}");
    let (kind, param) = match (status, reason) {
        (StatusCode::NOT_FOUND, _) => ("NotFoundError", Value::from("model")),
        (StatusCode::SERVICE_UNAVAILABLE, _) => ("ServiceUnavailableError", Value::Null),
        // vLLM answers a body that fails its schema (pydantic) with type "Bad Request".
        (_, RejectReason::InvalidJson | RejectReason::InvalidRequest) => {
            ("Bad Request", Value::Null)
        }
        _ => ("BadRequestError", Value::Null),
    };
    json_response(
        status,
        &json!({"error": {"message": message, "type": kind, "param": param, "code": status.as_u16()}}),
    )
}

/// vLLM 0.32's 404 for a model it does not serve.
/// A request body parsed for this pod: 400 if it is not a valid request, 404 for another model.
fn parse_for_this_pod(
    st: &PodState,
    path: &str,
    value: &Value,
) -> Result<kvgate_core::request::ParsedRequest, Box<Response>> {
    let parsed = parse_request_value(path, value).map_err(|e| {
        Box::new(reject(
            st,
            RejectReason::InvalidRequest,
            StatusCode::BAD_REQUEST,
            e.to_string(),
        ))
    })?;
    if parsed.model != st.model {
        return Err(Box::new(unknown_model(st, &parsed.model)));
    }
    Ok(parsed)
}

fn unknown_model(st: &PodState, model: &str) -> Response {
    reject(
        st,
        RejectReason::UnknownModel,
        StatusCode::NOT_FOUND,
        format!(
            "The model `{model}` does not exist. Valid aliases: {}.",
            st.model
        ),
    )
}

/// The client's `x-request-id`, when it is valid text.
fn client_request_id(headers: &HeaderMap) -> Option<&str> {
    headers
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty())
}

/// The completion id: `<prefix>-<x-request-id>`, else `<prefix>-<n>`.
fn completion_id(st: &PodState, headers: &HeaderMap, chat: bool) -> String {
    let prefix = if chat { "chatcmpl" } else { "cmpl" };
    match client_request_id(headers) {
        Some(id) => format!("{prefix}-{id}"),
        None => format!("{prefix}-{}", st.next_id.fetch_add(1, Ordering::Relaxed)),
    }
}
async fn completions(State(st): State<Arc<PodState>>, headers: HeaderMap, body: Bytes) -> Response {
    if st.faults.hang {
        return std::future::pending().await;
    }
    let resp = generate(&st, COMPLETIONS_PATH, &headers, &body).await;
    echo_traceparent(&headers, resp)
}

/// The request's `traceparent` and `tracestate`, if any, as the response's
/// `x-mock-traceparent` and `x-mock-tracestate`.
fn echo_traceparent(headers: &HeaderMap, mut resp: Response) -> Response {
    for (name, echo) in [
        ("traceparent", "x-mock-traceparent"),
        ("tracestate", "x-mock-tracestate"),
    ] {
        if let Some(v) = headers.get(name) {
            resp.headers_mut().insert(echo, v.clone());
        }
    }
    resp
}

async fn chat_completions(
    State(st): State<Arc<PodState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if st.faults.hang {
        return std::future::pending().await;
    }
    let resp = generate(&st, CHAT_COMPLETIONS_PATH, &headers, &body).await;
    echo_traceparent(&headers, resp)
}

async fn version() -> Response {
    json_response(
        StatusCode::OK,
        &json!({"version": concat!("kvgate-mock-pod ", env!("CARGO_PKG_VERSION"))}),
    )
}

async fn event_sources(State(st): State<Arc<PodState>>) -> Response {
    json_response(StatusCode::OK, &st.kv_event_sources)
}

async fn render_completions(
    State(st): State<Arc<PodState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    render(&st, COMPLETIONS_PATH, &headers, &body).await
}

async fn render_chat_completions(
    State(st): State<Arc<PodState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    render(&st, CHAT_COMPLETIONS_PATH, &headers, &body).await
}

/// The prompts of a completions body: a list of strings or of token-id lists is several.
fn split_prompts(body: &Value) -> Vec<Value> {
    match body.get("prompt") {
        Some(Value::Array(items))
            if !items.is_empty()
                && (items.iter().all(Value::is_string) || items.iter().all(Value::is_array)) =>
        {
            items
                .iter()
                .map(|p| {
                    let mut one = body.clone();
                    if let Some(o) = one.as_object_mut() {
                        o.insert("prompt".into(), p.clone());
                    }
                    one
                })
                .collect()
        }
        _ => vec![body.clone()],
    }
}

/// The render endpoints (see the module docs).
async fn render(st: &PodState, path: &str, headers: &HeaderMap, body: &[u8]) -> Response {
    if !st.enable_scale_out {
        return json_response(
            StatusCode::FORBIDDEN,
            &json!({"error": {"message": SCALE_OUT_DISABLED, "type": "PermissionDeniedError",
                              "param": null, "code": 403}}),
        );
    }
    let value: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => {
            return reject(
                st,
                RejectReason::InvalidJson,
                StatusCode::BAD_REQUEST,
                format!("invalid JSON body: {e}"),
            );
        }
    };
    let chat = path == CHAT_COMPLETIONS_PATH;
    let base_id = completion_id(st, headers, chat);
    let bodies = if chat {
        vec![value]
    } else {
        split_prompts(&value)
    };
    let several = bodies.len() > 1;
    let mut out = Vec::with_capacity(bodies.len());
    for (i, one) in bodies.iter().enumerate() {
        let parsed = match parse_for_this_pod(st, path, one) {
            Ok(p) => p,
            Err(resp) => return *resp,
        };
        let tokens = match parsed.prompt {
            Prompt::Tokens(t) => t,
            Prompt::Text(text) => encode_off_runtime(st.tokenizer, text).await,
            // Only `BlockHasher::hash_value` gives it; the pod parses with the rendering.
            Prompt::Hashed { .. } => Vec::new(),
        };
        if tokens.is_empty() {
            return reject(
                st,
                RejectReason::InvalidRequest,
                StatusCode::BAD_REQUEST,
                "No token_ids rendered".into(),
            );
        }
        let field = |k: &str| one.get(k).cloned().unwrap_or(Value::Null);
        let or = |k: &str, default: Value| match one.get(k) {
            None | Some(Value::Null) => default,
            Some(v) => v.clone(),
        };
        let max_tokens = parsed.max_tokens.unwrap_or(st.default_max_tokens);
        out.push(json!({
            "request_id": if several { format!("{base_id}-{i}") } else { base_id.clone() },
            "token_ids": tokens,
            "token_offsets": null,
            "features": null,
            "content_parts": null,
            "sampling_params": {
                "n": or("n", json!(1)),
                "temperature": or("temperature", json!(1.0)),
                "top_p": or("top_p", json!(1.0)),
                "max_tokens": max_tokens,
                "ignore_eos": or("ignore_eos", json!(false)),
                "seed": field("seed"),
            },
            "model": parsed.model,
            "reasoning_ended": null,
            "reasoning_parser_kwargs": null,
            "return_token_ids": null,
            "output_mode": "tokens",
            "stream": parsed.stream,
            "stream_options": if parsed.stream { field("stream_options") } else { Value::Null },
            "cache_salt": parsed.cache_salt,
            "priority": or("priority", json!(0)),
            "kv_transfer_params": null,
            "ec_transfer_params": null,
        }));
    }
    if chat {
        let one = out.pop().unwrap_or(Value::Null);
        json_response(StatusCode::OK, &one)
    } else {
        json_response(StatusCode::OK, &Value::Array(out))
    }
}

async fn models(State(st): State<Arc<PodState>>) -> Response {
    json_response(
        StatusCode::OK,
        &json!({"object": "list", "data": [{
            "id": st.model, "object": "model", "created": unix_now(), "owned_by": "vllm",
            "root": st.model, "parent": null, "max_model_len": st.max_model_len, "permission": []
        }]}),
    )
}

/// SGLang's `/server_info` (see the module docs).
async fn server_info(State(st): State<Arc<PodState>>) -> Response {
    json_response(
        StatusCode::OK,
        &json!({
            "served_model_name": st.model,
            "context_length": st.max_model_len,
            "dp_size": 1,
            "tp_size": 1,
            "page_size": st.engine.block_size_tokens(),
            "version": concat!("kvgate-mock-pod ", env!("CARGO_PKG_VERSION")),
        }),
    )
}

/// SGLang's `/model_info` (see the module docs).
async fn model_info() -> Response {
    json_response(
        StatusCode::OK,
        &json!({
            "is_generation": true,
            "model_type": "llama",
            "has_image_understanding": false,
            "has_audio_understanding": false,
            "preferred_sampling_params": null,
            "weight_version": "default",
        }),
    )
}

async fn metrics(State(st): State<Arc<PodState>>) -> Response {
    if st.faults.garbage_metrics {
        return GARBAGE_METRICS.into_response();
    }
    let text = if st.engines.len() > 1 {
        let engines: Vec<PodMetrics> = st
            .engines
            .iter()
            .filter_map(|e| e.metrics.lock().ok().map(|m| m.clone()))
            .collect();
        PodMetrics::render_engines(&engines, &st.model, st.max_model_len)
    } else {
        match st.metrics.lock() {
            Ok(m) => m.render(&st.model, st.max_model_len),
            Err(_) => String::new(),
        }
    };
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

async fn tokenize(State(st): State<Arc<PodState>>, body: Bytes) -> Response {
    let mut value: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            return reject(
                &st,
                RejectReason::InvalidJson,
                StatusCode::BAD_REQUEST,
                e.to_string(),
            );
        }
    };
    let Some(obj) = value.as_object_mut() else {
        return reject(
            &st,
            RejectReason::InvalidRequest,
            StatusCode::BAD_REQUEST,
            "request body must be a JSON object".into(),
        );
    };
    match obj.get("model") {
        None | Some(Value::Null) => {
            obj.insert("model".into(), Value::String(st.model.clone()));
        }
        Some(Value::String(m)) if *m == st.model => {}
        Some(Value::String(other)) => return unknown_model(&st, other),
        Some(other) => return unknown_model(&st, &other.to_string()),
    }
    let path = if obj.contains_key("messages") {
        CHAT_COMPLETIONS_PATH
    } else {
        COMPLETIONS_PATH
    };
    let parsed = match parse_request_value(path, &value) {
        Ok(p) => p,
        Err(e) => {
            return reject(
                &st,
                RejectReason::InvalidRequest,
                StatusCode::BAD_REQUEST,
                e.to_string(),
            );
        }
    };
    let tokens = match parsed.prompt {
        Prompt::Tokens(t) => t,
        Prompt::Text(text) => encode_off_runtime(st.tokenizer, text).await,
        // Only `BlockHasher::hash_value` gives it; the pod parses with the rendering.
        Prompt::Hashed { .. } => Vec::new(),
    };
    if let Some(&bad) = tokens.iter().find(|&&t| t >= st.tokenizer.vocab_size()) {
        return reject(
            &st,
            RejectReason::InvalidRequest,
            StatusCode::BAD_REQUEST,
            format!("Token id {bad} is out of vocabulary"),
        );
    }
    json_response(
        StatusCode::OK,
        &json!({"count": tokens.len(), "max_model_len": st.max_model_len, "tokens": tokens}),
    )
}

/// A validated generation request.
struct Generation {
    /// Aborts the request in the engine if the response is dropped before its last token.
    abort: AbortOnDrop,
    chat: bool,
    id: String,
    created: u64,
    model: String,
    prompt_tokens: u32,
    max_tokens: u32,
    include_usage: bool,
    /// A producer's answer to a `do_remote_decode` request (non-stream answers carry it).
    kv_transfer_params: Option<Value>,
}

async fn generate(st: &PodState, path: &str, headers: &HeaderMap, body: &[u8]) -> Response {
    let value: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => {
            return reject(
                st,
                RejectReason::InvalidJson,
                StatusCode::BAD_REQUEST,
                format!("invalid JSON body: {e}"),
            );
        }
    };
    let parsed = match parse_for_this_pod(st, path, &value) {
        Ok(p) => p,
        Err(resp) => return *resp,
    };
    match value.get("ignore_eos") {
        None | Some(Value::Null | Value::Bool(_)) => {}
        Some(_) => {
            return reject(
                st,
                RejectReason::InvalidRequest,
                StatusCode::BAD_REQUEST,
                "field \"ignore_eos\" has the wrong type: a boolean".into(),
            );
        }
    }
    let include_usage = match value.get("stream_options") {
        Some(Value::Object(o)) => o
            .get("include_usage")
            .and_then(Value::as_bool)
            .unwrap_or(true),
        _ => false,
    };
    let tokens = match parsed.prompt {
        Prompt::Tokens(t) => t,
        Prompt::Text(text) => encode_off_runtime(st.tokenizer, text).await,
        // Only `BlockHasher::hash_value` gives it; the pod parses with the rendering.
        Prompt::Hashed { .. } => Vec::new(),
    };
    if let Some(&bad) = tokens.iter().find(|&&t| t >= st.tokenizer.vocab_size()) {
        return reject(
            st,
            RejectReason::InvalidRequest,
            StatusCode::BAD_REQUEST,
            format!("Token id {bad} is out of vocabulary"),
        );
    }
    let max_tokens = parsed.max_tokens.unwrap_or(st.default_max_tokens);
    if tokens.is_empty() {
        return reject(
            st,
            RejectReason::InvalidRequest,
            StatusCode::BAD_REQUEST,
            "The prompt cannot be empty.".into(),
        );
    }
    if max_tokens == 0 {
        return reject(
            st,
            RejectReason::InvalidRequest,
            StatusCode::BAD_REQUEST,
            "max_tokens must be at least 1, got 0.".into(),
        );
    }
    let requested = tokens.len() as u64 + u64::from(max_tokens);
    if requested > u64::from(st.max_model_len) {
        return reject(
            st,
            RejectReason::TooLong,
            StatusCode::BAD_REQUEST,
            format!(
                "This model's maximum context length is {} tokens. However, you requested {requested} tokens ({} in the messages, {max_tokens} in the completion). Please reduce the length of the messages or completion.",
                st.max_model_len,
                tokens.len()
            ),
        );
    }
    let engine = match engine_for(st, headers) {
        Ok(engine) => engine,
        Err(resp) => return *resp,
    };
    let block_size_tokens = engine.block_size_tokens();
    let mut blocks = Vec::with_capacity(tokens.len() / block_size_tokens as usize);
    let seed = BlockHasher::chain_seed(&parsed.model, parsed.cache_salt.as_deref());
    let hasher = BlockHasher {
        block_size_tokens,
        ..BlockHasher::default()
    };
    hasher.hash_tokens(seed, &tokens, &mut blocks);
    let prompt_tokens = u32::try_from(tokens.len()).unwrap_or(u32::MAX);
    let transfer = transfer_of(&value, st.kv_role);
    let block_count = blocks.len();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let submission = Submission {
        prompt_tokens: tokens.into(),
        blocks: blocks.into(),
        max_tokens,
        transferred: transfer == Transfer::Consume,
        events: tx,
    };
    if !engine.submit(submission).await {
        return reject(
            st,
            RejectReason::Overloaded,
            StatusCode::SERVICE_UNAVAILABLE,
            "the engine has stopped".into(),
        );
    }
    let abort = match rx.recv().await {
        Some(RequestEvent::Queued { id }) => engine.abort_on_drop(id),
        Some(RequestEvent::Rejected(e)) => {
            return reject(
                st,
                RejectReason::TooLong,
                StatusCode::BAD_REQUEST,
                e.to_string(),
            );
        }
        _ => {
            return reject(
                st,
                RejectReason::Overloaded,
                StatusCode::SERVICE_UNAVAILABLE,
                "too many requests in the pod".into(),
            );
        }
    };
    let chat = path == CHAT_COMPLETIONS_PATH;
    let id = completion_id(st, headers, chat);
    let kv_transfer_params = (transfer == Transfer::Produce)
        .then(|| produced_params(st, &id, prompt_tokens, block_count));
    let generation = Generation {
        abort,
        chat,
        id,
        created: unix_now(),
        model: parsed.model,
        prompt_tokens,
        max_tokens,
        include_usage,
        kv_transfer_params,
    };
    if parsed.stream {
        stream_response(generation, rx, st.faults.fail_after_tokens)
    } else {
        whole_response(generation, rx).await
    }
}

/// The engine a request goes to: the one its `X-data-parallel-rank` names (vLLM's 400 when it
/// is out of range), else the next in round robin (vLLM ignores a header that is not an
/// integer, `_get_data_parallel_rank`).
fn engine_for<'a>(
    st: &'a PodState,
    headers: &HeaderMap,
) -> Result<&'a EngineHandle, Box<Response>> {
    let n = st.engines.len().max(1);
    let named = headers
        .get(DATA_PARALLEL_RANK_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<i64>().ok());
    let rank = match named {
        None => usize::try_from(st.next_rank.fetch_add(1, Ordering::Relaxed)).unwrap_or(0) % n,
        Some(r) => match usize::try_from(r) {
            Ok(r) if r < n => r,
            _ => {
                return Err(Box::new(reject(
                    st,
                    RejectReason::InvalidRequest,
                    StatusCode::BAD_REQUEST,
                    format!("data_parallel_rank {r} is out of range [0, {n})."),
                )));
            }
        },
    };
    Ok(st.engines.get(rank).map_or(&st.engine, |e| &e.engine))
}

/// Prompts longer than this (bytes) are tokenized on the blocking pool, not a runtime worker.
const INLINE_TOKENIZE_BYTES: usize = 4096;

async fn encode_off_runtime(tokenizer: PromptTokenizer, text: String) -> Vec<u32> {
    if text.len() <= INLINE_TOKENIZE_BYTES {
        return tokenizer.encode(&text);
    }
    // A panicked tokenizer task yields no tokens, which is refused as an empty prompt.
    tokio::task::spawn_blocking(move || tokenizer.encode(&text))
        .await
        .unwrap_or_default()
}

fn word(index: u32) -> &'static str {
    WORDS[(index.saturating_sub(1) as usize) % WORDS.len()]
}

fn usage(g: &Generation, completion_tokens: u32, cached_tokens: u32) -> Value {
    json!({
        "prompt_tokens": g.prompt_tokens,
        "total_tokens": u64::from(g.prompt_tokens) + u64::from(completion_tokens),
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens}
    })
}

async fn whole_response(
    mut g: Generation,
    mut rx: mpsc::UnboundedReceiver<RequestEvent>,
) -> Response {
    let mut text = String::with_capacity(g.max_tokens as usize * 6);
    let mut cached = 0;
    let mut produced = 0;
    while let Some(ev) = rx.recv().await {
        match ev {
            RequestEvent::Admitted { cached_tokens } => cached = cached_tokens,
            RequestEvent::Token { index, finished } => {
                text.push(' ');
                text.push_str(word(index));
                produced = index;
                if finished {
                    g.abort.finished();
                    break;
                }
            }
            _ => {}
        }
    }
    let choice = if g.chat {
        json!({"index": 0, "message": {"role": "assistant", "content": text, "tool_calls": []},
               "logprobs": null, "finish_reason": "length", "stop_reason": null})
    } else {
        json!({"index": 0, "text": text, "logprobs": null, "finish_reason": "length", "stop_reason": null})
    };
    json_response(
        StatusCode::OK,
        &json!({
            "id": g.id,
            "object": if g.chat { "chat.completion" } else { "text_completion" },
            "created": g.created,
            "model": g.model,
            "choices": [choice],
            "usage": usage(&g, produced, cached),
            "kv_transfer_params": g.kv_transfer_params,
        }),
    )
}

fn sse(out: &mut Vec<u8>, v: &Value) {
    out.extend_from_slice(b"data: ");
    // Serialising a Value into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, v);
    out.extend_from_slice(b"\n\n");
}

fn chunk(g: &Generation, index: u32, finished: bool) -> Value {
    let finish = if finished {
        Value::from("length")
    } else {
        Value::Null
    };
    let text = format!(" {}", word(index));
    if g.chat {
        json!({"id": g.id, "object": "chat.completion.chunk", "created": g.created, "model": g.model,
               "choices": [{"index": 0, "delta": {"content": text}, "logprobs": null, "finish_reason": finish}]})
    } else {
        json!({"id": g.id, "object": "text_completion", "created": g.created, "model": g.model,
               "choices": [{"index": 0, "text": text, "logprobs": null, "finish_reason": finish, "stop_reason": null}]})
    }
}

struct StreamState {
    g: Generation,
    rx: mpsc::UnboundedReceiver<RequestEvent>,
    cached: u32,
    done: bool,
}

/// `fail_after_tokens`: cut the stream (a body error: the connection breaks) after that many.
fn stream_response(
    g: Generation,
    rx: mpsc::UnboundedReceiver<RequestEvent>,
    fail_after_tokens: Option<u32>,
) -> Response {
    let state = StreamState {
        g,
        rx,
        cached: 0,
        done: false,
    };
    let stream = futures_util::stream::unfold(state, move |mut s| async move {
        if s.done {
            return None;
        }
        let mut out = Vec::with_capacity(256);
        loop {
            match s.rx.recv().await {
                Some(RequestEvent::Admitted { cached_tokens }) => s.cached = cached_tokens,
                Some(RequestEvent::Token { index, finished }) => {
                    if fail_after_tokens.is_some_and(|n| index > n) {
                        s.done = true;
                        return Some((Err(std::io::Error::other("injected fault")), s));
                    }
                    if index == 1 && s.g.chat {
                        sse(
                            &mut out,
                            &json!({"id": s.g.id, "object": "chat.completion.chunk", "created": s.g.created,
                            "model": s.g.model, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                            "logprobs": null, "finish_reason": null}]}),
                        );
                    }
                    sse(&mut out, &chunk(&s.g, index, finished));
                    if finished {
                        s.g.abort.finished();
                        if s.g.include_usage {
                            let object = if s.g.chat {
                                "chat.completion.chunk"
                            } else {
                                "text_completion"
                            };
                            sse(
                                &mut out,
                                &json!({"id": s.g.id, "object": object, "created": s.g.created,
                                "model": s.g.model, "choices": [], "usage": usage(&s.g, index, s.cached)}),
                            );
                        }
                        out.extend_from_slice(b"data: [DONE]\n\n");
                        s.done = true;
                    }
                    break;
                }
                Some(_) => {}
                None => {
                    // The engine went away mid-stream: end the stream.
                    out.extend_from_slice(b"data: [DONE]\n\n");
                    s.done = true;
                    break;
                }
            }
        }
        Some((Ok::<_, std::io::Error>(Bytes::from(out)), s))
    });
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(stream),
    )
        .into_response()
}
