//! The idle rule, decided in [`step`](super::step): a model is unloaded for idleness once it
//! has been idle for its timeout (`idle_unload_seconds`), loaded, with nothing running,
//! queued or pinned by a waiting request, not paused, not held (a live or reserved lease,
//! a replacement, its definition's pin); before that, one whose engine can sleep is put to
//! sleep once idle for `idle_sleep_seconds` (asleep already, it waits for the unload).
//!
//! Housekeeping sends what only the slots and the scheduler know (how long since the last
//! use, requests running or queued, pins); the loop adds what it owns (the state, the
//! pause, the holds). The unload that follows still moves the model only if nothing holds
//! it then ([`Change::StartUnload`](super::Change::StartUnload)).

use std::num::NonZeroU32;
use std::time::Duration;

use hangar_lifecycle::ModelState;
use tokio::time::Instant;

use super::{Effect, ModelId, State, grant};

/// What housekeeping saw of a model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IdleSeen {
    /// Its idle timeout for an unload.
    pub(crate) unload: Option<NonZeroU32>,
    /// Its idle timeout for a sleep, when its engine can sleep.
    pub(crate) sleep: Option<NonZeroU32>,
    /// `pinned: true` in its definition.
    pub(crate) pinned: bool,
    /// Requests running or queued (or no scheduler to ask).
    pub(crate) busy: bool,
    /// Requests that triggered its load and wait for admission.
    pub(crate) pins: u32,
    /// Since its last use.
    pub(crate) idle: Duration,
}

/// What an idle model is due for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IdleAction {
    /// Put to sleep (`idle_sleep_seconds`).
    Sleep,
    /// Unloaded (`idle_unload_seconds`).
    Unload,
}

/// An idle model's due: how long it has been idle, and for what.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IdleDue {
    pub(crate) idle: Duration,
    pub(crate) action: IdleAction,
}

/// Answers whether `model` is idle past a timeout: how long it has been idle then, and
/// what for (the unload first, when both are due).
pub(super) fn idle<W, P>(
    state: &State<W>,
    model: ModelId,
    seen: &IdleSeen,
    waiter: W,
    now: Instant,
    effects: &mut Vec<Effect<W, P>>,
) {
    let life = &state.models[model].life;
    let kept = seen.pinned
        || life.state() != ModelState::Loaded
        || seen.busy
        || seen.pins > 0
        || life.paused()
        || grant::held(state, model, now);
    let past = |timeout: Option<NonZeroU32>| {
        timeout.is_some_and(|t| seen.idle >= Duration::from_secs(u64::from(t.get())))
    };
    let action = if kept {
        None
    } else if past(seen.unload) {
        Some(IdleAction::Unload)
    } else if past(seen.sleep) && life.asleep().is_none() {
        Some(IdleAction::Sleep)
    } else {
        None
    };
    let answer = action.map(|action| IdleDue { idle: seen.idle, action });
    effects.push(Effect::Idle { model, waiter, answer });
}
