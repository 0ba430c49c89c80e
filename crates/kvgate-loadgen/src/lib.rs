//! # kvgate-loadgen — `kvgate loadgen`
//!
//! Open-loop replay of a trace (Mooncake JSONL, Azure CSV) or a generated workload (`chat`,
//! `shared-prefix`) against any OpenAI-compatible endpoint: a pod, kvgate, or another router.
//!
//! - **Open loop.** Request `i` is sent at its arrival time (÷ `--rate-scale`) whatever happened to
//!   the earlier ones. At most `--max-concurrency` requests (default 256) are in flight; a request
//!   due while all slots are busy waits for one, so its send time slips — the slip is reported
//!   (`dispatch_lag_ms`) and latencies are measured from the actual send. Nothing is dropped.
//! - **Prompts.** Synthesised deterministically ([`prompt`]): equal Mooncake `hash_ids` (or equal
//!   block hashes of a generator) give byte-equal text, so the workload's prefix sharing is real
//!   at the HTTP level. Each request is a `/v1/completions` call with `max_tokens` =
//!   `output_length` and `ignore_eos: true`.
//! - **Measures.** With `--stream`: TTFT (first non-empty text chunk), TPOT ((e2e − TTFT) /
//!   (tokens − 1)), e2e; without: e2e only. Errors are counted by kind (`connect`, `timeout`,
//!   `http_<status>`, `stream`, `bad_response`). The pods' prefix-cache hit rate is
//!   Δ`vllm:prefix_cache_hits_total` / Δ`vllm:prefix_cache_queries_total` over the run, read from
//!   every `--pod-metrics` URL (default: the target's own `/metrics`, which works when the target
//!   is a pod).
//! - **Report.** A summary on stdout; `--requests-jsonl FILE` one line per request (send time,
//!   TTFT, e2e, error kind); `--json FILE` writes [`LoadgenReport`], whose keys are those
//!   of `kvgate sim --json`'s runs where they overlap (`requests`, `completed`, `ttft_ms`,
//!   `tpot_ms`, `e2e_ms` with `mean/p50/p90/p99`, `prefix_hit_rate`, `output_tok_per_s`).
//!
//! - **Classes** (`--classes`, [`classes`]): each request tagged with a flow-control priority and
//!   tenant exactly as the simulator tags them, sent as kvgate's `x-kvgate-priority` /
//!   `x-kvgate-tenant` headers, and the report split per group (high / normal priority, quiet /
//!   noisy tenant) — a live overload run comparable with `kvgate-sim`'s `flow_overload`.
//!
//! The entry is [`run`] with [`LoadgenArgs`], plain options: the flags, their help and defaults
//! are the `kvgate` binary's (`crates/kvgate/src/loadgen_cli.rs`), and this crate does not depend
//! on clap.
//!
//! Bounds: prompt text is built when a request is sent and freed when it ends; an SSE line is read
//! up to 1 MiB, a non-stream body up to 16 MiB; one small result per request is kept.

pub mod classes;
pub mod plan;
pub mod pod_metrics;
pub mod prompt;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvgate_sim::cluster::SimClass;
use kvgate_sim::report::Percentiles;
use kvgate_sim::workload::classes::ClassParams;
use kvgate_sim::workload::{Workload, WorkloadError};
use plan::{GeneratedWorkload, Planned};
use serde::Serialize;
use serde_json::{Value, json};

/// `kvgate loadgen`'s options, plain: the flags (their names, help and defaults) are defined in
/// the binary (`crates/kvgate/src/loadgen_cli.rs`); [`run`] validates them.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadgenArgs {
    /// Base URL of an OpenAI-compatible endpoint (a pod, kvgate, another router).
    pub target: String,
    /// Trace file: Mooncake JSONL or Azure CSV (detected from the content).
    pub trace: Option<PathBuf>,
    /// A generated workload instead of a trace.
    pub workload: Option<GeneratedWorkload>,
    /// Preset of the shared-prefix workload: A, B, C or D.
    pub preset: String,
    /// Seed of a generated workload.
    pub workload_seed: u64,
    /// Chat and agent workloads: end a session before a prompt longer than this many tokens
    /// (a pod's context; default 32768).
    pub max_context_tokens: Option<u32>,
    /// Multiplies the arrival rate (arrival times ÷ F).
    pub rate_scale: f64,
    /// Send only the first N requests.
    pub max_requests: Option<usize>,
    /// Most requests in flight; later ones wait for a slot (their send time slips).
    pub max_concurrency: usize,
    /// Stream responses (needed for TTFT and TPOT).
    pub stream: bool,
    /// Send prompts as token ids (one id per synthetic word, `prompt::TOKEN_ID_BASE` + its index)
    /// instead of text, so a real engine sees exactly the planned prompt lengths whatever its
    /// tokenizer (as the simulator does).
    pub token_prompts: bool,
    /// Model name to send [default: the first of the target's /v1/models].
    pub model: Option<String>,
    /// A pod's base or /metrics URL for the prefix-cache hit rate (repeatable)
    /// [default: the target's /metrics].
    pub pod_metrics: Vec<String>,
    /// Per-request timeout in seconds.
    pub timeout_s: f64,
    /// Write the report as JSON.
    pub json: Option<PathBuf>,
    /// Write one JSON line per request, in send order: `id`, `sent_unix_ms` (wall clock when it
    /// was sent), `ttft_ms`, `e2e_ms`, `output_tokens`, `error` (kind, or null).
    pub requests_jsonl: Option<PathBuf>,
    /// No progress bar and no summary.
    pub quiet: bool,
    /// Tag requests with flow-control classes (priority and tenant headers) as the simulator
    /// does, and report per group (see the `classes` module).
    pub classes: bool,
    /// Seed of the class tags.
    pub class_seed: u64,
    /// Share of requests sent with `x-kvgate-priority: --high-priority`.
    pub high_share: f64,
    /// The high priority.
    pub high_priority: i32,
    /// Tenants (`x-kvgate-tenant: tenant-0` … `tenant-(N-1)`); tenant 0 is the noisy one.
    pub tenants: u32,
    /// Tenant 0 sends this many times each other tenant's share.
    pub noisy_factor: f64,
    /// Keep each of tenant 0's requests with this probability (1 / --noisy-factor: it sends
    /// only its share; the other tenants' requests are unchanged).
    pub noisy_keep: f64,
    /// Agent workload: compact each session's history every N steps (0: never), as agent
    /// clients do with a long context (`kvgate sim --agent-compact-every`).
    pub agent_compact_every: u32,
    /// Send each request's session (the agent workload's) in this header, as agent clients
    /// name theirs (for example `x-session-id`); `None`: no session header.
    pub session_header: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum LoadgenError {
    #[error(transparent)]
    Workload(#[from] WorkloadError),
    #[error("give --trace FILE or --workload chat|shared-prefix")]
    NoWorkload,
    #[error("invalid {name}: {reason}")]
    InvalidArg { name: &'static str, reason: String },
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
    #[error("no --model given and {url}/v1/models gave none: {reason}")]
    NoModel { url: String, reason: String },
    #[error("cannot write {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
}

/// What a run measured (`--json`). The first keys match `kvgate sim --json`'s runs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LoadgenReport {
    pub requests: u64,
    pub completed: u64,
    pub ttft_ms: Percentiles,
    pub tpot_ms: Percentiles,
    pub e2e_ms: Percentiles,
    /// Pods' prefix-cache hit rate over the run (tokens), `null` when unknown.
    pub prefix_hit_rate: Option<f64>,
    pub output_tok_per_s: f64,
    // ---- loadgen only ----
    pub target: String,
    pub model: String,
    pub stream: bool,
    pub max_concurrency: usize,
    pub workload: Workload,
    /// Failed requests by kind.
    pub errors: BTreeMap<String, u64>,
    pub requests_per_s: f64,
    /// First send to last response end.
    pub makespan_s: f64,
    pub input_tokens_sent: u64,
    pub output_tokens: u64,
    /// How late requests were sent (waiting for a concurrency slot, or a busy client).
    pub dispatch_lag_ms: Percentiles,
    /// Per class group, with `--classes`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub classes: Option<classes::ClassReport>,
}

/// The outcome of one request.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// When it was sent, ms after the run's first send slot (set by the replay loop).
    pub sent_ms: f64,
    pub ttft_ms: Option<f64>,
    pub e2e_ms: f64,
    pub output_tokens: u64,
    pub error: Option<String>,
    /// The pod that served it, from a router's `x-kvgate-pod` response header.
    pub served_by: Option<String>,
    /// The router's decision branch (`x-kvgate-branch`: exploit, no_sticky, load_break, …).
    pub branch: Option<String>,
    /// The time it waited in the router's flow-control queue (`x-kvgate-queue-ms`).
    pub queue_ms: Option<f64>,
}

const MAX_SSE_LINE_BYTES: usize = 1 << 20;
const MAX_BODY_BYTES: usize = 16 << 20;

/// Runs `kvgate loadgen`: loads the workload, replays it, prints and returns the report.
pub async fn run(args: LoadgenArgs) -> Result<LoadgenReport, LoadgenError> {
    if args.max_concurrency == 0 {
        return Err(LoadgenError::InvalidArg {
            name: "--max-concurrency",
            reason: "must be at least 1".into(),
        });
    }
    if !(args.timeout_s.is_finite() && args.timeout_s > 0.0) {
        return Err(LoadgenError::InvalidArg {
            name: "--timeout-s",
            reason: format!("must be finite and > 0, got {}", args.timeout_s),
        });
    }
    let session_header = match &args.session_header {
        Some(name) => Some(
            reqwest::header::HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                LoadgenError::InvalidArg {
                    name: "--session-header",
                    reason: format!("{name:?} is not a header name"),
                }
            })?,
        ),
        None => None,
    };
    let (mut workload, mut requests) = match (&args.trace, args.workload) {
        (Some(path), _) => plan::from_trace(path)?,
        (None, Some(kind)) => plan::generated(
            kind,
            &plan::GenerateOptions {
                preset: &args.preset,
                seed: args.workload_seed,
                max_requests: args.max_requests,
                max_context_tokens: args.max_context_tokens,
                agent_compact_every: args.agent_compact_every,
            },
        )?,
        (None, None) => return Err(LoadgenError::NoWorkload),
    };
    plan::trim_and_scale(
        &mut workload,
        &mut requests,
        args.max_requests,
        args.rate_scale,
    )?;
    let class_params = args.classes.then_some(ClassParams {
        seed: args.class_seed,
        high_share: args.high_share,
        high_priority: args.high_priority,
        tenants: args.tenants,
        noisy_factor: args.noisy_factor,
    });
    let tags: Vec<Option<SimClass>> = match &class_params {
        Some(p) => {
            if !(0.0..=1.0).contains(&args.high_share) || !(0.0..=1.0).contains(&args.noisy_keep) {
                return Err(LoadgenError::InvalidArg {
                    name: "--high-share/--noisy-keep",
                    reason: "must be in [0, 1]".into(),
                });
            }
            if args.tenants == 0 || !(args.noisy_factor.is_finite() && args.noisy_factor >= 0.0) {
                return Err(LoadgenError::InvalidArg {
                    name: "--tenants/--noisy-factor",
                    reason: "at least 1 tenant and a finite factor ≥ 0".into(),
                });
            }
            let tagged = classes::tag_and_thin(std::mem::take(&mut requests), p, args.noisy_keep);
            workload.request_count = tagged.len();
            let (r, c): (Vec<_>, Vec<_>) = tagged.into_iter().map(|(r, c)| (r, Some(c))).unzip();
            requests = r;
            c
        }
        None => vec![None; requests.len()],
    };
    let target = args.target.trim_end_matches('/').to_owned();
    let client = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true)
        .pool_max_idle_per_host(args.max_concurrency)
        .build()
        .map_err(|e| LoadgenError::Client(e.to_string()))?;
    let model = match &args.model {
        Some(m) => m.clone(),
        None => first_model(&client, &target).await?,
    };
    let metrics_urls: Vec<String> = if args.pod_metrics.is_empty() {
        vec![pod_metrics::metrics_url(&target)]
    } else {
        args.pod_metrics
            .iter()
            .map(|u| pod_metrics::metrics_url(u))
            .collect()
    };
    let before = pod_metrics::scrape_all(&client, &metrics_urls).await;

    let bar = if args.quiet {
        indicatif::ProgressBar::hidden()
    } else {
        indicatif::ProgressBar::new(requests.len() as u64)
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:40} {pos}/{len} requests  {elapsed}/{eta}  {msg}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let ctx = Arc::new(SendContext {
        client: client.clone(),
        url: format!("{target}/v1/completions"),
        model: model.clone(),
        stream: args.stream,
        token_prompts: args.token_prompts,
        timeout: Duration::from_secs_f64(args.timeout_s),
        session_header,
    });
    let run_unix_ms = unix_ms_now();
    let (outcomes, lags, makespan_s, input_tokens_sent) =
        replay(&ctx, &requests, &tags, args.max_concurrency, &bar).await;
    bar.finish_and_clear();

    let after = pod_metrics::scrape_all(&client, &metrics_urls).await;
    let prefix_hit_rate = match (before, after) {
        (Some(b), Some(a)) => a.hit_rate_since(&b),
        _ => None,
    };
    let mut report = summarize(
        &outcomes,
        lags,
        makespan_s,
        input_tokens_sent,
        prefix_hit_rate,
        Meta {
            target,
            model,
            stream: args.stream,
            max_concurrency: args.max_concurrency,
            workload,
        },
    );
    if let Some(p) = &class_params {
        let tags: Vec<SimClass> = tags.iter().map(|c| c.unwrap_or_default()).collect();
        report.classes = Some(classes::report(&outcomes, &tags, p, args.noisy_keep));
    }
    if !args.quiet {
        print_summary(&report);
    }
    if let Some(path) = &args.requests_jsonl {
        write_requests_jsonl(path, &requests, &tags, &outcomes, run_unix_ms)?;
    }
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&report).unwrap_or_else(|_| "{}".into());
        std::fs::write(path, text).map_err(|source| LoadgenError::Write {
            path: path.display().to_string(),
            source,
        })?;
    }
    Ok(report)
}

fn unix_ms_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64() * 1e3)
        .unwrap_or(0.0)
}

/// One JSON line per request (`--requests-jsonl`), for time-resolved analysis (e.g. p99 TTFT
/// inside and outside fault windows in `bench/soak.sh`): `id`, `sent_unix_ms`, `ttft_ms`,
/// `e2e_ms`, `output_tokens`, `error`, `input_tokens`; `pod`, `branch` and `queue_ms` when the
/// target is a router that said them (kvgate's `x-kvgate-pod`, `x-kvgate-branch` and
/// `x-kvgate-queue-ms` headers); with
/// `--classes`, also its `priority` and `tenant`.
pub fn requests_jsonl(
    requests: &[Planned],
    tags: &[Option<SimClass>],
    outcomes: &[Outcome],
    run_unix_ms: f64,
) -> String {
    let mut out = String::new();
    for (i, (r, o)) in requests.iter().zip(outcomes).enumerate() {
        let mut line = json!({
            "id": r.id,
            "sent_unix_ms": (run_unix_ms + o.sent_ms).round(),
            "ttft_ms": o.ttft_ms,
            "e2e_ms": o.e2e_ms,
            "output_tokens": o.output_tokens,
            "error": o.error,
        });
        if let Some(m) = line.as_object_mut() {
            m.insert("input_tokens".into(), json!(r.input_tokens));
            if let Some(pod) = &o.served_by {
                m.insert("pod".into(), json!(pod));
            }
            if let Some(branch) = &o.branch {
                m.insert("branch".into(), json!(branch));
            }
            if let Some(q) = o.queue_ms {
                m.insert("queue_ms".into(), json!(q));
            }
        }
        if let (Some(Some(c)), Some(m)) = (tags.get(i), line.as_object_mut()) {
            m.insert("priority".into(), json!(c.priority));
            m.insert("tenant".into(), json!(c.tenant));
        }
        out.push_str(&line.to_string());
        out.push('\n');
    }
    out
}

fn write_requests_jsonl(
    path: &std::path::Path,
    requests: &[Planned],
    tags: &[Option<SimClass>],
    outcomes: &[Outcome],
    run_unix_ms: f64,
) -> Result<(), LoadgenError> {
    std::fs::write(path, requests_jsonl(requests, tags, outcomes, run_unix_ms)).map_err(|source| {
        LoadgenError::Write {
            path: path.display().to_string(),
            source,
        }
    })
}

async fn first_model(client: &reqwest::Client, target: &str) -> Result<String, LoadgenError> {
    let no_model = |reason: String| LoadgenError::NoModel {
        url: target.to_owned(),
        reason,
    };
    let resp = client
        .get(format!("{target}/v1/models"))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .map_err(|e| no_model(e.to_string()))?;
    let v: Value = resp.json().await.map_err(|e| no_model(e.to_string()))?;
    v.get("data")
        .and_then(Value::as_array)
        .and_then(|d| d.first())
        .and_then(|m| m.get("id"))
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| no_model("no data[0].id".into()))
}

struct SendContext {
    client: reqwest::Client,
    url: String,
    model: String,
    stream: bool,
    token_prompts: bool,
    timeout: Duration,
    /// `--session-header`: the header each request's session goes in.
    session_header: Option<reqwest::header::HeaderName>,
}

/// Sends every request at its time; returns outcomes (by request index), dispatch lags, the
/// makespan and the prompt tokens sent.
async fn replay(
    ctx: &Arc<SendContext>,
    requests: &[Planned],
    tags: &[Option<SimClass>],
    max_concurrency: usize,
    bar: &indicatif::ProgressBar,
) -> (Vec<Outcome>, Vec<f64>, f64, u64) {
    let slots = Arc::new(tokio::sync::Semaphore::new(max_concurrency));
    let mut tasks = tokio::task::JoinSet::new();
    let mut lags = Vec::with_capacity(requests.len());
    let mut input_tokens = 0u64;
    let start = tokio::time::Instant::now();
    for (i, r) in requests.iter().enumerate() {
        let due = start + Duration::from_secs_f64(r.arrival_ms.max(0.0) / 1e3);
        tokio::time::sleep_until(due).await;
        let Ok(permit) = slots.clone().acquire_owned().await else {
            break;
        };
        lags.push(due.elapsed().as_secs_f64() * 1e3);
        input_tokens += u64::from(r.input_tokens);
        let (ctx, r, bar) = (ctx.clone(), r.clone(), bar.clone());
        let class = tags.get(i).copied().flatten();
        let sent_ms = start.elapsed().as_secs_f64() * 1e3;
        tasks.spawn(async move {
            let mut out = send_one(&ctx, &r, class).await;
            out.sent_ms = sent_ms;
            drop(permit);
            bar.inc(1);
            if let Some(e) = &out.error {
                bar.set_message(format!("last error: {e}"));
            }
            (i, out)
        });
    }
    let mut outcomes: Vec<Option<Outcome>> = vec![None; requests.len()];
    while let Some(res) = tasks.join_next().await {
        if let Ok((i, out)) = res
            && let Some(slot) = outcomes.get_mut(i)
        {
            *slot = Some(out);
        }
    }
    let makespan_s = start.elapsed().as_secs_f64();
    let outcomes = outcomes
        .into_iter()
        .map(|o| {
            o.unwrap_or(Outcome {
                sent_ms: 0.0,
                ttft_ms: None,
                e2e_ms: 0.0,
                output_tokens: 0,
                error: Some("panicked".into()),
                served_by: None,
                branch: None,
                queue_ms: None,
            })
        })
        .collect();
    (outcomes, lags, makespan_s, input_tokens)
}

fn error_kind(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        "timeout".into()
    } else if e.is_connect() {
        "connect".into()
    } else if let Some(s) = e.status() {
        format!("http_{}", s.as_u16())
    } else {
        "transport".into()
    }
}

/// The JSON body of one request (`prompt`: text, or token ids).
pub fn request_body(model: &str, prompt: Value, max_tokens: u32, stream: bool) -> Value {
    let mut body = json!({
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": true,
        "temperature": 0.0,
        "stream": stream,
    });
    if stream && let Some(o) = body.as_object_mut() {
        o.insert("stream_options".into(), json!({"include_usage": true}));
    }
    body
}

async fn send_one(ctx: &SendContext, r: &Planned, class: Option<SimClass>) -> Outcome {
    let text = r.prompt();
    let prompt = if ctx.token_prompts {
        json!(prompt::token_ids(&text))
    } else {
        Value::String(text)
    };
    let body = request_body(&ctx.model, prompt, r.output_tokens, ctx.stream);
    let start = Instant::now();
    let fail = |kind: String, start: Instant| Outcome {
        sent_ms: 0.0,
        ttft_ms: None,
        e2e_ms: start.elapsed().as_secs_f64() * 1e3,
        output_tokens: 0,
        error: Some(kind),
        served_by: None,
        branch: None,
        queue_ms: None,
    };
    let mut req = ctx.client.post(&ctx.url).timeout(ctx.timeout).json(&body);
    if let Some(c) = class {
        if c.priority != 0 {
            req = req.header(classes::PRIORITY_HEADER, c.priority.to_string());
        }
        req = req.header(classes::TENANT_HEADER, classes::tenant_name(c.tenant));
    }
    if let (Some(name), Some(session)) = (&ctx.session_header, r.session) {
        req = req.header(name.clone(), format!("session-{session:016x}"));
    }
    let resp = match req.send().await {
        Ok(r) => r,
        Err(e) => return fail(error_kind(&e), start),
    };
    drop(body);
    let status = resp.status();
    if !status.is_success() {
        return fail(format!("http_{}", status.as_u16()), start);
    }
    let header = |name: &str| resp.headers().get(name).and_then(|v| v.to_str().ok());
    let served_by = header("x-kvgate-pod").map(str::to_string);
    let branch = header("x-kvgate-branch").map(str::to_string);
    let queue_ms = header("x-kvgate-queue-ms").and_then(|v| v.parse::<f64>().ok());
    let result = if ctx.stream {
        read_stream(resp, start).await
    } else {
        read_whole(resp).await
    };
    match result {
        Ok((ttft_ms, tokens)) => Outcome {
            sent_ms: 0.0,
            ttft_ms,
            e2e_ms: start.elapsed().as_secs_f64() * 1e3,
            output_tokens: tokens,
            error: None,
            served_by,
            branch,
            queue_ms,
        },
        Err(kind) => fail(kind, start),
    }
}

fn usage_tokens(v: &Value) -> Option<u64> {
    v.get("usage")?.get("completion_tokens")?.as_u64()
}

fn chunk_text(v: &Value) -> Option<&str> {
    let c = v.get("choices")?.as_array()?.first()?;
    c.get("text")
        .and_then(Value::as_str)
        .or_else(|| c.get("delta")?.get("content")?.as_str())
}

/// Reads an SSE completion stream: (TTFT, completion tokens).
async fn read_stream(
    mut resp: reqwest::Response,
    start: Instant,
) -> Result<(Option<f64>, u64), String> {
    let mut buf: Vec<u8> = Vec::new();
    let mut ttft_ms = None;
    let mut chunks = 0u64;
    let mut usage = None;
    loop {
        let chunk = match resp.chunk().await {
            Ok(Some(c)) => c,
            Ok(None) => break,
            Err(e) => return Err(error_kind(&e)),
        };
        buf.extend_from_slice(&chunk);
        let mut consumed = 0;
        while let Some(nl) = memchr::memchr(b'\n', &buf[consumed..]) {
            let line = &buf[consumed..consumed + nl];
            consumed += nl + 1;
            let Some(data) = line.strip_prefix(b"data:") else {
                continue;
            };
            let data = data.trim_ascii();
            if data == b"[DONE]" {
                continue;
            }
            let Ok(v) = serde_json::from_slice::<Value>(data) else {
                return Err("bad_response".into());
            };
            if v.get("error").is_some() {
                return Err("stream".into());
            }
            if let Some(t) = usage_tokens(&v) {
                usage = Some(t);
            }
            if chunk_text(&v).is_some_and(|t| !t.is_empty()) {
                chunks += 1;
                if ttft_ms.is_none() {
                    ttft_ms = Some(start.elapsed().as_secs_f64() * 1e3);
                }
            }
        }
        buf.drain(..consumed);
        if buf.len() > MAX_SSE_LINE_BYTES {
            return Err("bad_response".into());
        }
    }
    Ok((ttft_ms, usage.unwrap_or(chunks)))
}

/// Reads a whole JSON completion: (no TTFT, completion tokens).
async fn read_whole(mut resp: reqwest::Response) -> Result<(Option<f64>, u64), String> {
    let mut body = Vec::new();
    loop {
        match resp.chunk().await {
            Ok(Some(c)) => {
                if body.len() + c.len() > MAX_BODY_BYTES {
                    return Err("bad_response".into());
                }
                body.extend_from_slice(&c);
            }
            Ok(None) => break,
            Err(e) => return Err(error_kind(&e)),
        }
    }
    let v: Value = serde_json::from_slice(&body).map_err(|_| "bad_response".to_string())?;
    Ok((None, usage_tokens(&v).unwrap_or(0)))
}

struct Meta {
    target: String,
    model: String,
    stream: bool,
    max_concurrency: usize,
    workload: Workload,
}

fn summarize(
    outcomes: &[Outcome],
    mut lags: Vec<f64>,
    makespan_s: f64,
    input_tokens_sent: u64,
    prefix_hit_rate: Option<f64>,
    meta: Meta,
) -> LoadgenReport {
    let mut ttft = Vec::new();
    let mut tpot = Vec::new();
    let mut e2e = Vec::new();
    let mut errors = BTreeMap::new();
    let mut output_tokens = 0u64;
    for o in outcomes {
        if let Some(kind) = &o.error {
            *errors.entry(kind.clone()).or_insert(0) += 1;
            continue;
        }
        output_tokens += o.output_tokens;
        e2e.push(o.e2e_ms);
        if let Some(t) = o.ttft_ms {
            ttft.push(t);
            if o.output_tokens >= 2 {
                tpot.push((o.e2e_ms - t) / (o.output_tokens - 1) as f64);
            }
        }
    }
    let completed = e2e.len() as u64;
    let per_s = |n: f64| {
        if makespan_s > 0.0 {
            n / makespan_s
        } else {
            0.0
        }
    };
    LoadgenReport {
        requests: outcomes.len() as u64,
        completed,
        ttft_ms: Percentiles::of(&mut ttft),
        tpot_ms: Percentiles::of(&mut tpot),
        e2e_ms: Percentiles::of(&mut e2e),
        prefix_hit_rate,
        output_tok_per_s: per_s(output_tokens as f64),
        target: meta.target,
        model: meta.model,
        stream: meta.stream,
        max_concurrency: meta.max_concurrency,
        workload: meta.workload,
        errors,
        requests_per_s: per_s(completed as f64),
        makespan_s,
        input_tokens_sent,
        output_tokens,
        dispatch_lag_ms: Percentiles::of(&mut lags),
        classes: None,
    }
}

/// Prints the summary table of a run.
pub fn print_summary(r: &LoadgenReport) {
    println!(
        "loadgen → {} ({}), {} of {} requests completed in {:.1} s{}",
        r.target,
        r.workload
            .source
            .as_deref()
            .unwrap_or(r.workload.params.kind()),
        r.completed,
        r.requests,
        r.makespan_s,
        if r.stream {
            ""
        } else {
            " (not streamed: no TTFT/TPOT)"
        }
    );
    println!(
        "{:<8} {:>9} {:>9} {:>9} {:>9}",
        "ms", "mean", "p50", "p90", "p99"
    );
    for (name, p) in [("ttft", r.ttft_ms), ("tpot", r.tpot_ms), ("e2e", r.e2e_ms)] {
        println!(
            "{:<8} {:>9.1} {:>9.1} {:>9.1} {:>9.1}",
            name, p.mean, p.p50, p.p90, p.p99
        );
    }
    println!(
        "throughput {:.1} output tok/s, {:.2} req/s; dispatch lag p99 {:.1} ms",
        r.output_tok_per_s, r.requests_per_s, r.dispatch_lag_ms.p99
    );
    match r.prefix_hit_rate {
        Some(h) => println!("pods' prefix-cache hit rate {:.1}%", h * 100.0),
        None => println!("pods' prefix-cache hit rate: unknown (no --pod-metrics answered)"),
    }
    if r.errors.is_empty() {
        println!("errors: none");
    } else {
        let list: Vec<String> = r.errors.iter().map(|(k, n)| format!("{k} {n}")).collect();
        println!("errors: {}", list.join(", "));
    }
    if let Some(c) = &r.classes {
        println!(
            "{:<14} {:>7} {:>7} {:>9} {:>9} {:>9}  errors",
            "class", "asked", "served", "ttft p50", "ttft p99", "mean"
        );
        for (name, g) in [
            ("high", &c.high),
            ("normal", &c.normal),
            ("quiet tenants", &c.quiet_tenants),
            ("noisy tenant", &c.noisy_tenant),
        ] {
            let errs: Vec<String> = g.errors.iter().map(|(k, n)| format!("{k} {n}")).collect();
            println!(
                "{:<14} {:>7} {:>7} {:>9.1} {:>9.1} {:>9.1}  {}",
                name,
                g.requests,
                g.served,
                g.ttft_ms.p50,
                g.ttft_ms.p99,
                g.ttft_ms.mean,
                errs.join(", ")
            );
        }
    }
}
