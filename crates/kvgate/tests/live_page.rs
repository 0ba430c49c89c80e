//! The live page on the admin listener (`/ui`) and its JSON endpoints.
//!
//! - `live_json_endpoints_describe_the_fleet_and_its_decisions`: the gateway in front of mock
//!   pods, a few requests, then `/debug/pods`, `/debug/branches`, `/debug/predictor`,
//!   `/debug/queue` and `/ui` read and checked.
//! - `live_page_fills_in_headless_chromium`: `kvgate demo --traffic` as a user runs it, then
//!   Debian's `chromium --headless` loads `/ui?select=newest` and dumps the DOM after a virtual
//!   time budget: the pods table has a row per pod, the three charts have points, the decisions
//!   table has rows, and the newest decision's details list every pod's score and predicted
//!   TTFT. A screenshot is saved as `target/tmp/artifacts/kvgate-ui.png` (CI keeps it).
//!   Without a `chromium` binary (or `KVGATE_CHROMIUM`) it prints SKIPPED, unless
//!   `KVGATE_REQUIRE_CHROMIUM=1` (CI): then it fails.

use kvgate_gateway::{Gateway, ServeArgs};
use kvgate_mock_pod::{DEFAULT_MODEL, PodConfig, RunningPod};
use serde_json::{Value, json};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

async fn get_json(client: &reqwest::Client, url: String) -> Value {
    let resp = client.get(&url).send().await.unwrap();
    assert_eq!(resp.status(), 200, "{url}");
    assert_eq!(
        resp.headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("application/json"),
        "{url}"
    );
    resp.json().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_json_endpoints_describe_the_fleet_and_its_decisions() {
    let pods = kvgate_mock_pod::spawn_pods(
        &PodConfig {
            time_scale: 10.0,
            ..PodConfig::default()
        },
        "127.0.0.1:0".parse().unwrap(),
        3,
    )
    .await
    .unwrap();
    let gw = Gateway::start(ServeArgs {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        admin_listen: Some("127.0.0.1:0".parse().unwrap()),
        pod: pods.iter().map(RunningPod::url).collect(),
        scrape_interval_ms: Some(20),
        ..ServeArgs::default()
    })
    .await
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !pods.iter().all(|p| gw.pod_healthy(&p.url()) == Some(true)) {
        assert!(Instant::now() < deadline, "pods did not become healthy");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let base = format!("http://{}", gw.traffic_addr);
    let admin = format!("http://{}", gw.admin_addr);
    let client = reqwest::Client::new();
    let system = "You are a helpful assistant. ".repeat(30);
    for i in 0..8 {
        let resp = client
            .post(format!("{base}/v1/chat/completions"))
            .json(&json!({
                "model": DEFAULT_MODEL,
                "stream": true,
                "max_tokens": 4,
                "messages": [
                    {"role": "system", "content": system},
                    {"role": "user", "content": format!("question {i}")},
                ],
            }))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let _ = resp.bytes().await.unwrap();
    }

    let view = get_json(&client, format!("{admin}/debug/pods")).await;
    let view = view.as_array().unwrap();
    assert_eq!(view.len(), 3);
    let mut urls: Vec<&str> = view.iter().map(|p| p["pod"].as_str().unwrap()).collect();
    urls.sort_unstable();
    let mut want: Vec<String> = pods.iter().map(RunningPod::url).collect();
    want.sort_unstable();
    assert_eq!(urls, want);
    assert!(view.iter().all(|p| p["healthy"] == true));
    assert!(view.iter().all(|p| p["breaker_open"] == false));
    // Without --index engine there are no KV events.
    assert!(
        view.iter()
            .all(|p| p["kv_events_last_batch_age_seconds"].is_null())
    );
    let prompt: u64 = view
        .iter()
        .map(|p| p["prompt_tokens"].as_u64().unwrap())
        .sum();
    let cached: u64 = view
        .iter()
        .map(|p| p["cached_prompt_tokens"].as_u64().unwrap())
        .sum();
    assert!(prompt > 0 && cached > 0 && cached < prompt, "{view:?}");
    for p in view {
        match p["hit_rate"].as_f64() {
            Some(h) => assert!(
                (0.0..=1.0).contains(&h) && p["prompt_tokens"].as_u64().unwrap() > 0,
                "{p}"
            ),
            None => assert_eq!(p["prompt_tokens"], 0, "{p}"),
        }
    }

    // Every decision counted once under its branch.
    let branches = get_json(&client, format!("{admin}/debug/branches")).await;
    assert_eq!(branches["interval_s"], 5);
    let total: u64 = branches["totals"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert_eq!(total, 8, "{branches}");
    let decisions = get_json(&client, format!("{admin}/debug/decisions")).await;
    let mut by_branch = std::collections::BTreeMap::<String, u64>::new();
    for d in decisions.as_array().unwrap() {
        *by_branch
            .entry(d["branch"].as_str().unwrap().to_string())
            .or_default() += 1;
    }
    let totals: std::collections::BTreeMap<String, u64> = branches["totals"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_u64().unwrap()))
        .collect();
    assert_eq!(totals, by_branch);

    // The first sample is taken at start.
    let predictor = get_json(&client, format!("{admin}/debug/predictor")).await;
    assert!(!predictor["history"].as_array().unwrap().is_empty());
    assert!(
        predictor["now"]["samples"].as_u64().unwrap() >= 1,
        "{predictor}"
    );
    let queue = get_json(&client, format!("{admin}/debug/queue")).await;
    assert_eq!(queue["flow_control"], false);
    assert_eq!(queue["admission_queued"], 0);
    assert_eq!(queue["flow"], json!([]));
    assert!(!queue["history"].as_array().unwrap().is_empty());

    let page = client.get(format!("{admin}/ui")).send().await.unwrap();
    assert_eq!(page.status(), 200);
    assert_eq!(
        page.headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("text/html; charset=utf-8")
    );
    let html = page.text().await.unwrap();
    for endpoint in [
        "/debug/pods",
        "/debug/branches",
        "/debug/predictor",
        "/debug/queue",
        "/debug/decisions",
    ] {
        assert!(html.contains(endpoint), "the page does not read {endpoint}");
    }
}

/// Kills a child process when the test ends, whatever way it ends.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn chromium() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("KVGATE_CHROMIUM") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .flat_map(|name| std::env::split_paths(&path).map(move |d| d.join(name)))
        .find(|p| p.is_file())
}

/// Runs headless Chromium on `url` with `extra` flags; its stdout.
fn run_chromium(bin: &PathBuf, profile: &std::path::Path, extra: &[String], url: &str) -> String {
    let out = Command::new(bin)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--hide-scrollbars",
            "--window-size=1400,1400",
            // Virtual time runs the page's polling (every 2 s) three times without waiting.
            "--virtual-time-budget=7000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(extra)
        .arg(url)
        .stderr(Stdio::null())
        .output()
        .expect("run chromium");
    assert!(out.status.success(), "chromium failed: {:?}", out.status);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The `<tbody>` of the table with `id`, from the dumped DOM.
fn tbody<'a>(dom: &'a str, id: &str) -> &'a str {
    let start = dom
        .find(&format!("<table id=\"{id}\""))
        .unwrap_or_else(|| panic!("no table {id}"));
    let rest = &dom[start..];
    let body = rest.find("<tbody>").expect("tbody");
    let end = rest.find("</tbody>").expect("/tbody");
    &rest[body..end]
}

/// `data-points` of the SVG with `id`.
fn chart_points(dom: &str, id: &str) -> u64 {
    let start = dom
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no chart {id}"));
    let tag_end = start + dom[start..].find('>').unwrap();
    let tag = &dom[start..tag_end];
    let at = tag.find("data-points=\"").expect("data-points") + "data-points=\"".len();
    tag[at..].split('"').next().unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_page_fills_in_headless_chromium() {
    let Some(bin) = chromium() else {
        assert!(
            std::env::var("KVGATE_REQUIRE_CHROMIUM").as_deref() != Ok("1"),
            "KVGATE_REQUIRE_CHROMIUM=1 but no chromium binary (apt-get install -y chromium, or set KVGATE_CHROMIUM)"
        );
        eprintln!("SKIPPED: no chromium binary (apt-get install -y chromium)");
        return;
    };
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvgate"))
        .args([
            "demo",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--time-scale",
            "10",
            "--traffic",
            "--users",
            "4",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start kvgate demo");
    let stdout = child.stdout.take().expect("stdout");
    let _demo = Killed(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Some(url) = line.trim().strip_prefix("live page: ") {
                let _ = tx.send(url.to_string());
            }
        }
    });
    let ui = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("kvgate demo printed its live page's address");
    assert!(ui.ends_with("/ui"), "{ui}");
    // Three history samples (one at start, then every 5 s): two intervals of branches.
    tokio::time::sleep(Duration::from_secs(11)).await;

    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("artifacts");
    std::fs::create_dir_all(&dir).unwrap();
    let profile = dir.join("chromium-profile");
    let url = format!("{ui}?select=newest");
    let dom = run_chromium(&bin, &profile, &["--dump-dom".into()], &url);
    assert!(
        dom.contains("data-refreshed="),
        "the page never refreshed:\n{dom}"
    );
    assert!(
        dom.contains("<span id=\"error\"></span>"),
        "the page reported an error:\n{dom}"
    );
    let pods = tbody(&dom, "pods");
    assert_eq!(pods.matches("<tr data-pod=").count(), 4, "{pods}");
    assert_eq!(pods.matches(">healthy<").count(), 4, "{pods}");
    assert!(pods.contains(" %"), "no hit rate or KV use: {pods}");
    assert!(chart_points(&dom, "branches-chart") >= 2);
    assert!(chart_points(&dom, "predictor-chart") >= 3);
    assert!(chart_points(&dom, "queue-chart") >= 3);
    assert!(dom.contains("<rect"), "no branch bars");
    assert_eq!(
        dom.matches("<polyline").count(),
        6,
        "two line charts of 3 lines"
    );
    let decisions = tbody(&dom, "decisions");
    assert!(
        decisions.matches("<tr class=\"clickable").count() >= 5,
        "{decisions}"
    );
    // The selected (newest) decision's details: one row per pod.
    let detail = tbody(&dom, "detail");
    assert_eq!(detail.matches("<tr").count(), 4, "{detail}");
    assert!(dom.contains("Request "), "no decision title");

    let shot = dir.join("kvgate-ui.png");
    let _ = std::fs::remove_file(&shot);
    run_chromium(
        &bin,
        &profile,
        &[format!("--screenshot={}", shot.display())],
        &url,
    );
    let png = std::fs::read(&shot).expect("the screenshot");
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "{} bytes",
        png.len()
    );
    eprintln!("live page screenshot: {}", shot.display());
}
