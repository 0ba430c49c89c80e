//! The gradient-boosted-trees model of one class: bucketed samples in, trees trained from a
//! snapshot of them, the trained pair swapped in whole.
//!
//! - **Samples.** Every observed sample goes to the class's [`SampleBuckets`] (400 buckets ×
//!   `gbdt_bucket_capacity`, default 64). With the TTFT learnt at the first token
//!   (`predictor_ttft_at_first_token`, the default profile's) a request is two samples, its
//!   TTFT and then its TPOT: the buckets then hold about half as many requests per target, and
//!   the schedule below counts both (this experimental model was measured with one sample per
//!   request, EVALUATION.md §6).
//! - **Schedule.** A retrain is due when the samples observed since the last snapshot reach
//!   min(`gbdt_retrain_every` (256), max(`min_samples` (32), samples at the last snapshot)):
//!   the first model comes at 32 samples, then at 64, 128, 256, 512, then every 256. A drift
//!   episode makes a retrain due at once.
//! - **Training never blocks a decision.** Training is [`TrainingJob::train`], a pure function
//!   from a snapshot of the samples to a [`TrainedModels`]; the predictor installs the result by
//!   replacing two `Arc`s. With `gbdt_background_training` = false (the default; the simulator)
//!   the predictor trains inline at the observation that makes a retrain due, which is
//!   deterministic. With it true, [`super::LatencyPredictor::take_training_jobs`] hands the due
//!   snapshots to the driver, which trains them on another thread and calls
//!   [`super::LatencyPredictor::install`] (in the gateway: a trainer thread; the router's mutex
//!   is held only to copy the snapshot out and to swap the pointers in).
//! - **Prediction.** Until the first model is trained, `None` (the analytic estimate answers).
//!   TTFT from the TTFT feature vector, TPOT from the TPOT one ([`super::features`]).

use super::PredictorConfig;
use super::features::Features;
use super::gbdt::{self, Gbdt, GbdtParams, Loss};
use super::model::{LatencyModel, Target};
use super::samples::{Sample, SampleBuckets};
use std::sync::Arc;

/// The quantile of `gbdt-p90`.
pub const P90_TAU: f64 = 0.9;

/// Gradient-boosted trees for one class (see the module docs).
#[derive(Debug, Clone)]
pub struct GbdtModel {
    samples: SampleBuckets,
    ttft: Option<Arc<Gbdt>>,
    tpot: Option<Arc<Gbdt>>,
    loss: Loss,
    params: GbdtParams,
    retrain_every: u64,
    min_samples: u64,
    background: bool,
    /// Samples observed since creation.
    observed: u64,
    /// `observed` when the last snapshot was taken.
    snapshot_at: u64,
    /// A drift episode asked for a retrain.
    drift_due: bool,
    /// Background mode: a retrain is due and waits for the driver.
    pending: bool,
    ttft_samples: u64,
    tpot_samples: u64,
    /// Models trained and installed.
    trainings: u64,
}

impl GbdtModel {
    pub fn new(config: &PredictorConfig) -> Self {
        GbdtModel {
            samples: SampleBuckets::new(config.gbdt_bucket_capacity),
            ttft: None,
            tpot: None,
            loss: if config.model.is_p90() {
                Loss::Pinball(P90_TAU)
            } else {
                Loss::Squared
            },
            params: config.gbdt,
            retrain_every: config.gbdt_retrain_every.max(1),
            min_samples: config.min_samples.max(2),
            background: config.gbdt_background_training,
            observed: 0,
            snapshot_at: 0,
            drift_due: false,
            pending: false,
            ttft_samples: 0,
            tpot_samples: 0,
            trainings: 0,
        }
    }

    fn retrain_due(&self) -> bool {
        let since = self.observed - self.snapshot_at;
        let interval = self
            .retrain_every
            .min(self.min_samples.max(self.snapshot_at));
        since >= interval || (self.drift_due && since > 0)
    }

    /// A snapshot of the samples to train on, marking them taken.
    fn snapshot(&mut self) -> TrainingJob {
        self.snapshot_at = self.observed;
        self.drift_due = false;
        self.pending = false;
        TrainingJob {
            samples: self.samples.snapshot(),
            loss: self.loss,
            params: self.params,
        }
    }

    /// The due job, if any (background mode).
    pub(crate) fn take_job(&mut self) -> Option<TrainingJob> {
        self.pending.then(|| self.snapshot())
    }

    /// Replaces the trees (a target that could not be trained keeps its old model).
    pub fn install(&mut self, trained: TrainedModels) {
        if let Some(m) = trained.ttft {
            self.ttft = Some(m);
        }
        if let Some(m) = trained.tpot {
            self.tpot = Some(m);
        }
        self.trainings += 1;
    }

    /// Samples held in the buckets.
    pub fn stored_samples(&self) -> usize {
        self.samples.len()
    }

    /// Models installed so far.
    pub fn trainings(&self) -> u64 {
        self.trainings
    }

    /// Whether a snapshot waits to be taken by the driver (background mode).
    pub fn pending(&self) -> bool {
        self.pending
    }
}

impl LatencyModel for GbdtModel {
    fn predict_ttft(&self, f: &Features) -> Option<f64> {
        self.ttft.as_ref().map(|m| m.predict(&f.ttft_vector()))
    }

    fn predict_tpot(&self, f: &Features) -> Option<f64> {
        self.tpot.as_ref().map(|m| m.predict(&f.tpot_vector()))
    }

    fn observe(&mut self, sample: &Sample) {
        self.samples.push(*sample);
        self.observed += 1;
        self.ttft_samples += u64::from(sample.ttft_ms.is_some());
        self.tpot_samples += u64::from(sample.tpot_ms.is_some());
        if self.pending || !self.retrain_due() {
            return;
        }
        if self.background {
            self.pending = true;
        } else {
            let trained = self.snapshot().train();
            self.install(trained);
        }
    }

    fn adapt(&mut self, _: Target, episode_started: bool, _: f64) {
        if episode_started {
            self.drift_due = true;
        }
    }

    fn samples(&self, target: Target) -> u64 {
        // Drift is scored once a model exists, like RLS after `min_samples`.
        let trained = match target {
            Target::Ttft => self.ttft.is_some(),
            Target::Tpot => self.tpot.is_some(),
        };
        match (trained, target) {
            (false, _) => 0,
            (true, Target::Ttft) => self.ttft_samples,
            (true, Target::Tpot) => self.tpot_samples,
        }
    }
}

/// A snapshot of one class's samples to train on; [`TrainingJob::train`] is pure, so it may run
/// on any thread while the predictor keeps answering with the old trees.
#[derive(Debug, Clone)]
pub struct TrainingJob {
    samples: Vec<Sample>,
    loss: Loss,
    params: GbdtParams,
}

/// The trees [`TrainingJob::train`] produced (`None` for a target with fewer than 2 samples).
#[derive(Debug, Clone, Default)]
pub struct TrainedModels {
    pub ttft: Option<Arc<Gbdt>>,
    pub tpot: Option<Arc<Gbdt>>,
}

impl TrainingJob {
    /// Samples in the snapshot.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// Trains the TTFT and TPOT ensembles on the snapshot.
    pub fn train(&self) -> TrainedModels {
        let (ttft_rows, ttft_ys): (Vec<_>, Vec<_>) = self
            .samples
            .iter()
            .filter_map(|s| Some((s.features.ttft_vector(), s.ttft_ms?)))
            .unzip();
        let (tpot_rows, tpot_ys): (Vec<_>, Vec<_>) = self
            .samples
            .iter()
            .filter_map(|s| Some((s.features.tpot_vector(), s.tpot_ms?)))
            .unzip();
        TrainedModels {
            ttft: fit(&ttft_rows, &ttft_ys, self.loss, &self.params),
            tpot: fit(&tpot_rows, &tpot_ys, self.loss, &self.params),
        }
    }
}

fn fit<const D: usize>(
    rows: &[[f64; D]],
    ys: &[f64],
    loss: Loss,
    params: &GbdtParams,
) -> Option<Arc<Gbdt>> {
    let slices: Vec<&[f64]> = rows.iter().map(|r| r.as_slice()).collect();
    gbdt::train(&slices, ys, loss, params).map(Arc::new)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::predictor::model::ModelKind;

    fn config(background: bool) -> PredictorConfig {
        PredictorConfig {
            model: ModelKind::Gbdt,
            gbdt_background_training: background,
            ..PredictorConfig::default()
        }
    }

    fn sample(i: u32) -> Sample {
        let features = Features {
            input_tokens: f64::from(500 + (i * 37) % 4000),
            prefill_tokens_in_flight: f64::from((i * 53) % 9000),
            waiting: f64::from(i % 4),
            kv_usage: f64::from(i % 10) / 10.0,
            ..Features::default()
        };
        let ttft =
            6.0 + (features.input_tokens + features.prefill_tokens_in_flight) / 16_000.0 * 1000.0;
        Sample {
            features,
            ttft_ms: Some(ttft),
            tpot_ms: Some(6.0 + f64::from(i % 7)),
        }
    }

    #[test]
    fn inline_training_starts_at_min_samples_and_doubles_to_the_interval() {
        let mut m = GbdtModel::new(&config(false));
        let mut trained_at = Vec::new();
        for i in 0..1200 {
            let before = m.trainings();
            m.observe(&sample(i));
            if m.trainings() > before {
                trained_at.push(i + 1);
            }
        }
        assert_eq!(trained_at, vec![32, 64, 128, 256, 512, 768, 1024]);
        assert!(m.predict_ttft(&sample(3).features).is_some());
    }

    #[test]
    fn background_mode_waits_for_the_driver_and_keeps_answering() {
        let mut m = GbdtModel::new(&config(true));
        for i in 0..40 {
            m.observe(&sample(i));
        }
        assert!(m.pending());
        assert_eq!(
            m.predict_ttft(&sample(1).features),
            None,
            "nothing installed yet"
        );
        let job = m.take_job().expect("due");
        assert_eq!(job.len(), 40);
        assert!(m.take_job().is_none(), "taken once");
        let trained = job.train();
        m.install(trained);
        let f = sample(5).features;
        let truth = sample(5).ttft_ms.unwrap_or_default();
        let got = m.predict_ttft(&f).expect("installed");
        assert!((got - truth).abs() / truth < 0.5, "{got} vs {truth}");
    }

    #[test]
    fn a_drift_episode_makes_a_retrain_due_at_once() {
        let mut m = GbdtModel::new(&config(false));
        for i in 0..300 {
            m.observe(&sample(i));
        }
        let before = m.trainings();
        m.adapt(Target::Ttft, true, 0.99);
        m.observe(&sample(300));
        assert_eq!(m.trainings(), before + 1);
    }

    #[test]
    fn an_empty_snapshot_trains_nothing_and_keeps_the_old_trees() {
        let job = TrainingJob {
            samples: Vec::new(),
            loss: Loss::Squared,
            params: GbdtParams::default(),
        };
        let trained = job.train();
        assert!(trained.ttft.is_none() && trained.tpot.is_none());
        let mut m = GbdtModel::new(&config(false));
        for i in 0..32 {
            m.observe(&sample(i));
        }
        m.install(trained);
        assert!(m.predict_ttft(&sample(0).features).is_some());
    }
}
