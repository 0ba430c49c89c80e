//! # kvgate-gateway — `kvgate serve`
//!
//! The OpenAI-compatible gateway: a thin I/O driver around `kvgate-core`'s decision.
//!
//! Where it sits among the layers (transports, pipeline, handles, core) is drawn once, in
//! ARCHITECTURE.md "The request-flow map"; its section "kvgate-gateway" follows a request step
//! by step.
//!
//! | module | one job |
//! |---|---|
//! | `config` | `Settings`, the one tree of `kvgate serve`'s keys (`/debug/config` is it serialised), laid in layers (defaults, file, `KVGATE_…` environment, flags) by one generic merge (`config/layers.rs`); `GatewayConfig` (the settings and what is derived from them); the plain data it is made of: `ServeArgs` (the layers given; the clap flags are the binary's `serve_cli.rs`), `DiscoveryKind`, `ApiKeys`, `ClusterConfig` |
//! | `reload` | re-read the config file on change; keep the old one if invalid |
//! | `discovery` | `--discovery`: static, or `kubernetes` (feature `k8s`: watch ready Pods by label, keep them in the pod table) |
//! | `pods` | the pod table (`Fleet`: the pods in order, a pod's handle by id in O(1)) and health (in-flight counters are the session's ledger), each pod's `Breaker` state, `PodMetrics` (what a scrape read); a data-parallel server (`dp=N`) is N engine pods `URL#dp<r>` at one URL |
//! | `breaker` | a pod whose responses die mid-body, or that sends no response headers in time while it makes no progress, N times in a row is avoided for a cooldown; at most half of the pods answering their scrape at once (at least one); panic routing when every such pod is avoided |
//! | `progress` | whether a pod's engine steps (its scraped counters moved, or it streamed a token): a silence from a progressing pod is a busy pod's, not a failure |
//! | `retry_budget` | retries in flight ≤ 20 % of the requests in flight (at least 3), so that retries cannot multiply an overload |
//! | `scrape` | tolerant `/metrics` parser (incl. LoRA slots: the newest `vllm:lora_requests_info`, deferred requests; a DP server's series split by `engine` label) and the scrape loop |
//! | `state` | what all tasks share; the core's `RouterSession` behind one mutex (`Shared::session`); `ReplicaLink`, what the gateway tells `--cluster`'s other replicas (implemented by `cluster::Cluster`) |
//! | `pipeline` | every completion's request pipeline, one stack for both transports: `ready` (prepare, flow class and cost, the flow turn), then `dispatch` (decide, the P/D prefill and decode pick, retries on another pod within the retry budget; the transport's `Deliver` sends or names the pod) |
//! | `routing` | what both data paths share: `prepare` (parse, SLO headers, blocks, `max_prompt_tokens`, `--capture` ticket), `decide_for` (one decision through the session, recorded in `/debug/decisions`), `least_loaded` |
//! | `lifecycle` | `TicketGuard`: a request's session ticket with its pod; first token, tokens, finish, returned once in `Drop` on every ending |
//! | `cluster` | `--cluster`: active-active replicas over NATS — the driver of the core `ReplicaMachine` (the protocol: request ids, sequence numbers, batching, snapshots, leases, dedup, samples, warm-up): the TicketGuard's transitions into it, its messages encoded (binary `wire` format) and published, the other replicas' decoded and handed to it |
//! | `listener` | the traffic listener's accept loop and connections (hyper-util auto: HTTP/1.1, h2c): connection cap, header-read, idle and client-write timeouts, accept-error pauses |
//! | `proxy` | the HTTP handlers of the traffic listener (`traffic_router`); the pipeline's HTTP transport (forward to the pod, stream the answer) |
//! | `pd` | prefill/decode disaggregation's protocol: the prefill call (`max_tokens: 1`, `kv_transfer_params.do_remote_decode`), its `kv_transfer_params` for the decode pod with the client's request, `kvgate_pd_*` metrics; the handoff and retries in `pipeline::dispatch` |
//! | `upstream` | forwarding to a pod: the upstream request (hop-by-hop, `Authorization`, `x-request-id`), the client's response headers, the `include_usage` rewrite, `send` (first-byte and request timeouts), failed-attempt counting |
//! | `body` | the response body: pass-through, observation, end-of-request accounting; streams end cleanly when the shutdown grace is over |
//! | `grace` | `GraceEnd`: the end of the shutdown grace, told to every stream in flight |
//! | `sse` | SSE event splitting, first-content and usage detection, usage stripping |
//! | `limits` | `Admission` (concurrency limit and bounded queue, shared with ext_proc), `Slot`, the body budget, `read_body_within` |
//! | `admission` | `AdmissionLayer`, the traffic listener's tower layer: body read, then a slot of `limits::Admission` (429) |
//! | `flow` | flow control (`[flow_control]`, off by default): a request's class (priority, tenant), `wait_turn` before the first decision (the core's `FlowQueue` and saturation detector, a driver task releasing by headroom), 429/503 with `Retry-After`, `kvgate_flow_*` metrics |
//! | `flow_gate` | flow control's state in `Shared` (`FlowGate`: the core's queue, requests let go and not yet routed, predicted TTFTs, the driver's wake-up); a request's `Turn` |
//! | `auth` | optional API keys (Bearer) on `/v1/*`, compared in constant time (`ApiKeys`, in `config`); `AuthLayer`, the traffic listener's tower layer (401) |
//! | `log_limit` | per-kind rate limit of the per-request log lines (rejections, failures) a flood can trigger, with "suppressed K" summaries |
//! | `models` | `GET /v1/models`: the pods' lists merged (linear, off the async workers, at most 10,000 ids), each entry with the pods serving it (`kvgate_pods`) |
//! | `served_models` | model-aware fleets: each pod's models (declared `model`, then learnt from its `/v1/models` every `models_refresh_interval_ms` and after an outage); the pipeline's 404 `model_not_found` and its exclusion of pods of other models |
//! | `errors` | OpenAI-style error bodies; `request_error`, `no_healthy_pod`, `upstream_failed` |
//! | `reject` | a request the gateway answers itself, counted and logged (rate limited): `log_reject`, `reject` |
//! | `request_id` | the `x-request-id` every answer carries (the client's when usable, else a fresh one) |
//! | `session_key` | the client's session from its headers (`session_headers`: `x-session-id`, Claude Code's, OpenCode's) → the key session affinity remembers a pod for, or 400 |
//! | `slo` | `x-slo-ttft-ms` / `x-slo-tpot-ms` (and `x-llm-d-slo-*`) → objectives, or 400 (they route only with `slo_routing`) |
//! | `metrics` | kvgate's own Prometheus metrics (also the connection, flow, P/D and cluster metric sets their modules fill); `timeout_label` |
//! | `otel` | `[tracing]`: OpenTelemetry traces over OTLP/HTTP (off by default): the request span continuing the client's `traceparent`, child spans for the flow queue, each decision, upstream call and the stream; the pod's `traceparent`; parent-based ratio sampling; batch queue ≤ 2,048 spans |
//! | `decisions` | the bounded `/debug/decisions` ring; `--decisions-log`: each routed request's record completed with its outcome |
//! | `jsonl` | an append-only JSON-lines file written by its own thread through a bounded queue |
//! | `admin` | the admin listener: metrics, `/debug/decisions`, `/debug/config`, `/debug/score` (dry-run prefix scores), health, the live page's routes |
//! | `live` | what the live page shows over time: decisions per gate branch, and a 5-minute history (the predictor's error, the queues) sampled every 5 s |
//! | `ui` | the live page (`/ui`, one embedded HTML file) and its JSON: `/debug/pods`, `/debug/branches`, `/debug/predictor`, `/debug/queue`; the history's sampling task |
//! | `ext_proc` | `--ext-proc-listen`: Envoy ext_proc endpoint picker (GAIE protocol), the stream's state machine; the pipeline's Envoy transport (the pod named, not sent) |
//! | `ext_proc::protocol` | the protocol's messages: header values, response status, subset hint read; routing answers (header mutation, `envoy.lb` metadata), streamed body chunks, immediate errors built |
//! | `kv_events` | `--index engine`: ZeroMQ SUB (and replay) per pod, batches decoded by the core and followed by its `KvEventFollower` |
//! | `tokenizer` | token mode's tokenizer: built-in cl100k or `--tokenizer tokenizer.json` (HF `tokenizers`, pure Rust) |
//! | `token_cache` | token mode's tokenization reuse: prompts cut at provably safe points (message boundaries), each segment's ids kept in a bounded LRU (`--tokenization-cache-mib`, 64 MiB), so a conversation's next turn tokenizes only its new text |
//! | `chat_template` | the model's chat template (next to `--tokenizer`, or `--chat-template FILE`), rendered as vLLM does (minijinja), so chat prompts cut into the engine's token blocks |
//! | `capture` | `--capture FILE`: served requests as Mooncake JSONL (no text), for replay |
//! | `serve` | `Gateway::start`, `serve` (`ServeArgs` is `config`'s, re-exported) |
//!
//! Memory bounds: traffic connections ≤ `max_connections` (8,192); requests in service ≤ `max_concurrent_requests` (1024), waiting ≤
//! `max_waiting_requests` (1024); request bodies ≤ `max_body_bytes` (32 MiB); scraped bodies ≤ 4 MiB;
//! decision ring ≤ `decision_log_size` (256) records; `--decisions-log` queue ≤ 4,096 records; SSE events inspected ≤ 1 MiB each;
//! non-stream bodies copied for usage ≤ 1 MiB; routed index as in the core (≤ 96 B/block); the
//! session's in-flight ledger one counter set and one generation per pod id.

pub mod admin;
pub mod admission;
pub mod auth;
pub mod body;
pub mod breaker;
pub mod capture;
pub mod chat_template;
pub mod cluster;
pub mod config;
pub mod decisions;
pub mod discovery;
pub mod errors;
pub mod ext_proc;
pub mod flow;
pub mod flow_gate;
pub mod grace;
pub mod jsonl;
pub mod kv_events;
pub mod lifecycle;
pub mod limits;
pub mod listener;
pub mod live;
pub mod log_limit;
pub mod metrics;
pub mod models;
pub mod otel;
pub mod pd;
pub(crate) mod pipeline;
pub mod pods;
pub mod progress;
pub mod proxy;
pub mod reject;
pub mod reload;
pub mod request_id;
pub mod retry_budget;
pub mod routing;
pub mod scrape;
pub mod scrape_pace;
pub mod serve;
pub mod served_models;
pub mod session_key;
pub mod slo;
pub mod sse;
pub mod state;
pub mod token_cache;
pub mod tokenizer;
pub mod ui;
pub mod upstream;

pub use config::{GatewayConfig, ServeArgs, Settings};
pub use serve::{Gateway, ServeError, init_tracing, init_tracing_with_default, serve};
