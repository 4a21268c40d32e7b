//! KServe v2: server metadata, liveness and readiness.

use super::*;

#[tokio::test]
async fn v2_server_metadata_names_hangar_and_the_repository_extension() {
    let s = service();
    let (status, body) = get(&s, "/v2").await;
    assert_eq!(status, 200);
    assert_eq!(
        body,
        json!({ "name": "hangar", "version": env!("CARGO_PKG_VERSION"), "extensions": ["model_repository"] })
    );
}

#[tokio::test]
async fn v2_live_answers_200() {
    let s = service();
    assert_eq!(get(&s, "/v2/health/live").await, (200, Value::Null));
}

#[tokio::test]
async fn v2_ready_is_503_until_every_enabled_model_is_loaded() {
    let s = service();
    let (status, body) = get(&s, "/v2/health/ready").await;
    assert_eq!(status, 503);
    assert!(v2_error(&body).contains("chat"), "{body}");
    // Disabled models do not count.
    assert_eq!(post(&s, "/v2/repository/models/chat/load", "").await.0, 200);
    assert_eq!(get(&s, "/v2/health/ready").await, (200, Value::Null));
}

#[tokio::test]
async fn v2_model_ready_is_200_when_loaded_400_when_not_and_404_when_unknown() {
    let s = service();
    let (status, body) = get(&s, "/v2/models/chat/ready").await;
    assert_eq!(status, 400, "Triton answers 400 for not ready");
    assert!(v2_error(&body).contains("unloaded"), "{body}");

    post(&s, "/v2/repository/models/chat/load", "{}").await;
    assert_eq!(get(&s, "/v2/models/chat/ready").await, (200, Value::Null));

    let (status, body) = get(&s, "/v2/models/nope/ready").await;
    assert_eq!(status, 404);
    v2_error(&body);

    post(&s, "/v2/repository/models/broken/load", "").await;
    let (status, body) = get(&s, "/v2/models/broken/ready").await;
    assert_eq!(status, 400);
    assert!(v2_error(&body).contains("boom"), "the failure says why: {body}");
}
