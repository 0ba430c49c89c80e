//! The decision pipeline the drivers call: blocks → prefix scores → predictions → policy →
//! [`Decision`]. Owns the policy and nothing stateful besides it; the index and the predictor
//! are passed in, so the gateway and the simulator decide with exactly the same code.

use crate::DecisionRng;
use crate::blocks::{BlockHash, BlockHasher};
use crate::config::RouterConfig;
use crate::decision::{Decision, PodExplanation};
use crate::index::{PrefixIndex, prefix_score};
use crate::pod::PodSnapshot;
use crate::policy::{Candidate, Policy, PolicyError, PolicyKind, RequestFacts, RequestSlo};
use crate::predictor::{Features, LatencyPredictor};
use crate::request::ParsedRequest;

pub struct Router {
    config: RouterConfig,
    hasher: BlockHasher,
    policy: Box<dyn Policy>,
    matched: Vec<u32>,
    eligible: Vec<bool>,
}

impl Router {
    pub fn new(config: RouterConfig, policy: PolicyKind) -> Self {
        Router {
            hasher: BlockHasher {
                block_size_tokens: config.block_size_tokens,
                chars_per_token: config.chars_per_token,
            },
            policy: policy.build(&config),
            config,
            matched: Vec::new(),
            eligible: Vec::new(),
        }
    }

    pub fn config(&self) -> &RouterConfig {
        &self.config
    }

    pub fn policy_kind(&self) -> PolicyKind {
        self.policy.kind()
    }

    pub fn hasher(&self) -> BlockHasher {
        self.hasher
    }

    /// Clears `out` and fills it with the chained block hashes of a request.
    pub fn hash_request(&self, request: &ParsedRequest, out: &mut Vec<BlockHash>) {
        self.hasher.hash_request(request, out);
    }

    /// One full decision over the healthy pods of `pods`.
    pub fn decide(
        &mut self,
        blocks: &[BlockHash],
        input_tokens: u32,
        pods: &[PodSnapshot],
        index: &dyn PrefixIndex,
        predictor: &LatencyPredictor,
        rng: &mut DecisionRng,
    ) -> Result<Decision, PolicyError> {
        let (facts, candidates) = self.evaluate(blocks, input_tokens, pods, index, predictor);
        self.choose(&facts, &candidates, rng)
    }

    /// [`Router::decide`] for a request with latency objectives: policies that use them (the
    /// affinity gate's SLO mode) pick by headroom; the others ignore them.
    #[allow(clippy::too_many_arguments)]
    pub fn decide_with_slo(
        &mut self,
        blocks: &[BlockHash],
        input_tokens: u32,
        slo: RequestSlo,
        pods: &[PodSnapshot],
        index: &dyn PrefixIndex,
        predictor: &LatencyPredictor,
        rng: &mut DecisionRng,
    ) -> Result<Decision, PolicyError> {
        let (mut facts, candidates) = self.evaluate(blocks, input_tokens, pods, index, predictor);
        let slo = slo.sanitized();
        facts.slo_ttft_ms = slo.ttft_ms;
        facts.slo_tpot_ms = slo.tpot_ms;
        self.choose(&facts, &candidates, rng)
    }

    /// Scores and predicts every healthy pod; the first half of [`Router::decide`]. Exposed so
    /// that `kvgate decide` can pin scores or predictions before the policy runs.
    pub fn evaluate<'p>(
        &mut self,
        blocks: &[BlockHash],
        input_tokens: u32,
        pods: &'p [PodSnapshot],
        index: &dyn PrefixIndex,
        predictor: &LatencyPredictor,
    ) -> (RequestFacts, Vec<Candidate<'p>>) {
        index.match_prefix(blocks, &mut self.matched);
        let facts = RequestFacts {
            prompt_blocks: blocks.len(),
            input_tokens,
            block_size_tokens: self.config.block_size_tokens,
            slo_ttft_ms: None,
            slo_tpot_ms: None,
        };
        let candidates = pods
            .iter()
            .filter(|p| p.healthy)
            .map(|pod| {
                let matched_blocks = self.matched.get(pod.id.index()).copied().unwrap_or(0);
                let score = prefix_score(matched_blocks, blocks.len());
                let prediction =
                    predictor.predict(&pod.class, &Features::new(pod, input_tokens, score));
                Candidate {
                    pod,
                    matched_blocks,
                    prefix_score: score,
                    predicted_ttft_ms: prediction.ttft_ms,
                    predicted_tpot_ms: prediction.tpot_ms,
                }
            })
            .collect();
        (facts, candidates)
    }

    /// Runs the policy over evaluated candidates; the second half of [`Router::decide`].
    pub fn choose(
        &mut self,
        facts: &RequestFacts,
        candidates: &[Candidate<'_>],
        rng: &mut DecisionRng,
    ) -> Result<Decision, PolicyError> {
        if candidates.is_empty() {
            return Err(PolicyError::NoCandidates);
        }
        self.eligible.clear();
        self.eligible.resize(candidates.len(), true);
        let pick = self
            .policy
            .pick(facts, candidates, &mut self.eligible, rng)?;
        let chosen = candidates
            .get(pick.index)
            .ok_or(PolicyError::NoCandidates)?;
        Ok(Decision {
            pod: chosen.pod.name.clone(),
            pod_id: chosen.pod.id,
            branch: pick.branch,
            pods: candidates
                .iter()
                .zip(&self.eligible)
                .map(|(c, &eligible)| PodExplanation {
                    id: c.pod.name.clone(),
                    prefix_score: c.prefix_score,
                    predicted_ttft_ms: c.predicted_ttft_ms,
                    predicted_tpot_ms: c.predicted_tpot_ms,
                    eligible,
                })
                .collect(),
        })
    }
}
