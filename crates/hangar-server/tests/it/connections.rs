//! Connection limits of the listeners (`connections` in the config): `serve` and
//! `grpc::serve` on loopback ports, driven with raw sockets so that a test can be the slow
//! or half-open client the limits are for.
//!
//! The timeouts are set to a second so the tests run quickly; every wait for the server to
//! act is bounded by [`LIVENESS`], a limit that only a server that never acts reaches.

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::time::Duration;

use hangar_config::ConnectionLimits;
use hangar_server::HangarService;
use hangar_server::grpc::proto::grpc_inference_service_client::GrpcInferenceServiceClient;
use hangar_server::grpc::proto::{RepositoryModelLoadRequest, ServerLiveRequest};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::support::server;

/// How long a test waits for the server to do what it must; not a performance claim.
const LIVENESS: Duration = Duration::from_secs(10);

fn limits(max: u32, header_s: u64, body_s: u64, idle_s: u64) -> ConnectionLimits {
    ConnectionLimits {
        max_connections: NonZeroU32::new(max).unwrap(),
        header_read_timeout: Duration::from_secs(header_s),
        body_read_timeout: Duration::from_secs(body_s),
        idle_timeout: Duration::from_secs(idle_s),
        ..ConnectionLimits::default()
    }
}

async fn service(connections: ConnectionLimits) -> HangarService {
    server()
        .models(json!({
            "slow": {
                "backend": "stub",
                "stub": { "token_latency_ms": 400, "reply": "one two three four five six" }
            },
            "slow_load": { "backend": "stub", "stub": { "load_delay_ms": 2500 } }
        }))
        .options(move |o| o.connections = connections)
        .loaded(["slow"])
        .start()
        .await
}

/// `serve` on a loopback port under `connections`.
async fn http(connections: ConnectionLimits) -> SocketAddr {
    let service = service(connections).await;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(hangar_server::serve(listener, service, std::future::pending()));
    addr
}

/// `grpc::serve` on a loopback port under `connections`.
async fn grpc(connections: ConnectionLimits) -> SocketAddr {
    let service = service(connections).await;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(hangar_server::grpc::serve(listener, service, std::future::pending()));
    addr
}

/// A connection that has sent `bytes`.
async fn open(addr: SocketAddr, bytes: &[u8]) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(bytes).await.unwrap();
    stream
}

/// Everything the server sends until it closes the connection (a reset counts as closed);
/// fails when it is still open after [`LIVENESS`].
async fn until_closed(stream: &mut TcpStream, what: &str) -> String {
    let mut got = Vec::new();
    let read = async {
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    };
    if tokio::time::timeout(LIVENESS, read).await.is_err() {
        panic!("{what}: the server did not close the connection within {LIVENESS:?}");
    }
    String::from_utf8_lossy(&got).into_owned()
}

/// Reads one HTTP/1 answer with a `content-length` (head and body) from a kept-alive
/// connection.
async fn answer(stream: &mut TcpStream) -> (u16, String) {
    let read = async {
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let text = String::from_utf8_lossy(&got).into_owned();
            if let Some(end) = text.find("\r\n\r\n") {
                let length = text[..end]
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length:")
                            .map(|v| v.trim().parse::<usize>().unwrap())
                    })
                    .unwrap_or(0);
                if got.len() >= end + 4 + length {
                    return (status_of(&text), text[end + 4..end + 4 + length].to_owned());
                }
            }
            let n = stream.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed before a whole answer: {text}");
            got.extend_from_slice(&buf[..n]);
        }
    };
    tokio::time::timeout(LIVENESS, read).await.expect("an answer")
}

fn status_of(answer: &str) -> u16 {
    answer.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0)
}

fn body_of(answer: &str) -> Value {
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    serde_json::from_str(body).unwrap_or(Value::Null)
}

const HEALTHZ: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n";
const HEALTHZ_CLOSE: &[u8] =
    b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";

#[tokio::test]
async fn a_connection_that_sends_no_complete_request_head_is_closed_after_the_header_timeout() {
    let addr = http(limits(64, 1, 60, 60)).await;
    for (what, sent) in [
        ("nothing", &b""[..]),
        ("half a request line", b"GET /heal"),
        ("a request line without its end of head", b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n"),
        ("half the HTTP/2 preface", b"PRI * HTTP/2.0\r\n"),
        (
            "the HTTP/2 preface and no request",
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00",
        ),
    ] {
        let mut stream = open(addr, sent).await;
        until_closed(&mut stream, what).await;
    }
    // A client that sends its request in time is served.
    let mut stream = open(addr, HEALTHZ).await;
    assert_eq!(answer(&mut stream).await.0, 200);
}

#[tokio::test]
async fn a_kept_alive_connection_is_closed_after_the_idle_timeout_and_a_long_request_is_not() {
    let addr = http(limits(64, 1, 60, 1)).await;
    let mut stream = open(addr, HEALTHZ).await;
    assert_eq!(answer(&mut stream).await.0, 200);
    until_closed(&mut stream, "idle after an answer").await;

    // A generation that outlasts both timeouts (six tokens, 400 ms each) runs to its end.
    let body = r#"{"model":"slow","messages":[{"role":"user","content":"hi"}]}"#;
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut stream = open(addr, request.as_bytes()).await;
    let (status, body) = answer(&mut stream).await;
    assert_eq!(status, 200, "{body}");
    let reply: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(reply["choices"][0]["message"]["content"], "one two three four five six");
}

#[tokio::test]
async fn a_body_that_trickles_past_its_deadline_is_answered_408_and_the_connection_closes() {
    let addr = http(limits(64, 30, 1, 60)).await;
    let head = "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"model\":";
    let mut stream = open(addr, head.as_bytes()).await;
    let answer = until_closed(&mut stream, "a late body").await;
    assert_eq!(status_of(&answer), 408, "{answer}");
    assert!(answer.to_ascii_lowercase().contains("connection: close"), "{answer}");
    assert_eq!(body_of(&answer)["error"]["code"], "body_timeout", "{answer}");
}

#[tokio::test]
async fn a_route_that_takes_no_body_answers_without_reading_the_declared_one() {
    // Far above the body limit, and below it: neither is read, neither waits.
    let addr = http(limits(64, 30, 60, 60)).await;
    for length in [100_000_000u64, 1_000_000] {
        let head =
            format!("GET /healthz HTTP/1.1\r\nHost: localhost\r\nContent-Length: {length}\r\n\r\n");
        let mut stream = open(addr, head.as_bytes()).await;
        let (status, body) = answer(&mut stream).await;
        assert_eq!(status, 200, "Content-Length {length}: {body}");
        // The unread body cannot be skipped: the connection closes after the answer.
        until_closed(&mut stream, "after a body left unread").await;
    }
}

#[tokio::test]
async fn at_the_cap_the_connection_waiting_longest_makes_room() {
    let addr = http(limits(2, 30, 60, 60)).await;
    let mut a = open(addr, b"GET /heal").await;
    let mut b = open(addr, b"GET /heal").await;
    // A third connection: `a`, the oldest half-open one, is closed.
    let mut c = open(addr, HEALTHZ).await;
    until_closed(&mut a, "the oldest half-open connection").await;
    assert_eq!(answer(&mut c).await.0, 200);
    // Now `b` (half-open since before `c` answered) waited longest, not the idle `c`.
    let mut d = open(addr, HEALTHZ).await;
    until_closed(&mut b, "the next half-open connection").await;
    assert_eq!(answer(&mut d).await.0, 200);
    // `c` was kept: it still serves.
    c.write_all(HEALTHZ).await.unwrap();
    assert_eq!(answer(&mut c).await.0, 200);
}

#[tokio::test]
async fn at_the_cap_with_every_connection_busy_a_new_one_is_refused_until_one_ends() {
    let addr = http(limits(2, 30, 60, 60)).await;
    let events = b"GET /v1/admin/events HTTP/1.1\r\nHost: localhost\r\n\r\n";
    let mut streams = Vec::new();
    for _ in 0..2 {
        let mut stream = open(addr, events).await;
        let mut head = [0u8; 12];
        stream.read_exact(&mut head).await.unwrap();
        assert_eq!(&head, b"HTTP/1.1 200", "an event stream");
        streams.push(stream);
    }
    let mut refused = open(addr, HEALTHZ).await;
    let got = until_closed(&mut refused, "a connection beyond the cap").await;
    assert_eq!(got, "", "refused without an answer");

    // One stream ends: its place is free again.
    drop(streams.pop());
    let served = async {
        loop {
            let mut stream = open(addr, HEALTHZ_CLOSE).await;
            let mut got = Vec::new();
            let _ = stream.read_to_end(&mut got).await;
            if got.starts_with(b"HTTP/1.1 200") {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(LIVENESS, served).await.expect("served once a stream ended");
}

#[tokio::test]
async fn grpc_closes_a_connection_that_never_finishes_the_http2_preface() {
    let addr = grpc(limits(64, 1, 60, 60)).await;
    for (what, sent) in [("nothing", &b""[..]), ("half the preface", b"PRI * HTTP/2.0\r\n")] {
        let mut stream = open(addr, sent).await;
        until_closed(&mut stream, what).await;
    }
}

#[tokio::test]
async fn grpc_at_the_cap_sheds_a_half_open_connection_for_a_client() {
    let addr = grpc(limits(1, 30, 60, 60)).await;
    let mut half_open = open(addr, b"PRI * HTTP/2.0\r\n").await;
    let mut client = GrpcInferenceServiceClient::connect(format!("http://{addr}")).await.unwrap();
    let live = tokio::time::timeout(LIVENESS, client.server_live(ServerLiveRequest {}));
    assert!(live.await.expect("answered").unwrap().into_inner().live);
    until_closed(&mut half_open, "the half-open connection").await;
}

#[tokio::test]
async fn grpc_a_call_keeps_its_connection_busy_past_the_header_timeout() {
    let addr = grpc(limits(64, 1, 60, 60)).await;
    let mut client = GrpcInferenceServiceClient::connect(format!("http://{addr}")).await.unwrap();
    // A repository load that takes 2.5 s: the connection is busy, not waiting for a head.
    let load = RepositoryModelLoadRequest {
        repository_name: String::new(),
        model_name: "slow_load".into(),
        parameters: Default::default(),
    };
    let loaded = tokio::time::timeout(LIVENESS, client.repository_model_load(load)).await;
    loaded.expect("answered").expect("the load call is not cut off");
}

#[tokio::test]
async fn grpc_at_the_cap_a_connection_that_called_waits_from_its_last_call() {
    let addr = grpc(limits(2, 30, 60, 60)).await;
    let mut client = GrpcInferenceServiceClient::connect(format!("http://{addr}")).await.unwrap();
    let mut half_open = open(addr, b"PRI * HTTP/2.0\r\n").await;
    // The client's call ends after the half-open connection began to wait.
    let live = tokio::time::timeout(LIVENESS, client.server_live(ServerLiveRequest {}));
    assert!(live.await.expect("answered").unwrap().into_inner().live);
    let _third = open(addr, b"").await;
    until_closed(&mut half_open, "the half-open connection, not the client's").await;
}
