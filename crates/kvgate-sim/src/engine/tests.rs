use super::*;
use proptest::prelude::*;
use rustc_hash::FxHashMap;

fn h100() -> &'static Profile {
    Profile::default_profile()
}

/// `n` distinct block hashes for "document" `doc`.
fn hashes(doc: u64, n: u32) -> Arc<[BlockHash]> {
    (0..u64::from(n)).map(|i| (doc << 32) | i).collect()
}

fn req(id: u64, doc: u64, input_tokens: u32, output_tokens: u32) -> EngineRequest {
    EngineRequest {
        id,
        blocks: hashes(doc, input_tokens / 16),
        input_tokens,
        output_tokens,
        adapter: None,
    }
}

/// Everything observable about one step, for exact comparisons.
#[derive(Debug, Clone, PartialEq)]
struct StepRecord {
    start_ms: f64,
    duration_ms: f64,
    prefill_tokens: u64,
    decode_seqs: u64,
    context_tokens_read: u64,
    scheduled_seqs: u32,
    emissions: Vec<Emission>,
    preempted: Vec<u64>,
    kv_events: Vec<KvEvent>,
    running: u32,
    kv_blocks_used: u32,
}

/// Drives `engine` through `arrivals` (sorted by time) until idle; arrivals at or before a step's
/// start join that step. Panics after `max_steps` steps.
fn run(
    engine: &mut Engine,
    arrivals: &[(f64, EngineRequest)],
    max_steps: usize,
) -> Vec<StepRecord> {
    let mut out = Vec::new();
    let mut next = 0;
    loop {
        let step_at = engine.next_step_time();
        if next < arrivals.len() && step_at.is_none_or(|t| arrivals[next].0 <= t) {
            let (t, r) = &arrivals[next];
            engine.add_request(*t, r.clone()).unwrap();
            next += 1;
            continue;
        }
        let Some(t) = step_at else { break };
        assert!(
            out.len() < max_steps,
            "engine did not drain in {max_steps} steps"
        );
        let o = engine.step(t).clone();
        let m = engine.metrics();
        assert!(o.scheduled_seqs > 0, "a step with work scheduled nothing");
        out.push(StepRecord {
            start_ms: o.start_ms,
            duration_ms: o.duration_ms,
            prefill_tokens: o.prefill_tokens,
            decode_seqs: o.decode_seqs,
            context_tokens_read: o.context_tokens_read,
            scheduled_seqs: o.scheduled_seqs,
            emissions: o.emissions,
            preempted: o.preempted,
            kv_events: o.kv_events,
            running: m.num_requests_running,
            kv_blocks_used: m.kv_blocks_used,
        });
    }
    out
}

/// Per request: (tokens emitted, times finished).
fn tally(steps: &[StepRecord]) -> FxHashMap<u64, (u32, u32)> {
    let mut t: FxHashMap<u64, (u32, u32)> = FxHashMap::default();
    for s in steps {
        for e in &s.emissions {
            let entry = t.entry(e.request_id).or_default();
            entry.0 += 1;
            assert_eq!(
                e.output_tokens_so_far, entry.0,
                "tokens of {} out of order",
                e.request_id
            );
            entry.1 += u32::from(e.finished);
        }
    }
    t
}

#[test]
fn lone_request_ttft_is_one_prefill_step_and_decodes_one_token_per_step() {
    let p = h100();
    let mut e = Engine::new(p, None);
    let steps = run(&mut e, &[(10.0, req(1, 1, 1000, 4))], 100);
    assert_eq!(steps.len(), 4);
    // TTFT = t0 + a·1000 + k·1000 (the prefill reads its own 1000 tokens of context).
    let ttft =
        (p.t0_us + 1000.0 * p.a_us_per_prefill_token + 1000.0 * p.k_us_per_context_token) / 1000.0;
    assert_eq!(steps[0].start_ms, 10.0);
    assert_eq!(steps[0].duration_ms, ttft);
    assert_eq!(steps[0].prefill_tokens, 1000);
    assert!(steps[0].emissions[0].is_first());
    // Decode step i reads 1000 + i tokens of context.
    for (i, s) in steps.iter().enumerate().skip(1) {
        let ctx = 1000 + i as u64;
        assert_eq!(
            (s.prefill_tokens, s.decode_seqs, s.context_tokens_read),
            (0, 1, ctx)
        );
        assert_eq!(s.duration_ms, p.step_ms(0, 1, ctx, 0));
        assert_eq!(s.start_ms, steps[i - 1].start_ms + steps[i - 1].duration_ms);
    }
    assert!(steps[3].emissions[0].finished);
    assert_eq!(e.metrics().kv_blocks_used, 0);
    assert_eq!(e.next_step_time(), None);
}

#[test]
fn prompt_longer_than_token_budget_takes_ceil_n_over_8192_steps() {
    let mut e = Engine::new(h100(), None);
    let steps = run(&mut e, &[(0.0, req(1, 1, 20_000, 1))], 100);
    // ceil(20000 / 8192) = 3 chunks: 8192, 8192, 3616; the first token comes with the last.
    let chunks: Vec<_> = steps.iter().map(|s| s.prefill_tokens).collect();
    assert_eq!(chunks, vec![8192, 8192, 3616]);
    let ctx: Vec<_> = steps.iter().map(|s| s.context_tokens_read).collect();
    assert_eq!(ctx, vec![8192, 16_384, 20_000]);
    assert!(steps[0].emissions.is_empty() && steps[1].emissions.is_empty());
    assert_eq!(steps[2].emissions.len(), 1);
}

#[test]
fn repeated_prompt_recomputes_only_the_tokens_past_the_last_cached_block_short_of_the_end() {
    // 100 tokens = 6 full blocks + 4: all 6 blocks hit, 4 tokens recomputed.
    let mut e = Engine::new(h100(), None);
    run(&mut e, &[(0.0, req(1, 7, 100, 2))], 100);
    let steps = run(&mut e, &[(1000.0, req(2, 7, 100, 2))], 100);
    assert_eq!(steps[0].prefill_tokens, 4);
    assert_eq!(steps[0].context_tokens_read, 100);
    let m = e.metrics();
    assert_eq!(m.prefix_cache_queries_tokens, 200);
    assert_eq!(m.prefix_cache_hits_tokens, 96);

    // 96 tokens = exactly 6 full blocks: the hit is capped at (96 − 1) / 16 = 5 blocks, so the
    // whole last block (16 tokens) is recomputed, as in vLLM v1.
    let mut e = Engine::new(h100(), None);
    run(&mut e, &[(0.0, req(1, 8, 96, 2))], 100);
    let steps = run(&mut e, &[(1000.0, req(2, 8, 96, 2))], 100);
    assert_eq!(steps[0].prefill_tokens, 16);
    assert_eq!(e.metrics().prefix_cache_hits_tokens, 80);
}

#[test]
fn free_blocks_are_evicted_tail_first_and_oldest_freed_first() {
    // Two 48-token prompts (3 blocks each) fill a 6-block pod one after the other.
    let mut e = Engine::new(h100(), Some(6));
    e.set_record_kv_events(true);
    run(&mut e, &[(0.0, req(1, 1, 48, 1))], 10);
    run(&mut e, &[(100.0, req(2, 2, 48, 1))], 10);
    assert_eq!(e.metrics().kv_blocks_cached, 6);
    assert_eq!(e.metrics().kv_blocks_used, 0);
    // A new 32-token prompt needs 2 blocks: it evicts the tail of the first prompt, then its middle.
    let steps = run(&mut e, &[(200.0, req(3, 3, 32, 1))], 10);
    assert_eq!(
        steps[0].kv_events,
        vec![
            KvEvent::Removed(1 << 32 | 2),
            KvEvent::Removed(1 << 32 | 1),
            KvEvent::Stored(3 << 32),
            KvEvent::Stored(3 << 32 | 1),
        ]
    );
    assert_eq!(e.cached_prefix_blocks(&hashes(1, 3)), 1);
    assert_eq!(e.cached_prefix_blocks(&hashes(2, 3)), 3);
}

#[test]
fn newest_request_is_preempted_when_blocks_run_out_and_still_completes() {
    // Each request needs ceil((64 + 60 − 1) / 16) = 8 blocks by its end; 10 blocks hold one.
    let mut e = Engine::new(h100(), Some(10));
    let arrivals = [(0.0, req(1, 1, 64, 60)), (0.0, req(2, 2, 64, 60))];
    let steps = run(&mut e, &arrivals, 1000);
    let preempted: Vec<u64> = steps.iter().flat_map(|s| s.preempted.clone()).collect();
    assert!(!preempted.is_empty());
    assert!(preempted.iter().all(|&id| id == 2), "{preempted:?}");
    assert_eq!(e.metrics().preemptions, preempted.len() as u64);
    let t = tally(&steps);
    assert_eq!(t[&1], (60, 1));
    assert_eq!(t[&2], (60, 1));
    assert!(steps.iter().all(|s| s.kv_blocks_used <= 10));
    // Request 1 was never held up: it decodes every step until it finishes.
    let finish_1 = steps
        .iter()
        .position(|s| s.emissions.iter().any(|x| x.request_id == 1 && x.finished))
        .unwrap();
    assert_eq!(finish_1, 59);
    assert_eq!(e.metrics().kv_blocks_used, 0);
}

#[test]
fn running_requests_never_exceed_max_num_seqs() {
    let mut p = h100().clone();
    p.max_num_seqs = 2;
    let mut e = Engine::new(&p, None);
    let arrivals: Vec<_> = (0..5).map(|i| (0.0, req(i, i, 40, 3))).collect();
    let steps = run(&mut e, &arrivals, 100);
    assert!(
        steps
            .iter()
            .all(|s| s.scheduled_seqs <= 2 && s.running <= 2)
    );
    assert_eq!(steps[0].scheduled_seqs, 2);
    // 5 requests × 3 tokens, at most 2 at a time, each admitted in a prefill step: 9 steps.
    assert_eq!(steps.len(), 9);
    assert_eq!(tally(&steps).len(), 5);
}

#[test]
fn waiting_requests_are_refused_past_capacity_and_model_length() {
    let mut e = Engine::new(h100(), Some(4));
    // 64 + 2 − 1 = 65 tokens need 5 blocks.
    assert_eq!(
        e.add_request(0.0, req(1, 1, 64, 2)),
        Err(AdmitError::ExceedsKvCapacity {
            id: 1,
            blocks: 5,
            kv_blocks: 4
        })
    );
    assert!(e.add_request(0.0, req(2, 1, 64, 1)).is_ok());
    assert_eq!(
        e.add_request(0.0, req(3, 1, 0, 1)),
        Err(AdmitError::EmptyPrompt(3))
    );
    assert_eq!(
        e.add_request(0.0, req(4, 1, 5, 0)),
        Err(AdmitError::NoOutput(4))
    );
    assert!(matches!(
        e.add_request(0.0, req(5, 1, 131_000, 100)),
        Err(AdmitError::ExceedsMaxModelLen { id: 5, .. })
    ));
    assert_eq!(e.metrics().requests_rejected, 4);
    assert_eq!(e.metrics().num_requests_waiting, 1);
}

#[test]
fn shared_prefix_blocks_are_reused_while_in_use() {
    // Request 2 arrives while request 1 decodes: its 4 leading blocks are already cached.
    let mut e = Engine::new(h100(), None);
    let arrivals = [(0.0, req(1, 1, 64, 10)), (50.0, req(2, 1, 80, 1))];
    let steps = run(&mut e, &arrivals, 100);
    let admit = steps
        .iter()
        .find(|s| s.prefill_tokens > 0 && s.start_ms > 0.0)
        .unwrap();
    assert_eq!(admit.prefill_tokens, 16);
    assert_eq!(e.metrics().prefix_cache_hits_tokens, 64);
}

fn workload(seed_reqs: &[(u8, u8, u8, u8, u8)]) -> Vec<(f64, EngineRequest)> {
    // (arrival step, doc, shared blocks, extra tokens, output tokens)
    let mut t = 0.0;
    seed_reqs
        .iter()
        .enumerate()
        .map(|(i, &(gap, doc, shared, extra, out))| {
            t += f64::from(gap);
            let shared = u32::from(shared % 8);
            let input = shared * 16 + u32::from(extra % 40) + 1;
            let mut h: Vec<BlockHash> = hashes(u64::from(doc % 3), shared).to_vec();
            h.extend((shared..input / 16).map(|j| (1000 + i as u64) << 32 | u64::from(j)));
            (
                t,
                EngineRequest {
                    id: i as u64,
                    blocks: h.into(),
                    input_tokens: input,
                    output_tokens: u32::from(out % 40) + 1,
                    adapter: None,
                },
            )
        })
        .collect()
}

#[test]
fn same_inputs_give_identical_steps() {
    let reqs: Vec<_> = (0..40u8)
        .map(|i| {
            (
                i % 7,
                i % 5,
                i.wrapping_mul(37),
                i.wrapping_mul(11),
                i.wrapping_mul(13),
            )
        })
        .collect();
    let w = workload(&reqs);
    let go = || {
        let mut e = Engine::new(h100(), Some(24));
        e.set_record_kv_events(true);
        run(&mut e, &w, 100_000)
    };
    let a = go();
    assert_eq!(a, go());
    assert!(
        a.iter().any(|s| !s.preempted.is_empty()),
        "workload should preempt"
    );
}

proptest! {
    #[test]
    fn every_request_completes_once_with_all_its_tokens_and_blocks_stay_within_capacity(
        reqs in prop::collection::vec(any::<(u8, u8, u8, u8, u8)>(), 1..30),
        kv_blocks in 8u32..40,
        max_num_seqs in 1u32..6,
        budget in 1u32..64,
    ) {
        let mut p = h100().clone();
        p.max_num_seqs = max_num_seqs;
        p.max_num_batched_tokens = budget;
        let w = workload(&reqs);
        let mut e = Engine::new(&p, Some(kv_blocks));
        // A request fits when (input + output − 1) ≤ 16 · kv_blocks; the workload's largest is
        // 7·16 + 40 + 40 − 1 = 191 tokens = 12 blocks, so drop what cannot fit.
        let w: Vec<_> = w
            .into_iter()
            .filter(|(_, r)| (r.input_tokens + r.output_tokens - 1).div_ceil(16) <= kv_blocks)
            .collect();
        let steps = run(&mut e, &w, 200_000);
        let t = tally(&steps);
        prop_assert_eq!(t.len(), w.len());
        for (_, r) in &w {
            prop_assert_eq!(t[&r.id], (r.output_tokens, 1));
        }
        prop_assert!(steps.iter().all(|s| s.kv_blocks_used <= kv_blocks));
        prop_assert!(steps.iter().all(|s| s.running <= max_num_seqs));
        let m = e.metrics();
        prop_assert_eq!(m.kv_blocks_used, 0);
        prop_assert_eq!(m.kv_cache_usage, 0.0);
        prop_assert_eq!(m.requests_finished, w.len() as u64);
        prop_assert_eq!(
            m.generation_tokens,
            w.iter().map(|(_, r)| u64::from(r.output_tokens)).sum::<u64>()
        );
    }
}

#[test]
fn request_arriving_during_a_step_joins_the_next_step() {
    let p = h100();
    let mut e = Engine::new(p, None);
    assert_eq!(e.next_step_time(), None);
    e.add_request(5.0, req(1, 1, 160, 3)).unwrap();
    assert_eq!(e.next_step_time(), Some(5.0));
    let first = e.step(5.0).clone();
    assert_eq!(first.end_ms, 5.0 + p.step_ms(160, 0, 160, 160 * 161 / 2));
    // Arrives mid-step: waits for the step's end, then prefills alongside request 1's decode.
    e.add_request(6.0, req(2, 2, 32, 1)).unwrap();
    assert_eq!(e.next_step_time(), Some(first.end_ms));
    let second = e.step(first.end_ms).clone();
    assert_eq!(second.start_ms, first.end_ms);
    assert_eq!((second.prefill_tokens, second.decode_seqs), (32, 1));
    assert_eq!(second.context_tokens_read, 161 + 32);
    assert_eq!(second.duration_ms, p.step_ms(32, 1, 193, 32 * 33 / 2));
    let ids: Vec<_> = second
        .emissions
        .iter()
        .map(|x| (x.request_id, x.output_tokens_so_far))
        .collect();
    assert_eq!(ids, vec![(1, 2), (2, 1)]);
    assert!(second.emissions[1].finished);
    assert_eq!(e.metrics().num_requests_running, 1);
}

#[test]
fn admission_reports_the_requests_prefix_hit_in_tokens() {
    let mut e = Engine::new(h100(), None);
    e.add_request(0.0, req(1, 9, 100, 1)).unwrap();
    let first = e.step(0.0).admitted.clone();
    assert_eq!(
        first,
        vec![Admission {
            request_id: 1,
            cached_tokens: 0
        }]
    );
    e.add_request(1000.0, req(2, 9, 100, 1)).unwrap();
    let second = e.step(1000.0).admitted.clone();
    assert_eq!(
        second,
        vec![Admission {
            request_id: 2,
            cached_tokens: 96
        }]
    );
}

#[test]
fn crash_drops_every_request_and_empties_the_cache_but_keeps_counters() {
    let mut e = Engine::new(h100(), None);
    run(&mut e, &[(0.0, req(1, 9, 100, 2))], 100);
    let before = e.metrics();
    e.add_request(1000.0, req(2, 9, 100, 50)).unwrap();
    e.add_request(1000.0, req(3, 10, 100, 50)).unwrap();
    e.step(1000.0);
    e.add_request(1001.0, req(4, 11, 100, 50)).unwrap();
    let mut dropped = e.crash(1002.0);
    dropped.sort_unstable();
    assert_eq!(dropped, vec![2, 3, 4]);
    assert!(e.is_idle());
    assert_eq!(e.cached_prefix_blocks(&hashes(9, 6)), 0);
    let m = e.metrics();
    assert_eq!((m.kv_blocks_used, m.kv_blocks_cached), (0, 0));
    assert!(m.prefix_cache_queries_tokens > before.prefix_cache_queries_tokens);
    assert!(m.busy_ms >= before.busy_ms);
    // After the restart the same prompt misses (nothing cached) and the engine serves again.
    let steps = run(&mut e, &[(2000.0, req(5, 9, 100, 2))], 100);
    assert_eq!(steps[0].start_ms, 2000.0);
    assert_eq!(steps[0].prefill_tokens, 100);
}

#[test]
fn crash_during_a_step_also_drops_the_requests_that_finished_in_it() {
    let mut e = Engine::new(h100(), None);
    e.add_request(0.0, req(1, 12, 100, 1)).unwrap();
    let end = e.step(0.0).end_ms;
    assert!(e.last_outcome().emissions.iter().any(|x| x.finished));
    assert_eq!(
        e.crash(end / 2.0),
        vec![1],
        "its only token never left the pod"
    );
    let mut e = Engine::new(h100(), None);
    e.add_request(0.0, req(1, 12, 100, 1)).unwrap();
    let end = e.step(0.0).end_ms;
    assert!(
        e.crash(end).is_empty(),
        "the step ended: the token was sent"
    );
}

#[test]
fn block_size_128_counts_hits_in_whole_128_token_blocks() {
    // 981 tokens = 7 full 128-token blocks + 85: the second and third runs hit 7 × 128 = 896
    // tokens each, the figure observed on vLLM 0.32 CPU (reference/real-vllm.md).
    let mut e = Engine::with_block_size(h100(), None, 128);
    assert_eq!(e.block_size_tokens(), 128);
    let r = |id| EngineRequest {
        id,
        blocks: hashes(3, 981 / 128),
        input_tokens: 981,
        output_tokens: 2,
        adapter: None,
    };
    run(&mut e, &[(0.0, r(1))], 100);
    assert_eq!(e.metrics().prefix_cache_hits_tokens, 0);
    let steps = run(&mut e, &[(1000.0, r(2))], 100);
    assert_eq!(steps[0].prefill_tokens, 85);
    run(&mut e, &[(2000.0, r(3))], 100);
    assert_eq!(e.metrics().prefix_cache_hits_tokens, 1792);
    // One request of 981 + 2 − 1 tokens holds ceil(982 / 128) = 8 blocks.
    let mut small = Engine::with_block_size(h100(), Some(7), 128);
    assert!(matches!(
        small.add_request(0.0, r(4)),
        Err(AdmitError::ExceedsKvCapacity { blocks: 8, .. })
    ));
}

#[test]
fn a_profile_of_128_token_blocks_gives_an_engine_that_hits_whole_128_token_blocks() {
    // The simulator hashes 16-token blocks; a profile of vLLM CPU's 128-token blocks gets an
    // engine that hits only whole 128-token blocks of them, with the same token capacity.
    let mut p = h100().clone();
    p.block_size_tokens = 128;
    p.kv_blocks = 800;
    let mut e = Engine::for_profile(&p, None);
    assert_eq!(e.block_size_tokens(), 128);
    assert_eq!(
        e.metrics().kv_blocks_total,
        100,
        "800 blocks of 16 = 100 of 128"
    );
    let sim = |id| SimRequest {
        id,
        arrival_ms: 0.0,
        input_tokens: 981,
        output_tokens: 2,
        blocks: (0..981 / 16).map(|i| 1000 + i).collect(),
        adapter: None,
        session: None,
    };
    let first = EngineRequest::for_block_size(&sim(1), 128);
    // Every 8th chained hash names a 128-token prefix: 61 blocks of 16 give 7 of 128.
    assert_eq!(
        &first.blocks[..],
        &[1007, 1015, 1023, 1031, 1039, 1047, 1055]
    );
    run(&mut e, &[(0.0, first)], 100);
    let steps = run(
        &mut e,
        &[(1000.0, EngineRequest::for_block_size(&sim(2), 128))],
        100,
    );
    // 7 × 128 = 896 tokens hit, where 16-token blocks would hit 976.
    assert_eq!(steps[0].prefill_tokens, 981 - 896);
    assert_eq!(e.metrics().prefix_cache_hits_tokens, 896);
    // The 16-token default is untouched.
    assert_eq!(EngineRequest::for_block_size(&sim(3), 16).blocks.len(), 61);
}

#[test]
fn abort_takes_a_running_request_out_and_frees_its_blocks_keeping_their_hashes() {
    let mut e = Engine::new(h100(), Some(20));
    e.add_request(0.0, req(1, 5, 64, 10)).unwrap();
    e.add_request(0.0, req(2, 6, 64, 10)).unwrap();
    e.step(0.0);
    e.step(e.next_step_time().unwrap());
    assert_eq!(e.metrics().num_requests_running, 2);
    assert_eq!(e.metrics().kv_blocks_used, 10);
    assert!(e.abort(1));
    assert!(!e.abort(1), "a request leaves once");
    let m = e.metrics();
    assert_eq!(m.num_requests_running, 1);
    assert_eq!(m.requests_aborted, 1);
    // Request 2 holds ceil(65 / 16) = 5 blocks for its 65 tokens; request 1's 4 full prompt
    // blocks stay cached.
    assert_eq!(m.kv_blocks_used, 5);
    assert_eq!(e.cached_prefix_blocks(&hashes(5, 4)), 4);
    assert!(e.abort(2));
    assert!(e.is_idle());
    assert_eq!(e.next_step_time(), None);
    assert_eq!(e.metrics().kv_blocks_used, 0);
}

#[test]
fn abort_of_a_waiting_request_leaves_the_queue() {
    let mut e = Engine::new(h100(), None);
    e.add_request(0.0, req(1, 5, 64, 4)).unwrap();
    assert_eq!(e.metrics().num_requests_waiting, 1);
    assert!(e.abort(1));
    assert_eq!(e.metrics().num_requests_waiting, 0);
    assert!(e.is_idle());
}

#[test]
fn a_chunked_prefill_pays_for_each_chunk_s_attention_over_the_tokens_before_it() {
    // Only the attention-pair term costs anything: 1 ms per pair; a 100-token step budget.
    let p = Profile::from_json(
        "pairs.json",
        r#"{"name": "pairs", "t0_us": 0, "a_us_per_prefill_token": 0, "b_us_per_decode_seq": 0,
            "k_us_per_context_token": 0, "q_us_per_prefill_pair": 1000, "kv_blocks": 4096,
            "max_num_batched_tokens": 100, "max_num_seqs": 8, "max_model_len": 4096}"#,
    )
    .unwrap();
    let mut e = Engine::new(p, None);
    e.add_request(0.0, req(1, 1, 250, 1)).unwrap();
    let chunks: Vec<(u64, f64)> = (0..3)
        .map(|_| {
            let at = e.next_step_time().unwrap();
            let s = e.step(at);
            (s.prefill_attention_pairs, s.duration_ms)
        })
        .collect();
    let expected = [
        100 * 101 / 2,
        100 * 100 + 100 * 101 / 2,
        50 * 200 + 50 * 51 / 2,
    ];
    for (i, ((pairs, ms), want)) in chunks.iter().zip(expected).enumerate() {
        assert_eq!(*pairs, want, "chunk {i}");
        assert_eq!(*ms, want as f64, "chunk {i}");
    }
    // The last chunk sampled the only output token: nothing is left to run.
    assert_eq!(e.next_step_time(), None);
}

#[test]
fn a_cached_prefix_is_attended_to_but_not_recomputed() {
    let p = h100();
    let mut e = Engine::new(p, None);
    e.add_request(0.0, req(1, 7, 320, 1)).unwrap();
    while let Some(at) = e.next_step_time() {
        e.step(at);
    }
    // Same document, longer: the first 320 tokens (20 blocks) hit, 160 new ones attend to them.
    e.add_request(100.0, req(2, 7, 480, 1)).unwrap();
    let s = e.step(100.0).clone();
    assert_eq!(s.prefill_tokens, 160);
    assert_eq!(s.prefill_attention_pairs, 160 * 320 + 160 * 161 / 2);
}

#[test]
fn a_transferred_prompt_is_not_computed_and_its_first_token_takes_one_decode_step() {
    let mut local = Engine::new(h100(), None);
    local.add_request(0.0, req(1, 7, 4000, 3)).unwrap();
    let first = local.step(0.0).clone();
    assert_eq!(first.prefill_tokens, 4000);
    assert!(first.emissions.is_empty() || first.emissions[0].is_first());

    let mut decode = Engine::new(h100(), None);
    decode
        .add_transferred_request(0.0, req(1, 7, 4000, 3))
        .unwrap();
    let step = decode.step(0.0).clone();
    assert_eq!(step.prefill_tokens, 0);
    assert_eq!(step.decode_seqs, 1);
    assert_eq!(step.emissions.len(), 1);
    assert!(step.emissions[0].is_first());
    assert!(
        step.duration_ms < first.duration_ms / 10.0,
        "{} vs {}",
        step.duration_ms,
        first.duration_ms
    );
    let m = decode.metrics();
    assert_eq!(m.prompt_tokens_transferred, 4000);
    assert_eq!(m.prefix_cache_hits_tokens, 0);
    // Its blocks were registered: the same prompt now hits the decode pod's cache.
    decode.step(step.end_ms);
    decode.step(decode.next_step_time().unwrap_or(step.end_ms));
    assert_eq!(decode.cached_prefix_blocks(&hashes(7, 250)), 250);
}

fn lora_req(id: u64, adapter: &str, input_tokens: u32, output_tokens: u32) -> EngineRequest {
    EngineRequest {
        adapter: Some(AdapterId::of(adapter)),
        ..req(id, id + 100, input_tokens, output_tokens)
    }
}

fn lora_engine(max_loras: u32, load_ms: f64) -> Engine {
    let mut e = Engine::new(h100(), None);
    e.set_lora(Some(LoraConfig { max_loras, load_ms }));
    e
}

#[test]
fn a_request_for_another_adapter_is_deferred_while_the_slot_runs_and_those_behind_it_go_ahead() {
    let mut e = lora_engine(1, 0.0);
    e.add_request(0.0, lora_req(1, "a", 64, 5)).unwrap();
    e.add_request(0.0, lora_req(2, "b", 64, 5)).unwrap();
    e.add_request(0.0, lora_req(3, "a", 64, 5)).unwrap();
    let admitted: Vec<u64> = e.step(0.0).admitted.iter().map(|a| a.request_id).collect();
    assert_eq!(admitted, vec![1, 3], "b skipped, the a behind it admitted");
    let m = e.metrics();
    assert_eq!(m.num_requests_deferred, 1);
    assert_eq!(m.num_requests_waiting, 1);
    assert_eq!(m.lora_running, AdapterSet::from_names(["a"]));
    assert_eq!(m.max_loras, 1);
    // b runs once a's requests have finished.
    let mut b_admitted_at = None;
    for _ in 0..20 {
        let o = e.step(0.0);
        if o.admitted.iter().any(|a| a.request_id == 2) {
            b_admitted_at = Some(o.start_ms);
            break;
        }
    }
    assert!(b_admitted_at.is_some());
    assert_eq!(e.metrics().lora_running, AdapterSet::from_names(["b"]));
    assert_eq!(e.metrics().lora_loads, 2);
}

#[test]
fn loading_an_adapter_lengthens_the_admitting_step_by_the_load_time_once() {
    let mut plain = Engine::new(h100(), None);
    plain.add_request(0.0, req(1, 101, 64, 3)).unwrap();
    let base_ms = plain.step(0.0).duration_ms;
    let mut e = lora_engine(2, 40.0);
    e.add_request(0.0, lora_req(1, "a", 64, 3)).unwrap();
    assert_eq!(e.step(0.0).duration_ms, base_ms + 40.0);
    // Loaded now: the next request for a costs no load.
    e.add_request(0.0, lora_req(2, "a", 64, 3)).unwrap();
    let o = e.step(0.0);
    assert!(o.duration_ms < base_ms + 40.0, "{}", o.duration_ms);
    assert_eq!(e.metrics().lora_loads, 1);
}

#[test]
fn without_lora_adapters_are_ignored() {
    let mut e = Engine::new(h100(), None);
    for (id, a) in [(1, "a"), (2, "b"), (3, "c")] {
        e.add_request(0.0, lora_req(id, a, 64, 3)).unwrap();
    }
    assert_eq!(e.step(0.0).admitted.len(), 3);
    let m = e.metrics();
    assert_eq!(
        (m.max_loras, m.num_requests_deferred, m.lora_loads),
        (0, 0, 0)
    );
    assert!(m.lora_running.is_empty());
}

#[test]
fn siblings_waiting_together_compute_their_shared_prefix_once() {
    // Two requests of the same 256-token prompt arrive together on an idle pod. vLLM v1 caches
    // the first one's blocks when it schedules it, before it looks at the second, so the second
    // finds 15 of its 16 blocks cached (the last one is recomputed for the logits) although no
    // step has run yet.
    let mut e = Engine::new(h100(), None);
    let steps = run(
        &mut e,
        &[(0.0, req(1, 7, 256, 1)), (0.0, req(2, 7, 256, 1))],
        10,
    );
    assert_eq!(steps[0].scheduled_seqs, 2);
    assert_eq!(steps[0].prefill_tokens, 256 + 16, "{:?}", steps[0]);
    assert_eq!(e.metrics().prefix_cache_hits_tokens, 240);
}
