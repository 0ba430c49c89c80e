//! Config file reloading: valid changes apply, invalid files keep the old config.

mod common;

use common::*;
use kvgate_gateway::reload::reload_now;

#[tokio::test]
async fn config_reload_applies_valid_files_and_keeps_the_old_config_on_invalid_ones() {
    let a = FakePod::start(Behavior::Normal {
        chunks: 2,
        delay_ms: 1,
    })
    .await;
    let b = FakePod::start(Behavior::Normal {
        chunks: 2,
        delay_ms: 1,
    })
    .await;
    let dir = std::env::temp_dir().join(format!("kvgate-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("kvgate.toml");
    std::fs::write(
        &path,
        format!(
            "pods = [\"{}\"]\n[router]\naffinity_gate_tau = 0.8\n",
            a.url
        ),
    )
    .unwrap();
    let mut args = args(&[]);
    args.config = Some(path.clone());
    let gw = kvgate_gateway::Gateway::start(args.clone()).await.unwrap();
    assert_eq!(gw.shared().config().pods.len(), 1);

    // Invalid: syntax error, unknown key, out-of-range value. Old config stays.
    for bad in [
        "pods = [",
        "nonsense_key = 3\n",
        "[router]\naffinity_gate_tau = 7.0\n",
    ] {
        std::fs::write(&path, bad).unwrap();
        assert!(reload_now(gw.shared(), &args, &path).is_err(), "{bad}");
        assert_eq!(gw.shared().config().pods.len(), 1);
        assert_eq!(gw.shared().config().router.affinity_gate_tau, 0.8);
    }
    assert_eq!(gw.shared().telemetry.metrics.config_reload_errors.get(), 3);

    // Valid: the watcher picks it up by itself (mtime/size poll every second).
    std::fs::write(
        &path,
        format!(
            "pods = [\"{}\", \"{}\"]\n[router]\naffinityGateTau = 0.5\n",
            a.url, b.url
        ),
    )
    .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while gw.shared().config().pods.len() != 2 {
        assert!(std::time::Instant::now() < deadline, "reload not picked up");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(gw.shared().config().router.affinity_gate_tau, 0.5);
    eventually("new pod scraped healthy", || {
        gw.pod_healthy(&b.url) == Some(true)
    })
    .await;

    // Removing a pod drops it from the table and its per-pod gauges from /metrics.
    let healthy_series = |url: &str| format!("kvgate_pod_healthy{{pod=\"{url}\"}}");
    let text = gw.shared().metrics_text().unwrap();
    assert!(text.contains(&healthy_series(&a.url)), "{text}");
    std::fs::write(&path, format!("pods = [\"{}\"]\n", b.url)).unwrap();
    reload_now(gw.shared(), &args, &path).unwrap();
    assert_eq!(gw.in_flight(&a.url), None);
    assert!(gw.pod_healthy(&b.url).is_some());
    let text = gw.shared().metrics_text().unwrap();
    assert!(!text.contains(&healthy_series(&a.url)), "{text}");
    assert!(text.contains(&healthy_series(&b.url)), "{text}");
}
