//! `deploy/grafana/kvgate.json` and `deploy/prometheus/kvgate-rules.yml` checked against a real
//! Prometheus (Debian's `prometheus` package; `scripts/test` installs it, as CI does) scraping
//! kvgate in front of mock pods under load:
//!
//! - `promtool check rules` accepts the rule file;
//! - every query of the dashboard, its Grafana variables substituted (`$job`, `$pod` → `.*`,
//!   `$__rate_interval` → `1m`), answers at least one finite value through the HTTP query API;
//! - each alert fires when its condition is caused: the flow queue overflows
//!   (`KvgateQueueSaturated`), a pod stops (`KvgatePodUnhealthy`), every pod stops and requests
//!   get 503 (`KvgateNoHealthyPod`, `KvgateHigh5xxRatio`). The rules run as shipped except that
//!   every `for:` is 0 s. Where causing it is impractical, the expression is checked: the stopped
//!   pod's KV events stall, and `KvgateKvEventsStale`'s age term with 2 s instead of 120 s
//!   names that pod; `KvgatePredictorErrorHigh`'s expression without its thresholds answers.
//!
//! Without a `prometheus` binary (or `KVGATE_PROMETHEUS`) the test prints SKIPPED, unless
//! `KVGATE_REQUIRE_PROMETHEUS=1` (CI): then it fails.

use kvgate_gateway::{Gateway, ServeArgs};
use kvgate_mock_pod::{DEFAULT_MODEL, PodConfig};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `$KVGATE_PROMETHEUS`, else `prometheus` on the PATH.
fn find_binary(env: &str, name: &str) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(env) {
        return Some(PathBuf::from(p));
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// Kills Prometheus when the test ends, whatever way it ends.
struct Prometheus {
    child: Child,
    url: String,
    log: PathBuf,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// The result vector of an instant query (panics on an error answer).
    async fn query(&self, client: &reqwest::Client, expr: &str) -> Vec<Value> {
        let resp: Value = client
            .get(format!(
                "{}/api/v1/query?query={}",
                self.url,
                url_encode(expr)
            ))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(resp["status"], "success", "query {expr}: {resp}");
        match &resp["data"]["result"] {
            Value::Array(v) => v.clone(),
            // A scalar answer is one value.
            other => vec![json!({ "metric": {}, "value": other })],
        }
    }

    async fn firing(&self, client: &reqwest::Client) -> Vec<Value> {
        let resp: Value = client
            .get(format!("{}/api/v1/alerts", self.url))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        resp["data"]["alerts"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|a| a["state"] == "firing")
            .collect()
    }

    /// Waits until alert `name` fires (with `label=value` when given); returns its labels.
    async fn wait_firing(
        &self,
        client: &reqwest::Client,
        name: &str,
        label: Option<(&str, &str)>,
    ) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let firing = self.firing(client).await;
            if let Some(a) = firing.iter().find(|a| {
                a["labels"]["alertname"] == name && label.is_none_or(|(k, v)| a["labels"][k] == v)
            }) {
                return a["labels"].clone();
            }
            if Instant::now() > deadline {
                let rules: Value = client
                    .get(format!("{}/api/v1/rules", self.url))
                    .send()
                    .await
                    .unwrap()
                    .json()
                    .await
                    .unwrap();
                panic!(
                    "alert {name} {label:?} did not fire within 30 s; firing: {firing:?}\nrules: {rules}\nprometheus log:\n{}",
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

/// `text` percent-encoded for a URL query (every byte but the unreserved ones).
fn url_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Values of a query answer that are finite numbers.
fn finite_values(result: &[Value]) -> Vec<f64> {
    result
        .iter()
        .filter_map(|s| s["value"][1].as_str()?.parse::<f64>().ok())
        .filter(|v| v.is_finite())
        .collect()
}

/// Every `expr` of the dashboard's panels, with the panel's title.
fn dashboard_queries(dashboard: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut stack: Vec<&Value> = dashboard["panels"].as_array().unwrap().iter().collect();
    while let Some(panel) = stack.pop() {
        if let Some(inner) = panel["panels"].as_array() {
            stack.extend(inner);
        }
        for t in panel["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"].as_str().expect("every target has an expr");
            out.push((
                panel["title"].as_str().unwrap_or("").to_string(),
                expr.into(),
            ));
        }
    }
    out
}

/// Grafana's variables as the dashboard's "All" selection and a 1-minute rate window.
fn substitute_grafana_variables(expr: &str) -> String {
    expr.replace("$__rate_interval", "1m")
        .replace("$__interval", "15s")
        .replace("$job", ".*")
        .replace("$pod", ".*")
}

/// The rule file with every `for:` set to 0 s, so an alert fires at the first evaluation that
/// finds its condition.
fn rules_without_for(text: &str) -> String {
    text.lines()
        .map(|l| {
            if l.trim_start().starts_with("for:") {
                let indent = &l[..l.len() - l.trim_start().len()];
                format!("{indent}for: 0s")
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn start_prometheus(bin: &Path, dir: &Path, rules: &Path, target: &str) -> Prometheus {
    let port = free_port();
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\nscrape_configs:\n  - job_name: kvgate\n    static_configs:\n      - targets: ['{target}']\n",
            rules.display()
        ),
    )
    .unwrap();
    let log = dir.join("prometheus.log");
    let child = Command::new(bin)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("start prometheus");
    Prometheus {
        child,
        url: format!("http://127.0.0.1:{port}"),
        log,
    }
}

async fn chat(
    client: &reqwest::Client,
    base: &str,
    user: u32,
    turn: u32,
    priority: i32,
    max_tokens: u32,
) -> u16 {
    // Four shared system prompts, so the prefix index has something to hit.
    let system = format!(
        "You are assistant number {}. {}",
        user % 4,
        "Answer briefly and plainly. ".repeat(40)
    );
    let resp = client
        .post(format!("{base}/v1/chat/completions"))
        .header("x-kvgate-priority", priority.to_string())
        // Two tenants: one tenant alone reaches its share (429 flow_tenant_share) before the
        // queue is full.
        .header(
            "x-kvgate-tenant",
            if user.is_multiple_of(2) {
                "even"
            } else {
                "odd"
            },
        )
        .json(&json!({
            "model": DEFAULT_MODEL,
            "stream": true,
            "max_tokens": max_tokens,
            "ignore_eos": true,
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": format!("user {user} turn {turn}")},
            ],
        }))
        .send()
        .await;
    match resp {
        Ok(r) => {
            let status = r.status().as_u16();
            let _ = r.bytes().await;
            status
        }
        Err(_) => 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_queries_answer_and_alerts_fire_in_a_real_prometheus() {
    let Some(bin) = find_binary("KVGATE_PROMETHEUS", "prometheus") else {
        assert!(
            std::env::var("KVGATE_REQUIRE_PROMETHEUS").as_deref() != Ok("1"),
            "KVGATE_REQUIRE_PROMETHEUS=1 but no prometheus binary (apt-get install -y prometheus, or set KVGATE_PROMETHEUS)"
        );
        eprintln!("SKIPPED: no prometheus binary (apt-get install -y prometheus)");
        return;
    };
    let started = Instant::now();
    let root = workspace();
    let rules_path = root.join("deploy/prometheus/kvgate-rules.yml");
    let rules_text = std::fs::read_to_string(&rules_path).unwrap();

    // promtool, next to prometheus in Debian's package.
    let promtool = bin.with_file_name("promtool");
    let out = Command::new(&promtool)
        .args(["check", "rules"])
        .arg(&rules_path)
        .output()
        .expect("run promtool");
    assert!(
        out.status.success(),
        "promtool check rules: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // Three mock pods with KV events; flow control on with a small queue and one request in
    // flight per pod, so that a burst queues and overflows.
    let pod_config = PodConfig {
        kv_events: Some("tcp://127.0.0.1:0".into()),
        kv_events_replay: Some("tcp://127.0.0.1:0".into()),
        ..PodConfig::default()
    };
    let mut pods = kvgate_mock_pod::spawn_pods(&pod_config, "127.0.0.1:0".parse().unwrap(), 3)
        .await
        .unwrap();
    let dir = std::env::temp_dir().join(format!("kvgate-prometheus-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("kvgate.toml");
    std::fs::write(
        &config,
        "[flow_control]\nenabled = true\nmax_queued_requests = 6\ntenant_max_share = 1.0\n[flow_control.saturation]\nmax_in_flight_per_pod = 2\n",
    )
    .unwrap();
    let gw = Gateway::start(ServeArgs {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        admin_listen: Some("127.0.0.1:0".parse().unwrap()),
        pod: pods
            .iter()
            .map(|p| {
                format!(
                    "{},events={},replay={}",
                    p.url(),
                    p.kv_events_endpoint.as_deref().unwrap(),
                    p.kv_events_replay_endpoint.as_deref().unwrap()
                )
            })
            .collect(),
        index: Some(kvgate_gateway::config::IndexKind::Engine),
        scrape_interval_ms: Some(100),
        config: Some(config),
        ..ServeArgs::default()
    })
    .await
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !pods.iter().all(|p| gw.pod_healthy(&p.url()) == Some(true)) {
        assert!(Instant::now() < deadline, "pods did not become healthy");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let base = format!("http://{}", gw.traffic_addr);

    let test_rules = dir.join("rules.yml");
    std::fs::write(&test_rules, rules_without_for(&rules_text)).unwrap();
    let prom = start_prometheus(&bin, &dir, &test_rules, &gw.admin_addr.to_string());
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ready = client
            .get(format!("{}/-/ready", prom.url))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
        if ready {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "prometheus not ready within 30 s:\n{}",
            prom.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Load: 6 closed-loop users for 8 s, priorities 0 and 1, then a burst of 30 that overflows
    // the 6-place flow queue (429 flow_queue_full).
    let load_until = Instant::now() + Duration::from_secs(8);
    let mut users = tokio::task::JoinSet::new();
    for user in 0..6u32 {
        let (client, base) = (client.clone(), base.clone());
        users.spawn(async move {
            let mut statuses = Vec::new();
            let mut turn = 0;
            while Instant::now() < load_until {
                statuses.push(chat(&client, &base, user, turn, (user % 2) as i32, 8).await);
                turn += 1;
            }
            statuses
        });
    }
    let mut ok = 0;
    while let Some(statuses) = users.join_next().await {
        ok += statuses.unwrap().iter().filter(|&&s| s == 200).count();
    }
    assert!(ok >= 20, "only {ok} requests answered 200 under load");
    // Six long requests (300 tokens, ~2 s) fill the pods' in-flight cap first (requests
    // arriving at one instant all see the fleet unsaturated), then a burst of 30 more. Twice,
    // a scrape apart: Prometheus sees a series' first value, not the increase that created it
    // (the first release from a band's queue).
    for round in 0..2u32 {
        let mut burst = tokio::task::JoinSet::new();
        for i in 0..6u32 {
            let (client, base) = (client.clone(), base.clone());
            burst.spawn(async move { chat(&client, &base, 200 + i, round, 0, 300).await });
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while pods
            .iter()
            .map(|p| gw.in_flight(&p.url()).map_or(0, |f| f.requests))
            .sum::<u32>()
            < 6
        {
            assert!(
                Instant::now() < deadline,
                "the six long requests not in flight"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        for i in 0..30u32 {
            let (client, base) = (client.clone(), base.clone());
            burst.spawn(async move { chat(&client, &base, 100 + i, round, 0, 300).await });
        }
        let mut statuses = Vec::new();
        while let Some(status) = burst.join_next().await {
            statuses.push(status.unwrap());
        }
        assert!(
            statuses.contains(&429),
            "burst {round} of 30 overflowed no queue: {statuses:?}"
        );
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    // Two more scrapes, so the last requests are in Prometheus.
    tokio::time::sleep(Duration::from_secs(3)).await;

    // Every dashboard query answers, with all pods up.
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("deploy/grafana/kvgate.json")).unwrap(),
    )
    .unwrap();
    let queries = dashboard_queries(&dashboard);
    assert!(queries.len() >= 20, "{} queries", queries.len());
    let mut empty = Vec::new();
    for (title, expr) in &queries {
        let expr = substitute_grafana_variables(expr);
        assert!(!expr.contains('$'), "unsubstituted variable in {expr}");
        let result = prom.query(&client, &expr).await;
        if finite_values(&result).is_empty() {
            empty.push(format!("{title}: {expr} → {result:?}"));
        }
    }
    assert!(
        empty.is_empty(),
        "dashboard queries without data:\n{}",
        empty.join("\n")
    );
    // The autoscaling queries of docs/deployment.md (KEDA's example) answer too.
    for expr in [
        "sum(kvgate_in_flight_requests{job=\"kvgate\"}) + (sum(kvgate_flow_queued{job=\"kvgate\"}) or vector(0))",
        "max(kvgate:flow_queue_time_seconds:p90_5m) or vector(0)",
    ] {
        let result = prom.query(&client, expr).await;
        assert_eq!(finite_values(&result).len(), 1, "{expr}: {result:?}");
    }
    // The per-pod series name every pod.
    let per_pod = prom
        .query(&client, "count(kvgate_pod_ttft_ms_count) by (pod)")
        .await;
    assert_eq!(per_pod.len(), pods.len(), "{per_pod:?}");
    let hit = finite_values(&prom.query(&client, "kvgate:prefix_hit_ratio:rate5m").await);
    assert!(
        !hit.is_empty() && hit.iter().all(|h| (0.0..=1.0).contains(h)),
        "prefix hit ratio {hit:?}"
    );
    assert!(
        hit.iter().any(|&h| h > 0.0),
        "shared system prompts hit nowhere: {hit:?}"
    );

    // The queue overflowed: KvgateQueueSaturated.
    prom.wait_firing(&client, "KvgateQueueSaturated", None)
        .await;
    // The predictor's alert, thresholds removed: its terms answer.
    let predictor = prom
        .query(
            &client,
            "(kvgate_predictor_ttft_mape >= 0 or kvgate_predictor_ttft_p90_coverage >= 0) and kvgate_predictor_samples > 0",
        )
        .await;
    assert!(!finite_values(&predictor).is_empty(), "{predictor:?}");
    // Quiet while healthy.
    let firing: Vec<String> = prom
        .firing(&client)
        .await
        .iter()
        .map(|a| a["labels"]["alertname"].as_str().unwrap_or("").to_string())
        .collect();
    for quiet in [
        "KvgatePodUnhealthy",
        "KvgateNoHealthyPod",
        "KvgateHigh5xxRatio",
        "KvgateKvEventsStale",
    ] {
        assert!(
            !firing.iter().any(|f| f == quiet),
            "{quiet} fires while all is healthy: {firing:?}"
        );
    }

    // Stop pod 0: its scrapes fail (KvgatePodUnhealthy for it) and its KV events stall.
    let stopped = pods.remove(0);
    let stopped_url = stopped.url();
    drop(stopped);
    let labels = prom
        .wait_firing(&client, "KvgatePodUnhealthy", Some(("pod", &stopped_url)))
        .await;
    assert_eq!(labels["pod"], stopped_url.as_str());
    // KvgateKvEventsStale's age term, 2 s instead of 120 s.
    for term in [
        "kvgate_kv_events_last_batch_age_seconds > 120",
        "and on (pod) sum by (pod) (rate(kvgate_pod_prompt_tokens_total[5m])) > 0",
    ] {
        assert!(rules_text.contains(term), "the rule file lost {term}");
    }
    let stale_expr = "kvgate_kv_events_last_batch_age_seconds > 2 and on (pod) sum by (pod) (rate(kvgate_pod_prompt_tokens_total[5m])) > 0";
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let result = prom.query(&client, stale_expr).await;
        if result
            .iter()
            .any(|s| s["metric"]["pod"] == stopped_url.as_str())
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{stale_expr} never named the stopped pod: {result:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // Stop every pod: requests get 503 no_healthy_pod.
    drop(pods);
    let deadline = Instant::now() + Duration::from_secs(20);
    while gw.shared().fleet.pods.all().iter().any(|p| p.is_healthy()) {
        assert!(Instant::now() < deadline, "pods still healthy");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Two rounds a scrape apart (the first creates the error's series).
    for round in 0..2 {
        for i in 0..100 {
            let status = chat(&client, &base, 1000 + i, round, 0, 8).await;
            assert!(status >= 500, "status {status} with no pod");
        }
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    prom.wait_firing(&client, "KvgateNoHealthyPod", None).await;
    prom.wait_firing(&client, "KvgateHigh5xxRatio", None).await;

    // Every alert of the file was caused or checked above.
    let file: Value = serde_saphyr::from_str(&rules_text).unwrap();
    let alerts: Vec<&str> = file["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .filter_map(|r| r["alert"].as_str())
        .collect();
    assert_eq!(
        alerts,
        [
            "KvgatePodUnhealthy",
            "KvgateNoHealthyPod",
            "KvgateKvEventsStale",
            "KvgateQueueSaturated",
            "KvgateHigh5xxRatio",
            "KvgatePredictorErrorHigh",
        ]
    );
    eprintln!(
        "prometheus check: {} dashboard queries, {} alerts, {:.1} s",
        queries.len(),
        alerts.len(),
        started.elapsed().as_secs_f64()
    );
    drop(prom);
    let _ = std::fs::remove_dir_all(&dir);
}
