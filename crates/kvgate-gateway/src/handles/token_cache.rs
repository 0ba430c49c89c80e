//! Tokenization reuse for token mode (`--index engine`): a conversation's next turn repeats
//! the whole earlier conversation (a 100k-token system prompt, then every turn), so the gateway
//! tokenizes only the text it has not seen, and reuses the token ids of the rest.
//!
//! # Algorithm
//! 1. **Cut** the prompt text at *safe split points*: byte positions `b` where, for every text
//!    `T` containing such a point, `ids(T) == ids(T[..b]) ++ ids(T[b..])` (each side tokenized on
//!    its own). Which positions are safe depends on the tokenizer ([`SplitRule`]); cuts are
//!    taken greedily from the left, at least [`MIN_SEGMENT_BYTES`] apart, so two texts that
//!    share a prefix are cut the same way along it.
//! 2. **Look up** each segment by its 128-bit xxh3 (the segment's bytes, nothing else: a
//!    segment's ids do not depend on its neighbours, by step 1) in a bounded LRU of token ids;
//!    tokenize the segments not found (each on its own) and insert them.
//! 3. The prompt's ids are the segments' ids in order. By induction over the cuts this equals
//!    tokenizing the whole text (the property tests below check it on adversarial texts: BPE
//!    merges across the cut, partial special tokens, exotic whitespace).
//!
//! A conversation's turn `n + 1` shares turn `n`'s text up to (at most) turn `n`'s last
//! segment, so only that segment and the new messages are tokenized. The segments are content
//! addressed: a system prompt shared by many conversations is tokenized once.
//!
//! # Safe split points ([`SplitRule`])
//! - **Built-in cl100k** (tiktoken, "ordinary"): right after a `\n` followed by a character
//!   that is not whitespace (Unicode `White_Space`, the regex's `\s`). Proof on cl100k's
//!   pre-tokenizer pattern `'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+|
//!   ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s`: BPE runs within each regex piece,
//!   and no alternative matches `\n` followed by a non-whitespace character (the letter
//!   alternative's prefix excludes `\r\n`, the punctuation one takes only newlines after its
//!   run, the rest are whitespace), so a piece ends at `b` in `T`; in `T[..b]` the same piece
//!   ends there (a whitespace run ending in `\n` is one piece, by `\s*[\r\n]` in `T` and by
//!   `\s++$` at the end of `T[..b]`), and the scan restarts at `b` as in `T[b..]` (no
//!   look-behind). kvgate's own chat rendering ends every message with `\n`, and the next one
//!   starts with a letter, so every message boundary is one.
//! - **A `tokenizer.json`** (Hugging Face `tokenizers`): the start of every occurrence of an
//!   added token (the special tokens a chat template writes between messages:
//!   `<|start_header_id|>`, `<|im_start|>`, …), found as the library finds them (leftmost
//!   longest over all non-normalized added tokens, over the whole text). The library splits
//!   the text at these occurrences *before* normalizing, pre-tokenizing and running the model,
//!   and processes each piece between them on its own, so the ids are the concatenation.
//!   Only when that holds as stated: every non-normalized added token without `single_word`,
//!   `lstrip` or `rstrip` (they look across the occurrence), `encode_special_tokens` off, no
//!   truncation or padding, no BPE dropout, and the text tokenized *without* the special tokens
//!   a post-processor adds (chat prompts, as vLLM; a completions prompt with a BOS is tokenized
//!   whole). Otherwise the rule is [`SplitRule::Whole`].
//! - [`SplitRule::Whole`]: no cut; the whole text is one segment (an identical prompt, a retry,
//!   still reuses its ids).
//!
//! # Parameters and bounds
//! - `budget_bytes` (`kvgate serve --tokenization-cache-mib`, default
//!   [`DEFAULT_BUDGET_BYTES`] = 64 MiB; 0 turns the cache off): the ids held, counted as
//!   4 bytes per id + [`ENTRY_OVERHEAD_BYTES`] per entry; least recently used segments are
//!   evicted past it. A segment weighing over a quarter of the budget is not cached. 64 MiB hold
//!   ~16 M tokens: ~150 distinct 100k-token conversations.
//! - [`MIN_SEGMENT_BYTES`] = 2 KiB: cuts closer than this are skipped (fewer entries and
//!   tokenizer calls; what a turn re-tokenizes grows by at most this much).
//! - One mutex around the LRU, held for lookups and inserts only, never while tokenizing.

use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// Default `budget_bytes`: 64 MiB of token ids.
pub const DEFAULT_BUDGET_BYTES: usize = 64 << 20;
/// Bytes charged per entry on top of its ids (map slots, the Arc header, the LRU order).
pub const ENTRY_OVERHEAD_BYTES: usize = 96;
/// Smallest distance between two cuts.
pub const MIN_SEGMENT_BYTES: usize = 2048;

/// Where a tokenizer's output provably splits (module docs).
#[derive(Clone)]
pub enum SplitRule {
    /// cl100k "ordinary": after a `\n` followed by a non-whitespace character.
    AfterNewline,
    /// A `tokenizer.json`: at the start of each occurrence of one of these added tokens.
    AtAddedTokens(Arc<aho_corasick::AhoCorasick>),
    /// No safe cut known: the text is one segment.
    Whole,
}

impl std::fmt::Debug for SplitRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SplitRule::AfterNewline => "after newlines",
            SplitRule::AtAddedTokens(_) => "at added tokens",
            SplitRule::Whole => "whole texts",
        })
    }
}

impl SplitRule {
    /// The rule for a `tokenizer.json`, or `Err` with why its output may not split at added
    /// tokens (then [`SplitRule::Whole`] is used).
    pub fn for_hugging_face(tokenizer: &tokenizers::Tokenizer) -> Result<SplitRule, String> {
        if tokenizer.get_truncation().is_some() || tokenizer.get_padding().is_some() {
            return Err("the tokenizer truncates or pads".into());
        }
        if tokenizer.get_encode_special_tokens() {
            return Err("the tokenizer encodes special tokens as text".into());
        }
        let config = serde_json::to_value(tokenizer).map_err(|e| e.to_string())?;
        if !config["model"]["dropout"].is_null() {
            return Err("the BPE model has dropout".into());
        }
        let mut patterns = Vec::new();
        for token in tokenizer.get_added_tokens_decoder().values() {
            if token.normalized {
                // Matched inside the pieces after normalization: not a cut, no effect on cuts.
                continue;
            }
            if token.single_word || token.lstrip || token.rstrip {
                return Err(format!(
                    "added token {:?} looks at the text around it",
                    token.content
                ));
            }
            if token.content.is_empty() {
                return Err("an added token is empty".into());
            }
            patterns.push(token.content.clone());
        }
        if patterns.is_empty() {
            return Err("no non-normalized added tokens".into());
        }
        aho_corasick::AhoCorasick::builder()
            .match_kind(aho_corasick::MatchKind::LeftmostLongest)
            .build(&patterns)
            .map(|ac| SplitRule::AtAddedTokens(Arc::new(ac)))
            .map_err(|e| e.to_string())
    }

    /// The text's cuts (ascending, each in `1..text.len()`, at least `min_gap` from the
    /// previous cut or the start), greedily from the left.
    pub fn cuts(&self, text: &str, min_gap: usize) -> Vec<usize> {
        let mut cuts = Vec::new();
        let mut last = 0;
        let mut take = |b: usize, cuts: &mut Vec<usize>| {
            if b > 0 && b < text.len() && b - last >= min_gap.max(1) {
                cuts.push(b);
                last = b;
            }
        };
        match self {
            SplitRule::AfterNewline => {
                for nl in memchr::memchr_iter(b'\n', text.as_bytes()) {
                    let b = nl + 1;
                    // `b` follows an ASCII byte: a char boundary.
                    if text[b..].chars().next().is_some_and(|c| !c.is_whitespace()) {
                        take(b, &mut cuts);
                    }
                }
            }
            SplitRule::AtAddedTokens(ac) => {
                for m in ac.find_iter(text) {
                    take(m.start(), &mut cuts);
                }
            }
            SplitRule::Whole => {}
        }
        cuts
    }
}

/// What one [`TokenCache::encode`] did, for the metrics.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct EncodeStats {
    /// Bytes of text whose ids came from the cache.
    pub reused_bytes: usize,
    /// Bytes of text tokenized.
    pub tokenized_bytes: usize,
}

struct Entry {
    ids: Arc<[u32]>,
    tick: u64,
}

#[derive(Default)]
struct Lru {
    entries: HashMap<u128, Entry>,
    /// tick → key, oldest first.
    order: BTreeMap<u64, u128>,
    next_tick: u64,
    bytes: usize,
}

/// The bounded segment cache (module docs); shared by every request.
pub struct TokenCache {
    rule: SplitRule,
    budget_bytes: usize,
    min_segment_bytes: usize,
    lru: Mutex<Lru>,
}

impl std::fmt::Debug for TokenCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "TokenCache({:?}, {} bytes)",
            self.rule, self.budget_bytes
        )
    }
}

fn weight(ids: &[u32]) -> usize {
    ids.len() * 4 + ENTRY_OVERHEAD_BYTES
}

impl TokenCache {
    pub fn new(rule: SplitRule, budget_bytes: usize) -> TokenCache {
        TokenCache::with_min_segment(rule, budget_bytes, MIN_SEGMENT_BYTES)
    }

    /// As [`TokenCache::new`] with another [`MIN_SEGMENT_BYTES`] (tests cut tiny texts).
    pub fn with_min_segment(
        rule: SplitRule,
        budget_bytes: usize,
        min_segment_bytes: usize,
    ) -> TokenCache {
        TokenCache {
            rule,
            budget_bytes,
            min_segment_bytes,
            lru: Mutex::new(Lru::default()),
        }
    }

    pub fn rule(&self) -> &SplitRule {
        &self.rule
    }

    /// Bytes held now (ids + per-entry overhead); never over the budget after an insert.
    pub fn held_bytes(&self) -> usize {
        self.lru.lock().bytes
    }

    /// `text`'s token ids: its segments' ids from the cache, the others from `encode_segment`
    /// (each segment on its own, in order; its first error is the result).
    pub fn encode(
        &self,
        text: &str,
        mut encode_segment: impl FnMut(&str) -> Result<Vec<u32>, String>,
    ) -> (Result<Vec<u32>, String>, EncodeStats) {
        let mut stats = EncodeStats::default();
        if self.budget_bytes == 0 {
            stats.tokenized_bytes = text.len();
            return (encode_segment(text), stats);
        }
        let cuts = self.rule.cuts(text, self.min_segment_bytes);
        let mut bounds = Vec::with_capacity(cuts.len() + 2);
        bounds.push(0);
        bounds.extend(cuts);
        bounds.push(text.len());
        let segments: Vec<(&str, u128)> = bounds
            .windows(2)
            .map(|w| {
                let s = &text[w[0]..w[1]];
                (s, xxhash_rust::xxh3::xxh3_128(s.as_bytes()))
            })
            .collect();
        let found: Vec<Option<Arc<[u32]>>> = {
            let mut lru = self.lru.lock();
            segments.iter().map(|(_, key)| lru.get(*key)).collect()
        };
        let mut ids = Vec::with_capacity(text.len() / 3);
        let mut fresh = Vec::new();
        for ((segment, key), hit) in segments.iter().zip(found) {
            match hit {
                Some(cached) => {
                    stats.reused_bytes += segment.len();
                    ids.extend_from_slice(&cached);
                }
                None => {
                    stats.tokenized_bytes += segment.len();
                    let encoded = match encode_segment(segment) {
                        Ok(e) => e,
                        Err(e) => return (Err(e), stats),
                    };
                    ids.extend_from_slice(&encoded);
                    fresh.push((*key, encoded));
                }
            }
        }
        if !fresh.is_empty() {
            let mut lru = self.lru.lock();
            for (key, encoded) in fresh {
                lru.insert(key, encoded.into(), self.budget_bytes);
            }
        }
        (Ok(ids), stats)
    }
}

impl Lru {
    fn get(&mut self, key: u128) -> Option<Arc<[u32]>> {
        let tick = self.next_tick;
        let entry = self.entries.get_mut(&key)?;
        self.order.remove(&entry.tick);
        entry.tick = tick;
        self.order.insert(tick, key);
        self.next_tick += 1;
        Some(entry.ids.clone())
    }

    fn insert(&mut self, key: u128, ids: Arc<[u32]>, budget: usize) {
        let w = weight(&ids);
        if w > budget / 4 || self.entries.contains_key(&key) {
            return;
        }
        while self.bytes + w > budget {
            let Some((_, old)) = self.order.pop_first() else {
                break;
            };
            if let Some(e) = self.entries.remove(&old) {
                self.bytes -= weight(&e.ids);
            }
        }
        let tick = self.next_tick;
        self.next_tick += 1;
        self.order.insert(tick, key);
        self.entries.insert(key, Entry { ids, tick });
        self.bytes += w;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvgate_core::tokenizer::PromptTokenizer;
    use proptest::prelude::*;

    /// A byte-level BPE `tokenizer.json` whose merges cross every cut a careless splitter
    /// would make (`\n` + letter, `>` + `\n`, space + `<`, letters across a special token's
    /// text), with the added tokens `added`: (content, lstrip).
    fn adversarial_bpe(added: &[(&str, bool)]) -> tokenizers::Tokenizer {
        let mut vocab = serde_json::Map::new();
        let mut alphabet: Vec<char> = tokenizers::pre_tokenizers::byte_level::ByteLevel::alphabet()
            .into_iter()
            .collect();
        alphabet.sort_unstable();
        for c in alphabet {
            let id = vocab.len();
            vocab.insert(c.to_string(), id.into());
        }
        // Ġ = space, Ċ = \n in the byte-level alphabet.
        let merges = [
            ("Ċ", "r"),
            (">", "Ċ"),
            ("Ġ", "<"),
            ("Ġ<", "|"),
            ("<", "|"),
            ("|", ">"),
            ("u", "s"),
            ("us", "er"),
            ("e", "r"),
            ("Ċ", "Ċ"),
            ("Ġ", "Ġ"),
            ("ĠĠ", "ĠĠ"),
            ("Ġ", "t"),
            ("h", "e"),
            ("Ġt", "he"),
            ("l", "o"),
            ("lo", "w"),
            ("low", "low"),
        ];
        for (a, b) in merges {
            let id = vocab.len();
            vocab.insert(format!("{a}{b}"), id.into());
        }
        let added: Vec<serde_json::Value> = added
            .iter()
            .enumerate()
            .map(|(i, (content, lstrip))| {
                serde_json::json!({"id": vocab.len() + i, "content": content, "single_word": false,
                    "lstrip": lstrip, "rstrip": false, "normalized": false, "special": true})
            })
            .collect();
        let json = serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null,
            "added_tokens": added,
            "normalizer": null,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
            "post_processor": null,
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
            "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                      "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                      "ignore_merges": false, "vocab": vocab,
                      "merges": merges.iter().map(|(a, b)| format!("{a} {b}")).collect::<Vec<_>>()}
        });
        json.to_string().parse().unwrap()
    }

    /// Special tokens where one is a prefix of another and one contains another's start, so
    /// that leftmost-longest matters.
    const SPECIALS: [(&str, bool); 4] = [
        ("<|user|>", false),
        ("<|user|>x", false),
        ("<|end|>", false),
        ("|><|", false),
    ];

    /// Text fragments that make cuts hard: newlines and other whitespace (NBSP, U+3000,
    /// U+2028 are Unicode whitespace), partial and whole special tokens, merge halves,
    /// contractions, digits, multi-byte characters.
    const FRAGMENTS: [&str; 30] = [
        "\n",
        "\n\n",
        "\r\n",
        " \n",
        "\n ",
        "r",
        "user",
        " ",
        "  ",
        "\t",
        "\u{a0}",
        "\u{3000}",
        "\u{2028}",
        "<|",
        "|>",
        "<|user|>",
        "<|user|>x",
        "<|end|>",
        "<|us",
        "er|>",
        "'s",
        "'ll",
        "123",
        "4",
        "the",
        " the",
        "low",
        "é",
        "日本",
        "🦀",
    ];

    fn text_from(picks: &[usize]) -> String {
        picks
            .iter()
            .map(|&i| FRAGMENTS[i % FRAGMENTS.len()])
            .collect()
    }

    fn hf_full(t: &tokenizers::Tokenizer, s: &str) -> Vec<u32> {
        t.encode(s, false).unwrap().get_ids().to_vec()
    }

    #[test]
    fn the_rule_of_a_tokenizer_with_stripping_added_tokens_is_refused() {
        let t = adversarial_bpe(&[("<|user|>", false), ("<|end|>", true)]);
        let why = SplitRule::for_hugging_face(&t).unwrap_err();
        assert!(why.contains("<|end|>"), "{why}");
        assert!(SplitRule::for_hugging_face(&adversarial_bpe(&SPECIALS)).is_ok());
    }

    #[test]
    fn cuts_are_taken_left_to_right_at_least_the_minimum_apart() {
        let text = "a\nb\nc\n d\ne";
        assert_eq!(SplitRule::AfterNewline.cuts(text, 1), vec![2, 4, 9]);
        assert_eq!(SplitRule::AfterNewline.cuts(text, 3), vec![4, 9]);
        assert_eq!(SplitRule::Whole.cuts(text, 1), Vec::<usize>::new());
        assert_eq!(SplitRule::AfterNewline.cuts("\nx", 1), vec![1]);
        assert_eq!(
            SplitRule::AfterNewline.cuts("x\n", 1),
            Vec::<usize>::new(),
            "never at the end"
        );
        assert_eq!(
            SplitRule::AfterNewline.cuts("x\n\u{3000}y", 1),
            Vec::<usize>::new(),
            "nor before whitespace"
        );
    }

    #[test]
    fn a_next_turn_tokenizes_only_its_new_segments() {
        let cl100k = PromptTokenizer::cl100k();
        let cache = TokenCache::new(SplitRule::AfterNewline, DEFAULT_BUDGET_BYTES);
        let system = format!("r6:systemc{}\n", "the system prompt words ".repeat(2000));
        let turn1 = format!("{system}r4:userc{}\n", "first question ".repeat(200));
        let turn2 = format!(
            "{turn1}r9:assistantc5:fine.\nr4:userc{}\n",
            "again ".repeat(500)
        );
        let (ids, stats) = cache.encode(&turn1, |s| Ok(cl100k.encode(s)));
        assert_eq!(ids.unwrap(), cl100k.encode(&turn1));
        assert_eq!(stats.reused_bytes, 0);
        let (ids, stats) = cache.encode(&turn2, |s| Ok(cl100k.encode(s)));
        assert_eq!(ids.unwrap(), cl100k.encode(&turn2));
        assert_eq!(stats.reused_bytes, turn1.len(), "turn 1 whole");
        assert_eq!(stats.tokenized_bytes, turn2.len() - turn1.len());
    }

    #[test]
    fn the_cache_never_holds_more_than_its_budget() {
        let cl100k = PromptTokenizer::cl100k();
        let budget = 64 << 10;
        let cache = TokenCache::with_min_segment(SplitRule::AfterNewline, budget, 1);
        for i in 0..400 {
            let text = format!("line {i} {}\nnext {i}\n", "w ".repeat(i % 50));
            let (ids, _) = cache.encode(&text, |s| Ok(cl100k.encode(s)));
            assert_eq!(ids.unwrap(), cl100k.encode(&text));
            assert!(
                cache.held_bytes() <= budget,
                "{} > {budget}",
                cache.held_bytes()
            );
        }
        assert!(cache.held_bytes() > budget / 2, "it fills up");
    }

    #[test]
    fn an_encoding_error_is_the_result_and_caches_nothing() {
        let cache = TokenCache::with_min_segment(SplitRule::AfterNewline, 1 << 20, 1);
        let (r, _) = cache.encode("a\nb", |_| Err("broken".into()));
        assert_eq!(r, Err("broken".to_string()));
        assert_eq!(cache.held_bytes(), 0);
    }

    #[test]
    fn a_zero_budget_turns_reuse_off() {
        let cl100k = PromptTokenizer::cl100k();
        let cache = TokenCache::new(SplitRule::AfterNewline, 0);
        for _ in 0..2 {
            let (ids, stats) = cache.encode("a\nb", |s| Ok(cl100k.encode(s)));
            assert_eq!(ids.unwrap(), cl100k.encode("a\nb"));
            assert_eq!(stats.reused_bytes, 0);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// Every cut of the cl100k rule splits the ids exactly, on adversarial texts.
        #[test]
        fn cl100k_ids_split_exactly_at_every_cut(picks in prop::collection::vec(0usize..64, 0..120)) {
            let t = PromptTokenizer::cl100k();
            let text = text_from(&picks);
            let full = t.encode(&text);
            for b in SplitRule::AfterNewline.cuts(&text, 1) {
                let mut joined = t.encode(&text[..b]);
                joined.extend(t.encode(&text[b..]));
                prop_assert_eq!(&joined, &full, "cut at {} of {:?}", b, text);
            }
        }

        /// Every cut of the added-token rule splits a `tokenizer.json`'s ids exactly.
        #[test]
        fn added_token_ids_split_exactly_at_every_cut(picks in prop::collection::vec(0usize..64, 0..120)) {
            let t = adversarial_bpe(&SPECIALS);
            let rule = SplitRule::for_hugging_face(&t).unwrap();
            let text = text_from(&picks);
            let full = hf_full(&t, &text);
            for b in rule.cuts(&text, 1) {
                let mut joined = hf_full(&t, &text[..b]);
                joined.extend(hf_full(&t, &text[b..]));
                prop_assert_eq!(&joined, &full, "cut at {} of {:?}", b, text);
            }
        }

        /// A conversation growing turn by turn through one cache (tiny budget: evictions too)
        /// always gets the ids of a full tokenization, with either rule.
        #[test]
        fn cached_ids_always_equal_a_full_tokenization(
            turns in prop::collection::vec(prop::collection::vec(0usize..64, 0..40), 1..6),
            budget in prop::sample::select(vec![0usize, 600, 1 << 20]),
        ) {
            let cl100k = PromptTokenizer::cl100k();
            let hf = adversarial_bpe(&SPECIALS);
            let by_newline = TokenCache::with_min_segment(SplitRule::AfterNewline, budget, 1);
            let by_token =
                TokenCache::with_min_segment(SplitRule::for_hugging_face(&hf).unwrap(), budget, 1);
            let mut text = String::new();
            for turn in &turns {
                text.push_str(&text_from(turn));
                let (ids, _) = by_newline.encode(&text, |s| Ok(cl100k.encode(s)));
                prop_assert_eq!(ids.unwrap(), cl100k.encode(&text), "cl100k {:?}", text);
                let (ids, _) = by_token.encode(&text, |s| Ok(hf_full(&hf, s)));
                prop_assert_eq!(ids.unwrap(), hf_full(&hf, &text), "tokenizer.json {:?}", text);
                prop_assert!(by_newline.held_bytes() <= budget && by_token.held_bytes() <= budget);
            }
        }
    }
}
