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
