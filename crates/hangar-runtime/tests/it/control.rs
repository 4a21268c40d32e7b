//! The control plane's own rules, as scenarios on the stub engine (paused clock):
//!
//! - one grant: a reload or a weight update loads a second copy of the model's weights, so
//!   it is admitted against the VRAM budget like a load (evicting by the same rules, or
//!   refused with the shortfall), and the model being replaced is held meanwhile;
//! - what an operator set survives a reload: the pause, and the requests it retracted;
//! - a lease is never granted on a model whose unload has been decided;
//! - callers that hang up after any number of polls leave nothing half-done (a checksum's
//!   pause, a lease being acquired, an unload's revocation of leases);
//! - the peers' lifecycle bugs, as named scenarios.

use std::time::Duration;

use hangar_lifecycle::ModelState;
use hangar_runtime::{
    ErrorCode, EventKind, LoadOptions, Manager, ManagerError, PauseMode, WeightUpdate,
    WeightsAction,
};
use serde_json::json;

use crate::support::*;

fn row(m: &Manager, name: &str) -> hangar_runtime::ModelSnapshot {
    m.model(name).unwrap()
}

fn evictions_for(m: &Manager, incoming: &str) -> Vec<String> {
    m.follow_events(Some((m.events_epoch(), 0)))
        .backlog
        .into_iter()
        .filter_map(|e| match e.kind {
            EventKind::Evicted { reason, for_model } if for_model == incoming => {
                Some(format!("{}:{reason}", e.model))
            }
            _ => None,
        })
        .collect()
}

/// A budget of 6,600 MiB with 1,000 used by something else; `m` takes `m_mib`, `other`
/// 2,500.
async fn small_gpu(m_mib: u64) -> (Manager, std::sync::Arc<hangar_stub::StubGpu>) {
    let gpu_model = json!({ "backend": "stub", "device": "gpu" });
    let (m, _, gpu) = manager_on_gpu(
        json!({
            "max_loaded_models": { "llm": 4 },
            "vram_budget": 6600,
            "models": { "m": gpu_model.clone(), "other": gpu_model }
        }),
        1000,
    );
    gpu.set_footprint("m", m_mib);
    gpu.set_footprint("other", 2500);
    // Measured once, so admission knows both figures.
    for name in ["m", "other"] {
        m.load(name, LoadOptions::default()).await.unwrap();
        m.unload(name).await.unwrap();
    }
    (m, gpu)
}

#[tokio::test(start_paused = true)]
async fn a_weight_update_whose_second_copy_does_not_fit_is_refused_with_the_shortfall() {
    let (m, gpu) = small_gpu(4000).await;
    m.load("m", LoadOptions::default()).await.unwrap();
    // 1,000 + 4,000 in use; a second copy of 4,000 needs 9,000 of a 6,600 budget, and
    // nothing else can be evicted for it.
    let err = m.update_weights_from_disk("m", WeightUpdate::default()).await.unwrap_err();
    let ManagerError::InsufficientVram { model, shortfall } = &err else { panic!("{err:?}") };
    assert_eq!(model, "m");
    assert_eq!((shortfall.needed_mib, shortfall.free_mib), (4000, 1600));
    assert_eq!(err.code(), ErrorCode::InsufficientVram);
    assert_eq!(gpu.used_mib(), 5000, "no second copy was loaded");
    let row = row(&m, "m");
    assert_eq!(row.runtime_state, ModelState::Loaded, "the old weights keep serving");
    assert_eq!(row.pause, None, "the refusal undid the update's pause");
    assert!(generate(&m, "m", 2).await.is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_reload_whose_second_copy_does_not_fit_evicts_idle_models_by_the_same_rules() {
    let (m, gpu) = small_gpu(2000).await;
    m.load("other", LoadOptions::default()).await.unwrap();
    m.load("m", LoadOptions::default()).await.unwrap();
    // 1,000 + 2,500 + 2,000 = 5,500 in use: a second copy of m (2,000) needs other gone.
    m.reload("m", LoadOptions::default()).await.unwrap();
    assert_eq!(row(&m, "other").runtime_state, ModelState::Unloaded);
    assert_eq!(evictions_for(&m, "m"), ["other:vram_budget"]);
    assert_eq!(row(&m, "m").runtime_state, ModelState::Loaded);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(gpu.used_mib(), 3000, "the old copy was released after the swap");
}

#[tokio::test(start_paused = true)]
async fn a_model_being_updated_is_held_and_never_evicted_under_the_update() {
    let slow = json!({ "backend": "stub", "stub": { "load_delay_ms": 1000 } });
    let (m, _) = manager(json!({
        "max_loaded_models": { "llm": 2 },
        "models": { "a": { "backend": "stub" }, "b": { "backend": "stub" }, "c": slow }
    }));
    m.load("a", LoadOptions::default()).await.unwrap();
    // c's slow load is under way; b's load and then a's update wait behind it.
    let c = spawn_load(&m, "c");
    settle().await;
    let b = spawn_load(&m, "b");
    settle().await;
    let update = WeightUpdate { weight_version: Some("v2".into()), ..WeightUpdate::default() };
    let update = tokio::spawn({
        let m = m.clone();
        async move { m.update_weights_from_disk("a", update).await }
    });
    c.await.unwrap().unwrap();
    b.await.unwrap().unwrap();
    let updated = update.await.unwrap();
    // b needed a slot: the least recently used model that is not held went (c), not a.
    let a = row(&m, "a");
    assert_eq!(a.runtime_state, ModelState::Loaded, "a was evicted under its update");
    let updated = updated.unwrap();
    assert_eq!(updated.weight_version.as_deref(), Some("v2"));
    assert_eq!(a.weight_version.as_deref(), Some("v2"));
    assert_eq!(row(&m, "c").runtime_state, ModelState::Unloaded);
}

#[tokio::test(start_paused = true)]
async fn a_reload_keeps_the_pause_that_was_set() {
    let (m, _) = manager(json!({ "models": { "a": { "backend": "stub" } } }));
    m.load("a", LoadOptions::default()).await.unwrap();
    m.pause("a", PauseMode::InPlace).await.unwrap();
    let reloaded = m.reload("a", LoadOptions::default()).await.unwrap();
    assert_eq!(reloaded.pause.map(|p| p.mode), Some(PauseMode::InPlace));
    let waiting = spawn_generate(&m, "a", 2);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(!waiting.is_finished(), "the reloaded model still admits nothing");
    m.resume("a").await.unwrap();
    assert_eq!(waiting.await.unwrap().unwrap().split_whitespace().count(), 2);
}

#[tokio::test(start_paused = true)]
async fn requests_retracted_before_a_reload_move_to_the_new_runtimes() {
    let (m, stub) = manager(json!({ "models": {
        "a": { "backend": "stub", "stub": { "token_latency_ms": 100 } }
    } }));
    m.load("a", LoadOptions::default()).await.unwrap();
    let request = spawn_generate(&m, "a", 30);
    tokio::time::sleep(Duration::from_millis(550)).await;
    m.pause("a", PauseMode::Retract).await.unwrap();
    settle().await;
    m.reload("a", LoadOptions::default()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(stub.live_runtimes(), 1, "the old runtime was released");
    assert!(!request.is_finished(), "the retracted request waits on the paused new runtime");
    m.resume("a").await.unwrap();
    let text = request.await.unwrap().expect("the retracted request resumed on the new runtime");
    assert_eq!(text.split_whitespace().count(), 30, "{text}");
}

#[tokio::test(start_paused = true)]
async fn a_lease_is_never_granted_on_a_model_whose_unload_has_been_decided() {
    let slow = json!({ "backend": "stub", "stub": { "load_delay_ms": 1000 } });
    let (m, _) = manager(json!({ "models": { "a": slow } }));
    m.load("a", LoadOptions::default()).await.unwrap();
    // A reload holds the model; an unload asked meanwhile is decided, and waits its turn.
    let reload = tokio::spawn({
        let m = m.clone();
        async move { m.reload("a", LoadOptions::default()).await }
    });
    settle().await;
    let unload = tokio::spawn({
        let m = m.clone();
        async move { m.unload("a").await }
    });
    settle().await;
    let lease = m.acquire_lease("a", "job", 600).await;
    reload.await.unwrap().unwrap();
    unload.await.unwrap().unwrap();
    match lease {
        // Granted: then it holds a loaded model.
        Ok(lease) => {
            let a = row(&m, "a");
            assert_eq!(a.runtime_state, ModelState::Loaded, "granted, then unloaded");
            assert_eq!(a.leases.iter().map(|l| &l.id).collect::<Vec<_>>(), [&lease.id]);
        }
        Err(e) => assert_eq!(e.code(), ErrorCode::StateConflict, "{e}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_lease_that_ends_while_its_model_loads_is_not_granted() {
    let slow = json!({ "backend": "stub", "stub": { "load_delay_ms": 2000 } });
    let (m, _) = manager(json!({ "models": { "a": slow } }));
    let acquire = |ttl| {
        let m = m.clone();
        tokio::spawn(async move { m.acquire_lease("a", "job", ttl).await })
    };
    // Released by its id (listed in the row while the model loads) before it was granted.
    let first = acquire(600);
    settle().await;
    let reserved = row(&m, "a").leases;
    assert_eq!(reserved.len(), 1, "the reservation is listed while the model loads");
    m.release_lease("a", &reserved[0].id).await.unwrap();
    let refused = first.await.unwrap().expect_err("a released lease was granted");
    assert_eq!(refused.code(), ErrorCode::StateConflict, "{refused}");
    assert_eq!(row(&m, "a").runtime_state, ModelState::Loaded, "the load itself went on");
    m.unload("a").await.unwrap();
    // Shorter than the load: it expires before the model is loaded.
    let refused = acquire(1).await.unwrap().expect_err("an expired lease was granted");
    assert_eq!(refused.code(), ErrorCode::StateConflict, "{refused}");
    assert_eq!(row(&m, "a").leases, []);
    let journal = m.follow_events(Some((m.events_epoch(), 0))).backlog;
    let changes: Vec<String> = journal
        .into_iter()
        .filter_map(|e| match e.kind {
            EventKind::Lease { change, .. } => Some(format!("{change:?}")),
            _ => None,
        })
        .collect();
    assert_eq!(changes, ["Released", "Expired"], "neither was ever acquired");
}

/// A copy of the tiny GGUF fixture for the weights checker to read.
fn weights_file() -> String {
    concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/models/tiny-llama.gguf").to_owned()
}

#[tokio::test(start_paused = true)]
async fn a_checksum_whose_caller_hangs_up_never_leaves_the_model_paused() {
    let (m, _) = manager(json!({ "models": {
        "a": { "backend": "stub", "model_path": weights_file() }
    } }));
    m.load("a", LoadOptions::default()).await.unwrap();
    hang_up_after_every_poll(
        || m.check_weights("a", WeightsAction::Checksum),
        |polls| {
            let m = m.clone();
            async move {
                assert_eq!(row(&m, "a").pause, None, "left paused after {polls} polls");
            }
        },
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_lease_whose_caller_hangs_up_is_either_granted_whole_or_not_at_all() {
    let slow = json!({ "backend": "stub", "stub": { "load_delay_ms": 1000 } });
    let (m, _) = manager(json!({ "models": { "a": slow } }));
    hang_up_after_every_poll(
        || m.acquire_lease("a", "job", 600),
        |polls| {
            let m = m.clone();
            async move {
                let a = row(&m, "a");
                let acquired: Vec<String> = m
                    .follow_events(Some((m.events_epoch(), 0)))
                    .backlog
                    .into_iter()
                    .filter_map(|e| match e.kind {
                        EventKind::Lease {
                            id,
                            change: hangar_runtime::LeaseChange::Acquired,
                            ..
                        } => Some(id),
                        _ => None,
                    })
                    .collect();
                // A lease its caller never heard of is journaled like any other (its
                // holder can list and release it); never one on a model that is not
                // loaded, nor one the journal does not show.
                for lease in &a.leases {
                    assert_eq!(a.runtime_state, ModelState::Loaded, "after {polls} polls");
                    assert!(acquired.contains(&lease.id), "{} never journaled", lease.id);
                }
            }
        },
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn an_unload_whose_caller_hangs_up_still_revokes_the_leases() {
    let slow = json!({ "backend": "stub", "stub": { "unload_delay_ms": 1000 } });
    let (m, _) = manager(json!({ "models": { "a": slow } }));
    hang_up_after_every_poll(
        || {
            let m = m.clone();
            async move {
                m.acquire_lease("a", "job", 600).await.unwrap();
                m.unload("a").await
            }
        },
        |polls| {
            let m = m.clone();
            async move {
                let a = row(&m, "a");
                if a.runtime_state == ModelState::Unloaded {
                    assert_eq!(a.leases, [], "leases outlived the unload after {polls} polls");
                }
                let _ = m.unload("a").await;
                assert_eq!(row(&m, "a").leases, []);
            }
        },
    )
    .await;
}

/// `what`, which must end within a minute.
async fn bounded<F: std::future::Future>(what: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(60), what).await.expect("hung")
}

/// Ollama #17408: a model being evicted is asked for again half-way; the load that evicts
/// it and every later one finish, and the model serves again afterwards.
#[tokio::test(start_paused = true)]
async fn a_victim_asked_for_during_its_eviction_never_hangs_the_load_queue() {
    let slow = json!({ "backend": "stub", "stub": { "unload_delay_ms": 1000 } });
    let (m, _) = manager(json!({
        "auto_load": true,
        "max_loaded_models": { "llm": 1 },
        "models": { "a": slow, "b": { "backend": "stub" }, "c": { "backend": "stub" } }
    }));
    m.load("a", LoadOptions::default()).await.unwrap();
    let b = spawn_load(&m, "b");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(row(&m, "a").runtime_state, ModelState::Unloading);
    let again = spawn_generate(&m, "a", 2);
    bounded(b).await.unwrap().unwrap();
    match bounded(again).await.unwrap() {
        Ok(text) => assert_eq!(text.split_whitespace().count(), 2),
        Err(e) => assert_eq!(e.code(), ErrorCode::ModelUnloading, "{e}"),
    }
    bounded(spawn_load(&m, "c")).await.unwrap().unwrap();
    assert_eq!(bounded(generate(&m, "a", 2)).await.unwrap().split_whitespace().count(), 2);
    assert_eq!(loaded(&m), ["a"]);
}

/// Ollama PR #10819: loads whose callers hang up, again and again, leave exactly the one
/// engine the last load made.
#[tokio::test(start_paused = true)]
async fn rapid_load_cancel_load_leaks_no_engine() {
    let slow =
        json!({ "backend": "stub", "stub": { "load_delay_ms": 500, "unload_delay_ms": 200 } });
    let (m, stub) = manager(json!({ "models": { "a": slow } }));
    for round in 0..6 {
        let _ = tokio::time::timeout(
            Duration::from_millis(50 * round),
            m.load("a", LoadOptions::default()),
        )
        .await;
        if round % 2 == 1 {
            let _ = tokio::time::timeout(Duration::from_millis(10), m.unload("a")).await;
        }
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    m.load("a", LoadOptions::default()).await.unwrap();
    assert_eq!(stub.live_runtimes(), 1, "one model, one engine");
    m.unload("a").await.unwrap();
    assert_eq!(stub.live_runtimes(), 0);
}

/// LocalAI v4.8.0: requests that end every way (finished, cancelled while queued, while
/// running, while their model auto-loads) leave no in-flight count behind, so the model is
/// idle and can be evicted.
#[tokio::test(start_paused = true)]
async fn an_inflight_count_never_outlives_its_request() {
    let model = json!({ "backend": "stub", "target_inflight": 1,
        "stub": { "token_latency_ms": 100, "load_delay_ms": 500 } });
    let (m, _) = manager(json!({
        "auto_load": true,
        "max_loaded_models": { "llm": 1 },
        "models": { "a": model, "b": { "backend": "stub" } }
    }));
    // Cancelled while its model auto-loads.
    let _ = tokio::time::timeout(Duration::from_millis(100), generate(&m, "a", 5)).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    // One running, one queued; both cancelled.
    let running = spawn_generate(&m, "a", 50);
    settle().await;
    let queued = spawn_generate(&m, "a", 50);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!((row(&m, "a").runtime_inflight, row(&m, "a").queue_depth), (1, 1));
    running.abort();
    queued.abort();
    let _ = (running.await, queued.await);
    settle().await;
    // One that finishes.
    generate(&m, "a", 2).await.unwrap();
    let a = row(&m, "a");
    assert_eq!((a.inflight_requests, a.runtime_inflight, a.queue_depth), (0, 0, 0));
    // Idle: b's load evicts it without waiting for anything.
    let loaded_b =
        tokio::time::timeout(Duration::from_secs(1), m.load("b", LoadOptions::default()));
    loaded_b.await.expect("a was idle").unwrap();
    assert_eq!(loaded(&m), ["b"]);
}

/// A load, a reload and a weight update whose callers hang up after any number of polls
/// still end whole: the model serves on exactly one engine, is not paused, and is not held
/// (an eviction can take it).
#[tokio::test(start_paused = true)]
async fn loads_reloads_and_updates_whose_callers_hang_up_end_whole() {
    let slow =
        json!({ "backend": "stub", "stub": { "load_delay_ms": 300, "unload_delay_ms": 100 } });
    let (m, stub) = manager(json!({
        "max_loaded_models": { "llm": 1 },
        "models": { "a": slow, "b": { "backend": "stub" } }
    }));
    let consistent = |polls: usize, what: &'static str| {
        let (m, stub) = (m.clone(), stub.clone());
        async move {
            let a = row(&m, "a");
            let engines = usize::from(a.runtime_state == ModelState::Loaded);
            assert_eq!(stub.live_runtimes(), engines, "{what} after {polls} polls: {a:?}");
            assert_eq!(a.pause, None, "{what} after {polls} polls");
        }
    };
    hang_up_after_every_poll(|| m.load("a", LoadOptions::default()), |n| consistent(n, "load"))
        .await;
    hang_up_after_every_poll(|| m.reload("a", LoadOptions::default()), |n| consistent(n, "reload"))
        .await;
    hang_up_after_every_poll(
        || m.update_weights_from_disk("a", WeightUpdate::default()),
        |n| consistent(n, "update"),
    )
    .await;
    // Nothing still holds a: b's load evicts it.
    m.load("b", LoadOptions::default()).await.unwrap();
    assert_eq!(loaded(&m), ["b"]);
}

/// An unload-all (which does not wait for admin operations: it is also the shutdown path)
/// asked while new weights load: the update either swapped them in while the model still
/// served, and the journal shows that before the unload began, or it answers a conflict;
/// either way no engine is left once the unload is done.
#[tokio::test(start_paused = true)]
async fn an_unload_all_during_an_update_leaves_an_honest_answer_and_no_engine() {
    let slow =
        json!({ "backend": "stub", "stub": { "load_delay_ms": 500, "unload_delay_ms": 2000 } });
    let (m, stub) = manager(json!({ "models": { "a": slow } }));
    m.load("a", LoadOptions::default()).await.unwrap();
    let update = tokio::spawn({
        let m = m.clone();
        async move { m.update_weights_from_disk("a", WeightUpdate::default()).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let all = tokio::spawn({
        let m = m.clone();
        async move { m.unload_all().await }
    });
    let updated = update.await.unwrap();
    assert_eq!(all.await.unwrap(), ["a"]);
    let order: Vec<String> = m
        .follow_events(Some((m.events_epoch(), 0)))
        .backlog
        .into_iter()
        .filter_map(|e| match e.kind {
            EventKind::WeightsUpdated { .. } => Some("weights_updated".to_owned()),
            EventKind::State { to, .. } => Some(to.to_string()),
            _ => None,
        })
        .collect();
    match updated {
        Ok(_) => assert_eq!(
            order,
            ["loading", "loaded", "weights_updated", "unloading", "unloaded"],
            "the update answered success"
        ),
        Err(e) => assert_eq!(e.code(), ErrorCode::StateConflict, "{e}"),
    }
    assert_eq!(row(&m, "a").runtime_state, ModelState::Unloaded);
    assert_eq!(stub.live_runtimes(), 0, "no engine left, old or new");
}

/// Admin operations on one model take turns in the order asked; those whose callers went
/// away while they waited hold nothing, so the next operation gets its turn at once.
#[tokio::test(start_paused = true)]
async fn admin_turns_go_in_order_and_callers_that_left_hold_nothing() {
    let slow = json!({ "backend": "stub", "stub": { "load_delay_ms": 1000 } });
    let (m, _) = manager(json!({ "admin_lock_timeout_s": 30, "models": { "m": slow } }));
    let load = spawn_load(&m, "m");
    settle().await;
    let modes = [PauseMode::InPlace, PauseMode::Retract, PauseMode::Abort];
    let (mut stay, mut leave) = (Vec::new(), Vec::new());
    for i in 0..12 {
        let (m, mode) = (m.clone(), modes[i / 2 % 3]);
        let task = tokio::spawn(async move { m.pause("m", mode).await });
        if i % 2 == 0 {
            stay.push(task)
        } else {
            leave.push(task)
        }
        settle().await;
    }
    for task in &leave {
        task.abort();
    }
    load.await.unwrap().unwrap();
    let started = tokio::time::Instant::now();
    for task in stay {
        task.await.unwrap().unwrap();
    }
    // In the order asked: the last pause's mode is the one in effect.
    let pause = row(&m, "m").pause.expect("paused");
    assert_eq!(pause.mode, PauseMode::Abort);
    // Nobody holds the model: an unload is not answered `admin_busy` after 30 s.
    m.unload("m").await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(30), "{:?}", started.elapsed());
    assert_eq!(state(&m, "m"), "unloaded");
}

#[tokio::test(start_paused = true)]
async fn an_unload_unless_held_refuses_pinned_and_leased_models_and_revokes_nothing() {
    let stub = json!({ "backend": "stub" });
    let pinned = json!({ "backend": "stub", "pinned": true });
    let (m, _) = manager(json!({ "max_loaded_models": { "llm": 3 },
        "models": { "a": stub.clone(), "pinned": pinned, "free": stub } }));
    for name in ["a", "pinned", "free"] {
        m.load(name, LoadOptions::default()).await.unwrap();
    }
    let lease = m.acquire_lease("a", "job", 600).await.unwrap();
    let refused = m.unload_unless_held("a").await.expect_err("a leased model was unloaded");
    assert_eq!(refused.code(), ErrorCode::StateConflict);
    assert!(refused.to_string().contains("is leased"), "{refused}");
    let a = row(&m, "a");
    assert_eq!(a.runtime_state, ModelState::Loaded);
    assert_eq!(a.leases.iter().map(|l| &l.id).collect::<Vec<_>>(), [&lease.id], "kept");
    // A refused unload leaves no decision behind: leases are granted again.
    m.acquire_lease("a", "job", 600).await.expect("a second lease");
    let refused = m.unload_unless_held("pinned").await.expect_err("a pinned model was unloaded");
    assert!(refused.to_string().contains("is pinned by its config"), "{refused}");
    assert_eq!(row(&m, "pinned").runtime_state, ModelState::Loaded);
    let free = m.unload_unless_held("free").await.unwrap();
    assert_eq!(free.runtime_state, ModelState::Unloaded);
    // An unloaded model answers with its state, held or not.
    m.unload("pinned").await.unwrap();
    assert_eq!(m.unload_unless_held("pinned").await.unwrap().runtime_state, ModelState::Unloaded);
}

#[tokio::test(start_paused = true)]
async fn a_lease_racing_an_unload_unless_held_either_holds_a_loaded_model_or_was_refused() {
    for order in 0..2 {
        let (m, _) = manager(json!({ "models": { "a": { "backend": "stub" } } }));
        m.load("a", LoadOptions::default()).await.unwrap();
        let (lease, unload) = {
            let (l, u) = (m.clone(), m.clone());
            let lease = async move { l.acquire_lease("a", "job", 600).await };
            let unload = async move { u.unload_unless_held("a").await };
            if order == 0 {
                let lease = tokio::spawn(lease);
                let unload = tokio::spawn(unload);
                (lease.await.unwrap(), unload.await.unwrap())
            } else {
                let unload = tokio::spawn(unload);
                let lease = tokio::spawn(lease);
                (lease.await.unwrap(), unload.await.unwrap())
            }
        };
        let a = row(&m, "a");
        // Invariant: a granted lease always holds a loaded model, and exactly one side won.
        match (lease, unload) {
            (Ok(lease), Err(_)) => {
                assert_eq!(a.runtime_state, ModelState::Loaded);
                assert_eq!(a.leases.iter().map(|l| &l.id).collect::<Vec<_>>(), [&lease.id]);
            }
            (Err(_), Ok(_)) => assert_eq!(a.runtime_state, ModelState::Unloaded),
            other => panic!("order {order}: both or neither won: {other:?}"),
        }
    }
}
