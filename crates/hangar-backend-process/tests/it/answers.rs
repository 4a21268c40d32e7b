//! An engine's answer is read whole only up to `limits.max_answer_bytes`: one announced as
//! larger is not read at all, one that grows past the bound without announcing its length
//! (chunked, never ending) is cut there; both are `RuntimeError::AnswerTooLarge`. A route an
//! engine may lack answers `Unsupported` when it does.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::Arc;

use bytes::Bytes;
use hangar_backend::{
    Backend, ForwardRequest, ForwardRoute, LoadRequest, Runtime, RuntimeError, ThinkingMode,
};
use hangar_backend_process::{ProcessBackend, RemoteBackend};
use serde_json::json;

use crate::support::{FAKE, named as model};

fn chat(max_answer_bytes: u64) -> ForwardRequest {
    let body = r#"{"model":"fake","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}"#;
    ForwardRequest {
        route: ForwardRoute::ChatCompletions,
        body: Bytes::from_static(body.as_bytes()),
        thinking: ThinkingMode::Default,
        max_answer_bytes,
    }
}

async fn whole(runtime: &Arc<dyn Runtime>, limit: u64) -> Result<usize, RuntimeError> {
    let mut answer = runtime.forward(chat(limit)).await?;
    let mut n = 0;
    while let Some(chunk) = answer.body.recv().await {
        n += chunk?.len();
    }
    Ok(n)
}

#[tokio::test(flavor = "multi_thread")]
async fn an_answer_announced_larger_than_the_bound_is_refused_unread() {
    let value = json!({
        "backend": "vllm_serve", "vllm_binary_path": FAKE, "vllm_model": "m",
        "vllm_env": { "FAKE_VLLM_TOKENS": "64", "FAKE_VLLM_TOKEN_DELAY_MS": "0" },
    });
    let backend = ProcessBackend::vllm_serve();
    let runtime = backend.load(LoadRequest::new(model(value), 0, 1)).await.expect("loaded");
    let size = whole(&runtime, 1 << 20).await.expect("within a MiB");
    assert!(size > 300, "{size}");
    // Under the answer's size: refused (the size varies by a digit with the request number in
    // the answer's id, hence the margins).
    let limit = size as u64 / 2;
    assert_eq!(whole(&runtime, limit).await, Err(RuntimeError::AnswerTooLarge { limit }));
    // Above it, and after a cut answer: served, the runtime still usable.
    let again = whole(&runtime, size as u64 + 16).await.expect("served");
    assert!(again.abs_diff(size) < 4, "{again} vs {size}");
    runtime.unload().await;
}

/// The routes an engine may lack: vLLM's `/tokenize` answers, and its missing
/// `/v1/messages/count_tokens` (404) is `Unsupported`, not a bad request.
#[tokio::test(flavor = "multi_thread")]
async fn a_missing_optional_route_is_unsupported() {
    let value = json!({ "backend": "vllm_serve", "vllm_binary_path": FAKE, "vllm_model": "m" });
    let backend = ProcessBackend::vllm_serve();
    let runtime = backend.load(LoadRequest::new(model(value), 0, 1)).await.expect("loaded");
    let ask = |route, body: &'static str| ForwardRequest {
        route,
        body: Bytes::from_static(body.as_bytes()),
        thinking: ThinkingMode::Default,
        max_answer_bytes: 1 << 20,
    };
    let messages = r#"{"model":"fake","messages":[{"role":"user","content":"two words"}]}"#;
    let mut tokens = runtime.forward(ask(ForwardRoute::Tokenize, messages)).await.expect("served");
    let body = tokens.body.recv().await.expect("a body").expect("whole");
    let counted: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(counted["count"], 2, "{counted}");
    let missing = runtime.forward(ask(ForwardRoute::MessagesCountTokens, messages)).await;
    match missing {
        Err(RuntimeError::Unsupported { message }) => {
            assert!(message.contains("/v1/messages/count_tokens") && message.contains("404"));
        }
        other => panic!("expected Unsupported, got {:?}", other.map(|a| a.status)),
    }
    runtime.unload().await;
}

/// A server whose `/models` answers 200 and whose chat answer never ends: chunks of 1 KiB,
/// chunked, with no length announced.
fn endless() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut stream = stream;
                let mut line = String::new();
                let _ = reader.read_line(&mut line);
                let models = line.starts_with("GET");
                let mut header = String::new();
                while reader.read_line(&mut header).is_ok_and(|n| n > 2) {
                    header.clear();
                }
                if models {
                    let body = r#"{"data":[]}"#;
                    let _ = write!(
                        stream,
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    return;
                }
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                );
                let chunk = format!("400\r\n{}\r\n", "x".repeat(1024));
                while stream.write_all(chunk.as_bytes()).is_ok() {}
            });
        }
    });
    port
}

#[tokio::test(flavor = "multi_thread")]
async fn an_endless_answer_is_cut_at_the_bound() {
    let port = endless();
    let value = json!({ "backend": "openai_remote", "openai_base_url": format!("http://127.0.0.1:{port}/v1") });
    let runtime = RemoteBackend.load(LoadRequest::new(model(value), 0, 1)).await.expect("loaded");
    let limit = 64 * 1024;
    assert_eq!(whole(&runtime, limit).await, Err(RuntimeError::AnswerTooLarge { limit }));
}
