//! Sleep and wake through the manager, on the stub engine (`stub.sleeps`: asleep, it gives
//! its pretend GPU memory back and serves nothing): the model stays loaded and says where
//! it resides, a request wakes it, a woken engine that answers otherwise fails the model,
//! an engine that cannot sleep is refused, and an operator's pause outlasts a sleep.

use hangar_backend::SleepLevel;
use hangar_runtime::{
    ErrorCode, EventKind, LoadOptions, Manager, ModelState, PauseMode, Residency,
};
use serde_json::json;

use std::time::Duration;

use crate::support::{generate, hang_up_after_every_poll, manager_on_gpu, settle, spawn_generate};

const BASE_MIB: u64 = 1000;

/// A manager with a sleeping stub `sleeper` (2,000 MiB on the pretend GPU), a stub
/// `wrong` that answers otherwise once woken, and a stub `awake` that cannot sleep.
fn setup() -> (Manager, std::sync::Arc<hangar_stub::StubGpu>) {
    let (m, _, gpu) = manager_on_gpu(
        json!({
            "max_loaded_models": { "llm": 4 },
            "models": {
                "sleeper": { "backend": "stub", "device": "gpu", "replicas": 2, "replica_max": 2,
                             "stub": { "sleeps": true } },
                "wrong": { "backend": "stub", "stub": { "sleeps": true, "reply_after_wake": "wrong" } },
                "awake": { "backend": "stub" }
            }
        }),
        BASE_MIB,
    );
    gpu.set_footprint("sleeper", 1000);
    (m, gpu)
}

fn residency(m: &Manager, name: &str) -> Option<Residency> {
    m.model(name).unwrap().residency
}

/// The sleep and wake events of the journal so far, as `slept <level>` / `woke`.
fn sleep_events(m: &Manager, name: &str) -> Vec<String> {
    let follow = m.follow_events(Some((m.events_epoch(), 0)));
    follow
        .backlog
        .into_iter()
        .filter(|e| e.model == name)
        .filter_map(|e| match e.kind {
            EventKind::Slept { level, .. } => Some(format!("slept {}", level.as_str())),
            EventKind::Woke { .. } => Some("woke".to_owned()),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_sleeping_model_stays_loaded_gives_its_memory_back_and_wakes_the_same() {
    let (m, gpu) = setup();
    assert_eq!(residency(&m, "sleeper"), None, "not loaded: nowhere");
    m.load("sleeper", LoadOptions::default()).await.unwrap();
    assert_eq!(gpu.used_mib(), BASE_MIB + 2000, "two replicas");
    assert_eq!(residency(&m, "sleeper"), Some(Residency::Awake));
    let before = generate(&m, "sleeper", 6).await.unwrap();

    let row = m.sleep("sleeper").await.unwrap();
    assert_eq!(row.runtime_state, ModelState::Loaded, "asleep is loaded");
    let Some(Residency::Asleep { level, gpu_freed_mib, gpu_held_mib, .. }) = row.residency else {
        panic!("{:?}", row.residency)
    };
    assert_eq!(level, SleepLevel::Context);
    assert_eq!(gpu.used_mib(), BASE_MIB, "both replicas gave their memory back");
    // The row says what the sleep gave back and what the model still holds.
    assert_eq!((gpu_freed_mib, gpu_held_mib), (2000, 0), "{:?}", row.vram_detail);
    m.sleep("sleeper").await.expect("asleep already changes nothing");

    let row = m.wake("sleeper").await.unwrap();
    assert_eq!(row.residency, Some(Residency::Awake));
    assert_eq!(gpu.used_mib(), BASE_MIB + 2000);
    assert_eq!(generate(&m, "sleeper", 6).await.unwrap(), before);
    m.wake("sleeper").await.expect("awake already changes nothing");
    assert_eq!(sleep_events(&m, "sleeper"), ["slept context", "woke"]);

    // Asleep, it unloads as well, and gives back nothing twice.
    m.sleep("sleeper").await.unwrap();
    m.unload("sleeper").await.unwrap();
    assert_eq!((gpu.used_mib(), residency(&m, "sleeper")), (BASE_MIB, None));
}

#[tokio::test]
async fn a_request_for_a_sleeping_model_waits_in_its_queue_while_it_wakes() {
    let (m, _) = setup();
    m.load("sleeper", LoadOptions::default()).await.unwrap();
    let before = generate(&m, "sleeper", 6).await.unwrap();
    m.sleep("sleeper").await.unwrap();
    let answers: Vec<_> = (0..3).map(|_| spawn_generate(&m, "sleeper", 6)).collect();
    for answer in answers {
        assert_eq!(answer.await.unwrap().unwrap(), before);
    }
    assert_eq!(residency(&m, "sleeper"), Some(Residency::Awake));
    assert_eq!(sleep_events(&m, "sleeper"), ["slept context", "woke"], "one wake for three");
}

#[tokio::test]
async fn a_woken_engine_that_answers_otherwise_fails_the_model_with_why() {
    let (m, _) = setup();
    m.load("wrong", LoadOptions::default()).await.unwrap();
    m.sleep("wrong").await.unwrap();
    let refused = generate(&m, "wrong", 6).await.unwrap_err();
    assert_eq!(refused.code(), ErrorCode::ModelFailed, "{refused}");
    let row = m.model("wrong").unwrap();
    assert_eq!(row.runtime_state, ModelState::Failed);
    let why = row.last_error.unwrap();
    assert!(why.contains("wake check") && why.contains("\"wrong\""), "{why}");
    // Asked directly, the wake says so too.
    m.load("wrong", LoadOptions::default()).await.unwrap();
    m.sleep("wrong").await.unwrap();
    let failed = m.wake("wrong").await.unwrap_err();
    assert_eq!(failed.code(), ErrorCode::RuntimeError, "{failed}");
    assert_eq!(m.model("wrong").unwrap().runtime_state, ModelState::Failed);
}

#[tokio::test]
async fn an_engine_that_cannot_sleep_is_refused_and_serves_on() {
    let (m, _) = setup();
    let refused = m.sleep("awake").await.unwrap_err();
    assert_eq!(refused.code(), ErrorCode::StateConflict, "not loaded: {refused}");
    m.load("awake", LoadOptions::default()).await.unwrap();
    let refused = m.sleep("awake").await.unwrap_err();
    assert_eq!(refused.code(), ErrorCode::Unsupported, "{refused}");
    assert!(refused.to_string().contains("cannot sleep"), "{refused}");
    assert_eq!(residency(&m, "awake"), Some(Residency::Awake));
    generate(&m, "awake", 4).await.expect("it serves on");
}

#[tokio::test(start_paused = true)]
async fn an_operators_pause_outlasts_a_sleep_and_a_resume_wakes_waiting_requests() {
    let (m, _) = setup();
    m.load("sleeper", LoadOptions::default()).await.unwrap();
    m.pause("sleeper", PauseMode::InPlace).await.unwrap();
    m.sleep("sleeper").await.unwrap();
    m.wake("sleeper").await.unwrap();
    // Woken, but paused: a request waits.
    let waiting = spawn_generate(&m, "sleeper", 4);
    settle().await;
    assert!(!waiting.is_finished(), "the pause holds it");
    // Asleep and paused, a resume with a request waiting wakes the model for it.
    m.sleep("sleeper").await.unwrap();
    m.resume("sleeper").await.unwrap();
    waiting.await.unwrap().expect("served after the wake");
    assert_eq!(residency(&m, "sleeper"), Some(Residency::Awake));
}

#[tokio::test(start_paused = true)]
async fn an_idle_model_sleeps_before_it_is_unloaded_and_a_request_in_between_wakes_it() {
    let (m, _, gpu) = manager_on_gpu(
        json!({
            "models": { "idler": {
                "backend": "stub", "device": "gpu", "idle_sleep_seconds": 5,
                "idle_unload_seconds": 60, "stub": { "sleeps": true }
            } }
        }),
        BASE_MIB,
    );
    gpu.set_footprint("idler", 700);
    m.load("idler", LoadOptions::default()).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    assert_eq!(residency(&m, "idler"), Some(Residency::Awake), "not idle long enough");
    tokio::time::sleep(std::time::Duration::from_secs(4)).await;
    assert!(matches!(residency(&m, "idler"), Some(Residency::Asleep { .. })), "idle for 5 s");
    assert_eq!(gpu.used_mib(), BASE_MIB, "its memory given back");

    // A request wakes it, and its idle time starts again.
    generate(&m, "idler", 4).await.unwrap();
    assert_eq!(residency(&m, "idler"), Some(Residency::Awake));
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    assert_eq!(residency(&m, "idler"), Some(Residency::Awake), "used 3 s ago");
    // Asleep again, then unloaded once idle for a minute.
    tokio::time::sleep(std::time::Duration::from_secs(60)).await;
    assert_eq!(m.model("idler").unwrap().runtime_state, ModelState::Unloaded);
    assert_eq!(sleep_events(&m, "idler"), ["slept context", "woke", "slept context"]);
}

#[tokio::test]
async fn a_sleeping_model_makes_room_under_the_budget_and_its_wake_is_granted_room() {
    // The file (sparse) is the figure `other` is admitted by before it is measured.
    let (dir, file) = crate::support::sparse_file("sleep-room", 1500);
    let (m, _, gpu) = manager_on_gpu(
        json!({
            "vram_budget": 3200,
            "max_loaded_models": { "llm": 4 },
            "models": {
                "sleeper": { "backend": "stub", "device": "gpu", "stub": { "sleeps": true } },
                "other": { "backend": "stub", "device": "gpu", "model_path": file },
                "third": { "backend": "stub", "device": "gpu", "model_path": file }
            }
        }),
        BASE_MIB,
    );
    gpu.set_footprint("sleeper", 2000);
    gpu.set_footprint("other", 1500);
    gpu.set_footprint("third", 1500);
    m.load("sleeper", LoadOptions::default()).await.unwrap();
    // Asleep, it holds nothing on the GPU as admission counts it: other fits beside it.
    m.sleep("sleeper").await.unwrap();
    assert_eq!(m.model("sleeper").unwrap().vram_detail.unwrap().admission_mib, 2000);
    m.load("other", LoadOptions::default()).await.unwrap();
    assert_eq!(m.model("sleeper").unwrap().runtime_state, ModelState::Loaded, "not evicted");
    assert_eq!(gpu.used_mib(), BASE_MIB + 1500);

    // Its wake takes its 2,000 back: other (idle) is evicted for it first.
    m.wake("sleeper").await.unwrap();
    assert_eq!(m.model("other").unwrap().runtime_state, ModelState::Unloaded);
    assert_eq!(gpu.used_mib(), BASE_MIB + 2000, "never over the budget");

    // Asleep again beside other, the sleeper frees nothing if evicted: a load that needs
    // room takes it from other, though the sleeper was used less recently.
    m.sleep("sleeper").await.unwrap();
    m.load("other", LoadOptions::default()).await.unwrap();
    m.unload("other").await.unwrap();
    m.load("other", LoadOptions::default()).await.unwrap();
    let refused = m.load("third", LoadOptions::default()).await;
    assert!(refused.is_ok(), "{refused:?}");
    assert_eq!(m.model("other").unwrap().runtime_state, ModelState::Unloaded, "other made room");
    assert_eq!(m.model("sleeper").unwrap().runtime_state, ModelState::Loaded, "kept asleep");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(start_paused = true)]
async fn a_caller_that_hangs_up_never_leaves_a_sleep_or_a_wake_half_done() {
    let (m, _) = setup();
    m.load("sleeper", LoadOptions::default()).await.unwrap();
    // Whatever was done when the caller went away, a request is served (waking the model
    // when it sleeps): a closed gate nobody records would hold it forever.
    let served = |m: Manager, what: &'static str| async move {
        let answer = tokio::time::timeout(Duration::from_secs(60), generate(&m, "sleeper", 4));
        let answer = answer.await.unwrap_or_else(|_| panic!("{what}: a request hangs"));
        answer.unwrap_or_else(|e| panic!("{what}: {e}"));
    };
    hang_up_after_every_poll(
        || {
            let m = m.clone();
            async move { m.sleep("sleeper").await }
        },
        |_| served(m.clone(), "after a sleep hung up"),
    )
    .await;
    hang_up_after_every_poll(
        || {
            let m = m.clone();
            async move {
                m.sleep("sleeper").await.unwrap();
                m.wake("sleeper").await
            }
        },
        |_| served(m.clone(), "after a wake hung up"),
    )
    .await;
}
