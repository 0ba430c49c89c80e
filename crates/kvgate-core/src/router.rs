//! The decision pipeline the drivers call: blocks → prefix scores → predictions → policy →
//! [`Decision`]. Owns the policy and, when the affinity gate's shared-prefix exploration is on,
//! the prefix-popularity sketch it reads ([`PrefixPopularity`], 128 KiB); the index and the
//! predictor are passed in, so the gateway and the simulator decide with exactly the same code.

use crate::DecisionRng;
use crate::adapters::{AdapterId, adapter_cost_ms, adapter_fit};
use crate::blocks::{BlockHash, BlockHasher, SizedBlocks};
use crate::config::RouterConfig;
use crate::decision::{Decision, PodExplanation, SloExplanation};
use crate::index::popularity::PrefixPopularity;
use crate::index::{PrefixIndex, prefix_score};
use crate::pod::{PodId, PodSnapshot};
use crate::policy::{
    Candidate, Policy, PolicyError, PolicyKind, RequestFacts, RequestSlo, argmin_by,
};
use crate::predictor::{Features, LatencyPredictor};
use crate::request::ParsedRequest;

/// A prompt as the router scores it: its block chain at the main block size, and at every other
/// block size a pod of the fleet caches in. A pod whose [`PodSnapshot::block_size_tokens`] equals
/// one of `other_sizes` is scored against that chain; every other pod against `blocks`.
#[derive(Debug, Clone, Copy)]
pub struct PromptCut<'a> {
    pub blocks: &'a [BlockHash],
    /// Tokens per block in `blocks`.
    pub block_size_tokens: u32,
    /// The same prompt at other block sizes (none in routed mode or a uniform fleet).
    pub other_sizes: &'a [SizedBlocks],
    /// The LoRA adapter the request names (its `model`; the blocks are already seeded by it):
    /// each pod's fit for it adds its cost to the pod's predicted TTFT ([`crate::adapters`]).
    pub adapter: Option<AdapterId>,
}

impl<'a> PromptCut<'a> {
    /// One block size for every pod.
    pub fn uniform(blocks: &'a [BlockHash], block_size_tokens: u32) -> Self {
        PromptCut {
            blocks,
            block_size_tokens,
            other_sizes: &[],
            adapter: None,
        }
    }

    /// Which chain `pod` is scored against: `None` for `blocks`, `Some(i)` for `other_sizes[i]`.
    fn chain_of(&self, pod: &PodSnapshot) -> Option<usize> {
        let size = pod.block_size_tokens?;
        if size == self.block_size_tokens {
            return None;
        }
        self.other_sizes
            .iter()
            .position(|s| s.block_size_tokens == size)
    }

    /// The chain `pod` is scored against and its block size.
    pub fn blocks_for(&self, pod: &PodSnapshot) -> (&'a [BlockHash], u32) {
        match self.chain_of(pod) {
            Some(i) => (
                &self.other_sizes[i].blocks,
                self.other_sizes[i].block_size_tokens,
            ),
            None => (self.blocks, self.block_size_tokens),
        }
    }
}

/// The share of the prompt `matched_blocks` leading blocks of a pod cover. A pod of another
/// block size is scored by the tokens it holds over the tokens of the main chain, so pods of
/// different block sizes compare (a 255-token prompt: 16-token pod 15 of 15 blocks = 240 tokens
/// = 1.0; 128-token pod 1 of 1 block = 128 of 240 tokens = 0.53, not 1.0). Same as the block
/// fraction when the pod's size is the main one.
#[inline]
fn held_score(
    cut: &PromptCut<'_>,
    matched_blocks: u32,
    prompt_blocks: usize,
    block_size_tokens: u32,
) -> f64 {
    if block_size_tokens == cut.block_size_tokens {
        return prefix_score(matched_blocks, prompt_blocks);
    }
    let main_tokens = cut.blocks.len() as f64 * f64::from(cut.block_size_tokens);
    let held = f64::from(matched_blocks) * f64::from(block_size_tokens);
    if main_tokens > 0.0 {
        (held / main_tokens).min(1.0)
    } else {
        0.0
    }
}

/// Of `matched` leading blocks on `pod`, those the pod has computed: `caps` holds, per pod id,
/// the first block still being computed there ([`crate::session::prefilling::Prefilling::caps`];
/// no entry: none).
pub fn computed(matched: u32, caps: &[u32], pod: PodId) -> u32 {
    caps.get(pod.index())
        .map_or(matched, |&cap| matched.min(cap))
}

/// A decision's pick as the router keeps it for the driver.
#[derive(Debug, Clone, Copy)]
struct Chosen {
    pod: crate::pod::PodId,
    /// Leading blocks it holds in the chain of its own block size.
    matched_blocks: u32,
    /// Its index in the candidates, and so in [`Decision::pods`].
    explanation: usize,
}

pub struct Router {
    config: RouterConfig,
    hasher: BlockHasher,
    policy: Box<dyn Policy>,
    /// Leading blocks matched per pod id, against the main chain…
    matched: Vec<u32>,
    /// …and against each of [`PromptCut::other_sizes`] (reused between decisions).
    matched_other: Vec<Vec<u32>>,
    /// Of `matched`, the blocks that were pending routes (engine mode; empty when none).
    pending_matched: Vec<u32>,
    /// The same per other block size of the fleet, with those sizes (in `PromptCut::other_sizes`
    /// order): a pod scored at its own block size reports its own pending blocks.
    pending_other: Vec<(u32, Vec<u32>)>,
    /// Per pod id, the first block of the prompt still being computed there
    /// ([`crate::session::prefilling`]; filled by the session before each decision with
    /// `predict_computed_prefix`, empty otherwise): predictions count the prefix as cached up
    /// to it only.
    prefill_caps: Vec<u32>,
    /// The last decision's pick (one write per decision, not per pod: the decision is the hot
    /// path).
    chosen: Option<Chosen>,
    eligible: Vec<bool>,
    /// Each candidate's features, kept while the policy prices moves
    /// ([`Policy::prices_prefill_above`]; reused between decisions).
    features: Vec<Features>,
    /// How many recent requests carried each block: counted by every decision, read for
    /// [`RequestFacts::prefix_sharers`] (only with the affinity gate's `shared_prefix_epsilon`).
    popularity: Option<Box<PrefixPopularity>>,
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
            matched_other: Vec::new(),
            pending_matched: Vec::new(),
            pending_other: Vec::new(),
            prefill_caps: Vec::new(),
            chosen: None,
            eligible: Vec::new(),
            features: Vec::new(),
            popularity: (policy == PolicyKind::AffinityGate && config.shared_prefix_epsilon > 0.0)
                .then(Box::default),
        }
    }

    /// Carries the prefix-popularity counts over from the router this one replaces (a config
    /// reload), when both count.
    pub fn keep_popularity_from(&mut self, old: Router) {
        if self.popularity.is_some() && old.popularity.is_some() {
            self.popularity = old.popularity;
        }
    }

    /// The prefix-popularity count [`Router::evaluate`] would give this prompt's first
    /// `matched_blocks` blocks (0 when the router does not count).
    pub fn prefix_sharers(&self, blocks: &[BlockHash], matched_blocks: usize) -> u32 {
        self.popularity
            .as_ref()
            .map_or(0, |p| p.sharers(blocks, matched_blocks))
    }

    /// The affinity gate's τ and ε in force (`None` for other policies).
    pub fn gate_state(&self) -> Option<crate::decision::GateState> {
        self.policy.gate_state()
    }

    pub fn config(&self) -> &RouterConfig {
        &self.config
    }

    pub fn policy_kind(&self) -> PolicyKind {
        self.policy.kind()
    }

    /// Whether the policy reads requests' objectives (llm-d's chain does, as upstream; kvgate's
    /// gate does not: docs/decisions/slo-routing.md).
    pub fn uses_slo(&self) -> bool {
        self.policy.uses_slo()
    }

    pub fn hasher(&self) -> BlockHasher {
        self.hasher
    }

    /// Leading blocks of the last decided request that the chosen `pod` holds in the chain of
    /// its own block size, as the index said (0 for any other pod). Read after
    /// [`Router::decide`] for the chosen pod's charge.
    pub fn matched_blocks(&self, pod: crate::pod::PodId) -> u32 {
        match self.chosen {
            Some(c) if c.pod == pod => c.matched_blocks,
            _ => 0,
        }
    }

    /// The prompt blocks still being computed per pod id, for the next decision (see
    /// [`crate::session::prefilling`]); the session fills it, or leaves it empty.
    pub fn prefill_caps_mut(&mut self) -> &mut Vec<u32> {
        &mut self.prefill_caps
    }

    /// The blocks of the prompt the chosen `pod` has computed: its matched blocks, less any
    /// still being computed there (0 for any other pod).
    pub fn computed_blocks(&self, pod: crate::pod::PodId) -> u32 {
        computed(self.matched_blocks(pod), &self.prefill_caps, pod)
    }

    /// Where the chosen `pod` is in the last decision's [`Decision::pods`] (`None` for any
    /// other pod): its explanation without a search by name.
    pub fn chosen_explanation(&self, pod: crate::pod::PodId) -> Option<usize> {
        self.chosen.filter(|c| c.pod == pod).map(|c| c.explanation)
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
        let cut = PromptCut::uniform(blocks, self.config.block_size_tokens);
        self.decide_cut(cut, input_tokens, None, pods, index, predictor, rng)
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
        let cut = PromptCut::uniform(blocks, self.config.block_size_tokens);
        self.decide_cut(cut, input_tokens, Some(slo), pods, index, predictor, rng)
    }

    /// [`Router::decide`] (or, with `slo`, [`Router::decide_with_slo`]) for a prompt cut at
    /// each block size of the fleet: every pod is scored against the chain of its own size.
    #[allow(clippy::too_many_arguments)]
    pub fn decide_cut(
        &mut self,
        cut: PromptCut<'_>,
        input_tokens: u32,
        slo: Option<RequestSlo>,
        pods: &[PodSnapshot],
        index: &dyn PrefixIndex,
        predictor: &LatencyPredictor,
        rng: &mut DecisionRng,
    ) -> Result<Decision, PolicyError> {
        let (mut facts, candidates) = self.evaluate_cut(cut, input_tokens, pods, index, predictor);
        if let Some(slo) = slo {
            let slo = slo.sanitized();
            facts.slo_ttft_ms = slo.ttft_ms;
            facts.slo_tpot_ms = slo.tpot_ms;
        }
        let decision = self.choose(&facts, &candidates, rng)?;
        if let Some(popularity) = &mut self.popularity {
            popularity.record(cut.blocks);
        }
        Ok(decision)
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
        let cut = PromptCut::uniform(blocks, self.config.block_size_tokens);
        self.evaluate_cut(cut, input_tokens, pods, index, predictor)
    }

    /// [`Router::evaluate`] for a prompt cut at each block size of the fleet.
    pub fn evaluate_cut<'p>(
        &mut self,
        cut: PromptCut<'_>,
        input_tokens: u32,
        pods: &'p [PodSnapshot],
        index: &dyn PrefixIndex,
        predictor: &LatencyPredictor,
    ) -> (RequestFacts, Vec<Candidate<'p>>) {
        index.match_prefix(cut.blocks, &mut self.matched);
        index.pending_matched(&mut self.pending_matched);
        if self.matched_other.len() < cut.other_sizes.len() {
            self.matched_other
                .resize_with(cut.other_sizes.len(), Vec::new);
        }
        self.pending_other
            .resize_with(cut.other_sizes.len(), Default::default);
        for ((sized, matched), (size, pending)) in cut
            .other_sizes
            .iter()
            .zip(&mut self.matched_other)
            .zip(&mut self.pending_other)
        {
            index.match_prefix(&sized.blocks, matched);
            index.pending_matched(pending);
            *size = sized.block_size_tokens;
        }
        self.chosen = None;
        let mut facts = RequestFacts {
            prompt_blocks: cut.blocks.len(),
            input_tokens,
            block_size_tokens: cut.block_size_tokens,
            slo_ttft_ms: None,
            slo_tpot_ms: None,
            adapter: cut.adapter,
            prefix_sharers: 0,
        };
        let lora = (
            self.config.lora_aware,
            self.config.lora_load_ms,
            self.config.lora_deferral_ms,
        );
        let (matched, matched_other) = (&self.matched, &self.matched_other);
        let prefill_caps = &self.prefill_caps;
        let priced_above = self.policy.prices_prefill_above();
        let features_kept = &mut self.features;
        features_kept.clear();
        // Sized once: a filtered iterator's collect would grow (and copy) it log2(pods) times.
        let mut candidates = Vec::with_capacity(pods.len());
        candidates.extend(pods.iter().filter(|p| p.healthy).map(|pod| {
            let (matched, prompt_blocks, block_size_tokens) = match cut.chain_of(pod) {
                Some(i) => (
                    &matched_other[i],
                    cut.other_sizes[i].blocks.len(),
                    cut.other_sizes[i].block_size_tokens,
                ),
                None => (matched, cut.blocks.len(), cut.block_size_tokens),
            };
            let matched_blocks = matched.get(pod.id.index()).copied().unwrap_or(0);
            // The share of the prompt the pod holds ([`held_score`]).
            let score = held_score(&cut, matched_blocks, prompt_blocks, block_size_tokens);
            let computed_score = match computed(matched_blocks, prefill_caps, pod.id) {
                c if c == matched_blocks => score,
                c => held_score(&cut, c, prompt_blocks, block_size_tokens),
            };
            let features = Features::new(pod, input_tokens, computed_score);
            let prediction = predictor.predict(&pod.class, &features);
            if priced_above.is_some() {
                features_kept.push(features);
            }
            let adapter_fit = adapter_fit(pod.lora.as_ref(), cut.adapter);
            let adapter_cost_ms = match (lora, &pod.lora) {
                ((true, load_ms, deferral_ms), Some(slots)) => {
                    adapter_cost_ms(adapter_fit, slots.deferred, load_ms, deferral_ms)
                }
                _ => 0.0,
            };
            Candidate {
                pod,
                matched_blocks,
                block_size_tokens,
                prefix_score: score,
                predicted_ttft_ms: prediction.ttft_ms + adapter_cost_ms,
                predicted_tpot_ms: prediction.tpot_ms,
                adapter_fit,
                adapter_cost_ms,
                prefill_ms: 0.0,
            }
        }));
        if let Some(tau) = priced_above {
            self.price_prefill(&mut candidates, tau, predictor);
        }
        if self.popularity.is_some() {
            // The deepest main-chain prefix any healthy pod holds.
            let deepest = candidates
                .iter()
                .filter(|c| c.block_size_tokens == cut.block_size_tokens)
                .map(|c| c.matched_blocks as usize)
                .max()
                .unwrap_or(0);
            facts.prefix_sharers = self.prefix_sharers(cut.blocks, deepest);
        }
        (facts, candidates)
    }

    /// The pending blocks behind `c`'s score, from the chain of its block size.
    fn pending_blocks_of(&self, c: &Candidate<'_>, main_block_size: u32) -> u32 {
        let pending = match c.block_size_tokens == main_block_size {
            true => Some(&self.pending_matched),
            false => self
                .pending_other
                .iter()
                .find(|(size, _)| *size == c.block_size_tokens)
                .map(|(_, pending)| pending),
        };
        pending
            .and_then(|p| p.get(c.pod.id.index()).copied())
            .unwrap_or(0)
    }

    /// Fills [`Candidate::prefill_ms`] of the best pod overall and of the best pod whose prefix
    /// score exceeds `tau`, as the policy's argmin will find them (the features were kept in
    /// `self.features` in candidate order).
    fn price_prefill(
        &mut self,
        candidates: &mut [Candidate<'_>],
        tau: f64,
        predictor: &LatencyPredictor,
    ) {
        self.eligible.clear();
        self.eligible.resize(candidates.len(), true);
        let best_all = argmin_by(candidates, &self.eligible, |c| c.predicted_ttft_ms);
        for (e, c) in self.eligible.iter_mut().zip(candidates.iter()) {
            *e = c.prefix_score > tau;
        }
        let best_sticky = argmin_by(candidates, &self.eligible, |c| c.predicted_ttft_ms);
        for i in [best_all, best_sticky].into_iter().flatten() {
            let class = &candidates[i].pod.class;
            candidates[i].prefill_ms = predictor.own_prefill_ms(class, &self.features[i]);
        }
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
        self.chosen = Some(Chosen {
            pod: chosen.pod.id,
            matched_blocks: chosen.matched_blocks,
            explanation: pick.index,
        });
        // Pending routes scored this decision (engine mode with `engine_pending_ttl_ms` only).
        let any_pending = !self.pending_matched.is_empty()
            || self.pending_other.iter().any(|(_, p)| !p.is_empty());
        Ok(Decision {
            pod: chosen.pod.name.clone(),
            pod_id: chosen.pod.id,
            branch: pick.branch,
            pods: candidates
                .iter()
                .zip(&self.eligible)
                .map(|(c, &eligible)| PodExplanation {
                    pending_blocks: match any_pending {
                        false => 0,
                        true => self.pending_blocks_of(c, facts.block_size_tokens),
                    },
                    prefilling_blocks: if self.prefill_caps.is_empty() {
                        0
                    } else {
                        c.matched_blocks - computed(c.matched_blocks, &self.prefill_caps, c.pod.id)
                    },
                    id: c.pod.name.clone(),
                    prefix_score: c.prefix_score,
                    predicted_ttft_ms: c.predicted_ttft_ms,
                    predicted_tpot_ms: c.predicted_tpot_ms,
                    eligible,
                    adapter: c.adapter_fit,
                    adapter_cost_ms: c.adapter_cost_ms,
                })
                .collect(),
            slo: self.slo_explanation(facts, chosen),
            decode: None,
        })
    }

    /// The SLO part of the explanation, for a policy that routes by SLOs.
    fn slo_explanation(
        &self,
        facts: &RequestFacts,
        chosen: &Candidate<'_>,
    ) -> Option<SloExplanation> {
        if !self.policy.uses_slo() || (facts.slo_ttft_ms.is_none() && facts.slo_tpot_ms.is_none()) {
            return None;
        }
        let headroom_ttft_ms = facts.slo_ttft_ms.map(|s| s - chosen.predicted_ttft_ms);
        let headroom_tpot_ms = facts.slo_tpot_ms.map(|s| s - chosen.predicted_tpot_ms);
        Some(SloExplanation {
            ttft_ms: facts.slo_ttft_ms,
            tpot_ms: facts.slo_tpot_ms,
            headroom_ttft_ms,
            headroom_tpot_ms,
            predicted_to_meet: headroom_ttft_ms.is_none_or(|h| h >= 0.0)
                && headroom_tpot_ms.is_none_or(|h| h >= 0.0),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::routed::RoutedIndex;
    use crate::predictor::PredictorConfig;
    use crate::{PodId, PodSnapshot};

    #[test]
    fn a_policy_that_prices_moves_gets_the_prefill_of_the_two_pods_it_compares() {
        let blocks: Vec<BlockHash> = (1..=20).collect();
        let mut index = RoutedIndex::new();
        // Pod 1 holds the prompt; pod 0 and pod 2 hold nothing, pod 2 is the busier one.
        index.record_routed(PodId(1), &blocks);
        let mut pods: Vec<PodSnapshot> =
            (0..3).map(|i| PodSnapshot::idle(i, "c", 10_000)).collect();
        pods[2].in_flight.prefill_tokens = 4_000;
        let predictor = LatencyPredictor::new(PredictorConfig::default());
        let input_tokens = 20 * 16;

        let mut router = Router::new(RouterConfig::default(), PolicyKind::AffinityGate);
        let (_, candidates) = router.evaluate(&blocks, input_tokens, &pods, &index, &predictor);
        // Pod 1, holding the prompt, is both the best pod overall and the best sticky one.
        let best = argmin_by(&candidates, &[true; 3], |c| c.predicted_ttft_ms).unwrap();
        assert_eq!(best, 1);
        assert_eq!(
            candidates[1].prefill_ms, 0.0,
            "pod 1 holds the whole prompt"
        );
        // Only the compared pods are priced: pod 0 and pod 2 are neither.
        assert_eq!(
            (candidates[0].prefill_ms, candidates[2].prefill_ms),
            (0.0, 0.0)
        );

        // Pod 1 loaded: pod 0 is the best overall, and its prefill is priced.
        pods[1].in_flight.prefill_tokens = 40_000;
        let (_, candidates) = router.evaluate(&blocks, input_tokens, &pods, &index, &predictor);
        let best = argmin_by(&candidates, &[true; 3], |c| c.predicted_ttft_ms).unwrap();
        assert_eq!(best, 0);
        let features = Features::new(&pods[0], input_tokens, 0.0);
        let expected = predictor.own_prefill_ms("c", &features);
        assert!(expected > 0.0);
        assert_eq!(candidates[0].prefill_ms, expected);
        assert_eq!(candidates[1].prefill_ms, 0.0);
        assert_eq!(candidates[2].prefill_ms, 0.0);

        // The seed profile prices nothing.
        let mut seed = Router::new(RouterConfig::seed(), PolicyKind::AffinityGate);
        let (_, candidates) = seed.evaluate(&blocks, input_tokens, &pods, &index, &predictor);
        assert!(candidates.iter().all(|c| c.prefill_ms == 0.0));
    }

    /// An index whose pods all hold `held` of any chain, `pending` of them pending routes; it
    /// answers the chain of `pending_size` blocks (its length) with pending, the others with 0.
    struct PendingStub {
        held: u32,
        pending: u32,
        pending_chain_len: usize,
        last_len: std::cell::Cell<usize>,
    }

    impl PrefixIndex for PendingStub {
        fn match_prefix(&self, blocks: &[BlockHash], matched: &mut Vec<u32>) {
            self.last_len.set(blocks.len());
            matched.clear();
            matched.resize(2, self.held.min(blocks.len() as u32));
        }
        fn record_routed(&mut self, _: PodId, _: &[BlockHash]) {}
        fn pending_matched(&self, out: &mut Vec<u32>) {
            out.clear();
            if self.last_len.get() == self.pending_chain_len {
                out.resize(2, self.pending);
            }
        }
        fn set_capacity(&mut self, _: PodId, _: u32) {}
        fn remove_pod(&mut self, _: PodId) {}
        fn indexed_blocks(&self) -> usize {
            0
        }
    }

    #[test]
    fn a_pod_scored_at_its_own_block_size_reports_its_pending_blocks() {
        // The main chain at 16 tokens (64 blocks); pod 1 reports 128-token blocks (8 of them).
        let main: Vec<BlockHash> = (1..=64).collect();
        let other = [crate::blocks::SizedBlocks {
            block_size_tokens: 128,
            blocks: (100..108).collect(),
        }];
        let cut = PromptCut {
            blocks: &main,
            block_size_tokens: 16,
            other_sizes: &other,
            adapter: None,
        };
        let mut pods: Vec<PodSnapshot> =
            (0..2).map(|i| PodSnapshot::idle(i, "c", 10_000)).collect();
        pods[1].block_size_tokens = Some(128);
        // Pending routes only on the 128-token chain: pod 1 reports them, pod 0 (main) none.
        let index = PendingStub {
            held: 6,
            pending: 4,
            pending_chain_len: 8,
            last_len: Default::default(),
        };
        let predictor = LatencyPredictor::new(PredictorConfig::default());
        let mut router = Router::new(RouterConfig::default(), PolicyKind::AffinityGate);
        let decision = router
            .decide_cut(
                cut,
                1024,
                None,
                &pods,
                &index,
                &predictor,
                &mut <DecisionRng as rand::SeedableRng>::seed_from_u64(1),
            )
            .unwrap();
        let pending: Vec<u32> = decision.pods.iter().map(|p| p.pending_blocks).collect();
        assert_eq!(pending, vec![0, 4]);
        // And on the main chain: pod 0 reports them, pod 1 none.
        let index = PendingStub {
            pending_chain_len: 64,
            ..index
        };
        let decision = router
            .decide_cut(
                cut,
                1024,
                None,
                &pods,
                &index,
                &predictor,
                &mut <DecisionRng as rand::SeedableRng>::seed_from_u64(1),
            )
            .unwrap();
        let pending: Vec<u32> = decision.pods.iter().map(|p| p.pending_blocks).collect();
        assert_eq!(pending, vec![4, 0]);
    }
}
