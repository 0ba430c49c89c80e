//! Prompt → chained block hashes (xxh3-64, stable across processes and machines).
//!
//! DESIGN.md §4. A prompt is cut into fixed-size blocks and each block gets a hash that covers
//! its own content and, through the previous block's hash, everything before it:
//!
//! - **Chain seed** = `xxh3_64(model)`; with a `cache_salt` it becomes
//!   `xxh3_64_with_seed(salt, xxh3_64(model))`, so two tenants with different salts (and a
//!   request with no salt vs. one with `""`) never share a block, as in vLLM.
//! - **Text prompts** (approximate mode, no tokenizer): blocks of
//!   `block_size_tokens × chars_per_token` *bytes* of the UTF-8 text (default 16 × 4 = 64 bytes;
//!   llm-d's approximation of 4 characters per token, counted in bytes so that cutting is O(1)
//!   and never depends on Unicode segmentation; a block may split a multi-byte character,
//!   which is harmless for hashing).
//! - **Token prompts**: blocks of `block_size_tokens` token ids (default 16, vLLM's CUDA block
//!   size), each id serialised as 4 little-endian bytes.
//! - Only **full blocks** are hashed: vLLM caches only full blocks, so a trailing partial block
//!   can never be a cache hit.
//! - `hash_i = xxh3_64_with_seed(block_i bytes, hash_{i-1})`, `hash_{-1}` = chain seed, so an
//!   equal hash at position i means (up to 64-bit collisions) an equal model, salt and prefix up
//!   to and including block i.
//!
//! xxh3 is specified and unseeded by the process, so hashes are equal across processes,
//! machines and releases. A block size of 0 (rejected by the config) yields no blocks.
//! Hashing allocates nothing beyond growing `out`: text blocks are hashed straight from the
//! string, token blocks through a stack buffer.

use xxhash_rust::xxh3::{Xxh3, xxh3_64, xxh3_64_with_seed};

use crate::json::{Json, JsonStr};
use crate::request::{ParsedRequest, Prompt, RequestError, TextSink, parse_value_into};
use serde_json::Value;

/// One chained block hash.
pub type BlockHash = u64;

/// Default tokens per block (vLLM's CUDA default).
pub const DEFAULT_BLOCK_SIZE_TOKENS: u32 = 16;
use crate::request::DEFAULT_CHARS_PER_TOKEN;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockHasher {
    pub block_size_tokens: u32,
    pub chars_per_token: u32,
}

impl Default for BlockHasher {
    fn default() -> Self {
        BlockHasher {
            block_size_tokens: DEFAULT_BLOCK_SIZE_TOKENS,
            chars_per_token: DEFAULT_CHARS_PER_TOKEN,
        }
    }
}

/// A prompt's chained block hashes at one block size. Pods of one fleet may cache in blocks of
/// different sizes (vLLM on CPU defaults to 128 tokens, on GPU to 16); a block chain at one size
/// never matches a chain at another, so a prompt is hashed once per block size in use and each
/// pod is scored against the chain of its own size ([`crate::router::PromptCut`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SizedBlocks {
    pub block_size_tokens: u32,
    pub blocks: Vec<BlockHash>,
}

/// Size of the stack buffer token blocks are serialised into: 256 tokens of 4 bytes. Larger
/// blocks are fed to a streaming hasher through it, which gives the same hash.
const TOKEN_BUFFER_BYTES: usize = 1024;

impl BlockHasher {
    /// Bytes per block of a text prompt (`block_size_tokens × chars_per_token`).
    pub fn text_block_bytes(&self) -> usize {
        (self.block_size_tokens as usize).saturating_mul(self.chars_per_token as usize)
    }

    /// The chain seed for a model and optional cache salt.
    pub fn chain_seed(model: &str, cache_salt: Option<&str>) -> BlockHash {
        let model_seed = xxh3_64(model.as_bytes());
        match cache_salt {
            None => model_seed,
            Some(salt) => xxh3_64_with_seed(salt.as_bytes(), model_seed),
        }
    }

    /// Appends the chained hashes of the full character blocks of `text` to `out`.
    pub fn hash_text(&self, seed: BlockHash, text: &str, out: &mut Vec<BlockHash>) {
        let block_bytes = self.text_block_bytes();
        if block_bytes == 0 {
            return;
        }
        let mut previous = seed;
        for block in text.as_bytes().chunks_exact(block_bytes) {
            previous = xxh3_64_with_seed(block, previous);
            out.push(previous);
        }
    }

    /// Appends the chained hashes of the full token blocks of `tokens` to `out`.
    pub fn hash_tokens(&self, seed: BlockHash, tokens: &[u32], out: &mut Vec<BlockHash>) {
        let block_tokens = self.block_size_tokens as usize;
        if block_tokens == 0 {
            return;
        }
        let mut buffer = [0u8; TOKEN_BUFFER_BYTES];
        let mut previous = seed;
        for block in tokens.chunks_exact(block_tokens) {
            previous = hash_token_block(block, previous, &mut buffer);
            out.push(previous);
        }
    }

    /// Clears `out` and fills it with the blocks of a parsed request. A [`Prompt::Hashed`]
    /// has no text left to hash: `out` stays empty (its blocks are those
    /// [`BlockHasher::hash_value`] gave).
    pub fn hash_request(&self, request: &ParsedRequest, out: &mut Vec<BlockHash>) {
        out.clear();
        let seed = Self::chain_seed(&request.model, request.cache_salt.as_deref());
        match &request.prompt {
            Prompt::Text(text) => self.hash_text(seed, text, out),
            Prompt::Tokens(tokens) => self.hash_tokens(seed, tokens, out),
            Prompt::Hashed { .. } => {}
        }
    }

    /// Parses an already-decoded body as [`crate::request::parse_request_value`] does, and
    /// clears `out` and fills it with the request's blocks, the same as
    /// [`BlockHasher::hash_request`] of that parse, without rendering the prompt: a text
    /// prompt (a chat conversation, a completions string) is hashed piece by piece where it
    /// lies in `body`, only the bytes of a block that straddles two pieces being copied. The
    /// returned request's prompt is then [`Prompt::Hashed`] (token prompts stay
    /// [`Prompt::Tokens`]). For a long prompt this saves copying it whole and allocating
    /// its rendering (~400 KB for a ~400,000-character chat).
    ///
    /// # Errors
    /// Those of [`crate::request::parse_request_value`]; `out` then holds no meaningful blocks.
    pub fn hash_value(
        &self,
        path: &str,
        body: &Value,
        out: &mut Vec<BlockHash>,
    ) -> Result<ParsedRequest, RequestError> {
        self.hash_json(path, &Json::from_value(body), out)
    }

    /// [`BlockHasher::hash_value`] of a body read by [`crate::json`]: its strings are read
    /// where they lie in the body's bytes, escapes decoded on the way, so the prompt's text is
    /// not copied at all (the gateway's routed path).
    ///
    /// # Errors
    /// Those of [`crate::request::parse_request_value`].
    pub fn hash_json(
        &self,
        path: &str,
        body: &Json<'_>,
        out: &mut Vec<BlockHash>,
    ) -> Result<ParsedRequest, RequestError> {
        out.clear();
        // The chain seed needs the model and salt, read before the prompt: the fields are read
        // twice (cheap: a few member lookups), the prompt once.
        let seed = match body {
            Json::Object(_) => {
                let text = |key| body.get(key).and_then(Json::as_str).map(JsonStr::to_cow);
                let model = text("model").unwrap_or_default();
                Self::chain_seed(&model, text("cache_salt").as_deref())
            }
            _ => 0,
        };
        let mut sink = TextBlocks::new(self.text_block_bytes(), seed, out);
        let request = parse_value_into(path, body, &mut sink, |sink| Prompt::Hashed {
            text_bytes: sink.text_bytes,
        })?;
        if let Prompt::Tokens(tokens) = &request.prompt {
            self.hash_tokens(seed, tokens, out);
        }
        Ok(request)
    }
}

/// A text prompt's blocks, hashed as its pieces are written ([`TextSink`]): the blocks of
/// [`BlockHasher::hash_text`] on the pieces joined. A block within one piece is hashed where it
/// lies; one that straddles pieces is gathered in `partial` first.
struct TextBlocks<'a> {
    block_bytes: usize,
    previous: BlockHash,
    /// The first bytes of the block being filled (fewer than `block_bytes`).
    partial: Vec<u8>,
    text_bytes: usize,
    out: &'a mut Vec<BlockHash>,
}

impl<'a> TextBlocks<'a> {
    fn new(block_bytes: usize, seed: BlockHash, out: &'a mut Vec<BlockHash>) -> Self {
        TextBlocks {
            block_bytes,
            previous: seed,
            partial: Vec::new(),
            text_bytes: 0,
            out,
        }
    }
}

impl TextSink for TextBlocks<'_> {
    fn push_str(&mut self, piece: &str) {
        self.text_bytes += piece.len();
        if self.block_bytes == 0 {
            return;
        }
        let mut rest = piece.as_bytes();
        if !self.partial.is_empty() {
            let take = rest.len().min(self.block_bytes - self.partial.len());
            let (head, tail) = rest.split_at(take);
            self.partial.extend_from_slice(head);
            rest = tail;
            if self.partial.len() < self.block_bytes {
                return;
            }
            self.previous = xxh3_64_with_seed(&self.partial, self.previous);
            self.out.push(self.previous);
            self.partial.clear();
        }
        let mut blocks = rest.chunks_exact(self.block_bytes);
        for block in &mut blocks {
            self.previous = xxh3_64_with_seed(block, self.previous);
            self.out.push(self.previous);
        }
        self.partial.extend_from_slice(blocks.remainder());
    }

    fn reserve(&mut self, bytes: usize) {
        if let Some(blocks) = bytes.checked_div(self.block_bytes) {
            self.out.reserve(blocks);
        }
    }
}

/// `xxh3_64_with_seed(little-endian bytes of block, seed)` without a heap allocation.
fn hash_token_block(block: &[u32], seed: u64, buffer: &mut [u8; TOKEN_BUFFER_BYTES]) -> u64 {
    const TOKENS_PER_BUFFER: usize = TOKEN_BUFFER_BYTES / 4;
    if block.len() <= TOKENS_PER_BUFFER {
        let len = serialize_tokens(block, buffer);
        return xxh3_64_with_seed(&buffer[..len], seed);
    }
    let mut hasher = Xxh3::with_seed(seed);
    for chunk in block.chunks(TOKENS_PER_BUFFER) {
        let len = serialize_tokens(chunk, buffer);
        hasher.update(&buffer[..len]);
    }
    hasher.digest()
}

/// Writes `tokens` (at most `TOKEN_BUFFER_BYTES / 4`) as little-endian bytes; returns the
/// number of bytes written.
fn serialize_tokens(tokens: &[u32], buffer: &mut [u8; TOKEN_BUFFER_BYTES]) -> usize {
    for (bytes, token) in buffer.chunks_exact_mut(4).zip(tokens) {
        bytes.copy_from_slice(&token.to_le_bytes());
    }
    tokens.len() * 4
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::{CHAT_COMPLETIONS_PATH, Endpoint, parse_request_value, render_chat};
    use proptest::prelude::*;
    use serde_json::{Value, json};

    const HASHER: BlockHasher = BlockHasher {
        block_size_tokens: 16,
        chars_per_token: 4,
    };

    fn text_request(model: &str, salt: Option<&str>, text: &str) -> ParsedRequest {
        ParsedRequest {
            endpoint: Endpoint::Completions,
            model: model.into(),
            prompt: Prompt::Text(text.into()),
            cache_salt: salt.map(Into::into),
            stream: false,
            max_tokens: None,
        }
    }

    fn hashes(request: &ParsedRequest) -> Vec<BlockHash> {
        let mut out = Vec::new();
        HASHER.hash_request(request, &mut out);
        out
    }

    /// The chain written the obvious way, with an allocation per block.
    fn reference_token_hashes(seed: u64, tokens: &[u32], block: usize) -> Vec<BlockHash> {
        let mut previous = seed;
        tokens
            .chunks_exact(block)
            .map(|chunk| {
                let bytes: Vec<u8> = chunk.iter().flat_map(|t| t.to_le_bytes()).collect();
                previous = xxh3_64_with_seed(&bytes, previous);
                previous
            })
            .collect()
    }

    #[test]
    fn default_block_is_16_tokens_of_4_chars() {
        assert_eq!(BlockHasher::default(), HASHER);
        assert_eq!(HASHER.text_block_bytes(), 64);
    }

    #[test]
    fn text_of_130_bytes_gives_exactly_two_64_byte_blocks() {
        let text = "a".repeat(130);
        let seed = BlockHasher::chain_seed("m", None);
        let mut out = Vec::new();
        HASHER.hash_text(seed, &text, &mut out);
        let first = xxh3_64_with_seed(&text.as_bytes()[..64], seed);
        let second = xxh3_64_with_seed(&text.as_bytes()[64..128], first);
        assert_eq!(out, vec![first, second]);
    }

    #[test]
    fn text_shorter_than_a_block_gives_no_blocks() {
        assert_eq!(
            hashes(&text_request("m", None, &"x".repeat(63))),
            Vec::<u64>::new()
        );
        assert_eq!(hashes(&text_request("m", None, "")), Vec::<u64>::new());
    }

    #[test]
    fn text_blocks_are_counted_in_bytes_not_chars() {
        // 32 two-byte characters = 64 bytes = one block.
        assert_eq!(hashes(&text_request("m", None, &"é".repeat(32))).len(), 1);
        // A block boundary may split a character; hashing still works.
        assert_eq!(hashes(&text_request("m", None, &"é".repeat(33))).len(), 1);
        assert_eq!(hashes(&text_request("m", None, &"€".repeat(43))).len(), 2);
    }

    #[test]
    fn hash_text_appends_to_out() {
        let mut out = vec![7];
        HASHER.hash_text(1, &"a".repeat(64), &mut out);
        assert_eq!(out.len(), 2);
        assert_eq!(out[0], 7);
    }

    #[test]
    fn hash_request_clears_out_first() {
        let mut out = vec![1, 2, 3];
        HASHER.hash_request(&text_request("m", None, &"a".repeat(64)), &mut out);
        assert_eq!(out.len(), 1);
    }

    #[test]
    fn token_blocks_are_chained_little_endian_u32() {
        let tokens: Vec<u32> = (0..40).map(|i| i * 0x0101_0101).collect();
        let seed = BlockHasher::chain_seed("m", None);
        let mut out = Vec::new();
        HASHER.hash_tokens(seed, &tokens, &mut out);
        let mut first_bytes = Vec::new();
        for t in &tokens[..16] {
            first_bytes.extend_from_slice(&t.to_le_bytes());
        }
        let first = xxh3_64_with_seed(&first_bytes, seed);
        assert_eq!(out.len(), 2);
        assert_eq!(out[0], first);
        assert_eq!(out, reference_token_hashes(seed, &tokens, 16));
    }

    #[test]
    fn token_blocks_larger_than_the_stack_buffer_hash_like_one_shot() {
        let hasher = BlockHasher {
            block_size_tokens: 1000,
            chars_per_token: 4,
        };
        let tokens: Vec<u32> = (0..2500).map(|i| i * 7919).collect();
        let mut out = Vec::new();
        hasher.hash_tokens(42, &tokens, &mut out);
        assert_eq!(out, reference_token_hashes(42, &tokens, 1000));
    }

    #[test]
    fn token_request_hashes_token_blocks() {
        let mut request = text_request("m", None, "");
        request.prompt = Prompt::Tokens((0..33).collect());
        let seed = BlockHasher::chain_seed("m", None);
        assert_eq!(
            hashes(&request),
            reference_token_hashes(seed, &(0..33).collect::<Vec<_>>(), 16)
        );
    }

    #[test]
    fn zero_block_size_gives_no_blocks() {
        let hasher = BlockHasher {
            block_size_tokens: 0,
            chars_per_token: 4,
        };
        let mut out = Vec::new();
        hasher.hash_text(0, &"a".repeat(1000), &mut out);
        hasher.hash_tokens(0, &[1; 100], &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn chain_seed_is_xxh3_of_model_then_salt() {
        let model = xxh3_64(b"llama");
        assert_eq!(BlockHasher::chain_seed("llama", None), model);
        assert_eq!(
            BlockHasher::chain_seed("llama", Some("t")),
            xxh3_64_with_seed(b"t", model)
        );
    }

    #[test]
    fn empty_salt_differs_from_no_salt() {
        assert_ne!(
            BlockHasher::chain_seed("m", None),
            BlockHasher::chain_seed("m", Some(""))
        );
    }

    #[test]
    fn equal_prompts_give_equal_hashes() {
        let text = "The quick brown fox. ".repeat(20);
        let a = hashes(&text_request("m", Some("s"), &text));
        assert_eq!(a.len(), 420 / 64);
        assert_eq!(a, hashes(&text_request("m", Some("s"), &text)));
    }

    #[test]
    fn cache_salt_changes_every_hash() {
        let text = "x".repeat(64 * 5);
        let none = hashes(&text_request("m", None, &text));
        let empty = hashes(&text_request("m", Some(""), &text));
        let a = hashes(&text_request("m", Some("a"), &text));
        let b = hashes(&text_request("m", Some("b"), &text));
        for i in 0..5 {
            let at_i = [none[i], empty[i], a[i], b[i]];
            for j in 0..4 {
                for k in j + 1..4 {
                    assert_ne!(at_i[j], at_i[k], "block {i}, variants {j} and {k}");
                }
            }
        }
    }

    #[test]
    fn model_changes_every_hash() {
        let text = "x".repeat(64 * 5);
        let a = hashes(&text_request("llama", None, &text));
        let b = hashes(&text_request("qwen", None, &text));
        assert_eq!(a.len(), 5);
        assert!(a.iter().zip(&b).all(|(x, y)| x != y));
    }

    #[test]
    fn changing_one_block_changes_it_and_every_later_block_only() {
        let mut text = "y".repeat(64 * 4).into_bytes();
        let before = hashes(&text_request(
            "m",
            None,
            std::str::from_utf8(&text).unwrap(),
        ));
        text[64 + 10] = b'z';
        let after = hashes(&text_request(
            "m",
            None,
            std::str::from_utf8(&text).unwrap(),
        ));
        assert_eq!(before[0], after[0]);
        assert!((1..4).all(|i| before[i] != after[i]));
    }

    fn message() -> impl Strategy<Value = Value> {
        let content = prop_oneof![
            Just(Value::Null),
            ".{0,120}".prop_map(Value::String),
            prop::collection::vec(
                prop_oneof![
                    ".{0,60}".prop_map(|t| json!({"type": "text", "text": t})),
                    "[a-z]{0,20}"
                        .prop_map(|u| json!({"type": "image_url", "image_url": {"url": u}})),
                ],
                0..4
            )
            .prop_map(Value::Array),
        ];
        (
            prop::sample::select(vec!["system", "user", "assistant", "tool"]),
            content,
            prop::option::of("[a-z]{1,6}"),
            prop::option::of("[a-z]{1,8}"),
            prop::option::of("[a-z]{1,4}"),
        )
            .prop_map(|(role, content, name, call, call_id)| {
                let mut m = json!({"role": role, "content": content});
                if let Some(name) = name {
                    m["name"] = json!(name);
                }
                if let Some(call) = call {
                    m["tool_calls"] = json!([{"id": "c", "type": "function",
                        "function": {"name": call, "arguments": "{}"}}]);
                }
                if let Some(id) = call_id {
                    m["tool_call_id"] = json!(id);
                }
                m
            })
    }

    fn tools() -> impl Strategy<Value = Option<Value>> {
        prop::option::of(
            prop::collection::vec("[a-z]{1,10}", 0..3).prop_map(|names| {
                Value::Array(
                    names
                        .into_iter()
                        .map(|n| json!({"type": "function", "function": {"name": n}}))
                        .collect(),
                )
            }),
        )
    }

    fn chat_hashes(messages: &[Value], tools: &Option<Value>) -> Vec<BlockHash> {
        let mut body = json!({"model": "m", "messages": messages});
        if let Some(tools) = tools {
            body["tools"] = tools.clone();
        }
        let request = parse_request_value(CHAT_COMPLETIONS_PATH, &body).unwrap();
        hashes(&request)
    }

    /// Text that JSON escapes or encodes in several bytes: quotes, backslashes, control
    /// characters, accents, CJK and emoji (blocks cut through their bytes).
    fn awkward_text() -> impl Strategy<Value = String> {
        prop_oneof![
            ".{0,120}",
            "[a-z\"\\\n\t\r\u{0}\u{1f} /éß中文😀]{0,300}",
            "[ab😀]{200,700}",
        ]
    }

    /// A chat message with [`awkward_text`] in its content (a string or text parts).
    fn awkward_message() -> impl Strategy<Value = Value> {
        (
            message(),
            prop::option::of(awkward_text()),
            prop::collection::vec(awkward_text(), 0..3),
        )
            .prop_map(|(mut m, text, parts)| {
                if let Some(text) = text {
                    m["content"] = json!(text);
                } else if !parts.is_empty() {
                    let parts: Vec<Value> = parts
                        .into_iter()
                        .map(|t| json!({"type": "text", "text": t}))
                        .collect();
                    m["content"] = Value::Array(parts);
                }
                m
            })
    }

    /// A request body: chat (with tools, awkward messages) or completions (a string, several
    /// strings, token ids), optionally salted; sometimes malformed.
    fn request_body() -> impl Strategy<Value = (&'static str, Value)> {
        let chat = (prop::collection::vec(awkward_message(), 0..6), tools()).prop_map(
            |(messages, tools)| {
                let mut body = json!({"model": "m😀", "messages": messages, "stream": true});
                if let Some(tools) = tools {
                    body["tools"] = tools;
                }
                ("/v1/chat/completions", body)
            },
        );
        let completions = prop_oneof![
            awkward_text().prop_map(Value::String),
            prop::collection::vec(awkward_text(), 1..4)
                .prop_map(|t| Value::Array(t.into_iter().map(Value::String).collect())),
            prop::collection::vec(any::<u32>(), 0..100).prop_map(|ids| json!(ids)),
            Just(json!(["a", 1])),
            Just(json!(7)),
        ]
        .prop_map(|prompt| ("/v1/completions", json!({"model": "m", "prompt": prompt})));
        (
            prop_oneof![chat, completions],
            prop::option::of("[a-z]{0,4}"),
        )
            .prop_map(|((path, mut body), salt)| {
                if let Some(salt) = salt {
                    body["cache_salt"] = json!(salt);
                }
                (path, body)
            })
    }

    proptest! {
        /// `hash_value` (in place, no rendering) gives the blocks, the fields and the
        /// input-token estimate of parsing, rendering and hashing the rendering, or the same
        /// error, on bodies that went through their JSON bytes (so escapes were decoded); and
        /// `hash_json` on those bytes as [`crate::json`] reads them (escapes decoded piece by
        /// piece where they lie) gives what `hash_value` gives.
        #[test]
        fn hashing_in_place_equals_hashing_the_rendering(
            (path, body) in request_body(),
            block_size_tokens in 0u32..20,
            chars_per_token in 1u32..6,
            pretty in any::<bool>(),
        ) {
            let bytes = if pretty {
                serde_json::to_vec_pretty(&body).unwrap()
            } else {
                serde_json::to_vec(&body).unwrap()
            };
            let body: Value = serde_json::from_slice(&bytes).unwrap();
            let hasher = BlockHasher { block_size_tokens, chars_per_token };
            let mut in_place = vec![1, 2, 3];
            let hashed = hasher.hash_value(path, &body, &mut in_place);
            let read = crate::json::parse(&bytes);
            prop_assert!(read.is_some());
            let mut from_bytes = vec![4, 5];
            let hashed_from_bytes = hasher.hash_json(path, &read.unwrap(), &mut from_bytes);
            prop_assert_eq!(&hashed_from_bytes, &hashed);
            if hashed.is_ok() {
                prop_assert_eq!(&from_bytes, &in_place);
            }
            match crate::request::parse_request_value(path, &body) {
                Err(e) => prop_assert_eq!(hashed.err(), Some(e)),
                Ok(rendered) => {
                    let hashed = hashed.unwrap();
                    let mut expected = Vec::new();
                    hasher.hash_request(&rendered, &mut expected);
                    prop_assert_eq!(&in_place, &expected);
                    prop_assert_eq!(
                        hashed.estimated_input_tokens(),
                        rendered.estimated_input_tokens()
                    );
                    match &rendered.prompt {
                        Prompt::Text(text) => prop_assert_eq!(
                            &hashed.prompt,
                            &Prompt::Hashed { text_bytes: text.len() }
                        ),
                        prompt => prop_assert_eq!(&hashed.prompt, prompt),
                    }
                    prop_assert_eq!(
                        ParsedRequest { prompt: Prompt::Tokens(Vec::new()), ..hashed },
                        ParsedRequest { prompt: Prompt::Tokens(Vec::new()), ..rendered }
                    );
                }
            }
        }
    }

    #[test]
    fn hashing_in_place_matches_a_block_that_straddles_two_messages() {
        let body = json!({"model": "m", "messages": [
            {"role": "system", "content": "é".repeat(100)},
            {"role": "user", "content": "a\"b\\c\n😀".repeat(50)},
        ]});
        let rendered = parse_request_value(CHAT_COMPLETIONS_PATH, &body).unwrap();
        let mut in_place = Vec::new();
        let hashed = HASHER
            .hash_value(CHAT_COMPLETIONS_PATH, &body, &mut in_place)
            .unwrap();
        let Prompt::Text(text) = &rendered.prompt else {
            panic!("a chat renders to text")
        };
        assert_eq!(
            hashed.prompt,
            Prompt::Hashed {
                text_bytes: text.len()
            }
        );
        assert_eq!(in_place.len(), text.len() / 64);
        assert_eq!(in_place, hashes(&rendered));
    }

    proptest! {
        #[test]
        fn changing_message_i_changes_blocks_from_its_first_differing_byte_on(
            messages in prop::collection::vec(message(), 1..8),
            tools in tools(),
            index in any::<prop::sample::Index>(),
            replacement in message(),
        ) {
            let i = index.index(messages.len());
            prop_assume!(messages[i] != replacement);
            let mut changed = messages.clone();
            changed[i] = replacement;

            let old_text = render_chat(&messages, tools.as_ref()).unwrap();
            let new_text = render_chat(&changed, tools.as_ref()).unwrap();
            let start = render_chat(&messages[..i], tools.as_ref()).unwrap().len();
            let first_diff = old_text
                .bytes()
                .zip(new_text.bytes())
                .position(|(a, b)| a != b)
                .unwrap_or(old_text.len().min(new_text.len()));
            prop_assert!(first_diff >= start, "rendering changed before message {}", i);
            prop_assert!(old_text != new_text);

            let old = chat_hashes(&messages, &tools);
            let new = chat_hashes(&changed, &tools);
            let block = HASHER.text_block_bytes();
            for j in 0..old.len().min(new.len()) {
                if (j + 1) * block <= start {
                    prop_assert_eq!(old[j], new[j], "block {} lies before message {}", j, i);
                } else if j >= first_diff / block {
                    prop_assert_ne!(old[j], new[j], "block {} is at or after the change", j);
                }
            }
        }

        #[test]
        fn appending_a_message_keeps_every_earlier_full_block(
            messages in prop::collection::vec(message(), 0..8),
            tools in tools(),
            next in message(),
        ) {
            let mut longer = messages.clone();
            longer.push(next);
            let short_text = render_chat(&messages, tools.as_ref()).unwrap();
            let long_text = render_chat(&longer, tools.as_ref()).unwrap();
            prop_assert!(long_text.starts_with(&short_text));

            let short = chat_hashes(&messages, &tools);
            let long = chat_hashes(&longer, &tools);
            prop_assert_eq!(short.len(), short_text.len() / HASHER.text_block_bytes());
            prop_assert_eq!(&long[..short.len()], &short[..]);
        }

        #[test]
        fn token_hashing_matches_the_reference_chain(
            tokens in prop::collection::vec(any::<u32>(), 0..600),
            block in 1u32..300,
            seed in any::<u64>(),
        ) {
            let hasher = BlockHasher { block_size_tokens: block, chars_per_token: 4 };
            let mut out = Vec::new();
            hasher.hash_tokens(seed, &tokens, &mut out);
            prop_assert_eq!(out, reference_token_hashes(seed, &tokens, block as usize));
        }
    }
}
