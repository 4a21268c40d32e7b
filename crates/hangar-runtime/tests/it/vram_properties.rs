//! Random interleavings of loads, unloads, leases, requests and lagging GPU releases under
//! a random VRAM budget, on the stub engine's pretend GPU with a paused clock.
//!
//! Every model's footprint is measured once first, so admission knows every figure
//! exactly. Invariants:
//! 1. the memory of loaded (and loading, and unloading) replicas, plus what other
//!    processes use, never exceeds the budget — checked on every state change, a weight
//!    update's second copy included;
//! 2. a load refused with `insufficient_vram` says the truth: the model's own footprint is
//!    what it needs, every holder is listed with its own footprint, held ones are models
//!    that were leased or whose weights were being replaced, and the missing amount is the need minus the free budget minus
//!    what the unheld holders would free (> 0);
//! 3. a leased model is never evicted;
//! 4. every operation ends (no load waits for a release forever): each finishes within a
//!    bounded virtual time.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hangar_runtime::{
    Backends, EventKind, LeaseChange, LoadOptions, Manager, ManagerError, WeightUpdate,
};
use hangar_stub::{StubBackend, StubGpu};
use proptest::prelude::*;
use serde_json::json;

use crate::support;
use crate::support::PretendGpu;

const BASE_MIB: u64 = 1000;

#[derive(Debug, Clone)]
enum Op {
    Load(usize),
    Unload(usize),
    Lease(usize),
    Release(usize),
    Request(usize),
    Update(usize),
    Lag(bool),
    ReleaseNow,
    Wait(u64),
}

fn op(models: usize) -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..models).prop_map(Op::Load),
        2 => (0..models).prop_map(Op::Unload),
        1 => (0..models).prop_map(Op::Lease),
        1 => (0..models).prop_map(Op::Release),
        2 => (0..models).prop_map(Op::Request),
        1 => (0..models).prop_map(Op::Update),
        1 => any::<bool>().prop_map(Op::Lag),
        1 => Just(Op::ReleaseNow),
        1 => (0u64..3000).prop_map(Op::Wait),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn loaded_memory_stays_within_the_budget_and_refusals_are_right(
        footprints in prop::collection::vec(300u64..2000, 2..5),
        budget in 3000u64..8000,
        ops in prop::collection::vec(op(4), 1..30),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(async move {
            let names: Vec<String> = (0..footprints.len()).map(|i| format!("m{i}")).collect();
            let models: serde_json::Map<String, serde_json::Value> = names
                .iter()
                .map(|n| (n.clone(), json!({ "backend": "stub", "device": "gpu", "auto_load": true })))
                .collect();
            let config = support::config(json!({
                "max_loaded_models": { "llm": 4 },
                "vram_budget": budget,
                "models": models,
            }));
            let gpu = StubGpu::new(BASE_MIB);
            for (n, mib) in names.iter().zip(&footprints) {
                gpu.set_footprint(n, *mib);
            }
            let backend = StubBackend::new().with_gpu(Arc::clone(&gpu));
            let m = Manager::new(&config, Backends::new().with(Arc::new(backend)));
            m.set_gpu_probe(Arc::new(PretendGpu(Arc::clone(&gpu))));
            // Measure every footprint once, alone (each fits alone: 1,000 + < 2,000 < 3,000).
            for n in &names {
                m.load(n, LoadOptions::default()).await.unwrap();
                m.unload(n).await.unwrap();
            }

            // Invariant 1, on every state change as it happens.
            let mut changes = m.subscribe();
            let over: Arc<Mutex<Option<String>>> = Arc::default();
            let watcher = {
                let (gpu, over) = (Arc::clone(&gpu), Arc::clone(&over));
                tokio::spawn(async move {
                    while let Ok(change) = changes.recv().await {
                        let held = gpu.loaded_mib() + BASE_MIB;
                        if held > budget {
                            over.lock().unwrap().get_or_insert(format!(
                                "{held} MiB loaded over a {budget} MiB budget at {change:?}"
                            ));
                        }
                    }
                })
            };

            let leases: Arc<Mutex<Vec<(usize, String)>>> = Arc::default();
            let ever_leased: Arc<Mutex<HashSet<String>>> = Arc::default();
            // A model whose weights are replaced is held while its second copy loads.
            let ever_updated: Arc<Mutex<HashSet<String>>> = Arc::default();
            let mut tasks = Vec::new();
            for op in ops {
                let (m, gpu, leases, names) =
                    (m.clone(), Arc::clone(&gpu), Arc::clone(&leases), names.clone());
                let footprints = footprints.clone();
                let target = match &op {
                    Op::Load(i) | Op::Unload(i) | Op::Lease(i) | Op::Request(i) | Op::Update(i) => {
                        names[i % names.len()].clone()
                    }
                    _ => String::new(),
                };
                let ever_leased = Arc::clone(&ever_leased);
                let ever_updated = Arc::clone(&ever_updated);
                if matches!(op, Op::Update(_)) {
                    ever_updated.lock().unwrap().insert(target.clone());
                }
                match op {
                    Op::Lag(on) => gpu.lag_releases(on),
                    Op::ReleaseNow => gpu.release_now(),
                    Op::Wait(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
                    Op::Release(i) => {
                        let taken = leases.lock().unwrap().iter().position(|(j, _)| *j == i % names.len());
                        if let Some(at) = taken {
                            let (j, id) = leases.lock().unwrap().remove(at);
                            let _ = m.release_lease(&names[j], &id).await;
                        }
                    }
                    op => tasks.push(tokio::spawn(async move {
                        let result = match op {
                            Op::Load(_) => m.load(&target, LoadOptions::default()).await.map(drop),
                            Op::Unload(_) => m.unload(&target).await.map(drop),
                            Op::Lease(i) => {
                                // A lease holds its model from the moment it is asked for
                                // (while the model loads), granted in the end or not.
                                ever_leased.lock().unwrap().insert(target.clone());
                                m.acquire_lease(&target, "job", 3600).await.map(|l| {
                                    leases.lock().unwrap().push((i % names.len(), l.id));
                                })
                            }
                            Op::Request(_) => {
                                let (tx, mut rx) = tokio::sync::mpsc::channel(64);
                                let run = m.generate(&target, support::request("hi", 3), tx);
                                let drain = async { while rx.recv().await.is_some() {} };
                                tokio::join!(run, drain).0.map(drop)
                            }
                            Op::Update(_) => {
                                let update = WeightUpdate { abort_all_requests: true, ..WeightUpdate::default() };
                                m.update_weights_from_disk(&target, update).await.map(drop)
                            }
                            _ => unreachable!(),
                        };
                        let unknown = matches!(result, Err(ManagerError::MemoryNotKnown { .. }));
                        assert!(!unknown, "every figure is known here: {result:?}");
                        // Invariant 2: a refusal says the truth.
                        if let Err(ManagerError::InsufficientVram { model, shortfall }) = &result {
                            let footprint = |name: &str| {
                                footprints[names.iter().position(|x| x == name).unwrap()]
                            };
                            assert_eq!(shortfall.needed_mib, footprint(model), "{shortfall:?}");
                            let mut unheld = 0;
                            for (holder, mib, held) in &shortfall.holders {
                                assert_eq!(*mib, footprint(holder.as_str()), "{shortfall:?}");
                                if *held {
                                    let held_by = |set: &Mutex<HashSet<String>>| set.lock().unwrap().contains(holder.as_str());
                                    assert!(held_by(&ever_leased) || held_by(&ever_updated), "{holder} held");
                                } else {
                                    unheld += mib;
                                }
                            }
                            let missing = i128::from(shortfall.needed_mib)
                                - i128::from(shortfall.free_mib)
                                - i128::from(unheld);
                            assert!(missing > 0 && missing == i128::from(shortfall.missing_mib), "{shortfall:?}");
                        }
                    })),
                }
            }
            // Invariant 4: everything ends, lagging releases or not.
            for task in tasks {
                tokio::time::timeout(Duration::from_secs(600), task)
                    .await
                    .expect("an operation hung")
                    .expect("an operation panicked");
            }

            // Invariant 3, from the journal in order: no model is evicted while leased.
            let mut leased: HashSet<(String, String)> = HashSet::new();
            let follow = m.follow_events(Some((m.events_epoch(), 0)));
            assert!(!follow.gap, "the journal kept every event");
            for event in follow.backlog {
                match &event.kind {
                    EventKind::Lease { change: LeaseChange::Acquired, id, .. } => {
                        leased.insert((event.model.clone(), id.clone()));
                    }
                    EventKind::Lease { change: LeaseChange::Renewed, .. } => {}
                    EventKind::Lease { id, .. } => {
                        leased.remove(&(event.model.clone(), id.clone()));
                    }
                    EventKind::Evicted { .. } => {
                        assert!(
                            !leased.iter().any(|(model, _)| *model == event.model),
                            "{} evicted while leased", event.model
                        );
                    }
                    _ => {}
                }
            }
            m.unload_all().await;
            watcher.abort();
            if let Some(over) = over.lock().unwrap().take() {
                panic!("invariant 1: {over}");
            }
        });
    }
}
