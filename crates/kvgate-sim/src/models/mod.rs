//! Mixed-model fleets: which model each pod serves and which model each request names.
//!
//! A fleet is described model by model ([`FleetModel`], `kvgate sim --fleet-model
//! NAME:PODS[:PROFILE][:share=S]`): a model's pods run its own profile (its speed on its
//! hardware), in the order given. [`ModelFleet`] turns that into what the router needs, the
//! same things the gateway has:
//!
//! - each pod is declared to serve its model ([`ServedModels::declared`]), and a request is
//!   routed only among the pods that serve its model, through the core's
//!   [`kvgate_core::pods_for_model`] (the gateway's `served_models::not_serving`): the other
//!   pods are excluded from the decision, and a model no pod serves is rejected;
//! - each pod's predictor class is [`kvgate_core::predictor_class`]`(profile name, model)`,
//!   `class@model`, so each (hardware, model) pair learns its own latency model (the ablation
//!   `ClusterConfig::class_blind_predictor` gives every pod one class instead, for measuring
//!   what the model in the class buys);
//! - requests get their models from [`assign`] (by conversation, seeded, by shares), which also
//!   seeds each request's block chain by its model, so two models never share a prefix.
//!
//! A fleet of one model behaves exactly as a fleet with no model declared (its chains are left
//! as the workload made them; only the class names gain `@model`, which no report shows).
//!
//! Bounds: at most [`MAX_FLEET_MODELS`] models; one `u16` per pod and per request (the
//! assignment), one [`ServedModels`] (one 8-byte id) per pod.

pub mod assign;
pub mod recorder;

pub use assign::assign;

use kvgate_core::{AdapterId, PodId, ServedModels};

use crate::profiles::Profile;

/// Most models in one fleet (a model index is a `u16`; a fleet of more models than this is a
/// typo, not a fleet).
pub const MAX_FLEET_MODELS: usize = 256;

/// One model of a mixed fleet: its name, its pods, their profile and its share of the
/// conversations.
#[derive(Debug, Clone, PartialEq)]
pub struct FleetModel {
    /// The model's name as requests name it (`model` in the OpenAI body).
    pub name: String,
    /// Pods serving it (≥ 1).
    pub pods: u32,
    /// The engine profile of its pods (its speed on their hardware; the profile's `name` is
    /// their hardware class).
    pub profile: &'static Profile,
    /// Its share of the conversations; `None`: in proportion to its pods (every model of a
    /// fleet gives one, or none does).
    pub share: Option<f64>,
}

/// A `--fleet-model` value that is not `NAME:PODS[:PROFILE][:share=S]`, or a fleet that cannot be.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum FleetModelError {
    #[error("fleet model {spec:?}: {reason} (expected NAME:PODS[:PROFILE][:share=S])")]
    BadSpec { spec: String, reason: String },
    #[error("fleet model {spec:?}: {source}")]
    Profile {
        spec: String,
        #[source]
        source: ProfileLookupError,
    },
    #[error("a mixed fleet needs at least one model")]
    Empty,
    #[error("a mixed fleet has at most {MAX_FLEET_MODELS} models, got {0}")]
    TooMany(usize),
    #[error("model {0:?} is given twice")]
    Duplicate(String),
    #[error("give share= for every model or for none (model {0:?} has none)")]
    PartialShares(String),
}

/// The profile a spec names could not be resolved (its message).
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("{0}")]
pub struct ProfileLookupError(pub String);

impl FleetModel {
    /// Parses `NAME:PODS[:PROFILE][:share=S]`; `default_profile` when no profile is named.
    /// A field `share=S` (S finite and > 0) may come after PODS or after PROFILE. NAME is
    /// everything before the first `:` (a model name with a `:` cannot be given this way).
    pub fn parse(spec: &str, default_profile: &'static Profile) -> Result<Self, FleetModelError> {
        let bad = |reason: &str| FleetModelError::BadSpec {
            spec: spec.to_string(),
            reason: reason.to_string(),
        };
        let mut fields = spec.split(':').map(str::trim);
        let name = fields
            .next()
            .filter(|n| !n.is_empty())
            .ok_or_else(|| bad("empty model name"))?;
        let pods = fields
            .next()
            .ok_or_else(|| bad("no pod count"))?
            .parse::<u32>()
            .ok()
            .filter(|&n| n >= 1)
            .ok_or_else(|| bad("the pod count must be a whole number ≥ 1"))?;
        let mut profile = None;
        let mut share = None;
        for field in fields {
            if let Some(s) = field.strip_prefix("share=") {
                let s = s
                    .parse::<f64>()
                    .ok()
                    .filter(|s| s.is_finite() && *s > 0.0)
                    .ok_or_else(|| bad("share must be a finite number > 0"))?;
                if share.replace(s).is_some() {
                    return Err(bad("share given twice"));
                }
            } else if profile.is_none() && share.is_none() && !field.is_empty() {
                let p = Profile::resolve(field).map_err(|e| FleetModelError::Profile {
                    spec: spec.to_string(),
                    source: ProfileLookupError(e.to_string()),
                })?;
                profile = Some(p);
            } else {
                return Err(bad(&format!("unexpected field {field:?}")));
            }
        }
        Ok(FleetModel {
            name: name.to_string(),
            pods,
            profile: profile.unwrap_or(default_profile),
            share,
        })
    }
}

/// A mixed fleet: its models, each pod's model, and (after [`assign`]) each request's.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelFleet {
    models: Vec<FleetModel>,
    ids: Vec<AdapterId>,
    /// Model index of each pod, in pod order.
    pod_model: Vec<u16>,
    served: Vec<ServedModels>,
    /// Model index of each request, by request id (filled by [`assign`]).
    request_model: Vec<u16>,
}

impl ModelFleet {
    /// The fleet of `models`, their pods in the order given. Names must differ; shares are
    /// given for every model or for none.
    pub fn new(models: Vec<FleetModel>) -> Result<Self, FleetModelError> {
        if models.is_empty() {
            return Err(FleetModelError::Empty);
        }
        if models.len() > MAX_FLEET_MODELS {
            return Err(FleetModelError::TooMany(models.len()));
        }
        for (i, m) in models.iter().enumerate() {
            if models[..i].iter().any(|o| o.name == m.name) {
                return Err(FleetModelError::Duplicate(m.name.clone()));
            }
        }
        if models.iter().any(|m| m.share.is_some())
            && let Some(m) = models.iter().find(|m| m.share.is_none())
        {
            return Err(FleetModelError::PartialShares(m.name.clone()));
        }
        let mut pod_model = Vec::new();
        let mut served = Vec::new();
        for (i, m) in models.iter().enumerate() {
            pod_model.extend(std::iter::repeat_n(i as u16, m.pods as usize));
            served.extend(std::iter::repeat_n(
                ServedModels::declared(&m.name),
                m.pods as usize,
            ));
        }
        Ok(ModelFleet {
            ids: models.iter().map(|m| AdapterId::of(&m.name)).collect(),
            models,
            pod_model,
            served,
            request_model: Vec::new(),
        })
    }

    /// The models, in the order given.
    pub fn models(&self) -> &[FleetModel] {
        &self.models
    }

    /// Whether the fleet has more than one model (the report then has per-model figures).
    pub fn is_mixed(&self) -> bool {
        self.models.len() > 1
    }

    /// The profile of each pod, in pod order (`ClusterConfig::pod_profiles`).
    pub fn pod_profiles(&self) -> Vec<&'static Profile> {
        self.models
            .iter()
            .flat_map(|m| std::iter::repeat_n(m.profile, m.pods as usize))
            .collect()
    }

    /// Model index of `pod` (`None` beyond the fleet's pods).
    pub fn pod_model(&self, pod: usize) -> Option<usize> {
        self.pod_model.get(pod).map(|&m| usize::from(m))
    }

    /// Model index of request `id`; a request [`assign`] did not reach names the first model.
    pub fn request_model(&self, id: u64) -> usize {
        self.request_model
            .get(id as usize)
            .map_or(0, |&m| usize::from(m))
    }

    /// The predictor class of `pod`, whose profile is named `profile_name`.
    pub fn pod_class(&self, pod: usize, profile_name: &str) -> std::sync::Arc<str> {
        let model = self.pod_model(pod).map(|m| self.models[m].name.as_str());
        kvgate_core::predictor_class(profile_name, model)
    }

    /// The pods request `id` must not go to, in a fleet of `pods` pods: those serving another
    /// model; `None` when no pod serves its model (the gateway's 404).
    pub fn pods_excluded_for(&self, id: u64, pods: usize) -> Option<Vec<PodId>> {
        self.pods_excluded_for_model(self.request_model(id), pods)
    }

    /// The pods a request for model index `model` must not go to: the core's
    /// [`kvgate_core::pods_for_model`] over the pods' declared models (a pod beyond the
    /// fleet's list serves anything); `None` when no pod serves it.
    pub fn pods_excluded_for_model(&self, model: usize, pods: usize) -> Option<Vec<PodId>> {
        let model = *self.ids.get(model)?;
        let listed = (0..pods).map(|i| (PodId(i as u32), self.served.get(i)));
        match kvgate_core::pods_for_model(model, listed) {
            kvgate_core::ModelPods::Anywhere => Some(Vec::new()),
            kvgate_core::ModelPods::Except(pods) => Some(pods),
            kvgate_core::ModelPods::Nowhere => None,
        }
    }

    /// Each model's share of the conversations, summing to 1: the given shares, or the pods'.
    pub fn shares(&self) -> Vec<f64> {
        let weights: Vec<f64> = self
            .models
            .iter()
            .map(|m| m.share.unwrap_or(f64::from(m.pods)))
            .collect();
        let total: f64 = weights.iter().sum();
        weights.iter().map(|w| w / total).collect()
    }

    /// How many requests name each model (after [`assign`]).
    pub fn requests_per_model(&self) -> Vec<u64> {
        let mut counts = vec![0u64; self.models.len()];
        for &m in &self.request_model {
            counts[usize::from(m)] += 1;
        }
        counts
    }

    fn set_request_models(&mut self, request_model: Vec<u16>) {
        self.request_model = request_model;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn default() -> &'static Profile {
        Profile::default_profile()
    }

    #[test]
    fn a_spec_names_pods_profile_and_share_in_any_order_after_the_count() {
        let m = FleetModel::parse("big:3:llama3-70b-h100-tp4:share=0.25", default()).unwrap();
        assert_eq!(m.name, "big");
        assert_eq!(m.pods, 3);
        assert_eq!(m.profile.name, "llama3-70b-h100-tp4");
        assert_eq!(m.share, Some(0.25));
        let m = FleetModel::parse("small:4:share=2", default()).unwrap();
        assert_eq!(
            (m.pods, m.profile.name, m.share),
            (4, "llama3-8b-h100", Some(2.0))
        );
        let m = FleetModel::parse("small:4", default()).unwrap();
        assert_eq!((m.profile.name, m.share), ("llama3-8b-h100", None));
    }

    #[test]
    fn bad_specs_are_errors_naming_the_spec() {
        for bad in [
            "",
            ":3",
            "a",
            "a:0",
            "a:x",
            "a:2:share=0",
            "a:2:share=-1",
            "a:2:share=nan",
            "a:2:share=1:share=2",
            "a:2:share=1:llama3-8b-h100",
            "a:2:llama3-8b-h100:llama3-8b-a100",
        ] {
            let err = FleetModel::parse(bad, default()).unwrap_err();
            assert!(
                matches!(err, FleetModelError::BadSpec { .. }),
                "{bad:?}: {err}"
            );
        }
        assert!(matches!(
            FleetModel::parse("a:2:no-such-profile", default()),
            Err(FleetModelError::Profile { .. })
        ));
    }

    fn model(name: &str, pods: u32, share: Option<f64>) -> FleetModel {
        FleetModel {
            name: name.into(),
            pods,
            profile: default(),
            share,
        }
    }

    #[test]
    fn a_fleet_lays_its_models_pods_out_in_order_and_declares_them() {
        let f = ModelFleet::new(vec![model("a", 2, None), model("b", 3, None)]).unwrap();
        assert_eq!(
            (0..6).map(|p| f.pod_model(p)).collect::<Vec<_>>(),
            [Some(0), Some(0), Some(1), Some(1), Some(1), None]
        );
        assert_eq!(f.pod_profiles().len(), 5);
        assert_eq!(f.shares(), vec![0.4, 0.6]);
        // Request 0 names model a until assigned: b's pods are excluded.
        assert_eq!(
            f.pods_excluded_for(0, 5),
            Some(vec![PodId(2), PodId(3), PodId(4)])
        );
        assert_eq!(&*f.pod_class(0, "llama3-8b-h100"), "llama3-8b-h100@a");
        assert_eq!(&*f.pod_class(4, "llama3-8b-h100"), "llama3-8b-h100@b");
    }

    #[test]
    fn a_model_without_pods_in_the_fleet_is_served_nowhere() {
        let mut f = ModelFleet::new(vec![model("a", 2, None), model("b", 2, None)]).unwrap();
        f.set_request_models(vec![1]);
        // Only the first two pods exist in this (cut) view: none serves b.
        assert_eq!(f.pods_excluded_for(0, 2), None);
        assert_eq!(f.pods_excluded_for(0, 4), Some(vec![PodId(0), PodId(1)]));
    }

    #[test]
    fn fleets_refuse_duplicates_partial_shares_and_emptiness() {
        assert_eq!(ModelFleet::new(vec![]), Err(FleetModelError::Empty));
        assert_eq!(
            ModelFleet::new(vec![model("a", 1, None), model("a", 1, None)]),
            Err(FleetModelError::Duplicate("a".into()))
        );
        assert_eq!(
            ModelFleet::new(vec![model("a", 1, Some(1.0)), model("b", 1, None)]),
            Err(FleetModelError::PartialShares("b".into()))
        );
        let f = ModelFleet::new(vec![model("a", 1, Some(3.0)), model("b", 7, Some(1.0))]).unwrap();
        assert_eq!(f.shares(), vec![0.75, 0.25]);
    }
}
