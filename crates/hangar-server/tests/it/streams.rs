//! Long-lived answers at the edge: a client that stops reading a stream loses it after the
//! write timeout (its generation cancelled, its slot freed), and a shutdown ends event and
//! log streams with a last `shutdown` event while generations in flight run on. Paused
//! time: the timeouts pass without waiting.

use std::time::Duration;

use hangar_server::{HangarService, ResponseBody};
use http_body_util::BodyExt;
use serde_json::{Value, json};

use crate::support::{load, request, server};

fn service() -> HangarService {
    server()
        .settings(json!({
            "http": { "stream_write_timeout_s": 5 },
            "max_loaded_models": { "llm": 2 },
        }))
        .models(json!({
            "chat": { "backend": "stub", "target_inflight": 1 },
            "slow": { "backend": "stub", "stub": { "token_latency_ms": 50 } }
        }))
        .build()
}

async fn open(s: &HangarService, method: &str, path: &str, body: Value) -> (u16, ResponseBody) {
    let resp = request(method, path).body(body).respond(s).await;
    (resp.status().as_u16(), resp.into_body())
}

/// Reads `body` to its end (bounded, in paused time) and returns the text.
async fn read_all(body: ResponseBody) -> String {
    let collected = tokio::time::timeout(Duration::from_secs(600), body.collect()).await;
    let bytes = collected.expect("the stream ended").unwrap().to_bytes();
    String::from_utf8_lossy(&bytes).into_owned()
}

fn in_flight(s: &HangarService, model: &str) -> u32 {
    s.manager().model(model).unwrap().inflight_requests
}

#[tokio::test(start_paused = true)]
async fn a_reader_that_stops_reading_loses_its_stream_and_frees_its_slot() {
    let s = service();
    load(&s, "chat").await;
    // An endless stub answer (no max_tokens limit that a test would reach soon) streamed to
    // a client that never reads a byte: the stream's buffer fills, then the write timeout
    // passes.
    let chat = json!({
        "model": "chat", "stream": true, "max_tokens": 1_000_000,
        "messages": [{ "role": "user", "content": "talk" }]
    });
    let (status, stalled) = open(&s, "POST", "/v1/chat/completions", chat.clone()).await;
    assert_eq!(status, 200);
    assert_eq!(in_flight(&s, "chat"), 1);
    // Bounded in virtual time: without the write timeout the slot is never freed.
    let freed = async {
        while in_flight(&s, "chat") > 0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(120), freed)
        .await
        .expect("the stalled stream's slot is freed");
    drop(stalled);
    // The model serves the next request (target_inflight 1: the slot really is free).
    let short = json!({ "model": "chat", "max_tokens": 3, "messages": [{ "role": "user", "content": "hi" }] });
    let (status, body) = open(&s, "POST", "/v1/chat/completions", short).await;
    assert_eq!(status, 200, "{}", read_all(body).await);
}

#[tokio::test(start_paused = true)]
async fn shutdown_ends_event_and_log_streams_with_a_last_event_and_drains_requests() {
    let s = service();
    load(&s, "chat").await;
    let (status, events) = open(&s, "GET", "/v1/admin/events", Value::Null).await;
    assert_eq!(status, 200);
    let (status, logs) =
        open(&s, "GET", "/v1/admin/models/chat/logs?follow=true", Value::Null).await;
    assert_eq!(status, 200);
    // A generation in flight when the shutdown starts.
    load(&s, "slow").await;
    let chat = json!({ "model": "slow", "max_tokens": 20, "messages": [{ "role": "user", "content": "hi" }] });
    let request = {
        let s = s.clone();
        tokio::spawn(async move {
            let (status, body) = open(&s, "POST", "/v1/chat/completions", chat).await;
            (status, read_all(body).await)
        })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;

    s.begin_shutdown();
    for (name, stream) in [("events", events), ("logs", logs)] {
        let text = read_all(stream).await;
        let last = text.trim_end().rsplit("\n\n").next().unwrap();
        let data: Value = serde_json::from_str(last.trim_start_matches("data: ")).unwrap();
        assert_eq!(data["type"], "shutdown", "{name}: {text}");
        assert!(data["message"].as_str().unwrap().contains("shutting down"), "{name}");
    }
    // The request in flight is not cut off by the shutdown of the streams.
    let (status, body) = request.await.unwrap();
    assert_eq!(status, 200, "{body}");
    let answer: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["usage"]["completion_tokens"], 20, "the whole answer: {body}");
    // A stream opened after the shutdown began ends at once, with the same last event.
    let (_, late) = open(&s, "GET", "/v1/admin/events", Value::Null).await;
    assert!(read_all(late).await.contains("\"shutdown\""));
}
