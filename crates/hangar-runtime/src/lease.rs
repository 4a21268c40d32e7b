//! Leases, pins and idle unloads: what keeps a model loaded, and what unloads it when
//! nobody needs it.
//!
//! - A **lease** holds a model loaded for a job (`owner`, `ttl_seconds`): taking one loads
//!   the model if needed; it is renewed or released by id and dropped when it expires. A
//!   model with a live lease is never evicted nor unloaded for idleness; an operator's
//!   explicit unload still unloads it and revokes its leases.
//! - A **pinned** model (`pinned: true` in config) is never evicted nor unloaded for
//!   idleness. A load that could only proceed by evicting held (pinned or leased) models
//!   fails with `slots_pinned`, naming them, and evicts nothing.
//! - **Idle unload** (`idle_unload_seconds`, per model or global): a loaded model with
//!   nothing running or queued, not paused, not held, unused for that long is unloaded.
//!
//! One housekeeping task per manager, started when the first lease is taken or at the first
//! load when an idle timeout is configured, drops expired leases and unloads idle models
//! once a second.

use std::num::NonZeroU32;
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use hangar_lifecycle::ModelState;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::entry::{ModelEntry, Slot};
use crate::error::ManagerError;
use crate::journal::{EventKind, unix_ms};
use crate::manager::{Inner, Manager};
use crate::unload::UnloadCause;

/// Longest lease: a week.
pub const MAX_LEASE_SECONDS: u32 = 7 * 24 * 3600;

/// Longest lease `owner`, in bytes: it is kept with the lease, listed in the admin row and
/// journaled with every change.
pub const MAX_LEASE_OWNER_BYTES: usize = 256;

/// How often housekeeping looks for expired leases and idle models.
const HOUSEKEEPING_PERIOD: Duration = Duration::from_secs(1);

/// A lease on a model, as the admin row lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Lease {
    /// Its id (for renew and release).
    pub id: String,
    /// Who holds it (free text: a job, a user).
    pub owner: String,
    /// Its length; a renewal starts it again.
    pub ttl_seconds: u32,
    /// When it ends unless renewed, Unix milliseconds.
    pub expires_unix_ms: u64,
}

/// A lease and its monotonic deadline.
#[derive(Debug, Clone)]
pub(crate) struct Held {
    pub(crate) lease: Lease,
    pub(crate) deadline: Instant,
}

/// What happened to a lease (the journal's `lease` events).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LeaseChange {
    /// Taken.
    Acquired,
    /// Renewed.
    Renewed,
    /// Released by its holder.
    Released,
    /// Its time ran out.
    Expired,
    /// Dropped by an explicit unload of the model.
    Revoked,
}

impl Slot {
    /// The leases that have not expired (housekeeping drops the others within a second).
    pub(crate) fn live_leases(&self) -> impl Iterator<Item = &Lease> {
        let now = Instant::now();
        self.leases.iter().filter(move |h| h.deadline > now).map(|h| &h.lease)
    }

    /// Whether a live lease holds the model.
    pub(crate) fn leased(&self) -> bool {
        self.live_leases().next().is_some()
    }
}

fn lease_not_found(model: &str, id: &str) -> ManagerError {
    ManagerError::LeaseNotFound { model: model.to_owned(), id: id.to_owned() }
}

/// The refusal of a lease while an explicit unload of the model is under way.
fn unload_pending(slot: &Slot) -> ManagerError {
    ManagerError::Conflict {
        state: slot.lifecycle.state(),
        message: "an unload of the model is under way; take the lease once it is done".into(),
    }
}

fn check_ttl(ttl_seconds: u32) -> Result<Duration, ManagerError> {
    if ttl_seconds == 0 || ttl_seconds > MAX_LEASE_SECONDS {
        return Err(ManagerError::InvalidLoadRequest {
            field: Some("ttl_seconds".into()),
            message: format!("must be between 1 and {MAX_LEASE_SECONDS}, got {ttl_seconds}"),
        });
    }
    Ok(Duration::from_secs(u64::from(ttl_seconds)))
}

impl Manager {
    /// Takes a lease on `name` for `ttl_seconds`, loading the model if it is not loaded.
    ///
    /// # Errors
    /// `unknown_model`; [`ManagerError::InvalidLoadRequest`] for an empty owner, one over
    /// [`MAX_LEASE_OWNER_BYTES`] or a ttl outside 1..=[`MAX_LEASE_SECONDS`];
    /// [`ManagerError::TooManyLeases`] when the model already has
    /// `limits.max_leases_per_model` live leases; the load's errors (the lease is not kept
    /// then). A refusal changes nothing.
    pub async fn acquire_lease(
        &self,
        name: &str,
        owner: &str,
        ttl_seconds: u32,
    ) -> Result<Lease, ManagerError> {
        let entry = self.entry(name)?;
        if owner.trim().is_empty() {
            return Err(ManagerError::InvalidLoadRequest {
                field: Some("owner".into()),
                message: "must not be empty".into(),
            });
        }
        if owner.len() > MAX_LEASE_OWNER_BYTES {
            return Err(ManagerError::InvalidLoadRequest {
                field: Some("owner".into()),
                message: format!(
                    "must be at most {MAX_LEASE_OWNER_BYTES} bytes, got {}",
                    owner.len()
                ),
            });
        }
        let ttl = check_ttl(ttl_seconds)?;
        let lease = {
            // Counted and taken under one lock, so concurrent acquires cannot pass the cap
            // together. Held before the load, so no eviction planned meanwhile can take the
            // model.
            let mut slot = entry.lock();
            let limit = self.inner.max_leases;
            match lease_refusal(slot.unloads_pending, slot.live_leases().count(), limit) {
                Some(LeaseRefusal::UnloadPending) => return Err(unload_pending(&slot)),
                Some(LeaseRefusal::TooMany) => {
                    let model = entry.config.name.to_string();
                    return Err(ManagerError::TooManyLeases { model, limit: limit.get() });
                }
                None => {}
            }
            let n = self.inner.next_lease.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let lease = Lease {
                id: format!("lease-{n}"),
                owner: owner.to_owned(),
                ttl_seconds,
                expires_unix_ms: unix_ms(SystemTime::now() + ttl),
            };
            slot.leases.push(Held { lease: lease.clone(), deadline: Instant::now() + ttl });
            lease
        };
        self.start_housekeeping();
        // The load and the grant run to their end even if this caller goes away: the lease
        // is then granted (and journaled) or gone, never left half-taken.
        let (this, name) = (self.clone(), name.to_owned());
        let task = tokio::spawn(async move {
            let loaded = this.load_on_demand(&name).await;
            let mut slot = entry.lock();
            // An unload decided while the model loaded wins: the lease is not granted.
            let refused = match loaded {
                Err(e) => Some(e),
                Ok(_) if slot.unloads_pending > 0 => Some(unload_pending(&slot)),
                Ok(_) => None,
            };
            if let Some(e) = refused {
                slot.leases.retain(|h| h.lease.id != lease.id);
                return Err(e);
            }
            drop(slot);
            this.journal_lease(&entry, &lease, LeaseChange::Acquired);
            Ok(lease)
        });
        task.await.unwrap_or_else(|_| {
            Err(ManagerError::Conflict {
                state: ModelState::Unloaded,
                message: "the lease task panicked".into(),
            })
        })
    }

    /// Renews lease `id` of `name` for `ttl_seconds` (its own length when `None`).
    ///
    /// # Errors
    /// `unknown_model`; [`ManagerError::LeaseNotFound`] (also once it expired);
    /// [`ManagerError::InvalidLoadRequest`] for a ttl out of range.
    pub fn renew_lease(
        &self,
        name: &str,
        id: &str,
        ttl_seconds: Option<u32>,
    ) -> Result<Lease, ManagerError> {
        let entry = self.entry(name)?;
        let mut slot = entry.lock();
        let now = Instant::now();
        let held = slot
            .leases
            .iter_mut()
            .find(|h| h.lease.id == id && h.deadline > now)
            .ok_or_else(|| lease_not_found(name, id))?;
        let ttl_seconds = ttl_seconds.unwrap_or(held.lease.ttl_seconds);
        let ttl = check_ttl(ttl_seconds)?;
        held.deadline = now + ttl;
        held.lease.ttl_seconds = ttl_seconds;
        held.lease.expires_unix_ms = unix_ms(SystemTime::now() + ttl);
        let lease = held.lease.clone();
        drop(slot);
        self.journal_lease(&entry, &lease, LeaseChange::Renewed);
        Ok(lease)
    }

    /// Releases lease `id` of `name`. The model stays loaded (evictable, idle-unloadable).
    ///
    /// # Errors
    /// `unknown_model`; [`ManagerError::LeaseNotFound`].
    pub fn release_lease(&self, name: &str, id: &str) -> Result<Lease, ManagerError> {
        let entry = self.entry(name)?;
        let mut slot = entry.lock();
        let at = slot.leases.iter().position(|h| h.lease.id == id);
        let held = at.map(|i| slot.leases.remove(i)).ok_or_else(|| lease_not_found(name, id))?;
        drop(slot);
        self.journal_lease(&entry, &held.lease, LeaseChange::Released);
        Ok(held.lease)
    }

    /// Drops every lease of `entry` (an explicit unload, a crash).
    pub(crate) fn revoke_leases(&self, entry: &ModelEntry) {
        let revoked = std::mem::take(&mut entry.lock().leases);
        for held in revoked {
            self.journal_lease(entry, &held.lease, LeaseChange::Revoked);
        }
    }

    fn journal_lease(&self, entry: &ModelEntry, lease: &Lease, change: LeaseChange) {
        let kind = EventKind::Lease { change, id: lease.id.clone(), owner: lease.owner.clone() };
        self.inner.events.journal.record(&entry.config.name, kind);
    }

    /// Starts the housekeeping task once (it needs a tokio runtime: called from async
    /// methods only).
    pub(crate) fn start_housekeeping(&self) {
        if self.inner.housekeeping.set(()).is_err() {
            return;
        }
        let inner = Arc::downgrade(&self.inner);
        tokio::spawn(housekeeping(inner));
    }
}

/// Once a second: drop expired leases, unload idle models; ends with the manager.
async fn housekeeping(inner: Weak<Inner>) {
    let mut tick = tokio::time::interval(HOUSEKEEPING_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(inner) = inner.upgrade() else { return };
        let manager = Manager { inner };
        for entry in manager.inner.order.clone() {
            manager.expire_leases(&entry);
            if let Some(idle) = manager.idle_for(&entry) {
                // A model busy with an admin operation is not idle; try again next tick.
                let control = &manager.inner.control;
                let Ok(admin) = control.admin_now(entry.position).await else { continue };
                let seconds = idle.as_secs();
                let kind = EventKind::IdleUnload { idle_seconds: seconds };
                tracing::info!(model = %entry.config.name, idle_s = seconds, "unloading an idle model");
                let (m, e) = (manager.clone(), Arc::clone(&entry));
                tokio::spawn(async move {
                    let _admin = admin;
                    m.unload_entry(&e, UnloadCause::Idle(kind)).await;
                });
            }
        }
    }
}

impl Manager {
    fn expire_leases(&self, entry: &ModelEntry) {
        let now = Instant::now();
        let expired: Vec<Held> = {
            let mut slot = entry.lock();
            let (gone, kept) =
                std::mem::take(&mut slot.leases).into_iter().partition(|h| h.deadline <= now);
            slot.leases = kept;
            gone
        };
        for held in expired {
            self.journal_lease(entry, &held.lease, LeaseChange::Expired);
        }
    }

    /// How long `entry` has been idle, if that is past its idle timeout and nothing keeps
    /// it ([`idle_past`]).
    fn idle_for(&self, entry: &ModelEntry) -> Option<Duration> {
        let timeout = entry.idle_timeout?;
        let slot = entry.lock();
        let stats = slot.phase.scheduler().map(hangar_lifecycle::Scheduler::stats);
        idle_past(&IdleView {
            timeout,
            pinned: entry.config.pinned,
            loaded: slot.lifecycle.state() == ModelState::Loaded,
            busy: stats.is_none_or(|s| s.runtime_inflight > 0 || s.queue_depth > 0),
            pins: self.inner.control.pins(entry.position),
            paused: slot.phase.pause().is_some(),
            leased: slot.leased(),
            idle: slot.last_use.map_or(Duration::ZERO, |(at, _)| at.elapsed()),
        })
    }
}

/// Why a lease is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LeaseRefusal {
    /// An explicit unload was asked for and is not done.
    UnloadPending,
    /// The model has `limits.max_leases_per_model` live leases.
    TooMany,
}

/// The lease rule, given the unloads pending and the live leases: never granted while an
/// unload is decided (the unload would revoke it), never past the cap.
fn lease_refusal(unloads_pending: u32, live: usize, limit: NonZeroU32) -> Option<LeaseRefusal> {
    if unloads_pending > 0 {
        Some(LeaseRefusal::UnloadPending)
    } else if live >= limit.get() as usize {
        Some(LeaseRefusal::TooMany)
    } else {
        None
    }
}

/// What the idle rule looks at, read under the model's slot lock.
#[derive(Debug, Clone)]
struct IdleView {
    timeout: NonZeroU32,
    /// `pinned: true` in its definition.
    pinned: bool,
    loaded: bool,
    /// Requests running or queued.
    busy: bool,
    /// Requests that triggered its load and wait for admission.
    pins: u32,
    paused: bool,
    leased: bool,
    /// Since its last use.
    idle: Duration,
}

/// The idle rule: a model is unloaded for idleness once it has been idle for its timeout,
/// loaded, with nothing running, queued or pinned by a waiting request, not paused, not
/// pinned by its definition, not leased. Returns how long it has been idle then.
fn idle_past(v: &IdleView) -> Option<Duration> {
    let kept = v.pinned || !v.loaded || v.busy || v.pins > 0 || v.paused || v.leased;
    (!kept && v.idle >= Duration::from_secs(u64::from(v.timeout.get()))).then_some(v.idle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lease_rule_as_a_table() {
        let limit = NonZeroU32::new(2).unwrap();
        let rows = [
            ("room, no unload", 0, 1, None),
            ("an unload is decided", 1, 0, Some(LeaseRefusal::UnloadPending)),
            ("an unload beats the cap", 2, 2, Some(LeaseRefusal::UnloadPending)),
            ("at the cap", 0, 2, Some(LeaseRefusal::TooMany)),
            ("past it (expired ones are not live)", 0, 3, Some(LeaseRefusal::TooMany)),
        ];
        for (name, pending, live, expected) in rows {
            assert_eq!(lease_refusal(pending, live, limit), expected, "{name}");
        }
    }

    #[test]
    fn the_idle_rule_as_a_table() {
        let idle = IdleView {
            timeout: NonZeroU32::new(60).unwrap(),
            pinned: false,
            loaded: true,
            busy: false,
            pins: 0,
            paused: false,
            leased: false,
            idle: Duration::from_secs(60),
        };
        let s = Duration::from_secs;
        let rows: [(&str, IdleView, Option<Duration>); 9] = [
            ("idle for its timeout", idle.clone(), Some(s(60))),
            ("not yet", IdleView { idle: s(59), ..idle.clone() }, None),
            ("pinned by its definition", IdleView { pinned: true, ..idle.clone() }, None),
            ("not loaded", IdleView { loaded: false, ..idle.clone() }, None),
            ("requests running or queued", IdleView { busy: true, ..idle.clone() }, None),
            ("a request waits for it", IdleView { pins: 1, ..idle.clone() }, None),
            ("paused", IdleView { paused: true, ..idle.clone() }, None),
            ("leased", IdleView { leased: true, ..idle.clone() }, None),
            ("long idle", IdleView { idle: s(3600), ..idle }, Some(s(3600))),
        ];
        for (name, view, expected) in rows {
            assert_eq!(idle_past(&view), expected, "{name}");
        }
    }
}
