//! Making room for a load: the eviction plan (slots, exclusive devices, the VRAM budget)
//! made when the load leaves the queue, and its execution as graceful unloads.

use std::sync::Arc;

use hangar_backend::LoadOverride;
use hangar_config::{ModelConfig, ModelName};
use hangar_eviction::{
    EvictionPlan, Incoming, LoadedModel, VramShortfall, plan_load, plan_load_within,
    plan_second_copy,
};
use hangar_lifecycle::ModelState;
use tokio::time::Instant;

use crate::entry::ModelEntry;
use crate::error::ManagerError;
use crate::events::Events;
use crate::journal::EventKind;
use crate::manager::Manager;
use crate::unload::UnloadCause;

/// What a grant is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ask {
    /// A load of a model that is not loaded: a slot and its memory.
    Load,
    /// New runtimes next to the model's own (a reload, a weight update): memory only; the
    /// model is held meanwhile.
    SecondCopy,
}

/// Why a grant was refused; nothing was evicted.
#[derive(Debug, Clone)]
pub(crate) enum Refusal {
    /// Only evicting these held (pinned, leased, being replaced) models would make room.
    Held(Vec<String>),
    /// The model cannot fit in the VRAM budget.
    Vram(VramShortfall),
}

impl Refusal {
    /// The refusal as the caller gets it.
    pub(crate) fn into_error(self, model: &str) -> ManagerError {
        let model = model.to_owned();
        match self {
            Self::Held(held) => ManagerError::SlotsPinned { model, held },
            Self::Vram(short) => {
                ManagerError::InsufficientVram { model, shortfall: Box::new(short) }
            }
        }
    }
}

/// The one decision every path that creates runtimes goes through: the eviction plan for
/// `ask` given the loaded models and, under a VRAM budget, the memory (`None`: no admission
/// by memory).
pub(crate) fn decide(
    ask: Ask,
    loaded: &[LoadedModel],
    incoming: &Incoming,
    limits: &hangar_config::MaxLoadedModels,
    memory: Option<&hangar_eviction::Memory>,
) -> Result<EvictionPlan, Refusal> {
    let plan = match (ask, memory) {
        (Ask::Load, Some(memory)) => plan_load_within(loaded, incoming, limits, memory),
        (Ask::Load, None) => plan_load(loaded, incoming, limits),
        (Ask::SecondCopy, Some(memory)) => plan_second_copy(loaded, &incoming.name, memory),
        (Ask::SecondCopy, None) => EvictionPlan::default(),
    };
    if let Some(short) = plan.shortfall {
        return Err(Refusal::Vram(short));
    }
    if plan.is_blocked() {
        return Err(Refusal::Held(plan.blocked_by.iter().map(ToString::to_string).collect()));
    }
    Ok(plan)
}

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

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use hangar_config::{Device, MaxLoadedModels, ModelType};
    use hangar_eviction::Memory;

    use super::*;

    fn loaded(name: &str, secs: u64, vram_mib: u64, held: bool) -> LoadedModel {
        static BASE: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        LoadedModel {
            name: ModelName::new(name).unwrap(),
            model_type: ModelType::Llm,
            device: Device::GPU,
            last_use: *BASE.get_or_init(Instant::now) + Duration::from_secs(secs),
            inflight: 0,
            held,
            vram_mib,
        }
    }

    /// One row of the grant's table: what is asked, what is loaded, the memory (free,
    /// needed) under a budget, and the answer as victims or the refusal's summary.
    struct Row {
        what: &'static str,
        ask: Ask,
        loaded: Vec<LoadedModel>,
        slots: u32,
        memory: Option<(i64, u64)>,
        answer: Result<Vec<&'static str>, String>,
    }

    fn summary(refusal: &Refusal) -> String {
        match refusal {
            Refusal::Held(held) => format!("held: {}", held.join(",")),
            Refusal::Vram(short) => format!("vram: {} missing", short.missing_mib),
        }
    }

    #[test]
    fn every_path_that_creates_runtimes_is_granted_by_one_table() {
        let rows = [
            Row {
                what: "a load with a free slot and no budget evicts nothing",
                ask: Ask::Load,
                loaded: vec![loaded("a", 1, 0, false)],
                slots: 2,
                memory: None,
                answer: Ok(vec![]),
            },
            Row {
                what: "a load without a free slot evicts the least recently used",
                ask: Ask::Load,
                loaded: vec![loaded("b", 2, 0, false), loaded("a", 1, 0, false)],
                slots: 2,
                memory: None,
                answer: Ok(vec!["a"]),
            },
            Row {
                what: "a model being replaced is held: the load evicts the other one",
                ask: Ask::Load,
                loaded: vec![loaded("replaced", 1, 0, true), loaded("b", 2, 0, false)],
                slots: 2,
                memory: None,
                answer: Ok(vec!["b"]),
            },
            Row {
                what: "only held models in the way: refused, naming them",
                ask: Ask::Load,
                loaded: vec![loaded("replaced", 1, 0, true)],
                slots: 1,
                memory: None,
                answer: Err("held: replaced".into()),
            },
            Row {
                what: "a load short of memory even after every eviction is refused",
                ask: Ask::Load,
                loaded: vec![loaded("a", 1, 1000, false)],
                slots: 4,
                memory: Some((500, 3000)),
                answer: Err("vram: 1500 missing".into()),
            },
            Row {
                what: "a second copy without a budget needs nothing, whatever the slots",
                ask: Ask::SecondCopy,
                loaded: vec![loaded("new", 1, 4000, false), loaded("b", 2, 0, false)],
                slots: 1,
                memory: None,
                answer: Ok(vec![]),
            },
            Row {
                what: "a second copy evicts others for memory, never a slot",
                ask: Ask::SecondCopy,
                loaded: vec![
                    loaded("new", 1, 2000, false),
                    loaded("b", 2, 2500, false),
                    loaded("c", 3, 500, false),
                ],
                slots: 1,
                memory: Some((1100, 2000)),
                answer: Ok(vec!["b"]),
            },
            Row {
                what: "a second copy that only the model's own memory could make room for",
                ask: Ask::SecondCopy,
                loaded: vec![loaded("new", 1, 4000, false)],
                slots: 4,
                memory: Some((1600, 4000)),
                answer: Err("vram: 2400 missing".into()),
            },
        ];
        for row in rows {
            let nz = |n| std::num::NonZeroU32::new(n).unwrap();
            let limits = MaxLoadedModels { llm: nz(row.slots), embedding: nz(1), reranking: nz(1) };
            let incoming = Incoming {
                name: ModelName::new("new").unwrap(),
                model_type: ModelType::Llm,
                device: Device::GPU,
            };
            let memory = row.memory.map(|(free_mib, needed_mib)| Memory { free_mib, needed_mib });
            let got = decide(row.ask, &row.loaded, &incoming, &limits, memory.as_ref());
            let got = got
                .map(|plan| plan.victims.iter().map(|v| v.name.to_string()).collect::<Vec<_>>())
                .map_err(|r| summary(&r));
            let want = row.answer.map(|v| v.into_iter().map(String::from).collect::<Vec<_>>());
            assert_eq!(got, want, "{}", row.what);
        }
    }
}
