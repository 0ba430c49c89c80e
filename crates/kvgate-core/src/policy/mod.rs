//! Routing policies: one file each, behind the small [`Policy`] trait.
//!
//! A policy sees the healthy candidates with everything already computed (prefix score,
//! predicted TTFT/TPOT, load) and returns the index of its pick and a reason. It never hashes,
//! scores or predicts itself, so every policy is judged on the same inputs.

pub mod affinity_gate;
pub mod dynamo_kv;
pub mod latency;
pub mod least_kv;
pub mod least_request;
pub mod llmd_chain;
pub mod lora_affinity;
pub mod prefix;
pub mod random;
pub mod round_robin;
pub mod sglang_cache_aware;
pub mod weighted;

use crate::DecisionRng;
use crate::adapters::{AdapterFit, AdapterId};
use crate::config::RouterConfig;
use crate::decision::{Branch, GateState};
use crate::pod::PodSnapshot;
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// One healthy pod as a policy sees it.
#[derive(Debug, Clone, Copy)]
pub struct Candidate<'a> {
    pub pod: &'a PodSnapshot,
    /// Leading prompt blocks this pod holds.
    pub matched_blocks: u32,
    /// Tokens per block of `matched_blocks` (the pod's own block size, which may differ from
    /// [`RequestFacts::block_size_tokens`] in a mixed fleet).
    pub block_size_tokens: u32,
    /// matched_blocks / prompt blocks, in [0, 1].
    pub prefix_score: f64,
    /// Predicted TTFT, the adapter cost included (`adapter_cost_ms`).
    pub predicted_ttft_ms: f64,
    pub predicted_tpot_ms: f64,
    /// Where the request's LoRA adapter stands on this pod ([`crate::adapters`]).
    pub adapter_fit: AdapterFit,
    /// Milliseconds of adapter load / deferral in `predicted_ttft_ms` (0 with `lora_aware`
    /// off, or when the adapter is resident).
    pub adapter_cost_ms: f64,
    /// Milliseconds of `predicted_ttft_ms` due to this request's own uncached prompt tokens: the
    /// prediction less the prediction as if the pod held the whole prompt (≥ 0). Computed only
    /// for the two pods a policy that prices moves compares ([`Policy::prices_prefill_above`]:
    /// the best pod overall, the best above τ); 0 otherwise.
    pub prefill_ms: f64,
}

/// The request as a policy sees it.
#[derive(Debug, Clone, Copy)]
pub struct RequestFacts {
    /// Blocks in the prompt.
    pub prompt_blocks: usize,
    /// Estimated prompt tokens.
    pub input_tokens: u32,
    /// Tokens per block of the main chain (`prompt_blocks`).
    pub block_size_tokens: u32,
    /// The request's TTFT objective (`x-slo-ttft-ms`), if it carries one.
    pub slo_ttft_ms: Option<f64>,
    /// The request's TPOT objective (`x-slo-tpot-ms`), if it carries one.
    pub slo_tpot_ms: Option<f64>,
    /// The LoRA adapter the request names (its `model`), if the driver knows it.
    pub adapter: Option<AdapterId>,
    /// About how many recent requests carried the prompt's deepest block that some pod holds
    /// ([`crate::index::popularity`]); 0 when the router does not count (shared-prefix
    /// exploration off) or no pod holds a counted block of the prompt.
    pub prefix_sharers: u32,
}

/// Latency objectives a request may carry; see [`crate::Router::decide_with_slo`]. Values that
/// are not finite and positive are ignored (treated as absent).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RequestSlo {
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
}

impl RequestSlo {
    /// The objectives with invalid values dropped.
    pub fn sanitized(self) -> RequestSlo {
        let valid = |v: Option<f64>| v.filter(|x| x.is_finite() && *x > 0.0);
        RequestSlo {
            ttft_ms: valid(self.ttft_ms),
            tpot_ms: valid(self.tpot_ms),
        }
    }
}

/// A policy's answer: the index into the candidate slice, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pick {
    pub index: usize,
    pub branch: Branch,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum PolicyError {
    #[error("no healthy pod to route to")]
    NoCandidates,
}

pub trait Policy: Send {
    fn kind(&self) -> PolicyKind;

    /// The affinity gate's τ and ε in force; `None` for policies without a gate.
    fn gate_state(&self) -> Option<GateState> {
        None
    }

    /// Whether the policy routes by the request's SLOs ([`RequestFacts::slo_ttft_ms`], …).
    fn uses_slo(&self) -> bool {
        false
    }

    /// `Some(τ)` when the policy reads [`Candidate::prefill_ms`] of the best pod overall and of
    /// the best pod whose prefix score exceeds τ (one more TTFT prediction for each).
    fn prices_prefill_above(&self) -> Option<f64> {
        None
    }

    /// Picks one of `candidates` (never empty when called by the router, but every policy
    /// returns [`PolicyError::NoCandidates`] rather than panicking if it is). `eligible` has one
    /// entry per candidate, all true on entry; a policy that narrows the set (the affinity gate)
    /// clears the entries it excluded, for the explanation.
    fn pick(
        &mut self,
        request: &RequestFacts,
        candidates: &[Candidate<'_>],
        eligible: &mut [bool],
        rng: &mut DecisionRng,
    ) -> Result<Pick, PolicyError>;
}

/// Every policy kvgate ships, by its CLI/config name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyKind {
    RoundRobin,
    Random,
    LeastRequest,
    LeastKv,
    Prefix,
    Weighted,
    SglangCacheAware,
    DynamoKv,
    Latency,
    AffinityGate,
    LlmdChain,
    LoraAffinity,
}

impl PolicyKind {
    pub const ALL: [PolicyKind; 12] = [
        PolicyKind::RoundRobin,
        PolicyKind::Random,
        PolicyKind::LeastRequest,
        PolicyKind::LeastKv,
        PolicyKind::Prefix,
        PolicyKind::Weighted,
        PolicyKind::SglangCacheAware,
        PolicyKind::DynamoKv,
        PolicyKind::Latency,
        PolicyKind::AffinityGate,
        PolicyKind::LlmdChain,
        PolicyKind::LoraAffinity,
    ];

    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::RoundRobin => "round-robin",
            PolicyKind::Random => "random",
            PolicyKind::LeastRequest => "least-request",
            PolicyKind::LeastKv => "least-kv",
            PolicyKind::Prefix => "prefix",
            PolicyKind::Weighted => "weighted",
            PolicyKind::SglangCacheAware => "sglang-cache-aware",
            PolicyKind::DynamoKv => "dynamo-kv",
            PolicyKind::Latency => "latency",
            PolicyKind::AffinityGate => "affinity-gate",
            PolicyKind::LlmdChain => "llmd-chain",
            PolicyKind::LoraAffinity => "lora-affinity",
        }
    }

    pub fn from_name(name: &str) -> Option<PolicyKind> {
        PolicyKind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Builds the policy with the parameters from `config`.
    pub fn build(self, config: &RouterConfig) -> Box<dyn Policy> {
        match self {
            PolicyKind::RoundRobin => Box::new(round_robin::RoundRobin::default()),
            PolicyKind::Random => Box::new(random::RandomPick),
            PolicyKind::LeastRequest => Box::new(least_request::LeastRequest),
            PolicyKind::LeastKv => Box::new(least_kv::LeastKv),
            PolicyKind::Prefix => Box::new(prefix::MaxPrefix),
            PolicyKind::Weighted => Box::new(weighted::Weighted::new(config)),
            PolicyKind::SglangCacheAware => {
                Box::new(sglang_cache_aware::SglangCacheAware::new(config))
            }
            PolicyKind::DynamoKv => Box::new(dynamo_kv::DynamoKv::new(config)),
            PolicyKind::Latency => Box::new(latency::LowestLatency),
            PolicyKind::AffinityGate => Box::new(affinity_gate::AffinityGate::new(config)),
            PolicyKind::LlmdChain => Box::new(llmd_chain::LlmdChain::new(
                llmd_chain::LlmdChainParams::default(),
            )),
            PolicyKind::LoraAffinity => Box::new(lora_affinity::LoraAffinity::new(config)),
        }
    }
}

impl std::fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Index of the candidate minimising `key`, ties broken by the lower load, then the lower
/// index (so results are deterministic). Only candidates with `eligible[i]` are considered.
pub(crate) fn argmin_by(
    candidates: &[Candidate<'_>],
    eligible: &[bool],
    mut key: impl FnMut(&Candidate<'_>) -> f64,
) -> Option<usize> {
    let mut best: Option<(usize, f64, u32)> = None;
    for (i, c) in candidates.iter().enumerate() {
        if !eligible.get(i).copied().unwrap_or(false) {
            continue;
        }
        let k = key(c);
        let k = if k.is_nan() { f64::INFINITY } else { k };
        let load = c.pod.load_requests();
        let better = match best {
            None => true,
            Some((_, bk, bl)) => k < bk || (k == bk && load < bl),
        };
        if better {
            best = Some((i, k, load));
        }
    }
    best.map(|(i, _, _)| i)
}

#[cfg(test)]
pub(crate) mod testutil {
    //! Hand-built candidates for policy tests.
    use super::*;
    use rand::SeedableRng;

    /// A pod with the given load figures.
    pub fn pod(id: u32, running: u32, waiting: u32, kv_usage: f64) -> PodSnapshot {
        let mut p = PodSnapshot::idle(id, "test", 1000);
        p.running = running;
        p.waiting = waiting;
        p.kv_usage = kv_usage;
        p
    }

    pub fn cand(
        pod: &PodSnapshot,
        matched_blocks: u32,
        prompt_blocks: u32,
        ttft: f64,
    ) -> Candidate<'_> {
        Candidate {
            pod,
            matched_blocks,
            block_size_tokens: 16,
            prefix_score: crate::index::prefix_score(matched_blocks, prompt_blocks as usize),
            predicted_ttft_ms: ttft,
            predicted_tpot_ms: 10.0,
            adapter_fit: crate::adapters::AdapterFit::NoAdapter,
            adapter_cost_ms: 0.0,
            prefill_ms: 0.0,
        }
    }

    pub fn facts(prompt_blocks: usize) -> RequestFacts {
        RequestFacts {
            prompt_blocks,
            input_tokens: prompt_blocks as u32 * 16,
            block_size_tokens: 16,
            slo_ttft_ms: None,
            slo_tpot_ms: None,
            adapter: None,
            prefix_sharers: 0,
        }
    }

    pub fn rng(seed: u64) -> DecisionRng {
        DecisionRng::seed_from_u64(seed)
    }

    /// Runs one pick with a fresh eligibility vector; returns the pick and the vector.
    pub fn run(
        policy: &mut dyn Policy,
        request: &RequestFacts,
        candidates: &[Candidate<'_>],
        rng: &mut DecisionRng,
    ) -> (Result<Pick, PolicyError>, Vec<bool>) {
        let mut eligible = vec![true; candidates.len()];
        let pick = policy.pick(request, candidates, &mut eligible, rng);
        (pick, eligible)
    }
}

#[cfg(test)]
mod tests {
    use super::testutil::*;
    use super::*;

    #[test]
    fn every_policy_returns_an_error_on_an_empty_candidate_set() {
        let config = RouterConfig::default();
        for kind in PolicyKind::ALL {
            let mut policy = kind.build(&config);
            let (pick, _) = run(policy.as_mut(), &facts(4), &[], &mut rng(1));
            assert_eq!(pick, Err(PolicyError::NoCandidates), "{kind}");
        }
    }

    #[test]
    fn every_policy_picks_the_only_candidate() {
        let config = RouterConfig::default();
        let p = pod(0, 3, 1, 0.5);
        let cands = [cand(&p, 2, 4, 100.0)];
        for kind in PolicyKind::ALL {
            let mut policy = kind.build(&config);
            let (pick, _) = run(policy.as_mut(), &facts(4), &cands, &mut rng(1));
            assert_eq!(pick.unwrap().index, 0, "{kind}");
        }
    }

    #[test]
    fn policy_names_round_trip() {
        for kind in PolicyKind::ALL {
            assert_eq!(PolicyKind::from_name(kind.name()), Some(kind));
            let json = serde_json::to_string(&kind).unwrap();
            assert_eq!(json, format!("\"{}\"", kind.name()));
        }
        assert_eq!(PolicyKind::from_name("nope"), None);
    }

    #[test]
    fn argmin_breaks_ties_by_load_then_index() {
        let a = pod(0, 5, 0, 0.0);
        let b = pod(1, 2, 0, 0.0);
        let c = pod(2, 2, 0, 0.0);
        let cands = [
            cand(&a, 0, 1, 10.0),
            cand(&b, 0, 1, 10.0),
            cand(&c, 0, 1, 10.0),
        ];
        assert_eq!(
            argmin_by(&cands, &[true; 3], |c| c.predicted_ttft_ms),
            Some(1)
        );
        assert_eq!(
            argmin_by(&cands, &[true, false, true], |c| c.predicted_ttft_ms),
            Some(2)
        );
        assert_eq!(
            argmin_by(&cands, &[false; 3], |c| c.predicted_ttft_ms),
            None
        );
    }

    #[test]
    fn argmin_treats_nan_as_worst() {
        let a = pod(0, 0, 0, 0.0);
        let b = pod(1, 9, 0, 0.0);
        let cands = [cand(&a, 0, 1, f64::NAN), cand(&b, 0, 1, 50.0)];
        assert_eq!(
            argmin_by(&cands, &[true; 2], |c| c.predicted_ttft_ms),
            Some(1)
        );
    }
}
