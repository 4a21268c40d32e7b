//! Load lanes, decided in [`step`](super::step): which creations may run at once.
//!
//! Each model's creations take memory in fixed places ([`Lanes`], from its definition):
//! the GPUs it may use (every GPU when it may use any), the host (models on the CPU), and,
//! for in-process llama.cpp models, the one engine whose load-time log capture is
//! process-wide; remote models take the remote lane only. Two creations run at once only
//! when their places are disjoint and the slots of the later one's type have room for
//! both, so each grant's free memory, its GPU delta and its slot count are its own. With
//! no creation running, the first ready one goes whatever its places (the grant makes
//! room). A waiting creation claims its places against later ones, so none is overtaken
//! for good by creations behind it.

use hangar_config::ModelType;
use hangar_lifecycle::ModelState;

use super::{Effect, ModelId, State, TurnKind};

/// A set of places a creation takes: bit `i < 64` is GPU `i`; then the host, in-process
/// llama.cpp and remote servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lanes(u128);

impl Lanes {
    /// Every place: a creation that excludes all others (the default).
    pub(crate) const ALL: Self = Self(u128::MAX);
    /// The host's memory.
    pub(crate) const HOST: Self = Self(1 << 64);
    /// In-process llama.cpp, whose loads capture its log process-wide.
    pub(crate) const LLAMA_IN_PROCESS: Self = Self(1 << 65);
    /// Remote servers.
    pub(crate) const REMOTE: Self = Self(1 << 66);

    /// The GPUs `gpus` (every GPU when empty).
    pub(crate) fn gpus(gpus: &[u32]) -> Self {
        if gpus.is_empty() {
            return Self(u128::from(u64::MAX));
        }
        Self(gpus.iter().filter(|&&g| g < 64).fold(0, |set, &g| set | (1 << g)))
    }

    /// Both sets.
    pub(crate) fn with(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }

    fn overlaps(self, other: Self) -> bool {
        self.0 & other.0 != 0
    }
}

/// What lanes know of a model: its places and its type (for slots).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LaneInfo {
    /// The places its creations take.
    pub(crate) lanes: Lanes,
    /// Its type.
    pub(crate) model_type: ModelType,
}

impl Default for LaneInfo {
    fn default() -> Self {
        Self { lanes: Lanes::ALL, model_type: ModelType::Llm }
    }
}

fn info<W>(state: &State<W>, model: ModelId) -> LaneInfo {
    state.rules.lanes.get(model).copied().unwrap_or_default()
}

/// Whether a slot of `model`'s type is left for it beside every model that holds or may
/// soon hold one: loaded, loading, unloading, or creating. A loaded model (a reload, a
/// weight update) needs no slot.
fn slot_left<W>(state: &State<W>, model: ModelId) -> bool {
    let ty = info(state, model).model_type;
    let occupies = |m: usize| {
        matches!(
            state.models[m].life.state(),
            ModelState::Loaded | ModelState::Loading | ModelState::Unloading
        ) || state.lane.contains(&m)
    };
    if state.models[model].life.state() == ModelState::Loaded {
        return true;
    }
    let taken = (0..state.models.len())
        .filter(|&m| m != model && info(state, m).model_type == ty && occupies(m))
        .count();
    taken < state.rules.limits.get(ty).get() as usize
}

/// Gives the lane to every waiting creation that may run now, in the order asked: its
/// model's runtimes free and no destruction of it waiting, and its places disjoint from
/// those of the creations running and of the ready ones before it.
pub(super) fn open<W, P>(state: &mut State<W>, effects: &mut Vec<Effect<W, P>>) {
    let mut claimed = state.lane.iter().fold(Lanes(0), |set, &m| set.with(info(state, m).lanes));
    let mut i = 0;
    while i < state.creations.len() {
        let model = state.creations[i].0;
        let m = &state.models[model];
        if m.runtimes.is_some() || !m.destroys.is_empty() {
            i += 1;
            continue;
        }
        let lanes = info(state, model).lanes;
        let go = state.lane.is_empty() || (!lanes.overlaps(claimed) && slot_left(state, model));
        claimed = claimed.with(lanes);
        if !go {
            i += 1;
            continue;
        }
        if let Some((model, waiter)) = state.creations.remove(i) {
            state.lane.push(model);
            state.models[model].runtimes = Some(TurnKind::Create);
            effects.push(Effect::Grant { model, turn: TurnKind::Create, waiter });
        }
    }
}
