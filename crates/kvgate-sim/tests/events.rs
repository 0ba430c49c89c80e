//! The simulated router with the engine index fed by the pods' KV events (`kvgate sim --index
//! engine`): determinism per seed with delay and loss, and how well each index knows the pods.

use kvgate_core::policy::PolicyKind;
use kvgate_sim::SimRequest;
use kvgate_sim::cluster::{self, ClusterConfig};
use kvgate_sim::events::{IndexConfig, IndexMode, LossRecovery};
use kvgate_sim::report::RunMetrics;
use kvgate_sim::workload::chat;

fn chat_workload(n: usize) -> Vec<SimRequest> {
    chat::generate(&chat::ChatParams {
        seed: 5,
        max_requests: n,
        session_rate_per_s: 4.0,
        ..chat::ChatParams::default()
    })
    .unwrap()
    .1
}

/// Four pods with 3,000 KV blocks each (evictions happen), affinity gate.
fn run(index: IndexConfig, seed: u64, requests: &[SimRequest]) -> RunMetrics {
    let config = ClusterConfig {
        kv_blocks: Some(3000),
        index,
        ..ClusterConfig::new(4, PolicyKind::AffinityGate, seed)
    };
    cluster::run(&config, requests)
}

fn engine(delay_ms: f64, loss: f64, recovery: LossRecovery) -> IndexConfig {
    IndexConfig {
        mode: IndexMode::Engine,
        delay_ms,
        loss,
        recovery,
        ..IndexConfig::default()
    }
}

#[test]
fn a_seed_replays_the_same_run_with_delay_and_loss_and_another_seed_loses_other_batches() {
    let reqs = chat_workload(400);
    for recovery in [LossRecovery::Replay, LossRecovery::Stale] {
        let config = engine(50.0, 0.1, recovery);
        let a = run(config, 3, &reqs);
        let b = run(config, 3, &reqs);
        assert_eq!(a, b, "{recovery:?}");
        let k = a.kv_index.as_ref().unwrap();
        // About 10 % of the batches are lost.
        assert!(
            k.lost_batches * 20 > k.batches && k.lost_batches * 20 < k.batches * 3,
            "{k:?}"
        );
        assert!(k.removed_blocks > 0, "the pods must evict");
        match recovery {
            LossRecovery::Replay => assert!(k.replayed_batches > 0 && k.stale_episodes == 0),
            LossRecovery::Stale => assert!(k.stale_episodes > 0 && k.replayed_batches == 0),
        }
        let c = run(config, 4, &reqs);
        assert_ne!(
            c.kv_index.as_ref().unwrap().lost_batches,
            k.lost_batches,
            "{recovery:?}"
        );
    }
}

#[test]
fn without_delay_or_loss_the_engine_index_knows_the_chosen_pod_better_than_routing_history() {
    let reqs = chat_workload(400);
    let routed = run(IndexConfig::default(), 1, &reqs);
    let exact = run(engine(0.0, 0.0, LossRecovery::Replay), 1, &reqs);
    let r = routed.kv_index.unwrap();
    let e = exact.kv_index.unwrap();
    assert_eq!(r.config.mode, IndexMode::Routed);
    assert_eq!((r.batches, r.lost_batches), (0, 0));
    assert_eq!(e.lost_batches, 0);
    assert_eq!(e.decisions, reqs.len() as u64);
    // Error only from steps in progress at decision time (their changes are published at the
    // step's end).
    assert!(
        e.mean_abs_error_blocks < r.mean_abs_error_blocks,
        "engine {e:?} vs routed {r:?}"
    );
    assert!(e.decisions_exact > r.decisions_exact, "{e:?} vs {r:?}");
    assert!(e.decisions_exact * 10 >= e.decisions * 9, "{e:?}");
}
