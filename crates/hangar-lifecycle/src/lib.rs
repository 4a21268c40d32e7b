//! Hangar's per-model lifecycle.
//!
//! This crate owns what happens to one model, independent of engines and HTTP:
//!
//! - the state machine ([`ModelState`]: `unloaded`, `loading`, `loaded`, `unloading`,
//!   `failed`) with its transition table as data ([`TRANSITIONS`]) and a typed error for each
//!   illegal move ([`IllegalTransition`]); [`Lifecycle`] keeps `last_error`;
//! - admission ([`admit`]) and why a request was refused ([`AdmissionError`], which the runtime
//!   maps onto the one code vocabulary);
//! - the per-model [`Scheduler`]: a bounded FIFO queue in front of `replicas` runtimes, each
//!   running at most the effective `target_inflight` requests, dispatching to the
//!   least-loaded replica; in-flight accounting through RAII [`Permit`]s; graceful drain
//!   ([`Scheduler::close`] cancels queued work, [`Scheduler::drained`] waits for running
//!   work).
//!
//! The scheduler is generic over the runtime type, so it is tested here with plain values
//! and used by `hangar-runtime` with `dyn Runtime`.

mod admission;
mod scheduler;
mod state;

pub use admission::{AdmissionError, admit};
pub use scheduler::{Permit, Scheduler, SchedulerStats, effective_target};
pub use state::{
    IllegalTransition, Lifecycle, LifecycleEvent, ModelState, TRANSITIONS, next_state,
};
