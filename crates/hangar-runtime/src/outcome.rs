//! How a load ends, as a value: the one outcome every caller waiting on that load gets over
//! a `watch` channel, typed from the engine or the grant to the caller's error (no message
//! parked in the slot for a waiter to rebuild).

use std::fmt;
use std::sync::Arc;

use hangar_backend::LoadError;
use tokio::sync::watch;

use crate::entry::ModelEntry;
use crate::error::{ManagerError, load_failed_message};
use crate::grant::Refusal;
use crate::snapshot::{ModelSnapshot, snapshot_of};

/// How one load ended.
#[derive(Debug, Clone)]
pub(crate) enum Outcome {
    /// Every replica loaded; the model serves.
    Loaded,
    /// The grant refused it: held models or the VRAM budget in the way. Nothing was
    /// evicted, and it is not the model's failure (no quarantine count).
    Refused(Refusal),
    /// The engine could not load it.
    Failed(EngineFailure),
}

/// An engine's load failure, and the retry's when one ran after evicting everything else.
#[derive(Debug, Clone)]
pub(crate) struct EngineFailure {
    pub(crate) first: LoadError,
    pub(crate) retry: Option<LoadError>,
    /// The engine failed with every model that may be evicted on its devices evicted (the
    /// retry's, or the first try's with nothing there to evict): see
    /// `control/step/exhaust.rs`.
    pub(crate) exhausted: bool,
}

impl From<LoadError> for EngineFailure {
    fn from(first: LoadError) -> Self {
        Self { first, retry: None, exhausted: false }
    }
}

impl fmt::Display for EngineFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.retry {
            None => write!(f, "{}", self.first),
            Some(second) => {
                write!(
                    f,
                    "{}; retry after evicting every other model on its devices failed: {second}",
                    self.first
                )
            }
        }
    }
}

impl Outcome {
    /// What the row's `last_error` says about a load that did not succeed.
    pub(crate) fn message(&self, model: &str) -> Option<String> {
        match self {
            Self::Loaded => None,
            Self::Refused(Refusal::Held(held)) => Some(format!(
                "slots_pinned: no room without evicting pinned or leased model(s): {}",
                held.join(", ")
            )),
            Self::Refused(
                refusal @ (Refusal::Vram(_) | Refusal::Host(_) | Refusal::Unknown(_)),
            ) => {
                let error = refusal.clone().into_error(model);
                Some(format!("{}: {error}", error.code().as_str()))
            }
            Self::Failed(failure) => Some(failure.to_string()),
        }
    }
}

/// The sending side of a load's outcome: the load's own task holds it.
pub(crate) type OutcomeTx = watch::Sender<Option<Outcome>>;
/// A waiter's side: every caller that started or joined the load holds one.
pub(crate) type OutcomeRx = watch::Receiver<Option<Outcome>>;

/// A fresh outcome channel for a load that starts now.
pub(crate) fn channel() -> (OutcomeTx, OutcomeRx) {
    watch::channel(None)
}

/// Waits for the load behind `rx` to end and answers as the load API does: the model's row
/// when it loaded, else the typed error of its outcome.
pub(crate) async fn answer(
    entry: &Arc<ModelEntry>,
    mut rx: OutcomeRx,
) -> Result<ModelSnapshot, ManagerError> {
    let outcome = rx.wait_for(Option::is_some).await.ok().and_then(|o| o.clone());
    let name = entry.config.name.as_str();
    let snapshot = || Box::new(snapshot_of(entry, &entry.lock()));
    match outcome {
        Some(Outcome::Loaded) => Ok(*snapshot()),
        Some(Outcome::Refused(refusal)) => Err(refusal.into_error(name)),
        Some(Outcome::Failed(failure)) => Err(ManagerError::LoadFailed {
            message: load_failed_message(&crate::journal::bounded(&failure.to_string())),
            snapshot: snapshot(),
        }),
        // Only a panic in the load's task drops the sender unsent.
        None => Err(ManagerError::LoadFailed {
            message: load_failed_message("the load task ended without an outcome"),
            snapshot: snapshot(),
        }),
    }
}
