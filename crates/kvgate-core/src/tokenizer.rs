//! Prompt text → token ids, so the engine's prefix blocks are the ones a router computes with
//! the same tokenizer (`BlockHasher::hash_tokens`). Shared by the mock pod and the gateway's
//! token mode (`--index engine`). Pure computation: the ranks are embedded in `tiktoken-rs`.
//!
//! Built in: OpenAI's `cl100k_base` BPE from `tiktoken-rs` (ranks embedded in the crate, no
//! download), encoded "ordinary" (special-token text such as `<|endoftext|>` is plain text).
//! A model's own `tokenizer.json` (`kvgate serve --tokenizer`) is loaded by the gateway
//! (`kvgate_gateway::tokenizer`), which keeps the Hugging Face `tokenizers` crate out of the core.

use tiktoken_rs::CoreBPE;

/// The pod's tokenizer.
#[derive(Clone, Copy)]
pub struct PromptTokenizer {
    bpe: &'static CoreBPE,
}

impl std::fmt::Debug for PromptTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PromptTokenizer(cl100k_base)")
    }
}

impl PromptTokenizer {
    /// `cl100k_base`, loaded once per process.
    pub fn cl100k() -> Self {
        PromptTokenizer {
            bpe: tiktoken_rs::cl100k_base_singleton(),
        }
    }

    /// Token ids at or above this are out of the vocabulary (cl100k: 100,256 ranks + specials).
    pub fn vocab_size(&self) -> u32 {
        100_277
    }

    pub fn encode(&self, text: &str) -> Vec<u32> {
        self.bpe.encode_ordinary(text)
    }
}
