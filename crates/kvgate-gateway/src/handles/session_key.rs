//! The request's client session, from its headers: the key session affinity
//! (`kvgate_core::index::sessions`) remembers a pod for.
//!
//! Read only while session affinity is on (the router key `session_affinity_ttl_ms` above 0):
//! the first of `session_headers` (default [`DEFAULT_SESSION_HEADERS`]) that the request
//! carries names its session. Those defaults are what agent clients send: `x-session-id` (the
//! common convention: Ray Serve, Caddy's header hashing), `x-claude-code-session-id` (Claude
//! Code) and `x-session-affinity` (OpenCode). The key is the xxh3-64 of the value's bytes, so
//! replicas agree on it without sharing a table (`--cluster` shares each session's pod).
//!
//! A value must be 1 to [`MAX_SESSION_VALUE_BYTES`] bytes of visible ASCII; anything else is
//! answered with 400 `invalid_session_header` (counted in
//! `kvgate_rejected_requests_total{reason="invalid_session_header"}`), as a bad SLO header is:
//! a client that names its session relies on it.

use crate::errors::ApiError;
use http::HeaderMap;

/// The headers read by default, in order of precedence.
pub const DEFAULT_SESSION_HEADERS: [&str; 3] = [
    "x-session-id",
    "x-claude-code-session-id",
    "x-session-affinity",
];

/// Longest session value accepted, bytes.
pub const MAX_SESSION_VALUE_BYTES: usize = 256;

/// The request's session key: `None` when it carries none of `names`; the 400 to answer when
/// the first one it carries is empty, too long or not visible ASCII.
pub fn session_key(headers: &HeaderMap, names: &[String]) -> Result<Option<u64>, ApiError> {
    let Some((name, value)) = names
        .iter()
        .find_map(|n| headers.get(n.as_str()).map(|v| (n, v)))
    else {
        return Ok(None);
    };
    let bytes = value.as_bytes();
    let valid = !bytes.is_empty()
        && bytes.len() <= MAX_SESSION_VALUE_BYTES
        && bytes.iter().all(|b| b.is_ascii_graphic());
    if !valid {
        return Err(ApiError::bad_request(
            "invalid_session_header",
            format!(
                "header {name} must be 1 to {MAX_SESSION_VALUE_BYTES} visible ASCII characters \
                 naming the client's session, got {} bytes",
                bytes.len()
            ),
            Some(name.clone()),
        ));
    }
    Ok(Some(xxhash_rust::xxh3::xxh3_64(bytes)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slo::tests::headers;

    fn defaults() -> Vec<String> {
        DEFAULT_SESSION_HEADERS.map(String::from).to_vec()
    }

    #[test]
    fn the_first_configured_header_names_the_session() {
        let names = defaults();
        let a = session_key(&headers(&[("x-session-id", b"agent-1")]), &names).unwrap();
        let same = session_key(&headers(&[("X-Session-Id", b"agent-1")]), &names).unwrap();
        let other = session_key(&headers(&[("x-session-id", b"agent-2")]), &names).unwrap();
        assert!(a.is_some());
        assert_eq!(a, same, "header names are case-insensitive");
        assert_ne!(a, other);
        // Claude Code's header, and precedence: x-session-id first.
        let claude = session_key(
            &headers(&[("x-claude-code-session-id", b"agent-1")]),
            &names,
        )
        .unwrap();
        assert_eq!(
            claude, a,
            "the key is the value's, whichever header carries it"
        );
        let both = session_key(
            &headers(&[
                ("x-claude-code-session-id", b"agent-2"),
                ("x-session-id", b"agent-1"),
            ]),
            &names,
        )
        .unwrap();
        assert_eq!(both, a);
        assert_eq!(session_key(&HeaderMap::new(), &names).unwrap(), None);
        // Only the configured names are read.
        let custom = vec!["x-agent".to_string()];
        assert_eq!(
            session_key(&headers(&[("x-session-id", b"agent-1")]), &custom).unwrap(),
            None
        );
        assert!(
            session_key(&headers(&[("x-agent", b"agent-1")]), &custom)
                .unwrap()
                .is_some()
        );
    }

    #[test]
    fn an_empty_overlong_or_binary_value_is_a_400() {
        let names = defaults();
        let long = vec![b'a'; MAX_SESSION_VALUE_BYTES + 1];
        let max = vec![b'a'; MAX_SESSION_VALUE_BYTES];
        assert!(
            session_key(&headers(&[("x-session-id", &max)]), &names)
                .unwrap()
                .is_some()
        );
        for bad in [&b""[..], &long, b"a b", b"\xff\xfe"] {
            let err = session_key(&headers(&[("x-session-id", bad)]), &names).unwrap_err();
            assert_eq!(err.code, "invalid_session_header");
            assert_eq!(err.status, http::StatusCode::BAD_REQUEST);
        }
    }
}
