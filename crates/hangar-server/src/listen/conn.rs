//! One admitted connection ([`Conn`]): the socket, wrapped so that it closes when the cap
//! sheds it or when it sends no request in time; and the request-side pieces that tell the
//! registry what the connection is doing ([`ConnTag::request`], [`Tracked`]) and bound how
//! long a body may take ([`Deadline`]).

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::time::{Instant, Sleep};

use bytes::Bytes;
use prometheus_client::metrics::counter::Counter;

use crate::metrics::ListenerCounters;

use super::registry::{CallClass, ConnId, Gate, Owed, Registry, Watch};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A listener's registry, shared by its acceptor, its connections and their requests.
pub(crate) type Shared = Arc<Mutex<Registry>>;

/// The registry, locked. Never held across an `.await`; a panic while it was held leaves
/// counts that are still usable, so poisoning is ignored.
pub(crate) fn lock(shared: &Shared) -> MutexGuard<'_, Registry> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Which connection a request came on: what the gRPC listener finds in a request's
/// extensions (tonic puts a connection's `connect_info` there).
#[derive(Clone)]
pub(crate) struct ConnTag {
    id: ConnId,
    shared: Shared,
    /// The client's address.
    peer: SocketAddr,
    /// The listener's counters.
    counters: ListenerCounters,
}

impl ConnTag {
    /// The client's address.
    pub(crate) fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// The counter of request body bytes read on this connection's listener.
    pub(crate) fn body_bytes(&self) -> Counter {
        self.counters.body_bytes.clone()
    }

    /// A request head arrived on this connection: it is busy until the returned guard
    /// drops (with the answer's body, or with the request if it is abandoned).
    pub(crate) fn request(&self) -> InFlight {
        let owed = lock(&self.shared).request_started(self.id);
        InFlight { tag: self.clone(), owed, keyless: false }
    }
}

/// One request in flight on a connection.
pub(crate) struct InFlight {
    tag: ConnTag,
    /// Since when its answer has waited for the peer.
    owed: Arc<Owed>,
    /// Whether it passed the gate as a keyless call.
    keyless: bool,
}

impl InFlight {
    /// Whether the call, of `class`, may go on (see [`super::registry::gate`]); a keyless
    /// call that passes counts against its connection's bound until this request ends.
    pub(crate) fn gate(&mut self, class: CallClass) -> Gate {
        let verdict = lock(&self.tag.shared).gate(self.tag.id, class);
        if verdict == Gate::Close {
            self.tag.counters.refused.inc();
        }
        self.keyless = verdict == Gate::Pass && class == CallClass::Keyless;
        verdict
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let now = Instant::now();
        lock(&self.tag.shared).request_ended(self.tag.id, &self.owed, self.keyless, now);
    }
}

/// Why a connection was closed by the listener.
#[derive(Debug, Clone, Copy)]
enum Closed {
    Shed,
    NoRequest,
    Stalled,
}

impl Closed {
    fn error(self) -> io::Error {
        match self {
            Self::Shed => io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "closed to make room for a new connection (connections.max_connections)",
            ),
            Self::NoRequest => io::Error::new(
                io::ErrorKind::TimedOut,
                "no request in time (connections.header_read_timeout_s or idle_timeout_s)",
            ),
            Self::Stalled => io::Error::new(
                io::ErrorKind::TimedOut,
                "the peer took no bytes of any answer in time (http.stream_write_timeout_s)",
            ),
        }
    }
}

/// An admitted connection. Reads and writes fail, which ends the connection's task and
/// closes the socket, once the cap shed it, or once it has waited for a request longer
/// than its deadline (a new connection for its first complete request head, a kept-alive
/// one for its next request): a watchdog timer, re-armed from the registry when it fires.
pub(crate) struct Conn {
    io: TcpStream,
    peer: SocketAddr,
    tag: ConnTag,
    shed: Option<oneshot::Receiver<()>>,
    closed: Option<Closed>,
    watchdog: Pin<Box<Sleep>>,
}

impl Conn {
    /// Wraps an admitted socket; `deadline` is when it must have sent a request head.
    pub(crate) fn new(
        io: TcpStream,
        peer: SocketAddr,
        id: ConnId,
        shared: Shared,
        shed: oneshot::Receiver<()>,
        deadline: Instant,
        counters: ListenerCounters,
    ) -> Self {
        Self {
            io,
            peer,
            tag: ConnTag { id, shared, peer, counters },
            shed: Some(shed),
            closed: None,
            watchdog: Box::pin(tokio::time::sleep_until(deadline)),
        }
    }

    /// Which connection this is, for its requests.
    pub(crate) fn tag(&self) -> ConnTag {
        self.tag.clone()
    }

    /// The client's address.
    pub(crate) fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// Fails once the connection is to be closed; registers the task for the shed signal
    /// and the watchdog.
    fn check(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        if let Some(closed) = self.closed {
            return Err(closed.error());
        }
        if let Some(shed) = &mut self.shed
            && Pin::new(shed).poll(cx).is_ready()
        {
            // Told to close (or the registry is gone, which only happens with it).
            self.shed = None;
            return Err(self.close(Closed::Shed));
        }
        while self.watchdog.as_mut().poll(cx).is_ready() {
            let now = Instant::now();
            let registry = lock(&self.tag.shared);
            match registry.watch(self.tag.id) {
                Watch::Busy => {
                    let recheck = registry.recheck();
                    self.watchdog.as_mut().reset(now + recheck);
                }
                // Never asleep longer than the recheck: a request may start and stall.
                Watch::Until(at) if at > now => {
                    let at = at.min(now + registry.recheck());
                    self.watchdog.as_mut().reset(at);
                }
                Watch::Until(_) => {
                    drop(registry);
                    return Err(self.close(Closed::NoRequest));
                }
                // Looked at again by then: an answer may move, or a request start.
                Watch::Stalled(at) if at > now => {
                    let at = at.min(now + registry.recheck());
                    self.watchdog.as_mut().reset(at);
                }
                Watch::Stalled(_) => {
                    drop(registry);
                    self.tag.counters.stalled.inc();
                    return Err(self.close(Closed::Stalled));
                }
                Watch::Gone => {
                    drop(registry);
                    return Err(self.close(Closed::Shed));
                }
            }
        }
        Ok(())
    }

    fn close(&mut self, why: Closed) -> io::Error {
        tracing::debug!(peer = %self.peer, reason = ?why, "closing a connection");
        self.closed = Some(why);
        why.error()
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        lock(&self.tag.shared).closed(self.tag.id);
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.check(cx)?;
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.check(cx)?;
        Pin::new(&mut this.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.check(cx)?;
        Pin::new(&mut this.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = ConnTag;

    fn connect_info(&self) -> ConnTag {
        self.tag()
    }
}

/// The largest piece of an answer handed to the connection at once: the connection asks
/// for the next one only once the peer has taken (or the send buffer holds) this one, so a
/// peer that takes a piece per `http.stream_write_timeout_s` is never stalled. HTTP/2's
/// default frame size.
pub(crate) const PIECE_BYTES: usize = 16 << 10;

/// A response body that keeps its request counted as in flight until it is dropped
/// (fully sent, or abandoned with the connection), and tells its stall clock when a piece
/// waits for the peer: from the moment the answer is handed over (the head is sent and the
/// body waits for the connection to ask), and after each piece until the connection asks
/// for the next; never while the body itself has nothing to send yet.
pub(crate) struct Tracked<B> {
    body: B,
    /// The rest of a data frame longer than [`PIECE_BYTES`].
    rest: Bytes,
    in_flight: Option<InFlight>,
}

impl<B> Tracked<B> {
    /// `body`, counted with `in_flight`, handed to the connection now.
    pub(crate) fn new(body: B, in_flight: Option<InFlight>) -> Self {
        if let Some(in_flight) = &in_flight {
            in_flight.owed.owe(Instant::now());
        }
        Self { body, rest: Bytes::new(), in_flight }
    }

    fn owe(&self) {
        if let Some(in_flight) = &self.in_flight {
            in_flight.owed.owe(Instant::now());
        }
    }

    fn settle(&self) {
        if let Some(in_flight) = &self.in_flight {
            in_flight.owed.settle();
        }
    }

    /// The next piece of `data`, keeping the rest.
    fn piece(&mut self, mut data: Bytes) -> Bytes {
        if data.len() > PIECE_BYTES {
            self.rest = data.split_off(PIECE_BYTES);
        }
        data
    }
}

impl<B: Body<Data = Bytes> + Unpin> Body for Tracked<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        // Asked again: the peer took the last piece.
        this.settle();
        if !this.rest.is_empty() {
            let rest = std::mem::take(&mut this.rest);
            let piece = this.piece(rest);
            this.owe();
            return Poll::Ready(Some(Ok(Frame::data(piece))));
        }
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        let polled = match polled {
            Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                Ok(data) => Poll::Ready(Some(Ok(Frame::data(this.piece(data))))),
                Err(frame) => Poll::Ready(Some(Ok(frame))),
            },
            other => other,
        };
        if matches!(polled, Poll::Ready(Some(_))) {
            this.owe();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty() && self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let mut hint = self.body.size_hint();
        let rest = self.rest.len() as u64;
        hint.set_lower(hint.lower() + rest);
        if let Some(upper) = hint.upper() {
            hint.set_upper(upper + rest);
        }
        hint
    }
}

/// A request body did not arrive in full within `connections.body_read_timeout_s`.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error(
    "the request body did not arrive in full within {} s (connections.body_read_timeout_s)",
    .0.as_secs()
)]
pub(crate) struct BodyTimeout(pub(crate) Duration);

/// A request body that fails with [`BodyTimeout`] once `timeout` has passed since the
/// request head arrived (its creation) and the body is still arriving. The timer is set on
/// the first read that has to wait, so a body never read costs none.
/// Every byte read is added to `read` (`hangar_request_body_bytes_total`).
pub(crate) struct Deadline<B> {
    body: B,
    timeout: Duration,
    at: Instant,
    sleep: Option<Pin<Box<Sleep>>>,
    read: Counter,
}

impl<B> Deadline<B> {
    /// `body`, due in full within `timeout` from now, its bytes counted in `read`.
    pub(crate) fn new(body: B, timeout: Duration, read: Counter) -> Self {
        Self { body, timeout, at: Instant::now() + timeout, sleep: None, read }
    }
}

impl<B> Body for Deadline<B>
where
    B: Body + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, BoxError>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.body).poll_frame(cx) {
            if let Some(Ok(data)) = frame.as_ref().map(|f| f.as_ref().map(Frame::data_ref)) {
                this.read.inc_by(data.map_or(0, |d| bytes::Buf::remaining(d) as u64));
            }
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        let at = this.at;
        let sleep = this.sleep.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(BodyTimeout(this.timeout))))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
