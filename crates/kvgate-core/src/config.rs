//! Router configuration: every policy parameter with its default, in one flat struct.
//!
//! Keys are snake_case; llm-d's camelCase names (`affinityGateTau`, `epsilonExploreSticky`,
//! `affinityMaxTTFTPenaltyMs`, `blockSizeTokens`, `lruCapacityPerServer`) are accepted too, so
//! existing configs carry over. Unknown keys are an error (a typo must not silently fall back to
//! a default). [`RouterConfig::validate`] rejects out-of-range values.

use crate::blocks::{DEFAULT_BLOCK_SIZE_TOKENS, DEFAULT_CHARS_PER_TOKEN};
use crate::index::DEFAULT_POD_CAPACITY_BLOCKS;
use serde::{Deserialize, Serialize};
use thiserror::Error;

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RouterConfig {
    // ---- affinity gate (DESIGN.md §2; defaults from llm-d's predicted-latency scorer) ----
    /// Pods whose prefix score is strictly above this are sticky. Default 0.80.
    #[serde(alias = "affinityGateTau")]
    pub affinity_gate_tau: f64,
    /// Probability of skipping the gate and considering every pod. Default 0.01.
    #[serde(alias = "epsilonExploreSticky")]
    pub epsilon_explore_sticky: f64,
    /// Break affinity when the best sticky pod's predicted TTFT exceeds the best pod's by more
    /// than this. Default 5000 ms; 0 disables the load gate (as upstream).
    #[serde(alias = "affinityMaxTTFTPenaltyMs", alias = "affinityMaxTtftPenaltyMs")]
    pub affinity_max_ttft_penalty_ms: f64,

    // ---- weighted (llm-d's default scorer weights without a predictor) ----
    #[serde(alias = "prefixWeight")]
    pub weighted_prefix_weight: f64,
    #[serde(alias = "queueWeight")]
    pub weighted_queue_weight: f64,
    #[serde(alias = "kvCacheWeight")]
    pub weighted_kv_weight: f64,

    // ---- sglang-cache-aware (SGLang router CLI defaults) ----
    pub cache_threshold: f64,
    pub balance_abs_threshold: f64,
    pub balance_rel_threshold: f64,

    // ---- dynamo-kv (NVIDIA Dynamo KV router defaults) ----
    pub overlap_score_weight: f64,
    pub router_temperature: f64,

    // ---- prompt blocks and index ----
    #[serde(alias = "blockSizeTokens")]
    pub block_size_tokens: u32,
    #[serde(alias = "averageCharactersPerToken")]
    pub chars_per_token: u32,
    /// Routed-index capacity per pod when the pod has not reported its KV blocks. Default 31,250.
    #[serde(alias = "lruCapacityPerServer")]
    pub lru_capacity_per_server: u32,
}

impl Default for RouterConfig {
    fn default() -> Self {
        RouterConfig {
            affinity_gate_tau: 0.80,
            epsilon_explore_sticky: 0.01,
            affinity_max_ttft_penalty_ms: 5000.0,
            weighted_prefix_weight: 3.0,
            weighted_queue_weight: 2.0,
            weighted_kv_weight: 2.0,
            cache_threshold: 0.3,
            balance_abs_threshold: 64.0,
            balance_rel_threshold: 1.5,
            overlap_score_weight: 1.0,
            router_temperature: 0.0,
            block_size_tokens: DEFAULT_BLOCK_SIZE_TOKENS,
            chars_per_token: DEFAULT_CHARS_PER_TOKEN,
            lru_capacity_per_server: DEFAULT_POD_CAPACITY_BLOCKS,
        }
    }
}

#[derive(Debug, Error, PartialEq)]
pub enum ConfigError {
    #[error("{key} = {value} is out of range: {expected}")]
    OutOfRange {
        key: &'static str,
        value: f64,
        expected: &'static str,
    },
    #[error("invalid config: {0}")]
    Parse(String),
}

impl RouterConfig {
    /// Parses a JSON object (snake_case or camelCase keys) and validates it.
    pub fn from_json(value: &serde_json::Value) -> Result<Self, ConfigError> {
        let config: RouterConfig =
            serde_json::from_value(value.clone()).map_err(|e| ConfigError::Parse(e.to_string()))?;
        config.validate()?;
        Ok(config)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        fn check(
            key: &'static str,
            value: f64,
            ok: bool,
            expected: &'static str,
        ) -> Result<(), ConfigError> {
            if ok && value.is_finite() {
                Ok(())
            } else {
                Err(ConfigError::OutOfRange {
                    key,
                    value,
                    expected,
                })
            }
        }
        let unit = |v: f64| (0.0..=1.0).contains(&v);
        check(
            "affinity_gate_tau",
            self.affinity_gate_tau,
            unit(self.affinity_gate_tau),
            "0 <= tau <= 1",
        )?;
        check(
            "epsilon_explore_sticky",
            self.epsilon_explore_sticky,
            unit(self.epsilon_explore_sticky),
            "0 <= epsilon <= 1",
        )?;
        check(
            "affinity_max_ttft_penalty_ms",
            self.affinity_max_ttft_penalty_ms,
            self.affinity_max_ttft_penalty_ms >= 0.0,
            ">= 0 (0 disables the load gate)",
        )?;
        for (key, v) in [
            ("weighted_prefix_weight", self.weighted_prefix_weight),
            ("weighted_queue_weight", self.weighted_queue_weight),
            ("weighted_kv_weight", self.weighted_kv_weight),
        ] {
            check(key, v, v >= 0.0, ">= 0")?;
        }
        let total =
            self.weighted_prefix_weight + self.weighted_queue_weight + self.weighted_kv_weight;
        check("weighted_*_weight (sum)", total, total > 0.0, "> 0")?;
        check(
            "cache_threshold",
            self.cache_threshold,
            unit(self.cache_threshold),
            "0 <= threshold <= 1",
        )?;
        check(
            "balance_abs_threshold",
            self.balance_abs_threshold,
            self.balance_abs_threshold >= 0.0,
            ">= 0",
        )?;
        check(
            "balance_rel_threshold",
            self.balance_rel_threshold,
            self.balance_rel_threshold >= 1.0,
            ">= 1",
        )?;
        check(
            "overlap_score_weight",
            self.overlap_score_weight,
            self.overlap_score_weight >= 0.0,
            ">= 0",
        )?;
        check(
            "router_temperature",
            self.router_temperature,
            self.router_temperature >= 0.0,
            ">= 0",
        )?;
        let bs = self.block_size_tokens as f64;
        check(
            "block_size_tokens",
            bs,
            (1.0..=4096.0).contains(&bs),
            "1..=4096",
        )?;
        let cpt = self.chars_per_token as f64;
        check(
            "chars_per_token",
            cpt,
            (1.0..=64.0).contains(&cpt),
            "1..=64",
        )?;
        let cap = self.lru_capacity_per_server as f64;
        check("lru_capacity_per_server", cap, cap >= 1.0, ">= 1")?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn defaults_are_the_documented_ones() {
        let c = RouterConfig::default();
        assert_eq!(c.affinity_gate_tau, 0.80);
        assert_eq!(c.epsilon_explore_sticky, 0.01);
        assert_eq!(c.affinity_max_ttft_penalty_ms, 5000.0);
        assert_eq!(c.block_size_tokens, 16);
        assert_eq!(c.lru_capacity_per_server, 31_250);
        assert_eq!(c.validate(), Ok(()));
    }

    #[test]
    fn camel_case_llmd_names_are_accepted() {
        let c = RouterConfig::from_json(&json!({
            "affinityGateTau": 0.9, "epsilonExploreSticky": 0.0, "affinityMaxTTFTPenaltyMs": 100
        }))
        .unwrap();
        assert_eq!(c.affinity_gate_tau, 0.9);
        assert_eq!(c.epsilon_explore_sticky, 0.0);
        assert_eq!(c.affinity_max_ttft_penalty_ms, 100.0);
    }

    #[test]
    fn out_of_range_values_are_rejected_with_the_key() {
        let err = RouterConfig::from_json(&json!({"affinity_gate_tau": 1.5})).unwrap_err();
        assert!(err.to_string().contains("affinity_gate_tau"), "{err}");
        let err = RouterConfig::from_json(&json!({"epsilon_explore_sticky": -0.1})).unwrap_err();
        assert!(err.to_string().contains("epsilon_explore_sticky"), "{err}");
        let err =
            RouterConfig::from_json(&json!({"affinity_max_ttft_penalty_ms": -1})).unwrap_err();
        assert!(
            err.to_string().contains("affinity_max_ttft_penalty_ms"),
            "{err}"
        );
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let err = RouterConfig::from_json(&json!({"affinity_gate_tua": 0.5})).unwrap_err();
        assert!(matches!(err, ConfigError::Parse(_)), "{err}");
    }
}
