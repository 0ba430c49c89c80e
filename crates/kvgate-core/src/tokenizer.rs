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

    /// The longest token's length in bytes (computed once per process over every rank).
    ///
    /// A bound on the token count without encoding: cl100k is a byte-level BPE, lossless, and
    /// `encode` is "ordinary" (no special tokens), so the tokens' bytes concatenate to the text
    /// exactly; `n` tokens cover at most `n × max_token_bytes()` bytes, hence a text of `L`
    /// bytes has at least `⌈L / max_token_bytes()⌉` tokens.
    pub fn max_token_bytes(&self) -> usize {
        static MAX: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
        *MAX.get_or_init(|| {
            (0..self.vocab_size())
                .filter_map(|rank| self.bpe.decode_bytes(&[rank]).ok())
                .map(|bytes| bytes.len())
                .max()
                .unwrap_or(1)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_longest_cl100k_token_is_found_once_over_every_rank() {
        let t = PromptTokenizer::cl100k();
        let max = t.max_token_bytes();
        // The longest rank's bytes, as tiktoken stores them.
        let longest = (0..t.vocab_size())
            .filter_map(|r| t.bpe.decode_bytes(&[r]).ok())
            .max_by_key(Vec::len)
            .unwrap();
        assert_eq!(max, longest.len());
        // Encoding that token's text alone gives at most one token per max_token_bytes bytes.
        let text = String::from_utf8_lossy(&longest).into_owned();
        assert!(t.encode(&text).len() * max >= text.len());
    }

    proptest! {
        /// The bound `tokens × max_token_bytes ≥ bytes` the gateway rejects long prompts by
        /// before tokenizing them, and the losslessness it rests on.
        #[test]
        fn no_text_has_fewer_tokens_than_its_bytes_over_the_longest_token(
            text in "(\\PC|[ \\t\\n]){0,400}"
        ) {
            let t = PromptTokenizer::cl100k();
            let ids = t.encode(&text);
            prop_assert!(ids.len() * t.max_token_bytes() >= text.len());
            prop_assert_eq!(t.bpe.decode_bytes(&ids).unwrap(), text.as_bytes().to_vec());
        }

        #[test]
        fn repeated_text_never_beats_the_bound(unit in "[ a-z=\\-_.]{1,8}", n in 1usize..400) {
            let t = PromptTokenizer::cl100k();
            let text = unit.repeat(n);
            prop_assert!(t.encode(&text).len() * t.max_token_bytes() >= text.len());
        }
    }
}
