//! The lease rules, decided in [`step`](super::step): a lease holds its model loaded for a
//! job until it is released, expires, or an explicit unload revokes it.
//!
//! - A lease is taken in two steps around the load it needs: [`LeaseCommand::Acquire`]
//!   reserves it (it holds the model from then on, so no eviction planned meanwhile takes
//!   the model), and [`LeaseCommand::Settle`] grants it once the model loaded — or drops
//!   it when the load failed, an unload was decided meanwhile, or the lease ended.
//! - A lease is never granted while an explicit unload of its model is decided and not
//!   ended (the unload would revoke it), nor past `limits.max_leases_per_model` live ones.
//! - An unload that ends with `revoke` drops every lease of the model; a lease whose
//!   deadline came is dropped by the next [`Command::Tick`](super::Command::Tick).
//!
//! Every change of a model's leases is published (the row lists them; eviction and the
//! idle rule read them) before any waiter is answered, and journaled.

use std::cmp::Reverse;
use std::time::Duration;

use tokio::time::Instant;

use super::{Effect, ModelId, State};
use crate::lease::{Held, Lease, LeaseChange};

/// A lease operation on one model; `W` answers the one who asked.
#[derive(Debug, Clone)]
pub(crate) enum LeaseCommand<W> {
    /// Reserves a lease of `ttl_seconds` (checked by the caller) taken at `wall_ms` (Unix
    /// milliseconds, for the row): answered with the lease, held from now on, or refused.
    Acquire { owner: String, ttl_seconds: u32, wall_ms: u64, waiter: W },
    /// The reserved lease `id` after its load: granted when the model `loaded`, no unload
    /// is decided and the lease has not ended; dropped otherwise.
    Settle { id: String, loaded: bool, waiter: W },
    /// Renews the live lease `id` for `ttl_seconds` (its own length when `None`) from
    /// `wall_ms`.
    Renew { id: String, ttl_seconds: Option<u32>, wall_ms: u64, waiter: W },
    /// Releases lease `id`.
    Release { id: String, waiter: W },
}

/// Why a lease operation was refused; it changed nothing (a refused settlement dropped
/// its reservation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeaseRefusal {
    /// An explicit unload of the model is decided and not ended.
    UnloadPending,
    /// The model has `limit` (`limits.max_leases_per_model`) live leases.
    TooMany { limit: u32 },
    /// No live lease has that id.
    NotFound,
    /// The reservation ended before it was settled: its load failed, it expired, was
    /// released, or an unload revoked it.
    Ended,
}

/// One model's leases, and the unloads that bar new ones.
#[derive(Debug, Default)]
pub(super) struct Book {
    /// Reserved and granted leases; expired ones until the next tick.
    held: Vec<Held>,
    /// Explicit unloads decided and not ended.
    unloads: u32,
}

impl Book {
    #[cfg(test)]
    pub(super) fn held(&self) -> &[Held] {
        &self.held
    }

    fn live(&self, now: Instant) -> impl Iterator<Item = &Held> {
        self.held.iter().filter(move |h| h.deadline > now)
    }

    /// Whether a live (granted or reserved) lease holds the model.
    pub(super) fn holds(&self, now: Instant) -> bool {
        self.live(now).next().is_some()
    }
}

/// The lease rule: never while an unload is decided, never past the cap.
fn refusal(book: &Book, limit: usize, now: Instant) -> Option<LeaseRefusal> {
    if book.unloads > 0 {
        Some(LeaseRefusal::UnloadPending)
    } else if book.live(now).count() >= limit {
        Some(LeaseRefusal::TooMany { limit: limit as u32 })
    } else {
        None
    }
}

/// Decides a lease operation on `model`.
pub(super) fn lease<W, P>(
    state: &mut State<W>,
    model: ModelId,
    command: LeaseCommand<W>,
    now: Instant,
    effects: &mut Vec<Effect<W, P>>,
) {
    let limit = state.rules.max_leases.get() as usize;
    let mut changes = Vec::new();
    // Whether the model's leases changed (then published before the answer).
    let mut changed = true;
    let (waiter, answer) = match command {
        LeaseCommand::Acquire { owner, ttl_seconds, wall_ms, waiter } => {
            if let Some(refused) = refusal(&state.models[model].leases, limit, now) {
                effects.push(Effect::Lease { model, waiter, answer: Err(refused) });
                return;
            }
            state.next_lease += 1;
            let ttl = Duration::from_secs(u64::from(ttl_seconds));
            let lease = Lease {
                id: format!("lease-{}", state.next_lease),
                owner,
                ttl_seconds,
                expires_unix_ms: wall_ms.saturating_add(ttl.as_millis() as u64),
            };
            let deadline = now + ttl;
            state.models[model].leases.held.push(Held { lease: lease.clone(), deadline });
            state.lease_deadlines.push(Reverse((deadline, model)));
            (waiter, Ok(lease))
        }
        LeaseCommand::Settle { id, loaded, waiter } => {
            let book = &mut state.models[model].leases;
            let at = book.held.iter().position(|h| h.lease.id == id && h.deadline > now);
            let answer = match at {
                None => {
                    changed = false;
                    Err(LeaseRefusal::Ended)
                }
                Some(at) if !loaded => {
                    book.held.remove(at);
                    Err(LeaseRefusal::Ended)
                }
                Some(at) if book.unloads > 0 => {
                    book.held.remove(at);
                    Err(LeaseRefusal::UnloadPending)
                }
                Some(at) => {
                    changed = false;
                    let lease = book.held[at].lease.clone();
                    changes.push((LeaseChange::Acquired, lease.clone()));
                    Ok(lease)
                }
            };
            (waiter, answer)
        }
        LeaseCommand::Renew { id, ttl_seconds, wall_ms, waiter } => {
            let book = &mut state.models[model].leases;
            let found = book.held.iter_mut().find(|h| h.lease.id == id && h.deadline > now);
            let Some(held) = found else {
                effects.push(Effect::Lease { model, waiter, answer: Err(LeaseRefusal::NotFound) });
                return;
            };
            let ttl_seconds = ttl_seconds.unwrap_or(held.lease.ttl_seconds);
            let ttl = Duration::from_secs(u64::from(ttl_seconds));
            held.deadline = now + ttl;
            held.lease.ttl_seconds = ttl_seconds;
            held.lease.expires_unix_ms = wall_ms.saturating_add(ttl.as_millis() as u64);
            let lease = held.lease.clone();
            state.lease_deadlines.push(Reverse((now + ttl, model)));
            changes.push((LeaseChange::Renewed, lease.clone()));
            (waiter, Ok(lease))
        }
        LeaseCommand::Release { id, waiter } => {
            let book = &mut state.models[model].leases;
            match book.held.iter().position(|h| h.lease.id == id) {
                None => {
                    changed = false;
                    (waiter, Err(LeaseRefusal::NotFound))
                }
                Some(at) => {
                    let lease = book.held.remove(at).lease;
                    changes.push((LeaseChange::Released, lease.clone()));
                    (waiter, Ok(lease))
                }
            }
        }
    };
    if changed {
        publish(state, model, effects);
    }
    journal(model, changes, effects);
    effects.push(Effect::Lease { model, waiter, answer });
}

/// An explicit unload of `model` is decided: no lease is granted until it ends.
pub(super) fn unload_decided<W>(state: &mut State<W>, model: ModelId) {
    state.models[model].leases.unloads += 1;
}

/// An explicit unload of `model` ended; with `revoke`, its leases go.
pub(super) fn unload_ended<W, P>(
    state: &mut State<W>,
    model: ModelId,
    revoke: bool,
    effects: &mut Vec<Effect<W, P>>,
) {
    let book = &mut state.models[model].leases;
    book.unloads = book.unloads.saturating_sub(1);
    if revoke && !book.held.is_empty() {
        let revoked = std::mem::take(&mut book.held);
        publish(state, model, effects);
        let changes = revoked.into_iter().map(|h| (LeaseChange::Revoked, h.lease)).collect();
        journal(model, changes, effects);
    }
}

/// Drops every lease whose deadline came.
pub(super) fn expire<W, P>(state: &mut State<W>, now: Instant, effects: &mut Vec<Effect<W, P>>) {
    while let Some(&Reverse((at, model))) = state.lease_deadlines.peek()
        && at <= now
    {
        state.lease_deadlines.pop();
        let book = &mut state.models[model].leases;
        let (gone, kept): (Vec<Held>, Vec<Held>) =
            std::mem::take(&mut book.held).into_iter().partition(|h| h.deadline <= now);
        book.held = kept;
        if !gone.is_empty() {
            publish(state, model, effects);
            let changes = gone.into_iter().map(|h| (LeaseChange::Expired, h.lease)).collect();
            journal(model, changes, effects);
        }
    }
}

fn publish<W, P>(state: &State<W>, model: ModelId, effects: &mut Vec<Effect<W, P>>) {
    let held = state.models[model].leases.held.clone();
    effects.push(Effect::Leases { model, held });
}

fn journal<W, P>(
    model: ModelId,
    changes: Vec<(LeaseChange, Lease)>,
    effects: &mut Vec<Effect<W, P>>,
) {
    for (change, lease) in changes {
        effects.push(Effect::LeaseChanged { model, change, lease });
    }
}
