//! Optional API keys on the traffic listener (`--api-key`, `KVGATE_API_KEYS`): with at least one
//! key configured, every `/v1/*` request must carry `Authorization: Bearer <key>`, else 401.
//!
//! Keys are kept only as 128-bit digests (xxh3), and a presented key is compared with every
//! configured digest in constant time (`subtle`), so neither the timing nor the key's length
//! tells how close a guess was. The `Authorization` header is never logged, and it is forwarded
//! to pods only with `--forward-authorization`.

pub use crate::config::ApiKeys;
use crate::errors::ApiError;
use crate::reject::reject;
use crate::request_id::request_id;
use crate::state::{Shared, Telemetry};
use axum::extract::Request;
use axum::response::Response;
use http::{HeaderValue, StatusCode, header};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower::{Layer, Service};

/// The traffic listener's API-key check, as a tower layer: with keys configured, a `/v1/*`
/// request without `Authorization: Bearer <key>` gets 401 (`invalid_api_key`,
/// `WWW-Authenticate: Bearer`) and never reaches the inner service. The keys are read from the
/// config in force on every request, so a reload takes effect at once.
#[derive(Clone)]
pub struct AuthLayer {
    shared: Arc<Shared>,
}

impl AuthLayer {
    pub fn new(shared: Arc<Shared>) -> Self {
        AuthLayer { shared }
    }
}

impl<S> Layer<S> for AuthLayer {
    type Service = Auth<S>;

    fn layer(&self, inner: S) -> Auth<S> {
        Auth {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// The service [`AuthLayer`] wraps around the listener's routes.
#[derive(Clone)]
pub struct Auth<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S> Service<Request> for Auth<S>
where
    S: Service<Request, Response = Response>,
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
        let keys = &self.shared.config().api_keys;
        if keys.is_empty()
            || !req.uri().path().starts_with("/v1/")
            || keys.allows(req.headers().get(header::AUTHORIZATION))
        {
            return Box::pin(self.inner.call(req));
        }
        let unauthorized = unauthorized(&self.shared.telemetry, &request_id(req.headers()));
        Box::pin(std::future::ready(Ok(unauthorized)))
    }
}

/// The 401 of a request without a valid key, counted and logged.
fn unauthorized(telemetry: &Telemetry, rid: &str) -> Response {
    let err = ApiError {
        status: StatusCode::UNAUTHORIZED,
        kind: "invalid_request_error",
        code: "invalid_api_key",
        message: "missing or invalid API key: send Authorization: Bearer <key>".into(),
        param: None,
    };
    let mut resp = reject(telemetry, err, rid);
    resp.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::bearer_token;

    #[test]
    fn only_a_configured_bearer_key_is_allowed() {
        let keys = ApiKeys::new(["k1", "", " k2 "]);
        assert_eq!(format!("{keys:?}"), "ApiKeys(2 keys)");
        let allows = |v: &str| keys.allows(Some(&HeaderValue::from_str(v).unwrap()));
        assert!(allows("Bearer k1"));
        assert!(allows("bearer k2"));
        assert!(!allows("Bearer k3"));
        assert!(!allows("Bearer "));
        assert!(!allows("Basic k1"));
        assert!(!allows("k1"));
        assert!(!keys.allows(None));
        assert!(!keys.allows(Some(&HeaderValue::from_bytes(b"Bearer \xff").unwrap())));
    }

    proptest::proptest! {
        #[test]
        fn any_header_bytes_are_judged_without_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..64)) {
            let keys = ApiKeys::new(["secret-key"]);
            if let Ok(v) = HeaderValue::from_bytes(&bytes) {
                let allowed = keys.allows(Some(&v));
                proptest::prop_assert_eq!(allowed, bearer_token(&bytes) == Some(&b"secret-key"[..]));
            }
        }
    }

    fn service_with_keys(
        keys: &[&str],
    ) -> (
        Arc<Shared>,
        Auth<tower::util::BoxCloneSyncService<Request, Response, std::convert::Infallible>>,
    ) {
        let mut config =
            crate::config::GatewayConfig::from_args(&crate::config::ServeArgs::default())
                .expect("defaults are valid");
        config.api_keys = ApiKeys::new(keys.iter().copied());
        let shared = Shared::new(config);
        let inner = tower::service_fn(|_req: Request| async {
            Ok::<_, std::convert::Infallible>(Response::new(axum::body::Body::from("inner")))
        });
        let svc =
            AuthLayer::new(shared.clone()).layer(tower::util::BoxCloneSyncService::new(inner));
        (shared, svc)
    }

    fn request(path: &str, authorization: Option<&str>) -> Request {
        let mut req = http::Request::get(path).header("x-request-id", "rid-1");
        if let Some(a) = authorization {
            req = req.header(header::AUTHORIZATION, a);
        }
        req.body(axum::body::Body::empty()).unwrap()
    }

    async fn body_of(resp: Response) -> String {
        use http_body_util::BodyExt;
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn auth_layer_answers_401_without_a_key_and_passes_a_good_one() {
        use tower::ServiceExt;
        let (shared, svc) = service_with_keys(&["k1"]);
        let resp = svc
            .clone()
            .oneshot(request("/v1/models", None))
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(resp.headers()[header::WWW_AUTHENTICATE], "Bearer");
        assert_eq!(resp.headers()["x-request-id"], "rid-1");
        let body: serde_json::Value = serde_json::from_str(&body_of(resp).await).unwrap();
        assert_eq!(body["error"]["code"], "invalid_api_key");
        assert_eq!(body["error"]["type"], "invalid_request_error");
        let text = shared.metrics_text().unwrap();
        assert!(
            text.contains(r#"kvgate_rejected_requests_total{reason="invalid_api_key"} 1"#),
            "{text}"
        );

        let resp = svc
            .clone()
            .oneshot(request("/v1/models", Some("Bearer k1")))
            .await
            .unwrap();
        assert_eq!(
            (resp.status(), body_of(resp).await.as_str()),
            (StatusCode::OK, "inner")
        );
        let resp = svc
            .clone()
            .oneshot(request("/v1/models", Some("Bearer k2")))
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
        // Outside /v1/* no key is asked for.
        let resp = svc.oneshot(request("/healthz", None)).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
    }

    #[tokio::test]
    async fn auth_layer_without_keys_lets_everything_through() {
        use tower::ServiceExt;
        let (_, svc) = service_with_keys(&[]);
        let resp = svc.oneshot(request("/v1/models", None)).await.unwrap();
        assert_eq!(
            (resp.status(), body_of(resp).await.as_str()),
            (StatusCode::OK, "inner")
        );
    }
}
