//! vLLM's sleep mode end to end: the real `hangard` drives the fake `vllm serve` (vLLM's
//! `/sleep`, `/wake_up`, `/collective_rpc` and `/is_sleeping` routes, with their state) on a
//! fake NVML GPU whose memory the fake's engine core gives back while it sleeps. A sleeping
//! model makes room for another without being unloaded, a request wakes it (making room
//! in turn), level 2 is used when the host has no room for the weights (the wake reloads
//! them), a load short of memory puts an idle model to sleep rather than unload it, and an
//! engine that answers wrong after waking fails its model with why.

use std::path::Path;

use serde_json::{Value, json};

use crate::support::engines::fake_vllm;
use crate::support::{Server, code, post, row, temp_dir};

const MIB: u64 = 1 << 20;

/// A `vllm_serve` model with sleep mode whose file (sparse) is `mib` MiB.
fn model(dir: &Path, name: &str, mib: u64, extra: Value) -> Value {
    let file = dir.join(format!("{name}.safetensors"));
    std::fs::File::create(&file).unwrap().set_len(mib * MIB).unwrap();
    let mut model = json!({
        "backend": "vllm_serve", "vllm_binary_path": fake_vllm(), "model_path": file,
        "device": "gpu", "load_timeout_s": 60, "vllm_enable_sleep_mode": true,
    });
    for (k, v) in extra.as_object().unwrap() {
        model[k] = v.clone();
    }
    model
}

/// The used MiB of GPU 0 in the fake NVML's script.
fn used(script: &Path) -> u64 {
    let text = std::fs::read_to_string(script).unwrap();
    let line = text.lines().find(|l| l.starts_with("gpu 0 ")).unwrap();
    line.split_whitespace().nth(2).unwrap().parse().unwrap()
}

async fn chat(server: &Server, model: &str) -> (u16, Value) {
    let body = json!({ "model": model, "max_tokens": 2, "messages": [{ "role": "user", "content": "hi" }] });
    post(server, "/v1/chat/completions", body).await
}

async fn sleep(server: &Server, model: &str) -> Value {
    let (status, row) = post(server, &format!("/v1/admin/models/{model}/sleep"), json!({})).await;
    assert_eq!(status, 200, "{row}");
    row
}

#[tokio::test(flavor = "multi_thread")]
async fn vllm_children_sleep_give_their_gpu_memory_back_and_wake_on_a_request() {
    let dir = temp_dir("vllm-sleep");
    let library = hangar_gpu::fake::build(&dir).expect("a C compiler (cc) builds the fake NVML");
    let script = library.with_file_name("nvml-script");
    std::fs::write(&script, "gpu 0 1000 16384 NVIDIA Fake A\n").unwrap();
    let config = json!({
        "vram_budget": 15000,
        // Room on the host for a's weights (100 MiB), not for deep's (4,000 MiB).
        "ram_budget": 2000,
        "max_loaded_models": { "llm": 4 },
        "children": { "pass_env": ["FAKE_VLLM_*"] },
        "models": {
            "a": model(&dir, "a", 100, json!({})),
            "b": model(&dir, "b", 100, json!({ "vllm_enable_sleep_mode": false })),
            "deep": model(&dir, "deep", 4000, json!({})),
            "wrong": model(&dir, "wrong", 100, json!({
                "vllm_env": { "FAKE_VLLM_WRONG_AFTER_WAKE": "1" }
            })),
        }
    });
    let env = [
        ("HANGAR_NVML_LIBRARY", library.to_str().unwrap()),
        ("FAKE_VLLM_NVML_SCRIPT", script.to_str().unwrap()),
        ("FAKE_VLLM_GPU_MIB", r#"{"a": 12000, "b": 12000, "deep": 2000}"#),
    ];
    let server = Server::start_with(&config, &[], &env);

    let (status, a) = crate::support::load(&server, "a", json!({})).await;
    assert_eq!(status, 200, "{a}");
    // The child listens on a Unix socket only.
    let details = &a["runtime_details"][0];
    assert_eq!(details["backend_url"], "http://localhost/v1", "{a}");
    assert!(details["socket"].as_str().unwrap().ends_with(".sock"), "{a}");
    assert_eq!(a["capabilities"]["sleep_levels"], json!(["weights_to_host", "weights_discarded"]));
    assert_eq!(used(&script), 13000);
    let (status, before) = chat(&server, "a").await;
    assert_eq!(status, 200, "{before}");

    // Asleep: level 1 (the host has room for 100 MiB of weights), the GPU memory given back.
    let asleep = sleep(&server, "a").await;
    assert_eq!(asleep["runtime_state"], "loaded");
    let residency = &asleep["residency"];
    assert_eq!(
        (&residency["state"], &residency["level"], &residency["gpu_freed_mib"]),
        (&json!("asleep"), &json!("weights_to_host"), &json!(12000)),
        "{asleep}"
    );
    assert_eq!(residency["gpu_held_mib"], 0, "{asleep}");
    assert_eq!(used(&script), 1000);

    // b (12,000 MiB, no sleep mode) fits beside the sleeping a: nothing is unloaded.
    let (status, b) = crate::support::load(&server, "b", json!({})).await;
    assert_eq!(status, 200, "{b}");
    assert_eq!(b["capabilities"].get("sleep_levels"), None, "{b}");
    assert_eq!(row(&server, "a").await["runtime_state"], "loaded");
    let refused = post(&server, "/v1/admin/models/b/sleep", json!({})).await;
    assert_eq!((refused.0, code(&refused.1)), (400, "unsupported"), "{}", refused.1);

    // A request for a wakes it; its 12,000 MiB need b's room: b, idle, is unloaded.
    let (status, after) = chat(&server, "a").await;
    assert_eq!(status, 200, "{after}");
    assert_eq!(after["choices"][0]["message"], before["choices"][0]["message"]);
    assert_eq!(row(&server, "a").await["residency"]["state"], "awake");
    assert_eq!(row(&server, "b").await["runtime_state"], "unloaded");
    assert_eq!(used(&script), 13000);

    // Memory pressure: deep is admitted by its files (4,000 MiB) and 2,000 are free beside
    // the awake, idle a. a's sleep frees 12,000 (measured at its last sleep), so a is put
    // to sleep for deep, not unloaded.
    let (status, deep) = crate::support::load(&server, "deep", json!({})).await;
    assert_eq!(status, 200, "{deep}");
    let a = row(&server, "a").await;
    assert_eq!(
        (&a["runtime_state"], &a["residency"]["state"]),
        (&json!("loaded"), &json!("asleep"))
    );
    assert_eq!(used(&script), 3000, "deep's 2,000 beside the sleeping a");

    // deep's 4,000 MiB of weights do not fit the host's 2,000: level 2, and the wake
    // reloads them (woken without, the fake answers garbage and the check would fail).
    let asleep = sleep(&server, "deep").await;
    assert_eq!(asleep["residency"]["level"], "weights_discarded", "{asleep}");
    let (status, woken) = chat(&server, "deep").await;
    assert_eq!(status, 200, "{woken}");
    assert_eq!(woken["choices"][0]["message"]["content"], "word0 word1", "{woken}");

    // An engine that says it woke and answers wrong fails its model, with why.
    crate::support::load(&server, "wrong", json!({})).await;
    sleep(&server, "wrong").await;
    let (status, refused) = chat(&server, "wrong").await;
    assert_eq!((status, code(&refused)), (503, "model_failed"), "{refused}");
    let failed = row(&server, "wrong").await;
    assert_eq!(failed["runtime_state"], "failed");
    let why = failed["last_error"].as_str().unwrap();
    assert!(why.contains("wake check") && why.contains("garbled"), "{why}");
}
