//! Admission on the traffic listener: at most `max_concurrent_requests` requests are served at
//! once and at most `max_waiting_requests` wait for a slot (first come, first served); beyond
//! both the gateway answers 429 with `Retry-After`, counted as `reason="too_many_requests"`.
//!
//! A request holds its slot until its response body ends or is dropped, so a long stream counts
//! for its whole length, not just until its headers — except while it waits in flow control's
//! queue for its priority turn: then it lends the slot back ([`Slot::lend`]) and takes one again
//! when released ([`Slot::reclaim`]), so that requests waiting for their turn never fill the
//! slots and leave a high-priority arrival in the FIFO queue behind them (the flow queue, which
//! has its own bounds, orders them). A client that goes away while queued gives
//! its place back. Bound: the queue is at most `max_waiting_requests` waiting tasks.
//!
//! **The body comes first.** A request's whole body is read before it queues for a slot, within
//! `body_read_timeout_ms` of its arrival (default 30 s; else 408 `body_timeout`) and
//! `max_body_bytes` (413 `body_too_large`), so a client that trickles its body holds no slot
//! (an adversarial run held all 1,024 slots with 2,100 connections sending 10 bytes of a claimed
//! 10 MB body). The bytes of every body read, queued or being served count against one budget,
//! `max_body_bytes_in_flight` (default 1 GiB): a body that would cross it gets 503
//! `body_budget_exhausted` with `Retry-After` (counted with its reason like every rejection), so
//! memory for bodies is bounded whatever the concurrency. The request's arrival time travels in
//! the request's extensions ([`Arrived`]): the request timeout counts from it, time spent
//! reading the body and queued included.
//!
//! The ext_proc endpoint picker (`--ext-proc-listen`) admits through the same [`Admission`]:
//! the limits hold for the gateway as a whole, whichever listener a request came in on (its
//! bodies come from Envoy, which buffers them; the body budget is the HTTP listener's).

use crate::errors::ApiError;
use axum::body::Body;
use bytes::Bytes;
use http::StatusCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
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
    pub async fn admit(&self) -> Option<Slot> {
        self.admit_permit().await.map(Slot::held)
    }

    async fn admit_permit(&self) -> Option<OwnedSemaphorePermit> {
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

/// A request's admission slot, shared by the request (in its extensions) and its response
/// body (which holds it until the body ends). Empty while lent back.
#[derive(Clone, Default)]
pub struct Slot(Arc<parking_lot::Mutex<Option<OwnedSemaphorePermit>>>);

impl Slot {
    fn held(permit: OwnedSemaphorePermit) -> Self {
        Slot(Arc::new(parking_lot::Mutex::new(Some(permit))))
    }

    /// Gives the slot back while the request waits for its flow turn (nothing if not held).
    pub fn lend(&self) {
        drop(self.0.lock().take());
    }

    /// Takes a slot of `admission` again after the turn (at once if one is free, else after
    /// the requests already waiting for one); nothing if one is held.
    pub async fn reclaim(&self, admission: &Admission) {
        if self.0.lock().is_some() {
            return;
        }
        if let Ok(permit) = admission.slots.clone().acquire_owned().await {
            *self.0.lock() = Some(permit);
        }
    }

    /// Whether a slot is held now.
    pub fn is_held(&self) -> bool {
        self.0.lock().is_some()
    }
}

/// When a request reached the gateway, before its body was read and before it queued; its
/// request timeout counts from here.
#[derive(Debug, Clone, Copy)]
pub struct Arrived(pub tokio::time::Instant);

/// Request-body bytes held at once over all requests.
#[derive(Debug, Default)]
pub struct BodyBudget {
    held: AtomicUsize,
}

impl BodyBudget {
    /// Bytes held now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }

    /// Takes `n` more bytes if that stays within `max`.
    fn try_take(&self, n: usize, max: usize) -> bool {
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |h| {
                h.checked_add(n).filter(|&t| t <= max)
            })
            .is_ok()
    }
}

/// Bytes of one request's body in the budget; given back when dropped.
pub struct BodyHold {
    budget: Arc<BodyBudget>,
    bytes: usize,
}

impl Drop for BodyHold {
    fn drop(&mut self) {
        self.budget.held.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// Frames at least this long are kept as they came until the body is joined; shorter ones
/// are copied together as they arrive.
const MIN_KEPT_FRAME_BYTES: usize = 4096;

/// Reads a whole body by `deadline`, at most `limit` bytes, taking each chunk's bytes from
/// `budget` (at most `budget_max` held over all requests) as it arrives.
pub async fn read_body_within(
    body: Body,
    limit: usize,
    budget: &Arc<BodyBudget>,
    budget_max: usize,
    deadline: tokio::time::Instant,
) -> Result<(Bytes, BodyHold), ApiError> {
    use http_body_util::BodyExt;
    let mut hold = BodyHold {
        budget: budget.clone(),
        bytes: 0,
    };
    let mut body = body;
    // The frames as they came (hyper's slices of its read buffer, not copied), joined once at
    // the end: growing one buffer frame by frame would copy a long body about twice over.
    // Frames under `MIN_KEPT_FRAME_BYTES` are gathered in `small` first, so the list holds at
    // most two entries per `MIN_KEPT_FRAME_BYTES` of body however the client cuts it.
    let mut frames: Vec<Bytes> = Vec::new();
    let mut small = bytes::BytesMut::new();
    let mut read = 0usize;
    loop {
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => return Err(body_timeout()),
            Ok(None) => break,
            Ok(Some(Err(e))) => {
                return Err(ApiError::bad_request(
                    "body_read_error",
                    format!("cannot read request body: {e}"),
                    None,
                ));
            }
            Ok(Some(Ok(frame))) => frame,
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if read + data.len() > limit {
            return Err(ApiError {
                status: StatusCode::PAYLOAD_TOO_LARGE,
                kind: "invalid_request_error",
                code: "body_too_large",
                message: format!("request body exceeds {limit} bytes"),
                param: None,
            });
        }
        if !budget.try_take(data.len(), budget_max) {
            return Err(ApiError {
                status: StatusCode::SERVICE_UNAVAILABLE,
                kind: "server_error",
                code: "body_budget_exhausted",
                message: format!(
                    "the gateway holds {budget_max} bytes of request bodies, its limit; retry later"
                ),
                param: None,
            });
        }
        hold.bytes += data.len();
        read += data.len();
        if data.len() < MIN_KEPT_FRAME_BYTES {
            small.extend_from_slice(&data);
        } else {
            if !small.is_empty() {
                frames.push(small.split().freeze());
            }
            frames.push(data);
        }
    }
    if !small.is_empty() {
        frames.push(small.freeze());
    }
    let body = match frames.len() {
        0 => Bytes::new(),
        1 => frames.pop().unwrap_or_default(),
        _ => {
            let mut joined = bytes::BytesMut::with_capacity(read);
            for frame in &frames {
                joined.extend_from_slice(frame);
            }
            joined.freeze()
        }
    };
    Ok((body, hold))
}

/// 408: the body did not arrive in time.
pub fn body_timeout() -> ApiError {
    ApiError {
        status: StatusCode::REQUEST_TIMEOUT,
        kind: "invalid_request_error",
        code: "body_timeout",
        message: "the request body did not arrive in time".into(),
        param: None,
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

    #[tokio::test]
    async fn a_lent_slot_serves_another_and_is_taken_again() {
        let a = Admission::new(1, 4);
        let slot = a.admit().await.unwrap();
        slot.lend();
        assert!(!slot.is_held());
        assert_eq!(a.active(), 0);
        let other = a.admit().await.unwrap();
        {
            let back = slot.reclaim(&a);
            tokio::pin!(back);
            assert!(
                tokio::time::timeout(std::time::Duration::from_millis(20), &mut back)
                    .await
                    .is_err(),
                "waits for a free slot"
            );
            drop(other);
            back.await;
        }
        assert!(slot.is_held());
        assert_eq!(a.active(), 1);
        let clone = slot.clone();
        drop(slot);
        assert_eq!(a.active(), 1, "held until the last holder goes");
        drop(clone);
        assert_eq!(a.active(), 0);
    }

    #[tokio::test]
    async fn a_body_in_frames_of_every_size_reads_back_whole_and_counted() {
        // Frames under, at and over MIN_KEPT_FRAME_BYTES, in every order, and a single one.
        let sizes: [&[usize]; 4] = [
            &[
                1,
                2,
                MIN_KEPT_FRAME_BYTES,
                3,
                70_000,
                0,
                5,
                MIN_KEPT_FRAME_BYTES - 1,
            ],
            &[100_000],
            &[3, 3, 3],
            &[],
        ];
        for sizes in sizes {
            let frames: Vec<Bytes> = sizes
                .iter()
                .enumerate()
                .map(|(i, &n)| Bytes::from(vec![b'a' + i as u8; n]))
                .collect();
            let whole: Vec<u8> = frames.iter().flat_map(|f| f.iter().copied()).collect();
            let stream = futures_util::stream::iter(
                frames.into_iter().map(Ok::<_, std::convert::Infallible>),
            );
            let budget = Arc::new(BodyBudget::default());
            let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
            let (body, hold) = read_body_within(
                Body::from_stream(stream),
                1 << 20,
                &budget,
                1 << 20,
                deadline,
            )
            .await
            .unwrap();
            assert_eq!(&body[..], &whole[..], "frames {sizes:?}");
            assert_eq!(budget.held(), whole.len());
            drop(hold);
            assert_eq!(budget.held(), 0);
        }
    }
}
