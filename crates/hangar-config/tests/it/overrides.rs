//! Load override validation, table-driven from the runtime admin spec's "Validation
//! behavior" list, "Supported load override fields" and example load bodies.

use hangar_config::{BackendKind, BackendSettings, ModelConfig, ModelName};
use hangar_config::{LoadOverride, OverrideError, validate_load_override};
use serde_json::{Map, Value, json};

fn model(config: Value) -> ModelConfig {
    ModelConfig::parse(&ModelName::new("m").unwrap(), &config).unwrap()
}

fn model_of(kind: BackendKind) -> ModelConfig {
    match kind {
        BackendKind::OpenaiRemote => {
            model(json!({ "backend": kind, "openai_base_url": "http://127.0.0.1:9/v1" }))
        }
        BackendKind::LlamaCpp => {
            model(json!({ "backend": kind, "model_path": "/m/x.gguf", "gguf_n_ctx": 4096 }))
        }
        BackendKind::ExLlamaV3 => {
            model(json!({ "backend": kind, "model_path": "/m/x", "exllama_cache_quant": "8,8" }))
        }
        _ => model(json!({ "backend": kind, "model_path": "/m/x" })),
    }
}

fn object(patch: Value) -> Map<String, Value> {
    match patch {
        Value::Object(map) => map,
        other => panic!("patch must be an object, got {other}"),
    }
}

/// The outcome a case expects.
#[derive(Debug)]
enum Expect {
    Ok,
    /// HTTP 422, blaming this field.
    Schema(&'static str),
    /// HTTP 400 `invalid_load_request`, blaming this field (or none).
    Invalid(Option<&'static str>),
}

#[track_caller]
fn check(kind: BackendKind, patch: Value, expect: Expect) {
    let model = model_of(kind);
    let result = validate_load_override(&model, &object(patch.clone()));
    let context = format!("{kind} {patch} -> {result:?}, expected {expect:?}");
    match (&expect, &result) {
        (Expect::Ok, Ok(_)) => {}
        (Expect::Schema(field), Err(OverrideError::Schema { field: got, message })) => {
            assert_eq!(got, field, "{context}");
            assert!(!message.is_empty(), "{context}");
        }
        (Expect::Invalid(field), Err(OverrideError::Invalid { field: got, message })) => {
            assert_eq!(got.as_deref(), *field, "{context}");
            assert!(!message.is_empty(), "{context}");
        }
        _ => panic!("{context}"),
    }
}

use BackendKind::{ExLlamaV3, LlamaCpp, LlamaServer, Vllm, VllmServe};
use Expect::{Invalid, Ok as Accepted, Schema};

#[test]
fn spec_422_examples_fail_the_schema() {
    check(LlamaCpp, json!({ "gguf_n_ctx": 0 }), Schema("gguf_n_ctx"));
    check(ExLlamaV3, json!({ "exllama_cache_size": 0 }), Schema("exllama_cache_size"));
    check(ExLlamaV3, json!({ "exllama_max_rq_tokens": 0 }), Schema("exllama_max_rq_tokens"));
}

#[test]
fn spec_400_examples_are_invalid_load_requests() {
    check(LlamaCpp, json!({ "gguf_type_k": "q8-0" }), Invalid(Some("gguf_type_k")));
    check(LlamaCpp, json!({ "gguf_type_k": "foo" }), Invalid(Some("gguf_type_k")));
    check(ExLlamaV3, json!({ "exllama_cache_k_bits": 8 }), Invalid(Some("exllama_cache_k_bits")));
    check(
        ExLlamaV3,
        json!({ "exllama_cache_quant": "8,8", "exllama_cache_k_bits": 8, "exllama_cache_v_bits": 8 }),
        Invalid(Some("exllama_cache_quant")),
    );
    check(ExLlamaV3, json!({ "exllama_cache_size": 8000 }), Invalid(Some("exllama_cache_size")));
    check(
        ExLlamaV3,
        json!({ "exllama_cache_quant": "fp16" }),
        Invalid(Some("exllama_cache_quant")),
    );
    check(
        LlamaServer,
        json!({ "llama_server_spec_type": "medusa" }),
        Invalid(Some("llama_server_spec_type")),
    );
    check(
        LlamaServer,
        json!({ "llama_server_spec_draft_n_max": 7 }),
        Invalid(Some("llama_server_spec_draft_n_max")),
    );
    check(
        LlamaServer,
        json!({ "llama_server_spec_draft_p_min": 1.5 }),
        Invalid(Some("llama_server_spec_draft_p_min")),
    );
    // ExLlamaV3-only fields to a llama_cpp model.
    check(LlamaCpp, json!({ "exllama_cache_size": 32768 }), Invalid(Some("exllama_cache_size")));
    check(LlamaCpp, json!({ "exllama_cache_quant": null }), Invalid(Some("exllama_cache_quant")));
    // llama-server-only fields to a vLLM model.
    check(Vllm, json!({ "llama_server_n_ctx": 4096 }), Invalid(Some("llama_server_n_ctx")));
    check(
        VllmServe,
        json!({ "llama_server_spec_type": "draft-mtp" }),
        Invalid(Some("llama_server_spec_type")),
    );
}

#[test]
fn spec_example_load_bodies_are_accepted() {
    let cases = [
        (LlamaCpp, json!({ "gguf_n_ctx": 8192 })),
        (LlamaCpp, json!({ "gguf_n_ctx": 16384 })),
        (LlamaCpp, json!({ "gguf_n_ctx": 32768 })),
        (
            LlamaCpp,
            json!({ "gguf_n_ctx": 32768, "gguf_flash_attn": "auto", "gguf_type_k": "q8_0", "gguf_type_v": "q4_0" }),
        ),
        (
            ExLlamaV3,
            json!({ "exllama_cache_size": 32768, "exllama_cache_quant": null, "exllama_max_rq_tokens": 32768 }),
        ),
        (
            ExLlamaV3,
            json!({ "exllama_cache_size": 32768, "exllama_cache_quant": "8,8", "exllama_max_rq_tokens": 32768 }),
        ),
        (
            ExLlamaV3,
            json!({ "exllama_cache_size": 32768, "exllama_cache_quant": "8,4", "exllama_max_rq_tokens": 32768 }),
        ),
        (
            ExLlamaV3,
            json!({
                "exllama_cache_size": 32768,
                "exllama_cache_k_bits": 8,
                "exllama_cache_v_bits": 4,
                "exllama_max_rq_tokens": 32768
            }),
        ),
        (
            LlamaServer,
            json!({
                "llama_server_n_ctx": 4096,
                "llama_server_image_max_tokens": 512,
                "llama_server_spec_type": "draft-mtp",
                "llama_server_spec_draft_n_max": 4,
                "llama_server_spec_draft_p_min": 0.25
            }),
        ),
    ];
    for (kind, patch) in cases {
        check(kind, patch, Accepted);
    }
    let vllm_body = json!({
        "vllm_max_model_len": 16384,
        "vllm_kv_cache_dtype": "fp8",
        "vllm_kv_cache_memory_bytes": 2147483648u64,
        "vllm_max_pixels": 4014080,
        "vllm_speculative_method": "mtp",
        "vllm_speculative_model": "google/gemma-4-26B-A4B-it-assistant",
        "vllm_num_speculative_tokens": 1
    });
    check(Vllm, vllm_body.clone(), Accepted);
    check(VllmServe, vllm_body, Accepted);
}

#[test]
fn wrong_json_types_and_unknown_fields_fail_the_schema() {
    check(LlamaCpp, json!({ "gguf_n_ctx": "4096" }), Schema("gguf_n_ctx"));
    check(LlamaCpp, json!({ "gguf_n_ctx": -1 }), Schema("gguf_n_ctx"));
    check(LlamaCpp, json!({ "gguf_n_ctx": 4096.5 }), Schema("gguf_n_ctx"));
    check(LlamaCpp, json!({ "gguf_n_ctx": true }), Schema("gguf_n_ctx"));
    check(LlamaCpp, json!({ "gguf_type_k": 8 }), Schema("gguf_type_k"));
    check(LlamaCpp, json!({ "gguf_flash_attn": ["on"] }), Schema("gguf_flash_attn"));
    check(ExLlamaV3, json!({ "exllama_cache_quant": 8 }), Schema("exllama_cache_quant"));
    check(
        ExLlamaV3,
        json!({ "exllama_cache_k_bits": 0, "exllama_cache_v_bits": 8 }),
        Schema("exllama_cache_k_bits"),
    );
    check(
        LlamaServer,
        json!({ "llama_server_spec_draft_p_min": "0.5" }),
        Schema("llama_server_spec_draft_p_min"),
    );
    check(Vllm, json!({ "vllm_max_pixels": { "max": 1 } }), Schema("vllm_max_pixels"));
    // Not a load override of any backend: unknown, or a config field that no load may change.
    check(LlamaCpp, json!({ "temperature": 0.7 }), Schema("temperature"));
    check(LlamaCpp, json!({ "gguf_n_gpu_layers": 10 }), Schema("gguf_n_gpu_layers"));
    check(LlamaCpp, json!({ "model_path": "/other.gguf" }), Schema("model_path"));
    check(
        Vllm,
        json!({ "vllm_gpu_memory_utilization": 0.5 }),
        Schema("vllm_gpu_memory_utilization"),
    );
}

#[test]
fn schema_failures_win_over_backend_mismatches() {
    // A 422 anywhere in the body is reported before any 400, whatever the key order.
    check(LlamaCpp, json!({ "exllama_cache_size": 32768, "gguf_n_ctx": 0 }), Schema("gguf_n_ctx"));
    check(LlamaCpp, json!({ "exllama_cache_size": 0 }), Schema("exllama_cache_size"));
}

#[test]
fn values_outside_the_constraints_are_invalid() {
    check(Vllm, json!({ "vllm_max_model_len": 100 }), Invalid(Some("vllm_max_model_len")));
    // The step is a UI hint except for the ExLlamaV3 cache size.
    check(Vllm, json!({ "vllm_max_model_len": 300 }), Accepted);
    check(ExLlamaV3, json!({ "exllama_cache_size": 128 }), Invalid(Some("exllama_cache_size")));
    check(ExLlamaV3, json!({ "exllama_cache_size": 256 }), Accepted);
    check(
        Vllm,
        json!({ "vllm_kv_cache_memory_bytes": 1024 }),
        Invalid(Some("vllm_kv_cache_memory_bytes")),
    );
    check(Vllm, json!({ "vllm_kv_cache_memory_bytes": 1u64 << 40 }), Accepted);
    check(Vllm, json!({ "vllm_max_pixels": 1000 }), Invalid(Some("vllm_max_pixels")));
    // Larger than the engine's field can hold.
    check(LlamaCpp, json!({ "gguf_n_ctx": 1u64 << 33 }), Invalid(Some("gguf_n_ctx")));
    check(LlamaCpp, json!({ "gguf_flash_attn": "yes" }), Invalid(Some("gguf_flash_attn")));
    check(LlamaCpp, json!({ "gguf_flash_attn": "on" }), Accepted);
    check(LlamaCpp, json!({ "gguf_type_v": "iq4_nl" }), Accepted);
    check(
        ExLlamaV3,
        json!({ "exllama_cache_k_bits": 9, "exllama_cache_v_bits": 8 }),
        Invalid(Some("exllama_cache_k_bits")),
    );
    check(
        ExLlamaV3,
        json!({ "exllama_cache_k_bits": 8, "exllama_cache_v_bits": 1 }),
        Invalid(Some("exllama_cache_v_bits")),
    );
    check(ExLlamaV3, json!({ "exllama_cache_quant": "9" }), Invalid(Some("exllama_cache_quant")));
    check(ExLlamaV3, json!({ "exllama_cache_quant": "4" }), Accepted);
    check(
        LlamaServer,
        json!({ "llama_server_spec_draft_n_max": 6, "llama_server_spec_draft_p_min": 1 }),
        Accepted,
    );
    check(LlamaServer, json!({ "llama_server_spec_draft_p_min": 0 }), Accepted);
    check(
        LlamaServer,
        json!({ "llama_server_spec_draft_p_min": -0.1 }),
        Invalid(Some("llama_server_spec_draft_p_min")),
    );
}

#[test]
fn vllm_string_fields_are_open() {
    // Any dtype vLLM supports, not only the UI's values; but not an empty one.
    check(Vllm, json!({ "vllm_kv_cache_dtype": "bfloat16" }), Accepted);
    check(Vllm, json!({ "vllm_kv_cache_dtype": " " }), Invalid(Some("vllm_kv_cache_dtype")));
    check(Vllm, json!({ "vllm_speculative_method": "eagle3" }), Accepted);
    check(
        VllmServe,
        json!({ "vllm_speculative_method": null, "vllm_speculative_model": null }),
        Accepted,
    );
}

#[test]
fn null_resets_every_kind_of_field() {
    check(LlamaCpp, json!({ "gguf_n_ctx": null, "gguf_flash_attn": null }), Accepted);
    check(LlamaCpp, json!({ "gguf_type_k": null, "gguf_type_v": null }), Accepted);
    check(
        ExLlamaV3,
        json!({ "exllama_cache_k_bits": null, "exllama_cache_v_bits": null }),
        Accepted,
    );
    check(LlamaServer, json!({ "llama_server_spec_type": null }), Accepted);
    check(
        Vllm,
        json!({ "vllm_kv_cache_dtype": null, "vllm_num_speculative_tokens": null }),
        Accepted,
    );
}

#[test]
fn cache_bits_must_come_together_and_alone() {
    check(ExLlamaV3, json!({ "exllama_cache_v_bits": 4 }), Invalid(Some("exllama_cache_v_bits")));
    check(
        ExLlamaV3,
        json!({ "exllama_cache_k_bits": null }),
        Invalid(Some("exllama_cache_k_bits")),
    );
    check(
        ExLlamaV3,
        json!({ "exllama_cache_k_bits": 8, "exllama_cache_v_bits": null }),
        Invalid(None),
    );
    // Combined with exllama_cache_quant, even a null one.
    check(
        ExLlamaV3,
        json!({ "exllama_cache_k_bits": null, "exllama_cache_v_bits": null, "exllama_cache_quant": null }),
        Invalid(Some("exllama_cache_quant")),
    );
}

#[test]
fn replicas_is_left_to_the_caller() {
    check(LlamaCpp, json!({ "replicas": 2 }), Invalid(Some("replicas")));
}

#[test]
fn backends_without_override_fields_accept_none() {
    for kind in [BackendKind::Ct2, BackendKind::OpenaiRemote, BackendKind::Stub] {
        check(kind, json!({}), Accepted);
        check(kind, json!({ "gguf_n_ctx": 4096 }), Invalid(Some("gguf_n_ctx")));
        check(kind, json!({ "vllm_max_model_len": 4096 }), Invalid(Some("vllm_max_model_len")));
    }
}

#[test]
fn backend_mismatch_message_names_the_backends() {
    let err =
        validate_load_override(&model_of(Vllm), &object(json!({ "llama_server_n_ctx": 4096 })))
            .unwrap_err();
    let message = err.to_string();
    assert!(message.contains("llama_server") && message.contains("vllm"), "{message}");
    assert!(!err.is_schema());
    assert_eq!(err.field(), Some("llama_server_n_ctx"));

    let err = validate_load_override(&model_of(LlamaCpp), &object(json!({ "gguf_n_ctx": 0 })))
        .unwrap_err();
    assert!(err.is_schema());
    assert_eq!(err.to_string(), format!("gguf_n_ctx: {}", err.message()));
}

fn exllama_quant(model: &ModelConfig) -> (Option<String>, Option<u8>, Option<u8>) {
    match &model.settings {
        BackendSettings::ExLlamaV3 { exllama, .. } => (
            exllama.exllama_cache_quant.clone(),
            exllama.exllama_cache_k_bits,
            exllama.exllama_cache_v_bits,
        ),
        other => panic!("not an exllamav3 model: {other:?}"),
    }
}

fn validated(model: &ModelConfig, patch: Value) -> LoadOverride {
    validate_load_override(model, &object(patch)).unwrap()
}

#[test]
fn explicit_null_overrides_while_an_absent_key_keeps_the_config() {
    let configured = model_of(ExLlamaV3);
    assert_eq!(exllama_quant(&configured).0.as_deref(), Some("8,8"));

    let reset = validated(&configured, json!({ "exllama_cache_quant": null }));
    assert!(!reset.is_empty());
    assert_eq!(reset.fields().get("exllama_cache_quant"), Some(&Value::Null));
    assert_eq!(exllama_quant(&reset.apply(&configured).unwrap()), (None, None, None));

    let other = validated(&configured, json!({ "exllama_cache_size": 32768 }));
    let effective = other.apply(&configured).unwrap();
    assert_eq!(exllama_quant(&effective).0.as_deref(), Some("8,8"));

    let empty = validated(&configured, json!({}));
    assert!(empty.is_empty());
    assert_eq!(empty.apply(&configured).unwrap(), configured);
}

#[test]
fn cache_bits_are_reported_as_exllama_cache_quant() {
    let configured = model_of(ExLlamaV3);
    let bits = validated(
        &configured,
        json!({ "exllama_cache_size": 512, "exllama_cache_k_bits": 8, "exllama_cache_v_bits": 4 }),
    );
    assert_eq!(
        serde_json::to_string(&bits).unwrap(),
        r#"{"exllama_cache_size":512,"exllama_cache_quant":"8,4"}"#
    );
    // Overrides the configured "8,8" instead of clashing with it.
    assert_eq!(exllama_quant(&bits.apply(&configured).unwrap()), (Some("8,4".into()), None, None));

    let fp16 = validated(
        &configured,
        json!({ "exllama_cache_k_bits": null, "exllama_cache_v_bits": null }),
    );
    assert_eq!(serde_json::to_value(&fp16).unwrap(), json!({ "exllama_cache_quant": null }));
    assert_eq!(exllama_quant(&fp16.apply(&configured).unwrap()), (None, None, None));
}

#[test]
fn a_quant_override_replaces_configured_cache_bits() {
    let configured = model(json!({
        "backend": "exllamav3",
        "model_path": "/m/x",
        "exllama_cache_k_bits": 4,
        "exllama_cache_v_bits": 4
    }));
    let quant = validated(&configured, json!({ "exllama_cache_quant": "8" }));
    assert_eq!(exllama_quant(&quant.apply(&configured).unwrap()), (Some("8".into()), None, None));
    let reset = validated(&configured, json!({ "exllama_cache_quant": null }));
    assert_eq!(exllama_quant(&reset.apply(&configured).unwrap()), (None, None, None));
}

#[test]
fn apply_merges_the_patch_over_the_config() {
    let configured = model_of(LlamaCpp);
    let patch = validated(
        &configured,
        json!({ "gguf_n_ctx": 32768, "gguf_type_k": "q8_0", "gguf_flash_attn": null }),
    );
    let effective = patch.apply(&configured).unwrap();
    let definition = effective.definition();
    assert_eq!(definition["gguf_n_ctx"], 32768);
    assert_eq!(definition["gguf_type_k"], "q8_0");
    assert_eq!(definition["gguf_flash_attn"], Value::Null);
    assert_eq!(definition["model_path"], "/m/x.gguf");
    // The configured model is untouched.
    assert_eq!(configured.definition()["gguf_n_ctx"], 4096);
    assert_eq!(effective.name, configured.name);

    let vllm = model_of(Vllm);
    let patch =
        validated(&vllm, json!({ "vllm_max_model_len": 16384, "vllm_kv_cache_dtype": "fp8" }));
    match patch.apply(&vllm).unwrap().settings {
        BackendSettings::Vllm { engine, .. } => {
            assert_eq!(engine.vllm_max_model_len, Some(16384));
            assert_eq!(engine.vllm_kv_cache_dtype.as_deref(), Some("fp8"));
        }
        other => panic!("{other:?}"),
    }
}

mod gpus {
    //! The `gpus` override: where one load may go, narrowing the definition.

    use hangar_config::{ModelConfig, ModelName, validate_load_override};
    use serde_json::{Map, Value, json};

    fn model(extra: Value) -> ModelConfig {
        let mut value = json!({ "backend": "vllm_serve", "vllm_model": "org/m" });
        value.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        ModelConfig::parse(&ModelName::new("m").unwrap(), &value).unwrap()
    }

    fn patch(gpus: Value) -> Map<String, Value> {
        json!({ "gpus": gpus }).as_object().unwrap().clone()
    }

    #[test]
    fn a_load_may_name_gpus_and_the_effective_definition_has_them() {
        let m = model(json!({}));
        let ov = validate_load_override(&m, &patch(json!([2, 0]))).unwrap();
        assert_eq!(ov.apply(&m).unwrap().gpus, [0, 2]);
        let null = validate_load_override(&m, &patch(Value::Null)).unwrap();
        assert!(null.apply(&m).unwrap().gpus.is_empty(), "null: any");
    }

    #[test]
    fn only_narrowing_distinct_gpus_in_range_is_accepted() {
        let m = model(json!({ "gpus": [0, 1], "gpu_split": 1 }));
        let invalid = [
            (json!([]), "at least one GPU"),
            (json!([1, 1]), "listed twice"),
            (json!([64]), "above 63"),
            (json!([2]), "a load may only narrow them"),
        ];
        for (gpus, message) in invalid {
            let err = validate_load_override(&m, &patch(gpus.clone())).unwrap_err();
            assert!(!err.is_schema() && err.message().contains(message), "{gpus}: {err}");
            assert_eq!(err.field(), Some("gpus"));
        }
        for wrong in [json!("0"), json!([0.5]), json!([-1]), json!({ "0": true })] {
            let err = validate_load_override(&m, &patch(wrong.clone())).unwrap_err();
            assert!(err.is_schema(), "{wrong}: 422, {err}");
        }
        // A split over two GPUs cannot be narrowed to one.
        let split = model(json!({ "gpu_split": 2 }));
        let err = validate_load_override(&split, &patch(json!([1]))).unwrap_err();
        assert!(err.message().contains("gpu_split"), "{err}");
    }

    #[test]
    fn engines_without_gpus_take_no_gpus_override() {
        let remote = ModelConfig::parse(
            &ModelName::new("r").unwrap(),
            &json!({ "backend": "openai_remote", "openai_base_url": "http://127.0.0.1:9/v1" }),
        )
        .unwrap();
        let err = validate_load_override(&remote, &patch(json!([0]))).unwrap_err();
        assert!(err.message().contains("accepts no load overrides"), "{err}");
    }
}
