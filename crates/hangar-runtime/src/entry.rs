//! One registered model: its config and its live slot, behind one leaf lock.

use std::num::NonZeroU32;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use hangar_backend::{Capabilities, LogBounds, ModelLogs};
use hangar_config::LoadOverride;
use hangar_config::ModelConfig;
use hangar_lifecycle::{Lifecycle, LifecycleEvent, ModelState};
use tokio::time::Instant;

use crate::events::StateChange;
use crate::journal::EventKind;
use crate::pause::Interrupts;
use crate::phase::Phase;

/// A configured model and its runtime state. The model's lifecycle is the control loop's
/// (`control/step/life.rs`): the slot holds its published copy, which the loop's shell moves
/// through [`ModelEntry::apply`] together with the phase.
pub(crate) struct ModelEntry {
    pub(crate) config: Arc<ModelConfig>,
    /// Position in config order.
    pub(crate) position: usize,
    /// What the model's files say (size, GGUF shape), read once at start-up.
    pub(crate) artifacts: crate::estimate::Artifacts,
    /// Seconds without work before it is unloaded: its own `idle_unload_seconds`, else the
    /// global one.
    pub(crate) idle_timeout: Option<NonZeroU32>,
    /// The model's data, held only to read or assign fields, never across an await; only
    /// leaf locks are taken under it (the journal's, a scheduler's, `last_loaded`). Who may change the runtimes it
    /// holds is the control loop's decision (`crate::control`).
    slot: Mutex<Slot>,
    /// Its engine's output, across loads.
    pub(crate) logs: ModelLogs,
    /// Tells running requests to abort or retract (a pause).
    pub(crate) interrupts: Interrupts,
    /// What start-up decided for the model, for readiness.
    pub(crate) start_up: crate::start_up::MarkCell,
    /// A wake for waiting requests is on its way (`sleep.rs`).
    pub(crate) waking: std::sync::atomic::AtomicBool,
    /// Requests pinning the model (`crate::control::Pin`).
    pub(crate) pins: std::sync::atomic::AtomicU32,
    /// Why the model cannot load: its definition (a repository folder's) does not hold.
    pub(crate) problem: Option<String>,
    /// Whether a model repository folder defines it (not the config).
    pub(crate) from_repository: bool,
}

pub(crate) struct Slot {
    pub(crate) lifecycle: Lifecycle,
    /// The runtimes by phase, with what is valid only in that phase; in step with the
    /// lifecycle's state ([`ModelEntry::apply`]).
    pub(crate) phase: Phase,
    /// The definition in effect for the current (or last) load.
    pub(crate) effective: Arc<ModelConfig>,
    pub(crate) load_override: LoadOverride,
    pub(crate) replicas: NonZeroU32,
    pub(crate) capabilities: Arc<Capabilities>,
    pub(crate) last_use: Option<(Instant, SystemTime)>,
    /// Operations replacing the model's runtimes (a reload, a weight update): while any
    /// runs, the model is held (never an eviction victim nor unloaded for idleness). The
    /// control loop's published count; written by the loop only.
    pub(crate) replacing: u32,
    /// The generation of the runtimes in service (the control loop's, published: a load, a
    /// reload and a weight swap each start one), so late crash reports of older runtimes
    /// are ignored.
    pub(crate) generation: u64,
    /// The weights checker's last snapshot, for `compare`.
    pub(crate) weights_snapshot: Option<Arc<hangar_weights::WeightsDigest>>,
    /// Leases on the model, as the control loop published them (expired ones until its
    /// next tick); written by the loop only.
    pub(crate) leases: Vec<crate::lease::Held>,
    /// Recent failed loads and crashes, and the quarantine they led to, as the control
    /// loop published them; written by the loop only.
    pub(crate) failures: crate::quarantine::FailureView,
    /// GPU memory measured across loads (process tree, load delta), as the control loop
    /// published it (seeded from the state file before the loop starts).
    pub(crate) vram: crate::vram::ObservedVram,
    /// The GPUs the runtimes in service were placed on; `None` when no placement was made
    /// (the engines picked) or nothing is loaded.
    pub(crate) placement: Option<crate::place::Placement>,
    /// What the runtimes in service were measured to hold on the host (models on the
    /// CPU); `None` when not measured or nothing is loaded.
    pub(crate) host: Option<crate::host::HostFigure>,
    /// What the last sleep of the runtimes in service gave back on the GPUs, in MiB (what
    /// a demotion expects of the next one); `None` before their first sleep.
    pub(crate) sleep_freed_mib: Option<u64>,
    /// A changed definition from a config reload, waiting for the model's next load
    /// (`crate::registry`).
    pub(crate) pending: Option<Arc<ModelConfig>>,
}

/// What each model's log keeps (`limits.max_log_line_bytes`, `limits.max_log_bytes`).
pub(crate) fn log_bounds(limits: &hangar_config::Limits) -> LogBounds {
    let bytes = |v: std::num::NonZeroU64| usize::try_from(v.get()).unwrap_or(usize::MAX);
    LogBounds {
        max_line_bytes: bytes(limits.max_log_line_bytes),
        max_bytes: bytes(limits.max_log_bytes),
    }
}

impl ModelEntry {
    pub(crate) fn new(
        config: ModelConfig,
        position: usize,
        capabilities: Arc<Capabilities>,
        idle_default: Option<NonZeroU32>,
        logs: LogBounds,
    ) -> Self {
        let idle_timeout = config.idle_unload_seconds.or(idle_default);
        let config = Arc::new(config);
        let artifacts = crate::estimate::Artifacts::read(&config);
        Self {
            slot: Mutex::new(Slot {
                lifecycle: Lifecycle::new(),
                phase: Phase::Down,
                effective: Arc::clone(&config),
                load_override: LoadOverride::default(),
                replicas: config.replicas,
                capabilities,
                last_use: None,
                replacing: 0,
                generation: 0,
                weights_snapshot: None,
                leases: Vec::new(),
                failures: Default::default(),
                vram: Default::default(),
                placement: None,
                host: None,
                sleep_freed_mib: None,
                pending: None,
            }),
            config,
            position,
            artifacts,
            idle_timeout,
            logs: ModelLogs::bounded(logs),
            interrupts: Interrupts::default(),
            start_up: Default::default(),
            waking: Default::default(),
            pins: Default::default(),
            problem: None,
            from_repository: false,
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Slot> {
        // Critical sections only assign fields; a poisoned lock holds consistent data.
        self.slot.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Moves the lifecycle along the transition table and reports the change. The caller
    /// has put the phase of the new state in `slot.phase` (checked in debug builds).
    pub(crate) fn apply(
        &self,
        slot: &mut Slot,
        event: LifecycleEvent,
        error: Option<String>,
        events: &crate::events::Events,
    ) -> Option<ModelState> {
        let from = slot.lifecycle.state();
        // `last_error` is kept as long as the model stays failed, and journaled.
        let error = error.map(|mut e| {
            crate::journal::bound(&mut e);
            e
        });
        match slot.lifecycle.apply(event, error.clone()) {
            Ok(to) => {
                debug_assert!(
                    slot.phase.fits(to),
                    "{}: phase out of step with {to}",
                    self.config.name
                );
                let cause = event;
                let state = EventKind::State { from, to, cause, error };
                events.journal.record(&self.config.name, state);
                events.emit(StateChange { model: self.config.name.clone(), from, to, event });
                Some(to)
            }
            Err(illegal) => {
                tracing::error!(model = %self.config.name, %illegal, "lifecycle bug: illegal transition ignored");
                None
            }
        }
    }

    pub(crate) fn touch(slot: &mut Slot) {
        slot.last_use = Some((Instant::now(), SystemTime::now()));
    }
}
