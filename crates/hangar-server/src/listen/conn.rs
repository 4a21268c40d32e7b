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

use super::registry::{ConnId, Registry, Watch};

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
}

impl ConnTag {
    /// The client's address.
    pub(crate) fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// A request head arrived on this connection: it is busy until the returned guard
    /// drops (with the answer's body, or with the request if it is abandoned).
    pub(crate) fn request(&self) -> InFlight {
        lock(&self.shared).request_started(self.id);
        InFlight(self.clone())
    }
}

/// One request in flight on a connection.
pub(crate) struct InFlight(ConnTag);

impl Drop for InFlight {
    fn drop(&mut self) {
        lock(&self.0.shared).request_ended(self.0.id, Instant::now());
    }
}

/// Why a connection was closed by the listener.
#[derive(Debug, Clone, Copy)]
enum Closed {
    Shed,
    NoRequest,
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
    ) -> Self {
        Self {
            io,
            peer,
            tag: ConnTag { id, shared, peer },
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
                Watch::Until(at) if at > now => self.watchdog.as_mut().reset(at),
                Watch::Until(_) => {
                    drop(registry);
                    return Err(self.close(Closed::NoRequest));
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

/// A response body that keeps its request counted as in flight until it is dropped
/// (fully sent, or abandoned with the connection).
pub(crate) struct Tracked<B> {
    body: B,
    _in_flight: Option<InFlight>,
}

impl<B> Tracked<B> {
    /// `body`, counted with `in_flight`.
    pub(crate) fn new(body: B, in_flight: Option<InFlight>) -> Self {
        Self { body, _in_flight: in_flight }
    }
}

impl<B: Body + Unpin> Body for Tracked<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
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
pub(crate) struct Deadline<B> {
    body: B,
    timeout: Duration,
    at: Instant,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl<B> Deadline<B> {
    /// `body`, due in full within `timeout` from now.
    pub(crate) fn new(body: B, timeout: Duration) -> Self {
        Self { body, timeout, at: Instant::now() + timeout, sleep: None }
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
