//! Session affinity through the HTTP proxy: a request naming its client session in a header
//! (`x-session-id`, Claude Code's, OpenCode's, or the configured `session_headers`) goes back to
//! the pod of the session's last request, even when its prompt no longer shares a prefix with
//! what that pod holds (an agent's compacted context).

mod common;

use common::*;

/// The seed gate (affinity broken only 5 s worse) with exploration off, and session affinity
/// on (an experimental key).
const SESSIONS_ON: &str = "[router]\ngate_profile = \"seed\"\nexperimental_options = true\n\
     session_affinity_ttl_ms = 600000\nepsilon_explore_sticky = 0.0\n";

async fn gateway_with(pods: &[&FakePod], name: &str, toml: &str) -> kvgate_gateway::Gateway {
    let dir = std::env::temp_dir().join(format!("kvgate-session-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("kvgate.toml");
    std::fs::write(&path, toml).unwrap();
    let mut a = args(pods);
    a.config = Some(path);
    kvgate_gateway::Gateway::start(a).await.unwrap()
}

fn prompt(tag: &str) -> String {
    (0..150)
        .map(|i| format!("{tag}-w{i}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Sends a chat of `turns` (user, assistant, user, …) and returns the pod that served it.
async fn served_by(gw: &kvgate_gateway::Gateway, session: Option<&str>, turns: &[&str]) -> String {
    let roles = ["user", "assistant"];
    let messages: Vec<serde_json::Value> = turns
        .iter()
        .enumerate()
        .map(|(i, t)| serde_json::json!({"role": roles[i % 2], "content": t}))
        .collect();
    let body = serde_json::json!({"model": "fake-model", "messages": messages}).to_string();
    let mut req = post(gw, "/v1/chat/completions", &body);
    if let Some(s) = session {
        req.headers_mut().insert("x-session-id", s.parse().unwrap());
    }
    let r = send(&client(), req).await;
    assert_eq!(r.status, 200, "{}", r.text());
    r.header("x-kvgate-pod").expect("x-kvgate-pod")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_comes_back_to_its_busy_pod_after_its_prompt_is_rewritten() {
    let fast = Behavior::Normal {
        chunks: 2,
        delay_ms: 1,
    };
    // The streams that load the pods last 5 s, so they hold them while the next requests are
    // decided.
    let slow = Behavior::Normal {
        chunks: 100,
        delay_ms: 50,
    };
    let (p1, p2) = (FakePod::start(fast).await, FakePod::start(fast).await);
    let pods = [&p1, &p2];
    let gw = gateway_with(&pods, "on", SESSIONS_ON).await;
    for p in pods {
        eventually("pods healthy", || gw.pod_healthy(&p.url) == Some(true)).await;
    }
    let first = prompt("first");
    let home = served_by(&gw, Some("agent-1"), &[&first]).await;
    let other_pod = [&p1.url, &p2.url]
        .into_iter()
        .find(|u| **u != home)
        .unwrap()
        .clone();
    // Three streams that share the session's prefix hold the session's pod, one short prompt
    // the other pod: the session's pod is the busier one.
    for p in pods {
        p.set(slow);
    }
    let gw = std::sync::Arc::new(gw);
    let spawn = |turns: Vec<String>| {
        let gw = gw.clone();
        tokio::spawn(async move {
            let turns: Vec<&str> = turns.iter().map(String::as_str).collect();
            served_by(&gw, None, &turns).await
        })
    };
    // The session's next turns (its first message, an answer, a short new one): they share its
    // prefix, so the prefix holds them on the session's pod.
    let turn = |next: &str| vec![first.clone(), "ok".to_string(), next.to_string()];
    let holders = [
        spawn(turn("go on")),
        spawn(turn("and then")),
        spawn(turn("what else")),
    ];
    eventually("three holders on the session's pod", || {
        gw.in_flight(&home).is_some_and(|f| f.requests == 3)
    })
    .await;
    // A short prompt of another client goes to the idle pod.
    let control = spawn(vec!["hello there".to_string()]);
    eventually("the control on the other pod", || {
        gw.in_flight(&other_pod).is_some_and(|f| f.requests == 1)
    })
    .await;
    for p in pods {
        p.set(fast);
    }
    // Meanwhile, a rewritten prompt of the session, then a like prompt without one: neither
    // shares anything with what either pod holds. With the session's key it goes to the
    // session's pod; without, to the less busy pod.
    let again = served_by(&gw, Some("agent-1"), &[&prompt("compacted")]).await;
    assert_eq!(
        again, home,
        "the session's rewritten prompt goes to its pod"
    );
    let cold = served_by(&gw, None, &[&prompt("cold")]).await;
    assert_eq!(cold, other_pod, "without a session: the less busy pod");
    assert_eq!(
        gw.in_flight(&home).map(|f| f.requests),
        Some(3),
        "still held"
    );
    for h in holders {
        assert_eq!(h.await.unwrap(), home);
    }
    assert_eq!(control.await.unwrap(), other_pod);
    // A session header the gateway cannot use is a 400 while session affinity is on.
    let mut req = post(&gw, "/v1/chat/completions", &chat_body("hi", false));
    req.headers_mut()
        .insert("x-session-id", "two words".parse().unwrap());
    let r = send(&client(), req).await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["code"], "invalid_session_header");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_session_affinity_off_the_session_headers_are_not_read() {
    let fast = Behavior::Normal {
        chunks: 2,
        delay_ms: 1,
    };
    let p1 = FakePod::start(fast).await;
    let gw = gateway_with(&[&p1], "off", "[router]\n").await;
    eventually("pod healthy", || gw.pod_healthy(&p1.url) == Some(true)).await;
    let mut req = post(&gw, "/v1/chat/completions", &chat_body("hi", false));
    req.headers_mut()
        .insert("x-session-id", "two words".parse().unwrap());
    assert_eq!(send(&client(), req).await.status, 200);
}
