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
//! Memory: the vocabulary and merges as loaded (a Llama-3 `tokenizer.json` is ~9 MB on disk),
//! once per process.

use crate::chat_template::{ChatRequest, ChatTemplate, ChatTemplateError, RenderedChat};
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
        Ok(GatewayTokenizer::HuggingFace {
            tokenizer: Arc::new(tokenizer),
            path: shown,
            chat_template,
        })
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
