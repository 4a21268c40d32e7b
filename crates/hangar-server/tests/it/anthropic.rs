//! Anthropic's Messages API over the stub engine: the message and its stream, thinking
//! blocks, stop sequences, count_tokens against usage, the error envelope for the admission
//! states, and the keys it takes. Tool use needs a real engine (constrained decoding): it is
//! tested on the trained model (hangard › anthropic) and with the official SDK (e2e).

use hangar_runtime::LoadOptions;
use hangar_server::HangarService;
use http::Method;
use serde_json::{Value, json};

use crate::support::{Event, post, request, server, stream};

async fn service() -> HangarService {
    let s = server()
        .settings(json!({
            "max_loaded_models": { "llm": 4 },
            "limits": { "max_stop_sequences": 2 },
            "models": {
                "fixed": { "backend": "stub", "aliases": ["claude-like"],
                           "stub": { "reply": "one two three four" } },
                "thinker": { "backend": "stub", "stub": { "thinking": true, "reply": "deep thoughts" } },
                "cold": { "backend": "stub" }
            }
        }))
        .build();
    for model in ["fixed", "thinker"] {
        s.manager().load(model, LoadOptions::default()).await.unwrap();
    }
    s
}

fn body(model: &str, extra: Value) -> Value {
    let mut body = json!({
        "model": model,
        "max_tokens": 32,
        "messages": [{ "role": "user", "content": "count to four" }]
    });
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    body
}

/// Anthropic's envelope, with Hangar's code inside.
fn assert_envelope(got: &(u16, Value), status: u16, kind: &str, code: &str) {
    assert_eq!(got.0, status, "{}", got.1);
    assert_eq!(got.1["type"], "error", "{}", got.1);
    assert_eq!(got.1["error"]["type"], kind, "{}", got.1);
    assert_eq!(got.1["error"]["code"], code, "{}", got.1);
    assert!(got.1["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{}", got.1);
}

#[tokio::test(start_paused = true)]
async fn a_message_answers_in_the_messages_shape() {
    let s = service().await;
    let system = json!({ "system": [{ "type": "text", "text": "be brief" }], "metadata": { "user_id": "u1" } });
    let (status, answer) = post(&s, "/v1/messages", body("claude-like", system)).await;
    assert_eq!(status, 200, "{answer}");
    assert!(answer["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(answer["type"], "message");
    assert_eq!(answer["role"], "assistant");
    assert_eq!(answer["model"], "claude-like", "the model as the request named it");
    assert_eq!(answer["content"], json!([{ "type": "text", "text": "one two three four" }]));
    assert_eq!(answer["stop_reason"], "end_turn");
    assert_eq!(answer["stop_sequence"], Value::Null);
    // The stub counts words: "be brief" and "count to four".
    assert_eq!(answer["usage"]["input_tokens"], 5);
    assert_eq!(answer["usage"]["output_tokens"], 4);
    assert_eq!(answer["usage"]["cache_read_input_tokens"], 0);

    let cut = post(&s, "/v1/messages", body("fixed", json!({ "max_tokens": 2 }))).await.1;
    assert_eq!(
        (cut["stop_reason"].as_str(), cut["content"][0]["text"].as_str()),
        (Some("max_tokens"), Some("one two"))
    );

    let stops = json!({ "stop_sequences": ["nowhere", "three"] });
    let stopped = post(&s, "/v1/messages", body("fixed", stops)).await.1;
    assert_eq!(stopped["stop_reason"], "stop_sequence", "{stopped}");
    assert_eq!(stopped["stop_sequence"], "three");
    assert_eq!(stopped["content"][0]["text"], "one two");

    // Multi-turn, with earlier reasoning sent back (and left out).
    let turns = json!({ "messages": [
        { "role": "user", "content": "hi" },
        { "role": "assistant", "content": [
            { "type": "thinking", "thinking": "greet back", "signature": "hangar-fnv1a-0" },
            { "type": "text", "text": "hello" }
        ] },
        { "role": "user", "content": [{ "type": "text", "text": "and again" }] }
    ] });
    let (status, again) = post(&s, "/v1/messages", body("fixed", turns)).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["usage"]["input_tokens"], 4, "hi + hello + and again, no reasoning");
}

fn names(events: &[Event]) -> Vec<&str> {
    events.iter().map(|e| e.name.as_deref().unwrap_or("")).collect()
}

#[tokio::test(start_paused = true)]
async fn a_stream_sends_the_messages_events_in_order() {
    let s = service().await;
    let events = stream(&s, "/v1/messages", body("fixed", json!({ "stream": true }))).await;
    let deltas = events.iter().filter(|e| e.name.as_deref() == Some("content_block_delta")).count();
    let mut expected = vec!["message_start", "ping", "content_block_start"];
    expected.extend(std::iter::repeat_n("content_block_delta", deltas));
    expected.extend(["content_block_stop", "message_delta", "message_stop"]);
    assert_eq!(names(&events), expected);
    for event in &events {
        assert_eq!(event.json()["type"], event.name.as_deref().unwrap(), "event: repeats type");
    }
    let start = events[0].json();
    assert_eq!(start["message"]["content"], json!([]));
    assert_eq!(start["message"]["stop_reason"], Value::Null);
    assert_eq!(events[2].json()["content_block"], json!({ "type": "text", "text": "" }));
    let text: String = events
        .iter()
        .filter(|e| e.name.as_deref() == Some("content_block_delta"))
        .map(|e| e.json()["delta"]["text"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(text, "one two three four");
    let end = events[events.len() - 2].json();
    assert_eq!(end["delta"], json!({ "stop_reason": "end_turn", "stop_sequence": null }));
    assert_eq!(end["usage"]["output_tokens"], 4);
}

#[tokio::test(start_paused = true)]
async fn thinking_comes_back_as_signed_thinking_blocks() {
    let s = service().await;
    let on = json!({ "thinking": { "type": "enabled", "budget_tokens": 1024 } });
    let (status, answer) = post(&s, "/v1/messages", body("thinker", on.clone())).await;
    assert_eq!(status, 200, "{answer}");
    let content = answer["content"].as_array().unwrap();
    assert_eq!(content.len(), 2, "{answer}");
    assert_eq!(content[0]["type"], "thinking");
    assert_eq!(content[0]["thinking"], "The prompt has 3 words.");
    assert!(content[0]["signature"].as_str().unwrap().starts_with("hangar-fnv1a-"));
    assert_eq!(content[1], json!({ "type": "text", "text": "deep thoughts" }));

    // The same blocks, streamed: thinking deltas, its signature, then the text block.
    let mut streamed = on;
    streamed["stream"] = json!(true);
    let events = stream(&s, "/v1/messages", body("thinker", streamed)).await;
    let blocks: Vec<Value> = events
        .iter()
        .filter(|e| e.name.as_deref() == Some("content_block_start"))
        .map(|e| e.json())
        .collect();
    assert_eq!(blocks[0]["index"], 0);
    assert_eq!(blocks[0]["content_block"]["type"], "thinking");
    assert_eq!(blocks[1]["index"], 1);
    assert_eq!(blocks[1]["content_block"]["type"], "text");
    let kinds: Vec<String> = events
        .iter()
        .filter(|e| e.name.as_deref() == Some("content_block_delta"))
        .map(|e| e.json()["delta"]["type"].as_str().unwrap().to_owned())
        .collect();
    let signature = kinds.iter().position(|k| k == "signature_delta").expect("a signature");
    assert!(kinds[..signature].iter().all(|k| k == "thinking_delta"), "{kinds:?}");
    assert!(kinds[signature + 1..].iter().all(|k| k == "text_delta"), "{kinds:?}");

    // `display: omitted`: the block and its signature, without the reasoning.
    let omitted =
        json!({ "thinking": { "type": "enabled", "budget_tokens": 1024, "display": "omitted" } });
    let hidden = post(&s, "/v1/messages", body("thinker", omitted)).await.1;
    assert_eq!(hidden["content"][0]["thinking"], "", "{hidden}");
    assert_eq!(hidden["content"][0]["signature"], content[0]["signature"], "signed all the same");
    // Adaptive leaves it to the model (the stub's default: no reasoning).
    let adaptive =
        post(&s, "/v1/messages", body("thinker", json!({ "thinking": { "type": "adaptive" } })))
            .await
            .1;
    assert_eq!(adaptive["content"], json!([{ "type": "text", "text": "deep thoughts" }]));

    // Off: no reasoning, one text block. A model without the switch refuses it.
    let off = json!({ "thinking": { "type": "disabled" } });
    let plain = post(&s, "/v1/messages", body("thinker", off)).await.1;
    assert_eq!(plain["content"], json!([{ "type": "text", "text": "deep thoughts" }]));
    let refused = post(
        &s,
        "/v1/messages",
        body("fixed", json!({ "thinking": { "type": "enabled", "budget_tokens": 2000 } })),
    )
    .await;
    assert_envelope(&refused, 400, "invalid_request_error", "thinking_unsupported");
}

#[tokio::test(start_paused = true)]
async fn count_tokens_equals_the_usage_of_the_same_request() {
    let s = service().await;
    let conversation = json!({
        "system": "be brief",
        "messages": [
            { "role": "user", "content": "hi there" },
            { "role": "assistant", "content": "hello" },
            { "role": "user", "content": [{ "type": "text", "text": "count these words" }] }
        ]
    });
    let (status, counted) =
        post(&s, "/v1/messages/count_tokens", body("fixed", conversation.clone())).await;
    assert_eq!(status, 200, "{counted}");
    let usage = post(&s, "/v1/messages", body("fixed", conversation)).await.1["usage"].clone();
    let used = usage["input_tokens"].as_u64().unwrap()
        + usage["cache_read_input_tokens"].as_u64().unwrap();
    assert_eq!(counted["input_tokens"].as_u64(), Some(used));
    assert_eq!(used, 8, "the words of every turn and the system prompt");
    // `max_tokens` is not needed to count; an unknown model is refused in the envelope.
    let bare = json!({ "model": "fixed", "messages": [{ "role": "user", "content": "a b" }] });
    assert_eq!(post(&s, "/v1/messages/count_tokens", bare).await.1, json!({ "input_tokens": 2 }));
    let unknown = json!({ "model": "nope", "messages": [{ "role": "user", "content": "a" }] });
    assert_envelope(
        &post(&s, "/v1/messages/count_tokens", unknown).await,
        404,
        "not_found_error",
        "unknown_model",
    );
}

#[tokio::test(start_paused = true)]
async fn refusals_answer_in_anthropics_envelope() {
    let s = service().await;
    let m = "/v1/messages";
    assert_envelope(
        &post(&s, m, body("nope", json!({}))).await,
        404,
        "not_found_error",
        "unknown_model",
    );
    assert_envelope(
        &post(&s, m, body("cold", json!({}))).await,
        503,
        "overloaded_error",
        "model_not_loaded",
    );
    let mut no_max = body("fixed", json!({}));
    no_max.as_object_mut().unwrap().remove("max_tokens");
    assert_envelope(&post(&s, m, no_max).await, 400, "invalid_request_error", "invalid_request");
    let hot = body("fixed", json!({ "temperature": 1.5 }));
    assert_envelope(&post(&s, m, hot).await, 400, "invalid_request_error", "invalid_request");
    assert_envelope(
        &post(&s, m, "{not json").await,
        422,
        "invalid_request_error",
        "invalid_request_body",
    );
    let stops = body("fixed", json!({ "stop_sequences": ["a", "b", "c"] }));
    let over = post(&s, m, stops).await;
    assert_envelope(&over, 400, "invalid_request_error", "limit_exceeded");
    assert_eq!(
        over.1["error"]["message"].as_str().map(|t| t.contains("stop_sequences")),
        Some(true)
    );
    let image = json!({ "messages": [{ "role": "user", "content": [
        { "type": "image", "source": { "type": "base64", "media_type": "image/png", "data": "AAAA" } }
    ] }] });
    assert_envelope(
        &post(&s, m, body("fixed", image)).await,
        400,
        "invalid_request_error",
        "invalid_request",
    );
    // Tools need constrained decoding, which the stub has not: its refusal, in the envelope.
    let tools = json!({ "tools": [{ "name": "f", "input_schema": { "type": "object" } }], "tool_choice": { "type": "any" } });
    assert_envelope(
        &post(&s, m, body("fixed", tools)).await,
        400,
        "invalid_request_error",
        "unsupported",
    );
    // An object field sent as an array (serde would read a struct from one), a tool without
    // a schema object.
    let array = body("fixed", json!({ "output_config": [null, null] }));
    assert_envelope(
        &post(&s, m, array).await,
        422,
        "invalid_request_error",
        "invalid_request_body",
    );
    for tagged in
        [json!({ "tool_choice": { "type": 0 } }), json!({ "system": [{ "type": 0, "text": "" }] })]
    {
        let read = post(&s, m, body("fixed", tagged)).await;
        assert_envelope(&read, 422, "invalid_request_error", "invalid_request_body");
    }
    let no_schema = json!({ "tools": [{ "name": "f", "input_schema": null }] });
    assert_envelope(
        &post(&s, "/v1/messages/count_tokens", body("fixed", no_schema)).await,
        400,
        "invalid_request_error",
        "invalid_request",
    );
    let wrong = request(Method::GET, m).send(&s).await;
    assert_envelope(
        &(wrong.status, wrong.body),
        405,
        "invalid_request_error",
        "method_not_allowed",
    );
}

#[tokio::test(start_paused = true)]
async fn inference_keys_come_as_x_api_key_or_bearer() {
    let s = server()
        .settings(
            json!({ "models": { "fixed": { "backend": "stub", "stub": { "reply": "ok" } } } }),
        )
        .inference_keys(&["k-inference"])
        .admin_key("k-admin")
        .build();
    s.manager().load("fixed", LoadOptions::default()).await.unwrap();
    let ask = || {
        request(Method::POST, "/v1/messages")
            .header("anthropic-version", "2023-06-01")
            .body(body("fixed", json!({})))
    };
    assert_eq!(ask().header("x-api-key", "k-inference").send(&s).await.status, 200);
    assert_eq!(ask().bearer("k-inference").send(&s).await.status, 200);
    assert_eq!(ask().header("x-api-key", "k-admin").send(&s).await.status, 200);
    let none = ask().send(&s).await;
    assert_envelope(&(none.status, none.body), 401, "authentication_error", "unauthorized");
    let bad = ask().header("x-api-key", "k-wrong").send(&s).await;
    assert_envelope(&(bad.status, bad.body), 403, "permission_error", "forbidden");
    // The admin routes still take only the bearer key.
    let admin =
        request(Method::GET, "/v1/admin/models").header("x-api-key", "k-admin").send(&s).await;
    assert_eq!(admin.status, 401);
}

#[tokio::test(start_paused = true)]
async fn a_quarantined_model_and_a_full_queue_refuse_in_the_envelope() {
    let s = server()
        .settings(json!({
            "max_queue_depth": 1,
            "quarantine": { "failures": 2, "window_seconds": 60, "backoff_seconds": 30, "max_backoff_seconds": 60 },
            "models": {
                "broken": { "backend": "stub", "stub": { "fail_load": "corrupt weights" } },
                "slow": { "backend": "stub", "target_inflight": 1, "stub": { "token_latency_ms": 50 } }
            }
        }))
        .build();
    for _ in 0..2 {
        assert!(s.manager().load("broken", LoadOptions::default()).await.is_err());
    }
    let quarantined =
        request(Method::POST, "/v1/messages").body(body("broken", json!({}))).send(&s).await;
    assert_envelope(
        &(quarantined.status, quarantined.body),
        503,
        "overloaded_error",
        "model_quarantined",
    );
    assert!(quarantined.headers.contains_key(http::header::RETRY_AFTER), "Retry-After stays");

    s.manager().load("slow", LoadOptions::default()).await.unwrap();
    let running = request(Method::POST, "/v1/messages")
        .body(body("slow", json!({ "stream": true, "max_tokens": 200 })))
        .respond(&s)
        .await;
    assert_eq!(running.status(), 200);
    let queued = tokio::spawn({
        let s = s.clone();
        async move { post(&s, "/v1/messages", body("slow", json!({ "max_tokens": 1 }))).await }
    });
    while s.manager().model("slow").unwrap().queue_depth < 1 {
        tokio::task::yield_now().await;
    }
    let full = post(&s, "/v1/messages", body("slow", json!({}))).await;
    assert_envelope(&full, 429, "rate_limit_error", "queue_full");
    drop(running);
    assert_eq!(queued.await.unwrap().0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_of_megabytes_is_parsed_off_the_async_threads_with_the_same_answers() {
    let s = service().await;
    // 300,000 words: about 1.2 MB, parsed on a blocking thread.
    let words = "w ".repeat(300_000);
    let long = json!({ "messages": [{ "role": "user", "content": words }] });
    let (status, answer) = post(&s, "/v1/messages", body("fixed", long.clone())).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["usage"]["input_tokens"], 300_000, "every word reached the engine");
    assert_eq!(answer["type"], "message", "{answer}");
    let (status, counted) = post(&s, "/v1/messages/count_tokens", body("fixed", long)).await;
    assert_eq!((status, counted["input_tokens"].as_u64()), (200, Some(300_000)));
    // A refusal found while parsing is the same as for a small body.
    let bad = |text: &str| json!({ "messages": [{ "role": "user", "content": [{ "type": 7, "text": text }] }] });
    let small = post(&s, "/v1/messages", body("fixed", bad("a"))).await;
    let large = post(&s, "/v1/messages", body("fixed", bad(&words))).await;
    assert_envelope(&large, 422, "invalid_request_error", "invalid_request_body");
    assert_eq!(small.1["error"]["message"], large.1["error"]["message"]);
}
