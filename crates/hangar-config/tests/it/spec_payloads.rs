//! The `load_constraints` and `load_recommendations` payloads, pinned against the runtime
//! admin spec: every JSON block below is copied verbatim from
//! `shared/specs/runtime-admin-api.md`, and the serialized values must match them key for key,
//! in the same key order.

use hangar_config::BackendKind;
use hangar_config::{load_constraints, load_recommendations};
use serde_json::{Value, json};

/// Spec, "Current load_constraints Shapes" / presets: llama_cpp GGUF.
const LLAMA_CPP_CONSTRAINTS: &str = r#"{
  "gguf_n_ctx": {
    "kind": "integer",
    "minimum": 1,
    "step": 1
  },
  "gguf_flash_attn": {
    "kind": "enum",
    "default": "auto",
    "allowed_values": ["on", "off", "auto"],
    "examples": ["auto", "on", "off"]
  },
  "gguf_type_k": {
    "kind": "string_or_null",
    "format": "ggml_type_name",
    "default": "f16",
    "allowed_values": ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"],
    "examples": ["f16", "q8_0", "q4_0"]
  },
  "gguf_type_v": {
    "kind": "string_or_null",
    "format": "ggml_type_name",
    "default": "f16",
    "allowed_values": ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"],
    "examples": ["f16", "q8_0", "q4_0"]
  }
}"#;

/// Spec, "Current load_constraints Shapes" / presets: GGUF recommended presets.
const GGUF_PRESETS: &str = r#"{
  "gguf_cache_type_pairs": {
    "kind": "pair_presets",
    "fields": ["gguf_type_k", "gguf_type_v"],
    "recommended_pairs": [
      {
        "label": "f16/f16",
        "gguf_type_k": "f16",
        "gguf_type_v": "f16"
      },
      {
        "label": "q8_0/q8_0",
        "gguf_type_k": "q8_0",
        "gguf_type_v": "q8_0"
      },
      {
        "label": "q4_0/q4_0",
        "gguf_type_k": "q4_0",
        "gguf_type_v": "q4_0"
      }
    ]
  }
}"#;

/// Spec, "Current load_constraints Shapes" / presets: ExLlamaV3.
const EXLLAMA_CONSTRAINTS: &str = r#"{
  "exllama_cache_size": {
    "kind": "integer",
    "minimum": 256,
    "step": 256
  },
  "exllama_max_rq_tokens": {
    "kind": "integer",
    "minimum": 1,
    "step": 1
  },
  "exllama_cache_k_bits": {
    "kind": "integer_or_null",
    "minimum": 2,
    "maximum": 8,
    "default": null,
    "null_means": "fp16",
    "allowed_values": [2, 3, 4, 5, 6, 7, 8]
  },
  "exllama_cache_v_bits": {
    "kind": "integer_or_null",
    "minimum": 2,
    "maximum": 8,
    "default": null,
    "null_means": "fp16",
    "allowed_values": [2, 3, 4, 5, 6, 7, 8]
  },
  "exllama_cache_quant": {
    "kind": "string_or_null",
    "format": "<bits>|<k_bits>,<v_bits>"
  }
}"#;

/// Spec, "Current load_constraints Shapes" / presets: vLLM and vLLM Serve.
const VLLM_CONSTRAINTS: &str = r#"{
  "vllm_max_model_len": {
    "kind": "integer",
    "minimum": 256,
    "step": 256
  },
  "vllm_kv_cache_dtype": {
    "kind": "enum",
    "default": "auto",
    "allowed_values": ["auto", "fp8", "fp8_e4m3", "fp8_e5m2"],
    "examples": ["auto", "fp8"]
  },
  "vllm_kv_cache_memory_bytes": {
    "kind": "integer",
    "minimum": 268435456,
    "step": 268435456,
    "unit": "bytes",
    "display_unit": "mib"
  },
  "vllm_max_pixels": {
    "kind": "integer",
    "minimum": 200704,
    "step": 200704,
    "unit": "pixels"
  },
  "vllm_speculative_method": {
    "kind": "string_or_null",
    "format": "vllm_speculative_method",
    "default": null,
    "examples": ["mtp", "draft_model", "mlp_speculator"]
  },
  "vllm_speculative_model": {
    "kind": "string_or_null",
    "format": "hf_id_or_local_path",
    "default": null,
    "examples": ["google/gemma-4-26B-A4B-it-assistant"]
  },
  "vllm_num_speculative_tokens": {
    "kind": "integer",
    "minimum": 1,
    "step": 1,
    "default": 1
  }
}"#;

/// Spec, "Current load_constraints Shapes" / presets: llama-server.
const LLAMA_SERVER_CONSTRAINTS: &str = r#"{
  "llama_server_n_ctx": {
    "kind": "integer",
    "minimum": 1,
    "step": 1
  },
  "llama_server_image_max_tokens": {
    "kind": "integer",
    "minimum": 1,
    "step": 1
  },
  "llama_server_spec_type": {
    "kind": "enum",
    "default": "draft-mtp",
    "allowed_values": ["draft-mtp"],
    "examples": ["draft-mtp"]
  },
  "llama_server_spec_draft_n_max": {
    "kind": "integer",
    "minimum": 1,
    "maximum": 6,
    "step": 1,
    "default": 2
  },
  "llama_server_spec_draft_p_min": {
    "kind": "float",
    "minimum": 0.0,
    "maximum": 1.0,
    "default": 0.0
  }
}"#;

/// Spec, "Current load_constraints Shapes" / presets: ExLlamaV3 recommended presets.
const EXLLAMA_PRESETS: &str = r#"{
  "exllama_cache_bit_pairs": {
    "kind": "pair_presets",
    "fields": ["exllama_cache_k_bits", "exllama_cache_v_bits"],
    "recommended_pairs": [
      {
        "label": "fp16",
        "exllama_cache_k_bits": null,
        "exllama_cache_v_bits": null
      },
      {
        "label": "8/8",
        "exllama_cache_k_bits": 8,
        "exllama_cache_v_bits": 8
      },
      {
        "label": "8/4",
        "exllama_cache_k_bits": 8,
        "exllama_cache_v_bits": 4
      }
    ]
  }
}"#;

/// Spec, "Current load_constraints Shapes" / presets: CT2, openai_remote, and stub.
const EMPTY: &str = r#"{}"#;

/// Spec, GET /v1/admin/models, the first example's `load_recommendations` (with `notes`).
const GGUF_PRESETS_WITH_NOTES: &str = r#"{
  "gguf_cache_type_pairs": {
    "kind": "pair_presets",
    "fields": ["gguf_type_k", "gguf_type_v"],
    "recommended_pairs": [
      {
        "label": "f16/f16",
        "gguf_type_k": "f16",
        "gguf_type_v": "f16"
      },
      {
        "label": "q8_0/q8_0",
        "gguf_type_k": "q8_0",
        "gguf_type_v": "q8_0"
      },
      {
        "label": "q4_0/q4_0",
        "gguf_type_k": "q4_0",
        "gguf_type_v": "q4_0"
      }
    ],
    "notes": [
      "Service-curated presets for GGUF cache types.",
      "Prefer symmetric GGUF K/V pairs by default; asymmetric pairs may reduce or disable GPU offload in upstream llama.cpp."
    ]
  }
}"#;

fn parse(text: &str) -> Value {
    serde_json::from_str(text).expect("spec block is valid JSON")
}

/// Equal values and equal key order (serde_json's `Map` equality ignores order, its
/// `preserve_order` serialization does not).
fn assert_same_json(actual: &Value, expected: &Value, what: &str) {
    assert_eq!(actual, expected, "{what}: values differ");
    assert_eq!(
        serde_json::to_string(actual).unwrap(),
        serde_json::to_string(expected).unwrap(),
        "{what}: key order differs"
    );
}

fn expected_constraints(kind: BackendKind) -> &'static str {
    match kind {
        BackendKind::LlamaCpp => LLAMA_CPP_CONSTRAINTS,
        BackendKind::ExLlamaV3 => EXLLAMA_CONSTRAINTS,
        BackendKind::Vllm | BackendKind::VllmServe => VLLM_CONSTRAINTS,
        BackendKind::LlamaServer => LLAMA_SERVER_CONSTRAINTS,
        _ => EMPTY,
    }
}

fn expected_recommendations(kind: BackendKind) -> &'static str {
    match kind {
        BackendKind::LlamaCpp => GGUF_PRESETS_WITH_NOTES,
        BackendKind::ExLlamaV3 => EXLLAMA_PRESETS,
        _ => EMPTY,
    }
}

/// `load_constraints` of `kind` without Hangar's one addition, `gpus`, which every engine
/// that runs on GPUs lists last (the spec's fields come first, exactly as it prints them).
fn spec_constraints(kind: BackendKind) -> Value {
    let mut actual = serde_json::to_value(load_constraints(kind)).unwrap();
    let fields = actual.as_object_mut().unwrap();
    let gpus = fields.shift_remove("gpus");
    let gpu_engine = !matches!(kind, BackendKind::OpenaiRemote | BackendKind::Stub);
    assert_eq!(gpus.is_some(), gpu_engine, "{kind}: gpus");
    if let Some(gpus) = gpus {
        assert_eq!(
            gpus,
            json!({ "kind": "gpu_list", "minimum": 0, "maximum": 63, "default": null,
                    "null_means": "any GPU the definition allows", "examples": [[0], [0, 1]] }),
            "{kind}"
        );
    }
    actual
}

#[test]
fn load_constraints_match_the_spec_for_every_backend() {
    for kind in BackendKind::ALL {
        let actual = spec_constraints(kind);
        assert_same_json(&actual, &parse(expected_constraints(kind)), kind.as_str());
    }
}

#[test]
fn load_recommendations_match_the_spec_for_every_backend() {
    for kind in BackendKind::ALL {
        let actual = serde_json::to_value(load_recommendations(kind)).unwrap();
        assert_same_json(&actual, &parse(expected_recommendations(kind)), kind.as_str());
    }
}

#[test]
fn gguf_presets_are_the_short_block_plus_notes() {
    let mut actual = serde_json::to_value(load_recommendations(BackendKind::LlamaCpp)).unwrap();
    let notes = actual["gguf_cache_type_pairs"].as_object_mut().unwrap().remove("notes");
    assert_eq!(notes.map(|n| n.as_array().map(Vec::len)), Some(Some(2)));
    assert_same_json(&actual, &parse(GGUF_PRESETS), "llama_cpp without notes");
}

#[test]
fn constraint_fields_iterate_in_spec_order() {
    for kind in BackendKind::ALL {
        let expected = parse(expected_constraints(kind));
        let expected: Vec<&str> =
            expected.as_object().unwrap().keys().map(String::as_str).collect();
        let constraints = load_constraints(kind);
        let fields: Vec<&str> = constraints.fields().filter(|f| *f != "gpus").collect();
        assert_eq!(fields, expected, "{kind}");
        for field in expected {
            assert!(constraints.get(field).is_some(), "{kind}: get({field})");
        }
    }
}
