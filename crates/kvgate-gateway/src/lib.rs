//! # kvgate-gateway — `kvgate serve`
//!
//! The OpenAI-compatible gateway: a thin I/O driver around `kvgate-core`'s decision.
//!
//! ```text
//! client ─► proxy (parse, decide, forward, retry) ─► pod
//!             │        ▲ state (router, index, predictor under one mutex)
//!             ▼        │
//!           body (stream frame by frame, first token, usage, in-flight guard) ─► predictor
//! scrape (pod /metrics every 50 ms) ─► pods (table, health, in-flight counters)
//! reload (config file mtime) ─► config ─► pods / router
//! discovery (--discovery kubernetes: Pod watch) ─► pods
//! admin (/metrics, /debug/decisions, /debug/config, /healthz, /readyz)
//! ```
//!
//! | module | one job |
//! |---|---|
//! | `config` | `GatewayConfig` from defaults, config file and flags |
//! | `reload` | re-read the config file on change; keep the old one if invalid |
//! | `discovery` | `--discovery`: static, or `kubernetes` (feature `k8s`: watch ready Pods by label, keep them in the pod table) |
//! | `pods` | the pod table, health, in-flight counters and their RAII guard |
//! | `breaker` | a pod whose responses die mid-body N times in a row is avoided for a cooldown |
//! | `scrape` | tolerant `/metrics` parser and the scrape loop |
//! | `state` | what all tasks share; the core's state behind one mutex |
//! | `proxy` | the HTTP handlers of the traffic listener, retries |
//! | `body` | the response body: pass-through, observation, end-of-request accounting |
//! | `sse` | SSE event splitting, first-content and usage detection, usage stripping |
//! | `limits` | concurrency limit and bounded queue of the traffic listener (429) |
//! | `auth` | optional API keys (Bearer) on `/v1/*`, compared in constant time |
//! | `errors` | OpenAI-style error bodies |
//! | `slo` | `x-slo-ttft-ms` / `x-slo-tpot-ms` (and `x-llm-d-slo-*`) → objectives, or 400 |
//! | `metrics` | kvgate's own Prometheus metrics |
//! | `decisions` | the bounded `/debug/decisions` ring |
//! | `admin` | the admin listener |
//! | `ext_proc` | `--ext-proc-listen`: Envoy ext_proc endpoint picker (GAIE protocol), same decision code |
//! | `tokenizer` | token mode's tokenizer: built-in cl100k or `--tokenizer tokenizer.json` (HF `tokenizers`, pure Rust) |
//! | `capture` | `--capture FILE`: served requests as Mooncake JSONL (no text), for replay |
//! | `trainer` | background retraining of the predictor's tree models; swaps them in under the lock |
//! | `serve` | `ServeArgs`, `Gateway::start`, `serve` |
//!
//! Memory bounds: requests in service ≤ `max_concurrent_requests` (1024), waiting ≤
//! `max_queued_requests` (1024); request bodies ≤ `max_body_bytes` (32 MiB); scraped bodies ≤ 4 MiB;
//! decision ring ≤ `decision_log_size` (256) records; SSE events inspected ≤ 1 MiB each;
//! non-stream bodies copied for usage ≤ 1 MiB; routed index as in the core (≤ 96 B/block).

pub mod admin;
pub mod auth;
pub mod body;
pub mod breaker;
pub mod capture;
pub mod config;
pub mod decisions;
pub mod discovery;
pub mod errors;
pub mod ext_proc;
pub mod kv_events;
pub mod lifecycle;
pub mod limits;
pub mod metrics;
pub mod pods;
pub mod proxy;
pub mod reload;
pub mod request_id;
pub mod routing;
pub mod scrape;
pub mod serve;
pub mod slo;
pub mod sse;
pub mod state;
pub mod tokenizer;
pub mod trainer;

pub use config::GatewayConfig;
pub use serve::{Gateway, ServeArgs, ServeError, init_tracing, init_tracing_with_default, serve};
