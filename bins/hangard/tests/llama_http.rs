//! The in-process llama.cpp engine (`backend: "llama_cpp"`) as clients see it: the real
//! `hangard serve` on the tiny random-weight GGUF fixtures of `fixtures/models/`, driven over
//! HTTP. The weights are random, so the text is gibberish; these tests check shapes and
//! invariants (token accounting, stream framing, determinism of greedy decoding, vector
//! norms, ordering), never the text itself.
//!
//! Greedy decoding is deterministic, but where a random-weight model emits its end of
//! generation depends on the prompt, the template and the sampler: tests that need a
//! generation that runs to `max_tokens`, or one that ends by itself, search a fixed list of
//! prompts for one ([`find_prompt`]) rather than hard-coding one that the next change to
//! prompt rendering or sampling would break.

mod support;

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};
use support::{Event, Server, Sse, get, load, post, row, send, unload, wait_for_row};

// ---------------------------------------------------------------------------------------
// Config

/// The absolute path of a committed GGUF fixture.
fn fixture(name: &str) -> String {
    let path = format!("{}/../../fixtures/models/{name}", env!("CARGO_MANIFEST_DIR"));
    let path = std::fs::canonicalize(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    path.to_str().unwrap().to_owned()
}

/// A `llama_cpp` model on `file` with `extra` fields.
fn gguf(file: &str, extra: Value) -> Value {
    let mut model = json!({ "backend": "llama_cpp", "model_path": fixture(file) });
    for (key, value) in extra.as_object().expect("an object") {
        model[key] = value.clone();
    }
    model
}

/// The tiny llama chat model, its embedded ChatML template rendering chat prompts.
fn chat_model(extra: Value) -> Value {
    let mut model = gguf("tiny-llama.gguf", json!({ "prompt_format": "auto" }));
    for (key, value) in extra.as_object().expect("an object") {
        model[key] = value.clone();
    }
    model
}

/// A config of `models` with room for all of them at once (no eviction in these tests).
fn config(models: Value) -> Value {
    json!({
        "max_loaded_models": { "llm": 8, "embedding": 2, "reranking": 2 },
        "models": models,
    })
}

/// Starts a server on `models` and loads each of `load` through the admin API.
async fn serve(models: Value, load_now: &[&str]) -> Server {
    let server = Server::start(&config(models), &[]);
    for model in load_now {
        let (status, row) = load(&server, model, json!({})).await;
        assert_eq!((status, row["runtime_state"].as_str()), (200, Some("loaded")), "{row}");
    }
    server
}

// ---------------------------------------------------------------------------------------
// HTTP helpers

fn code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or_else(|| panic!("no error code in {body}"))
}

fn chat_body(model: &str, prompt: &str, max_tokens: u32) -> Value {
    json!({
        "model": model,
        "messages": [{ "role": "user", "content": prompt }],
        "max_tokens": max_tokens,
        "temperature": 0,
    })
}

/// `body` with `stream: true` and the other `extra` fields.
fn streaming(mut body: Value, extra: Value) -> Value {
    body["stream"] = true.into();
    for (key, value) in extra.as_object().expect("an object") {
        body[key] = value.clone();
    }
    body
}

/// A non-streaming chat completion that must succeed; checks the envelope and the token
/// accounting, and returns the body.
async fn chat_ok(server: &Server, model: &str, prompt: &str, max_tokens: u32) -> Value {
    let (status, body) =
        post(server, "/v1/chat/completions", chat_body(model, prompt, max_tokens)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["object"], "chat.completion", "{body}");
    assert_eq!(body["model"], model, "{body}");
    let choice = &body["choices"][0];
    assert_eq!(body["choices"].as_array().map(Vec::len), Some(1), "{body}");
    assert_eq!(choice["message"]["role"], "assistant", "{body}");
    assert!(choice["message"]["content"].is_string(), "{body}");
    check_usage(&body["usage"], choice["finish_reason"].as_str(), max_tokens);
    body
}

/// `usage` without what the prompt cache served: that depends on the requests before (a
/// repeated prompt reuses the KV cells its first run left), the counts do not.
fn counts(usage: &Value) -> Value {
    let mut usage = usage.clone();
    if let Some(usage) = usage.as_object_mut() {
        usage.remove("prompt_tokens_details");
        usage.remove("input_tokens_details");
    }
    usage
}

/// `usage` adds up, and the finish reason agrees with the completion's length: `length`
/// exactly at `max_tokens`, `stop` (end of generation) before it.
fn check_usage(usage: &Value, finish_reason: Option<&str>, max_tokens: u32) {
    let prompt = usage["prompt_tokens"].as_u64().unwrap_or_else(|| panic!("{usage}"));
    let completion = usage["completion_tokens"].as_u64().unwrap_or_else(|| panic!("{usage}"));
    assert!(prompt > 0, "{usage}");
    assert_eq!(usage["total_tokens"].as_u64(), Some(prompt + completion), "{usage}");
    let max = u64::from(max_tokens);
    match finish_reason {
        Some("length") => assert_eq!(completion, max, "length means max_tokens: {usage}"),
        Some("stop") => assert!(completion < max, "stop before max_tokens: {usage}"),
        other => panic!("finish_reason {other:?}: {usage}"),
    }
}

/// A base64 decoder (standard alphabet, padded), for `encoding_format: base64`.
fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => u32::from(c - b'A'),
            b'a'..=b'z' => u32::from(c - b'a') + 26,
            b'0'..=b'9' => u32::from(c - b'0') + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {c:?} in {text}"),
        }
    };
    assert_eq!(text.len() % 4, 0, "padded base64: {text}");
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    for quad in text.as_bytes().chunks(4) {
        let data: Vec<u8> = quad.iter().copied().take_while(|&c| c != b'=').collect();
        let n = data.iter().enumerate().fold(0u32, |n, (i, &c)| n | (value(c) << (18 - 6 * i)));
        out.extend(n.to_be_bytes()[1..].iter().take(data.len().saturating_sub(1)));
    }
    out
}

/// Prompts to search: which of them run long and which end early depends on the build.
fn candidate_prompts() -> impl Iterator<Item = String> {
    let fixed = [
        "once upon a time",
        "planes",
        "fly",
        "x",
        "go",
        "2",
        "c",
        "Write a poem about planes.",
        "hello",
        "a",
        "the model",
        "hello world",
        "yes",
        "no",
        "hangar",
        "The hangar",
        "b",
        "1",
        "abc",
        "Tell me about hangars.",
    ];
    fixed.into_iter().map(str::to_owned).chain((0..40).map(|i| format!("item {i}")))
}

/// The first candidate prompt whose greedy chat completion on `model` with `max_tokens`
/// satisfies `wanted(finish_reason, completion_tokens)`.
async fn find_prompt(
    server: &Server,
    model: &str,
    max_tokens: u32,
    wanted: impl Fn(&str, u64) -> bool,
) -> String {
    let mut tried = Vec::new();
    for prompt in candidate_prompts() {
        let (status, body) =
            post(server, "/v1/chat/completions", chat_body(model, &prompt, max_tokens)).await;
        assert_eq!(status, 200, "{body}");
        let finish = body["choices"][0]["finish_reason"].as_str().unwrap().to_owned();
        let tokens = body["usage"]["completion_tokens"].as_u64().unwrap();
        if wanted(&finish, tokens) {
            return prompt;
        }
        tried.push(format!("{prompt:?}: {finish} after {tokens}"));
    }
    panic!("no candidate prompt fits on {model} with max_tokens {max_tokens}: {tried:?}");
}

/// A prompt whose greedy completion runs to `max_tokens` (or the context's end).
async fn running_prompt(server: &Server, model: &str, max_tokens: u32) -> String {
    find_prompt(server, model, max_tokens, |finish, _| finish == "length").await
}

/// A prompt whose greedy completion ends by itself after 4 to `max_tokens - 1` tokens.
async fn stopping_prompt(server: &Server, model: &str, max_tokens: u32) -> String {
    find_prompt(server, model, max_tokens, |finish, n| finish == "stop" && n >= 4).await
}

// ---------------------------------------------------------------------------------------
// Server-sent events

/// What a chat or completion stream said, checked for framing: JSON chunks of `object`
/// sharing one id, then `[DONE]` as the last event.
#[derive(Debug)]
struct Streamed {
    chunks: Vec<Value>,
    /// The concatenated `delta.content` (chat) or `text` (completions).
    text: String,
    /// The chunks that carry text, in order.
    pieces: usize,
    finish_reason: Option<String>,
}

fn streamed(events: &[Event], object: &str) -> Streamed {
    let (done, events) = events.split_last().expect("events");
    assert_eq!(done.data, "[DONE]", "the last event is [DONE]: {events:?}");
    let chunks: Vec<Value> = events.iter().map(Event::json).collect();
    assert!(!chunks.is_empty());
    for chunk in &chunks {
        assert_eq!(chunk["object"], object, "{chunk}");
        assert_eq!(chunk["id"], chunks[0]["id"], "one id for the whole stream: {chunk}");
        assert!(chunk.get("error").is_none(), "{chunk}");
    }
    let mut text = String::new();
    let mut pieces = 0;
    let mut finish_reason = None;
    for chunk in &chunks {
        let Some(choice) = chunk["choices"].get(0) else { continue };
        let piece = choice["delta"]["content"].as_str().or(choice["text"].as_str());
        if let Some(piece) = piece.filter(|p| !p.is_empty()) {
            assert!(finish_reason.is_none(), "text after the finish reason: {chunk}");
            text.push_str(piece);
            pieces += 1;
        }
        if let Some(reason) = choice["finish_reason"].as_str() {
            assert!(finish_reason.is_none(), "two finish reasons: {chunk}");
            finish_reason = Some(reason.to_owned());
        }
    }
    Streamed { chunks, text, pieces, finish_reason }
}

// ---------------------------------------------------------------------------------------
// 1-3. Generation: chat completions, completions, Responses API

#[tokio::test]
async fn chat_completion_counts_tokens_and_stops_at_max_tokens() {
    let server = serve(json!({ "tiny": chat_model(json!({})) }), &["tiny"]).await;

    // Whatever the prompt, finish reason and usage agree (checked by chat_ok).
    for prompt in candidate_prompts().take(6) {
        chat_ok(&server, "tiny", &prompt, 4).await;
    }

    // max_tokens cuts a generation that does not end by itself.
    let long = running_prompt(&server, "tiny", 4).await;
    let body = chat_ok(&server, "tiny", &long, 4).await;
    assert_eq!(body["choices"][0]["finish_reason"], "length", "{body}");
    assert_eq!(body["usage"]["completion_tokens"], 4, "{body}");
    assert!(!body["choices"][0]["message"]["content"].as_str().unwrap().is_empty(), "{body}");

    // One that ends by itself says `stop`, before max_tokens.
    let short = stopping_prompt(&server, "tiny", 64).await;
    let body = chat_ok(&server, "tiny", &short, 64).await;
    assert_eq!(body["choices"][0]["finish_reason"], "stop", "{body}");

    // max_completion_tokens wins over max_tokens.
    let mut request = chat_body("tiny", &long, 9);
    request["max_completion_tokens"] = 3.into();
    let (status, body) = post(&server, "/v1/chat/completions", request).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["usage"]["completion_tokens"], 3, "{body}");

    // The chat template wraps the message: more prompt tokens than the bare text has.
    let (status, raw) = post(
        &server,
        "/v1/completions",
        json!({ "model": "tiny", "prompt": "hello", "max_tokens": 1 }),
    )
    .await;
    assert_eq!(status, 200, "{raw}");
    let templated = chat_ok(&server, "tiny", "hello", 1).await;
    assert!(
        templated["usage"]["prompt_tokens"].as_u64() > raw["usage"]["prompt_tokens"].as_u64(),
        "{templated} vs {raw}"
    );
}

#[tokio::test]
async fn greedy_chat_streams_the_same_text_as_the_non_streaming_answer() {
    let server = serve(json!({ "tiny": chat_model(json!({})) }), &["tiny"]).await;
    let long = running_prompt(&server, "tiny", 16).await;
    let short = stopping_prompt(&server, "tiny", 64).await;
    // (prompt, max_tokens, content chunks at least)
    for (prompt, max_tokens, min_pieces) in [(long.as_str(), 16, 2), (short.as_str(), 64, 1)] {
        let whole = chat_ok(&server, "tiny", prompt, max_tokens).await;
        let again = chat_ok(&server, "tiny", prompt, max_tokens).await;
        let content = whole["choices"][0]["message"]["content"].as_str().unwrap();
        assert_eq!(again["choices"][0]["message"]["content"], content, "greedy is deterministic");

        let request = streaming(chat_body("tiny", prompt, max_tokens), json!({}));
        let events = Sse::start(&server, "/v1/chat/completions", &request).await.all().await;
        let stream = streamed(&events, "chat.completion.chunk");
        let first = &stream.chunks[0]["choices"][0]["delta"];
        assert_eq!(first["role"], "assistant", "the first delta has the role: {first}");
        assert_eq!(stream.text, content, "{prompt}: stream vs whole");
        assert!(stream.pieces >= min_pieces, "a chunk per token or so: {stream:?}");
        assert_eq!(
            stream.finish_reason.as_deref(),
            whole["choices"][0]["finish_reason"].as_str(),
            "{prompt}"
        );
        let last = stream.chunks.last().unwrap();
        assert_eq!(last["choices"][0]["delta"], json!({}), "the finish chunk: {last}");
        assert!(stream.chunks.iter().all(|c| c.get("usage").is_none()), "no usage unasked");

        // include_usage: one more chunk, with no choices and the same usage.
        let request = streaming(
            chat_body("tiny", prompt, max_tokens),
            json!({ "stream_options": { "include_usage": true } }),
        );
        let events = Sse::start(&server, "/v1/chat/completions", &request).await.all().await;
        let stream = streamed(&events, "chat.completion.chunk");
        assert_eq!(stream.text, content);
        let (usage_chunk, rest) = stream.chunks.split_last().unwrap();
        assert_eq!(usage_chunk["choices"], json!([]), "{usage_chunk}");
        assert_eq!(
            counts(&usage_chunk["usage"]),
            counts(&whole["usage"]),
            "{usage_chunk} vs {whole}"
        );
        assert!(rest.iter().all(|c| c["usage"].is_null()), "usage only in the last chunk");
    }
}

#[tokio::test]
async fn completions_stream_and_whole_agree() {
    let server = serve(json!({ "tiny": chat_model(json!({})) }), &["tiny"]).await;
    let request =
        json!({ "model": "tiny", "prompt": "The hangar", "max_tokens": 12, "temperature": 0 });
    let (status, whole) = post(&server, "/v1/completions", request.clone()).await;
    assert_eq!(status, 200, "{whole}");
    assert_eq!(whole["object"], "text_completion", "{whole}");
    let text = whole["choices"][0]["text"].as_str().unwrap();
    check_usage(&whole["usage"], whole["choices"][0]["finish_reason"].as_str(), 12);

    let events = Sse::start(&server, "/v1/completions", &streaming(request.clone(), json!({})))
        .await
        .all()
        .await;
    let stream = streamed(&events, "text_completion");
    assert_eq!(stream.text, text);
    assert_eq!(stream.finish_reason.as_deref(), whole["choices"][0]["finish_reason"].as_str());

    let usage_request =
        streaming(request.clone(), json!({ "stream_options": { "include_usage": true } }));
    let events = Sse::start(&server, "/v1/completions", &usage_request).await.all().await;
    let stream = streamed(&events, "text_completion");
    assert_eq!(counts(&stream.chunks.last().unwrap()["usage"]), counts(&whole["usage"]));

    // echo puts the prompt first, in both forms.
    let mut echo = request.clone();
    echo["echo"] = true.into();
    let (status, echoed) = post(&server, "/v1/completions", echo.clone()).await;
    assert_eq!(status, 200, "{echoed}");
    assert_eq!(echoed["choices"][0]["text"], format!("The hangar{text}"));
    let events =
        Sse::start(&server, "/v1/completions", &streaming(echo, json!({}))).await.all().await;
    assert_eq!(streamed(&events, "text_completion").text, format!("The hangar{text}"));
}

/// A Responses API stream, checked for framing; returns the events' JSON in order.
fn response_events(events: &[Event]) -> Vec<Value> {
    let values: Vec<Value> = events.iter().map(Event::json).collect();
    for (i, (event, value)) in events.iter().zip(&values).enumerate() {
        assert_eq!(event.name.as_deref(), value["type"].as_str(), "event: names the type");
        assert_eq!(value["sequence_number"], i, "sequence numbers count up: {value}");
    }
    values
}

#[tokio::test]
async fn responses_stream_events_from_created_to_completed() {
    let server = serve(json!({ "tiny": chat_model(json!({})) }), &["tiny"]).await;
    // (input, max_output_tokens, the final status): one that ends by itself, one cut short.
    // A single user message renders as in chat, so the prompts found there behave alike.
    let short = stopping_prompt(&server, "tiny", 64).await;
    let long = running_prompt(&server, "tiny", 6).await;
    let cases = [(short.as_str(), 64, "completed"), (long.as_str(), 6, "incomplete")];
    for (input, max_output_tokens, status) in cases {
        let request = json!({ "model": "tiny", "input": input, "max_output_tokens": max_output_tokens, "temperature": 0 });
        let (status_code, whole) = post(&server, "/v1/responses", request.clone()).await;
        assert_eq!(status_code, 200, "{whole}");
        assert_eq!(
            (whole["object"].as_str(), whole["status"].as_str()),
            (Some("response"), Some(status)),
            "{whole}"
        );
        let text = whole["output_text"].as_str().unwrap();
        assert_eq!(whole["output"][0]["role"], "assistant", "{whole}");
        assert_eq!(whole["output"][0]["content"][0]["text"], text, "{whole}");
        let usage = &whole["usage"];
        let (input_tokens, output_tokens) =
            (usage["input_tokens"].as_u64().unwrap(), usage["output_tokens"].as_u64().unwrap());
        assert!(input_tokens > 0, "{usage}");
        assert_eq!(usage["total_tokens"].as_u64(), Some(input_tokens + output_tokens));
        if status == "incomplete" {
            assert_eq!(output_tokens, max_output_tokens, "{usage}");
            assert_eq!(whole["incomplete_details"]["reason"], "max_output_tokens", "{whole}");
        } else {
            assert!(output_tokens < max_output_tokens, "{usage}");
        }

        let events =
            Sse::start(&server, "/v1/responses", &streaming(request, json!({}))).await.all().await;
        let values = response_events(&events);
        let kinds: Vec<&str> = values.iter().map(|v| v["type"].as_str().unwrap()).collect();
        let last = format!("response.{status}");
        assert_eq!(
            kinds[..4],
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added"
            ],
            "{kinds:?}"
        );
        assert_eq!(
            kinds[kinds.len() - 4..],
            [
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                last.as_str()
            ],
            "{kinds:?}"
        );
        let deltas: Vec<&Value> =
            values.iter().filter(|v| v["type"] == "response.output_text.delta").collect();
        assert_eq!(deltas.len(), kinds.len() - 8, "only deltas in between: {kinds:?}");
        assert!(!deltas.is_empty());
        let concatenated: String = deltas.iter().map(|d| d["delta"].as_str().unwrap()).collect();
        assert_eq!(concatenated, text, "the deltas make the non-streaming text");
        assert_eq!(values[kinds.len() - 4]["text"], text);
        let id = &values[0]["response"]["id"];
        assert_eq!(values[0]["response"]["status"], "in_progress");
        let finished = &values.last().unwrap()["response"];
        assert_eq!(&finished["id"], id, "one response id: {finished}");
        assert_eq!(finished["status"], status);
        assert_eq!(finished["output_text"], text);
        assert_eq!(counts(&finished["usage"]), counts(&whole["usage"]));
    }
}

// ---------------------------------------------------------------------------------------
// 4-5. Embeddings and reranking

#[tokio::test]
async fn embeddings_are_normalized_deterministic_and_base64_decodes_to_the_floats() {
    let models = json!({
        "embed": gguf("tiny-embed.gguf", json!({ "labels": ["embedding"] })),
        "tiny": chat_model(json!({})),
    });
    let server = serve(models, &["embed", "tiny"]).await;
    let inputs = ["a hangar full of planes", "the quick brown fox", "a hangar full of planes"];
    let (status, body) =
        post(&server, "/v1/embeddings", json!({ "model": "embed", "input": inputs })).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!((body["object"].as_str(), body["model"].as_str()), (Some("list"), Some("embed")));
    assert!(body["usage"]["prompt_tokens"].as_u64().unwrap() > 0, "{body}");
    assert_eq!(body["usage"]["total_tokens"], body["usage"]["prompt_tokens"]);
    let data = body["data"].as_array().unwrap();
    assert_eq!(data.len(), 3, "{body}");
    let vectors: Vec<Vec<f32>> = data
        .iter()
        .enumerate()
        .map(|(i, item)| {
            assert_eq!(
                (item["object"].as_str(), item["index"].as_u64()),
                (Some("embedding"), Some(i as u64))
            );
            let v: Vec<f32> = item["embedding"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect();
            let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
            assert!((norm - 1.0).abs() < 1e-3, "input {i}: |v| = {norm}");
            v
        })
        .collect();
    assert!(!vectors[0].is_empty());
    assert!(vectors.iter().all(|v| v.len() == vectors[0].len()), "one dimension");
    assert_eq!(vectors[0], vectors[2], "identical inputs, identical vectors");
    assert_ne!(vectors[0], vectors[1], "different inputs, different vectors");

    // One input alone gives the vector it got in the batch.
    let (status, single) =
        post(&server, "/v1/embeddings", json!({ "model": "embed", "input": inputs[1] })).await;
    assert_eq!(status, 200, "{single}");
    assert_eq!(single["data"].as_array().map(Vec::len), Some(1));
    assert_eq!(single["data"][0]["embedding"], data[1]["embedding"]);

    // base64: little-endian f32 bytes of the same floats.
    let request = json!({ "model": "embed", "input": inputs, "encoding_format": "base64" });
    let (status, encoded) = post(&server, "/v1/embeddings", request).await;
    assert_eq!(status, 200, "{encoded}");
    for (i, item) in encoded["data"].as_array().unwrap().iter().enumerate() {
        let bytes = base64_decode(item["embedding"].as_str().unwrap());
        assert_eq!(bytes.len(), vectors[i].len() * 4);
        let floats: Vec<f32> =
            bytes.chunks(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
        assert_eq!(floats, vectors[i], "input {i}: base64 vs float");
    }

    // Each model does its own job only: refused by type before reaching the engine.
    let (status, refused) =
        post(&server, "/v1/embeddings", json!({ "model": "tiny", "input": "x" })).await;
    assert_eq!((status, code(&refused)), (400, "model_type_mismatch"), "{refused}");
    let (status, refused) =
        post(&server, "/v1/chat/completions", chat_body("embed", "hello", 2)).await;
    assert_eq!((status, code(&refused)), (400, "model_type_mismatch"), "{refused}");
    assert_eq!(row(&server, "embed").await["runtime_state"], "loaded", "a refusal is no crash");
}

#[tokio::test]
async fn rerank_orders_every_document_by_score() {
    let models = json!({ "rerank": gguf("tiny-rerank.gguf", json!({ "labels": ["reranking"] })) });
    let server = serve(models, &["rerank"]).await;
    let documents = json!([
        "a fox is an animal",
        { "text": "paris is in france" },
        "x",
        "foxes live in dens",
        { "text": "planes are kept in hangars" }
    ]);
    let text = |i: usize| {
        let d = &documents[i];
        d.as_str().or(d["text"].as_str()).unwrap().to_owned()
    };
    let request = json!({ "model": "rerank", "query": "what is a fox", "documents": documents });
    let (status, full) = post(&server, "/v1/rerank", request.clone()).await;
    assert_eq!(status, 200, "{full}");
    assert_eq!(full["model"], "rerank");
    assert!(full["usage"]["prompt_tokens"].as_u64().unwrap() > 0, "{full}");
    let results = full["results"].as_array().unwrap();
    let mut indices: Vec<u64> = results.iter().map(|r| r["index"].as_u64().unwrap()).collect();
    let scores: Vec<f64> = results.iter().map(|r| r["relevance_score"].as_f64().unwrap()).collect();
    assert!(scores.iter().all(|s| s.is_finite()), "{full}");
    assert!(scores.windows(2).all(|w| w[0] >= w[1]), "sorted by score, best first: {full}");
    assert!(results.iter().all(|r| r.get("document").is_none()), "no documents unasked");
    indices.sort_unstable();
    assert_eq!(indices, [0, 1, 2, 3, 4], "every document once: {full}");

    let (status, again) = post(&server, "/v1/rerank", request.clone()).await;
    assert_eq!(status, 200);
    assert_eq!(again["results"], full["results"], "deterministic");

    let mut top = request;
    top["top_n"] = 2.into();
    top["return_documents"] = true.into();
    let (status, top) = post(&server, "/v1/rerank", top).await;
    assert_eq!(status, 200, "{top}");
    let best = top["results"].as_array().unwrap();
    assert_eq!(best.len(), 2, "top_n truncates: {top}");
    for (got, want) in best.iter().zip(results) {
        assert_eq!(got["index"], want["index"], "the best of the full ranking");
        assert_eq!(got["relevance_score"], want["relevance_score"]);
        let index = got["index"].as_u64().unwrap() as usize;
        assert_eq!(got["document"]["text"], text(index), "{got}");
    }
}

// ---------------------------------------------------------------------------------------
// 6-7. Load overrides and load / unload cycles

/// A long prompt: about 2 tokens per repetition, plus about 22 for the chat template.
fn long_prompt(repetitions: usize) -> String {
    "hello world ".repeat(repetitions)
}

#[tokio::test]
async fn gguf_load_overrides_apply_to_one_load_and_invalid_ones_change_nothing() {
    let models = json!({ "tiny": chat_model(json!({ "gguf_n_ctx": 2048 })) });
    let server = serve(models, &[]).await;

    // Refused while unloaded, with the spec's statuses; nothing changes.
    let refused = [
        (json!({ "gguf_type_k": "q8-0" }), 400, "invalid_load_request", Some("gguf_type_k")),
        (json!({ "gguf_type_v": "foo" }), 400, "invalid_load_request", Some("gguf_type_v")),
        (
            json!({ "gguf_flash_attn": "maybe" }),
            400,
            "invalid_load_request",
            Some("gguf_flash_attn"),
        ),
        (
            json!({ "exllama_cache_size": 32768 }),
            400,
            "invalid_load_request",
            Some("exllama_cache_size"),
        ),
        (
            json!({ "llama_server_n_ctx": 4096 }),
            400,
            "invalid_load_request",
            Some("llama_server_n_ctx"),
        ),
        (json!({ "gguf_n_ctx": 0 }), 422, "invalid_request_body", Some("gguf_n_ctx")),
        (json!({ "gguf_n_ctx": -1 }), 422, "invalid_request_body", Some("gguf_n_ctx")),
        (json!({ "gguf_n_ctx": "512" }), 422, "invalid_request_body", Some("gguf_n_ctx")),
        (json!({ "gguf_n_ctx": 512.5 }), 422, "invalid_request_body", Some("gguf_n_ctx")),
        (json!({ "gguf_flash_attn": true }), 422, "invalid_request_body", Some("gguf_flash_attn")),
        (json!({ "gguf_n_ctxx": 512 }), 422, "invalid_request_body", Some("gguf_n_ctxx")),
        // A config field that is no load override.
        (json!({ "gguf_n_batch": 64 }), 422, "invalid_request_body", Some("gguf_n_batch")),
        // One bad field spoils a good one.
        (
            json!({ "gguf_n_ctx": 512, "gguf_type_k": "q8-0" }),
            400,
            "invalid_load_request",
            Some("gguf_type_k"),
        ),
        (json!({ "replicas": 0 }), 422, "invalid_request_body", Some("replicas")),
        (json!({ "replicas": 2 }), 400, "invalid_load_request", None),
    ];
    for (body, status, error, field) in &refused {
        let (got, answer) = load(&server, "tiny", body.clone()).await;
        assert_eq!((got, code(&answer)), (*status, *error), "{body}: {answer}");
        if let Some(field) = field {
            assert_eq!(answer["error"]["field"], *field, "{body}: {answer}");
        }
        let row = row(&server, "tiny").await;
        assert_eq!(row["runtime_state"], "unloaded", "{body}: nothing changes");
        assert_eq!(row["load_override"], json!({}), "{body}: nothing changes");
    }

    // A valid override: the row shows it, the definition stays as configured.
    let overrides = json!({
        "gguf_n_ctx": 512,
        "gguf_type_k": "q8_0",
        "gguf_type_v": "q8_0",
        "gguf_flash_attn": "on",
    });
    let (status, loaded) = load(&server, "tiny", overrides.clone()).await;
    assert_eq!((status, loaded["runtime_state"].as_str()), (200, Some("loaded")), "{loaded}");
    assert_eq!(loaded["load_override"], overrides, "{loaded}");
    let shown = row(&server, "tiny").await;
    assert_eq!(shown["load_override"], overrides, "{shown}");
    assert_eq!(shown["definition"]["gguf_n_ctx"], 2048, "config is not modified: {shown}");
    assert_eq!(shown["definition"]["gguf_type_k"], Value::Null, "{shown}");

    // llama.cpp got them: a q8_0 cache serves, and the context holds 512 tokens.
    chat_ok(&server, "tiny", "hello", 4).await;
    let (status, answer) =
        post(&server, "/v1/chat/completions", chat_body("tiny", &long_prompt(300), 4)).await;
    assert_eq!((status, code(&answer)), (400, "invalid_request"), "{answer}");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(message.contains("the context holds 512"), "{message}");

    // While loaded, any option is refused and the override in effect stays.
    for (body, status, error) in [
        (json!({ "gguf_n_ctx": 1024 }), 400, "invalid_load_request"),
        (json!({ "gguf_type_k": "q8-0" }), 400, "invalid_load_request"),
        (json!({ "gguf_n_ctx": "1024" }), 422, "invalid_request_body"),
        (json!({ "nope": 1 }), 422, "invalid_request_body"),
    ] {
        let (got, answer) = load(&server, "tiny", body.clone()).await;
        assert_eq!((got, code(&answer)), (status, error), "{body}: {answer}");
        let row = row(&server, "tiny").await;
        assert_eq!(row["runtime_state"], "loaded", "{body}: still loaded");
        assert_eq!(row["load_override"], overrides, "{body}: the override stays");
    }
    // An empty body is an idempotent load.
    let (status, same) = load(&server, "tiny", json!({})).await;
    assert_eq!((status, &same["load_override"]), (200, &overrides), "{same}");

    // Unloading ends the override; a plain load is the configured model again.
    let (status, unloaded) = unload(&server, "tiny").await;
    assert_eq!((status, unloaded["runtime_state"].as_str()), (200, Some("unloaded")));
    assert_eq!(unloaded["load_override"], json!({}), "{unloaded}");
    let (status, plain) = load(&server, "tiny", json!({})).await;
    assert_eq!((status, &plain["load_override"]), (200, &json!({})), "{plain}");
    let body = chat_ok(&server, "tiny", &long_prompt(300), 2).await;
    assert!(body["usage"]["prompt_tokens"].as_u64().unwrap() > 512, "{body}");

    // Key presence matters: an explicit null is an override, and is shown.
    unload(&server, "tiny").await;
    let (status, nulled) = load(&server, "tiny", json!({ "gguf_type_k": null })).await;
    assert_eq!((status, &nulled["load_override"]), (200, &json!({ "gguf_type_k": null })));
    chat_ok(&server, "tiny", "hello", 2).await;
}

#[tokio::test]
async fn load_unload_cycles_serve_after_every_load() {
    let server = serve(json!({ "tiny": chat_model(json!({})) }), &[]).await;
    for cycle in 0..3 {
        let (status, loaded) = load(&server, "tiny", json!({})).await;
        assert_eq!((status, loaded["runtime_state"].as_str()), (200, Some("loaded")), "{cycle}");
        assert_eq!(loaded["loaded_replicas"], 1, "{loaded}");
        chat_ok(&server, "tiny", "hello", 3).await;

        let (status, unloaded) = unload(&server, "tiny").await;
        assert_eq!(
            (status, unloaded["runtime_state"].as_str(), unloaded["loaded_replicas"].as_u64()),
            (200, Some("unloaded"), Some(0)),
            "cycle {cycle}: {unloaded}"
        );
        let (status, refused) =
            post(&server, "/v1/chat/completions", chat_body("tiny", "hello", 3)).await;
        assert_eq!((status, code(&refused)), (503, "model_not_loaded"), "{refused}");
    }
    let (_, metrics) = get(&server, "/metrics").await;
    let metrics = metrics.as_str().unwrap();
    assert!(metrics.lines().any(|l| l == "hangar_model_loads_total 3"), "{metrics}");
    assert!(metrics.lines().any(|l| l == "hangar_model_unloads_total 3"), "{metrics}");
}

// ---------------------------------------------------------------------------------------
// 8-9. Replicas and cancellation

/// What a reader saw, in the order the test saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    Content(usize),
    Finish(usize),
}

/// Starts a chat stream and reads it to its end, logging content and finish chunks as they
/// arrive. Reading starts as soon as this stream's headers do, so the log follows the
/// server's order (a reader that started late would find a finished stream's end in its
/// buffers and could log it after content the other stream sent later).
async fn read_logged(
    stream: usize,
    server: &Server,
    request: &Value,
    log: &Mutex<Vec<Seen>>,
) -> Vec<Event> {
    let mut sse = Sse::start(server, "/v1/chat/completions", request).await;
    let mut events = Vec::new();
    while let Some(event) = sse.next().await {
        if event.data != "[DONE]" {
            let chunk = event.json();
            let choice = &chunk["choices"][0];
            if choice["delta"]["content"].as_str().is_some_and(|c| !c.is_empty()) {
                log.lock().unwrap().push(Seen::Content(stream));
            }
            if choice["finish_reason"].is_string() {
                log.lock().unwrap().push(Seen::Finish(stream));
            }
        }
        events.push(event);
    }
    events
}

#[tokio::test]
async fn two_replicas_stream_two_chats_at_once() {
    let models = json!({ "duo": chat_model(json!({ "replicas": 2, "replica_max": 2 })) });
    let server = serve(models, &["duo"]).await;
    let shown = row(&server, "duo").await;
    assert_eq!(
        (shown["replicas"].as_u64(), shown["loaded_replicas"].as_u64()),
        (Some(2), Some(2)),
        "{shown}"
    );
    assert_eq!(shown["definition"]["replicas"], 2, "{shown}");
    // One sequence at a time per llama.cpp replica.
    assert_eq!(shown["effective_target_inflight"], 1, "{shown}");

    // Long greedy generations: several hundred milliseconds each.
    let prompt = running_prompt(&server, "duo", 600).await;
    let request = streaming(chat_body("duo", &prompt, 600), json!({}));
    let log = Mutex::new(Vec::new());
    let done = AtomicBool::new(false);
    let readers = async {
        let streams = tokio::join!(
            read_logged(0, &server, &request, &log),
            read_logged(1, &server, &request, &log)
        );
        done.store(true, Ordering::SeqCst);
        streams
    };
    // Meanwhile, the row counts both as running on the model's replicas.
    let monitor = async {
        let mut most = 0;
        while !done.load(Ordering::SeqCst) {
            let row = row(&server, "duo").await;
            most = most.max(row["runtime_inflight"].as_u64().unwrap());
            assert_eq!(row["queue_depth"], 0, "nothing waits with a free replica: {row}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        most
    };
    let ((a, b), most_running) = tokio::join!(readers, monitor);

    let (a, b) = (streamed(&a, "chat.completion.chunk"), streamed(&b, "chat.completion.chunk"));
    assert_eq!(a.finish_reason.as_deref(), Some("length"));
    assert_eq!(b.finish_reason.as_deref(), Some("length"));
    assert_eq!(a.text, b.text, "same weights, same greedy text on both replicas");
    let log = log.into_inner().unwrap();
    let first_finish =
        log.iter().position(|s| matches!(s, Seen::Finish(_))).expect("a finish chunk");
    for stream in [0, 1] {
        assert!(
            log[..first_finish].contains(&Seen::Content(stream)),
            "stream {stream} got no content before the first stream finished: both must \
             progress at once (first finish at {first_finish} of {} events)",
            log.len()
        );
    }
    assert_eq!(most_running, 2, "both replicas were busy at the same time");
    wait_for_row(&server, "duo", "no work", |r| r["inflight_requests"] == 0).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn one_replica_streams_four_chats_at_once_in_one_batch() {
    let models = json!({ "batch": chat_model(json!({ "target_inflight": 4 })) });
    let server = serve(models, &["batch"]).await;
    let shown = row(&server, "batch").await;
    assert_eq!(shown["effective_target_inflight"], 4, "{shown}");
    // What llama.cpp was given: four sequences of the configured context, threads from the
    // machine's cores (no gguf_n_threads in the config).
    let details = &shown["runtime_details"];
    assert_eq!(details.as_array().map(Vec::len), Some(1), "one replica: {shown}");
    let details = &details[0];
    assert_eq!(
        (details["n_seq_max"].as_u64(), details["n_ctx_seq"].as_u64()),
        (Some(4), Some(2048))
    );
    assert_eq!(details["threads_from"], "core_share", "{details}");
    let cores = details["cores_available"].as_u64().expect("cores");
    let threads = details["n_threads"].as_u64().expect("threads");
    assert!((1..=cores).contains(&threads), "{details}");

    let prompt = running_prompt(&server, "batch", 600).await;
    let request = streaming(chat_body("batch", &prompt, 600), json!({}));
    let log = Mutex::new(Vec::new());
    let done = AtomicBool::new(false);
    let readers = async {
        let streams = tokio::join!(
            read_logged(0, &server, &request, &log),
            read_logged(1, &server, &request, &log),
            read_logged(2, &server, &request, &log),
            read_logged(3, &server, &request, &log)
        );
        done.store(true, Ordering::SeqCst);
        streams
    };
    let monitor = async {
        let mut most = 0;
        while !done.load(Ordering::SeqCst) {
            let row = row(&server, "batch").await;
            most = most.max(row["runtime_inflight"].as_u64().unwrap());
            assert_eq!(row["queue_depth"], 0, "nothing waits with a free sequence slot: {row}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        most
    };
    let ((a, b, c, d), most_running) = tokio::join!(readers, monitor);
    let texts: Vec<String> = [a, b, c, d]
        .iter()
        .map(|events| {
            let s = streamed(events, "chat.completion.chunk");
            assert_eq!(s.finish_reason.as_deref(), Some("length"));
            s.text
        })
        .collect();
    // Same prompt, same greedy text — up to llama.cpp's arithmetic, which depends on the
    // batch's shape: a sequence that joins a step later (or reuses the cached prompt while
    // another recomputes it) is computed in a differently shaped batch, and 600 greedy tokens
    // from random weights can part on a near-tie late in the text (seen once in a clean-clone
    // CI run on a loaded machine). Cross-talk between sequences would show from the start.
    let shortest = texts.iter().map(String::len).min().unwrap_or(0);
    let common = |t: &String| t.bytes().zip(texts[0].bytes()).take_while(|(a, b)| a == b).count();
    assert!(
        texts.iter().all(|t| common(t) >= shortest / 4),
        "same prompt, same greedy text in one batch (at least its first quarter): {texts:#?}"
    );
    let log = log.into_inner().unwrap();
    let first_finish =
        log.iter().position(|s| matches!(s, Seen::Finish(_))).expect("a finish chunk");
    for stream in 0..4 {
        assert!(
            log[..first_finish].contains(&Seen::Content(stream)),
            "stream {stream} got no content before the first stream finished"
        );
    }
    assert_eq!(most_running, 4, "all four ran on the one replica at once");

    // The same prompt again reuses a slot's KV cells, and says so in its usage.
    let again = chat_ok(&server, "batch", &prompt, 4).await;
    let usage = &again["usage"];
    let prompt_tokens = usage["prompt_tokens"].as_u64().unwrap();
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"].as_u64(), Some(prompt_tokens - 1));
    wait_for_row(&server, "batch", "no work", |r| r["inflight_requests"] == 0).await;
}

fn metric<'a>(metrics: &'a str, series: &str) -> Option<&'a str> {
    metrics.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
}

#[tokio::test]
async fn a_client_that_disconnects_frees_the_replica() {
    let server = serve(json!({ "solo": chat_model(json!({})) }), &["solo"]).await;
    // A generation that runs for a while (at least 300 tokens, several hundred ms).
    let prompt = running_prompt(&server, "solo", 300).await;
    let request = streaming(chat_body("solo", &prompt, 2000), json!({}));
    let mut sse = Sse::start(&server, "/v1/chat/completions", &request).await;
    loop {
        let event = sse.next().await.expect("content before the end");
        let chunk = event.json();
        if chunk["choices"][0]["delta"]["content"].as_str().is_some_and(|c| !c.is_empty()) {
            break;
        }
    }
    drop(sse);

    // The only replica serves the next request (it waits its turn if it has to).
    chat_ok(&server, "solo", "hello", 4).await;
    wait_for_row(&server, "solo", "no work", |r| {
        (r["inflight_requests"].as_u64(), r["runtime_inflight"].as_u64(), r["queue_depth"].as_u64())
            == (Some(0), Some(0), Some(0))
    })
    .await;

    // The dropped stream ended as cancelled, not as a full generation.
    let (_, metrics) = get(&server, "/metrics").await;
    let metrics = metrics.as_str().unwrap();
    let series = |outcome: &str| {
        format!(
            "hangar_requests_total{{endpoint=\"chat_completions\",model=\"solo\",outcome=\"{outcome}\"}}"
        )
    };
    assert_eq!(metric(metrics, &series("cancelled")), Some("1"), "{metrics}");
    // The search for a prompt and the second request.
    assert!(metric(metrics, &series("ok")).is_some(), "{metrics}");
    assert_eq!(metric(metrics, "hangar_model_inflight_requests{model=\"solo\"}"), Some("0"));
    assert_eq!(metric(metrics, "hangar_model_runtime_inflight{model=\"solo\"}"), Some("0"));
    assert_eq!(row(&server, "solo").await["runtime_state"], "loaded");
}

// ---------------------------------------------------------------------------------------
// 10. Load progress

/// A tiny GGUF loads in milliseconds, too fast to catch llama.cpp's own progress reliably.
/// Loads are serialized, though: a llama_cpp model whose load waits behind a slow one is
/// `loading` for as long, and its row shows `load_progress` the whole time.
#[tokio::test]
async fn load_progress_shows_while_loading_and_is_null_otherwise() {
    let models = json!({
        "slow": { "backend": "stub", "stub": { "load_delay_ms": 2000 } },
        "tiny": chat_model(json!({})),
    });
    let server = serve(models, &[]).await;
    assert_eq!(row(&server, "tiny").await["load_progress"], Value::Null, "unloaded");

    let slow = tokio::spawn({
        let url = server.url("/v1/admin/models/slow/load");
        async move { send(Method::POST, &url, Some(&json!({})), None).await }
    });
    wait_for_row(&server, "slow", "loading", |r| r["runtime_state"] == "loading").await;
    let tiny = tokio::spawn({
        let url = server.url("/v1/admin/models/tiny/load");
        async move { send(Method::POST, &url, Some(&json!({})), None).await }
    });

    // Every value the row shows while loading is a fraction that only grows.
    let mut seen = Vec::new();
    loop {
        let row = row(&server, "tiny").await;
        match row["runtime_state"].as_str() {
            Some("loading") => {
                let p = row["load_progress"].as_f64().unwrap_or_else(|| panic!("{row}"));
                assert!((0.0..=1.0).contains(&p), "{row}");
                seen.push(p);
            }
            Some("loaded") => {
                assert_eq!(row["load_progress"], Value::Null, "{row}");
                break;
            }
            Some("unloaded") => {} // the load request is not there yet
            _ => panic!("{row}"),
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert!(!seen.is_empty(), "the queued load is `loading` with a progress");
    assert!(seen.windows(2).all(|w| w[0] <= w[1]), "{seen:?}");
    let (status, answer) = tiny.await.unwrap();
    assert_eq!((status, answer["load_progress"].clone()), (200, Value::Null), "{answer}");
    assert_eq!(slow.await.unwrap().0, 200);
    assert_eq!(row(&server, "slow").await["load_progress"], Value::Null);
}

// ---------------------------------------------------------------------------------------
// 11. The context size

/// `gguf_n_ctx` sizes the context, and a prompt that does not fit is refused with 400
/// `invalid_request` naming the context's size. llama.cpp pads the context to a multiple of
/// 256 tokens, so a configured 256 is exact and a configured 64 holds 256 as well.
#[tokio::test]
async fn a_prompt_longer_than_the_context_is_refused_with_400() {
    let models = json!({
        "ctx256": chat_model(json!({ "gguf_n_ctx": 256 })),
        "ctx64": chat_model(json!({ "gguf_n_ctx": 64 })),
    });
    let server = serve(models, &["ctx256", "ctx64"]).await;
    let long = long_prompt(150); // about 320 tokens as chat, 300 as a raw prompt
    for model in ["ctx256", "ctx64"] {
        let requests = [
            ("/v1/chat/completions", chat_body(model, &long, 4)),
            ("/v1/completions", json!({ "model": model, "prompt": long, "max_tokens": 4 })),
            ("/v1/responses", json!({ "model": model, "input": long, "max_output_tokens": 4 })),
        ];
        for (path, request) in requests {
            let (status, answer) = post(&server, path, request).await;
            assert_eq!((status, code(&answer)), (400, "invalid_request"), "{path}: {answer}");
            let message = answer["error"]["message"].as_str().unwrap();
            assert!(message.contains("the context holds "), "{path}: {message}");
            if model == "ctx256" {
                assert!(message.ends_with("the context holds 256"), "{path}: {message}");
            }
        }
        // A stream is refused the same way: nothing was generated, so it never starts.
        let request = streaming(chat_body(model, &long, 4), json!({}));
        let (status, answer) = post(&server, "/v1/chat/completions", request).await;
        assert_eq!((status, code(&answer)), (400, "invalid_request"), "{answer}");
        // The refusal is the request's, not the model's.
        assert_eq!(row(&server, model).await["runtime_state"], "loaded");
        chat_ok(&server, model, "hello", 2).await;
    }

    // Generation that runs out of context ends with `length` at the context's end.
    let prompt = running_prompt(&server, "ctx256", 1000).await;
    let (status, body) =
        post(&server, "/v1/chat/completions", chat_body("ctx256", &prompt, 1000)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["finish_reason"], "length", "{body}");
    assert!(body["usage"]["completion_tokens"].as_u64().unwrap() < 1000, "{body}");
    assert_eq!(body["usage"]["total_tokens"], 256, "{body}");
}

/// llama.cpp refuses a quantized V cache without flash attention. The combination is
/// knowable from the load body alone, so validation refuses it (400) — before, the load
/// failed in llama.cpp (500 `load_failed`) and the manager evicted every other loaded model
/// to retry a load that could not succeed.
#[tokio::test]
async fn a_quantized_v_cache_without_flash_attention_is_refused_before_loading() {
    let models = json!({
        "embed": gguf("tiny-embed.gguf", json!({ "labels": ["embedding"] })),
        "tiny": chat_model(json!({})),
    });
    let server = serve(models, &["embed"]).await;
    let body = json!({ "gguf_type_v": "q8_0", "gguf_flash_attn": "off" });
    let (status, answer) = load(&server, "tiny", body).await;
    assert_eq!(row(&server, "embed").await["runtime_state"], "loaded", "nothing evicted");
    assert_eq!((status, code(&answer)), (400, "invalid_load_request"), "{answer}");
}

// ---------------------------------------------------------------------------------------
// Structured outputs and tool calls (llama.cpp grammars)

fn weather_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "city": { "type": "string", "maxLength": 12 },
            "unit": { "enum": ["celsius", "fahrenheit"] },
            "sunny": { "type": "boolean" }
        },
        "required": ["city", "unit", "sunny"],
        "additionalProperties": false
    })
}

fn assert_satisfies(text: &str, schema: &Value) {
    let value: Value =
        serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text:?}"));
    let validator = jsonschema::validator_for(schema).expect("test schema compiles");
    assert!(validator.is_valid(&value), "{value} does not satisfy {schema}");
}

/// A sampled (temperature 1) chat with `extra` fields.
fn sampled_chat(seed: u64, extra: Value) -> Value {
    let mut body = json!({
        "model": "tiny",
        "messages": [{ "role": "user", "content": "What is the weather in Paris?" }],
        "max_tokens": 300,
        "temperature": 1.0,
        "seed": seed,
    });
    for (key, value) in extra.as_object().expect("an object") {
        body[key] = value.clone();
    }
    body
}

#[tokio::test]
async fn json_schema_responses_satisfy_the_schema_streamed_or_not() {
    let server =
        serve(json!({ "tiny": chat_model(json!({ "gguf_n_ctx": 1024 })) }), &["tiny"]).await;
    let schema = weather_schema();
    let format = json!({ "response_format": { "type": "json_schema",
        "json_schema": { "name": "weather", "strict": true, "schema": schema } } });
    for seed in 0..4 {
        let (status, body) =
            post(&server, "/v1/chat/completions", sampled_chat(seed, format.clone())).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["choices"][0]["finish_reason"], "stop", "{body}");
        assert_satisfies(body["choices"][0]["message"]["content"].as_str().unwrap(), &schema);
    }
    let events =
        Sse::start(&server, "/v1/chat/completions", &streaming(sampled_chat(7, format), json!({})))
            .await
            .all()
            .await;
    let streamed = streamed(&events, "chat.completion.chunk");
    assert_eq!(streamed.finish_reason.as_deref(), Some("stop"));
    assert_satisfies(&streamed.text, &schema);

    // The Responses API spells it `text.format`, with the schema's fields flat.
    let request = json!({
        "model": "tiny", "input": "Weather?", "max_output_tokens": 300, "temperature": 1.0,
        "text": { "format": { "type": "json_schema", "name": "weather", "schema": schema } }
    });
    let (status, body) = post(&server, "/v1/responses", request).await;
    assert_eq!((status, body["status"].as_str()), (200, Some("completed")), "{body}");
    assert_satisfies(body["output_text"].as_str().unwrap(), &schema);
    assert_eq!(body["text"]["format"]["type"], "json_schema", "{body}");
}

fn weather_tools() -> Value {
    json!([
        { "type": "function", "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": {
                "type": "object",
                "properties": { "city": { "type": "string", "maxLength": 10 }, "unit": { "enum": ["c", "f"] } },
                "required": ["city", "unit"],
                "additionalProperties": false
            }
        } },
        { "type": "function", "function": {
            "name": "get_time",
            "parameters": {
                "type": "object",
                "properties": { "utc_offset": { "type": "integer", "minimum": -12, "maximum": 14 } },
                "required": ["utc_offset"],
                "additionalProperties": false
            }
        } }
    ])
}

/// Checks one chat `tool_calls` entry against the tools; returns the function's name.
fn check_tool_call(call: &Value, tools: &Value) -> String {
    assert!(call["id"].as_str().is_some_and(|id| id.starts_with("call_")), "{call}");
    assert_eq!(call["type"], "function", "{call}");
    let name = call["function"]["name"].as_str().expect("a name").to_owned();
    let tool = tools
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["function"]["name"] == name.as_str())
        .unwrap_or_else(|| panic!("{name} is not one of the tools"));
    assert_satisfies(
        call["function"]["arguments"].as_str().unwrap(),
        &tool["function"]["parameters"],
    );
    name
}

#[tokio::test]
async fn forced_tool_choice_answers_with_a_well_formed_tool_call() {
    let server =
        serve(json!({ "tiny": chat_model(json!({ "gguf_n_ctx": 1024 })) }), &["tiny"]).await;
    let tools = weather_tools();
    for seed in 0..4 {
        let required = json!({ "tools": tools, "tool_choice": "required" });
        let (status, body) =
            post(&server, "/v1/chat/completions", sampled_chat(seed, required)).await;
        assert_eq!(status, 200, "{body}");
        let choice = &body["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls", "{body}");
        assert_eq!(choice["message"]["content"], Value::Null, "{body}");
        assert_eq!(choice["message"]["tool_calls"].as_array().map(Vec::len), Some(1), "{body}");
        check_tool_call(&choice["message"]["tool_calls"][0], &tools);

        let named = json!({ "tools": tools, "tool_choice": { "type": "function", "function": { "name": "get_time" } } });
        let (_, body) = post(&server, "/v1/chat/completions", sampled_chat(seed, named)).await;
        let call = &body["choices"][0]["message"]["tool_calls"][0];
        assert_eq!(check_tool_call(call, &tools), "get_time", "{body}");
    }

    // Streamed: one delta carries the whole call (index, id, name, arguments).
    let required = json!({ "tools": tools, "tool_choice": "required" });
    let body = streaming(sampled_chat(11, required), json!({}));
    let events = Sse::start(&server, "/v1/chat/completions", &body).await.all().await;
    let streamed = streamed(&events, "chat.completion.chunk");
    assert_eq!(streamed.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(streamed.text, "", "a forced call streams no content");
    let deltas: Vec<&Value> =
        streamed.chunks.iter().filter_map(|c| c["choices"][0]["delta"].get("tool_calls")).collect();
    assert_eq!(deltas.len(), 1, "{:?}", streamed.chunks);
    assert_eq!(deltas[0][0]["index"], 0);
    check_tool_call(&deltas[0][0], &tools);

    // The call and its result go back as history; the model answers again.
    let call = deltas[0][0].clone();
    let history = json!({
        "model": "tiny",
        "max_tokens": 8,
        "messages": [
            { "role": "user", "content": "What is the weather in Paris?" },
            { "role": "assistant", "content": null, "tool_calls": [call] },
            { "role": "tool", "tool_call_id": call["id"], "content": "{\"temp\": 21}" }
        ],
        "tools": tools
    });
    let (status, body) = post(&server, "/v1/chat/completions", history).await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test]
async fn responses_api_tool_calls_are_function_call_items() {
    let server =
        serve(json!({ "tiny": chat_model(json!({ "gguf_n_ctx": 1024 })) }), &["tiny"]).await;
    let chat_tools = weather_tools();
    // The Responses API's tools are flat: {"type": "function", "name", "parameters"}.
    let tools: Vec<Value> = chat_tools
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let mut flat = t["function"].clone();
            flat["type"] = "function".into();
            flat
        })
        .collect();
    let request = json!({
        "model": "tiny", "input": "What time is it in Tokyo?", "max_output_tokens": 300,
        "temperature": 1.0, "tools": tools, "tool_choice": { "type": "function", "name": "get_time" }
    });
    let (status, body) = post(&server, "/v1/responses", request.clone()).await;
    assert_eq!((status, body["status"].as_str()), (200, Some("completed")), "{body}");
    let items = body["output"].as_array().unwrap();
    assert_eq!(items.len(), 1, "only the call, no empty message: {body}");
    let item = &items[0];
    assert_eq!(
        (item["type"].as_str(), item["name"].as_str()),
        (Some("function_call"), Some("get_time"))
    );
    assert!(item["call_id"].as_str().is_some_and(|id| id.starts_with("call_")), "{item}");
    assert_satisfies(item["arguments"].as_str().unwrap(), &tools[1]["parameters"]);
    assert_eq!(body["tool_choice"]["name"], "get_time", "{body}");

    let mut streamed_request = request;
    streamed_request["stream"] = true.into();
    let events = Sse::start(&server, "/v1/responses", &streamed_request).await.all().await;
    let values = response_events(&events);
    let kinds: Vec<&str> = values.iter().filter_map(|v| v["type"].as_str()).collect();
    assert_eq!(
        kinds,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    let done = &values[5]["item"];
    let completed = &values[6]["response"];
    assert_eq!(completed["output"][0], *done, "the final response repeats the streamed item");
    assert_eq!(values[4]["arguments"], done["arguments"]);
    assert_satisfies(done["arguments"].as_str().unwrap(), &tools[1]["parameters"]);

    // The call and its output go back as input items.
    let follow_up = json!({
        "model": "tiny", "max_output_tokens": 8, "tools": tools,
        "input": [
            { "role": "user", "content": "What time is it in Tokyo?" },
            { "type": "function_call", "call_id": done["call_id"], "name": "get_time", "arguments": done["arguments"] },
            { "type": "function_call_output", "call_id": done["call_id"], "output": "09:00" }
        ]
    });
    let (status, body) = post(&server, "/v1/responses", follow_up).await;
    assert_eq!(status, 200, "{body}");
}
