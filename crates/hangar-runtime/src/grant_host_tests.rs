//! The grant with a GPU model's host part (`decide`'s `host`): a table of the cases and a
//! property over random loaded models, GPU memory and host memory.

use std::time::{Duration, Instant};

use hangar_config::{Device, MaxLoadedModels, ModelName, ModelType};
use hangar_eviction::{Fit, GpuHolding, GpuRoom, Incoming, LoadedModel};
use proptest::prelude::*;

use crate::grant::{Ask, Grant, Place, Places, Refusal, decide};

const NAMES: [&str; 6] = ["new", "a", "b", "c", "d", "e"];

fn base() -> Instant {
    static BASE: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

/// A loaded model: its last use, whether held, and its GPU memory.
fn loaded(name: &str, secs: u64, held: bool, vram_mib: u64) -> LoadedModel {
    LoadedModel {
        name: ModelName::new(name).unwrap(),
        model_type: ModelType::Llm,
        device: Device::GPU,
        last_use: base() + Duration::from_secs(secs),
        inflight: 0,
        held,
        vram_mib,
        asleep: false,
        sleep_frees_mib: 0,
    }
}

/// The host as one place: `free_mib` left of the budget, what each model holds there, and
/// `needed_mib` for the incoming model's host part.
fn host(free_mib: i64, needed_mib: u64, holds: &[(&str, u64)]) -> Places {
    let holdings = holds
        .iter()
        .map(|&(name, mib)| GpuHolding { model: ModelName::new(name).unwrap(), gpu: 0, mib })
        .collect();
    Places {
        on: Place::Host,
        gpus: vec![GpuRoom { index: 0, free_mib }],
        holdings,
        fit: Fit { needed_mib, allowed: Vec::new(), split: 1 },
        known: true,
    }
}

fn incoming() -> Incoming {
    Incoming {
        name: ModelName::new("new").unwrap(),
        model_type: ModelType::Llm,
        device: Device::GPU,
    }
}

fn limits(slots: u32) -> MaxLoadedModels {
    let nz = |n| std::num::NonZeroU32::new(n).unwrap();
    MaxLoadedModels { llm: nz(slots), embedding: nz(slots), reranking: nz(1) }
}

fn victims(grant: &Grant) -> Vec<&str> {
    grant.plan.victims.iter().map(|v| v.name.as_str()).collect()
}

#[test]
fn a_gpu_models_host_part_is_granted_after_its_placement() {
    // a (least recently used) holds GPU memory, b host memory; the GPU needs a gone.
    let models = [loaded("a", 1, false, 3000), loaded("b", 2, false, 0), loaded("c", 3, false, 0)];
    let gpu = Places::one_gpu(1000, 3500, &models);
    let holds = [("a", 500), ("b", 1500), ("c", 900)];
    let (ask, lim) = (Ask::Load, limits(8));

    // Room on the host as it is: only the GPU's victim.
    let grant = decide(ask, &models, &incoming(), &lim, Some(&gpu), Some(&host(800, 700, &holds)));
    assert_eq!(victims(&grant.unwrap()), ["a"]);
    // a's host memory counts as freed: 300 + 500 is enough for 800, nothing more goes.
    let grant = decide(ask, &models, &incoming(), &lim, Some(&gpu), Some(&host(300, 800, &holds)));
    assert_eq!(victims(&grant.unwrap()), ["a"]);
    // Short on the host even so: the least recently used of the rest goes too.
    let grant = decide(ask, &models, &incoming(), &lim, Some(&gpu), Some(&host(300, 1500, &holds)));
    assert_eq!(victims(&grant.unwrap()), ["a", "b"]);
    // Without a VRAM budget, the slot rule and then the host, least recently used first.
    let grant = decide(ask, &models, &incoming(), &lim, None, Some(&host(0, 1000, &holds)));
    assert_eq!(victims(&grant.unwrap()), ["a", "b"]);
    let grant = decide(ask, &models, &incoming(), &lim, None, Some(&host(600, 1000, &holds)));
    assert_eq!(victims(&grant.unwrap()), ["a"]);

    // Nothing could make room: refused as the host alone sees it, nothing evicted.
    let refused =
        decide(ask, &models, &incoming(), &lim, Some(&gpu), Some(&host(300, 9000, &holds)));
    let Err(Refusal::Host(short)) = refused else { panic!("{refused:?}") };
    assert_eq!((short.needed_mib, short.free_mib, short.missing_mib), (9000, 300, 5800));
    let holders: Vec<&str> = short.holders.iter().map(|(n, _, _)| n.as_str()).collect();
    assert_eq!(holders, ["b", "c", "a"], "every holder, largest first");

    // A retry after a failure evicts everything it may anyway: no host grant.
    let retry = decide(Ask::Retry, &models, &incoming(), &lim, None, Some(&host(0, 9000, &holds)));
    assert_eq!(victims(&retry.unwrap()).len(), 3);
}

type Model = (u64, bool, u64, u64);

fn model() -> impl Strategy<Value = Model> {
    // (last use, held, GPU MiB, host MiB)
    (0..100u64, any::<bool>(), 0..5000u64, 0..5000u64)
}

proptest! {
    /// Whatever is loaded and asked, with a GPU model's host part under a `ram_budget`: a
    /// granted plan evicts no held model (nor the model a second copy is for) and each at
    /// most once, and leaves both the GPU's budget and the host's with room for what the
    /// runtimes need; a refusal for host memory means that even every evictable model's
    /// host memory would not make room.
    #[test]
    fn a_grant_keeps_both_budgets_and_never_evicts_held_models(
        models in proptest::collection::vec(model(), 0..6),
        second_copy in any::<bool>(),
        slots in 1..4u32,
        gpu in proptest::option::of((-2000..8000i64, 0..8000u64)),
        host_memory in (-2000..8000i64, 0..8000u64),
    ) {
        let skip = usize::from(!second_copy);
        let named: Vec<(&str, Model)> =
            NAMES.iter().skip(skip).copied().zip(models.iter().copied()).collect();
        let loaded_models: Vec<LoadedModel> =
            named.iter().map(|&(n, (secs, held, vram, _))| loaded(n, secs, held, vram)).collect();
        let holds: Vec<(&str, u64)> = named.iter().map(|&(n, (.., mib))| (n, mib)).collect();
        let ask = if second_copy && !named.is_empty() { Ask::SecondCopy } else { Ask::Load };
        let places = gpu.map(|(free, needed)| Places::one_gpu(free, needed, &loaded_models));
        let (host_free, host_needed) = host_memory;
        let on_host = host(host_free, host_needed, &holds);
        let answer = decide(
            ask, &loaded_models, &incoming(), &limits(slots), places.as_ref(), Some(&on_host),
        );
        let of = |name: &str| named.iter().find(|(n, _)| *n == name).map(|&(_, m)| m).unwrap();
        let evictable = |&&(name, (_, held, _, _)): &&(&str, Model)| !held && name != "new";
        match answer {
            Ok(grant) => {
                let mut seen = std::collections::HashSet::new();
                for victim in victims(&grant) {
                    prop_assert!(!of(victim).1, "held {victim} evicted");
                    prop_assert!(victim != "new", "the incoming model evicted");
                    prop_assert!(seen.insert(victim), "{victim} twice");
                }
                let freed = |pick: fn(&Model) -> u64| -> i128 {
                    seen.iter().map(|v| i128::from(pick(&of(v)))).sum()
                };
                let host_freed = freed(|m| m.3);
                prop_assert!(
                    i128::from(host_free) + host_freed >= i128::from(host_needed),
                    "over the host's budget"
                );
                let already = named.iter().any(|(n, _)| *n == "new");
                if let (Some((free, needed)), false) = (gpu, ask == Ask::Load && already) {
                    prop_assert!(
                        i128::from(free) + freed(|m| m.2) >= i128::from(needed),
                        "over the GPU's budget"
                    );
                }
            }
            Err(Refusal::Host(short)) => {
                let all: i128 =
                    named.iter().filter(evictable).map(|(_, m)| i128::from(m.3)).sum();
                prop_assert!(i128::from(host_free) + all < i128::from(host_needed));
                prop_assert_eq!(short.free_mib, host_free, "told as the host is now");
            }
            Err(Refusal::Vram(_)) => prop_assert!(gpu.is_some(), "a VRAM refusal needs a budget"),
            Err(Refusal::Unknown(_)) => prop_assert!(false, "every figure here is known"),
            Err(Refusal::Held(held)) => {
                for name in &held {
                    prop_assert!(of(name).1, "{name} not held");
                }
            }
        }
    }
}
