//! A rate limit on the log lines one request can cause — rejections (429, 503, 401, 400…),
//! failed attempts, clients going away, timeouts — so that a flood of requests cannot flood
//! the log: a 10 s flood of 2,000 connections once wrote 117 MB of 429 lines.
//!
//! Each *kind* of line (a `&'static str`: the rejection's `code`, or a name at the call site)
//! has its own window of [`WINDOW`]; at most [`LINES_PER_WINDOW`] lines of a kind are logged
//! per window, the rest are counted. The count is reported as one warn line,
//! `kind=… suppressed=K "similar log lines suppressed"`, by the next line of that kind after its
//! window, or by a task of [`crate::serve`](mod@crate::serve) (every [`WINDOW`]) when no line of that kind comes
//! any more.
//! Counters (`kvgate_rejected_requests` and the others) are never limited: they count every
//! request.
//!
//! Defaults: 10 lines per kind per second — enough to see what is rejected and why (each line
//! has a request id), little enough that a flood writes a few KB/s. Bound: one small entry per
//! kind, and kinds are string literals in the code.
//!
//! The clock is a parameter of [`LogLimiter::check`] and [`LogLimiter::flush`], so the tests
//! drive it without sleeping.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Length of a rate-limit window.
pub const WINDOW: Duration = Duration::from_secs(1);
/// Lines of one kind logged per window.
pub const LINES_PER_WINDOW: u32 = 10;

/// One kind's current window.
#[derive(Debug, Clone, Copy)]
struct Window {
    start: Instant,
    logged: u32,
    suppressed: u64,
}

/// What to do with one line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// Log it.
    pub log: bool,
    /// Lines of this kind suppressed in the window that just ended, to report now.
    pub suppressed_before: u64,
}

#[derive(Debug)]
pub struct LogLimiter {
    lines_per_window: u32,
    window: Duration,
    kinds: Mutex<HashMap<&'static str, Window>>,
}

impl Default for LogLimiter {
    fn default() -> Self {
        LogLimiter::new(LINES_PER_WINDOW, WINDOW)
    }
}

impl LogLimiter {
    pub fn new(lines_per_window: u32, window: Duration) -> Self {
        LogLimiter {
            lines_per_window,
            window,
            kinds: Mutex::new(HashMap::new()),
        }
    }

    /// Whether a line of `kind` at `now` is logged, and what to report first.
    pub fn check(&self, kind: &'static str, now: Instant) -> Verdict {
        let mut kinds = self.kinds.lock();
        let w = kinds.entry(kind).or_insert(Window {
            start: now,
            logged: 0,
            suppressed: 0,
        });
        let mut suppressed_before = 0;
        if now.saturating_duration_since(w.start) >= self.window {
            suppressed_before = w.suppressed;
            *w = Window {
                start: now,
                logged: 0,
                suppressed: 0,
            };
        }
        let log = w.logged < self.lines_per_window;
        if log {
            w.logged += 1;
        } else {
            w.suppressed += 1;
        }
        Verdict {
            log,
            suppressed_before,
        }
    }

    /// The kinds whose window has ended with lines suppressed, and how many; those windows
    /// are closed (the next line of the kind opens a new one).
    pub fn flush(&self, now: Instant) -> Vec<(&'static str, u64)> {
        let mut reports = Vec::new();
        self.kinds.lock().retain(|kind, w| {
            if now.saturating_duration_since(w.start) < self.window {
                return true;
            }
            if w.suppressed > 0 {
                reports.push((*kind, w.suppressed));
            }
            false
        });
        reports.sort_unstable();
        reports
    }

    /// [`LogLimiter::check`] now; reports the previous window's suppressed lines itself.
    /// The caller logs its line when this is true.
    pub fn allow(&self, kind: &'static str) -> bool {
        let v = self.check(kind, Instant::now());
        if v.suppressed_before > 0 {
            report(kind, v.suppressed_before);
        }
        v.log
    }
}

pub(crate) fn report(kind: &'static str, suppressed: u64) {
    tracing::warn!(
        kind,
        suppressed,
        window_ms = WINDOW.as_millis() as u64,
        "similar log lines suppressed"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(t0: Instant, ms: u64) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    #[test]
    fn at_most_n_lines_per_kind_per_window_and_the_rest_are_counted() {
        let limit = LogLimiter::new(3, Duration::from_secs(1));
        let t0 = Instant::now();
        let logged = (0..1000)
            .filter(|i| limit.check("too_many_requests", ms(t0, i / 2)).log)
            .count();
        assert_eq!(logged, 3);
        // Another kind has its own budget.
        assert!(limit.check("no_healthy_pod", ms(t0, 600)).log);
        // The next window: logged again, and told how many were suppressed.
        let v = limit.check("too_many_requests", ms(t0, 1000));
        assert_eq!(
            v,
            Verdict {
                log: true,
                suppressed_before: 997
            }
        );
        let v = limit.check("too_many_requests", ms(t0, 1001));
        assert_eq!(v.suppressed_before, 0, "reported once");
    }

    #[test]
    fn flush_reports_kinds_that_went_quiet_once_their_window_ends() {
        let limit = LogLimiter::new(1, Duration::from_secs(1));
        let t0 = Instant::now();
        for i in 0..5 {
            limit.check("too_many_requests", ms(t0, i));
        }
        limit.check("client_went_away", ms(t0, 10));
        assert_eq!(limit.flush(ms(t0, 999)), [], "the window is still open");
        assert_eq!(limit.flush(ms(t0, 1000)), [("too_many_requests", 4)]);
        assert_eq!(limit.flush(ms(t0, 5000)), [], "reported once, nothing new");
        // A window closed by flush starts afresh.
        assert!(limit.check("too_many_requests", ms(t0, 5001)).log);
        assert_eq!(
            limit.check("too_many_requests", ms(t0, 5002)),
            Verdict {
                log: false,
                suppressed_before: 0
            }
        );
    }

    #[test]
    fn a_clock_going_backwards_keeps_the_window() {
        let limit = LogLimiter::new(1, Duration::from_secs(1));
        let t0 = Instant::now() + Duration::from_secs(10);
        assert!(limit.check("k", t0).log);
        assert!(!limit.check("k", t0 - Duration::from_secs(5)).log);
        assert_eq!(limit.flush(t0 - Duration::from_secs(5)), []);
    }
}
