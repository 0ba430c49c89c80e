//! Prompt → chained block hashes (xxh3-64, stable across processes and machines).
//!
//! CONTRACT (to be implemented):
//! - Chain seed = xxh3 of the model name and, when present, the `cache_salt`.
//! - Text prompts: blocks of `block_size_tokens × chars_per_token` bytes (default 16 × 4 = 64).
//!   Token prompts: blocks of `block_size_tokens` token ids (little-endian u32 bytes).
//! - Only full blocks are hashed (vLLM caches only full blocks).
//! - `hash_i = xxh3_64_with_seed(block_i bytes, hash_{i-1})`, `hash_{-1}` = chain seed, so an
//!   equal hash at position i means an equal prefix up to and including block i.

use crate::request::ParsedRequest;

/// One chained block hash.
pub type BlockHash = u64;

/// Default tokens per block (vLLM's CUDA default).
pub const DEFAULT_BLOCK_SIZE_TOKENS: u32 = 16;
/// Characters per token assumed in approximate mode (llm-d's `averageCharactersPerToken`).
pub const DEFAULT_CHARS_PER_TOKEN: u32 = 4;

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

impl BlockHasher {
    /// The chain seed for a model and optional cache salt.
    pub fn chain_seed(model: &str, cache_salt: Option<&str>) -> BlockHash {
        let _ = (model, cache_salt);
        todo!()
    }

    /// Appends the chained hashes of the full character blocks of `text` to `out`.
    pub fn hash_text(&self, seed: BlockHash, text: &str, out: &mut Vec<BlockHash>) {
        let _ = (seed, text, out);
        todo!()
    }

    /// Appends the chained hashes of the full token blocks of `tokens` to `out`.
    pub fn hash_tokens(&self, seed: BlockHash, tokens: &[u32], out: &mut Vec<BlockHash>) {
        let _ = (seed, tokens, out);
        todo!()
    }

    /// Clears `out` and fills it with the blocks of a parsed request.
    pub fn hash_request(&self, request: &ParsedRequest, out: &mut Vec<BlockHash>) {
        let _ = (request, out);
        todo!()
    }
}
