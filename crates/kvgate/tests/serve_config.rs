//! `kvgate serve --config FILE` as a process: `gate_profile = "seed"` in the file runs the seed's
//! gate (seen in the admin listener's `/debug/config`), and rewriting the file changes what
//! `/debug/config` shows, through the reload: given keys over the profile, a bad file keeps the
//! config in force, another profile replaces it.

mod common;

use common::start_serve;
use serde_json::Value;
use std::path::Path;
use std::time::{Duration, Instant};

async fn config_dump(c: &reqwest::Client, admin: &str) -> Value {
    let resp = c.get(format!("{admin}/debug/config")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "application/json");
    resp.json().await.unwrap()
}

/// Polls `/debug/config` until `done` holds (the reload polls the file every second).
async fn wait_for_dump(
    c: &reqwest::Client,
    admin: &str,
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let dump = config_dump(c, admin).await;
        if done(&dump) {
            return dump;
        }
        assert!(Instant::now() < deadline, "never {what}: {dump:#}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn reload_errors(c: &reqwest::Client, admin: &str) -> u64 {
    let text = c
        .get(format!("{admin}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("kvgate_config_reload_errors_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no kvgate_config_reload_errors_total in {text}"))
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_profile_in_the_config_file_is_in_force_and_a_rewrite_reloads_it() {
    let dir = std::env::temp_dir().join(format!("kvgate-serve-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("kvgate.toml");
    write(
        &path,
        "max_retries = 1\n[router]\ngate_profile = \"seed\"\n",
    );
    let serve = start_serve(
        &[
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--config",
            path.to_str().unwrap(),
            "--first-byte-timeout-ms",
            "4321",
            "--set",
            "router.affinity_gate_tau=0.7",
        ],
        |cmd| {
            cmd.env("KVGATE_ROUTER__AFFINITY_GATE_TAU", "0.6")
                .env("KVGATE_MODELS_REFRESH_INTERVAL_MS", "777");
        },
    );
    let admin = serve.admin.clone();
    let c = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();

    // The seed's gate, not the default's: every key on which the two profiles differ.
    let dump = config_dump(&c, &admin).await;
    let router = &dump["router"];
    assert_eq!(router["gate_profile"], "seed", "{dump:#}");
    assert_eq!(router["explore_mode"], "best-overall");
    assert_eq!(router["explore_max_extra_ms"], 0.0);
    assert_eq!(router["explore_max_extra_rel"], 0.0);
    assert_eq!(router["predict_computed_prefix"], false);
    assert_eq!(router["affinity_relative_penalty"], 0.0);
    assert_eq!(router["affinity_relative_slack_ms"], 0.0);
    assert_eq!(router["relative_gate_queue_rule"], "off");
    // --set over the environment, over the file's profile.
    assert_eq!(router["affinity_gate_tau"], 0.7);
    assert_eq!(
        dump["models_refresh_interval_ms"], 777,
        "from the environment"
    );
    assert_eq!(router["epsilon_explore_sticky"], 0.01);
    assert_eq!(router["affinity_max_ttft_penalty_ms"], 5000.0);
    assert_eq!(dump["policy"], "affinity-gate");
    assert_eq!(dump["index"], "routed");
    assert_eq!(dump["max_retries"], 1);
    assert_eq!(dump["first_byte_timeout_ms"], 4321);
    assert_eq!(dump["max_concurrent_requests"], 1024);
    assert_eq!(dump["pods"], serde_json::json!([]));

    // A given key over the seed, a pod and a live limit, through the reload.
    write(
        &path,
        "max_retries = 0\npods = [{ url = \"http://127.0.0.1:9\", class = \"h100\" }]\n\
         [router]\ngate_profile = \"seed\"\nexplore_mode = \"random-non-sticky\"\n",
    );
    let dump = wait_for_dump(&c, &admin, "reloaded the seed with explore_mode", |d| {
        d["router"]["explore_mode"] == "random-non-sticky"
    })
    .await;
    assert_eq!(dump["router"]["gate_profile"], "seed");
    assert_eq!(dump["router"]["affinity_relative_penalty"], 0.0);
    assert_eq!(dump["router"]["explore_max_extra_ms"], 0.0);
    assert_eq!(dump["max_retries"], 0);
    assert_eq!(dump["first_byte_timeout_ms"], 4321, "flags still win");
    assert_eq!(
        dump["pods"],
        serde_json::json!([{"url": "http://127.0.0.1:9", "class": "h100", "role": "both", "data_parallel_size": 1}])
    );

    // A bad profile name is rejected: counted, and the config in force stays.
    let errors_before = reload_errors(&c, &admin).await;
    write(&path, "[router]\ngate_profile = \"sead\"\n");
    let deadline = Instant::now() + Duration::from_secs(15);
    while reload_errors(&c, &admin).await == errors_before {
        assert!(Instant::now() < deadline, "the bad file was never rejected");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(config_dump(&c, &admin).await, dump);

    // A truncated file (an editor's truncate-then-write caught half way) is refused too.
    let errors_before = reload_errors(&c, &admin).await;
    write(&path, "");
    let deadline = Instant::now() + Duration::from_secs(15);
    while reload_errors(&c, &admin).await == errors_before {
        assert!(
            Instant::now() < deadline,
            "the empty file was never rejected"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(config_dump(&c, &admin).await, dump);

    // Another profile: the default's gate replaces the seed's; no pods, as asked.
    write(
        &path,
        "allow_empty_pods = true\n[router]\ngate_profile = \"default\"\n",
    );
    let dump = wait_for_dump(&c, &admin, "reloaded the default profile", |d| {
        d["router"]["gate_profile"] == "default"
    })
    .await;
    let router = &dump["router"];
    assert_eq!(router["explore_mode"], "random-non-sticky");
    assert_eq!(router["explore_max_extra_ms"], 25.0);
    assert_eq!(router["explore_max_extra_rel"], 1.0);
    assert_eq!(router["predict_computed_prefix"], true);
    assert_eq!(router["affinity_relative_penalty"], 1.25);
    assert_eq!(router["affinity_relative_slack_ms"], 5.0);
    assert_eq!(router["relative_gate_queue_rule"], "every");
    assert_eq!(dump["max_retries"], 2);
    assert_eq!(dump["allow_empty_pods"], true);
    assert_eq!(dump["pods"], serde_json::json!([]));
    let _ = std::fs::remove_dir_all(&dir);
}
