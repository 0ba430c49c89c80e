//! `least-request`: the candidate with the fewest requests (waiting + running as scraped, or
//! the router's own in-flight count when that is larger), ties to the lower index.
//!
//! No parameters. Peers: vLLM production-stack `least-loaded`, SGLang `least_load`.

use super::{Candidate, Pick, Policy, PolicyError, PolicyKind, RequestFacts, argmin_by};
use crate::DecisionRng;
use crate::decision::Branch;

#[derive(Debug, Default)]
pub struct LeastRequest;

impl Policy for LeastRequest {
    fn kind(&self) -> PolicyKind {
        PolicyKind::LeastRequest
    }

    fn pick(
        &mut self,
        _request: &RequestFacts,
        candidates: &[Candidate<'_>],
        eligible: &mut [bool],
        _rng: &mut DecisionRng,
    ) -> Result<Pick, PolicyError> {
        let index = argmin_by(candidates, eligible, |c| c.pod.load_requests() as f64)
            .ok_or(PolicyError::NoCandidates)?;
        Ok(Pick {
            index,
            branch: Branch::Reason("least_request"),
        })
    }
}
