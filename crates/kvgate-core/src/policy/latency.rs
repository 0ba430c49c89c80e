//! `latency`: the candidate with the lowest predicted TTFT, no gate. Pure latency greed: the
//! cache-fragmenting extreme of DESIGN.md §1. Ties by fewer requests, then the lower index.
//!
//! No parameters (the predictor's own settings live in `predictor`).

use super::{Candidate, Pick, Policy, PolicyError, PolicyKind, RequestFacts, argmin_by};
use crate::DecisionRng;
use crate::decision::Branch;

#[derive(Debug, Default)]
pub struct LowestLatency;

impl Policy for LowestLatency {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Latency
    }

    fn pick(
        &mut self,
        _request: &RequestFacts,
        candidates: &[Candidate<'_>],
        eligible: &mut [bool],
        _rng: &mut DecisionRng,
    ) -> Result<Pick, PolicyError> {
        let index = argmin_by(candidates, eligible, |c| c.predicted_ttft_ms)
            .ok_or(PolicyError::NoCandidates)?;
        Ok(Pick {
            index,
            branch: Branch::Reason("lowest_ttft"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testutil::*;

    #[test]
    fn picks_the_lowest_predicted_ttft_ignoring_cache() {
        let (a, b) = (pod(0, 0, 0, 0.0), pod(1, 0, 0, 0.0));
        let cands = [cand(&a, 10, 10, 120.0), cand(&b, 0, 10, 80.0)];
        let (pick, _) = run(&mut LowestLatency, &facts(10), &cands, &mut rng(1));
        assert_eq!(pick.unwrap().index, 1);
    }
}
