//! The request id every answer carries (`x-request-id`): the client's, when it is usable,
//! else a fresh one.

use http::HeaderMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Longest `x-request-id` honoured; longer or non-visible-ASCII ids are replaced.
const MAX_REQUEST_ID_LEN: usize = 128;

/// The client's `x-request-id` (1..=128 visible ASCII bytes), or `kvg-<time>-<counter>`.
pub fn request_id(headers: &HeaderMap) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    if let Some(id) = headers.get("x-request-id").and_then(|v| v.to_str().ok())
        && !id.is_empty()
        && id.len() <= MAX_REQUEST_ID_LEN
        && id.bytes().all(|b| b.is_ascii_graphic())
    {
        return id.to_string();
    }
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    format!("kvg-{nanos:x}-{:x}", NEXT.fetch_add(1, Ordering::Relaxed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_usable_client_id_is_kept_and_a_bad_one_replaced() {
        let mut h = HeaderMap::new();
        h.insert("x-request-id", "abc-1".parse().unwrap());
        assert_eq!(request_id(&h), "abc-1");
        h.insert("x-request-id", "x".repeat(129).parse().unwrap());
        assert!(request_id(&h).starts_with("kvg-"));
        assert!(request_id(&HeaderMap::new()).starts_with("kvg-"));
    }
}
