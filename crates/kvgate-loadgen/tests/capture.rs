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

/// `--classes`: every request reaches kvgate's flow control with the simulator's tags — the
/// gateway's per-tenant / per-band dispatch counters equal the report's groups, and the
/// per-request lines carry the same priority and tenant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn class_tags_reach_the_gateways_flow_control_as_headers() {
    let config = PodConfig {
        time_scale: 20.0,
        ..PodConfig::default()
    };
    let pods = spawn_pods(&config, "127.0.0.1:0".parse().unwrap(), 2)
        .await
        .unwrap();
    let dir = std::env::temp_dir().join(format!("kvgate-loadgen-classes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config_file = dir.join("kvgate.toml");
    std::fs::write(&config_file, "[flow_control]\nenabled = true\n").unwrap();
    let gw = Gateway::start(ServeArgs {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        admin_listen: Some("127.0.0.1:0".parse().unwrap()),
        pod: pods.iter().map(|p| p.url()).collect(),
        scrape_interval_ms: Some(20),
        config: Some(config_file),
        ..ServeArgs::default()
    })
    .await
    .unwrap();
    let trace = mooncake_trace("classes");
    let per_request = trace.with_extension("classes.jsonl");
    let mut a = args(format!("http://{}", gw.traffic_addr), trace.clone());
    a.classes = true;
    a.class_seed = 5;
    a.high_share = 0.5;
    a.high_priority = 3;
    a.tenants = 3;
    a.noisy_factor = 2.0;
    a.noisy_keep = 1.0;
    a.requests_jsonl = Some(per_request.clone());
    let report = kvgate_loadgen::run(a).await.unwrap();
    assert_eq!(report.completed, 12, "errors: {:?}", report.errors);
    let c = report.classes.expect("--classes reports per group");
    assert_eq!(c.high.requests + c.normal.requests, 12);
    assert_eq!(c.quiet_tenants.requests + c.noisy_tenant.requests, 12);
    assert!(c.high.requests > 0 && c.normal.requests > 0, "{c:?}");

    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&per_request)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let _ = std::fs::remove_file(&per_request);
    let metrics = gw.shared().metrics_text().unwrap();
    let dispatched = |band: i64, tenant: u64| -> f64 {
        metrics
            .lines()
            .filter(|l| l.starts_with("kvgate_flow_dispatched_total{"))
            .filter(|l| l.contains(&format!("band=\"{band}\"")))
            .filter(|l| l.contains(&format!("tenant=\"tenant-{tenant}\"")))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    for band in [0, 3] {
        for tenant in 0..3 {
            let sent = lines
                .iter()
                .filter(|l| l["priority"] == band && l["tenant"] == tenant)
                .count();
            assert_eq!(
                dispatched(band, tenant as u64),
                sent as f64,
                "band {band} tenant {tenant}"
            );
        }
    }
    assert_eq!(
        lines.iter().filter(|l| l["priority"] == 3).count() as u64,
        c.high.requests
    );
    // Through kvgate each line names the pod that served it (`x-kvgate-pod`), one of the two,
    // and the decision's branch (`x-kvgate-branch`), and, the fleet keeping up, no time in the
    // flow queue (no `x-kvgate-queue-ms`).
    let urls: Vec<String> = pods.iter().map(|p| p.url()).collect();
    for l in &lines {
        let pod = l["pod"].as_str().expect("pod");
        assert!(urls.iter().any(|u| u == pod), "{pod} not in {urls:?}");
        assert!(l["branch"].as_str().is_some_and(|b| !b.is_empty()), "{l}");
        assert!(l.get("queue_ms").is_none(), "{l}");
        assert!(l["input_tokens"].as_u64().unwrap() > 0);
    }
    let _ = std::fs::remove_file(trace);
}
