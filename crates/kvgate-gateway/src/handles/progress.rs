//! Whether a pod is making progress: what tells a busy pod from a hung one.
//!
//! A pod with a deep queue is silent to the requests waiting in it — a stream has its headers
//! and no token yet, a whole-body request not even headers — while its engine steps through
//! the requests ahead of them. A hung pod is silent too, but steps nothing. The silence timers
//! (the first-byte timeout before the response headers, the idle-chunk timeout before a
//! stream's first token, and the scrape timeouts) ask [`Progress::since`] before they count a
//! silence as the pod's failure: a pod that progressed within the window is busy, and the
//! request keeps waiting, as long as its request timeout allows.
//!
//! Progress is seen two ways:
//! - a scrape whose engine counters moved since the pod's previous scrape: the sum of
//!   `vllm:prompt_tokens_total`, `vllm:generation_tokens_total` and the count of
//!   `vllm:iteration_tokens_total` (SGLang's `sglang:prompt_tokens_total` /
//!   `sglang:generation_tokens_total` too) — see [`crate::scrape`];
//! - a token the pod streamed to any request through this gateway.
//!
//! A pod that exports none of those counters shows progress only by its tokens; one whose
//! `/metrics` stops answering shows it only by its tokens too; a broken connection is a
//! failure whatever the counters say. A `/metrics` slower than the scrape timeout (a busy CPU
//! pod's API server) still shows progress: the timed-out scrape's answer is awaited apart, up
//! to [`crate::scrape::LATE_SCRAPE_WAIT`], and its counters are read for progress only (the
//! routing metrics stay the last timely ones). This matters with replicas: each sees only the
//! tokens streamed through itself, so a pod streaming to the other replica's requests shows a
//! replica none (the chaos soak's `--cluster` run cut 26 queued streams so before).
//!
//! The window ([`window`]): the silence being judged (the first-byte or idle-chunk timeout),
//! but at least [`MIN_WINDOW`] and 4 scrape intervals, so that a scrape slower than the
//! timeout under load still gets its chance. A pod that stops progressing is therefore caught
//! within the timeout plus one window.
//!
//! Bound: three atomics per pod, and at most one late scrape answer awaited per pod. The clock is a monotonic [`Instant`] read by the caller.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Shortest look-back for progress, whatever the timeout being judged.
pub const MIN_WINDOW: Duration = Duration::from_secs(2);

/// The look-back for a silence of `timeout`, with pods scraped every `scrape_interval`.
pub fn window(timeout: Duration, scrape_interval: Duration) -> Duration {
    timeout
        .max(MIN_WINDOW)
        .max(scrape_interval.saturating_mul(4))
}

/// Origin of the gateway's monotonic nanosecond clocks (this progress clock, each pod's
/// breaker): the first use in this process.
pub(crate) fn base() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

/// Nanoseconds since [`base`], + 1 so that 0 means "never".
fn nanos(at: Instant) -> u64 {
    u64::try_from(at.saturating_duration_since(base()).as_nanos())
        .unwrap_or(u64::MAX - 1)
        .saturating_add(1)
}

/// One pod's progress.
#[derive(Debug, Default)]
pub struct Progress {
    /// The latest progress seen ([`nanos`]); 0: none yet.
    last: AtomicU64,
    /// The engine counters' sum at the previous scrape (`f64` bits); `u64::MAX`: none yet.
    counters: AtomicU64,
    /// A timed-out scrape's answer is still awaited (at most one per pod).
    late_scrape: AtomicBool,
}

const NO_COUNTERS: u64 = u64::MAX;

impl Progress {
    pub fn new() -> Self {
        Progress {
            last: AtomicU64::new(0),
            counters: AtomicU64::new(NO_COUNTERS),
            late_scrape: AtomicBool::new(false),
        }
    }

    /// Takes the pod's one place for a late scrape answer; `false` when one is awaited already.
    pub fn begin_late_scrape(&self) -> bool {
        !self.late_scrape.swap(true, Ordering::AcqRel)
    }

    /// Gives the place back.
    pub fn end_late_scrape(&self) {
        self.late_scrape.store(false, Ordering::Release);
    }

    /// A scrape at `now` read the engine counters' sum `total`: progress when it differs from
    /// the previous scrape's (an engine restart, counters back to 0, is a live engine too).
    /// The first reading is only the baseline.
    pub fn on_counters(&self, total: f64, now: Instant) {
        if !total.is_finite() {
            return;
        }
        let bits = total.to_bits();
        let before = self.counters.swap(bits, Ordering::Relaxed);
        if before != NO_COUNTERS && before != bits {
            self.seen(now);
        }
    }

    /// The pod streamed a token at `now`.
    pub fn on_tokens(&self, now: Instant) {
        self.seen(now);
    }

    fn seen(&self, now: Instant) {
        self.last.fetch_max(nanos(now), Ordering::Relaxed);
    }

    /// Whether the pod progressed at or after `t`.
    pub fn since(&self, t: Instant) -> bool {
        let last = self.last.load(Ordering::Relaxed);
        last != 0 && last >= nanos(t)
    }

    /// Whether the pod progressed within `window` before `now`.
    pub fn within(&self, now: Instant, window: Duration) -> bool {
        self.since(now.checked_sub(window).unwrap_or_else(base))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn the_first_scrape_is_a_baseline_and_a_moved_counter_is_progress() {
        let p = Progress::new();
        let t0 = Instant::now();
        p.on_counters(10.0, t0);
        assert!(!p.within(t0, S), "a baseline is not progress");
        p.on_counters(10.0, t0 + S);
        assert!(!p.within(t0 + S, S), "counters standing still");
        p.on_counters(12.0, t0 + 2 * S);
        assert!(p.within(t0 + 2 * S, S));
        assert!(p.within(t0 + 3 * S, S));
        assert!(!p.within(t0 + 3 * S + Duration::from_millis(1), S));
    }

    #[test]
    fn an_engine_restart_counters_back_to_zero_is_progress() {
        let p = Progress::new();
        let t0 = Instant::now();
        p.on_counters(500.0, t0);
        p.on_counters(0.0, t0 + S);
        assert!(p.within(t0 + S, S));
    }

    #[test]
    fn a_streamed_token_is_progress_and_time_only_moves_forward() {
        let p = Progress::new();
        let t0 = Instant::now();
        assert!(!p.within(t0, S), "never progressed");
        p.on_tokens(t0 + 5 * S);
        p.on_tokens(t0 + S);
        assert!(p.since(t0 + 5 * S), "an older report does not move it back");
        assert!(!p.since(t0 + 6 * S));
        p.on_counters(f64::NAN, t0 + 9 * S);
        assert!(!p.within(t0 + 9 * S, S), "a non-number is no reading");
    }

    #[test]
    fn the_window_is_the_timeout_but_never_shorter_than_the_floor_or_four_scrapes() {
        let ms = Duration::from_millis;
        assert_eq!(window(ms(60_000), ms(50)), ms(60_000));
        assert_eq!(window(ms(300), ms(50)), MIN_WINDOW);
        assert_eq!(window(ms(3_000), ms(1_000)), ms(4_000));
    }
}
