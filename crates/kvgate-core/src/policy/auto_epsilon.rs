//! `epsilon_explore_sticky = "auto"`: the affinity gate's explore rate raised when exploring is
//! worth more, decaying back to a floor.
//!
//! Exploring sends a request past its sticky pods, which seeds caches on other pods and gives
//! the predictor samples from pods it would not otherwise see. That is worth most (1) right
//! after pods join, when new pods hold no cache and the gate would leave them cold, and (2)
//! while the predictor is inaccurate, when the gate's latency comparison is least trustworthy
//! and more varied samples help it learn. Otherwise the floor (the fixed default) is enough.
//!
//! ```text
//! join   = 1 when the decision sees more candidate pods than any decision before it (a pod
//!          added; the first decision counts: every pod is new), else
//!          join × 2^(−1 / AUTO_EPSILON_JOIN_HALF_LIFE)
//! error  = clamp((e − AUTO_EPSILON_ERROR_OK) / (AUTO_EPSILON_ERROR_BAD − AUTO_EPSILON_ERROR_OK),
//!                0, 1),   e = the predictor's recent TTFT MAPE (RequestFacts::predictor_ttft_mape)
//! ε      = AUTO_EPSILON_FLOOR + (AUTO_EPSILON_CEILING − AUTO_EPSILON_FLOOR) × max(join, error)
//! ```
//!
//! Parameters (constants; chosen, then measured in EVALUATION.md "Adaptive τ and ε"):
//! - `AUTO_EPSILON_FLOOR` = 0.01: the fixed default ε (llm-d's `epsilonExploreSticky`).
//! - `AUTO_EPSILON_CEILING` = 0.10: at most one request in ten explores.
//! - `AUTO_EPSILON_JOIN_HALF_LIFE` = 1000 decisions: the boost after a join halves every 1000
//!   decisions (a few thousand requests seed a new pod's cache with the popular prefixes).
//! - `AUTO_EPSILON_ERROR_OK` = 0.10: no boost while the TTFT MAPE is at or below 10 % (issue 4's
//!   accuracy aim).
//! - `AUTO_EPSILON_ERROR_BAD` = 0.50: full boost at 50 % MAPE and above.
//!
//! Measured (EVALUATION.md §8): neutral on chat and shared-prefix A, harmful on Mooncake at
//! rate scale 4, where the predictor's error is high *because* the fleet is loaded and extra
//! exploring tipped two of three seeds into growing queues. Not the default.
//!
//! State: two numbers; no clock, no RNG (the gate's one draw per decision is unchanged).

pub const AUTO_EPSILON_FLOOR: f64 = 0.01;
pub const AUTO_EPSILON_CEILING: f64 = 0.10;
pub const AUTO_EPSILON_JOIN_HALF_LIFE: f64 = 1000.0;
pub const AUTO_EPSILON_ERROR_OK: f64 = 0.10;
pub const AUTO_EPSILON_ERROR_BAD: f64 = 0.50;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AutoEpsilon {
    join_boost: f64,
    /// The most candidates any decision has seen.
    max_candidates: usize,
    epsilon: f64,
}

impl Default for AutoEpsilon {
    fn default() -> Self {
        AutoEpsilon {
            join_boost: 0.0,
            max_candidates: 0,
            epsilon: AUTO_EPSILON_FLOOR,
        }
    }
}

impl AutoEpsilon {
    /// The explore rate in force (set by the last [`AutoEpsilon::update`]).
    pub fn epsilon(&self) -> f64 {
        self.epsilon
    }

    /// Updates ε for one decision over `candidates` pods, with the predictor's recent TTFT
    /// MAPE (a fraction; `None` or non-finite = no error boost). Returns the new ε.
    pub fn update(&mut self, candidates: usize, predictor_ttft_mape: Option<f64>) -> f64 {
        // A high-water mark, not the previous count: a decision with fewer candidates (a retry
        // excluding a failed pod, an Envoy subset hint, a pod briefly unhealthy) followed by a
        // normal one is not a join.
        if candidates > self.max_candidates {
            self.join_boost = 1.0;
            self.max_candidates = candidates;
        } else {
            self.join_boost *= (-std::f64::consts::LN_2 / AUTO_EPSILON_JOIN_HALF_LIFE).exp();
        }
        let error_boost = predictor_ttft_mape
            .filter(|e| e.is_finite())
            .map_or(0.0, |e| {
                ((e - AUTO_EPSILON_ERROR_OK) / (AUTO_EPSILON_ERROR_BAD - AUTO_EPSILON_ERROR_OK))
                    .clamp(0.0, 1.0)
            });
        let boost = self.join_boost.max(error_boost);
        self.epsilon = AUTO_EPSILON_FLOOR + (AUTO_EPSILON_CEILING - AUTO_EPSILON_FLOOR) * boost;
        self.epsilon
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_join_raises_epsilon_to_the_ceiling_and_it_halves_back_toward_the_floor() {
        let mut a = AutoEpsilon::default();
        // First decision: every pod is new.
        assert!((a.update(4, Some(0.05)) - AUTO_EPSILON_CEILING).abs() < 1e-12);
        for _ in 0..1000 {
            a.update(4, Some(0.05));
        }
        let half = AUTO_EPSILON_FLOOR + (AUTO_EPSILON_CEILING - AUTO_EPSILON_FLOOR) / 2.0;
        assert!((a.epsilon() - half).abs() < 1e-9, "{}", a.epsilon());
        for _ in 0..20_000 {
            a.update(4, Some(0.05));
        }
        assert!(a.epsilon() - AUTO_EPSILON_FLOOR < 1e-6, "{}", a.epsilon());
        // A pod joins: back to the ceiling. A pod leaving is not a join.
        assert!((a.update(5, None) - AUTO_EPSILON_CEILING).abs() < 1e-12);
        let mut b = AutoEpsilon::default();
        b.update(5, None);
        for _ in 0..20_000 {
            b.update(5, None);
        }
        assert!(b.update(4, None) - AUTO_EPSILON_FLOOR < 1e-6);
        // Back to 5 after a decision over fewer (a retry, a subset hint): not a join either.
        assert!(b.update(5, None) - AUTO_EPSILON_FLOOR < 1e-6);
    }

    #[test]
    fn predictor_error_raises_epsilon_linearly_between_the_bounds() {
        let mut a = AutoEpsilon::default();
        a.update(2, None);
        for _ in 0..30_000 {
            a.update(2, None);
        }
        let span = AUTO_EPSILON_CEILING - AUTO_EPSILON_FLOOR;
        assert!((a.update(2, Some(0.10)) - AUTO_EPSILON_FLOOR).abs() < 1e-6);
        assert!((a.update(2, Some(0.30)) - (AUTO_EPSILON_FLOOR + span / 2.0)).abs() < 1e-6);
        assert!((a.update(2, Some(0.90)) - AUTO_EPSILON_CEILING).abs() < 1e-12);
        assert!((a.update(2, Some(f64::NAN)) - AUTO_EPSILON_FLOOR).abs() < 1e-6);
    }
}
