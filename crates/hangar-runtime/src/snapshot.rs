//! [`ModelSnapshot`]: one row of `GET /v1/admin/models`, as a plain value.

use hangar_backend::{Capabilities, LoadConstraints, LoadOverride, LoadRecommendations};
use hangar_config::{BackendKind, Device, ModelType};
use hangar_lifecycle::ModelState;
use schemars::JsonSchema;
use serde::Serialize;
use serde_json::{Map, Value};

/// Where a VRAM estimate comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum VramEstimateSource {
    /// Measured as the GPU memory delta across the load.
    ObservedLoadDelta,
    /// Derived from the size of the model's files.
    ModelArtifactSize,
    /// No estimate could be made (no local artifact).
    Unavailable,
}

/// Everything the admin API says about one configured model: its configured definition and
/// its live runtime state, kept apart.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct ModelSnapshot {
    /// The model's name.
    pub name: String,
    /// The backend that runs it.
    pub resolved_backend: BackendKind,
    /// What it serves.
    #[serde(rename = "type")]
    pub model_type: ModelType,
    /// Devices it occupies.
    #[schemars(with = "Vec<String>")]
    pub device: Device,
    /// `enabled` as the merged config says.
    pub configured_enabled: bool,
    /// The live state.
    pub runtime_state: ModelState,
    /// `runtime_state == loaded`.
    pub is_loaded: bool,
    /// The effective replica count: this load's choice while loading or loaded, else the
    /// configured default.
    pub replicas: u32,
    /// Most replicas a load may ask for.
    pub replica_max: u32,
    /// Replicas currently loaded.
    pub loaded_replicas: u32,
    /// Requests admitted and not finished: running plus queued.
    pub inflight_requests: u32,
    /// Requests waiting in the model's queue.
    pub queue_depth: u32,
    /// Requests running on the model's replicas.
    pub runtime_inflight: u32,
    /// Per-replica in-flight target from config.
    pub configured_target_inflight: u32,
    /// Per-replica in-flight target in effect after clamping by the backend's capability.
    pub effective_target_inflight: u32,
    /// Why the last load failed or the runtime crashed.
    pub last_error: Option<String>,
    /// Load progress in `[0, 1]` while loading.
    pub load_progress: Option<f32>,
    /// Last access (load start/complete, request start/complete), Unix milliseconds.
    pub last_use_unix_ms: Option<u64>,
    /// Approximate VRAM for `vram_estimate_replica_count` replicas, in MiB.
    pub vram_estimate_mib: Option<u64>,
    /// The replica count the estimate is for.
    pub vram_estimate_replica_count: u32,
    /// Where the estimate comes from.
    pub vram_estimate_source: VramEstimateSource,
    /// Backend-specific fields a load request may override, with their value rules.
    pub load_constraints: LoadConstraints,
    /// Recommended presets for UI defaults.
    pub load_recommendations: LoadRecommendations,
    /// The runtime-only override of the current (or last) load; `{}` when none.
    #[schemars(with = "Map<String, Value>")]
    pub load_override: LoadOverride,
    /// What the model supports.
    pub capabilities: Capabilities,
    /// Configured definition: common fields plus only the backend's fields.
    #[schemars(with = "Map<String, Value>")]
    pub definition: Map<String, Value>,
}
