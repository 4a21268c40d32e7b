//! A conversation keeps its cache across a swap (`hangard serve` over HTTP, the trained
//! SmolLM2, in-process and as a `llama-server` child): with `state_dir` set, chat's slots
//! are saved when loading another model evicts it, and the conversation's next request after
//! chat comes back reports its prompt as cached (`usage.prompt_tokens_details.cached_tokens`)
//! and answers as before.

use serde_json::{Value, json};

use crate::support::engines::{llama_server_binary, trained};
use crate::support::{Server, load, post};

fn conversation() -> Value {
    let story = "The lighthouse keeper wrote down the colour of the sea every morning, the \
                 ships that passed, and the birds that rested on the rail. ";
    json!({
        "model": "chat",
        "messages": [{ "role": "user", "content": format!("{}What did the keeper write down?", story.repeat(18)) }],
        "max_tokens": 16,
        "temperature": 0,
    })
}

const CHAT: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

#[tokio::test(flavor = "multi_thread")]
async fn a_conversation_keeps_its_cache_across_a_swap_in_process() {
    let Some(path) = trained(CHAT) else { return };
    swap(json!({ "backend": "llama_cpp", "model_path": path, "target_inflight": 2 })).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_conversation_keeps_its_cache_across_a_swap_through_llama_server() {
    let Some(path) = trained(CHAT) else { return };
    swap(json!({
        "backend": "llama_server", "model_path": path, "target_inflight": 2,
        "llama_server_binary_path": llama_server_binary(), "llama_server_n_ctx": 8192,
        "llama_server_extra_args": ["--no-webui"],
    }))
    .await;
}

/// chat (defined by `chat`) answers the conversation; loading another model evicts it;
/// the conversation's next request loads it again and finds its prompt cached.
async fn swap(chat: Value) {
    let state = crate::support::temp_dir("prompt-cache");
    let models = json!({ "chat": chat, "other": { "backend": "stub" } });
    let settings = json!({
        "state_dir": state, "auto_load": true, "max_loaded_models": { "llm": 1 }, "models": models,
    });
    let server = Server::start(&settings, &[]);
    let (status, first) = post(&server, "/v1/chat/completions", conversation()).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0, "{first}");

    // A → B: loading the other model evicts chat (one slot), which saves its cache.
    let (status, row) = load(&server, "other", json!({})).await;
    assert_eq!(status, 200, "{row}");
    let (_, chat) = crate::support::get(&server, "/v1/admin/models/chat").await;
    assert_eq!(chat["runtime_state"], "unloaded", "{chat}");
    let saved = std::fs::read_dir(state.join("prompt-cache")).unwrap().count();
    assert_eq!(saved, 1, "one model folder");

    // → A: the request loads chat again; its prompt comes from the saved cache.
    let (status, again) = post(&server, "/v1/chat/completions", conversation()).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["choices"][0]["message"], first["choices"][0]["message"]);
    let prompt = again["usage"]["prompt_tokens"].as_u64().unwrap();
    let cached = again["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    assert!(prompt > 300 && cached + 1 >= prompt, "{again}\n{}", server.logs());
    assert!(server.logs().contains("saved prompt cache restored"), "{}", server.logs());
}
