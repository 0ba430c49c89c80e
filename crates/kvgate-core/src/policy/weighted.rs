//! `weighted`: llm-d's default scheduling profile without a predictor — a weighted sum of three
//! scorers, highest total wins (max-score picker), ties by fewer requests, then the lower index.
//!
//! ```text
//! prefix_scorer = prefix score                       (matched blocks / prompt blocks)
//! queue_scorer  = (max_q − q) / (max_q − min_q)      (1 for every pod when all queues are equal)
//! kv_scorer     = 1 − kv_usage
//! total         = (w_p·prefix + w_q·queue + w_kv·kv) / (w_p + w_q + w_kv)
//! ```
//!
//! `q` is the pod's request load ([`crate::PodSnapshot::load_requests`]).
//!
//! Parameters (defaults from llm-d's default `EndpointPickerConfig`, "prefix 3 : queue 2 : KV 2"):
//! - `weighted_prefix_weight` = 3
//! - `weighted_queue_weight` = 2
//! - `weighted_kv_weight` = 2

use super::{Candidate, Pick, Policy, PolicyError, PolicyKind, RequestFacts, argmin_by};
use crate::DecisionRng;
use crate::config::RouterConfig;
use crate::decision::Branch;

#[derive(Debug, Clone, Copy)]
pub struct Weighted {
    prefix_weight: f64,
    queue_weight: f64,
    kv_weight: f64,
}

impl Weighted {
    pub fn new(config: &RouterConfig) -> Self {
        Weighted {
            prefix_weight: config.weighted_prefix_weight,
            queue_weight: config.weighted_queue_weight,
            kv_weight: config.weighted_kv_weight,
        }
    }

    /// The combined score of one candidate, given the queue range over the candidates.
    pub fn score(&self, c: &Candidate<'_>, min_q: u32, max_q: u32) -> f64 {
        let q = c.pod.load_requests();
        let queue = if max_q > min_q {
            (max_q - q) as f64 / (max_q - min_q) as f64
        } else {
            1.0
        };
        let kv = 1.0 - c.pod.kv_usage.clamp(0.0, 1.0);
        let total = self.prefix_weight + self.queue_weight + self.kv_weight;
        (self.prefix_weight * c.prefix_score + self.queue_weight * queue + self.kv_weight * kv)
            / total
    }
}

impl Policy for Weighted {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Weighted
    }

    fn pick(
        &mut self,
        _request: &RequestFacts,
        candidates: &[Candidate<'_>],
        eligible: &mut [bool],
        _rng: &mut DecisionRng,
    ) -> Result<Pick, PolicyError> {
        pick_max_score(
            candidates,
            eligible,
            |c, min_q, max_q| self.score(c, min_q, max_q),
            "max_weighted_score",
        )
    }
}

/// The eligible candidate with the highest `score(c, min load, max load)` (loads in requests,
/// over every candidate), explained as `reason`: the pick of the weighted-scorer policies.
pub(crate) fn pick_max_score(
    candidates: &[Candidate<'_>],
    eligible: &mut [bool],
    score: impl Fn(&Candidate<'_>, u32, u32) -> f64,
    reason: &'static str,
) -> Result<Pick, PolicyError> {
    let loads = candidates.iter().map(|c| c.pod.load_requests());
    let min_q = loads.clone().min().ok_or(PolicyError::NoCandidates)?;
    let max_q = loads.max().ok_or(PolicyError::NoCandidates)?;
    let index = argmin_by(candidates, eligible, |c| -score(c, min_q, max_q))
        .ok_or(PolicyError::NoCandidates)?;
    Ok(Pick {
        index,
        branch: Branch::Reason(reason),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testutil::*;

    #[test]
    fn score_combines_prefix_queue_and_kv_three_two_two() {
        let w = Weighted::new(&RouterConfig::default());
        let a = pod(0, 0, 0, 0.5);
        // prefix 1.0, queue (10−0)/(10−0) = 1, kv 0.5 → (3 + 2 + 1) / 7.
        let s = w.score(&cand(&a, 10, 10, 1.0), 0, 10);
        assert!((s - 6.0 / 7.0).abs() < 1e-12, "{s}");
    }

    #[test]
    fn a_full_cache_hit_outweighs_a_moderately_busier_queue() {
        let (a, b) = (pod(0, 4, 0, 0.3), pod(1, 0, 0, 0.3));
        // a: prefix 1, queue 0, kv .7 → 3 + 0 + 1.4 = 4.4; b: prefix 0, queue 1, kv .7 → 2 + 1.4 = 3.4
        let cands = [cand(&a, 10, 10, 1.0), cand(&b, 0, 10, 1.0)];
        let (pick, _) = run(
            &mut Weighted::new(&RouterConfig::default()),
            &facts(10),
            &cands,
            &mut rng(1),
        );
        assert_eq!(pick.unwrap().index, 0);
    }

    #[test]
    fn equal_queues_count_as_fully_free() {
        let w = Weighted::new(&RouterConfig::default());
        let a = pod(0, 3, 0, 0.0);
        let s = w.score(&cand(&a, 0, 10, 1.0), 3, 3);
        assert!((s - 4.0 / 7.0).abs() < 1e-12, "{s}");
    }
}
