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
//! Options beyond the seed (each off in `gate_profile = seed`; see docs/decisions/ for what each
//! measured):
//! - `explore_mode`: what EXPLORE picks — `best-overall` (seed), `random-non-sticky` (default
//!   profile: a uniform pod among those not sticky, one extra RNG draw). Exploring is meant to
//!   seed caches on cold pods; the best pod overall is usually the sticky one, so the seed's
//!   explore rarely does that. (Two other modes, least-loaded and sticky-less-only exploration,
//!   were removed on 2026-12-07: docs/decisions/explore-modes-removed.md.)
//! - `explore_max_extra_ms` x and `explore_max_extra_rel` r: exploring may only pick a pod
//!   predicted within max(x, r × best) ms of the best pod (cheap moves, such as a short shared
//!   prefix); with none, the coin is ignored. 0 and 0 = unbounded (seed); default profile 25 ms
//!   and 1. The relative term keeps seeding possible where first tokens take hundreds of ms
//!   (CPU pods, long prompts): there a shared system prompt's head start on one pod is worth
//!   far more than 25 ms, the coin was always ignored, and every request carrying that prompt
//!   piled onto the one pod holding it (real vLLM CPU pods, BENCHMARKS.md "Mooncake and the
//!   agent workload after the capacity fix"; the 2-pod slice in the simulator: mean TTFT
//!   ×0.95, p99 ×0.94). A bounded explore never picks a pod whose prediction includes an
//!   adapter load (`adapter_cost_ms`): exploring seeds caches, it does not load or evict LoRA
//!   adapters (with 8 adapters in 8 slots the relative bound otherwise cost 2 extra loads in
//!   the simulator's LoRA test).
//!   With the seed's `best-overall` mode exploring draws nothing more; `random-non-sticky`
//!   draws one more number whenever the coin comes up.
//! - `affinity_relative_penalty` r and `affinity_relative_slack_ms` s: LOAD_BREAK also when
//!   best_sticky > r × best_all + s (a gate scaled to the workload; 0 = off). Seed 0 and 0,
//!   default profile 1.25 and 5 ms.
//! - `load_break_pays_prefill` (seed false, default profile true): the relative gate breaks
//!   only when the move saves more than the prefill it adds, best_sticky − best_all >
//!   prefill(best_all) − prefill(best_sticky), where prefill(p) is the part of p's prediction
//!   due to this request's own uncached tokens ([`Candidate::prefill_ms`]). The target pays
//!   that prefill in this request's TTFT and again in the TTFT of every request queued behind
//!   it; the absolute penalty is not priced. On two real vLLM CPU pods in overload a break 51 ms
//!   "faster" put a 2,374-token prefill in front of the next requests on the cold pod (the
//!   next one on it: 2,255 ms against 789 ms without the break); the build before this rule
//!   had ×1.14 [0.97–1.42] its mean TTFT and ×1.39 [0.97–1.60] its p99 there (agent ×40,
//!   5 rounds; BENCHMARKS.md "Which key of the default profile loses when overloaded").
//! - `balance_window_ms` w and `balance_window_rel` r (issue 20, docs/decisions/balance-window.md): in
//!   EXPLOIT, among the sticky pods predicted within max(w, r × best sticky TTFT) ms of the best
//!   sticky pod, take the one with the lowest scraped KV usage (`vllm:kv_cache_usage_perc`,
//!   `least-kv`'s signal). Where every pod holds a shared prefix it moves the mean TTFT to
//!   `least-kv`'s (shared-prefix A, rate 4: ×1.06 → ×1.02 the best peer) and, like `least-kv`,
//!   pays for it in TPOT and p99 (×1.18 → ×1.21 `least-request`'s p99). Only among sticky
//!   pods: over all pods it cost the conversation trace 36 % mean at rate 4. 0 and 0 = off (seed
//!   and default profiles).
//! - `relative_gate_queue_rule` (issue 20, docs/decisions/relative-gate-queue-rule.md): admission-aware relative load
//!   gate. `off` (seed): as above. `every` (default profile): the relative gate holds while
//!   every candidate pod reports waiting requests — in overload, moving a request off its cache
//!   only adds its prefill to another queue (conversation trace at rate 6: mean ×1.12 → ×1.08
//!   `sglang-cache-aware`'s, identical below overload). `target`: it holds while the best pod
//!   overall (where a break would send the request) reports waiting requests. The absolute
//!   penalty is unaffected.
//!
//! - `shared_prefix_epsilon` ε_s and `shared_prefix_min_requests` n (issue 20,
//!   docs/decisions/shared-prefix-epsilon.md): the coin comes up with probability max(ε, ε_s) for a request whose deepest block
//!   held by some pod was carried by at least n recent requests ([`RequestFacts::prefix_sharers`]:
//!   a shared system prompt, where seeding more pods early spreads the group; one
//!   conversation's history counts one or two, so conversations keep ε), unless every pod
//!   reports waiting requests (in overload a seed only adds a prefill to another queue; on the
//!   conversation trace at rate 6 the hold cuts explores from ≈ 990 to ≈ 220 per run). Still
//!   one draw. ε_s: seed 0 (off), default profile 0.1; n = 8.
//!
//! Objectives (`x-slo-ttft-ms` / `x-slo-tpot-ms`) do not change the gate's pick: upstream's
//! SLO-headroom selection was built here and removed on 2026-12-07 (docs/decisions/slo-routing.md:
//! it lowered goodput at every load measured). Ties go to the pod with fewer requests, then the
//! lower index.
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
//!
//! (`"auto"` values of τ and ε, chosen online, were removed on 2026-12-07: docs/decisions/tau-epsilon-auto.md.)
//! The values in force are in [`Policy::gate_state`].

use super::{Candidate, Pick, Policy, PolicyError, PolicyKind, RequestFacts, argmin_by};
use crate::DecisionRng;
use crate::config::{ExploreMode, QueueRule, RouterConfig};
use crate::decision::{Branch, GateState};
use rand::RngExt;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AffinityGate {
    pub affinity_gate_tau: f64,
    pub epsilon_explore_sticky: f64,
    pub affinity_max_ttft_penalty_ms: f64,
    pub affinity_relative_penalty: f64,
    pub affinity_relative_slack_ms: f64,
    pub load_break_pays_prefill: bool,
    pub explore_mode: ExploreMode,
    pub explore_max_extra_ms: f64,
    pub explore_max_extra_rel: f64,
    pub balance_window_ms: f64,
    pub balance_window_rel: f64,
    pub relative_gate_queue_rule: QueueRule,
    pub shared_prefix_epsilon: f64,
    pub shared_prefix_min_requests: u32,
}

impl AffinityGate {
    pub fn new(config: &RouterConfig) -> Self {
        AffinityGate {
            affinity_gate_tau: config.affinity_gate_tau,
            epsilon_explore_sticky: config.epsilon_explore_sticky,
            affinity_max_ttft_penalty_ms: config.affinity_max_ttft_penalty_ms,
            affinity_relative_penalty: config.affinity_relative_penalty,
            affinity_relative_slack_ms: config.affinity_relative_slack_ms,
            load_break_pays_prefill: config.load_break_pays_prefill,
            explore_mode: config.explore_mode,
            explore_max_extra_ms: config.explore_max_extra_ms,
            explore_max_extra_rel: config.explore_max_extra_rel,
            balance_window_ms: config.balance_window_ms,
            balance_window_rel: config.balance_window_rel,
            relative_gate_queue_rule: config.relative_gate_queue_rule,
            shared_prefix_epsilon: config.shared_prefix_epsilon,
            shared_prefix_min_requests: config.shared_prefix_min_requests,
        }
    }

    /// The coin's probability for this request: ε, or ε_s when its cached prefix is shared
    /// and some pod has no waiting requests.
    fn epsilon_for(&self, request: &RequestFacts, candidates: &[Candidate<'_>]) -> f64 {
        if self.shared_prefix_epsilon > 0.0
            && request.prefix_sharers >= self.shared_prefix_min_requests
            && candidates.iter().any(|c| c.pod.waiting == 0)
        {
            self.epsilon_explore_sticky.max(self.shared_prefix_epsilon)
        } else {
            self.epsilon_explore_sticky
        }
    }

    fn sticky(&self, c: &Candidate<'_>) -> bool {
        c.prefix_score > self.affinity_gate_tau
    }

    /// A pod exploration may pick: not sticky, within the cost bound of the best pod, and
    /// needing no adapter load (a bounded explore never loads or evicts a LoRA adapter).
    fn explorable(&self, c: &Candidate<'_>, best_all_ms: f64) -> bool {
        let bound = self
            .explore_max_extra_ms
            .max(self.explore_max_extra_rel * best_all_ms.max(0.0));
        !self.sticky(c)
            && (bound <= 0.0
                || (c.predicted_ttft_ms <= best_all_ms + bound && c.adapter_cost_ms <= 0.0))
    }

    /// Whether queueing holds the relative load gate back (`relative_gate_queue_rule`):
    /// in `every` mode when every candidate reports waiting requests, in `target` mode when the
    /// best pod overall (where a break would move the request) does.
    fn queue_blocks_move(&self, candidates: &[Candidate<'_>], best_all: usize) -> bool {
        match self.relative_gate_queue_rule {
            QueueRule::Off => false,
            QueueRule::Every => candidates.iter().all(|c| c.pod.waiting > 0),
            QueueRule::Target => candidates[best_all].pod.waiting > 0,
        }
    }

    /// Whether the load gate breaks affinity from the best sticky pod to the best pod overall,
    /// given whether queueing holds the relative gate back.
    fn breaks_affinity(
        &self,
        sticky: &Candidate<'_>,
        best: &Candidate<'_>,
        queue_holds: bool,
    ) -> bool {
        let (best_sticky_ms, best_all_ms) = (sticky.predicted_ttft_ms, best.predicted_ttft_ms);
        let penalty = self.affinity_max_ttft_penalty_ms;
        let absolute = penalty > 0.0 && best_sticky_ms - best_all_ms > penalty;
        let r = self.affinity_relative_penalty;
        let relative = r > 0.0
            && !queue_holds
            && best_sticky_ms > r * best_all_ms + self.affinity_relative_slack_ms
            && (!self.load_break_pays_prefill
                || best_sticky_ms - best_all_ms > best.prefill_ms - sticky.prefill_ms);
        absolute || relative
    }

    /// The balance window's pick among the `eligible` pods, given the set's best pick `best`:
    /// the least KV usage among those predicted within the window of `best`
    /// (`eligible` is narrowed to them); `best` when the window is off.
    fn balance_pick(
        &self,
        candidates: &[Candidate<'_>],
        best: usize,
        eligible: &mut [bool],
    ) -> usize {
        let best_ms = candidates[best].predicted_ttft_ms;
        let w = self
            .balance_window_ms
            .max(self.balance_window_rel * best_ms.max(0.0));
        if w <= 0.0 {
            return best;
        }
        let limit = best_ms + w;
        for (e, c) in eligible.iter_mut().zip(candidates) {
            *e = *e && c.predicted_ttft_ms <= limit;
        }
        argmin_by(candidates, eligible, |c| c.pod.kv_usage).unwrap_or(best)
    }

    /// The pick among all pods: the best predicted TTFT, every pod eligible.
    fn pick_over_all(&self, best_all: usize, eligible: &mut [bool]) -> usize {
        eligible.fill(true);
        best_all
    }

    /// The explore pick, or `None` when no pod may be explored (then the request is routed as
    /// if the coin had not come up).
    fn explore(
        &self,
        candidates: &[Candidate<'_>],
        best_all: usize,
        eligible: &mut [bool],
        rng: &mut DecisionRng,
    ) -> Option<usize> {
        let best_ms = candidates[best_all].predicted_ttft_ms;
        match self.explore_mode {
            ExploreMode::BestOverall => {
                eligible.fill(true);
                Some(best_all)
            }
            ExploreMode::RandomNonSticky => {
                // Always one draw here, so the RNG stream does not depend on the candidates.
                let draw = rng.random::<f64>();
                for (e, c) in eligible.iter_mut().zip(candidates) {
                    *e = self.explorable(c, best_ms);
                }
                let n = eligible.iter().filter(|&&e| e).count();
                if n == 0 {
                    eligible.fill(true);
                    return None;
                }
                let k = ((draw * n as f64) as usize).min(n - 1);
                eligible
                    .iter()
                    .enumerate()
                    .filter(|(_, e)| **e)
                    .nth(k)
                    .map(|(i, _)| i)
            }
        }
    }
}

impl Policy for AffinityGate {
    fn kind(&self) -> PolicyKind {
        PolicyKind::AffinityGate
    }

    /// τ: a sticky pod the router did not price counts a prefill of 0 (the break then looks
    /// costlier, never cheaper).
    fn prices_prefill_above(&self) -> Option<f64> {
        (self.load_break_pays_prefill && self.affinity_relative_penalty > 0.0)
            .then_some(self.affinity_gate_tau)
    }

    fn gate_state(&self) -> Option<GateState> {
        Some(GateState {
            affinity_gate_tau: self.affinity_gate_tau,
            epsilon_explore_sticky: self.epsilon_explore_sticky,
        })
    }

    fn pick(
        &mut self,
        request: &RequestFacts,
        candidates: &[Candidate<'_>],
        eligible: &mut [bool],
        rng: &mut DecisionRng,
    ) -> Result<Pick, PolicyError> {
        let ttft = |c: &Candidate<'_>| c.predicted_ttft_ms;
        let best_all = argmin_by(candidates, eligible, ttft).ok_or(PolicyError::NoCandidates)?;

        let coin = rng.random::<f64>() < self.epsilon_for(request, candidates);
        if coin && let Some(index) = self.explore(candidates, best_all, eligible, rng) {
            return Ok(Pick {
                index,
                branch: Branch::Explore,
            });
        }

        let mut any_sticky = false;
        for (e, c) in eligible.iter_mut().zip(candidates) {
            *e = self.sticky(c);
            any_sticky |= *e;
        }
        if !any_sticky {
            eligible.fill(true);
            let index = self.pick_over_all(best_all, eligible);
            return Ok(Pick {
                index,
                branch: Branch::NoSticky,
            });
        }
        let best_sticky = argmin_by(candidates, eligible, ttft).ok_or(PolicyError::NoCandidates)?;

        if self.breaks_affinity(
            &candidates[best_sticky],
            &candidates[best_all],
            self.queue_blocks_move(candidates, best_all),
        ) {
            eligible.fill(true);
            let index = self.pick_over_all(best_all, eligible);
            return Ok(Pick {
                index,
                branch: Branch::LoadBreak,
            });
        }
        let index = self.balance_pick(candidates, best_sticky, eligible);
        Ok(Pick {
            index,
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
            ..RouterConfig::seed()
        })
    }

    /// A request whose deepest cached block `n` recent requests carried.
    fn carried_by(n: u32) -> RequestFacts {
        RequestFacts {
            prefix_sharers: n,
            ..facts(10)
        }
    }

    #[test]
    fn shared_prefix_epsilon_explores_only_requests_whose_prefix_is_shared() {
        let g = AffinityGate {
            shared_prefix_epsilon: 1.0,
            shared_prefix_min_requests: 8,
            explore_mode: ExploreMode::RandomNonSticky,
            ..gate(0.0, 5000.0)
        };
        let (a, b) = (pod(0, 0, 0, 0.1), pod(1, 0, 0, 0.1));
        // a sticky and fastest: exploit keeps it; exploring must leave it for b.
        let cands = [cand(&a, 10, 10, 10.0), cand(&b, 0, 10, 12.0)];
        for (sharers, branch, index) in [
            (7, Branch::Exploit, 0),
            (8, Branch::Explore, 1),
            (500, Branch::Explore, 1),
        ] {
            let (pick, _) = run(&mut g.clone(), &carried_by(sharers), &cands, &mut rng(1));
            assert_eq!(pick.unwrap(), Pick { index, branch }, "sharers {sharers}");
        }
        // Every pod queueing: the shared prefix stays on its pod.
        let (qa, qb) = (pod(0, 4, 2, 0.1), pod(1, 4, 1, 0.1));
        let queued = [cand(&qa, 10, 10, 10.0), cand(&qb, 0, 10, 12.0)];
        let (pick, _) = run(&mut g.clone(), &carried_by(500), &queued, &mut rng(1));
        assert_eq!(pick.unwrap().branch, Branch::Exploit);
        // Off (ε_s = 0): a shared prefix is routed as any other request.
        let off = AffinityGate {
            shared_prefix_epsilon: 0.0,
            ..g
        };
        let (pick, _) = run(&mut off.clone(), &carried_by(500), &cands, &mut rng(1));
        assert_eq!(pick.unwrap().branch, Branch::Exploit);
    }

    #[test]
    fn relative_load_gate_breaks_when_sticky_is_much_slower() {
        let g = AffinityGate {
            affinity_relative_penalty: 1.5,
            affinity_relative_slack_ms: 100.0,
            ..gate(0.0, 5000.0)
        };
        let (a, b) = (pod(0, 0, 0, 0.1), pod(1, 0, 0, 0.1));
        // 1.5 × 200 + 100 = 400: 400 keeps affinity, 401 breaks it.
        for (sticky_ms, branch) in [(400.0, Branch::Exploit), (401.0, Branch::LoadBreak)] {
            let cands = [cand(&a, 0, 10, 200.0), cand(&b, 10, 10, sticky_ms)];
            let (pick, _) = run(&mut g.clone(), &facts(10), &cands, &mut rng(1));
            assert_eq!(pick.unwrap().branch, branch, "sticky {sticky_ms}");
        }
    }

    #[test]
    fn balance_window_picks_the_sticky_pod_with_the_least_kv_within_the_window() {
        let g = AffinityGate {
            balance_window_ms: 3.0,
            ..gate(0.0, 5000.0)
        };
        let (a, b, c, d) = (
            pod(0, 0, 0, 0.5),
            pod(1, 0, 0, 0.2),
            pod(2, 0, 0, 0.1),
            pod(3, 0, 0, 0.0),
        );
        // Sticky a, b, c; a is the fastest (10 ms), b within 3 ms and lighter, c lightest but
        // 3.5 ms behind; d is the lightest and fastest of all but not sticky.
        let cands = [
            cand(&a, 10, 10, 10.0),
            cand(&b, 10, 10, 12.0),
            cand(&c, 10, 10, 13.5),
            cand(&d, 0, 10, 5.0),
        ];
        let (pick, eligible) = run(&mut g.clone(), &facts(10), &cands, &mut rng(1));
        assert_eq!(
            pick.unwrap(),
            Pick {
                index: 1,
                branch: Branch::Exploit
            }
        );
        assert_eq!(eligible, vec![true, true, false, false]);
        // Off: the fastest sticky pod.
        let (pick, _) = run(&mut gate(0.0, 5000.0), &facts(10), &cands, &mut rng(1));
        assert_eq!(pick.unwrap().index, 0);
    }

    #[test]
    fn relative_balance_window_scales_with_the_best_sticky_prediction() {
        let g = AffinityGate {
            balance_window_rel: 0.1,
            ..gate(0.0, 5000.0)
        };
        let (a, b, c) = (pod(0, 0, 0, 0.5), pod(1, 0, 0, 0.3), pod(2, 0, 0, 0.1));
        // All sticky; best 200 ms, window 20 ms: b (220) is in, c (221) is out.
        let cands = [
            cand(&a, 10, 10, 200.0),
            cand(&b, 10, 10, 220.0),
            cand(&c, 10, 10, 221.0),
        ];
        let (pick, eligible) = run(&mut g.clone(), &facts(10), &cands, &mut rng(1));
        assert_eq!(
            pick.unwrap(),
            Pick {
                index: 1,
                branch: Branch::Exploit
            }
        );
        assert_eq!(eligible, vec![true, true, false]);
    }

    #[test]
    fn balance_window_leaves_no_sticky_picks_to_the_best_prediction() {
        let g = AffinityGate {
            balance_window_rel: 0.5,
            ..gate(0.0, 5000.0)
        };
        let (a, b) = (pod(0, 0, 0, 0.5), pod(1, 0, 0, 0.1));
        // No sticky pod: b is lighter and within the window, but the window only acts among
        // sticky pods (on the conversation trace it cost 36 % mean at rate 4 over all pods).
        let cands = [cand(&a, 0, 10, 200.0), cand(&b, 0, 10, 210.0)];
        let (pick, _) = run(&mut g.clone(), &facts(10), &cands, &mut rng(1));
        assert_eq!(
            pick.unwrap(),
            Pick {
                index: 0,
                branch: Branch::NoSticky
            }
        );
    }

    #[test]
    fn a_relative_load_break_must_save_more_than_the_prefill_it_adds() {
        let g = AffinityGate {
            affinity_relative_penalty: 1.25,
            affinity_relative_slack_ms: 5.0,
            load_break_pays_prefill: true,
            ..gate(0.0, 5000.0)
        };
        assert_eq!(g.prices_prefill_above(), Some(0.8));
        let (a, b) = (pod(0, 0, 0, 0.1), pod(1, 0, 0, 0.1));
        // The sticky pod b is predicted 206 ms (6 ms of it its own prefill), the cold pod a
        // 155 ms: 206 > 1.25 × 155 + 5, a 51 ms saving. Where 145 ms of a's 155 are the whole
        // prompt's prefill the move adds 139 ms of work: affinity holds. Where a's prefill is
        // 50 ms the move adds 44 ms and saves 51: it breaks. At exactly the saving it holds.
        for (a_prefill_ms, branch) in [
            (145.0, Branch::Exploit),
            (57.0, Branch::Exploit),
            (50.0, Branch::LoadBreak),
        ] {
            let cold = Candidate {
                prefill_ms: a_prefill_ms,
                ..cand(&a, 0, 10, 155.0)
            };
            let sticky = Candidate {
                prefill_ms: 6.0,
                ..cand(&b, 10, 10, 206.0)
            };
            let cands = [cold, sticky];
            let (pick, _) = run(&mut g.clone(), &facts(10), &cands, &mut rng(1));
            assert_eq!(
                pick.unwrap().branch,
                branch,
                "a's prefill {a_prefill_ms} ms"
            );
            // Without pricing the relative gate breaks affinity in every case.
            let plain = AffinityGate {
                load_break_pays_prefill: false,
                ..g
            };
            assert_eq!(plain.prices_prefill_above(), None);
            let (pick, _) = run(&mut plain.clone(), &facts(10), &cands, &mut rng(1));
            assert_eq!(pick.unwrap().branch, Branch::LoadBreak);
        }
        // The absolute penalty is not priced: 5,300 ms against 200 breaks whatever the prefill.
        let cands = [
            Candidate {
                prefill_ms: 6000.0,
                ..cand(&a, 0, 10, 200.0)
            },
            cand(&b, 10, 10, 5300.0),
        ];
        let (pick, _) = run(&mut g.clone(), &facts(10), &cands, &mut rng(1));
        assert_eq!(pick.unwrap().branch, Branch::LoadBreak);
    }

    #[test]
    fn relative_load_gate_holds_affinity_when_every_pod_is_queued_in_every_mode() {
        let g = AffinityGate {
            affinity_relative_penalty: 1.25,
            affinity_relative_slack_ms: 5.0,
            relative_gate_queue_rule: QueueRule::Every,
            ..gate(0.0, 5000.0)
        };
        // The sticky pod b (1000 ms) is far above 1.25 × 200 + 5 ms: the relative gate breaks
        // affinity while pod a has no queue, and holds it once every pod reports waiting
        // requests (moving the request only adds its prefill to another queue).
        for (a_waiting, branch) in [(0, Branch::LoadBreak), (3, Branch::Exploit)] {
            let (a, b) = (pod(0, 0, a_waiting, 0.1), pod(1, 0, 2, 0.1));
            let cands = [cand(&a, 0, 10, 200.0), cand(&b, 10, 10, 1000.0)];
            let (pick, _) = run(&mut g.clone(), &facts(10), &cands, &mut rng(1));
            assert_eq!(pick.unwrap().branch, branch, "a waiting {a_waiting}");
            // Without the rule the gate breaks affinity either way.
            let plain = AffinityGate {
                relative_gate_queue_rule: QueueRule::Off,
                ..g
            };
            let (pick, _) = run(&mut plain.clone(), &facts(10), &cands, &mut rng(1));
            assert_eq!(pick.unwrap().branch, Branch::LoadBreak);
        }
        // The absolute penalty still applies when every pod is queued.
        let (a, b) = (pod(0, 0, 1, 0.1), pod(1, 0, 1, 0.1));
        let cands = [cand(&a, 0, 10, 200.0), cand(&b, 10, 10, 5300.0)];
        let (pick, _) = run(&mut g.clone(), &facts(10), &cands, &mut rng(1));
        assert_eq!(pick.unwrap().branch, Branch::LoadBreak);
    }

    #[test]
    fn relative_load_gate_in_target_mode_needs_the_best_pod_unqueued() {
        let g = AffinityGate {
            affinity_relative_penalty: 1.25,
            affinity_relative_slack_ms: 5.0,
            relative_gate_queue_rule: QueueRule::Target,
            ..gate(0.0, 5000.0)
        };
        // a is the best pod overall; c is idle but slower. Only a's queue matters.
        let c = pod(2, 0, 0, 0.1);
        for (a_waiting, branch) in [(0, Branch::LoadBreak), (1, Branch::Exploit)] {
            let (a, b) = (pod(0, 0, a_waiting, 0.1), pod(1, 0, 2, 0.1));
            let cands = [
                cand(&a, 0, 10, 200.0),
                cand(&b, 10, 10, 1000.0),
                cand(&c, 0, 10, 300.0),
            ];
            let (pick, _) = run(&mut g.clone(), &facts(10), &cands, &mut rng(1));
            assert_eq!(pick.unwrap().branch, branch, "a waiting {a_waiting}");
        }
    }

    #[test]
    fn random_non_sticky_exploration_never_picks_a_sticky_pod_and_reaches_every_cold_pod() {
        let g = AffinityGate {
            explore_mode: ExploreMode::RandomNonSticky,
            ..gate(1.0, 5000.0)
        };
        let pods: Vec<_> = (0..4).map(|i| pod(i, 0, 0, 0.1)).collect();
        // Pod 0 is sticky and fastest: the seed would always explore to it.
        let cands: Vec<_> = pods
            .iter()
            .enumerate()
            .map(|(i, p)| cand(p, if i == 0 { 10 } else { 0 }, 10, 100.0 + i as f64))
            .collect();
        let mut r = rng(9);
        let mut seen = [0u32; 4];
        for _ in 0..300 {
            let (pick, _) = run(&mut g.clone(), &facts(10), &cands, &mut r);
            let pick = pick.unwrap();
            assert_eq!(pick.branch, Branch::Explore);
            seen[pick.index] += 1;
        }
        assert_eq!(seen[0], 0);
        assert!(seen[1..].iter().all(|&n| n > 60), "{seen:?}");
    }

    #[test]
    fn bounded_exploration_skips_pods_too_far_behind_and_falls_back_to_the_gate() {
        let g = AffinityGate {
            explore_mode: ExploreMode::RandomNonSticky,
            explore_max_extra_ms: 30.0,
            ..gate(1.0, 5000.0)
        };
        let (a, b, c) = (pod(0, 0, 0, 0.1), pod(1, 0, 0, 0.1), pod(2, 0, 0, 0.1));
        // a sticky at 100 ms; b within 30 ms of the best; c 31 ms behind.
        let cands = [
            cand(&a, 10, 10, 100.0),
            cand(&b, 0, 10, 130.0),
            cand(&c, 0, 10, 131.0),
        ];
        let mut r = rng(4);
        for _ in 0..50 {
            let (pick, _) = run(&mut g.clone(), &facts(10), &cands, &mut r);
            assert_eq!(
                pick.unwrap(),
                Pick {
                    index: 1,
                    branch: Branch::Explore
                }
            );
        }
        // Nothing within the bound: the coin is ignored and the gate exploits.
        let far = [cand(&a, 10, 10, 100.0), cand(&b, 0, 10, 200.0)];
        let (pick, _) = run(&mut g.clone(), &facts(10), &far, &mut r);
        assert_eq!(
            pick.unwrap(),
            Pick {
                index: 0,
                branch: Branch::Exploit
            }
        );
    }

    /// The default profile's exploration (random non-sticky, within max(25 ms, 1 × best)),
    /// with the coin always up.
    fn bounded_explorer() -> AffinityGate {
        AffinityGate {
            explore_mode: ExploreMode::RandomNonSticky,
            explore_max_extra_ms: 25.0,
            explore_max_extra_rel: 1.0,
            ..gate(1.0, 5000.0)
        }
    }

    #[test]
    fn the_relative_bound_scales_exploration_with_the_best_prediction() {
        let g = bounded_explorer();
        let (a, b) = (pod(0, 0, 0, 0.1), pod(1, 0, 0, 0.1));
        // Slow pods: the best at 600 ms, the other 150 ms behind — far beyond 25 ms, within
        // 1 × 600 ms: the coin explores.
        let slow = [cand(&a, 10, 10, 600.0), cand(&b, 0, 10, 750.0)];
        let (pick, _) = run(&mut g.clone(), &facts(10), &slow, &mut rng(3));
        assert_eq!(
            pick.unwrap(),
            Pick {
                index: 1,
                branch: Branch::Explore
            }
        );
        // Past twice the best, not.
        let far = [cand(&a, 10, 10, 600.0), cand(&b, 0, 10, 1_201.0)];
        let (pick, _) = run(&mut g.clone(), &facts(10), &far, &mut rng(3));
        assert_eq!(pick.map(|p| p.branch), Ok(Branch::Exploit));
        // Fast pods: 25 ms is the larger bound.
        let fast = [cand(&a, 10, 10, 10.0), cand(&b, 0, 10, 34.0)];
        let (pick, _) = run(&mut g.clone(), &facts(10), &fast, &mut rng(3));
        assert_eq!(pick.map(|p| p.branch), Ok(Branch::Explore));
    }

    #[test]
    fn a_bounded_explore_never_picks_a_pod_that_must_load_an_adapter() {
        let g = bounded_explorer();
        let (a, b) = (pod(0, 0, 0, 0.1), pod(1, 0, 0, 0.1));
        // b is within the bound, but 25 ms of its prediction is an adapter load.
        let loading = Candidate {
            adapter_cost_ms: 25.0,
            ..cand(&b, 0, 10, 80.0)
        };
        let cands = [cand(&a, 10, 10, 60.0), loading];
        let (pick, _) = run(&mut g.clone(), &facts(10), &cands, &mut rng(3));
        assert_eq!(pick.map(|p| p.branch), Ok(Branch::Exploit));
        // The same pod with the adapter resident is explored.
        let resident = [cand(&a, 10, 10, 60.0), cand(&b, 0, 10, 80.0)];
        let (pick, _) = run(&mut g.clone(), &facts(10), &resident, &mut rng(3));
        assert_eq!(pick.map(|p| p.branch), Ok(Branch::Explore));
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
