//! Making room for a load: the eviction plan (slots, exclusive devices, the VRAM budget)
//! made when the load leaves the queue, and its execution as graceful unloads.

use std::sync::Arc;

use hangar_backend::LoadOverride;
use hangar_config::{ModelConfig, ModelName};
use hangar_eviction::{EvictionPlan, Incoming, LoadedModel};
use hangar_lifecycle::ModelState;
use tokio::time::Instant;

use crate::entry::ModelEntry;
use crate::events::Events;
use crate::grant::{Ask, Refusal, decide};
use crate::journal::EventKind;
use crate::manager::Manager;
use crate::unload::UnloadCause;

impl Manager {
    /// Plans and executes the evictions `ask` for `model` (`replicas` replicas under
    /// `load_override`) needs, after
    /// the memory of earlier unloads shows as released, and waits for the victims' memory
    /// too. `Ok(settled)`: whether every release showed in time (else a GPU delta measured
    /// across the load would be wrong).
    ///
    /// # Errors
    /// The [`Refusal`] when held models are in the way or the model cannot fit in the VRAM
    /// budget; nothing was evicted.
    pub(crate) async fn make_room(
        &self,
        entry: &Arc<ModelEntry>,
        model: &Arc<ModelConfig>,
        replicas: u32,
        load_override: &LoadOverride,
        ask: Ask,
    ) -> Result<bool, Refusal> {
        let settled = self.wait_for_release(entry).await;
        let memory = self.memory_for(entry, model, replicas, load_override).await;
        let incoming = Incoming {
            name: entry.config.name.clone(),
            model_type: entry.config.model_type,
            device: entry.config.device,
        };
        let loaded = self.loaded_models();
        let plan = decide(ask, &loaded, &incoming, &self.inner.limits, memory.as_ref())?;
        self.execute(plan, &entry.config.name).await.map_err(Refusal::Held)?;
        Ok(self.wait_for_release(entry).await && settled)
    }

    /// Loaded models as the eviction policy sees them.
    pub(crate) fn loaded_models(&self) -> Vec<LoadedModel> {
        let mut loaded = Vec::new();
        for entry in &self.inner.order {
            let slot = entry.lock();
            if slot.lifecycle.state() != ModelState::Loaded {
                continue;
            }
            let busy = slot.scheduler.as_ref().map_or(0, |s| {
                let stats = s.stats();
                stats.runtime_inflight + stats.queue_depth as u32
            });
            loaded.push(LoadedModel {
                name: entry.config.name.clone(),
                model_type: entry.config.model_type,
                device: entry.config.device,
                last_use: slot.last_use.map_or_else(Instant::now, |(t, _)| t).into_std(),
                inflight: busy + slot.pins,
                held: entry.config.pinned || slot.leased() || slot.replacing > 0,
                vram_mib: crate::gpu::vram_held(entry, &slot),
            });
        }
        loaded
    }

    /// Unloads the plan's victims to make room for `incoming`.
    ///
    /// # Errors
    /// The victims a lease took hold of after the plan was made (they stay loaded).
    pub(crate) async fn execute(
        &self,
        plan: EvictionPlan,
        incoming: &ModelName,
    ) -> Result<(), Vec<String>> {
        let mut held = Vec::new();
        for victim in plan.victims {
            let Ok(entry) = self.entry(victim.name.as_str()) else { continue };
            tracing::info!(model = %victim.name, reason = %victim.reason, wait = victim.wait_for_drain, "evicting");
            let reason = victim.reason.as_str().to_owned();
            let evicted = EventKind::Evicted { reason, for_model: incoming.to_string() };
            if self.unload_entry(&entry, UnloadCause::Eviction(evicted)).await {
                Events::bump(&self.inner.events.evictions);
            } else if entry.lock().lifecycle.state() == ModelState::Loaded {
                held.push(victim.name.to_string());
            }
        }
        if held.is_empty() { Ok(()) } else { Err(held) }
    }
}
