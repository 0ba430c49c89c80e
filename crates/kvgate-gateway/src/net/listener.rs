//! The traffic listener: the accept loop and the connections, served with hyper-util's auto
//! builder (HTTP/1.1, and h2c with prior knowledge, as `axum::serve` serves them), with bounds on
//! what one connection, or many, may hold.
//!
//! - **Connection cap** (`max_connections`, default 8,192, read at start): a connection beyond
//!   it is accepted and closed at once, counted in `kvgate_connections_refused_total`. Closing
//!   (rather than leaving it in the kernel's accept queue until one closes) tells the client and
//!   a load balancer at once, so they retry elsewhere instead of timing out, keeps the accept
//!   queue moving, and holds the extra file descriptor for an instant only. Keep the process's
//!   `ulimit -n` above the cap plus the pods' connections.
//! - **Header-read timeout** (`header_read_timeout_ms`, default 10 s): a request head must be
//!   whole within this of the connection's accept, or of its first byte after a keep-alive pause;
//!   else the connection is closed (`kvgate_connection_timeouts_total{kind="header_read"}`). A
//!   client trickling its head (slowloris) holds a descriptor that long at most; the 10 s are
//!   Go's common `ReadHeaderTimeout` and far above what a real client needs on any network.
//! - **Idle timeout** (`idle_connection_timeout_ms`, default 75 s): a keep-alive connection with
//!   no request in flight and no byte read is closed after this (`kind="idle"`). hyper's own
//!   `header_read_timeout` cannot do both: its timer starts when a connection goes idle, so the
//!   short header timeout would also close every idle keep-alive connection; it is off here and
//!   [`ConnIo`] keeps both clocks. 75 s is nginx's `keepalive_timeout`: above the 60 s idle
//!   timeout of common load balancers (AWS ALB), so the balancer closes an idle connection
//!   first and never sends a request on one kvgate is closing. On HTTP/2 any frame while idle
//!   (a PING) is not a request head, so only the idle timeout applies between requests.
//! - **Client write timeout** (`client_write_timeout_ms`, default 60 s): a connection whose
//!   client accepts no byte for this long is closed (`kind="client_write"`), so its response
//!   body is dropped and the request's slot, body budget and in-flight share are released. The
//!   request timeout is only checked when the response body is polled, which a stalled client
//!   prevents; with this bound a response lives at most `request_timeout` plus this. 60 s is
//!   the pods' `idle_chunk_timeout`: no side of a stream may stall longer than a minute.
//! - **Accept errors** (`EMFILE`, `ENFILE`, `ENOBUFS`, …): counted in
//!   `kvgate_accept_errors_total`, logged at most 10 times a second, and accepting pauses 5 ms,
//!   doubling up to 1 s while they last (never a busy loop); errors about one connection
//!   (reset or aborted before accept) just skip it.
//!
//! `kvgate_open_connections` is the number open now. TCP_NODELAY is set on every connection.
//!
//! Graceful stop ([`serve`]'s `stop`): the listener closes, idle connections close at once,
//! connections with a request in flight close after its response (HTTP/2: GOAWAY); [`serve`]
//! returns when every connection has closed. Aborting its task closes them all at once.
//!
//! Bounds: at most `max_connections` connection tasks, each with one [`ConnState`] and two
//! timers.

pub use crate::metrics::ConnectionMetrics;
use crate::metrics::timeout_label;
use crate::state::{Shared, Telemetry};
use axum::body::Body;
use bytes::Bytes;
use futures_util::task::AtomicWaker;
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use std::convert::Infallible;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::time::{Instant, Sleep};

/// First pause after an accept error; doubled on each one in a row.
const ACCEPT_PAUSE_MIN: Duration = Duration::from_millis(5);
/// Longest pause after accept errors in a row.
const ACCEPT_PAUSE_MAX: Duration = Duration::from_secs(1);

/// The per-connection timeouts, from the config in force when the connection was accepted.
#[derive(Debug, Clone, Copy)]
struct ConnectionTimeouts {
    header_read: Duration,
    idle: Duration,
    client_write: Duration,
}

/// Serves `app` on `listener` until `stop` turns true (then gracefully, see the module doc).
pub async fn serve(
    listener: TcpListener,
    app: axum::Router,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
) {
    let max_connections = shared
        .config()
        .max_connections
        .clamp(1, Semaphore::MAX_PERMITS);
    let slots = Arc::new(Semaphore::new(max_connections));
    let (closing, closing_rx) = watch::channel(false);
    let mut conns = tokio::task::JoinSet::new();
    let mut pause = ACCEPT_PAUSE_MIN;
    let metrics = &shared.telemetry.metrics.connections;
    loop {
        let accepted = tokio::select! {
            _ = stop.wait_for(|s| *s) => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => continue,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => {
                pause = ACCEPT_PAUSE_MIN;
                stream
            }
            Err(e) if is_connection_error(&e) => continue,
            Err(e) => {
                metrics.accept_errors.inc();
                if shared.telemetry.log_limit.allow("accept_error") {
                    tracing::warn!(error = %e, pause_ms = pause.as_millis() as u64, "accept error on the traffic listener; pausing accepts");
                }
                tokio::select! {
                    _ = stop.wait_for(|s| *s) => break,
                    _ = tokio::time::sleep(pause) => {}
                }
                pause = (pause * 2).min(ACCEPT_PAUSE_MAX);
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            metrics.refused.inc();
            if shared.telemetry.log_limit.allow("connection_refused") {
                tracing::warn!(
                    max_connections,
                    "connection refused: max_connections are open"
                );
            }
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        conns.spawn(connection(
            stream,
            slot,
            app.clone(),
            shared.clone(),
            closing_rx.clone(),
        ));
    }
    drop(listener);
    let _ = closing.send(true);
    while conns.join_next().await.is_some() {}
}

/// Errors about one connection that went away before it was accepted, not about the listener.
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// An open connection in `kvgate_open_connections`, holding its place under the cap.
struct Open {
    telemetry: Arc<Telemetry>,
    _slot: OwnedSemaphorePermit,
}

impl Drop for Open {
    fn drop(&mut self) {
        self.telemetry.metrics.connections.open.dec();
    }
}

async fn connection(
    stream: TcpStream,
    slot: OwnedSemaphorePermit,
    app: axum::Router,
    shared: Arc<Shared>,
    mut closing: watch::Receiver<bool>,
) {
    shared.telemetry.metrics.connections.open.inc();
    let _open = Open {
        telemetry: shared.telemetry.clone(),
        _slot: slot,
    };
    let timeouts = {
        let cfg = shared.config();
        ConnectionTimeouts {
            header_read: cfg.header_read_timeout,
            idle: cfg.idle_connection_timeout,
            client_write: cfg.client_write_timeout,
        }
    };
    let state = Arc::new(ConnState::new(timeouts));
    let io = TokioIo::new(ConnIo::new(stream, state.clone(), shared.telemetry.clone()));
    let service = hyper::service::service_fn(move |req: http::Request<Incoming>| {
        let request = state.request_started(req.version());
        let mut app = app.clone();
        // The Router is always ready (axum's docs), so no poll_ready first.
        let call = tower::Service::call(&mut app, req.map(Body::new));
        async move {
            let resp = call.await?;
            Ok::<_, Infallible>(resp.map(|inner| {
                Body::new(OnConnection {
                    inner,
                    _request: request,
                })
            }))
        }
    });
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // Off: its timer would also count a keep-alive pause as header-read time (module doc).
    builder.http1().header_read_timeout(None);
    // As axum::serve: the CONNECT protocol of HTTP/2 upgrades.
    builder.http2().enable_connect_protocol();
    let conn = builder.serve_connection_with_upgrades(io, service);
    tokio::pin!(conn);
    let closed = async move {
        let _ = closing.wait_for(|c| *c).await;
    };
    let result = tokio::select! {
        result = conn.as_mut() => result,
        () = closed => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = result {
        tracing::debug!(error = %e, "traffic connection ended with an error");
    }
}

/// What the IO of a connection and its requests share: how many requests are in flight, and
/// while none is, when the connection closes unless a request comes.
struct ConnState {
    timeouts: ConnectionTimeouts,
    in_flight: AtomicUsize,
    /// The connection speaks HTTP/2 (seen on its first request).
    h2: AtomicBool,
    /// While no request is in flight: the instant the connection closes at, and the timeout's
    /// kind (`header_read` or `idle`).
    wait: parking_lot::Mutex<(Instant, &'static str)>,
    /// The connection task, woken when the last request in flight ends, so that the idle clock
    /// starts.
    reader: AtomicWaker,
}

impl ConnState {
    fn new(timeouts: ConnectionTimeouts) -> Self {
        ConnState {
            timeouts,
            in_flight: AtomicUsize::new(0),
            h2: AtomicBool::new(false),
            wait: parking_lot::Mutex::new((Instant::now() + timeouts.header_read, "header_read")),
            reader: AtomicWaker::new(),
        }
    }

    fn request_started(self: &Arc<Self>, version: http::Version) -> RequestOnConnection {
        if version == http::Version::HTTP_2 {
            self.h2.store(true, Ordering::Relaxed);
        }
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        RequestOnConnection(self.clone())
    }

    /// Bytes arrived: on an idle HTTP/1 connection they begin a request head, which must be
    /// whole within the header-read timeout.
    fn read_some(&self) {
        if self.in_flight.load(Ordering::Acquire) > 0 || self.h2.load(Ordering::Relaxed) {
            return;
        }
        let mut wait = self.wait.lock();
        if wait.1 == "idle" {
            *wait = (Instant::now() + self.timeouts.header_read, "header_read");
        }
    }

    /// When the connection closes unless it reads a request, and why; None while a request is
    /// in flight (its body read and its response have their own timeouts).
    fn read_deadline(&self) -> Option<(Instant, &'static str)> {
        (self.in_flight.load(Ordering::Acquire) == 0).then(|| *self.wait.lock())
    }
}

/// A request in flight on its connection, until its response body ends or is dropped.
struct RequestOnConnection(Arc<ConnState>);

impl Drop for RequestOnConnection {
    fn drop(&mut self) {
        let state = &self.0;
        if state.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            *state.wait.lock() = (Instant::now() + state.timeouts.idle, "idle");
            state.reader.wake();
        }
    }
}

/// A response body that keeps its request in flight on the connection until it ends.
struct OnConnection {
    inner: Body,
    _request: RequestOnConnection,
}

impl http_body::Body for OnConnection {
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

/// A connection's socket with its clocks: reads fail once the connection waited too long for a
/// request head ([`ConnState::read_deadline`]), writes once the client accepted no byte for the
/// client write timeout. hyper closes the connection on either error.
struct ConnIo {
    stream: TcpStream,
    state: Arc<ConnState>,
    telemetry: Arc<Telemetry>,
    read_timer: Pin<Box<Sleep>>,
    /// The instant `read_timer` is set to, if armed.
    read_timer_at: Option<Instant>,
    write_timer: Pin<Box<Sleep>>,
    /// A write is pending since `write_timer` was armed.
    write_stalled: bool,
}

impl ConnIo {
    fn new(stream: TcpStream, state: Arc<ConnState>, telemetry: Arc<Telemetry>) -> Self {
        let now = Instant::now();
        ConnIo {
            stream,
            state,
            telemetry,
            read_timer: Box::pin(tokio::time::sleep_until(now)),
            read_timer_at: None,
            write_timer: Box::pin(tokio::time::sleep_until(now)),
            write_stalled: false,
        }
    }

    fn timed_out(&self, kind: &'static str) -> io::Error {
        let connections = &self.telemetry.metrics.connections;
        connections
            .timeouts
            .get_or_create(&timeout_label(kind))
            .inc();
        if kind != "idle" && self.telemetry.log_limit.allow("connection_timeout") {
            tracing::info!(
                kind,
                peer = ?self.stream.peer_addr().ok(),
                "traffic connection closed by its timeout"
            );
        }
        io::Error::new(io::ErrorKind::TimedOut, format!("{kind} timeout"))
    }

    /// The socket has nothing to read: Pending, or the error closing a connection that waited
    /// too long for a request.
    fn read_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.state.reader.register(cx.waker());
        let Some((by, kind)) = self.state.read_deadline() else {
            return Poll::Pending;
        };
        if self.read_timer_at != Some(by) {
            self.read_timer.as_mut().reset(by);
            self.read_timer_at = Some(by);
        }
        if self.read_timer.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        Poll::Ready(Err(self.timed_out(kind)))
    }

    /// A write that did not complete starts (or continues) a stall; past the client write
    /// timeout it fails. Only a write that completes ends the stall.
    fn bound_stall<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        if !self.write_stalled {
            self.write_stalled = true;
            let by = Instant::now() + self.state.timeouts.client_write;
            self.write_timer.as_mut().reset(by);
        }
        if self.write_timer.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        Poll::Ready(Err(self.timed_out("client_write")))
    }
}

impl AsyncRead for ConnIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.stream).poll_read(cx, buf) {
            Poll::Pending => this.read_pending(cx),
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    this.state.read_some();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
        }
    }
}

impl AsyncWrite for ConnIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.stream).poll_write(cx, buf) {
            Poll::Pending => this.bound_stall(cx),
            done => {
                this.write_stalled = false;
                done
            }
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.stream).poll_write_vectored(cx, bufs) {
            Poll::Pending => this.bound_stall(cx),
            done => {
                this.write_stalled = false;
                done
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.stream).poll_flush(cx) {
            Poll::Pending => this.bound_stall(cx),
            done => done,
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}
