//! Live-load fields: the config fields a load request may override for one load.
//!
//! Each field is declared once, in [`LOAD_FIELDS`], with the UI constraint the admin API
//! shows for it. Everything else derives from that declaration and from the section struct
//! that declares the field (`sections.rs`): which backends accept it, its JSON value type,
//! the per-backend [`load_constraints`] payload (in declaration order, which is the spec's),
//! the override validator in `hangar-backend`, and the Lemonade `ctx_size` mapping
//! ([`context_size_field`]).

use std::sync::LazyLock;

use serde_json::{Number, Value, json};

use crate::constraint::{ConstraintKind, LoadConstraint, LoadConstraints};
use crate::kinds::{BackendKind, GgmlType};
use crate::validate::MODEL_SECTIONS;

/// The JSON type a live-load field takes (besides `null`, which every field accepts),
/// read from the field's declaration in its section struct.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadValueType {
    /// A positive integer no larger than `max` (the field's Rust integer type).
    PositiveInt {
        /// The largest value the field's type holds.
        max: u64,
    },
    /// A number.
    Float,
    /// A string (free text or one of an enum's names).
    Str,
    /// A list of GPU indices.
    IndexList,
}

/// One live-load field.
#[derive(Debug)]
pub struct LoadField {
    /// The config field's name.
    pub name: &'static str,
    /// What the admin API's `load_constraints` shows for it.
    pub constraint: LoadConstraint,
    /// Whether this is its backend's context size (what a Lemonade `ctx_size` sets).
    pub context_size: bool,
    /// The backends whose models accept it (those of its section).
    pub backends: &'static [BackendKind],
    /// Its JSON type.
    pub value_type: LoadValueType,
}

/// The declaration: name, constraint, context-size role. Order is the spec's order within
/// each backend.
fn declare() -> Vec<(&'static str, LoadConstraint, bool)> {
    use ConstraintKind::*;
    let cache_type = || {
        LoadConstraint::new(StringOrNull)
            .format("ggml_type_name")
            .default_value(json!("f16"))
            .allowed(GgmlType::ALL.map(GgmlType::as_str))
            .examples(["f16", "q8_0", "q4_0"])
    };
    let bits = || {
        LoadConstraint::new(IntegerOrNull)
            .range(Some(2.into()), Some(8.into()))
            .default_value(Value::Null)
            .allowed(2..=8)
            .null_means("fp16")
    };
    let speculative = |format: &str, examples: &[&str]| {
        LoadConstraint::new(StringOrNull)
            .format(format)
            .default_value(Value::Null)
            .examples(examples.iter().copied())
    };
    vec![
        // llama_cpp
        ("gguf_n_ctx", LoadConstraint::integer(1, 1), true),
        (
            "gguf_flash_attn",
            LoadConstraint::new(Enum)
                .default_value(json!("auto"))
                .allowed(["on", "off", "auto"])
                .examples(["auto", "on", "off"]),
            false,
        ),
        ("gguf_type_k", cache_type(), false),
        ("gguf_type_v", cache_type(), false),
        // exllamav3
        ("exllama_cache_size", LoadConstraint::integer(256, 256), true),
        ("exllama_max_rq_tokens", LoadConstraint::integer(1, 1), false),
        ("exllama_cache_k_bits", bits(), false),
        ("exllama_cache_v_bits", bits(), false),
        (
            "exllama_cache_quant",
            LoadConstraint::new(StringOrNull).format("<bits>|<k_bits>,<v_bits>"),
            false,
        ),
        // vllm, vllm_serve
        ("vllm_max_model_len", LoadConstraint::integer(256, 256), true),
        (
            "vllm_kv_cache_dtype",
            LoadConstraint::new(Enum)
                .default_value(json!("auto"))
                .allowed(["auto", "fp8", "fp8_e4m3", "fp8_e5m2"])
                .examples(["auto", "fp8"]),
            false,
        ),
        (
            "vllm_kv_cache_memory_bytes",
            LoadConstraint::integer(268_435_456, 268_435_456).unit("bytes", Some("mib")),
            false,
        ),
        ("vllm_max_pixels", LoadConstraint::integer(200_704, 200_704).unit("pixels", None), false),
        (
            "vllm_speculative_method",
            speculative("vllm_speculative_method", &["mtp", "draft_model", "mlp_speculator"]),
            false,
        ),
        (
            "vllm_speculative_model",
            speculative("hf_id_or_local_path", &["google/gemma-4-26B-A4B-it-assistant"]),
            false,
        ),
        (
            "vllm_num_speculative_tokens",
            LoadConstraint::integer(1, 1).default_value(json!(1)),
            false,
        ),
        // llama_server
        ("llama_server_n_ctx", LoadConstraint::integer(1, 1), true),
        ("llama_server_image_max_tokens", LoadConstraint::integer(1, 1), false),
        (
            "llama_server_spec_type",
            LoadConstraint::new(Enum)
                .default_value(json!("draft-mtp"))
                .allowed(["draft-mtp"])
                .examples(["draft-mtp"]),
            false,
        ),
        (
            "llama_server_spec_draft_n_max",
            LoadConstraint::integer(1, 1).range(None, Some(6.into())).default_value(json!(2)),
            false,
        ),
        (
            "llama_server_spec_draft_p_min",
            LoadConstraint::new(Float)
                .range(Number::from_f64(0.0), Number::from_f64(1.0))
                .default_value(json!(0.0)),
            false,
        ),
        // Every engine that runs on GPUs (Hangar's addition, last in each list).
        (
            "gpus",
            LoadConstraint::new(GpuList)
                .range(Some(0.into()), Some((crate::MAX_GPUS - 1).into()))
                .default_value(Value::Null)
                .null_means("any GPU the definition allows")
                .examples([json!([0]), json!([0, 1])]),
            false,
        ),
    ]
}

/// The engines whose models a load may place on chosen GPUs (`gpus` is a common field, but
/// only these run on GPUs).
const GPU_BACKENDS: &[BackendKind] = &[
    BackendKind::LlamaCpp,
    BackendKind::LlamaServer,
    BackendKind::Vllm,
    BackendKind::VllmServe,
    BackendKind::ExLlamaV3,
    BackendKind::Ct2,
];

/// Every live-load field, in declaration order.
pub static LOAD_FIELDS: LazyLock<Vec<LoadField>> = LazyLock::new(|| {
    declare()
        .into_iter()
        .map(|(name, constraint, context_size)| {
            let section = MODEL_SECTIONS
                .iter()
                .find(|s| s.has(name))
                .unwrap_or_else(|| panic!("live-load field `{name}` is not a config field"));
            let value_type = value_type(section.properties.get(name).unwrap_or(&Value::Null));
            let backends = if name == "gpus" { GPU_BACKENDS } else { section.backends };
            LoadField { name, constraint, context_size, backends, value_type }
        })
        .collect()
});

/// The JSON type of a field from its (inlined) JSON Schema.
fn value_type(schema: &Value) -> LoadValueType {
    let types: Vec<&str> = match schema.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    if types.contains(&"integer") {
        let max = match schema.get("format").and_then(Value::as_str) {
            Some("uint8") => u64::from(u8::MAX),
            Some("uint16") => u64::from(u16::MAX),
            Some("uint32") => u64::from(u32::MAX),
            _ => u64::MAX,
        };
        LoadValueType::PositiveInt { max }
    } else if types.contains(&"number") {
        LoadValueType::Float
    } else if types.contains(&"array") {
        LoadValueType::IndexList
    } else {
        LoadValueType::Str
    }
}

/// The live-load field `name`, whichever backend owns it.
pub fn load_field(name: &str) -> Option<&'static LoadField> {
    LOAD_FIELDS.iter().find(|f| f.name == name)
}

/// The live-load fields of `kind`, in the spec's order.
pub fn load_fields(kind: BackendKind) -> impl Iterator<Item = &'static LoadField> {
    LOAD_FIELDS.iter().filter(move |f| f.backends.contains(&kind))
}

/// The live-load fields of `kind` and their constraints, exactly as the runtime admin spec
/// lists them. `vllm` and `vllm_serve` share one shape; `ct2`, `openai_remote` and `stub`
/// have none.
pub fn load_constraints(kind: BackendKind) -> LoadConstraints {
    LoadConstraints(load_fields(kind).map(|f| (f.name, f.constraint.clone())).collect())
}

/// The field that holds `kind`'s context size, if it has one among its live-load fields.
pub fn context_size_field(kind: BackendKind) -> Option<&'static str> {
    load_fields(kind).find(|f| f.context_size).map(|f| f.name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_come_from_the_section_structs() {
        let ty = |name| load_field(name).unwrap().value_type;
        assert_eq!(ty("gguf_n_ctx"), LoadValueType::PositiveInt { max: u64::from(u32::MAX) });
        assert_eq!(ty("exllama_cache_k_bits"), LoadValueType::PositiveInt { max: 255 });
        assert_eq!(ty("vllm_kv_cache_memory_bytes"), LoadValueType::PositiveInt { max: u64::MAX });
        assert_eq!(ty("llama_server_spec_draft_p_min"), LoadValueType::Float);
        assert_eq!(ty("gguf_type_k"), LoadValueType::Str);
        assert_eq!(ty("llama_server_spec_type"), LoadValueType::Str);
        assert_eq!(ty("gpus"), LoadValueType::IndexList);
    }

    #[test]
    fn backends_come_from_the_section_structs() {
        assert_eq!(
            load_field("vllm_max_model_len").unwrap().backends,
            [BackendKind::Vllm, BackendKind::VllmServe]
        );
        assert_eq!(load_field("gguf_n_ctx").unwrap().backends, [BackendKind::LlamaCpp]);
    }

    #[test]
    fn every_backend_has_at_most_one_context_field() {
        for kind in BackendKind::ALL {
            assert!(load_fields(kind).filter(|f| f.context_size).count() <= 1, "{kind}");
        }
        assert_eq!(context_size_field(BackendKind::ExLlamaV3), Some("exllama_cache_size"));
        assert_eq!(context_size_field(BackendKind::Stub), None);
    }

    #[test]
    fn integer_kinds_match_integer_types() {
        for field in LOAD_FIELDS.iter() {
            let integral = matches!(field.value_type, LoadValueType::PositiveInt { .. });
            let kind = field.constraint.kind;
            let integer_kind =
                matches!(kind, ConstraintKind::Integer | ConstraintKind::IntegerOrNull);
            assert_eq!(integral, integer_kind, "{}: {kind:?}", field.name);
        }
    }
}
