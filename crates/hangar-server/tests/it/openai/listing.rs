//! The model list and the request metrics.

use super::*;

#[tokio::test(start_paused = true)]
async fn models_list_every_configured_model_with_its_state() {
    let svc = service().await;
    let (status, body) = get(&svc, "/v1/models").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["object"], "list");
    let data = body["data"].as_array().unwrap();
    let ids: Vec<&str> = data.iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(
        ids,
        [
            "chat",
            "fixed",
            "thinker",
            "slow",
            "crashy",
            "embed",
            "rerank",
            "cold",
            "cold-rerank",
            "broken"
        ]
    );
    for m in data {
        assert_eq!((m["object"].as_str(), m["owned_by"].as_str()), (Some("model"), Some("hangar")));
        assert!(m["created"].as_u64().is_some());
    }
    let row = |id: &str| data.iter().find(|m| m["id"] == id).unwrap().clone();
    assert_eq!(
        (row("chat")["runtime_state"].as_str(), row("chat")["type"].as_str()),
        (Some("loaded"), Some("llm"))
    );
    assert_eq!(row("cold")["runtime_state"], "unloaded");
    assert_eq!(row("broken")["runtime_state"], "failed");
    assert_eq!(row("embed")["type"], "embedding");
    assert_eq!(row("rerank")["type"], "reranking");

    let (status, one) = get(&svc, "/v1/models/embed").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(one, row("embed"));
    assert_error(&get(&svc, "/v1/models/nope").await, 404, "unknown_model");
}

#[tokio::test(start_paused = true)]
async fn every_inference_request_is_counted_by_endpoint_model_and_outcome() {
    let svc = service().await;
    post(&svc, "/v1/chat/completions", chat_body("fixed", "hi", json!({}))).await;
    stream(&svc, "/v1/chat/completions", chat_body("fixed", "hi", json!({ "stream": true }))).await;
    post(&svc, "/v1/chat/completions", chat_body("nope", "hi", json!({}))).await;
    post(&svc, "/v1/chat/completions", chat_body("cold", "hi", json!({}))).await;
    call(&svc, Method::POST, "/v1/chat/completions", "{").await;
    post(&svc, "/v1/embeddings", json!({ "model": "embed", "input": "x" })).await;
    post(&svc, "/v1/rerank", json!({ "model": "rerank", "query": "q", "documents": ["d"] })).await;
    post(&svc, "/v1/responses", json!({ "model": "fixed", "input": "x", "thinking": "enabled" }))
        .await;
    post(&svc, "/v1/completions", json!({ "model": "chat", "prompt": "x" })).await;
    let text = metrics(&svc).await;
    for line in [
        r#"hangar_requests_total{endpoint="chat_completions",model="fixed",outcome="ok"} 2"#,
        r#"hangar_requests_total{endpoint="chat_completions",model="_unknown",outcome="unknown_model"} 1"#,
        r#"hangar_requests_total{endpoint="chat_completions",model="cold",outcome="model_not_loaded"} 1"#,
        r#"hangar_requests_total{endpoint="chat_completions",model="_unknown",outcome="invalid_request_body"} 1"#,
        r#"hangar_requests_total{endpoint="embeddings",model="embed",outcome="ok"} 1"#,
        r#"hangar_requests_total{endpoint="rerank",model="rerank",outcome="ok"} 1"#,
        r#"hangar_requests_total{endpoint="responses",model="fixed",outcome="thinking_unsupported"} 1"#,
        r#"hangar_requests_total{endpoint="completions",model="chat",outcome="ok"} 1"#,
    ] {
        assert!(text.contains(line), "missing {line} in\n{text}");
    }
}
