//! Which models each pod serves, learnt and applied (the rules: [`kvgate_core::models`]).
//!
//! - **Declared**: a pod entry's `model` (`--pod URL,model=NAME`, `model = "…"` in `[[pods]]`)
//!   is its list until its own is learnt.
//! - **Learnt** ([`models_loop`], one task per pod, stopped with the pod): its `GET /v1/models`
//!   (base model and registered LoRA adapters), read as soon as the pod first scrapes healthy,
//!   again at once whenever it comes back from an outage (its engine may be a new one), and every
//!   `models_refresh_interval_ms` (default 10 s, [`crate::config::DEFAULT_MODELS_REFRESH_INTERVAL_MS`])
//!   while it is up. A read that fails (unreachable, non-2xx, over 1 MiB, not a model list) keeps
//!   the list in force, is counted in `kvgate_models_refresh_errors_total{pod}` and logged at
//!   most 10 lines/s, and is tried again one interval later.
//! - **Applied** by the pipeline, for both transports: [`check`] (in `pipeline::ready`, before
//!   the flow turn: a model no pod serves is a 404 `model_not_found` from kvgate itself, nothing
//!   charged, queued or recorded) and [`not_serving`] (in `pipeline::dispatch`: the pods known not
//!   to serve the model are excluded from every decision of the request; when the pods that
//!   serve it are all down, the decision finds no healthy pod: 503).
//!
//! A pod whose list is unknown (nothing declared, `/v1/models` not answered yet) serves anything,
//! so a fleet of one model routes exactly as before, and the check costs one lock and one binary
//! search per pod per request. Bounds: per pod one declared and one learnt list, each ≤ 10,000
//! ids × 8 bytes ([`kvgate_core::models::MAX_SERVED_MODELS`]); one task per pod.

use crate::errors::ApiError;
use crate::handles::telemetry::Telemetry;
use crate::pods::{Pod, PodTable};
use crate::state::{Shared, UpstreamClient};
use http::StatusCode;
use kvgate_core::{AdapterId, ModelPods, PodId, ServedModels};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// How often the loop looks at the pod's health (an atomic read): how soon a pod that came up
/// is asked for its models.
const HEALTH_POLL: Duration = Duration::from_millis(100);

/// Where a request for `model` may go now, over the whole pod table (healthy or not).
pub(crate) fn pods_for(pods: &PodTable, model: AdapterId) -> ModelPods {
    let pods = pods.all();
    kvgate_core::pods_for_model(model, pods.iter().map(|p| (p.id, p.served_models())))
}

/// The pipeline's model check: a model no pod serves is kvgate's own 404.
pub(crate) fn check(pods: &PodTable, model: &str) -> Result<(), ApiError> {
    match pods_for(pods, AdapterId::of(model)) {
        ModelPods::Nowhere => Err(model_not_found(model)),
        ModelPods::Anywhere | ModelPods::Except(_) => Ok(()),
    }
}

/// The pods a request for `model` must not go to: those known not to serve it (all of them
/// when none does, which leaves the decision no pod: 503).
pub(crate) fn not_serving(pods: &PodTable, model: AdapterId) -> Vec<PodId> {
    match pods_for(pods, model) {
        ModelPods::Anywhere => Vec::new(),
        ModelPods::Except(pods) => pods,
        ModelPods::Nowhere => pods.all().iter().map(|p| p.id).collect(),
    }
}

/// 404 for a model no pod serves, worded as vLLM's (`NotFoundError`, `param: "model"`) with
/// OpenAI's code `model_not_found`.
pub fn model_not_found(model: &str) -> ApiError {
    const MAX_SHOWN_CHARS: usize = 200;
    let shown: String = model.chars().take(MAX_SHOWN_CHARS).collect();
    ApiError {
        status: StatusCode::NOT_FOUND,
        kind: "NotFoundError",
        code: "model_not_found",
        message: format!("The model `{shown}` does not exist (no pod behind kvgate serves it)."),
        param: Some("model".into()),
    }
}

/// Learns `pod`'s models until it is removed (module docs).
pub async fn models_loop(shared: Arc<Shared>, pod: Arc<Pod>) {
    // The outage count at the last read: a pod that went down since is read again at once.
    let mut read_after_outages: Option<u64> = None;
    let mut next_refresh = tokio::time::Instant::now();
    while !pod.removed.load(Ordering::Relaxed) {
        let now = tokio::time::Instant::now();
        let outages = pod.outages();
        let due = read_after_outages != Some(outages) || now >= next_refresh;
        if pod.healthy.load(Ordering::Relaxed) && due {
            read_after_outages = Some(outages);
            next_refresh = now + shared.config().models_refresh_interval;
            learn(&shared.fleet.client, &shared.telemetry, &pod).await;
        }
        tokio::time::sleep(HEALTH_POLL).await;
    }
}

/// One read of the pod's `/v1/models`.
async fn learn(client: &UpstreamClient, telemetry: &Telemetry, pod: &Pod) {
    let answer = tokio::time::timeout(
        crate::models::MODELS_TIMEOUT,
        crate::models::fetch_models(client, pod),
    )
    .await;
    let list = match answer {
        Ok(Some(body)) => ServedModels::from_models_list(&body).map_err(|e| e.to_string()),
        Ok(None) => Err("no 2xx answer within 1 MiB".to_string()),
        Err(_) => Err("timed out".to_string()),
    };
    match list {
        Ok(list) => {
            let (n, dropped) = (list.len(), list.dropped());
            if pod.learn_models(list) {
                tracing::info!(pod = %pod.url, models = n, dropped, "learnt the models the pod serves");
            }
        }
        Err(why) => {
            telemetry
                .metrics
                .models_refresh_errors
                .get_or_create(&pod.label())
                .inc();
            if telemetry.log_limit.allow("models_refresh_failed") {
                tracing::warn!(pod = %pod.url, %why, "reading the pod's /v1/models failed; its model list is kept");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{GatewayConfig, ServeArgs};
    use crate::pods::PodEntry;

    fn shared_with(pods: &[PodEntry]) -> Arc<Shared> {
        let shared = Shared::new(GatewayConfig::from_args(&ServeArgs::default()).unwrap());
        shared.fleet.pods.replace(pods, 100);
        shared
    }

    #[test]
    fn declared_models_route_each_request_to_its_pods_and_an_unknown_model_is_404() {
        let shared = shared_with(&[
            PodEntry::new("http://a:1", "x").with_model(Some("model-a".into())),
            PodEntry::new("http://b:1", "x").with_model(Some("model-b".into())),
        ]);
        let (a, b) = (PodId(0), PodId(1));
        assert_eq!(
            not_serving(&shared.fleet.pods, AdapterId::of("model-a")),
            vec![b]
        );
        assert_eq!(
            not_serving(&shared.fleet.pods, AdapterId::of("model-b")),
            vec![a]
        );
        assert!(check(&shared.fleet.pods, "model-a").is_ok());
        let e = check(&shared.fleet.pods, "model-c").unwrap_err();
        assert_eq!(e.status, StatusCode::NOT_FOUND);
        assert_eq!((e.kind, e.code), ("NotFoundError", "model_not_found"));
        assert_eq!(e.param.as_deref(), Some("model"));
        assert_eq!(
            not_serving(&shared.fleet.pods, AdapterId::of("model-c")),
            vec![a, b]
        );
    }

    #[test]
    fn a_learnt_list_replaces_the_declared_one_and_unknown_lists_serve_anything() {
        let shared = shared_with(&[
            PodEntry::new("http://a:1", "x").with_model(Some("model-a".into())),
            PodEntry::new("http://b:1", "x"),
        ]);
        // Pod b's list is unknown: it may serve anything, so no model is a 404 yet.
        assert!(check(&shared.fleet.pods, "adapter-1").is_ok());
        assert_eq!(
            not_serving(&shared.fleet.pods, AdapterId::of("adapter-1")),
            vec![PodId(0)]
        );
        let fleet = shared.fleet.pods.all();
        let (pod_a, pod_b) = (&fleet[0], &fleet[1]);
        assert!(pod_a.learn_models(ServedModels::from_names(["model-a", "adapter-1"])));
        assert!(!pod_a.learn_models(ServedModels::from_names(["adapter-1", "model-a"])));
        assert!(pod_b.learn_models(ServedModels::from_names(["model-b"])));
        assert_eq!(
            not_serving(&shared.fleet.pods, AdapterId::of("adapter-1")),
            vec![PodId(1)]
        );
        assert!(check(&shared.fleet.pods, "adapter-2").is_err());
        // A reload that declares another model keeps the learnt list in force.
        shared.fleet.pods.replace(
            &[
                PodEntry::new("http://a:1", "x").with_model(Some("model-z".into())),
                PodEntry::new("http://b:1", "x"),
            ],
            100,
        );
        assert!(check(&shared.fleet.pods, "model-z").is_err());
        assert!(check(&shared.fleet.pods, "model-a").is_ok());
    }

    #[test]
    fn a_single_model_fleet_excludes_no_pod() {
        let shared = shared_with(&[
            PodEntry::new("http://a:1", "x").with_model(Some("tiny".into())),
            PodEntry::new("http://b:1", "x").with_model(Some("tiny".into())),
        ]);
        assert_eq!(
            not_serving(&shared.fleet.pods, AdapterId::of("tiny")),
            Vec::<PodId>::new()
        );
    }

    #[test]
    fn an_empty_pod_table_is_no_healthy_pod_not_an_unknown_model() {
        let shared = shared_with(&[]);
        assert!(check(&shared.fleet.pods, "any-model").is_ok());
        assert_eq!(
            not_serving(&shared.fleet.pods, AdapterId::of("any-model")),
            Vec::<PodId>::new()
        );
    }

    #[test]
    fn a_huge_model_name_is_cut_in_the_error() {
        let long = "m".repeat(100_000);
        let e = model_not_found(&long);
        assert!(e.message.len() < 300, "{}", e.message.len());
    }
}
