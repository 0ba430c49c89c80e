//! Router configuration: every policy parameter with its default, in one flat struct.
//!
//! Keys are snake_case; llm-d's camelCase names (`affinityGateTau`, `epsilonExploreSticky`,
//! `affinityMaxTTFTPenaltyMs`, `blockSizeTokens`, `lruCapacityPerServer`) are accepted too, so
//! existing configs carry over. Unknown keys are an error (a typo must not silently fall back to
//! a default). [`RouterConfig::validate`] rejects out-of-range values.
//!
//! `gate_profile` picks the base the affinity-gate keys start from: `seed` is the gate exactly as
//! specified in DESIGN.md §2 (kept forever as the specification and the baseline); `default` is
//! kvgate's recommended gate, chosen by the measurements in docs/decisions/ (one record per key). Keys given explicitly
//! override the profile's values. Every reader goes through that merge: `RouterConfig`'s
//! `Deserialize` (a `[router]` table in `kvgate serve --config`, TOML, YAML or JSON, on start and
//! on reload) and [`RouterConfig::from_json`] (`kvgate decide`, `kvgate sim --router-config`) both
//! read a `RouterKeys` (every key absent or given), start from the profile and validate.
//!
//! **Removed options.** Options that the decision records (docs/decisions/) found helping nowhere were removed on
//! 2026-12-07, and a config that still sets one is refused with a message that names the key,
//! the evidence and what to use instead ([`removed`]): `affinity_gate_tau = "auto"` and
//! `epsilon_explore_sticky = "auto"` (§9), `explore_mode = "least-loaded-non-sticky"` and
//! `"random-if-no-sticky"` (§3), the `predictor_model` key (§6.3, §14: `rls`, the one model
//! left), `predictor_drift_adaptation = true`, `cold_spread_window_ms` above 0, session
//! affinity (`session_affinity_ttl_ms` above 0, `session_affinity_floor` other than its old
//! 0.9; docs/decisions/session-affinity.md) and `slo_routing = true`. A removed key set to its
//! old default is accepted and ignored, so configs that only named the default keep working.
//! `experimental_options`, the switch the measured-useless options needed, is accepted with
//! any value and ignored: no option needs it since they left.

use crate::blocks::DEFAULT_BLOCK_SIZE_TOKENS;
use crate::index::DEFAULT_POD_CAPACITY_BLOCKS;
use crate::predictor::PredictorConfig;
use crate::request::DEFAULT_CHARS_PER_TOKEN;
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Which base the affinity gate's parameters start from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GateProfile {
    /// The seed's gate exactly: explore = best latency overall, absolute 5000 ms load gate,
    /// τ 0.80, ε 0.01, nothing else.
    Seed,
    /// kvgate's recommended settings (docs/decisions/README.md).
    #[default]
    Default,
}

/// What the affinity gate does when its ε coin says "explore".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ExploreMode {
    /// The seed: the best predicted TTFT over all pods (rarely reaches a cold pod).
    BestOverall,
    /// A uniformly random pod among the non-sticky ones (all pods if every pod is sticky).
    RandomNonSticky,
}

impl<'de> Deserialize<'de> for ExploreMode {
    /// The two modes by name; the removed ones are refused with their replacement.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        const NAMES: &[&str] = &["best-overall", "random-non-sticky"];
        let name = String::deserialize(d)?;
        match name.as_str() {
            "best-overall" => Ok(ExploreMode::BestOverall),
            "random-non-sticky" => Ok(ExploreMode::RandomNonSticky),
            "least-loaded-non-sticky" | "random-if-no-sticky" => Err(serde::de::Error::custom(
                removed(&format!("explore_mode = {name:?}"), EXPLORE_MODE_REMOVED),
            )),
            _ => Err(serde::de::Error::unknown_variant(&name, NAMES)),
        }
    }
}

/// When queueing holds the affinity gate's relative load gate back
/// (`relative_gate_queue_rule`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum QueueRule {
    /// Never: the relative gate as measured in docs/decisions/relative-load-gate.md (the seed's value).
    #[default]
    Off,
    /// While every candidate pod reports waiting requests (the default profile's value).
    Every,
    /// While the best pod overall, where a break would send the request, reports waiting
    /// requests.
    Target,
}

/// The seed's τ (llm-d's `affinityGateTau`).
pub const DEFAULT_AFFINITY_GATE_TAU: f64 = 0.80;
/// The seed's ε (llm-d's `epsilonExploreSticky`).
pub const DEFAULT_EPSILON_EXPLORE_STICKY: f64 = 0.01;

/// The day the options that helped nowhere left kvgate (see the module docs).
pub const REMOVED_ON: &str = "2026-12-07";

/// Why `explore_mode`'s two other modes were removed, and what to use.
const EXPLORE_MODE_REMOVED: &str = "docs/decisions/explore-modes-removed.md: no better than random exploration, worse \
     where queueing is real, or never spreading shared prefixes; use \"random-non-sticky\" or \
     \"best-overall\", or leave the key out for the profile's mode (the default profile's is \
     \"random-non-sticky\")";

/// The message for a config that sets a removed option: `what` (the key, with its value when
/// only that value was removed), then why and what to use instead.
pub fn removed(what: &str, why_and_instead: &str) -> String {
    format!("{what} was removed on {REMOVED_ON} ({why_and_instead})")
}

/// Reads a gate parameter (τ or ε) given as a number; the removed `"auto"` is refused with the
/// number to use instead.
macro_rules! gate_number {
    ($name:ident, $key:literal, $default:literal, $evidence:literal) => {
        /// A value of the key as read from a config (a number).
        #[derive(Debug, Clone, Copy)]
        struct $name(f64);

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                #[derive(Deserialize)]
                #[serde(untagged)]
                enum Raw {
                    Number(f64),
                    Text(String),
                }
                match Raw::deserialize(d)? {
                    Raw::Number(v) => Ok($name(v)),
                    Raw::Text(t) if t == "auto" => Err(serde::de::Error::custom(removed(
                        concat!($key, " = \"auto\""),
                        concat!(
                            $evidence,
                            "; give a number, or leave the key out for ",
                            $default
                        ),
                    ))),
                    Raw::Text(t) => Err(serde::de::Error::custom(format!(
                        concat!($key, ": expected a number, got {:?}"),
                        t
                    ))),
                }
            }
        }

        impl From<$name> for f64 {
            fn from(v: $name) -> f64 {
                v.0
            }
        }
    };
}

gate_number!(
    TauNumber,
    "affinity_gate_tau",
    "0.80, the default",
    "docs/decisions/tau-epsilon-auto.md: TTFT within ±1 % of the fixed 0.80 on every workload short of overload"
);
gate_number!(
    EpsilonNumber,
    "epsilon_explore_sticky",
    "0.01, the default",
    "docs/decisions/tau-epsilon-auto.md: within 1 % of the fixed 0.01, worse on the Mooncake p99"
);

/// `predictor_model`, a removed key: `"rls"` (the one model left, so a config that named the
/// default keeps working) is accepted and ignored; any other value is refused.
fn removed_predictor_model<'de, D: serde::Deserializer<'de>>(d: D) -> Result<(), D::Error> {
    let value = <String as serde::Deserialize>::deserialize(d)?;
    if value == "rls" {
        return Ok(());
    }
    Err(serde::de::Error::custom(removed(
        "predictor_model",
        "docs/decisions/predictor-tree-and-analytic-models.md and predictor-rls-variants.md: the \
         gate routed best with `rls`, now the only model; leave the key out",
    )))
}

/// `predictor_drift_adaptation`, a removed key: `false` (what both profiles had, so a config
/// that named the default keeps working) is accepted and ignored; `true` is refused.
fn removed_drift_adaptation<'de, D: serde::Deserializer<'de>>(d: D) -> Result<(), D::Error> {
    if !<bool as serde::Deserialize>::deserialize(d)? {
        return Ok(());
    }
    Err(serde::de::Error::custom(removed(
        "predictor_drift_adaptation",
        "docs/decisions/predictor-drift-adaptation.md: adapting on drift episodes tipped the \
         Mooncake trace into growing queues and helped no routing measurement; episodes are still \
         counted (kvgate_predictor_class_drift_episodes_total); leave the key out",
    )))
}

/// `cold_spread_window_ms`, a removed key: 0 (both profiles' value) is accepted and ignored;
/// a window is refused.
fn removed_cold_spread<'de, D: serde::Deserializer<'de>>(d: D) -> Result<(), D::Error> {
    if <f64 as serde::Deserialize>::deserialize(d)? == 0.0 {
        return Ok(());
    }
    Err(serde::de::Error::custom(removed(
        "cold_spread_window_ms",
        "docs/decisions/cold-spread-window.md: it helped the seed gate's light and overloaded \
         Mooncake runs but cost chat p99 ×1.11–1.13, the default profile's bounded exploring \
         reaches the same light-load figure without it, and it gained nothing on real vLLM pods; \
         leave the key out",
    )))
}

/// Why session affinity was removed, and what to do.
const SESSION_AFFINITY_REMOVED: &str = "docs/decisions/session-affinity.md: measured neutral on \
     compacted agent sessions in the simulator, on real vLLM, and with a lossy engine index; \
     leave the key out";

/// `session_affinity_ttl_ms`, a removed key: 0 (session affinity off, what both profiles had)
/// is accepted and ignored; any other value is refused.
fn removed_session_affinity_ttl<'de, D: serde::Deserializer<'de>>(d: D) -> Result<(), D::Error> {
    if <f64 as serde::Deserialize>::deserialize(d)? == 0.0 {
        return Ok(());
    }
    Err(serde::de::Error::custom(removed(
        "session_affinity_ttl_ms",
        SESSION_AFFINITY_REMOVED,
    )))
}

/// `session_affinity_floor`, a removed key: 0.9 (its old default) is accepted and ignored; any
/// other value is refused.
fn removed_session_affinity_floor<'de, D: serde::Deserializer<'de>>(d: D) -> Result<(), D::Error> {
    if <f64 as serde::Deserialize>::deserialize(d)? == 0.9 {
        return Ok(());
    }
    Err(serde::de::Error::custom(removed(
        "session_affinity_floor",
        SESSION_AFFINITY_REMOVED,
    )))
}

/// `slo_routing`, a removed key: `false` (both profiles' value) is accepted and ignored; `true`
/// is refused.
fn removed_slo_routing<'de, D: serde::Deserializer<'de>>(d: D) -> Result<(), D::Error> {
    if !<bool as serde::Deserialize>::deserialize(d)? {
        return Ok(());
    }
    Err(serde::de::Error::custom(removed(
        "slo_routing",
        "docs/decisions/slo-routing.md: upstream's tightest-fit headroom pick lowered goodput at \
         every load on both workloads measured; objectives are still validated, recorded and \
         measured (goodput); leave the key out",
    )))
}

/// `experimental_options`, the switch no option needs any more: any value is accepted and
/// ignored.
fn ignored_experimental_options<'de, D: serde::Deserializer<'de>>(d: D) -> Result<(), D::Error> {
    <bool as serde::Deserialize>::deserialize(d).map(|_| ())
}

/// Deserialised through `RouterKeys`: the chosen `gate_profile` first, every key given over it
/// (see the module docs); the result is validated.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct RouterConfig {
    /// Base of the gate parameters (`seed` or `default`); see the module docs.
    pub gate_profile: GateProfile,
    // ---- affinity gate (DESIGN.md §2; defaults from llm-d's predicted-latency scorer) ----
    /// Pods whose prefix score is strictly above this are sticky. Default 0.80.
    pub affinity_gate_tau: f64,
    /// Probability of skipping the gate and considering every pod. Default 0.01.
    pub epsilon_explore_sticky: f64,
    /// Break affinity when the best sticky pod's predicted TTFT exceeds the best pod's by more
    /// than this. Default 5000 ms; 0 disables the load gate (as upstream).
    pub affinity_max_ttft_penalty_ms: f64,
    /// Relative load gate: also break affinity when best sticky TTFT > this × best TTFT +
    /// `affinity_relative_slack_ms`. 0 disables it (seed).
    pub affinity_relative_penalty: f64,
    pub affinity_relative_slack_ms: f64,
    /// The relative load gate breaks affinity only when the break saves more than the prefill it
    /// adds: best sticky − best > the move's extra prefill (the best pod's own-prefill share of
    /// its prediction less the sticky pod's). The target pays that prefill once for this
    /// request (already in its prediction) and once more for every request queued behind it.
    /// Seed false, default profile true (BENCHMARKS.md "Which key of the default profile loses
    /// when overloaded").
    pub load_break_pays_prefill: bool,
    /// What exploring picks. Seed `best-overall`, default profile `random-non-sticky`.
    pub explore_mode: ExploreMode,
    /// Bounded-cost exploration: exploring may only pick a pod predicted within this many ms of
    /// the best pod's TTFT; with no such pod the request is not explored. 0, with
    /// `explore_max_extra_rel` 0 too, = unbounded (seed).
    pub explore_max_extra_ms: f64,
    /// Bounded-cost exploration, relative: the bound is max(`explore_max_extra_ms`,
    /// `explore_max_extra_rel` × the best pod's TTFT), so it scales with the fleet's speed
    /// (25 ms is a short shared prompt on a GPU, a few dozen tokens on a CPU pod). 0 = only the
    /// absolute bound (seed); 1 in the default profile.
    pub explore_max_extra_rel: f64,
    /// Balance window: in the `exploit` pick, among the sticky pods predicted within
    /// max(`balance_window_ms`, `balance_window_rel` × best) ms of the best sticky pod, take
    /// the one with the lowest scraped KV usage. 0 and 0 disable it (seed, default).
    pub balance_window_ms: f64,
    pub balance_window_rel: f64,
    /// Admission-aware load gate: when queueing holds the relative load gate back — `every`
    /// pod reports waiting requests, or the best pod overall (the `target` of a break) does.
    /// Seed `off`, default profile `every` (docs/decisions/relative-gate-queue-rule.md).
    pub relative_gate_queue_rule: QueueRule,
    /// Shared-prefix exploration: the exploration probability for a request whose deepest
    /// cached block was carried by at least `shared_prefix_min_requests` recent requests (a
    /// shared system prompt, not one conversation's history; `index/popularity.rs`). The
    /// larger of this and `epsilon_explore_sticky` applies, except while every pod reports
    /// waiting requests. Seed 0 (off), default profile 0.1 (docs/decisions/shared-prefix-epsilon.md).
    pub shared_prefix_epsilon: f64,
    /// Recent requests that must have carried a prompt's deepest cached block for
    /// `shared_prefix_epsilon` to apply. Default 8.
    pub shared_prefix_min_requests: u32,

    // ---- weighted (llm-d's default scorer weights without a predictor) ----
    pub weighted_prefix_weight: f64,
    pub weighted_queue_weight: f64,
    pub weighted_kv_weight: f64,

    // ---- sglang-cache-aware (SGLang router CLI defaults) ----
    pub cache_threshold: f64,
    pub balance_abs_threshold: f64,
    pub balance_rel_threshold: f64,

    // ---- dynamo-kv (NVIDIA Dynamo KV router defaults) ----
    pub overlap_score_weight: f64,
    pub router_temperature: f64,

    // ---- prompt blocks and index ----
    pub block_size_tokens: u32,
    pub chars_per_token: u32,
    /// Routed-index capacity per pod when the pod has not reported its KV blocks. Default 31,250.
    pub lru_capacity_per_server: u32,

    // ---- latency predictor (one model: RLS per pod class, `predictor::model`) ----
    /// Samples a pod class needs before its regression replaces the analytic estimate, for
    /// TTFT and for TPOT each: the predictor's
    /// `min_samples`. 32 in both profiles. The default profile had 8 (docs/decisions/predictor-min-samples.md:
    /// held-out TTFT error in the simulator), but on real vLLM pods a regression of 10 weights
    /// fitted on 8–31 samples ranked the pods worse than the analytic estimate: 32 had ×0.74
    /// the mean TTFT of 8 on the overloaded agent workload, the simulator's §17.10 rows within
    /// 1 % (BENCHMARKS.md "The predictor's first samples"). ≥ 1. Changing it on a config reload
    /// starts a new predictor (what was learnt is dropped).
    pub predictor_min_samples: u64,
    /// Whether the predictor learns a request's TTFT at its first token instead of when the
    /// request ends (a whole decode later: ~8 s for 1,000 output tokens, during which a new
    /// pod class is predicted by the analytic estimate). Seed false; default profile true
    /// (docs/decisions/predictor-ttft-at-first-token.md). The TPOT is learnt at the end either way.
    pub predictor_ttft_at_first_token: bool,
    /// Whether a prediction counts a matched prefix as cached only where the pod will have
    /// computed it: the blocks an earlier request brought to the pod count as uncached for a
    /// request that would join that request's engine step — routed before it is predicted to
    /// start (its predicted TTFT less an idle pod's, plus one step), to a pod without waiting
    /// requests, and before its first token ([`crate::session::prefilling`]). The routed index
    /// holds a prefix from the moment it is routed, but siblings scheduled in one step each
    /// compute it (an engine registers a block once computed): parallel tool calls and
    /// fan-outs. The prefix score the gate reads is unchanged; the load gate can then move
    /// them. Seed false; default profile true (BENCHMARKS.md "Prefixes still being computed").
    pub predict_computed_prefix: bool,

    // ---- LoRA adapters (`adapters.rs`: the cost model, its defaults and their sources) ----
    /// Whether a pod's adapter fit adds its cost to the predicted TTFT (resident 0, empty slot
    /// `lora_load_ms`, evicting an idle adapter 2 × `lora_load_ms`, full `lora_load_ms +
    /// lora_deferral_ms × (1 + deferred)`). Default true;
    /// false is the adapter-blind router (the prefix index stays keyed by adapter either way).
    pub lora_aware: bool,
    /// Loading an adapter into a free slot. Default 25 ms.
    pub lora_load_ms: f64,
    /// One wait for a slot when every slot is held by other adapters' running requests.
    /// Default 1000 ms.
    pub lora_deferral_ms: f64,

    // ---- engine index ----
    /// How long a route to a pod with live KV events counts as the pod holding the request's
    /// blocks before its `BlockStored` events confirm it (`index/pending.rs`). Default 0: off
    /// (the engine index scores events only). 2000 is llm-d's `speculativeIndexing` TTL. On,
    /// bursts of siblings sharing a new prefix stay on one pod (4 mock pods: 1 pod per burst
    /// instead of 3–4, ×4–6 the cached tokens); in the simulator's agent workload the same
    /// piling cost TTFT (mean ×1.04–1.11, p99 ×1.14–1.27), because siblings scheduled in the
    /// same engine step as the first share nothing. BENCHMARKS.md "Pending routes".
    pub engine_pending_ttl_ms: f64,
}

impl Default for RouterConfig {
    /// The `default` gate profile.
    fn default() -> Self {
        RouterConfig::for_profile(GateProfile::Default)
    }
}

impl<'de> Deserialize<'de> for RouterConfig {
    /// Profile first, given keys over it, validated: no caller can get the plain-serde reading
    /// that ignores `gate_profile` for the keys it leaves out.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        RouterConfig::from_keys(RouterKeys::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

/// A key that is present: its value, never `null` (a `null` would silently mean "the profile's
/// value", which is what leaving the key out says).
fn given<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

/// Declares [`RouterKeys`] from one list of `field: type, "camelCaseAlias"…;` lines, so that the
/// keys read from a file and the keys laid over the profile cannot drift apart; the list must name
/// every field of [`RouterConfig`] (checked at compile time). The `removed { key: "refusing fn",
/// "alias"…; }` block first names keys that are no longer read: a config that sets one is
/// refused by that function's message.
macro_rules! router_keys {
    (
        removed { $($removed:ident: $refuse:literal $(, $removed_alias:tt)*;)* }
        $($field:ident: $ty:ty $(, $alias:tt)*;)*
    ) => {
        /// A router config as written: every key absent or given, unknown keys rejected, removed
        /// keys refused with their replacement. The one way in to a [`RouterConfig`] (its
        /// `Deserialize` and [`RouterConfig::from_json`]).
        #[derive(Debug, Default, Deserialize)]
        #[serde(default, deny_unknown_fields)]
        struct RouterKeys {
            $(
                #[serde(deserialize_with = "given" $(, alias = $alias)*)]
                $field: Option<$ty>,
            )*
            $(
                #[serde(deserialize_with = $refuse $(, alias = $removed_alias)*)]
                #[allow(dead_code)] // never read: reading the key is an error
                $removed: (),
            )*
        }

        impl RouterKeys {
            /// The chosen profile's config with every given key laid over it.
            fn over_profile(self) -> RouterConfig {
                let mut config = RouterConfig::for_profile(self.gate_profile.unwrap_or_default());
                $(
                    if let Some(value) = self.$field {
                        config.$field = value.into();
                    }
                )*
                config
            }
        }

        /// The key a `[router]` name stands for: a camelCase alias (llm-d's names) gives its
        /// snake_case key, a key gives itself, anything else `None`. Layered configs rename
        /// aliases with it before merging, so a key given twice under two names is one key.
        pub fn router_key_name(name: &str) -> Option<&'static str> {
            match name {
                $(stringify!($field) $(| $alias)* => Some(stringify!($field)),)*
                $(stringify!($removed) $(| $removed_alias)* => Some(stringify!($removed)),)*
                _ => None,
            }
        }

        // A field added to `RouterConfig` but not to this list fails to compile here.
        const _: fn(RouterConfig) = |RouterConfig { $($field: _),* }| {};
    };
}

router_keys! {
    // Keys removed on 2026-12-07: refused, with what to use instead.
    removed {
        predictor_model: "removed_predictor_model", "predictorModel";
        predictor_drift_adaptation: "removed_drift_adaptation", "predictorDriftAdaptation";
        cold_spread_window_ms: "removed_cold_spread", "coldSpreadWindowMs";
        session_affinity_ttl_ms: "removed_session_affinity_ttl", "sessionAffinityTtlMs";
        session_affinity_floor: "removed_session_affinity_floor", "sessionAffinityFloor";
        slo_routing: "removed_slo_routing", "sloRouting";
        experimental_options: "ignored_experimental_options", "experimentalOptions";
    }
    gate_profile: GateProfile, "gateProfile";
    affinity_gate_tau: TauNumber, "affinityGateTau";
    epsilon_explore_sticky: EpsilonNumber, "epsilonExploreSticky";
    affinity_max_ttft_penalty_ms: f64, "affinityMaxTTFTPenaltyMs", "affinityMaxTtftPenaltyMs";
    affinity_relative_penalty: f64, "affinityRelativePenalty";
    affinity_relative_slack_ms: f64, "affinityRelativeSlackMs";
    load_break_pays_prefill: bool, "loadBreakPaysPrefill";
    explore_mode: ExploreMode, "exploreMode";
    explore_max_extra_ms: f64, "exploreMaxExtraMs";
    explore_max_extra_rel: f64, "exploreMaxExtraRel";
    balance_window_ms: f64, "balanceWindowMs";
    balance_window_rel: f64, "balanceWindowRel";
    relative_gate_queue_rule: QueueRule, "relativeGateQueueRule";
    shared_prefix_epsilon: f64, "sharedPrefixEpsilon";
    shared_prefix_min_requests: u32, "sharedPrefixMinRequests";
    weighted_prefix_weight: f64, "prefixWeight";
    weighted_queue_weight: f64, "queueWeight";
    weighted_kv_weight: f64, "kvCacheWeight";
    cache_threshold: f64;
    balance_abs_threshold: f64;
    balance_rel_threshold: f64;
    overlap_score_weight: f64;
    router_temperature: f64;
    block_size_tokens: u32, "blockSizeTokens";
    chars_per_token: u32, "averageCharactersPerToken";
    lru_capacity_per_server: u32, "lruCapacityPerServer";
    predictor_min_samples: u64, "predictorMinSamples";
    predictor_ttft_at_first_token: bool, "predictorTtftAtFirstToken";
    predict_computed_prefix: bool, "predictComputedPrefix";
    lora_aware: bool, "loraAware";
    lora_load_ms: f64, "loraLoadMs";
    lora_deferral_ms: f64, "loraDeferralMs";
    engine_pending_ttl_ms: f64, "enginePendingTtlMs";
}

impl RouterConfig {
    /// The seed's gate exactly (DESIGN.md §2).
    pub fn seed() -> Self {
        RouterConfig::for_profile(GateProfile::Seed)
    }

    pub fn for_profile(profile: GateProfile) -> Self {
        let base = RouterConfig {
            gate_profile: GateProfile::Seed,
            affinity_gate_tau: DEFAULT_AFFINITY_GATE_TAU,
            epsilon_explore_sticky: DEFAULT_EPSILON_EXPLORE_STICKY,
            affinity_max_ttft_penalty_ms: 5000.0,
            affinity_relative_penalty: 0.0,
            affinity_relative_slack_ms: 0.0,
            load_break_pays_prefill: false,
            explore_mode: ExploreMode::BestOverall,
            explore_max_extra_ms: 0.0,
            explore_max_extra_rel: 0.0,
            balance_window_ms: 0.0,
            balance_window_rel: 0.0,
            relative_gate_queue_rule: QueueRule::Off,
            shared_prefix_epsilon: 0.0,
            shared_prefix_min_requests: 8,
            weighted_prefix_weight: 3.0,
            weighted_queue_weight: 2.0,
            weighted_kv_weight: 2.0,
            cache_threshold: 0.3,
            balance_abs_threshold: 64.0,
            balance_rel_threshold: 1.5,
            overlap_score_weight: 1.0,
            router_temperature: 0.0,
            block_size_tokens: DEFAULT_BLOCK_SIZE_TOKENS,
            chars_per_token: DEFAULT_CHARS_PER_TOKEN,
            lru_capacity_per_server: DEFAULT_POD_CAPACITY_BLOCKS,
            predictor_min_samples: 32,
            predictor_ttft_at_first_token: false,
            predict_computed_prefix: false,
            lora_aware: true,
            lora_load_ms: crate::adapters::DEFAULT_LORA_LOAD_MS,
            lora_deferral_ms: crate::adapters::DEFAULT_LORA_DEFERRAL_MS,
            engine_pending_ttl_ms: 0.0,
        };
        match profile {
            GateProfile::Seed => base,
            // Chosen by the measurements in docs/decisions/ (README: one record per key).
            GateProfile::Default => RouterConfig {
                gate_profile: GateProfile::Default,
                explore_mode: ExploreMode::RandomNonSticky,
                explore_max_extra_ms: 25.0,
                explore_max_extra_rel: 1.0,
                affinity_relative_penalty: 1.25,
                affinity_relative_slack_ms: 5.0,
                load_break_pays_prefill: true,
                relative_gate_queue_rule: QueueRule::Every,
                shared_prefix_epsilon: 0.1,
                predictor_ttft_at_first_token: true,
                predict_computed_prefix: true,
                ..base
            },
        }
    }
}

#[derive(Debug, Error, PartialEq)]
pub enum ConfigError {
    #[error("{key} = {value} is out of range: {expected}")]
    OutOfRange {
        key: &'static str,
        value: f64,
        expected: &'static str,
    },
    #[error("invalid config: {0}")]
    Parse(String),
}

impl RouterConfig {
    /// Parses a JSON object (snake_case or camelCase keys) and validates it: the chosen
    /// `gate_profile`'s values first, every key given over them. The same path as every other
    /// way a `RouterConfig` is read (`Deserialize`: `kvgate serve --config`, reload, the
    /// Kubernetes ConfigMap), but with the typed error.
    pub fn from_json(value: &serde_json::Value) -> Result<Self, ConfigError> {
        let keys = RouterKeys::deserialize(value).map_err(|e| ConfigError::Parse(e.to_string()))?;
        RouterConfig::from_keys(keys)
    }

    fn from_keys(keys: RouterKeys) -> Result<Self, ConfigError> {
        let config = keys.over_profile();
        config.validate()?;
        Ok(config)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        fn check(
            key: &'static str,
            value: f64,
            ok: bool,
            expected: &'static str,
        ) -> Result<(), ConfigError> {
            if ok && value.is_finite() {
                Ok(())
            } else {
                Err(ConfigError::OutOfRange {
                    key,
                    value,
                    expected,
                })
            }
        }
        let unit = |v: f64| (0.0..=1.0).contains(&v);
        check(
            "affinity_gate_tau",
            self.affinity_gate_tau,
            unit(self.affinity_gate_tau),
            "0 <= tau <= 1",
        )?;
        check(
            "epsilon_explore_sticky",
            self.epsilon_explore_sticky,
            unit(self.epsilon_explore_sticky),
            "0 <= epsilon <= 1",
        )?;
        check(
            "affinity_max_ttft_penalty_ms",
            self.affinity_max_ttft_penalty_ms,
            self.affinity_max_ttft_penalty_ms >= 0.0,
            ">= 0 (0 disables the load gate)",
        )?;
        check(
            "affinity_relative_penalty",
            self.affinity_relative_penalty,
            self.affinity_relative_penalty == 0.0 || self.affinity_relative_penalty >= 1.0,
            "0 (off) or >= 1",
        )?;
        check(
            "affinity_relative_slack_ms",
            self.affinity_relative_slack_ms,
            self.affinity_relative_slack_ms >= 0.0,
            ">= 0",
        )?;
        check(
            "explore_max_extra_ms",
            self.explore_max_extra_ms,
            self.explore_max_extra_ms >= 0.0,
            ">= 0 (0 = unbounded)",
        )?;
        for (key, v) in [
            ("lora_load_ms", self.lora_load_ms),
            ("lora_deferral_ms", self.lora_deferral_ms),
            ("engine_pending_ttl_ms", self.engine_pending_ttl_ms),
        ] {
            check(key, v, v.is_finite() && v >= 0.0, ">= 0")?;
        }
        check(
            "shared_prefix_epsilon",
            self.shared_prefix_epsilon,
            unit(self.shared_prefix_epsilon),
            "0 <= epsilon <= 1 (0 = off)",
        )?;
        check(
            "shared_prefix_min_requests",
            f64::from(self.shared_prefix_min_requests),
            self.shared_prefix_min_requests >= 1,
            ">= 1",
        )?;
        check(
            "predictor_min_samples",
            self.predictor_min_samples as f64,
            self.predictor_min_samples >= 1,
            ">= 1",
        )?;
        check(
            "explore_max_extra_rel",
            self.explore_max_extra_rel,
            self.explore_max_extra_rel >= 0.0,
            ">= 0 (0: the absolute bound alone)",
        )?;
        check(
            "balance_window_ms",
            self.balance_window_ms,
            self.balance_window_ms >= 0.0,
            ">= 0 (0 = no absolute window)",
        )?;
        check(
            "balance_window_rel",
            self.balance_window_rel,
            self.balance_window_rel >= 0.0,
            ">= 0 (0 = no relative window)",
        )?;
        for (key, v) in [
            ("weighted_prefix_weight", self.weighted_prefix_weight),
            ("weighted_queue_weight", self.weighted_queue_weight),
            ("weighted_kv_weight", self.weighted_kv_weight),
        ] {
            check(key, v, v >= 0.0, ">= 0")?;
        }
        let total =
            self.weighted_prefix_weight + self.weighted_queue_weight + self.weighted_kv_weight;
        check("weighted_*_weight (sum)", total, total > 0.0, "> 0")?;
        check(
            "cache_threshold",
            self.cache_threshold,
            unit(self.cache_threshold),
            "0 <= threshold <= 1",
        )?;
        check(
            "balance_abs_threshold",
            self.balance_abs_threshold,
            self.balance_abs_threshold >= 0.0,
            ">= 0",
        )?;
        check(
            "balance_rel_threshold",
            self.balance_rel_threshold,
            self.balance_rel_threshold >= 1.0,
            ">= 1",
        )?;
        check(
            "overlap_score_weight",
            self.overlap_score_weight,
            self.overlap_score_weight >= 0.0,
            ">= 0",
        )?;
        check(
            "router_temperature",
            self.router_temperature,
            self.router_temperature >= 0.0,
            ">= 0",
        )?;
        let bs = self.block_size_tokens as f64;
        check(
            "block_size_tokens",
            bs,
            (1.0..=4096.0).contains(&bs),
            "1..=4096",
        )?;
        let cpt = self.chars_per_token as f64;
        check(
            "chars_per_token",
            cpt,
            (1.0..=64.0).contains(&cpt),
            "1..=64",
        )?;
        let cap = self.lru_capacity_per_server as f64;
        check("lru_capacity_per_server", cap, cap >= 1.0, ">= 1")?;
        Ok(())
    }
}

/// The predictor side of a router config: here, beside the config, so that the predictor does
/// not depend on the router's config.
impl PredictorConfig {
    /// The predictor a router config asks for: its cold-start sample count
    /// (`predictor_min_samples`), every other field at its default. The gateway and the simulator both start here, so a
    /// profile means the same predictor in both.
    pub fn for_router(router: &RouterConfig) -> Self {
        PredictorConfig {
            min_samples: router.predictor_min_samples,
            ..PredictorConfig::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn default_profile_adds_cold_pod_exploration_and_a_relative_load_gate() {
        let c = RouterConfig::default();
        assert_eq!(c.gate_profile, GateProfile::Default);
        assert_eq!(c.explore_mode, ExploreMode::RandomNonSticky);
        assert_eq!(c.explore_max_extra_ms, 25.0);
        assert_eq!(c.explore_max_extra_rel, 1.0);
        assert_eq!(
            (c.affinity_relative_penalty, c.affinity_relative_slack_ms),
            (1.25, 5.0)
        );
        assert!(c.load_break_pays_prefill);
        assert_eq!(
            (c.shared_prefix_epsilon, c.shared_prefix_min_requests),
            (0.1, 8)
        );
        let seed = RouterConfig::seed();
        assert_eq!(seed.shared_prefix_epsilon, 0.0);
        let err = RouterConfig::from_json(&json!({"shared_prefix_epsilon": 1.5})).unwrap_err();
        assert!(err.to_string().contains("shared_prefix_epsilon"), "{err}");
        let err = RouterConfig::from_json(&json!({"sharedPrefixMinRequests": 0})).unwrap_err();
        assert!(
            err.to_string().contains("shared_prefix_min_requests"),
            "{err}"
        );
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let c = RouterConfig::seed();
        assert_eq!(c.affinity_gate_tau, 0.80);
        assert_eq!(c.epsilon_explore_sticky, 0.01);
        assert_eq!(c.affinity_max_ttft_penalty_ms, 5000.0);
        assert_eq!(c.block_size_tokens, 16);
        assert_eq!(c.lru_capacity_per_server, 31_250);
        assert_eq!(c.validate(), Ok(()));
    }

    #[test]
    fn camel_case_llmd_names_are_accepted() {
        let c = RouterConfig::from_json(&json!({
            "affinityGateTau": 0.9, "epsilonExploreSticky": 0.0, "affinityMaxTTFTPenaltyMs": 100
        }))
        .unwrap();
        assert_eq!(c.affinity_gate_tau, 0.9);
        assert_eq!(c.epsilon_explore_sticky, 0.0);
        assert_eq!(c.affinity_max_ttft_penalty_ms, 100.0);
    }

    #[test]
    fn removed_values_are_refused_naming_the_key_and_the_default() {
        for (config, key, instead) in [
            (
                json!({"affinity_gate_tau": "auto"}),
                "affinity_gate_tau = \"auto\"",
                "0.80",
            ),
            (
                json!({"affinityGateTau": "auto"}),
                "affinity_gate_tau = \"auto\"",
                "0.80",
            ),
            (
                json!({"epsilonExploreSticky": "auto", "experimental_options": true}),
                "epsilon_explore_sticky = \"auto\"",
                "0.01",
            ),
            (
                json!({"explore_mode": "least-loaded-non-sticky"}),
                "explore_mode = \"least-loaded-non-sticky\"",
                "\"random-non-sticky\"",
            ),
            (
                json!({"exploreMode": "random-if-no-sticky", "gate_profile": "seed"}),
                "explore_mode = \"random-if-no-sticky\"",
                "\"best-overall\"",
            ),
        ] {
            let err = RouterConfig::from_json(&config).unwrap_err().to_string();
            assert!(
                err.contains(&format!("{key} was removed on 2026-12-07")),
                "{err}"
            );
            assert!(err.contains("docs/decisions/"), "{err}");
            assert!(err.contains(instead), "{err}");
            // The file path (serde) says the same.
            let err = serde_json::from_value::<RouterConfig>(config).unwrap_err();
            assert!(err.to_string().contains(key), "{err}");
        }
    }

    #[test]
    fn the_removed_predictor_model_key_is_refused_in_either_spelling_unless_it_names_rls() {
        for config in [
            json!({"predictor_model": "rls"}),
            json!({"predictorModel": "rls"}),
        ] {
            assert_eq!(
                RouterConfig::from_json(&config).unwrap(),
                RouterConfig::default()
            );
        }
        for config in [
            json!({"predictor_model": "gbdt"}),
            json!({"predictorModel": "rls-split"}),
        ] {
            let err = RouterConfig::from_json(&config).unwrap_err().to_string();
            assert!(
                err.contains("predictor_model was removed on 2026-12-07"),
                "{err}"
            );
            assert!(err.contains("leave the key out"), "{err}");
        }
    }

    #[test]
    fn session_affinity_keys_are_refused_unless_they_name_the_old_default_in_either_spelling() {
        for (key, off, on) in [
            ("session_affinity_ttl_ms", json!(0), json!(600_000)),
            ("sessionAffinityTtlMs", json!(0.0), json!(1)),
            ("session_affinity_floor", json!(0.9), json!(0.5)),
            ("sessionAffinityFloor", json!(0.9), json!(1.0)),
        ] {
            // The old default (session affinity off, its floor) keeps working and changes nothing.
            let c = RouterConfig::from_json(&json!({ key: off })).unwrap();
            assert_eq!(c, RouterConfig::default(), "{key}");
            let via_serde: RouterConfig = serde_json::from_value(json!({ key: off })).unwrap();
            assert_eq!(via_serde, RouterConfig::default(), "{key}");
            // Anything else is refused, naming the key, the record and what to do, with or
            // without the experimental switch.
            for config in [
                json!({ key: on }),
                json!({ key: on, "experimental_options": true }),
            ] {
                let err = RouterConfig::from_json(&config).unwrap_err().to_string();
                let name = if key.to_lowercase().contains("floor") {
                    "session_affinity_floor"
                } else {
                    "session_affinity_ttl_ms"
                };
                assert!(
                    err.contains(&format!("{name} was removed on 2026-12-07")),
                    "{err}"
                );
                assert!(err.contains("docs/decisions/session-affinity.md"), "{err}");
                assert!(err.contains("leave the key out"), "{err}");
            }
        }
        // The removed keys are still known names (layered configs rename their aliases).
        assert_eq!(
            router_key_name("sessionAffinityTtlMs"),
            Some("session_affinity_ttl_ms")
        );
        // Nothing needs the experimental switch now; setting it is accepted and ignored.
        for on in [true, false] {
            let c = RouterConfig::from_json(&json!({ "experimentalOptions": on })).unwrap();
            assert_eq!(c, RouterConfig::default());
        }
    }

    #[test]
    fn other_words_than_a_number_are_rejected_for_tau_and_epsilon() {
        for bad in [json!("Auto"), json!("0.8"), json!(true), json!(null)] {
            let err = RouterConfig::from_json(&json!({"affinity_gate_tau": bad})).unwrap_err();
            assert!(matches!(err, ConfigError::Parse(_)), "{bad}: {err}");
        }
        let err =
            RouterConfig::from_json(&json!({"epsilonExploreSticky": "sometimes"})).unwrap_err();
        assert!(
            err.to_string()
                .contains("epsilon_explore_sticky: expected a number"),
            "{err}"
        );
        let err = RouterConfig::from_json(&json!({"explore_mode": "everywhere"})).unwrap_err();
        assert!(err.to_string().contains("random-non-sticky"), "{err}");
    }

    #[test]
    fn predictor_drift_adaptation_is_refused_on_and_accepted_off_in_either_spelling() {
        for key in ["predictor_drift_adaptation", "predictorDriftAdaptation"] {
            let err = RouterConfig::from_json(&json!({ key: true })).unwrap_err();
            assert!(
                err.to_string()
                    .contains("predictor_drift_adaptation was removed on 2026-12-07"),
                "{err}"
            );
            assert!(
                err.to_string().contains("predictor-drift-adaptation.md"),
                "{err}"
            );
            // Off was both profiles' value: a config naming it keeps working.
            let c = RouterConfig::from_json(&json!({ key: false })).unwrap();
            assert_eq!(c, RouterConfig::default());
        }
    }

    #[test]
    fn out_of_range_values_are_rejected_with_the_key() {
        let err = RouterConfig::from_json(&json!({"affinity_gate_tau": 1.5})).unwrap_err();
        assert!(err.to_string().contains("affinity_gate_tau"), "{err}");
        let err = RouterConfig::from_json(&json!({"epsilon_explore_sticky": -0.1})).unwrap_err();
        assert!(err.to_string().contains("epsilon_explore_sticky"), "{err}");
        let err =
            RouterConfig::from_json(&json!({"affinity_max_ttft_penalty_ms": -1})).unwrap_err();
        assert!(
            err.to_string().contains("affinity_max_ttft_penalty_ms"),
            "{err}"
        );
    }

    #[test]
    fn issue_20_gate_options_have_their_profile_values_and_read_in_either_spelling() {
        for c in [RouterConfig::seed(), RouterConfig::default()] {
            assert_eq!(c.balance_window_ms, 0.0);
            assert_eq!(c.balance_window_rel, 0.0);
        }
        assert_eq!(
            RouterConfig::seed().relative_gate_queue_rule,
            QueueRule::Off
        );
        assert_eq!(
            RouterConfig::default().relative_gate_queue_rule,
            QueueRule::Every
        );
        let c = RouterConfig::from_json(&json!({"balance_window_ms": 4, "balance_window_rel": 0.3,
                "relative_gate_queue_rule": "target"}))
        .unwrap();
        assert_eq!((c.balance_window_ms, c.balance_window_rel), (4.0, 0.3));
        assert_eq!(c.relative_gate_queue_rule, QueueRule::Target);
        let c = RouterConfig::from_json(&json!({"gateProfile": "seed", "balanceWindowMs": 2,
                "relativeGateQueueRule": "every"}))
        .unwrap();
        assert_eq!(c.balance_window_ms, 2.0);
        assert_eq!(c.relative_gate_queue_rule, QueueRule::Every);
        for key in ["balance_window_ms", "balance_window_rel"] {
            let err = RouterConfig::from_json(&json!({ key: -1 })).unwrap_err();
            assert!(err.to_string().contains(key), "{err}");
        }
        assert!(RouterConfig::from_json(&json!({"relative_gate_queue_rule": "all"})).is_err());
    }

    #[test]
    fn seed_profile_is_the_specified_gate_and_explicit_keys_override_it() {
        let c = RouterConfig::from_json(&json!({"gate_profile": "seed"})).unwrap();
        assert_eq!(c, RouterConfig::seed());
        assert_eq!(c.explore_mode, ExploreMode::BestOverall);
        assert_eq!(c.affinity_relative_penalty, 0.0);
        assert!(!c.load_break_pays_prefill);
        let c =
            RouterConfig::from_json(&json!({"gateProfile": "seed", "loadBreakPaysPrefill": true}))
                .unwrap();
        assert!(c.load_break_pays_prefill);
        let c = RouterConfig::from_json(&json!({"gateProfile": "seed", "balanceWindowMs": 20}))
            .unwrap();
        assert_eq!(c.balance_window_ms, 20.0);
        assert_eq!(c.explore_mode, ExploreMode::BestOverall);
    }

    #[test]
    fn cold_spread_window_is_refused_when_set_and_accepted_at_zero_in_either_spelling() {
        for key in ["cold_spread_window_ms", "coldSpreadWindowMs"] {
            let err = RouterConfig::from_json(&json!({ key: 20 })).unwrap_err();
            assert!(
                err.to_string()
                    .contains("cold_spread_window_ms was removed on 2026-12-07"),
                "{err}"
            );
            assert!(err.to_string().contains("cold-spread-window.md"), "{err}");
            let c = RouterConfig::from_json(&json!({ key: 0 })).unwrap();
            assert_eq!(c, RouterConfig::default());
        }
    }

    #[test]
    fn deserialize_starts_from_the_named_profile_and_lays_given_keys_over_it() {
        // What `kvgate serve --config` and its reload read: plain serde, no `from_json`.
        let c: RouterConfig = serde_json::from_str(r#"{"gate_profile": "seed"}"#).unwrap();
        assert_eq!(c, RouterConfig::seed());
        let c: RouterConfig =
            serde_json::from_str(r#"{"gateProfile": "seed", "explore_max_extra_ms": 7}"#).unwrap();
        assert_eq!(
            c,
            RouterConfig {
                explore_max_extra_ms: 7.0,
                ..RouterConfig::seed()
            }
        );
        let c: RouterConfig = serde_json::from_str(r#"{"exploreMode": "best-overall"}"#).unwrap();
        assert_eq!(
            c,
            RouterConfig {
                explore_mode: ExploreMode::BestOverall,
                ..RouterConfig::default()
            }
        );
        let c: RouterConfig = serde_json::from_str("{}").unwrap();
        assert_eq!(c, RouterConfig::default());
    }

    #[test]
    fn deserialize_and_from_json_read_every_key_alike() {
        let v = json!({
            "gate_profile": "seed", "affinityGateTau": 0.5, "affinity_relative_penalty": 2,
            "prefixWeight": 1, "cache_threshold": 0.5, "blockSizeTokens": 32,
            "exploreMode": "random-non-sticky",
            "experimental_options": true
        });
        let via_serde: RouterConfig = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(via_serde, RouterConfig::from_json(&v).unwrap());
        assert_eq!(via_serde.gate_profile, GateProfile::Seed);
        assert_eq!(via_serde.affinity_gate_tau, 0.5);
        assert_eq!(via_serde.affinity_relative_penalty, 2.0);
        assert_eq!(via_serde.weighted_prefix_weight, 1.0);
        assert_eq!(via_serde.block_size_tokens, 32);
        assert_eq!(via_serde.explore_mode, ExploreMode::RandomNonSticky);
    }

    #[test]
    fn a_serialised_config_reads_back_unchanged() {
        for c in [
            RouterConfig::seed(),
            RouterConfig::default(),
            RouterConfig {
                affinity_gate_tau: 0.5,
                balance_window_ms: 20.0,
                ..RouterConfig::seed()
            },
        ] {
            let back: RouterConfig =
                serde_json::from_value(serde_json::to_value(c).unwrap()).unwrap();
            assert_eq!(back, c);
        }
    }

    #[test]
    fn deserialize_rejects_out_of_range_values_null_and_unknown_keys() {
        let err =
            serde_json::from_str::<RouterConfig>(r#"{"affinity_gate_tau": 1.5}"#).unwrap_err();
        assert!(err.to_string().contains("affinity_gate_tau"), "{err}");
        for null_key in ["explore_mode", "affinity_gate_tau", "block_size_tokens"] {
            let text = format!(r#"{{"{null_key}": null}}"#);
            assert!(
                serde_json::from_str::<RouterConfig>(&text).is_err(),
                "{text}"
            );
        }
        let err = serde_json::from_str::<RouterConfig>(r#"{"gate_profile": "seeed"}"#).unwrap_err();
        assert!(err.to_string().contains("seeed"), "{err}");
        let err =
            serde_json::from_str::<RouterConfig>(r#"{"affinity_gate_tua": 0.5}"#).unwrap_err();
        assert!(err.to_string().contains("affinity_gate_tua"), "{err}");
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let err = RouterConfig::from_json(&json!({"affinity_gate_tua": 0.5})).unwrap_err();
        assert!(matches!(err, ConfigError::Parse(_)), "{err}");
    }
}
