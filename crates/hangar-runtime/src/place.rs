//! Where a model's runtimes run: the GPUs a load is placed on ([`Placement`]), and the
//! grant's inputs with each GPU a place of its own ([`Places`]): the free memory under the
//! budget on each GPU Hangar may use, what each loaded model holds where, and what the new
//! runtimes need.
//!
//! A loaded model holds its admission figure over its placement, in the proportions it was
//! measured to take on each of those GPUs (a split's shares need not be even: the first GPU
//! of a llama.cpp layer split also holds the output layer), else evenly; a model loaded
//! without a placement (no budget or no telemetry then) over the GPUs its process tree was
//! measured on, else over every GPU (on a one-GPU machine, that GPU). GPUs outside
//! `hangard`'s own `CUDA_VISIBLE_DEVICES` (when it names indices) are not Hangar's to use.

use hangar_config::{Device, LoadOverride, ModelConfig, cuda_indices};
use hangar_eviction::{Fit, GpuHolding, GpuRoom};
use hangar_gpu::GpuReading;
use hangar_lifecycle::ModelState;

use crate::control::{LaneInfo, Lanes};
use crate::entry::ModelEntry;
use crate::grant::{Place, Places};
use crate::manager::Manager;
use crate::vram::{VramMethod, admission_figure};

/// The GPUs a model's runtimes were placed on, and who chose them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// NVML indices (PCI bus order), ascending.
    pub gpus: Vec<u32>,
    /// Who chose them.
    pub source: PlacementSource,
    /// What admission counts the loaded model as holding on each of them, in MiB: its
    /// figure in the split measured on these GPUs, else shared evenly; empty when it is
    /// not loaded or has no figure (filled in by snapshots).
    pub holds: Vec<crate::vram::GpuShare>,
}

/// Who chose a placement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum PlacementSource {
    /// The definition left no choice: its `gpus` (or `CUDA_VISIBLE_DEVICES`) list exactly
    /// as many GPUs as it spreads over, or nothing measured the GPUs' memory.
    Configured,
    /// Hangar's grant chose them among the allowed GPUs, by each GPU's free memory.
    Chosen,
    /// The load request's `gpus` override left no choice.
    Override,
}

impl PlacementSource {
    /// The snake_case name the API shows.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

impl Placement {
    /// Where a load of the effective `model` goes, given the grant's choice (`chosen`, empty
    /// when the grant made none) and whether the load's override set `gpus`: the grant's
    /// choice; else the first GPUs the definition (or override) allows; else none (the
    /// engine picks, as it would alone).
    pub(crate) fn of(model: &ModelConfig, chosen: Vec<u32>, overridden: bool) -> Option<Self> {
        let split = model.gpu_split.get() as usize;
        let no_choice =
            if overridden { PlacementSource::Override } else { PlacementSource::Configured };
        if !chosen.is_empty() {
            let choice = model.gpus.len() != split;
            let source = if choice { PlacementSource::Chosen } else { no_choice };
            return Some(Self { gpus: chosen, source, holds: Vec::new() });
        }
        (!model.gpus.is_empty()).then(|| Self {
            gpus: model.gpus.iter().copied().take(split).collect(),
            source: no_choice,
            holds: Vec::new(),
        })
    }
}

/// Where `model`'s creations take memory, for the load lanes: an exclusive device (the
/// NPU) everything; a remote server the remote lane; a model on the CPU the host; one on
/// GPUs those it may use (all when any); in-process llama.cpp its own lane too.
pub(crate) fn lanes_of(model: &ModelConfig) -> LaneInfo {
    use hangar_config::BackendKind;
    let lanes = if model.device.intersects(Device::EXCLUSIVE) {
        Lanes::ALL
    } else if model.backend == BackendKind::OpenaiRemote {
        Lanes::REMOTE
    } else if crate::host::on_host(model) {
        Lanes::HOST
    } else {
        Lanes::gpus(&model.gpus)
    };
    let lanes = if model.backend == BackendKind::LlamaCpp {
        lanes.with(Lanes::LLAMA_IN_PROCESS)
    } else {
        lanes
    };
    LaneInfo { lanes, model_type: model.model_type }
}

/// Warns when placements cannot be trusted: `hangard` runs under a `CUDA_VISIBLE_DEVICES`
/// that names GPUs otherwise than by index (UUIDs, MIG instances), which Hangar cannot
/// match to NVML's indices, while `config` places models (a `vram_budget`, or a model's
/// `gpus` or split). Its children would be pointed at NVML indices it may not own.
pub(crate) fn warn_if_unmappable(config: &hangar_config::Config) {
    let Ok(visible) = std::env::var("CUDA_VISIBLE_DEVICES") else { return };
    let places = config.vram_budget.is_some()
        || config.models.iter().any(|m| !m.gpus.is_empty() || m.gpu_split.get() > 1);
    if places && !visible.trim().is_empty() && cuda_indices(&visible).is_none() {
        tracing::warn!(
            visible = %visible,
            "CUDA_VISIBLE_DEVICES names GPUs by UUID or MIG instance: placements use NVML's indices, which may name other GPUs; start hangard with CUDA_VISIBLE_DEVICES as indices, or unset"
        );
    }
}

/// The GPUs a loaded model holds memory on: its placement, else the GPUs its process tree
/// was measured on; empty when neither is known.
pub(crate) fn held_gpus(slot: &crate::entry::Slot) -> Vec<u32> {
    if let Some(placement) = &slot.placement {
        return placement.gpus.clone();
    }
    let replicas = slot.phase.loaded_replicas().max(1);
    let measured = slot.vram.get(VramMethod::ProcessTree, replicas, &slot.load_override);
    measured.map(|f| f.gpus.clone()).unwrap_or_default()
}

/// `mib` spread over the GPUs `on` (ascending): in the proportions of `measured` (what a
/// load took on exactly those GPUs), else evenly; each share rounded up.
pub(crate) fn spread(mib: u64, on: &[u32], measured: Option<&[(u32, u64)]>) -> Vec<(u32, u64)> {
    let total: u64 = measured.map_or(0, |m| m.iter().map(|&(_, part)| part).sum());
    if let Some(measured) = measured.filter(|_| total > 0) {
        let share = |part: u64| {
            let exact = (u128::from(mib) * u128::from(part)).div_ceil(u128::from(total));
            u64::try_from(exact).unwrap_or(u64::MAX)
        };
        return measured.iter().map(|&(gpu, part)| (gpu, share(part))).collect();
    }
    let share = mib.div_ceil(on.len().max(1) as u64);
    on.iter().map(|&gpu| (gpu, share)).collect()
}

/// What a loaded model holds on each GPU, by its best figure ([`spread`] over the GPUs it
/// holds memory on, or over `every` GPU when those are unknown); empty without a figure.
pub(crate) fn held_shares(
    entry: &ModelEntry,
    slot: &crate::entry::Slot,
    every: &[u32],
) -> Vec<(u32, u64)> {
    let mib = crate::gpu::vram_held(entry, slot);
    if mib == 0 {
        return Vec::new();
    }
    let mut on = held_gpus(slot);
    if on.is_empty() {
        on = every.to_vec();
    }
    let replicas = slot.phase.loaded_replicas().max(1);
    let measured = slot.vram.measured_split(replicas, &slot.load_override, &on);
    spread(mib, &on, measured)
}

/// The GPUs `hangard` may use, by its own `CUDA_VISIBLE_DEVICES` when that names indices.
fn ours(gpus: Vec<GpuReading>) -> Vec<GpuReading> {
    let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok().and_then(|v| cuda_indices(&v));
    match visible {
        Some(visible) => gpus.into_iter().filter(|g| visible.contains(&g.index)).collect(),
        None => gpus,
    }
}

impl Manager {
    /// What a creation of `replicas` runtimes of `model` under `load_override` is granted
    /// against: each usable GPU's free budget, the loaded models' holdings, and the model's
    /// best figure with where it may go. `None` (no admission by memory) without a budget,
    /// for a model not on a GPU, or without telemetry.
    pub(crate) async fn places_for(
        &self,
        entry: &ModelEntry,
        model: &ModelConfig,
        replicas: u32,
        load_override: &LoadOverride,
    ) -> Option<Places> {
        if crate::host::on_host(model) {
            return self.host_places(entry, model, replicas, load_override);
        }
        let budget = self.inner.vram_budget.as_ref()?;
        let readings = ours(self.read_gpus(entry.config.device).await?);
        let gpus = readings
            .iter()
            .map(|g| {
                let allowed =
                    i64::try_from(budget.mib_for(g.index, g.total_mib)).unwrap_or(i64::MAX);
                GpuRoom {
                    index: g.index,
                    free_mib: allowed - i64::try_from(g.used_mib).unwrap_or(i64::MAX),
                }
            })
            .collect();
        let figure = admission_figure(entry, &entry.lock().vram, model, replicas, load_override);
        let figure = figure.map(|(mib, _)| mib).or_else(|| running_figure(entry, replicas));
        if figure.is_none() {
            tracing::info!(model = %entry.config.name, "no VRAM figure for the model: counted as 0 (a load is then measured; a second copy is refused)");
        }
        let needed_mib = figure.unwrap_or(0);
        let fit = Fit { needed_mib, allowed: model.gpus.clone(), split: model.gpu_split.get() };
        let holdings = self.holdings(&readings);
        Some(Places { on: Place::Gpus, gpus, holdings, fit, known: figure.is_some() })
    }

    /// What each loaded GPU model holds on each GPU (see the module docs).
    fn holdings(&self, readings: &[GpuReading]) -> Vec<GpuHolding> {
        let every: Vec<u32> = readings.iter().map(|g| g.index).collect();
        let mut holdings = Vec::new();
        let registry = self.registry();
        for entry in &registry.order {
            if !entry.config.device.contains(Device::GPU) {
                continue;
            }
            let slot = entry.lock();
            if slot.lifecycle.state() != ModelState::Loaded {
                continue;
            }
            holdings.extend(
                held_shares(entry, &slot, &every).into_iter().map(|(gpu, mib)| GpuHolding {
                    model: entry.config.name.clone(),
                    gpu,
                    mib,
                }),
            );
        }
        holdings
    }
}

/// The figure of `entry`'s runtimes in service, scaled to `replicas`: what a second copy (a
/// reload under another override, a weight update) is counted as when nothing was measured
/// for its own settings. `None` when the model is not loaded or has no figure either.
fn running_figure(entry: &ModelEntry, replicas: u32) -> Option<u64> {
    let slot = entry.lock();
    if slot.lifecycle.state() != ModelState::Loaded {
        return None;
    }
    let running = slot.phase.loaded_replicas().max(1);
    let (model, ov) = (&slot.effective, &slot.load_override);
    let (mib, _) = admission_figure(entry, &slot.vram, model, running, ov)?;
    Some((mib * u64::from(replicas)).div_ceil(u64::from(running)))
}

#[cfg(test)]
mod tests {
    use super::spread;

    #[test]
    fn a_figure_is_spread_as_measured_on_the_same_gpus_else_evenly() {
        // As measured: 3:1 on GPUs 0 and 1, scaled to the figure, rounded up.
        assert_eq!(spread(4000, &[0, 1], Some(&[(0, 3000), (1, 1000)])), [(0, 3000), (1, 1000)]);
        assert_eq!(spread(2001, &[0, 1], Some(&[(0, 3000), (1, 1000)])), [(0, 1501), (1, 501)]);
        // Evenly, rounded up, without a measured split (or an empty one).
        assert_eq!(spread(2001, &[2, 3], None), [(2, 1001), (3, 1001)]);
        assert_eq!(
            spread(900, &[1, 2, 3], Some(&[(1, 0), (2, 0), (3, 0)])),
            [(1, 300), (2, 300), (3, 300)]
        );
        assert_eq!(spread(900, &[], None), []);
    }
}
