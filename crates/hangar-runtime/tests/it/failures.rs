//! Loads that fail, through the manager on the stub engine: a failure evicting cannot cure
//! (a file that is not the GGUF it claims, checked by Hangar before any engine runs) evicts
//! nothing; an engine's failure evicts the models on its devices alone, once — after a
//! failure with everything evicted, loads on demand are refused at once (507) and nothing is
//! evicted again until something is unloaded; an explicit load still tries.

use hangar_runtime::{ErrorCode, LoadOptions, Manager, ModelState};
use serde_json::json;

use crate::support::{generate, manager};

fn state(m: &Manager, name: &str) -> ModelState {
    m.model(name).unwrap().runtime_state
}

#[tokio::test(start_paused = true)]
async fn a_file_that_is_not_a_gguf_is_refused_before_the_engine_and_evicts_nothing() {
    let dir = std::env::temp_dir().join(format!("hangar-not-gguf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("broken.gguf");
    // GGUF's magic and version, one tensor announced, then nothing.
    let mut bytes = b"GGUF".to_vec();
    bytes.extend(3u32.to_le_bytes());
    bytes.extend(1u64.to_le_bytes());
    bytes.extend(0u64.to_le_bytes());
    std::fs::write(&file, bytes).unwrap();
    let (m, _) = manager(json!({
        "max_loaded_models": { "llm": 4 },
        "models": {
            "other": { "backend": "stub" },
            "broken": { "backend": "llama_cpp", "model_path": file },
        }
    }));
    m.load("other", LoadOptions::default()).await.unwrap();
    let err = m.load("broken", LoadOptions::default()).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::LoadFailed);
    assert!(err.to_string().contains("is not a GGUF file"), "{err}");
    assert_eq!(state(&m, "other"), ModelState::Loaded, "nothing evicted for it");
    assert_eq!(state(&m, "broken"), ModelState::Failed);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(start_paused = true)]
async fn an_engine_failure_evicts_only_the_models_on_its_devices() {
    let (m, _) = manager(json!({
        "max_loaded_models": { "llm": 4 },
        "models": {
            "on-gpu": { "backend": "stub", "device": "gpu" },
            "on-cpu": { "backend": "stub", "device": "cpu" },
            "broken": { "backend": "stub", "device": "cpu", "stub": { "fail_load": "out of memory" } },
        }
    }));
    for name in ["on-gpu", "on-cpu"] {
        m.load(name, LoadOptions::default()).await.unwrap();
    }
    let err = m.load("broken", LoadOptions::default()).await.unwrap_err();
    assert!(err.to_string().contains("retry after evicting every other model"), "{err}");
    assert_eq!(state(&m, "on-cpu"), ModelState::Unloaded, "evicted for the retry");
    assert_eq!(state(&m, "on-gpu"), ModelState::Loaded, "a CPU model's failure leaves the GPU");
}

#[tokio::test(start_paused = true)]
async fn after_a_failure_with_everything_evicted_nothing_is_evicted_again_for_nothing() {
    let (m, stub) = manager(json!({
        "auto_load": true,
        "max_loaded_models": { "llm": 4 },
        // Not quarantined by the failures below, to see what lifts the refusal.
        "quarantine": { "failures": 10 },
        "models": {
            "other": { "backend": "stub" },
            "broken": { "backend": "stub", "stub": { "fail_load": "out of memory" } },
        }
    }));
    m.load("other", LoadOptions::default()).await.unwrap();
    m.load("broken", LoadOptions::default()).await.unwrap_err();
    assert_eq!(state(&m, "other"), ModelState::Unloaded, "evicted once, for the retry");
    // `other` comes back (its own requests); `broken` on demand is refused at once.
    generate(&m, "other", 2).await.unwrap();
    let loads = stub.loads_started();
    let refused = generate(&m, "broken", 2).await.unwrap_err();
    assert_eq!(refused.code(), ErrorCode::InsufficientMemory, "{refused}");
    assert!(refused.to_string().contains("not loaded on demand"), "{refused}");
    assert_eq!(stub.loads_started(), loads, "no engine was started for it");
    assert_eq!(state(&m, "other"), ModelState::Loaded, "and nothing was evicted");
    let failures = m.model("broken").unwrap().failures;
    assert_eq!(failures.len(), 2, "the failed load (with its retry) and the refusal count");
    // An explicit load still tries its engine, without evicting again.
    m.load("broken", LoadOptions::default()).await.unwrap_err();
    assert_eq!(stub.loads_started(), loads + 1);
    assert_eq!(state(&m, "other"), ModelState::Loaded);
    // An unload frees room: a load on demand tries again (and evicts what is in the way).
    m.unload("other").await.unwrap();
    let failed = generate(&m, "broken", 2).await.unwrap_err();
    assert_eq!(failed.code(), ErrorCode::ModelFailed, "{failed}");
    assert!(stub.loads_started() > loads + 1, "its engine ran again");
}
