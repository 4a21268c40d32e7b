//! Unloads and crash handling: the graceful unload (stop admissions, wait for pinned
//! requests, cancel queued requests, drain running ones, release the runtimes), unload-all,
//! and a crashed runtime's teardown.

use std::sync::Arc;

use hangar_backend::LoadOverride;
use hangar_lifecycle::{AdmissionError, LifecycleEvent, ModelState};

use crate::entry::ModelEntry;
use crate::error::ManagerError;
use crate::events::Events;
use crate::journal::EventKind;
use crate::manager::Manager;
use crate::phase::Phase;
use crate::snapshot::{ModelSnapshot, snapshot_of};

/// Why a model is being unloaded.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum UnloadCause {
    Request,
    /// To make room; the journal event that says so.
    Eviction(EventKind),
    /// Idle past its timeout; the journal event that says so.
    Idle(EventKind),
}

impl Manager {
    /// Gracefully unloads a configured model and answers when it is unloaded.
    ///
    /// Unloaded, unloading or failed: the current state, nothing changes.
    ///
    /// # Errors
    /// `unknown_model`; [`ManagerError::Conflict`] while the model is loading;
    /// [`ManagerError::AdminBusy`] when another admin operation holds the model too long.
    pub async fn unload(&self, name: &str) -> Result<ModelSnapshot, ManagerError> {
        let entry = self.entry(name)?;
        // Answers that change nothing come at once; an unload takes the admin turn first,
        // and the state is checked again in it.
        let check = || {
            let slot = entry.lock();
            match slot.lifecycle.state() {
                ModelState::Loaded => Ok(None),
                ModelState::Loading => Err(ManagerError::Conflict {
                    state: ModelState::Loading,
                    message: "the model is loading; unload it once it is loaded".into(),
                }),
                _ => Ok(Some(snapshot_of(&entry, &slot))),
            }
        };
        if let Some(answer) = check()? {
            return Ok(answer);
        }
        // Decided: from here no lease is granted until the unload is done (or given up).
        let decided = self.inner.control.unload_decided(entry.position);
        let admin = self.admin_turn(&entry).await?;
        if let Some(answer) = check()? {
            return Ok(answer);
        }
        // Runs to its end, leases revoked, even if this caller goes away.
        let (this, e) = (self.clone(), Arc::clone(&entry));
        let unload = async move {
            let _admin = admin;
            this.unload_entry(&e, UnloadCause::Request).await;
            // The operator asked for the model gone: its leases go, whatever it is now.
            decided.end(true);
        };
        let _ = tokio::spawn(unload).await;
        let slot = entry.lock();
        Ok(snapshot_of(&entry, &slot))
    }

    /// Unloads every loaded model (concurrently) and returns the names of the models this
    /// call unloaded. Like an explicit unload, it revokes their leases.
    pub async fn unload_all(&self) -> Vec<String> {
        // Detached tasks (not a `JoinSet`, which aborts its tasks when dropped): each unload
        // runs to its end even if this caller goes away.
        let mut tasks = Vec::new();
        for entry in &self.inner.order {
            let (this, entry) = (self.clone(), Arc::clone(entry));
            let decided = this.inner.control.unload_decided(entry.position);
            tasks.push(tokio::spawn(async move {
                let unloaded = this.unload_entry(&entry, UnloadCause::Request).await;
                decided.end(unloaded);
                unloaded.then(|| entry.config.name.to_string())
            }));
        }
        let mut unloaded = Vec::new();
        for task in tasks {
            unloaded.extend(task.await.ok().flatten());
        }
        let position =
            |name: &String| self.inner.order.iter().position(|e| e.config.name.as_str() == name);
        unloaded.sort_by_key(position);
        unloaded
    }

    /// The graceful unload: stop admissions, wait for pinned requests to be admitted (not
    /// on a paused model), cancel queued requests, drain running ones, release the
    /// runtimes. Returns whether this call unloaded the model (false when it was not
    /// loaded, or when an eviction or idle unload finds it held: pinned, leased or being
    /// replaced, checked under the same lock as the state change, so a lease taken
    /// meanwhile always wins).
    pub(crate) async fn unload_entry(&self, entry: &Arc<ModelEntry>, cause: UnloadCause) -> bool {
        let _runtimes = self.inner.control.destroy(entry.position).await;
        let (scheduler, paused) = {
            let mut slot = entry.lock();
            if slot.lifecycle.state() != ModelState::Loaded {
                return false;
            }
            let held = entry.config.pinned || slot.leased() || slot.replacing > 0;
            match &cause {
                UnloadCause::Request => {}
                UnloadCause::Eviction(_) | UnloadCause::Idle(_) if held => return false,
                UnloadCause::Eviction(announce) | UnloadCause::Idle(announce) => {
                    self.inner.events.journal.record(&entry.config.name, announce.clone());
                }
            }
            entry.apply(&mut slot, LifecycleEvent::StartUnload, None, &self.inner.events);
            // Set now or never: a pause needs the model loaded.
            (slot.phase.scheduler().cloned(), slot.phase.pause().is_some())
        };
        tracing::info!(model = %entry.config.name, ?cause, "unloading");
        // Requests that triggered the load are admitted first, unless the model is paused:
        // a paused model admits nothing, so they are refused with the rest of its queue
        // (waiting for them would hold the load lane until someone resumes the model).
        if !paused {
            self.inner.control.unpinned(entry.position).await;
        }
        if let Some(scheduler) = &scheduler {
            scheduler.close(AdmissionError::ModelUnloading);
            scheduler.drained().await;
            let release = self.before_release(entry).await;
            for runtime in scheduler.runtimes() {
                runtime.unload().await;
            }
            if let Some(release) = release {
                self.expect_release(release);
            }
        }
        let mut slot = entry.lock();
        slot.phase = Phase::Down;
        slot.load_override = LoadOverride::default();
        slot.effective = Arc::clone(&entry.config);
        slot.replicas = entry.config.replicas;
        entry.apply(&mut slot, LifecycleEvent::UnloadCompleted, None, &self.inner.events);
        drop(slot);
        Events::bump(&self.inner.events.unloads);
        true
    }

    /// Marks a model failed after its runtime crashed, refuses its queued requests, and
    /// tears its runtimes down once running requests have ended. Reports about runtimes of
    /// an earlier load (`generation`) are ignored.
    pub(crate) fn crashed(&self, entry: &Arc<ModelEntry>, generation: u64, reason: &str) {
        let scheduler = {
            let mut slot = entry.lock();
            if slot.lifecycle.state() != ModelState::Loaded || slot.generation != generation {
                return;
            }
            let message = format!("backend crashed: {}", crate::journal::bounded(reason));
            let down = std::mem::replace(&mut slot.phase, Phase::Down);
            let event = LifecycleEvent::Crashed;
            entry.apply(&mut slot, event, Some(message.clone()), &self.inner.events);
            let crashed = crate::FailureKind::Crashed;
            self.inner.control.failed(entry.position, crashed, message.clone());
            let scheduler = match down {
                Phase::Up(serving) => Some(serving.scheduler),
                _ => None,
            };
            if let Some(s) = &scheduler {
                s.close(AdmissionError::ModelFailed { last_error: message });
            }
            scheduler
        };
        Events::bump(&self.inner.events.crashes);
        tracing::error!(model = %entry.config.name, reason, "backend crashed; model marked failed");
        if let Some(scheduler) = scheduler {
            let entry = Arc::clone(entry);
            let control = self.inner.control.clone();
            tokio::spawn(async move {
                let _runtimes = control.destroy(entry.position).await;
                scheduler.drained().await;
                for runtime in scheduler.runtimes() {
                    runtime.unload().await;
                }
            });
        }
    }
}
