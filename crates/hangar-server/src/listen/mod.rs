//! Listening: the accept loop of the HTTP listener ([`serve`]) and of the gRPC one
//! ([`crate::grpc::serve`]), and the limits they share ([`Acceptor`]).
//!
//! Every accepted socket passes the connection cap (`connections.max_connections`, per
//! listener, [`registry`]): at the cap, the connection that has waited longest for a request
//! is closed to make room; when every connection has a request in flight, the new one is
//! closed at once. A connection that sends no request in time is closed by its own
//! watchdog ([`Conn`]): the first complete request head within `header_read_timeout_s`, the
//! next request on a kept-alive connection within `idle_timeout_s` — for HTTP/1 and HTTP/2
//! alike, the protocol sniffing and the HTTP/2 preface included. A request body has
//! `body_read_timeout_s` to arrive ([`Deadline`]). When `accept` itself fails for want of
//! descriptors or memory (EMFILE, ENFILE, ENOMEM, ENOBUFS), the loop closes the connection
//! that has waited longest and pauses, 100 ms growing to 1 s, instead of spinning.

mod conn;
mod registry;

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use hangar_config::ConnectionLimits;
use http::{HeaderValue, Request, StatusCode, Version, header};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, Sleep};

use crate::HangarService;
use crate::body::ResponseBody;
pub(crate) use conn::{BodyTimeout, Conn, ConnTag, Deadline, Tracked};
use conn::{Shared, lock};
use registry::Registry;
pub(crate) use registry::{CallClass, Gate};

use crate::metrics::ListenerCounters;

/// Streams one HTTP/2 connection may carry at once, on both listeners (hyper's default for
/// HTTP; tonic alone would set none).
pub(crate) const H2_MAX_CONCURRENT_STREAMS: u32 = 200;
/// How often an HTTP/2 connection is pinged, so a vanished client is noticed during a long
/// answer that writes nothing.
pub(crate) const H2_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// How long a ping may go unanswered before the connection is closed.
pub(crate) const H2_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// Serves `service` on `listener` (HTTP/1.1 and HTTP/2) until `shutdown` resolves, then
/// stops accepting and waits for in-flight requests (streams included) to finish.
///
/// The service's [`ServerOptions::connections`](crate::ServerOptions::connections) bound
/// the connections (see the module documentation of `listen`): a cap with shedding,
/// header, idle and body deadlines, and a pause instead of a busy loop when `accept`
/// fails.
///
/// # Errors
/// None today: accept errors pause the loop and are logged. The `Result` stays so that a
/// fatal listener error can be reported without an API change.
pub async fn serve(
    listener: TcpListener,
    service: HangarService,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let limits = service.state.options.connections;
    let stall = service.state.options.http.stream_write_timeout;
    let counters = service.state.metrics.listener("http");
    let mut acceptor = Acceptor::new(listener, &limits, stall, counters, "http");
    let graceful = GracefulShutdown::new();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // Heads are bounded by each connection's watchdog, for HTTP/1 and HTTP/2 alike (hyper's
    // own timer covers neither the protocol sniffing nor HTTP/2).
    builder.http1().header_read_timeout(None);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(H2_MAX_CONCURRENT_STREAMS)
        .keep_alive_interval(H2_KEEPALIVE_INTERVAL)
        .keep_alive_timeout(H2_KEEPALIVE_TIMEOUT);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            conn = acceptor.next() => {
                let (tag, peer) = (conn.tag(), conn.peer());
                let timeout = limits.body_read_timeout;
                let service = hyper::service::service_fn({
                    let service = service.clone();
                    move |mut req: Request<hyper::body::Incoming>| {
                        let (service, tag) = (service.clone(), tag.clone());
                        req.extensions_mut().insert(crate::PeerAddr(peer));
                        async move { Ok::<_, Infallible>(answer(&service, &tag, req, timeout).await) }
                    }
                });
                let conn = builder.serve_connection_with_upgrades(TokioIo::new(conn), service);
                let conn = graceful.watch(conn.into_owned());
                // The connection and the bodies it hands out wake each other while the task
                // runs: coalesced, that costs no wake-up of another worker thread.
                tokio::spawn(hangar_runtime::engine::Coalesced::new(async move {
                    if let Err(e) = conn.await {
                        tracing::debug!(%peer, error = %e, "connection ended with an error");
                    }
                }));
            }
            () = &mut shutdown => break,
        }
    }
    drop(acceptor);
    service.begin_shutdown();
    tracing::info!("shutting down: waiting for in-flight requests");
    graceful.shutdown().await;
    Ok(())
}

/// One request of a connection: counted in flight until its answer's body is dropped, its
/// body due within `body_timeout`. Its head passes the gate first ([`Gate`]): a keyless call
/// over the connection's bound is answered 429 `too_many_keyless_calls`, and a connection
/// past its refused calls closes, both before a byte of the body is read. A 408 closes an
/// HTTP/1 connection (RFC 9110, 15.5.9): the rest of the late body is never read.
async fn answer(
    service: &HangarService,
    tag: &ConnTag,
    req: Request<hyper::body::Incoming>,
    body_timeout: Duration,
) -> http::Response<Tracked<ResponseBody>> {
    let mut in_flight = tag.request();
    let http1 = req.version() < Version::HTTP_2;
    let class = service.call_class(&req);
    let mut response = match in_flight.gate(class) {
        Gate::Pass | Gate::Refuse => {
            let read = tag.body_bytes();
            service.handle(req.map(|body| Deadline::new(body, body_timeout, read))).await
        }
        Gate::TooManyKeyless => service.refuse(req.uri().path(), too_many_keyless(service)),
        // Shed: the connection closes at its next read or write.
        Gate::Close => crate::body::empty_response(StatusCode::UNAUTHORIZED),
    };
    if http1 && response.status() == StatusCode::REQUEST_TIMEOUT {
        response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response.map(|body| Tracked::new(body, Some(in_flight)))
}

/// The refusal of a keyless call over `connections.max_keyless_streams`.
pub(crate) fn too_many_keyless(service: &HangarService) -> crate::error::ApiError {
    let max = service.state.options.connections.max_keyless_streams;
    let mut error = crate::error::ApiError::new(
        crate::error::HttpCode::TooManyKeylessCalls,
        format!(
            "this connection already runs {max} calls without a key (connections.max_keyless_streams); send a key, or wait for one to end"
        ),
    );
    error.retry_after = Some(1);
    error
}

/// A listener's accept loop: admits connections under the cap and pauses when `accept`
/// fails for want of resources. A [`Stream`](tonic::codegen::tokio_stream::Stream) of
/// connections for tonic, and [`Acceptor::next`] for the HTTP loop.
pub(crate) struct Acceptor {
    listener: TcpListener,
    shared: Shared,
    header_timeout: Duration,
    counters: ListenerCounters,
    backoff: Backoff,
    pause: Option<Pin<Box<Sleep>>>,
    /// `http` or `grpc`, for the logs.
    name: &'static str,
    refused: Every,
    shed: Every,
}

impl Acceptor {
    /// Accepts on `listener` under `limits`.
    pub(crate) fn new(
        listener: TcpListener,
        limits: &ConnectionLimits,
        stall: Duration,
        counters: ListenerCounters,
        name: &'static str,
    ) -> Self {
        Self {
            listener,
            shared: Arc::new(Mutex::new(Registry::new(limits, stall))),
            counters,
            header_timeout: limits.header_read_timeout,
            backoff: Backoff::default(),
            pause: None,
            name,
            refused: Every::new(LOG_EVERY),
            shed: Every::new(LOG_EVERY),
        }
    }

    /// The next admitted connection. Cancel-safe.
    pub(crate) async fn next(&mut self) -> Conn {
        std::future::poll_fn(|cx| self.poll_conn(cx)).await
    }

    fn poll_conn(&mut self, cx: &mut Context<'_>) -> Poll<Conn> {
        loop {
            if let Some(pause) = &mut self.pause {
                ready!(pause.as_mut().poll(cx));
                self.pause = None;
            }
            // `poll_accept` spends tokio's cooperative budget, so a flood of connections to
            // refuse cannot hold this task forever.
            match ready!(self.listener.poll_accept(cx)) {
                Ok((stream, peer)) => {
                    self.backoff.succeeded();
                    if let Some(conn) = self.admit(stream, peer) {
                        return Poll::Ready(conn);
                    }
                }
                Err(e) => match self.backoff.failed(&e) {
                    None => tracing::debug!(listener = self.name, error = %e, "accept failed"),
                    Some(pause) => {
                        // Out of descriptors or memory: give one back by closing the
                        // connection that has waited longest for a request, then wait.
                        let shed = lock(&self.shared).shed_longest_waiting();
                        if let Some(skipped) = self.backoff.log.tick(Instant::now()) {
                            tracing::warn!(
                                listener = self.name,
                                error = %e,
                                pause_ms = pause.as_millis() as u64,
                                shed_a_waiting_connection = shed.is_some(),
                                failures_not_logged = skipped,
                                "accept failed: pausing"
                            );
                        }
                        self.pause = Some(Box::pin(tokio::time::sleep(pause)));
                    }
                },
            }
        }
    }

    /// Admits `stream` under the cap, or closes it (`None`).
    fn admit(&mut self, stream: TcpStream, peer: SocketAddr) -> Option<Conn> {
        let now = Instant::now();
        let admitted = lock(&self.shared).admit(now);
        let Some(admitted) = admitted else {
            // Every connection has a request in flight. Closing at once costs nothing while
            // at the limit and reads nothing from a client that may be hostile; an answer
            // would have to read the request first, or be lost to the reset.
            if let Some(skipped) = self.refused.tick(now) {
                tracing::warn!(
                    listener = self.name,
                    %peer,
                    refused_not_logged = skipped,
                    "connection refused: every connection has a request in flight (connections.max_connections)"
                );
            }
            return None;
        };
        if admitted.shed.is_some()
            && let Some(skipped) = self.shed.tick(now)
        {
            tracing::info!(
                listener = self.name,
                shed_not_logged = skipped,
                "at connections.max_connections: closed the connection that waited longest for a request"
            );
        }
        // Small answers and stream events go out at once, not after an ACK.
        let _ = stream.set_nodelay(true);
        // The watchdog's first look: the head's deadline, or sooner to see a stall.
        let deadline = now + self.header_timeout.min(lock(&self.shared).recheck());
        Some(Conn::new(
            stream,
            peer,
            admitted.id,
            Arc::clone(&self.shared),
            admitted.signal,
            deadline,
            self.counters.clone(),
        ))
    }
}

impl tonic::codegen::tokio_stream::Stream for Acceptor {
    type Item = io::Result<Conn>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().poll_conn(cx).map(|conn| Some(Ok(conn)))
    }
}

/// The shortest pause after a failed accept.
const PAUSE_MIN: Duration = Duration::from_millis(100);
/// The longest.
const PAUSE_MAX: Duration = Duration::from_secs(1);
/// At most one warning of a kind per listener this often.
const LOG_EVERY: Duration = Duration::from_secs(1);

/// How long to pause after failed accepts: nothing for an error of the one connection
/// being accepted, else [`PAUSE_MIN`] doubling to [`PAUSE_MAX`] while accepts keep failing.
#[derive(Debug)]
struct Backoff {
    next: Duration,
    log: Every,
}

impl Default for Backoff {
    fn default() -> Self {
        Self { next: PAUSE_MIN, log: Every::new(LOG_EVERY) }
    }
}

impl Backoff {
    /// The pause after `error`, if any.
    fn failed(&mut self, error: &io::Error) -> Option<Duration> {
        if is_connection_error(error) {
            return None;
        }
        let pause = self.next;
        self.next = (self.next * 2).min(PAUSE_MAX);
        Some(pause)
    }

    /// An accept succeeded: the next failure pauses briefly again.
    fn succeeded(&mut self) {
        self.next = PAUSE_MIN;
    }
}

/// An error of the one connection being accepted (it was reset or aborted before the
/// accept, or a network error pending on it): the next accept may succeed at once. Every
/// other error (EMFILE, ENFILE, ENOMEM, ENOBUFS, and anything unknown) is the process or
/// the system running short, which an immediate retry would only repeat.
fn is_connection_error(error: &io::Error) -> bool {
    use io::ErrorKind::*;
    matches!(
        error.kind(),
        ConnectionAborted
            | ConnectionReset
            | ConnectionRefused
            | Interrupted
            | WouldBlock
            | HostUnreachable
            | NetworkUnreachable
            | NetworkDown
    )
}

/// A rate limit for a log line: yes at most once per period, with the count of the ones
/// skipped since.
#[derive(Debug)]
struct Every {
    period: Duration,
    last: Option<Instant>,
    skipped: u64,
}

impl Every {
    fn new(period: Duration) -> Self {
        Self { period, last: None, skipped: 0 }
    }

    /// Whether to log now: `Some(skipped since the last line)`, or `None`.
    fn tick(&mut self, now: Instant) -> Option<u64> {
        match self.last {
            Some(last) if now.saturating_duration_since(last) < self.period => {
                self.skipped += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.skipped))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_errors_pause_growing_to_a_second_and_connection_errors_do_not() {
        let mut backoff = Backoff::default();
        let emfile = io::Error::from_raw_os_error(24);
        let pauses: Vec<u64> =
            (0..6).map(|_| backoff.failed(&emfile).unwrap().as_millis() as u64).collect();
        assert_eq!(pauses, [100, 200, 400, 800, 1000, 1000]);
        let aborted = io::Error::from(io::ErrorKind::ConnectionAborted);
        assert_eq!(backoff.failed(&aborted), None, "one connection's error: no pause");
        backoff.succeeded();
        assert_eq!(backoff.failed(&emfile), Some(PAUSE_MIN), "a success starts over");
        for errno in [23 /* ENFILE */, 12 /* ENOMEM */, 105 /* ENOBUFS */] {
            let e = io::Error::from_raw_os_error(errno);
            assert!(backoff.failed(&e).is_some(), "{e} pauses");
        }
    }

    #[test]
    fn a_warning_is_logged_at_most_once_a_period_with_the_count_skipped() {
        let mut every = Every::new(Duration::from_secs(1));
        let t0 = Instant::now();
        assert_eq!(every.tick(t0), Some(0));
        assert_eq!(every.tick(t0 + Duration::from_millis(300)), None);
        assert_eq!(every.tick(t0 + Duration::from_millis(900)), None);
        assert_eq!(every.tick(t0 + Duration::from_millis(1000)), Some(2));
        assert_eq!(every.tick(t0 + Duration::from_millis(1500)), None);
    }
}
