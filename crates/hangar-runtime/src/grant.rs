//! The grant: the one pure decision every path that creates runtimes goes through (a
//! load, a reload, a weight update). Given the loaded models as the eviction policy sees
//! them and, under a VRAM budget, each GPU's memory ([`Places`]), it answers with the GPUs
//! the runtimes go to and the evictions to make there, or a typed refusal. No clock, no
//! I/O: the callers in `evict.rs` read the inputs and execute the plan.

use hangar_eviction::{
    EvictionPlan, Fit, GpuHolding, GpuRoom, Incoming, LoadFailure, LoadedModel, VramShortfall,
    plan_load, plan_placement, plan_retry_after_failure, plan_second_copy_placed,
};

use crate::error::ManagerError;

/// What a grant is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ask {
    /// A load of a model that is not loaded: a slot and its memory.
    Load,
    /// New runtimes next to the model's own (a reload, a weight update): memory only; the
    /// model is held meanwhile.
    SecondCopy,
    /// A load that failed, once more after every other model that is not held is evicted
    /// (never refused: the plan may be empty).
    Retry,
}

/// Why a grant was refused; nothing was evicted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Only evicting these held (pinned, leased, being replaced) models would make room.
    Held(Vec<String>),
    /// The model cannot fit in the VRAM budget.
    Vram(VramShortfall),
    /// The model cannot fit in the host-memory budget.
    Host(VramShortfall),
    /// A second copy whose memory nothing tells (not measured, no estimate): counted as
    /// zero it could run past the budget, so it is not admitted.
    Unknown(Place),
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
            Self::Host(short) => {
                ManagerError::InsufficientMemory { model, shortfall: Box::new(short) }
            }
            Self::Unknown(on) => ManagerError::MemoryNotKnown { model, gpu: on == Place::Gpus },
        }
    }
}

/// GPU memory as a grant sees it, each GPU a place of its own: what is free on each under
/// the budget, what the loaded models hold where, and what the new runtimes need and where
/// they may go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Places {
    /// Which memory: the GPUs', or the host's (one place, index 0).
    pub(crate) on: Place,
    /// The GPUs Hangar may use, with their free memory under the budget.
    pub(crate) gpus: Vec<GpuRoom>,
    /// What each loaded model holds on each GPU.
    pub(crate) holdings: Vec<GpuHolding>,
    /// What the new runtimes take, on how many GPUs at once, and which GPUs they may use.
    pub(crate) fit: Fit,
    /// Whether `fit.needed_mib` is a figure (measured or estimated); false: nothing tells
    /// what the runtimes take and it reads 0 (a first load is admitted so and measured; a
    /// second copy is refused, [`Refusal::Unknown`]).
    pub(crate) known: bool,
}

impl Places {
    /// One GPU (index 0) with `free_mib` free, the loaded models' figures on it, and
    /// `needed_mib` to place: the pooled rule's inputs as a placement reads them.
    #[cfg(test)]
    pub(crate) fn one_gpu(free_mib: i64, needed_mib: u64, loaded: &[LoadedModel]) -> Self {
        let holdings = loaded
            .iter()
            .filter(|m| m.vram_mib > 0)
            .map(|m| GpuHolding { model: m.name.clone(), gpu: 0, mib: m.vram_mib })
            .collect();
        let fit = Fit { needed_mib, allowed: Vec::new(), split: 1 };
        let gpus = vec![GpuRoom { index: 0, free_mib }];
        Self { on: Place::Gpus, gpus, holdings, fit, known: true }
    }
}

/// Which memory a grant places a load in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Place {
    /// The GPUs, each a place of its own (`vram_budget`).
    Gpus,
    /// The host's memory, one place (`ram_budget`, `host.rs`).
    Host,
}

/// A granted creation: the models to put to sleep and the evictions to make first, and the
/// GPUs the runtimes go to (ascending; empty: no placement was made, the engine picks as it
/// would alone).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Grant {
    /// The victims, in the order they go.
    pub(crate) plan: EvictionPlan,
    /// The placement.
    pub(crate) gpus: Vec<u32>,
    /// Models to put to sleep for memory instead of unloading them (`demote.rs`), least
    /// recently used first; the caller asks again once they sleep.
    pub(crate) demote: Vec<hangar_config::ModelName>,
}

/// The one decision every path that creates runtimes goes through: the placement and the
/// eviction plan for `ask` given the loaded models and, under a budget, the memory the
/// model's runtimes take (`places`: each GPU's, or the host's for a model on the CPU;
/// `None`: no admission by memory) and, for a GPU model under a `ram_budget`, its part of
/// the host's memory (`host`).
///
/// The host part is granted after the placement, by memory only (the slot is granted
/// already), among the models the placement keeps: its victims' host memory counts as
/// free, and any more victims are the host's least recently used. A refusal means that
/// even every model not held would not make room on the host ([`Refusal::Host`]).
pub(crate) fn decide(
    ask: Ask,
    loaded: &[LoadedModel],
    incoming: &Incoming,
    limits: &hangar_config::MaxLoadedModels,
    places: Option<&Places>,
    host: Option<&Places>,
) -> Result<Grant, Refusal> {
    let mut grant = decide_placed(ask, loaded, incoming, limits, places)?;
    if let Some(places) = places.filter(|p| p.on == Place::Gpus) {
        grant = crate::demote::instead_of_unloads(grant, ask, loaded, incoming, limits, places);
    }
    match host {
        Some(host) if ask != Ask::Retry => with_host_part(grant, loaded, incoming, host),
        _ => Ok(grant),
    }
}

/// `grant` with the evictions that make room on the host for the host part `host` of the
/// runtimes too (see [`decide`]).
fn with_host_part(
    mut grant: Grant,
    loaded: &[LoadedModel],
    incoming: &Incoming,
    host: &Places,
) -> Result<Grant, Refusal> {
    let gone = |name: &hangar_config::ModelName| grant.plan.victims.iter().any(|v| v.name == *name);
    let freed: u64 = host.holdings.iter().filter(|h| gone(&h.model)).map(|h| h.mib).sum();
    let freed = i64::try_from(freed).unwrap_or(i64::MAX);
    let rooms: Vec<GpuRoom> = host
        .gpus
        .iter()
        .map(|r| GpuRoom { index: r.index, free_mib: r.free_mib.saturating_add(freed) })
        .collect();
    let kept: Vec<LoadedModel> = loaded.iter().filter(|m| !gone(&m.name)).cloned().collect();
    let holdings: Vec<GpuHolding> =
        host.holdings.iter().filter(|h| !gone(&h.model)).cloned().collect();
    let placed = plan_second_copy_placed(&kept, &incoming.name, &rooms, &holdings, &host.fit);
    if let Some(refusal) = placed.refusal {
        // Told as the host alone sees it (the memory free now, every holder): the
        // placement's victims are evictable too, so that refuses as well.
        let alone =
            plan_second_copy_placed(loaded, &incoming.name, &host.gpus, &host.holdings, &host.fit);
        let refusal = alone.refusal.unwrap_or(refusal);
        return Err(Refusal::Host(refusal.shortfall(&host.fit)));
    }
    if placed.plan.is_blocked() {
        let held = placed.plan.blocked_by.iter().map(ToString::to_string).collect();
        return Err(Refusal::Held(held));
    }
    grant.plan.victims.extend(placed.plan.victims);
    Ok(grant)
}

/// The placement and plan for `ask` in the memory of `places` alone.
pub(crate) fn decide_placed(
    ask: Ask,
    loaded: &[LoadedModel],
    incoming: &Incoming,
    limits: &hangar_config::MaxLoadedModels,
    places: Option<&Places>,
) -> Result<Grant, Refusal> {
    let placed = match (ask, places) {
        (Ask::Load, Some(p)) => {
            Some(plan_placement(loaded, incoming, limits, &p.gpus, &p.holdings, &p.fit))
        }
        (Ask::SecondCopy, Some(p)) if !p.known => return Err(Refusal::Unknown(p.on)),
        (Ask::SecondCopy, Some(p)) => {
            Some(plan_second_copy_placed(loaded, &incoming.name, &p.gpus, &p.holdings, &p.fit))
        }
        _ => None,
    };
    let (plan, gpus) = match (ask, placed, places) {
        (_, Some(placed), Some(p)) => {
            if let Some(refusal) = placed.refusal {
                let short = refusal.shortfall(&p.fit);
                return Err(match p.on {
                    Place::Gpus => Refusal::Vram(short),
                    Place::Host => Refusal::Host(short),
                });
            }
            (placed.plan, placed.gpus)
        }
        (Ask::Load, _, _) => (plan_load(loaded, incoming, limits), Vec::new()),
        (Ask::SecondCopy, _, _) => (EvictionPlan::default(), Vec::new()),
        (Ask::Retry, _, _) => {
            let plan = plan_retry_after_failure(loaded, incoming, LoadFailure::Other);
            (plan.unwrap_or_default(), Vec::new())
        }
    };
    if plan.is_blocked() {
        return Err(Refusal::Held(plan.blocked_by.iter().map(ToString::to_string).collect()));
    }
    Ok(Grant { plan, gpus, demote: Vec::new() })
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use hangar_config::{Device, MaxLoadedModels, ModelType};

    use hangar_config::ModelName;

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
            asleep: false,
            sleep_frees_mib: 0,
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
            Refusal::Host(short) => format!("host: {} missing", short.missing_mib),
            Refusal::Unknown(on) => format!("not known: {on:?}"),
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
            let memory =
                row.memory.map(|(free, needed)| Places::one_gpu(free, needed, &row.loaded));
            let got = decide(row.ask, &row.loaded, &incoming, &limits, memory.as_ref(), None);
            let got = got
                .map(|grant| {
                    grant.plan.victims.iter().map(|v| v.name.to_string()).collect::<Vec<_>>()
                })
                .map_err(|r| summary(&r));
            let want = row.answer.map(|v| v.into_iter().map(String::from).collect::<Vec<_>>());
            assert_eq!(got, want, "{}", row.what);
        }
    }

    #[test]
    fn a_second_copy_is_never_counted_as_zero() {
        let nz = |n| std::num::NonZeroU32::new(n).unwrap();
        let limits = MaxLoadedModels { llm: nz(1), embedding: nz(1), reranking: nz(1) };
        let incoming = Incoming {
            name: ModelName::new("new").unwrap(),
            model_type: ModelType::Llm,
            device: Device::GPU,
        };
        // "new" runs with nothing known of its memory; 100 MiB are free.
        let running = [loaded("new", 1, 0, false)];
        let other = [loaded("other", 1, 0, false)];
        let rows = [
            ("a second copy with no figure is refused", Ask::SecondCopy, None, "not known: Gpus"),
            ("nor on the host", Ask::SecondCopy, Some(Place::Host), "not known: Host"),
            ("a first load is admitted and measured", Ask::Load, None, "granted"),
            ("as is a retry", Ask::Retry, None, "granted"),
        ];
        for (what, ask, on, want) in rows {
            let memory = Places {
                on: on.unwrap_or(Place::Gpus),
                known: false,
                ..Places::one_gpu(100, 0, &running)
            };
            let loaded: &[LoadedModel] = if ask == Ask::SecondCopy { &running } else { &other };
            let got = decide(ask, loaded, &incoming, &limits, Some(&memory), None);
            let got = got.map_or_else(|r| summary(&r), |_| "granted".into());
            assert_eq!(got, want, "{what}");
        }
        // Known, the same copy is counted: 150 MiB do not fit in 100.
        let known = Places::one_gpu(100, 150, &running);
        let got = decide(Ask::SecondCopy, &running, &incoming, &limits, Some(&known), None);
        assert_eq!(got.map_err(|r| summary(&r)).err().as_deref(), Some("vram: 50 missing"));
    }

    #[test]
    fn the_place_decides_which_refusal_and_a_granted_load_carries_its_gpus() {
        let nz = |n| std::num::NonZeroU32::new(n).unwrap();
        let limits = MaxLoadedModels { llm: nz(4), embedding: nz(1), reranking: nz(1) };
        let incoming = Incoming {
            name: ModelName::new("new").unwrap(),
            model_type: ModelType::Llm,
            device: Device::CPU,
        };
        let loaded = [loaded("a", 1, 1000, true)];
        let host = Places { on: Place::Host, ..Places::one_gpu(500, 2000, &loaded) };
        let refused = decide(Ask::Load, &loaded, &incoming, &limits, Some(&host), None);
        assert!(
            matches!(refused, Err(Refusal::Host(ref s)) if s.missing_mib == 1500),
            "{refused:?}"
        );
        let gpus = Places::one_gpu(500, 2000, &loaded);
        let refused = decide(Ask::Load, &loaded, &incoming, &limits, Some(&gpus), None);
        assert!(matches!(refused, Err(Refusal::Vram(_))), "{refused:?}");
        let roomy = Places::one_gpu(4000, 2000, &loaded);
        let granted = decide(Ask::Load, &loaded, &incoming, &limits, Some(&roomy), None).unwrap();
        assert_eq!(granted.gpus, [0]);
        let unplaced = decide(Ask::Load, &loaded, &incoming, &limits, None, None).unwrap();
        assert!(unplaced.gpus.is_empty(), "no budget: no placement");
    }
}

#[cfg(test)]
mod properties {
    use std::time::{Duration, Instant};

    use hangar_config::{Device, MaxLoadedModels, ModelName, ModelType};
    use hangar_eviction::Memory;
    use proptest::prelude::*;

    use super::*;

    const NAMES: [&str; 6] = ["new", "a", "b", "c", "d", "e"];

    fn model() -> impl Strategy<Value = Model> {
        // (last use, in flight, held, VRAM MiB, an embedding model)
        (0..100u64, 0..3u32, any::<bool>(), 0..5000u64, any::<bool>())
    }

    proptest! {
        /// Whatever is loaded and asked: a granted plan evicts no held model (nor the model
        /// a second copy is for), evicts each model at most once, leaves the incoming model
        /// a free slot for a load, and leaves enough memory under the budget; a refusal for
        /// memory means even every evictable model would not make room.
        #[test]
        fn a_grant_never_evicts_held_models_nor_overfills_the_budget(
            models in proptest::collection::vec(model(), 0..6),
            second_copy in any::<bool>(),
            slots in 1..4u32,
            memory in proptest::option::of((-2000..8000i64, 0..8000u64)),
            known in any::<bool>(),
        ) {
            check(&models, second_copy, slots, memory, known)?;
        }
    }

    type Model = (u64, u32, bool, u64, bool);

    /// The invariants of one grant (see the property's doc).
    fn check(
        models: &[Model],
        second_copy: bool,
        slots: u32,
        memory: Option<(i64, u64)>,
        known: bool,
    ) -> Result<(), TestCaseError> {
        static BASE: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        let base = *BASE.get_or_init(Instant::now);
        // A second copy is for a loaded model: "new" is then the first one.
        let skip = usize::from(!second_copy);
        let loaded: Vec<LoadedModel> = models
            .iter()
            .zip(NAMES.iter().skip(skip))
            .map(|(&(secs, inflight, held, vram_mib, embedding), name)| LoadedModel {
                name: ModelName::new(*name).unwrap(),
                model_type: if embedding { ModelType::Embedding } else { ModelType::Llm },
                device: Device::GPU,
                last_use: base + Duration::from_secs(secs),
                inflight,
                held,
                vram_mib,
                asleep: false,
                sleep_frees_mib: 0,
            })
            .collect();
        let ask = if second_copy && !loaded.is_empty() { Ask::SecondCopy } else { Ask::Load };
        let nz = |n| std::num::NonZeroU32::new(n).unwrap();
        let limits = MaxLoadedModels { llm: nz(slots), embedding: nz(slots), reranking: nz(1) };
        let incoming = Incoming {
            name: ModelName::new("new").unwrap(),
            model_type: loaded
                .first()
                .filter(|_| ask == Ask::SecondCopy)
                .map_or(ModelType::Llm, |m| m.model_type),
            device: Device::GPU,
        };
        // Unknown, the need reads 0.
        let memory = memory.map(|(free_mib, needed_mib)| Memory {
            free_mib,
            needed_mib: if known { needed_mib } else { 0 },
        });
        let places =
            memory.map(|m| Places { known, ..Places::one_gpu(m.free_mib, m.needed_mib, &loaded) });
        if ask == Ask::SecondCopy && memory.is_some() && !known {
            let answer = decide(ask, &loaded, &incoming, &limits, places.as_ref(), None);
            prop_assert_eq!(answer, Err(Refusal::Unknown(Place::Gpus)), "never counted as 0");
            return Ok(());
        }
        let already = loaded.iter().any(|m| m.name == incoming.name);
        let vram = |m: &LoadedModel| i128::from(m.vram_mib);
        match decide(ask, &loaded, &incoming, &limits, places.as_ref(), None) {
            Ok(Grant { plan, gpus, .. }) => {
                prop_assert!(gpus.len() <= 1, "one GPU at most: {gpus:?}");
                let mut seen = std::collections::HashSet::new();
                for victim in &plan.victims {
                    let m = loaded.iter().find(|m| m.name == victim.name).expect("a loaded victim");
                    prop_assert!(!m.held, "held {} evicted", m.name);
                    prop_assert!(m.name != incoming.name, "the incoming model evicted");
                    prop_assert!(seen.insert(victim.name.clone()), "{} twice", victim.name);
                }
                let stays = |m: &&LoadedModel| !seen.contains(&m.name);
                if ask == Ask::Load && !already {
                    let same_type = loaded
                        .iter()
                        .filter(stays)
                        .filter(|m| m.model_type == incoming.model_type)
                        .count();
                    prop_assert!(same_type < slots as usize, "no free slot left");
                }
                if let (Some(memory), false) = (&memory, ask == Ask::Load && already) {
                    let freed: i128 =
                        loaded.iter().filter(|m| seen.contains(&m.name)).map(vram).sum();
                    prop_assert!(
                        i128::from(memory.free_mib) + freed >= i128::from(memory.needed_mib),
                        "over budget"
                    );
                }
            }
            Err(Refusal::Vram(short)) => {
                let memory = memory.expect("a VRAM refusal needs a budget");
                let evictable: i128 = loaded
                    .iter()
                    .filter(|m| !(m.held || (ask == Ask::SecondCopy && m.name == incoming.name)))
                    .map(vram)
                    .sum();
                prop_assert!(
                    i128::from(memory.free_mib) + evictable < i128::from(memory.needed_mib)
                );
                prop_assert!(short.missing_mib > 0);
            }
            Err(Refusal::Host(_)) => prop_assert!(false, "GPU places refused as host memory"),
            Err(Refusal::Unknown(_)) => prop_assert!(false, "refused as unknown: {ask:?}"),
            Err(Refusal::Held(held)) => {
                prop_assert!(!held.is_empty());
                for name in &held {
                    prop_assert!(
                        loaded.iter().any(|m| m.name.as_str() == name && m.held),
                        "{name} not held"
                    );
                }
            }
        }
        Ok(())
    }
}
