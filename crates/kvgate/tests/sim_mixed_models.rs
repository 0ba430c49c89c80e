//! A mixed-model fleet in the simulator: no request is ever served by a pod of another model
//! (checked against the pod layout independently, every attempt, every policy, with outages
//! and retries), the report gives each model's figures, and a fleet of one declared model
//! runs exactly as a fleet with none.

use std::process::Command;
use std::sync::Arc;

use kvgate_core::policy::PolicyKind;
use kvgate_sim::cluster::{self, ClusterConfig};
use kvgate_sim::faults::FaultPlan;
use kvgate_sim::models::{self, FleetModel, ModelFleet};
use kvgate_sim::profiles::Profile;
use kvgate_sim::workload::chat;
use serde_json::Value;

fn kvgate() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kvgate"))
}

fn profile(name: &str) -> &'static Profile {
    Profile::by_name(name).unwrap()
}

#[test]
fn no_attempt_ever_lands_on_a_pod_of_another_model() {
    // Pods 0–1 serve "fast", pods 2–4 "slow" (the layout the specs give, written out here).
    let pod_model = |pod: u32| if pod < 2 { 0 } else { 1 };
    let mut fleet = ModelFleet::new(vec![
        FleetModel {
            name: "fast".into(),
            pods: 2,
            profile: profile("llama3-8b-h100"),
            share: None,
        },
        FleetModel {
            name: "slow".into(),
            pods: 3,
            profile: profile("llama3-8b-a100"),
            share: None,
        },
    ])
    .unwrap();
    let (_, mut requests) = chat::generate(&chat::ChatParams {
        max_requests: 1500,
        ..chat::ChatParams::default()
    })
    .unwrap();
    models::assign(&mut fleet, &mut requests, 5);
    let per_model = fleet.requests_per_model();
    assert!(per_model.iter().all(|&n| n > 300), "{per_model:?}");
    let fleet = Arc::new(fleet);
    for policy in [
        PolicyKind::AffinityGate,
        PolicyKind::RoundRobin,
        PolicyKind::LeastRequest,
        PolicyKind::Random,
    ] {
        for faults in [
            None,
            Some(FaultPlan::parse("every=8,down=3,start=1").unwrap()),
        ] {
            let with_faults = faults.is_some();
            let config = ClusterConfig {
                pod_profiles: fleet.pod_profiles(),
                models: Some(fleet.clone()),
                record_routes: true,
                rate_scale: 4.0,
                faults,
                ..ClusterConfig::new(5, policy, 3)
            };
            let m = cluster::run(&config, &requests);
            assert!(
                m.routes.len() >= 1500,
                "{policy:?}: {} routes",
                m.routes.len()
            );
            for route in &m.routes {
                assert_eq!(
                    pod_model(route.pod),
                    fleet.request_model(route.request),
                    "{policy:?} (faults {with_faults}): request {} on pod {}",
                    route.request,
                    route.pod
                );
            }
            assert_eq!(m.models.len(), 2);
            assert_eq!(
                m.models.iter().map(|x| x.completed).sum::<u64>(),
                m.completed
            );
            assert!(m.models.iter().all(|x| x.served_by_other_model == 0));
            assert_eq!(
                (m.models[0].requests, m.models[1].requests),
                (per_model[0], per_model[1])
            );
            if !with_faults {
                assert_eq!(m.completed, 1500, "{policy:?}");
            }
        }
    }
}

fn sim_json(args: &[&str], name: &str) -> (String, Value) {
    let dir = std::env::temp_dir().join(format!("kvgate-sim-models-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join(format!("{name}.json"));
    let out = kvgate()
        .args([
            "sim",
            "--workload",
            "chat",
            "--max-requests",
            "600",
            "--quiet",
        ])
        .args(args)
        .arg("--json")
        .arg(&json)
        .output()
        .expect("run kvgate sim");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    (stdout, report)
}

#[test]
fn the_cli_reports_each_models_ttft_and_the_slower_model_is_slower() {
    let (stdout, report) = sim_json(
        &[
            "--fleet-model",
            "small:3",
            "--fleet-model",
            "big:3:llama3-70b-h100-tp4",
            "--seed",
            "1,2",
            "--rate-scale",
            "2",
        ],
        "mixed",
    );
    assert!(
        stdout.contains("6 pods × 3 × llama3-8b-h100 (small) + 3 × llama3-70b-h100-tp4 (big)"),
        "{stdout}"
    );
    assert!(stdout.contains("ttft_p99   hit% other"), "{stdout}");
    let fleet = report["fleet_models"].as_array().unwrap();
    assert_eq!(fleet.len(), 2);
    assert_eq!(fleet[1]["profile"], "llama3-70b-h100-tp4");
    assert_eq!(fleet[0]["share"], 0.5);
    let n = |v: &Value| v.as_u64().unwrap();
    assert_eq!(n(&fleet[0]["requests"]) + n(&fleet[1]["requests"]), 600);
    let runs = report["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    for run in runs {
        let models = run["models"].as_array().unwrap();
        assert_eq!(models.len(), 2);
        assert_eq!(models[0]["model"], "small");
        assert_eq!(n(&models[0]["completed"]) + n(&models[1]["completed"]), 600);
        for (m, f) in models.iter().zip(fleet) {
            assert_eq!(m["requests"], f["requests"]);
            assert_eq!(n(&m["served_by_other_model"]), 0);
            let t = &m["ttft_ms"];
            let p = |k: &str| t[k].as_f64().unwrap();
            assert!(
                0.0 < p("p50") && p("p50") <= p("p90") && p("p90") <= p("p99"),
                "{t}"
            );
            assert!(p("mean") > 0.0);
            // The table has the same figures in a row of its own.
            let row = format!(
                "{} {} {} {:.1}",
                m["model"].as_str().unwrap(),
                m["pods"],
                m["completed"],
                p("mean")
            );
            let squeezed = |l: &str| l.split_whitespace().collect::<Vec<_>>().join(" ");
            assert!(
                stdout.lines().any(|l| squeezed(l).contains(&row)),
                "no row {row:?} in\n{stdout}"
            );
        }
        // The 70B profile's prefill costs 4.4× the 8B's per token: its TTFT is well above.
        let mean = |i: usize| models[i]["ttft_ms"]["mean"].as_f64().unwrap();
        assert!(mean(1) > 2.0 * mean(0), "{} vs {}", mean(1), mean(0));
    }
}

/// The JSON runs without the wall time (the only field that differs between two runs).
fn runs_without_wall_time(report: &Value) -> Vec<Value> {
    report["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let mut r = r.clone();
            r.as_object_mut().unwrap().remove("sim_wall_s");
            r
        })
        .collect()
}

#[test]
fn one_declared_model_runs_exactly_as_a_fleet_without_models() {
    let (_, plain) = sim_json(&["--pods", "4", "--rate-scale", "4"], "plain");
    let (stdout, one) = sim_json(&["--fleet-model", "only:4", "--rate-scale", "4"], "one");
    assert_eq!(runs_without_wall_time(&plain), runs_without_wall_time(&one));
    assert!(
        one["runs"][0].get("models").is_none(),
        "no per-model table for one model"
    );
    assert!(!stdout.contains("other"), "{stdout}");
}

#[test]
fn bad_fleet_model_specs_are_refused_before_anything_runs() {
    for (args, says) in [
        (vec!["--fleet-model", "a:0"], "pod count"),
        (
            vec!["--fleet-model", "a:2", "--fleet-model", "a:2"],
            "given twice",
        ),
        (
            vec!["--fleet-model", "a:2:share=1", "--fleet-model", "b:2"],
            "share= for every model",
        ),
        (vec!["--fleet-model", "a:2:nope"], "unknown profile"),
    ] {
        let out = kvgate()
            .args([
                "sim",
                "--workload",
                "chat",
                "--max-requests",
                "10",
                "--quiet",
            ])
            .args(&args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}
