//! [`ModelRow`]: the admin API's model row, the server's wire type built from the runtime's
//! [`ModelSnapshot`], and [`StaticRows`], which encodes each model's static parts once.
//!
//! A row is the model's live fields plus four static parts: its configured `definition`,
//! its backend's `load_constraints` and `load_recommendations`. Those change only with the
//! config, so they are serialized to JSON once, when the service is built, and every row
//! shares them: listing 10,000 models copies bytes instead of re-encoding the definitions.

use std::collections::HashMap;
use std::sync::Arc;

use hangar_backend::{
    Capabilities, LoadConstraints, LoadRecommendations, load_constraints, load_recommendations,
};
use hangar_config::{BackendKind, ModelConfig, ModelType};
use hangar_lifecycle::ModelState;
use hangar_runtime::{ModelSnapshot, VramEstimateSource};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::value::{RawValue, to_raw_value};
use serde_json::{Map, Value};

/// Everything the admin API says about one configured model: its configured definition and
/// its live runtime state, kept apart. The main UI source of truth.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ModelRow {
    /// The model's name.
    pub name: String,
    /// The backend that runs it.
    pub resolved_backend: BackendKind,
    /// What it serves.
    #[serde(rename = "type")]
    pub model_type: ModelType,
    /// Devices it occupies (`cpu`, `gpu`, `npu`).
    pub device: Vec<String>,
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
    #[schemars(with = "LoadConstraints")]
    pub load_constraints: Arc<RawValue>,
    /// Recommended presets for UI defaults.
    #[schemars(with = "LoadRecommendations")]
    pub load_recommendations: Arc<RawValue>,
    /// The runtime-only override of the current (or last) load; `{}` when none.
    pub load_override: Map<String, Value>,
    /// What the model supports.
    pub capabilities: Arc<Capabilities>,
    /// Configured definition: common fields plus only the backend's fields.
    #[schemars(with = "Map<String, Value>")]
    pub definition: Arc<RawValue>,
}

/// One model's encoded static parts.
#[derive(Debug, Clone)]
struct StaticParts {
    definition: Arc<RawValue>,
    constraints: Arc<RawValue>,
    recommendations: Arc<RawValue>,
}

/// Every configured model's static row parts, encoded once.
#[derive(Debug, Default)]
pub(crate) struct StaticRows {
    models: HashMap<String, StaticParts>,
}

impl StaticRows {
    /// Encodes the static parts of every model in `snapshots`.
    pub(crate) fn new(snapshots: &[ModelSnapshot]) -> Self {
        let mut per_backend: HashMap<BackendKind, (Arc<RawValue>, Arc<RawValue>)> = HashMap::new();
        let models = snapshots
            .iter()
            .map(|s| {
                let (constraints, recommendations) = per_backend
                    .entry(s.resolved_backend)
                    .or_insert_with(|| backend_parts(s.resolved_backend))
                    .clone();
                let parts =
                    StaticParts { definition: definition(&s.config), constraints, recommendations };
                (s.name().to_owned(), parts)
            })
            .collect();
        Self { models }
    }

    /// The row of `snapshot`, with its static parts from this cache (or encoded now for a
    /// model the cache does not know).
    pub(crate) fn row(&self, snapshot: &ModelSnapshot) -> ModelRow {
        match self.models.get(snapshot.name()) {
            Some(parts) => ModelRow::with(snapshot, parts.clone()),
            None => ModelRow::of(snapshot),
        }
    }
}

fn backend_parts(kind: BackendKind) -> (Arc<RawValue>, Arc<RawValue>) {
    (raw(&load_constraints(kind)), raw(&load_recommendations(kind)))
}

fn definition(config: &ModelConfig) -> Arc<RawValue> {
    raw(&config.definition())
}

fn raw<T: Serialize>(value: &T) -> Arc<RawValue> {
    // Maps of strings and numbers always encode; an empty object stands in otherwise.
    let encoded = to_raw_value(value).or_else(|_| to_raw_value(&Map::new()));
    encoded.map(Arc::from).unwrap_or_else(|_| Arc::from(Box::<RawValue>::default()))
}

impl ModelRow {
    /// The row of `snapshot`, encoding its static parts now.
    pub fn of(snapshot: &ModelSnapshot) -> Self {
        let (constraints, recommendations) = backend_parts(snapshot.resolved_backend);
        let parts =
            StaticParts { definition: definition(&snapshot.config), constraints, recommendations };
        Self::with(snapshot, parts)
    }

    fn with(s: &ModelSnapshot, parts: StaticParts) -> Self {
        Self {
            name: s.name().to_owned(),
            resolved_backend: s.resolved_backend,
            model_type: s.model_type,
            device: s.device.names().map(str::to_owned).collect(),
            configured_enabled: s.configured_enabled,
            runtime_state: s.runtime_state,
            is_loaded: s.is_loaded,
            replicas: s.replicas,
            replica_max: s.replica_max,
            loaded_replicas: s.loaded_replicas,
            inflight_requests: s.inflight_requests,
            queue_depth: s.queue_depth,
            runtime_inflight: s.runtime_inflight,
            configured_target_inflight: s.configured_target_inflight,
            effective_target_inflight: s.effective_target_inflight,
            last_error: s.last_error.clone(),
            load_progress: s.load_progress,
            last_use_unix_ms: s.last_use_unix_ms,
            vram_estimate_mib: s.vram_estimate_mib,
            vram_estimate_replica_count: s.vram_estimate_replica_count,
            vram_estimate_source: s.vram_estimate_source,
            load_constraints: parts.constraints,
            load_recommendations: parts.recommendations,
            load_override: s.load_override.fields().clone(),
            capabilities: Arc::clone(&s.capabilities),
            definition: parts.definition,
        }
    }

    /// The definition as a JSON object.
    pub fn definition(&self) -> Map<String, Value> {
        serde_json::from_str(self.definition.get()).unwrap_or_default()
    }
}
