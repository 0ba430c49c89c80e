//! Optional API keys on the traffic listener (`--api-key`, `KVGATE_API_KEYS`): with at least one
//! key configured, every `/v1/*` request must carry `Authorization: Bearer <key>`, else 401.
//!
//! Keys are kept only as 128-bit digests (xxh3), and a presented key is compared with every
//! configured digest in constant time (`subtle`), so neither the timing nor the key's length
//! tells how close a guess was. The `Authorization` header is never logged, and it is forwarded
//! to pods only with `--forward-authorization`.

use crate::errors::ApiError;
use crate::errors::log_reject;
use crate::request_id::request_id;
use crate::state::Shared;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use http::{HeaderValue, StatusCode, header};
use std::sync::Arc;
use subtle::ConstantTimeEq;

/// The configured API keys, as digests. Its `Debug` shows only how many there are.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ApiKeys(Vec<[u8; 16]>);

impl std::fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ApiKeys({} keys)", self.0.len())
    }
}

fn digest(key: &[u8]) -> [u8; 16] {
    xxhash_rust::xxh3::xxh3_128(key).to_le_bytes()
}

impl ApiKeys {
    /// Empty keys are ignored (a trailing comma in `KVGATE_API_KEYS`).
    pub fn new<'a>(keys: impl IntoIterator<Item = &'a str>) -> Self {
        ApiKeys(
            keys.into_iter()
                .map(str::trim)
                .filter(|k| !k.is_empty())
                .map(|k| digest(k.as_bytes()))
                .collect(),
        )
    }

    /// No key configured: the listener is open.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How many keys are accepted (`/debug/config` shows this, never the keys).
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether an `Authorization` header value is `Bearer <one of the keys>`; every key is
    /// compared, in constant time.
    pub fn allows(&self, authorization: Option<&HeaderValue>) -> bool {
        let Some(key) = authorization.and_then(|v| bearer_token(v.as_bytes())) else {
            return false;
        };
        let presented = digest(key);
        self.0
            .iter()
            .fold(subtle::Choice::from(0), |ok, k| ok | k.ct_eq(&presented))
            .into()
    }
}

/// The token of `Bearer <token>` (scheme case-insensitive).
fn bearer_token(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(7)?;
    if !scheme.eq_ignore_ascii_case(b"bearer ") {
        return None;
    }
    let token = rest.trim_ascii();
    (!token.is_empty()).then_some(token)
}

/// The middleware of the traffic listener: `/v1/*` needs a key when keys are configured.
pub async fn authorize(State(shared): State<Arc<Shared>>, req: Request, next: Next) -> Response {
    let keys = &shared.config().api_keys;
    if keys.is_empty()
        || !req.uri().path().starts_with("/v1/")
        || keys.allows(req.headers().get(header::AUTHORIZATION))
    {
        return next.run(req).await;
    }
    let rid = request_id(req.headers());
    let err = ApiError {
        status: StatusCode::UNAUTHORIZED,
        kind: "invalid_request_error",
        code: "invalid_api_key",
        message: "missing or invalid API key: send Authorization: Bearer <key>".into(),
        param: None,
    };
    log_reject(&shared, &err, &rid);
    let mut resp = err.into_response(&rid);
    resp.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
