//! Runs every case under `tests/decide/` through the real `kvgate decide` binary.
//!
//! `NAME.json` is the input. `NAME.expected.json` holds the exact expected decision (compared as
//! JSON values); `NAME.expected-error.txt` holds a text the error message must contain, and the
//! command must exit non-zero.

use std::path::{Path, PathBuf};
use std::process::Command;

fn cases_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/decide")
}

/// JSON with every number as f64, so `100` and `100.0` compare equal.
fn numbers_as_f64(v: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match v {
        Value::Number(n) => n
            .as_f64()
            .and_then(serde_json::Number::from_f64)
            .map_or(Value::Null, Value::Number),
        Value::Array(a) => Value::Array(a.into_iter().map(numbers_as_f64).collect()),
        Value::Object(o) => {
            Value::Object(o.into_iter().map(|(k, v)| (k, numbers_as_f64(v))).collect())
        }
        other => other,
    }
}

fn decide(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kvgate"))
        .arg("decide")
        .args(args)
        .output()
        .expect("run kvgate")
}

#[test]
fn every_decide_case_gives_its_expected_output() {
    let mut inputs: Vec<_> = std::fs::read_dir(cases_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            name.ends_with(".json") && !name.ends_with(".expected.json")
        })
        .collect();
    inputs.sort();
    assert!(
        inputs.len() >= 10,
        "expected the case files, found {}",
        inputs.len()
    );
    let mut failures = Vec::new();
    for input in &inputs {
        let stem = input.file_stem().unwrap().to_string_lossy().to_string();
        let out = decide(&["--input", input.to_str().unwrap()]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let expected_json = cases_dir().join(format!("{stem}.expected.json"));
        let expected_err = cases_dir().join(format!("{stem}.expected-error.txt"));
        if expected_json.exists() {
            let want: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&expected_json).unwrap()).unwrap();
            let want = numbers_as_f64(want);
            match serde_json::from_str::<serde_json::Value>(&stdout).map(numbers_as_f64) {
                Ok(got) if out.status.success() && got == want => {}
                Ok(got) => failures.push(format!("{stem}: got {got}\n  want {want}\n  {stderr}")),
                Err(e) => failures.push(format!(
                    "{stem}: output is not JSON ({e}): {stdout} {stderr}"
                )),
            }
        } else if expected_err.exists() {
            let want = std::fs::read_to_string(&expected_err).unwrap();
            if out.status.success() || !stderr.contains(want.trim()) {
                failures.push(format!(
                    "{stem}: expected failure containing {:?}, got status {} stderr {stderr}",
                    want.trim(),
                    out.status
                ));
            }
        } else {
            failures.push(format!("{stem}: no expected output file"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn repeat_counts_picks_and_branches_over_consecutive_seeds() {
    let input = cases_dir().join("explore_with_epsilon_one_takes_best_overall.json");
    let out = decide(&["--input", input.to_str().unwrap(), "--repeat", "50"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(got["runs"], 50);
    assert_eq!(got["picks"], serde_json::json!({"b": 50}));
    assert_eq!(got["branches"], serde_json::json!({"explore": 50}));
}

#[test]
fn reads_the_case_from_stdin() {
    use std::io::Write;
    let case = std::fs::read(cases_dir().join("single_pod.json")).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvgate"))
        .args(["decide", "--input", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(&case).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(got["pod"], "only");
}

#[test]
fn malformed_case_json_fails_cleanly() {
    let dir = std::env::temp_dir().join(format!("kvgate-decide-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bad.json");
    std::fs::write(&path, b"{\"policy\": \"affinity-gate\", \"pods\": [").unwrap();
    let out = decide(&["--input", path.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid case JSON"));
}
