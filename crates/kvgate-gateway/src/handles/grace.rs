//! The end of the shutdown grace (`--shutdown-grace-ms`), told to every stream in flight
//! ([`GraceEnd`], held in [`crate::state::AdmissionHandle::grace_end`]; the streams are
//! [`crate::body`]'s).
//!
//! Bound: one waker per stream in flight (at most `max_concurrent_requests`).

use futures_util::task::AtomicWaker;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::Context;
use std::time::Duration;

/// The end of the shutdown grace, told to every stream in flight: each one registered here
/// ([`GraceEnd::watch`]) is woken by [`GraceEnd::end`] and ends with the `shutting_down` SSE
/// event and `[DONE]` at its next poll, whatever its pod is doing.
///
/// A stream's poll costs an atomic load and an [`AtomicWaker`] registration (no lock); the map
/// is locked once when a stream starts and once when it ends.
#[derive(Default)]
pub struct GraceEnd {
    over: AtomicBool,
    pub(crate) grace_ms: AtomicU64,
    next_id: AtomicU64,
    streams: parking_lot::Mutex<rustc_hash::FxHashMap<u64, Arc<AtomicWaker>>>,
}

impl GraceEnd {
    /// Registers a stream; it stays registered until the [`GraceWatch`] is dropped.
    pub fn watch(self: &Arc<Self>) -> GraceWatch {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let waker = Arc::new(AtomicWaker::new());
        self.streams.lock().insert(id, waker.clone());
        GraceWatch {
            end: self.clone(),
            id,
            waker,
        }
    }

    /// The grace (`grace`, for the message) is over: every stream registered is woken.
    pub fn end(&self, grace: Duration) {
        let ms = u64::try_from(grace.as_millis()).unwrap_or(u64::MAX);
        self.grace_ms.store(ms, Ordering::Relaxed);
        self.over.store(true, Ordering::Release);
        for waker in self.streams.lock().values() {
            waker.wake();
        }
    }

    pub fn is_over(&self) -> bool {
        self.over.load(Ordering::Acquire)
    }

    /// Streams registered now.
    pub fn streams(&self) -> usize {
        self.streams.lock().len()
    }
}

/// One stream's registration in [`GraceEnd`].
pub struct GraceWatch {
    pub(crate) end: Arc<GraceEnd>,
    id: u64,
    waker: Arc<AtomicWaker>,
}

impl GraceWatch {
    /// Whether the grace is over; if not, `cx` is woken when it is.
    pub(crate) fn poll_over(&self, cx: &mut Context<'_>) -> bool {
        if self.end.is_over() {
            return true;
        }
        self.waker.register(cx.waker());
        self.end.is_over()
    }
}

impl Drop for GraceWatch {
    fn drop(&mut self) {
        self.end.streams.lock().remove(&self.id);
    }
}
