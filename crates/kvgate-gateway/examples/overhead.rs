//! Latency the gateway adds over going straight to a pod.
//!
//! `cargo run --release -p kvgate-gateway --example overhead [-- SECONDS] [--tracing off|RATIO]
//! [--count N]`
//!
//! Starts an in-process upstream that answers every streaming chat request at once with 16
//! content chunks (so the pod is never the bottleneck), and a gateway in front of it (one pod,
//! affinity gate). For 1 and 64 concurrent closed-loop streams it measures, direct and through
//! the gateway: time to first content chunk and to the end of the stream (p50/p99), and
//! requests/s. Everything runs in one process, so client, gateway and upstream share the CPUs.
//!
//! `--tracing RATIO`: the gateway with `[tracing]` on (`sampling_ratio = RATIO`), exporting to
//! an OTLP endpoint on the in-process upstream that accepts and drops every export (`off`, the
//! default: tracing off). `--count N`: instead of the table, N streams one after the other
//! through the gateway after a 50-stream warm-up, then a shutdown that exports what is queued
//! (for instruction counts: `bench/otel_cost.sh` runs it under callgrind at two N and takes
//! the difference, so start-up is not counted); the pod is then scraped every 60 s only, and
//! everything runs on one thread (a current-thread runtime).

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kvgate_gateway::{Gateway, ServeArgs};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CHUNKS: usize = 16;

/// OTLP export requests and their bytes received by the upstream's `/v1/traces`.
static EXPORTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static EXPORTED_BYTES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

async fn upstream() -> String {
    let mut events = String::from(
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
    );
    for i in 0..CHUNKS {
        events.push_str(&format!(
            "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"tok{i} \"}}}}]}}\n\n"
        ));
    }
    let usage = format!(
        "data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":250,\"completion_tokens\":{CHUNKS},\"total_tokens\":{}}}}}\n\n",
        250 + CHUNKS
    );
    let body: Arc<(String, String)> = Arc::new((events, usage));
    let app = axum::Router::new()
        .route(
            "/v1/traces",
            axum::routing::post(|body: Bytes| async move {
                EXPORTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                EXPORTED_BYTES.fetch_add(body.len() as u64, std::sync::atomic::Ordering::Relaxed);
                let mut r = Response::new(Body::empty());
                r.headers_mut().insert(
                    "content-type",
                    http::HeaderValue::from_static("application/x-protobuf"),
                );
                r
            }),
        )
        .route(
            "/metrics",
            axum::routing::get(|| async {
                "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0\n"
            }),
        )
        .route(
            "/v1/chat/completions",
            axum::routing::post(move |req: axum::extract::Request| {
                let body = body.clone();
                async move {
                    let bytes = req.into_body().collect().await.map(|c| c.to_bytes()).unwrap_or_default();
                    let wants_usage = memchr::memmem::find(&bytes, b"include_usage").is_some();
                    let mut parts: Vec<Result<Bytes, std::io::Error>> = body
                        .0
                        .split_inclusive("\n\n")
                        .map(|e| Ok(Bytes::copy_from_slice(e.as_bytes())))
                        .collect();
                    if wants_usage {
                        parts.push(Ok(Bytes::copy_from_slice(body.1.as_bytes())));
                    }
                    parts.push(Ok(Bytes::from_static(b"data: [DONE]\n\n")));
                    let mut r = Response::new(Body::from_stream(futures_util::stream::iter(parts)));
                    r.headers_mut().insert("content-type", http::HeaderValue::from_static("text/event-stream"));
                    r
                }
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    use axum::serve::ListenerExt;
    let listener = listener.tap_io(|s| {
        let _ = s.set_nodelay(true);
    });
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

struct Run {
    ttft: Histogram<u64>,
    e2e: Histogram<u64>,
    requests: u64,
    elapsed: Duration,
}

async fn run(base: &str, concurrency: usize, duration: Duration) -> Run {
    let mut conn = HttpConnector::new();
    conn.set_nodelay(true);
    let client: Client<HttpConnector, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(1024)
        .build(conn);
    let prompt = "You are a helpful assistant. ".repeat(35);
    let body = Bytes::from(
        serde_json::json!({"model":"m","stream":true,"messages":[{"role":"system","content":prompt},{"role":"user","content":"hi"}]})
            .to_string(),
    );
    let url = format!("{base}/v1/chat/completions");
    let start = Instant::now();
    let deadline = start + duration;
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (client, body, url) = (client.clone(), body.clone(), url.clone());
        tasks.push(tokio::spawn(async move {
            let mut ttft = Histogram::<u64>::new(3).expect("hist");
            let mut e2e = Histogram::<u64>::new(3).expect("hist");
            let mut n = 0u64;
            while Instant::now() < deadline {
                let req = http::Request::post(&url)
                    .header("content-type", "application/json")
                    .body(Full::new(body.clone()))
                    .expect("request");
                let t0 = Instant::now();
                let resp = client.request(req).await.expect("response");
                assert!(resp.status().is_success(), "status {}", resp.status());
                let mut b = resp.into_body();
                let mut first = None;
                while let Some(f) = b.frame().await {
                    let f = f.expect("frame");
                    if first.is_none()
                        && f.data_ref()
                            .is_some_and(|d| memchr::memmem::find(d, b"tok").is_some())
                    {
                        first = Some(t0.elapsed());
                    }
                }
                let _ = ttft.record(first.unwrap_or_default().as_micros() as u64);
                let _ = e2e.record(t0.elapsed().as_micros() as u64);
                n += 1;
            }
            (ttft, e2e, n)
        }));
    }
    let mut out = Run {
        ttft: Histogram::new(3).expect("hist"),
        e2e: Histogram::new(3).expect("hist"),
        requests: 0,
        elapsed: Duration::ZERO,
    };
    for t in tasks {
        let (ttft, e2e, n) = t.await.expect("task");
        out.ttft.add(ttft).expect("add");
        out.e2e.add(e2e).expect("add");
        out.requests += n;
    }
    out.elapsed = start.elapsed();
    out
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

/// N streams one after the other through `base`.
async fn sequential(base: &str, n: u64) {
    let mut conn = HttpConnector::new();
    conn.set_nodelay(true);
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build(conn);
    let prompt = "You are a helpful assistant. ".repeat(35);
    let body = Bytes::from(
        serde_json::json!({"model":"m","stream":true,"messages":[{"role":"system","content":prompt},{"role":"user","content":"hi"}]})
            .to_string(),
    );
    let url = format!("{base}/v1/chat/completions");
    for _ in 0..n {
        let req = http::Request::post(&url)
            .header("content-type", "application/json")
            .body(Full::new(body.clone()))
            .expect("request");
        let resp = client.request(req).await.expect("response");
        assert!(resp.status().is_success(), "status {}", resp.status());
        let mut b = resp.into_body();
        while let Some(f) = b.frame().await {
            f.expect("frame");
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let secs: u64 = args.first().and_then(|s| s.parse().ok()).unwrap_or(3);
    let tracing = flag("--tracing").unwrap_or_else(|| "off".into());
    let count: Option<u64> = flag("--count").and_then(|s| s.parse().ok());
    // Counting instructions: one thread runs client, gateway and upstream, so that no idle
    // worker's spinning (which depends on timing) is counted; the table: the usual runtime.
    let rt = match count {
        Some(_) => tokio::runtime::Builder::new_current_thread(),
        None => tokio::runtime::Builder::new_multi_thread(),
    }
    .enable_all()
    .build()
    .expect("runtime");
    rt.block_on(bench(secs, tracing, count));
}

async fn bench(secs: u64, tracing: String, count: Option<u64>) {
    let up = upstream().await;
    let config = (tracing != "off").then(|| {
        let ratio: f64 = tracing.parse().expect("--tracing off|RATIO");
        let path =
            std::env::temp_dir().join(format!("kvgate-overhead-{}.toml", std::process::id()));
        std::fs::write(
            &path,
            format!(
                "[tracing]\notlp_traces_endpoint = \"{up}/v1/traces\"\nsampling_ratio = {ratio}\n"
            ),
        )
        .expect("write config");
        path
    });
    let gw = Gateway::start(ServeArgs {
        listen: Some("127.0.0.1:0".parse().expect("addr")),
        admin_listen: Some("127.0.0.1:0".parse().expect("addr")),
        pod: vec![up.clone()],
        config: config.clone(),
        // Counting instructions: the pod scraped at start and then rarely, so that the scrape
        // loop's work (which grows with the run's wall time, long under valgrind) stays out of
        // the per-request difference.
        scrape_interval_ms: count.map(|_| 60_000),
        ..ServeArgs::default()
    })
    .await
    .expect("gateway");
    while gw.pod_healthy(&up) != Some(true) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let via = format!("http://{}", gw.traffic_addr);
    if let Some(n) = count {
        sequential(&via, 50).await;
        sequential(&via, n).await;
        gw.shutdown(Duration::from_secs(5)).await;
        println!(
            "tracing {tracing}: {n} streams; {} OTLP exports, {} bytes",
            EXPORTS.load(std::sync::atomic::Ordering::Relaxed),
            EXPORTED_BYTES.load(std::sync::atomic::Ordering::Relaxed)
        );
        if let Some(p) = config {
            let _ = std::fs::remove_file(p);
        }
        return;
    }
    println!(
        "stream of {CHUNKS} chunks, {secs} s per row, client + gateway + upstream in one process, tracing {tracing}"
    );
    println!(
        "{:>4} {:>8} | {:>9} {:>9} | {:>9} {:>9} | {:>8}",
        "conc", "path", "ttft p50", "ttft p99", "e2e p50", "e2e p99", "req/s"
    );
    for conc in [1usize, 64] {
        // Warm up both paths (connections, predictor).
        run(&up, conc, Duration::from_millis(300)).await;
        run(&via, conc, Duration::from_millis(300)).await;
        let mut rows = Vec::new();
        for (name, base) in [("direct", up.as_str()), ("gateway", via.as_str())] {
            let r = run(base, conc, Duration::from_secs(secs)).await;
            println!(
                "{:>4} {:>8} | {:>7.3}ms {:>7.3}ms | {:>7.3}ms {:>7.3}ms | {:>8.0}",
                conc,
                name,
                ms(r.ttft.value_at_quantile(0.5)),
                ms(r.ttft.value_at_quantile(0.99)),
                ms(r.e2e.value_at_quantile(0.5)),
                ms(r.e2e.value_at_quantile(0.99)),
                r.requests as f64 / r.elapsed.as_secs_f64()
            );
            rows.push(r);
        }
        let added =
            |q: f64| ms(rows[1].e2e.value_at_quantile(q)) - ms(rows[0].e2e.value_at_quantile(q));
        let added_ttft =
            |q: f64| ms(rows[1].ttft.value_at_quantile(q)) - ms(rows[0].ttft.value_at_quantile(q));
        println!(
            "{conc:>4}    added | ttft p50 {:+.3} ms, p99 {:+.3} ms | e2e p50 {:+.3} ms, p99 {:+.3} ms",
            added_ttft(0.5),
            added_ttft(0.99),
            added(0.5),
            added(0.99)
        );
    }
    if let Some(p) = config {
        let _ = std::fs::remove_file(p);
    }
}
