//! KServe v2: the repository index.

use super::*;

#[tokio::test(start_paused = true)]
async fn v2_index_maps_every_runtime_state() {
    let s = service();
    // `broken` first: a failed load evicts every other model and retries.
    let (status, body) = post(&s, "/v2/repository/models/broken/load", "").await;
    assert_eq!(status, 400);
    v2_error(&body);
    post(&s, "/v2/repository/models/chat/load", "").await;

    // `slow` loading.
    let loading = tokio::spawn({
        let s = s.clone();
        async move { post(&s, "/v2/repository/models/slow/load", "").await }
    });
    settle().await;
    assert_eq!(state(&s, "slow"), "loading");
    let (status, index) = post(&s, "/v2/repository/index", "").await;
    assert_eq!(status, 200);
    assert_eq!(index.as_array().map(Vec::len), Some(6), "every configured model: {index}");
    assert_eq!(
        row(&index, "chat"),
        &json!({ "name": "chat", "version": "1", "state": "READY", "reason": "" })
    );
    assert_eq!(row(&index, "slow")["state"], "LOADING");
    assert_eq!(
        row(&index, "gguf"),
        &json!({ "name": "gguf", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded" })
    );
    let broken = row(&index, "broken");
    assert_eq!(broken["state"], "UNAVAILABLE");
    assert_eq!(
        broken["reason"].as_str(),
        s.manager().model("broken").unwrap().last_error.as_deref(),
        "a failed model's reason is its last_error"
    );
    assert!(broken["reason"].as_str().unwrap().contains("boom"));
    assert_eq!(loading.await.unwrap().0, 200);

    // `slow` unloading.
    let unloading = tokio::spawn({
        let s = s.clone();
        async move { post(&s, "/v2/repository/models/slow/unload", "").await }
    });
    settle().await;
    assert_eq!(state(&s, "slow"), "unloading");
    let (_, index) = post(&s, "/v2/repository/index", "{}").await;
    assert_eq!(row(&index, "slow")["state"], "UNLOADING");
    assert_eq!(unloading.await.unwrap(), (200, json!({})));
    let (_, index) = post(&s, "/v2/repository/index", "").await;
    assert_eq!(row(&index, "slow")["state"], "UNAVAILABLE");
    assert_eq!(row(&index, "slow")["reason"], "unloaded");
}

#[tokio::test]
async fn v2_index_takes_an_empty_body_and_filters_ready_models() {
    let s = service();
    post(&s, "/v2/repository/models/chat/load", "").await;
    post(&s, "/v2/repository/models/gguf/load", "").await;

    // tritonclient sends an empty body.
    let (status, all) = post(&s, "/v2/repository/index", "").await;
    assert_eq!(status, 200);
    assert_eq!(all.as_array().unwrap().len(), 6);
    let (_, not_only_ready) = post(&s, "/v2/repository/index", r#"{"ready": false}"#).await;
    assert_eq!(not_only_ready, all);

    let (status, ready) = post(&s, "/v2/repository/index", r#"{"ready": true}"#).await;
    assert_eq!(status, 200);
    let names: Vec<&str> =
        ready.as_array().unwrap().iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["chat", "gguf"]);
    assert!(ready.as_array().unwrap().iter().all(|r| r["state"] == "READY"));

    let (status, body) = post(&s, "/v2/repository/index", r#"{"ready": "yes"}"#).await;
    assert_eq!(status, 422);
    v2_error(&body);
}
