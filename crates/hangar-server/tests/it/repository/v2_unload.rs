//! KServe v2: repository unloads.

use super::*;

#[tokio::test]
async fn v2_unload_takes_tritonclient_bodies() {
    let s = service();
    post(&s, "/v2/repository/models/chat/load", "").await;
    post(&s, "/v2/repository/models/gguf/load", "").await;
    // tritonclient's unload_model() always sends unload_dependents.
    let body = r#"{"parameters": {"unload_dependents": false}}"#;
    assert_eq!(post(&s, "/v2/repository/models/chat/unload", body).await, (200, json!({})));
    assert_eq!(state(&s, "chat"), "unloaded");
    let body = r#"{"parameters": {"unload_dependents": true}}"#;
    assert_eq!(post(&s, "/v2/repository/models/gguf/unload", body).await, (200, json!({})));
    assert_eq!(state(&s, "gguf"), "unloaded");
    // Empty body; already unloaded: nothing to do.
    assert_eq!(post(&s, "/v2/repository/models/gguf/unload", "").await, (200, json!({})));

    let (status, answer) = post(&s, "/v2/repository/models/nope/unload", "").await;
    assert_eq!(status, 404);
    v2_error(&answer);
    let (status, answer) =
        post(&s, "/v2/repository/models/gguf/unload", r#"{"parameters": {"force": true}}"#).await;
    assert_eq!(status, 400);
    assert!(v2_error(&answer).contains("force"));
    let (status, answer) = post(
        &s,
        "/v2/repository/models/gguf/unload",
        r#"{"parameters": {"unload_dependents": "yes"}}"#,
    )
    .await;
    assert_eq!(status, 422);
    v2_error(&answer);
}

#[tokio::test(start_paused = true)]
async fn v2_unload_while_loading_is_a_conflict() {
    let s = service();
    let loading = tokio::spawn({
        let s = s.clone();
        async move { post(&s, "/v2/repository/models/slow/load", "").await }
    });
    settle().await;
    let (status, answer) = post(&s, "/v2/repository/models/slow/unload", "").await;
    assert_eq!(status, 409);
    v2_error(&answer);
    assert_eq!(loading.await.unwrap().0, 200);
}
