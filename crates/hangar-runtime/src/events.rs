//! State-change notifications and the counters behind metrics.

use std::sync::atomic::{AtomicU64, Ordering};

use hangar_config::ModelName;
use hangar_lifecycle::{LifecycleEvent, ModelState};
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

/// One move of a model's lifecycle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateChange {
    /// The model.
    pub model: ModelName,
    /// State before.
    pub from: ModelState,
    /// State after.
    pub to: ModelState,
    /// What caused it.
    pub event: LifecycleEvent,
}

/// Lifetime counters of the manager.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManagerCounters {
    /// Loads that succeeded.
    pub loads: u64,
    /// Loads that ended in `failed`.
    pub load_failures: u64,
    /// Unloads completed (explicit and evictions).
    pub unloads: u64,
    /// Models unloaded to make room for another.
    pub evictions: u64,
    /// Runtimes that crashed while loaded.
    pub crashes: u64,
}

pub(crate) struct Events {
    tx: broadcast::Sender<StateChange>,
    /// Every operator-visible change, numbered, for `GET /v1/admin/events`.
    pub(crate) journal: crate::journal::Journal,
    pub(crate) loads: AtomicU64,
    pub(crate) load_failures: AtomicU64,
    pub(crate) unloads: AtomicU64,
    pub(crate) evictions: AtomicU64,
    pub(crate) crashes: AtomicU64,
}

impl Events {
    pub(crate) fn new() -> Self {
        Self {
            tx: broadcast::Sender::new(1024),
            journal: crate::journal::Journal::new(),
            loads: AtomicU64::new(0),
            load_failures: AtomicU64::new(0),
            unloads: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            crashes: AtomicU64::new(0),
        }
    }

    pub(crate) fn emit(&self, change: StateChange) {
        tracing::info!(model = %change.model, from = %change.from, to = %change.to, "model state changed");
        // Nobody listening is fine.
        let _ = self.tx.send(change);
    }

    pub(crate) fn subscribe(&self) -> broadcast::Receiver<StateChange> {
        self.tx.subscribe()
    }

    pub(crate) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn counters(&self) -> ManagerCounters {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ManagerCounters {
            loads: get(&self.loads),
            load_failures: get(&self.load_failures),
            unloads: get(&self.unloads),
            evictions: get(&self.evictions),
            crashes: get(&self.crashes),
        }
    }
}
