//! The `definition` projection: common fields plus exactly the fields of the model's backend.

use std::collections::BTreeSet;

use hangar_config::{BackendKind, ModelConfig, ModelName};
use serde_json::{Value, json};

const COMMON: &[&str] = &[
    "model_path",
    "backend",
    "type",
    "device",
    "gpus",
    "gpu_split",
    "prompt_format",
    "enabled",
    "replicas",
    "replica_max",
    "target_inflight",
    "labels",
    "aliases",
    "auto_load",
    "default_max_tokens",
    "load_timeout_s",
    "pinned",
    "idle_unload_seconds",
    "idle_sleep_seconds",
    "allow_remote_media",
    "pass_env",
];

fn minimal(kind: BackendKind) -> Value {
    match kind {
        BackendKind::OpenaiRemote => {
            json!({ "backend": kind, "openai_base_url": "http://127.0.0.1:9/v1" })
        }
        BackendKind::Stub | BackendKind::VllmServe => json!({ "backend": kind, "model_path": "m" }),
        _ => json!({ "backend": kind, "model_path": "m" }),
    }
}

fn definition_keys(kind: BackendKind) -> BTreeSet<String> {
    let model = ModelConfig::parse(&ModelName::new("m").unwrap(), &minimal(kind)).unwrap();
    model.definition().keys().cloned().collect()
}

fn prefixes(kind: BackendKind) -> &'static [&'static str] {
    match kind {
        BackendKind::LlamaCpp => &["gguf_"],
        BackendKind::LlamaServer => &["llama_server_"],
        BackendKind::Vllm => &["vllm_", "bridge_"],
        BackendKind::VllmServe => &["vllm_"],
        BackendKind::ExLlamaV3 => &["exllama_", "bridge_"],
        BackendKind::Ct2 => &["ct2_", "bridge_"],
        BackendKind::OpenaiRemote => &["openai_"],
        BackendKind::Stub => &["stub"],
        _ => &[],
    }
}

#[test]
fn definition_has_common_fields_and_only_its_backends_fields() {
    for kind in BackendKind::ALL {
        let keys = definition_keys(kind);
        for common in COMMON {
            assert!(keys.contains(*common), "{kind}: definition lacks `{common}`");
        }
        let specific: Vec<_> = keys.iter().filter(|k| !COMMON.contains(&k.as_str())).collect();
        assert!(!specific.is_empty(), "{kind}: no backend fields in the definition");
        for key in specific {
            assert!(
                prefixes(kind).iter().any(|p| key.starts_with(p)),
                "{kind}: definition has foreign field `{key}`"
            );
        }
    }
}

#[test]
fn vllm_serve_has_process_fields_and_vllm_has_bridge_fields() {
    let serve = definition_keys(BackendKind::VllmServe);
    let inproc = definition_keys(BackendKind::Vllm);
    for f in ["vllm_binary_path", "vllm_model", "vllm_env", "vllm_port", "vllm_extra_args"] {
        assert!(serve.contains(f) && !inproc.contains(f), "{f}");
    }
    assert!(inproc.contains("bridge_python") && !serve.contains("bridge_python"));
    assert!(inproc.contains("vllm_max_model_len") && serve.contains("vllm_max_model_len"));
}

#[test]
fn llama_cpp_definition_matches_the_spec_example() {
    let model = ModelConfig::parse(
        &ModelName::new("google_gemma-4-E2B-it-Q8_0-gguf").unwrap(),
        &json!({
            "model_path": "/models/gemma.gguf",
            "backend": "llama_cpp",
            "prompt_format": "gemma4_template",
            "enabled": true,
            "replicas": 3,
            "replica_max": 4,
            "target_inflight": 1,
            "gguf_n_gpu_layers": -1,
            "gguf_n_ctx": 4096,
            "gguf_flash_attn": "auto",
            "gguf_type_k": null,
            "gguf_type_v": null
        }),
    )
    .unwrap();
    let def = Value::Object(model.definition());
    for (key, value) in [
        ("model_path", json!("/models/gemma.gguf")),
        ("backend", json!("llama_cpp")),
        ("prompt_format", json!("gemma4_template")),
        ("enabled", json!(true)),
        ("replicas", json!(3)),
        ("replica_max", json!(4)),
        ("target_inflight", json!(1)),
        ("gguf_n_gpu_layers", json!(-1)),
        ("gguf_n_ctx", json!(4096)),
        ("gguf_flash_attn", json!("auto")),
        ("gguf_type_k", Value::Null),
        ("gguf_type_v", Value::Null),
        ("device", json!(["gpu"])),
        ("type", json!("llm")),
    ] {
        assert_eq!(def[key], value, "definition.{key}");
    }
}

#[test]
fn defaults_apply_to_common_fields() {
    let model = ModelConfig::parse(
        &ModelName::new("s").unwrap(),
        &json!({ "backend": "stub", "replicas": 2 }),
    )
    .unwrap();
    assert_eq!(model.replicas.get(), 2);
    assert_eq!(model.replica_max.get(), 2, "replica_max defaults to replicas");
    assert_eq!(model.target_inflight.get(), 1);
    assert!(!model.enabled);
    assert!(model.auto_load_or(true) && !model.auto_load_or(false));
    assert_eq!(model.raw()["replicas"], 2);
}

#[test]
fn explicit_type_wins_over_labels_and_gpu_layers_zero_means_cpu() {
    let model = ModelConfig::parse(
        &ModelName::new("e").unwrap(),
        &json!({ "backend": "llama_cpp", "model_path": "m", "labels": ["embedding"], "type": "reranking", "gguf_n_gpu_layers": 0 }),
    )
    .unwrap();
    assert_eq!(model.model_type, hangar_config::ModelType::Reranking);
    assert_eq!(model.device, hangar_config::Device::CPU);
    let npu = ModelConfig::parse(
        &ModelName::new("n").unwrap(),
        &json!({ "backend": "stub", "device": ["gpu", "npu"] }),
    )
    .unwrap();
    assert!(npu.device.intersects(hangar_config::Device::EXCLUSIVE));
}

#[test]
fn vram_budget_and_state_dir_parse_and_bad_budgets_name_their_path() {
    use hangar_config::{BudgetAmount, Config};
    let config = Config::from_value(&serde_json::json!({
        "state_dir": "/var/lib/hangar",
        "vram_budget": { "0": "90%", "1": 20000 }
    }))
    .unwrap();
    assert_eq!(config.state_dir.as_deref(), Some(std::path::Path::new("/var/lib/hangar")));
    let budget = config.vram_budget.as_ref().unwrap();
    assert_eq!(budget.per_gpu[&1], BudgetAmount::Mib(20000));
    assert_eq!((budget.mib_for(0, 1000), budget.mib_for(1, 80_000)), (900, 20000));
    let json = config.to_effective_json();
    assert_eq!(json["vram_budget"], serde_json::json!({ "0": "90%", "1": 20000 }));
    assert_eq!(json["state_dir"], "/var/lib/hangar");
    assert_eq!(Config::from_value(&serde_json::json!({})).unwrap().vram_budget, None);

    let problems = |v: serde_json::Value| Config::from_value(&v).unwrap_err().to_string();
    let one = problems(serde_json::json!({ "vram_budget": "120%" }));
    assert!(one.contains("vram_budget: a percentage"), "{one}");
    let each = problems(serde_json::json!({ "vram_budget": { "0": -5 } }));
    assert!(each.contains("vram_budget.0: a MiB budget"), "{each}");
    let empty = problems(serde_json::json!({ "state_dir": "" }));
    assert!(empty.contains("state_dir"), "{empty}");
}

#[test]
fn ram_budget_is_mib_or_a_share_of_the_host_and_bad_ones_are_refused() {
    use hangar_config::{BudgetAmount, Config};
    let config = Config::from_value(&serde_json::json!({ "ram_budget": "75%" })).unwrap();
    assert_eq!(config.ram_budget, Some(BudgetAmount::Percent(75.0)));
    assert_eq!(config.ram_budget.unwrap().resolve(64_000), 48_000);
    assert_eq!(config.to_effective_json()["ram_budget"], "75%");
    let mib = Config::from_value(&serde_json::json!({ "ram_budget": 12000 })).unwrap();
    assert_eq!(mib.ram_budget, Some(BudgetAmount::Mib(12000)));
    assert_eq!(Config::from_value(&serde_json::json!({})).unwrap().ram_budget, None);
    for bad in [serde_json::json!(0), serde_json::json!("0%"), serde_json::json!({ "0": 5 })] {
        let err = Config::from_value(&serde_json::json!({ "ram_budget": bad })).unwrap_err();
        assert!(err.to_string().contains("ram_budget:"), "{bad}: {err}");
    }
}

#[test]
fn an_idle_sleep_comes_before_the_idle_unload() {
    let parse = |value: Value| ModelConfig::parse(&ModelName::new("m").unwrap(), &value);
    let model =
        parse(json!({ "backend": "stub", "idle_sleep_seconds": 30, "idle_unload_seconds": 600 }))
            .unwrap();
    assert_eq!(model.idle_sleep_seconds.map(|s| s.get()), Some(30));
    assert_eq!(model.definition()["idle_sleep_seconds"], 30);
    for (sleep, unload) in [(600, 600), (601, 600)] {
        let errors = parse(json!({
            "backend": "stub", "idle_sleep_seconds": sleep, "idle_unload_seconds": unload
        }))
        .unwrap_err();
        let paths: Vec<(&str, &str)> =
            errors.iter().map(|e| (e.path.as_str(), e.message.as_str())).collect();
        assert_eq!(paths.len(), 1, "{paths:?}");
        assert_eq!(paths[0].0, "models.m.idle_sleep_seconds");
        assert!(paths[0].1.contains("before unload"), "{paths:?}");
    }
    let errors = parse(json!({ "backend": "stub", "idle_sleep_seconds": 0 })).unwrap_err();
    assert_eq!(errors[0].path, "models.m.idle_sleep_seconds");
}
