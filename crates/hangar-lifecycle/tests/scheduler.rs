//! The scheduler under random interleavings of acquire / release / cancel / close.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use hangar_lifecycle::{AdmissionError, Permit, Scheduler, effective_target};
use proptest::prelude::*;
use tokio::task::JoinHandle;

type Outcome = Result<Permit<u32>, AdmissionError>;

fn scheduler(replicas: u32, target: u32, max_queue: usize) -> Scheduler<u32> {
    Scheduler::new(
        (0..replicas).map(Arc::new).collect(),
        NonZeroU32::new(target).unwrap(),
        max_queue,
    )
}

/// Lets spawned tasks run until they block again (current-thread runtime, paused clock).
async fn settle() {
    tokio::time::sleep(Duration::from_millis(1)).await;
}

#[tokio::test(start_paused = true)]
async fn dispatches_to_the_least_loaded_replica() {
    let s = scheduler(3, 2, 8);
    let mut held = Vec::new();
    for _ in 0..6 {
        held.push(s.acquire().await.unwrap());
    }
    let replicas: Vec<_> = held.iter().map(Permit::replica).collect();
    assert_eq!(replicas, [0, 1, 2, 0, 1, 2], "round-robin by load, lowest index on ties");
    assert_eq!(s.stats().per_replica, [2, 2, 2]);
    drop(held.remove(4)); // frees a slot on replica 1
    assert_eq!(s.acquire().await.unwrap().replica(), 1);
}

#[tokio::test(start_paused = true)]
async fn full_replicas_queue_in_fifo_order_and_full_queue_refuses() {
    let s = scheduler(1, 1, 2);
    let first = s.acquire().await.unwrap();
    let a = tokio::spawn({
        let s = s.clone();
        async move { s.acquire().await.map(|p| (1, p)) }
    });
    settle().await;
    let b = tokio::spawn({
        let s = s.clone();
        async move { s.acquire().await.map(|p| (2, p)) }
    });
    settle().await;
    assert_eq!(s.stats().queue_depth, 2);
    let refused = s.acquire().await.unwrap_err();
    assert_eq!(refused, AdmissionError::QueueFull { depth: 2 });
    drop(first);
    let (order, permit) = a.await.unwrap().unwrap();
    assert_eq!(order, 1, "the oldest waiter goes first");
    drop(permit);
    assert_eq!(b.await.unwrap().unwrap().0, 2);
}

#[tokio::test(start_paused = true)]
async fn close_cancels_queued_requests_and_lets_running_ones_finish() {
    let s = scheduler(1, 1, 4);
    let running = s.acquire().await.unwrap();
    let queued = tokio::spawn({
        let s = s.clone();
        async move { s.acquire().await.map(drop) }
    });
    settle().await;
    s.close(AdmissionError::ModelUnloading);
    assert_eq!(queued.await.unwrap(), Err(AdmissionError::ModelUnloading));
    assert_eq!(s.acquire().await.unwrap_err(), AdmissionError::ModelUnloading);
    // The running request still holds its replica until it finishes.
    assert_eq!(s.stats().runtime_inflight, 1);
    let drained = tokio::spawn({
        let s = s.clone();
        async move { s.drained().await }
    });
    settle().await;
    assert!(!drained.is_finished(), "drain waits for the running request");
    drop(running);
    drained.await.unwrap();
    assert_eq!(s.stats().runtime_inflight, 0);
}

#[tokio::test(start_paused = true)]
async fn a_waiter_that_gives_up_leaves_the_queue() {
    let s = scheduler(1, 1, 1);
    let held = s.acquire().await.unwrap();
    let gives_up = tokio::spawn({
        let s = s.clone();
        async move { s.acquire().await.map(drop) }
    });
    settle().await;
    gives_up.abort();
    settle().await;
    assert_eq!(s.stats().queue_depth, 0, "an abandoned waiter does not count");
    let next = tokio::spawn({
        let s = s.clone();
        async move { s.acquire().await.map(|p| p.replica()) }
    });
    settle().await;
    drop(held);
    assert_eq!(next.await.unwrap(), Ok(0));
    assert_eq!(s.stats().runtime_inflight, 0);
}

#[tokio::test(start_paused = true)]
async fn dispatch_ahead_fills_every_replica_to_its_target_before_going_beyond_it() {
    let s = scheduler(2, 1, 4).dispatch_ahead(1);
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(s.acquire().await.unwrap());
    }
    let replicas: Vec<_> = held.iter().map(Permit::replica).collect();
    assert_eq!(replicas, [0, 1, 0, 1], "both replicas reach the target before either goes ahead");
    let stats = s.stats();
    assert_eq!((stats.per_replica.clone(), stats.dispatch_ahead), (vec![2, 2], 1));
    assert_eq!(stats.effective_target, 1, "the target stays what the engine runs at once");
    let queued = tokio::spawn({
        let s = s.clone();
        async move { s.acquire().await.map(|p| p.replica()) }
    });
    settle().await;
    assert_eq!(s.stats().queue_depth, 1, "target + ahead is the most a replica is handed");
    s.pause();
    drop(held.remove(0)); // frees a place on replica 0, but a pause hands out nothing
    settle().await;
    assert_eq!(s.stats().queue_depth, 1);
    s.resume();
    assert_eq!(queued.await.unwrap(), Ok(0));
    held.clear();
    tokio::time::timeout(Duration::from_secs(1), s.drained()).await.expect("drain hung");
}

#[test]
fn effective_target_is_clamped_by_backend_capability() {
    let n = |v| NonZeroU32::new(v).unwrap();
    assert_eq!(effective_target(n(4), None), n(4));
    assert_eq!(effective_target(n(4), Some(n(1))), n(1));
    assert_eq!(effective_target(n(2), Some(n(8))), n(2));
}

#[derive(Debug, Clone)]
enum Op {
    Acquire,
    AcquireFront,
    Release(usize),
    Cancel(usize),
    Close,
    Pause,
    Resume,
    CancelQueued,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => Just(Op::Acquire),
        3 => any::<usize>().prop_map(Op::Release),
        1 => any::<usize>().prop_map(Op::Cancel),
        1 => Just(Op::Close),
        1 => Just(Op::AcquireFront),
        1 => Just(Op::Pause),
        1 => Just(Op::Resume),
        1 => Just(Op::CancelQueued),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// Invariants, checked after every step:
    /// - no replica runs more than `target` + `ahead` requests (`dispatch_ahead`);
    /// - `runtime_inflight` equals the permits callers hold;
    /// - the queue never exceeds its bound (plus the requests put back at its head), and
    ///   nobody waits while a replica has room (unless closed or paused);
    /// - a paused scheduler grants nothing: no acquire succeeds in a step that ends paused;
    /// - every acquire ends: with a permit, `queue_full`, the close reason or the reason of
    ///   `cancel_queued` — none hangs once the scheduler is resumed and the holders release
    ///   (checked at the end by releasing everything).
    #[test]
    fn scheduler_invariants_hold_under_random_interleavings(
        replicas in 1u32..4,
        target in 1u32..4,
        ahead in 0u32..3,
        max_queue in 0usize..4,
        ops in prop::collection::vec(op(), 1..60),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap();
        rt.block_on(async move {
            let s = scheduler(replicas, target, max_queue).dispatch_ahead(ahead);
            let room = target + ahead;
            let mut held: Vec<Permit<u32>> = Vec::new();
            // Pending acquires, each marked whether it asked for the head of the queue.
            let mut pending: Vec<(bool, JoinHandle<Outcome>)> = Vec::new();
            let aborted = AdmissionError::GenerationAborted { reason: "test".into() };
            for op in ops {
                match op {
                    Op::Acquire | Op::AcquireFront => {
                        let front = matches!(op, Op::AcquireFront);
                        pending.push((front, tokio::spawn({
                            let s = s.clone();
                            async move { if front { s.acquire_front().await } else { s.acquire().await } }
                        })));
                    }
                    Op::Release(i) if !held.is_empty() => drop(held.remove(i % held.len())),
                    Op::Cancel(i) if !pending.is_empty() => pending[i % pending.len()].1.abort(),
                    Op::Close => s.close(AdmissionError::ModelUnloading),
                    Op::Pause => s.pause(),
                    Op::Resume => s.resume(),
                    Op::CancelQueued => s.cancel_queued(&aborted),
                    _ => {}
                }
                settle().await;
                let paused = s.stats().paused;
                // Collect finished acquires.
                let mut still = Vec::new();
                for (front, h) in pending.drain(..) {
                    if h.is_finished() {
                        match h.await {
                            Ok(Ok(permit)) => {
                                assert!(!paused, "a paused scheduler granted a slot");
                                held.push(permit);
                            }
                            Ok(Err(e)) => assert!(matches!(e, AdmissionError::QueueFull { .. } | AdmissionError::ModelUnloading | AdmissionError::GenerationAborted { .. }), "{e:?}"),
                            Err(join) => assert!(join.is_cancelled()),
                        }
                    } else {
                        still.push((front, h));
                    }
                }
                pending = still;
                let fronts = pending.iter().filter(|(front, _)| *front).count();
                let stats = s.stats();
                assert!(stats.per_replica.iter().all(|&n| n <= room), "{stats:?}");
                assert_eq!(stats.runtime_inflight as usize, held.len());
                assert!(stats.queue_depth <= max_queue + fronts, "{stats:?}");
                let has_room = stats.per_replica.iter().any(|&n| n < room);
                let blocked = stats.closed || stats.paused;
                assert!(blocked || !has_room || stats.queue_depth == 0, "waiting with room: {stats:?}");
            }
            // Resume and release everything: every pending acquire must now end.
            s.resume();
            held.clear();
            // Each permit obtained now is dropped as soon as it is granted, so the rest can
            // proceed — in whatever order the scheduler grants them (a request put at the
            // head of the queue goes before one that asked earlier).
            let ends: Vec<_> = pending
                .into_iter()
                .map(|(_, h)| tokio::spawn(async move { drop(h.await) }))
                .collect();
            for end in ends {
                let done = tokio::time::timeout(Duration::from_secs(1), end).await;
                assert!(done.is_ok(), "an acquire hung");
            }
            let stats = s.stats();
            assert_eq!(stats.runtime_inflight, 0);
            tokio::time::timeout(Duration::from_secs(1), s.drained()).await.expect("drain hung");
        });
    }
}

#[tokio::test(start_paused = true)]
async fn a_paused_scheduler_grants_nothing_until_resumed_and_retracted_requests_go_first() {
    let s = scheduler(1, 1, 4);
    let running = s.acquire().await.unwrap();
    s.pause();
    assert!(s.stats().paused);
    let spawn = |front: bool, tag: u32| {
        let s = s.clone();
        tokio::spawn(async move {
            let permit = if front { s.acquire_front().await } else { s.acquire().await };
            permit.map(|p| (tag, p))
        })
    };
    let queued = spawn(false, 1);
    settle().await;
    drop(running); // a freed slot is not handed out while paused
    settle().await;
    let retracted = spawn(true, 2);
    settle().await;
    assert_eq!(s.stats().queue_depth, 2);
    assert_eq!(s.stats().runtime_inflight, 0, "nothing runs while paused");
    assert!(!queued.is_finished() && !retracted.is_finished());
    s.resume();
    let (tag, permit) = retracted.await.unwrap().unwrap();
    assert_eq!(tag, 2, "the retracted request goes back to the head of the queue");
    assert!(!queued.is_finished());
    drop(permit);
    assert_eq!(queued.await.unwrap().unwrap().0, 1);
}

#[tokio::test(start_paused = true)]
async fn cancel_queued_ends_waiters_but_keeps_admitting() {
    let s = scheduler(1, 1, 4);
    let running = s.acquire().await.unwrap();
    let waiter = tokio::spawn({
        let s = s.clone();
        async move { s.acquire().await }
    });
    settle().await;
    let reason = AdmissionError::GenerationAborted { reason: "paused with mode abort".into() };
    s.cancel_queued(&reason);
    assert_eq!(waiter.await.unwrap().unwrap_err(), reason);
    drop(running);
    assert!(s.acquire().await.is_ok(), "not closed: later requests still run");
    assert!(!s.stats().closed);
}

#[tokio::test(start_paused = true)]
async fn runtimes_are_replaced_only_while_nothing_runs_and_the_queue_is_kept() {
    let s = scheduler(2, 1, 4);
    let running = s.acquire().await.unwrap();
    s.pause();
    let queued = tokio::spawn({
        let s = s.clone();
        async move { s.acquire().await.map(|p| **p.runtime()) }
    });
    settle().await;
    let refused = s.replace_runtimes(vec![Arc::new(10), Arc::new(11)]).unwrap_err();
    assert_eq!(refused.len(), 2, "a running request keeps its runtime");
    drop(running);
    assert!(s.replace_runtimes(vec![Arc::new(10)]).is_err(), "the replica count must match");
    let old = s.replace_runtimes(vec![Arc::new(10), Arc::new(11)]).unwrap();
    assert_eq!(old.iter().map(|r| **r).collect::<Vec<_>>(), [0, 1]);
    assert_eq!(s.stats().queue_depth, 1, "the queue survives the swap");
    s.resume();
    assert_eq!(queued.await.unwrap().unwrap(), 10, "the queued request runs on the new runtime");
}
