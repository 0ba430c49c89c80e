//! Several router replicas behind round-robin (`ClusterConfig::replicas`), with and without
//! sharing routing state (`ClusterConfig::sharing`, the gateway's `--cluster`).

use kvgate_core::policy::PolicyKind;
use kvgate_sim::SimRequest;
use kvgate_sim::cluster::{self, ClusterConfig, Sharing};
use kvgate_sim::workload::segments;

/// One 2,000-token prompt asked 4 times, far apart: request i goes to replica i mod 2.
fn repeated_prompt() -> Vec<SimRequest> {
    (0..4)
        .map(|i| SimRequest {
            id: i,
            arrival_ms: i as f64 * 30_000.0,
            input_tokens: 2_000,
            output_tokens: 8,
            blocks: segments::prompt_blocks(&[segments::Segment::new(9, 2_000)]),
            adapter: None,
            session: None,
        })
        .collect()
}

fn config(replicas: u32, sharing: Option<Sharing>) -> ClusterConfig {
    ClusterConfig {
        router: kvgate_core::RouterConfig {
            epsilon_explore_sticky: 0.0,
            ..Default::default()
        },
        replicas,
        sharing,
        ..ClusterConfig::new(4, PolicyKind::AffinityGate, 1)
    }
}

/// `max_requests` requests of the chat generator with `seed`.
fn chat(seed: u64, max_requests: usize) -> Vec<SimRequest> {
    kvgate_sim::workload::chat::generate(&kvgate_sim::workload::chat::ChatParams {
        seed,
        max_requests,
        ..Default::default()
    })
    .unwrap()
    .1
}

const NOW: Sharing = Sharing {
    delay_ms: 1.0,
    loss: 0.0,
    samples: true,
};

#[test]
fn one_replica_runs_exactly_as_before_whatever_the_sharing() {
    let reqs = repeated_prompt();
    let a = cluster::run(&config(1, None), &reqs);
    let b = cluster::run(&config(1, Some(NOW)), &reqs);
    assert_eq!(format!("{a:?}"), format!("{b:?}"));
}

#[test]
fn shared_replicas_route_a_repeated_prompt_as_one_router_would() {
    let reqs = repeated_prompt();
    let one = cluster::run(&config(1, None), &reqs);
    let shared = cluster::run(&config(2, Some(NOW)), &reqs);
    let alone = cluster::run(&config(2, None), &reqs);
    // One router: the first is cold, the other three exploit the pod holding the prompt.
    assert_eq!(one.gate.exploit, 3);
    assert_eq!(shared.gate.exploit, 3, "{:?}", shared.branches);
    assert_eq!(shared.prefix_hit_rate, one.prefix_hit_rate);
    // Independent replicas: replica 1 first sees the prompt cold, so it hits less.
    assert_eq!(alone.gate.exploit, 2, "{:?}", alone.branches);
    assert!(alone.prefix_hit_rate <= shared.prefix_hit_rate);
    for m in [&one, &shared, &alone] {
        assert_eq!(m.completed, 4);
        assert_eq!(m.in_flight_left, 0);
    }
}

#[test]
fn lossy_sharing_completes_everything_and_leaves_no_charge_behind() {
    let reqs = chat(5, 600);
    for loss in [0.0, 0.3] {
        let m = cluster::run(
            &config(
                4,
                Some(Sharing {
                    delay_ms: 5.0,
                    loss,
                    samples: true,
                }),
            ),
            &reqs,
        );
        assert_eq!(m.completed, 600, "loss {loss}");
        assert_eq!(m.in_flight_left, 0, "loss {loss}");
    }
}

#[test]
fn with_shared_samples_each_replica_learns_from_every_completed_request() {
    let reqs = chat(5, 400);
    let learnt = |samples: bool| {
        let m = cluster::run(&config(4, Some(Sharing { samples, ..NOW })), &reqs);
        assert_eq!(m.completed, 400);
        // The report's predictor is replica 0's.
        m.predictor.online.samples + m.predictor.online.rejected_targets
    };
    // The fleet's requests, less the last few samples still on the wire (1 ms) at the end.
    let shared = learnt(true);
    assert!(
        (390..=400).contains(&shared),
        "replica 0 learnt {shared} of 400"
    );
    // Round-robin: replica 0 routed a quarter of them.
    assert_eq!(learnt(false), 100, "replica 0 learnt its own requests only");
}

#[test]
fn staggered_scrapes_leave_one_replica_alone_and_give_each_replica_its_own_view() {
    // 1000 requests at 16× their rate: enough load that the scraped state moves decisions
    // (with 400 at 8× the default predictor's decisions happened not to change).
    let reqs = chat(3, 1000);
    let staggered = |replicas| ClusterConfig {
        staggered_scrapes: true,
        rate_scale: 16.0,
        record_routes: true,
        ..config(replicas, Some(NOW))
    };
    // One replica: the same single scrape schedule, so the same run.
    let plain = |replicas| ClusterConfig {
        rate_scale: 16.0,
        record_routes: true,
        ..config(replicas, Some(NOW))
    };
    let a = cluster::run(&plain(1), &reqs);
    let b = cluster::run(&staggered(1), &reqs);
    assert!(format!("{a:?}") == format!("{b:?}"), "one replica changed");
    // Four: each replica decides on its own (older or newer) scrape, so decisions change,
    // and nothing is lost or left charged.
    let shared = cluster::run(&plain(4), &reqs);
    let own = cluster::run(&staggered(4), &reqs);
    assert_eq!(own.completed, reqs.len() as u64);
    assert_eq!(own.in_flight_left, 0);
    assert_ne!(format!("{:?}", own.routes), format!("{:?}", shared.routes));
}
