//! The response body the client reads: the pod's body, passed through frame by frame, watched
//! on the way (first token, usage), and the owner of the request's in-flight share.
//!
//! Every path ends the request exactly once ([`Tracker::finish`]): stream end, upstream error
//! (streams get a clean SSE error event and `[DONE]`), and client abort — axum drops the body
//! when the client goes away, `Drop` finishes the request as `client_abort`, and dropping the
//! pod's body closes that connection, which cancels the request upstream.
//!
//! A pod silent for longer than the idle-chunk timeout (`--idle-chunk-timeout-ms`) ends the
//! request as an upstream error: a stream gets the same SSE error event and `[DONE]`, a whole
//! body an error (the client sees the connection cut). The silence counts only while the pod
//! makes no progress ([`crate::progress`]): a stream queued behind others on a busy pod has its
//! headers and nothing else until its turn, and a stream the engine preempted (its KV blocks
//! taken for others: vLLM recomputes it later) falls silent between two tokens until it is
//! scheduled again. Either waits as long as the request timeout allows
//! (`kvgate_busy_waits_total{kind="idle_chunk"}`). A pod that streams nothing and steps nothing
//! is cut within the timeout plus one progress window, before or after the first token.
//!
//! The request timeout (`--request-timeout-ms`, from admission) ends the response the same way
//! with code `request_timeout`, counted as `kvgate_upstream_timeouts_total{kind="request"}` and
//! status `request_timeout`.
//!
//! The end of the shutdown grace ([`GraceEnd`], `--shutdown-grace-ms`) ends a stream still in
//! flight the same way, with code `shutting_down` and status `shutdown`, so that a client cut by
//! a restart sees why rather than a truncated stream; a whole body is cut.
//!
//! Each ending feeds the pod's [`crate::breaker`]: dying mid-body (an upstream error or the
//! idle-chunk timeout) is a failure, a normal end a success.
//!
//! Bounds: a non-stream body is copied for its `usage` only up to [`MAX_USAGE_SCAN_BYTES`];
//! [`GraceEnd`] holds one waker per stream in flight (at most `max_concurrent_requests`).

use crate::errors::stream_error_event;
pub use crate::grace::{GraceEnd, GraceWatch};
use crate::lifecycle::TicketGuard;
use crate::metrics::{RequestLabels, Status, StreamLabel};
use crate::sse::{SseScanner, Usage, usage_of_response};
use crate::state::Shared;
use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use kvgate_core::Observed;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// The branch of requests passed through to a pod without a decision (`/v1/models`, …): their
/// answers are no engine progress.
pub const PASSTHROUGH: &str = "passthrough";

/// Largest non-stream response body scanned for `usage`.
pub const MAX_USAGE_SCAN_BYTES: usize = 1 << 20;

/// What the request needs to report when it ends.
pub struct Tracker {
    pub shared: Arc<Shared>,
    /// The request's session ticket: returned (and trained on) when the request ends.
    pub guard: TicketGuard,
    pub start: Instant,
    /// Time from `start` to this attempt's dispatch to the pod: the flow-queue wait, the
    /// decision and any earlier attempt that failed before a byte. In the TTFT and e2e metrics
    /// (the client's wait), not in what the predictor learns (the pod's TTFT, from dispatch).
    pub before_dispatch: std::time::Duration,
    pub first_token_at: Option<Instant>,
    pub prompt_tokens: u64,
    pub policy: &'static str,
    pub branch: &'static str,
    pub request_id: String,
    /// Train the predictor from this response (a routed 2xx response). With
    /// `predictor_ttft_at_first_token` a stream's TTFT is learnt at its first token even if
    /// the stream later fails (the TTFT was real); the TPOT only from one that completes.
    pub trainable: bool,
    pub stream: bool,
    /// The pod answered with a non-2xx status (passed through to the client).
    pub error_status: bool,
    /// The request's capture record (`--capture`), written when the request ends.
    pub capture: Option<crate::capture::Ticket>,
    /// A retried request's place in the retry budget, held until the request ends.
    pub retry: Option<crate::retry_budget::RetryToken>,
    /// The `kvgate.stream` span and the request's trace, ended with the body ([`crate::otel`]).
    pub trace: crate::otel::BodyTrace,
}

impl Tracker {
    pub(crate) fn first_token(&mut self) {
        if self.first_token_at.is_none() {
            let now = Instant::now();
            self.first_token_at = Some(now);
            // What `finish_inner` would train on, known now: a trainable stream's TTFT from its
            // dispatch (the predictor may learn it at once; `RouterConfig::
            // predictor_ttft_at_first_token`).
            let ttft_ms = (self.stream && self.trainable && !self.error_status)
                .then(|| self.pod_ttft_ms(now));
            self.guard.first_token(ttft_ms);
        }
    }

    /// Reports the outcome: metrics, the ticket back to the session, and for a completed stream
    /// the observation the predictor trains on.
    pub fn finish(self, status: Status, usage: Option<Usage>) {
        let shared = self.shared.clone();
        self.finish_inner(status, usage);
        // A finished request frees room on its pod: the flow-control driver re-checks now
        // rather than at its next tick (a no-op wake-up when nothing is queued).
        shared.admission.flow.request_finished();
    }

    fn finish_inner(mut self, status: Status, usage: Option<Usage>) {
        let status = match status {
            Status::Ok if self.error_status => Status::UpstreamStatus,
            s => s,
        };
        self.feed_breaker(status);
        let dispatched = self.start + self.before_dispatch;
        let ttft = self.first_token_at.map(|t| t - dispatched);
        self.trace.stream.stream_end(status.as_str(), ttft);
        let m = &self.shared.telemetry.metrics;
        m.requests
            .get_or_create(&RequestLabels {
                pod: self.guard.pod().url.clone(),
                policy: self.policy.to_string(),
                branch: self.branch.to_string(),
                status: status.as_str().to_string(),
            })
            .inc();
        match status {
            Status::ClientAbort if self.shared.telemetry.log_limit.allow("client_went_away") => {
                tracing::info!(request_id = %self.request_id, pod = %self.guard.pod().url, "client went away; upstream request cancelled");
            }
            Status::UpstreamError
                if self
                    .shared
                    .telemetry
                    .log_limit
                    .allow("upstream_failed_mid_response") =>
            {
                tracing::warn!(request_id = %self.request_id, pod = %self.guard.pod().url, "upstream failed mid-response");
            }
            _ => {}
        }
        if status == Status::Ok
            && let Some(ticket) = &mut self.capture
        {
            ticket.served(
                usage.map(|u| u.prompt_tokens),
                usage.map(|u| u.completion_tokens),
            );
            let dispatch = self.start + self.before_dispatch;
            let since_dispatch =
                |t: Instant| t.saturating_duration_since(dispatch).as_secs_f64() * 1e3;
            ticket.timing(crate::capture::Timing {
                pod: Some(self.guard.pod().url.clone()),
                cached_tokens: usage.and_then(|u| u.cached_tokens),
                dispatch_delay_ms: Some(self.before_dispatch.as_secs_f64() * 1e3),
                ttft_ms: self
                    .first_token_at
                    .filter(|_| self.stream)
                    .map(since_dispatch),
                e2e_ms: Some(since_dispatch(Instant::now())),
            });
        }
        if status != Status::Ok || !self.trainable {
            self.guard.finish(None);
            return;
        }
        let e2e_ms = self.start.elapsed().as_secs_f64() * 1e3;
        m.e2e_ms
            .get_or_create(&StreamLabel {
                stream: self.stream.to_string(),
            })
            .observe(e2e_ms);
        // Non-stream responses carry no first-token time (it would be the response end, which
        // includes decoding), so only streams train the predictor.
        let (true, Some(first)) = (self.stream, self.first_token_at) else {
            self.guard.finish(None);
            return;
        };
        let ttft_ms = first.duration_since(self.start).as_secs_f64() * 1e3;
        let tpot_ms = usage
            .filter(|u| u.completion_tokens >= 2)
            .map(|u| (e2e_ms - ttft_ms) / (u.completion_tokens - 1) as f64);
        m.ttft_ms.observe(ttft_ms);
        if let Some(t) = tpot_ms {
            m.tpot_ms.observe(t);
        }
        let ttft_ms = self.pod_ttft_ms(first);
        let series = m.pod_series(self.guard.pod());
        series.ttft_ms.observe(ttft_ms);
        if let Some(t) = tpot_ms {
            series.tpot_ms.observe(t);
        }
        self.guard.finish(Some(Observed { ttft_ms, tpot_ms }));
    }

    /// The pod's TTFT for a first token at `first`: from this attempt's dispatch, ms.
    fn pod_ttft_ms(&self, first: Instant) -> f64 {
        first
            .saturating_duration_since(self.start + self.before_dispatch)
            .as_secs_f64()
            * 1e3
    }
}

impl Tracker {
    /// Counts the ending in the pod's breaker; logs and counts a pod put in cooldown.
    fn feed_breaker(&self, status: Status) {
        let pod = self.guard.pod();
        match status {
            Status::Ok | Status::UpstreamStatus => pod.breaker.success(),
            Status::UpstreamError => {
                crate::breaker::count_failure(&self.shared, pod, "responses keep dying mid-body")
            }
            Status::ClientAbort
            | Status::AttemptFailed
            | Status::RequestTimeout
            | Status::Shutdown => {}
        }
    }
}

enum Mode {
    Stream(SseScanner),
    /// Whole-body response; copied (bounded) to read `usage`.
    Whole(BytesMut),
}

pub struct ObservedBody {
    inner: Incoming,
    tracker: Option<Tracker>,
    mode: Mode,
    done: bool,
    idle_timeout: Duration,
    progress_window: Duration,
    /// Fires when the pod was silent for `idle_timeout`; reset on every frame.
    idle: Pin<Box<tokio::time::Sleep>>,
    /// The request timeout's deadline, and the timeout (for the message).
    deadline: Pin<Box<tokio::time::Sleep>>,
    request_timeout: Duration,
    /// Streams only: the end of the shutdown grace.
    grace: Option<GraceWatch>,
}

/// How long a response may go on: the pod's silence between frames, and the request's end.
#[derive(Debug, Clone, Copy)]
pub struct BodyTimeouts {
    /// Longest silence between two frames of the pod's body (before the first token: while
    /// the pod makes no progress).
    pub idle: Duration,
    /// How far back a pod's progress excuses a silence before the first token
    /// ([`crate::progress::window`]).
    pub progress_window: Duration,
    /// The request's deadline (admission + `request_timeout`).
    pub deadline: tokio::time::Instant,
    pub request_timeout: Duration,
}

impl ObservedBody {
    /// `stream`: the response is SSE; `strip_usage`: drop the usage chunk the gateway asked for.
    pub fn new(
        inner: Incoming,
        tracker: Tracker,
        stream: bool,
        strip_usage: bool,
        timeouts: BodyTimeouts,
    ) -> Self {
        let grace = stream.then(|| tracker.shared.admission.grace_end.watch());
        ObservedBody {
            grace,
            idle_timeout: timeouts.idle,
            progress_window: timeouts.progress_window,
            idle: Box::pin(tokio::time::sleep(timeouts.idle)),
            deadline: Box::pin(tokio::time::sleep_until(timeouts.deadline)),
            request_timeout: timeouts.request_timeout,
            inner,
            tracker: Some(tracker),
            mode: if stream {
                Mode::Stream(SseScanner::new(strip_usage))
            } else {
                Mode::Whole(BytesMut::new())
            },
            done: false,
        }
    }

    fn observe(&mut self, data: Bytes) -> Bytes {
        match &mut self.mode {
            Mode::Stream(scanner) => {
                let fed = scanner.feed(data);
                if let Some(t) = &mut self.tracker {
                    if fed.first_content || fed.more_content_events > 0 {
                        t.guard.pod().progress.on_tokens(Instant::now());
                    }
                    if fed.first_content {
                        t.first_token();
                    }
                    if fed.more_content_events > 0 {
                        t.guard.tokens_generated(fed.more_content_events);
                    }
                }
                fed.out
            }
            Mode::Whole(buf) => {
                if let Some(t) = &mut self.tracker {
                    if t.branch != PASSTHROUGH {
                        t.guard.pod().progress.on_tokens(Instant::now());
                    }
                    t.first_token();
                }
                if buf.len() + data.len() <= MAX_USAGE_SCAN_BYTES {
                    buf.extend_from_slice(&data);
                }
                data
            }
        }
    }

    /// Whether a silence of the idle-chunk timeout is a busy pod's: the pod progressed within
    /// the window (counted). Then the request keeps waiting.
    fn busy_not_hung(&self) -> bool {
        let Some(t) = &self.tracker else {
            return false;
        };
        let busy = t
            .guard
            .pod()
            .progress
            .within(Instant::now(), self.progress_window);
        if busy {
            t.shared
                .telemetry
                .metrics
                .busy_waits
                .get_or_create(&crate::metrics::timeout_label("idle_chunk"))
                .inc();
        }
        busy
    }

    /// The pod was silent too long: end the request as an upstream error.
    fn idle_timed_out(&mut self) -> Option<Result<Frame<Bytes>, axum::BoxError>> {
        self.done = true;
        if let Some(t) = &self.tracker {
            t.shared
                .telemetry
                .metrics
                .upstream_timeouts
                .get_or_create(&crate::metrics::timeout_label("idle_chunk"))
                .inc();
        }
        self.finish(Status::UpstreamError);
        let why = format!(
            "the pod sent nothing for {} ms",
            self.idle_timeout.as_millis()
        );
        match self.mode {
            Mode::Stream(_) => Some(Ok(Frame::data(stream_error_event(&why)))),
            Mode::Whole(_) => Some(Err(why.into())),
        }
    }

    /// The request timeout is over: end the request, whatever the pod is doing.
    fn request_timed_out(&mut self) -> Option<Result<Frame<Bytes>, axum::BoxError>> {
        self.done = true;
        if let Some(t) = &self.tracker {
            t.shared
                .telemetry
                .metrics
                .upstream_timeouts
                .get_or_create(&crate::metrics::timeout_label("request"))
                .inc();
            if t.shared
                .telemetry
                .log_limit
                .allow("request_timeout_mid_response")
            {
                tracing::warn!(request_id = %t.request_id, pod = %t.guard.pod().url, timeout_ms = self.request_timeout.as_millis() as u64, "request timeout; response ended");
            }
        }
        self.finish(Status::RequestTimeout);
        let err = crate::errors::request_timeout(self.request_timeout);
        match self.mode {
            Mode::Stream(_) => Some(Ok(Frame::data(crate::errors::stream_error(&err)))),
            Mode::Whole(_) => Some(Err(err.message.into())),
        }
    }

    /// The shutdown grace is over: end the stream with the `shutting_down` event and `[DONE]`.
    fn grace_over(&mut self) -> Option<Result<Frame<Bytes>, axum::BoxError>> {
        self.done = true;
        let grace = self
            .grace
            .as_ref()
            .map_or(0, |g| g.end.grace_ms.load(Ordering::Relaxed));
        if let Some(t) = &self.tracker
            && t.shared.telemetry.log_limit.allow("stream_cut_at_shutdown")
        {
            tracing::warn!(request_id = %t.request_id, pod = %t.guard.pod().url, grace_ms = grace, "shutdown grace over; stream ended");
        }
        self.finish(Status::Shutdown);
        let err = crate::errors::shutting_down(Duration::from_millis(grace));
        Some(Ok(Frame::data(crate::errors::stream_error(&err))))
    }

    fn finish(&mut self, status: Status) {
        let usage = match &self.mode {
            Mode::Stream(s) => s.usage(),
            Mode::Whole(buf) => usage_of_response(buf),
        };
        if let Some(t) = self.tracker.take() {
            t.finish(status, usage);
        }
    }
}

impl Body for ObservedBody {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::BoxError>>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        if let Some(grace) = &this.grace
            && grace.poll_over(cx)
        {
            return Poll::Ready(this.grace_over());
        }
        // Checked on every poll (not only while the pod is silent), so that a pod streaming
        // without pause is cut at the deadline too.
        if this.deadline.as_mut().poll(cx).is_ready() {
            return Poll::Ready(this.request_timed_out());
        }
        loop {
            let Poll::Ready(next) = Pin::new(&mut this.inner).poll_frame(cx) else {
                while this.idle.as_mut().poll(cx).is_ready() {
                    if !this.busy_not_hung() {
                        return Poll::Ready(this.idle_timed_out());
                    }
                    this.idle
                        .as_mut()
                        .reset(tokio::time::Instant::now() + this.idle_timeout);
                }
                return Poll::Pending;
            };
            this.idle
                .as_mut()
                .reset(tokio::time::Instant::now() + this.idle_timeout);
            match next {
                Some(Ok(frame)) => {
                    let data = match frame.into_data() {
                        Ok(data) => data,
                        Err(frame) => return Poll::Ready(Some(Ok(frame))),
                    };
                    let mut out = this.observe(data);
                    // A body with a known length ends with its last data frame: the server
                    // stops polling there, so end the request now rather than in `Drop`
                    // (which would count it as a client abort).
                    if this.inner.is_end_stream() {
                        this.done = true;
                        if let Mode::Stream(s) = &mut this.mode {
                            let rest = s.finish();
                            if !rest.is_empty() {
                                let mut joined = BytesMut::with_capacity(out.len() + rest.len());
                                joined.extend_from_slice(&out);
                                joined.extend_from_slice(&rest);
                                out = joined.freeze();
                            }
                        }
                        this.finish(Status::Ok);
                        return Poll::Ready((!out.is_empty()).then(|| Ok(Frame::data(out))));
                    }
                    if !out.is_empty() {
                        return Poll::Ready(Some(Ok(Frame::data(out))));
                    }
                }
                Some(Err(e)) => {
                    this.done = true;
                    this.finish(Status::UpstreamError);
                    return Poll::Ready(match this.mode {
                        Mode::Stream(_) => Some(Ok(Frame::data(stream_error_event(&format!(
                            "the pod failed mid-stream: {e}"
                        ))))),
                        Mode::Whole(_) => Some(Err(e.into())),
                    });
                }
                None => {
                    this.done = true;
                    let rest = match &mut this.mode {
                        Mode::Stream(s) => s.finish(),
                        Mode::Whole(_) => Bytes::new(),
                    };
                    this.finish(Status::Ok);
                    return Poll::Ready((!rest.is_empty()).then(|| Ok(Frame::data(rest))));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }

    fn size_hint(&self) -> SizeHint {
        match self.mode {
            Mode::Whole(_) => self.inner.size_hint(),
            Mode::Stream(_) => SizeHint::default(),
        }
    }
}

impl Drop for ObservedBody {
    fn drop(&mut self) {
        if self.tracker.is_some() {
            self.finish(Status::ClientAbort);
        }
    }
}
