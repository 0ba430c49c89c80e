//! CPU per conversation turn of token mode's prompt preparation, with and without tokenization
//! reuse ([`kvgate_gateway::token_cache`]).
//!
//! `cargo run --release -p kvgate-gateway --example tokenize_turns -- [TOKENIZER_JSON] [TURNS]`
//!
//! A conversation of TURNS (default 4) turns: a 60,000-word system prompt, then per turn a
//! user message of 8,000 words and (from the second turn) the previous assistant answer of 200
//! words. Each turn's body is what a client sends (the whole conversation). Per turn it
//! measures the thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`, not wall time: the machine is
//! shared) of: rendering (the `TOKENIZER_JSON`'s chat template, or kvgate's own rendering with
//! the built-in cl100k), tokenizing the whole text, and tokenizing through one cache kept
//! across turns; and checks that both give the same ids. The second table does the same with a
//! 50-word user message per turn (a short follow-up).

use kvgate_gateway::token_cache::{DEFAULT_BUDGET_BYTES, SplitRule, TokenCache};
use kvgate_gateway::tokenizer::GatewayTokenizer;
use std::path::PathBuf;

fn cpu_ms() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid pointer to a timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 * 1e3 + ts.tv_nsec as f64 / 1e6
}

/// `n` words from a seeded xorshift over a small vocabulary, with a newline every ~40 words.
fn words(n: usize, seed: &mut u64) -> String {
    const VOCAB: [&str; 24] = [
        "the", "router", "pod", "cache", "prefix", "token", "block", "engine", "request",
        "latency", "model", "fleet", "gate", "score", "queue", "decode", "prefill", "batch",
        "hash", "turn", "agent", "tool", "context", "window",
    ];
    let mut out = String::with_capacity(n * 7);
    for i in 0..n {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        out.push_str(VOCAB[(*seed % VOCAB.len() as u64) as usize]);
        out.push(if i % 40 == 39 { '\n' } else { ' ' });
    }
    out
}

fn main() {
    let mut args = std::env::args().skip(1);
    let path = args.next().filter(|a| a != "-").map(PathBuf::from);
    let turns: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(4);
    let tokenizer = GatewayTokenizer::load(path.as_deref(), None).expect("load the tokenizer");
    let rule = tokenizer.split_rule().unwrap_or_else(|why| {
        eprintln!("no split rule ({why}): whole prompts only");
        SplitRule::Whole
    });
    println!("tokenizer: {}; split rule: {rule:?}", tokenizer.describe());
    for user_words in [8000, 50] {
        let cache = TokenCache::new(rule.clone(), DEFAULT_BUDGET_BYTES);
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut messages =
            vec![serde_json::json!({"role": "system", "content": words(60_000, &mut seed)})];
        println!(
            "\n{user_words}-word user turns\n| turn | body KB | tokens | render ms | full tokenize ms | reusing ms | reused | speed-up |"
        );
        println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
        for turn in 1..=turns {
            if turn > 1 {
                messages.push(
                    serde_json::json!({"role": "assistant", "content": words(200, &mut seed)}),
                );
            }
            messages
                .push(serde_json::json!({"role": "user", "content": words(user_words, &mut seed)}));
            let body = serde_json::to_vec(&serde_json::json!({"model": "m", "messages": messages}))
                .unwrap();
            let t0 = cpu_ms();
            let (text, special) = match tokenizer.render_chat(&body) {
                Some(r) => {
                    let r = r.expect("render");
                    (r.text, r.add_special_tokens)
                }
                None => (
                    kvgate_core::request::render_chat(&messages, None).expect("render"),
                    false,
                ),
            };
            let t1 = cpu_ms();
            let full = tokenizer.encode_with(&text, special).unwrap();
            let t2 = cpu_ms();
            let (reused, stats) = tokenizer.encode_reusing(Some(&cache), &text, special);
            let t3 = cpu_ms();
            assert_eq!(reused.unwrap(), full, "turn {turn}: the reused ids differ");
            println!(
                "| {turn} | {:.0} | {} | {:.2} | {:.2} | {:.2} | {:.1} % | {:.0}× |",
                body.len() as f64 / 1e3,
                full.len(),
                t1 - t0,
                t2 - t1,
                t3 - t2,
                100.0 * stats.reused_bytes as f64 / text.len() as f64,
                (t2 - t1) / (t3 - t2),
            );
        }
        println!(
            "cache holds {:.1} MiB",
            cache.held_bytes() as f64 / (1 << 20) as f64
        );
    }
}
