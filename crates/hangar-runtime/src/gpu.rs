//! GPU telemetry as the manager uses it: the host's probe ([`Manager::set_gpu_probe`]) read
//! off the async threads; each load's measured figures; the free VRAM budget a load is
//! admitted against; and the wait for an unload's memory to show as released.

use std::sync::{Arc, PoisonError};
use std::time::Duration;

use hangar_backend::Runtime;
use hangar_config::LoadOverride;
use hangar_config::{Device, ModelName};
use hangar_gpu::{GpuProbe, GpuReading, Unavailable};

use crate::control::{ALL_GPUS, GpuRelease, ReleaseAnswer};
use crate::entry::{ModelEntry, Slot};
use crate::journal::unix_ms;
use crate::manager::Manager;
use crate::snapshot::ModelSnapshot;
use crate::vram::{Figure, VramMethod, admission_figure};

/// Longest a load waits for an unload's GPU memory to show as released.
pub const RELEASE_WAIT: Duration = Duration::from_secs(15);
/// How often the probe is read meanwhile.
const RELEASE_POLL: Duration = Duration::from_millis(100);

/// What `GET /v1/admin/gpu-memory` shows: the GPUs (or why there are none), who holds
/// memory on each, and every model.
#[derive(Debug, Clone)]
pub struct GpuMemory {
    /// Every GPU's memory now, or why it cannot be read.
    pub gpus: Result<Vec<GpuReading>, Unavailable>,
    /// Who holds memory on which GPU, as the GPUs' per-process readings say: by GPU, then
    /// largest first. Empty without readings.
    pub holders: Vec<GpuHolder>,
    /// Every configured model, in config order.
    pub models: Vec<ModelSnapshot>,
}

/// Memory one holder has on one GPU, from the GPUs' per-process readings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuHolder {
    /// The GPU.
    pub gpu: u32,
    /// The model whose engine's process tree (a child process and its descendants) holds
    /// it; `None` for `hangard`'s own process, whose in-process engines the readings cannot
    /// tell apart.
    pub model: Option<ModelName>,
    /// What it holds there, in MiB.
    pub mib: u64,
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

    /// The `vram_budget` loads are admitted against; `None`: no admission by memory.
    pub fn vram_budget(&self) -> Option<&hangar_config::VramBudget> {
        self.inner.vram_budget.as_ref()
    }

    /// The GPUs' memory now, read on this thread (NVML calls block briefly; async callers
    /// use [`Manager::gpu_memory`]).
    ///
    /// # Errors
    /// [`Unavailable`] with the probe's reason.
    pub fn gpu_readings(&self) -> Result<Vec<GpuReading>, Unavailable> {
        self.gpu_probe().read()
    }

    /// The GPUs' memory now, who holds it, and every model (read on a blocking thread:
    /// NVML calls and the process table block).
    pub async fn gpu_memory(&self) -> GpuMemory {
        let probe = self.gpu_probe();
        let engines = self.engine_processes();
        let read = tokio::task::spawn_blocking(move || {
            let gpus = probe.read()?;
            let holders = holders(&gpus, engines);
            Ok((gpus, holders))
        });
        let read = read
            .await
            .unwrap_or_else(|e| Err(Unavailable { reason: format!("the GPU probe failed: {e}") }));
        let (gpus, holders) = match read {
            Ok((gpus, holders)) => (Ok(gpus), holders),
            Err(unavailable) => (Err(unavailable), Vec::new()),
        };
        GpuMemory { gpus, holders, models: self.models() }
    }

    /// Each model whose runtimes run in child processes, with their process ids.
    fn engine_processes(&self) -> Vec<(ModelName, Vec<u32>)> {
        // Every model the loop knows: one a reload removed may still be unloading.
        self.inner
            .control
            .entries()
            .iter()
            .filter_map(|entry| {
                let slot = entry.lock();
                let runtimes = slot.phase.scheduler()?.runtimes();
                let pids: Vec<u32> = runtimes.iter().filter_map(|r| r.pid()).collect();
                (!pids.is_empty()).then(|| (entry.config.name.clone(), pids))
            })
            .collect()
    }
}

impl Manager {
    /// The GPUs now when `device` includes a GPU and the probe can read them.
    pub(crate) async fn read_gpus(&self, device: Device) -> Option<Vec<GpuReading>> {
        if !device.contains(Device::GPU) {
            return None;
        }
        let probe = self.gpu_probe();
        tokio::task::spawn_blocking(move || probe.read()).await.ok()?.ok()
    }

    /// The used memory of each GPU in `on` (empty: all), in MiB, when `entry`'s model is on
    /// a GPU and the probe can read it (read before and after a load).
    pub(crate) async fn gpu_used_on(&self, entry: &ModelEntry, on: &[u32]) -> Option<Used> {
        let gpus = self.read_gpus(entry.config.device).await?;
        Some(each_used(&gpus, on))
    }

    /// Records what a successful load of `runtimes` under `load_override` took: the used
    /// memory of the GPUs it was placed `on` (empty: all) now minus `before` (`None`: not
    /// measured, or an earlier unload's release may have landed in between), per GPU when
    /// it was placed, and the memory of the engines' process trees (per GPU) when they run
    /// in child processes; then saves the state file.
    pub(crate) async fn record_load(
        &self,
        entry: &ModelEntry,
        (before, on): (Option<Used>, &[u32]),
        runtimes: &[Arc<dyn Runtime>],
        load_override: &LoadOverride,
    ) {
        let Some(gpus) = self.read_gpus(entry.config.device).await else { return };
        let roots: Vec<u32> = runtimes.iter().filter_map(|r| r.pid()).collect();
        let tree = if roots.is_empty() {
            None
        } else {
            let gpus = gpus.clone();
            tokio::task::spawn_blocking(move || {
                let pids: Vec<u32> = roots.into_iter().flat_map(hangar_gpu::process_tree).collect();
                hangar_gpu::tree_memory(&gpus, &pids)
            })
            .await
            .ok()
            .flatten()
        };
        let after = each_used(&gpus, on);
        let replicas = runtimes.len() as u32;
        let load_override = load_override.fields().clone();
        let now = unix_ms(std::time::SystemTime::now());
        let figure = |method, mib, gpus, per_gpu| Figure {
            replicas,
            load_override: load_override.clone(),
            method,
            mib,
            gpus,
            per_gpu,
            measured_unix_ms: now,
        };
        let delta = before.map(|before| load_delta(&before, &after));
        let mut figures = Vec::new();
        if let Some(per_gpu) = &delta {
            let mib = per_gpu.iter().map(|&(_, mib)| mib).sum();
            // Without a placement, the other GPUs' deltas are other models' work too: the
            // sum is kept, not the split.
            let (gpus, per_gpu) = if on.is_empty() {
                (Vec::new(), Vec::new())
            } else {
                (on.to_vec(), per_gpu.clone())
            };
            figures.push(figure(VramMethod::ObservedLoadDelta, mib, gpus, per_gpu));
        }
        if let Some(tree) = &tree {
            let (gpus, per_gpu) = (tree.gpus.clone(), tree.per_gpu.clone());
            figures.push(figure(VramMethod::ProcessTree, tree.mib, gpus, per_gpu));
        }
        tracing::debug!(model = %entry.config.name, replicas, ?delta, tree = ?tree.as_ref().map(|t| t.mib), "GPU memory taken by the load");
        self.inner.control.measured(entry.position, figures).await;
        self.save_state().await;
    }

    /// Writes the state file, when there is one (off the async threads).
    pub(crate) async fn save_state(&self) {
        if self.inner.state.is_none() {
            return;
        }
        let (inner, registry) = (Arc::clone(&self.inner), self.registry());
        let _ = tokio::task::spawn_blocking(move || {
            if let Some(state) = &inner.state {
                state.save(&registry.order);
            }
        })
        .await;
    }

    /// Before a GPU model's runtimes are unloaded: on each GPU it holds memory on, the used
    /// memory now and what the unload should free there (its figure over its placement, or
    /// over the GPUs its process tree was measured on, as `place::held_shares` spreads it;
    /// over [`ALL_GPUS`], the sum, when neither is known). Only a measured figure is trusted: an estimate that is
    /// too high would hold every next load for the whole [`RELEASE_WAIT`].
    pub(crate) async fn before_release(&self, entry: &ModelEntry) -> Option<Vec<GpuRelease>> {
        let to_release = to_release(entry, &entry.lock(), false)?;
        self.releases(entry, to_release).await
    }

    /// The releases to expect of `to_release` (what [`to_release`] said), with each GPU's
    /// used memory now.
    pub(crate) async fn releases(
        &self,
        entry: &ModelEntry,
        (held, shares): (u64, Vec<(u32, u64)>),
    ) -> Option<Vec<GpuRelease>> {
        let gpus = self.read_gpus(entry.config.device).await?;
        if shares.is_empty() {
            return Some(vec![(ALL_GPUS, used_on(&gpus, &[]), held)]);
        }
        Some(shares.into_iter().map(|(gpu, mib)| (gpu, used_on(&gpus, &[gpu]), mib)).collect())
    }

    /// After an unload: the next load on those GPUs waits until the memory shows as
    /// released (the control loop keeps what is awaited, `control/step/release.rs`).
    pub(crate) fn expect_release(&self, releases: Vec<GpuRelease>) {
        self.inner.control.released(releases);
    }

    /// Waits until the memory of earlier unloads on the GPUs `entry`'s model may use shows
    /// as released in the probe, at most until [`RELEASE_WAIT`] after the last unload
    /// there; at once when none is pending or the model is not on a GPU. False when the
    /// wait ran out: memory may still be released meanwhile, so a GPU delta measured now
    /// would be wrong.
    pub(crate) async fn wait_for_release(&self, entry: &ModelEntry) -> bool {
        let mut used: Option<Vec<(u32, u64)>> = None;
        loop {
            let asked = self.inner.control.await_release(&entry.config.gpus, used.clone());
            match asked.await {
                ReleaseAnswer::Go { settled } => {
                    if !settled {
                        tracing::warn!(model = %entry.config.name, ?used, "the GPU memory of an unload did not show as released in time; loading anyway");
                    }
                    return settled;
                }
                ReleaseAnswer::Read => {}
                ReleaseAnswer::Wait => tokio::time::sleep(RELEASE_POLL).await,
            }
            let Some(gpus) = self.read_gpus(entry.config.device).await else { return true };
            let each = gpus.iter().map(|g| (g.index, g.used_mib));
            used = Some(each.chain([(ALL_GPUS, used_on(&gpus, &[]))]).collect());
        }
    }
}

/// What an unload of `entry`'s runtimes in service should free (a measured figure only; see
/// [`Manager::before_release`]): the MiB, and its share on each GPU (empty: not known where).
/// `woken`: they took back what a sleep gave (a wake that then failed its check), though
/// the slot still says asleep. `None` for nothing to expect.
pub(crate) fn to_release(
    entry: &ModelEntry,
    slot: &Slot,
    woken: bool,
) -> Option<(u64, Vec<(u32, u64)>)> {
    let freed = if woken { 0 } else { asleep_freed(slot) };
    let held = match held_figure(entry, slot) {
        Some((mib, VramMethod::ProcessTree | VramMethod::ObservedLoadDelta)) => {
            mib.saturating_sub(freed)
        }
        _ => 0,
    };
    if held == 0 {
        return None;
    }
    let on = crate::place::held_gpus(slot);
    let shares = if woken && !on.is_empty() {
        let replicas = slot.phase.loaded_replicas().max(1);
        let measured = slot.vram.measured_split(replicas, &slot.load_override, &on);
        crate::place::spread(held, &on, measured)
    } else {
        crate::place::held_shares(entry, slot, &[])
    };
    Some((held, shares))
}

/// The used memory of each GPU, in MiB, by GPU ascending.
pub(crate) type Used = Vec<(u32, u64)>;

/// The used memory of each GPU in `on` (empty: all), in MiB.
fn each_used(gpus: &[GpuReading], on: &[u32]) -> Used {
    let mut used: Used = gpus
        .iter()
        .filter(|g| on.is_empty() || on.contains(&g.index))
        .map(|g| (g.index, g.used_mib))
        .collect();
    used.sort_unstable();
    used
}

/// What a load took on each GPU: the used memory `after` less `before`, on the GPUs read
/// both times (a GPU whose memory went down took nothing).
fn load_delta(before: &Used, after: &Used) -> Used {
    after
        .iter()
        .filter_map(|&(gpu, now)| {
            let (_, then) = before.iter().find(|&&(g, _)| g == gpu)?;
            Some((gpu, now.saturating_sub(*then)))
        })
        .collect()
}

/// The used memory of the GPUs in `on` (empty: all), in MiB.
fn used_on(gpus: &[GpuReading], on: &[u32]) -> u64 {
    gpus.iter().filter(|g| on.is_empty() || on.contains(&g.index)).map(|g| g.used_mib).sum()
}

/// The GPU memory a loaded model holds as admission counts it (0 for a model not on a GPU):
/// its figure, less what a sleep gave back while it sleeps.
pub(crate) fn vram_held(entry: &ModelEntry, slot: &Slot) -> u64 {
    if !entry.config.device.contains(Device::GPU) {
        return 0;
    }
    held_figure(entry, slot).map_or(0, |(mib, _)| mib).saturating_sub(asleep_freed(slot))
}

/// What the sleep of a sleeping model gave back, in MiB (0 awake).
fn asleep_freed(slot: &Slot) -> u64 {
    slot.phase.serving().and_then(|s| s.asleep.as_ref()).map_or(0, |a| a.freed_mib)
}

/// How far the used memory fell from `before` to `after` over the GPUs read both times, in
/// MiB (a GPU whose memory rose counts 0).
pub(crate) fn fell_by(before: &Used, after: &Used) -> u64 {
    load_delta(after, before).iter().map(|&(_, mib)| mib).sum()
}

/// The best figure of what a loaded model's replicas hold, and how it was obtained.
fn held_figure(entry: &ModelEntry, slot: &Slot) -> Option<(u64, VramMethod)> {
    let replicas = slot.phase.loaded_replicas().max(1);
    admission_figure(entry, &slot.vram, &slot.effective, replicas, &slot.load_override)
}

/// Who holds memory on which GPU: each engine's process tree, then `hangard`'s own process,
/// by GPU and largest first.
fn holders(gpus: &[GpuReading], engines: Vec<(ModelName, Vec<u32>)>) -> Vec<GpuHolder> {
    let mut holders = Vec::new();
    let trees = engines.into_iter().map(|(name, roots)| {
        let pids: Vec<u32> = roots.into_iter().flat_map(hangar_gpu::process_tree).collect();
        (Some(name), pids)
    });
    for (model, pids) in trees.chain([(None, vec![std::process::id()])]) {
        let Some(tree) = hangar_gpu::tree_memory(gpus, &pids) else { continue };
        for (gpu, mib) in tree.per_gpu {
            holders.push(GpuHolder { gpu, model: model.clone(), mib });
        }
    }
    holders.sort_by(|a, b| (a.gpu, b.mib, &a.model).cmp(&(b.gpu, a.mib, &b.model)));
    holders
}

#[cfg(test)]
mod tests {
    use super::load_delta;

    #[test]
    fn a_loads_delta_is_per_gpu_and_never_negative() {
        let before = vec![(0, 1000), (1, 5000), (2, 700)];
        let after = vec![(0, 4000), (1, 4500), (3, 100)];
        // GPU 1 went down (another model's release landed): it took nothing; GPUs read
        // only once are left out.
        assert_eq!(load_delta(&before, &after), [(0, 3000), (1, 0)]);
    }
}
