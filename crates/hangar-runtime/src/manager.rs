//! [`Manager`]: the registry of configured models, and what can be read from it.
//!
//! The operations live next to it by concern: loads, reloads, unloads, eviction and crash
//! handling in `load.rs`; request admission in `admission.rs`.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::Arc;

use hangar_backend::{Backend, Capabilities, ModelLogs};
use hangar_config::{BackendKind, Config, ModelConfig, ModelName};
use hangar_lifecycle::{AdmissionError, ModelState};
use serde_json::{Map, Value};
use tokio::sync::broadcast;

use crate::entry::ModelEntry;
use crate::error::ManagerError;
use crate::events::{Events, ManagerCounters, StateChange};
use crate::journal::Follow;
use crate::registry::Registry;
use crate::snapshot::{ModelFilter, ModelSnapshot, ModelStatus, snapshot_of};

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

    pub(crate) fn get(&self, kind: BackendKind) -> Option<&Arc<dyn Backend>> {
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
    pub(crate) fn is_empty(&self) -> bool {
        self.replicas.is_none() && self.overrides.is_empty() && self.engine_fields.is_empty()
    }
}

/// The runtime manager: owns every configured model's runtime state and performs loads,
/// unloads, evictions and request admission. Cheap to clone; clones share state.
///
/// Loads take turns in lanes by the places they use (loads on different GPUs run at once);
/// eviction is planned when a load gets its turn. A load request is answered when the
/// model is loaded or failed.
///
/// Its control loop and housekeeping are tasks spawned on the Tokio runtime of the first
/// call that needs them: use a manager within one runtime, which outlives it.
#[derive(Clone)]
pub struct Manager {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    /// The models in service, by name and in config order (`crate::registry`); replaced
    /// whole by a config reload.
    pub(crate) registry: std::sync::RwLock<Arc<Registry>>,
    /// Where the served models come from; config reloads, repository rescans and a
    /// changed definition's taking effect run one at a time, under this lock.
    pub(crate) reloading: tokio::sync::Mutex<crate::registry::Sources>,
    pub(crate) backends: Backends,
    pub(crate) auto_load: bool,
    pub(crate) max_queue_depth: usize,
    /// How long an admin operation waits for another on the same model.
    pub(crate) admin_lock_timeout: std::time::Duration,
    /// The control loop: it owns and decides each model's lifecycle, pause, leases,
    /// failures, holds and figures, the turns and the awaited GPU release.
    pub(crate) control: crate::control::Control,
    pub(crate) events: Arc<Events>,
    pub(crate) last_loaded: std::sync::Mutex<Option<ModelName>>,
    /// Whether any model has an idle timeout (housekeeping starts at the first load).
    pub(crate) idle_configured: std::sync::atomic::AtomicBool,
    /// The global `idle_unload_seconds`, for models added by a reload.
    pub(crate) idle_default: Option<std::num::NonZeroU32>,
    /// What each model's log keeps, for models added by a reload.
    pub(crate) log_bounds: hangar_backend::LogBounds,
    /// Set once the housekeeping task runs.
    pub(crate) housekeeping: std::sync::OnceLock<()>,
    /// How long an admitted request may run (`limits.request_timeout_s`).
    pub(crate) request_timeout: Option<std::time::Duration>,
    /// Where GPU memory is read ([`Manager::set_gpu_probe`]).
    pub(crate) gpu: std::sync::RwLock<Arc<dyn hangar_gpu::GpuProbe>>,
    /// GPU memory models may fill; no admission by memory when `None`.
    pub(crate) vram_budget: Option<hangar_config::VramBudget>,
    /// Host memory CPU models may fill; no admission by host memory when `None`.
    pub(crate) ram_budget: Option<hangar_config::BudgetAmount>,
    /// Where measured figures persist (`state_dir`).
    pub(crate) state: Option<crate::state::StateFile>,
    /// Where engines save prompt caches (`<state_dir>/prompt-cache`), and their bound.
    pub(crate) prompt_cache: Option<hangar_backend::PromptCacheRoot>,
    /// The enabled models in start-up's order.
    pub(crate) start_up: Vec<Arc<ModelEntry>>,
    /// Loaded-model slots per type (start-up loads as many of each).
    pub(crate) slots: hangar_config::MaxLoadedModels,
}

impl Manager {
    /// A manager for every model in `config`, loading them with `backends`. Nothing is
    /// loaded yet; see [`Manager::load_enabled`].
    pub fn new(config: &Config, backends: Backends) -> Self {
        crate::place::warn_if_unmappable(config);
        let (sources, served) = crate::registry::Sources::of(config);
        let mut order = Vec::with_capacity(served.len());
        // Most models share their capabilities: one allocation each distinct value.
        let mut shared: Vec<Arc<Capabilities>> = Vec::new();
        for crate::registry::Served { config: model, problem, from_repository } in served {
            let capabilities = backends
                .get(model.backend)
                .map_or_else(Capabilities::default, |b| b.capabilities(&model));
            let capabilities = match shared.iter().find(|c| ***c == capabilities) {
                Some(c) => Arc::clone(c),
                None => {
                    shared.push(Arc::new(capabilities));
                    Arc::clone(&shared[shared.len() - 1])
                }
            };
            let idle = config.idle_unload_seconds;
            let logs = crate::entry::log_bounds(&config.limits);
            let mut entry = ModelEntry::new(model, order.len(), capabilities, idle, logs);
            entry.problem = problem;
            entry.from_repository = from_repository;
            order.push(Arc::new(entry));
        }
        let definitions: Vec<&ModelConfig> =
            order.iter().filter(|e| e.problem.is_none()).map(|e| &*e.config).collect();
        let registry = Registry::new(order.clone(), &definitions);
        let start_up = crate::start_up::mark(config, &registry);
        let state = config.state_dir.as_deref().map(crate::state::StateFile::new);
        if let Some(state) = &state {
            state.restore(&order);
        }
        let events = Arc::new(Events::new());
        let rules = crate::control::Rules {
            admin_wait: config.admin_lock_timeout,
            max_leases: config.limits.max_leases_per_model,
            quarantine: config.quarantine,
            limits: config.max_loaded_models,
            lanes: order.iter().map(|e| crate::place::lanes_of(&e.config)).collect(),
        };
        let control = crate::control::Control::new(&order, Arc::clone(&events), rules);
        Self {
            inner: Arc::new(Inner {
                registry: std::sync::RwLock::new(Arc::new(registry)),
                reloading: tokio::sync::Mutex::new(sources),
                backends,
                auto_load: config.auto_load,
                max_queue_depth: config.max_queue_depth.get() as usize,
                admin_lock_timeout: config.admin_lock_timeout,
                control,
                events,
                last_loaded: std::sync::Mutex::new(None),
                idle_configured: std::sync::atomic::AtomicBool::new(
                    order.iter().any(|e| e.idle_timeout.is_some()),
                ),
                idle_default: config.idle_unload_seconds,
                log_bounds: crate::entry::log_bounds(&config.limits),
                housekeeping: std::sync::OnceLock::new(),
                request_timeout: config.limits.request_timeout,
                gpu: std::sync::RwLock::new(Arc::new(hangar_gpu::NoGpu(
                    "no GPU probe: the host configured none".into(),
                ))),
                vram_budget: config.vram_budget.clone(),
                ram_budget: config.ram_budget,
                state,
                prompt_cache: prompt_cache_root(config),
                start_up,
                slots: config.max_loaded_models,
            }),
        }
    }

    /// Waits for `entry`'s admin turn from the control loop, at most `admin_lock_timeout`
    /// behind the operation that holds it.
    ///
    /// # Errors
    /// [`ManagerError::AdminBusy`] when the wait ran out.
    pub(crate) async fn admin_turn(
        &self,
        entry: &ModelEntry,
    ) -> Result<crate::control::Turn, ManagerError> {
        let waited = self.inner.admin_lock_timeout;
        self.inner.control.admin(entry.position).await.map_err(|crate::control::Busy| {
            ManagerError::AdminBusy { model: entry.config.name.to_string(), waited }
        })
    }

    pub(crate) fn entry(&self, name: &str) -> Result<Arc<ModelEntry>, ManagerError> {
        self.lookup(name)
            .ok_or_else(|| AdmissionError::UnknownModel { model: name.to_owned() }.into())
    }

    /// The model `name` means: the one of that name, else the one that has it as an alias.
    fn lookup(&self, name: &str) -> Option<Arc<ModelEntry>> {
        self.registry().lookup(name).cloned()
    }

    /// The registry as it is now.
    pub(crate) fn registry(&self) -> Arc<Registry> {
        Arc::clone(&self.inner.registry.read().unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    /// Makes `registry` the one in service.
    pub(crate) fn publish(&self, registry: Registry) {
        *self.inner.registry.write().unwrap_or_else(std::sync::PoisonError::into_inner) =
            Arc::new(registry);
    }

    /// The name of the model `name` means (itself, or the model it is an alias of); `None`
    /// when no model answers to it.
    pub fn canonical(&self, name: &str) -> Option<ModelName> {
        self.lookup(name).map(|entry| entry.config.name.clone())
    }

    /// Every configured model, in config order.
    pub fn models(&self) -> Vec<ModelSnapshot> {
        self.list(&ModelFilter::default())
    }

    /// Up to `max` of the configured models that pass `filter`, in config order, from
    /// config position `from` on, and the position to continue from (`None`: no more).
    /// Listing page by page holds only a page of snapshots at a time.
    pub fn list_page(
        &self,
        filter: &ModelFilter,
        from: usize,
        max: usize,
    ) -> (Vec<ModelSnapshot>, Option<usize>) {
        let registry = self.registry();
        let mut page = Vec::with_capacity(max.min(registry.order.len()));
        for (position, entry) in registry.order.iter().enumerate().skip(from) {
            if page.len() == max {
                return (page, Some(position));
            }
            let slot = entry.lock();
            if filter.matches(slot.lifecycle.state(), entry.config.model_type) {
                page.push(snapshot_of(entry, &slot));
            }
        }
        (page, None)
    }

    /// The configured models that pass `filter`, in config order.
    pub fn list(&self, filter: &ModelFilter) -> Vec<ModelSnapshot> {
        self.registry()
            .order
            .iter()
            .filter_map(|entry| {
                let slot = entry.lock();
                filter
                    .matches(slot.lifecycle.state(), entry.config.model_type)
                    .then(|| snapshot_of(entry, &slot))
            })
            .collect()
    }

    /// One model.
    ///
    /// # Errors
    /// `unknown_model`.
    pub fn model(&self, name: &str) -> Result<ModelSnapshot, ManagerError> {
        let entry = self.entry(name)?;
        let slot = entry.lock();
        Ok(snapshot_of(&entry, &slot))
    }

    /// The model a single-model control call (SGLang's root paths) means: `requested` when
    /// given, else the one loaded model, else the one configured model.
    ///
    /// # Errors
    /// `unknown_model` for a requested name not in config; [`ManagerError::ModelRequired`]
    /// when none is named and that does not decide it.
    pub fn target_model(&self, requested: Option<&str>) -> Result<ModelSnapshot, ManagerError> {
        if let Some(name) = requested {
            return self.model(name);
        }
        let mut loaded =
            self.list(&ModelFilter { state: Some(ModelState::Loaded), model_type: None });
        let registry = self.registry();
        match (loaded.len(), registry.order.as_slice()) {
            (1, _) => Ok(loaded.remove(0)),
            (0, [only]) => Ok(snapshot_of(only, &only.lock())),
            (0, _) => Err(ManagerError::ModelRequired {
                message: "no model is loaded: name one with `model`".into(),
            }),
            _ => {
                let names: Vec<&str> = loaded.iter().map(ModelSnapshot::name).collect();
                Err(ManagerError::ModelRequired {
                    message: format!(
                        "{} models are loaded ({}): name one with `model`",
                        names.len(),
                        names.join(", ")
                    ),
                })
            }
        }
    }

    /// Whether requests for `name` are passed through to its engine as they are
    /// ([`crate::RequestGuard::forward`]): its backend serves an OpenAI-compatible API
    /// itself. False for unknown models and backends not compiled in.
    pub fn forwards(&self, name: &str) -> bool {
        self.lookup(name).is_some_and(|entry| {
            self.inner.backends.get(entry.config.backend).is_some_and(|b| b.forwards())
        })
    }

    /// The configured definition of `name`, if it is configured.
    pub fn model_config(&self, name: &str) -> Option<Arc<ModelConfig>> {
        self.lookup(name).map(|entry| Arc::clone(&entry.config))
    }

    /// The log of `name`'s engine (its child processes' output, across loads).
    ///
    /// # Errors
    /// `unknown_model`.
    pub fn logs(&self, name: &str) -> Result<ModelLogs, ManagerError> {
        Ok(self.entry(name)?.logs.clone())
    }

    /// Whether `name` is a configured model or one's alias.
    pub fn contains(&self, name: &str) -> bool {
        self.lookup(name).is_some()
    }

    /// The name, state and last error of the models that pass `filter`, in config order:
    /// the cheap listing for indexes and counts (no row is built).
    pub fn statuses(&self, filter: &ModelFilter) -> Vec<ModelStatus> {
        self.registry()
            .order
            .iter()
            .filter_map(|entry| {
                let slot = entry.lock();
                let state = slot.lifecycle.state();
                filter.matches(state, entry.config.model_type).then(|| ModelStatus {
                    name: entry.config.name.clone(),
                    state,
                    last_error: slot
                        .lifecycle
                        .last_error()
                        .or(entry.problem.as_deref())
                        .map(str::to_owned),
                })
            })
            .collect()
    }

    /// The most recently loaded model still loaded, if any.
    pub fn last_loaded(&self) -> Option<ModelName> {
        let last = self.inner.last_loaded.lock().unwrap_or_else(|e| e.into_inner()).clone()?;
        let entry = self.lookup(last.as_str())?;
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

    /// The event journal from after `after` — the epoch and id of the last event a follower
    /// saw ([`Manager::events_epoch`], [`ManagerEvent::id`](crate::ManagerEvent::id)) — with
    /// the live feed of every later event; `None` follows from now on. See [`Follow`] for
    /// what a gap means.
    pub fn follow_events(&self, after: Option<(u64, u64)>) -> Follow {
        self.inner.events.journal.follow(after)
    }

    /// The epoch of this manager's event ids: its start, Unix milliseconds.
    pub fn events_epoch(&self) -> u64 {
        self.inner.events.journal.epoch
    }
}

/// `<state_dir>/prompt-cache` and its byte bound (the configured one, else the default
/// share of the disk); none without `state_dir` or with a bound of 0.
fn prompt_cache_root(config: &Config) -> Option<hangar_backend::PromptCacheRoot> {
    let state_dir = config.state_dir.as_deref()?;
    let max_bytes = config
        .prompt_cache_max_bytes
        .unwrap_or_else(|| hangar_prompt_cache::default_max_bytes(state_dir));
    (max_bytes > 0)
        .then(|| hangar_backend::PromptCacheRoot { dir: state_dir.join("prompt-cache"), max_bytes })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::{Config, prompt_cache_root};

    fn config(settings: serde_json::Value) -> Config {
        Config::from_value(&settings).expect("valid settings")
    }

    #[test]
    fn prompt_caches_live_under_state_dir_within_their_bound_and_nowhere_without_one() {
        let root = prompt_cache_root(&config(json!({ "state_dir": "/var/lib/hangar" })));
        let root = root.expect("a root under state_dir");
        assert_eq!(root.dir, std::path::Path::new("/var/lib/hangar/prompt-cache"));
        assert!(root.max_bytes > 0 && root.max_bytes <= 32 << 30, "the default share");
        let set = json!({ "state_dir": "/s", "prompt_cache_max_bytes": 1_000_000 });
        assert_eq!(prompt_cache_root(&config(set)).map(|r| r.max_bytes), Some(1_000_000));
        let off = json!({ "state_dir": "/s", "prompt_cache_max_bytes": 0 });
        assert_eq!(prompt_cache_root(&config(off)), None, "a bound of 0 saves nothing");
        let none = json!({ "prompt_cache_max_bytes": 1_000_000 });
        assert_eq!(prompt_cache_root(&config(none)), None, "no state_dir, nowhere to save");
    }
}
