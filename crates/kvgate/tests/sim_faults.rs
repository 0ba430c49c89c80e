//! `kvgate sim --faults` as a user runs it: the table names the outcomes, the JSON accounts for
//! every request, and a malformed spec is refused before anything runs.

use std::process::Command;

fn kvgate() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kvgate"))
}

#[test]
fn sim_with_faults_reports_every_request_and_the_recovery_phases() {
    let dir = std::env::temp_dir().join(format!("kvgate-sim-faults-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("out.json");
    let out = kvgate()
        .args([
            "sim",
            "--workload",
            "chat",
            "--max-requests",
            "400",
            "--pods",
            "3",
            "--rate-scale",
            "4",
            "--policy",
            "affinity-gate,least-request",
            "--faults",
            "every=10,down=3,start=2",
            "--quiet",
            "--json",
        ])
        .arg(&json)
        .output()
        .expect("run kvgate sim");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("faults: affinity-gate"), "{stdout}");
    assert!(stdout.contains("a pod is down"), "{stdout}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let runs = report["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    for run in runs {
        let n = |v: &serde_json::Value| v.as_u64().unwrap();
        let f = &run["faults"];
        assert!(!f["outages"].as_array().unwrap().is_empty());
        let failed = n(&f["failed_mid_stream"]) + n(&f["failed_no_retry"]);
        assert_eq!(
            n(&run["completed"]) + n(&run["rejected"]) + failed,
            n(&run["requests"]),
            "{}",
            run["policy"]
        );
        assert_eq!(n(&run["requests"]), 400);
        assert_eq!(n(&run["in_flight_left"]), 0);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sim_refuses_a_malformed_fault_spec_naming_it() {
    let out = kvgate()
        .args([
            "sim",
            "--workload",
            "chat",
            "--max-requests",
            "10",
            "--faults",
            "2@9-1",
        ])
        .output()
        .expect("run kvgate sim");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("2@9-1"), "{stderr}");
}
