//! `affinity-gate` (kvgate's default): the cache-aware affinity gate in front of greedy
//! predicted-latency routing (DESIGN.md §2).
//!
//! ```text
//! draw u ~ U[0, 1) from the decision RNG (always exactly one draw per decision)
//! if u < epsilon_explore_sticky:                     EXPLORE   argmin predicted TTFT, all pods
//! sticky = { p : prefix_score(p) > affinity_gate_tau }          (strictly above)
//! if sticky is empty:                                NO_STICKY argmin predicted TTFT, all pods
//! best_all    = min predicted TTFT over all pods
//! best_sticky = min predicted TTFT over sticky pods
//! if penalty > 0 and best_sticky − best_all > penalty: LOAD_BREAK argmin over all pods
//! else:                                              EXPLOIT   argmin predicted TTFT, sticky pods
//! ```
//!
//! Exactly at the penalty affinity is kept; only a difference strictly above it breaks
//! affinity. Ties in predicted TTFT go to the pod with fewer requests, then the lower index.
//!
//! Why: greedy latency alone scatters prefixes over all pods (cache fragmentation); always
//! following the best cache match piles popular prefixes onto few pods (hot spots). The gate
//! keeps conversations on the pods that hold them, the ε coin seeds caches elsewhere, and the
//! load gate lets queueing on a hot pod override its cache benefit.
//!
//! Parameters (defaults from llm-d's predicted-latency scorer, GIE `scorer.go` `DefaultConfig`):
//! - `epsilon_explore_sticky` = 0.01  (probability of skipping the gate)
//! - `affinity_gate_tau` = 0.80       (score a pod must exceed to be sticky; multi-turn scores
//!   are bimodal, near 0 or near 1, and 0.80 separates the modes)
//! - `affinity_max_ttft_penalty_ms` = 5000 (load gate; 0 disables it, as upstream)

use super::{Candidate, Pick, Policy, PolicyError, PolicyKind, RequestFacts, argmin_by};
use crate::DecisionRng;
use crate::config::RouterConfig;
use crate::decision::Branch;
use rand::RngExt;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AffinityGate {
    pub affinity_gate_tau: f64,
    pub epsilon_explore_sticky: f64,
    pub affinity_max_ttft_penalty_ms: f64,
}

impl AffinityGate {
    pub fn new(config: &RouterConfig) -> Self {
        AffinityGate {
            affinity_gate_tau: config.affinity_gate_tau,
            epsilon_explore_sticky: config.epsilon_explore_sticky,
            affinity_max_ttft_penalty_ms: config.affinity_max_ttft_penalty_ms,
        }
    }
}

impl Policy for AffinityGate {
    fn kind(&self) -> PolicyKind {
        PolicyKind::AffinityGate
    }

    fn pick(
        &mut self,
        _request: &RequestFacts,
        candidates: &[Candidate<'_>],
        eligible: &mut [bool],
        rng: &mut DecisionRng,
    ) -> Result<Pick, PolicyError> {
        let ttft = |c: &Candidate<'_>| c.predicted_ttft_ms;
        let best_all = argmin_by(candidates, eligible, ttft).ok_or(PolicyError::NoCandidates)?;

        let explore = rng.random::<f64>() < self.epsilon_explore_sticky;
        if explore {
            return Ok(Pick {
                index: best_all,
                branch: Branch::Explore,
            });
        }

        let mut any_sticky = false;
        for (e, c) in eligible.iter_mut().zip(candidates) {
            *e = c.prefix_score > self.affinity_gate_tau;
            any_sticky |= *e;
        }
        if !any_sticky {
            eligible.fill(true);
            return Ok(Pick {
                index: best_all,
                branch: Branch::NoSticky,
            });
        }
        let best_sticky = argmin_by(candidates, eligible, ttft).ok_or(PolicyError::NoCandidates)?;

        let penalty = self.affinity_max_ttft_penalty_ms;
        let excess =
            candidates[best_sticky].predicted_ttft_ms - candidates[best_all].predicted_ttft_ms;
        if penalty > 0.0 && excess > penalty {
            eligible.fill(true);
            return Ok(Pick {
                index: best_all,
                branch: Branch::LoadBreak,
            });
        }
        Ok(Pick {
            index: best_sticky,
            branch: Branch::Exploit,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testutil::*;

    fn gate(epsilon: f64, penalty: f64) -> AffinityGate {
        AffinityGate::new(&RouterConfig {
            epsilon_explore_sticky: epsilon,
            affinity_max_ttft_penalty_ms: penalty,
            ..RouterConfig::default()
        })
    }

    #[test]
    fn exploit_picks_the_fastest_sticky_pod_not_the_fastest_pod() {
        let (a, b, c) = (pod(0, 0, 0, 0.1), pod(1, 4, 0, 0.5), pod(2, 2, 0, 0.5));
        // a: no cache but fastest; b and c sticky (score 0.9 > 0.8); c is the faster sticky pod.
        let cands = [
            cand(&a, 0, 10, 50.0),
            cand(&b, 9, 10, 400.0),
            cand(&c, 9, 10, 300.0),
        ];
        let (pick, eligible) = run(&mut gate(0.0, 5000.0), &facts(10), &cands, &mut rng(1));
        assert_eq!(
            pick.unwrap(),
            Pick {
                index: 2,
                branch: Branch::Exploit
            }
        );
        assert_eq!(eligible, vec![false, true, true]);
    }

    #[test]
    fn no_sticky_pod_means_best_latency_over_all() {
        let (a, b) = (pod(0, 0, 0, 0.1), pod(1, 0, 0, 0.1));
        // Score exactly 0.8 is not above tau: not sticky.
        let cands = [cand(&a, 8, 10, 500.0), cand(&b, 0, 10, 200.0)];
        let (pick, eligible) = run(&mut gate(0.0, 5000.0), &facts(10), &cands, &mut rng(1));
        assert_eq!(
            pick.unwrap(),
            Pick {
                index: 1,
                branch: Branch::NoSticky
            }
        );
        assert_eq!(eligible, vec![true, true]);
    }

    #[test]
    fn load_gate_keeps_affinity_just_below_and_at_the_penalty() {
        let (a, b) = (pod(0, 0, 0, 0.1), pod(1, 0, 0, 0.1));
        for excess in [4999.0, 5000.0] {
            let cands = [cand(&a, 0, 10, 100.0), cand(&b, 10, 10, 100.0 + excess)];
            let (pick, _) = run(&mut gate(0.0, 5000.0), &facts(10), &cands, &mut rng(1));
            assert_eq!(
                pick.unwrap(),
                Pick {
                    index: 1,
                    branch: Branch::Exploit
                },
                "excess {excess}"
            );
        }
    }

    #[test]
    fn load_gate_breaks_affinity_above_penalty() {
        let (a, b) = (pod(0, 0, 0, 0.1), pod(1, 0, 0, 0.1));
        let cands = [cand(&a, 0, 10, 100.0), cand(&b, 10, 10, 5100.001)];
        let (pick, eligible) = run(&mut gate(0.0, 5000.0), &facts(10), &cands, &mut rng(1));
        assert_eq!(
            pick.unwrap(),
            Pick {
                index: 0,
                branch: Branch::LoadBreak
            }
        );
        assert_eq!(eligible, vec![true, true]);
    }

    #[test]
    fn zero_penalty_disables_the_load_gate() {
        let (a, b) = (pod(0, 0, 0, 0.1), pod(1, 0, 0, 0.1));
        let cands = [cand(&a, 0, 10, 100.0), cand(&b, 10, 10, 1e9)];
        let (pick, _) = run(&mut gate(0.0, 0.0), &facts(10), &cands, &mut rng(1));
        assert_eq!(
            pick.unwrap(),
            Pick {
                index: 1,
                branch: Branch::Exploit
            }
        );
    }

    #[test]
    fn explore_with_epsilon_one_takes_the_best_pod_overall() {
        let (a, b) = (pod(0, 0, 0, 0.1), pod(1, 0, 0, 0.1));
        let cands = [cand(&a, 0, 10, 100.0), cand(&b, 10, 10, 150.0)];
        let mut r = rng(7);
        for _ in 0..100 {
            let (pick, eligible) = run(&mut gate(1.0, 5000.0), &facts(10), &cands, &mut r);
            assert_eq!(
                pick.unwrap(),
                Pick {
                    index: 0,
                    branch: Branch::Explore
                }
            );
            assert_eq!(eligible, vec![true, true]);
        }
    }

    #[test]
    fn explore_rate_is_within_four_sigma_of_epsilon_over_100k_decisions() {
        let (a, b) = (pod(0, 0, 0, 0.1), pod(1, 0, 0, 0.1));
        let cands = [cand(&a, 0, 10, 100.0), cand(&b, 10, 10, 150.0)];
        let n = 100_000;
        let eps = 0.01;
        for seed in [1u64, 2, 3] {
            let mut r = rng(seed);
            let mut g = gate(eps, 5000.0);
            let explores = (0..n)
                .filter(|_| {
                    run(&mut g, &facts(10), &cands, &mut r).0.unwrap().branch == Branch::Explore
                })
                .count() as f64;
            let sigma = (n as f64 * eps * (1.0 - eps)).sqrt();
            let expected = n as f64 * eps;
            assert!(
                (explores - expected).abs() <= 4.0 * sigma,
                "seed {seed}: {explores} explores, expected {expected} ± {}",
                4.0 * sigma
            );
        }
    }

    #[test]
    fn same_seed_gives_the_same_decisions() {
        let pods: Vec<_> = (0..8).map(|i| pod(i, i, 0, 0.1)).collect();
        let cands: Vec<_> = pods
            .iter()
            .enumerate()
            .map(|(i, p)| {
                cand(
                    p,
                    if i % 3 == 0 { 10 } else { 0 },
                    10,
                    100.0 + (i as f64 * 37.0) % 90.0,
                )
            })
            .collect();
        let decisions = |seed| {
            let mut r = rng(seed);
            let mut g = gate(0.3, 5000.0);
            (0..1000)
                .map(|_| run(&mut g, &facts(10), &cands, &mut r).0.unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(decisions(42), decisions(42));
        assert_ne!(decisions(42), decisions(43));
    }

    #[test]
    fn ties_among_sticky_pods_go_to_the_less_loaded_one() {
        let (a, b) = (pod(0, 9, 0, 0.1), pod(1, 1, 0, 0.1));
        let cands = [cand(&a, 10, 10, 100.0), cand(&b, 10, 10, 100.0)];
        let (pick, _) = run(&mut gate(0.0, 5000.0), &facts(10), &cands, &mut rng(1));
        assert_eq!(
            pick.unwrap(),
            Pick {
                index: 1,
                branch: Branch::Exploit
            }
        );
    }
}
