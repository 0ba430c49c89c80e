//! Flow control in the simulated cluster: with it off, tagging changes nothing; under overload
//! with it on, high priority is served first, a noisy tenant's flood queues behind the quiet
//! tenants, and every request is served or counted as refused.

use kvgate_core::flow::FlowConfig;
use kvgate_core::policy::PolicyKind;
use kvgate_sim::SimRequest;
use kvgate_sim::cluster::{self, ClusterConfig, SimClass};
use kvgate_sim::report::{Percentiles, RunMetrics};
use kvgate_sim::workload::{chat, classes};

fn workload(n: usize) -> Vec<SimRequest> {
    chat::generate(&chat::ChatParams {
        seed: 3,
        max_requests: n,
        ..chat::ChatParams::default()
    })
    .unwrap()
    .1
}

fn config(rate_scale: f64, flow: bool) -> ClusterConfig {
    let mut c = ClusterConfig::new(1, PolicyKind::AffinityGate, 1);
    c.rate_scale = rate_scale;
    c.flow = FlowConfig {
        enabled: flow,
        max_queued_requests: 100_000,
        tenant_max_share: 1.0,
        queue_ttl_ms: 600_000,
        ..FlowConfig::default()
    };
    c
}

/// The report's counts (its per-request vector left out).
fn counts(m: &RunMetrics) -> String {
    let f = m.flow.as_ref().unwrap();
    format!(
        "queued {} released {} expired {} evicted {} full {} shed {} share {} max {} completed {} rejected {}",
        f.queued,
        f.released,
        f.expired,
        f.evicted,
        f.shed_queue_full,
        f.shed_sheddable,
        f.shed_tenant_share,
        f.max_queue_len,
        m.completed,
        m.rejected
    )
}

fn p99(m: &RunMetrics, cls: &[SimClass], pick: impl Fn(&SimClass) -> bool) -> f64 {
    let t = &m.flow.as_ref().unwrap().ttft_ms_by_request;
    Percentiles::of(&mut classes::ttfts_where(t, cls, pick).0).p99
}

#[test]
fn with_flow_control_off_tagging_changes_no_result() {
    let reqs = workload(400);
    let cls = classes::tag(&reqs, &classes::ClassParams::default());
    let plain = cluster::run(&config(4.0, false), &reqs);
    let tagged = cluster::run_classified(&config(4.0, false), &reqs, &cls);
    assert_eq!(plain.ttft_ms, tagged.ttft_ms);
    assert_eq!(plain.completed, tagged.completed);
    assert_eq!(plain.tpot_ms, tagged.tpot_ms);
    let f = tagged.flow.unwrap();
    assert!(!f.enabled);
    assert_eq!(f.queued, 0);
}

#[test]
fn under_overload_high_priority_goes_first_and_nothing_is_lost() {
    let reqs = workload(1500);
    let cls = classes::tag(&reqs, &classes::ClassParams::default());
    let off = cluster::run_classified(&config(20.0, false), &reqs, &cls);
    let on = cluster::run_classified(&config(20.0, true), &reqs, &cls);
    let unloaded = cluster::run_classified(&config(1.0, false), &reqs, &cls);
    let high = |c: &SimClass| c.priority > 0;
    let (h_off, h_on, h_unloaded) = (
        p99(&off, &cls, high),
        p99(&on, &cls, high),
        p99(&unloaded, &cls, high),
    );
    assert!(
        h_on < 0.5 * h_off,
        "high p99: on {h_on:.0} ms, off {h_off:.0} ms (unloaded {h_unloaded:.0})"
    );
    let f = on.flow.as_ref().unwrap();
    assert!(f.queued > 100, "{}", counts(&on));
    // No TTL bites here and nothing is refused: every request is served.
    assert_eq!(on.completed, reqs.len() as u64, "{}", counts(&on));
    assert_eq!(f.released, f.queued);
    assert_eq!(on.in_flight_left, 0);
    // The queue time lands on normal priority.
    let normal = |c: &SimClass| c.priority == 0;
    assert!(p99(&on, &cls, normal) > p99(&on, &cls, high));
}

#[test]
fn a_tenant_sending_ten_times_its_share_queues_behind_the_others() {
    let reqs = workload(1500);
    let cls = classes::tag(
        &reqs,
        &classes::ClassParams {
            high_share: 0.0,
            ..classes::ClassParams::default()
        },
    );
    let on = cluster::run_classified(&config(20.0, true), &reqs, &cls);
    let off = cluster::run_classified(&config(20.0, false), &reqs, &cls);
    let quiet = |c: &SimClass| c.tenant != 0;
    let noisy = |c: &SimClass| c.tenant == 0;
    let (q_on, q_off) = (p99(&on, &cls, quiet), p99(&off, &cls, quiet));
    assert!(
        q_on < 0.5 * q_off,
        "quiet p99: on {q_on:.0} ms, off {q_off:.0} ms"
    );
    assert!(p99(&on, &cls, noisy) > q_on);
}

#[test]
fn a_short_ttl_sheds_instead_of_queueing_for_ever_and_every_request_is_counted() {
    let reqs = workload(1500);
    let cls = classes::tag(&reqs, &classes::ClassParams::default());
    let mut c = config(20.0, true);
    c.flow.queue_ttl_ms = 2000;
    c.flow.max_queued_requests = 50;
    let m = cluster::run_classified(&c, &reqs, &cls);
    let f = m.flow.as_ref().unwrap();
    assert!(
        f.expired + f.shed_queue_full + f.evicted > 0,
        "{}",
        counts(&m)
    );
    assert_eq!(
        m.completed + m.rejected,
        reqs.len() as u64,
        "{}",
        counts(&m)
    );
    assert_eq!(
        m.rejected,
        f.expired + f.shed_queue_full + f.evicted + f.shed_sheddable + f.shed_tenant_share
    );
    assert!(f.max_queue_len <= 50);
    // Every served request waited at most the TTL in the queue.
    let served_ttfts = f
        .ttft_ms_by_request
        .iter()
        .filter(|t| t.is_finite())
        .count() as u64;
    assert_eq!(served_ttfts, m.completed);
}

#[test]
fn the_bulk_reserve_keeps_room_for_the_quiet_tenants_and_high_priority() {
    let reqs = workload(1500);
    let cls = classes::tag(&reqs, &classes::ClassParams::default());
    // One pod at 8×: this short chat workload keeps its KV under 0.5, so the thresholds are
    // scaled down to where they bind (KV 0.4; bulk requests under 0.1).
    let mut with = config(8.0, true);
    with.flow.saturation.kv_cache_util_threshold = 0.4;
    with.flow.saturation.bulk_kv_reserve = 0.3;
    let mut without = with.clone();
    without.flow.saturation.bulk_kv_reserve = 0.0;
    let (on, plain) = (
        cluster::run_classified(&with, &reqs, &cls),
        cluster::run_classified(&without, &reqs, &cls),
    );
    let quiet = |c: &SimClass| c.tenant != 0;
    let high = |c: &SimClass| c.priority > 0;
    let (q_with, q_without) = (p99(&on, &cls, quiet), p99(&plain, &cls, quiet));
    let (h_with, h_without) = (p99(&on, &cls, high), p99(&plain, &cls, high));
    assert!(
        q_with < q_without,
        "quiet p99 {q_with:.0} vs {q_without:.0} ms"
    );
    assert!(
        h_with <= h_without,
        "high p99 {h_with:.0} vs {h_without:.0} ms"
    );
    // Nothing is lost either way (no TTL bites at this length).
    for m in [&on, &plain] {
        assert_eq!(m.completed, reqs.len() as u64, "{}", counts(m));
        assert_eq!(m.in_flight_left, 0);
    }
}
