//! The lease rules as a table against [`step`], and random lease operations checking their
//! invariants. Waiters are plain numbers; no runtime, no clock.

use std::collections::{BTreeMap, BTreeSet};
use std::num::NonZeroU32;
use std::time::Duration;

use proptest::prelude::*;
use tokio::time::Instant;

use super::step::{LeaseCommand, LeaseRefusal, ModelId, Rules, State, step};
use super::testing::{Command, Effect, acquire, row};

use crate::lease::LeaseChange;

const WAIT: Duration = Duration::from_secs(10);
const LIMIT: NonZeroU32 = NonZeroU32::new(2).unwrap();

fn settle(model: ModelId, id: &str, loaded: bool, waiter: u32) -> Command {
    Command::Lease { model, command: LeaseCommand::Settle { id: id.into(), loaded, waiter } }
}

fn renew(model: ModelId, id: &str, ttl_seconds: Option<u32>, waiter: u32) -> Command {
    let command = LeaseCommand::Renew { id: id.into(), ttl_seconds, wall_ms: 1_000, waiter };
    Command::Lease { model, command }
}

fn release(model: ModelId, id: &str, waiter: u32) -> Command {
    Command::Lease { model, command: LeaseCommand::Release { id: id.into(), waiter } }
}

fn decided(model: ModelId) -> Command {
    Command::UnloadDecided { model }
}

fn ended(model: ModelId, revoke: bool) -> Command {
    Command::UnloadEnded { model, revoke }
}

fn refusal(r: LeaseRefusal) -> &'static str {
    match r {
        LeaseRefusal::UnloadPending => "unload_pending",
        LeaseRefusal::TooMany { limit: 2 } => "too_many",
        LeaseRefusal::TooMany { .. } => "too_many, another limit",
        LeaseRefusal::NotFound => "not_found",
        LeaseRefusal::Ended => "ended",
    }
}

/// The effects as lines: `published M: ids`, `journal M: change id`, `W: id` or `W: refusal`.
fn lines(effects: Vec<Effect>) -> Vec<String> {
    effects
        .into_iter()
        .map(|e| match e {
            Effect::Leases { model, held } => {
                let ids: Vec<_> = held.iter().map(|h| h.lease.id.as_str()).collect();
                format!(
                    "published {model}: {}",
                    if ids.is_empty() { "-".into() } else { ids.join(",") }
                )
            }
            Effect::LeaseChanged { model, change, lease } => {
                format!("journal {model}: {} {}", format!("{change:?}").to_lowercase(), lease.id)
            }
            Effect::Lease { waiter, answer: Ok(lease), .. } => format!("{waiter}: {}", lease.id),
            Effect::Lease { waiter, answer: Err(r), .. } => format!("{waiter}: {}", refusal(r)),
            turn => unreachable!("no turn asked for here: {turn:?}"),
        })
        .collect()
}

#[test]
fn the_lease_rules_as_a_table() {
    let t0 = Instant::now();
    // (name, commands before (at t0), the command, when (seconds after t0), its effects)
    type Row = (&'static str, Vec<Command>, Command, u64, Vec<&'static str>);
    let rows: Vec<Row> = vec![
        (
            "a lease is reserved and published before its answer, not journaled yet",
            vec![],
            acquire(0, 1, 60),
            0,
            vec!["published 0: lease-1", "1: lease-1"],
        ),
        (
            "granted once its model loaded, and journaled",
            vec![acquire(0, 1, 60)],
            settle(0, "lease-1", true, 2),
            0,
            vec!["journal 0: acquired lease-1", "2: lease-1"],
        ),
        (
            "a load that failed drops it",
            vec![acquire(0, 1, 60)],
            settle(0, "lease-1", false, 2),
            0,
            vec!["published 0: -", "2: ended"],
        ),
        (
            "never while an unload is decided",
            vec![decided(0)],
            acquire(0, 1, 60),
            0,
            vec!["1: unload_pending"],
        ),
        (
            "an unload decided during its load wins",
            vec![acquire(0, 1, 60), decided(0)],
            settle(0, "lease-1", true, 2),
            0,
            vec!["published 0: -", "2: unload_pending"],
        ),
        (
            "an unload of another model does not matter",
            vec![decided(1)],
            acquire(0, 1, 60),
            0,
            vec!["published 0: lease-1", "1: lease-1"],
        ),
        (
            "an unload that ended without revoking bars nothing more",
            vec![decided(0), ended(0, false)],
            acquire(0, 1, 60),
            0,
            vec!["published 0: lease-1", "1: lease-1"],
        ),
        (
            "an unload that ends revoking takes every lease, journaled",
            vec![acquire(0, 1, 60), settle(0, "lease-1", true, 2), acquire(0, 3, 60), decided(0)],
            ended(0, true),
            0,
            vec!["published 0: -", "journal 0: revoked lease-1", "journal 0: revoked lease-2"],
        ),
        (
            "a reservation revoked before its load ended is not granted",
            vec![acquire(0, 1, 60), decided(0), ended(0, true)],
            settle(0, "lease-1", true, 2),
            0,
            vec!["2: ended"],
        ),
        (
            "at the cap",
            vec![acquire(0, 1, 60), acquire(0, 2, 60)],
            acquire(0, 3, 60),
            0,
            vec!["3: too_many"],
        ),
        (
            "expired leases do not count, even before the tick drops them",
            vec![acquire(0, 1, 5), acquire(0, 2, 60)],
            acquire(0, 3, 60),
            5,
            vec!["published 0: lease-1,lease-2,lease-3", "3: lease-3"],
        ),
        (
            "a tick drops expired leases, journaled",
            vec![acquire(0, 1, 5), acquire(0, 2, 60)],
            Command::Tick,
            5,
            vec!["published 0: lease-2", "journal 0: expired lease-1"],
        ),
        ("not before", vec![acquire(0, 1, 5)], Command::Tick, 4, vec![]),
        (
            "a renewal moves the deadline",
            vec![acquire(0, 1, 5), renew(0, "lease-1", Some(60), 2)],
            Command::Tick,
            5,
            vec![],
        ),
        (
            "a renewal is published and journaled",
            vec![acquire(0, 1, 5)],
            renew(0, "lease-1", None, 2),
            4,
            vec!["published 0: lease-1", "journal 0: renewed lease-1", "2: lease-1"],
        ),
        (
            "an expired lease is not renewed, even before the tick",
            vec![acquire(0, 1, 5)],
            renew(0, "lease-1", None, 2),
            5,
            vec!["2: not_found"],
        ),
        (
            "a release is published and journaled",
            vec![acquire(0, 1, 60), settle(0, "lease-1", true, 2)],
            release(0, "lease-1", 3),
            0,
            vec!["published 0: -", "journal 0: released lease-1", "3: lease-1"],
        ),
        ("an unknown id is not found", vec![], release(0, "lease-9", 1), 0, vec!["1: not_found"]),
        (
            "a lease belongs to its model",
            vec![acquire(0, 1, 60)],
            release(1, "lease-1", 2),
            0,
            vec!["2: not_found"],
        ),
        ("an unknown model changes nothing", vec![], acquire(7, 1, 60), 0, vec![]),
    ];
    for (name, before, command, when, expected) in rows {
        let got = lines(row(2, Rules::of(WAIT, LIMIT.get()), before, command, (t0, when)));
        assert_eq!(got, expected, "{name}");
    }
}

#[test]
fn a_lease_runs_from_the_wall_time_asked_and_its_deadline_wakes_the_loop() {
    let t0 = Instant::now();
    let mut state = State::new(1, Rules::of(WAIT, LIMIT.get()));
    let effects = step(&mut state, acquire(0, 1, 60), t0);
    let Some(Effect::Lease { answer: Ok(lease), .. }) = effects.last() else {
        panic!("{effects:?}")
    };
    assert_eq!((lease.ttl_seconds, lease.expires_unix_ms), (60, 61_000));
    assert_eq!(state.next_deadline(), Some(t0 + Duration::from_secs(60)));
    let renewed = step(&mut state, renew(0, "lease-1", Some(90), 2), t0 + Duration::from_secs(30));
    let Some(Effect::Lease { answer: Ok(lease), .. }) = renewed.last() else {
        panic!("{renewed:?}")
    };
    assert_eq!((lease.ttl_seconds, lease.expires_unix_ms), (90, 91_000));
    // The old deadline still wakes the loop, which then expires nothing.
    assert!(step(&mut state, Command::Tick, t0 + Duration::from_secs(60)).is_empty());
    assert_eq!(state.next_deadline(), Some(t0 + Duration::from_secs(120)));
    assert_eq!(lines(step(&mut state, Command::Tick, t0 + Duration::from_secs(120))).len(), 2);
    assert_eq!(state.next_deadline(), None);
}

#[derive(Debug, Clone)]
enum Op {
    Acquire(ModelId, u32),
    /// Settles the n-th reservation not settled yet.
    Settle(usize, bool),
    /// Renews the n-th lease ever taken.
    Renew(usize, Option<u32>),
    Release(usize),
    Decide(ModelId),
    /// Ends the n-th unload open.
    End(usize, bool),
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    let model = 0..2usize;
    prop_oneof![
        (model.clone(), 1..20u32).prop_map(|(m, t)| Op::Acquire(m, t)),
        (any::<usize>(), any::<bool>()).prop_map(|(n, l)| Op::Settle(n, l)),
        (any::<usize>(), proptest::option::of(1..20u32)).prop_map(|(n, t)| Op::Renew(n, t)),
        any::<usize>().prop_map(Op::Release),
        model.prop_map(Op::Decide),
        (any::<usize>(), any::<bool>()).prop_map(|(n, r)| Op::End(n, r)),
        (0..8u64).prop_map(Op::Advance),
    ]
}

/// What the world saw of the leases.
#[derive(Default)]
struct World {
    /// Every lease taken: id → model.
    taken: BTreeMap<String, ModelId>,
    /// Reservations not settled: (model, id).
    reserved: Vec<(ModelId, String)>,
    /// Unloads decided and not ended, per model.
    unloads: BTreeMap<ModelId, u32>,
    /// Leases that ended (released, expired, revoked, or dropped unsettled).
    ended: BTreeSet<String>,
    /// What each model's leases were last published as.
    published: BTreeMap<ModelId, Vec<String>>,
    granted: BTreeSet<String>,
}

impl World {
    /// Takes one lease operation's effects; returns its answer.
    fn take(
        &mut self,
        effects: Vec<Effect>,
        waiter: Option<u32>,
    ) -> Option<Result<String, LeaseRefusal>> {
        let mut answer = None;
        for effect in effects {
            match effect {
                Effect::Leases { model, held } => {
                    // Invariant: what is published comes before the answer.
                    assert!(answer.is_none(), "published after the answer");
                    let ids = held.iter().map(|h| h.lease.id.clone()).collect();
                    self.published.insert(model, ids);
                }
                Effect::LeaseChanged { change, lease, .. } => {
                    if change == LeaseChange::Acquired {
                        assert!(
                            self.granted.insert(lease.id.clone()),
                            "{} granted twice",
                            lease.id
                        );
                    } else if change != LeaseChange::Renewed {
                        // Invariant: a lease ends once.
                        assert!(self.ended.insert(lease.id.clone()), "{} ended twice", lease.id);
                    }
                }
                Effect::Lease { waiter: w, answer: a, .. } => {
                    // Invariant: every lease operation is answered at once, exactly once.
                    assert_eq!(Some(w), waiter, "answered {w}, who did not ask now");
                    assert!(answer.is_none(), "{w} answered twice");
                    answer = Some(a.map(|l| l.id));
                }
                turn => unreachable!("no turn asked for: {turn:?}"),
            }
        }
        assert_eq!(answer.is_some(), waiter.is_some(), "a lease operation unanswered");
        answer
    }

    fn check(&self, state: &State<u32>, now: Instant) {
        for model in 0..2 {
            let held: Vec<String> =
                state.leases(model).iter().map(|h| h.lease.id.clone()).collect();
            // Invariant: the published leases are the loop's, never stale.
            assert_eq!(self.published.get(&model).cloned().unwrap_or_default(), held);
            // Invariant: never more live leases than the cap.
            let live = state.leases(model).iter().filter(|h| h.deadline > now).count();
            assert!(live <= LIMIT.get() as usize, "{live} live leases on {model}");
            // Invariant: nothing that ended is held.
            assert!(held.iter().all(|id| !self.ended.contains(id)), "an ended lease is held");
        }
    }
}

proptest! {
    #[test]
    fn random_lease_operations_keep_the_invariants(ops in prop::collection::vec(op(), 1..80)) {
        let t0 = Instant::now();
        let mut now = t0;
        let mut state = State::new(2, Rules::of(WAIT, LIMIT.get()));
        let mut world = World::default();
        for (waiter, op) in (1u32..).zip(ops) {
            let (command, asks) = match op {
                Op::Acquire(model, ttl) => (acquire(model, waiter, ttl), true),
                Op::Settle(n, loaded) => {
                    if world.reserved.is_empty() { continue }
                    let (model, id) = world.reserved.remove(n % world.reserved.len());
                    (settle(model, &id, loaded, waiter), true)
                }
                Op::Renew(..) | Op::Release(..) if world.taken.is_empty() => continue,
                Op::Renew(n, ttl) => {
                    let (id, model) = world.taken.iter().nth(n % world.taken.len()).unwrap();
                    (renew(*model, id, ttl, waiter), true)
                }
                Op::Release(n) => {
                    let (id, model) = world.taken.iter().nth(n % world.taken.len()).unwrap();
                    (release(*model, id, waiter), true)
                }
                Op::Decide(model) => { *world.unloads.entry(model).or_default() += 1; (decided(model), false) }
                Op::End(n, revoke) => {
                    let open: Vec<ModelId> = world.unloads.iter().filter(|(_, u)| **u > 0).map(|(m, _)| *m).collect();
                    let Some(&model) = open.get(n % open.len().max(1)) else { continue };
                    *world.unloads.get_mut(&model).unwrap() -= 1;
                    (ended(model, revoke), false)
                }
                Op::Advance(s) => { now += Duration::from_secs(s); (Command::Tick, false) }
            };
            let settling = matches!(&command, Command::Lease { command: LeaseCommand::Settle { .. }, .. });
            let acquiring = matches!(&command, Command::Lease { command: LeaseCommand::Acquire { .. }, .. });
            let model = match &command { Command::Lease { model, .. } => Some(*model), _ => None };
            let answer = world.take(step(&mut state, command, now), asks.then_some(waiter));
            let barred = model.is_some_and(|m| world.unloads.get(&m).copied().unwrap_or(0) > 0);
            if let (Some(Ok(id)), Some(model)) = (&answer, model) {
                // Invariant: no lease is taken or granted while an unload of its model is decided.
                prop_assert!(!(barred && (acquiring || settling)), "{id} answered during an unload");
                if acquiring {
                    world.taken.insert(id.clone(), model);
                    world.reserved.push((model, id.clone()));
                }
                if settling {
                    prop_assert!(!world.ended.contains(id), "{id} granted after it ended");
                }
            }
            world.check(&state, now);
        }
        // Every unload ends revoking, time passes: nothing is held, nothing wakes the loop.
        for model in 0..2 {
            for _ in 0..world.unloads.get(&model).copied().unwrap_or(0) {
                world.take(step(&mut state, ended(model, true), now), None);
            }
        }
        now += Duration::from_secs(3600);
        world.take(step(&mut state, Command::Tick, now), None);
        world.check(&state, now);
        prop_assert!(state.leases(0).is_empty() && state.leases(1).is_empty());
        prop_assert_eq!(state.next_deadline(), None);
    }
}
