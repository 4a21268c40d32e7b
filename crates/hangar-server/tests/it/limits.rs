//! `limits` at the HTTP edge, in-process on the stub engine: every list cap passes at the cap
//! and answers 400 `limit_exceeded` one over it, before anything is admitted (an auto-load
//! model stays unloaded) or forwarded; OpenAI's own maxima pass the defaults; a request
//! past `limits.request_timeout_s` answers 504 or ends its stream with the error.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use bytes::Bytes;
use hangar_backend::{
    Backend, Capabilities, EmbedRequest, Embeddings, ForwardRequest, ForwardResponse,
    GenerateEvent, GenerateRequest, GenerateSummary, LoadError, LoadRequest, RerankRequest,
    Rerankings, Runtime, RuntimeError, ThinkingMode,
};
use hangar_config::{BackendKind, ModelConfig};
use hangar_server::HangarService;
use hangar_stub::StubBackend;
use http::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::support::{post, request, server};

/// An engine that serves the OpenAI API itself, as `openai_remote` does: it counts the
/// requests forwarded to it and answers each with `{"forwarded": true}`.
#[derive(Default)]
struct Forwarder(Arc<AtomicUsize>);

fn forwarder_capabilities() -> Capabilities {
    Capabilities {
        multi_turn: true,
        thinking_modes: vec![ThinkingMode::Default],
        ..Capabilities::default()
    }
}

#[async_trait]
impl Backend for Forwarder {
    fn kind(&self) -> BackendKind {
        BackendKind::OpenaiRemote
    }

    fn capabilities(&self, _: &ModelConfig) -> Capabilities {
        forwarder_capabilities()
    }

    async fn load(&self, _: LoadRequest) -> Result<Arc<dyn Runtime>, LoadError> {
        Ok(Arc::new(Forwarded(Arc::clone(&self.0), forwarder_capabilities())))
    }

    fn forwards(&self) -> bool {
        true
    }
}

struct Forwarded(Arc<AtomicUsize>, Capabilities);

#[async_trait]
impl Runtime for Forwarded {
    fn capabilities(&self) -> &Capabilities {
        &self.1
    }

    async fn generate(
        &self,
        _: GenerateRequest,
        _: mpsc::Sender<GenerateEvent>,
    ) -> Result<GenerateSummary, RuntimeError> {
        Err(RuntimeError::Unsupported { message: "forwards only".into() })
    }

    async fn embed(&self, _: EmbedRequest) -> Result<Embeddings, RuntimeError> {
        Err(RuntimeError::Unsupported { message: "forwards only".into() })
    }

    async fn rerank(&self, _: RerankRequest) -> Result<Rerankings, RuntimeError> {
        Err(RuntimeError::Unsupported { message: "forwards only".into() })
    }

    async fn health(&self) -> Result<(), RuntimeError> {
        Ok(())
    }

    async fn unload(&self) {}

    fn forwards(&self) -> bool {
        true
    }

    async fn forward(&self, _: ForwardRequest) -> Result<ForwardResponse, RuntimeError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        let (tx, body) = mpsc::channel(1);
        let _ = tx.try_send(Ok(Bytes::from_static(br#"{"forwarded": true}"#)));
        Ok(ForwardResponse { status: 200, content_type: Some("application/json".into()), body })
    }
}

struct Setup {
    service: HangarService,
    stub: Arc<StubBackend>,
    forwarded: Arc<AtomicUsize>,
}

/// A service with `limits`: `chat`, `embed`, `rerank` and `remote` (forwarding) loaded, the
/// `cold-*` models unloaded with auto-load on.
async fn setup(limits: Value) -> Setup {
    let stub = Arc::new(StubBackend::new());
    let forwarder = Forwarder::default();
    let forwarded = Arc::clone(&forwarder.0);
    let service = server()
        .settings(json!({
            "max_loaded_models": { "llm": 8, "embedding": 4, "reranking": 4 },
            "limits": limits,
        }))
        .models(json!({
            "chat": { "backend": "stub", "stub": { "reply": "fine thanks" } },
            "slow": { "backend": "stub", "target_inflight": 1, "stub": { "token_latency_ms": 100 } },
            "embed": { "backend": "stub", "type": "embedding" },
            "rerank": { "backend": "stub", "type": "reranking" },
            "remote": { "backend": "openai_remote", "openai_base_url": "http://127.0.0.1:9/v1" },
            "remote-embed": { "backend": "openai_remote", "openai_base_url": "http://127.0.0.1:9/v1", "type": "embedding" },
            "remote-rerank": { "backend": "openai_remote", "openai_base_url": "http://127.0.0.1:9/v1", "type": "reranking" },
            "cold-chat": { "backend": "stub", "auto_load": true },
            "cold-embed": { "backend": "stub", "type": "embedding", "auto_load": true },
            "cold-rerank": { "backend": "stub", "type": "reranking", "auto_load": true }
        }))
        .stub(stub.clone())
        .backend(Arc::new(forwarder))
        .loaded(["chat", "slow", "embed", "rerank", "remote", "remote-embed", "remote-rerank"])
        .start()
        .await;
    Setup { service, stub, forwarded }
}

/// `n` elements made by `f` from their index.
fn list(n: usize, f: impl Fn(usize) -> Value) -> Value {
    Value::from((0..n).map(f).collect::<Vec<_>>())
}

fn message(_: usize) -> Value {
    json!({ "role": "user", "content": "hi" })
}

/// One capped list of one route: the body with `n` elements for `model`.
struct Case {
    path: &'static str,
    field: &'static str,
    key: &'static str,
    cap: usize,
    /// The models of its type: loaded, unloaded with auto-load, forwarding (loaded).
    models: (&'static str, &'static str, &'static str),
    body: fn(&str, usize) -> Value,
}

const CASES: &[Case] = &[
    Case {
        path: "/v1/chat/completions",
        field: "messages",
        key: "max_messages",
        cap: 2,
        models: ("chat", "cold-chat", "remote"),
        body: |m, n| json!({ "model": m, "messages": list(n, message) }),
    },
    Case {
        path: "/v1/chat/completions",
        field: "tools",
        key: "max_tools",
        cap: 2,
        models: ("chat", "cold-chat", "remote"),
        body: |m, n| {
            let tool = |i| json!({ "type": "function", "function": { "name": format!("f{i}") } });
            json!({ "model": m, "messages": [message(0)], "tools": list(n, tool), "tool_choice": "none" })
        },
    },
    Case {
        path: "/v1/chat/completions",
        field: "stop",
        key: "max_stop_sequences",
        cap: 2,
        models: ("chat", "cold-chat", "remote"),
        body: |m, n| json!({ "model": m, "messages": [message(0)], "stop": list(n, |i| json!(format!("#{i}"))) }),
    },
    Case {
        path: "/v1/completions",
        field: "stop",
        key: "max_stop_sequences",
        cap: 2,
        models: ("chat", "cold-chat", "remote"),
        body: |m, n| json!({ "model": m, "prompt": "hi", "stop": list(n, |i| json!(format!("#{i}"))) }),
    },
    Case {
        path: "/v1/responses",
        field: "input",
        key: "max_messages",
        cap: 2,
        models: ("chat", "cold-chat", "remote"),
        body: |m, n| json!({ "model": m, "input": list(n, message) }),
    },
    Case {
        path: "/v1/responses",
        field: "tools",
        key: "max_tools",
        cap: 2,
        models: ("chat", "cold-chat", "remote"),
        body: |m, n| {
            let tool = |i| json!({ "type": "function", "name": format!("f{i}") });
            json!({ "model": m, "input": "hi", "tools": list(n, tool), "tool_choice": "none" })
        },
    },
    Case {
        path: "/v1/embeddings",
        field: "input",
        key: "max_embedding_inputs",
        cap: 3,
        models: ("embed", "cold-embed", "remote-embed"),
        body: |m, n| json!({ "model": m, "input": list(n, |i| json!(format!("text {i}"))) }),
    },
    Case {
        path: "/v1/rerank",
        field: "documents",
        key: "max_rerank_documents",
        cap: 3,
        models: ("rerank", "cold-rerank", "remote-rerank"),
        body: |m, n| json!({ "model": m, "query": "q", "documents": list(n, |i| json!(format!("doc {i}"))) }),
    },
];

fn small() -> Value {
    json!({
        "max_embedding_inputs": 3, "max_rerank_documents": 3, "max_stop_sequences": 2,
        "max_stop_sequence_bytes": 8, "max_messages": 2, "max_tools": 2
    })
}

fn assert_limit_exceeded(got: &(u16, Value), field: &str, size: &str, key: &str) {
    assert_eq!(got.0, StatusCode::BAD_REQUEST, "{}", got.1);
    let error = &got.1["error"];
    assert_eq!(
        (error["code"].as_str(), error["field"].as_str()),
        (Some("limit_exceeded"), Some(field))
    );
    let message = error["message"].as_str().unwrap();
    assert!(message.contains(size) && message.contains(&format!("(limits.{key})")), "{message}");
}

#[tokio::test(start_paused = true)]
async fn every_list_cap_passes_at_the_cap_and_refuses_one_over_before_admission() {
    let Setup { service: s, stub, .. } = setup(small()).await;
    let loads = stub.loads_started();
    for case in CASES {
        let (loaded, cold, _) = case.models;
        let at = post(&s, case.path, &(case.body)(loaded, case.cap)).await;
        assert_eq!(at.0, StatusCode::OK, "{} {} at the cap: {}", case.path, case.field, at.1);
        let over = post(&s, case.path, &(case.body)(cold, case.cap + 1)).await;
        let size = format!("has {} items; the limit is {}", case.cap + 1, case.cap);
        assert_limit_exceeded(&over, case.field, &size, case.key);
    }
    // Nothing was admitted: no auto-load started.
    assert_eq!(stub.loads_started(), loads);

    // A stop sequence of 8 bytes passes, one of 9 does not (counted in UTF-8 bytes).
    let chat = |model: &str, stop: Value| json!({ "model": model, "messages": [message(0)], "stop": stop });
    assert_eq!(post(&s, "/v1/chat/completions", &chat("chat", json!("€€xy"))).await.0, 200);
    let over = post(&s, "/v1/chat/completions", &chat("cold-chat", json!(["ok", "€€€"]))).await;
    assert_limit_exceeded(
        &over,
        "stop",
        "`stop[1]` is 9 bytes; the limit is 8",
        "max_stop_sequence_bytes",
    );
    assert_eq!(stub.loads_started(), loads);
}

#[tokio::test(start_paused = true)]
async fn forwarded_bodies_are_capped_before_they_are_forwarded() {
    let Setup { service: s, forwarded, .. } = setup(small()).await;
    for case in CASES {
        let remote = case.models.2;
        let at = post(&s, case.path, &(case.body)(remote, case.cap)).await;
        assert_eq!((at.0, &at.1), (200, &json!({ "forwarded": true })), "{}", case.path);
        let sent = forwarded.load(Ordering::SeqCst);
        let over = post(&s, case.path, &(case.body)(remote, case.cap + 1)).await;
        let size = format!("has {} items; the limit is {}", case.cap + 1, case.cap);
        assert_limit_exceeded(&over, case.field, &size, case.key);
        assert_eq!(
            forwarded.load(Ordering::SeqCst),
            sent,
            "{} {} was forwarded",
            case.path,
            case.field
        );
    }
}

#[tokio::test(start_paused = true)]
async fn what_openai_itself_accepts_passes_the_default_limits() {
    let Setup { service: s, .. } = setup(json!({})).await;
    let texts = list(2_048, |i| json!(format!("text {i}")));
    let (status, body) =
        post(&s, "/v1/embeddings", &json!({ "model": "embed", "input": texts })).await;
    assert_eq!((status, body["data"].as_array().map(Vec::len)), (200, Some(2_048)));
    let tools =
        list(128, |i| json!({ "type": "function", "function": { "name": format!("f{i}") } }));
    let stop = json!(["\n\n", "###", "User:", "</s>"]);
    let body = json!({
        "model": "chat", "messages": list(2_048, message), "tools": tools, "tool_choice": "none",
        "stop": stop
    });
    let (status, answer) = post(&s, "/v1/chat/completions", &body).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let docs = list(1_000, |i| json!(format!("doc {i}")));
    let body = json!({ "model": "rerank", "query": "q", "documents": docs });
    assert_eq!(post(&s, "/v1/rerank", &body).await.0, StatusCode::OK);
}

#[tokio::test(start_paused = true)]
async fn a_request_past_its_deadline_answers_504_and_a_started_stream_ends_with_the_error() {
    let Setup { service: s, .. } = setup(json!({ "request_timeout_s": 1 })).await;
    // 50 tokens of 100 ms: 5 s, past the 1 s deadline.
    let long = json!({ "model": "slow", "messages": [message(0)], "max_tokens": 50 });
    let (status, body) = post(&s, "/v1/chat/completions", &long).await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "{body}");
    assert_eq!(body["error"]["code"], "deadline_exceeded", "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("1 s"), "{body}");

    let mut streamed = long.clone();
    streamed["stream"] = json!(true);
    let answer = request(Method::POST, "/v1/chat/completions").body(streamed).send(&s).await;
    assert_eq!(answer.status, 200, "the stream started before the deadline");
    let text = answer.text();
    let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
    assert!(events.len() > 3, "some tokens came first: {text}");
    assert_eq!(events[events.len() - 1], "data: [DONE]");
    let last: Value =
        serde_json::from_str(events[events.len() - 2].trim_start_matches("data: ")).unwrap();
    assert_eq!(last["error"]["code"], "deadline_exceeded", "{last}");

    // The slot (the model serves one request at a time) is free again.
    let short = json!({ "model": "slow", "messages": [message(0)], "max_tokens": 3 });
    let (status, body) = post(&s, "/v1/chat/completions", &short).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}
