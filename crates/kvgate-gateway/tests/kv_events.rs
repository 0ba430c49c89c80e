//! The gateway's KV-event subscriber against a Python publisher (pyzmq + msgpack) that speaks
//! vLLM's wire format in both encodings: the engine index follows stored / removed / cleared,
//! a gap is filled by replay, an unfillable gap marks the pod stale, a sequence back to 0 — or
//! back to any earlier seq, as a late reconnect to a restarted engine sees it — clears the pod
//! and resyncs, blocks cached before the gateway subscribed are learnt from the replay buffer
//! (vLLM 0.32's four-frame replay framing), and garbage is counted and skipped.
//!
//! Python: `$KVGATE_PYTHON`, else `<workspace>/.venv/bin/python` (needs pyzmq and msgpack).

mod common;

use common::{Behavior, FakePod};
use kvgate_core::index::PrefixIndex;
use kvgate_core::{BlockHasher, PodId};
use kvgate_gateway::config::IndexKind;
use kvgate_gateway::pods::PodLabel;
use kvgate_gateway::serve::Gateway;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

const MODEL: &str = "events-model";

fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("KVGATE_PYTHON") {
        return PathBuf::from(p);
    }
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/python");
    assert!(
        venv.exists(),
        "no Python for the KV-event publisher: set KVGATE_PYTHON to a python with pyzmq and \
         msgpack, or create {} (python -m venv .venv && .venv/bin/pip install pyzmq msgpack)",
        venv.display()
    );
    venv
}

struct Publisher {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Publisher {
    fn start() -> (Publisher, u16, u16) {
        Publisher::start_with(json!([]))
    }

    /// A publisher whose replay buffer already holds `preload` (a list of batch commands).
    fn start_with(preload: Value) -> (Publisher, u16, u16) {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/kv_events_publisher.py");
        let mut child = Command::new(python())
            .arg(script)
            .arg(preload.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting the Python KV-event publisher");
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let parts: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(
            parts.first(),
            Some(&"ports"),
            "publisher said {line:?} (pyzmq/msgpack missing?)"
        );
        let (p, r) = (parts[1].parse().unwrap(), parts[2].parse().unwrap());
        (
            Publisher {
                child,
                stdin,
                stdout,
            },
            p,
            r,
        )
    }

    fn wait_line(&mut self, expected: &str) {
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), expected);
    }

    fn cmd(&mut self, cmd: Value) {
        writeln!(self.stdin, "{cmd}").unwrap();
        self.stdin.flush().unwrap();
        self.wait_line("ok");
    }

    fn send(&mut self, op: &str, seq: u64, enc: &str, batch: &str, events: Value) {
        self.cmd(json!({"op": op, "seq": seq, "enc": enc, "batch": batch, "events": events}));
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn stored(hashes: &[u64], parent: Option<u64>, tokens: std::ops::Range<u32>) -> Value {
    json!({"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
           "token_ids": tokens.collect::<Vec<u32>>(), "block_size": 16})
}

/// A fake pod whose KV events come from the publisher's ports, behind a gateway in engine mode.
async fn engine_gateway(pub_port: u16, replay_port: u16) -> (FakePod, Gateway) {
    let pod = FakePod::start_with_model(
        Behavior::Normal {
            chunks: 1,
            delay_ms: 0,
        },
        MODEL,
    )
    .await;
    let mut args = common::args(&[&pod]);
    args.pod = vec![format!(
        "{},events=tcp://127.0.0.1:{pub_port},replay=tcp://127.0.0.1:{replay_port},model={MODEL}",
        pod.url
    )];
    args.index = Some(IndexKind::Engine);
    let gw = Gateway::start(args).await.unwrap();
    (pod, gw)
}

/// Leading blocks of a token prompt the gateway's index gives pod 0.
fn matched(gw: &Gateway, tokens: std::ops::Range<u32>) -> u32 {
    let tokens: Vec<u32> = tokens.collect();
    let mut blocks = Vec::new();
    BlockHasher::default().hash_tokens(BlockHasher::chain_seed(MODEL, None), &tokens, &mut blocks);
    let mut m = Vec::new();
    gw.shared()
        .session
        .lock()
        .index()
        .match_prefix(&blocks, &mut m);
    m.first().copied().unwrap_or(0)
}

fn counter(
    gw: &Gateway,
    url: &str,
    pick: fn(
        &kvgate_gateway::metrics::Metrics,
    ) -> &prometheus_client::metrics::family::Family<
        PodLabel,
        prometheus_client::metrics::counter::Counter,
    >,
) -> u64 {
    pick(&gw.shared().telemetry.metrics)
        .get_or_create(&PodLabel {
            pod: url.to_string(),
        })
        .get()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriber_follows_python_publisher_through_gaps_restarts_and_garbage() {
    let (mut publisher, pub_port, replay_port) = Publisher::start();
    let (pod, gw) = engine_gateway(pub_port, replay_port).await;
    let url = pod.url.clone();
    tokio::task::block_in_place(|| publisher.wait_line("subscribed"));

    // Map events in a map batch, then positional events in a positional batch.
    tokio::task::block_in_place(|| {
        publisher.send(
            "send",
            0,
            "map",
            "map",
            json!([stored(&[101, 102], None, 0..32)]),
        );
        publisher.send(
            "send",
            1,
            "array",
            "array",
            json!([stored(&[103], Some(102), 32..48)]),
        );
    });
    common::eventually("stored blocks indexed", || matched(&gw, 0..48) == 3).await;

    tokio::task::block_in_place(|| {
        publisher.send(
            "send",
            2,
            "array",
            "map",
            json!([{"type": "BlockRemoved", "block_hashes": [103]}]),
        );
    });
    common::eventually("removed block forgotten", || matched(&gw, 0..48) == 2).await;

    // Seq 3 lost in flight: the gap is filled from the replay socket.
    tokio::task::block_in_place(|| {
        publisher.send(
            "drop",
            3,
            "map",
            "array",
            json!([stored(&[201], None, 100..116)]),
        );
        publisher.send(
            "send",
            4,
            "map",
            "array",
            json!([stored(&[202], Some(201), 116..132)]),
        );
    });
    common::eventually("gap replayed", || matched(&gw, 100..132) == 2).await;
    assert_eq!(counter(&gw, &url, |m| &m.kv_events_gaps), 1);
    assert_eq!(counter(&gw, &url, |m| &m.kv_events_replay_failures), 0);

    // Garbage: a one-frame message, and a well-framed message with random bytes.
    tokio::task::block_in_place(|| {
        publisher.cmd(json!({"op": "raw", "frames": ["deadbeef"]}));
        publisher.cmd(json!({"op": "raw", "frames": ["6b76", "0000000000000005", "c1ffee00d5"]}));
    });
    common::eventually("garbage counted", || {
        counter(&gw, &url, |m| &m.kv_events_rejected) == 2
    })
    .await;
    assert_eq!(matched(&gw, 0..48), 2);

    // Engine restart: seq back to 0 clears the pod, then AllBlocksCleared clears it again.
    tokio::task::block_in_place(|| {
        publisher.send(
            "send",
            0,
            "map",
            "map",
            json!([stored(&[301], None, 200..216)]),
        );
    });
    common::eventually("restart cleared the pod", || {
        matched(&gw, 200..216) == 1 && matched(&gw, 0..48) == 0
    })
    .await;
    assert_eq!(counter(&gw, &url, |m| &m.kv_events_restarts), 1);
    tokio::task::block_in_place(|| {
        publisher.send(
            "send",
            1,
            "array",
            "array",
            json!([{"type": "AllBlocksCleared"}]),
        );
    });
    common::eventually("cleared", || matched(&gw, 200..216) == 0).await;

    // A gap the replay buffer no longer holds: the pod goes stale (routed index stands in).
    tokio::task::block_in_place(|| {
        publisher.cmd(json!({"op": "forget"}));
        publisher.send(
            "send",
            3,
            "map",
            "map",
            json!([stored(&[401], None, 300..316)]),
        );
    });
    common::eventually("stale after failed replay", || {
        gw.shared().session.lock().index().engine.is_stale(PodId(0))
    })
    .await;
    assert_eq!(counter(&gw, &url, |m| &m.kv_events_replay_failures), 1);
    // Stale: the routed index (which never saw this prompt) answers for the pod.
    assert_eq!(matched(&gw, 300..316), 0);
    gw.shared()
        .session
        .lock()
        .index_mut()
        .engine
        .set_stale(PodId(0), false);
    assert_eq!(matched(&gw, 300..316), 1);

    // A new engine seen late: its seq 0 and 1 never reached us, the first batch we get is 2,
    // below the last seen (3). The old engine's blocks go; 0..2 come from the new buffer.
    tokio::task::block_in_place(|| {
        publisher.send(
            "drop",
            0,
            "map",
            "map",
            json!([stored(&[501], None, 400..416)]),
        );
        publisher.send(
            "drop",
            1,
            "map",
            "map",
            json!([stored(&[502], Some(501), 416..432)]),
        );
        publisher.send(
            "send",
            2,
            "map",
            "map",
            json!([stored(&[503], Some(502), 432..448)]),
        );
    });
    common::eventually("resynced to the new engine", || {
        matched(&gw, 400..448) == 3 && matched(&gw, 300..316) == 0
    })
    .await;
    assert_eq!(counter(&gw, &url, |m| &m.kv_events_restarts), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocks_cached_before_the_gateway_subscribed_are_learnt_from_the_replay_buffer() {
    let preload = json!([
        {"seq": 0, "events": [stored(&[11, 12], None, 0..32)]},
        {"seq": 1, "events": [stored(&[13], Some(12), 32..48)]},
    ]);
    let (mut publisher, pub_port, replay_port) = Publisher::start_with(preload);
    let (pod, gw) = engine_gateway(pub_port, replay_port).await;
    let url = pod.url.clone();
    tokio::task::block_in_place(|| publisher.wait_line("subscribed"));
    // Nothing is published live: only the replay on subscribe can tell of these blocks.
    common::eventually("replayed on subscribe", || matched(&gw, 0..48) == 3).await;
    // The next live batch continues the sequence: applied, not taken for a gap or a restart.
    tokio::task::block_in_place(|| {
        publisher.send(
            "send",
            2,
            "map",
            "map",
            json!([stored(&[14], Some(13), 48..64)]),
        );
    });
    common::eventually("live batch after the replay", || matched(&gw, 0..64) == 4).await;
    assert_eq!(counter(&gw, &url, |m| &m.kv_events_gaps), 0);
    assert_eq!(counter(&gw, &url, |m| &m.kv_events_restarts), 0);
    assert_eq!(counter(&gw, &url, |m| &m.kv_events_replay_failures), 0);
}

/// `--tokenizer FILE`: the gateway cuts a text prompt with the model's tokenizer.json, so the
/// blocks the publisher reports by token ids (0…31) match the prompt `w0 w1 … w39` (40 tokens:
/// two full blocks), which the built-in cl100k would tokenize differently.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tokenizer_json_makes_text_prompts_match_the_events_token_blocks() {
    let dir = std::env::temp_dir().join(format!("kvgate-kv-events-{}", std::process::id()));
    let path = common::word_level_tokenizer_json(&dir);
    let (mut publisher, pub_port, replay_port) = Publisher::start();
    let pod = FakePod::start_with_model(
        Behavior::Normal {
            chunks: 1,
            delay_ms: 0,
        },
        MODEL,
    )
    .await;
    let mut args = common::args(&[&pod]);
    args.pod = vec![format!(
        "{},events=tcp://127.0.0.1:{pub_port},replay=tcp://127.0.0.1:{replay_port},model={MODEL}",
        pod.url
    )];
    args.index = Some(IndexKind::Engine);
    args.tokenizer = Some(path.clone());
    let gw = Gateway::start(args).await.unwrap();
    tokio::task::block_in_place(|| publisher.wait_line("subscribed"));
    tokio::task::block_in_place(|| {
        publisher.send(
            "send",
            0,
            "map",
            "map",
            json!([stored(&[101, 102], None, 0..32)]),
        );
    });
    common::eventually("stored blocks indexed", || matched(&gw, 0..32) == 2).await;

    let prompt: Vec<String> = (0..40).map(|i| format!("w{i}")).collect();
    let prompt = prompt.join(" ");
    assert_ne!(
        kvgate_core::tokenizer::PromptTokenizer::cl100k().encode(&prompt),
        (0..40).collect::<Vec<u32>>()
    );
    let body = json!({"model": MODEL, "prompt": prompt, "max_tokens": 1}).to_string();
    let resp = common::send(
        &common::client(),
        common::post(&gw, "/v1/completions", &body),
    )
    .await;
    assert_eq!(resp.status, 200);
    let decisions = gw.shared().telemetry.decisions.snapshot();
    let last = decisions.last().expect("a decision");
    assert_eq!(last.decision.pods.len(), 1);
    assert_eq!(last.decision.pods[0].prefix_score, 1.0);
    std::fs::remove_file(path).unwrap();
}

/// A pod whose scrapes fail and then succeed again (its process restarted): the gateway drops
/// its subscription, clears the old engine's blocks and learns the new engine's from the replay
/// buffer at once, without waiting for ZeroMQ's reconnect or for a live batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_back_after_an_outage_is_cleared_and_resubscribed() {
    let (mut publisher, pub_port, replay_port) = Publisher::start();
    let (pod, gw) = engine_gateway(pub_port, replay_port).await;
    let url = pod.url.clone();
    tokio::task::block_in_place(|| {
        publisher.wait_line("subscribed");
        publisher.send(
            "send",
            0,
            "map",
            "map",
            json!([stored(&[1, 2], None, 0..32)]),
        );
    });
    common::eventually("old engine's blocks indexed", || matched(&gw, 0..32) == 2).await;
    common::eventually("pod healthy", || gw.pod_healthy(&url) == Some(true)).await;

    // The pod goes down; while it is down its new engine caches another prefix.
    pod.state
        .metrics_ok
        .store(false, std::sync::atomic::Ordering::Relaxed);
    common::eventually("pod unhealthy", || gw.pod_healthy(&url) == Some(false)).await;
    tokio::task::block_in_place(|| {
        publisher.send(
            "drop",
            0,
            "map",
            "map",
            json!([stored(&[9], None, 500..516)]),
        );
    });
    pod.state
        .metrics_ok
        .store(true, std::sync::atomic::Ordering::Relaxed);
    common::eventually("resubscribed: old blocks gone, new ones replayed", || {
        matched(&gw, 0..32) == 0 && matched(&gw, 500..516) == 1
    })
    .await;
    assert_eq!(counter(&gw, &url, |m| &m.kv_events_restarts), 1);
}
