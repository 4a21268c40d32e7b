//! GPU memory as the loop keeps it: the awaited release as a table against [`step`] (on one
//! GPU, then per GPU), and the measured figures. Waiters are plain numbers; no runtime, no
//! clock, no GPU.

use std::time::Duration;

use tokio::time::Instant;

use super::step::{ALL_GPUS, ReleaseAnswer, Rules, State, step};
use super::testing::{Command, Effect, row};

/// An unload on GPU 0.
fn released(used_before: u64, held: u64) -> Command {
    Command::Released { releases: vec![(0, used_before, held)] }
}

/// A load on any GPU, with GPU 0's used memory.
fn ask(used: Option<u64>) -> Command {
    Command::AwaitRelease { on: Vec::new(), used: used.map(|u| vec![(0, u)]), waiter: 1 }
}

/// A load `on` some GPUs, with `used` memory by GPU.
fn ask_on(on: &[u32], used: &[(u32, u64)]) -> Command {
    Command::AwaitRelease { on: on.to_vec(), used: Some(used.to_vec()), waiter: 1 }
}

fn answer(effects: Vec<Effect>) -> ReleaseAnswer {
    match effects.as_slice() {
        [Effect::Release { waiter: 1, answer }] => *answer,
        other => panic!("not one release answer: {other:?}"),
    }
}

#[test]
fn the_release_rule_as_a_table() {
    use ReleaseAnswer::{Go, Read, Wait};
    let t0 = Instant::now();
    let settled = Go { settled: true };
    // An unload of 10,000 MiB used, the model holding 4,000: the target is 6,400.
    let unload = || vec![released(10_000, 4_000)];
    // (name, commands before (at t0), the question, when (seconds after t0), the answer)
    let rows: Vec<(&str, Vec<Command>, Command, u64, ReleaseAnswer)> = vec![
        ("nothing pending: go", vec![], ask(None), 0, settled),
        ("pending: read the GPUs first", unload(), ask(None), 0, Read),
        ("still above the target: wait", unload(), ask(Some(6_401)), 0, Wait),
        ("down to it: go", unload(), ask(Some(6_400)), 0, settled),
        (
            "and nothing is pending then",
            vec![released(10_000, 4_000), ask(Some(6_000))],
            ask(None),
            0,
            settled,
        ),
        (
            "the wait runs out: go, not settled",
            unload(),
            ask(Some(9_000)),
            15,
            Go { settled: false },
        ),
        ("not before", unload(), ask(Some(9_000)), 14, Wait),
        (
            "a second unload counts from the lower of the target and its reading",
            vec![released(10_000, 4_000), released(9_500, 1_000)],
            ask(Some(5_501)),
            0,
            Wait,
        ),
        (
            "and goes at that",
            vec![released(10_000, 4_000), released(9_500, 1_000)],
            ask(Some(5_500)),
            0,
            settled,
        ),
        (
            "a reading below the pending target counts from the reading",
            vec![released(10_000, 4_000), released(5_000, 1_000)],
            ask(Some(4_101)),
            0,
            Wait,
        ),
    ];
    for (name, before, command, when, expected) in rows {
        let got =
            answer(row(1, Rules::of(Duration::from_secs(10), 1), before, command, (t0, when)));
        assert_eq!(got, expected, "{name}");
    }
}

#[test]
fn releases_are_awaited_on_the_gpus_a_load_may_use() {
    use ReleaseAnswer::{Go, Wait};
    let t0 = Instant::now();
    let settled = Go { settled: true };
    let on_gpu_1 = || vec![Command::Released { releases: vec![(1, 10_000, 4_000)] }];
    let unknown = || vec![Command::Released { releases: vec![(ALL_GPUS, 10_000, 4_000)] }];
    // (name, commands before (at t0), the question, the answer)
    let rows: Vec<(&str, Vec<Command>, Command, ReleaseAnswer)> = vec![
        (
            "a release on GPU 1 does not hold a load on GPU 0",
            on_gpu_1(),
            ask_on(&[0], &[(0, 5_000), (1, 10_000)]),
            settled,
        ),
        (
            "a load that may use GPU 1 waits for it",
            on_gpu_1(),
            ask_on(&[0, 1], &[(1, 9_000)]),
            Wait,
        ),
        ("so does one on any GPU", on_gpu_1(), ask_on(&[], &[(1, 9_000)]), Wait),
        ("and goes when it came down there", on_gpu_1(), ask_on(&[1], &[(1, 6_400)]), settled),
        (
            "a release of unknown GPUs holds every load, on the sum",
            unknown(),
            ask_on(&[0], &[(0, 1_000), (ALL_GPUS, 9_000)]),
            Wait,
        ),
        ("until the sum came down", unknown(), ask_on(&[0], &[(ALL_GPUS, 6_400)]), settled),
        (
            "a GPU missing from the reading is not released",
            on_gpu_1(),
            ask_on(&[1], &[(0, 0)]),
            Wait,
        ),
    ];
    for (name, before, command, expected) in rows {
        let got = answer(row(1, Rules::of(Duration::from_secs(10), 1), before, command, (t0, 0)));
        assert_eq!(got, expected, "{name}");
    }
}

#[test]
fn after_a_crash_every_gpu_load_waits_for_the_teardown() {
    use super::step::Change;
    use super::testing::mv;
    use ReleaseAnswer::{Go, Read, Wait};
    let t0 = Instant::now();
    let settled = Go { settled: true };
    let loaded = || vec![mv(0, Change::StartLoad, 7), mv(0, Change::LoadDone { failed: None }, 7)];
    let crashed = || {
        let crash = mv(0, Change::Crash { generation: 1, message: "wrong".into() }, 7);
        loaded().into_iter().chain([crash]).collect::<Vec<_>>()
    };
    let then = |more: Command| crashed().into_iter().chain([more]).collect::<Vec<_>>();
    let torn = |releases| Command::TornDown { model: 0, releases };
    // (name, commands before (at t0), the question, when (seconds after t0), the answer)
    let rows: Vec<(&str, Vec<Command>, Command, u64, ReleaseAnswer)> = vec![
        ("loaded, nothing pending: go", loaded(), ask(None), 0, settled),
        ("crashed, not torn down: wait", crashed(), ask(None), 0, Wait),
        ("whatever the GPU reads", crashed(), ask(Some(0)), 0, Wait),
        ("also on GPUs it never used", crashed(), ask_on(&[3], &[(3, 0)]), 0, Wait),
        (
            "a stale crash tears nothing down",
            {
                let stale = mv(0, Change::Crash { generation: 0, message: "old".into() }, 7);
                loaded().into_iter().chain([stale]).collect()
            },
            ask(None),
            0,
            settled,
        ),
        ("torn down with nothing to give back: go", then(torn(vec![])), ask(None), 0, settled),
        (
            "torn down giving 4,000 back: read",
            then(torn(vec![(0, 10_000, 4_000)])),
            ask(None),
            0,
            Read,
        ),
        ("and wait for it", then(torn(vec![(0, 10_000, 4_000)])), ask(Some(9_000)), 0, Wait),
        ("until it shows", then(torn(vec![(0, 10_000, 4_000)])), ask(Some(6_400)), 0, settled),
        (
            "a teardown that never ends: go at the deadline, not settled",
            crashed(),
            ask(None),
            15,
            Go { settled: false },
        ),
        ("not before", crashed(), ask(None), 14, Wait),
    ];
    for (name, before, command, when, expected) in rows {
        let got =
            answer(row(1, Rules::of(Duration::from_secs(10), 1), before, command, (t0, when)));
        assert_eq!(got, expected, "{name}");
    }
    // A teardown that ran out is settled once: the next load goes settled.
    let mut state = State::new(1, Rules::of(Duration::from_secs(10), 1));
    for c in crashed() {
        step(&mut state, c, t0);
    }
    let late = t0 + Duration::from_secs(15);
    assert_eq!(answer(step(&mut state, ask(None), late)), Go { settled: false });
    assert_eq!(answer(step(&mut state, ask(None), late)), settled);
}

#[test]
fn the_deadline_is_the_last_unloads() {
    let t0 = Instant::now();
    let mut state = State::new(1, Rules::of(Duration::from_secs(10), 1));
    step(&mut state, released(10_000, 4_000), t0);
    step(&mut state, released(10_000, 1_000), t0 + Duration::from_secs(10));
    let at = |s| t0 + Duration::from_secs(s);
    assert_eq!(answer(step(&mut state, ask(Some(9_000)), at(15))), ReleaseAnswer::Wait);
    let late = answer(step(&mut state, ask(Some(9_000)), at(25)));
    assert_eq!(late, ReleaseAnswer::Go { settled: false });
    assert_eq!(answer(step(&mut state, ask(None), at(25))), ReleaseAnswer::Go { settled: true });
}

#[test]
fn a_measured_figure_replaces_its_like_and_is_published() {
    use crate::vram::{Figure, VramMethod};
    let figure = |replicas, method, mib| Figure {
        replicas,
        load_override: serde_json::Map::new(),
        method,
        mib,
        gpus: Vec::new(),
        per_gpu: Vec::new(),
        measured_unix_ms: 0,
    };
    let t0 = Instant::now();
    let mut state = State::new(2, Rules::of(Duration::from_secs(10), 1));
    let measured = |figures| Command::Measured { model: 1, figures };
    let first =
        vec![figure(1, VramMethod::ProcessTree, 900), figure(2, VramMethod::ProcessTree, 1_800)];
    step(&mut state, measured(first), t0);
    let again = step(&mut state, measured(vec![figure(1, VramMethod::ProcessTree, 1_000)]), t0);
    let [Effect::Figures { model: 1, vram }] = again.as_slice() else { panic!("{again:?}") };
    let mibs: Vec<(u32, u64)> = vram.figures.iter().map(|f| (f.replicas, f.mib)).collect();
    assert_eq!(mibs, [(2, 1_800), (1, 1_000)], "the one of one replica replaced, the latest last");
    assert!(step(&mut state, Command::Measured { model: 9, figures: Vec::new() }, t0).is_empty());
}
