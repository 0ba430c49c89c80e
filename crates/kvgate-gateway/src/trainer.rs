//! Background training of the predictor's tree models (`predictor_model = "gbdt"` or
//! `"gbdt-p90"`), so a retrain never blocks a decision.
//!
//! Every `TRAIN_POLL` (100 ms) the task takes the due snapshots out of the predictor
//! (`LatencyPredictor::take_training_jobs`: the router mutex is held only to copy the bucketed
//! samples, ≤ 400 × 64 samples of 80 B per class), trains them on tokio's blocking pool
//! (`TrainingJob::train` is pure), then takes the mutex again only to swap the new trees in
//! (`LatencyPredictor::install`, two `Arc` assignments). Decisions in between use the old trees.
//! With the `rls` or `analytic` model there are never jobs and the task only polls.

use crate::state::Shared;
use std::sync::Arc;
use std::time::Duration;

/// How often the trainer looks for due retrains.
pub const TRAIN_POLL: Duration = Duration::from_millis(100);

/// Runs until the task is aborted (the gateway's shutdown).
pub async fn run(shared: Arc<Shared>) {
    let mut tick = tokio::time::interval(TRAIN_POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        train_due(&shared).await;
    }
}

/// Trains and installs every job that is due now; returns how many were installed.
pub async fn train_due(shared: &Shared) -> usize {
    let (jobs, model) = {
        let mut session = shared.session.lock();
        let predictor = session.predictor_mut();
        (predictor.take_training_jobs(), predictor.config().model)
    };
    if jobs.is_empty() {
        return 0;
    }
    let started = std::time::Instant::now();
    let samples: usize = jobs.iter().map(|(_, job)| job.len()).sum();
    let trained = match tokio::task::spawn_blocking(move || {
        jobs.into_iter()
            .map(|(slot, job)| (slot, job.train()))
            .collect::<Vec<_>>()
    })
    .await
    {
        Ok(trained) => trained,
        Err(e) => {
            tracing::error!(error = %e, "predictor training task failed");
            return 0;
        }
    };
    let n = trained.len();
    {
        let mut session = shared.session.lock();
        let predictor = session.predictor_mut();
        // A reload may have replaced the predictor with another model kind meanwhile (e.g.
        // gbdt → gbdt-p90): trees trained for the old loss must not land in it.
        if predictor.config().model != model {
            tracing::info!(%model, "predictor model changed during training; trees dropped");
            return 0;
        }
        for (slot, models) in trained {
            predictor.install(&slot, models);
        }
    }
    tracing::debug!(
        models = n,
        samples,
        ms = started.elapsed().as_secs_f64() * 1000.0,
        "predictor trees retrained"
    );
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::GatewayConfig;
    use crate::config::ServeArgs;
    use kvgate_core::predictor::{Features, ModelKind};

    fn shared(model: ModelKind) -> Arc<Shared> {
        let args = ServeArgs::default();
        let mut config = GatewayConfig::resolve(&args, None).expect("defaults are valid");
        config.router.predictor_model = model;
        Shared::new(config)
    }

    fn features(i: u32) -> Features {
        Features {
            input_tokens: f64::from(500 + (i * 37) % 4000),
            prefill_tokens_in_flight: f64::from((i * 53) % 9000),
            waiting: f64::from(i % 3),
            ..Features::default()
        }
    }

    #[tokio::test]
    async fn due_trees_are_trained_off_the_lock_and_swapped_in() {
        let shared = shared(ModelKind::Gbdt);
        let probe = features(7);
        let cold = shared.session.lock().predictor().predict("c", &probe);
        {
            let mut session = shared.session.lock();
            let predictor = session.predictor_mut();
            for i in 0..40 {
                let f = features(i);
                let ttft = 10.0 + f.input_tokens * 0.05 + f.prefill_tokens_in_flight * 0.05;
                predictor.observe("c", &f, ttft, Some(8.0));
            }
            // Due, but nothing is trained on the observing thread.
            assert_eq!(predictor.predict("c", &probe), cold);
        }
        assert_eq!(train_due(&shared).await, 1);
        let warm = shared.session.lock().predictor().predict("c", &probe);
        assert_ne!(warm, cold);
        let truth = 10.0 + probe.input_tokens * 0.05 + probe.prefill_tokens_in_flight * 0.05;
        assert!(
            (warm.ttft_ms - truth).abs() / truth < 0.3,
            "{warm:?} vs {truth}"
        );
        assert_eq!(train_due(&shared).await, 0, "nothing due any more");
    }

    #[tokio::test]
    async fn the_rls_model_never_has_jobs() {
        let shared = shared(ModelKind::Rls);
        {
            let mut session = shared.session.lock();
            let predictor = session.predictor_mut();
            for i in 0..100 {
                predictor.observe("c", &features(i), 50.0, Some(8.0));
            }
        }
        assert_eq!(train_due(&shared).await, 0);
    }
}
