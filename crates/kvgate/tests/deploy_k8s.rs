//! The manifests in `deploy/k8s/` parse and fit together: every document has apiVersion, kind
//! and a name; the kustomization lists every manifest; the Deployment's arguments are flags
//! `kvgate serve` accepts, and its selector, ports, probes, service account and config match the
//! InferencePool, Service, RBAC and ConfigMap; the ConfigMap's config file is a valid kvgate
//! config. (No cluster here: the API server's own schema validation is not run.)

use clap::Parser;
use kvgate_gateway::ServeArgs;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// The value parsers `serve_cli` uses (`one_of_names` is the other commands').
#[allow(dead_code)]
#[path = "../src/cli_values.rs"]
mod cli_values;
/// The binary's own flag definition (the binary crate has no library to import it from).
#[path = "../src/serve_cli.rs"]
mod serve_cli;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/k8s")
}

/// Every document of every manifest, by kind (kustomization.yaml aside).
fn manifests() -> BTreeMap<String, Vec<Value>> {
    let mut by_kind: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for entry in std::fs::read_dir(dir()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml")
            || path.file_name().and_then(|n| n.to_str()) == Some("kustomization.yaml")
        {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let docs: Vec<Value> = serde_saphyr::from_multiple(&text)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        for doc in docs {
            let kind = doc["kind"]
                .as_str()
                .unwrap_or_else(|| panic!("{}: no kind", path.display()));
            assert!(
                doc["apiVersion"].is_string(),
                "{}: {kind} without apiVersion",
                path.display()
            );
            assert!(
                doc["metadata"]["name"].is_string(),
                "{}: {kind} without metadata.name",
                path.display()
            );
            by_kind.entry(kind.to_string()).or_default().push(doc);
        }
    }
    by_kind
}

fn one<'a>(m: &'a BTreeMap<String, Vec<Value>>, kind: &str) -> &'a Value {
    let docs = m.get(kind).unwrap_or_else(|| panic!("no {kind}"));
    assert_eq!(docs.len(), 1, "one {kind} expected");
    &docs[0]
}

#[derive(Parser)]
struct Serve {
    #[command(flatten)]
    args: serve_cli::ServeCli,
}

#[test]
fn manifests_parse_and_reference_each_other() {
    let m = manifests();
    let kinds: Vec<&str> = m.keys().map(String::as_str).collect();
    assert_eq!(
        kinds,
        [
            "ConfigMap",
            "Deployment",
            "HTTPRoute",
            "InferencePool",
            "Role",
            "RoleBinding",
            "Service",
            "ServiceAccount"
        ]
    );

    // Kustomization: every manifest file, once.
    let kustomization: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(dir().join("kustomization.yaml")).unwrap())
            .unwrap();
    let mut listed: Vec<String> = kustomization["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap().to_string())
        .collect();
    listed.sort();
    let mut files: Vec<String> = std::fs::read_dir(dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".yaml") && n != "kustomization.yaml")
        .collect();
    files.sort();
    assert_eq!(listed, files);

    // The Deployment's arguments are `kvgate serve` flags, as the binary parses them.
    let deployment = one(&m, "Deployment");
    let pod_spec = &deployment["spec"]["template"]["spec"];
    let container = &pod_spec["containers"][0];
    let args: Vec<&str> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(args[0], "serve");
    let serve: ServeArgs = Serve::try_parse_from(args.iter().copied())
        .unwrap_or_else(|e| panic!("deployment args: {e}"))
        .args
        .into();
    assert_eq!(
        serve.discovery,
        Some(kvgate_gateway::discovery::DiscoveryKind::Kubernetes)
    );
    let ext_proc = serve.ext_proc_listen.expect("--ext-proc-listen");
    let admin = serve.admin_listen.expect("--admin-listen");
    assert_eq!(
        deployment["spec"]["selector"]["matchLabels"],
        deployment["spec"]["template"]["metadata"]["labels"]
    );

    // Container ports by name, and the probes on the admin listener.
    let port_of = |name: &str| -> u64 {
        container["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("no container port {name}"))["containerPort"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(port_of("grpc"), u64::from(ext_proc.port()));
    assert_eq!(port_of("admin"), u64::from(admin.port()));
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(container["readinessProbe"]["httpGet"]["port"], "admin");
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert!(container["resources"]["requests"]["cpu"].is_string());
    assert!(container["resources"]["limits"]["memory"].is_string());

    // The config file comes from the ConfigMap, and is a valid kvgate config.
    let config_path = serve.config.clone().expect("--config");
    let mount = container["volumeMounts"][0]["mountPath"].as_str().unwrap();
    assert_eq!(config_path.parent().unwrap(), std::path::Path::new(mount));
    let configmap = one(&m, "ConfigMap");
    assert_eq!(
        pod_spec["volumes"][0]["configMap"]["name"],
        configmap["metadata"]["name"]
    );
    let file_name = config_path.file_name().unwrap().to_str().unwrap();
    let config_text = configmap["data"][file_name]
        .as_str()
        .unwrap_or_else(|| panic!("ConfigMap has no {file_name}"));
    let dir = std::env::temp_dir().join(format!("kvgate-deploy-k8s-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(file_name), config_text).unwrap();
    let config = kvgate_gateway::GatewayConfig::from_args(&ServeArgs {
        config: Some(dir.join(file_name)),
        ..serve.clone()
    })
    .unwrap();
    let target = kvgate_gateway::discovery::kubernetes_target(&config)
        .unwrap()
        .unwrap();

    // RBAC: the Deployment's service account may get/list/watch pods.
    let sa = one(&m, "ServiceAccount")["metadata"]["name"].clone();
    assert_eq!(pod_spec["serviceAccountName"], sa);
    let role = one(&m, "Role");
    let binding = one(&m, "RoleBinding");
    assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"]);
    assert_eq!(binding["roleRef"]["kind"], "Role");
    assert_eq!(binding["subjects"][0]["name"], sa);
    let rule = &role["rules"][0];
    assert_eq!(rule["resources"], serde_json::json!(["pods"]));
    assert_eq!(rule["verbs"], serde_json::json!(["get", "list", "watch"]));

    // The Service selects the Deployment's pods and exposes gRPC and metrics.
    let service = one(&m, "Service");
    assert_eq!(
        service["spec"]["selector"],
        deployment["spec"]["template"]["metadata"]["labels"]
    );
    let service_port = |target: &str| -> u64 {
        service["spec"]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["targetPort"] == target)
            .unwrap_or_else(|| panic!("no service port for {target}"))["port"]
            .as_u64()
            .unwrap()
    };
    let grpc_port = service_port("grpc");
    service_port("admin");

    // The InferencePool: the same pods and port kvgate watches, kvgate as its picker.
    let pool = one(&m, "InferencePool");
    assert_eq!(pool["apiVersion"], "inference.networking.k8s.io/v1");
    let labels = pool["spec"]["selector"]["matchLabels"].as_object().unwrap();
    let selector: Vec<String> = labels
        .iter()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap()))
        .collect();
    assert_eq!(selector.join(","), target.selector);
    assert_eq!(
        pool["spec"]["targetPorts"][0]["number"].as_u64(),
        Some(u64::from(target.target_port))
    );
    let picker = &pool["spec"]["endpointPickerRef"];
    assert_eq!(picker["name"], service["metadata"]["name"]);
    assert_eq!(picker["port"]["number"].as_u64(), Some(grpc_port));

    // The HTTPRoute sends to the pool.
    let route = one(&m, "HTTPRoute");
    let backend = &route["spec"]["rules"][0]["backendRefs"][0];
    assert_eq!(backend["group"], "inference.networking.k8s.io");
    assert_eq!(backend["kind"], "InferencePool");
    assert_eq!(backend["name"], pool["metadata"]["name"]);
}
