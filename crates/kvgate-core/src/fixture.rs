//! Deterministic fleets for measuring the decision: the setup shared by `kvgate-core`'s
//! `decision` benchmark, the decision-rate example and the CI cost guard
//! (`kvgate-sim`'s `cost_guard` example), so that all of them measure the same decision.
//!
//! - [`prompt`]: pseudo-text of a given length, drawn from eight words by an LCG;
//! - [`trained_predictor`]: the default predictor after 2,000 samples of a linear pod;
//! - [`fleet`]: `n` pods of varied load (running, KV usage, prefill in flight);
//! - [`fleet_index`]: a routed index with one prompt cached on a quarter of the pods and an
//!   8,000-character prompt of its own on every pod;
//! - [`request`]: the measured request (8,000 input tokens, 16-token blocks);
//! - [`session`]: a `RouterSession` (default router config, affinity gate, seed 1) with the
//!   trained predictor and the fleet's index.
//!
//! Nothing here is used by routing itself.

use crate::BlockHasher;
use crate::index::PrefixIndex;
use crate::index::routed::RoutedIndex;
use crate::pod::PodSnapshot;
use crate::predictor::{Features, LatencyPredictor, PredictorConfig};

/// The pods' predictor class.
pub const CLASS: &str = "llama3-8b-h100";
/// The model the fixture's prompts are hashed for.
pub const MODEL: &str = "llama3-8b";
/// Each fixture pod's KV capacity in blocks.
const CAPACITY_BLOCKS: u32 = 29_000;

/// Deterministic pseudo-text of `chars` bytes: words drawn from a fixed list by an LCG
/// seeded with `salt`.
pub fn prompt(chars: usize, salt: u64) -> String {
    const WORDS: [&str; 8] = [
        "cache ", "router ", "token ", "prefix ", "latency ", "pod ", "gate ", "block ",
    ];
    let mut s = String::with_capacity(chars + 16);
    let mut x = salt
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    while s.len() < chars {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        s.push_str(WORDS[(x >> 61) as usize]);
    }
    s.truncate(chars);
    s
}

/// The default predictor trained on 2,000 samples of a pod whose TTFT is linear in its
/// uncached prompt and prefill in flight.
pub fn trained_predictor() -> LatencyPredictor {
    let mut p = LatencyPredictor::new(PredictorConfig::default());
    for i in 0..2000u64 {
        let mut pod = PodSnapshot::idle(0, CLASS, CAPACITY_BLOCKS);
        pod.running = (i % 17) as u32;
        pod.waiting = (i % 5) as u32;
        pod.kv_usage = (i % 10) as f64 / 10.0;
        pod.in_flight.prefill_tokens = (i * 37) % 20_000;
        let f = Features::new(&pod, 1000 + (i as u32 * 13) % 8000, (i % 4) as f64 / 4.0);
        let ttft = 6.0 + f.uncached_prompt_tokens() * 0.018 + f.prefill_tokens_in_flight * 0.018;
        p.observe(CLASS, &f, ttft, Some(6.0 + 0.2 * f.running));
    }
    p
}

/// `n` pods (ids `0..n`, pod `i` at index `i`) with varied load.
pub fn fleet(n: u32) -> Vec<PodSnapshot> {
    (0..n)
        .map(|i| {
            let mut p = PodSnapshot::idle(i, CLASS, CAPACITY_BLOCKS);
            p.running = i % 7;
            p.kv_usage = f64::from(i % 10) / 10.0;
            p.in_flight.prefill_tokens = (u64::from(i) * 997) % 8000;
            p
        })
        .collect()
}

/// A routed index with `text` cached on every fourth pod and an 8,000-character prompt of
/// its own on every pod.
pub fn fleet_index(pods: &[PodSnapshot], text: &str) -> RoutedIndex {
    let hasher = BlockHasher::default();
    let seed = BlockHasher::chain_seed(MODEL, None);
    let mut index = RoutedIndex::new();
    let (mut blocks, mut other) = (Vec::new(), Vec::new());
    hasher.hash_text(seed, text, &mut blocks);
    for p in pods {
        index.set_capacity(p.id, CAPACITY_BLOCKS);
        if p.id.0 % 4 == 0 {
            index.record_routed(p.id, &blocks);
        }
        other.clear();
        hasher.hash_text(seed, &prompt(8_000, 100 + u64::from(p.id.0)), &mut other);
        index.record_routed(p.id, &other);
    }
    index
}

/// The request the decision measurements route: `blocks`, 8,000 input tokens, 16-token
/// blocks, no SLO, adapter or session.
pub fn request(blocks: &[crate::BlockHash]) -> crate::RouteRequest<'_> {
    crate::RouteRequest {
        blocks,
        input_tokens: 8000,
        block_size_tokens: 16,
        other_sizes: &[],
        slo: Default::default(),
        adapter: None,
    }
}

/// The session the decision measurements route through: the default router config, the
/// affinity gate, seed 1, [`trained_predictor`] and [`fleet_index`]`(pods, text)`.
pub fn session(pods: &[PodSnapshot], text: &str) -> crate::RouterSession {
    let mut session = crate::RouterSession::new(
        crate::RouterConfig::default(),
        crate::policy::PolicyKind::AffinityGate,
        PredictorConfig::default(),
        1,
    );
    session.set_predictor(trained_predictor());
    session.index_mut().routed = fleet_index(pods, text);
    session
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fixture_caches_the_prompt_on_a_quarter_of_the_pods() {
        let pods = fleet(8);
        let text = prompt(32_000, 1);
        assert_eq!(text.len(), 32_000);
        let index = fleet_index(&pods, &text);
        let mut blocks = Vec::new();
        BlockHasher::default().hash_text(BlockHasher::chain_seed(MODEL, None), &text, &mut blocks);
        let mut matched = Vec::new();
        index.match_prefix(&blocks, &mut matched);
        let holders: Vec<usize> = (0..matched.len())
            .filter(|&p| matched[p] as usize == blocks.len())
            .collect();
        assert_eq!(holders, vec![0, 4]);
    }
}
