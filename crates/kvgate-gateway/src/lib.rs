//! # kvgate-gateway — `kvgate serve`
//!
//! The OpenAI-compatible gateway: a thin I/O driver around `kvgate-core`'s decision.
//!
//! Where it sits among the layers (transports, pipeline, handles, core) is drawn once, in
//! ARCHITECTURE.md "The request-flow map"; its section "kvgate-gateway" follows a request step
//! by step. The folders are those layers: `net` (the transports: listener, tower layers, HTTP
//! proxy, ext_proc) and `ops` (admin listener, live page) call `pipeline` (one stack for every
//! completion), which calls `fleet` (the pods: scrape, KV events, discovery, reload, models,
//! breakers) and `handles` (what every task shares: the session, fleet, admission and telemetry
//! handles composed in `state::Shared`, config, pods, limits, flow gate, tokenizer); `cluster`
//! sits on `handles`; `serve` wires them. CI (`scripts/module_cycles.py`) fails on an import
//! cycle between folders. Every module is also re-exported at the crate root, so
//! `kvgate_gateway::config` and `crate::state` keep working.
//!
//! | module | one job |
//! |---|---|
//! | `net::listener` | the traffic listener's accept loop and connections (hyper-util auto: HTTP/1.1, h2c): connection cap, header-read, idle and client-write timeouts, accept-error pauses |
//! | `net::proxy` | the HTTP handlers of the traffic listener (`traffic_router`); the pipeline's HTTP transport (forward to the pod, stream the answer) |
//! | `net::admission` | `AdmissionLayer`, the traffic listener's tower layer: body read, then a slot of `limits::Admission` (429) |
//! | `net::auth` | optional API keys (Bearer) on `/v1/*`, compared in constant time (`ApiKeys`, in `config`); `AuthLayer`, the traffic listener's tower layer (401) |
//! | `net::ext_proc` | `--ext-proc-listen`: Envoy ext_proc endpoint picker (GAIE protocol), the stream's state machine; the pipeline's Envoy transport (the pod named, not sent) |
//! | `net::ext_proc::protocol` | the protocol's messages: header values, response status, subset hint read; routing answers (header mutation, `envoy.lb` metadata), streamed body chunks, immediate errors built |
//! | `ops::admin` | the admin listener: metrics, `/debug/decisions`, `/debug/config`, `/debug/score` (dry-run prefix scores), health, the live page's routes |
//! | `ops::ui` | the live page (`/ui`, one embedded HTML file) and its JSON: `/debug/pods`, `/debug/branches`, `/debug/predictor`, `/debug/queue`; the history's sampling task |
//! | `pipeline` | every completion's request pipeline, one stack for both transports: `ready` (prepare, flow class and cost, the flow turn), then `dispatch` (decide, the P/D prefill and decode pick, retries on another pod within the retry budget; the transport's `Deliver` sends or names the pod) |
//! | `pipeline::routing` | what both data paths share: `prepare` (parse, SLO headers, blocks, `max_prompt_tokens`, `--capture` ticket), `decide_for` (one decision through the session, recorded in `/debug/decisions`), `least_loaded` |
//! | `pipeline::lifecycle` | `TicketGuard`: a request's session ticket with its pod; first token, tokens, finish, returned once in `Drop` on every ending |
//! | `pipeline::pd` | prefill/decode disaggregation's protocol: the prefill call (`max_tokens: 1`, `kv_transfer_params.do_remote_decode`), its `kv_transfer_params` for the decode pod with the client's request, `kvgate_pd_*` metrics; the handoff and retries in `pipeline::dispatch` |
//! | `pipeline::upstream` | forwarding to a pod: the upstream request (hop-by-hop, `Authorization`, `x-request-id`), the client's response headers, the `include_usage` rewrite, `send` (first-byte and request timeouts), failed-attempt counting |
//! | `pipeline::body` | the response body: pass-through, observation, end-of-request accounting; streams end cleanly when the shutdown grace is over |
//! | `pipeline::sse` | SSE event splitting, first-content and usage detection, usage stripping |
//! | `pipeline::flow` | flow control (`[flow_control]`, off by default): a request's class (priority, tenant), `wait_turn` before the first decision (the core's `FlowQueue` and saturation detector, a driver task releasing by headroom), 429/503 with `Retry-After`, `kvgate_flow_*` metrics |
//! | `fleet::reload` | re-read the config file on change; keep the old one if invalid |
//! | `fleet::discovery` | `--discovery`: static, or `kubernetes` (feature `k8s`: watch ready Pods by label, keep them in the pod table) |
//! | `fleet::breaker` | a pod whose responses die mid-body, or that sends no response headers in time while it makes no progress, N times in a row is avoided for a cooldown; at most half of the pods answering their scrape at once (at least one); panic routing when every such pod is avoided |
//! | `fleet::scrape` | tolerant `/metrics` parser (incl. LoRA slots: the newest `vllm:lora_requests_info`, deferred requests; a DP server's series split by `engine` label) and the scrape loop |
//! | `fleet::models` | `GET /v1/models`: the pods' lists merged (linear, off the async workers, at most 10,000 ids), each entry with the pods serving it (`kvgate_pods`) |
//! | `fleet::served_models` | model-aware fleets: each pod's models (declared `model`, then learnt from its `/v1/models` every `models_refresh_interval_ms` and after an outage); the pipeline's 404 `model_not_found` and its exclusion of pods of other models |
//! | `fleet::kv_events` | `--index engine`: ZeroMQ SUB (and replay) per pod, batches decoded by the core and followed by its `KvEventFollower` |
//! | `handles::config` | `Settings`, the one tree of `kvgate serve`'s keys (`/debug/config` is it serialised), laid in layers (defaults, file, `KVGATE_…` environment, flags) by one generic merge (`config/layers.rs`); `GatewayConfig` (the settings and what is derived from them); the plain data it is made of: `ServeArgs` (the layers given; the clap flags are the binary's `serve_cli.rs`), `DiscoveryKind`, `ApiKeys`, `ClusterConfig` |
//! | `handles::pods` | the pod table (`Fleet`: the pods in order, a pod's handle by id in O(1)) and health (in-flight counters are the session's ledger), each pod's `Breaker` state, `PodMetrics` (what a scrape read); a data-parallel server (`dp=N`) is N engine pods `URL#dp<r>` at one URL |
//! | `handles::progress` | whether a pod's engine steps (its scraped counters moved, or it streamed a token): a silence from a progressing pod is a busy pod's, not a failure |
//! | `handles::retry_budget` | retries in flight ≤ 20 % of the requests in flight (at least 3), so that retries cannot multiply an overload |
//! | `handles::state` | `Shared`, what all tasks share: the four handles below, the config and token mode's tokenizer; `apply_config`, `set_discovered`, `metrics_text` (what spans handles) |
//! | `handles::session` | `SessionHandle`: the core's `RouterSession` behind one mutex, taken through its methods; `ReplicaLink`, what the gateway tells `--cluster`'s other replicas (implemented by `cluster::Cluster`), the observer of every transition |
//! | `handles::fleet_handle` | `FleetHandle`: the pod table, the discovered pods (their lock serialises table updates), the upstream client |
//! | `handles::admission_handle` | `AdmissionHandle`: slots and queue, body budget, flow gate, retry budget, shutdown and grace |
//! | `handles::telemetry` | `Telemetry`: metrics, log limiter, decision log, live history, capture, OpenTelemetry |
//! | `handles::grace` | `GraceEnd`: the end of the shutdown grace, told to every stream in flight |
//! | `handles::limits` | `Admission` (concurrency limit and bounded queue, shared with ext_proc), `Slot`, the body budget, `read_body_within` |
//! | `handles::flow_gate` | flow control's state in `AdmissionHandle` (`FlowGate`: the core's queue, requests let go and not yet routed, predicted TTFTs, the driver's wake-up); a request's `Turn` |
//! | `handles::log_limit` | per-kind rate limit of the per-request log lines (rejections, failures) a flood can trigger, with "suppressed K" summaries |
//! | `handles::errors` | OpenAI-style error bodies; `request_error`, `no_healthy_pod`, `upstream_failed` |
//! | `handles::reject` | a request the gateway answers itself, counted and logged (rate limited): `log_reject`, `reject` |
//! | `handles::request_id` | the `x-request-id` every answer carries (the client's when usable, else a fresh one) |
//! | `handles::slo` | `x-slo-ttft-ms` / `x-slo-tpot-ms` (and `x-llm-d-slo-*`) → objectives, or 400 (recorded; only `llmd-chain` routes by them) |
//! | `handles::metrics` | kvgate's own Prometheus metrics (also the connection, flow, P/D and cluster metric sets their modules fill); `timeout_label` |
//! | `handles::otel` | `[tracing]`: OpenTelemetry traces over OTLP/HTTP (off by default): the request span continuing the client's `traceparent`, child spans for the flow queue, each decision, upstream call and the stream; the pod's `traceparent`; parent-based ratio sampling; batch queue ≤ 2,048 spans |
//! | `handles::decisions` | the bounded `/debug/decisions` ring; `--decisions-log`: each routed request's record completed with its outcome |
//! | `handles::jsonl` | an append-only JSON-lines file written by its own thread through a bounded queue |
//! | `handles::live` | what the live page shows over time: decisions per gate branch, and a 5-minute history (the predictor's error, the queues) sampled every 5 s |
//! | `handles::tokenizer` | token mode's tokenizer: built-in cl100k or `--tokenizer tokenizer.json` (HF `tokenizers`, pure Rust) |
//! | `handles::token_cache` | token mode's tokenization reuse: prompts cut at provably safe points (message boundaries), each segment's ids kept in a bounded LRU (`--tokenization-cache-mib`, 64 MiB), so a conversation's next turn tokenizes only its new text |
//! | `handles::chat_template` | the model's chat template (next to `--tokenizer`, or `--chat-template FILE`), rendered as vLLM does (minijinja), so chat prompts cut into the engine's token blocks |
//! | `handles::capture` | `--capture FILE`: served requests as Mooncake JSONL (no text), for replay |
//! | `cluster` | `--cluster`: active-active replicas over NATS — the driver of the core `ReplicaMachine` (the protocol: request ids, sequence numbers, batching, snapshots, leases, dedup, samples, warm-up): the TicketGuard's transitions into it, its messages encoded (binary `wire` format) and published, the other replicas' decoded and handed to it |
//! | `serve` | `Gateway::start`, `serve` (`ServeArgs` is `config`'s, re-exported) |
//!
//! Memory bounds: traffic connections ≤ `max_connections` (8,192); requests in service ≤ `max_concurrent_requests` (1024), waiting ≤
//! `max_waiting_requests` (1024); request bodies ≤ `max_body_bytes` (32 MiB); scraped bodies ≤ 4 MiB;
//! decision ring ≤ `decision_log_size` (256) records; `--decisions-log` queue ≤ 4,096 records; SSE events inspected ≤ 1 MiB each;
//! non-stream bodies copied for usage ≤ 1 MiB; routed index as in the core (≤ 96 B/block); the
//! session's in-flight ledger one counter set and one generation per pod id.

// The layers, outside in (ARCHITECTURE.md "The request-flow map"); `scripts/module_cycles.py`
// (CI) checks that these folders import each other without a cycle: serve → net, ops →
// pipeline → fleet → handles; cluster → handles.
pub mod cluster;
pub mod fleet;
pub mod handles;
pub mod net;
pub mod ops;
pub(crate) mod pipeline;
pub mod serve;

// Every module keeps its path at the crate root (`kvgate_gateway::config`, `crate::state`).
pub use fleet::{
    breaker, discovery, kv_events, models, reload, scrape, scrape_pace, served_models,
};
pub use handles::{
    capture, chat_template, config, decisions, errors, flow_gate, grace, jsonl, limits, live,
    log_limit, metrics, otel, pods, progress, reject, request_id, retry_budget, slo, state,
    token_cache, tokenizer,
};
pub use net::{admission, auth, ext_proc, listener, proxy};
pub use ops::{admin, ui};
pub use pipeline::{body, flow, lifecycle, pd, routing, sse, upstream};

pub use config::{GatewayConfig, ServeArgs, Settings};
pub use serve::{Gateway, ServeError, init_tracing, init_tracing_with_default, serve};
