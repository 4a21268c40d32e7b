//! The idle rule as a table against [`step`]: what housekeeping saw, with what the loop
//! holds (state, pause, leases, replacements). Waiters are plain numbers; no runtime, no
//! clock.

use std::num::NonZeroU32;
use std::time::Duration;

use tokio::time::Instant;

use super::step::{Change, IdleSeen, Rules};
use super::testing::{Command, Effect, acquire, mv, row};
use crate::pause::{PauseCause, PauseMode};

/// Model 0 loaded, then `more`.
fn loaded(more: Vec<Command>) -> Vec<Command> {
    let up = [mv(0, Change::StartLoad, 0), mv(0, Change::LoadDone { failed: None }, 0)];
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
    let lease = || acquire(0, 0, 600);
    let pause =
        || mv(0, Change::Pause { mode: PauseMode::InPlace, cause: PauseCause::Operator }, 0);
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
        ("loading", vec![mv(0, Change::StartLoad, 0)], seen.clone(), None),
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
            loaded(vec![pause(), mv(0, Change::Resume, 0)]),
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
            loaded(vec![mv(0, Change::StartUnload { evict: false, pinned: false }, 0)]),
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
