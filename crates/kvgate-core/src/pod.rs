//! What the router knows about one pod at decision time.

use crate::adapters::LoraSlots;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// Dense pod handle (0, 1, 2, …) assigned by whoever owns the pod table. Indexes and the
/// predictor key their per-pod state by it, so it stays small and cheap to copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PodId(pub u32);

impl PodId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// The router's own exact accounting of work it dispatched to a pod and that has not finished.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct InFlight {
    /// Requests dispatched and not yet finished (any path: done, error, abort).
    #[serde(default)]
    pub requests: u32,
    /// Uncached prompt tokens of requests dispatched whose first token has not arrived yet.
    #[serde(default)]
    pub prefill_tokens: u64,
    /// Prompt + generated tokens of requests past their first token (the decode working set).
    #[serde(default)]
    pub decode_tokens: u64,
}

/// What a pod serves in a prefill/decode (P/D) disaggregated fleet.
///
/// - `both` (the default): whole requests (prefill and decode on the same pod), and either stage
///   of a P/D request.
/// - `prefill`: only the prefill stage of a P/D request (vLLM `kv_role = kv_producer`: it
///   answers a `max_tokens: 1` request with `kv_transfer_params` for the decode pod).
/// - `decode`: only the decode stage (vLLM `kv_role = kv_consumer`: the original request with
///   the prefill's `kv_transfer_params`, whose KV it pulls instead of computing the prompt).
///
/// A fleet with a healthy pod of a dedicated role (`prefill` or `decode`) routes every request
/// through both stages ([`crate::RouterSession::route_pd`]); a fleet of `both` pods only routes
/// whole requests, as before roles existed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PodRole {
    #[default]
    Both,
    Prefill,
    Decode,
}

impl PodRole {
    pub const ALL: [PodRole; 3] = [PodRole::Both, PodRole::Prefill, PodRole::Decode];

    /// The name in configs, labels and explanations: `both`, `prefill`, `decode`.
    pub fn name(self) -> &'static str {
        match self {
            PodRole::Both => "both",
            PodRole::Prefill => "prefill",
            PodRole::Decode => "decode",
        }
    }

    /// `both`, `prefill` or `decode` (ASCII case ignored); `None` for anything else.
    pub fn from_name(name: &str) -> Option<PodRole> {
        PodRole::ALL
            .into_iter()
            .find(|r| r.name().eq_ignore_ascii_case(name.trim()))
    }

    /// Whether the pod may run a P/D request's prefill stage.
    pub fn can_prefill(self) -> bool {
        self != PodRole::Decode
    }

    /// Whether the pod may run a P/D request's decode stage.
    pub fn can_decode(self) -> bool {
        self != PodRole::Prefill
    }
}

/// One pod as seen at dispatch: scraped engine metrics plus the router's in-flight counters.
#[derive(Debug, Clone, PartialEq)]
pub struct PodSnapshot {
    pub id: PodId,
    /// Human-readable name (URL or pod name); used in explanations and metrics. Shared, so a
    /// decision's explanation names every pod without copying the name (the decision is the
    /// hot path: one allocation per pod per decision cost ~17 % at 1,024 pods).
    pub name: Arc<str>,
    /// Hardware/model profile name (e.g. `llama3-8b-h100`); the predictor learns per class.
    pub class: Arc<str>,
    /// `vllm:num_requests_waiting` at the last scrape.
    pub waiting: u32,
    /// `vllm:num_requests_running` at the last scrape.
    pub running: u32,
    /// `vllm:kv_cache_usage_perc` at the last scrape, 0..=1.
    pub kv_usage: f64,
    /// Total KV blocks of the pod (`num_gpu_blocks` of `vllm:cache_config_info`).
    pub kv_blocks: u32,
    /// Tokens per KV block (`block_size` of `vllm:cache_config_info`), when the pod reported
    /// it; `None`: the router's `block_size_tokens`. Chooses the chain the pod is scored
    /// against ([`crate::router::PromptCut`]).
    pub block_size_tokens: Option<u32>,
    pub in_flight: InFlight,
    /// False when the last scrape or connection failed; unhealthy pods are never chosen.
    pub healthy: bool,
    /// What the pod serves (P/D disaggregation); `both` unless configured.
    pub role: PodRole,
    /// LoRA adapter slots and residency (`None`: the pod reports no LoRA); see
    /// [`crate::adapters`].
    pub lora: Option<LoraSlots>,
}

impl PodSnapshot {
    /// A healthy, idle pod; handy for tests and drivers that fill fields afterwards.
    pub fn idle(id: u32, class: &str, kv_blocks: u32) -> Self {
        PodSnapshot {
            id: PodId(id),
            name: format!("pod-{id}").into(),
            class: class.into(),
            waiting: 0,
            running: 0,
            kv_usage: 0.0,
            kv_blocks,
            block_size_tokens: None,
            in_flight: InFlight::default(),
            healthy: true,
            role: PodRole::Both,
            lora: None,
        }
    }

    /// Queue length used by load-based policies: the larger of what the engine reported
    /// (waiting + running) and what we know we dispatched, so a stale scrape cannot hide load.
    pub fn load_requests(&self) -> u32 {
        (self.waiting + self.running).max(self.in_flight.requests)
    }
}
