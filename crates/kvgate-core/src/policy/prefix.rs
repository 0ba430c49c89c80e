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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testutil::*;

    #[test]
    fn picks_the_longest_match_even_when_loaded() {
        let (a, b) = (pod(0, 0, 0, 0.0), pod(1, 50, 20, 0.9));
        let cands = [cand(&a, 3, 10, 1.0), cand(&b, 7, 10, 1.0)];
        let (pick, _) = run(&mut MaxPrefix, &facts(10), &cands, &mut rng(1));
        assert_eq!(
            pick.unwrap(),
            Pick {
                index: 1,
                branch: Branch::Reason("cache_hit")
            }
        );
    }

    #[test]
    fn without_any_hit_falls_to_the_least_loaded() {
        let (a, b) = (pod(0, 4, 0, 0.0), pod(1, 1, 0, 0.0));
        let cands = [cand(&a, 0, 10, 1.0), cand(&b, 0, 10, 1.0)];
        let (pick, _) = run(&mut MaxPrefix, &facts(10), &cands, &mut rng(1));
        assert_eq!(
            pick.unwrap(),
            Pick {
                index: 1,
                branch: Branch::Reason("no_hit")
            }
        );
    }
}
