//! # kvgate-sim — a fleet of vLLM-like pods in discrete time, with kvgate's router in the loop
//!
//! - `engine`: the engine model of one pod (KV blocks with prefix caching, continuous batching,
//!   chunked prefill, preemption, profile step times). Also driven in real time by the mock pod.
//! - `faults`: pod outages in a run (`--faults`) and what they did.
//! - `mesh`: the network between router replicas (`--replicas`, `--share`), each running the
//!   core's replica machine, as `kvgate serve --cluster` does.
//! - `profiles`: step-time profiles calibrated from `shared/profiles/`.
//! - `events`: the router's prefix index, routed or fed by the pods' KV events (delay, loss).
//! - `models`: mixed-model fleets (each pod's model, each request's, per-model figures).
//! - `workload`: trace readers (Mooncake JSONL, Azure CSV) and generators (chat, shared-prefix).

pub mod calibrate;
pub mod cluster;
pub mod engine;
pub mod events;
pub mod faults;
pub mod html;
pub mod mesh;
pub mod models;
pub mod profiles;
pub mod report;
pub mod stats;
pub mod workload;

use kvgate_core::{AdapterId, BlockHash};

/// Tokens per KV block in the simulated engines (vLLM's CUDA default).
pub const SIM_BLOCK_SIZE_TOKENS: u32 = 16;

/// One request of a workload, as both the router and the engine model see it.
///
/// The prompt is carried as the chained hashes of its full 16-token blocks (the same hashes a
/// router in token mode computes with `BlockHasher::hash_tokens`), not as token ids: equal
/// prefixes give equal leading hashes, and a 100k-token prompt costs 6k hashes, not 100k ids.
#[derive(Debug, Clone, PartialEq)]
pub struct SimRequest {
    /// Position in the workload (0, 1, 2, …).
    pub id: u64,
    /// Arrival time in milliseconds from the start of the run.
    pub arrival_ms: f64,
    /// Prompt length in tokens (the last block may be partial, so this can exceed 16 × blocks).
    pub input_tokens: u32,
    /// Tokens to generate (`max_tokens` with `ignore_eos`).
    pub output_tokens: u32,
    /// Chained hashes of the prompt's full 16-token blocks; `blocks.len() == input_tokens / 16`.
    pub blocks: Vec<BlockHash>,
    /// The LoRA adapter the request names (`None`: the base model). A workload with adapters
    /// seeds each adapter's block chains apart, as vLLM's per-adapter prefix cache does.
    pub adapter: Option<AdapterId>,
    /// The client session the request belongs to (the agent workload's sessions; a model
    /// assignment keeps a session on one model); `None`: none.
    pub session: Option<u64>,
}
