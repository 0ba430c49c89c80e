//! Analytic cold-start estimates, used for a class until it has `min_samples` samples, and the
//! same formulas written as regressor weights (the prior the RLS models shrink towards).
//!
//! - TTFT_ms = `ttft_t0_ms` + (prefill tokens in flight + own uncached prompt tokens)
//!   / `peak_prefill_tokens_per_s` × 1000 — llm-d's throughput-derived TTFT estimate
//!   (reference/llmd-predicted-latency.md §1.2, #1547) plus one engine step of fixed cost.
//! - TPOT_ms = `tpot_t0_ms` + `tpot_per_running_seq_ms` × running +
//!   `tpot_per_context_token_ms` × decode tokens in flight — one decode step of the
//!   DESIGN.md §6 step-time model `t0 + b·(decode seqs) + k·(context tokens read)`.

use super::PredictorConfig;
use super::features::{
    DECODE_TOKENS_SCALE, Features, PROMPT_TOKENS_SCALE, RUNNING_SCALE, TPOT_BIAS,
    TPOT_DECODE_IN_FLIGHT, TPOT_DIM, TPOT_RUNNING, TTFT_BIAS, TTFT_DIM, TTFT_PREFILL_IN_FLIGHT,
    TTFT_UNCACHED,
};

pub(crate) fn ttft_ms(config: &PredictorConfig, f: &Features) -> f64 {
    config.ttft_t0_ms
        + (f.prefill_tokens_in_flight + f.uncached_prompt_tokens())
            / config.peak_prefill_tokens_per_s
            * 1000.0
}

pub(crate) fn tpot_ms(config: &PredictorConfig, f: &Features) -> f64 {
    config.tpot_t0_ms
        + config.tpot_per_running_seq_ms * f.running
        + config.tpot_per_context_token_ms * f.decode_tokens_in_flight
}

/// [`ttft_ms`] as weights on [`Features::ttft_vector`].
pub(crate) fn ttft_prior(config: &PredictorConfig) -> [f64; TTFT_DIM] {
    let ms_per_scaled_token = PROMPT_TOKENS_SCALE / config.peak_prefill_tokens_per_s * 1000.0;
    let mut w = [0.0; TTFT_DIM];
    w[TTFT_BIAS] = config.ttft_t0_ms;
    w[TTFT_UNCACHED] = ms_per_scaled_token;
    w[TTFT_PREFILL_IN_FLIGHT] = ms_per_scaled_token;
    w
}

/// [`tpot_ms`] as weights on [`Features::tpot_vector`].
pub(crate) fn tpot_prior(config: &PredictorConfig) -> [f64; TPOT_DIM] {
    let mut w = [0.0; TPOT_DIM];
    w[TPOT_BIAS] = config.tpot_t0_ms;
    w[TPOT_RUNNING] = config.tpot_per_running_seq_ms * RUNNING_SCALE;
    w[TPOT_DECODE_IN_FLIGHT] = config.tpot_per_context_token_ms * DECODE_TOKENS_SCALE;
    w
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dot<const D: usize>(w: &[f64; D], x: &[f64; D]) -> f64 {
        w.iter().zip(x).map(|(w, x)| w * x).sum()
    }

    #[test]
    fn analytic_ttft_is_t0_plus_prefill_work_over_peak_throughput() {
        let config = PredictorConfig::default();
        let f = Features {
            prefill_tokens_in_flight: 15_928.0,
            input_tokens: 2000.0,
            prefix_score: 0.5,
            ..Features::default()
        };
        // 6 ms + (15 928 + 1000) tokens / 15 928 tok/s.
        let expected = 6.0 + (15_928.0 + 1000.0) / 15_928.0 * 1000.0;
        assert!((ttft_ms(&config, &f) - expected).abs() < 1e-9);
    }

    #[test]
    fn analytic_tpot_is_step_t0_plus_per_sequence_and_context_terms() {
        let config = PredictorConfig::default();
        let f = Features {
            running: 100.0,
            decode_tokens_in_flight: 50_000.0,
            ..Features::default()
        };
        let expected = 6.0 + 0.006 * 100.0 + 0.000_04 * 50_000.0;
        assert!((tpot_ms(&config, &f) - expected).abs() < 1e-9);
    }

    #[test]
    fn priors_reproduce_the_analytic_formulas_on_encoded_features() {
        let config = PredictorConfig::default();
        let f = Features {
            kv_usage: 0.7,
            waiting: 3.0,
            running: 40.0,
            prefill_tokens_in_flight: 9000.0,
            decode_tokens_in_flight: 123_456.0,
            input_tokens: 3000.0,
            prefix_score: 0.3,
            kv_capacity_tokens: 100_000.0,
        };
        let ttft = dot(&ttft_prior(&config), &f.ttft_vector());
        let tpot = dot(&tpot_prior(&config), &f.tpot_vector());
        assert!((ttft - ttft_ms(&config, &f)).abs() < 1e-9);
        assert!((tpot - tpot_ms(&config, &f)).abs() < 1e-9);
    }
}
