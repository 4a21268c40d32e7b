//! Loads, reloads, unloads, eviction and crash handling: every operation that creates or
//! destroys a model's runtimes.
//!
//! Loads and reloads wait their turn in the one load lane; eviction is planned when
//! a load leaves the queue (`hangar-eviction`) and executed as graceful unloads. Each
//! operation runs in its own task, so a caller that goes away cannot strand a model
//! half-way. The control loop gives one holder at a time a model's runtimes to create or
//! destroy.

use std::num::NonZeroU32;
use std::sync::Arc;

use hangar_backend::{CrashSink, LoadError, LoadRequest, ProgressSink, Runtime};
use hangar_config::ModelConfig;
use hangar_config::{LoadOverride, validate_load_override};
use hangar_lifecycle::{AdmissionError, ModelState, Scheduler, effective_target};

use crate::control::{Apply, Change, GrantAsk, Handoff, LoadFailed};
use crate::entry::{ModelEntry, Slot};
use crate::error::ManagerError;
use crate::events::Events;
use crate::evict::{Created, Creation, incoming};
use crate::grant::Ask;
use crate::manager::{LoadOptions, Manager};
use crate::outcome::{self, EngineFailure, Outcome, OutcomeRx, OutcomeTx};
use crate::phase::{Phase, Serving};
use crate::snapshot::{ModelSnapshot, snapshot_of};

/// Load options checked against the model: what a load would run with.
struct Prepared {
    effective: Arc<ModelConfig>,
    load_override: LoadOverride,
    replicas: NonZeroU32,
    /// Whether the options named the replicas (else they are the configured count).
    replicas_given: bool,
}

impl Prepared {
    /// The configured definition, without overrides.
    fn configured(config: &Arc<ModelConfig>) -> Self {
        Self {
            effective: Arc::clone(config),
            load_override: LoadOverride::default(),
            replicas: config.replicas,
            replicas_given: false,
        }
    }

    /// Whether the slot's current (or in-progress) load runs with these options: the same
    /// overrides, and the same replicas when the options name them.
    fn same_as(&self, slot: &Slot) -> bool {
        self.load_override == slot.load_override
            && (!self.replicas_given || self.replicas == slot.replicas)
    }
}

impl Manager {
    /// Loads a configured model, evicting others as the policy says, and answers when it is
    /// loaded or failed (the admin API's rule).
    ///
    /// A load without options of a model already loaded (or loading) answers with its
    /// current state (waiting for a load in progress). An explicit load lifts the model's
    /// quarantine. Options for a model that is loaded or loading are refused: replicas and
    /// overrides change only while it is unloaded or failed (or through
    /// [`Manager::reload`]). A model whose backend is not compiled in fails at once, before
    /// anything is evicted.
    ///
    /// # Errors
    /// `unknown_model`; [`ManagerError::InvalidLoadSchema`] / [`ManagerError::InvalidLoadRequest`]
    /// for bad options (nothing changes); [`ManagerError::Conflict`] for state conflicts;
    /// [`ManagerError::LoadFailed`] when the load ran and failed.
    pub async fn load(
        &self,
        name: &str,
        options: LoadOptions,
    ) -> Result<ModelSnapshot, ManagerError> {
        self.load_with(name, options, false, Trigger::Explicit).await
    }

    /// Like [`Manager::load`], but idempotent for options too (the multi-model API's rule):
    /// a model loaded or loading with exactly these options answers with its state; only
    /// other options are refused.
    ///
    /// # Errors
    /// As [`Manager::load`].
    pub async fn ensure_loaded(
        &self,
        name: &str,
        options: LoadOptions,
    ) -> Result<ModelSnapshot, ManagerError> {
        self.load_with(name, options, true, Trigger::Explicit).await
    }

    /// A load on demand (a request's auto-load, a lease): refused with
    /// [`ManagerError::Quarantined`] while the model is quarantined.
    pub(crate) async fn load_on_demand(&self, name: &str) -> Result<ModelSnapshot, ManagerError> {
        self.load_with(name, LoadOptions::default(), false, Trigger::OnDemand).await
    }

    pub(crate) async fn load_with(
        &self,
        name: &str,
        options: LoadOptions,
        same_is_ok: bool,
        trigger: Trigger,
    ) -> Result<ModelSnapshot, ManagerError> {
        // A changed definition waiting for this load takes effect first.
        let entry = self.current_entry(name).await?;
        if let Some(problem) = &entry.problem {
            let snapshot = Box::new(snapshot_of(&entry, &entry.lock()));
            let message = format!("the model's definition does not hold: {problem}");
            return Err(ManagerError::LoadFailed { message, snapshot });
        }
        let prepared =
            if options.is_empty() { None } else { Some(prepare(&entry.config, &options)?) };
        // Answers that change nothing come at once; a load to start or to wait for takes
        // the admin turn first, and the state is checked again in it.
        match next_step(&entry, prepared.as_ref(), same_is_ok)? {
            Next::Answer(answer) => return Ok(*answer),
            // A load in progress is joined: its outcome is this call's answer too.
            Next::Wait(rx) => return outcome::answer(&entry, rx).await,
            Next::Start => {}
        }
        // Nothing that holds the turn waits for this call (the pin of the request it may be
        // for): a reload or weight update holding it keeps the model held (`replacing`), so
        // no eviction waits for that pin; an explicit unload waits for pins only when the
        // model is loaded, and it asked for its (FIFO) turn after the model was loaded, so
        // after any request that pinned the model (which happens only while it is not).
        let admin = self.admin_turn(&entry).await?;
        let rx = match next_step(&entry, prepared.as_ref(), same_is_ok)? {
            Next::Answer(answer) => return Ok(*answer),
            Next::Wait(rx) => rx,
            Next::Start => {
                // The loop's quarantine rule: an explicit load lifts it, one on demand is
                // refused while it lasts.
                let explicit = !matches!(trigger, Trigger::OnDemand);
                let may = self.inner.control.may_load(entry.position, explicit).await;
                let gpu = entry.config.device.contains(hangar_config::Device::GPU);
                may.map_err(|refused| refused.into_error(entry.config.name.as_str(), gpu))?;
                if !matches!(trigger, Trigger::StartUp) {
                    entry.start_up.loading();
                }
                let p = prepared.unwrap_or_else(|| Prepared::configured(&entry.config));
                let (tx, rx) = outcome::channel();
                let loading = rx.clone();
                let apply = Apply::new(move |slot| {
                    slot.effective = p.effective;
                    slot.load_override = p.load_override;
                    slot.replicas = p.replicas;
                    slot.phase = Phase::Loading { progress: 0.0, outcome: loading };
                });
                // The turn goes with the load, which starts and runs to its end even if
                // this caller leaves. (Under the turn the model stays unloaded or failed
                // until the loop moves it: a refusal cannot happen, and would end the load
                // without an outcome.)
                let (this, e) = (self.clone(), Arc::clone(&entry));
                tokio::spawn(async move {
                    let _admin = admin;
                    let control = &this.inner.control;
                    if control.change(e.position, Change::StartLoad, apply).await.is_ok() {
                        this.run_load(e, tx, trigger).await;
                    }
                });
                rx
            }
        };
        if self.inner.idle_configured.load(std::sync::atomic::Ordering::SeqCst) {
            self.start_housekeeping();
        }
        outcome::answer(&entry, rx).await
    }

    /// Loads a model with `options`, replacing its runtimes if it is loaded (Triton's
    /// reload): the options are checked first, new runtimes are loaded while the old ones
    /// keep serving, and requests move to the new ones only once every replica loaded. The
    /// old runtimes finish their running and queued requests, then are released. When the
    /// new load fails, the old runtimes keep serving and nothing changes. An unloaded or
    /// failed model is simply loaded.
    ///
    /// A reload briefly holds both generations of runtimes: on a GPU, their memory twice,
    /// so the new ones are granted like a load (a second copy: memory, no slot), the model
    /// held meanwhile. A pause set on the model stays; requests still queued on the old
    /// runtimes when they close move to the new ones.
    ///
    /// # Errors
    /// As [`Manager::load`]; [`ManagerError::LoadFailed`] with the old runtimes serving
    /// when the new ones fail to load; [`ManagerError::InsufficientVram`] /
    /// [`ManagerError::SlotsPinned`] / [`ManagerError::MemoryNotKnown`] when the grant
    /// refuses the new runtimes (nothing changes).
    pub async fn reload(
        &self,
        name: &str,
        options: LoadOptions,
    ) -> Result<ModelSnapshot, ManagerError> {
        let entry = self.entry(name)?;
        let prepared = prepare(&entry.config, &options)?;
        let admin = self.admin_turn(&entry).await?;
        let state = entry.lock().lifecycle.state();
        match state {
            ModelState::Loaded => {}
            ModelState::Unloaded | ModelState::Failed => {
                drop(admin);
                return self.load(name, options).await;
            }
            state @ (ModelState::Loading | ModelState::Unloading) => {
                return Err(ManagerError::Conflict {
                    state,
                    message: format!("the model is {state}; reload it once it is loaded"),
                });
            }
        }
        let (this, e) = (self.clone(), Arc::clone(&entry));
        let reload = async move {
            let _admin = admin;
            this.run_reload(e, prepared).await
        };
        match tokio::spawn(reload).await {
            Ok(result) => result,
            Err(_) => Err(ManagerError::LoadFailed {
                message: "reload failed: the reload task panicked".into(),
                snapshot: Box::new(self.model(name)?),
            }),
        }
    }

    /// The load itself, once accepted: waits its turn in the load lane, evicts,
    /// loads every replica (all or nothing), and retries once after evicting everything
    /// else when a failure other than not-found happens. A backend that is not compiled in,
    /// or whose preflight fails (a missing Python package), fails before anything is evicted.
    async fn run_load(&self, entry: Arc<ModelEntry>, done: OutcomeTx, trigger: Trigger) {
        let lane = self.enter_lane(&entry).await;
        ModelEntry::touch(&mut entry.lock());
        let creation = {
            let slot = entry.lock();
            Creation {
                model: Arc::clone(&slot.effective),
                replicas: slot.replicas.get(),
                load_override: slot.load_override.clone(),
                ask: Ask::Load,
                measure: true,
                spare_enabled: matches!(trigger, Trigger::StartUp),
            }
        };
        let result = lane.create(&creation).await;
        let name = entry.config.name.as_str();
        let queue = self.inner.max_queue_depth;
        let (failed, outcome, apply) = match result {
            Ok(created) => {
                // Installed by the loop as it moves the model to loaded (a move the table
                // always allows from loading, which nothing else leaves).
                let install = Apply::new(move |slot| drop(install(slot, created, queue)));
                (None, Outcome::Loaded, install)
            }
            Err(outcome) => {
                let message = outcome.message(name).unwrap_or_default();
                // Held models or a full GPU in the way are not the model's failure.
                let counts = matches!(outcome, Outcome::Failed(_));
                let exhausted = matches!(&outcome, Outcome::Failed(f) if f.exhausted);
                let failed = LoadFailed { message, counts, exhausted };
                (Some(failed), outcome, Apply::new(|slot| slot.phase = Phase::Down))
            }
        };
        // The failure (and a quarantine it begins) is published before anyone hears of it.
        let moved = self.inner.control.change(entry.position, Change::LoadDone { failed }, apply);
        if moved.await.is_ok() {
            match outcome {
                Outcome::Loaded => {
                    Events::bump(&self.inner.events.loads);
                    *self.inner.last_loaded.lock().unwrap_or_else(|e| e.into_inner()) =
                        Some(entry.config.name.clone());
                }
                _ => Events::bump(&self.inner.events.load_failures),
            }
        }
        done.send_replace(Some(outcome));
    }

    /// Loads the replicas; after a failure that eviction may cure (the engine's own, not a
    /// missing artifact, Hangar's refusal or a taken port), evicts every other model on its
    /// devices and tries once more — unless that was done for nothing already
    /// (`control/step/exhaust.rs`: the grant then evicts nothing).
    pub(crate) async fn load_with_retry(
        &self,
        entry: &Arc<ModelEntry>,
        c: &Creation,
        gpus: &[u32],
    ) -> Result<Vec<Arc<dyn Runtime>>, EngineFailure> {
        let (model, replicas) = (&c.model, c.replicas);
        let first = match self.load_replicas(entry, model, replicas, gpus).await {
            Ok(runtimes) => return Ok(runtimes),
            Err(e) if !e.eviction_may_help() => return Err(e.into()),
            Err(e) => e,
        };
        let incoming = incoming(entry);
        let loaded = self.loaded_models(c.spare_enabled);
        let ask = GrantAsk { ask: Ask::Retry, loaded, incoming, places: None, host: None };
        match self.inner.control.grant(entry.position, ask).await {
            Ok(grant) if !grant.plan.is_empty() => {
                tracing::warn!(model = %entry.config.name, error = %first, "load failed; evicting every other model on its devices and retrying once");
                // A model leased meanwhile stays; the retry goes ahead without its room.
                let _ = self.execute(grant.plan, &entry.config.name).await;
                self.load_replicas(entry, model, replicas, gpus).await.map_err(|second| {
                    let exhausted = second.eviction_may_help();
                    EngineFailure { first, retry: Some(second), exhausted }
                })
            }
            // Nothing (more) to evict: the engine failed with all the room there is.
            Ok(_) => Err(EngineFailure { first, retry: None, exhausted: true }),
            Err(_) => Err(first.into()),
        }
    }

    /// The reload of a loaded model, in the load lane: make room for the new runtimes next
    /// to the old ones (the model held meanwhile), load them, swap them in (the pause set
    /// stays), then drain and release the old ones in the background.
    async fn run_reload(
        &self,
        entry: Arc<ModelEntry>,
        prepared: Prepared,
    ) -> Result<ModelSnapshot, ManagerError> {
        let _replacing = self.inner.control.replacing(entry.position).await;
        let lane = self.enter_lane(&entry).await;
        let failed = |message: String, entry: &ModelEntry| {
            let slot = entry.lock();
            ManagerError::LoadFailed {
                message: format!("reload failed; the previous runtime keeps serving: {message}"),
                snapshot: Box::new(snapshot_of(entry, &slot)),
            }
        };
        let state = entry.lock().lifecycle.state();
        if state != ModelState::Loaded {
            return Err(ManagerError::Conflict {
                state,
                message: format!("the model is {state}; reload it once it is loaded"),
            });
        }
        let creation = Creation {
            model: Arc::clone(&prepared.effective),
            replicas: prepared.replicas.get(),
            load_override: prepared.load_override.clone(),
            ask: Ask::SecondCopy,
            measure: true,
            spare_enabled: false,
        };
        let created = match lane.create(&creation).await {
            Ok(created) => created,
            Err(Outcome::Refused(refusal)) => {
                return Err(refusal.into_error(entry.config.name.as_str()));
            }
            Err(outcome) => {
                let message = outcome.message(entry.config.name.as_str()).unwrap_or_default();
                Events::bump(&self.inner.events.load_failures);
                tracing::warn!(model = %entry.config.name, error = %message, "reload failed; the previous runtime keeps serving");
                return Err(failed(message, &entry));
            }
        };
        let (new, old) = (Handoff::new(Some(created)), Handoff::new(None));
        let (taken, replaced, queue) = (new.clone(), old.clone(), self.inner.max_queue_depth);
        let apply = Apply::new(move |slot| {
            let Some(created) = taken.take() else { return };
            slot.effective = prepared.effective;
            slot.load_override = prepared.load_override;
            slot.replicas = prepared.replicas;
            let old = install(slot, created, queue);
            // The operator's pause holds the new runtimes too.
            if let (Some(pause), Some(new)) = (old.pause(), slot.phase.serving_mut()) {
                new.scheduler.pause();
                new.pause = Some(pause.clone());
            }
            if let Some(scheduler) = old.scheduler() {
                replaced.put(scheduler.clone());
            }
        });
        if self.inner.control.change(entry.position, Change::Reload, apply).await.is_err() {
            // The old runtime crashed while the new one loaded: keep the failure.
            for runtime in new.take().map(|c| c.runtimes).unwrap_or_default() {
                runtime.unload().await;
            }
            return Err(failed("the running runtime failed meanwhile".into(), &entry));
        }
        let old = old.take();
        let snapshot = snapshot_of(&entry, &entry.lock());
        Events::bump(&self.inner.events.loads);
        drop(lane);
        if let Some(old) = old {
            let (control, position) = (self.inner.control.clone(), entry.position);
            tokio::spawn(async move {
                let _runtimes = control.destroy(position).await;
                old.drained().await;
                old.close(AdmissionError::ModelUnloading);
                for runtime in old.runtimes() {
                    runtime.unload().await;
                }
            });
        }
        Ok(snapshot)
    }

    /// Loads `replicas` replicas of `model` on `gpus` (empty: no placement); on any failure
    /// unloads the ones already loaded.
    pub(crate) async fn load_replicas(
        &self,
        entry: &Arc<ModelEntry>,
        model: &Arc<ModelConfig>,
        replicas: u32,
        gpus: &[u32],
    ) -> Result<Vec<Arc<dyn Runtime>>, LoadError> {
        let backend = self
            .inner
            .backends
            .get(model.backend)
            .cloned()
            .ok_or(LoadError::BackendUnavailable { kind: model.backend })?;
        let mut runtimes: Vec<Arc<dyn Runtime>> = Vec::with_capacity(replicas as usize);
        // Loads of one model are serialized: these runtimes are installed as the next one.
        let generation = entry.lock().generation + 1;
        // The progress last journaled, over every replica of this load.
        let journaled = Arc::new(std::sync::Mutex::new(None));
        for replica in 0..replicas {
            let progress_entry = Arc::clone(entry);
            let (manager, journaled) = (Arc::downgrade(&self.inner), Arc::clone(&journaled));
            let progress = ProgressSink::new(move |p| {
                let share = (replica as f32 + p) / replicas as f32;
                if let Phase::Loading { progress, .. } = &mut progress_entry.lock().phase {
                    *progress = share;
                }
                if let Some(inner) = manager.upgrade() {
                    let mut last = journaled.lock().unwrap_or_else(|e| e.into_inner());
                    let name = &progress_entry.config.name;
                    *last = inner.events.journal.progress(name, *last, share);
                }
            });
            let (manager, crashed) = (Arc::downgrade(&self.inner), Arc::downgrade(entry));
            let crash = CrashSink::new(move |reason| {
                if let (Some(inner), Some(entry)) = (manager.upgrade(), crashed.upgrade()) {
                    Manager { inner }.crashed(&entry, generation, &reason);
                }
            });
            let logs = entry.logs.clone();
            let model = Arc::clone(model);
            let gpus = gpus.to_vec();
            let prompt_cache = self.inner.prompt_cache.clone();
            let request =
                LoadRequest { model, replica, replicas, progress, crash, logs, gpus, prompt_cache };
            match backend.load(request).await {
                Ok(runtime) => runtimes.push(runtime),
                Err(e) => {
                    for runtime in runtimes {
                        runtime.unload().await;
                    }
                    return Err(e);
                }
            }
        }
        Ok(runtimes)
    }
}

/// Who asked for a load.
#[derive(Clone, Copy)]
pub(crate) enum Trigger {
    /// An operator's load (admin, multi-model, KServe, reload): lifts a quarantine.
    Explicit,
    /// A request's auto-load or a lease: refused while quarantined.
    OnDemand,
    /// Start-up's load of an enabled model: evicts no other enabled model.
    StartUp,
}

/// What a load does given the model's state.
enum Next {
    /// Answer with this snapshot: nothing to do.
    Answer(Box<ModelSnapshot>),
    /// Join the load in progress: its outcome.
    Wait(OutcomeRx),
    /// Start a load.
    Start,
}

/// The load rules: a model loaded or loading with the same options (no options are the
/// same as any) is answered or waited for; other options for a loaded model are invalid, for
/// a loading one a conflict; an unloading model conflicts; an unloaded or failed one loads.
fn next_step(
    entry: &ModelEntry,
    prepared: Option<&Prepared>,
    same_is_ok: bool,
) -> Result<Next, ManagerError> {
    let slot = entry.lock();
    let same = prepared.is_none_or(|p| same_is_ok && p.same_as(&slot));
    match slot.lifecycle.state() {
        ModelState::Loaded if same => Ok(Next::Answer(Box::new(snapshot_of(entry, &slot)))),
        ModelState::Loaded => Err(ManagerError::InvalidLoadRequest {
            field: None,
            message: "the model is loaded; unload it before changing replicas or overrides".into(),
        }),
        ModelState::Loading if same => match &slot.phase {
            Phase::Loading { outcome, .. } => Ok(Next::Wait(outcome.clone())),
            _ => Err(ManagerError::Conflict {
                state: ModelState::Loading,
                message: "the model is loading without an outcome to wait for".into(),
            }),
        },
        ModelState::Loading => Err(ManagerError::Conflict {
            state: ModelState::Loading,
            message: "the model is already loading with other options".into(),
        }),
        ModelState::Unloading => Err(ManagerError::Conflict {
            state: ModelState::Unloading,
            message: "the model is unloading; load it again once it is unloaded".into(),
        }),
        ModelState::Unloaded | ModelState::Failed => Ok(Next::Start),
    }
}

/// Checks load options against the model's backend and limits, without touching state.
fn prepare(config: &Arc<ModelConfig>, options: &LoadOptions) -> Result<Prepared, ManagerError> {
    let replicas = options.replicas.unwrap_or(config.replicas);
    if replicas > config.replica_max {
        return Err(ManagerError::InvalidLoadRequest {
            field: Some("replicas".into()),
            message: format!("must be <= replica_max ({})", config.replica_max),
        });
    }
    let mut load_override = validate_load_override(config, &options.overrides)?;
    load_override.extend_engine_fields(options.engine_fields.clone());
    let effective = if load_override.is_empty() {
        Arc::clone(config)
    } else {
        Arc::new(load_override.apply(config)?)
    };
    Ok(Prepared { effective, load_override, replicas, replicas_given: options.replicas.is_some() })
}

/// Puts freshly loaded runtimes behind a new scheduler (of `max_queue` waiting requests) in
/// the slot, unpaused, and returns the phase they replace. The loop sets the generation.
fn install(slot: &mut Slot, created: Created, max_queue: usize) -> Phase {
    let Created { runtimes, placement, host } = created;
    slot.placement = placement;
    slot.host = host;
    slot.sleep_freed_mib = None;
    let caps = runtimes.first().map(|r| r.capabilities().clone()).unwrap_or_default();
    let target = effective_target(slot.effective.target_inflight, caps.max_parallel_sequences);
    let details = runtimes.iter().map(|r| r.details()).collect();
    let scheduler = Scheduler::new(runtimes, target, max_queue).dispatch_ahead(caps.dispatch_ahead);
    slot.capabilities = Arc::new(caps);
    ModelEntry::touch(slot);
    let serving = Serving { scheduler, details, pause: None, weight_version: None, asleep: None };
    std::mem::replace(&mut slot.phase, Phase::Up(serving))
}
