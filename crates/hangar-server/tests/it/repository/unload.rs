//! The multi-model routes: unloads.

use super::*;

#[tokio::test]
async fn unload_by_name_unloads_that_model_only() {
    let s = service();
    post(&s, "/api/v1/load", r#"{"model_name": "chat"}"#).await;
    post(&s, "/api/v1/load", r#"{"model_name": "gguf"}"#).await;
    let (status, body) = post(&s, "/api/v1/unload", r#"{"model_name": "gguf"}"#).await;
    assert_eq!(status, 200);
    assert_eq!(body, json!({ "status": "ok", "unloaded": ["gguf"] }));
    assert_eq!(state(&s, "gguf"), "unloaded");
    assert_eq!(state(&s, "chat"), "loaded");
}

#[tokio::test]
async fn unload_by_name_is_404_when_the_model_is_not_loaded() {
    let s = service();
    let (status, body) = post(&s, "/api/v1/unload", r#"{"model_name": "gguf"}"#).await;
    assert_eq!(status, 404);
    assert_eq!(api_code(&body), "nothing_to_unload");
    assert_eq!(body["error"]["runtime_state"], "unloaded");

    post(&s, "/api/v1/load", r#"{"model_name": "broken"}"#).await;
    let (status, body) = post(&s, "/api/v1/unload", r#"{"model_name": "broken"}"#).await;
    assert_eq!(status, 404);
    assert_eq!(api_code(&body), "nothing_to_unload");

    let (status, body) = post(&s, "/api/v1/unload", r#"{"model_name": "nope"}"#).await;
    assert_eq!(status, 404);
    assert_eq!(api_code(&body), "unknown_model");

    let (status, body) = post(&s, "/api/v1/unload", r#"{"model": "gguf"}"#).await;
    assert_eq!(status, 422);
    assert_eq!(api_code(&body), "invalid_request_body");
}

#[tokio::test]
async fn unload_without_a_name_unloads_every_loaded_model() {
    let s = service();
    for name in ["chat", "gguf", "server"] {
        s.manager().load(name, LoadOptions::default()).await.unwrap();
    }
    let (status, body) = post(&s, "/api/v1/unload", "").await;
    assert_eq!(status, 200);
    assert_eq!(body, json!({ "status": "ok", "unloaded": ["chat", "gguf", "server"] }));
    assert!(s.manager().models().iter().all(|m| !m.is_loaded));

    // Nothing left: `{}` unloads nothing.
    assert_eq!(
        post(&s, "/api/v1/unload", "{}").await,
        (200, json!({ "status": "ok", "unloaded": [] }))
    );
    assert_eq!(s.manager().counters().unloads, 3);
}
