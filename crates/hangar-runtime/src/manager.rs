//! [`Manager`]: the registry of configured models and every operation on them.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::Arc;

use dashmap::DashMap;
use hangar_backend::{
    Backend, Capabilities, EmbedRequest, Embeddings, GenerateEvent, GenerateRequest,
    GenerateSummary, LoadError, LoadOverride, LoadRequest, ProgressSink, RerankRequest, Rerankings,
    Runtime, RuntimeError, load_constraints, load_recommendations, validate_load_override,
};
use hangar_config::{BackendKind, Config, MaxLoadedModels, ModelConfig, ModelName};
use hangar_eviction::{
    EvictionPlan, Incoming, LoadFailure, LoadedModel, plan_load, plan_retry_after_failure,
};
use hangar_lifecycle::{
    AdmissionError, LifecycleEvent, ModelState, Permit, Scheduler, admit, effective_target,
};
use serde_json::{Map, Value};
use tokio::sync::{broadcast, mpsc};
use tokio::time::Instant;

use crate::entry::{ModelEntry, Slot};
use crate::error::ManagerError;
use crate::events::{Events, ManagerCounters, StateChange};
use crate::snapshot::{ModelSnapshot, VramEstimateSource};

/// The engines a manager can load models with, by backend kind.
#[derive(Clone, Default)]
pub struct Backends(HashMap<BackendKind, Arc<dyn Backend>>);

impl Backends {
    /// No engines.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) the engine for `backend.kind()`.
    pub fn with(mut self, backend: Arc<dyn Backend>) -> Self {
        self.0.insert(backend.kind(), backend);
        self
    }

    fn get(&self, kind: BackendKind) -> Option<&Arc<dyn Backend>> {
        self.0.get(&kind)
    }
}

/// Options of one load: runtime-only, never written back to config.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoadOptions {
    /// Replicas for this load (at most `replica_max`); the configured count when `None`.
    pub replicas: Option<NonZeroU32>,
    /// Backend-specific override patch; key presence matters (`null` overrides).
    pub overrides: Map<String, Value>,
    /// Engine fields outside the admin API's override list, already validated by the
    /// caller (see `LoadOverride::extend_engine_fields`); empty for admin loads.
    pub engine_fields: Map<String, Value>,
}

impl LoadOptions {
    fn is_empty(&self) -> bool {
        self.replicas.is_none() && self.overrides.is_empty() && self.engine_fields.is_empty()
    }
}

/// The runtime manager: owns every configured model's runtime state and performs loads,
/// unloads, evictions and request admission. Cheap to clone; clones share state.
///
/// Loads are serialized through one queue; eviction is planned when a load leaves the
/// queue. A load request is answered when the model is loaded or failed.
#[derive(Clone)]
pub struct Manager {
    inner: Arc<Inner>,
}

struct Inner {
    models: DashMap<ModelName, Arc<ModelEntry>>,
    order: Vec<ModelName>,
    backends: Backends,
    limits: MaxLoadedModels,
    auto_load: bool,
    max_queue_depth: usize,
    load_queue: tokio::sync::Mutex<()>,
    events: Events,
    last_loaded: std::sync::Mutex<Option<ModelName>>,
}

/// An admitted request: holds one in-flight slot on one replica until dropped.
pub struct RequestGuard {
    permit: Permit<dyn Runtime>,
    entry: Arc<ModelEntry>,
    generation: u64,
    manager: Manager,
}

impl RequestGuard {
    /// The runtime the request runs on.
    pub fn runtime(&self) -> &Arc<dyn Runtime> {
        self.permit.runtime()
    }

    /// The replica index the request runs on.
    pub fn replica(&self) -> usize {
        self.permit.replica()
    }

    /// Passes a runtime result through, marking the model failed when the runtime crashed.
    ///
    /// # Errors
    /// The runtime's error, as a [`ManagerError::Runtime`].
    pub fn check<T>(&self, result: Result<T, RuntimeError>) -> Result<T, ManagerError> {
        if let Err(RuntimeError::Crashed { reason }) = &result {
            self.manager.crashed(&self.entry, self.generation, reason);
        }
        result.map_err(ManagerError::Runtime)
    }
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        ModelEntry::touch(&mut self.entry.lock());
    }
}

impl std::fmt::Debug for RequestGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestGuard")
            .field("model", &self.entry.config.name)
            .field("replica", &self.replica())
            .finish()
    }
}

/// Holds a model for a request that triggered its auto-load, so it cannot be evicted before
/// the request is admitted.
struct Pin(Arc<ModelEntry>);

impl Pin {
    fn new(entry: &Arc<ModelEntry>) -> Self {
        entry.lock().pins += 1;
        Self(Arc::clone(entry))
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        self.0.lock().pins -= 1;
        self.0.notify();
    }
}

/// Why a model is being unloaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum UnloadCause {
    Request,
    Eviction,
}

impl Manager {
    /// A manager for every model in `config`, loading them with `backends`. Nothing is
    /// loaded yet; see [`Manager::load_enabled`].
    pub fn new(config: &Config, backends: Backends) -> Self {
        let models = DashMap::new();
        let mut order = Vec::new();
        for model in &config.models {
            let capabilities = backends
                .get(model.backend)
                .map_or_else(Capabilities::default, |b| b.capabilities(model));
            order.push(model.name.clone());
            models
                .insert(model.name.clone(), Arc::new(ModelEntry::new(model.clone(), capabilities)));
        }
        Self {
            inner: Arc::new(Inner {
                models,
                order,
                backends,
                limits: config.max_loaded_models,
                auto_load: config.auto_load,
                max_queue_depth: config.max_queue_depth.get() as usize,
                load_queue: tokio::sync::Mutex::new(()),
                events: Events::new(),
                last_loaded: std::sync::Mutex::new(None),
            }),
        }
    }

    fn entry(&self, name: &str) -> Result<Arc<ModelEntry>, ManagerError> {
        self.inner
            .models
            .get(name)
            .map(|e| Arc::clone(e.value()))
            .ok_or_else(|| AdmissionError::UnknownModel { model: name.to_owned() }.into())
    }

    /// Every configured model, in config order.
    pub fn models(&self) -> Vec<ModelSnapshot> {
        self.inner.order.iter().filter_map(|n| self.model(n.as_str()).ok()).collect()
    }

    /// One model.
    ///
    /// # Errors
    /// `unknown_model`.
    pub fn model(&self, name: &str) -> Result<ModelSnapshot, ManagerError> {
        Ok(snapshot(&*self.entry(name)?))
    }

    /// The most recently loaded model still loaded, if any.
    pub fn last_loaded(&self) -> Option<ModelName> {
        let last = self.inner.last_loaded.lock().unwrap_or_else(|e| e.into_inner()).clone()?;
        let entry = self.inner.models.get(&last)?;
        (entry.lock().lifecycle.state() == ModelState::Loaded).then_some(last)
    }

    /// Lifetime counters (loads, failures, unloads, evictions, crashes).
    pub fn counters(&self) -> ManagerCounters {
        self.inner.events.counters()
    }

    /// Every state change from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<StateChange> {
        self.inner.events.subscribe()
    }

    /// Loads every model whose config says `enabled: true`, one after another, and returns
    /// each result.
    pub async fn load_enabled(&self) -> Vec<(ModelName, Result<ModelSnapshot, ManagerError>)> {
        let mut results = Vec::new();
        for name in &self.inner.order {
            let enabled = self.inner.models.get(name).is_some_and(|e| e.config.enabled);
            if enabled {
                results
                    .push((name.clone(), self.load(name.as_str(), LoadOptions::default()).await));
            }
        }
        results
    }

    /// Checks load options against a model's backend and limits without loading or changing
    /// anything: what [`Manager::load`] would reject as bad input, whatever the model's state.
    ///
    /// # Errors
    /// `unknown_model`, [`ManagerError::InvalidLoadSchema`], [`ManagerError::InvalidLoadRequest`].
    pub fn check_load_options(
        &self,
        name: &str,
        options: &LoadOptions,
    ) -> Result<(), ManagerError> {
        let entry = self.entry(name)?;
        if !options.is_empty() {
            prepare(&entry.config, options)?;
        }
        Ok(())
    }

    /// Loads a configured model, evicting others as the policy says, and answers when it is
    /// loaded or failed.
    ///
    /// Already loaded: the current state (options are refused). Already loading: waits for
    /// that load. Unloading: conflict.
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
        let entry = self.entry(name)?;
        let prepared =
            if options.is_empty() { None } else { Some(prepare(&entry.config, &options)?) };
        let start = {
            let mut slot = entry.lock();
            match slot.lifecycle.state() {
                ModelState::Loaded if prepared.is_some() => {
                    return Err(ManagerError::InvalidLoadRequest {
                        field: None,
                        message:
                            "the model is loaded; unload it before changing replicas or overrides"
                                .into(),
                    });
                }
                ModelState::Loaded => return Ok(snapshot_of(&entry, &slot)),
                ModelState::Loading if prepared.is_some() => {
                    return Err(ManagerError::Conflict {
                        state: ModelState::Loading,
                        message: "the model is already loading with other options".into(),
                    });
                }
                ModelState::Loading => false,
                ModelState::Unloading => {
                    return Err(ManagerError::Conflict {
                        state: ModelState::Unloading,
                        message: "the model is unloading; load it again once it is unloaded".into(),
                    });
                }
                ModelState::Unloaded | ModelState::Failed => {
                    let (effective, load_override, replicas) = prepared.unwrap_or_else(|| {
                        (Arc::clone(&entry.config), LoadOverride::default(), entry.config.replicas)
                    });
                    slot.effective = effective;
                    slot.load_override = load_override;
                    slot.replicas = replicas;
                    slot.load_progress = Some(0.0);
                    slot.loaded_replicas = 0;
                    entry.apply(&mut slot, LifecycleEvent::StartLoad, None, &self.inner.events);
                    true
                }
            }
        };
        entry.notify();
        if start {
            // The load runs in its own task: a caller that goes away cannot strand the
            // model in `loading`.
            let (this, e) = (self.clone(), Arc::clone(&entry));
            let _ = tokio::spawn(async move { this.run_load(e).await }).await;
        }
        entry.wait_until(|s| s.lifecycle.state() != ModelState::Loading).await;
        let slot = entry.lock();
        let snap = snapshot_of(&entry, &slot);
        match slot.lifecycle.state() {
            ModelState::Failed => Err(ManagerError::LoadFailed { snapshot: Box::new(snap) }),
            _ => Ok(snap),
        }
    }

    /// The load itself, once accepted: waits its turn in the serialized load queue, evicts,
    /// loads every replica (all or nothing), and retries once after evicting everything
    /// else when a failure other than not-found happens.
    async fn run_load(&self, entry: Arc<ModelEntry>) {
        let _queue = self.inner.load_queue.lock().await;
        let _resources = entry.resources.lock().await;
        ModelEntry::touch(&mut entry.lock());
        let incoming = Incoming {
            name: entry.config.name.clone(),
            model_type: entry.config.model_type,
            device: entry.config.device,
        };
        let plan = plan_load(&self.loaded_models(), &incoming, &self.inner.limits);
        self.execute(plan).await;

        let result = match self.load_replicas(&entry).await {
            Ok(runtimes) => Ok(runtimes),
            Err(first)
                if first.is_not_found()
                    || matches!(first, LoadError::BackendUnavailable { .. }) =>
            {
                Err(first.to_string())
            }
            Err(first) => {
                let failure = LoadFailure::Other;
                match plan_retry_after_failure(&self.loaded_models(), &entry.config.name, failure) {
                    Some(plan) if !plan.is_empty() => {
                        tracing::warn!(model = %entry.config.name, error = %first, "load failed; evicting every other model and retrying once");
                        self.execute(plan).await;
                        self.load_replicas(&entry).await.map_err(|second| {
                            format!(
                                "{first}; retry after evicting all other models failed: {second}"
                            )
                        })
                    }
                    _ => Err(first.to_string()),
                }
            }
        };

        let mut slot = entry.lock();
        slot.load_progress = None;
        match result {
            Ok(runtimes) => {
                let caps = runtimes.first().map(|r| r.capabilities().clone()).unwrap_or_default();
                let target =
                    effective_target(slot.effective.target_inflight, caps.max_parallel_sequences);
                slot.loaded_replicas = runtimes.len() as u32;
                slot.scheduler = Some(Scheduler::new(runtimes, target, self.inner.max_queue_depth));
                slot.capabilities = caps;
                slot.generation += 1;
                ModelEntry::touch(&mut slot);
                entry.apply(&mut slot, LifecycleEvent::LoadSucceeded, None, &self.inner.events);
                Events::bump(&self.inner.events.loads);
                *self.inner.last_loaded.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some(entry.config.name.clone());
            }
            Err(message) => {
                slot.loaded_replicas = 0;
                entry.apply(
                    &mut slot,
                    LifecycleEvent::LoadFailed,
                    Some(message),
                    &self.inner.events,
                );
                Events::bump(&self.inner.events.load_failures);
            }
        }
        drop(slot);
        entry.notify();
    }

    /// Loads every replica of the slot's effective definition; on any failure unloads the
    /// replicas already loaded.
    async fn load_replicas(
        &self,
        entry: &Arc<ModelEntry>,
    ) -> Result<Vec<Arc<dyn Runtime>>, LoadError> {
        let (model, replicas) = {
            let slot = entry.lock();
            (Arc::clone(&slot.effective), slot.replicas.get())
        };
        let backend = self
            .inner
            .backends
            .get(model.backend)
            .cloned()
            .ok_or(LoadError::BackendUnavailable { kind: model.backend })?;
        let mut runtimes: Vec<Arc<dyn Runtime>> = Vec::with_capacity(replicas as usize);
        for replica in 0..replicas {
            let progress_entry = Arc::clone(entry);
            let progress = ProgressSink::new(move |p| {
                progress_entry.lock().load_progress = Some((replica as f32 + p) / replicas as f32);
            });
            let request = LoadRequest { model: Arc::clone(&model), replica, progress };
            match backend.load(request).await {
                Ok(runtime) => {
                    runtimes.push(runtime);
                    entry.lock().loaded_replicas = runtimes.len() as u32;
                }
                Err(e) => {
                    for runtime in runtimes {
                        runtime.unload().await;
                    }
                    entry.lock().loaded_replicas = 0;
                    return Err(e);
                }
            }
        }
        Ok(runtimes)
    }

    /// Loaded models as the eviction policy sees them.
    fn loaded_models(&self) -> Vec<LoadedModel> {
        let mut loaded = Vec::new();
        for item in &self.inner.models {
            let entry = item.value();
            let slot = entry.lock();
            if slot.lifecycle.state() != ModelState::Loaded {
                continue;
            }
            let busy = slot.scheduler.as_ref().map_or(0, |s| {
                let stats = s.stats();
                stats.runtime_inflight + stats.queue_depth as u32
            });
            loaded.push(LoadedModel {
                name: entry.config.name.clone(),
                model_type: entry.config.model_type,
                device: entry.config.device,
                last_use: slot.last_use.map_or_else(Instant::now, |(t, _)| t).into_std(),
                inflight: busy + slot.pins,
            });
        }
        loaded
    }

    async fn execute(&self, plan: EvictionPlan) {
        for victim in plan.victims {
            let Ok(entry) = self.entry(victim.name.as_str()) else { continue };
            tracing::info!(model = %victim.name, reason = %victim.reason, wait = victim.wait_for_drain, "evicting");
            if self.unload_entry(&entry, UnloadCause::Eviction).await {
                Events::bump(&self.inner.events.evictions);
            }
        }
    }

    /// Gracefully unloads a configured model and answers when it is unloaded.
    ///
    /// Unloaded, unloading or failed: the current state, nothing changes.
    ///
    /// # Errors
    /// `unknown_model`; [`ManagerError::Conflict`] while the model is loading.
    pub async fn unload(&self, name: &str) -> Result<ModelSnapshot, ManagerError> {
        let entry = self.entry(name)?;
        {
            let slot = entry.lock();
            match slot.lifecycle.state() {
                ModelState::Loaded => {}
                ModelState::Loading => {
                    return Err(ManagerError::Conflict {
                        state: ModelState::Loading,
                        message: "the model is loading; unload it once it is loaded".into(),
                    });
                }
                _ => return Ok(snapshot_of(&entry, &slot)),
            }
        }
        let (this, e) = (self.clone(), Arc::clone(&entry));
        let _ =
            tokio::spawn(async move { this.unload_entry(&e, UnloadCause::Request).await }).await;
        Ok(snapshot(&entry))
    }

    /// Unloads every loaded model (concurrently) and returns the models after.
    pub async fn unload_all(&self) -> Vec<ModelSnapshot> {
        let mut tasks = tokio::task::JoinSet::new();
        for name in &self.inner.order {
            let (this, name) = (self.clone(), name.clone());
            tasks.spawn(async move { this.unload(name.as_str()).await });
        }
        while tasks.join_next().await.is_some() {}
        self.models()
    }

    /// The graceful unload: stop admissions, wait for pinned requests to be admitted,
    /// cancel queued requests, drain running ones, release the runtimes. Returns whether
    /// this call unloaded the model (false when it was no longer loaded).
    async fn unload_entry(&self, entry: &Arc<ModelEntry>, cause: UnloadCause) -> bool {
        let _resources = entry.resources.lock().await;
        let scheduler = {
            let mut slot = entry.lock();
            if slot.lifecycle.state() != ModelState::Loaded {
                return false;
            }
            entry.apply(&mut slot, LifecycleEvent::StartUnload, None, &self.inner.events);
            slot.scheduler.clone()
        };
        entry.notify();
        tracing::info!(model = %entry.config.name, ?cause, "unloading");
        entry.wait_until(|s| s.pins == 0).await;
        if let Some(scheduler) = &scheduler {
            scheduler.close(AdmissionError::ModelUnloading);
            scheduler.drained().await;
            for runtime in scheduler.runtimes() {
                runtime.unload().await;
            }
        }
        let mut slot = entry.lock();
        slot.scheduler = None;
        slot.loaded_replicas = 0;
        slot.load_override = LoadOverride::default();
        slot.effective = Arc::clone(&entry.config);
        slot.replicas = entry.config.replicas;
        entry.apply(&mut slot, LifecycleEvent::UnloadCompleted, None, &self.inner.events);
        drop(slot);
        Events::bump(&self.inner.events.unloads);
        entry.notify();
        true
    }

    /// Marks a model failed after its runtime crashed, refuses its queued requests, and
    /// tears its runtimes down once running requests have ended.
    fn crashed(&self, entry: &Arc<ModelEntry>, generation: u64, reason: &str) {
        let scheduler = {
            let mut slot = entry.lock();
            if slot.lifecycle.state() != ModelState::Loaded || slot.generation != generation {
                return;
            }
            let message = format!("runtime crashed: {reason}");
            entry.apply(
                &mut slot,
                LifecycleEvent::Crashed,
                Some(message.clone()),
                &self.inner.events,
            );
            slot.loaded_replicas = 0;
            let scheduler = slot.scheduler.take();
            if let Some(s) = &scheduler {
                s.close(AdmissionError::ModelFailed { last_error: message });
            }
            scheduler
        };
        Events::bump(&self.inner.events.crashes);
        entry.notify();
        tracing::error!(model = %entry.config.name, reason, "runtime crashed; model marked failed");
        if let Some(scheduler) = scheduler {
            let entry = Arc::clone(entry);
            tokio::spawn(async move {
                let _resources = entry.resources.lock().await;
                scheduler.drained().await;
                for runtime in scheduler.runtimes() {
                    runtime.unload().await;
                }
            });
        }
    }

    /// Admits a request to a model: waits for a slot on its least-loaded replica. With
    /// auto-load on (globally or for the model), an unloaded or failed model is loaded
    /// first, and the request is guaranteed to run before the model can be evicted.
    ///
    /// # Errors
    /// The spec's admission codes (`unknown_model`, `model_not_loaded`, `model_loading`,
    /// `model_unloading`, `model_failed`, `queue_full`).
    pub async fn acquire(&self, name: &str) -> Result<RequestGuard, ManagerError> {
        let entry = self.entry(name)?;
        let auto = entry.config.auto_load_or(self.inner.auto_load);
        let ready = {
            let mut slot = entry.lock();
            let state = slot.lifecycle.state();
            match state {
                ModelState::Loaded => {
                    ModelEntry::touch(&mut slot);
                    slot.scheduler.clone().map(|s| (s, slot.generation))
                }
                ModelState::Unloaded | ModelState::Failed | ModelState::Loading if auto => None,
                _ => {
                    return Err(admit(state, slot.lifecycle.last_error())
                        .err()
                        .unwrap_or(AdmissionError::ModelNotLoaded)
                        .into());
                }
            }
        };
        let (scheduler, generation, pin) = match ready {
            Some((s, g)) => (s, g, None),
            None => {
                let pin = Pin::new(&entry);
                match self.load(name, LoadOptions::default()).await {
                    Ok(_) => {}
                    Err(ManagerError::LoadFailed { snapshot }) => {
                        let last_error = snapshot.last_error.unwrap_or_default();
                        return Err(AdmissionError::ModelFailed { last_error }.into());
                    }
                    Err(ManagerError::Conflict { state: ModelState::Unloading, .. }) => {
                        return Err(AdmissionError::ModelUnloading.into());
                    }
                    Err(e) => return Err(e),
                }
                let mut slot = entry.lock();
                let state = slot.lifecycle.state();
                // A pinned request may still enter while an eviction waits for its pins.
                let open = state == ModelState::Loaded
                    || (state == ModelState::Unloading
                        && slot.scheduler.as_ref().is_some_and(|s| !s.stats().closed));
                if !open {
                    return Err(admit(state, slot.lifecycle.last_error())
                        .err()
                        .unwrap_or(AdmissionError::ModelNotLoaded)
                        .into());
                }
                ModelEntry::touch(&mut slot);
                let scheduler = slot.scheduler.clone().ok_or(AdmissionError::ModelNotLoaded)?;
                (scheduler, slot.generation, Some(pin))
            }
        };
        let permit = scheduler.acquire().await?;
        drop(pin);
        Ok(RequestGuard { permit, entry, generation, manager: self.clone() })
    }

    /// Admits and runs a generation, streaming pieces to `events`.
    ///
    /// # Errors
    /// Admission errors as [`Manager::acquire`]; runtime errors (a crash also marks the
    /// model failed).
    pub async fn generate(
        &self,
        name: &str,
        request: GenerateRequest,
        events: mpsc::Sender<GenerateEvent>,
    ) -> Result<GenerateSummary, ManagerError> {
        let guard = self.acquire(name).await?;
        let result = guard.runtime().generate(request, events).await;
        guard.check(result)
    }

    /// Admits and runs an embedding request.
    ///
    /// # Errors
    /// As [`Manager::generate`].
    pub async fn embed(
        &self,
        name: &str,
        request: EmbedRequest,
    ) -> Result<Embeddings, ManagerError> {
        let guard = self.acquire(name).await?;
        let result = guard.runtime().embed(request).await;
        guard.check(result)
    }

    /// Admits and runs a rerank request.
    ///
    /// # Errors
    /// As [`Manager::generate`].
    pub async fn rerank(
        &self,
        name: &str,
        request: RerankRequest,
    ) -> Result<Rerankings, ManagerError> {
        let guard = self.acquire(name).await?;
        let result = guard.runtime().rerank(request).await;
        guard.check(result)
    }
}

/// Checks load options against the model's backend and limits, without touching state.
fn prepare(
    config: &Arc<ModelConfig>,
    options: &LoadOptions,
) -> Result<(Arc<ModelConfig>, LoadOverride, NonZeroU32), ManagerError> {
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
    Ok((effective, load_override, replicas))
}

fn snapshot(entry: &ModelEntry) -> ModelSnapshot {
    snapshot_of(entry, &entry.lock())
}

fn snapshot_of(entry: &ModelEntry, slot: &Slot) -> ModelSnapshot {
    let config = &entry.config;
    let state = slot.lifecycle.state();
    let stats = slot.scheduler.as_ref().map(Scheduler::stats);
    let (runtime_inflight, queue_depth) =
        stats.as_ref().map_or((0, 0), |s| (s.runtime_inflight, s.queue_depth as u32));
    let effective_target = stats.as_ref().map_or_else(
        || effective_target(config.target_inflight, slot.capabilities.max_parallel_sequences).get(),
        |s| s.effective_target,
    );
    let replicas = match state {
        ModelState::Loading | ModelState::Loaded | ModelState::Unloading => slot.replicas.get(),
        ModelState::Unloaded | ModelState::Failed => config.replicas.get(),
    };
    let loaded_replicas = match state {
        ModelState::Loaded | ModelState::Unloading => slot.loaded_replicas,
        _ => 0,
    };
    ModelSnapshot {
        name: config.name.to_string(),
        resolved_backend: config.backend,
        model_type: config.model_type,
        device: config.device,
        configured_enabled: config.enabled,
        runtime_state: state,
        is_loaded: state == ModelState::Loaded,
        replicas,
        replica_max: config.replica_max.get(),
        loaded_replicas,
        inflight_requests: runtime_inflight + queue_depth,
        queue_depth,
        runtime_inflight,
        configured_target_inflight: config.target_inflight.get(),
        effective_target_inflight: effective_target,
        last_error: slot.lifecycle.last_error().map(str::to_owned),
        load_progress: if state == ModelState::Loading { slot.load_progress } else { None },
        last_use_unix_ms: slot.last_use.and_then(|(_, wall)| {
            wall.duration_since(std::time::UNIX_EPOCH).ok().map(|d| d.as_millis() as u64)
        }),
        vram_estimate_mib: entry.artifact_mib.map(|mib| mib * u64::from(replicas)),
        vram_estimate_replica_count: replicas,
        vram_estimate_source: if entry.artifact_mib.is_some() {
            VramEstimateSource::ModelArtifactSize
        } else {
            VramEstimateSource::Unavailable
        },
        load_constraints: load_constraints(config.backend),
        load_recommendations: load_recommendations(config.backend),
        load_override: slot.load_override.clone(),
        capabilities: slot.capabilities.clone(),
        definition: config.definition(),
    }
}
