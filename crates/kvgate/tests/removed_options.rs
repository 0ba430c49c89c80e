//! Options removed on 2026-12-07 (docs/decisions/: they helped nowhere), as a user who still sets
//! them meets them: the command fails before anything runs, and its message names the key or
//! value, says it was removed, and says what to use instead (`predictor_model` naming `rls`, the
//! one model left, is accepted; so are session affinity's keys at their old defaults).

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn kvgate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvgate"))
        .args(args)
        .output()
        .expect("run kvgate")
}

fn failure_message(out: &Output) -> String {
    assert!(
        !out.status.success(),
        "expected a failure: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn sim_refuses_the_removed_predictor_model_flag_saying_what_to_do() {
    let err = failure_message(&kvgate(&[
        "sim",
        "--workload",
        "chat",
        "--max-requests",
        "10",
        "--predictor-model",
        "gbdt",
        "--quiet",
    ]));
    assert!(
        err.contains("--predictor-model gbdt was removed on 2026-12-07"),
        "{err}"
    );
    assert!(err.contains("drop the flag"), "{err}");
}

/// A removed sim flag and router key, as a user who still sets them meets them: `flag` is
/// refused naming `record`; the key set `on` (camelCase) is refused naming `key`; the key set
/// to its old default `off` is accepted. `extra`: flags the run needs besides.
fn sim_refuses_flag_and_key(
    extra: &[&str],
    flag: &str,
    record: &str,
    key: &str,
    on: &str,
    off: &str,
) {
    let base = [
        &[
            "sim",
            "--workload",
            "chat",
            "--max-requests",
            "10",
            "--quiet",
        ][..],
        extra,
    ]
    .concat();
    let err = failure_message(&kvgate(&[&base[..], &[flag]].concat()));
    assert!(
        err.contains(&format!("{flag} was removed on 2026-12-07")),
        "{err}"
    );
    assert!(err.contains(record), "{err}");
    let err = failure_message(&kvgate(&[&base[..], &["--router-config", on]].concat()));
    assert!(
        err.contains(&format!("{key} was removed on 2026-12-07")),
        "{err}"
    );
    let out = kvgate(&[&base[..], &["--router-config", off]].concat());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn sim_refuses_the_removed_drift_adaptation_flag_and_key() {
    sim_refuses_flag_and_key(
        &[],
        "--drift-adaptation",
        "predictor-drift-adaptation.md",
        "predictor_drift_adaptation",
        r#"{"predictorDriftAdaptation":true}"#,
        r#"{"predictor_drift_adaptation":false}"#,
    );
}

#[test]
fn sim_refuses_the_removed_slo_routing_flag_and_key() {
    // The objectives themselves still measure goodput.
    sim_refuses_flag_and_key(
        &["--slo-ttft-ms", "500"],
        "--slo-routing",
        "slo-routing.md",
        "slo_routing",
        r#"{"sloRouting":true}"#,
        r#"{"slo_routing":false}"#,
    );
}

#[test]
fn sim_accepts_the_removed_predictor_model_flag_when_it_names_rls() {
    let out = kvgate(&[
        "sim",
        "--workload",
        "chat",
        "--max-requests",
        "10",
        "--predictor-model",
        "rls",
        "--quiet",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn sim_refuses_a_removed_value_in_its_router_config() {
    let err = failure_message(&kvgate(&[
        "sim",
        "--workload",
        "chat",
        "--max-requests",
        "10",
        "--router-config",
        r#"{"epsilon_explore_sticky": "auto"}"#,
        "--quiet",
    ]));
    assert!(
        err.contains("epsilon_explore_sticky = \"auto\" was removed on 2026-12-07"),
        "{err}"
    );
    assert!(err.contains("0.01, the default"), "{err}");
}

/// `kvgate serve` with `file` as its config (named `name`) and `extra` arguments: the message it
/// fails with before it listens (a panic if it starts).
fn serve_failure(name: &str, file: &str, extra: &[&str]) -> String {
    let dir = std::env::temp_dir().join(format!("kvgate-removed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, file).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvgate"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ])
        .arg("--config")
        .arg(&path)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run kvgate serve");
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!("kvgate serve started with a removed key");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    failure_message(&child.wait_with_output().unwrap())
}

#[test]
fn serve_refuses_a_config_file_with_a_removed_key_before_it_listens() {
    let err = serve_failure(
        "kvgate.toml",
        "[router]\npredictor_model = \"gbdt-p90\"\n",
        &[],
    );
    assert!(
        err.contains("predictor_model was removed on 2026-12-07"),
        "{err}"
    );
    assert!(err.contains("leave the key out"), "{err}");
}

#[test]
fn serve_refuses_session_affinity_in_the_file_and_in_set_naming_its_record() {
    let pod = "pods = [\"http://127.0.0.1:9\"]\n";
    for (name, file, extra, key) in [
        (
            "ttl.toml",
            format!(
                "{pod}[router]\nexperimental_options = true\nsession_affinity_ttl_ms = 600000\n"
            ),
            vec![],
            "session_affinity_ttl_ms",
        ),
        (
            "ttl.yaml",
            "pods: [\"http://127.0.0.1:9\"]\nrouter:\n  sessionAffinityTtlMs: 1000\n".to_string(),
            vec![],
            "session_affinity_ttl_ms",
        ),
        (
            "floor.toml",
            format!("{pod}[router]\nsession_affinity_floor = 0.5\n"),
            vec![],
            "session_affinity_floor",
        ),
        (
            "headers.toml",
            format!("session_headers = [\"x-agent-run\"]\n{pod}"),
            vec![],
            "session_headers",
        ),
        (
            "set.toml",
            pod.to_string(),
            vec!["--set", "router.sessionAffinityTtlMs=600000"],
            "session_affinity_ttl_ms",
        ),
    ] {
        let err = serve_failure(name, &file, &extra);
        assert!(
            err.contains(&format!("{key} was removed on 2026-12-07")),
            "{name}: {err}"
        );
        assert!(err.contains("docs/decisions/session-affinity.md"), "{err}");
        assert!(err.contains("leave the key out"), "{err}");
    }
}

#[test]
fn sim_refuses_session_affinity_and_accepts_its_old_defaults() {
    let base = [
        "sim",
        "--workload",
        "agent",
        "--agent-compact-every",
        "3",
        "--max-requests",
        "10",
        "--quiet",
    ];
    for on in [
        r#"{"session_affinity_ttl_ms":600000,"experimental_options":true}"#,
        r#"{"sessionAffinityTtlMs":1}"#,
    ] {
        let err = failure_message(&kvgate(&[&base[..], &["--router-config", on]].concat()));
        assert!(
            err.contains("session_affinity_ttl_ms was removed on 2026-12-07"),
            "{err}"
        );
        assert!(err.contains("session-affinity.md"), "{err}");
    }
    let off = r#"{"session_affinity_ttl_ms":0,"sessionAffinityFloor":0.9}"#;
    let out = kvgate(&[&base[..], &["--router-config", off]].concat());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
