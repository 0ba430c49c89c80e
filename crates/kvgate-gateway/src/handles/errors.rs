//! OpenAI-style error responses: `{"error": {"message", "type", "param", "code"}}`.

use axum::body::Body;
use axum::response::Response;
use http::{HeaderValue, StatusCode, header};

/// An error the gateway answers itself.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    /// OpenAI `type`: `invalid_request_error`, `service_unavailable`, `upstream_error`, …
    pub kind: &'static str,
    /// Short machine-readable code; also the `reason` label of `kvgate_rejected_requests`.
    pub code: &'static str,
    pub message: String,
    pub param: Option<String>,
}

impl ApiError {
    pub fn bad_request(code: &'static str, message: String, param: Option<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            kind: "invalid_request_error",
            code,
            message,
            param,
        }
    }

    pub fn body_json(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }

    pub fn into_response(self, request_id: &str) -> Response {
        let body = self.body_json().to_string();
        let mut resp = Response::new(Body::from(body));
        *resp.status_mut() = self.status;
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let Ok(v) = HeaderValue::from_str(request_id) {
            resp.headers_mut().insert("x-request-id", v);
        }
        resp
    }
}

/// The SSE event sent to a streaming client when the pod fails mid-stream, followed by
/// `[DONE]` so that clients end the stream cleanly.
pub fn stream_error_event(message: &str) -> bytes::Bytes {
    stream_error(&ApiError {
        status: StatusCode::BAD_GATEWAY,
        kind: "upstream_error",
        code: "upstream_stream_error",
        message: message.to_string(),
        param: None,
    })
}

/// The error of the gateway's request timeout: 504 before any response, or the SSE event
/// (code `request_timeout`) that ends a stream.
pub fn request_timeout(timeout: std::time::Duration) -> ApiError {
    ApiError {
        status: StatusCode::GATEWAY_TIMEOUT,
        kind: "timeout_error",
        code: "request_timeout",
        message: format!(
            "the request ran longer than the gateway's limit of {} ms",
            timeout.as_millis()
        ),
        param: None,
    }
}

/// The error that ends a stream still in flight when the shutdown grace
/// (`--shutdown-grace-ms`) is over: the SSE event (code `shutting_down`) before `[DONE]`.
pub fn shutting_down(grace: std::time::Duration) -> ApiError {
    ApiError {
        status: StatusCode::SERVICE_UNAVAILABLE,
        kind: "service_unavailable",
        code: "shutting_down",
        message: format!(
            "the gateway is shutting down and its grace of {} ms for requests in flight is over",
            grace.as_millis()
        ),
        param: None,
    }
}

/// `err` as the last SSE events of a stream: the error, then `[DONE]`.
pub fn stream_error(err: &ApiError) -> bytes::Bytes {
    bytes::Bytes::from(format!("data: {}\n\ndata: [DONE]\n\n", err.body_json()))
}

/// A request body the core's parser rejected: 400 with the field in `param`.
pub fn request_error(e: kvgate_core::request::RequestError) -> ApiError {
    use kvgate_core::request::RequestError;
    let (code, param) = match &e {
        RequestError::UnsupportedPath(_) => ("unsupported_path", None),
        RequestError::InvalidJson(_) => ("invalid_json", None),
        RequestError::NotAnObject => ("invalid_json", None),
        RequestError::MissingField(f) => ("missing_field", Some(f.to_string())),
        RequestError::WrongType { field, .. } => ("wrong_type", Some(field.to_string())),
    };
    ApiError::bad_request(code, e.to_string(), param)
}

/// 503: no healthy pod can take the request.
pub fn no_healthy_pod() -> ApiError {
    ApiError {
        status: StatusCode::SERVICE_UNAVAILABLE,
        kind: "service_unavailable",
        code: "no_healthy_pod",
        message: "no healthy pod to serve the request".into(),
        param: None,
    }
}

/// 502: the pod failed before any byte reached the client, on every attempt.
pub fn upstream_failed(why: String) -> ApiError {
    ApiError {
        status: StatusCode::BAD_GATEWAY,
        kind: "upstream_error",
        code: "upstream_failed",
        message: why,
        param: None,
    }
}
