//! Flow control through the HTTP proxy against a fake pod: the body the pod gets (vLLM's
//! `priority` written only with `forward_priority`), and the default (off) changing nothing.

mod common;

use common::{Behavior, FakePod};
use kvgate_gateway::Gateway;
use serde_json::json;

async fn one_pod(flow: Option<&str>) -> (FakePod, Gateway) {
    let pod = FakePod::start(Behavior::Normal {
        chunks: 2,
        delay_ms: 0,
    })
    .await;
    let mut args = common::args(&[&pod]);
    if let Some(flow) = flow {
        let dir = std::env::temp_dir().join(format!(
            "kvgate-flow-proxy-{}-{}",
            std::process::id(),
            flow.len()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("kvgate.toml");
        std::fs::write(&path, format!("[flow_control]\n{flow}\n")).unwrap();
        args.config = Some(path);
    }
    let gw = Gateway::start(args).await.unwrap();
    let url = pod.url.clone();
    common::eventually("pod healthy", || gw.pod_healthy(&url) == Some(true)).await;
    (pod, gw)
}

async fn send(gw: &Gateway, priority: &str, body: serde_json::Value) -> common::Timed {
    let mut req = common::post(gw, "/v1/chat/completions", &body.to_string());
    req.headers_mut()
        .insert("x-kvgate-priority", priority.parse().unwrap());
    common::send(&common::client(), req).await
}

fn chat() -> serde_json::Value {
    json!({"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_priority_reaches_vllm_negated_only_with_forward_priority() {
    let (pod, gw) = one_pod(Some("enabled = true\nforward_priority = true")).await;
    let r = send(&gw, "3", chat()).await;
    assert_eq!(r.status, 200);
    let body = pod.state.last_body.lock().unwrap().clone().unwrap();
    assert_eq!(body["priority"], -3);
    // The client's own field is left alone.
    let mut own = chat();
    own["priority"] = json!(7);
    assert_eq!(send(&gw, "3", own).await.status, 200);
    let body = pod.state.last_body.lock().unwrap().clone().unwrap();
    assert_eq!(body["priority"], 7);
    // A priority that is not an integer: 400 before any pod is touched.
    let before = pod.state.requests.load(std::sync::atomic::Ordering::SeqCst);
    let r = send(&gw, "urgent", chat()).await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["code"], "invalid_priority");
    assert_eq!(
        pod.state.requests.load(std::sync::atomic::Ordering::SeqCst),
        before
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flow_control_off_by_default_leaves_bodies_headers_and_decisions_as_they_were() {
    let (pod, gw) = one_pod(None).await;
    assert!(!gw.shared().config().flow.enabled);
    // The flow headers are not read at all: one that flow control would refuse passes.
    let r = send(&gw, "urgent", chat()).await;
    assert_eq!(r.status, 200);
    let body = pod.state.last_body.lock().unwrap().clone().unwrap();
    assert!(body.get("priority").is_none(), "{body}");
    let decisions = gw.shared().decisions.snapshot();
    assert!(decisions[0].flow.is_none());
    let json = serde_json::to_value(&decisions[0]).unwrap();
    assert!(json.get("flow").is_none());
}
