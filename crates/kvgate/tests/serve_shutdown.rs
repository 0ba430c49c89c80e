//! `kvgate serve` as a process receiving SIGTERM: readiness turns false at once, requests are
//! still served for the drain pause (`--shutdown-drain-ms`), then the listener closes and the
//! process exits 0.

mod common;

use common::start_serve;
use kvgate_mock_pod::{DEFAULT_MODEL, PodConfig};
use std::process::Command;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_turns_readiness_false_serves_through_the_drain_then_exits() {
    let config = PodConfig {
        time_scale: 10.0,
        ..PodConfig::default()
    };
    let pod = kvgate_mock_pod::spawn_pods(&config, "127.0.0.1:0".parse().unwrap(), 1)
        .await
        .unwrap()
        .remove(0);
    let pod_url = pod.url();
    let mut serve = start_serve(
        &[
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--pod",
            &pod_url,
            "--shutdown-drain-ms",
            "1500",
        ],
        |_| {},
    );
    let (base, admin) = (serve.base.clone(), serve.admin.clone());
    let c = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let complete = || {
        c.post(format!("{base}/v1/completions"))
            .json(&serde_json::json!({"model": DEFAULT_MODEL, "prompt": "Hi", "max_tokens": 4}))
            .send()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let ready = c.get(format!("{admin}/readyz")).send().await.unwrap();
        if ready.status() == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "never ready");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(complete().await.unwrap().status(), 200);

    let t0 = Instant::now();
    let killed = Command::new("kill")
        .args(["-TERM", &serve.child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(killed.success());
    loop {
        let ready = c.get(format!("{admin}/readyz")).send().await.unwrap();
        if ready.status() == 503 {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(1),
            "readiness never turned false"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Within the drain a new connection is still served.
    let during = reqwest::Client::new();
    let r = during
        .post(format!("{base}/v1/completions"))
        .json(&serde_json::json!({"model": DEFAULT_MODEL, "prompt": "Hi", "max_tokens": 4}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(t0.elapsed() < Duration::from_millis(1500));
    // Then the process exits by itself, after the drain.
    let status = loop {
        if let Some(status) = serve.child.try_wait().unwrap() {
            break status;
        }
        assert!(t0.elapsed() < Duration::from_secs(15), "did not exit");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(status.success(), "{status}");
    assert!(
        t0.elapsed() >= Duration::from_millis(1500),
        "exited before the drain ended"
    );
    let addr = base.trim_start_matches("http://");
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}
