//! GPU telemetry as operators see it: `GET /v1/admin/gpu-memory` of the real `hangard`,
//! once on this machine's own loader (no NVIDIA driver in CI: empty `gpus` and NVML's
//! reason) and once on a fake `libnvidia-ml.so.1` (`crates/hangar-gpu/tests/fake`, compiled
//! here with `cc`) named by `HANGAR_NVML_LIBRARY`, whose scripted readings change between
//! requests.

use std::path::{Path, PathBuf};

use serde_json::json;

use crate::support::{Server, get, load, post, row, temp_dir, unload};

fn config() -> serde_json::Value {
    json!({ "models": { "chat": { "backend": "stub", "enabled": true } } })
}

/// The fake NVML library, compiled into a fresh directory; its path.
fn fake_nvml() -> PathBuf {
    hangar_gpu::fake::build(&temp_dir("fake-nvml")).expect("a C compiler (cc) builds the fake NVML")
}

#[tokio::test]
async fn without_a_driver_gpu_memory_answers_200_with_no_gpus_and_nvmls_reason() {
    let nvidia = Path::new("/proc/driver/nvidia/version").exists();
    let server = Server::start(&config(), &[]);
    let (status, body) = get(&server, "/v1/admin/gpu-memory").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["models"][0]["name"], "chat", "{body}");
    if nvidia {
        // A machine with a driver: the real GPUs.
        assert!(!body["gpus"].as_array().unwrap().is_empty(), "{body}");
    } else {
        assert_eq!(body["gpus"], json!([]), "{body}");
        let error = body["error"].as_str().unwrap_or_else(|| panic!("a reason: {body}"));
        assert!(
            error.contains("NVML") && error.contains("libnvidia-ml"),
            "NVML's own reason: {error}"
        );
    }
}

#[tokio::test]
async fn with_an_nvml_library_gpu_memory_lists_its_gpus_as_they_change() {
    let library = fake_nvml();
    let script = library.with_file_name("nvml-script");
    std::fs::write(
        &script,
        "gpu 0 75603 97887 NVIDIA RTX PRO 6000 Blackwell Workstation Edition\n\
         gpu 1 1024 24576 NVIDIA GeForce RTX 4090\n\
         proc 0 4242 70000\n",
    )
    .unwrap();
    let env = [("HANGAR_NVML_LIBRARY", library.to_str().unwrap())];
    let server = Server::start_with(&config(), &[], &env);
    let (status, body) = get(&server, "/v1/admin/gpu-memory").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["error"], serde_json::Value::Null, "{body}");
    assert_eq!(
        body["gpus"],
        json!([
            { "index": 0, "name": "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
              "used_mib": 75603, "total_mib": 97887, "used_over_total": "75603MiB / 97887MiB",
              "holders": [] },
            { "index": 1, "name": "NVIDIA GeForce RTX 4090",
              "used_mib": 1024, "total_mib": 24576, "used_over_total": "1024MiB / 24576MiB",
              "holders": [] },
        ])
    );
    // The same figures for Prometheus, in bytes.
    let metrics = reqwest::get(server.url("/metrics")).await.unwrap().text().await.unwrap();
    for line in [
        "hangar_gpu_telemetry_available 1".to_owned(),
        format!("hangar_gpu_memory_used_bytes{{gpu=\"0\"}} {}", 75603u64 << 20),
        format!("hangar_gpu_memory_total_bytes{{gpu=\"1\"}} {}", 24576u64 << 20),
    ] {
        assert!(metrics.lines().any(|l| l == line), "no `{line}` in:\n{metrics}");
    }
    // hangard's own process on GPU 1 (its in-process engines): a holder with no model;
    // process 4242 is nobody Hangar knows.
    let own = format!(
        "gpu 0 75603 97887 NVIDIA RTX PRO 6000 Blackwell Workstation Edition\n\
         gpu 1 1524 24576 NVIDIA GeForce RTX 4090\nproc 0 4242 70000\nproc 1 {} 500\n",
        server.pid()
    );
    std::fs::write(&script, own).unwrap();
    let (_, body) = get(&server, "/v1/admin/gpu-memory").await;
    assert_eq!(body["gpus"][0]["holders"], json!([]), "{body}");
    assert_eq!(body["gpus"][1]["holders"], json!([{ "model": null, "mib": 500 }]), "{body}");
    // Memory released between two requests: the next answer says so.
    std::fs::write(&script, "gpu 0 5603 97887 NVIDIA RTX PRO 6000 Blackwell Workstation Edition\n")
        .unwrap();
    let (_, body) = get(&server, "/v1/admin/gpu-memory").await;
    assert_eq!(body["gpus"].as_array().map(Vec::len), Some(1), "{body}");
    assert_eq!(body["gpus"][0]["used_over_total"], "5603MiB / 97887MiB", "{body}");
}

/// The fake `vllm serve`, whose engine-core child takes memory on the fake NVML's GPU 0.
const FAKE_VLLM: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../crates/hangar-backend-process/tests/fake-vllm/vllm"
);

/// Two `vllm_serve` models on the fake (a takes 3,000 MiB, b 4,000, each plus 100 MiB no
/// process owns) under a 6,000 MiB budget; measured figures kept in `state`.
fn budgeted(state: &Path) -> serde_json::Value {
    let model = |id: &str| {
        json!({
            "backend": "vllm_serve", "vllm_binary_path": FAKE_VLLM, "vllm_model": id,
            "device": "gpu", "load_timeout_s": 60
        })
    };
    let tiny = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/models/tiny-llama.gguf");
    json!({
        "state_dir": state,
        "vram_budget": 6000,
        "max_loaded_models": { "llm": 3 },
        // The fake's knobs reach it through Hangar's environment, as an operator's would.
        "children": { "pass_env": ["FAKE_VLLM_*"] },
        "models": {
            "a": model("fake/a"), "b": model("fake/b"),
            // Never loaded here: its GGUF header gives the estimate.
            "g": {
                "backend": "llama_server", "model_path": tiny, "device": "gpu",
                "llama_server_n_ctx": 65536, "llama_server_extra_args": ["-ctk", "q8_0"]
            }
        }
    })
}

#[tokio::test]
async fn engines_are_measured_admitted_by_footprint_refused_when_held_and_remembered() {
    let library = fake_nvml();
    let script = library.with_file_name("nvml-script");
    std::fs::write(&script, "gpu 0 1000 81920 NVIDIA Fake H100\n").unwrap();
    let state = library.with_file_name("state");
    let env = [
        ("HANGAR_NVML_LIBRARY", library.to_str().unwrap()),
        ("FAKE_VLLM_NVML_SCRIPT", script.to_str().unwrap()),
        ("FAKE_VLLM_GPU_MIB", r#"{"a": 3000, "b": 4000}"#),
        ("FAKE_VLLM_GPU_OVERHEAD_MIB", "100"),
    ];
    let server = Server::start_with(&budgeted(&state), &[], &env);

    // Before any load: no local files for a hub id, and a GGUF model's header estimate
    // (2 layers, 1 KV head of 32: 65,536 tokens of q8_0 keys and f16 values = 12.25 MiB).
    let a = row(&server, "a").await;
    assert_eq!(
        (&a["vram_estimate_source"], &a["vram_detail"]),
        (&json!("unavailable"), &json!(null))
    );
    let g = row(&server, "g").await;
    assert_eq!(g["vram_estimate_source"], "model_artifact_size", "{g}");
    let gguf = &g["vram_detail"]["gguf_estimate"];
    assert_eq!(g["vram_detail"]["admission_method"], "gguf_estimate", "{g}");
    assert_eq!(
        (&gguf["n_ctx"], &gguf["type_k"], &gguf["type_v"], &gguf["kv_cache_mib"]),
        (&json!(65536), &json!("q8_0"), &json!("f16"), &json!(13)),
        "{g}"
    );

    // a's load: the GPUs' delta (3,100) is the spec's estimate; the engine core's own
    // memory (3,000, found through the child's process tree) is what admission counts.
    let (status, a) = load(&server, "a", json!({})).await;
    assert_eq!(status, 200, "{a}");
    assert_eq!(
        (&a["vram_estimate_mib"], &a["vram_estimate_source"]),
        (&json!(3100), &json!("observed_load_delta")),
        "{a}"
    );
    let detail = &a["vram_detail"];
    assert_eq!(detail["admission_method"], "process_tree", "{detail}");
    assert_eq!(
        (&detail["admission_mib"], &detail["process_tree"]["mib"]),
        (&json!(3000), &json!(3000))
    );
    assert_eq!(detail["process_tree"]["gpus"], json!([0]));
    assert_eq!(unload(&server, "a").await.0, 200);
    let released = std::fs::read_to_string(&script).unwrap();
    assert!(released.starts_with("gpu 0 1000 "), "the engine gave its memory back: {released}");

    // b takes 4,100: 5,100 of the 6,000 budget. a (3,000) does not fit beside it: b goes.
    assert_eq!(load(&server, "b", json!({})).await.0, 200);
    let (status, a) = load(&server, "a", json!({})).await;
    assert_eq!(status, 200, "{a}");
    assert_eq!(row(&server, "b").await["runtime_state"], "unloaded");

    // With a leased, b cannot fit: 507, what is missing and who holds the memory.
    let lease = json!({ "owner": "job-7", "ttl_seconds": 600 });
    let (status, body) = post(&server, "/v1/admin/models/a/leases", lease).await;
    assert_eq!(status, 200, "{body}");
    let (status, refused) = load(&server, "b", json!({})).await;
    assert_eq!(status, 507, "{refused}");
    assert_eq!(refused["error"]["code"], "insufficient_vram", "{refused}");
    assert_eq!(
        refused["error"]["vram_shortfall"],
        json!({
            "needed_mib": 4000, "free_mib": 1900, "missing_mib": 2100,
            "holders": [{ "model": "a", "vram_mib": 3000, "held": true }],
            "gpus_needed": 1,
            "gpus": [{
                "gpu": 0, "needed_mib": 4000, "free_mib": 1900, "missing_mib": 2100,
                "holders": [{ "model": "a", "vram_mib": 3000, "held": true }]
            }]
        })
    );
    assert_eq!(row(&server, "a").await["runtime_state"], "loaded", "nothing evicted");

    // The budget per GPU, who holds memory on it (a's engine core, found through the
    // child's process tree; the 100 MiB no process owns is in `used_mib` only), and the
    // admission figures for Prometheus.
    let (_, memory) = get(&server, "/v1/admin/gpu-memory").await;
    assert_eq!(memory["gpus"][0]["budget_mib"], 6000, "{memory}");
    assert_eq!(memory["gpus"][0]["holders"], json!([{ "model": "a", "mib": 3000 }]), "{memory}");
    let metrics = reqwest::get(server.url("/metrics")).await.unwrap().text().await.unwrap();
    let line = format!(
        "hangar_model_vram_admission_bytes{{model=\"a\",source=\"process_tree\",replicas=\"1\"}} {}",
        3000u64 << 20
    );
    assert!(metrics.lines().any(|l| l == line), "no `{line}` in:\n{metrics}");
    drop(server);

    // The next start knows both figures before any load, without a GPU at all.
    let restarted = Server::start(&budgeted(&state), &[]);
    for (model, delta, tree) in [("a", 3100, 3000), ("b", 4100, 4000)] {
        let row = row(&restarted, model).await;
        assert_eq!(
            (&row["vram_estimate_mib"], &row["vram_estimate_source"]),
            (&json!(delta), &json!("observed_load_delta")),
            "{row}"
        );
        assert_eq!(row["vram_detail"]["process_tree"]["mib"], tree, "{row}");
    }
}
