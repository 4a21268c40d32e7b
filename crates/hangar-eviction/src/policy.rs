//! The policy itself: [`plan_load`] and [`plan_retry_after_failure`].

use std::cmp::Ordering;

use hangar_config::{MaxLoadedModels, ModelName};

use crate::plan::{EvictionPlan, EvictionReason, Incoming, LoadFailure, LoadedModel, Victim};

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
///   ([`EvictionReason::SlotLimit`]): idle ones first, least recently used first, then busy
///   ones (marked [`Victim::wait_for_drain`]) least recently used first. Models of other
///   types are never slot victims.
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
        return EvictionPlan { victims: Vec::new(), blocked_by };
    }
    candidates.sort_by(|a, b| (!a.is_idle()).cmp(&!b.is_idle()).then_with(|| lru(a, b)));

    let victims = holders
        .into_iter()
        .map(|m| Victim::of(m, EvictionReason::ExclusiveDevice))
        .chain(
            candidates.into_iter().take(excess).map(|m| Victim::of(m, EvictionReason::SlotLimit)),
        )
        .collect();
    EvictionPlan { victims, blocked_by }
}

/// After the first load attempt of `failed` failed, plan the retry.
///
/// `None`: do not retry — the failure was [`LoadFailure::NotFound`], which evicting cannot
/// fix; evict nothing and fail at once. `Some(plan)`: evict every loaded model except
/// `failed` itself and held ones, of every type, least recently used first
/// ([`EvictionReason::LoadFailureRetry`]; busy ones marked [`Victim::wait_for_drain`]),
/// then retry the load once.
pub fn plan_retry_after_failure(
    loaded: &[LoadedModel],
    failed: &ModelName,
    failure: LoadFailure,
) -> Option<EvictionPlan> {
    match failure {
        LoadFailure::NotFound => None,
        LoadFailure::Other => {
            let mut others: Vec<&LoadedModel> =
                loaded.iter().filter(|m| m.name != *failed && !m.held).collect();
            others.sort_by(|a, b| lru(a, b));
            let victims = others
                .into_iter()
                .map(|m| Victim::of(m, EvictionReason::LoadFailureRetry))
                .collect();
            Some(EvictionPlan { victims, blocked_by: Vec::new() })
        }
    }
}
