//! Models joining and leaving the loop at run time (a config reload), as a table against
//! [`step`]: a retirement `down_only` is decided only for a model with nothing running or
//! about to run, and no load of a retired model may start; an added model takes the next id.

use std::time::Duration;

use tokio::time::Instant;

use super::step::{Change, LaneInfo, LoadFailed, Rules, TurnKind, step};
use super::testing::{Command, Effect, mv, row};
use crate::quarantine::Refused;

fn retire(down_only: bool, waiter: u32) -> Command {
    Command::Retire { model: 0, down_only, waiter }
}

/// Whether the retirement answered `waiter` said the model left.
fn retired(effects: &[Effect], waiter: u32) -> Option<bool> {
    effects.iter().find_map(|e| match e {
        Effect::Retired { waiter: w, retired, .. } if *w == waiter => Some(*retired),
        _ => None,
    })
}

#[test]
fn a_model_leaves_only_when_nothing_of_it_runs_unless_forced() {
    let t0 = Instant::now();
    let up = || vec![mv(0, Change::StartLoad, 0), mv(0, Change::LoadDone { failed: None }, 0)];
    let failed = vec![
        mv(0, Change::StartLoad, 0),
        mv(0, Change::LoadDone { failed: Some(LoadFailed::counted("boom")) }, 0),
    ];
    let admin = Command::Admin { model: 0, waiter: 0, wait: true };
    let create = Command::Create { model: 0, waiter: 0 };
    // Invariant: a down-only retirement leaves the model only if it is unloaded or failed,
    // with no admin operation, no creation granted or queued; a forced one always.
    // (name, commands before, down only, whether it leaves)
    let rows: Vec<(&str, Vec<Command>, bool, bool)> = vec![
        ("unloaded: it leaves", vec![], true, true),
        ("failed: it leaves", failed, true, true),
        ("loaded: it stays", up(), true, false),
        ("loading: it stays", vec![mv(0, Change::StartLoad, 0)], true, false),
        ("an admin operation holds it: it stays", vec![admin], true, false),
        ("a creation holds its runtimes: it stays", vec![create], true, false),
        ("forced, loaded: it leaves", up(), false, true),
    ];
    for (name, before, down_only, leaves) in rows {
        let effects =
            row(1, Rules::of(Duration::from_secs(10), 1), before, retire(down_only, 9), (t0, 0));
        assert_eq!(retired(&effects, 9), Some(leaves), "{name}");
    }
}

#[test]
fn no_load_of_a_retired_model_starts_and_an_added_model_takes_the_next_id() {
    let t0 = Instant::now();
    let may_load = |model, waiter| Command::MayLoad { model, explicit: true, wall_ms: 0, waiter };
    let mut state = super::step::State::new(1, Rules::of(Duration::from_secs(10), 1));
    step(&mut state, retire(true, 1), t0);
    let refused = step(&mut state, may_load(0, 2), t0);
    assert!(
        matches!(refused.as_slice(), [Effect::MayLoad { answer: Err(Refused::Removed), .. }]),
        "{refused:?}"
    );
    // A command about an id not added yet is ignored; once added, the model is known.
    assert!(step(&mut state, may_load(1, 3), t0).is_empty());
    step(&mut state, Command::Add { lanes: LaneInfo::default(), figures: Default::default() }, t0);
    let allowed = step(&mut state, may_load(1, 4), t0);
    assert!(matches!(allowed.as_slice(), [Effect::MayLoad { answer: Ok(()), .. }]), "{allowed:?}");
    let turn = step(&mut state, Command::Admin { model: 1, waiter: 5, wait: true }, t0);
    assert!(matches!(turn.as_slice(), [Effect::Grant { turn: TurnKind::Admin, .. }]));
}
