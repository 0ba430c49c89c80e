//! `kvgate sim`: replay a workload through a simulated fleet, for every chosen policy, seed and
//! load, in parallel; print a table, and optionally write JSON and an HTML report.
//!
//! Runs are independent and seeded, and results are stored by run index, so the output does not
//! depend on the number of threads.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use kvgate_core::RouterConfig;
use kvgate_core::policy::PolicyKind;
use kvgate_sim::SimRequest;
use kvgate_sim::cluster::{self, ClusterConfig, DEFAULT_SCRAPE_INTERVAL_MS};
use kvgate_sim::events::{IndexConfig, IndexMode, LossRecovery};
use kvgate_sim::models::{FleetModel, ModelFleet};
use kvgate_sim::profiles::Profile;
use kvgate_sim::report::RunMetrics;
use kvgate_sim::workload::{self, Workload, agent, burst, chat, shared_prefix};
use serde::Serialize;

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum GeneratedWorkload {
    /// Multi-turn chat sessions with per-tenant system prompts.
    Chat,
    /// llm-d's shared-prefix scenarios (see --preset).
    SharedPrefix,
    /// Agent sessions: tool calls, tool pauses of seconds, parallel calls.
    Agent,
    /// Bursts of 3–8 siblings sharing a new 1,200-token prefix, arriving within 50 ms.
    Burst,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SimIndexMode {
    Routed,
    Engine,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum SimLossRecovery {
    Replay,
    Stale,
}

#[derive(Debug, Args)]
pub struct SimArgs {
    /// Trace file: Mooncake JSONL or Azure CSV (detected from the content).
    #[arg(long, conflicts_with = "workload")]
    trace: Option<PathBuf>,
    /// A generated workload instead of a trace.
    #[arg(long, value_enum)]
    workload: Option<GeneratedWorkload>,
    /// Preset of the shared-prefix workload: A, B, C or D.
    #[arg(long, default_value = "A")]
    preset: String,
    /// Seed of a generated workload (the same workload for every run).
    #[arg(long, default_value_t = 1)]
    workload_seed: u64,
    /// Policies, comma-separated, or `all`.
    #[arg(long, default_value = "affinity-gate")]
    policy: String,
    /// Multiplies the arrival rate.
    #[arg(long, default_value_t = 1.0)]
    rate_scale: f64,
    /// Sweep a parameter: `rate-scale=a,b,c` (replaces --rate-scale).
    #[arg(long)]
    sweep: Option<String>,
    /// Replay only the first N requests.
    #[arg(long)]
    max_requests: Option<usize>,
    /// Pods in the fleet.
    #[arg(long, default_value_t = 8)]
    pods: u32,
    /// Engine profile of every pod: a built-in name, or a JSON file (`*.json`, e.g. written by
    /// `scripts/real-vllm/calibrate.py --profile-out` after measuring a real engine).
    #[arg(long, default_value = Profile::DEFAULT_NAME)]
    profile: String,
    /// A mixed fleet, `profile:count,...` (e.g. `llama3-8b-h100:4,llama3-8b-a100:4`);
    /// overrides --pods and --profile. Each pod's predictor class is its profile's name.
    #[arg(long)]
    pod_profiles: Option<String>,
    /// Ablation: give every pod the same predictor class, so one model serves a mixed fleet
    /// (of profiles, or of models with --fleet-model).
    #[arg(long)]
    class_blind_predictor: bool,
    /// A mixed-model fleet, one flag per model: `NAME:PODS[:PROFILE][:share=S]` (PROFILE
    /// defaults to --profile; S: the model's share of the conversations, given for every model
    /// or none, default in proportion to the pods), e.g. `--fleet-model llama-8b:4
    /// --fleet-model llama-70b:4:llama3-70b-h100-tp4`. Overrides --pods and --profile. Each
    /// conversation names one model (drawn with --workload-seed); a request is routed only
    /// among its model's pods.
    #[arg(
        long = "fleet-model",
        value_name = "NAME:PODS[:PROFILE][:share=S]",
        conflicts_with = "pod_profiles"
    )]
    fleet_model: Vec<String>,
    /// Prefill/decode disaggregation, `P:D`: the first P pods are prefill pods, the next D
    /// decode pods, the rest `both` (e.g. `--pods 4 --pd 1:3`); requests are split as the
    /// gateway splits them, the policy picking the prefill pod.
    #[arg(long, value_name = "P:D")]
    pd: Option<String>,
    /// P/D: KV transfer time per prompt token, ms (default: 128 KiB per token of an 8B
    /// Llama-3 over 25 GB/s).
    #[arg(long, default_value_t = kvgate_sim::cluster::DEFAULT_TRANSFER_MS_PER_TOKEN)]
    transfer_ms_per_token: f64,
    /// Override the profile's KV blocks per pod.
    #[arg(long)]
    kv_blocks: Option<u32>,
    /// Decision seeds (repeat the flag or comma-separate).
    #[arg(long, value_delimiter = ',', default_value = "1")]
    seed: Vec<u64>,
    /// Pod metrics refresh interval in milliseconds.
    #[arg(long, default_value_t = DEFAULT_SCRAPE_INTERVAL_MS)]
    scrape_interval: f64,
    /// Affinity-gate parameter base: `seed` (the specified gate) or `default` (kvgate's).
    #[arg(long)]
    gate_profile: Option<String>,
    /// Ablation: hide the KV-shortfall (memory pressure) feature from the TTFT predictor.
    #[arg(long)]
    no_kv_shortfall: bool,
    /// Removed on 2026-12-07 (docs/decisions/predictor-drift-adaptation.md); kept hidden only to
    /// refuse it with a message that says so.
    #[arg(long, hide = true)]
    drift_adaptation: bool,
    /// Pod outages: `POD@DOWN_S-UP_S,...` (e.g. `3@60-90`) or `every=PERIOD_S,down=DOWN_S[,start=S]`
    /// (one pod after another, round-robin). Requests on a dying pod are retried before their
    /// first token, failed after it; the report adds a TTFT timeline.
    #[arg(long)]
    faults: Option<String>,
    /// Removed on 2026-12-07 (the predictor is always `rls`); kept hidden only to accept `rls`
    /// and refuse the other old values with a message that says so.
    #[arg(long, hide = true)]
    predictor_model: Option<String>,
    /// TTFT samples a pod class needs before its regressor replaces the analytic estimate
    /// (overrides the router config's `predictor_min_samples`: 32 in both profiles).
    #[arg(long)]
    predictor_min_samples: Option<u64>,
    /// The predictor learns each TTFT at the request's first token instead of at its end
    /// (forces the router config's `predictor_ttft_at_first_token` on: on in the default
    /// profile, off in the seed's; docs/decisions/predictor-ttft-at-first-token.md). To turn it off under the default
    /// profile: --router-config '{"predictor_ttft_at_first_token": false}'.
    #[arg(long)]
    learn_ttft_at_first_token: bool,
    /// Router parameters as a JSON object (snake_case or llm-d camelCase keys), e.g.
    /// '{"affinity_gate_tau": 0.9}'.
    #[arg(long)]
    router_config: Option<String>,
    /// Prefix index of the router: `routed` (learns from routing), `engine` (the pods' KV
    /// events), or both, comma-separated, to compare them in one run.
    #[arg(long, value_delimiter = ',', default_value = "routed")]
    index: Vec<SimIndexMode>,
    /// Engine index: delay from a pod's step end to its KV-event batch reaching the router, in
    /// ms (comma-separated to sweep).
    #[arg(long, value_delimiter = ',', default_value = "0")]
    event_delay_ms: Vec<f64>,
    /// Engine index: probability that a KV-event batch is lost, 0..1 (comma-separated to
    /// sweep); seeded by --seed.
    #[arg(long, value_delimiter = ',', default_value = "0")]
    event_loss: Vec<f64>,
    /// Engine index: what a lost batch costs once the pod's next batch reveals the gap:
    /// `replay` (fetched again, as the gateway does) or `stale` (the pod falls back to the
    /// routed index for 30 s while new events rebuild it).
    #[arg(long, value_enum, default_value = "replay")]
    event_loss_recovery: SimLossRecovery,
    /// A TTFT objective every request carries (as the gateway's `x-slo-ttft-ms`): the table
    /// gains goodput (share of requests meeting every SLO); kvgate's gate does not route by it
    /// (`llmd-chain`, modelling llm-d, does, as upstream).
    #[arg(long)]
    slo_ttft_ms: Option<f64>,
    /// A TPOT objective every request carries (as `x-slo-tpot-ms`).
    #[arg(long)]
    slo_tpot_ms: Option<f64>,
    /// Removed on 2026-12-07 (docs/decisions/slo-routing.md); kept hidden only to refuse it with
    /// a message that says so.
    #[arg(long, hide = true)]
    slo_routing: bool,
    /// Router replicas behind a round-robin load balancer (request i → replica i mod N); each
    /// sees only its own requests unless --share.
    #[arg(long, default_value_t = 1)]
    replicas: u32,
    /// The replicas share routing state as `kvgate serve --cluster` does (routes with their
    /// blocks, first tokens, decode tokens, finishes, snapshots every second).
    #[arg(long)]
    share: bool,
    /// With --share: publish-to-apply delay of every shared event, ms.
    #[arg(long, default_value_t = 1.0)]
    share_delay_ms: f64,
    /// With --share: probability that one shared event is lost on its way to one replica.
    #[arg(long, default_value_t = 0.0)]
    share_loss: f64,
    /// With --replicas N: each replica scrapes the pods on its own clock (replica k at k ×
    /// interval / N past the shared schedule), as live replicas do, instead of all reading
    /// one scrape.
    #[arg(long)]
    staggered_scrapes: bool,
    /// With --share: do not share the predictor's training samples (`cluster_share_samples =
    /// false`): each replica's predictor learns only from its own requests.
    #[arg(long)]
    share_no_samples: bool,
    /// Chat workload: LoRA adapters (tenant t's requests name `adapter-{t mod N}`; their
    /// prefix chains are per adapter). 0: the base model.
    #[arg(long, default_value_t = 0)]
    chat_adapters: u32,
    /// Tenants of the chat workload (default 8).
    #[arg(long)]
    chat_tenants: Option<u32>,
    /// Chat and agent workloads: end a session before a prompt longer than this many tokens
    /// (default 32768), as `kvgate loadgen --max-context-tokens`.
    #[arg(long)]
    max_context_tokens: Option<u32>,
    /// Agent workload: replace each session's history by a 400-token summary after every N-th
    /// step (0: never), as agent clients compact long contexts.
    #[arg(long, default_value_t = 0)]
    agent_compact_every: u32,
    /// Every pod serves LoRA adapters with this many slots (vLLM `--max-loras`); unset: no LoRA.
    #[arg(long)]
    max_loras: Option<u32>,
    /// With --max-loras: ms a step that loads an adapter into a slot takes longer.
    #[arg(long, default_value_t = 25.0)]
    lora_load_ms: f64,
    /// Worker threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Write the results as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write a self-contained HTML report with plots.
    #[arg(long)]
    html: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

#[derive(Debug, Serialize)]
struct SimReport<'a> {
    workload: &'a Workload,
    pods: u32,
    profile: &'a str,
    scrape_interval_ms: f64,
    router_config: RouterConfig,
    /// A mixed-model fleet's models (`--fleet-model`), in the order given.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    fleet_models: Vec<FleetModelReport>,
    runs: &'a [RunMetrics],
}

/// One `--fleet-model` in the JSON report.
#[derive(Debug, Serialize)]
struct FleetModelReport {
    model: String,
    pods: u32,
    profile: String,
    /// Its share of the conversations (given or from the pods), and the conversations and
    /// requests that drew it.
    share: f64,
    conversations: u64,
    requests: u64,
}

/// `name:count,...` into one profile per pod, in the order given.
/// `--pd P:D` → the pods' roles: P prefill, D decode, the rest `both`.
fn parse_pd(spec: &str, pods: u32) -> Result<Vec<kvgate_core::PodRole>> {
    use kvgate_core::PodRole;
    let parsed = spec
        .split_once(':')
        .and_then(|(p, d)| Some((p.trim().parse::<u32>().ok()?, d.trim().parse::<u32>().ok()?)));
    let Some((p, d)) = parsed else {
        bail!("--pd {spec:?}: expected P:D, e.g. 1:3");
    };
    if p == 0 || d == 0 || p + d > pods {
        bail!("--pd {spec:?}: needs at least one prefill and one decode pod, {pods} pods at most");
    }
    let mut roles = vec![PodRole::Prefill; p as usize];
    roles.extend(std::iter::repeat_n(PodRole::Decode, d as usize));
    roles.resize(pods as usize, PodRole::Both);
    Ok(roles)
}

fn parse_pod_profiles(list: &str) -> Result<Vec<&'static Profile>> {
    let mut fleet = Vec::new();
    for item in list.split(',') {
        let (name, count) = item
            .trim()
            .split_once(':')
            .with_context(|| format!("--pod-profiles item {item:?} is not `profile:count`"))?;
        let profile = profile_by_name(name.trim())?;
        let count: usize = count
            .trim()
            .parse()
            .with_context(|| format!("bad pod count in {item:?}"))?;
        fleet.extend(std::iter::repeat_n(profile, count));
    }
    if fleet.is_empty() {
        bail!("--pod-profiles gives no pods");
    }
    Ok(fleet)
}

/// `--fleet-model` values into a fleet (`default_profile` where none is named).
fn parse_fleet_models(specs: &[String], default_profile: &'static Profile) -> Result<ModelFleet> {
    let models = specs
        .iter()
        .map(|spec| FleetModel::parse(spec, default_profile))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(ModelFleet::new(models)?)
}

/// `4 × llama3-8b-h100 (llama-8b) + 4 × llama3-70b-h100-tp4 (llama-70b)`.
fn models_label(fleet: &ModelFleet) -> String {
    fleet
        .models()
        .iter()
        .map(|m| format!("{} × {} ({})", m.pods, m.profile.name, m.name))
        .collect::<Vec<_>>()
        .join(" + ")
}

fn profile_by_name(name: &str) -> Result<&'static Profile> {
    Ok(Profile::resolve(name)?)
}

/// `4 × llama3-8b-h100 + 4 × llama3-8b-a100`, runs of equal profiles collapsed.
fn fleet_label(fleet: &[&'static Profile]) -> String {
    let mut parts: Vec<(usize, &str)> = Vec::new();
    for p in fleet {
        match parts.last_mut() {
            Some((n, name)) if *name == p.name => *n += 1,
            _ => parts.push((1, p.name)),
        }
    }
    parts
        .iter()
        .map(|(n, name)| format!("{n} × {name}"))
        .collect::<Vec<_>>()
        .join(" + ")
}

fn parse_policies(list: &str) -> Result<Vec<PolicyKind>> {
    if list == "all" {
        return Ok(PolicyKind::ALL.to_vec());
    }
    list.split(',')
        .map(|name| {
            PolicyKind::from_name(name.trim()).with_context(|| {
                let names: Vec<_> = PolicyKind::ALL.iter().map(|k| k.name()).collect();
                format!(
                    "unknown policy {name:?}; expected `all` or some of {}",
                    names.join(", ")
                )
            })
        })
        .collect()
}

fn parse_rates(args: &SimArgs) -> Result<Vec<f64>> {
    let rates = match &args.sweep {
        None => vec![args.rate_scale],
        Some(s) => {
            let Some(list) = s.strip_prefix("rate-scale=") else {
                bail!("--sweep supports `rate-scale=a,b,c`, got {s:?}");
            };
            list.split(',')
                .map(|x| {
                    x.trim()
                        .parse::<f64>()
                        .with_context(|| format!("bad rate scale {x:?}"))
                })
                .collect::<Result<Vec<_>>>()?
        }
    };
    if let Some(bad) = rates.iter().find(|r| !(r.is_finite() && **r > 0.0)) {
        bail!("rate scales must be finite and > 0, got {bad}");
    }
    Ok(rates)
}

/// The index configurations to run: routed once, engine once per delay × loss.
fn index_configs(args: &SimArgs) -> Result<Vec<IndexConfig>> {
    if let Some(d) = args
        .event_delay_ms
        .iter()
        .find(|d| !(d.is_finite() && **d >= 0.0))
    {
        bail!("--event-delay-ms must be finite and >= 0, got {d}");
    }
    if let Some(p) = args.event_loss.iter().find(|p| !(0.0..=1.0).contains(*p)) {
        bail!("--event-loss must lie in 0..=1, got {p}");
    }
    let recovery = match args.event_loss_recovery {
        SimLossRecovery::Replay => LossRecovery::Replay,
        SimLossRecovery::Stale => LossRecovery::Stale,
    };
    let mut out = Vec::new();
    for mode in &args.index {
        match mode {
            SimIndexMode::Routed => out.push(IndexConfig::default()),
            SimIndexMode::Engine => {
                for &delay_ms in &args.event_delay_ms {
                    for &loss in &args.event_loss {
                        out.push(IndexConfig {
                            mode: IndexMode::Engine,
                            delay_ms,
                            loss,
                            recovery,
                            ..IndexConfig::default()
                        });
                    }
                }
            }
        }
    }
    Ok(out)
}

fn load_workload(args: &SimArgs) -> Result<(Workload, Vec<SimRequest>)> {
    let max = args.max_requests;
    let (mut workload, mut requests) = match (&args.trace, args.workload) {
        (Some(path), _) => workload::load_trace(path)?,
        (None, Some(GeneratedWorkload::Chat)) => chat::generate(&chat::ChatParams {
            seed: args.workload_seed,
            max_requests: max.unwrap_or(chat::ChatParams::default().max_requests),
            adapters: args.chat_adapters,
            tenants: args
                .chat_tenants
                .unwrap_or(chat::ChatParams::default().tenants),
            max_context_tokens: args
                .max_context_tokens
                .unwrap_or(chat::ChatParams::default().max_context_tokens),
            ..chat::ChatParams::default()
        })?,
        (None, Some(GeneratedWorkload::Agent)) => {
            let d = agent::AgentParams::default();
            agent::generate(&agent::AgentParams {
                seed: args.workload_seed,
                max_requests: max.unwrap_or(d.max_requests),
                max_context_tokens: args.max_context_tokens.unwrap_or(d.max_context_tokens),
                compact_every: args.agent_compact_every,
                ..d
            })?
        }
        (None, Some(GeneratedWorkload::Burst)) => {
            let d = burst::BurstParams::default();
            burst::generate(&burst::BurstParams {
                seed: args.workload_seed,
                max_requests: max.unwrap_or(d.max_requests),
                ..d
            })?
        }
        (None, Some(GeneratedWorkload::SharedPrefix)) => {
            let preset =
                shared_prefix::SharedPrefixParams::preset(&args.preset).with_context(|| {
                    format!("unknown preset {:?}; expected A, B, C or D", args.preset)
                })?;
            shared_prefix::generate(&shared_prefix::SharedPrefixParams {
                seed: args.workload_seed,
                max_requests: max.unwrap_or(preset.max_requests),
                ..preset
            })?
        }
        (None, None) => bail!("give --trace FILE or --workload chat|shared-prefix|agent|burst"),
    };
    if let Some(n) = max
        && requests.len() > n
    {
        requests.truncate(n);
        workload.request_count = n;
    }
    Ok((workload, requests))
}

pub fn run(args: SimArgs) -> Result<()> {
    if let Some(model) = args.predictor_model.as_ref().filter(|m| *m != "rls") {
        bail!(
            "{}",
            kvgate_core::config::removed(
                &format!("--predictor-model {model}"),
                "docs/decisions/predictor-tree-and-analytic-models.md and predictor-rls-variants.md: \
                 the gate routed best with `rls`, now the only model; drop the flag"
            )
        );
    }
    if args.slo_routing {
        bail!(
            "{}",
            kvgate_core::config::removed(
                "--slo-routing",
                "docs/decisions/slo-routing.md: upstream's tightest-fit headroom pick lowered \
                 goodput at every load measured; --slo-ttft-ms / --slo-tpot-ms still measure \
                 goodput; drop the flag"
            )
        );
    }
    if args.drift_adaptation {
        bail!(
            "{}",
            kvgate_core::config::removed(
                "--drift-adaptation",
                "docs/decisions/predictor-drift-adaptation.md: adapting on drift episodes tipped \
                 the Mooncake trace into growing queues and helped no routing measurement; drop \
                 the flag"
            )
        );
    }
    let policies = parse_policies(&args.policy)?;
    let rates = parse_rates(&args)?;
    let profile = profile_by_name(&args.profile)?;
    if args.pods == 0 {
        bail!("--pods must be at least 1");
    }
    let mut models = match args.fleet_model.is_empty() {
        true => None,
        false => Some(parse_fleet_models(&args.fleet_model, profile)?),
    };
    let fleet = match (&args.pod_profiles, &models) {
        (_, Some(models)) => models.pod_profiles(),
        (Some(list), None) => parse_pod_profiles(list)?,
        (None, None) => vec![profile; args.pods as usize],
    };
    let pods = fleet.len() as u32;
    if args.index.contains(&SimIndexMode::Engine)
        && let Some(p) = fleet.iter().find(|p| p.block_size_tokens != 16)
    {
        bail!(
            "--index engine needs engines with 16-token blocks; profile {:?} has {}-token blocks \
             (its KV events would name blocks the router does not hash): use --index routed",
            p.name,
            p.block_size_tokens
        );
    }
    let pod_roles = match &args.pd {
        Some(spec) => parse_pd(spec, pods)?,
        None => Vec::new(),
    };
    if !(args.transfer_ms_per_token.is_finite() && args.transfer_ms_per_token >= 0.0) {
        bail!("--transfer-ms-per-token must be a finite number ≥ 0");
    }
    // The report's `profile`: the profile's name for a uniform fleet (as before), the mix else.
    let label = match (&args.pod_profiles, &models) {
        (_, Some(models)) => models_label(models),
        (Some(_), None) => fleet_label(&fleet),
        (None, None) => profile.name.to_string(),
    };
    let mut router_json: serde_json::Value = match &args.router_config {
        Some(json) => serde_json::from_str(json).context("--router-config is not JSON")?,
        None => serde_json::json!({}),
    };
    // --gate-profile is the profile unless --router-config names one.
    if let (Some(profile), Some(obj)) = (&args.gate_profile, router_json.as_object_mut())
        && !obj.contains_key("gate_profile")
        && !obj.contains_key("gateProfile")
    {
        obj.insert("gate_profile".into(), profile.as_str().into());
    }
    let mut router = RouterConfig::from_json(&router_json)?;
    let faults = args
        .faults
        .as_deref()
        .map(kvgate_sim::faults::FaultPlan::parse)
        .transpose()?;
    let indexes = index_configs(&args)?;
    let slo = kvgate_core::policy::RequestSlo {
        ttft_ms: args.slo_ttft_ms,
        tpot_ms: args.slo_tpot_ms,
    };
    if slo.sanitized() != slo {
        bail!("--slo-ttft-ms / --slo-tpot-ms must be finite and > 0");
    }
    if let Some(n) = args.predictor_min_samples {
        router.predictor_min_samples = n;
    }
    router.predictor_ttft_at_first_token |= args.learn_ttft_at_first_token;
    let (workload, mut requests) = load_workload(&args)?;
    let mut fleet_models = Vec::new();
    if let Some(models) = &mut models {
        let conversations = kvgate_sim::models::assign(models, &mut requests, args.workload_seed);
        let requests_per_model = models.requests_per_model();
        for (i, (m, share)) in models.models().iter().zip(models.shares()).enumerate() {
            fleet_models.push(FleetModelReport {
                model: m.name.clone(),
                pods: m.pods,
                profile: m.profile.name.to_string(),
                share,
                conversations: conversations.get(i).copied().unwrap_or(0),
                requests: requests_per_model.get(i).copied().unwrap_or(0),
            });
        }
    }
    let models = models.map(Arc::new);

    let mut configs = Vec::new();
    for &rate_scale in &rates {
        for &policy in &policies {
            for &index in &indexes {
                for &seed in &args.seed {
                    configs.push(ClusterConfig {
                        pods,
                        profile,
                        pod_profiles: fleet.clone(),
                        class_blind_predictor: args.class_blind_predictor,
                        kv_blocks: args.kv_blocks,
                        scrape_interval_ms: args.scrape_interval,
                        router,
                        rate_scale,
                        slo,
                        predictor: kvgate_core::predictor::PredictorConfig {
                            kv_shortfall_feature: !args.no_kv_shortfall,
                            ..kvgate_core::predictor::PredictorConfig::for_router(&router)
                        },
                        index,
                        faults: faults.clone(),
                        replicas: args.replicas.max(1),
                        sharing: args.share.then_some(kvgate_sim::cluster::Sharing {
                            delay_ms: args.share_delay_ms.max(0.0),
                            loss: args.share_loss.clamp(0.0, 1.0),
                            samples: !args.share_no_samples,
                        }),
                        staggered_scrapes: args.staggered_scrapes,
                        pod_roles: pod_roles.clone(),
                        transfer_ms_per_token: args.transfer_ms_per_token,
                        lora: args
                            .max_loras
                            .map(|max_loras| kvgate_sim::engine::LoraConfig {
                                max_loras,
                                load_ms: args.lora_load_ms.max(0.0),
                            }),
                        models: models.clone(),
                        ..ClusterConfig::new(pods, policy, seed)
                    });
                }
            }
        }
    }
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .clamp(1, configs.len().max(1));
    let bar = if args.quiet {
        indicatif::ProgressBar::hidden()
    } else {
        indicatif::ProgressBar::new(configs.len() as u64)
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} runs  {elapsed}  {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let next = AtomicUsize::new(0);
    let mut results: Vec<Option<RunMetrics>> = vec![None; configs.len()];
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(config) = configs.get(i) else { break };
                        let started = Instant::now();
                        let mut m = cluster::run(config, &requests);
                        m.sim_wall_s = started.elapsed().as_secs_f64();
                        m.policy = config.policy.name().to_string();
                        m.rate_scale = config.rate_scale;
                        m.seed = config.seed;
                        bar.inc(1);
                        done.push((i, m));
                    }
                    done
                })
            })
            .collect();
        for h in handles {
            if let Ok(done) = h.join() {
                for (i, m) in done {
                    results[i] = Some(m);
                }
            }
        }
    });
    bar.finish_and_clear();
    let runs: Vec<RunMetrics> = results.into_iter().flatten().collect();
    if runs.len() != configs.len() {
        bail!(
            "{} of {} runs failed",
            configs.len() - runs.len(),
            configs.len()
        );
    }

    print_table(&workload, pods, &label, &runs);
    print_faults(&runs);
    print_models(&runs);
    if args.index.contains(&SimIndexMode::Engine) {
        print_index_table(&runs, args.seed.len());
    }
    let report = SimReport {
        workload: &workload,
        pods,
        profile: &label,
        scrape_interval_ms: args.scrape_interval,
        router_config: router,
        fleet_models,
        runs: &runs,
    };
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&report)?;
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.html {
        let title = format!(
            "kvgate sim: {} on {label}",
            workload.source.as_deref().unwrap_or(workload.params.kind()),
        );
        let page = kvgate_sim::html::render_html(
            &title,
            &serde_json::to_value(&workload)?,
            pods,
            &label,
            &runs,
        );
        std::fs::write(path, page).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// Per run of a fleet of several models: each model's completions, TTFT and hit rate.
fn print_models(runs: &[RunMetrics]) {
    if runs.iter().all(|r| r.models.is_empty()) {
        return;
    }
    println!();
    println!(
        "{:<19} {:>5} {:>4} {:<20} {:>4} {:>6} {:>9} {:>9} {:>9} {:>9} {:>6} {:>5}",
        "policy",
        "rate",
        "seed",
        "model",
        "pods",
        "done",
        "ttft_mean",
        "ttft_p50",
        "ttft_p90",
        "ttft_p99",
        "hit%",
        "other"
    );
    for r in runs {
        for m in &r.models {
            println!(
                "{:<19} {:>5} {:>4} {:<20} {:>4} {:>6} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>6.1} {:>5}",
                r.policy,
                r.rate_scale,
                r.seed,
                m.model,
                m.pods,
                m.completed,
                m.ttft_ms.mean,
                m.ttft_ms.p50,
                m.ttft_ms.p90,
                m.ttft_ms.p99,
                m.prefix_hit_rate * 100.0,
                m.served_by_other_model,
            );
        }
    }
}

/// Per run with faults: outcome counts, steady vs during-outage TTFT, and the timeline.
fn print_faults(runs: &[RunMetrics]) {
    for r in runs {
        let Some(f) = &r.faults else { continue };
        println!(
            "\nfaults: {} ×{} seed {}: {} outages; {} requests, {} completed, {} rejected, {} failed ({} mid-stream, {} out of retries); {} dropped by crashes, {} retries",
            r.policy,
            r.rate_scale,
            r.seed,
            f.outages.len(),
            r.requests,
            r.completed,
            r.rejected,
            f.failed(),
            f.failed_mid_stream,
            f.failed_no_retry,
            f.dropped_by_crash,
            f.retried,
        );
        println!(
            "  TTFT mean/p99 ms: steady {:.1}/{:.1}, arrived during an outage {:.1}/{:.1}",
            f.ttft_steady_mean_ms,
            f.ttft_steady_p99_ms,
            f.ttft_during_mean_ms,
            f.ttft_during_p99_ms
        );
        println!(
            "  {:<30} {:>9} {:>6} {:>9} {:>9} {:>9}",
            "arrived", "completed", "failed", "ttft_mean", "ttft_p50", "ttft_p99"
        );
        for p in &f.phases {
            println!(
                "  {:<30} {:>9} {:>6} {:>9.1} {:>9.1} {:>9.1}",
                p.phase, p.completed, p.failed, p.ttft_mean_ms, p.ttft_p50_ms, p.ttft_p99_ms
            );
        }
        if f.timeline.len() > 40 {
            println!(
                "  ({} timeline windows of {} s: see --json `faults.timeline`)",
                f.timeline.len(),
                f.window_ms / 1000.0
            );
            continue;
        }
        println!(
            "  {:>7} {:>5} {:>7} {:>9} {:>6} {:>9} {:>9}",
            "t_s", "down", "arrived", "completed", "failed", "ttft_p50", "ttft_p99"
        );
        for w in &f.timeline {
            println!(
                "  {:>7.0} {:>5} {:>7} {:>9} {:>6} {:>9.1} {:>9.1}",
                w.t_s, w.pods_down, w.arrived, w.completed, w.failed, w.ttft_p50_ms, w.ttft_p99_ms
            );
        }
    }
}

fn print_table(workload: &Workload, pods: u32, fleet: &str, runs: &[RunMetrics]) {
    println!(
        "workload {} ({} requests), {pods} pods × {fleet}",
        workload.source.as_deref().unwrap_or(workload.params.kind()),
        workload.request_count,
    );
    println!(
        "{:<19} {:>5} {:>4} {:>6} {:>9} {:>9} {:>9} {:>9} {:>7} {:>6} {:>8} {:>5} {:>5} {:>7} {:>21} {:>6}",
        "policy",
        "rate",
        "seed",
        "done",
        "ttft_mean",
        "ttft_p50",
        "ttft_p90",
        "ttft_p99",
        "tpot50",
        "hit%",
        "tok/s",
        "busy%",
        "cv",
        "preempt",
        "gate e/x/n/l",
        "mape%"
    );
    let extras = |r: &RunMetrics| {
        let mut out = String::new();
        if let Some(g) = r.slo_goodput {
            out.push_str(&format!("  good% {:.1}", g * 100.0));
        }
        out
    };
    for r in runs {
        println!(
            "{:<19} {:>5} {:>4} {:>6} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>7.2} {:>6.1} {:>8.0} {:>5.1} {:>5.2} {:>7} {:>21} {:>6.1}{}",
            r.policy,
            r.rate_scale,
            r.seed,
            r.completed,
            r.ttft_ms.mean,
            r.ttft_ms.p50,
            r.ttft_ms.p90,
            r.ttft_ms.p99,
            r.tpot_ms.p50,
            r.prefix_hit_rate * 100.0,
            r.output_tok_per_s,
            r.mean_pod_busy * 100.0,
            r.load_imbalance_cv,
            r.preemptions,
            format!(
                "{}/{}/{}/{}",
                r.gate.explore, r.gate.exploit, r.gate.no_sticky, r.gate.load_break
            ),
            r.predictor.ttft_mape * 100.0,
            extras(r),
        );
    }
}

/// The prefix index's side of each run: mode, event delay and loss, hit rate and TTFT, how
/// often the index knew the chosen pod's cached prefix exactly, and the event counts; with
/// several seeds, a `mean` row after each group of seeds.
fn print_index_table(runs: &[RunMetrics], seeds: usize) {
    println!();
    println!(
        "{:<15} {:>5} {:>4} {:>6} {:>6} {:>6} {:>6} {:>9} {:>9} {:>7} {:>7} {:>8} {:>8} {:>6}",
        "policy",
        "rate",
        "seed",
        "index",
        "delay",
        "loss%",
        "hit%",
        "ttft_mean",
        "ttft_p99",
        "exact%",
        "err_blk",
        "batches",
        "lost",
        "stale"
    );
    // One row: (policy, rate, seed, index config) and the measured values.
    struct Row {
        hit: f64,
        mean: f64,
        p99: f64,
        exact: f64,
        err: f64,
        counts: [f64; 3],
    }
    let of = |r: &RunMetrics| {
        let k = r.kv_index.clone().unwrap_or_default();
        Row {
            hit: r.prefix_hit_rate,
            mean: r.ttft_ms.mean,
            p99: r.ttft_ms.p99,
            exact: k.decisions_exact as f64 / k.decisions.max(1) as f64,
            err: k.mean_abs_error_blocks,
            counts: [
                k.batches as f64,
                k.lost_batches as f64,
                k.stale_episodes as f64,
            ],
        }
    };
    let print = |r: &RunMetrics, seed: &str, v: &Row| {
        let k = r.kv_index.clone().unwrap_or_default();
        println!(
            "{:<15} {:>5} {:>4} {:>6} {:>6} {:>6.1} {:>6.1} {:>9.1} {:>9.1} {:>7.1} {:>7.2} {:>8.0} {:>8.0} {:>6.0}",
            r.policy,
            r.rate_scale,
            seed,
            k.config.mode.name(),
            k.config.delay_ms,
            k.config.loss * 100.0,
            v.hit * 100.0,
            v.mean,
            v.p99,
            v.exact * 100.0,
            v.err,
            v.counts[0],
            v.counts[1],
            v.counts[2],
        );
    };
    for group in runs.chunks(seeds.max(1)) {
        let rows: Vec<Row> = group.iter().map(of).collect();
        for (r, v) in group.iter().zip(&rows) {
            print(r, &r.seed.to_string(), v);
        }
        if let (Some(first), true) = (group.first(), group.len() > 1) {
            let n = rows.len() as f64;
            let mean = |f: &dyn Fn(&Row) -> f64| rows.iter().map(f).sum::<f64>() / n;
            let v = Row {
                hit: mean(&|v| v.hit),
                mean: mean(&|v| v.mean),
                p99: mean(&|v| v.p99),
                exact: mean(&|v| v.exact),
                err: mean(&|v| v.err),
                counts: [
                    mean(&|v| v.counts[0]),
                    mean(&|v| v.counts[1]),
                    mean(&|v| v.counts[2]),
                ],
            };
            print(first, "mean", &v);
        }
    }
}
