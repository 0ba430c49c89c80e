//! `--discovery kubernetes --selector KEY=VALUE [--namespace NS] [--target-port PORT]`: the pod
//! table follows the model-server Pods of a Kubernetes namespace.
//!
//! Algorithm: a kube-rs [`watcher`] on `Pod` objects with the label selector (list, then watch
//! from the list's `resourceVersion`; on a watch error or an expired version it lists again,
//! with kube's default backoff: 800 ms doubling to 30 s, jittered). Each event updates
//! [`DiscoveredPods`], the set of *ready* Pods:
//!
//! - a Pod is ready when it is not being deleted (`metadata.deletionTimestamp` unset), its
//!   `status.phase` is `Running`, its `Ready` condition is `True` and it has a `status.podIP`;
//!   its entry is `http://POD_IP:TARGET_PORT` (`[IP]` for IPv6), class `default`, and the P/D
//!   role its label [`ROLE_LABEL`] (`llm-d.ai/role`, as llm-d's P/D deployments label pods)
//!   says: `prefill`, `decode` or `both`; no label is `both`, an unknown value is `both` with a
//!   warning; a vLLM data-parallel server's Pod annotated [`DATA_PARALLEL_ANNOTATION`]
//!   (`kvgate.io/data-parallel-size: "N"`) is routed as N engines (no annotation or an invalid
//!   value: one, with a warning for the latter); a Pod annotated [`MODEL_ANNOTATION`]
//!   (`kvgate.io/model: NAME`) declares the model it serves until its `/v1/models` is learnt;
//! - `ADDED`/`MODIFIED` of a ready Pod adds or updates it; of a Pod that is not ready removes it;
//!   `DELETED` removes it;
//! - a re-list (`Init` … `InitApply`* … `InitDone`) replaces the whole set at `InitDone`, so Pods
//!   deleted while the watch was down go away too.
//!
//! When the set changes, [`crate::state::Shared::set_discovered`] makes the pod table the
//! configured pods plus the discovered ones — the same table update a config reload does: a new
//! Pod gets the smallest free pod id and a scrape loop (it is routed to once its first scrape
//! succeeds), a gone Pod's index entries are dropped. Watch errors are counted in
//! `kvgate_discovery_errors_total` and logged (warn); `kvgate_discovered_pods` is the set's size.
//!
//! Parameters: `--selector` (required), `--namespace` (default: the kubeconfig context's
//! namespace, or the service account's in a cluster), `--target-port` (default 8000, vLLM's).
//! Discovered pods have no KV-event endpoints (the routed index serves them).
//! RBAC: `get`, `list`, `watch` on `pods` in the namespace (`deploy/k8s/rbac.yaml`).
//!
//! Bounds: one entry per matching Pod (two while a re-list is buffered); the pod table holds at
//! most [`crate::pods::MAX_PODS`].

use super::KubernetesTarget;
use crate::config::DEFAULT_POD_CLASS;
use crate::pods::PodEntry;
use crate::state::Shared;
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod as KubePod;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event, watcher};
use kube::{Api, Client};
use kvgate_core::PodRole;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

/// The kube crate, for callers that build their own [`Client`] (tests against a fake API
/// server use `kube::Config::new(url)`).
pub use kube;

/// Watches the target's Pods until the task is aborted, keeping the pod table in sync.
pub async fn run(shared: Arc<Shared>, client: Client, target: KubernetesTarget) {
    let namespace = target
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_string());
    tracing::info!(
        %namespace,
        selector = %target.selector,
        port = target.target_port,
        "kubernetes discovery: watching pods"
    );
    let api: Api<KubePod> = Api::namespaced(client, &namespace);
    let config = watcher::Config::default().labels(&target.selector);
    let mut events = watcher(api, config).default_backoff().boxed();
    let mut pods = DiscoveredPods::default();
    while let Some(event) = events.next().await {
        match event {
            Ok(event) => {
                if pods.apply(&event, target.target_port) {
                    publish(&shared, &pods);
                }
            }
            Err(e) => {
                shared.telemetry.metrics.discovery_errors.inc();
                tracing::warn!(error = %e, %namespace, "kubernetes discovery: watch error; retrying");
            }
        }
    }
}

/// Puts the discovered set into the pod table and starts the new pods' scrape loops.
fn publish(shared: &Arc<Shared>, pods: &DiscoveredPods) {
    let wanted = pods.entries();
    shared
        .telemetry
        .metrics
        .discovered_pods
        .set(i64::try_from(wanted.len()).unwrap_or(i64::MAX));
    tracing::info!(
        pods = wanted.len(),
        "kubernetes discovery: ready pods changed"
    );
    for pod in shared.set_discovered(wanted) {
        crate::reload::start_pod(shared, pod);
    }
}

/// The ready Pods the watcher has seen: `namespace/name` → base URL.
#[derive(Debug, Default)]
pub struct DiscoveredPods {
    ready: BTreeMap<String, Discovered>,
    /// The set being rebuilt by a re-list (between `Init` and `InitDone`).
    relist: Option<BTreeMap<String, Discovered>>,
}

/// A ready Pod: its URL, P/D role, data-parallel size and declared model.
type Discovered = (String, PodRole, u32, Option<String>);

/// The Pod annotation that declares the model it serves (as `model` does for a configured pod:
/// used until its `/v1/models` is learnt, [`crate::served_models`]). An annotation, not a label:
/// model names such as `meta-llama/Llama-3.1-8B` are not valid label values.
pub const MODEL_ANNOTATION: &str = "kvgate.io/model";

/// Longest model name read from [`MODEL_ANNOTATION`].
const MAX_MODEL_NAME_CHARS: usize = 256;

/// The Pod's declared model from [`MODEL_ANNOTATION`]: `None` without it, and (with a warning)
/// for an empty or over-long value.
pub fn pod_model(pod: &KubePod) -> Option<String> {
    let value = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(MODEL_ANNOTATION))?
        .trim();
    if value.is_empty() || value.chars().count() > MAX_MODEL_NAME_CHARS {
        let value: String = value.chars().take(64).collect();
        tracing::warn!(pod = %key(pod), annotation = MODEL_ANNOTATION, %value, "invalid model name; the pod's models are learnt from its /v1/models only");
        return None;
    }
    Some(value.to_string())
}

/// The Pod label that carries its P/D role (`prefill`, `decode`, `both`).
pub const ROLE_LABEL: &str = "llm-d.ai/role";

/// The Pod's P/D role from [`ROLE_LABEL`]: `both` without the label, and (with a warning) for
/// a value that is not a role.
pub fn pod_role(pod: &KubePod) -> PodRole {
    let Some(value) = pod.metadata.labels.as_ref().and_then(|l| l.get(ROLE_LABEL)) else {
        return PodRole::Both;
    };
    PodRole::from_name(value).unwrap_or_else(|| {
        let value: String = value.chars().take(64).collect();
        tracing::warn!(pod = %key(pod), label = ROLE_LABEL, %value, "unknown P/D role; the pod serves as `both`");
        PodRole::Both
    })
}

/// The Pod annotation that declares a vLLM data-parallel server's engine count (its
/// `--data-parallel-size`): the Pod is routed as that many engines `URL#dp<rank>`.
pub const DATA_PARALLEL_ANNOTATION: &str = "kvgate.io/data-parallel-size";

/// The Pod's data-parallel size from [`DATA_PARALLEL_ANNOTATION`]: 1 without it, and (with a
/// warning) for a value that is not 1..=`MAX_DATA_PARALLEL_SIZE`.
pub fn data_parallel_size(pod: &KubePod) -> u32 {
    let Some(value) = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(DATA_PARALLEL_ANNOTATION))
    else {
        return 1;
    };
    match value.trim().parse::<u32>() {
        Ok(n) if (1..=crate::pods::MAX_DATA_PARALLEL_SIZE).contains(&n) => n,
        _ => {
            let value: String = value.chars().take(64).collect();
            tracing::warn!(pod = %key(pod), annotation = DATA_PARALLEL_ANNOTATION, %value, "invalid data-parallel size; the pod is routed as one engine");
            1
        }
    }
}

impl DiscoveredPods {
    /// Applies one watcher event; true when the set of ready pods changed.
    pub fn apply(&mut self, event: &Event<KubePod>, target_port: u16) -> bool {
        match event {
            Event::Init => {
                self.relist = Some(BTreeMap::new());
                false
            }
            Event::InitApply(pod) => match &mut self.relist {
                Some(relist) => {
                    if let Some(url) = pod_url(pod, target_port) {
                        let entry = (url, pod_role(pod), data_parallel_size(pod), pod_model(pod));
                        relist.insert(key(pod), entry);
                    }
                    false
                }
                None => self.upsert(pod, target_port),
            },
            Event::InitDone => {
                let listed = self.relist.take().unwrap_or_default();
                let changed = listed != self.ready;
                self.ready = listed;
                changed
            }
            Event::Apply(pod) => self.upsert(pod, target_port),
            Event::Delete(pod) => self.ready.remove(&key(pod)).is_some(),
        }
    }

    fn upsert(&mut self, pod: &KubePod, target_port: u16) -> bool {
        match pod_url(pod, target_port) {
            Some(url) => {
                let entry = (url, pod_role(pod), data_parallel_size(pod), pod_model(pod));
                self.ready.insert(key(pod), entry.clone()).as_ref() != Some(&entry)
            }
            None => self.ready.remove(&key(pod)).is_some(),
        }
    }

    /// The ready pods' base URLs, sorted, without duplicates.
    pub fn urls(&self) -> Vec<String> {
        let mut urls: Vec<String> = self.ready.values().map(|(u, ..)| u.clone()).collect();
        urls.sort();
        urls.dedup();
        urls
    }

    /// The ready pods as pod-table entries (class `default`, their role), sorted by URL,
    /// one per URL.
    pub fn entries(&self) -> Vec<PodEntry> {
        let mut entries: Vec<PodEntry> = self
            .ready
            .values()
            .map(|(u, r, dp, model)| {
                PodEntry::new(u.clone(), DEFAULT_POD_CLASS)
                    .with_role(*r)
                    .with_data_parallel_size(*dp)
                    .with_model(model.clone())
            })
            .collect();
        entries.sort_by(|a, b| a.url.cmp(&b.url));
        entries.dedup_by(|a, b| a.url == b.url);
        entries
    }
}

fn key(pod: &KubePod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or(""),
        pod.metadata.name.as_deref().unwrap_or("")
    )
}

/// `http://POD_IP:PORT` when the Pod can take traffic (see the module doc), else None.
pub fn pod_url(pod: &KubePod, target_port: u16) -> Option<String> {
    if pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let status = pod.status.as_ref()?;
    if status.phase.as_deref() != Some("Running") {
        return None;
    }
    let ready = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    if !ready {
        return None;
    }
    match status.pod_ip.as_deref()?.parse::<IpAddr>().ok()? {
        IpAddr::V4(ip) => Some(format!("http://{ip}:{target_port}")),
        IpAddr::V6(ip) => Some(format!("http://[{ip}]:{target_port}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodCondition, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    fn pod(name: &str, ip: Option<&str>, phase: &str, ready: bool) -> KubePod {
        KubePod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("llm".into()),
                ..Default::default()
            },
            spec: None,
            status: Some(PodStatus {
                phase: Some(phase.into()),
                pod_ip: ip.map(str::to_string),
                conditions: Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: if ready { "True" } else { "False" }.into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn only_running_ready_pods_with_an_ip_get_a_url() {
        assert_eq!(
            pod_url(&pod("a", Some("10.0.0.5"), "Running", true), 8000).as_deref(),
            Some("http://10.0.0.5:8000")
        );
        assert_eq!(
            pod_url(&pod("a", Some("fd00::5"), "Running", true), 8000).as_deref(),
            Some("http://[fd00::5]:8000")
        );
        assert_eq!(
            pod_url(&pod("a", Some("10.0.0.5"), "Running", false), 8000),
            None
        );
        assert_eq!(
            pod_url(&pod("a", Some("10.0.0.5"), "Pending", true), 8000),
            None
        );
        assert_eq!(pod_url(&pod("a", None, "Running", true), 8000), None);
        assert_eq!(
            pod_url(&pod("a", Some("not-an-ip"), "Running", true), 8000),
            None
        );
        let mut deleting = pod("a", Some("10.0.0.5"), "Running", true);
        deleting.metadata.deletion_timestamp = Some(Time(Default::default()));
        assert_eq!(pod_url(&deleting, 8000), None);
        assert_eq!(pod_url(&KubePod::default(), 8000), None);
    }

    #[test]
    fn events_add_update_and_remove_pods() {
        let mut d = DiscoveredPods::default();
        let a = pod("a", Some("10.0.0.1"), "Running", true);
        assert!(d.apply(&Event::Apply(a.clone()), 8000));
        assert!(
            !d.apply(&Event::Apply(a.clone()), 8000),
            "same pod again: no change"
        );
        assert!(d.apply(
            &Event::Apply(pod("b", Some("10.0.0.2"), "Running", true)),
            8000
        ));
        assert_eq!(d.urls(), ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]);
        // a turns not ready, b is deleted.
        assert!(d.apply(
            &Event::Apply(pod("a", Some("10.0.0.1"), "Running", false)),
            8000
        ));
        assert!(d.apply(&Event::Delete(pod("b", None, "Running", true)), 8000));
        assert!(d.urls().is_empty());
        assert!(!d.apply(&Event::Delete(pod("b", None, "Running", true)), 8000));
    }

    #[test]
    fn the_role_label_sets_a_discovered_pods_role() {
        let mut d = DiscoveredPods::default();
        let labelled = |name: &str, ip: &str, role: &str| {
            let mut p = pod(name, Some(ip), "Running", true);
            p.metadata.labels = Some([(ROLE_LABEL.to_string(), role.to_string())].into());
            p
        };
        d.apply(&Event::Apply(labelled("a", "10.0.0.1", "prefill")), 8000);
        d.apply(&Event::Apply(labelled("b", "10.0.0.2", "decode")), 8000);
        d.apply(&Event::Apply(labelled("c", "10.0.0.3", "nonsense")), 8000);
        d.apply(
            &Event::Apply(pod("d", Some("10.0.0.4"), "Running", true)),
            8000,
        );
        let roles: Vec<PodRole> = d.entries().iter().map(|e| e.role).collect();
        assert_eq!(
            roles,
            [
                PodRole::Prefill,
                PodRole::Decode,
                PodRole::Both,
                PodRole::Both
            ]
        );
        // A role change alone is a change.
        assert!(d.apply(&Event::Apply(labelled("a", "10.0.0.1", "decode")), 8000));
    }

    #[test]
    fn the_data_parallel_annotation_makes_a_pod_n_engines() {
        let mut d = DiscoveredPods::default();
        let annotated = |name: &str, ip: &str, dp: &str| {
            let mut p = pod(name, Some(ip), "Running", true);
            p.metadata.annotations =
                Some([(DATA_PARALLEL_ANNOTATION.to_string(), dp.to_string())].into());
            p
        };
        d.apply(&Event::Apply(annotated("a", "10.0.0.1", "4")), 8000);
        d.apply(&Event::Apply(annotated("b", "10.0.0.2", "zero")), 8000);
        d.apply(&Event::Apply(annotated("c", "10.0.0.3", "0")), 8000);
        d.apply(
            &Event::Apply(pod("d", Some("10.0.0.4"), "Running", true)),
            8000,
        );
        let sizes: Vec<u32> = d.entries().iter().map(|e| e.data_parallel_size).collect();
        assert_eq!(sizes, [4, 1, 1, 1]);
        // A size change alone is a change.
        assert!(d.apply(&Event::Apply(annotated("a", "10.0.0.1", "2")), 8000));
    }

    #[test]
    fn the_model_annotation_declares_a_pods_model() {
        let mut d = DiscoveredPods::default();
        let annotated = |name: &str, ip: &str, model: &str| {
            let mut p = pod(name, Some(ip), "Running", true);
            p.metadata.annotations =
                Some([(MODEL_ANNOTATION.to_string(), model.to_string())].into());
            p
        };
        d.apply(
            &Event::Apply(annotated("a", "10.0.0.1", "org/model-a")),
            8000,
        );
        d.apply(&Event::Apply(annotated("b", "10.0.0.2", " ")), 8000);
        d.apply(
            &Event::Apply(annotated("c", "10.0.0.3", &"m".repeat(300))),
            8000,
        );
        d.apply(
            &Event::Apply(pod("d", Some("10.0.0.4"), "Running", true)),
            8000,
        );
        let models: Vec<Option<String>> = d.entries().iter().map(|e| e.model.clone()).collect();
        assert_eq!(models, [Some("org/model-a".to_string()), None, None, None]);
        // A model change alone is a change.
        assert!(d.apply(
            &Event::Apply(annotated("a", "10.0.0.1", "org/model-b")),
            8000
        ));
    }

    #[test]
    fn a_relist_replaces_the_set_at_init_done() {
        let mut d = DiscoveredPods::default();
        d.apply(
            &Event::Apply(pod("a", Some("10.0.0.1"), "Running", true)),
            8000,
        );
        assert!(!d.apply(&Event::Init, 8000));
        assert!(!d.apply(
            &Event::InitApply(pod("c", Some("10.0.0.3"), "Running", true)),
            8000
        ));
        assert!(!d.apply(
            &Event::InitApply(pod("d", Some("10.0.0.4"), "Running", false)),
            8000
        ));
        assert_eq!(
            d.urls(),
            ["http://10.0.0.1:8000"],
            "unchanged until InitDone"
        );
        assert!(d.apply(&Event::InitDone, 8000));
        assert_eq!(d.urls(), ["http://10.0.0.3:8000"]);
        // The same list again changes nothing.
        d.apply(&Event::Init, 8000);
        d.apply(
            &Event::InitApply(pod("c", Some("10.0.0.3"), "Running", true)),
            8000,
        );
        assert!(!d.apply(&Event::InitDone, 8000));
    }
}
