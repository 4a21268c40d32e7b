//! Weight control of a loaded model: updating its weights from disk without unloading it,
//! and the weights checker (strict per-tensor SHA-256 digests of the files it runs on).
//!
//! An update pauses the model, loads the new weights next to the old ones, swaps them in
//! behind the same queue and releases the old ones; when the new weights fail to load, the
//! old ones keep serving and the pause is undone — the model is never left without weights.
//! Loading both at once costs the model's memory twice for the length of the load.

use std::sync::Arc;

use hangar_backend::Runtime;
use hangar_lifecycle::ModelState;
use hangar_weights::{Comparison, WeightsDigest};
use serde::{Deserialize, Serialize};

use crate::control::{Apply, Change, Handoff};
use crate::entry::ModelEntry;
use crate::error::ManagerError;
use crate::events::Events;
use crate::evict::Creation;
use crate::grant::Ask;
use crate::journal::EventKind;
use crate::manager::Manager;
use crate::outcome::Outcome;
use crate::pause::{PauseCause, PauseMode, Paused, not_loaded};
use crate::snapshot::{ModelSnapshot, snapshot_of};

/// A model's runtimes, one per replica.
type Runtimes = Vec<Arc<dyn Runtime>>;

/// What a weight update asks for (SGLang's `update_weights_from_disk` body).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WeightUpdate {
    /// The new weights; `None`: the model's configured `model_path` again.
    pub model_path: Option<String>,
    /// Abort running and queued requests instead of refusing while requests run.
    pub abort_all_requests: bool,
    /// Stay paused after the update (continue later).
    pub keep_pause: bool,
    /// The version label the model shows once the update succeeded; `None` keeps it.
    pub weight_version: Option<String>,
}

/// What the weights checker does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WeightsAction {
    /// Digest every tensor of the weights the model runs on.
    Checksum,
    /// Digest and remember the result for `compare`.
    Snapshot,
    /// Digest and report which tensors differ from the snapshot.
    Compare,
    /// Refused: Hangar never changes weights in place.
    ResetTensors,
}

/// The weights checker's answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WeightsReport {
    /// The action that ran.
    pub action: WeightsAction,
    /// The digests of the weights as they are on disk now.
    pub digest: WeightsDigest,
    /// For `compare`: the differences from the snapshot.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub comparison: Option<Comparison>,
    /// How long reading and hashing took, milliseconds.
    pub elapsed_ms: u64,
}

impl Manager {
    /// Replaces a loaded model's weights with those at `update.model_path` (see the module
    /// docs). Requests queued during the update run on the new weights.
    ///
    /// # Errors
    /// `unknown_model`; [`ManagerError::Conflict`] for a model that is not loaded;
    /// [`ManagerError::RequestsActive`] while requests run, unless `abort_all_requests` or the
    /// model is paused with `retract`; [`ManagerError::LoadFailed`] with the old weights
    /// serving; [`ManagerError::InsufficientVram`] / [`ManagerError::SlotsPinned`] /
    /// [`ManagerError::MemoryNotKnown`] when the grant refuses the new weights (a second
    /// copy), the old ones serving; a
    /// [`ManagerError::Conflict`] when the model stopped serving during the update (the new
    /// weights are released); [`ManagerError::AdminBusy`].
    pub async fn update_weights_from_disk(
        &self,
        name: &str,
        update: WeightUpdate,
    ) -> Result<ModelSnapshot, ManagerError> {
        let entry = self.entry(name)?;
        if update.model_path.as_deref().is_some_and(|p| p.trim().is_empty()) {
            return Err(ManagerError::InvalidLoadRequest {
                field: Some("model_path".into()),
                message: "must not be empty".into(),
            });
        }
        let admin = self.admin_turn(&entry).await?;
        let (this, e) = (self.clone(), Arc::clone(&entry));
        // Run to its end even if the caller goes away: a half-done update would leave the
        // model paused.
        let run = tokio::spawn(async move {
            let _admin = admin;
            this.run_update(&e, update).await
        });
        match run.await {
            Ok(result) => result,
            Err(_) => Err(ManagerError::LoadFailed {
                message: "weight update failed: the update task panicked".into(),
                snapshot: Box::new(self.model(name)?),
            }),
        }
    }

    async fn run_update(
        &self,
        entry: &Arc<ModelEntry>,
        update: WeightUpdate,
    ) -> Result<ModelSnapshot, ManagerError> {
        // Held from the start: no eviction takes the model while its weights are replaced.
        let _replacing = self.inner.control.replacing(entry.position).await;
        let (before, scheduler, effective) = {
            let slot = entry.lock();
            let scheduler = match (slot.phase.scheduler(), slot.lifecycle.state()) {
                (Some(s), ModelState::Loaded) => s.clone(),
                (_, state) => return Err(not_loaded(state, "a weight update")),
            };
            let running = scheduler.stats().runtime_inflight;
            let retracting = slot.phase.pause().is_some_and(|p| p.info.mode == PauseMode::Retract);
            if running > 0 && !update.abort_all_requests && !retracting {
                return Err(ManagerError::RequestsActive {
                    model: entry.config.name.to_string(),
                    running,
                });
            }
            (slot.phase.pause().cloned(), scheduler, Arc::clone(&slot.effective))
        };
        let mode = if update.abort_all_requests { PauseMode::Abort } else { PauseMode::InPlace };
        self.pause_entry(entry, mode, PauseCause::WeightUpdate).await?;
        scheduler.drained().await;

        let mut config = (*effective).clone();
        let model_path = update.model_path.clone().or_else(|| entry.config.model_path.clone());
        config.model_path.clone_from(&model_path);
        // `vllm serve` loads `vllm_model` before `model_path`: weights named by path are what
        // the new child loads, not the hub id it was started with.
        if update.model_path.is_some()
            && let hangar_config::BackendSettings::VllmServe { serve, .. } = &mut config.settings
        {
            serve.vllm_model = None;
        }
        let config = Arc::new(config);
        let lane = self.enter_lane(entry).await;
        let creation = {
            let slot = entry.lock();
            Creation {
                model: Arc::clone(&config),
                replicas: slot.replicas.get(),
                load_override: slot.load_override.clone(),
                ask: Ask::SecondCopy,
                // Other weights than the definition's: their memory is not its figure.
                measure: false,
                spare_enabled: false,
            }
        };
        // New weights go where the grant placed them; the row keeps the model's placement.
        let runtimes = match lane.create(&creation).await {
            Ok(created) => created.runtimes,
            Err(outcome) => {
                self.restore_pause(entry, before).await;
                let name = entry.config.name.as_str();
                let e = match outcome {
                    Outcome::Refused(refusal) => return Err(refusal.into_error(name)),
                    outcome => outcome.message(name).unwrap_or_default(),
                };
                Events::bump(&self.inner.events.load_failures);
                let message =
                    format!("weight update failed; the previous weights keep serving: {e}");
                tracing::warn!(model = %entry.config.name, error = %e, "weight update failed; the previous weights keep serving");
                let snapshot = Box::new(snapshot_of(entry, &entry.lock()));
                return Err(ManagerError::LoadFailed { message, snapshot });
            }
        };
        let old = match self.swap_weights(entry, runtimes, config, &update).await {
            Ok(old) => old,
            Err(new) => {
                // The model stopped serving (a crash, an unload-all) while the new weights
                // loaded.
                for runtime in new {
                    runtime.unload().await;
                }
                let state = entry.lock().lifecycle.state();
                return Err(ManagerError::Conflict {
                    state,
                    message: format!(
                        "the new weights could not be put in place (the model is {state}); they were released"
                    ),
                });
            }
        };
        drop(lane);
        for runtime in old {
            runtime.unload().await;
        }
        let pause = entry.lock().phase.pause().cloned();
        match pause {
            Some(mut pause) if update.keep_pause => {
                // Now the operator's pause: it lasts until they continue.
                pause.info.cause = PauseCause::Operator;
                self.set_pause(entry, pause).await;
            }
            _ => self.resume_entry(entry).await,
        }
        Ok(snapshot_of(entry, &entry.lock()))
    }

    /// Puts the new runtimes in place under the model's queue and returns the old ones to
    /// release; `Err` gives the new ones back when the model stopped being loaded meanwhile
    /// (an unload-all does not wait for the update; a crash) or its queue would not take
    /// them. The loop decides the swap (a new generation) with the model's state.
    async fn swap_weights(
        &self,
        entry: &ModelEntry,
        runtimes: Vec<Arc<dyn Runtime>>,
        config: Arc<hangar_config::ModelConfig>,
        update: &WeightUpdate,
    ) -> Result<Runtimes, Runtimes> {
        let swapped: Handoff<Result<Runtimes, Runtimes>> = Handoff::new(Some(Err(runtimes)));
        let (result, events) = (swapped.clone(), Arc::clone(&self.inner.events));
        let (name, weight_version) = (entry.config.name.clone(), update.weight_version.clone());
        let apply = Apply::new(move |slot| {
            let Some(Err(runtimes)) = result.take() else { return };
            let Some(serving) = slot.phase.serving_mut() else {
                return result.put(Err(runtimes));
            };
            let details: Arc<[_]> = runtimes.iter().map(|r| r.details()).collect();
            match serving.scheduler.replace_runtimes(runtimes) {
                Ok(old) => {
                    serving.details = details;
                    // The new runtimes are awake (the loop's move says the same).
                    serving.asleep = None;
                    if weight_version.is_some() {
                        serving.weight_version = weight_version;
                    }
                    let weight_version = serving.weight_version.clone();
                    slot.effective = config;
                    ModelEntry::touch(slot);
                    let kind = EventKind::WeightsUpdated {
                        model_path: slot.effective.model_path.clone().unwrap_or_default(),
                        weight_version,
                    };
                    events.journal.record(&name, kind);
                    Events::bump(&events.loads);
                    result.put(Ok(old));
                }
                // Not while requests run or with another replica count: the update paused
                // and drained the queue and holds the admin turn, so this is a guard, not a
                // path (the generation would then be one ahead of the runtimes serving).
                Err(runtimes) => result.put(Err(runtimes)),
            }
        });
        let _ = self.inner.control.change(entry.position, Change::Swap, apply).await;
        swapped.take().unwrap_or(Ok(Vec::new()))
    }

    /// Runs the weights checker on the files a model runs on (or, unloaded, the files its
    /// config names). A loaded model admits nothing while its files are read (requests
    /// wait, running ones go on); the reading runs off the async threads.
    ///
    /// # Errors
    /// `unknown_model`; [`ManagerError::NotImplemented`] for `reset_tensors`;
    /// [`ManagerError::Weights`] when there is nothing to read or the files cannot be parsed,
    /// or for `compare` without a snapshot; [`ManagerError::AdminBusy`].
    pub async fn check_weights(
        &self,
        name: &str,
        action: WeightsAction,
    ) -> Result<WeightsReport, ManagerError> {
        self.check_weights_with(name, action, true).await
    }

    /// [`Self::check_weights`] for callers that may change nothing (the checker's `GET`
    /// form): it never pauses the model. Only `checksum` and `compare` read without
    /// writing; refusing `snapshot` (which stores a digest) is the caller's part.
    ///
    /// # Errors
    /// As [`Self::check_weights`]; [`ManagerError::WouldPause`] when the model is loaded
    /// and not paused, so the check would hold its requests.
    pub async fn check_weights_read_only(
        &self,
        name: &str,
        action: WeightsAction,
    ) -> Result<WeightsReport, ManagerError> {
        self.check_weights_with(name, action, false).await
    }

    async fn check_weights_with(
        &self,
        name: &str,
        action: WeightsAction,
        may_pause: bool,
    ) -> Result<WeightsReport, ManagerError> {
        let entry = self.entry(name)?;
        if action == WeightsAction::ResetTensors {
            return Err(ManagerError::NotImplemented {
                message: "reset_tensors is refused: Hangar never changes loaded weights in place; use update-weights-from-disk or reload the model".into(),
            });
        }
        if action == WeightsAction::Compare && entry.lock().weights_snapshot.is_none() {
            return Err(ManagerError::Weights {
                message: format!(
                    "model '{name}' has no weights snapshot; run the snapshot action first"
                ),
            });
        }
        let admin = self.admin_turn(&entry).await?;
        // Runs to its end even if the caller goes away: a pause taken for the reading is
        // always undone.
        let this = self.clone();
        let task = tokio::spawn(async move {
            let _admin = admin;
            this.run_check(&entry, action, may_pause).await
        });
        task.await.unwrap_or_else(|e| {
            Err(ManagerError::Weights { message: format!("the weights check failed: {e}") })
        })
    }

    async fn run_check(
        &self,
        entry: &Arc<ModelEntry>,
        action: WeightsAction,
        may_pause: bool,
    ) -> Result<WeightsReport, ManagerError> {
        let name = entry.config.name.as_str();
        let (path, before, loaded) = {
            let slot = entry.lock();
            let loaded = slot.lifecycle.state() == ModelState::Loaded;
            let path = if loaded { slot.effective.model_path.clone() } else { None };
            (path.or_else(|| entry.config.model_path.clone()), slot.phase.pause().cloned(), loaded)
        };
        let Some(path) = path else {
            return Err(ManagerError::Weights {
                message: format!("model '{name}' has no local weights (no model_path) to check"),
            });
        };
        let holds = loaded && before.is_none();
        if holds && !may_pause {
            let action = if action == WeightsAction::Compare { "compare" } else { "checksum" };
            return Err(ManagerError::WouldPause { model: name.to_owned(), action });
        }
        if holds {
            self.pause_entry(entry, PauseMode::InPlace, PauseCause::Checksum).await?;
        }
        let started = std::time::Instant::now();
        let digest = tokio::task::spawn_blocking(move || hangar_weights::digest(path.as_ref()))
            .await
            .map_err(|e| ManagerError::Weights { message: format!("digest task failed: {e}") });
        if holds {
            self.restore_pause(entry, None::<Paused>).await;
        }
        let digest = digest?.map_err(|e| ManagerError::Weights { message: e.to_string() })?;
        let elapsed_ms = started.elapsed().as_millis() as u64;
        let mut slot = entry.lock();
        let comparison = match action {
            WeightsAction::Snapshot => {
                slot.weights_snapshot = Some(Arc::new(digest.clone()));
                None
            }
            WeightsAction::Compare => slot
                .weights_snapshot
                .as_ref()
                .map(|snapshot| hangar_weights::compare(snapshot, &digest)),
            _ => None,
        };
        Ok(WeightsReport { action, digest, comparison, elapsed_ms })
    }
}
