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
