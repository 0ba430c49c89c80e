//! Watching an OpenAI SSE stream as it passes: first content chunk (TTFT), the final usage
//! chunk (completion and cached tokens), and removal of that usage chunk when the gateway
//! asked for it and the client did not.
//!
//! Frames are split into complete events (`\n\n`); complete events are forwarded at once (the
//! common case — one event per frame — is zero-copy), an incomplete tail waits for the next
//! frame. Bound: the tail is at most [`MAX_EVENT_BYTES`]; a longer event is passed through
//! uninspected and inspection stops for that stream. Events are JSON-parsed only until the
//! first content chunk, and afterwards only when they mention `"usage"`.

use bytes::{Bytes, BytesMut};
use memchr::memmem;
use serde::Deserialize;
use serde::de::IgnoredAny;

/// Longest SSE event inspected.
pub const MAX_EVENT_BYTES: usize = 1 << 20;

/// Token counts from a `usage` object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// `prompt_tokens_details.cached_tokens` when the pod reports it.
    pub cached_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct ChunkView {
    #[serde(default)]
    choices: Option<Vec<ChoiceView>>,
    #[serde(default)]
    usage: Option<UsageView>,
}

#[derive(Deserialize)]
struct ChoiceView {
    #[serde(default)]
    delta: Option<DeltaView>,
    #[serde(default)]
    text: Option<String>,
}

#[derive(Deserialize)]
struct DeltaView {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    reasoning_content: Option<String>,
    #[serde(default)]
    tool_calls: Option<IgnoredAny>,
}

#[derive(Deserialize)]
struct UsageView {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
    #[serde(default)]
    prompt_tokens_details: Option<DetailsView>,
}

#[derive(Deserialize)]
struct DetailsView {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

impl From<UsageView> for Usage {
    fn from(u: UsageView) -> Self {
        Usage {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
            cached_tokens: u.prompt_tokens_details.and_then(|d| d.cached_tokens),
        }
    }
}

/// Reads `usage` from a whole non-stream response body.
pub fn usage_of_response(body: &[u8]) -> Option<Usage> {
    serde_json::from_slice::<ChunkView>(body)
        .ok()?
        .usage
        .map(Usage::from)
}

/// What one fed frame contained.
#[derive(Debug, Default, PartialEq)]
pub struct Fed {
    /// Bytes to forward to the client now (may be empty).
    pub out: Bytes,
    /// This frame completed the first event with content.
    pub first_content: bool,
    /// Content events after the first (≈ tokens generated).
    pub more_content_events: u64,
}

#[derive(Debug, Default)]
pub struct SseScanner {
    carry: BytesMut,
    strip_usage: bool,
    /// Set when an event was too long to inspect: everything passes through untouched.
    passthrough: bool,
    first_content_seen: bool,
    usage: Option<Usage>,
}

impl SseScanner {
    /// `strip_usage`: drop the usage-only chunk (the gateway added `include_usage`).
    pub fn new(strip_usage: bool) -> Self {
        SseScanner {
            strip_usage,
            ..SseScanner::default()
        }
    }

    pub fn usage(&self) -> Option<Usage> {
        self.usage
    }

    pub fn feed(&mut self, data: Bytes) -> Fed {
        if self.passthrough {
            return Fed {
                out: data,
                ..Fed::default()
            };
        }
        let complete = if self.carry.is_empty() {
            match memmem::rfind(&data, b"\n\n") {
                Some(pos) if pos + 2 == data.len() => data,
                Some(pos) => {
                    self.carry.extend_from_slice(&data[pos + 2..]);
                    data.slice(..pos + 2)
                }
                None => {
                    self.carry.extend_from_slice(&data);
                    return self.check_carry_bound();
                }
            }
        } else {
            self.carry.extend_from_slice(&data);
            match memmem::rfind(&self.carry, b"\n\n") {
                Some(pos) => self.carry.split_to(pos + 2).freeze(),
                None => return self.check_carry_bound(),
            }
        };
        self.process(complete)
    }

    /// The stream ended: whatever incomplete tail is left, forwarded as is.
    pub fn finish(&mut self) -> Bytes {
        self.carry.split().freeze()
    }

    fn check_carry_bound(&mut self) -> Fed {
        if self.carry.len() > MAX_EVENT_BYTES {
            self.passthrough = true;
            return Fed {
                out: self.carry.split().freeze(),
                ..Fed::default()
            };
        }
        Fed::default()
    }

    fn process(&mut self, complete: Bytes) -> Fed {
        let mut fed = Fed::default();
        let mut kept: Option<BytesMut> = None;
        let mut start = 0;
        for end in memmem::find_iter(&complete, b"\n\n") {
            if end < start {
                continue; // overlapping match inside "\n\n\n"
            }
            let event = &complete[start..end + 2];
            let keep = self.inspect(event, &mut fed);
            match (&mut kept, keep) {
                (None, false) => {
                    let mut k = BytesMut::with_capacity(complete.len());
                    k.extend_from_slice(&complete[..start]);
                    kept = Some(k);
                }
                (Some(k), true) => k.extend_from_slice(event),
                _ => {}
            }
            start = end + 2;
        }
        fed.out = match kept {
            Some(mut k) => {
                k.extend_from_slice(&complete[start.min(complete.len())..]);
                k.freeze()
            }
            None => complete,
        };
        fed
    }

    /// Looks at one event; false when it must be dropped.
    fn inspect(&mut self, event: &[u8], fed: &mut Fed) -> bool {
        let mut keep = true;
        for line in event.split(|&b| b == b'\n') {
            let Some(payload) = line.strip_prefix(b"data:") else {
                continue;
            };
            let payload = payload.trim_ascii();
            if payload == b"[DONE]" || payload.is_empty() {
                continue;
            }
            let mentions_usage = memmem::find(payload, b"\"usage\"").is_some();
            if self.first_content_seen && !mentions_usage {
                fed.more_content_events += 1;
                continue;
            }
            let Ok(chunk) = serde_json::from_slice::<ChunkView>(payload) else {
                continue;
            };
            let choices = chunk.choices.unwrap_or_default();
            if let Some(u) = chunk.usage
                && choices.is_empty()
            {
                self.usage = Some(u.into());
                if self.strip_usage {
                    keep = false;
                }
                continue;
            }
            let has_content = choices.iter().any(|c| {
                c.text.as_deref().is_some_and(|t| !t.is_empty())
                    || c.delta.as_ref().is_some_and(|d| {
                        d.content.as_deref().is_some_and(|t| !t.is_empty())
                            || d.reasoning_content
                                .as_deref()
                                .is_some_and(|t| !t.is_empty())
                            || d.tool_calls.is_some()
                    })
            });
            if has_content {
                if self.first_content_seen {
                    fed.more_content_events += 1;
                } else {
                    self.first_content_seen = true;
                    fed.first_content = true;
                }
            }
        }
        keep
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const ROLE: &str = "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n";
    const TOK: &str = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n";
    const USAGE: &str = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":3,\"total_tokens\":13,\"prompt_tokens_details\":{\"cached_tokens\":8}}}\n\n";
    const DONE: &str = "data: [DONE]\n\n";

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    #[test]
    fn role_chunk_is_not_content_and_first_token_chunk_is() {
        let mut s = SseScanner::new(false);
        let f = s.feed(b(ROLE));
        assert!(!f.first_content);
        assert_eq!(f.out, b(ROLE));
        let f = s.feed(b(TOK));
        assert!(f.first_content);
        let f = s.feed(b(TOK));
        assert!(!f.first_content);
        assert_eq!(f.more_content_events, 1);
    }

    #[test]
    fn usage_chunk_is_read_and_stripped_only_when_asked() {
        let mut s = SseScanner::new(true);
        let all = format!("{TOK}{USAGE}{DONE}");
        let f = s.feed(b(&all));
        assert_eq!(f.out, b(&format!("{TOK}{DONE}")));
        assert_eq!(
            s.usage(),
            Some(Usage {
                prompt_tokens: 10,
                completion_tokens: 3,
                cached_tokens: Some(8)
            })
        );
        let mut s = SseScanner::new(false);
        assert_eq!(s.feed(b(&all)).out, b(&all));
        assert_eq!(s.usage().map(|u| u.completion_tokens), Some(3));
    }

    #[test]
    fn events_split_across_frames_are_held_until_complete() {
        let mut s = SseScanner::new(true);
        let (a, rest) = USAGE.split_at(20);
        assert_eq!(s.feed(b(a)).out, Bytes::new());
        let f = s.feed(b(&format!("{rest}{DONE}")));
        assert_eq!(f.out, b(DONE));
        assert_eq!(s.usage().map(|u| u.prompt_tokens), Some(10));
        assert!(s.finish().is_empty());
    }

    #[test]
    fn completions_text_chunks_count_as_content() {
        let mut s = SseScanner::new(false);
        let f = s.feed(b("data: {\"choices\":[{\"index\":0,\"text\":\"x\"}]}\n\n"));
        assert!(f.first_content);
    }

    #[test]
    fn non_stream_usage_is_read() {
        let body = br#"{"id":"x","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":5,"completion_tokens":2}}"#;
        assert_eq!(
            usage_of_response(body).map(|u| u.completion_tokens),
            Some(2)
        );
        assert_eq!(usage_of_response(b"not json"), None);
    }

    proptest! {
        #[test]
        fn scanner_never_panics_and_forwards_every_non_usage_byte(
            chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 0..16)
        ) {
            let mut s = SseScanner::new(false);
            let mut out = Vec::new();
            let mut input = Vec::new();
            for c in chunks {
                input.extend_from_slice(&c);
                out.extend_from_slice(&s.feed(Bytes::from(c)).out);
            }
            out.extend_from_slice(&s.finish());
            prop_assert_eq!(out, input);
        }
    }
}
