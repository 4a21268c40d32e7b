//! Pause and continue, weight-update refusals and SGLang's root paths in-process, on the
//! stub engine (deterministic words at a fixed pace). The real engine's weight updates and
//! checksums are in `bins/hangard/tests/it/llama_http/`.

use std::time::Duration;

use hangar_server::HangarService;
use http::Method;
use serde_json::{Value, json};

use crate::support::{Sse, call, load, post, request, row, server};

/// Words of a stub answer arrive 20 ms apart.
const PACE_MS: u64 = 20;

fn service_of(models: Value) -> HangarService {
    server().settings(json!({ "max_loaded_models": { "llm": 4 } })).models(models).build()
}

fn service() -> HangarService {
    service_of(json!({
        "chat": { "backend": "stub", "target_inflight": 1, "stub": { "token_latency_ms": PACE_MS } },
        "other": { "backend": "stub" }
    }))
}

/// Polls the row until `done` holds (5 s at most).
async fn wait_row(s: &HangarService, model: &str, what: &str, done: impl Fn(&Value) -> bool) {
    for _ in 0..500 {
        if done(&row(s, model).await) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{model}: {what} did not happen: {}", row(s, model).await);
}

fn chat(max_tokens: u32, stream: bool) -> Value {
    json!({
        "model": "chat",
        "messages": [{ "role": "user", "content": "tell me about hangars" }],
        "max_tokens": max_tokens,
        "stream": stream,
        "stream_options": { "include_usage": true },
    })
}

/// A streamed chat completion, read chunk by chunk.
struct Stream {
    sse: Sse,
    text: String,
    usage: Option<Value>,
    finish: Option<String>,
    error: Option<Value>,
    chunks: usize,
}

impl Stream {
    async fn open(s: &HangarService, body: Value) -> Self {
        let response = request(Method::POST, "/v1/chat/completions").body(body).respond(s).await;
        Self {
            sse: Sse::of(response),
            text: String::new(),
            usage: None,
            finish: None,
            error: None,
            chunks: 0,
        }
    }

    /// Reads until `[DONE]` (or the end of the body).
    async fn finish(mut self) -> Self {
        while self.step().await {}
        self
    }

    /// Reads until at least `n` content chunks arrived.
    async fn read_chunks(&mut self, n: usize) {
        while self.chunks < n {
            assert!(self.step().await, "the stream ended after {} chunks", self.chunks);
        }
    }

    /// Handles one event; false at the end.
    async fn step(&mut self) -> bool {
        let Some(event) = self.sse.next().await else { return false };
        if event.data == "[DONE]" {
            return false;
        }
        let event = event.json();
        if event.get("error").is_some() {
            self.error = Some(event["error"].clone());
        } else if let Some(choice) = event["choices"].get(0) {
            if let Some(piece) = choice["delta"]["content"].as_str() {
                self.text.push_str(piece);
                self.chunks += 1;
            }
            if let Some(reason) = choice["finish_reason"].as_str() {
                self.finish = Some(reason.to_owned());
            }
        }
        if !event["usage"].is_null() {
            self.usage = Some(event["usage"].clone());
        }
        true
    }
}

#[tokio::test]
async fn a_retracted_generation_resumes_after_continue_and_its_client_sees_one_answer() {
    let s = service();
    load(&s, "chat").await;
    // The answer without any pause.
    let reference = Stream::open(&s, chat(12, true)).await.finish().await;
    assert_eq!(reference.finish.as_deref(), Some("length"));

    let mut stream = Stream::open(&s, chat(12, true)).await;
    stream.read_chunks(3).await;
    let (status, paused) =
        post(&s, "/v1/admin/models/chat/pause", json!({ "mode": "retract" })).await;
    assert_eq!(status, 200, "{paused}");
    assert_eq!(paused["pause"]["mode"], "retract");
    assert_eq!(paused["pause"]["cause"], "operator");
    // The generation left its slot and waits at the head of the queue.
    wait_row(&s, "chat", "the retract", |r| r["runtime_inflight"] == 0 && r["queue_depth"] == 1)
        .await;
    let before = stream.chunks;
    tokio::time::sleep(Duration::from_millis(PACE_MS * 5)).await;
    let (status, row) = post(&s, "/v1/admin/models/chat/continue", Value::Null).await;
    assert_eq!((status, &row["pause"]), (200, &Value::Null), "{row}");
    let stream = stream.finish().await;
    assert!(stream.error.is_none(), "{:?}", stream.error);
    assert!(before < 12, "the pause came mid-answer ({before} chunks)");
    assert_eq!(stream.text, reference.text, "one uninterrupted answer");
    assert_eq!(stream.finish.as_deref(), Some("length"));
    assert_eq!(stream.usage, reference.usage, "usage counts the answer once");
}

#[tokio::test]
async fn an_abort_pause_ends_running_and_queued_requests_and_later_ones_wait_for_continue() {
    let s = service();
    load(&s, "chat").await;
    let mut running = Stream::open(&s, chat(40, true)).await;
    running.read_chunks(1).await;
    // target_inflight 1: this one queues behind the running one.
    let queued = tokio::spawn({
        let s = s.clone();
        async move { post(&s, "/v1/chat/completions", chat(4, false)).await }
    });
    wait_row(&s, "chat", "the queued request", |r| r["queue_depth"] == 1).await;
    let (status, paused) = post(&s, "/v1/admin/models/chat/pause", json!({})).await;
    assert_eq!((status, paused["pause"]["mode"].as_str()), (200, Some("abort")), "{paused}");

    let running = running.finish().await;
    assert_eq!(
        running.error.as_ref().map(|e| e["code"].clone()),
        Some(json!("generation_aborted"))
    );
    let (status, body) = queued.await.unwrap();
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (503, Some("generation_aborted")),
        "{body}"
    );

    // A paused model admits nothing: a new request waits in the queue.
    let later = tokio::spawn({
        let s = s.clone();
        async move { post(&s, "/v1/chat/completions", chat(3, false)).await }
    });
    wait_row(&s, "chat", "the waiting request", |r| r["queue_depth"] == 1).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!later.is_finished(), "nothing runs while paused");
    assert_eq!(row(&s, "chat").await["runtime_inflight"], 0);
    post(&s, "/v1/admin/models/chat/continue", Value::Null).await;
    let (status, body) = later.await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["usage"]["completion_tokens"], 3);
}

#[tokio::test]
async fn an_in_place_pause_lets_running_requests_finish() {
    let s = service();
    load(&s, "chat").await;
    let mut running = Stream::open(&s, chat(6, true)).await;
    running.read_chunks(1).await;
    let (status, _) = post(&s, "/v1/admin/models/chat/pause", json!({ "mode": "in_place" })).await;
    assert_eq!(status, 200);
    let running = running.finish().await;
    assert_eq!((running.error, running.finish.as_deref()), (None, Some("length")));
    assert_eq!(row(&s, "chat").await["pause"]["mode"], "in_place");
}

#[tokio::test]
async fn pause_refusals_are_typed_and_change_nothing() {
    let s = service();
    let (status, body) = post(&s, "/v1/admin/models/chat/pause", json!({})).await;
    assert_eq!((status, body["error"]["code"].as_str()), (409, Some("state_conflict")));
    assert_eq!(body["error"]["runtime_state"], "unloaded");
    let (status, body) = post(&s, "/v1/admin/models/nope/pause", json!({})).await;
    assert_eq!((status, body["error"]["code"].as_str()), (404, Some("unknown_model")));
    load(&s, "chat").await;
    let (status, body) =
        post(&s, "/v1/admin/models/chat/pause", json!({ "mode": "sideways" })).await;
    assert_eq!((status, body["error"]["code"].as_str()), (422, Some("invalid_request_body")));
    assert_eq!(row(&s, "chat").await["pause"], Value::Null, "a refused pause pauses nothing");
    // Continue on a model that is not paused answers it as it is.
    let (status, row) = post(&s, "/v1/admin/models/chat/continue", Value::Null).await;
    assert_eq!((status, &row["pause"]), (200, &Value::Null));
}

#[tokio::test]
async fn a_weight_update_is_refused_while_requests_run_unless_it_aborts_them() {
    let s = service();
    load(&s, "chat").await;
    let mut running = Stream::open(&s, chat(40, true)).await;
    running.read_chunks(1).await;
    let (status, body) =
        post(&s, "/v1/admin/models/chat/update-weights-from-disk", json!({})).await;
    assert_eq!((status, body["error"]["code"].as_str()), (409, Some("requests_active")), "{body}");
    assert_eq!(row(&s, "chat").await["pause"], Value::Null, "a refused update pauses nothing");

    let update = json!({ "abort_all_requests": true, "weight_version": "step-7" });
    let (status, row) = post(&s, "/v1/admin/models/chat/update-weights-from-disk", update).await;
    assert_eq!(status, 200, "{row}");
    assert_eq!((row["weight_version"].as_str(), &row["pause"]), (Some("step-7"), &Value::Null));
    let running = running.finish().await;
    assert_eq!(running.error.map(|e| e["code"].clone()), Some(json!("generation_aborted")));
    // The new runtime serves.
    let (status, body) = post(&s, "/v1/chat/completions", chat(2, false)).await;
    assert_eq!((status, body["usage"]["completion_tokens"].as_u64()), (200, Some(2)), "{body}");
}

#[tokio::test]
async fn a_retract_pause_lets_a_weight_update_through_and_keep_pause_keeps_it_paused() {
    let s = service();
    load(&s, "chat").await;
    let reference = Stream::open(&s, chat(10, true)).await.finish().await;
    let mut running = Stream::open(&s, chat(10, true)).await;
    running.read_chunks(2).await;
    post(&s, "/v1/admin/models/chat/pause", json!({ "mode": "retract" })).await;
    let update = json!({ "keep_pause": true, "weight_version": "v2" });
    let (status, row) = post(&s, "/v1/admin/models/chat/update-weights-from-disk", update).await;
    assert_eq!(status, 200, "{row}");
    assert_eq!(row["pause"]["cause"], "operator", "keep_pause: paused until continue");
    assert_eq!(row["weight_version"], "v2");
    post(&s, "/v1/admin/models/chat/continue", Value::Null).await;
    let running = running.finish().await;
    assert_eq!(running.text, reference.text, "the retracted answer went on over the new weights");
}

#[tokio::test]
async fn sglang_paths_take_the_specs_bodies_and_pick_the_loaded_model() {
    let s = service();
    // Two configured, none loaded: the model must be named.
    let (status, body) = call(&s, Method::GET, "/model_info", Value::Null).await;
    assert_eq!((status, body["success"].as_bool()), (400, Some(false)), "{body}");
    assert_eq!(body["error"]["code"], "invalid_request");
    load(&s, "chat").await;
    let (status, info) = call(&s, Method::GET, "/model_info", Value::Null).await;
    assert_eq!(status, 200, "{info}");
    assert_eq!(
        (info["model"].as_str(), info["is_generation"].as_bool()),
        (Some("chat"), Some(true))
    );
    assert_eq!(info["weight_version"], "default");

    let (status, body) = post(&s, "/pause_generation", json!({ "mode": "in_place" })).await;
    assert_eq!((status, body["success"].as_bool()), (200, Some(true)), "{body}");
    assert_eq!(row(&s, "chat").await["pause"]["mode"], "in_place");
    let (_, info) = post(&s, "/model_info", json!({ "model": "chat" })).await;
    assert_eq!(info["paused"], true);
    let (status, body) = post(&s, "/continue_generation", json!({})).await;
    assert_eq!((status, body["success"].as_bool()), (200, Some(true)));
    assert_eq!(row(&s, "chat").await["pause"], Value::Null);

    let body = json!({
        "model_path": null, "load_format": "auto", "abort_all_requests": false,
        "weight_version": "rl-step-1", "keep_pause": false, "flush_cache": true
    });
    let (status, answer) = post(&s, "/update_weights_from_disk", body).await;
    assert_eq!((status, answer["success"].as_bool()), (200, Some(true)), "{answer}");
    assert_eq!(answer["weight_version"], "rl-step-1");
    let (_, info) = call(&s, Method::GET, "/model_info", Value::Null).await;
    assert_eq!(info["weight_version"], "rl-step-1");

    // A second loaded model: naming one becomes necessary.
    load(&s, "other").await;
    let (status, body) = post(&s, "/pause_generation", json!({ "mode": "abort" })).await;
    assert_eq!((status, body["error"]["code"].as_str()), (400, Some("invalid_request")), "{body}");
    assert!(body["message"].as_str().unwrap().contains("chat, other"), "{body}");
    let (status, _) = post(&s, "/pause_generation", json!({ "model": "other" })).await;
    assert_eq!(status, 200);
    assert_eq!(row(&s, "chat").await["pause"], Value::Null, "only the named model paused");

    // No weights on disk for a stub model: a typed refusal; reset_tensors is never done.
    let (status, body) =
        post(&s, "/weights_checker", json!({ "model": "chat", "action": "checksum" })).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (422, Some("weights_unreadable")),
        "{body}"
    );
    let (status, body) =
        post(&s, "/weights_checker", json!({ "model": "chat", "action": "reset_tensors" })).await;
    assert_eq!((status, body["error"]["code"].as_str()), (501, Some("not_implemented")));
    for path in [
        "/update_weights_from_tensor",
        "/init_weights_update_group",
        "/destroy_weights_update_group",
        "/update_weights_from_distributed",
    ] {
        let (status, body) = post(&s, path, json!({})).await;
        assert_eq!((status, body["success"].as_bool()), (501, Some(false)), "{path}: {body}");
        assert_eq!(body["error"]["code"], "not_implemented");
    }
    // Unknown fields are refused, as everywhere.
    let (status, _) =
        post(&s, "/update_weights_from_disk", json!({ "model": "chat", "bogus": 1 })).await;
    assert_eq!(status, 422);
}

#[tokio::test]
async fn the_get_form_of_the_weights_checker_changes_nothing() {
    let gguf = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/models/tiny-llama.gguf");
    let s = service_of(json!({ "chat": { "backend": "stub", "model_path": gguf } }));
    let get = |query: &'static str| {
        let s = s.clone();
        async move {
            call(&s, Method::GET, &format!("/weights_checker?model=chat&{query}"), Value::Null)
                .await
        }
    };
    // The actions that write are POST only, whatever the model's state.
    for query in ["action=snapshot", "action=reset_tensors"] {
        let (status, body) = get(query).await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (405, Some("method_not_allowed")),
            "{query}: {body}"
        );
    }
    let (status, body) = get("action=compare").await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (422, Some("weights_unreadable")),
        "the refused snapshot stored nothing: {body}"
    );
    // Unloaded, nothing is paused: the GET checksum runs.
    let (status, unloaded) = get("action=checksum").await;
    assert_eq!(status, 200, "{unloaded}");
    // Loaded and serving, a checksum or compare would pause it: refused, nothing paused.
    load(&s, "chat").await;
    assert_eq!(
        post(&s, "/weights_checker", json!({ "model": "chat", "action": "snapshot" })).await.0,
        200
    );
    for query in ["action=checksum", "action=compare", ""] {
        let (status, body) = get(query).await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (405, Some("would_pause")),
            "{query}: {body}"
        );
        assert_eq!(row(&s, "chat").await["pause"], Value::Null, "{query}");
    }
    // Paused by an operator, the GET reads without pausing anything more.
    assert_eq!(post(&s, "/v1/admin/models/chat/pause", json!({ "mode": "in_place" })).await.0, 200);
    let (status, compared) = get("action=compare").await;
    assert_eq!(
        (status, compared["comparison"]["identical"].as_bool()),
        (200, Some(true)),
        "{compared}"
    );
    assert_eq!(compared["digest"]["checksum"], unloaded["digest"]["checksum"]);
    assert_eq!(row(&s, "chat").await["pause"]["mode"], "in_place", "still the operator's pause");
}
