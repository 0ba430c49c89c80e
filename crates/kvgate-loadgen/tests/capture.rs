//! Capture round trip: loadgen → kvgate serve --capture → kvgate_sim::workload::load_trace.

mod common;

use std::time::Duration;

use common::{args, mooncake_trace};
use kvgate_gateway::{Gateway, ServeArgs};
use kvgate_mock_pod::{PodConfig, spawn_pods};
use kvgate_sim::workload::load_trace;

fn shared_leading(a: &[u64], b: &[u64]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn captured_traffic_replays_with_the_same_count_and_sharing_structure() {
    let config = PodConfig {
        time_scale: 20.0,
        ..PodConfig::default()
    };
    let pods = spawn_pods(&config, "127.0.0.1:0".parse().unwrap(), 2)
        .await
        .unwrap();
    let trace = mooncake_trace("capture-in");
    let captured = trace.with_extension("captured.jsonl");
    let _ = std::fs::remove_file(&captured);
    let gw = Gateway::start(ServeArgs {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        admin_listen: Some("127.0.0.1:0".parse().unwrap()),
        pod: pods.iter().map(|p| p.url()).collect(),
        scrape_interval_ms: Some(20),
        capture: Some(captured.clone()),
        ..ServeArgs::default()
    })
    .await
    .unwrap();
    let mut a = args(format!("http://{}", gw.traffic_addr), trace.clone());
    a.pod_metrics = pods.iter().map(|p| p.url()).collect();
    let report = kvgate_loadgen::run(a).await.unwrap();
    assert_eq!(report.completed, 12, "errors: {:?}", report.errors);

    // The writer thread appends asynchronously.
    let mut lines = 0;
    for _ in 0..100 {
        lines = std::fs::read_to_string(&captured)
            .map(|t| t.lines().count())
            .unwrap_or(0);
        if lines == 12 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(lines, 12);
    let text = std::fs::read_to_string(&captured).unwrap();
    assert!(!text.contains(" the"), "no prompt text in the capture");

    let (_, original) = load_trace(&trace).unwrap();
    let (_, replayed) = load_trace(&captured).unwrap();
    assert_eq!(replayed.len(), original.len());
    for (o, r) in original.iter().zip(&replayed) {
        assert_eq!(
            r.input_tokens, o.input_tokens,
            "usage.prompt_tokens is exact"
        );
        assert_eq!(r.output_tokens, o.output_tokens);
    }
    // Every pair shares exactly as many leading 16-token blocks in the replay as in the trace.
    for (i, (oi, ri)) in original.iter().zip(&replayed).enumerate() {
        for (j, (oj, rj)) in original.iter().zip(&replayed).enumerate().skip(i + 1) {
            assert_eq!(
                shared_leading(&ri.blocks, &rj.blocks),
                shared_leading(&oi.blocks, &oj.blocks),
                "requests {i} and {j}"
            );
        }
    }
    // Timestamps keep the trace's spacing roughly (20 ms apart within a turn, 300 ms per turn).
    let last = replayed.last().map(|r| r.arrival_ms).unwrap_or(0.0);
    assert!((600.0..1500.0).contains(&last), "{last}");
    drop(gw);
    let _ = std::fs::remove_file(trace);
    let _ = std::fs::remove_file(captured);
}
