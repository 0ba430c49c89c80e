//! What the predictor learns of a retried stream: its TTFT counted from the dispatch that
//! answered, not from the request's arrival (the first attempt's first-byte timeout is not the
//! pod's). Its own test binary: it installs the process's global log subscriber to read the
//! `kvgate::samples` debug lines.

mod common;

use common::*;
use std::io::Write;
use std::sync::{Arc, Mutex};

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_streams_ttft_is_learnt_from_the_attempt_that_answered() {
    let captured = Captured::default();
    let writer = captured.clone();
    tracing::subscriber::set_global_default(
        tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_env_filter("kvgate::samples=debug")
            .with_ansi(false)
            .finish(),
    )
    .unwrap();
    let (hung, ok, gw) = hung_and_ok(300).await;
    let c = client();
    for i in 0..2 {
        let body = chat_body(&format!("q{i}"), true);
        let r = send(&c, post(&gw, "/v1/chat/completions", &body)).await;
        assert_eq!(r.status, http::StatusCode::OK);
    }
    assert!(
        hung.requests() >= 1,
        "the hung pod was tried first at least once"
    );
    assert_idle(&gw, &[&hung, &ok]).await;
    let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let learnt: Vec<f64> = text
        .lines()
        .filter(|l| l.contains("training sample"))
        .filter_map(|l| {
            let v = l.split("observed_ttft_ms=").nth(1)?;
            v.split_whitespace().next()?.parse().ok()
        })
        .collect();
    assert_eq!(learnt.len(), 2, "{text}");
    // A retried request's client waited the 300 ms timeout before its retry; the pod that
    // answered took milliseconds.
    assert!(learnt.iter().all(|&ms| ms < 150.0), "learnt {learnt:?}");
    let m = gw.shared().metrics_text().unwrap();
    let client_ttft_sum: f64 = m
        .lines()
        .find_map(|l| l.strip_prefix("kvgate_ttft_ms_sum "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap();
    assert!(
        client_ttft_sum >= 300.0,
        "the clients' TTFT keeps the wait: {client_ttft_sum} ms"
    );
}
