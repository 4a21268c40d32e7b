//! What the loop's tests share: its commands and effects with numbers for waiters and no
//! slot work, a table's row, and the commands most tables build.

use std::time::Duration;

use tokio::time::Instant;

use super::step::{Change, LeaseCommand, ModelId, Rules, State, step};

/// The loop's commands with numbers for waiters and no slot work.
pub(super) type Command = super::step::Command<u32>;
/// The loop's effects, see [`Command`].
pub(super) type Effect = super::step::Effect<u32>;

/// One row of a rules table: on a fresh `State` of `models` models, steps `before` at
/// `t0`, then `command` `secs` seconds later; returns what that last step did.
pub(super) fn row(
    models: usize,
    rules: Rules,
    before: Vec<Command>,
    command: Command,
    (t0, secs): (Instant, u64),
) -> Vec<Effect> {
    let mut state = State::new(models, rules);
    for c in before {
        step(&mut state, c, t0);
    }
    step(&mut state, command, t0 + Duration::from_secs(secs))
}

/// `model` moved by `change`, answered to `waiter`.
pub(super) fn mv(model: ModelId, change: Change, waiter: u32) -> Command {
    Command::Move { model, change, wall_ms: 0, apply: (), waiter }
}

/// A lease of `ttl_seconds` on `model` for "job", taken at 1,000 ms, answered to `waiter`.
pub(super) fn acquire(model: ModelId, waiter: u32, ttl_seconds: u32) -> Command {
    let owner = "job".to_owned();
    let command = LeaseCommand::Acquire { owner, ttl_seconds, wall_ms: 1_000, waiter };
    Command::Lease { model, command }
}
