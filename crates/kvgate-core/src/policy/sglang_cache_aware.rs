//! `sglang-cache-aware`: the SGLang router's `cache_aware` policy.
//!
//! ```text
//! load(p)    = requests the router has in flight on p
//! imbalanced = (max load − min load) > balance_abs_threshold
//!              AND max load > balance_rel_threshold × min load
//! if imbalanced:                         the least-loaded pod              (reason "imbalanced")
//! else if best match rate > cache_threshold: the pod with the best match   (reason "cache_hit")
//! else:                                  the least-loaded pod              (reason "cache_miss")
//! ```
//!
//! Match rate is our prefix score (SGLang matches characters in a radix tree; we match the same
//! prompt in blocks). On a miss SGLang once picked the pod with the smallest tree; that ignored
//! load and caused a "death spiral" (sglang PR #14305), so we follow the later least-loaded rule.
//! Ties go to the lower load, then the lower index.
//!
//! Parameters (SGLang router CLI defaults, `sgl-model-gateway` launcher):
//! - `cache_threshold` = 0.3
//! - `balance_abs_threshold` = 64
//! - `balance_rel_threshold` = 1.5

use super::{Candidate, Pick, Policy, PolicyError, PolicyKind, RequestFacts, argmin_by};
use crate::DecisionRng;
use crate::config::RouterConfig;
use crate::decision::Branch;

#[derive(Debug, Clone, Copy)]
pub struct SglangCacheAware {
    cache_threshold: f64,
    balance_abs_threshold: f64,
    balance_rel_threshold: f64,
}

impl SglangCacheAware {
    pub fn new(config: &RouterConfig) -> Self {
        SglangCacheAware {
            cache_threshold: config.cache_threshold,
            balance_abs_threshold: config.balance_abs_threshold,
            balance_rel_threshold: config.balance_rel_threshold,
        }
    }
}

impl Policy for SglangCacheAware {
    fn kind(&self) -> PolicyKind {
        PolicyKind::SglangCacheAware
    }

    fn pick(
        &mut self,
        _request: &RequestFacts,
        candidates: &[Candidate<'_>],
        eligible: &mut [bool],
        _rng: &mut DecisionRng,
    ) -> Result<Pick, PolicyError> {
        let loads = candidates.iter().map(|c| c.pod.in_flight.requests as f64);
        let min_load = loads.clone().fold(f64::INFINITY, f64::min);
        let max_load = loads.fold(f64::NEG_INFINITY, f64::max);
        if candidates.is_empty() {
            return Err(PolicyError::NoCandidates);
        }
        let least_loaded = |eligible: &[bool]| {
            argmin_by(candidates, eligible, |c| c.pod.in_flight.requests as f64)
        };
        let imbalanced = (max_load - min_load) > self.balance_abs_threshold
            && max_load > self.balance_rel_threshold * min_load;
        if imbalanced {
            let index = least_loaded(eligible).ok_or(PolicyError::NoCandidates)?;
            return Ok(Pick {
                index,
                branch: Branch::Reason("imbalanced"),
            });
        }
        let best = argmin_by(candidates, eligible, |c| -c.prefix_score)
            .ok_or(PolicyError::NoCandidates)?;
        if candidates[best].prefix_score > self.cache_threshold {
            Ok(Pick {
                index: best,
                branch: Branch::Reason("cache_hit"),
            })
        } else {
            let index = least_loaded(eligible).ok_or(PolicyError::NoCandidates)?;
            Ok(Pick {
                index,
                branch: Branch::Reason("cache_miss"),
            })
        }
    }
}
