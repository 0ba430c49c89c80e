//! `llmd-chain`: llm-d's current scheduling chain with the latency predictor on, as a peer
//! policy — the decomposed pipeline of llm-d-router's chart (`routerlib` `_config.yaml`):
//!
//! ```text
//! strict affinity filter (τ 0.99) → SLO-headroom tier filter (ε 0.01)
//!   → loose affinity filter (τ 0.80) → latency scorer → weighted random picker
//! ```
//!
//! Described from `shared/reference/llmd-predicted-latency.md` §1.2 (snapshots May–Aug 2026);
//! where that text leaves a detail open, the choice made here is marked *(reading)*.
//!
//! 1. **Affinity filter** (`prefix-cache-affinity-filter`), run twice, τ = 0.99 then 0.80: with
//!    ≤ 1 candidate, τ ≤ 0, or with probability `exploration` (0, llm-d-router #1664), pass
//!    everything. Sticky = prefix score **≥** τ; none sticky → pass everything. Load gate: when
//!    non-sticky candidates exist and the best sticky estimated TTFT exceeds the best non-sticky
//!    one by more than `max_ttft_penalty_ms` (18,000, #1639), pass everything; otherwise only the
//!    sticky ones.
//!    The estimated TTFT (`ttftSource: prefillThroughput`, the default since #1547) is
//!    in-flight prompt tokens ÷ `peak_prefill_tokens_per_s` (15,928, calibrated upstream for
//!    Qwen3-32B on 2×H100) × 1000 ms; the in-flight tokens are the pod's uncached prompt tokens
//!    not yet prefilled plus this request's uncached tokens on that pod *(reading)*.
//! 2. **SLO-headroom tier filter**: positive = TTFT headroom (SLO − predicted TTFT) ≥ 0 and TPOT
//!    headroom ≥ 0. The producer's default `streamingMode: false` makes TPOT always valid with
//!    headroom 0, so only the TTFT objective splits the tiers. No objective on the request ⇒
//!    SLO 0 ⇒ every pod negative ⇒ the filter passes everything. Both tiers present: keep the
//!    negative tier with probability `epsilon_explore_neg` (0.01), else the positive one.
//! 3. **Latency scorer** (`headroomSelectionStrategy: least`, `wMax` 100, `minWeight` 0): the
//!    set is one tier here (upstream's scorer, given a mixed set, scores only the positive pods);
//!    if all are negative and some pod has no request in flight, only the idle ones are scored;
//!    otherwise all (one bucket: with TPOT
//!    headroom 0, every negative pod is "TTFT-only negative"). Within the scored set, |headroom|
//!    is min-max normalised (zero range → 0.5) and `least` weighs the tightest fit highest:
//!    weight = ⌊(1 − norm)·99⌋ + 1 *(reading: the monolith's form with `minWeight` 0)* — for
//!    negative pods the smallest deficit, i.e. the lowest predicted TTFT.
//! 4. **Weighted random picker** (A-Res, one endpoint): P(pod) ∝ weight; unscored pods never.
//!
//! Parameters ([`LlmdChainParams`], defaults from the sources above): `strict_tau` 0.99,
//! `loose_tau` 0.80, `exploration` 0.0, `max_ttft_penalty_ms` 18,000, `peak_prefill_tokens_per_s`
//! 15,928, `epsilon_explore_neg` 0.01. The chart of Aug 2026 instead set `ttftSource:
//! latencyPredictor` and `maxTTFTPenaltyMs: 5000` on both filters; [`TtftSource::Predictor`]
//! with a 5,000 ms penalty reproduces that variant.

use rand::RngExt;

use super::{Candidate, Pick, Policy, PolicyError, PolicyKind, RequestFacts};
use crate::DecisionRng;
use crate::decision::Branch;

/// Where the affinity filters' load gate takes a pod's TTFT from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TtftSource {
    /// In-flight uncached prompt tokens ÷ peak prefill throughput (upstream's default).
    PrefillThroughput,
    /// The latency predictor's TTFT (the Aug 2026 chart).
    Predictor,
}

/// The chain's parameters; see the module docs for each one's source.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LlmdChainParams {
    pub strict_tau: f64,
    pub loose_tau: f64,
    pub exploration: f64,
    pub max_ttft_penalty_ms: f64,
    pub ttft_source: TtftSource,
    pub peak_prefill_tokens_per_s: f64,
    pub epsilon_explore_neg: f64,
}

impl Default for LlmdChainParams {
    fn default() -> Self {
        LlmdChainParams {
            strict_tau: 0.99,
            loose_tau: 0.80,
            exploration: 0.0,
            max_ttft_penalty_ms: 18_000.0,
            ttft_source: TtftSource::PrefillThroughput,
            peak_prefill_tokens_per_s: 15_928.0,
            epsilon_explore_neg: 0.01,
        }
    }
}

#[derive(Debug, Default)]
pub struct LlmdChain {
    params: LlmdChainParams,
    /// Per-candidate scratch (weights), reused across decisions.
    weights: Vec<f64>,
}

impl LlmdChain {
    pub fn new(params: LlmdChainParams) -> Self {
        LlmdChain {
            params,
            weights: Vec::new(),
        }
    }

    /// The load gate's TTFT estimate for one candidate, in ms.
    fn estimated_ttft_ms(&self, request: &RequestFacts, c: &Candidate<'_>) -> f64 {
        match self.params.ttft_source {
            TtftSource::Predictor => c.predicted_ttft_ms,
            TtftSource::PrefillThroughput => {
                let cached = u64::from(c.matched_blocks) * u64::from(c.block_size_tokens);
                let own = u64::from(request.input_tokens).saturating_sub(cached);
                let tokens = c.pod.in_flight.prefill_tokens + own;
                tokens as f64 / self.params.peak_prefill_tokens_per_s.max(1e-9) * 1000.0
            }
        }
    }

    /// One pass of the affinity filter at `tau` over the eligible set (narrows `eligible`).
    fn affinity_filter(
        &self,
        tau: f64,
        request: &RequestFacts,
        candidates: &[Candidate<'_>],
        eligible: &mut [bool],
        rng: &mut DecisionRng,
    ) {
        let live = eligible.iter().filter(|e| **e).count();
        if live <= 1 || tau <= 0.0 {
            return;
        }
        if self.params.exploration > 0.0 && rng.random::<f64>() < self.params.exploration {
            return;
        }
        let (mut best_sticky, mut best_other) = (f64::INFINITY, f64::INFINITY);
        let mut any_sticky = false;
        let mut any_other = false;
        for (c, _) in candidates.iter().zip(eligible.iter()).filter(|(_, e)| **e) {
            let t = self.estimated_ttft_ms(request, c);
            if c.prefix_score >= tau {
                any_sticky = true;
                best_sticky = best_sticky.min(t);
            } else {
                any_other = true;
                best_other = best_other.min(t);
            }
        }
        if !any_sticky {
            return;
        }
        let penalty = self.params.max_ttft_penalty_ms;
        if penalty > 0.0 && any_other && best_sticky - best_other > penalty {
            return;
        }
        for (c, e) in candidates.iter().zip(eligible.iter_mut()) {
            if *e && c.prefix_score < tau {
                *e = false;
            }
        }
    }
}

/// TTFT headroom of a candidate: SLO − predicted (SLO 0 when the request has none).
fn headroom(request: &RequestFacts, c: &Candidate<'_>) -> f64 {
    request.slo_ttft_ms.unwrap_or(0.0) - c.predicted_ttft_ms
}

impl Policy for LlmdChain {
    fn kind(&self) -> PolicyKind {
        PolicyKind::LlmdChain
    }

    fn uses_slo(&self) -> bool {
        true
    }

    fn pick(
        &mut self,
        request: &RequestFacts,
        candidates: &[Candidate<'_>],
        eligible: &mut [bool],
        rng: &mut DecisionRng,
    ) -> Result<Pick, PolicyError> {
        if candidates.is_empty() {
            return Err(PolicyError::NoCandidates);
        }
        // 1. Strict affinity.
        self.affinity_filter(self.params.strict_tau, request, candidates, eligible, rng);
        // 2. SLO-headroom tiers.
        let positive = |c: &Candidate<'_>| headroom(request, c) >= 0.0;
        let live = || candidates.iter().zip(eligible.iter()).filter(|(_, e)| **e);
        let n_pos = live().filter(|(c, _)| positive(c)).count();
        let n_all = live().count();
        if n_pos > 0 && n_pos < n_all {
            let keep_negative = rng.random::<f64>() < self.params.epsilon_explore_neg;
            for (c, e) in candidates.iter().zip(eligible.iter_mut()) {
                if *e && positive(c) == keep_negative {
                    *e = false;
                }
            }
        }
        // 3. Loose affinity.
        self.affinity_filter(self.params.loose_tau, request, candidates, eligible, rng);
        // 4. Latency scorer: which pods are scored. After the tier filter the set is one tier
        // (upstream's scorer also handles a mixed set, scoring only the positive pods: that
        // cannot happen behind the filter). All negative and some pod idle: only the idle ones.
        let live: Vec<usize> = (0..candidates.len()).filter(|&i| eligible[i]).collect();
        let idle = |i: usize| candidates[i].pod.in_flight.requests == 0;
        let idle_only =
            live.iter().all(|&i| !positive(&candidates[i])) && live.iter().any(|&i| idle(i));
        let scored = |i: usize| !idle_only || idle(i);
        let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
        for &i in live.iter().filter(|&&i| scored(i)) {
            let h = headroom(request, &candidates[i]).abs();
            lo = lo.min(h);
            hi = hi.max(h);
        }
        self.weights.clear();
        self.weights.resize(candidates.len(), 0.0);
        for &i in live.iter().filter(|&&i| scored(i)) {
            let h = headroom(request, &candidates[i]).abs();
            let norm = if hi > lo { (h - lo) / (hi - lo) } else { 0.5 };
            self.weights[i] = ((1.0 - norm) * 99.0).floor() + 1.0;
        }
        // 5. Weighted random pick (P ∝ weight); floating-point leftovers land on the last
        // scored pod.
        let total: f64 = self.weights.iter().sum();
        let index = if total > 0.0 {
            let mut x = rng.random::<f64>() * total;
            let mut pick = live[0];
            for &i in live.iter().filter(|&&i| self.weights[i] > 0.0) {
                pick = i;
                if x < self.weights[i] {
                    break;
                }
                x -= self.weights[i];
            }
            pick
        } else {
            live[rng.random_range(0..live.len())]
        };
        let branch = if live
            .iter()
            .all(|&i| candidates[i].prefix_score >= self.params.loose_tau)
            && live.len() < candidates.len()
        {
            "sticky_weighted"
        } else {
            "weighted"
        };
        Ok(Pick {
            index,
            branch: Branch::Reason(branch),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testutil::*;

    fn chain() -> LlmdChain {
        LlmdChain::new(LlmdChainParams::default())
    }

    fn picks(
        policy: &mut LlmdChain,
        request: &RequestFacts,
        cands: &[Candidate<'_>],
        n: usize,
    ) -> Vec<usize> {
        let mut r = rng(7);
        (0..n)
            .map(|_| {
                let mut eligible = vec![true; cands.len()];
                policy
                    .pick(request, cands, &mut eligible, &mut r)
                    .unwrap()
                    .index
            })
            .collect()
    }

    #[test]
    fn a_full_hit_is_kept_by_the_strict_filter() {
        let (a, b) = (pod(0, 0, 0, 0.0), pod(1, 0, 0, 0.0));
        // a holds all 10 blocks (score 1.0 ≥ 0.99); b none but is predicted faster.
        let cands = [cand(&a, 10, 10, 500.0), cand(&b, 0, 10, 100.0)];
        let got = picks(&mut chain(), &facts(10), &cands, 50);
        assert!(got.iter().all(|&i| i == 0), "{got:?}");
    }

    #[test]
    fn the_load_gate_breaks_affinity_when_the_sticky_pod_has_18_s_more_prefill_queued() {
        let mut a = pod(0, 0, 0, 0.0);
        // 15,928 tok/s × 20 s of uncached prompt tokens in flight on the sticky pod.
        a.in_flight.prefill_tokens = 15_928 * 20;
        a.in_flight.requests = 40;
        let b = pod(1, 0, 0, 0.0);
        let cands = [cand(&a, 10, 10, 100.0), cand(&b, 0, 10, 100.0)];
        let got = picks(&mut chain(), &facts(10), &cands, 200);
        // Affinity broken: b (idle, the only scored pod under "idle first") takes them all.
        assert!(got.iter().all(|&i| i == 1), "{got:?}");
        // With 10 s queued the gate holds and a keeps the request.
        a.in_flight.prefill_tokens = 15_928 * 10;
        let cands = [cand(&a, 10, 10, 100.0), cand(&b, 0, 10, 100.0)];
        let got = picks(&mut chain(), &facts(10), &cands, 50);
        assert!(got.iter().all(|&i| i == 0), "{got:?}");
    }

    #[test]
    fn without_objectives_idle_pods_come_first_then_lower_predicted_ttft_is_likelier() {
        let (mut a, b) = (pod(0, 0, 0, 0.0), pod(1, 0, 0, 0.0));
        a.in_flight.requests = 1;
        // No prefix anywhere: only the idle pod b is scored, however slow it is predicted.
        let cands = [cand(&a, 0, 10, 100.0), cand(&b, 0, 10, 900.0)];
        let got = picks(&mut chain(), &facts(10), &cands, 50);
        assert!(got.iter().all(|&i| i == 1), "{got:?}");
        // Both busy: weighted random, the faster pod (weight 100 vs 1) nearly always.
        let mut b = b;
        b.in_flight.requests = 1;
        let cands = [cand(&a, 0, 10, 100.0), cand(&b, 0, 10, 900.0)];
        let got = picks(&mut chain(), &facts(10), &cands, 1000);
        let to_a = got.iter().filter(|&&i| i == 0).count();
        assert!((970..1000).contains(&to_a), "{to_a}");
    }

    #[test]
    fn with_a_ttft_objective_the_tightest_positive_fit_is_likeliest() {
        let mut pods = [pod(0, 0, 0, 0.0), pod(1, 0, 0, 0.0), pod(2, 0, 0, 0.0)];
        for p in &mut pods {
            p.in_flight.requests = 2;
        }
        let cands = [
            cand(&pods[0], 0, 10, 100.0), // headroom 400
            cand(&pods[1], 0, 10, 450.0), // headroom 50: tightest fit
            cand(&pods[2], 0, 10, 800.0), // negative: dropped by the tier filter (99 %)
        ];
        let mut request = facts(10);
        request.slo_ttft_ms = Some(500.0);
        let got = picks(&mut chain(), &request, &cands, 2000);
        let count = |k| got.iter().filter(|&&i| i == k).count();
        assert!(count(1) > 1800, "{}", count(1));
        assert!(count(2) < 60, "{}", count(2));
    }

    #[test]
    fn the_pick_is_reproducible_from_the_seed() {
        let (a, b, c) = (pod(0, 1, 0, 0.0), pod(1, 1, 0, 0.0), pod(2, 1, 0, 0.0));
        let mut pods = [a, b, c];
        for p in &mut pods {
            p.in_flight.requests = 1;
        }
        let cands = [
            cand(&pods[0], 0, 10, 100.0),
            cand(&pods[1], 0, 10, 120.0),
            cand(&pods[2], 0, 10, 140.0),
        ];
        let one = picks(&mut chain(), &facts(10), &cands, 100);
        let two = picks(&mut chain(), &facts(10), &cands, 100);
        assert_eq!(one, two);
        assert!(one.contains(&1) && one.contains(&0));
    }
}
