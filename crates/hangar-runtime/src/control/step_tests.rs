//! The loop's rules as tables against [`step`], and random command sequences checking its
//! invariants. Waiters are plain numbers; no runtime, no clock.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use proptest::prelude::*;
use tokio::time::Instant;

use super::step::{ModelId, Rules, State, TurnKind, step};
use super::testing::{Command, Effect, row};

const WAIT: Duration = Duration::from_secs(10);

/// Who got what, in order: `(waiter, Some(turn))` for a grant, `(waiter, None)` for busy.
fn answers(effects: Vec<Effect>) -> Vec<(u32, Option<TurnKind>)> {
    effects
        .into_iter()
        .map(|e| match e {
            Effect::Grant { turn, waiter, .. } => (waiter, Some(turn)),
            Effect::Busy { waiter, .. } => (waiter, None),
            lease => unreachable!("no lease operation here: {lease:?}"),
        })
        .collect()
}

fn admin(model: ModelId, waiter: u32) -> Command {
    Command::Admin { model, waiter, wait: true }
}

fn done(model: ModelId, turn: TurnKind) -> Command {
    Command::Done { model, turn }
}

use TurnKind::{Admin, Create, Destroy, Unpinned};

#[test]
fn the_rules_as_a_table() {
    let t0 = Instant::now();
    // (name, commands before, the command, when, its answers)
    type Row = (&'static str, Vec<Command>, Command, u64, Vec<(u32, Option<TurnKind>)>);
    let rows: Vec<Row> = vec![
        ("a free admin turn is granted", vec![], admin(0, 1), 0, vec![(1, Some(Admin))]),
        ("a taken one waits", vec![admin(0, 1)], admin(0, 2), 0, vec![]),
        ("on another model it does not", vec![admin(0, 1)], admin(1, 2), 0, vec![(2, Some(Admin))]),
        (
            "the end of a turn grants the next, in order",
            vec![admin(0, 1), admin(0, 2), admin(0, 3)],
            done(0, Admin),
            1,
            vec![(2, Some(Admin))],
        ),
        (
            "a wait past its deadline is busy",
            vec![admin(0, 1), admin(0, 2)],
            Command::Tick,
            10,
            vec![(2, None)],
        ),
        ("not before", vec![admin(0, 1), admin(0, 2)], Command::Tick, 9, vec![]),
        (
            "an expired wait is never granted",
            vec![admin(0, 1), admin(0, 2)],
            done(0, Admin),
            11,
            vec![(2, None)],
        ),
        (
            "an idle unload does not wait",
            vec![admin(0, 1)],
            Command::Admin { model: 0, waiter: 2, wait: false },
            0,
            vec![(2, None)],
        ),
        (
            "a free lane is granted",
            vec![],
            Command::Create { model: 0, waiter: 1 },
            0,
            vec![(1, Some(Create))],
        ),
        (
            "one creation at a time, any model",
            vec![Command::Create { model: 0, waiter: 1 }],
            Command::Create { model: 1, waiter: 2 },
            0,
            vec![],
        ),
        (
            "the lane passes on",
            vec![Command::Create { model: 0, waiter: 1 }, Command::Create { model: 1, waiter: 2 }],
            done(0, Create),
            0,
            vec![(2, Some(Create))],
        ),
        (
            "an eviction of another model is not held up by the lane",
            vec![Command::Create { model: 0, waiter: 1 }],
            Command::Destroy { model: 1, waiter: 2 },
            0,
            vec![(2, Some(Destroy))],
        ),
        (
            "creating and destroying one model exclude each other",
            vec![Command::Create { model: 0, waiter: 1 }],
            Command::Destroy { model: 0, waiter: 2 },
            0,
            vec![],
        ),
        (
            "a creation waits for its model's destruction",
            vec![Command::Destroy { model: 0, waiter: 1 }],
            Command::Create { model: 0, waiter: 2 },
            0,
            vec![],
        ),
        (
            "and lets the next creation pass meanwhile",
            vec![Command::Destroy { model: 0, waiter: 1 }, Command::Create { model: 0, waiter: 2 }],
            Command::Create { model: 1, waiter: 3 },
            0,
            vec![(3, Some(Create))],
        ),
        (
            "then goes once it is done",
            vec![Command::Destroy { model: 0, waiter: 1 }, Command::Create { model: 0, waiter: 2 }],
            done(0, Destroy),
            0,
            vec![(2, Some(Create))],
        ),
        (
            "a waiting destruction goes before a creation of its model",
            vec![
                Command::Destroy { model: 0, waiter: 1 },
                Command::Create { model: 0, waiter: 2 },
                Command::Destroy { model: 0, waiter: 3 },
            ],
            done(0, Destroy),
            0,
            vec![(3, Some(Destroy))],
        ),
        (
            "an unpinned model answers at once",
            vec![],
            Command::AwaitUnpinned { model: 0, pins: 0, waiter: 1 },
            0,
            vec![(1, Some(Unpinned))],
        ),
        (
            "a pinned one waits",
            vec![],
            Command::AwaitUnpinned { model: 0, pins: 2, waiter: 1 },
            0,
            vec![],
        ),
        (
            "until the last pin goes",
            vec![Command::AwaitUnpinned { model: 0, pins: 2, waiter: 1 }],
            Command::Unpinned { model: 0, pins: 0 },
            0,
            vec![(1, Some(Unpinned))],
        ),
        (
            "not before",
            vec![Command::AwaitUnpinned { model: 0, pins: 2, waiter: 1 }],
            Command::Unpinned { model: 0, pins: 1 },
            0,
            vec![],
        ),
        (
            "a stray end changes nothing",
            vec![Command::Create { model: 0, waiter: 1 }, Command::Create { model: 1, waiter: 2 }],
            done(0, Destroy),
            0,
            vec![],
        ),
        ("an unknown model changes nothing", vec![], admin(7, 1), 0, vec![]),
    ];
    for (name, before, command, when, expected) in rows {
        let got = answers(row(3, Rules::of(WAIT, 1), before, command, (t0, when)));
        assert_eq!(got, expected, "{name}");
    }
}

#[test]
fn the_next_deadline_is_the_earliest_wait() {
    let t0 = Instant::now();
    let mut state = State::new(2, Rules::of(WAIT, 1));
    assert_eq!(state.next_deadline(), None);
    step(&mut state, admin(0, 1), t0);
    step(&mut state, admin(1, 2), t0);
    step(&mut state, admin(1, 3), t0 + Duration::from_secs(3));
    step(&mut state, admin(0, 4), t0 + Duration::from_secs(5));
    assert_eq!(state.next_deadline(), Some(t0 + Duration::from_secs(13)));
    // Waiter 3 is granted before its deadline: that Tick changes nothing, the next is 4's.
    assert_eq!(
        answers(step(&mut state, done(1, Admin), t0 + Duration::from_secs(6))),
        [(3, Some(Admin))]
    );
    let tick = step(&mut state, Command::Tick, t0 + Duration::from_secs(13));
    assert!(tick.is_empty());
    assert_eq!(state.next_deadline(), Some(t0 + Duration::from_secs(15)));
    let tick = step(&mut state, Command::Tick, t0 + Duration::from_secs(15));
    assert_eq!(answers(tick), [(4, None)]);
    assert_eq!(state.next_deadline(), None);
}

#[derive(Debug, Clone)]
enum Op {
    Admin(ModelId, bool),
    Create(ModelId),
    Destroy(ModelId),
    /// Ends the n-th held turn (modulo how many are held).
    End(usize),
    Pin(ModelId),
    Unpin(usize),
    AwaitUnpinned(ModelId),
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    let model = 0..3usize;
    prop_oneof![
        (model.clone(), any::<bool>()).prop_map(|(m, w)| Op::Admin(m, w)),
        model.clone().prop_map(Op::Create),
        model.clone().prop_map(Op::Destroy),
        any::<usize>().prop_map(Op::End),
        any::<usize>().prop_map(Op::End),
        model.clone().prop_map(Op::Pin),
        any::<usize>().prop_map(Op::Unpin),
        model.prop_map(Op::AwaitUnpinned),
        (0..15u64).prop_map(Op::Advance),
    ]
}

/// The world around the loop: who holds what, who was answered, the pins.
#[derive(Default)]
struct World {
    /// Granted and not ended: waiter → (model, turn).
    held: BTreeMap<u32, (ModelId, TurnKind)>,
    answered: BTreeSet<u32>,
    asked: BTreeSet<u32>,
    pins: BTreeMap<ModelId, u32>,
    /// Pin waits: waiter → model.
    pin_waits: BTreeMap<u32, ModelId>,
}

impl World {
    fn take(&mut self, effects: Vec<Effect>) {
        for effect in effects {
            let (waiter, grant) = match effect {
                Effect::Grant { model, turn, waiter } => (waiter, Some((model, turn))),
                Effect::Busy { waiter, .. } => (waiter, None),
                lease => unreachable!("no lease operation here: {lease:?}"),
            };
            // Invariant: every waiter is answered exactly once, and only one that asked.
            assert!(self.asked.contains(&waiter), "answered {waiter}, who never asked");
            assert!(self.answered.insert(waiter), "{waiter} answered twice");
            match grant {
                Some((model, TurnKind::Unpinned)) => {
                    // Invariant: a pin wait ends only when nothing pins the model.
                    assert_eq!(self.pins.get(&model).copied().unwrap_or(0), 0);
                    self.pin_waits.remove(&waiter);
                }
                Some(held) => {
                    self.held.insert(waiter, held);
                }
                None => {}
            }
        }
    }

    fn check(&self, state: &State<u32>) {
        let holders = |model: ModelId, kinds: &[TurnKind]| {
            self.held.values().filter(|(m, k)| *m == model && kinds.contains(k)).count()
        };
        for model in 0..3 {
            // Invariant: one admin operation per model at a time.
            assert!(holders(model, &[TurnKind::Admin]) <= 1);
            // Invariant: one creator or destroyer of a model's runtimes at a time.
            assert!(holders(model, &[TurnKind::Create, TurnKind::Destroy]) <= 1);
            assert_eq!(state.admin_held(model), holders(model, &[TurnKind::Admin]) == 1);
        }
        // Invariant: with every model taking every place (the rules here), one creation in
        // the lane at a time, and it holds its model's runtimes.
        let creating: Vec<ModelId> =
            self.held.values().filter(|(_, k)| *k == TurnKind::Create).map(|(m, _)| *m).collect();
        assert!(creating.len() <= 1);
        assert_eq!(state.lane(), creating.as_slice());
        for &model in state.lane() {
            assert_eq!(state.runtimes(model), Some(TurnKind::Create));
        }
        // Invariant: no command lost: whoever asked and was not answered still waits.
        assert_eq!(state.waiting(), self.asked.len() - self.answered.len());
    }
}

proptest! {
    #[test]
    fn random_commands_keep_the_invariants(ops in prop::collection::vec(op(), 1..80)) {
        let t0 = Instant::now();
        let mut now = t0;
        let mut state = State::new(3, Rules::of(WAIT, 1));
        let mut world = World::default();
        let mut next = 0u32;
        let mut ask = |world: &mut World| { next += 1; world.asked.insert(next); next };
        for op in ops {
            let command = match op {
                Op::Admin(model, wait) => Command::Admin { model, waiter: ask(&mut world), wait },
                Op::Create(model) => Command::Create { model, waiter: ask(&mut world) },
                Op::Destroy(model) => Command::Destroy { model, waiter: ask(&mut world) },
                Op::End(n) => {
                    let Some(&waiter) = world.held.keys().nth(n % world.held.len().max(1)) else { continue };
                    let (model, turn) = world.held.remove(&waiter).unwrap();
                    Command::Done { model, turn }
                }
                Op::Pin(model) => { *world.pins.entry(model).or_default() += 1; continue }
                Op::Unpin(n) => {
                    let pinned: Vec<ModelId> = world.pins.iter().filter(|(_, p)| **p > 0).map(|(m, _)| *m).collect();
                    let Some(&model) = pinned.get(n % pinned.len().max(1)) else { continue };
                    let pins = world.pins.get_mut(&model).unwrap();
                    *pins -= 1;
                    Command::Unpinned { model, pins: *pins }
                }
                Op::AwaitUnpinned(model) => {
                    let waiter = ask(&mut world);
                    world.pin_waits.insert(waiter, model);
                    Command::AwaitUnpinned { model, pins: world.pins.get(&model).copied().unwrap_or(0), waiter }
                }
                Op::Advance(s) => { now += Duration::from_secs(s); Command::Tick }
            };
            world.take(step(&mut state, command, now));
            world.check(&state);
        }
        // Everyone ends their turn, every pin goes, time passes: every waiter is answered.
        for _ in 0..1000 {
            let Some((&waiter, _)) = world.held.iter().next() else { break };
            let (model, turn) = world.held.remove(&waiter).unwrap();
            world.take(step(&mut state, Command::Done { model, turn }, now));
            world.check(&state);
        }
        for model in 0..3 {
            world.pins.insert(model, 0);
            world.take(step(&mut state, Command::Unpinned { model, pins: 0 }, now));
        }
        world.take(step(&mut state, Command::Tick, now + WAIT));
        while let Some((&waiter, _)) = world.held.iter().next() {
            let (model, turn) = world.held.remove(&waiter).unwrap();
            world.take(step(&mut state, Command::Done { model, turn }, now + WAIT));
        }
        world.check(&state);
        prop_assert_eq!(world.answered.len(), world.asked.len());
        prop_assert!(state.lane().is_empty());
    }
}
