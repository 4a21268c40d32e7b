//! [`ModelRow`]: the admin API's model row, the server's wire type built from the runtime's
//! [`ModelSnapshot`], and [`StaticRows`], which encodes each model's static fields once.
//!
//! A row's fields come in two groups, static first: what changes only with the config
//! (name, backend, type, device, `configured_*`, `replica_max`, `load_constraints`,
//! `load_recommendations`, `definition`), then the live state. [`StaticRows`] encodes each
//! model's static group when the service is built (each part once: a backend's constraints
//! and recommendations are shared by its models); a listing then writes those parts and
//! encodes only the live fields, so listing 10,000 models copies their definitions instead
//! of re-encoding them. A test holds the fast path byte-equal to serde's encoding of
//! [`ModelRow`].

use std::sync::Arc;

use hangar_config::{BackendKind, Device, ModelType};
use hangar_runtime::ModelSnapshot;
use hangar_runtime::engine::{
    LoadConstraints, LoadRecommendations, load_constraints, load_recommendations,
};

use crate::wire::{
    Capabilities, Failure, HostMemory, Lease, ModelState, PauseInfo, Placement, QuarantineInfo,
    Residency, VramDetail, VramEstimateSource,
};
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
    #[schemars(with = "Vec<String>")]
    pub device: Device,
    /// `enabled` as the merged config says.
    pub configured_enabled: bool,
    /// Most replicas a load may ask for.
    pub replica_max: u32,
    /// Per-replica in-flight target from config.
    pub configured_target_inflight: u32,
    /// Backend-specific fields a load request may override, with their value rules.
    #[schemars(with = "LoadConstraints")]
    pub load_constraints: Arc<RawValue>,
    /// Recommended presets for UI defaults.
    #[schemars(with = "LoadRecommendations")]
    pub load_recommendations: Arc<RawValue>,
    /// Configured definition: common fields plus only the backend's fields.
    #[schemars(with = "Map<String, Value>")]
    pub definition: Arc<RawValue>,
    /// The live state.
    pub runtime_state: ModelState,
    /// `runtime_state == loaded`.
    pub is_loaded: bool,
    /// The effective replica count: this load's choice while loading or loaded, else the
    /// configured default.
    pub replicas: u32,
    /// Replicas currently loaded.
    pub loaded_replicas: u32,
    /// Requests admitted and not finished: running plus queued.
    pub inflight_requests: u32,
    /// Requests waiting in the model's queue.
    pub queue_depth: u32,
    /// Requests running on the model's replicas.
    pub runtime_inflight: u32,
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
    /// Hangar's addition for a GPU model: the figure admission under `vram_budget` uses
    /// (`admission_mib`, `admission_method`: `process_tree`, `observed_load_delta`,
    /// `gguf_estimate` or `model_artifact_size`), a subprocess engine's measured
    /// process-tree memory and a GGUF model's weights-plus-KV-cache estimate; `null` for a
    /// model not on a GPU or with no figure.
    pub vram_detail: Option<VramDetail>,
    /// Hangar's addition: the GPUs the loaded runtimes were placed on (`gpus`, NVML indices)
    /// and who chose them (`source`: `configured`, `chosen` or `override`); `null` when not
    /// loaded or
    /// when no placement was made (no `gpus` configured and no `vram_budget` with
    /// telemetry: the engine used the GPUs it sees).
    pub placement: Option<Placement>,
    /// Hangar's addition for a model on the CPU: what it holds of the host's memory once
    /// loaded in a child process (`process_tree_rss`: its engine's processes), or would
    /// take and, in process, is counted as taking (`gguf_estimate`, `model_artifact_size`),
    /// in MiB for its replicas (`mib`, `method`): what admission under `ram_budget` counts.
    /// For a GPU model, its host part: measured once loaded in a child, estimated before
    /// from the layers `n_gpu_layers` leaves on the CPU, else `null`. `null` for remote
    /// models.
    pub host_memory: Option<HostMemory>,
    /// The runtime-only override of the current (or last) load; `{}` when none.
    pub load_override: Map<String, Value>,
    /// What the model supports.
    pub capabilities: Capabilities,
    /// What the engine made of the settings, one object per loaded replica in replica order
    /// (llama.cpp: `n_threads`, `n_threads_batch`, `threads_from`, `cores_available`,
    /// `n_seq_max`, `n_ctx`, `n_ctx_seq`, `n_batch`, `n_ctx_train`; a child process:
    /// `backend_url`, `command`, `pid`, `dispatch_ahead`); `[]` unless loaded.
    pub runtime_details: Vec<Map<String, Value>>,
    /// The pause in effect (`mode`, `cause`, `since_unix_ms`); `null` when not paused.
    pub pause: Option<PauseInfo>,
    /// Hangar's warm tier: where the loaded runtimes reside — `awake`, or `asleep` at a
    /// `level` since `since_unix_ms` (the model stays `loaded`; a request wakes it);
    /// `null` unless loaded or unloading.
    pub residency: Option<Residency>,
    /// The version label of the loaded weights that the last weight update set; `null` for
    /// the weights a load loaded.
    pub weight_version: Option<String>,
    /// The file or directory the loaded weights came from (a weight update may have
    /// changed it); `null` unless loaded.
    pub weights_path: Option<String>,
    /// `pinned` as configured: never evicted nor unloaded for idleness.
    pub pinned: bool,
    /// Live leases holding the model loaded (never evicted nor unloaded for idleness).
    pub leases: Vec<Lease>,
    /// Seconds without work before the model is unloaded; `null`: never.
    pub idle_unload_seconds: Option<u32>,
    /// Recent failed loads and crashes (`kind`, `message`, `at_unix_ms`), oldest first, at
    /// most 8.
    pub failures: Vec<Failure>,
    /// The quarantine in effect (`since_unix_ms`, `until_unix_ms`, `retry_after_s`,
    /// `failures`, `strike`); `null` when none. Requests and auto-loads are refused with
    /// 503 `model_quarantined` until it ends; an explicit load lifts it.
    pub quarantine: Option<QuarantineInfo>,
    /// For an enabled model that is not serving: why (`reason`, as `/readyz` names it) and
    /// whether the server is not ready while this lasts (`holds_readiness`); `null` when it
    /// serves or is not enabled.
    pub not_serving: Option<crate::NotServingInfo>,
    /// A changed definition from a config reload that waits for the model's next load
    /// (after an unload): the fields that differ and the whole new definition; `null` when
    /// the configured one is in effect.
    pub pending_definition: Option<PendingDefinition>,
}

/// A definition waiting for a model's next load ([`ModelRow::pending_definition`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PendingDefinition {
    /// The top-level fields whose value differs from the definition in effect, sorted.
    pub changed: Vec<String>,
    /// The new definition, as `definition` shows one.
    pub definition: Map<String, Value>,
}

impl PendingDefinition {
    fn of(s: &ModelSnapshot) -> Option<Self> {
        let pending = s.pending_definition.as_ref()?.definition();
        let current = s.config.definition();
        let mut changed: Vec<String> = pending
            .iter()
            .filter(|(k, v)| current.get(*k) != Some(v))
            .map(|(k, _)| k.clone())
            .chain(current.keys().filter(|k| !pending.contains_key(*k)).cloned())
            .collect();
        changed.sort();
        Some(Self { changed, definition: pending })
    }
}

/// The static fields of a row before `load_constraints`, in [`ModelRow`]'s order.
#[derive(Serialize)]
struct HeadFields<'a> {
    name: &'a str,
    resolved_backend: BackendKind,
    #[serde(rename = "type")]
    model_type: ModelType,
    device: Device,
    configured_enabled: bool,
    replica_max: u32,
    configured_target_inflight: u32,
}

/// One model's encoded static parts: each held once (the backend's parts shared by every
/// model of the backend).
#[derive(Debug)]
struct StaticParts {
    /// The model's configured definition (shared with the manager): which model these
    /// parts belong to.
    config: Arc<hangar_config::ModelConfig>,
    /// The fields of [`HeadFields`] as JSON, `{` included, the closing `}` left out.
    head: Box<[u8]>,
    definition: Arc<RawValue>,
    constraints: Arc<RawValue>,
    recommendations: Arc<RawValue>,
}

/// Every configured model's static row parts, encoded once, by config position.
#[derive(Debug, Default)]
pub(crate) struct StaticRows {
    models: Vec<StaticParts>,
    /// Each backend's constraints and recommendations, encoded once.
    per_backend: Vec<(BackendKind, Arc<RawValue>, Arc<RawValue>)>,
}

impl StaticRows {
    /// Encodes the static parts of every model in `snapshots` (in config order).
    #[cfg(test)]
    fn new(snapshots: &[ModelSnapshot]) -> Self {
        let mut rows = Self::default();
        rows.add(snapshots);
        rows
    }

    /// Encodes the static parts of the models of `snapshots`, the next ones in config
    /// order.
    pub(crate) fn add(&mut self, snapshots: &[ModelSnapshot]) {
        for s in snapshots {
            let kind = s.resolved_backend;
            let (constraints, recommendations) =
                match self.per_backend.iter().find(|(k, ..)| *k == kind) {
                    Some((_, c, r)) => (Arc::clone(c), Arc::clone(r)),
                    None => {
                        let (c, r) = backend_parts(kind);
                        self.per_backend.push((kind, Arc::clone(&c), Arc::clone(&r)));
                        (c, r)
                    }
                };
            self.models.push(StaticParts::new(s, constraints, recommendations));
        }
    }

    fn parts(&self, snapshot: &ModelSnapshot) -> Option<&StaticParts> {
        self.models.get(snapshot.position).filter(|p| Arc::ptr_eq(&p.config, &snapshot.config))
    }

    /// The row of `snapshot`.
    pub(crate) fn row(&self, snapshot: &ModelSnapshot) -> ModelRow {
        match self.parts(snapshot) {
            Some(parts) => ModelRow::with(snapshot, parts),
            None => ModelRow::of(snapshot),
        }
    }

    /// Appends the rows of `snapshots` to `out`, comma-separated, a comma first unless
    /// `first`: each row is its cached static parts and its live fields.
    pub(crate) fn write_rows(&self, out: &mut Vec<u8>, snapshots: &[ModelSnapshot], first: bool) {
        for (i, snapshot) in snapshots.iter().enumerate() {
            if i > 0 || !first {
                out.push(b',');
            }
            match self.parts(snapshot) {
                Some(parts) => write_row(out, parts, snapshot),
                None => {
                    let row = ModelRow::of(snapshot);
                    // A row of plain values always encodes.
                    let _ = serde_json::to_writer(&mut *out, &row);
                }
            }
        }
    }

    /// `{"models": [rows…]}` for `snapshots`, encoded.
    #[cfg(test)]
    fn list(&self, snapshots: &[ModelSnapshot]) -> Vec<u8> {
        let mut out = b"{\"models\":[".to_vec();
        self.write_rows(&mut out, snapshots, true);
        out.extend_from_slice(b"]}");
        out
    }
}

impl StaticParts {
    /// Encodes the snapshot's definition and static fields, with its backend's parts.
    fn new(s: &ModelSnapshot, constraints: Arc<RawValue>, recommendations: Arc<RawValue>) -> Self {
        let definition = raw(&s.config.definition());
        let fields = HeadFields {
            name: s.name(),
            resolved_backend: s.resolved_backend,
            model_type: s.model_type,
            device: s.device,
            configured_enabled: s.configured_enabled,
            replica_max: s.replica_max,
            configured_target_inflight: s.configured_target_inflight,
        };
        let mut head = serde_json::to_vec(&fields).unwrap_or_else(|_| b"{}".to_vec());
        head.pop();
        let config = Arc::clone(&s.config);
        Self { config, head: head.into(), definition, constraints, recommendations }
    }
}

/// Appends one row: the static prefix, then the live fields. The live fields are written
/// key by key (constant keys, `serde_json` for values): listing thousands of rows spends
/// most of its time here, and escaping constant keys is wasted work. The test below holds
/// this byte-equal to serde's encoding of [`ModelRow`] (field order included).
fn write_row(out: &mut Vec<u8>, parts: &StaticParts, s: &ModelSnapshot) {
    fn value<T: Serialize + ?Sized>(out: &mut Vec<u8>, key: &[u8], value: &T) {
        out.extend_from_slice(key);
        // Numbers, strings and maps of JSON values always encode.
        let _ = serde_json::to_writer(&mut *out, value);
    }
    fn name(out: &mut Vec<u8>, key: &[u8], name: &'static str) {
        out.extend_from_slice(key);
        out.push(b'"');
        out.extend_from_slice(name.as_bytes());
        out.push(b'"');
    }
    out.extend_from_slice(&parts.head);
    out.extend_from_slice(b",\"load_constraints\":");
    out.extend_from_slice(parts.constraints.get().as_bytes());
    out.extend_from_slice(b",\"load_recommendations\":");
    out.extend_from_slice(parts.recommendations.get().as_bytes());
    out.extend_from_slice(b",\"definition\":");
    out.extend_from_slice(parts.definition.get().as_bytes());
    let live = Live::of(s);
    name(out, b",\"runtime_state\":", live.runtime_state.into());
    out.extend_from_slice(if s.is_loaded {
        b",\"is_loaded\":true"
    } else {
        b",\"is_loaded\":false"
    });
    value(out, b",\"replicas\":", &s.replicas);
    value(out, b",\"loaded_replicas\":", &s.loaded_replicas);
    value(out, b",\"inflight_requests\":", &s.inflight_requests);
    value(out, b",\"queue_depth\":", &s.queue_depth);
    value(out, b",\"runtime_inflight\":", &s.runtime_inflight);
    value(out, b",\"effective_target_inflight\":", &s.effective_target_inflight);
    value(out, b",\"last_error\":", &s.last_error);
    value(out, b",\"load_progress\":", &s.load_progress);
    value(out, b",\"last_use_unix_ms\":", &s.last_use_unix_ms);
    value(out, b",\"vram_estimate_mib\":", &s.vram_estimate_mib);
    value(out, b",\"vram_estimate_replica_count\":", &s.vram_estimate_replica_count);
    name(out, b",\"vram_estimate_source\":", live.vram_estimate_source.into());
    value(out, b",\"vram_detail\":", &live.vram_detail);
    value(out, b",\"placement\":", &live.placement);
    value(out, b",\"host_memory\":", &live.host_memory);
    value(out, b",\"load_override\":", s.load_override.fields());
    value(out, b",\"capabilities\":", &live.capabilities);
    value(out, b",\"runtime_details\":", &*s.runtime_details);
    value(out, b",\"pause\":", &live.pause);
    value(out, b",\"residency\":", &live.residency);
    value(out, b",\"weight_version\":", &s.weight_version);
    value(out, b",\"weights_path\":", &s.weights_path);
    out.extend_from_slice(if s.pinned { b",\"pinned\":true" } else { b",\"pinned\":false" });
    value(out, b",\"leases\":", &live.leases);
    value(out, b",\"idle_unload_seconds\":", &s.idle_unload_seconds);
    value(out, b",\"failures\":", &live.failures);
    value(out, b",\"quarantine\":", &live.quarantine);
    value(out, b",\"not_serving\":", &live.not_serving);
    value(out, b",\"pending_definition\":", &PendingDefinition::of(s));
    out.push(b'}');
}

/// A snapshot's live fields that are runtime types, converted to their wire twins once: for
/// a [`ModelRow`] and for the list's fast path alike.
struct Live {
    runtime_state: ModelState,
    vram_estimate_source: VramEstimateSource,
    vram_detail: Option<VramDetail>,
    placement: Option<Placement>,
    host_memory: Option<HostMemory>,
    capabilities: Capabilities,
    pause: Option<PauseInfo>,
    residency: Option<Residency>,
    leases: Vec<Lease>,
    failures: Vec<Failure>,
    quarantine: Option<QuarantineInfo>,
    not_serving: Option<crate::NotServingInfo>,
}

impl Live {
    fn of(s: &ModelSnapshot) -> Self {
        Self {
            runtime_state: s.runtime_state.into(),
            vram_estimate_source: s.vram_estimate_source.into(),
            vram_detail: s.vram_detail.clone().map(Into::into),
            placement: s.placement.clone().map(Into::into),
            host_memory: s.host_memory.map(Into::into),
            capabilities: (*s.capabilities).clone().into(),
            pause: s.pause.map(Into::into),
            residency: s.residency.map(Into::into),
            leases: s.leases.iter().cloned().map(Into::into).collect(),
            failures: s.failures.iter().cloned().map(Into::into).collect(),
            quarantine: s.quarantine.map(Into::into),
            not_serving: s.not_serving.map(Into::into),
        }
    }
}

fn backend_parts(kind: BackendKind) -> (Arc<RawValue>, Arc<RawValue>) {
    (raw(&load_constraints(kind)), raw(&load_recommendations(kind)))
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
        Self::with(snapshot, &StaticParts::new(snapshot, constraints, recommendations))
    }

    fn with(s: &ModelSnapshot, parts: &StaticParts) -> Self {
        let live = Live::of(s);
        Self {
            name: s.name().to_owned(),
            resolved_backend: s.resolved_backend,
            model_type: s.model_type,
            device: s.device,
            configured_enabled: s.configured_enabled,
            replica_max: s.replica_max,
            configured_target_inflight: s.configured_target_inflight,
            load_constraints: Arc::clone(&parts.constraints),
            load_recommendations: Arc::clone(&parts.recommendations),
            definition: Arc::clone(&parts.definition),
            runtime_state: live.runtime_state,
            is_loaded: s.is_loaded,
            replicas: s.replicas,
            loaded_replicas: s.loaded_replicas,
            inflight_requests: s.inflight_requests,
            queue_depth: s.queue_depth,
            runtime_inflight: s.runtime_inflight,
            effective_target_inflight: s.effective_target_inflight,
            last_error: s.last_error.clone(),
            load_progress: s.load_progress,
            last_use_unix_ms: s.last_use_unix_ms,
            vram_estimate_mib: s.vram_estimate_mib,
            vram_estimate_replica_count: s.vram_estimate_replica_count,
            vram_estimate_source: live.vram_estimate_source,
            vram_detail: live.vram_detail,
            placement: live.placement,
            host_memory: live.host_memory,
            load_override: s.load_override.fields().clone(),
            capabilities: live.capabilities,
            runtime_details: s.runtime_details.to_vec(),
            pause: live.pause,
            residency: live.residency,
            weight_version: s.weight_version.clone(),
            weights_path: s.weights_path.clone(),
            pinned: s.pinned,
            leases: live.leases,
            idle_unload_seconds: s.idle_unload_seconds,
            failures: live.failures,
            quarantine: live.quarantine,
            not_serving: live.not_serving,
            pending_definition: PendingDefinition::of(s),
        }
    }

    /// The definition as a JSON object.
    pub fn definition(&self) -> Map<String, Value> {
        serde_json::from_str(self.definition.get()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hangar_runtime::{Backends, LoadOptions, Manager};
    use serde_json::json;

    #[tokio::test]
    async fn the_list_encodes_each_row_exactly_as_serde_encodes_model_row() {
        let config = hangar_config::Config::from_value(&json!({
            "models": {
                "chat": { "backend": "stub", "replica_max": 2 },
                "bro\"ken": { "backend": "stub", "stub": { "fail_load": "out of \"memory\"" } },
                "g": { "backend": "llama_cpp", "model_path": "/m/x.gguf", "labels": ["embedding"] },
            }
        }))
        .unwrap();
        let stub = Arc::new(hangar_stub::StubBackend::new());
        let llama = Arc::new(hangar_stub::StubBackend::with_kind(BackendKind::LlamaCpp));
        let manager = Manager::new(&config, Backends::new().with(stub).with(llama));
        let rows = StaticRows::new(&manager.models());
        manager.load("chat", LoadOptions::default()).await.unwrap();
        assert!(manager.load("bro\"ken", LoadOptions::default()).await.is_err());
        let overrides = json!({ "gguf_n_ctx": 1024, "gguf_type_k": null });
        let Value::Object(overrides) = overrides else { unreachable!() };
        let options = LoadOptions { overrides, ..LoadOptions::default() };
        manager.load("g", options).await.unwrap();

        let snapshots = manager.models();
        let listed: Value = serde_json::from_slice(&rows.list(&snapshots)).unwrap();
        let mut expected = Vec::new();
        for s in &snapshots {
            let fast = {
                let mut out = Vec::new();
                write_row(&mut out, rows.parts(s).expect("cached"), s);
                out
            };
            let canonical = serde_json::to_vec(&rows.row(s)).unwrap();
            assert_eq!(String::from_utf8_lossy(&fast), String::from_utf8_lossy(&canonical));
            assert_eq!(serde_json::to_vec(&ModelRow::of(s)).unwrap(), canonical);
            expected.push(serde_json::to_value(rows.row(s)).unwrap());
        }
        assert_eq!(listed, json!({ "models": expected }));
        // A snapshot the cache does not know is encoded in full.
        let other = StaticRows::default();
        let listed: Value = serde_json::from_slice(&other.list(&snapshots)).unwrap();
        assert_eq!(listed, json!({ "models": expected }));
    }
}
