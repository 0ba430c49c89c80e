//! How often a pod's `/metrics` is scraped: never more often than `scrape_interval_ms`, and never
//! so often that the scrapes take more than [`MAX_DUTY`] of the pod's time.
//!
//! A scrape is not free for the pod. vLLM renders `/metrics` in its API server process, which on
//! a CPU pod runs on the engine's core(s) beside the engine-core process: one answer costs
//! ~10 ms of that core. At the 50 ms default interval that is ~17 % of the pod, and a
//! real pod's mean TTFT rose ×1.10 under it (×1.00 at 250 ms; BENCHMARKS.md, "What a scrape
//! costs a CPU pod"). A GPU pod or a mock pod answers in about a millisecond and keeps the
//! configured interval.
//!
//! The rule: the pod's cost of one scrape is estimated as the fastest of its last [`WINDOW`]
//! successful scrapes, round trip included (a busy pod answers later because it is busy, not
//! because the answer costs more: the minimum filters the queueing out), and the next scrape
//! starts `cost / MAX_DUTY` after the previous one started, within
//! `[scrape_interval, max(scrape_interval, MAX_PACED_INTERVAL)]`. The upper bound keeps at least
//! four scrapes in the shortest progress look-back ([`crate::progress::MIN_WINDOW`], 2 s), so a
//! busy pod is still told from a hung one. Sans-IO: the caller measures and sleeps.
//!
//! Bound: [`WINDOW`] durations per pod.

use std::time::Duration;

/// The most of a pod's time its scrapes may take (4 %: 10 ms answers → one scrape per 250 ms,
/// measured harmless on a real CPU pod).
pub const MAX_DUTY: f64 = 0.04;
/// Successful scrapes whose fastest round trip estimates the cost of one.
pub const WINDOW: usize = 8;
/// Longest interval pacing may stretch to (unless `scrape_interval_ms` is longer itself).
pub const MAX_PACED_INTERVAL: Duration = Duration::from_millis(500);

/// One pod's scrape pacing.
#[derive(Debug, Default)]
pub struct ScrapePace {
    recent: [Duration; WINDOW],
    seen: usize,
}

impl ScrapePace {
    /// A successful scrape that took `round_trip`.
    pub fn answered(&mut self, round_trip: Duration) {
        self.recent[self.seen % WINDOW] = round_trip;
        self.seen = self.seen.wrapping_add(1);
    }

    /// The estimated cost of one scrape to the pod (none before its first answer).
    pub fn cost(&self) -> Option<Duration> {
        self.recent[..self.seen.min(WINDOW)].iter().min().copied()
    }

    /// The time from one scrape's start to the next's, with `floor` the configured interval.
    pub fn interval(&self, floor: Duration) -> Duration {
        let Some(cost) = self.cost() else {
            return floor;
        };
        let paced = cost.div_f64(MAX_DUTY).min(MAX_PACED_INTERVAL);
        paced.max(floor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FLOOR: Duration = Duration::from_millis(50);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_fast_pod_keeps_the_configured_interval() {
        let mut p = ScrapePace::default();
        assert_eq!(p.interval(FLOOR), FLOOR, "no answer yet");
        p.answered(Duration::from_micros(900));
        assert_eq!(p.interval(FLOOR), FLOOR);
    }

    #[test]
    fn a_costly_scrape_is_spaced_to_the_duty_cap() {
        let mut p = ScrapePace::default();
        p.answered(ms(10));
        assert_eq!(p.interval(FLOOR), ms(250), "10 ms at 4 % of the pod");
        p.answered(ms(60));
        assert_eq!(
            p.cost(),
            Some(ms(10)),
            "a slow answer is queueing, not cost"
        );
        assert_eq!(p.interval(FLOOR), ms(250));
    }

    #[test]
    fn pacing_stops_at_its_bound_and_never_undercuts_the_configured_interval() {
        let mut p = ScrapePace::default();
        p.answered(ms(400));
        assert_eq!(p.interval(FLOOR), MAX_PACED_INTERVAL);
        assert_eq!(p.interval(ms(2000)), ms(2000));
    }

    #[test]
    fn the_estimate_forgets_answers_older_than_its_window() {
        let mut p = ScrapePace::default();
        p.answered(ms(1));
        for _ in 0..WINDOW {
            p.answered(ms(20));
        }
        assert_eq!(p.cost(), Some(ms(20)));
        assert_eq!(p.interval(FLOOR), MAX_PACED_INTERVAL);
        p.answered(ms(4));
        assert_eq!(p.interval(FLOOR), ms(100));
    }
}
