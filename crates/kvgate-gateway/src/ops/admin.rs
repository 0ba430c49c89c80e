//! The admin listener (default 127.0.0.1:9090, never the traffic port): `/metrics`
//! (OpenMetrics), `/debug/decisions` (the last N decisions, oldest first), `/debug/config` (the
//! settings in force as JSON, every key, router keys after the profile merge; see
//! [`crate::config::GatewayConfig::dump`]), `/healthz` (the process is up), `/readyz` (at least one
//! healthy pod, and not shutting down), `POST /debug/score/v1/completions` and
//! `/debug/score/v1/chat/completions` (a dry run: the body prepared as the traffic port
//! would, and every healthy pod's prefix score and predictions for it as JSON; nothing is
//! routed, recorded or charged, so it answers "where is this prompt cached?" without changing
//! any pod's cache); the live page `/ui` and its JSON, `/debug/pods`, `/debug/branches`,
//! `/debug/predictor`, `/debug/queue` ([`crate::ui`]).

use crate::state::Shared;
use axum::body::Body;
use axum::extract::State;
use axum::response::Response;
use http::{HeaderValue, StatusCode, header};
use std::sync::Arc;

pub fn admin_router(shared: Arc<Shared>) -> axum::Router {
    use axum::routing::get;
    axum::Router::new()
        .route("/metrics", get(metrics))
        .route("/debug/decisions", get(decisions))
        .route("/debug/config", get(config))
        .route("/debug/pods", get(live_pods))
        .route("/debug/branches", get(live_branches))
        .route("/debug/predictor", get(live_predictor))
        .route("/debug/queue", get(live_queue))
        .route("/ui", get(live_page))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route(
            "/debug/score/v1/completions",
            axum::routing::post(score_completions),
        )
        .route(
            "/debug/score/v1/chat/completions",
            axum::routing::post(score_chat),
        )
        // /debug/score reads its bodies itself, under the traffic port's max_body_bytes.
        .layer(axum::extract::DefaultBodyLimit::disable())
        .with_state(shared)
}

fn with_type(body: String, content_type: &'static str, status: StatusCode) -> Response {
    let mut resp = Response::new(Body::from(body));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

async fn metrics(State(shared): State<Arc<Shared>>) -> Response {
    match shared.metrics_text() {
        Ok(text) => with_type(
            text,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            StatusCode::OK,
        ),
        Err(e) => with_type(
            format!("encoding metrics failed: {e}\n"),
            "text/plain",
            StatusCode::INTERNAL_SERVER_ERROR,
        ),
    }
}

fn json<T: serde::Serialize>(value: &T) -> Response {
    match serde_json::to_string(value) {
        Ok(body) => with_type(body, "application/json", StatusCode::OK),
        Err(e) => with_type(
            format!("encoding the answer failed: {e}\n"),
            "text/plain",
            StatusCode::INTERNAL_SERVER_ERROR,
        ),
    }
}

async fn live_pods(State(shared): State<Arc<Shared>>) -> Response {
    json(&crate::ui::pods(&shared.fleet.pods, &shared.session))
}

async fn live_branches(State(shared): State<Arc<Shared>>) -> Response {
    json(&crate::ui::branches(&shared.telemetry.live))
}

async fn live_predictor(State(shared): State<Arc<Shared>>) -> Response {
    json(&crate::ui::predictor(
        &shared.session,
        &shared.telemetry.live,
    ))
}

async fn live_queue(State(shared): State<Arc<Shared>>) -> Response {
    json(&crate::ui::queue(
        &shared.admission,
        &shared.telemetry.live,
        &shared.config(),
    ))
}

async fn live_page() -> Response {
    with_type(
        crate::ui::PAGE_HTML.to_string(),
        "text/html; charset=utf-8",
        StatusCode::OK,
    )
}

async fn decisions(State(shared): State<Arc<Shared>>) -> Response {
    let body = serde_json::to_string(&shared.telemetry.decisions.snapshot())
        .unwrap_or_else(|_| "[]".into());
    with_type(body, "application/json", StatusCode::OK)
}

async fn config(State(shared): State<Arc<Shared>>) -> Response {
    let mut dump = shared.config().dump();
    // Pod URLs with their userinfo redacted, as everywhere else.
    if let Some(pods) = dump.get_mut("pods").and_then(|p| p.as_array_mut()) {
        for url in pods.iter_mut().filter_map(|p| p.get_mut("url")) {
            if let Some(u) = url.as_str() {
                *url = crate::pods::redact_userinfo(u).into();
            }
        }
    }
    match serde_json::to_string_pretty(&dump) {
        Ok(body) => with_type(body + "\n", "application/json", StatusCode::OK),
        Err(e) => with_type(
            format!("encoding the config failed: {e}\n"),
            "text/plain",
            StatusCode::INTERNAL_SERVER_ERROR,
        ),
    }
}

async fn readyz(State(shared): State<Arc<Shared>>) -> Response {
    if shared
        .admission
        .shutting_down
        .load(std::sync::atomic::Ordering::Acquire)
    {
        return with_type(
            "not ready: shutting down\n".into(),
            "text/plain",
            StatusCode::SERVICE_UNAVAILABLE,
        );
    }
    let healthy = shared
        .fleet
        .pods
        .all()
        .iter()
        .filter(|p| p.is_healthy())
        .count();
    if healthy > 0 {
        with_type(
            format!("ready: {healthy} healthy pods\n"),
            "text/plain",
            StatusCode::OK,
        )
    } else {
        with_type(
            "not ready: no healthy pod\n".into(),
            "text/plain",
            StatusCode::SERVICE_UNAVAILABLE,
        )
    }
}

async fn score_completions(
    State(shared): State<Arc<Shared>>,
    req: axum::extract::Request,
) -> Response {
    score(shared, kvgate_core::request::COMPLETIONS_PATH, req).await
}

async fn score_chat(State(shared): State<Arc<Shared>>, req: axum::extract::Request) -> Response {
    score(shared, kvgate_core::request::CHAT_COMPLETIONS_PATH, req).await
}

/// The request as the router would see it now, per pod.
#[derive(serde::Serialize)]
struct ScoreReport {
    input_tokens: u32,
    /// Block size and blocks of the main chain (other pods' sizes are in `pods`).
    block_size_tokens: u32,
    prompt_blocks: usize,
    pods: Vec<kvgate_core::PodScore>,
}

async fn score(shared: Arc<Shared>, path: &str, req: axum::extract::Request) -> Response {
    let cfg = shared.config().clone();
    let (parts, body) = req.into_parts();
    let headers = parts.headers;
    let rid = crate::request_id::request_id(&headers);
    // The traffic port's body rules: size limit (413), budget (503), read timeout (408).
    let read_by = tokio::time::Instant::now() + cfg.body_read_timeout;
    let (body, _hold) = match crate::limits::read_body_within(
        body,
        cfg.max_body_bytes,
        &shared.admission.body_budget,
        cfg.max_body_bytes_in_flight,
        read_by,
    )
    .await
    {
        Ok(read) => read,
        Err(e) => return crate::reject::reject(&shared.telemetry, e, &rid),
    };
    let prepared = match crate::routing::prepare(&shared, &cfg, path, &body, &headers).await {
        Ok(p) => p,
        Err(e) => return crate::reject::reject(&shared.telemetry, e, &rid),
    };
    let request = prepared.route_request();
    let mut snaps: Vec<_> = shared
        .fleet
        .pods
        .all()
        .iter()
        .map(|p| p.snapshot())
        .collect();
    let pods = shared.session.score(&request, &mut snaps);
    let report = ScoreReport {
        input_tokens: prepared.input_tokens,
        block_size_tokens: prepared.block_size_tokens,
        prompt_blocks: prepared.blocks.len(),
        pods,
    };
    match serde_json::to_string(&report) {
        Ok(body) => with_type(body, "application/json", StatusCode::OK),
        Err(e) => with_type(
            format!("encoding the scores failed: {e}\n"),
            "text/plain",
            StatusCode::INTERNAL_SERVER_ERROR,
        ),
    }
}
