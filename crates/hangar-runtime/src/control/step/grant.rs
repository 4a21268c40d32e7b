//! The grant, decided in [`step`](super::step): every path that creates runtimes (a load,
//! a reload, a weight update, a load's retry after a failure) asks here for the evictions
//! that make room, or a typed refusal, with `crate::grant::decide` (`hangar-eviction`'s
//! pure plan).
//!
//! The lane holder reads the loaded models (last use, requests, memory) and the memory;
//! what holds a model is the loop's own: a live or reserved lease, a reload or weight
//! update replacing its runtimes — besides `pinned: true` in its definition, which the
//! caller sets. A model the loop holds is never a victim.

use hangar_eviction::{Incoming, LoadedModel};
use tokio::time::Instant;

use super::{Effect, ModelId, State};
use crate::grant::{Ask, Places, decide};

/// What a creation asks the grant.
#[derive(Debug, Clone)]
pub(crate) struct GrantAsk {
    /// For what.
    pub(crate) ask: Ask,
    /// The loaded models as the lane holder read them, with their model ids; their `held`
    /// says what their definitions pin.
    pub(crate) loaded: Vec<(ModelId, LoadedModel)>,
    /// The model the runtimes are for.
    pub(crate) incoming: Incoming,
    /// The memory the runtimes take under a budget (each GPU's, or the host's for a model
    /// on the CPU); `None`: no admission by memory.
    pub(crate) places: Option<Places>,
    /// A GPU model's part of the host's memory under a `ram_budget`.
    pub(crate) host: Option<Places>,
}

/// Whether the loop holds `model`: a live or reserved lease, or its runtimes being
/// replaced.
pub(super) fn held<W>(state: &State<W>, model: ModelId, now: Instant) -> bool {
    let m = &state.models[model];
    m.replacing > 0 || m.leases.holds(now)
}

/// Decides the grant `asked` for `model` and answers `waiter`.
pub(super) fn grant<W, P>(
    state: &State<W>,
    model: ModelId,
    asked: GrantAsk,
    waiter: W,
    now: Instant,
    effects: &mut Vec<Effect<W, P>>,
) {
    let known = |id: ModelId| id < state.models.len();
    let loaded: Vec<LoadedModel> = asked
        .loaded
        .into_iter()
        .map(|(id, mut m)| {
            m.held |= known(id) && held(state, id, now);
            m
        })
        .collect();
    // A retry that failed once after evicting everything evicts nothing more until room
    // may have been made (`exhaust.rs`).
    if asked.ask == Ask::Retry && super::exhaust::exhausted(state, model) {
        effects.push(Effect::Granted { model, waiter, answer: Ok(Default::default()) });
        return;
    }
    let limits = &state.rules.limits;
    let (places, host) = (asked.places.as_ref(), asked.host.as_ref());
    let answer = decide(asked.ask, &loaded, &asked.incoming, limits, places, host);
    effects.push(Effect::Granted { model, waiter, answer });
}

/// A reload or weight update begins (`begins`) or ends replacing `model`'s runtimes.
pub(super) fn replacing<W, P>(
    state: &mut State<W>,
    model: ModelId,
    begins: bool,
    effects: &mut Vec<Effect<W, P>>,
) {
    let m = &mut state.models[model];
    m.replacing = if begins { m.replacing + 1 } else { m.replacing.saturating_sub(1) };
    effects.push(Effect::Replacing { model, count: m.replacing });
}
