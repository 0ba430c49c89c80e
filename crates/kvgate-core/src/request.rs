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
//! ([`DEFAULT_CHARS_PER_TOKEN`]) applied to UTF-8 bytes of the rendering.
//!
//! # Malformed input
//!
//! Nothing here panics on a body: invalid JSON (including nesting deeper than serde_json's
//! limit of 128) is [`RequestError::InvalidJson`], the rest are typed errors naming the field.
//! A raw body is read by [`crate::json`] (its strings are not copied; its errors are
//! serde_json's), a `serde_json::Value` is read through the same code.

use std::fmt::Write as _;

use serde::Serialize;
use serde_json::Value;

use crate::json::{Json, JsonStr};
use thiserror::Error;

/// Characters per token assumed where a prompt is not tokenized: the approximate block mode
/// and a request's input-token estimate (llm-d's `averageCharactersPerToken`).
pub const DEFAULT_CHARS_PER_TOKEN: u32 = 4;

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
    /// A text prompt cut into blocks where it lay in the body, without rendering it
    /// ([`crate::blocks::BlockHasher::hash_value`]): only its length in bytes is kept (the
    /// input-token estimate's). [`parse_request`] and [`parse_request_value`] never return it.
    Hashed { text_bytes: usize },
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
            Prompt::Hashed { text_bytes } => {
                (*text_bytes as u64).div_ceil(u64::from(DEFAULT_CHARS_PER_TOKEN))
            }
        };
        u32::try_from(tokens).unwrap_or(u32::MAX)
    }
}

/// Parse a raw body for `path` (`/v1/completions` or `/v1/chat/completions`).
///
/// # Errors
/// [`RequestError::UnsupportedPath`] for any other path (checked before the body is decoded),
/// [`RequestError::InvalidJson`] for a body that is not JSON, and the errors of
/// [`parse_request_value`].
pub fn parse_request(path: &str, body: &[u8]) -> Result<ParsedRequest, RequestError> {
    // Check the path first: no point decoding a body we would reject anyway.
    if Endpoint::from_path(path).is_none() {
        return Err(RequestError::UnsupportedPath(path.to_owned()));
    }
    let mut fallback = None;
    let json = crate::json::parse_with(body, &mut fallback)
        .map_err(|e| RequestError::InvalidJson(e.to_string()))?;
    parse_request_json(path, &json)
}

/// Parse an already-decoded JSON body.
///
/// # Errors
/// [`RequestError::UnsupportedPath`], [`RequestError::NotAnObject`], and
/// [`RequestError::MissingField`] / [`RequestError::WrongType`] naming the offending field
/// (`messages[].content` and the like for fields inside a message).
pub fn parse_request_value(path: &str, body: &Value) -> Result<ParsedRequest, RequestError> {
    parse_request_json(path, &Json::from_value(body))
}

/// [`parse_request_value`] of a body read by [`crate::json`] (its strings not copied).
///
/// # Errors
/// Those of [`parse_request_value`].
pub fn parse_request_json(path: &str, body: &Json<'_>) -> Result<ParsedRequest, RequestError> {
    let mut text = String::new();
    parse_value_into(path, body, &mut text, |text| {
        Prompt::Text(std::mem::take(text))
    })
}

/// Where a text prompt goes as it is written: a `String` (the rendering), or a block hasher
/// that cuts it into blocks piece by piece without holding it
/// ([`crate::blocks::BlockHasher::hash_value`]). The pieces written, joined, are the rendering.
pub(crate) trait TextSink {
    fn push_str(&mut self, piece: &str);
    /// About how many bytes will follow (a hint for buffers).
    fn reserve(&mut self, _bytes: usize) {}
}

impl TextSink for String {
    fn push_str(&mut self, piece: &str) {
        String::push_str(self, piece);
    }
    fn reserve(&mut self, bytes: usize) {
        String::reserve(self, bytes);
    }
}

/// [`parse_request_value`] with a text prompt written to `sink`; `text_prompt` turns the sink
/// into the request's [`Prompt`] once the text is written (token prompts do not use it).
pub(crate) fn parse_value_into<S: TextSink>(
    path: &str,
    body: &Json<'_>,
    sink: &mut S,
    text_prompt: impl FnOnce(&mut S) -> Prompt,
) -> Result<ParsedRequest, RequestError> {
    let endpoint =
        Endpoint::from_path(path).ok_or_else(|| RequestError::UnsupportedPath(path.to_owned()))?;
    if !matches!(body, Json::Object(_)) {
        return Err(RequestError::NotAnObject);
    }

    let model = match body.get("model") {
        None | Some(Json::Null) => return Err(RequestError::MissingField("model")),
        Some(Json::String(model)) => model.to_cow().into_owned(),
        Some(_) => return Err(wrong_type("model", "a string")),
    };
    let cache_salt = optional_string(body, "cache_salt")?.map(|s| s.to_cow().into_owned());
    let stream = match body.get("stream") {
        None | Some(Json::Null) => false,
        Some(Json::Bool(stream)) => *stream,
        Some(_) => return Err(wrong_type("stream", "a boolean")),
    };
    let max_completion_tokens = optional_u32(body, "max_completion_tokens")?;
    let max_tokens = max_completion_tokens.or(optional_u32(body, "max_tokens")?);

    let prompt = match endpoint {
        Endpoint::Completions => match completions_prompt(body, sink)? {
            Some(tokens) => Prompt::Tokens(tokens),
            None => text_prompt(sink),
        },
        Endpoint::ChatCompletions => {
            let messages = match body.get("messages") {
                None | Some(Json::Null) => return Err(RequestError::MissingField("messages")),
                Some(Json::Array(messages)) => messages,
                Some(_) => return Err(wrong_type("messages", "an array of messages")),
            };
            render_chat_into(sink, messages, body.get("tools"))?;
            text_prompt(sink)
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
///
/// # Errors
/// The field errors of [`parse_request_value`] for a malformed message or `tools`.
pub fn render_chat(messages: &[Value], tools: Option<&Value>) -> Result<String, RequestError> {
    let messages: Vec<Json<'_>> = messages.iter().map(Json::from_value).collect();
    let tools = tools.map(Json::from_value);
    let mut out = String::new();
    render_chat_into(&mut out, &messages, tools.as_ref())?;
    Ok(out)
}

/// [`render_chat`] written to `out` piece by piece.
fn render_chat_into<S: TextSink>(
    out: &mut S,
    messages: &[Json<'_>],
    tools: Option<&Json<'_>>,
) -> Result<(), RequestError> {
    // Sized for the messages' text up front: a long prompt is copied once, not once per
    // doubling of the buffer.
    out.reserve(rendered_text_bytes(messages));
    match tools {
        None | Some(Json::Null) => {}
        Some(tools @ Json::Array(_)) => {
            let json = canonical_json(tools, "tools")?;
            push_str_field(out, 'T', &json);
            out.push_str("\n");
        }
        Some(_) => return Err(wrong_type("tools", "an array of tool definitions")),
    }
    for message in messages {
        render_message(out, message)?;
    }
    Ok(())
}

/// The bytes of the messages' string fields (role, name, content and its text parts) plus a
/// little per field for tags and lengths: what [`render_chat`] writes for text-only messages.
fn rendered_text_bytes(messages: &[Json<'_>]) -> usize {
    const PER_FIELD: usize = 16;
    let text = |v: &Json<'_>| v.as_str().map_or(0, |s| s.len() + PER_FIELD);
    messages
        .iter()
        .filter(|m| matches!(m, Json::Object(_)))
        .map(|m| {
            let content = match m.get("content") {
                Some(Json::Array(parts)) => {
                    parts.iter().map(|p| p.get("text").map_or(0, text)).sum()
                }
                Some(c) => text(c),
                None => 0,
            };
            content + m.get("role").map_or(0, text) + m.get("name").map_or(0, text) + 1
        })
        .sum()
}

/// Appends the rendering of one chat message to `out`.
fn render_message<S: TextSink>(out: &mut S, message: &Json<'_>) -> Result<(), RequestError> {
    if !matches!(message, Json::Object(_)) {
        return Err(wrong_type("messages[]", "an object"));
    }

    let role = match message.get("role") {
        None | Some(Json::Null) => return Err(RequestError::MissingField("messages[].role")),
        Some(Json::String(role)) => role,
        Some(_) => return Err(wrong_type("messages[].role", "a string")),
    };
    push_field(out, 'r', role);

    if let Some(name) =
        optional_string(message, "name").map_err(|_| wrong_type("messages[].name", "a string"))?
    {
        push_field(out, 'n', name);
    }

    match message.get("content") {
        None | Some(Json::Null) => {}
        Some(Json::String(text)) => push_field(out, 'c', text),
        Some(Json::Array(parts)) => {
            push_count(out, 'l', parts.len());
            for part in parts {
                match text_part(part) {
                    Some(text) => push_field(out, 't', text),
                    None => push_str_field(out, 'p', &canonical_json(part, "messages[].content")?),
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
        None | Some(Json::Null) => {}
        Some(calls @ Json::Array(_)) => {
            push_str_field(out, 'f', &canonical_json(calls, "messages[].tool_calls")?)
        }
        Some(_) => return Err(wrong_type("messages[].tool_calls", "an array")),
    }

    if let Some(id) = optional_string(message, "tool_call_id")
        .map_err(|_| wrong_type("messages[].tool_call_id", "a string"))?
    {
        push_field(out, 'i', id);
    }

    out.push_str("\n");
    Ok(())
}

/// The text of a `{"type": "text", "text": "..."}` content part; `None` for any other part,
/// which is then rendered by its canonical JSON.
fn text_part<'j, 'a>(part: &'j Json<'a>) -> Option<&'j JsonStr<'a>> {
    if !part.get("type")?.as_str()?.is("text") {
        return None;
    }
    part.get("text")?.as_str()
}

/// A completions prompt: its text written to `out` (`None`), or its token ids.
fn completions_prompt<S: TextSink>(
    body: &Json<'_>,
    out: &mut S,
) -> Result<Option<Vec<u32>>, RequestError> {
    const EXPECTED: &str = "a string, an array of strings, an array of token ids (u32) \
                            or an array of token-id arrays";
    let items = match body.get("prompt") {
        None | Some(Json::Null) => return Err(RequestError::MissingField("prompt")),
        Some(Json::String(text)) => {
            push_text(out, text);
            return Ok(None);
        }
        Some(Json::Array(items)) => items,
        Some(_) => return Err(wrong_type("prompt", EXPECTED)),
    };
    match items.first() {
        None => Err(wrong_type("prompt", "a non-empty array")),
        Some(Json::String(first)) => {
            if items.len() == 1 {
                push_text(out, first);
                return Ok(None);
            }
            // Checked before anything is written, so a rejected prompt writes nothing.
            if items.iter().any(|item| !item.is_string()) {
                return Err(wrong_type("prompt", EXPECTED));
            }
            for text in items.iter().filter_map(Json::as_str) {
                push_len_prefixed(out, text);
            }
            Ok(None)
        }
        Some(Json::Number(_)) => Ok(Some(token_ids(items)?)),
        Some(Json::Array(first)) => {
            let routed = token_ids(first)?;
            for item in &items[1..] {
                let ids = item
                    .as_array()
                    .ok_or_else(|| wrong_type("prompt", EXPECTED))?;
                token_ids(ids)?;
            }
            Ok(Some(routed))
        }
        Some(_) => Err(wrong_type("prompt", EXPECTED)),
    }
}

fn token_ids(items: &[Json<'_>]) -> Result<Vec<u32>, RequestError> {
    items
        .iter()
        .map(|item| {
            item.as_u64()
                .and_then(|id| u32::try_from(id).ok())
                .ok_or_else(|| wrong_type("prompt", "token ids between 0 and 4294967295"))
        })
        .collect()
}

fn optional_string<'j, 'a>(
    object: &'j Json<'a>,
    field: &'static str,
) -> Result<Option<&'j JsonStr<'a>>, RequestError> {
    match object.get(field) {
        None | Some(Json::Null) => Ok(None),
        Some(Json::String(s)) => Ok(Some(s)),
        Some(_) => Err(wrong_type(field, "a string")),
    }
}

fn optional_u32(object: &Json<'_>, field: &'static str) -> Result<Option<u32>, RequestError> {
    match object.get(field) {
        None | Some(Json::Null) => Ok(None),
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

/// `{tag}{byte length}:{value}` of a string of the body, its text written where it lies.
fn push_field<S: TextSink>(out: &mut S, tag: char, value: &JsonStr<'_>) {
    push_count(out, tag, value.len());
    push_text(out, value);
}

/// `{tag}{byte length}:{value}`.
fn push_str_field<S: TextSink>(out: &mut S, tag: char, value: &str) {
    push_count(out, tag, value.len());
    out.push_str(value);
}

/// `{len}:{value}`.
fn push_len_prefixed<S: TextSink>(out: &mut S, value: &JsonStr<'_>) {
    push_decimal(out, value.len());
    push_text(out, value);
}

/// The text of a string of the body, in the pieces it lies in ([`JsonStr::for_each_piece`]).
fn push_text<S: TextSink>(out: &mut S, value: &JsonStr<'_>) {
    value.for_each_piece(|piece| out.push_str(piece));
}

/// `{tag}{count}:`.
fn push_count<S: TextSink>(out: &mut S, tag: char, count: usize) {
    let mut tag_bytes = [0u8; 4];
    out.push_str(tag.encode_utf8(&mut tag_bytes));
    push_decimal(out, count);
}

/// `{n}:` (`n` in decimal, as `format!("{n}:")` writes it) in one piece.
fn push_decimal<S: TextSink>(out: &mut S, n: usize) {
    // 20 digits hold u64::MAX, then the colon.
    let mut text = [b':'; 21];
    let mut start = text.len() - 1;
    let mut rest = n;
    loop {
        start -= 1;
        text[start] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    // Only ASCII digits and a colon were written.
    if let Ok(text) = std::str::from_utf8(&text[start..]) {
        out.push_str(text);
    }
}

/// Compact JSON with object keys sorted, independent of the map's iteration order.
/// `field` names the request field in the error for JSON nested deeper than
/// [`MAX_JSON_DEPTH`].
fn canonical_json(value: &Json<'_>, field: &'static str) -> Result<String, RequestError> {
    let mut out = String::new();
    if write_canonical(&mut out, value, 0) {
        Ok(out)
    } else {
        Err(wrong_type(field, "JSON nested at most 128 levels deep"))
    }
}

/// Returns `false` when `value` is nested deeper than [`MAX_JSON_DEPTH`].
fn write_canonical(out: &mut String, value: &Json<'_>, depth: usize) -> bool {
    if depth >= MAX_JSON_DEPTH {
        return false;
    }
    match value {
        Json::Null => out.push_str("null"),
        Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Json::Number(n) => {
            let _ = write!(out, "{n}");
        }
        Json::String(s) => write_json_string(out, &s.to_cow()),
        Json::Array(items) => {
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
        Json::Object(members) => {
            // As serde_json's map holds them: the last of duplicate keys, sorted.
            let mut entries: Vec<(std::borrow::Cow<'_, str>, &Json<'_>)> =
                members.iter().map(|(k, v)| (k.to_cow(), v)).collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            let mut kept = Vec::with_capacity(entries.len());
            let mut entries = entries.into_iter().peekable();
            while let Some(entry) = entries.next() {
                if entries.peek().is_none_or(|next| next.0 != entry.0) {
                    kept.push(entry);
                }
            }
            let entries = kept;
            out.push('{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_json_string(out, &key);
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn parse(path: &str, body: Value) -> Result<ParsedRequest, RequestError> {
        parse_request(path, body.to_string().as_bytes())
    }

    fn chat_text(body: Value) -> String {
        match parse(CHAT_COMPLETIONS_PATH, body).map(|r| r.prompt) {
            Ok(Prompt::Text(text)) => text,
            other => panic!("expected a text prompt, got {other:?}"),
        }
    }

    fn completion_prompt(prompt: Value) -> Result<Prompt, RequestError> {
        parse(COMPLETIONS_PATH, json!({"model": "m", "prompt": prompt})).map(|r| r.prompt)
    }

    #[test]
    fn completions_string_prompt_is_the_text_unchanged() {
        let request = parse(
            COMPLETIONS_PATH,
            json!({"model": "llama", "prompt": "Hello, world", "stream": true,
                   "max_tokens": 7, "cache_salt": "tenant-a"}),
        )
        .unwrap();
        assert_eq!(
            request,
            ParsedRequest {
                endpoint: Endpoint::Completions,
                model: "llama".into(),
                prompt: Prompt::Text("Hello, world".into()),
                cache_salt: Some("tenant-a".into()),
                stream: true,
                max_tokens: Some(7),
            }
        );
    }

    #[test]
    fn completions_defaults_are_no_stream_no_salt_no_max_tokens() {
        let request = parse(COMPLETIONS_PATH, json!({"model": "m", "prompt": "x"})).unwrap();
        assert!(!request.stream);
        assert_eq!(request.cache_salt, None);
        assert_eq!(request.max_tokens, None);
    }

    #[test]
    fn completions_single_string_list_equals_the_string() {
        assert_eq!(
            completion_prompt(json!(["abc"])),
            Ok(Prompt::Text("abc".into()))
        );
    }

    #[test]
    fn completions_string_list_is_joined_with_length_prefixes() {
        assert_eq!(
            completion_prompt(json!(["ab", "c"])),
            Ok(Prompt::Text("2:ab1:c".into()))
        );
        assert_eq!(
            completion_prompt(json!(["a", "bc"])),
            Ok(Prompt::Text("1:a2:bc".into()))
        );
    }

    #[test]
    fn completions_token_list_gives_token_prompt() {
        assert_eq!(
            completion_prompt(json!([1, 2, 4294967295u64])),
            Ok(Prompt::Tokens(vec![1, 2, u32::MAX]))
        );
    }

    #[test]
    fn completions_token_batch_routes_the_first_list() {
        assert_eq!(
            completion_prompt(json!([[5, 6], [7]])),
            Ok(Prompt::Tokens(vec![5, 6]))
        );
    }

    #[test]
    fn completions_rejects_bad_token_ids() {
        let expected = Err(wrong_type("prompt", "token ids between 0 and 4294967295"));
        assert_eq!(completion_prompt(json!([1, -2])), expected);
        assert_eq!(completion_prompt(json!([4294967296u64])), expected);
        assert_eq!(completion_prompt(json!([1.5])), expected);
        assert_eq!(completion_prompt(json!([[1], [2, -1]])), expected);
        assert_eq!(completion_prompt(json!([1e300])), expected);
    }

    #[test]
    fn completions_rejects_mixed_and_empty_prompt_lists() {
        assert!(matches!(
            completion_prompt(json!(["a", 1])),
            Err(RequestError::WrongType {
                field: "prompt",
                ..
            })
        ));
        assert!(matches!(
            completion_prompt(json!([[1], 2])),
            Err(RequestError::WrongType {
                field: "prompt",
                ..
            })
        ));
        assert!(matches!(
            completion_prompt(json!([{}])),
            Err(RequestError::WrongType {
                field: "prompt",
                ..
            })
        ));
        assert_eq!(
            completion_prompt(json!([])),
            Err(wrong_type("prompt", "a non-empty array"))
        );
        assert!(matches!(
            completion_prompt(json!(42)),
            Err(RequestError::WrongType {
                field: "prompt",
                ..
            })
        ));
    }

    #[test]
    fn chat_renders_roles_contents_and_parts() {
        let text = chat_text(json!({
            "model": "m",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "name": "ann", "content": [
                    {"type": "text", "text": "What is this?"},
                    {"type": "image_url", "image_url": {"url": "http://x/y.png"}}
                ]}
            ]
        }));
        assert_eq!(
            text,
            "r6:systemc9:Be brief.\n\
             r4:usern3:annl2:t13:What is this?\
             p57:{\"image_url\":{\"url\":\"http://x/y.png\"},\"type\":\"image_url\"}\n"
        );
    }

    #[test]
    fn chat_renders_tools_first_then_tool_calls_and_tool_results() {
        let text = chat_text(json!({
            "model": "m",
            "messages": [
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": null,
                 "tool_calls": [{"id": "c1", "type": "function",
                                 "function": {"name": "w", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"}
            ],
            "tools": [{"type": "function", "function": {"name": "w"}}]
        }));
        assert_eq!(
            text,
            "T45:[{\"function\":{\"name\":\"w\"},\"type\":\"function\"}]\n\
             r4:userc8:weather?\n\
             r9:assistant\
             f72:[{\"function\":{\"arguments\":\"{}\",\"name\":\"w\"},\"id\":\"c1\",\"type\":\"function\"}]\n\
             r4:toolc5:sunnyi2:c1\n"
        );
    }

    #[test]
    fn chat_rendering_covers_every_message_not_only_the_first() {
        let a = chat_text(json!({"model": "m", "messages": [
            {"role": "user", "content": "same"}, {"role": "assistant", "content": "one"}]}));
        let b = chat_text(json!({"model": "m", "messages": [
            {"role": "user", "content": "same"}, {"role": "assistant", "content": "two"}]}));
        assert_ne!(a, b);
    }

    #[test]
    fn chat_rendering_of_fewer_messages_is_a_prefix() {
        let messages = vec![
            json!({"role": "system", "content": "s"}),
            json!({"role": "user", "content": [{"type": "text", "text": "q"}]}),
            json!({"role": "assistant", "content": "a"}),
        ];
        let tools = json!([{"type": "function"}]);
        let full = render_chat(&messages, Some(&tools)).unwrap();
        for k in 0..messages.len() {
            let prefix = render_chat(&messages[..k], Some(&tools)).unwrap();
            assert!(full.starts_with(&prefix), "k={k}");
            assert!(prefix.len() < full.len());
        }
    }

    #[test]
    fn chat_string_content_differs_from_same_text_split_across_fields() {
        // Length prefixes keep field boundaries: content "ab" + name "c" differs from
        // content "a" + name "bc" and from a role that swallows part of the content.
        let a = render_chat(
            &[json!({"role": "user", "name": "c", "content": "ab"})],
            None,
        );
        let b = render_chat(
            &[json!({"role": "user", "name": "bc", "content": "a"})],
            None,
        );
        let c = render_chat(&[json!({"role": "userc", "content": "b"})], None);
        assert_ne!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn chat_absent_tools_and_null_tools_render_the_same() {
        let messages = [json!({"role": "user", "content": "x"})];
        assert_eq!(
            render_chat(&messages, None),
            render_chat(&messages, Some(&Value::Null))
        );
        assert_ne!(
            render_chat(&messages, None),
            render_chat(&messages, Some(&json!([])))
        );
    }

    #[test]
    fn chat_canonical_json_ignores_key_order() {
        let a: Value = serde_json::from_str(r#"[{"a":1,"b":[true,null,"\u0001"]}]"#).unwrap();
        let b: Value = serde_json::from_str(r#"[{"b":[true,null,"\u0001"],"a":1}]"#).unwrap();
        let messages = [json!({"role": "user", "content": "x"})];
        assert_eq!(
            render_chat(&messages, Some(&a)),
            render_chat(&messages, Some(&b))
        );
        assert_eq!(
            canonical_json(&Json::from_value(&a), "tools"),
            Ok(r#"[{"a":1,"b":[true,null,"\u0001"]}]"#.to_owned())
        );
    }

    #[test]
    fn max_completion_tokens_wins_over_max_tokens() {
        let request = parse(
            CHAT_COMPLETIONS_PATH,
            json!({"model": "m", "messages": [], "max_tokens": 10, "max_completion_tokens": 20}),
        )
        .unwrap();
        assert_eq!(request.max_tokens, Some(20));
        let request = parse(
            CHAT_COMPLETIONS_PATH,
            json!({"model": "m", "messages": [], "max_tokens": 10}),
        )
        .unwrap();
        assert_eq!(request.max_tokens, Some(10));
    }

    #[test]
    fn estimated_input_tokens_is_token_count_or_bytes_over_four_rounded_up() {
        let mut request =
            parse(COMPLETIONS_PATH, json!({"model": "m", "prompt": "12345"})).unwrap();
        assert_eq!(request.estimated_input_tokens(), 2);
        request.prompt = Prompt::Text("1234".into());
        assert_eq!(request.estimated_input_tokens(), 1);
        request.prompt = Prompt::Text(String::new());
        assert_eq!(request.estimated_input_tokens(), 0);
        request.prompt = Prompt::Tokens(vec![1, 2, 3]);
        assert_eq!(request.estimated_input_tokens(), 3);
    }

    #[test]
    fn unsupported_path_is_rejected() {
        for path in [
            "/v1/embeddings",
            "/v1/completions/",
            "/v1/completions?x=1",
            "/completions",
        ] {
            assert_eq!(
                parse_request(path, b"{}"),
                Err(RequestError::UnsupportedPath(path.into()))
            );
        }
    }

    #[test]
    fn invalid_json_is_rejected() {
        assert!(matches!(
            parse_request(COMPLETIONS_PATH, b"{\"model\": "),
            Err(RequestError::InvalidJson(_))
        ));
        assert!(matches!(
            parse_request(COMPLETIONS_PATH, &[0xff, 0xfe]),
            Err(RequestError::InvalidJson(_))
        ));
    }

    #[test]
    fn deeply_nested_body_is_rejected_as_invalid_json() {
        let body = format!(
            "{{\"model\":\"m\",\"prompt\":{}{}}}",
            "[".repeat(100_000),
            "]".repeat(100_000)
        );
        assert!(matches!(
            parse_request(COMPLETIONS_PATH, body.as_bytes()),
            Err(RequestError::InvalidJson(_))
        ));
    }

    #[test]
    fn hand_built_deep_json_in_tools_is_rejected() {
        let mut deep = json!(0);
        for _ in 0..200 {
            deep = json!([deep]);
        }
        let body = json!({"model": "m", "messages": [], "tools": deep});
        assert_eq!(
            parse_request_value(CHAT_COMPLETIONS_PATH, &body),
            Err(wrong_type("tools", "JSON nested at most 128 levels deep"))
        );
    }

    #[test]
    fn non_object_body_is_rejected() {
        for body in ["[]", "1", "\"s\"", "null"] {
            assert_eq!(
                parse_request(CHAT_COMPLETIONS_PATH, body.as_bytes()),
                Err(RequestError::NotAnObject)
            );
        }
    }

    #[test]
    fn missing_fields_are_rejected() {
        assert_eq!(
            parse(COMPLETIONS_PATH, json!({"prompt": "x"})),
            Err(RequestError::MissingField("model"))
        );
        assert_eq!(
            parse(COMPLETIONS_PATH, json!({"model": "m"})),
            Err(RequestError::MissingField("prompt"))
        );
        assert_eq!(
            parse(CHAT_COMPLETIONS_PATH, json!({"model": "m", "prompt": "x"})),
            Err(RequestError::MissingField("messages"))
        );
        assert_eq!(
            parse(
                CHAT_COMPLETIONS_PATH,
                json!({"model": "m", "messages": [{"content": "x"}]})
            ),
            Err(RequestError::MissingField("messages[].role"))
        );
    }

    #[test]
    fn wrong_types_are_rejected_with_the_field_name() {
        let cases = [
            (json!({"model": 1, "prompt": "x"}), "model"),
            (
                json!({"model": "m", "prompt": "x", "stream": "yes"}),
                "stream",
            ),
            (
                json!({"model": "m", "prompt": "x", "cache_salt": 3}),
                "cache_salt",
            ),
            (
                json!({"model": "m", "prompt": "x", "max_tokens": -1}),
                "max_tokens",
            ),
            (
                json!({"model": "m", "prompt": "x", "max_tokens": 1.5}),
                "max_tokens",
            ),
            (
                json!({"model": "m", "prompt": "x", "max_tokens": 1e20}),
                "max_tokens",
            ),
            (
                json!({"model": "m", "prompt": "x", "max_tokens": "9"}),
                "max_tokens",
            ),
            (
                json!({"model": "m", "prompt": "x", "max_completion_tokens": 4294967296u64}),
                "max_completion_tokens",
            ),
        ];
        for (body, field) in cases {
            assert!(
                matches!(parse(COMPLETIONS_PATH, body.clone()),
                         Err(RequestError::WrongType { field: f, .. }) if f == field),
                "{body}"
            );
        }
        let chat_cases = [
            (json!({"model": "m", "messages": {}}), "messages"),
            (json!({"model": "m", "messages": [1]}), "messages[]"),
            (
                json!({"model": "m", "messages": [{"role": 1}]}),
                "messages[].role",
            ),
            (
                json!({"model": "m", "messages": [{"role": "u", "content": 1}]}),
                "messages[].content",
            ),
            (
                json!({"model": "m", "messages": [{"role": "u", "name": []}]}),
                "messages[].name",
            ),
            (
                json!({"model": "m", "messages": [{"role": "u", "tool_calls": "x"}]}),
                "messages[].tool_calls",
            ),
            (
                json!({"model": "m", "messages": [{"role": "u", "tool_call_id": 5}]}),
                "messages[].tool_call_id",
            ),
            (json!({"model": "m", "messages": [], "tools": {}}), "tools"),
        ];
        for (body, field) in chat_cases {
            assert!(
                matches!(parse(CHAT_COMPLETIONS_PATH, body.clone()),
                         Err(RequestError::WrongType { field: f, .. }) if f == field),
                "{body}"
            );
        }
    }

    /// Any JSON value, a few levels deep.
    fn arbitrary_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            ".{0,8}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map(
                    prop_oneof![
                        Just("role".to_owned()),
                        Just("content".to_owned()),
                        Just("type".to_owned()),
                        Just("text".to_owned()),
                        Just("name".to_owned()),
                        Just("tool_calls".to_owned()),
                        Just("tool_call_id".to_owned()),
                        ".{0,4}"
                    ],
                    inner,
                    0..6
                )
                .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// A body with the known fields, each either absent or an arbitrary value.
    fn arbitrary_body() -> impl Strategy<Value = Value> {
        let fields = [
            "model",
            "prompt",
            "messages",
            "tools",
            "stream",
            "cache_salt",
            "max_tokens",
            "max_completion_tokens",
        ];
        prop::collection::vec(prop::option::of(arbitrary_json()), fields.len()).prop_map(
            move |values| {
                let mut body = serde_json::Map::new();
                for (field, value) in fields.iter().zip(values) {
                    if let Some(value) = value {
                        body.insert((*field).to_owned(), value);
                    }
                }
                Value::Object(body)
            },
        )
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(body in prop::collection::vec(any::<u8>(), 0..512)) {
            let _ = parse_request(COMPLETIONS_PATH, &body);
            let _ = parse_request(CHAT_COMPLETIONS_PATH, &body);
        }

        /// A raw body, read by `crate::json`, parses exactly as serde_json's `Value` of it
        /// does: the same request or the same error (invalid JSON included, word for word).
        #[test]
        fn raw_bodies_parse_as_their_serde_json_value(
            body in arbitrary_body(),
            pretty in any::<bool>(),
            cut in any::<prop::sample::Index>(),
        ) {
            let bytes = if pretty {
                serde_json::to_vec_pretty(&body).unwrap()
            } else {
                serde_json::to_vec(&body).unwrap()
            };
            // Whole, and cut short (invalid JSON).
            let short = &bytes[..cut.index(bytes.len())];
            for bytes in [&bytes[..], short] {
                for path in [COMPLETIONS_PATH, CHAT_COMPLETIONS_PATH] {
                    let through_value = serde_json::from_slice::<Value>(bytes)
                        .map_err(|e| RequestError::InvalidJson(e.to_string()))
                        .and_then(|v| parse_request_value(path, &v));
                    prop_assert_eq!(parse_request(path, bytes), through_value);
                }
            }
        }

        #[test]
        fn random_json_bodies_never_panic(body in arbitrary_body()) {
            let bytes = body.to_string();
            for path in [COMPLETIONS_PATH, CHAT_COMPLETIONS_PATH] {
                let from_bytes = parse_request(path, bytes.as_bytes());
                // Float rendering may not round-trip bit-exactly; only compare on success.
                if let (Ok(a), Ok(b)) = (&from_bytes, &parse_request_value(path, &body)) {
                    prop_assert_eq!(a.endpoint, b.endpoint);
                }
            }
        }
    }
}
