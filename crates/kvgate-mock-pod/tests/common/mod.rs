//! Shared helpers of the mock pod's end-to-end tests: pods on 127.0.0.1 ephemeral ports.

#![allow(dead_code)]

use std::time::{Duration, Instant};

use kvgate_mock_pod::{PodConfig, RunningPod, spawn_pod};
use serde_json::Value;

pub const MODEL: &str = kvgate_mock_pod::DEFAULT_MODEL;

pub async fn pod(config: PodConfig) -> RunningPod {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    spawn_pod(config, listener).await.unwrap()
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

/// A prompt of roughly `4 × words` cl100k tokens, distinct per `doc`.
pub fn long_prompt(doc: u32, words: u32) -> String {
    (0..words).map(|i| format!("doc{doc} w{i} ")).collect()
}

/// A prompt of `n` token ids (in cl100k's vocabulary), distinct per `doc` (tokenizer-free, so
/// latency tests measure the engine model, not a debug-build tokenizer).
pub fn token_prompt(doc: u32, n: u32) -> Value {
    (0..n).map(|i| (doc * 7919 + i) % 100_000).collect()
}

/// Streams a completion; returns (time to first token chunk, the data payloads before [DONE]).
pub async fn stream_completion(
    client: &reqwest::Client,
    url: &str,
    body: Value,
) -> (Duration, Vec<Value>) {
    let start = Instant::now();
    let mut resp = client
        .post(format!("{url}/v1/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut buf = String::new();
    let mut ttft = None;
    while let Some(chunk) = resp.chunk().await.unwrap() {
        if ttft.is_none() {
            ttft = Some(start.elapsed());
        }
        buf.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    (ttft.unwrap(), parse_sse(&buf))
}

/// The JSON payloads of an SSE body; asserts it ends with `data: [DONE]`.
pub fn parse_sse(body: &str) -> Vec<Value> {
    let events: Vec<&str> = body
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            e.strip_prefix("data: ")
                .expect("every event is a data line")
        })
        .collect();
    assert_eq!(events.last(), Some(&"[DONE]"), "stream ends with [DONE]");
    events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect()
}

/// `KVGATE_PYTHON`, else `<workspace>/.venv/bin/python`; panics with how to create it.
pub fn python() -> std::path::PathBuf {
    if let Some(p) = std::env::var_os("KVGATE_PYTHON") {
        return p.into();
    }
    let venv = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/python");
    assert!(
        venv.exists(),
        "no Python venv for the end-to-end tests: run `scripts/test` (it creates .venv with \
         openai, pyzmq and msgpack and sets KVGATE_PYTHON), or set KVGATE_PYTHON"
    );
    venv
}

/// Runs `tests/py/<script>` with `args`; panics with its output when it fails.
pub fn run_python(script: &str, args: &[&str]) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/py")
        .join(script);
    run_python_at(&path, args);
}

/// Runs the Python script at `path` with `args`; panics with its output when it fails, and
/// returns its stdout.
pub fn run_python_at(path: &std::path::Path, args: &[&str]) -> String {
    let script = path.display();
    let out = std::process::Command::new(python())
        .arg(path)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
