//! The models a pod class can use, behind one trait ([`LatencyModel`]), and the config key that
//! picks one (`predictor_model`, [`ModelKind`]):
//!
//! | `predictor_model` | model | learns |
//! |---|---|---|
//! | `rls` (default) | [`RlsModel`]: per target an online ridge regression with forgetting ([`super::rls`]) | every sample, O(d²) |
//! | `rls-rel` | [`RlsModel`], TTFT fitted on relative error (each sample weighted 1/y²) | as `rls` |
//! | `rls-split` | [`RlsModel`] with two TTFT regressions: queued vs admitted at once ([`Features::queued`]) | as `rls` |
//! | `rls-split-rel` | both of the above | as `rls` |
//! | `gbdt` | [`GbdtModel`]: gradient-boosted trees, squared error on ln y ([`super::gbdt`]) | retrained from bucketed samples ([`super::samples`]) every `gbdt_retrain_every` samples |
//! | `gbdt-p90` | [`GbdtModel`] with pinball loss at τ = 0.9: predicts the p90 (as llm-d's quantile objective) | as `gbdt` |
//! | `analytic` | [`AnalyticModel`]: the cold-start formulas only ([`super::analytic`]) | nothing |
//!
//! **Relative-error fit** (`rls-rel`, `rls-split-rel`). Plain RLS minimises the squared error
//! in ms, so a workload whose TTFTs span 10 ms to 100 s is fitted for its slowest requests and
//! the many short ones carry large relative errors. Weighting each sample by 1/y² (RLS on
//! (x/y, 1)) minimises Σ((y − wᵀx)/y)² instead — the squared relative error, close to what MAPE
//! and the p90 ratio tracker measure. Weights, prior and prediction are unchanged in meaning.
//!
//! **Queued split** (`rls-split`, `rls-split-rel`; llm-d's `is_queued` split,
//! reference/llmd-predicted-latency.md §2.1). A request that will wait (the pod reports waiting
//! requests, or its KV is short, or the router's in-flight prefill tokens pass
//! `queued_prefill_tokens`) has a TTFT made of queueing; one admitted at once, of its own
//! prefill. Each regime gets its own TTFT regression (both start from the analytic prior and
//! each is used once it has `min_samples` samples; until then the other regime's, then the
//! analytic estimate), and the predictor tracks a p90 ratio per regime. TPOT is not split.
//!
//! A model answers `None` for a target while it has too little data; the predictor then answers
//! with the analytic estimate. Each class of pods has its own model (as RLS always had).

use super::PredictorConfig;
use super::analytic;
use super::features::{Features, TPOT_DIM, TTFT_DIM};
use super::gbdt_model::GbdtModel;
use super::rls::{OnlineRegressor, Rls};
use super::samples::Sample;
use serde::{Deserialize, Serialize};

/// Which target a call is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Ttft,
    Tpot,
}

/// A latency model of one pod class.
pub trait LatencyModel {
    /// TTFT in ms for sanitised features; `None` while the model has too little data.
    fn predict_ttft(&self, f: &Features) -> Option<f64>;
    /// Mean TPOT in ms for sanitised features; `None` while the model has too little data.
    fn predict_tpot(&self, f: &Features) -> Option<f64>;
    /// Both targets.
    fn predict(&self, f: &Features) -> (Option<f64>, Option<f64>) {
        (self.predict_ttft(f), self.predict_tpot(f))
    }
    /// Learns from one completed request (sanitised features, targets already validated).
    fn observe(&mut self, sample: &Sample);
    /// Called before [`LatencyModel::observe`] for a target the drift detector scored: whether a
    /// drift episode just started, and the forgetting factor to use now.
    fn adapt(&mut self, target: Target, episode_started: bool, forgetting_factor: f64);
    /// Samples of `target` learnt since creation or the last reset.
    fn samples(&self, target: Target) -> u64;
    /// Times the model reset itself after a numerical failure.
    fn resets(&self) -> u64 {
        0
    }
}

/// The value of the `predictor_model` config key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ModelKind {
    /// Online ridge regression with forgetting (recursive least squares).
    #[default]
    Rls,
    /// Gradient-boosted trees, squared error.
    Gbdt,
    /// Gradient-boosted trees, pinball loss at τ = 0.9 (predicts the p90).
    GbdtP90,
    /// The analytic cold-start estimate only.
    Analytic,
    /// RLS with the TTFT fitted on relative error.
    RlsRel,
    /// RLS with one TTFT regression per regime (queued / admitted at once).
    RlsSplit,
    /// Both.
    RlsSplitRel,
}

impl ModelKind {
    pub const ALL: [ModelKind; 7] = [
        ModelKind::Rls,
        ModelKind::Gbdt,
        ModelKind::GbdtP90,
        ModelKind::Analytic,
        ModelKind::RlsRel,
        ModelKind::RlsSplit,
        ModelKind::RlsSplitRel,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ModelKind::Rls => "rls",
            ModelKind::Gbdt => "gbdt",
            ModelKind::GbdtP90 => "gbdt-p90",
            ModelKind::Analytic => "analytic",
            ModelKind::RlsRel => "rls-rel",
            ModelKind::RlsSplit => "rls-split",
            ModelKind::RlsSplitRel => "rls-split-rel",
        }
    }

    /// Whether the TTFT model (and the p90 tracker) is split by regime (queued or not).
    pub fn is_split(self) -> bool {
        matches!(self, ModelKind::RlsSplit | ModelKind::RlsSplitRel)
    }

    /// Whether the TTFT regression is fitted on relative error.
    pub fn is_relative(self) -> bool {
        matches!(self, ModelKind::RlsRel | ModelKind::RlsSplitRel)
    }

    /// Whether the model predicts the p90 rather than a central value.
    pub fn is_p90(self) -> bool {
        self == ModelKind::GbdtP90
    }
}

impl std::str::FromStr for ModelKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ModelKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| {
                format!(
                    "unknown predictor model {s:?} (rls, rls-rel, rls-split, rls-split-rel, gbdt, \
                     gbdt-p90, analytic)"
                )
            })
    }
}

impl std::fmt::Display for ModelKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Reference TTFT of the relative-error fit: a sample of this TTFT weighs as much as in the
/// plain fit (so `ridge_delta` keeps its meaning strength `ridge_delta` keeps its meaning there).
pub const RELATIVE_SCALE_MS: f64 = 100.0;

/// The online ridge/RLS model: one [`Rls`] per target (two for TTFT when split), each used
/// once it has `min_samples` samples.
#[derive(Debug, Clone)]
pub struct RlsModel {
    /// TTFT of every request, or of those admitted at once when split.
    ttft: Rls<TTFT_DIM>,
    /// TTFT of queued requests when split.
    ttft_queued: Option<Rls<TTFT_DIM>>,
    tpot: Rls<TPOT_DIM>,
    min_samples: u64,
    relative: bool,
    queued_prefill_tokens: f64,
}

impl RlsModel {
    pub fn new(config: &PredictorConfig) -> Self {
        let ttft = Rls::new(
            analytic::ttft_prior(config),
            config.forgetting_factor,
            config.ridge_delta,
        );
        RlsModel {
            ttft_queued: config.model.is_split().then(|| ttft.clone()),
            ttft,
            tpot: Rls::new(
                analytic::tpot_prior(config),
                config.forgetting_factor,
                config.ridge_delta,
            ),
            min_samples: config.min_samples,
            relative: config.model.is_relative(),
            queued_prefill_tokens: config.queued_prefill_tokens,
        }
    }

    /// The TTFT regressions for these features: the regime's own first, then the other one.
    fn ttft_models(&self, f: &Features) -> (&Rls<TTFT_DIM>, Option<&Rls<TTFT_DIM>>) {
        match &self.ttft_queued {
            Some(q) if f.queued(self.queued_prefill_tokens) => (q, Some(&self.ttft)),
            Some(q) => (&self.ttft, Some(q)),
            None => (&self.ttft, None),
        }
    }

    fn ttft_models_mut(&mut self) -> impl Iterator<Item = &mut Rls<TTFT_DIM>> {
        std::iter::once(&mut self.ttft).chain(self.ttft_queued.as_mut())
    }
}

impl LatencyModel for RlsModel {
    fn predict_ttft(&self, f: &Features) -> Option<f64> {
        let (own, other) = self.ttft_models(f);
        let x = f.ttft_vector();
        std::iter::once(own)
            .chain(other)
            .find(|m| m.samples() >= self.min_samples)
            .map(|m| m.predict(&x))
    }

    fn predict_tpot(&self, f: &Features) -> Option<f64> {
        (self.tpot.samples() >= self.min_samples).then(|| self.tpot.predict(&f.tpot_vector()))
    }

    fn observe(&mut self, sample: &Sample) {
        if let Some(y) = sample.ttft_ms {
            let x = sample.features.ttft_vector();
            let queued = sample.features.queued(self.queued_prefill_tokens);
            let model = match &mut self.ttft_queued {
                Some(q) if queued => q,
                _ => &mut self.ttft,
            };
            if self.relative {
                // Weighted least squares with weight (s/y)², s = RELATIVE_SCALE_MS: the sample
                // (x·s/y, s). s only keeps the scaled inputs O(1), as the ridge prior expects.
                let w = RELATIVE_SCALE_MS / y;
                model.update(&x.map(|v| v * w), RELATIVE_SCALE_MS);
            } else {
                model.update(&x, y);
            }
        }
        if let Some(y) = sample.tpot_ms {
            self.tpot.update(&sample.features.tpot_vector(), y);
        }
    }

    fn adapt(&mut self, target: Target, episode_started: bool, forgetting_factor: f64) {
        match target {
            Target::Ttft => {
                for m in self.ttft_models_mut() {
                    if episode_started {
                        m.reset_confidence();
                    }
                    m.set_forgetting_factor(forgetting_factor);
                }
            }
            Target::Tpot => {
                if episode_started {
                    self.tpot.reset_confidence();
                }
                self.tpot.set_forgetting_factor(forgetting_factor);
            }
        }
    }

    fn samples(&self, target: Target) -> u64 {
        match target {
            Target::Ttft => self.ttft.samples() + self.ttft_queued.as_ref().map_or(0, Rls::samples),
            Target::Tpot => self.tpot.samples(),
        }
    }

    fn resets(&self) -> u64 {
        self.ttft.resets() + self.ttft_queued.as_ref().map_or(0, Rls::resets) + self.tpot.resets()
    }
}

/// The analytic estimate only: never ready, learns nothing (the predictor's fallback answers).
#[derive(Debug, Clone, Copy, Default)]
pub struct AnalyticModel;

impl LatencyModel for AnalyticModel {
    fn predict_ttft(&self, _: &Features) -> Option<f64> {
        None
    }

    fn predict_tpot(&self, _: &Features) -> Option<f64> {
        None
    }

    fn observe(&mut self, _: &Sample) {}

    fn adapt(&mut self, _: Target, _: bool, _: f64) {}

    fn samples(&self, _: Target) -> u64 {
        0
    }
}

/// The model of one class, dispatched without a vtable (the decision path predicts per pod).
/// RLS is stored inline (its state is the whole model, and the default path keeps no extra
/// indirection); the tree model, with its sample store, is boxed.
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)]
pub enum ClassModel {
    Rls(RlsModel),
    Gbdt(Box<GbdtModel>),
    Analytic(AnalyticModel),
}

impl ClassModel {
    pub fn new(config: &PredictorConfig) -> Self {
        match config.model {
            ModelKind::Rls | ModelKind::RlsRel | ModelKind::RlsSplit | ModelKind::RlsSplitRel => {
                ClassModel::Rls(RlsModel::new(config))
            }
            ModelKind::Gbdt | ModelKind::GbdtP90 => {
                ClassModel::Gbdt(Box::new(GbdtModel::new(config)))
            }
            ModelKind::Analytic => ClassModel::Analytic(AnalyticModel),
        }
    }

    fn inner(&self) -> &dyn LatencyModel {
        match self {
            ClassModel::Rls(m) => m,
            ClassModel::Gbdt(m) => m.as_ref(),
            ClassModel::Analytic(m) => m,
        }
    }

    fn inner_mut(&mut self) -> &mut dyn LatencyModel {
        match self {
            ClassModel::Rls(m) => m,
            ClassModel::Gbdt(m) => m.as_mut(),
            ClassModel::Analytic(m) => m,
        }
    }
}

impl LatencyModel for ClassModel {
    #[inline]
    fn predict_ttft(&self, f: &Features) -> Option<f64> {
        match self {
            ClassModel::Rls(m) => m.predict_ttft(f),
            ClassModel::Gbdt(m) => m.predict_ttft(f),
            ClassModel::Analytic(m) => m.predict_ttft(f),
        }
    }

    #[inline]
    fn predict_tpot(&self, f: &Features) -> Option<f64> {
        match self {
            ClassModel::Rls(m) => m.predict_tpot(f),
            ClassModel::Gbdt(m) => m.predict_tpot(f),
            ClassModel::Analytic(m) => m.predict_tpot(f),
        }
    }

    fn observe(&mut self, sample: &Sample) {
        self.inner_mut().observe(sample)
    }

    fn adapt(&mut self, target: Target, episode_started: bool, forgetting_factor: f64) {
        self.inner_mut()
            .adapt(target, episode_started, forgetting_factor)
    }

    fn samples(&self, target: Target) -> u64 {
        self.inner().samples(target)
    }

    fn resets(&self) -> u64 {
        self.inner().resets()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_names_round_trip_through_str_and_serde() {
        for kind in ModelKind::ALL {
            assert_eq!(kind.name().parse::<ModelKind>(), Ok(kind));
            let json = serde_json::to_value(kind).expect("serialises");
            assert_eq!(json, serde_json::Value::String(kind.name().to_string()));
        }
        assert!("xgboost".parse::<ModelKind>().is_err());
        assert_eq!(ModelKind::default(), ModelKind::Rls);
    }

    #[test]
    fn the_analytic_model_never_answers_so_the_fallback_does() {
        let mut m = ClassModel::new(&PredictorConfig {
            model: ModelKind::Analytic,
            ..PredictorConfig::default()
        });
        let f = Features {
            input_tokens: 1000.0,
            ..Features::default()
        };
        m.observe(&Sample {
            features: f,
            ttft_ms: Some(50.0),
            tpot_ms: Some(5.0),
        });
        assert_eq!(m.predict(&f), (None, None));
        assert_eq!(m.samples(Target::Ttft), 0);
    }
}
