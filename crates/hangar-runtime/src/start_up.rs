//! Start-up and readiness: loading the enabled models in the config's stated order
//! ([`hangar_config::Config::start_up_plan`]) without one enabled model evicting another,
//! and why an enabled model is not serving ([`Manager::not_serving`], `/readyz`).

use std::sync::atomic::{AtomicU8, Ordering};

use hangar_config::{ModelName, ModelType, StartUpChoice};
use hangar_lifecycle::ModelState;

use crate::error::ManagerError;
use crate::load::Trigger;
use crate::manager::{LoadOptions, Manager};
use crate::snapshot::ModelSnapshot;

/// What start-up did with one enabled model.
#[derive(Debug)]
pub enum StartUp {
    /// Loaded.
    Loaded(Box<ModelSnapshot>),
    /// Left unloaded: its type's slots went to enabled models earlier in config order.
    NoSlot,
    /// Refused: only evicting other enabled (or pinned) models would have made room.
    NoRoom(ManagerError),
    /// The load failed.
    Failed(ManagerError),
}

/// Why an enabled model is not serving.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr, strum::Display)]
#[strum(serialize_all = "snake_case")]
pub enum NotServingReason {
    /// Start-up has not reached it yet.
    StartUpPending,
    /// A load is in progress.
    Loading,
    /// An unload is in progress.
    Unloading,
    /// Its last load failed or its runtime crashed.
    LoadFailed,
    /// It failed too often and loads on demand are refused for a while.
    Quarantined,
    /// Start-up left it unloaded: more models of its type are enabled than
    /// `max_loaded_models` allows. Does not hold readiness back.
    NoSlot,
    /// Start-up did not load it: only evicting another enabled (or pinned) model would
    /// have made room. Does not hold readiness back.
    NoRoom,
    /// It was unloaded after start-up (by an operator, for idleness, or evicted).
    Unloaded,
}

/// An enabled model that is not serving, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotServing {
    /// The model.
    pub model: ModelName,
    /// Why, as its snapshot says.
    pub info: NotServingInfo,
    /// The detail, when there is one (the last error, the refusal).
    pub message: Option<String>,
}

/// Why an enabled model is not serving, as its snapshot says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotServingInfo {
    /// Why.
    pub reason: NotServingReason,
    /// Whether the server is not ready while this lasts: true for every model of
    /// start-up's set; false for the ones it left out by rule (`no_slot`, `no_room`), which
    /// a restart would not change, even after they were loaded on demand since.
    pub holds_readiness: bool,
}

/// Why `entry` (in `slot`'s state, quarantined or not) is not serving; `None` when it
/// serves or is not enabled.
pub(crate) fn gap(
    entry: &crate::entry::ModelEntry,
    state: ModelState,
    quarantined: bool,
) -> Option<NotServingInfo> {
    if !entry.config.enabled {
        return None;
    }
    let reason = reason(state, entry.start_up.get(), quarantined)?;
    Some(NotServingInfo { reason, holds_readiness: entry.start_up.in_start_up_set() })
}

/// Start-up's mark on a model: what it decided, until the model loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Mark {
    /// Nothing to say (not enabled, or start-up loaded or tried it).
    None = 0,
    /// Start-up will take it.
    Pending = 1,
    /// Left for want of a slot.
    NoSlot = 2,
    /// Refused for want of room.
    NoRoom = 3,
    /// Left out by start-up (for want of a slot or of room) and loaded since.
    Outside = 4,
}

/// A model's [`Mark`], readable without the slot lock.
#[derive(Debug, Default)]
pub(crate) struct MarkCell(AtomicU8);

impl MarkCell {
    pub(crate) fn get(&self) -> Mark {
        match self.0.load(Ordering::Relaxed) {
            1 => Mark::Pending,
            2 => Mark::NoSlot,
            3 => Mark::NoRoom,
            4 => Mark::Outside,
            _ => Mark::None,
        }
    }

    /// A load other than start-up's begins: a model start-up left out stays out of its
    /// set, with the reasons of any other model from now on.
    pub(crate) fn loading(&self) {
        if matches!(self.get(), Mark::NoSlot | Mark::NoRoom) {
            self.set(Mark::Outside);
        }
    }

    /// Whether the model belongs to start-up's set (it holds readiness back while not
    /// serving).
    pub(crate) fn in_start_up_set(&self) -> bool {
        !matches!(self.get(), Mark::NoSlot | Mark::NoRoom | Mark::Outside)
    }

    pub(crate) fn set(&self, mark: Mark) {
        self.0.store(mark as u8, Ordering::Relaxed);
    }
}

/// Why an enabled model in `state` is not serving, given start-up's `mark` and whether a
/// quarantine is in effect; `None` when it serves. Pure: the readiness rule.
pub(crate) fn reason(state: ModelState, mark: Mark, quarantined: bool) -> Option<NotServingReason> {
    use NotServingReason as R;
    Some(match (state, mark) {
        (ModelState::Loaded, _) => return None,
        (ModelState::Loading, _) => R::Loading,
        (ModelState::Unloading, _) => R::Unloading,
        // Start-up's refusal leaves the model failed, with the refusal as its error.
        (ModelState::Unloaded | ModelState::Failed, Mark::NoRoom) => R::NoRoom,
        (ModelState::Unloaded | ModelState::Failed, Mark::NoSlot) => R::NoSlot,
        (ModelState::Failed, _) if quarantined => R::Quarantined,
        (ModelState::Failed, _) => R::LoadFailed,
        (ModelState::Unloaded, Mark::Pending) => R::StartUpPending,
        (ModelState::Unloaded, Mark::None | Mark::Outside) if quarantined => R::Quarantined,
        (ModelState::Unloaded, Mark::None | Mark::Outside) => R::Unloaded,
    })
}

/// Marks the models start-up will take (pending) and leave out (no slot), and answers the
/// enabled models' positions in start-up's order.
pub(crate) fn mark(
    config: &hangar_config::Config,
    models: &crate::registry::Registry,
) -> Vec<std::sync::Arc<crate::entry::ModelEntry>> {
    let mut plan = Vec::new();
    for (name, choice) in config.start_up_plan() {
        let Some(entry) = models.lookup(name.as_str()) else { continue };
        entry.start_up.set(match choice {
            StartUpChoice::Load => Mark::Pending,
            StartUpChoice::NoSlot => Mark::NoSlot,
        });
        plan.push(std::sync::Arc::clone(entry));
    }
    plan
}

impl Manager {
    /// Loads the enabled models as the config's start-up plan says
    /// ([`hangar_config::Config::start_up_plan`]): in config order, one after another; of
    /// each type only as many as it has slots (the rest are [`StartUp::NoSlot`]), the slot
    /// of one that fails going to the next in order; and without evicting another enabled
    /// model (a load that would is [`StartUp::NoRoom`]). Until it has loaded them, the
    /// models it will load say `start_up_pending`.
    pub async fn load_enabled(&self) -> Vec<(ModelName, StartUp)> {
        let mut done = Vec::with_capacity(self.inner.start_up.len());
        let mut loaded = [0u32; ModelType::ALL.len()];
        for entry in &self.inner.start_up {
            let (name, ty) = (entry.config.name.clone(), entry.config.model_type);
            if loaded[ty as usize] >= self.inner.slots.get(ty).get() {
                entry.start_up.set(Mark::NoSlot);
                done.push((name, StartUp::NoSlot));
                continue;
            }
            entry.start_up.set(Mark::Pending);
            let load =
                self.load_with(name.as_str(), LoadOptions::default(), false, Trigger::StartUp);
            let outcome = match load.await {
                Ok(model) => {
                    loaded[ty as usize] += 1;
                    StartUp::Loaded(Box::new(model))
                }
                Err(
                    e @ (ManagerError::SlotsPinned { .. } | ManagerError::InsufficientVram { .. }),
                ) => {
                    entry.start_up.set(Mark::NoRoom);
                    done.push((name, StartUp::NoRoom(e)));
                    continue;
                }
                Err(e) => StartUp::Failed(e),
            };
            entry.start_up.set(Mark::None);
            done.push((name, outcome));
        }
        done
    }

    /// The enabled models that are not serving, in config order, each with its reason.
    pub fn not_serving(&self) -> Vec<NotServing> {
        self.registry()
            .order
            .iter()
            .filter_map(|e| {
                let slot = e.lock();
                let quarantined = slot.failures.active().is_some();
                let info = gap(e, slot.lifecycle.state(), quarantined)?;
                let message = match info.reason {
                    NotServingReason::LoadFailed
                    | NotServingReason::Quarantined
                    | NotServingReason::NoRoom => slot.lifecycle.last_error().map(str::to_owned),
                    _ => None,
                };
                Some(NotServing { model: e.config.name.clone(), info, message })
            })
            .collect()
    }

    /// Names of the enabled models that hold readiness back (see
    /// [`NotServing::holds_readiness`]), in config order: empty when the server is ready.
    pub fn not_ready(&self) -> Vec<ModelName> {
        self.not_serving().into_iter().filter(|n| n.info.holds_readiness).map(|n| n.model).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_readiness_rule() {
        use ModelState::*;
        use NotServingReason as R;
        // (state, start-up mark, quarantined, reason)
        let table = [
            (Loaded, Mark::None, false, None),
            (Loaded, Mark::NoSlot, false, None),
            (Loaded, Mark::Pending, true, None),
            (Loading, Mark::Pending, false, Some(R::Loading)),
            (Loading, Mark::NoSlot, false, Some(R::Loading)),
            (Unloading, Mark::None, false, Some(R::Unloading)),
            (Failed, Mark::None, false, Some(R::LoadFailed)),
            (Failed, Mark::None, true, Some(R::Quarantined)),
            (Failed, Mark::NoRoom, false, Some(R::NoRoom)),
            (Failed, Mark::Outside, false, Some(R::LoadFailed)),
            (Unloaded, Mark::Outside, false, Some(R::Unloaded)),
            (Loading, Mark::Outside, false, Some(R::Loading)),
            (Unloaded, Mark::Pending, false, Some(R::StartUpPending)),
            (Unloaded, Mark::NoSlot, false, Some(R::NoSlot)),
            (Unloaded, Mark::NoSlot, true, Some(R::NoSlot)),
            (Unloaded, Mark::NoRoom, false, Some(R::NoRoom)),
            (Unloaded, Mark::None, false, Some(R::Unloaded)),
            (Unloaded, Mark::None, true, Some(R::Quarantined)),
        ];
        for (state, mark, quarantined, want) in table {
            assert_eq!(reason(state, mark, quarantined), want, "{state} {mark:?} {quarantined}");
        }
    }

    #[test]
    fn a_model_start_up_left_out_stays_out_of_its_set_once_loaded() {
        // (mark before, after a load other than start-up's, in start-up's set after)
        let table = [
            (Mark::None, Mark::None, true),
            (Mark::Pending, Mark::Pending, true),
            (Mark::NoSlot, Mark::Outside, false),
            (Mark::NoRoom, Mark::Outside, false),
            (Mark::Outside, Mark::Outside, false),
        ];
        for (before, after, in_set) in table {
            let cell = MarkCell::default();
            cell.set(before);
            cell.loading();
            assert_eq!((cell.get(), cell.in_start_up_set()), (after, in_set), "{before:?}");
        }
    }

    #[test]
    fn a_mark_reads_back_as_set() {
        let cell = MarkCell::default();
        assert_eq!(cell.get(), Mark::None);
        for mark in [Mark::Pending, Mark::NoSlot, Mark::NoRoom, Mark::Outside, Mark::None] {
            cell.set(mark);
            assert_eq!(cell.get(), mark);
        }
    }
}
