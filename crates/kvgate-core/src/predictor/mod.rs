//! Latency predictor: TTFT and TPOT per (request, pod), trained online.
//!
//! CONTRACT (to be implemented): per pod class, an online ridge / recursive-least-squares model
//! on engineered features with a forgetting factor, one for TTFT and one for TPOT; an analytic
//! cold-start estimate until a class has enough samples; running accuracy (MAPE, p90 coverage).

use crate::pod::PodSnapshot;
use serde::Serialize;

/// Features known at decision time (DESIGN.md §5).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Features {
    pub kv_usage: f64,
    pub waiting: f64,
    pub running: f64,
    /// Uncached prompt tokens dispatched to the pod that have not produced a first token.
    pub prefill_tokens_in_flight: f64,
    pub decode_tokens_in_flight: f64,
    pub input_tokens: f64,
    pub prefix_score: f64,
}

impl Features {
    pub fn new(pod: &PodSnapshot, input_tokens: u32, prefix_score: f64) -> Self {
        Features {
            kv_usage: pod.kv_usage,
            waiting: pod.waiting as f64,
            running: pod.running as f64,
            prefill_tokens_in_flight: pod.in_flight.prefill_tokens as f64,
            decode_tokens_in_flight: pod.in_flight.decode_tokens as f64,
            input_tokens: input_tokens as f64,
            prefix_score,
        }
    }

    /// (1 − prefix score) × input tokens.
    pub fn uncached_prompt_tokens(&self) -> f64 {
        (1.0 - self.prefix_score).clamp(0.0, 1.0) * self.input_tokens
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Prediction {
    pub ttft_ms: f64,
    pub tpot_ms: f64,
}

/// Running accuracy of the predictor's recent predictions (prequential: each sample is scored
/// with the model as it was before learning from it).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct AccuracyReport {
    pub samples: u64,
    /// Mean absolute percentage error as a fraction (0.05 = 5 %).
    pub ttft_mape: f64,
    pub tpot_mape: f64,
    /// Fraction of observed TTFTs at or below the predicted p90 (ideal: 0.9).
    pub ttft_p90_coverage: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct PredictorConfig {}

impl Default for PredictorConfig {
    fn default() -> Self {
        PredictorConfig {}
    }
}

#[derive(Debug, Clone)]
pub struct LatencyPredictor {}

impl LatencyPredictor {
    pub fn new(config: PredictorConfig) -> Self {
        let _ = config;
        LatencyPredictor {}
    }

    pub fn predict(&self, class: &str, features: &Features) -> Prediction {
        let _ = (class, features);
        todo!()
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
        let _ = (class, features, ttft_ms, tpot_ms);
        todo!()
    }

    pub fn accuracy(&self) -> AccuracyReport {
        todo!()
    }
}
