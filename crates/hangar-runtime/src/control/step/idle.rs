//! The idle rule, decided in [`step`](super::step): a model is unloaded for idleness once it
//! has been idle for its timeout (`idle_unload_seconds`), loaded, with nothing running,
//! queued or pinned by a waiting request, not paused, not held (a live or reserved lease,
//! a replacement, its definition's pin).
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
    /// Its idle timeout.
    pub(crate) timeout: NonZeroU32,
    /// `pinned: true` in its definition.
    pub(crate) pinned: bool,
    /// Requests running or queued (or no scheduler to ask).
    pub(crate) busy: bool,
    /// Requests that triggered its load and wait for admission.
    pub(crate) pins: u32,
    /// Since its last use.
    pub(crate) idle: Duration,
}

/// Answers whether `model` is idle past its timeout: how long it has been idle then.
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
    let timeout = Duration::from_secs(u64::from(seen.timeout.get()));
    let answer = (!kept && seen.idle >= timeout).then_some(seen.idle);
    effects.push(Effect::Idle { model, waiter, answer });
}
