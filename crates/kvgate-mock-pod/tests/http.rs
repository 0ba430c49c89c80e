//! End-to-end HTTP behaviour of one mock pod on 127.0.0.1: OpenAI shapes, errors, metrics and
//! the latency shape the engine model predicts.

mod common;

use std::time::Duration;

use common::{MODEL, client, long_prompt, parse_sse, pod, stream_completion, token_prompt};
use kvgate_mock_pod::PodConfig;
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_stream_completion_generates_max_tokens_of_deterministic_text_with_usage() {
    let pod = pod(PodConfig::default()).await;
    let body = json!({"model": MODEL, "prompt": "Hello, world", "max_tokens": 5});
    let c = client();
    let mut texts = Vec::new();
    for _ in 0..2 {
        let r: Value = c
            .post(format!("{}/v1/completions", pod.url()))
            .json(&body)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(r["object"], "text_completion");
        assert_eq!(r["choices"][0]["finish_reason"], "length");
        let usage = &r["usage"];
        assert_eq!(usage["prompt_tokens"], 3); // cl100k: "Hello", ",", " world"
        assert_eq!(usage["completion_tokens"], 5);
        assert_eq!(usage["total_tokens"], 8);
        texts.push(r["choices"][0]["text"].as_str().unwrap().to_owned());
    }
    assert_eq!(texts[0], " the quick brown fox jumps");
    assert_eq!(texts[0], texts[1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_stream_sends_role_then_one_chunk_per_token_then_usage_then_done() {
    let pod = pod(PodConfig::default()).await;
    let body = json!({"model": MODEL, "messages": [{"role": "user", "content": "hi there"}],
        "max_tokens": 4, "stream": true, "stream_options": {"include_usage": true}});
    let text = client()
        .post(format!("{}/v1/chat/completions", pod.url()))
        .json(&body)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let events = parse_sse(&text);
    assert_eq!(events.len(), 1 + 4 + 1);
    assert_eq!(events[0]["choices"][0]["delta"]["role"], "assistant");
    let content: String = events[1..5]
        .iter()
        .map(|e| e["choices"][0]["delta"]["content"].as_str().unwrap())
        .collect();
    assert_eq!(content, " the quick brown fox");
    assert_eq!(events[4]["choices"][0]["finish_reason"], "length");
    assert_eq!(events[3]["choices"][0]["finish_reason"], Value::Null);
    let last = &events[5];
    assert_eq!(last["choices"], json!([]));
    let usage = &last["usage"];
    assert_eq!(usage["completion_tokens"], 4);
    assert_eq!(
        usage["total_tokens"].as_u64().unwrap(),
        usage["prompt_tokens"].as_u64().unwrap() + 4
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_without_stream_options_has_no_usage_chunk() {
    let pod = pod(PodConfig::default()).await;
    let (_, events) = stream_completion(
        &client(),
        &pod.url(),
        json!({"model": MODEL, "prompt": "x", "max_tokens": 3, "stream": true}),
    )
    .await;
    assert_eq!(events.len(), 3);
    assert!(events.iter().all(|e| e.get("usage").is_none()));
}

async fn error_of(url: &str, path: &str, body: &str) -> (u16, Value) {
    let r = client()
        .post(format!("{url}{path}"))
        .header("content-type", "application/json")
        .body(body.to_owned())
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_openai_error_bodies_and_are_counted() {
    let mut config = PodConfig::default();
    config.profile.max_model_len = 64;
    let pod = pod(config).await;
    let url = pod.url();

    let (status, body) = error_of(&url, "/v1/completions", "{not json").await;
    assert_eq!(status, 400);
    // vLLM 0.32's type for a body that fails its schema.
    assert_eq!(body["error"]["type"], "Bad Request");
    assert_eq!(body["error"]["code"], 400);
    assert!(body["error"]["message"].as_str().unwrap().contains("JSON"));
    assert!(body["error"].get("param").is_some());

    let (status, body) = error_of(
        &url,
        "/v1/chat/completions",
        r#"{"model":"other","messages":[]}"#,
    )
    .await;
    assert_eq!(status, 404);
    assert_eq!(body["error"]["type"], "NotFoundError");
    assert_eq!(
        body["error"]["message"],
        format!("The model `other` does not exist. Valid aliases: {MODEL}.")
    );
    assert_eq!(body["error"]["param"], "model");

    let long = json!({"model": MODEL, "prompt": long_prompt(1, 40), "max_tokens": 10}).to_string();
    let (status, body) = error_of(&url, "/v1/completions", &long).await;
    assert_eq!(status, 400);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("This model's maximum context length is 64 tokens.")
    );

    let (status, _) = error_of(&url, "/v1/completions", r#"{"model":5}"#).await;
    assert_eq!(status, 400);
    let (status, _) = error_of(
        &url,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": ""}).to_string(),
    )
    .await;
    assert_eq!(status, 400);

    let metrics = client()
        .get(format!("{url}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let value = |reason: &str| {
        metrics
            .lines()
            .find(|l| {
                l.starts_with("kvgate_mock_pod_rejected_requests_total")
                    && l.contains(&format!("reason=\"{reason}\""))
            })
            .and_then(|l| l.rsplit(' ').next())
            .unwrap()
            .to_owned()
    };
    assert_eq!(value("invalid_json"), "1");
    assert_eq!(value("unknown_model"), "1");
    assert_eq!(value("too_long"), "1");
    assert_eq!(value("invalid_request"), "2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arbitrary_bodies_never_break_the_server() {
    let pod = pod(PodConfig::default()).await;
    let url = pod.url();
    let bodies = [
        "",
        "null",
        "[]",
        "{}",
        "\"x\"",
        "{\"model\":null}",
        "{\"model\":\"m\",\"prompt\":[[]]}",
        "{\"model\":\"meta-llama/Llama-3.1-8B-Instruct\",\"prompt\":[4294967295]}",
        "{\"model\":\"meta-llama/Llama-3.1-8B-Instruct\",\"prompt\":\"a\",\"max_tokens\":-1}",
        "{\"model\":\"meta-llama/Llama-3.1-8B-Instruct\",\"prompt\":\"a\",\"max_tokens\":4294967295}",
        "{\"model\":\"meta-llama/Llama-3.1-8B-Instruct\",\"messages\":[{\"role\":1}]}",
        "{\"model\":\"meta-llama/Llama-3.1-8B-Instruct\",\"prompt\":\"a\",\"stream_options\":5,\"ignore_eos\":\"x\"}",
    ];
    let mut deep = "[".repeat(10_000);
    deep.push_str(&"]".repeat(10_000));
    for body in bodies.iter().copied().chain([deep.as_str()]) {
        for path in ["/v1/completions", "/v1/chat/completions", "/tokenize"] {
            let r = client()
                .post(format!("{url}{path}"))
                .body(body.to_owned())
                .send()
                .await
                .unwrap();
            // /tokenize ignores generation fields, so some of these are fine there.
            let ok = if path == "/tokenize" {
                !r.status().is_server_error()
            } else {
                r.status().is_client_error()
            };
            assert!(ok, "{path} {body:.60} -> {}", r.status());
        }
    }
    let health = client().get(format!("{url}/health")).send().await.unwrap();
    assert_eq!(health.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_tokenize_and_health_answer_like_vllm() {
    let pod = pod(PodConfig::default()).await;
    let url = pod.url();
    let models: Value = client()
        .get(format!("{url}/v1/models"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"][0]["id"], MODEL);
    let t: Value = client()
        .post(format!("{url}/tokenize"))
        .json(&json!({"prompt": "Hello, world"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(t["count"], 3);
    assert_eq!(t["tokens"], json!([9906, 11, 1917]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_metadata_endpoints_name_the_served_model() {
    let pod = pod(PodConfig::default()).await;
    let url = pod.url();
    for path in ["/server_info", "/get_server_info"] {
        let info: Value = client()
            .get(format!("{url}{path}"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(info["served_model_name"], MODEL, "{path}");
        assert_eq!(info["dp_size"], 1, "{path}");
        // No model_path: a router would try to download its tokenizer.
        assert!(info.get("model_path").is_none(), "{path}");
    }
    for path in ["/model_info", "/get_model_info"] {
        let info: Value = client()
            .get(format!("{url}{path}"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(info["is_generation"], true, "{path}");
    }
}

/// Parses the Prometheus text: (name with labels, value) for every sample line.
fn samples(text: &str) -> Vec<(String, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').expect("sample line has a value");
            (
                series.to_owned(),
                value.parse::<f64>().expect("value parses"),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_use_vllm_names_and_types_and_parse() {
    let config = PodConfig {
        kv_blocks: Some(1000),
        ..PodConfig::default()
    };
    let pod = pod(config).await;
    let url = pod.url();
    client()
        .post(format!("{url}/v1/completions"))
        .json(&json!({"model": MODEL, "prompt": long_prompt(3, 20), "max_tokens": 3}))
        .send()
        .await
        .unwrap();
    let text = client()
        .get(format!("{url}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for (name, kind) in [
        ("vllm:num_requests_running", "gauge"),
        ("vllm:num_requests_waiting", "gauge"),
        ("vllm:kv_cache_usage_perc", "gauge"),
        ("vllm:prefix_cache_queries_total", "counter"),
        ("vllm:prefix_cache_hits_total", "counter"),
        ("vllm:num_preemptions_total", "counter"),
        ("vllm:prompt_tokens_total", "counter"),
        ("vllm:generation_tokens_total", "counter"),
        ("vllm:cache_config_info", "gauge"),
        ("vllm:time_to_first_token_seconds", "histogram"),
        ("vllm:inter_token_latency_seconds", "histogram"),
        ("vllm:e2e_request_latency_seconds", "histogram"),
        ("vllm:iteration_tokens_total", "histogram"),
        ("vllm:request_queue_time_seconds", "histogram"),
        ("vllm:request_prefill_time_seconds", "histogram"),
        ("vllm:request_decode_time_seconds", "histogram"),
    ] {
        assert!(
            text.contains(&format!("# TYPE {name} {kind}\n")),
            "{name} {kind}"
        );
    }
    let s = samples(&text);
    let get = |prefix: &str| {
        s.iter()
            .find(|(k, _)| k.starts_with(prefix))
            .map(|(_, v)| *v)
            .unwrap()
    };
    assert_eq!(get("vllm:generation_tokens_total{"), 3.0);
    assert_eq!(get("vllm:time_to_first_token_seconds_count{"), 1.0);
    assert_eq!(get("vllm:inter_token_latency_seconds_count{"), 2.0);
    assert_eq!(get("vllm:e2e_request_latency_seconds_count{"), 1.0);
    // One request of 3 tokens alone: one prefill step, then two decode steps of one token.
    let prompt_tokens = get("vllm:prompt_tokens_total{");
    assert_eq!(get("vllm:iteration_tokens_total_count{"), 3.0);
    assert_eq!(get("vllm:iteration_tokens_total_sum{"), prompt_tokens + 2.0);
    for phase in ["queue", "prefill", "decode"] {
        assert_eq!(
            get(&format!("vllm:request_{phase}_time_seconds_count{{")),
            1.0
        );
    }
    // The default profile's prefill step is ~6 ms; its two decode steps ~12 ms.
    let prefill_s = get("vllm:request_prefill_time_seconds_sum{");
    let decode_s = get("vllm:request_decode_time_seconds_sum{");
    assert!((0.005..0.5).contains(&prefill_s), "{prefill_s}");
    assert!((0.01..0.5).contains(&decode_s), "{decode_s}");
    assert_eq!(get("vllm:num_requests_running{"), 0.0);
    assert!(text.contains("num_gpu_blocks=\"1000\""));
    assert!(text.contains("block_size=\"16\""));
    assert!(get("vllm:prompt_tokens_total{") > 60.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_long_prompt_hits_the_prefix_cache_and_gets_a_much_lower_ttft() {
    let pod = pod(PodConfig::default()).await;
    let c = client();
    let body = json!({"model": MODEL, "prompt": token_prompt(7, 4000), "max_tokens": 2,
        "stream": true, "stream_options": {"include_usage": true}});
    let (cold, events) = stream_completion(&c, &pod.url(), body.clone()).await;
    let usage = &events.last().unwrap()["usage"];
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 0);
    let prompt_tokens = usage["prompt_tokens"].as_u64().unwrap();
    assert_eq!(prompt_tokens, 4000);

    let (warm, events) = stream_completion(&c, &pod.url(), body).await;
    let cached = events.last().unwrap()["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    // 4,000 tokens = 250 full blocks; the hit stops one block short so the last token is computed.
    assert_eq!(cached, 3984);
    // Model: cold ≈ 5.75 ms + 17.25 µs × 4,000 tokens ≈ 75 ms; warm ≈ 6 ms.
    assert!(cold > Duration::from_millis(50), "cold TTFT {cold:?}");
    assert!(warm * 3 < cold, "warm TTFT {warm:?} vs cold {cold:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_queue_and_raise_ttft() {
    let pod = pod(PodConfig::default()).await;
    let c = client();
    let body = |doc| json!({"model": MODEL, "prompt": token_prompt(doc, 4000), "max_tokens": 2, "stream": true});
    let (alone, _) = stream_completion(&c, &pod.url(), body(100)).await;
    let url = pod.url();
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let c = c.clone();
            let url = url.clone();
            let b = body(200 + i);
            tokio::spawn(async move { stream_completion(&c, &url, b).await.0 })
        })
        .collect();
    let mut worst = Duration::ZERO;
    for t in tasks {
        worst = worst.max(t.await.unwrap());
    }
    // 8 × ~4,000 uncached tokens through an 8,192-token step budget: the last request's
    // prefill ends ~4 steps of ~150 ms in, versus one ~75 ms step alone.
    assert!(
        worst > alone * 3,
        "worst concurrent TTFT {worst:?} vs alone {alone:?}"
    );
}

/// `vllm:prompt_tokens_by_source_total{source=…}` of a pod.
async fn prompt_tokens_by_source(url: &str, source: &str) -> f64 {
    let text = client()
        .get(format!("{url}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let want = format!("source=\"{source}\"}}");
    samples(&text)
        .into_iter()
        .find(|(s, _)| s.starts_with("vllm:prompt_tokens_by_source_total{") && s.ends_with(&want))
        .map(|(_, v)| v)
        .unwrap_or_else(|| panic!("no {source} sample"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_hands_kv_transfer_params_to_a_consumer_that_computes_no_prompt() {
    use kvgate_mock_pod::api::KvRole;
    let prefill = pod(PodConfig {
        kv_role: Some(KvRole::Producer),
        ..PodConfig::default()
    })
    .await;
    let decode = pod(PodConfig {
        kv_role: Some(KvRole::Consumer),
        ..PodConfig::default()
    })
    .await;
    let c = client();
    let prompt = token_prompt(11, 4000);
    let r: Value = c
        .post(format!("{}/v1/completions", prefill.url()))
        .json(&json!({"model": MODEL, "prompt": prompt, "max_tokens": 1,
            "kv_transfer_params": {"do_remote_decode": true}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let params = r["kv_transfer_params"].clone();
    assert_eq!(params["do_remote_prefill"], true);
    assert_eq!(params["remote_num_tokens"], 4000);
    assert_eq!(params["remote_block_ids"].as_array().unwrap().len(), 250);
    assert_eq!(
        prompt_tokens_by_source(&prefill.url(), "local_compute").await,
        4000.0
    );

    let body = json!({"model": MODEL, "prompt": prompt, "max_tokens": 3, "stream": true,
        "stream_options": {"include_usage": true}, "kv_transfer_params": params});
    let (ttft, events) = stream_completion(&c, &decode.url(), body).await;
    assert_eq!(events.last().unwrap()["usage"]["completion_tokens"], 3);
    assert_eq!(
        prompt_tokens_by_source(&decode.url(), "local_compute").await,
        0.0
    );
    assert_eq!(
        prompt_tokens_by_source(&decode.url(), "external_kv_transfer").await,
        4000.0
    );
    // A cold 4,000-token prefill takes ~75 ms on the default profile; one decode step ~6 ms.
    assert!(ttft < Duration::from_millis(40), "decode TTFT {ttft:?}");

    // Without `--kv-role`, kv_transfer_params are ignored (vLLM without a connector).
    let plain = pod(PodConfig::default()).await;
    let r: Value = c
        .post(format!("{}/v1/completions", plain.url()))
        .json(&json!({"model": MODEL, "prompt": "hi", "max_tokens": 1,
            "kv_transfer_params": {"do_remote_decode": true}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(r["kv_transfer_params"].is_null());
}

/// The value of the sample `name{…engine="rank"…}` in a `/metrics` text.
fn engine_sample(text: &str, name: &str, rank: u32) -> f64 {
    let engine = format!("engine=\"{rank}\"");
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(&engine))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_parallel_pod_pins_by_header_and_reports_each_engine_apart() {
    let pod = pod(PodConfig {
        data_parallel_size: 2,
        kv_events: Some("tcp://127.0.0.1:0".into()),
        kv_events_replay: Some("tcp://127.0.0.1:0".into()),
        ..PodConfig::default()
    })
    .await;
    let url = pod.url();
    let prompt = long_prompt(7, 40);
    // The same prompt three times on engine 1: its cache hits, engine 0's does not move.
    for _ in 0..3 {
        let r = client()
            .post(format!("{url}/v1/completions"))
            .header("X-data-parallel-rank", "1")
            .json(&json!({"model": MODEL, "prompt": prompt, "max_tokens": 2}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    let text = client()
        .get(format!("{url}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        engine_sample(&text, "vllm:prefix_cache_hits_total", 1) > 0.0,
        "{text}"
    );
    assert_eq!(engine_sample(&text, "vllm:prefix_cache_hits_total", 0), 0.0);
    assert_eq!(
        engine_sample(&text, "vllm:prefix_cache_queries_total", 0),
        0.0
    );
    // Every family once, each engine's series under it (as vLLM writes them).
    let helps = text
        .lines()
        .filter(|l| l.starts_with("# HELP vllm:num_requests_running "))
        .count();
    assert_eq!(helps, 1);
    for rank in 0..2 {
        let line = "vllm:cache_config_info{block_size=\"16\"";
        assert!(
            text.lines()
                .any(|l| l.starts_with(line) && l.contains(&format!("engine=\"{rank}\""))),
            "engine {rank}'s cache_config_info"
        );
    }
    // Out of range: vLLM's 400.
    let r = client()
        .post(format!("{url}/v1/completions"))
        .header("X-data-parallel-rank", "2")
        .json(&json!({"model": MODEL, "prompt": "x", "max_tokens": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let body: Value = r.json().await.unwrap();
    assert_eq!(
        body["error"]["message"],
        "data_parallel_rank 2 is out of range [0, 2)."
    );
    // One source per rank, rank 1 on rank 0's ports + 1.
    let sources: Value = client()
        .get(format!("{url}/kv_event_sources"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let port = |e: &Value| -> u16 {
        e.as_str()
            .unwrap()
            .rsplit(':')
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    assert_eq!(
        port(&sources["1"]["endpoint"]),
        port(&sources["0"]["endpoint"]) + 1
    );
    assert_eq!(
        port(&sources["1"]["replay_endpoint"]),
        port(&sources["0"]["replay_endpoint"]) + 1
    );
}
