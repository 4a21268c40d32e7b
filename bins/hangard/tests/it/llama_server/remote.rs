//! `openai_remote` forwarding to a real `llama-server`.

use super::*;

#[tokio::test(flavor = "multi_thread")]
async fn openai_remote_forwards_to_a_real_llama_server() {
    let remote = Standalone::start(&fixture("tiny-llama.gguf"), &["--api-key", "secret123"]).await;
    let base = format!("http://127.0.0.1:{}/v1", remote.port());
    let closed = format!("http://127.0.0.1:{}/v1", free_port());
    let models = json!({
        "remote": { "backend": "openai_remote", "openai_base_url": base, "openai_api_key_env": "REMOTE_KEY_FOR_TEST" },
        "wrong-key": { "backend": "openai_remote", "openai_base_url": base, "openai_api_key_env": "REMOTE_WRONG_KEY" },
        "closed": { "backend": "openai_remote", "openai_base_url": closed, "openai_api_key_env": "REMOTE_KEY_FOR_TEST" },
    });
    let env = [("REMOTE_KEY_FOR_TEST", "secret123"), ("REMOTE_WRONG_KEY", "not-the-key")];
    let server = Server::start_with(&config(models), &[], &env);

    let (status, loaded) = load(&server, "remote", json!({})).await;
    assert_eq!((status, loaded["runtime_state"].as_str()), (200, Some("loaded")), "{loaded}");
    let (status, body) = post(&server, "/v1/chat/completions", chat_body("remote", 8)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["object"], "chat.completion", "{body}");
    assert_eq!(body["usage"]["completion_tokens"], 8, "{body}");
    assert!(body["usage"]["prompt_tokens"].as_u64() > Some(0), "{body}");
    let shown = row(&server, "remote").await;
    assert!(!shown.to_string().contains("secret123"), "the key leaks into the row: {shown}");
    assert!(
        !loaded.to_string().contains("secret123"),
        "the key leaks into the load answer: {loaded}"
    );

    let (status, body) = load(&server, "wrong-key", json!({})).await;
    assert_eq!((status, code(&body)), (400, "load_failed"), "{body}");
    assert!(message(&body).contains("refused"), "{body}");
    assert!(
        !body.to_string().contains("secret123") && !body.to_string().contains("not-the-key"),
        "{body}"
    );

    let (status, body) = load(&server, "closed", json!({})).await;
    assert_eq!((status, code(&body)), (400, "load_failed"), "{body}");
    assert!(message(&body).contains("unreachable"), "{body}");
    assert_eq!(row(&server, "closed").await["runtime_state"], "failed");
}
