//! The load lanes (`step/lanes.rs`) as a table against [`step`], and random creations over
//! random places checking that creations running at once never share a place.

use std::num::NonZeroU32;
use std::time::Duration;

use hangar_config::{MaxLoadedModels, ModelType};
use proptest::prelude::*;
use tokio::time::Instant;

use super::step::{LaneInfo, Lanes, ModelId, Rules, State, TurnKind, step};
use super::testing::{Command, Effect, row};

/// Models 0 and 1 on GPUs 0 and 1, 2 on any GPU, 3 and 4 on the host (4 in-process
/// llama.cpp, as 5, on GPU 1), all llms; `llm` slots.
fn rules(llm: u32) -> Rules {
    let on = |lanes| LaneInfo { lanes, model_type: ModelType::Llm };
    let lanes = vec![
        on(Lanes::gpus(&[0])),
        on(Lanes::gpus(&[1])),
        on(Lanes::gpus(&[])),
        on(Lanes::HOST),
        on(Lanes::HOST.with(Lanes::LLAMA_IN_PROCESS)),
        on(Lanes::gpus(&[1]).with(Lanes::LLAMA_IN_PROCESS)),
    ];
    let nz = |n| NonZeroU32::new(n).unwrap();
    let limits = MaxLoadedModels { llm: nz(llm), embedding: nz(1), reranking: nz(1) };
    Rules { lanes, limits, ..Rules::of(Duration::from_secs(10), 1) }
}

fn create(model: ModelId) -> Command {
    Command::Create { model, waiter: model as u32 }
}

/// The waiters granted a creation.
fn granted(effects: Vec<Effect>) -> Vec<u32> {
    effects
        .into_iter()
        .filter_map(|e| match e {
            Effect::Grant { turn: TurnKind::Create, waiter, .. } => Some(waiter),
            _ => None,
        })
        .collect()
}

#[test]
fn creations_run_at_once_only_on_places_of_their_own() {
    let t0 = Instant::now();
    let done = |model| Command::Done { model, turn: TurnKind::Create };
    // (what, slots, before, command, creations it grants)
    type Row = (&'static str, u32, Vec<Command>, Command, Vec<u32>);
    let rows: Vec<Row> = vec![
        ("different GPUs load side by side", 8, vec![create(0)], create(1), vec![1]),
        ("a model on any GPU waits for every GPU", 8, vec![create(0)], create(2), vec![]),
        ("the host is a place of its own", 8, vec![create(0)], create(3), vec![3]),
        ("host loads wait for each other", 8, vec![create(3)], create(4), vec![]),
        ("in-process llama.cpp loads wait for each other", 8, vec![create(4)], create(5), vec![]),
        ("no room in the slots for both: it waits", 1, vec![create(0)], create(1), vec![]),
        (
            "a waiting creation is not overtaken by one that shares its places",
            8,
            vec![create(0), create(2)],
            create(1),
            vec![],
        ),
        (
            "the end of a creation lets the waiting go",
            8,
            vec![create(0), create(2)],
            done(0),
            vec![2],
        ),
        (
            "and every one that may go then",
            8,
            vec![create(2), create(0), create(3), create(1)],
            done(2),
            vec![0, 1],
        ),
    ];
    for (what, slots, before, command, want) in rows {
        let effects = row(6, rules(slots), before, command, (t0, 0));
        assert_eq!(granted(effects), want, "{what}");
    }
}

proptest! {
    /// Whatever creations come and end, on models of random places: creations running at
    /// once take disjoint places (the first may take any), each holds its model's
    /// runtimes, and when none runs, none that could is left waiting.
    #[test]
    fn running_creations_never_share_a_place(
        places in prop::collection::vec(prop::collection::vec(0..4u32, 0..3), 6),
        ops in prop::collection::vec((any::<bool>(), 0..6usize), 1..60),
    ) {
        let info: Vec<LaneInfo> = places
            .iter()
            .map(|gpus| LaneInfo { lanes: Lanes::gpus(gpus), model_type: ModelType::Llm })
            .collect();
        let nz = |n| NonZeroU32::new(n).unwrap();
        let limits = MaxLoadedModels { llm: nz(8), embedding: nz(1), reranking: nz(1) };
        let rules = Rules { lanes: info.clone(), limits, ..Rules::of(Duration::from_secs(10), 1) };
        let mut state = State::new(6, rules);
        let (mut running, mut waiting) = (Vec::<ModelId>::new(), Vec::<ModelId>::new());
        let now = Instant::now();
        for (start, model) in ops {
            let command = if start {
                if running.contains(&model) || waiting.contains(&model) { continue }
                waiting.push(model);
                create(model)
            } else {
                if !running.contains(&model) { continue }
                running.retain(|&m| m != model);
                Command::Done { model, turn: TurnKind::Create }
            };
            for waiter in granted(step(&mut state, command, now)) {
                let model = waiter as ModelId;
                waiting.retain(|&m| m != model);
                running.push(model);
            }
            prop_assert_eq!(state.lane(), running.as_slice());
            for (i, &a) in running.iter().enumerate() {
                prop_assert_eq!(state.runtimes(a), Some(TurnKind::Create));
                for &b in &running[i + 1..] {
                    prop_assert!(!overlap(&places[a], &places[b]), "{} and {} share a place", a, b);
                }
            }
            prop_assert!(!running.is_empty() || waiting.is_empty(), "a creation left waiting");
        }
    }
}

/// Whether two models' GPU lists share a GPU (an empty list is every GPU).
fn overlap(a: &[u32], b: &[u32]) -> bool {
    a.is_empty() || b.is_empty() || a.iter().any(|g| b.contains(g))
}
