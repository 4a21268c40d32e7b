//! The policy itself: [`plan_load`] and [`plan_retry_after_failure`].

use std::cmp::Ordering;

use hangar_config::{MaxLoadedModels, ModelName};

use crate::plan::{
    EvictionPlan, EvictionReason, Incoming, LoadFailure, LoadedModel, Memory, Victim, VramShortfall,
};

/// Least recently used first; ties break by name so the plan never depends on the order of
/// the input slice.
fn lru(a: &LoadedModel, b: &LoadedModel) -> Ordering {
    (a.last_use, &a.name).cmp(&(b.last_use, &b.name))
}

/// Plan the evictions needed before loading `incoming`.
///
/// - If `incoming` is already in `loaded`, the plan is empty.
/// - If `incoming` uses an exclusive device, every loaded model using one is a victim
///   ([`EvictionReason::ExclusiveDevice`]), whatever its type.
/// - Then, if the models of `incoming`'s type that remain leave no free slot under
///   `limits`, exactly as many of them as are needed to free one slot are victims
///   ([`EvictionReason::SlotLimit`]): idle ones first (sleeping ones before awake ones),
///   least recently used first, then busy ones (marked [`Victim::wait_for_drain`]) least
///   recently used first. Models of other types are never slot victims.
///
/// Victims are ordered exclusive-device victims first (least recently used first), then
/// slot victims in the order they were chosen.
///
/// Held models (pinned or leased) are never victims: when the load needs one of them gone
/// (an exclusive device it holds, or a slot that only held models could free), the plan
/// evicts nothing and names them in [`EvictionPlan::blocked_by`].
pub fn plan_load(
    loaded: &[LoadedModel],
    incoming: &Incoming,
    limits: &MaxLoadedModels,
) -> EvictionPlan {
    if loaded.iter().any(|m| m.name == incoming.name) {
        return EvictionPlan::default();
    }

    let exclusive = incoming.device.intersects(hangar_config::Device::EXCLUSIVE);
    let evicted_for_device = |m: &LoadedModel| exclusive && m.holds_exclusive_device();

    let mut holders: Vec<&LoadedModel> = loaded.iter().filter(|m| evicted_for_device(m)).collect();
    holders.sort_by(|a, b| lru(a, b));
    let mut blocked_by: Vec<ModelName> =
        holders.iter().filter(|m| m.held).map(|m| m.name.clone()).collect();

    let same_type: Vec<&LoadedModel> = loaded
        .iter()
        .filter(|m| m.model_type == incoming.model_type && !evicted_for_device(m))
        .collect();
    let limit = usize::try_from(limits.get(incoming.model_type).get()).unwrap_or(usize::MAX);
    // One slot must be free for the incoming model; `limit >= 1`, so there are always
    // enough candidates.
    let excess = (same_type.len() + 1).saturating_sub(limit);
    let (held, mut candidates): (Vec<&LoadedModel>, Vec<&LoadedModel>) =
        same_type.into_iter().partition(|m| m.held);
    if candidates.len() < excess {
        blocked_by.extend(held.iter().map(|m| m.name.clone()));
    }
    if !blocked_by.is_empty() {
        blocked_by.sort();
        blocked_by.dedup();
        return EvictionPlan { victims: Vec::new(), blocked_by, shortfall: None };
    }
    candidates.sort_by(|a, b| {
        let first = |m: &LoadedModel| (!m.is_idle(), !m.asleep);
        first(a).cmp(&first(b)).then_with(|| lru(a, b))
    });

    let victims = holders
        .into_iter()
        .map(|m| Victim::of(m, EvictionReason::ExclusiveDevice))
        .chain(
            candidates.into_iter().take(excess).map(|m| Victim::of(m, EvictionReason::SlotLimit)),
        )
        .collect();
    EvictionPlan { victims, blocked_by, shortfall: None }
}

/// [`plan_load`], then room in the GPU memory budget: when `memory` says the incoming model
/// does not fit, even counting what the planned victims free, more loaded models are
/// victims ([`EvictionReason::VramBudget`]) until it does — models of any type that hold
/// GPU memory ([`LoadedModel::vram_mib`] > 0), idle ones first, least recently used first,
/// then busy ones ([`Victim::wait_for_drain`]). Held models are never victims. When even
/// every candidate would not make room, the plan evicts nothing and says what is missing
/// ([`EvictionPlan::shortfall`]). A model already loaded, or a plan blocked by held models,
/// is answered as [`plan_load`] answers it.
pub fn plan_load_within(
    loaded: &[LoadedModel],
    incoming: &Incoming,
    limits: &MaxLoadedModels,
    memory: &Memory,
) -> EvictionPlan {
    let plan = plan_load(loaded, incoming, limits);
    if plan.is_blocked() || loaded.iter().any(|m| m.name == incoming.name) {
        return plan;
    }
    fit_memory(plan, loaded, memory)
}

/// The room a second copy of the loaded model `name` needs: a reload or a weight update
/// loads the new runtimes next to the old ones, so it takes no slot, only memory. Like
/// [`plan_load_within`]'s memory part, with `name` itself held: it is never a victim, and the
/// shortfall lists it as a holder.
pub fn plan_second_copy(loaded: &[LoadedModel], name: &ModelName, memory: &Memory) -> EvictionPlan {
    let loaded: Vec<LoadedModel> = loaded
        .iter()
        .map(|m| LoadedModel { held: m.held || m.name == *name, ..m.clone() })
        .collect();
    fit_memory(EvictionPlan::default(), &loaded, memory)
}

/// Adds victims to `plan` until `memory` says the incoming model fits, counting what the
/// plan's victims free: models that hold GPU memory and are not held, idle ones first,
/// least recently used first, then busy ones. When even every candidate would not make
/// room, the plan evicts nothing and says what is missing.
fn fit_memory(mut plan: EvictionPlan, loaded: &[LoadedModel], memory: &Memory) -> EvictionPlan {
    let vram = |name: &ModelName| loaded.iter().find(|m| m.name == *name).map_or(0, |m| m.vram_mib);
    let need = i128::from(memory.needed_mib);
    let mut free =
        i128::from(memory.free_mib) + plan.names().map(|n| i128::from(vram(n))).sum::<i128>();
    let mut candidates: Vec<&LoadedModel> = loaded
        .iter()
        .filter(|m| !m.held && m.vram_mib > 0 && !plan.contains(m.name.as_str()))
        .collect();
    candidates.sort_by(|a, b| (!a.is_idle()).cmp(&!b.is_idle()).then_with(|| lru(a, b)));
    let mut candidates = candidates.into_iter();
    while free < need {
        let Some(m) = candidates.next() else {
            let mut holders: Vec<(ModelName, u64, bool)> = loaded
                .iter()
                .filter(|m| m.vram_mib > 0)
                .map(|m| (m.name.clone(), m.vram_mib, m.held))
                .collect();
            holders.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            let shortfall = VramShortfall {
                needed_mib: memory.needed_mib,
                free_mib: memory.free_mib,
                missing_mib: u64::try_from(need - free).unwrap_or(u64::MAX),
                holders,
                gpus: Vec::new(),
                gpus_needed: 1,
            };
            return EvictionPlan {
                victims: Vec::new(),
                blocked_by: Vec::new(),
                shortfall: Some(shortfall),
            };
        };
        free += i128::from(m.vram_mib);
        plan.victims.push(Victim::of(m, EvictionReason::VramBudget));
    }
    plan
}

/// After the first load attempt of `failed` failed, plan the retry.
///
/// `None`: do not retry — the failure was [`LoadFailure::NotFound`], which evicting cannot
/// fix; evict nothing and fail at once. `Some(plan)`: evict every loaded model except
/// `failed` itself and held ones, of every type, on a device `failed` occupies (a CPU
/// model's failure evicts no model on a GPU alone), least recently used first
/// ([`EvictionReason::LoadFailureRetry`]; busy ones marked [`Victim::wait_for_drain`]),
/// then retry the load once.
pub fn plan_retry_after_failure(
    loaded: &[LoadedModel],
    failed: &Incoming,
    failure: LoadFailure,
) -> Option<EvictionPlan> {
    match failure {
        LoadFailure::NotFound => None,
        LoadFailure::Other => {
            let mut others: Vec<&LoadedModel> = loaded
                .iter()
                .filter(|m| m.name != failed.name && !m.held && m.device.intersects(failed.device))
                .collect();
            others.sort_by(|a, b| lru(a, b));
            let victims = others
                .into_iter()
                .map(|m| Victim::of(m, EvictionReason::LoadFailureRetry))
                .collect();
            Some(EvictionPlan { victims, blocked_by: Vec::new(), shortfall: None })
        }
    }
}
