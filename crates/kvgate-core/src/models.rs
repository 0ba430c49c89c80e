//! Model-aware fleets: which models each pod serves, and which pods may take a request for a
//! model (sans IO).
//!
//! A fleet may serve several base models (and LoRA adapters on them) behind one gateway. Each
//! pod's list ([`ServedModels`]) comes from its driver: declared in the configuration (a pod
//! entry's `model`), or learnt from the pod's own `GET /v1/models` (vLLM lists its base model
//! and every LoRA adapter it has registered, loaded in a GPU slot or not;
//! [`ServedModels::from_models_list`]). A learnt list replaces a declared one.
//!
//! [`pods_for_model`] then says where a request for `model` may go:
//! - a pod whose list is known serves exactly the ids on it (the request's `model` is its base
//!   model or one of its listed adapters; the LoRA fit of [`crate::adapters`] then ranks the
//!   pods that list an adapter: resident → free slot → evict → full);
//! - a pod whose list is not known yet (never declared, not learnt yet: its `/v1/models` has not
//!   answered) is treated as serving anything, so a fleet whose lists are unknown routes exactly
//!   as before, and a pod that is up but whose list is late still gets traffic;
//! - no pod serves the model (every list is known and none has it): [`ModelPods::Nowhere`], for
//!   the driver to answer 404 itself, before anything is charged or recorded;
//! - an empty fleet is [`ModelPods::Anywhere`]: no pod at all is "no healthy pod" (503), not a
//!   statement about the model.
//!
//! Block chains of different models never meet: the chain seed is the model's name
//! ([`crate::BlockHasher::chain_seed`]), so the index never credits a pod with a prefix that
//! pods of another model cached, with one base model or many.
//!
//! The predictor's pod classes include the model ([`predictor_class`]): a pod's class is its
//! configured hardware class and its base model ([`ServedModels::base`]: the declared `model`,
//! or the first entry of its `/v1/models` with no `parent`, vLLM's base model), as
//! `class@model`, so an 8B and a 70B model on one GPU type learn one latency model each. A pod
//! whose model is not known yet keeps its bare class.
//!
//! Models are matched by [`AdapterId`] (xxh3-64 of the name, as the LoRA rules and the chain
//! seed use it): a pod's list costs 8 bytes per id. Bound: at most [`MAX_SERVED_MODELS`] ids per
//! pod (more are dropped and counted in [`ServedModels::dropped`], never a panic).

use crate::adapters::AdapterId;
use crate::pod::PodId;
use serde_json::Value;
use std::borrow::Borrow;
use std::sync::Arc;

/// Longest base-model name kept for a predictor class (bytes; a longer one is cut at a
/// character boundary): class names label metrics and travel between replicas.
pub const MAX_BASE_MODEL_NAME: usize = 256;

/// Most model ids kept per pod: a vLLM pod lists its base model and its adapters (tens,
/// rarely hundreds); the gateway's merged `/v1/models` keeps 10,000 in all.
pub const MAX_SERVED_MODELS: usize = 10_000;

/// The models one pod serves: a sorted set of ids, ≤ [`MAX_SERVED_MODELS`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ServedModels {
    ids: Vec<AdapterId>,
    /// The pod's base model, when the list names one (≤ [`MAX_BASE_MODEL_NAME`] bytes).
    base: Option<Arc<str>>,
    /// Ids beyond the bound, not kept.
    dropped: usize,
}

/// Why a `/v1/models` answer could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelsListError {
    #[error("not JSON: {0}")]
    InvalidJson(String),
    #[error("no `data` list")]
    NoData,
}

impl ServedModels {
    /// The models named, in any order, duplicates ignored; no base model.
    pub fn from_names<'a>(names: impl IntoIterator<Item = &'a str>) -> Self {
        Self::from_ids(names.into_iter().map(AdapterId::of))
    }

    /// A pod declared to serve `model`: that model, as its base model too.
    pub fn declared(model: &str) -> Self {
        Self::from_names([model]).with_base(Some(model))
    }

    fn with_base(mut self, base: Option<&str>) -> Self {
        self.base = base.filter(|b| !b.is_empty()).map(|b| {
            let mut end = b.len().min(MAX_BASE_MODEL_NAME);
            while !b.is_char_boundary(end) {
                end -= 1;
            }
            Arc::from(&b[..end])
        });
        self
    }

    /// The pod's base model: the declared one, or the first entry of its `/v1/models` that has
    /// no `parent` (vLLM names the base model of each LoRA adapter in its `parent`).
    pub fn base(&self) -> Option<&str> {
        self.base.as_deref()
    }

    fn from_ids(ids: impl IntoIterator<Item = AdapterId>) -> Self {
        let mut kept: Vec<AdapterId> = Vec::new();
        let mut dropped = 0;
        for id in ids {
            if kept.len() < MAX_SERVED_MODELS {
                kept.push(id);
            } else {
                dropped += 1;
            }
        }
        kept.sort_unstable();
        kept.dedup();
        ServedModels {
            ids: kept,
            base: None,
            dropped,
        }
    }

    /// An OpenAI `GET /v1/models` body: the `id` of every entry of `data` (base models and
    /// adapters alike; entries without a string `id` are skipped, as the merged list skips
    /// them), and as the base model the first of them without a string `parent`.
    pub fn from_models_list(body: &[u8]) -> Result<Self, ModelsListError> {
        let v: Value = serde_json::from_slice(body)
            .map_err(|e| ModelsListError::InvalidJson(e.to_string()))?;
        let Some(Value::Array(list)) = v.get("data") else {
            return Err(ModelsListError::NoData);
        };
        let named = || {
            list.iter()
                .filter_map(|m| Some((m.get("id")?.as_str()?, m.get("parent"))))
        };
        let base = named()
            .find(|(_, parent)| !parent.is_some_and(Value::is_string))
            .map(|(id, _)| id);
        Ok(Self::from_names(named().map(|(id, _)| id)).with_base(base))
    }

    pub fn serves(&self, model: AdapterId) -> bool {
        self.ids.binary_search(&model).is_ok()
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Ids left out over [`MAX_SERVED_MODELS`].
    pub fn dropped(&self) -> usize {
        self.dropped
    }
}

/// The predictor class of a pod of hardware class `class` serving `base_model`:
/// `class@base_model`, or `class` alone while its model is not known (module docs).
pub fn predictor_class(class: &str, base_model: Option<&str>) -> Arc<str> {
    match base_model {
        Some(model) => format!("{class}@{model}").into(),
        None => class.into(),
    }
}

/// Where a request for a model may go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelPods {
    /// Every pod may take it (the common single-model fleet, lists not known yet, or no pod).
    Anywhere,
    /// Only the pods not in this list (non-empty): they are known not to serve the model.
    Except(Vec<PodId>),
    /// No pod serves the model: every pod's list is known and none has it.
    Nowhere,
}

/// Which of `pods` (each with its list, `None` when not known; a reference or an `Arc`) may
/// take a request for `model` (module docs). O(pods × log ids), no allocation unless a pod is
/// left out.
pub fn pods_for_model<S: Borrow<ServedModels>>(
    model: AdapterId,
    pods: impl IntoIterator<Item = (PodId, Option<S>)>,
) -> ModelPods {
    let mut except = Vec::new();
    let mut serving = 0usize;
    for (id, served) in pods {
        match served {
            Some(s) if !s.borrow().serves(model) => except.push(id),
            _ => serving += 1,
        }
    }
    if except.is_empty() {
        ModelPods::Anywhere
    } else if serving == 0 {
        ModelPods::Nowhere
    } else {
        ModelPods::Except(except)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn id(name: &str) -> AdapterId {
        AdapterId::of(name)
    }

    #[test]
    fn a_vllm_models_list_gives_its_base_model_and_adapters() {
        let body = br#"{"object":"list","data":[
            {"id":"base","object":"model","parent":null},
            {"id":"sql-lora","object":"model","root":"/adapters/sql","parent":"base"},
            {"object":"model"},{"id":7}]}"#;
        let s = ServedModels::from_models_list(body).unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s.base(), Some("base"));
        assert!(s.serves(id("base")));
        assert!(s.serves(id("sql-lora")));
        assert!(!s.serves(id("other")));
        assert!(matches!(
            ServedModels::from_models_list(b"nope"),
            Err(ModelsListError::InvalidJson(_))
        ));
        assert_eq!(
            ServedModels::from_models_list(br#"{"data":{}}"#),
            Err(ModelsListError::NoData)
        );
    }

    #[test]
    fn the_base_model_is_the_first_entry_without_a_parent_and_names_the_predictor_class() {
        // vLLM lists an adapter with its base as `parent`; the adapter may come first.
        let body =
            br#"{"data":[{"id":"sql-lora","parent":"llama-8b"},{"id":"llama-8b","parent":null}]}"#;
        let s = ServedModels::from_models_list(body).unwrap();
        assert_eq!(s.base(), Some("llama-8b"));
        // A server that gives no `parent` at all: its first model.
        let s = ServedModels::from_models_list(br#"{"data":[{"id":"m1"},{"id":"m2"}]}"#).unwrap();
        assert_eq!(s.base(), Some("m1"));
        // Only adapters listed: no base model known.
        let s = ServedModels::from_models_list(br#"{"data":[{"id":"a","parent":"b"}]}"#).unwrap();
        assert_eq!(s.base(), None);
        assert_eq!(ServedModels::declared("tiny").base(), Some("tiny"));
        assert!(ServedModels::declared("tiny").serves(id("tiny")));
        assert_eq!(ServedModels::from_names(["tiny"]).base(), None);
        // Lists that differ only in their base model differ.
        assert_ne!(
            ServedModels::declared("tiny"),
            ServedModels::from_names(["tiny"])
        );
        assert_eq!(&*predictor_class("h100", Some("llama-8b")), "h100@llama-8b");
        assert_eq!(&*predictor_class("h100", None), "h100");
        // A huge name is cut to the bound, at a character boundary.
        let huge = "é".repeat(MAX_BASE_MODEL_NAME);
        let cut = ServedModels::declared(&huge);
        assert!(cut.base().unwrap().len() <= MAX_BASE_MODEL_NAME);
        assert!(huge.starts_with(cut.base().unwrap()));
    }

    #[test]
    fn requests_go_only_to_pods_serving_their_model_and_unknown_lists_serve_anything() {
        let a = ServedModels::from_names(["model-a"]);
        let b = ServedModels::from_names(["model-b", "b-lora"]);
        let fleet = [(PodId(0), Some(&a)), (PodId(1), Some(&b)), (PodId(2), None)];
        assert_eq!(
            pods_for_model(id("model-a"), fleet),
            ModelPods::Except(vec![PodId(1)])
        );
        assert_eq!(
            pods_for_model(id("b-lora"), fleet),
            ModelPods::Except(vec![PodId(0)])
        );
        // The pod whose list is unknown may serve it: not a 404.
        assert_eq!(
            pods_for_model(id("model-c"), fleet),
            ModelPods::Except(vec![PodId(0), PodId(1)])
        );
        let known = [(PodId(0), Some(&a)), (PodId(1), Some(&b))];
        assert_eq!(pods_for_model(id("model-c"), known), ModelPods::Nowhere);
        // No pod at all is not a 404: the decision answers 503 (no healthy pod).
        let empty: [(PodId, Option<&ServedModels>); 0] = [];
        assert_eq!(pods_for_model(id("model-a"), empty), ModelPods::Anywhere);
    }

    #[test]
    fn a_single_model_fleet_and_a_fleet_of_unknown_lists_route_anywhere() {
        let m = ServedModels::from_names(["tiny"]);
        let fleet = [(PodId(0), Some(&m)), (PodId(1), Some(&m))];
        assert_eq!(pods_for_model(id("tiny"), fleet), ModelPods::Anywhere);
        let unknown: [(PodId, Option<&ServedModels>); 2] = [(PodId(0), None), (PodId(1), None)];
        assert_eq!(pods_for_model(id("tiny"), unknown), ModelPods::Anywhere);
    }

    #[test]
    fn a_list_beyond_the_bound_keeps_the_bound_and_counts_the_rest() {
        let names: Vec<String> = (0..MAX_SERVED_MODELS + 5)
            .map(|i| format!("m{i}"))
            .collect();
        let s = ServedModels::from_names(names.iter().map(String::as_str));
        assert_eq!(s.len(), MAX_SERVED_MODELS);
        assert_eq!(s.dropped(), 5);
        assert!(s.serves(id("m0")));
        assert!(!s.serves(id(&format!("m{}", MAX_SERVED_MODELS))));
    }

    proptest! {
        #[test]
        fn reading_any_body_never_panics(body in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = ServedModels::from_models_list(&body);
        }

        #[test]
        fn reading_any_json_list_never_panics(s in r#"\{"data":\[(\{"id":"[a-z]{0,3}"\},?|1,|null,|\[\],)*\]\}"#) {
            let _ = ServedModels::from_models_list(s.as_bytes());
        }
    }
}
