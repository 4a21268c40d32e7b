//! The event stream's events and the manager's counters.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{LifecycleEvent, ModelState, PauseCause, PauseMode, QuarantineInfo};

/// One journaled change.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct ManagerEvent {
    /// Position in the journal: 1 for the first event of this process, then +1 each (the
    /// server-sent event's `id`, for `Last-Event-ID`).
    pub id: u64,
    /// When it happened, Unix milliseconds.
    pub unix_ms: u64,
    /// The model it concerns.
    pub model: String,
    /// What happened.
    #[serde(flatten)]
    pub kind: EventKind,
}

/// What happened to a model.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EventKind {
    /// A lifecycle transition (a crash is one: `loaded` → `failed`, cause `crashed`).
    State {
        /// State before.
        from: ModelState,
        /// State after.
        to: ModelState,
        /// What moved it.
        cause: LifecycleEvent,
        /// `last_error` when the model failed.
        #[serde(skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// A loading model's progress, from 0 to 1, over all its replicas.
    LoadProgress {
        /// Share loaded.
        progress: f32,
    },
    /// The model is being unloaded to make room (its `state` events follow).
    Evicted {
        /// `slot_limit`, `exclusive_device`, `vram_budget` or `load_failure_retry`.
        reason: String,
        /// The model whose load needed the room.
        for_model: String,
    },
    /// The model was paused (or its pause changed mode).
    Paused {
        /// What the pause did to admitted requests.
        mode: PauseMode,
        /// Who paused it.
        cause: PauseCause,
    },
    /// The model continued after a pause.
    Resumed,
    /// The model's runtimes went to sleep (it stays loaded).
    Slept {
        /// How deeply.
        level: super::SleepLevel,
        /// The model whose load it made room for (memory pressure); `null` when an
        /// operator or the idle timer put it to sleep.
        for_model: Option<String>,
    },
    /// They woke and passed the wake check.
    Woke {
        /// How long waking and the check took, in milliseconds.
        wake_ms: u64,
    },
    /// A lease was taken, renewed, released, expired or revoked.
    Lease {
        /// What happened.
        change: LeaseChange,
        /// The lease.
        id: String,
        /// Its holder.
        owner: String,
    },
    /// The model is being unloaded after `idle_unload_seconds` without work (its `state`
    /// events follow).
    IdleUnload {
        /// How long it had been idle.
        idle_seconds: u64,
    },
    /// New weights replaced the loaded ones.
    WeightsUpdated {
        /// The file or directory they came from.
        model_path: String,
        /// The new `weight_version`, if the update set one.
        #[serde(skip_serializing_if = "Option::is_none")]
        weight_version: Option<String>,
    },
    /// The model failed too often and is refused until `until_unix_ms`.
    Quarantined {
        /// The quarantine.
        #[serde(flatten)]
        quarantine: QuarantineInfo,
    },
    /// An explicit load lifted the model's quarantine.
    QuarantineLifted,
    /// A config reload changed the model's definition.
    Definition {
        /// What changed.
        change: DefinitionChange,
    },
}

/// What a config reload did to a model's definition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DefinitionChange {
    /// The model joined.
    Added,
    /// The model left: unloaded gracefully, it answers to no name.
    Removed,
    /// A changed definition took effect (nothing of the model was running).
    Changed,
    /// A changed definition waits for the model's next load (the row's `pending_definition`).
    Pending,
}

/// What happened to a lease (the journal's `lease` events).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LeaseChange {
    /// Taken.
    Acquired,
    /// Renewed.
    Renewed,
    /// Released by its holder.
    Released,
    /// Its time ran out.
    Expired,
    /// Dropped by an explicit unload of the model.
    Revoked,
}

/// Lifetime counters of the manager.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ManagerCounters {
    /// Loads that succeeded.
    pub loads: u64,
    /// Loads that ended in `failed`.
    pub load_failures: u64,
    /// Unloads completed (explicit and evictions).
    pub unloads: u64,
    /// Models unloaded to make room for another.
    pub evictions: u64,
    /// Runtimes that crashed while loaded.
    pub crashes: u64,
}

impl From<hangar_runtime::ManagerEvent> for ManagerEvent {
    fn from(v: hangar_runtime::ManagerEvent) -> Self {
        Self { id: v.id, unix_ms: v.unix_ms, model: v.model, kind: v.kind.into() }
    }
}

impl From<hangar_runtime::EventKind> for EventKind {
    fn from(v: hangar_runtime::EventKind) -> Self {
        match v {
            hangar_runtime::EventKind::State { from, to, cause, error } => {
                Self::State { from: from.into(), to: to.into(), cause: cause.into(), error }
            }
            hangar_runtime::EventKind::LoadProgress { progress } => Self::LoadProgress { progress },
            hangar_runtime::EventKind::Evicted { reason, for_model } => {
                Self::Evicted { reason, for_model }
            }
            hangar_runtime::EventKind::Paused { mode, cause } => {
                Self::Paused { mode: mode.into(), cause: cause.into() }
            }
            hangar_runtime::EventKind::Resumed => Self::Resumed,
            hangar_runtime::EventKind::Slept { level, for_model } => {
                Self::Slept { level: level.into(), for_model }
            }
            hangar_runtime::EventKind::Woke { wake_ms } => Self::Woke { wake_ms },
            hangar_runtime::EventKind::Lease { change, id, owner } => {
                Self::Lease { change: change.into(), id, owner }
            }
            hangar_runtime::EventKind::IdleUnload { idle_seconds } => {
                Self::IdleUnload { idle_seconds }
            }
            hangar_runtime::EventKind::WeightsUpdated { model_path, weight_version } => {
                Self::WeightsUpdated { model_path, weight_version }
            }
            hangar_runtime::EventKind::Quarantined { quarantine } => {
                Self::Quarantined { quarantine: quarantine.into() }
            }
            hangar_runtime::EventKind::QuarantineLifted => Self::QuarantineLifted,
            hangar_runtime::EventKind::Definition { change } => Self::Definition {
                change: match change {
                    hangar_runtime::DefinitionChange::Added => DefinitionChange::Added,
                    hangar_runtime::DefinitionChange::Removed => DefinitionChange::Removed,
                    hangar_runtime::DefinitionChange::Changed => DefinitionChange::Changed,
                    hangar_runtime::DefinitionChange::Pending => DefinitionChange::Pending,
                },
            },
        }
    }
}

impl From<hangar_runtime::LeaseChange> for LeaseChange {
    fn from(v: hangar_runtime::LeaseChange) -> Self {
        match v {
            hangar_runtime::LeaseChange::Acquired => Self::Acquired,
            hangar_runtime::LeaseChange::Renewed => Self::Renewed,
            hangar_runtime::LeaseChange::Released => Self::Released,
            hangar_runtime::LeaseChange::Expired => Self::Expired,
            hangar_runtime::LeaseChange::Revoked => Self::Revoked,
        }
    }
}

impl From<hangar_runtime::ManagerCounters> for ManagerCounters {
    fn from(v: hangar_runtime::ManagerCounters) -> Self {
        Self {
            loads: v.loads,
            load_failures: v.load_failures,
            unloads: v.unloads,
            evictions: v.evictions,
            crashes: v.crashes,
        }
    }
}
