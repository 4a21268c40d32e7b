//! GPU telemetry as the manager serves it: the host's probe ([`Manager::set_gpu_probe`]) read
//! off the async threads, next to every model's VRAM estimate.

use std::collections::BTreeMap;
use std::sync::{Arc, PoisonError};

use hangar_backend::LoadOverride;
use hangar_config::Device;

use hangar_gpu::{GpuProbe, GpuReading, Unavailable};

use crate::entry::ModelEntry;
use crate::manager::Manager;
use crate::snapshot::ModelSnapshot;

/// What `GET /v1/admin/gpu-memory` shows: the GPUs (or why there are none) and every model.
#[derive(Debug, Clone)]
pub struct GpuMemory {
    /// Every GPU's memory now, or why it cannot be read.
    pub gpus: Result<Vec<GpuReading>, Unavailable>,
    /// Every configured model, in config order.
    pub models: Vec<ModelSnapshot>,
}

impl Manager {
    /// Replaces the GPU probe (the host's NVML probe; a scripted one in tests). Until it is
    /// set, GPU telemetry is unavailable.
    pub fn set_gpu_probe(&self, probe: Arc<dyn GpuProbe>) {
        *self.inner.gpu.write().unwrap_or_else(PoisonError::into_inner) = probe;
    }

    /// The GPUs' memory now, read on this thread (NVML calls block briefly; async callers
    /// use [`Manager::gpu_memory`]).
    ///
    /// # Errors
    /// [`Unavailable`] with the probe's reason.
    pub fn gpu_readings(&self) -> Result<Vec<GpuReading>, Unavailable> {
        let probe = Arc::clone(&self.inner.gpu.read().unwrap_or_else(PoisonError::into_inner));
        probe.read()
    }

    /// The GPUs' memory now (read on a blocking thread: NVML calls block) and every model.
    pub async fn gpu_memory(&self) -> GpuMemory {
        let probe = Arc::clone(&self.inner.gpu.read().unwrap_or_else(PoisonError::into_inner));
        let gpus = tokio::task::spawn_blocking(move || probe.read())
            .await
            .unwrap_or_else(|e| Err(Unavailable { reason: format!("the GPU probe failed: {e}") }));
        GpuMemory { gpus, models: self.models() }
    }
}

/// GPU memory a model's loads took, in MiB, by the replica count and the load override of the
/// load (loads are serialized, so the difference of the GPUs' used memory across one is that
/// load's; an override such as a larger context changes what a load takes).
#[derive(Debug, Clone, Default)]
pub(crate) struct ObservedVram {
    /// (replicas, the override as JSON) → MiB.
    figures: BTreeMap<(u32, String), u64>,
    /// The replica count measured last, per override.
    last: BTreeMap<String, u32>,
}

impl ObservedVram {
    /// The figure for `replicas` under `load_override`, else the last one measured under the
    /// same override: `(MiB, replica count)`. Figures of other overrides are not used.
    pub(crate) fn estimate(
        &self,
        replicas: u32,
        load_override: &LoadOverride,
    ) -> Option<(u64, u32)> {
        let key = fingerprint(load_override);
        let replicas = if self.figures.contains_key(&(replicas, key.clone())) {
            replicas
        } else {
            *self.last.get(&key)?
        };
        self.figures.get(&(replicas, key)).map(|mib| (*mib, replicas))
    }

    fn record(&mut self, replicas: u32, load_override: &LoadOverride, mib: u64) {
        let key = fingerprint(load_override);
        self.figures.insert((replicas, key.clone()), mib);
        self.last.insert(key, replicas);
    }
}

fn fingerprint(load_override: &LoadOverride) -> String {
    serde_json::to_string(load_override).unwrap_or_default()
}

impl Manager {
    /// The GPUs' used memory in all, in MiB, when `entry`'s model is on a GPU and the probe
    /// can read it: the "before" of a load.
    pub(crate) async fn gpu_used_before_load(&self, entry: &ModelEntry) -> Option<u64> {
        if !entry.config.device.contains(Device::GPU) {
            return None;
        }
        let probe = Arc::clone(&self.inner.gpu.read().unwrap_or_else(PoisonError::into_inner));
        let gpus = tokio::task::spawn_blocking(move || probe.read()).await.ok()?.ok()?;
        Some(gpus.iter().map(|g| g.used_mib).sum())
    }

    /// Records what a successful load of `replicas` replicas took: the GPUs' used memory now
    /// minus `before`.
    pub(crate) async fn record_load_delta(
        &self,
        entry: &ModelEntry,
        before: Option<u64>,
        replicas: u32,
    ) {
        let Some(before) = before else { return };
        let Some(after) = self.gpu_used_before_load(entry).await else { return };
        let mib = after.saturating_sub(before);
        let mut slot = entry.lock();
        let load_override = slot.load_override.clone();
        slot.vram.record(replicas, &load_override, mib);
        tracing::debug!(model = %entry.config.name, replicas, mib, "GPU memory taken by the load");
    }
}
