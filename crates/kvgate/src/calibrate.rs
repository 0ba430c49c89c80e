//! `kvgate calibrate --probe URL`: sweeps a pod with probes, fits the simulator's step-time
//! profile (`kvgate_sim::calibrate`, which plans the probes and does the fit) and writes it.
//!
//! This file is the driver only: it sends the probes as streamed `/v1/completions` requests
//! of random token ids (fresh ids never hit the prefix cache; a repeated prefix does), records
//! when each token arrives, reads the pod's KV capacity from `vllm:cache_config_info` on its
//! `/metrics` and `max_model_len` from `/v1/models`. The step budget and the sequence limit
//! are not served by vLLM: they come from `--max-num-batched-tokens` and `--max-num-seqs`.
//! The sweep stops at `--max-seconds` or `--max-requests`, whichever comes first (the fit
//! probes get 80 % of the time, the held-out ones the rest).
//!
//! `kvgate calibrate --from-capture FILE` fits the same terms passively, from a `kvgate serve
//! --capture` file's timing keys (`kvgate_sim::calibrate::passive`), holding every fifth
//! request out.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use futures_util::StreamExt;
use kvgate_sim::calibrate::{
    self, Observation, Probe, SweepLimits, Term, decode_observations, default_plan, passive,
    prefill_observation,
};
use kvgate_sim::profiles::Profile;
use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};

/// `kvgate calibrate` arguments.
#[derive(Debug, Args)]
pub struct CalibrateArgs {
    /// The pod to probe (`http://host:port`, vLLM's OpenAI server). It is loaded with up to
    /// --max-batch concurrent requests: probe a pod that serves no one else.
    #[arg(
        long,
        required_unless_present = "from_capture",
        conflicts_with = "from_capture"
    )]
    probe: Option<String>,
    /// Fit from served traffic instead: a `kvgate serve --capture` file with its timing keys
    /// (passive; every pod in it is taken to be the same engine). Needs --kv-blocks and
    /// --max-model-len; every fifth request is held out to check the fit.
    #[arg(long)]
    from_capture: Option<PathBuf>,
    /// With --from-capture: the pods' `max_model_len`.
    #[arg(long)]
    max_model_len: Option<u32>,
    /// Where to write the fitted profile (JSON, as `kvgate sim --profile` and `kvgate
    /// mock-pod --profile` read it).
    #[arg(long)]
    profile_out: PathBuf,
    /// The profile's name.
    #[arg(long, default_value = "calibrated")]
    name: String,
    /// Stop probing after this many seconds.
    #[arg(long, default_value_t = 120.0)]
    max_seconds: f64,
    /// Stop probing after this many requests.
    #[arg(long, default_value_t = 2000)]
    max_requests: u32,
    /// Longest probe prompt (cached prefix + new tokens).
    #[arg(long, default_value_t = 2048)]
    max_prompt_tokens: u32,
    /// Most concurrent decodes.
    #[arg(long, default_value_t = 16)]
    max_batch: u32,
    /// Output tokens of each decode probe request.
    #[arg(long, default_value_t = 32)]
    decode_output_tokens: u32,
    /// Times each prefill probe is sent (its median TTFT is fitted).
    #[arg(long, default_value_t = 3)]
    prefill_reps: u32,
    /// The pod's step token budget (vLLM `--max-num-batched-tokens`; 8192 is vLLM's default
    /// on a GPU, 2048 on CPU). Not served by vLLM, so not measured.
    #[arg(long, default_value_t = 8192)]
    max_num_batched_tokens: u32,
    /// The pod's running-request limit (vLLM `--max-num-seqs`; 256 on a GPU, 128 on CPU).
    #[arg(long, default_value_t = 256)]
    max_num_seqs: u32,
    /// KV blocks of 16 tokens, when the pod's `/metrics` has no `vllm:cache_config_info`.
    #[arg(long)]
    kv_blocks: Option<u32>,
    /// Probe prompts use token ids in 16..VOCAB (below the model's vocabulary).
    #[arg(long, default_value_t = 4096)]
    vocab: u32,
    /// Seed of the probe prompts.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Also write every observation (fitted and held out: its family, step sums and measured
    /// µs) to this file, one JSON object per line, to refit or inspect offline.
    #[arg(long)]
    observations_out: Option<PathBuf>,
    /// With --from-capture: also fit these observations (a `--probe` run's --observations-out
    /// file; its held-out ones stay held out). The probes, each alone on an idle pod, pin the
    /// prefill terms; the captured traffic, the cost of the mixed steps it really ran.
    #[arg(long, requires = "from_capture")]
    add_observations: Option<PathBuf>,
    /// With --from-capture: the pods' prefix-cache block in tokens (vLLM CPU: 128), written to
    /// the profile as `block_size_tokens` (a capture does not record it).
    #[arg(long, default_value_t = 16, requires = "from_capture")]
    block_size: u32,
}

/// What the pod says about itself.
struct PodInfo {
    model: String,
    max_model_len: u32,
    /// (GPU blocks, tokens per block) from `vllm:cache_config_info`.
    cache: Option<(u64, u32)>,
}

pub fn run(args: CalibrateArgs) -> anyhow::Result<()> {
    if !(args.max_seconds.is_finite() && args.max_seconds > 0.0) {
        bail!("--max-seconds must be a positive number");
    }
    if args.vocab < 32 {
        bail!("--vocab must be at least 32");
    }
    if args.max_num_batched_tokens == 0 || args.max_num_seqs == 0 {
        bail!("--max-num-batched-tokens and --max-num-seqs must be at least 1");
    }
    if let Some(path) = args.from_capture.clone() {
        return calibrate_from_capture(&args, &path);
    }
    tokio::runtime::Runtime::new()?.block_on(calibrate_pod(args))
}

/// Every fifth captured request is held out of the fit.
const HOLDOUT_EVERY: usize = 5;

fn calibrate_from_capture(args: &CalibrateArgs, path: &std::path::Path) -> anyhow::Result<()> {
    let (Some(kv_blocks), Some(max_model_len)) = (args.kv_blocks, args.max_model_len) else {
        bail!(
            "--from-capture needs --kv-blocks and --max-model-len (a capture does not record them)"
        );
    };
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let (requests, skipped) = passive::parse_capture(&text);
    eprintln!(
        "{}: {} requests with timing, {skipped} lines without (not streamed, not JSON, or captured before the timing keys)",
        path.display(),
        requests.len()
    );
    let (mut fit_obs, mut held_out) = (Vec::new(), Vec::new());
    for (i, o) in passive::observations(&requests, args.max_num_batched_tokens) {
        if i % HOLDOUT_EVERY == HOLDOUT_EVERY - 1 {
            held_out.push(o);
        } else {
            fit_obs.push(o);
        }
    }
    let captured = fit_obs.len();
    if let Some(extra) = &args.add_observations {
        let added = read_observations(extra)?;
        eprintln!(
            "{}: {} observations added to the fit, {} held out",
            extra.display(),
            added.iter().filter(|(held, _)| !held).count(),
            added.iter().filter(|(held, _)| *held).count()
        );
        for (held, o) in added {
            if held {
                held_out.push(o);
            } else {
                fit_obs.push(o);
            }
        }
    }
    let fit = calibrate::fit(&fit_obs)?;
    println!(
        "calibrated from {} ({} requests, {captured} observations, {} added; decodes weighted by 1 / step time)",
        path.display(),
        requests.len(),
        fit_obs.len() - captured
    );
    print_fit(&fit, args.add_observations.is_none());
    for family in [calibrate::Family::Prefill, calibrate::Family::Decode] {
        let obs: Vec<Observation> = held_out
            .iter()
            .copied()
            .filter(|o| o.family == family)
            .collect();
        let errors = fit.check(&obs);
        if errors.is_empty() {
            println!("held out {}: no observation", family.name());
            continue;
        }
        let mut abs: Vec<f64> = errors.iter().map(|e| e.error_pct().abs()).collect();
        let mean = abs.iter().sum::<f64>() / abs.len() as f64;
        println!(
            "held out {} ({} observations): mean |error| {mean:.1}%, median {:.1}%",
            family.name(),
            abs.len(),
            calibrate::median(&mut abs)
        );
    }
    if let Some(out) = &args.observations_out {
        let held: Vec<&Observation> = held_out.iter().collect();
        write_observations(out, &fit_obs, &held)?;
    }
    let profile = fit.apply(&capacities(args, kv_blocks, max_model_len, args.block_size));
    write_profile(&args.profile_out, &profile)
}

/// The observations [`write_observations`] wrote: (held out, observation) per line.
fn read_observations(path: &std::path::Path) -> anyhow::Result<Vec<(bool, Observation)>> {
    #[derive(serde::Deserialize)]
    struct Row {
        held_out: bool,
        family: String,
        steps: f64,
        prefill_tokens: f64,
        decode_seqs: f64,
        context_tokens: f64,
        context_tokens_sq: f64,
        prefill_pairs: f64,
        /// Absent: a prefill's does, a decode's does not.
        includes_request_overhead: Option<bool>,
        measured_us: f64,
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = Vec::new();
    for (n, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let r: Row = serde_json::from_str(line)
            .with_context(|| format!("{} line {}: not an observation", path.display(), n + 1))?;
        let family = [calibrate::Family::Prefill, calibrate::Family::Decode]
            .into_iter()
            .find(|f| f.name() == r.family)
            .with_context(|| {
                format!(
                    "{} line {}: unknown family {:?}",
                    path.display(),
                    n + 1,
                    r.family
                )
            })?;
        let sums = calibrate::StepSums {
            steps: r.steps,
            prefill_tokens: r.prefill_tokens,
            decode_seqs: r.decode_seqs,
            context_tokens: r.context_tokens,
            context_tokens_sq: r.context_tokens_sq,
            prefill_pairs: r.prefill_pairs,
        };
        out.push((
            r.held_out,
            Observation {
                family,
                sums,
                includes_request_overhead: r
                    .includes_request_overhead
                    .unwrap_or(family == calibrate::Family::Prefill),
                measured_us: r.measured_us,
            },
        ));
    }
    Ok(out)
}

/// A profile with every step-time term 0 and the given capacities. `block_size` is the pod's
/// prefix-cache block (from `vllm:cache_config_info`); one the simulator cannot model (not a
/// multiple of 16) is written as 16.
fn capacities(
    args: &CalibrateArgs,
    kv_blocks: u32,
    max_model_len: u32,
    block_size: u32,
) -> Profile {
    Profile {
        name: Box::leak(args.name.clone().into_boxed_str()),
        t0_us: 0.0,
        a_us_per_prefill_token: 0.0,
        b_us_per_decode_seq: 0.0,
        k_us_per_context_token: 0.0,
        k2_us_per_context_token_sq: 0.0,
        q_us_per_prefill_pair: 0.0,
        kv_blocks: kv_blocks.max(1),
        block_size_tokens: if block_size.is_multiple_of(16) && (16..=4096).contains(&block_size) {
            block_size
        } else {
            16
        },
        max_num_batched_tokens: args.max_num_batched_tokens,
        max_num_seqs: args.max_num_seqs,
        max_model_len: max_model_len.max(1),
    }
}

async fn calibrate_pod(args: CalibrateArgs) -> anyhow::Result<()> {
    let probe = args.probe.clone().unwrap_or_default();
    let base = probe.trim_end_matches('/').to_string();
    let client = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .build()?;
    let info = pod_info(&client, &base).await?;
    let block_size = info.cache.map_or(16, |(_, b)| b);
    if !(block_size.is_multiple_of(16) && (16..=4096).contains(&block_size)) {
        eprintln!(
            "the pod's prefix blocks are {block_size} tokens, which the simulator cannot model (a multiple of 16, at most 4096): the profile says 16"
        );
    }
    let kv_blocks = match (args.kv_blocks, info.cache) {
        (Some(b), _) => b,
        (None, Some((blocks, size))) => {
            u32::try_from(blocks.saturating_mul(u64::from(size)) / 16).unwrap_or(u32::MAX)
        }
        (None, None) => bail!(
            "{base}/metrics has no vllm:cache_config_info (num_gpu_blocks, block_size): give the KV capacity with --kv-blocks"
        ),
    };
    eprintln!(
        "pod {base}: model {:?}, max_model_len {}, KV {} blocks of 16 tokens ({}), prefix blocks of {block_size} tokens",
        info.model,
        info.max_model_len,
        kv_blocks,
        if args.kv_blocks.is_some() {
            "--kv-blocks"
        } else {
            "vllm:cache_config_info"
        }
    );
    let max_prompt = args
        .max_prompt_tokens
        .min(
            info.max_model_len
                .saturating_sub(args.decode_output_tokens + 1),
        )
        .max(2 * block_size);
    let plan = default_plan(&SweepLimits {
        max_prompt_tokens: max_prompt,
        max_batch: args.max_batch.min(args.max_num_seqs),
        block_size_tokens: block_size,
        decode_output_tokens: args.decode_output_tokens,
    });
    let mut prober = Prober {
        client,
        base,
        model: info.model.clone(),
        rng: ChaCha8Rng::seed_from_u64(args.seed),
        vocab: args.vocab,
        requests: 0,
        budget_tokens: args.max_num_batched_tokens,
        reps: args.prefill_reps.max(1),
        started: Instant::now(),
        deadline: Instant::now() + Duration::from_secs_f64(args.max_seconds),
        max_requests: args.max_requests,
        pod_prefill_timing: false,
        client_extra_us: Vec::new(),
    };
    // Warm-up: the first request of a pod may pay one-time costs.
    prober.stream(1 + 16, 2).await?;
    // Where the pod times its own prefills (vLLM ≥ 0.7, the mock pod), that is the prefill
    // time without the HTTP round trip and the client's scheduling noise.
    let before = prober.prefill_time_totals().await;
    prober.stream(1 + 16, 1).await?;
    let after = prober.prefill_time_totals_after(before).await;
    prober.pod_prefill_timing = matches!((before, after), (Some(b), Some(a)) if a.1 == b.1 + 1.0);
    eprintln!(
        "prefill timing: {}",
        if prober.pod_prefill_timing {
            "the pod's vllm:request_prefill_time_seconds (sum and count around each probe)"
        } else {
            "client-side TTFT (the pod serves no usable vllm:request_prefill_time_seconds)"
        }
    );

    let fit_deadline = prober.started + Duration::from_secs_f64(args.max_seconds * 0.8);
    let mut fit_obs = Vec::new();
    let mut skipped = 0;
    for probe in &plan.fit {
        if Instant::now() >= fit_deadline || !prober.can_send(probe, args.prefill_reps) {
            skipped += 1;
            continue;
        }
        fit_obs.extend(prober.measure(probe).await?);
    }
    if skipped > 0 {
        eprintln!(
            "budget: {skipped} of {} fit probes not sent (--max-seconds / --max-requests)",
            plan.fit.len()
        );
    }
    let fit = calibrate::fit(&fit_obs)?;
    let mut held_out: Vec<(Probe, Vec<Observation>)> = Vec::new();
    for probe in &plan.holdout {
        if Instant::now() >= prober.deadline || !prober.can_send(probe, args.prefill_reps) {
            eprintln!("budget: held-out probe {probe:?} not sent");
            continue;
        }
        held_out.push((*probe, prober.measure(probe).await?));
    }

    let base_profile = capacities(&args, kv_blocks, info.max_model_len, block_size);
    let profile = fit.apply(&base_profile);
    println!(
        "calibrated {} in {:.1} s, {} requests, {} observations",
        probe,
        prober.started.elapsed().as_secs_f64(),
        prober.requests,
        fit_obs.len()
    );
    print_fit(&fit, false);
    for (probe, obs) in &held_out {
        let errors = fit.check(obs);
        if errors.is_empty() {
            println!("held out {probe:?}: no observation");
            continue;
        }
        let mean = |f: fn(&calibrate::CheckError) -> f64| {
            errors.iter().map(f).sum::<f64>() / errors.len() as f64
        };
        let (measured, predicted) = (mean(|e| e.measured_us), mean(|e| e.predicted_us));
        println!(
            "held out {probe:?}: measured {:.2} ms, predicted {:.2} ms, error {:+.1}%",
            measured / 1000.0,
            predicted / 1000.0,
            (predicted - measured) / measured * 100.0
        );
    }
    if !prober.client_extra_us.is_empty() {
        let mut extra = prober.client_extra_us.clone();
        extra.sort_by(f64::total_cmp);
        let at = |q: f64| extra[((extra.len() - 1) as f64 * q).round() as usize] / 1000.0;
        println!(
            "client TTFT beyond the pod's prefill time: median {:.1} ms (p10 {:.1}, p90 {:.1}) over {} probes: the HTTP path, the API server and the engine's queue, which the profile does not hold",
            at(0.5),
            at(0.1),
            at(0.9),
            extra.len()
        );
    }
    if let Some(path) = &args.observations_out {
        let held: Vec<&Observation> = held_out.iter().flat_map(|(_, o)| o).collect();
        write_observations(path, &fit_obs, &held)?;
    }
    write_profile(&args.profile_out, &profile)
}

/// One JSON object per observation: `held_out`, `family`, the step sums,
/// `includes_request_overhead` and `measured_us`.
fn write_observations(
    path: &std::path::Path,
    fitted: &[Observation],
    held_out: &[&Observation],
) -> anyhow::Result<()> {
    let mut text = String::new();
    let rows = fitted
        .iter()
        .map(|o| (false, o))
        .chain(held_out.iter().map(|o| (true, *o)));
    for (held, o) in rows {
        let s = &o.sums;
        let row = serde_json::json!({
            "held_out": held,
            "family": o.family.name(),
            "steps": s.steps,
            "prefill_tokens": s.prefill_tokens,
            "decode_seqs": s.decode_seqs,
            "context_tokens": s.context_tokens,
            "context_tokens_sq": s.context_tokens_sq,
            "prefill_pairs": s.prefill_pairs,
            "includes_request_overhead": o.includes_request_overhead,
            "measured_us": o.measured_us,
        });
        text.push_str(&row.to_string());
        text.push('\n');
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    eprintln!("observations written to {}", path.display());
    Ok(())
}

/// Each term with its standard error, the constant, and R² and RMS per family.
fn print_fit(fit: &calibrate::Fit, decodes_relative: bool) {
    println!(
        "{:<28} {:>14} {:>12} {:>8}  note",
        "term", "fitted", "std error", "rel"
    );
    for t in &fit.terms {
        println!(
            "{:<28} {:>14.6e} {:>12.3e} {:>7.1}%  {}",
            t.term.key(),
            t.value,
            t.std_error,
            if t.value > 0.0 {
                t.std_error / t.value * 100.0
            } else {
                f64::NAN
            },
            t.dropped
                .map_or(String::new(), |why| format!("dropped: {why}"))
        );
    }
    println!(
        "{:<28} {:>14.1}  (a constant in each measured prefill beyond its steps; not in the profile)",
        "request_overhead_us", fit.request_overhead_us
    );
    for f in &fit.families {
        // Weighted rows measure about 1,000 each: their residual is relative.
        // (and their R² is meaningless: every row measures the same).
        let (r2, rms) = if decodes_relative && f.family == calibrate::Family::Decode {
            (
                "n/a (weighted)".to_string(),
                format!("{:.2} % of the step", f.rms_residual_us / 10.0),
            )
        } else {
            (
                format!("{:.4}", f.r_squared),
                format!("{:.3} ms", f.rms_residual_us / 1000.0),
            )
        };
        println!(
            "fit on {:<20} {:>4} observations  R² {r2}  RMS residual {rms}",
            f.family.name(),
            f.observations,
        );
    }
}

/// Writes `profile` to `path`, after checking that the simulator reads it back.
fn write_profile(path: &std::path::Path, profile: &Profile) -> anyhow::Result<()> {
    // Read back as the simulator will: a profile it refuses is an error here, not later.
    Profile::from_json(&path.display().to_string(), &profile.to_json())?;
    std::fs::write(path, profile.to_json())
        .with_context(|| format!("writing {}", path.display()))?;
    println!(
        "profile {:?} written to {} ({})",
        profile.name,
        path.display(),
        Term::ALL
            .iter()
            .map(|t| format!("{} {:.4e}", t.key(), t.of(profile)))
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(())
}

async fn pod_info(client: &reqwest::Client, base: &str) -> anyhow::Result<PodInfo> {
    let models: serde_json::Value = client
        .get(format!("{base}/v1/models"))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .with_context(|| format!("GET {base}/v1/models"))?
        .error_for_status()?
        .json()
        .await
        .with_context(|| format!("{base}/v1/models did not answer JSON"))?;
    let first = models.get("data").and_then(|d| d.get(0));
    let model = first
        .and_then(|m| m.get("id"))
        .and_then(|v| v.as_str())
        .with_context(|| format!("{base}/v1/models has no data[0].id"))?
        .to_string();
    let max_model_len = first
        .and_then(|m| m.get("max_model_len"))
        .and_then(|v| v.as_u64())
        .and_then(|v| u32::try_from(v).ok())
        .with_context(|| format!("{base}/v1/models has no data[0].max_model_len"))?;
    let metrics = client
        .get(format!("{base}/metrics"))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .with_context(|| format!("GET {base}/metrics"))?
        .error_for_status()?
        .text()
        .await?;
    Ok(PodInfo {
        model,
        max_model_len,
        cache: cache_config(&metrics),
    })
}

/// (`num_gpu_blocks`, `block_size`) from the `vllm:cache_config_info` line, when it has both.
fn cache_config(metrics: &str) -> Option<(u64, u32)> {
    let line = metrics
        .lines()
        .find(|l| l.starts_with("vllm:cache_config_info{"))?;
    let labels = line.split_once('{')?.1.split_once('}')?.0;
    let label = |name: &str| {
        labels.split(',').find_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            (k.trim() == name).then(|| v.trim().trim_matches('"').to_string())
        })
    };
    let blocks = label("num_gpu_blocks")?.parse().ok()?;
    let size: u32 = label("block_size")?.parse().ok()?;
    // A block of more than 64k tokens is no engine's: garbage, not a capacity.
    (blocks > 0 && (1..=65_536).contains(&size)).then_some((blocks, size))
}

/// (Σ `_sum`, Σ `_count`) of `vllm:request_prefill_time_seconds` over its series, when the
/// text has both and every value parses.
fn prefill_time_totals(metrics: &str) -> Option<(f64, f64)> {
    let total = |suffix: &str| -> Option<f64> {
        let name = format!("vllm:request_prefill_time_seconds_{suffix}");
        let mut found = false;
        let mut sum = 0.0;
        for line in metrics.lines() {
            let Some(rest) = line.strip_prefix(&name) else {
                continue;
            };
            if !(rest.starts_with('{') || rest.starts_with(' ')) {
                continue;
            }
            let v: f64 = rest.rsplit(' ').next()?.parse().ok()?;
            if !v.is_finite() {
                return None;
            }
            found = true;
            sum += v;
        }
        found.then_some(sum)
    };
    Some((total("sum")?, total("count")?))
}

struct Prober {
    client: reqwest::Client,
    base: String,
    model: String,
    rng: ChaCha8Rng,
    vocab: u32,
    requests: u32,
    budget_tokens: u32,
    reps: u32,
    started: Instant,
    deadline: Instant,
    max_requests: u32,
    /// Time prefills by the pod's `vllm:request_prefill_time_seconds` (sum and count before
    /// and after each probe) instead of the client's TTFT.
    pod_prefill_timing: bool,
    /// With pod timing: each prefill probe's client TTFT minus the pod's prefill time, µs.
    client_extra_us: Vec<f64>,
}

/// One streamed request: token arrival times (µs since `origin`), and the prompt tokens the
/// pod reported cached (`usage.prompt_tokens_details.cached_tokens`), when it did.
struct Streamed {
    sent_us: f64,
    token_us: Vec<f64>,
    cached_tokens: Option<u32>,
}

impl Prober {
    fn can_send(&self, probe: &Probe, reps: u32) -> bool {
        let n = match probe {
            Probe::Prefill { .. } => probe.requests() * reps.max(1),
            Probe::Decode { .. } => probe.requests(),
        };
        self.requests.saturating_add(n) <= self.max_requests
    }

    /// (sum in seconds, count) of the pod's `vllm:request_prefill_time_seconds`, all engines.
    async fn prefill_time_totals(&self) -> Option<(f64, f64)> {
        let text = self
            .client
            .get(format!("{}/metrics", self.base))
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        prefill_time_totals(&text)
    }

    /// The totals once they count a request more than `before` (a pod may record a request's
    /// statistics just after its stream ends): read again every 20 ms, for at most 1 s.
    async fn prefill_time_totals_after(&self, before: Option<(f64, f64)>) -> Option<(f64, f64)> {
        let mut now = self.prefill_time_totals().await;
        for _ in 0..50 {
            match (before, now) {
                (Some(b), Some(a)) if a.1 == b.1 => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    now = self.prefill_time_totals().await;
                }
                _ => break,
            }
        }
        now
    }

    fn fresh_tokens(&mut self, n: u32) -> Vec<u32> {
        (0..n)
            .map(|_| self.rng.random_range(16..self.vocab))
            .collect()
    }

    /// A request of `prompt_tokens` fresh tokens, streamed to its end.
    async fn stream(&mut self, prompt_tokens: u32, max_tokens: u32) -> anyhow::Result<Streamed> {
        let prompt = self.fresh_tokens(prompt_tokens);
        let origin = Instant::now();
        self.requests += 1;
        stream_one(
            &self.client,
            &self.base,
            &self.model,
            prompt,
            max_tokens,
            origin,
            self.deadline,
        )
        .await
    }

    /// The probe's observations.
    async fn measure(&mut self, probe: &Probe) -> anyhow::Result<Vec<Observation>> {
        match *probe {
            Probe::Prefill {
                cached_tokens,
                new_tokens,
            } => {
                let mut ttfts = Vec::new();
                let mut cached_seen = Vec::new();
                for _ in 0..self.reps {
                    let mut prompt = self.fresh_tokens(cached_tokens);
                    if cached_tokens > 0 {
                        // Fill the cache with the prefix (plus one token, so that all of the
                        // prefix's blocks are full and cached).
                        let mut warm = prompt.clone();
                        warm.extend(self.fresh_tokens(1));
                        self.requests += 1;
                        stream_one(
                            &self.client,
                            &self.base,
                            &self.model,
                            warm,
                            1,
                            Instant::now(),
                            self.deadline,
                        )
                        .await?;
                    }
                    prompt.extend(self.fresh_tokens(new_tokens));
                    self.requests += 1;
                    let before = if self.pod_prefill_timing {
                        self.prefill_time_totals().await
                    } else {
                        None
                    };
                    let s = stream_one(
                        &self.client,
                        &self.base,
                        &self.model,
                        prompt,
                        1,
                        Instant::now(),
                        self.deadline,
                    )
                    .await?;
                    let first = s.token_us.first().copied().unwrap_or(f64::NAN);
                    let client_ttft_us = first - s.sent_us;
                    if self.pod_prefill_timing {
                        match (before, self.prefill_time_totals_after(before).await) {
                            (Some(b), Some(a)) if a.1 == b.1 + 1.0 => {
                                let pod_us = (a.0 - b.0) * 1e6;
                                ttfts.push(pod_us);
                                if client_ttft_us.is_finite() {
                                    self.client_extra_us.push(client_ttft_us - pod_us);
                                }
                            }
                            _ => bail!(
                                "the pod's vllm:request_prefill_time_seconds did not count exactly this probe: is another client using the pod?"
                            ),
                        }
                    } else {
                        ttfts.push(client_ttft_us);
                    }
                    cached_seen.push(s.cached_tokens.unwrap_or(cached_tokens));
                }
                let ttft = calibrate::median(&mut ttfts);
                let cached = cached_seen.iter().copied().min().unwrap_or(cached_tokens);
                if cached != cached_tokens {
                    eprintln!(
                        "prefill probe: the pod found {cached} of the {cached_tokens} prefix tokens cached"
                    );
                }
                Ok(vec![prefill_observation(
                    cached,
                    cached_tokens + new_tokens,
                    self.budget_tokens,
                    ttft,
                )])
            }
            Probe::Decode {
                batch,
                prompt_tokens,
                output_tokens,
            } => {
                let origin = Instant::now();
                let mut tasks = tokio::task::JoinSet::new();
                for _ in 0..batch {
                    let prompt = self.fresh_tokens(prompt_tokens);
                    self.requests += 1;
                    let (client, base, model, deadline) = (
                        self.client.clone(),
                        self.base.clone(),
                        self.model.clone(),
                        self.deadline,
                    );
                    tasks.spawn(async move {
                        stream_one(
                            &client,
                            &base,
                            &model,
                            prompt,
                            output_tokens,
                            origin,
                            deadline,
                        )
                        .await
                    });
                }
                let mut times = Vec::new();
                while let Some(r) = tasks.join_next().await {
                    let s = r.context("a decode probe task failed")??;
                    if s.token_us.len() != output_tokens as usize {
                        eprintln!(
                            "decode probe: a request streamed {} of {output_tokens} tokens (an end-of-sequence?)",
                            s.token_us.len()
                        );
                    }
                    times.push(s.token_us);
                }
                Ok(decode_observations(prompt_tokens, &times))
            }
        }
    }
}

/// Streams one completion of `prompt` (token ids), times relative to `origin`. A request that
/// outlives `deadline` by 60 s is an error.
async fn stream_one(
    client: &reqwest::Client,
    base: &str,
    model: &str,
    prompt: Vec<u32>,
    max_tokens: u32,
    origin: Instant,
    deadline: Instant,
) -> anyhow::Result<Streamed> {
    let body = serde_json::json!({
        "model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": true,
        "ignore_eos": true, "temperature": 0.0, "stream_options": {"include_usage": true},
    });
    let timeout = deadline.saturating_duration_since(Instant::now()) + Duration::from_secs(60);
    let sent_us = origin.elapsed().as_secs_f64() * 1e6;
    let response = client
        .post(format!("{base}/v1/completions"))
        .json(&body)
        .timeout(timeout)
        .send()
        .await
        .with_context(|| format!("POST {base}/v1/completions"))?;
    let status = response.status();
    if !status.is_success() {
        let text = response.text().await.unwrap_or_default();
        bail!(
            "{base}/v1/completions answered {status}: {}",
            text.chars().take(300).collect::<String>()
        );
    }
    let mut out = Streamed {
        sent_us,
        token_us: Vec::with_capacity(max_tokens as usize),
        cached_tokens: None,
    };
    let mut buf: Vec<u8> = Vec::new();
    let mut done = false;
    let mut body = response.bytes_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.with_context(|| format!("reading the stream of {base}"))?;
        let now_us = origin.elapsed().as_secs_f64() * 1e6;
        buf.extend_from_slice(&chunk);
        while let Some(end) = buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buf.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            let Some(data) = line.trim().strip_prefix("data:") else {
                continue;
            };
            let data = data.trim();
            if data == "[DONE]" {
                done = true;
                continue;
            }
            let v: serde_json::Value = serde_json::from_str(data).with_context(|| {
                format!(
                    "{base} streamed a data line that is not JSON: {:?}",
                    data.chars().take(120).collect::<String>()
                )
            })?;
            if let Some(e) = v.get("error") {
                bail!("{base} streamed an error: {e}");
            }
            if v.get("choices")
                .and_then(|c| c.as_array())
                .is_some_and(|c| !c.is_empty())
            {
                out.token_us.push(now_us);
            }
            if let Some(c) = v
                .pointer("/usage/prompt_tokens_details/cached_tokens")
                .and_then(|c| c.as_u64())
            {
                out.cached_tokens = u32::try_from(c).ok();
            }
        }
        if buf.len() > 1 << 20 {
            bail!("{base} streamed a line longer than 1 MiB");
        }
    }
    if !done {
        bail!("{base} ended the stream without `data: [DONE]`");
    }
    if out.token_us.is_empty() {
        bail!("{base} streamed no token");
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_written_are_read_back_and_garbage_is_an_error() {
        let dir = std::env::temp_dir().join(format!("kvgate-obs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("obs.jsonl");
        let prefill = prefill_observation(256, 1024, 512, 80_000.0);
        let decode = decode_observations(100, &[(0..12).map(|i| 9000.0 * f64::from(i)).collect()]);
        write_observations(&path, &[prefill], &decode.iter().collect::<Vec<_>>()).unwrap();
        let back = read_observations(&path).unwrap();
        assert_eq!(back.len(), 1 + decode.len());
        assert_eq!(back[0], (false, prefill));
        assert_eq!(back[1], (true, decode[0]));
        assert_eq!(back[0].1.sums.steps, 2.0, "768 new tokens in chunks of 512");
        std::fs::write(&path, "{\"held_out\": false}\n").unwrap();
        assert!(read_observations(&path).is_err());
        std::fs::write(&path, "not json\n").unwrap();
        assert!(read_observations(&path).is_err());
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn cache_config_is_read_from_the_info_line_and_garbage_gives_none() {
        let text = "# HELP x\nvllm:cache_config_info{block_size=\"128\",engine=\"0\",num_gpu_blocks=\"2000\"} 1.0\n";
        assert_eq!(cache_config(text), Some((2000, 128)));
        assert_eq!(
            cache_config("vllm:cache_config_info{block_size=\"x\"} 1"),
            None
        );
        assert_eq!(cache_config("vllm:cache_config_info{"), None);
        let huge = text.replace("\"128\"", "\"4294967295\"");
        assert_eq!(cache_config(&huge), None);
        assert_eq!(cache_config("garbage\u{0}\n{}"), None);
    }

    #[test]
    fn prefill_time_totals_add_up_every_engine_and_refuse_garbage() {
        let text = "vllm:request_prefill_time_seconds_sum{engine=\"0\"} 0.5\n\
                    vllm:request_prefill_time_seconds_sum{engine=\"1\"} 0.25\n\
                    vllm:request_prefill_time_seconds_count{engine=\"0\"} 2\n\
                    vllm:request_prefill_time_seconds_count{engine=\"1\"} 1\n\
                    vllm:request_prefill_time_seconds_created{engine=\"0\"} 17e8\n";
        assert_eq!(prefill_time_totals(text), Some((0.75, 3.0)));
        assert_eq!(
            prefill_time_totals("vllm:request_prefill_time_seconds_sum{} x\n"),
            None
        );
        assert_eq!(prefill_time_totals("nothing here"), None);
    }
}
