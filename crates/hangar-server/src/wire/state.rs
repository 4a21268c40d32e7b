//! The lifecycle's states and the events that move them.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The live runtime state of a configured model.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    JsonSchema,
    strum::IntoStaticStr,
    strum::Display,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum ModelState {
    /// Known from config; no runtime is loaded. Requests are rejected (`model_not_loaded`);
    /// the model may be loaded.
    Unloaded,
    /// A load was requested and has not finished (it may wait for its turn in the load lane).
    /// Requests are rejected (`model_loading`); duplicate loads return the current state.
    Loading,
    /// Runtimes exist and serve requests; the model may be unloaded.
    Loaded,
    /// No new requests are admitted (`model_unloading`); in-flight requests finish, then
    /// the runtimes are released.
    Unloading,
    /// The last load failed or the runtime crashed; `last_error` says why. Requests are
    /// rejected (`model_failed`); the model may be loaded again.
    Failed,
}

/// What happens to a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LifecycleEvent {
    /// A load was accepted.
    StartLoad,
    /// Every replica loaded.
    LoadSucceeded,
    /// The load failed (after any retry).
    LoadFailed,
    /// A graceful unload began.
    StartUnload,
    /// In-flight work drained and the runtimes were released.
    UnloadCompleted,
    /// A runtime died while loaded.
    Crashed,
    /// A loaded model's runtimes were replaced by new ones (a reload with other options);
    /// the old ones served until the new ones were ready.
    Reloaded,
}

impl From<hangar_runtime::ModelState> for ModelState {
    fn from(v: hangar_runtime::ModelState) -> Self {
        match v {
            hangar_runtime::ModelState::Unloaded => Self::Unloaded,
            hangar_runtime::ModelState::Loading => Self::Loading,
            hangar_runtime::ModelState::Loaded => Self::Loaded,
            hangar_runtime::ModelState::Unloading => Self::Unloading,
            hangar_runtime::ModelState::Failed => Self::Failed,
        }
    }
}

impl From<ModelState> for hangar_runtime::ModelState {
    fn from(v: ModelState) -> Self {
        match v {
            ModelState::Unloaded => Self::Unloaded,
            ModelState::Loading => Self::Loading,
            ModelState::Loaded => Self::Loaded,
            ModelState::Unloading => Self::Unloading,
            ModelState::Failed => Self::Failed,
        }
    }
}

impl From<hangar_runtime::LifecycleEvent> for LifecycleEvent {
    fn from(v: hangar_runtime::LifecycleEvent) -> Self {
        match v {
            hangar_runtime::LifecycleEvent::StartLoad => Self::StartLoad,
            hangar_runtime::LifecycleEvent::LoadSucceeded => Self::LoadSucceeded,
            hangar_runtime::LifecycleEvent::LoadFailed => Self::LoadFailed,
            hangar_runtime::LifecycleEvent::StartUnload => Self::StartUnload,
            hangar_runtime::LifecycleEvent::UnloadCompleted => Self::UnloadCompleted,
            hangar_runtime::LifecycleEvent::Crashed => Self::Crashed,
            hangar_runtime::LifecycleEvent::Reloaded => Self::Reloaded,
        }
    }
}
