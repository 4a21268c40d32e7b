//! The multi-model routes: health and stats.

use http::Method;

use super::*;
use crate::support::request;

#[tokio::test]
async fn health_with_nothing_loaded_has_null_and_an_empty_list() {
    let s = service();
    let (status, body) = get(&s, "/api/v1/health").await;
    assert_eq!(status, 200);
    assert_eq!(
        body,
        json!({ "status": "ok", "model_loaded": null, "checkpoint_loaded": null, "all_models_loaded": [] })
    );
}

#[tokio::test(start_paused = true)]
async fn health_lists_every_loaded_model_and_the_most_recent_one() {
    let s = service();
    post(&s, "/api/v1/load", r#"{"model_name": "gguf"}"#).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    post(&s, "/api/v1/load", r#"{"model_name": "chat"}"#).await;

    let (status, body) = get(&s, "/api/v1/health").await;
    assert_eq!(status, 200);
    assert_eq!(body["status"], "ok");
    assert_eq!(body["model_loaded"], "chat", "the most recently loaded");
    assert_eq!(body["checkpoint_loaded"], Value::Null, "chat has no model_path");
    let all = body["all_models_loaded"].as_array().unwrap();
    assert_eq!(all.len(), 2);
    let gguf = all.iter().find(|m| m["model_name"] == "gguf").unwrap();
    let snapshot = s.manager().model("gguf").unwrap();
    assert_eq!(
        gguf,
        &json!({
            "model_name": "gguf",
            "checkpoint": "/models/qwen3-8b.gguf",
            "last_use": snapshot.last_use_unix_ms.expect("a loaded model has a last use"),
            "type": "llm",
            "device": ["gpu"],
            "backend_url": null,
            "recipe": "llama_cpp",
            "backend": "llama_cpp",
        })
    );
    let chat = all.iter().find(|m| m["model_name"] == "chat").unwrap();
    assert_eq!(chat["checkpoint"], Value::Null);
    assert_eq!(chat["device"], json!(["cpu"]));
    assert_eq!(chat["backend"], "stub");

    // Loading `gguf` again is a no-op and does not make it the most recent.
    post(&s, "/api/v1/load", r#"{"model_name": "gguf"}"#).await;
    assert_eq!(get(&s, "/api/v1/health").await.1["model_loaded"], "chat");

    post(&s, "/api/v1/unload", r#"{"model_name": "chat"}"#).await;
    let (_, body) = get(&s, "/api/v1/health").await;
    assert_eq!(body["all_models_loaded"].as_array().unwrap().len(), 1);
    assert_eq!(body["model_loaded"], "gguf", "the most recent of the models still loaded");
    assert_eq!(body["checkpoint_loaded"], "/models/qwen3-8b.gguf");
}

#[tokio::test]
async fn stats_reports_what_the_runtime_tracks() {
    let s = service();
    let (status, body) = get(&s, "/api/v1/stats").await;
    assert_eq!(status, 200);
    assert_eq!(body["models_loaded"], 0);
    assert_eq!(body["last_loaded_model"], Value::Null);
    assert_eq!(body["counters"]["loads"], 0);

    // `broken` first: a failed load evicts every other model and retries.
    post(&s, "/api/v1/load", r#"{"model_name": "broken"}"#).await;
    post(&s, "/api/v1/load", r#"{"model_name": "chat"}"#).await;
    let (_, body) = get(&s, "/api/v1/stats").await;
    assert_eq!(body["models_loaded"], 1);
    assert_eq!(body["last_loaded_model"], "chat");
    assert_eq!(
        body["counters"],
        json!({ "loads": 1, "load_failures": 1, "unloads": 0, "evictions": 0, "crashes": 0 })
    );
    assert_eq!(body["output_tokens"], Value::Null, "no generation yet");

    // After a generation: the most recent request's token statistics.
    for (stream, max_tokens) in [(false, 3), (true, 5)] {
        let chat = json!({
            "model": "chat",
            "messages": [{ "role": "user", "content": "one two three" }],
            "max_tokens": max_tokens,
            "stream": stream
        });
        // Reading the whole body waits for the end of a stream too.
        let answer = request(Method::POST, "/v1/chat/completions").body(chat).send(&s).await;
        assert_eq!(answer.status, 200);
        let (_, body) = get(&s, "/api/v1/stats").await;
        assert_eq!(body["model"], "chat");
        assert_eq!(body["endpoint"], "chat_completions");
        assert_eq!(body["input_tokens"], 3);
        assert_eq!(body["output_tokens"], max_tokens);
        assert!(body["time_to_first_token"].as_f64().is_some_and(|t| t >= 0.0), "{body}");
    }
}
