//! `lora-affinity`: the peers' way of routing LoRA requests — llm-d's `weighted` profile with
//! the Gateway API Inference Extension's `lora-affinity-scorer` added, highest total wins
//! (max-score picker), ties by fewer requests, then the lower index.
//!
//! ```text
//! lora_scorer = 1.0 adapter active on the pod (or no adapter needed)
//!               0.8 a free adapter slot (running adapters < max_lora)
//!               0.0 otherwise
//! total       = (w_p·prefix + w_q·queue + w_kv·kv + w_lora·lora) / (w_p + w_q + w_kv + w_lora)
//! ```
//!
//! `prefix`, `queue` and `kv` are [`super::weighted`]'s scorers. Upstream's scorer also gives
//! 0.6 to a pod where the adapter is *waiting* to load; vLLM 0.32's `waiting_lora_adapters`
//! label always equals the running list (an upstream bug, `crate::adapters`), so that tier
//! cannot be told apart and is left out. The adapter's place on each pod is
//! [`crate::Candidate::adapter_fit`] (the metric plus what the router routed). Unlike the
//! affinity gate with `lora_aware`, it prices nothing: a pod with a free slot scores 0.8 however
//! long its queue.
//!
//! Parameters: `weighted_prefix_weight` 3, `weighted_queue_weight` 2, `weighted_kv_weight` 2
//! (llm-d's default `EndpointPickerConfig`), and the lora weight [`LORA_AFFINITY_WEIGHT`] = 4
//! (what KServe's `LLMInferenceService` gives llm-d's `lora-affinity-scorer` when it adds it to
//! the scheduler config for a model with adapters). Scorer values from GIE's
//! `lora_affinity.go`.

use super::weighted::Weighted;
use super::{Candidate, Pick, Policy, PolicyError, PolicyKind, RequestFacts};
use crate::DecisionRng;
use crate::adapters::AdapterFit;
use crate::config::RouterConfig;

/// Weight of the lora-affinity scorer (KServe's llm-d scheduler config).
pub const LORA_AFFINITY_WEIGHT: f64 = 4.0;

#[derive(Debug, Clone, Copy)]
pub struct LoraAffinity {
    weighted: Weighted,
    base_weight: f64,
}

impl LoraAffinity {
    pub fn new(config: &RouterConfig) -> Self {
        LoraAffinity {
            weighted: Weighted::new(config),
            base_weight: config.weighted_prefix_weight
                + config.weighted_queue_weight
                + config.weighted_kv_weight,
        }
    }

    /// GIE's lora-affinity score of one candidate.
    pub fn lora_score(fit: AdapterFit) -> f64 {
        match fit {
            AdapterFit::NoAdapter | AdapterFit::Resident => 1.0,
            AdapterFit::FreeSlot | AdapterFit::Evict => 0.8,
            AdapterFit::Full => 0.0,
        }
    }

    pub fn score(&self, c: &Candidate<'_>, min_q: u32, max_q: u32) -> f64 {
        let base = self.weighted.score(c, min_q, max_q) * self.base_weight;
        (base + LORA_AFFINITY_WEIGHT * Self::lora_score(c.adapter_fit))
            / (self.base_weight + LORA_AFFINITY_WEIGHT)
    }
}

impl Policy for LoraAffinity {
    fn kind(&self) -> PolicyKind {
        PolicyKind::LoraAffinity
    }

    fn pick(
        &mut self,
        _request: &RequestFacts,
        candidates: &[Candidate<'_>],
        eligible: &mut [bool],
        _rng: &mut DecisionRng,
    ) -> Result<Pick, PolicyError> {
        super::weighted::pick_max_score(
            candidates,
            eligible,
            |c, min_q, max_q| self.score(c, min_q, max_q),
            "max_lora_affinity_score",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testutil::*;

    #[test]
    fn at_equal_load_the_adapter_active_beats_a_free_slot_beats_a_full_pod() {
        let (a, b, c) = (pod(0, 0, 0, 0.2), pod(1, 0, 0, 0.2), pod(2, 0, 0, 0.2));
        let mut ca = cand(&a, 0, 10, 1.0);
        ca.adapter_fit = AdapterFit::Resident;
        let mut cb = cand(&b, 0, 10, 1.0);
        cb.adapter_fit = AdapterFit::FreeSlot;
        let mut cc = cand(&c, 0, 10, 1.0);
        cc.adapter_fit = AdapterFit::Full;
        let mut policy = LoraAffinity::new(&RouterConfig::default());
        // Equal queues: a (2 + 1.6 + 4) / 11 > b (2 + 1.6 + 3.2) / 11 > c (2 + 1.6) / 11.
        let (pick, _) = run(&mut policy, &facts(10), &[ca, cb, cc], &mut rng(1));
        assert_eq!(pick.unwrap().index, 0);
        let (pick, _) = run(&mut policy, &facts(10), &[cb, cc], &mut rng(1));
        assert_eq!(pick.unwrap().index, 0);
    }

    #[test]
    fn an_idle_pod_with_a_free_slot_beats_a_busier_pod_with_the_adapter() {
        let (a, b) = (pod(0, 2, 0, 0.2), pod(1, 0, 0, 0.2));
        let mut ca = cand(&a, 0, 10, 1.0);
        ca.adapter_fit = AdapterFit::Resident;
        let mut cb = cand(&b, 0, 10, 1.0);
        cb.adapter_fit = AdapterFit::FreeSlot;
        // a: (0 + 1.6 + 4) / 11 = 0.51; b: (2 + 1.6 + 3.2) / 11 = 0.62: the queue decides.
        let mut policy = LoraAffinity::new(&RouterConfig::default());
        let (pick, _) = run(&mut policy, &facts(10), &[ca, cb], &mut rng(1));
        assert_eq!(pick.unwrap().index, 1);
    }
}
