//! The trusted local agent through the real listener: `hangard` with an admin key and
//! `http.trust_local_repository_agent` answers KServe's agent calls from loopback without
//! the key (the listener knows the peer) for the repository folder's models, and nothing
//! else: a configured model and every other admin route need the key.

use serde_json::json;

use crate::support::{Server, send, temp_dir};

#[tokio::test]
async fn the_listener_lets_a_loopback_agent_call_the_repository_without_the_key() {
    let repository = temp_dir("agent-repository");
    std::fs::create_dir_all(repository.join("downloaded")).unwrap();
    let settings = json!({
        "admin_api_key": "k",
        "http": { "trust_local_repository_agent": true },
        "max_loaded_models": { "llm": 2 },
        "model_repository": repository,
        "model_repository_defaults": { "backend": "stub" },
        "models": { "chat": { "backend": "stub" } }
    });
    let server = Server::start(&settings, &[]);
    let post = reqwest::Method::POST;
    let body = json!({});
    for path in ["/v2/repository/index", "/v2/repository/models/downloaded/load"] {
        let (status, answer) = send(post.clone(), &server.url(path), Some(&body), None).await;
        assert_eq!(status, 200, "{path}: {answer}");
    }
    let configured = server.url("/v2/repository/models/chat/load");
    let (status, answer) = send(post.clone(), &configured, Some(&body), None).await;
    assert_eq!(status, 403, "a configured model is the key holder's: {answer}");
    let admin = server.url("/v1/admin/models/downloaded/unload");
    assert_eq!(send(post.clone(), &admin, Some(&body), None).await.0, 401);
    let unload = server.url("/v2/repository/models/downloaded/unload");
    assert_eq!(send(post, &unload, Some(&body), None).await.0, 200);
    std::fs::remove_dir_all(&repository).unwrap();
}
