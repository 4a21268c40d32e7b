//! Pause and continue: an operator stops a loaded model's generation without unloading it
//! (between the training steps of an RL loop, around a weight update).
//!
//! A paused model admits nothing: its scheduler grants no slot, so new requests wait in its
//! queue (bounded as always) until it continues. What happens to the requests already there
//! is the [`PauseMode`]:
//!
//! - `abort`: queued and running requests end with `generation_aborted`;
//! - `retract`: running generations stop, go back to the head of the queue, and resume after
//!   continue from the text they had produced — their clients see one uninterrupted answer.
//!   A request the engine cannot resume (structured output, tools, a forwarding engine,
//!   embeddings) finishes in place instead;
//! - `in_place`: queued requests wait, running ones finish.
//!
//! Running requests learn of an abort or retract through the model's interrupt channel
//! ([`Interrupts`]), which every admitted request watches.

use std::sync::Arc;
use std::time::SystemTime;

use hangar_backend::Runtime;
use hangar_lifecycle::{AdmissionError, ModelState, Scheduler};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::control::{Apply, Change, Handoff, Stay};
use crate::entry::{ModelEntry, Slot};
use crate::error::ManagerError;
use crate::journal::{EventKind, unix_ms};
use crate::manager::Manager;
use crate::snapshot::{ModelSnapshot, snapshot_of};

/// What a pause does to the requests already admitted.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, strum::IntoStaticStr,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum PauseMode {
    /// Queued and running requests end with `generation_aborted`.
    #[default]
    Abort,
    /// Running generations go back to the head of the queue and resume after continue.
    Retract,
    /// Queued requests wait; running ones finish.
    InPlace,
}

/// Who paused the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, strum::IntoStaticStr)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum PauseCause {
    /// `POST …/pause` (or `/pause_generation`).
    Operator,
    /// A weight update, for as long as it runs.
    WeightUpdate,
    /// A weights checksum, for as long as it reads the files.
    Checksum,
}

/// A model's pause, as the admin row shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PauseInfo {
    /// What the pause did to admitted requests.
    pub mode: PauseMode,
    /// Who paused it.
    pub cause: PauseCause,
    /// When, Unix milliseconds.
    pub since_unix_ms: u64,
}

/// What running requests are told to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Action {
    /// End with `generation_aborted` and this reason.
    Abort(Arc<str>),
    /// Go back to the queue and resume later, if the request can.
    Retract,
}

/// The latest interrupt of a model: a sequence number so that each one is seen once.
#[derive(Debug, Clone, Default)]
pub(crate) struct Interrupt {
    seq: u64,
    action: Option<Action>,
}

/// A model's interrupt channel: the manager sends, each admitted request watches. The
/// channel exists only while requests watch: the first subscriber creates it, and a send
/// that finds no one watching releases it (an idle model holds no channel).
#[derive(Default)]
pub(crate) struct Interrupts(std::sync::Mutex<Option<watch::Sender<Interrupt>>>);

impl Interrupts {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<watch::Sender<Interrupt>>> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<Interrupt> {
        self.lock().get_or_insert_with(|| watch::Sender::new(Interrupt::default())).subscribe()
    }

    fn send(&self, action: Action) {
        let mut channel = self.lock();
        let Some(tx) = channel.as_ref() else { return };
        if tx.receiver_count() == 0 {
            *channel = None;
            return;
        }
        tx.send_modify(|i| {
            i.seq += 1;
            i.action = Some(action);
        });
    }

    /// Whether the channel is allocated.
    #[cfg(test)]
    pub(crate) fn is_allocated(&self) -> bool {
        self.lock().is_some()
    }
}

/// The next interrupt sent after the last one `rx` saw; never resolves when none comes.
pub(crate) async fn next_action(rx: &mut watch::Receiver<Interrupt>) -> Action {
    loop {
        if rx.changed().await.is_err() {
            // The model's entry is gone: nothing will interrupt this request any more.
            std::future::pending::<()>().await;
        }
        if let Some(action) = rx.borrow_and_update().action.clone() {
            return action;
        }
    }
}

/// The error of an aborted request.
pub(crate) fn aborted(reason: &str) -> ManagerError {
    AdmissionError::GenerationAborted { reason: reason.to_owned() }.into()
}

/// What a request that was just granted a slot by `scheduler` must do, given the model's
/// pause: a slot granted before a pause began is only visible as a pause in the slot (its
/// interrupt may have been sent before the request subscribed). A pause is for the runtimes
/// in service: a request on a reload's previous runtimes (another scheduler) runs on.
pub(crate) fn on_grant(slot: &Slot, scheduler: &Scheduler<dyn Runtime>) -> Option<Action> {
    if !in_service(slot, scheduler) {
        return None;
    }
    slot.phase.pause().and_then(|p| match p.info.mode {
        PauseMode::Abort => Some(Action::Abort(Arc::clone(&p.reason))),
        PauseMode::Retract => Some(Action::Retract),
        PauseMode::InPlace => None,
    })
}

/// Whether `scheduler` serves the model now (and is not a reload's previous one, draining).
pub(crate) fn in_service(slot: &Slot, scheduler: &Scheduler<dyn Runtime>) -> bool {
    slot.phase.scheduler().is_some_and(|s| s.same(scheduler))
}

/// A model's pause with the reason an abort gives.
#[derive(Debug, Clone)]
pub(crate) struct Paused {
    pub(crate) info: PauseInfo,
    pub(crate) reason: Arc<str>,
}

impl Manager {
    /// Pauses a loaded model with `mode` (see the module docs). Pausing a paused model
    /// changes its mode and applies the new one (a pause `in_place` followed by `abort`
    /// aborts what was running).
    ///
    /// # Errors
    /// `unknown_model`; [`ManagerError::Conflict`] for a model that is not loaded;
    /// [`ManagerError::AdminBusy`].
    pub async fn pause(&self, name: &str, mode: PauseMode) -> Result<ModelSnapshot, ManagerError> {
        let entry = self.entry(name)?;
        let _admin = self.admin_turn(&entry).await?;
        self.pause_entry(&entry, mode, PauseCause::Operator).await?;
        Ok(snapshot_of(&entry, &entry.lock()))
    }

    /// Lets a paused model run again: queued requests (retracted ones first) get slots.
    /// Continuing a model that is not paused changes nothing.
    ///
    /// # Errors
    /// `unknown_model`; [`ManagerError::AdminBusy`].
    pub async fn resume(&self, name: &str) -> Result<ModelSnapshot, ManagerError> {
        let entry = self.entry(name)?;
        let _admin = self.admin_turn(&entry).await?;
        self.resume_entry(&entry).await;
        Ok(snapshot_of(&entry, &entry.lock()))
    }

    /// Pauses `entry` (its admin turn held by the caller): the loop decides (a loaded model
    /// only), the pause goes on its scheduler with the move, then queued and running
    /// requests are told what the mode says.
    pub(crate) async fn pause_entry(
        &self,
        entry: &ModelEntry,
        mode: PauseMode,
        cause: PauseCause,
    ) -> Result<(), ManagerError> {
        let name = entry.config.name.clone();
        let reason: Arc<str> = match cause {
            PauseCause::WeightUpdate => format!("model '{name}' is updating its weights").into(),
            _ => format!("model '{name}' was paused with mode {}", <&str>::from(mode)).into(),
        };
        let info = PauseInfo { mode, cause, since_unix_ms: unix_ms(SystemTime::now()) };
        let paused = Paused { info, reason: Arc::clone(&reason) };
        let (events, scheduler) = (Arc::clone(&self.inner.events), Handoff::new(None));
        let taken = scheduler.clone();
        let apply = Apply::new(move |slot| {
            let Some(serving) = slot.phase.serving_mut() else { return };
            serving.scheduler.pause();
            serving.pause = Some(paused);
            taken.put(serving.scheduler.clone());
            events.journal.record(&name, EventKind::Paused { mode, cause });
        });
        let change = Change::Pause { mode, cause };
        if let Err(stay) = self.inner.control.change(entry.position, change, apply).await {
            let state = match stay {
                Stay::NotFrom(state) => state,
                _ => entry.lock().lifecycle.state(),
            };
            return Err(not_loaded(state, "pause"));
        }
        let Some(scheduler) = scheduler.take() else { return Ok(()) };
        match mode {
            PauseMode::Abort => {
                let error = AdmissionError::GenerationAborted { reason: reason.to_string() };
                scheduler.cancel_queued(&error);
                entry.interrupts.send(Action::Abort(reason));
            }
            PauseMode::Retract => entry.interrupts.send(Action::Retract),
            PauseMode::InPlace => {}
        }
        Ok(())
    }

    /// Ends `entry`'s pause, if any (its admin turn held by the caller).
    pub(crate) async fn resume_entry(&self, entry: &Arc<ModelEntry>) {
        let (events, name) = (Arc::clone(&self.inner.events), entry.config.name.clone());
        let apply = Apply::new(move |slot| {
            if let Some(serving) = slot.phase.serving_mut() {
                serving.pause = None;
                // A sleeping model's gate stays closed until it wakes.
                if serving.asleep.is_none() {
                    serving.scheduler.resume();
                }
            }
            events.journal.record(&name, EventKind::Resumed);
        });
        let _ = self.inner.control.change(entry.position, Change::Resume, apply).await;
        let waiting = entry.lock().phase.serving().is_some_and(|s| {
            s.asleep.is_some() && s.pause.is_none() && s.scheduler.stats().queue_depth > 0
        });
        if waiting {
            self.wake_soon(entry);
        }
    }

    /// Restores a pause taken before an operation that paused the model itself (its admin
    /// turn held by the caller): none, or the one `before` (whose scheduler pause still
    /// holds).
    pub(crate) async fn restore_pause(&self, entry: &Arc<ModelEntry>, before: Option<Paused>) {
        match before {
            None => self.resume_entry(entry).await,
            Some(before) => self.set_pause(entry, before).await,
        }
    }

    /// Makes `pause` the model's pause, its scheduler paused already (its admin turn held by
    /// the caller); a model no longer loaded keeps none.
    pub(crate) async fn set_pause(&self, entry: &ModelEntry, pause: Paused) {
        let change = Change::Pause { mode: pause.info.mode, cause: pause.info.cause };
        let apply = Apply::new(move |slot| {
            if let Some(serving) = slot.phase.serving_mut() {
                serving.pause = Some(pause);
            }
        });
        let _ = self.inner.control.change(entry.position, change, apply).await;
    }
}

/// The conflict of a control operation on a model that is not loaded.
pub(crate) fn not_loaded(state: ModelState, what: &str) -> ManagerError {
    ManagerError::Conflict {
        state,
        message: format!("the model is {state}; {what} needs it loaded"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_interrupt_channel_exists_only_while_requests_watch() {
        let interrupts = Interrupts::default();
        interrupts.send(Action::Retract);
        assert!(!interrupts.is_allocated(), "a send with no one watching allocates nothing");
        let mut rx = interrupts.subscribe();
        assert!(interrupts.is_allocated());
        interrupts.send(Action::Abort("paused".into()));
        assert_eq!(next_action(&mut rx).await, Action::Abort("paused".into()));
        drop(rx);
        interrupts.send(Action::Retract);
        assert!(!interrupts.is_allocated(), "released once no one watches");
        // A later watcher gets the later interrupts, not the earlier ones.
        let mut rx = interrupts.subscribe();
        assert!(!rx.has_changed().unwrap());
        interrupts.send(Action::Retract);
        assert_eq!(next_action(&mut rx).await, Action::Retract);
    }
}
