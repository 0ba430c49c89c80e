//! OpenAI request parsing and prompt rendering: the one place that turns a request body into
//! the text (or token ids) that identifies its prefix. Shared by the gateway, the Envoy
//! endpoint picker, the load generator and `kvgate decide`.
//!
//! CONTRACT (to be implemented):
//! - `/v1/completions`: `prompt` as a string, a list of strings (joined), a list of token ids,
//!   or a list of token-id lists (the first one is routed).
//! - `/v1/chat/completions`: every message, in order, with its role and its content (string or
//!   a list of content parts: `text` parts by their text, other parts by a stable rendering of
//!   their JSON), tool calls and the `tools` array. Any change to any message changes the
//!   rendering from that message on and nothing before it.
//! - Malformed bodies give a typed [`RequestError`], never a panic.

use serde::Serialize;
use thiserror::Error;

/// Which OpenAI endpoint a request targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Endpoint {
    Completions,
    ChatCompletions,
}

/// The part of a request that identifies its prefix.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// Rendered text (approximate mode: hashed in character blocks).
    Text(String),
    /// Token ids given by the client (hashed in token blocks).
    Tokens(Vec<u32>),
}

/// A parsed OpenAI request: what routing needs, nothing more.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedRequest {
    pub endpoint: Endpoint,
    pub model: String,
    pub prompt: Prompt,
    /// vLLM's `cache_salt`: isolates the prefix cache of a tenant; seeds the hash chain.
    pub cache_salt: Option<String>,
    pub stream: bool,
    /// `max_tokens` or `max_completion_tokens`.
    pub max_tokens: Option<u32>,
}

#[derive(Debug, Error, PartialEq)]
pub enum RequestError {
    #[error("unsupported path {0:?}: expected /v1/completions or /v1/chat/completions")]
    UnsupportedPath(String),
    #[error("request body is not valid JSON: {0}")]
    InvalidJson(String),
    #[error("request body must be a JSON object")]
    NotAnObject,
    #[error("missing required field {0:?}")]
    MissingField(&'static str),
    #[error("field {field:?} has the wrong type: {expected}")]
    WrongType {
        field: &'static str,
        expected: &'static str,
    },
}

impl ParsedRequest {
    /// Prompt length in tokens: exact for token prompts, bytes / 4 (rounded up) for text.
    pub fn estimated_input_tokens(&self) -> u32 {
        todo!()
    }
}

/// Parse a raw body for `path` (`/v1/completions` or `/v1/chat/completions`).
pub fn parse_request(path: &str, body: &[u8]) -> Result<ParsedRequest, RequestError> {
    let _ = (path, body);
    todo!()
}

/// Parse an already-decoded JSON body.
pub fn parse_request_value(
    path: &str,
    body: &serde_json::Value,
) -> Result<ParsedRequest, RequestError> {
    let _ = (path, body);
    todo!()
}
