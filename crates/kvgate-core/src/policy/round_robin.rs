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
