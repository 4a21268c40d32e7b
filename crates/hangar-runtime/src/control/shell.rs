//! The control loop's shell: the task that takes each command, lets [`step`] decide, and
//! performs the effects — answers to waiters, the slot work of decided moves, what it
//! publishes to the slots, the journal.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::Turn;
use super::step::{Command, Effect, Moved, Rules, State, Stay, TurnKind, step};
use super::{Apply, Busy, Waiter};
use crate::entry::ModelEntry;
use crate::events::Events;
use crate::journal::EventKind;

/// What the loop's effects reach besides its waiters: the slots it publishes to, and the
/// journal.
pub(super) struct Sink {
    pub(super) entries: super::Entries,
    pub(super) events: Arc<Events>,
}

impl Sink {
    /// Writes what the loop decided about `model` to its slot.
    fn publish(&self, model: usize, write: impl FnOnce(&mut crate::entry::Slot)) {
        if let Some(entry) = self.entry(model) {
            write(&mut entry.lock());
        }
    }

    /// The entry of `model`.
    fn entry(&self, model: usize) -> Option<Arc<ModelEntry>> {
        super::read(&self.entries).get(model).cloned()
    }
}

/// What the loop starts with.
pub(super) struct Start {
    pub(super) rx: mpsc::UnboundedReceiver<Command<Waiter, Apply>>,
    pub(super) rules: Rules,
    pub(super) sink: Sink,
    /// How many models the handle was made with.
    pub(super) models: usize,
}

/// The loop: takes each command, lets [`step`] decide, answers the waiters.
pub(super) async fn run(
    Start { mut rx, rules, sink, models }: Start,
    tx: mpsc::WeakUnboundedSender<Command<Waiter, Apply>>,
) {
    // The models the handle was made with (and the figures the state file gave their
    // slots); those added since come as `Command::Add`, in order, after these.
    let mut state = State::new(models, rules);
    for model in 0..models {
        if let Some(entry) = sink.entry(model) {
            state.restore_figures(model, entry.lock().vram.clone());
        }
    }
    loop {
        let command = match state.next_deadline() {
            Some(at) => tokio::select! {
                command = rx.recv() => command,
                () = tokio::time::sleep_until(at) => Some(Command::Tick),
            },
            None => rx.recv().await,
        };
        let Some(mut command) = command else { return };
        // The pin count as it is now, read here: a pin that went before this read is
        // counted out; one that goes after posts another `Unpinned`.
        if let Command::AwaitUnpinned { model, pins: seen, .. }
        | Command::Unpinned { model, pins: seen } = &mut command
        {
            *seen = sink.entry(*model).map_or(0, |e| e.pins.load(Ordering::SeqCst));
        }

        // Answers to moves go out once every effect of the step is performed (a failed
        // load's quarantine included).
        let mut moves = Vec::new();
        for effect in step(&mut state, command, Instant::now()) {
            perform(effect, &tx, &sink, &mut moves);
        }
        for (waiter, answer) in moves {
            let _ = waiter.send(answer);
        }
    }
}

/// A move's answer, sent after the step's effects.
type MoveAnswer = (oneshot::Sender<Result<Moved, Stay>>, Result<Moved, Stay>);

fn perform(
    effect: Effect<Waiter, Apply>,
    tx: &mpsc::WeakUnboundedSender<Command<Waiter, Apply>>,
    sink: &Sink,
    moves: &mut Vec<MoveAnswer>,
) {
    match effect {
        Effect::Grant { model, turn, waiter: Waiter::Turn(waiter) } => {
            let tx = if turn == TurnKind::Unpinned { None } else { tx.upgrade() };
            let turn = Turn { tx, model, kind: turn };
            // A waiter that went away drops the turn here, which gives it back.
            let _ = waiter.send(Ok(turn));
        }
        Effect::Busy { waiter: Waiter::Turn(waiter), .. } => {
            let _ = waiter.send(Err(Busy));
        }
        Effect::Lease { waiter: Waiter::Lease(waiter), answer, .. } => {
            let _ = waiter.send(answer);
        }
        Effect::Leases { model, held } => {
            sink.publish(model, |slot| slot.leases = held);
        }
        Effect::LeaseChanged { model, change, lease } => {
            if let Some(entry) = sink.entry(model) {
                let kind = EventKind::Lease { change, id: lease.id, owner: lease.owner };
                sink.events.journal.record(&entry.config.name, kind);
            }
        }
        Effect::MayLoad { waiter: Waiter::MayLoad(waiter), answer, .. } => {
            let _ = waiter.send(answer);
        }
        Effect::Flushed { waiter: Waiter::Flush(waiter) } => {
            let _ = waiter.send(());
        }
        Effect::Figures { model, vram } => {
            sink.publish(model, |slot| slot.vram = vram);
        }
        Effect::Idle { waiter: Waiter::Idle(waiter), answer, .. } => {
            let _ = waiter.send(answer);
        }
        Effect::Release { waiter: Waiter::Release(waiter), answer } => {
            let _ = waiter.send(answer);
        }
        Effect::Retired { waiter: Waiter::Retire(waiter), retired, .. } => {
            let _ = waiter.send(retired);
        }
        Effect::Granted { waiter: Waiter::Grant(waiter), answer, .. } => {
            let _ = waiter.send(answer);
        }
        Effect::Moved { model, moved, apply, waiter } => {
            if let Some(entry) = sink.entry(model) {
                let mut slot = entry.lock();
                (apply.0)(&mut slot);
                slot.generation = moved.generation;
                if let Some(event) = moved.event {
                    entry.apply(&mut slot, event, moved.error.clone(), &sink.events);
                }
            }
            if let Waiter::Move(waiter) = waiter {
                moves.push((waiter, Ok(moved)));
            }
        }
        Effect::Stays { waiter: Waiter::Move(waiter), why, .. } => moves.push((waiter, Err(why))),
        Effect::Replacing { model, count } => {
            sink.publish(model, |slot| slot.replacing = count);
        }
        Effect::Failures { model, view } => {
            sink.publish(model, |slot| slot.failures = view);
        }
        Effect::Quarantined { model, quarantine } => {
            if let Some(entry) = sink.entry(model) {
                let name = &entry.config.name;
                tracing::warn!(model = %name, failures = quarantine.failures, retry_after_s = quarantine.retry_after_s, "model quarantined");
                sink.events.journal.record(name, EventKind::Quarantined { quarantine });
            }
        }
        Effect::QuarantineLifted { model } => {
            if let Some(entry) = sink.entry(model) {
                let name = &entry.config.name;
                tracing::info!(model = %name, "quarantine lifted by an explicit load");
                sink.events.journal.record(name, EventKind::QuarantineLifted);
            }
        }
        // An answer of one kind to a waiter of another: no caller asks that way.
        Effect::Grant { .. }
        | Effect::Busy { .. }
        | Effect::Lease { .. }
        | Effect::MayLoad { .. }
        | Effect::Flushed { .. }
        | Effect::Granted { .. }
        | Effect::Release { .. }
        | Effect::Idle { .. }
        | Effect::Retired { .. }
        | Effect::Stays { .. } => {}
    }
}
