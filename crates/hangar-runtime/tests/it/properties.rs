//! Random interleavings of load / reload / unload / infer / crash / pause / continue /
//! lease / release under random limits, with pinned models and idle timeouts (idle unloads
//! happen as the virtual clock runs), against the stub backend with a paused clock.
//!
//! Invariants, checked after every step and at the end:
//! 1. loaded models of each type never exceed that type's limit (checked on every state
//!    change, not only between steps);
//! 2. at most one loaded model holds the exclusive device (NPU);
//! 3. no runtime is unloaded while a request runs on it (the backend wrapper records any
//!    unload that happens with active calls) — a reload's old runtimes included;
//! 4. every submitted request ends in a response or a typed error — none is lost and none
//!    hangs (each request task finishes within a bounded virtual time);
//! 5. states only move along the transition table;
//! 6. after an unload completes, no runtime is registered and nothing is in flight; after
//!    the final unload-all, no runtime is alive at all;
//! 7. a pinned model, or one with a lease its holder has not released, is never evicted
//!    nor unloaded for idleness (no `evicted` or `idle_unload` event names it);
//! 8. a paused model admits nothing: requests wait (or, under `abort`, end with
//!    `generation_aborted`) and all of them end once every model continues — invariant 4
//!    with pauses in the mix. (That a paused scheduler grants nothing is the scheduler's
//!    own property test, hangar-lifecycle/tests/scheduler.rs.)
//! 9. quarantine (2 failures within 30 s, 1 s backoff doubling to 4 s), from the journal
//!    alone: a model's second counted failure (failed loads and crashes since the last lift;
//!    `slots_pinned` is not the model's failure) while no quarantine is in effect is followed
//!    at once by its quarantine; while one is in effect the model starts no load unless an
//!    explicit load lifted it first (auto-loads, leases and requests are refused).
//! 10. no runtime runs more than `target_inflight` (1) + its `dispatch_ahead` calls at once
//!     (the backend wrapper records any call beyond that); models get a random
//!     `dispatch_ahead` of 0-2, as an engine with a queue of its own.
//! 11. new weights are swapped in (journal `weights_updated`, the update's success) only
//!     while the model is loaded: never into a model an eviction, idle unload or unload-all
//!     has begun to unload (a model whose weights are being replaced is held).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use async_trait_shim::*;
use hangar_config::{Device, ModelType};
use hangar_lifecycle::{ModelState, TRANSITIONS};
use hangar_runtime::{Backends, EventKind, LeaseChange, LoadOptions, Manager, PauseMode};
use hangar_stub::StubBackend;
use proptest::prelude::*;
use serde_json::json;

use crate::support;

/// A backend that wraps the stub and watches its runtimes: how many calls are active on
/// each, whether any was unloaded with calls still active, and whether any ran more calls
/// at once than its target (1) plus its `dispatch_ahead`.
mod async_trait_shim {
    use super::*;
    use hangar_backend::*;
    use tokio::sync::mpsc;

    pub(crate) struct Watched {
        pub(crate) inner: StubBackend,
        pub(crate) violated: Arc<AtomicBool>,
        pub(crate) crowded: Arc<AtomicBool>,
    }

    struct WatchedRuntime {
        inner: Arc<dyn Runtime>,
        active: AtomicUsize,
        violated: Arc<AtomicBool>,
        /// Calls it may run at once: `target_inflight` (1) + `dispatch_ahead`.
        limit: usize,
        crowded: Arc<AtomicBool>,
    }

    struct Active<'a>(&'a AtomicUsize);
    impl<'a> Active<'a> {
        fn new(r: &'a WatchedRuntime) -> Self {
            if r.active.fetch_add(1, Ordering::SeqCst) + 1 > r.limit {
                r.crowded.store(true, Ordering::SeqCst);
            }
            Self(&r.active)
        }
    }
    impl Drop for Active<'_> {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::SeqCst);
        }
    }

    #[async_trait::async_trait]
    impl Backend for Watched {
        fn kind(&self) -> hangar_config::BackendKind {
            self.inner.kind()
        }
        fn capabilities(&self, model: &hangar_config::ModelConfig) -> Capabilities {
            self.inner.capabilities(model)
        }
        async fn load(&self, request: LoadRequest) -> Result<Arc<dyn Runtime>, LoadError> {
            let inner = self.inner.load(request).await?;
            let limit = 1 + inner.capabilities().dispatch_ahead as usize;
            Ok(Arc::new(WatchedRuntime {
                inner,
                active: AtomicUsize::new(0),
                violated: Arc::clone(&self.violated),
                limit,
                crowded: Arc::clone(&self.crowded),
            }))
        }
    }

    #[async_trait::async_trait]
    impl Runtime for WatchedRuntime {
        fn capabilities(&self) -> &Capabilities {
            self.inner.capabilities()
        }
        async fn generate(
            &self,
            r: GenerateRequest,
            e: mpsc::Sender<GenerateEvent>,
        ) -> Result<GenerateSummary, RuntimeError> {
            let _a = Active::new(self);
            self.inner.generate(r, e).await
        }
        async fn embed(&self, r: EmbedRequest) -> Result<Embeddings, RuntimeError> {
            let _a = Active::new(self);
            self.inner.embed(r).await
        }
        async fn rerank(&self, r: RerankRequest) -> Result<Rerankings, RuntimeError> {
            let _a = Active::new(self);
            self.inner.rerank(r).await
        }
        async fn health(&self) -> Result<(), RuntimeError> {
            self.inner.health().await
        }
        async fn unload(&self) {
            if self.active.load(Ordering::SeqCst) != 0 {
                self.violated.store(true, Ordering::SeqCst);
            }
            self.inner.unload().await
        }
    }
}

#[derive(Debug, Clone)]
enum Op {
    Load(usize),
    Reload(usize),
    Unload(usize),
    Infer(usize, u32),
    UnloadAll,
    Wait(u64),
    Pause(usize, PauseMode),
    Continue(usize),
    Lease(usize),
    Release(usize),
    /// A weight update (abort running requests or not).
    Update(usize, bool),
}

fn op(models: usize) -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..models).prop_map(Op::Load),
        1 => (0..models).prop_map(Op::Reload),
        2 => (0..models).prop_map(Op::Unload),
        5 => (0..models, 1u32..12).prop_map(|(m, t)| Op::Infer(m, t)),
        1 => Just(Op::UnloadAll),
        2 => (1u64..2500).prop_map(Op::Wait),
        1 => (0..models, prop_oneof![Just(PauseMode::Abort), Just(PauseMode::Retract), Just(PauseMode::InPlace)])
            .prop_map(|(m, mode)| Op::Pause(m, mode)),
        2 => (0..models).prop_map(Op::Continue),
        1 => (0..models).prop_map(Op::Lease),
        1 => (0..models).prop_map(Op::Release),
        1 => (0..models, any::<bool>()).prop_map(|(m, abort)| Op::Update(m, abort)),
    ]
}

#[derive(Debug, Clone)]
struct ModelSpec {
    ty: ModelType,
    npu: bool,
    crash_after: Option<u64>,
    fail: bool,
    replicas: u32,
    pinned: bool,
    idle_unload_seconds: Option<u32>,
    dispatch_ahead: u32,
}

fn model_spec() -> impl Strategy<Value = ModelSpec> {
    (
        prop_oneof![Just(ModelType::Llm), Just(ModelType::Embedding), Just(ModelType::Reranking)],
        prop::bool::weighted(0.25),
        prop::option::weighted(0.3, 1u64..6),
        prop::bool::weighted(0.2),
        1u32..3,
        prop::bool::weighted(0.15),
        prop::option::weighted(0.25, 1u32..3),
        0u32..3,
    )
        .prop_map(
            |(
                ty,
                npu,
                crash_after,
                fail,
                replicas,
                pinned,
                idle_unload_seconds,
                dispatch_ahead,
            )| {
                ModelSpec {
                    ty,
                    npu,
                    crash_after,
                    fail,
                    replicas,
                    pinned,
                    idle_unload_seconds,
                    dispatch_ahead,
                }
            },
        )
}

fn config(specs: &[ModelSpec], limits: [u32; 3], auto_load: bool) -> serde_json::Value {
    let models: serde_json::Map<_, _> = specs
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let mut stub =
                json!({ "load_delay_ms": 30, "unload_delay_ms": 10, "token_latency_ms": 5 });
            if let Some(n) = s.crash_after {
                stub["crash_after_requests"] = json!(n);
            }
            if s.fail {
                stub["fail_load"] = json!("injected load failure");
            }
            if s.dispatch_ahead > 0 {
                stub["dispatch_ahead"] = json!(s.dispatch_ahead);
            }
            let model = json!({
                "backend": "stub",
                "type": s.ty,
                "device": if s.npu { json!(["gpu", "npu"]) } else { json!("gpu") },
                "replicas": s.replicas,
                "target_inflight": 1,
                "pinned": s.pinned,
                "idle_unload_seconds": s.idle_unload_seconds,
                "stub": stub,
            });
            (format!("m{i}"), model)
        })
        .collect();
    json!({
        "auto_load": auto_load,
        "max_queue_depth": 4,
        "quarantine": { "failures": 2, "window_seconds": 30, "backoff_seconds": 1, "max_backoff_seconds": 4 },
        "max_loaded_models": { "llm": limits[0], "embedding": limits[1], "reranking": limits[2] },
        "models": models,
    })
}

/// What invariant 9 expects of one model, from its journal events.
#[derive(Default)]
struct Quarantine {
    /// Counted failures within the window.
    failures: Vec<tokio::time::Instant>,
    /// When the quarantine in effect ends.
    until: Option<tokio::time::Instant>,
    /// The last event was a failure that must quarantine the model.
    expect: bool,
}

impl Quarantine {
    fn check(&mut self, event: &hangar_runtime::ManagerEvent) {
        let now = tokio::time::Instant::now();
        let active = self.until.is_some_and(|u| now < u);
        if std::mem::take(&mut self.expect) {
            assert!(
                matches!(event.kind, EventKind::Quarantined { .. }),
                "{} not quarantined: {event:?}",
                event.model
            );
        }
        match &event.kind {
            EventKind::State { to: ModelState::Failed, error, .. }
                if !error.as_deref().unwrap_or_default().starts_with("slots_pinned") =>
            {
                self.failures.push(now);
                self.failures.retain(|t| now.duration_since(*t) <= Duration::from_secs(30));
                self.expect = self.failures.len() >= 2 && !active;
            }
            EventKind::Quarantined { quarantine } => {
                assert!(!active, "quarantined twice at once");
                assert!((1..=4).contains(&quarantine.retry_after_s), "{quarantine:?}");
                self.until = Some(now + Duration::from_secs(quarantine.retry_after_s));
            }
            EventKind::QuarantineLifted => {
                assert!(active, "lifted a quarantine not in effect");
                self.until = None;
                self.failures.clear();
            }
            EventKind::State { to: ModelState::Loading, .. } => {
                assert!(!active, "{} started loading while quarantined", event.model);
            }
            _ => {}
        }
    }
}

fn check_limits(m: &Manager, limits: [u32; 3]) {
    let snaps = m.models();
    for (i, ty) in ModelType::ALL.iter().enumerate() {
        let n = snaps.iter().filter(|s| s.is_loaded && s.model_type == *ty).count() as u32;
        assert!(n <= limits[i], "{n} {ty} models loaded, limit {}", limits[i]);
    }
    let npu =
        snaps.iter().filter(|s| s.is_loaded && s.device.intersects(Device::EXCLUSIVE)).count();
    assert!(npu <= 1, "{npu} models hold the NPU");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn control_plane_invariants_hold_under_random_interleavings(
        specs in prop::collection::vec(model_spec(), 2..6),
        limits in [1u32..3, 1u32..3, 1u32..3],
        auto_load in any::<bool>(),
        ops in prop::collection::vec(op(6), 1..40),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap();
        rt.block_on(async move {
            let violated = Arc::new(AtomicBool::new(false));
            let crowded = Arc::new(AtomicBool::new(false));
            let watched = Arc::new(Watched {
                inner: StubBackend::new(),
                violated: Arc::clone(&violated),
                crowded: Arc::clone(&crowded),
            });
            let cfg = support::config(config(&specs, limits, auto_load));
            let m = Manager::new(&cfg, Backends::new().with(watched.clone()));
            let names: Vec<String> = (0..specs.len()).map(|i| format!("m{i}")).collect();

            // Invariants 1, 2 and 5 on every single state change, as it happens.
            let mut changes = m.subscribe();
            let watcher = {
                let m = m.clone();
                tokio::spawn(async move {
                    while let Ok(change) = changes.recv().await {
                        assert!(
                            TRANSITIONS.iter().any(|(f, e, t)| *f == change.from && *e == change.event && *t == change.to),
                            "illegal move {change:?}"
                        );
                        if change.to == ModelState::Loaded {
                            check_limits(&m, limits);
                        }
                    }
                })
            };

            // Invariant 7: models held by a lease the test has not released (or pinned).
            let leased: Arc<std::sync::Mutex<Vec<(String, String)>>> = Arc::default();
            // Lease ids the journal says were revoked or expired (possibly before their
            // acquire returned: an unload during the lease's own load).
            let ended: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
            let mut journal = m.follow_events(None).live;
            let evictions = {
                let (m, leased, ended) = (m.clone(), Arc::clone(&leased), Arc::clone(&ended));
                tokio::spawn(async move {
                    // Invariant 9's model of each model's quarantine. The paused clock only
                    // moves once every task waits, so this reader sees each event at the
                    // virtual instant it happened.
                    let mut quarantine: HashMap<String, Quarantine> = HashMap::new();
                    // Invariant 11's view: each model's state as its last transition left it.
                    let mut states: HashMap<String, ModelState> = HashMap::new();
                    let mut blind = false;
                    loop {
                        let event = match journal.recv().await {
                            Ok(event) => event,
                            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                                blind = true; // events missed: the quarantine model is lost
                                continue;
                            }
                            Err(_) => break,
                        };
                        // A lease an unload revoked (or one that ran out) no longer holds the
                        // model; the journal has that event before any later eviction.
                        if let EventKind::Lease { change: LeaseChange::Revoked | LeaseChange::Expired, id, .. } = &event.kind {
                            leased.lock().unwrap().retain(|(_, held)| held != id);
                            ended.lock().unwrap().push(id.clone());
                        }
                        if let EventKind::State { to, .. } = &event.kind {
                            states.insert(event.model.clone(), *to);
                        }
                        if let EventKind::WeightsUpdated { .. } = &event.kind && !blind {
                            let state = states.get(&event.model).copied();
                            assert_eq!(state, Some(ModelState::Loaded), "{}: new weights swapped in while {state:?}", event.model);
                        }
                        if let EventKind::Evicted { .. } | EventKind::IdleUnload { .. } = event.kind {
                            let pinned = m.model(&event.model).unwrap().pinned;
                            let held = leased.lock().unwrap().iter().any(|(n, _)| *n == event.model);
                            assert!(!pinned && !held, "held model {} evicted", event.model);
                        }
                        if !blind {
                            quarantine.entry(event.model.clone()).or_default().check(&event);
                        }
                    }
                })
            };

            let mut tasks = Vec::new();
            for op in ops {
                match op {
                    Op::Load(i) => {
                        let (m, n) = (m.clone(), names[i % names.len()].clone());
                        tasks.push(tokio::spawn(async move { m.load(&n, LoadOptions::default()).await.map(drop).map_err(|e| e.code()) }));
                    }
                    Op::Reload(i) => {
                        let (m, n) = (m.clone(), names[i % names.len()].clone());
                        tasks.push(tokio::spawn(async move { m.reload(&n, LoadOptions::default()).await.map(drop).map_err(|e| e.code()) }));
                    }
                    Op::Unload(i) => {
                        let (m, n) = (m.clone(), names[i % names.len()].clone());
                        // An explicit unload revokes the model's leases.
                        leased.lock().unwrap().retain(|(h, _)| *h != n);
                        tasks.push(tokio::spawn(async move {
                            let r = m.unload(&n).await;
                            if let Ok(s) = &r && s.runtime_state == ModelState::Unloaded {
                                // Invariant 6, right after the unload: nothing registered, nothing in flight.
                                assert_eq!((s.loaded_replicas, s.runtime_inflight, s.queue_depth), (0, 0, 0));
                            }
                            r.map(drop).map_err(|e| e.code())
                        }));
                    }
                    Op::Infer(i, tokens) => {
                        let (m, n) = (m.clone(), names[i % names.len()].clone());
                        tasks.push(tokio::spawn(async move { support::generate(&m, &n, tokens).await.map(drop).map_err(|e| e.code()) }));
                    }
                    Op::Pause(i, mode) => {
                        let r = m.pause(&names[i % names.len()], mode).await;
                        assert!(r.is_ok() || r.as_ref().is_err_and(|e| matches!(e.code(), hangar_runtime::ErrorCode::StateConflict)), "{r:?}");
                    }
                    Op::Continue(i) => {
                        m.resume(&names[i % names.len()]).await.unwrap();
                    }
                    Op::Lease(i) => {
                        let (m, n, leased, ended) = (m.clone(), names[i % names.len()].clone(), Arc::clone(&leased), Arc::clone(&ended));
                        tasks.push(tokio::spawn(async move {
                            let lease = m.acquire_lease(&n, "job", 100_000).await.map_err(|e| e.code())?;
                            if !ended.lock().unwrap().contains(&lease.id) {
                                leased.lock().unwrap().push((n, lease.id));
                            }
                            Ok(())
                        }));
                    }
                    Op::Release(i) => {
                        let n = &names[i % names.len()];
                        let ids: Vec<String> = {
                            let mut held = leased.lock().unwrap();
                            let ids = held.iter().filter(|(h, _)| h == n).map(|(_, id)| id.clone()).collect();
                            held.retain(|(h, _)| h != n);
                            ids
                        };
                        for id in ids {
                            // Gone already when an explicit unload revoked it.
                            let _ = m.release_lease(n, &id).await;
                        }
                    }
                    Op::UnloadAll => {
                        // Unload-all revokes leases too: the journal reader drops them.
                        let m = m.clone();
                        tasks.push(tokio::spawn(async move { m.unload_all().await; Ok(()) }));
                    }
                    Op::Update(i, abort_all_requests) => {
                        let (m, n) = (m.clone(), names[i % names.len()].clone());
                        let update = hangar_runtime::WeightUpdate { abort_all_requests, ..Default::default() };
                        tasks.push(tokio::spawn(async move {
                            let r = m.update_weights_from_disk(&n, update).await;
                            r.map(drop).map_err(|e| e.code())
                        }));
                    }
                    Op::Wait(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
                check_limits(&m, limits);
                assert!(!violated.load(Ordering::SeqCst), "a runtime was unloaded under a running request");
                assert!(!crowded.load(Ordering::SeqCst), "a runtime ran more than target + dispatch_ahead calls");
            }

            // Invariants 4 and 8: once every model continues, every operation ends, with a
            // result or a typed error.
            for n in &names {
                m.resume(n).await.unwrap();
            }
            for task in tasks {
                let ended = tokio::time::timeout(Duration::from_secs(600), task).await;
                let result = ended.expect("an operation hung").expect("an operation panicked");
                let _typed: Result<(), hangar_runtime::ErrorCode> = result;
            }
            m.unload_all().await;
            tokio::time::sleep(Duration::from_secs(1)).await; // crash teardowns
            for s in m.models() {
                assert!(matches!(s.runtime_state, ModelState::Unloaded | ModelState::Failed), "{} is {}", s.name(), s.runtime_state);
                assert_eq!((s.loaded_replicas, s.inflight_requests), (0, 0));
            }
            assert_eq!(watched.inner.live_runtimes(), 0, "a runtime outlived unload-all");
            assert!(!violated.load(Ordering::SeqCst), "a runtime was unloaded under a running request");
            assert!(!crowded.load(Ordering::SeqCst), "a runtime ran more than target + dispatch_ahead calls");
            evictions.abort();
            if let Err(e) = evictions.await && e.is_panic() {
                std::panic::resume_unwind(e.into_panic());
            }
            watcher.abort();
            if let Err(e) = watcher.await && e.is_panic() {
                std::panic::resume_unwind(e.into_panic());
            }
        });
    }
}
