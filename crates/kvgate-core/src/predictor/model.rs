//! The model of one pod class ([`RlsModel`]): per target (TTFT, TPOT) an online ridge regression
//! with forgetting ([`super::rls`]), started from the analytic prior ([`super::analytic`]) and
//! used once it has `min_samples` samples. Until then it answers `None` and the predictor
//! answers with the analytic estimate.
//!
//! It is the one model kvgate ships. The others that were selectable with `predictor_model`
//! (gradient-boosted trees `gbdt` / `gbdt-p90` with the gateway's background trainer, the
//! analytic formulas alone, and the `rls-rel` / `rls-split` / `rls-split-rel` variants of this
//! regression) were removed on 2026-12-07: docs/decisions/predictor-tree-and-analytic-models.md and predictor-rls-variants.md measured none routing
//! better than this one anywhere.

use super::PredictorConfig;
use super::analytic;
use super::features::{Features, TPOT_DIM, TTFT_DIM};
use super::rls::{OnlineRegressor, Rls};

/// Which target a call is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Ttft,
    Tpot,
}

/// One completed request: the features at dispatch and what was observed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// Sanitised features.
    pub features: Features,
    /// Observed TTFT, when it was a valid target.
    pub ttft_ms: Option<f64>,
    /// Observed mean TPOT, when there was one.
    pub tpot_ms: Option<f64>,
}

/// The online ridge/RLS model of one class: one [`Rls`] per target, each used once it has
/// `min_samples` samples.
#[derive(Debug, Clone)]
pub struct RlsModel {
    ttft: Rls<TTFT_DIM>,
    tpot: Rls<TPOT_DIM>,
    min_samples: u64,
}

impl RlsModel {
    pub fn new(config: &PredictorConfig) -> Self {
        RlsModel {
            ttft: Rls::new(
                analytic::ttft_prior(config),
                config.forgetting_factor,
                config.ridge_delta,
            ),
            tpot: Rls::new(
                analytic::tpot_prior(config),
                config.forgetting_factor,
                config.ridge_delta,
            ),
            min_samples: config.min_samples,
        }
    }

    /// TTFT in ms for sanitised features; `None` while the model has too little data.
    #[inline]
    pub fn predict_ttft(&self, f: &Features) -> Option<f64> {
        (self.ttft.samples() >= self.min_samples).then(|| self.ttft.predict(&f.ttft_vector()))
    }

    /// Mean TPOT in ms for sanitised features; `None` while the model has too little data.
    #[inline]
    pub fn predict_tpot(&self, f: &Features) -> Option<f64> {
        (self.tpot.samples() >= self.min_samples).then(|| self.tpot.predict(&f.tpot_vector()))
    }

    /// Learns from one completed request (sanitised features, targets already validated).
    pub fn observe(&mut self, sample: &Sample) {
        if let Some(y) = sample.ttft_ms {
            self.ttft.update(&sample.features.ttft_vector(), y);
        }
        if let Some(y) = sample.tpot_ms {
            self.tpot.update(&sample.features.tpot_vector(), y);
        }
    }

    /// Samples of `target` learnt since creation or the last reset.
    pub fn samples(&self, target: Target) -> u64 {
        match target {
            Target::Ttft => self.ttft.samples(),
            Target::Tpot => self.tpot.samples(),
        }
    }

    /// Times a regressor reset itself after a numerical failure.
    pub fn resets(&self) -> u64 {
        self.ttft.resets() + self.tpot.resets()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_answers_only_after_min_samples_of_each_target() {
        let mut m = RlsModel::new(&PredictorConfig {
            min_samples: 2,
            ..PredictorConfig::default()
        });
        let f = Features {
            input_tokens: 1000.0,
            ..Features::default()
        };
        let ttft_only = Sample {
            features: f,
            ttft_ms: Some(50.0),
            tpot_ms: None,
        };
        m.observe(&ttft_only);
        assert_eq!((m.predict_ttft(&f), m.predict_tpot(&f)), (None, None));
        m.observe(&ttft_only);
        assert!(m.predict_ttft(&f).is_some());
        assert_eq!(m.predict_tpot(&f), None);
        assert_eq!((m.samples(Target::Ttft), m.samples(Target::Tpot)), (2, 0));
    }
}
