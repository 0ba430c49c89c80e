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

use crate::request::{ParsedRequest, Prompt};

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

    /// Clears `out` and fills it with the blocks of a parsed request.
    pub fn hash_request(&self, request: &ParsedRequest, out: &mut Vec<BlockHash>) {
        out.clear();
        let seed = Self::chain_seed(&request.model, request.cache_salt.as_deref());
        match &request.prompt {
            Prompt::Text(text) => self.hash_text(seed, text, out),
            Prompt::Tokens(tokens) => self.hash_tokens(seed, tokens, out),
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
