//! Start-up and readiness: the enabled models load in config order, as many of each type as
//! it has slots, none evicting another; every enabled model that is not serving is named
//! with its reason.

use hangar_runtime::{LoadOptions, Manager, NotServingReason as R, StartUp};
use serde_json::json;

use crate::support::*;

fn chat(enabled: bool) -> serde_json::Value {
    json!({ "backend": "stub", "enabled": enabled, "stub": { "load_delay_ms": 100 } })
}

/// `(model, reason, holds readiness)` for each enabled model not serving.
fn not_serving(m: &Manager) -> Vec<(String, R, bool)> {
    m.not_serving()
        .into_iter()
        .map(|n| (n.model.to_string(), n.info.reason, n.info.holds_readiness))
        .collect()
}

fn outcomes(done: &[(hangar_config::ModelName, StartUp)]) -> Vec<(String, &'static str)> {
    let what = |s: &StartUp| match s {
        StartUp::Loaded(_) => "loaded",
        StartUp::NoSlot => "no_slot",
        StartUp::NoRoom(_) => "no_room",
        StartUp::Failed(_) => "failed",
    };
    done.iter().map(|(n, s)| (n.to_string(), what(s))).collect()
}

fn s(pairs: &[(&str, &'static str)]) -> Vec<(String, &'static str)> {
    pairs.iter().map(|(n, w)| ((*n).to_owned(), *w)).collect()
}

#[tokio::test(start_paused = true)]
async fn more_enabled_models_than_slots_load_in_config_order_and_the_rest_wait_without_holding_readiness()
 {
    let (m, _) = manager(json!({
        "max_loaded_models": { "llm": 2 },
        "models": { "c": chat(true), "off": chat(false), "a": chat(true), "b": chat(true) }
    }));
    // Before start-up runs, the models it will take say so; the one it leaves out too.
    assert_eq!(
        not_serving(&m),
        [
            ("c".into(), R::StartUpPending, true),
            ("a".into(), R::StartUpPending, true),
            ("b".into(), R::NoSlot, false),
        ]
    );
    assert_eq!(m.not_ready().len(), 2);
    let done = m.load_enabled().await;
    assert_eq!(outcomes(&done), s(&[("c", "loaded"), ("a", "loaded"), ("b", "no_slot")]));
    assert_eq!(loaded(&m), ["c", "a"], "the first two in config order; b never evicted one");
    assert_eq!(not_serving(&m), [("b".into(), R::NoSlot, false)]);
    assert!(m.not_ready().is_empty(), "a model left out by rule does not hold readiness");

    // Loaded by an operator, b evicts c (the least recently used): an enabled model of
    // start-up's set that is not serving holds readiness back, and says why.
    m.load("b", LoadOptions::default()).await.unwrap();
    assert_eq!(not_serving(&m), [("c".into(), R::Unloaded, true)]);
    // Unloaded again, b stays out of start-up's set.
    m.unload("b").await.unwrap();
    assert_eq!(
        not_serving(&m),
        [("c".into(), R::Unloaded, true), ("b".into(), R::Unloaded, false)]
    );
    assert_eq!(m.not_ready(), [hangar_config::ModelName::new("c").unwrap()]);
}

#[tokio::test(start_paused = true)]
async fn start_up_evicts_a_model_that_is_not_enabled_but_never_an_enabled_one() {
    let (m, _) = manager(json!({
        "max_loaded_models": { "llm": 2 },
        "models": { "a": chat(true), "b": chat(true), "c": chat(false) }
    }));
    // a, then c, are loaded before start-up runs: a is the least recently used.
    m.load("a", LoadOptions::default()).await.unwrap();
    m.load("c", LoadOptions::default()).await.unwrap();
    let done = m.load_enabled().await;
    assert_eq!(outcomes(&done), s(&[("a", "loaded"), ("b", "loaded")]));
    assert_eq!(loaded(&m), ["a", "b"], "b took c's slot, not a's");
}

#[tokio::test(start_paused = true)]
async fn an_enabled_model_that_only_evicting_a_held_one_would_fit_is_left_with_the_reason() {
    let (m, _) = manager(json!({
        "models": {
            "p": { "backend": "stub", "pinned": true },
            "a": chat(true),
            "broken": { "backend": "stub", "enabled": true, "labels": ["embedding"],
                        "stub": { "fail_load": "simulated: CUDA out of memory" } }
        }
    }));
    m.load("p", LoadOptions::default()).await.unwrap();
    let done = m.load_enabled().await;
    assert_eq!(outcomes(&done), s(&[("a", "no_room"), ("broken", "failed")]));
    assert_eq!(loaded(&m), ["p"]);
    let rows = m.not_serving();
    assert_eq!(
        not_serving(&m),
        [("a".into(), R::NoRoom, false), ("broken".into(), R::LoadFailed, true)]
    );
    let no_room = rows[0].message.as_deref().unwrap_or_default();
    assert!(no_room.contains('p'), "the refusal names the held model: {no_room}");
    let failed = rows[1].message.as_deref().unwrap_or_default();
    assert!(failed.contains("CUDA out of memory"), "{failed}");
    assert_eq!(m.not_ready(), [hangar_config::ModelName::new("broken").unwrap()]);
}

#[tokio::test(start_paused = true)]
async fn the_slot_of_an_enabled_model_that_fails_goes_to_the_next_in_order() {
    let (m, _) = manager(json!({ "models": {
        "broken": { "backend": "stub", "enabled": true, "stub": { "fail_load": "simulated" } },
        "a": chat(true),
        "b": chat(true)
    } }));
    // The plan, before anything ran, gives the one slot to the first.
    assert_eq!(
        not_serving(&m),
        [
            ("broken".into(), R::StartUpPending, true),
            ("a".into(), R::NoSlot, false),
            ("b".into(), R::NoSlot, false),
        ]
    );
    let done = m.load_enabled().await;
    assert_eq!(outcomes(&done), s(&[("broken", "failed"), ("a", "loaded"), ("b", "no_slot")]));
    assert_eq!(loaded(&m), ["a"]);
    assert_eq!(
        not_serving(&m),
        [("broken".into(), R::LoadFailed, true), ("b".into(), R::NoSlot, false)]
    );
}
