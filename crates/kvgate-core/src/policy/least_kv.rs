//! `least-kv`: the candidate with the lowest KV-cache usage (`vllm:kv_cache_usage_perc`), ties
//! by fewer requests, then the lower index.
//!
//! No parameters. Peer: llm-d's `kv-cache-utilization-scorer` used alone.

use super::{Candidate, Pick, Policy, PolicyError, PolicyKind, RequestFacts, argmin_by};
use crate::DecisionRng;
use crate::decision::Branch;

#[derive(Debug, Default)]
pub struct LeastKv;

impl Policy for LeastKv {
    fn kind(&self) -> PolicyKind {
        PolicyKind::LeastKv
    }

    fn pick(
        &mut self,
        _request: &RequestFacts,
        candidates: &[Candidate<'_>],
        eligible: &mut [bool],
        _rng: &mut DecisionRng,
    ) -> Result<Pick, PolicyError> {
        let index =
            argmin_by(candidates, eligible, |c| c.pod.kv_usage).ok_or(PolicyError::NoCandidates)?;
        Ok(Pick {
            index,
            branch: Branch::Reason("least_kv"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testutil::*;

    #[test]
    fn picks_the_lowest_kv_usage_ties_by_load() {
        let (a, b, c) = (pod(0, 1, 0, 0.6), pod(1, 5, 0, 0.2), pod(2, 3, 0, 0.2));
        let cands = [
            cand(&a, 0, 1, 1.0),
            cand(&b, 0, 1, 1.0),
            cand(&c, 0, 1, 1.0),
        ];
        let (pick, _) = run(&mut LeastKv, &facts(1), &cands, &mut rng(1));
        assert_eq!(pick.unwrap().index, 2);
    }
}
