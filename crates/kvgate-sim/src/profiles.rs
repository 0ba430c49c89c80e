//! Step-time profiles of simulated pods, calibrated from `shared/profiles/`.
//!
//! One engine step (one vLLM scheduler iteration) takes
//!
//! ```text
//! step_us = t0 + a·(uncached prefill tokens) + b·(decode sequences) + k·(context tokens read)
//!              + k2·(context tokens read)² + q·(prefill attention pairs)
//! ```
//!
//! `k2` makes the cost per context token grow with the tokens a step reads: on a real CPU vLLM
//! it is ~1.9 µs per token at ~9k tokens read per step and ~4 µs at ~60k
//! (`scripts/real-vllm/calibrate.py`); the GPU profiles keep `k2 = 0`.
//!
//! `q` is the cost of one (new prefill token, context token) pair of causal attention, so a
//! prefill's cost grows with the square of its length. The GPU profiles below keep `q = 0`
//! (BLIS's linear fits absorb it over their prompt range); a measured profile may set it
//! (`scripts/real-vllm/calibrate.py` fits it on a real CPU vLLM, where a 4,000-token prompt
//! costs 1.4× what the linear fit says).
//!
//! (DESIGN.md §6, `reference/interfaces.md` §4.4). `t0`, `a`, `b` and `kv_blocks` come from the
//! BLIS black-box fits (`shared/profiles/blis/blackbox_coefficients.csv`, columns `beta0_us`,
//! `beta1_us_per_uncached_prefill_token`, `beta2_us_per_decode_token`, `total_kv_blocks`), which
//! were fitted end to end against real vLLM v0.8.4 runs and so already include attention, sampling
//! and CPU overhead. BLIS has no context-length term; `k` is the cost of streaming the KV cache
//! through HBM once per step: KV bytes per token per GPU / HBM bandwidth. Llama-3-8B has
//! 32 layers × 8 KV heads × 128 dims × 2 (K and V) × 2 bytes (bf16) = 131,072 B/token;
//! Llama-3-70B has 80 layers, so 327,680 B/token. With tensor parallelism each GPU holds
//! `1/TP` of the KV heads and the GPUs read in parallel, so `k` divides by TP. Bandwidths:
//! H100 SXM 3.35 TB/s, A100-80GB SXM 2.039 TB/s (vendor datasheets).
//!
//! | profile | CSV row (model, GPU, TP, vLLM, source_commit) | t0 = β0 | a = β1 | b = β2 | k | kv_blocks |
//! |---|---|---:|---:|---:|---:|---:|
//! | `llama3-8b-h100` | meta-llama/llama-3.1-8b-instruct, H100, 1, v0.8.4, `3d79c654` | 5,752.7 µs | 17.25 µs | 6.00 µs | 131072/3.35e12 s = 0.039 µs | 29,205 |
//! | `llama3-8b-a100` | meta-llama/llama-3.1-8b-instruct, A100-80, 1, v0.8.4, `938f8d88` | 16,441.5 µs | 47.84 µs | 18.21 µs | 131072/2.039e12 s = 0.064 µs | 29,205 |
//! | `llama3-8b-h100-tp2` | meta-llama/llama-3.1-8b-instruct, H100, 2, v0.8.4, `938f8d88` | 6,910.4 µs | 17.67 µs | 2.84 µs | 0.039/2 = 0.020 µs | 132,139 |
//! | `llama3-8b-a100-tp2` | meta-llama/llama-3.1-8b-instruct, A100-80, 2, v0.8.4, `938f8d88` | 8,001.6 µs | 26.36 µs | 14.97 µs | 0.064/2 = 0.032 µs | 132,139 |
//! | `llama3-70b-h100-tp4` | meta-llama/llama-3.3-70b-instruct, H100, 4, v0.8.4, `938f8d88` | 12,601.3 µs | 76.42 µs | 66.84 µs | 327680/4/3.35e12 s = 0.024 µs | 128,273 |
//!
//! Cross-check of `a` against vidur's operator profiles (`shared/profiles/vidur/`, non-attention
//! time of a forward pass = `emb + 32 × Σ(other ops)`, medians): H100 Llama-2-7B TP1
//! (`mlp_h100_Llama-2-7b-hf.csv`, rows num_tokens 2048 → 4096) (83.06 − 40.59) ms / 2048 tokens
//! = 20.7 µs/token, TP2 (44.10 − 22.06) / 2048 = 10.8 µs/token; A100 Llama-3-8B TP1
//! (`mlp_a100_Meta-Llama-3-8B.csv`, rows 4096 → 8192) (543.09 − 273.17) / 4096 = 65.9 µs/token,
//! TP2 (293.87 − 143.55) / 4096 = 36.7 µs/token. The H100 BLIS slopes agree within 20 %; on the
//! A100 BLIS fits a lower slope than vidur's compute-bound one (47.8 vs 65.9 µs/token) — we keep
//! the BLIS fit, which was made against whole vLLM runs, and note the gap. The vidur floor at one
//! token (H100 5.6 ms, A100 9.7 ms) matches the order of `t0`.
//!
//! `max_num_batched_tokens` (8192) and `max_num_seqs` (256) are vLLM v1's defaults for these GPUs;
//! `max_model_len` is the model's `max_position_embeddings` (131,072 for Llama-3.1/3.3).

/// A profile that could not be found or read.
#[derive(Debug, thiserror::Error)]
#[error("profile {source_name:?}: {message}")]
pub struct ProfileError {
    pub source_name: String,
    pub message: String,
}

/// Step-time and capacity profile of one simulated pod (one vLLM engine).
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    /// Name used in configs and on the command line (`llama3-8b-h100`).
    pub name: &'static str,
    /// Fixed cost of a step, in microseconds.
    pub t0_us: f64,
    /// Cost per uncached prefill token computed in the step, in microseconds.
    pub a_us_per_prefill_token: f64,
    /// Cost per sequence decoding one token in the step, in microseconds.
    pub b_us_per_decode_seq: f64,
    /// Cost per context token whose KV is read by the step's attention, in microseconds.
    pub k_us_per_context_token: f64,
    /// Cost per squared context token read by the step, in microseconds; 0 in the built-in
    /// profiles.
    pub k2_us_per_context_token_sq: f64,
    /// Cost per prefill attention pair (a new prompt token × a token before it), in
    /// microseconds; 0 in the built-in profiles.
    pub q_us_per_prefill_pair: f64,
    /// GPU KV-cache blocks of 16 tokens.
    pub kv_blocks: u32,
    /// Tokens per block of the engine's prefix cache, a multiple of 16: prefix hits are whole
    /// blocks of this size (vLLM's CUDA default 16; vLLM CPU uses 128). `kv_blocks` still
    /// counts 16-token blocks.
    pub block_size_tokens: u32,
    /// Token budget of one step (vLLM `max_num_batched_tokens`).
    pub max_num_batched_tokens: u32,
    /// Most requests running at once (vLLM `max_num_seqs`).
    pub max_num_seqs: u32,
    /// Longest prompt + output a request may have (vLLM `max_model_len`).
    pub max_model_len: u32,
}

/// KV-cache bytes per token of Llama-3-8B: 32 layers × 8 KV heads × 128 dims × 2 (K, V) × 2 bytes.
const LLAMA3_8B_KV_BYTES_PER_TOKEN: f64 = 131_072.0;
/// KV-cache bytes per token of Llama-3-70B: 80 layers × 8 KV heads × 128 dims × 2 × 2 bytes.
const LLAMA3_70B_KV_BYTES_PER_TOKEN: f64 = 327_680.0;
/// H100 SXM HBM3 bandwidth in bytes per microsecond (3.35 TB/s).
const H100_HBM_BYTES_PER_US: f64 = 3.35e6;
/// A100-80GB SXM HBM2e bandwidth in bytes per microsecond (2.039 TB/s).
const A100_HBM_BYTES_PER_US: f64 = 2.039e6;

fn default_block_size() -> u32 {
    16
}

/// The profiles, default first. See the module docs for where each number comes from.
static PROFILES: [Profile; 5] = [
    Profile {
        name: "llama3-8b-h100",
        t0_us: 5752.705191,
        a_us_per_prefill_token: 17.250864,
        b_us_per_decode_seq: 5.999144,
        k_us_per_context_token: LLAMA3_8B_KV_BYTES_PER_TOKEN / H100_HBM_BYTES_PER_US,
        k2_us_per_context_token_sq: 0.0,
        q_us_per_prefill_pair: 0.0,
        kv_blocks: 29_205,
        block_size_tokens: 16,
        max_num_batched_tokens: 8192,
        max_num_seqs: 256,
        max_model_len: 131_072,
    },
    Profile {
        name: "llama3-8b-a100",
        t0_us: 16441.531547,
        a_us_per_prefill_token: 47.837412,
        b_us_per_decode_seq: 18.205606,
        k_us_per_context_token: LLAMA3_8B_KV_BYTES_PER_TOKEN / A100_HBM_BYTES_PER_US,
        k2_us_per_context_token_sq: 0.0,
        q_us_per_prefill_pair: 0.0,
        kv_blocks: 29_205,
        block_size_tokens: 16,
        max_num_batched_tokens: 8192,
        max_num_seqs: 256,
        max_model_len: 131_072,
    },
    Profile {
        name: "llama3-8b-h100-tp2",
        t0_us: 6910.42048,
        a_us_per_prefill_token: 17.670575,
        b_us_per_decode_seq: 2.837747,
        k_us_per_context_token: LLAMA3_8B_KV_BYTES_PER_TOKEN / 2.0 / H100_HBM_BYTES_PER_US,
        k2_us_per_context_token_sq: 0.0,
        q_us_per_prefill_pair: 0.0,
        kv_blocks: 132_139,
        block_size_tokens: 16,
        max_num_batched_tokens: 8192,
        max_num_seqs: 256,
        max_model_len: 131_072,
    },
    Profile {
        name: "llama3-8b-a100-tp2",
        t0_us: 8001.630598,
        a_us_per_prefill_token: 26.362876,
        b_us_per_decode_seq: 14.969035,
        k_us_per_context_token: LLAMA3_8B_KV_BYTES_PER_TOKEN / 2.0 / A100_HBM_BYTES_PER_US,
        k2_us_per_context_token_sq: 0.0,
        q_us_per_prefill_pair: 0.0,
        kv_blocks: 132_139,
        block_size_tokens: 16,
        max_num_batched_tokens: 8192,
        max_num_seqs: 256,
        max_model_len: 131_072,
    },
    Profile {
        name: "llama3-70b-h100-tp4",
        t0_us: 12601.271149,
        a_us_per_prefill_token: 76.422841,
        b_us_per_decode_seq: 66.843962,
        k_us_per_context_token: LLAMA3_70B_KV_BYTES_PER_TOKEN / 4.0 / H100_HBM_BYTES_PER_US,
        k2_us_per_context_token_sq: 0.0,
        q_us_per_prefill_pair: 0.0,
        kv_blocks: 128_273,
        block_size_tokens: 16,
        max_num_batched_tokens: 8192,
        max_num_seqs: 256,
        max_model_len: 131_072,
    },
];

impl Profile {
    /// Name of the default profile.
    pub const DEFAULT_NAME: &'static str = "llama3-8b-h100";

    /// The profile called `name`, if there is one.
    pub fn by_name(name: &str) -> Option<&'static Profile> {
        PROFILES.iter().find(|p| p.name == name)
    }

    /// The default profile, `llama3-8b-h100`.
    pub fn default_profile() -> &'static Profile {
        &PROFILES[0]
    }

    /// Names of all profiles, default first.
    pub fn names() -> impl Iterator<Item = &'static str> {
        PROFILES.iter().map(|p| p.name)
    }

    /// All profiles, default first.
    pub fn all() -> &'static [Profile] {
        &PROFILES
    }

    /// A built-in profile by name, or one read from a JSON file when `name_or_path` ends in
    /// `.json` ([`Profile::from_json`]; e.g. what `scripts/real-vllm/calibrate.py --profile-out`
    /// writes after measuring a real engine).
    pub fn resolve(name_or_path: &str) -> Result<&'static Profile, ProfileError> {
        if name_or_path.ends_with(".json") {
            let text = std::fs::read_to_string(name_or_path).map_err(|e| ProfileError {
                source_name: name_or_path.to_string(),
                message: e.to_string(),
            })?;
            return Profile::from_json(name_or_path, &text);
        }
        Profile::by_name(name_or_path).ok_or_else(|| ProfileError {
            source_name: name_or_path.to_string(),
            message: format!(
                "unknown profile; expected one of {}, or a path ending in .json",
                Profile::names().collect::<Vec<_>>().join(", ")
            ),
        })
    }

    /// A profile from JSON: the fields of [`Profile`] by name (`name`, `t0_us`,
    /// `a_us_per_prefill_token`, `b_us_per_decode_seq`, `k_us_per_context_token`,
    /// `k2_us_per_context_token_sq` and `q_us_per_prefill_pair` (optional, 0 when absent), `kv_blocks`, `block_size_tokens` (optional, 16 when absent; a
    /// multiple of 16 up to 4096), `max_num_batched_tokens`, `max_num_seqs`, `max_model_len`;
    /// unknown fields are refused),
    /// every number finite, costs ≥ 0 and capacities ≥ 1. The profile lives as long as the
    /// process (it is leaked, like the built-in ones are static): load each file once.
    pub fn from_json(source_name: &str, text: &str) -> Result<&'static Profile, ProfileError> {
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct File {
            name: String,
            t0_us: f64,
            a_us_per_prefill_token: f64,
            b_us_per_decode_seq: f64,
            k_us_per_context_token: f64,
            #[serde(default)]
            k2_us_per_context_token_sq: f64,
            #[serde(default)]
            q_us_per_prefill_pair: f64,
            kv_blocks: u32,
            #[serde(default = "default_block_size")]
            block_size_tokens: u32,
            max_num_batched_tokens: u32,
            max_num_seqs: u32,
            max_model_len: u32,
        }
        let err = |message: String| ProfileError {
            source_name: source_name.to_string(),
            message,
        };
        let f: File = serde_json::from_str(text).map_err(|e| err(e.to_string()))?;
        let costs = [
            ("t0_us", f.t0_us),
            ("a_us_per_prefill_token", f.a_us_per_prefill_token),
            ("b_us_per_decode_seq", f.b_us_per_decode_seq),
            ("k_us_per_context_token", f.k_us_per_context_token),
            ("k2_us_per_context_token_sq", f.k2_us_per_context_token_sq),
            ("q_us_per_prefill_pair", f.q_us_per_prefill_pair),
        ];
        if let Some((key, v)) = costs.iter().find(|(_, v)| !v.is_finite() || *v < 0.0) {
            return Err(err(format!("{key} = {v}: expected a finite number ≥ 0")));
        }
        let capacities = [
            ("kv_blocks", f.kv_blocks),
            ("max_num_batched_tokens", f.max_num_batched_tokens),
            ("max_num_seqs", f.max_num_seqs),
            ("max_model_len", f.max_model_len),
        ];
        if let Some((key, _)) = capacities.iter().find(|(_, v)| *v == 0) {
            return Err(err(format!("{key} = 0: expected at least 1")));
        }
        if f.block_size_tokens == 0
            || !f.block_size_tokens.is_multiple_of(16)
            || f.block_size_tokens > 4096
        {
            return Err(err(format!(
                "block_size_tokens = {}: expected a multiple of 16, at most 4096",
                f.block_size_tokens
            )));
        }
        if f.name.is_empty() {
            return Err(err("name is empty".into()));
        }
        Ok(Box::leak(Box::new(Profile {
            name: Box::leak(f.name.into_boxed_str()),
            t0_us: f.t0_us,
            a_us_per_prefill_token: f.a_us_per_prefill_token,
            b_us_per_decode_seq: f.b_us_per_decode_seq,
            k_us_per_context_token: f.k_us_per_context_token,
            k2_us_per_context_token_sq: f.k2_us_per_context_token_sq,
            q_us_per_prefill_pair: f.q_us_per_prefill_pair,
            kv_blocks: f.kv_blocks,
            block_size_tokens: f.block_size_tokens,
            max_num_batched_tokens: f.max_num_batched_tokens,
            max_num_seqs: f.max_num_seqs,
            max_model_len: f.max_model_len,
        })))
    }

    /// The JSON form [`Profile::from_json`] reads (every field, pretty-printed).
    pub fn to_json(&self) -> String {
        let value = serde_json::json!({
            "name": self.name,
            "t0_us": self.t0_us,
            "a_us_per_prefill_token": self.a_us_per_prefill_token,
            "b_us_per_decode_seq": self.b_us_per_decode_seq,
            "k_us_per_context_token": self.k_us_per_context_token,
            "k2_us_per_context_token_sq": self.k2_us_per_context_token_sq,
            "q_us_per_prefill_pair": self.q_us_per_prefill_pair,
            "kv_blocks": self.kv_blocks,
            "block_size_tokens": self.block_size_tokens,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "max_num_seqs": self.max_num_seqs,
            "max_model_len": self.max_model_len,
        });
        let mut text = serde_json::to_string_pretty(&value).unwrap_or_default();
        text.push('\n');
        text
    }

    /// Duration of one step in milliseconds.
    pub fn step_ms(
        &self,
        prefill_tokens: u64,
        decode_seqs: u64,
        context_tokens_read: u64,
        prefill_attention_pairs: u64,
    ) -> f64 {
        (self.t0_us
            + self.a_us_per_prefill_token * prefill_tokens as f64
            + self.b_us_per_decode_seq * decode_seqs as f64
            + self.k_us_per_context_token * context_tokens_read as f64
            + self.k2_us_per_context_token_sq * (context_tokens_read as f64).powi(2)
            + self.q_us_per_prefill_pair * prefill_attention_pairs as f64)
            / 1000.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CALIBRATED: &str = r#"{"name": "tiny-cpu", "t0_us": 9000.5, "a_us_per_prefill_token": 80.0,
        "b_us_per_decode_seq": 300.0, "k_us_per_context_token": 0.01, "kv_blocks": 4096,
        "max_num_batched_tokens": 2048, "max_num_seqs": 128, "max_model_len": 4096}"#;

    #[test]
    fn a_profile_file_gives_its_numbers() {
        let p = Profile::from_json("calibrated.json", CALIBRATED).unwrap();
        assert_eq!(p.name, "tiny-cpu");
        assert_eq!(p.max_num_batched_tokens, 2048);
        // 9,000.5 + 80 × 100 + 300 × 2 + 0.01 × 1,000 µs.
        assert!((p.step_ms(100, 2, 1_000, 0) - 17.6105).abs() < 1e-9);
    }

    #[test]
    fn the_block_size_is_read_16_when_absent_and_refused_unless_a_multiple_of_16() {
        assert_eq!(
            Profile::from_json("a.json", CALIBRATED)
                .unwrap()
                .block_size_tokens,
            16
        );
        let with = |v: &str| {
            CALIBRATED.replace(
                r#""kv_blocks": 4096,"#,
                &format!(r#""kv_blocks": 4096, "block_size_tokens": {v},"#),
            )
        };
        let p = Profile::from_json("b.json", &with("128")).unwrap();
        assert_eq!(p.block_size_tokens, 128);
        assert!(p.to_json().contains(r#""block_size_tokens": 128"#));
        for bad in ["0", "100", "8192"] {
            let e = Profile::from_json("c.json", &with(bad)).unwrap_err();
            assert!(
                e.message.contains("block_size_tokens"),
                "{bad}: {}",
                e.message
            );
        }
    }

    #[test]
    fn the_quadratic_terms_are_read_and_costed() {
        let text = CALIBRATED.replace(
            r#""k_us_per_context_token": 0.01,"#,
            r#""k_us_per_context_token": 0.01, "k2_us_per_context_token_sq": 0.000001,
               "q_us_per_prefill_pair": 0.5,"#,
        );
        let p = Profile::from_json("quadratic.json", &text).unwrap();
        // 17.6105 ms as above + 1e-6 × 1,000² µs + 0.5 × 5,050 µs.
        assert!((p.step_ms(100, 2, 1_000, 5_050) - (17.6105 + 0.001 + 2.525)).abs() < 1e-9);
    }

    #[test]
    fn a_profile_written_as_json_reads_back_the_same() {
        let p = Profile::from_json(
            "q.json",
            &CALIBRATED.replace("0.01,", "0.01, \"q_us_per_prefill_pair\": 0.125,"),
        )
        .unwrap();
        let back = Profile::from_json("back.json", &p.to_json()).unwrap();
        assert_eq!(back, p);
    }

    #[test]
    fn bad_profile_files_are_refused_with_the_key_that_is_wrong() {
        let cases = [
            (CALIBRATED.replace("9000.5", "-1"), "t0_us"),
            (
                CALIBRATED.replace("\"kv_blocks\": 4096", "\"kv_blocks\": 0"),
                "kv_blocks",
            ),
            (CALIBRATED.replace("\"name\"", "\"nom\""), "unknown field"),
            ("{".to_string(), "EOF"),
        ];
        for (text, why) in cases {
            let e = Profile::from_json("f.json", &text).unwrap_err().to_string();
            assert!(e.contains(why), "{e} (expected {why})");
        }
        let e = Profile::resolve("no-such-profile").unwrap_err().to_string();
        assert!(e.contains("llama3-8b-h100"), "{e}");
        assert!(Profile::resolve("/nonexistent/calibrated.json").is_err());
    }

    #[test]
    fn default_profile_is_llama3_8b_h100_with_design_numbers() {
        let p = Profile::by_name(Profile::DEFAULT_NAME).unwrap();
        assert_eq!(p, Profile::default_profile());
        assert!((p.t0_us - 6000.0).abs() < 500.0);
        assert!((p.a_us_per_prefill_token - 18.0).abs() < 1.0);
        assert!((p.b_us_per_decode_seq - 6.0).abs() < 0.5);
        assert!((p.k_us_per_context_token - 0.04).abs() < 0.002);
        assert_eq!(p.kv_blocks, 29_205);
    }

    #[test]
    fn names_are_unique_and_resolvable() {
        let names: Vec<_> = Profile::names().collect();
        assert_eq!(names.len(), 5);
        for n in &names {
            assert_eq!(Profile::by_name(n).unwrap().name, *n);
            assert_eq!(names.iter().filter(|m| *m == n).count(), 1);
        }
        assert!(Profile::by_name("gpt-5").is_none());
    }

    #[test]
    fn step_ms_matches_the_formula() {
        let p = Profile::default_profile();
        // Design sanity check: a 4096-token uncached prefill on H100 8B ≈ 6 + 4096 × 0.018 ≈ 80 ms.
        let t = p.step_ms(4096, 0, 4096, 0);
        let expect =
            (p.t0_us + 4096.0 * p.a_us_per_prefill_token + 4096.0 * p.k_us_per_context_token)
                / 1000.0;
        assert_eq!(t, expect);
        assert!((t - 76.5).abs() < 1.0, "{t}");
    }
}
