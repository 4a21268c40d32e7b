//! GPUs as separate places ([`plan_placement`]): one table test per rule, then properties
//! over 2–4 GPUs of random sizes and budgets with random single-GPU and split models. Each
//! property's doc comment states the invariant it checks.

use std::collections::HashSet;
use std::num::NonZeroU32;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use hangar_config::{Device, MaxLoadedModels, ModelName, ModelType};
use hangar_eviction::{
    EvictionReason, Fit, GpuHolding, GpuRoom, Incoming, LoadedModel, Placed, Refusal,
    plan_placement, plan_second_copy_placed,
};
use proptest::prelude::*;

const GIB: u64 = 1024;

fn base() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

fn name(s: &str) -> ModelName {
    ModelName::new(s).unwrap()
}

/// A loaded llm, idle unless `inflight`, used `secs` after the base instant.
fn model(n: &str, secs: u64, held: bool) -> LoadedModel {
    LoadedModel {
        name: name(n),
        model_type: ModelType::Llm,
        device: Device::GPU,
        last_use: base() + Duration::from_secs(secs),
        inflight: 0,
        held,
        vram_mib: 0,
        asleep: false,
        sleep_frees_mib: 0,
    }
}

fn hold(n: &str, gpu: u32, mib: u64) -> GpuHolding {
    GpuHolding { model: name(n), gpu, mib }
}

fn incoming() -> Incoming {
    Incoming { name: name("new"), model_type: ModelType::Llm, device: Device::GPU }
}

/// Room for 8 llms: slots never decide here.
fn limits() -> MaxLoadedModels {
    MaxLoadedModels::from_counts(&[8]).unwrap()
}

fn fit(needed_mib: u64, allowed: &[u32], split: u32) -> Fit {
    Fit { needed_mib, allowed: allowed.to_vec(), split }
}

fn victims(placed: &Placed) -> Vec<&str> {
    placed.plan.names().map(ModelName::as_str).collect()
}

/// [`plan_placement`] of a new llm (8 slots: slots never decide) on [`two`] GPUs.
fn place_on_two(
    loaded: &[LoadedModel],
    free: [i64; 2],
    holdings: &[GpuHolding],
    fit: Fit,
) -> Placed {
    plan_placement(loaded, &incoming(), &limits(), &two(free), holdings, &fit)
}

/// Two 16 GiB GPUs with `free` GiB free on each.
fn two(free: [i64; 2]) -> [GpuRoom; 2] {
    [GpuRoom { index: 0, free_mib: free[0] * 1024 }, GpuRoom { index: 1, free_mib: free[1] * 1024 }]
}

#[test]
fn a_model_too_big_for_each_gpu_is_refused_though_the_sum_would_hold_it() {
    // 12 GiB free on each of two cards: the pooled rule admitted 20 GiB and the load failed
    // with out of memory.
    let placed =
        plan_placement(&[], &incoming(), &limits(), &two([12, 12]), &[], &fit(20 * GIB, &[], 1));
    let Some(Refusal::NoRoom(short)) = &placed.refusal else { panic!("{placed:?}") };
    assert_eq!(
        short.iter().map(|s| (s.gpu, s.missing_mib)).collect::<Vec<_>>(),
        [(0, 8 * GIB), (1, 8 * GIB)]
    );
    assert!(placed.plan.victims.is_empty() && placed.gpus.is_empty());
}

#[test]
fn a_split_model_takes_an_even_share_on_each_gpu() {
    let placed =
        plan_placement(&[], &incoming(), &limits(), &two([12, 12]), &[], &fit(20 * GIB, &[], 2));
    assert_eq!(placed.gpus, [0, 1]);
    assert!(placed.refusal.is_none() && placed.plan.victims.is_empty());
}

#[test]
fn a_model_goes_where_there_is_room_without_evicting() {
    let loaded = [model("a", 1, false)];
    let placed = plan_placement(
        &loaded,
        &incoming(),
        &limits(),
        &two([2, 14]),
        &[hold("a", 0, 14 * GIB)],
        &fit(12 * GIB, &[], 1),
    );
    assert_eq!((placed.gpus.as_slice(), victims(&placed)), (&[1][..], vec![]));
}

#[test]
fn room_is_made_on_one_gpu_only_by_its_least_recently_used_model() {
    let loaded = [model("a", 1, false), model("b", 3, false), model("c", 2, false)];
    let holdings = [hold("a", 0, 12 * GIB), hold("b", 0, 2 * GIB), hold("c", 1, 14 * GIB)];
    let placed = place_on_two(&loaded, [2, 2], &holdings, fit(12 * GIB, &[], 1));
    // One eviction either way: `a` was used before `c`, so it goes, from GPU 0 only (`b`,
    // used last, stays beside the new model).
    assert_eq!((placed.gpus.as_slice(), victims(&placed)), (&[0][..], vec!["a"]));
    assert_eq!(placed.plan.victims[0].reason, EvictionReason::VramBudget);
    // Used at the same moment: GPU 0 after evicting `a` leaves 2 GiB free, GPU 1 after `c`
    // 4, so the most free memory decides.
    let loaded = [model("a", 1, false), model("b", 3, false), model("c", 1, false)];
    let placed = place_on_two(&loaded, [2, 2], &holdings, fit(12 * GIB, &[], 1));
    assert_eq!((placed.gpus.as_slice(), victims(&placed)), (&[1][..], vec!["c"]));
}

#[test]
fn fewer_evictions_win_over_more_free_memory() {
    // GPU 0 needs both `a` and `b` gone (2 GiB left free after the load), GPU 1 only `c`
    // (nothing left): one eviction beats two.
    let loaded = [model("a", 1, false), model("b", 2, false), model("c", 3, false)];
    let holdings = [hold("a", 0, 4 * GIB), hold("b", 0, 4 * GIB), hold("c", 1, 6 * GIB)];
    let placed = place_on_two(&loaded, [2, 2], &holdings, fit(8 * GIB, &[], 1));
    assert_eq!((placed.gpus.as_slice(), victims(&placed)), (&[1][..], vec!["c"]));
}

#[test]
fn held_models_are_never_victims_so_the_other_gpu_is_chosen() {
    let loaded = [model("pinned", 1, true), model("idle", 5, false)];
    let holdings = [hold("pinned", 0, 14 * GIB), hold("idle", 1, 14 * GIB)];
    let placed = place_on_two(&loaded, [2, 2], &holdings, fit(8 * GIB, &[], 1));
    assert_eq!((placed.gpus.as_slice(), victims(&placed)), (&[1][..], vec!["idle"]));
    // Only GPU 0 allowed: nothing may be evicted there, so nothing is evicted anywhere.
    let placed = place_on_two(&loaded, [2, 2], &holdings, fit(8 * GIB, &[0], 1));
    let Some(Refusal::NoRoom(short)) = &placed.refusal else { panic!("{placed:?}") };
    assert_eq!(short.len(), 1);
    assert_eq!(short[0].holders, [(name("pinned"), 14 * GIB, true)]);
    assert!(placed.plan.victims.is_empty());
}

#[test]
fn allowed_gpus_narrow_the_choice() {
    let placed =
        plan_placement(&[], &incoming(), &limits(), &two([14, 2]), &[], &fit(GIB, &[1], 1));
    assert_eq!(placed.gpus, [1]);
    let placed =
        plan_placement(&[], &incoming(), &limits(), &two([14, 14]), &[], &fit(GIB, &[1], 2));
    assert_eq!(placed.refusal, Some(Refusal::TooFewGpus { allowed: vec![1], split: 2 }));
    let placed =
        plan_placement(&[], &incoming(), &limits(), &two([14, 14]), &[], &fit(GIB, &[7], 1));
    assert_eq!(placed.refusal, Some(Refusal::TooFewGpus { allowed: vec![], split: 1 }));
}

#[test]
fn a_split_victim_frees_its_share_on_every_gpu() {
    let loaded = [model("wide", 1, false), model("other", 2, false)];
    let holdings = [hold("wide", 0, 8 * GIB), hold("wide", 1, 8 * GIB), hold("other", 1, 4 * GIB)];
    let placed = place_on_two(&loaded, [0, 0], &holdings, fit(16 * GIB, &[], 2));
    assert_eq!((placed.gpus.as_slice(), victims(&placed)), (&[0, 1][..], vec!["wide"]));
}

// ---- Properties ----

#[test]
fn with_as_many_evictions_either_way_the_least_recently_used_goes() {
    // a (GPU 0) was used after b (GPU 1): room is made on GPU 1, though GPU 0 comes first.
    let loaded = [model("a", 5, false), model("b", 1, false)];
    let holdings = [hold("a", 0, 12 * GIB), hold("b", 1, 12 * GIB)];
    let placed = place_on_two(&loaded, [2, 2], &holdings, fit(12 * GIB, &[], 1));
    assert_eq!((placed.gpus.as_slice(), victims(&placed)), (&[1][..], vec!["b"]));
}

#[test]
fn a_second_copy_needs_no_slot_and_never_evicts_its_own_model() {
    // A reload of `a` (12 GiB on GPU 0) with no slot free: only memory counts, `a` stays.
    let loaded = [model("a", 1, false), model("b", 2, false)];
    let holdings = [hold("a", 0, 12 * GIB), hold("b", 1, 10 * GIB)];
    let full = MaxLoadedModels::from_counts(&[2]).unwrap();
    let reload = Incoming { name: name("a"), ..incoming() };
    let as_load = plan_placement(&loaded, &reload, &full, &two([4, 6]), &holdings, &fit(0, &[], 1));
    assert!(as_load.gpus.is_empty(), "a load of a loaded model places nothing: {as_load:?}");
    let placed = plan_second_copy_placed(
        &loaded,
        &name("a"),
        &two([4, 6]),
        &holdings,
        &fit(12 * GIB, &[], 1),
    );
    assert_eq!((placed.gpus.as_slice(), victims(&placed)), (&[1][..], vec!["b"]));
    let only_own = plan_second_copy_placed(
        &loaded,
        &name("a"),
        &two([4, 6]),
        &holdings,
        &fit(12 * GIB, &[0], 1),
    );
    let Some(Refusal::NoRoom(short)) = &only_own.refusal else { panic!("{only_own:?}") };
    assert_eq!((short[0].gpu, short[0].missing_mib), (0, 8 * GIB), "a's own 12 GiB stay held");
}

/// 2–4 GPUs of 4–24 GiB with a budget of 50–100 % of each; up to 8 loaded models, each on
/// one GPU or split over two; what is free on each GPU is its budget minus what they hold.
fn arb_state() -> impl Strategy<Value = (Vec<GpuRoom>, Vec<LoadedModel>, Vec<GpuHolding>)> {
    let gpu = (4u64..=24, 50u64..=100);
    let loaded =
        (0u64..6, any::<bool>(), 0u32..3, 0usize..4, 0usize..4, 256u64..12_000, any::<bool>());
    (prop::collection::vec(gpu, 2..=4), prop::collection::vec(loaded, 0..8)).prop_map(
        |(gpus, raw)| {
            let n = gpus.len();
            let budgets: Vec<i64> =
                gpus.iter().map(|(gib, pct)| (gib * 1024 * pct / 100) as i64).collect();
            let mut used = vec![0i64; n];
            let mut models = Vec::new();
            let mut holdings = Vec::new();
            for (i, (secs, held, inflight, g1, g2, mib, split)) in raw.into_iter().enumerate() {
                let n_name = format!("m{i}");
                let mut m = model(&n_name, secs, held && i % 3 == 0);
                m.inflight = inflight;
                let places: Vec<usize> =
                    if split && g1 % n != g2 % n { vec![g1 % n, g2 % n] } else { vec![g1 % n] };
                let share = mib / places.len() as u64;
                for g in places {
                    used[g] += share as i64;
                    holdings.push(hold(&n_name, g as u32, share));
                }
                models.push(m);
            }
            let rooms = (0..n)
                .map(|g| GpuRoom { index: g as u32, free_mib: budgets[g] - used[g] })
                .collect();
            (rooms, models, holdings)
        },
    )
}

fn arb_fit() -> impl Strategy<Value = Fit> {
    (256u64..30_000, prop::collection::vec(0u32..4, 0..3), 1u32..=3)
        .prop_map(|(needed_mib, allowed, split)| Fit { needed_mib, allowed, split })
}

fn held_on(holdings: &[GpuHolding], model: &ModelName, gpu: u32) -> i64 {
    holdings.iter().filter(|h| h.model == *model && h.gpu == gpu).map(|h| h.mib as i64).sum()
}

/// Free memory on `gpu` once `gone` are unloaded.
fn free_after(rooms: &[GpuRoom], holdings: &[GpuHolding], gpu: u32, gone: &[&ModelName]) -> i64 {
    let free = rooms.iter().find(|r| r.index == gpu).unwrap().free_mib;
    free + gone.iter().map(|m| held_on(holdings, m, gpu)).sum::<i64>()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// (a) A placement puts the model on `split` distinct allowed GPUs, and once its victims
    /// are gone every chosen GPU has room for its share: no GPU goes over its budget.
    /// (b) Held models are never victims.
    /// (c) Every memory victim holds memory on a chosen GPU that lacked room without the
    /// memory victims: victims only on GPUs that need room.
    #[test]
    fn placements_fit_every_gpu_and_evict_only_where_room_is_needed(
        (rooms, loaded, holdings) in arb_state(), fit in arb_fit()
    ) {
        let placed = plan_placement(&loaded, &incoming(), &limits(), &rooms, &holdings, &fit);
        let gone: Vec<&ModelName> = placed.plan.names().collect();
        for v in &placed.plan.victims {
            prop_assert!(!loaded.iter().any(|m| m.name == v.name && m.held), "held victim {}", v.name);
        }
        if placed.refusal.is_some() {
            prop_assert!(placed.plan.victims.is_empty() && placed.gpus.is_empty());
            return Ok(());
        }
        let distinct: HashSet<u32> = placed.gpus.iter().copied().collect();
        prop_assert_eq!(distinct.len(), fit.gpus() as usize);
        for g in &placed.gpus {
            prop_assert!(fit.allowed.is_empty() || fit.allowed.contains(g));
            prop_assert!(free_after(&rooms, &holdings, *g, &gone) >= fit.share_mib() as i64, "GPU {g} over budget");
        }
        let slot: Vec<&ModelName> = placed.plan.victims.iter()
            .filter(|v| v.reason != EvictionReason::VramBudget).map(|v| &v.name).collect();
        for v in placed.plan.victims.iter().filter(|v| v.reason == EvictionReason::VramBudget) {
            let needed = placed.gpus.iter().any(|g| {
                held_on(&holdings, &v.name, *g) > 0
                    && free_after(&rooms, &holdings, *g, &slot) < fit.share_mib() as i64
            });
            prop_assert!(needed, "{} evicted from no GPU that needed room", v.name);
        }
    }

    /// (d) A refusal only when no placement exists: for every set of `split` allowed GPUs,
    /// some GPU lacks room for its share even with every model that is not held gone.
    #[test]
    fn a_refusal_means_no_placement_exists((rooms, loaded, holdings) in arb_state(), fit in arb_fit()) {
        let placed = plan_placement(&loaded, &incoming(), &limits(), &rooms, &holdings, &fit);
        let Some(_) = placed.refusal else { return Ok(()) };
        let allowed: Vec<u32> = rooms.iter().map(|r| r.index)
            .filter(|g| fit.allowed.is_empty() || fit.allowed.contains(g)).collect();
        let evictable: Vec<&ModelName> = loaded.iter().filter(|m| !m.held).map(|m| &m.name).collect();
        let fits = |g: &u32| free_after(&rooms, &holdings, *g, &evictable) >= fit.share_mib() as i64;
        prop_assert!(allowed.iter().filter(|g| fits(g)).count() < fit.gpus() as usize);
    }
}

#[test]
fn slots_still_decide_first() {
    // One llm slot: the loaded llm goes for the slot, and its memory counts for the GPU.
    let loaded = [model("a", 1, false)];
    let one = MaxLoadedModels { llm: NonZeroU32::MIN, ..limits() };
    let placed = plan_placement(
        &loaded,
        &incoming(),
        &one,
        &two([0, 2]),
        &[hold("a", 0, 14 * GIB)],
        &fit(12 * GIB, &[], 1),
    );
    assert_eq!((placed.gpus.as_slice(), victims(&placed)), (&[0][..], vec!["a"]));
    assert_eq!(placed.plan.victims[0].reason, EvictionReason::SlotLimit);
}
