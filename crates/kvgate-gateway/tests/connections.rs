//! The traffic listener's connections, end to end (real sockets on 127.0.0.1): the header-read,
//! idle and client-write timeouts, the connection cap, and streams at the end of the shutdown
//! grace.

mod common;

use common::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn metric(gw: &kvgate_gateway::Gateway, series: &str) -> Option<f64> {
    let text = gw.shared().metrics_text().unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// Reads until the server closes the connection (EOF or reset); how long that took.
async fn closed_within(s: &mut TcpStream, limit: Duration) -> Duration {
    let t0 = Instant::now();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout(limit, s.read(&mut buf)).await {
            Err(_) => panic!("the connection was not closed within {limit:?}"),
            Ok(Ok(0)) | Ok(Err(_)) => return t0.elapsed(),
            Ok(Ok(_)) => {}
        }
    }
}

#[tokio::test]
async fn a_request_head_not_whole_within_the_header_read_timeout_closes_the_connection() {
    let pod = FakePod::start(Behavior::Normal {
        chunks: 1,
        delay_ms: 1,
    })
    .await;
    let mut a = args(&[&pod]);
    a.header_read_timeout_ms = Some(300);
    let gw = kvgate_gateway::Gateway::start(a).await.unwrap();
    // Half a head, then nothing (slowloris); and a connection that sends nothing at all.
    let mut half = TcpStream::connect(gw.traffic_addr).await.unwrap();
    half.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
        .await
        .unwrap();
    let mut silent = TcpStream::connect(gw.traffic_addr).await.unwrap();
    for s in [&mut half, &mut silent] {
        let took = closed_within(s, Duration::from_secs(3)).await;
        assert!(took < Duration::from_secs(2), "{took:?}");
    }
    assert_eq!(
        metric(
            &gw,
            "kvgate_connection_timeouts_total{kind=\"header_read\"}"
        ),
        Some(2.0)
    );
    eventually("both connections closed", || {
        metric(&gw, "kvgate_open_connections") == Some(0.0)
    })
    .await;
    assert_eq!(pod.requests(), 0);
}

fn models_request(
    gw: &kvgate_gateway::Gateway,
) -> http::Request<http_body_util::Empty<bytes::Bytes>> {
    http::Request::get(format!("http://{}/v1/models", gw.traffic_addr))
        .header("host", "x")
        .body(http_body_util::Empty::new())
        .unwrap()
}

#[tokio::test]
async fn an_idle_keep_alive_connection_outlives_the_header_read_timeout_and_closes_at_the_idle_timeout()
 {
    use http_body_util::BodyExt;
    let pod = FakePod::start(Behavior::Normal {
        chunks: 1,
        delay_ms: 1,
    })
    .await;
    let mut a = args(&[&pod]);
    a.header_read_timeout_ms = Some(200);
    a.idle_connection_timeout_ms = Some(1000);
    let gw = kvgate_gateway::Gateway::start(a).await.unwrap();
    let stream = TcpStream::connect(gw.traffic_addr).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    let closed = tokio::spawn(async move {
        let _ = conn.await;
        Instant::now()
    });
    let r = sender.send_request(models_request(&gw)).await.unwrap();
    assert_eq!(r.status(), http::StatusCode::OK);
    r.into_body().collect().await.unwrap();
    // Idle for twice the header-read timeout: the connection stays (hyper's own
    // header_read_timeout would have closed it here) and serves the next request.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let r = sender.send_request(models_request(&gw)).await.unwrap();
    assert_eq!(r.status(), http::StatusCode::OK);
    r.into_body().collect().await.unwrap();
    let idle_from = Instant::now();
    let closed_at = tokio::time::timeout(Duration::from_secs(4), closed)
        .await
        .expect("closed at the idle timeout")
        .unwrap();
    let idle = closed_at.duration_since(idle_from);
    assert!(
        idle >= Duration::from_millis(900) && idle < Duration::from_millis(2500),
        "{idle:?}"
    );
    assert_eq!(
        metric(&gw, "kvgate_connection_timeouts_total{kind=\"idle\"}"),
        Some(1.0)
    );
    assert_eq!(
        metric(
            &gw,
            "kvgate_connection_timeouts_total{kind=\"header_read\"}"
        ),
        None
    );
}

#[tokio::test]
async fn connections_beyond_max_connections_are_closed_at_accept_and_counted() {
    let pod = FakePod::start(Behavior::Normal {
        chunks: 1,
        delay_ms: 1,
    })
    .await;
    let mut a = args(&[&pod]);
    a.max_connections = Some(2);
    let gw = kvgate_gateway::Gateway::start(a).await.unwrap();
    let first = TcpStream::connect(gw.traffic_addr).await.unwrap();
    let _second = TcpStream::connect(gw.traffic_addr).await.unwrap();
    eventually("two connections open", || {
        metric(&gw, "kvgate_open_connections") == Some(2.0)
    })
    .await;
    let mut third = TcpStream::connect(gw.traffic_addr).await.unwrap();
    let took = closed_within(&mut third, Duration::from_secs(3)).await;
    assert!(took < Duration::from_secs(1), "closed at once: {took:?}");
    assert_eq!(metric(&gw, "kvgate_connections_refused_total"), Some(1.0));
    // A place comes back when a connection closes: the next client is served.
    drop(first);
    eventually("one connection open", || {
        metric(&gw, "kvgate_open_connections") == Some(1.0)
    })
    .await;
    let r = send(
        &client(),
        post(&gw, "/v1/chat/completions", &chat_body("a", false)),
    )
    .await;
    assert_eq!(r.status, http::StatusCode::OK);
    assert_eq!(metric(&gw, "kvgate_connections_refused_total"), Some(1.0));
}

/// A pod that streams 16 KiB SSE events as fast as it may, forever; counts its open streams.
struct FirehosePod {
    url: String,
    streams: Arc<AtomicI64>,
    _server: tokio::task::JoinHandle<()>,
}

struct StreamOpen(Arc<AtomicI64>);

impl Drop for StreamOpen {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl FirehosePod {
    async fn start() -> FirehosePod {
        let streams = Arc::new(AtomicI64::new(0));
        let counter = streams.clone();
        let app = axum::Router::new()
            .route(
                "/metrics",
                axum::routing::get(|| async {
                    "vllm:num_requests_running{model_name=\"m\"} 0\n\
                     vllm:num_requests_waiting{model_name=\"m\"} 0\n\
                     vllm:kv_cache_usage_perc{model_name=\"m\"} 0.1\n"
                }),
            )
            .route(
                "/v1/chat/completions",
                axum::routing::post(move || {
                    let counter = counter.clone();
                    async move {
                        counter.fetch_add(1, Ordering::SeqCst);
                        let open = StreamOpen(counter);
                        let event = bytes::Bytes::from(format!(
                            "data: {}\n\n",
                            serde_json::json!({"choices":[{"index":0,"delta":{"content":"x".repeat(16 << 10)}}]})
                        ));
                        let stream = futures_util::stream::unfold(open, move |open| {
                            let event = event.clone();
                            async move { Some((Ok::<_, std::io::Error>(event), open)) }
                        });
                        axum::response::Response::builder()
                            .header("content-type", "text/event-stream")
                            .body(axum::body::Body::from_stream(stream))
                            .unwrap()
                    }
                }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FirehosePod {
            url,
            streams,
            _server: server,
        }
    }
}

#[tokio::test]
async fn a_client_that_stops_reading_a_stream_is_cut_and_its_slot_and_in_flight_return_to_zero() {
    let pod = FirehosePod::start().await;
    let mut a = args(&[]);
    a.pod = vec![pod.url.clone()];
    a.client_write_timeout_ms = Some(300);
    // The request timeout (default 10 minutes) plays no part: the write stall ends it.
    let gw = kvgate_gateway::Gateway::start(a).await.unwrap();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut s = socket.connect(gw.traffic_addr).await.unwrap();
    let body = chat_body("a", true);
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let shared = gw.shared().clone();
    eventually("the stream holds a slot", || {
        shared.admission.slots.active() == 1
    })
    .await;
    // Never read: the gateway's writes stall, and 300 ms later the connection is closed.
    eventually("the slot is given back", || {
        shared.admission.slots.active() == 0
    })
    .await;
    assert_eq!(
        gw.in_flight(&pod.url),
        Some(kvgate_core::InFlight::default())
    );
    assert_eq!(
        metric(
            &gw,
            "kvgate_connection_timeouts_total{kind=\"client_write\"}"
        ),
        Some(1.0)
    );
    eventually("the upstream stream is cancelled", || {
        pod.streams.load(Ordering::SeqCst) == 0
    })
    .await;
    let m = shared.metrics_text().unwrap();
    assert!(m.contains("status=\"client_abort\"} 1"), "{m}");
    eventually("the connection is gone", || {
        metric(&gw, "kvgate_open_connections") == Some(0.0)
    })
    .await;
    drop(s);
}

#[tokio::test]
async fn streams_in_flight_when_the_shutdown_grace_ends_get_the_shutting_down_event_and_done() {
    // 100 chunks 50 ms apart: about 5 s of stream, still running when the 300 ms grace ends.
    let pod = FakePod::start(Behavior::Normal {
        chunks: 100,
        delay_ms: 50,
    })
    .await;
    let gw = gateway(&[&pod]).await;
    let shared = gw.shared().clone();
    let traffic = gw.traffic_addr;
    let stream = tokio::spawn({
        let req = post(&gw, "/v1/chat/completions", &chat_body("a", true));
        async move { send(&client(), req).await }
    });
    eventually("the stream is in flight", || {
        shared.admission.slots.active() == 1
    })
    .await;
    let t0 = Instant::now();
    gw.shutdown(Duration::from_millis(300)).await;
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_millis(1300),
        "{took:?}"
    );
    let r = tokio::time::timeout(Duration::from_secs(3), stream)
        .await
        .expect("the stream ended")
        .unwrap();
    assert_eq!(r.status, http::StatusCode::OK);
    let text = r.text();
    assert!(text.contains("tok1 "), "{text}");
    assert!(text.contains("\"code\":\"shutting_down\""), "{text}");
    assert!(text.contains("grace of 300 ms"), "{text}");
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    let m = shared.metrics_text().unwrap();
    assert!(m.contains("status=\"shutdown\"} 1"), "{m}");
    assert_eq!(shared.admission.slots.active(), 0);
    eventually("the upstream stream is cancelled", || {
        pod.state.active_streams.load(Ordering::SeqCst) == 0
    })
    .await;
    assert!(TcpStream::connect(traffic).await.is_err());
}
