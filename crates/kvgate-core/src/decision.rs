//! A routing decision and its explanation: which pod, through which branch, and what the
//! router believed about every pod. Kept for every decision (`/debug/decisions`,
//! `kvgate decide`), so it is plain data that serialises the same way everywhere.

use serde::Serialize;
use std::sync::Arc;

/// Why the policy chose what it chose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Branch {
    /// Affinity gate: the ε coin came up and the request was explored. What was picked depends
    /// on `explore_mode`: `best-overall` (the seed) the best predicted TTFT over all pods;
    /// `random-non-sticky` (the default) a uniformly random pod among those not sticky. In
    /// that mode `explore_max_extra_ms` (25 ms by default) also restricts the pick to pods
    /// predicted within that much of the best; when no pod qualifies the request is not
    /// explored and takes one of the other branches.
    Explore,
    /// Affinity gate: best latency among the sticky pods (score > τ).
    Exploit,
    /// Affinity gate: no pod passed τ; best latency over all pods.
    NoSticky,
    /// Affinity gate: the best sticky pod was more than the penalty slower than the best pod.
    LoadBreak,
    /// Any other policy: a short policy-specific reason (`least_loaded`, `cache_hit`, …).
    #[serde(untagged)]
    Reason(&'static str),
}

impl Branch {
    pub fn as_str(&self) -> &'static str {
        match self {
            Branch::Explore => "explore",
            Branch::Exploit => "exploit",
            Branch::NoSticky => "no_sticky",
            Branch::LoadBreak => "load_break",
            Branch::Reason(r) => r,
        }
    }
}

/// What the router believed about one pod when it decided.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PodExplanation {
    /// The pod's name ([`crate::PodSnapshot::name`], shared with the snapshot).
    pub id: Arc<str>,
    pub prefix_score: f64,
    pub predicted_ttft_ms: f64,
    pub predicted_tpot_ms: f64,
    /// Whether the pod was in the set the policy chose from in its final step.
    pub eligible: bool,
    /// Where the request's LoRA adapter stood on the pod (left out when no adapter was
    /// involved), and the ms it added to `predicted_ttft_ms`.
    #[serde(skip_serializing_if = "is_no_adapter")]
    pub adapter: crate::adapters::AdapterFit,
    #[serde(skip_serializing_if = "is_zero")]
    pub adapter_cost_ms: f64,
    /// Of the blocks behind `prefix_score`, those that were pending routes (engine mode: sent
    /// to the pod, not yet confirmed by its KV events; [`crate::index::pending`]). Left out
    /// when 0.
    #[serde(skip_serializing_if = "is_zero_blocks")]
    pub pending_blocks: u32,
    /// Of the blocks behind `prefix_score`, those an earlier request is still computing on the
    /// pod (routed before its first token; [`crate::session::prefilling`]): the prediction
    /// counted them as uncached. Left out when 0.
    #[serde(skip_serializing_if = "is_zero_blocks")]
    pub prefilling_blocks: u32,
}

fn is_zero_blocks(v: &u32) -> bool {
    *v == 0
}

fn is_no_adapter(f: &crate::adapters::AdapterFit) -> bool {
    *f == crate::adapters::AdapterFit::NoAdapter
}

fn is_zero(v: &f64) -> bool {
    *v == 0.0
}

/// The affinity gate's parameters in force.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct GateState {
    pub affinity_gate_tau: f64,
    pub epsilon_explore_sticky: f64,
}

/// What an SLO-aware policy (the affinity gate) decided for a request with objectives: the
/// objectives and the chosen pod's predicted headroom (SLO − prediction) for each.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SloExplanation {
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
    pub headroom_ttft_ms: Option<f64>,
    pub headroom_tpot_ms: Option<f64>,
    /// Whether the chosen pod is predicted to meet every objective (else the pick was an idle
    /// pod or the smallest violation).
    pub predicted_to_meet: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Decision {
    /// Name of the chosen pod.
    pub pod: Arc<str>,
    /// Id of the chosen pod.
    #[serde(skip)]
    pub pod_id: crate::pod::PodId,
    pub branch: Branch,
    pub pods: Vec<PodExplanation>,
    /// SLO mode: present when the request carried objectives and the policy routes by them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slo: Option<SloExplanation>,
    /// Prefill/decode disaggregation: present when the request was split in two stages. Then
    /// `pod`, `branch` and `pods` are the prefill pick (over the prefill-capable pods) and this
    /// is the decode pick.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decode: Option<DecodeExplanation>,
}

/// The decode stage's pick of a P/D request: the decode-capable pod with the least predicted
/// TPOT, ties to the fewest decode tokens in flight, then the fewest requests, then the lower id
/// ([`crate::RouterSession::route_pd`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DecodeExplanation {
    /// Name of the decode pod.
    pub pod: Arc<str>,
    #[serde(skip)]
    pub pod_id: crate::pod::PodId,
    /// Every decode candidate as the pick saw it.
    pub pods: Vec<DecodeCandidate>,
}

/// One decode-capable pod at a P/D request's decode pick.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DecodeCandidate {
    pub id: Arc<str>,
    pub predicted_tpot_ms: f64,
    /// The router's in-flight decode tokens on the pod (prompt + generated of its requests past
    /// their first token).
    pub decode_tokens_in_flight: u64,
    pub requests_in_flight: u32,
}
