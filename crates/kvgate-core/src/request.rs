//! OpenAI request parsing and prompt rendering: the one place that turns a request body into
//! the text (or token ids) that identifies its prefix. Shared by the gateway, the Envoy
//! endpoint picker, the load generator and `kvgate decide`.
//!
//! # What is read
//!
//! Only what routing needs: `model` (required string), `cache_salt` (optional string, vLLM's
//! per-tenant prefix-cache isolation), `stream` (optional bool, default `false`),
//! `max_completion_tokens` / `max_tokens` (optional u32; when both are given
//! `max_completion_tokens` wins, as in vLLM) and the prompt. Unknown fields are ignored; a known
//! field of the wrong type is a [`RequestError::WrongType`]. Paths are matched exactly
//! (`/v1/completions`, `/v1/chat/completions`; no query string, no trailing slash).
//!
//! # `/v1/completions`
//!
//! `prompt` may be
//! - a string: the prompt is that text, unchanged;
//! - a list of strings: one string is that string; several are joined as `{len}:{text}` for
//!   each (`len` = UTF-8 byte length in decimal), so `["ab","c"]` and `["a","bc"]` differ;
//! - a list of token ids (u32): [`Prompt::Tokens`];
//! - a list of token-id lists (a batch): the first one is routed; all are validated.
//!
//! # `/v1/chat/completions`: the rendering
//!
//! The chat prompt is rendered into a byte string that is *injective* (two different
//! conversations never render the same) and *prefix-stable* (the rendering of `messages[..k]` is
//! a prefix of the rendering of `messages[..k+1]`), so a follow-up turn shares the block hashes
//! of the previous turn, and a change to message `i` changes the rendering from message `i`'s
//! start on and nothing before it. Every field value is length-prefixed (`{tag}{len}:{bytes}`,
//! `len` the UTF-8 byte length in decimal), which makes each record self-delimiting:
//!
//! ```text
//! rendering = [tools] message*
//! tools     = "T" len ":" json(tools) "\n"
//! message   = "r" len ":" role
//!             ["n" len ":" name]
//!             [content]
//!             ["f" len ":" json(tool_calls)]
//!             ["i" len ":" tool_call_id]
//!             "\n"
//! content   = "c" len ":" text                  (string content)
//!           | "l" count ":" part*               (a list of content parts)
//! part      = "t" len ":" text                  ({"type":"text","text":...})
//!           | "p" len ":" json(part)            (any other part: image_url, input_audio, ...)
//! ```
//!
//! Absent or `null` optional fields render nothing. `json(v)` is a canonical compact JSON
//! rendering with object keys sorted, so it does not depend on the key order of the body nor on
//! serde_json's `preserve_order` feature.
//!
//! **Tools come first**, before every message: chat templates usually put the tool
//! definitions in the system prompt, and (the reason that matters here) putting them last would
//! break prefix stability, since appending a message would then have to insert bytes before the
//! tools. The cost: changing the tools changes every block, which is also what happens on the
//! engine, where they sit at the top of the prompt.
//!
//! # Token estimate
//!
//! [`ParsedRequest::estimated_input_tokens`]: the exact count for token prompts, and
//! `ceil(bytes / 4)` for text, 4 being llm-d's `averageCharactersPerToken`
//! ([`crate::blocks::DEFAULT_CHARS_PER_TOKEN`]) applied to UTF-8 bytes of the rendering.
//!
//! # Malformed input
//!
//! Nothing here panics on a body: invalid JSON (including nesting deeper than serde_json's
//! limit of 128) is [`RequestError::InvalidJson`], the rest are typed errors naming the field.

use std::fmt::Write as _;

use serde::Serialize;
use serde_json::{Map, Value};
use thiserror::Error;

use crate::blocks::DEFAULT_CHARS_PER_TOKEN;

/// Path of the completions endpoint.
pub const COMPLETIONS_PATH: &str = "/v1/completions";
/// Path of the chat completions endpoint.
pub const CHAT_COMPLETIONS_PATH: &str = "/v1/chat/completions";

/// Deepest JSON nesting the canonical rendering accepts (serde_json's own parse limit), so a
/// hand-built [`Value`] cannot overflow the stack.
const MAX_JSON_DEPTH: usize = 128;

/// Which OpenAI endpoint a request targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Endpoint {
    Completions,
    ChatCompletions,
}

impl Endpoint {
    /// The endpoint served at `path`, matched exactly.
    pub fn from_path(path: &str) -> Option<Endpoint> {
        match path {
            COMPLETIONS_PATH => Some(Endpoint::Completions),
            CHAT_COMPLETIONS_PATH => Some(Endpoint::ChatCompletions),
            _ => None,
        }
    }
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
        let tokens = match &self.prompt {
            Prompt::Tokens(ids) => ids.len() as u64,
            Prompt::Text(text) => (text.len() as u64).div_ceil(u64::from(DEFAULT_CHARS_PER_TOKEN)),
        };
        u32::try_from(tokens).unwrap_or(u32::MAX)
    }
}

/// Parse a raw body for `path` (`/v1/completions` or `/v1/chat/completions`).
pub fn parse_request(path: &str, body: &[u8]) -> Result<ParsedRequest, RequestError> {
    // Check the path first: no point decoding a body we would reject anyway.
    if Endpoint::from_path(path).is_none() {
        return Err(RequestError::UnsupportedPath(path.to_owned()));
    }
    let value: Value =
        serde_json::from_slice(body).map_err(|e| RequestError::InvalidJson(e.to_string()))?;
    parse_request_value(path, &value)
}

/// Parse an already-decoded JSON body.
pub fn parse_request_value(path: &str, body: &Value) -> Result<ParsedRequest, RequestError> {
    let endpoint =
        Endpoint::from_path(path).ok_or_else(|| RequestError::UnsupportedPath(path.to_owned()))?;
    let body = body.as_object().ok_or(RequestError::NotAnObject)?;

    let model = match body.get("model") {
        None | Some(Value::Null) => return Err(RequestError::MissingField("model")),
        Some(Value::String(model)) => model.clone(),
        Some(_) => return Err(wrong_type("model", "a string")),
    };
    let cache_salt = optional_string(body, "cache_salt")?.map(str::to_owned);
    let stream = match body.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(stream)) => *stream,
        Some(_) => return Err(wrong_type("stream", "a boolean")),
    };
    let max_completion_tokens = optional_u32(body, "max_completion_tokens")?;
    let max_tokens = max_completion_tokens.or(optional_u32(body, "max_tokens")?);

    let prompt = match endpoint {
        Endpoint::Completions => completions_prompt(body)?,
        Endpoint::ChatCompletions => {
            let messages = match body.get("messages") {
                None | Some(Value::Null) => return Err(RequestError::MissingField("messages")),
                Some(Value::Array(messages)) => messages,
                Some(_) => return Err(wrong_type("messages", "an array of messages")),
            };
            Prompt::Text(render_chat(messages, body.get("tools"))?)
        }
    };

    Ok(ParsedRequest {
        endpoint,
        model,
        prompt,
        cache_salt,
        stream,
        max_tokens,
    })
}

/// Renders a chat conversation (`messages` and the optional `tools` array) as described in the
/// module docs. `render_chat(&messages[..k], tools)` is a prefix of
/// `render_chat(&messages[..k + 1], tools)`.
pub fn render_chat(messages: &[Value], tools: Option<&Value>) -> Result<String, RequestError> {
    let mut out = String::new();
    match tools {
        None | Some(Value::Null) => {}
        Some(tools @ Value::Array(_)) => {
            let json = canonical_json(tools, "tools")?;
            push_field(&mut out, 'T', &json);
            out.push('\n');
        }
        Some(_) => return Err(wrong_type("tools", "an array of tool definitions")),
    }
    for message in messages {
        render_message(&mut out, message)?;
    }
    Ok(out)
}

/// Appends the rendering of one chat message to `out`.
fn render_message(out: &mut String, message: &Value) -> Result<(), RequestError> {
    let message = message
        .as_object()
        .ok_or_else(|| wrong_type("messages[]", "an object"))?;

    let role = match message.get("role") {
        None | Some(Value::Null) => return Err(RequestError::MissingField("messages[].role")),
        Some(Value::String(role)) => role,
        Some(_) => return Err(wrong_type("messages[].role", "a string")),
    };
    push_field(out, 'r', role);

    if let Some(name) =
        optional_string(message, "name").map_err(|_| wrong_type("messages[].name", "a string"))?
    {
        push_field(out, 'n', name);
    }

    match message.get("content") {
        None | Some(Value::Null) => {}
        Some(Value::String(text)) => push_field(out, 'c', text),
        Some(Value::Array(parts)) => {
            push_count(out, 'l', parts.len());
            for part in parts {
                match text_part(part) {
                    Some(text) => push_field(out, 't', text),
                    None => push_field(out, 'p', &canonical_json(part, "messages[].content")?),
                }
            }
        }
        Some(_) => {
            return Err(wrong_type(
                "messages[].content",
                "a string, an array of content parts or null",
            ));
        }
    }

    match message.get("tool_calls") {
        None | Some(Value::Null) => {}
        Some(calls @ Value::Array(_)) => {
            push_field(out, 'f', &canonical_json(calls, "messages[].tool_calls")?)
        }
        Some(_) => return Err(wrong_type("messages[].tool_calls", "an array")),
    }

    if let Some(id) = optional_string(message, "tool_call_id")
        .map_err(|_| wrong_type("messages[].tool_call_id", "a string"))?
    {
        push_field(out, 'i', id);
    }

    out.push('\n');
    Ok(())
}

/// The text of a `{"type": "text", "text": "..."}` content part; `None` for any other part,
/// which is then rendered by its canonical JSON.
fn text_part(part: &Value) -> Option<&str> {
    let part = part.as_object()?;
    if part.get("type")?.as_str()? != "text" {
        return None;
    }
    part.get("text")?.as_str()
}

fn completions_prompt(body: &Map<String, Value>) -> Result<Prompt, RequestError> {
    const EXPECTED: &str = "a string, an array of strings, an array of token ids (u32) \
                            or an array of token-id arrays";
    let items = match body.get("prompt") {
        None | Some(Value::Null) => return Err(RequestError::MissingField("prompt")),
        Some(Value::String(text)) => return Ok(Prompt::Text(text.clone())),
        Some(Value::Array(items)) => items,
        Some(_) => return Err(wrong_type("prompt", EXPECTED)),
    };
    match items.first() {
        None => Err(wrong_type("prompt", "a non-empty array")),
        Some(Value::String(first)) => {
            if items.len() == 1 {
                return Ok(Prompt::Text(first.clone()));
            }
            let mut joined = String::new();
            for item in items {
                let text = item
                    .as_str()
                    .ok_or_else(|| wrong_type("prompt", EXPECTED))?;
                push_len_prefixed(&mut joined, text);
            }
            Ok(Prompt::Text(joined))
        }
        Some(Value::Number(_)) => Ok(Prompt::Tokens(token_ids(items)?)),
        Some(Value::Array(first)) => {
            let routed = token_ids(first)?;
            for item in &items[1..] {
                let ids = item
                    .as_array()
                    .ok_or_else(|| wrong_type("prompt", EXPECTED))?;
                token_ids(ids)?;
            }
            Ok(Prompt::Tokens(routed))
        }
        Some(_) => Err(wrong_type("prompt", EXPECTED)),
    }
}

fn token_ids(items: &[Value]) -> Result<Vec<u32>, RequestError> {
    items
        .iter()
        .map(|item| {
            item.as_u64()
                .and_then(|id| u32::try_from(id).ok())
                .ok_or_else(|| wrong_type("prompt", "token ids between 0 and 4294967295"))
        })
        .collect()
}

fn optional_string<'a>(
    object: &'a Map<String, Value>,
    field: &'static str,
) -> Result<Option<&'a str>, RequestError> {
    match object.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(wrong_type(field, "a string")),
    }
}

fn optional_u32(
    object: &Map<String, Value>,
    field: &'static str,
) -> Result<Option<u32>, RequestError> {
    match object.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => value
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| wrong_type(field, "an integer between 0 and 4294967295")),
    }
}

fn wrong_type(field: &'static str, expected: &'static str) -> RequestError {
    RequestError::WrongType { field, expected }
}

/// `{tag}{byte length}:{value}`.
fn push_field(out: &mut String, tag: char, value: &str) {
    out.push(tag);
    push_len_prefixed(out, value);
}

/// `{len}:{value}`.
fn push_len_prefixed(out: &mut String, value: &str) {
    // Writing to a String cannot fail.
    let _ = write!(out, "{}:", value.len());
    out.push_str(value);
}

/// `{tag}{count}:`.
fn push_count(out: &mut String, tag: char, count: usize) {
    out.push(tag);
    let _ = write!(out, "{count}:");
}

/// Compact JSON with object keys sorted, independent of the map's iteration order.
/// `field` names the request field in the error for JSON nested deeper than
/// [`MAX_JSON_DEPTH`].
fn canonical_json(value: &Value, field: &'static str) -> Result<String, RequestError> {
    let mut out = String::new();
    if write_canonical(&mut out, value, 0) {
        Ok(out)
    } else {
        Err(wrong_type(field, "JSON nested at most 128 levels deep"))
    }
}

/// Returns `false` when `value` is nested deeper than [`MAX_JSON_DEPTH`].
fn write_canonical(out: &mut String, value: &Value, depth: usize) -> bool {
    if depth >= MAX_JSON_DEPTH {
        return false;
    }
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => {
            let _ = write!(out, "{n}");
        }
        Value::String(s) => write_json_string(out, s),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                if !write_canonical(out, item, depth + 1) {
                    return false;
                }
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_json_string(out, key);
                out.push(':');
                if !write_canonical(out, item, depth + 1) {
                    return false;
                }
            }
            out.push('}');
        }
    }
    true
}

fn write_json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}
