//! Where a model's VRAM figure comes from and what was measured.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Where a VRAM estimate comes from.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema, strum::IntoStaticStr,
)]
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

/// How a VRAM figure was obtained.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema, strum::IntoStaticStr,
)]
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct GpuShare {
    /// The GPU (NVML index).
    pub gpu: u32,
    /// What the model holds there.
    pub mib: u64,
}

/// The VRAM figures beyond the spec's three sources, and the one admission uses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
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

/// A GGUF model's VRAM before it is loaded: its files plus the KV cache for the context and
/// cache types it would load with, per replica. An upper bound for sliding-window models;
/// compute buffers are not counted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct GgufEstimate {
    /// Weights plus KV cache for `replica_count` replicas, in MiB.
    pub mib: u64,
    /// The replicas the figure is for.
    pub replica_count: u32,
    /// The model's files (model, mmproj, draft) per replica, in MiB.
    pub weights_mib: u64,
    /// One replica's KV cache, in MiB.
    pub kv_cache_mib: u64,
    /// The context the cache is sized for, in tokens.
    pub n_ctx: u64,
    /// The K cache type.
    pub type_k: String,
    /// The V cache type.
    pub type_v: String,
    /// Layers, from the header.
    pub layers: u32,
}

impl From<hangar_runtime::VramEstimateSource> for VramEstimateSource {
    fn from(v: hangar_runtime::VramEstimateSource) -> Self {
        match v {
            hangar_runtime::VramEstimateSource::ObservedLoadDelta => Self::ObservedLoadDelta,
            hangar_runtime::VramEstimateSource::ModelArtifactSize => Self::ModelArtifactSize,
            hangar_runtime::VramEstimateSource::Unavailable => Self::Unavailable,
        }
    }
}

impl From<hangar_runtime::VramMethod> for VramMethod {
    fn from(v: hangar_runtime::VramMethod) -> Self {
        match v {
            hangar_runtime::VramMethod::ProcessTree => Self::ProcessTree,
            hangar_runtime::VramMethod::ObservedLoadDelta => Self::ObservedLoadDelta,
            hangar_runtime::VramMethod::GgufEstimate => Self::GgufEstimate,
            hangar_runtime::VramMethod::ModelArtifactSize => Self::ModelArtifactSize,
        }
    }
}

impl From<hangar_runtime::ProcessTreeFigure> for ProcessTreeFigure {
    fn from(v: hangar_runtime::ProcessTreeFigure) -> Self {
        Self {
            mib: v.mib,
            replica_count: v.replica_count,
            gpus: v.gpus,
            per_gpu: v.per_gpu.into_iter().map(|s| GpuShare { gpu: s.gpu, mib: s.mib }).collect(),
            measured_unix_ms: v.measured_unix_ms,
        }
    }
}

impl From<hangar_runtime::VramDetail> for VramDetail {
    fn from(v: hangar_runtime::VramDetail) -> Self {
        Self {
            admission_mib: v.admission_mib,
            admission_method: v.admission_method.into(),
            replica_count: v.replica_count,
            process_tree: v.process_tree.map(|x| x.into()),
            gguf_estimate: v.gguf_estimate.map(|x| x.into()),
        }
    }
}

impl From<hangar_runtime::GgufEstimate> for GgufEstimate {
    fn from(v: hangar_runtime::GgufEstimate) -> Self {
        Self {
            mib: v.mib,
            replica_count: v.replica_count,
            weights_mib: v.weights_mib,
            kv_cache_mib: v.kv_cache_mib,
            n_ctx: v.n_ctx,
            type_k: v.type_k,
            type_v: v.type_v,
            layers: v.layers,
        }
    }
}

/// The GPUs a loaded model's runtimes were placed on, and who chose them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Placement {
    /// NVML indices (PCI bus order), ascending; the engines see them as
    /// `CUDA_VISIBLE_DEVICES`.
    pub gpus: Vec<u32>,
    /// `configured`: the definition's `gpus` left no choice, or nothing measured the GPUs;
    /// `chosen`: the grant chose among the allowed GPUs by their free memory; `override`:
    /// the load request's `gpus` left no choice.
    pub source: PlacementSource,
    /// What admission counts the loaded model as holding on each of its GPUs, in MiB: its
    /// figure in the split measured on these GPUs, else shared evenly; empty when it is not
    /// loaded or has no figure.
    pub holds: Vec<GpuShare>,
}

/// Who chose a placement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PlacementSource {
    /// The definition left no choice.
    Configured,
    /// The grant chose.
    Chosen,
    /// The load request's `gpus` override left no choice.
    Override,
}

impl From<hangar_runtime::Placement> for Placement {
    fn from(p: hangar_runtime::Placement) -> Self {
        let source = match p.source {
            hangar_runtime::PlacementSource::Configured => PlacementSource::Configured,
            hangar_runtime::PlacementSource::Chosen => PlacementSource::Chosen,
            hangar_runtime::PlacementSource::Override => PlacementSource::Override,
        };
        let holds = p.holds.into_iter().map(|s| GpuShare { gpu: s.gpu, mib: s.mib }).collect();
        Self { gpus: p.gpus, source, holds }
    }
}

/// What a model holds (once loaded and measured) or would take of the host's memory: all
/// of it on the CPU, its host part beside a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct HostMemory {
    /// For the model's replicas, in MiB.
    pub mib: u64,
    /// How it was obtained.
    pub method: HostMethod,
}

/// How a host-memory figure was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum HostMethod {
    /// The resident memory of the engine's process tree, after the load.
    ProcessTreeRss,
    /// The GGUF files plus the KV cache for the load's context.
    GgufEstimate,
    /// The size of the model's files.
    ModelArtifactSize,
}

impl From<hangar_runtime::HostFigure> for HostMemory {
    fn from(f: hangar_runtime::HostFigure) -> Self {
        use hangar_runtime::HostMethod as M;
        let method = match f.method {
            M::ProcessTreeRss => HostMethod::ProcessTreeRss,
            M::GgufEstimate => HostMethod::GgufEstimate,
            M::ModelArtifactSize => HostMethod::ModelArtifactSize,
        };
        Self { mib: f.mib, method }
    }
}
