//! Online regressors: the [`OnlineRegressor`] trait and its default implementation, recursive
//! least squares with a forgetting factor and a ridge prior ([`Rls`]).
//!
//! RLS minimises Σₖ λⁿ⁻ᵏ (yₖ − wᵀxₖ)² + λⁿ δ ‖w − w₀‖² exactly after every sample, in O(d²) per
//! update and O(d) per prediction, with no allocation (state is two fixed-size arrays):
//!
//! ```text
//! g = P x            denom = λ + xᵀ g          e = y − wᵀ x
//! w ← w + g e / denom
//! P ← (P − g gᵀ / denom) / λ
//! ```
//!
//! - `forgetting_factor` λ (default 0.999): a sample's weight halves after ln 2 / (1 − λ) ≈ 693
//!   newer samples, so the model tracks a change of regime within a few thousand samples.
//! - `ridge_delta` δ (default 0.01): P₀ = I / δ. The prior mean w₀ is the analytic cold-start
//!   model, so a sparse class shrinks towards the analytic estimate rather than towards zero.
//! - Anti-windup: forgetting inflates P in directions the data never excites (a feature that
//!   stays 0); each diagonal entry is capped at 1/δ (a congruence scaling of its row and column,
//!   which keeps P symmetric positive semi-definite), so P never exceeds its prior uncertainty.
//! - Numerical safety: if an update produces a non-finite weight or covariance entry, or a
//!   non-positive denominator or diagonal, the model resets to its prior (counted in
//!   [`Rls::resets`]). NaN is never propagated.

/// A model of y ≈ f(x) that learns one sample at a time.
pub trait OnlineRegressor<const D: usize> {
    /// The current estimate for `x`. Must not allocate.
    fn predict(&self, x: &[f64; D]) -> f64;
    /// Learns from one sample; `x` and `y` are finite (callers filter).
    fn update(&mut self, x: &[f64; D], y: f64);
    /// Samples learnt since creation or the last reset.
    fn samples(&self) -> u64;
}

/// Recursive least squares with exponential forgetting and a ridge prior (see module docs).
#[derive(Debug, Clone)]
pub struct Rls<const D: usize> {
    weights: [f64; D],
    covariance: [[f64; D]; D],
    prior: [f64; D],
    forgetting_factor: f64,
    ridge_delta: f64,
    samples: u64,
    resets: u64,
}

impl<const D: usize> Rls<D> {
    /// `prior` is w₀; `forgetting_factor` in (0, 1]; `ridge_delta` > 0.
    pub fn new(prior: [f64; D], forgetting_factor: f64, ridge_delta: f64) -> Self {
        let mut rls = Rls {
            weights: prior,
            covariance: [[0.0; D]; D],
            prior,
            forgetting_factor,
            ridge_delta,
            samples: 0,
            resets: 0,
        };
        rls.restore_prior();
        rls
    }

    pub fn weights(&self) -> &[f64; D] {
        &self.weights
    }

    pub fn forgetting_factor(&self) -> f64 {
        self.forgetting_factor
    }

    /// Keeps the weights but resets the covariance to its prior I/δ, so the next samples move
    /// the weights as if the model had just started from them ("covariance resetting").
    fn reset_confidence(&mut self) {
        self.covariance = [[0.0; D]; D];
        for (i, row) in self.covariance.iter_mut().enumerate() {
            row[i] = 1.0 / self.ridge_delta;
        }
    }

    /// Times the model had to reset to its prior because of a numerical failure.
    pub fn resets(&self) -> u64 {
        self.resets
    }

    fn restore_prior(&mut self) {
        self.weights = self.prior;
        self.reset_confidence();
        self.samples = 0;
    }

    fn reset(&mut self) {
        self.restore_prior();
        self.resets += 1;
    }

    fn is_healthy(&self) -> bool {
        self.weights.iter().all(|w| w.is_finite())
            && self
                .covariance
                .iter()
                .enumerate()
                .all(|(i, row)| row[i] > 0.0 && row.iter().all(|p| p.is_finite()))
    }
}

impl<const D: usize> OnlineRegressor<D> for Rls<D> {
    fn predict(&self, x: &[f64; D]) -> f64 {
        self.weights.iter().zip(x).map(|(w, x)| w * x).sum()
    }

    fn update(&mut self, x: &[f64; D], y: f64) {
        if !y.is_finite() || x.iter().any(|v| !v.is_finite()) {
            return;
        }
        let lambda = self.forgetting_factor;
        let mut g = [0.0; D];
        for (gi, row) in g.iter_mut().zip(&self.covariance) {
            *gi = row.iter().zip(x).map(|(p, x)| p * x).sum();
        }
        let denom = lambda + g.iter().zip(x).map(|(g, x)| g * x).sum::<f64>();
        if !(denom.is_finite() && denom > 0.0) {
            self.reset();
            return;
        }
        let error = y - self.predict(x);
        for (w, gi) in self.weights.iter_mut().zip(&g) {
            *w += gi / denom * error;
        }
        // g gᵀ is computed from the same vector on both sides, so P stays exactly symmetric.
        for (row, gi) in self.covariance.iter_mut().zip(&g) {
            for (p, gj) in row.iter_mut().zip(&g) {
                *p = (*p - gi * gj / denom) / lambda;
            }
        }
        let cap = 1.0 / self.ridge_delta;
        for i in 0..D {
            let diagonal = self.covariance[i][i];
            if diagonal > cap {
                let s = (cap / diagonal).sqrt();
                for j in 0..D {
                    self.covariance[i][j] *= s;
                    self.covariance[j][i] *= s;
                }
            }
        }
        if !self.is_healthy() {
            self.reset();
            return;
        }
        self.samples += 1;
    }

    fn samples(&self) -> u64 {
        self.samples
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn untrained_model_predicts_with_its_prior() {
        let rls = Rls::new([2.0, 3.0], 0.999, 0.01);
        assert_eq!(rls.predict(&[1.0, 10.0]), 32.0);
        assert_eq!(rls.samples(), 0);
    }

    #[test]
    fn recovers_exact_weights_from_noiseless_samples() {
        let truth = [5.0, -2.0, 0.5];
        let mut rls = Rls::new([0.0; 3], 0.999, 0.01);
        for k in 0..200 {
            let t = k as f64;
            let x = [1.0, (t * 0.37).sin(), (t * 0.11).cos() * 3.0];
            let y: f64 = truth.iter().zip(&x).map(|(w, x)| w * x).sum();
            rls.update(&x, y);
        }
        // The ridge prior (δ = 0.01, towards 0) leaves a bias of order δ / samples.
        for (w, t) in rls.weights().iter().zip(&truth) {
            assert!((w - t).abs() < 1e-3, "weights {:?}", rls.weights());
        }
        assert_eq!(rls.samples(), 200);
    }

    #[test]
    fn covariance_of_unexcited_direction_is_capped_at_prior() {
        let mut rls = Rls::new([0.0; 2], 0.9, 0.01);
        for _ in 0..1000 {
            rls.update(&[1.0, 0.0], 1.0);
        }
        assert!(rls.covariance[1][1] <= 100.0 + 1e-9);
        assert!(rls.covariance[1][1] > 99.0);
    }

    #[test]
    fn overflowing_update_resets_to_prior_instead_of_propagating() {
        let mut rls = Rls::new([1.0, 1.0], 0.999, 0.01);
        rls.update(&[1.0, 1.0], 1e308);
        rls.update(&[1e10, -1e10], -1e308);
        rls.update(&[1e10, 1e10], 1e308);
        assert!(rls.resets() >= 1);
        assert!(rls.weights().iter().all(|w| w.is_finite()));
        assert!(rls.predict(&[1.0, 1.0]).is_finite());
    }

    #[test]
    fn non_finite_sample_is_ignored() {
        let mut rls = Rls::new([1.0], 0.999, 0.01);
        rls.update(&[f64::NAN], 1.0);
        rls.update(&[1.0], f64::INFINITY);
        assert_eq!(rls.samples(), 0);
        assert_eq!(rls.weights(), &[1.0]);
    }
}
