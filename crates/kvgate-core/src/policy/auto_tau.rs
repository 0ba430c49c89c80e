//! `affinity_gate_tau = "auto"`: the affinity gate's threshold chosen from the prefix scores it
//! sees, with Otsu's method.
//!
//! Why: τ separates "this pod holds the request's conversation" from "this pod shares a little
//! of it". On multi-turn traffic the best pod's prefix score is bimodal (near 0 for a new
//! prefix, near 1 for a continued conversation) and any τ in the valley works; where the modes
//! sit elsewhere (a long shared system prompt and a short question, or the reverse) a fixed 0.80
//! can fall inside a mode and split it. Otsu's threshold is the valley of a bimodal histogram.
//!
//! ```text
//! every decision with ≥ 1 prompt block: hist[bin(best prefix score)] += 1
//! every AUTO_TAU_PERIOD decisions:
//!   if total weight ≥ AUTO_TAU_MIN_WEIGHT:
//!     k* = argmax_k  w0(k) · w1(k) · (μ0(k) − μ1(k))²     (between-class variance; class 0 =
//!                                                          bins 0..=k, class 1 = the rest)
//!     ties (a flat valley of empty bins): the middle of the run of maximal k
//!     if both classes hold ≥ AUTO_TAU_MIN_CLASS_SHARE of the weight:
//!       τ = clamp(upper edge of bin k*, AUTO_TAU_MIN, AUTO_TAU_MAX)
//!   hist *= AUTO_TAU_DECAY                                (older decisions weigh less)
//! ```
//!
//! Parameters (constants; each chosen, not measured, unless EVALUATION.md says otherwise):
//! - `AUTO_TAU_BINS` = 100: histogram bins over [0, 1] (resolution 0.01, as τ is usually given).
//! - `AUTO_TAU_PERIOD` = 256 decisions between recomputations (O(bins) work each, ~0.4 ns per
//!   decision amortised).
//! - `AUTO_TAU_DECAY` = 0.5 after each recomputation: a decision k periods old weighs 2^-k, so
//!   the histogram reflects the last ~512 decisions and follows a change of traffic in a few
//!   periods.
//! - `AUTO_TAU_MIN_WEIGHT` = 100: below this many (decayed) samples τ is not changed.
//! - `AUTO_TAU_MIN_CLASS_SHARE` = 0.02: a split that leaves less than 2 % of the weight on one
//!   side is not a second mode (a unimodal histogram); τ is kept.
//! - `AUTO_TAU_MIN` = 0.20, `AUTO_TAU_MAX` = 0.95: the sane range. Below 0.20 a pod saving less
//!   than a fifth of the prefill would be followed; above 0.95 long conversations, whose new
//!   turn is a few percent of the prompt, would stop being sticky.
//! - Start value: 0.80 (the fixed default) until the first recomputation.
//!
//! Memory: `AUTO_TAU_BINS` f64 per router. No clock and no RNG: the sequence of τ depends only
//! on the sequence of decisions. The state lives in the router's gate: a new router (the
//! gateway rebuilds it when a config reload changes the router section) starts again at 0.80.

pub const AUTO_TAU_BINS: usize = 100;
pub const AUTO_TAU_PERIOD: u32 = 256;
pub const AUTO_TAU_DECAY: f64 = 0.5;
pub const AUTO_TAU_MIN_WEIGHT: f64 = 100.0;
pub const AUTO_TAU_MIN_CLASS_SHARE: f64 = 0.02;
pub const AUTO_TAU_MIN: f64 = 0.20;
pub const AUTO_TAU_MAX: f64 = 0.95;

/// The decayed histogram of best-pod prefix scores and the τ it last gave.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AutoTau {
    hist: [f64; AUTO_TAU_BINS],
    since_update: u32,
    tau: f64,
    updates: u64,
}

impl AutoTau {
    pub fn new(start_tau: f64) -> Self {
        AutoTau {
            hist: [0.0; AUTO_TAU_BINS],
            since_update: 0,
            tau: start_tau,
            updates: 0,
        }
    }

    /// The threshold in force.
    pub fn tau(&self) -> f64 {
        self.tau
    }

    /// Recomputations that changed nothing or set τ so far.
    pub fn updates(&self) -> u64 {
        self.updates
    }

    /// Learns one decision's best prefix score (any f64; non-finite values are ignored,
    /// others clamped into [0, 1]) and recomputes τ every `AUTO_TAU_PERIOD` decisions.
    pub fn observe(&mut self, best_prefix_score: f64) {
        if !best_prefix_score.is_finite() {
            return;
        }
        let s = best_prefix_score.clamp(0.0, 1.0);
        let bin = ((s * AUTO_TAU_BINS as f64) as usize).min(AUTO_TAU_BINS - 1);
        self.hist[bin] += 1.0;
        self.since_update += 1;
        if self.since_update >= AUTO_TAU_PERIOD {
            self.since_update = 0;
            self.updates += 1;
            if let Some(t) = otsu_threshold(&self.hist, AUTO_TAU_MIN_WEIGHT) {
                self.tau = t.clamp(AUTO_TAU_MIN, AUTO_TAU_MAX);
            }
            for h in &mut self.hist {
                *h *= AUTO_TAU_DECAY;
            }
        }
    }
}

/// Otsu's threshold of a histogram over [0, 1] (bin i covers [i/n, (i+1)/n)): the upper edge
/// of the last bin of the lower class, in the middle of the run of splits of maximal
/// between-class variance. `None` when the weight is below `min_weight` or the best split
/// leaves less than `AUTO_TAU_MIN_CLASS_SHARE` on a side.
pub fn otsu_threshold(hist: &[f64], min_weight: f64) -> Option<f64> {
    let n = hist.len();
    let total: f64 = hist.iter().sum();
    if n < 2 || !(total.is_finite() && total >= min_weight && total > 0.0) {
        return None;
    }
    let centre = |i: usize| (i as f64 + 0.5) / n as f64;
    let total_moment: f64 = hist.iter().enumerate().map(|(i, h)| h * centre(i)).sum();
    // Between-class variance of every split k = 0..n-2 (class 0 = bins 0..=k), in order.
    let variances = || {
        let (mut w0, mut m0) = (0.0, 0.0);
        hist[..n - 1].iter().enumerate().map(move |(k, &h)| {
            w0 += h;
            m0 += h * centre(k);
            let w1 = total - w0;
            if w0 > 0.0 && w1 > 0.0 {
                let d = m0 / w0 - (total_moment - m0) / w1;
                w0 * w1 * d * d
            } else {
                0.0
            }
        })
    };
    let best = variances().fold(0.0_f64, f64::max);
    if best <= 0.0 {
        return None;
    }
    let near_best = |v: f64| v >= best * (1.0 - 1e-9);
    let first = variances().position(near_best)?;
    // The run of (near-)maximal splits from `first`: a valley of empty bins.
    let run = variances()
        .skip(first)
        .take_while(|&v| near_best(v))
        .count();
    let last = first + run.saturating_sub(1);
    let lower: f64 = hist[..=first].iter().sum();
    if lower.min(total - lower) / total < AUTO_TAU_MIN_CLASS_SHARE {
        return None;
    }
    let edge = |k: usize| (k + 1) as f64 / n as f64;
    Some((edge(first) + edge(last)) / 2.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{RngExt, SeedableRng};

    fn hist_of(scores: &[(f64, f64)]) -> [f64; AUTO_TAU_BINS] {
        let mut h = [0.0; AUTO_TAU_BINS];
        for &(s, w) in scores {
            h[((s * 100.0) as usize).min(99)] += w;
        }
        h
    }

    #[test]
    fn otsu_finds_the_middle_of_an_empty_valley_between_two_modes() {
        // Modes at 0.05..0.10 and 0.90..0.95, nothing between: the threshold is the middle of
        // the valley (upper edges 0.11 … 0.90 → 0.505).
        let mut scores = Vec::new();
        for i in 5..=10 {
            scores.push((i as f64 / 100.0 + 0.001, 50.0));
        }
        for i in 90..=95 {
            scores.push((i as f64 / 100.0 + 0.001, 30.0));
        }
        let t = otsu_threshold(&hist_of(&scores), 1.0).unwrap();
        assert!((t - 0.505).abs() < 1e-9, "{t}");
    }

    #[test]
    fn otsu_finds_the_valley_of_two_overlapping_bumps() {
        // Two triangular bumps centred at 0.25 and 0.75 that overlap around 0.5: the
        // threshold is at the valley bottom, within a bin or two of 0.5.
        let mut h = [0.0; AUTO_TAU_BINS];
        for (i, slot) in h.iter_mut().enumerate() {
            let x = (i as f64 + 0.5) / 100.0;
            let bump = |c: f64| (0.3 - (x - c).abs()).max(0.0);
            *slot = 100.0 * (bump(0.25) + bump(0.75));
        }
        let t = otsu_threshold(&h, 1.0).unwrap();
        assert!((t - 0.5).abs() <= 0.02, "{t}");
    }

    #[test]
    fn otsu_declines_a_single_spike_or_too_little_weight() {
        assert_eq!(otsu_threshold(&hist_of(&[(0.0, 1000.0)]), 1.0), None);
        // 99.5 % at 0: the other side holds less than the 2 % minimum.
        assert_eq!(
            otsu_threshold(&hist_of(&[(0.0, 995.0), (0.9, 5.0)]), 1.0),
            None
        );
        assert_eq!(
            otsu_threshold(&hist_of(&[(0.1, 40.0), (0.9, 40.0)]), 100.0),
            None
        );
        assert_eq!(otsu_threshold(&[], 0.0), None);
    }

    #[test]
    fn auto_tau_keeps_its_start_value_until_the_first_period() {
        let mut a = AutoTau::new(0.8);
        for i in 0..AUTO_TAU_PERIOD - 1 {
            a.observe(if i % 2 == 0 { 0.05 } else { 0.5 });
        }
        assert_eq!(a.tau(), 0.8);
        a.observe(0.05);
        assert!((a.tau() - 0.28).abs() < 0.05, "{}", a.tau());
    }

    /// `n` seeded scores: 60 % ~U[lo.0, lo.1] (new prefixes), 40 % ~U[hi.0, hi.1].
    fn stream(a: &mut AutoTau, lo: (f64, f64), hi: (f64, f64), n: usize, seed: u64) {
        let mut rng = rand::rngs::ChaCha8Rng::seed_from_u64(seed);
        for _ in 0..n {
            let (from, to) = if rng.random::<f64>() < 0.6 { lo } else { hi };
            a.observe(from + rng.random::<f64>() * (to - from));
        }
    }

    #[test]
    fn auto_tau_converges_to_the_valley_of_a_synthetic_score_stream_and_follows_a_change() {
        // New prefixes score 0..0.15, continued conversations 0.55..0.7: τ settles in the
        // valley 0.15..0.55.
        let mut a = AutoTau::new(0.8);
        stream(&mut a, (0.0, 0.15), (0.55, 0.7), 5000, 7);
        let t = a.tau();
        assert!((0.15..0.55).contains(&t), "tau {t}");
        // Traffic changes: a shared system prompt lifts new prefixes to 0.3..0.45, longer
        // conversations score 0.9..1. Within 5000 decisions τ is in the new valley.
        stream(&mut a, (0.3, 0.45), (0.9, 1.0), 5000, 8);
        let t = a.tau();
        assert!((0.45..0.9).contains(&t), "tau {t}");
        assert_eq!(a.updates(), 10_000 / u64::from(AUTO_TAU_PERIOD));
    }

    #[test]
    fn auto_tau_is_clamped_to_the_sane_range_and_ignores_garbage() {
        let mut a = AutoTau::new(0.8);
        // Modes at 0 and 0.02: Otsu says ~0.01, clamped up to the minimum.
        for i in 0..1024 {
            a.observe(if i % 2 == 0 { 0.0 } else { 0.025 });
            a.observe(f64::NAN);
        }
        assert_eq!(a.tau(), AUTO_TAU_MIN);
        let mut a = AutoTau::new(0.8);
        for i in 0..1024 {
            a.observe(if i % 2 == 0 {
                0.5
            } else {
                f64::INFINITY.min(7.0)
            });
        }
        // 7.0 is clamped to 1.0: modes 0.5 and 1.0, valley edge ~0.75.
        assert!((a.tau() - 0.755).abs() < 0.01, "{}", a.tau());
    }
}
