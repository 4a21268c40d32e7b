//! The lifecycle, decided in [`step`](super::step): the loop owns each model's lifecycle
//! (the spec's state and last error, moved only along `hangar-lifecycle`'s transition
//! table) and the generation of the runtimes it serves.
//!
//! A task that changes a model's runtimes asks to move it ([`Change`]) with what to do to
//! the model's slot if the move is decided (`apply`, opaque here). The loop decides from
//! its own state: the move the table allows from the state it is in, an eviction or idle
//! unload only of a model nothing holds (a live or reserved lease, a replacement, its
//! definition's pin), a crash report only about the runtimes in service (their
//! generation), a pause only of a loaded model, which lasts across a reload or a weight
//! swap and ends with its runtimes; a sleep only of a loaded model, which ends with its
//! runtimes (new ones are awake); a failed load or a crash counts for the quarantine. A move decided is
//! performed by the shell — `apply`, then the published lifecycle, the journal — before
//! any answer of the same step; one refused leaves `apply` undone.

use hangar_lifecycle::{Lifecycle, LifecycleEvent, ModelState};
use tokio::time::Instant;

use super::{Effect, ModelId, State, grant, quarantine};
use hangar_backend::SleepLevel;

use crate::pause::{PauseCause, PauseMode};
use crate::quarantine::FailureKind;

/// A move a task asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Change {
    /// A load starts (from unloaded or failed).
    StartLoad,
    /// The load ended: loaded, or failed.
    LoadDone { failed: Option<LoadFailed> },
    /// New runtimes replace a loaded model's (a reload).
    Reload,
    /// New weights go in under the same queue (a weight update): a new generation, the
    /// state stays loaded.
    Swap,
    /// A graceful unload begins: an `evict`ion or idle unload only if nothing holds the
    /// model (`pinned`: its definition pins it); an operator's unload whatever holds it.
    StartUnload { evict: bool, pinned: bool },
    /// The unload ended: the runtimes are released.
    UnloadDone,
    /// A runtime of `generation` crashed with `message`.
    Crash { generation: u64, message: String },
    /// The model's admissions pause with `mode` (a loaded model only; pausing a paused one
    /// sets the new pause). Its runtimes' next generation (a reload, a swap) keeps it;
    /// runtimes that go (an unload, a crash) and a fresh load end it.
    Pause { mode: PauseMode, cause: PauseCause },
    /// The pause ends (if there is one).
    Resume,
    /// The model's runtimes went to sleep at `level` (a loaded model only): it stays
    /// loaded. New runtimes (a load, a reload, a swap) and runtimes that go end it.
    Sleep { level: SleepLevel },
    /// They woke (a sleeping model only).
    Wake,
}

/// How a load failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LoadFailed {
    /// What the row's `last_error` says.
    pub(crate) message: String,
    /// The model's own failure, which the quarantine counts (not a refusal by the grant).
    pub(crate) counts: bool,
    /// Its engine failed after every model that may be evicted on its devices was
    /// (`exhaust.rs`).
    pub(crate) exhausted: bool,
}

impl LoadFailed {
    /// A failure the quarantine counts, not after evicting everything.
    #[cfg(test)]
    pub(crate) fn counted(message: &str) -> Self {
        Self { message: message.to_owned(), counts: true, exhausted: false }
    }
}

/// A move decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Moved {
    pub(crate) from: ModelState,
    pub(crate) to: ModelState,
    /// The lifecycle event; `None` for a move within a state (a weight swap).
    pub(crate) event: Option<LifecycleEvent>,
    /// The last error it leaves (a failed load, a crash).
    pub(crate) error: Option<String>,
    /// The generation of the runtimes in service after it.
    pub(crate) generation: u64,
}

/// Why a move was refused; nothing changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stay {
    /// The table has no such move from the state the model is in.
    NotFrom(ModelState),
    /// An eviction or idle unload of a model something holds.
    Held,
    /// A crash report about runtimes no longer in service.
    Stale,
    /// A resume of a model that is not paused.
    NotPaused,
    /// A wake of a model that is not asleep.
    NotAsleep,
}

/// One model's lifecycle as the loop keeps it, with its pause.
#[derive(Debug, Default)]
pub(super) struct Life {
    lifecycle: Lifecycle,
    /// Bumped by every load, reload and weight swap; crash reports name theirs.
    generation: u64,
    /// The pause in effect.
    pause: Option<(PauseMode, PauseCause)>,
    /// How deeply its runtimes sleep, while they do.
    asleep: Option<SleepLevel>,
}

impl Life {
    pub(super) fn state(&self) -> ModelState {
        self.lifecycle.state()
    }

    pub(super) fn paused(&self) -> bool {
        self.pause.is_some()
    }

    /// How deeply its runtimes sleep, while they do.
    pub(super) fn asleep(&self) -> Option<SleepLevel> {
        self.asleep
    }
}

/// Decides `change` for `model`; `apply` and `waiter` go with the answer.
pub(super) fn change<W, P>(
    state: &mut State<W>,
    model: ModelId,
    (change, wall_ms, apply, waiter): (Change, u64, P, W),
    now: Instant,
    effects: &mut Vec<Effect<W, P>>,
) {
    let held = grant::held(state, model, now);
    let life = &mut state.models[model].life;
    let from = life.state();
    let (event, error, failure) = match &change {
        Change::StartLoad => (Some(LifecycleEvent::StartLoad), None, None),
        Change::LoadDone { failed: None } => (Some(LifecycleEvent::LoadSucceeded), None, None),
        Change::LoadDone { failed: Some(LoadFailed { message, counts, .. }) } => {
            // An engine can print megabytes into an error: kept bounded.
            let message = crate::journal::bounded(message);
            let failure = counts.then(|| (FailureKind::LoadFailed, message.clone()));
            (Some(LifecycleEvent::LoadFailed), Some(message), failure)
        }
        Change::Reload => (Some(LifecycleEvent::Reloaded), None, None),
        Change::Swap if from == ModelState::Loaded => (None, None, None),
        Change::Swap => return refuse(effects, model, waiter, Stay::NotFrom(from)),
        Change::StartUnload { evict: true, pinned }
            if from == ModelState::Loaded && (held || *pinned) =>
        {
            return refuse(effects, model, waiter, Stay::Held);
        }
        Change::StartUnload { .. } => (Some(LifecycleEvent::StartUnload), None, None),
        Change::UnloadDone => (Some(LifecycleEvent::UnloadCompleted), None, None),
        Change::Crash { generation, .. }
            if from == ModelState::Loaded && *generation != life.generation =>
        {
            return refuse(effects, model, waiter, Stay::Stale);
        }
        Change::Crash { message, .. } => {
            let message = crate::journal::bounded(message);
            let failure = Some((FailureKind::Crashed, message.clone()));
            (Some(LifecycleEvent::Crashed), Some(message), failure)
        }
        Change::Pause { .. } if from == ModelState::Loaded => (None, None, None),
        Change::Pause { .. } => return refuse(effects, model, waiter, Stay::NotFrom(from)),
        Change::Resume if life.pause.is_some() => (None, None, None),
        Change::Resume => return refuse(effects, model, waiter, Stay::NotPaused),
        Change::Sleep { .. } if from == ModelState::Loaded => (None, None, None),
        Change::Sleep { .. } => return refuse(effects, model, waiter, Stay::NotFrom(from)),
        Change::Wake if life.asleep.is_some() => (None, None, None),
        Change::Wake => return refuse(effects, model, waiter, Stay::NotAsleep),
    };
    let to = match event {
        None => from,
        Some(event) => match life.lifecycle.apply(event, error.clone()) {
            Ok(to) => to,
            Err(_) => return refuse(effects, model, waiter, Stay::NotFrom(from)),
        },
    };
    let crashed = matches!(change, Change::Crash { .. });
    let frees = matches!(change, Change::UnloadDone | Change::Crash { .. } | Change::Sleep { .. });
    let load_done = match &change {
        Change::LoadDone { failed } => Some(failed.clone()),
        _ => None,
    };
    if matches!(change, Change::LoadDone { failed: None } | Change::Reload | Change::Swap) {
        life.generation += 1;
    }
    match change {
        Change::Pause { mode, cause } => life.pause = Some((mode, cause)),
        Change::Resume | Change::LoadDone { .. } | Change::UnloadDone | Change::Crash { .. } => {
            life.pause = None;
        }
        Change::StartLoad
        | Change::Reload
        | Change::Swap
        | Change::StartUnload { .. }
        | Change::Sleep { .. }
        | Change::Wake => {}
    }
    life.asleep = match change {
        Change::Sleep { level } => Some(level),
        Change::Pause { .. } | Change::Resume | Change::StartUnload { .. } => life.asleep,
        _ => None,
    };
    // The last error a failed load or a crash leaves (the lifecycle keeps the same).
    let moved = Moved { from, to, event, error, generation: life.generation };
    effects.push(Effect::Moved { model, moved, apply, waiter });
    if crashed {
        super::release::tearing(state, model, now);
    }
    if frees {
        super::exhaust::freed(state);
    }
    if let Some(failed) = load_done {
        super::exhaust::load_done(state, model, failed.as_ref());
    }
    if let Some((kind, message)) = failure {
        quarantine::failed(state, model, (kind, message, wall_ms), now, effects);
    }
}

fn refuse<W, P>(effects: &mut Vec<Effect<W, P>>, model: ModelId, waiter: W, why: Stay) {
    effects.push(Effect::Stays { model, waiter, why });
}
