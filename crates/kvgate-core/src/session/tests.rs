use super::*;
use crate::index::PrefixIndex;

fn session(router: RouterConfig) -> RouterSession {
    RouterSession::new(
        router,
        PolicyKind::AffinityGate,
        PredictorConfig::default(),
        7,
    )
}

fn pods(n: u32) -> Vec<PodSnapshot> {
    (0..n).map(|i| PodSnapshot::idle(i, "c", 1_000)).collect()
}

fn request(blocks: &[BlockHash], input_tokens: u32) -> RouteRequest<'_> {
    RouteRequest {
        blocks,
        input_tokens,
        block_size_tokens: 16,
        other_sizes: &[],
        slo: RequestSlo::default(),
        adapter: None,
    }
}

#[test]
fn a_routed_request_is_charged_its_uncached_whole_blocks_and_returns_every_charge() {
    let mut s = session(RouterConfig::seed());
    let blocks: Vec<BlockHash> = (0..251).collect();
    // Pod 1 holds the first 250 blocks: the gate keeps it (score 0.996 > 0.80).
    s.index_mut().record_routed(PodId(1), &blocks[..250]);
    let mut snaps = pods(3);
    let Routed {
        decision,
        mut ticket,
    } = s.route(&request(&blocks, 4_010), &mut snaps, &[]).unwrap();
    assert_eq!(decision.pod_id, PodId(1));
    // 4,010 − 250 × 16 = 10 tokens to compute.
    assert_eq!(ticket.prefill_tokens(), 10);
    assert_eq!(
        s.in_flight(PodId(1)),
        InFlight {
            requests: 1,
            prefill_tokens: 10,
            decode_tokens: 0
        }
    );
    s.first_token(&mut ticket);
    s.first_token(&mut ticket);
    s.tokens_generated(&mut ticket, 4);
    assert_eq!(
        s.in_flight(PodId(1)),
        InFlight {
            requests: 1,
            prefill_tokens: 0,
            decode_tokens: 4_010 + 1 + 4
        }
    );
    s.finish(ticket, None);
    assert_eq!(s.in_flight_total(), 0);
    assert_eq!(s.predictor().accuracy().samples, 0);
}

#[test]
fn the_features_are_taken_before_the_request_is_charged_and_train_on_finish() {
    let mut s = session(RouterConfig::seed());
    let mut snaps = pods(1);
    let first = s.route(&request(&[1, 2], 40), &mut snaps, &[]).unwrap();
    let second = s.route(&request(&[3, 4], 40), &mut snaps, &[]).unwrap();
    assert_eq!(first.ticket.features().prefill_tokens_in_flight, 0.0);
    assert_eq!(second.ticket.features().prefill_tokens_in_flight, 40.0);
    assert_eq!(snaps[0].in_flight.requests, 1, "snapshots carry the ledger");
    s.finish(
        first.ticket,
        Some(Observed {
            ttft_ms: 20.0,
            tpot_ms: Some(5.0),
        }),
    );
    s.finish(second.ticket, None);
    assert_eq!(s.predictor().accuracy().samples, 1);
    assert_eq!(s.in_flight_total(), 0);
}

#[test]
fn a_ttft_learnt_at_the_first_token_trains_once_and_finish_trains_only_tpot() {
    let mut s = session(RouterConfig::seed());
    let mut snaps = pods(1);
    let mut routed = s.route(&request(&[1, 2], 40), &mut snaps, &[]).unwrap();
    let sample = s.first_token_learnt(&mut routed.ticket, 20.0);
    assert_eq!(
        sample.map(|t| (t.ttft_ms, t.tpot_ms)),
        Some((Some(20.0), None))
    );
    let learnt = s.predictor().accuracy();
    assert_eq!((learnt.samples, learnt.tpot_samples), (1, 0));
    assert!(routed.ticket.has_first_token(), "charged as decoding");
    assert_eq!(s.first_token_learnt(&mut routed.ticket, 30.0), None, "once");
    let observed = Observed {
        ttft_ms: 20.0,
        tpot_ms: Some(5.0),
    };
    let rest = routed.ticket.training_sample(&observed);
    assert_eq!((rest.ttft_ms, rest.tpot_ms), (None, Some(5.0)));
    s.finish(routed.ticket, Some(observed));
    let done = s.predictor().accuracy();
    assert_eq!((done.samples, done.tpot_samples), (1, 1));
    assert_eq!(s.in_flight_total(), 0);
}

#[test]
fn excluded_pods_are_never_chosen_and_keep_their_health() {
    let mut s = session(RouterConfig::default());
    let mut snaps = pods(3);
    for _ in 0..50 {
        let r = s
            .route(&request(&[9], 16), &mut snaps, &[PodId(0), PodId(2)])
            .unwrap();
        assert_eq!(r.decision.pod_id, PodId(1));
        s.finish(r.ticket, None);
    }
    assert!(snaps.iter().all(|p| p.healthy));
    assert_eq!(
        s.route(
            &request(&[9], 16),
            &mut snaps,
            &[PodId(0), PodId(1), PodId(2)]
        )
        .unwrap_err(),
        RouteError::NoHealthyPod
    );
}

#[test]
fn objectives_reach_only_a_policy_that_reads_them() {
    // kvgate's gate never routes by objectives (docs/decisions/slo-routing.md); the llm-d chain
    // model does, as upstream.
    let slo = RequestSlo {
        ttft_ms: Some(500.0),
        tpot_ms: None,
    };
    for (policy, reads) in [
        (PolicyKind::AffinityGate, false),
        (PolicyKind::LlmdChain, true),
    ] {
        let mut s = RouterSession::new(
            RouterConfig::default(),
            policy,
            PredictorConfig::default(),
            7,
        );
        let mut snaps = pods(2);
        let req = RouteRequest {
            slo,
            ..request(&[1], 16)
        };
        let r = s.route(&req, &mut snaps, &[]).unwrap();
        assert_eq!(r.decision.slo.is_some(), reads, "{policy:?}");
    }
}

#[test]
fn a_removed_pod_forgets_its_index_entries_and_its_charges() {
    let mut s = session(RouterConfig::seed());
    let mut snaps = pods(1);
    let r = s.route(&request(&[1, 2, 3], 48), &mut snaps, &[]).unwrap();
    assert!(s.index().indexed_blocks() > 0);
    s.remove_pod(PodId(0));
    assert_eq!(s.index().indexed_blocks(), 0);
    assert_eq!(s.in_flight(PodId(0)), InFlight::default());
    // The old ticket gives nothing back to the pod that reuses id 0.
    let again = s.route(&request(&[7], 16), &mut snaps, &[]).unwrap();
    s.finish(r.ticket, None);
    assert_eq!(s.in_flight(PodId(0)).requests, 1);
    s.finish(again.ticket, None);
    assert_eq!(s.in_flight_total(), 0);
}

#[test]
fn least_loaded_counts_the_ledger_and_skips_excluded_and_unhealthy_pods() {
    let mut s = session(RouterConfig::seed());
    let mut snaps = pods(3);
    snaps[2].healthy = false;
    let t = s.charge_unrouted(&snaps[0]);
    assert_eq!(s.least_loaded(&mut snaps, &[]), Some(PodId(1)));
    assert_eq!(s.least_loaded(&mut snaps, &[PodId(1)]), Some(PodId(0)));
    assert_eq!(s.least_loaded(&mut snaps, &[PodId(0), PodId(1)]), None);
    s.finish(t, None);
    assert_eq!(s.least_loaded(&mut snaps, &[]), Some(PodId(0)));
}

#[test]
fn the_same_seed_and_requests_give_the_same_decisions() {
    let run = || {
        let mut s = session(RouterConfig::default());
        let mut snaps = pods(4);
        (0..200u64)
            .map(|i| {
                let blocks: Vec<BlockHash> = (0..(i % 7 + 1)).map(|b| b + 100 * (i % 5)).collect();
                let r = s.route(&request(&blocks, 64), &mut snaps, &[]).unwrap();
                let pod = r.decision.pod_id;
                s.finish(r.ticket, None);
                pod
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(run(), run());
}

#[test]
fn a_reseeded_session_draws_from_its_new_seed() {
    // Exploration on every other request, so the draws show in the picks.
    let router = RouterConfig {
        epsilon_explore_sticky: 0.5,
        ..RouterConfig::default()
    };
    let run = |reseed: Option<u64>| {
        let mut s = session(router);
        if let Some(seed) = reseed {
            s.reseed(seed);
        }
        let mut snaps = pods(8);
        let picks = (0..200u64)
            .map(|i| {
                let blocks: Vec<BlockHash> = (0..4).map(|b| b + 100 * (i % 3)).collect();
                let r = s.route(&request(&blocks, 64), &mut snaps, &[]).unwrap();
                let pod = r.decision.pod_id;
                s.finish(r.ticket, None);
                pod
            })
            .collect::<Vec<_>>();
        (s.decision_seed(), picks)
    };
    let (seed, first) = run(None);
    assert_eq!(seed, 7);
    assert_eq!(
        run(Some(7)),
        (7, first.clone()),
        "reseeding to the same seed"
    );
    let (seed, other) = run(Some(8));
    assert_eq!(seed, 8);
    assert_ne!(other, first, "another seed, other draws");
}

#[test]
fn each_pod_is_scored_and_charged_against_the_chain_of_its_own_block_size() {
    let mut s = session(RouterConfig::seed());
    // One 4,100-token prompt: 256 blocks of 16 tokens (main chain), 32 blocks of 128 tokens.
    let small: Vec<BlockHash> = (0..256).collect();
    let large = SizedBlocks {
        block_size_tokens: 128,
        blocks: (1_000..1_032).collect(),
    };
    // Pod 0 (16-token blocks) holds half the prompt; pod 1 (128-token blocks) holds 31 of 32.
    s.index_mut().record_routed(PodId(0), &small[..128]);
    s.index_mut().record_routed(PodId(1), &large.blocks[..31]);
    let mut snaps = pods(2);
    snaps[0].block_size_tokens = Some(16);
    snaps[1].block_size_tokens = Some(128);
    let request = RouteRequest {
        other_sizes: std::slice::from_ref(&large),
        ..request(&small, 4_100)
    };
    let Routed { decision, ticket } = s.route(&request, &mut snaps, &[]).unwrap();
    let score = |pod: &str| {
        decision
            .pods
            .iter()
            .find(|p| &*p.id == pod)
            .unwrap()
            .prefix_score
    };
    assert_eq!(score("pod-0"), 0.5);
    assert_eq!(score("pod-1"), 31.0 / 32.0);
    // The gate keeps the only pod above 0.80, charged 4,100 − 31 × 128 = 132 tokens.
    assert_eq!(decision.pod_id, PodId(1));
    assert_eq!(ticket.prefill_tokens(), 132);
    s.finish(ticket, None);
    // The route was recorded in pod 1's own chain: now it holds all 32 large blocks.
    let mut matched = Vec::new();
    s.index().match_prefix(&large.blocks, &mut matched);
    assert_eq!(matched[1], 32);
}

#[test]
fn without_other_sizes_every_pod_is_scored_against_the_main_chain() {
    let mut s = session(RouterConfig::seed());
    let blocks: Vec<BlockHash> = (0..10).collect();
    s.index_mut().record_routed(PodId(1), &blocks);
    let mut snaps = pods(2);
    // A reported size with no chain of its own (routed mode): the main chain is used.
    snaps[1].block_size_tokens = Some(128);
    let Routed { decision, ticket } = s.route(&request(&blocks, 160), &mut snaps, &[]).unwrap();
    assert_eq!(decision.pod_id, PodId(1));
    assert_eq!(ticket.prefill_tokens(), 0);
    s.finish(ticket, None);
}

#[test]
fn pods_of_different_block_sizes_are_scored_by_the_tokens_they_hold() {
    let mut s = session(RouterConfig::seed());
    // A 255-token prompt: 15 blocks of 16 tokens (240 tokens), 1 block of 128.
    let small: Vec<BlockHash> = (0..15).collect();
    let large = SizedBlocks {
        block_size_tokens: 128,
        blocks: vec![1_000],
    };
    s.index_mut().record_routed(PodId(0), &small);
    s.index_mut().record_routed(PodId(1), &large.blocks);
    let mut snaps = pods(2);
    snaps[0].block_size_tokens = Some(16);
    snaps[1].block_size_tokens = Some(128);
    let request = RouteRequest {
        other_sizes: std::slice::from_ref(&large),
        ..request(&small, 255)
    };
    let scores = s.score(&request, &mut snaps);
    // Both hold every full block of their own size, but the 16-token pod holds 240 tokens,
    // the 128-token pod 128: 1.0 and 128 / 240, not 1.0 and 1.0.
    assert_eq!(scores[0].prefix_score, 1.0);
    assert_eq!(scores[1].prefix_score, 128.0 / 240.0);
    assert_eq!(
        (scores[1].matched_blocks, scores[1].block_size_tokens),
        (1, 128)
    );
}

/// A LoRA pod (`max_loras` slots, base model `base`) with `running` adapters in its metrics.
fn lora_pod(id: u32, max_loras: u32, running: &[&str]) -> PodSnapshot {
    let mut p = PodSnapshot::idle(id, "c", 1_000);
    p.lora = Some(crate::adapters::LoraSlots {
        max_loras,
        base_model: Some(AdapterId::of("base")),
        running: crate::adapters::AdapterSet::from_names(running.iter().copied()),
        ..Default::default()
    });
    p
}

fn no_explore() -> RouterConfig {
    RouterConfig {
        epsilon_explore_sticky: 0.0,
        ..RouterConfig::seed()
    }
}

/// A prompt of its own (four blocks), as one seeded by its adapter and numbered `n`.
fn prompt(name: &str, n: u64) -> Vec<BlockHash> {
    (0..4)
        .map(|i| AdapterId::of(name).0 ^ (n << 8) ^ i)
        .collect()
}

fn for_adapter<'a>(blocks: &'a [BlockHash], name: &str) -> RouteRequest<'a> {
    RouteRequest {
        adapter: Some(AdapterId::of(name)),
        ..request(blocks, 64)
    }
}

#[test]
fn adapter_requests_prefer_a_resident_pod_then_a_free_slot_then_a_full_pod() {
    let mut s = session(no_explore());
    let mut snaps = vec![
        lora_pod(0, 1, &["a"]),
        lora_pod(1, 1, &["b"]),
        lora_pod(2, 2, &["b"]),
    ];
    let routed = s
        .route(&for_adapter(&prompt("a", 0), "a"), &mut snaps, &[])
        .unwrap();
    assert_eq!(routed.decision.pod_id, PodId(0), "a is resident on pod 0");
    let p = &routed.decision.pods;
    assert_eq!(p[0].adapter, crate::adapters::AdapterFit::Resident);
    assert_eq!(p[1].adapter, crate::adapters::AdapterFit::Full);
    assert_eq!(p[2].adapter, crate::adapters::AdapterFit::FreeSlot);
    assert_eq!(p[1].adapter_cost_ms, 1025.0);
    assert_eq!(p[2].adapter_cost_ms, 25.0);
    assert_eq!(p[1].predicted_ttft_ms - p[0].predicted_ttft_ms, 1025.0);
    s.finish(routed.ticket, None);
    // c is resident nowhere: pod 2 has a free slot, pods 0 and 1 are full.
    let c = s
        .route(&for_adapter(&prompt("c", 0), "c"), &mut snaps, &[])
        .unwrap();
    assert_eq!(c.decision.pod_id, PodId(2));
    // The base model needs no adapter anywhere: no cost on any pod.
    let base = s
        .route(&for_adapter(&prompt("base", 0), "base"), &mut snaps, &[])
        .unwrap();
    assert!(base.decision.pods.iter().all(|p| p.adapter_cost_ms == 0.0));
}

#[test]
fn the_session_books_its_own_adapter_routes_before_the_metrics_show_them() {
    let mut s = session(no_explore());
    let mut snaps = vec![lora_pod(0, 1, &[]), lora_pod(1, 1, &[])];
    let a = s
        .route(&for_adapter(&prompt("a", 0), "a"), &mut snaps, &[])
        .unwrap();
    assert_eq!(a.decision.pod_id, PodId(0), "both free: the lower index");
    // Pod 0's only slot is held by a's request in flight: b goes to pod 1.
    let b = s
        .route(&for_adapter(&prompt("b", 0), "b"), &mut snaps, &[])
        .unwrap();
    assert_eq!(b.decision.pod_id, PodId(1));
    assert_eq!(s.adapter_in_flight(PodId(1), AdapterId::of("b")), 1);
    let a2 = s
        .route(&for_adapter(&prompt("a", 1), "a"), &mut snaps, &[])
        .unwrap();
    assert_eq!(a2.decision.pod_id, PodId(0));
    for t in [a.ticket, b.ticket, a2.ticket] {
        s.finish(t, None);
    }
    assert_eq!(s.adapter_in_flight(PodId(0), AdapterId::of("a")), 0);
    // Nothing in flight: b is still loaded on pod 1 (last routed there), a on pod 0.
    let b2 = s
        .route(&for_adapter(&prompt("b", 1), "b"), &mut snaps, &[])
        .unwrap();
    assert_eq!(b2.decision.pod_id, PodId(1));
    let fits: Vec<_> = b2.decision.pods.iter().map(|p| p.adapter).collect();
    use crate::adapters::AdapterFit::{Evict, Resident};
    assert_eq!(fits, vec![Evict, Resident]);
}

#[test]
fn lora_aware_off_charges_no_adapter_cost() {
    let mut s = session(RouterConfig {
        lora_aware: false,
        ..no_explore()
    });
    let mut snaps = vec![lora_pod(0, 1, &["b"]), lora_pod(1, 1, &["a"])];
    snaps[1].running = 3;
    let r = s
        .route(&for_adapter(&prompt("a", 0), "a"), &mut snaps, &[])
        .unwrap();
    assert!(r.decision.pods.iter().all(|p| p.adapter_cost_ms == 0.0));
    assert_eq!(
        r.decision.pod_id,
        PodId(0),
        "blind: the idler pod, adapter or not"
    );
}

#[test]
fn the_same_prompt_under_two_adapters_never_scores_on_the_others_blocks() {
    let mut s = session(no_explore());
    let body = |model: &str| {
        serde_json::json!({"model": model, "prompt": "word ".repeat(400)}).to_string()
    };
    let parse = |model: &str| {
        crate::request::parse_request("/v1/completions", body(model).as_bytes()).unwrap()
    };
    let (mut a, mut b) = (Vec::new(), Vec::new());
    s.router().hash_request(&parse("a"), &mut a);
    s.router().hash_request(&parse("b"), &mut b);
    assert!(!a.is_empty());
    s.index_mut().record_routed(PodId(0), &a);
    let mut snaps = pods(2);
    let scores = s.score(&for_adapter(&b, "b"), &mut snaps);
    assert_eq!(scores[0].prefix_score, 0.0, "b on a's blocks");
    let scores = s.score(&for_adapter(&a, "a"), &mut snaps);
    assert_eq!(scores[0].prefix_score, 1.0);
}

/// Pods that served 40 requests of one group: a 64-block shared prompt and a block of each
/// request's own, each request finished before the next (no load to break affinity).
fn pods_used_by_a_shared_group(router: RouterConfig) -> usize {
    let mut s = session(router);
    let mut snaps = pods(4);
    let mut used = std::collections::BTreeSet::new();
    for r in 0..40u64 {
        let mut blocks: Vec<BlockHash> = (1_000..1_064).collect();
        blocks.push(1_000_000 + r);
        let Routed { decision, ticket } = s
            .route(&request(&blocks, 65 * 16), &mut snaps, &[])
            .unwrap();
        used.insert(decision.pod_id);
        s.finish(ticket, None);
    }
    used.len()
}

#[test]
fn shared_prefix_exploration_spreads_a_shared_prompt_once_enough_requests_carried_it() {
    let base = RouterConfig {
        explore_mode: crate::config::ExploreMode::RandomNonSticky,
        ..no_explore()
    };
    // Off: every request follows the group's one sticky pod.
    assert_eq!(pods_used_by_a_shared_group(base), 1);
    // On with ε_s = 1: after 8 requests carried the prompt, each explores a pod without it.
    let on = RouterConfig {
        shared_prefix_epsilon: 1.0,
        ..base
    };
    assert_eq!(pods_used_by_a_shared_group(on), 4);
    // Conversations are not explored: each turn's deepest cached block was carried once.
    let mut s = session(on);
    let mut snaps = pods(4);
    let mut history: Vec<BlockHash> = (5_000..5_064).collect();
    let mut used = std::collections::BTreeSet::new();
    for turn in 0..12u64 {
        let Routed { decision, ticket } = s
            .route(
                &request(&history, history.len() as u32 * 16),
                &mut snaps,
                &[],
            )
            .unwrap();
        used.insert(decision.pod_id);
        s.finish(ticket, None);
        history.extend((0..4).map(|i| 9_000 + turn * 4 + i));
    }
    assert_eq!(used.len(), 1);
}

#[test]
fn a_config_reload_keeps_the_prefix_popularity_counts() {
    let on = RouterConfig {
        shared_prefix_epsilon: 0.1,
        ..no_explore()
    };
    let mut s = session(on);
    let mut snaps = pods(2);
    let blocks: Vec<BlockHash> = (1_000..1_064).collect();
    for _ in 0..10 {
        let Routed { ticket, .. } = s
            .route(&request(&blocks, 64 * 16), &mut snaps, &[])
            .unwrap();
        s.finish(ticket, None);
    }
    assert_eq!(s.router().prefix_sharers(&blocks, 64), 10);
    s.set_router(on, PolicyKind::AffinityGate);
    assert_eq!(s.router().prefix_sharers(&blocks, 64), 10);
    // A router that does not count starts none.
    s.set_router(no_explore(), PolicyKind::AffinityGate);
    assert_eq!(s.router().prefix_sharers(&blocks, 64), 0);
}

/// A sibling routed while the request that brought its prefix is still prefilling: with
/// `predict_computed_prefix` its prediction counts that prefix as uncached on the pod (an
/// engine computes it again in the same step), so the load gate moves it to the idle pod; once
/// the first token is back the prefix counts as cached again.
#[test]
fn a_prefix_still_being_computed_is_predicted_uncached_until_its_first_token() {
    let first_blocks: Vec<BlockHash> = (0..100).collect();
    let sibling_blocks: Vec<BlockHash> = (0..102).collect();
    let route = |s: &mut RouterSession, blocks: &[BlockHash]| {
        let tokens = blocks.len() as u32 * 16;
        s.route(&request(blocks, tokens), &mut pods(2), &[])
            .unwrap()
    };
    let explained = |d: &Decision, pod: usize| d.pods[pod].clone();

    let mut on = session(RouterConfig::default());
    let mut first = route(&mut on, &first_blocks);
    assert_eq!(first.decision.pod_id, PodId(0));
    let sibling = route(&mut on, &sibling_blocks);
    let held = explained(&sibling.decision, 0);
    assert!(held.prefix_score > 0.95, "the gate still sees the prefix");
    assert_eq!(held.prefilling_blocks, 100);
    assert_eq!(sibling.decision.pod_id, PodId(1), "{:?}", sibling.decision);
    assert_eq!(sibling.ticket.prefill_tokens(), 102 * 16);
    on.first_token(&mut first.ticket);
    let later = route(&mut on, &sibling_blocks);
    assert_eq!(explained(&later.decision, 0).prefilling_blocks, 0);
    assert!(later.ticket.prefill_tokens() < 102 * 16);

    let mut off = session(RouterConfig {
        predict_computed_prefix: false,
        ..RouterConfig::default()
    });
    let _first = route(&mut off, &first_blocks);
    let sibling = route(&mut off, &sibling_blocks);
    assert_eq!(sibling.decision.pod_id, PodId(0));
    assert_eq!(explained(&sibling.decision, 0).prefilling_blocks, 0);
    assert_eq!(sibling.ticket.prefill_tokens(), 2 * 16);
}

/// A request that ends before its first token (failed, cut) gives its blocks back too; a
/// remote route is not marked (per replica); a mark counts for one engine step only.
#[test]
fn a_mark_ends_with_the_request_or_its_window_and_remote_routes_are_not_marked() {
    let blocks: Vec<BlockHash> = (0..50).collect();
    let mut s = session(RouterConfig::default());
    let first = s.route(&request(&blocks, 800), &mut pods(2), &[]).unwrap();
    assert_eq!(s.prefilling.len(), 1);
    s.finish(first.ticket, None);
    assert!(s.prefilling.is_empty());
    let fresh: Vec<BlockHash> = (100..150).collect();
    let remote = s.route_remote(PodId(1), &fresh, 800, 800);
    assert!(s.prefilling.is_empty());
    s.finish(remote, None);
    let other: Vec<BlockHash> = (200..250).collect();
    let first = s.route(&request(&other, 800), &mut pods(2), &[]).unwrap();
    let step_ms = first.decision.pods[first.decision.pod_id.index()].predicted_tpot_ms;
    assert!(step_ms > 0.0);
    s.advance_clock(step_ms + 1.0);
    let sibling = s.route(&request(&other, 800), &mut pods(2), &[]).unwrap();
    assert!(
        sibling
            .decision
            .pods
            .iter()
            .all(|p| p.prefilling_blocks == 0)
    );
    assert_eq!(sibling.decision.pod_id, first.decision.pod_id);
}
