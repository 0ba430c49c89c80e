//! `affinity-gate` (kvgate's default): the cache-aware affinity gate in front of greedy
//! predicted-latency routing (DESIGN.md §2).
//!
//! ```text
//! draw u ~ U[0, 1) from the decision RNG (always exactly one draw per decision)
//! if u < epsilon_explore_sticky:                     EXPLORE   argmin predicted TTFT, all pods
//! sticky = { p : prefix_score(p) > affinity_gate_tau }          (strictly above)
//! if sticky is empty:                                NO_STICKY argmin predicted TTFT, all pods
//! best_all    = min predicted TTFT over all pods
//! best_sticky = min predicted TTFT over sticky pods
//! if penalty > 0 and best_sticky − best_all > penalty: LOAD_BREAK argmin over all pods
//! else:                                              EXPLOIT   argmin predicted TTFT, sticky pods
//! ```
//!
//! Exactly at the penalty affinity is kept; only a difference strictly above it breaks
//! affinity. Ties in predicted TTFT go to the pod with fewer requests, then the lower index.
//!
//! Why: greedy latency alone scatters prefixes over all pods (cache fragmentation); always
//! following the best cache match piles popular prefixes onto few pods (hot spots). The gate
//! keeps conversations on the pods that hold them, the ε coin seeds caches elsewhere, and the
//! load gate lets queueing on a hot pod override its cache benefit.
//!
//! Parameters (defaults from llm-d's predicted-latency scorer, GIE `scorer.go` `DefaultConfig`):
//! - `epsilon_explore_sticky` = 0.01  (probability of skipping the gate)
//! - `affinity_gate_tau` = 0.80       (score a pod must exceed to be sticky; multi-turn scores
//!   are bimodal, near 0 or near 1, and 0.80 separates the modes)
//! - `affinity_max_ttft_penalty_ms` = 5000 (load gate; 0 disables it, as upstream)

use super::{Candidate, Pick, Policy, PolicyError, PolicyKind, RequestFacts, argmin_by};
use crate::DecisionRng;
use crate::config::RouterConfig;
use crate::decision::Branch;
use rand::RngExt;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AffinityGate {
    pub affinity_gate_tau: f64,
    pub epsilon_explore_sticky: f64,
    pub affinity_max_ttft_penalty_ms: f64,
}

impl AffinityGate {
    pub fn new(config: &RouterConfig) -> Self {
        AffinityGate {
            affinity_gate_tau: config.affinity_gate_tau,
            epsilon_explore_sticky: config.epsilon_explore_sticky,
            affinity_max_ttft_penalty_ms: config.affinity_max_ttft_penalty_ms,
        }
    }
}

impl Policy for AffinityGate {
    fn kind(&self) -> PolicyKind {
        PolicyKind::AffinityGate
    }

    fn pick(
        &mut self,
        _request: &RequestFacts,
        candidates: &[Candidate<'_>],
        eligible: &mut [bool],
        rng: &mut DecisionRng,
    ) -> Result<Pick, PolicyError> {
        let ttft = |c: &Candidate<'_>| c.predicted_ttft_ms;
        let best_all = argmin_by(candidates, eligible, ttft).ok_or(PolicyError::NoCandidates)?;

        let explore = rng.random::<f64>() < self.epsilon_explore_sticky;
        if explore {
            return Ok(Pick {
                index: best_all,
                branch: Branch::Explore,
            });
        }

        let mut any_sticky = false;
        for (e, c) in eligible.iter_mut().zip(candidates) {
            *e = c.prefix_score > self.affinity_gate_tau;
            any_sticky |= *e;
        }
        if !any_sticky {
            eligible.fill(true);
            return Ok(Pick {
                index: best_all,
                branch: Branch::NoSticky,
            });
        }
        let best_sticky = argmin_by(candidates, eligible, ttft).ok_or(PolicyError::NoCandidates)?;

        let penalty = self.affinity_max_ttft_penalty_ms;
        let excess =
            candidates[best_sticky].predicted_ttft_ms - candidates[best_all].predicted_ttft_ms;
        if penalty > 0.0 && excess > penalty {
            eligible.fill(true);
            return Ok(Pick {
                index: best_all,
                branch: Branch::LoadBreak,
            });
        }
        Ok(Pick {
            index: best_sticky,
            branch: Branch::Exploit,
        })
    }
}
