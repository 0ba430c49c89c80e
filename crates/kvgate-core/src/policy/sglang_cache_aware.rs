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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testutil::*;

    fn with_in_flight(id: u32, requests: u32) -> crate::PodSnapshot {
        let mut p = pod(id, 0, 0, 0.0);
        p.in_flight.requests = requests;
        p
    }

    #[test]
    fn balanced_load_follows_the_cache_above_threshold() {
        let (a, b) = (with_in_flight(0, 10), with_in_flight(1, 0));
        let cands = [cand(&a, 4, 10, 1.0), cand(&b, 0, 10, 1.0)];
        let (pick, _) = run(
            &mut SglangCacheAware::new(&RouterConfig::default()),
            &facts(10),
            &cands,
            &mut rng(1),
        );
        assert_eq!(
            pick.unwrap(),
            Pick {
                index: 0,
                branch: Branch::Reason("cache_hit")
            }
        );
    }

    #[test]
    fn match_at_or_below_threshold_goes_to_least_loaded() {
        let (a, b) = (with_in_flight(0, 10), with_in_flight(1, 2));
        let cands = [cand(&a, 3, 10, 1.0), cand(&b, 0, 10, 1.0)];
        let (pick, _) = run(
            &mut SglangCacheAware::new(&RouterConfig::default()),
            &facts(10),
            &cands,
            &mut rng(1),
        );
        assert_eq!(
            pick.unwrap(),
            Pick {
                index: 1,
                branch: Branch::Reason("cache_miss")
            }
        );
    }

    #[test]
    fn imbalance_needs_both_the_absolute_and_relative_threshold() {
        let mut policy = SglangCacheAware::new(&RouterConfig::default());
        // 100 vs 30: diff 70 > 64 and 100 > 1.5 × 30 → imbalanced → least loaded.
        let (a, b) = (with_in_flight(0, 100), with_in_flight(1, 30));
        let cands = [cand(&a, 10, 10, 1.0), cand(&b, 0, 10, 1.0)];
        let (pick, _) = run(&mut policy, &facts(10), &cands, &mut rng(1));
        assert_eq!(
            pick.unwrap(),
            Pick {
                index: 1,
                branch: Branch::Reason("imbalanced")
            }
        );
        // 200 vs 140: diff 60 ≤ 64 → balanced → cache.
        let (a, b) = (with_in_flight(0, 200), with_in_flight(1, 140));
        let cands = [cand(&a, 10, 10, 1.0), cand(&b, 0, 10, 1.0)];
        let (pick, _) = run(&mut policy, &facts(10), &cands, &mut rng(1));
        assert_eq!(
            pick.unwrap(),
            Pick {
                index: 0,
                branch: Branch::Reason("cache_hit")
            }
        );
    }
}
