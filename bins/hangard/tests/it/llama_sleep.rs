//! The warm tier on the real in-process llama.cpp engine (`hangard serve` on the tiny GGUF
//! fixture, over HTTP): a model put to sleep stays `loaded` and ready, says where it
//! resides in its row, its events and `/metrics`; a chat request wakes it and gets the
//! greedy answer it got before; an engine that cannot sleep is refused. The weights are
//! random: answers are compared with each other, never with fixed text.

use std::time::Duration;

use serde_json::{Value, json};

use crate::support::{Server, Sse, code, get, load, post, row};

fn fixture() -> String {
    format!("{}/../../fixtures/models/tiny-llama.gguf", env!("CARGO_MANIFEST_DIR"))
}

fn chat(prompt: &str) -> Value {
    json!({
        "model": "tiny",
        "messages": [{ "role": "user", "content": prompt }],
        "max_tokens": 12,
        "temperature": 0,
    })
}

/// The greedy answer to `prompt`.
async fn answer(server: &Server, prompt: &str) -> String {
    let (status, body) = post(server, "/v1/chat/completions", chat(prompt)).await;
    assert_eq!(status, 200, "{body}");
    body["choices"][0]["message"]["content"].as_str().unwrap().to_owned()
}

/// `hangar_model_asleep` for `model` in `/metrics`.
async fn asleep_metric(server: &Server, model: &str) -> String {
    let metrics = reqwest::get(server.url("/metrics")).await.unwrap().text().await.unwrap();
    let prefix = format!("hangar_model_asleep{{model=\"{model}\"}} ");
    let line = metrics.lines().find_map(|l| l.strip_prefix(&prefix).map(str::to_owned));
    line.unwrap_or_else(|| panic!("no {prefix} in:\n{metrics}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sleeping_model_stays_ready_and_a_request_wakes_it_with_the_same_answer() {
    let tiny = json!({ "backend": "llama_cpp", "model_path": fixture(), "prompt_format": "auto" });
    let models = json!({ "tiny": tiny, "plain": { "backend": "stub" } });
    let server = Server::start(&json!({ "models": models }), &[]);
    let (status, loaded) = load(&server, "tiny", json!({})).await;
    assert_eq!(status, 200, "{loaded}");
    assert_eq!(
        loaded["residency"],
        json!({
            "state": "awake", "level": null, "since_unix_ms": null,
            "gpu_freed_mib": null, "gpu_held_mib": null
        })
    );
    let before = answer(&server, "Tell me about the sea.").await;
    let events = reqwest::get(server.url("/v1/admin/events")).await.unwrap();
    let mut events = Sse::from_response(events);

    let (status, asleep) = post(&server, "/v1/admin/models/tiny/sleep", json!({})).await;
    assert_eq!(status, 200, "{asleep}");
    assert_eq!(asleep["runtime_state"], "loaded", "{asleep}");
    assert_eq!(
        (&asleep["residency"]["state"], &asleep["residency"]["level"]),
        (&json!("asleep"), &json!("context"))
    );
    assert!(asleep["residency"]["since_unix_ms"].as_u64().is_some(), "{asleep}");
    // Still ready for the spec's readiness routes; its gauge says it sleeps.
    assert_eq!(get(&server, "/v2/models/tiny/ready").await.0, 200);
    assert_eq!(asleep_metric(&server, "tiny").await, "1");

    // A request wakes it and gets the answer it got before sleeping.
    assert_eq!(answer(&server, "Tell me about the sea.").await, before);
    assert_eq!(row(&server, "tiny").await["residency"]["state"], "awake");
    assert_eq!(asleep_metric(&server, "tiny").await, "0");
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let event = tokio::time::timeout(Duration::from_secs(30), events.next()).await;
        let event: Value = serde_json::from_str(&event.unwrap().unwrap().data).unwrap();
        if let Some(kind @ ("slept" | "woke")) = event["type"].as_str() {
            seen.push((kind.to_owned(), event["level"].clone(), event["wake_ms"].is_u64()));
        }
    }
    assert_eq!(
        seen,
        [("slept".to_owned(), json!("context"), false), ("woke".to_owned(), Value::Null, true)]
    );

    // Awake already, a wake changes nothing; an engine that cannot sleep is refused.
    assert_eq!(post(&server, "/v1/admin/models/tiny/wake", json!({})).await.0, 200);
    load(&server, "plain", json!({})).await;
    let (status, refused) = post(&server, "/v1/admin/models/plain/sleep", json!({})).await;
    assert_eq!((status, code(&refused)), (400, "unsupported"), "{refused}");
    let (status, refused) = post(&server, "/v1/admin/models/nope/sleep", json!({})).await;
    assert_eq!((status, code(&refused)), (404, "unknown_model"), "{refused}");
}
