//! The real `hangard` at its edge: it refuses to listen beyond loopback without an admin
//! key unless told it is insecure, it refuses a rebinding `Host` and a cross-site `Origin`
//! over a real socket, and SIGTERM ends open event streams (a `/ui` tab) and exits within
//! `http.shutdown_timeout_s` even while a generation would run for longer.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use crate::support;
use crate::support::{Server, Sse, hangard, load, send, temp_dir};

fn stub_config() -> Value {
    json!({ "models": { "chat": { "backend": "stub" } } })
}

/// Runs `hangard serve` on `host` with `args` until it prints its listening line or exits;
/// returns whether it listened and its stderr so far.
fn start_on(host: &str, args: &[&str]) -> (bool, String) {
    let dir = temp_dir("edge");
    std::fs::write(dir.join("settings.json"), stub_config().to_string()).unwrap();
    let mut child = hangard()
        .args(["serve", "--config"])
        .arg(&dir)
        .args(["--host", host, "--port", "0"])
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 64];
    let read = stdout.read(&mut first).unwrap_or(0);
    let listened = String::from_utf8_lossy(&first[..read]).contains("listening on");
    let _ = child.kill();
    let _ = child.wait();
    let mut stderr = String::new();
    child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    let _ = std::fs::remove_dir_all(dir);
    (listened, stderr)
}

#[test]
fn listening_beyond_loopback_needs_an_admin_key_or_the_insecure_flag() {
    let (listened, stderr) = start_on("0.0.0.0", &[]);
    assert!(!listened, "refused: {stderr}");
    assert!(stderr.contains("without an admin key"), "{stderr}");
    assert!(stderr.contains("--insecure-no-admin-key"), "the message names the way out: {stderr}");
    let (listened, stderr) = start_on("0.0.0.0", &["--insecure-no-admin-key"]);
    assert!(listened, "{stderr}");
    assert!(stderr.contains("--insecure-no-admin-key: listening beyond loopback"), "{stderr}");
    let (listened, stderr) = start_on("0.0.0.0", &["--admin-api-key", "k"]);
    assert!(listened, "{stderr}");
    let (listened, stderr) = start_on("127.0.0.1", &[]);
    assert!(listened, "loopback needs no key: {stderr}");
}

/// Sends one raw HTTP/1.1 request and returns the status code of the answer.
fn raw_status(server: &Server, request: &str) -> u16 {
    let addr = server.base.trim_start_matches("http://");
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0)
}

#[tokio::test]
async fn a_browser_on_another_site_or_a_rebound_name_cannot_drive_it() {
    let server = Server::start(&stub_config(), &[]);
    assert_eq!(load(&server, "chat", json!({})).await.0, 200);
    let port = server.base.rsplit(':').next().unwrap().to_owned();
    let unload = |host: &str, extra: &str| {
        format!(
            "POST /v1/admin/models/chat/unload HTTP/1.1\r\nHost: {host}\r\nContent-Type: text/plain\r\n{extra}Content-Length: 0\r\nConnection: close\r\n\r\n"
        )
    };
    let local = format!("localhost:{port}");
    assert_eq!(raw_status(&server, &unload(&local, "Origin: https://evil.example\r\n")), 403);
    assert_eq!(raw_status(&server, &unload(&local, "Origin: null\r\n")), 403);
    assert_eq!(raw_status(&server, &unload(&format!("rebind.evil.example:{port}"), "")), 403);
    assert_eq!(support::row(&server, "chat").await["runtime_state"], "loaded");
    // What curl sends: served.
    assert_eq!(raw_status(&server, &unload(&format!("127.0.0.1:{port}"), "")), 200);
    assert_eq!(support::row(&server, "chat").await["runtime_state"], "unloaded");
}

#[tokio::test]
async fn sigterm_ends_event_streams_and_exits_within_the_shutdown_bound() {
    let settings = json!({
        "http": { "shutdown_timeout_s": 4 },
        "models": { "chat": { "backend": "stub", "stub": { "token_latency_ms": 200 } } }
    });
    let mut server = Server::start(&settings, &[]);
    assert_eq!(load(&server, "chat", json!({})).await.0, 200);
    // An open workbench tab: the event stream.
    let events = reqwest::Client::new().get(server.url("/v1/admin/events")).send().await.unwrap();
    assert_eq!(events.status(), 200);
    let mut events = Sse::from_response(events);
    // A generation that would run for 200 s.
    let chat = json!({
        "model": "chat", "stream": true, "max_tokens": 1000,
        "messages": [{ "role": "user", "content": "talk" }]
    });
    let mut stream = Sse::start(&server, "/v1/chat/completions", &chat).await;
    assert!(stream.next().await.is_some(), "the generation runs");

    let started = Instant::now();
    server.terminate();
    let last = tokio::time::timeout(Duration::from_secs(10), async {
        let mut last = None;
        while let Some(event) = events.next().await {
            last = Some(event.json());
        }
        last
    })
    .await
    .expect("the event stream ends");
    assert_eq!(last.as_ref().map(|e| e["type"].clone()), Some(json!("shutdown")), "{last:?}");
    let status = server.wait(Duration::from_secs(15));
    let took = started.elapsed();
    assert_eq!(status.code(), Some(0), "{}", server.logs());
    // Liveness, not speed: without the bound the drain waits for the 200 s generation.
    assert!(took < Duration::from_secs(12), "exited after {took:?}\n{}", server.logs());
    assert!(server.logs().contains("cut off"), "{}", server.logs());
}

#[tokio::test]
async fn inference_keys_from_flags_or_the_environment_guard_the_inference_routes() {
    let config = json!({
        "inference_api_keys": ["from-config"],
        "models": { "chat": { "backend": "stub" } }
    });
    let args = ["--inference-api-key", "one", "--inference-api-key", "two", "--host", "0.0.0.0"];
    let args = [&args[..], &["--insecure-no-admin-key"]].concat();
    let server = Server::start(&config, &args);
    let models = server.url("/v1/models");
    let (status, answer) = send(Method::GET, &models, None, None).await;
    assert_eq!(
        (status, answer["error"]["code"].as_str().unwrap_or_default()),
        (401, "unauthorized"),
        "{answer}"
    );
    let (status, answer) = send(Method::GET, &models, None, Some("from-config")).await;
    assert_eq!(
        (status, answer["error"]["code"].as_str().unwrap_or_default()),
        (403, "forbidden"),
        "the flags replace config: {answer}"
    );
    assert_eq!(send(Method::GET, &models, None, Some("two")).await.0, 200);
    // No admin key, explicitly: the admin routes stay open, and the server says so at start
    // (its stderr is read by another thread: wait for the line, boundedly).
    assert_eq!(send(Method::GET, &server.url("/v1/admin/models"), None, None).await.0, 200);
    let warned = || server.logs().contains("listening beyond loopback without an admin key");
    for _ in 0..100 {
        if warned() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(warned(), "{}", server.logs());

    let config = json!({ "models": { "chat": { "backend": "stub" } } });
    let server = Server::start_with(&config, &[], &[("HANGAR_INFERENCE_KEYS", "a,b")]);
    let models = server.url("/v1/models");
    assert_eq!(send(Method::GET, &models, None, Some("nope")).await.0, 403);
    assert_eq!(send(Method::GET, &models, None, Some("b")).await.0, 200);
    assert!(!server.logs().contains("beyond loopback"), "127.0.0.1 is loopback");
}
