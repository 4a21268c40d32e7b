//! The fake `vllm serve` the tests run (`tests/fake-vllm/vllm`) and its models.

use std::sync::Arc;

use hangar_config::{ModelConfig, ModelName};
use serde_json::{Value, json};

/// The fake's path.
pub(crate) const FAKE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fake-vllm/vllm");

/// A `vllm_serve` model called `fake` on the fake, with `extra` fields.
pub(crate) fn model(extra: Value) -> Arc<ModelConfig> {
    let mut value = json!({
        "backend": "vllm_serve",
        "vllm_binary_path": FAKE,
        "vllm_model": "Qwen/Qwen3-0.6B",
        "load_timeout_s": 30,
    });
    for (k, v) in extra.as_object().unwrap() {
        value[k] = v.clone();
    }
    named(value)
}

/// The model `value` called `fake`.
pub(crate) fn named(value: Value) -> Arc<ModelConfig> {
    Arc::new(ModelConfig::parse(&ModelName::new("fake").unwrap(), &value).expect("valid model"))
}
