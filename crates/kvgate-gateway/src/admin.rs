//! The admin listener (default 127.0.0.1:9090, never the traffic port): `/metrics`
//! (OpenMetrics), `/debug/decisions` (the last N decisions, oldest first), `/debug/config` (the
//! config in force as JSON: router keys after the profile merge, limits, pods; see
//! [`crate::config::ConfigDump`]), `/healthz` (the process is up), `/readyz` (at least one
//! healthy pod, and not shutting down).

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
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
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

async fn decisions(State(shared): State<Arc<Shared>>) -> Response {
    let body = serde_json::to_string(&shared.decisions.snapshot()).unwrap_or_else(|_| "[]".into());
    with_type(body, "application/json", StatusCode::OK)
}

async fn config(State(shared): State<Arc<Shared>>) -> Response {
    let pod_table: Vec<(String, String)> = shared
        .pods
        .all()
        .iter()
        .map(|p| (p.url.clone(), p.class.clone()))
        .collect();
    let config = shared.config();
    let tokenizer = match config.index {
        crate::config::IndexKind::Engine => shared.tokenizer.get().map(|t| t.describe()),
        crate::config::IndexKind::Routed => None,
    };
    let dump = crate::config::ConfigDump::new(&config, &pod_table, tokenizer);
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
        .shutting_down
        .load(std::sync::atomic::Ordering::Acquire)
    {
        return with_type(
            "not ready: shutting down\n".into(),
            "text/plain",
            StatusCode::SERVICE_UNAVAILABLE,
        );
    }
    let healthy = shared.pods.all().iter().filter(|p| p.is_healthy()).count();
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
