//! `load_recommendations` per backend kind, exactly as the runtime admin spec lists them
//! ("GGUF recommended presets", "ExLlamaV3 recommended presets"). The constraints
//! themselves are declared with the fields, in `hangar-config` ([`load_constraints`]).
//!
//! The serialized JSON (keys, key order, values) is part of the admin API: the UI builds
//! its live-load controls from it. `tests/it/spec_payloads.rs` pins it against the spec text.

use std::borrow::Cow;

use crate::BackendKind;
#[cfg(test)]
use crate::{LoadConstraints, load_constraints};
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::Serialize;
use serde_json::{Map, Value, json};

/// Service-curated presets for UI defaults, as the admin API shows them under
/// `load_recommendations`. Additive: every preset value still passes `load_constraints`.
///
/// A wrapper around an ordered JSON object (`{}` for backends without presets).
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
#[serde(transparent)]
pub struct LoadRecommendations(Map<String, Value>);

impl LoadRecommendations {
    /// The preset group `name` (`gguf_cache_type_pairs`, `exllama_cache_bit_pairs`).
    pub fn get(&self, name: &str) -> Option<&Value> {
        self.0.get(name)
    }

    /// The preset groups as a JSON object.
    pub fn as_map(&self) -> &Map<String, Value> {
        &self.0
    }

    /// Whether there are no presets.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl JsonSchema for LoadRecommendations {
    fn schema_name() -> Cow<'static, str> {
        "LoadRecommendations".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "Service-curated presets for UI defaults, keyed by preset group.",
            "type": "object",
            "additionalProperties": { "type": "object" }
        })
    }
}

/// Service-curated presets for `kind`, exactly as the runtime admin spec lists them:
/// GGUF cache type pairs for `llama_cpp`, ExLlamaV3 cache bit pairs for `exllamav3`, and
/// `{}` for every other backend.
pub fn load_recommendations(kind: BackendKind) -> LoadRecommendations {
    let value = match kind {
        BackendKind::LlamaCpp => {
            let pair = |k: &str, v: &str| json!({ "label": format!("{k}/{v}"), "gguf_type_k": k, "gguf_type_v": v });
            json!({
                "gguf_cache_type_pairs": {
                    "kind": "pair_presets",
                    "fields": ["gguf_type_k", "gguf_type_v"],
                    "recommended_pairs": [
                        pair("f16", "f16"),
                        pair("q8_0", "q8_0"),
                        pair("q4_0", "q4_0"),
                    ],
                    "notes": [
                        "Service-curated presets for GGUF cache types.",
                        "Prefer symmetric GGUF K/V pairs by default; asymmetric pairs may reduce or disable GPU offload in upstream llama.cpp."
                    ]
                }
            })
        }
        BackendKind::ExLlamaV3 => json!({
            "exllama_cache_bit_pairs": {
                "kind": "pair_presets",
                "fields": ["exllama_cache_k_bits", "exllama_cache_v_bits"],
                "recommended_pairs": [
                    { "label": "fp16", "exllama_cache_k_bits": null, "exllama_cache_v_bits": null },
                    { "label": "8/8", "exllama_cache_k_bits": 8, "exllama_cache_v_bits": 8 },
                    { "label": "8/4", "exllama_cache_k_bits": 8, "exllama_cache_v_bits": 4 }
                ]
            }
        }),
        _ => json!({}),
    };
    match value {
        Value::Object(map) => LoadRecommendations(map),
        _ => LoadRecommendations::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_recommended_pair_passes_the_constraints() {
        for kind in BackendKind::ALL {
            let constraints = load_constraints(kind);
            for group in load_recommendations(kind).as_map().values() {
                for field in group["fields"].as_array().into_iter().flatten() {
                    let field = field.as_str().unwrap_or_default();
                    assert!(constraints.contains(field), "{kind}: `{field}` has no constraint");
                }
                for pair in group["recommended_pairs"].as_array().into_iter().flatten() {
                    for (field, value) in pair.as_object().into_iter().flatten() {
                        if field == "label" {
                            continue;
                        }
                        let c = constraints.get(field).unwrap();
                        assert!(value.is_null() || c.allows(value), "{kind}: {field}={value}");
                    }
                }
            }
        }
    }

    #[test]
    fn explicit_null_default_differs_from_no_default() {
        let exllama = load_constraints(BackendKind::ExLlamaV3);
        let k_bits = serde_json::to_value(exllama.get("exllama_cache_k_bits").unwrap()).unwrap();
        assert_eq!(k_bits.get("default"), Some(&Value::Null));
        let size = serde_json::to_value(exllama.get("exllama_cache_size").unwrap()).unwrap();
        assert_eq!(size.get("default"), None);
    }

    #[test]
    fn accessors_see_fields_in_spec_order() {
        let c = load_constraints(BackendKind::LlamaServer);
        assert_eq!(
            c.fields().collect::<Vec<_>>(),
            [
                "llama_server_n_ctx",
                "llama_server_image_max_tokens",
                "llama_server_spec_type",
                "llama_server_spec_draft_n_max",
                "llama_server_spec_draft_p_min",
                "gpus"
            ]
        );
        let n_max = c.get("llama_server_spec_draft_n_max").unwrap();
        assert_eq!((n_max.minimum_i64(), n_max.maximum_i64()), (Some(1), Some(6)));
        assert!(c.get("gguf_n_ctx").is_none());
        assert!(load_constraints(BackendKind::Stub).is_empty());
        assert_eq!(load_constraints(BackendKind::Vllm), load_constraints(BackendKind::VllmServe));
    }

    #[test]
    fn schemas_are_objects() {
        let schema = schemars::schema_for!(LoadConstraints);
        assert_eq!(schema.get("type"), Some(&json!("object")));
        let schema = schemars::schema_for!(LoadRecommendations);
        assert_eq!(schema.get("type"), Some(&json!("object")));
    }
}
