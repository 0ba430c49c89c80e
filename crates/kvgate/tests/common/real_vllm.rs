//! What the real-vLLM end-to-end tests share (`real_vllm.rs`, `real_vllm_pd.rs`,
//! `real_vllm_dp.rs`): where `scripts/real-vllm/fleet.sh` writes its env files, the gate that
//! finds a test's servers (or defers, skips or fails), unique prompts, an HTTP client, metric
//! sums and polling, and the pods' measured speed ([`fleet_slowness`]) that time limits and
//! loads scale by. Included with `#[path = "common/real_vllm.rs"] mod real_vllm_harness;`.
//!
//! **Speed.** The tests' time limits and loads were tuned on one machine (see
//! `scripts/real-vllm/speed.py`, its reference figures); a CPU pod elsewhere can be 5-10x slower
//! (an AVX2-only CPU runs the model in float32). `fleet.sh` measures the pods at start and writes
//! their speed into each env file; [`scaled`] stretches a time limit by the slowness, and
//! [`scaled_load`] shrinks a load (a rate, a token count) so that it keeps the duration or
//! utilisation it had on the reference machine. A test whose check needs that utilisation
//! asserts that it was reached (e.g. with [`pod_load`]).
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
    Some(parse_env(&text))
}

/// `KEY=value` lines; a value in single or double quotes (the files are sourced by
/// `scripts/test`: `KVGATE_VLLM_CPU='Intel(R) Xeon(R) …'`) loses them.
pub fn parse_env(text: &str) -> HashMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| {
            let v = v.trim();
            let unquoted = ['\'', '"']
                .iter()
                .find_map(|q| v.strip_prefix(*q)?.strip_suffix(*q))
                .unwrap_or(v);
            (k.to_string(), unquoted.to_string())
        })
        .collect()
}

/// The pods' speed as `scripts/real-vllm/speed.py` measured it when they started, and the
/// reference machine's (where the tests' limits and loads were tuned).
#[derive(Debug, Clone)]
pub struct Speed {
    /// The env file it came from.
    pub file: &'static str,
    pub cpu: String,
    pub dtype: String,
    /// Wall time of a fresh ~1,000-token prompt (max_tokens 1), per 1,000 tokens.
    pub prefill_ms_per_1k: f64,
    pub decode_ms_per_token: f64,
    pub ref_prefill_ms_per_1k: f64,
    pub ref_decode_ms_per_token: f64,
}

impl Speed {
    /// From an env file's keys; `None` without the four figures (a fleet from before they were
    /// measured, or one whose pods could not be measured).
    pub fn from_env(file: &'static str, vars: &HashMap<String, String>) -> Option<Speed> {
        let num = |k: &str| {
            vars.get(k)?
                .parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v > 0.0)
        };
        Some(Speed {
            file,
            cpu: vars.get("KVGATE_VLLM_CPU").cloned().unwrap_or_default(),
            dtype: vars
                .get("KVGATE_VLLM_POD_DTYPE")
                .cloned()
                .unwrap_or_default(),
            prefill_ms_per_1k: num("KVGATE_VLLM_PREFILL_MS_PER_1K")?,
            decode_ms_per_token: num("KVGATE_VLLM_DECODE_MS_PER_TOKEN")?,
            ref_prefill_ms_per_1k: num("KVGATE_VLLM_REF_PREFILL_MS_PER_1K")?,
            ref_decode_ms_per_token: num("KVGATE_VLLM_REF_DECODE_MS_PER_TOKEN")?,
        })
    }

    /// Measured prefill over the reference's, at least 1.
    pub fn prefill_slowness(&self) -> f64 {
        (self.prefill_ms_per_1k / self.ref_prefill_ms_per_1k).max(1.0)
    }

    /// Measured decode over the reference's, at least 1.
    pub fn decode_slowness(&self) -> f64 {
        (self.decode_ms_per_token / self.ref_decode_ms_per_token).max(1.0)
    }

    /// The larger of the two: what a time limit must allow for.
    pub fn slowness(&self) -> f64 {
        self.prefill_slowness().max(self.decode_slowness())
    }
}

/// The env file of the servers this test binary uses, set by [`servers`].
static SERVERS_ENV: OnceLock<&'static str> = OnceLock::new();

/// The speed measured on this test binary's own servers (their env file, once [`servers`] has
/// found them: a P/D pair, whose NIXL workers busy-poll, is slower than the fleet beside it),
/// else the first of `fleet.env`, `pd.env`, `dp.env` that has one; read once per process.
pub fn speed() -> Option<&'static Speed> {
    static SPEED: OnceLock<Option<Speed>> = OnceLock::new();
    SPEED
        .get_or_init(|| {
            SERVERS_ENV
                .get()
                .copied()
                .into_iter()
                .chain(["fleet.env", "pd.env", "dp.env"])
                .find_map(|f| Speed::from_env(f, &env_file(f)?))
        })
        .as_ref()
}

/// `$KVGATE_VLLM_SLOWNESS` (a number ≥ 1), which overrides the measured slowness: to run the
/// scaled paths on a fast machine, or to force a factor where the measure is off.
fn slowness_override() -> Option<f64> {
    let v = std::env::var("KVGATE_VLLM_SLOWNESS").ok()?;
    match v.trim().parse::<f64>() {
        Ok(f) if f.is_finite() && f > 0.0 => Some(f.max(1.0)),
        _ => panic!("KVGATE_VLLM_SLOWNESS={v:?}: not a positive number"),
    }
}

/// How much slower than the reference machine this machine's pods are (≥ 1: a faster machine
/// keeps the tuned limits and loads); 1.0 when nothing was measured. Overall (the larger of
/// prefill and decode): for time limits and prefill-bound loads.
pub fn fleet_slowness() -> f64 {
    slowness_override()
        .or_else(|| speed().map(Speed::slowness))
        .unwrap_or(1.0)
}

/// Decode's slowness alone (≥ 1): for loads measured in generated tokens.
pub fn decode_slowness() -> f64 {
    slowness_override()
        .or_else(|| speed().map(Speed::decode_slowness))
        .unwrap_or(1.0)
}

/// Prefill's slowness alone (≥ 1): for loads measured in prompt tokens (a queue of long prompts).
pub fn prefill_slowness() -> f64 {
    slowness_override()
        .or_else(|| speed().map(Speed::prefill_slowness))
        .unwrap_or(1.0)
}

/// The measured prefill, ms per 1,000 prompt tokens (the reference's times the override, when
/// `$KVGATE_VLLM_SLOWNESS` is set; the reference's when nothing was measured).
pub fn prefill_ms_per_1k() -> f64 {
    match (slowness_override(), speed()) {
        (Some(f), Some(s)) => s.ref_prefill_ms_per_1k * f,
        (None, Some(s)) => s.prefill_ms_per_1k,
        (Some(f), None) => 120.0 * f,
        (None, None) => 120.0,
    }
}

/// A time limit tuned on the reference machine, stretched by [`fleet_slowness`].
pub fn scaled(limit: Duration) -> Duration {
    limit.mul_f64(fleet_slowness())
}

/// A limit on a pod's start-up (`pod.sh`'s `KVGATE_VLLM_START_S`), in seconds, stretched by
/// [`fleet_slowness`] but at most 3×: start-up is mostly imports and torch.compile, which a
/// slower model arithmetic (float32 on AVX2, a P/D pair's busy NIXL workers) barely touches,
/// and a limit that long would only delay the fallback for a start that is stuck.
pub fn scaled_start_s(limit_s: u64) -> u64 {
    (limit_s as f64 * fleet_slowness().min(3.0)).ceil() as u64
}

/// A load tuned on the reference machine (a rate, a count of tokens or requests that should
/// take a given time), divided by `slowness` and rounded up, never below `floor`: on a slower
/// machine it reaches the same utilisation, or lasts as long, as it did there.
pub fn scaled_load(load: f64, slowness: f64, floor: f64) -> f64 {
    (load / slowness.max(1.0)).ceil().max(floor)
}

/// One line for a test's log: the machine, the measured speed and the factor in use.
pub fn speed_line() -> String {
    let over = std::env::var("KVGATE_VLLM_SLOWNESS")
        .map(|v| format!(", overridden by KVGATE_VLLM_SLOWNESS={v}"))
        .unwrap_or_default();
    match speed() {
        Some(s) => format!(
            "real-vLLM pods ({}): {}, {}: prefill {:.0} ms per 1k tokens, decode {:.1} ms per \
             token; slowness x{:.2} (prefill x{:.2}, decode x{:.2} of the reference {:.0} / \
             {:.1}){over}; time limits x{:.2}",
            s.file,
            s.cpu,
            s.dtype,
            s.prefill_ms_per_1k,
            s.decode_ms_per_token,
            s.slowness(),
            s.prefill_slowness(),
            s.decode_slowness(),
            s.ref_prefill_ms_per_1k,
            s.ref_decode_ms_per_token,
            fleet_slowness()
        ),
        None => format!(
            "real-vLLM pods: no measured speed in {} (a fleet started before fleet.sh measured \
             it?){over}; time limits x{:.2}",
            run_dir().display(),
            fleet_slowness()
        ),
    }
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
    SERVERS_ENV.get_or_init(|| kind.env);
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| eprintln!("{}", speed_line()));
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

/// A client with a 120 s timeout, [`scaled`] (a CPU pod can be slow, never hung).
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(scaled(Duration::from_secs(120)))
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

/// A pod's (or DP server's, summed over its engines) requests (running, waiting) now, from its
/// `/metrics`: what a load meant to keep the pod busy can be checked against.
pub async fn pod_load(base: &str) -> (f64, f64) {
    (
        metric_sum(base, "vllm:num_requests_running{").await,
        metric_sum(base, "vllm:num_requests_waiting{").await,
    )
}

/// Polls `cond` every 100 ms for at most `within` (then panics naming `what`); returns how
/// long it took. `within` is taken as given: pass a limit through [`scaled`].
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

#[test]
fn speed_from_an_env_file_and_the_slowness_it_gives() {
    let text = "KVGATE_VLLM_P0=http://127.0.0.1:18000,block=128\n\
                KVGATE_VLLM_CPU='AMD EPYC 7B13 64-Core Processor'\n\
                KVGATE_VLLM_POD_DTYPE=float32\n\
                KVGATE_VLLM_PREFILL_MS_PER_1K=1470.0\n\
                KVGATE_VLLM_DECODE_MS_PER_TOKEN=25.00\n\
                KVGATE_VLLM_REF_PREFILL_MS_PER_1K=120.0\n\
                KVGATE_VLLM_REF_DECODE_MS_PER_TOKEN=6.2\n";
    let vars = parse_env(text);
    assert_eq!(vars["KVGATE_VLLM_P0"], "http://127.0.0.1:18000,block=128");
    let s = Speed::from_env("fleet.env", &vars).unwrap();
    assert_eq!(s.cpu, "AMD EPYC 7B13 64-Core Processor");
    assert_eq!(s.dtype, "float32");
    assert!((s.prefill_slowness() - 12.25).abs() < 1e-9);
    assert!((s.decode_slowness() - 25.0 / 6.2).abs() < 1e-9);
    assert_eq!(s.slowness(), s.prefill_slowness());
    // A faster machine keeps the tuned limits.
    let mut fast = vars.clone();
    fast.insert("KVGATE_VLLM_PREFILL_MS_PER_1K".into(), "60".into());
    fast.insert("KVGATE_VLLM_DECODE_MS_PER_TOKEN".into(), "3".into());
    assert_eq!(Speed::from_env("fleet.env", &fast).unwrap().slowness(), 1.0);
    // Without the figures (an older fleet): no speed.
    let mut old = vars;
    old.remove("KVGATE_VLLM_DECODE_MS_PER_TOKEN");
    assert!(Speed::from_env("fleet.env", &old).is_none());
    assert_eq!(scaled_load(200.0, 4.0, 64.0), 64.0);
    assert_eq!(scaled_load(200.0, 3.0, 64.0), 67.0);
    assert_eq!(scaled_load(200.0, 0.5, 64.0), 200.0);
}
