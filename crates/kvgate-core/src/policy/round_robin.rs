//! `round-robin`: the i-th decision goes to candidate `i mod n`.
//!
//! No parameters. The counter belongs to the policy instance, so two routers do not share it.
//! Baseline of every peer router (SGLang `round_robin`, vLLM production-stack `roundrobin`).

use super::{Candidate, Pick, Policy, PolicyError, PolicyKind, RequestFacts};
use crate::DecisionRng;
use crate::decision::Branch;

#[derive(Debug, Default)]
pub struct RoundRobin {
    next: u64,
}

impl Policy for RoundRobin {
    fn kind(&self) -> PolicyKind {
        PolicyKind::RoundRobin
    }

    fn pick(
        &mut self,
        _request: &RequestFacts,
        candidates: &[Candidate<'_>],
        _eligible: &mut [bool],
        _rng: &mut DecisionRng,
    ) -> Result<Pick, PolicyError> {
        if candidates.is_empty() {
            return Err(PolicyError::NoCandidates);
        }
        let index = (self.next % candidates.len() as u64) as usize;
        self.next = self.next.wrapping_add(1);
        Ok(Pick {
            index,
            branch: Branch::Reason("round_robin"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testutil::*;

    #[test]
    fn cycles_through_candidates_in_order() {
        let pods: Vec<_> = (0..3).map(|i| pod(i, 0, 0, 0.0)).collect();
        let cands: Vec<_> = pods.iter().map(|p| cand(p, 0, 1, 1.0)).collect();
        let mut rr = RoundRobin::default();
        let picks: Vec<_> = (0..7)
            .map(|_| {
                run(&mut rr, &facts(1), &cands, &mut rng(1))
                    .0
                    .unwrap()
                    .index
            })
            .collect();
        assert_eq!(picks, vec![0, 1, 2, 0, 1, 2, 0]);
    }
}
