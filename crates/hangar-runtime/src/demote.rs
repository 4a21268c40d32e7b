//! Demotion: under a VRAM budget, sleep answers memory pressure before an unload does. When
//! a grant would unload models for GPU memory (`vram_budget` victims), it asks instead
//! whether putting least recently used idle models to sleep frees enough: each candidate's
//! `sleep_frees_mib` (what its engine's sleep gives back, as best known) comes off its
//! holdings, and the placement is planned again. The fewest candidates, oldest first, that
//! leave no victim for memory are demoted (less any of them the placement turns out not to
//! need: a model on a GPU it does not use); when even all of them do not, the grant unloads
//! as before. Slot pressure still unloads (a sleeping model first: `hangar-eviction`).
//!
//! A candidate is loaded, awake, idle, not held, holds GPU memory, and can sleep. The
//! demoted models keep their slots; the caller puts them to sleep and asks the grant again
//! with what the sleeps really gave back (`evict.rs`).

use hangar_config::MaxLoadedModels;
use hangar_eviction::{EvictionReason, GpuHolding, Incoming, LoadedModel};

use crate::grant::{Ask, Grant, Places, decide_placed};

/// `unloading` (the grant as planned) with demotions instead of its unloads for memory,
/// when sleeps free enough (see the module docs).
pub(crate) fn instead_of_unloads(
    unloading: Grant,
    ask: Ask,
    loaded: &[LoadedModel],
    incoming: &Incoming,
    limits: &MaxLoadedModels,
    places: &Places,
) -> Grant {
    let for_memory =
        |g: &Grant| g.plan.victims.iter().any(|v| v.reason == EvictionReason::VramBudget);
    if !for_memory(&unloading) {
        return unloading;
    }
    let mut candidates: Vec<&LoadedModel> = loaded
        .iter()
        .filter(|m| m.sleep_frees_mib > 0 && m.vram_mib > 0)
        .filter(|m| !m.asleep && !m.held && m.is_idle() && m.name != incoming.name)
        .collect();
    candidates.sort_by(|a, b| a.last_use.cmp(&b.last_use).then_with(|| a.name.cmp(&b.name)));
    // The grant with `demoted` asleep, when it unloads nothing for memory.
    let enough = |demoted: &[&LoadedModel]| {
        let (after, places) = asleep(loaded, places, demoted);
        let grant = decide_placed(ask, &after, incoming, limits, Some(&places)).ok()?;
        (!for_memory(&grant)).then_some(grant)
    };
    for k in 1..=candidates.len() {
        let Some(mut grant) = enough(&candidates[..k]) else { continue };
        // A sleep the placement does not need (a model on a GPU it does not use) is left
        // out, older ones first.
        let mut demoted = candidates[..k].to_vec();
        let mut i = 0;
        while i < demoted.len() && demoted.len() > 1 {
            let mut fewer = demoted.clone();
            fewer.remove(i);
            // Leaving one out may not unload anything the grant kept (a slot goes from a
            // sleeping model first: an awake one left out could take another's place).
            let unloads = |g: &Grant| g.plan.victims.iter().map(|v| v.name.clone()).collect();
            let before: Vec<_> = unloads(&grant);
            match enough(&fewer).filter(|g| unloads(g).iter().all(|n| before.contains(n))) {
                Some(kept) => (demoted, grant) = (fewer, kept),
                None => i += 1,
            }
        }
        // One the plan unloads anyway (for a slot) need not sleep first.
        let unloaded = |m: &&&LoadedModel| grant.plan.victims.iter().any(|v| v.name == m.name);
        let demote = demoted.iter().filter(|m| !unloaded(m)).map(|m| m.name.clone()).collect();
        return Grant { demote, ..grant };
    }
    unloading
}

/// `loaded` and `places` as they would be with `demoted` asleep: each holds
/// `sleep_frees_mib` less, taken from its holdings in proportion, and counts as asleep.
fn asleep(
    loaded: &[LoadedModel],
    places: &Places,
    demoted: &[&LoadedModel],
) -> (Vec<LoadedModel>, Places) {
    let frees = |name: &hangar_config::ModelName| {
        demoted.iter().find(|m| m.name == *name).map(|m| m.sleep_frees_mib)
    };
    let after = loaded
        .iter()
        .map(|m| match frees(&m.name) {
            Some(mib) => LoadedModel {
                vram_mib: m.vram_mib.saturating_sub(mib),
                asleep: true,
                sleep_frees_mib: 0,
                ..m.clone()
            },
            None => m.clone(),
        })
        .collect();
    let mut places = places.clone();
    for m in demoted {
        let total: u64 = places.holdings.iter().filter(|h| h.model == m.name).map(|h| h.mib).sum();
        if total == 0 {
            continue;
        }
        let freed = m.sleep_frees_mib.min(total);
        for h in places.holdings.iter_mut().filter(|h| h.model == m.name) {
            let share = u128::from(freed) * u128::from(h.mib) / u128::from(total);
            let share = u64::try_from(share).unwrap_or(h.mib);
            h.mib -= share;
            if let Some(room) = places.gpus.iter_mut().find(|r| r.index == h.gpu) {
                room.free_mib = room.free_mib.saturating_add(i64::try_from(share).unwrap_or(0));
            }
        }
    }
    places.holdings.retain(|h: &GpuHolding| h.mib > 0);
    (after, places)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use hangar_config::{Device, ModelName, ModelType};

    use super::*;
    use crate::grant::decide;

    /// A loaded model used `secs` after a fixed start, holding `mib` on GPU 0, whose sleep
    /// frees `frees`; `inflight` requests.
    fn model(name: &str, secs: u64, mib: u64, frees: u64, inflight: u32) -> LoadedModel {
        static BASE: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        LoadedModel {
            name: ModelName::new(name).unwrap(),
            model_type: ModelType::Llm,
            device: Device::GPU,
            last_use: *BASE.get_or_init(Instant::now) + Duration::from_secs(secs),
            inflight,
            held: false,
            vram_mib: mib,
            asleep: false,
            sleep_frees_mib: frees,
        }
    }

    /// The grant's answer as `sleep x,y; evict z`, or the refusal.
    fn summary(answer: Result<Grant, crate::grant::Refusal>) -> String {
        match answer {
            Ok(grant) => {
                let names = |v: Vec<String>| v.join(",");
                let demoted = names(grant.demote.iter().map(ToString::to_string).collect());
                let evicted = grant.plan.victims.iter().map(|v| v.name.to_string()).collect();
                format!("sleep {demoted}; evict {}", names(evicted))
            }
            Err(refusal) => format!("refused: {refusal:?}"),
        }
    }

    #[test]
    fn sleep_answers_memory_pressure_before_an_unload_does() {
        let held = |mut m: LoadedModel| {
            m.held = true;
            m
        };
        let asleep = |mut m: LoadedModel| {
            m.asleep = true;
            m.sleep_frees_mib = 0;
            m
        };
        /// What, loaded, llm slots, free MiB on GPU 0, MiB needed, the answer.
        type Row = (&'static str, Vec<LoadedModel>, u32, i64, u64, &'static str);
        let rows: Vec<Row> = vec![
            (
                "an idle model whose sleep frees enough sleeps; nothing is unloaded",
                vec![model("a", 1, 8000, 7500, 0)],
                4,
                2000,
                9000,
                "sleep a; evict ",
            ),
            (
                "what its sleep frees is not enough: unloaded, as before",
                vec![model("a", 1, 8000, 3000, 0)],
                4,
                2000,
                9000,
                "sleep ; evict a",
            ),
            (
                "two sleeps are needed: the two sleep, oldest first",
                vec![model("b", 2, 5000, 5000, 0), model("a", 1, 5000, 5000, 0)],
                4,
                0,
                9000,
                "sleep a,b; evict ",
            ),
            (
                "the oldest's sleep is enough: the newer stays awake",
                vec![model("b", 2, 5000, 5000, 0), model("a", 1, 5000, 5000, 0)],
                4,
                0,
                4000,
                "sleep a; evict ",
            ),
            (
                "a busy model does not sleep: the idle one without sleep is unloaded",
                vec![model("a", 1, 8000, 8000, 2), model("c", 3, 8000, 0, 0)],
                4,
                0,
                8000,
                "sleep ; evict c",
            ),
            (
                "a held model does not sleep either",
                vec![held(model("a", 1, 8000, 8000, 0)), model("c", 3, 8000, 0, 0)],
                4,
                0,
                8000,
                "sleep ; evict c",
            ),
            (
                "a model asleep already frees nothing more by sleeping: unloads, as before",
                vec![asleep(model("a", 1, 500, 0, 0)), model("c", 3, 8000, 0, 0)],
                4,
                0,
                8000,
                "sleep ; evict a,c",
            ),
            (
                "room enough: nothing sleeps, nothing is unloaded",
                vec![model("a", 1, 8000, 8000, 0)],
                4,
                9000,
                8000,
                "sleep ; evict ",
            ),
            (
                "slot pressure alone unloads, the sleeping model first; nothing sleeps",
                vec![model("b", 1, 1000, 1000, 0), asleep(model("a", 2, 500, 0, 0))],
                2,
                9000,
                1000,
                "sleep ; evict a",
            ),
            (
                "a slot and memory: the slot's victim frees the memory too",
                vec![model("b", 2, 1000, 1000, 0), model("a", 1, 6000, 6000, 0)],
                2,
                0,
                5000,
                "sleep ; evict a",
            ),
            (
                "a slot and more memory: the oldest goes for the slot, the other sleeps",
                vec![model("b", 2, 6000, 6000, 0), model("a", 1, 1000, 1000, 0)],
                2,
                0,
                6000,
                "sleep b; evict a",
            ),
        ];
        for (what, loaded, slots, free, needed, expected) in rows {
            let places = Places::one_gpu(free, needed, &loaded);
            assert_eq!(summary(grant(&loaded, slots, &places)), expected, "{what}");
        }
    }

    /// The grant of a load of "new" with `slots` llm slots.
    fn grant(
        loaded: &[LoadedModel],
        slots: u32,
        places: &Places,
    ) -> Result<Grant, crate::grant::Refusal> {
        let nz = |n| std::num::NonZeroU32::new(n).unwrap();
        let limits = MaxLoadedModels { llm: nz(slots), embedding: nz(1), reranking: nz(1) };
        let incoming = Incoming {
            name: ModelName::new("new").unwrap(),
            model_type: ModelType::Llm,
            device: Device::GPU,
        };
        decide(Ask::Load, loaded, &incoming, &limits, Some(places), None)
    }

    #[test]
    fn a_model_on_a_gpu_the_load_does_not_use_is_not_put_to_sleep_for_it() {
        use hangar_eviction::{Fit, GpuRoom};
        // x (used first) holds GPU 1, y holds GPU 0; "new" may go on GPU 0 only.
        let loaded = [model("x", 1, 5000, 5000, 0), model("y", 2, 5000, 5000, 0)];
        let holding =
            |name: &str, gpu| GpuHolding { model: ModelName::new(name).unwrap(), gpu, mib: 5000 };
        let places = Places {
            on: crate::grant::Place::Gpus,
            gpus: vec![GpuRoom { index: 0, free_mib: 0 }, GpuRoom { index: 1, free_mib: 0 }],
            holdings: vec![holding("x", 1), holding("y", 0)],
            fit: Fit { needed_mib: 5000, allowed: vec![0], split: 1 },
            known: true,
        };
        assert_eq!(summary(grant(&loaded, 4, &places)), "sleep y; evict ");
    }
}
