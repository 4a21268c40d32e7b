//! GPU telemetry as the manager serves it: the host's probe ([`Manager::set_gpu_probe`]) read
//! off the async threads, next to every model's VRAM estimate.

use std::sync::{Arc, PoisonError};

use hangar_gpu::{GpuProbe, GpuReading, Unavailable};

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
