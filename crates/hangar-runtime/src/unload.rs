//! Unloads and crash handling: the graceful unload (stop admissions, wait for pinned
//! requests, cancel queued requests, drain running ones, release the runtimes), unload-all,
//! and a crashed runtime's teardown.

use std::sync::Arc;

use hangar_config::LoadOverride;
use hangar_lifecycle::{AdmissionError, ModelState};

use crate::control::{Apply, Change, Handoff};
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
    /// Unloaded, unloading or failed: the current state, nothing changes. A model that a
    /// config reload or repository rescan removed answers with its state too (it is
    /// unloaded as it leaves).
    ///
    /// # Errors
    /// `unknown_model`; [`ManagerError::Conflict`] while the model is loading;
    /// [`ManagerError::AdminBusy`] when another admin operation holds the model too long.
    pub async fn unload(&self, name: &str) -> Result<ModelSnapshot, ManagerError> {
        self.unload_as(name, false).await
    }

    /// Unloads a model as [`Self::unload`] does, unless something holds it: its config
    /// pins it, or a lease (granted or being taken) does. Whether a lease holds it is
    /// read once the unload is decided in the control loop, which grants no lease from
    /// then on, so a lease taken just before always wins; no lease is revoked.
    ///
    /// # Errors
    /// [`ManagerError::Conflict`] when the model is pinned or leased, and
    /// [`Self::unload`]'s own errors.
    pub async fn unload_unless_held(&self, name: &str) -> Result<ModelSnapshot, ManagerError> {
        self.unload_as(name, true).await
    }

    async fn unload_as(
        &self,
        name: &str,
        unless_held: bool,
    ) -> Result<ModelSnapshot, ManagerError> {
        let entry = match self.entry(name) {
            Ok(entry) => entry,
            // A model a reload or rescan removed is being unloaded already (KServe's agent
            // deletes a model's folder, then asks for the unload): its state answers.
            Err(unknown) => {
                let every = self.inner.control.entries();
                let removed = every.iter().rev().find(|e| e.config.name.as_str() == name);
                let Some(removed) = removed else { return Err(unknown) };
                let slot = removed.lock();
                return Ok(snapshot_of(removed, &slot));
            }
        };
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
        if unless_held && entry.config.pinned {
            return Err(held(&entry.config.name, "pinned by its config"));
        }
        // Decided: from here no lease is granted until the unload is done (or given up).
        let decided = self.inner.control.unload_decided(entry.position);
        // The admin turn is the loop's answer after the decision: every lease taken before
        // it is published by now.
        let admin = self.admin_turn(&entry).await?;
        if let Some(answer) = check()? {
            return Ok(answer);
        }
        if unless_held {
            let now = tokio::time::Instant::now();
            let leased = entry.lock().leases.iter().any(|h| h.deadline > now);
            if leased {
                // Dropped, the decision ends without revoking anything.
                drop(decided);
                return Err(held(&entry.config.name, "leased"));
            }
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
        // Models a reload removed too, if one is still unloading.
        let every = self.inner.control.entries();
        for entry in &every {
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
        let position = |name: &String| every.iter().position(|e| e.config.name.as_str() == name);
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
        // Whether it may go (loaded; an eviction or idle unload only if nothing holds it) is
        // the loop's decision, taken with the move, so a lease taken before always wins.
        let announce = match &cause {
            UnloadCause::Request => None,
            UnloadCause::Eviction(announce) | UnloadCause::Idle(announce) => Some(announce.clone()),
        };
        let change = Change::StartUnload { evict: announce.is_some(), pinned: entry.config.pinned };
        let (events, name) = (Arc::clone(&self.inner.events), entry.config.name.clone());
        let serving = Handoff::new(None);
        let found = serving.clone();
        let apply = Apply::new(move |slot| {
            if let Some(announce) = announce {
                events.journal.record(&name, announce);
            }
            // Set now or never: a pause needs the model loaded.
            found.put((slot.phase.scheduler().cloned(), slot.phase.pause().is_some()));
        });
        if self.inner.control.change(entry.position, change, apply).await.is_err() {
            return false;
        }
        let (scheduler, paused) = serving.take().unwrap_or((None, false));
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
        let config = Arc::clone(&entry.config);
        let apply = Apply::new(move |slot| {
            slot.phase = Phase::Down;
            slot.placement = None;
            slot.host = None;
            slot.load_override = LoadOverride::default();
            slot.replicas = config.replicas;
            slot.effective = config;
        });
        let _ = self.inner.control.change(entry.position, Change::UnloadDone, apply).await;
        Events::bump(&self.inner.events.unloads);
        true
    }

    /// Marks a model failed after its runtime crashed, refuses its queued requests, and
    /// tears its runtimes down once running requests have ended. Reports about runtimes of
    /// an earlier load (`generation`) are ignored: the loop decides, with the move.
    pub(crate) fn crashed(&self, entry: &Arc<ModelEntry>, generation: u64, reason: &str) {
        let message = format!("backend crashed: {}", crate::journal::bounded(reason));
        self.fail_runtimes(entry, generation, message);
    }

    /// Marks a model failed with `message` (its runtimes of `generation` cannot serve: a
    /// crash, a failed wake), as [`Manager::crashed`] says.
    pub(crate) fn fail_runtimes(&self, entry: &Arc<ModelEntry>, generation: u64, message: String) {
        let reason = message.clone();
        let change = Change::Crash { generation, message: message.clone() };
        let (control, events) = (self.inner.control.clone(), Arc::clone(&self.inner.events));
        let (name, position) = (entry.config.name.clone(), entry.position);
        let (manager, failed) = (self.clone(), Arc::clone(entry));
        let apply = Apply::new(move |slot| {
            // Read while the placement says where the memory is.
            let to_release = crate::gpu::to_release(&failed, slot, true);
            let Phase::Up(serving) = std::mem::replace(&mut slot.phase, Phase::Down) else {
                // No runtimes to tear down: no GPU load waits for them.
                control.torn_down(position, Vec::new());
                return;
            };
            slot.placement = None;
            slot.host = None;
            let scheduler = serving.scheduler;
            scheduler.close(AdmissionError::ModelFailed { last_error: message });
            Events::bump(&events.crashes);
            tracing::error!(model = %name, reason, "runtimes cannot serve; model marked failed");
            tokio::spawn(async move {
                let _runtimes = control.destroy(position).await;
                scheduler.drained().await;
                let runtimes = scheduler.runtimes();
                // Engines still running (a woken engine that answered wrong, not a crash)
                // give their memory back as they stop: the next load on those GPUs waits
                // for it, as after an unload. A dead one's memory is gone already. Until
                // this says which, every GPU load waits (the model shows failed already).
                let mut alive = true;
                for runtime in &runtimes {
                    alive &= runtime.health().await.is_ok();
                }
                let release = match to_release.filter(|_| alive) {
                    Some(to_release) => manager.releases(&failed, to_release).await,
                    None => None,
                };
                for runtime in runtimes {
                    runtime.unload().await;
                }
                // Every GPU load waits for this since the crash was decided.
                control.torn_down(position, release.unwrap_or_default());
            });
        });
        self.inner.control.post_change(entry.position, change, apply);
    }
}

/// The refusal of an unload that may not take a held model.
fn held(model: &hangar_config::ModelName, why: &str) -> ManagerError {
    ManagerError::Conflict {
        state: ModelState::Loaded,
        message: format!(
            "model '{model}' is {why}: this caller may not unload it; an admin-key holder can"
        ),
    }
}
