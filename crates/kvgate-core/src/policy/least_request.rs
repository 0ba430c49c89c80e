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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testutil::*;

    #[test]
    fn picks_the_pod_with_fewest_requests_counting_in_flight() {
        let a = pod(0, 2, 1, 0.0); // 3 scraped
        let mut b = pod(1, 0, 0, 0.0); // scrape says idle, but we sent it 5
        b.in_flight.requests = 5;
        let c = pod(2, 4, 0, 0.0); // 4
        let cands = [
            cand(&a, 0, 1, 1.0),
            cand(&b, 0, 1, 1.0),
            cand(&c, 0, 1, 1.0),
        ];
        let (pick, _) = run(&mut LeastRequest, &facts(1), &cands, &mut rng(1));
        assert_eq!(
            pick.unwrap(),
            Pick {
                index: 0,
                branch: Branch::Reason("least_request")
            }
        );
    }
}
