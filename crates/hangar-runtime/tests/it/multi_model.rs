//! One named test per rule of the multi-model spec, through the manager.

use std::time::Duration;

use hangar_runtime::{ErrorCode, LoadOptions};
use serde_json::{Value, json};

use crate::support::*;

fn stub(extra: Value) -> Value {
    let mut model =
        json!({ "backend": "stub", "stub": { "token_latency_ms": 10, "load_delay_ms": 50 } });
    hangar_config::merge(&mut model, extra);
    model
}

async fn load(
    m: &hangar_runtime::Manager,
    name: &str,
) -> Result<hangar_runtime::ModelSnapshot, hangar_runtime::ManagerError> {
    m.load(name, LoadOptions::default()).await
}

#[tokio::test(start_paused = true)]
async fn free_slot_loads_without_evicting() {
    let (m, _) = manager(
        json!({ "max_loaded_models": { "llm": 2 }, "models": { "a": stub(json!({})), "b": stub(json!({})) } }),
    );
    load(&m, "a").await.unwrap();
    load(&m, "b").await.unwrap();
    assert_eq!(loaded(&m), ["a", "b"]);
    assert_eq!(m.counters().evictions, 0);
}

#[tokio::test(start_paused = true)]
async fn full_slot_evicts_least_recently_used_of_the_same_type() {
    let (m, _) = manager(json!({ "max_loaded_models": { "llm": 2 }, "models": {
        "a": stub(json!({})), "b": stub(json!({})), "c": stub(json!({}))
    } }));
    load(&m, "a").await.unwrap();
    load(&m, "b").await.unwrap();
    // A request on `a` makes `b` the least recently used.
    tokio::time::sleep(Duration::from_secs(1)).await;
    generate(&m, "a", 1).await.unwrap();
    load(&m, "c").await.unwrap();
    assert_eq!(loaded(&m), ["a", "c"]);
    assert_eq!(m.counters().evictions, 1);
}

#[tokio::test(start_paused = true)]
async fn default_limits_allow_one_of_each_type_and_never_evict_across_types() {
    let (m, _) = manager(json!({ "models": {
        "chat": stub(json!({})), "chat2": stub(json!({})),
        "emb": stub(json!({ "labels": ["embedding"] })), "rr": stub(json!({ "labels": ["reranking"] }))
    } }));
    for name in ["chat", "emb", "rr"] {
        load(&m, name).await.unwrap();
    }
    assert_eq!(loaded(&m), ["chat", "emb", "rr"]);
    load(&m, "chat2").await.unwrap();
    assert_eq!(loaded(&m), ["chat2", "emb", "rr"], "an llm load evicts only the llm");
}

#[tokio::test(start_paused = true)]
async fn npu_is_exclusive_across_types() {
    let (m, _) = manager(json!({ "max_loaded_models": { "llm": 4 }, "models": {
        "npu-chat": stub(json!({ "device": "npu" })),
        "npu-emb": stub(json!({ "device": ["gpu", "npu"], "labels": ["embedding"] })),
        "gpu-chat": stub(json!({ "device": "gpu" })),
    } }));
    load(&m, "npu-chat").await.unwrap();
    load(&m, "gpu-chat").await.unwrap();
    load(&m, "npu-emb").await.unwrap();
    assert_eq!(
        loaded(&m),
        ["npu-emb", "gpu-chat"],
        "the NPU holder is evicted regardless of type and limits"
    );
}

#[tokio::test(start_paused = true)]
async fn not_found_failure_evicts_nothing() {
    let (m, _) = manager(json!({ "max_loaded_models": { "llm": 3 }, "models": {
        "a": stub(json!({})), "b": stub(json!({ "labels": ["embedding"] })),
        "missing": stub(json!({ "stub": { "not_found": true } }))
    } }));
    load(&m, "a").await.unwrap();
    load(&m, "b").await.unwrap();
    let err = load(&m, "missing").await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::LoadFailed);
    assert_eq!(loaded(&m), ["a", "b"]);
    let snap = m.model("missing").unwrap();
    assert!(snap.last_error.as_deref().unwrap().contains("not found"));
    assert!(!snap.last_error_has_retry());
}

trait RetryNote {
    fn last_error_has_retry(&self) -> bool;
}

impl RetryNote for hangar_runtime::ModelSnapshot {
    fn last_error_has_retry(&self) -> bool {
        self.last_error.as_deref().is_some_and(|e| e.contains("retry"))
    }
}

#[tokio::test(start_paused = true)]
async fn other_failure_evicts_everything_and_retries_once() {
    let (m, stub_backend) = manager(json!({ "max_loaded_models": { "llm": 3 }, "models": {
        "a": stub(json!({})), "b": stub(json!({ "labels": ["reranking"] })),
        "oom": stub(json!({ "stub": { "fail_load": "CUDA out of memory" } }))
    } }));
    load(&m, "a").await.unwrap();
    load(&m, "b").await.unwrap();
    let before = stub_backend.loads_started();
    let err = load(&m, "oom").await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::LoadFailed);
    assert!(loaded(&m).is_empty(), "every other model was evicted");
    assert_eq!(stub_backend.loads_started() - before, 2, "one retry, no more");
    let last_error = m.model("oom").unwrap().last_error.unwrap();
    assert!(
        last_error.contains("CUDA out of memory") && last_error.contains("retry"),
        "{last_error}"
    );
}

#[tokio::test(start_paused = true)]
async fn loads_are_serialized() {
    let (m, _) = manager(json!({ "max_loaded_models": { "llm": 3 }, "models": {
        "a": stub(json!({ "stub": { "load_delay_ms": 1000 } })),
        "b": stub(json!({ "stub": { "load_delay_ms": 1000 } })),
        "c": stub(json!({ "stub": { "load_delay_ms": 1000 } })),
    } }));
    let start = tokio::time::Instant::now();
    let tasks: Vec<_> = ["a", "b", "c"]
        .into_iter()
        .map(|n| {
            let m = m.clone();
            tokio::spawn(async move { m.load(n, LoadOptions::default()).await })
        })
        .collect();
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    // Three CPU models share the host's lane: three one-second loads one after another
    // take three seconds of virtual time.
    assert!(start.elapsed() >= Duration::from_secs(3), "{:?}", start.elapsed());
}

#[tokio::test(start_paused = true)]
async fn eviction_is_decided_when_the_load_leaves_the_queue() {
    let (m, _) = manager(json!({ "models": {
        "a": stub(json!({})),
        "b": stub(json!({ "stub": { "load_delay_ms": 1000 } })),
        "c": stub(json!({})),
    } }));
    load(&m, "a").await.unwrap();
    let mut changes = m.subscribe();
    let b = tokio::spawn({
        let m = m.clone();
        async move { m.load("b", LoadOptions::default()).await }
    });
    settle().await;
    let c = tokio::spawn({
        let m = m.clone();
        async move { m.load("c", LoadOptions::default()).await }
    });
    b.await.unwrap().unwrap();
    c.await.unwrap().unwrap();
    // `c` was queued while `a` was loaded; had it planned then, it would have picked `a`.
    // Planned on leaving the queue, it evicts `b`, which had loaded meanwhile.
    assert_eq!(loaded(&m), ["c"]);
    let mut max_loaded = 0usize;
    let mut now_loaded = 1usize;
    while let Ok(ch) = changes.try_recv() {
        if ch.to == hangar_lifecycle::ModelState::Loaded {
            now_loaded += 1;
        }
        if ch.from == hangar_lifecycle::ModelState::Loaded {
            now_loaded -= 1;
        }
        max_loaded = max_loaded.max(now_loaded);
    }
    assert_eq!(max_loaded, 1, "never more llms loaded than the limit");
}

#[tokio::test(start_paused = true)]
async fn busy_model_finishes_its_request_before_eviction() {
    let (m, _) = manager(json!({ "models": { "a": stub(json!({})), "b": stub(json!({})) } }));
    load(&m, "a").await.unwrap();
    let running = spawn_generate(&m, "a", 50); // 500 ms
    settle().await;
    let start = tokio::time::Instant::now();
    load(&m, "b").await.unwrap();
    let text = running.await.unwrap().unwrap();
    assert_eq!(text.split(' ').count(), 50, "the request was not cut short");
    assert!(start.elapsed() >= Duration::from_millis(450), "the load waited for the drain");
    assert_eq!(loaded(&m), ["b"]);
}

#[tokio::test(start_paused = true)]
async fn idle_model_is_evicted_before_a_busy_one() {
    let (m, _) = manager(json!({ "max_loaded_models": { "llm": 2 }, "models": {
        "busy": stub(json!({})), "idle": stub(json!({})), "new": stub(json!({}))
    } }));
    load(&m, "busy").await.unwrap();
    load(&m, "idle").await.unwrap();
    let running = spawn_generate(&m, "busy", 30);
    settle().await;
    load(&m, "new").await.unwrap();
    assert_eq!(loaded(&m), ["busy", "new"]);
    running.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn auto_load_loads_the_model_and_serves_the_request() {
    let (m, _) = manager(json!({ "auto_load": true, "models": { "a": stub(json!({})) } }));
    assert!(generate(&m, "a", 3).await.is_ok());
    assert_eq!(loaded(&m), ["a"]);
}

#[tokio::test(start_paused = true)]
async fn auto_load_is_off_by_default_and_can_be_set_per_model() {
    let (m, _) = manager(
        json!({ "models": { "off": stub(json!({})), "on": stub(json!({ "auto_load": true })) } }),
    );
    assert_eq!(generate(&m, "off", 1).await.unwrap_err().code(), ErrorCode::ModelNotLoaded);
    assert!(generate(&m, "on", 1).await.is_ok());
    let (m, _) = manager(
        json!({ "auto_load": true, "models": { "off": stub(json!({ "auto_load": false })) } }),
    );
    assert_eq!(generate(&m, "off", 1).await.unwrap_err().code(), ErrorCode::ModelNotLoaded);
}

#[tokio::test(start_paused = true)]
async fn auto_loaded_request_runs_before_its_model_can_be_evicted() {
    let (m, _) = manager(json!({ "auto_load": true, "models": {
        "a": stub(json!({ "target_inflight": 1 })), "b": stub(json!({}))
    } }));
    // The request for `a` triggers its load; a load of `b` (same type, limit 1) is queued
    // right behind it and will plan to evict `a`.
    let request = spawn_generate(&m, "a", 20);
    settle().await;
    let b = tokio::spawn({
        let m = m.clone();
        async move { m.load("b", LoadOptions::default()).await }
    });
    let text = request.await.unwrap().expect("the triggering request ran");
    assert_eq!(text.split(' ').count(), 20);
    b.await.unwrap().unwrap();
    assert_eq!(loaded(&m), ["b"]);
}

#[tokio::test(start_paused = true)]
async fn auto_load_of_a_failing_model_answers_model_failed() {
    let (m, _) = manager(
        json!({ "auto_load": true, "models": { "x": stub(json!({ "stub": { "fail_load": "bad weights" } })) } }),
    );
    let err = generate(&m, "x", 1).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::ModelFailed);
    assert!(err.to_string().contains("bad weights"));
}
