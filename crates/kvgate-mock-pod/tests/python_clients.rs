//! Python clients against in-process mock pods: the official `openai` client, and a pyzmq +
//! msgpack KV events subscriber in both encodings. Needs the venv that `scripts/test` creates
//! (`KVGATE_PYTHON`, else `<workspace>/.venv/bin/python`).

mod common;

use common::{MODEL, pod, run_python};
use kvgate_mock_pod::{KvEventsEncoding, PodConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_openai_client_gets_consistent_completions_and_chats() {
    let pod = pod(PodConfig::default()).await;
    let url = pod.url();
    tokio::task::spawn_blocking(move || run_python("openai_client.py", &[&url, MODEL]))
        .await
        .unwrap();
}

async fn kv_events_round_trip(encoding: KvEventsEncoding, name: &str) {
    let pod = pod(PodConfig {
        kv_blocks: Some(48),
        kv_events: Some("tcp://127.0.0.1:0".into()),
        kv_events_replay: Some("tcp://127.0.0.1:0".into()),
        kv_events_encoding: encoding,
        ..PodConfig::default()
    })
    .await;
    let url = pod.url();
    let pub_ep = pod.kv_events_endpoint.clone().unwrap();
    let replay_ep = pod.kv_events_replay_endpoint.clone().unwrap();
    let name = name.to_owned();
    tokio::task::spawn_blocking(move || {
        run_python("kv_events.py", &[&url, MODEL, &pub_ep, &replay_ep, &name])
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pyzmq_subscriber_decodes_map_encoded_events_and_replay() {
    kv_events_round_trip(KvEventsEncoding::Map, "map").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pyzmq_subscriber_decodes_array_encoded_events_and_replay() {
    kv_events_round_trip(KvEventsEncoding::Array, "array").await;
}
