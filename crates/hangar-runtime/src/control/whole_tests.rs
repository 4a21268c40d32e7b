//! The whole loop under random commands of every kind — turns, pins, leases, unloads,
//! lifecycle moves, pauses, grants, idle questions, releases, ticks — checking the
//! invariants that span its rules. Waiters are plain numbers; no runtime, no clock.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant as StdInstant};

use hangar_config::{Device, ModelName, ModelType};
use hangar_eviction::{Incoming, LoadedModel};
use hangar_lifecycle::{ModelState, next_state};
use proptest::prelude::*;
use tokio::time::Instant;

use super::step::{
    Change, GrantAsk, IdleSeen, LeaseCommand, LoadFailed, Rules, State, TurnKind, step,
};
use super::testing::{Command, Effect, acquire, mv};
use crate::grant::{Ask, Places, Refusal};
use crate::lease::Held;
use crate::pause::{PauseCause, PauseMode};

const MODELS: usize = 3;
const NAMES: [&str; MODELS] = ["a", "b", "c"];

#[derive(Debug, Clone)]
enum Op {
    Admin(usize, bool),
    Create(usize),
    Destroy(usize),
    /// Ends the n-th turn held.
    End(usize),
    Acquire(usize, u32),
    /// Settles the n-th reservation.
    Settle(usize, bool),
    Release(usize),
    Decide(usize),
    /// Ends the n-th decided unload.
    EndUnload(usize, bool),
    Replacing(usize),
    /// Ends the n-th replacement.
    Replaced(usize),
    /// A lifecycle move of the kind numbered.
    Move(usize, u8),
    /// A grant for a model, evicting among the others: each one's (last use, MiB), memory.
    Grant(usize, Vec<(u64, u64)>, Option<(i64, u64)>),
    Idle(usize, u64),
    Released(u64, u64),
    AwaitRelease(Option<u64>),
    Flush,
    /// A crashed model's teardown ends, giving nothing back.
    TornDown(usize),
    Advance(u64),
    /// The model leaves the config (down only, or forced).
    Retire(usize, bool),
    /// May the model load (explicitly)?
    MayLoad(usize),
}

fn op() -> impl Strategy<Value = Op> {
    let m = 0..MODELS;
    prop_oneof![
        (m.clone(), any::<bool>()).prop_map(|(m, w)| Op::Admin(m, w)),
        m.clone().prop_map(Op::Create),
        m.clone().prop_map(Op::Destroy),
        any::<usize>().prop_map(Op::End),
        (m.clone(), 1..30u32).prop_map(|(m, t)| Op::Acquire(m, t)),
        (any::<usize>(), any::<bool>()).prop_map(|(n, l)| Op::Settle(n, l)),
        any::<usize>().prop_map(Op::Release),
        m.clone().prop_map(Op::Decide),
        (any::<usize>(), any::<bool>()).prop_map(|(n, r)| Op::EndUnload(n, r)),
        m.clone().prop_map(Op::Replacing),
        any::<usize>().prop_map(Op::Replaced),
        (m.clone(), 0..10u8).prop_map(|(m, k)| Op::Move(m, k)),
        (
            m.clone(),
            prop::collection::vec((0..50u64, 0..4000u64), MODELS),
            proptest::option::of((-1000..6000i64, 0..6000u64))
        )
            .prop_map(|(m, e, mem)| Op::Grant(m, e, mem)),
        (m.clone(), 0..120u64).prop_map(|(m, s)| Op::Idle(m, s)),
        (0..10_000u64, 0..4_000u64).prop_map(|(u, h)| Op::Released(u, h)),
        proptest::option::of(0..10_000u64).prop_map(Op::AwaitRelease),
        Just(Op::Flush),
        (0..MODELS).prop_map(Op::TornDown),
        (0..8u64).prop_map(Op::Advance),
        (m.clone(), any::<bool>()).prop_map(|(m, d)| Op::Retire(m, d)),
        m.clone().prop_map(Op::MayLoad),
    ]
}

/// What the world saw of the loop.
#[derive(Default)]
struct World {
    asked: BTreeSet<u32>,
    answered: BTreeSet<u32>,
    /// Turns granted and not ended: waiter → (model, kind).
    turns: BTreeMap<u32, (usize, TurnKind)>,
    reserved: Vec<(usize, String)>,
    taken: Vec<(usize, String)>,
    unloads: Vec<usize>,
    replacing: Vec<usize>,
    /// The leases and replacements each model was last published with.
    leases: BTreeMap<usize, Vec<Held>>,
    replaced: BTreeMap<usize, u32>,
    states: BTreeMap<usize, ModelState>,
    /// Models that left the config.
    retired: BTreeSet<usize>,
}

impl World {
    fn held(&self, model: usize, now: Instant) -> bool {
        self.replaced.get(&model).copied().unwrap_or(0) > 0
            || self.leases.get(&model).is_some_and(|l| l.iter().any(|h| h.deadline > now))
    }

    fn state(&self, model: usize) -> ModelState {
        self.states.get(&model).copied().unwrap_or(ModelState::Unloaded)
    }

    fn answer(&mut self, waiter: u32) {
        // Invariant: every waiter is answered exactly once, and only one that asked.
        assert!(self.asked.contains(&waiter), "answered {waiter}, who never asked");
        assert!(self.answered.insert(waiter), "{waiter} answered twice");
    }

    /// Takes a step's effects, checking the invariants each one must keep.
    fn take(
        &mut self,
        effects: Vec<Effect>,
        asked: Option<&Command>,
        mib: &BTreeMap<String, u64>,
        now: Instant,
    ) {
        for effect in effects {
            match effect {
                Effect::Grant { model, turn, waiter } => {
                    self.answer(waiter);
                    if turn != TurnKind::Unpinned {
                        self.turns.insert(waiter, (model, turn));
                    }
                }
                Effect::Leases { model, held } => {
                    self.leases.insert(model, held);
                }
                Effect::Replacing { model, count } => {
                    self.replaced.insert(model, count);
                }
                Effect::Lease { model, waiter, answer } => {
                    self.answer(waiter);
                    // A lease not seen before was just reserved.
                    if let Ok(lease) = answer
                        && !self.taken.iter().any(|(_, id)| *id == lease.id)
                    {
                        self.reserved.push((model, lease.id.clone()));
                        self.taken.push((model, lease.id));
                    }
                }
                Effect::Moved { model, moved, waiter, .. } => {
                    self.answer(waiter);
                    // Invariant: the state follows the transition table, from the one last moved to.
                    assert_eq!(moved.from, self.state(model));
                    let to = moved.event.map_or(Ok(moved.from), |e| next_state(moved.from, e));
                    assert_eq!(Ok(moved.to), to);
                    if let Some(Command::Move {
                        change: Change::StartUnload { evict: true, .. },
                        ..
                    }) = asked
                    {
                        // Invariant: an eviction never takes a model the loop published as held.
                        assert!(!self.held(model, now), "held {model} evicted");
                    }
                    self.states.insert(model, moved.to);
                }
                Effect::Granted { waiter, answer, .. } => {
                    self.answer(waiter);
                    let Some(Command::Grant { ask, .. }) = asked else { unreachable!() };
                    if let Ok(plan) = answer {
                        for victim in &plan.plan.victims {
                            let id = NAMES.iter().position(|n| *n == victim.name.as_str()).unwrap();
                            // Invariant: a held model is never a victim.
                            assert!(!self.held(id, now), "held {} chosen", victim.name);
                        }
                        if let (Some(places), false) = (&ask.places, ask.ask == Ask::Retry) {
                            let freed: u64 =
                                plan.plan.victims.iter().map(|v| mib[v.name.as_str()]).sum();
                            let free = places.gpus[0].free_mib;
                            // Invariant: memory never over the budget.
                            assert!(
                                i128::from(free) + i128::from(freed)
                                    >= i128::from(places.fit.needed_mib)
                            );
                        }
                    } else if let Err(Refusal::Held(names)) = answer {
                        for name in names {
                            let id = NAMES.iter().position(|n| *n == name).unwrap();
                            assert!(self.held(id, now), "{name} refused as held");
                        }
                    }
                }
                Effect::Idle { model, waiter, answer } => {
                    self.answer(waiter);
                    // Invariant: only a loaded model nothing holds is idle.
                    if answer.is_some() {
                        assert_eq!(self.state(model), ModelState::Loaded);
                        assert!(!self.held(model, now));
                    }
                }
                Effect::Retired { model, waiter, retired } => {
                    self.answer(waiter);
                    let Some(Command::Retire { down_only, .. }) = asked else { unreachable!() };
                    if retired && *down_only {
                        // Invariant: a model leaves down-only with nothing of it running or
                        // about to: unloaded or failed, no admin or creation turn held.
                        assert!(matches!(
                            self.state(model),
                            ModelState::Unloaded | ModelState::Failed
                        ));
                        let holds = |t: &TurnKind| matches!(t, TurnKind::Admin | TurnKind::Create);
                        assert!(!self.turns.values().any(|(m, t)| *m == model && holds(t)));
                    }
                    if retired {
                        self.retired.insert(model);
                    }
                }
                Effect::MayLoad { model, waiter, answer } => {
                    self.answer(waiter);
                    // Invariant: no load of a model that left the config may start.
                    assert!(
                        !(self.retired.contains(&model) && answer.is_ok()),
                        "{model} left, yet may load"
                    );
                }
                Effect::Busy { waiter, .. }
                | Effect::Stays { waiter, .. }
                | Effect::Flushed { waiter }
                | Effect::Release { waiter, .. } => self.answer(waiter),
                Effect::LeaseChanged { .. }
                | Effect::Failures { .. }
                | Effect::Quarantined { .. }
                | Effect::QuarantineLifted { .. }
                | Effect::Figures { .. } => {}
            }
        }
    }
}

fn pick<T: Clone>(list: &mut Vec<T>, n: usize) -> Option<T> {
    (!list.is_empty()).then(|| list.remove(n % list.len()))
}

proptest! {
    /// Whatever commands of every kind come, in any order: every waiter is answered exactly
    /// once and no command is lost (those not answered still wait); the state follows the
    /// transition table; no model the loop holds is evicted or chosen as a victim or found
    /// idle; a grant never leaves memory over the budget.
    #[test]
    fn the_whole_loop_keeps_its_invariants(ops in prop::collection::vec(op(), 1..120)) {
        static BASE: std::sync::OnceLock<StdInstant> = std::sync::OnceLock::new();
        let base = *BASE.get_or_init(StdInstant::now);
        let t0 = Instant::now();
        let mut now = t0;
        let mut state = State::new(MODELS, Rules::of(Duration::from_secs(10), 2));
        let mut world = World::default();
        for (waiter, op) in (1u32..).zip(ops) {
            let mut mib = BTreeMap::new();
            let command = match op {
                Op::Admin(model, wait) => Command::Admin { model, waiter, wait },
                Op::Create(model) => Command::Create { model, waiter },
                Op::Destroy(model) => Command::Destroy { model, waiter },
                Op::End(n) => {
                    let Some(&held) = world.turns.keys().nth(n % world.turns.len().max(1)) else { continue };
                    let (model, turn) = world.turns.remove(&held).unwrap();
                    Command::Done { model, turn }
                }
                Op::Acquire(model, ttl_seconds) => acquire(model, waiter, ttl_seconds),
                Op::Settle(n, loaded) => {
                    let Some((model, id)) = pick(&mut world.reserved, n) else { continue };
                    Command::Lease { model, command: LeaseCommand::Settle { id, loaded, waiter } }
                }
                Op::Release(n) => {
                    let Some((model, id)) = world.taken.get(n % world.taken.len().max(1)).cloned() else { continue };
                    Command::Lease { model, command: LeaseCommand::Release { id, waiter } }
                }
                Op::Decide(model) => { world.unloads.push(model); Command::UnloadDecided { model } }
                Op::EndUnload(n, revoke) => {
                    let Some(model) = pick(&mut world.unloads, n) else { continue };
                    Command::UnloadEnded { model, revoke }
                }
                Op::Replacing(model) => { world.replacing.push(model); Command::Replacing { model } }
                Op::Replaced(n) => {
                    let Some(model) = pick(&mut world.replacing, n) else { continue };
                    Command::Replaced { model }
                }
                Op::Move(model, kind) => {
                    let change = match kind {
                        0 => Change::StartLoad,
                        1 => Change::LoadDone { failed: None },
                        2 => Change::LoadDone { failed: Some(LoadFailed { exhausted: waiter % 2 == 0, ..LoadFailed::counted("no") }) },
                        3 => Change::Reload,
                        4 => Change::Swap,
                        5 => Change::StartUnload { evict: true, pinned: false },
                        6 => Change::StartUnload { evict: false, pinned: false },
                        7 => Change::UnloadDone,
                        8 => Change::Pause { mode: PauseMode::Retract, cause: PauseCause::Operator },
                        _ => Change::Crash { generation: (waiter % 3).into(), message: "boom".into() },
                    };
                    mv(model, change, waiter)
                }
                Op::Grant(model, each, memory) => {
                    let loaded: Vec<(usize, LoadedModel)> = each.iter().enumerate().filter(|(m, _)| *m != model).map(|(m, &(secs, vram_mib))| {
                        mib.insert(NAMES[m].to_owned(), vram_mib);
                        (m, LoadedModel {
                            name: ModelName::new(NAMES[m]).unwrap(),
                            model_type: ModelType::Llm,
                            device: Device::GPU,
                            last_use: base + Duration::from_secs(secs),
                            inflight: 0,
                            held: false,
                            vram_mib,
                            asleep: false,
                            sleep_frees_mib: 0,
                        })
                    }).collect();
                    let incoming = Incoming { name: ModelName::new(NAMES[model]).unwrap(), model_type: ModelType::Llm, device: Device::GPU };
                    let models: Vec<LoadedModel> = loaded.iter().map(|(_, m)| m.clone()).collect();
                    let places = memory.map(|(free, needed)| Places::one_gpu(free, needed, &models));
                    let ask = [Ask::Load, Ask::SecondCopy, Ask::Retry][waiter as usize % 3];
                    Command::Grant { model, ask: GrantAsk { ask, loaded, incoming, places, host: None }, waiter }
                }
                Op::Idle(model, secs) => {
                    let seen = IdleSeen {
                        unload: std::num::NonZeroU32::new(60),
                        sleep: std::num::NonZeroU32::new(30),
                        pinned: false,
                        busy: false,
                        pins: 0,
                        idle: Duration::from_secs(secs),
                    };
                    Command::Idle { model, seen, waiter }
                }
                Op::Released(used_before, held) => {
                    Command::Released { releases: vec![(0, used_before, held)] }
                }
                Op::AwaitRelease(used) => {
                    Command::AwaitRelease { on: Vec::new(), used: used.map(|u| vec![(0, u)]), waiter }
                }
                Op::Flush => Command::Flush { waiter },
                Op::TornDown(model) => Command::TornDown { model, releases: Vec::new() },
                Op::Advance(s) => { now += Duration::from_secs(s); Command::Tick }
                Op::Retire(model, down_only) => Command::Retire { model, down_only, waiter },
                Op::MayLoad(model) => Command::MayLoad { model, explicit: waiter % 2 == 0, wall_ms: 0, waiter },
            };
            let asks = matches!(
                command,
                Command::Admin { .. } | Command::Create { .. } | Command::Destroy { .. }
                    | Command::Lease { .. } | Command::Move { .. } | Command::Grant { .. }
                    | Command::Idle { .. } | Command::AwaitRelease { .. } | Command::Flush { .. }
                    | Command::Retire { .. } | Command::MayLoad { .. }
            );
            if asks {
                world.asked.insert(waiter);
            }
            let shown = matches!(command, Command::Move { .. } | Command::Grant { .. } | Command::Retire { .. }).then(|| command.clone());
            let effects = step(&mut state, command, now);
            world.take(effects, shown.as_ref(), &mib, now);
            // Invariant: no command lost: whoever asked and was not answered still waits.
            prop_assert_eq!(state.waiting(), world.asked.len() - world.answered.len());
        }
    }
}
