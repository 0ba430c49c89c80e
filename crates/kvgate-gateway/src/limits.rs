//! Admission on the traffic listener: at most `max_concurrent_requests` requests are served at
//! once and at most `max_queued_requests` wait for a slot (first come, first served); beyond
//! both the gateway answers 429 with `Retry-After`, counted as `reason="too_many_requests"`.
//!
//! A request holds its slot until its response body ends or is dropped, so a long stream counts
//! for its whole length, not just until its headers. A client that goes away while queued gives
//! its place back. Bound: the queue is at most `max_queued_requests` waiting tasks.
//!
//! The ext_proc endpoint picker (`--ext-proc-listen`) admits through the same [`Admission`]:
//! the limits hold for the gateway as a whole, whichever listener a request came in on.

use crate::errors::ApiError;
use crate::errors::log_reject;
use crate::request_id::request_id;
use crate::state::Shared;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use bytes::Bytes;
use http::{HeaderValue, StatusCode, header};
use http_body::{Frame, SizeHint};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// What a rejected client is told to wait before retrying, seconds.
pub const RETRY_AFTER_S: u64 = 1;

/// The slots and the queue of the traffic listener.
pub struct Admission {
    slots: Arc<Semaphore>,
    max_concurrent: usize,
    max_queued: usize,
    queued: AtomicUsize,
}

/// A place in the queue; given back when dropped (admitted, or the client went away).
struct QueuePlace<'a>(&'a AtomicUsize);

impl Drop for QueuePlace<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Admission {
    pub fn new(max_concurrent: usize, max_queued: usize) -> Self {
        let max_concurrent = max_concurrent.clamp(1, Semaphore::MAX_PERMITS);
        Admission {
            slots: Arc::new(Semaphore::new(max_concurrent)),
            max_concurrent,
            max_queued,
            queued: AtomicUsize::new(0),
        }
    }

    /// Requests holding a slot now.
    pub fn active(&self) -> usize {
        self.max_concurrent
            .saturating_sub(self.slots.available_permits())
    }

    /// Requests waiting for a slot now.
    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::Acquire)
    }

    /// A slot now, or after waiting in the queue; None when the queue is full.
    pub async fn admit(&self) -> Option<OwnedSemaphorePermit> {
        if let Ok(slot) = self.slots.clone().try_acquire_owned() {
            return Some(slot);
        }
        self.queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
                (q < self.max_queued).then_some(q + 1)
            })
            .ok()?;
        let _place = QueuePlace(&self.queued);
        self.slots.clone().acquire_owned().await.ok()
    }
}

/// The 429 a request gets when the slots and the queue are full (HTTP and ext_proc alike).
pub fn too_many_requests(admission: &Admission) -> ApiError {
    ApiError {
        status: StatusCode::TOO_MANY_REQUESTS,
        kind: "rate_limit_error",
        code: "too_many_requests",
        message: format!(
            "the gateway is serving {} requests and queueing {}, its limits; retry later",
            admission.max_concurrent, admission.max_queued
        ),
        param: None,
    }
}

/// The middleware of the traffic listener: admit or answer 429.
pub async fn admit(State(shared): State<Arc<Shared>>, req: Request, next: Next) -> Response {
    let Some(slot) = shared.admission.admit().await else {
        let rid = request_id(req.headers());
        let err = too_many_requests(&shared.admission);
        log_reject(&shared, &err, &rid);
        let mut resp = err.into_response(&rid);
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_S));
        return resp;
    };
    next.run(req)
        .await
        .map(|inner| Body::new(WithSlot { inner, _slot: slot }))
}

/// A response body that holds its request's slot until it ends or is dropped.
struct WithSlot {
    inner: Body,
    _slot: OwnedSemaphorePermit,
}

impl http_body::Body for WithSlot {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_full_queue_refuses_and_places_come_back() {
        let a = Admission::new(1, 1);
        let first = a.admit().await.unwrap();
        assert_eq!((a.active(), a.queued()), (1, 0));
        // One waiter may queue; a second is refused.
        let queued = a.admit();
        tokio::pin!(queued);
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(20), &mut queued)
                .await
                .is_err()
        );
        assert_eq!(a.queued(), 1);
        assert!(a.admit().await.is_none());
        drop(first);
        let second = queued.await.unwrap();
        assert_eq!((a.active(), a.queued()), (1, 0));
        drop(second);
        assert_eq!((a.active(), a.queued()), (0, 0));
    }
}
