//! The traffic listener's admission, as a tower layer ([`AdmissionLayer`]): a request's whole
//! body is read first (within its deadline and the body budget), then it waits for a slot of
//! [`crate::limits::Admission`] and holds it until its response body ends. The limits and
//! why they are what they are: [`crate::limits`].

use crate::limits::{Arrived, BodyHold, RETRY_AFTER_S, Slot, read_body_within, too_many_requests};
use crate::reject::reject;
use crate::request_id::request_id;
use crate::state::Shared;
use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use bytes::Bytes;
use http::{HeaderValue, StatusCode, header};
use http_body::{Frame, SizeHint};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower::{Layer, Service};

/// The traffic listener's admission, as a tower layer: a request waits for a slot of
/// [`crate::state::AdmissionHandle::slots`] (in its queue if need be) before it reaches the
/// inner service, and holds the slot until its response body ends or is dropped; with slots and
/// queue full it gets 429 `too_many_requests` with `Retry-After` and never reaches the inner
/// service.
#[derive(Clone)]
pub struct AdmissionLayer {
    shared: Arc<Shared>,
}

impl AdmissionLayer {
    pub fn new(shared: Arc<Shared>) -> Self {
        AdmissionLayer { shared }
    }
}

impl<S> Layer<S> for AdmissionLayer {
    type Service = Admit<S>;

    fn layer(&self, inner: S) -> Admit<S> {
        Admit {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// The service [`AdmissionLayer`] wraps around the listener's routes.
#[derive(Clone)]
pub struct Admit<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S> Service<Request> for Admit<S>
where
    S: Service<Request, Response = Response> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request) -> Self::Future {
        // The service polled ready goes into the future; a clone stays for the next request.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let shared = self.shared.clone();
        Box::pin(async move {
            let arrived = tokio::time::Instant::now();
            let cfg = shared.config();
            let (mut parts, body) = req.into_parts();
            let read_by = arrived + cfg.body_read_timeout.min(cfg.request_timeout);
            let read = read_body_within(
                body,
                cfg.max_body_bytes,
                &shared.admission.body_budget,
                cfg.max_body_bytes_in_flight,
                read_by,
            )
            .await;
            let (bytes, hold) = match read {
                Ok(read) => read,
                Err(e) => {
                    let retry = e.status == StatusCode::SERVICE_UNAVAILABLE;
                    let mut resp = reject(&shared.telemetry, e, &request_id(&parts.headers));
                    if retry {
                        resp.headers_mut()
                            .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_S));
                    }
                    return Ok(resp);
                }
            };
            parts.extensions.insert(Arrived(arrived));
            let req = Request::from_parts(parts, Body::from(bytes));
            // Waiting for a slot counts against the request's deadline.
            let deadline = arrived + cfg.request_timeout;
            let Ok(admitted) =
                tokio::time::timeout_at(deadline, shared.admission.slots.admit()).await
            else {
                let rid = request_id(req.headers());
                return Ok(reject(
                    &shared.telemetry,
                    crate::errors::request_timeout(cfg.request_timeout),
                    &rid,
                ));
            };
            let Some(slot) = admitted else {
                let rid = request_id(req.headers());
                let mut resp = reject(
                    &shared.telemetry,
                    too_many_requests(&shared.admission.slots),
                    &rid,
                );
                resp.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_S));
                return Ok(resp);
            };
            let mut req = req;
            req.extensions_mut().insert(slot.clone());
            let resp = inner.call(req).await?;
            Ok(resp.map(|inner| {
                Body::new(WithSlot {
                    inner,
                    _slot: slot,
                    _body: hold,
                })
            }))
        })
    }
}

/// A response body that holds its request's slot and its body's bytes in the budget until it
/// ends or is dropped.
struct WithSlot {
    inner: Body,
    _slot: Slot,
    _body: BodyHold,
}

impl http_body::Body for WithSlot {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared_with_limits(max_concurrent: usize, max_queued: usize) -> Arc<Shared> {
        let args = crate::config::ServeArgs {
            max_concurrent_requests: Some(max_concurrent),
            max_waiting_requests: Some(max_queued),
            ..Default::default()
        };
        let config = crate::config::GatewayConfig::from_args(&args).expect("limits are valid");
        Shared::new(config)
    }

    fn request() -> Request {
        http::Request::post("/v1/completions")
            .header("x-request-id", "rid-2")
            .body(Body::empty())
            .unwrap()
    }

    #[tokio::test]
    async fn admission_layer_holds_the_slot_for_the_body_and_refuses_with_429_when_full() {
        use http_body_util::BodyExt;
        use tower::ServiceExt;
        let shared = shared_with_limits(1, 0);
        let inner = tower::service_fn(|_req: Request| async {
            Ok::<_, std::convert::Infallible>(Response::new(Body::from("inner")))
        });
        let svc = AdmissionLayer::new(shared.clone()).layer(inner);

        let first = svc.clone().oneshot(request()).await.unwrap();
        assert_eq!(first.status(), StatusCode::OK);
        // The response's body still holds the only slot, and no one may queue.
        assert_eq!(shared.admission.slots.active(), 1);
        let refused = svc.clone().oneshot(request()).await.unwrap();
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(refused.headers()[header::RETRY_AFTER], "1");
        assert_eq!(refused.headers()["x-request-id"], "rid-2");
        let body = refused.into_body().collect().await.unwrap().to_bytes();
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["error"]["code"], "too_many_requests");
        assert_eq!(body["error"]["type"], "rate_limit_error");
        let text = shared.metrics_text().unwrap();
        assert!(
            text.contains(r#"kvgate_rejected_requests_total{reason="too_many_requests"} 1"#),
            "{text}"
        );

        // Reading the first body to its end gives the slot back.
        let body = first.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"inner");
        assert_eq!(shared.admission.slots.active(), 0);
        let again = svc.oneshot(request()).await.unwrap();
        assert_eq!(again.status(), StatusCode::OK);
    }
}
