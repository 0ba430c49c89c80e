//! Deterministic prompt text for workloads that carry no text (traces, generators).
//!
//! Each token of a synthetic prompt is one word from [`WORDS`] with a leading space (`" cat"`):
//! 4 bytes, and exactly one `cl100k_base` token (checked by a test against the mock pod's
//! tokenizer), so a prompt of `n` tokens is `4·n` bytes and tokenizes to `n` tokens. That makes
//! one 16-token block exactly 64 bytes — the gateway's text block (`block_size_tokens` 16 ×
//! `chars_per_token` 4) — and one 512-token Mooncake `hash_id` exactly 2,048 bytes.
//!
//! - **Mooncake traces** ([`mooncake_prompt`]): token `o` of `hash_id` `h` is a function of
//!   `(h, o)` only, so requests with equal leading ids have equal leading text, byte for byte, and
//!   the sharing of the trace is real at the HTTP level (and at the token level on a pod).
//! - **Generated workloads and traces without ids** ([`blocks_prompt`]): the 16 words of a block
//!   come from its chained block hash (equal hashes ⇒ equal prefix ⇒ equal text); the tokens after
//!   the last full block come from the request id, so they are never shared, as in the simulator.

use kvgate_sim::workload::mooncake::MOONCAKE_BLOCK_TOKENS;
use kvgate_sim::workload::segments::segment_id;

/// Bytes per synthetic token.
pub const BYTES_PER_TOKEN: usize = 4;
/// Tokens per block whose words come from one key.
const WORDS_PER_KEY: u32 = 16;
/// Namespace of Mooncake word keys.
const NS_MOONCAKE: u64 = 0x4c47_4d6f; // "LGMo"
/// Namespace of the unshared tail of a generated prompt.
const NS_TAIL: u64 = 0x4c47_5461; // "LGTa"

/// Three-letter English words, each one `cl100k_base` token when preceded by a space.
pub const WORDS: [&str; 128] = [
    "the", "and", "for", "are", "but", "not", "you", "all", "any", "can", "had", "her", "was",
    "one", "our", "out", "day", "get", "has", "him", "his", "how", "man", "new", "now", "old",
    "see", "two", "way", "who", "boy", "did", "its", "let", "put", "say", "she", "too", "use",
    "act", "add", "age", "ago", "aid", "aim", "air", "ask", "bad", "bag", "bed", "big", "bit",
    "box", "bus", "buy", "car", "cat", "cup", "cut", "dog", "dry", "due", "ear", "eat", "egg",
    "end", "eye", "far", "few", "fit", "fly", "fun", "gas", "god", "gun", "guy", "hat", "hit",
    "hot", "ice", "job", "key", "kid", "lab", "law", "lay", "leg", "lie", "lot", "low", "map",
    "mix", "net", "nor", "odd", "off", "oil", "pay", "pen", "per", "pet", "pop", "pot", "raw",
    "red", "row", "run", "sad", "sea", "set", "sit", "six", "sky", "son", "sun", "tax", "tea",
    "ten", "tie", "tip", "top", "toy", "try", "war", "wet", "win", "yes", "yet",
];

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Appends the first `words` (≤ 16) words of the block named `key`.
fn push_block(key: u64, words: u32, out: &mut String) {
    let mut state = key;
    for _ in 0..words.min(WORDS_PER_KEY) {
        state = splitmix(state);
        out.push(' ');
        out.push_str(WORDS[(state >> 57) as usize % WORDS.len()]);
    }
}

/// Appends `tokens` words of a run named `id`: token `o` depends on `(id, o)` only.
fn push_run(id: u64, tokens: u32, out: &mut String) {
    let mut done = 0;
    let mut block = 0u64;
    while done < tokens {
        let n = (tokens - done).min(WORDS_PER_KEY);
        push_block(segment_id(NS_MOONCAKE, id, block), n, out);
        done += n;
        block += 1;
    }
}

/// The prompt of a Mooncake line: `input_tokens` tokens, 512 from each leading `hash_id`.
/// Ids beyond `ceil(input_tokens / 512)` are ignored (as the simulator's reader does).
pub fn mooncake_prompt(hash_ids: &[u64], input_tokens: u32) -> String {
    let mut out = String::with_capacity(input_tokens as usize * BYTES_PER_TOKEN);
    let mut left = input_tokens;
    for &id in hash_ids {
        if left == 0 {
            break;
        }
        let n = left.min(MOONCAKE_BLOCK_TOKENS);
        push_run(id, n, &mut out);
        left -= n;
    }
    // A line with too few ids (the reader rejects those) would still get its full length.
    if left > 0 {
        push_run(
            segment_id(NS_TAIL, u64::MAX, u64::from(input_tokens)),
            left,
            &mut out,
        );
    }
    out
}

/// The prompt of a request given as chained 16-token block hashes plus `input_tokens` in all:
/// 16 words per block hash, then `input_tokens − 16·blocks` words unique to `request_id`.
pub fn blocks_prompt(blocks: &[u64], input_tokens: u32, request_id: u64) -> String {
    let mut out = String::with_capacity(input_tokens as usize * BYTES_PER_TOKEN);
    let mut left = input_tokens;
    for &b in blocks {
        if left < WORDS_PER_KEY {
            break;
        }
        push_block(b, WORDS_PER_KEY, &mut out);
        left -= WORDS_PER_KEY;
    }
    let mut k = 0u64;
    while left > 0 {
        let n = left.min(WORDS_PER_KEY);
        push_block(segment_id(NS_TAIL, request_id, k), n, &mut out);
        left -= n;
        k += 1;
    }
    out
}

/// First token id of `--token-prompts`: word `i` of [`WORDS`] is sent as id
/// `TOKEN_ID_BASE + i`, above the special tokens of every tokenizer seen so far.
pub const TOKEN_ID_BASE: u32 = 1_000;

/// A synthetic prompt as token ids, one per word (`--token-prompts`): the engine then sees
/// exactly the planned number of tokens whatever its tokenizer (a model's own BPE would cut the
/// words differently), and two prompts share a prefix of ids exactly where their texts share
/// words. Needs a vocabulary of at least `TOKEN_ID_BASE + 128` ids.
pub fn token_ids(text: &str) -> Vec<u32> {
    static INDEX: std::sync::OnceLock<Vec<(&'static str, u32)>> = std::sync::OnceLock::new();
    let index = INDEX.get_or_init(|| {
        let mut v: Vec<(&'static str, u32)> = WORDS.iter().copied().zip(0..).collect();
        v.sort_unstable();
        v
    });
    text.split(' ')
        .filter(|w| !w.is_empty())
        .map(|w| {
            let i = index
                .binary_search_by(|(k, _)| (*k).cmp(w))
                .map_or(0, |at| index[at].1);
            TOKEN_ID_BASE + i
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_prompts_have_the_planned_length_and_share_exactly_the_shared_prefix() {
        let a = token_ids(&mooncake_prompt(&[1, 2], 700));
        let b = token_ids(&mooncake_prompt(&[1, 3], 700));
        assert_eq!((a.len(), b.len()), (700, 700));
        let shared = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
        // The first hash id (512 tokens) is shared, the next one is not (a collision of the
        // first word after it is possible: 1 in 128).
        assert!((512..=513).contains(&shared), "{shared}");
        assert!(
            a.iter()
                .all(|&t| (TOKEN_ID_BASE..TOKEN_ID_BASE + 128).contains(&t))
        );
    }

    fn common_prefix(a: &str, b: &str) -> usize {
        a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count()
    }

    #[test]
    fn words_are_distinct_and_four_bytes_with_their_space() {
        let mut w: Vec<_> = WORDS.to_vec();
        w.sort_unstable();
        w.dedup();
        assert_eq!(w.len(), WORDS.len());
        assert!(WORDS.iter().all(|w| w.len() == BYTES_PER_TOKEN - 1));
    }

    #[test]
    fn equal_hash_ids_give_equal_text_and_lengths_are_exact() {
        let a = mooncake_prompt(&[1, 2, 3], 1500);
        let b = mooncake_prompt(&[1, 2, 3], 1500);
        assert_eq!(a, b);
        assert_eq!(a.len(), 1500 * BYTES_PER_TOKEN);
        assert_ne!(a, mooncake_prompt(&[1, 2, 4], 1500));
    }

    #[test]
    fn requests_sharing_k_leading_ids_share_exactly_k_spans_of_text() {
        let span = MOONCAKE_BLOCK_TOKENS as usize * BYTES_PER_TOKEN;
        let a = mooncake_prompt(&[7, 8, 9], 1536);
        let b = mooncake_prompt(&[7, 8, 10], 1536);
        let c = mooncake_prompt(&[7, 11, 9], 1536);
        // Equal up to the first differing word, which almost surely is the span's first.
        assert!((2 * span..2 * span + 4).contains(&common_prefix(&a, &b)));
        assert!((span..span + 4).contains(&common_prefix(&a, &c)));
        // A shorter request with the same ids is a prefix of the longer one.
        let short = mooncake_prompt(&[7, 8], 700);
        assert!(a.starts_with(&short));
    }

    #[test]
    fn block_prompts_share_text_exactly_where_blocks_are_shared() {
        let a = blocks_prompt(&[10, 11, 12], 50, 0);
        let b = blocks_prompt(&[10, 11, 13], 50, 1);
        assert_eq!(a.len(), 50 * BYTES_PER_TOKEN);
        let shared = common_prefix(&a, &b);
        assert!((2 * 64..2 * 64 + 4).contains(&shared), "{shared}");
        // Same blocks, other request: the tails differ.
        let c = blocks_prompt(&[10, 11, 12], 50, 2);
        assert_eq!(a[..48 * 4], c[..48 * 4]);
        assert_ne!(a, c);
    }
}
