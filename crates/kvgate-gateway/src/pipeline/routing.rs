//! What the HTTP proxy and the ext_proc picker share between a request body and a pod: the
//! request prepared (parsed, objectives read, prompt cut into blocks, every limit checked, a
//! capture ticket taken) and one routing decision through the core session.
//!
//! Both data paths call [`prepare`] and [`decide_for`]; neither decides, charges or checks a
//! limit on its own, so the two enforce the same rules.

use crate::config::{GatewayConfig, IndexKind};
use crate::decisions::{DecisionLog, DecisionRecord, PodLoad};
use crate::errors::ApiError;
use crate::lifecycle::TicketGuard;
use crate::metrics::Metrics;
use crate::pods::Pod;
use crate::state::Shared;
use crate::token_cache::{EncodeStats, TokenCache};
use crate::tokenizer::GatewayTokenizer;
use http::HeaderMap;
use kvgate_core::json::Json;
use kvgate_core::policy::RequestSlo;
use kvgate_core::request::{Endpoint, ParsedRequest, Prompt, RequestError, parse_request_json};
use kvgate_core::tokenizer::PromptTokenizer;
use kvgate_core::{
    AdapterId, BlockHash, BlockHasher, PodId, Route, RouteError, RouteRequest, SizedBlocks,
};
use std::sync::Arc;

/// Prompts longer than this (bytes) are tokenized on the blocking pool, not a runtime worker,
/// holding one of [`large_tokenization_permits`].
const INLINE_TOKENIZE_BYTES: usize = 4096;
/// Longest part of a client-controlled error reason written to the log.
const MAX_LOGGED_REASON_CHARS: usize = 200;
/// Most block sizes a prompt is hashed at in token mode (the main one included); pods of
/// further sizes are scored against the main chain, i.e. cold.
pub const MAX_BLOCK_SIZES: usize = 4;

/// A request ready to route.
pub(crate) struct Prepared {
    /// The body's own fields the transports read after routing (the body itself is forwarded
    /// as received, and parsed again only where it must change: [`crate::upstream`]).
    pub fields: BodyFields,
    pub parsed: ParsedRequest,
    pub slo: RequestSlo,
    pub blocks: Vec<BlockHash>,
    pub input_tokens: u32,
    /// Tokens per block in `blocks` (what the session credits per matched block).
    pub block_size_tokens: u32,
    /// Token mode, a fleet of mixed block sizes: the prompt at each other size in use.
    pub other_sizes: Vec<SizedBlocks>,
    /// `--capture`: the request's record, written when it is served.
    pub capture: Option<crate::capture::Ticket>,
    /// The request's `model` as a LoRA adapter id (a pod serving it as its base model counts
    /// it as no adapter; see `kvgate_core::adapters`).
    pub adapter: AdapterId,
}

/// A body's top-level fields that flow control and forwarding read, beyond [`ParsedRequest`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BodyFields {
    /// vLLM's `priority` when it is an integer ([`crate::flow::class_of`]).
    pub priority: Option<i64>,
    /// The body has a `priority` member, whatever its value ([`crate::flow::forward_priority`]).
    pub has_priority: bool,
    pub stream_options: crate::upstream::StreamOptions,
}

impl BodyFields {
    pub fn of(body: &Json<'_>) -> Self {
        let priority = body.get("priority");
        BodyFields {
            priority: priority.and_then(Json::as_i64),
            has_priority: priority.is_some(),
            stream_options: crate::upstream::StreamOptions::of(body),
        }
    }
}

impl Prepared {
    pub fn route_request(&self) -> RouteRequest<'_> {
        RouteRequest {
            blocks: &self.blocks,
            input_tokens: self.input_tokens,
            block_size_tokens: self.block_size_tokens,
            other_sizes: &self.other_sizes,
            slo: self.slo,
            adapter: Some(self.adapter),
        }
    }
}

/// Body → [`Prepared`], or the error to answer (400 bad JSON / request / objectives, 400
/// `context_length_exceeded` over `max_prompt_tokens`). No pod is touched.
pub(crate) async fn prepare(
    shared: &Shared,
    cfg: &GatewayConfig,
    path: &str,
    body: &[u8],
    headers: &HeaderMap,
) -> Result<Prepared, ApiError> {
    // Read once, its strings left where they lie in `body` (kvgate_core::json).
    let mut fallback = None;
    let value = kvgate_core::json::parse_with(body, &mut fallback)
        .map_err(|e| crate::errors::request_error(RequestError::InvalidJson(e.to_string())))?;
    let mut blocks = Vec::new();
    let parsed = if cfg.index == IndexKind::Engine {
        parse_request_json(path, &value)
    } else {
        // The routed index's blocks, hashed where the prompt lies in the body: a long prompt
        // is neither copied nor rendered (the same blocks as hashing its rendering).
        let hasher = BlockHasher {
            block_size_tokens: cfg.router.block_size_tokens,
            chars_per_token: cfg.router.chars_per_token,
        };
        hasher.hash_json(path, &value, &mut blocks)
    }
    .map_err(crate::errors::request_error)?;
    let fields = BodyFields::of(&value);
    drop(value);
    let slo = crate::slo::request_slo(headers)?;
    let (blocks, input_tokens, block_size_tokens, other_sizes) =
        request_blocks(shared, cfg, &parsed, body, blocks).await?;
    if input_tokens > cfg.max_prompt_tokens {
        return Err(ApiError::bad_request(
            "context_length_exceeded",
            format!(
                "the prompt has about {input_tokens} tokens, more than the gateway's limit of {}",
                cfg.max_prompt_tokens
            ),
            None,
        ));
    }
    let capture = shared
        .telemetry
        .capture
        .as_ref()
        .map(|c| c.ticket(&blocks, input_tokens, parsed.max_tokens));
    Ok(Prepared {
        adapter: AdapterId::of(&parsed.model),
        fields,
        parsed,
        slo,
        blocks,
        input_tokens,
        block_size_tokens,
        other_sizes,
        capture,
    })
}

/// The request's prefix blocks, input-token count, block size and the blocks at the fleet's
/// other block sizes, as the configured index cuts them (the routed index's `blocks` are
/// already hashed, by [`BlockHasher::hash_json`]); in token mode, 400
/// `context_length_exceeded` for a prompt whose byte length alone shows it is over
/// `max_prompt_tokens` ([`GatewayTokenizer::certainly_over`]), before tokenizing it.
async fn request_blocks(
    shared: &Shared,
    cfg: &GatewayConfig,
    parsed: &ParsedRequest,
    body: &[u8],
    mut blocks: Vec<BlockHash>,
) -> Result<(Vec<BlockHash>, u32, u32, Vec<SizedBlocks>), ApiError> {
    if cfg.index == IndexKind::Engine {
        let tokenizer = shared
            .tokenizer
            .clone()
            .unwrap_or_else(|| GatewayTokenizer::Cl100k(PromptTokenizer::cl100k()));
        // A chat prompt rendered with the model's chat template is token ids already, as the
        // engine computes them; without a template, `parsed` keeps kvgate's own rendering.
        let templated;
        let parsed = match chat_template_tokens(shared, cfg, &tokenizer, parsed, body).await? {
            Some(tokens) => {
                templated = ParsedRequest {
                    endpoint: parsed.endpoint,
                    model: parsed.model.clone(),
                    prompt: Prompt::Tokens(tokens),
                    cache_salt: parsed.cache_salt.clone(),
                    stream: parsed.stream,
                    max_tokens: parsed.max_tokens,
                };
                &templated
            }
            None => parsed,
        };
        let (tokens, block_size, others) =
            token_mode_blocks(shared, cfg, tokenizer, parsed, &mut blocks).await?;
        Ok((blocks, tokens, block_size, others))
    } else {
        Ok((
            blocks,
            parsed.estimated_input_tokens(),
            cfg.router.block_size_tokens,
            Vec::new(),
        ))
    }
}

/// How many large prompts (over [`INLINE_TOKENIZE_BYTES`]) are rendered and tokenized at once:
/// one per CPU (`std::thread::available_parallelism`, 2 if unknown). Tokenizing is CPU-bound, so
/// more at once than there are CPUs finishes none sooner; it only multiplies the memory held
/// (a prompt's text, its copies and the tokenizer's buffers: ~900 MB for a 16 MB prompt), and
/// the blocking pool would run up to 512. The others wait here, holding only their body.
fn large_tokenization_permits() -> &'static tokio::sync::Semaphore {
    static PERMITS: std::sync::OnceLock<tokio::sync::Semaphore> = std::sync::OnceLock::new();
    PERMITS.get_or_init(|| {
        let cpus = std::thread::available_parallelism().map_or(2, std::num::NonZeroUsize::get);
        tokio::sync::Semaphore::new(cpus)
    })
}

/// What a prompt's tokenization gave.
enum Tokenized {
    Tokens(Result<Vec<u32>, String>),
    /// The text, of this many bytes, is over `max_prompt_tokens` by its length alone; it was
    /// not tokenized.
    Over {
        text_bytes: usize,
    },
}

/// Large prompts' rendering and tokenization: waits for a [`large_tokenization_permits`]
/// permit, then builds the work (`make` copies what it needs: copies are made under the permit,
/// not by every waiting request) and runs it on the blocking pool.
async fn tokenize_large<W>(make: impl FnOnce() -> W) -> Tokenized
where
    W: FnOnce() -> Tokenized + Send + 'static,
{
    // The semaphore is never closed.
    let Ok(_permit) = large_tokenization_permits().acquire().await else {
        return Tokenized::Tokens(Err("tokenization permits closed".into()));
    };
    tokio::task::spawn_blocking(make())
        .await
        .unwrap_or_else(|e| Tokenized::Tokens(Err(e.to_string())))
}

/// A chat body rendered with the tokenizer's chat template, then tokenized (counted in
/// `tokenizations`) unless the rendered text is over `max_tokens` by its length alone.
fn render_and_encode(
    tokenizer: &GatewayTokenizer,
    cache: Option<&TokenCache>,
    body: &[u8],
    max_tokens: u32,
    metrics: &TokenizationMetrics,
) -> Tokenized {
    let rendered = match tokenizer.render_chat(body) {
        Some(Ok(r)) => r,
        Some(Err(e)) => return Tokenized::Tokens(Err(e.to_string())),
        None => return Tokenized::Tokens(Err("no chat template".into())),
    };
    if tokenizer.certainly_over(rendered.text.len(), max_tokens) {
        return Tokenized::Over {
            text_bytes: rendered.text.len(),
        };
    }
    metrics.tokenizations.inc();
    let (ids, stats) = tokenizer.encode_reusing(cache, &rendered.text, rendered.add_special_tokens);
    metrics.record(stats);
    Tokenized::Tokens(ids)
}

/// The tokenization counters, cloned into the blocking pool's closures.
#[derive(Clone)]
struct TokenizationMetrics {
    tokenizations: prometheus_client::metrics::counter::Counter,
    reused_bytes: prometheus_client::metrics::counter::Counter,
    tokenized_bytes: prometheus_client::metrics::counter::Counter,
}

impl TokenizationMetrics {
    fn of(metrics: &Metrics) -> Self {
        TokenizationMetrics {
            tokenizations: metrics.tokenizations.clone(),
            reused_bytes: metrics.tokenization_reused_bytes.clone(),
            tokenized_bytes: metrics.tokenization_tokenized_bytes.clone(),
        }
    }

    fn record(&self, stats: EncodeStats) {
        self.reused_bytes.inc_by(stats.reused_bytes as u64);
        self.tokenized_bytes.inc_by(stats.tokenized_bytes as u64);
    }
}

/// 400 `context_length_exceeded` for a text over the limit by its length alone.
fn over_limit_untokenized(text_bytes: usize, tokenizer: &GatewayTokenizer, max: u32) -> ApiError {
    let per_token = tokenizer.max_token_bytes().unwrap_or(0);
    ApiError::bad_request(
        "context_length_exceeded",
        format!(
            "the prompt is {text_bytes} bytes: more than the gateway's limit of {max} tokens \
             (no token of the tokenizer is longer than {per_token} bytes)"
        ),
        None,
    )
}

/// The block sizes a token-mode prompt is hashed at: the main one, then the others (at most
/// [`MAX_BLOCK_SIZES`] in all). The main size is the router's `block_size_tokens` while some pod
/// has not reported its own (or none has), else the smallest reported; the others are the
/// pods' reported sizes, ascending.
pub fn fleet_block_sizes(reported: &[Option<u32>], default_size: u32) -> (u32, Vec<u32>) {
    let mut sizes: Vec<u32> = reported.iter().flatten().copied().collect();
    sizes.sort_unstable();
    sizes.dedup();
    let main = if sizes.is_empty() || reported.iter().any(Option::is_none) {
        default_size
    } else {
        sizes[0]
    };
    sizes.retain(|&s| s != main);
    sizes.truncate(MAX_BLOCK_SIZES - 1);
    (main, sizes)
}

/// Token mode, a chat request and a tokenizer with a chat template: the prompt's token ids as
/// vLLM computes them (the body rendered with the template, then tokenized; long prompts on the
/// blocking pool, bounded by [`large_tokenization_permits`]). `None` for other requests. A
/// rendered prompt over `max_prompt_tokens` by its length alone is a 400, not tokenized. A
/// request the template cannot render (a `raise_exception`, a multimodal part, …) gives `None`
/// too, so it is routed on kvgate's own rendering and scores cold; it is counted in
/// `tokenizer_errors` and logged (rate limited).
async fn chat_template_tokens(
    shared: &Shared,
    cfg: &GatewayConfig,
    tokenizer: &GatewayTokenizer,
    parsed: &ParsedRequest,
    body: &[u8],
) -> Result<Option<Vec<u32>>, ApiError> {
    if parsed.endpoint != Endpoint::ChatCompletions || tokenizer.chat_template().is_none() {
        return Ok(None);
    }
    let max = cfg.max_prompt_tokens;
    let metrics = TokenizationMetrics::of(&shared.telemetry.metrics);
    let cache = shared.token_cache.as_ref();
    let outcome = if body.len() <= INLINE_TOKENIZE_BYTES {
        render_and_encode(tokenizer, cache.map(|c| &**c), body, max, &metrics)
    } else {
        tokenize_large(|| {
            let (t, body, cache) = (tokenizer.clone(), body.to_vec(), cache.cloned());
            move || render_and_encode(&t, cache.as_deref(), &body, max, &metrics)
        })
        .await
    };
    match outcome {
        Tokenized::Over { text_bytes } => Err(over_limit_untokenized(text_bytes, tokenizer, max)),
        Tokenized::Tokens(Ok(tokens)) => Ok(Some(tokens)),
        // The request is routed on kvgate's own rendering instead: its blocks never match an
        // engine's (so it scores cold), but its token count is the prompt's, not 0, so the
        // prompt-length limit, the pod's prefill charge and the predictor's sample stay right.
        Tokenized::Tokens(Err(why)) => {
            shared.telemetry.metrics.tokenizer_errors.inc();
            if shared.telemetry.log_limit.allow("chat_template_failed") {
                let why: String = why.chars().take(MAX_LOGGED_REASON_CHARS).collect();
                tracing::warn!(why = %why, "chat template failed on a chat prompt; it scores cold");
            }
            Ok(None)
        }
    }
}

/// Token mode (`--index engine`): the prompt's blocks as the pods cut them, i.e. the rendered
/// prompt tokenized with the pods' tokenizer (`--tokenizer`, else the built-in cl100k, as the
/// mock pod; an encoding error gives no tokens, counted and logged) in blocks of each
/// block size the pods report in `vllm:cache_config_info` ([`fleet_block_sizes`]): one
/// tokenization, one chain per size. A text prompt over `max_prompt_tokens` by its length
/// alone is a 400, not tokenized; long prompts are tokenized on the blocking pool, bounded by
/// [`large_tokenization_permits`]. Returns the prompt's token count, the main block size (its
/// chain in `blocks`) and the chains at the other sizes.
async fn token_mode_blocks(
    shared: &Shared,
    cfg: &GatewayConfig,
    tokenizer: GatewayTokenizer,
    parsed: &ParsedRequest,
    blocks: &mut Vec<BlockHash>,
) -> Result<(u32, u32, Vec<SizedBlocks>), ApiError> {
    let encoded;
    let tokens: &[u32] = match &parsed.prompt {
        Prompt::Tokens(t) => t,
        // Token mode parses with the rendering ([`prepare`]): never hashed in place.
        Prompt::Hashed { .. } => &[],
        Prompt::Text(text) => {
            let max = cfg.max_prompt_tokens;
            if tokenizer.certainly_over(text.len(), max) {
                return Err(over_limit_untokenized(text.len(), &tokenizer, max));
            }
            shared.telemetry.metrics.tokenizations.inc();
            let metrics = TokenizationMetrics::of(&shared.telemetry.metrics);
            let cache = shared.token_cache.as_ref();
            let result = if text.len() <= INLINE_TOKENIZE_BYTES {
                let (ids, stats) = tokenizer.encode_reusing(cache.map(|c| &**c), text, true);
                metrics.record(stats);
                ids
            } else {
                let large = tokenize_large(|| {
                    let (t, text, cache) = (tokenizer.clone(), text.clone(), cache.cloned());
                    move || {
                        let (ids, stats) = t.encode_reusing(cache.as_deref(), &text, true);
                        metrics.record(stats);
                        Tokenized::Tokens(ids)
                    }
                });
                match large.await {
                    Tokenized::Tokens(r) => r,
                    Tokenized::Over { text_bytes } => {
                        return Err(over_limit_untokenized(text_bytes, &tokenizer, max));
                    }
                }
            };
            encoded = result.unwrap_or_else(|why| {
                shared.telemetry.metrics.tokenizer_errors.inc();
                tracing::warn!(why = %why, "tokenizer failed on a prompt; it scores cold");
                Vec::new()
            });
            &encoded
        }
    };
    let reported: Vec<Option<u32>> = shared
        .fleet
        .pods
        .all()
        .iter()
        .map(|p| p.block_size_tokens())
        .collect();
    let (block_size_tokens, other_sizes) =
        fleet_block_sizes(&reported, cfg.router.block_size_tokens);
    let seed = BlockHasher::chain_seed(&parsed.model, parsed.cache_salt.as_deref());
    let hash_at = |block_size_tokens: u32, out: &mut Vec<BlockHash>| {
        let hasher = BlockHasher {
            block_size_tokens,
            chars_per_token: cfg.router.chars_per_token,
        };
        hasher.hash_tokens(seed, tokens, out);
    };
    blocks.clear();
    hash_at(block_size_tokens, blocks);
    let others = other_sizes
        .into_iter()
        .map(|size| {
            let mut sized = SizedBlocks {
                block_size_tokens: size,
                blocks: Vec::new(),
            };
            hash_at(size, &mut sized.blocks);
            sized
        })
        .collect();
    Ok((
        u32::try_from(tokens.len()).unwrap_or(u32::MAX),
        block_size_tokens,
        others,
    ))
}

/// What a decision is recorded with.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DecisionMeta<'a> {
    pub request_id: &'a str,
    pub attempt: u32,
    /// The request's flow-control class and queue time (flow control on).
    pub flow: Option<&'a crate::decisions::FlowNote>,
    /// The driver can hand a request over from a prefill pod to a decode pod (the HTTP proxy
    /// and the ext_proc picker): the session routes it in two stages when the fleet has pods of
    /// a dedicated role ([`kvgate_core::RouterSession::route_pd`]). Else whole requests only.
    pub split: bool,
    /// The request's trace: each decision is a `kvgate.decide` span ([`crate::otel`]).
    pub trace: &'a crate::otel::RequestTrace,
    /// The request's place among flow control's let-go requests (flow control on, before its
    /// first routed decision): a routed decision leaves it under the session's lock, where
    /// the ledger charges the request.
    pub dispatching: Option<&'a crate::flow_gate::Dispatching>,
}

/// A routed request: the chosen pod and the request's ticket on it.
pub(crate) struct Routed {
    pub pod: Arc<Pod>,
    pub guard: TicketGuard,
    pub policy: &'static str,
    pub branch: &'static str,
}

/// A request routed in two stages (P/D disaggregation): a ticket on each pod.
pub(crate) struct SplitRouted {
    pub prefill_pod: Arc<Pod>,
    pub prefill_guard: TicketGuard,
    pub decode_pod: Arc<Pod>,
    pub decode_guard: TicketGuard,
    pub policy: &'static str,
    /// The prefill pick's branch.
    pub branch: &'static str,
}

pub(crate) enum Pick {
    /// Boxed: a routed request's guard is large and the other outcomes are empty.
    Routed(Box<Routed>),
    /// Only with [`DecisionMeta::split`].
    Split(Box<SplitRouted>),
    /// No healthy pod (after exclusions).
    NoHealthyPod,
    /// The core found no pod to choose.
    NoDecision,
}

/// One routing decision: the pods as scraped now, `excluded` counted as unhealthy, routed by
/// the core session under its mutex (decision, route recorded in the index, features taken,
/// pod charged), and the decision recorded in `/debug/decisions` and the prediction metrics.
pub(crate) fn decide_for(
    shared: &Arc<Shared>,
    request: &RouteRequest<'_>,
    excluded: &[PodId],
    meta: DecisionMeta<'_>,
) -> Pick {
    let span = meta.trace.decide(meta.attempt);
    let pods = shared.fleet.pods.all();
    let mut snaps: Vec<_> = pods.iter().map(|p| p.snapshot()).collect();
    crate::breaker::panic_route(&shared.telemetry, &pods, &mut snaps, excluded);
    let (routed, policy) = {
        let now_ms = crate::kv_events::clock_ms();
        let mut session = shared.session.lock();
        session.advance_clock(now_ms);
        let routed = if meta.split {
            session.route_pd(request, &mut snaps, excluded)
        } else {
            session
                .route(request, &mut snaps, excluded)
                .map(Route::Whole)
        };
        if let (Ok(_), Some(d)) = (&routed, meta.dispatching) {
            d.leave();
        }
        (routed, session.router().policy_kind().name())
    };
    let routed = match routed {
        Ok(Route::Whole(r)) => r,
        Ok(Route::Disaggregated(pd)) => {
            span.decided(&pd.decision, &pd.decision.pod, policy);
            return split_pick(shared, request, &pods, &snaps, *pd, meta, policy);
        }
        Err(RouteError::NoHealthyPod) => {
            span.undecided("no_healthy_pod");
            return Pick::NoHealthyPod;
        }
        Err(RouteError::NoDecision) => {
            span.undecided("no_decision");
            return Pick::NoDecision;
        }
    };
    if meta.split && snaps.iter().any(|s| s.role != kvgate_core::PodRole::Both) {
        shared.telemetry.metrics.pd.route("whole");
    }
    let decision = routed.decision;
    shared
        .admission
        .flow
        .observe_decision(&decision, pods.len());
    let charged_prefill_tokens = routed.ticket.prefill_tokens();
    // `snaps` came from this table, so the chosen id is in it.
    let Some(pod) = pods.get(decision.pod_id).cloned() else {
        shared.session.finish(routed.ticket, None, None, None);
        return Pick::NoDecision;
    };
    span.decided(&decision, &pod.url, policy);
    let series = shared.telemetry.metrics.pod_series(&pod);
    let prompt_tokens = u64::from(request.input_tokens);
    series.prompt_tokens.inc_by(prompt_tokens);
    series
        .cached_prompt_tokens
        .inc_by(prompt_tokens.saturating_sub(charged_prefill_tokens));
    let blocks = recorded_blocks(request, &pods, &snaps, pod.id);
    let mut guard = TicketGuard::new(shared.clone(), pod.clone(), routed.ticket, blocks);
    let branch = decision.branch.as_str();
    shared.telemetry.live.count_branch(branch);
    if let Some(e) = decision.pods.iter().find(|p| p.id == decision.pod) {
        shared
            .telemetry
            .metrics
            .predicted_ttft_ms
            .observe(e.predicted_ttft_ms);
        shared
            .telemetry
            .metrics
            .predicted_tpot_ms
            .observe(e.predicted_tpot_ms);
    }
    if let Some(record) = record_decision(
        &shared.telemetry.decisions,
        request,
        &snaps,
        meta,
        policy,
        charged_prefill_tokens,
        decision,
    ) {
        guard.keep_record(record);
    }
    Pick::Routed(Box::new(Routed {
        pod,
        guard,
        policy,
        branch,
    }))
}

/// The blocks the session recorded for pod `id` (its own block size's chain): `snaps` were
/// taken from `pods` in its order, so the pod's place is its snapshot's.
fn recorded_blocks<'a>(
    request: &RouteRequest<'a>,
    pods: &crate::pods::Fleet,
    snaps: &[kvgate_core::PodSnapshot],
    id: PodId,
) -> &'a [BlockHash] {
    pods.place(id)
        .and_then(|i| snaps.get(i))
        .map_or(request.blocks, |s| request.cut().blocks_for(s).0)
}

/// Records the decision in `/debug/decisions`; with `--decisions-log`, returns the record for
/// the request's guard to complete when the request ends.
fn record_decision(
    decisions: &DecisionLog,
    request: &RouteRequest<'_>,
    snaps: &[kvgate_core::PodSnapshot],
    meta: DecisionMeta<'_>,
    policy: &'static str,
    charged_prefill_tokens: u64,
    decision: kvgate_core::Decision,
) -> Option<DecisionRecord> {
    let record = DecisionRecord {
        request_id: meta.request_id.to_string(),
        timestamp_ms: crate::decisions::unix_ms(),
        policy,
        attempt: meta.attempt,
        slo_ttft_ms: request.slo.ttft_ms,
        slo_tpot_ms: request.slo.tpot_ms,
        charged_prefill_tokens,
        flow: meta.flow.cloned(),
        load: snaps.iter().map(PodLoad::of).collect(),
        observed: None,
        ended_ms: None,
        decision,
    };
    let kept = decisions.logs_outcomes().then(|| record.clone());
    decisions.push(record);
    kept
}

/// A two-stage route: a guard per stage, the decision recorded (the prefill pick, with the
/// decode pick in its `decode`).
fn split_pick(
    shared: &Arc<Shared>,
    request: &RouteRequest<'_>,
    pods: &crate::pods::Fleet,
    snaps: &[kvgate_core::PodSnapshot],
    pd: kvgate_core::PdRouted,
    meta: DecisionMeta<'_>,
    policy: &'static str,
) -> Pick {
    let kvgate_core::PdRouted {
        decision,
        prefill,
        decode,
    } = pd;
    shared
        .admission
        .flow
        .observe_decision(&decision, pods.len());
    let find = |id: PodId| pods.get(id).cloned();
    let (Some(prefill_pod), Some(decode_pod)) = (find(prefill.pod()), find(decode.pod())) else {
        let mut session = shared.session.lock();
        session.finish(prefill, None);
        session.finish(decode, None);
        return Pick::NoDecision;
    };
    let blocks_of = |id: PodId| recorded_blocks(request, pods, snaps, id);
    let charged_prefill_tokens = prefill.prefill_tokens();
    shared
        .telemetry
        .metrics
        .predicted_ttft_ms
        .observe(prefill.predicted_ttft_ms());
    shared
        .telemetry
        .metrics
        .predicted_tpot_ms
        .observe(decode.predicted_tpot_ms());
    let prefill_guard = TicketGuard::new(
        shared.clone(),
        prefill_pod.clone(),
        prefill,
        blocks_of(prefill_pod.id),
    );
    let mut decode_guard = TicketGuard::new(
        shared.clone(),
        decode_pod.clone(),
        decode,
        blocks_of(decode_pod.id),
    );
    let branch = decision.branch.as_str();
    shared.telemetry.live.count_branch(branch);
    shared.telemetry.metrics.pd.route("split");
    // The client's first token comes from the decode pod: its guard completes the record.
    if let Some(record) = record_decision(
        &shared.telemetry.decisions,
        request,
        snaps,
        meta,
        policy,
        charged_prefill_tokens,
        decision,
    ) {
        decode_guard.keep_record(record);
    }
    Pick::Split(Box::new(SplitRouted {
        prefill_pod,
        prefill_guard,
        decode_pod,
        decode_guard,
        policy,
        branch,
    }))
}

/// The least-loaded healthy pod outside `excluded`, for requests the router does not decide;
/// charged as one request.
pub(crate) fn least_loaded(
    shared: &Arc<Shared>,
    excluded: &[PodId],
) -> Option<(Arc<Pod>, TicketGuard)> {
    let pods = shared.fleet.pods.all();
    let mut snaps: Vec<_> = pods.iter().map(|p| p.snapshot()).collect();
    crate::breaker::panic_route(&shared.telemetry, &pods, &mut snaps, excluded);
    let id = shared.session.least_loaded(&mut snaps, excluded)?;
    let pod = pods.get(id).cloned()?;
    let guard = TicketGuard::unrouted(shared.clone(), pod.clone());
    Some((pod, guard))
}

#[cfg(test)]
mod tests {
    use super::fleet_block_sizes;

    #[test]
    fn a_uniform_fleet_hashes_once_at_its_own_block_size() {
        assert_eq!(
            fleet_block_sizes(&[Some(128), Some(128)], 16),
            (128, vec![])
        );
    }

    #[test]
    fn a_mixed_fleet_hashes_at_every_reported_size_smallest_first() {
        assert_eq!(
            fleet_block_sizes(&[Some(128), Some(16), Some(64), Some(16)], 16),
            (16, vec![64, 128])
        );
    }

    #[test]
    fn a_pod_that_has_not_reported_keeps_the_router_default_as_main_size() {
        assert_eq!(fleet_block_sizes(&[None, Some(128)], 16), (16, vec![128]));
        assert_eq!(fleet_block_sizes(&[None, None], 32), (32, vec![]));
        assert_eq!(fleet_block_sizes(&[], 16), (16, vec![]));
    }

    #[test]
    fn at_most_max_block_sizes_chains_are_hashed() {
        let reported: Vec<Option<u32>> = (1..=10).map(|i| Some(i * 16)).collect();
        let (main, others) = fleet_block_sizes(&reported, 16);
        assert_eq!(main, 16);
        assert_eq!(others, vec![32, 48, 64]);
        assert_eq!(1 + others.len(), super::MAX_BLOCK_SIZES);
    }
}
