//! The engine model of one vLLM-like pod, stepping in discrete time (DESIGN.md §6).
//!
//! Sans-IO and deterministic: the caller (the simulator's event loop, or the mock pod in wall
//! time) adds requests with [`Engine::add_request`], asks when the next step starts with
//! [`Engine::next_step_time`] and runs it with [`Engine::step`], which returns the step's
//! duration and what happened in it. No clocks, no threads, no randomness.
//!
//! ## Scheduler (vLLM v1 `Scheduler.schedule`, chunked prefill on, FCFS)
//!
//! Each step has a token budget of `max_num_batched_tokens` (8192 by default):
//! 1. Running requests, oldest first: each takes `min(remaining tokens, budget)` — one token for
//!    a decode, a chunk for a prefill in progress. If its new KV blocks cannot be allocated, the
//!    newest running request is preempted (its blocks freed, its progress dropped, and it goes to
//!    the front of the waiting queue: recompute mode), repeatedly, until the allocation fits or the
//!    request itself was the one preempted.
//! 2. If nothing was preempted in this step, waiting requests in FCFS order while budget remains
//!    and fewer than `max_num_seqs` run: look up the prompt's cached prefix, take the rest of the
//!    prompt up to the remaining budget (chunked prefill), and stop at the first request whose
//!    blocks do not fit (head-of-line, as vLLM).
//!
//! A request's full blocks are registered in the prefix cache when it is scheduled, for the
//! tokens this step will compute (vLLM v1's `allocate_slots` caches them then): a request
//! scheduled after it, later in the same step or in a later one, finds them cached. So siblings
//! waiting together compute their shared prefix once, as on vLLM.
//!
//! A request samples a token in the step that completes its prefill (its first token, or after a
//! preemption its next one) and then one token per step; it finishes after `output_tokens`.
//!
//! ## Prefix caching (vLLM v1 `KVCacheManager.get_computed_blocks`)
//!
//! A hit is the longest run of leading prompt blocks whose hash is cached, limited to
//! `(num_tokens − 1) / B` blocks so that at least one token is computed for the logits; hits are
//! whole blocks, so a fully cached prompt of `B·m` tokens recomputes its whole last block (`B`
//! tokens) and one of `B·m + r` tokens recomputes `r`. `B` is the block size: 16 tokens
//! ([`Engine::new`], vLLM's CUDA default) or any other ([`Engine::with_block_size`]; vLLM CPU
//! uses 128). Prefix-cache counters follow vLLM:
//! queries += the request's tokens, hits += the tokens found, once per admission (vLLM counts
//! again when a blocked request is retried; we do not). See `kv_cache` for the block pool.
//!
//! ## Step time
//!
//! `Profile::step_ms(prefill tokens, decode seqs, context tokens read, prefill attention pairs)`,
//! where prefill tokens are the uncached tokens computed for requests that have not yet sampled
//! since admission, decode seqs the requests decoding, context tokens read the sum over
//! scheduled requests of the tokens in their context after the step (`computed + new`), and
//! prefill attention pairs, over the prefilling requests, `new × computed + new·(new + 1)/2`
//! (each new token attends to the context before it: the quadratic part of a long prefill).
//!
//! ## Cost
//!
//! A step costs O(running requests + blocks allocated, registered or freed in it), plus, per
//! admission attempt, one hash lookup per cached leading block of the head waiting request. No
//! allocation in a step once the buffers have grown (block tables are recycled).
//!
//! ## Bounds
//!
//! Memory is bounded by the KV pool (one map entry per block) and by the requests added; the
//! waiting queue is not limited here — admission control is the driver's job.

mod kv_cache;

pub use kv_cache::KvEvent;

use std::collections::VecDeque;
use std::sync::Arc;

use kv_cache::{BlockId, KvCache};
use kvgate_core::{AdapterId, AdapterSet, BlockHash};

use crate::profiles::Profile;
use crate::{SIM_BLOCK_SIZE_TOKENS, SimRequest};

/// A request as the engine needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineRequest {
    /// Caller's id; reported back in [`Emission`]s and preemptions.
    pub id: u64,
    /// Chained hashes of the prompt's full blocks (at most `input_tokens / block size` are used).
    pub blocks: Arc<[BlockHash]>,
    /// Prompt length in tokens.
    pub input_tokens: u32,
    /// Tokens to generate.
    pub output_tokens: u32,
    /// The LoRA adapter the request runs with (`None`: the base model); see [`LoraConfig`].
    pub adapter: Option<AdapterId>,
}

impl From<&SimRequest> for EngineRequest {
    fn from(r: &SimRequest) -> Self {
        EngineRequest {
            id: r.id,
            blocks: r.blocks.as_slice().into(),
            input_tokens: r.input_tokens,
            output_tokens: r.output_tokens,
            adapter: r.adapter,
        }
    }
}

impl EngineRequest {
    /// `r` for an engine whose blocks are `block_size_tokens` long, a multiple of the
    /// simulator's 16 (the profile's [`Profile::block_size_tokens`]): the hashes are chained, so
    /// the hash of a 16-token block names its whole prefix, and a block of `16·s` tokens is
    /// named by the hash of its last 16-token block (every `s`-th one).
    pub fn for_block_size(r: &SimRequest, block_size_tokens: u32) -> Self {
        let stride = (block_size_tokens / SIM_BLOCK_SIZE_TOKENS).max(1) as usize;
        if stride == 1 {
            return Self::from(r);
        }
        EngineRequest {
            blocks: r
                .blocks
                .iter()
                .skip(stride - 1)
                .step_by(stride)
                .copied()
                .collect(),
            ..Self::from(r)
        }
    }
}

/// LoRA serving (vLLM `--enable-lora --max-loras N`): at most `max_loras` adapters in the
/// running batch; a waiting request whose adapter would be one too many is skipped (deferred,
/// `vllm:num_requests_waiting_by_reason{reason="deferred"}`) while the requests behind it are
/// considered, as vLLM v1's scheduler does. An adapter not among the `max_loras` loaded ones
/// (least recently used evicted, never one with running requests) is loaded when its first
/// request is admitted: the step that admits it lasts `load_ms` longer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoraConfig {
    pub max_loras: u32,
    pub load_ms: f64,
}

#[derive(Debug, Clone)]
struct LoraState {
    config: LoraConfig,
    /// Loaded adapters with the step they were last scheduled in (LRU).
    loaded: Vec<(AdapterId, u64)>,
    /// Waiting requests skipped for want of a slot in the last step.
    deferred: u32,
}

/// Why a request was refused by [`Engine::add_request`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdmitError {
    #[error("request {0} has an empty prompt")]
    EmptyPrompt(u64),
    #[error("request {0} asks for no output tokens")]
    NoOutput(u64),
    #[error("request {id} needs {tokens} tokens, more than max_model_len {max_model_len}")]
    ExceedsMaxModelLen {
        id: u64,
        tokens: u64,
        max_model_len: u32,
    },
    #[error("request {id} needs {blocks} KV blocks, more than the {kv_blocks} of the pod")]
    ExceedsKvCapacity {
        id: u64,
        blocks: u64,
        kv_blocks: u32,
    },
}

/// One output token produced by a step (each running request produces at most one per step).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Emission {
    pub request_id: u64,
    /// Output tokens produced so far, this one included (1 for the first token).
    pub output_tokens_so_far: u32,
    /// Whether this was the request's last token; its blocks are freed at the end of the step.
    pub finished: bool,
}

impl Emission {
    /// Whether this is the request's first token (its TTFT is the step's end).
    pub fn is_first(&self) -> bool {
        self.output_tokens_so_far == 1
    }
}

/// A request admitted from the waiting queue in a step (again after a preemption).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admission {
    pub request_id: u64,
    /// Prompt (and, after a preemption, output) tokens found in the prefix cache: vLLM's
    /// `num_cached_tokens`, reported as `usage.prompt_tokens_details.cached_tokens`.
    pub cached_tokens: u32,
}

/// What one step did. Owned by the engine and overwritten by the next step.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepOutcome {
    pub start_ms: f64,
    /// `start_ms + duration_ms`; tokens emitted by the step are visible at this time.
    pub end_ms: f64,
    pub duration_ms: f64,
    /// Uncached prompt (or recomputed) tokens computed in the step.
    pub prefill_tokens: u64,
    /// Requests that decoded one token in the step.
    pub decode_seqs: u64,
    /// Sum over scheduled requests of their context length after the step.
    pub context_tokens_read: u64,
    /// Prefill attention pairs: over requests prefilling in the step, Σ new × (tokens already
    /// computed) + new·(new + 1)/2 (causal attention of the new tokens over their context).
    pub prefill_attention_pairs: u64,
    /// Requests scheduled in the step.
    pub scheduled_seqs: u32,
    /// Tokens produced, in running order.
    pub emissions: Vec<Emission>,
    /// Ids of requests preempted in the step (back in the waiting queue, progress dropped).
    pub preempted: Vec<u64>,
    /// Requests admitted in the step, with their prefix-cache hit.
    pub admitted: Vec<Admission>,
    /// Cache changes of the step, when enabled with [`Engine::set_record_kv_events`].
    pub kv_events: Vec<KvEvent>,
}

/// Gauges and counters named after vLLM's metrics (`reference/interfaces.md` §2.1).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EngineMetrics {
    pub num_requests_running: u32,
    pub num_requests_waiting: u32,
    /// Blocks held by running requests / all blocks (cached-but-free blocks count as free).
    pub kv_cache_usage: f64,
    pub kv_blocks_total: u32,
    pub kv_blocks_used: u32,
    /// Blocks holding a cached prompt block hash, free or in use.
    pub kv_blocks_cached: u32,
    pub prefix_cache_queries_tokens: u64,
    pub prefix_cache_hits_tokens: u64,
    pub preemptions: u64,
    pub steps: u64,
    /// Sum of step durations.
    pub busy_ms: f64,
    /// Prompt tokens of admitted requests (once per request, as `vllm:prompt_tokens_total`).
    pub prompt_tokens: u64,
    pub generation_tokens: u64,
    pub requests_finished: u64,
    pub requests_rejected: u64,
    /// Requests that left through [`Engine::abort`].
    pub requests_aborted: u64,
    /// Prompt tokens whose KV arrived from a prefill pod ([`Engine::add_transferred_request`]),
    /// not computed here: vLLM's `prompt_tokens_by_source_total{source="external_kv_transfer"}`.
    pub prompt_tokens_transferred: u64,
    /// LoRA ([`Engine::set_lora`]): `max_lora` (0 without LoRA), the adapters of running
    /// requests, the requests deferred for a slot in the last step, and adapter loads so far.
    pub max_loras: u32,
    pub lora_running: AdapterSet,
    pub num_requests_deferred: u32,
    pub lora_loads: u64,
}

#[derive(Debug)]
struct Req {
    id: u64,
    adapter: Option<AdapterId>,
    hashes: Arc<[BlockHash]>,
    input_tokens: u32,
    output_tokens: u32,
    /// Prompt blocks that may be cached: `min(hashes.len(), input_tokens / block size)`.
    cacheable_blocks: u32,
    emitted: u32,
    /// Tokens whose KV is computed (block-aligned hits + computed chunks).
    computed: u32,
    /// Tokens to compute before the next sample after an admission (prompt + outputs so far).
    prefill_target: u32,
    /// Leading blocks of `table` whose hash has been registered or was a hit.
    registered: u32,
    /// Tokens scheduled in the current step (0 when not scheduled).
    scheduled: u32,
    table: Vec<BlockId>,
    /// The prompt's KV arrives from a prefill pod at the first admission (P/D decode stage).
    transferred: bool,
}

impl Req {
    fn num_tokens(&self) -> u32 {
        self.input_tokens + self.emitted
    }
}

/// One simulated vLLM engine. See the module docs.
#[derive(Debug)]
pub struct Engine {
    profile: Profile,
    kv: KvCache,
    running: Vec<Req>,
    waiting: VecDeque<Req>,
    /// When the current step ends (or, when idle, the earliest time the next one may start).
    free_at_ms: f64,
    outcome: StepOutcome,
    metrics: EngineMetrics,
    scratch_hits: Vec<BlockId>,
    spare_tables: Vec<Vec<BlockId>>,
    /// Tokens per KV block (16 by default, vLLM's CUDA default; vLLM CPU uses 128).
    block_size_tokens: u32,
    lora: Option<LoraState>,
    /// Adapter load time to add to the step being scheduled.
    load_penalty_ms: f64,
}

impl Engine {
    /// An idle engine with `profile`'s step times and limits; `kv_blocks_override` replaces the
    /// profile's KV-block count (tests, or a pod with less memory).
    pub fn new(profile: &Profile, kv_blocks_override: Option<u32>) -> Self {
        Self::with_block_size(profile, kv_blocks_override, SIM_BLOCK_SIZE_TOKENS)
    }

    /// An engine with the profile's block size ([`Profile::block_size_tokens`]), its capacity
    /// `kv_blocks_override` or the profile's `kv_blocks` (16-token blocks) converted to blocks
    /// of that size. Its requests come from [`EngineRequest::for_block_size`].
    pub fn for_profile(profile: &Profile, kv_blocks_override: Option<u32>) -> Self {
        let size = profile.block_size_tokens.max(SIM_BLOCK_SIZE_TOKENS);
        let kv16 = u64::from(kv_blocks_override.unwrap_or(profile.kv_blocks));
        let blocks = kv16 * u64::from(SIM_BLOCK_SIZE_TOKENS) / u64::from(size);
        let blocks = u32::try_from(blocks).unwrap_or(u32::MAX).max(1);
        Self::with_block_size(profile, Some(blocks), size)
    }

    /// Like [`Engine::new`] with blocks of `block_size_tokens` tokens (at least 1) instead of
    /// 16: prefix hits, allocation and the capacity check count in blocks of that size, and
    /// [`EngineRequest::blocks`] must be hashes of blocks of that size. `kv_blocks_override`
    /// (or the profile's count) is then a number of such blocks.
    pub fn with_block_size(
        profile: &Profile,
        kv_blocks_override: Option<u32>,
        block_size_tokens: u32,
    ) -> Self {
        let kv_blocks = kv_blocks_override.unwrap_or(profile.kv_blocks);
        Engine {
            block_size_tokens: block_size_tokens.max(1),
            profile: profile.clone(),
            kv: KvCache::new(kv_blocks),
            running: Vec::new(),
            waiting: VecDeque::new(),
            free_at_ms: 0.0,
            outcome: StepOutcome::default(),
            metrics: EngineMetrics {
                kv_blocks_total: kv_blocks,
                ..EngineMetrics::default()
            },
            scratch_hits: Vec::new(),
            spare_tables: Vec::new(),
            lora: None,
            load_penalty_ms: 0.0,
        }
    }

    /// Serves LoRA adapters with `config` (see [`LoraConfig`]); `None` (the default): every
    /// request runs as the base model, whatever its adapter.
    pub fn set_lora(&mut self, config: Option<LoraConfig>) {
        self.lora = config.map(|config| LoraState {
            config: LoraConfig {
                max_loras: config.max_loras.max(1),
                ..config
            },
            loaded: Vec::new(),
            deferred: 0,
        });
    }

    pub fn profile(&self) -> &Profile {
        &self.profile
    }

    /// Tokens per KV block.
    pub fn block_size_tokens(&self) -> u32 {
        self.block_size_tokens
    }

    fn blocks_for(&self, tokens: u32) -> u32 {
        tokens.div_ceil(self.block_size_tokens)
    }

    /// Record `Stored`/`Removed` cache events into [`StepOutcome::kv_events`] (off by default).
    pub fn set_record_kv_events(&mut self, on: bool) {
        self.kv.record_events = on;
        if !on {
            self.kv.events.clear();
        }
    }

    /// Queues a request arriving at `now_ms`; it is considered from the next step on.
    /// Refuses requests that vLLM would reject or that could never fit in this pod's KV cache.
    pub fn add_request(&mut self, now_ms: f64, req: EngineRequest) -> Result<(), AdmitError> {
        self.add(now_ms, req, false)
    }

    /// [`Engine::add_request`] for the decode stage of a prefill/decode disaggregated request:
    /// the prompt's KV is pulled from the prefill pod, as vLLM's `NixlConnector` does, so at its
    /// first admission the request computes no prompt token: its blocks are allocated (the
    /// cached ones reused), the prompt up to its last token counts as computed, and the first
    /// step is a decode step (vLLM recomputes only the last prompt position for its logits).
    /// The transferred tokens (the prompt minus the prefix-cache hits) are counted in
    /// [`EngineMetrics::prompt_tokens_transferred`]. Transfer time is the caller's to model
    /// (the request arrives when its KV has). A preemption before the first token loses the
    /// transferred KV: the request is then recomputed locally, as vLLM does.
    pub fn add_transferred_request(
        &mut self,
        now_ms: f64,
        req: EngineRequest,
    ) -> Result<(), AdmitError> {
        self.add(now_ms, req, true)
    }

    fn add(
        &mut self,
        now_ms: f64,
        req: EngineRequest,
        transferred: bool,
    ) -> Result<(), AdmitError> {
        if let Err(e) = self.check(&req) {
            self.metrics.requests_rejected += 1;
            return Err(e);
        }
        if self.is_idle() {
            self.free_at_ms = self.free_at_ms.max(now_ms);
        }
        let cacheable_blocks =
            (req.blocks.len() as u32).min(req.input_tokens / self.block_size_tokens);
        self.waiting.push_back(Req {
            id: req.id,
            adapter: req.adapter,
            hashes: req.blocks,
            input_tokens: req.input_tokens,
            output_tokens: req.output_tokens,
            cacheable_blocks,
            emitted: 0,
            computed: 0,
            prefill_target: 0,
            registered: 0,
            scheduled: 0,
            table: self.spare_tables.pop().unwrap_or_default(),
            transferred,
        });
        Ok(())
    }

    fn check(&self, req: &EngineRequest) -> Result<(), AdmitError> {
        if req.input_tokens == 0 {
            return Err(AdmitError::EmptyPrompt(req.id));
        }
        if req.output_tokens == 0 {
            return Err(AdmitError::NoOutput(req.id));
        }
        let tokens = u64::from(req.input_tokens) + u64::from(req.output_tokens);
        if tokens > u64::from(self.profile.max_model_len) {
            return Err(AdmitError::ExceedsMaxModelLen {
                id: req.id,
                tokens,
                max_model_len: self.profile.max_model_len,
            });
        }
        // The last output token is never fed back, so it needs no KV slot.
        let blocks = (tokens - 1).div_ceil(u64::from(self.block_size_tokens));
        if blocks > u64::from(self.kv.num_blocks()) {
            return Err(AdmitError::ExceedsKvCapacity {
                id: req.id,
                blocks,
                kv_blocks: self.kv.num_blocks(),
            });
        }
        Ok(())
    }

    /// The pod process dies at `now_ms`: every running and waiting request is dropped (their ids
    /// are returned, running first) and the KV cache comes back empty, as after a vLLM restart.
    /// If the last step was still in progress at `now_ms`, its emissions never left the pod, so
    /// the requests that finished in it are returned too. Cumulative counters (busy time, prefix-cache queries/hits, preemptions) are kept so
    /// a run's totals still add up; the event-recording switch is kept too.
    pub fn crash(&mut self, now_ms: f64) -> Vec<u64> {
        let mut dropped: Vec<u64> = self.running.drain(..).map(|r| r.id).collect();
        dropped.extend(self.waiting.drain(..).map(|r| r.id));
        if now_ms < self.free_at_ms {
            let finished = self.outcome.emissions.iter().filter(|e| e.finished);
            dropped.extend(finished.map(|e| e.request_id));
        }
        let record = self.kv.record_events;
        self.kv = KvCache::new(self.kv.num_blocks());
        self.kv.record_events = record;
        self.outcome = StepOutcome::default();
        self.free_at_ms = now_ms;
        dropped
    }

    /// The client of request `id` went away: the request leaves the engine (vLLM
    /// `abort_requests`) and its blocks go back to the free queue, keeping their hashes (the
    /// blocks it filled stay cached, as in vLLM). Counted in [`EngineMetrics::requests_aborted`].
    /// Returns false when no such request is queued or running (already finished, say).
    /// Call it between steps: the outcome of the last step is left as it was.
    pub fn abort(&mut self, id: u64) -> bool {
        let mut req = if let Some(i) = self.running.iter().position(|r| r.id == id) {
            self.running.remove(i)
        } else if let Some(i) = self.waiting.iter().position(|r| r.id == id) {
            match self.waiting.remove(i) {
                Some(r) => r,
                None => return false,
            }
        } else {
            return false;
        };
        self.kv.free_all(&req.table);
        req.table.clear();
        self.spare_tables.push(std::mem::take(&mut req.table));
        self.metrics.requests_aborted += 1;
        true
    }

    /// True when no request is running or waiting.
    pub fn is_idle(&self) -> bool {
        self.running.is_empty() && self.waiting.is_empty()
    }

    /// When the next step starts, or `None` when there is nothing to do.
    pub fn next_step_time(&self) -> Option<f64> {
        (!self.is_idle()).then_some(self.free_at_ms)
    }

    /// Current gauges and counters.
    pub fn metrics(&self) -> EngineMetrics {
        EngineMetrics {
            num_requests_running: self.running.len() as u32,
            num_requests_waiting: self.waiting.len() as u32,
            kv_cache_usage: f64::from(self.kv.num_used()) / f64::from(self.kv.num_blocks().max(1)),
            kv_blocks_used: self.kv.num_used(),
            kv_blocks_cached: self.kv.num_cached() as u32,
            max_loras: self.lora.as_ref().map_or(0, |l| l.config.max_loras),
            lora_running: self.running_adapters(),
            num_requests_deferred: self.lora.as_ref().map_or(0, |l| l.deferred),
            ..self.metrics.clone()
        }
    }

    /// Adapters of the running requests (with LoRA on).
    fn running_adapters(&self) -> AdapterSet {
        let mut set = AdapterSet::default();
        if self.lora.is_some() {
            for a in self.running.iter().filter_map(|r| r.adapter) {
                set.insert(a);
            }
        }
        set
    }

    /// How many leading `hashes` are cached now (free or in use), without touching anything.
    pub fn cached_prefix_blocks(&self, hashes: &[BlockHash]) -> usize {
        self.kv.prefix_len(hashes)
    }

    /// The outcome of the last step.
    pub fn last_outcome(&self) -> &StepOutcome {
        &self.outcome
    }

    /// Runs one scheduler iteration starting at `now_ms` (or when the previous step ends, if
    /// later) and returns what it did. With nothing to do, returns an empty zero-length outcome.
    pub fn step(&mut self, now_ms: f64) -> &StepOutcome {
        let start_ms = now_ms.max(self.free_at_ms);
        self.outcome.emissions.clear();
        self.outcome.preempted.clear();
        self.outcome.admitted.clear();
        self.kv.events.clear();

        let mut budget = self.profile.max_num_batched_tokens;
        self.schedule_running(&mut budget);
        if self.outcome.preempted.is_empty() {
            self.schedule_waiting(&mut budget);
        }
        let finished = self.advance();

        let o = &mut self.outcome;
        o.start_ms = start_ms;
        o.duration_ms = if o.scheduled_seqs == 0 {
            0.0
        } else {
            self.profile.step_ms(
                o.prefill_tokens,
                o.decode_seqs,
                o.context_tokens_read,
                o.prefill_attention_pairs,
            )
        };
        if o.scheduled_seqs > 0 {
            o.duration_ms += self.load_penalty_ms;
        }
        self.load_penalty_ms = 0.0;
        o.end_ms = start_ms + o.duration_ms;
        std::mem::swap(&mut o.kv_events, &mut self.kv.events);
        self.free_at_ms = o.end_ms;
        if o.scheduled_seqs > 0 {
            self.metrics.steps += 1;
            self.metrics.busy_ms += o.duration_ms;
        }
        if finished > 0 {
            self.metrics.requests_finished += u64::from(finished);
            let kv = &mut self.kv;
            let spare = &mut self.spare_tables;
            self.running.retain_mut(|r| {
                if r.emitted < r.output_tokens {
                    return true;
                }
                kv.free_all(&r.table);
                let mut table = std::mem::take(&mut r.table);
                table.clear();
                spare.push(table);
                false
            });
        }
        &self.outcome
    }

    /// Phase 1: running requests, oldest first, preempting the newest when blocks run out.
    fn schedule_running(&mut self, budget: &mut u32) {
        let mut i = 0;
        while i < self.running.len() && *budget > 0 {
            let r = &self.running[i];
            let new = (r.num_tokens() - r.computed).min(*budget);
            let extra = self
                .blocks_for(r.computed + new)
                .saturating_sub(r.table.len() as u32);
            let mut scheduled = true;
            while extra > self.kv.num_free() {
                let Some(mut victim) = self.running.pop() else {
                    break;
                };
                self.preempt(&mut victim);
                let was_self = self.running.len() == i;
                self.waiting.push_front(victim);
                if was_self {
                    scheduled = false;
                    break;
                }
            }
            if !scheduled {
                break;
            }
            let r = &mut self.running[i];
            for _ in 0..extra {
                // Cannot fail: checked against num_free above.
                if let Some(id) = self.kv.allocate() {
                    r.table.push(id);
                }
            }
            r.scheduled = new;
            register_scheduled(&mut self.kv, self.block_size_tokens, r);
            *budget -= new;
            i += 1;
        }
        for r in &mut self.running[i..] {
            r.scheduled = 0;
        }
    }

    fn preempt(&mut self, r: &mut Req) {
        self.kv.free_all(&r.table);
        r.table.clear();
        r.computed = 0;
        r.registered = 0;
        r.scheduled = 0;
        self.metrics.preemptions += 1;
        self.outcome.preempted.push(r.id);
    }

    /// Phase 2: admit waiting requests FCFS while budget, `max_num_seqs` and blocks allow.
    fn schedule_waiting(&mut self, budget: &mut u32) {
        let mut active = self.running_adapters();
        let mut at = 0;
        if let Some(l) = &mut self.lora {
            l.deferred = 0;
        }
        while *budget > 0 && (self.running.len() as u32) < self.profile.max_num_seqs {
            let Some(r) = self.waiting.get(at) else {
                break;
            };
            if let (Some(l), Some(a)) = (&mut self.lora, r.adapter)
                && !active.contains(a)
                && active.len() as u32 >= l.config.max_loras
            {
                // One adapter too many for the batch: deferred, the next request considered.
                l.deferred += 1;
                at += 1;
                continue;
            }
            let num_tokens = r.num_tokens();
            let max_hit = r
                .cacheable_blocks
                .min((num_tokens - 1) / self.block_size_tokens) as usize;
            let free_hits = self
                .kv
                .find_prefix(&r.hashes[..max_hit], &mut self.scratch_hits);
            let hit_blocks = self.scratch_hits.len() as u32;
            let cached = hit_blocks * self.block_size_tokens;
            let transferred = r.transferred && r.emitted == 0;
            let computed = if transferred { num_tokens - 1 } else { cached };
            let new = (num_tokens - computed).min(*budget);
            let extra = self.blocks_for(computed + new) - hit_blocks;
            if extra + free_hits > self.kv.num_free() {
                break;
            }
            let Some(mut r) = self.waiting.remove(at) else {
                break;
            };
            if let Some(a) = r.adapter
                && self.lora.is_some()
            {
                active.insert(a);
                self.activate_adapter(a);
            }
            for &id in &self.scratch_hits {
                self.kv.touch(id);
                r.table.push(id);
            }
            for _ in 0..extra {
                if let Some(id) = self.kv.allocate() {
                    r.table.push(id);
                }
            }
            r.computed = computed;
            r.registered = hit_blocks;
            // A transferred prompt's first step is a decode step.
            r.prefill_target = if transferred { computed } else { num_tokens };
            r.scheduled = new;
            register_scheduled(&mut self.kv, self.block_size_tokens, &mut r);
            if transferred {
                r.transferred = false;
                self.metrics.prompt_tokens_transferred += u64::from(r.input_tokens - cached);
            }
            self.metrics.prefix_cache_queries_tokens += u64::from(num_tokens);
            self.metrics.prefix_cache_hits_tokens += u64::from(cached);
            self.outcome.admitted.push(Admission {
                request_id: r.id,
                cached_tokens: cached,
            });
            if r.emitted == 0 {
                self.metrics.prompt_tokens += u64::from(r.input_tokens);
            }
            *budget -= new;
            self.running.push(r);
        }
    }

    /// Marks adapter `a` used in this step; loads it (evicting the least recently used loaded
    /// adapter without running requests) when it is not loaded.
    fn activate_adapter(&mut self, a: AdapterId) {
        let step = self.metrics.steps;
        let running = self.running_adapters();
        let Some(l) = &mut self.lora else {
            return;
        };
        if let Some(e) = l.loaded.iter_mut().find(|(id, _)| *id == a) {
            e.1 = step;
            return;
        }
        if l.loaded.len() as u32 >= l.config.max_loras
            && let Some(i) = l
                .loaded
                .iter()
                .enumerate()
                .filter(|(_, (id, _))| !running.contains(*id))
                .min_by_key(|(_, (_, used))| *used)
                .map(|(i, _)| i)
        {
            l.loaded.swap_remove(i);
        }
        l.loaded.push((a, step));
        self.load_penalty_ms += l.config.load_ms;
        self.metrics.lora_loads += 1;
    }

    /// Applies the scheduled tokens: step-time inputs, block hashes, token emissions.
    /// Returns how many requests finished.
    fn advance(&mut self) -> u32 {
        let block = self.block_size_tokens;
        let o = &mut self.outcome;
        o.prefill_tokens = 0;
        o.decode_seqs = 0;
        o.context_tokens_read = 0;
        o.prefill_attention_pairs = 0;
        o.scheduled_seqs = 0;
        let mut finished = 0;
        for r in &mut self.running {
            let new = r.scheduled;
            if new == 0 {
                continue;
            }
            r.scheduled = 0;
            o.scheduled_seqs += 1;
            if r.computed < r.prefill_target {
                let n = u64::from(new);
                o.prefill_tokens += n;
                o.prefill_attention_pairs += n * u64::from(r.computed) + n * (n + 1) / 2;
            } else {
                o.decode_seqs += 1;
            }
            r.computed += new;
            o.context_tokens_read += u64::from(r.computed);
            let full = (r.computed / block).min(r.cacheable_blocks);
            while r.registered < full {
                let idx = r.registered as usize;
                self.kv.register(r.table[idx], r.hashes[idx]);
                r.registered += 1;
            }
            if r.computed >= r.num_tokens() {
                r.emitted += 1;
                self.metrics.generation_tokens += 1;
                let done = r.emitted >= r.output_tokens;
                finished += u32::from(done);
                o.emissions.push(Emission {
                    request_id: r.id,
                    output_tokens_so_far: r.emitted,
                    finished: done,
                });
            }
        }
        finished
    }
}

/// Registers the full blocks `r`'s scheduled tokens will compute in this step, as soon as it is
/// scheduled (vLLM v1's `KVCacheManager.allocate_slots` caches them then, before the scheduler
/// looks at the next request): a request scheduled after it, in this step or a later one, finds
/// them cached and computes only what follows. So siblings waiting together share a prefix the
/// first of them brings, as on vLLM; the step still computes it once, for the first.
fn register_scheduled(kv: &mut kv_cache::KvCache, block: u32, r: &mut Req) {
    let full = ((r.computed + r.scheduled) / block).min(r.cacheable_blocks);
    while r.registered < full {
        let idx = r.registered as usize;
        kv.register(r.table[idx], r.hashes[idx]);
        r.registered += 1;
    }
}
#[cfg(test)]
mod tests;
