//! Decisions per second with 1 and 2 threads, as the gateway makes them: each request copies
//! the pods' snapshots (outside any lock), then routes under the session's mutex
//! (`RouterSession::route`: decision, route recorded, features, charge) and finishes its ticket
//! under the mutex again, the way `kvgate-gateway`'s `routing::decide_for` and `TicketGuard`
//! do. The fleet, index and predictor are [`kvgate_core::fixture`]'s (the `decision/full`
//! benchmark's): a 32,000-character prompt cached on a quarter of the pods.
//!
//! `cargo run --release -p kvgate-core --example decision_rate [-- SECONDS [PODS...]]`
//! (default 3 s per run, 64 and 1,024 pods). Prints one line per (pods, threads) with the
//! decisions per second and the ratio to 1 thread. The runs alternate 1, 2, 2, 1 threads and
//! report the mean of each pair, so a drift of the machine's speed cancels out. A control row,
//! "2, own sessions", runs the same two threads each on a fleet and session of its own, sharing
//! nothing (not even the pods' reference-counted names): what this machine's two CPUs give this work with no lock at all, the
//! ceiling any sharing scheme can reach here.

use kvgate_core::fixture::{MODEL, fleet, prompt, session};
use kvgate_core::{BlockHasher, PodSnapshot};
use parking_lot::Mutex;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Decisions per second of `threads` threads over one session (or, with `own`, a session per
/// thread) for `seconds`.
fn rate(pods: &[PodSnapshot], text: &str, threads: usize, seconds: f64, own: bool) -> f64 {
    let shared = Arc::new(Mutex::new(session(pods, text)));
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let mut blocks = Vec::new();
    BlockHasher::default().hash_text(BlockHasher::chain_seed(MODEL, None), text, &mut blocks);
    let blocks = Arc::new(blocks);
    let start = Instant::now();
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            // Own: a fleet built anew (its pod names are allocations of its own, so no reference
            // count is shared) and a session over it.
            let pods = match own {
                true => fleet(pods.len() as u32),
                false => pods.to_vec(),
            };
            let session = match own {
                true => Arc::new(Mutex::new(session(&pods, text))),
                false => shared.clone(),
            };
            let (stop, done, blocks) = (stop.clone(), done.clone(), blocks.clone());
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let mut snaps = pods.clone();
                    let request = kvgate_core::fixture::request(&blocks);
                    let routed = session
                        .lock()
                        .route(&request, &mut snaps, &[])
                        .expect("healthy pods");
                    std::hint::black_box(routed.decision.pod_id);
                    session.lock().finish(routed.ticket, None);
                    n += 1;
                }
                done.fetch_add(n, Ordering::Relaxed);
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64(seconds));
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().expect("worker");
    }
    done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

fn main() {
    let mut args = std::env::args().skip(1);
    let seconds: f64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(3.0);
    let mut sizes: Vec<u32> = args.filter_map(|s| s.parse().ok()).collect();
    if sizes.is_empty() {
        sizes = vec![64, 1024];
    }
    let text = prompt(32_000, 1);
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!("{cpus} CPUs; {seconds} s per run; runs 1, 2, 2 own, 2 own, 2, 1 threads");
    println!("| pods | threads | decisions/s | vs 1 thread |");
    println!("|---:|---:|---:|---:|");
    for pods_n in sizes {
        let pods = fleet(pods_n);
        let a1 = rate(&pods, &text, 1, seconds, false);
        let a2 = rate(&pods, &text, 2, seconds, false);
        let ao = rate(&pods, &text, 2, seconds, true);
        let bo = rate(&pods, &text, 2, seconds, true);
        let b2 = rate(&pods, &text, 2, seconds, false);
        let b1 = rate(&pods, &text, 1, seconds, false);
        let (one, two, own) = ((a1 + b1) / 2.0, (a2 + b2) / 2.0, (ao + bo) / 2.0);
        println!("| {pods_n} | 1 | {one:.0} ({a1:.0}, {b1:.0}) | 1.00× |");
        println!(
            "| {pods_n} | 2 | {two:.0} ({a2:.0}, {b2:.0}) | {:.2}× |",
            two / one
        );
        println!(
            "| {pods_n} | 2, own sessions | {own:.0} ({ao:.0}, {bo:.0}) | {:.2}× |",
            own / one
        );
    }
}
