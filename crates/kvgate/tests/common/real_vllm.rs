//! What the real-vLLM end-to-end tests share (`real_vllm.rs`, `real_vllm_pd.rs`,
//! `real_vllm_dp.rs`): where `scripts/real-vllm/fleet.sh` writes its env files, the gate that
//! finds a test's servers (or defers, skips or fails), unique prompts, an HTTP client, metric
//! sums and polling. Included with `#[path = "common/real_vllm.rs"] mod real_vllm_harness;`.
#![allow(dead_code)] // each test file uses its part

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::{Mutex, MutexGuard};

/// `$KVGATE_VLLM_RUN`, else `/tmp/kvgate-vllm`: where the fleet scripts write `*.env`.
pub fn run_dir() -> PathBuf {
    std::env::var_os("KVGATE_VLLM_RUN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp/kvgate-vllm"))
}

/// The `KEY=value` lines of `$run/<file>` (`fleet.env`, `pd.env`, `dp.env`), if it exists.
pub fn env_file(file: &str) -> Option<HashMap<String, String>> {
    let text = std::fs::read_to_string(run_dir().join(file)).ok()?;
    Some(
        text.lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
}

/// One kind of real-vLLM server set and how `scripts/test` provides it.
pub struct Servers {
    /// What it is, for messages: "real-vLLM P/D pair".
    pub what: &'static str,
    /// Its env file under [`run_dir`]: "pd.env".
    pub env: &'static str,
    /// Set to `later` while `scripts/test` runs the other tests: these wait for their phase.
    pub later_var: Option<&'static str>,
    /// Set to `1`: missing servers fail the test instead of skipping it.
    pub require_var: &'static str,
    /// The command that starts them: "scripts/real-vllm/fleet.sh pd-up".
    pub start: &'static str,
    /// Where `scripts/test` starts them: "its P/D phase".
    pub when: &'static str,
}

/// The servers `load` finds (loaded once per process) and the lock that serialises the tests
/// using them; `None` when the test is deferred to its phase or skipped (loudly) without them;
/// a panic when they are required.
pub async fn servers<T>(
    kind: &Servers,
    test: &str,
    cell: &'static OnceLock<Option<T>>,
    lock: &'static Mutex<()>,
    load: fn() -> Option<T>,
) -> Option<(&'static T, MutexGuard<'static, ()>)> {
    if kind
        .later_var
        .is_some_and(|v| std::env::var(v).as_deref() == Ok("later"))
    {
        eprintln!("{test}: deferred to scripts/test's {}", kind.when);
        return None;
    }
    let Some(found) = cell.get_or_init(load).as_ref() else {
        let dir = run_dir();
        if std::env::var(kind.require_var).as_deref() == Ok("1") {
            panic!(
                "{test}: no {} at {}/{}, and {}=1 ({} starts it)",
                kind.what,
                dir.display(),
                kind.env,
                kind.require_var,
                kind.start
            );
        }
        eprintln!(
            "\n\n!!!!!!!! SKIPPED {test}: no {} at {}/{} (run {}; scripts/test runs it in {}) !!!!!!!!\n\n",
            kind.what,
            dir.display(),
            kind.env,
            kind.start,
            kind.when
        );
        return None;
    };
    Some((found, lock.lock().await))
}

/// Unique per process and call (`prefix`, the time, a counter): no earlier run's or test's
/// prompt shares a block with one that starts with it.
pub fn tag(prefix: &str) -> String {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{prefix}{nanos}x{n}")
}

/// A completions prompt of about `lines × 29` tokens of the tiny model, starting with `tag`.
pub fn prompt(tag: &str, lines: usize) -> String {
    let mut s = format!("# {tag}\n");
    for i in 0..lines {
        s.push_str(&format!("def f{i}_{tag}(x): return x + {i}\n"));
    }
    s
}

/// A client with a 120 s timeout (a CPU pod can be slow, never hung).
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap()
}

/// The sum of every sample whose line starts with `prefix` in the `/metrics` at `base`.
pub async fn metric_sum(base: &str, prefix: &str) -> f64 {
    let text = client()
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Polls `cond` every 100 ms for at most `within` (then panics naming `what`); returns how
/// long it took.
pub async fn wait_for<F, Fut>(what: &str, within: Duration, mut cond: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if cond().await {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < within,
            "timed out after {within:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
