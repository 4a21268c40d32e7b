//! Never twice for nothing (`step/exhaust.rs`) as a table against [`step`]: after a load
//! failed with everything evictable evicted, a load on demand is refused (and counted) and a
//! retry evicts nothing, until something frees room; an explicit load still tries. Waiters
//! are plain numbers; no runtime, no clock.

use std::time::Duration;

use hangar_config::{Device, ModelName, ModelType};
use hangar_eviction::{Incoming, LoadedModel};
use tokio::time::Instant;

use super::step::{Change, GrantAsk, LaneInfo, LoadFailed, ModelId, Rules};
use super::testing::{Command, Effect, mv, row};
use crate::grant::Ask;
use crate::quarantine::Refused;

/// Model 0 fails; model 1 is another.
const FAILING: ModelId = 0;

fn loaded(model: ModelId) -> [Command; 2] {
    [mv(model, Change::StartLoad, 0), mv(model, Change::LoadDone { failed: None }, 0)]
}

/// A load of model 0 that failed inside its engine, after evicting everything (`exhausted`)
/// or not.
fn failed(exhausted: bool) -> [Command; 2] {
    let failed = LoadFailed { exhausted, ..LoadFailed::counted("out of memory") };
    [mv(FAILING, Change::StartLoad, 0), mv(FAILING, Change::LoadDone { failed: Some(failed) }, 0)]
}

fn unloaded(model: ModelId) -> [Command; 2] {
    let start = Change::StartUnload { evict: false, pinned: false };
    [mv(model, start, 0), mv(model, Change::UnloadDone, 0)]
}

fn may_load(model: ModelId, explicit: bool) -> Command {
    Command::MayLoad { model, explicit, wall_ms: 0, waiter: 9 }
}

/// Model 0's retry after a failure, with model 1 loaded on the GPU.
fn retry() -> Command {
    let other = LoadedModel {
        name: ModelName::new("other").unwrap(),
        model_type: ModelType::Llm,
        device: Device::GPU,
        last_use: std::time::Instant::now(),
        inflight: 0,
        held: false,
        vram_mib: 0,
        asleep: false,
        sleep_frees_mib: 0,
    };
    let incoming = Incoming {
        name: ModelName::new("failing").unwrap(),
        model_type: ModelType::Llm,
        device: Device::GPU,
    };
    let ask =
        GrantAsk { ask: Ask::Retry, loaded: vec![(1, other)], incoming, places: None, host: None };
    Command::Grant { model: FAILING, ask, waiter: 9 }
}

/// The answer to the last command, as a word: `ok`, `exhausted`, `evict N`.
fn answer(effects: &[Effect]) -> String {
    let answers: Vec<String> = effects
        .iter()
        .filter_map(|e| match e {
            Effect::MayLoad { answer: Ok(()), .. } => Some("ok".to_owned()),
            Effect::MayLoad { answer: Err(Refused::Exhausted { last_error }), .. } => {
                Some(format!("exhausted: {last_error}"))
            }
            Effect::MayLoad { answer: Err(other), .. } => Some(format!("{other:?}")),
            Effect::Granted { answer: Ok(grant), .. } => {
                Some(format!("evict {}", grant.plan.victims.len()))
            }
            Effect::Granted { answer: Err(refusal), .. } => Some(format!("{refusal:?}")),
            _ => None,
        })
        .collect();
    answers.join("; ")
}

#[test]
fn never_twice_for_nothing_as_a_table() {
    let t0 = Instant::now();
    let chain = |lists: Vec<Vec<Command>>| lists.into_iter().flatten().collect::<Vec<_>>();
    let exhausted = || failed(true).to_vec();
    let then = |more: Vec<Command>| chain(vec![exhausted(), more]);
    let added = Command::Add { lanes: LaneInfo::default(), figures: Default::default() };
    let crash = mv(1, Change::Crash { generation: 1, message: "boom".into() }, 0);
    let refused = "exhausted: out of memory";
    // (name, commands before, the question, its answer)
    let rows: Vec<(&str, Vec<Command>, Command, &str)> = vec![
        ("a load on demand after it is refused", exhausted(), may_load(FAILING, false), refused),
        ("an explicit load still tries", exhausted(), may_load(FAILING, true), "ok"),
        (
            "a second refusal still gives the engine's error",
            then(vec![may_load(FAILING, false)]),
            may_load(FAILING, false),
            refused,
        ),
        ("its retry evicts nothing", exhausted(), retry(), "evict 0"),
        (
            "a failure with room left to evict marks nothing",
            failed(false).to_vec(),
            retry(),
            "evict 1",
        ),
        ("nor refuses a load on demand", failed(false).to_vec(), may_load(FAILING, false), "ok"),
        ("another model is not refused", exhausted(), may_load(1, false), "ok"),
        (
            "a model loaded since is no room freed",
            then(loaded(1).to_vec()),
            may_load(FAILING, false),
            refused,
        ),
        (
            "an unload that ended since lifts it",
            chain(vec![loaded(1).to_vec(), exhausted(), unloaded(1).to_vec()]),
            may_load(FAILING, false),
            "ok",
        ),
        (
            "and so its retry evicts again",
            chain(vec![loaded(1).to_vec(), exhausted(), unloaded(1).to_vec()]),
            retry(),
            "evict 1",
        ),
        (
            "a crash since lifts it",
            chain(vec![loaded(1).to_vec(), exhausted(), vec![crash]]),
            may_load(FAILING, false),
            "ok",
        ),
        ("a model added to the config lifts it", then(vec![added]), may_load(FAILING, false), "ok"),
        (
            "a load that succeeded since clears it",
            then(loaded(FAILING).to_vec()),
            may_load(FAILING, false),
            "ok",
        ),
    ];
    for (name, before, question, expected) in rows {
        let effects = row(2, Rules::of(Duration::from_secs(10), 4), before, question, (t0, 0));
        assert_eq!(answer(&effects), expected, "{name}");
    }
}

#[test]
fn a_refused_load_on_demand_counts_as_a_failure() {
    let t0 = Instant::now();
    let effects = row(
        2,
        Rules::of(Duration::from_secs(10), 4),
        failed(true).to_vec(),
        may_load(FAILING, false),
        (t0, 0),
    );
    let published: Vec<Vec<String>> = effects
        .iter()
        .filter_map(|e| match e {
            Effect::Failures { model: FAILING, view } => {
                Some(view.recent().into_iter().map(|f| f.message).collect())
            }
            _ => None,
        })
        .collect();
    let [messages] = published.as_slice() else { panic!("one publication: {effects:?}") };
    assert_eq!(messages.len(), 2, "the failed load and the refusal: {messages:?}");
    assert!(messages.iter().any(|m| m.starts_with("not loaded on demand")), "{messages:?}");
}
