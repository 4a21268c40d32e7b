//! The quarantine rules as a table against [`step`]. Waiters are plain numbers; no
//! runtime, no clock.

use std::num::NonZeroU32;
use std::time::Duration;

use hangar_config::QuarantinePolicy;
use tokio::time::Instant;

use super::step::{Command, Effect, ModelId, Rules, State, row, step};
use crate::quarantine::FailureKind;

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

fn failed(model: ModelId, message: &str) -> Command<u32> {
    let kind = FailureKind::Crashed;
    Command::Failed { model, kind, message: message.into(), wall_ms: 0 }
}

fn may_load(model: ModelId, explicit: bool, waiter: u32) -> Command<u32> {
    Command::MayLoad { model, explicit, waiter }
}

/// The effects as lines: `published M: messages`, `quarantined M: strike S, R s`,
/// `lifted M`, `W: ok` or `W: refused R s: last error`.
fn lines(effects: Vec<Effect<u32>>) -> Vec<String> {
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
            Effect::MayLoad { waiter, answer: Ok(()), .. } => format!("{waiter}: ok"),
            Effect::MayLoad { waiter, answer: Err(refused), .. } => {
                let q = refused.quarantine;
                format!("{waiter}: refused {} s: {}", q.retry_after_s, refused.last_error)
            }
            other => unreachable!("not a quarantine effect: {other:?}"),
        })
        .collect()
}

#[test]
fn the_quarantine_rules_as_a_table() {
    let t0 = Instant::now();
    // (name, commands before (at t0), the command, when (seconds after t0), its effects)
    type Row = (&'static str, Vec<Command<u32>>, Command<u32>, u64, Vec<&'static str>);
    let twice = || vec![failed(0, "a"), failed(0, "b")];
    let rows: Vec<Row> = vec![
        ("a failure is published", vec![], failed(0, "a"), 0, vec!["published 0: a"]),
        (
            "the threshold quarantines, journaled",
            vec![failed(0, "a")],
            failed(0, "b"),
            0,
            vec!["published 0: a,b", "quarantined 0: strike 1, 10 s"],
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
            vec![failed(0, "a")],
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
            vec![failed(1, "a")],
            failed(0, "b"),
            0,
            vec!["published 0: b"],
        ),
        (
            "failures older than the window do not count",
            vec![failed(0, "a")],
            failed(0, "b"),
            61,
            vec!["published 0: a,b"],
        ),
        (
            "a failure while quarantined begins no other",
            twice(),
            failed(0, "c"),
            4,
            vec!["published 0: a,b,c"],
        ),
        (
            "after a lift the count starts over",
            vec![failed(0, "a"), failed(0, "b"), may_load(0, true, 1)],
            failed(0, "c"),
            0,
            vec!["published 0: a,b,c"],
        ),
        (
            "the next one within the window lasts twice as long",
            twice(),
            failed(0, "c"),
            11,
            vec!["published 0: a,b,c", "quarantined 0: strike 2, 20 s"],
        ),
        ("an unknown model changes nothing", vec![], failed(7, "a"), 0, vec![]),
    ];
    for (name, before, command, when, expected) in rows {
        let got = lines(row(2, rules(), before, command, (t0, when)));
        assert_eq!(got, expected, "{name}");
    }
}

#[test]
fn every_waiter_is_answered_at_once_and_the_answer_follows_what_came_before() {
    let t0 = Instant::now();
    let mut state = State::new(1, rules());
    // A failure posted before a load on demand is decided first: the one that quarantines
    // refuses the load asked right after it.
    step(&mut state, failed(0, "a"), t0);
    step(&mut state, failed(0, "b"), t0);
    assert_eq!(lines(step(&mut state, may_load(0, false, 1), t0)), ["1: refused 10 s: b"]);
    let flushed = step(&mut state, Command::Flush { waiter: 2 }, t0);
    assert_eq!(flushed, [Effect::Flushed { waiter: 2 }]);
}
