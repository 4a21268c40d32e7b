//! VRAM figures: what each model was measured to take, the best figure for admission, and
//! the detail the admin row shows next to the spec's `vram_estimate_*` fields.
//!
//! Figures, best first: the GPU memory of the engine child's process tree (NVML's
//! per-process readings, subprocess engines), the GPUs' used memory after minus before a
//! load (`observed_load_delta`), the GGUF weights plus the KV cache for the context and
//! cache types (`gguf_estimate`), the model files' size (`model_artifact_size`). Measured
//! figures are kept per replica count and load override, and persist in the state file.

use hangar_config::LoadOverride;
use hangar_config::{Device, ModelConfig};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::entry::{ModelEntry, Slot};
use crate::estimate::{GgufEstimate, gguf_estimate};

/// How a VRAM figure was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, strum::IntoStaticStr)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum VramMethod {
    /// NVML's used GPU memory of the engine's process tree (the child process and its
    /// descendants, found through `/proc`), summed over GPUs when the load finished.
    ProcessTree,
    /// The GPUs' used memory after minus before the load (loads are serialized).
    ObservedLoadDelta,
    /// The GGUF files' size plus the KV cache for the context and cache types the load
    /// would use, read from the header.
    GgufEstimate,
    /// The size of the model's files.
    ModelArtifactSize,
}

/// A measured process-tree figure.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessTreeFigure {
    /// GPU memory of the engine processes of `replica_count` replicas, in MiB.
    pub mib: u64,
    /// The replicas measured.
    pub replica_count: u32,
    /// The GPUs the processes held memory on.
    pub gpus: Vec<u32>,
    /// What they held on each of those GPUs (a split's shares need not be even).
    pub per_gpu: Vec<GpuShare>,
    /// When it was measured, Unix milliseconds.
    pub measured_unix_ms: u64,
}

/// What a model holds on one GPU, in MiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuShare {
    /// The GPU (NVML index).
    pub gpu: u32,
    /// What the model holds there.
    pub mib: u64,
}

/// The VRAM figures beyond the spec's three sources, and the one admission uses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VramDetail {
    /// What admission counts the model as taking for `replica_count` replicas, in MiB: the
    /// best of the figures below and the spec's estimate.
    pub admission_mib: u64,
    /// Where `admission_mib` comes from.
    pub admission_method: VramMethod,
    /// The replicas `admission_mib` is for (the model's current or configured count).
    pub replica_count: u32,
    /// The engine child's measured process-tree memory, for subprocess engines.
    pub process_tree: Option<ProcessTreeFigure>,
    /// The GGUF header's estimate, for GGUF models.
    pub gguf_estimate: Option<GgufEstimate>,
}

/// One measured figure: what a load of `replicas` replicas with `load_override` took.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Figure {
    pub(crate) replicas: u32,
    #[serde(rename = "override")]
    pub(crate) load_override: Map<String, Value>,
    pub(crate) method: VramMethod,
    pub(crate) mib: u64,
    #[serde(default)]
    pub(crate) gpus: Vec<u32>,
    /// What the load took on each GPU of its placement, by GPU ascending (empty when not
    /// measured per GPU).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) per_gpu: Vec<(u32, u64)>,
    pub(crate) measured_unix_ms: u64,
}

/// A model's measured figures. Read by every snapshot: compares values, allocates nothing.
/// The control loop's; the slot holds its published copy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ObservedVram {
    /// The latest measured last.
    pub(crate) figures: Vec<Figure>,
}

impl ObservedVram {
    /// The `method` figure for `replicas` under `load_override`, else the last one measured
    /// under the same override. Figures of other overrides are not used.
    pub(crate) fn get(
        &self,
        method: VramMethod,
        replicas: u32,
        load_override: &LoadOverride,
    ) -> Option<&Figure> {
        let same = || {
            self.figures
                .iter()
                .rev()
                .filter(|f| f.method == method && f.load_override == *load_override.fields())
        };
        same().find(|f| f.replicas == replicas).or_else(|| same().next())
    }

    /// The proportions a measured figure for `replicas` under `load_override` took on the
    /// GPUs `on`, when one was measured per GPU on exactly those GPUs (the process tree's
    /// first, then the load's delta).
    pub(crate) fn measured_split(
        &self,
        replicas: u32,
        load_override: &LoadOverride,
        on: &[u32],
    ) -> Option<&[(u32, u64)]> {
        let measured = [VramMethod::ProcessTree, VramMethod::ObservedLoadDelta];
        measured.into_iter().find_map(|m| {
            let f = self.get(m, replicas, load_override)?;
            let gpus = f.per_gpu.iter().map(|&(gpu, _)| gpu);
            (!f.per_gpu.is_empty() && gpus.eq(on.iter().copied())).then_some(&f.per_gpu[..])
        })
    }

    /// The `method` figure scaled to `replicas` (per replica times the count).
    fn scaled(&self, method: VramMethod, replicas: u32, ov: &LoadOverride) -> Option<u64> {
        let f = self.get(method, replicas, ov)?;
        if f.replicas == replicas || f.replicas == 0 {
            return Some(f.mib);
        }
        Some((f.mib * u64::from(replicas)).div_ceil(u64::from(f.replicas)))
    }

    pub(crate) fn record(&mut self, figure: Figure) {
        self.figures.retain(|f| {
            !(f.replicas == figure.replicas
                && f.method == figure.method
                && f.load_override == figure.load_override)
        });
        self.figures.push(figure);
    }
}

/// What admission counts `model` (effective definition) as taking with `replicas` replicas
/// under `load_override`, and how that was obtained; `None` when nothing is known.
pub(crate) fn admission_figure(
    entry: &ModelEntry,
    vram: &ObservedVram,
    model: &ModelConfig,
    replicas: u32,
    load_override: &LoadOverride,
) -> Option<(u64, VramMethod)> {
    let gguf = || gguf_estimate(&entry.artifacts, model, replicas);
    best_figure(entry, vram, replicas, load_override, gguf)
}

/// Measured figures first, then the GGUF estimate (`gguf`, computed only when needed), then
/// the files' size.
fn best_figure(
    entry: &ModelEntry,
    vram: &ObservedVram,
    replicas: u32,
    load_override: &LoadOverride,
    gguf: impl FnOnce() -> Option<GgufEstimate>,
) -> Option<(u64, VramMethod)> {
    let measured = [VramMethod::ProcessTree, VramMethod::ObservedLoadDelta];
    measured
        .into_iter()
        .find_map(|m| vram.scaled(m, replicas, load_override).map(|mib| (mib, m)))
        .or_else(|| gguf().map(|g| (g.mib, VramMethod::GgufEstimate)))
        .or_else(|| {
            let mib = entry.artifacts.mib?.saturating_mul(u64::from(replicas));
            Some((mib, VramMethod::ModelArtifactSize))
        })
}

/// The detail of a GPU model's row (`None` for a model not on a GPU, or with no figure).
pub(crate) fn vram_detail(entry: &ModelEntry, slot: &Slot, replicas: u32) -> Option<VramDetail> {
    if !entry.config.device.contains(Device::GPU) {
        return None;
    }
    let (model, ov) = (&slot.effective, &slot.load_override);
    let gguf_estimate = gguf_estimate(&entry.artifacts, model, replicas);
    let (admission_mib, admission_method) =
        best_figure(entry, &slot.vram, replicas, ov, || gguf_estimate.clone())?;
    let process_tree =
        slot.vram.get(VramMethod::ProcessTree, replicas, ov).map(|f| ProcessTreeFigure {
            mib: f.mib,
            replica_count: f.replicas,
            gpus: f.gpus.clone(),
            per_gpu: f.per_gpu.iter().map(|&(gpu, mib)| GpuShare { gpu, mib }).collect(),
            measured_unix_ms: f.measured_unix_ms,
        });
    Some(VramDetail {
        admission_mib,
        admission_method,
        replica_count: replicas,
        process_tree,
        gguf_estimate,
    })
}
