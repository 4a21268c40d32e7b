//! [`Pool`]: keep-alive HTTP/1.1 connections to one upstream, each driven by the task that
//! uses it.
//!
//! hyper's pooled client runs every connection in a task of its own: a forwarded request
//! wakes that task to write, and the answer wakes the request's task back, often across
//! threads of the multi-threaded runtime — on a busy host most of what a proxy adds is these
//! wake-ups. Here the task that sends a request also drives its connection (hyper's
//! low-level `http1` connection, polled next to the exchange), so a request and its answer
//! cross no task, as in an event-loop proxy. A connection goes back to the pool once its
//! answer has been read to the end; an answer dropped before its end closes the connection,
//! which cancels the request upstream. `https://` upstreams go through rustls with the
//! system's roots (`SSL_CERT_FILE` / `SSL_CERT_DIR` replace them); a child that listens on a
//! Unix socket is dialled there ([`Pool::unix`]).

use std::collections::VecDeque;
use std::future::{Future, poll_fn};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, Connection, SendRequest};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;

/// How long an idle connection is reused: below the keep-alive timeouts of the engines
/// (`llama-server` and uvicorn close idle connections after 5 s), so a reused connection is
/// not closed by the server as the request goes out.
const IDLE_FOR: Duration = Duration::from_secs(2);
/// Idle connections kept at most (more concurrent requests open more, then close them).
const MAX_IDLE: usize = 64;

/// What a connection reads and writes: TCP (with TLS for `https://`) or a Unix socket.
/// Boxed: one indirection per read or write, next to a system call.
type Io = Box<dyn Transport>;
/// A connection's byte stream.
trait Transport: hyper::rt::Read + hyper::rt::Write + Unpin + Send {}
impl<T: hyper::rt::Read + hyper::rt::Write + Unpin + Send> Transport for T {}
/// How long a connection may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The state machine that does a connection's I/O.
type Driver = Pin<Box<Connection<Io, Full<Bytes>>>>;
/// A transport failure: why a connection could not be made or used.
pub(crate) type Failure = Box<dyn std::error::Error + Send + Sync>;

/// The connections of one upstream.
pub(crate) struct Pool {
    dial: Dial,
    /// `scheme://authority` of the upstream, what the connector dials.
    target: http::Uri,
    /// Idle connections, the most recently used last.
    idle: Mutex<VecDeque<(Conn, Instant)>>,
}

/// How a pool reaches its upstream.
enum Dial {
    /// Over TCP, through TLS for `https://`.
    Net(HttpsConnector<HttpConnector>),
    /// On a Unix socket, the target's authority only its `Host` header.
    Unix(PathBuf),
}

/// One connection: the handle requests are sent on and the state machine that does the I/O.
struct Conn {
    sender: SendRequest<Full<Bytes>>,
    /// `None` once it has resolved (the connection closed or failed). It is dropped then:
    /// that answers a request still queued on it and ends a body still waiting on it with
    /// an error, where a resolved but kept driver would leave them waiting for ever.
    driver: Option<Driver>,
}

impl Conn {
    fn new(sender: SendRequest<Full<Bytes>>, driver: Connection<Io, Full<Bytes>>) -> Self {
        Self { sender, driver: Some(Box::pin(driver)) }
    }

    /// Polls the driver unless it has resolved; `true` once it has (closed or failed).
    fn poll_driver(&mut self, cx: &mut Context<'_>) -> bool {
        if self.driver.as_mut().is_some_and(|d| d.as_mut().poll(cx).is_ready()) {
            self.driver = None;
        }
        self.driver.is_none()
    }

    /// Drives the connection until it can take a request; `false` if it closed instead.
    async fn ready(&mut self) -> bool {
        poll_fn(|cx| {
            if self.poll_driver(cx) {
                return Poll::Ready(false);
            }
            self.sender.poll_ready(cx).map(|r| r.is_ok())
        })
        .await
    }

    /// Runs `work` while driving the connection.
    async fn drive<T>(&mut self, work: impl Future<Output = T>) -> T {
        let mut work = std::pin::pin!(work);
        poll_fn(|cx| {
            if let Poll::Ready(out) = work.as_mut().poll(cx) {
                return Poll::Ready(out);
            }
            // The driver moves the bytes `work` waits for; once it has resolved, `work`
            // resolves too (with the connection's error when it was cut).
            self.poll_driver(cx);
            work.as_mut().poll(cx)
        })
        .await
    }
}

impl Pool {
    /// A pool of connections to `target` (`http://authority/` or `https://authority/`).
    pub(crate) fn new(target: http::Uri) -> Arc<Self> {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(CONNECT_TIMEOUT));
        let connector = HttpsConnectorBuilder::new()
            .with_tls_config(tls_config(target.scheme_str() == Some("https")))
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        Arc::new(Self { dial: Dial::Net(connector), target, idle: Mutex::new(VecDeque::new()) })
    }

    /// A pool of connections to the server on the Unix socket `socket` (plain HTTP; the
    /// `Host` of its requests is `target`'s authority).
    pub(crate) fn unix(target: http::Uri, socket: PathBuf) -> Arc<Self> {
        Arc::new(Self { dial: Dial::Unix(socket), target, idle: Mutex::new(VecDeque::new()) })
    }

    /// `scheme://authority/` of the upstream.
    pub(crate) fn target(&self) -> &http::Uri {
        &self.target
    }

    /// Sends `request` (origin-form URI, `Host` set) on an idle connection or a new one; the
    /// answer's head, its body to read with [`Answer::next_chunk`].
    ///
    /// # Errors
    /// Why no connection could be made, or why the one used failed before the answer's head.
    pub(crate) async fn send(
        self: &Arc<Self>,
        request: Request<Full<Bytes>>,
    ) -> Result<Answer, Failure> {
        let mut request = request;
        loop {
            let (mut conn, reused) = match self.checkout().await {
                Some(conn) => (conn, true),
                None => (self.connect().await?, false),
            };
            let sending = conn.sender.try_send_request(request);
            match conn.drive(sending).await {
                Ok(response) => {
                    let (head, body) = response.into_parts();
                    let keep = !event_stream(&head.headers);
                    return Ok(Answer {
                        head: Response::from_parts(head, ()),
                        body,
                        conn: Some(conn),
                        keep,
                        pool: Arc::downgrade(self),
                    });
                }
                Err(mut error) => match error.take_message() {
                    // A reused connection closed before the request went out: it was
                    // never sent, so it goes out again on another connection.
                    Some(unsent) if reused => request = unsent,
                    _ => return Err(error.into_error().into()),
                },
            }
        }
    }

    /// An idle connection that can take a request, if one is left.
    async fn checkout(&self) -> Option<Conn> {
        loop {
            let (mut conn, since) = self.lock().pop_back()?;
            if since.elapsed() < IDLE_FOR && conn.ready().await {
                return Some(conn);
            }
        }
    }

    /// A new connection.
    async fn connect(&self) -> Result<Conn, Failure> {
        let io: Io = match &self.dial {
            Dial::Net(connector) => {
                let mut connector = connector.clone();
                Box::new(tower_service::Service::call(&mut connector, self.target.clone()).await?)
            }
            Dial::Unix(socket) => {
                let open = tokio::time::timeout(CONNECT_TIMEOUT, UnixStream::connect(socket));
                let stream = open.await.map_err(|_| "the Unix socket did not accept in time")?;
                let stream = stream.map_err(|e| format!("{}: {e}", socket.display()))?;
                Box::new(TokioIo::new(stream))
            }
        };
        let (sender, driver) = http1::Builder::new().handshake(io).await?;
        let mut conn = Conn::new(sender, driver);
        if conn.ready().await {
            Ok(conn)
        } else {
            Err("the connection closed before the request could be sent".into())
        }
    }

    /// Keeps `conn` for the next request, the least recently used one dropped beyond
    /// [`MAX_IDLE`].
    fn put_back(&self, conn: Conn) {
        let mut idle = self.lock();
        idle.retain(|(_, since)| since.elapsed() < IDLE_FOR);
        if idle.len() >= MAX_IDLE {
            idle.pop_front();
        }
        idle.push_back((conn, Instant::now()));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<(Conn, Instant)>> {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// An answer whose head has arrived; its body is read through the connection it came on.
pub(crate) struct Answer {
    /// Status and headers.
    pub(crate) head: Response<()>,
    body: Incoming,
    /// `None` once the connection has gone back to the pool.
    conn: Option<Conn>,
    /// Whether the connection may carry another request after this answer.
    keep: bool,
    /// Where the connection goes back; gone when the upstream has been dropped.
    pool: Weak<Pool>,
}

impl Answer {
    /// The next data chunk of the body (other frames skipped); `None` at its end, when the
    /// connection goes back to the pool.
    pub(crate) async fn next_chunk(&mut self) -> Option<Result<Bytes, hyper::Error>> {
        let conn = self.conn.as_mut()?;
        let body = &mut self.body;
        let next = conn
            .drive(async {
                loop {
                    match body.frame().await? {
                        Ok(frame) => match frame.into_data() {
                            Ok(data) => return Some(Ok(data)),
                            Err(_) => continue,
                        },
                        Err(e) => return Some(Err(e)),
                    }
                }
            })
            .await;
        match &next {
            None => self.release(),
            Some(Err(_)) => self.conn = None,
            Some(Ok(_)) => {}
        }
        next
    }

    /// The body's end: the connection goes back to the pool when it can take another
    /// request.
    fn release(&mut self) {
        if let (Some(conn), Some(pool)) = (self.conn.take(), self.pool.upgrade())
            && self.keep
            && conn.driver.is_some()
            && !conn.sender.is_closed()
        {
            pool.put_back(conn);
        }
    }
}

/// Whether an answer is a server-sent event stream. Its connection is not used again:
/// `llama-server` closes it right after the stream although its headers offer keep-alive,
/// so a request sent on it in that moment would be lost with the connection (seen as
/// "connection closed before message completed"). A stream is long; a fresh connection
/// costs it nothing noticeable.
fn event_stream(headers: &http::HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.trim_start().starts_with("text/event-stream"))
}

/// The TLS settings of an upstream: for `https://`, the system's root certificates (or those
/// of `SSL_CERT_FILE` / `SSL_CERT_DIR`), read once, on the first `https://` upstream; `http://`
/// upstreams (every child) get settings without roots and never read the system's.
fn tls_config(https: bool) -> rustls::ClientConfig {
    static SYSTEM: OnceLock<rustls::ClientConfig> = OnceLock::new();
    static NONE: OnceLock<rustls::ClientConfig> = OnceLock::new();
    let config = |roots: rustls::RootCertStore| {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map(|b| b.with_root_certificates(roots).with_no_client_auth())
            .expect("ring supports the default TLS versions")
    };
    if !https {
        return NONE.get_or_init(|| config(rustls::RootCertStore::empty())).clone();
    }
    SYSTEM
        .get_or_init(|| {
            let mut roots = rustls::RootCertStore::empty();
            let found = rustls_native_certs::load_native_certs();
            for error in &found.errors {
                tracing::warn!("cannot read a root certificate: {error}");
            }
            let (added, ignored) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                tracing::warn!(ignored, "no root certificates found: https:// upstreams will fail");
            }
            config(roots)
        })
        .clone()
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;
    use tokio::sync::mpsc;

    use super::*;

    /// What the test server does after reading a request.
    #[derive(Clone, Copy)]
    enum Then {
        /// Answers `ok` and keeps the connection.
        Answer,
        /// Answers `ok` and closes the connection (without saying so in a header).
        AnswerAndClose,
        /// Sends the head and a first chunk, then waits for the client to go.
        Stall,
        /// Answers with a whole event stream, then closes the connection a moment later
        /// (as `llama-server` does), without reading another request.
        StreamThenClose,
    }

    /// A test upstream: counts connections, sends each request's head on `heads`, and
    /// reports on `gone` when a client closed a stalled connection.
    struct Upstream {
        target: http::Uri,
        accepted: Arc<AtomicUsize>,
        heads: mpsc::UnboundedReceiver<String>,
        gone: mpsc::UnboundedReceiver<()>,
    }

    async fn upstream(then: Then) -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target = format!("http://{}/", listener.local_addr().unwrap()).parse().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let (head_tx, heads) = mpsc::unbounded_channel();
        let (gone_tx, gone) = mpsc::unbounded_channel();
        let count = accepted.clone();
        tokio::spawn(async move {
            loop {
                let (mut socket, _) = listener.accept().await.unwrap();
                count.fetch_add(1, Ordering::SeqCst);
                let (head_tx, gone_tx) = (head_tx.clone(), gone_tx.clone());
                tokio::spawn(async move {
                    let mut buffer = Vec::new();
                    loop {
                        let mut chunk = [0u8; 4096];
                        let Ok(n @ 1..) = socket.read(&mut chunk).await else { return };
                        buffer.extend_from_slice(&chunk[..n]);
                        let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") else {
                            continue;
                        };
                        let head = String::from_utf8_lossy(&buffer[..end]).into_owned();
                        let length = head
                            .lines()
                            .find_map(|l| {
                                l.to_ascii_lowercase()
                                    .strip_prefix("content-length: ")
                                    .map(str::to_owned)
                            })
                            .map_or(0, |v| v.trim().parse::<usize>().unwrap());
                        while buffer.len() < end + 4 + length {
                            let Ok(n @ 1..) = socket.read(&mut chunk).await else { return };
                            buffer.extend_from_slice(&chunk[..n]);
                        }
                        buffer.drain(..end + 4 + length);
                        head_tx.send(head).unwrap();
                        match then {
                            Then::Answer | Then::AnswerAndClose => {
                                let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                                socket.write_all(ok).await.unwrap();
                                if matches!(then, Then::AnswerAndClose) {
                                    return;
                                }
                            }
                            Then::StreamThenClose => {
                                let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                                            transfer-encoding: chunked\r\n\r\n";
                                let body = "e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n";
                                socket.write_all(format!("{head}{body}").as_bytes()).await.unwrap();
                                tokio::time::sleep(Duration::from_millis(100)).await;
                                return;
                            }
                            Then::Stall => {
                                let head = "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n";
                                socket.write_all(head.as_bytes()).await.unwrap();
                                socket.write_all(b"5\r\nfirst\r\n").await.unwrap();
                                while socket.read(&mut chunk).await.is_ok_and(|n| n > 0) {}
                                gone_tx.send(()).unwrap();
                                return;
                            }
                        }
                    }
                });
            }
        });
        Upstream { target, accepted, heads, gone }
    }

    fn pool(target: &http::Uri) -> Arc<Pool> {
        Pool::new(target.clone())
    }

    fn post(target: &http::Uri, body: &'static str) -> Request<Full<Bytes>> {
        Request::post("/v1/chat/completions")
            .header(http::header::HOST, target.authority().unwrap().as_str())
            .body(Full::new(Bytes::from_static(body.as_bytes())))
            .unwrap()
    }

    async fn whole(answer: &mut Answer) -> String {
        let mut text = String::new();
        while let Some(chunk) = answer.next_chunk().await {
            text.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
        }
        text
    }

    #[tokio::test]
    async fn requests_in_a_row_share_one_connection_and_go_out_in_origin_form() {
        let mut up = upstream(Then::Answer).await;
        let pool = pool(&up.target);
        for body in ["{\"a\":1}", "{\"b\":2}", "{\"c\":3}"] {
            let mut answer = pool.send(post(&up.target, body)).await.unwrap();
            assert_eq!(answer.head.status(), 200);
            assert_eq!(whole(&mut answer).await, "ok");
            let head = up.heads.recv().await.unwrap();
            assert!(head.starts_with("POST /v1/chat/completions HTTP/1.1\r\n"), "{head}");
            let host = format!("host: {}", up.target.authority().unwrap());
            assert!(head.to_ascii_lowercase().contains(&host), "{head}");
        }
        assert_eq!(up.accepted.load(Ordering::SeqCst), 1, "one keep-alive connection");
    }

    #[tokio::test]
    async fn concurrent_requests_open_connections_and_keep_them_for_later() {
        let up = upstream(Then::Answer).await;
        let pool = pool(&up.target);
        let mut answers = Vec::new();
        for _ in 0..3 {
            answers.push(pool.send(post(&up.target, "{}")).await.unwrap());
        }
        assert_eq!(up.accepted.load(Ordering::SeqCst), 3, "an unread answer holds its connection");
        for answer in &mut answers {
            assert_eq!(whole(answer).await, "ok");
        }
        assert_eq!(pool.lock().len(), 3);
        for _ in 0..3 {
            let mut answer = pool.send(post(&up.target, "{}")).await.unwrap();
            assert_eq!(whole(&mut answer).await, "ok");
        }
        assert_eq!(up.accepted.load(Ordering::SeqCst), 3, "the idle ones were reused");
    }

    #[tokio::test]
    async fn a_connection_the_server_closed_while_idle_is_replaced() {
        let up = upstream(Then::AnswerAndClose).await;
        let pool = pool(&up.target);
        for round in 1..=3 {
            let mut answer = pool.send(post(&up.target, "{}")).await.unwrap();
            assert_eq!(whole(&mut answer).await, "ok");
            // Let the close reach the client's reactor before the next request.
            tokio::time::sleep(Duration::from_millis(50)).await;
            assert_eq!(up.accepted.load(Ordering::SeqCst), round);
        }
    }

    #[tokio::test]
    async fn a_request_racing_the_servers_close_is_answered_or_refused_never_left_hanging() {
        // The server closes each connection right after its answer; the next request goes
        // out at once, often on the pooled connection before its close is seen.
        let up = upstream(Then::AnswerAndClose).await;
        let pool = pool(&up.target);
        for round in 0..50 {
            let exchange = async {
                let mut answer = pool.send(post(&up.target, "{}")).await?;
                Ok::<_, Failure>(whole(&mut answer).await)
            };
            let done = tokio::time::timeout(Duration::from_secs(5), exchange).await;
            let answer = done.unwrap_or_else(|_| panic!("round {round}: the request hung"));
            assert_eq!(answer.unwrap(), "ok", "round {round}: a request never sent is sent again");
        }
    }

    #[tokio::test]
    async fn a_connection_that_carried_an_event_stream_is_not_used_again() {
        let up = upstream(Then::StreamThenClose).await;
        let pool = pool(&up.target);
        for round in 1..=3 {
            let mut answer = pool.send(post(&up.target, "{}")).await.unwrap();
            assert_eq!(whole(&mut answer).await, "data: [DONE]\n\n");
            assert!(pool.lock().is_empty(), "round {round}: the connection was kept");
        }
        assert_eq!(up.accepted.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn an_answer_dropped_before_its_end_closes_its_connection() {
        let mut up = upstream(Then::Stall).await;
        let pool = pool(&up.target);
        let mut answer = pool.send(post(&up.target, "{}")).await.unwrap();
        assert_eq!(answer.next_chunk().await.unwrap().unwrap(), "first");
        drop(answer);
        let closed = tokio::time::timeout(Duration::from_secs(5), up.gone.recv()).await;
        assert_eq!(closed.unwrap(), Some(()), "the upstream saw the client go");
        assert!(pool.lock().is_empty(), "a cut connection is not pooled");
    }

    #[tokio::test]
    async fn no_upstream_is_a_connect_error_and_a_dropped_pool_takes_no_connection_back() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let target: http::Uri =
            format!("http://{}/", listener.local_addr().unwrap()).parse().unwrap();
        drop(listener);
        let error = pool(&target).send(post(&target, "{}")).await.err().unwrap();
        assert!(error.to_string().contains("tcp connect error"), "{error}");

        let up = upstream(Then::Answer).await;
        let pool = pool(&up.target);
        let mut answer = pool.send(post(&up.target, "{}")).await.unwrap();
        let weak = Arc::downgrade(&pool);
        drop(pool);
        assert_eq!(whole(&mut answer).await, "ok");
        assert!(weak.upgrade().is_none());
    }
}
