//! The OpenAI-compatible routes, driven in-process through `HangarService::handle` over a
//! manager on the stub backend (deterministic replies, virtual time).

mod admission;
mod chat;
mod completions;
mod listing;
mod responses;
mod vectors;

use std::time::Duration;

use hangar_runtime::LoadOptions;
use hangar_server::{HangarService, Response};
use hangar_stub::EMBEDDING_DIM;
use http::{Method, StatusCode, header};
use http_body_util::BodyExt;
use serde_json::{Value, json};

use crate::support::{Event, chat_body, get, metrics, post, request, server, stream};

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

fn config() -> Value {
    json!({
        "max_loaded_models": { "llm": 8, "embedding": 2, "reranking": 2 },
        "models": {
            "chat": { "backend": "stub" },
            "fixed": { "backend": "stub", "stub": { "reply": "hello there friend" } },
            "thinker": { "backend": "stub", "stub": { "thinking": true, "reply": "deep thoughts" } },
            "slow": { "backend": "stub", "target_inflight": 1, "stub": { "token_latency_ms": 50 } },
            "crashy": { "backend": "stub", "stub": { "crash_after_requests": 1 } },
            "embed": { "backend": "stub", "type": "embedding" },
            "rerank": { "backend": "stub", "type": "reranking" },
            "cold": { "backend": "stub" },
            "cold-rerank": { "backend": "stub", "type": "reranking" },
            "broken": { "backend": "stub", "stub": { "fail_load": "simulated OOM" } }
        }
    })
}

/// A service over `config` with every model loaded except `cold` and `cold-rerank` (never
/// loaded) and `broken` (its load failed).
async fn service_with(config: Value) -> HangarService {
    let s = server().settings(config).build();
    // `broken` first: a failed load evicts every other model before its retry.
    assert!(s.manager().load("broken", LoadOptions::default()).await.is_err());
    for snapshot in s.manager().models() {
        if !["cold", "cold-rerank", "broken"].contains(&snapshot.name()) {
            s.manager().load(snapshot.name(), LoadOptions::default()).await.unwrap();
        }
    }
    s
}

async fn service() -> HangarService {
    service_with(config()).await
}

/// `method path` with a JSON `body`: the response, its body unread.
async fn call(svc: &HangarService, method: Method, path: &str, body: &str) -> Response {
    request(method, path)
        .header(header::CONTENT_TYPE.as_str(), "application/json")
        .body(body)
        .respond(svc)
        .await
}

/// The status and the body, which must be JSON.
async fn json_of(resp: Response) -> (u16, Value) {
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&bytes)));
    (status, value)
}

/// Asserts an error envelope with `status` and `code`.
fn assert_error(got: &(u16, Value), status: u16, code: &str) {
    assert_eq!(got.0, status, "{}", got.1);
    assert_eq!(got.1["error"]["code"], code, "{}", got.1);
    assert!(got.1["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{}", got.1);
}
