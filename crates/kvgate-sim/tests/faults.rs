//! Pod outages in the simulated cluster: nothing is lost, and the router avoids a dead pod.

use kvgate_core::policy::PolicyKind;
use kvgate_sim::SimRequest;
use kvgate_sim::cluster::{self, ClusterConfig};
use kvgate_sim::faults::FaultPlan;
use kvgate_sim::workload::{chat, segments};

fn chat_workload(n: usize) -> Vec<SimRequest> {
    chat::generate(&chat::ChatParams {
        seed: 3,
        max_requests: n,
        ..chat::ChatParams::default()
    })
    .unwrap()
    .1
}

fn request(id: u64, arrival_ms: f64, segment: u64, input_tokens: u32, output: u32) -> SimRequest {
    SimRequest {
        id,
        arrival_ms,
        input_tokens,
        output_tokens: output,
        blocks: segments::prompt_blocks(&[segments::Segment::new(segment, input_tokens)]),
        adapter: None,
        session: None,
    }
}

#[test]
fn every_request_ends_completed_rejected_or_failed_under_outages_for_every_policy() {
    let reqs = chat_workload(600);
    let horizon_s = reqs.last().unwrap().arrival_ms / 1000.0 / 4.0;
    // Each pod in turn down for a fifth of the period, over the whole (4× faster) run.
    let every = horizon_s / 6.0;
    let spec = format!("every={every},down={},start=0", every / 5.0);
    for policy in PolicyKind::ALL {
        let config = ClusterConfig {
            rate_scale: 4.0,
            faults: Some(FaultPlan::parse(&spec).unwrap()),
            ..ClusterConfig::new(3, policy, 7)
        };
        let m = cluster::run(&config, &reqs);
        let f = m.faults.as_ref().expect("a fault report");
        assert!(
            f.outages.len() >= 6,
            "{policy:?}: {} outages",
            f.outages.len()
        );
        assert_eq!(m.requests, 600, "{policy:?}");
        assert_eq!(
            m.completed + m.rejected + f.failed(),
            m.requests,
            "{policy:?}"
        );
        assert_eq!(m.in_flight_left, 0, "{policy:?}: router counters leak");
        assert!(f.dropped_by_crash > 0, "{policy:?}: no crash hit a request");
        let arrived: u64 = f.timeline.iter().map(|w| w.arrived).sum();
        assert_eq!(arrived, 600, "{policy:?}");
    }
}

#[test]
fn a_request_waiting_on_a_dying_pod_is_retried_elsewhere_with_ttft_from_its_arrival() {
    // Pod 0 (round-robin's first pick) gets a long prompt at t=0 and dies at t=1 ms, before any
    // first token; the request is retried on pod 1 and completes there.
    let reqs = [request(0, 0.0, 1, 30_000, 2)];
    let config = ClusterConfig {
        faults: Some(FaultPlan::parse("0@0.001-100").unwrap()),
        ..ClusterConfig::new(2, PolicyKind::RoundRobin, 1)
    };
    let m = cluster::run(&config, &reqs);
    let f = m.faults.unwrap();
    assert_eq!((m.completed, f.retried, f.failed()), (1, 1, 0));
    assert_eq!(f.dropped_by_crash, 1);
    // The retry started from scratch at 1 ms: TTFT = 1 ms + one full prefill on pod 1.
    let alone = cluster::run(&ClusterConfig::new(2, PolicyKind::RoundRobin, 1), &reqs);
    assert!(
        (m.ttft_ms.mean - (alone.ttft_ms.mean + 1.0)).abs() < 1e-6,
        "{} vs {} + 1",
        m.ttft_ms.mean,
        alone.ttft_ms.mean
    );
}

#[test]
fn a_streaming_request_on_a_dying_pod_fails_and_a_dead_pod_is_avoided() {
    // Request 0 streams a long answer on pod 0, which dies mid-decode; later requests find pod 0
    // refusing connections (then unhealthy) and all complete on pod 1.
    let mut reqs = vec![request(0, 0.0, 1, 1000, 5000)];
    for i in 1..20 {
        reqs.push(request(
            i,
            2000.0 + f64::from(i as u32) * 100.0,
            10 + i,
            1000,
            5,
        ));
    }
    let config = ClusterConfig {
        faults: Some(FaultPlan::parse("0@1-3600").unwrap()),
        ..ClusterConfig::new(2, PolicyKind::RoundRobin, 1)
    };
    let m = cluster::run(&config, &reqs);
    let f = m.faults.unwrap();
    assert_eq!(f.failed_mid_stream, 1);
    assert_eq!(m.completed, 19);
    assert_eq!(m.in_flight_left, 0);
}

#[test]
fn runs_with_faults_are_deterministic() {
    let reqs = chat_workload(300);
    let run = || {
        let config = ClusterConfig {
            rate_scale: 4.0,
            faults: Some(FaultPlan::parse("every=20,down=5,start=1").unwrap()),
            ..ClusterConfig::new(3, PolicyKind::AffinityGate, 3)
        };
        let mut m = cluster::run(&config, &reqs);
        m.sim_wall_s = 0.0;
        serde_json::to_string(&m).unwrap()
    };
    assert_eq!(run(), run());
}

#[test]
fn with_the_engine_index_a_restart_clears_the_pods_view() {
    use kvgate_sim::events::{IndexConfig, IndexMode};
    let reqs = chat_workload(300);
    let config = ClusterConfig {
        rate_scale: 4.0,
        faults: Some(FaultPlan::parse("every=10,down=2,start=1").unwrap()),
        index: IndexConfig {
            mode: IndexMode::Engine,
            ..IndexConfig::default()
        },
        ..ClusterConfig::new(3, PolicyKind::AffinityGate, 3)
    };
    let m = cluster::run(&config, &reqs);
    let f = m.faults.as_ref().unwrap();
    let index = m.kv_index.as_ref().unwrap();
    assert_eq!(index.pod_restarts, f.outages.len() as u64);
    assert_eq!(m.completed + m.rejected + f.failed(), m.requests);
    // With every restart known, the engine index never claims blocks a restarted pod lost: it
    // stays as exact as without faults (routing history alone would keep the old entries).
    assert!(
        index.decisions_exact as f64 >= 0.97 * index.decisions as f64,
        "{} of {}",
        index.decisions_exact,
        index.decisions
    );
}
