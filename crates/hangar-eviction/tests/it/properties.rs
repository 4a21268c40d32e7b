//! Property tests of the eviction policy over random loaded sets, limits and incoming
//! models. Each test's doc comment states the invariant it checks.

use std::collections::{HashMap, HashSet};
use std::num::NonZeroU32;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use hangar_config::{Device, MaxLoadedModels, ModelName, ModelType};
use hangar_eviction::{
    EvictionPlan, EvictionReason, Incoming, LoadFailure, LoadedModel, Memory, plan_load,
    plan_load_within, plan_retry_after_failure,
};
use proptest::prelude::*;

fn base() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

fn name(s: &str) -> ModelName {
    ModelName::new(s).unwrap()
}

fn arb_type() -> impl Strategy<Value = ModelType> {
    prop::sample::select(ModelType::ALL.to_vec())
}

fn arb_device() -> impl Strategy<Value = Device> {
    (0u8..8).prop_map(Device::from_bits_truncate)
}

fn arb_limits() -> impl Strategy<Value = MaxLoadedModels> {
    let nz = || (1u32..=4).prop_map(|n| NonZeroU32::new(n).unwrap());
    (nz(), nz(), nz()).prop_map(|(llm, embedding, reranking)| MaxLoadedModels {
        llm,
        embedding,
        reranking,
    })
}

/// Up to 10 loaded models with unique names, in random order. `last_use` comes from a
/// small range of offsets from one base instant so that ties are common; a third are busy.
fn arb_loaded() -> impl Strategy<Value = Vec<LoadedModel>> {
    let inflight = prop_oneof![2 => Just(0u32), 1 => 1u32..4];
    let vram = prop_oneof![1 => Just(0u64), 3 => 1u64..4000];
    prop::collection::vec((arb_type(), arb_device(), 0u64..6, inflight, vram), 0..10)
        .prop_map(|raw| {
            raw.into_iter()
                .enumerate()
                .map(|(i, (model_type, device, secs, inflight, vram_mib))| LoadedModel {
                    name: name(&format!("m{i}")),
                    model_type,
                    device,
                    last_use: base() + Duration::from_secs(secs),
                    inflight,
                    held: false,
                    vram_mib,
                    asleep: false,
                    sleep_frees_mib: 0,
                })
                .collect::<Vec<_>>()
        })
        .prop_shuffle()
}

/// A new model (its name is never among the loaded ones).
fn arb_incoming() -> impl Strategy<Value = Incoming> {
    (arb_type(), arb_device()).prop_map(|(model_type, device)| Incoming {
        name: name("incoming"),
        model_type,
        device,
    })
}

/// Loaded sets that respect `limits` and have at most one exclusive-device holder: a
/// random set with the models that break either rule dropped.
fn arb_valid_state() -> impl Strategy<Value = (Vec<LoadedModel>, MaxLoadedModels)> {
    (arb_loaded(), arb_limits()).prop_map(|(loaded, limits)| {
        let mut per_type: HashMap<ModelType, u32> = HashMap::new();
        let mut exclusive_held = false;
        let loaded = loaded
            .into_iter()
            .filter(|m| {
                let count = per_type.entry(m.model_type).or_default();
                let exclusive = m.device.intersects(Device::EXCLUSIVE);
                if *count >= limits.get(m.model_type).get() || (exclusive && exclusive_held) {
                    return false;
                }
                *count += 1;
                exclusive_held |= exclusive;
                true
            })
            .collect();
        (loaded, limits)
    })
}

/// The loaded set after the plan is executed and `incoming` is loaded: `(type, device)`.
fn after(
    loaded: &[LoadedModel],
    plan: &EvictionPlan,
    incoming: &Incoming,
) -> Vec<(ModelType, Device)> {
    loaded
        .iter()
        .filter(|m| !plan.contains(m.name.as_str()))
        .map(|m| (m.model_type, m.device))
        .chain([(incoming.model_type, incoming.device)])
        .collect()
}

fn lru_key(m: &LoadedModel) -> (Instant, &ModelName) {
    (m.last_use, &m.name)
}

fn find<'a>(loaded: &'a [LoadedModel], name: &ModelName) -> &'a LoadedModel {
    loaded.iter().find(|m| m.name == *name).expect("victim is loaded")
}

/// The type-T models left after the exclusive-device victims, and the plan's slot victims
/// among them.
fn slot_view<'a>(
    loaded: &'a [LoadedModel],
    plan: &EvictionPlan,
    ty: ModelType,
) -> (Vec<&'a LoadedModel>, Vec<&'a LoadedModel>) {
    let reason = |m: &LoadedModel| plan.get(m.name.as_str()).map(|v| v.reason);
    let candidates: Vec<_> = loaded
        .iter()
        .filter(|m| m.model_type == ty && reason(m) != Some(EvictionReason::ExclusiveDevice))
        .collect();
    let victims = candidates
        .iter()
        .copied()
        .filter(|m| reason(m) == Some(EvictionReason::SlotLimit))
        .collect();
    (candidates, victims)
}

proptest! {
    /// (a) If every type's count was within its limit before, then after the victims are
    /// unloaded and the incoming model is loaded, every type's count is still within its
    /// limit.
    #[test]
    fn load_keeps_every_type_within_its_limit(
        (loaded, limits) in arb_valid_state(),
        incoming in arb_incoming(),
    ) {
        let plan = plan_load(&loaded, &incoming, &limits);
        let after = after(&loaded, &plan, &incoming);
        for ty in ModelType::ALL {
            let count = after.iter().filter(|(t, _)| *t == ty).count();
            prop_assert!(count <= limits.get(ty).get() as usize, "{ty}: {count} in {plan:?}");
        }
    }

    /// (b) If at most one model held an exclusive device before, at most one holds it after
    /// the load.
    #[test]
    fn load_leaves_at_most_one_exclusive_holder(
        (loaded, limits) in arb_valid_state(),
        incoming in arb_incoming(),
    ) {
        let plan = plan_load(&loaded, &incoming, &limits);
        let holders = after(&loaded, &plan, &incoming)
            .into_iter()
            .filter(|(_, d)| d.intersects(Device::EXCLUSIVE))
            .count();
        prop_assert!(holders <= 1, "{holders} holders after {plan:?}");
    }

    /// (c) A victim of another type than the incoming model's is always an
    /// exclusive-device victim, and exclusive-device victims exist only for an incoming
    /// model that needs an exclusive device and only among its holders. A load never plans
    /// `LoadFailureRetry` victims.
    #[test]
    fn only_exclusive_victims_cross_types(
        loaded in arb_loaded(),
        limits in arb_limits(),
        incoming in arb_incoming(),
    ) {
        let plan = plan_load(&loaded, &incoming, &limits);
        for v in &plan.victims {
            let m = find(&loaded, &v.name);
            match v.reason {
                EvictionReason::SlotLimit => prop_assert_eq!(m.model_type, incoming.model_type),
                EvictionReason::ExclusiveDevice => {
                    prop_assert!(incoming.device.intersects(Device::EXCLUSIVE));
                    prop_assert!(m.device.intersects(Device::EXCLUSIVE));
                }
                other => prop_assert!(false, "unexpected reason {other}"),
            }
        }
    }

    /// (d) Every victim is a loaded model, appears once, and waits for drain exactly when
    /// it has in-flight work.
    #[test]
    fn victims_are_loaded_unique_and_drained_when_busy(
        loaded in arb_loaded(),
        limits in arb_limits(),
        incoming in arb_incoming(),
    ) {
        let plan = plan_load(&loaded, &incoming, &limits);
        let mut seen = HashSet::new();
        for v in &plan.victims {
            prop_assert!(seen.insert(&v.name), "{} twice in {plan:?}", v.name);
            prop_assert_eq!(v.wait_for_drain, find(&loaded, &v.name).inflight > 0);
        }
    }

    /// (e) Minimality: the number of slot victims is exactly
    /// `max(0, count of type T left after the exclusive-device victims + 1 - limit(T))`,
    /// and every holder of an exclusive device is a victim iff the incoming model needs one.
    #[test]
    fn slot_victims_are_minimal(
        loaded in arb_loaded(),
        limits in arb_limits(),
        incoming in arb_incoming(),
    ) {
        let plan = plan_load(&loaded, &incoming, &limits);
        let (candidates, victims) = slot_view(&loaded, &plan, incoming.model_type);
        let limit = limits.get(incoming.model_type).get() as usize;
        prop_assert_eq!(victims.len(), (candidates.len() + 1).saturating_sub(limit));
        let slot_total =
            plan.victims.iter().filter(|v| v.reason == EvictionReason::SlotLimit).count();
        prop_assert_eq!(slot_total, victims.len());
        let needs_exclusive = incoming.device.intersects(Device::EXCLUSIVE);
        for m in loaded.iter().filter(|m| m.device.intersects(Device::EXCLUSIVE)) {
            let reason = plan.get(m.name.as_str()).map(|v| v.reason);
            prop_assert_eq!(
                reason == Some(EvictionReason::ExclusiveDevice),
                needs_exclusive,
                "{:?} in {:?}", m, plan
            );
        }
    }

    /// (f) Idle preference: if some slot victim is busy, every idle type-T model that is
    /// not an exclusive-device victim is a slot victim too.
    #[test]
    fn busy_slot_victims_only_when_every_idle_one_is_taken(
        loaded in arb_loaded(),
        limits in arb_limits(),
        incoming in arb_incoming(),
    ) {
        let plan = plan_load(&loaded, &incoming, &limits);
        let (candidates, victims) = slot_view(&loaded, &plan, incoming.model_type);
        if victims.iter().any(|m| m.inflight > 0) {
            for m in candidates.iter().filter(|m| m.inflight == 0) {
                prop_assert!(plan.contains(m.name.as_str()), "idle {} spared in {plan:?}", m.name);
            }
        }
    }

    /// (g) LRU: no idle type-T model that is spared is older (by `last_use`, then name) than
    /// an idle slot victim; likewise among busy ones.
    #[test]
    fn slot_victims_are_least_recently_used(
        loaded in arb_loaded(),
        limits in arb_limits(),
        incoming in arb_incoming(),
    ) {
        let plan = plan_load(&loaded, &incoming, &limits);
        let (candidates, victims) = slot_view(&loaded, &plan, incoming.model_type);
        for v in &victims {
            for m in candidates.iter().filter(|m| !plan.contains(m.name.as_str())) {
                if (m.inflight == 0) == (v.inflight == 0) {
                    prop_assert!(lru_key(m) > lru_key(v), "spared {} older than {}", m.name, v.name);
                }
            }
        }
    }

    /// (h) Determinism: the plan does not depend on the order of the loaded models.
    #[test]
    fn plan_ignores_input_order(
        (loaded, shuffled) in arb_loaded()
            .prop_flat_map(|l| (Just(l.clone()), Just(l).prop_shuffle())),
        limits in arb_limits(),
        incoming in arb_incoming(),
    ) {
        prop_assert_eq!(
            plan_load(&loaded, &incoming, &limits),
            plan_load(&shuffled, &incoming, &limits)
        );
    }

    /// (i) Loading a model that is already loaded plans nothing, whatever the limits.
    #[test]
    fn already_loaded_plans_nothing(
        loaded in arb_loaded(),
        limits in arb_limits(),
        pick in any::<prop::sample::Index>(),
        device in arb_device(),
    ) {
        prop_assume!(!loaded.is_empty());
        let m = pick.get(&loaded);
        let incoming = Incoming { name: m.name.clone(), model_type: m.model_type, device };
        prop_assert!(plan_load(&loaded, &incoming, &limits).is_empty());
    }

    /// (j) Retry after failure: not-found evicts nothing and does not retry; any other
    /// failure evicts every loaded model but the failed one, each once, least recently used
    /// first, busy ones waiting for drain.
    #[test]
    fn retry_evicts_everything_but_the_failed_model(
        loaded in arb_loaded(),
        pick in any::<prop::sample::Index>(),
        failed_is_loaded in any::<bool>(),
    ) {
        let failed = if failed_is_loaded && !loaded.is_empty() {
            pick.get(&loaded).name.clone()
        } else {
            name("incoming")
        };
        // On every device: each other model on a device shares one with it.
        let failed = Incoming { name: failed, model_type: ModelType::Llm, device: Device::all() };
        prop_assert_eq!(plan_retry_after_failure(&loaded, &failed, LoadFailure::NotFound), None);
        let plan = plan_retry_after_failure(&loaded, &failed, LoadFailure::Other).unwrap();
        let failed = failed.name;
        let others = || loaded.iter().filter(|m| m.name != failed && !m.device.is_empty());
        let expected: HashSet<_> = others().map(|m| &m.name).collect();
        prop_assert_eq!(plan.names().collect::<HashSet<_>>(), expected);
        prop_assert_eq!(plan.len(), others().count());
        let victims: Vec<_> = plan.victims.iter().map(|v| (v, find(&loaded, &v.name))).collect();
        for (v, m) in &victims {
            prop_assert_eq!(v.reason, EvictionReason::LoadFailureRetry);
            prop_assert_eq!(v.wait_for_drain, m.inflight > 0);
        }
        for pair in victims.windows(2) {
            prop_assert!(lru_key(pair[0].1) < lru_key(pair[1].1));
        }
    }

    /// (h) Held models (pinned by config or leased) are never victims, of a load or of a
    /// retry after a failure. A load's plan either evicts only unheld models — and then
    /// every type stays within its limit and at most one model holds an exclusive device —
    /// or is blocked: it evicts nothing and names exactly the held models the load would
    /// need gone (held exclusive-device holders for an exclusive load, or every held model
    /// of the type when the unheld ones cannot free a slot).
    #[test]
    fn held_models_are_never_victims_and_block_only_when_needed(
        (loaded, limits) in arb_valid_state(),
        held in prop::collection::vec(any::<bool>(), 10),
        incoming in arb_incoming(),
    ) {
        let loaded: Vec<LoadedModel> = loaded
            .into_iter()
            .zip(held)
            .map(|(m, held)| LoadedModel { held, ..m })
            .collect();
        let plan = plan_load(&loaded, &incoming, &limits);
        for v in &plan.victims {
            prop_assert!(!find(&loaded, &v.name).held, "held {} evicted: {plan:?}", v.name);
        }
        let exclusive = incoming.device.intersects(Device::EXCLUSIVE);
        let holds = |m: &LoadedModel| exclusive && m.device.intersects(Device::EXCLUSIVE);
        let same_type: Vec<&LoadedModel> =
            loaded.iter().filter(|m| m.model_type == incoming.model_type && !holds(m)).collect();
        let excess = (same_type.len() + 1).saturating_sub(limits.get(incoming.model_type).get() as usize);
        let unheld = same_type.iter().filter(|m| !m.held).count();
        let mut want: Vec<ModelName> = loaded.iter().filter(|m| m.held && holds(m)).map(|m| m.name.clone()).collect();
        if unheld < excess {
            want.extend(same_type.iter().filter(|m| m.held).map(|m| m.name.clone()));
        }
        want.sort();
        want.dedup();
        prop_assert_eq!(&plan.blocked_by, &want);
        if plan.is_blocked() {
            prop_assert!(plan.victims.is_empty());
        } else {
            let after = after(&loaded, &plan, &incoming);
            for ty in ModelType::ALL {
                let count = after.iter().filter(|(t, _)| *t == ty).count();
                prop_assert!(count <= limits.get(ty).get() as usize, "{ty}: {count} in {plan:?}");
            }
            let holders = after.iter().filter(|(_, d)| d.intersects(Device::EXCLUSIVE)).count();
            prop_assert!(holders <= 1);
        }
        if let Some(retry) = plan_retry_after_failure(&loaded, &incoming, LoadFailure::Other) {
            prop_assert!(retry.victims.iter().all(|v| !find(&loaded, &v.name).held));
            // Only models on a device the failed one occupies.
            prop_assert!(retry.victims.iter().all(|v| find(&loaded, &v.name).device.intersects(incoming.device)));
        }
    }

    /// (m) Admission by GPU memory. With any free budget (possibly negative) and need:
    /// - the memory plan starts with exactly `plan_load`'s victims (slot and device rules
    ///   come first) and is blocked exactly when `plan_load` is;
    /// - a plan short of VRAM evicts nothing, and its missing amount is exactly what even
    ///   evicting every unheld model holding memory would leave missing (> 0);
    /// - otherwise the victims' memory plus the free budget covers the need, and the plan is
    ///   minimal: without its last memory victim it would not;
    /// - memory victims are unheld, hold memory, and come idle first, least recently used
    ///   first within idle and within busy; each is marked to drain exactly when busy.
    #[test]
    fn memory_victims_free_exactly_enough_in_lru_order(
        (loaded, limits) in arb_valid_state(),
        held in prop::collection::vec(any::<bool>(), 10),
        incoming in arb_incoming(),
        free_mib in -3000i64..6000,
        needed_mib in 0u64..9000,
    ) {
        let loaded: Vec<LoadedModel> = loaded
            .into_iter()
            .zip(held)
            .map(|(m, held)| LoadedModel { held, ..m })
            .collect();
        let memory = Memory { free_mib, needed_mib };
        let base_plan = plan_load(&loaded, &incoming, &limits);
        let plan = plan_load_within(&loaded, &incoming, &limits, &memory);
        if base_plan.is_blocked() {
            prop_assert_eq!(&plan, &base_plan);
            return Ok(());
        }
        let vram = |n: &ModelName| i128::from(find(&loaded, n).vram_mib);
        if let Some(short) = &plan.shortfall {
            prop_assert!(plan.victims.is_empty() && !plan.is_blocked());
            let all: i128 = loaded.iter().filter(|m| !m.held).map(|m| i128::from(m.vram_mib)).sum();
            let missing = i128::from(needed_mib) - i128::from(free_mib) - all;
            prop_assert!(missing > 0);
            prop_assert_eq!(i128::from(short.missing_mib), missing);
            let holders: Vec<&ModelName> = short.holders.iter().map(|h| &h.0).collect();
            prop_assert_eq!(holders.len(), loaded.iter().filter(|m| m.vram_mib > 0).count());
            return Ok(());
        }
        prop_assert_eq!(&plan.victims[..base_plan.victims.len()], &base_plan.victims[..]);
        let freed: i128 = plan.names().map(vram).sum();
        prop_assert!(i128::from(free_mib) + freed >= i128::from(needed_mib), "{plan:?}");
        let extra = &plan.victims[base_plan.victims.len()..];
        if let Some(last) = extra.last() {
            prop_assert!(i128::from(free_mib) + freed - vram(&last.name) < i128::from(needed_mib));
        }
        for v in extra {
            let m = find(&loaded, &v.name);
            prop_assert_eq!(v.reason, EvictionReason::VramBudget);
            prop_assert!(!m.held && m.vram_mib > 0);
            prop_assert_eq!(v.wait_for_drain, m.inflight > 0);
        }
        for pair in extra.windows(2) {
            let (a, b) = (find(&loaded, &pair[0].name), find(&loaded, &pair[1].name));
            prop_assert!((a.inflight > 0, lru_key(a)) < (b.inflight > 0, lru_key(b)));
        }
    }
}
