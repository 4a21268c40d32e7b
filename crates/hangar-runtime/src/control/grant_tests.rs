//! The grant as a table against [`step`], with the loop's holds (leases, replacements),
//! and random holds and grants checking that a held model is never a victim. Waiters are
//! plain numbers; no runtime, no clock.

use std::collections::BTreeMap;
use std::time::{Duration, Instant as StdInstant};

use hangar_config::{Device, ModelName, ModelType};
use hangar_eviction::{Incoming, LoadedModel, Memory};
use proptest::prelude::*;
use tokio::time::Instant;

use super::step::{GrantAsk, LeaseCommand, ModelId, Rules, State, step};
use super::testing::{Command, Effect, acquire, row};

use crate::grant::{Ask, Places, Refusal};

const NAMES: [&str; 4] = ["a", "b", "c", "new"];
const NEW: ModelId = 3;

/// `model` loaded, used `secs` after a fixed start, taking `vram_mib`.
fn loaded(model: ModelId, secs: u64, vram_mib: u64, pinned: bool) -> (ModelId, LoadedModel) {
    static BASE: std::sync::OnceLock<StdInstant> = std::sync::OnceLock::new();
    let model_loaded = LoadedModel {
        name: ModelName::new(NAMES[model]).unwrap(),
        model_type: ModelType::Llm,
        device: Device::GPU,
        last_use: *BASE.get_or_init(StdInstant::now) + Duration::from_secs(secs),
        inflight: 0,
        held: pinned,
        vram_mib,
        asleep: false,
        sleep_frees_mib: 0,
    };
    (model, model_loaded)
}

/// A grant for "new": `a` (used first) and `b` loaded, two slots.
fn grant(ask: Ask, pin_a: bool, waiter: u32) -> Command {
    let loaded = vec![loaded(0, 1, 0, pin_a), loaded(1, 2, 0, false)];
    let incoming = Incoming {
        name: ModelName::new("new").unwrap(),
        model_type: ModelType::Llm,
        device: Device::GPU,
    };
    Command::Grant {
        model: NEW,
        ask: GrantAsk { ask, loaded, incoming, places: None, host: None },
        waiter,
    }
}

/// [`grant`] under a budget with 100 MiB free and nothing known of what "new" takes.
fn unknown(ask: Ask) -> Command {
    let Command::Grant { model, ask: mut asked, waiter } = grant(ask, false, 1) else {
        unreachable!()
    };
    let models: Vec<LoadedModel> = asked.loaded.iter().map(|(_, m)| m.clone()).collect();
    asked.places = Some(Places { known: false, ..Places::one_gpu(100, 0, &models) });
    Command::Grant { model, ask: asked, waiter }
}

fn lease(model: ModelId, command: LeaseCommand<u32>) -> Command {
    Command::Lease { model, command }
}

fn rules() -> Rules {
    let nz = |n| std::num::NonZeroU32::new(n).unwrap();
    let limits = hangar_config::MaxLoadedModels { llm: nz(2), embedding: nz(1), reranking: nz(1) };
    Rules { limits, ..Rules::of(Duration::from_secs(10), 4) }
}

/// The grant's answer: the victims in order, or the refusal.
fn answer(effects: Vec<Effect>) -> String {
    match effects.as_slice() {
        [Effect::Granted { answer: Ok(plan), .. }] => {
            let victims: Vec<_> = plan.plan.victims.iter().map(|v| v.name.to_string()).collect();
            format!("evict {}", victims.join(","))
        }
        [Effect::Granted { answer: Err(Refusal::Held(held)), .. }] => {
            format!("refused: held {}", held.join(","))
        }
        [Effect::Granted { answer: Err(Refusal::Unknown(on)), .. }] => {
            format!("refused: {on:?} memory not known")
        }
        other => format!("{other:?}"),
    }
}

#[test]
fn the_grant_with_the_loops_holds_as_a_table() {
    let t0 = Instant::now();
    let settle = |model, id: &str, loaded| {
        lease(model, LeaseCommand::Settle { id: id.into(), loaded, waiter: 0 })
    };
    let release =
        |model, id: &str| lease(model, LeaseCommand::Release { id: id.into(), waiter: 0 });
    let replacing = |model| Command::Replacing { model };
    // (name, commands before (at t0), the grant, when (seconds after t0), its answer)
    type Row = (&'static str, Vec<Command>, Command, u64, &'static str);
    let rows: Vec<Row> = vec![
        ("the least recently used goes", vec![], grant(Ask::Load, false, 1), 0, "evict a"),
        (
            "a leased model is never a victim",
            vec![acquire(0, 0, 60), settle(0, "lease-1", true)],
            grant(Ask::Load, false, 1),
            0,
            "evict b",
        ),
        (
            "nor one whose lease is reserved while it loads",
            vec![acquire(0, 0, 60)],
            grant(Ask::Load, false, 1),
            0,
            "evict b",
        ),
        (
            "an expired lease holds nothing, even before the tick",
            vec![acquire(0, 0, 5)],
            grant(Ask::Load, false, 1),
            5,
            "evict a",
        ),
        (
            "nor a released one",
            vec![acquire(0, 0, 60), release(0, "lease-1")],
            grant(Ask::Load, false, 1),
            0,
            "evict a",
        ),
        (
            "nor one an unload revoked",
            vec![
                acquire(0, 0, 60),
                Command::UnloadDecided { model: 0 },
                Command::UnloadEnded { model: 0, revoke: true },
            ],
            grant(Ask::Load, false, 1),
            0,
            "evict a",
        ),
        (
            "a model being replaced is held",
            vec![replacing(0)],
            grant(Ask::Load, false, 1),
            0,
            "evict b",
        ),
        (
            "until its replacement ends",
            vec![replacing(0), Command::Replaced { model: 0 }],
            grant(Ask::Load, false, 1),
            0,
            "evict a",
        ),
        (
            "a definition's pin is the caller's to say",
            vec![],
            grant(Ask::Load, true, 1),
            0,
            "evict b",
        ),
        (
            "only held models in the way: refused, naming them",
            vec![replacing(0), acquire(1, 0, 60)],
            grant(Ask::Load, false, 1),
            0,
            "refused: held a,b",
        ),
        (
            "a retry evicts every model not held, least recently used first",
            vec![],
            grant(Ask::Retry, false, 1),
            0,
            "evict a,b",
        ),
        (
            "a retry keeps the held ones",
            vec![acquire(1, 0, 60)],
            grant(Ask::Retry, false, 1),
            0,
            "evict a",
        ),
        ("a second copy needs no slot", vec![], grant(Ask::SecondCopy, false, 1), 0, "evict "),
        (
            "a second copy whose memory is not known is refused, not counted as zero",
            vec![replacing(NEW)],
            unknown(Ask::SecondCopy),
            0,
            "refused: Gpus memory not known",
        ),
        (
            "a first load without a figure is admitted (and then measured)",
            vec![],
            unknown(Ask::Load),
            0,
            "evict a",
        ),
    ];
    for (name, before, command, when, expected) in rows {
        assert_eq!(answer(row(4, rules(), before, command, (t0, when))), expected, "{name}");
    }
}

#[test]
fn memory_pressure_puts_idle_models_to_sleep_before_it_unloads_with_the_loops_holds() {
    let t0 = Instant::now();
    // a (used first) and b hold 8,000 MiB each, and each sleep frees it all; "new" needs
    // 8,000 MiB and none is free; two slots of three are taken.
    let demoting = |waiter| {
        let mut loaded = vec![loaded(0, 1, 8000, false), loaded(1, 2, 8000, false)];
        for (_, m) in &mut loaded {
            m.sleep_frees_mib = 8000;
        }
        let models: Vec<LoadedModel> = loaded.iter().map(|(_, m)| m.clone()).collect();
        let places = Some(Places::one_gpu(0, 8000, &models));
        let incoming = Incoming {
            name: ModelName::new("new").unwrap(),
            model_type: ModelType::Llm,
            device: Device::GPU,
        };
        let ask = GrantAsk { ask: Ask::Load, loaded, incoming, places, host: None };
        Command::Grant { model: NEW, ask, waiter }
    };
    let settle = |model, id: &str| {
        lease(model, LeaseCommand::Settle { id: id.into(), loaded: true, waiter: 0 })
    };
    let three = || {
        let nz = |n| std::num::NonZeroU32::new(n).unwrap();
        let limits =
            hangar_config::MaxLoadedModels { llm: nz(3), embedding: nz(1), reranking: nz(1) };
        Rules { limits, ..Rules::of(Duration::from_secs(10), 4) }
    };
    type Row = (&'static str, Vec<Command>, &'static str);
    let rows: Vec<Row> = vec![
        ("the least recently used sleeps; nothing is unloaded", vec![], "sleep a; evict "),
        (
            "a leased model does not sleep for another: the next one does",
            vec![acquire(0, 0, 60), settle(0, "lease-1")],
            "sleep b; evict ",
        ),
        ("nor one being replaced", vec![Command::Replacing { model: 0 }], "sleep b; evict "),
        (
            "every one held: refused for memory (held holders say so), nothing sleeps",
            vec![Command::Replacing { model: 0 }, acquire(1, 0, 60)],
            "refused: 8000 MiB missing, held a,b",
        ),
    ];
    for (name, before, expected) in rows {
        let effects = row(4, three(), before, demoting(1), (t0, 0));
        let got = match effects.as_slice() {
            [Effect::Granted { answer: Ok(grant), .. }] => {
                let demoted: Vec<_> = grant.demote.iter().map(ToString::to_string).collect();
                let victims: Vec<_> =
                    grant.plan.victims.iter().map(|v| v.name.to_string()).collect();
                format!("sleep {}; evict {}", demoted.join(","), victims.join(","))
            }
            [Effect::Granted { answer: Err(Refusal::Vram(short)), .. }] => {
                let held: Vec<_> =
                    short.holders.iter().filter(|h| h.2).map(|h| h.0.to_string()).collect();
                format!("refused: {} MiB missing, held {}", short.missing_mib, held.join(","))
            }
            _ => answer(effects),
        };
        assert_eq!(got, expected, "{name}");
    }
}

#[derive(Debug, Clone)]
enum Op {
    Acquire(ModelId, u32),
    /// Releases the n-th lease taken.
    Release(usize),
    Replacing(ModelId),
    /// Ends the n-th replacement under way.
    Replaced(usize),
    Advance(u64),
    /// A grant: its kind, each loaded model's (last use, MiB, pinned, MiB its sleep
    /// frees), the memory.
    Grant(u8, Vec<(u64, u64, bool, u64)>, Option<(i64, u64)>),
}

fn op() -> impl Strategy<Value = Op> {
    let model = 0..3usize;
    let each = prop::collection::vec(
        (0..50u64, 0..4000u64, prop::bool::weighted(0.2), prop::sample::select(vec![0, 500, 4000])),
        3,
    );
    prop_oneof![
        (model.clone(), 1..30u32).prop_map(|(m, t)| Op::Acquire(m, t)),
        any::<usize>().prop_map(Op::Release),
        model.prop_map(Op::Replacing),
        any::<usize>().prop_map(Op::Replaced),
        (0..10u64).prop_map(Op::Advance),
        (0..3u8, each, proptest::option::of((-1000..6000i64, 0..6000u64)))
            .prop_map(|(k, e, m)| Op::Grant(k, e, m)),
    ]
}

proptest! {
    /// Whatever leases and replacements come and go: a grant never evicts a model the loop
    /// holds (a live or reserved lease, a replacement) nor one its definition pins, and a
    /// refusal for held models names only held ones.
    #[test]
    fn a_model_the_loop_holds_is_never_a_victim(ops in prop::collection::vec(op(), 1..60)) {
        let t0 = Instant::now();
        let mut now = t0;
        let mut state = State::new(4, rules());
        // The world's own account of the holds: lease id → (model, deadline); replacements.
        let mut leases: BTreeMap<String, (ModelId, Instant)> = BTreeMap::new();
        let mut replacing: Vec<ModelId> = Vec::new();
        for op in ops {
            let command = match op {
                Op::Acquire(model, ttl) => {
                    let effects = step(&mut state, acquire(model, 0, ttl), now);
                    if let Some(Effect::Lease { answer: Ok(lease), .. }) = effects.last() {
                        leases.insert(lease.id.clone(), (model, now + Duration::from_secs(ttl.into())));
                    }
                    continue;
                }
                Op::Release(n) => {
                    let Some((id, (model, _))) = leases.iter().nth(n % leases.len().max(1)) else { continue };
                    let (id, model) = (id.clone(), *model);
                    leases.remove(&id);
                    lease(model, LeaseCommand::Release { id, waiter: 0 })
                }
                Op::Replacing(model) => { replacing.push(model); Command::Replacing { model } }
                Op::Replaced(n) => {
                    if replacing.is_empty() { continue }
                    Command::Replaced { model: replacing.remove(n % replacing.len()) }
                }
                Op::Advance(s) => { now += Duration::from_secs(s); Command::Tick }
                Op::Grant(kind, each, memory) => {
                    let ask = [Ask::Load, Ask::SecondCopy, Ask::Retry][usize::from(kind)];
                    let loaded: Vec<_> = each
                        .iter()
                        .enumerate()
                        .map(|(m, &(secs, mib, pin, frees))| {
                            let (id, mut model) = loaded(m, secs, mib, pin);
                            model.sleep_frees_mib = frees.min(mib);
                            (id, model)
                        })
                        .collect();
                    let frees: BTreeMap<String, u64> = loaded.iter().map(|(_, m)| (m.name.to_string(), m.sleep_frees_mib)).collect();
                    let pinned: Vec<String> = loaded.iter().filter(|(_, m)| m.held).map(|(_, m)| m.name.to_string()).collect();
                    let memory = memory.map(|(free_mib, needed_mib)| Memory { free_mib, needed_mib });
                    let incoming = Incoming { name: ModelName::new("new").unwrap(), model_type: ModelType::Llm, device: Device::GPU };
                    let mib: BTreeMap<String, u64> = loaded.iter().map(|(_, m)| (m.name.to_string(), m.vram_mib)).collect();
                    let models: Vec<LoadedModel> = loaded.iter().map(|(_, m)| m.clone()).collect();
                    let places = memory.map(|m| Places::one_gpu(m.free_mib, m.needed_mib, &models));
                    let asked = GrantAsk { ask, loaded, incoming, places, host: None };
                    let effects = step(&mut state, Command::Grant { model: NEW, ask: asked, waiter: 1 }, now);
                    let held = |name: &str| {
                        let id = NAMES.iter().position(|n| *n == name).unwrap();
                        pinned.iter().any(|p| p == name)
                            || replacing.contains(&id)
                            || leases.values().any(|(m, deadline)| *m == id && *deadline > now)
                    };
                    match effects.as_slice() {
                        [Effect::Granted { answer: Ok(plan), .. }] => {
                            for victim in &plan.plan.victims {
                                // Invariant: a held model is never a victim.
                                prop_assert!(!held(victim.name.as_str()), "held {} evicted", victim.name);
                                // Invariant: a model is put to sleep or unloaded, not both.
                                prop_assert!(!plan.demote.contains(&victim.name), "{} both", victim.name);
                            }
                            for demoted in &plan.demote {
                                // Invariant: a held model is never put to sleep for another.
                                prop_assert!(!held(demoted.as_str()), "held {demoted} put to sleep");
                            }
                            // Invariant: a grant under a budget never leaves memory over it,
                            // counting what the sleeps it asks for free (a retry evicts what
                            // it can, and is not admitted by memory).
                            if let (Some(memory), false) = (memory, ask == Ask::Retry) {
                                let slept: u64 = plan.demote.iter().map(|n| frees[n.as_str()]).sum();
                                let freed: u64 = slept + plan.plan.victims.iter().map(|v| mib[v.name.as_str()]).sum::<u64>();
                                prop_assert!(
                                    i128::from(memory.free_mib) + i128::from(freed) >= i128::from(memory.needed_mib),
                                    "over budget"
                                );
                            }
                        }
                        [Effect::Granted { answer: Err(Refusal::Held(names)), .. }] => {
                            // Invariant: a refusal for held models names only held ones.
                            prop_assert!(!names.is_empty());
                            prop_assert!(names.iter().all(|n| held(n)), "{names:?} not all held");
                        }
                        [Effect::Granted { answer: Err(Refusal::Vram(_)), .. }] => {}
                        // Invariant: every grant is answered at once, exactly once.
                        other => prop_assert!(false, "{other:?}"),
                    }
                    continue;
                }
            };
            step(&mut state, command, now);
            // The loop and the world agree on what holds each model.
            for id in 0..3 {
                let world = replacing.contains(&id) || leases.values().any(|(m, d)| *m == id && *d > now);
                prop_assert_eq!(state.held(id, now), world, "model {}", id);
            }
        }
    }
}
