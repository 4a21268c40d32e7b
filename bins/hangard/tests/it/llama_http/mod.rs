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

mod concurrency;
mod context;
mod generation;
mod loads;
mod structured;
mod vectors;

use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};

use crate::support::engines::fixture;
use crate::support::{
    Event, Server, Sse, code, get, load, post, row, send, unload, wait_for_row, with,
};

// ---------------------------------------------------------------------------------------
// Config

/// A `llama_cpp` model on `file` with `extra` fields.
fn gguf(file: &str, extra: Value) -> Value {
    with(json!({ "backend": "llama_cpp", "model_path": fixture(file) }), extra)
}

/// The tiny llama chat model, its embedded ChatML template rendering chat prompts.
fn chat_model(extra: Value) -> Value {
    with(gguf("tiny-llama.gguf", json!({ "prompt_format": "auto" })), extra)
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

/// A Responses API stream, checked for framing; returns the events' JSON in order.
fn response_events(events: &[Event]) -> Vec<Value> {
    let values: Vec<Value> = events.iter().map(Event::json).collect();
    for (i, (event, value)) in events.iter().zip(&values).enumerate() {
        assert_eq!(event.name.as_deref(), value["type"].as_str(), "event: names the type");
        assert_eq!(value["sequence_number"], i, "sequence numbers count up: {value}");
    }
    values
}

/// A long prompt: about 2 tokens per repetition, plus about 22 for the chat template.
fn long_prompt(repetitions: usize) -> String {
    "hello world ".repeat(repetitions)
}
