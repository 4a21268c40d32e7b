//! The per-model state machine, with its transition table as data.

use serde::{Deserialize, Serialize};

/// The live runtime state of a configured model.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    strum::IntoStaticStr,
    strum::Display,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum ModelState {
    /// Known from config; no runtime is loaded. Requests are rejected (`model_not_loaded`);
    /// the model may be loaded.
    Unloaded,
    /// A load was requested and has not finished (it may wait for its turn in the load lane).
    /// Requests are rejected (`model_loading`); duplicate loads return the current state.
    Loading,
    /// Runtimes exist and serve requests; the model may be unloaded.
    Loaded,
    /// No new requests are admitted (`model_unloading`); in-flight requests finish, then
    /// the runtimes are released.
    Unloading,
    /// The last load failed or the runtime crashed; `last_error` says why. Requests are
    /// rejected (`model_failed`); the model may be loaded again.
    Failed,
}

impl ModelState {
    /// Every state, in lifecycle order.
    pub const ALL: [ModelState; 5] =
        [Self::Unloaded, Self::Loading, Self::Loaded, Self::Unloading, Self::Failed];

    /// The snake_case name used in JSON.
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// Whether a load may pick replicas and overrides now: only while unloaded or failed.
    pub const fn accepts_load_options(self) -> bool {
        matches!(self, Self::Unloaded | Self::Failed)
    }

    /// A one-line description, used for OpenAPI and `--help` texts.
    pub const fn description(self) -> &'static str {
        match self {
            Self::Unloaded => "known from config; no runtime loaded; may be loaded",
            Self::Loading => "load in progress (or queued); requests are rejected",
            Self::Loaded => "runtimes loaded; requests are served",
            Self::Unloading => {
                "draining in-flight requests before releasing runtimes; new requests are rejected"
            }
            Self::Failed => {
                "the last load failed or the runtime crashed; see last_error; may be loaded again"
            }
        }
    }
}

/// What happens to a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LifecycleEvent {
    /// A load was accepted.
    StartLoad,
    /// Every replica loaded.
    LoadSucceeded,
    /// The load failed (after any retry).
    LoadFailed,
    /// A graceful unload began.
    StartUnload,
    /// In-flight work drained and the runtimes were released.
    UnloadCompleted,
    /// A runtime died while loaded.
    Crashed,
    /// A loaded model's runtimes were replaced by new ones (a reload with other options);
    /// the old ones served until the new ones were ready.
    Reloaded,
}

/// Every legal move: `(from, event, to)`. Anything else is an [`IllegalTransition`].
pub const TRANSITIONS: &[(ModelState, LifecycleEvent, ModelState)] = {
    use LifecycleEvent::*;
    use ModelState::*;
    &[
        (Unloaded, StartLoad, Loading),
        (Failed, StartLoad, Loading),
        (Loading, LoadSucceeded, Loaded),
        (Loading, LoadFailed, Failed),
        (Loaded, StartUnload, Unloading),
        (Unloading, UnloadCompleted, Unloaded),
        (Loaded, Crashed, Failed),
        (Loaded, Reloaded, Loaded),
    ]
};

/// A move the transition table does not allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("illegal lifecycle transition: {event:?} while {from}")]
pub struct IllegalTransition {
    /// The state the model was in.
    pub from: ModelState,
    /// The event that does not apply to it.
    pub event: LifecycleEvent,
}

/// The state after `event`, per [`TRANSITIONS`].
///
/// # Errors
/// [`IllegalTransition`] when the table has no such move.
pub fn next_state(
    from: ModelState,
    event: LifecycleEvent,
) -> Result<ModelState, IllegalTransition> {
    TRANSITIONS
        .iter()
        .find(|(f, e, _)| *f == from && *e == event)
        .map(|(_, _, to)| *to)
        .ok_or(IllegalTransition { from, event })
}

/// A model's state and its last error, changed only through the transition table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lifecycle {
    state: ModelState,
    last_error: Option<String>,
}

impl Default for Lifecycle {
    fn default() -> Self {
        Self { state: ModelState::Unloaded, last_error: None }
    }
}

impl Lifecycle {
    /// A model that is not loaded.
    pub fn new() -> Self {
        Self::default()
    }

    /// The current state.
    pub fn state(&self) -> ModelState {
        self.state
    }

    /// Why the last load failed or the runtime crashed; cleared by a successful load.
    pub fn last_error(&self) -> Option<&str> {
        self.last_error.as_deref()
    }

    /// Applies `event`. `LoadFailed` and `Crashed` record `error` as `last_error`;
    /// `LoadSucceeded` clears it.
    ///
    /// # Errors
    /// [`IllegalTransition`], leaving the lifecycle unchanged.
    pub fn apply(
        &mut self,
        event: LifecycleEvent,
        error: Option<String>,
    ) -> Result<ModelState, IllegalTransition> {
        let to = next_state(self.state, event)?;
        match event {
            LifecycleEvent::LoadFailed | LifecycleEvent::Crashed => {
                self.last_error = Some(error.unwrap_or_else(|| "unknown error".to_owned()));
            }
            LifecycleEvent::LoadSucceeded | LifecycleEvent::Reloaded => self.last_error = None,
            _ => {}
        }
        self.state = to;
        Ok(to)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use LifecycleEvent::*;
    use ModelState::*;

    const EVENTS: [LifecycleEvent; 7] =
        [StartLoad, LoadSucceeded, LoadFailed, StartUnload, UnloadCompleted, Crashed, Reloaded];

    /// Every (state, event) pair: the expected outcome, written out independently of the table.
    #[test]
    fn every_transition_is_allowed_or_rejected_as_specified() {
        let expected = |s: ModelState, e: LifecycleEvent| -> Option<ModelState> {
            match (s, e) {
                (Unloaded | Failed, StartLoad) => Some(Loading),
                (Loading, LoadSucceeded) => Some(Loaded),
                (Loading, LoadFailed) => Some(Failed),
                (Loaded, StartUnload) => Some(Unloading),
                (Unloading, UnloadCompleted) => Some(Unloaded),
                (Loaded, Crashed) => Some(Failed),
                (Loaded, Reloaded) => Some(Loaded),
                _ => None,
            }
        };
        let mut legal = 0;
        for s in ModelState::ALL {
            for e in EVENTS {
                match (next_state(s, e), expected(s, e)) {
                    (Ok(to), Some(want)) => {
                        assert_eq!(to, want, "{s} + {e:?}");
                        legal += 1;
                    }
                    (Err(err), None) => assert_eq!(err, IllegalTransition { from: s, event: e }),
                    (got, want) => panic!("{s} + {e:?}: got {got:?}, want {want:?}"),
                }
            }
        }
        assert_eq!(legal, TRANSITIONS.len());
    }

    #[test]
    fn load_of_loading_or_loaded_or_unloading_model_is_illegal() {
        for s in [Loading, Loaded, Unloading] {
            assert!(next_state(s, StartLoad).is_err(), "{s}");
            assert!(!s.accepts_load_options());
        }
        assert!(Unloaded.accepts_load_options() && Failed.accepts_load_options());
    }

    #[test]
    fn failure_keeps_last_error_until_a_successful_load() {
        let mut lc = Lifecycle::new();
        lc.apply(StartLoad, None).unwrap();
        lc.apply(LoadFailed, Some("out of memory".into())).unwrap();
        assert_eq!((lc.state(), lc.last_error()), (Failed, Some("out of memory")));
        // Loading a failed model is allowed and keeps the error visible while it loads.
        lc.apply(StartLoad, None).unwrap();
        assert_eq!((lc.state(), lc.last_error()), (Loading, Some("out of memory")));
        lc.apply(LoadSucceeded, None).unwrap();
        assert_eq!((lc.state(), lc.last_error()), (Loaded, None));
        lc.apply(Crashed, Some("segfault".into())).unwrap();
        assert_eq!((lc.state(), lc.last_error()), (Failed, Some("segfault")));
    }

    #[test]
    fn illegal_move_leaves_the_lifecycle_unchanged() {
        let mut lc = Lifecycle::new();
        let before = lc.clone();
        assert_eq!(
            lc.apply(UnloadCompleted, None),
            Err(IllegalTransition { from: Unloaded, event: UnloadCompleted })
        );
        assert_eq!(lc, before);
    }

    #[test]
    fn states_serialize_snake_case() {
        for s in ModelState::ALL {
            assert_eq!(serde_json::to_value(s).unwrap(), serde_json::json!(s.as_str()));
        }
    }
}
