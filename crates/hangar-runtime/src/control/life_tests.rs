//! The lifecycle as a table against [`step`] — the moves the table allows, evictions only
//! of models nothing holds, crash reports only about the runtimes in service — and random
//! moves checking its invariants. Waiters are plain numbers; no runtime, no clock, no slot.

use std::collections::BTreeSet;
use std::time::Duration;

use hangar_lifecycle::{ModelState, next_state};
use proptest::prelude::*;
use tokio::time::Instant;

use super::step::{Change, LoadFailed, Rules, State, Stay, step};
use super::testing::{Command, Effect, acquire, mv, row};
use hangar_backend::SleepLevel;

use crate::pause::{PauseCause, PauseMode};

fn start(waiter: u32) -> Command {
    mv(0, Change::StartLoad, waiter)
}

fn done(waiter: u32) -> Command {
    mv(0, Change::LoadDone { failed: None }, waiter)
}

fn unload(evict: bool, pinned: bool, waiter: u32) -> Command {
    mv(0, Change::StartUnload { evict, pinned }, waiter)
}

fn crash(generation: u64, waiter: u32) -> Command {
    mv(0, Change::Crash { generation, message: "boom".into() }, waiter)
}

/// The commands of each list in turn.
fn chain(lists: Vec<Vec<Command>>) -> Vec<Command> {
    lists.into_iter().flatten().collect()
}

fn pause(waiter: u32) -> Command {
    mv(0, Change::Pause { mode: PauseMode::Retract, cause: PauseCause::Operator }, waiter)
}

fn resume(waiter: u32) -> Command {
    mv(0, Change::Resume, waiter)
}

fn sleep(waiter: u32) -> Command {
    mv(0, Change::Sleep { level: SleepLevel::Context }, waiter)
}

fn wake(waiter: u32) -> Command {
    mv(0, Change::Wake, waiter)
}

/// The moves as lines (`W: from -> to (gen G)` or `W: stays …`); other effects left out.
fn moves(effects: Vec<Effect>) -> Vec<String> {
    effects
        .into_iter()
        .filter_map(|e| match e {
            Effect::Moved { waiter, moved, .. } => {
                Some(format!("{waiter}: {} -> {} (gen {})", moved.from, moved.to, moved.generation))
            }
            Effect::Stays { waiter, why, .. } => Some(format!("{waiter}: stays {why:?}")),
            _ => None,
        })
        .collect()
}

#[test]
fn the_lifecycle_as_a_table() {
    let t0 = Instant::now();
    let up = || vec![start(0), done(0)];
    let with = |mut before: Vec<Command>, more: Command| {
        before.push(more);
        before
    };
    // (name, commands before, the move, its line)
    let rows: Vec<(&str, Vec<Command>, Command, &str)> = vec![
        ("a load starts from unloaded", vec![], start(1), "1: unloaded -> loading (gen 0)"),
        ("not while loading", vec![start(0)], start(1), "1: stays NotFrom(Loading)"),
        (
            "a load that ends: a new generation",
            vec![start(0)],
            done(1),
            "1: loading -> loaded (gen 1)",
        ),
        ("a reload: another", up(), mv(0, Change::Reload, 1), "1: loaded -> loaded (gen 2)"),
        (
            "not of a model not loaded",
            vec![],
            mv(0, Change::Reload, 1),
            "1: stays NotFrom(Unloaded)",
        ),
        (
            "a weight swap: another, loaded still",
            up(),
            mv(0, Change::Swap, 1),
            "1: loaded -> loaded (gen 2)",
        ),
        (
            "no swap into a model being unloaded",
            with(up(), unload(false, false, 0)),
            mv(0, Change::Swap, 1),
            "1: stays NotFrom(Unloading)",
        ),
        (
            "an eviction of a free model goes",
            up(),
            unload(true, false, 1),
            "1: loaded -> unloading (gen 1)",
        ),
        (
            "not of a leased one",
            with(up(), acquire(0, 0, 600)),
            unload(true, false, 1),
            "1: stays Held",
        ),
        (
            "nor of one being replaced",
            with(up(), Command::Replacing { model: 0 }),
            unload(true, false, 1),
            "1: stays Held",
        ),
        ("nor of one its definition pins", up(), unload(true, true, 1), "1: stays Held"),
        (
            "another model's lease does not hold it",
            with(up(), acquire(1, 0, 600)),
            unload(true, false, 1),
            "1: loaded -> unloading (gen 1)",
        ),
        (
            "an operator's unload goes whatever holds it",
            with(up(), acquire(0, 0, 600)),
            unload(false, true, 1),
            "1: loaded -> unloading (gen 1)",
        ),
        (
            "nothing to evict while unloaded",
            vec![],
            unload(true, false, 1),
            "1: stays NotFrom(Unloaded)",
        ),
        (
            "the unload ends",
            with(up(), unload(false, false, 0)),
            mv(0, Change::UnloadDone, 1),
            "1: unloading -> unloaded (gen 1)",
        ),
        ("a crash of the runtimes in service", up(), crash(1, 1), "1: loaded -> failed (gen 1)"),
        (
            "a crash of older runtimes is stale",
            with(up(), mv(0, Change::Reload, 0)),
            crash(1, 1),
            "1: stays Stale",
        ),
        (
            "a crash while unloading is not from there",
            with(up(), unload(false, false, 0)),
            crash(1, 1),
            "1: stays NotFrom(Unloading)",
        ),
        (
            "a failed model loads again",
            with(up(), crash(1, 0)),
            start(1),
            "1: failed -> loading (gen 1)",
        ),
        ("a loaded model pauses", up(), pause(1), "1: loaded -> loaded (gen 1)"),
        ("only a loaded one", vec![start(0)], pause(1), "1: stays NotFrom(Loading)"),
        (
            "a paused one pauses again (another mode)",
            with(up(), pause(0)),
            pause(1),
            "1: loaded -> loaded (gen 1)",
        ),
        ("a resume ends a pause", with(up(), pause(0)), resume(1), "1: loaded -> loaded (gen 1)"),
        ("without one it changes nothing", up(), resume(1), "1: stays NotPaused"),
        (
            "a reload keeps the pause",
            chain(vec![up(), vec![pause(0), mv(0, Change::Reload, 0)]]),
            resume(1),
            "1: loaded -> loaded (gen 2)",
        ),
        (
            "so does a weight swap",
            chain(vec![up(), vec![pause(0), mv(0, Change::Swap, 0)]]),
            resume(1),
            "1: loaded -> loaded (gen 2)",
        ),
        (
            "a resume while unloading still ends it",
            chain(vec![up(), vec![pause(0), unload(false, false, 0)]]),
            resume(1),
            "1: unloading -> unloading (gen 1)",
        ),
        (
            "an unload ends it",
            chain(vec![
                up(),
                vec![pause(0), unload(false, false, 0), mv(0, Change::UnloadDone, 0)],
                up(),
            ]),
            resume(1),
            "1: stays NotPaused",
        ),
        (
            "a crash ends it",
            chain(vec![up(), vec![pause(0), crash(1, 0)], up()]),
            resume(1),
            "1: stays NotPaused",
        ),
        ("a loaded model sleeps, loaded still", up(), sleep(1), "1: loaded -> loaded (gen 1)"),
        ("only a loaded one", vec![start(0)], sleep(1), "1: stays NotFrom(Loading)"),
        ("a sleeping one wakes", with(up(), sleep(0)), wake(1), "1: loaded -> loaded (gen 1)"),
        ("an awake one does not", up(), wake(1), "1: stays NotAsleep"),
        (
            "a paused model sleeps and wakes paused",
            chain(vec![up(), vec![pause(0), sleep(0), wake(0)]]),
            resume(1),
            "1: loaded -> loaded (gen 1)",
        ),
        (
            "a reload's runtimes are awake",
            chain(vec![up(), vec![sleep(0), mv(0, Change::Reload, 0)]]),
            wake(1),
            "1: stays NotAsleep",
        ),
        (
            "so are a swap's",
            chain(vec![up(), vec![sleep(0), mv(0, Change::Swap, 0)]]),
            wake(1),
            "1: stays NotAsleep",
        ),
        (
            "an unload ends the sleep with the runtimes",
            chain(vec![
                up(),
                vec![sleep(0), unload(false, false, 0), mv(0, Change::UnloadDone, 0)],
                up(),
            ]),
            wake(1),
            "1: stays NotAsleep",
        ),
        (
            "a crash too",
            chain(vec![up(), vec![sleep(0), crash(1, 0)], up()]),
            wake(1),
            "1: stays NotAsleep",
        ),
    ];
    for (name, before, command, expected) in rows {
        let got = moves(row(2, Rules::of(Duration::from_secs(10), 4), before, command, (t0, 0)));
        assert_eq!(got, [expected], "{name}");
    }
}

#[derive(Debug, Clone)]
enum Op {
    Start,
    Done(bool),
    Reload,
    Swap,
    Unload(bool, bool),
    UnloadDone,
    /// A crash report naming the generation this many behind the current one.
    Crash(u64),
    Lease,
    Replacing,
    Pause,
    Resume,
    Sleep,
    Wake,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        Just(Op::Start),
        any::<bool>().prop_map(Op::Done),
        Just(Op::Reload),
        Just(Op::Swap),
        (any::<bool>(), prop::bool::weighted(0.2)).prop_map(|(e, p)| Op::Unload(e, p)),
        Just(Op::UnloadDone),
        (0..2u64).prop_map(Op::Crash),
        Just(Op::Lease),
        Just(Op::Replacing),
        Just(Op::Pause),
        Just(Op::Resume),
        Just(Op::Sleep),
        Just(Op::Wake),
    ]
}

proptest! {
    /// Whatever moves are asked, in any order: every move is answered at once, exactly
    /// once; the state follows the transition table; an eviction never takes a held model;
    /// the generation grows by one with each new set of runtimes and a crash report moves
    /// the model only when it names the runtimes in service.
    #[test]
    fn random_moves_keep_the_invariants(ops in prop::collection::vec(op(), 1..60)) {
        let now = Instant::now();
        let mut state = State::new(1, Rules::of(Duration::from_secs(10), 8));
        let (mut world, mut generation, mut held) = (ModelState::Unloaded, 0u64, false);
        let (mut paused, mut asleep) = (false, false);
        let mut answered = BTreeSet::new();
        for (waiter, op) in (1u32..).zip(ops) {
            let change = match op {
                Op::Start => Change::StartLoad,
                Op::Done(ok) => Change::LoadDone { failed: (!ok).then(|| LoadFailed::counted("no")) },
                Op::Reload => Change::Reload,
                Op::Swap => Change::Swap,
                Op::Unload(evict, pinned) => Change::StartUnload { evict, pinned },
                Op::UnloadDone => Change::UnloadDone,
                Op::Crash(behind) => Change::Crash { generation: generation.saturating_sub(behind), message: "boom".into() },
                Op::Lease => { step(&mut state, acquire(0, 0, 600), now); held = true; continue }
                Op::Replacing => { step(&mut state, Command::Replacing { model: 0 }, now); held = true; continue }
                Op::Pause => Change::Pause { mode: PauseMode::Abort, cause: PauseCause::Operator },
                Op::Resume => Change::Resume,
                Op::Sleep => Change::Sleep { level: SleepLevel::Context },
                Op::Wake => Change::Wake,
            };
            let asked = change.clone();
            let effects = step(&mut state, mv(0, change, waiter), now);
            let answers: Vec<&Effect> = effects.iter().filter(|e| matches!(e, Effect::Moved { .. } | Effect::Stays { .. })).collect();
            // Invariant: every move is answered at once, exactly once.
            prop_assert_eq!(answers.len(), 1);
            prop_assert!(answered.insert(waiter));
            match answers[0] {
                Effect::Moved { moved, .. } => {
                    // Invariant: the state follows the transition table.
                    prop_assert_eq!(moved.from, world);
                    let to = moved.event.map_or(Ok(world), |e| next_state(world, e));
                    prop_assert_eq!(Ok(moved.to), to);
                    if let Change::StartUnload { evict: true, pinned } = asked {
                        // Invariant: an eviction never takes a held model.
                        prop_assert!(!held && !pinned, "a held model evicted");
                    }
                    if let Change::Crash { generation: named, .. } = asked {
                        // Invariant: a crash moves the model only about the runtimes in service.
                        prop_assert_eq!(named, generation);
                    }
                    // Invariant: a new generation with each new set of runtimes, none otherwise.
                    let new = matches!(asked, Change::LoadDone { failed: None } | Change::Reload | Change::Swap);
                    prop_assert_eq!(moved.generation, generation + u64::from(new));
                    // Invariant: a pause only of a loaded model; it lasts until a resume, an
                    // unload, a crash or a fresh load ends it.
                    match asked {
                        Change::Pause { .. } => { prop_assert_eq!(world, ModelState::Loaded); paused = true; }
                        Change::Resume => { prop_assert!(paused); paused = false; }
                        Change::LoadDone { .. } | Change::UnloadDone | Change::Crash { .. } => paused = false,
                        _ => {}
                    }
                    // Invariant: a sleep only of a loaded model, a wake only of a sleeping
                    // one; any new runtimes (a load, a reload, a swap) and runtimes that go
                    // (an unload, a crash) are awake; a pause is kept apart from it.
                    match asked {
                        Change::Sleep { .. } => { prop_assert_eq!(world, ModelState::Loaded); asleep = true; }
                        Change::Wake => { prop_assert!(asleep); asleep = false; }
                        Change::Pause { .. } | Change::Resume | Change::StartUnload { .. } => {}
                        _ => asleep = false,
                    }
                    (world, generation) = (moved.to, moved.generation);
                }
                Effect::Stays { why, .. } => {
                    // A refusal is for a reason that holds.
                    match why {
                        Stay::Held => {
                            let pinned = matches!(asked, Change::StartUnload { pinned: true, .. });
                            prop_assert!(world == ModelState::Loaded && (held || pinned), "held?");
                        }
                        Stay::Stale => {
                            let stale = matches!(asked, Change::Crash { generation: g, .. } if g != generation);
                            prop_assert!(stale, "a crash of the runtimes in service ignored");
                        }
                        Stay::NotFrom(from) => prop_assert_eq!(*from, world),
                        Stay::NotPaused => prop_assert!(!paused, "a pause not ended"),
                        Stay::NotAsleep => prop_assert!(!asleep, "a sleep not ended"),
                    }
                }
                _ => unreachable!(),
            }
            prop_assert_eq!(state.lifecycle(0), world);
            prop_assert_eq!(state.asleep(0).is_some(), asleep);
        }
    }
}
