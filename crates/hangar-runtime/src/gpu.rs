//! GPU telemetry as the manager serves it: the host's probe ([`Manager::set_gpu_probe`]) read
//! off the async threads, next to every model's VRAM estimate.

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
    /// The probe in use.
    fn gpu_probe(&self) -> Arc<dyn GpuProbe> {
        Arc::clone(&self.inner.gpu.read().unwrap_or_else(PoisonError::into_inner))
    }

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
        self.gpu_probe().read()
    }

    /// The GPUs' memory now (read on a blocking thread: NVML calls block) and every model.
    pub async fn gpu_memory(&self) -> GpuMemory {
        let probe = self.gpu_probe();
        let gpus = tokio::task::spawn_blocking(move || probe.read())
            .await
            .unwrap_or_else(|e| Err(Unavailable { reason: format!("the GPU probe failed: {e}") }));
        GpuMemory { gpus, models: self.models() }
    }
}

/// GPU memory a model's loads took, in MiB, by the replica count and the load override of the
/// load (loads are serialized, so the difference of the GPUs' used memory across one is that
/// load's; an override such as a larger context changes what a load takes). Read by every
/// snapshot, so it compares values and allocates nothing.
#[derive(Debug, Clone, Default)]
pub(crate) struct ObservedVram {
    /// One figure per (replicas, override), the latest measured last.
    figures: Vec<(u32, LoadOverride, u64)>,
}

impl ObservedVram {
    /// The figure for `replicas` under `load_override`, else the last one measured under the
    /// same override: `(MiB, replica count)`. Figures of other overrides are not used.
    pub(crate) fn estimate(
        &self,
        replicas: u32,
        load_override: &LoadOverride,
    ) -> Option<(u64, u32)> {
        let same = || self.figures.iter().rev().filter(|(_, o, _)| o == load_override);
        same()
            .find(|(r, _, _)| *r == replicas)
            .or_else(|| same().next())
            .map(|(r, _, mib)| (*mib, *r))
    }

    fn record(&mut self, replicas: u32, load_override: LoadOverride, mib: u64) {
        self.figures.retain(|(r, o, _)| !(*r == replicas && *o == load_override));
        self.figures.push((replicas, load_override, mib));
    }
}

impl Manager {
    /// The GPUs' used memory in all, in MiB, when `entry`'s model is on a GPU and the probe
    /// can read it (read before and after a load).
    pub(crate) async fn gpu_used_mib(&self, entry: &ModelEntry) -> Option<u64> {
        if !entry.config.device.contains(Device::GPU) {
            return None;
        }
        let probe = self.gpu_probe();
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
        let Some(after) = self.gpu_used_mib(entry).await else { return };
        let mib = after.saturating_sub(before);
        let mut slot = entry.lock();
        let load_override = slot.load_override.clone();
        slot.vram.record(replicas, load_override, mib);
        tracing::debug!(model = %entry.config.name, replicas, mib, "GPU memory taken by the load");
    }
}
