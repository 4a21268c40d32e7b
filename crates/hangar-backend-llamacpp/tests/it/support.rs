//! What the tests of this crate share: llama.cpp initialised once per process, with
//! its log lines routed into `tracing` as the composition root (`hangard`) does, so that a
//! failed load carries llama.cpp's own reason; and the tiny chat fixture as a model config.

use std::sync::{Arc, OnceLock};

use hangar_backend::LoadRequest;
use hangar_backend_llamacpp::llama_cpp_2::{self, LogOptions, llama_backend::LlamaBackend};
use hangar_config::{ModelConfig, ModelName};
use serde_json::{Value, json};

/// The process's llama.cpp backend, with the log hook installed.
pub(crate) fn llama() -> Arc<LlamaBackend> {
    static LLAMA: OnceLock<Arc<LlamaBackend>> = OnceLock::new();
    Arc::clone(LLAMA.get_or_init(|| {
        llama_cpp_2::send_logs_to_tracing(LogOptions::default());
        Arc::new(LlamaBackend::init().expect("llama.cpp initialises once per process"))
    }))
}

/// The path of a committed fixture model.
pub(crate) fn fixture(name: &str) -> String {
    format!("{}/../../fixtures/models/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// A `llama_cpp` model `tiny` on the tiny chat GGUF, with the fields of `extra` set.
pub(crate) fn tiny(extra: Value) -> Arc<ModelConfig> {
    let mut value = json!({ "backend": "llama_cpp", "model_path": fixture("tiny-llama.gguf") });
    for (k, v) in extra.as_object().expect("object") {
        value[k] = v.clone();
    }
    Arc::new(ModelConfig::parse(&ModelName::new("tiny").unwrap(), &value).expect("valid model"))
}

/// The load of replica `replica` of `replicas` of `model`.
pub(crate) fn load_request(model: Arc<ModelConfig>, replica: u32, replicas: u32) -> LoadRequest {
    LoadRequest::new(model, replica, replicas)
}
