//! A model's phase with what is valid only in it: the runtimes in service with their pause
//! and weight version while loaded or unloading, the progress and the outcome every caller
//! waits on while loading, nothing while unloaded or failed.
//!
//! The lifecycle (`hangar-lifecycle`) keeps the spec's state, its last error and the
//! transition table; [`ModelEntry::apply`](crate::entry::ModelEntry::apply) moves both
//! together, so a phase never disagrees with the state the wire shows.

use std::sync::Arc;

use hangar_backend::{Runtime, RuntimeDetails};
use hangar_lifecycle::{ModelState, Scheduler};

use crate::outcome::OutcomeRx;
use crate::pause::Paused;

/// What a model's runtimes are now.
pub(crate) enum Phase {
    /// Unloaded or failed: no runtimes.
    Down,
    /// Loading: how far, and the outcome every caller of the load waits on.
    Loading { progress: f32, outcome: OutcomeRx },
    /// Loaded, or unloading while they drain: the runtimes in service.
    Up(Serving),
}

/// Runtimes in service and what is set on them.
pub(crate) struct Serving {
    pub(crate) scheduler: Scheduler<dyn Runtime>,
    /// What the engine reported for each replica.
    pub(crate) details: Arc<[RuntimeDetails]>,
    /// The pause in effect.
    pub(crate) pause: Option<Paused>,
    /// The `weight_version` a weight update set; `None` for the weights a load loaded.
    pub(crate) weight_version: Option<String>,
    /// The sleep the runtimes are in (`sleep.rs`); `None` while awake.
    pub(crate) asleep: Option<crate::sleep::Asleep>,
}

impl Phase {
    /// Whether this phase is the one `state` has (`Up` while loaded or unloading).
    pub(crate) fn fits(&self, state: ModelState) -> bool {
        match self {
            Phase::Down => matches!(state, ModelState::Unloaded | ModelState::Failed),
            Phase::Loading { .. } => state == ModelState::Loading,
            Phase::Up(_) => matches!(state, ModelState::Loaded | ModelState::Unloading),
        }
    }

    /// The runtimes in service, if any.
    pub(crate) fn serving(&self) -> Option<&Serving> {
        match self {
            Phase::Up(serving) => Some(serving),
            _ => None,
        }
    }

    /// The runtimes in service, to change what is set on them.
    pub(crate) fn serving_mut(&mut self) -> Option<&mut Serving> {
        match self {
            Phase::Up(serving) => Some(serving),
            _ => None,
        }
    }

    /// The scheduler in service, if any.
    pub(crate) fn scheduler(&self) -> Option<&Scheduler<dyn Runtime>> {
        self.serving().map(|s| &s.scheduler)
    }

    /// How many replicas serve (0 unless loaded or unloading).
    pub(crate) fn loaded_replicas(&self) -> u32 {
        self.serving().map_or(0, |s| s.details.len() as u32)
    }

    /// The pause in effect, if any.
    pub(crate) fn pause(&self) -> Option<&Paused> {
        self.serving().and_then(|s| s.pause.as_ref())
    }
}
