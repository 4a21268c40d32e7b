//! The per-model scheduler: one bounded queue per public model in front of its replicas.
//!
//! Each replica runs at most `target` requests at once (the configured `target_inflight`
//! clamped by what the backend can run in parallel), plus `ahead` more for an engine with a
//! queue of its own ([`Scheduler::dispatch_ahead`]: the engine then starts its next request
//! the moment one ends, instead of idling for a round trip through Hangar). A request takes
//! a [`Permit`] for the least-loaded replica with room, so a replica goes beyond `target`
//! only when every replica is at it; when none has room the request waits in a FIFO queue,
//! and when the queue is full it is refused with `queue_full` instead of growing without
//! bound. Closing the scheduler (unload, crash) refuses new requests, cancels the queued
//! ones with the close reason, and lets running ones finish; [`Scheduler::drained`]
//! resolves when the last permit is dropped. Pausing it grants nothing (new and freed slots alike: requests
//! wait in the queue) until it is resumed; [`Scheduler::acquire_front`] puts a request back
//! at the head of the queue (a retracted generation).

use std::collections::VecDeque;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{Notify, oneshot};

use crate::admission::AdmissionError;

type Waiter<R> = oneshot::Sender<Result<Permit<R>, AdmissionError>>;

/// Schedules requests of one model onto its replicas. Cheap to clone.
pub struct Scheduler<R: ?Sized> {
    shared: Arc<Shared<R>>,
}

impl<R: ?Sized> Clone for Scheduler<R> {
    fn clone(&self) -> Self {
        Self { shared: Arc::clone(&self.shared) }
    }
}

struct Shared<R: ?Sized> {
    inner: Mutex<Inner<R>>,
    idle: Notify,
}

struct Inner<R: ?Sized> {
    replicas: Vec<Replica<R>>,
    target: u32,
    ahead: u32,
    max_queue: usize,
    queue: VecDeque<Waiter<R>>,
    closed: Option<AdmissionError>,
    paused: bool,
    inflight: u32,
}

struct Replica<R: ?Sized> {
    runtime: Arc<R>,
    inflight: u32,
}

/// A counted right to run one request on one replica. Dropping it frees the slot and hands
/// it to the next queued request.
pub struct Permit<R: ?Sized> {
    shared: Option<Arc<Shared<R>>>,
    replica: usize,
    runtime: Arc<R>,
}

/// A point-in-time view of a scheduler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchedulerStats {
    /// Requests running on replicas (including those handed ahead to an engine's queue).
    pub runtime_inflight: u32,
    /// Requests waiting in the queue.
    pub queue_depth: usize,
    /// Requests running on each replica.
    pub per_replica: Vec<u32>,
    /// Per-replica in-flight target in effect.
    pub effective_target: u32,
    /// Requests one replica is handed beyond `effective_target` (see
    /// [`Scheduler::dispatch_ahead`]).
    pub dispatch_ahead: u32,
    /// Whether new requests are refused.
    pub closed: bool,
    /// Whether it is paused (grants nothing; requests wait).
    pub paused: bool,
}

/// The per-replica in-flight target in effect: the configured target clamped by what one
/// replica can run in parallel.
pub fn effective_target(configured: NonZeroU32, max_parallel: Option<NonZeroU32>) -> NonZeroU32 {
    max_parallel.map_or(configured, |cap| configured.min(cap))
}

impl<R: ?Sized + Send + Sync + 'static> Scheduler<R> {
    /// A scheduler over `replicas`, each running at most `target` requests, with at most
    /// `max_queue` requests waiting.
    pub fn new(replicas: Vec<Arc<R>>, target: NonZeroU32, max_queue: usize) -> Self {
        let replicas =
            replicas.into_iter().map(|runtime| Replica { runtime, inflight: 0 }).collect();
        Self {
            shared: Arc::new(Shared {
                inner: Mutex::new(Inner {
                    replicas,
                    target: target.get(),
                    ahead: 0,
                    max_queue,
                    queue: VecDeque::new(),
                    closed: None,
                    paused: false,
                    inflight: 0,
                }),
                idle: Notify::new(),
            }),
        }
    }

    /// Lets each replica be handed up to `ahead` requests beyond its target, for an engine
    /// that queues requests itself: it starts the next one as soon as one ends. Those
    /// requests hold permits like any other (they count as in flight, an unload drains
    /// them, a pause does not take them back). Least-loaded dispatch fills every replica to
    /// its target before any goes beyond it.
    #[must_use]
    pub fn dispatch_ahead(self, ahead: u32) -> Self {
        self.shared.lock().ahead = ahead;
        self
    }

    /// Takes a permit on the least-loaded replica with room, waiting in the queue if none
    /// has room (or the scheduler is paused). Dropping the returned future while queued gives
    /// up the place in the queue.
    ///
    /// # Errors
    /// The close reason once the scheduler is closed (also for requests already queued),
    /// [`AdmissionError::QueueFull`], or the reason of [`Scheduler::cancel_queued`].
    pub async fn acquire(&self) -> Result<Permit<R>, AdmissionError> {
        self.enqueue(false).await
    }

    /// As [`Scheduler::acquire`], but waits at the head of the queue and never counts
    /// against its bound: for a request that already ran and was retracted by a pause.
    ///
    /// # Errors
    /// As [`Scheduler::acquire`], except `queue_full`.
    pub async fn acquire_front(&self) -> Result<Permit<R>, AdmissionError> {
        self.enqueue(true).await
    }

    async fn enqueue(&self, front: bool) -> Result<Permit<R>, AdmissionError> {
        let rx = {
            let mut inner = self.shared.lock();
            if let Some(reason) = &inner.closed {
                return Err(reason.clone());
            }
            inner.queue.retain(|w| !w.is_closed());
            if !inner.paused
                && inner.queue.is_empty()
                && let Some(replica) = inner.pick()
            {
                return Ok(self.shared.grant(&mut inner, replica));
            }
            let (tx, rx) = oneshot::channel();
            if front {
                inner.queue.push_front(tx);
            } else {
                if inner.queue.len() >= inner.max_queue {
                    return Err(AdmissionError::QueueFull { depth: inner.max_queue });
                }
                inner.queue.push_back(tx);
            }
            rx
        };
        rx.await.unwrap_or(Err(AdmissionError::ModelUnloading))
    }

    /// Whether `other` is this scheduler (a clone of it), not another one of the model.
    pub fn same(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    /// Stops granting slots: new requests and freed slots wait in the queue; running
    /// requests are not touched. Idempotent.
    pub fn pause(&self) {
        self.shared.lock().paused = true;
    }

    /// Grants slots again, oldest queued request first. Idempotent.
    pub fn resume(&self) {
        let mut inner = self.shared.lock();
        inner.paused = false;
        self.shared.hand_out(&mut inner);
    }

    /// Ends every queued request with `reason` without closing the scheduler: later
    /// requests are admitted (or queue, when paused) as usual.
    pub fn cancel_queued(&self, reason: &AdmissionError) {
        let waiters: Vec<_> = self.shared.lock().queue.drain(..).collect();
        for waiter in waiters {
            // A waiter that went away needs no answer.
            let _ = waiter.send(Err(reason.clone()));
        }
    }

    /// Refuses new requests with `reason` and cancels every queued one with it; running
    /// requests continue. Idempotent: the first reason wins.
    pub fn close(&self, reason: AdmissionError) {
        let waiters: Vec<_> = {
            let mut inner = self.shared.lock();
            if inner.closed.is_none() {
                inner.closed = Some(reason.clone());
            }
            inner.queue.drain(..).collect()
        };
        for waiter in waiters {
            // A waiter that went away needs no answer.
            let _ = waiter.send(Err(reason.clone()));
        }
    }

    /// Resolves when no request is running (immediately if none is).
    pub async fn drained(&self) {
        loop {
            let notified = self.shared.idle.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.shared.lock().inflight == 0 {
                return;
            }
            notified.await;
        }
    }

    /// Puts `runtimes` in place of the replicas' runtimes (same count, same order) and
    /// returns the old ones; the queue and its order are kept. Only while nothing runs
    /// (pause it and wait for [`Scheduler::drained`] first).
    ///
    /// # Errors
    /// `runtimes` back when a request is running or the count differs.
    pub fn replace_runtimes(&self, runtimes: Vec<Arc<R>>) -> Result<Vec<Arc<R>>, Vec<Arc<R>>> {
        let mut inner = self.shared.lock();
        if inner.inflight > 0 || runtimes.len() != inner.replicas.len() {
            return Err(runtimes);
        }
        let old = inner
            .replicas
            .iter_mut()
            .zip(runtimes)
            .map(|(replica, runtime)| std::mem::replace(&mut replica.runtime, runtime))
            .collect();
        Ok(old)
    }

    /// The replicas' runtimes, in replica order.
    pub fn runtimes(&self) -> Vec<Arc<R>> {
        self.shared.lock().replicas.iter().map(|r| Arc::clone(&r.runtime)).collect()
    }

    /// A point-in-time view.
    pub fn stats(&self) -> SchedulerStats {
        let mut inner = self.shared.lock();
        inner.queue.retain(|w| !w.is_closed());
        SchedulerStats {
            runtime_inflight: inner.inflight,
            queue_depth: inner.queue.len(),
            per_replica: inner.replicas.iter().map(|r| r.inflight).collect(),
            effective_target: inner.target,
            dispatch_ahead: inner.ahead,
            closed: inner.closed.is_some(),
            paused: inner.paused,
        }
    }
}

impl<R: ?Sized> Inner<R> {
    /// The least-loaded replica with room (lowest index on ties); room is `target`, plus
    /// `ahead` requests waiting in the engine's queue.
    fn pick(&self) -> Option<usize> {
        let room = self.target.saturating_add(self.ahead);
        self.replicas
            .iter()
            .enumerate()
            .filter(|(_, r)| r.inflight < room)
            .min_by_key(|(i, r)| (r.inflight, *i))
            .map(|(i, _)| i)
    }
}

impl<R: ?Sized> Shared<R> {
    fn lock(&self) -> MutexGuard<'_, Inner<R>> {
        // A panic while holding this lock cannot leave the counters half-updated (every
        // critical section is a few integer updates), so a poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn grant(self: &Arc<Self>, inner: &mut Inner<R>, replica: usize) -> Permit<R> {
        let slot = &mut inner.replicas[replica];
        slot.inflight += 1;
        inner.inflight += 1;
        Permit { shared: Some(Arc::clone(self)), replica, runtime: Arc::clone(&slot.runtime) }
    }

    fn ungrant(inner: &mut Inner<R>, replica: usize) {
        inner.replicas[replica].inflight -= 1;
        inner.inflight -= 1;
    }

    /// Frees a slot and hands free slots to queued requests, oldest first.
    fn release(self: &Arc<Self>, replica: usize) {
        let mut inner = self.lock();
        Self::ungrant(&mut inner, replica);
        self.hand_out(&mut inner);
        let idle = inner.inflight == 0;
        drop(inner);
        if idle {
            self.idle.notify_waiters();
        }
    }

    /// Hands free slots to queued requests, oldest first (none while closed or paused).
    fn hand_out(self: &Arc<Self>, inner: &mut Inner<R>) {
        while inner.closed.is_none() && !inner.paused {
            let Some(free) = inner.pick() else { break };
            let Some(waiter) = inner.queue.pop_front() else { break };
            if waiter.is_closed() {
                continue;
            }
            let permit = self.grant(inner, free);
            if let Err(Ok(mut permit)) = waiter.send(Ok(permit)) {
                // The waiter left between the check and the send: take the slot back here,
                // under the lock, instead of through the permit's Drop.
                permit.shared = None;
                Self::ungrant(inner, free);
            }
        }
    }
}

impl<R: ?Sized> Permit<R> {
    /// The runtime of the replica this permit runs on.
    pub fn runtime(&self) -> &Arc<R> {
        &self.runtime
    }

    /// The replica index this permit runs on.
    pub fn replica(&self) -> usize {
        self.replica
    }
}

impl<R: ?Sized> Drop for Permit<R> {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.take() {
            shared.release(self.replica);
        }
    }
}

impl<R: ?Sized> std::fmt::Debug for Permit<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Permit").field("replica", &self.replica).finish_non_exhaustive()
    }
}

impl<R: ?Sized> std::fmt::Debug for Scheduler<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler").finish_non_exhaustive()
    }
}
