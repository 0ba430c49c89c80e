//! `kvgate demo` as a user runs it: the binary on ephemeral ports, one streamed chat request
//! through the printed address, then the process is killed.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Kills the demo process when the test ends, whatever way it ends.
struct Demo(Child);

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_binary_prints_its_address_and_streams_a_chat_answer() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvgate"))
        .args([
            "demo",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--time-scale",
            "10",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start kvgate demo");
    let stdout = child.stdout.take().expect("stdout");
    let demo = Demo(child);
    // Read until the listening line, then keep draining stdout so the status lines never
    // block the process.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut tx = Some(tx);
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Some(rest) = line.strip_prefix("kvgate demo: listening on ")
                && let Some(tx) = tx.take()
            {
                let _ = tx.send(rest.to_string());
            }
        }
    });
    let line = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("kvgate demo printed its listening line");
    let mut words = line.split_whitespace();
    let base = words.next().expect("traffic URL").to_string();
    assert_eq!(words.next(), Some("admin"), "line: {line}");
    let admin = words.next().expect("admin URL").to_string();

    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let resp = client
        .post(format!("{base}/v1/chat/completions"))
        .json(&serde_json::json!({
            "model": kvgate_mock_pod::DEFAULT_MODEL,
            "messages": [{"role": "user", "content": "Hello"}],
            "max_tokens": 8,
            "stream": true,
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("text/event-stream")
    );
    assert!(resp.headers().contains_key("x-kvgate-pod"));
    let body = resp.text().await.unwrap();
    let events: Vec<&str> = body.split("\n\n").filter(|e| !e.is_empty()).collect();
    assert_eq!(events.last(), Some(&"data: [DONE]"), "body: {body}");
    // Role chunk + 8 content chunks, no usage chunk (the client did not ask for one).
    assert_eq!(events.len(), 1 + 8 + 1, "body: {body}");
    assert!(!body.contains("\"usage\""), "usage leaked: {body}");

    let ready = client.get(format!("{admin}/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 200);
    assert_eq!(ready.text().await.unwrap(), "ready: 4 healthy pods\n");
    drop(demo);
}
