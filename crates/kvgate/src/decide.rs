//! `kvgate decide`: one routing decision from a JSON case, offline.
//!
//! The case describes a request and a fleet snapshot; the decision runs through the same
//! [`kvgate_core::Router`] as the gateway. `cached_prompts` fill a pod's routed index as if those
//! requests had been sent there; `prefix_score`, `predicted_ttft_ms` and `predicted_tpot_ms` pin
//! the computed values so any case can be stated exactly.

use anyhow::{Context, Result, bail};
use kvgate_core::index::PrefixIndex;
use kvgate_core::index::routed::RoutedIndex;
use kvgate_core::policy::PolicyKind;
use kvgate_core::predictor::{LatencyPredictor, PredictorConfig};
use kvgate_core::request::parse_request_value;
use kvgate_core::{DecisionRng, InFlight, PodId, PodSnapshot, Router, RouterConfig};
use rand::SeedableRng;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Case {
    #[serde(default = "default_policy")]
    pub policy: String,
    #[serde(default)]
    pub config: Option<serde_json::Value>,
    #[serde(default)]
    pub seed: u64,
    pub request: CaseRequest,
    pub pods: Vec<CasePod>,
}

fn default_policy() -> String {
    PolicyKind::AffinityGate.name().to_string()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaseRequest {
    pub path: String,
    pub body: serde_json::Value,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CasePod {
    pub id: String,
    #[serde(default = "default_class")]
    pub class: String,
    #[serde(default)]
    pub waiting: u32,
    #[serde(default)]
    pub running: u32,
    #[serde(default)]
    pub kv_usage: f64,
    #[serde(default)]
    pub kv_blocks: Option<u32>,
    #[serde(default)]
    pub in_flight: InFlight,
    #[serde(default = "default_true")]
    pub healthy: bool,
    #[serde(default)]
    pub cached_prompts: Vec<CaseRequest>,
    pub prefix_score: Option<f64>,
    pub predicted_ttft_ms: Option<f64>,
    pub predicted_tpot_ms: Option<f64>,
}

fn default_class() -> String {
    "default".to_string()
}

fn default_true() -> bool {
    true
}

/// Summary of `--repeat N` runs.
#[derive(Debug, Serialize)]
pub struct RepeatSummary {
    pub runs: u64,
    pub first_seed: u64,
    pub picks: BTreeMap<String, u64>,
    pub branches: BTreeMap<String, u64>,
}

/// A case checked and prepared: everything but the seed.
pub struct Prepared {
    policy: PolicyKind,
    config: RouterConfig,
    pods: Vec<PodSnapshot>,
    overrides: Vec<(Option<f64>, Option<f64>, Option<f64>)>,
    blocks: Vec<u64>,
    input_tokens: u32,
    index: RoutedIndex,
    predictor: LatencyPredictor,
}

pub fn prepare(case: &Case) -> Result<Prepared> {
    let policy = PolicyKind::from_name(&case.policy).with_context(|| {
        let names: Vec<_> = PolicyKind::ALL.iter().map(|k| k.name()).collect();
        format!(
            "unknown policy {:?}; expected one of {}",
            case.policy,
            names.join(", ")
        )
    })?;
    let config = match &case.config {
        Some(v) => RouterConfig::from_json(v)?,
        None => RouterConfig::default(),
    };
    if case.pods.is_empty() {
        bail!("the case has no pods");
    }
    let router = Router::new(config, policy);
    let request =
        parse_request_value(&case.request.path, &case.request.body).context("invalid request")?;
    let mut blocks = Vec::new();
    router.hash_request(&request, &mut blocks);

    let mut index = RoutedIndex::new();
    let mut pods = Vec::with_capacity(case.pods.len());
    let mut overrides = Vec::with_capacity(case.pods.len());
    let mut scratch = Vec::new();
    for (i, p) in case.pods.iter().enumerate() {
        if let Some(s) = p.prefix_score
            && !(0.0..=1.0).contains(&s)
        {
            bail!("pod {:?}: prefix_score {s} is outside [0, 1]", p.id);
        }
        for (key, v) in [
            ("predicted_ttft_ms", p.predicted_ttft_ms),
            ("predicted_tpot_ms", p.predicted_tpot_ms),
        ] {
            if let Some(v) = v
                && !(v.is_finite() && v >= 0.0)
            {
                bail!("pod {:?}: {key} {v} must be a finite number >= 0", p.id);
            }
        }
        if !(0.0..=1.0).contains(&p.kv_usage) {
            bail!("pod {:?}: kv_usage {} is outside [0, 1]", p.id, p.kv_usage);
        }
        let id = PodId(i as u32);
        let kv_blocks = p.kv_blocks.unwrap_or(config.lru_capacity_per_server);
        index.set_capacity(id, kv_blocks);
        for cached in &p.cached_prompts {
            let r = parse_request_value(&cached.path, &cached.body)
                .with_context(|| format!("pod {:?}: invalid cached prompt", p.id))?;
            router.hash_request(&r, &mut scratch);
            index.record_routed(id, &scratch);
        }
        pods.push(PodSnapshot {
            id,
            name: p.id.as_str().into(),
            class: p.class.as_str().into(),
            waiting: p.waiting,
            running: p.running,
            kv_usage: p.kv_usage,
            kv_blocks,
            block_size_tokens: None,
            in_flight: p.in_flight,
            healthy: p.healthy,
            role: kvgate_core::PodRole::Both,
            lora: None,
        });
        overrides.push((p.prefix_score, p.predicted_ttft_ms, p.predicted_tpot_ms));
    }
    Ok(Prepared {
        policy,
        config,
        pods,
        overrides,
        blocks,
        input_tokens: request.estimated_input_tokens(),
        index,
        predictor: LatencyPredictor::new(PredictorConfig::default()),
    })
}

impl Prepared {
    /// One decision with this seed (a fresh router each time: no state carries over).
    pub fn decide(&self, seed: u64) -> Result<kvgate_core::Decision> {
        let mut router = Router::new(self.config, self.policy);
        let (facts, mut candidates) = router.evaluate(
            &self.blocks,
            self.input_tokens,
            &self.pods,
            &self.index,
            &self.predictor,
        );
        for c in &mut candidates {
            let (score, ttft, tpot) = self.overrides[c.pod.id.index()];
            if let Some(s) = score {
                c.prefix_score = s;
                c.matched_blocks = (s * facts.prompt_blocks as f64).round() as u32;
            }
            if let Some(t) = ttft {
                c.predicted_ttft_ms = t;
            }
            if let Some(t) = tpot {
                c.predicted_tpot_ms = t;
            }
        }
        let mut rng = DecisionRng::seed_from_u64(seed);
        Ok(router.choose(&facts, &candidates, &mut rng)?)
    }

    pub fn repeat(&self, first_seed: u64, runs: u64) -> Result<RepeatSummary> {
        let mut summary = RepeatSummary {
            runs,
            first_seed,
            picks: BTreeMap::new(),
            branches: BTreeMap::new(),
        };
        for i in 0..runs {
            let d = self.decide(first_seed.wrapping_add(i))?;
            *summary.picks.entry(d.pod.to_string()).or_default() += 1;
            *summary
                .branches
                .entry(d.branch.as_str().to_string())
                .or_default() += 1;
        }
        Ok(summary)
    }
}

/// Reads a case from a file or `-` (stdin), decides, and returns the JSON to print.
pub fn run(input: &str, repeat: Option<u64>) -> Result<String> {
    let text = if input == "-" {
        std::io::read_to_string(std::io::stdin()).context("reading the case from stdin")?
    } else {
        std::fs::read_to_string(input).with_context(|| format!("reading {input}"))?
    };
    let case: Case = serde_json::from_str(&text).context("invalid case JSON")?;
    let prepared = prepare(&case)?;
    let out = match repeat {
        Some(n) => serde_json::to_string_pretty(&prepared.repeat(case.seed, n)?)?,
        None => serde_json::to_string_pretty(&prepared.decide(case.seed)?)?,
    };
    Ok(out)
}
