//! The quarantine rules, decided in [`step`](super::step): a model that fails to load or
//! crashes `quarantine.failures` times within `quarantine.window_seconds` is not loaded on
//! demand until its backoff ends or an explicit load lifts it (`crate::quarantine` holds
//! the counting and the backoff, [`FailureLog`]).
//!
//! - [`Command::Failed`](super::Command::Failed) records a failure, which may begin a
//!   quarantine (journaled);
//! - [`Command::MayLoad`](super::Command::MayLoad) asks before a load starts: a load on
//!   demand (a request's auto-load, a lease) is refused while the model is quarantined, or
//!   while its last load failed after evicting everything and nothing was freed since
//!   (`exhaust.rs`; that refusal counts as a failure); an explicit one lifts the quarantine
//!   (journaled) and goes ahead. No load of a model that left the config starts
//!   ([`Command::Retire`](super::Command::Retire)).
//!
//! Every change of a model's failures is published before any answer of the same step.

use tokio::time::Instant;

use super::{Effect, ModelId, State};
use crate::quarantine::{FailureKind, FailureLog, Refused};

/// Records a failure of `model`.
pub(super) fn failed<W, P>(
    state: &mut State<W>,
    model: ModelId,
    (kind, message, wall_ms): (FailureKind, String, u64),
    now: Instant,
    effects: &mut Vec<Effect<W, P>>,
) {
    let log = &mut state.models[model].failures;
    let began = log.record(&state.rules.quarantine, kind, &message, now, wall_ms);
    publish(log, model, effects);
    if let Some(quarantine) = began {
        effects.push(Effect::Quarantined { model, quarantine });
    }
}

/// Whether `model` may load now: an `explicit` load lifts its quarantine; one on demand is
/// refused while it is quarantined.
pub(super) fn may_load<W, P>(
    state: &mut State<W>,
    model: ModelId,
    (explicit, wall_ms): (bool, u64),
    waiter: W,
    now: Instant,
    effects: &mut Vec<Effect<W, P>>,
) {
    if state.models[model].retired {
        effects.push(Effect::MayLoad { model, waiter, answer: Err(Refused::Removed) });
        return;
    }
    let log = &mut state.models[model].failures;
    let answer = if explicit {
        if log.lift(now) {
            publish(log, model, effects);
            effects.push(Effect::QuarantineLifted { model });
        }
        Ok(())
    } else {
        match log.active(now) {
            None => match super::exhaust::refusal(state, model) {
                None => Ok(()),
                Some(refused) => {
                    let failure = (FailureKind::LoadFailed, EXHAUSTED.to_owned(), wall_ms);
                    failed(state, model, failure, now, effects);
                    Err(refused)
                }
            },
            Some(quarantine) => {
                let last_error = log.last_message().unwrap_or_default().to_owned();
                Err(Refused::Quarantined { quarantine, last_error })
            }
        }
    };
    effects.push(Effect::MayLoad { model, waiter, answer });
}

/// What the failure log says of a load on demand refused by `exhaust.rs`.
const EXHAUSTED: &str = "not loaded on demand: its last load failed after every model that may be evicted on its devices was, and nothing was freed since";

fn publish<W, P>(log: &FailureLog, model: ModelId, effects: &mut Vec<Effect<W, P>>) {
    effects.push(Effect::Failures { model, view: log.view() });
}
