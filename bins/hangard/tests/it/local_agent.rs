//! The trusted local agent through the real listener: `hangard` with an admin key and
//! `http.trust_local_repository_agent` answers KServe's agent calls from loopback without
//! the key (the listener knows the peer), and nothing else.

use serde_json::json;

use crate::support::{Server, send};

#[tokio::test]
async fn the_listener_lets_a_loopback_agent_call_the_repository_without_the_key() {
    let settings = json!({
        "admin_api_key": "k",
        "http": { "trust_local_repository_agent": true },
        "models": { "chat": { "backend": "stub" } }
    });
    let server = Server::start(&settings, &[]);
    let post = reqwest::Method::POST;
    let body = json!({});
    for path in ["/v2/repository/index", "/v2/repository/models/chat/load"] {
        let (status, answer) = send(post.clone(), &server.url(path), Some(&body), None).await;
        assert_eq!(status, 200, "{path}: {answer}");
    }
    let admin = server.url("/v1/admin/models/chat/unload");
    assert_eq!(send(post.clone(), &admin, Some(&body), None).await.0, 401);
    let unload = server.url("/v2/repository/models/chat/unload");
    assert_eq!(send(post, &unload, Some(&body), None).await.0, 200);
}
