//! The prompt tokenizer of token mode (`--index engine`): the built-in cl100k (the mock pod's),
//! or the served model's own `tokenizer.json` (`--tokenizer FILE`, Hugging Face `tokenizers`
//! with pure-Rust features: no Oniguruma, no download), so that the gateway cuts a prompt into
//! the same token blocks as the vLLM pods whose KV events it follows.
//!
//! - Loaded once at start (not on config reload); a file that cannot be read or parsed stops the
//!   start with [`TokenizerError`].
//! - `encode` adds the tokenizer's special tokens (a BOS, for most models), as vLLM does for a
//!   completions prompt.
//! - Chat prompts: with a Hugging Face tokenizer, the model's chat template is loaded next to
//!   it (or from `--chat-template FILE`) and [`GatewayTokenizer::render_chat`] renders a chat
//!   body as vLLM does ([`crate::chat_template`]); the text is then tokenized with the request's
//!   `add_special_tokens` (default false, as vLLM: the template writes the BOS). Without a
//!   template (and with the built-in cl100k, the mock pod's) chat prompts are kvgate's own
//!   rendering (`kvgate_core::request`), which matches a real engine's blocks only by chance.
//! - An encoding error (rare: a misconfigured truncation or padding) gives no tokens: the prompt
//!   scores cold everywhere; it is logged and counted by the caller.
//!
//! - Long prompts: [`GatewayTokenizer::certainly_over`] tells, from a text's byte length alone,
//!   that it has more than `max_prompt_tokens` tokens, so that the gateway rejects it without
//!   tokenizing it (a 16 MB prompt costs seconds of CPU and ~900 MB to tokenize). It uses the
//!   longest token's byte length, found once at load, and only where that bounds the count:
//!   the built-in cl100k always; a `tokenizer.json` when [`max_token_bytes_bound`] proves it
//!   (else the prompt is tokenized, as before, and the reason is logged at start).
//!
//! Memory: the vocabulary and merges as loaded (a Llama-3 `tokenizer.json` is ~9 MB on disk),
//! once per process.

use crate::chat_template::{ChatRequest, ChatTemplate, ChatTemplateError, RenderedChat};
use crate::token_cache::{EncodeStats, SplitRule, TokenCache};
use kvgate_core::tokenizer::PromptTokenizer;
use std::path::Path;
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
#[error("cannot load tokenizer {path}: {message}")]
pub struct TokenizerError {
    pub path: String,
    pub message: String,
}

impl From<ChatTemplateError> for TokenizerError {
    fn from(e: ChatTemplateError) -> Self {
        match e {
            ChatTemplateError::Load { path, message } => TokenizerError { path, message },
            other => TokenizerError {
                path: String::new(),
                message: other.to_string(),
            },
        }
    }
}

/// The gateway's tokenizer; cheap to clone.
#[derive(Clone)]
pub enum GatewayTokenizer {
    Cl100k(PromptTokenizer),
    HuggingFace {
        tokenizer: Arc<tokenizers::Tokenizer>,
        path: String,
        /// The model's chat template, when it has one (or `--chat-template`).
        chat_template: Option<ChatTemplate>,
        /// [`max_token_bytes_bound`]: the most input bytes one token covers, or why no such
        /// bound is proven for this tokenizer.
        max_token_bytes: Result<usize, String>,
    },
}

impl std::fmt::Debug for GatewayTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

impl GatewayTokenizer {
    /// The built-in cl100k, or the `tokenizer.json` at `path` with the model's chat template
    /// found next to it, or the one in `chat_template` (which needs `path`).
    pub fn load(path: Option<&Path>, chat_template: Option<&Path>) -> Result<Self, TokenizerError> {
        let Some(path) = path else {
            if let Some(template) = chat_template {
                return Err(TokenizerError {
                    path: template.display().to_string(),
                    message: "--chat-template needs --tokenizer (the model's tokenizer.json)"
                        .into(),
                });
            }
            return Ok(GatewayTokenizer::Cl100k(PromptTokenizer::cl100k()));
        };
        let shown = path.display().to_string();
        let tokenizer = tokenizers::Tokenizer::from_file(path).map_err(|e| TokenizerError {
            path: shown.clone(),
            message: e.to_string(),
        })?;
        let chat_template = ChatTemplate::load(path, chat_template)?;
        let max_token_bytes = max_token_bytes_bound(&tokenizer);
        Ok(GatewayTokenizer::HuggingFace {
            tokenizer: Arc::new(tokenizer),
            path: shown,
            chat_template,
            max_token_bytes,
        })
    }

    /// The most bytes of a prompt one token covers, when that is proven for this tokenizer
    /// (the built-in cl100k: always; a `tokenizer.json`: see [`max_token_bytes_bound`]).
    pub fn max_token_bytes(&self) -> Result<usize, &str> {
        match self {
            GatewayTokenizer::Cl100k(t) => Ok(t.max_token_bytes()),
            GatewayTokenizer::HuggingFace {
                max_token_bytes, ..
            } => max_token_bytes.as_ref().copied().map_err(String::as_str),
        }
    }

    /// True when a text of `text_bytes` bytes certainly has more than `max_tokens` tokens:
    /// `text_bytes > max_tokens × max_token_bytes`. Safe: each token covers at most
    /// `max_token_bytes` bytes of the text and every byte is covered, so the text has at least
    /// `text_bytes / max_token_bytes > max_tokens` tokens; it never rejects a text that fits.
    /// False (tokenize to know) when no bound is proven.
    pub fn certainly_over(&self, text_bytes: usize, max_tokens: u32) -> bool {
        self.max_token_bytes()
            .is_ok_and(|per_token| text_bytes > (max_tokens as usize).saturating_mul(per_token))
    }

    /// For logs and /debug/config: `built-in cl100k`, or `tokenizer.json at PATH` and where its
    /// chat template came from.
    pub fn describe(&self) -> String {
        match self {
            GatewayTokenizer::Cl100k(_) => "built-in cl100k".to_string(),
            GatewayTokenizer::HuggingFace {
                path,
                chat_template: Some(t),
                ..
            } => format!("tokenizer.json at {path}, chat template {}", t.source()),
            GatewayTokenizer::HuggingFace { path, .. } => {
                format!("tokenizer.json at {path}, no chat template")
            }
        }
    }

    /// The model's chat template, if this is a Hugging Face tokenizer with one.
    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        match self {
            GatewayTokenizer::HuggingFace { chat_template, .. } => chat_template.as_ref(),
            GatewayTokenizer::Cl100k(_) => None,
        }
    }

    /// A chat request's body rendered with the model's chat template, as vLLM renders it;
    /// `None` without a template (kvgate's own rendering is then the prompt).
    pub fn render_chat(&self, body: &[u8]) -> Option<Result<RenderedChat, ChatTemplateError>> {
        let template = self.chat_template()?;
        Some(ChatRequest::from_body(body).and_then(|r| template.render(&r)))
    }

    /// Token ids of `text`, with the tokenizer's special tokens (a completions prompt);
    /// `Err` with the reason when the tokenizer fails.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        self.encode_with(text, true)
    }

    /// Token ids of `text`, with or without the tokenizer's special tokens (the built-in cl100k
    /// has none).
    pub fn encode_with(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, String> {
        match self {
            GatewayTokenizer::Cl100k(t) => Ok(t.encode(text)),
            GatewayTokenizer::HuggingFace { tokenizer, .. } => tokenizer
                .encode(text, add_special_tokens)
                .map(|e| e.get_ids().to_vec())
                .map_err(|e| e.to_string()),
        }
    }

    /// Where this tokenizer's ids provably split, for tokenization reuse
    /// ([`crate::token_cache`]); `Err` with the reason when no cut is proven safe.
    pub fn split_rule(&self) -> Result<SplitRule, String> {
        match self {
            GatewayTokenizer::Cl100k(_) => Ok(SplitRule::AfterNewline),
            GatewayTokenizer::HuggingFace { tokenizer, .. } => {
                SplitRule::for_hugging_face(tokenizer)
            }
        }
    }

    /// [`GatewayTokenizer::encode_with`] reusing `cache`'s ids: exactly the same ids. A
    /// `tokenizer.json` with `add_special_tokens` (its post-processor adds a BOS to the whole
    /// text, so the text's segments do not concatenate) is tokenized whole, without the cache.
    pub fn encode_reusing(
        &self,
        cache: Option<&TokenCache>,
        text: &str,
        add_special_tokens: bool,
    ) -> (Result<Vec<u32>, String>, EncodeStats) {
        let whole = |r| {
            let stats = EncodeStats {
                reused_bytes: 0,
                tokenized_bytes: text.len(),
            };
            (r, stats)
        };
        let splits = !add_special_tokens || matches!(self, GatewayTokenizer::Cl100k(_));
        match cache {
            Some(cache) if splits => cache.encode(text, |segment| {
                self.encode_with(segment, add_special_tokens)
            }),
            _ => whole(self.encode_with(text, add_special_tokens)),
        }
    }

    /// A chat body's token ids as vLLM computes them (rendered with the chat template, then
    /// tokenized); `None` without a template.
    pub fn encode_chat(&self, body: &[u8]) -> Option<Result<Vec<u32>, String>> {
        let rendered = self.render_chat(body)?;
        Some(
            rendered
                .map_err(|e| e.to_string())
                .and_then(|r| self.encode_with(&r.text, r.add_special_tokens)),
        )
    }
}

/// The most input bytes one token of `tokenizer` can cover, when the tokenizer provably covers
/// every byte of its input with tokens of at most that many bytes; `Err` with the reason
/// otherwise (then prompts are tokenized to be counted).
///
/// The bound is the longest vocabulary entry's byte length (added tokens included), at least 4
/// (one unknown character). It holds when nothing between the text and the tokens drops or
/// shrinks input, checked on the tokenizer's own configuration:
/// - no truncation (it would cap the count, as vLLM does not);
/// - no added token that strips the whitespace around it (`lstrip`/`rstrip`: unbounded);
/// - normalizer: none, or only ones that never shrink text: `Prepend`, `ByteLevel`, `Replace`
///   of a literal by something at least as long (Llama-2's ` ` → `▁`), or a `Sequence` of
///   them. Unicode normalizers (`NFC`, `NFKC`, …) and `Lowercase` can shrink text (U+2126 Ω,
///   3 bytes → U+03A9, 2; U+212A K → `k`), `Strip` and `BertNormalizer` drop it: no bound;
/// - pre-tokenizer: none, `ByteLevel`, `Metaspace`, `Digits`, `Split` / `Punctuation` unless
///   they remove their matches, or a `Sequence` of them (`Whitespace` drops whitespace);
/// - model: `BPE` whose every input byte has a token: the 256 byte-level characters in the
///   vocabulary (with a `ByteLevel` pre-tokenizer), or `byte_fallback` with the 256 `<0xNN>`
///   tokens, or an unknown token for each unknown character (`unk_token`, no `fuse_unk`);
///   `Unigram` with `byte_fallback` and the 256 `<0xNN>` tokens. `WordLevel` and `WordPiece`
///   map a whole unknown word to one token: no bound.
///
/// Why the vocabulary's byte length bounds what a token covers: a vocabulary entry is the
/// (normalized, pre-tokenized) text it stands for, where each input byte became at least one
/// byte (a byte-level character is 1–2 bytes of UTF-8 for one input byte, `▁` is 3 for a
/// space, `<0xNN>` 6 for one byte); tokens that cover nothing (a prepended `▁`, a BOS) only
/// add to the count.
pub fn max_token_bytes_bound(tokenizer: &tokenizers::Tokenizer) -> Result<usize, String> {
    use serde_json::Value;
    let config = serde_json::to_value(tokenizer).map_err(|e| e.to_string())?;
    if !config["truncation"].is_null() {
        return Err("the tokenizer truncates".into());
    }
    if let Some(added) = config["added_tokens"].as_array()
        && let Some(t) = added
            .iter()
            .find(|t| t["lstrip"] == true || t["rstrip"] == true)
    {
        return Err(format!(
            "added token {} strips the whitespace around it",
            t["content"]
        ));
    }
    fn kinds<'a>(v: &'a Value, list_key: &str, out: &mut Vec<&'a Value>) {
        if v["type"] == "Sequence" {
            for item in v[list_key].as_array().into_iter().flatten() {
                kinds(item, list_key, out);
            }
        } else if !v.is_null() {
            out.push(v);
        }
    }
    let mut normalizers = Vec::new();
    kinds(&config["normalizer"], "normalizers", &mut normalizers);
    for n in normalizers {
        let grows = match n["type"].as_str() {
            Some("Prepend" | "ByteLevel") => true,
            Some("Replace") => match (n["pattern"]["String"].as_str(), n["content"].as_str()) {
                (Some(from), Some(to)) => !from.is_empty() && to.len() >= from.len(),
                _ => false,
            },
            _ => false,
        };
        if !grows {
            return Err(format!("normalizer {} may shrink the text", n["type"]));
        }
    }
    let mut pre = Vec::new();
    kinds(&config["pre_tokenizer"], "pretokenizers", &mut pre);
    let mut byte_level = false;
    for p in pre {
        let keeps = match p["type"].as_str() {
            Some("ByteLevel") => {
                byte_level = true;
                true
            }
            Some("Metaspace" | "Digits") => true,
            Some("Split" | "Punctuation") => p["behavior"] != "Removed",
            _ => false,
        };
        if !keeps {
            return Err(format!("pre-tokenizer {} may drop text", p["type"]));
        }
    }
    let vocab = tokenizer.get_vocab(true);
    let all_byte_tokens = || (0..=255u8).all(|b| vocab.contains_key(&format!("<0x{b:02X}>")));
    let model = &config["model"];
    let every_byte_has_a_token = match model["type"].as_str() {
        Some("BPE") => {
            (byte_level
                && tokenizers::pre_tokenizers::byte_level::ByteLevel::alphabet()
                    .iter()
                    .all(|c| vocab.contains_key(&c.to_string())))
                || (model["byte_fallback"] == true && all_byte_tokens())
                || (model["unk_token"].is_string() && model["fuse_unk"] != true)
        }
        Some("Unigram") => model["byte_fallback"] == true && all_byte_tokens(),
        _ => false,
    };
    if !every_byte_has_a_token {
        return Err(format!(
            "model {} may cover unknown text of any length with one token",
            model["type"]
        ));
    }
    Ok(vocab.keys().map(String::len).max().unwrap_or(1).max(4))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A word-level `tokenizer.json`: `w0`…`w{n-1}` are ids 0…n-1, anything else `[UNK]` = n;
    /// whitespace splits words. Written in a folder of its own under the system temp dir;
    /// returns its path.
    pub(crate) fn word_level_tokenizer_json(name: &str, n: u32) -> std::path::PathBuf {
        let mut vocab: serde_json::Map<String, serde_json::Value> =
            (0..n).map(|i| (format!("w{i}"), i.into())).collect();
        vocab.insert("[UNK]".into(), n.into());
        let json = serde_json::json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": [],
            "normalizer": null,
            "pre_tokenizer": {"type": "Whitespace"},
            "post_processor": null,
            "decoder": null,
            "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}
        });
        // A folder of its own: the chat template is looked up next to the file.
        let dir = std::env::temp_dir().join(format!("kvgate-test-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tokenizer.json");
        std::fs::write(&path, json.to_string()).unwrap();
        path
    }

    /// A byte-level BPE `tokenizer.json` (GPT-2 / Llama-3 style: the 256 byte characters,
    /// merges up to `Ġthe`, `lowlowlow`), with `normalizer` as given; returns its path.
    fn byte_level_bpe_json(name: &str, normalizer: serde_json::Value) -> std::path::PathBuf {
        let mut vocab: serde_json::Map<String, serde_json::Value> = serde_json::Map::new();
        let mut alphabet: Vec<char> = tokenizers::pre_tokenizers::byte_level::ByteLevel::alphabet()
            .into_iter()
            .collect();
        alphabet.sort_unstable();
        for c in alphabet {
            let id = vocab.len();
            vocab.insert(c.to_string(), id.into());
        }
        let merges = [
            ("Ġ", "t"),
            ("h", "e"),
            ("Ġt", "he"),
            ("l", "o"),
            ("lo", "w"),
            ("low", "low"),
            ("lowlow", "low"),
        ];
        for (a, b) in merges {
            let id = vocab.len();
            vocab.insert(format!("{a}{b}"), id.into());
        }
        let json = serde_json::json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": [{"id": vocab.len(), "content": "<|begin_of_text|>", "single_word": false,
                              "lstrip": false, "rstrip": false, "normalized": false, "special": true}],
            "normalizer": normalizer,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
            "post_processor": null,
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
            "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                      "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                      "ignore_merges": false, "vocab": vocab,
                      "merges": merges.iter().map(|(a, b)| format!("{a} {b}")).collect::<Vec<_>>()}
        });
        let dir = std::env::temp_dir().join(format!("kvgate-test-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tokenizer.json");
        std::fs::write(&path, json.to_string()).unwrap();
        path
    }

    #[test]
    fn a_byte_level_bpe_has_a_length_bound_that_never_rejects_a_prompt_that_fits() {
        let path = byte_level_bpe_json("bound", serde_json::Value::Null);
        let t = GatewayTokenizer::load(Some(&path), None).unwrap();
        // The longest entry: `<|begin_of_text|>`, 17 bytes.
        assert_eq!(t.max_token_bytes(), Ok(17));
        // The worst case for the bound: text made of the longest token only.
        let text = "<|begin_of_text|>".repeat(1000);
        let n = t.encode(&text).unwrap().len();
        assert_eq!(n, 1000);
        assert!(!t.certainly_over(text.len(), n as u32), "fits exactly");
        assert!(t.certainly_over(17 * 100 + 1, 100));
        assert!(!t.certainly_over(17 * 100, 100));
        let mut rng = 0x2545_f491_4f6c_dd1d_u64;
        for _ in 0..300 {
            // Seeded xorshift: random texts of mixed scripts, spaces and the merged words.
            let mut text = String::new();
            for _ in 0..(rng % 200) {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                text.push_str(
                    [
                        "the",
                        " the",
                        "low",
                        " ",
                        "é",
                        "日本",
                        "\n",
                        "x",
                        "🦀",
                        "<|begin_of_text|>",
                    ][(rng % 10) as usize],
                );
            }
            let n = t.encode(&text).unwrap().len();
            assert!(
                n * 17 >= text.len(),
                "seed state {rng}: {n} tokens for {text:?}"
            );
            assert!(!t.certainly_over(text.len(), n as u32), "{text:?}");
        }
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn tokenizers_that_drop_or_shrink_text_get_no_length_bound() {
        // Whitespace pre-tokenizer and a word-level model: "w1        w2" is 2 tokens.
        let words = word_level_tokenizer_json("nobound", 8);
        let t = GatewayTokenizer::load(Some(&words), None).unwrap();
        let why = t.max_token_bytes().unwrap_err();
        assert!(why.contains("Whitespace"), "{why}");
        assert!(!t.certainly_over(1 << 30, 1));
        std::fs::remove_file(words).unwrap();
        let nfc = byte_level_bpe_json("nfc", serde_json::json!({"type": "NFC"}));
        let t = GatewayTokenizer::load(Some(&nfc), None).unwrap();
        assert!(t.max_token_bytes().unwrap_err().contains("NFC"));
        std::fs::remove_file(nfc).unwrap();
        let replace = byte_level_bpe_json(
            "replace",
            serde_json::json!({"type": "Sequence", "normalizers": [
                {"type": "Prepend", "prepend": "▁"},
                {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}),
        );
        let t = GatewayTokenizer::load(Some(&replace), None).unwrap();
        assert_eq!(
            t.max_token_bytes(),
            Ok(17),
            "growing normalizers keep the bound"
        );
        std::fs::remove_file(replace).unwrap();
    }

    #[test]
    fn the_built_in_cl100k_always_has_a_length_bound() {
        let t = GatewayTokenizer::load(None, None).unwrap();
        let max = t.max_token_bytes().unwrap();
        assert_eq!(max, PromptTokenizer::cl100k().max_token_bytes());
        assert!(t.certainly_over(max * 10 + 1, 10));
        assert!(!t.certainly_over(max * 10, 10));
    }

    #[test]
    fn a_tokenizer_json_encodes_with_its_own_vocabulary() {
        let path = word_level_tokenizer_json("unit", 8);
        let t = GatewayTokenizer::load(Some(&path), None).unwrap();
        assert_eq!(t.encode("w3 w0  w7 other").unwrap(), vec![3, 0, 7, 8]);
        assert!(t.describe().contains("tokenizer.json at"));
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn chat_bodies_are_rendered_with_the_template_next_to_the_tokenizer() {
        let path = word_level_tokenizer_json("chat", 8);
        let template = path.with_file_name("chat_template.jinja");
        std::fs::write(
            &template,
            "{% for m in messages %}w1 {{ m.content }} w2 {% endfor %}{% if add_generation_prompt %}w7{% endif %}",
        )
        .unwrap();
        let t = GatewayTokenizer::load(Some(&path), None).unwrap();
        assert!(
            t.describe()
                .ends_with(&format!("chat template {}", template.display()))
        );
        let body = br#"{"model":"m","messages":[{"role":"user","content":"w3"},{"role":"assistant","content":"w4 w5"}]}"#;
        assert_eq!(
            t.encode_chat(body).unwrap().unwrap(),
            vec![1, 3, 2, 1, 4, 5, 2, 7]
        );
        let bad = br#"{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"u"}}]}]}"#;
        assert!(t.encode_chat(bad).unwrap().is_err());
        std::fs::remove_file(template).unwrap();
        let plain = GatewayTokenizer::load(Some(&path), None).unwrap();
        assert!(
            plain.encode_chat(body).is_none(),
            "no template: kvgate's own rendering"
        );
        assert!(
            GatewayTokenizer::load(None, Some(&path)).is_err(),
            "--chat-template needs --tokenizer"
        );
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn without_a_file_the_built_in_cl100k_is_used() {
        let t = GatewayTokenizer::load(None, None).unwrap();
        assert_eq!(
            t.encode("hello world").unwrap(),
            PromptTokenizer::cl100k().encode("hello world")
        );
    }

    #[test]
    fn a_missing_or_garbage_file_is_a_typed_error() {
        let missing = std::env::temp_dir().join("kvgate-no-such-tokenizer.json");
        let e = GatewayTokenizer::load(Some(&missing), None).unwrap_err();
        assert_eq!(e.path, missing.display().to_string());
        let garbage = std::env::temp_dir().join(format!(
            "kvgate-test-{}-garbage-tokenizer.json",
            std::process::id()
        ));
        std::fs::write(&garbage, b"{\"model\": 17, \xff").unwrap();
        assert!(GatewayTokenizer::load(Some(&garbage), None).is_err());
        std::fs::remove_file(garbage).unwrap();
    }
}
