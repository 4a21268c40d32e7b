//! The OpenAI-compatible routes, driven in-process through `HangarService::handle` over a
//! manager on the stub backend (deterministic replies, virtual time).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hangar_backend::stub::{EMBEDDING_DIM, StubBackend};
use hangar_config::Config;
use hangar_runtime::{Backends, LoadOptions, Manager};
use hangar_server::{HangarService, Response, ServerOptions};
use http::{Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};

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
    let config = Config::from_value(&config).unwrap_or_else(|e| panic!("bad test config: {e}"));
    let manager = Manager::new(&config, Backends::new().with(Arc::new(StubBackend::new())));
    // `broken` first: a failed load evicts every other model before its retry.
    assert!(manager.load("broken", LoadOptions::default()).await.is_err());
    for snapshot in manager.models() {
        if !["cold", "cold-rerank", "broken"].contains(&snapshot.name()) {
            manager.load(snapshot.name(), LoadOptions::default()).await.unwrap();
        }
    }
    HangarService::new(manager, ServerOptions::default())
}

async fn service() -> HangarService {
    service_with(config()).await
}

fn request(method: Method, path: &str, body: &str) -> Request<Full<Bytes>> {
    Request::builder()
        .method(method)
        .uri(path)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap()
}

async fn call(svc: &HangarService, method: Method, path: &str, body: &str) -> Response {
    svc.handle(request(method, path, body)).await
}

async fn body_bytes(resp: Response) -> Bytes {
    resp.into_body().collect().await.unwrap().to_bytes()
}

async fn json_of(resp: Response) -> (StatusCode, Value) {
    let status = resp.status();
    let bytes = body_bytes(resp).await;
    let value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&bytes)));
    (status, value)
}

async fn post(svc: &HangarService, path: &str, body: Value) -> (StatusCode, Value) {
    json_of(call(svc, Method::POST, path, &body.to_string()).await).await
}

async fn get(svc: &HangarService, path: &str) -> (StatusCode, Value) {
    json_of(call(svc, Method::GET, path, "").await).await
}

/// Asserts an error envelope with `status` and `code`.
fn assert_error(got: &(StatusCode, Value), status: u16, code: &str) {
    assert_eq!(got.0.as_u16(), status, "{}", got.1);
    assert_eq!(got.1["error"]["code"], code, "{}", got.1);
    assert!(got.1["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{}", got.1);
}

/// One server-sent event: its `event:` name, if any, and its `data:`.
#[derive(Debug)]
struct Event {
    name: Option<String>,
    data: String,
}

impl Event {
    fn json(&self) -> Value {
        serde_json::from_str(&self.data)
            .unwrap_or_else(|e| panic!("event data is not JSON ({e}): {}", self.data))
    }
}

fn parse_events(text: &str) -> Vec<Event> {
    text.split("\n\n")
        .filter(|block| !block.trim().is_empty())
        .map(|block| {
            let mut event = Event { name: None, data: String::new() };
            for line in block.lines() {
                if let Some(name) = line.strip_prefix("event: ") {
                    event.name = Some(name.to_owned());
                } else if let Some(data) = line.strip_prefix("data: ") {
                    event.data.push_str(data);
                } else {
                    panic!("unexpected SSE line {line:?}");
                }
            }
            event
        })
        .collect()
}

/// Posts a streaming request and reads the whole event stream.
async fn stream(svc: &HangarService, path: &str, body: Value) -> Vec<Event> {
    let resp = call(svc, Method::POST, path, &body.to_string()).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()[header::CONTENT_TYPE], "text/event-stream");
    let bytes = body_bytes(resp).await;
    parse_events(std::str::from_utf8(&bytes).unwrap())
}

fn chat_body(model: &str, content: &str, extra: Value) -> Value {
    let mut body = json!({ "model": model, "messages": [{ "role": "user", "content": content }] });
    body.as_object_mut().unwrap().extend(extra.as_object().cloned().unwrap_or_default());
    body
}

async fn metrics(svc: &HangarService) -> String {
    let resp = call(svc, Method::GET, "/metrics", "").await;
    String::from_utf8(body_bytes(resp).await.to_vec()).unwrap()
}

// ---------------------------------------------------------------------------------------
// Chat completions
// ---------------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn chat_completion_returns_content_usage_and_finish_reason() {
    let svc = service().await;
    let (status, body) =
        post(&svc, "/v1/chat/completions", chat_body("fixed", "say hi please", json!({}))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], "fixed");
    assert!(body["created"].as_u64().unwrap() > 1_600_000_000);
    let choice = &body["choices"][0];
    assert_eq!(choice["index"], 0);
    assert_eq!(choice["message"]["role"], "assistant");
    assert_eq!(choice["message"]["content"], "hello there friend");
    assert_eq!(choice["finish_reason"], "stop");
    assert_eq!(
        body["usage"],
        json!({
            "prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6,
            "prompt_tokens_details": { "cached_tokens": 0 },
        })
    );

    let (_, body) = post(
        &svc,
        "/v1/chat/completions",
        chat_body("fixed", "say hi please", json!({ "max_tokens": 2 })),
    )
    .await;
    assert_eq!(body["choices"][0]["message"]["content"], "hello there");
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    assert_eq!(body["usage"]["completion_tokens"], 2);

    // max_completion_tokens wins over max_tokens.
    let (_, body) = post(
        &svc,
        "/v1/chat/completions",
        chat_body("fixed", "x", json!({ "max_tokens": 2, "max_completion_tokens": 1 })),
    )
    .await;
    assert_eq!(body["choices"][0]["message"]["content"], "hello");
}

#[tokio::test(start_paused = true)]
async fn chat_completion_accepts_parts_stop_and_unknown_openai_fields() {
    let svc = service().await;
    let body = json!({
        "model": "fixed",
        "messages": [
            { "role": "developer", "content": "be brief" },
            { "role": "user", "content": [{ "type": "text", "text": "hi" }, { "type": "text", "text": "there" }] },
            { "role": "assistant", "content": null },
            { "role": "user", "content": "again", "name": "bob" }
        ],
        "stop": "friend",
        "temperature": 0.2,
        "top_p": 0.9,
        "top_k": 40,
        "seed": 7,
        "n": 1,
        "user": "someone",
        "presence_penalty": 0.5,
        "frequency_penalty": 0.1,
        "logit_bias": {},
        "response_format": { "type": "text" },
        "tools": [],
        "parallel_tool_calls": false
    });
    let (status, body) = post(&svc, "/v1/chat/completions", body).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["choices"][0]["message"]["content"], "hello there");
    assert_eq!(body["choices"][0]["finish_reason"], "stop", "a stop sequence ends with stop");

    let stops = chat_body("fixed", "hi", json!({ "stop": ["nothing", "there"] }));
    let (_, body) = post(&svc, "/v1/chat/completions", stops).await;
    assert_eq!(body["choices"][0]["message"]["content"], "hello");
}

#[tokio::test(start_paused = true)]
async fn tools_and_response_formats_are_checked_before_the_engine_sees_them() {
    let svc = service().await;
    let weather = json!([{ "type": "function", "function": { "name": "get_weather" } }]);
    // Shapes serde cannot read are 422; what it reads but makes no sense is 400.
    let xml = chat_body("fixed", "hi", json!({ "response_format": { "type": "xml" } }));
    assert_error(&post(&svc, "/v1/chat/completions", xml).await, 422, "invalid_request_body");
    let unknown = chat_body(
        "fixed",
        "hi",
        json!({ "tools": weather, "tool_choice": {
        "type": "function", "function": { "name": "get_time" } } }),
    );
    assert_error(&post(&svc, "/v1/chat/completions", unknown).await, 400, "invalid_request");
    let both = chat_body(
        "fixed",
        "hi",
        json!({ "tools": weather, "response_format": { "type": "json_object" } }),
    );
    assert_error(&post(&svc, "/v1/chat/completions", both).await, 400, "invalid_request");
    // The stub has no decoder to constrain: an explicit refusal, not free text.
    let forced = chat_body("fixed", "hi", json!({ "tools": weather, "tool_choice": "required" }));
    assert_error(&post(&svc, "/v1/chat/completions", forced).await, 400, "unsupported");
    let json_mode =
        json!({ "model": "fixed", "input": "hi", "text": { "format": { "type": "json_object" } } });
    assert_error(&post(&svc, "/v1/responses", json_mode).await, 400, "unsupported");
    // `tool_choice: none` means no tools: the stub answers.
    let none = chat_body("fixed", "hi", json!({ "tools": weather, "tool_choice": "none" }));
    assert_eq!(post(&svc, "/v1/chat/completions", none).await.0, StatusCode::OK);
    // A history with tool calls and results is accepted.
    let history = json!({ "model": "fixed", "messages": [
        { "role": "user", "content": "weather?" },
        { "role": "assistant", "content": null, "tool_calls": [{ "id": "call_1", "type": "function",
            "function": { "name": "get_weather", "arguments": "{}" } }] },
        { "role": "tool", "tool_call_id": "call_1", "content": "sunny" }
    ] });
    assert_eq!(post(&svc, "/v1/chat/completions", history).await.0, StatusCode::OK);
}

#[tokio::test(start_paused = true)]
async fn chat_stream_sends_role_deltas_finish_usage_and_done() {
    let svc = service().await;
    let extra = json!({ "max_tokens": 6, "seed": 1 });
    let (_, plain) =
        post(&svc, "/v1/chat/completions", chat_body("chat", "tell me a story", extra.clone()))
            .await;
    let expected = plain["choices"][0]["message"]["content"].as_str().unwrap().to_owned();
    assert_eq!(expected.split_whitespace().count(), 6);

    let mut body = chat_body("chat", "tell me a story", extra);
    body["stream"] = json!(true);
    body["stream_options"] = json!({ "include_usage": true });
    let events = stream(&svc, "/v1/chat/completions", body).await;
    assert_eq!(events.last().unwrap().data, "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(Event::json).collect();
    let id = chunks[0]["id"].as_str().unwrap();
    assert!(id.starts_with("chatcmpl-"));
    for chunk in &chunks {
        assert_eq!(chunk["object"], "chat.completion.chunk");
        assert_eq!((chunk["id"].as_str(), &chunk["model"]), (Some(id), &json!("chat")));
    }
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let (finish, usage) = (&chunks[chunks.len() - 2], &chunks[chunks.len() - 1]);
    let text: String = chunks[1..chunks.len() - 2]
        .iter()
        .map(|c| {
            assert_eq!(c["choices"][0]["finish_reason"], Value::Null);
            assert_eq!(c["usage"], Value::Null);
            c["choices"][0]["delta"]["content"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(text, expected, "the stream carries the same text as the plain answer");
    assert_eq!(finish["choices"][0]["finish_reason"], "length");
    assert_eq!(finish["choices"][0]["delta"], json!({}));
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"], plain["usage"]);
}

#[tokio::test(start_paused = true)]
async fn chat_stream_without_usage_ends_with_finish_then_done() {
    let svc = service().await;
    let events =
        stream(&svc, "/v1/chat/completions", chat_body("fixed", "hi", json!({ "stream": true })))
            .await;
    let data: Vec<&str> = events.iter().map(|e| e.data.as_str()).collect();
    assert_eq!(data.len(), 1 + 3 + 1 + 1, "role, three words, finish, [DONE]: {data:?}");
    let finish = events[events.len() - 2].json();
    assert_eq!(finish["choices"][0]["finish_reason"], "stop");
    assert!(finish.get("usage").is_none());
}

#[tokio::test(start_paused = true)]
async fn chat_validation_errors() {
    let svc = service().await;
    let chat = |body: Value| {
        let svc = svc.clone();
        async move { post(&svc, "/v1/chat/completions", body).await }
    };
    assert_error(
        &chat(json!({ "messages": [{ "role": "user", "content": "hi" }] })).await,
        400,
        "invalid_request",
    );
    assert_error(&chat(json!({ "model": "fixed", "messages": [] })).await, 400, "invalid_request");
    assert_error(&chat(json!({ "model": "fixed" })).await, 400, "invalid_request");
    assert_error(&chat(chat_body("fixed", "hi", json!({ "n": 2 }))).await, 400, "invalid_request");
    assert_error(
        &chat(chat_body("fixed", "hi", json!({ "temperature": 3.0 }))).await,
        400,
        "invalid_request",
    );
    assert_error(
        &chat(chat_body("fixed", "hi", json!({ "max_tokens": 0 }))).await,
        400,
        "invalid_request",
    );
    let image = json!({ "model": "fixed", "messages": [{ "role": "user", "content": [
        { "type": "image_url", "image_url": { "url": "https://example.com/a.png" } }
    ] }] });
    assert_error(&chat(image).await, 400, "invalid_request");
    assert_error(
        &chat(chat_body("fixed", "hi", json!({ "thinking": "enabled" }))).await,
        400,
        "thinking_unsupported",
    );
    let ok = chat(chat_body("thinker", "hi", json!({ "thinking": "disabled" }))).await;
    assert_eq!(ok.0, StatusCode::OK, "{}", ok.1);
    assert_error(
        &chat(json!({ "model": "fixed", "messages": [{ "role": "wizard", "content": "hi" }] }))
            .await,
        422,
        "invalid_request_body",
    );

    let malformed = json_of(
        call(
            &svc,
            Method::POST,
            "/v1/chat/completions",
            "{\"model\": \"fixed\",\n  \"messages\": [}",
        )
        .await,
    )
    .await;
    assert_error(&malformed, 422, "invalid_request_body");
    let message = malformed.1["error"]["message"].as_str().unwrap();
    assert!(message.contains("line 2"), "the parser position is kept: {message}");
}

// ---------------------------------------------------------------------------------------
// Admission through HTTP
// ---------------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn admission_errors_are_json_with_the_state_code_even_for_streams() {
    let svc = service().await;
    for stream in [false, true] {
        let extra = json!({ "stream": stream });
        let post_chat =
            |model: &str| post(&svc, "/v1/chat/completions", chat_body(model, "hi", extra.clone()));
        assert_error(&post_chat("nope").await, 404, "unknown_model");
        assert_error(&post_chat("cold").await, 503, "model_not_loaded");
        let failed = post_chat("broken").await;
        assert_error(&failed, 503, "model_failed");
        assert!(failed.1["error"]["message"].as_str().unwrap().contains("simulated OOM"));

        let completion = json!({ "model": "cold", "prompt": "hi", "stream": stream });
        assert_error(&post(&svc, "/v1/completions", completion).await, 503, "model_not_loaded");
        let response = json!({ "model": "broken", "input": "hi", "stream": stream });
        assert_error(&post(&svc, "/v1/responses", response).await, 503, "model_failed");
    }
    let embed = json!({ "model": "nope", "input": "x" });
    assert_error(&post(&svc, "/v1/embeddings", embed).await, 404, "unknown_model");
    let rerank = json!({ "model": "cold-rerank", "query": "q", "documents": ["d"] });
    assert_error(&post(&svc, "/v1/rerank", rerank).await, 503, "model_not_loaded");
}

#[tokio::test(start_paused = true)]
async fn an_embeddings_request_for_an_llm_with_auto_load_answers_400_and_loads_nothing() {
    let mut config = config();
    config["auto_load"] = json!(true);
    let svc = service_with(config).await;
    let state = |svc: &HangarService, name: &str| svc.manager().model(name).unwrap().runtime_state;
    let embed = json!({ "model": "cold", "input": "x" });
    let got = post(&svc, "/v1/embeddings", embed).await;
    assert_error(&got, 400, "model_type_mismatch");
    assert!(got.1["error"]["message"].as_str().unwrap().contains("type embedding"), "{}", got.1);
    let rerank = json!({ "model": "cold", "query": "q", "documents": ["d"] });
    assert_error(&post(&svc, "/v1/rerank", rerank).await, 400, "model_type_mismatch");
    let chat = chat_body("cold-rerank", "hi", json!({}));
    assert_error(&post(&svc, "/v1/chat/completions", chat).await, 400, "model_type_mismatch");
    assert_eq!(state(&svc, "cold").to_string(), "unloaded", "nothing was loaded");
    assert_eq!(state(&svc, "cold-rerank").to_string(), "unloaded");
    assert_eq!(svc.manager().counters().evictions, 0, "nothing was evicted");
    // The right type auto-loads.
    let rerank = json!({ "model": "cold-rerank", "query": "q", "documents": ["d"] });
    assert_eq!(post(&svc, "/v1/rerank", rerank).await.0, StatusCode::OK);
    assert_eq!(state(&svc, "cold-rerank").to_string(), "loaded");
}

#[tokio::test(start_paused = true)]
async fn a_full_queue_answers_429() {
    let mut config = config();
    config["max_queue_depth"] = json!(1);
    let svc = service_with(config).await;
    // One request runs on the only slot…
    let running = call(
        &svc,
        Method::POST,
        "/v1/chat/completions",
        &chat_body("slow", "a", json!({ "stream": true, "max_tokens": 100 })).to_string(),
    )
    .await;
    assert_eq!(running.status(), StatusCode::OK);
    // …one waits in the queue…
    let queued = tokio::spawn({
        let svc = svc.clone();
        async move {
            post(&svc, "/v1/chat/completions", chat_body("slow", "b", json!({ "max_tokens": 1 })))
                .await
        }
    });
    let mut waited = 0;
    while svc.manager().model("slow").unwrap().queue_depth < 1 {
        assert!(waited < 100, "the second request never queued");
        tokio::task::yield_now().await;
        waited += 1;
    }
    // …and the next one is refused.
    let refused = post(&svc, "/v1/chat/completions", chat_body("slow", "c", json!({}))).await;
    assert_error(&refused, 429, "queue_full");
    drop(running);
    let (status, body) =
        tokio::time::timeout(Duration::from_secs(5), queued).await.unwrap().unwrap();
    assert_eq!(status, StatusCode::OK, "{body}");
}

#[tokio::test(start_paused = true)]
async fn a_client_that_disconnects_mid_stream_frees_its_slot() {
    let svc = service().await;
    let body = chat_body("slow", "a long story", json!({ "stream": true, "max_tokens": 1000 }));
    let resp = call(&svc, Method::POST, "/v1/chat/completions", &body.to_string()).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.into_body();
    let role = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert!(std::str::from_utf8(&role).unwrap().contains("\"role\":\"assistant\""));
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert!(std::str::from_utf8(&first).unwrap().contains("\"content\""));
    assert_eq!(svc.manager().model("slow").unwrap().runtime_inflight, 1);
    drop(body);

    // The only slot is free again long before the abandoned generation (1000 tokens at
    // 50 ms) could have finished.
    let next =
        post(&svc, "/v1/chat/completions", chat_body("slow", "short", json!({ "max_tokens": 2 })));
    let (status, answer) = tokio::time::timeout(Duration::from_secs(5), next)
        .await
        .expect("the second request was not admitted: the disconnected stream kept its slot");
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["usage"]["completion_tokens"], 2);
    let snapshot = svc.manager().model("slow").unwrap();
    assert_eq!((snapshot.runtime_inflight, snapshot.queue_depth), (0, 0));
    let text = metrics(&svc).await;
    assert!(
        text.contains(r#"hangar_requests_total{endpoint="chat_completions",model="slow",outcome="cancelled"} 1"#),
        "{text}"
    );
}

#[tokio::test(start_paused = true)]
async fn an_error_after_the_stream_started_is_a_final_error_event() {
    let svc = service().await;
    let events =
        stream(&svc, "/v1/chat/completions", chat_body("crashy", "hi", json!({ "stream": true })))
            .await;
    let data: Vec<&str> = events.iter().map(|e| e.data.as_str()).collect();
    assert_eq!(data.len(), 4, "role chunk, the first word, error, [DONE]: {data:?}");
    assert_eq!(events[0].json()["choices"][0]["delta"]["role"], "assistant");
    assert!(events[1].json()["choices"][0]["delta"]["content"].is_string(), "{}", data[1]);
    let error = events[2].json();
    assert_eq!(error["error"]["code"], "backend_crashed", "{error}");
    assert_eq!(data[3], "[DONE]");
    assert_eq!(svc.manager().model("crashy").unwrap().runtime_state.as_str(), "failed");
    assert!(metrics(&svc).await.contains(
        r#"hangar_requests_total{endpoint="chat_completions",model="crashy",outcome="backend_crashed"} 1"#
    ));
}

#[tokio::test(start_paused = true)]
async fn a_stream_that_fails_before_its_first_token_is_a_plain_error() {
    let svc = service().await;
    // The stub refuses tools before generating anything: the stream never starts, and the
    // client gets the status and code a non-streamed request gets.
    let weather = json!([{ "type": "function", "function": { "name": "get_weather" } }]);
    for path in ["/v1/chat/completions", "/v1/responses"] {
        let body = if path == "/v1/responses" {
            json!({ "model": "fixed", "input": "hi", "stream": true,
                    "tools": [{ "type": "function", "name": "get_weather" }], "tool_choice": "required" })
        } else {
            chat_body(
                "fixed",
                "hi",
                json!({ "stream": true, "tools": weather, "tool_choice": "required" }),
            )
        };
        let response = call(&svc, Method::POST, path, &body.to_string()).await;
        assert_eq!(
            response.headers()[header::CONTENT_TYPE],
            "application/json",
            "{path}: a JSON error, not an event stream"
        );
        assert_error(&json_of(response).await, 400, "unsupported");
    }
    let metrics = metrics(&svc).await;
    assert!(metrics.contains(
        r#"hangar_requests_total{endpoint="chat_completions",model="fixed",outcome="unsupported"} 1"#
    ), "{metrics}");
    // The slot was released: the model still answers.
    let (status, _) = post(&svc, "/v1/chat/completions", chat_body("fixed", "hi", json!({}))).await;
    assert_eq!(status, StatusCode::OK);
}

// ---------------------------------------------------------------------------------------
// Completions
// ---------------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn completions_plain_and_streamed_agree() {
    let svc = service().await;
    let (status, plain) = post(
        &svc,
        "/v1/completions",
        json!({ "model": "chat", "prompt": "once upon", "max_tokens": 4 }),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{plain}");
    assert!(plain["id"].as_str().unwrap().starts_with("cmpl-"));
    assert_eq!(plain["object"], "text_completion");
    let text = plain["choices"][0]["text"].as_str().unwrap().to_owned();
    assert_eq!(text.split_whitespace().count(), 4);
    assert_eq!(plain["choices"][0]["finish_reason"], "length");
    assert_eq!(
        plain["usage"],
        json!({
            "prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6,
            "prompt_tokens_details": { "cached_tokens": 0 },
        })
    );

    let (_, listed) = post(
        &svc,
        "/v1/completions",
        json!({ "model": "chat", "prompt": ["once upon"], "max_tokens": 4 }),
    )
    .await;
    assert_eq!(listed["choices"][0]["text"], text.as_str());

    let (_, echoed) = post(
        &svc,
        "/v1/completions",
        json!({ "model": "chat", "prompt": "once upon", "max_tokens": 4, "echo": true }),
    )
    .await;
    assert_eq!(echoed["choices"][0]["text"], format!("once upon{text}"));

    let events = stream(
        &svc,
        "/v1/completions",
        json!({ "model": "chat", "prompt": "once upon", "max_tokens": 4, "stream": true,
                "stream_options": { "include_usage": true } }),
    )
    .await;
    assert_eq!(events.last().unwrap().data, "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(Event::json).collect();
    assert!(chunks.iter().all(|c| c["object"] == "text_completion"));
    let streamed: String = chunks[..chunks.len() - 1]
        .iter()
        .map(|c| c["choices"][0]["text"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(streamed, text);
    assert_eq!(chunks[chunks.len() - 2]["choices"][0]["finish_reason"], "length");
    assert_eq!(chunks[chunks.len() - 1]["usage"], plain["usage"]);
}

#[tokio::test(start_paused = true)]
async fn completions_refuse_batches_and_token_arrays() {
    let svc = service().await;
    for prompt in [json!(["a", "b"]), json!([1, 2, 3]), json!([[1, 2]]), json!(5)] {
        let got = post(&svc, "/v1/completions", json!({ "model": "chat", "prompt": prompt })).await;
        assert_error(&got, 400, "invalid_request");
    }
    assert_error(
        &post(&svc, "/v1/completions", json!({ "model": "chat" })).await,
        400,
        "invalid_request",
    );
}

// ---------------------------------------------------------------------------------------
// Responses API
// ---------------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn responses_answer_in_the_responses_shape() {
    let svc = service().await;
    let (status, body) =
        post(&svc, "/v1/responses", json!({ "model": "fixed", "input": "hi" })).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body["id"].as_str().unwrap().starts_with("resp_"));
    assert_eq!(body["object"], "response");
    assert_eq!(body["status"], "completed");
    assert_eq!(body["model"], "fixed");
    assert!(body["created_at"].as_u64().is_some());
    let message = &body["output"][0];
    assert_eq!(message["type"], "message");
    assert_eq!(message["role"], "assistant");
    assert_eq!(message["status"], "completed");
    assert!(message["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(
        message["content"],
        json!([{ "type": "output_text", "text": "hello there friend", "annotations": [] }])
    );
    assert_eq!(body["output_text"], "hello there friend");
    assert_eq!(body["usage"]["input_tokens"], 1);
    assert_eq!(body["usage"]["output_tokens"], 3);
    assert_eq!(body["usage"]["total_tokens"], 4);

    // Messages with parts, instructions, and the TranslateGemma fields.
    let (status, body) = post(
        &svc,
        "/v1/responses",
        json!({
            "model": "fixed",
            "instructions": "translate",
            "input": [
                { "role": "user", "content": [{ "type": "input_text", "text": "Guten Tag" }] },
                { "type": "message", "role": "assistant", "content": [{ "type": "output_text", "text": "Good day" }] },
                { "role": "user", "content": "und weiter" }
            ],
            "source_lang_code": "de",
            "target_lang_code": "en",
            "max_output_tokens": 2,
            "store": false,
            "metadata": { "k": "v" }
        }),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["output_text"], "hello there");
    assert_eq!(body["status"], "incomplete", "max_output_tokens cut it short");
    assert_eq!(body["incomplete_details"]["reason"], "max_output_tokens");
    assert_eq!(body["instructions"], "translate");

    // Mixed-source input may omit the source; a source without a target is refused.
    let mixed = json!({ "model": "fixed", "input": "Hallo, hello", "target_lang_code": "fr" });
    assert_eq!(post(&svc, "/v1/responses", mixed).await.0, StatusCode::OK);
    let no_target = json!({ "model": "fixed", "input": "Hallo", "source_lang_code": "de" });
    assert_error(&post(&svc, "/v1/responses", no_target).await, 400, "invalid_request");

    let bad_item = json!({ "model": "fixed", "input": [{ "type": "web_search_call", "id": "x" }] });
    assert_error(&post(&svc, "/v1/responses", bad_item).await, 400, "invalid_request");
    // An item without a field its type requires fails the schema: 422, naming the item.
    let no_output =
        json!({ "model": "fixed", "input": [{ "type": "function_call_output", "call_id": "c" }] });
    let got = post(&svc, "/v1/responses", no_output).await;
    assert_error(&got, 422, "invalid_request_body");
    let message = got.1["error"]["message"].as_str().unwrap();
    assert!(message.contains("input[0]") && message.contains("output"), "{message}");
    // A tool-use history is accepted (the stub ignores what it cannot show).
    let history = json!({ "model": "fixed", "input": [
        { "role": "user", "content": "weather?" },
        { "type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}" },
        { "type": "function_call_output", "call_id": "call_1", "output": "sunny" }
    ] });
    assert_eq!(post(&svc, "/v1/responses", history).await.0, StatusCode::OK);
    assert_error(
        &post(&svc, "/v1/responses", json!({ "model": "fixed" })).await,
        400,
        "invalid_request",
    );
    assert_error(
        &post(&svc, "/v1/responses", json!({ "input": "hi" })).await,
        400,
        "invalid_request",
    );
}

#[tokio::test(start_paused = true)]
async fn responses_thinking_must_be_a_capability_of_the_model() {
    let svc = service().await;
    for thinking in ["default", "enabled", "disabled"] {
        let (status, body) = post(
            &svc,
            "/v1/responses",
            json!({ "model": "thinker", "input": "hi", "thinking": thinking }),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{thinking}: {body}");
        assert_eq!(body["output_text"], "deep thoughts");
    }
    let (status, _) = post(
        &svc,
        "/v1/responses",
        json!({ "model": "fixed", "input": "hi", "thinking": "default" }),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    for thinking in ["enabled", "disabled"] {
        let got = post(
            &svc,
            "/v1/responses",
            json!({ "model": "fixed", "input": "hi", "thinking": thinking }),
        )
        .await;
        assert_error(&got, 400, "thinking_unsupported");
    }
    // Capability checks come before admission: the model need not be loaded to learn it.
    let got = post(
        &svc,
        "/v1/responses",
        json!({ "model": "cold", "input": "hi", "thinking": "enabled" }),
    )
    .await;
    assert_error(&got, 400, "thinking_unsupported");
    let got = post(
        &svc,
        "/v1/responses",
        json!({ "model": "fixed", "input": "hi", "thinking": "maybe" }),
    )
    .await;
    assert_error(&got, 422, "invalid_request_body");
}

#[tokio::test(start_paused = true)]
async fn responses_stream_with_the_sdk_event_names() {
    let svc = service().await;
    let events =
        stream(&svc, "/v1/responses", json!({ "model": "fixed", "input": "hi", "stream": true }))
            .await;
    let names: Vec<&str> = events.iter().map(|e| e.name.as_deref().unwrap()).collect();
    assert_eq!(
        names,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    let data: Vec<Value> = events.iter().map(Event::json).collect();
    for (i, (event, name)) in data.iter().zip(&names).enumerate() {
        assert_eq!(event["type"], *name);
        assert_eq!(event["sequence_number"], i);
    }
    assert_eq!(data[0]["response"]["status"], "in_progress");
    let deltas: String = data[4..7].iter().map(|d| d["delta"].as_str().unwrap()).collect();
    assert_eq!(deltas, "hello there friend");
    assert_eq!(data[7]["text"], "hello there friend");
    let done = &data[10]["response"];
    assert_eq!(done["status"], "completed");
    assert_eq!(done["output"][0]["content"][0]["text"], "hello there friend");
    assert_eq!(done["id"], data[0]["response"]["id"]);
}

// ---------------------------------------------------------------------------------------
// Embeddings and rerank
// ---------------------------------------------------------------------------------------

fn base64_decode(text: &str) -> Vec<u8> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut bits = 0u32;
    let mut nbits = 0;
    let mut out = Vec::new();
    for c in text.bytes().filter(|&c| c != b'=') {
        bits = (bits << 6) | ALPHABET.iter().position(|&a| a == c).unwrap() as u32;
        nbits += 6;
        if nbits >= 8 {
            nbits -= 8;
            out.push((bits >> nbits) as u8);
        }
    }
    out
}

#[tokio::test(start_paused = true)]
async fn embeddings_one_normalized_vector_per_input() {
    let svc = service().await;
    let inputs = ["the first text", "second", "the first text"];
    let (status, body) =
        post(&svc, "/v1/embeddings", json!({ "model": "embed", "input": inputs })).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["object"], "list");
    assert_eq!(body["model"], "embed");
    let data = body["data"].as_array().unwrap();
    assert_eq!(data.len(), 3);
    let vectors: Vec<Vec<f32>> = data
        .iter()
        .enumerate()
        .map(|(i, d)| {
            assert_eq!(
                (d["object"].as_str(), d["index"].as_u64()),
                (Some("embedding"), Some(i as u64))
            );
            d["embedding"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
        })
        .collect();
    for v in &vectors {
        assert_eq!(v.len(), EMBEDDING_DIM);
        let norm = v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4, "not normalized: {norm}");
    }
    assert_eq!(vectors[0], vectors[2], "equal inputs embed equally");
    assert_ne!(vectors[0], vectors[1]);
    assert_eq!(body["usage"], json!({ "prompt_tokens": 7, "total_tokens": 7 }));

    let (_, single) =
        post(&svc, "/v1/embeddings", json!({ "model": "embed", "input": "second" })).await;
    assert_eq!(single["data"].as_array().unwrap().len(), 1);
    assert_eq!(single["data"][0]["embedding"], data[1]["embedding"]);

    let (status, encoded) = post(
        &svc,
        "/v1/embeddings",
        json!({ "model": "embed", "input": "second", "encoding_format": "base64" }),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{encoded}");
    let bytes = base64_decode(encoded["data"][0]["embedding"].as_str().unwrap());
    let floats: Vec<f32> =
        bytes.chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    assert_eq!(floats, vectors[1]);

    for input in [json!([1, 2, 3]), json!([[1, 2]]), json!([])] {
        let got = post(&svc, "/v1/embeddings", json!({ "model": "embed", "input": input })).await;
        assert_error(&got, 400, "invalid_request");
    }
    let got = post(&svc, "/v1/embeddings", json!({ "model": "chat", "input": "x" })).await;
    assert_error(&got, 400, "model_type_mismatch");
}

#[tokio::test(start_paused = true)]
async fn rerank_sorts_by_score_with_original_indices() {
    let svc = service().await;
    let documents = ["banana bread", "a red apple pie", "apple juice", "red car", "green apple"];
    let (status, body) = post(
        &svc,
        "/v1/rerank",
        json!({ "model": "rerank", "query": "red apple", "documents": documents }),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["model"], "rerank");
    let results = body["results"].as_array().unwrap();
    assert_eq!(results.len(), documents.len());
    let scores: Vec<f64> = results.iter().map(|r| r["relevance_score"].as_f64().unwrap()).collect();
    assert!(scores.windows(2).all(|w| w[0] >= w[1]), "sorted descending: {scores:?}");
    let mut indices: Vec<u64> = results.iter().map(|r| r["index"].as_u64().unwrap()).collect();
    assert_eq!(indices[0], 1, "the document with both query words wins");
    assert_eq!(*indices.last().unwrap(), 0, "the document with no query word loses");
    assert!(results.iter().all(|r| r.get("document").is_none()));
    indices.sort();
    assert_eq!(indices, [0, 1, 2, 3, 4]);
    assert!(body["usage"]["total_tokens"].as_u64().unwrap() > 0);

    let (_, top) = post(
        &svc,
        "/v1/rerank",
        json!({ "model": "rerank", "query": "red apple", "documents": documents, "top_n": 2, "return_documents": true }),
    )
    .await;
    let top = top["results"].as_array().unwrap();
    assert_eq!(top.len(), 2);
    assert_eq!(
        top[0],
        json!({ "index": 1, "relevance_score": scores[0], "document": { "text": "a red apple pie" } })
    );
    assert_eq!(top[1]["index"], results[1]["index"]);

    let got =
        post(&svc, "/v1/rerank", json!({ "model": "rerank", "query": "q", "documents": [] })).await;
    assert_error(&got, 400, "invalid_request");
    let got = post(&svc, "/v1/rerank", json!({ "model": "rerank", "documents": ["d"] })).await;
    assert_error(&got, 400, "invalid_request");
}

// ---------------------------------------------------------------------------------------
// Models and metrics
// ---------------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn models_list_every_configured_model_with_its_state() {
    let svc = service().await;
    let (status, body) = get(&svc, "/v1/models").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["object"], "list");
    let data = body["data"].as_array().unwrap();
    let ids: Vec<&str> = data.iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(
        ids,
        [
            "chat",
            "fixed",
            "thinker",
            "slow",
            "crashy",
            "embed",
            "rerank",
            "cold",
            "cold-rerank",
            "broken"
        ]
    );
    for m in data {
        assert_eq!((m["object"].as_str(), m["owned_by"].as_str()), (Some("model"), Some("hangar")));
        assert!(m["created"].as_u64().is_some());
    }
    let row = |id: &str| data.iter().find(|m| m["id"] == id).unwrap().clone();
    assert_eq!(
        (row("chat")["runtime_state"].as_str(), row("chat")["type"].as_str()),
        (Some("loaded"), Some("llm"))
    );
    assert_eq!(row("cold")["runtime_state"], "unloaded");
    assert_eq!(row("broken")["runtime_state"], "failed");
    assert_eq!(row("embed")["type"], "embedding");
    assert_eq!(row("rerank")["type"], "reranking");

    let (status, one) = get(&svc, "/v1/models/embed").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(one, row("embed"));
    assert_error(&get(&svc, "/v1/models/nope").await, 404, "unknown_model");
}

#[tokio::test(start_paused = true)]
async fn every_inference_request_is_counted_by_endpoint_model_and_outcome() {
    let svc = service().await;
    post(&svc, "/v1/chat/completions", chat_body("fixed", "hi", json!({}))).await;
    stream(&svc, "/v1/chat/completions", chat_body("fixed", "hi", json!({ "stream": true }))).await;
    post(&svc, "/v1/chat/completions", chat_body("nope", "hi", json!({}))).await;
    post(&svc, "/v1/chat/completions", chat_body("cold", "hi", json!({}))).await;
    call(&svc, Method::POST, "/v1/chat/completions", "{").await;
    post(&svc, "/v1/embeddings", json!({ "model": "embed", "input": "x" })).await;
    post(&svc, "/v1/rerank", json!({ "model": "rerank", "query": "q", "documents": ["d"] })).await;
    post(&svc, "/v1/responses", json!({ "model": "fixed", "input": "x", "thinking": "enabled" }))
        .await;
    post(&svc, "/v1/completions", json!({ "model": "chat", "prompt": "x" })).await;
    let text = metrics(&svc).await;
    for line in [
        r#"hangar_requests_total{endpoint="chat_completions",model="fixed",outcome="ok"} 2"#,
        r#"hangar_requests_total{endpoint="chat_completions",model="_unknown",outcome="unknown_model"} 1"#,
        r#"hangar_requests_total{endpoint="chat_completions",model="cold",outcome="model_not_loaded"} 1"#,
        r#"hangar_requests_total{endpoint="chat_completions",model="_unknown",outcome="invalid_request_body"} 1"#,
        r#"hangar_requests_total{endpoint="embeddings",model="embed",outcome="ok"} 1"#,
        r#"hangar_requests_total{endpoint="rerank",model="rerank",outcome="ok"} 1"#,
        r#"hangar_requests_total{endpoint="responses",model="fixed",outcome="thinking_unsupported"} 1"#,
        r#"hangar_requests_total{endpoint="completions",model="chat",outcome="ok"} 1"#,
    ] {
        assert!(text.contains(line), "missing {line} in\n{text}");
    }
}
