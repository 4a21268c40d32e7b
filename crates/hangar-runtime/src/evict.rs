//! Making room for a load: the eviction plan (slots, exclusive devices, the VRAM budget)
//! made when the load leaves the queue, and its execution as graceful unloads.

use std::sync::Arc;

use hangar_config::{ModelConfig, ModelName};
use hangar_eviction::{EvictionPlan, Incoming, LoadedModel, plan_load, plan_load_within};
use hangar_lifecycle::ModelState;
use tokio::time::Instant;

use crate::entry::ModelEntry;
use crate::error::ManagerError;
use crate::events::Events;
use crate::journal::EventKind;
use crate::manager::Manager;
use crate::unload::UnloadCause;

impl Manager {
    /// Plans and executes the evictions a load of `model` (`replicas` replicas) needs, after
    /// the memory of earlier unloads shows as released, and waits for the victims' memory
    /// too. `Ok(settled)`: whether every release showed in time (else a GPU delta measured
    /// across the load would be wrong).
    ///
    /// # Errors
    /// The load's failure message when held models are in the way (`slots_pinned`, the
    /// slot's `blocked_by` says which) or the model cannot fit in the VRAM budget
    /// (`insufficient_vram`, the slot's `vram_shortfall` says why); nothing was evicted.
    pub(crate) async fn make_room(
        &self,
        entry: &Arc<ModelEntry>,
        model: &Arc<ModelConfig>,
        replicas: u32,
    ) -> Result<bool, String> {
        let settled = self.wait_for_release(entry).await;
        let load_override = entry.lock().load_override.clone();
        let memory = self.memory_for(entry, model, replicas, &load_override).await;
        let incoming = Incoming {
            name: entry.config.name.clone(),
            model_type: entry.config.model_type,
            device: entry.config.device,
        };
        let (loaded, limits) = (self.loaded_models(), &self.inner.limits);
        let plan = match &memory {
            Some(memory) => plan_load_within(&loaded, &incoming, limits, memory),
            None => plan_load(&loaded, &incoming, limits),
        };
        if let Some(short) = plan.shortfall {
            // The refusal's own words, as the caller will get them.
            let model = entry.config.name.to_string();
            let shortfall = Box::new(short.clone());
            let message = format!(
                "insufficient_vram: {}",
                ManagerError::InsufficientVram { model, shortfall }
            );
            entry.lock().vram_shortfall = Some(short);
            return Err(message);
        }
        let blocked = if plan.is_blocked() {
            Err(plan.blocked_by.iter().map(|n| n.to_string()).collect())
        } else {
            self.execute(plan, &entry.config.name).await
        };
        match blocked {
            Ok(()) => Ok(self.wait_for_release(entry).await && settled),
            Err(held) => {
                let message = format!(
                    "slots_pinned: no room without evicting pinned or leased model(s): {}",
                    held.join(", ")
                );
                entry.lock().blocked_by = held;
                Err(message)
            }
        }
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
                held: entry.config.pinned || slot.leased(),
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
