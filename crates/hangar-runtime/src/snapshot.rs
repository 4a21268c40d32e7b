//! [`ModelSnapshot`]: one model's configured definition and live state, as a plain value,
//! and [`ModelFilter`] to list some of them.

use std::num::NonZeroU32;
use std::sync::Arc;

use hangar_backend::{Capabilities, RuntimeDetails};
use hangar_config::LoadOverride;
use hangar_config::{BackendKind, Device, ModelConfig, ModelType};
use hangar_lifecycle::{ModelState, Scheduler, effective_target};
use serde::{Deserialize, Serialize};

use crate::entry::{ModelEntry, Slot};
use crate::journal::unix_ms;
use crate::pause::PauseInfo;
use crate::phase::Phase;
use crate::vram::{GpuShare, VramMethod};

/// Where a VRAM estimate comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, strum::IntoStaticStr)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum VramEstimateSource {
    /// Measured as the GPU memory delta across the load.
    ObservedLoadDelta,
    /// Derived from the size of the model's files.
    ModelArtifactSize,
    /// No estimate could be made (no local artifact).
    Unavailable,
}

/// Everything the admin API says about one configured model: its configured definition
/// (shared, never copied) and its live runtime state, kept apart.
///
/// Taking a snapshot reads the live fields under the model's lock and shares the config:
/// it costs the same for a model with a large definition as for a small one.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelSnapshot {
    /// The configured definition (merged config, before any load override).
    pub config: Arc<ModelConfig>,
    /// The model's position in config order (0-based): a stable index for caches.
    pub position: usize,
    /// The backend that runs it.
    pub resolved_backend: BackendKind,
    /// What it serves.
    pub model_type: ModelType,
    /// Devices it occupies.
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
    /// For a GPU model: the figure admission uses, a subprocess engine's measured
    /// process-tree memory and a GGUF model's weights-plus-KV-cache estimate; `None` for a
    /// model not on a GPU or with no figure at all.
    pub vram_detail: Option<crate::vram::VramDetail>,
    /// The GPUs the runtimes in service were placed on; `None` without a placement.
    pub placement: Option<crate::place::Placement>,
    /// What the model holds (once loaded and measured) or would take of the host's memory,
    /// and how that was obtained: all of it for a model on the CPU, the host part of a GPU
    /// model (`None` until measured when its files do not tell); `None` for remote models.
    pub host_memory: Option<crate::host::HostFigure>,
    /// Where the runtimes in service reside (awake, or asleep at a level); `None` unless
    /// the model is loaded or unloading.
    pub residency: Option<crate::sleep_policy::Residency>,
    /// The runtime-only override of the current (or last) load; empty when none.
    pub load_override: LoadOverride,
    /// What the model supports (from the loaded runtime once loaded, else from config).
    pub capabilities: Arc<Capabilities>,
    /// What the engine made of the settings, per loaded replica in replica order (threads,
    /// context, parallel sequences for llama.cpp); empty unless loaded or unloading.
    pub runtime_details: Arc<[RuntimeDetails]>,
    /// The pause in effect, if any.
    pub pause: Option<PauseInfo>,
    /// The version label of the loaded weights: what the last weight update set, `None`
    /// for the weights a load loaded.
    pub weight_version: Option<String>,
    /// The file or directory the loaded weights came from (a weight update may have
    /// changed it); `None` unless loaded or unloading.
    pub weights_path: Option<String>,
    /// `pinned` as configured: never evicted nor unloaded for idleness.
    pub pinned: bool,
    /// Whether a model repository folder defines the model (not the config).
    pub from_repository: bool,
    /// Live leases holding the model loaded.
    pub leases: Vec<crate::lease::Lease>,
    /// Seconds without work before the model is unloaded (its own or the global setting);
    /// `None`: never.
    pub idle_unload_seconds: Option<u32>,
    /// Recent failed loads and crashes, oldest first (at most
    /// [`RECENT_FAILURES`](crate::RECENT_FAILURES)).
    pub failures: Vec<crate::Failure>,
    /// The quarantine in effect, if any.
    pub quarantine: Option<crate::QuarantineInfo>,
    /// For an enabled model that is not serving: why, and whether it holds readiness back.
    pub not_serving: Option<crate::NotServingInfo>,
    /// A changed definition from a config reload that waits for the model's next load
    /// (after an unload); `None` when the configured one is in effect.
    pub pending_definition: Option<Arc<ModelConfig>>,
}

impl ModelSnapshot {
    /// The model's name.
    pub fn name(&self) -> &str {
        self.config.name.as_str()
    }
}

/// A model's name, live state and last error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelStatus {
    /// The model.
    pub name: hangar_config::ModelName,
    /// Its live state.
    pub state: ModelState,
    /// Why its last load failed or its runtime crashed.
    pub last_error: Option<String>,
}

/// Which models a listing returns; `None` fields match everything.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ModelFilter {
    /// Only models in this runtime state.
    pub state: Option<ModelState>,
    /// Only models of this type.
    pub model_type: Option<ModelType>,
}

impl ModelFilter {
    /// Whether a model of `model_type` in `state` passes.
    pub fn matches(&self, state: ModelState, model_type: ModelType) -> bool {
        self.state.is_none_or(|s| s == state) && self.model_type.is_none_or(|t| t == model_type)
    }
}

/// The snapshot of `entry`, whose slot the caller holds locked.
pub(crate) fn snapshot_of(entry: &ModelEntry, slot: &Slot) -> ModelSnapshot {
    let position = entry.position;
    let config = &entry.config;
    let state = slot.lifecycle.state();
    let quarantine = slot.failures.active();
    let stats = slot.phase.scheduler().map(Scheduler::stats);
    let (runtime_inflight, queue_depth) =
        stats.as_ref().map_or((0, 0), |s| (s.runtime_inflight, s.queue_depth as u32));
    let effective_target = stats.as_ref().map_or_else(
        || effective_target(config.target_inflight, slot.capabilities.max_parallel_sequences).get(),
        |s| s.effective_target,
    );
    let replicas = match state {
        ModelState::Loading | ModelState::Loaded | ModelState::Unloading => slot.replicas.get(),
        ModelState::Unloaded | ModelState::Failed => config.replicas.get(),
    };
    let serving = slot.phase.serving();
    let loaded_replicas = slot.phase.loaded_replicas();
    // Measured beats derived: a load's GPU delta, else the files' size per replica.
    let delta = slot.vram.get(VramMethod::ObservedLoadDelta, replicas, &slot.load_override);
    let vram = match delta {
        Some(f) => (Some(f.mib), f.replicas, VramEstimateSource::ObservedLoadDelta),
        None => match entry.artifacts.mib {
            Some(mib) => {
                (Some(mib * u64::from(replicas)), replicas, VramEstimateSource::ModelArtifactSize)
            }
            None => (None, replicas, VramEstimateSource::Unavailable),
        },
    };
    ModelSnapshot {
        config: Arc::clone(config),
        position,
        resolved_backend: config.backend,
        model_type: config.model_type,
        device: config.device,
        configured_enabled: config.enabled,
        runtime_state: state,
        is_loaded: state == ModelState::Loaded,
        replicas,
        replica_max: config.replica_max.get(),
        loaded_replicas,
        inflight_requests: runtime_inflight + queue_depth,
        queue_depth,
        runtime_inflight,
        configured_target_inflight: config.target_inflight.get(),
        effective_target_inflight: effective_target,
        last_error: slot.lifecycle.last_error().or(entry.problem.as_deref()).map(str::to_owned),
        load_progress: match &slot.phase {
            Phase::Loading { progress, .. } => Some(*progress),
            _ => None,
        },
        last_use_unix_ms: slot.last_use.map(|(_, wall)| unix_ms(wall)),
        vram_estimate_mib: vram.0,
        vram_estimate_replica_count: vram.1,
        vram_estimate_source: vram.2,
        vram_detail: crate::vram::vram_detail(entry, slot, replicas),
        placement: slot.placement.clone().map(|mut p| {
            if state == ModelState::Loaded {
                let shares = crate::place::held_shares(entry, slot, &[]);
                p.holds = shares.into_iter().map(|(gpu, mib)| GpuShare { gpu, mib }).collect();
            }
            p
        }),
        host_memory: crate::host::local(&entry.config)
            .then(|| {
                crate::host::figure(entry, slot, &slot.effective, replicas, &slot.load_override)
            })
            .flatten(),
        residency: crate::sleep_policy::residency(entry, slot),
        load_override: slot.load_override.clone(),
        capabilities: Arc::clone(&slot.capabilities),
        runtime_details: serving.map_or_else(|| Arc::new([]) as _, |s| Arc::clone(&s.details)),
        pause: slot.phase.pause().map(|p| p.info),
        weight_version: serving.and_then(|s| s.weight_version.clone()),
        weights_path: match state {
            ModelState::Loaded | ModelState::Unloading => slot.effective.model_path.clone(),
            _ => None,
        },
        pinned: config.pinned,
        from_repository: entry.from_repository,
        leases: slot.live_leases().cloned().collect(),
        pending_definition: slot.pending.clone(),
        idle_unload_seconds: entry.idle_timeout.map(NonZeroU32::get),
        failures: slot.failures.recent(),
        quarantine,
        not_serving: crate::start_up::gap(entry, state, quarantine.is_some()),
    }
}
