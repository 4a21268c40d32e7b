//! Never twice for nothing, decided in [`step`](super::step): a load that failed inside its
//! engine after every model that may be evicted on its devices was evicted (a
//! [`Change::LoadDone`](super::Change::LoadDone) failure marked `exhausted`) is marked with
//! the loop's count of frees — unloads ended, crashes, sleeps, models added to or removed
//! from the config. Until that count moves:
//!
//! - a load on demand ([`Command::MayLoad`](super::Command::MayLoad), not explicit) is
//!   refused at once ([`Refused::Exhausted`]: 507, nothing evicted), and the quarantine
//!   counts it as a failure;
//! - the retry after a failure ([`Ask::Retry`](crate::grant::Ask::Retry)) evicts nothing:
//!   evicting what loaded since (on demand, probably for the models evicted last time) and
//!   trying again would swap them out for nothing, and again (Ollama #18282's livelock);
//! - an explicit load still tries (seed 000: a failed model may be loaded again), without
//!   that retry.
//!
//! A load that succeeds clears the mark. Memory freed outside Hangar (another process on
//! the GPU) moves no count: an explicit load, or any unload, tries again.

use super::{LoadFailed, ModelId, State};
use crate::quarantine::Refused;

/// Something that may make room happened (an unload ended, a crash, a sleep, the models
/// changed).
pub(super) fn freed<W>(state: &mut State<W>) {
    state.frees = state.frees.wrapping_add(1);
}

/// `model`'s load ended: loaded (`None`), or `failed` (marked when after every eviction
/// there was, with the engine's error).
pub(super) fn load_done<W>(state: &mut State<W>, model: ModelId, failed: Option<&LoadFailed>) {
    let frees = state.frees;
    state.models[model].exhausted =
        failed.filter(|f| f.exhausted).map(|f| (frees, crate::journal::bounded(&f.message)));
}

/// Whether `model` failed after evicting everything and nothing was freed since.
pub(super) fn exhausted<W>(state: &State<W>, model: ModelId) -> bool {
    state.models[model].exhausted.as_ref().is_some_and(|(at, _)| *at == state.frees)
}

/// The refusal of a load on demand of an exhausted `model`, with the error of the load
/// that exhausted it.
pub(super) fn refusal<W>(state: &State<W>, model: ModelId) -> Option<Refused> {
    let (_, last_error) = state.models[model].exhausted.as_ref()?;
    let last_error = last_error.clone();
    exhausted(state, model).then_some(Refused::Exhausted { last_error })
}
