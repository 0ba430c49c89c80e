//! Latency predictor: TTFT and TPOT per (request, pod), trained online (DESIGN.md §5).
//!
//! - **Model.** Per pod class, one [`RlsModel`] predicting TTFT and TPOT from the
//!   engineered, O(1)-scaled features of [`features`] ([`model`]; the other models that were
//!   selectable were removed on 2026-12-07, docs/decisions/predictor-tree-and-analytic-models.md, predictor-rls-variants.md). Its regressor is
//!   [`Rls`], one per target:
//!   recursive least squares with forgetting factor λ = `forgetting_factor` (0.999) and a ridge
//!   prior P₀ = I/δ, δ = `ridge_delta` (0.01), centred on the analytic model. Targets are
//!   predicted on a linear scale (TTFT is close to additive in tokens of work); every output is
//!   clamped to [`min_predicted_ms`, `max_predicted_ms`] and is always finite.
//! - **Classes.** Up to `max_classes` (64) classes, each with its own models, looked up linearly
//!   by name (a fleet has a handful). Classes first seen after the table is full share one
//!   fallback pair of models; memory is bounded.
//! - **Cold start.** Until a class has `min_samples` (32; the router config's
//!   `predictor_min_samples` sets it, 32 in both profiles) TTFT samples its TTFT is the analytic
//!   estimate of [`analytic`] (llm-d's in-flight prefill tokens / peak prefill throughput,
//!   15 928 tok/s); likewise for TPOT with its own sample count. The regressors train from the
//!   first sample, and they start from the analytic weights, so the hand-over is smooth.
//! - **Accuracy** ([`accuracy`]): prequential MAPE over the last `accuracy_window` (1000)
//!   samples, and a per-class p90 TTFT from a tracked quantile of actual/predicted, with its
//!   coverage. See [`LatencyPredictor::predict_p90_ttft`].
//! - **Drift** ([`drift`]): per class and target, a recent and a long-run mean of the absolute
//!   percentage error; an episode runs while the recent one is past max(2 × long-run, 20 %).
//!   Episodes are counted ([`AccuracyReport::drift_episodes`],
//!   [`LatencyPredictor::class_reports`]); the predictor does not adapt on them
//!   (docs/decisions/predictor-drift-adaptation.md).
//! - **Rejected input.** Targets that are non-finite or outside [`min_predicted_ms`,
//!   `max_predicted_ms`] (so ≤ 0 too) are ignored and counted (`rejected_targets`); samples whose features are not finite are ignored and counted
//!   (`rejected_features`). Prediction accepts any features: they are sanitised first.
//!
//! `predict` is allocation-free (stack vectors, a linear scan of the class table). `observe` is
//! O(d²) with d ≤ 10 and allocates only the first time it sees a class.

pub mod accuracy;
pub mod analytic;
pub mod drift;
pub mod features;
pub mod model;
pub mod rls;

pub use features::{Features, TPOT_DIM, TTFT_DIM};
pub use model::RlsModel;
pub use rls::{OnlineRegressor, Rls};

use accuracy::{AccuracyTracker, LogRatioQuantile};
use drift::{DriftBounds, DriftDetector};
use model::{Sample, Target};
use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Prediction {
    pub ttft_ms: f64,
    pub tpot_ms: f64,
}

/// Running accuracy of the predictor's recent predictions (prequential: each sample is scored
/// with the model as it was before learning from it).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct AccuracyReport {
    /// TTFT samples learnt (all classes).
    pub samples: u64,
    /// TPOT samples learnt (all classes).
    pub tpot_samples: u64,
    /// Mean absolute percentage error as a fraction (0.05 = 5 %), over the last
    /// `accuracy_window` samples.
    pub ttft_mape: f64,
    pub tpot_mape: f64,
    /// Fraction of observed TTFTs at or below the predicted p90 (ideal: 0.9).
    pub ttft_p90_coverage: f64,
    /// TTFT or TPOT targets ignored for being non-finite or outside [`min_predicted_ms`,
    /// `max_predicted_ms`] (which also excludes ≤ 0).
    pub rejected_targets: u64,
    /// Samples ignored because a feature was not finite.
    pub rejected_features: u64,
    /// Times a regressor hit a numerical failure and was reset to its prior.
    pub model_resets: u64,
    /// Drift episodes started so far (all classes, TTFT and TPOT).
    pub drift_episodes: u64,
    /// Classes whose TTFT or TPOT model is in a drift episode now.
    pub drifting_classes: u64,
}

/// Accuracy and drift state of one pod class ([`LatencyPredictor::class_reports`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClassAccuracy {
    pub class: String,
    /// TTFT samples the class's model has learnt.
    pub ttft_samples: u64,
    /// Recent and long-run mean absolute percentage error of TTFT (fractions; see [`drift`]).
    pub ttft_recent_error: f64,
    pub ttft_long_run_error: f64,
    pub tpot_recent_error: f64,
    pub tpot_long_run_error: f64,
    /// Whether the TTFT or the TPOT model is in a drift episode now (adapting faster).
    pub drift_active: bool,
    /// Drift episodes started for this class (TTFT and TPOT).
    pub drift_episodes: u64,
    /// TPOT samples the class's model has learnt.
    pub tpot_samples: u64,
    /// Recent fraction of the class's TTFTs at or below their predicted p90 (exponentially
    /// weighted, α = [`CLASS_COVERAGE_ALPHA`]: about the last 100 samples; ideal 0.9).
    pub ttft_p90_coverage: f64,
}

/// Weight of one sample in a class's recent p90 coverage (plain mean for the first 100).
pub const CLASS_COVERAGE_ALPHA: f64 = 0.01;

/// Predictor settings. Out-of-range values are replaced by their defaults in
/// [`LatencyPredictor::new`]; [`PredictorConfig::validate`] reports them.
#[derive(Debug, Clone, PartialEq)]
pub struct PredictorConfig {
    /// RLS forgetting factor λ in (0, 1]. Default 0.999: half-life ≈ 693 samples.
    pub forgetting_factor: f64,
    /// Ridge prior strength δ > 0; P₀ = I/δ on O(1)-scaled features. Default 0.01 (weak: the
    /// prior is worth about 1 % of one sample, and also caps covariance wind-up).
    pub ridge_delta: f64,
    /// TTFT (resp. TPOT) samples a class needs before its regressor replaces the analytic
    /// estimate. Default 32 (enough for 9 weights to be determined several times over).
    pub min_samples: u64,
    /// Classes with their own models; later classes share one fallback. Default 64.
    pub max_classes: usize,
    /// Peak prefill throughput of the analytic TTFT estimate. Default 15 928 tok/s: llm-d's
    /// `peakPrefillThroughput` (Qwen3-32B, 2×H100 TP=2, vLLM 0.19, 8192-token chunks;
    /// reference/llmd-predicted-latency.md §1.2).
    pub peak_prefill_tokens_per_s: f64,
    /// Fixed cost of the analytic TTFT. Default 6 ms: one engine step's t0 (Llama-3-8B on H100,
    /// DESIGN.md §6).
    pub ttft_t0_ms: f64,
    /// Base of the analytic TPOT. Default 6 ms: one decode step's t0 (DESIGN.md §6).
    pub tpot_t0_ms: f64,
    /// Per running sequence term of the analytic TPOT. Default 0.006 ms (b ≈ 6 µs/seq, §6).
    pub tpot_per_running_seq_ms: f64,
    /// Per decode-token-in-flight term of the analytic TPOT (context read per step). Default
    /// 0.000 04 ms (k ≈ 0.04 µs/token, DESIGN.md §6).
    pub tpot_per_context_token_ms: f64,
    /// Samples in the MAPE and coverage windows. Default 1000.
    pub accuracy_window: usize,
    /// Step of the p90 ratio tracker, in ln units per sample. Default 0.01.
    pub ttft_p90_step: f64,
    /// Ratio p90/point assumed before a class has data. Default 1.5 (a guess; it adapts within
    /// a few dozen samples).
    pub ttft_p90_initial_ratio: f64,
    /// Whether the TTFT model sees the KV-shortfall feature (memory pressure; see
    /// [`features`]). Default true; false is the ablation measured in
    /// docs/decisions/predictor-model-rls.md.
    pub kv_shortfall_feature: bool,
    /// Weight of the recent error mean. Default 0.05 (≈ the last 20 samples).
    pub drift_recent_alpha: f64,
    /// Weight of the long-run error mean. Default 0.002 (≈ the last 500 samples).
    pub drift_long_run_alpha: f64,
    /// An episode starts when the recent error exceeds this multiple of the long-run one…
    /// Default 2.
    pub drift_error_ratio: f64,
    /// …and this absolute error (fraction). Default 0.20.
    pub drift_min_error: f64,
    /// Floor of every prediction, and the smallest target accepted. Default 0.1 ms.
    pub min_predicted_ms: f64,
    /// Ceiling of every prediction, and the largest target accepted. Default 3 600 000 ms (1 h).
    pub max_predicted_ms: f64,
}

impl Default for PredictorConfig {
    fn default() -> Self {
        PredictorConfig {
            forgetting_factor: 0.999,
            ridge_delta: 0.01,
            min_samples: 32,
            max_classes: 64,
            peak_prefill_tokens_per_s: 15_928.0,
            ttft_t0_ms: 6.0,
            tpot_t0_ms: 6.0,
            tpot_per_running_seq_ms: 0.006,
            tpot_per_context_token_ms: 0.000_04,
            accuracy_window: 1000,
            ttft_p90_step: 0.01,
            ttft_p90_initial_ratio: 1.5,
            kv_shortfall_feature: true,
            drift_recent_alpha: 0.05,
            drift_long_run_alpha: 0.002,
            drift_error_ratio: 2.0,
            drift_min_error: 0.2,
            min_predicted_ms: 0.1,
            max_predicted_ms: 3_600_000.0,
        }
    }
}

/// A [`PredictorConfig`] field outside its valid range.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("predictor config: {field} = {value} is out of range ({expected})")]
pub struct PredictorConfigError {
    pub field: &'static str,
    pub value: String,
    pub expected: &'static str,
}

impl PredictorConfig {
    /// Checks every field; the first invalid one is reported.
    pub fn validate(&self) -> Result<(), PredictorConfigError> {
        match self.sanitize_report() {
            (_, Some(e)) => Err(e),
            (_, None) => Ok(()),
        }
    }

    /// The config with invalid fields replaced by defaults, and the first invalid field.
    fn sanitize_report(&self) -> (PredictorConfig, Option<PredictorConfigError>) {
        let d = PredictorConfig::default();
        let mut first = None;
        let positive = |v: f64| v.is_finite() && v > 0.0;
        let non_negative = |v: f64| v.is_finite() && v >= 0.0;
        let mut c = self.clone();
        c.forgetting_factor = checked(
            positive(c.forgetting_factor) && c.forgetting_factor <= 1.0,
            ("forgetting_factor", "(0, 1]"),
            c.forgetting_factor,
            d.forgetting_factor,
            &mut first,
        );
        c.ridge_delta = checked(
            positive(c.ridge_delta),
            ("ridge_delta", "> 0"),
            c.ridge_delta,
            d.ridge_delta,
            &mut first,
        );
        c.peak_prefill_tokens_per_s = checked(
            positive(c.peak_prefill_tokens_per_s),
            ("peak_prefill_tokens_per_s", "> 0"),
            c.peak_prefill_tokens_per_s,
            d.peak_prefill_tokens_per_s,
            &mut first,
        );
        for (field, value, default) in [
            ("ttft_t0_ms", &mut c.ttft_t0_ms, d.ttft_t0_ms),
            ("tpot_t0_ms", &mut c.tpot_t0_ms, d.tpot_t0_ms),
            (
                "tpot_per_running_seq_ms",
                &mut c.tpot_per_running_seq_ms,
                d.tpot_per_running_seq_ms,
            ),
            (
                "tpot_per_context_token_ms",
                &mut c.tpot_per_context_token_ms,
                d.tpot_per_context_token_ms,
            ),
        ] {
            *value = checked(
                non_negative(*value),
                (field, ">= 0"),
                *value,
                default,
                &mut first,
            );
        }
        c.accuracy_window = checked(
            c.accuracy_window >= 1,
            ("accuracy_window", ">= 1"),
            c.accuracy_window,
            d.accuracy_window,
            &mut first,
        );
        c.ttft_p90_step = checked(
            positive(c.ttft_p90_step) && c.ttft_p90_step <= 1.0,
            ("ttft_p90_step", "(0, 1]"),
            c.ttft_p90_step,
            d.ttft_p90_step,
            &mut first,
        );
        c.ttft_p90_initial_ratio = checked(
            positive(c.ttft_p90_initial_ratio),
            ("ttft_p90_initial_ratio", "> 0"),
            c.ttft_p90_initial_ratio,
            d.ttft_p90_initial_ratio,
            &mut first,
        );
        for (field, value, default) in [
            (
                "drift_recent_alpha",
                &mut c.drift_recent_alpha,
                d.drift_recent_alpha,
            ),
            (
                "drift_long_run_alpha",
                &mut c.drift_long_run_alpha,
                d.drift_long_run_alpha,
            ),
        ] {
            *value = checked(
                positive(*value) && *value <= 1.0,
                (field, "(0, 1]"),
                *value,
                default,
                &mut first,
            );
        }
        c.drift_error_ratio = checked(
            positive(c.drift_error_ratio),
            ("drift_error_ratio", "> 0"),
            c.drift_error_ratio,
            d.drift_error_ratio,
            &mut first,
        );
        c.drift_min_error = checked(
            non_negative(c.drift_min_error),
            ("drift_min_error", ">= 0"),
            c.drift_min_error,
            d.drift_min_error,
            &mut first,
        );
        c.min_predicted_ms = checked(
            positive(c.min_predicted_ms),
            ("min_predicted_ms", "> 0"),
            c.min_predicted_ms,
            d.min_predicted_ms,
            &mut first,
        );
        let bounds_ok = positive(c.max_predicted_ms) && c.max_predicted_ms > c.min_predicted_ms;
        c.max_predicted_ms = checked(
            bounds_ok,
            ("max_predicted_ms", "finite and > min_predicted_ms"),
            c.max_predicted_ms,
            d.max_predicted_ms,
            &mut first,
        );
        if !bounds_ok {
            c.min_predicted_ms = d.min_predicted_ms;
        }
        (c, first)
    }
}

/// `value` when `ok`, else `default`, recording the first failure.
fn checked<T: std::fmt::Display>(
    ok: bool,
    (field, expected): (&'static str, &'static str),
    value: T,
    default: T,
    first: &mut Option<PredictorConfigError>,
) -> T {
    if ok {
        return value;
    }
    first.get_or_insert(PredictorConfigError {
        field,
        value: value.to_string(),
        expected,
    });
    default
}

/// The p90 quantile tracked for [`LatencyPredictor::predict_p90_ttft`].
const P90: f64 = 0.9;

/// One class's models and p90 tracker.
#[derive(Debug, Clone)]
struct ClassModels {
    class: String,
    model: RlsModel,
    ttft_p90: LogRatioQuantile,
    ttft_drift: DriftDetector,
    tpot_drift: DriftDetector,
    /// Recent p90 coverage (see [`ClassAccuracy::ttft_p90_coverage`]) and samples scored.
    ttft_p90_coverage: f64,
    coverage_samples: u64,
}

impl ClassModels {
    fn new(class: &str, config: &PredictorConfig) -> Self {
        ClassModels {
            class: class.to_string(),
            model: RlsModel::new(config),
            ttft_p90: LogRatioQuantile::new(
                config.ttft_p90_initial_ratio,
                P90,
                config.ttft_p90_step,
            ),
            ttft_drift: DriftDetector::default(),
            tpot_drift: DriftDetector::default(),
            ttft_p90_coverage: 0.0,
            coverage_samples: 0,
        }
    }

    fn score_p90(&mut self, actual: f64, predicted_p90: f64) {
        self.coverage_samples += 1;
        let alpha = CLASS_COVERAGE_ALPHA.max(1.0 / self.coverage_samples as f64);
        let covered = if actual <= predicted_p90 { 1.0 } else { 0.0 };
        self.ttft_p90_coverage += alpha * (covered - self.ttft_p90_coverage);
    }

    fn drift_active(&self) -> bool {
        self.ttft_drift.active() || self.tpot_drift.active()
    }

    fn report(&self) -> ClassAccuracy {
        ClassAccuracy {
            class: self.class.clone(),
            ttft_samples: self.model.samples(Target::Ttft),
            ttft_recent_error: self.ttft_drift.recent_error(),
            ttft_long_run_error: self.ttft_drift.long_run_error(),
            tpot_recent_error: self.tpot_drift.recent_error(),
            tpot_long_run_error: self.tpot_drift.long_run_error(),
            drift_active: self.drift_active(),
            drift_episodes: self.ttft_drift.episodes() + self.tpot_drift.episodes(),
            tpot_samples: self.model.samples(Target::Tpot),
            ttft_p90_coverage: self.ttft_p90_coverage,
        }
    }

    /// Point TTFT for sanitised features.
    fn ttft_ms(&self, config: &PredictorConfig, f: &Features) -> f64 {
        model_or_fallback_ms(config, self.model.predict_ttft(f), || {
            analytic::ttft_ms(config, f)
        })
    }

    /// Point TPOT for sanitised features.
    fn tpot_ms(&self, config: &PredictorConfig, f: &Features) -> f64 {
        model_or_fallback_ms(config, self.model.predict_tpot(f), || {
            analytic::tpot_ms(config, f)
        })
    }

    /// The p90 TTFT: point × the tracked ratio.
    fn ttft_p90_ms(&self, config: &PredictorConfig, point_ms: f64) -> f64 {
        bounded_ms(config, point_ms * self.ttft_p90.ratio(), point_ms)
    }
}

/// [`bounded_ms`] of the model's answer, with the analytic `fallback` computed only when the
/// model has none or answers NaN (the decision predicts every pod: the fallback is not free).
fn model_or_fallback_ms(
    config: &PredictorConfig,
    model: Option<f64>,
    fallback: impl FnOnce() -> f64,
) -> f64 {
    match model {
        Some(raw) if !raw.is_nan() => raw.clamp(config.min_predicted_ms, config.max_predicted_ms),
        _ => {
            let fallback = fallback();
            bounded_ms(config, model.unwrap_or(fallback), fallback)
        }
    }
}

/// `raw` (or `fallback` when `raw` is NaN) clamped into [min, max]; always finite and positive.
fn bounded_ms(config: &PredictorConfig, raw: f64, fallback: f64) -> f64 {
    let v = if raw.is_nan() { fallback } else { raw };
    if v.is_nan() {
        config.min_predicted_ms
    } else {
        v.clamp(config.min_predicted_ms, config.max_predicted_ms)
    }
}

#[derive(Debug, Clone)]
pub struct LatencyPredictor {
    config: PredictorConfig,
    /// At most `config.max_classes` entries.
    classes: Vec<ClassModels>,
    /// Shared by classes first seen once `classes` is full.
    overflow: ClassModels,
    /// Never trained: answers for classes without data (the analytic estimate).
    cold: ClassModels,
    accuracy: AccuracyTracker,
    rejected_targets: u64,
    rejected_features: u64,
}

impl LatencyPredictor {
    pub fn new(config: PredictorConfig) -> Self {
        let (config, _) = config.sanitize_report();
        LatencyPredictor {
            classes: Vec::with_capacity(config.max_classes.min(64)),
            overflow: ClassModels::new("", &config),
            cold: ClassModels::new("", &config),
            accuracy: AccuracyTracker::new(config.accuracy_window),
            rejected_targets: 0,
            rejected_features: 0,
            config,
        }
    }

    /// The configuration in force (invalid fields already replaced by defaults).
    pub fn config(&self) -> &PredictorConfig {
        &self.config
    }

    fn models(&self, class: &str) -> &ClassModels {
        match self.classes.iter().find(|m| m.class == class) {
            Some(m) => m,
            None if self.classes.len() >= self.config.max_classes => &self.overflow,
            None => &self.cold,
        }
    }

    /// Sanitised features, with the capacity hidden when the KV-shortfall feature is off.
    fn encodable(&self, features: &Features) -> Features {
        let mut f = features.sanitized();
        if !self.config.kv_shortfall_feature {
            f.kv_capacity_tokens = 0.0;
        }
        f
    }

    pub fn predict(&self, class: &str, features: &Features) -> Prediction {
        let f = self.encodable(features);
        let models = self.models(class);
        Prediction {
            ttft_ms: models.ttft_ms(&self.config, &f),
            tpot_ms: models.tpot_ms(&self.config, &f),
        }
    }

    /// Milliseconds of the predicted TTFT due to the request's own uncached prompt tokens: the
    /// prediction less the prediction with the whole prompt cached (prefix score 1), ≥ 0.
    pub fn own_prefill_ms(&self, class: &str, features: &Features) -> f64 {
        let f = self.encodable(features);
        if f.prefix_score >= 1.0 {
            return 0.0;
        }
        let models = self.models(class);
        let cached = Features {
            prefix_score: 1.0,
            ..f
        };
        (models.ttft_ms(&self.config, &f) - models.ttft_ms(&self.config, &cached)).max(0.0)
    }

    /// Predicted 90th percentile of TTFT: the point TTFT × the class's tracked p90 of
    /// actual/predicted. Finite and positive for any input.
    pub fn predict_p90_ttft(&self, class: &str, features: &Features) -> f64 {
        let f = self.encodable(features);
        let models = self.models(class);
        models.ttft_p90_ms(&self.config, models.ttft_ms(&self.config, &f))
    }

    /// The class's current p90 of actual/predicted TTFT.
    pub fn ttft_p90_ratio(&self, class: &str) -> f64 {
        self.models(class).ttft_p90.ratio()
    }

    /// Classes with their own models (at most `max_classes`).
    pub fn class_count(&self) -> usize {
        self.classes.len()
    }

    /// Predicts for every (class, features) pair; clears and fills `out` in the same order.
    pub fn predict_many<'a>(
        &self,
        items: impl Iterator<Item = (&'a str, Features)>,
        out: &mut Vec<Prediction>,
    ) {
        out.clear();
        out.extend(items.map(|(class, f)| self.predict(class, &f)));
    }

    /// Learns from one completed request: the features taken at dispatch, the observed TTFT and,
    /// when more than one token was generated, the observed mean TPOT.
    pub fn observe(
        &mut self,
        class: &str,
        features: &Features,
        ttft_ms: f64,
        tpot_ms: Option<f64>,
    ) {
        self.observe_targets(class, features, Some(ttft_ms), tpot_ms);
    }

    /// [`LatencyPredictor::observe`] for one stage of a prefill/decode disaggregated request:
    /// the prefill stage observes only TTFT (its pod returns one token), the decode stage only
    /// TPOT (its first token waits on the KV transfer, not on a prefill the model predicts).
    pub fn observe_targets(
        &mut self,
        class: &str,
        features: &Features,
        ttft_ms: Option<f64>,
        tpot_ms: Option<f64>,
    ) {
        if !features.is_finite() {
            self.rejected_features += 1;
            return;
        }
        let (min, max) = (self.config.min_predicted_ms, self.config.max_predicted_ms);
        let valid = |v: f64| v.is_finite() && v >= min && v <= max;
        let ttft = match ttft_ms {
            Some(v) if valid(v) => Some(v),
            Some(_) => {
                self.rejected_targets += 1;
                None
            }
            None => None,
        };
        let tpot = match tpot_ms {
            Some(v) if valid(v) => Some(v),
            Some(_) => {
                self.rejected_targets += 1;
                None
            }
            None => None,
        };
        if ttft.is_none() && tpot.is_none() {
            return;
        }

        let f = self.encodable(features);
        let config = &self.config;
        let bounds = DriftBounds {
            recent_alpha: config.drift_recent_alpha,
            long_run_alpha: config.drift_long_run_alpha,
            error_ratio: config.drift_error_ratio,
            min_error: config.drift_min_error,
        };
        let models = models_mut(&mut self.classes, &mut self.overflow, class, config);
        // Score and adapt with the model as it was before this sample (prequential), then learn.
        if let Some(actual) = ttft {
            let predicted = models.ttft_ms(config, &f);
            let predicted_p90 = models.ttft_p90_ms(config, predicted);
            self.accuracy.score_ttft(actual, predicted, predicted_p90);
            models.score_p90(actual, predicted_p90);
            models.ttft_p90.observe(actual, predicted);
            if models.model.samples(Target::Ttft) >= config.min_samples {
                models.ttft_drift.observe(ape(actual, predicted), &bounds);
            }
        }
        if let Some(actual) = tpot {
            let predicted = models.tpot_ms(config, &f);
            self.accuracy.score_tpot(actual, predicted);
            if models.model.samples(Target::Tpot) >= config.min_samples {
                models.tpot_drift.observe(ape(actual, predicted), &bounds);
            }
        }
        models.model.observe(&Sample {
            features: f,
            ttft_ms: ttft,
            tpot_ms: tpot,
        });
    }

    /// Accuracy and drift state of every class with its own models, in first-seen order
    /// (the shared fallback of classes beyond `max_classes` is not included).
    pub fn class_reports(&self) -> Vec<ClassAccuracy> {
        self.classes.iter().map(ClassModels::report).collect()
    }

    /// Whether `class`'s models are in a drift episode now (false for unknown classes).
    pub fn drift_active(&self, class: &str) -> bool {
        self.models(class).drift_active()
    }

    pub fn accuracy(&self) -> AccuracyReport {
        let model_resets = self
            .classes
            .iter()
            .chain(std::iter::once(&self.overflow))
            .map(|m| m.model.resets())
            .sum();
        let all = || self.classes.iter().chain(std::iter::once(&self.overflow));
        let drift_episodes = all()
            .map(|m| m.ttft_drift.episodes() + m.tpot_drift.episodes())
            .sum();
        let drifting_classes = all().filter(|m| m.drift_active()).count() as u64;
        AccuracyReport {
            samples: self.accuracy.ttft_samples,
            tpot_samples: self.accuracy.tpot_samples,
            ttft_mape: self.accuracy.ttft_mape(),
            tpot_mape: self.accuracy.tpot_mape(),
            ttft_p90_coverage: self.accuracy.ttft_p90_coverage(),
            rejected_targets: self.rejected_targets,
            rejected_features: self.rejected_features,
            model_resets,
            drift_episodes,
            drifting_classes,
        }
    }
}

/// Absolute percentage error of one prediction (`actual` > 0).
fn ape(actual: f64, predicted: f64) -> f64 {
    (actual - predicted).abs() / actual
}

/// The class's models, created on first sight while the table has room, else the fallback.
fn models_mut<'a>(
    classes: &'a mut Vec<ClassModels>,
    overflow: &'a mut ClassModels,
    class: &str,
    config: &PredictorConfig,
) -> &'a mut ClassModels {
    if let Some(i) = classes.iter().position(|m| m.class == class) {
        return &mut classes[i];
    }
    if classes.len() >= config.max_classes {
        return overflow;
    }
    classes.push(ClassModels::new(class, config));
    let last = classes.len() - 1;
    &mut classes[last]
}

#[cfg(test)]
mod tests;
