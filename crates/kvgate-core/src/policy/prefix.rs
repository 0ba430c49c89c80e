//! `prefix`: the candidate holding the longest prompt prefix (highest prefix score), ties by
//! fewer requests, then the lower index. Pure cache affinity: the hot-spotting extreme of
//! DESIGN.md §1.
//!
//! No parameters. Peer: llm-d's `prefix-cache-scorer` with a max-score picker.

use super::{Candidate, Pick, Policy, PolicyError, PolicyKind, RequestFacts, argmin_by};
use crate::DecisionRng;
use crate::decision::Branch;

#[derive(Debug, Default)]
pub struct MaxPrefix;

impl Policy for MaxPrefix {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Prefix
    }

    fn pick(
        &mut self,
        _request: &RequestFacts,
        candidates: &[Candidate<'_>],
        eligible: &mut [bool],
        _rng: &mut DecisionRng,
    ) -> Result<Pick, PolicyError> {
        let index = argmin_by(candidates, eligible, |c| -(c.matched_blocks as f64))
            .ok_or(PolicyError::NoCandidates)?;
        let reason = if candidates[index].matched_blocks > 0 {
            "cache_hit"
        } else {
            "no_hit"
        };
        Ok(Pick {
            index,
            branch: Branch::Reason(reason),
        })
    }
}
