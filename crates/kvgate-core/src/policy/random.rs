//! `random`: a uniformly random candidate, drawn from the caller's seeded RNG.
//!
//! No parameters. Baseline (SGLang `random`).

use super::{Candidate, Pick, Policy, PolicyError, PolicyKind, RequestFacts};
use crate::DecisionRng;
use crate::decision::Branch;
use rand::RngExt;

#[derive(Debug, Default)]
pub struct RandomPick;

impl Policy for RandomPick {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Random
    }

    fn pick(
        &mut self,
        _request: &RequestFacts,
        candidates: &[Candidate<'_>],
        _eligible: &mut [bool],
        rng: &mut DecisionRng,
    ) -> Result<Pick, PolicyError> {
        if candidates.is_empty() {
            return Err(PolicyError::NoCandidates);
        }
        let index = rng.random_range(0..candidates.len());
        Ok(Pick {
            index,
            branch: Branch::Reason("random"),
        })
    }
}
