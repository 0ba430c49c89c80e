//! Prequential accuracy: each sample is scored with the model as it was *before* learning from
//! it, so the figures are honest out-of-sample errors.
//!
//! - MAPE: mean of |actual − predicted| / actual over a ring of the last `accuracy_window`
//!   (default 1000) samples, one ring for TTFT and one for TPOT. Memory is fixed at creation.
//! - p90: a stochastic-approximation quantile tracker on ln(actual / predicted) per class
//!   (pinball-loss SGD: q ← q + η·0.9 when the log ratio exceeds q, else q ← q − η·0.1, so at
//!   equilibrium exactly 10 % of ratios lie above e^q). The predicted p90 TTFT is the point
//!   prediction × e^q. Step η = `ttft_p90_step` (default 0.01 in log units: ≈1 % per sample,
//!   enough to settle within ~100 samples and keep coverage noise around ±0.02).
//! - Coverage: fraction of the ring's samples whose actual TTFT was ≤ the p90 predicted for it.

/// A fixed-capacity ring of the most recent values.
#[derive(Debug, Clone)]
pub(crate) struct Window {
    values: Vec<f64>,
    capacity: usize,
    next: usize,
}

impl Window {
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Window {
            values: Vec::with_capacity(capacity),
            capacity,
            next: 0,
        }
    }

    pub(crate) fn push(&mut self, value: f64) {
        if self.values.len() < self.capacity {
            self.values.push(value);
        } else if let Some(slot) = self.values.get_mut(self.next) {
            *slot = value;
        }
        self.next = (self.next + 1) % self.capacity;
    }

    /// Mean of the values held; 0 when empty.
    pub(crate) fn mean(&self) -> f64 {
        if self.values.is_empty() {
            0.0
        } else {
            self.values.iter().sum::<f64>() / self.values.len() as f64
        }
    }
}

/// Tracks the `quantile` of ln(actual / predicted) by stochastic approximation.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LogRatioQuantile {
    log_ratio: f64,
    quantile: f64,
    step: f64,
}

/// The tracked log ratio stays within ±ln 1000, so a run of absurd samples cannot push the
/// quantile anywhere it would take forever to come back from.
const MAX_ABS_LOG_RATIO: f64 = 6.907_755_278_982_137;

impl LogRatioQuantile {
    pub(crate) fn new(initial_ratio: f64, quantile: f64, step: f64) -> Self {
        LogRatioQuantile {
            log_ratio: initial_ratio
                .ln()
                .clamp(-MAX_ABS_LOG_RATIO, MAX_ABS_LOG_RATIO),
            quantile,
            step,
        }
    }

    /// The current ratio estimate (e^q).
    pub(crate) fn ratio(&self) -> f64 {
        self.log_ratio.exp()
    }

    /// Learns from one positive, finite (actual, predicted) pair.
    pub(crate) fn observe(&mut self, actual: f64, predicted: f64) {
        let log_ratio = (actual / predicted).ln();
        if log_ratio.is_nan() {
            return;
        }
        if log_ratio > self.log_ratio {
            self.log_ratio += self.step * self.quantile;
        } else {
            self.log_ratio -= self.step * (1.0 - self.quantile);
        }
        self.log_ratio = self.log_ratio.clamp(-MAX_ABS_LOG_RATIO, MAX_ABS_LOG_RATIO);
    }
}

/// Running prequential scores of the whole predictor.
#[derive(Debug, Clone)]
pub(crate) struct AccuracyTracker {
    ttft_ape: Window,
    tpot_ape: Window,
    ttft_covered: Window,
    pub(crate) ttft_samples: u64,
    pub(crate) tpot_samples: u64,
}

impl AccuracyTracker {
    pub(crate) fn new(window: usize) -> Self {
        AccuracyTracker {
            ttft_ape: Window::with_capacity(window),
            tpot_ape: Window::with_capacity(window),
            ttft_covered: Window::with_capacity(window),
            ttft_samples: 0,
            tpot_samples: 0,
        }
    }

    /// `actual` and `predicted` are positive and finite.
    pub(crate) fn score_ttft(&mut self, actual: f64, predicted: f64, predicted_p90: f64) {
        self.ttft_ape.push((actual - predicted).abs() / actual);
        self.ttft_covered
            .push(if actual <= predicted_p90 { 1.0 } else { 0.0 });
        self.ttft_samples += 1;
    }

    pub(crate) fn score_tpot(&mut self, actual: f64, predicted: f64) {
        self.tpot_ape.push((actual - predicted).abs() / actual);
        self.tpot_samples += 1;
    }

    pub(crate) fn ttft_mape(&self) -> f64 {
        self.ttft_ape.mean()
    }

    pub(crate) fn tpot_mape(&self) -> f64 {
        self.tpot_ape.mean()
    }

    pub(crate) fn ttft_p90_coverage(&self) -> f64 {
        self.ttft_covered.mean()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_keeps_only_the_most_recent_values() {
        let mut w = Window::with_capacity(3);
        assert_eq!(w.mean(), 0.0);
        for v in [100.0, 1.0, 2.0, 3.0] {
            w.push(v);
        }
        assert_eq!(w.mean(), 2.0);
        w.push(6.0);
        assert_eq!(w.mean(), 11.0 / 3.0);
    }

    #[test]
    fn quantile_tracker_settles_at_the_p90_of_a_uniform_ratio() {
        // Ratios e^u with u uniform on [0, 1) from a fixed sequence: p90 of u is 0.9.
        let mut q = LogRatioQuantile::new(1.0, 0.9, 0.01);
        let mut state = 12_345u64;
        for _ in 0..20_000 {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1);
            let u = (state >> 11) as f64 / (1u64 << 53) as f64;
            q.observe(u.exp(), 1.0);
        }
        assert!(
            (q.ratio().ln() - 0.9).abs() < 0.03,
            "got {}",
            q.ratio().ln()
        );
    }

    #[test]
    fn tracker_scores_ape_and_coverage() {
        let mut t = AccuracyTracker::new(10);
        t.score_ttft(100.0, 90.0, 120.0);
        t.score_ttft(200.0, 100.0, 150.0);
        t.score_tpot(10.0, 11.0);
        assert!((t.ttft_mape() - 0.3).abs() < 1e-12);
        assert_eq!(t.ttft_p90_coverage(), 0.5);
        assert!((t.tpot_mape() - 0.1).abs() < 1e-12);
        assert_eq!((t.ttft_samples, t.tpot_samples), (2, 1));
    }
}
