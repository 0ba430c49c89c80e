//! Watching an OpenAI SSE stream as it passes: first content chunk (TTFT), the final usage
//! chunk (completion and cached tokens), and removal of that usage chunk when the gateway
//! asked for it and the client did not.
//!
//! A content chunk is one that carries a generated token, even one whose text is empty (a
//! special token, or a piece of a multi-byte character: vLLM streams those as `"text":""` /
//! `"content":""`): a completions choice with a `text` field; a chat delta with `content`,
//! `reasoning`/`reasoning_content` or `tool_calls` — except a chat delta that holds `role` and
//! nothing but an empty `content`, which is the opening chunk sent before any token, and an
//! empty delta (`{}`, the finish chunk).
//!
//! Frames are split into complete events: an event ends at a blank line, and lines end in CRLF,
//! LF or CR (the SSE spec, HTML §9.2.5), so `\n\n`, `\r\n\r\n`, `\r\r` and any mix end one.
//! Complete events are forwarded at once (the common case — one event per frame — is zero-copy
//! and allocation-free), an incomplete tail waits for the next frame. A blank line whose CR is
//! the last byte of a frame completes its event at once; an LF opening the next frame is the
//! rest of that CRLF (forwarded, or dropped with a stripped event), not another blank line. Bound: the tail is at most [`MAX_EVENT_BYTES`]; a longer event is passed through
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
    role: Option<IgnoredAny>,
    #[serde(default)]
    content: Option<String>,
    /// vLLM's current name for the reasoning text; `reasoning_content` the older one.
    #[serde(default)]
    reasoning: Option<String>,
    #[serde(default)]
    reasoning_content: Option<String>,
    #[serde(default)]
    tool_calls: Option<IgnoredAny>,
}

impl ChoiceView {
    /// Whether this choice carries a generated token (see the module doc).
    fn has_token(&self) -> bool {
        self.text.is_some() || self.delta.as_ref().is_some_and(DeltaView::has_token)
    }
}

impl DeltaView {
    fn has_token(&self) -> bool {
        let content = match self.content.as_deref() {
            Some(t) => !t.is_empty() || self.role.is_none(),
            None => false,
        };
        content
            || self.reasoning.is_some()
            || self.reasoning_content.is_some()
            || self.tool_calls.is_some()
    }
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
    /// The last event ended in a CR at the very end of a frame: an LF opening the next frame
    /// belongs to it.
    lf_may_follow: bool,
    /// That event was dropped (its LF goes too).
    last_dropped: bool,
}

/// Where the first event of `buf` (which starts at the beginning of a line) ends: just past the
/// line ending of its blank line. None while no blank line is complete. A line ending in a CR
/// that is the last byte of `buf` is complete only when it is the blank line (its LF, if one
/// follows, is then the caller's business): otherwise the next byte may be its LF.
fn event_end(buf: &[u8]) -> Option<usize> {
    let mut line_start = 0;
    loop {
        match buf.get(line_start) {
            Some(b'\n') => return Some(line_start + 1),
            Some(b'\r') => {
                let crlf = buf.get(line_start + 1) == Some(&b'\n');
                return Some(line_start + 1 + usize::from(crlf));
            }
            Some(_) => {}
            None => return None,
        }
        let rest = buf.get(line_start..)?;
        let at = line_start + memchr::memchr2(b'\r', b'\n', rest)?;
        line_start = match (buf.get(at), buf.get(at + 1)) {
            (Some(b'\r'), Some(b'\n')) => at + 2,
            // A CR at the end: it may be the first half of a CRLF, and then the next line
            // starts after the LF; wait for the next frame.
            (Some(b'\r'), None) => return None,
            _ => at + 1,
        };
    }
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
        if self.passthrough || data.is_empty() {
            return Fed {
                out: data,
                ..Fed::default()
            };
        }
        // The LF completing the CRLF of the previous frame's last event.
        let lead = usize::from(std::mem::take(&mut self.lf_may_follow) && data[0] == b'\n');
        let drop_lead = lead == 1 && self.last_dropped;
        if self.carry.is_empty() {
            let (mut fed, end, kept) = self.scan(&data, lead, drop_lead);
            if end < data.len() {
                self.carry.extend_from_slice(&data[end..]);
            }
            fed.out = match kept {
                Some(k) => k.freeze(),
                None => data.slice(..end),
            };
            return self.bound_carry(fed);
        }
        let mut carry = std::mem::take(&mut self.carry);
        carry.extend_from_slice(&data);
        let (mut fed, end, kept) = self.scan(&carry, 0, false);
        let complete = carry.split_to(end).freeze();
        self.carry = carry;
        fed.out = match kept {
            Some(k) => k.freeze(),
            None => complete,
        };
        self.bound_carry(fed)
    }

    /// The stream ended: whatever incomplete tail is left, forwarded as is.
    pub fn finish(&mut self) -> Bytes {
        self.carry.split().freeze()
    }

    /// An incomplete event longer than [`MAX_EVENT_BYTES`]: forwarded with `fed`, and from now
    /// on everything passes through uninspected.
    fn bound_carry(&mut self, mut fed: Fed) -> Fed {
        if self.carry.len() > MAX_EVENT_BYTES {
            self.passthrough = true;
            let tail = self.carry.split();
            fed.out = if fed.out.is_empty() {
                tail.freeze()
            } else {
                let mut all = BytesMut::with_capacity(fed.out.len() + tail.len());
                all.extend_from_slice(&fed.out);
                all.extend_from_slice(&tail);
                all.freeze()
            };
        }
        fed
    }

    /// Inspects the complete events of `buf` after its first `lead` bytes (the end of the
    /// previous event's line ending, dropped when `drop_lead`). Returns what was seen, where the
    /// complete events end, and — only when something is dropped — the bytes to forward.
    fn scan(&mut self, buf: &[u8], lead: usize, drop_lead: bool) -> (Fed, usize, Option<BytesMut>) {
        let mut fed = Fed::default();
        let mut kept: Option<BytesMut> = drop_lead.then(|| BytesMut::with_capacity(buf.len()));
        let mut start = lead;
        while let Some(len) = buf.get(start..).and_then(event_end) {
            let end = start + len;
            let event = &buf[start..end];
            let keep = self.inspect(event, &mut fed);
            match (&mut kept, keep) {
                (None, false) => {
                    let mut k = BytesMut::with_capacity(buf.len());
                    k.extend_from_slice(&buf[..start]);
                    kept = Some(k);
                }
                (Some(k), true) => k.extend_from_slice(event),
                _ => {}
            }
            if end == buf.len() && buf[end - 1] == b'\r' {
                self.lf_may_follow = true;
                self.last_dropped = !keep;
            }
            start = end;
        }
        (fed, start, kept)
    }

    /// Looks at one event; false when it must be dropped.
    fn inspect(&mut self, event: &[u8], fed: &mut Fed) -> bool {
        let mut keep = true;
        for line in event.split(|&b| b == b'\n' || b == b'\r') {
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
            if choices.iter().any(ChoiceView::has_token) {
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

    /// Whether `data` (one chunk's JSON) alone is a first content event.
    fn is_token(data: &str) -> bool {
        SseScanner::new(false)
            .feed(b(&format!("data: {data}\n\n")))
            .first_content
    }

    #[test]
    fn a_token_whose_text_is_empty_is_still_a_token() {
        // vLLM streams a special token (skip_special_tokens) or half a multi-byte character as
        // an empty text: the token was generated, so that is the first token's time.
        assert!(is_token(r#"{"choices":[{"index":0,"text":""}]}"#));
        assert!(is_token(
            r#"{"choices":[{"index":0,"text":"","finish_reason":"stop"}]}"#
        ));
        assert!(is_token(
            r#"{"choices":[{"index":0,"delta":{"content":""}}]}"#
        ));
        assert!(is_token(
            r#"{"choices":[{"index":0,"delta":{"reasoning":""}}]}"#
        ));
        assert!(is_token(
            r#"{"choices":[{"index":0,"delta":{"reasoning_content":"so"}}]}"#
        ));
        assert!(is_token(
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":"Hi"}}]}"#
        ));
        // Not tokens: the chat opening chunk (role, empty content) sent before prefill, the
        // empty finish delta, a null text or content, usage, no choices.
        assert!(!is_token(
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#
        ));
        assert!(!is_token(
            r#"{"choices":[{"index":0,"delta":{"role":"assistant"}}]}"#
        ));
        assert!(!is_token(
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#
        ));
        assert!(!is_token(r#"{"choices":[{"index":0,"text":null}]}"#));
        assert!(!is_token(
            r#"{"choices":[{"index":0,"delta":{"content":null}}]}"#
        ));
        assert!(!is_token(r#"{"choices":[],"usage":{"prompt_tokens":1}}"#));
        assert!(!is_token(r#"{"id":"x"}"#));
    }

    #[test]
    fn empty_text_tokens_after_the_first_are_counted() {
        let mut s = SseScanner::new(false);
        assert!(s.feed(b(TOK)).first_content);
        let empty = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\"}}]}\n\n";
        assert_eq!(s.feed(b(empty)).more_content_events, 1);
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

    /// `event` (LF line endings) with each line ending replaced by `eol`.
    fn with_eol(event: &str, eol: &str) -> String {
        event.replace('\n', eol)
    }

    #[test]
    fn crlf_and_cr_events_are_forwarded_as_soon_as_complete() {
        for eol in ["\r\n", "\r"] {
            let (role, tok) = (with_eol(ROLE, eol), with_eol(TOK, eol));
            let mut s = SseScanner::new(false);
            let f = s.feed(b(&role));
            assert_eq!(f.out, b(&role), "{eol:?}");
            assert!(!f.first_content);
            let f = s.feed(b(&tok));
            assert_eq!(f.out, b(&tok), "{eol:?}");
            assert!(f.first_content, "{eol:?}");
            assert_eq!(s.feed(b(&tok)).more_content_events, 1);
            assert!(s.finish().is_empty());
        }
    }

    #[test]
    fn crlf_usage_is_read_and_stripped() {
        let all = with_eol(&format!("{TOK}{USAGE}{DONE}"), "\r\n");
        let mut s = SseScanner::new(true);
        let f = s.feed(b(&all));
        assert_eq!(f.out, b(&with_eol(&format!("{TOK}{DONE}"), "\r\n")));
        assert!(f.first_content);
        assert_eq!(s.usage().map(|u| u.cached_tokens), Some(Some(8)));
    }

    #[test]
    fn a_frame_ending_between_cr_and_lf_completes_the_event_and_the_lf_stays_with_it() {
        let tok = with_eol(TOK, "\r\n");
        let (head, lf) = tok.split_at(tok.len() - 1);
        let mut s = SseScanner::new(true);
        let f = s.feed(b(head));
        assert!(f.first_content, "complete at the blank line's CR");
        assert_eq!(f.out, b(head));
        // The LF is the rest of that CRLF, not a blank line of its own: forwarded.
        let f = s.feed(b(lf));
        assert_eq!(f.out, b(lf));
        // A stripped usage event takes its LF with it.
        let usage = with_eol(USAGE, "\r\n");
        let (head, lf) = usage.split_at(usage.len() - 1);
        assert_eq!(s.feed(b(head)).out, Bytes::new());
        let done = with_eol(DONE, "\r\n");
        let f = s.feed(b(&format!("{lf}{done}")));
        assert_eq!(f.out, b(&done));
        assert_eq!(s.usage().map(|u| u.prompt_tokens), Some(10));
        // And a line's CR at the end of a frame waits: its LF may follow.
        let mut s = SseScanner::new(false);
        assert_eq!(s.feed(b("data: {\"choices\":[]}\r")).out, Bytes::new());
        assert_eq!(s.feed(b("\n")).out, Bytes::new());
        assert_eq!(s.feed(b("\r\n")).out, b("data: {\"choices\":[]}\r\n\r\n"));
    }

    /// Line endings of a generated stream.
    #[derive(Debug, Clone, Copy)]
    enum Eol {
        Lf,
        CrLf,
        Cr,
        /// Each line's own, at random (`pick` chooses).
        Mixed,
    }

    /// The events of a generated stream (each a list of lines) and, per event, whether it is
    /// the usage chunk and whether it carries content.
    fn stream_lines(kinds: &[u8]) -> Vec<(Vec<&'static str>, bool, bool)> {
        kinds
            .iter()
            .map(|k| match k % 6 {
                0 => (vec![ROLE.trim_end()], false, false),
                1 => (vec![TOK.trim_end()], false, true),
                2 => (vec![USAGE.trim_end()], true, false),
                3 => (vec![": keep-alive"], false, false),
                4 => (vec!["event: message", "id: 7", TOK.trim_end()], false, true),
                _ => (vec![DONE.trim_end()], false, false),
            })
            .collect()
    }

    /// The stream's bytes, and its expected output with the usage event stripped.
    fn render(events: &[(Vec<&str>, bool, bool)], eol: Eol, pick: &[u8]) -> (Vec<u8>, Vec<u8>) {
        let (mut all, mut stripped) = (Vec::new(), Vec::new());
        let mut n = 0;
        let mut next_eol = |after_cr: bool, blank: bool| {
            match eol {
                Eol::Lf => "\n",
                Eol::CrLf => "\r\n",
                Eol::Cr => "\r",
                Eol::Mixed => {
                    n += 1;
                    match pick.get(n % pick.len().max(1)).copied().unwrap_or(0) % 3 {
                        // After a CR a blank line's lone LF would make a CRLF, not a blank line.
                        0 if !(after_cr && blank) => "\n",
                        0 | 1 => "\r\n",
                        _ => "\r",
                    }
                }
            }
        };
        for (lines, usage, _) in events {
            let mut event = String::new();
            let mut after_cr = false;
            for line in lines {
                event.push_str(line);
                let e = next_eol(after_cr, false);
                event.push_str(e);
                after_cr = e == "\r";
            }
            event.push_str(next_eol(after_cr, true));
            all.extend_from_slice(event.as_bytes());
            if !usage {
                stripped.extend_from_slice(event.as_bytes());
            }
        }
        (all, stripped)
    }

    /// Feeds `input` cut at `cuts`; returns the output, usage, whether content was seen and how
    /// many content events were counted.
    fn run(input: &[u8], cuts: &[usize], strip: bool) -> (Vec<u8>, Option<Usage>, bool, u64) {
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (input.len() + 1)).collect();
        cuts.sort_unstable();
        let mut s = SseScanner::new(strip);
        let (mut out, mut first, mut content) = (Vec::new(), false, 0);
        let mut at = 0;
        for cut in cuts.into_iter().chain([input.len()]) {
            let f = s.feed(Bytes::copy_from_slice(&input[at..cut]));
            at = cut;
            out.extend_from_slice(&f.out);
            first |= f.first_content;
            content += u64::from(f.first_content) + f.more_content_events;
        }
        out.extend_from_slice(&s.finish());
        (out, s.usage(), first, content)
    }

    fn eol_strategy() -> impl Strategy<Value = Eol> {
        prop_oneof![
            Just(Eol::Lf),
            Just(Eol::CrLf),
            Just(Eol::Cr),
            Just(Eol::Mixed)
        ]
    }

    proptest! {
        /// Whatever the line endings and wherever the frames are cut (between a CR and its LF
        /// included), the client sees the same bytes, the same usage and the same content
        /// events as with the whole stream in one frame, and every event is out as soon as its
        /// blank line is in.
        #[test]
        fn chunking_never_changes_what_is_seen_for_every_line_ending(
            kinds in proptest::collection::vec(any::<u8>(), 1..12),
            eol in eol_strategy(),
            pick in proptest::collection::vec(any::<u8>(), 1..32),
            cuts in proptest::collection::vec(any::<usize>(), 0..24),
            strip in any::<bool>(),
        ) {
            let events = stream_lines(&kinds);
            let (input, stripped) = render(&events, eol, &pick);
            let whole = run(&input, &[], strip);
            let chunked = run(&input, &cuts, strip);
            prop_assert_eq!(&chunked, &whole);
            let expected = if strip { &stripped } else { &input };
            prop_assert_eq!(&whole.0, expected);
            prop_assert_eq!(whole.1.is_some(), events.iter().any(|e| e.1));
            prop_assert_eq!(whole.2, events.iter().any(|e| e.2));
            // Frames cut at every byte: each event leaves as soon as it is complete.
            let every: Vec<usize> = (1..input.len()).collect();
            prop_assert_eq!(run(&input, &every, strip), whole);
        }
    }

    #[test]
    fn each_event_leaves_with_the_frame_that_completes_it_for_every_line_ending() {
        for eol in [Eol::Lf, Eol::CrLf, Eol::Cr, Eol::Mixed] {
            let events = stream_lines(&[0, 1, 4, 3, 1, 5]);
            let mut s = SseScanner::new(false);
            for (i, e) in events.iter().enumerate() {
                let (one, _) = render(std::slice::from_ref(e), eol, &[i as u8, 7, 2]);
                // An event ending in CR may still get an LF; it is out all the same.
                assert_eq!(
                    s.feed(Bytes::from(one.clone())).out,
                    Bytes::from(one),
                    "{eol:?} {i}"
                );
            }
        }
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
