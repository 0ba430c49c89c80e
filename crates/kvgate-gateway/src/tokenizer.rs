//! The prompt tokenizer of token mode (`--index engine`): the built-in cl100k (the mock pod's),
//! or the served model's own `tokenizer.json` (`--tokenizer FILE`, Hugging Face `tokenizers`
//! with pure-Rust features: no Oniguruma, no download), so that the gateway cuts a prompt into
//! the same token blocks as the vLLM pods whose KV events it follows.
//!
//! - Loaded once at start (not on config reload); a file that cannot be read or parsed stops the
//!   start with [`TokenizerError`].
//! - `encode` adds the tokenizer's special tokens (a BOS, for most models), as vLLM does for a
//!   completions prompt. Chat prompts are rendered by kvgate (`kvgate_core::request`), not by
//!   the model's chat template, so they match the pods' blocks only as far as the two
//!   renderings agree.
//! - An encoding error (rare: a misconfigured truncation or padding) gives no tokens: the prompt
//!   scores cold everywhere; it is logged and counted by the caller.
//!
//! Memory: the vocabulary and merges as loaded (a Llama-3 `tokenizer.json` is ~9 MB on disk),
//! once per process.

use kvgate_core::tokenizer::PromptTokenizer;
use std::path::Path;
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
#[error("cannot load tokenizer {path}: {message}")]
pub struct TokenizerError {
    pub path: String,
    pub message: String,
}

/// The gateway's tokenizer; cheap to clone.
#[derive(Clone)]
pub enum GatewayTokenizer {
    Cl100k(PromptTokenizer),
    HuggingFace {
        tokenizer: Arc<tokenizers::Tokenizer>,
        path: String,
    },
}

impl std::fmt::Debug for GatewayTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

impl GatewayTokenizer {
    /// The built-in cl100k, or the `tokenizer.json` at `path`.
    pub fn load(path: Option<&Path>) -> Result<Self, TokenizerError> {
        let Some(path) = path else {
            return Ok(GatewayTokenizer::Cl100k(PromptTokenizer::cl100k()));
        };
        let shown = path.display().to_string();
        let tokenizer = tokenizers::Tokenizer::from_file(path).map_err(|e| TokenizerError {
            path: shown.clone(),
            message: e.to_string(),
        })?;
        Ok(GatewayTokenizer::HuggingFace {
            tokenizer: Arc::new(tokenizer),
            path: shown,
        })
    }

    /// For logs: `built-in cl100k` or `tokenizer.json at PATH`.
    pub fn describe(&self) -> String {
        match self {
            GatewayTokenizer::Cl100k(_) => "built-in cl100k".to_string(),
            GatewayTokenizer::HuggingFace { path, .. } => format!("tokenizer.json at {path}"),
        }
    }

    /// Token ids of `text`; `Err` with the reason when the tokenizer fails.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        match self {
            GatewayTokenizer::Cl100k(t) => Ok(t.encode(text)),
            GatewayTokenizer::HuggingFace { tokenizer, .. } => tokenizer
                .encode(text, true)
                .map(|e| e.get_ids().to_vec())
                .map_err(|e| e.to_string()),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A word-level `tokenizer.json`: `w0`…`w{n-1}` are ids 0…n-1, anything else `[UNK]` = n;
    /// whitespace splits words. Written under the system temp dir; returns its path.
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
        let path = std::env::temp_dir().join(format!(
            "kvgate-test-{}-{name}-tokenizer.json",
            std::process::id()
        ));
        std::fs::write(&path, json.to_string()).unwrap();
        path
    }

    #[test]
    fn a_tokenizer_json_encodes_with_its_own_vocabulary() {
        let path = word_level_tokenizer_json("unit", 8);
        let t = GatewayTokenizer::load(Some(&path)).unwrap();
        assert_eq!(t.encode("w3 w0  w7 other").unwrap(), vec![3, 0, 7, 8]);
        assert!(t.describe().contains("tokenizer.json at"));
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn without_a_file_the_built_in_cl100k_is_used() {
        let t = GatewayTokenizer::load(None).unwrap();
        assert_eq!(
            t.encode("hello world").unwrap(),
            PromptTokenizer::cl100k().encode("hello world")
        );
    }

    #[test]
    fn a_missing_or_garbage_file_is_a_typed_error() {
        let missing = std::env::temp_dir().join("kvgate-no-such-tokenizer.json");
        let e = GatewayTokenizer::load(Some(&missing)).unwrap_err();
        assert_eq!(e.path, missing.display().to_string());
        let garbage = std::env::temp_dir().join(format!(
            "kvgate-test-{}-garbage-tokenizer.json",
            std::process::id()
        ));
        std::fs::write(&garbage, b"{\"model\": 17, \xff").unwrap();
        assert!(GatewayTokenizer::load(Some(&garbage)).is_err());
        std::fs::remove_file(garbage).unwrap();
    }
}
