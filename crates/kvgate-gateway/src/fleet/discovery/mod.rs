//! `--discovery`: where pods come from besides `--pod` and the config file.
//!
//! - `static` (default): only those.
//! - `kubernetes` (cargo feature `k8s`): [`kubernetes`] watches the ready Pods that match
//!   `--selector` in `--namespace` and keeps them in the pod table, next to the configured
//!   pods, through [`crate::state::Shared::set_discovered`] (the same table update a config
//!   reload makes). Without the feature, `--discovery kubernetes` is refused at start with
//!   [`DiscoveryError::NotBuilt`].

#[cfg(feature = "k8s")]
pub mod kubernetes;

pub use crate::config::DiscoveryKind;
use crate::config::Settings;
use crate::state::Shared;
use std::sync::Arc;

pub use crate::config::DEFAULT_TARGET_PORT;

#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    #[error(
        "--discovery kubernetes needs a kvgate built with Kubernetes support: \
         cargo build --release -p kvgate --features k8s"
    )]
    NotBuilt,
    #[error("--discovery kubernetes needs --selector KEY=VALUE (the model-server Pods' labels)")]
    NoSelector,
    #[error("--selector {0:?} has an empty term (KEY=VALUE[,KEY=VALUE…])")]
    BadSelector(String),
    #[error("--target-port must be 1..=65535")]
    BadTargetPort,
    #[error("cannot set up the Kubernetes client: {0}")]
    Client(String),
}

/// What `--discovery kubernetes` watches, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubernetesTarget {
    /// Label selector, e.g. `app=vllm`.
    pub selector: String,
    /// None: the client's default namespace (kubeconfig context, or the service account's).
    pub namespace: Option<String>,
    pub target_port: u16,
}

/// The Kubernetes target of `settings`, or None with static discovery.
pub fn kubernetes_target(settings: &Settings) -> Result<Option<KubernetesTarget>, DiscoveryError> {
    if settings.discovery != DiscoveryKind::Kubernetes {
        return Ok(None);
    }
    let selector = settings
        .selector
        .as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .ok_or(DiscoveryError::NoSelector)?;
    // The API server judges the syntax (a bad selector shows as watch errors); an empty term
    // is refused here because it is always a typo.
    if selector.split(',').any(|term| term.trim().is_empty()) {
        return Err(DiscoveryError::BadSelector(selector.to_string()));
    }
    let target_port = settings.target_port;
    if target_port == 0 {
        return Err(DiscoveryError::BadTargetPort);
    }
    Ok(Some(KubernetesTarget {
        selector: selector.to_string(),
        namespace: settings.namespace.clone(),
        target_port,
    }))
}

/// Starts the discovery of `target` ([`kubernetes_target`]; nothing for static): the Kubernetes client is set up
/// from the kubeconfig (`KUBECONFIG`, `~/.kube/config`) or the in-cluster service account.
pub async fn start(
    shared: &Arc<Shared>,
    target: Option<KubernetesTarget>,
) -> Result<Option<tokio::task::JoinHandle<()>>, DiscoveryError> {
    let Some(target) = target else {
        return Ok(None);
    };
    start_kubernetes(shared, target).await.map(Some)
}

#[cfg(feature = "k8s")]
async fn start_kubernetes(
    shared: &Arc<Shared>,
    target: KubernetesTarget,
) -> Result<tokio::task::JoinHandle<()>, DiscoveryError> {
    let client = kube::Client::try_default()
        .await
        .map_err(|e| DiscoveryError::Client(e.to_string()))?;
    Ok(tokio::spawn(kubernetes::run(
        shared.clone(),
        client,
        target,
    )))
}

#[cfg(not(feature = "k8s"))]
async fn start_kubernetes(
    _shared: &Arc<Shared>,
    _target: KubernetesTarget,
) -> Result<tokio::task::JoinHandle<()>, DiscoveryError> {
    Err(DiscoveryError::NotBuilt)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(discovery: DiscoveryKind, selector: Option<&str>) -> Settings {
        Settings {
            discovery,
            selector: selector.map(str::to_string),
            ..Settings::default()
        }
    }

    #[test]
    fn kubernetes_needs_a_well_formed_selector() {
        assert_eq!(kubernetes_target(&Settings::default()).unwrap(), None);
        assert!(matches!(
            kubernetes_target(&args(DiscoveryKind::Kubernetes, None)),
            Err(DiscoveryError::NoSelector)
        ));
        assert!(matches!(
            kubernetes_target(&args(DiscoveryKind::Kubernetes, Some("app=vllm,,x=y"))),
            Err(DiscoveryError::BadSelector(_))
        ));
        let t = kubernetes_target(&args(DiscoveryKind::Kubernetes, Some("app=vllm,tier!=x")))
            .unwrap()
            .unwrap();
        assert_eq!(t.selector, "app=vllm,tier!=x");
        assert_eq!(t.target_port, DEFAULT_TARGET_PORT);
        assert_eq!(t.namespace, None);
    }

    #[cfg(not(feature = "k8s"))]
    #[tokio::test]
    async fn without_the_feature_kubernetes_says_how_to_build_it() {
        let shared =
            Shared::new(crate::config::GatewayConfig::from_args(&Default::default()).unwrap());
        let target = kubernetes_target(&args(DiscoveryKind::Kubernetes, Some("app=vllm"))).unwrap();
        let err = start(&shared, target).await.unwrap_err();
        assert!(matches!(err, DiscoveryError::NotBuilt));
        assert!(err.to_string().contains("--features k8s"), "{err}");
    }
}
