//! The request's latency objectives from its headers: `x-slo-ttft-ms` / `x-slo-tpot-ms`, or
//! llm-d's `x-llm-d-slo-ttft-ms` / `x-llm-d-slo-tpot-ms` (the `x-slo-*` name wins when both
//! are sent). The objectives are validated and recorded with the decision; kvgate's gate does
//! not route by them (its SLO mode was removed: docs/decisions/slo-routing.md), the
//! `llmd-chain` policy does, as upstream.
//!
//! A value must be a finite number of milliseconds > 0 (`250`, `12.5`). Anything else — not
//! UTF-8, not a number, `0`, negative, `inf`, `NaN` — is answered with 400
//! `invalid_slo_header` (counted in `kvgate_rejected_requests_total{reason="invalid_slo_header"}`,
//! logged at info) rather than silently routed without the objective: a client that sends an
//! SLO relies on it, and a typo should be seen.

use crate::errors::ApiError;
use http::HeaderMap;
use kvgate_core::policy::RequestSlo;

/// Header names of the TTFT objective, in order of precedence.
pub const TTFT_HEADERS: [&str; 2] = ["x-slo-ttft-ms", "x-llm-d-slo-ttft-ms"];
/// Header names of the TPOT objective, in order of precedence.
pub const TPOT_HEADERS: [&str; 2] = ["x-slo-tpot-ms", "x-llm-d-slo-tpot-ms"];

/// The objectives the headers carry (absent ones are `None`), or the 400 to answer.
pub fn request_slo(headers: &HeaderMap) -> Result<RequestSlo, ApiError> {
    Ok(RequestSlo {
        ttft_ms: objective(headers, &TTFT_HEADERS)?,
        tpot_ms: objective(headers, &TPOT_HEADERS)?,
    })
}

fn objective(headers: &HeaderMap, names: &[&str]) -> Result<Option<f64>, ApiError> {
    let Some((name, value)) = names.iter().find_map(|n| headers.get(*n).map(|v| (*n, v))) else {
        return Ok(None);
    };
    let parsed = value
        .to_str()
        .ok()
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|v| v.is_finite() && *v > 0.0);
    match parsed {
        Some(v) => Ok(Some(v)),
        None => Err(ApiError::bad_request(
            "invalid_slo_header",
            format!(
                "header {name} must be a number of milliseconds > 0, got {:?}",
                String::from_utf8_lossy(value.as_bytes())
            ),
            Some(name.to_string()),
        )),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use http::HeaderValue;

    /// A header map of `pairs` (also the session-key tests').
    pub(crate) fn headers(pairs: &[(&str, &[u8])]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_bytes(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn both_spellings_are_read_and_x_slo_wins() {
        let h = headers(&[
            ("x-llm-d-slo-ttft-ms", b"800"),
            ("x-slo-tpot-ms", b" 12.5 "),
        ]);
        assert_eq!(
            request_slo(&h).unwrap(),
            RequestSlo {
                ttft_ms: Some(800.0),
                tpot_ms: Some(12.5)
            }
        );
        let h = headers(&[("x-llm-d-slo-ttft-ms", b"800"), ("x-slo-ttft-ms", b"300")]);
        assert_eq!(request_slo(&h).unwrap().ttft_ms, Some(300.0));
        assert_eq!(
            request_slo(&HeaderMap::new()).unwrap(),
            RequestSlo::default()
        );
    }

    #[test]
    fn invalid_values_are_a_400_naming_the_header() {
        for bad in [
            &b"fast"[..],
            b"0",
            b"-5",
            b"inf",
            b"NaN",
            b"",
            b"1e999",
            b"\xff\xfe",
        ] {
            let err = request_slo(&headers(&[("x-slo-tpot-ms", bad)])).unwrap_err();
            assert_eq!(err.status, http::StatusCode::BAD_REQUEST, "{bad:?}");
            assert_eq!(err.code, "invalid_slo_header");
            assert_eq!(err.param.as_deref(), Some("x-slo-tpot-ms"));
        }
    }
}
