//! Config reload in the manager ([`Manager::apply_models`]): models join, leave gracefully
//! and take changed definitions, at once when nothing of them runs, else at their next load.

use hangar_lifecycle::ModelState;
use hangar_runtime::{
    DefinitionChange, ErrorCode, EventKind, LoadOptions, Manager, ModelChanges, ModelSnapshot,
};
use serde_json::{Value, json};

use crate::support::*;

fn chat(load_delay_ms: u64) -> Value {
    json!({ "backend": "stub", "stub": { "token_latency_ms": 10, "load_delay_ms": load_delay_ms } })
}

/// The models of a config of `models`.
fn models(models: Value) -> Vec<hangar_config::ModelConfig> {
    config(json!({ "models": models })).models
}

fn names(list: &[&str]) -> Vec<hangar_config::ModelName> {
    list.iter().map(|n| hangar_config::ModelName::new(*n).unwrap()).collect()
}

fn listed(m: &Manager) -> Vec<String> {
    m.models().iter().map(|s| s.name().to_owned()).collect()
}

fn load_delay(snapshot: &ModelSnapshot) -> Value {
    snapshot.config.definition()["stub"]["load_delay_ms"].clone()
}

/// The definition events journaled so far, as (model, change).
fn definition_events(m: &Manager) -> Vec<(String, DefinitionChange)> {
    m.follow_events(Some((m.events_epoch(), 0)))
        .backlog
        .into_iter()
        .filter_map(|e| match e.kind {
            EventKind::Definition { change } => Some((e.model, change)),
            _ => None,
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_reload_adds_removes_gracefully_and_changes_definitions_at_the_next_load() {
    let slots = json!({ "llm": 4 });
    let (m, stub) = manager(
        json!({ "max_loaded_models": slots, "models": { "a": chat(100), "b": chat(100) } }),
    );
    m.load("a", LoadOptions::default()).await.unwrap();
    m.load("b", LoadOptions::default()).await.unwrap();
    let running = spawn_generate(&m, "b", 20); // 200 ms of tokens
    settle().await;

    // a changes while loaded, b goes, c comes.
    let changes = m.apply_models(&models(json!({ "a": chat(300), "c": chat(100) }))).await;
    let expected = ModelChanges {
        added: names(&["c"]),
        removed: names(&["b"]),
        changed: vec![],
        pending: names(&["a"]),
    };
    assert_eq!(changes, expected);
    assert_eq!(listed(&m), ["a", "c"]);
    // b answers to no name at once, while its running request finishes in full.
    assert_eq!(m.model("b").unwrap_err().code(), ErrorCode::UnknownModel);
    assert_eq!(
        m.load("b", LoadOptions::default()).await.unwrap_err().code(),
        ErrorCode::UnknownModel
    );
    assert_eq!(running.await.unwrap().unwrap().split(' ').count(), 20);
    while stub.live_runtimes() > 1 {
        settle().await;
    }
    // a keeps serving under its old definition; the row says what waits.
    let a = m.model("a").unwrap();
    assert_eq!((a.runtime_state, load_delay(&a)), (ModelState::Loaded, json!(100)));
    let pending = a.pending_definition.as_ref().expect("a pending definition");
    assert_eq!(pending.definition()["stub"]["load_delay_ms"], 300);
    assert_eq!(generate(&m, "a", 2).await.unwrap().split(' ').count(), 2);

    // An unload leaves it waiting; the next load puts it in effect.
    m.unload("a").await.unwrap();
    assert!(m.model("a").unwrap().pending_definition.is_some());
    let a = m.load("a", LoadOptions::default()).await.unwrap();
    assert_eq!((load_delay(&a), a.pending_definition.is_none()), (json!(300), true));
    assert_eq!(m.model("c").unwrap().runtime_state, ModelState::Unloaded);
    m.load("c", LoadOptions::default()).await.unwrap();
    assert_eq!(loaded(&m), ["a", "c"]);

    let events = definition_events(&m);
    let change = |model: &str, change| (model.to_owned(), change);
    assert_eq!(
        events,
        [
            change("c", DefinitionChange::Added),
            change("b", DefinitionChange::Removed),
            change("a", DefinitionChange::Pending),
            change("a", DefinitionChange::Changed),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_change_applies_at_once_to_an_unloaded_model_and_a_change_back_withdraws_one_waiting() {
    let (m, _stub) = manager(json!({ "models": { "a": chat(100), "b": chat(100) } }));
    m.load("b", LoadOptions::default()).await.unwrap();
    let changed = m.apply_models(&models(json!({ "a": chat(200), "b": chat(200) }))).await;
    assert_eq!((changed.changed, changed.pending), (names(&["a"]), names(&["b"])));
    assert_eq!(load_delay(&m.model("a").unwrap()), json!(200), "in effect at once");
    assert!(m.model("a").unwrap().pending_definition.is_none());

    // b's definition back as it is in effect: nothing waits any more.
    let back = m.apply_models(&models(json!({ "a": chat(200), "b": chat(100) }))).await;
    assert!(back.is_empty(), "{back:?}");
    let b = m.model("b").unwrap();
    assert_eq!((load_delay(&b), b.pending_definition.is_none()), (json!(100), true));
    // The same config again changes nothing.
    assert!(m.apply_models(&models(json!({ "a": chat(200), "b": chat(100) }))).await.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_model_removed_while_loading_is_unloaded_once_its_load_ends_and_never_loads_again() {
    let (m, stub) = manager(json!({ "models": { "a": chat(500) } }));
    let load = spawn_load(&m, "a");
    settle().await;
    assert_eq!(state(&m, "a"), "loading");
    let changes = m.apply_models(&models(json!({}))).await;
    assert_eq!(changes.removed, names(&["a"]));
    assert!(listed(&m).is_empty());
    // The load in progress ends (its caller is answered), then the model is unloaded.
    assert!(load.await.unwrap().is_ok());
    while stub.live_runtimes() > 0 {
        settle().await;
    }
    // Added back, it is a new model: unloaded, and loads.
    m.apply_models(&models(json!({ "a": chat(500) }))).await;
    assert_eq!(state(&m, "a"), "unloaded");
    m.load("a", LoadOptions::default()).await.unwrap();
    assert_eq!(loaded(&m), ["a"]);
}

#[tokio::test(start_paused = true)]
async fn aliases_follow_the_newest_definition_at_once() {
    let mut a = chat(100);
    a["aliases"] = json!(["old/name"]);
    let (m, _stub) = manager(json!({ "models": { "a": a.clone() } }));
    m.load("a", LoadOptions::default()).await.unwrap();
    a["aliases"] = json!(["new/name"]);
    let changes = m.apply_models(&models(json!({ "a": a }))).await;
    assert_eq!(changes.pending, names(&["a"]), "the definition waits for the next load");
    assert_eq!(m.canonical("new/name").as_ref().map(|n| n.as_str()), Some("a"));
    assert_eq!(m.canonical("old/name"), None);
    // A request by the new name is served by the loaded model.
    assert_eq!(generate(&m, "new/name", 2).await.unwrap().split(' ').count(), 2);
}

#[tokio::test]
async fn a_repository_that_cannot_be_read_keeps_its_models_through_rescans_and_reloads() {
    let dir = std::env::temp_dir().join(format!("hangar-runtime-repo-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("folder")).unwrap();
    let settings = json!({
        "model_repository": dir,
        "model_repository_defaults": { "backend": "stub" },
        "models": { "a": chat(1) }
    });
    let (m, _stub) = manager(settings.clone());
    assert_eq!(listed(&m), ["a", "folder"]);
    // The folder goes away for a moment (an unmounted volume): nothing leaves.
    let away = dir.with_extension("away");
    std::fs::rename(&dir, &away).unwrap();
    assert!(m.rescan_repository().await.is_empty());
    assert!(m.apply_config(&config(settings.clone())).await.is_empty());
    assert_eq!(listed(&m), ["a", "folder"]);
    // Back, with the folder gone from it: now it leaves.
    std::fs::rename(&away, &dir).unwrap();
    std::fs::remove_dir_all(dir.join("folder")).unwrap();
    assert_eq!(m.rescan_repository().await.removed, names(&["folder"]));
    // Another repository in a reload: the old one's models do not stay.
    std::fs::create_dir_all(dir.join("again")).unwrap();
    m.rescan_repository().await;
    let mut elsewhere = settings;
    elsewhere["model_repository"] = json!(dir.join("missing"));
    assert_eq!(m.apply_config(&config(elsewhere)).await.removed, names(&["again"]));
    let _ = std::fs::remove_dir_all(&dir);
}
