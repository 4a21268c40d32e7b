//! The registry: which model each name means, in listing order, and how it changes at run
//! time. A config reload ([`Manager::apply_models`]) adds models, removes them (each
//! unloaded gracefully, answering to no name from the moment of the reload) and changes
//! definitions: at once for a model with nothing running, else at its next load.
//!
//! A model that leaves (removed, or replaced by its changed definition) is retired in the
//! control loop first, so no load of it starts again; a replacement takes a new id. Ids are
//! never reused, so a late command about the old model can reach only the old one.
//!
//! The model repository folder is read on a thread of its own, for at most
//! [`REPOSITORY_READ_DEADLINE`]; a read that takes longer leaves its models as they were,
//! and no other read starts while it still runs, so a hung file system holds one thread and
//! never the server.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use hangar_config::{ModelConfig, ModelName};
use hangar_lifecycle::ModelState;

use crate::entry::ModelEntry;
use crate::journal::{DefinitionChange, EventKind};
use crate::manager::Manager;
use crate::phase::Phase;
use crate::unload::UnloadCause;

/// The models in service, by name and in listing order. Replaced whole on a change, so a
/// reader sees one version.
#[derive(Default)]
pub(crate) struct Registry {
    /// Listing order: config order, models added by a reload in their config position.
    pub(crate) order: Vec<Arc<ModelEntry>>,
    by_name: HashMap<ModelName, Arc<ModelEntry>>,
    /// Each alias and the model it names.
    aliases: HashMap<String, ModelName>,
}

impl Registry {
    /// The registry of `order`, with the aliases of `definitions` (the newest definition
    /// of each model: aliases apply at once, also while a changed definition waits).
    pub(crate) fn new(order: Vec<Arc<ModelEntry>>, definitions: &[&ModelConfig]) -> Self {
        let by_name = order.iter().map(|e| (e.config.name.clone(), Arc::clone(e))).collect();
        let aliases = definitions
            .iter()
            .flat_map(|m| m.aliases.iter().map(|a| (a.to_string(), m.name.clone())))
            .collect();
        Self { order, by_name, aliases }
    }

    /// The model `name` means: the one of that name, else the one that has it as an alias.
    pub(crate) fn lookup(&self, name: &str) -> Option<&Arc<ModelEntry>> {
        self.by_name.get(name).or_else(|| self.by_name.get(self.aliases.get(name)?))
    }
}

/// What a config reload changed among the models (names in config order).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModelChanges {
    /// Models that joined.
    pub added: Vec<ModelName>,
    /// Models that left: each answers to no name from now on and is unloaded gracefully
    /// (running requests finish) in the background.
    pub removed: Vec<ModelName>,
    /// Changed definitions in effect now: nothing of the model was running.
    pub changed: Vec<ModelName>,
    /// Changed definitions waiting for the model's next load (its row's
    /// `pending_definition`); a later reload replaces or withdraws them.
    pub pending: Vec<ModelName>,
}

impl ModelChanges {
    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.added.is_empty()
            && self.removed.is_empty()
            && self.changed.is_empty()
            && self.pending.is_empty()
    }
}

/// A model to serve, and why it cannot load when its definition does not hold (a
/// repository folder's).
#[derive(Debug, Clone)]
pub(crate) struct Served {
    pub(crate) config: ModelConfig,
    pub(crate) problem: Option<String>,
    /// Whether a repository folder defines it (not the config).
    pub(crate) from_repository: bool,
}

/// Where the served models come from: the config's models, then the repository's.
#[derive(Debug, Default)]
pub(crate) struct Sources {
    /// The config's models, by name, in config order (their definitions are the entries').
    configured: Vec<ModelName>,
    /// The repository folder, if any.
    repository: Option<hangar_config::ModelRepository>,
    /// The repository models of the last scan that read the folder, kept when a scan
    /// cannot read it (a folder that vanished for a moment unloads nothing).
    scanned: Vec<Served>,
    /// A read of the folder is still running (past its deadline, or in flight).
    reading: Arc<AtomicBool>,
}

/// How long a read of the model repository folder may take.
pub const REPOSITORY_READ_DEADLINE: Duration = Duration::from_secs(10);

type Scan = std::io::Result<Vec<hangar_config::RepositoryModel>>;

/// Runs `read` on a thread of its own and waits for it at most `deadline`. While an earlier
/// read still runs (`reading`), none starts: that is an error at once.
pub(crate) fn bounded_read(
    reading: &Arc<AtomicBool>,
    deadline: Duration,
    read: impl FnOnce() -> Scan + Send + 'static,
) -> Scan {
    if reading.swap(true, Ordering::SeqCst) {
        return Err(std::io::Error::other(
            "an earlier read of the model repository has not finished",
        ));
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let flag = Arc::clone(reading);
    let spawned = std::thread::Builder::new().name("hangar-repository".into()).spawn(move || {
        let _ = tx.send(read());
        flag.store(false, Ordering::SeqCst);
    });
    if let Err(e) = spawned {
        reading.store(false, Ordering::SeqCst);
        return Err(e);
    }
    rx.recv_timeout(deadline).unwrap_or_else(|_| {
        Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("reading the model repository took longer than {deadline:?}"),
        ))
    })
}

impl Sources {
    /// The sources of `config`, and the models they serve now (the repository read here,
    /// on the caller's thread: a manager is made before it serves).
    pub(crate) fn of(config: &hangar_config::Config) -> (Self, Vec<Served>) {
        let mut sources = Self {
            configured: config.models.iter().map(|m| m.name.clone()).collect(),
            repository: config.model_repository.clone(),
            scanned: Vec::new(),
            reading: Arc::default(),
        };
        let read = sources.repository.clone().map(|repository| {
            let taken = taken(&config.models);
            let scan = move || repository.scan(&|name| taken.contains(name));
            bounded_read(&sources.reading, REPOSITORY_READ_DEADLINE, scan)
        });
        let served = sources.served(&config.models, read);
        (sources, served)
    }

    /// `configured`, then the repository's models as `read` found them (as last read when
    /// the folder could not be read; an alias another model has is the folder's problem).
    fn served(
        &mut self,
        configured: &[ModelConfig],
        read: Option<std::io::Result<Vec<hangar_config::RepositoryModel>>>,
    ) -> Vec<Served> {
        let mut served: Vec<Served> = configured
            .iter()
            .map(|m| Served { config: m.clone(), problem: None, from_repository: false })
            .collect();
        match read {
            None => self.scanned.clear(),
            Some(Err(e)) => {
                let dir = self.repository.as_ref().map(|r| r.dir.display().to_string());
                tracing::warn!(dir = dir.unwrap_or_default(), error = %e, "cannot read the model repository: its models stay as they were");
            }
            Some(Ok(models)) => {
                let mut taken = taken(configured);
                self.scanned = models
                    .into_iter()
                    .map(|m| {
                        let aliases = &m.definition.aliases;
                        let claimed = aliases.iter().find(|a| taken.contains(a.as_str()));
                        let problem = m.problem.or_else(|| {
                            claimed.map(|a| {
                                format!("the alias `{a}` is another model's name or alias")
                            })
                        });
                        if problem.is_none() {
                            taken.extend(aliases.iter().map(|a| a.to_string()));
                        }
                        Served { config: m.definition, problem, from_repository: true }
                    })
                    .collect();
            }
        }
        served.extend(self.scanned.iter().cloned());
        served
    }
}

/// The names and aliases of `configured`, which no repository model may take.
fn taken(configured: &[ModelConfig]) -> HashSet<String> {
    configured
        .iter()
        .flat_map(|m| {
            std::iter::once(m.name.to_string()).chain(m.aliases.iter().map(|a| a.to_string()))
        })
        .collect()
}

impl Manager {
    /// Makes `models` the config's models (the repository's are read again beside them),
    /// as a config reload does (see the module docs). The caller has checked them as a
    /// whole (names claimed once); reloads run one at a time.
    pub async fn apply_models(&self, models: &[ModelConfig]) -> ModelChanges {
        let mut sources = self.inner.reloading.lock().await;
        sources.configured = models.iter().map(|m| m.name.clone()).collect();
        self.refresh(&mut sources, models).await
    }

    /// Applies a re-read config's models and model repository (a config reload).
    pub async fn apply_config(&self, config: &hangar_config::Config) -> ModelChanges {
        let mut sources = self.inner.reloading.lock().await;
        if sources.repository != config.model_repository {
            sources.scanned.clear();
        }
        sources.repository.clone_from(&config.model_repository);
        sources.configured = config.models.iter().map(|m| m.name.clone()).collect();
        self.refresh(&mut sources, &config.models).await
    }

    /// Reads the model repository again and applies what changed in it (KServe's and
    /// Triton's repository calls rescan before they answer); nothing without a repository.
    pub async fn rescan_repository(&self) -> ModelChanges {
        let mut sources = self.inner.reloading.lock().await;
        if sources.repository.is_none() {
            return ModelChanges::default();
        }
        let registry = self.registry();
        let configured: Vec<ModelConfig> = sources
            .configured
            .iter()
            .filter_map(|name| registry.by_name.get(name))
            .map(|e| e.lock().pending.as_deref().unwrap_or(&e.config).clone())
            .collect();
        self.refresh(&mut sources, &configured).await
    }

    /// Serves `configured` and the repository's models, read again off the async threads;
    /// the caller holds the reload turn (`sources`).
    async fn refresh(&self, sources: &mut Sources, configured: &[ModelConfig]) -> ModelChanges {
        let read = match sources.repository.clone() {
            None => None,
            Some(repository) => {
                let taken = taken(configured);
                let scan = move || repository.scan(&|name| taken.contains(name));
                let reading = Arc::clone(&sources.reading);
                let wait = move || bounded_read(&reading, REPOSITORY_READ_DEADLINE, scan);
                let read = tokio::task::spawn_blocking(wait).await;
                Some(read.unwrap_or_else(|e| Err(std::io::Error::other(e))))
            }
        };
        let served = sources.served(configured, read);
        self.apply(served).await
    }

    /// Makes `served` the models in service; the caller holds the reload turn.
    async fn apply(&self, served: Vec<Served>) -> ModelChanges {
        let current = self.registry();
        let mut changes = ModelChanges::default();
        let mut order = Vec::with_capacity(served.len());
        for served_model in &served {
            let Served { config: model, problem, from_repository } = served_model;
            let Some(entry) = current.by_name.get(&model.name) else {
                order.push(self.add_entry(served_model.clone()));
                changes.added.push(model.name.clone());
                continue;
            };
            let (same, was_pending) = {
                let mut slot = entry.lock();
                let same = *entry.config == *model
                    && entry.problem == *problem
                    && entry.from_repository == *from_repository;
                // A definition changed back withdraws the one waiting.
                let was_pending = if same { slot.pending.take().is_some() } else { false };
                (same, was_pending)
            };
            if same {
                if was_pending {
                    tracing::info!(model = %model.name, "the changed definition waiting for the next load was withdrawn");
                }
                order.push(Arc::clone(entry));
            } else if self.inner.control.retire(entry.position, true).await {
                order.push(self.add_entry(served_model.clone()));
                changes.changed.push(model.name.clone());
            } else if let Some(problem) = problem {
                // A running model whose definition stopped holding serves on as it is; the
                // broken one takes its place once it is unloaded (at the next rescan).
                tracing::warn!(model = %model.name, %problem, "the model's new definition does not hold: it keeps serving under the one in effect");
                order.push(Arc::clone(entry));
            } else {
                entry.lock().pending = Some(Arc::new(model.clone()));
                order.push(Arc::clone(entry));
                changes.pending.push(model.name.clone());
            }
        }
        let mut removed = Vec::new();
        for entry in &current.order {
            if !served.iter().any(|m| m.config.name == entry.config.name) {
                self.inner.control.retire(entry.position, false).await;
                changes.removed.push(entry.config.name.clone());
                removed.push(Arc::clone(entry));
            }
        }
        let definitions: Vec<&ModelConfig> =
            served.iter().filter(|m| m.problem.is_none()).map(|m| &m.config).collect();
        self.publish(Registry::new(order, &definitions));
        let journal = &self.inner.events.journal;
        for (names, change) in [
            (&changes.added, DefinitionChange::Added),
            (&changes.removed, DefinitionChange::Removed),
            (&changes.changed, DefinitionChange::Changed),
            (&changes.pending, DefinitionChange::Pending),
        ] {
            for name in names {
                tracing::info!(model = %name, change = ?change, "models changed");
                journal.record(name, EventKind::Definition { change });
            }
        }
        for entry in removed {
            let this = self.clone();
            tokio::spawn(async move { this.unload_removed(&entry).await });
        }
        changes
    }

    /// The model `name` means, with a changed definition that waits applied first when
    /// nothing of the model runs (a load is about to start).
    pub(crate) async fn current_entry(
        &self,
        name: &str,
    ) -> Result<Arc<ModelEntry>, crate::ManagerError> {
        let entry = self.entry(name)?;
        let Some(pending) = entry.lock().pending.clone() else { return Ok(entry) };
        let _one_at_a_time = self.inner.reloading.lock().await;
        // Checked again in turn: another call may have applied it.
        let current = self.registry();
        let Some(now) = current.by_name.get(&entry.config.name) else { return self.entry(name) };
        if !Arc::ptr_eq(now, &entry) || !self.inner.control.retire(entry.position, true).await {
            return Ok(Arc::clone(now));
        }
        let from_repository = entry.from_repository;
        let replacement =
            self.add_entry(Served { config: (*pending).clone(), problem: None, from_repository });
        let order = current
            .order
            .iter()
            .map(|e| if Arc::ptr_eq(e, &entry) { Arc::clone(&replacement) } else { Arc::clone(e) })
            .collect();
        let mut registry = Registry::new(order, &[]);
        registry.aliases = current.aliases.clone();
        self.publish(registry);
        tracing::info!(model = %entry.config.name, "the changed definition took effect");
        let kind = EventKind::Definition { change: DefinitionChange::Changed };
        self.inner.events.journal.record(&entry.config.name, kind);
        Ok(replacement)
    }

    /// A new entry for `model`, known to the control loop (with the figures the state file
    /// kept for it). The caller holds the reload turn, so ids are taken one at a time.
    fn add_entry(&self, served: Served) -> Arc<ModelEntry> {
        let Served { config: model, problem, from_repository } = served;
        let capabilities = self
            .inner
            .backends
            .get(model.backend)
            .map_or_else(Default::default, |b| b.capabilities(&model));
        let lanes = crate::place::lanes_of(&model);
        let idle = self.inner.idle_default;
        let position = self.inner.control.next_id();
        let logs = self.inner.log_bounds;
        let mut entry = ModelEntry::new(model, position, Arc::new(capabilities), idle, logs);
        entry.problem = problem;
        entry.from_repository = from_repository;
        let entry = Arc::new(entry);
        if let Some(state) = &self.inner.state {
            state.restore(std::slice::from_ref(&entry));
        }
        if entry.idle_timeout.is_some() {
            self.inner.idle_configured.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        let figures = entry.lock().vram.clone();
        self.inner.control.add(Arc::clone(&entry), lanes, figures);
        entry
    }

    /// Unloads a model that left the config, gracefully, waiting for a load in progress
    /// first (no other load of it can start: it is retired).
    async fn unload_removed(&self, entry: &Arc<ModelEntry>) {
        loop {
            let loading = match &entry.lock().phase {
                Phase::Loading { outcome, .. } => Some(outcome.clone()),
                _ => None,
            };
            match loading {
                Some(outcome) => {
                    let _ = crate::outcome::answer(entry, outcome).await;
                }
                None => break,
            }
        }
        let state = entry.lock().lifecycle.state();
        if matches!(state, ModelState::Loaded) {
            let decided = self.inner.control.unload_decided(entry.position);
            let Ok(_admin) = self.admin_turn(entry).await else {
                tracing::warn!(model = %entry.config.name, "removed by a config reload, but another operation held it too long: still loaded");
                return;
            };
            self.unload_entry(entry, UnloadCause::Request).await;
            decided.end(true);
        }
        tracing::info!(model = %entry.config.name, "removed by a config reload: unloaded");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_past_its_deadline_is_an_error_and_no_other_starts_until_it_ends() {
        let reading = Arc::new(AtomicBool::new(false));
        let (release, hung) = std::sync::mpsc::channel::<()>();
        let deadline = Duration::from_millis(50);
        // A read that hangs (a FIFO opened blocking, a dead network file system).
        let stuck = bounded_read(&reading, deadline, move || {
            let _ = hung.recv();
            Ok(Vec::new())
        });
        assert_eq!(stuck.unwrap_err().kind(), std::io::ErrorKind::TimedOut);
        let refused = bounded_read(&reading, deadline, || Ok(Vec::new()));
        assert!(refused.unwrap_err().to_string().contains("has not finished"));
        release.send(()).unwrap();
        while reading.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        assert!(bounded_read(&reading, deadline, || Ok(Vec::new())).unwrap().is_empty());
    }
}
