//! The simulator's HTML report: one self-contained page (inline CSS and SVG, no script, no URL)
//! comparing routing policies across seeds and load levels.
//!
//! Sections, in order:
//! 1. summary table, one row per run;
//! 2. TTFT CDF per rate scale, one colour per policy (one line per seed), log-scale x;
//! 3. p50 and p99 TTFT against the rate scale (only when more than one rate scale was run);
//! 4. per-pod KV usage and queue length (waiting + running) over time, for one run per policy:
//!    its highest rate scale, lowest seed;
//! 5. prefix hit rate per policy and rate scale (mean over seeds);
//! 6. histogram of the prefix scores seen at decision time for the affinity-gate runs (one per
//!    rate scale, summed over seeds) with a marker at the gate threshold, and an overlay of all
//!    policies at the highest rate scale;
//! 7. the affinity gate's branch counts per rate scale (mean over seeds).
//!
//! The threshold marker is the default `affinity_gate_tau` (0.80, [`kvgate_core::config::DEFAULT_AFFINITY_GATE_TAU`]):
//! [`RunMetrics`] does not record the tau a run used.
//!
//! The output depends only on the arguments (runs keep their input order for colours; rows are
//! sorted by policy, rate scale, seed), so the same runs give the same bytes.

mod svg;

use std::fmt::Write;

use kvgate_core::Branch;
use kvgate_core::policy::PolicyKind;

use crate::report::RunMetrics;
use svg::{BarChart, Histogram, LineChart, Marker, Scale, Series, escape, fmt_num};

const STYLE: &str = "
body { font-family: system-ui, -apple-system, 'Segoe UI', sans-serif; margin: 24px auto;
       max-width: 1300px; color: #222; padding: 0 16px; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 13px; }
th, td { border: 1px solid #ddd; padding: 3px 7px; text-align: right; }
th { background: #f4f4f4; } td.text { text-align: left; }
.charts { display: flex; flex-wrap: wrap; gap: 12px; }
.note, .caption { color: #555; font-size: 14px; max-width: 900px; }
.nodata { color: #888; font-style: italic; }
pre { background: #f7f7f7; padding: 8px; font-size: 12px; overflow-x: auto; }
svg.chart { background: #fff; border: 1px solid #eee; }
svg.chart text { font-size: 11px; fill: #333; }
svg.chart text.title { font-size: 13px; font-weight: 600; text-anchor: middle; }
svg.chart text.xtick, svg.chart text.barvalue { text-anchor: middle; }
svg.chart text.barvalue { font-size: 10px; }
svg.chart text.ytick, svg.chart text.markerlabel { text-anchor: end; }
svg.chart text.xlabel, svg.chart text.ylabel { font-size: 12px; text-anchor: middle; }
svg.chart text.legend { font-size: 12px; }
svg.chart text.nodata { font-size: 14px; fill: #888; text-anchor: middle; font-style: italic; }
svg.chart text.markerlabel { fill: #b00; }
svg.chart .grid { stroke: #eee; }
svg.chart .frame { fill: none; stroke: #999; }
svg.chart .line { stroke-width: 1.6; stroke-linejoin: round; }
svg.chart .marker { stroke: #b00; stroke-width: 1.5; stroke-dasharray: 5 3; }
";

/// The gate branches in the order they are reported.
const GATE_BRANCHES: [Branch; 4] = [
    Branch::Explore,
    Branch::Exploit,
    Branch::NoSticky,
    Branch::LoadBreak,
];

/// Renders the report page for `runs` of one workload (`workload_json` is shown as given).
pub fn render_html(
    title: &str,
    workload_json: &serde_json::Value,
    pods: u32,
    profile: &str,
    runs: &[RunMetrics],
) -> String {
    let set = RunSet::new(runs);
    let mut page = String::new();
    let _ = write!(
        page,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>{t}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n<h1>{t}</h1>\n",
        t = escape(title)
    );
    let rates: Vec<String> = set.rates.iter().map(|r| rate_label(*r)).collect();
    let seeds = {
        let mut s: Vec<u64> = runs.iter().map(|r| r.seed).collect();
        s.sort_unstable();
        s.dedup();
        s.iter().map(u64::to_string).collect::<Vec<_>>()
    };
    let _ = writeln!(
        page,
        "<p class=\"note\">{pods} pods, profile <b>{}</b>; {} runs: policies {}; rate scales {}; seeds {}.</p>",
        escape(profile),
        runs.len(),
        list_or_none(set.policies.iter().map(|p| escape(p))),
        list_or_none(rates.into_iter()),
        list_or_none(seeds.into_iter()),
    );
    let workload = serde_json::to_string_pretty(workload_json).unwrap_or_default();
    let _ = writeln!(
        page,
        "<details><summary>Workload</summary><pre>{}</pre></details>",
        escape(&workload)
    );
    if runs.is_empty() {
        page.push_str("<p class=\"nodata\">No data: the report holds no runs.</p>\n");
    } else {
        page.push_str(
            "<nav><a href=\"#summary\">Summary</a> · <a href=\"#cdf\">TTFT CDF</a> · \
             <a href=\"#load\">TTFT vs load</a> · <a href=\"#pods\">Pods over time</a> · \
             <a href=\"#hit\">Prefix hit rate</a> · <a href=\"#scores\">Prefix scores</a> · \
             <a href=\"#gate\">Gate branches</a></nav>\n",
        );
        summary_table(&mut page, &set);
        ttft_cdf_section(&mut page, &set);
        load_section(&mut page, &set);
        pods_section(&mut page, &set);
        hit_rate_section(&mut page, &set);
        scores_section(&mut page, &set);
        gate_section(&mut page, &set);
    }
    page.push_str("</body>\n</html>\n");
    page
}

/// The runs with their policies (in order of first appearance, which fixes their colours) and
/// rate scales (ascending).
struct RunSet<'a> {
    runs: &'a [RunMetrics],
    policies: Vec<&'a str>,
    rates: Vec<f64>,
}

impl<'a> RunSet<'a> {
    fn new(runs: &'a [RunMetrics]) -> Self {
        let mut policies: Vec<&str> = Vec::new();
        for r in runs {
            if !policies.contains(&r.policy.as_str()) {
                policies.push(&r.policy);
            }
        }
        let mut rates: Vec<f64> = runs.iter().map(|r| r.rate_scale).collect();
        rates.sort_by(f64::total_cmp);
        rates.dedup_by(|a, b| same_rate(*a, *b));
        RunSet {
            runs,
            policies,
            rates,
        }
    }

    fn color(&self, policy: &str) -> &'static str {
        svg::color(self.policies.iter().position(|p| *p == policy).unwrap_or(0))
    }

    /// The runs of `policy` at `rate`, by ascending seed.
    fn at(&self, policy: &str, rate: f64) -> Vec<&'a RunMetrics> {
        let mut v: Vec<&RunMetrics> = self
            .runs
            .iter()
            .filter(|r| r.policy == policy && same_rate(r.rate_scale, rate))
            .collect();
        v.sort_by_key(|r| r.seed);
        v
    }

    /// Mean of `f` over the seeds of `policy` at `rate`; `None` when there is no such run.
    fn mean(&self, policy: &str, rate: f64, f: impl Fn(&RunMetrics) -> f64) -> Option<f64> {
        let runs = self.at(policy, rate);
        if runs.is_empty() {
            return None;
        }
        Some(runs.iter().map(|r| f(r)).sum::<f64>() / runs.len() as f64)
    }

    fn affinity_gate_rates(&self) -> Vec<f64> {
        let name = PolicyKind::AffinityGate.name();
        self.rates
            .iter()
            .copied()
            .filter(|r| !self.at(name, *r).is_empty())
            .collect()
    }
}

fn same_rate(a: f64, b: f64) -> bool {
    a.total_cmp(&b).is_eq()
}

fn rate_label(rate: f64) -> String {
    format!("×{}", fmt_num(rate, 3))
}

/// A table cell: fixed decimals so that columns line up; "n/a" when not finite.
fn fixed(v: f64, decimals: usize) -> String {
    if v.is_finite() {
        format!("{v:.decimals$}")
    } else {
        "n/a".to_string()
    }
}

fn list_or_none(items: impl Iterator<Item = String>) -> String {
    let v: Vec<String> = items.collect();
    if v.is_empty() {
        "none".to_string()
    } else {
        v.join(", ")
    }
}

fn charts(page: &mut String, svgs: &[String]) {
    page.push_str("<div class=\"charts\">\n");
    for s in svgs {
        page.push_str(s);
        page.push('\n');
    }
    page.push_str("</div>\n");
}

fn note(page: &mut String, class: &str, text: &str) {
    let _ = writeln!(page, "<p class=\"{class}\">{text}</p>");
}

fn summary_table(page: &mut String, set: &RunSet) {
    page.push_str("<h2 id=\"summary\">Summary</h2>\n<table>\n<tr><th>policy</th><th>rate scale</th><th>seed</th><th>completed</th><th>TTFT mean (ms)</th><th>TTFT p50</th><th>TTFT p90</th><th>TTFT p99</th><th>TPOT p50 (ms)</th><th>prefix hit rate</th><th>output tok/s</th><th>load imbalance CV</th><th>branches</th></tr>\n");
    let mut rows: Vec<&RunMetrics> = set.runs.iter().collect();
    let policy_rank = |p: &str| set.policies.iter().position(|q| *q == p);
    rows.sort_by(|a, b| {
        policy_rank(&a.policy)
            .cmp(&policy_rank(&b.policy))
            .then(a.rate_scale.total_cmp(&b.rate_scale))
            .then(a.seed.cmp(&b.seed))
    });
    for r in rows {
        let branches = if r.branches.is_empty() {
            "–".to_string()
        } else {
            r.branches
                .iter()
                .map(|(k, v)| format!("{} {v}", escape(k)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let _ = writeln!(
            page,
            "<tr><td class=\"text\"><span style=\"color:{}\">■</span> {}</td><td>{}</td><td>{}</td><td>{}/{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}%</td><td>{}</td><td>{}</td><td class=\"text\">{}</td></tr>",
            set.color(&r.policy),
            escape(&r.policy),
            rate_label(r.rate_scale),
            r.seed,
            r.completed,
            r.requests,
            fixed(r.ttft_ms.mean, 1),
            fixed(r.ttft_ms.p50, 1),
            fixed(r.ttft_ms.p90, 1),
            fixed(r.ttft_ms.p99, 1),
            fixed(r.tpot_ms.p50, 2),
            fixed(r.prefix_hit_rate * 100.0, 1),
            fixed(r.output_tok_per_s, 0),
            fixed(r.load_imbalance_cv, 3),
            branches,
        );
    }
    page.push_str("</table>\n");
}

fn ttft_cdf_section(page: &mut String, set: &RunSet) {
    page.push_str("<h2 id=\"cdf\">TTFT CDF</h2>\n");
    note(
        page,
        "caption",
        "Fraction of completed requests with a TTFT at or below x (log scale). One colour per \
         policy; with several seeds each seed is its own line. Lines further left are better.",
    );
    let svgs: Vec<String> = set
        .rates
        .iter()
        .map(|&rate| {
            let mut series = Vec::new();
            for policy in &set.policies {
                for (i, r) in set.at(policy, rate).into_iter().enumerate() {
                    series.push(Series {
                        label: (i == 0).then(|| policy.to_string()),
                        color: set.color(policy),
                        points: r.ttft_cdf.clone(),
                        markers: false,
                    });
                }
            }
            svg::line_chart(&LineChart {
                title: format!("TTFT CDF, rate scale {}", rate_label(rate)),
                x_label: "TTFT (ms, log scale)".into(),
                y_label: "fraction of requests ≤ x".into(),
                x_scale: Scale::Log,
                y_scale: Scale::Linear,
                y_range: Some((0.0, 1.0)),
                series,
                markers: vec![],
            })
        })
        .collect();
    charts(page, &svgs);
}

fn load_section(page: &mut String, set: &RunSet) {
    page.push_str("<h2 id=\"load\">TTFT against load</h2>\n");
    if set.rates.len() < 2 {
        note(
            page,
            "nodata",
            &format!(
                "Only one rate scale ({}) was run; run several rate scales to see TTFT against load.",
                set.rates.first().map_or("none".into(), |r| rate_label(*r))
            ),
        );
        return;
    }
    note(
        page,
        "caption",
        "TTFT percentiles (mean over seeds) as the arrival rate is scaled up (log-scale y).",
    );
    let chart = |name: &str, pick: fn(&RunMetrics) -> f64| {
        let series = set
            .policies
            .iter()
            .map(|policy| Series {
                label: Some(policy.to_string()),
                color: set.color(policy),
                points: set
                    .rates
                    .iter()
                    .filter_map(|&rate| set.mean(policy, rate, pick).map(|v| (rate, v)))
                    .collect(),
                markers: true,
            })
            .collect();
        svg::line_chart(&LineChart {
            title: format!("{name} TTFT against load"),
            x_label: "rate scale (× the workload's arrival rate)".into(),
            y_label: format!("{name} TTFT (ms, log scale)"),
            x_scale: Scale::Linear,
            y_scale: Scale::Log,
            y_range: None,
            series,
            markers: vec![],
        })
    };
    let svgs = [
        chart("p50", |r| r.ttft_ms.p50),
        chart("p99", |r| r.ttft_ms.p99),
    ];
    charts(page, &svgs);
}

fn pods_section(page: &mut String, set: &RunSet) {
    page.push_str("<h2 id=\"pods\">Pods over time</h2>\n");
    note(
        page,
        "caption",
        "KV-cache usage and queue length (waiting + running requests) of every pod, as scraped, \
         for one run per policy: its highest rate scale and lowest seed. One line per pod; \
         lines that stay apart mean an uneven load.",
    );
    for policy in &set.policies {
        let Some(run) = set
            .rates
            .iter()
            .rev()
            .find_map(|&rate| set.at(policy, rate).into_iter().next())
        else {
            continue;
        };
        let series = |y: fn(&crate::report::PodSample) -> f64| -> Vec<Series> {
            run.pod_samples
                .iter()
                .enumerate()
                .map(|(i, samples)| Series {
                    label: Some(format!("pod {i}")),
                    color: svg::color(i),
                    points: samples.iter().map(|s| (s.t_ms / 1000.0, y(s))).collect(),
                    markers: false,
                })
                .collect()
        };
        let which = format!(
            "{}, rate scale {}, seed {}",
            policy,
            rate_label(run.rate_scale),
            run.seed
        );
        let svgs = [
            svg::line_chart(&LineChart {
                title: format!("KV usage: {which}"),
                x_label: "time (s)".into(),
                y_label: "KV-cache usage (fraction)".into(),
                x_scale: Scale::Linear,
                y_scale: Scale::Linear,
                y_range: Some((0.0, 1.0)),
                series: series(|s| s.kv_usage),
                markers: vec![],
            }),
            svg::line_chart(&LineChart {
                title: format!("Queue: {which}"),
                x_label: "time (s)".into(),
                y_label: "waiting + running requests".into(),
                x_scale: Scale::Linear,
                y_scale: Scale::Linear,
                y_range: None,
                series: series(|s| f64::from(s.waiting) + f64::from(s.running)),
                markers: vec![],
            }),
        ];
        charts(page, &svgs);
    }
}

fn hit_rate_section(page: &mut String, set: &RunSet) {
    page.push_str("<h2 id=\"hit\">Prefix hit rate</h2>\n");
    note(
        page,
        "caption",
        "Prompt tokens served from the pods' prefix caches, as a share of all prompt tokens \
         (engine counters, mean over seeds).",
    );
    let chart = svg::bar_chart(&BarChart {
        title: "Prefix hit rate by policy and rate scale".into(),
        x_label: "rate scale".into(),
        y_label: "prefix hit rate (%)".into(),
        categories: set.rates.iter().map(|r| rate_label(*r)).collect(),
        groups: set
            .policies
            .iter()
            .map(|policy| {
                let values = set
                    .rates
                    .iter()
                    .map(|&rate| {
                        set.mean(policy, rate, |r| r.prefix_hit_rate * 100.0)
                            .unwrap_or(f64::NAN)
                    })
                    .collect();
                (policy.to_string(), set.color(policy), values)
            })
            .collect(),
        y_range: Some((0.0, 100.0)),
        value_decimals: 1,
    });
    charts(page, &[chart]);
}

/// Sums histograms of equal length (shorter ones are padded with zeros).
fn summed_histogram<'r>(runs: impl Iterator<Item = &'r RunMetrics>) -> Vec<u64> {
    let mut total: Vec<u64> = Vec::new();
    for r in runs {
        if total.len() < r.score_histogram.len() {
            total.resize(r.score_histogram.len(), 0);
        }
        for (t, c) in total.iter_mut().zip(&r.score_histogram) {
            *t = t.saturating_add(*c);
        }
    }
    total
}

/// Each bin's share of the total; empty when the total is zero.
fn fractions(counts: &[u64]) -> Vec<f64> {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return Vec::new();
    }
    counts.iter().map(|c| *c as f64 / total as f64).collect()
}

fn scores_section(page: &mut String, set: &RunSet) {
    let tau = kvgate_core::config::DEFAULT_AFFINITY_GATE_TAU;
    let tau_marker = || {
        vec![Marker {
            x: tau,
            label: format!("tau = {}", fmt_num(tau, 2)),
        }]
    };
    page.push_str("<h2 id=\"scores\">Prefix scores at decision time</h2>\n");
    let _ = writeln!(
        page,
        "<p class=\"caption\">Share of (request, pod) pairs by the pod's prefix score when the \
         router decided (20 bins over [0, 1]), summed over seeds. The dashed line is the affinity \
         gate's threshold tau = {} (a pod is sticky when its score is above it). \
         <b>Is it bimodal?</b> The gate works when scores split into a cluster near 0 (pods \
         without the prefix) and one near 1 (the pod holding the conversation) with little mass \
         around tau; much mass near the line means small changes of tau flip many decisions.</p>",
        fmt_num(tau, 2)
    );
    let ag = PolicyKind::AffinityGate.name();
    let ag_rates = set.affinity_gate_rates();
    if ag_rates.is_empty() {
        note(page, "nodata", "No affinity-gate runs: no gate histogram.");
    }
    let mut svgs: Vec<String> = ag_rates
        .iter()
        .map(|&rate| {
            let counts = summed_histogram(set.at(ag, rate).into_iter());
            let bins = fractions(&counts);
            // Most pairs usually score 0 (pods without the prefix); a log axis keeps the
            // smaller modes visible when the bins span orders of magnitude.
            let max = bins.iter().copied().fold(0.0_f64, f64::max);
            let min_nonzero = bins
                .iter()
                .copied()
                .filter(|v| *v > 0.0)
                .fold(f64::INFINITY, f64::min);
            let y_scale = if max / min_nonzero > 50.0 {
                Scale::Log
            } else {
                Scale::Linear
            };
            svg::histogram(&Histogram {
                title: format!("Prefix scores, {ag}, rate scale {}", rate_label(rate)),
                x_label: "prefix score".into(),
                y_label: format!(
                    "share of (request, pod) pairs{}",
                    if y_scale == Scale::Log {
                        " (log scale)"
                    } else {
                        ""
                    }
                ),
                x_min: 0.0,
                x_max: 1.0,
                bins,
                color: set.color(ag),
                y_scale,
                markers: tau_marker(),
            })
        })
        .collect();
    if let Some(&rate) = set.rates.last() {
        let series = set
            .policies
            .iter()
            .map(|policy| {
                let bins = fractions(&summed_histogram(set.at(policy, rate).into_iter()));
                let width = 1.0 / bins.len().max(1) as f64;
                Series {
                    label: Some(policy.to_string()),
                    color: set.color(policy),
                    points: bins
                        .iter()
                        .enumerate()
                        .map(|(i, v)| ((i as f64 + 0.5) * width, *v))
                        .collect(),
                    markers: true,
                }
            })
            .collect();
        svgs.push(svg::line_chart(&LineChart {
            title: format!(
                "Prefix scores, all policies, rate scale {}",
                rate_label(rate)
            ),
            x_label: "prefix score (bin centre)".into(),
            y_label: "share of pairs (log scale)".into(),
            x_scale: Scale::Linear,
            y_scale: Scale::Log,
            y_range: None,
            series,
            markers: tau_marker(),
        }));
    }
    charts(page, &svgs);
}

fn gate_section(page: &mut String, set: &RunSet) {
    page.push_str("<h2 id=\"gate\">Affinity-gate branches</h2>\n");
    let ag = PolicyKind::AffinityGate.name();
    let ag_rates = set.affinity_gate_rates();
    if ag_rates.is_empty() {
        note(page, "nodata", "No affinity-gate runs: no branch counts.");
        return;
    }
    note(
        page,
        "caption",
        "Decisions per run (mean over seeds) by the gate's branch: explore (epsilon skipped the \
         gate), exploit (a sticky pod was chosen), no_sticky (no pod above tau), load_break (the \
         sticky pod's predicted TTFT was too far above the best pod's).",
    );
    let count = |r: &RunMetrics, b: Branch| -> f64 {
        let n = match b {
            Branch::Explore => r.gate.explore,
            Branch::Exploit => r.gate.exploit,
            Branch::NoSticky => r.gate.no_sticky,
            Branch::LoadBreak => r.gate.load_break,
            Branch::Reason(_) => 0,
        };
        n as f64
    };
    let chart = svg::bar_chart(&BarChart {
        title: format!("{ag} branches by rate scale"),
        x_label: "rate scale".into(),
        y_label: "decisions per run".into(),
        categories: ag_rates.iter().map(|r| rate_label(*r)).collect(),
        groups: GATE_BRANCHES
            .iter()
            .enumerate()
            .map(|(i, &b)| {
                let values = ag_rates
                    .iter()
                    .map(|&rate| set.mean(ag, rate, |r| count(r, b)).unwrap_or(f64::NAN))
                    .collect();
                (b.as_str().to_string(), svg::color(i), values)
            })
            .collect(),
        y_range: None,
        value_decimals: 0,
    });
    charts(page, &[chart]);
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::report::{GateCounts, Percentiles, PodSample, PredictorMetrics, SCORE_BINS};

    const POLICIES: [&str; 3] = ["round-robin", "prefix", "affinity-gate"];
    const RATES: [f64; 2] = [1.0, 2.0];
    const SEEDS: [u64; 2] = [1, 2];
    const PODS: usize = 4;

    /// A plausible run: latencies grow with the rate, the affinity gate has a bimodal histogram.
    fn run(policy: &str, rate_scale: f64, seed: u64) -> RunMetrics {
        let policy_factor = match policy {
            "round-robin" => 1.6,
            "prefix" => 1.2,
            _ => 1.0,
        };
        let base = (100.0 * rate_scale + 5.0 * seed as f64) * policy_factor;
        let ttft_cdf: Vec<(f64, f64)> = (1..=50)
            .map(|i| (base * (1.0 + f64::from(i) / 10.0), f64::from(i) / 50.0))
            .collect();
        let pod_samples = (0..PODS)
            .map(|pod| {
                (0..30)
                    .map(|t| PodSample {
                        t_ms: f64::from(t) * 50.0,
                        kv_usage: (0.1 * pod as f64 + 0.02 * f64::from(t)).min(1.0),
                        waiting: (t % 5) as u32,
                        running: pod as u32 + 1,
                    })
                    .collect()
            })
            .collect();
        let mut score_histogram = vec![0; SCORE_BINS];
        score_histogram[0] = 900;
        score_histogram[10] = 5;
        score_histogram[SCORE_BINS - 1] = 300;
        let gate = if policy == "affinity-gate" {
            GateCounts {
                explore: 3,
                exploit: 250,
                no_sticky: 40,
                load_break: 7,
            }
        } else {
            GateCounts::default()
        };
        let mut branches = BTreeMap::new();
        branches.insert("least_loaded".to_string(), 300);
        RunMetrics {
            policy: policy.to_string(),
            rate_scale,
            seed,
            requests: 300,
            completed: 300,
            preemptions: 0,
            lora_loads: 0,
            ttft_ms: Percentiles {
                mean: base * 2.0,
                p50: base * 1.8,
                p90: base * 4.0,
                p99: base * 5.5,
            },
            tpot_ms: Percentiles {
                mean: 25.0,
                p50: 24.0,
                p90: 30.0,
                p99: 40.0,
            },
            e2e_ms: Percentiles::default(),
            prefix_hit_rate: if policy == "round-robin" { 0.2 } else { 0.7 },
            output_tok_per_s: 1234.5,
            load_imbalance_cv: 0.12,
            gate,
            predictor: PredictorMetrics::default(),
            sim_wall_s: 0.5,
            rejected: 0,
            branches,
            mean_pod_busy: 0.6,
            makespan_s: 1.5,
            score_histogram,
            ttft_cdf,
            pod_samples,
            stalled_steps: 0,
            in_flight_left: 0,
            faults: None,
            kv_index: None,
            slo_goodput: None,
            gate_state: None,
            routes: Vec::new(),
            flow: None,
            models: Vec::new(),
        }
    }

    fn grid(policies: &[&str], rates: &[f64]) -> Vec<RunMetrics> {
        let mut runs = Vec::new();
        for p in policies {
            for r in rates {
                for s in SEEDS {
                    runs.push(run(p, *r, s));
                }
            }
        }
        runs
    }

    fn render(runs: &[RunMetrics]) -> String {
        let workload = serde_json::json!({"kind": "chat", "request_count": 300});
        render_html("kvgate sim", &workload, PODS as u32, "h100-llama8b", runs)
    }

    fn svg_count(page: &str) -> usize {
        page.matches("<svg").count()
    }

    #[test]
    fn page_has_one_svg_per_expected_chart() {
        let page = render(&grid(&POLICIES, &RATES));
        // CDF: one per rate (2); load: p50 and p99 (2); pods: KV and queue per policy (6);
        // hit rate (1); scores: affinity gate per rate (2) + all policies (1); gate (1).
        assert_eq!(svg_count(&page), 2 + 2 + 6 + 1 + 3 + 1);
        assert_eq!(page.matches("</svg>").count(), 15);
        for title in [
            "TTFT CDF, rate scale ×1",
            "TTFT CDF, rate scale ×2",
            "p50 TTFT against load",
            "p99 TTFT against load",
            "KV usage: prefix, rate scale ×2, seed 1",
            "Queue: affinity-gate, rate scale ×2, seed 1",
            "Prefix hit rate by policy and rate scale",
            "Prefix scores, affinity-gate, rate scale ×1",
            "Prefix scores, all policies, rate scale ×2",
            "affinity-gate branches by rate scale",
            "tau = 0.8",
            "Is it bimodal?",
        ] {
            assert!(page.contains(title), "missing {title:?}");
        }
        // One summary row per run.
        assert_eq!(page.matches("<tr><td").count(), 12);
    }

    #[test]
    fn single_rate_scale_gets_a_note_instead_of_load_charts() {
        let page = render(&grid(&POLICIES, &[1.0]));
        assert!(page.contains("Only one rate scale (×1) was run"));
        assert!(!page.contains("TTFT against load</text>"));
        // CDF 1 + pods 6 + hit rate 1 + scores 1 + 1 + gate 1.
        assert_eq!(svg_count(&page), 11);
    }

    #[test]
    fn without_affinity_gate_runs_gate_sections_say_so() {
        let page = render(&grid(&["round-robin"], &RATES));
        assert!(page.contains("No affinity-gate runs: no gate histogram."));
        assert!(page.contains("No affinity-gate runs: no branch counts."));
        // CDF 2 + load 2 + pods 2 + hit rate 1 + all-policies scores 1.
        assert_eq!(svg_count(&page), 8);
    }

    #[test]
    fn policy_names_and_title_are_escaped() {
        let runs = grid(&["a<&>b", "affinity-gate"], &RATES);
        let workload = serde_json::json!({"source": "<script>"});
        let page = render_html("<T&>", &workload, 4, "p<1>", &runs);
        assert!(!page.contains("a<&>b"));
        assert!(page.contains("a&lt;&amp;&gt;b"));
        assert!(page.contains("<title>&lt;T&amp;&gt;</title>"));
        assert!(page.contains("p&lt;1&gt;"));
        assert!(!page.contains("<script"));
    }

    #[test]
    fn empty_runs_give_a_no_data_page() {
        let page = render(&[]);
        assert!(page.contains("No data: the report holds no runs."));
        assert_eq!(svg_count(&page), 0);
        assert!(page.ends_with("</html>\n"));
    }

    #[test]
    fn empty_and_degenerate_runs_render_no_data_charts_without_nan() {
        let mut empty = run("affinity-gate", 1.0, 1);
        empty.ttft_cdf.clear();
        empty.pod_samples.clear();
        empty.score_histogram = vec![0; SCORE_BINS];
        empty.prefix_hit_rate = f64::NAN;
        empty.gate = GateCounts::default();
        let mut weird = run("prefix", f64::NAN, 1);
        weird.ttft_cdf = vec![(0.0, 0.5), (f64::INFINITY, 1.0), (f64::NAN, f64::NAN)];
        weird.ttft_ms.p99 = f64::INFINITY;
        weird.score_histogram.clear();
        weird.pod_samples = vec![vec![PodSample {
            t_ms: f64::NAN,
            kv_usage: f64::INFINITY,
            waiting: 0,
            running: 0,
        }]];
        let mut zero = run("round-robin", 0.0, 1);
        zero.ttft_ms = Percentiles::default();
        zero.ttft_cdf = vec![(0.0, 1.0)];
        let page = render(&[empty, weird, zero]);
        assert!(page.contains(">no data</text>"));
        assert_no_non_finite_numbers(&page);
    }

    #[test]
    fn output_is_deterministic() {
        let runs = grid(&POLICIES, &RATES);
        assert_eq!(render(&runs), render(&runs));
        let mut shuffled = runs.clone();
        shuffled.swap(1, 3);
        let a = render(&runs);
        let b = render(&shuffled);
        // Seeds of one policy sorted in the page: reordering them changes nothing.
        assert_eq!(a, b);
    }

    #[test]
    fn page_is_self_contained() {
        let page = render(&grid(&POLICIES, &RATES));
        for needle in [
            "http://", "https://", "<script", "<link", "src=", "@import", "url(",
        ] {
            assert!(!page.contains(needle), "page contains {needle:?}");
        }
    }

    #[test]
    fn svg_numbers_are_finite() {
        assert_no_non_finite_numbers(&render(&grid(&POLICIES, &RATES)));
    }

    /// No NaN or infinity anywhere in the SVG markup.
    fn assert_no_non_finite_numbers(page: &str) {
        let mut rest = page;
        while let Some(start) = rest.find("<svg") {
            let end = rest[start..]
                .find("</svg>")
                .map_or(rest.len(), |e| start + e);
            let svg = &rest[start..end];
            for bad in ["NaN", "inf"] {
                assert!(!svg.contains(bad), "{bad} in {svg}");
            }
            rest = &rest[end..];
        }
    }

    /// Writes a sample page for eyeballing: `cargo test -p kvgate-sim --lib html -- --ignored`.
    #[test]
    #[ignore = "writes /tmp/kvgate-sample.html"]
    fn write_sample_page() {
        let page = render(&grid(&POLICIES, &RATES));
        std::fs::write("/tmp/kvgate-sample.html", page).expect("write sample page");
    }
}
