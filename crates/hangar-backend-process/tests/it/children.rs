//! Engine children with least privilege, against the fake `vllm serve`: a key only Hangar
//! knows (a request straight to the child is refused, the same through Hangar served, the
//! key never on a command line), and a port squatter that answers `/health` before the
//! engine binds is found out, never taken for the engine.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use hangar_backend::{
    Backend, ForwardRequest, ForwardRoute, LoadError, LoadRequest, Runtime, ThinkingMode,
};
use hangar_backend_process::ProcessBackend;
use hangar_config::ModelConfig;
use serde_json::json;

use crate::support::model;

async fn load(model: Arc<ModelConfig>) -> Result<Arc<dyn Runtime>, LoadError> {
    let backend = ProcessBackend::vllm_serve().with_stop_grace(Duration::from_millis(500));
    backend.load(LoadRequest::new(model, 0, 1)).await
}

const CHAT: &str = r#"{"model":"fake","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}"#;

/// The status of `POST path` with `body` straight to `port`, with `auth` when given.
fn post(port: u16, path: &str, body: &str, auth: Option<&str>) -> u16 {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let auth = auth.map(|a| format!("Authorization: {a}\r\n")).unwrap_or_default();
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    answer.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0)
}

fn port_of(runtime: &Arc<dyn Runtime>) -> u16 {
    let url = runtime.details()["backend_url"].as_str().unwrap().to_owned();
    url.rsplit(':').next().unwrap().trim_end_matches("/v1").parse().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_child_serves_only_requests_that_carry_its_key_and_the_key_is_on_no_command_line() {
    // On a port (a host named), where a local client could reach it.
    let runtime = load(model(json!({ "vllm_host": "127.0.0.1" }))).await.expect("the fake loads");
    let port = port_of(&runtime);
    // Straight to the child: refused without the key and with a guessed one.
    assert_eq!(post(port, "/v1/chat/completions", CHAT, None), 401);
    assert_eq!(post(port, "/v1/chat/completions", CHAT, Some("Bearer guess")), 401);
    // Through Hangar's client, which holds the key: served.
    let request = ForwardRequest {
        route: ForwardRoute::ChatCompletions,
        body: Bytes::from_static(CHAT.as_bytes()),
        thinking: ThinkingMode::Default,
        max_answer_bytes: hangar_config::DEFAULT_MAX_ANSWER_BYTES,
    };
    let mut answer = runtime.forward(request).await.expect("forwarded");
    assert_eq!(answer.status, 200);
    let body = answer.body.recv().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&body).contains("chat.completion"));
    // The key is in the child's environment, never in its world-readable argv.
    let pid = runtime.details()["pid"].as_i64().unwrap();
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    let key = environ
        .split(|&b| b == 0)
        .find_map(|var| var.strip_prefix(b"VLLM_API_KEY"))
        .map(|v| String::from_utf8_lossy(&v[1..]).into_owned())
        .expect("VLLM_API_KEY in the child's environment");
    assert_eq!(key.len(), 64);
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    assert!(!String::from_utf8_lossy(&cmdline).contains(&key));
    assert!(!runtime.details()["command"].as_str().unwrap().contains(&key));
    runtime.unload().await;
}

/// A process that answers 200 to every request on `listener`, and the request lines it saw.
fn squat(listener: TcpListener) -> Arc<Mutex<Vec<String>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let log = Arc::clone(&log);
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    log.lock().unwrap().push(line.trim_end().to_owned());
                    // Skip the headers; the probes have no body.
                    while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                        line.clear();
                    }
                    let ok = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
                    if stream.write_all(ok.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    seen
}

#[tokio::test(flavor = "multi_thread")]
async fn a_squatter_on_the_childs_port_fails_the_load_and_is_sent_nothing_but_probes() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = squat(listener);
    // The engine takes a while to bind, as vLLM does while it loads; the squatter answers
    // `/health` in the meantime.
    let slow = json!({ "vllm_port": port, "vllm_env": { "FAKE_VLLM_STARTUP_DELAY_MS": "5000" } });
    let error = load(model(slow)).await.err().expect("the load fails");
    let LoadError::PortTaken { port: taken, message } = &error else { panic!("{error:?}") };
    assert_eq!(*taken, port);
    // This test process holds the squatter's socket, and is named.
    let me = format!("pid {}", std::process::id());
    assert!(message.contains(&me) && message.contains("not from the engine"), "{message}");
    let seen = seen.lock().unwrap().clone();
    assert!(!seen.is_empty());
    assert!(seen.iter().all(|line| line.starts_with("GET /health ")), "{seen:?}");
    assert!(!error.eviction_may_help());
}
