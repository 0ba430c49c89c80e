//! `--discovery kubernetes` against a fake Kubernetes API server on 127.0.0.1 (plain HTTP): it
//! serves `GET /api/v1/namespaces/NS/pods?labelSelector=…` lists and `watch=true` streams of
//! newline-delimited ADDED / MODIFIED / DELETED events with resourceVersions, replaying its
//! history from the requested version (so a re-watch after a dropped stream misses nothing).
//!
//! - in process: the watcher keeps the gateway's pod table equal to the ready pods as the fake
//!   server adds, readies, unreadies and deletes them, also across a dropped watch;
//! - the `kvgate serve` binary, pointed at the fake server by a kubeconfig (`KUBECONFIG`): a
//!   discovered mock pod serves a chat request; once the pod is deleted the gateway answers 503.
//! - failed lists (500) and a line that is not JSON in a watch stream are counted in
//!   `kvgate_discovery_errors_total` and the watcher recovers.
#![cfg(feature = "k8s")]

mod common;

use common::start_serve;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::response::Response;
use kvgate_gateway::discovery::KubernetesTarget;
use kvgate_gateway::discovery::kubernetes::{self, kube};
use kvgate_gateway::{Gateway, ServeArgs};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::broadcast;

const NAMESPACE: &str = "llm";
const SELECTOR: &str = "app=vllm";

/// One watch event line, a line that is not JSON, or the order to end every open watch stream.
#[derive(Clone)]
enum Feed {
    Event(u64, String),
    Garbage,
    DropWatches,
}

#[derive(Default)]
struct ApiState {
    resource_version: u64,
    pods: BTreeMap<String, Value>,
    history: Vec<(u64, String)>,
    /// Every request's (watch?, namespace, labelSelector).
    requests: Vec<(bool, String, String)>,
    /// The next this many list requests get a 500.
    failing_lists: usize,
}

/// The fake API server.
struct FakeApi {
    addr: SocketAddr,
    state: Arc<Mutex<ApiState>>,
    feed: broadcast::Sender<Feed>,
    _server: tokio::task::JoinHandle<()>,
}

#[derive(Clone)]
struct Ctx {
    state: Arc<Mutex<ApiState>>,
    feed: broadcast::Sender<Feed>,
}

/// A Pod object as the API server returns it.
fn pod_object(name: &str, ip: &str, ready: bool, rv: u64) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "uid": format!("uid-{name}"),
            "resourceVersion": rv.to_string(),
            "labels": {"app": "vllm"},
        },
        "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai"}]},
        "status": {
            "phase": "Running",
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
        },
    })
}

impl FakeApi {
    async fn start() -> FakeApi {
        let state = Arc::new(Mutex::new(ApiState::default()));
        let (feed, _) = broadcast::channel(1024);
        let ctx = Ctx {
            state: state.clone(),
            feed: feed.clone(),
        };
        let app = axum::Router::new()
            .route("/api/v1/namespaces/{ns}/pods", axum::routing::get(pods))
            .with_state(ctx);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeApi {
            addr,
            state,
            feed,
            _server: server,
        }
    }

    /// Creates or replaces a pod: ADDED or MODIFIED.
    fn put(&self, name: &str, ip: &str, ready: bool) {
        let mut st = self.state.lock().unwrap();
        st.resource_version += 1;
        let rv = st.resource_version;
        let obj = pod_object(name, ip, ready, rv);
        let kind = if st.pods.contains_key(name) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        st.pods.insert(name.to_string(), obj.clone());
        self.emit(&mut st, rv, kind, obj);
    }

    /// Deletes a pod: DELETED with its last state.
    fn delete(&self, name: &str) {
        let mut st = self.state.lock().unwrap();
        let Some(mut obj) = st.pods.remove(name) else {
            return;
        };
        st.resource_version += 1;
        let rv = st.resource_version;
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        self.emit(&mut st, rv, "DELETED", obj);
    }

    fn emit(&self, st: &mut ApiState, rv: u64, kind: &str, obj: Value) {
        let line = format!("{}\n", json!({"type": kind, "object": obj}));
        st.history.push((rv, line.clone()));
        let _ = self.feed.send(Feed::Event(rv, line));
    }

    /// The next `n` list requests fail with 500.
    fn fail_lists(&self, n: usize) {
        self.state.lock().unwrap().failing_lists = n;
    }

    /// Sends a line that is not a watch event to every open watch stream.
    fn send_garbage(&self) {
        let _ = self.feed.send(Feed::Garbage);
    }

    /// Ends every open watch stream (as an API server does at its timeout).
    fn drop_watches(&self) {
        let _ = self.feed.send(Feed::DropWatches);
    }

    fn watch_requests(&self) -> usize {
        self.state
            .lock()
            .unwrap()
            .requests
            .iter()
            .filter(|r| r.0)
            .count()
    }

    fn kubeconfig(&self, dir: &std::path::Path) -> std::path::PathBuf {
        let path = dir.join("kubeconfig.yaml");
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://{}\n\
             contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n    namespace: {NAMESPACE}\n\
             current-context: fake\nusers:\n- name: fake\n  user: {{}}\n",
            self.addr
        );
        std::fs::write(&path, text).unwrap();
        path
    }
}

/// `GET /api/v1/namespaces/{ns}/pods`: a PodList, or with `watch=true` a stream of events
/// after `resourceVersion`.
async fn pods(
    State(ctx): State<Ctx>,
    Path(ns): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let watch = q.get("watch").is_some_and(|w| w == "true" || w == "1");
    let selector = q.get("labelSelector").cloned().unwrap_or_default();
    let mut st = ctx.state.lock().unwrap();
    st.requests.push((watch, ns.clone(), selector.clone()));
    let matches = ns == NAMESPACE && selector == SELECTOR;
    if !watch && st.failing_lists > 0 {
        st.failing_lists -= 1;
        let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "message": "etcd is unhappy", "reason": "InternalError", "code": 500});
        return Response::builder()
            .status(500)
            .header("content-type", "application/json")
            .body(Body::from(status.to_string()))
            .unwrap();
    }
    if !watch {
        let items: Vec<Value> = if matches {
            st.pods.values().cloned().collect()
        } else {
            Vec::new()
        };
        let list = json!({
            "apiVersion": "v1",
            "kind": "PodList",
            "metadata": {"resourceVersion": st.resource_version.to_string()},
            "items": items,
        });
        return Response::builder()
            .header("content-type", "application/json")
            .body(Body::from(list.to_string()))
            .unwrap();
    }
    let from: u64 = q
        .get("resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    // Subscribe before reading the history, so no event falls between the two.
    let mut live = ctx.feed.subscribe();
    let backlog: Vec<(u64, String)> = if matches {
        st.history
            .iter()
            .filter(|(rv, _)| *rv > from)
            .cloned()
            .collect()
    } else {
        Vec::new()
    };
    drop(st);
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<String, std::io::Error>>(64);
    tokio::spawn(async move {
        let mut last = from;
        for (rv, line) in backlog {
            last = rv;
            if tx.send(Ok(line)).await.is_err() {
                return;
            }
        }
        loop {
            match live.recv().await {
                Ok(Feed::Event(rv, line)) if matches && rv > last => {
                    last = rv;
                    if tx.send(Ok(line)).await.is_err() {
                        return;
                    }
                }
                Ok(Feed::Event(..)) => {}
                Ok(Feed::Garbage) => {
                    if tx
                        .send(Ok("{not a watch event\n".to_string()))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
                Ok(Feed::DropWatches) | Err(_) => return,
            }
        }
    });
    Response::builder()
        .header("content-type", "application/json")
        .body(Body::from_stream(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        ))
        .unwrap()
}

async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn table(gw: &Gateway) -> Vec<String> {
    let mut urls: Vec<String> = gw
        .shared()
        .fleet
        .pods
        .all()
        .iter()
        .map(|p| p.url.clone())
        .collect();
    urls.sort();
    urls
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pod_table_follows_ready_pods_through_list_and_watch() {
    let api = FakeApi::start().await;
    api.put("vllm-a", "127.0.0.1", true);
    api.put("vllm-x", "127.0.0.9", false); // listed but not ready
    let gw = Gateway::start(ServeArgs {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        admin_listen: Some("127.0.0.1:0".parse().unwrap()),
        // A configured pod stays next to the discovered ones.
        pod: vec!["http://127.0.0.1:1".into()],
        scrape_interval_ms: Some(20),
        ..ServeArgs::default()
    })
    .await
    .unwrap();
    let url = format!("http://{}", api.addr).parse().unwrap();
    let client = kube::Client::try_from(kube::Config::new(url)).unwrap();
    let target = KubernetesTarget {
        selector: SELECTOR.into(),
        namespace: Some(NAMESPACE.into()),
        target_port: 8000,
    };
    let watcher = tokio::spawn(kubernetes::run(gw.shared().clone(), client, target));
    let p = |ip: &str| format!("http://{ip}:8000");
    let configured = "http://127.0.0.1:1".to_string();
    let with_configured = |mut v: Vec<String>| {
        v.push(configured.clone());
        v.sort();
        v
    };

    wait_until("the listed ready pod", || {
        table(&gw) == with_configured(vec![p("127.0.0.1")])
    })
    .await;
    api.put("vllm-b", "127.0.0.2", true);
    wait_until("ADDED ready pod", || {
        table(&gw) == with_configured(vec![p("127.0.0.1"), p("127.0.0.2")])
    })
    .await;
    api.put("vllm-x", "127.0.0.9", true);
    wait_until("MODIFIED to ready", || table(&gw).contains(&p("127.0.0.9"))).await;
    api.put("vllm-a", "127.0.0.1", false);
    wait_until("MODIFIED to not ready", || {
        table(&gw) == with_configured(vec![p("127.0.0.2"), p("127.0.0.9")])
    })
    .await;
    api.delete("vllm-b");
    wait_until("DELETED", || {
        table(&gw) == with_configured(vec![p("127.0.0.9")])
    })
    .await;

    // The API server ends the watch; the watcher watches again from its last version and
    // misses nothing emitted meanwhile.
    let watches = api.watch_requests();
    api.drop_watches();
    api.put("vllm-c", "127.0.0.3", true);
    wait_until("pod added across a dropped watch", || {
        table(&gw) == with_configured(vec![p("127.0.0.3"), p("127.0.0.9")])
    })
    .await;
    assert!(
        api.watch_requests() > watches,
        "the watcher did not re-watch"
    );

    // Every request asked for the namespace and the selector.
    let requests = api.state.lock().unwrap().requests.clone();
    assert!(requests.iter().any(|r| !r.0), "no list request");
    for (_, ns, selector) in &requests {
        assert_eq!((ns.as_str(), selector.as_str()), (NAMESPACE, SELECTOR));
    }
    let text = gw.shared().metrics_text().unwrap();
    assert!(text.contains("kvgate_discovered_pods 2\n"), "{text}");
    // Ids: configured 0, a 1, b 2, x 3; a and b left, so c took the smallest free id, a's.
    let id_of = |url: &str| gw.shared().fleet.pods.by_url(url).map(|p| p.id.0);
    assert_eq!(
        [
            id_of(&configured),
            id_of(&p("127.0.0.9")),
            id_of(&p("127.0.0.3"))
        ],
        [Some(0), Some(3), Some(1)]
    );
    watcher.abort();
}

fn discovery_errors(gw: &Gateway) -> f64 {
    gw.shared()
        .metrics_text()
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("kvgate_discovery_errors_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_lists_and_garbage_events_are_counted_and_the_watcher_recovers() {
    let api = FakeApi::start().await;
    api.put("vllm-a", "127.0.0.1", true);
    api.fail_lists(2);
    let gw = Gateway::start(ServeArgs {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        admin_listen: Some("127.0.0.1:0".parse().unwrap()),
        ..ServeArgs::default()
    })
    .await
    .unwrap();
    let url = format!("http://{}", api.addr).parse().unwrap();
    let client = kube::Client::try_from(kube::Config::new(url)).unwrap();
    let target = KubernetesTarget {
        selector: SELECTOR.into(),
        namespace: Some(NAMESPACE.into()),
        target_port: 8000,
    };
    let watcher = tokio::spawn(kubernetes::run(gw.shared().clone(), client, target));
    // Two 500s, then (after kube's backoff) the list succeeds.
    wait_until("the pod, after two failed lists", || {
        table(&gw) == ["http://127.0.0.1:8000"]
    })
    .await;
    assert_eq!(discovery_errors(&gw), 2.0);
    // A line that is not JSON in the watch stream: counted, then the watch resumes.
    wait_until("a watch open", || api.watch_requests() > 0).await;
    api.send_garbage();
    wait_until("garbage counted", || discovery_errors(&gw) >= 3.0).await;
    api.put("vllm-b", "127.0.0.2", true);
    wait_until("a pod added after the garbage", || {
        table(&gw) == ["http://127.0.0.1:8000", "http://127.0.0.2:8000"]
    })
    .await;
    watcher.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kvgate_serve_routes_to_discovered_pods_and_503_once_they_are_gone() {
    let config = kvgate_mock_pod::PodConfig {
        time_scale: 10.0,
        ..kvgate_mock_pod::PodConfig::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let pod_port = listener.local_addr().unwrap().port();
    let _pod = kvgate_mock_pod::spawn_pod(config.clone(), listener)
        .await
        .unwrap();
    let api = FakeApi::start().await;
    api.put("vllm-0", "127.0.0.1", true);
    let dir = std::env::temp_dir().join(format!("kvgate-k8s-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = api.kubeconfig(&dir);
    // No --namespace: the kubeconfig context's namespace is used.
    let target_port = pod_port.to_string();
    let serve = start_serve(
        &[
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--discovery",
            "kubernetes",
            "--selector",
            SELECTOR,
            "--target-port",
            &target_port,
            "--scrape-interval-ms",
            "20",
        ],
        |cmd| {
            cmd.env("KUBECONFIG", &kubeconfig).env("RUST_LOG", "warn");
        },
    );
    let (base, admin) = (serve.base.clone(), serve.admin.clone());
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let ready = |http: reqwest::Client, admin: String| async move {
        http.get(format!("{admin}/readyz"))
            .send()
            .await
            .map(|r| r.status().as_u16())
            .unwrap_or(0)
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while ready(http.clone(), admin.clone()).await != 200 {
        assert!(
            Instant::now() < deadline,
            "the discovered pod never became healthy"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let chat = json!({
        "model": config.model,
        "messages": [{"role": "user", "content": "Hello from Kubernetes"}],
        "max_tokens": 4,
    });
    let resp = http
        .post(format!("{base}/v1/chat/completions"))
        .json(&chat)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()
            .get("x-kvgate-pod")
            .and_then(|v| v.to_str().ok()),
        Some(format!("http://127.0.0.1:{pod_port}").as_str())
    );

    api.delete("vllm-0");
    let deadline = Instant::now() + Duration::from_secs(20);
    while ready(http.clone(), admin.clone()).await != 503 {
        assert!(
            Instant::now() < deadline,
            "the deleted pod is still routed to"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let resp = http
        .post(format!("{base}/v1/chat/completions"))
        .json(&chat)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 503);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn fake_api_pod_objects_decode_as_kubernetes_pods() {
    // The fake's objects are what the watcher decodes; keep them valid k8s-openapi Pods.
    let pod: k8s_openapi::api::core::v1::Pod =
        serde_json::from_value(pod_object("vllm-a", "10.0.0.1", true, 7)).unwrap();
    assert_eq!(
        kubernetes::pod_url(&pod, 8000).as_deref(),
        Some("http://10.0.0.1:8000")
    );
}
