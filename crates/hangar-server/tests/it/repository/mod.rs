//! The KServe v2 / Triton model repository (`/v2/…`) and the Lemonade-style multi-model
//! routes (`/api/v1/…`), driven in-process through `HangarService::handle` over a manager
//! on the stub backend (standing in for llama_cpp and llama_server too).

mod folder;
mod health;
mod load;
mod unload;
mod v2_health;
mod v2_index;
mod v2_load;
mod v2_unload;

use std::time::Duration;

use hangar_config::BackendKind;
use hangar_runtime::LoadOptions;
use hangar_server::HangarService;
use serde_json::{Value, json};

use crate::support::{Builder, get, post, server, state};

// ---------------------------------------------------------------------------------------
// Helpers

/// A config with one model of each kind the tests need.
fn models() -> Value {
    json!({
        "max_loaded_models": { "llm": 8 },
        "models": {
            "chat": { "backend": "stub", "enabled": true },
            "gguf": { "backend": "llama_cpp", "model_path": "/models/qwen3-8b.gguf", "replica_max": 2 },
            "server": {
                "backend": "llama_server",
                "model_path": "/models/gemma.gguf",
                "llama_server_extra_args": ["--jinja"],
                "llama_server_backends": { "vulkan": "/opt/llama-vulkan/llama-server" }
            },
            "exl": { "backend": "exllamav3", "model_path": "/models/exl3" },
            "slow": { "backend": "stub", "stub": { "load_delay_ms": 1000, "unload_delay_ms": 1000 } },
            "broken": { "backend": "stub", "stub": { "fail_load": "boom" } },
        }
    })
}

/// A service over [`models`] with stub engines standing in for llama_cpp and llama_server.
fn service_with() -> Builder {
    server().settings(models()).stub_kinds([BackendKind::LlamaCpp, BackendKind::LlamaServer])
}

fn service() -> HangarService {
    service_with().build()
}

/// Asserts the KServe v2 error envelope: exactly `{"error": "<non-empty string>"}`.
#[track_caller]
fn v2_error(body: &Value) -> &str {
    let obj = body.as_object().unwrap_or_else(|| panic!("not an object: {body}"));
    assert_eq!(obj.len(), 1, "only `error`: {body}");
    let message = obj["error"].as_str().unwrap_or_else(|| panic!("error is no string: {body}"));
    assert!(!message.is_empty());
    message
}

/// Asserts the standard envelope and answers its code.
#[track_caller]
fn api_code(body: &Value) -> &str {
    assert!(body["error"]["message"].is_string(), "{body}");
    body["error"]["code"].as_str().unwrap_or_else(|| panic!("no code: {body}"))
}

/// One row of the repository index by name.
fn row<'a>(index: &'a Value, name: &str) -> &'a Value {
    index
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["name"] == name))
        .unwrap_or_else(|| panic!("{name} not in {index}"))
}

/// Lets spawned tasks run until they block (paused clock: advances 1 ms).
async fn settle() {
    tokio::time::sleep(Duration::from_millis(1)).await;
}
