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
//! Leases are the control loop's (`control/step/lease.rs` holds their rules): it reserves,
//! grants, renews, releases, expires and revokes them, and publishes each model's leases
//! to its slot, where this module's readers find them. One housekeeping task per manager,
//! started at the first load when an idle timeout is configured, unloads idle models once
//! a second.

use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use hangar_lifecycle::ModelState;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::control::{IdleAction, IdleDue, IdleSeen, LeaseCommand, LeaseRefusal};
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

/// How often housekeeping looks for idle models.
const HOUSEKEEPING_PERIOD: Duration = Duration::from_secs(1);

/// A lease on a model, as the admin row lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Held {
    pub(crate) lease: Lease,
    pub(crate) deadline: Instant,
}

/// What happened to a lease (the journal's `lease` events).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
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
    /// The leases that have not expired (the control loop drops the others at their
    /// deadline).
    pub(crate) fn live_leases(&self) -> impl Iterator<Item = &Lease> {
        let now = Instant::now();
        self.leases.iter().filter(move |h| h.deadline > now).map(|h| &h.lease)
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
    /// The control loop reserves the lease before the load (so no eviction planned
    /// meanwhile takes the model) and grants it once the model loaded; the whole runs to
    /// its end even if this caller goes away, so a lease is granted (and journaled) or
    /// gone, never left half-taken.
    ///
    /// # Errors
    /// `unknown_model`; [`ManagerError::InvalidLoadRequest`] for an empty owner, one over
    /// [`MAX_LEASE_OWNER_BYTES`] or a ttl outside 1..=[`MAX_LEASE_SECONDS`];
    /// [`ManagerError::TooManyLeases`] when the model already has
    /// `limits.max_leases_per_model` live leases; [`ManagerError::Conflict`] while an
    /// explicit unload of the model is decided (or when one revoked the lease before the
    /// model loaded); the load's errors (the lease is not kept then). A refusal changes
    /// nothing.
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
        check_ttl(ttl_seconds)?;
        let (this, owner, name) = (self.clone(), owner.to_owned(), name.to_owned());
        let task = tokio::spawn(async move {
            let (control, model) = (&this.inner.control, entry.position);
            let wall_ms = unix_ms(SystemTime::now());
            let acquire = |waiter| LeaseCommand::Acquire { owner, ttl_seconds, wall_ms, waiter };
            let reserved = control.lease(model, acquire).await;
            let lease = reserved.map_err(|r| this.lease_refused(&entry, r, None))?;
            let loaded = this.load_on_demand(&name).await;
            let id = lease.id.clone();
            let settle = |waiter| LeaseCommand::Settle { id, loaded: loaded.is_ok(), waiter };
            let settled = control.lease(model, settle).await;
            loaded?;
            settled.map_err(|r| this.lease_refused(&entry, r, Some(&lease.id)))
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
    pub async fn renew_lease(
        &self,
        name: &str,
        id: &str,
        ttl_seconds: Option<u32>,
    ) -> Result<Lease, ManagerError> {
        let entry = self.entry(name)?;
        if let Some(ttl_seconds) = ttl_seconds {
            check_ttl(ttl_seconds)?;
        }
        let wall_ms = unix_ms(SystemTime::now());
        let id = id.to_owned();
        let renew = |waiter| LeaseCommand::Renew { id: id.clone(), ttl_seconds, wall_ms, waiter };
        let renewed = self.inner.control.lease(entry.position, renew).await;
        renewed.map_err(|r| self.lease_refused(&entry, r, Some(&id)))
    }

    /// Releases lease `id` of `name`. The model stays loaded (evictable, idle-unloadable).
    ///
    /// # Errors
    /// `unknown_model`; [`ManagerError::LeaseNotFound`].
    pub async fn release_lease(&self, name: &str, id: &str) -> Result<Lease, ManagerError> {
        let entry = self.entry(name)?;
        let release = |waiter| LeaseCommand::Release { id: id.to_owned(), waiter };
        let released = self.inner.control.lease(entry.position, release).await;
        released.map_err(|r| self.lease_refused(&entry, r, Some(id)))
    }

    /// The error of a lease operation the loop refused (`id`: the lease it named).
    fn lease_refused(
        &self,
        entry: &ModelEntry,
        refusal: LeaseRefusal,
        id: Option<&str>,
    ) -> ManagerError {
        let model = entry.config.name.to_string();
        let state = entry.lock().lifecycle.state();
        match refusal {
            LeaseRefusal::UnloadPending => ManagerError::Conflict {
                state,
                message: "an unload of the model is under way; take the lease once it is done"
                    .into(),
            },
            LeaseRefusal::TooMany { limit } => ManagerError::TooManyLeases { model, limit },
            LeaseRefusal::NotFound => {
                ManagerError::LeaseNotFound { model, id: id.unwrap_or_default().to_owned() }
            }
            LeaseRefusal::Ended => ManagerError::Conflict {
                state,
                message: "the lease ended before the model loaded (it expired, was released, \
                          or an unload revoked it)"
                    .into(),
            },
        }
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

/// Once a second: unload idle models; ends with the manager.
async fn housekeeping(inner: Weak<Inner>) {
    let mut tick = tokio::time::interval(HOUSEKEEPING_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(inner) = inner.upgrade() else { return };
        let manager = Manager { inner };
        for entry in manager.registry().order.clone() {
            let Some(due) = manager.idle_for(&entry).await else { continue };
            // A model busy with an admin operation is not idle; try again next tick.
            let control = &manager.inner.control;
            let Ok(admin) = control.admin_now(entry.position).await else { continue };
            let seconds = due.idle.as_secs();
            let (m, e) = (manager.clone(), Arc::clone(&entry));
            match due.action {
                IdleAction::Unload => {
                    let kind = EventKind::IdleUnload { idle_seconds: seconds };
                    tracing::info!(model = %entry.config.name, idle_s = seconds, "unloading an idle model");
                    tokio::spawn(async move {
                        let _admin = admin;
                        m.unload_entry(&e, UnloadCause::Idle(kind)).await;
                    });
                }
                IdleAction::Sleep => {
                    tracing::info!(model = %entry.config.name, idle_s = seconds, "putting an idle model to sleep");
                    tokio::spawn(async move {
                        let _admin = admin;
                        if let Err(error) = m.sleep_entry(&e, None).await {
                            tracing::warn!(model = %e.config.name, %error, "an idle model did not sleep");
                        }
                    });
                }
            }
        }
    }
}

impl Manager {
    /// How long `entry` has been idle and what for (an unload, a sleep), if that is past a
    /// timeout and nothing keeps it: the loop's decision (`control/step/idle.rs`) on what
    /// the slot and the scheduler show.
    async fn idle_for(&self, entry: &ModelEntry) -> Option<IdleDue> {
        let seen = {
            let slot = entry.lock();
            let can_sleep = !slot.capabilities.sleep_levels.is_empty();
            let sleep = entry.config.idle_sleep_seconds.filter(|_| can_sleep);
            if entry.idle_timeout.is_none() && sleep.is_none() {
                return None;
            }
            let stats = slot.phase.scheduler().map(hangar_lifecycle::Scheduler::stats);
            IdleSeen {
                unload: entry.idle_timeout,
                sleep,
                pinned: entry.config.pinned,
                busy: stats.is_none_or(|s| s.runtime_inflight > 0 || s.queue_depth > 0),
                pins: entry.pins.load(std::sync::atomic::Ordering::SeqCst),
                idle: slot.last_use.map_or(Duration::ZERO, |(at, _)| at.elapsed()),
            }
        };
        self.inner.control.idle(entry.position, seen).await
    }
}
