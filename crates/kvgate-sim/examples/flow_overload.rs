//! Flow control measured in the simulator: a trace at an overload rate with 20 % high-priority
//! requests and one tenant sending 10× its share, flow control off vs on.
//!
//! ```text
//! cargo run --release -p kvgate-sim --example flow_overload -- \
//!     TRACE [--pods 16] [--rate-scale 6] [--unloaded-rate-scale 1] [--seed 1] \
//!     [--queue-ttl-ms 30000] [--queue-depth 5] [--max-in-flight 0] [--kv-threshold 0.8] \
//!     [--bulk-reserve 0.3] [--bulk-window-ms 10000] [--bulk-queue-reserve 4]
//! ```
//!
//! Runs (same seed, affinity-gate, tags from `workload::classes` defaults):
//! 1. `unloaded`: the trace at `--unloaded-rate-scale`, flow control off: the reference TTFTs.
//! 2. `off` / `on`: the trace at `--rate-scale`, the noisy tenant at 10× its share.
//! 3. `off-share` / `on-share`: the same, the noisy tenant thinned to its share (the other
//!    tenants' requests identical): the reference for "the noisy tenant raises the others' p99".
//!
//! Prints one Markdown table row per run: p99 TTFT of high-priority requests, its ratio to the
//! unloaded run's and the p99 of their time in the flow queue (part of the TTFT), p99 of normal-priority, p99 of the quiet tenants' requests (all
//! priorities) and its ratio to the same flow setting with the noisy tenant at its share, the
//! share of each group served, and what flow control shed; then, per run, where each group's
//! TTFT goes (p50/p99 of the time in the flow queue and of the pod's part, dispatch to first
//! token) and what the saturation detector saw at the release checks with requests queued
//! (pods closed by KV usage, by their queue, open). `--bulk-reserve` is
//! `saturation.bulk_kv_reserve` (its default, 0.3; 0 turns bulk requests off);
//! `--bulk-window-ms` is `bulk_window_ms` (the flooding rule's time constant, 10,000; 0 off);
//! `--bulk-queue-reserve` is `saturation.bulk_queue_reserve` (4; 0 off).

use kvgate_core::flow::FlowConfig;
use kvgate_core::policy::PolicyKind;
use kvgate_sim::SimRequest;
use kvgate_sim::cluster::{self, ClusterConfig, SimClass};
use kvgate_sim::report::{Percentiles, RunMetrics};
use kvgate_sim::workload::{self, classes};

struct Args {
    trace: String,
    pods: u32,
    rate: f64,
    unloaded_rate: f64,
    seed: u64,
    ttl_ms: u64,
    depth: u32,
    max_in_flight: u32,
    kv_threshold: f64,
    bulk_reserve: f64,
    bulk_window_ms: u64,
    bulk_queue_reserve: u32,
}

fn args() -> Args {
    let mut a = Args {
        trace: String::new(),
        pods: 16,
        rate: 6.0,
        unloaded_rate: 1.0,
        seed: 1,
        ttl_ms: 30_000,
        depth: 5,
        max_in_flight: 0,
        kv_threshold: 0.8,
        bulk_reserve: FlowConfig::default().saturation.bulk_kv_reserve,
        bulk_window_ms: FlowConfig::default().bulk_window_ms,
        bulk_queue_reserve: FlowConfig::default().saturation.bulk_queue_reserve,
    };
    let mut it = std::env::args().skip(1);
    while let Some(x) = it.next() {
        let mut val = || it.next().expect("a value after the flag");
        match x.as_str() {
            "--pods" => a.pods = val().parse().expect("--pods N"),
            "--rate-scale" => a.rate = val().parse().expect("--rate-scale X"),
            "--unloaded-rate-scale" => a.unloaded_rate = val().parse().expect("a number"),
            "--seed" => a.seed = val().parse().expect("--seed N"),
            "--queue-ttl-ms" => a.ttl_ms = val().parse().expect("--queue-ttl-ms N"),
            "--queue-depth" => a.depth = val().parse().expect("--queue-depth N"),
            "--max-in-flight" => a.max_in_flight = val().parse().expect("--max-in-flight N"),
            "--bulk-reserve" => a.bulk_reserve = val().parse().expect("--bulk-reserve X"),
            "--bulk-window-ms" => a.bulk_window_ms = val().parse().expect("--bulk-window-ms N"),
            "--bulk-queue-reserve" => a.bulk_queue_reserve = val().parse().expect("a count"),
            "--kv-threshold" => a.kv_threshold = val().parse().expect("--kv-threshold X"),
            t if !t.starts_with("--") => a.trace = t.to_string(),
            other => panic!("unknown flag {other}"),
        }
    }
    assert!(!a.trace.is_empty(), "usage: flow_overload TRACE [flags]");
    a
}

fn run(a: &Args, rate: f64, flow: bool, reqs: &[SimRequest], cls: &[SimClass]) -> RunMetrics {
    let mut c = ClusterConfig::new(a.pods, PolicyKind::AffinityGate, a.seed);
    c.rate_scale = rate;
    c.flow = FlowConfig {
        enabled: flow,
        queue_ttl_ms: a.ttl_ms,
        // The simulator's queue holds the whole overload: no size bound bites before the TTL.
        max_queued_requests: 1 << 20,
        tenant_max_share: 1.0,
        ..FlowConfig::default()
    };
    c.flow.saturation.queue_depth_threshold = a.depth;
    c.flow.saturation.max_in_flight_per_pod = a.max_in_flight;
    c.flow.saturation.kv_cache_util_threshold = a.kv_threshold;
    c.flow.saturation.bulk_kv_reserve = a.bulk_reserve;
    c.flow.bulk_window_ms = a.bulk_window_ms;
    c.flow.saturation.bulk_queue_reserve = a.bulk_queue_reserve;
    cluster::run_classified(&c, reqs, cls)
}

struct Row {
    high: Percentiles,
    /// p99 of the time high-priority requests waited in the flow queue (NaN with it off).
    high_queue_p99: f64,
    normal: Percentiles,
    quiet: Percentiles,
    served: [f64; 3],
}

fn row(m: &RunMetrics, cls: &[SimClass]) -> Row {
    let t = &m.flow.as_ref().expect("classified run").ttft_ms_by_request;
    let pick = |f: &dyn Fn(&SimClass) -> bool| {
        let (mut v, asked) = classes::ttfts_where(t, cls, f);
        let served = v.len() as f64 / asked.max(1) as f64;
        (Percentiles::of(&mut v), served)
    };
    let (high, sh) = pick(&|c| c.priority > 0);
    let (normal, sn) = pick(&|c| c.priority == 0);
    let (quiet, sq) = pick(&|c| c.tenant != 0);
    let f = m.flow.as_ref().expect("classified run");
    let (mut q, _) = classes::ttfts_where(&f.queue_ms_by_request, cls, |c| c.priority > 0);
    let high_queue_p99 = if q.is_empty() {
        f64::NAN
    } else {
        Percentiles::of(&mut q).p99
    };
    Row {
        high,
        high_queue_p99,
        normal,
        quiet,
        served: [sh, sn, sq],
    }
}

/// p50 / p99 of (TTFT, time in the flow queue, TTFT less that: the pod's share) for a group.
fn split(m: &RunMetrics, cls: &[SimClass], f: &dyn Fn(&SimClass) -> bool) -> String {
    let fl = m.flow.as_ref().expect("classified run");
    let (mut t, mut q, mut p) = (Vec::new(), Vec::new(), Vec::new());
    for ((tt, qq), c) in fl
        .ttft_ms_by_request
        .iter()
        .zip(&fl.queue_ms_by_request)
        .zip(cls)
    {
        if f(c) && tt.is_finite() {
            let qq = if qq.is_finite() { *qq } else { 0.0 };
            t.push(*tt);
            q.push(qq);
            p.push(tt - qq);
        }
    }
    let (t, q, p) = (
        Percentiles::of(&mut t),
        Percentiles::of(&mut q),
        Percentiles::of(&mut p),
    );
    format!(
        "ttft {:.0}/{:.0}, queue {:.0}/{:.0}, pod {:.0}/{:.0}",
        t.p50, t.p99, q.p50, q.p99, p.p50, p.p99
    )
}

fn main() {
    let a = args();
    let (_, reqs) = workload::load_trace(&a.trace).expect("readable trace");
    let params = classes::ClassParams {
        seed: a.seed,
        ..classes::ClassParams::default()
    };
    let cls = classes::tag(&reqs, &params);
    let (share_reqs, share_cls) =
        classes::thin_tenant(&reqs, &cls, 0, 1.0 / params.noisy_factor, a.seed);
    let t0 = std::time::Instant::now();
    let unloaded_m = run(&a, a.unloaded_rate, false, &reqs, &cls);
    let unloaded = row(&unloaded_m, &cls);
    let mut rows = Vec::new();
    for (name, flow, r, c) in [
        ("off", false, &reqs, &cls),
        ("on", true, &reqs, &cls),
        ("off-share", false, &share_reqs, &share_cls),
        ("on-share", true, &share_reqs, &share_cls),
    ] {
        let m = run(&a, a.rate, flow, r, c);
        rows.push((name, row(&m, c), m));
    }
    println!(
        "{} requests ({} with the noisy tenant at its share), {} pods, rate {}× (unloaded {}×), seed {}, TTL {} ms, queue depth {}, max in flight per pod {}, KV threshold {}, bulk KV reserve {}, bulk window {} ms, bulk queue reserve {}; {:.1} s wall",
        reqs.len(),
        share_reqs.len(),
        a.pods,
        a.rate,
        a.unloaded_rate,
        a.seed,
        a.ttl_ms,
        a.depth,
        a.max_in_flight,
        a.kv_threshold,
        a.bulk_reserve,
        a.bulk_window_ms,
        a.bulk_queue_reserve,
        t0.elapsed().as_secs_f64()
    );
    println!(
        "unloaded: high p99 {:.0} ms, normal p99 {:.0} ms, quiet tenants p99 {:.0} ms",
        unloaded.high.p99, unloaded.normal.p99, unloaded.quiet.p99
    );
    println!();
    println!(
        "| run | high p99 ms | ÷ unloaded | of it queued, p99 ms | high served % | normal p99 ms | normal served % | quiet tenants p99 ms | ÷ same with noisy at share | quiet served % | queued | expired | mean queue ms |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let quiet_ref = |name: &str| -> f64 {
        let base = if name.starts_with("on") {
            "on-share"
        } else {
            "off-share"
        };
        rows.iter()
            .find(|(n, _, _)| *n == base)
            .map_or(f64::NAN, |(_, r, _)| r.quiet.p99)
    };
    for (name, r, m) in &rows {
        let f = m.flow.as_ref().unwrap();
        println!(
            "| {name} | {:.0} | {:.2} | {} | {:.1} | {:.0} | {:.1} | {:.0} | {:.2} | {:.1} | {} | {} | {:.0} |",
            r.high.p99,
            r.high.p99 / unloaded.high.p99,
            if r.high_queue_p99.is_finite() {
                format!("{:.0}", r.high_queue_p99)
            } else {
                "–".into()
            },
            100.0 * r.served[0],
            r.normal.p99,
            100.0 * r.served[1],
            r.quiet.p99,
            r.quiet.p99 / quiet_ref(name),
            100.0 * r.served[2],
            f.queued,
            f.expired,
            f.mean_queue_ms,
        );
    }
    println!();
    println!("Where the TTFT goes (p50/p99 ms; pod = from dispatch to first token):");
    let all: Vec<(&str, &RunMetrics, &[SimClass])> =
        std::iter::once(("unloaded", &unloaded_m, &cls[..]))
            .chain(rows.iter().map(|(n, _, m)| {
                let c: &[SimClass] = if n.ends_with("share") {
                    &share_cls
                } else {
                    &cls
                };
                (*n, m, c)
            }))
            .collect();
    for (name, m, c) in all {
        let f = m.flow.as_ref().unwrap();
        let checks =
            (f.detector_pods_kv + f.detector_pods_queue + f.detector_pods_open).max(1) as f64;
        println!(
            "- {name}: high {}; quiet {}; noisy {}; detector (pod-checks with a queue): KV-closed {:.0} %, queue-closed {:.0} %, open {:.0} % (mean engine queue when open {:.2})",
            split(m, c, &|c| c.priority > 0),
            split(m, c, &|c| c.tenant != 0),
            split(m, c, &|c| c.tenant == 0),
            100.0 * f.detector_pods_kv as f64 / checks,
            100.0 * f.detector_pods_queue as f64 / checks,
            100.0 * f.detector_pods_open as f64 / checks,
            f.detector_open_waiting as f64 / (f.detector_pods_open.max(1) as f64),
        );
    }
}
