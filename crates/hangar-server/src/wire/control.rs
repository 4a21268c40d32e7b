//! What an operator did to a model: pauses, leases, failures and quarantines.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What a pause does to the requests already admitted.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Default,
    Serialize,
    Deserialize,
    JsonSchema,
    strum::IntoStaticStr,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum PauseMode {
    /// Queued and running requests end with `generation_aborted`.
    #[default]
    Abort,
    /// Running generations go back to the head of the queue and resume after continue.
    Retract,
    /// Queued requests wait; running ones finish.
    InPlace,
}

/// Who paused the model.
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
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum PauseCause {
    /// `POST …/pause` (or `/pause_generation`).
    Operator,
    /// A weight update, for as long as it runs.
    WeightUpdate,
    /// A weights checksum, for as long as it reads the files.
    Checksum,
}

/// A model's pause, as the admin row shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct PauseInfo {
    /// What the pause did to admitted requests.
    pub mode: PauseMode,
    /// Who paused it.
    pub cause: PauseCause,
    /// When, Unix milliseconds.
    pub since_unix_ms: u64,
}

/// A lease on a model, as the admin row lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Lease {
    /// Its id (for renew and release).
    pub id: String,
    /// Who holds it (free text: a job, a user).
    pub owner: String,
    /// Its length; a renewal starts it again.
    pub ttl_seconds: u32,
    /// When it ends unless renewed, Unix milliseconds.
    pub expires_unix_ms: u64,
}

/// What failed.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema, strum::IntoStaticStr,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum FailureKind {
    /// A load ran and failed.
    LoadFailed,
    /// A loaded runtime crashed.
    Crashed,
}

/// One failure of a model, for its row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Failure {
    /// What failed.
    pub kind: FailureKind,
    /// Why (the `last_error` it left).
    pub message: String,
    /// When, Unix milliseconds.
    pub at_unix_ms: u64,
}

/// A quarantine in effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct QuarantineInfo {
    /// When it began, Unix milliseconds.
    pub since_unix_ms: u64,
    /// When it ends, Unix milliseconds.
    pub until_unix_ms: u64,
    /// Seconds until it ends (rounded up), when this was read.
    pub retry_after_s: u64,
    /// Failures counted within the window when it began.
    pub failures: u32,
    /// Its place in a run of quarantines without a healthy window between them: 1 for the
    /// first; it lasts `backoff_seconds × 2^(strike − 1)`, at most `max_backoff_seconds`.
    pub strike: u32,
}

impl From<hangar_runtime::PauseMode> for PauseMode {
    fn from(v: hangar_runtime::PauseMode) -> Self {
        match v {
            hangar_runtime::PauseMode::Abort => Self::Abort,
            hangar_runtime::PauseMode::Retract => Self::Retract,
            hangar_runtime::PauseMode::InPlace => Self::InPlace,
        }
    }
}

impl From<PauseMode> for hangar_runtime::PauseMode {
    fn from(v: PauseMode) -> Self {
        match v {
            PauseMode::Abort => Self::Abort,
            PauseMode::Retract => Self::Retract,
            PauseMode::InPlace => Self::InPlace,
        }
    }
}

impl From<hangar_runtime::PauseCause> for PauseCause {
    fn from(v: hangar_runtime::PauseCause) -> Self {
        match v {
            hangar_runtime::PauseCause::Operator => Self::Operator,
            hangar_runtime::PauseCause::WeightUpdate => Self::WeightUpdate,
            hangar_runtime::PauseCause::Checksum => Self::Checksum,
        }
    }
}

impl From<hangar_runtime::PauseInfo> for PauseInfo {
    fn from(v: hangar_runtime::PauseInfo) -> Self {
        Self { mode: v.mode.into(), cause: v.cause.into(), since_unix_ms: v.since_unix_ms }
    }
}

impl From<hangar_runtime::Lease> for Lease {
    fn from(v: hangar_runtime::Lease) -> Self {
        Self {
            id: v.id,
            owner: v.owner,
            ttl_seconds: v.ttl_seconds,
            expires_unix_ms: v.expires_unix_ms,
        }
    }
}

impl From<hangar_runtime::FailureKind> for FailureKind {
    fn from(v: hangar_runtime::FailureKind) -> Self {
        match v {
            hangar_runtime::FailureKind::LoadFailed => Self::LoadFailed,
            hangar_runtime::FailureKind::Crashed => Self::Crashed,
        }
    }
}

impl From<hangar_runtime::Failure> for Failure {
    fn from(v: hangar_runtime::Failure) -> Self {
        Self { kind: v.kind.into(), message: v.message, at_unix_ms: v.at_unix_ms }
    }
}

impl From<hangar_runtime::QuarantineInfo> for QuarantineInfo {
    fn from(v: hangar_runtime::QuarantineInfo) -> Self {
        Self {
            since_unix_ms: v.since_unix_ms,
            until_unix_ms: v.until_unix_ms,
            retry_after_s: v.retry_after_s,
            failures: v.failures,
            strike: v.strike,
        }
    }
}

/// How deeply a model's runtimes sleep.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SleepLevel {
    /// The context went (KV cache, compute buffers); the weights stay where they were
    /// loaded (llama.cpp in process).
    Context,
    /// vLLM's level 1: the weights moved to host memory, the KV cache discarded.
    WeightsToHost,
    /// vLLM's level 2: the weights and the KV cache discarded (reloaded from disk on wake).
    WeightsDiscarded,
}

impl From<hangar_runtime::engine::SleepLevel> for SleepLevel {
    fn from(v: hangar_runtime::engine::SleepLevel) -> Self {
        match v {
            hangar_runtime::engine::SleepLevel::Context => Self::Context,
            hangar_runtime::engine::SleepLevel::WeightsToHost => Self::WeightsToHost,
            hangar_runtime::engine::SleepLevel::WeightsDiscarded => Self::WeightsDiscarded,
        }
    }
}

/// Whether a loaded model's runtimes are awake or asleep.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ResidencyState {
    /// Serving, or ready to.
    Awake,
    /// Asleep: a request waits in the queue while the model wakes.
    Asleep,
}

/// Where a loaded model's runtimes reside, as the admin row shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Residency {
    /// Awake or asleep.
    pub state: ResidencyState,
    /// How deeply it sleeps; `null` awake.
    pub level: Option<SleepLevel>,
    /// Since when it sleeps, Unix milliseconds; `null` awake.
    pub since_unix_ms: Option<u64>,
    /// GPU memory the sleep gave back, in MiB, as the GPUs' used memory fell across it
    /// (0 without GPU telemetry); `null` awake.
    pub gpu_freed_mib: Option<u64>,
    /// GPU memory it still holds asleep, in MiB, as admission counts it (its figure less
    /// what the sleep gave back); `null` awake. What it holds on the host is the row's
    /// `host_memory`, measured again after each sleep and wake for engine children.
    pub gpu_held_mib: Option<u64>,
}

impl From<hangar_runtime::Residency> for Residency {
    fn from(v: hangar_runtime::Residency) -> Self {
        match v {
            hangar_runtime::Residency::Awake => Self {
                state: ResidencyState::Awake,
                level: None,
                since_unix_ms: None,
                gpu_freed_mib: None,
                gpu_held_mib: None,
            },
            hangar_runtime::Residency::Asleep {
                level,
                since_unix_ms,
                gpu_freed_mib,
                gpu_held_mib,
            } => Self {
                state: ResidencyState::Asleep,
                level: Some(level.into()),
                since_unix_ms: Some(since_unix_ms),
                gpu_freed_mib: Some(gpu_freed_mib),
                gpu_held_mib: Some(gpu_held_mib),
            },
        }
    }
}
