//! The idle rule as a table against [`step`]: what housekeeping saw, with what the loop
//! holds (state, pause, leases, replacements). Waiters are plain numbers; no runtime, no
//! clock.

use std::num::NonZeroU32;
use std::time::Duration;

use tokio::time::Instant;

use super::step::{Change, IdleSeen, LeaseCommand, Rules, row};
use crate::pause::{PauseCause, PauseMode};

/// The loop's commands and effects with numbers for waiters and no slot work.
type Command = super::step::Command<u32>;
/// See [`Command`].
type Effect = super::step::Effect<u32>;

fn mv(change: Change) -> Command {
    Command::Move { model: 0, change, wall_ms: 0, apply: (), waiter: 0 }
}

/// Model 0 loaded, then `more`.
fn loaded(more: Vec<Command>) -> Vec<Command> {
    let up = [mv(Change::StartLoad), mv(Change::LoadDone { failed: None })];
    up.into_iter().chain(more).collect()
}

#[test]
fn the_idle_rule_as_a_table() {
    let t0 = Instant::now();
    let s = Duration::from_secs;
    let seen = IdleSeen {
        timeout: NonZeroU32::new(60).unwrap(),
        pinned: false,
        busy: false,
        pins: 0,
        idle: s(60),
    };
    let lease = || {
        let command =
            LeaseCommand::Acquire { owner: "job".into(), ttl_seconds: 600, wall_ms: 0, waiter: 0 };
        Command::Lease { model: 0, command }
    };
    let pause = || mv(Change::Pause { mode: PauseMode::InPlace, cause: PauseCause::Operator });
    // (name, commands before, what housekeeping saw, the answer)
    let rows: Vec<(&str, Vec<Command>, IdleSeen, Option<Duration>)> = vec![
        ("idle for its timeout", loaded(vec![]), seen.clone(), Some(s(60))),
        ("not yet", loaded(vec![]), IdleSeen { idle: s(59), ..seen.clone() }, None),
        ("long idle", loaded(vec![]), IdleSeen { idle: s(3600), ..seen.clone() }, Some(s(3600))),
        (
            "pinned by its definition",
            loaded(vec![]),
            IdleSeen { pinned: true, ..seen.clone() },
            None,
        ),
        ("not loaded", vec![], seen.clone(), None),
        ("loading", vec![mv(Change::StartLoad)], seen.clone(), None),
        (
            "requests running or queued",
            loaded(vec![]),
            IdleSeen { busy: true, ..seen.clone() },
            None,
        ),
        ("a request waits for it", loaded(vec![]), IdleSeen { pins: 1, ..seen.clone() }, None),
        ("paused", loaded(vec![pause()]), seen.clone(), None),
        (
            "paused, then resumed",
            loaded(vec![pause(), mv(Change::Resume)]),
            seen.clone(),
            Some(s(60)),
        ),
        ("leased", loaded(vec![lease()]), seen.clone(), None),
        (
            "its runtimes being replaced",
            loaded(vec![Command::Replacing { model: 0 }]),
            seen.clone(),
            None,
        ),
        (
            "an unload under way",
            loaded(vec![mv(Change::StartUnload { evict: false, pinned: false })]),
            seen.clone(),
            None,
        ),
    ];
    for (name, before, seen, expected) in rows {
        let ask = Command::Idle { model: 0, seen, waiter: 1 };
        let effects = row(1, Rules::of(s(10), 4), before, ask, (t0, 0));
        let [Effect::Idle { waiter: 1, answer, .. }] = effects.as_slice() else {
            panic!("{name}: {effects:?}")
        };
        assert_eq!(*answer, expected, "{name}");
    }
}
