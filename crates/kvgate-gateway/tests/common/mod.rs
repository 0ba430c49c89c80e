//! Test helpers: an in-process fake vLLM pod (streams SSE with delays, can fail, die mid-stream
//! or be killed) and a small HTTP client that records when each frame arrived.
#![allow(dead_code)]

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use kvgate_gateway::{Gateway, ServeArgs};
use serde_json::{Value, json};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tower::ServiceExt;

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Behavior {
    /// Role chunk, `chunks` content chunks `delay_ms` apart, finish, usage if asked, [DONE].
    Normal { chunks: usize, delay_ms: u64 },
    /// 500 with an error body.
    Fail500,
    /// 400 with vLLM's error body ([`REJECT_400_BODY`]) and a header of its own.
    Reject400,
    /// Sends `chunks` content chunks, then breaks the connection.
    DieAfter { chunks: usize, delay_ms: u64 },
    /// Never answers (accepts the request, sends no status line).
    Hang,
    /// Sends `chunks` content chunks, then stalls with the connection open.
    HangAfter { chunks: usize, delay_ms: u64 },
    /// 500 with an error body after `delay_ms`.
    Fail500After { delay_ms: u64 },
    /// A stream queued behind others: headers (and a chat's role chunk) at once, the first
    /// token after `wait_ms`, then `chunks` content chunks 1 ms apart.
    Queued { wait_ms: u64, chunks: usize },
    /// A stream the engine preempted after its first token: the first content chunk at once,
    /// the second after `wait_ms`, then the rest of `chunks` 1 ms apart.
    Preempted { wait_ms: u64, chunks: usize },
}

/// The body of [`Behavior::Reject400`], as vLLM words a request it refuses.
pub const REJECT_400_BODY: &str = r#"{"object":"error","message":"This model's maximum context length is 8 tokens.","type":"BadRequestError","param":null,"code":400}"#;

pub struct FakeState {
    pub behavior: Mutex<Behavior>,
    pub model: String,
    /// Completion requests received.
    pub requests: AtomicU32,
    /// Streams currently being sent.
    pub active_streams: AtomicI64,
    /// Streams dropped before their end (the client or gateway went away).
    pub cancelled: AtomicU32,
    pub last_body: Mutex<Option<Value>>,
    pub metrics_ok: AtomicBool,
    /// Delay before `/metrics` answers, ms.
    pub metrics_delay_ms: std::sync::atomic::AtomicU64,
    /// `/metrics` requests received.
    pub metrics_requests: AtomicU32,
    /// When set, the `/v1/models` body (else one model, `model`).
    pub models_body: Mutex<Option<String>>,
    /// The engine's `vllm:generation_tokens_total`: stands still unless a test steps it
    /// ([`FakePod::keep_stepping`]), as a hung engine's would.
    pub engine_tokens: AtomicU64,
    /// `block_size` and `num_gpu_blocks` of the pod's `vllm:cache_config_info` (16, 5,000).
    pub cache_config: Mutex<(u32, u32)>,
}

pub struct FakePod {
    pub url: String,
    pub state: Arc<FakeState>,
    server: tokio::task::JoinHandle<()>,
}

impl FakePod {
    pub async fn start(behavior: Behavior) -> FakePod {
        FakePod::start_with_model(behavior, "fake-model").await
    }

    pub async fn start_with_model(behavior: Behavior, model: &str) -> FakePod {
        let state = Arc::new(FakeState {
            behavior: Mutex::new(behavior),
            model: model.to_string(),
            requests: AtomicU32::new(0),
            active_streams: AtomicI64::new(0),
            cancelled: AtomicU32::new(0),
            last_body: Mutex::new(None),
            metrics_ok: AtomicBool::new(true),
            metrics_delay_ms: std::sync::atomic::AtomicU64::new(0),
            metrics_requests: AtomicU32::new(0),
            models_body: Mutex::new(None),
            engine_tokens: AtomicU64::new(0),
            cache_config: Mutex::new((16, 5_000)),
        });
        let app = axum::Router::new()
            .route("/metrics", axum::routing::get(metrics))
            .route("/v1/models", axum::routing::get(models))
            .route("/v1/chat/completions", axum::routing::post(completions))
            .route("/v1/completions", axum::routing::post(completions))
            .fallback(echo_path)
            .with_state(state.clone());
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        // Own accept loop so that kill() also closes open keep-alive connections.
        let server = tokio::spawn(async move {
            let mut conns = JoinSet::new();
            loop {
                let Ok((sock, _)) = listener.accept().await else {
                    break;
                };
                let _ = sock.set_nodelay(true);
                let app = app.clone();
                conns.spawn(async move {
                    let svc = hyper::service::service_fn(
                        move |req: http::Request<hyper::body::Incoming>| {
                            app.clone().oneshot(req.map(Body::new))
                        },
                    );
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(sock), svc)
                        .await;
                });
            }
        });
        FakePod { url, state, server }
    }

    pub fn set(&self, b: Behavior) {
        *self.state.behavior.lock().unwrap() = b;
    }

    pub fn requests(&self) -> u32 {
        self.state.requests.load(Ordering::SeqCst)
    }

    /// Steps the engine's counter every 20 ms until the handle is aborted or dropped: a busy
    /// engine working through the requests ahead of the test's.
    pub fn keep_stepping(&self) -> Stepping {
        let state = self.state.clone();
        Stepping(tokio::spawn(async move {
            loop {
                state.engine_tokens.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }))
    }

    /// Stops the server and every open connection (the pod process died).
    pub fn kill(&self) {
        self.server.abort();
    }
}

/// [`FakePod::keep_stepping`]'s task, stopped when dropped.
pub struct Stepping(tokio::task::JoinHandle<()>);

impl Drop for Stepping {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Drop for FakePod {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn metrics(State(s): State<Arc<FakeState>>) -> Response {
    s.metrics_requests.fetch_add(1, Ordering::SeqCst);
    let delay = s.metrics_delay_ms.load(Ordering::SeqCst);
    if delay > 0 {
        tokio::time::sleep(std::time::Duration::from_millis(delay)).await;
    }
    if !s.metrics_ok.load(Ordering::SeqCst) {
        let mut r = Response::new(Body::from("down"));
        *r.status_mut() = http::StatusCode::INTERNAL_SERVER_ERROR;
        return r;
    }
    let running = s.active_streams.load(Ordering::SeqCst).max(0);
    let tokens = s.engine_tokens.load(Ordering::SeqCst);
    let (block_size, blocks) = *s.cache_config.lock().unwrap();
    Response::new(Body::from(format!(
        "# HELP vllm:num_requests_running x\nvllm:num_requests_running{{model_name=\"m\"}} {running}\nvllm:generation_tokens_total{{model_name=\"m\"}} {tokens}\nvllm:num_requests_waiting{{model_name=\"m\"}} 0\nvllm:kv_cache_usage_perc{{model_name=\"m\"}} 0.1\nvllm:cache_config_info{{block_size=\"{block_size}\",num_gpu_blocks=\"{blocks}\"}} 1\nthis line is garbage\n"
    )))
}

async fn models(State(s): State<Arc<FakeState>>) -> Response {
    if let Some(body) = s.models_body.lock().unwrap().clone() {
        return Response::new(Body::from(body));
    }
    Response::new(Body::from(
        json!({"object":"list","data":[{"id": s.model, "object":"model"}]}).to_string(),
    ))
}

async fn echo_path(req: Request) -> Response {
    Response::new(Body::from(
        json!({
            "path": req.uri().path(),
            "authorization": req.headers().contains_key("authorization"),
        })
        .to_string(),
    ))
}

/// Counts a stream as active until dropped; a drop before `finished` is a cancellation.
struct StreamGuard {
    state: Arc<FakeState>,
    finished: bool,
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.state.active_streams.fetch_sub(1, Ordering::SeqCst);
        if !self.finished {
            self.state.cancelled.fetch_add(1, Ordering::SeqCst);
        }
    }
}

fn chunk(obj: Value) -> Bytes {
    Bytes::from(format!("data: {obj}\n\n"))
}

async fn completions(State(s): State<Arc<FakeState>>, req: Request) -> Response {
    s.requests.fetch_add(1, Ordering::SeqCst);
    let chat = req.uri().path() == "/v1/chat/completions";
    let body = req.into_body().collect().await.unwrap().to_bytes();
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    *s.last_body.lock().unwrap() = Some(v.clone());
    let behavior = *s.behavior.lock().unwrap();
    let stream = v["stream"].as_bool().unwrap_or(false);
    let usage_wanted = v["stream_options"]["include_usage"]
        .as_bool()
        .unwrap_or(false);
    let (chunks, delay_ms, die) = match behavior {
        Behavior::Fail500 => {
            let mut r = Response::new(Body::from(r#"{"error":{"message":"boom"}}"#));
            *r.status_mut() = http::StatusCode::INTERNAL_SERVER_ERROR;
            return r;
        }
        Behavior::Reject400 => {
            let mut r = Response::new(Body::from(REJECT_400_BODY));
            *r.status_mut() = http::StatusCode::BAD_REQUEST;
            let h = r.headers_mut();
            h.insert("content-type", "application/json".parse().unwrap());
            h.insert("x-pod-said", "no".parse().unwrap());
            return r;
        }
        Behavior::Fail500After { delay_ms } => {
            tokio::time::sleep(Duration::from_millis(delay_ms)).await;
            let mut r = Response::new(Body::from(r#"{"error":{"message":"boom"}}"#));
            *r.status_mut() = http::StatusCode::INTERNAL_SERVER_ERROR;
            return r;
        }
        Behavior::Normal { chunks, delay_ms } => (chunks, delay_ms, false),
        Behavior::Queued { chunks, .. } | Behavior::Preempted { chunks, .. } => (chunks, 1, false),
        Behavior::DieAfter { chunks, delay_ms } | Behavior::HangAfter { chunks, delay_ms } => {
            (chunks, delay_ms, true)
        }
        Behavior::Hang => return std::future::pending::<Response>().await,
    };
    let hang = matches!(behavior, Behavior::HangAfter { .. });
    let queued_ms = match behavior {
        Behavior::Queued { wait_ms, .. } => wait_ms,
        _ => 0,
    };
    let preempted_ms = match behavior {
        Behavior::Preempted { wait_ms, .. } => wait_ms,
        _ => 0,
    };
    let usage =
        json!({"prompt_tokens": 10, "completion_tokens": chunks, "total_tokens": 10 + chunks});
    if !stream {
        tokio::time::sleep(Duration::from_millis(delay_ms * chunks as u64)).await;
        let text: String = (0..chunks).map(|i| format!("tok{i} ")).collect();
        let choice = if chat {
            json!({"index":0,"message":{"role":"assistant","content":text},"finish_reason":"stop"})
        } else {
            json!({"index":0,"text":text,"finish_reason":"stop"})
        };
        let body = json!({"id":"x","object":"chat.completion","choices":[choice],"usage":usage});
        let mut r = Response::new(Body::from(body.to_string()));
        r.headers_mut().insert(
            "content-type",
            http::HeaderValue::from_static("application/json"),
        );
        return r;
    }
    s.active_streams.fetch_add(1, Ordering::SeqCst);
    let guard = StreamGuard {
        state: s.clone(),
        finished: false,
    };
    let mut events: Vec<Bytes> = Vec::new();
    let content = |i: usize| {
        if chat {
            json!({"choices":[{"index":0,"delta":{"content":format!("tok{i} ")},"finish_reason":null}]})
        } else {
            json!({"choices":[{"index":0,"text":format!("tok{i} "),"finish_reason":null}]})
        }
    };
    if chat {
        events.push(chunk(
            json!({"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}),
        ));
    }
    for i in 0..chunks {
        events.push(chunk(content(i)));
    }
    if !die {
        events.push(chunk(
            json!({"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}),
        ));
        if usage_wanted {
            events.push(chunk(json!({"choices":[],"usage":usage})));
        }
        events.push(Bytes::from_static(b"data: [DONE]\n\n"));
    }
    let n = events.len();
    // The first content event: after the role chunk of a chat stream.
    let first_content = usize::from(chat);
    let stream = futures_util::stream::unfold(
        (events.into_iter().enumerate(), guard),
        move |(mut it, mut guard)| async move {
            match it.next() {
                Some((i, ev)) => {
                    if i == first_content && queued_ms > 0 {
                        tokio::time::sleep(Duration::from_millis(queued_ms)).await;
                    } else if i == first_content + 1 && preempted_ms > 0 {
                        tokio::time::sleep(Duration::from_millis(preempted_ms)).await;
                    } else if i > 0 {
                        tokio::time::sleep(Duration::from_millis(delay_ms)).await;
                    }
                    if i + 1 == n && !die {
                        guard.finished = true;
                    }
                    Some((Ok::<Bytes, std::io::Error>(ev), (it, guard)))
                }
                None if die => {
                    if hang {
                        std::future::pending::<()>().await;
                    }
                    tokio::time::sleep(Duration::from_millis(delay_ms)).await;
                    guard.finished = true;
                    Some((Err(std::io::Error::other("pod died")), (it, guard)))
                }
                None => None,
            }
        },
    );
    let mut r = Response::new(Body::from_stream(stream));
    r.headers_mut().insert(
        "content-type",
        http::HeaderValue::from_static("text/event-stream"),
    );
    r
}

pub type TestClient = Client<HttpConnector, Full<Bytes>>;

pub fn client() -> TestClient {
    let mut c = HttpConnector::new();
    c.set_nodelay(true);
    Client::builder(TokioExecutor::new()).build(c)
}

pub fn args(pods: &[&FakePod]) -> ServeArgs {
    ServeArgs {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        admin_listen: Some("127.0.0.1:0".parse().unwrap()),
        pod: pods.iter().map(|p| p.url.clone()).collect(),
        scrape_interval_ms: Some(20),
        ..ServeArgs::default()
    }
}

pub async fn gateway(pods: &[&FakePod]) -> Gateway {
    Gateway::start(args(pods)).await.unwrap()
}

/// A pod that never answers and a healthy one (3 chunks, 1 ms apart) behind a round-robin
/// gateway with the given first-byte timeout: a request tried on the hung pod is retried on the
/// healthy one.
pub async fn hung_and_ok(first_byte_timeout_ms: u64) -> (FakePod, FakePod, Gateway) {
    let hung = FakePod::start(Behavior::Hang).await;
    let ok = FakePod::start(Behavior::Normal {
        chunks: 3,
        delay_ms: 1,
    })
    .await;
    let mut a = args(&[&hung, &ok]);
    a.first_byte_timeout_ms = Some(first_byte_timeout_ms);
    a.policy = Some("round-robin".into());
    let gw = Gateway::start(a).await.unwrap();
    (hung, ok, gw)
}

pub fn post(gw: &Gateway, path: &str, body: &str) -> http::Request<Full<Bytes>> {
    http::Request::post(format!("http://{}{path}", gw.traffic_addr))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::copy_from_slice(body.as_bytes())))
        .unwrap()
}

pub fn chat_body(text: &str, stream: bool) -> String {
    json!({"model":"fake-model","messages":[{"role":"user","content":text}],"stream":stream})
        .to_string()
}

/// A response read frame by frame: (time since request, bytes).
pub struct Timed {
    pub status: http::StatusCode,
    pub headers: http::HeaderMap,
    pub frames: Vec<(Duration, Bytes)>,
}

impl Timed {
    pub fn text(&self) -> String {
        self.frames
            .iter()
            .map(|(_, b)| String::from_utf8_lossy(b).into_owned())
            .collect()
    }
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.text()).unwrap()
    }
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    }
}

pub async fn send(c: &TestClient, req: http::Request<Full<Bytes>>) -> Timed {
    let t0 = Instant::now();
    let resp = c.request(req).await.unwrap();
    let (parts, mut body) = resp.into_parts();
    let mut frames = Vec::new();
    while let Some(f) = body.frame().await {
        let Ok(f) = f else { break };
        if let Ok(d) = f.into_data() {
            frames.push((t0.elapsed(), d));
        }
    }
    Timed {
        status: parts.status,
        headers: parts.headers,
        frames,
    }
}

/// Waits up to 5 s for `cond`.
pub async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub async fn assert_idle(gw: &Gateway, pods: &[&FakePod]) {
    for p in pods {
        eventually(&format!("in-flight of {} back to zero", p.url), || {
            gw.in_flight(&p.url) == Some(kvgate_core::InFlight::default())
        })
        .await;
    }
}

/// A word-level `tokenizer.json` (`w0`…`w63` are ids 0…63, whitespace splits words) written into
/// `dir` (created): a stand-in for a model's tokenizer that cl100k does not match. Its own
/// folder, so no other file next to it (a chat template) is picked up by accident.
pub fn word_level_tokenizer_json(dir: &std::path::Path) -> std::path::PathBuf {
    let mut vocab: serde_json::Map<String, Value> =
        (0..64u32).map(|i| (format!("w{i}"), i.into())).collect();
    vocab.insert("[UNK]".into(), 64.into());
    let json = json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
        "decoder": null, "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}
    });
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join("tokenizer.json");
    std::fs::write(&path, json.to_string()).unwrap();
    path
}
