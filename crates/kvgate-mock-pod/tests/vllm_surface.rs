//! What a router sees of vLLM 0.32 that the mock pod mirrors (reference/real-vllm.md): request
//! ids from `x-request-id`, `/kv_event_sources`, the scale-out render endpoints, `--block-size`
//! and cancellation when the client goes away.

mod common;

use std::time::{Duration, Instant};

use common::{MODEL, client, pod, token_prompt};
use kvgate_mock_pod::PodConfig;
use serde_json::{Value, json};

async fn metrics_text(url: &str) -> String {
    client()
        .get(format!("{url}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// The value of the sample whose line starts with `prefix` (name and labels).
fn sample(text: &str, prefix: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no sample {prefix} in\n{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x_request_id_becomes_the_completion_id_with_vllms_prefixes() {
    let pod = pod(PodConfig::default()).await;
    let c = client();
    let r: Value = c
        .post(format!("{}/v1/completions", pod.url()))
        .header("x-request-id", "abc-123")
        .json(&json!({"model": MODEL, "prompt": "hi", "max_tokens": 2}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["id"], "cmpl-abc-123");
    let body = c
        .post(format!("{}/v1/chat/completions", pod.url()))
        .header("x-request-id", "r7")
        .json(
            &json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                      "max_tokens": 2, "stream": true}),
        )
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let chunks = common::parse_sse(&body);
    assert_eq!(chunks.len(), 3, "role chunk and two tokens");
    assert!(chunks.iter().all(|c| c["id"] == "chatcmpl-r7"));
    // Without the header: the pod's own counter.
    let r: Value = c
        .post(format!("{}/v1/completions", pod.url()))
        .json(&json!({"model": MODEL, "prompt": "hi", "max_tokens": 1}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["id"], "cmpl-0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_event_sources_lists_the_bound_endpoints_for_rank_0() {
    let pod = pod(PodConfig {
        kv_events: Some("tcp://127.0.0.1:0".into()),
        kv_events_replay: Some("tcp://127.0.0.1:0".into()),
        ..PodConfig::default()
    })
    .await;
    let v: Value = client()
        .get(format!("{}/kv_event_sources", pod.url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let rank0 = &v["0"];
    assert_eq!(rank0["enable_kv_cache_events"], true);
    assert_eq!(rank0["publisher"], "zmq");
    assert_eq!(rank0["endpoint"], pod.kv_events_endpoint.clone().unwrap());
    assert_eq!(
        rank0["replay_endpoint"],
        pod.kv_events_replay_endpoint.clone().unwrap()
    );
    assert_eq!(rank0["buffer_steps"], 10_000);
    assert_eq!(rank0["topic"], "");
    assert_eq!(v.as_object().unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn render_endpoints_are_403_without_scale_out_and_tokenize_with_it() {
    let off = pod(PodConfig::default()).await;
    let c = client();
    for path in ["/v1/completions/render", "/v1/chat/completions/render"] {
        let r = c
            .post(format!("{}{path}", off.url()))
            .json(&json!({"model": MODEL, "prompt": "hi"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 403);
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["type"], "PermissionDeniedError");
        assert_eq!(
            v["error"]["message"],
            kvgate_mock_pod::api::SCALE_OUT_DISABLED
        );
    }

    let on = pod(PodConfig {
        enable_scale_out: true,
        ..PodConfig::default()
    })
    .await;
    let tokens_of = |body: Value| {
        let c = c.clone();
        let url = on.url();
        async move {
            let v: Value = c
                .post(format!("{url}/tokenize"))
                .json(&body)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            v["tokens"].clone()
        }
    };
    let v: Value = c
        .post(format!("{}/v1/completions/render", on.url()))
        .header("x-request-id", "q")
        .json(
            &json!({"model": MODEL, "prompt": ["Hello world", "Goodbye"], "max_tokens": 3,
                      "cache_salt": "s"}),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let items = v.as_array().expect("an array, one object per prompt");
    assert_eq!(items.len(), 2);
    assert_eq!(items[0]["request_id"], "cmpl-q-0");
    assert_eq!(items[1]["request_id"], "cmpl-q-1");
    assert_eq!(
        items[0]["token_ids"],
        tokens_of(json!({"prompt": "Hello world"})).await
    );
    assert_eq!(
        items[1]["token_ids"],
        tokens_of(json!({"prompt": "Goodbye"})).await
    );
    assert_eq!(items[0]["sampling_params"]["max_tokens"], 3);
    assert_eq!(items[0]["output_mode"], "tokens");
    assert_eq!(items[0]["cache_salt"], "s");
    assert_eq!(items[0]["priority"], 0);

    let messages = json!([{"role": "user", "content": "hi there"}]);
    let v: Value = c
        .post(format!("{}/v1/chat/completions/render", on.url()))
        .header("x-request-id", "c")
        .json(&json!({"model": MODEL, "messages": messages}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["request_id"], "chatcmpl-c");
    assert_eq!(
        v["token_ids"],
        tokens_of(json!({"messages": messages})).await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn block_size_128_counts_prefix_hits_in_whole_blocks_and_reports_the_size() {
    let pod = pod(PodConfig {
        block_size_tokens: 128,
        ..PodConfig::default()
    })
    .await;
    let c = client();
    // 981 tokens = 7 full blocks + 85: the same prompt three times hits 0, 896, 1792 in total,
    // as observed on vLLM 0.32 CPU.
    let body = json!({"model": MODEL, "prompt": token_prompt(4, 981), "max_tokens": 2});
    let mut hits = Vec::new();
    for _ in 0..3 {
        let r: Value = c
            .post(format!("{}/v1/completions", pod.url()))
            .json(&body)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(r["usage"]["prompt_tokens"], 981);
        let text = metrics_text(&pod.url()).await;
        hits.push(sample(&text, "vllm:prefix_cache_hits_total{"));
    }
    assert_eq!(hits, vec![0.0, 896.0, 1792.0]);
    let text = metrics_text(&pod.url()).await;
    let info = text
        .lines()
        .find(|l| l.starts_with("vllm:cache_config_info{"))
        .unwrap();
    assert!(info.contains("block_size=\"128\""), "{info}");
    // The default profile's KV capacity in tokens, in 128-token blocks.
    let blocks = kvgate_sim::profiles::Profile::default_profile().kv_blocks / 8;
    assert!(
        info.contains(&format!("num_gpu_blocks=\"{blocks}\"")),
        "{info}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_mid_stream_aborts_its_request() {
    let pod = pod(PodConfig::default()).await;
    let url = pod.url();
    // 4000 tokens at the default profile's pace take seconds; the client leaves after one.
    let mut resp = client()
        .post(format!("{url}/v1/completions"))
        .json(
            &json!({"model": MODEL, "prompt": token_prompt(9, 300), "max_tokens": 4000,
                      "stream": true}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp.chunk().await.unwrap().expect("a first chunk");
    let text = metrics_text(&url).await;
    assert_eq!(sample(&text, "vllm:num_requests_running{"), 1.0);
    assert!(sample(&text, "vllm:kv_cache_usage_perc{") > 0.0);
    drop(resp);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let text = metrics_text(&url).await;
        if sample(&text, "vllm:num_requests_running{") == 0.0 {
            assert_eq!(sample(&text, "vllm:kv_cache_usage_perc{"), 0.0);
            assert!(text.contains("finished_reason=\"length\"} 0\n"), "{text}");
            // As vLLM 0.32: a client's disconnect is no "abort" there.
            assert!(text.contains("finished_reason=\"abort\"} 0\n"), "{text}");
            assert_eq!(
                sample(&text, "kvgate_mock_pod_aborted_requests_total{"),
                1.0
            );
            assert!(sample(&text, "vllm:generation_tokens_total{") < 4000.0);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the request still runs 5 s after its client left"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
