//! A real OTLP/HTTP receiver for end-to-end tests: `scripts/otlp_receiver.py`, on the test
//! venv's Python, where the official `opentelemetry-proto` package decodes each
//! `ExportTraceServiceRequest` and writes its spans as JSON lines. For the tests that include it
//! with `#[path = "common/otlp.rs"] mod otlp;`.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn python() -> PathBuf {
    std::env::var_os("KVGATE_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join(".venv/bin/python"))
}

/// Whether `python` can import the receiver's packages.
fn has_otel_proto(python: &Path) -> bool {
    Command::new(python)
        .args([
            "-c",
            "import opentelemetry.proto.collector.trace.v1.trace_service_pb2",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The receiver process, killed when the test ends.
pub struct Receiver {
    child: Child,
    pub port: u16,
    spans: PathBuf,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Receiver {
    pub async fn start(python: &Path, dir: &Path) -> Receiver {
        let spans = dir.join("spans.jsonl");
        let port_file = dir.join("port");
        let child = Command::new(python)
            .arg(workspace().join("scripts/otlp_receiver.py"))
            .arg(&spans)
            .arg("--port-file")
            .arg(&port_file)
            .stdout(Stdio::null())
            .spawn()
            .expect("start scripts/otlp_receiver.py");
        let mut receiver = Receiver {
            child,
            port: 0,
            spans,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(port) = std::fs::read_to_string(&port_file)
                .ok()
                .and_then(|s| s.trim().parse().ok())
            {
                receiver.port = port;
                return receiver;
            }
            assert!(
                receiver.child.try_wait().unwrap().is_none(),
                "the OTLP receiver exited"
            );
            assert!(Instant::now() < deadline, "the OTLP receiver did not start");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.spans)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON span line"))
            .collect()
    }
}

/// A W3C `traceparent`'s (trace id, parent span id, flags).
pub fn parse_traceparent(v: &str) -> (String, String, String) {
    let parts: Vec<&str> = v.split('-').collect();
    assert_eq!(parts.len(), 4, "traceparent {v:?}");
    assert_eq!(parts[0], "00", "traceparent version in {v:?}");
    (
        parts[1].to_string(),
        parts[2].to_string(),
        parts[3].to_string(),
    )
}

/// The venv's Python when it can run the receiver; otherwise `None` after printing why the
/// test `name` is skipped, or a panic when `KVGATE_REQUIRE_OTLP=1` (scripts/test, CI).
pub fn python_or_skip(name: &str) -> Option<PathBuf> {
    let python = python();
    if has_otel_proto(&python) {
        return Some(python);
    }
    let why = format!(
        "{} cannot import opentelemetry-proto (run scripts/test, which installs \
         scripts/requirements-test.txt into .venv, or set KVGATE_PYTHON)",
        python.display()
    );
    if std::env::var("KVGATE_REQUIRE_OTLP").as_deref() == Ok("1") {
        panic!("KVGATE_REQUIRE_OTLP=1 but {why}");
    }
    eprintln!("\n\n!!!!!!!! SKIPPED {name}: {why} !!!!!!!!\n\n");
    None
}

/// The spans of `trace_id` once its `kvgate.request` span has arrived (or after 15 s).
pub async fn spans_of(receiver: &Receiver, trace_id: &str) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let spans: Vec<Value> = receiver
            .spans()
            .into_iter()
            .filter(|s| s["trace_id"] == trace_id)
            .collect();
        if spans.iter().any(|s| s["name"] == "kvgate.request") || Instant::now() > deadline {
            return spans;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
