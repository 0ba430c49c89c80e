//! The two halves of `bench/cost.sh`: a fixed-answer pod and a closed-loop load generator.
//!
//! `cost_bench pod PORT [PORT…]`: one fixed-answer pod per port on 127.0.0.1. Every
//! `POST /v1/chat/completions` is read whole and answered at once with the same small
//! non-streaming completion; `/health`, `/v1/models`, `/metrics` (idle vLLM gauges, block size
//! 16), `/server_info`, `/get_server_info`, `/model_info`, `/get_model_info` answer what kvgate
//! and sglang-router look for. No tokenizer, no engine model: the pods cost as little as
//! possible, so that what is measured is the router.
//!
//! `cost_bench load URL BODY_FILE CONCURRENCY SECONDS`: CONCURRENCY closed-loop clients POST the
//! body to URL for SECONDS (after 1 s of warm-up, not counted). Every occurrence of `@@N@@` in
//! the body is replaced by the request's number (9 digits), so each request can end with a
//! message of its own after a shared prefix. Prints one JSON line: requests, errors,
//! requests_per_s, latency_ms {p50, p90, p99, mean} (after the warm-up), and all_ok (successful
//! requests including the warm-up's, to divide a process's CPU time by).

use axum::Router;
use axum::body::Bytes;
use axum::routing::{get, post};
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const ANSWER: &str = r#"{"id":"cmpl-fixed","object":"chat.completion","created":0,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}"#;

const METRICS: &str = "# TYPE vllm:num_requests_running gauge\n\
vllm:num_requests_running{model_name=\"m\"} 0\n\
# TYPE vllm:num_requests_waiting gauge\n\
vllm:num_requests_waiting{model_name=\"m\"} 0\n\
# TYPE vllm:kv_cache_usage_perc gauge\n\
vllm:kv_cache_usage_perc{model_name=\"m\"} 0\n\
# TYPE vllm:cache_config_info gauge\n\
vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"100000\"} 1\n";

fn json(body: &'static str) -> axum::response::Response {
    axum::response::Response::builder()
        .header("content-type", "application/json")
        .body(axum::body::Body::from(body))
        .unwrap_or_default()
}

async fn pods(ports: Vec<u16>) {
    let app = Router::new()
        .route(
            "/v1/chat/completions",
            post(|_body: Bytes| async { json(ANSWER) }),
        )
        .route("/health", get(|| async { "" }))
        .route(
            "/v1/models",
            get(|| async {
                json(r#"{"object":"list","data":[{"id":"m","object":"model","owned_by":"vllm","max_model_len":1000000}]}"#)
            }),
        )
        .route("/metrics", get(|| async { METRICS }))
        .route(
            "/server_info",
            get(|| async {
                json(r#"{"served_model_name":"m","context_length":1000000,"dp_size":1,"tp_size":1,"page_size":16}"#)
            }),
        )
        .route(
            "/get_server_info",
            get(|| async {
                json(r#"{"served_model_name":"m","context_length":1000000,"dp_size":1,"tp_size":1,"page_size":16}"#)
            }),
        )
        .route(
            "/model_info",
            get(|| async { json(r#"{"is_generation":true,"model_type":"llama"}"#) }),
        )
        .route(
            "/get_model_info",
            get(|| async { json(r#"{"is_generation":true,"model_type":"llama"}"#) }),
        )
        .layer(axum::extract::DefaultBodyLimit::max(64 << 20));
    let mut tasks = Vec::new();
    for port in ports {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .unwrap_or_else(|e| panic!("bind 127.0.0.1:{port}: {e}"));
        let app = app.clone();
        tasks.push(tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
}

async fn load(url: String, body: String, concurrency: usize, seconds: f64) {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build(connector);
    let body = Arc::new(body);
    let counter = Arc::new(AtomicU64::new(0));
    let all_ok = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let warm = Duration::from_secs(1);
    let end = warm + Duration::from_secs_f64(seconds);
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (client, url, body, counter, all_ok) = (
            client.clone(),
            url.clone(),
            body.clone(),
            counter.clone(),
            all_ok.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut hist = Histogram::<u64>::new(3).expect("histogram");
            let mut errors = 0u64;
            loop {
                let n = counter.fetch_add(1, Ordering::Relaxed);
                let text = body.replace("@@N@@", &format!("{n:09}"));
                let req = http::Request::post(&url)
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from(text)))
                    .expect("request");
                let t0 = Instant::now();
                let ok = match client.request(req).await {
                    Ok(resp) => {
                        let status = resp.status();
                        resp.into_body().collect().await.is_ok() && status.is_success()
                    }
                    Err(_) => false,
                };
                if ok {
                    all_ok.fetch_add(1, Ordering::Relaxed);
                }
                let since = t0.duration_since(start);
                if since >= end {
                    break;
                }
                if since >= warm {
                    if ok {
                        let _ = hist.record(t0.elapsed().as_micros() as u64);
                    } else {
                        errors += 1;
                    }
                }
            }
            (hist, errors)
        }));
    }
    let mut hist = Histogram::<u64>::new(3).expect("histogram");
    let mut errors = 0;
    for t in tasks {
        if let Ok((h, e)) = t.await {
            let _ = hist.add(&h);
            errors += e;
        }
    }
    let ms = |q: f64| hist.value_at_quantile(q) as f64 / 1000.0;
    println!(
        "{{\"requests\":{},\"errors\":{},\"requests_per_s\":{:.1},\"latency_ms\":{{\"p50\":{:.3},\"p90\":{:.3},\"p99\":{:.3},\"mean\":{:.3}}},\"all_ok\":{}}}",
        hist.len(),
        errors,
        hist.len() as f64 / seconds,
        ms(0.5),
        ms(0.9),
        ms(0.99),
        hist.mean() / 1000.0,
        all_ok.load(Ordering::Relaxed)
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("pod") => pods(args[1..].iter().filter_map(|p| p.parse().ok()).collect()).await,
        Some("load") if args.len() == 5 => {
            let body = std::fs::read_to_string(&args[2]).expect("read the body file");
            let concurrency = args[3].parse().expect("concurrency");
            let seconds = args[4].parse().expect("seconds");
            load(args[1].clone(), body, concurrency, seconds).await
        }
        _ => {
            eprintln!(
                "usage: cost_bench pod PORT [PORT…] | cost_bench load URL BODY_FILE CONCURRENCY SECONDS"
            );
            std::process::exit(2);
        }
    }
}
