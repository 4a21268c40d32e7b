//! Host memory as a place: models that run on the CPU are admitted against `ram_budget`,
//! the way GPU models are against `vram_budget` (the same grant, one place: the host), and
//! GPU models by their part of the host's memory too.
//!
//! - **Who counts.** Every model whose engine runs here (not `openai_remote`): a model not
//!   on a GPU with all of its figure; a GPU model with its host part, once known.
//! - **Figures.** Once loaded, for engines in child processes: the resident memory
//!   (`VmRSS`) of the engine's process tree (for a GPU child, what stays on the host: its
//!   runtime, CPU layers, pinned buffers; llama.cpp unmaps the file ranges it offloaded).
//!   Otherwise, and before a load: for a model on the CPU, the GGUF estimate (weights plus
//!   KV cache), else the model files' size; for a GPU model, the GGUF estimate's share of
//!   the layers `n_gpu_layers` leaves on the CPU, else nothing until measured (a fully
//!   offloaded model, or an engine whose host share the files do not tell, like vLLM's). In-process engines keep the
//!   estimate: `hangard`'s own memory moves with every request it serves, so its growth
//!   across a load is not the load's own.
//! - **Mapped files count once.** Engines map model files: two loaded models on one file
//!   share its pages (the file is resolved once, at start-up: no file system call here). A file counts for the first loaded model in config order that maps
//!   it; a load of a file some loaded model maps already needs only the rest of its figure.
//! - **Free** is the budget minus what the loaded host models hold (accounted, not the
//!   machine's free memory, which the page cache clouds).

use std::path::Path;

use hangar_backend::Runtime;
use hangar_config::{BackendKind, BackendSettings, Device, LoadOverride, ModelConfig};
use hangar_eviction::{Fit, GpuHolding, GpuRoom};
use hangar_lifecycle::ModelState;

use crate::entry::{ModelEntry, Slot};
use crate::estimate::gguf_estimate;
use crate::grant::{Place, Places};
use crate::manager::Manager;
use crate::vram::{VramMethod, admission_figure};

/// How a host-memory figure was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum HostMethod {
    /// The resident memory of the engine's process tree, after the load.
    ProcessTreeRss,
    /// The GGUF files plus the KV cache for the load's context.
    GgufEstimate,
    /// The size of the model's files.
    ModelArtifactSize,
}

impl HostMethod {
    /// The snake_case name the API shows.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// What a host model takes, in MiB, and how that was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostFigure {
    /// For the model's replicas, in MiB.
    pub mib: u64,
    /// How it was obtained.
    pub method: HostMethod,
}

/// Whether `model`'s memory is the host's: not on a GPU, and run on this machine.
pub(crate) fn on_host(model: &ModelConfig) -> bool {
    !model.device.contains(Device::GPU) && local(model)
}

/// Whether `model` runs on this machine (its memory is the host's in whole or in part).
pub(crate) fn local(model: &ModelConfig) -> bool {
    model.backend != BackendKind::OpenaiRemote
}

/// The machine's memory in MiB (`MemTotal`), when `/proc/meminfo` can be read.
fn total_mib() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    kib_field(&text, "MemTotal:").map(|kib| kib / 1024)
}

/// The `field` of a `/proc` status-like text, in KiB.
pub(crate) fn kib_field(text: &str, field: &str) -> Option<u64> {
    text.lines().find_map(|l| l.strip_prefix(field)?.trim().strip_suffix("kB")?.trim().parse().ok())
}

/// The resident memory of `pid`, in MiB.
fn rss_mib(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    kib_field(&text, "VmRSS:").map(|kib| kib.div_ceil(1024))
}

/// What a finished load of `runtimes` holds on the host, when they run in child
/// processes: their process trees' resident memory (on the CPU or beside a GPU).
pub(crate) fn measure(runtimes: &[std::sync::Arc<dyn Runtime>]) -> Option<HostFigure> {
    let roots: Vec<u32> = runtimes.iter().filter_map(|r| r.pid()).collect();
    if roots.is_empty() {
        return None;
    }
    let pids: Vec<u32> = roots.into_iter().flat_map(hangar_gpu::process_tree).collect();
    let mib: u64 = pids.into_iter().filter_map(rss_mib).sum();
    (mib > 0).then_some(HostFigure { mib, method: HostMethod::ProcessTreeRss })
}

/// The best host figure of `entry`'s model for `replicas` under `load_override`: the one
/// measured for the runtimes in service, else the estimate.
pub(crate) fn figure(
    entry: &ModelEntry,
    slot: &Slot,
    model: &ModelConfig,
    replicas: u32,
    load_override: &LoadOverride,
) -> Option<HostFigure> {
    if let Some(measured) = slot.host.filter(|_| slot.lifecycle.state() == ModelState::Loaded) {
        return Some(measured);
    }
    if !on_host(model) {
        return beside_gpu(entry, model, replicas);
    }
    let (mib, method) = admission_figure(entry, &slot.vram, model, replicas, load_override)?;
    let method = match method {
        VramMethod::GgufEstimate => HostMethod::GgufEstimate,
        _ => HostMethod::ModelArtifactSize,
    };
    // Asleep at `context`, an in-process model keeps its weights and drops its KV cache.
    let asleep = slot.phase.serving().and_then(|s| s.asleep.as_ref());
    if asleep.is_some_and(|a| a.level == hangar_backend::SleepLevel::Context)
        && let Some(estimate) = gguf_estimate(&entry.artifacts, model, replicas)
    {
        let mib = estimate.weights_mib * u64::from(replicas);
        return Some(HostFigure { mib, method: HostMethod::GgufEstimate });
    }
    Some(HostFigure { mib, method })
}

/// A GPU model's host part before it is measured: the share of its GGUF estimate on the
/// layers llama.cpp keeps on the CPU (`n_gpu_layers` under the header's layer count);
/// `None` when every layer is offloaded or the files do not tell.
fn beside_gpu(entry: &ModelEntry, model: &ModelConfig, replicas: u32) -> Option<HostFigure> {
    let gpu_layers = match &model.settings {
        BackendSettings::LlamaCpp(s) => s.gguf_n_gpu_layers,
        BackendSettings::LlamaServer(s) => s.llama_server_n_gpu_layers,
        _ => None,
    };
    // Unset or negative: llama.cpp offloads every layer.
    let gpu_layers = u64::try_from(gpu_layers?).ok()?;
    let estimate = gguf_estimate(&entry.artifacts, model, replicas)?;
    let layers = u64::from(estimate.layers);
    let on_cpu = layers.checked_sub(gpu_layers).filter(|&n| n > 0)?;
    let mib = (estimate.mib * on_cpu).div_ceil(layers);
    Some(HostFigure { mib, method: HostMethod::GgufEstimate })
}

impl Manager {
    /// What a creation of `entry`'s `model` is granted against on the host: the budget
    /// less what loaded local models hold there, their holdings, and the model's figure
    /// (its host part for a GPU model; for a model on the CPU, less a file some loaded
    /// CPU model maps already). `None` without a `ram_budget`, for a remote model, or for
    /// a GPU model whose host part is not known.
    pub(crate) fn host_places(
        &self,
        entry: &ModelEntry,
        model: &ModelConfig,
        replicas: u32,
        load_override: &LoadOverride,
    ) -> Option<Places> {
        let budget = self.inner.ram_budget?;
        if !local(model) {
            return None;
        }
        let budget = budget.resolve(total_mib()?);
        let mut holdings = Vec::new();
        let mut files: Vec<&Path> = Vec::new();
        let registry = self.registry();
        for other in &registry.order {
            if other.position == entry.position || !local(&other.config) {
                continue;
            }
            let slot = other.lock();
            if slot.lifecycle.state() != ModelState::Loaded {
                continue;
            }
            let replicas = slot.phase.loaded_replicas().max(1);
            let Some(held) = figure(other, &slot, &slot.effective, replicas, &slot.load_override)
            else {
                continue;
            };
            let mut mib = held.mib;
            // A GPU model maps only the ranges it keeps on the CPU: its file is not shared.
            if let Some((file, file_mib)) =
                other.artifacts.mapped.as_ref().filter(|_| on_host(&other.config))
            {
                if files.contains(&file.as_path()) {
                    mib = mib.saturating_sub(*file_mib);
                } else {
                    files.push(file);
                }
            }
            holdings.push(GpuHolding { model: other.config.name.clone(), gpu: 0, mib });
        }
        let held: u64 = holdings.iter().map(|h| h.mib).sum();
        let free_mib =
            i64::try_from(budget).unwrap_or(i64::MAX) - i64::try_from(held).unwrap_or(i64::MAX);
        let slot = entry.lock();
        let needed = figure(entry, &slot, model, replicas, load_override);
        let (mut needed, known) = match needed {
            Some(figure) => (figure.mib, true),
            None if on_host(model) => (0, false),
            None => return None,
        };
        if let Some((file, file_mib)) = &entry.artifacts.mapped
            && on_host(model)
            && files.contains(&file.as_path())
        {
            needed = needed.saturating_sub(*file_mib);
        }
        let fit = Fit { needed_mib: needed, allowed: Vec::new(), split: 1 };
        let gpus = vec![GpuRoom { index: 0, free_mib }];
        Some(Places { on: Place::Host, gpus, holdings, fit, known })
    }
}
