//! Options removed on 2026-12-07 (docs/decisions/: they helped nowhere), as a user who still sets
//! them meets them: the command fails before anything runs, and its message names the key or
//! value, says it was removed, and says what to use instead (`predictor_model` naming `rls`, the
//! one model left, is accepted).

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

#[test]
fn sim_refuses_the_removed_drift_adaptation_flag_and_key() {
    let base = [
        "sim",
        "--workload",
        "chat",
        "--max-requests",
        "10",
        "--quiet",
    ];
    let err = failure_message(&kvgate(&[&base[..], &["--drift-adaptation"]].concat()));
    assert!(
        err.contains("--drift-adaptation was removed on 2026-12-07"),
        "{err}"
    );
    assert!(err.contains("predictor-drift-adaptation.md"), "{err}");
    let on = r#"{"predictorDriftAdaptation":true}"#;
    let err = failure_message(&kvgate(&[&base[..], &["--router-config", on]].concat()));
    assert!(
        err.contains("predictor_drift_adaptation was removed on 2026-12-07"),
        "{err}"
    );
    // Off, both profiles' value, is accepted.
    let off = r#"{"predictor_drift_adaptation":false}"#;
    let out = kvgate(&[&base[..], &["--router-config", off]].concat());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
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

#[test]
fn serve_refuses_a_config_file_with_a_removed_key_before_it_listens() {
    let dir = std::env::temp_dir().join(format!("kvgate-removed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("kvgate.toml");
    std::fs::write(&path, "[router]\npredictor_model = \"gbdt-p90\"\n").unwrap();
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
    let err = failure_message(&child.wait_with_output().unwrap());
    assert!(
        err.contains("predictor_model was removed on 2026-12-07"),
        "{err}"
    );
    assert!(err.contains("leave the key out"), "{err}");
}
