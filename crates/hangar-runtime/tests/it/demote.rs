//! Demotion through the manager, on the stub engine and its pretend GPU under a
//! `vram_budget`: a load short of memory puts an idle model to sleep instead of unloading
//! it, once what its sleep frees is known (measured at its first sleep: the stub's level,
//! `context`, has no GGUF to estimate from); the event says for whom; a request wakes it,
//! taking the room back from a model that cannot sleep. A load after a failed wake waits for
//! the failed engine's memory, as after an unload.

use hangar_runtime::{EventKind, LoadOptions, Manager, ModelState, Residency};
use serde_json::json;

use crate::support::{generate, manager_on_gpu};

const BASE_MIB: u64 = 1000;

fn state(m: &Manager, name: &str) -> ModelState {
    m.model(name).unwrap().runtime_state
}

fn asleep(m: &Manager, name: &str) -> bool {
    matches!(m.model(name).unwrap().residency, Some(Residency::Asleep { .. }))
}

/// The journal's sleeps of `name`, with the model each made room for.
fn sleeps_for(m: &Manager, name: &str) -> Vec<Option<String>> {
    let follow = m.follow_events(Some((m.events_epoch(), 0)));
    let kinds = follow.backlog.into_iter().filter(|e| e.model == name).map(|e| e.kind);
    kinds
        .filter_map(
            |k| if let EventKind::Slept { for_model, .. } = k { Some(for_model) } else { None },
        )
        .collect()
}

#[tokio::test]
async fn a_load_short_of_memory_puts_an_idle_model_to_sleep_before_it_unloads_one() {
    // The file (sparse) is the figure `other` is admitted by before it is measured.
    let (dir, file) = crate::support::sparse_file("demote", 1500);
    let (m, _, gpu) = manager_on_gpu(
        json!({
            "vram_budget": 3200,
            "max_loaded_models": { "llm": 4 },
            "models": {
                "sleeper": { "backend": "stub", "device": "gpu", "stub": { "sleeps": true } },
                "other": { "backend": "stub", "device": "gpu", "model_path": file }
            }
        }),
        BASE_MIB,
    );
    gpu.set_footprint("sleeper", 2000);
    gpu.set_footprint("other", 1500);

    // What the sleeper's first sleep would free is not known: the load unloads it.
    m.load("sleeper", LoadOptions::default()).await.unwrap();
    m.load("other", LoadOptions::default()).await.unwrap();
    assert_eq!(state(&m, "sleeper"), ModelState::Unloaded);
    m.unload("other").await.unwrap();

    // Once it has slept (2,000 MiB given back, measured), a load short of memory puts it
    // to sleep instead: it keeps its slot, and both are loaded within the budget.
    m.load("sleeper", LoadOptions::default()).await.unwrap();
    m.sleep("sleeper").await.unwrap();
    m.wake("sleeper").await.unwrap();
    m.load("other", LoadOptions::default()).await.unwrap();
    assert_eq!(state(&m, "sleeper"), ModelState::Loaded, "not unloaded");
    assert!(asleep(&m, "sleeper"), "put to sleep for other");
    assert_eq!(gpu.used_mib(), BASE_MIB + 1500, "never over the budget");
    assert_eq!(sleeps_for(&m, "sleeper"), [None, Some("other".to_owned())]);

    // A request wakes it; its 2,000 MiB come back from other, which cannot sleep: unloaded.
    generate(&m, "sleeper", 4).await.unwrap();
    assert!(!asleep(&m, "sleeper"));
    assert_eq!(state(&m, "other"), ModelState::Unloaded);
    assert_eq!(gpu.used_mib(), BASE_MIB + 2000);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(start_paused = true)]
async fn a_load_after_a_failed_wake_waits_for_the_failed_engines_memory() {
    // The file (sparse) is the figure `next` is admitted by before it is measured.
    let (dir, file) = crate::support::sparse_file("failed-release", 1500);
    let (m, _, gpu) = manager_on_gpu(
        json!({
            "vram_budget": 3200,
            "max_loaded_models": { "llm": 4 },
            "models": {
                "wrong": { "backend": "stub", "device": "gpu",
                           "stub": { "sleeps": true, "reply_after_wake": "wrong" } },
                "next": { "backend": "stub", "device": "gpu", "model_path": file }
            }
        }),
        BASE_MIB,
    );
    gpu.set_footprint("wrong", 2000);
    gpu.set_footprint("next", 1500);
    m.load("wrong", LoadOptions::default()).await.unwrap();
    m.sleep("wrong").await.unwrap();
    // Its engine stops slowly: the memory shows as free only when the driver says so.
    gpu.lag_releases(true);
    m.wake("wrong").await.expect_err("it answers otherwise once woken");
    assert_eq!(state(&m, "wrong"), ModelState::Failed);
    let loading = tokio::spawn({
        let m = m.clone();
        async move { m.load("next", LoadOptions::default()).await }
    });
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert!(!loading.is_finished(), "it waits for the failed engine's memory");
    gpu.release_now();
    loading.await.unwrap().expect("loaded once the memory showed as free");
    assert_eq!(gpu.used_mib(), BASE_MIB + 1500);
    let _ = std::fs::remove_dir_all(&dir);
}
