//! What a client without a key, or one that takes no bytes, can hold on the listeners, over
//! real sockets: gRPC calls refused before their messages are read (the body-byte counter
//! says none was), keyless streams bounded per connection, a connection closed after its
//! refused calls, a zero-window HTTP/2 client shed while a request that waits in Hangar is
//! not, and the bound on request bodies held at once. Assertions are on outcomes (closed or
//! open, refused or answered, counters), never on durations.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use hangar_config::ConnectionLimits;
use hangar_server::HangarService;
use http::Request;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

use crate::support::{metrics, server};

/// How long a test waits for the server to do what it must; not a performance claim.
const LIVENESS: Duration = Duration::from_secs(15);
const ADMIN: &str = "admin-key";
const LOAD_RPC: &str = "/inference.GRPCInferenceService/RepositoryModelLoad";
const LIVE_RPC: &str = "/inference.GRPCInferenceService/ServerLive";

/// A service with an admin key and an inference key; `slow_load` takes 5 s to load on
/// demand, answers stall after 1 s, and a connection may run 2 keyless calls and have 3
/// refused.
fn service(edit: impl FnOnce(&mut hangar_server::ServerOptions) + 'static) -> HangarService {
    server()
        .settings(json!({ "auto_load": true }))
        .models(json!({
            "chat": { "backend": "stub" },
            "slow_load": { "backend": "stub", "stub": { "load_delay_ms": 5000 } }
        }))
        .admin_key(ADMIN)
        .inference_keys(&["inference-key"])
        .options(move |o| {
            o.http.stream_write_timeout = Duration::from_secs(1);
            o.connections = ConnectionLimits {
                max_keyless_streams: 2.try_into().unwrap(),
                max_refused_calls: 3.try_into().unwrap(),
                ..ConnectionLimits::default()
            };
            edit(o);
        })
        .build()
}

async fn listen_grpc(service: &HangarService) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(hangar_server::grpc::serve(listener, service.clone(), std::future::pending()));
    addr
}

async fn listen_http(service: &HangarService) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(hangar_server::serve(listener, service.clone(), std::future::pending()));
    addr
}

/// An HTTP/2 connection with `window` bytes of initial stream window; the receiver fires
/// when the server has closed it.
async fn h2(addr: SocketAddr, window: u32) -> (h2::client::SendRequest<Bytes>, Closed) {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (client, mut conn) =
        h2::client::Builder::new().initial_window_size(window).handshake(tcp).await.unwrap();
    let ping = conn.ping_pong().expect("a ping handle");
    let (tx, rx) = oneshot::channel();
    tokio::spawn(async move {
        let _ = conn.await;
        let _ = tx.send(());
    });
    (client, Closed { rx, ping })
}

/// Sends on a client once it is ready for another stream.
trait ReadySend {
    fn ready_send(
        &mut self,
        request: Request<()>,
        end: bool,
    ) -> impl Future<Output = (h2::client::ResponseFuture, h2::SendStream<Bytes>)>;
}

impl ReadySend for h2::client::SendRequest<Bytes> {
    async fn ready_send(
        &mut self,
        request: Request<()>,
        end: bool,
    ) -> (h2::client::ResponseFuture, h2::SendStream<Bytes>) {
        std::future::poll_fn(|cx| self.poll_ready(cx)).await.expect("ready");
        self.send_request(request, end).expect("sent")
    }
}

/// Whether an HTTP/2 connection is still open.
struct Closed {
    rx: oneshot::Receiver<()>,
    ping: h2::PingPong,
}

impl Closed {
    /// Waits until the server closed the connection; fails after [`LIVENESS`].
    async fn wait(self, what: &str) {
        let closed = tokio::time::timeout(LIVENESS, self.rx).await;
        assert!(closed.is_ok(), "{what}: still open after {LIVENESS:?}");
    }

    /// Whether the connection answers a ping now.
    async fn open(&mut self) -> bool {
        let pong = tokio::time::timeout(LIVENESS, self.ping.ping(h2::Ping::opaque())).await;
        matches!(pong, Ok(Ok(_)))
    }
}

/// A gRPC call's head, its message not sent.
fn grpc_head(addr: SocketAddr, rpc: &str, key: Option<&str>) -> Request<()> {
    let mut request = Request::post(format!("http://{addr}{rpc}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    if let Some(key) = key {
        request = request.header("authorization", format!("Bearer {key}"));
    }
    request.body(()).unwrap()
}

/// The `grpc-status` of an answer that ended in its head (a trailers-only answer).
fn grpc_status(response: &http::Response<h2::RecvStream>) -> Option<&str> {
    response.headers().get("grpc-status").and_then(|v| v.to_str().ok())
}

/// A framed gRPC message of `len` zero bytes (unknown to no field: decodes as an empty
/// message only when `len` is 0).
fn grpc_message(len: usize) -> Bytes {
    let mut frame = vec![0u8];
    frame.extend_from_slice(&u32::try_from(len).unwrap().to_be_bytes());
    frame.resize(5 + len, 0);
    Bytes::from(frame)
}

/// `hangar_request_body_bytes_total` of `listener`.
async fn body_bytes(service: &HangarService, listener: &str) -> u64 {
    let text = metrics(service).await;
    let line = format!("hangar_request_body_bytes_total{{listener=\"{listener}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&line))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {line} in\n{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_call_without_the_key_is_refused_before_its_message_is_sent() {
    let service = service(|_| {});
    let addr = listen_grpc(&service).await;
    let (mut client, _closed) = h2(addr, 65_535).await;
    for key in [None, Some("wrong")] {
        // The head alone: the message would follow, and never has to.
        let (answer, _message) = client.ready_send(grpc_head(addr, LOAD_RPC, key), false).await;
        let answer = tokio::time::timeout(LIVENESS, answer).await.expect("answered").unwrap();
        let expected = if key.is_none() { "16" } else { "7" };
        assert_eq!(grpc_status(&answer), Some(expected), "{key:?}: UNAUTHENTICATED / DENIED");
        let code = answer.headers().get("hangar-error-code").unwrap();
        assert_eq!(code, if key.is_none() { "unauthorized" } else { "forbidden" });
    }
    assert_eq!(body_bytes(&service, "grpc").await, 0, "no byte of a body was read");
    // The counter counts: a keyed call's message is read.
    let (answer, mut message) =
        client.ready_send(grpc_head(addr, LOAD_RPC, Some(ADMIN)), false).await;
    let load = b"\x12\x04chat"; // RepositoryModelLoadRequest { model_name: "chat" }
    let mut framed = grpc_message(0).to_vec();
    framed[1..5].copy_from_slice(&u32::try_from(load.len()).unwrap().to_be_bytes());
    framed.extend_from_slice(load);
    message.send_data(Bytes::from(framed), true).unwrap();
    let answer = tokio::time::timeout(LIVENESS, answer).await.expect("answered").unwrap();
    assert_eq!(answer.status(), 200);
    assert_eq!(body_bytes(&service, "grpc").await, 11, "5 bytes of frame, 6 of message");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_runs_its_bound_of_keyless_calls_and_closes_after_its_refused_ones() {
    let service = service(|_| {});
    let addr = listen_grpc(&service).await;
    let (mut client, mut closed) = h2(addr, 65_535).await;
    // Three keyless calls whose messages never finish: two hold their places (whichever
    // the server takes first), the other is refused at once.
    let mut answers = tokio::task::JoinSet::new();
    let mut messages = Vec::new();
    for i in 0..3 {
        let (answer, message) = client.ready_send(grpc_head(addr, LIVE_RPC, None), false).await;
        answers.spawn(async move { (i, answer.await.unwrap()) });
        messages.push(message);
    }
    let next = tokio::time::timeout(LIVENESS, answers.join_next());
    let (refused, answer) = next.await.expect("answered").unwrap().unwrap();
    assert_eq!(grpc_status(&answer), Some("8"), "RESOURCE_EXHAUSTED");
    assert_eq!(answer.headers().get("hangar-error-code").unwrap(), "too_many_keyless_calls");
    // One of the two held ends: it is served, and a place frees.
    let held = (0..3).find(|&i| i != refused).unwrap();
    messages[held].send_data(grpc_message(0), true).unwrap();
    let next = tokio::time::timeout(LIVENESS, answers.join_next());
    let (served, answer) = next.await.expect("answered").unwrap().unwrap();
    assert_eq!((served, answer.status().as_u16()), (held, 200));
    assert_eq!(grpc_status(&answer), None, "served: its status is in the trailers");
    let (fourth, mut message) = client.ready_send(grpc_head(addr, LIVE_RPC, None), false).await;
    message.send_data(grpc_message(0), true).unwrap();
    let fourth = tokio::time::timeout(LIVENESS, fourth).await.expect("answered").unwrap();
    assert_eq!(grpc_status(&fourth), None, "a keyless call passes again");
    assert!(closed.open().await);
    // One refusal so far (the keyless one): two more are answered, the next closes.
    for _ in 0..2 {
        let (answer, _m) = client.ready_send(grpc_head(addr, LOAD_RPC, None), false).await;
        let answer = tokio::time::timeout(LIVENESS, answer).await.expect("answered").unwrap();
        assert_eq!(grpc_status(&answer), Some("16"));
    }
    let (last, _m) = client.ready_send(grpc_head(addr, LOAD_RPC, None), false).await;
    let last = tokio::time::timeout(LIVENESS, last).await.expect("settled");
    assert!(last.is_err(), "the connection closed instead of answering: {last:?}");
    closed.wait("after 3 refused calls").await;
    assert!(
        metrics(&service)
            .await
            .contains("hangar_connections_closed_total{listener=\"grpc\",reason=\"refused\"} 1")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zero_window_client_is_shed_while_a_request_that_waits_in_hangar_is_not() {
    let service = service(|_| {});
    let addr = listen_http(&service).await;
    // An answer with bytes the peer never takes: shed after the 1 s stall timeout.
    let (mut client, closed) = h2(addr, 0).await;
    let healthz = Request::get(format!("http://{addr}/healthz")).body(()).unwrap();
    let (answer, _) = client.ready_send(healthz, true).await;
    let answer = tokio::time::timeout(LIVENESS, answer).await.expect("a head").unwrap();
    assert_eq!(answer.status(), 200, "heads are not flow-controlled");
    closed.wait("a zero-window client").await;

    // A chat for a model that loads for 5 s: nothing to send yet, so nothing stalls.
    let (mut client, mut closed) = h2(addr, 0).await;
    let body = json!({ "model": "slow_load", "messages": [{ "role": "user", "content": "hi" }] });
    let chat = Request::post(format!("http://{addr}/v1/chat/completions"))
        .header("authorization", "Bearer inference-key")
        .header("content-type", "application/json")
        .body(())
        .unwrap();
    let (answer, mut send) = client.ready_send(chat, false).await;
    send.send_data(Bytes::from(body.to_string()), true).unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(closed.open().await, "waiting for its model's load, twice the stall timeout");
    let answer = tokio::time::timeout(LIVENESS, answer).await.expect("a head").unwrap();
    assert_eq!(answer.status(), 200, "served once loaded");
    closed.wait("the answer's bytes are never taken").await;
    let text = metrics(&service).await;
    assert!(
        text.contains("hangar_connections_closed_total{listener=\"http\",reason=\"stalled\"} 2")
    );
}

/// Sends a request head declaring `length` body bytes, and `sent` of them.
async fn partial_chat(addr: SocketAddr, length: usize, sent: &[u8]) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer inference-key\r\ncontent-type: application/json\r\ncontent-length: {length}\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(sent).await.unwrap();
    stream
}

/// The status and JSON body of the one answer on `stream` (read until it closes or the
/// body is whole).
async fn answer_of(stream: &mut TcpStream) -> (u16, Value) {
    let read = async {
        let mut got = Vec::new();
        let mut buf = [0u8; 8192];
        loop {
            let text = String::from_utf8_lossy(&got).into_owned();
            if let Some((head, body)) = text.split_once("\r\n\r\n")
                && let Ok(value) = serde_json::from_str::<Value>(body)
            {
                let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
                return (status, value);
            }
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => panic!("closed before a whole answer: {text}"),
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    };
    tokio::time::timeout(LIVENESS, read).await.expect("an answer")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_bodies_held_at_once_are_bounded_and_the_refusal_says_so() {
    let service = service(|o| {
        o.max_request_body_bytes = 1 << 20;
        o.max_request_bodies_bytes = 3 << 19; // 1.5 MiB
    });
    let addr = listen_http(&service).await;
    let content = "x".repeat((1 << 20) - 200);
    let body = json!({ "model": "chat", "messages": [{ "role": "user", "content": content }] })
        .to_string()
        .into_bytes();
    // A body of about 1 MiB, all but its last byte sent: held while it arrives.
    let (head, last) = body.split_at(body.len() - 1);
    let mut first = partial_chat(addr, body.len(), head).await;
    let deadline = tokio::time::Instant::now() + LIVENESS;
    while body_bytes(&service, "http").await == 0 {
        assert!(tokio::time::Instant::now() < deadline, "the server read none of the body");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Another one would pass 1.5 MiB: refused before its body is sent.
    let mut second = partial_chat(addr, body.len(), b"").await;
    let (status, error) = answer_of(&mut second).await;
    assert_eq!(status, 503, "{error}");
    assert_eq!(error["error"]["code"], "request_bodies_full");
    let message = error["error"]["message"].as_str().unwrap();
    assert!(message.contains("max_request_bodies_bytes"), "{message}");
    // The first one ends: its share comes back, and the same body is served.
    first.write_all(last).await.unwrap();
    let (status, answer) = answer_of(&mut first).await;
    assert_eq!(status, 200, "{answer}");
    let mut third = partial_chat(addr, body.len(), &body).await;
    let (status, answer) = answer_of(&mut third).await;
    assert_eq!(status, 200, "{answer}");
}
