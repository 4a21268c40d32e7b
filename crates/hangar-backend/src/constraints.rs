//! `load_constraints` and `load_recommendations` per backend kind, exactly as the runtime
//! admin spec lists them ("Current load_constraints Shapes", "GGUF recommended presets",
//! "ExLlamaV3 recommended presets").
//!
//! The serialized JSON (keys, key order, values) is part of the admin API: the UI builds
//! its live-load controls from it. `tests/spec_payloads.rs` pins it against the spec text.

use std::borrow::Cow;

use hangar_config::{BackendKind, GgmlType};
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Number, Value, json};

/// The kind of UI control a load constraint describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ConstraintKind {
    /// A whole number (`minimum`, optional `maximum`, `step`).
    Integer,
    /// One of `allowed_values`.
    Enum,
    /// A string, or `null` for the runtime default.
    StringOrNull,
    /// A whole number, or `null` (see `null_means`).
    IntegerOrNull,
    /// A real number between `minimum` and `maximum`.
    Float,
}

/// One live-load field's constraint, as the admin API shows it under `load_constraints`.
///
/// Fields are declared in the order the spec prints them, and absent ones are not
/// serialized. `default` distinguishes "no default" (`None`, key absent) from an explicit
/// `"default": null` (`Some(Value::Null)`).
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct LoadConstraint {
    /// The control kind.
    pub kind: ConstraintKind,
    /// A named value format (`ggml_type_name`, `<bits>|<k_bits>,<v_bits>`, …).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub format: Option<String>,
    /// The smallest accepted value.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub minimum: Option<Number>,
    /// The largest accepted value.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub maximum: Option<Number>,
    /// The increment a UI control should use.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<Number>,
    /// The concrete runtime default; `Some(Value::Null)` is an explicit `null` default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default: Option<Value>,
    /// What `null` stands for (`fp16`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub null_means: Option<String>,
    /// The values a UI should offer (and, except where noted, the only ones accepted).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allowed_values: Vec<Value>,
    /// Example values, most useful first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub examples: Vec<Value>,
    /// The unit of the value (`bytes`, `pixels`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
    /// The unit a UI should display the value in (`mib`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub display_unit: Option<String>,
}

impl LoadConstraint {
    /// A constraint of `kind` with nothing else set.
    pub fn new(kind: ConstraintKind) -> Self {
        Self {
            kind,
            format: None,
            minimum: None,
            maximum: None,
            step: None,
            default: None,
            null_means: None,
            allowed_values: Vec::new(),
            examples: Vec::new(),
            unit: None,
            display_unit: None,
        }
    }

    /// An integer constraint with `minimum` and `step`.
    fn integer(minimum: u64, step: u64) -> Self {
        Self {
            minimum: Some(minimum.into()),
            step: Some(step.into()),
            ..Self::new(ConstraintKind::Integer)
        }
    }

    fn format(mut self, format: &str) -> Self {
        self.format = Some(format.to_owned());
        self
    }

    fn maximum(mut self, maximum: impl Into<Number>) -> Self {
        self.maximum = Some(maximum.into());
        self
    }

    fn default_value(mut self, default: Value) -> Self {
        self.default = Some(default);
        self
    }

    fn allowed(mut self, values: impl IntoIterator<Item = impl Into<Value>>) -> Self {
        self.allowed_values = values.into_iter().map(Into::into).collect();
        self
    }

    fn examples(mut self, values: impl IntoIterator<Item = impl Into<Value>>) -> Self {
        self.examples = values.into_iter().map(Into::into).collect();
        self
    }

    fn unit(mut self, unit: &str) -> Self {
        self.unit = Some(unit.to_owned());
        self
    }

    /// The minimum as an integer, when there is one and it is integral.
    pub fn minimum_i64(&self) -> Option<i64> {
        self.minimum.as_ref().and_then(Number::as_i64)
    }

    /// The maximum as an integer, when there is one and it is integral.
    pub fn maximum_i64(&self) -> Option<i64> {
        self.maximum.as_ref().and_then(Number::as_i64)
    }

    /// Whether `value` is one of `allowed_values`.
    pub fn allows(&self, value: &Value) -> bool {
        self.allowed_values.contains(value)
    }
}

/// The live-load fields of one backend kind and their constraints, in the spec's order.
///
/// Serializes as a JSON object keyed by field name; `{}` for backends without live-load
/// fields.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LoadConstraints(Vec<(&'static str, LoadConstraint)>);

impl LoadConstraints {
    /// The constraint of `field`, if it is a live-load field of this backend.
    pub fn get(&self, field: &str) -> Option<&LoadConstraint> {
        self.0.iter().find(|(name, _)| *name == field).map(|(_, c)| c)
    }

    /// Whether `field` is a live-load field of this backend.
    pub fn contains(&self, field: &str) -> bool {
        self.get(field).is_some()
    }

    /// The field names, in order.
    pub fn fields(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.0.iter().map(|(name, _)| *name)
    }

    /// Field names with their constraints, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, &LoadConstraint)> + '_ {
        self.0.iter().map(|(name, c)| (*name, c))
    }

    /// How many fields there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the backend has no live-load fields.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Serialize for LoadConstraints {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (name, constraint) in &self.0 {
            map.serialize_entry(name, constraint)?;
        }
        map.end()
    }
}

impl JsonSchema for LoadConstraints {
    fn schema_name() -> Cow<'static, str> {
        "LoadConstraints".into()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        let constraint = generator.subschema_for::<LoadConstraint>();
        json_schema!({
            "description": "Live-load fields of the model's backend, keyed by field name.",
            "type": "object",
            "additionalProperties": constraint
        })
    }
}

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

/// The live-load fields of `kind` and their constraints, exactly as the runtime admin spec
/// lists them. `vllm` and `vllm_serve` share one shape; `ct2`, `openai_remote` and `stub`
/// have none.
pub fn load_constraints(kind: BackendKind) -> LoadConstraints {
    use ConstraintKind::*;
    let fields: Vec<(&'static str, LoadConstraint)> = match kind {
        BackendKind::LlamaCpp => {
            let cache_type = || {
                LoadConstraint::new(StringOrNull)
                    .format("ggml_type_name")
                    .default_value(json!("f16"))
                    .allowed(GgmlType::ALL.map(GgmlType::as_str))
                    .examples(["f16", "q8_0", "q4_0"])
            };
            vec![
                ("gguf_n_ctx", LoadConstraint::integer(1, 1)),
                (
                    "gguf_flash_attn",
                    LoadConstraint::new(Enum)
                        .default_value(json!("auto"))
                        .allowed(["on", "off", "auto"])
                        .examples(["auto", "on", "off"]),
                ),
                ("gguf_type_k", cache_type()),
                ("gguf_type_v", cache_type()),
            ]
        }
        BackendKind::ExLlamaV3 => {
            let bits = || {
                let mut c = LoadConstraint::new(IntegerOrNull)
                    .maximum(8)
                    .default_value(Value::Null)
                    .allowed(2..=8);
                c.minimum = Some(2.into());
                c.null_means = Some("fp16".to_owned());
                c
            };
            vec![
                ("exllama_cache_size", LoadConstraint::integer(256, 256)),
                ("exllama_max_rq_tokens", LoadConstraint::integer(1, 1)),
                ("exllama_cache_k_bits", bits()),
                ("exllama_cache_v_bits", bits()),
                (
                    "exllama_cache_quant",
                    LoadConstraint::new(StringOrNull).format("<bits>|<k_bits>,<v_bits>"),
                ),
            ]
        }
        BackendKind::Vllm | BackendKind::VllmServe => {
            let mut memory = LoadConstraint::integer(268_435_456, 268_435_456).unit("bytes");
            memory.display_unit = Some("mib".to_owned());
            vec![
                ("vllm_max_model_len", LoadConstraint::integer(256, 256)),
                (
                    "vllm_kv_cache_dtype",
                    LoadConstraint::new(Enum)
                        .default_value(json!("auto"))
                        .allowed(["auto", "fp8", "fp8_e4m3", "fp8_e5m2"])
                        .examples(["auto", "fp8"]),
                ),
                ("vllm_kv_cache_memory_bytes", memory),
                ("vllm_max_pixels", LoadConstraint::integer(200_704, 200_704).unit("pixels")),
                (
                    "vllm_speculative_method",
                    LoadConstraint::new(StringOrNull)
                        .format("vllm_speculative_method")
                        .default_value(Value::Null)
                        .examples(["mtp", "draft_model", "mlp_speculator"]),
                ),
                (
                    "vllm_speculative_model",
                    LoadConstraint::new(StringOrNull)
                        .format("hf_id_or_local_path")
                        .default_value(Value::Null)
                        .examples(["google/gemma-4-26B-A4B-it-assistant"]),
                ),
                (
                    "vllm_num_speculative_tokens",
                    LoadConstraint::integer(1, 1).default_value(json!(1)),
                ),
            ]
        }
        BackendKind::LlamaServer => {
            let mut p_min = LoadConstraint::new(Float).default_value(json!(0.0));
            p_min.minimum = Number::from_f64(0.0);
            p_min.maximum = Number::from_f64(1.0);
            vec![
                ("llama_server_n_ctx", LoadConstraint::integer(1, 1)),
                ("llama_server_image_max_tokens", LoadConstraint::integer(1, 1)),
                (
                    "llama_server_spec_type",
                    LoadConstraint::new(Enum)
                        .default_value(json!("draft-mtp"))
                        .allowed(["draft-mtp"])
                        .examples(["draft-mtp"]),
                ),
                (
                    "llama_server_spec_draft_n_max",
                    LoadConstraint::integer(1, 1).maximum(6).default_value(json!(2)),
                ),
                ("llama_server_spec_draft_p_min", p_min),
            ]
        }
        _ => Vec::new(),
    };
    LoadConstraints(fields)
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
                "llama_server_spec_draft_p_min"
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
