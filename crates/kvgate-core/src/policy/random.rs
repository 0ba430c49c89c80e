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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testutil::*;

    #[test]
    fn spreads_uniformly_and_repeats_under_the_same_seed() {
        let pods: Vec<_> = (0..4).map(|i| pod(i, 0, 0, 0.0)).collect();
        let cands: Vec<_> = pods.iter().map(|p| cand(p, 0, 1, 1.0)).collect();
        let picks = |seed| {
            let mut r = rng(seed);
            (0..4000)
                .map(|_| {
                    run(&mut RandomPick, &facts(1), &cands, &mut r)
                        .0
                        .unwrap()
                        .index
                })
                .collect::<Vec<_>>()
        };
        let a = picks(5);
        assert_eq!(a, picks(5));
        for pod in 0..4 {
            let n = a.iter().filter(|&&i| i == pod).count();
            // Binomial(4000, 0.25): sigma ≈ 27; 4 sigma ≈ 110.
            assert!((890..=1110).contains(&n), "pod {pod} got {n}");
        }
    }
}
