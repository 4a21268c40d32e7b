//! The quarantine rules as a table against [`step`]. Waiters are plain numbers; no
//! runtime, no clock.

use std::num::NonZeroU32;
use std::time::Duration;

use hangar_config::QuarantinePolicy;
use tokio::time::Instant;

use super::step::{Change, LoadFailed, ModelId, Rules, State, step};
use super::testing::{Command, Effect, mv, row};
use crate::quarantine::Refused;

/// Two failures within a minute quarantine for 10 s, doubling up to 40 s.
fn rules() -> Rules {
    let quarantine = QuarantinePolicy {
        failures: NonZeroU32::new(2).unwrap(),
        window: Duration::from_secs(60),
        backoff: Duration::from_secs(10),
        max_backoff: Duration::from_secs(40),
    };
    Rules { quarantine, ..Rules::of(Duration::from_secs(10), 1) }
}

fn start(model: ModelId) -> Command {
    mv(model, Change::StartLoad, 0)
}

/// A load of `model` that failed with `message`, the model's own failure.
fn fail(model: ModelId, message: &str) -> Command {
    mv(model, Change::LoadDone { failed: Some(LoadFailed::counted(message)) }, 0)
}

/// A load of `model` that started and failed with `message`.
fn failed(model: ModelId, message: &str) -> [Command; 2] {
    [start(model), fail(model, message)]
}

fn may_load(model: ModelId, explicit: bool, waiter: u32) -> Command {
    Command::MayLoad { model, explicit, wall_ms: 0, waiter }
}

/// The effects as lines: `published M: messages`, `quarantined M: strike S, R s`,
/// `lifted M`, `W: ok` or `W: refused R s: last error`.
fn lines(effects: Vec<Effect>) -> Vec<String> {
    effects
        .into_iter()
        .map(|e| match e {
            Effect::Failures { model, view } => {
                let messages: Vec<_> = view.recent().into_iter().map(|f| f.message).collect();
                format!("published {model}: {}", messages.join(","))
            }
            Effect::Quarantined { model, quarantine: q } => {
                format!("quarantined {model}: strike {}, {} s", q.strike, q.retry_after_s)
            }
            Effect::QuarantineLifted { model } => format!("lifted {model}"),
            Effect::Moved { model, moved, .. } => {
                format!("{model}: {} -> {}", moved.from, moved.to)
            }
            Effect::MayLoad { waiter, answer: Ok(()), .. } => format!("{waiter}: ok"),
            Effect::MayLoad {
                waiter,
                answer: Err(Refused::Quarantined { quarantine, last_error }),
                ..
            } => {
                format!("{waiter}: refused {} s: {last_error}", quarantine.retry_after_s)
            }
            other => unreachable!("not a quarantine effect: {other:?}"),
        })
        .collect()
}

#[test]
fn the_quarantine_rules_as_a_table() {
    let t0 = Instant::now();
    // (name, commands before (at t0), the command, when (seconds after t0), its effects)
    type Row = (&'static str, Vec<Command>, Command, u64, Vec<&'static str>);
    let twice = || failed(0, "a").into_iter().chain(failed(0, "b")).collect::<Vec<_>>();
    let then = |before: Vec<Command>, more: Vec<Command>| before.into_iter().chain(more).collect();
    let load_done = |model| {
        let change = Change::LoadDone { failed: None };
        Command::Move { model, change, wall_ms: 0, apply: (), waiter: 0 }
    };
    let rows: Vec<Row> = vec![
        (
            "a failed load is published",
            vec![start(0)],
            fail(0, "a"),
            0,
            vec!["0: loading -> failed", "published 0: a"],
        ),
        (
            "the threshold quarantines, journaled",
            then(failed(0, "a").into(), vec![start(0)]),
            fail(0, "b"),
            0,
            vec!["0: loading -> failed", "published 0: a,b", "quarantined 0: strike 1, 10 s"],
        ),
        (
            "a crash counts like a failed load",
            vec![start(0), load_done(0)],
            Command::Move {
                model: 0,
                change: Change::Crash { generation: 1, message: "boom".into() },
                wall_ms: 0,
                apply: (),
                waiter: 0,
            },
            0,
            vec!["0: loaded -> failed", "published 0: boom"],
        ),
        (
            "a load the grant refused is not the model's failure",
            vec![start(0)],
            Command::Move {
                model: 0,
                change: Change::LoadDone {
                    failed: Some(LoadFailed { counts: false, ..LoadFailed::counted("held") }),
                },
                wall_ms: 0,
                apply: (),
                waiter: 0,
            },
            0,
            vec!["0: loading -> failed"],
        ),
        (
            "a load on demand is refused while it lasts, with the last error",
            twice(),
            may_load(0, false, 1),
            4,
            vec!["1: refused 6 s: b"],
        ),
        ("not once its backoff is over", twice(), may_load(0, false, 1), 10, vec!["1: ok"]),
        (
            "an explicit load lifts it, journaled",
            twice(),
            may_load(0, true, 1),
            4,
            vec!["published 0: a,b", "lifted 0", "1: ok"],
        ),
        (
            "an explicit load of a model not quarantined",
            failed(0, "a").into(),
            may_load(0, true, 1),
            0,
            vec!["1: ok"],
        ),
        (
            "another model's quarantine does not matter",
            twice(),
            may_load(1, false, 1),
            0,
            vec!["1: ok"],
        ),
        (
            "another model's failures do not count",
            then(failed(1, "a").into(), vec![start(0)]),
            fail(0, "b"),
            0,
            vec!["0: loading -> failed", "published 0: b"],
        ),
        (
            "failures older than the window do not count",
            then(failed(0, "a").into(), vec![start(0)]),
            fail(0, "b"),
            61,
            vec!["0: loading -> failed", "published 0: a,b"],
        ),
        (
            "a failure while quarantined begins no other",
            then(twice(), vec![start(0)]),
            fail(0, "c"),
            4,
            vec!["0: loading -> failed", "published 0: a,b,c"],
        ),
        (
            "after a lift the count starts over",
            then(twice(), vec![may_load(0, true, 1), start(0)]),
            fail(0, "c"),
            0,
            vec!["0: loading -> failed", "published 0: a,b,c"],
        ),
        (
            "the next one within the window lasts twice as long",
            then(twice(), vec![start(0)]),
            fail(0, "c"),
            11,
            vec!["0: loading -> failed", "published 0: a,b,c", "quarantined 0: strike 2, 20 s"],
        ),
        ("an unknown model changes nothing", vec![], fail(7, "a"), 0, vec![]),
    ];
    for (name, before, command, when, expected) in rows {
        let got = lines(row(2, rules(), before, command, (t0, when)));
        assert_eq!(got, expected, "{name}");
    }
}

#[test]
fn a_load_asked_after_a_failure_is_decided_after_it() {
    let t0 = Instant::now();
    let mut state = State::new(1, rules());
    // Posted before a load on demand, the failure that quarantines refuses that load.
    for command in failed(0, "a").into_iter().chain(failed(0, "b")) {
        step(&mut state, command, t0);
    }
    assert_eq!(lines(step(&mut state, may_load(0, false, 1), t0)), ["1: refused 10 s: b"]);
    let flushed = step(&mut state, Command::Flush { waiter: 2 }, t0);
    assert_eq!(flushed, [Effect::Flushed { waiter: 2 }]);
}
