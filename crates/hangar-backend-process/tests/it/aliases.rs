//! A request that names a model by one of its aliases reaches engines that check `model`:
//! a `vllm_serve` child serves the model's name alone (one `--served-model-name=` element)
//! and a request naming an alias is renamed to it, as an `openai_remote` model renames the
//! request to the name the remote server knows. The remote here is the fake `vllm serve`,
//! which answers 404 to a `model` it does not serve, as vLLM does.

use std::sync::Arc;

use bytes::Bytes;
use hangar_backend::{
    Backend, ForwardRequest, ForwardRoute, LoadRequest, Runtime, RuntimeError, ThinkingMode,
};
use hangar_backend_process::{ProcessBackend, RemoteBackend};
use serde_json::{Value, json};

use crate::support::{FAKE, named};

/// The status a chat request naming `model` gets from `runtime`, or the engine's refusal.
async fn status(runtime: &Arc<dyn Runtime>, model: &str) -> Result<u16, RuntimeError> {
    let body = json!({ "model": model, "max_tokens": 2, "messages": [{ "role": "user", "content": "hi" }] });
    let request = ForwardRequest {
        route: ForwardRoute::ChatCompletions,
        body: Bytes::from(body.to_string()),
        thinking: ThinkingMode::Default,
        max_answer_bytes: 1 << 20,
    };
    let mut answer = runtime.forward(request).await?;
    while let Some(chunk) = answer.body.recv().await {
        chunk.expect("read");
    }
    Ok(answer.status)
}

#[tokio::test(flavor = "multi_thread")]
async fn an_alias_reaches_a_vllm_child_and_a_remote_server_that_check_the_model() {
    // The fake is started as model `fake`, serving its alias too, on a port (a host named)
    // that the remote models below reach.
    let child = json!({
        "backend": "vllm_serve", "vllm_binary_path": FAKE, "vllm_model": "m",
        "vllm_host": "127.0.0.1",
        "vllm_api_key": "k", "aliases": ["publishers/default/models/fake"],
        "vllm_env": { "FAKE_VLLM_TOKENS": "2", "FAKE_VLLM_TOKEN_DELAY_MS": "0" },
    });
    let vllm = ProcessBackend::vllm_serve();
    let served = vllm.load(LoadRequest::new(named(child), 0, 1)).await.expect("loaded");
    assert_eq!(status(&served, "publishers/default/models/fake").await, Ok(200));
    assert_eq!(status(&served, "fake").await, Ok(200));
    // The child serves one name: a remote model that knows it by the alias is refused.
    let url: Value = served.details()["backend_url"].clone();
    let by_alias = json!({
        "backend": "openai_remote", "openai_base_url": url, "openai_api_key": "k",
        "openai_model": "publishers/default/models/fake",
    });
    let by_alias = RemoteBackend.load(LoadRequest::new(named(by_alias), 0, 1)).await.unwrap();
    let refused = status(&by_alias, "fake").await;
    assert!(
        matches!(&refused, Err(RuntimeError::InvalidRequest { message }) if message.contains("does not exist")),
        "the child serves its model's name alone: {refused:?}"
    );
    by_alias.unload().await;

    // A remote model `fake` with an alias: a request naming the alias is renamed to `fake`.
    let remote = json!({
        "backend": "openai_remote", "openai_base_url": url, "openai_api_key": "k",
        "aliases": ["fake-latest"],
    });
    let remote = RemoteBackend.load(LoadRequest::new(named(remote), 0, 1)).await.expect("loaded");
    assert_eq!(status(&remote, "fake-latest").await, Ok(200));
    assert_eq!(status(&remote, "fake").await, Ok(200));
    remote.unload().await;
    served.unload().await;
}
