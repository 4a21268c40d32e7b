//! The idle rule as a table against [`step`]: what housekeeping saw, with what the loop
//! holds (state, pause, leases, replacements, sleep): an unload after `idle_unload_seconds`,
//! a sleep after `idle_sleep_seconds` before it. Waiters are plain numbers; no runtime, no
//! clock.

use std::num::NonZeroU32;
use std::time::Duration;

use tokio::time::Instant;

use hangar_backend::SleepLevel;

use super::step::{Change, IdleAction, IdleDue, IdleSeen, Rules};
use super::testing::{Command, Effect, acquire, mv, row};
use crate::pause::{PauseCause, PauseMode};

/// Model 0 loaded, then `more`.
fn loaded(more: Vec<Command>) -> Vec<Command> {
    let up = [mv(0, Change::StartLoad, 0), mv(0, Change::LoadDone { failed: None }, 0)];
    up.into_iter().chain(more).collect()
}

/// Due for an unload after `secs` idle.
fn unload(secs: u64) -> Option<IdleDue> {
    Some(IdleDue { idle: Duration::from_secs(secs), action: IdleAction::Unload })
}

/// Due for a sleep after `secs` idle.
fn sleep(secs: u64) -> Option<IdleDue> {
    Some(IdleDue { idle: Duration::from_secs(secs), action: IdleAction::Sleep })
}

#[test]
fn the_idle_rule_as_a_table() {
    let t0 = Instant::now();
    let s = Duration::from_secs;
    let seen = IdleSeen {
        unload: NonZeroU32::new(60),
        sleep: None,
        pinned: false,
        busy: false,
        pins: 0,
        idle: s(60),
    };
    let lease = || acquire(0, 0, 600);
    let pause =
        || mv(0, Change::Pause { mode: PauseMode::InPlace, cause: PauseCause::Operator }, 0);
    // (name, commands before, what housekeeping saw, the answer)
    let sleepy = IdleSeen { sleep: NonZeroU32::new(30), ..seen.clone() };
    let asleep = || mv(0, Change::Sleep { level: SleepLevel::Context }, 0);
    let rows: Vec<(&str, Vec<Command>, IdleSeen, Option<IdleDue>)> = vec![
        ("idle for its timeout", loaded(vec![]), seen.clone(), unload(60)),
        ("not yet", loaded(vec![]), IdleSeen { idle: s(59), ..seen.clone() }, None),
        ("long idle", loaded(vec![]), IdleSeen { idle: s(3600), ..seen.clone() }, unload(3600)),
        ("no unload timeout", loaded(vec![]), IdleSeen { unload: None, ..seen.clone() }, None),
        (
            "idle for its sleep",
            loaded(vec![]),
            IdleSeen { idle: s(30), ..sleepy.clone() },
            sleep(30),
        ),
        ("not yet for that", loaded(vec![]), IdleSeen { idle: s(29), ..sleepy.clone() }, None),
        (
            "asleep already: it waits for the unload",
            loaded(vec![asleep()]),
            IdleSeen { idle: s(45), ..sleepy.clone() },
            None,
        ),
        ("then it is unloaded", loaded(vec![asleep()]), sleepy.clone(), unload(60)),
        ("the unload first when both are due", loaded(vec![]), sleepy.clone(), unload(60)),
        (
            "a sleep without an unload timeout",
            loaded(vec![]),
            IdleSeen { unload: None, idle: s(3600), ..sleepy.clone() },
            sleep(3600),
        ),
        (
            "no sleep while paused",
            loaded(vec![pause()]),
            IdleSeen { idle: s(30), ..sleepy.clone() },
            None,
        ),
        (
            "nor while leased",
            loaded(vec![lease()]),
            IdleSeen { idle: s(30), ..sleepy.clone() },
            None,
        ),
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
            unload(60),
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
