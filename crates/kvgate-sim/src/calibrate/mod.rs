//! Fitting a pod's step-time [`Profile`] from latencies measured by probing it
//! (`kvgate calibrate --probe`).
//!
//! The driver (the `kvgate` binary) sends probes and records when each streamed token arrives;
//! this module plans the probes, turns those timestamps into observations, and fits the
//! profile's terms — plain data in, plain data out, no clock or socket.
//!
//! ## What a probe measures
//!
//! Every observation is one measured interval, in µs, and the step features it spans, summed
//! over its steps (the engine model of `crate::engine`, module docs "Step time"):
//!
//! - **Prefill** (`Probe::Prefill { cached_tokens, new_tokens }`): one request alone on an idle
//!   pod, its first `cached_tokens` already in the prefix cache (the driver sends the prefix
//!   first), `max_tokens` 1. Its prefill time spans the prefill steps (chunks of at most
//!   `max_num_batched_tokens`) plus a constant fitted as its own term (`request_overhead_us`,
//!   not written to the profile): the pod's delivery overhead when the driver reads the pod's
//!   own `vllm:request_prefill_time_seconds`, the HTTP round trip too when it times the TTFT. The cached prefix is what separates
//!   `a` (new tokens) from `k` (context read) and `q` (pairs) from `k2` (context²): without it
//!   they grow together.
//! - **Decode** (`Probe::Decode { batch, prompt_tokens, output_tokens }`): `batch` requests
//!   started together. Once every one has its first token and until the first finishes, each
//!   token gap is one step of `batch` decodes reading `batch × (prompt + j)` context tokens
//!   (the gap from token `j` to `j + 1`). Each request's steady tokens are cut in
//!   [`DECODE_SEGMENTS`] segments, and a segment's time per step is (last − first token time) /
//!   gaps: timer jitter (a pod delivers a token up to a timer tick late) then enters once per
//!   segment instead of once per gap. The median across requests is fitted, so that a client
//!   thread descheduled for a moment does not pull the fit. Token gaps carry no HTTP round
//!   trip, which is what pins `t0` apart from the request overhead.
//!
//! ## The fit
//!
//! Weighted least squares of the measured µs on the step features, each observation weighted
//! by the inverse of its measured time so that relative errors count (columns scaled to unit
//! maximum, normal equations solved by Gauss–Jordan, which also gives the covariance for each
//! term's standard error). A term whose fit is negative, or smaller than twice its standard
//! error ([`MIN_T_STAT`]), is dropped (set to 0) and the rest refitted, least significant
//! first: a term the data cannot tell from zero does not earn its keep. A term no probe
//! exercises (a column of zeros, or one that is a combination of the others) is an error that
//! names it: the sweep has to change, not the fit. Quality is reported per term (value and
//! standard error) and per probe family (R², RMS residual); probes held out of the fit are
//! predicted with the fitted terms and their error reported ([`Fit::check`]).
//!
//! What this cannot know: costs the probes do not exercise (LoRA loads, preemption,
//! speculative decoding), the step composition of real traffic (mixed steps are modelled as
//! the sum of their parts), and the capacities (`max_num_batched_tokens`, `max_num_seqs`),
//! which a pod does not serve and the driver takes from flags.

pub mod passive;

use crate::profiles::Profile;

/// Segments of a decode probe's steady state, one observation each (see the module docs).
pub const DECODE_SEGMENTS: u32 = 2;
/// A term is kept only when its fitted value is at least this many standard errors above 0.
pub const MIN_T_STAT: f64 = 2.0;

/// A step-time term of [`Profile`], named as in its JSON form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Term {
    T0,
    A,
    B,
    K,
    K2,
    Q,
}

impl Term {
    pub const ALL: [Term; 6] = [Term::T0, Term::A, Term::B, Term::K, Term::K2, Term::Q];

    /// The profile's JSON key.
    pub fn key(self) -> &'static str {
        match self {
            Term::T0 => "t0_us",
            Term::A => "a_us_per_prefill_token",
            Term::B => "b_us_per_decode_seq",
            Term::K => "k_us_per_context_token",
            Term::K2 => "k2_us_per_context_token_sq",
            Term::Q => "q_us_per_prefill_pair",
        }
    }

    /// The term's value in `p`.
    pub fn of(self, p: &Profile) -> f64 {
        match self {
            Term::T0 => p.t0_us,
            Term::A => p.a_us_per_prefill_token,
            Term::B => p.b_us_per_decode_seq,
            Term::K => p.k_us_per_context_token,
            Term::K2 => p.k2_us_per_context_token_sq,
            Term::Q => p.q_us_per_prefill_pair,
        }
    }

    fn set(self, p: &mut Profile, v: f64) {
        match self {
            Term::T0 => p.t0_us = v,
            Term::A => p.a_us_per_prefill_token = v,
            Term::B => p.b_us_per_decode_seq = v,
            Term::K => p.k_us_per_context_token = v,
            Term::K2 => p.k2_us_per_context_token_sq = v,
            Term::Q => p.q_us_per_prefill_pair = v,
        }
    }
}

/// Step features summed over the steps of one measured interval.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepSums {
    pub steps: f64,
    pub prefill_tokens: f64,
    pub decode_seqs: f64,
    pub context_tokens: f64,
    /// Σ over steps of (context tokens read in the step)².
    pub context_tokens_sq: f64,
    pub prefill_pairs: f64,
}

impl StepSums {
    /// Adds one step.
    pub fn add_step(&mut self, prefill_tokens: f64, decode_seqs: f64, context: f64, pairs: f64) {
        self.steps += 1.0;
        self.prefill_tokens += prefill_tokens;
        self.decode_seqs += decode_seqs;
        self.context_tokens += context;
        self.context_tokens_sq += context * context;
        self.prefill_pairs += pairs;
    }

    /// The regressor of `term`.
    pub fn of(&self, term: Term) -> f64 {
        match term {
            Term::T0 => self.steps,
            Term::A => self.prefill_tokens,
            Term::B => self.decode_seqs,
            Term::K => self.context_tokens,
            Term::K2 => self.context_tokens_sq,
            Term::Q => self.prefill_pairs,
        }
    }

    /// The steps' time under `profile`, µs.
    pub fn time_us(&self, profile: &Profile) -> f64 {
        Term::ALL.iter().map(|&t| t.of(profile) * self.of(t)).sum()
    }
}

/// The steps of a prompt of `cached_tokens + new_tokens` tokens prefilled alone, the new ones
/// in chunks of at most `budget` tokens.
pub fn prefill_steps(cached_tokens: u64, new_tokens: u64, budget: u64) -> StepSums {
    let mut sums = StepSums::default();
    let mut computed = cached_tokens;
    let mut left = new_tokens;
    let budget = budget.max(1);
    while left > 0 {
        let n = left.min(budget);
        let pairs = n * computed + n * (n + 1) / 2;
        computed += n;
        left -= n;
        sums.add_step(n as f64, 0.0, computed as f64, pairs as f64);
    }
    sums
}

/// A probe of the sweep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// One request alone: `cached_tokens` of prefix already cached, `new_tokens` computed.
    Prefill { cached_tokens: u32, new_tokens: u32 },
    /// `batch` requests of `prompt_tokens` fresh tokens started together, each generating
    /// `output_tokens`.
    Decode {
        batch: u32,
        prompt_tokens: u32,
        output_tokens: u32,
    },
}

impl Probe {
    /// Requests the probe sends (a prefill with a cached prefix sends the prefix first).
    pub fn requests(&self) -> u32 {
        match *self {
            Probe::Prefill { cached_tokens, .. } => 1 + u32::from(cached_tokens > 0),
            Probe::Decode { batch, .. } => batch,
        }
    }
}

/// Limits of a sweep.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SweepLimits {
    /// Longest prompt (cached + new), tokens.
    pub max_prompt_tokens: u32,
    /// Most concurrent decodes.
    pub max_batch: u32,
    /// Prefix-cache block size of the pod, tokens: cached prefixes are whole blocks.
    pub block_size_tokens: u32,
    /// Output tokens of each decode request.
    pub decode_output_tokens: u32,
}

/// The probes to fit on and the probes held out to check the fit.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub fit: Vec<Probe>,
    pub holdout: Vec<Probe>,
}

/// The default sweep: prefills of 1/16 … 1 of the longest prompt, with 0, 1/4, 1/2 and 3/4
/// of it cached; decodes of 1 … `max_batch` sequences with short prompts (t0, b) and with prompts of
/// 1/4 and 1/2 of the longest (k, k2). The held-out probes sit between the grid's points.
/// Ordered so that a sweep cut short by its time or request budget still covers every family:
/// the cheap probes of each family first.
pub fn default_plan(limits: &SweepLimits) -> Plan {
    // Bounded so that the arithmetic below cannot overflow, whatever the limits.
    let block = limits.block_size_tokens.clamp(1, 1 << 16);
    // Whole blocks, at least one.
    let blocks = |tokens: u32| (tokens / block).max(1) * block;
    let n = limits.max_prompt_tokens.clamp(2 * block, 1 << 24);
    let b = limits.max_batch.clamp(2, 1 << 16);
    let out = limits.decode_output_tokens.max(4 * DECODE_SEGMENTS + 4);
    let decode = |batch: u32, prompt_tokens: u32| Probe::Decode {
        batch: batch.max(1),
        prompt_tokens: prompt_tokens.max(1),
        output_tokens: out,
    };
    let mut fit = Vec::new();
    for &(num, den) in &[(1, 16), (1, 8), (1, 4), (1, 2), (3, 4), (1, 1)] {
        let new_tokens = (n * num / den).max(1);
        fit.push(Probe::Prefill {
            cached_tokens: 0,
            new_tokens,
        });
    }
    for &(cached_q, new_q) in &[(1, 1), (1, 2), (1, 3), (2, 1), (2, 2), (3, 1)] {
        // cached_q/4 of the longest prompt cached, new_q/4 of it computed.
        let cached_tokens = blocks(n * cached_q / 4);
        let new_tokens = (n * new_q / 4).min(n.saturating_sub(cached_tokens)).max(1);
        fit.push(Probe::Prefill {
            cached_tokens,
            new_tokens,
        });
    }
    let short = 16;
    fit.extend([
        decode(1, short),
        decode(b / 4, short),
        decode(b / 2, short),
        decode(b, short),
        decode(b / 4, n / 2),
        decode(b / 2, n / 4),
        decode(b, n / 4),
        decode(b / 2, n / 2),
        decode(b, n / 2),
    ]);
    let holdout = vec![
        Probe::Prefill {
            cached_tokens: 0,
            new_tokens: (n * 3 / 8).max(1),
        },
        Probe::Prefill {
            cached_tokens: blocks(n * 3 / 8),
            new_tokens: (n * 3 / 8).max(1),
        },
        decode(b * 3 / 4, n * 3 / 8),
    ];
    Plan { fit, holdout }
}

/// Which probe family an observation came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Prefill,
    Decode,
}

impl Family {
    pub fn name(self) -> &'static str {
        match self {
            Family::Prefill => "prefill",
            Family::Decode => "decode (token gaps)",
        }
    }
}

/// One measured interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Observation {
    pub family: Family,
    pub sums: StepSums,
    /// Whether the interval includes the per-request constant (a prefill's does).
    pub includes_request_overhead: bool,
    pub measured_us: f64,
}

/// The observation of a prefill probe: its TTFT, µs, with `cached_tokens` found in the cache
/// (as the pod reported, or as planned) of a `prompt_tokens` prompt.
pub fn prefill_observation(
    cached_tokens: u32,
    prompt_tokens: u32,
    budget_tokens: u32,
    ttft_us: f64,
) -> Observation {
    let cached = cached_tokens.min(prompt_tokens.saturating_sub(1));
    Observation {
        family: Family::Prefill,
        sums: prefill_steps(
            u64::from(cached),
            u64::from(prompt_tokens - cached),
            u64::from(budget_tokens),
        ),
        includes_request_overhead: true,
        measured_us: ttft_us,
    }
}

/// The observations of a decode probe of `prompt_tokens`-token requests started together, from
/// each request's token arrival times in µs (any origin, one list per request; see the module
/// docs): [`DECODE_SEGMENTS`] observations, one per segment of the steady state. Requests with
/// fewer than two tokens, times that are not finite and segments shorter than two gaps make
/// no observation.
pub fn decode_observations(prompt_tokens: u32, token_times_us: &[Vec<f64>]) -> Vec<Observation> {
    let runs: Vec<&Vec<f64>> = token_times_us
        .iter()
        .filter(|t| t.len() >= 2 && t.iter().all(|x| x.is_finite()))
        .filter(|t| t.windows(2).all(|w| w[0] <= w[1]))
        .collect();
    if runs.is_empty() {
        return Vec::new();
    }
    let batch = runs.len() as f64;
    // Steady state: every request has its first token, none has its last.
    let all_started = runs.iter().map(|t| t[0]).fold(f64::MIN, f64::max);
    let first_done = runs
        .iter()
        .filter_map(|t| t.last().copied())
        .fold(f64::MAX, f64::min);
    // Per segment: (per-request µs per step, per-request mean context, mean context²).
    let mut segments: Vec<(Vec<f64>, f64, f64, u32)> =
        vec![(Vec::new(), 0.0, 0.0, 0); DECODE_SEGMENTS as usize];
    for t in &runs {
        // 0-based positions of the steady tokens (times are sorted, so they are a range).
        let Some(s) = t.iter().position(|&x| x >= all_started) else {
            continue;
        };
        let Some(e) = t.iter().rposition(|&x| x <= first_done) else {
            continue;
        };
        let gaps = e.saturating_sub(s);
        if gaps < 2 * DECODE_SEGMENTS as usize {
            continue;
        }
        for (k, slot) in segments.iter_mut().enumerate() {
            let u = s + gaps * k / DECODE_SEGMENTS as usize;
            let v = s + gaps * (k + 1) / DECODE_SEGMENTS as usize;
            // The gap after 0-based position i (1-based token i + 1) is the step that reads
            // prompt + i + 1 tokens per sequence.
            let ctx: Vec<f64> = (u..v)
                .map(|i| f64::from(prompt_tokens) + i as f64 + 1.0)
                .collect();
            let n = ctx.len() as f64;
            slot.0.push((t[v] - t[u]) / n);
            slot.1 += ctx.iter().sum::<f64>() / n;
            slot.2 += ctx.iter().map(|c| c * c).sum::<f64>() / n;
            slot.3 += 1;
        }
    }
    segments
        .into_iter()
        .filter(|(per_step, _, _, _)| !per_step.is_empty())
        .map(|(mut per_step, ctx, ctx_sq, n)| {
            let n = f64::from(n);
            let sums = StepSums {
                steps: 1.0,
                prefill_tokens: 0.0,
                decode_seqs: batch,
                context_tokens: batch * ctx / n,
                context_tokens_sq: batch * batch * ctx_sq / n,
                prefill_pairs: 0.0,
            };
            Observation {
                family: Family::Decode,
                sums,
                includes_request_overhead: false,
                measured_us: median(&mut per_step),
            }
        })
        .collect()
}

/// The median of `v` (NaN when empty); sorts `v`.
pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Why a fit could not be made.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FitError {
    #[error(
        "{found} observations, the fit needs at least {needed}: the sweep was cut short (raise --max-seconds or --max-requests)"
    )]
    TooFewObservations { found: usize, needed: usize },
    #[error("a measured latency is not a finite number ≥ 0 ({0} µs)")]
    BadMeasurement(f64),
    #[error(
        "no probe separates {0} from the other terms: the sweep cannot fit it (its probes were cut short, or the pod answered them all alike)"
    )]
    NotObservable(&'static str),
    #[error("no {0} observation: every probe of that family failed or was cut short")]
    MissingFamily(&'static str),
}

/// One term's fit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TermFit {
    pub term: Term,
    /// The fitted value, µs per unit of its regressor (0 when dropped).
    pub value: f64,
    /// Its standard error (of the last fit it was in).
    pub std_error: f64,
    /// Why it was dropped, if it was.
    pub dropped: Option<&'static str>,
}

/// Fit quality on one probe family.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FamilyFit {
    pub family: Family,
    pub observations: usize,
    pub r_squared: f64,
    pub rms_residual_us: f64,
}

/// The fitted terms.
#[derive(Debug, Clone, PartialEq)]
pub struct Fit {
    pub terms: Vec<TermFit>,
    /// The HTTP round trip a TTFT carries beyond its steps, µs.
    pub request_overhead_us: f64,
    pub families: Vec<FamilyFit>,
}

/// Prediction error on held-out observations.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CheckError {
    pub family: Family,
    pub measured_us: f64,
    pub predicted_us: f64,
}

impl CheckError {
    /// (predicted − measured) / measured, in %.
    pub fn error_pct(&self) -> f64 {
        (self.predicted_us - self.measured_us) / self.measured_us * 100.0
    }
}

impl Fit {
    /// The fitted value of `term` (0 when dropped).
    pub fn value(&self, term: Term) -> f64 {
        self.terms
            .iter()
            .find(|t| t.term == term)
            .map_or(0.0, |t| t.value)
    }

    /// `base` (capacities, name) with the fitted step-time terms.
    pub fn apply(&self, base: &Profile) -> Profile {
        let mut p = base.clone();
        for t in &self.terms {
            t.term.set(&mut p, t.value);
        }
        p
    }

    /// The fit's prediction of `o`, µs.
    pub fn predict_us(&self, o: &Observation) -> f64 {
        let steps: f64 = self.terms.iter().map(|t| t.value * o.sums.of(t.term)).sum();
        steps
            + if o.includes_request_overhead {
                self.request_overhead_us
            } else {
                0.0
            }
    }

    /// Predictions of observations the fit did not see.
    pub fn check(&self, held_out: &[Observation]) -> Vec<CheckError> {
        held_out
            .iter()
            .filter(|o| o.measured_us > 0.0)
            .map(|o| CheckError {
                family: o.family,
                measured_us: o.measured_us,
                predicted_us: self.predict_us(o),
            })
            .collect()
    }
}

/// A regressor: a profile term or the request overhead.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Column {
    Term(Term),
    Overhead,
}

impl Column {
    fn of(self, o: &Observation) -> f64 {
        match self {
            Column::Term(t) => o.sums.of(t),
            Column::Overhead => f64::from(u8::from(o.includes_request_overhead)),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Column::Term(t) => t.key(),
            Column::Overhead => "request_overhead_us",
        }
    }
}

/// Fits the terms of [`Term::ALL`] and the request overhead to `observations` (see the module
/// docs). Needs both families.
pub fn fit(observations: &[Observation]) -> Result<Fit, FitError> {
    if let Some(o) = observations
        .iter()
        .find(|o| !(o.measured_us.is_finite() && o.measured_us >= 0.0))
    {
        return Err(FitError::BadMeasurement(o.measured_us));
    }
    for family in [Family::Prefill, Family::Decode] {
        if !observations.iter().any(|o| o.family == family) {
            return Err(FitError::MissingFamily(family.name()));
        }
    }
    let mut columns: Vec<Column> = Term::ALL.iter().map(|&t| Column::Term(t)).collect();
    columns.push(Column::Overhead);
    let mut dropped: Vec<(Term, f64, &'static str)> = Vec::new();
    loop {
        let (beta, se) = least_squares(observations, &columns)?;
        // The least significant term that is negative or insignificant, if any.
        let worst = columns
            .iter()
            .zip(beta.iter().zip(&se))
            .filter_map(|(&c, (&b, &s))| match c {
                Column::Term(t) if b < 0.0 || b < MIN_T_STAT * s => Some((t, b, s)),
                _ => None,
            })
            .min_by(|x, y| (x.1 / x.2.max(f64::MIN_POSITIVE)).total_cmp(&(y.1 / y.2)));
        if let Some((t, b, s)) = worst {
            let why = if b < 0.0 {
                "fitted negative"
            } else {
                "below 2 standard errors"
            };
            dropped.push((t, s, why));
            columns.retain(|&c| c != Column::Term(t));
            continue;
        }
        let mut terms: Vec<TermFit> = Vec::new();
        let mut overhead = 0.0;
        for (&c, (&b, &s)) in columns.iter().zip(beta.iter().zip(&se)) {
            match c {
                Column::Term(term) => terms.push(TermFit {
                    term,
                    value: b,
                    std_error: s,
                    dropped: None,
                }),
                Column::Overhead => overhead = b,
            }
        }
        for (term, s, why) in dropped {
            terms.push(TermFit {
                term,
                value: 0.0,
                std_error: s,
                dropped: Some(why),
            });
        }
        terms.sort_by_key(|t| Term::ALL.iter().position(|&x| x == t.term));
        let mut fit = Fit {
            terms,
            request_overhead_us: overhead,
            families: Vec::new(),
        };
        fit.families = [Family::Prefill, Family::Decode]
            .into_iter()
            .map(|family| family_quality(&fit, observations, family))
            .collect();
        return Ok(fit);
    }
}

fn family_quality(fit: &Fit, observations: &[Observation], family: Family) -> FamilyFit {
    let of: Vec<&Observation> = observations.iter().filter(|o| o.family == family).collect();
    let n = of.len().max(1) as f64;
    let mean = of.iter().map(|o| o.measured_us).sum::<f64>() / n;
    let rss: f64 = of
        .iter()
        .map(|o| (o.measured_us - fit.predict_us(o)).powi(2))
        .sum();
    let tss: f64 = of.iter().map(|o| (o.measured_us - mean).powi(2)).sum();
    FamilyFit {
        family,
        observations: of.len(),
        r_squared: if tss > 0.0 { 1.0 - rss / tss } else { f64::NAN },
        rms_residual_us: (rss / n).sqrt(),
    }
}

/// An observation's weight in the fit: the inverse of its measured time, so that the fit
/// minimises relative errors. Without it a sweep's few long intervals (a 32-sequence decode
/// step of 70 ms, a 3,584-token prefill of 1.4 s) decide every term, and the short ones (a
/// lone decode step of 9 ms, which pins `t0`) are left to the others' noise: on a real CPU pod
/// the unweighted fit dropped `t0` and `b` (decode R² 0.74), the weighted one keeps both
/// (R² 0.99; BENCHMARKS.md, "`kvgate calibrate` against the real engine").
fn weight(o: &Observation) -> f64 {
    1.0 / o.measured_us.max(1.0)
}

/// Weighted least squares of the measurements on `columns` ([`weight`]): (coefficients,
/// standard errors).
fn least_squares(
    observations: &[Observation],
    columns: &[Column],
) -> Result<(Vec<f64>, Vec<f64>), FitError> {
    let p = columns.len();
    let n = observations.len();
    if n <= p {
        return Err(FitError::TooFewObservations {
            found: n,
            needed: p + 1,
        });
    }
    // Scale every column to a maximum of 1 so the normal equations are well conditioned.
    let scale: Vec<f64> = columns
        .iter()
        .map(|&c| {
            observations
                .iter()
                .map(|o| c.of(o).abs() * weight(o))
                .fold(0.0, f64::max)
        })
        .collect();
    if let Some(i) = scale.iter().position(|&s| !(s > 0.0 && s.is_finite())) {
        return Err(FitError::NotObservable(columns[i].name()));
    }
    let row = |o: &Observation| -> Vec<f64> {
        columns
            .iter()
            .zip(&scale)
            .map(|(&c, s)| c.of(o) * weight(o) / s)
            .collect()
    };
    // [XᵀX | I], reduced to [I | (XᵀX)⁻¹].
    let mut m = vec![vec![0.0; 2 * p]; p];
    let mut xty = vec![0.0; p];
    for o in observations {
        let x = row(o);
        for i in 0..p {
            xty[i] += x[i] * o.measured_us * weight(o);
            for j in 0..p {
                m[i][j] += x[i] * x[j];
            }
        }
    }
    for (i, r) in m.iter_mut().enumerate() {
        r[p + i] = 1.0;
    }
    let max_diag = (0..p).map(|i| m[i][i]).fold(0.0, f64::max);
    for col in 0..p {
        let pivot = (col..p)
            .max_by(|&a, &b| m[a][col].abs().total_cmp(&m[b][col].abs()))
            .unwrap_or(col);
        // Relative to the largest diagonal: a column that is (nearly) a combination of others.
        if m[pivot][col].abs() <= 1e-12 * max_diag {
            return Err(FitError::NotObservable(columns[col].name()));
        }
        m.swap(col, pivot);
        let d = m[col][col];
        for v in m[col].iter_mut() {
            *v /= d;
        }
        let pivot_row = m[col].clone();
        for (r, row) in m.iter_mut().enumerate() {
            if r != col {
                let f = row[col];
                if f != 0.0 {
                    for (v, pv) in row.iter_mut().zip(&pivot_row) {
                        *v -= f * pv;
                    }
                }
            }
        }
    }
    let inv = |i: usize, j: usize| m[i][p + j];
    let beta_scaled: Vec<f64> = (0..p)
        .map(|i| (0..p).map(|j| inv(i, j) * xty[j]).sum())
        .collect();
    let rss: f64 = observations
        .iter()
        .map(|o| {
            let x = row(o);
            let pred: f64 = x.iter().zip(&beta_scaled).map(|(a, b)| a * b).sum();
            (o.measured_us * weight(o) - pred).powi(2)
        })
        .sum();
    let sigma2 = rss / (n - p) as f64;
    let beta = beta_scaled.iter().zip(&scale).map(|(b, s)| b / s).collect();
    let se = (0..p)
        .map(|i| (sigma2 * inv(i, i).max(0.0)).sqrt() / scale[i])
        .collect();
    Ok((beta, se))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{Engine, EngineRequest};
    use std::sync::Arc;

    /// A CPU-like profile whose every term matters at ms scale.
    fn truth() -> Profile {
        Profile {
            name: "truth",
            t0_us: 4000.0,
            a_us_per_prefill_token: 10.0,
            b_us_per_decode_seq: 150.0,
            k_us_per_context_token: 0.3,
            k2_us_per_context_token_sq: 4e-6,
            q_us_per_prefill_pair: 0.004,
            kv_blocks: 40_000,
            block_size_tokens: 16,
            max_num_batched_tokens: 8192,
            max_num_seqs: 64,
            max_model_len: 16_384,
        }
    }

    fn limits() -> SweepLimits {
        SweepLimits {
            max_prompt_tokens: 4096,
            max_batch: 32,
            block_size_tokens: 16,
            decode_output_tokens: 24,
        }
    }

    /// Deterministic noise in [-amp, amp) µs (a fixed LCG: the same every run).
    fn noise(state: &mut u64, amp: f64) -> f64 {
        *state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*state >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) * amp
    }

    /// Observations of `plan.fit` as `profile` would time them, with `overhead_us` per TTFT and
    /// noise of ±`amp` µs on every measured time.
    fn simulate(
        profile: &Profile,
        probes: &[Probe],
        overhead_us: f64,
        amp: f64,
    ) -> Vec<Observation> {
        let mut seed = 7;
        let mut out = Vec::new();
        for p in probes {
            match *p {
                Probe::Prefill {
                    cached_tokens,
                    new_tokens,
                } => {
                    let s = prefill_steps(cached_tokens.into(), new_tokens.into(), 8192);
                    let ttft = s.time_us(profile) + overhead_us + noise(&mut seed, amp);
                    out.push(prefill_observation(
                        cached_tokens,
                        cached_tokens + new_tokens,
                        8192,
                        ttft,
                    ));
                }
                Probe::Decode {
                    batch,
                    prompt_tokens,
                    output_tokens,
                } => {
                    // Lockstep decode: token i + 1 arrives one step after token i.
                    let mut times = vec![Vec::new(); batch as usize];
                    for t in times.iter_mut() {
                        let mut now = 0.0;
                        for i in 1..=output_tokens {
                            if i > 1 {
                                let mut s = StepSums::default();
                                let ctx = f64::from(batch) * f64::from(prompt_tokens + i - 1);
                                s.add_step(0.0, batch.into(), ctx, 0.0);
                                now += s.time_us(profile) + noise(&mut seed, amp);
                            }
                            t.push(now);
                        }
                    }
                    out.extend(decode_observations(prompt_tokens, &times));
                }
            }
        }
        out
    }

    #[test]
    fn a_noisy_sweep_recovers_every_term_within_5_percent() {
        let truth = truth();
        let plan = default_plan(&limits());
        let obs = simulate(&truth, &plan.fit, 700.0, 300.0);
        let fit = fit(&obs).unwrap();
        for t in Term::ALL {
            let (want, got) = (t.of(&truth), fit.value(t));
            assert!(
                ((got - want) / want).abs() < 0.05,
                "{}: fitted {got}, true {want}",
                t.key()
            );
        }
        assert!((fit.request_overhead_us - 700.0).abs() < 300.0, "{fit:?}");
        for f in &fit.families {
            assert!(f.r_squared > 0.99, "{f:?}");
        }
        let held_out = simulate(&truth, &plan.holdout, 700.0, 0.0);
        let errors = fit.check(&held_out);
        assert_eq!(errors.len(), held_out.len());
        for e in errors {
            assert!(e.error_pct().abs() < 5.0, "{e:?}");
        }
    }

    #[test]
    fn a_term_the_pod_does_not_have_is_dropped_not_fitted_as_noise() {
        let mut truth = truth();
        truth.q_us_per_prefill_pair = 0.0;
        truth.k2_us_per_context_token_sq = 0.0;
        let plan = default_plan(&limits());
        let fit = fit(&simulate(&truth, &plan.fit, 700.0, 300.0)).unwrap();
        for t in [Term::Q, Term::K2] {
            let tf = fit.terms.iter().find(|x| x.term == t).unwrap();
            // Either dropped, or fitted to a cost that is negligible on the sweep's largest step.
            assert!(
                tf.dropped.is_some() || tf.value < 2.0 * tf.std_error + 1e-12,
                "{tf:?}"
            );
        }
        assert!((fit.value(Term::A) - 10.0).abs() < 0.5, "{fit:?}");
    }

    #[test]
    fn extreme_sweep_limits_give_a_plan_not_an_overflow() {
        for v in [0, 1, u32::MAX] {
            let plan = default_plan(&SweepLimits {
                max_prompt_tokens: v,
                max_batch: v,
                block_size_tokens: v,
                decode_output_tokens: v,
            });
            assert_eq!(plan.fit.len(), 21);
            assert_eq!(plan.holdout.len(), 3);
        }
    }

    #[test]
    fn missing_families_and_bad_numbers_are_errors_not_panics() {
        let plan = default_plan(&limits());
        let obs = simulate(&truth(), &plan.fit, 700.0, 0.0);
        let prefill_only: Vec<Observation> = obs
            .iter()
            .copied()
            .filter(|o| o.family == Family::Prefill)
            .collect();
        assert_eq!(
            fit(&prefill_only),
            Err(FitError::MissingFamily(Family::Decode.name()))
        );
        let mut bad = obs.clone();
        bad[0].measured_us = f64::NAN;
        assert!(matches!(fit(&bad), Err(FitError::BadMeasurement(_))));
        let few: Vec<Observation> = obs
            .iter()
            .copied()
            .filter(|o| o.family == Family::Prefill)
            .take(2)
            .chain(
                obs.iter()
                    .copied()
                    .filter(|o| o.family == Family::Decode)
                    .take(2),
            )
            .collect();
        assert!(matches!(
            fit(&few),
            Err(FitError::TooFewObservations { found: 4, .. })
        ));
        // All decodes of one shape: b and k cannot be told apart from t0.
        let same: Vec<Observation> = prefill_only
            .iter()
            .copied()
            .chain(std::iter::repeat_n(
                *obs.iter().find(|o| o.family == Family::Decode).unwrap(),
                20,
            ))
            .collect();
        assert!(matches!(fit(&same), Err(FitError::NotObservable(_))));
    }

    #[test]
    fn decode_gaps_outside_the_steady_state_and_garbage_times_are_ignored() {
        // Two requests: the second starts one step late; the first finishes first.
        let a: Vec<f64> = (0..12).map(|i| 1000.0 * f64::from(i)).collect();
        let b: Vec<f64> = (0..12).map(|i| 1000.0 * f64::from(i + 1)).collect();
        let obs = decode_observations(100, &[a, b, vec![f64::NAN, 1.0], vec![5.0]]);
        assert!(!obs.is_empty());
        for o in &obs {
            assert_eq!(o.measured_us, 1000.0);
            assert_eq!(o.sums.decode_seqs, 2.0);
            assert!(!o.includes_request_overhead);
        }
        assert!(decode_observations(100, &[]).is_empty());
    }

    #[test]
    fn probe_step_sums_match_the_engine_model() {
        // A prefill alone, with a cached prefix, chunked by the budget: the engine's steps.
        let mut p = truth();
        p.max_num_batched_tokens = 1000;
        let mut engine = Engine::new(&p, None);
        let blocks: Arc<[u64]> = (0..160u64).collect();
        let req = |id, input_tokens| EngineRequest {
            id,
            blocks: blocks.clone(),
            input_tokens,
            output_tokens: 1,
            adapter: None,
        };
        engine.add_request(0.0, req(1, 1024)).unwrap();
        while let Some(t) = engine.next_step_time() {
            engine.step(t);
        }
        engine.add_request(1e6, req(2, 2500)).unwrap();
        let mut engine_ms = 0.0;
        while let Some(t) = engine.next_step_time() {
            engine_ms += engine.step(t).duration_ms;
        }
        let model = prefill_steps(1024, 2500 - 1024, 1000);
        assert_eq!(model.steps, 2.0);
        assert!((model.time_us(&p) / 1000.0 - engine_ms).abs() < 1e-6);
        // Decodes: the step emitting token j + 1 reads batch × (prompt + j) tokens.
        let mut engine = Engine::new(&p, None);
        for id in 0..3u64 {
            let r = EngineRequest {
                id,
                blocks: Arc::from(vec![1000 + id]),
                input_tokens: 40,
                output_tokens: 5,
                adapter: None,
            };
            engine.add_request(0.0, r).unwrap();
        }
        let first = engine.step(0.0).clone();
        assert_eq!(first.emissions.len(), 3);
        let second = engine.step(first.end_ms).clone();
        assert_eq!(second.decode_seqs, 3);
        assert_eq!(second.context_tokens_read, 3 * (40 + 1));
    }
}
