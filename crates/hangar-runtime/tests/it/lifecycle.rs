//! Load, unload, admission and crash behaviour of the manager on the stub backend.

use std::num::NonZeroU32;
use std::time::Duration;

use hangar_lifecycle::ModelState;
use hangar_runtime::{ErrorCode, LoadOptions};
use serde_json::json;

use crate::support::*;

fn chat(extra: serde_json::Value) -> serde_json::Value {
    let mut model =
        json!({ "backend": "stub", "stub": { "token_latency_ms": 10, "load_delay_ms": 100 } });
    hangar_config::merge(&mut model, extra);
    model
}

#[tokio::test(start_paused = true)]
async fn load_then_unload_moves_through_the_states() {
    let (m, stub) = manager(json!({ "models": { "a": chat(json!({})) } }));
    let mut changes = m.subscribe();
    assert_eq!(state(&m, "a"), "unloaded");
    let snap = m.load("a", LoadOptions::default()).await.unwrap();
    assert_eq!(snap.runtime_state, ModelState::Loaded);
    assert!(snap.is_loaded);
    assert_eq!((snap.loaded_replicas, snap.replicas), (1, 1));
    assert_eq!(stub.live_runtimes(), 1);
    let snap = m.unload("a").await.unwrap();
    assert_eq!(snap.runtime_state, ModelState::Unloaded);
    assert_eq!((snap.loaded_replicas, snap.inflight_requests, snap.runtime_inflight), (0, 0, 0));
    assert_eq!(stub.live_runtimes(), 0, "no runtime survives the unload");
    let mut seen = Vec::new();
    while let Ok(c) = changes.try_recv() {
        seen.push(format!("{}->{}", c.from, c.to));
    }
    assert_eq!(
        seen,
        ["unloaded->loading", "loading->loaded", "loaded->unloading", "unloading->unloaded"]
    );
    let counters = m.counters();
    assert_eq!((counters.loads, counters.unloads), (1, 1));
}

#[tokio::test(start_paused = true)]
async fn every_admission_code_for_every_state() {
    let (m, _) = manager(json!({ "models": {
        "a": chat(json!({})),
        "broken": chat(json!({ "stub": { "fail_load": "simulated OOM" } })),
    } }));
    let code = |r: Result<String, hangar_runtime::ManagerError>| r.unwrap_err().code();
    assert_eq!(code(generate(&m, "nope", 1).await), ErrorCode::UnknownModel);
    assert_eq!(code(generate(&m, "a", 1).await), ErrorCode::ModelNotLoaded);

    let loading = tokio::spawn({
        let m = m.clone();
        async move { m.load("a", LoadOptions::default()).await }
    });
    settle().await;
    assert_eq!(state(&m, "a"), "loading");
    assert_eq!(code(generate(&m, "a", 1).await), ErrorCode::ModelLoading);
    loading.await.unwrap().unwrap();
    assert!(generate(&m, "a", 3).await.is_ok());

    let running = spawn_generate(&m, "a", 50);
    settle().await;
    let unloading = tokio::spawn({
        let m = m.clone();
        async move { m.unload("a").await }
    });
    settle().await;
    assert_eq!(state(&m, "a"), "unloading");
    assert_eq!(code(generate(&m, "a", 1).await), ErrorCode::ModelUnloading);
    assert!(running.await.unwrap().is_ok());
    unloading.await.unwrap().unwrap();

    let err = m.load("broken", LoadOptions::default()).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::LoadFailed);
    let failed = generate(&m, "broken", 1).await.unwrap_err();
    assert_eq!(failed.code(), ErrorCode::ModelFailed);
    assert!(failed.to_string().contains("simulated OOM"), "{failed}");
}

#[tokio::test(start_paused = true)]
async fn duplicate_load_waits_for_the_running_load_and_returns_its_state() {
    let (m, stub) =
        manager(json!({ "models": { "a": chat(json!({ "stub": { "load_delay_ms": 1000 } })) } }));
    let first = tokio::spawn({
        let m = m.clone();
        async move { m.load("a", LoadOptions::default()).await }
    });
    settle().await;
    let second = m.load("a", LoadOptions::default()).await.unwrap();
    assert_eq!(second.runtime_state, ModelState::Loaded);
    first.await.unwrap().unwrap();
    assert_eq!(stub.loads_started(), 1, "one load, not two");
    // Loading an already loaded model is a no-op that returns the current state.
    assert!(m.load("a", LoadOptions::default()).await.unwrap().is_loaded);
    assert_eq!(stub.loads_started(), 1);
}

#[tokio::test(start_paused = true)]
async fn load_while_unloading_and_unload_while_loading_conflict() {
    let (m, _) =
        manager(json!({ "models": { "a": chat(json!({ "stub": { "load_delay_ms": 500 } })) } }));
    let loading = tokio::spawn({
        let m = m.clone();
        async move { m.load("a", LoadOptions::default()).await }
    });
    settle().await;
    let err = m.unload("a").await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::StateConflict);
    assert!(matches!(err, hangar_runtime::ManagerError::Conflict { .. }));
    loading.await.unwrap().unwrap();

    let running = spawn_generate(&m, "a", 30);
    settle().await;
    let unloading = tokio::spawn({
        let m = m.clone();
        async move { m.unload("a").await }
    });
    settle().await;
    let err = m.load("a", LoadOptions::default()).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::StateConflict);
    assert!(
        matches!(err, hangar_runtime::ManagerError::Conflict { state: ModelState::Unloading, .. }),
        "{err:?}"
    );
    assert!(matches!(err, hangar_runtime::ManagerError::Conflict { .. }));
    // Unload of an unloading model answers with the current state.
    assert_eq!(m.unload("a").await.unwrap().runtime_state, ModelState::Unloading);
    running.await.unwrap().unwrap();
    unloading.await.unwrap().unwrap();
    // Unload of an unloaded model is a no-op.
    assert_eq!(m.unload("a").await.unwrap().runtime_state, ModelState::Unloaded);
}

#[tokio::test(start_paused = true)]
async fn unload_waits_for_inflight_requests_and_cancels_queued_ones() {
    let (m, stub) = manager(json!({ "models": { "a": chat(json!({ "target_inflight": 1 })) } }));
    m.load("a", LoadOptions::default()).await.unwrap();
    let running = spawn_generate(&m, "a", 20); // 200 ms of tokens
    settle().await;
    let queued = spawn_generate(&m, "a", 5);
    settle().await;
    let snap = m.model("a").unwrap();
    assert_eq!((snap.runtime_inflight, snap.queue_depth, snap.inflight_requests), (1, 1, 2));

    let unload = tokio::spawn({
        let m = m.clone();
        async move { m.unload("a").await }
    });
    settle().await;
    assert_eq!(
        queued.await.unwrap().unwrap_err().code(),
        ErrorCode::ModelUnloading,
        "queued work is cancelled"
    );
    assert_eq!(stub.live_runtimes(), 1, "the runtime stays while the request runs");
    let text = running.await.unwrap().unwrap();
    assert_eq!(text.split(' ').count(), 20, "the running request completes in full");
    let snap = unload.await.unwrap().unwrap();
    assert_eq!(snap.runtime_state, ModelState::Unloaded);
    assert_eq!(stub.live_runtimes(), 0);
}

#[tokio::test(start_paused = true)]
async fn crash_moves_model_to_failed_with_reason_and_it_can_be_loaded_again() {
    let (m, stub) = manager(
        json!({ "models": { "a": chat(json!({ "stub": { "crash_after_requests": 2 } })) } }),
    );
    m.load("a", LoadOptions::default()).await.unwrap();
    assert!(generate(&m, "a", 2).await.is_ok());
    let err = generate(&m, "a", 2).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::BackendCrashed);
    let snap = m.model("a").unwrap();
    assert_eq!(snap.runtime_state, ModelState::Failed);
    assert!(
        snap.last_error.as_deref().unwrap().contains("injected crash"),
        "{:?}",
        snap.last_error
    );
    assert_eq!(generate(&m, "a", 1).await.unwrap_err().code(), ErrorCode::ModelFailed);
    assert_eq!(m.counters().crashes, 1);
    settle().await;
    assert_eq!(stub.live_runtimes(), 0, "the crashed runtime is torn down");
    // A failed model may be loaded again.
    assert!(m.load("a", LoadOptions::default()).await.unwrap().is_loaded);
    assert!(generate(&m, "a", 2).await.is_ok());
}

#[tokio::test(start_paused = true)]
async fn queued_requests_get_model_failed_when_the_runtime_crashes() {
    let (m, _) = manager(
        json!({ "models": { "a": chat(json!({ "target_inflight": 1, "stub": { "crash_after_requests": 1, "load_delay_ms": 0 } })) } }),
    );
    m.load("a", LoadOptions::default()).await.unwrap();
    // The first request crashes at once; anything queued behind it is refused, not lost.
    let first = spawn_generate(&m, "a", 5);
    let second = spawn_generate(&m, "a", 5);
    let codes =
        [first.await.unwrap().unwrap_err().code(), second.await.unwrap().unwrap_err().code()];
    assert_eq!(codes[0], ErrorCode::BackendCrashed);
    assert!(matches!(codes[1], ErrorCode::ModelFailed | ErrorCode::BackendCrashed), "{codes:?}");
}

#[tokio::test(start_paused = true)]
async fn replicas_are_chosen_per_load_all_or_nothing_and_bounded_by_replica_max() {
    let (m, stub) = manager(
        json!({ "models": { "a": chat(json!({ "replicas": 1, "replica_max": 3, "target_inflight": 1 })) } }),
    );
    let too_many = LoadOptions { replicas: NonZeroU32::new(4), ..LoadOptions::default() };
    let err = m.load("a", too_many).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidLoadRequest);
    assert_eq!(state(&m, "a"), "unloaded", "bad input changes no state");

    let three = LoadOptions { replicas: NonZeroU32::new(3), ..LoadOptions::default() };
    let snap = m.load("a", three).await.unwrap();
    assert_eq!((snap.replicas, snap.loaded_replicas), (3, 3));
    assert_eq!(
        snap.config.definition()["replicas"],
        1,
        "the definition keeps the configured count"
    );
    assert_eq!(stub.live_runtimes(), 3);
    // Requests spread over the least-loaded replicas.
    let a = spawn_generate(&m, "a", 10);
    let b = spawn_generate(&m, "a", 10);
    let c = spawn_generate(&m, "a", 10);
    settle().await;
    assert_eq!(m.model("a").unwrap().runtime_inflight, 3);
    for h in [a, b, c] {
        h.await.unwrap().unwrap();
    }
    // Options for a loaded model are refused.
    let two = LoadOptions { replicas: NonZeroU32::new(2), ..LoadOptions::default() };
    assert_eq!(m.load("a", two).await.unwrap_err().code(), ErrorCode::InvalidLoadRequest);
    m.unload("a").await.unwrap();
    assert_eq!(m.model("a").unwrap().replicas, 1, "replicas return to the configured count");
}

#[tokio::test(start_paused = true)]
async fn a_failing_replica_leaves_no_replica_loaded() {
    // `crash`-free failure on load: every replica fails, so none may survive.
    let (m, stub) = manager(
        json!({ "models": { "a": chat(json!({ "replica_max": 3, "stub": { "fail_load": "boom" } })) } }),
    );
    let opts = LoadOptions { replicas: NonZeroU32::new(3), ..LoadOptions::default() };
    assert_eq!(m.load("a", opts).await.unwrap_err().code(), ErrorCode::LoadFailed);
    assert_eq!(stub.live_runtimes(), 0);
    assert_eq!(m.model("a").unwrap().loaded_replicas, 0);
}

#[tokio::test(start_paused = true)]
async fn overrides_apply_to_one_load_and_only_while_unloaded_or_failed() {
    let (m, _) = manager(json!({ "models": {
        "g": { "backend": "llama_cpp", "model_path": "/m/x.gguf", "gguf_n_ctx": 4096, "gguf_type_k": "q8_0" }
    } }));
    let mut overrides = serde_json::Map::new();
    overrides.insert("gguf_n_ctx".into(), json!(8192));
    overrides.insert("gguf_type_k".into(), json!(null));
    let snap = m
        .load(
            "g",
            LoadOptions { replicas: None, overrides: overrides.clone(), ..LoadOptions::default() },
        )
        .await
        .unwrap();
    assert_eq!(snap.load_override.fields(), &overrides, "key presence is kept, null included");
    assert_eq!(snap.config.definition()["gguf_n_ctx"], 4096, "the definition is not modified");
    let err = m
        .load("g", LoadOptions { replicas: None, overrides, ..LoadOptions::default() })
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidLoadRequest, "overrides to a loaded model");
    m.unload("g").await.unwrap();
    assert!(m.model("g").unwrap().load_override.is_empty(), "overrides last one load");

    let bad_value = serde_json::Map::from_iter([("gguf_type_k".to_owned(), json!("q8-0"))]);
    let err = m
        .load("g", LoadOptions { replicas: None, overrides: bad_value, ..LoadOptions::default() })
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidLoadRequest);
    let schema = serde_json::Map::from_iter([("gguf_n_ctx".to_owned(), json!(0))]);
    let err = m
        .load("g", LoadOptions { replicas: None, overrides: schema, ..LoadOptions::default() })
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidRequestBody);
    let foreign = serde_json::Map::from_iter([("exllama_cache_size".to_owned(), json!(8192))]);
    let err = m
        .load("g", LoadOptions { replicas: None, overrides: foreign, ..LoadOptions::default() })
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidLoadRequest);
    assert_eq!(state(&m, "g"), "unloaded", "rejected options change no state");
}

#[tokio::test(start_paused = true)]
async fn target_inflight_is_clamped_by_backend_capability() {
    let (m, _) = manager(
        json!({ "models": { "a": chat(json!({ "target_inflight": 4, "stub": { "max_parallel_sequences": 1 } })) } }),
    );
    let snap = m.model("a").unwrap();
    assert_eq!((snap.configured_target_inflight, snap.effective_target_inflight), (4, 1));
    m.load("a", LoadOptions::default()).await.unwrap();
    let a = spawn_generate(&m, "a", 10);
    let b = spawn_generate(&m, "a", 10);
    settle().await;
    let snap = m.model("a").unwrap();
    assert_eq!(
        (snap.runtime_inflight, snap.queue_depth),
        (1, 1),
        "the clamp is what the scheduler honours"
    );
    a.await.unwrap().unwrap();
    b.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn full_queue_answers_queue_full() {
    let (m, _) = manager(
        json!({ "max_queue_depth": 1, "models": { "a": chat(json!({ "target_inflight": 1 })) } }),
    );
    m.load("a", LoadOptions::default()).await.unwrap();
    let running = spawn_generate(&m, "a", 10);
    settle().await;
    let queued = spawn_generate(&m, "a", 1);
    settle().await;
    assert_eq!(generate(&m, "a", 1).await.unwrap_err().code(), ErrorCode::QueueFull);
    running.await.unwrap().unwrap();
    queued.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn load_enabled_loads_the_enabled_models_and_unload_all_unloads_everything() {
    let (m, stub) = manager(json!({
        "max_loaded_models": { "llm": 3 },
        "models": {
            "a": chat(json!({ "enabled": true })),
            "b": chat(json!({ "enabled": true })),
            "c": chat(json!({})),
            "e": chat(json!({ "enabled": true, "labels": ["embedding"] })),
        }
    }));
    let results = m.load_enabled().await;
    assert_eq!(results.len(), 3);
    assert_eq!(loaded(&m), ["a", "b", "e"]);
    let running = spawn_generate(&m, "a", 5);
    settle().await;
    let unloaded = m.unload_all().await;
    assert_eq!(unloaded, ["a", "b", "e"], "unload-all names the models it unloaded");
    assert!(m.models().iter().all(|s| s.runtime_state == ModelState::Unloaded));
    assert!(running.await.unwrap().is_ok(), "unload-all drains too");
    assert_eq!(stub.live_runtimes(), 0);
}

#[tokio::test(start_paused = true)]
async fn load_progress_is_visible_while_loading() {
    let (m, _) =
        manager(json!({ "models": { "a": chat(json!({ "stub": { "load_delay_ms": 1000 } })) } }));
    let loading = tokio::spawn({
        let m = m.clone();
        async move { m.load("a", LoadOptions::default()).await }
    });
    tokio::time::sleep(Duration::from_millis(10)).await;
    let snap = m.model("a").unwrap();
    assert_eq!(snap.runtime_state, ModelState::Loading);
    assert!(
        snap.load_progress.is_some_and(|p| (0.0..1.0).contains(&p)),
        "{:?}",
        snap.load_progress
    );
    loading.await.unwrap().unwrap();
    assert_eq!(m.model("a").unwrap().load_progress, None);
}

/// Found by the property test: a request waiting for its model's load (holding it against
/// eviction) also waited for the model's admin lock, which a reload held while it waited in
/// the load queue, whose holder was evicting that model for the request to be admitted.
#[tokio::test(start_paused = true)]
async fn a_request_waiting_for_a_load_is_admitted_while_a_reload_waits_for_the_queue() {
    let (m, _) = manager(json!({
        "auto_load": true,
        "max_loaded_models": { "llm": 2 },
        "models": {
            "broken": chat(json!({ "stub": { "fail_load": "simulated OOM" } })),
            "b": chat(json!({})),
        },
    }));
    let load = tokio::spawn({
        let m = m.clone();
        async move { m.load("b", LoadOptions::default()).await.map(drop) }
    });
    settle().await;
    let reload = tokio::spawn({
        let m = m.clone();
        async move { m.reload("b", LoadOptions::default()).await.map(drop) }
    });
    settle().await;
    let on_b = spawn_generate(&m, "b", 2);
    settle().await;
    // Its failed load retries after evicting every other model: `b`, pinned by `on_b`.
    let on_broken = spawn_generate(&m, "broken", 1);
    let ended = tokio::time::timeout(Duration::from_secs(60), async {
        (load.await, reload.await, on_b.await, on_broken.await)
    })
    .await
    .expect("every operation ends");
    ended.0.unwrap().unwrap();
    assert_eq!(ended.2.unwrap().unwrap().split_whitespace().count(), 2, "b's request ran");
    assert_eq!(ended.3.unwrap().unwrap_err().code(), ErrorCode::ModelFailed);
    // The reload found `b` evicted by then (a conflict), or reloaded it first.
    let reloaded = ended.1.unwrap();
    assert!(
        reloaded.as_ref().is_ok() || reloaded.is_err_and(|e| e.code() == ErrorCode::StateConflict),
        "the reload answered with something else"
    );
    m.resume("broken").await.unwrap(); // its admin turn is free again
}

/// Found by the property test: an eviction waited for requests pinned to a paused model,
/// which admits nothing, so the load queue stood still until someone resumed the model.
#[tokio::test(start_paused = true)]
async fn an_eviction_refuses_the_pinned_requests_of_a_paused_model_instead_of_waiting() {
    let (m, _) = manager(json!({
        "auto_load": true,
        "max_loaded_models": { "llm": 1 },
        "models": { "a": chat(json!({})), "b": chat(json!({})) },
    }));
    let first = spawn_generate(&m, "a", 50);
    settle().await;
    let second = spawn_generate(&m, "a", 50); // pinned, waiting behind `first`
    tokio::time::sleep(Duration::from_millis(150)).await; // `a` loaded, `first` running
    m.pause("a", hangar_runtime::PauseMode::Retract).await.unwrap();
    let loaded = tokio::time::timeout(Duration::from_secs(60), m.load("b", LoadOptions::default()))
        .await
        .expect("the load does not wait for the paused model");
    assert_eq!(loaded.unwrap().runtime_state, ModelState::Loaded);
    for request in [first, second] {
        assert_eq!(request.await.unwrap().unwrap_err().code(), ErrorCode::ModelUnloading);
    }
}

/// Found by the property test: a pause made a request still running on a reload's previous
/// runtimes retract into that runtimes' queue, which is not paused, and on being granted a
/// slot see the model's pause and retract again, for ever (a busy loop, which stops the
/// paused clock too: the scenario runs on a thread of its own, bounded in real time).
#[test]
fn a_pause_lets_a_request_on_a_reloads_previous_runtime_run_to_its_end() {
    let (done, ended) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(pause_during_a_reload());
        let _ = done.send(());
    });
    let ended = ended.recv_timeout(Duration::from_secs(60));
    assert!(ended.is_ok(), "the scenario spun or hung (or panicked: see above)");
}

async fn pause_during_a_reload() {
    let (m, _) = manager(json!({ "models": { "a": chat(json!({})) } }));
    m.load("a", LoadOptions::default()).await.unwrap();
    let old = spawn_generate(&m, "a", 30);
    settle().await;
    m.reload("a", LoadOptions::default()).await.unwrap();
    m.pause("a", hangar_runtime::PauseMode::Retract).await.unwrap();
    let new = spawn_generate(&m, "a", 3);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(old.is_finished(), "the previous runtime's request ran to its end");
    assert_eq!(old.await.unwrap().unwrap().split_whitespace().count(), 30);
    assert!(!new.is_finished(), "the runtimes in service are paused");
    m.resume("a").await.unwrap();
    assert_eq!(new.await.unwrap().unwrap().split_whitespace().count(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_request_past_its_deadline_is_cancelled_and_frees_its_slot() {
    let (m, _) = manager(json!({
        "limits": { "request_timeout_s": 1 },
        "models": { "a": chat(json!({ "target_inflight": 1, "stub": { "token_latency_ms": 100 } })) }
    }));
    m.load("a", LoadOptions::default()).await.unwrap();
    // 50 tokens take 5 s; the deadline is 1 s after the slot was granted.
    let slow = spawn_generate(&m, "a", 50);
    settle().await;
    let queued = spawn_generate(&m, "a", 5);
    let err = slow.await.unwrap().unwrap_err();
    assert_eq!(err.code(), ErrorCode::DeadlineExceeded, "{err}");
    assert!(err.to_string().contains("limits.request_timeout_s"), "{err}");
    // The slot went to the queued request, which finishes within its own deadline.
    assert_eq!(queued.await.unwrap().unwrap().split_whitespace().count(), 5);
    let snap = m.model("a").unwrap();
    assert_eq!((snap.runtime_inflight, snap.queue_depth), (0, 0));
    assert_eq!(snap.runtime_state, ModelState::Loaded, "a deadline is not a failure");
}

#[tokio::test(start_paused = true)]
async fn an_engine_error_of_megabytes_is_kept_bounded_in_last_error_and_failures() {
    let huge = "CUDA error: ".to_owned() + &"out of memory; ".repeat(100_000);
    let (m, _) =
        manager(json!({ "models": { "a": chat(json!({ "stub": { "fail_load": huge } })) } }));
    let err = m.load("a", LoadOptions::default()).await.unwrap_err();
    assert!(err.to_string().len() <= hangar_runtime::MAX_EVENT_TEXT_BYTES + 64, "error too long");
    let snap = m.model("a").unwrap();
    let last_error = snap.last_error.unwrap();
    assert!(last_error.len() <= hangar_runtime::MAX_EVENT_TEXT_BYTES, "{}", last_error.len());
    assert!(last_error.contains("CUDA error: out of memory;"), "{}", &last_error[..80]);
    assert!(last_error.ends_with(" bytes cut]"), "{}", &last_error[last_error.len() - 40..]);
    let failure = &snap.failures.last().unwrap().message;
    assert!(failure.len() <= hangar_runtime::MAX_EVENT_TEXT_BYTES, "{}", failure.len());
}
